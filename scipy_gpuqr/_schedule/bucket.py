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

The rules of one launch, for every bucket at once:

1. the Apply+Factorize groups arriving (tiles advancing from the bucket to
   the left, in the order their bundles were made) each take the lowest
   idle tiles of the bucket as their delta, up to ``BUNDLE`` tiles in all;
2. the other idle tiles are cut, in row order, into ``ceil(n / BUNDLE)``
   bundles of near-equal size; a single idle tile is factorized alone only
   when it is the bucket's diagonal tile and not yet upper triangular;
3. a bundle's top tile (its first row tile) is idle again, upper
   triangular, from the next launch; the others advance: with pipelining as
   an Apply+Factorize group in the next launch, without it as idle tiles of
   the next bucket two launches later (after their Apply).

The schedule depends only on the tile pattern (row-tile buckets, numbers of
column tiles, tunables). :func:`tile_schedules` runs these rules for many
patterns at once and keeps each pattern's records column by column
(:class:`TileSchedule`, cached per pattern in the process and, between
processes, on disk: :class:`.cache.PatternStore`): in compiled code pattern by pattern
(:mod:`.native`, built on first use with the system C compiler) or, where
there is none, launch by launch with NumPy over all buckets and tiles of all
patterns (:func:`_simulate_numpy`; no Python loop over tasks, bundles or
buckets). Both give the same rows byte for byte.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np

from . import cache, native
from .tasks import (DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE,
                    MAX_BUNDLE, MAX_SLOTS, TASK_DTYPE, TaskType, empty_tasks)

__all__ = ["TileSchedule", "RowBlock", "tile_buckets", "tile_schedule", "tile_schedules",
           "front_tasks", "dense_front_tasks", "vt_slots_recycled", "clear_cache",
           "many_tile_buckets", "front_schedules", "check_tunables", "expand_rows", "element_rows_of",
           "make_schedule", "front_patterns", "front_pattern_counts"]

#: the record fields a tile schedule keeps (tile units; see :class:`TileSchedule`)
COLUMNS = ("type", "col", "c0", "c1", "napply", "nfrows", "fstart", "flags", "ftop",
           "vt", "vt2", "rows")


class RowBlock:
    """The rows of patterns simulated together, column by column (read-only arrays).

    Every :class:`TileSchedule` of one simulation is a span of the same block
    (no per-pattern copy); the block's element-unit rows are made once per
    tile for all its patterns (:meth:`element_rows`).
    """

    __slots__ = ("cols", "_erows", "__weakref__")

    def __init__(self, cols: dict):
        self.cols = cols
        self._erows = {}

    def __len__(self) -> int:
        return len(self.cols["type"])

    def element_rows(self, tile: int) -> np.ndarray:
        """All rows as element-unit records (see :meth:`TileSchedule.element_rows`)."""
        got = self._erows.get(tile)
        if got is None:
            got = _element_rows(self.cols, tile)
            got.flags.writeable = False
            self._erows[tile] = got
        return got

    def has_element_rows(self, tile: int) -> bool:
        return tile in self._erows


@dataclass(frozen=True, eq=False)
class TileSchedule:
    """A front's schedule in tile units (shared by fronts of equal pattern).

    Kept compact: one *row* per Factorize or Apply+Factorize record and one
    row per *Apply run* (all Apply records of one bundle's reflector in one
    launch: ``mult`` records whose column ranges follow one another,
    ``granule`` column tiles each). :attr:`cols`, :attr:`launch` and
    :attr:`tasks` give the records one by one (built on first use).

    Attributes
    ----------
    block : RowBlock
        The rows of the patterns simulated with this one; this pattern's
        rows are ``span``.
    span : (int, int)
        First and past-the-last row of the pattern in ``block``.
    rcols : dict of ndarray
        The rows column by column (read-only; views of the block): ``type``,
        ``napply``, ``nfrows``, ``fstart``, ``flags``, ``ftop`` as in the
        record; ``col``, ``c0``, ``c1`` column-tile indices (an Apply run: its
        first record's ``c0`` and ``c0 + granule``); ``vt``, ``vt2`` VT-tile
        numbers local to the front (one per Factorize part, -1 none); ``rows``
        (n, MAX_SLOTS) row-tile indices (-1 empty); ``mult`` records per row.
    row_ptr : ndarray of int64
        Rows of local launch k are ``[row_ptr[k], row_ptr[k+1])``.
    launch_ptr : ndarray of int64
        Records of local launch k are ``[launch_ptr[k], launch_ptr[k+1])``.
    nlaunch : int
        Launches the front needs (0 when nothing is factorized).
    nvt : int
        VT tiles the front produces (one per Factorize part).
    granule : int
        Column tiles per Apply record.
    nct : int
        Column tiles of the front.
    """

    block: RowBlock
    span: tuple
    row_ptr: np.ndarray
    launch_ptr: np.ndarray
    nlaunch: int
    nvt: int
    granule: int
    nct: int

    @property
    def nrows(self) -> int:
        return self.span[1] - self.span[0]

    @functools.cached_property
    def rcols(self) -> dict:
        a, e = self.span
        return {k: v[a:e] for k, v in self.block.cols.items()}

    def __len__(self) -> int:
        return int(self.launch_ptr[-1])

    @functools.cached_property
    def _expanded(self):
        idx, k = expand_rows(np.arange(len(self.rcols["type"]), dtype=np.int64),
                             self.rcols["mult"])
        return idx, k

    @functools.cached_property
    def launch(self) -> np.ndarray:
        """Local launch of each record (int32, nondecreasing)."""
        out = np.repeat(np.arange(self.nlaunch, dtype=np.int32), np.diff(self.launch_ptr))
        out.flags.writeable = False
        return out

    @functools.cached_property
    def cols(self) -> dict:
        """The records column by column, tile units (as :attr:`rcols`, one per record)."""
        idx, k = self._expanded
        out = {name: self.rcols[name][idx] for name in COLUMNS}
        run = self.rcols["type"][idx] == TaskType.APPLY
        out["c0"] = out["c0"] + np.where(run, k * self.granule, 0).astype(np.int32)
        out["c1"] = np.where(run, np.minimum(out["c0"] + self.granule, self.nct),
                             out["c1"]).astype(np.int32)
        for v in out.values():
            v.flags.writeable = False
        return out

    @functools.cached_property
    def tasks(self) -> np.ndarray:
        """The records as TASK_DTYPE in tile units (read-only; built on first use)."""
        t = empty_tasks(len(self))
        for name in COLUMNS:
            t[name] = self.cols[name]
        t.flags.writeable = False
        return t

    def element_rows(self, tile: int) -> np.ndarray:
        """The rows as records in element units, ``(nrows, 12)`` int64 words.

        Front-independent fields only: ``F``, ``fm``, ``fn``, ``front``,
        ``nref``, ``aux`` are 0, ``vt``/``vt2`` local (``v * tile²``, -1),
        ``c1`` not clamped to the front (an Apply run: ``c0 + granule·tile``).
        Cached per tile.
        """
        if self.block.has_element_rows(tile):
            a, e = self.span
            return self.block.element_rows(tile)[a:e]
        cache = self.__dict__.setdefault("_element_rows", {})
        got = cache.get(tile)
        if got is None:
            got = _element_rows(self.rcols, tile)
            got.flags.writeable = False
            cache[tile] = got
        return got


def make_schedule(block, span, row_ptr, launch_ptr, nlaunch, nvt, granule, nct):
    """A :class:`TileSchedule` without the dataclass' field-by-field ``__init__``
    (hundreds are made per plan)."""
    s = object.__new__(TileSchedule)
    s.__dict__.update(block=block, span=span, row_ptr=row_ptr, launch_ptr=launch_ptr,
                      nlaunch=nlaunch, nvt=nvt, granule=granule, nct=nct)
    return s


def expand_rows(rows: np.ndarray, mult: np.ndarray):
    """Records of rows ``rows`` (each ``mult[row]`` times, in order).

    Returns
    -------
    idx : ndarray of int64
        The row of every record.
    k : ndarray of int64
        Its number within its row (the granule of an Apply run).
    """
    m = mult[rows].astype(np.int64)
    idx = np.repeat(rows, m)
    start = np.zeros(len(m) + 1, dtype=np.int64)
    np.cumsum(m, out=start[1:])
    k = np.arange(len(idx), dtype=np.int64) - np.repeat(start[:-1], m)
    return idx, k


def element_rows_of(rc: dict, tile: int) -> np.ndarray:
    """:meth:`TileSchedule.element_rows` of rows given column by column (``rcols``
    layout; e.g. many patterns' rows end to end), not cached."""
    return _element_rows(rc, tile)


def _element_rows(rc: dict, tile: int) -> np.ndarray:
    h = native.handle()
    if h is not None:
        return native.element_rows(h, rc, tile)
    return _element_rows_numpy(rc, tile)


def _element_rows_numpy(rc: dict, tile: int) -> np.ndarray:
    n = len(rc["type"])
    t = np.zeros(n, dtype=TASK_DTYPE)
    tt = tile * tile
    t["type"] = rc["type"]
    t["col"] = rc["col"] * tile
    t["c0"] = rc["c0"] * tile
    t["c1"] = rc["c1"] * tile
    for name in ("napply", "nfrows", "fstart", "flags", "ftop"):
        t[name] = rc[name]
    r = rc["rows"]
    t["rows"] = np.where(r >= 0, r * tile, -1)
    t["vt"] = np.where(rc["vt"] >= 0, rc["vt"].astype(np.int64) * tt, -1)
    t["vt2"] = np.where(rc["vt2"] >= 0, rc["vt2"].astype(np.int64) * tt, -1)
    return t.view(np.int64).reshape(n, TASK_DTYPE.itemsize // 8)


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
    if stair is not None:
        stair = np.asarray(stair, dtype=np.int64)
        if stair.shape != (fn,):
            raise ValueError(f"stair has shape {stair.shape}, expected ({fn},)")
        if fn and np.any(np.diff(stair) < 0):
            raise ValueError("stair must be nondecreasing")
    b, _ = many_tile_buckets(np.array([fm]), np.array([fn]), np.array([nfact]),
                             None if stair is None else stair,
                             np.array([0, fn if stair is not None else 0]), tile)
    return b


def many_tile_buckets(fm, fn, nfact, stair, stair_ptr, tile: int):
    """:func:`tile_buckets` of many fronts at once (vectorized).

    Parameters
    ----------
    fm, fn, nfact : ndarray of int (nf,)
    stair : ndarray of int or None
        The fronts' staircases one after the other (None: all dense).
    stair_ptr : ndarray of int (nf+1,)
        Front f's staircase is ``stair[stair_ptr[f]:stair_ptr[f+1]]`` (of
        length ``fn[f]``).
    tile : int

    Returns
    -------
    buckets : ndarray of int32
        Every front's row tiles one after the other.
    tile_ptr : ndarray of int64 (nf+1,)
        Front f's tiles are ``buckets[tile_ptr[f]:tile_ptr[f+1]]``.
    """
    fm = np.asarray(fm, dtype=np.int64)
    fn = np.asarray(fn, dtype=np.int64)
    nfact = np.asarray(nfact, dtype=np.int64)
    nf = len(fm)
    nrt = -(-fm // tile)
    tile_ptr = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(nrt, out=tile_ptr[1:])
    h = native.handle()
    if h is not None:
        b = native.tile_buckets(h, fm, fn, nfact, stair, stair_ptr, tile, int(tile_ptr[-1]))
        if b is not None:
            return b, tile_ptr
    return _many_tile_buckets_numpy(fm, fn, nfact, stair, stair_ptr, tile, nrt, tile_ptr)


def _many_tile_buckets_numpy(fm, fn, nfact, stair, stair_ptr, tile, nrt, tile_ptr):
    nf = len(fm)
    owner = np.repeat(np.arange(nf), nrt)
    idx = np.arange(tile_ptr[-1], dtype=np.int64) - tile_ptr[owner]
    first = idx * tile
    nfct = np.where(nfact > 0, -(-nfact // tile), 0)
    if stair is None:
        lead = np.zeros(len(idx), dtype=np.int64)
    else:
        stair = np.asarray(stair, dtype=np.int64)
        sp = np.asarray(stair_ptr, dtype=np.int64)
        # one nondecreasing key over all fronts: front f's values live in [f*big, (f+1)*big)
        big = int(fm.max(initial=0)) + 2
        sown = np.repeat(np.arange(nf, dtype=np.int64), np.diff(sp))
        key = sown * big + stair
        pos = np.searchsorted(key, owner * big + first, side="right") - sp[owner]
        lead = pos // tile
        last = np.zeros(nf, dtype=np.int64)
        has = fn > 0
        last[has] = stair[sp[1:][has] - 1]
        # rows beyond the staircase's end are all zero: they lead nowhere
        lead[first >= last[owner]] = np.iinfo(np.int64).max // 2
    b = np.minimum(lead, idx)
    b[b >= nfct[owner]] = -1
    return b.astype(np.int32), tile_ptr


# ----------------------------------------------------------------------------- cache

class _PatternCache:
    """Tile schedules by pattern key, least recently used out (bounded by records)."""

    def __init__(self, max_records: int = 8_000_000):
        self.max_records = max_records
        self._d: OrderedDict = OrderedDict()
        self._records = 0
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            s = self._d.get(key)
            if s is not None:
                self._d.move_to_end(key)
            return s

    def get_many(self, keys) -> list:
        """:meth:`get` of every key (None where absent), under one lock."""
        with self._lock:
            d = self._d
            out = [d.get(k) for k in keys]
            for k, s in zip(keys, out):
                if s is not None:
                    d.move_to_end(k)
            return out

    def put(self, key, s: TileSchedule) -> None:
        self.put_many([(key, s)])

    def put_many(self, items) -> None:
        """:meth:`put` of ``(key, schedule)`` pairs, under one lock."""
        with self._lock:
            d = self._d
            for key, s in items:
                if key not in d:
                    d[key] = s
                    self._records += int(s.launch_ptr[-1])
            while self._records > self.max_records and len(d) > 1:
                _, old = d.popitem(last=False)
                self._records -= int(old.launch_ptr[-1])

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._records = 0


_CACHE = _PatternCache()


def clear_cache() -> None:
    """Forget every cached tile schedule and what was read from the disk cache
    (tests, memory; the files stay)."""
    _CACHE.clear()
    cache.forget()


def check_tunables(bundle: int, granule: int) -> None:
    if not 2 <= bundle <= MAX_BUNDLE:
        raise ValueError(f"bundle must be in [2, {MAX_BUNDLE}], got {bundle}")
    if granule < 1:
        raise ValueError(f"granule must be >= 1, got {granule}")


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
    # one pattern at a time (tests, experiments): the disk cache is left to plans
    return tile_schedules([(np.asarray(buckets, dtype=np.int32), int(nct), int(nfct))],
                          bundle=bundle, pipelining=pipelining, granule=granule,
                          use_disk=False)[0]


def tile_schedules(patterns, *, bundle: int = DEFAULT_BUNDLE, pipelining: bool = True,
                   granule: int = DEFAULT_APPLY_GRANULE, use_disk: bool = True) -> list:
    """Tile schedules of many patterns; the uncached ones are computed together.

    Parameters
    ----------
    patterns : sequence of (buckets, nct, nfct)
        As the arguments of :func:`tile_schedule`.
    bundle, pipelining, granule
        As for :func:`tile_schedule`.
    use_disk : bool
        Look the patterns not cached in this process up in the disk cache
        (:class:`.cache.PatternStore`; off when ``$SCIPY_GPUQR_SCHEDULE_CACHE`` is
        ``off``) and add the ones simulated here to it.

    Returns
    -------
    list of TileSchedule
        One per pattern (equal patterns give the same object).
    """
    check_tunables(bundle, granule)
    keys = [(np.ascontiguousarray(b, dtype=np.int32).tobytes(), int(nct), int(nfct))
            for b, nct, nfct in patterns]
    return _schedules_of_keys(keys, (int(bundle), bool(pipelining), int(granule)), use_disk)


def _schedules_of_keys(keys, tun, use_disk: bool = True) -> list:
    """:func:`tile_schedules` of patterns given as keys ``(buckets as int32 bytes,
    nct, nfct)``; ``tun`` = ``(bundle, pipelining, granule)``."""
    out = _CACHE.get_many([k + tun for k in keys])
    todo: dict = {}
    for i, s in enumerate(out):
        if s is None:
            todo.setdefault(keys[i], []).append(i)
    if not todo:
        return out
    miss = list(todo)
    disk = cache.store(tun) if use_disk else None
    found = {}
    if disk is not None:                    # patterns simulated by an earlier process
        found = disk.lookup(miss, _schedules_of_rows)
        miss = [k for k in miss if k not in found]
    if miss:
        made = _simulate([(np.frombuffer(k[0], dtype=np.int32), k[1], k[2]) for k in miss],
                         *tun)
        found.update(zip(miss, made))
        if disk is not None:                # written off the caller's path
            cache.write_behind(disk.add, miss, made)
    _CACHE.put_many([(k + tun, s) for k, s in found.items()])
    for k, s in found.items():
        for i in todo[k]:
            out[i] = s
    return out


def _schedules_of_rows(cols: dict, entries) -> list:
    """TileSchedules of rows read back from the disk cache together (one RowBlock
    for them all; ``entries``: :func:`make_schedule`'s arguments after the block)."""
    block = RowBlock(cols)
    return [make_schedule(block, *e) for e in entries]


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, element-wise (uint64, wrapping)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def front_schedules(buckets, tile_ptr, nct, nfct, fronts, *, bundle: int = DEFAULT_BUNDLE,
                    pipelining: bool = True,
                    granule: int = DEFAULT_APPLY_GRANULE) -> list:
    """:func:`tile_schedules` of many fronts given as :func:`many_tile_buckets` makes them.

    Fronts of equal pattern are grouped by NumPy (a 64-bit hash of each
    front's buckets, every group then checked tile by tile against its first
    front), so only one pattern per group is keyed and looked up.

    Parameters
    ----------
    buckets, tile_ptr : ndarray
        From :func:`many_tile_buckets`.
    nct, nfct : ndarray of int (nf,)
        Column tiles and column tiles to factorize of every front.
    fronts : sequence of int
        The fronts wanted.
    bundle, pipelining, granule
        As for :func:`tile_schedule`.

    Returns
    -------
    list of TileSchedule
        One per front of ``fronts`` (equal patterns give the same object).
    """
    uniq, which = front_patterns(buckets, tile_ptr, nct, nfct, fronts, bundle=bundle,
                                 pipelining=pipelining, granule=granule)
    return [uniq[i] for i in which.tolist()]


def front_patterns(buckets, tile_ptr, nct, nfct, fronts, *, bundle: int = DEFAULT_BUNDLE,
                   pipelining: bool = True, granule: int = DEFAULT_APPLY_GRANULE):
    """:func:`front_schedules` as distinct schedules and each front's number.

    Returns
    -------
    uniq : list of TileSchedule
        The distinct schedules (no two the same object), in the order of
        their first front.
    which : ndarray of int64
        ``uniq[which[i]]`` is the schedule of ``fronts[i]``.
    """
    check_tunables(bundle, granule)
    keys, inv = _front_keys(buckets, tile_ptr, nct, nfct, fronts)
    if not keys:
        return [], inv
    got = _schedules_of_keys(keys, (int(bundle), bool(pipelining), int(granule)))
    num = {}
    remap = np.array([num.setdefault(id(s), len(num)) for s in got], dtype=np.int64)
    uniq = list({id(s): s for s in got}.values())
    return uniq, remap[inv]


def front_pattern_counts(buckets, tile_ptr, nct, nfct, fronts, *,
                         bundle: int = DEFAULT_BUNDLE, pipelining: bool = True,
                         granule: int = DEFAULT_APPLY_GRANULE):
    """VT tiles and records of each front's tile schedule, without its rows where
    they are only on disk.

    What the memory plan reads of the schedules (:func:`~scipy_gpuqr._engine.memory.vt_elements`):
    a schedule made in this process gives its counts; one an earlier process
    simulated gives the counts kept with its key on disk
    (:meth:`.cache.PatternStore.counts`; the keys part is CRC-checked when
    read), so a new process's first call of a known pattern, whose plan is on
    disk too, reads no rows; the others are simulated (:func:`front_patterns`).

    Returns
    -------
    nvt, nrec : ndarray of int64
        Per distinct pattern: VT tiles (``TileSchedule.nvt``) and Factorize /
        Apply records (``launch_ptr[-1]``).
    which : ndarray of int64
        The pattern of each front of ``fronts``.
    """
    check_tunables(bundle, granule)
    keys, inv = _front_keys(buckets, tile_ptr, nct, nfct, fronts)
    tun = (int(bundle), bool(pipelining), int(granule))
    nvt = np.zeros(len(keys), dtype=np.int64)
    nrec = np.zeros(len(keys), dtype=np.int64)
    miss = []
    for i, s in enumerate(_CACHE.get_many([k + tun for k in keys])):
        if s is None:
            miss.append(i)
        else:
            nvt[i], nrec[i] = _counts(s)
    disk = cache.store(tun) if miss else None
    got = disk.counts([keys[i] for i in miss]) if disk is not None else {}
    rest = [i for i in miss if keys[i] not in got]
    for i in miss:
        if keys[i] in got:
            nvt[i], nrec[i] = got[keys[i]]
    if rest:
        for i, s in zip(rest, _schedules_of_keys([keys[i] for i in rest], tun)):
            nvt[i], nrec[i] = _counts(s)
    return nvt, nrec, inv


def _counts(s) -> tuple:
    """``(nvt, records)`` of a TileSchedule."""
    return int(s.nvt), int(s.launch_ptr[-1]) if len(s.launch_ptr) else 0


def _front_keys(buckets, tile_ptr, nct, nfct, fronts):
    """The distinct pattern keys ``(buckets as int32 bytes, nct, nfct)`` of ``fronts``
    (in the order of their first front) and each front's number among them.

    Fronts of equal pattern are grouped by NumPy (a 64-bit hash of each
    front's buckets, every group then checked tile by tile against its first
    front; a collision keys every front)."""
    fronts = np.asarray(fronts, dtype=np.int64)
    n = len(fronts)
    if n == 0:
        return [], np.zeros(0, dtype=np.int64)
    tile_ptr = np.asarray(tile_ptr, dtype=np.int64)
    nrt = tile_ptr[fronts + 1] - tile_ptr[fronts]
    seg = _excl_cumsum(nrt)
    start = np.repeat(tile_ptr[fronts], nrt)
    pos = np.arange(int(seg[-1]), dtype=np.int64) - np.repeat(seg[:-1], nrt)
    val = buckets[start + pos].astype(np.int64)
    u = _mix64((pos.astype(np.uint64) << np.uint64(32)) + (val + 2).astype(np.uint64))
    cs = np.zeros(len(u) + 1, dtype=np.uint64)
    np.cumsum(u, out=cs[1:])
    h = cs[seg[1:]] - cs[seg[:-1]]
    fnct = np.asarray(nct, dtype=np.int64)[fronts]
    fnfct = np.asarray(nfct, dtype=np.int64)[fronts]
    for x in (nrt, fnct, fnfct):
        h = _mix64(h ^ x.astype(np.uint64))
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.ravel()
    rep = first[inv]                              # first front of each one's group
    same = ((nrt[rep] == nrt) & (fnct[rep] == fnct) & (fnfct[rep] == fnfct)).all()
    if same:
        same = np.array_equal(buckets[np.repeat(tile_ptr[fronts[rep]], nrt) + pos], val)
    if not same:                                  # a hash collision: key every front
        first, inv = np.arange(n), np.arange(n)
    # groups in the order of their first front
    o = np.argsort(first, kind="stable")
    rank = np.empty(len(o), dtype=np.int64)
    rank[o] = np.arange(len(o))
    first, inv = first[o], rank[inv]
    fr = fronts[first]
    a = (tile_ptr[fr] * 4).tolist()
    e = (tile_ptr[fr + 1] * 4).tolist()
    raw = np.ascontiguousarray(buckets, dtype=np.int32).tobytes()
    keys = [(raw[x:y], c, d) for x, y, c, d in
            zip(a, e, fnct[first].tolist(), fnfct[first].tolist())]
    return keys, inv


# ------------------------------------------------------------------- the simulation

def _excl_cumsum(x):
    out = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out


def _simulate(patterns, bundle: int, pipelining: bool, granule: int) -> list:
    """Run the bucket rules for all patterns; one TileSchedule each.

    Compiled (:mod:`.native`, pattern by pattern) when it can be had and
    ``$SCIPY_GPUQR_SCHEDULE_SIM`` allows it, else :func:`_simulate_numpy`; both
    give the same rows byte for byte.
    """
    h = native.handle()
    if h is not None:
        got = native.simulate(h, patterns, bundle, pipelining, granule)
        if got is not None:
            return _schedules_of_native(got, [int(p[1]) for p in patterns], granule)
    return _simulate_numpy(patterns, bundle, pipelining, granule)


def _schedules_of_native(got, nct, granule: int) -> list:
    """TileSchedules of :func:`.native.simulate`'s arrays (one RowBlock for all)."""
    cols, rows, rp, lp, info = got
    for v in (cols, rows, rp, lp):
        v.flags.writeable = False
    c = {k: cols[i] for i, k in enumerate(native.COLS)}
    c["rows"] = rows
    block = RowBlock(c)
    nl, nvt, a, e = (info.T.tolist() if len(info) else ([], [], [], []))
    ep = _excl_cumsum(info[:, 0] + 1).tolist()
    return [make_schedule(block, (a[j], e[j]), rp[ep[j]:ep[j + 1]], lp[ep[j]:ep[j + 1]],
                          nl[j], nvt[j], granule, nct[j]) for j in range(len(nct))]


def _simulate_numpy(patterns, bundle: int, pipelining: bool, granule: int) -> list:
    """Run the bucket rules for all patterns at once (lock step, NumPy); one
    TileSchedule each."""
    P = len(patterns)
    nrt = np.array([len(p[0]) for p in patterns], dtype=np.int64)
    nct = np.array([p[1] for p in patterns], dtype=np.int64)
    nfct = np.array([p[2] for p in patterns], dtype=np.int64)
    tptr = _excl_cumsum(nrt)
    NT = int(tptr[-1])
    bptr = _excl_cumsum(nfct)
    NB = int(bptr[-1])
    p_of_tile = np.repeat(np.arange(P), nrt)
    p_of_b = np.repeat(np.arange(P), nfct)
    bloc = np.arange(NB, dtype=np.int64) - bptr[p_of_b]
    diag = tptr[p_of_b] + bloc                    # the diagonal tile of every bucket
    last_b = bloc == nfct[p_of_b] - 1
    b0 = np.concatenate([p[0] for p in patterns]).astype(np.int64) if P else np.zeros(0, np.int64)
    gbk = np.where(b0 >= 0, bptr[p_of_tile] + b0, -1)   # current (global) bucket, -1 none
    tri = np.zeros(NT, dtype=bool)                 # upper triangular in its bucket
    # A bucket's idle tiles are the tiles that became idle this launch (``due``:
    # tops of the launch before, and without pipelining the tiles advanced two
    # launches before) plus at most one tile left over from earlier launches
    # (``park``: a lone tile that is not a diagonal tile still to factorize; it
    # stays untouched until something else reaches its bucket). Each launch works
    # only on the buckets reached (compact bucket numbers), not on all of them.
    park = np.full(NB, -1, dtype=np.int64)
    reach = np.zeros(NB, dtype=bool)
    cnum = np.zeros(NB, dtype=np.int64)
    due = {0: [np.flatnonzero(gbk >= 0)]}
    # Apply+Factorize groups arriving next launch (sorted by bucket, then creation)
    ng = 0
    g_gb = g_rest = g_nrest = g_src = None      # set at the end of a launch with groups
    steps = []
    nb_done = 0
    t = 0
    while True:
        fresh = due.pop(t, None)
        if fresh is None and not ng:
            if not due:
                break
            t += 1
            continue
        fresh = np.concatenate(fresh) if fresh else np.zeros(0, np.int64)
        fb = gbk[fresh]
        # buckets reached, sorted (a mark per bucket: cheaper than np.unique), and
        # their compact numbers
        reach[fb] = True
        if ng:
            reach[g_gb] = True
        A = np.flatnonzero(reach)
        reach[A] = False
        nA = len(A)
        cnum[A] = np.arange(nA)
        pk = park[A]
        park[A] = -1
        pk = pk[pk >= 0]
        if len(pk):
            idle = np.concatenate([fresh, pk])
            gi = gbk[idle]
        else:
            idle, gi = fresh, fb
        o = np.argsort(gi * NT + idle)
        idle = idle[o]
        ib = cnum[gi[o]]                           # compact bucket of each idle tile
        nidle = np.bincount(ib, minlength=nA)
        r = np.arange(len(idle)) - (np.cumsum(nidle) - nidle)[ib]
        if ng:
            gc = cnum[g_gb]
            cap = bundle - g_nrest
            Cb = np.bincount(gc, weights=cap, minlength=nA).astype(np.int64)
            ngr = np.bincount(gc, minlength=nA)
            gce = np.cumsum(cap)
            to_g = r < Cb[ib]
            d_tile = idle[to_g]
            d_grp = np.searchsorted(gce, (np.cumsum(Cb) - Cb)[ib[to_g]] + r[to_g], side="right")
            rem = ~to_g
            c_tile, c_b = idle[rem], ib[rem]
            r2 = r[rem] - Cb[c_b]
            nrem = np.maximum(nidle - Cb, 0)
        else:
            c_tile, c_b, r2, nrem = idle, ib, r, nidle
        # the other idle tiles: near-equal chunks (or the lone diagonal tile)
        nr_c = nrem[c_b]
        lone = nr_c == 1
        lt, lb = c_tile[lone], c_b[lone]
        ok = (lt == diag[A[lb]]) & ~tri[lt]
        nck = np.where(nrem >= 2, -(-nrem // bundle), 0)
        nck[lb[ok]] = 1
        keep = ~lone
        keep[lone] = ok
        left = lt[~ok]
        park[gbk[left]] = left
        c_tile, c_b, r2, nr_c = c_tile[keep], c_b[keep], r2[keep], nr_c[keep]
        kk = -(-nr_c // bundle)
        base = nr_c // kk
        extra = nr_c - base * kk
        thr = extra * (base + 1)
        q = np.where(r2 < thr, r2 // (base + 1), extra + (r2 - thr) // base)
        # bundle numbers of this launch: per bucket its groups, then its chunks
        nbb = nck + ngr if ng else nck
        cs = np.cumsum(nbb)
        nbs = int(cs[-1]) if nA else 0
        if nbs == 0:
            t += 1
            continue
        bb = cs - nbb
        B_gb = np.empty(nbs, dtype=np.int64)
        if ng:
            g_id = bb[gc] + (np.arange(ng) - (np.cumsum(ngr) - ngr)[gc])
            c_id = bb[c_b] + ngr[c_b] + q
            B_gb[g_id] = g_gb
            rm = g_rest >= 0
            m_b = np.concatenate([np.repeat(g_id, g_nrest), g_id[d_grp], c_id])
            m_t = np.concatenate([g_rest[rm], d_tile, c_tile])
            o = np.argsort(m_b * NT + m_t)
            m_b, m_t = m_b[o], m_t[o]
        else:
            c_id = bb[c_b] + q
            m_b, m_t = c_id, c_tile          # already in (bundle, tile) order
        B_gb[c_id] = A[c_b]
        nmem = np.bincount(m_b, minlength=nbs)
        pos = np.arange(len(m_b)) - (np.cumsum(nmem) - nmem)[m_b]
        tiles = np.full((nbs, bundle), -1, dtype=np.int64)
        tiles[m_b, pos] = m_t
        trim = tri[tiles] & (tiles >= 0)
        steps.append((t, B_gb, nmem, tiles, trim,
                      (g_id + nb_done) if ng else None, g_src if ng else None))
        # state: tops stay (upper triangular), the others advance
        top = tiles[:, 0]
        tri[m_t] = False
        tri[top] = True
        due.setdefault(t + 1, []).append(top)
        adv = pos > 0
        mv_t = m_t[adv]
        mv_b = B_gb[m_b[adv]] + 1
        fin = last_b[mv_b - 1]
        gbk[mv_t] = np.where(fin, -1, mv_b)
        if not pipelining:
            due.setdefault(t + 2, []).append(mv_t[~fin])
        # groups of the next launch
        if pipelining:
            ids = np.flatnonzero((nmem >= 2) & ~last_b[B_gb])
            ng = len(ids)
            g_gb = B_gb[ids] + 1
            g_rest = tiles[ids, 1:]
            g_nrest = nmem[ids] - 1
            g_src = nb_done + ids
        nb_done += nbs
        t += 1
    _check_final(gbk, tri, diag, NB)
    return _records(steps, P, tptr, p_of_b, bloc, nct, nfct, bundle, pipelining, granule)


def _check_final(gbk, tri, diag, NB):
    left = gbk >= 0
    cnt = np.bincount(gbk[left], minlength=NB)
    if np.any(cnt != 1) or np.any(gbk[diag] != np.arange(NB)) or not np.all(tri[diag]):
        raise AssertionError("bucket scheduler: a bucket did not end with its "  # pragma: no cover
                             "upper triangular diagonal tile")


def _records(steps, P, tptr, p_of_b, bloc, nct, nfct, bundle, pipelining, granule):
    """Rows of all bundles, per pattern, in launch order (no sort of rows)."""
    if not steps:
        return [_empty_schedule(granule, int(nct[j])) for j in range(P)]
    tb = np.concatenate([np.full(len(s[1]), s[0], dtype=np.int64) for s in steps])
    gb, n, tiles, trim = (np.concatenate([s[k] for s in steps]) for k in range(1, 5))
    nb = len(gb)
    is_af = np.zeros(nb, dtype=bool)
    src = np.full(nb, -1, dtype=np.int64)
    af = [s for s in steps if s[5] is not None]
    if af:
        ids = np.concatenate([s[5] for s in af])
        is_af[ids] = True
        src[ids] = np.concatenate([s[6] for s in af])
    W = np.arange(bundle)
    # Factorize: the bundle's tiles; Apply+Factorize: the source bundle (its Apply
    # part), then the delta tiles taken in this bucket (upper triangular ones flagged)
    rows = np.full((nb, MAX_SLOTS), -1, dtype=np.int64)
    rows[:, :bundle] = tiles
    flags = trim.astype(np.int64) @ (1 << W)
    ftop = np.zeros(nb, dtype=np.int64)
    napply = np.zeros(nb, dtype=np.int64)
    x = np.flatnonzero(is_af)
    if len(x):
        st_ = np.take(tiles, src[x], axis=0)
        s_n = n[src[x]]
        tx = np.take(tiles, x, axis=0)
        valid = tx >= 0
        isrest = np.zeros(tx.shape, dtype=bool)
        for c in range(1, bundle):          # the source's rest (its slots 1 …)
            sc = st_[:, c:c + 1]
            isrest |= (tx == sc) & (sc >= 0)
        delta = valid & ~isrest
        d_rank = np.cumsum(delta, axis=1) - 1
        rx = np.full((len(x), MAX_SLOTS), -1, dtype=np.int64)
        rx[:, :bundle] = st_
        i, j = np.nonzero(delta)
        slot = s_n[i] + d_rank[i, j]
        rx[i, slot] = tx[i, j]
        rows[x] = rx
        tr = np.take(trim, x, axis=0)[i, j]
        flags[x] = np.bincount(i[tr], weights=1 << slot[tr], minlength=len(x)).astype(np.int64)
        ftop[x] = np.where(isrest[:, 0], 1, s_n)
        napply[x] = s_n
    p = p_of_b[gb]
    b = bloc[gb]
    # tile numbers local to each pattern
    tiles = np.where(tiles >= 0, tiles - tptr[p][:, None], -1)
    rows = np.where(rows >= 0, rows - tptr[p][:, None], -1)
    # bundles in (pattern, launch, creation) order; VT numbers per pattern
    order = np.argsort(p, kind="stable")
    inv = np.empty(nb, dtype=np.int64)
    inv[order] = np.arange(nb)
    p_cnt = np.bincount(p, minlength=P)
    p_start = _excl_cumsum(p_cnt)
    vt = inv - p_start[p]
    ngran = np.maximum(-(-(nct[p] - b - 1) // granule), 0)
    af_next = (n >= 2) & (b + 1 < nfct[p]) if pipelining else np.zeros(nb, dtype=bool)
    napp = ngran - af_next
    run = napp > 0
    # launch slots (pattern, launch): Factorize / A+F rows of bundles made at
    # that launch, then the Apply runs of bundles made one launch before
    last = np.where(run, tb + 1, tb)
    nl = np.zeros(P, dtype=np.int64)
    np.maximum.at(nl, p, last + 1)
    lptr = _excl_cumsum(nl)
    nslot = int(lptr[-1])
    slot = lptr[p] + tb
    n_fa = np.bincount(slot, minlength=nslot)
    n_run = np.bincount(slot[run] + 1, minlength=nslot + 1)[:nslot]
    n_rec = n_fa + np.bincount(slot + 1, weights=napp, minlength=nslot + 1)[:nslot].astype(np.int64)
    sptr = _excl_cumsum(n_fa + n_run)
    NR = int(sptr[-1])
    # rank of each bundle among the bundles of its (pattern, launch), and the
    # runs before it, in (pattern, launch, creation) order
    slot_o = slot[order]
    first_o = _excl_cumsum(np.bincount(slot_o, minlength=nslot))[slot_o]
    rank = np.empty(nb, dtype=np.int64)
    rank[order] = np.arange(nb) - first_o
    run_o = run[order].astype(np.int64)
    cr = np.cumsum(run_o) - run_o
    cum_run = np.empty(nb, dtype=np.int64)
    cum_run[order] = cr - cr[first_o]
    fa_pos = sptr[slot] + rank
    c = {k: np.zeros(NR, dtype=np.int32) for k in COLUMNS if k != "rows"}
    c["vt"][:] = -1
    c["vt2"][:] = -1
    c["mult"] = np.ones(NR, dtype=np.int32)
    rws = np.full((NR, MAX_SLOTS), -1, dtype=np.int32)
    # ---- Factorize and Apply+Factorize rows
    c["type"][fa_pos] = np.where(is_af, int(TaskType.APPLY_FACTORIZE), int(TaskType.FACTORIZE))
    c["col"][fa_pos] = np.where(is_af, b - 1, b)
    c["c0"][fa_pos] = np.where(is_af, b, 0)
    c["c1"][fa_pos] = np.where(is_af, np.minimum(b + granule, nct[p]), 0)
    c["napply"][fa_pos] = napply
    c["nfrows"][fa_pos] = n
    c["fstart"][fa_pos] = is_af
    c["flags"][fa_pos] = flags
    c["ftop"][fa_pos] = ftop
    c["vt"][fa_pos] = np.where(is_af, vt[np.maximum(src, 0)], vt)
    c["vt2"][fa_pos] = np.where(is_af, vt, -1)
    rws[fa_pos] = rows
    # ---- Apply runs: bundle x, granules af_next[x] … ngran[x]-1
    ax = np.flatnonzero(run)
    ap_pos = sptr[slot[ax] + 1] + n_fa[slot[ax] + 1] + cum_run[ax]
    c0 = b[ax] + 1 + af_next[ax] * granule
    c["type"][ap_pos] = int(TaskType.APPLY)
    c["col"][ap_pos] = b[ax]
    c["c0"][ap_pos] = c0
    c["c1"][ap_pos] = c0 + granule
    c["napply"][ap_pos] = n[ax]
    c["vt"][ap_pos] = vt[ax]
    c["mult"][ap_pos] = napp[ax]
    rws[ap_pos, :bundle] = tiles[ax]
    c["rows"] = rws
    rec_ptr = _excl_cumsum(n_rec)
    # every pattern's row and record pointers end to end (nl[j] + 1 entries each);
    # views of read-only arrays are read-only, so no per-pattern flag setting
    eptr = _excl_cumsum(nl + 1)
    rep = np.repeat(lptr[:-1], nl + 1)
    at = np.arange(int(eptr[-1]), dtype=np.int64) - np.repeat(eptr[:-1], nl + 1) + rep
    rp_all = sptr[at] - sptr[rep]
    lp_all = rec_ptr[at] - rec_ptr[rep]
    for v in (rp_all, lp_all, *c.values()):
        v.flags.writeable = False
    bounds = sptr[lptr].tolist()
    ep = eptr.tolist()
    nl_l, nvt_l, nct_l = nl.tolist(), p_cnt.tolist(), nct.tolist()
    block = RowBlock(c)
    return [make_schedule(block, (bounds[j], bounds[j + 1]), rp_all[ep[j]:ep[j + 1]],
                          lp_all[ep[j]:ep[j + 1]], nl_l[j], nvt_l[j], granule, nct_l[j])
            for j in range(P)]


def _empty_schedule(granule: int, nct: int) -> TileSchedule:
    rc = {k: np.zeros((0, MAX_SLOTS) if k == "rows" else 0, dtype=np.int32)
          for k in COLUMNS + ("mult",)}
    for v in rc.values():
        v.flags.writeable = False
    z = np.zeros(1, np.int64)
    z.flags.writeable = False
    return TileSchedule(RowBlock(rc), (0, 0), z, z, 0, 0, granule, nct)


# --------------------------------------------------------------- instantiation

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
    t = sched.rcols
    launch = np.repeat(np.arange(sched.nlaunch), np.diff(sched.row_ptr))
    fac = np.where(t["type"] == TaskType.FACTORIZE)[0]
    born = np.full(sched.nvt, -1, dtype=np.int64)
    born[t["vt"][fac]] = launch[fac]
    af = np.where(t["type"] == TaskType.APPLY_FACTORIZE)[0]
    born[t["vt2"][af]] = launch[af]
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
