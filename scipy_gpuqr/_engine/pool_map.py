"""A stage pool held only where its fronts are alive: which chunks, from when to when.

A stage's front pool (:attr:`~scipy_gpuqr._schedule.sparse.StageSchedule.foff`)
gives every front its own place, so the pool holds all of them at once, though
a front is alive only from the first launch that writes it (its S entries, its
children's Pack-Assemble) to the last one that reads it (its parent's
Pack-Assemble of its contribution block). A pool whose values go to the host
while the stage runs (:mod:`.gpu.pool_copy`) needs on the device only the
fronts alive: the pool keeps its address range and every offset, and device
memory backs it chunk by chunk (:mod:`.gpu.vmm` on a CUDA device), mapped
before the first launch that touches a chunk and unmapped once the last one
did and the pool's copy sent its fronts down (:mod:`.gpu.pool_mapper` runs
this). A problem whose one-stage pool exceeds the device, but whose alive
fronts do not, then runs as one stage: no stage boundaries, and subtrees that
run side by side keep doing so.

:func:`pool_map` reads the chunks' lifetimes from a stage's records;
:meth:`PoolMap.peak` counts the chunks mapped at once. Pure NumPy: the memory
plan (:mod:`.gpu.driver`) uses it before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._schedule.tasks import TaskType, factorizes, record_launches

__all__ = ["CHUNK_BYTES", "PoolMap", "front_lifetimes", "pool_map", "replay_parts",
           "part_elements"]

#: Bytes of one chunk of a mapped pool: a multiple of the CUDA virtual memory
#: granularity (2 MiB); fewer, larger chunks mean fewer map calls and a
#: coarser fit to the fronts alive.
CHUNK_BYTES = 32 << 20


@dataclass(frozen=True)
class PoolMap:
    """When each chunk of a stage's pool must be backed by device memory.

    Attributes
    ----------
    chunk : int
        Elements of a chunk (chunk ``k`` holds ``[k * chunk, (k + 1) * chunk)``).
    first : ndarray of int64
        Per chunk, the launch before which it is mapped (-1: no front lies in
        it, never mapped).
    last : ndarray of int64
        Per chunk, the last launch that writes or reads a front in it (or the
        launch after which the pool's copy may send one of them).
    nlaunch : int
        The stage's launches.
    itemsize : int
        Bytes of a value.
    cap : int or None
        Chunks that may be mapped at once (set by the memory plan; None: any).
    """

    chunk: int
    first: np.ndarray
    last: np.ndarray
    nlaunch: int
    itemsize: int
    cap: int | None = None

    @property
    def chunk_bytes(self) -> int:
        return int(self.chunk) * int(self.itemsize)

    @property
    def nchunks(self) -> int:
        return len(self.first)

    def live(self, lag: int = 0) -> np.ndarray:
        """Chunks mapped during each launch when each is unmapped ``lag``
        launches after its last (0: as soon as possible)."""
        n = int(self.nlaunch)
        use = self.first >= 0
        d = np.zeros(n + 2, dtype=np.int64)
        np.add.at(d, self.first[use], 1)
        np.add.at(d, np.minimum(self.last[use] + 1 + int(lag), n + 1), -1)
        return np.cumsum(d)[:n]

    def peak(self, lag: int = 0) -> int:
        """Most chunks mapped at once (:meth:`live`)."""
        live = self.live(lag)
        return int(live.max()) if len(live) else 0

    def peak_bytes(self, lag: int = 0) -> int:
        return self.peak(lag) * self.chunk_bytes


def front_lifetimes(fs, stage) -> tuple:
    """``(first, last)`` per front of the analysis (int64, -1 outside ``stage``):
    the first launch of the stage that touches the front and the last one.

    A record touches the front it names; a Pack-Assemble names the child it
    reads and writes that child's parent; a dense front is factorized on a
    side stream until the launch that joins it (:attr:`dense_join`, the
    stage's last launch when later). The launch after which the pool's copy
    may send a front (:func:`~.gpu.pool_copy.front_finality`: 0 for a front
    no launch writes) lies inside too.
    """
    nf = int(fs.nfronts)
    nl = int(stage.nlaunch)
    lo = np.full(nf, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(nf, -1, dtype=np.int64)
    a, b = (int(x) for x in stage.fronts)
    t = stage.tasks
    if len(t):
        launch = record_launches(stage.launch_ptr)
        front = t["front"].astype(np.int64)
        ok = front >= 0
        np.minimum.at(lo, front[ok], launch[ok])
        np.maximum.at(hi, front[ok], launch[ok])
        pk = ok & (t["type"] == int(TaskType.PACK_ASSEMBLE))
        par = np.asarray(fs.parent, dtype=np.int64)[front[pk]]
        has = par >= 0
        np.minimum.at(lo, par[has], launch[pk][has])
        np.maximum.at(hi, par[has], launch[pk][has])
    joins = getattr(stage, "dense_join", {})
    for f, ld in getattr(stage, "dense", {}).items():
        hi[f] = max(hi[f], min(int(joins.get(f, ld + 1)), max(nl - 1, 0)))
    members = np.zeros(nf, dtype=bool)
    members[a:b + 1] = True
    # a front no launch writes is sent at launch 0 (its finality)
    none = members & (hi < 0)
    lo[none] = 0
    hi[none] = 0
    lo[~members] = -1
    hi[~members] = -1
    lo[members] = np.minimum(lo[members], np.maximum(hi[members], 0))
    return lo, hi


def pool_map(fs, stage, itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> PoolMap:
    """The :class:`PoolMap` of ``stage`` (materialized: its records known) in
    chunks of ``chunk_bytes``.

    Raises
    ------
    ValueError
        ``chunk_bytes`` is not a positive multiple of ``itemsize``, or the stage
        holds carried contribution blocks (written before its first launch:
        only a stage without them is mapped).
    """
    isz = int(itemsize)
    if chunk_bytes <= 0 or chunk_bytes % isz:
        raise ValueError(f"chunk of {chunk_bytes} bytes for values of {isz}")
    if getattr(stage, "carried", None):
        raise ValueError("a stage with carried contribution blocks is not mapped")
    c = int(chunk_bytes) // isz
    a, b = (int(x) for x in stage.fronts)
    lo, hi = front_lifetimes(fs, stage)
    f = np.arange(a, b + 1, dtype=np.int64)
    off = np.asarray(stage.foff, dtype=np.int64)[f]
    size = fs.fm[f].astype(np.int64) * fs.fn[f].astype(np.int64)
    keep = (off >= 0) & (size > 0)
    f, off, size = f[keep], off[keep], size[keep]
    n = -(-int(stage.pool_size) // c)
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    k0, k1 = off // c, (off + size - 1) // c
    cnt = k1 - k0 + 1
    ks = np.repeat(k0, cnt) + (np.arange(int(cnt.sum()), dtype=np.int64)
                               - np.repeat(np.cumsum(cnt) - cnt, cnt))
    np.minimum.at(first, ks, np.repeat(lo[f], cnt))
    np.maximum.at(last, ks, np.repeat(hi[f], cnt))
    first[last < 0] = -1
    if n:
        # the pool's first element is the address the uberkernel's guarded
        # asynchronous copies name for an element out of a front (0 bytes
        # read): its chunk stays mapped for the whole stage
        first[0], last[0] = 0, max(int(stage.nlaunch) - 1, 0)
    return PoolMap(c, first, last, int(stage.nlaunch), isz)


def _reflector_needs(fs, stage, tile: int, small: int) -> tuple:
    """``(need, lo, hi, offset, whole)`` per front with kept records (Factorize,
    Apply+Factorize) in ``stage``: the elements its reflectors take in an upload
    (rows times reflector columns rounded up to ``tile``; a front of at most
    ``small`` elements, or whose reflectors span it, whole), the first and last
    launch of those records, its place in the pool and whether it goes whole."""
    nl = int(stage.nlaunch)
    t = stage.tasks
    launch = record_launches(stage.launch_ptr)
    kk = factorizes(t["type"]) & (t["front"] >= 0)
    front = t["front"][kk].astype(np.int64)
    nf = int(fs.nfronts)
    lo = np.full(nf, nl, dtype=np.int64)
    hi = np.full(nf, -1, dtype=np.int64)
    np.minimum.at(lo, front, launch[kk])
    np.maximum.at(hi, front, launch[kk])
    f = np.flatnonzero(hi >= 0)
    fm, fn = fs.fm[f].astype(np.int64), fs.fn[f].astype(np.int64)
    width = np.minimum(fn, -(-fm // int(tile)) * int(tile))
    size = fm * fn
    whole = (width >= fn) | (size <= int(small))
    off = np.asarray(stage.foff, dtype=np.int64)[f]
    return np.where(whole, size, fm * width), lo[f], hi[f], off, whole


def part_elements(fs, stage, starts, tile: int, small: int) -> list:
    """Per part of ``Q``'s replay (``starts``: first launches, :func:`replay_parts`)
    the elements its upload takes at most: its fronts' reflectors and
    ``small`` for the gaps sent with fronts sent whole."""
    need, lo, hi, off, whole = _reflector_needs(fs, stage, tile, small)
    return _part_elements(need, lo, hi, off, whole, starts, int(stage.nlaunch), small)


def _part_elements(need, lo, hi, off, whole, starts, nl: int, small: int) -> list:
    """:func:`part_elements` of the fronts' :func:`_reflector_needs`: each
    part's fronts' needs, and the gaps of at most ``small`` elements between its
    fronts sent whole, which go up with them (as
    :func:`~.gpu.reflector_upload.packed_size_bound` counts a stage's)."""
    out = []
    for a, b in zip(starts, list(starts[1:]) + [nl]):
        sel = (lo < b) & (hi >= a)
        n = int(need[sel].sum())
        w = sel & whole
        if w.any():
            o = np.argsort(off[w], kind="stable")
            st_, sz = off[w][o], need[w][o]
            end = np.maximum.accumulate(st_ + sz)
            gap = st_[1:] - end[:-1]
            n += int(gap[(gap > 0) & (gap <= int(small))].sum())
        out.append(n)
    return out


def replay_parts(fs, stage, room: int, tile: int, small: int) -> list | None:
    """The first launches of the parts ``Q``'s replay reads a mapped stage in:
    each part's reflectors uploaded at once take at most ``room`` elements, and
    all parts together the fewest (each solve uploads every part).

    The replay's levels are the stage's launches in order; a part is a run of
    them, and its upload holds the reflector columns of every front with a
    kept record among its launches (:func:`part_elements`): a front whose
    records a cut splits goes up with both parts. With ``T`` all the fronts'
    needs, ``A[s]`` those of the fronts ending before launch ``s`` and
    ``B[e]`` those beginning at ``e`` or later, part ``[s, e)`` takes
    ``T - A[s] - B[e]``; the cheapest cuts come from one pass over the
    launches (``O(launches²)``, vectorized), then are made tighter where the
    gaps sent with whole fronts pass ``room`` (:data:`PART_ROUNDS`). None
    where one launch alone needs more than ``room``.
    """
    nl = int(stage.nlaunch)
    if nl == 0:
        return [0]
    need, lo, hi, off, whole = _reflector_needs(fs, stage, tile, small)
    # the gaps sent with whole fronts, each counted with the whole front before it
    proxy = need.copy()
    w = np.flatnonzero(whole)
    w = w[np.argsort(off[w], kind="stable")]
    if len(w) > 1:
        gap = off[w[1:]] - (off[w[:-1]] + need[w[:-1]])
        proxy[w[:-1]] += np.where((gap > 0) & (gap <= int(small)), gap, 0)
    room = int(room)
    cut = room
    for _ in range(PART_ROUNDS):
        starts = _cheapest_parts(proxy, lo, hi, nl, cut)
        if starts is None:
            return None
        exact = _part_elements(need, lo, hi, off, whole, starts, nl, small)
        over = max(exact) - room
        if over <= 0:
            return starts
        # a part's gaps passed the room: the next cuts leave it out
        k = int(np.argmax(exact))
        ends = list(starts[1:]) + [nl]
        sel = (lo < ends[k]) & (hi >= starts[k])
        cut = min(cut - over, int(proxy[sel].sum()) - 1)
    return None


#: Rounds of :func:`replay_parts` that tighten its cuts for the gaps sent with
#: fronts sent whole, at most.
PART_ROUNDS = 8


def _cheapest_parts(need, lo, hi, nl: int, room: int) -> list | None:
    """:func:`replay_parts`' cuts for the fronts' needs alone (no gaps)."""
    if room <= 0 or (len(need) and int(need.max()) > room):
        return None
    total = int(need.sum())
    ends_before = np.zeros(nl + 1, dtype=np.int64)     # A[s]: fronts with hi < s
    np.add.at(ends_before, np.minimum(hi + 1, nl), need)
    ends_before = np.cumsum(ends_before)
    begin_at = np.zeros(nl + 1, dtype=np.int64)        # B[e]: fronts with lo >= e
    np.add.at(begin_at, lo, need)
    begin_at = np.cumsum(begin_at[::-1])[::-1]
    big = np.iinfo(np.int64).max // 4
    best = np.full(nl + 1, big, dtype=np.int64)
    prev = np.zeros(nl + 1, dtype=np.int64)
    best[0] = 0
    for e in range(1, nl + 1):      # part [s, e) takes T - A[s] - B[e]
        cost = total - ends_before[:e] - int(begin_at[e])
        ok = (cost <= room) & (best[:e] < big)
        if not ok.any():
            return None
        tot = np.where(ok, best[:e] + cost, big)
        k = int(np.argmin(tot))
        best[e], prev[e] = tot[k], k
    starts, e = [], nl
    while e > 0:
        e = int(prev[e])
        starts.append(e)
    return starts[::-1]
