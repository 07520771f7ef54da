"""Pinned host memory for a multi-device call, sized from its plan and pinned
before its devices' threads start.

Pinning host memory (``cudaHostAlloc``) takes time in proportion to its size
and stalls every thread that calls CUDA meanwhile; done while the devices'
threads enqueue, it held all of them up. :class:`PinnedAhead` sizes what
those threads would pin (each layer's maps, each stage's S entries and
records, R's staging slots: :func:`pinned_needs`, :func:`lane_needs`), pins
it in a few blocks and hands out slices; the blocks are kept for later calls
(:func:`kept_pinned_bytes`, :func:`release_kept_pinned`), so a repeated call
pins nothing.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from ..._schedule.tasks import TASK_BYTES
from .rcopy import PinnedStaging

__all__ = ["PinnedAhead", "pinned_needs", "lane_needs", "kept_pinned_bytes",
           "release_kept_pinned", "PINNED_ALIGN", "PINNED_BLOCK_CLASS", "PINNED_LANE_SLACK",
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

    def lend(self, nbytes: int) -> tuple:
        """``(block, newly pinned bytes)``: the smallest idle kept block of at least
        ``nbytes``, else a new one (rounded up to :data:`PINNED_BLOCK_CLASS`)."""
        nbytes = max(int(nbytes), 1)
        with self._lock:
            fit = [b for b in self._idle if b.size >= nbytes]
            if fit:
                block = min(fit, key=lambda b: b.size)
                self._idle = [b for b in self._idle if b is not block]
                return block, 0
        size = -(-nbytes // PINNED_BLOCK_CLASS) * PINNED_BLOCK_CLASS
        return _pinned_bytes(size), size

    def give_back(self, blocks) -> None:
        """Blocks no longer read or written by any device: kept for later calls,
        the smallest dropped while the kept ones pass their share."""
        cap = PINNED_KEEP_SHARE * _physical_bytes()
        with self._lock:
            self._idle.extend(blocks)
            self._idle.sort(key=lambda b: b.size, reverse=True)
            while self._idle and (sum(b.size for b in self._idle) > cap
                                  or len(self._idle) > PINNED_KEEP_BLOCKS):
                self._idle.pop()

    def clear(self) -> None:
        """Drop every idle block (CuPy's pinned pool then holds them as free)."""
        with self._lock:
            self._idle = []

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return int(sum(b.size for b in self._idle))


_KEPT = _KeptBlocks()


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
        records buffers, and a slice for an empty S upload), a CUDA layer's
        stages also get R's staging slots.
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
        layer takes from a lane); ``staging``: stage -> bytes of each of its two
        R slots; ``lanes``: per layer the bytes of its lane (0: none; None
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
            nr = int(rows[int(first): int(last) + 1].sum())
            staging[sid] = _align(min(int(r_slot), max(nr, 1) * isz))
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


class PinnedAhead:
    """Pinned host memory of one multi-device call, allocated before its devices'
    threads start and handed out in slices while they run.

    Pinning memory while the devices' threads enqueue stalls every one of
    them for as long as the pinning takes (a stage's records and S buffers,
    each layer's maps, the R copiers' staging slots). Here they come from at
    most two blocks lent by the
    process' kept blocks (:class:`_KeptBlocks`; pinned now where none is
    large enough): the shared part (the maps and the S entries, filled once
    and uploaded by every layer from where they lie, and the stages' R
    staging slots) and the layers' lanes (each stage's records buffer, taken
    in the order its layer asks). A request a lane cannot serve is pinned
    then and counted (:attr:`during_run`).

    Parameters
    ----------
    needs : dict
        :func:`pinned_needs`.
    """

    def __init__(self, needs: dict):
        self.needs = needs
        self._lock = threading.Lock()
        self.blocks = []
        self._block_bytes = 0
        self.new_bytes = 0              # pinned by this call (not lent from kept blocks)
        self.seconds = 0.0              # pinning and filling
        self.during_run = {"allocations": 0, "bytes": 0}
        self.shared = {}
        self._stagings = {}
        self._lanes = []
        self._span = []                 # (first, end) addresses of the shared part

    @property
    def shared_bytes(self) -> int:
        return int(sum(_align(n * dt.itemsize) for _, n, dt in self.needs["shared"]))

    @property
    def staging_bytes(self) -> int:
        return int(sum(2 * b for b in self.needs["staging"].values()))

    @property
    def lane_bytes(self) -> int:
        return int(sum(self.needs["lanes"] or ()))

    @property
    def nbytes(self) -> int:
        return int(sum(b.size for b in self.blocks))

    def _lend(self, nbytes):
        block, new = _KEPT.lend(nbytes)
        with self._lock:
            self.blocks.append(block)
            self._block_bytes += int(block.size)
            self.new_bytes += int(new)
        return block

    def make_shared(self, fill) -> None:
        """The shared part pinned (or lent) and filled: ``fill(name, out)`` writes
        each of ``needs['shared']`` into its pinned array; the R stagings cut."""
        t0 = time.perf_counter()
        total = self.shared_bytes + self.staging_bytes
        if total:
            block = self._lend(total)
            pos = 0
            a0 = block.ctypes.data
            for name, n, dt in self.needs["shared"]:
                arr = block[pos: pos + n * dt.itemsize].view(dt)
                fill(name, arr)
                self.shared[name] = arr
                pos += _align(n * dt.itemsize)
            self._span = [(a0, a0 + pos)]
            for sid, b in sorted(self.needs["staging"].items()):
                slots = [block[pos: pos + b], block[pos + b: pos + 2 * b]]
                self._stagings[sid] = PinnedStaging(b, slots=slots)
                pos += 2 * b
        self.seconds += time.perf_counter() - t0

    def make_lanes(self, sizes, pin: bool = True) -> None:
        """The layers' lanes (``sizes``: :func:`lane_needs`) pinned (or lent); with
        ``pin`` False, lanes without memory (every request pinned then, and
        counted: the lanes would pass the pinned memory's cap)."""
        t0 = time.perf_counter()
        self.needs["lanes"] = [int(n) for n in sizes]
        total = sum(self.needs["lanes"])
        block = self._lend(total) if total and pin else None
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

    def staging(self, sid):
        """Stage ``sid``'s R staging, locked for its copier; None where none was
        made ahead."""
        st = self._stagings.get(sid)
        if st is not None:
            st.lock.acquire()
        return st

    def missed(self, nbytes: int) -> None:
        with self._lock:
            self.during_run["allocations"] += 1
            self.during_run["bytes"] += int(nbytes)

    def give_back(self) -> None:
        """The blocks back to the kept ones (every device done with them)."""
        blocks, self.blocks = self.blocks, []
        self._stagings, self._lanes, self.shared, self._span = {}, [], {}, []
        if blocks:
            _KEPT.give_back(blocks)

    def drop(self) -> None:
        """The blocks let go of (a device may still use them: never lent again)."""
        self.blocks = []
        self._stagings, self._lanes, self.shared, self._span = {}, [], {}, []

    def info(self) -> dict:
        """``info["pinned_ahead"]``: bytes served from memory pinned before the
        devices' threads started (the shared part, the stagings, the lanes),
        the blocks' bytes and of them those pinned by this call (0: all lent
        from kept blocks), seconds pinning and filling, and the pinned
        allocations still made while the devices ran (``during_run``)."""
        lanes = [int(x) for x in (self.needs["lanes"] or ())]
        laned = any(x.block is not None for x in self._lanes) if self._lanes else False
        return {"bytes": int(self.shared_bytes + self.staging_bytes
                             + (sum(lanes) if laned else 0)),
                "block_bytes": int(self._block_bytes), "pinned_now_bytes": int(self.new_bytes),
                "shared_bytes": self.shared_bytes, "staging_bytes": self.staging_bytes,
                "lane_bytes": lanes if laned else [0] * len(lanes),
                "seconds": float(self.seconds),
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
