"""Fronts of the multifrontal QR: supernodes, relaxed amalgamation, front structure and maps.

Input: the pattern of S = A[rowperm, colperm] with postordered column labels,
its column elimination tree and the column counts of R (:mod:`.etree`). When
the analysis removed column singletons, S here is ``A22`` (the rows and
columns left after them) and :func:`~scipy_gpuqr._symbolic.analyze` shifts the
labels afterwards (pivot columns by ``n1cols``, ``arow_ptr`` by ``n1rows``).

Fronts are contiguous ranges of pivot columns (fundamental supernodes of the
column elimination tree, merged by relaxed amalgamation). Because the column
labels are a postorder of the tree, the fronts numbered by their first pivot
column are themselves in postorder and ``front_parent[f] > f``.

Per front f (local columns ``0 … fn-1``, pivot columns first, all sorted):

* its column list (the pattern of its rows of R),
* ``fm`` rows: the rows of A whose leftmost column is one of its pivot columns
  (the *S rows*), then the contribution-block rows of its children,
  interleaved so that rows are sorted by their leftmost local column (within
  one column: S rows first, then child rows in child order),
* the staircase ``stair[k]`` = number of rows whose leftmost local column is
  <= k,
* the S-assembly map (each entry of A -> linear position ``row·fn + col`` in
  the front, row-major),
* for each child c, ``Rjmap`` (c's non-pivot columns -> parent local columns)
  and ``Rimap`` (c's contribution-block rows -> parent local rows).

Without rank detection a front yields ``min(fm, fp)`` rows of R and a
contribution block of ``cm = min(fm - min(fm, fp), fn - fp)`` rows, upper
trapezoidal over its ``fn - fp`` non-pivot columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Amalgamation", "fundamental_supernodes", "relaxed_amalgamation",
           "FrontStructure", "build_fronts"]


@dataclass(frozen=True)
class Amalgamation:
    """Relaxed amalgamation parameters (CHOLMOD's rule and defaults).

    A front (child) and its parent front, adjacent in postorder, are merged
    when the merged front of ``ns`` pivot columns has a fraction ``z`` of
    explicit zeros (counted over the trapezoidal R block of the merged front)
    such that::

        ns <= nrelax[0]
        or (ns <= nrelax[1] and z < zrelax[0])
        or (ns <= nrelax[2] and z < zrelax[1])
        or z < zrelax[2]

    Merges that add no zero (fundamental supernodes) always happen.

    Attributes
    ----------
    nrelax : tuple of 3 int
        Pivot-column limits, default (4, 16, 48).
    zrelax : tuple of 3 float
        Zero-fraction limits, default (0.8, 0.1, 0.05).
    enabled : bool
        False keeps the fundamental supernodes.
    """

    nrelax: tuple = (4, 16, 48)
    zrelax: tuple = (0.8, 0.1, 0.05)
    enabled: bool = True


def fundamental_supernodes(parent: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Starting columns of the fundamental supernodes (plus a final ``n``).

    Column j+1 continues j's supernode iff it is j's parent, j is its only
    child and ``counts[j] == counts[j+1] + 1``.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    nchild = np.bincount(parent[parent >= 0], minlength=n)
    j = np.arange(n - 1)
    cont = (parent[:-1] == j + 1) & (nchild[1:] == 1) & (counts[:-1] == counts[1:] + 1)
    starts = np.flatnonzero(np.concatenate(([True], ~cont)))
    return np.append(starts, n).astype(np.int64)


def relaxed_amalgamation(parent: np.ndarray, counts: np.ndarray, super_ptr: np.ndarray,
                         params: Amalgamation = Amalgamation()) -> np.ndarray:
    """Merge supernodes into fronts; returns the fronts' pivot column pointer.

    Supernodes are visited from the last to the first; supernode j is merged
    with the group immediately after it when that group holds j's parent (so
    merged pivot columns stay contiguous). One scalar loop over supernodes.
    """
    ns_total = len(super_ptr) - 1
    if ns_total <= 1 or not params.enabled:
        return super_ptr.copy()
    n = len(parent)
    first = super_ptr[:-1]
    last = super_ptr[1:] - 1
    snode = np.repeat(np.arange(ns_total), np.diff(super_ptr))
    par_last = parent[last]
    sparent = np.where(par_last >= 0, snode[np.maximum(par_last, 0)], -1).tolist()
    nscol = np.diff(super_ptr).tolist()
    snz = counts[first].tolist()              # rows of the R block of the first column
    zeros = [0] * ns_total
    rep = list(range(ns_total))               # group head of each supernode
    keep = [True] * ns_total
    n0, n1, n2 = params.nrelax
    z0, z1, z2 = params.zrelax

    def find(x):
        root = x
        while rep[root] != root:
            root = rep[root]
        while rep[x] != root:
            rep[x], x = root, rep[x]
        return root

    for j in range(ns_total - 2, -1, -1):
        p = sparent[j]
        if p < 0 or find(p) != j + 1:
            continue
        p = j + 1
        c0, c1 = nscol[j], nscol[p]
        ns = c0 + c1
        lnz0, lnz1 = snz[j], snz[p]
        # zero count of the merged front: the parent group's, plus the zeros the
        # child adds (CHOLMOD's bookkeeping; a tiny merge adds none)
        totzeros = zeros[p]
        if ns <= n0:
            merge = True
        else:
            newzeros = c0 * (lnz1 + c0 - lnz0)
            if newzeros == 0:
                merge = True
            else:
                totzeros += newzeros
                size = ns * (ns + 1) / 2 + ns * (lnz1 - c1)
                z = totzeros / size
                merge = ((ns <= n1 and z < z0) or (ns <= n2 and z < z1) or z < z2)
        if merge:
            nscol[j] = ns
            snz[j] = c0 + lnz1
            zeros[j] = totzeros
            rep[p] = j
            keep[p] = False
    heads = np.flatnonzero(np.asarray(keep))
    return np.append(super_ptr[heads], n).astype(np.int64)


@dataclass(frozen=True)
class FrontStructure:
    """Flat, CSR-like per-front arrays (all int64). See the module docstring."""

    nfronts: int
    pivot_ptr: np.ndarray      # (nf+1) pivot columns of f: pivot_ptr[f]:pivot_ptr[f+1]
    parent: np.ndarray         # (nf) parent front or -1
    child_ptr: np.ndarray      # (nf+1) children of f: children[child_ptr[f]:child_ptr[f+1]]
    children: np.ndarray
    col_ptr: np.ndarray        # (nf+1) front column lists / staircases
    cols: np.ndarray           # global (permuted) column of each local column
    stair: np.ndarray          # staircase, same layout as cols
    fm: np.ndarray
    fn: np.ndarray
    fp: np.ndarray
    frank: np.ndarray          # min(fm, fp): rows of R (no rank detection)
    cm: np.ndarray             # contribution-block rows
    arow_ptr: np.ndarray       # (nf+1) S rows of f: rows arow_ptr[f]:arow_ptr[f+1] of S
    arow_local: np.ndarray     # (#S rows) local front row of each S row (-1: singleton row)
    s_ptr: np.ndarray          # (nf+1) entries of S assembled into f
    s_index: np.ndarray        # local linear index row*fn + col (row-major)
    s_nz: np.ndarray           # position of the entry in the canonical A's data
    rjmap_ptr: np.ndarray      # (nf+1) Rjmap of front c (into its parent): fn-fp ints
    rjmap: np.ndarray
    rimap_ptr: np.ndarray      # (nf+1) Rimap of front c: cm ints
    rimap: np.ndarray


def build_fronts(front_ptr: np.ndarray, parent: np.ndarray, counts: np.ndarray,
                 s_indptr: np.ndarray, s_indices: np.ndarray, s_nz: np.ndarray,
                 leftmost: np.ndarray) -> FrontStructure:
    """Front structure from the pivot ranges and the row-sorted pattern of S.

    Parameters
    ----------
    front_ptr : ndarray (nf+1)
        Pivot column ranges (from :func:`relaxed_amalgamation`).
    parent, counts : ndarray (n)
        Column etree and column counts in the postordered labels.
    s_indptr, s_indices, s_nz : ndarray
        CSR of S = A[rowperm, colperm] (rows sorted by leftmost column, empty
        rows last), and for each entry its position in the canonical A's data.
    leftmost : ndarray (m)
        Leftmost column of each row of S (n for an empty row).
    """
    nf = len(front_ptr) - 1
    n = len(parent)
    i64 = np.int64
    fp = np.diff(front_ptr).astype(i64)
    col2front = np.repeat(np.arange(nf, dtype=i64), fp)
    last = front_ptr[1:] - 1
    fparent = np.full(nf, -1, dtype=i64)
    if nf:
        pl = parent[last]
        fparent = np.where(pl >= 0, col2front[np.maximum(pl, 0)], -1).astype(i64)
    fn = fp + (counts[last] - 1 if nf else np.zeros(0, i64))
    # children in increasing order (postorder)
    has_p = fparent >= 0
    order = np.flatnonzero(has_p)
    order = order[np.argsort(fparent[order], kind="stable")]
    child_ptr = np.concatenate(([0], np.cumsum(np.bincount(fparent[has_p], minlength=nf)))).astype(i64)
    children = order.astype(i64)
    # S rows per front (rows of S are sorted by leftmost column)
    nonempty = leftmost < n
    row_front = col2front[leftmost[nonempty]]
    arow_ptr = np.concatenate(([0], np.cumsum(np.bincount(row_front, minlength=nf)))).astype(i64)
    na = np.diff(arow_ptr)
    s_ptr = s_indptr[arow_ptr].astype(i64)

    # ---- column lists, one front at a time in postorder -------------------------
    col_ptr = np.concatenate(([0], np.cumsum(fn))).astype(i64)
    cols = np.empty(int(col_ptr[-1]), dtype=i64)
    fn_l, fp_l = fn.tolist(), fp.tolist()
    fptr_l, cptr_l, sptr_l = front_ptr.tolist(), col_ptr.tolist(), s_ptr.tolist()
    chp_l, ch_l = child_ptr.tolist(), children.tolist()
    for f in range(nf):
        lo, hi = fptr_l[f], fptr_l[f + 1]
        parts = [s_indices[sptr_l[f]:sptr_l[f + 1]]]
        for c in ch_l[chp_l[f]:chp_l[f + 1]]:
            parts.append(cols[cptr_l[c] + fp_l[c]:cptr_l[c + 1]])
        nonpiv = np.concatenate(parts)
        nonpiv = np.unique(nonpiv[nonpiv >= hi])
        if len(nonpiv) != fn_l[f] - fp_l[f]:
            raise AssertionError(f"front {f}: column list has {len(nonpiv)} non-pivot columns, "
                                 f"column counts say {fn_l[f] - fp_l[f]}")
        base = cptr_l[f]
        cols[base:base + hi - lo] = np.arange(lo, hi)
        cols[base + hi - lo:cptr_l[f + 1]] = nonpiv

    # ---- Rjmap: child's non-pivot columns -> parent local columns ---------------
    ncb_cols = fn - fp
    rjmap_ptr = np.concatenate(([0], np.cumsum(ncb_cols))).astype(i64)
    # global column -> local column within a given front: search in sorted col lists
    cb_front = np.repeat(np.arange(nf, dtype=i64), ncb_cols)
    cb_local = np.arange(int(rjmap_ptr[-1]), dtype=i64) - rjmap_ptr[cb_front]
    cb_global = cols[col_ptr[cb_front] + fp[cb_front] + cb_local]
    rjmap = _local_index(cols, col_ptr, fparent[cb_front], cb_global)

    # ---- rows: fm, cm in postorder --------------------------------------------
    fm = np.zeros(nf, dtype=i64)
    cm = np.zeros(nf, dtype=i64)
    na_l = na.tolist()
    fm_l, cm_l = [0] * nf, [0] * nf
    for f in range(nf):
        m_f = na_l[f]
        for c in ch_l[chp_l[f]:chp_l[f + 1]]:
            m_f += cm_l[c]
        fm_l[f] = m_f
        r = min(m_f, fp_l[f])
        cm_l[f] = min(m_f - r, fn_l[f] - fp_l[f])
    fm[:] = fm_l
    cm[:] = cm_l
    frank = np.minimum(fm, fp)

    # ---- front rows: sort key (front, leftmost local column, kind, order) -----
    # S rows: kind 0, leftmost local = leftmost - first pivot column
    s_rows = np.flatnonzero(nonempty)
    key_front = [row_front]
    key_left = [leftmost[s_rows] - front_ptr[row_front]]
    key_kind = [np.zeros(len(s_rows), dtype=i64)]
    key_seq = [s_rows.astype(i64)]
    # child rows: kind 1, leftmost local = Rjmap[ci]
    rimap_ptr = np.concatenate(([0], np.cumsum(cm))).astype(i64)
    cb_row_front = np.repeat(np.arange(nf, dtype=i64), cm)       # the child c
    ci = np.arange(int(rimap_ptr[-1]), dtype=i64) - rimap_ptr[cb_row_front]
    key_front.append(fparent[cb_row_front])
    key_left.append(rjmap[rjmap_ptr[cb_row_front] + ci])
    key_kind.append(np.ones(len(ci), dtype=i64))
    key_seq.append(np.arange(len(ci), dtype=i64))   # children in postorder, rows in order
    kf = np.concatenate(key_front)
    kl = np.concatenate(key_left)
    kk = np.concatenate(key_kind)
    ks = np.concatenate(key_seq)
    order = np.lexsort((ks, kk, kl, kf))
    row_start = np.concatenate(([0], np.cumsum(fm))).astype(i64)
    pos = np.empty(len(order), dtype=i64)
    pos[order] = np.arange(len(order), dtype=i64)
    local_row = pos - row_start[kf]
    ns_rows = len(s_rows)
    arow_local = local_row[:ns_rows]
    rimap = local_row[ns_rows:]

    # ---- staircase -----------------------------------------------------------
    stair = np.zeros(len(cols), dtype=i64)
    np.add.at(stair, col_ptr[kf] + kl, 1)
    # per-front cumulative sum
    cs = np.cumsum(stair)
    start_cum = np.concatenate(([0], cs))[col_ptr[:-1]]
    stair = cs - np.repeat(start_cum, fn)

    # ---- S-assembly map ------------------------------------------------------
    nent = np.diff(s_indptr[:ns_rows + 1])
    ent_row = np.repeat(np.arange(ns_rows, dtype=i64), nent)
    ent_front = row_front[ent_row]
    ent_col = _local_index(cols, col_ptr, ent_front, s_indices[:s_indptr[ns_rows]].astype(i64))
    s_index = arow_local[ent_row] * fn[ent_front] + ent_col

    return FrontStructure(
        nfronts=nf, pivot_ptr=front_ptr.astype(i64), parent=fparent, child_ptr=child_ptr,
        children=children, col_ptr=col_ptr, cols=cols, stair=stair, fm=fm, fn=fn, fp=fp,
        frank=frank, cm=cm, arow_ptr=arow_ptr, arow_local=arow_local, s_ptr=s_ptr,
        s_index=s_index, s_nz=np.asarray(s_nz[:s_indptr[ns_rows]], dtype=i64),
        rjmap_ptr=rjmap_ptr, rjmap=rjmap, rimap_ptr=rimap_ptr, rimap=rimap)


def _local_index(cols: np.ndarray, col_ptr: np.ndarray, front: np.ndarray,
                 glob: np.ndarray) -> np.ndarray:
    """Local position of global column ``glob`` in front ``front``'s sorted column list.

    Vectorized: the column lists are sorted within each front, so a search on
    the key ``front·(n+1) + column`` over the concatenated lists finds it.
    """
    if len(glob) == 0:
        return np.zeros(0, dtype=np.int64)
    nf = len(col_ptr) - 1
    span = int(cols.max()) + 2 if len(cols) else 1
    owner = np.repeat(np.arange(nf, dtype=np.int64), np.diff(col_ptr))
    keys = owner * span + cols
    q = front * span + glob
    idx = np.searchsorted(keys, q)
    if np.any(idx >= len(keys)) or np.any(keys[np.minimum(idx, len(keys) - 1)] != q):
        raise AssertionError("column missing from a front's column list")
    return idx - col_ptr[front]
