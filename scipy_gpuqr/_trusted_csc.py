"""SciPy CSC arrays around index arrays this package made itself, without SciPy's checks again.

``scipy.sparse.csc_array((data, indices, indptr), shape=shape)`` chooses an
index dtype, converts the arrays to it, and checks the format (array
dimensions, ``indptr``'s length and ends, ``indices``' and ``data``'s lengths,
trailing space pruned): on a matrix of a few thousand entries that is tens of
microseconds, several times the factorization's own copies of the arrays. The
exact answer of a small ``lsqr``/``lsmr`` problem makes several such arrays
from arrays that are valid by construction (SuiteSparseQR's R and H, a
canonical copy of the caller's A, its transpose).

:func:`csc_of` makes the same object as SciPy's constructor (the same
attributes, the same arrays, the same index dtype) where the arrays are of the
one form for which that constructor converts nothing: one-dimensional float64
``data``, ``indices`` and ``indptr`` of one integer dtype (int64, or int32 with
every dimension within int32), ``indptr`` of ``n + 1`` entries from 0 to
``nnz``, ``nnz`` indices and values. Whether an entry's row lies in range and
the rows are sorted are not checked, as SciPy's constructor does not check them
either. Any other input goes to SciPy's constructor, which converts it or
raises its own error; so does every input where this SciPy's constructor sets
attributes other than the ones known here (:func:`_known_layout`, checked once
per process on a small array).

:func:`transposed_csc` is ``A.T.tocsc()`` for a CSC array A by SciPy's own
compiled conversion, without the two intermediate objects' constructors.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import scipy.sparse as sp

try:
    from scipy.sparse import _sparsetools       # SciPy's compiled sparse kernels
except ImportError:                            # pragma: no cover - every SciPy we support has it
    _sparsetools = None

__all__ = ["csc_of", "transposed_csc"]

_F64 = np.dtype(np.float64)
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_INT32_MAX = int(np.iinfo(np.int32).max)

#: The attributes SciPy's CSC constructor sets on a new array (checked by _known_layout).
_ATTRIBUTES = frozenset(("_shape", "maxprint", "indptr", "indices", "data"))


@functools.lru_cache(maxsize=1)
def _known_layout() -> Optional[int]:
    """SciPy's ``maxprint`` default where this SciPy's CSC constructor sets exactly
    :data:`_ATTRIBUTES` (and keeps given arrays of one dtype as they are); None where
    it does anything else, and :func:`csc_of` always calls it."""
    indptr = np.array([0, 1, 2], dtype=np.int64)
    indices = np.array([0, 1], dtype=np.int64)
    data = np.array([1.0, 2.0])
    ref = sp.csc_array((data, indices, indptr), shape=(2, 2))
    if type(ref) is not sp.csc_array or set(vars(ref)) != _ATTRIBUTES:
        return None
    if ref.indptr.base is not indptr and ref.indptr is not indptr:
        return None
    if ref.indices.dtype != np.int64 or ref.data.dtype != _F64 or ref._shape != (2, 2):
        return None
    return ref.maxprint


def csc_of(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
           shape: tuple) -> sp.csc_array:
    """``scipy.sparse.csc_array((data, indices, indptr), shape=shape)``, the arrays taken
    as they are where that constructor would take them so (see the module); SciPy's
    constructor otherwise.

    The arrays are not copied (nor are they by SciPy's constructor); the caller
    owns them and hands them over.
    """
    m, n = int(shape[0]), int(shape[1])
    maxprint = _known_layout()
    itype = getattr(indices, "dtype", None)
    if (maxprint is None or type(data) is not np.ndarray or type(indices) is not np.ndarray
            or type(indptr) is not np.ndarray or data.dtype != _F64
            or itype not in _INDEX_DTYPES or indptr.dtype != itype
            or data.ndim != 1 or indices.ndim != 1 or indptr.ndim != 1
            or (itype == _INDEX_DTYPES[0] and max(m, n) > _INT32_MAX)
            or m < 0 or n < 0 or indptr.shape[0] != n + 1):
        return sp.csc_array((data, indices, indptr), shape=(m, n))
    nnz = data.shape[0]
    if indices.shape[0] != nnz or int(indptr[0]) != 0 or int(indptr[-1]) != nnz:
        return sp.csc_array((data, indices, indptr), shape=(m, n))
    A = object.__new__(sp.csc_array)
    A._shape = (m, n)
    A.maxprint = maxprint
    A.indptr, A.indices, A.data = indptr, indices, data
    return A


def transposed_csc(A: sp.csc_array) -> sp.csc_array:
    """``Aᵀ`` as a ``csc_array``: ``A.T.tocsc()``'s arrays (SciPy's ``csr_tocsc`` on A's
    CSC arrays read as Aᵀ's CSR ones), sorted rows in every column; in canonical
    format where A is. Taken so for a float64 ``csc_array`` whose ``indptr`` and
    ``indices`` share an index dtype; anything else (a ``csc_matrix``, whose
    transpose's constructor may narrow int64 indices) by SciPy's own conversion."""
    m, n = A.shape
    indptr, indices, data = A.indptr, A.indices, A.data
    itype = indices.dtype
    if (_sparsetools is None or type(A) is not sp.csc_array or data.dtype != _F64 or itype not in _INDEX_DTYPES
            or indptr.dtype != itype or int(indptr[-1]) != indices.shape[0]
            or data.shape[0] != indices.shape[0]
            or (itype == _INDEX_DTYPES[0] and max(m, n, indices.shape[0]) > _INT32_MAX)):
        T = A.T.tocsc()
        return T if type(T) is sp.csc_array else sp.csc_array(T)
    nnz = indices.shape[0]
    out_ptr = np.empty(m + 1, dtype=itype)
    out_idx = np.empty(nnz, dtype=itype)
    out_data = np.empty(nnz, dtype=_F64)
    _sparsetools.csr_tocsc(n, m, indptr, indices, data, out_ptr, out_idx, out_data)
    T = csc_of(out_data, out_idx, out_ptr, (n, m))
    if A.has_canonical_format:
        T.has_canonical_format = True   # a transpose of a canonical A is canonical
    else:
        T.has_sorted_indices = True     # csr_tocsc sorts every column, as SciPy's tocsc says
    return T
