"""``Q``'s replay of a multi-device factorization run where each stage's pool lies.

A multi-device factorization (:mod:`.multi_device`) leaves each subtree
stage's front pool on the GPU that made it; ``Q``'s replay runs on the home
device (the first). Read from there, the other GPUs' Householder vectors come
over the link a few hundred bytes at a time, level after level. Here the
levels of a stage held by another GPU run on that GPU instead (a *lane*):
only the rows of ``X`` its fronts touch move, home → lane before its levels
and back after (``k`` columns of those rows each way, against the stage's
reflectors read over the link per replay).

Why the order may change (:func:`split_levels`)
    A level's records update only global rows of their fronts' slots
    (:func:`.solve.check_levels`), so levels touching disjoint rows commute.
    The home X is the master copy. The levels are walked in the replay's
    order; a lane's consecutive levels form a *segment*: its rows (their
    fronts' slots) copied from the master to the lane's own X when it starts,
    put back when a later level touches them or at the end. A lane's level
    that touches rows another segment touched last starts a new segment,
    after the running segments holding those rows are put back; a home level
    runs on the master once the running segments holding its rows are put
    back. So every row sees the levels touching it in the plan's order, on
    the value the previous one left: the result is the unsplit replay's, bit
    for bit. For a subtree mapping (subtrees on the other GPUs, the upper
    tree on the home one) ``Qᵀ`` starts each lane's subtrees at once, runs the
    home device's own subtrees beside them and puts each lane back before the
    first upper front taking its rows; ``Q`` the same backwards. A level
    with a dense front runs on the home device, where the front's data lie.

Lanes are made by the caller (:func:`.solve.replay_lanes`: CuPy on each GPU;
:class:`NumpyLane` for the CPU tests), each with a plan of its own levels
(:func:`lane_plan`: its records with their VT tiles and row map sliced out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..._index_ranges import ranges
from .peer_rows import PeerRows

__all__ = ["ReplaySplit", "split_levels", "lane_plan", "split_replay", "NumpyLane",
           "CupyLane"]


@dataclass(frozen=True)
class ReplaySplit:
    """Where each level of a replay plan runs, and the moves between devices.

    Attributes
    ----------
    levels : dict
        lane device → its levels (plan order); its lane plan's level ``j`` is
        plan level ``levels[d][j]``.
    segments : list of (device, ndarray)
        Per segment (a run of one lane's levels started from the home X and
        put back once), its device and the global rows its levels touch.
    ops : dict
        ``trans`` → the replay's steps in order: ``("home", lv)``,
        ``("start", seg)``, ``("level", seg, j)``, ``("finish", seg)``.
    """

    levels: dict
    segments: list
    ops: dict

    @property
    def moves(self) -> int:
        """Segments per replay direction (each one start and one finish)."""
        return len(self.segments)


@dataclass(frozen=True)
class _Fronts:
    """The fronts a plan's levels update, numbered: row map fronts (by offset)
    then dense fronts (one per level and dense object, in level order).

    Attributes
    ----------
    front, level : ndarray of int64
        One pair per front and level that updates it, sorted by front, then
        level.
    ptr, rows : ndarray of int64
        Front ``f``'s global rows: ``rows[ptr[f]:ptr[f + 1]]`` (its row map
        slice of its records' ``fm`` rows; a dense front's slots).
    """

    front: np.ndarray
    level: np.ndarray
    ptr: np.ndarray
    rows: np.ndarray

    @property
    def count(self) -> int:
        return len(self.ptr) - 1

    def rows_of(self, fronts) -> np.ndarray:
        """The rows of ``fronts`` (with repeats), front after front."""
        return self.rows[ranges(self.ptr[fronts], self.ptr[fronts + 1])]


def _level_fronts(plan) -> _Fronts:
    """The :class:`_Fronts` of ``plan``. A front's records all carry its row
    count (``fm``), so its rows are one row map slice."""
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    nl = len(lp) - 1
    aux = plan.records["aux"].astype(np.int64)
    rowmap = np.asarray(plan.rowmap, dtype=np.int64)
    fid = np.zeros(len(rowmap) + 1, np.int64 if len(rowmap) >= 2 ** 31 - 1 else np.int32)
    fid[aux] = 1
    offs = np.flatnonzero(fid)
    fid[offs] = np.arange(len(offs))
    rec_front = fid[aux].astype(np.int64)
    count = np.zeros(len(offs), np.int64)
    count[rec_front] = plan.records["fm"]
    rlev = np.repeat(np.arange(nl, dtype=np.int64), np.diff(lp))
    pair = rec_front * max(nl, 1) + rlev
    if len(pair):                   # a front's records of a level mostly side by side
        pair = np.sort(pair[np.r_[True, pair[1:] != pair[:-1]]])
        pair = pair[np.r_[True, pair[1:] != pair[:-1]]]
    if len(offs) and np.array_equal(offs[1:], offs[:-1] + count[:-1]):
        rows = rowmap[offs[0]: offs[-1] + count[-1]]    # the fronts' slices in order
    else:
        rows = rowmap[ranges(offs, offs + count)]
    front, level = [pair // max(nl, 1)], [pair % max(nl, 1)]
    rows, sizes = [rows], [count]
    nf = len(offs)
    for lv in sorted(plan.level_dense):
        for obj in plan.level_dense[lv]:
            slots = np.asarray(obj.slots, dtype=np.int64)
            front.append(np.array([nf], np.int64))
            level.append(np.array([lv], np.int64))
            rows.append(slots)
            sizes.append(np.array([len(slots)], np.int64))
            nf += 1
    return _Fronts(front=np.concatenate(front), level=np.concatenate(level),
                   ptr=np.r_[0, np.cumsum(np.concatenate(sizes))].astype(np.int64),
                   rows=np.concatenate(rows) if len(rows) > 1 else rows[0])


def _chain_edges(fr: _Fronts, nl: int, m: int):
    """Which front updated each front's rows last before it, in plan order.

    Returns ``(first, last, after, before)``: each front's first and last
    level, and the pairs of fronts (``after[i]`` reads rows ``before[i]``
    updated last before ``after``'s first level; each pair once); or None
    where a row's fronts interleave (a front updates a row, another front
    does, then the first again; or two fronts of one level share a row).
    Without interleaving, a row is updated by a chain of fronts, each front's
    levels all before the next one's: the last front before a level is the
    same whichever of its levels, and ``Q``'s order (backwards) reads the
    chain from its other end.
    """
    nf = fr.count
    head = np.flatnonzero(np.r_[True, fr.front[1:] != fr.front[:-1]])
    first = fr.level[head]
    last = fr.level[np.r_[head[1:], len(fr.front)] - 1]
    # the fronts by first level: a group of one first level reads the rows
    # written by earlier groups, then writes its own
    order = np.argsort(first, kind="stable")
    size = np.diff(fr.ptr)[order]
    rows = fr.rows_of(order)
    small = np.int32 if nf < np.iinfo(np.int32).max else np.int64
    owner = np.repeat(order.astype(small), size)
    gfirst = first[order]
    cut = np.flatnonzero(np.r_[True, gfirst[1:] != gfirst[:-1], True])
    ends = np.r_[0, np.cumsum(size)][cut].tolist()
    groups = list(zip(ends[:-1], ends[1:]))
    who = np.full(m, -1, small)
    pred = np.empty(len(rows), small)
    for a, b in groups:
        r = rows[a:b]
        pred[a:b] = who[r]
        who[r] = owner[a:b]
    # a tree (each front's rows updated next by one front) where no row is
    # updated first twice: the pairs read off each front's successor; else
    # each group checked and the pairs sorted out
    has = pred >= 0
    p, o = pred[has], owner[has]
    succ = np.full(nf, -1, small)
    succ[p] = o
    if np.array_equal(succ[p], o) and len(p) + np.count_nonzero(who >= 0) == len(rows):
        before = np.flatnonzero(succ >= 0)
        after = succ[before].astype(np.int64)
    else:
        who[:] = -1
        for a, b in groups:
            r = rows[a:b]
            who[r] = owner[a:b]
            if b - a > 1 and not np.array_equal(who[r], owner[a:b]):
                return None             # fronts of one level share a row
        pair = np.unique(o.astype(np.int64) * nf + p)
        after, before = pair // nf, pair % nf
    if np.any(last[before] >= first[after]):
        return None
    return first, last, after, before


def _dependencies(fr: _Fronts, chain, lane: np.ndarray, nl: int, trans: bool):
    """Per walk step (the replay's levels in its order) the earlier steps whose
    marks it reads: each of its fronts' previous level, or for a front's first
    level, the last level of the fronts that updated its rows before it.

    Returns ``(home, lane_ptr, lane_on)``: per step the latest home step it
    reads (-1: none), and the lane steps it reads
    (``lane_on[lane_ptr[p]:lane_ptr[p + 1]]``), as lists.
    """
    first, last, after, before = chain
    same = fr.front[1:] == fr.front[:-1]
    early, late = fr.level[:-1][same], fr.level[1:][same]
    if trans:                       # the chain from its leaf end
        at = np.r_[late, first[after]]
        on = np.r_[early, last[before]]
    else:                           # from its root end: the levels backwards
        at = np.r_[early, last[before]]
        on = np.r_[late, first[after]]
    is_lane = lane[on]
    if not trans:
        at, on = nl - 1 - at, nl - 1 - on
    home = np.full(nl, -1, np.int64)
    np.maximum.at(home, at[~is_lane], on[~is_lane])
    key = np.unique(at[is_lane] * nl + on[is_lane])
    at_l, on_l = key // max(nl, 1), key % max(nl, 1)
    ptr = np.searchsorted(at_l, np.arange(nl + 1))
    return home.tolist(), ptr.tolist(), on_l.tolist()


def split_levels(plan, stage_device: dict, home) -> ReplaySplit | None:
    """The :class:`ReplaySplit` of ``plan`` (see the module doc), or None where
    no level runs off the home device, or where a row's fronts interleave
    (:func:`_chain_edges`; the replay's own plans never do). A level followed
    by a dense front runs on the home device, where the front's data lie (its
    records read their stage's pool over the link, as without a split).

    Parameters
    ----------
    plan : ReplayPlan
    stage_device : dict
        stage → the device its pool lies on (a stage not in it: ``home``).
    home : hashable
        The home device.

    Notes
    -----
    The levels are walked in each direction's order (``Qᵀ``: plan order). The
    home X holds every row's value but those of running segments. Each front
    carries a *mark*, who updated its rows last: the segment its last level
    ran in, or the home device at that level's step. A lane's level joins its
    device's running segment unless a mark it reads (its fronts' previous
    levels; for a front's first level, the fronts that updated its rows last,
    :func:`_chain_edges`) is another segment still running or put back after
    this one started, or a home level after it started: then a new segment
    starts there, after the running segments holding its rows are put back.
    A home level runs once the running segments holding its rows are put
    back. A segment's rows are its levels' fronts' slots, a superset of what
    they update; rows copied back unchanged keep their bits. Which steps read
    which is found by array operations once per direction; the walk itself
    looks only at those.
    """
    nl = int(plan.nlevels)
    lstage = np.asarray(plan.level_stage, dtype=np.int64).tolist()
    dev_of = [stage_device.get(s, home) for s in lstage]
    for lv in plan.level_dense:         # a dense front's data lie on the home device
        dev_of[lv] = home
    lane = np.fromiter((d != home for d in dev_of), dtype=bool, count=nl)
    if not lane.any():
        return None
    levels, local = {}, [0] * nl
    for lv in np.flatnonzero(lane).tolist():
        mine = levels.setdefault(dev_of[lv], [])
        local[lv] = len(mine)
        mine.append(lv)
    levels = {d: np.asarray(lv, dtype=np.int64) for d, lv in levels.items()}
    fr = _level_fronts(plan)
    chain = _chain_edges(fr, nl, int(plan.m))
    if chain is None:
        return None
    segments, ops, seg_of = [], {}, {}
    for trans in (True, False):
        deps = _dependencies(fr, chain, lane, nl, trans)
        ops[trans], seg_of[trans] = _walk(nl, trans, dev_of, home, local, deps, segments)
    # a segment's rows: the rows of every front its levels update
    seg = []
    for trans in (True, False):
        s = np.asarray(seg_of[trans], dtype=np.int64)
        seg.append((s if trans else s[::-1])[fr.level])    # per (front, level) pair
    for t, rows in enumerate(_segment_rows(fr, seg, len(segments), int(plan.m))):
        segments[t] = (segments[t][0], rows)
    return ReplaySplit(levels=levels, segments=segments, ops=ops)


#: Bytes of the segments × rows table :func:`_segment_rows` marks at once.
_TABLE_BYTES = 64 << 20


def _segment_rows(fr: _Fronts, seg: list, ns: int, m: int) -> list:
    """Each segment's rows (sorted, int64): the rows of the fronts of its
    levels. ``seg``: per direction, the segment of each (front, level) pair of
    ``fr`` (-1: home). Marked in a segments × rows table, as many segments at
    once as :data:`_TABLE_BYTES` holds, a front in one segment per direction
    by its rows in place."""
    nf, size = fr.count, np.diff(fr.ptr)
    out = []
    step = max(1, _TABLE_BYTES // max(m, 1))
    for t0 in range(0, ns, step):
        t1 = min(ns, t0 + step)
        table = np.zeros((t1 - t0 + 1, m), dtype=bool)  # its last row: other segments'
        flat = table.reshape(-1)
        for sl in seg:
            got = (sl >= t0) & (sl < t1)
            f, t = fr.front[got], sl[got] - t0
            one = np.full(nf, t1 - t0, np.int64)
            one[f] = t
            flat[np.repeat(one * m, size) + fr.rows] = True
            more = t != one[f]                  # fronts in two segments or more
            if more.any():
                key = np.unique(t[more] * nf + f[more])
                f, t = key % nf, key // nf
                flat[np.repeat(t * m, size[f]) + fr.rows_of(f)] = True
        out += [np.flatnonzero(table[t]).astype(np.int64) for t in range(t1 - t0)]
    return out


def _walk(nl: int, trans: bool, dev_of: list, home, local: list, deps, segments: list):
    """One direction's steps (``ReplaySplit.ops``) and each walk step's segment
    (-1: a home level); new segments appended to ``segments`` as
    ``(device, None)``. ``deps``: :func:`_dependencies`."""
    home_dep, ptr, on = deps
    steps = []
    seg_at = [-1] * nl
    step_at = [0] * nl
    started, finished = {}, {}      # segment -> the step it started / was put back
    running, current = {}, {}       # segment -> device not yet put back; device -> its own

    def put_back(segs) -> None:
        for t in sorted(x for x in segs if x in running):
            steps.append(("finish", t))
            finished[t] = len(steps)
            _put_back(t, running, current)

    for p in range(nl):
        lv = p if trans else nl - 1 - p
        d = dev_of[lv]
        a, b = ptr[p], ptr[p + 1]
        segs = {seg_at[q] for q in on[a:b]} if b > a else ()
        if d == home:
            if segs and running:
                put_back(segs)
            steps.append(("home", lv))
            step_at[p] = len(steps)
            continue
        seg = current.get(d)
        h = home_dep[p]
        if seg is None or (h >= 0 and step_at[h] > started[seg]) or any(
                t != seg and (t in running or finished[t] > started[seg]) for t in segs):
            put_back(segs)
            seg = len(segments)
            segments.append((d, None))
            running[seg] = d
            current[d] = seg
            steps.append(("start", seg))
            started[seg] = len(steps)
        steps.append(("level", seg, local[lv]))
        seg_at[p] = seg
    for t in list(running):
        steps.append(("finish", t))
        finished[t] = len(steps)
        _put_back(t, running, current)
    return steps, seg_at


def _put_back(t, running: dict, current: dict) -> None:
    """Segment ``t`` is put back: no longer running, nor its device's current."""
    d = running.pop(t)
    if current.get(d) == t:
        del current[d]


def lane_plan(plan, levels, tile: int):
    """A plan of ``levels`` alone (a lane's): their records, the VT tiles they
    read and the row map slice they index, with ``vt`` and ``aux`` rewritten.

    Returns ``(plan, vt_start, vt_end)``: the lane's plan and the VT pool's
    elements ``[vt_start, vt_end)`` it reads (copied to the lane's device)."""
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    levels = np.asarray(levels, dtype=np.int64)
    counts = lp[levels + 1] - lp[levels]
    # runs of consecutive levels (a stage's levels are), copied a run at a time
    cut = np.flatnonzero(np.diff(levels) != 1) + 1
    heads, tails = (levels[np.r_[0, cut]], levels[np.r_[cut - 1, len(levels) - 1]] + 1) \
        if len(levels) else (levels, levels)
    rec = np.concatenate([plan.records[lp[a]:lp[b]]
                          for a, b in zip(heads.tolist(), tails.tolist())] or [plan.records[:0]])
    if len(rec):
        v0 = int(rec["vt"].min())
        v1 = int(rec["vt"].max()) + tile * tile
        a0 = int(rec["aux"].min())
        a1 = int((rec["aux"].astype(np.int64) + rec["fm"]).max())
    else:
        v0 = v1 = a0 = a1 = 0
    rec["vt"] -= v0
    rec["aux"] -= a0
    sub = dataclasses.replace(
        plan, records=rec, rowmap=np.ascontiguousarray(plan.rowmap[a0:a1]),
        level_ptr=np.r_[0, np.cumsum(counts)].astype(np.int64),
        level_stage=np.asarray(plan.level_stage, dtype=np.int64)[levels].copy(),
        level_dense={}, level_dense_fronts={})
    return sub, v0, v1


def split_replay(split: ReplaySplit, home_level, lanes: dict, X, trans: bool) -> None:
    """``X ← Qᵀ X`` (``trans``) or ``Q X`` in place over the split's devices.

    ``home_level(lv, X, trans)`` runs one home level (its dense fronts
    included); each lane (``lanes[device]``) has ``start(X, seg, rows)`` → its
    own X holding those rows, ``level(j, Xd, trans)`` (its lane plan's level
    ``j``), ``finish(Xd, seg, rows, X)`` (the rows put back in X) and
    ``done()``.
    """
    own = {}
    try:
        for op in split.ops[bool(trans)]:
            kind = op[0]
            if kind == "home":
                home_level(op[1], X, trans)
            elif kind == "level":
                d = split.segments[op[1]][0]
                lanes[d].level(op[2], own[op[1]], trans)
            else:
                d, rows = split.segments[op[1]]
                if kind == "start":
                    own[op[1]] = lanes[d].start(X, op[1], rows)
                else:
                    lanes[d].finish(own.pop(op[1]), op[1], rows, X)
    finally:
        for lane in lanes.values():
            lane.done()


class NumpyLane:
    """A simulated device's lane (CPU tests): its own X (NaN outside its rows,
    so a row read that the split left out shows up) and a NumPy executor over
    its lane plan.

    Parameters
    ----------
    executor : object
        ``level(j, X, trans)`` over the lane's plan (:class:`.solve.NumpyExecutor`).
    """

    def __init__(self, executor):
        self.executor = executor

    def start(self, X, seg, rows):
        Xd = np.full_like(X, np.nan)
        Xd[rows] = X[rows]
        return Xd

    def level(self, j, Xd, trans):
        self.executor.level(j, Xd, trans)

    def finish(self, Xd, seg, rows, X):
        X[rows] = Xd[rows]

    def done(self):
        self.executor.done()


class CupyLane:
    """A lane on GPU ``device_id``: its executor (a :class:`.solve.CupyExecutor`
    over its lane plan, made on that device with a stream of its own) and its
    segments' rows moved by a :class:`~.peer_rows.PeerRows`.

    Parameters
    ----------
    device_id : int
    executor : CupyExecutor
        The lane's executor (its ``stream`` on ``device_id``).
    rows : dict
        segment → the global rows it touches.
    home : int
        The home device.
    home_stream : cupy.cuda.Stream
        The home replay's stream.
    """

    def __init__(self, device_id, executor, rows, home, home_stream):
        import cupy as cp
        self.cp = cp
        self.id = int(device_id)
        self.executor = executor
        self.moves = PeerRows(device_id, home, executor.stream, home_stream,
                              {seg: (r, r) for seg, r in rows.items()})

    def start(self, X, seg, rows):
        """The lane's X (m × k on its device) holding segment ``seg``'s rows of X."""
        return self.moves.lend(X, seg)

    def level(self, j, Xd, trans) -> None:
        with self.cp.cuda.Device(self.id):
            self.executor.level(j, Xd, trans)

    def finish(self, Xd, seg, rows, X) -> None:
        """Segment ``seg``'s rows put back in X (the home stream waits for the lane)."""
        self.moves.take_back(Xd, seg, X)

    def done(self) -> None:
        self.executor.done()
