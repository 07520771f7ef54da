"""Sparse QR over the GPUs of one host: subtrees on devices, contribution blocks peer to peer.

The device plan (:func:`scipy_gpuqr._schedule.devices.map_devices`) maps
independent subtrees of the front tree to devices by proportional mapping on
the analysis' flops (and bytes); its stages are postorder runs of one device,
so the sparse scheduler builds their task lists unchanged
(:func:`~scipy_gpuqr._schedule.sparse.build_schedule` with the plan's
stages). Each device has its own device layer (:class:`~.device.CupyDevice`
made under ``cupy.cuda.Device(i)``: its stream, uberkernel handle, maps, VT
pool and memory pool), and runs the per-stage calls of the one-GPU engine
(``begin_stage``, ``launch``, ``dense_factorize``, ``end_stage``, R's
copy). Every stage stays on its device: nothing is staged through the host.

The stages are enqueued on their devices' streams without waiting (each
device takes its stages in postorder; the devices take turns of a few
launches, so a full launch queue on one never starves another): the devices
run concurrently. A stage's carried contribution blocks
come from the end of an earlier stage: cut (upper trapezoidal, packed) on
the source device's stream, an event recorded there, the target's stream
waits for it and copies the block into the stage's pool, peer to peer
(``cudaMemcpyPeerAsync``) between devices, a device copy within one. Only
after every stage is enqueued are the stages waited for and checked, and R's
values gathered.

``Q`` and the solves run on the first device of the list (the one of the
roots): the other devices' VT tiles are copied into its VT pool, and their
front pools are read where they lie (peer access) when the devices can
reach each other, else fetched to the host (uploaded level by level by the
replay, as for staged one-GPU factorizations); dense fronts factorized on
another GPU (and their ``T``) are copied to it, since their products run
through cuBLAS there.

Several layers may share one physical GPU (``devices=[0, 0]``): each has
its own streams, so the multi-device path runs, and is tested, on one GPU;
with :class:`~.device.NumpyDevice` layers it runs on the host (CI).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ... import _gpu
from ..._errors import DeviceOutOfMemory, GpuEngineError
from ..._schedule.dense import DEFAULT_DENSE_FLOPS, DENSE_COLUMNS_PER_LAUNCH
from ..._schedule.devices import DevicePlan, map_devices
from ..._schedule.sparse import build_schedule
from ..._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE, TaskType
from ..dense_front import DenseFront
from ..host.reference import task_list_input
from . import driver
from .device import CupyDevice
from .rlayout import r_layout

__all__ = ["multi_gpu_factorize", "cupy_layers", "device_count"]

_log = logging.getLogger("scipy_gpuqr")

_FACTORIZE_TYPES = (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE)

#: ``cudaMemcpyDeviceToDevice``
_D2D = 3

#: Launches one device enqueues before the next device's turn.
LAUNCHES_PER_TURN = 8


def device_count() -> int:
    """CUDA devices visible to the process (0 without CuPy or a driver)."""
    if not _gpu.gpu_info().get("available"):
        return 0
    cp = _gpu.import_cupy()
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:                           # noqa: BLE001 - no driver: no device
        return 0


def cupy_layers(devices, *, tile: int = DEFAULT_TILE, bundle: int = DEFAULT_BUNDLE,
                dtype=np.float64, debug: bool = False, profile: bool = False) -> list:
    """One :class:`~.device.CupyDevice` per entry of ``devices`` (CUDA device ids;
    repeats give several layers on one GPU), each made under its device."""
    cp = _gpu.import_cupy()
    out = []
    for d in devices:
        with cp.cuda.Device(int(d)):
            out.append(CupyDevice(tile, bundle, dtype=dtype, debug=debug, profile=profile))
    return out


def _on(layer):
    """Context making the layer's GPU current (nothing for a NumPy layer)."""
    cp = getattr(layer, "cp", None)
    if cp is None:
        return contextlib.nullcontext()
    return cp.cuda.Device(layer.device_id)


def _available(layer) -> int | None:
    """Bytes the layer's device may use now (None: no limit known)."""
    memory = getattr(layer, "memory", None)
    if callable(memory):
        return memory().available
    cp = getattr(layer, "cp", None)
    if cp is None:
        return None
    free, _ = cp.cuda.runtime.memGetInfo()
    return int(0.85 * (free + cp.get_default_memory_pool().free_bytes()))


def _budget(layers) -> int | None:
    """The smallest budget of the layers' devices (None for NumPy layers)."""
    out = None
    for layer in layers:
        with _on(layer):
            b = _available(layer)
        if b is not None:
            out = b if out is None else min(out, b)
    return out


def _debug_default() -> bool:
    return os.environ.get("SCIPY_GPUQR_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


class _Transfers:
    """Contribution blocks cut at the end of a stage, and their copies into later stages."""

    def __init__(self):
        self.blocks = {}            # front -> (buffer, event, source layer index)
        self.keep = []              # buffers held until the factorization ends
        self.log = []               # (child, source, target, bytes)

    def cut(self, k, layer, pool, base, cm, fn, fp):
        """Front's block ``pool[base:].reshape(cm, fn)[:, fp:]``, upper trapezoidal, packed."""
        cp = getattr(layer, "cp", None)
        if cp is None:
            return np.triu(pool[base: base + cm * fn].reshape(cm, fn)[:, fp:]).copy(), None
        try:
            with layer.stream:
                buf = cp.triu(pool[base: base + cm * fn].reshape(cm, fn)[:, fp:])
                buf = cp.ascontiguousarray(buf)
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(layer.stream)
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(str(exc)) from exc
        return buf, ev

    def put(self, c, k, layer, pool, base, cm, fn, fp):
        buf, ev = self.cut(k, layer, pool, base, cm, fn, fp)
        self.blocks[c] = (buf, ev, k)

    def into(self, c, k, layer, pool, off, layers):
        """Block of front ``c`` into ``pool[off:]`` on layer ``k`` (after its cut)."""
        buf, ev, src = self.blocks.pop(c)
        n = int(buf.size)
        if src != k:
            self.log.append((int(c), int(src), int(k), n * buf.itemsize))
        cp = getattr(layer, "cp", None)
        if cp is None:
            pool[off: off + n] = buf.ravel()
            return
        self.keep.append(buf)
        if n == 0:
            return
        layer.stream.wait_event(ev)
        dst = pool.data.ptr + off * pool.itemsize
        s_id, d_id = layers[src].device_id, layer.device_id
        if s_id == d_id:
            cp.cuda.runtime.memcpyAsync(dst, buf.data.ptr, n * buf.itemsize, _D2D,
                                        layer.stream.ptr)
        else:
            cp.cuda.runtime.memcpyPeerAsync(dst, d_id, buf.data.ptr, s_id, n * buf.itemsize,
                                            layer.stream.ptr)


def multi_gpu_factorize(A, analysis=None, *, devices=(0, 1), layers=None, tol=None,
                        max_gpu_memory: int | None = None, tile: int = DEFAULT_TILE,
                        bundle: int = DEFAULT_BUNDLE, pipelining: bool = True,
                        max_tasks: int | None = None, debug: bool | None = None,
                        profile: bool = False, fallback: bool = True,
                        dense_flops: float | None = DEFAULT_DENSE_FLOPS,
                        dense_columns_per_launch: int = DENSE_COLUMNS_PER_LAUNCH):
    """Sparse QR ``A[:, colperm] = Q @ R`` over several GPUs of one host.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` (computed when None).
    devices : sequence of int or DevicePlan
        CUDA device ids (the first runs the roots and keeps ``Q``: apply
        ``Q`` and solve with it current, as with the one-GPU engine's device;
        repeats: several devices simulated on one GPU), or a plan for
        ``layers``.
    layers : list, optional
        Device layers instead of ``devices`` (e.g.
        :class:`~.device.NumpyDevice` objects: the host logic without a GPU).
    tol : None, 'default' or float
        As :func:`~.driver.gpu_factorize`.
    max_gpu_memory : int, optional
        Bytes each device may hold (default: 85 % of the free memory of the
        device with least).
    tile, bundle, pipelining, max_tasks, dense_flops, dense_columns_per_launch
        As :func:`~.driver.gpu_factorize`.
    debug : bool, optional
        Synchronize and check after every launch.
    profile : bool
        Event pairs around every launch (CUDA layers).
    fallback : bool
        When a device runs out of memory, factorize on the first device alone
        (the one-GPU engine restages) with a warning; False: raise MemoryError.

    Returns
    -------
    GpuQR
        ``info["devices"]``: the plan (:meth:`~scipy_gpuqr._schedule.devices.DevicePlan.as_dict`)
        and per device its id, name, stages, launches and busy seconds (its
        stages' kernels, from events after the carried blocks arrived);
        ``info["transfers"]``: every contribution block moved between
        devices ``(child, source, target, bytes)``.
    """
    t_start = time.perf_counter()
    Ac, analysis, out = task_list_input(A, analysis, tol, max_gpu_memory, "gpu",
                                        "multi_gpu_factorize")
    if out is not None:
        return out
    debug = _debug_default() if debug is None else bool(debug)
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    given_plan = devices if isinstance(devices, DevicePlan) else None
    one_gpu = dict(tile=tile, bundle=bundle, pipelining=pipelining, max_tasks=max_tasks,
                   debug=debug, dense_flops=dense_flops,
                   dense_columns_per_launch=dense_columns_per_launch)
    if layers is None:
        if not _gpu.gpu_info().get("available"):     # the one-GPU engine's fallback, warned
            return driver.gpu_factorize(Ac, analysis, **one_gpu)
        ids = [int(d) for d in devices]
        layers = cupy_layers(ids, tile=tile, bundle=bundle, dtype=dtype, debug=debug,
                             profile=profile)
    budget = max_gpu_memory if max_gpu_memory is not None else _budget(layers)
    plan = given_plan or map_devices(analysis, len(layers), device_memory=budget)
    if plan.ndevices != len(layers):
        raise ValueError(f"a plan of {plan.ndevices} devices for {len(layers)} layers")
    if not plan.fits:
        _log.info("multi-GPU plan exceeds %s bytes on a device: %s", budget,
                  plan.device_bytes.tolist())
    try:
        out = _run(Ac, analysis, plan, layers, tile=tile, bundle=bundle,
                   pipelining=pipelining, max_tasks=max_tasks, dense_flops=dense_flops,
                   dense_cpl=dense_columns_per_launch, dtype=dtype, t_start=t_start)
    except DeviceOutOfMemory as exc:
        for layer in layers:
            with _on(layer):
                layer.close()
                cp = getattr(layer, "cp", None)
                if cp is not None:
                    cp.get_default_memory_pool().free_all_blocks()
        msg = f"a device ran out of memory across {len(layers)} devices ({exc})"
        if not fallback:
            raise MemoryError(msg) from exc
        warnings.warn(msg + "; factorizing on the first device alone", RuntimeWarning,
                      stacklevel=2)
        with _on(layers[0]):         # its layer again (a fresh start), staged as it needs
            out = driver.gpu_factorize(Ac, analysis, device=layers[0], **one_gpu)
        out.info["multi_device_fallback"] = msg
        return out
    out.info["budget"] = budget
    return out


def _run(Ac, analysis, plan, layers, *, tile, bundle, pipelining, max_tasks, dense_flops,
         dense_cpl, dtype, t_start):
    t0 = time.perf_counter()
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_tasks=max_tasks, plan=plan.stage_plan(),
                           dense_flops=dense_flops, dense_columns_per_launch=dense_cpl)
    t1 = time.perf_counter()
    helper = ThreadPoolExecutor(max_workers=1)
    try:
        host_side = helper.submit(_host_side, analysis, [st.fronts for st in sched.stages])
        run = _MultiStageRun(Ac, analysis, plan, layers, sched)
        run.enqueue_all()
        t_enq = time.perf_counter()
        run.finish()
        t2 = time.perf_counter()
        layout, gmaps, pattern = host_side.result()
    finally:
        helper.shutdown(wait=True)
    r_parts = run.gather_r(layout, gmaps)
    R = driver._assemble_R(Ac, layout, r_parts, dtype, pattern)
    t3 = time.perf_counter()
    return run.result(Ac, layout, R, seconds={
        "schedule": t1 - t0, "enqueue": t_enq - t1, "factorize": t2 - t1,
        "assemble_R": t3 - t2, "total": t3 - t_start})


def _host_side(analysis, plan_stages):
    lay = r_layout(analysis)
    return lay, lay.stage_maps(plan_stages), lay.pattern_copy()


def _to_home(arr, home):
    """``arr`` (a CuPy array) on the home layer's device: itself, or a peer copy."""
    cp = home.cp
    src = arr.data.device_id
    if src == home.device_id:
        return arr
    with cp.cuda.Device(src):
        arr = cp.ascontiguousarray(arr)
        cp.cuda.Device(src).synchronize()
    with cp.cuda.Device(home.device_id):
        out = cp.empty(arr.shape, dtype=arr.dtype)
        cp.cuda.runtime.memcpyPeer(out.data.ptr, home.device_id, arr.data.ptr, src,
                                   arr.nbytes)
    _settle(cp, (src, home.device_id))
    return out


def _settle(cp, device_ids) -> None:
    """Wait for the copies issued on the legacy default stream of these devices.

    ``cudaMemcpy``/``cudaMemcpyPeer`` between device buffers may return before
    the copy is done, and the layers' streams are non-blocking (not ordered
    after the default stream): work enqueued on them later must not read the
    destination before this returns.
    """
    for d in dict.fromkeys(int(i) for i in device_ids):
        with cp.cuda.Device(d):
            cp.cuda.Device(d).synchronize()


class _MultiStageRun:
    """The stages of one factorization on their devices, and what they leave for R and Q."""

    def __init__(self, Ac, analysis, plan, layers, sched):
        fs = analysis.fronts
        self.analysis, self.fs, self.plan, self.layers, self.sched = (analysis, fs, plan,
                                                                     layers, sched)
        self.vals = Ac.data.astype(layers[0].dtype)[fs.s_nz]
        maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
        for layer in layers:
            with _on(layer):
                layer.start(maps, sched.vt_size)
        self.xfer = _Transfers()
        self.handles = {}
        self.pools = {}
        self.dense_parts = {}
        self.launch_base = np.concatenate(
            ([0], np.cumsum([st.nlaunch for st in sched.stages]))).astype(np.int64)
        self.busy = [0.0] * len(layers)
        self.launches = [0] * len(layers)

    def layer_of(self, sid):
        k = int(self.plan.stage_device[sid])
        return k, self.layers[k]

    def enqueue_all(self) -> None:
        """Every stage on its device's stream, nothing waited for.

        Each device takes its stages in postorder, a stage once every block it
        carries has been cut; the devices take turns, :data:`LAUNCHES_PER_TURN`
        launches each, so that a full launch queue of one device (the host
        then blocks in the launch) never leaves another without work.
        """
        nd = len(self.layers)
        todo = [list(self.plan.device_stages(k)) for k in range(nd)]
        active = [None] * nd
        while any(todo) or any(a is not None for a in active):
            moved = False
            for k, layer in enumerate(self.layers):
                if active[k] is None and todo[k]:
                    st = self.sched.stages[todo[k][0]]
                    if all(c in self.xfer.blocks for c in st.carried):
                        sid = todo[k].pop(0)
                        active[k] = self._stage(sid, st, k, layer)
                if active[k] is None:
                    continue
                moved = True
                with _on(layer):
                    for _ in range(LAUNCHES_PER_TURN):
                        if next(active[k], None) is None:
                            active[k] = None
                            break
            if not moved:
                raise GpuEngineError("multi-GPU enqueue stalled: a stage waits for a "
                                     "contribution block no device will cut")

    def _stage(self, sid, st, k, layer):
        """Enqueue one stage on its layer; a generator that yields after each launch
        (and ends once the stage's outgoing blocks are cut)."""
        fs = self.fs
        s0, s1 = st.s_range
        h = layer.begin_stage(st, fs.s_index[s0:s1], self.vals[s0:s1], [])
        for c, off in st.carried.items():
            self.xfer.into(c, k, layer, h["pool"], off, self.layers)
        if "e0" in h:                       # busy time from here: blocks arrived
            h["e0"] = layer.cp.cuda.Event()
            h["e0"].record(layer.stream)
        dense_at, join_at = {}, {}
        for f, Ld in st.dense.items():
            dense_at.setdefault(Ld, []).append(f)
        for L in range(st.nlaunch):
            for done in join_at.pop(L, ()):
                layer.dense_join(h, done)
            layer.launch(h, L, st.launch_tasks(L))
            for f in dense_at.get(L, ()):
                Fv, panels, T, done = layer.dense_factorize(
                    h, int(st.foff[f]), int(fs.fm[f]), int(fs.fn[f]),
                    fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]])
                self.dense_parts[f] = (sid, Fv, panels, T)
                join_at.setdefault(min(st.dense_join[f], st.nlaunch), []).append(done)
            yield L
        for done in [d for v in join_at.values() for d in v]:
            layer.dense_join(h, done)
        layer.mark_kernels_end(h)
        self.launches[k] += int(np.count_nonzero(np.diff(st.launch_ptr)))
        first, last = st.fronts
        for f in range(first, last + 1):         # blocks for later stages
            p = int(fs.parent[f])
            if p > last and int(fs.cm[f]) > 0 and int(fs.fn[f]) > int(fs.fp[f]):
                base = int(st.foff[f]) + int(fs.frank[f]) * int(fs.fn[f])
                self.xfer.put(f, k, layer, h["pool"], base, int(fs.cm[f]), int(fs.fn[f]),
                              int(fs.fp[f]))
        self.handles[sid] = h

    def finish(self) -> None:
        """Wait for every stage and check it (CUDA errors, non-finite pools)."""
        for sid in range(len(self.sched.stages)):
            k, layer = self.layer_of(sid)
            with _on(layer):
                before = layer.seconds.get("kernels", 0.0)
                self.pools[sid] = layer.end_stage(self.handles.pop(sid))
                self.busy[k] += layer.seconds.get("kernels", 0.0) - before
        self.xfer.keep = []

    def gather_r(self, layout, gmaps) -> list:
        """R's values of every stage, from its device: one thread per device copies
        that device's stages in order, so the devices copy at once (and each holds
        one pinned staging buffer at a time)."""
        by_device = {}
        for sid in range(len(self.sched.stages)):
            by_device.setdefault(self.layer_of(sid)[0], []).append(sid)

        def one_device(sids):
            out = []
            for sid in sids:
                _, layer = self.layer_of(sid)
                pos, gidx = gmaps[sid]
                with _on(layer):
                    copier = layer.open_r_copy(self.pools[sid], gidx, layout)
                    try:
                        copier.launches_done()
                        out.append((sid, pos, copier.result()))
                    except BaseException:
                        copier.abort()
                        raise
            return out

        if len(by_device) == 1:
            done = one_device(next(iter(by_device.values())))
        else:
            with ThreadPoolExecutor(max_workers=len(by_device)) as pool:
                done = [p for part in pool.map(one_device, by_device.values()) for p in part]
        return [(pos, vals) for _, pos, vals in sorted(done, key=lambda t: t[0])]

    def _home_reaches(self, home, layer) -> bool:
        """Whether the home layer's kernels can read the layer's memory."""
        if layer.device_id == home.device_id:
            return True
        cp = home.cp
        if not cp.cuda.runtime.deviceCanAccessPeer(home.device_id, layer.device_id):
            return False
        rt = cp.cuda.runtime
        with cp.cuda.Device(home.device_id):
            try:
                # CuPy's variant clears the runtime's last error when access was
                # enabled already (left set, it would surface in a later library
                # call that checks cudaGetLastError, e.g. Thrust's)
                ensure = getattr(rt, "_deviceEnsurePeerAccess", None)
                if ensure is not None:
                    ensure(layer.device_id)
                else:
                    rt.deviceEnablePeerAccess(layer.device_id)
            except rt.CUDARuntimeError as exc:
                if "PeerAccessAlreadyEnabled" not in str(exc):
                    return False
        return True

    def _gather_q(self):
        """The home layer's VT pool completed with the other devices' tiles; each
        stage's pool where the home device reads it (device) or on the host."""
        sched = self.sched
        home = self.layers[0]
        lo = np.asarray(sched.vt_base, dtype=np.int64)
        hi = np.append(lo[1:], sched.vt_size)
        stage_pools, host_pools = {}, {}
        copied = set()
        for sid, st in enumerate(sched.stages):
            k, layer = self.layer_of(sid)
            first, last = st.fronts
            a, b = int(lo[first]), int(hi[last])
            if k != 0 and b > a:
                if getattr(home, "cp", None) is None:
                    home.vt[a:b] = layer.vt[a:b]
                else:
                    cp = home.cp
                    isz = home.vt.itemsize
                    with cp.cuda.Device(home.device_id):
                        if layer.device_id == home.device_id:
                            cp.cuda.runtime.memcpy(home.vt.data.ptr + a * isz,
                                                   layer.vt.data.ptr + a * isz,
                                                   (b - a) * isz, _D2D)
                        else:
                            cp.cuda.runtime.memcpyPeer(home.vt.data.ptr + a * isz,
                                                       home.device_id,
                                                       layer.vt.data.ptr + a * isz,
                                                       layer.device_id, (b - a) * isz)
                    copied.update((home.device_id, layer.device_id))
            pool = self.pools[sid]
            if getattr(home, "cp", None) is None or self._home_reaches(home, layer):
                stage_pools[sid] = pool
            else:
                with _on(layer):
                    host_pools[sid] = layer.to_host(pool)
        if copied:                          # the VT copies done before Q's launches
            _settle(home.cp, copied)
        for layer in self.layers[1:]:       # their pools live on in ``stage_pools``
            if layer is not home:
                with _on(layer):
                    layer.close()
        return stage_pools, host_pools

    def result(self, Ac, layout, R, *, seconds):
        """The :class:`~.driver.GpuQR` (Q kept on the first device)."""
        fs, sched, plan = self.fs, self.sched, self.plan
        m, n = Ac.shape
        stage_pools, host_pools = self._gather_q()
        slots_of = layout.slots_of
        fronts, front_loc, front_launch, pending = [], [], [], {}
        for sid, st in enumerate(sched.stages):
            t = st.tasks
            kk = np.flatnonzero(np.isin(t["type"], _FACTORIZE_TYPES))
            allf = t[kk]
            alll = self.launch_base[sid] + np.searchsorted(st.launch_ptr, kk, side="right") - 1
            order = np.argsort(allf["front"], kind="stable")
            allf, alll = allf[order], alll[order]
            allf["F"] = 0
            first, last = st.fronts
            ptr = np.searchsorted(allf["front"], np.arange(first, last + 2))
            for i, f in enumerate(range(first, last + 1)):
                off, size = int(st.foff[f]), int(fs.fm[f]) * int(fs.fn[f])
                front_loc.append((sid, off))
                front_launch.append(alll[ptr[i]:ptr[i + 1]])
                if sid in host_pools:
                    vals = host_pools[sid][off: off + size]
                else:
                    vals = None
                    pending[f] = (sid, off, size)
                fronts.append((slots_of[f], vals, allf[ptr[i]:ptr[i + 1]]))
        dense = {}
        home = self.layers[0]
        for f, (sid, Fv, panels, T) in self.dense_parts.items():
            if sid in host_pools:
                off = int(sched.stages[sid].foff[f])
                Fv = host_pools[sid][off: off + Fv.size].reshape(Fv.shape)
                T = T.get() if hasattr(T, "get") else T
            elif getattr(home, "cp", None) is not None:     # Q's dense products run on home
                Fv, T = _to_home(Fv, home), _to_home(T, home)
            Ld = int(self.launch_base[sid]) + sched.stages[sid].dense[f]
            dense[f] = DenseFront(Fv, panels, T, slots=slots_of[f], after_launch=Ld)
        per = []
        for k, layer in enumerate(self.layers):
            per.append({"device": getattr(layer, "device_id", k),
                        "name": getattr(layer, "name", "?"),
                        "stages": len(plan.device_stages(k)), "launches": self.launches[k],
                        "busy_seconds": self.busy[k],
                        "flops": float(plan.device_flops[k])})
        info = {"backend": "gpu", "device": getattr(self.layers[0], "name", "?"),
                "ordering": self.analysis.ordering_used, "nfronts": int(fs.nfronts),
                "stages": len(sched.stages), "launches": int(sched.nlaunch),
                "launches_with_tasks": int(sched.nlaunch_with_tasks),
                "tasks": int(sched.ntasks), "tile": int(sched.tile),
                "bundle": int(sched.bundle), "pipelining": bool(sched.pipelining),
                "dense_fronts": len(dense), "dense_flops": sched.dense_flops,
                "devices": {**plan.as_dict(), "devices": per},
                "transfers": list(self.xfer.log),
                "q_device": getattr(self.layers[0], "device_id", 0),
                "q_pools_on_host": sorted(host_pools),
                "restaged": 0, "seconds": seconds}
        return driver.GpuQR(shape=(m, n), R=R, colperm=self.analysis.colperm.astype(np.int64),
                            rank=int(min(m, n)), tol=None, flops=float(self.analysis.flops),
                            info=info, analysis=self.analysis, qorder=layout.qorder.copy(),
                            schedule=sched, _fronts=fronts, _vt=None, _dense=dense,
                            _device=self.layers[0], _pending=pending,
                            _stage_pools=stage_pools, _host_pools=host_pools,
                            _front_loc=front_loc, _front_launch=front_launch,
                            _launch_base=self.launch_base.tolist())

