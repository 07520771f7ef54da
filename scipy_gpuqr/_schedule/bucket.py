"""The bucket scheduler of one front (Yeralan, Davis, Ranka, §3.1).

A front of ``fm × fn`` (row-major, rows in staircase order) is cut into row
tiles of ``TILE`` rows. Row tile ``i`` starts in *column bucket*
``min(c_i, i)``, ``c_i`` being the column tile of its leftmost nonzero (the
``min`` gives every bucket its diagonal tile even where the front is
structurally rank deficient). Tiles left of their bucket are zero and are
never touched. Each launch, a bucket's idle row tiles are grouped into
*bundles* of at most ``BUNDLE`` tiles and factorized (the leftmost column
tile becomes R in the bundle's top tile, V elsewhere, T and V1 into a VT
tile); the next launch applies the block reflector to the bundle's column
tiles to the right, the top tile stays in the bucket flagged upper
triangular and the rest *advance* to the next bucket. A bucket is finished
when it holds one upper triangular tile (the diagonal one, so R ends in
place in the front's top rows).

With **pipelining** the advancing tiles are factorized in the very launch
that applies their previous reflector (an Apply+Factorize task), together
with idle tiles of the next bucket (the bundle's *delta*, bundle growth);
that saves one launch per column tile on the critical path.

The schedule depends only on the tile pattern (row-tile buckets, numbers of
column tiles, tunables): it is computed once per pattern in tile units
(:func:`tile_schedule`, cached) and instantiated for each front with the
front's sizes and offsets by vectorized NumPy (:func:`front_tasks`).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .tasks import (DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE,
                    MAX_BUNDLE, MAX_SLOTS, TASK_DTYPE, TaskType, empty_tasks)

__all__ = ["TileSchedule", "tile_buckets", "tile_schedule", "front_tasks",
           "dense_front_tasks", "vt_slots_recycled"]


@dataclass(frozen=True)
class TileSchedule:
    """A front's schedule in tile units (shared by fronts of equal pattern).

    Attributes
    ----------
    tasks : ndarray of TASK_DTYPE
        Records with ``rows`` holding row-tile indices, ``col``, ``c0``,
        ``c1`` column-tile indices and ``vt``, ``vt2`` VT-tile numbers
        local to the front (one per Factorize, in creation order).
    launch : ndarray of int32
        Local launch of each record (0-based, nondecreasing).
    nlaunch : int
        Launches the front needs (0 when nothing is factorized).
    nvt : int
        VT tiles the front produces (one per Factorize).
    """

    tasks: np.ndarray
    launch: np.ndarray
    nlaunch: int
    nvt: int


def tile_buckets(fm: int, fn: int, stair, nfact: int, tile: int) -> np.ndarray:
    """Initial column bucket of each row tile, -1 for tiles never factorized.

    Parameters
    ----------
    fm, fn : int
        Front shape.
    stair : array_like of int, shape (fn,), or None
        ``stair[j]`` = number of rows whose leftmost nonzero column is ≤ j
        (nondecreasing); None means dense.
    nfact : int
        Columns to eliminate (the pivot columns, or all of them when the
        contribution block is triangularized too).
    tile : int
        Tile edge.
    """
    nrt = -(-fm // tile)
    nfct = -(-nfact // tile) if nfact > 0 else 0
    first = np.arange(nrt, dtype=np.int64) * tile
    if stair is None:
        lead = np.zeros(nrt, dtype=np.int64)
    else:
        stair = np.asarray(stair, dtype=np.int64)
        if stair.shape != (fn,):
            raise ValueError(f"stair has shape {stair.shape}, expected ({fn},)")
        if fn and np.any(np.diff(stair) < 0):
            raise ValueError("stair must be nondecreasing")
        lead = np.searchsorted(stair, first, side="right") // tile
        # rows beyond stair[-1] are all zero: they lead nowhere
        lead[first >= (stair[-1] if fn else 0)] = np.iinfo(np.int64).max // 2
    b = np.minimum(lead, np.arange(nrt))
    b[b >= nfct] = -1
    return b.astype(np.int32)


def _chunks(tiles: list, bundle: int) -> list:
    """Split a sorted list into ceil(n/bundle) near-equal consecutive chunks."""
    n = len(tiles)
    k = -(-n // bundle)
    base, extra = divmod(n, k)
    out, p = [], 0
    for q in range(k):
        s = base + (1 if q < extra else 0)
        out.append(tiles[p:p + s])
        p += s
    return out


@functools.lru_cache(maxsize=4096)
def _tile_schedule_cached(buckets: tuple, nct: int, nfct: int, bundle: int,
                          pipelining: bool, granule: int) -> TileSchedule:
    # [launch, type, col, c0, c1, napply, nfrows, fstart, flags, rows, vt, vt2, ftop]
    recs: list[list] = []
    arrivals = [defaultdict(list) for _ in range(nfct)]
    for i, b in enumerate(buckets):
        if b >= 0:
            arrivals[b][0].append(("idle", (i,), None))
    nvt = 0

    def emit_apply(t: int, b: int, rows: list, vt: int, af: bool) -> int | None:
        """Apply of the reflector factorized at bucket b to column tiles > b."""
        first = None
        for c0 in range(b + 1, nct, granule):
            c1 = min(c0 + granule, nct)
            typ = TaskType.APPLY_FACTORIZE if (af and c0 == b + 1) else TaskType.APPLY
            recs.append([t, int(typ), b, c0, c1, len(rows), 0, 0, 0, list(rows), vt, -1, 0])
            if first is None:
                first = len(recs) - 1
        return first

    for b in range(nfct):
        events = arrivals[b]
        if not events:
            continue
        idle: list[int] = []
        triu: set[int] = set()
        tops_next: list[int] = []
        t = min(events)
        while True:
            idle.extend(tops_next)
            triu.update(tops_next)
            tops_next = []
            afs = []
            for kind, tiles, ref in events.pop(t, ()):
                if kind == "idle":
                    idle.extend(tiles)
                else:
                    afs.append((tiles, ref))
            idle.sort()
            bundles = []   # (sorted tiles, record index of A+F or None, rest)
            for rest, ref in afs:
                delta = idle[:bundle - len(rest)]
                idle = idle[len(delta):]
                bundles.append((sorted(rest + tuple(delta)), ref, rest))
            if idle:
                if len(idle) == 1:
                    x = idle[0]
                    if x == b and x not in triu:
                        bundles.append(([x], None, ()))
                        idle = []
                else:
                    for ch in _chunks(idle, bundle):
                        bundles.append((ch, None, ()))
                    idle = []
            for tiles, ref, rest0 in bundles:
                vt = nvt
                nvt += 1
                if ref is None:
                    slots = list(tiles)
                    recs.append([t, int(TaskType.FACTORIZE), b, 0, 0, 0, len(tiles), 0,
                                 0, slots, vt, -1, 0])
                    r = recs[-1]
                else:
                    r = recs[ref]
                    delta = [x for x in tiles if x not in rest0]
                    slots = r[9] + delta
                    r[9] = slots
                    r[6] = len(tiles)
                    r[7] = 1
                    r[11] = vt
                top = tiles[0]
                r[12] = slots.index(top, r[7])
                flags = 0
                for k in range(r[7], r[7] + r[6]):
                    if slots[k] in triu:
                        flags |= 1 << k
                        triu.discard(slots[k])
                r[8] = flags
                rest = tiles[1:]
                tops_next.append(top)
                af = pipelining and bool(rest) and b + 1 < nfct
                first = emit_apply(t + 1, b, [top] + rest, vt, af)
                if rest and b + 1 < nfct:
                    if af:
                        arrivals[b + 1][t + 1].append(("af", tuple(rest), first))
                    else:
                        arrivals[b + 1][t + 2].append(("idle", tuple(rest), None))
            if not events and not bundles:
                break
            t = t + 1 if bundles else min(events)
        idle.extend(tops_next)
        triu.update(tops_next)
        if idle != [b] or b not in triu:  # pragma: no cover - invariant
            raise AssertionError(f"bucket {b} ended with {idle} (triu {sorted(triu)})")

    n = len(recs)
    tasks = empty_tasks(n)
    launch = np.zeros(n, dtype=np.int32)
    if n:
        order = sorted(range(n), key=lambda k: recs[k][0])
        cols = list(zip(*[recs[k] for k in order]))
        launch[:] = cols[0]
        tasks["type"] = cols[1]
        tasks["col"] = cols[2]
        tasks["c0"] = cols[3]
        tasks["c1"] = cols[4]
        tasks["napply"] = cols[5]
        tasks["nfrows"] = cols[6]
        tasks["fstart"] = cols[7]
        tasks["flags"] = cols[8]
        rows = np.full((n, MAX_SLOTS), -1, dtype=np.int32)
        for k, rr in enumerate(cols[9]):
            rows[k, :len(rr)] = rr
        tasks["rows"] = rows
        tasks["vt"] = cols[10]
        tasks["vt2"] = cols[11]
        tasks["ftop"] = cols[12]
    tasks.flags.writeable = False
    launch.flags.writeable = False
    nlaunch = int(launch[-1]) + 1 if n else 0
    return TileSchedule(tasks=tasks, launch=launch, nlaunch=nlaunch, nvt=nvt)


def tile_schedule(buckets, nct: int, nfct: int, *, bundle: int = DEFAULT_BUNDLE,
                  pipelining: bool = True,
                  granule: int = DEFAULT_APPLY_GRANULE) -> TileSchedule:
    """The schedule of one tile pattern (cached; the arrays are read-only).

    Parameters
    ----------
    buckets : sequence of int
        Initial bucket per row tile (:func:`tile_buckets`), -1 = never
        factorized.
    nct : int
        Column tiles of the front (Apply tasks reach all of them).
    nfct : int
        Column tiles to factorize.
    bundle : int
        Most row tiles per bundle (2 … MAX_BUNDLE).
    pipelining : bool
        Apply+Factorize tasks and bundle growth.
    granule : int
        Most column tiles one Apply task updates.
    """
    if not 2 <= bundle <= MAX_BUNDLE:
        raise ValueError(f"bundle must be in [2, {MAX_BUNDLE}], got {bundle}")
    if granule < 1:
        raise ValueError(f"granule must be >= 1, got {granule}")
    return _tile_schedule_cached(tuple(int(b) for b in buckets), int(nct), int(nfct),
                                 int(bundle), bool(pipelining), int(granule))


def front_tasks(sched: TileSchedule, fm: int, fn: int, nfact: int, *, tile: int,
                F: int = 0, vt_base: int = 0, front: int = 0,
                vt_ids: np.ndarray | None = None) -> np.ndarray:
    """Instantiate a tile schedule for one front: element offsets and sizes.

    Parameters
    ----------
    sched : TileSchedule
        From :func:`tile_schedule`.
    fm, fn, nfact : int
        Front rows, columns and columns to eliminate.
    tile : int
        Tile edge the schedule was built for.
    F : int
        Front base offset in the front pool.
    vt_base : int
        Offset of the front's first VT tile in the VT pool.
    front : int
        Front index written into the records.
    vt_ids : ndarray or None
        Map from the schedule's VT numbers to VT tiles (e.g.
        :func:`vt_slots_recycled`); None keeps one tile per Factorize.

    Returns
    -------
    ndarray of TASK_DTYPE
        The records, in the schedule's order (use ``sched.launch``).
    """
    t = sched.tasks.copy()
    t["F"] = F
    t["fm"] = fm
    t["fn"] = fn
    t["front"] = front
    rows = t["rows"]
    t["rows"] = np.where(rows >= 0, rows * tile, -1)
    col = t["col"].astype(np.int64) * tile
    t["col"] = col
    t["nref"] = np.minimum(tile, nfact - col)
    af = t["type"] == TaskType.APPLY_FACTORIZE
    t["aux"] = np.where(af, np.minimum(tile, nfact - t["c0"].astype(np.int64) * tile), 0)
    t["c0"] = t["c0"] * tile
    t["c1"] = np.minimum(t["c1"].astype(np.int64) * tile, fn)
    tt = tile * tile
    vt, vt2 = t["vt"], t["vt2"]
    if vt_ids is not None:
        vt = np.where(vt >= 0, vt_ids[np.maximum(vt, 0)], -1)
        vt2 = np.where(vt2 >= 0, vt_ids[np.maximum(vt2, 0)], -1)
    t["vt"] = np.where(vt >= 0, vt_base + vt * tt, -1)
    t["vt2"] = np.where(vt2 >= 0, vt_base + vt2 * tt, -1)
    return t


def dense_front_tasks(fm: int, fn: int, nfact: int | None = None, stair=None, *,
                      tile: int = DEFAULT_TILE, bundle: int = DEFAULT_BUNDLE,
                      pipelining: bool = True, granule: int = DEFAULT_APPLY_GRANULE):
    """Schedule and instantiate one front at offset 0 (tests, experiments).

    Returns
    -------
    tasks : ndarray of TASK_DTYPE
    launch : ndarray of int32
    nvt : int
        VT tiles needed (one per Factorize).
    """
    nfact = min(fm, fn) if nfact is None else int(nfact)
    nct = -(-fn // tile)
    nfct = -(-nfact // tile) if nfact > 0 else 0
    b = tile_buckets(fm, fn, stair, nfact, tile)
    s = tile_schedule(b, nct, nfct, bundle=bundle, pipelining=pipelining,
                      granule=granule)
    return front_tasks(s, fm, fn, nfact, tile=tile), s.launch, s.nvt


def vt_slots_recycled(sched: TileSchedule) -> tuple[np.ndarray, int]:
    """Reuse VT tiles once their reflector has been applied (no kept H).

    A VT tile written in launch t is read in launch t+1 and free from t+2.

    Returns
    -------
    ids : ndarray of int64
        VT tile for each of the schedule's VT numbers.
    nslots : int
        Tiles the front needs at once.
    """
    t = sched.tasks
    fac = np.where(t["type"] == TaskType.FACTORIZE)[0]
    born = np.full(sched.nvt, -1, dtype=np.int64)
    born[t["vt"][fac]] = sched.launch[fac]
    af = np.where(t["type"] == TaskType.APPLY_FACTORIZE)[0]
    born[t["vt2"][af]] = sched.launch[af]
    ids = np.empty(sched.nvt, dtype=np.int64)
    free: list[int] = []
    busy: dict[int, list[int]] = defaultdict(list)
    nslots = 0
    for v in np.argsort(born, kind="stable"):
        tb = int(born[v])
        for tf in [k for k in busy if k + 2 <= tb]:
            free.extend(busy.pop(tf))
        if free:
            s = free.pop()
        else:
            s = nslots
            nslots += 1
        ids[v] = s
        busy[tb].append(s)
    return ids, nslots
