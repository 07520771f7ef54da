"""The pattern by rows that the tree steps of the analysis read.

The column counts and the fronts read the non-singleton block of A, ``B =
A[keep_rows][:, perm]`` (the columns in the analysis' order), by rows (CSR,
columns sorted within each row) with the rows sorted stably by their leftmost
column (empty rows last): S. Each entry carries its position in the canonical
A's data (the S-assembly map refers to it).

* :func:`permuted_rows`: B by rows, with each row's leftmost column;
* :func:`sorted_rows`: S.

Where the compiled library of :mod:`.native` is at hand, :func:`sorted_rows`
reads S off A's columns (:func:`.native.sorted_rows`: a row's leftmost
column is the first column of ``perm`` it is met in, the rows met first in
one column come in increasing order, as a stable sort leaves them), else
SciPy selects, transposes and sorts (:func:`sorted_rows_numpy`, the
reference: the same arrays).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import native
from ._arrays import stable_argsort
from .etree import leftmost_columns

__all__ = ["permuted_rows", "sorted_rows", "sorted_rows_numpy", "row_map"]


def row_map(m: int, keep_rows: np.ndarray | None) -> np.ndarray | None:
    """Each row of A's row of B (-1: left out), or None when every row is kept."""
    if keep_rows is None:
        return None
    rowmap = np.full(m, -1, dtype=np.int64)
    rowmap[keep_rows] = np.arange(len(keep_rows), dtype=np.int64)
    return rowmap


def permuted_rows(A: sp.csc_array, keep_rows: np.ndarray | None, perm: np.ndarray) -> tuple:
    """``B = A[keep_rows][:, perm]`` by rows, through SciPy.

    Parameters
    ----------
    A : scipy.sparse.csc_array
        Canonical CSC (sorted indices, no duplicates).
    keep_rows : ndarray of int64, increasing, or None
        The rows of A kept (None: all).
    perm : ndarray of int64
        The columns of A, in B's order.

    Returns
    -------
    indptr, indices, pos, leftmost : ndarray of int64
        B's CSR (columns sorted in each row), the position in ``A.data`` of each
        entry, and each row's first column (``len(perm)`` for an empty row).
    """
    m, n = A.shape
    pos = sp.csc_array((np.arange(A.nnz, dtype=np.int64), A.indices, A.indptr), shape=(m, n))
    B = sp.csr_array((pos if keep_rows is None else pos[keep_rows])[:, perm])
    B.sort_indices()
    indptr = B.indptr.astype(np.int64)
    indices = B.indices.astype(np.int64)
    return indptr, indices, B.data.astype(np.int64), leftmost_columns(indptr, indices, len(perm))


def sorted_rows(A: sp.csc_array, keep_rows: np.ndarray | None, perm: np.ndarray) -> tuple:
    """S: the rows of ``B = A[keep_rows][:, perm]`` sorted stably by leftmost column.

    Parameters are those of :func:`permuted_rows`.

    Returns
    -------
    rowperm : ndarray of int64
        ``rowperm[t]``: S's t-th row, as a row of B (a place in ``keep_rows``).
    indptr, indices, pos, leftmost : ndarray of int64
        S by rows, as :func:`permuted_rows` gives B.
    """
    lib = native.handle()
    if lib is None:
        return sorted_rows_numpy(A, keep_rows, perm)
    m = A.shape[0]
    m2 = m if keep_rows is None else len(keep_rows)
    return native.sorted_rows(lib, m, A.indptr, A.indices, perm, row_map(m, keep_rows), m2)


def sorted_rows_numpy(A: sp.csc_array, keep_rows: np.ndarray | None,
                      perm: np.ndarray) -> tuple:
    """:func:`sorted_rows` through SciPy (the reference of the compiled loop)."""
    indptr, indices, pos, leftmost = permuted_rows(A, keep_rows, perm)
    n2 = len(perm)
    rowperm = stable_argsort(leftmost, n2 + 1)
    S = sp.csr_array((pos, indices, indptr), shape=(len(leftmost), n2))[rowperm]
    S.sort_indices()
    return (rowperm, S.indptr.astype(np.int64), S.indices.astype(np.int64),
            S.data.astype(np.int64), leftmost[rowperm])
