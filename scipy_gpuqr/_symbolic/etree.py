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
* Column counts of R (nonzeros per row of R, diagonal included) use the
  row-subtree characterisation: column k of R (row k of L = chol(AᵀA)) has the
  pattern T_k = union of the tree paths from ``leftmost[i]`` to k over the rows
  i that hold column k. Counting how many T_k contain each node is done with
  the skeleton/least-common-ancestor formula (+1 at each path start, -1 at the
  LCA of consecutive starts in postorder, -1 at the parent of k) followed by
  subtree sums; the LCAs are batched with binary lifting over a postordered
  tree. Cost O((nnz(A) + n) log n), all vectorized.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import minimum_spanning_tree

__all__ = ["leftmost_columns", "column_etree", "postorder", "column_counts",
           "subtree_sizes"]


def leftmost_columns(indptr: np.ndarray, indices: np.ndarray, n: int) -> np.ndarray:
    """First column of each row of a CSR pattern with sorted indices (n if empty)."""
    m = len(indptr) - 1
    left = np.full(m, n, dtype=np.int64)
    nonempty = indptr[1:] > indptr[:-1]
    left[nonempty] = indices[indptr[:-1][nonempty]]
    return left


def _star_edges(indptr, indices, leftmost):
    """Edges (leftmost[i], j) for every entry (i, j) with j > leftmost[i]."""
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    lo = leftmost[rows]
    keep = indices != lo
    return lo[keep], indices[keep].astype(np.int64)


def column_etree(indptr: np.ndarray, indices: np.ndarray, n: int,
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
    lo, hi = _star_edges(indptr, indices, leftmost)
    parent = np.full(n, -1, dtype=np.int64)
    if len(lo) == 0:
        return parent
    # weight max(u, v) + 1 (> 0 so no edge is read as absent)
    g = sp.coo_array(((hi + 1).astype(np.float64), (lo, hi)), shape=(n, n)).tocsr()
    g.sum_duplicates()
    g.data = (g.indices + 1).astype(np.float64)   # undo summed duplicates
    forest = sp.coo_array(minimum_spanning_tree(g))
    u = np.minimum(forest.row, forest.col).astype(np.int64)
    v = np.maximum(forest.row, forest.col).astype(np.int64)
    order = np.argsort(v, kind="stable")
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
    """A postorder of a forest.

    Children are visited in increasing ``weight`` (ties: increasing label),
    so with ``weight`` = column counts the heaviest child comes last, next to
    its parent (CHOLMOD's weighted postorder: relaxed amalgamation then merges
    the heaviest child). Returns ``post`` with ``post[t]`` the node visited
    t-th.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    p = np.where(parent < 0, n, parent)
    if weight is None:
        order = np.argsort(p, kind="stable")          # children grouped by parent
    else:
        order = np.lexsort((np.arange(n), weight, p))
    counts = np.bincount(p, minlength=n + 1)
    start = np.concatenate(([0], np.cumsum(counts)))
    kids = order.tolist()
    start_l = start.tolist()
    post = []
    append = post.append
    # iterative DFS from the virtual root n
    stack = [(n, start_l[n])]
    while stack:
        node, nxt = stack[-1]
        if nxt < start_l[node + 1]:
            stack[-1] = (node, nxt + 1)
            child = kids[nxt]
            stack.append((child, start_l[child]))
        else:
            stack.pop()
            if node != n:
                append(node)
    return np.asarray(post, dtype=np.int64)


def subtree_sizes(parent: np.ndarray) -> np.ndarray:
    """Number of nodes in each subtree of a postordered forest (parent > child)."""
    return subtree_sums(parent, np.ones(len(parent), dtype=np.int64))


def subtree_sums(parent: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each subtree of a postordered forest.

    With postorder labels the subtree of j is the label range
    ``[j - size_j + 1, j]``; sums are accumulated child to parent.
    """
    acc = np.array(values, dtype=np.int64, copy=True)
    par = parent.tolist()
    a = acc.tolist()
    for j, pj in enumerate(par):
        if pj >= 0:
            a[pj] += a[j]
    return np.asarray(a, dtype=np.int64)


def _lifting_table(parent: np.ndarray) -> np.ndarray:
    """up[k][j] = 2^k-th ancestor of j, the virtual root n above every root."""
    n = len(parent)
    up0 = np.where(parent < 0, n, parent).astype(np.int64)
    up0 = np.append(up0, n)
    levels = max(1, int(np.ceil(np.log2(n + 2))))
    table = [up0]
    for _ in range(levels - 1):
        prev = table[-1]
        table.append(prev[prev])
    return np.stack(table)


def _batched_lca(up: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """LCA of pairs u < v in a postordered forest (virtual root n).

    The LCA is the first ancestor of u whose label is >= v: climb u to the
    highest ancestor with label < v, then take its parent.
    """
    x = u.copy()
    for k in range(up.shape[0] - 1, -1, -1):
        y = up[k][x]
        move = y < v
        x = np.where(move, y, x)
    return up[0][x]


def column_counts(indptr: np.ndarray, indices: np.ndarray, parent: np.ndarray,
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
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    k = np.concatenate([indices.astype(np.int64), np.arange(n, dtype=np.int64)])
    p = np.concatenate([leftmost[rows], np.arange(n, dtype=np.int64)])
    # unique (k, p) pairs sorted by k then p (postorder labels)
    key = np.unique(k * (n + 1) + p)
    k = key // (n + 1)
    p = key % (n + 1)
    delta = np.bincount(p, minlength=n + 1).astype(np.int64)
    same = k[1:] == k[:-1]
    if same.any():
        up = _lifting_table(parent)
        lca = _batched_lca(up, p[:-1][same], p[1:][same])
        delta -= np.bincount(lca, minlength=n + 1)
    par = np.where(parent < 0, n, parent)
    delta -= np.bincount(par, minlength=n + 1)
    return subtree_sums(parent, delta[:n])
