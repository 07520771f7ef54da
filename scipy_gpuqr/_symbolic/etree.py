"""Column elimination tree, postorder and column counts of R, without forming AᵀA.

Everything works on the pattern of a column-permuted matrix given by rows
(CSR with sorted column indices). Notation: ``leftmost[i]`` is the first
column of row i (``n`` for an empty row).

* The column elimination tree of A is the elimination tree of AᵀA. Row i of
  A makes its columns a clique in AᵀA; the filled graph (hence the tree) is the
  same when the clique is replaced by the star centred at ``leftmost[i]``, so
  the tree is built from the edges ``(leftmost[i], j)``. Those edges are first
  reduced to a spanning forest by SciPy's minimum spanning tree with weight
  ``max(u, v)`` (Kruskal processing edges by their larger end is exactly
  Liu's algorithm, so any minimum spanning forest has the same elimination
  tree) and then Liu's algorithm with path compression runs on at most n-1
  edges.
* The postorder (children in increasing label, or weight, order) ranks the
  forest's Euler tour, a linked list of the 2n "enter"/"leave" events, by
  pointer jumping: ``log2(2n)`` array steps, no Python loop over the nodes.
* Column counts of R (nonzeros per row of R, diagonal included) use the
  row-subtree characterisation: column k of R (row k of L = chol(AᵀA)) has the
  pattern T_k = union of the tree paths from ``leftmost[i]`` to k over the rows
  i that hold column k. Counting how many T_k contain each node is done with
  the skeleton/least-common-ancestor formula (+1 at each path start, -1 at the
  LCA of consecutive starts in postorder, -1 at the parent of k) followed by
  subtree sums. In a postordered forest the LCA of u < v is the parent of the
  node of ``[u, v)`` whose subtree starts first (the latest such node on
  ties), a range-minimum query answered from a sparse table in two look-ups.
  Cost O((nnz(A) + n) log n), all vectorized.

Where the compiled library of :mod:`.native` is at hand,
:func:`column_etree_by_columns`, :func:`postorder` (without weights) and
:func:`column_counts` run its loops instead (Liu's algorithm read off A's
columns in the analysis' order, on the edges between consecutive columns of
each row, which fill the graph as the stars do; a depth-first postorder; the
same skeleton formula with a union-find for the LCAs): the same arrays, the
NumPy code above (``*_numpy``) being the reference and the fallback.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import minimum_spanning_tree

from . import native
from ._arrays import first_descendants, stable_argsort, subtree_sums

__all__ = ["leftmost_columns", "column_etree_by_columns", "postorder",
           "column_counts", "column_etree_numpy", "postorder_numpy", "column_counts_numpy",
           "subtree_sizes", "subtree_sums"]


def leftmost_columns(indptr: np.ndarray, indices: np.ndarray, n: int) -> np.ndarray:
    """First column of each row of a CSR pattern with sorted indices (n if empty)."""
    m = len(indptr) - 1
    left = np.full(m, n, dtype=np.int64)
    nonempty = indptr[1:] > indptr[:-1]
    left[nonempty] = indices[indptr[:-1][nonempty]]
    return left


def _star_edges(indptr, indices, leftmost, n):
    """Distinct edges (leftmost[i], j) for every entry (i, j) with j > leftmost[i],
    sorted by their larger end j (then their smaller one)."""
    lo = np.repeat(leftmost, np.diff(indptr))
    keep = indices != lo
    key = indices[keep] * n + lo[keep]
    key.sort()
    if len(key) > 1:
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    return key % n, key // n


def column_etree_by_columns(A, perm: np.ndarray, rowmap: np.ndarray | None,
                            rows) -> np.ndarray:
    """Column elimination tree of ``B = A[rows kept][:, perm]`` (A canonical CSC).

    The compiled loop reads A's columns in ``perm`` order (Liu's algorithm on
    the edges between consecutive columns of each row: the same tree as the
    star edges give); without it, :func:`column_etree_numpy` runs on B by rows,
    which the callable ``rows`` gives as ``(indptr, indices, pos, leftmost)``.
    ``rowmap`` is >= 0 on the rows kept, -1 on the others (None: all kept).
    """
    lib = native.handle()
    if lib is None:
        indptr, indices, _, leftmost = rows()
        return column_etree_numpy(indptr, indices, len(perm), leftmost)
    return native.column_etree_by_columns(lib, A.indptr, A.indices, perm, rowmap, A.shape[0])


def column_etree_numpy(indptr: np.ndarray, indices: np.ndarray, n: int,
                       leftmost: np.ndarray | None = None) -> np.ndarray:
    """Column elimination tree of an m×n pattern given by rows.

    Parameters
    ----------
    indptr, indices : ndarray
        CSR pattern (column indices sorted within each row).
    n : int
        Number of columns.
    leftmost : ndarray, optional
        Precomputed :func:`leftmost_columns`.

    Returns
    -------
    parent : ndarray of int64, shape (n,)
        ``parent[j] > j`` or -1 for a root.
    """
    if leftmost is None:
        leftmost = leftmost_columns(indptr, indices, n)
    lo, hi = _star_edges(indptr, np.asarray(indices, dtype=np.int64), leftmost, n)
    parent = np.full(n, -1, dtype=np.int64)
    if len(lo) == 0:
        return parent
    # weight max(u, v) + 1 (> 0 so no edge is read as absent); the edges come
    # distinct and sorted by their larger end, so the graph is built as CSR
    # directly with that end as the row: its weights are stored in increasing
    # order, which the spanning tree's (stable) sort of the weights finds sorted
    gptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(hi, minlength=n), out=gptr[1:])
    g = sp.csr_array(((hi + 1).astype(np.float64), lo, gptr), shape=(n, n))
    forest = sp.coo_array(minimum_spanning_tree(g))
    u = np.minimum(forest.row, forest.col).astype(np.int64)
    v = np.maximum(forest.row, forest.col).astype(np.int64)
    order = stable_argsort(v, n)
    u, v = u[order].tolist(), v[order].tolist()
    # Liu's algorithm with path compression on the forest's edges
    par = [-1] * n
    anc = [-1] * n
    for j, k in zip(u, v):
        while j != -1 and j < k:
            nxt = anc[j]
            anc[j] = k
            if nxt == -1:
                par[j] = k
            j = nxt
    parent[:] = par
    return parent


def postorder(parent: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """A postorder of a forest (compiled where available and without ``weight``,
    else :func:`postorder_numpy`; same parameters and result)."""
    if weight is None and len(parent):
        lib = native.handle()
        if lib is not None:
            return native.postorder(lib, parent)
    return postorder_numpy(parent, weight)


def postorder_numpy(parent: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """A postorder of a forest.

    Children are visited in increasing ``weight`` (ties: increasing label),
    so with ``weight`` = column counts the heaviest child comes last, next to
    its parent (CHOLMOD's weighted postorder: relaxed amalgamation then merges
    the heaviest child); roots likewise. Returns ``post`` with ``post[t]`` the
    node visited t-th.

    The depth-first tour is a linked list of 2n events (enter v, leave v):
    after entering v comes entering its first child (or leaving v), after
    leaving v entering its next sibling (or leaving its parent). The position
    of v in the postorder is the number of "leave" events before its own,
    found by ranking the list with pointer jumping.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    parent = np.asarray(parent, dtype=np.int64)
    p = np.where(parent < 0, n, parent)
    if weight is None:
        order = stable_argsort(p, n + 1)          # children grouped by parent
    else:
        order = np.lexsort((np.arange(n), weight, p)).astype(np.int64)
    counts = np.bincount(p, minlength=n + 1)
    start = np.zeros(n + 2, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    at = np.empty(n, dtype=np.int64)              # where each node sits in ``order``
    at[order] = np.arange(n, dtype=np.int64)
    end = 2 * n                                   # the event after the last one
    nxt = np.empty(2 * n + 1, dtype=np.int64)
    # enter v (event v): enter its first child, or leave v
    nxt[:n] = np.where(counts[:n] > 0, order[np.minimum(start[:n], n - 1)],
                       n + np.arange(n, dtype=np.int64))
    # leave v (event n + v): enter its next sibling, or leave its parent
    sib = at + 1
    nxt[n:end] = np.where(sib < start[p + 1], order[np.minimum(sib, n - 1)],
                          np.where(parent >= 0, n + parent, end))
    nxt[end] = end
    # rank: leave events from each event to the end of the tour
    rank = np.zeros(2 * n + 1, dtype=np.int64)
    rank[n:end] = 1
    for _ in range((2 * n).bit_length()):
        rank = rank + rank[nxt]
        nxt = nxt[nxt]
    post = np.empty(n, dtype=np.int64)
    post[n - rank[n:end]] = np.arange(n, dtype=np.int64)
    return post


def subtree_sizes(parent: np.ndarray) -> np.ndarray:
    """Number of nodes in each subtree of a postordered forest (parent > child)."""
    return subtree_sums(parent, np.ones(len(parent), dtype=np.int64))


def _range_min_table(values: np.ndarray) -> tuple:
    """Sparse table of range minima: level k holds the minima of the windows of
    length 2^k, all levels in one flat array (and each level's offset)."""
    levels = [values]
    width = 1
    while 2 * width <= len(values):
        prev = levels[-1]
        levels.append(np.minimum(prev[:-width], prev[width:]))
        width *= 2
    offsets = np.zeros(len(levels), dtype=np.int64)
    np.cumsum([len(t) for t in levels[:-1]], out=offsets[1:])
    return np.concatenate(levels), offsets


def _postorder_lca(parent: np.ndarray, first: np.ndarray, u: np.ndarray,
                   v: np.ndarray) -> np.ndarray:
    """LCA of pairs u < v of one tree of a postordered forest.

    Among the labels ``[u, v)`` the node whose subtree starts first (the
    largest such label on ties) is the child of the LCA on the way to u; the
    LCA is its parent. A sparse table of the packed key ``first·(n+1) + (n -
    label)`` answers each range minimum in two look-ups.
    """
    n = len(parent)
    if len(u) == 0:
        return np.zeros(0, dtype=np.int64)
    labels = np.arange(n, dtype=np.int64)
    flat, offsets = _range_min_table(first * (n + 1) + (n - labels))
    length = v - u
    level = np.frexp(length.astype(np.float64))[1].astype(np.int64) - 1   # floor(log2)
    base = offsets[level]
    best = np.minimum(flat[base + u], flat[base + v - (np.int64(1) << level)])
    return parent[n - best % (n + 1)]


def column_counts(indptr: np.ndarray, indices: np.ndarray, parent: np.ndarray,
                  leftmost: np.ndarray) -> np.ndarray:
    """Nonzeros of each row of R (compiled where available, else
    :func:`column_counts_numpy`; same parameters and result)."""
    if len(parent):
        lib = native.handle()
        if lib is not None:
            return native.column_counts(lib, indptr, indices, parent, leftmost)
    return column_counts_numpy(indptr, indices, parent, leftmost)


def column_counts_numpy(indptr: np.ndarray, indices: np.ndarray, parent: np.ndarray,
                        leftmost: np.ndarray) -> np.ndarray:
    """Nonzeros of each row of R (diagonal included), for a postordered tree.

    Parameters
    ----------
    indptr, indices : ndarray
        CSR pattern of A with postordered column labels (sorted indices).
    parent : ndarray
        Column elimination tree in the same labels (``parent[j] > j``).
    leftmost : ndarray
        :func:`leftmost_columns` of the pattern.

    Returns
    -------
    counts : ndarray of int64, shape (n,)
        ``counts[j]`` = structural nonzeros in row j of R = column j of the
        Cholesky factor of AᵀA.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    diag = np.arange(n, dtype=np.int64)
    # distinct (k, p) pairs sorted by k then p (postorder labels): column k of
    # R and the leftmost column p of a row holding k (and k itself)
    key = np.concatenate([np.asarray(indices, dtype=np.int64) * (n + 1)
                          + np.repeat(leftmost, np.diff(indptr)), diag * (n + 2)])
    key.sort()
    if len(key) > 1:
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    k = key // (n + 1)
    p = key % (n + 1)
    delta = np.bincount(p, minlength=n + 1).astype(np.int64)
    same = k[1:] == k[:-1]
    first = first_descendants(parent)
    if same.any():
        lca = _postorder_lca(parent, first, p[:-1][same], p[1:][same])
        delta -= np.bincount(lca, minlength=n + 1)
    par = np.where(parent < 0, n, parent)
    delta -= np.bincount(par, minlength=n + 1)
    return subtree_sums(parent, delta[:n], first)
