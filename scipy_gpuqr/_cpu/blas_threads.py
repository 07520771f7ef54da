"""The thread count of the BLAS that SuiteSparseQR calls, set around each call.

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
"""

from __future__ import annotations

import contextlib
from typing import Optional

__all__ = ["SINGLE_THREAD_FLOPS", "CDEF", "threads_for", "limited"]

#: Factorizations with fewer flops (the symbolic analysis' count) run
#: SuiteSparseQR's BLAS on one thread.
SINGLE_THREAD_FLOPS = 1e9

#: Declarations added to the SuiteSparseQR ``cffi.FFI``.
CDEF = """
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
"""


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
