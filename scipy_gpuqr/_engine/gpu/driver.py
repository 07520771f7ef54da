"""The GPU engine: sparse multifrontal QR through the uberkernel (``backend='gpu'``).

The sparse scheduler (:func:`scipy_gpuqr._schedule.sparse.build_schedule`)
turns the analysis into task lists, stage by stage; the device layer
(:mod:`.gpu_device`) runs every launch of a stage on the GPU over one front
pool (CuPy memory pool), with the stage's S entries, the maps (uploaded once)
and the VT pool of the whole factorization. Per stage, R's values come back
gathered in CSC order through a pinned staging buffer reused per R layout
(:mod:`.gpu_rcopy`; warm one-stage runs copy each final column range while
later launches run), contribution blocks of fronts whose parent sits in a
later stage in one gathered transfer; the stage's pool is then copied
to the host (earlier stages, to free device memory) or kept on the GPU (the
last stage) for ``Q``. Contribution blocks cross stages through host memory.

Faults: a CUDA error or a non-finite value in a front pool after a stage
(A is checked finite first) raises :class:`GpuEngineError`, never a silently
wrong R; device out of memory restages with half the budget (down to
single-front stages) and then falls back to the reference engine with a
warning. ``debug`` (``GpuqrOptions.debug`` / ``SCIPY_GPUQR_DEBUG=1``)
synchronizes and checks after every launch.

Dense fronts (:mod:`scipy_gpuqr._schedule.dense`: the largest fronts, chosen
from the analysis) are assembled by the launches but factorized by a blocked
Householder QR through cuSOLVER/cuBLAS (:mod:`.dense_front`) on the same
stream, right after the launch that completes their assembly; their
Householder data stay on the device (``GpuQR._dense``).

``Q`` is applied on the GPU from the kept reflectors (:mod:`.gpu_solve`);
without a CUDA device it is replayed on the host
(:class:`~scipy_gpuqr._engine.host.simulate.SimulateQR`).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..._schedule.dense import DEFAULT_DENSE_FLOPS, DENSE_COLUMNS_PER_LAUNCH
from ..._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE, TaskType
from .device import CupyDevice, DeviceOutOfMemory, GpuEngineError
from ..host.simulate import SimulateQR

__all__ = ["gpu_factorize", "GpuQR", "GpuEngineError"]

_log = logging.getLogger("scipy_gpuqr")

#: Restaging attempts after device out-of-memory before the CPU fallback.
MAX_RESTAGE = 6


@dataclass
class GpuQR(SimulateQR):
    """Result of :func:`gpu_factorize` (a :class:`~scipy_gpuqr._factor.numeric.NumericQR`).

    ``R``, ``colperm`` and ``info`` are on the host. The Householder data
    (front pools and VT tiles) stay where the factorization left them.

    On a CUDA device ``qt_matmul``/``q_matmul`` run there
    (:mod:`.gpu_solve`: the kept reflectors replayed by
    ``kernels/gpuqr_applyq.cu``, level by level; NumPy in → NumPy out, CuPy
    in → CuPy out); earlier stages' pools are uploaded for their levels.
    Without one (the NumPy device layer), or when the device replay runs out
    of memory, the reflectors are replayed on the host after fetching the
    fronts (:class:`~scipy_gpuqr._engine.host.simulate.SimulateQR`).

    Launch indices (``_front_launch``, ``_dense[f].after_launch``) are global:
    the launches of earlier stages plus the launch index in the stage.
    ``_dense`` (front → object with ``slots``, ``after_launch``,
    ``apply_qt(Y)``, ``apply_q(Y)``) holds fronts factorized outside the task
    lists; both replays honour it.
    """

    _pending: dict = field(default_factory=dict, repr=False)
    _device: object = field(default=None, repr=False)
    _host_pools: dict = field(default_factory=dict, repr=False)
    _front_loc: list = field(default_factory=list, repr=False)
    _front_launch: list = field(default_factory=list, repr=False)
    _launch_base: list = field(default_factory=list, repr=False)
    _dense: dict = field(default_factory=dict, repr=False)
    _replay: dict = field(default_factory=dict, repr=False)

    def on_device(self) -> bool:
        """True when Q is applied on a CUDA device (the factorization's)."""
        return (getattr(self._device, "cp", None) is not None
                and getattr(self._device, "vt", None) is not None)

    def _materialize(self) -> None:
        if self._device is None and self._vt is None:
            raise RuntimeError("the factorization was freed")
        if self._vt is None:
            self._vt = self._device.vt_host()
        if self._pending:
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

    def qt_matmul(self, B):
        from . import solve as gpu_solve
        if self.on_device():
            return gpu_solve.device_matmul(self, B, trans=True)
        self._materialize()
        return gpu_solve.host_matmul(self, B, trans=True)

    def q_matmul(self, Y):
        from . import solve as gpu_solve
        if self.on_device():
            return gpu_solve.device_matmul(self, Y, trans=False)
        self._materialize()
        return gpu_solve.host_matmul(self, Y, trans=False)

    def free(self) -> None:
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


def _default_budget(device) -> int | None:
    """Free device memory minus a margin (None for the NumPy device)."""
    cp = getattr(device, "cp", None)
    if cp is None:
        return None
    free, _ = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(0.85 * (free + pool.free_bytes()))


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
        apply SuiteSparseQR's rule to R on the GPU
        (:mod:`scipy_gpuqr._factor.rank_refine`).
    max_gpu_memory : int, optional
        Byte budget of the staging plan (default: 85 % of the free device
        memory). Small values force many stages.
    tile, bundle, pipelining, max_tasks
        Scheduler tunables (an uberkernel variant must exist for tile/bundle).
    debug : bool, optional
        Synchronize and check after every launch (default: ``SCIPY_GPUQR_DEBUG``).
    device : object, optional
        A device layer (:class:`~.gpu_device.NumpyDevice` runs the host logic
        without a GPU); default the CUDA device.
    fallback : bool
        After repeated device out-of-memory, fall back to the reference engine
        with a warning (False: raise MemoryError).
    dense_flops : float or None
        Fronts of at least this many Householder flops are dense fronts
        (blocked QR through cuSOLVER/cuBLAS instead of tile tasks; see
        :mod:`scipy_gpuqr._schedule.dense`); None: none.
    dense_columns_per_launch : int
        A dense front runs on a side stream while the launches go on; its
        parent's pack waits one launch per this many of its columns (0: the
        next launch waits for it).

    Returns
    -------
    GpuQR
        ``info["launches"]`` counts every launch of the schedule (the global
        launch numbering of ``Q``'s replay), the empty ones a dense front
        defers its parent's pack by included; ``info["launches_with_tasks"]``
        those that run the uberkernel.
    """
    from ..._symbolic import analyze
    from ..inputs import engine_csc

    t_start = time.perf_counter()
    Ac = engine_csc(A, "gpu_factorize")
    from ..host.reference import answer_with_rank_detection
    out = answer_with_rank_detection(Ac, analysis, tol, max_gpu_memory, "gpu")
    if out is not None:
        return out
    if analysis is None:
        analysis = analyze(Ac)
    elif not analysis.matches_pattern(Ac):
        raise ValueError("gpu_factorize: the analysis was made for another pattern")
    debug = _debug_default() if debug is None else bool(debug)
    dev_dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    if device is None:
        from ..._gpu import gpu_info
        gi = gpu_info()
        if not gi.get("available"):
            return _no_gpu(Ac, analysis, f"no usable GPU ({gi.get('reason', '?')})")
        device = CupyDevice(tile, bundle, dtype=dev_dtype, debug=debug)
    budget = max_gpu_memory if max_gpu_memory is not None else _default_budget(device)
    t_an = time.perf_counter()
    last_exc = None
    for attempt in range(MAX_RESTAGE + 1):
        try:
            out = _factorize(Ac, analysis, device, budget=budget, tile=tile, bundle=bundle,
                             pipelining=pipelining, max_tasks=max_tasks,
                             dense_flops=dense_flops,
                             dense_cpl=dense_columns_per_launch)
        except DeviceOutOfMemory as exc:
            last_exc = exc
            _free_device_pools(device)
            plan = analysis.stage_plan(budget)
            biggest = max(plan.stage_bytes) if plan.stage_bytes else 0
            if plan.oversized or len(plan.stages) >= analysis.fronts.nfronts:
                break
            budget = int(max(biggest, 1) // 2)
            _log.info("GPU out of memory (%s): restaging with %d bytes", exc, budget)
            continue
        out.info["restaged"] = attempt
        out.info["seconds"]["total"] = time.perf_counter() - t_start
        out.info["seconds"]["validate"] = t_an - t_start
        return out
    msg = f"the GPU ran out of memory even with small stages ({last_exc})"
    if not fallback:
        raise MemoryError(msg)
    from ..host.reference import reference_factorize
    warnings.warn(msg + "; falling back to the reference CPU engine", RuntimeWarning,
                  stacklevel=2)
    out = reference_factorize(Ac, analysis, tol=None)
    out.info["requested_backend"] = "gpu"
    out.info["fallback"] = msg
    return out


def _no_gpu(Ac, analysis, why):
    """The reference engine answers, with a GpuFallbackWarning (never silently)."""
    from ..._dispatch.plan import GpuFallbackWarning
    from ..host.reference import reference_factorize
    warnings.warn(f"backend 'gpu': {why}; the reference CPU engine answers",
                  GpuFallbackWarning, stacklevel=3)
    out = reference_factorize(Ac, analysis, tol=None)
    out.info["requested_backend"] = "gpu"
    out.info["fallback"] = why
    return out


def _free_device_pools(device) -> None:
    cp = getattr(device, "cp", None)
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()


def _factorize(Ac, analysis, device, *, budget, tile, bundle, pipelining, max_tasks,
               dense_flops=None, dense_cpl=DENSE_COLUMNS_PER_LAUNCH):
    from concurrent.futures import ThreadPoolExecutor

    from ..._schedule.sparse import build_schedule
    from .rlayout import r_layout

    t0 = time.perf_counter()
    # lazy: a schedule built before for this analysis (refactor, a warm call) comes from
    # the scheduler's cache, materialized; a new one is built launch by launch by
    # iter_launches' worker while the GPU runs the launches before.
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_gpu_memory=budget, max_tasks=max_tasks, lazy=True,
                           dense_flops=dense_flops, dense_columns_per_launch=dense_cpl)
    cold = not all(st.materialized for st in sched.stages)
    t1 = time.perf_counter()
    # R's layout (pattern, gather maps; cached with the analysis) is built on a worker
    # thread while the launches run; a cold schedule is materialized there too, so the
    # next factorization of this analysis finds it ready.
    helper = ThreadPoolExecutor(max_workers=1)
    plan_stages = [st.fronts for st in sched.stages]

    def _host_side():
        lay = r_layout(analysis)
        maps_ = lay.stage_maps(plan_stages)
        pattern = lay.pattern_copy()
        if cold:
            sched.materialize()
        return lay, maps_, pattern
    fut = helper.submit(_host_side)
    try:
        return _run(Ac, analysis, device, sched, fut, cold, t0, t1, budget, tile, bundle,
                    pipelining)
    finally:
        helper.shutdown(wait=True)


def _run(Ac, analysis, device, sched, fut, cold, t0, t1, budget, tile, bundle, pipelining):
    from .rcopy import final_entries_cached
    from .rlayout import r_layout_cached

    m, n = Ac.shape
    fs = analysis.fronts
    nf = fs.nfronts
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    vals = Ac.data.astype(device.dtype)[fs.s_nz]
    maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
    device.start(maps, sched.vt_size)
    fm_a, fn_a = fs.fm.astype(np.int64), fs.fn.astype(np.int64)
    host_cb = {}
    front_tasks = [None] * nf
    front_launch = [None] * nf      # global launch index of each kept record (Q on the GPU)
    front_loc = [None] * nf         # front -> (stage, offset) in its stage's pool
    launch_base = []                # first global launch index of each stage
    pending = {}                    # front -> (stage, offset, size) in a device pool
    stage_pools = {}
    host_pools = {}
    nstage = len(sched.stages)
    launches = sched.iter_launches(prefetch=cold)
    fac_types = (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE)
    layout = gmaps = None
    t_wait_host = 0.0
    r_parts = []
    # a warm one-stage run copies R's final columns while later launches run
    # (R's layout and the schedule's records known before the first launch)
    warm = r_layout_cached(analysis) if (nstage == 1 and not cold) else None
    plan_stages = [st.fronts for st in sched.stages]
    fkey = (tuple(plan_stages), int(tile), int(bundle), bool(pipelining), sched.ntasks,
            sched.dense_flops)
    stair_ptr = fs.col_ptr
    dense_parts = {}                # front -> (stage, front view, panels, T)
    progressive = 0
    t_r_wait = 0.0
    for sid, st in enumerate(sched.stages):
        first, last = st.fronts
        carried = [(off, host_cb.pop(c)) for c, off in st.carried.items()]
        s0, s1 = st.s_range
        h = device.begin_stage(st, fs.s_index[s0:s1], vals[s0:s1], carried)
        fac_parts = []
        fac_launch = []
        launch_base.append(int(sum(s_.nlaunch for s_ in sched.stages[:sid])))
        copier = None
        dense_at, join_at = {}, {}
        for f, Ld in st.dense.items():
            dense_at.setdefault(Ld, []).append(f)
        if warm is not None:
            pos, gidx = warm.stage_maps(plan_stages)[sid]

            def _final(st=st, lay=warm):
                return final_entries_cached(analysis, lay, sched, st, tile, fkey)
            copier = device.open_r_copy(h["pool"], gidx, warm, final=_final)
            progressive += 1
        try:
            for _ in range(st.nlaunch):
                i, L, rec = next(launches)
                if i != sid:
                    raise GpuEngineError(f"launch {L} of stage {i} yielded in stage {sid}")
                for done in join_at.pop(L, ()):     # its parent packs it now
                    device.dense_join(h, done)
                device.launch(h, L, rec)
                for f in dense_at.get(L, ()):       # assembled by launch L: factorize now
                    Fv, panels, T, done = device.dense_factorize(
                        h, int(st.foff[f]), int(fs.fm[f]), int(fs.fn[f]),
                        fs.stair[stair_ptr[f]:stair_ptr[f + 1]])
                    dense_parts[f] = (sid, Fv, panels, T)
                    join_at.setdefault(min(st.dense_join[f], st.nlaunch), []).append(done)
                if L == st.nlaunch - 1:             # the stage ends with every dense front
                    for done in join_at.pop(st.nlaunch, ()):
                        device.dense_join(h, done)
                if copier is not None:
                    copier.after_launch(L)
                if cold and len(rec):
                    sel = np.isin(rec["type"], fac_types)
                    if sel.any():
                        fac_parts.append(rec[sel])
                        fac_launch.append(np.full(int(sel.sum()), launch_base[-1] + L))
            device.mark_kernels_end(h)
            if layout is None:      # the host side overlaps the launches just enqueued
                tw = time.perf_counter()
                layout, gmaps, pattern = fut.result()
                t_wait_host += time.perf_counter() - tw
            if copier is None:
                pos, gidx = gmaps[sid]
                copier = device.open_r_copy(h["pool"], gidx, layout)
            copier.launches_done()
            pool = device.end_stage(h)
        except BaseException:
            if copier is not None:
                copier.abort()
            raise
        tw = time.perf_counter()
        r_parts.append((pos, copier.result()))
        t_r_wait += time.perf_counter() - tw
        del copier
        members = np.arange(first, last + 1)
        foff = st.foff[members]
        par = fs.parent[members]
        later = np.flatnonzero((par >= 0) & (par > last))
        if len(later):
            rk, fnm = fs.frank[members].astype(np.int64), fn_a[members]
            cmm = fs.cm[members].astype(np.int64)
            segs = [(int(foff[i] + rk[i] * fnm[i]), int(cmm[i] * fnm[i])) for i in later]
            host = device.fetch(pool, segs)
            p = 0
            for j, i in enumerate(later.tolist()):
                f = first + i
                size = segs[j][1]
                blk = host[p: p + size].reshape(int(fs.cm[f]), int(fs.fn[f]))[:, int(fs.fp[f]):]
                host_cb[f] = np.triu(blk)
                p += size
        # Factorize / Apply+Factorize records of each front (Q's replay)
        if cold:
            allf = np.concatenate(fac_parts) if fac_parts else st.tasks[:0]
            alll = np.concatenate(fac_launch) if fac_launch else np.zeros(0, np.int64)
        else:
            t = st.tasks
            kk = np.flatnonzero(np.isin(t["type"], fac_types))
            allf = t[kk]
            alll = launch_base[-1] + np.searchsorted(st.launch_ptr, kk, side="right") - 1
        order = np.argsort(allf["front"], kind="stable")
        allf = allf[order]
        alll = np.asarray(alll, dtype=np.int64)[order]
        allf["F"] = 0
        cnt = np.bincount(allf["front"] - first, minlength=last - first + 1)
        ptr = np.concatenate(([0], np.cumsum(cnt)))
        fmm = fm_a[members]
        for i, f in enumerate(members.tolist()):
            front_tasks[f] = allf[ptr[i]:ptr[i + 1]]
            front_launch[f] = alll[ptr[i]:ptr[i + 1]]
            front_loc[f] = (sid, int(foff[i]))
            pending[f] = (sid, int(foff[i]), int(fmm[i] * fn_a[f]))
        if sid + 1 < nstage:
            host_pools[sid] = device.to_host(pool)
            for f, (s_, Fv, panels, T) in list(dense_parts.items()):
                if s_ == sid:           # the stage's pool leaves the device
                    off, size = int(st.foff[f]), int(fs.fm[f] * fs.fn[f])
                    Th = T.get() if hasattr(T, "get") else T
                    dense_parts[f] = (s_, host_pools[sid][off: off + size].reshape(Fv.shape),
                                      panels, Th)
            device.release(pool)
        else:
            stage_pools[sid] = pool
    t2 = time.perf_counter()
    if layout is None:              # no stage at all
        layout, gmaps, pattern = fut.result()
    R = _assemble_R(Ac, layout, r_parts, dtype, pattern)
    t3 = time.perf_counter()
    slots_of = layout.slots_of
    from ..dense_front import DenseFront
    launch0 = np.concatenate(([0], np.cumsum([st.nlaunch for st in sched.stages])))
    dense = {}
    for f, (sid, Fv, panels, T) in dense_parts.items():
        Ld = int(launch0[sid]) + sched.stages[sid].dense[f]
        if Ld != sched.dense[f]:
            raise GpuEngineError(f"dense front {f}: launch {Ld} != {sched.dense[f]}")
        dense[f] = DenseFront(Fv, panels, T, slots=slots_of[f], after_launch=Ld)
    # fronts of earlier stages are on the host already
    fronts = []
    for f in range(nf):
        sid, off, size = pending[f]
        if sid in host_pools:
            fronts.append((slots_of[f], host_pools[sid][off: off + size], front_tasks[f]))
            del pending[f]
        else:
            fronts.append((slots_of[f], None, front_tasks[f]))
    dev_s = dict(device.seconds)
    info = {"backend": "gpu", "device": getattr(device, "name", "?"),
            "ordering": analysis.ordering_used, "nfronts": int(nf),
            "stages": nstage, "launches": int(sched.nlaunch),
            "launches_with_tasks": int(sched.nlaunch_with_tasks), "tasks": int(sched.ntasks),
            "tile": int(tile), "bundle": int(bundle), "pipelining": bool(pipelining),
            "budget": budget, "schedule_cold": bool(cold),
            "dense_fronts": len(dense), "dense_flops": sched.dense_flops,
            "seconds": {"schedule": t1 - t0, "factorize": t2 - t1, "assemble_R": t3 - t2,
                        "wait_host_side": t_wait_host,
                        "gpu_kernels": dev_s.get("kernels", 0.0),
                        "upload": dev_s.get("upload", 0.0),
                        "upload_gather": dev_s.get("upload_gather", 0.0),
                        "download": dev_s.get("download", 0.0),
                        "launch_loop": dev_s.get("launch_loop", 0.0),
                        "wait_gpu": dev_s.get("wait", 0.0),
                        "wait_r_copy": t_r_wait},
            "r_copy_progressive": bool(progressive)}
    out = GpuQR(shape=(m, n), R=R, colperm=analysis.colperm.astype(np.int64),
                rank=int(min(m, n)), tol=None, flops=float(analysis.flops), info=info,
                analysis=analysis, qorder=layout.qorder.copy(), schedule=sched,
                _fronts=fronts, _vt=None, _pending=pending, _device=device, _dense=dense)
    out._stage_pools = stage_pools
    out._host_pools = host_pools
    out._front_loc = front_loc
    out._front_launch = front_launch
    out._launch_base = launch_base
    return out


def _assemble_R(Ac, layout, r_parts, dtype, pattern):
    """R (rows keyed by pivot column, as the reference) from the gathered values.

    ``r_parts``: per stage ``(pos, values)`` in R's CSC order (see
    :mod:`.gpu_rlayout`); the singleton rows' values come from A.
    """
    if len(r_parts) == 1 and r_parts[0][0] is None:
        data = r_parts[0][1]    # every entry, singleton rows' placeholders included
        if data.dtype != dtype:
            data = data.astype(dtype)
        if len(layout.r1_pos):
            data[layout.r1_pos] = Ac.data[layout.r1_nz]
    else:
        data = np.zeros(layout.nnz, dtype=dtype)
        for pos, v in r_parts:
            if pos is None:
                data[:len(v)] = v
            else:
                data[pos] = v
        if len(layout.r1_pos):
            data[layout.r1_pos] = Ac.data[layout.r1_nz]
    return layout.csc(data, pattern)
