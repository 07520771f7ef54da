"""Whether a device array holds a value that is not finite, in one launch
(``kernels/sparse_qr/finite_check.cu``).

The GPU factorization checks each stage's front pool before R is read from it.
This kernel reads the pool once, needs no temporary and is compiled with the
engine's other modules before the call needs it (it is one of
:func:`~scipy_gpuqr._engine.gpu.factorize_kernels.engine_kernels`), where
generic array operations would compile several CuPy kernels on the call's
path the first time. :func:`nonfinite_flag_numpy` is the NumPy model of its
answer. Imports without CuPy; :class:`FiniteCheck` needs it.
"""

from __future__ import annotations

import functools

import numpy as np

from ..._kernels import KernelUse

__all__ = ["CHECK_FILE", "KERNEL_VARIANTS", "CHECK_THREADS", "nonfinite_name",
           "finite_check_use", "nonfinite_flag_numpy", "FiniteCheck", "finite_check"]

#: The kernel source (relative to ``kernels/``).
CHECK_FILE = "sparse_qr/finite_check.cu"

#: Threads per block (the kernel's ``__launch_bounds__``).
CHECK_THREADS = 256

#: Most blocks of one launch (a grid-stride loop covers the rest).
MAX_BLOCKS = 4096

_CTYPE = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def nonfinite_name(dtype) -> str:
    """Name expression of the kernel for ``dtype`` values (float64 or float32)."""
    dt = np.dtype(dtype)
    if dt not in _CTYPE:
        raise TypeError(f"finite check: float64 or float32, not {dt}")
    return f"gpuqr::nonfinite_flag<{_CTYPE[dt]}>"


#: Name expressions to compile, per source file (relative to ``kernels/``).
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {
    CHECK_FILE: (nonfinite_name(np.float64), nonfinite_name(np.float32)),
}


def finite_check_use(dtype) -> KernelUse:
    """What the check of ``dtype`` values compiles (for :func:`scipy_gpuqr._kernels.prefetch`)."""
    return KernelUse(CHECK_FILE, KERNEL_VARIANTS[CHECK_FILE], (nonfinite_name(dtype),))


def nonfinite_flag_numpy(x: np.ndarray) -> int:
    """The kernel's answer for ``x``: 1 when a value is NaN or infinite, else 0."""
    return int(not np.isfinite(np.asarray(x)).all())


class FiniteCheck:
    """Launches the check on a stream; the answer stays on the device until read.

    Parameters
    ----------
    dtype : numpy dtype
        float64 or float32.
    """

    def __init__(self, dtype):
        import cupy as cp
        self.cp = cp
        self.dtype = np.dtype(dtype)
        use = finite_check_use(self.dtype)
        self.fn = use.module().get_function(use.needed[0])     # prefetched, or compiled now

    def enqueue(self, x, stream=None):
        """``flag`` (a 1-element int32 CuPy array, on the device): 1 when the
        contiguous array ``x`` holds a NaN or an infinity, else 0, once
        ``stream`` (default: the current one) has passed the launch."""
        cp = self.cp
        if x.dtype != self.dtype or not x.flags.c_contiguous:
            raise ValueError(f"finite check: a contiguous {self.dtype} array, "
                             f"not {x.dtype} (contiguous: {x.flags.c_contiguous})")
        stream = stream if stream is not None else cp.cuda.get_current_stream()
        with stream:
            flag = cp.zeros(1, dtype=np.int32)
            n = int(x.size)
            if n:
                blocks = min(MAX_BLOCKS, -(-n // CHECK_THREADS))
                self.fn((blocks,), (CHECK_THREADS,), (x, np.int64(n), flag))
        return flag

    def __call__(self, x, stream=None) -> bool:
        """Whether every value of ``x`` is finite (waits for ``stream``)."""
        flag = self.enqueue(x, stream)
        return int(flag.get(stream=stream)[0]) == 0


@functools.lru_cache(maxsize=None)
def _finite_check(dtype: str, device: int) -> FiniteCheck:
    return FiniteCheck(dtype)


def finite_check(dtype) -> FiniteCheck:
    """The :class:`FiniteCheck` of ``dtype`` on the current device (made once)."""
    import cupy
    return _finite_check(np.dtype(dtype).name, cupy.cuda.Device().id)
