"""COLAMD column ordering through cffi (ABI mode, no compiler needed)."""

from __future__ import annotations

import functools

import cffi
import numpy as np
import scipy.sparse as sp

from ._libs import LibraryNotFound, open_library

__all__ = ["colamd", "colamd_available"]

_CDEF = """
size_t colamd_l_recommended(int64_t nnz, int64_t n_row, int64_t n_col);
void colamd_l_set_defaults(double knobs[20]);
int64_t colamd_l(int64_t n_row, int64_t n_col, int64_t Alen, int64_t A[],
                 int64_t p[], double knobs[20], int64_t stats[20]);
"""

_COLAMD_STATUS = 3
_COLAMD_DENSE_ROW = 0
_COLAMD_DENSE_COL = 1


@functools.lru_cache(maxsize=1)
def _lib():
    # The handle is immutable once opened; caching it is not mutable state.
    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    return ffi, open_library(ffi, "colamd")


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
    ffi, lib = _lib()
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
    knobs = ffi.new("double[20]")
    lib.colamd_l_set_defaults(knobs)
    if dense_row is not None:
        knobs[_COLAMD_DENSE_ROW] = float(dense_row)
    if dense_col is not None:
        knobs[_COLAMD_DENSE_COL] = float(dense_col)
    stats = ffi.new("int64_t[20]")
    ok = lib.colamd_l(m, n, alen, ffi.from_buffer("int64_t[]", work),
                      ffi.from_buffer("int64_t[]", p), knobs, stats)
    if not ok:
        raise RuntimeError(f"colamd failed with status {stats[_COLAMD_STATUS]} on a "
                           f"{m}x{n} matrix with {nnz} entries")
    return p[:n].copy()
