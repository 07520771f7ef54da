"""The stages of one GPU factorization, and R's values gathered from them.

:class:`StageLoop` runs a schedule's stages one after another on a device
layer (:mod:`.device`: CuPy, or NumPy for CI): per stage
:meth:`~StageLoop.begin` (its pool, the blocks it receives),
:meth:`~StageLoop.launch_all` (every launch, R's copier and a retiring pool's
copy told after each), :meth:`~StageLoop.wait_host_side` (R's layout from the
worker), :meth:`~StageLoop.carry_contribution_blocks`,
:meth:`~StageLoop.keep_reflector_records` (what ``Q``'s replay needs) and
:meth:`~StageLoop.retire_pool` (an earlier stage's pool to the host). R's
values come per stage progressively from the device, or from a pool sent to
the host on a gather thread that scatters them straight into R's data
(:func:`assemble_r` puts the rest in). :mod:`.driver` plans the memory,
builds the schedule, makes the loop and the :class:`~.driver.GpuQR`.
"""

from __future__ import annotations

import functools
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..._errors import DeviceOutOfMemory, GpuEngineError
from ..._schedule import native
from ..._schedule.tasks import TaskType, factorizes, take_records
from .. import native as engine_native
from .device import CupyDevice, HostFrontDevice, pool_block
from .pool_copy import front_finality, place_upper
from .pool_mapper import PoolMapper
from .worker import on_worker
from .rcopy import (ColumnRCopy, NumpyRCopy, column_bounds, final_entries_cached,
                    strided_runs, touched)
from .rlayout import r_layout_cached

__all__ = ["StageLoop", "stage_reflector_records", "assemble_r", "r_dtype", "FACTORIZE_TYPES",
           "R_DATA_THREADS"]

#: Record types whose Householder vectors ``Q``'s replay keeps.
FACTORIZE_TYPES = (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE)

#: Threads touching R's data array ahead (:meth:`StageLoop.make_r_data_ahead`):
#: a few, so that the stage's launch loop keeps a core (the array is hundreds
#: of megabytes on large problems).
R_DATA_THREADS = 4


class StageLoop:
    """The stages of one attempt on the device, and what they leave for R and ``Q``.

    :meth:`run_stage` runs one stage; the attributes collect, over the
    stages, R's values (``r_parts``), the contribution blocks crossing to a
    later stage (``host_cb``), each front's kept records and where its values
    lie (``front_tasks``, ``front_launch``, ``front_loc``, ``pending``), the
    pools kept for ``Q`` (``stage_pools`` on the device, ``host_pools``) and
    the dense fronts (``dense_parts``).

    A host stage (``host_stages``: stage → its only front, a dense front) runs
    every call of the stage on a :class:`~.device.HostFrontDevice` instead of
    the device: its pool is a host array from the start and joins
    ``host_pools``. The blocks earlier stages place into that pool are
    assembled into its front ahead of it, on the host layer's worker, as
    they land (:meth:`hand_ahead`).

    ``pool_map`` (a :class:`~scipy_gpuqr._engine.pool_map.PoolMap`, one stage
    only): the stage's pool is backed chunk by chunk around its launches
    (:class:`~.pool_mapper.PoolMapper`); it goes to the host during the stage
    (``keep_last`` is off) and R's values come from that host pool.
    """

    def __init__(self, Ac, analysis, device, sched, host_side, cold, *, tile, bundle,
                 pipelining, keep_last=True, host_stages=None, pool_map=None):
        fs = analysis.fronts
        nf = fs.nfronts
        self.analysis, self.fs, self.device, self.sched = analysis, fs, device, sched
        self.host_side, self.cold, self.tile = host_side, cold, tile
        self.bundle, self.pipelining = bundle, pipelining
        self.vals = Ac.data.astype(device.dtype)[fs.s_nz]
        self.r_dtype = r_dtype(Ac)
        device.start(np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64), sched.vt_size)
        self.fm, self.fn = fs.fm.astype(np.int64), fs.fn.astype(np.int64)
        self.host_cb = {}               # front -> its contribution block, for a later stage
        self.front_tasks = [None] * nf
        self.front_launch = [None] * nf     # global launch index of each kept record
        self.front_loc = [None] * nf        # front -> (stage, offset) in its stage's pool
        self.kept_jobs = {}                 # stage -> its kept records made on a worker
        self.launch_base = []               # first global launch index of each stage
        self.pending = {}                   # front -> (stage, offset, size) in a device pool
        self.stage_pools = {}
        self.host_pools = {}
        self.dense_parts = {}               # front -> (stage, front view, panels, T)
        self.r_parts = []                   # per stage (positions in R's data, values)
        self.nstage = len(sched.stages)
        self.launches = sched.iter_launches(prefetch=cold)
        self.layout = self.gmaps = self.pattern = None
        self.t_wait_host = 0.0
        self.t_r_wait = 0.0
        self.t_pool_wait = 0.0         # waiting for pools sent down during their stage
        self.pool_copies = []           # per pool sent down so: its ranges
        self.r_copy_stages = []         # per stage: how R's values came, seconds waited
        self._gathers = None            # the worker gathering R's values from host pools
        self.r_data = None              # R's values, host pools' stages scattered by it
        self._r_data_job = None         # its future while made ahead
        self.t_start = time.perf_counter()
        self.timeline = []              # (event, seconds from t_start): the gathers
        self.hand_on_seconds = []       # per stage: carry, keep records, retire pool
        self.early_placed = set()       # fronts whose blocks went with their pool's copy
        self.assembly_due = []          # (host stage, blocks): assemble_ahead
        self.handed = set()             # (host stage, block start) assembled ahead
        self.host_pool_stage = {}       # id of a host stage's pool -> the stage
        self.pack_index = {}            # host stage -> its Pack-Assemble records by source
        self.placed_early = []          # per stage sent down: blocks placed so
        self.t_r_gather_wait = 0.0
        self.r_out_jobs = {}            # host stage -> its R values' array, made ahead
        self.host_r_early = []          # per host stage gathered by parts: share, seconds
        self.stage_seconds = []         # per stage: begin, launches, wait, R, hand-on
        # a warm one-stage run copies R's final columns while later launches run
        # (R's layout and the schedule's records known before the first launch)
        self.warm = r_layout_cached(analysis) if (self.nstage == 1 and not cold) else None
        self.plan_stages = [st.fronts for st in sched.stages]
        self.fkey = (tuple(self.plan_stages), int(tile), int(bundle), bool(pipelining),
                     sched.ntasks, sched.dense_flops)
        self.progressive = 0
        # a cold one-stage run opens that copier once R's layout is ready (the worker
        # done), for the launches left: ``(copier, positions)`` once open
        self.late = self.nstage == 1 and self.warm is None
        self.late_copier = None
        self.pool_map = pool_map
        self.r_split = None                 # a mapped stage: the launch of R's early gather
        self.r_split_key = None             # its entries' split (early, late), kept with R's layout
        self.mapper = None                  # the stage's PoolMapper while it runs
        self.mapped_info = None             # its counts, once the stage ended
        if pool_map is not None:
            if self.nstage != 1 or cold:
                raise GpuEngineError("a mapped pool needs one stage with its records known")
            keep_last = False
            self.warm = None
            self.late = False
        self.keep_last = bool(keep_last)    # the last stage's pool stays on the device
        self.host_stages = dict(host_stages or {})
        self.host_dev = None
        self.t_host = 0.0
        for sid, f in self.host_stages.items():
            st = sched.stages[sid]
            if tuple(st.fronts) != (f, f) or f not in st.dense:
                raise GpuEngineError(f"host stage {sid}: {st.fronts} is not dense front {f} "
                                     f"alone")
        if self.host_stages:
            self.host_dev = HostFrontDevice(tile, bundle, dtype=device.dtype,
                                            gpu=device if isinstance(device, CupyDevice)
                                            else None)
            self.host_dev.start(np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64), 0)
            self.host_dev.prepare((tuple(sched.stages[sid].fronts), sched.stages[sid].pool_size,
                                   _zero_end(fs, sched.stages[sid]))
                                  for sid in self.host_stages)
        # the first front of each stage (a host stage's pool takes its carried
        # blocks as their stages end: :meth:`carry_contribution_blocks`)
        self.stage_first = np.array([st.fronts[0] for st in sched.stages], dtype=np.int64)

    def dev(self, sid: int):
        """The layer that runs stage ``sid`` (the host's for a host stage)."""
        return self.host_dev if sid in self.host_stages else self.device

    # -- one stage ---------------------------------------------------------------------
    def run_stage(self, sid: int, st) -> None:
        """Stage ``sid``: its launches, R's values, the blocks it hands on, its pool.

        After the last launch, R's copier (opened now unless progressive) is
        told the launches are done and the stage is waited for and checked
        (``device.end_stage``); a failure aborts the copier.
        """
        device = self.dev(sid)
        t_host = time.perf_counter()
        # blocks for this stage itself are assembled by its own launch
        self.assembly_due = [d for d in self.assembly_due if d[0] != sid]
        h = self.begin(sid, st)
        t_begun = time.perf_counter()
        self.start_reflector_records(sid)
        down = self.open_pool_copy(sid, st, h)
        # R's values of a pool sent down come from the host pool on the gather thread,
        # overlapping the next stage; the last stage has none to overlap, so its R is
        # copied progressively from the device as for a pool that stays
        last = sid + 1 >= self.nstage
        if self.pool_map is not None:
            if down is None:
                device.release(h["pool"])
                raise DeviceOutOfMemory("a mapped pool needs its copy to the host "
                                        "(no pinned host memory for it)")
            down.gap = 0            # never read a chunk not mapped yet
            self.mapper = PoolMapper(self.pool_map, device, h, down)
            self.r_split = self.mapped_r_split(st, down.final)
        # a mapped pool's R comes from its host pool like an earlier stage's
        from_host = down is not None and (not last or self.mapper is not None)
        if from_host:
            self.make_r_data_ahead()
        copier, pos = ((None, None) if from_host
                       else self.open_progressive_copy(sid, st, h))
        self.make_host_r_out(sid)
        if copier is None and down is None:
            copier, pos = self.open_host_r_copy(sid, h)
        try:
            if down is not None:
                self.place_early(st, down)
            self.launch_all(sid, st, h, copier, down, self.mapper)
            t_launched = time.perf_counter()
            if down is not None:
                self.place_early(st, down)
            self.assemble_ahead()
            if copier is None and self.late_copier is not None:
                copier, pos = self.late_copier
            device.mark_kernels_end(h)
            self.wait_host_side()
            self.start_reflector_records(sid)   # a cold run's: its records made by now
            if copier is None and down is None:
                pos, gidx = self.gmaps[sid]
                copier = (self.host_r_copy(sid, h["pool"], gidx) if sid in self.host_stages
                          else device.open_r_copy(h["pool"], gidx, self.layout))
            for c in (copier, down):
                if c is not None:
                    c.launches_done()
            pool = device.end_stage(h)
        except BaseException:
            if copier is None and self.late_copier is not None:
                copier = self.late_copier[0]
            for c in (copier, down):
                if c is not None:
                    c.abort()
            if self.mapper is not None:     # the range and its chunks go at once
                self.mapper = None
                device.release(h["pool"])
            raise
        finally:
            if self.host_dev is not None:
                self.host_dev.on_slab_part = None
        tw = time.perf_counter()
        host = None
        how = "progressive" if getattr(copier, "final", None) is not None else "after the launches"
        if self.mapper is not None:
            self.mapped_info = self.mapper.info()
            self.mapper = None
        if down is not None:
            host = down.result()
            self.pool_copies.append(down.copies)
            self.placed_early.append(getattr(down, "placed", 0))
            self.t_pool_wait += time.perf_counter() - tw
        if copier is not None and sid in self.host_stages and not last:
            # a host stage's R (read from its host pool, which nothing writes any
            # more) gathered on a worker of its own while the next stages run (not
            # the gather thread: the earlier stages' gathers may still be queued there)
            values = on_worker("gpuqr-host-r", self.host_r_values, copier)
            how = "after the launches, on a worker"
        elif copier is not None:
            values = self.host_r_values(copier)
        else:
            # R's values gathered from the pool sent down, on a worker thread while
            # the next stages run (:meth:`r_values` collects them; a mapped stage's
            # while its pool goes and R's assembly begins)
            pos, gidx = self.gmaps[sid]
            if self._r_data_job is None and self.r_data is None:
                self.r_data = np.zeros(self.layout.nnz, dtype=self.r_dtype)
            values = self.gather_thread().submit(self._gather_stage, sid, pos, host, gidx)
            how = "from the host pool"
        self.r_parts.append((pos, values))
        t_r = time.perf_counter()
        self.t_r_wait += t_r - tw
        self.r_copy_stages.append((how, round(t_r - tw, 4)))
        del copier, down
        self.carry_contribution_blocks(st, pool, device, host)
        self.queue_assembly(st)
        t_c = time.perf_counter()
        self.keep_reflector_records(sid, st)
        t_k = time.perf_counter()
        self.retire_pool(sid, st, pool, host)
        t_end = time.perf_counter()
        self.hand_on_seconds.append(tuple(round(x, 4) for x in (t_c - t_r, t_k - t_c,
                                                                t_end - t_k)))
        self.mark(f"e{sid}", t_end)
        if sid in self.host_stages:
            self.t_host += t_end - t_host
        # wall seconds of the stage's steps: its pool begun, launches enqueued (a
        # host stage's run), the device waited for, R's values, blocks and pool handed on
        self.stage_seconds.append(tuple(round(x, 4) for x in (
            t_begun - t_host, t_launched - t_begun, tw - t_launched, t_r - tw, t_end - t_r)))

    def mark(self, what: str, t=None) -> None:
        """A point of the loop's timeline (``info['timeline']``: seconds from the
        loop's start; the gathers' start and end, a mapped stage's early gather's
        (``h``, ``H``), each stage's end)."""
        self.timeline.append((what, round((time.perf_counter() if t is None else t)
                                          - self.t_start, 4)))

    def make_r_data_ahead(self) -> None:
        """R's data array, into which the gather thread scatters the values of the
        pools sent down, made and its pages touched by :data:`R_DATA_THREADS`
        threads on a worker as the first such stage begins, once R's layout is
        known here (from the worker, or cached by an earlier factorization of
        the pattern); the gathers take it from the future (a scatter into fresh
        zeros would fault their pages in). Without the layout yet, the first
        gather's submission makes zeros."""
        if self._r_data_job is not None or self.r_data is not None:
            return
        lay = self.layout if self.layout is not None else r_layout_cached(self.analysis)
        if lay is None:
            return
        self._r_data_job = on_worker("gpuqr-r-data", touched, lay.nnz, self.r_dtype, R_DATA_THREADS)

    def _data(self) -> np.ndarray:
        """R's data array (the one made ahead, waited for)."""
        if self.r_data is None and self._r_data_job is not None:
            self.r_data = self._r_data_job.result()
            self._r_data_job = None
        return self.r_data

    def _gather_stage(self, sid: int, pos, host, gidx) -> None:
        """Stage ``sid``'s R values from its host pool into R's data (the gather
        thread), its start and end on the timeline."""
        self.mark(f"g{sid}")
        if pos is None and self.r_split_key is not None:    # a mapped stage's rest
            _take_some(self._data(), self.r_split_key[1], host, gidx)
        elif pos is None:           # every entry of R in order (one stage: a mapped pool)
            _take_into(self._data(), host, gidx)
        else:
            _gather_into(self._data(), pos, host, gidx)
        self.mark(f"G{sid}")

    def gather_thread(self) -> ThreadPoolExecutor:
        """The worker gathering R's values off the stages' path (made on first use;
        one thread: the gathers run in the stages' order)."""
        if self._gathers is None:
            self._gathers = ThreadPoolExecutor(1, thread_name_prefix="gpuqr-r-gather")
        return self._gathers

    def host_r_values(self, copier):
        """R's values from ``copier`` (its :meth:`result`), with a host stage's
        share gathered while its slabs ran (``host_r_early``)."""
        values = copier.result()
        if isinstance(copier, ColumnRCopy):
            done = sum(b - a for a, b in copier.early)
            self.host_r_early.append((round(done / max(len(values), 1), 3),
                                      round(copier.seconds, 4)))
        return values

    def begin(self, sid: int, st) -> dict:
        """The stage's pool on the device: zeroed, carried contribution blocks and S entries in."""
        fs = self.fs
        carried = [(off, cb) for c, off in st.carried.items()
                   for cb in (self.host_cb.pop(c),) if cb is not _PLACED]
        s0, s1 = st.s_range
        mapped = {} if self.pool_map is None else {"pool_map": self.pool_map}
        h = self.dev(sid).begin_stage(st, fs.s_index[s0:s1], self.vals[s0:s1], carried, **mapped)
        self.launch_base.append(int(sum(s_.nlaunch for s_ in self.sched.stages[:sid])))
        return h

    def open_progressive_copy(self, sid: int, st, h):
        """R's copier of a warm stage read from the device (a one-stage run, a staged
        run's last stage whether its pool stays or is sent down, an earlier stage
        whose pool could not be sent down during its launches; R's layout known:
        from the worker, or before it for the first stage, cached by an earlier
        factorization of the pattern), opened before the launches: each range of
        the stage's entries is copied once final (:func:`~.rcopy.final_entries`).
        ``(copier, positions)``, else ``(None, None)``: a cold run, a host stage
        (its R gathered after its launches)."""
        lay, maps = self.warm, None
        if lay is None and self.nstage > 1 and not self.cold and sid not in self.host_stages:
            if self.layout is not None:
                lay, maps = self.layout, self.gmaps
            else:       # the first stage: the layout an earlier factorization made
                lay = r_layout_cached(self.analysis)
        if lay is None:
            return None, None
        pos, gidx = (maps if maps is not None else lay.stage_maps(self.plan_stages))[sid]

        final = functools.partial(final_entries_cached, self.analysis, lay, self.sched, st,
                                  self.tile, self.fkey, pos)       # not a closure over self
        copier = self.dev(sid).open_r_copy(h["pool"], gidx, lay, final=final)
        self.progressive += 1
        return copier, pos

    def make_host_r_out(self, sid: int) -> None:
        """Host stage ``sid``'s array of R's values made and its pages touched on a
        worker while its launches and dense front run (the gather after them then
        writes touched pages: :func:`~.rcopy.touched`); nothing where R's layout
        is not known yet."""
        if sid not in self.host_stages or self.layout is None:
            return
        n = len(self.gmaps[sid][1])
        self.r_out_jobs[sid] = on_worker("gpuqr-r-out", touched, n, self.host_dev.dtype)

    def open_host_r_copy(self, sid: int, h):
        """Host stage ``sid``'s R copier opened before its launches where R's layout
        is known: a :class:`~.rcopy.ColumnRCopy` that the front's column slabs
        tell of each part back in the pool (``HostFrontDevice.on_slab_part``),
        gathering those columns' values on a worker while the device works on;
        ``(copier, positions)``, else ``(None, None)`` (:meth:`host_r_copy`
        after the launches)."""
        if sid not in self.host_stages or self.layout is None:
            return None, None
        f = self.host_stages[sid]
        st = self.sched.stages[sid]
        pos, gidx = self.gmaps[sid]
        fm, fn, base = int(self.fm[f]), int(self.fn[f]), int(st.foff[f])
        key = (self.fkey, sid, fn)

        def prepare(lay=self.layout):
            runs = lay.extra(("host_r_runs",) + key, lambda: strided_runs(gidx, fn))
            bounds = lay.extra(("host_r_columns", base, fm) + key,      # (None: kept too)
                               lambda: (column_bounds(gidx, runs, base, fm, fn),))
            return runs, bounds[0]
        job = self.r_out_jobs.pop(sid, None)
        copier = ColumnRCopy(h["pool"], gidx, prepare, out=job, dtype=self.host_dev.dtype)
        self.host_dev.on_slab_part = copier.part_done
        return copier, pos

    def host_r_copy(self, sid: int, pool, gidx):
        """R's copier of host stage ``sid``: its values gathered from the host pool
        after the launches, down its front's columns in blocks of rows
        (:func:`~.rcopy.gather_runs`; the index cut into runs once per layout),
        into the array made ahead (:meth:`make_host_r_out`) where there is one."""
        f = self.host_stages[sid]
        stride = int(self.fn[f])
        runs = self.layout.extra(("host_r_runs", self.fkey, sid, stride),
                                 lambda: strided_runs(gidx, stride))
        job = self.r_out_jobs.pop(sid, None)
        out = job.result() if job is not None else None
        return NumpyRCopy(pool, gidx, dtype=self.host_dev.dtype,
                          counter=self.host_dev.r_copies, runs=runs, out=out)

    def r_values(self) -> list:
        """``r_parts`` with the host pools' gathers waited for: per stage
        ``(positions, values)``; ``r_data`` is set by then (made ahead: the
        gathers' array, waited for)."""
        tw = time.perf_counter()
        self.mark("r")
        try:
            out = [(pos, v.result() if hasattr(v, "result") else v)
                   for pos, v in self.r_parts]
            self._data()
            return out
        finally:
            if self._gathers is not None:
                self._gathers.shutdown(wait=False)
                self._gathers = None
            self.t_r_gather_wait += time.perf_counter() - tw
            self.mark("R")

    def open_pool_copy(self, sid: int, st, h):
        """A pool that goes to the host after its stage, sent down in ranges while the
        launches run (:mod:`.pool_copy`; its R values and crossing blocks then come
        from the host pool); None for a stage whose pool stays (the last one, a
        host stage), a cold schedule (records known only as launched) or a layer
        that cannot (no pinned memory left)."""
        if (sid in self.host_stages or self.cold
                or (sid + 1 >= self.nstage and self.keep_last)):
            return None
        return self.device.open_pool_copy(h["pool"], front_finality(self.fs, st))

    def open_late_copy(self, sid: int, st, h):
        """A cold one-stage run's progressive copier, opened after launch ``L`` once the
        worker made R's layout and the schedule's records: its first range is
        everything final by then (:func:`~.rcopy.final_entries`)."""
        self.late = False
        if sid in self.host_stages:
            return None
        self.wait_host_side()
        pos, gidx = self.gmaps[sid]
        # the copier is kept here (late_copier): its ``final`` must not reach this
        # loop, or the two make a cycle holding the pool and R's host arrays
        # until the cyclic collector runs
        final = functools.partial(final_entries_cached, self.analysis, self.layout,
                                  self.sched, st, self.tile, self.fkey)
        copier = self.dev(sid).open_r_copy(h["pool"], gidx, self.layout, final=final)
        self.late_copier = (copier, pos)
        self.progressive += 1
        return copier

    def launch_all(self, sid: int, st, h, copier, down=None, mapper=None) -> None:
        """Every launch of the stage, in order.

        A dense front is factorized right after the launch that completes its
        assembly and joined before the launch that packs it into its parent
        (or at the stage's end). ``mapper``: a mapped pool's chunks mapped
        before each launch (:class:`~.pool_mapper.PoolMapper`).
        """
        fs, device = self.fs, self.dev(sid)
        dense_at, join_at = {}, {}
        for f, Ld in st.dense.items():
            dense_at.setdefault(Ld, []).append(f)
        for _ in range(st.nlaunch):
            i, L, rec = next(self.launches)
            if i != sid:
                raise GpuEngineError(f"launch {L} of stage {i} yielded in stage {sid}")
            for done in join_at.pop(L, ()):     # its parent packs it now
                device.dense_join(h, done)
            if mapper is not None:
                mapper.before_launch(L)
            device.launch(h, L, rec)
            for f in dense_at.get(L, ()):       # assembled by launch L: factorize now
                Fv, panels, T, done = device.dense_factorize(
                    h, int(st.foff[f]), int(fs.fm[f]), int(fs.fn[f]),
                    fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]])
                self.dense_parts[f] = (sid, Fv, panels, T)
                join_at.setdefault(min(st.dense_join[f], st.nlaunch), []).append(done)
            if L == st.nlaunch - 1:             # the stage ends with every dense front
                for done in join_at.pop(st.nlaunch, ()):
                    device.dense_join(h, done)
            if copier is None and self.late and self.host_side.done():
                copier = self.open_late_copy(sid, st, h)
            if copier is not None:
                copier.after_launch(L)
            if down is not None:
                down.after_launch(L)
            if mapper is not None and L == self.r_split:
                self.gather_early(sid, down, L)

    def mapped_r_split(self, st, final):
        """The launch after which a mapped stage's R entries final by then are
        gathered from its host pool on the gather thread while the later
        launches run (:meth:`gather_early`): where 90 % of R's entries are final,
        but with a fifth of the launches left at least; None without R's layout
        known yet (a cold pattern) or too few launches."""
        nl = int(st.nlaunch)
        lay = self.layout if self.layout is not None else r_layout_cached(self.analysis)
        if lay is None or nl < 5 or not len(final.start):
            return None
        off = np.asarray(st.foff, dtype=np.int64)
        a, b = (int(x) for x in st.fronts)
        f = np.arange(a, b + 1)
        f = f[off[f] >= 0]
        at = np.searchsorted(final.start, off[f])
        inside = at < len(final.start)
        f, at = f[inside], at[inside]
        ok = final.start[at] == off[f]
        f, at = f[ok], at[ok]
        nnz = np.asarray(self.analysis.front_nnz_R, dtype=np.int64)[f]
        order = np.argsort(final.last[at], kind="stable")
        cum = np.cumsum(nnz[order])
        if not len(cum) or cum[-1] <= 0:
            return None
        k = int(np.searchsorted(cum, 0.9 * cum[-1]))
        return int(min(final.last[at][order][min(k, len(order) - 1)], nl - 1 - nl // 5))

    def gather_early(self, sid: int, down, L: int) -> None:
        """A mapped stage's R entries final by launch ``L``: their fronts sent now,
        then gathered from the host pool on the gather thread once the copies
        landed, while the device runs the later launches; the rest after the
        stage (:meth:`_gather_stage`). The entries' split is made once per
        pattern and kept with R's layout: a pattern's first mapped run makes it
        on a worker of its own and gathers all of R after its stage."""
        lay = self.layout if self.layout is not None else r_layout_cached(self.analysis)
        _, gidx = lay.stage_maps(self.plan_stages)[sid]
        final, host = down.final, down.host
        key = ("mapped_r_split", self.fkey, int(sid), int(L))
        split = lay.extra_if_made(key)
        if split is None:
            def make():
                made = _split_by_finality(gidx, final, L)
                lay.extra(key, lambda: made)
            on_worker("gpuqr-r-split", make)
            return
        down.send_final(L)
        landed = down.landed()
        if self._r_data_job is None and self.r_data is None:
            self.r_data = np.zeros(lay.nnz, dtype=self.r_dtype)

        def job():
            self.mark(f"h{sid}")
            if landed is not None:
                landed.synchronize()
            _take_some(self._data(), split[0], host, gidx)
            self.mark(f"H{sid}")
        self.r_split_key = split
        self.gather_thread().submit(job)

    def wait_host_side(self) -> None:
        """R's layout, gather maps and the future of its pattern's copy from the worker
        (the first stage waits here, after enqueueing its launches: the two overlap)."""
        if self.layout is None:
            tw = time.perf_counter()
            self.layout, self.gmaps, self.pattern = self.host_side.result()
            self.t_wait_host += time.perf_counter() - tw

    def carry_contribution_blocks(self, st, pool, device=None, host=None) -> None:
        """Contribution blocks of the stage's fronts whose parent lies in a later stage,
        fetched in one transfer into ``host_cb`` (views of it; from ``device``,
        default the engine's layer), or views of ``host``, the pool already sent
        down. A block whose parent is a host front's goes straight into that
        stage's pool at its place (:meth:`place_in_host_stages`)."""
        fs = self.fs
        first, last = st.fronts
        members = np.arange(first, last + 1)
        foff = st.foff[members]
        par = fs.parent[members]
        later = np.flatnonzero((par >= 0) & (par > last))
        later = self.place_in_host_stages(st, pool, device or self.device, later)
        if not len(later):
            return
        rk, fnm = fs.frank[members].astype(np.int64), self.fn[members]
        cmm = fs.cm[members].astype(np.int64)
        segs = [(int(foff[i] + rk[i] * fnm[i]), int(cmm[i] * fnm[i])) for i in later]
        if host is None:
            host = (device or self.device).fetch(pool, segs)
            starts = np.cumsum([0] + [n for _, n in segs[:-1]]).tolist()
        else:
            starts = [a for a, _ in segs]
        for j, i in enumerate(later.tolist()):
            f = first + i
            p, size = starts[j], segs[j][1]
            # as is (Householder data below its diagonal): Pack-Assemble copies only
            # its upper trapezoid (``nfrows`` 1), so no triangle is cut out here
            self.host_cb[f] = host[p: p + size].reshape(int(fs.cm[f]),
                                                        int(fs.fn[f]))[:, int(fs.fp[f]):]

    def place_early(self, st, down) -> None:
        """The contribution blocks of ``st``'s fronts whose parent is a host stage's
        front, handed to the pool's copy ``down`` (``attach``) where that pool
        is ready and page-locked (a copy into pageable memory would hold the
        engine's thread until the device reached it). Called before the
        launches, each block then goes on the copy stream right after its
        front's send, while the stage runs, and the host stage's assembly of it
        starts as it lands (:meth:`_on_placed`); called again once every launch
        is enqueued, for the pools that were not ready before: those of fronts
        already sent at once, the others after the last send
        (:class:`~.pool_copy._FrontCopy`). :meth:`place_in_host_stages` places
        the others after the stage. The host stage begins after the engine
        waited for ``down``."""
        groups = self._into_host_stages(st)
        if not groups:
            return
        fs = self.fs
        down.on_placed = self._on_placed
        for sid, members in groups.items():
            pst = self.sched.stages[sid]
            kids = [f for f in members if f not in self.early_placed]
            if not kids:
                continue
            out = self.host_dev.take_pool(pst.fronts, min(int(pst.carried[f]) for f in kids),
                                          wait=False)
            if out is None or not _page_locked(self.device, out):
                continue
            self.host_pool_stage[id(out)] = sid
            for f in kids:
                n = int(fs.fn[f])
                start = int(st.foff[f]) + int(fs.frank[f]) * n + int(fs.fp[f])
                down.attach(int(st.foff[f]), (start, int(fs.cm[f]), n - int(fs.fp[f]), n,
                                              int(pst.carried[f])), out)
                self.early_placed.add(f)
            self.host_dev.placed(pst.fronts, None)
        down.tell()

    def _on_placed(self, items, landed) -> None:
        """A pool copy placed ``items`` (``(block, host pool)``, :meth:`place_early`)
        into host stages' pools; ``landed``: what their copies' landing waits
        for. Their Pack-Assemble records go to the host layer's worker
        (:meth:`~.device.HostFrontDevice.assemble_ahead`), which waits for
        ``landed`` and runs them while the device works on: where the host
        stage's records are known (a warm schedule)."""
        by = {}
        for (_, m, w, _, at), out in items:
            by.setdefault(self.host_pool_stage[id(out)], []).append((int(at), int(m) * int(w)))
        for sid, blocks in by.items():
            self.hand_ahead(sid, blocks, landed)

    def hand_ahead(self, sid: int, blocks, landed=None) -> None:
        """Host stage ``sid``'s Pack-Assemble records that read ``blocks``
        (``(start, elements)`` placed into its pool) to the host layer's worker,
        once (``landed``: see :meth:`_on_placed`); nothing where its records are
        not known yet."""
        pst = self.sched.stages[sid]
        blocks = [b for b in blocks if (sid, b[0]) not in self.handed]
        if not blocks or not pst.materialized:
            return
        index = self.pack_index.get(sid)
        if index is None:           # the stage's Pack-Assemble records by source, once
            t = pst.tasks
            pk = np.flatnonzero(t["type"] == int(TaskType.PACK_ASSEMBLE))
            pk = pk[np.argsort(t["vt"][pk], kind="stable")]
            index = self.pack_index[sid] = (pk, t["vt"][pk].astype(np.int64))
        pk, src = index
        a = np.array([b[0] for b in blocks], dtype=np.int64)
        e = a + np.array([b[1] for b in blocks], dtype=np.int64)
        lo, hi = np.searchsorted(src, a, side="left"), np.searchsorted(src, e, side="left")
        take = np.concatenate([pk[i:j] for i, j in zip(lo.tolist(), hi.tolist())])
        if self.host_dev.assemble_ahead(pst.fronts, pst.tasks[np.sort(take)], blocks, landed):
            self.handed.update((sid, b[0]) for b in blocks)

    def place_in_host_stages(self, st, pool, device, later):
        """The contribution blocks (``later``: members of ``st`` whose parent lies in
        a later stage) whose parent is a host stage's front, copied from this
        stage's pool (on the device: one strided copy each, asynchronous on the
        stage's stream) into the rows of that stage's pool they take there
        (:meth:`~.device.HostFrontDevice.take_pool`): the host stage then neither
        waits for a host copy of them nor makes one (a host front's carried blocks
        are gigabytes). Every layer's pool can be placed from: a host stage's
        (``device`` is the host layer) by :class:`_Placing`, any other by
        :func:`~.pool_copy.place_upper` (a CUDA layer's on its stream, a NumPy
        layer's at once). Returns the members left for ``host_cb``."""
        if not self.host_stages or not len(later):
            return later
        fs = self.fs
        first = st.fronts[0]
        fr = first + later
        psid = np.searchsorted(self.stage_first, fs.parent[fr], side="right") - 1
        hosted = np.isin(psid, list(self.host_stages))
        for f in fr[hosted].tolist():
            if f in self.early_placed:      # already there (:meth:`place_early`)
                self.host_cb[f] = _PLACED
        hosted &= ~np.isin(fr, list(self.early_placed))
        for sid in np.unique(psid[hosted]).tolist():
            pst = self.sched.stages[sid]
            kids = fr[hosted & (psid == sid)].tolist()
            out = self.host_dev.take_pool(pst.fronts, min(int(pst.carried[f]) for f in kids))
            if out is None:
                continue
            blocks = []
            for f in kids:
                m, n = int(fs.cm[f]), int(fs.fn[f])
                start = int(st.foff[f]) + int(fs.frank[f]) * n + int(fs.fp[f])
                blocks.append((start, m, n - int(fs.fp[f]), n, int(pst.carried[f])))
                self.host_cb[f] = _PLACED
            if device is self.host_dev:
                # host to host: copied by threads on a worker while the next stages
                # run; the host stage that takes them waits for it as it begins
                self.host_dev.placed(pst.fronts, _Placing(pool, blocks, out))
            else:
                # their upper trapezoids only: Pack-Assemble reads nothing else
                self.host_dev.placed(pst.fronts, place_upper(device, pool, blocks, out))
        return np.array([i for i in later.tolist() if self.host_cb.get(first + i) is not _PLACED],
                        dtype=np.int64)

    def _into_host_stages(self, st) -> dict:
        """The members of stage ``st`` whose parent is a host stage's front, by that
        stage: ``{stage id: [front, ...]}`` in ascending stage ids (empty without
        host stages)."""
        if not self.host_stages:
            return {}
        fs = self.fs
        first, last = st.fronts
        members = np.arange(first, last + 1)
        par = fs.parent[members]
        fr = members[(par >= 0) & (par > last)]
        if not len(fr):
            return {}
        psid = np.searchsorted(self.stage_first, fs.parent[fr], side="right") - 1
        return {sid: fr[psid == sid].tolist()
                for sid in np.unique(psid[np.isin(psid, list(self.host_stages))]).tolist()}

    def queue_assembly(self, st) -> None:
        """Blocks of ``st``'s fronts placed into later host stages' pools
        (:meth:`place_in_host_stages`, :meth:`place_early`) and not handed
        ahead during the stage, queued for :meth:`assemble_ahead`."""
        fs = self.fs
        for sid, members in self._into_host_stages(st).items():
            pst = self.sched.stages[sid]
            blocks = [(int(pst.carried[f]), int(fs.cm[f]) * int(fs.fn[f] - fs.fp[f]))
                      for f in members if self.host_cb.get(f) is _PLACED]
            if blocks:
                self.assembly_due.append((sid, blocks))

    def assemble_ahead(self) -> None:
        """The queued blocks' records (:meth:`queue_assembly`) handed to the host
        layer's worker (:meth:`hand_ahead`) once the current stage's launches
        are enqueued: they run while the device works on it, and the host stage
        begins with them done (the earlier stages' share of a root's assembly
        leaves its critical path). The launch loop is not slowed by them: they
        start after it."""
        due, self.assembly_due = self.assembly_due, []
        for sid, blocks in due:
            self.hand_ahead(sid, blocks)

    def start_reflector_records(self, sid: int) -> None:
        """The stage's kept records (:func:`stage_reflector_records`) made on a
        worker thread while its launches run, where the schedule does not hold them
        yet (a new pattern's, a new process's first factorization of a known
        pattern): :meth:`keep_reflector_records` then only waits for them. Nothing
        while the stage's records are not materialized (a cold run's first stage
        until R's worker made them: called again after :meth:`wait_host_side`) or
        once started."""
        extras = getattr(self.sched, "extras", None)
        base = self.launch_base[-1]
        if (sid in self.kept_jobs or not self.sched.stages[sid].materialized
                or (extras is not None and ("reflector_records", sid, base) in extras)):
            return
        self.kept_jobs[sid] = on_worker("gpuqr-kept-records", stage_reflector_records,
                                        self.sched, sid, self.sched.stages[sid], base)

    def keep_reflector_records(self, sid: int, st) -> None:
        """Each front's Factorize / Apply+Factorize records (``F = 0``), their global
        launches and where the front lies, for ``Q``'s replay: the schedule's
        (:func:`stage_reflector_records`, a cold run's too: its stages are
        materialized by R's worker, waited for after the launches)."""
        first, last = st.fronts
        members = np.arange(first, last + 1)
        foff = st.foff[members]
        job = self.kept_jobs.pop(sid, None)
        kept = (job.result() if job is not None
                else stage_reflector_records(self.sched, sid, st, self.launch_base[-1]))
        allf, alll = kept.records, kept.launches
        cnt = np.bincount(allf["front"] - first, minlength=last - first + 1)
        ptr = np.concatenate(([0], np.cumsum(cnt)))
        fmm = self.fm[members]
        for i, f in enumerate(members.tolist()):
            self.front_tasks[f] = allf[ptr[i]:ptr[i + 1]]
            self.front_launch[f] = alll[ptr[i]:ptr[i + 1]]
            self.front_loc[f] = (sid, int(foff[i]))
            self.pending[f] = (sid, int(foff[i]), int(fmm[i] * self.fn[f]))

    def retire_pool(self, sid: int, st, pool, host=None) -> None:
        """An earlier stage's pool to the host (its dense fronts' data with it; ``host``:
        already sent down) and off the device; the last stage's stays there for
        ``Q`` (unless ``keep_last`` is off: then ``Q`` uploads one pool at a time)."""
        if sid in self.host_stages:     # already on the host, dense data with it
            self.host_pools[sid] = pool
            self.host_dev.release(pool)
            return
        if sid + 1 >= self.nstage and self.keep_last:
            self.stage_pools[sid] = pool
            return
        fs = self.fs
        if host is None:
            host = self.device.to_host(pool)
        self.host_pools[sid] = host
        for f, (s_, Fv, panels, T) in list(self.dense_parts.items()):
            if s_ == sid:           # the stage's pool leaves the device
                off, size = int(st.foff[f]), int(fs.fm[f] * fs.fn[f])
                Th = T.get() if hasattr(T, "get") else T
                self.dense_parts[f] = (s_, host[off: off + size].reshape(Fv.shape), panels, Th)
        self.device.release(pool)

    # -- after the stages ----------------------------------------------------------------
    def front_list(self, slots_of) -> list:
        """``GpuQR._fronts``: per front ``(slots, values, records)``; the values of fronts
        in host pools are views of them (such fronts leave ``pending``), the others None."""
        fronts = []
        for f in range(self.fs.nfronts):
            sid, off, size = self.pending[f]
            if sid in self.host_pools:
                fronts.append((slots_of[f], self.host_pools[sid][off: off + size],
                               self.front_tasks[f]))
                del self.pending[f]
            else:
                fronts.append((slots_of[f], None, self.front_tasks[f]))
        return fronts

    def info(self, *, budget, dense_fronts: int, seconds: dict) -> dict:
        """``GpuQR.info``: the schedule, the tunables and the timings (``seconds``:
        schedule, factorize, assemble_R; the device's and the waits added)."""
        analysis, sched, device = self.analysis, self.sched, self.device
        dev_s = dict(device.seconds)
        return {"backend": "gpu", "device": getattr(device, "name", "?"),
                "ordering": analysis.ordering_used, "nfronts": int(self.fs.nfronts),
                "stages": self.nstage, "launches": int(sched.nlaunch),
                "launches_with_tasks": int(sched.nlaunch_with_tasks),
                "tasks": int(sched.ntasks),
                "tile": int(self.tile), "bundle": int(self.bundle),
                "pipelining": bool(self.pipelining),
                "budget": budget, "schedule_cold": bool(self.cold),
                "dense_fronts": dense_fronts, "dense_flops": sched.dense_flops,
                "seconds": {**seconds,
                            "wait_host_side": self.t_wait_host,
                            "gpu_kernels": dev_s.get("kernels", 0.0),
                            "upload": dev_s.get("upload", 0.0),
                            "download": dev_s.get("download", 0.0),
                            "download_pool": dev_s.get("download_pool", 0.0),
                            "launch_loop": dev_s.get("launch_loop", 0.0),
                            "wait_gpu": dev_s.get("wait", 0.0),
                            "wait_r_copy": self.t_r_wait,
                            "wait_pool_copy": self.t_pool_wait,
                            "wait_unmap": dev_s.get("unmap_wait", 0.0),
                            "wait_r_gather": self.t_r_gather_wait,
                            "host_fronts": self.t_host},
                "host_fronts_factorized_on": ([] if self.host_dev is None
                                              else list(self.host_dev.factorized_on)),
                "host_front_seconds": ({} if self.host_dev is None
                                       else dict(self.host_dev.seconds)),
                "host_assembled_ahead": (0 if self.host_dev is None
                                         else int(self.host_dev.assembled_ahead)),
                "r_copy_progressive": bool(self.progressive),
                "pool_ranges_sent_during_stages": list(self.pool_copies),
                "blocks_placed_early": list(self.placed_early),
                "r_copy_stages": list(self.r_copy_stages),
                "host_r_by_parts": list(self.host_r_early),
                "stage_seconds": list(self.stage_seconds),
                "hand_on_seconds": list(self.hand_on_seconds),
                "timeline": list(self.timeline),
                "last_pool_on_device": bool(self.keep_last
                                            and self.nstage - 1 not in self.host_stages),
                "pool_map": self.mapped_info}


def stage_reflector_records(sched, sid: int, st, base: int):
    """A materialized stage's Factorize / Apply+Factorize records sorted by front
    (stable; ``F = 0``) and their global launches (``base``: the stage's first),
    made once per schedule and kept with it (``sched.extras``, cached per
    pattern): every factorization of the pattern shares them, read-only. May run
    on a worker thread (:meth:`StageLoop.start_reflector_records`)."""
    extras = getattr(sched, "extras", None)
    key = ("reflector_records", int(sid), int(base))
    kept = extras.get(key) if extras is not None else None
    if kept is None:
        t = st.tasks
        kk = np.flatnonzero(factorizes(t["type"]))
        kk = kk[np.argsort(t["front"][kk], kind="stable")]
        allf = take_records(t, kk)
        allf["F"] = 0
        alll = int(base) + np.searchsorted(st.launch_ptr, kk, side="right").astype(np.int64) - 1
        allf.flags.writeable = False
        alll.flags.writeable = False
        kept = types.SimpleNamespace(records=allf, launches=alll)
        if extras is not None:
            extras[key] = kept
    return kept


#: ``host_cb``'s mark of a block already in its host stage's pool.
_PLACED = object()

#: Elements of one piece of :class:`_Placing`'s copy (one thread's step).
_PLACE_PIECE = 1 << 21


class _Placing:
    """Blocks of a host stage's pool copied into a later host stage's pool on a
    worker thread, by threads in pieces of rows: per block ``(start, rows, width,
    pitch, at)``, ``rows`` rows of ``width`` elements ``pitch`` apart from
    ``start`` (:func:`~.device.pool_block`), to ``out[at:]`` row after row;
    :meth:`synchronize` waits for the copy (the wait a host stage's pool makes
    for its placed blocks) and raises what it raised."""

    def __init__(self, pool, blocks, out):
        pieces = []
        for a, m, w, n, at in blocks:
            if not (m and w):
                continue
            src = pool_block(pool, a, m, w, n)
            dst = out[at: at + m * w].reshape(m, w)
            step = max(1, _PLACE_PIECE // w)
            pieces += [(src[r:r + step], dst[r:r + step]) for r in range(0, m, step)]

        def copy(i0, i1):
            for src, dst in pieces[i0:i1]:          # NumPy releases the GIL
                dst[...] = src
        self._job = on_worker("gpuqr-host-place", native.run_split, copy, 0, len(pieces), 1)

    def synchronize(self) -> None:
        self._job.result()


def _zero_end(fs, st) -> int:
    """Elements of a host stage's pool that must start as zeros: up to its first
    carried block when the carried blocks fill the rest of the pool without a
    gap (each is written whole), else all of it."""
    if not st.carried:
        return int(st.pool_size)
    span = sorted((int(off), int(fs.cm[c]) * (int(fs.fn[c]) - int(fs.fp[c])))
                  for c, off in st.carried.items())
    pos = span[0][0]
    for off, size in span:
        if off != pos:
            return int(st.pool_size)
        pos += size
    return span[0][0] if pos == int(st.pool_size) else int(st.pool_size)


def r_dtype(Ac):
    """R's dtype for the matrix ``Ac``."""
    return np.float32 if Ac.dtype == np.float32 else np.float64


def _scatter(data, pos, v) -> None:
    """``data[pos] = v`` (compiled and threaded where the library is built)."""
    v = np.ascontiguousarray(v, dtype=data.dtype)
    lib = native.handle()
    if lib is not None:
        native.scatter(lib, data, pos, v)
    else:
        data[pos] = v


#: Fewest entries per thread of :func:`_gather_into`, and most threads (the
#: gathers run beside the next stages' host work).
GATHER_PER_THREAD = 1 << 20
GATHER_THREADS = 8


#: ``cudaPointerAttributes.type`` of page-locked host memory.
_HOST_PINNED = 1


def _page_locked(device, arr: np.ndarray) -> bool:
    """Whether ``device`` copies into the host array ``arr`` asynchronously: a
    CUDA layer only into page-locked memory; the NumPy layer always."""
    cp = getattr(device, "cp", None)
    if cp is None:
        return True
    try:
        return int(cp.cuda.runtime.pointerGetAttributes(arr.ctypes.data).type) == _HOST_PINNED
    except (cp.cuda.runtime.CUDARuntimeError, AttributeError):
        return False


def _gather_into(data, pos, host, gidx) -> None:
    """A host pool's values of R put straight into R's data array (the gather
    thread, while later stages run): nothing is left for :func:`assemble_r`.

    Threads each make one call of the compiled gather
    (:func:`scipy_gpuqr._engine.native.gather`) over their range without the
    GIL: no array of the stage's values in between (whose fresh pages a take
    would fault in and the scatter read back), and no GIL taken back between
    NumPy calls, which would make the next stage's launch loop give it up
    each time. Where that library is not there (while it is being built, or
    not buildable) and for arrays it does not take, all the stage's values
    are taken, then scattered."""
    lib = engine_native.handle()
    if (lib is None or host.dtype != data.dtype or data.itemsize not in (4, 8)
            or not (host.flags.c_contiguous and data.flags.c_contiguous)):
        _scatter(data, pos, NumpyRCopy(host, gidx, dtype=host.dtype).result())
        return
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    gidx = np.asarray(gidx)
    if gidx.dtype not in (np.int32, np.int64):
        gidx = gidx.astype(np.int64)
    gidx = np.ascontiguousarray(gidx)
    n = len(pos)
    if len(gidx) != n:
        raise GpuEngineError(f"R's gather: {len(gidx)} sources for {n} positions")
    engine_native.gather(lib, data, pos, host, gidx,
                         native.thread_count(n, GATHER_PER_THREAD, GATHER_THREADS))


def _take_into(data, host, gidx) -> None:
    """``data[:len(gidx)] = host[gidx]`` by threads (NumPy's take releases the
    GIL): R's values of a one-stage factorization from its host pool, in R's
    order (R's layout's gather map of its only stage)."""
    gidx = np.asarray(gidx)
    n = len(gidx)
    if n > len(data):
        raise GpuEngineError(f"R's gather: {n} sources for {len(data)} entries")
    src = host if host.dtype == data.dtype else host.astype(data.dtype)

    def take(i0, i1):
        np.take(src, gidx[i0:i1], out=data[i0:i1])

    native.run_split(take, 0, n, GATHER_PER_THREAD)


def _take_some(data, which, host, gidx) -> None:
    """``data[which] = host[gidx[which]]`` by threads (NumPy's fancy indexing
    releases the GIL)."""
    def take(i0, i1):
        sub = which[i0:i1]
        data[sub] = host[gidx[sub]]

    native.run_split(take, 0, len(which), GATHER_PER_THREAD)


def _split_by_finality(gidx, final, L: int) -> tuple:
    """``(early, late)``: positions of R's entries (``gidx``: their pool elements)
    whose front is final by launch ``L`` (:class:`~.pool_copy.FrontFinality`),
    and the others (int64)."""
    g = np.asarray(gidx)
    starts = final.start.astype(g.dtype) if g.dtype.kind == "i" else final.start
    ends, last = final.end, final.last
    early = np.empty(len(g), dtype=bool)

    def mark(i0, i1):               # by threads: searchsorted and the masks drop the GIL
        part = g[i0:i1]
        i = np.searchsorted(starts, part, side="right") - 1
        ic = np.maximum(i, 0)
        early[i0:i1] = (i >= 0) & (part < ends[ic]) & (last[ic] <= int(L))

    native.run_split(mark, 0, len(g), GATHER_PER_THREAD)
    return np.flatnonzero(early), np.flatnonzero(~early)


def assemble_r(Ac, layout, r_parts, dtype, pattern, data=None):
    """R (rows keyed by pivot column, as the reference) from the gathered values.

    ``r_parts``: per stage ``(pos, values)`` in R's CSC order (see
    :mod:`.rlayout`), values None for a stage already put into ``data``
    (:func:`_gather_into`); the singleton rows' values come from A.
    """
    if data is None and len(r_parts) == 1 and r_parts[0][0] is None:
        data = r_parts[0][1]    # every entry, singleton rows' placeholders included
        if data.dtype != dtype:
            data = data.astype(dtype)
        if len(layout.r1_pos):
            data[layout.r1_pos] = Ac.data[layout.r1_nz]
    else:
        if data is None:
            data = np.zeros(layout.nnz, dtype=dtype)
        for pos, v in r_parts:
            if v is None:
                continue
            if pos is None:
                data[:len(v)] = np.asarray(v, dtype=dtype)
            else:
                _scatter(data, pos, v)
        if len(layout.r1_pos):
            data[layout.r1_pos] = Ac.data[layout.r1_nz]
    return layout.csc(data, pattern)
