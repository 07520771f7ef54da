"""The GPU engine: sparse multifrontal QR through the uberkernel (``backend='gpu'``).

The sparse scheduler (:func:`scipy_gpuqr._schedule.sparse.build_schedule`)
turns the analysis into task lists, stage by stage; the device layer
(:mod:`.device`) runs every launch of a stage on the GPU over one front
pool (CuPy memory pool), with the stage's S entries, the maps (uploaded once)
and the VT pool of the whole factorization. Per stage, R's values come back
gathered in CSC order through a pinned staging buffer reused per R layout
(:mod:`.rcopy`; warm one-stage runs copy each final column range while
later launches run), contribution blocks of fronts whose parent sits in a
later stage in one gathered transfer; the stage's pool is then copied
to the host (earlier stages, to free device memory) or kept on the GPU (the
last stage) for ``Q``. Contribution blocks cross stages through host memory.

One attempt (:func:`_factorize`) builds the schedule, starts R's layout on a
worker thread (:func:`_host_side`), runs the stages
(:class:`~.stage_loop.StageLoop`), then assembles R (:func:`~.stage_loop.assemble_r`)
and the :class:`GpuQR`.

Memory: the stages are planned for the memory the device really has now
(the CuPy pool's limit, free device memory; :mod:`scipy_gpuqr._engine.memory`
counts every allocation of a stage), within ``max_gpu_memory`` when given;
the built schedule's exact bytes are checked before the first allocation. A
device out-of-memory during a run frees everything the attempt held and
restages for a smaller peak (:data:`MAX_RESTAGE` times). A dense front that
alone exceeds the memory is a *host front* (:attr:`.memory.MemoryPlan.host`):
its stage runs on the host (:class:`~.device.HostFrontDevice`: assembled from
its S entries and its children's contribution blocks, factorized by LAPACK
with all the BLAS threads, R's rows gathered and its contribution block handed
on as a device stage's), its Householder data stay on the host
(:class:`~scipy_gpuqr._engine.dense_front.HostDenseFront`: ``Q`` applies it
there) and R's solves use its rows of R there too; ``info["host_fronts"]`` says
which and why. When no plan fits (any other front alone exceeds the memory)
SuiteSparseQR answers on the CPU with a
:class:`GpuFallbackWarning`, and ``info`` says ``backend`` 'cpu' and why
(``fallback``). A staged factorization whose last pool would not fit beside
an earlier one sends it to the host too, so that ``Q`` replays on the device
one stage pool at a time.

Faults: a CUDA error or a non-finite value in a front pool after a stage
(A is checked finite first) raises :class:`GpuEngineError`, never a silently
wrong R. ``debug`` (``GpuqrOptions.debug`` / ``SCIPY_GPUQR_DEBUG=1``)
synchronizes and checks after every launch.

Dense fronts (:mod:`scipy_gpuqr._schedule.dense`: the largest fronts, chosen
from the analysis) are assembled by the launches but factorized by a blocked
Householder QR (:mod:`scipy_gpuqr._engine.dense_front`: panels in one launch
each, trailing updates by cuBLAS) on a side stream, right after the launch
that completes their assembly; their Householder data stay on the device
(``GpuQR._dense``).

``Q`` is applied on the GPU from the kept reflectors (:mod:`.solve`);
without a CUDA device it is replayed on the host (:func:`.solve.host_matmul`).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from ... import _gpu
from ..._cpu import spqr
from ..._errors import DeviceOutOfMemory, GpuEngineError, GpuFallbackWarning
from ..._schedule.dense import DEFAULT_DENSE_FLOPS, DENSE_COLUMNS_PER_LAUNCH, dense_front_mask
from ..._schedule.pattern_cache import PerPattern
from ..._schedule.sparse import build_schedule
from ..._schedule.tasks import DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE
from ..dense_front import DenseFront, HostDenseFront
from ..host.reference import reference_factorize, task_list_input
from .. import memory as _memory
from ..memory import (DeviceMemory, GpuMemoryExhausted, front_needs, min_budget,
                      min_budget_of_front, plan_for_memory, solve_bytes, stage_bytes,
                      vt_elements)
from ..slab_front import slab_columns
from ..tasklist_qr import TaskListQR
from . import solve as gpu_solve
from .device import CupyDevice
from .factorize_kernels import prefetch_engine_kernels
from .mapped_stage import mapped_stage
from .reflector_upload import packed_size_bound
from . import call_pins, replay_ahead, rlayout_store
from .rlayout import r_layout, r_layout_cached
from .stage_loop import StageLoop, assemble_r, r_dtype
from .worker import on_worker

__all__ = ["gpu_factorize", "GpuQR", "GpuEngineError"]

_log = logging.getLogger("scipy_gpuqr")

#: The dense-front threshold (Householder flops) of a factorization whose time
#: model's choice (:data:`~scipy_gpuqr._schedule.dense.DENSE_RULE`) leaves a
#: front that fits no stage plan: by size, the large fronts become dense fronts,
#: and a dense front too large for the device runs as a host front.
STAGED_DENSE_FLOPS = 1e10

#: How a factorization whose time model's dense fronts leave a front that fits
#: no stage plan picks its dense fronts instead: ``"size"``, every front of at
#: least :data:`STAGED_DENSE_FLOPS` (many fronts the model keeps on the tile
#: tasks leave them); ``"oversized"``, the model's and only the fronts that fit
#: no stage (round by round: fewer tile fronts also make the VT pool smaller,
#: so more may fit), which may then run as host fronts
#: (:func:`_oversized_dense`), unless that makes more dense fronts than by
#: size (near the smallest plan, where the rounds cascade), or leaves a host
#: front not one column slab on the device where by size leaves each one some
#: (ch7-8-b3 at an eighth of its one-stage need: its root would go to LAPACK):
#: then by size.
#: ``"oversized"`` measured 0.86x of ``"size"`` end to end on grid 40^3 at a
#: quarter of its one-stage memory, 1.01x on ch7-8-b3 (bench/RESULTS.md).
STAGED_DENSE = "oversized"
STAGED_DENSES = ("size", "oversized")

#: Whether a factorization whose memory plan has stages runs as one stage whose
#: pool is mapped chunk by chunk where the fronts alive fit
#: (:mod:`~scipy_gpuqr._engine.pool_map`, :func:`~.mapped_stage.mapped_stage`).
MAP_POOL = True

#: Restaging attempts after device out-of-memory before the CPU fallback.
MAX_RESTAGE = 6
#: After an out-of-memory, the next plan's peak is at most this fraction of the
#: failed plan's.
RESTAGE_SHRINK = 0.7


@dataclass
class GpuQR(TaskListQR):
    """Result of :func:`gpu_factorize` (a :class:`~scipy_gpuqr._engine.tasklist_qr.TaskListQR`).

    ``R``, ``colperm`` and ``info`` are on the host. The Householder data
    (front pools and VT tiles) stay where the factorization left them.

    On a CUDA device ``qt_matmul``/``q_matmul`` run there (:mod:`.solve`:
    the kept reflectors replayed by ``kernels/sparse_qr/applyq.cu``, level by
    level; NumPy in → NumPy out, CuPy in → CuPy out); earlier stages' pools
    are uploaded for their levels. Without one (the NumPy device layer), or
    when the device replay runs out of memory, the reflectors are replayed on
    the host after fetching the fronts (:func:`.solve.host_matmul`).

    Attributes
    ----------
    _device : CupyDevice or NumpyDevice or None
        The device layer holding the VT pool and the last stage's pool
        (None once freed).
    _pending : dict
        Front → ``(stage, offset, size)`` of the fronts whose values still lie
        in a device pool (their ``_fronts`` entry has no values yet).
    _stage_pools : dict
        Stage → its front pool on the device (the last stage).
    _host_pools : dict
        Stage → its front pool on the host (earlier stages, and every stage
        once fetched).
    _front_loc : list of (int, int)
        Stage and offset of each front in its stage's pool.
    _front_launch : list of ndarray of int64
        Global launch index of each kept record of each front: the launches
        of earlier stages plus the launch index in the stage (as
        ``_dense[f].after_launch``).
    _launch_base : list of int
        First global launch index of each stage.
    _replay : dict
        What :mod:`.solve` caches for this factorization (replay plan,
        executors, ``qorder`` per array module).
    _host_stages : dict
        Stage → its host front (a dense front too large for the device, whose
        pool stays in ``_host_pools``: the solves use it on the host).
    _replay_by_launch : bool
        ``Q``'s replay reads the factorization's one (mapped) stage in parts of
        its launches (``_launch_base``: their first launches; ``_host_pools``:
        the stage's host pool under each part).
    """

    _device: object = field(default=None, repr=False)
    _pending: dict = field(default_factory=dict, repr=False)
    _stage_pools: dict = field(default_factory=dict, repr=False)
    _host_pools: dict = field(default_factory=dict, repr=False)
    _front_loc: list = field(default_factory=list, repr=False)
    _front_launch: list = field(default_factory=list, repr=False)
    _launch_base: list = field(default_factory=list, repr=False)
    _replay: dict = field(default_factory=dict, repr=False)
    _host_stages: dict = field(default_factory=dict, repr=False)
    _replay_by_launch: bool = field(default=False, repr=False)

    def on_device(self) -> bool:
        """True when Q is applied on a CUDA device (the factorization's)."""
        return (getattr(self._device, "cp", None) is not None
                and getattr(self._device, "vt", None) is not None)

    def _materialize(self) -> None:
        """Fetch the VT pool and the fronts still on the device (for the host replay)."""
        if self._device is None and self._vt is None:
            raise RuntimeError("the factorization was freed")
        if self._vt is None:
            self._vt = self._device.vt_host()
        self.pools_to_host()

    def pools_to_host(self) -> bool:
        """Fetch the fronts still in a device pool (the last stage's) to the host
        and drop that pool; whether there was one. The VT pool stays where it is."""
        if not self._pending:
            return False
        pools = {}
        fronts = list(self._fronts)
        for f, (sid, off, size) in self._pending.items():
            if sid not in pools:
                pools[sid] = self._device.to_host(self._stage_pools[sid])
            slots, _, ft = fronts[f]
            fronts[f] = (slots, pools[sid][off: off + size], ft)
            d = self._dense.get(f)
            if d is not None:       # the host copy of its front (V), fetched anyway
                d.set_front(fronts[f][1].reshape(d.shape))
                d.host()
        self._fronts = fronts
        self._host_pools.update(pools)
        self._pending = {}
        self._stage_pools = {}
        return True

    def qt_matmul(self, B):
        if self.on_device():
            return gpu_solve.device_matmul(self, B, trans=True)
        self._materialize()
        return gpu_solve.host_matmul(self, B, trans=True)

    def q_matmul(self, Y):
        if self.on_device():
            return gpu_solve.device_matmul(self, Y, trans=False)
        self._materialize()
        return gpu_solve.host_matmul(self, Y, trans=False)

    def free(self) -> None:
        if self.on_device():        # a first stage sent up and never read: its copies end first
            gpu_solve.drop_first(self)
        super().free()
        self._pending = {}
        self._stage_pools = {}
        self._host_pools = {}
        self._replay = {}
        self._dense = {}
        if self._device is not None:
            self._device.close()
        self._device = None


def _debug_default() -> bool:
    return os.environ.get("SCIPY_GPUQR_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


class _PlanOver(DeviceOutOfMemory):
    """The built schedule needs ``excess`` bytes more than its plan was made for."""

    def __init__(self, excess: int, msg: str):
        super().__init__(msg)
        self.excess = int(excess)


def _device_memory(device):
    """:class:`~scipy_gpuqr._engine.memory.DeviceMemory` of the device layer now
    (no limit for a layer that cannot tell)."""
    memory = getattr(device, "memory", None)
    return memory() if memory is not None else DeviceMemory(None, "none")


def _default_budget(device) -> int | None:
    """Bytes a factorization may use on the layer's device now (None: no limit
    known, the NumPy device); see :func:`scipy_gpuqr._engine.memory.available_bytes`."""
    return _device_memory(device).available


def _needs_nbytes(value) -> int:
    """Bytes of a :data:`_PLANS` entry (the arrays of its ``FrontNeeds``, the
    first item; :data:`_STAGED_PLANS` passes its entry from the needs on)."""
    needs = value[0]
    return sum(int(getattr(v, "nbytes", 0)) for v in vars(needs).values())


#: Per pattern and planning key (dense fronts, tunables, value size, panel, the
#: caller's budget): ``(needs, plan)``, the fronts' device bytes and the plan of
#: one stage made for the fewest bytes so far (None: none made).
_PLANS = PerPattern(64, 256 << 20, _needs_nbytes)


#: Per pattern and ``(planning key, STAGED_DENSE,``
#: :data:`~scipy_gpuqr._engine.memory.HOST_CHILDREN_PLACED` ``, bytes available)``: a staged
#: factorization's ``(dense_flops, dense_extra, needs, plan)`` (:func:`_memory_plan`
#: then :func:`staged_dense_plan`): the same for every call under the same pool
#: limit, and tens of milliseconds of host time (a plan over every front, per
#: round of dense fronts) before the first launch, the device idle.
_STAGED_PLANS = PerPattern(32, 256 << 20, lambda value: _needs_nbytes(value[2:]))


def _memory_plan(analysis, key, make_needs, available, max_gpu_memory):
    """``(needs, plan)`` of a factorization: the fronts' device bytes
    (``make_needs()``, once per pattern and ``key``) and
    :func:`~scipy_gpuqr._engine.memory.plan_for_memory`'s plan for ``available``.

    Both are the same for every call of a pattern with the same key but the
    bytes available, which move a little from call to call. A plan of one
    stage made for ``A0`` bytes is the plan for any ``available >= A0``: every
    front joined the open stage under ``A0``'s cap, so it does under a larger
    one. Such a plan is taken from :data:`_PLANS` (``available`` put in its
    place); any other is made, and kept when it is one stage.
    """
    hit = _PLANS.get(analysis, key)
    needs = hit[0] if hit is not None else make_needs()
    kept = hit[1] if hit is not None else None
    if kept is not None and available is not None and int(available) >= kept.available:
        return needs, replace(kept, plan=replace(kept.plan, budget=int(available)),
                              available=int(available))
    mplan = plan_for_memory(analysis, needs, available, max_gpu_memory)
    one = (available is not None and mplan.feasible and not mplan.host
           and len(mplan.plan.stages) == 1)
    if hit is None or one:
        _PLANS.put(analysis, key, (needs, mplan if one else kept))
    return needs, mplan


def gpu_factorize(A, analysis=None, *, tol=None, max_gpu_memory: int | None = None,
                  tile: int = DEFAULT_TILE, bundle: int = DEFAULT_BUNDLE,
                  pipelining: bool = True, max_tasks: int | None = None,
                  debug: bool | None = None, device=None, fallback: bool = True,
                  dense_flops: float | None = DEFAULT_DENSE_FLOPS,
                  dense_columns_per_launch: int = DENSE_COLUMNS_PER_LAUNCH):
    """Sparse QR ``A[:, colperm] = Q @ R`` on the GPU.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` (computed when None).
    tol : None, 'default' or float
        The task lists have no rank detection: called directly with a
        tolerance, the reference backend answers (``info`` says so). The
        ``backend='gpu'`` entry points instead factorize without it here and
        apply SuiteSparseQR's rule to R on the GPU.
    max_gpu_memory : int, optional
        Byte budget of the analysis' staging model
        (``analysis.stage_plan(max_gpu_memory)``): small values force many
        stages. Whatever it says, the stages are also sized for the memory the
        device has now (:mod:`scipy_gpuqr._engine.memory`: the CuPy pool's
        limit, the free device memory, every allocation of a stage counted).
    tile, bundle, pipelining, max_tasks
        Scheduler tunables; ``tile`` and ``bundle`` must name an uberkernel
        variant the engine has (``factorize_kernels.ENGINE_VARIANTS``: TILE 32,
        BUNDLE 3).
    debug : bool, optional
        Synchronize and check after every launch (default: ``SCIPY_GPUQR_DEBUG``).
    device : object, optional
        A device layer (:class:`~.device.NumpyDevice` runs the host logic
        without a GPU); default the CUDA device.
    fallback : bool
        When no stage plan fits the device (a front alone too large, or out of
        memory down to the smallest plan), SuiteSparseQR answers on the CPU
        with a :class:`GpuFallbackWarning` (``info``: ``backend`` 'cpu',
        ``requested_backend`` 'gpu', ``fallback`` the reason); False: raise
        :class:`~scipy_gpuqr._engine.memory.GpuMemoryExhausted` (a MemoryError).
    dense_flops : float or None
        Fronts of at least this many Householder flops are dense fronts
        (blocked QR, panel kernel and cuBLAS, instead of tile tasks; see
        :mod:`scipy_gpuqr._schedule.dense`); None: none.
    dense_columns_per_launch : int
        A dense front runs on a side stream while the launches go on; its
        parent's pack waits one launch per this many of its columns (0: the
        next launch waits for it).

    Returns
    -------
    GpuQR
        ``info["memory"]``: the bytes available and what limited them, the
        fixed and per-stage bytes planned, out-of-memory events met;
        ``info["restaged"]``: attempts before the one that ran;
        ``info["host_fronts"]``: the fronts that ran on the host and why.
        ``info["launches"]`` counts every launch of the schedule (the global
        launch numbering of ``Q``'s replay), the empty ones a dense front
        defers its parent's pack by included; ``info["launches_with_tasks"]``
        those that run the uberkernel.
    """
    t_start = time.perf_counter()
    Ac, analysis, out = task_list_input(A, analysis, tol, max_gpu_memory, "gpu",
                                        "gpu_factorize")
    if out is not None:
        return out
    debug = _debug_default() if debug is None else bool(debug)
    dev_dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    early = start_layout_load(analysis)     # meanwhile: the device, the plan, the schedule
    early_schedule = pins = None
    if device is None:
        if early is not None and max_gpu_memory is None:    # a pattern new to the process
            early_schedule = start_schedule_load(
                analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                max_tasks=max_tasks, dense_flops=dense_flops,
                dense_columns_per_launch=dense_columns_per_launch)
        _gpu.start_driver()     # a new process's first call: beside CuPy's import
        gi = _gpu.gpu_info()
        if not gi.get("available"):
            return _no_gpu(Ac, analysis, f"no usable GPU ({gi.get('reason', '?')})")
        # the stage's pinned buffers, pinned meanwhile where the schedule read from its
        # file has their sizes already (a new process)
        pins = call_pins.start(call_pins.sizes_of_schedule(
            analysis, _done_result(early_schedule), dev_dtype))
        prefetch_engine_kernels(dev_dtype, tile, bundle)     # the solves' compile meanwhile
        device = CupyDevice(tile, bundle, dtype=dev_dtype, debug=debug)
    t_an = time.perf_counter()

    def needs_for(flops, extra=()):
        return stage_needs(analysis, flops, extra, tile=tile, bundle=bundle,
                           pipelining=pipelining, itemsize=np.dtype(dev_dtype).itemsize,
                           panel=getattr(device, "dense_panel", 256))

    mem = _device_memory(device)
    available, limited_by = mem.available, mem.limited_by
    pkey = (dense_flops, tile, bundle, pipelining, np.dtype(dev_dtype).itemsize,
            getattr(device, "dense_panel", 256), max_gpu_memory)
    skey = (pkey, STAGED_DENSE, _memory.HOST_CHILDREN_PLACED, available)
    staged = _STAGED_PLANS.get(analysis, skey)
    if staged is None:
        needs, mplan = _memory_plan(analysis, pkey, lambda: needs_for(dense_flops), available,
                                    max_gpu_memory)
        staged = staged_dense_plan(
            analysis, needs_for, dense_flops, needs, mplan, available, max_gpu_memory,
            panel=getattr(device, "dense_panel", 256), itemsize=np.dtype(dev_dtype).itemsize)
        if available is not None and staged[3].feasible and (
                staged[3].host or len(staged[3].plan.stages) > 1):
            _STAGED_PLANS.put(analysis, skey, staged)
    dense_flops, dense_extra, needs, mplan = staged
    mapped = None
    if (MAP_POOL and available is not None and mplan.feasible and not mplan.host
            and len(mplan.plan.stages) > 1):
        mapped = mapped_stage(analysis, needs, available, max_gpu_memory, device, tile=tile,
                              bundle=bundle, pipelining=pipelining, max_tasks=max_tasks,
                              dense_flops=dense_flops, dense_cpl=dense_columns_per_launch,
                              dense_extra=dense_extra, itemsize=np.dtype(dev_dtype).itemsize)
        if mapped is not None:
            mplan = mapped.mplan
    pins = call_pins.for_plan(pins, mplan)  # started for one stage: this plan's?
    if mapped is not None and pins is not None:
        pins.finish()       # a mapped stage's host pool outlives the call: pinned as asked
        pins = None
    if pins is None and mapped is None and call_pins.wanted(device, mplan):
        # pinned while the schedule is built, the records bounded by the plan's
        pins = call_pins.start(call_pins.sizes_of_plan(analysis, needs, dev_dtype))
    floor = min_budget(analysis, needs)
    why = None
    oom = []
    for attempt in range(MAX_RESTAGE + 1):
        if attempt:                     # the memory available changed: a new plan
            mplan = plan_for_memory(analysis, needs, available, max_gpu_memory)
            mapped = None
        if not mplan.feasible:
            why = (f"front {mplan.oversized[0]} alone needs more device memory than "
                   f"{available:,} bytes ({limited_by}; the smallest stage plan needs "
                   f"{floor:,})")
            break
        try:
            out = _factorize(Ac, analysis, device, budget=max_gpu_memory, tile=tile,
                             bundle=bundle, pipelining=pipelining, max_tasks=max_tasks,
                             dense_flops=dense_flops, dense_cpl=dense_columns_per_launch,
                             mplan=mplan, needs=needs, early=early, dense_extra=dense_extra,
                             early_schedule=early_schedule, pins=pins if not attempt else None,
                             mapped=mapped)
        except MemoryError as exc:      # DeviceOutOfMemory, or CuPy's from a worker
            if not (isinstance(exc, DeviceOutOfMemory)
                    or type(exc).__name__ == "OutOfMemoryError"):
                raise
            over = getattr(exc, "excess", 0)
            if not over:
                oom.append(str(exc))
            del exc
            _release_attempt(device)
            now = _device_memory(device).available
            if mapped is not None:          # the mapped stage failed: the staged plan next
                limited_by = f"{limited_by}; the mapped stage ran out of memory"
                continue
            if over:                        # the built schedule's exact count: just that less
                available -= over
                continue
            if mplan.peak <= floor:         # the smallest plan did not fit either
                break
            smaller = max(int(RESTAGE_SHRINK * mplan.peak), floor)
            available = smaller if now is None else min(now, smaller)
            limited_by = "restaged after out of memory"
            _log.info("GPU out of memory (%s): restaging for %d bytes", oom[-1], available)
            continue
        out.info["restaged"] = attempt
        out.info["host_fronts"] = _host_front_info(analysis, needs, mplan, limited_by,
                                                   out.info.pop("host_fronts_factorized_on",
                                                                []))
        out.info["memory"] = {"available": available, "limited_by": limited_by,
                              "detail": mem.detail, "fixed": mplan.fixed,
                              "stage_bytes": list(mplan.need),
                              "planned_peak": mplan.peak, "min_budget": floor,
                              "max_gpu_memory": max_gpu_memory, "out_of_memory": oom,
                              "pool_map": None if mapped is None else mapped.info()}
        out.info["seconds"]["total"] = time.perf_counter() - t_start
        out.info["seconds"]["validate"] = t_an - t_start
        first = getattr(device, "first_launch_at", None)
        if first is not None:       # the call's start to its first launch enqueued
            out.info["seconds"]["first_launch"] = first - t_start
        return out
    if oom:
        why = (f"the GPU ran out of memory ({len(oom)} attempts, the last: {oom[-1]})"
               + (f"; {why}" if why else ""))
    why = why or "no stage plan fit the device memory"
    _release_attempt(device)
    if not fallback:
        raise GpuMemoryExhausted(why)
    return _cpu_fallback(Ac, analysis, why, stacklevel=3)


#: Rounds of :func:`_oversized_dense` at most.
DENSE_ROUNDS = 8


def stage_needs(analysis, flops, extra=(), *, tile: int, bundle: int, pipelining: bool,
                itemsize: int, panel: int):
    """Each front's device bytes (:func:`~scipy_gpuqr._engine.memory.front_needs`) with the
    dense fronts of ``flops`` (:func:`~scipy_gpuqr._schedule.dense.dense_front_mask`)
    and the fronts ``extra`` made dense too; ``panel`` the dense fronts' panel width."""
    dense = dense_front_mask(analysis, flops)
    if len(extra):
        dense = dense.copy()
        dense[list(extra)] = True
    vt = vt_elements(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    return front_needs(analysis, itemsize, tile=tile, vt_elems=vt, dense=dense, panel=panel)


def staged_dense_plan(analysis, needs_for, dense_flops, needs, mplan, available, budget, *,
                      panel: int = 256, itemsize: int = 8):
    """The dense fronts and stage plan where the time model's dense fronts leave a
    front too large for any stage with the tile tasks: such fronts are made dense
    fronts, which may run as host fronts.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    needs_for : callable
        ``needs_for(flops, extra=())``: the fronts' device bytes (:func:`stage_needs`).
    dense_flops : float or None
        The call's dense-front rule (negative: the time model's).
    needs, mplan
        The fronts' bytes and the stage plan made with ``dense_flops``.
    available, budget : int
        The device bytes available and ``max_gpu_memory`` (or None).
    panel, itemsize : int
        The dense fronts' panel width and the values' bytes (a host front's
        column slabs on the device).

    Returns
    -------
    (dense_flops, dense_extra, needs, mplan)
        Unchanged where the plan is feasible or the rule is not the time model's.
        :data:`STAGED_DENSE` 'oversized': only the fronts that fit no stage are
        added (:func:`_oversized_dense`, ``dense_extra``), unless that cascades to
        more dense fronts than the rule by size would make, or leaves a host
        front not even one panel's column slab on the device (it would be
        factorized by the host's LAPACK) where the plan by size leaves every
        host front one (:func:`_host_fronts_slab`: the tile fronts' VT pool
        takes that room); 'size' (or those fallbacks): every front of
        :data:`STAGED_DENSE_FLOPS` or more, where that plan is feasible.
    """
    dense_extra = ()
    if dense_flops is None or dense_flops >= 0 or mplan.feasible:
        return dense_flops, dense_extra, needs, mplan
    if STAGED_DENSE not in STAGED_DENSES:
        raise ValueError(f"STAGED_DENSE must be one of {STAGED_DENSES}, got {STAGED_DENSE!r}")
    got = None
    if STAGED_DENSE == "oversized":
        got = _oversized_dense(analysis, lambda ex: needs_for(dense_flops, ex), mplan,
                               available, budget)
        by_size = int(np.count_nonzero(dense_front_mask(analysis, STAGED_DENSE_FLOPS)))
        if got is not None and (len(got[0]) + int(np.count_nonzero(
                dense_front_mask(analysis, dense_flops))) > by_size):
            got = None          # the rounds cascaded: fewer dense fronts by size
        if got is not None and not _host_fronts_slab(analysis, got[1], got[2], available,
                                                     panel, itemsize):
            staged = needs_for(STAGED_DENSE_FLOPS)
            splan = plan_for_memory(analysis, staged, available, budget)
            if splan.feasible and _host_fronts_slab(analysis, staged, splan, available, panel,
                                                    itemsize):
                return STAGED_DENSE_FLOPS, dense_extra, staged, splan
        if got is not None:
            dense_extra, needs, mplan = got
    if got is None:
        staged = needs_for(STAGED_DENSE_FLOPS)
        splan = plan_for_memory(analysis, staged, available, budget)
        if splan.feasible:
            dense_flops, needs, mplan = STAGED_DENSE_FLOPS, staged, splan
    return dense_flops, dense_extra, needs, mplan


def _host_fronts_slab(analysis, needs, mplan, available, panel: int, itemsize: int) -> bool:
    """Whether every host front of ``mplan`` gets at least one panel's column slab
    in the device bytes the plan's fixed bytes leave (``available`` less
    ``needs.fixed``; :func:`~scipy_gpuqr._engine.slab_front.slab_columns`): one
    that does not is factorized by the host's LAPACK, seconds on a front of
    teraflops (True without a limit)."""
    if available is None or not mplan.host:
        return True
    fs = analysis.fronts
    room = int(available) - int(needs.fixed)
    return all(slab_columns(int(fs.fm[f]), int(panel), int(itemsize), room) > 0
               for f in mplan.host)


def _oversized_dense(analysis, needs_of, mplan, available, max_gpu_memory):
    """:data:`STAGED_DENSE` ``"oversized"``: ``(extra, needs, plan)``, the fronts
    made dense fronts besides the time model's (sorted), their
    :class:`~scipy_gpuqr._engine.memory.FrontNeeds` (``needs_of(extra)``) and a
    feasible plan; None where a front that fits no stage cannot be a dense
    front (nothing to eliminate) or the rounds run out. Each round makes the
    plan's oversized fronts dense (they may then run on the host)."""
    nfact = np.minimum(analysis.fronts.fm, analysis.fronts.fn)
    extra = set()
    for _ in range(DENSE_ROUNDS):
        new = {int(f) for f in mplan.oversized if nfact[f] > 0} - extra
        if not new or len(new) < len(set(int(f) for f in mplan.oversized) - extra):
            return None
        extra |= new
        ex = tuple(sorted(extra))
        needs = needs_of(ex)
        mplan = plan_for_memory(analysis, needs, available, max_gpu_memory)
        if mplan.feasible:
            return ex, needs, mplan
    return None


def _host_front_info(analysis, needs, mplan, limited_by, factorized_on=()) -> list:
    """``info["host_fronts"]``: per host front its shape, its bytes alone on the
    device (with its children's blocks and workspace), why its stage ran on the
    host and where the front itself was factorized (``factorized_on``, in the
    order the stages ran: the GPU when the assembled front alone fit there)."""
    fs = analysis.fronts
    out = []
    where = list(factorized_on)
    for i, f in enumerate(sorted(int(f) for f in mplan.host)):
        fm, fn = int(fs.fm[f]), int(fs.fn[f])
        alone = min_budget_of_front(analysis, needs, f)
        on = where[i] if i < len(where) else "host (LAPACK)"
        out.append({"front": f, "shape": [fm, fn], "device_bytes_alone": alone,
                    "factorized_on": on,
                    "why": f"with its children's blocks it needs {alone:,} bytes of device "
                           f"memory, {mplan.available:,} available ({limited_by}): assembled "
                           f"on the host, factorized on the {on}"})
    return out


def _no_gpu(Ac, analysis, why):
    """SuiteSparseQR answers, with a GpuFallbackWarning (never silently)."""
    return _cpu_fallback(Ac, analysis, f"no usable GPU ({why})" if not why.startswith("no usable")
                         else why, stacklevel=4)


def _cpu_fallback(Ac, analysis, why: str, *, stacklevel: int = 3):
    """The fastest CPU path answers for a GPU that cannot: SuiteSparseQR (all
    the BLAS library's threads) in the analysis' column order, else the
    reference engine; ``info`` says what ran (``backend``), that the GPU was
    asked for (``requested_backend``) and why not (``fallback``)."""
    ok, lib = spqr.spqr_available()
    if ok:
        ran = "SuiteSparseQR on the CPU"
        warnings.warn(f"backend 'gpu': {why}; {ran} answers", GpuFallbackWarning,
                      stacklevel=stacklevel)
        out = spqr.spqr_factorize(Ac, colperm=np.asarray(analysis.colperm, dtype=np.int64),
                                  tol=None)
    else:
        ran = f"the reference CPU engine (SuiteSparseQR unavailable: {lib})"
        warnings.warn(f"backend 'gpu': {why}; {ran} answers", GpuFallbackWarning,
                      stacklevel=stacklevel)
        out = reference_factorize(Ac, analysis, tol=None)
    out.info["requested_backend"] = "gpu"
    out.info["fallback"] = why
    out.info["fallback_ran"] = ran
    return out


def _release_attempt(device) -> None:
    """Free what a failed attempt held on the device (its VT pool and maps, its
    stage pools once unreachable) and the pool's cached blocks."""
    close = getattr(device, "close", None)
    if close is not None:
        close()
    gc.collect()                    # frames of the failed attempt hold its pools
    cp = getattr(device, "cp", None)
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()


def start_layout_load(analysis):
    """Start loading R's layout of ``analysis`` from disk on a worker thread, or None.

    A new process's first factorization of a pattern an earlier process
    factorized finds the analysis and the schedule's plan on disk, but R's
    layout only in its file (:mod:`.rlayout_store`): without it before the
    first launch, the run copies R only once the layout is made (a cold run's
    late copier) and waits for the rest of the copy at its end. Started as soon
    as the analysis is known (:func:`~scipy_gpuqr._factor.factored.plan_for`, and
    again at the call's start, which then finds the load under way), the load
    (the file mapped and checked) runs while the device, the memory plan and
    the schedule are made (the file's name, its sources' stamp, is found
    there too). None when the layout is in memory already; the future's
    result is None when no file of it exists. One load per analysis object at
    a time: a second call while it runs returns its future.
    """
    if r_layout_cached(analysis) is not None:
        return None
    with _LAYOUT_LOADS_LOCK:
        future = _LAYOUT_LOADS.get(analysis)
        if future is not None:
            return future
        future = on_worker("gpuqr-layout-load", _load_stored_layout, analysis)
        _LAYOUT_LOADS[analysis] = future
    future.add_done_callback(lambda f, key=weakref.ref(analysis): _load_done(key))
    return future


def _load_done(key) -> None:
    """A finished load leaves the table (its layout, if any, is in the layout cache)."""
    analysis = key()
    if analysis is not None:
        with _LAYOUT_LOADS_LOCK:
            _LAYOUT_LOADS.pop(analysis, None)


#: Loads of R's layout under way, by analysis object (:func:`start_layout_load`).
_LAYOUT_LOADS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LAYOUT_LOADS_LOCK = threading.Lock()


def _load_stored_layout(analysis):
    """R's layout of ``analysis`` where a file of it exists (mapped, checked), else None."""
    return r_layout(analysis) if rlayout_store.stored(analysis) else None


def _early_layout(early):
    """The layout an early load made, or None where there was none to load or the
    load failed (the worker makes it then)."""
    try:
        return early.result()
    except Exception:  # noqa: BLE001 - the worker builds it as without the early load
        return None


def _warm_from_disk(early, sched, analysis=None) -> bool:
    """Make a one-stage schedule's run a warm one where R's layout came from disk:
    the layout waited for (in memory once loaded) and the stage's records
    materialized (from the schedule store, as the layout's pattern was
    scheduled before), so R's copier runs from the first launch, as in a warm
    call. ``early`` None: a load that ended before the call asked for it (its
    layout in the layout cache of ``analysis``). False (the run stays cold)
    where there was no file or the load failed."""
    lay = _early_layout(early) if early is not None else r_layout_cached(analysis)
    if lay is None:
        return False
    sched.materialize()
    return True


def start_schedule_load(analysis, *, tile: int, bundle: int, pipelining: bool,
                        max_tasks, dense_flops, dense_columns_per_launch: int):
    """Start making the schedule a call of ``analysis`` most likely runs, one
    stage of every front, on a worker thread (``gpuqr-schedule-load``); None
    where the analysis' plan without a memory limit has more than one stage.

    A new process's first call of a pattern an earlier process factorized
    reads that schedule's plan from its file (:func:`~scipy_gpuqr._schedule.
    sparse.build_schedule`: the fingerprint, the file's read and check, its
    decoding) only once CUDA is up and the memory plan made, on the call's
    thread before its first launch. Whether the device's memory holds one
    stage is known only then, but one stage is what a call of a matrix that
    fits runs: started with R's layout's load (:func:`start_layout_load`),
    the read runs while CuPy imports, and the call's own
    :func:`~scipy_gpuqr._schedule.sparse.build_schedule` with the same
    arguments finds the schedule in the scheduler's cache
    (:func:`_factorize` waits for the worker where its plan is this one).
    Only a plan saved before is read (``stored_only``): where there is none,
    or the call's plan turns out to have stages, nothing was built for
    nothing. Arguments as :func:`gpu_factorize`'s with ``max_gpu_memory``
    None.
    """
    plan = analysis.stage_plan(None)
    if len(plan.stages) != 1:
        return None
    return on_worker("gpuqr-schedule-load", lambda: build_schedule(
        analysis, tile=tile, bundle=bundle, pipelining=pipelining, max_gpu_memory=None,
        max_tasks=max_tasks, lazy=True, dense_flops=dense_flops,
        dense_columns_per_launch=dense_columns_per_launch, plan=plan, stored_only=True))


def _factorize(Ac, analysis, device, *, budget, tile, bundle, pipelining, max_tasks,
               dense_flops=None, dense_cpl=DENSE_COLUMNS_PER_LAUNCH, mplan=None, needs=None,
               early=None, dense_extra=(), early_schedule=None, pins=None, mapped=None):
    """One attempt with the stages of ``mplan`` (a
    :class:`~scipy_gpuqr._engine.memory.MemoryPlan`; default
    ``analysis.stage_plan(budget)``): the schedule, R's layout on a worker, the stages.

    ``early``: the future of :func:`start_layout_load` (R's layout of a pattern an
    earlier process factorized, loading from disk), or None. A one-stage schedule
    then runs as in a warm call (:func:`_warm_from_disk`). ``dense_extra``: fronts
    made dense fronts besides ``dense_flops``' choice (:func:`_oversized_dense`).
    ``early_schedule``: the future of :func:`start_schedule_load` (the one-stage
    schedule, made ahead), waited for where this attempt's plan has one stage:
    the schedule built here is then a hit of the scheduler's cache. ``pins``: the
    stage's pinned buffers pinned meanwhile (:class:`~.call_pins.CallPins`), taken
    by the device layer while this attempt runs, or None. ``mapped``: the
    :class:`~.mapped_stage.MappedStage` of ``mplan`` (its one stage's pool mapped chunk by
    chunk), or None.

    Raises
    ------
    DeviceOutOfMemory
        A stage did not fit, or the built schedule needs more than
        ``mplan.available`` (the caller restages).
    """
    t0 = time.perf_counter()
    if early_schedule is not None and (mplan is None or len(mplan.plan.stages) == 1):
        try:
            early_schedule.result()
        except Exception:  # noqa: BLE001 - built below as without the early start
            pass
    # lazy: a schedule built before for this analysis (refactor, a warm call) comes from
    # the scheduler's cache, materialized; a new one is built launch by launch by
    # iter_launches' worker while the GPU runs the launches before.
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_gpu_memory=budget, max_tasks=max_tasks, lazy=True,
                           dense_flops=dense_flops, dense_columns_per_launch=dense_cpl,
                           plan=None if mplan is None else mplan.plan,
                           dense_extra=dense_extra or None)
    keep_last = cache_dense = True
    host_stages = mplan.host_stages() if mplan is not None else {}
    if mplan is not None and mplan.available is not None:
        keep_last, cache_dense = _memory_checks(analysis, sched, mplan, needs,
                                                np.dtype(device.dtype).itemsize,
                                                mapped=None if mapped is None else {0: mapped})
    cold = not all(st.materialized for st in sched.stages)
    if cold and len(sched.stages) == 1:
        cold = not _warm_from_disk(early, sched, analysis)
    t1 = time.perf_counter()
    # R's layout (pattern, gather maps; cached with the analysis) is built on a worker
    # thread while the launches run; a cold schedule is materialized there too, so the
    # next factorization of this analysis finds it ready.
    helper = ThreadPoolExecutor(max_workers=1)
    host_side = helper.submit(_host_side, analysis, sched, [st.fronts for st in sched.stages],
                              cold, early)
    try:
        return _run(Ac, analysis, device, sched, host_side, cold, t0, t1, budget=budget, pins=pins,
                    tile=tile, bundle=bundle, pipelining=pipelining, keep_last=keep_last,
                    cache_dense=cache_dense, host_stages=host_stages, mapped=mapped)
    finally:
        helper.shutdown(wait=True)


def _memory_checks(analysis, sched, mplan, needs, isz: int, mapped=None) -> tuple:
    """``(keep_last, cache_dense)`` for a built schedule under ``mplan.available``.

    Raises :class:`_PlanOver` when the schedule's exact bytes (a stage) or the
    solves' exceed it: Q's replay and R's triangular solves upload what they
    read of one stage's pool at a time (:func:`_stage_upload_elements`) and,
    beside it, one of its dense fronts (sent to the host with it) or the copy
    of its largest triangle of R for cuBLAS. A host
    stage (``mplan.host``) holds nothing on the device, neither while it runs
    nor in the solves (its front's ``Q`` and R are applied on the host).
    ``keep_last``: the last stage's pool stays on the device beside an uploaded
    one; ``cache_dense``: device copies of the dense fronts sent to the host are
    kept once made. ``mapped``: stage → its :class:`~.mapped_stage.MappedStage` (a pool backed
    chunk by chunk, :mod:`~scipy_gpuqr._engine.pool_map`): its mapped bytes
    counted, its pool sent to the host during the stage, the last one's too
    (``keep_last`` False), its solves' uploads those of its replay's parts.
    """
    keep_last = cache_dense = True
    mapped = dict(mapped or {})
    hstage = mplan.host_stages()
    exact = stage_bytes(sched, analysis, needs, isz, host=hstage,
                        mapped={sid: m.peak_bytes for sid, m in mapped.items()})
    fixed = needs.fixed
    if fixed + max(exact, default=0) > mplan.available:
        raise _PlanOver(fixed + max(exact) - mplan.available,
                        f"the schedule's largest stage needs {fixed + max(exact):,} "
                        f"bytes, {mplan.available:,} available")
    if len(sched.stages) < 2 and not mapped:
        return keep_last, cache_dense
    fs = analysis.fronts
    rk = fs.frank.astype(np.int64)
    dense_b = _dense_bytes(analysis, sched, isz)
    base = fixed + solve_bytes(analysis, sched)
    per = []                    # a stage's uploads for the solves, with its largest companion
    for sid, st in enumerate(sched.stages):
        a, b = st.fronts
        if sid in hstage:           # solved and applied on the host
            per.append(0)
            continue
        side = max([dense_b[f] for f in st.dense] + [int((rk[a:b + 1] ** 2).max()) * 8])
        up = (mapped[sid].upload_elements if sid in mapped
              else _stage_upload_elements(fs, st, sched.tile))
        per.append(up * isz + side)
    last_pool = int(sched.stages[-1].pool_size) * isz
    keep_last = (len(sched.stages) - 1 not in hstage and len(sched.stages) - 1 not in mapped
                 and base + last_pool + max(per[:-1], default=0) <= mplan.available)
    solve = base + max(per) if not keep_last else base + last_pool + max(per[:-1])
    if solve > mplan.available:
        raise _PlanOver(solve - mplan.available,
                        f"the solves need {solve:,} bytes, {mplan.available:,} available")
    # dense fronts of stages sent to the host are uploaded for each use, unless
    # their device copies (kept once made) all fit
    hostf = set(hstage.values())
    away = sum(v for f, v in dense_b.items()
               if f not in hostf and not (keep_last and sched.stages[-1].foff[f] >= 0))
    cache_dense = solve + away <= mplan.available
    return keep_last, cache_dense


def _stage_upload_elements(fs, st, tile: int) -> int:
    """Elements the solves upload at once of a stage whose pool left the device:
    ``Q``'s packed reflector pieces (:func:`~.reflector_upload.packed_size_bound`)
    or R's compact rows (:class:`~.trsolve.FrontTriangular`), whichever is
    larger; never more than the pool."""
    a, b = st.fronts
    f = np.arange(a, b + 1)
    f = f[np.asarray(st.foff)[f] >= 0]
    fm, fn, rk = (v[f].astype(np.int64) for v in (fs.fm, fs.fn, fs.frank))
    whole = np.isin(f, np.asarray(list(st.dense), dtype=np.int64))
    refl = packed_size_bound(np.asarray(st.foff)[f], fm, fn, whole, tile)
    return min(int(st.pool_size), max(refl, int((rk * fn).sum())))


def _host_side(analysis, sched, plan_stages, cold, early=None):
    """R's layout, its gather maps for ``plan_stages`` and the future of a fresh copy
    of its pattern (and the records of a cold schedule, for the next
    factorization); on a worker. The copy (nnz(R) row indices) is made on a
    worker of its own: only R's assembly after the launches reads it, while R's
    copy from the device and the engine's thread wait for the rest.
    A cold schedule's records are made on another worker meanwhile (R's
    layout is mostly compiled loops and page faults, the records mostly NumPy).
    ``early``: a layout load already started (:func:`start_layout_load`)."""
    records = on_worker("gpuqr-records", sched.materialize) if cold else None
    lay = _early_layout(early) if early is not None else None
    lay = r_layout(analysis) if lay is None else lay
    maps_ = lay.stage_maps(plan_stages)
    pattern = on_worker("gpuqr-r-pattern", lay.pattern_copy)
    if records is not None:
        records.result()
    return lay, maps_, pattern


def _run(Ac, analysis, device, sched, host_side, cold, t0, t1, *, budget, tile, bundle, pins=None,
         pipelining, keep_last=True, cache_dense=True, host_stages=None, mapped=None):
    """Run every stage on ``device``, then assemble R and the :class:`GpuQR`.

    ``host_side``: the future of :func:`_host_side`; ``t0``/``t1``: start and
    end of the schedule's build (``info["seconds"]``); ``pins``: the device layer's
    pinned buffers for the stages (:class:`~.call_pins.CallPins`), given back after them.
    ``mapped``: the :class:`~.mapped_stage.MappedStage` of a one-stage schedule whose pool is mapped
    chunk by chunk (``Q``'s replay then reads it in its parts).
    """
    m, n = Ac.shape
    dtype = r_dtype(Ac)
    host_stages = dict(host_stages or {})
    if pins is not None:
        device.pinned_ahead = pins
    try:
        loop = StageLoop(Ac, analysis, device, sched, host_side, cold, tile=tile, bundle=bundle,
                         pipelining=pipelining, keep_last=keep_last, host_stages=host_stages,
                         pool_map=None if mapped is None else mapped.pmap)
    except BaseException:
        _pins_done(device, pins)
        raise
    # a pattern's first factorization: Q's replay plan made while the stage runs
    # (read by the first Qᵀb), once R's worker is done
    plan_ahead = (replay_ahead.start(m, n, analysis, sched, host_side, device)
                  if mapped is None and replay_ahead.wanted(device, sched, host_stages)
                  else None)
    try:
        for sid, st in enumerate(sched.stages):
            loop.run_stage(sid, st)
    finally:
        loop.launches.close()       # its record builder let go now, not by the collector
        _pins_done(device, pins)
    t2 = time.perf_counter()
    if loop.layout is None:         # no stage at all
        loop.layout, loop.gmaps, loop.pattern = host_side.result()
    layout = loop.layout
    slots_of = layout.slots_of
    dense = _dense_fronts(sched, loop.dense_parts, slots_of, cache_device=cache_dense,
                          host=set(host_stages.values()))
    fronts = loop.front_list(slots_of)
    launch_base = loop.launch_base
    if mapped is not None:          # Q's replay reads the stage's host pool part by part
        launch_base = list(mapped.parts)
        for p in range(1, len(launch_base)):
            loop.host_pools[p] = loop.host_pools[0]
    qr = GpuQR(shape=(m, n), R=None, colperm=analysis.colperm.astype(np.int64),
               rank=int(min(m, n)), tol=None, flops=float(analysis.flops), info={},
               analysis=analysis, qorder=layout.qorder.copy(), schedule=sched,
               _fronts=fronts, _vt=None, _dense=dense, _device=device,
               _pending=loop.pending, _stage_pools=loop.stage_pools,
               _host_pools=loop.host_pools, _front_loc=loop.front_loc,
               _front_launch=loop.front_launch, _launch_base=launch_base,
               _host_stages=host_stages, _replay_by_launch=mapped is not None)
    if plan_ahead is not None:
        qr._replay["plan_ahead"] = plan_ahead

    def assemble():
        return assemble_r(Ac, layout, loop.r_values(), dtype, loop.pattern.result(),
                          data=loop.r_data)
    if len(sched.stages) > 1 or mapped is not None:
        # Q's first stage (a mapped stage's first part) goes up for the solves (its
        # replay's executor made here) while R is assembled on a worker (mostly
        # compiled scatters and waits): the host's work; the link idle otherwise
        assembly = on_worker("gpuqr-assemble-r", assemble)
        early = gpu_solve.prefetch_first(qr)
        qr.R = assembly.result()
    else:
        early, qr.R = None, assemble()
    t3 = time.perf_counter()
    qr.info = loop.info(budget=budget, dense_fronts=len(dense),
                        seconds={"schedule": t1 - t0, "factorize": t2 - t1,
                                 "assemble_R": t3 - t2})
    qr.info["q_first_stage_early"] = early
    return qr


def _done_result(future):
    """``future``'s result where it is done and did not fail, else None."""
    if future is None or not future.done():
        return None
    try:
        return future.result()
    except Exception:  # noqa: BLE001 - read as without it
        return None


def _pins_done(device, pins) -> None:
    """The layer's pinned buffers of ``pins`` back once its stream is done with
    them; later requests (the solves') pinned as asked."""
    if pins is None:
        return
    if getattr(device, "pinned_ahead", None) is pins:
        device.pinned_ahead = None
    pins.finish(getattr(device, "stream", None))


class _UploadedDense(DenseFront):
    """A dense front left on the host whose device copy is made for each use and
    dropped after it (a staged factorization whose dense fronts' copies would not
    all fit beside the solves)."""

    def _get(self, store, xp):
        if xp is np or xp.__name__ in store:
            return super()._get(store, xp)
        return xp.asarray(next(iter(store.values())))


def _dense_bytes(analysis, sched, itemsize: int) -> dict:
    """Front → device bytes of each dense front (its values and ``T``)."""
    fs = analysis.fronts
    out = {}
    for st in sched.stages:
        for f in st.dense:
            fm, fn = int(fs.fm[f]), int(fs.fn[f])
            npan = -(-min(fm, fn) // 256)
            out[f] = (fm * fn + npan * 256 * 256) * int(itemsize)
    return out


def _dense_fronts(sched, dense_parts, slots_of, *, cache_device: bool = True,
                  host=()) -> dict:
    """``GpuQR._dense``: a :class:`~scipy_gpuqr._engine.dense_front.DenseFront` per
    dense front, with its global launch (checked against the schedule's); without
    ``cache_device`` those left on the host are uploaded per use
    (:class:`_UploadedDense`); host fronts (``host``) are applied on the host
    (:class:`~scipy_gpuqr._engine.dense_front.HostDenseFront`)."""
    launch0 = np.concatenate(([0], np.cumsum([st.nlaunch for st in sched.stages])))
    dense = {}
    for f, (sid, Fv, panels, T) in dense_parts.items():
        Ld = int(launch0[sid]) + sched.stages[sid].dense[f]
        if Ld != sched.dense[f]:
            raise GpuEngineError(f"dense front {f}: launch {Ld} != {sched.dense[f]}")
        kind = DenseFront if cache_device or hasattr(Fv, "get") else _UploadedDense
        if f in host:
            kind = HostDenseFront
        dense[f] = kind(Fv, panels, T, slots=slots_of[f], after_launch=Ld)
        if kind is not HostDenseFront:  # Q on the device reads it in its stage's pool
            dense[f].pool_at = (int(sid), int(sched.stages[sid].foff[f]))
    return dense
