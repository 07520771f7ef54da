"""The GPU engine: sparse multifrontal QR through the uberkernel (``backend='gpu'``).

The sparse scheduler (:func:`scipy_gpuqr._schedule.sparse.build_schedule`)
turns the analysis into task lists, stage by stage; the device layer
(:mod:`.gpu_device`) runs every launch of a stage on the GPU over one front
pool (CuPy memory pool), with the stage's S entries, the maps (uploaded once)
and the VT pool of the whole factorization. Per stage, the rows of R (and the
contribution blocks of fronts whose parent sits in a later stage) come back
in one gathered transfer into pinned memory; the stage's pool is then copied
to the host (earlier stages, to free device memory) or kept on the GPU (the
last stage) for ``Q``. Contribution blocks cross stages through host memory.

Faults: a CUDA error or a non-finite value in a front pool after a stage
(A is checked finite first) raises :class:`GpuEngineError`, never a silently
wrong R; device out of memory restages with half the budget (down to
single-front stages) and then falls back to the reference engine with a
warning. ``debug`` (``GpuqrOptions.debug`` / ``SCIPY_GPUQR_DEBUG=1``)
synchronizes and checks after every launch.

``Q`` is applied on the host by replaying the kept reflectors
(:class:`~scipy_gpuqr._engine.simulate.SimulateQR`); the fronts and VT tiles
are fetched from the GPU on the first ``qt_matmul``/``q_matmul``.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE, TaskType
from .gpu_device import CupyDevice, DeviceOutOfMemory, GpuEngineError, NumpyDevice
from .simulate import SimulateQR

__all__ = ["gpu_factorize", "GpuQR", "GpuEngineError"]

_log = logging.getLogger("scipy_gpuqr")

#: Restaging attempts after device out-of-memory before the CPU fallback.
MAX_RESTAGE = 6


@dataclass
class GpuQR(SimulateQR):
    """Result of :func:`gpu_factorize` (a :class:`~scipy_gpuqr._numeric.NumericQR`).

    ``R``, ``colperm`` and ``info`` are on the host. The Householder data
    (front pools and VT tiles) stay where the factorization left them and are
    fetched on the first use of ``qt_matmul``/``q_matmul``.
    """

    _pending: dict = field(default_factory=dict, repr=False)
    _device: object = field(default=None, repr=False)

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
            self._fronts = fronts
            self._pending = {}
            self._stage_pools = {}

    def qt_matmul(self, B):
        self._materialize()
        return super().qt_matmul(B)

    def q_matmul(self, Y):
        self._materialize()
        return super().q_matmul(Y)

    def free(self) -> None:
        super().free()
        self._pending = {}
        self._stage_pools = {}
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
                  debug: bool | None = None, device=None, fallback: bool = True):
    """Sparse QR ``A[:, colperm] = Q @ R`` on the GPU.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` (computed when None).
    tol : None, 'default' or float
        Rank detection is not in the task lists yet: with a tolerance the
        factorization is delegated to the reference backend (``info`` says so).
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

    Returns
    -------
    GpuQR
    """
    import scipy.sparse as sp

    from .._symbolic import analyze, canonical_csc

    t_start = time.perf_counter()
    Ac = canonical_csc(A if (sp.issparse(A) or isinstance(A, np.ndarray)) else np.asarray(A))
    if np.issubdtype(Ac.dtype, np.complexfloating):
        raise TypeError("gpu_factorize: complex matrices are not supported")
    if not (np.issubdtype(Ac.dtype, np.number) or Ac.dtype == np.bool_):
        raise TypeError(f"gpu_factorize: non-numeric dtype {Ac.dtype}")
    if not np.all(np.isfinite(Ac.data)):
        raise ValueError("gpu_factorize: A contains non-finite values")
    if tol is not None and not (not isinstance(tol, str) and float(tol) < 0):
        from .reference import reference_factorize
        why = "the GPU engine has no rank detection yet: reference backend used"
        _log.info(why)
        out = reference_factorize(Ac, analysis, tol=tol, max_gpu_memory=max_gpu_memory)
        out.info["requested_backend"] = "gpu"
        out.info["fallback"] = why
        return out
    if analysis is None:
        analysis = analyze(Ac)
    elif not analysis.matches_pattern(Ac):
        raise ValueError("gpu_factorize: the analysis was made for another pattern")
    debug = _debug_default() if debug is None else bool(debug)
    if device is None:
        device = CupyDevice(tile, bundle, debug=debug)
    budget = max_gpu_memory if max_gpu_memory is not None else _default_budget(device)
    t_an = time.perf_counter()
    last_exc = None
    for attempt in range(MAX_RESTAGE + 1):
        try:
            out = _factorize(Ac, analysis, device, budget=budget, tile=tile, bundle=bundle,
                             pipelining=pipelining, max_tasks=max_tasks)
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
    from .reference import reference_factorize
    warnings.warn(msg + "; falling back to the reference CPU engine", RuntimeWarning,
                  stacklevel=2)
    out = reference_factorize(Ac, analysis, tol=None)
    out.info["requested_backend"] = "gpu"
    out.info["fallback"] = msg
    return out


def _free_device_pools(device) -> None:
    cp = getattr(device, "cp", None)
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()


def _factorize(Ac, analysis, device, *, budget, tile, bundle, pipelining, max_tasks):
    import scipy.sparse as sp

    from .._schedule.sparse import build_schedule

    t0 = time.perf_counter()
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_gpu_memory=budget, max_tasks=max_tasks)
    t1 = time.perf_counter()
    m, n = Ac.shape
    fs = analysis.fronts
    nf = fs.nfronts
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    vals = Ac.data.astype(device.dtype)[fs.s_nz]
    maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
    device.start(maps, sched.vt_size)
    frank = fs.frank.astype(np.int64)
    fm_a, fn_a = fs.fm.astype(np.int64), fs.fn.astype(np.int64)
    host_cb = {}
    r_rows = [None] * nf            # front -> (rk, fn) rows of R
    front_tasks = [None] * nf
    pending = {}                    # front -> (stage, offset, size) in a device pool
    stage_pools = {}
    host_pools = {}
    nstage = len(sched.stages)
    for sid, st in enumerate(sched.stages):
        first, last = st.fronts
        carried = [(off, host_cb.pop(c)) for c, off in st.carried.items()]
        s0, s1 = st.s_range
        pool = device.run_stage(st, fs.s_index[s0:s1], vals[s0:s1], carried)
        members = np.arange(first, last + 1)
        foff = st.foff[members]
        rk, fnm, fmm = frank[members], fn_a[members], fm_a[members]
        par = fs.parent[members]
        later = (par >= 0) & (par > last)
        cmm = fs.cm[members].astype(np.int64)
        segs = [(int(o), int(r * c)) for o, r, c in zip(foff, rk, fnm)]
        cb_f = members[later]
        segs += [(int(foff[i] + rk[i] * fnm[i]), int(cmm[i] * fnm[i]))
                 for i in np.flatnonzero(later)]
        host = device.fetch(pool, segs)
        p = 0
        for i, f in enumerate(members.tolist()):
            size = segs[i][1]
            r_rows[f] = host[p: p + size].reshape(int(rk[i]), int(fnm[i]))
            p += size
        for j, f in enumerate(cb_f.tolist()):
            size = segs[len(members) + j][1]
            blk = host[p: p + size].reshape(int(fs.cm[f]), int(fs.fn[f]))[:, int(fs.fp[f]):]
            host_cb[f] = np.triu(blk)
            p += size
        t = st.tasks
        fac = np.isin(t["type"], (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE))
        kf = np.flatnonzero(fac)
        kf = kf[np.argsort(t["front"][kf], kind="stable")]
        cnt = np.bincount(t["front"][kf] - first, minlength=last - first + 1)
        ptr = np.concatenate(([0], np.cumsum(cnt)))
        allf = t[kf]
        allf["F"] = 0
        for i, f in enumerate(members.tolist()):
            front_tasks[f] = allf[ptr[i]:ptr[i + 1]]
            pending[f] = (sid, int(foff[i]), int(fmm[i] * fnm[i]))
        if sid + 1 < nstage:
            host_pools[sid] = device.to_host(pool)
            device.release(pool)
        else:
            stage_pools[sid] = pool
    t2 = time.perf_counter()
    slots_of = _row_slots(analysis)
    R, qorder = _assemble_R(Ac, analysis, r_rows, slots_of, dtype)
    if R.nnz and not np.isfinite(R.data).all():
        raise GpuEngineError("non-finite values in R")
    t3 = time.perf_counter()
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
            "stages": nstage, "launches": int(sched.nlaunch), "tasks": int(sched.ntasks),
            "tile": int(tile), "bundle": int(bundle), "pipelining": bool(pipelining),
            "budget": budget, "schedule_cpu_seconds": float(sched.seconds),
            "seconds": {"schedule": t1 - t0, "factorize": t2 - t1, "assemble_R": t3 - t2,
                        "gpu_kernels": dev_s.get("kernels", 0.0),
                        "upload": dev_s.get("upload", 0.0),
                        "download": dev_s.get("download", 0.0),
                        "launch_loop": dev_s.get("launch_loop", 0.0)}}
    out = GpuQR(shape=(m, n), R=R, colperm=analysis.colperm.astype(np.int64),
                rank=int(min(m, n)), tol=None, flops=float(analysis.flops), info=info,
                analysis=analysis, qorder=qorder, schedule=sched, _fronts=fronts,
                _vt=None, _pending=pending, _device=device)
    out._stage_pools = stage_pools
    return out


def _row_slots(analysis):
    """Global slot (row of A) of every row of every front (as the reference)."""
    fs = analysis.fronts
    rowperm = analysis.rowperm
    nf = fs.nfronts
    slots_of = [None] * nf
    for f in range(nf):
        fm = int(fs.fm[f])
        slots = np.empty(fm, dtype=np.int64)
        a0, a1 = fs.arow_ptr[f], fs.arow_ptr[f + 1]
        slots[fs.arow_local[a0:a1]] = rowperm[a0:a1]
        for c in fs.children[fs.child_ptr[f]:fs.child_ptr[f + 1]]:
            c = int(c)
            rk, cmc = int(fs.frank[c]), int(fs.cm[c])
            slots[fs.rimap[fs.rimap_ptr[c]:fs.rimap_ptr[c + 1]]] = slots_of[c][rk:rk + cmc]
        slots_of[f] = slots
    return slots_of


def _assemble_R(Ac, analysis, r_rows, slots_of, dtype):
    """R (rows keyed by pivot column, as the reference) and Qᵀb's row order.

    Built as CSR in front order (each front's rows are an upper trapezoid of
    its ``rk × fn`` block), rows permuted to pivot order, then one linear
    CSR→CSC transpose (no COO sort).
    """
    import scipy.sparse as sp

    fs = analysis.fronts
    m, n = Ac.shape
    rowperm = analysis.rowperm
    lens_l, idx_l, vals_l, piv_l, slot_l = [], [], [], [], []
    r1 = int(getattr(analysis, "n1rows", 0) or 0)
    if r1:   # singleton rows of A are rows of R as they stand
        lens_l.append(np.diff(analysis.r1_ptr).astype(np.int64))
        idx_l.append(np.asarray(analysis.r1_cols, dtype=np.int64))
        vals_l.append(Ac.data[analysis.r1_nz].astype(np.float64))
        piv_l.append(np.asarray(analysis.r1_pivot, dtype=np.int64))
        slot_l.append(rowperm[:r1])
    for f in range(fs.nfronts):
        rk = int(fs.frank[f])
        if rk == 0:
            continue
        fn = int(fs.fn[f])
        cols = fs.cols[fs.col_ptr[f]:fs.col_ptr[f + 1]]
        mask = np.arange(fn)[None, :] >= np.arange(rk)[:, None]
        lens_l.append(fn - np.arange(rk, dtype=np.int64))
        idx_l.append(np.broadcast_to(cols, (rk, fn))[mask])
        vals_l.append(r_rows[f][mask])
        piv_l.append(cols[:rk])
        slot_l.append(slots_of[f][:rk])
    k = min(m, n)
    if not lens_l:
        R = sp.csc_array((k, n), dtype=dtype)
        return R, np.arange(m, dtype=np.int64)
    piv = np.concatenate(piv_l).astype(np.int64)
    live = np.argsort(piv, kind="stable")
    lens = np.concatenate(lens_l)
    indptr = np.concatenate(([0], np.cumsum(lens)))
    itype = np.int32 if max(indptr[-1], n) < 2 ** 31 - 1 else np.int64
    Rcsr = sp.csr_array((np.concatenate(vals_l).astype(dtype, copy=False),
                         np.concatenate(idx_l).astype(itype), indptr.astype(itype)),
                        shape=(len(piv), n))
    Rcsr = Rcsr[live]                        # rows in pivot order
    if len(piv) < k:                         # rows without a pivot: zero rows at the end
        Rcsr = sp.vstack([Rcsr, sp.csr_array((k - len(piv), n), dtype=dtype)], format="csr")
    R = Rcsr.tocsc()
    R.sort_indices()
    slots_r = np.concatenate(slot_l)[live]
    rest = np.ones(m, dtype=bool)
    rest[slots_r] = False
    qorder = np.concatenate([slots_r, np.flatnonzero(rest)]).astype(np.int64)
    return R, qorder
