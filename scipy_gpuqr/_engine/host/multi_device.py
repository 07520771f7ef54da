"""The task lists of a multi-device factorization, run by NumPy on simulated devices.

CI has no GPU, let alone several: this executor proves the multi-device plan
(:mod:`scipy_gpuqr._schedule.devices`) on the host. Each
:class:`SimulatedDevice` owns its memory: the maps, a VT pool, the front
pools of its stages and an inbox of contribution blocks. The devices advance
in turns, one launch each, so the stages of different devices interleave as
they would run concurrently; a stage starts only once every contribution
block it carries has arrived in its device's inbox. A contribution block of a
front whose parent lies in a later stage is cut from the front pool at the
stage's end and put in the inbox of the parent's device: a copy within the
device, or a *transfer* between devices (logged, with its bytes). Nothing is
shared between devices but those transfers.

At the end the fronts, their records and the VT tiles are gathered from the
devices into one :class:`~scipy_gpuqr._engine.host.simulate.SimulateQR`, the
same object the one-device executor returns; the tests check that R, ``Q``
and the solves equal the one-device answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..._errors import DeviceOutOfMemory
from dataclasses import replace

from ..._schedule.dense import DEFAULT_DENSE_FLOPS
from ..._schedule.dense_split import SplitModel, block_owners, split_rule
from ..._schedule.devices import DevicePlan, map_devices
from ..._schedule.sparse import build_schedule, record_flops
from ..._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE, factorizes, take_records
from ..dense_front import DEFAULT_PANEL, DenseFront, factorize_numpy, panels_of
from ..split_front import split_factorize_numpy
from .reference import task_list_input
from .simulate import SimulateQR, assemble_r, execute_task, front_slots, one_blas_thread

__all__ = ["SimulatedDevice", "simulate_multi_device"]



@dataclass(eq=False)
class SimulatedDevice:
    """One simulated device: its memory and what it did.

    Attributes
    ----------
    index : int
    maps : ndarray of int64
        Its copy of the Rimap/Rjmap pool.
    vt : ndarray
        Its VT pool (only its fronts' tiles are written).
    pools : dict
        Stage → its front pool.
    inbox : dict
        Front → contribution block (packed, upper trapezoidal) waiting for a
        stage of this device.
    stages : list of int
        Its stages, in postorder.
    launches, tasks : int
        Launches with records, and records, it ran.
    flops : float
        Nominal flops of its records (:func:`~scipy_gpuqr._schedule.sparse.record_flops`)
        and of its dense fronts.
    received, sent : int
        Bytes of contribution blocks from and to other devices.
    limit : int or None
        Bytes the device has: holding more (maps, VT pool, the front pools
        of its stages, kept for ``Q``, blocks in its inbox) raises
        :class:`~scipy_gpuqr._errors.DeviceOutOfMemory`.
    held, peak : int
        Bytes held now, and the most held.
    """

    index: int
    maps: np.ndarray
    vt: np.ndarray
    stages: list
    pools: dict = field(default_factory=dict)
    inbox: dict = field(default_factory=dict)
    launches: int = 0
    tasks: int = 0
    flops: float = 0.0
    received: int = 0
    sent: int = 0
    limit: int | None = None
    held: int = 0
    peak: int = 0

    def take(self, nbytes: int, what: str) -> None:
        """Count an allocation against :attr:`limit`."""
        if self.limit is not None and self.held + nbytes > self.limit:
            raise DeviceOutOfMemory(f"simulated device {self.index}: {nbytes:,} bytes for "
                                    f"{what} (held {self.held:,}, limit {self.limit:,})")
        self.held += int(nbytes)
        self.peak = max(self.peak, self.held)


def _vt_ranges(sched, nf: int) -> tuple[np.ndarray, np.ndarray]:
    """First and past-last VT element of every front."""
    lo = np.asarray(sched.vt_base, dtype=np.int64)
    hi = np.append(lo[1:], sched.vt_size) if nf else lo
    return lo, hi


class _Run:
    """The devices' turns over the stages of one factorization."""

    def __init__(self, Ac, analysis, plan: DevicePlan, sched, *, tile, rng, dense_panel,
                 limit=None, split_dense=False, split=None, model=None):
        fs = analysis.fronts
        self.fs, self.plan, self.sched, self.tile = fs, plan, sched, tile
        self.rng, self.dense_panel = rng, dense_panel
        self.vals = Ac.data.astype(np.float64)[fs.s_nz]
        maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
        self.devices = [SimulatedDevice(d, maps.copy(), np.full(max(sched.vt_size, 1), np.nan),
                                        plan.device_stages(d), limit=limit)
                        for d in range(plan.ndevices)]
        for dev in self.devices:
            dev.take(dev.maps.nbytes + dev.vt.nbytes, "maps and the VT pool")
        self.stage_of = np.zeros(fs.nfronts, dtype=np.int64)
        for s, (a, b) in enumerate(plan.stages):
            self.stage_of[a:b + 1] = s
        self.transfers = []             # (child, source, target, bytes, turn)
        self.dense = {}                 # front -> (panels, T, global launch)
        self.split_dense = bool(split_dense) and plan.ndevices > 1
        self.split_plans = dict(split or {})    # front -> SplitPlan (the rule's)
        self.model = panel_model(dense_panel) if model is None else model
        self.split = []                 # (front, blocks per device, transfers)
        self.launch_base = np.concatenate(
            ([0], np.cumsum([st.nlaunch for st in sched.stages]))).astype(np.int64)
        self.turn = 0

    def run(self) -> None:
        """Turns until every device has run its stages (one launch per device a turn)."""
        cur = [None] * len(self.devices)        # device -> [stage, next launch, spool]
        left = [list(d.stages) for d in self.devices]
        with one_blas_thread():
            while any(left) or any(c is not None for c in cur):
                moved = False
                for d, dev in enumerate(self.devices):
                    if cur[d] is None and left[d]:
                        sid = left[d][0]
                        if all(c in dev.inbox for c in self.sched.stages[sid].carried):
                            cur[d] = self._begin(dev, left[d].pop(0))
                    if cur[d] is not None:
                        moved = True
                        if self._step(dev, cur[d]):
                            self._end(dev, cur[d][0])
                            cur[d] = None
                if not moved:
                    raise AssertionError("multi-device run stalled: a stage waits for a "
                                         "contribution block no device will send")
                self.turn += 1

    def _begin(self, dev, sid):
        st = self.sched.stages[sid]
        dev.take(8 * st.pool_size, f"the front pool of stage {sid}")
        pool = np.zeros(st.pool_size)
        for c, off in st.carried.items():
            cb = dev.inbox.pop(c)
            pool[off: off + cb.size] = cb.ravel()
            dev.held -= cb.nbytes
        dev.pools[sid] = pool
        s0, s1 = st.s_range
        spool = (self.fs.s_index[s0:s1], self.vals[s0:s1])
        dense_at = {}
        for f, Ld in st.dense.items():
            dense_at.setdefault(Ld, []).append(f)
        return [sid, 0, spool, dense_at]

    def _step(self, dev, state) -> bool:
        """One launch of the device's stage; True when the stage is done."""
        sid, L, spool, dense_at = state
        st = self.sched.stages[sid]
        if L >= st.nlaunch:
            return True
        pool = dev.pools[sid]
        rec = st.launch_tasks(L)
        order = range(len(rec)) if self.rng is None else self.rng.permutation(len(rec))
        for k in order:
            execute_task(rec[k], pool, dev.vt, self.tile, spool=spool, maps=dev.maps)
        if len(rec):
            dev.launches += 1
            dev.tasks += len(rec)
            dev.flops += float(record_flops(rec, self.tile).sum())
        fs = self.fs
        for f in dense_at.get(L, ()):           # assembled by launch L
            fm, fn, off = int(fs.fm[f]), int(fs.fn[f]), int(st.foff[f])
            panels = panels_of(fm, fn, fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]],
                               self.dense_panel)
            F = pool[off: off + fm * fn].reshape(fm, fn)
            owners = None
            if self.split_dense and self.plan.upper[f]:
                owners = block_owners(fm, fn, fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]],
                                      self.plan.ndevices, self.model)
            elif f in self.split_plans:
                owners = self.split_plans[f].owners
            if owners is not None and owners.max(initial=0) > 0:
                # the front's column blocks on every device (devices in the plan's
                # order from the front's own: split device 0 is the front's)
                T, log = split_factorize_numpy(F, panels, self.dense_panel, owners)
                order = [dev.index] + [d for d in range(self.plan.ndevices) if d != dev.index]
                blocks = np.bincount(owners, minlength=self.plan.ndevices)
                self.split.append((int(f), [int(blocks[order.index(d)])
                                            for d in range(self.plan.ndevices)], len(log)))
            else:
                T = factorize_numpy(F, panels, self.dense_panel)
            self.dense[f] = (panels, T, int(self.launch_base[sid]) + L)
            dev.flops += 2.0 * fn * fn * max(fm - fn / 3.0, 0.0)
        state[1] = L + 1
        return state[1] >= st.nlaunch

    def _end(self, dev, sid) -> None:
        """Contribution blocks of the stage's fronts whose parent is in a later stage,
        to the inbox of the parent's device."""
        fs, plan = self.fs, self.plan
        st = self.sched.stages[sid]
        first, last = st.fronts
        pool = dev.pools[sid]
        for f in range(first, last + 1):
            p = int(fs.parent[f])
            if p < 0 or p <= last:
                continue
            fm, fn = int(fs.fm[f]), int(fs.fn[f])
            rk, cmc, fp = int(fs.frank[f]), int(fs.cm[f]), int(fs.fp[f])
            off = int(st.foff[f])
            cb = np.triu(pool[off: off + fm * fn].reshape(fm, fn)[rk:rk + cmc, fp:])
            target = self.devices[int(plan.owner[p])]
            if target is not dev:
                dev.sent += cb.nbytes
                target.received += cb.nbytes
                self.transfers.append((f, dev.index, target.index, int(cb.nbytes), self.turn))
            target.take(cb.nbytes, f"the contribution block of front {f}")
            target.inbox[f] = cb.copy()

    def gather(self):
        """Per front its values and kept records, and one VT pool, from the devices."""
        fs, sched = self.fs, self.sched
        nf = fs.nfronts
        values, ftasks = [None] * nf, [None] * nf
        vt = np.full(max(sched.vt_size, 1), np.nan)
        lo, hi = _vt_ranges(sched, nf)
        for sid, st in enumerate(sched.stages):
            dev = self.devices[int(self.plan.stage_device[sid])]
            pool = dev.pools[sid]
            t = st.tasks
            kk = np.flatnonzero(factorizes(t["type"]))
            fac = take_records(t, kk[np.argsort(t["front"][kk], kind="stable")])
            first, last = st.fronts
            ptr = np.searchsorted(fac["front"], np.arange(first, last + 2))
            for i, f in enumerate(range(first, last + 1)):
                size = int(fs.fm[f]) * int(fs.fn[f])
                off = int(st.foff[f])
                values[f] = pool[off: off + size].copy()
                ft = fac[ptr[i]:ptr[i + 1]].copy()
                ft["F"] = 0
                ftasks[f] = ft
                vt[lo[f]:hi[f]] = dev.vt[lo[f]:hi[f]]
        return values, ftasks, vt


def panel_model(panel: int, model: SplitModel | None = None) -> SplitModel:
    """The split model (default :class:`SplitModel`) at the simulated dense path's panel width."""
    model = SplitModel() if model is None else model
    return replace(model, dense=replace(model.dense, panel=int(panel)))


def simulate_multi_device(A, analysis=None, *, devices: int | DevicePlan = 2,
                          device_memory: int | None = None, tol=None,
                          pipelining: bool = True, tile: int = DEFAULT_TILE,
                          bundle: int = DEFAULT_BUNDLE, max_tasks: int | None = None,
                          rng: np.random.Generator | None = None,
                          dense_flops: float | None = DEFAULT_DENSE_FLOPS,
                          dense_panel: int = DEFAULT_PANEL, split_dense: bool | None = None,
                          split_model: SplitModel | None = None):
    """Sparse QR ``A[:, colperm] = Q @ R`` by the multi-device task lists, on simulated devices.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` (computed when None).
    devices : int or DevicePlan
        Number of simulated devices (mapped by
        :func:`~scipy_gpuqr._schedule.devices.map_devices`), or a plan.
    device_memory : int, optional
        Bytes per device: the mapping's budget (see :func:`map_devices`) and
        each simulated device's memory (:class:`SimulatedDevice`; more raises
        :class:`~scipy_gpuqr._errors.DeviceOutOfMemory`).
    tol : None, 'default' or float
        As :func:`~scipy_gpuqr._engine.host.simulate.simulate_factorize`
        (a tolerance: the reference engine answers).
    pipelining, tile, bundle, max_tasks, dense_flops, dense_panel
        As :func:`~scipy_gpuqr._engine.host.simulate.simulate_factorize`.
    rng : numpy.random.Generator, optional
        Run each launch's records in a random order.
    split_dense : bool or None
        Dense fronts of the upper tree factorized with their column blocks on
        every device (:mod:`scipy_gpuqr._engine.split_front`;
        ``info["split_fronts"]``: front, blocks per device, transfers), as
        :func:`~scipy_gpuqr._engine.gpu.multi_device.multi_gpu_factorize`
        chooses them: None (the default, as there), by the rule (the mapping
        made with the split model, :func:`map_devices`' ``split_model``, at
        the panel width ``dense_panel``; the plan's split fronts made dense
        fronts and split, and the upper device's other dense fronts of the
        upper tree where :func:`~scipy_gpuqr._schedule.dense_split.split_rule`
        models a gain); True, every dense front of the upper tree; False, none.
    split_model : SplitModel, optional
        The model of that rule (its panel width replaced by ``dense_panel``).

    Returns
    -------
    SimulateQR
        ``info["devices"]``: the plan's summary
        (:meth:`~scipy_gpuqr._schedule.devices.DevicePlan.as_dict`) and per
        device its stages, launches, records, flops and bytes sent and
        received; ``info["transfers"]``: ``(child, source, target, bytes,
        turn)`` of every contribution block moved between devices.
    """
    t0 = time.perf_counter()
    Ac, analysis, out = task_list_input(A, analysis, tol, None, "simulate",
                                        "simulate_multi_device")
    if out is not None:
        return out
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    m, n = Ac.shape
    model = panel_model(dense_panel, split_model)
    ndev = devices.ndevices if isinstance(devices, DevicePlan) else int(devices)
    ruled = split_dense is None and ndev > 1
    plan = devices if isinstance(devices, DevicePlan) else map_devices(
        analysis, ndev, device_memory=device_memory, split_model=model if ruled else None)
    # the plan's split fronts are dense fronts whatever dense_flops chose (as on the GPUs)
    extra = sorted(plan.split) if dense_flops is not None and plan.split else None
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_tasks=max_tasks, plan=plan.stage_plan(),
                           dense_flops=dense_flops, dense_extra=extra)
    split = {}
    if ruled:
        cand = sorted(f for st in sched.stages for f in st.dense
                      if plan.upper[f] and plan.owner[f] == plan.upper_device)
        # (a given plan's split fronts, at another panel width, split anew by the rule)
        split = {f: plan.split[f] for f in cand
                 if f in plan.split and plan.split[f].nb == int(dense_panel)}
        split.update(split_rule(analysis.fronts, [f for f in cand if f not in split], ndev,
                                model))
    t1 = time.perf_counter()
    run = _Run(Ac, analysis, plan, sched, tile=tile, rng=rng, dense_panel=dense_panel,
               limit=device_memory, split_dense=bool(split_dense), split=split, model=model)
    run.run()
    t2 = time.perf_counter()
    values, ftasks, vt = run.gather()
    fs = analysis.fronts
    slots_of = [None] * fs.nfronts
    for f in range(fs.nfronts):
        slots_of[f] = front_slots(analysis, f, slots_of)
    R, qorder = assemble_r(Ac, analysis, values, slots_of, dtype)
    t3 = time.perf_counter()
    per = [{"device": d.index, "stages": len(d.stages), "launches": d.launches,
            "tasks": d.tasks, "flops": d.flops, "sent_bytes": d.sent,
            "received_bytes": d.received, "peak_bytes": d.peak} for d in run.devices]
    info = {"backend": "simulate", "ordering": analysis.ordering_used,
            "nfronts": int(fs.nfronts), "stages": len(sched.stages),
            "launches": int(sched.nlaunch), "launches_with_tasks": int(sched.nlaunch_with_tasks),
            "tasks": int(sched.ntasks), "tile": int(tile), "bundle": int(bundle),
            "pipelining": bool(pipelining), "dense_fronts": len(run.dense),
            "dense_flops": sched.dense_flops, "turns": run.turn,
            "devices": {**plan.as_dict(), "devices": per},
            "transfers": list(run.transfers),
            "split_fronts": list(run.split),
            "seconds": {"schedule": t1 - t0, "execute": t2 - t1, "assemble_R": t3 - t2}}
    dense = {f: DenseFront(values[f].reshape(int(fs.fm[f]), int(fs.fn[f])), p, T,
                           slots=slots_of[f], after_launch=Ld)
             for f, (p, T, Ld) in run.dense.items()}
    return SimulateQR(shape=(m, n), R=R, colperm=analysis.colperm.astype(np.int64),
                      rank=int(min(m, n)), tol=None, flops=float(analysis.flops), info=info,
                      analysis=analysis, qorder=qorder, schedule=sched,
                      _fronts=[(slots_of[f], values[f], ftasks[f]) for f in range(fs.nfronts)],
                      _vt=vt, _dense=dense)
