"""Pinned host memory for a multi-device call, sized from its plan and pinned
before its devices' threads start.

Pinning host memory (``cudaHostAlloc``) takes time in proportion to its size
and stalls every thread that calls CUDA meanwhile; done while the devices'
threads enqueue, it held all of them up. :class:`PinnedAhead` sizes what
those threads would pin (each layer's maps, each stage's S entries and
records, each device's R staging slots: :func:`pinned_needs`,
:func:`lane_needs`, bounded before the schedule by :func:`lane_bound`), pins
it in one block while the schedule is built and hands out slices; the
blocks are kept for later calls (:func:`kept_pinned_bytes`,
:func:`release_kept_pinned`), so a repeated call pins nothing, and one of
the same front structure does not copy its maps and S indices again.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np

from ..._schedule.pattern_cache import PerPattern
from ..._schedule.tasks import DEFAULT_APPLY_GRANULE, TASK_BYTES
from .. import memory
from .rcopy import PinnedStaging, StagingTurns

__all__ = ["PinnedAhead", "pinned_needs", "lane_needs", "lane_bound", "kept_pinned_bytes",
           "release_kept_pinned", "PATTERN_PARTS", "PINNED_ALIGN", "PINNED_BLOCK_CLASS",
           "PINNED_LANE_SLACK",
           "PINNED_KEEP_SHARE", "PINNED_KEEP_BLOCKS"]

#: Alignment (bytes) of every slice :class:`PinnedAhead` hands out.
PINNED_ALIGN = 512

#: Bytes a block of :class:`PinnedAhead` is rounded up to when newly pinned: a
#: later call whose plan moved a little (a new mapping) fits the kept block.
PINNED_BLOCK_CLASS = 64 << 20

#: Bytes of slack in each layer's lane of :class:`PinnedAhead` beyond what its
#: stages are sized to ask for.
PINNED_LANE_SLACK = 1 << 20

#: Share of the host's physical memory that the blocks :class:`PinnedAhead` keeps
#: between calls may hold, and how many blocks (the smallest are let go of first).
PINNED_KEEP_SHARE = 1 / 16
PINNED_KEEP_BLOCKS = 4


def _pinned_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` of pinned host memory (``uint8``) from CuPy's pinned pool."""
    import cupyx
    return cupyx.empty_pinned((max(int(nbytes), 1),), dtype=np.uint8)


def _align(nbytes: int) -> int:
    return -(-max(int(nbytes), 0) // PINNED_ALIGN) * PINNED_ALIGN


def _physical_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class _KeptBlocks:
    """Pinned blocks of earlier multi-device calls, lent to later ones.

    Pinning host memory (``cudaHostAlloc``) takes time in proportion to its
    size, and while it runs every device's thread of a call stalls; CuPy's
    pinned pool gives a block back only for a request of its exact size and is
    emptied by ``free_all_blocks``. The blocks are kept here between calls
    (at most :data:`PINNED_KEEP_BLOCKS` blocks and :data:`PINNED_KEEP_SHARE` of
    the physical memory): a later call, of any pattern, pins nothing where
    kept blocks are large enough.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._idle = []                 # blocks no call holds
        self._held = {}                 # id(idle block) -> what it holds (:class:`_Held`)

    def lend(self, nbytes: int, want=None) -> tuple:
        """``(block, newly pinned bytes, what it holds)``: the idle kept block of
        at least ``nbytes`` that holds ``want`` (a :class:`_Held`), else the
        smallest of them, else a new one (rounded up to
        :data:`PINNED_BLOCK_CLASS`; it holds nothing: None)."""
        nbytes = max(int(nbytes), 1)
        with self._lock:
            fit = [b for b in self._idle if b.size >= nbytes]
            if fit:
                same = [b for b in fit if want is not None
                        and want.same(self._held.get(id(b)))]
                block = min(same or fit, key=lambda b: b.size)
                self._idle = [b for b in self._idle if b is not block]
                return block, 0, self._held.pop(id(block), None)
        size = -(-nbytes // PINNED_BLOCK_CLASS) * PINNED_BLOCK_CLASS
        return _pinned_bytes(size), size, None

    def give_back(self, blocks, held=None) -> None:
        """Blocks no longer read or written by any device: kept for later calls,
        the smallest dropped while the kept ones pass their share. ``held``:
        block -> what it holds (:class:`_Held`), for the next call to find."""
        cap = PINNED_KEEP_SHARE * _physical_bytes()
        held = held or {}
        with self._lock:
            for b in blocks:
                self._idle.append(b)
                if held.get(id(b)) is not None:
                    self._held[id(b)] = held[id(b)]
            self._idle.sort(key=lambda b: b.size, reverse=True)
            while self._idle and (sum(b.size for b in self._idle) > cap
                                  or len(self._idle) > PINNED_KEEP_BLOCKS):
                self._held.pop(id(self._idle.pop()), None)

    def clear(self) -> None:
        """Drop every idle block (CuPy's pinned pool then holds them as free)."""
        with self._lock:
            self._idle = []
            self._held = {}

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return int(sum(b.size for b in self._idle))


_KEPT = _KeptBlocks()

#: The parts of the shared block that depend on the pattern alone (the maps and
#: the S entries' indices): a kept block that holds them for the same front
#: structure, at the same places, is not filled with them again.
PATTERN_PARTS = ("maps", "s_index")


class _Held:
    """What the pattern parts of a kept shared block hold: the front structure
    they were filled from (by identity, weakly: analyses of one pattern share
    it) and the shared part's layout (names, elements and dtypes, in order)."""

    def __init__(self, fronts, layout):
        self._fronts = weakref.ref(fronts)
        self.layout = tuple(layout)

    def same(self, other) -> bool:
        """Whether ``other`` (a :class:`_Held` or None) holds the same."""
        if other is None:
            return False
        f = self._fronts()
        return f is not None and f is other._fronts() and self.layout == other.layout


def kept_pinned_bytes() -> int:
    """Bytes of pinned host memory kept for later multi-device calls."""
    return _KEPT.kept_bytes


def release_kept_pinned() -> None:
    """Let go of the pinned blocks kept for later multi-device calls (CuPy's
    pinned pool holds them as free blocks afterwards: ``free_all_blocks`` frees
    them)."""
    _KEPT.clear()


def pinned_needs(analysis, plan, layers, dtype, r_slot: int, sched=None) -> dict:
    """What the devices' threads of a call pin, sized from the plan before they start.

    Parameters
    ----------
    analysis, plan : the call's analysis and device plan
    layers : list
        The device layers; a layer with a ``pinned_ahead`` attribute takes
        its pinned buffers from a lane of :class:`PinnedAhead` (its stages'
        records buffers, and a slice for an empty S upload), a CUDA layer
        also gets R's staging slots, which its stages' copiers share.
    dtype : numpy dtype of the values
    r_slot : int
        The R copiers' slot bytes.
    sched : Schedule, optional
        The call's schedule (its stages' records size the lanes); None: the
        lanes are left for :func:`lane_needs`.

    Returns
    -------
    dict
        ``shared``: ``(name, elements, dtype)`` filled once and read by every
        layer (the maps, the S entries' indices and values; empty where no
        layer takes from a lane); ``staging``: device (layer index) -> bytes of
        each of the two R slots its stages' copiers share in turn (the largest
        any of them fills: a stage's R bytes, at most ``r_slot``); ``lanes``:
        per layer the bytes of its lane (0: none; None
        without ``sched``).
    """
    fs = analysis.fronts
    isz = np.dtype(dtype).itemsize
    takers = [hasattr(layer, "pinned_ahead") for layer in layers]
    shared = []
    if any(takers):
        shared = [("maps", int(len(fs.rimap) + len(fs.rjmap)), np.dtype(np.int64)),
                  ("s_index", int(len(fs.s_index)), np.dtype(np.int64)),
                  ("s_value", int(len(fs.s_nz)), np.dtype(dtype))]
    fr = np.asarray(fs.frank, dtype=np.int64)
    fn = np.asarray(fs.fn, dtype=np.int64)
    rows = fr * fn - fr * (fr - 1) // 2          # R's entries of a front, at most
    staging = {}
    for sid, (first, last) in enumerate(plan.stages):
        k = int(plan.stage_device[sid])
        if k < len(layers) and takers[k] and getattr(layers[k], "cp", None) is not None:
            # one staging per device, its stages' copies in turn: the largest
            nr = int(rows[int(first): int(last) + 1].sum())
            staging[k] = max(staging.get(k, 0), _align(min(int(r_slot), max(nr, 1) * isz)))
    return {"shared": shared, "staging": staging,
            "lanes": None if sched is None else lane_needs(plan, sched, layers)}


def lane_needs(plan, sched, layers) -> list:
    """Per layer the bytes of its lane of :class:`PinnedAhead` (0 for a layer
    without ``pinned_ahead``): what :meth:`~.device.CupyDevice.begin_stage` pins
    for each of its stages (the records' buffer; a slice for each empty S
    upload), with :data:`PINNED_LANE_SLACK`."""
    lanes = [0] * len(layers)
    for sid, st in enumerate(sched.stages):
        k = int(plan.stage_device[sid])
        if k < len(layers) and hasattr(layers[k], "pinned_ahead"):
            lanes[k] += _align(max(int(st.ntasks), 1) * TASK_BYTES) + 2 * PINNED_ALIGN
    return [n + PINNED_LANE_SLACK + PINNED_ALIGN if hasattr(layer, "pinned_ahead") else 0
            for n, layer in zip(lanes, layers)]


#: :func:`lane_bound`'s answers by pattern, plan and tunables (a repeated call
#: would spend some 10 ms of its pinning worker on them: grid 64^3)
_BOUNDS = PerPattern(64, 1 << 20, lambda v: 8 * len(v) + 64)


def lane_bound(analysis, plan, layers, *, tile: int, bundle: int, pipelining: bool,
               dense=None) -> list:
    """Per layer a bound on its lane's bytes (:func:`lane_needs`) known before the
    schedule is built, from the memory plan's records per front (its tile
    records, S-Assemble chunks, its children's Pack-Assemble pieces and slack:
    :func:`~scipy_gpuqr._engine.memory.front_needs`), so that a first call
    pins the lanes with the shared part, while the schedule is built. The
    schedule's own sizes decide (a lane past the bound is pinned after it).
    Kept by pattern, plan and tunables for later calls.

    Parameters
    ----------
    analysis, plan, layers : as :func:`pinned_needs`
    tile, bundle, pipelining : the schedule's tunables
    dense : ndarray of bool, optional
        The schedule's dense fronts (no tile records).
    """
    key = ("lane_bound", tuple((int(a), int(b)) for a, b in plan.stages),
           tuple(int(d) for d in plan.stage_device),
           tuple(hasattr(layer, "pinned_ahead") for layer in layers),
           int(tile), int(bundle), bool(pipelining), int(PINNED_LANE_SLACK),
           () if dense is None else tuple(np.flatnonzero(dense).tolist()))
    got = _BOUNDS.get(analysis, key)
    if got is None:
        got = tuple(_lane_bound(analysis, plan, layers, tile, bundle, pipelining, dense))
        _BOUNDS.put(analysis, key, got)
    return list(got)


def _lane_bound(analysis, plan, layers, tile, bundle, pipelining, dense) -> list:
    vt = memory.vt_elements(analysis, tile=int(tile), bundle=int(bundle),
                            pipelining=bool(pipelining), granule=DEFAULT_APPLY_GRANULE,
                            dense=dense)
    records = memory.front_needs(analysis, 8, tile=int(tile), vt_elems=vt,
                                 dense=dense).records
    cum = np.concatenate(([0], np.cumsum(records, dtype=np.int64)))
    lanes = [0] * len(layers)
    for sid, (first, last) in enumerate(plan.stages):
        k = int(plan.stage_device[sid])
        if k < len(layers) and hasattr(layers[k], "pinned_ahead"):
            nb = int(cum[int(last) + 1] - cum[int(first)])
            lanes[k] += _align(max(nb, TASK_BYTES)) + 2 * PINNED_ALIGN
    return [n + PINNED_LANE_SLACK + PINNED_ALIGN if hasattr(layer, "pinned_ahead") else 0
            for n, layer in zip(lanes, layers)]


class PinnedAhead:
    """Pinned host memory of one multi-device call, allocated before its devices'
    threads start and handed out in slices while they run.

    Pinning memory while the devices' threads enqueue stalls every one of
    them for as long as the pinning takes (a stage's records and S buffers,
    each layer's maps, the R copiers' staging slots). Here they come from
    blocks lent by the process' kept blocks (:class:`_KeptBlocks`; pinned now
    where none is large enough): the shared part (the maps and the S
    entries, filled once and uploaded by every layer from where they lie;
    each device's R staging slots, which its stages' copiers take in turn;
    room for the lanes where ``needs`` has a ``lane_room``, bytes from
    :func:`lane_bound`) and the layers' lanes (each stage's records buffer,
    taken in the order its layer asks), cut from that room where the
    schedule's lanes fit it, else a block of their own (:meth:`make_lanes`).
    A first call thus pins one block, while the schedule is built. A request
    a lane cannot serve is pinned then and counted (:attr:`during_run`).

    Parameters
    ----------
    needs : dict
        :func:`pinned_needs` (and ``lane_room``, optional).
    fronts : FrontStructure, optional
        The analysis' fronts, whose maps and S indices a kept block may hold
        already (:attr:`held`).
    """

    def __init__(self, needs: dict, fronts=None):
        self.needs = needs
        #: what the shared part's pattern parts hold once filled (None: no front
        #: structure given, they are filled at every call)
        self.held = None if fronts is None else _Held(
            fronts, [(name, int(n), np.dtype(dt).str) for name, n, dt in needs["shared"]])
        #: the shared part's entries filled by this call (the others were in the
        #: kept block already)
        self.filled = []
        self._shared_block = None
        self._room = None               # the lanes' room in the shared block
        #: whether the lanes were cut from the shared block (no block of their own)
        self.lanes_in_shared = False
        self._lock = threading.Lock()
        self.blocks = []
        self._block_bytes = 0
        self.new_bytes = 0              # pinned by this call (not lent from kept blocks)
        self.seconds = 0.0              # pinning and filling
        self.during_run = {"allocations": 0, "bytes": 0}
        self.shared = {}
        self._stagings = {}             # device -> StagingTurns
        self._lanes = []
        self._span = []                 # (first, end) addresses of the shared part

    @property
    def shared_bytes(self) -> int:
        return int(sum(_align(n * dt.itemsize) for _, n, dt in self.needs["shared"]))

    @property
    def room_bytes(self) -> int:
        """Bytes of the shared block kept for the lanes (``needs['lane_room']``)."""
        return _align(self.needs.get("lane_room") or 0)

    @property
    def staging_bytes(self) -> int:
        return int(sum(2 * b for b in self.needs["staging"].values()))

    @property
    def lane_bytes(self) -> int:
        return int(sum(self.needs["lanes"] or ()))

    @property
    def nbytes(self) -> int:
        return int(sum(b.size for b in self.blocks))

    def _lend(self, nbytes, want=None):
        block, new, held = _KEPT.lend(nbytes, want)
        with self._lock:
            self.blocks.append(block)
            self._block_bytes += int(block.size)
            self.new_bytes += int(new)
        return block, held

    def make_shared(self, fill) -> None:
        """The shared part pinned (or lent) and filled: ``fill(name, out)`` writes
        each of ``needs['shared']`` into its pinned array, except the
        :data:`PATTERN_PARTS` a kept block holds already for the same front
        structure (:attr:`held`); the R stagings cut."""
        t0 = time.perf_counter()
        total = self.shared_bytes + self.staging_bytes + self.room_bytes
        if total:
            block, held = self._lend(total, self.held)
            kept = self.held is not None and self.held.same(held)
            self._shared_block = block
            pos = 0
            a0 = block.ctypes.data
            for name, n, dt in self.needs["shared"]:
                arr = block[pos: pos + n * dt.itemsize].view(dt)
                if not (kept and name in PATTERN_PARTS):
                    fill(name, arr)
                    self.filled.append(name)
                self.shared[name] = arr
                pos += _align(n * dt.itemsize)
            self._span = [(a0, a0 + pos)]
            for k, b in sorted(self.needs["staging"].items()):
                slots = [block[pos: pos + b], block[pos + b: pos + 2 * b]]
                self._stagings[k] = StagingTurns(PinnedStaging(b, slots=slots))
                pos += 2 * b
            if self.room_bytes:
                self._room = block[pos: pos + self.room_bytes]
        self.seconds += time.perf_counter() - t0

    def make_lanes(self, sizes, pin: bool = True) -> None:
        """The layers' lanes (``sizes``: :func:`lane_needs`) cut from the shared
        block's room for them where they fit it, else pinned (or lent); with
        ``pin`` False, lanes without memory (every request pinned then, and
        counted: the lanes would pass the pinned memory's cap)."""
        t0 = time.perf_counter()
        self.needs["lanes"] = [int(n) for n in sizes]
        total = sum(self.needs["lanes"])
        room, self._room = self._room, None
        if total and room is not None and total <= room.size:
            block = room
            self.lanes_in_shared = True
        else:
            block = self._lend(total)[0] if total and pin else None
        pos = 0
        self._lanes = []
        for n in self.needs["lanes"]:
            self._lanes.append(_Lane(self, block[pos: pos + n] if n and block is not None
                                     else None))
            pos += n
        self.seconds += time.perf_counter() - t0

    def lane(self, k):
        """Layer ``k``'s lane (``take``, ``holds``), or None where it has none."""
        if k >= len(self._lanes) or not self.needs["lanes"][k]:
            return None
        return self._lanes[k]

    def holds(self, arr) -> bool:
        """Whether ``arr`` lies in the shared part (pinned and filled ahead)."""
        a = arr.ctypes.data
        return any(lo <= a and a + arr.nbytes <= hi for lo, hi in self._span)

    def staging(self, k):
        """The next turn at device ``k``'s R staging (:meth:`StagingTurns.turn`:
        its stages' copiers, opened in stage order on its thread, fill the
        slots one after another); None where none was made ahead."""
        st = self._stagings.get(k)
        return None if st is None else st.turn()

    def missed(self, nbytes: int) -> None:
        with self._lock:
            self.during_run["allocations"] += 1
            self.during_run["bytes"] += int(nbytes)

    def give_back(self) -> None:
        """The blocks back to the kept ones (every device done with them); the
        shared block with what its pattern parts hold."""
        blocks, self.blocks = self.blocks, []
        held = {}
        if self._shared_block is not None and self.held is not None and self.shared:
            held[id(self._shared_block)] = self.held
        self._stagings, self._lanes, self.shared, self._span = {}, [], {}, []
        self._shared_block = self._room = None
        if blocks:
            _KEPT.give_back(blocks, held)

    def drop(self) -> None:
        """The blocks let go of (a device may still use them: never lent again)."""
        self.blocks = []
        self._stagings, self._lanes, self.shared, self._span = {}, [], {}, []
        self._shared_block = self._room = None

    def info(self) -> dict:
        """``info["pinned_ahead"]``: bytes served from memory pinned before the
        devices' threads started (the shared part, the stagings, the lanes),
        the blocks' bytes and of them those pinned by this call (0: all lent
        from kept blocks), whether the lanes were cut from the shared block
        (``lanes_in_shared``), seconds pinning and filling, the shared part's
        entries filled by this call (``filled``: not the pattern parts a kept
        block held already), and the pinned
        allocations still made while the devices ran (``during_run``)."""
        lanes = [int(x) for x in (self.needs["lanes"] or ())]
        laned = any(x.block is not None for x in self._lanes) if self._lanes else False
        return {"bytes": int(self.shared_bytes + self.staging_bytes
                             + (sum(lanes) if laned else 0)),
                "block_bytes": int(self._block_bytes), "pinned_now_bytes": int(self.new_bytes),
                "shared_bytes": self.shared_bytes, "staging_bytes": self.staging_bytes,
                "lane_bytes": lanes if laned else [0] * len(lanes),
                "seconds": float(self.seconds),
                "filled": list(self.filled),
                "lanes_in_shared": bool(self.lanes_in_shared and laned),
                "during_run": dict(self.during_run)}


class _Lane:
    """One layer's slices of :class:`PinnedAhead`, taken in the order it asks
    (its thread alone takes from it)."""

    def __init__(self, ahead, block):
        self.ahead, self.block, self.pos = ahead, block, 0

    def take(self, n: int, dtype) -> np.ndarray:
        """``n`` elements of ``dtype``: the lane's next slice, or pinned now (counted)."""
        dt = np.dtype(dtype)
        nbytes = max(int(n), 1) * dt.itemsize
        end = self.pos + _align(nbytes)
        if self.block is not None and end <= self.block.size:
            out = self.block[self.pos: self.pos + nbytes].view(dt)
            self.pos = end
            return out
        self.ahead.missed(nbytes)
        return _pinned_bytes(nbytes)[:nbytes].view(dt)

    def holds(self, arr) -> bool:
        return self.ahead.holds(arr)
