"""One stage whose pool is mapped chunk by chunk: the GPU driver's plan for a
factorization that a memory limit would otherwise split into stages.

Where the fronts alive at once fit beside what else the stage holds, the
one-stage schedule runs with its pool's address range kept and only the
chunks of the fronts alive backed (:mod:`scipy_gpuqr._engine.pool_map` plans
the chunks' lifetimes and ``Q``'s replay parts, :mod:`.vmm` maps them,
:mod:`.pool_mapper` maps and unmaps during the launches). :func:`mapped_stage`
decides and makes the plan; the driver runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..._schedule.sparse import build_schedule
from ..memory import MemoryPlan, solve_bytes, stage_bytes
from ..pool_map import CHUNK_BYTES, part_elements, pool_map, replay_parts
from .reflector_upload import SMALL_FRONT

__all__ = ["MappedStage", "mapped_stage"]


@dataclass(frozen=True)
class MappedStage:
    """A factorization run as one stage whose pool is mapped chunk by chunk
    (:func:`mapped_stage`).

    Attributes
    ----------
    mplan : MemoryPlan
        One stage, its need the mapped count.
    pmap : PoolMap
        The chunks' lifetimes, ``cap`` set to the chunks that fit.
    parts : list of int
        First launch of each part ``Q``'s replay uploads at once.
    peak_bytes : int
        Bytes of the chunks mapped at most (the plan's count).
    upload_elements : int
        Elements the solves upload at once: the largest part's reflectors or R's
        rows, whichever is larger.
    """

    mplan: MemoryPlan
    pmap: object
    parts: list
    peak_bytes: int
    upload_elements: int

    def info(self) -> dict:
        """``info['memory']['pool_map']``: what the plan counted."""
        pm = self.pmap
        return {"chunk_bytes": pm.chunk_bytes, "chunks": pm.nchunks,
                "cap_chunks": pm.cap, "planned_peak_bytes": self.peak_bytes,
                "replay_parts": len(self.parts)}


def mapped_stage(analysis, needs, available: int, max_gpu_memory, device, *, tile, bundle,
                 pipelining, max_tasks, dense_flops, dense_cpl, dense_extra,
                 itemsize: int):
    """The factorization as one stage whose pool is backed only where its fronts
    are alive (:mod:`~scipy_gpuqr._engine.pool_map`), where that fits
    ``available`` bytes; else None.

    It needs the one-stage schedule with its records (a pattern factorized
    before in the process, or whose plan is on disk), no dense fronts and no
    host front, a layer that maps (``device.can_map``), the chunks alive at
    most beside the fixed bytes and the stage's other allocations (no gather
    index of R: its values come from the pool sent to the host), and the
    solves: ``Q``'s replay reads the stage's reflectors in parts of its launches
    (:func:`~scipy_gpuqr._engine.pool_map.replay_parts`), R's rows at once.
    The chunks are the layer's ``map_chunk_bytes`` (default
    :data:`~scipy_gpuqr._engine.pool_map.CHUNK_BYTES`).
    """
    chunk_bytes = int(getattr(device, "map_chunk_bytes", CHUNK_BYTES))
    one = analysis.stage_plan(max_gpu_memory)        # the plan without a limit
    if len(one.stages) != 1 or not hasattr(device, "map_chunks"):
        return None
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_gpu_memory=max_gpu_memory, max_tasks=max_tasks, lazy=True,
                           dense_flops=dense_flops, dense_columns_per_launch=dense_cpl,
                           plan=one, dense_extra=dense_extra or None)
    st = sched.stages[0]
    if not st.materialized or st.dense or st.carried:
        return None
    isz = int(itemsize)
    if not device.can_map(int(st.pool_size) * isz, chunk_bytes):
        return None
    extras = getattr(sched, "extras", None)
    made = ("mapped_stage", int(chunk_bytes), isz, int(available))
    if extras is not None and made in extras:       # this pattern under this memory before
        return extras[made]
    out = _mapped_stage(analysis, needs, available, sched, isz, chunk_bytes, one)
    if extras is not None:
        extras[made] = out
    return out


def _mapped_stage(analysis, needs, available, sched, isz, chunk_bytes, plan):
    """:func:`mapped_stage`'s plan for the one-stage schedule ``sched``."""
    st = sched.stages[0]
    extras = getattr(sched, "extras", None)
    key = ("pool_map", int(chunk_bytes), isz)
    pm = extras.get(key) if extras is not None else None
    if pm is None:
        pm = pool_map(analysis.fronts, st, isz, chunk_bytes)
        if extras is not None:
            extras[key] = pm
    other = stage_bytes(sched, analysis, needs, isz, mapped={0: 0})[0]
    cap = (int(available) - needs.fixed - other) // pm.chunk_bytes
    if pm.peak() > cap:
        return None
    pm = replace(pm, cap=int(cap))
    fs = analysis.fronts
    rk = fs.frank.astype(np.int64)
    side = int((rk ** 2).max()) * 8 if len(rk) else 0
    room = (int(available) - needs.fixed - solve_bytes(analysis, sched) - side) // isz
    rows = int((rk * fs.fn.astype(np.int64)).sum())
    parts = replay_parts(fs, st, room, sched.tile, SMALL_FRONT) if rows <= room else None
    if parts is None:
        return None
    peak = pm.peak_bytes()
    mplan = MemoryPlan(plan, (other + peak,), int(available), needs.fixed, ())
    upload = max([rows] + part_elements(fs, st, parts, sched.tile, SMALL_FRONT))
    return MappedStage(mplan, pm, parts, peak, upload)
