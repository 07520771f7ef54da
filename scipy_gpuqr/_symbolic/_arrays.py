"""Array helpers of the symbolic analysis: stable integer sorts, forest scans.

NumPy's stable sorts (``kind='stable'``: radix or timsort) and ``lexsort``
are many times slower than its default sort of 64-bit integers, and
``np.unique`` hashes before it sorts. The analysis sorts small non-negative
integers (labels, counts, packed keys), so :func:`stable_argsort` packs the
position into the key and uses the default sort; the result is the stable
order whatever sort runs underneath.

The forest scans work on a *postordered* forest (``parent[j] > j`` or -1,
every subtree a contiguous label range ``[first[j], j]``) without a Python
loop over its nodes: :func:`first_descendants` by pointer jumping down the
first children (as many steps as the logarithm of the height),
:func:`subtree_sums` by prefix sums over those ranges, and :func:`depths`
by pointer jumping up the parents.
"""

from __future__ import annotations

import numpy as np

__all__ = ["stable_argsort", "stable_sort", "first_descendants", "subtree_sums", "depths"]

_LIMIT = 1 << 62


def stable_argsort(keys: np.ndarray, bound: int | None = None) -> np.ndarray:
    """Stable argsort of non-negative integer ``keys`` (all ``< bound``).

    The key and the position are packed into one int64 and sorted with the
    default sort (the positions make every packed key distinct, so the order
    is the stable one); keys too large to pack take NumPy's stable sort.
    """
    return stable_sort(keys, bound)[1]


def stable_sort(keys: np.ndarray, bound: int | None = None) -> tuple:
    """``(sorted keys, stable order)`` of non-negative integer ``keys`` (``< bound``),
    both read off one sort of the packed keys (see :func:`stable_argsort`)."""
    n = len(keys)
    keys = np.asarray(keys, dtype=np.int64)
    if n == 0:
        return keys.copy(), np.zeros(0, dtype=np.int64)
    if bound is None:
        bound = int(keys.max()) + 1
    if int(bound) * n >= _LIMIT:
        order = np.argsort(keys, kind="stable").astype(np.int64)
        return keys[order], order
    packed = keys * n + np.arange(n, dtype=np.int64)
    packed.sort()
    return packed // n, packed % n


def first_descendants(parent: np.ndarray) -> np.ndarray:
    """``first[j]``: the smallest label in the subtree of j of a postordered forest.

    In postorder the smallest label of a subtree is that of the first (smallest)
    child's subtree, so following first children down to a leaf finds it;
    pointer jumping takes ``log2(height) + 1`` array steps.
    """
    n = len(parent)
    first = np.arange(n, dtype=np.int64)
    has = np.flatnonzero(parent >= 0)
    np.minimum.at(first, parent[has], has)
    while True:
        nxt = first[first]
        if np.array_equal(nxt, first):
            return first
        first = nxt


def subtree_sums(parent: np.ndarray, values: np.ndarray,
                 first: np.ndarray | None = None) -> np.ndarray:
    """Sum of ``values`` over each subtree of a postordered forest (int64).

    The subtree of j is the label range ``[first[j], j]``, so the sum is a
    difference of prefix sums; ``first`` (:func:`first_descendants`) may be
    passed when known.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if first is None:
        first = first_descendants(parent)
    cs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.asarray(values, dtype=np.int64), out=cs[1:])
    return cs[1:] - cs[first]


def depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node of a forest (roots 0), by pointer jumping up the parents."""
    n = len(parent)
    anc = np.where(parent >= 0, parent, n).astype(np.int64)
    anc = np.append(anc, n)                       # a virtual root above every root
    d = (anc != n).astype(np.int64)
    d[n] = 0
    while True:
        if not (anc[:n] != n).any():
            return d[:n]
        d = d + d[anc]
        anc = anc[anc]
