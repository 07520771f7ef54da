"""SuiteSparseQR's own column orders, kept per sparsity pattern (in memory, bounded).

``SuiteSparseQR_C`` orders A's columns on every call before it factorizes:
column singletons first (a breadth-first search over A and Aᵀ's patterns),
then COLAMD (or AMD, METIS) on the columns left, then the postorder of the
column elimination tree of ``A[:, order]``. Where no rank is detected
(``tol`` None) every step of it reads A's pattern only, so a pattern
factorized again gets the same order, and on a matrix of a few thousand
columns finding it is most of SuiteSparseQR's analysis and a large share of
the whole call.

The order a factorization returned (its ``E``) is kept here with the
pattern, and a later factorization of the same pattern hands SuiteSparseQR
``A[:, E]`` with its fixed ordering. That reproduces the first one exactly:

* the fixed ordering takes the leading columns that are singletons in the
  given order. ``E`` starts with the search's singletons in the order it
  found them, each a singleton once the rows of those before it are taken,
  and no column after them is one (the search ran to its end), so the same
  singleton columns and rows are taken;
* the columns after them are already in the postorder of their elimination
  tree, whose postorder is then the identity;
* the rows are sorted by their leftmost column in that order, stably, as
  before.

So the same fronts receive the same rows and do the same arithmetic in the
same order: R, H, HTau and HPinv are bit for bit the first factorization's.
Each reuse is checked nonetheless: SuiteSparseQR's own counts of the run
(column singletons and singleton rows, fronts, the bounds of R's and H's
entries) must equal the kept ones, or the order is dropped, the factorization
is made again with SuiteSparseQR's ordering, and the pattern is not kept
again (:func:`refuse`).

A pattern is recognised by its shape, entry count and the ordering asked for,
with CRC-32 checksums of its index arrays spreading the keys; a hit is
confirmed by comparing the pattern **exactly** with the kept copy, so a
checksum collision costs a new order, never another pattern's. One bounded
least-recently-used table per process (:class:`OrderLRU`: at most
:data:`MEMORY_ENTRIES` patterns and :data:`MEMORY_BYTES` bytes of arrays;
:func:`clear` empties it). Only canonical CSC inputs (sorted row indices, no
duplicates) are kept: anything else is ordered by SuiteSparseQR as before.
"""

from __future__ import annotations

import zlib
from typing import Optional

import numpy as np
import scipy.sparse as sp

from .._bounded_lru import BoundedLRU
from .._index_ranges import ranges

__all__ = ["KEPT_ORDERINGS", "MEMORY_ENTRIES", "MEMORY_BYTES", "COUNTS", "KeptOrder",
           "OrderLRU", "pattern_key", "lookup", "keep", "refuse", "refused", "clear"]

#: The orderings whose result is kept: SuiteSparseQR's fill-reducing ones, each
#: singletons first and the elimination tree's postorder last.
KEPT_ORDERINGS = ("colamd", "amd", "metis")
#: Most patterns the table keeps.
MEMORY_ENTRIES = 16
#: Most bytes of arrays the table keeps (a pattern above it is not kept).
MEMORY_BYTES = 128 << 20
#: SuiteSparseQR's counts (``SPQR_istat`` names) that a reuse must reproduce.
COUNTS = ("nnz_R_bound", "nnz_H_bound", "n_fronts", "n_column_singletons",
          "n_singleton_rows")

_CSC = (sp.csc_array, sp.csc_matrix)


class KeptOrder:
    """SuiteSparseQR's order of one pattern, and that pattern in it (made on first use).

    Attributes
    ----------
    shape : tuple
    a_indptr, a_indices : ndarray
        Copies of the pattern it was found for (compared exactly on a hit).
    colperm : ndarray of int64, shape (n,)
        SuiteSparseQR's column order ``E`` of that pattern.
    counts : tuple
        SuiteSparseQR's :data:`COUNTS` of the factorization that found it.
    ordering_used : str
        What ordered (SuiteSparseQR's name: 'colamd', ...).
    nbytes : int
        The bytes of its arrays, those :meth:`permuted` makes included.
    """

    __slots__ = ("shape", "a_indptr", "a_indices", "colperm", "counts", "ordering_used",
                 "nbytes", "_permuted")

    def __init__(self, shape, a_indptr, a_indices, colperm, counts, ordering_used):
        self.shape = tuple(shape)
        self.a_indptr, self.a_indices, self.colperm = a_indptr, a_indices, colperm
        self.counts = tuple(counts)
        self.ordering_used = ordering_used
        nnz, n = len(a_indices), len(colperm)
        self.nbytes = int(a_indptr.nbytes + a_indices.nbytes + colperm.nbytes
                          + 8 * (2 * nnz + n + 1))
        self._permuted = None

    def permuted(self) -> tuple:
        """``(indptr, indices, gather)``: the pattern of ``A[:, colperm]`` (canonical,
        int64, as SuiteSparseQR reads it) and ``A[:, colperm].data = A.data[gather]``;
        made on the first reuse (a pattern factorized once pays none of it)."""
        got = self._permuted
        if got is None:
            E, a_indptr = self.colperm, self.a_indptr
            starts = a_indptr[:-1].astype(np.int64)[E]
            counts = (a_indptr[1:] - a_indptr[:-1]).astype(np.int64)[E]
            indptr = np.zeros(len(E) + 1, dtype=np.int64)
            np.cumsum(counts, out=indptr[1:])
            # entry k of A[:, E] (in column c) is entry starts[c] + (k - indptr[c]) of A
            gather = ranges(starts, starts + counts)
            indices = self.a_indices.astype(np.int64)[gather]
            for a in (indptr, indices, gather):
                a.flags.writeable = False
            got = self._permuted = (indptr, indices, gather)
        return got

    def matches(self, A) -> bool:
        """Whether canonical CSC A has exactly the kept pattern."""
        return (tuple(A.shape) == self.shape and len(A.indices) == len(self.a_indices)
                and np.array_equal(A.indptr, self.a_indptr)
                and np.array_equal(A.indices, self.a_indices))

    def agrees(self, istat: dict) -> bool:
        """Whether a factorization in this order ran as the one that found it (its
        SuiteSparseQR counts, ``istat``, equal the kept ones)."""
        return tuple(int(istat.get(name, -1)) for name in COUNTS) == self.counts


class OrderLRU(BoundedLRU):
    """A bounded least-recently-used table ``key -> KeptOrder`` (thread-safe); a key
    may also hold None: a pattern whose order is not kept (:func:`refuse`).

    Parameters
    ----------
    max_entries : int
    max_bytes : int
        Bounds of the table: the least recently used entries leave first; an
        entry larger than ``max_bytes`` is not kept.
    """

    def __init__(self, max_entries: int = MEMORY_ENTRIES, max_bytes: int = MEMORY_BYTES):
        super().__init__(max_entries, max_bytes,
                         lambda entry: 0 if entry is None else entry.nbytes)


_MEMORY = OrderLRU()


def clear() -> None:
    """Empty the per-process table."""
    _MEMORY.clear()


def pattern_key(A, ordering: str) -> Optional[tuple]:
    """The table's key of A's pattern and ``ordering``, or None where A's order is not
    kept: an ordering outside :data:`KEPT_ORDERINGS`, A not a float64 CSC array or
    matrix in canonical format, or empty."""
    if ordering not in KEPT_ORDERINGS or type(A) not in _CSC or A.dtype != np.float64:
        return None
    m, n = A.shape
    if m == 0 or n == 0 or not A.has_canonical_format:
        return None
    indptr, indices = A.indptr, A.indices
    if not (indptr.flags.c_contiguous and indices.flags.c_contiguous):
        return None
    return (int(m), int(n), int(len(indices)), ordering, str(indices.dtype),
            zlib.crc32(indptr), zlib.crc32(indices))


def lookup(key: Optional[tuple], A) -> Optional[KeptOrder]:
    """The kept order of A's pattern under ``key`` (:func:`pattern_key`), or None."""
    if key is None:
        return None
    got = _MEMORY.get(key)
    return got if got is not None and got.matches(A) else None


def refused(key: Optional[tuple]) -> bool:
    """Whether ``key``'s pattern is marked not to be kept (:func:`refuse`)."""
    return key is not None and key in _MEMORY and _MEMORY.get(key) is None


def refuse(key: Optional[tuple]) -> None:
    """Drop ``key``'s order and keep none for it from now on: a factorization in the
    kept order did not reproduce SuiteSparseQR's counts."""
    if key is not None:
        _MEMORY.put(key, None)


def keep(key: Optional[tuple], A, colperm: np.ndarray, istat: dict,
         ordering_used: str) -> None:
    """Keep SuiteSparseQR's order ``colperm`` (the E of a factorization of A without
    rank detection, whose statistics are ``istat``) for A's pattern under ``key``."""
    if key is None or refused(key):
        return
    m, n = A.shape
    nnz = len(A.indices)
    if 8 * (3 * nnz + 3 * n) > _MEMORY.max_bytes:       # the entry would not be kept
        return
    E = np.array(colperm, dtype=np.int64)
    if E.shape != (n,) or (n and not (E.min() >= 0 and E.max() < n
                                      and np.bincount(E, minlength=n).min() == 1)):
        return
    a_indptr, a_indices = np.array(A.indptr), np.array(A.indices)
    for a in (a_indptr, a_indices, E):
        a.flags.writeable = False
    _MEMORY.put(key, KeptOrder((m, n), a_indptr, a_indices, E,
                               (int(istat.get(name, -1)) for name in COUNTS), ordering_used))
