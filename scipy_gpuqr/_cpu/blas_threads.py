"""BLAS thread counts: SuiteSparseQR's, set around each call, and every OpenBLAS
of the process, set around a body of small calls (the rank decision).

SuiteSparseQR calls the system BLAS (OpenBLAS on Debian/Ubuntu), while
NumPy and SciPy call the OpenBLAS copies bundled in their wheels: one
process holds two or three BLAS thread pools. OpenBLAS workers keep spinning
for a while after each call (about 0.1 s by default), so when our CPU path
alternates between SuiteSparseQR and SciPy's LAPACK (the factorization,
then the rank decision on R, then Qᵀb) each pool's spinning workers slow the
other's next call several-fold; limiting the pool used by SuiteSparseQR
removes most of that.

A small factorization gains nothing from 16 BLAS threads either, so
:func:`limited` runs SuiteSparseQR's BLAS with one thread for problems below
:data:`SINGLE_THREAD_FLOPS` and leaves every other setting alone. The
OpenBLAS that libspqr is linked against is reached through libspqr's own
handle (``dlsym`` searches its dependencies), so the pools of NumPy and SciPy
are never touched; with another BLAS (no ``openblas_set_num_threads``) this
is a no-op. OpenBLAS's thread count is process-wide: two Python threads
factorizing at once may see each other's setting for the length of a call
(a speed effect only, never a numerical one).

The rank decision's dense and Lanczos steps run in NumPy's and SciPy's own
OpenBLAS: :func:`process_limited` lowers every OpenBLAS loaded in the
process (found in the process' memory map on Linux, reached through its
``*_set_num_threads`` symbol: OpenBLAS's own name, or the ``scipy_openblas``
names of the copies bundled in NumPy's and SciPy's wheels) for a body of small
calls: a matrix-vector product, a Lanczos step or a triangular inverse of a
few hundred columns finishes before a pool of idle workers has woken up, and
those workers then spin on the cores the next call (SuiteSparseQR's, or the
other pool's) needs. A count is a speed setting: the same count gives the same
results bit for bit, while another may change their last bits (OpenBLAS splits
some reductions among its threads), as ``OPENBLAS_NUM_THREADS`` itself does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Optional

from .._mapped_files import MAPS, mapped_paths

__all__ = ["SINGLE_THREAD_FLOPS", "CDEF", "threads_for", "limited", "process_limited",
           "openblas_pools", "Lowered"]

#: Factorizations with fewer flops (the symbolic analysis' count) run
#: SuiteSparseQR's BLAS on one thread.
SINGLE_THREAD_FLOPS = 1e9

#: Declarations added to the SuiteSparseQR ``cffi.FFI``.
CDEF = """
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
"""


#: Names of OpenBLAS's ``(get, set)`` thread-count functions: its own, then those
#: of the ``scipy_openblas`` copies in NumPy's (64-bit integers) and SciPy's wheels.
_SYMBOLS = (("openblas_get_num_threads", "openblas_set_num_threads"),
            ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"))


def threads_for(flops: Optional[float]) -> Optional[int]:
    """BLAS threads for a factorization of ``flops`` (None: leave the library's setting).

    Parameters
    ----------
    flops : float or None
        The analysis' flop count; None when unknown.
    """
    if flops is None or not flops < SINGLE_THREAD_FLOPS:
        return None
    return 1


def _controls(lib):
    """``(get, set)`` of OpenBLAS through ``lib``'s handle, or None for another BLAS."""
    try:
        return lib.openblas_get_num_threads, lib.openblas_set_num_threads
    except (AttributeError, NotImplementedError):
        return None


@contextlib.contextmanager
def limited(lib, threads: Optional[int]):
    """Run the body with the BLAS behind ``lib`` limited to ``threads`` threads.

    Parameters
    ----------
    lib : cffi library handle
        libspqr's handle (with :data:`CDEF` declared on its FFI).
    threads : int or None
        None (or a BLAS that is not OpenBLAS) changes nothing; otherwise the
        count is lowered for the body and restored after it.
    """
    ctl = _controls(lib) if threads is not None else None
    if ctl is None:
        yield
        return
    get, set_ = ctl
    before = int(get())
    if before <= threads:
        yield
        return
    set_(int(threads))
    try:
        yield
    finally:
        set_(before)


def _loaded_openblas_paths(maps: str = MAPS) -> list:
    """Paths of the shared objects mapped into this process whose path names
    OpenBLAS (the library or its folder; empty where the memory map cannot be
    read: not Linux)."""
    return [p for p in mapped_paths("openblas", maps) if ".so" in os.path.basename(p)]


def openblas_pools() -> list:
    """``(get, set)`` of every OpenBLAS thread pool loaded in the process.

    Each library is opened with ``RTLD_NOLOAD`` (only one already loaded is
    reached, nothing is loaded), and its pool counted once even where two
    mapped files share it (a symbol found through a dependency).
    """
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)
    pools, seen = [], set()
    for path in _loaded_openblas_paths():
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            try:
                get, set_ = getattr(lib, get_name), getattr(lib, set_name)
            except AttributeError:
                continue
            key = ctypes.cast(set_, ctypes.c_void_p).value
            if key not in seen:
                seen.add(key)
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                pools.append((get, set_))
            break
    return pools


class Lowered:
    """The pools :func:`process_limited` lowered, with their earlier counts."""

    def __init__(self, changed: list, threads: Optional[int]):
        self._changed = changed
        self._threads = threads

    @contextlib.contextmanager
    def lifted(self):
        """Run the body with the lowered pools back at their earlier counts (a large
        call inside a body of small ones), lowered again after it."""
        for set_, before in self._changed:
            set_(before)
        try:
            yield
        finally:
            for set_, _ in self._changed:
                set_(int(self._threads))


@contextlib.contextmanager
def process_limited(threads: Optional[int], pools: Optional[list] = None):
    """Run the body with every OpenBLAS of the process limited to ``threads`` threads.

    Parameters
    ----------
    threads : int or None
        None changes nothing (nor does a process without OpenBLAS); otherwise
        each pool above ``threads`` is lowered for the body and restored after
        it. Nested bodies keep the lowest count; process-wide, like
        :func:`limited`.
    pools : list, optional
        :func:`openblas_pools` found earlier in the process (a caller entering
        many short bodies looks them up once); default: looked up now.

    Yields
    ------
    Lowered
        Its :meth:`Lowered.lifted` gives a large call inside the body the
        earlier counts back.
    """
    changed = []
    if threads is not None:
        for get, set_ in (openblas_pools() if pools is None else pools):
            before = int(get())
            if before > threads:
                set_(int(threads))
                changed.append((set_, before))
    try:
        yield Lowered(changed, threads)
    finally:
        for set_, before in reversed(changed):
            set_(before)
