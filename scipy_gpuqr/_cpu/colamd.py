"""COLAMD column ordering through ctypes (no compiler needed).

Three functions of a C library with plain integer and pointer arguments:
ctypes declares them in microseconds, where a cffi ``cdef`` parses C
declarations with pycparser first (a tenth of a second in some new
processes, paid by every first analysis of a process, cache hits included,
since an analysis' key names the ordering library).

The library has each function twice, for ``int`` and for ``long`` indices:
the same algorithm, the same order. The ``int`` one runs where every index
and its workspace fit in 32 bits (half the bytes through the caches). Its
hash of a column's rows may wrap where the ``long`` one's does not; that only
moves columns between hash buckets, and identical columns (the only ones it
merges) hash alike either way.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import scipy.sparse as sp

from ._libs import LibraryNotFound, open_cdll

__all__ = ["colamd", "colamd_available"]

_KNOBS = ctypes.c_double * 20
_STATS = ctypes.c_int64 * 20
_STATS32 = ctypes.c_int32 * 20
_I64P = ctypes.POINTER(ctypes.c_int64)
_I32P = ctypes.POINTER(ctypes.c_int32)
#: The ``int`` functions' largest index and workspace length.
_INT_MAX = 2**31 - 1

_COLAMD_STATUS = 3
_COLAMD_DENSE_ROW = 0
_COLAMD_DENSE_COL = 1


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    """The COLAMD library with its functions declared, ``long`` and ``int`` (once
    per process: the handle is immutable once opened, caching it is not mutable
    state)."""
    lib = open_cdll("colamd")
    for suffix, index, pointer, stats in (("_l", ctypes.c_int64, _I64P, _STATS),
                                          ("", ctypes.c_int32, _I32P, _STATS32)):
        recommended = getattr(lib, f"colamd{suffix}_recommended")
        recommended.argtypes = [index, index, index]
        recommended.restype = ctypes.c_size_t
        defaults = getattr(lib, f"colamd{suffix}_set_defaults")
        defaults.argtypes = [_KNOBS]
        defaults.restype = None
        order = getattr(lib, f"colamd{suffix}")
        order.argtypes = [index, index, index, pointer, pointer, _KNOBS, stats]
        order.restype = index
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
    if not A.has_canonical_format:      # COLAMD wants sorted rows, no duplicates
        A = A.copy()
        A.sum_duplicates()
    nnz = int(A.indptr[-1])
    small = max(m, n, nnz) <= _INT_MAX
    alen = int(lib.colamd_recommended(nnz, m, n) if small else 0)
    small = 0 < alen <= _INT_MAX
    if not small:
        alen = int(lib.colamd_l_recommended(nnz, m, n))
    if alen == 0:
        raise RuntimeError(f"colamd: matrix of shape {A.shape} with {nnz} entries is too large")
    itype, ptype = (np.int32, _I32P) if small else (np.int64, _I64P)
    work = np.zeros(alen, dtype=itype)
    work[:nnz] = A.indices
    p = np.array(A.indptr, dtype=itype)     # a copy: COLAMD overwrites it with the order
    knobs = _KNOBS()
    (lib.colamd_set_defaults if small else lib.colamd_l_set_defaults)(knobs)
    if dense_row is not None:
        knobs[_COLAMD_DENSE_ROW] = float(dense_row)
    if dense_col is not None:
        knobs[_COLAMD_DENSE_COL] = float(dense_col)
    stats = _STATS32() if small else _STATS()
    # ctypes releases the GIL for the call (COLAMD runs while other threads go on)
    ok = (lib.colamd if small else lib.colamd_l)(m, n, alen, work.ctypes.data_as(ptype),
                                                  p.ctypes.data_as(ptype), knobs, stats)
    if not ok:
        raise RuntimeError(f"colamd failed with status {stats[_COLAMD_STATUS]} on a "
                           f"{m}x{n} matrix with {nnz} entries")
    return p[:n].astype(np.int64)
