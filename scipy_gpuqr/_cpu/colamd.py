"""COLAMD column ordering through ctypes (no compiler needed).

Three functions of a C library with plain integer and pointer arguments:
ctypes declares them in microseconds, where a cffi ``cdef`` parses C
declarations with pycparser first (a tenth of a second in some new
processes, paid by every first analysis of a process, cache hits included,
since an analysis' key names the ordering library).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import scipy.sparse as sp

from ._libs import LibraryNotFound, find_library

__all__ = ["colamd", "colamd_available"]

_KNOBS = ctypes.c_double * 20
_STATS = ctypes.c_int64 * 20
_I64P = ctypes.POINTER(ctypes.c_int64)

_COLAMD_STATUS = 3
_COLAMD_DENSE_ROW = 0
_COLAMD_DENSE_COL = 1


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    """The COLAMD library with its three functions declared (once per process:
    the handle is immutable once opened, caching it is not mutable state)."""
    path = find_library("colamd")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise LibraryNotFound(f"could not open {path}: {exc}") from exc
    i64 = ctypes.c_int64
    lib.colamd_l_recommended.argtypes = [i64, i64, i64]
    lib.colamd_l_recommended.restype = ctypes.c_size_t
    lib.colamd_l_set_defaults.argtypes = [_KNOBS]
    lib.colamd_l_set_defaults.restype = None
    lib.colamd_l.argtypes = [i64, i64, i64, _I64P, _I64P, _KNOBS, _STATS]
    lib.colamd_l.restype = i64
    return lib


def colamd_available() -> tuple[bool, str]:
    """Whether the COLAMD library loads, and why not."""
    try:
        _lib()
    except (LibraryNotFound, ImportError) as exc:
        return False, str(exc)
    return True, "ok"


def colamd(A, dense_row: float | None = None, dense_col: float | None = None) -> np.ndarray:
    """Fill-reducing column ordering of a sparse matrix for QR (or LU).

    Parameters
    ----------
    A : sparse matrix or array, shape (m, n)
        Only the pattern is used.
    dense_row, dense_col : float or None
        COLAMD's dense-row and dense-column knobs (None keeps its defaults:
        rows with more than max(16, 10·sqrt(n)) entries are ignored).

    Returns
    -------
    perm : ndarray of int64, shape (n,)
        Column order: ``A[:, perm]`` has a sparse QR factor.

    Raises
    ------
    LibraryNotFound
        When SuiteSparse's COLAMD is not installed.
    RuntimeError
        When COLAMD reports an error (its status code is included).
    """
    lib = _lib()
    A = sp.csc_array(A)
    m, n = A.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    A = A.copy()
    A.sum_duplicates()
    A.sort_indices()
    nnz = int(A.indptr[-1])
    alen = int(lib.colamd_l_recommended(nnz, m, n))
    if alen == 0:
        raise RuntimeError(f"colamd: matrix of shape {A.shape} with {nnz} entries is too large")
    work = np.zeros(alen, dtype=np.int64)
    work[:nnz] = A.indices
    p = np.ascontiguousarray(A.indptr, dtype=np.int64)
    knobs = _KNOBS()
    lib.colamd_l_set_defaults(knobs)
    if dense_row is not None:
        knobs[_COLAMD_DENSE_ROW] = float(dense_row)
    if dense_col is not None:
        knobs[_COLAMD_DENSE_COL] = float(dense_col)
    stats = _STATS()
    # ctypes releases the GIL for the call (COLAMD runs while other threads go on)
    ok = lib.colamd_l(m, n, alen, work.ctypes.data_as(_I64P), p.ctypes.data_as(_I64P),
                      knobs, stats)
    if not ok:
        raise RuntimeError(f"colamd failed with status {stats[_COLAMD_STATUS]} on a "
                           f"{m}x{n} matrix with {nnz} entries")
    return p[:n].copy()
