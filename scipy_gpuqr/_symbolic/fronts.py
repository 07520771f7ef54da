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

from . import native
from .._index_ranges import ranges
from ._arrays import depths, stable_argsort, stable_sort

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
    merged pivot columns stay contiguous). One scalar loop over supernodes; a
    group is a contiguous range, so no union-find is needed to find j's. The
    loop runs in C where :mod:`.native`'s library is at hand (the same rule
    and float arithmetic), else in Python.
    """
    ns_total = len(super_ptr) - 1
    if ns_total <= 1 or not params.enabled:
        return super_ptr.copy()
    n = len(parent)
    first = super_ptr[:-1]
    last = super_ptr[1:] - 1
    snode = np.repeat(np.arange(ns_total), np.diff(super_ptr))
    par_last = parent[last]
    sparent = np.where(par_last >= 0, snode[np.maximum(par_last, 0)], -1)
    lib = native.handle()
    if lib is not None:
        keep = native.relaxed_amalgamation(lib, sparent, np.diff(super_ptr), counts[first],
                                           params.nrelax, params.zrelax)
        return np.append(super_ptr[np.flatnonzero(keep)], n).astype(np.int64)
    sparent = sparent.tolist()
    nscol = np.diff(super_ptr).tolist()
    snz = counts[first].tolist()              # rows of the R block of the first column
    zeros = [0] * ns_total
    keep = [True] * ns_total
    n0, n1, n2 = params.nrelax
    z0, z1, z2 = params.zrelax
    # groups are contiguous ranges of supernodes, made from the last one down:
    # the group headed by j+1 spans [j+1, end), and j's parent lies in it or not
    end = ns_total
    for j in range(ns_total - 2, -1, -1):
        p = sparent[j]
        if p < 0 or p >= end:
            end = j + 1
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
            keep[p] = False
        else:
            end = j + 1
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

    The fronts are built a depth of the front tree at a time, deepest first
    (a front's children are one level deeper, so they are done): the
    non-pivot columns of a front are the columns past its pivots of its S
    rows and of its children's non-pivot columns, sorted and made distinct
    for the whole level at once; the same sort gives every such column its
    local position, hence the Rjmap of the children and the S entries' local
    columns. The front rows, staircases and maps follow without a loop.
    Where the compiled library of :mod:`.native` is at hand, the column lists
    and maps are made front after front in C instead (the same arrays; the
    level loop, :func:`_front_columns_numpy`, is the reference and fallback).

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
    front_ptr = np.asarray(front_ptr, dtype=i64)
    s_indptr = np.asarray(s_indptr, dtype=i64)
    s_indices = np.asarray(s_indices, dtype=i64)
    fp = np.diff(front_ptr)
    col2front = np.repeat(np.arange(nf, dtype=i64), fp)
    last = front_ptr[1:] - 1
    fparent = np.full(nf, -1, dtype=i64)
    if nf:
        pl = parent[last]
        fparent = np.where(pl >= 0, col2front[np.maximum(pl, 0)], -1).astype(i64)
    fn = fp + (counts[last] - 1 if nf else np.zeros(0, i64))
    # children in increasing order (postorder)
    has_p = np.flatnonzero(fparent >= 0)
    children = has_p[stable_argsort(fparent[has_p], nf)]
    child_ptr = _pointer(np.bincount(fparent[has_p], minlength=nf))
    # S rows per front (rows of S are sorted by leftmost column)
    nonempty = leftmost < n
    row_front = col2front[leftmost[nonempty]]
    arow_ptr = _pointer(np.bincount(row_front, minlength=nf))
    na = np.diff(arow_ptr)
    s_ptr = s_indptr[arow_ptr]
    s_rows = np.flatnonzero(nonempty)
    ns_rows = len(s_rows)

    col_ptr = _pointer(fn)
    ncb_cols = fn - fp
    rjmap_ptr = _pointer(ncb_cols)
    lib = native.handle() if nf else None
    if lib is not None:
        got, bad = native.front_columns(lib, front_ptr, fn, col_ptr, s_ptr, s_indices,
                                        child_ptr, children, na, rjmap_ptr, n,
                                        int(s_indptr[ns_rows]))
        if bad is not None:
            raise AssertionError(f"front {bad[0]}: column list has {bad[1]} non-pivot "
                                 f"columns, column counts say {int(ncb_cols[bad[0]])}")
        cols, rjmap, ent_col, fm, cm = got
    else:
        cols, rjmap, ent_col, fm, cm = _front_columns_numpy(
            nf, n, front_ptr, fp, fn, fparent, col_ptr, ncb_cols, rjmap_ptr, s_ptr, s_indices,
            children, child_ptr, na, int(s_indptr[ns_rows]))
    frank = np.minimum(fm, fp)

    # ---- front rows and staircases ---------------------------------------------
    # Each row of a front sits in the slot of its leftmost local column (S rows:
    # leftmost - first pivot column; row ci of a child's contribution block:
    # Rjmap[ci]), slots numbered like ``cols``. Rows go by slot; in one slot the
    # S rows first (in S order), then the children's rows (child order, then
    # row order). S rows come sorted by slot already; the children's rows are
    # sorted stably. A row's place among all rows is its rank among its kind
    # plus the rows of the other kind in the slots before (and, for a child's
    # row, the S rows of its own slot).
    rimap_ptr = _pointer(cm)
    if lib is not None:
        stair, arow_local, rimap, s_index = native.front_rows(
            lib, front_ptr, fn, col_ptr, arow_ptr, leftmost[:ns_rows], s_indptr[:ns_rows + 1],
            ent_col, child_ptr, children, cm, rjmap_ptr, rjmap, rimap_ptr)
    else:
        stair, arow_local, rimap, s_index = _front_rows_numpy(
            nf, front_ptr, fn, fparent, col_ptr, cols, row_front, leftmost, s_rows, ns_rows,
            s_indptr, ent_col, cm, rjmap_ptr, rjmap, rimap_ptr)

    return FrontStructure(
        nfronts=nf, pivot_ptr=front_ptr, parent=fparent, child_ptr=child_ptr,
        children=children, col_ptr=col_ptr, cols=cols, stair=stair, fm=fm, fn=fn, fp=fp,
        frank=frank, cm=cm, arow_ptr=arow_ptr, arow_local=arow_local, s_ptr=s_ptr,
        s_index=s_index, s_nz=np.asarray(s_nz[:s_indptr[ns_rows]], dtype=i64),
        rjmap_ptr=rjmap_ptr, rjmap=rjmap, rimap_ptr=rimap_ptr, rimap=rimap)


def _front_rows_numpy(nf, front_ptr, fn, fparent, col_ptr, cols, row_front, leftmost, s_rows,
                      ns_rows, s_indptr, ent_col, cm, rjmap_ptr, rjmap, rimap_ptr) -> tuple:
    """:func:`build_fronts`' rows in NumPy (the reference of :func:`.native.front_rows`):
    ``(stair, arow_local, rimap, s_index)``."""
    i64 = np.int64
    s_slot = col_ptr[row_front] + leftmost[s_rows] - front_ptr[row_front]
    # child c's row ci: slot Rjmap[ci] of its parent (a root front has no such rows)
    cb_slot = (np.repeat(col_ptr[fparent], cm)
               + rjmap[ranges(rjmap_ptr[:-1], rjmap_ptr[:-1] + cm)])
    nslots = len(cols)
    s_cum = np.cumsum(np.bincount(s_slot, minlength=nslots))          # S rows up to a slot
    cb_count = np.bincount(cb_slot, minlength=nslots)
    cb_cum = np.cumsum(cb_count)                                      # child rows up to it
    row_start = np.zeros(nf, dtype=i64)                   # rows before each front
    row_start[1:] = (s_cum + cb_cum)[col_ptr[1:-1] - 1]
    arow_local = (np.arange(ns_rows, dtype=i64) + (cb_cum - cb_count)[s_slot]
                  - row_start[row_front])
    slot_sorted, order = stable_sort(cb_slot, nslots)
    rimap = np.empty(len(order), dtype=i64)
    rimap[order] = np.arange(len(order), dtype=i64) + s_cum[slot_sorted]
    rimap -= np.repeat(row_start[fparent], cm)
    # staircase: rows up to each slot, within its front
    stair = s_cum + cb_cum - np.repeat(row_start, fn)

    # ---- S-assembly map ------------------------------------------------------
    nent = np.diff(s_indptr[:ns_rows + 1])
    s_index = np.repeat(arow_local * fn[row_front], nent) + ent_col
    return stair, arow_local, rimap, s_index


def _front_columns_numpy(nf, n, front_ptr, fp, fn, fparent, col_ptr, ncb_cols, rjmap_ptr,
                         s_ptr, s_indices, children, child_ptr, na, n_entries) -> tuple:
    """:func:`build_fronts`' level loop in NumPy (the reference of
    :func:`.native.front_columns`): ``(cols, rjmap, ent_col, fm, cm)``."""
    i64 = np.int64
    cols = np.empty(int(col_ptr[-1]), dtype=i64)
    cols[ranges(col_ptr[:-1], col_ptr[:-1] + fp)] = np.arange(front_ptr[0], front_ptr[-1])
    rjmap = np.empty(int(rjmap_ptr[-1]), dtype=i64)
    ent_col = np.empty(n_entries, dtype=i64)    # local column of each S entry
    fm = np.zeros(nf, dtype=i64)
    cm = np.zeros(nf, dtype=i64)

    # ---- column lists, Rjmap, S columns, fm and cm: one tree level at a time ----
    depth = depths(fparent)
    top = int(depth.max()) if nf else -1
    by_level = stable_argsort(top - depth, top + 1)             # deepest first
    level_ptr = _pointer(np.bincount(top - depth, minlength=top + 1))
    for lev in range(top + 1):
        F = by_level[level_ptr[lev]:level_ptr[lev + 1]]        # increasing labels
        if len(F) == 1:
            # a level of one front (a chain of fronts): the same steps on slices
            _one_front(int(F[0]), front_ptr, fp, fn, col_ptr, cols, s_ptr, s_indices, children,
                       child_ptr, ncb_cols, rjmap, rjmap_ptr, ent_col, na, fm, cm, n)
            continue
        ent = ranges(s_ptr[F], s_ptr[F + 1])
        kids = children[ranges(child_ptr[F], child_ptr[F + 1])]
        slots = ranges(col_ptr[kids] + fp[kids], col_ptr[kids + 1])
        kid_of_slot = np.repeat(kids, ncb_cols[kids])
        owner = np.concatenate([np.repeat(F, s_ptr[F + 1] - s_ptr[F]), fparent[kid_of_slot]])
        col = np.concatenate([s_indices[ent], cols[slots]])
        lo, hi = front_ptr[owner], front_ptr[owner + 1]
        local = col - lo                                         # right for the pivots
        rest = np.flatnonzero(col >= hi)
        if len(rest):
            key = owner[rest] * (n + 1) + col[rest]
            sk, order = stable_sort(key, nf * (n + 1))
            new = np.ones(len(sk), dtype=bool)
            new[1:] = sk[1:] != sk[:-1]
            uk = sk[new]
            uowner = uk // (n + 1)
            start = np.searchsorted(uowner, F, "left")
            got = np.searchsorted(uowner, F, "right") - start
            bad = np.flatnonzero(got != ncb_cols[F])
            if len(bad):
                f = int(F[bad[0]])
                raise AssertionError(f"front {f}: column list has {int(got[bad[0]])} non-pivot "
                                     f"columns, column counts say {int(ncb_cols[f])}")
            ulocal = fp[uowner] + np.arange(len(uk), dtype=i64) - np.repeat(start, got)
            cols[col_ptr[uowner] + ulocal] = uk % (n + 1)
            local[rest[order]] = ulocal[np.cumsum(new) - 1]
        elif np.any(ncb_cols[F]):
            f = int(F[np.flatnonzero(ncb_cols[F])[0]])
            raise AssertionError(f"front {f}: column list has 0 non-pivot columns, "
                                 f"column counts say {int(ncb_cols[f])}")
        ne = len(ent)
        ent_col[ent] = local[:ne]
        rjmap[slots - col_ptr[kid_of_slot] - fp[kid_of_slot] + rjmap_ptr[kid_of_slot]] = local[ne:]
        # rows: the S rows and the children's contribution-block rows
        kid_cm = _pointer(cm[kids])
        nk = child_ptr[F + 1] - child_ptr[F]
        ends = np.cumsum(nk)
        m_f = na[F] + kid_cm[ends] - kid_cm[ends - nk]
        fm[F] = m_f
        cm[F] = np.minimum(m_f - np.minimum(m_f, fp[F]), ncb_cols[F])
    return cols, rjmap, ent_col, fm, cm


def _one_front(f, front_ptr, fp, fn, col_ptr, cols, s_ptr, s_indices, children, child_ptr,
               ncb_cols, rjmap, rjmap_ptr, ent_col, na, fm, cm, n) -> None:
    """:func:`build_fronts`' level step for a level of the one front f (fills its
    column list, its children's Rjmap, its S entries' local columns, fm and cm)."""
    i64 = np.int64
    lo, hi = int(front_ptr[f]), int(front_ptr[f + 1])
    s0, s1 = int(s_ptr[f]), int(s_ptr[f + 1])
    kids = children[child_ptr[f]:child_ptr[f + 1]]
    c0 = col_ptr[f] + fp[f]
    if len(kids):
        slots = ranges(col_ptr[kids] + fp[kids], col_ptr[kids + 1])
        col = np.concatenate([s_indices[s0:s1], cols[slots]])
    else:
        col = s_indices[s0:s1]
    local = col - lo                                             # right for the pivots
    rest = np.flatnonzero(col >= hi)
    sk, order = stable_sort(col[rest], n + 1)
    new = np.ones(len(sk), dtype=bool)
    new[1:] = sk[1:] != sk[:-1]
    uk = sk[new]
    if len(uk) != ncb_cols[f]:
        raise AssertionError(f"front {f}: column list has {len(uk)} non-pivot columns, "
                             f"column counts say {int(ncb_cols[f])}")
    cols[c0:c0 + len(uk)] = uk
    local[rest[order]] = fp[f] + np.cumsum(new) - 1
    ne = s1 - s0
    ent_col[s0:s1] = local[:ne]
    if len(kids):
        kid_of_slot = np.repeat(kids, ncb_cols[kids])
        rjmap[slots - col_ptr[kid_of_slot] - fp[kid_of_slot] + rjmap_ptr[kid_of_slot]] = \
            local[ne:]
    m_f = int(na[f]) + int(cm[kids].sum(dtype=i64))
    fm[f] = m_f
    cm[f] = min(m_f - min(m_f, int(fp[f])), int(ncb_cols[f]))


def _pointer(counts: np.ndarray) -> np.ndarray:
    """CSR-like pointer of ``counts``: ``[0, c0, c0 + c1, ...]`` (int64)."""
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr
