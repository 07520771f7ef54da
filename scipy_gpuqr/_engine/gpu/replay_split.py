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


def _level_fronts(plan) -> tuple:
    """Per level the fronts its records update: their row map offsets and rows
    (one per front and level, sorted by level) and each level's first (``ptr``,
    of length ``nlevels + 1``), as lists."""
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    rlev = np.repeat(np.arange(len(lp) - 1, dtype=np.int64), np.diff(lp))
    aux = plan.records["aux"].astype(np.int64)
    fm = plan.records["fm"].astype(np.int64)
    order = np.lexsort((aux, rlev))
    rlev, aux, fm = rlev[order], aux[order], fm[order]
    keep = np.r_[True, (rlev[1:] != rlev[:-1]) | (aux[1:] != aux[:-1])] if len(rlev) \
        else np.zeros(0, bool)
    rlev, aux, fm = rlev[keep], aux[keep], fm[keep]
    ptr = np.searchsorted(rlev, np.arange(int(plan.nlevels) + 1))
    return aux.tolist(), fm.tolist(), ptr.tolist()


def split_levels(plan, stage_device: dict, home) -> ReplaySplit | None:
    """The :class:`ReplaySplit` of ``plan`` (see the module doc), or None where
    no level runs off the home device. A level followed by a dense front runs
    on the home device, where the front's data lie (its records read their
    stage's pool over the link, as without a split).

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
    home X holds every row's value but those of running segments. A lane's
    level joins its device's running segment unless a row it touches was
    touched last by another segment still running or put back after this
    one started, or by a home front after it started: then a new segment
    starts there, after the running segments holding its rows are put back.
    A home level runs once the running segments holding its rows are put
    back. Rows are each level's fronts' slots (:func:`_level_fronts`): a
    superset of what it updates; rows copied back unchanged keep their bits.
    """
    nl = int(plan.nlevels)
    lstage = np.asarray(plan.level_stage, dtype=np.int64)
    dev_of = [stage_device.get(int(s), home) for s in lstage.tolist()]
    for lv in plan.level_dense:         # a dense front's data lie on the home device
        dev_of[lv] = home
    if all(d == home for d in dev_of):
        return None
    levels = {}
    for lv, d in enumerate(dev_of):
        if d != home:
            levels.setdefault(d, []).append(lv)
    local = {}
    for d, lv in levels.items():
        local.update({x: j for j, x in enumerate(lv)})
    levels = {d: np.asarray(lv, dtype=np.int64) for d, lv in levels.items()}
    rowmap = np.asarray(plan.rowmap, dtype=np.int64)
    faux, ffm, fptr = _level_fronts(plan)
    # a front's key: its row map offset; a dense front's: numbers after them
    dense, key = {}, len(rowmap)
    for lv in sorted(plan.level_dense):
        dense[lv] = []
        for obj in plan.level_dense[lv]:
            dense[lv].append((key, np.asarray(obj.slots, dtype=np.int64)))
            key += 1
    segments, ops = [], {}
    for trans in (True, False):
        order = range(nl) if trans else range(nl - 1, -1, -1)
        # who touched a row last: a lane's segment (>= 0), a home front (-2 - its
        # key) or nobody (-1); a front's rows are marked when its toucher changes
        last = np.full(int(plan.m), -1, dtype=np.int64)
        seen = {}                   # front key -> the mark of its last level
        home_step = {}              # home front key -> the step of its last level
        started, finished = {}, {}  # segment -> the step it started / was put back
        running = {}                # segment -> device, not yet put back
        current = {}                # device -> its running segment
        seg_rows = {}
        steps = []

        def put_back(t):
            steps.append(("finish", t))
            finished[t] = len(steps)
            _put_back(t, running, current)

        def stale(t, cur) -> bool:
            """Whether segment ``cur``'s copy of rows ``t`` touched last is stale."""
            if t == -1 or t == cur:
                return False
            if t <= -2:                         # a home front touched them after cur began
                return home_step[-2 - t] > started[cur]
            return t in running or finished[t] > started[cur]

        for lv in order:
            d = dev_of[lv]
            # the level's fronts; a front seen before in this walk was touched last
            # by its own previous level (its levels run after its descendants' and
            # before its ancestors', in either direction)
            fronts = [(faux[j], ffm[j]) for j in range(fptr[lv], fptr[lv + 1])]
            fronts += [(key, None) for key, _ in dense.get(lv, ())]
            slots = dict((key, r) for key, r in dense.get(lv, ()))
            prev = set()
            for key, n in fronts:
                t = seen.get(key)
                if t is None:
                    r = rowmap[key: key + n] if n is not None else slots[key]
                    prev.update(np.unique(last[r]).tolist())
                else:
                    prev.add(t)
            if d == home:
                for t in sorted(x for x in prev if x in running):
                    put_back(t)
                steps.append(("home", lv))
                mark = None
            else:
                seg = current.get(d)
                if seg is None or any(stale(t, seg) for t in prev):
                    for t in sorted(x for x in prev if x in running):
                        put_back(t)
                    seg = len(segments)
                    segments.append((d, None))
                    seg_rows[seg] = []
                    running[seg] = d
                    current[d] = seg
                    steps.append(("start", seg))
                    started[seg] = len(steps)
                steps.append(("level", seg, local[lv]))
                mark = seg
            for key, n in fronts:
                who = -2 - key if mark is None else mark
                if mark is None:
                    home_step[key] = len(steps)
                if seen.get(key) != who:
                    r = rowmap[key: key + n] if n is not None else slots[key]
                    last[r] = who
                    seen[key] = who
                    if mark is not None:
                        seg_rows[mark].append(r)
        for t in list(running):
            put_back(t)
        for t, parts in seg_rows.items():
            segments[t] = (segments[t][0], np.unique(np.concatenate(parts)) if parts
                           else np.zeros(0, np.int64))
        ops[trans] = steps
    return ReplaySplit(levels=levels, segments=segments, ops=ops)


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
    idx = np.concatenate([np.arange(lp[lv], lp[lv + 1]) for lv in levels.tolist()]) \
        if len(levels) else np.zeros(0, np.int64)
    rec = plan.records[idx].copy()
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
