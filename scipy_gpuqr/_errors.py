"""Every exception and warning the package raises, in one place.

Users catch :class:`GpuEngineError`, filter :class:`GpuFallbackWarning` and
read :class:`MatrixMarketError`; these are exported by ``scipy_gpuqr``. The
others travel between the package's parts (an engine tells the planner it ran
out of device memory, a loader tells its caller a library is missing) and are
defined here so that no part imports another only for an exception class.
This module imports nothing from the package.
"""

from __future__ import annotations

__all__ = ["GpuFallbackWarning", "GpuEngineError", "DeviceOutOfMemory",
           "MatrixMarketError", "LibraryNotFound", "CholmodLayoutError",
           "NativeUnavailable", "SubspaceTooLarge"]


class GpuFallbackWarning(RuntimeWarning):
    """A GPU factorization was requested but the CPU answered (reason in the message)."""


class GpuEngineError(RuntimeError):
    """A kernel failed or produced non-finite values (never a silently wrong R)."""


class DeviceOutOfMemory(MemoryError):
    """A stage did not fit in device memory (the engine restages)."""


class MatrixMarketError(ValueError):
    """A malformed Matrix Market file.

    Attributes
    ----------
    source : str
        File name (or ``<stream>``).
    lineno : int or None
        1-based line number of the problem (None when it concerns the whole file).
    reason : str
        What is wrong.
    """

    def __init__(self, source: str, lineno: int | None, reason: str):
        self.source, self.lineno, self.reason = source, lineno, reason
        where = f"{source}, line {lineno}" if lineno is not None else source
        super().__init__(f"{where}: {reason}")


class LibraryNotFound(OSError):
    """A SuiteSparse library could not be loaded."""


class CholmodLayoutError(RuntimeError):
    """The loaded CHOLMOD's ``cholmod_common`` does not match the known layout."""


class NativeUnavailable(RuntimeError):
    """The compiled schedule simulation was asked for (mode ``c``) and cannot be had."""


class SubspaceTooLarge(RuntimeError):
    """The small singular subspace needs more columns (or steps) than allowed."""
