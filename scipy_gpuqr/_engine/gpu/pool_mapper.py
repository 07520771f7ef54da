"""A mapped stage pool's chunks backed while a stage's launches are enqueued.

:class:`PoolMapper` follows a :class:`~scipy_gpuqr._engine.pool_map.PoolMap`
launch by launch for :class:`~.stage_loop.StageLoop`: before launch ``L`` it
maps the chunks whose first launch is ``L`` (the device layer zeroes them on
its stream ahead of the launch), and where that would pass the plan's cap it
first unmaps every chunk whose last launch is before ``L``, once the pool's
copy (:mod:`.pool_copy`) has sent what they hold: the layer waits for the
device to pass the launches and copies enqueued so far, then gives their
memory back (:meth:`~.device.CupyDevice.unmap_chunks`). Unmapping only where
room is needed, and then all that can go, keeps such waits few.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..._errors import DeviceOutOfMemory

__all__ = ["PoolMapper"]


class PoolMapper:
    """Maps and unmaps a stage pool's chunks around its launches.

    Parameters
    ----------
    pmap : PoolMap
        The stage's chunks and their lifetimes; ``pmap.cap`` chunks at most
        mapped at once (None: no cap).
    device : NumpyDevice or CupyDevice
        Its ``map_chunks(h, chunks)`` and ``unmap_chunks(h, chunks)``.
    h : dict
        The stage's handle (``device.begin_stage``).
    down : pool copy
        The pool's copy to the host (:mod:`.pool_copy`): its ``send_final(L)``
        sends every front final by launch ``L`` at once.

    Attributes
    ----------
    mapped, peak, maps, unmaps, waits : int
        Chunks mapped now and at most, chunks mapped and unmapped in all, and
        the times room was made (each a wait for the device).
    """

    def __init__(self, pmap, device, h, down):
        self.pm, self.dev, self.h, self.down = pmap, device, h, down
        self.cap = None if pmap.cap is None else int(pmap.cap)
        use = np.flatnonzero(pmap.first >= 0)
        self.due = use[np.argsort(pmap.first[use], kind="stable")]
        self.next = 0
        self.heap = []              # (last launch, chunk) of the chunks mapped
        self.mapped = self.peak = self.maps = self.unmaps = self.waits = 0

    def before_launch(self, L: int) -> None:
        """The chunks launch ``L`` first touches mapped (room made first)."""
        first = self.pm.first
        j = self.next
        while j < len(self.due) and first[self.due[j]] <= L:
            j += 1
        new = self.due[self.next:j]
        self.next = j
        if not len(new):
            return
        if self.cap is not None and self.mapped + len(new) > self.cap:
            self.make_room(L, self.mapped + len(new) - self.cap)
        self.dev.map_chunks(self.h, new.tolist())
        last = self.pm.last
        for k in new.tolist():
            heapq.heappush(self.heap, (int(last[k]), int(k)))
        self.mapped += len(new)
        self.maps += len(new)
        self.peak = max(self.peak, self.mapped)

    def make_room(self, L: int, n: int) -> None:
        """``n`` chunks or more unmapped: every chunk no launch from ``L`` on
        touches (the layer waits for the device once for all of them, so the
        next wait is as far off as can be).

        Raises
        ------
        DeviceOutOfMemory
            Fewer than ``n`` such chunks (the plan's cap is too small for this
            schedule: the engine restages).
        """
        take = []
        while self.heap and self.heap[0][0] < L:
            take.append(heapq.heappop(self.heap))
        if len(take) < n:
            for item in take:
                heapq.heappush(self.heap, item)
            raise DeviceOutOfMemory(
                f"the mapped pool needs {self.mapped + n - len(take):,} more chunks of "
                f"{self.pm.chunk_bytes:,} bytes at launch {L} than its cap of {self.cap:,}")
        # the chunks' fronts are final by their last launch: sent now if not yet
        self.down.send_final(int(take[-1][0]))
        self.dev.unmap_chunks(self.h, [k for _, k in take])
        self.mapped -= len(take)
        self.unmaps += len(take)
        self.waits += 1

    def info(self) -> dict:
        """``info['pool_map']``: the chunks, their bytes, the most mapped at once
        (planned and as run), maps, unmaps and waits."""
        pm = self.pm
        return {"chunk_bytes": pm.chunk_bytes, "chunks": pm.nchunks,
                "pool_bytes": pm.nchunks * pm.chunk_bytes,
                "cap_chunks": self.cap, "planned_peak_chunks": pm.peak(),
                "peak_chunks": self.peak, "peak_bytes": self.peak * pm.chunk_bytes,
                "maps": self.maps, "unmaps": self.unmaps, "waits": self.waits}
