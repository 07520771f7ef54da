"""Column singletons: the part of R that comes straight from rows of A (SuiteSparseQR's R11, R12).

A *column singleton* is a column with at most one entry in the rows not yet
taken. A live singleton (one entry, of magnitude above ``tol`` when a
tolerance is given) takes its row: that row of A, unchanged, is a row of R
whose pivot is the singleton column. A dead singleton (no entry left) gets no
row of R. Taking a row lowers the degree of the other columns of that row,
which may make new singletons; the search repeats until none is left. With
the singletons ordered first and their rows on top::

    A[rows, cols] = [R11 R12]    R11 square upper triangular (dead columns aside)
                    [ 0  A22]

so ``Q = diag(I, Q2)`` and ``R = [R11 R12; 0 R2]`` with ``A22 = Q2 R2`` factorized
multifrontally. The rows of A outside the singleton rows have no entry in a
singleton column (by construction).

Two searches, as SuiteSparseQR has them:

* :func:`find_singletons` (column permutation allowed; used before a
  fill-reducing ordering): all singletons, found in rounds (every column of
  degree <= 1 at once; two columns wanting the same row: the lower column
  index takes it, the other is dead). The *sets* of singleton columns and
  rows are those of SuiteSparseQR's queue (the search is a monotone closure);
  only the order inside the singleton block may differ, which changes neither
  nnz(R) nor the remaining matrix.
* :func:`leading_singletons` (fixed column order: 'natural' and a given
  ``colperm``): columns are taken in order while they are singletons; the
  first one that is not stops the search.

The structural search (``tol`` None: any stored entry, an explicit zero
included, is acceptable) is what :func:`~scipy_gpuqr._symbolic.analyze` does
from the pattern; with a tolerance the values decide (SuiteSparseQR accepts a
singleton only if its entry exceeds tol).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["Singletons", "find_singletons", "leading_singletons", "no_singletons"]


@dataclass(frozen=True)
class Singletons:
    """Result of a singleton search.

    Attributes
    ----------
    cols : ndarray of int64 (n1cols,)
        Singleton columns of A, in their order (the first columns of R).
    rows : ndarray of int64 (n1cols,)
        Row of A taken by each singleton column, -1 for a dead one.
    """

    cols: np.ndarray
    rows: np.ndarray

    @property
    def n1cols(self) -> int:
        return int(len(self.cols))

    @property
    def n1rows(self) -> int:
        return int(np.count_nonzero(self.rows >= 0))


def no_singletons() -> Singletons:
    z = np.zeros(0, dtype=np.int64)
    return Singletons(z, z.copy())


def _accept(values, tol):
    """Mask of entries acceptable as a singleton pivot."""
    if tol is None or values is None:
        return None
    return np.abs(values) > tol


def find_singletons(A: sp.csc_array, tol: float | None = None) -> Singletons:
    """All column singletons of A (column permutation allowed).

    Parameters
    ----------
    A : scipy.sparse.csc_array
        Canonical CSC (sorted indices, no duplicates).
    tol : float, optional
        Accept a singleton only if its entry's magnitude exceeds ``tol``
        (needs A's values); None: structural.
    """
    m, n = A.shape
    indptr, indices = A.indptr, A.indices
    deg = np.diff(indptr).astype(np.int64)
    if n == 0 or int(deg.min()) > 1:      # no column of degree <= 1: none (no rows built)
        return no_singletons()
    ok = _accept(A.data, tol)
    col_of = np.repeat(np.arange(n, dtype=np.int64), deg)
    R = sp.csr_array((np.arange(A.nnz, dtype=np.int64), indices, indptr), shape=(n, m)).T
    R = sp.csr_array(R)                   # rows of A; data = position in A's data
    r_ptr, r_pos = R.indptr, R.data
    live_row = np.ones(m, dtype=bool)
    done = np.zeros(n, dtype=bool)
    out_cols, out_rows = [], []
    check = np.arange(n, dtype=np.int64)  # columns whose degree changed
    while True:
        cand = check[(deg[check] <= 1) & ~done[check]]
        if len(cand) == 0:
            break
        # the live entry of each degree-1 candidate
        one = cand[deg[cand] == 1]
        row_of = np.full(len(cand), -1, dtype=np.int64)
        accept = deg[cand] == 0
        if len(one):
            starts, ends = indptr[one], indptr[one + 1]
            cnt = ends - starts
            pos = np.repeat(starts - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
            lr = live_row[indices[pos]]
            pos = pos[lr]                 # exactly one live entry per column
            good = np.ones(len(pos), dtype=bool) if ok is None else ok[pos]
            idx = np.flatnonzero(deg[cand] == 1)
            row_of[idx[good]] = indices[pos[good]]
            accept[idx[good]] = True
        cand, row_of = cand[accept], row_of[accept]
        if len(cand) == 0:
            break
        # a row wanted by several columns goes to the first; the others are dead
        live = np.flatnonzero(row_of >= 0)
        _, first = np.unique(row_of[live], return_index=True)
        keep = np.zeros(len(cand), dtype=bool)
        keep[live[first]] = True
        row_of[(row_of >= 0) & ~keep] = -1
        done[cand] = True
        out_cols.append(cand)
        out_rows.append(row_of)
        taken = row_of[row_of >= 0]
        live_row[taken] = False
        # lower the degrees of the columns of the taken rows
        cnt = r_ptr[taken + 1] - r_ptr[taken]
        pos = np.repeat(r_ptr[taken] - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
        hit = col_of[r_pos[pos]]
        np.subtract.at(deg, hit, 1)
        check = np.unique(hit)
    if not out_cols:
        return no_singletons()
    return Singletons(np.concatenate(out_cols).astype(np.int64),
                      np.concatenate(out_rows).astype(np.int64))


def leading_singletons(A: sp.csc_array, perm: np.ndarray, tol: float | None = None) -> Singletons:
    """Singletons among the first columns of ``A[:, perm]``, in that order.

    Stops at the first column of ``perm`` that is not a singleton (a fixed
    column order admits no other).
    """
    m, n = A.shape
    indptr, indices, data = A.indptr, A.indices, A.data
    taken = np.zeros(m, dtype=bool)
    cols, rows = [], []
    for j in perm.tolist():
        p0, p1 = int(indptr[j]), int(indptr[j + 1])
        r = indices[p0:p1]
        live = np.flatnonzero(~taken[r])
        if len(live) == 0:
            cols.append(j)
            rows.append(-1)
        elif len(live) == 1 and (tol is None or abs(data[p0 + live[0]]) > tol):
            i = int(r[live[0]])
            cols.append(j)
            rows.append(i)
            taken[i] = True
        else:
            break
    if not cols:
        return no_singletons()
    return Singletons(np.asarray(cols, dtype=np.int64), np.asarray(rows, dtype=np.int64))
