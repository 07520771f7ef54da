"""Pinned host memory of a one-device call, pinned on a worker before its stage begins.

A one-stage factorization pins four host buffers as it starts: the maps
(:meth:`~.device.CupyDevice.start`), the stage's S entries (indices and
values) and its records' buffer (:meth:`~.device.CupyDevice.begin_stage`).
Pinning takes time in proportion to the size (``cudaHostAlloc``, on the
call's thread, the device idle), and CuPy's pinned pool gives a block back
only for a request of its exact size, so the first call of every larger
pattern pins again.

:func:`start` pins them in one block on a worker thread as soon as their
sizes are known: in a new process when CUDA is up, from the schedule read
from its file meanwhile (:func:`sizes_of_schedule`); otherwise after the
memory plan, bounding the records by the plan's (:func:`sizes_of_plan`),
while the schedule is built. The block is lent by, and given back to, the
blocks :mod:`.pinned_ahead` keeps between calls, so a repeated call (of any
pattern the block holds) pins nothing. The device layer takes its buffers
from it through its ``pinned_ahead`` hook (:class:`CallPins`), in the order it
asks; a buffer the block cannot hold is pinned as before.
"""

from __future__ import annotations

import threading

import numpy as np

from ..._schedule.tasks import TASK_BYTES
from .device import pinned_pool_cap
from .worker import on_worker
from .pinned_ahead import PINNED_ALIGN, PINNED_LANE_SLACK, PinnedAhead

__all__ = ["CallPins", "start", "sizes_of_schedule", "sizes_of_plan", "one_stage", "wanted",
           "for_plan"]


def _align(nbytes: int) -> int:
    return -(-max(int(nbytes), 1) // PINNED_ALIGN) * PINNED_ALIGN


def _sizes(analysis, records_bytes: int, dtype) -> list:
    """Bytes of each buffer a one-stage run pins, in the order the layer asks:
    the maps, the S indices, the S values, the records."""
    fs = analysis.fronts
    isz = np.dtype(dtype).itemsize
    return [int(len(fs.rimap) + len(fs.rjmap)) * 8, int(len(fs.s_index)) * 8,
            int(len(fs.s_nz)) * isz, max(int(records_bytes), TASK_BYTES)]


def sizes_of_schedule(analysis, sched, dtype) -> list | None:
    """:func:`_sizes` of a one-stage schedule (its records exactly); None otherwise."""
    if sched is None or len(sched.stages) != 1:
        return None
    return _sizes(analysis, int(sched.stages[0].ntasks) * TASK_BYTES, dtype)


def sizes_of_plan(analysis, needs, dtype) -> list:
    """:func:`_sizes` with the records bounded by the memory plan's
    (:class:`~scipy_gpuqr._engine.memory.FrontNeeds` ``records``: bytes per front)."""
    return _sizes(analysis, int(np.sum(needs.records, dtype=np.int64)), dtype)


def one_stage(mplan) -> bool:
    """Whether a memory plan runs one stage on the device (no host front)."""
    return bool(mplan is not None and mplan.feasible and not mplan.host
                and len(mplan.plan.stages) == 1)


def for_plan(pins, mplan):
    """``pins`` where ``mplan`` runs one stage, the run they were sized for, else
    None, their block given back unused: a run of several stages (or host
    fronts) pins what it sends to the host, which must outlive the call."""
    if pins is None or one_stage(mplan):
        return pins
    pins.finish()
    return None


def wanted(device, mplan) -> bool:
    """Whether a call on ``device`` (a CUDA layer taking its pinned buffers as asked:
    no ``pinned_ahead`` set) with memory plan ``mplan`` (one stage) pins them ahead."""
    return (getattr(device, "cp", None) is not None
            and getattr(device, "pinned_ahead", False) is None and one_stage(mplan))


class CallPins:
    """A device layer's ``pinned_ahead`` for one call: its buffers cut, in the
    order asked, from the block a worker pins (or borrows) meanwhile; a buffer
    asked before the block is ready waits for it, one it cannot hold is pinned
    then (:meth:`PinnedAhead.missed` counts it)."""

    def __init__(self, future):
        self._future = future
        self._lock = threading.Lock()
        self._ahead = None
        self._done = False

    def _lane(self):
        with self._lock:
            if self._done:
                return None
            if self._ahead is None:
                try:
                    self._ahead = self._future.result()
                except Exception:  # noqa: BLE001 - cudaHostAlloc refused: pinned as asked
                    self._ahead = False
            return self._ahead.lane(0) if self._ahead else None

    def take(self, n: int, dtype) -> np.ndarray:
        """``n`` elements of ``dtype`` of pinned host memory."""
        lane = self._lane()
        if lane is not None:
            return lane.take(n, dtype)
        import cupyx
        return cupyx.empty_pinned((max(int(n), 1),), dtype=dtype)[:int(n)]

    def holds(self, arr) -> bool:
        """Nothing is filled ahead: every upload copies into what :meth:`take` gives."""
        return False

    def info(self) -> dict | None:
        """:meth:`PinnedAhead.info` of the block (None: none was made)."""
        ahead = self._ahead
        if not ahead:
            return None
        return ahead.info()

    def finish(self, stream=None) -> None:
        """The block back to the kept ones once ``stream`` (the layer's, which
        copied from it) is done with it; let go of where that cannot be known.
        Later requests are pinned as asked."""
        with self._lock:
            self._done = True
        try:
            ahead = self._future.result() if self._ahead is None else self._ahead
        except Exception:  # noqa: BLE001 - nothing was pinned
            return
        if not ahead:
            return
        try:
            if stream is not None:
                stream.synchronize()
        except Exception:  # noqa: BLE001 - a failed device: never lent again
            ahead.drop()
            return
        ahead.give_back()


def _pin(total: int) -> PinnedAhead | None:
    ahead = PinnedAhead({"shared": [], "staging": {}, "lanes": None})
    try:
        ahead.make_lanes([total])
    except Exception:                   # noqa: BLE001 - cudaHostAlloc refused: pinned as asked
        ahead.drop()
        return None
    return ahead


def start(sizes) -> CallPins | None:
    """The buffers of ``sizes`` (bytes, in the order the layer asks) pinned in one
    block on a worker thread (``gpuqr-call-pins``); None where they would pass
    :func:`~.device.pinned_pool_cap` (pinned as asked, or pageable)."""
    if not sizes:
        return None
    total = sum(_align(b) for b in sizes) + PINNED_LANE_SLACK + PINNED_ALIGN
    if total > pinned_pool_cap():
        return None
    return CallPins(on_worker("gpuqr-call-pins", _pin, total))
