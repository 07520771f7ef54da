"""The sparse scheduler (paper §3.3, §3.4): task lists of whole factorizations.

Every front runs through one state machine::

    WAITING (for its children) → ASSEMBLING (S entries and the children's
    contribution blocks scattered into it) → FACTORIZING (its bucket
    schedule, one local launch after the other) → RELEASING (rows of R copied
    back, its contribution block packed into the parent) → DONE

and each launch coalesces the tasks of every front that can make progress,
at any tree level: S-Assemble, Pack-Assemble, Factorize, Apply and
Apply+Factorize records of many fronts, with no dependency inside a launch
(a front's own steps are one launch apart; a parent starts after the launch
that packs its last child). A launch-size limit defers whole front steps
(fronts with the longest remaining path to the root go first). Stages of the
staging plan run one after the other; contribution blocks of fronts whose
parent sits in a later stage cross through host memory and are packed into
the parent from a *carried* region at the start of the parent's stage.

The per-front bucket schedules are shared between fronts of equal tile
pattern (``bucket.front_patterns`` computes all distinct patterns at once and
caches them, in the process and on disk: :mod:`.cache`); without a
launch limit the front-level state machine is in closed form (NumPy over the
postorder), with one it is a Python loop (over fronts and launches, never
over tasks or bundles). Records are written from
the patterns' element templates by NumPy, either for a whole stage
(:attr:`StageSchedule.tasks`) or launch by launch
(:meth:`StageSchedule.launch_tasks`, :meth:`SparseSchedule.iter_launches`,
which can build launch k+1 in a worker thread while the caller runs launch
k); ``build_schedule(..., lazy=True)`` stops after the plan. Schedules are
cached per sparsity pattern (the analysis' ``pattern_key``, in a bounded
table, :mod:`.pattern_cache`), so ``refactor`` and a new factorization of a
known pattern get their schedule for free, and
plans on disk between processes (:func:`.cache.load_plan`; this module turns a
plan into arrays and back, :func:`_plan_arrays` and :func:`_plan_of_arrays`),
a new plan written behind the caller once its records exist
(:meth:`SparseSchedule.materialize`).

Memory of a stage (what the GPU engine allocates; the executor uses the same):
front pool = the stage's fronts row-major one after the other, then the
carried contribution blocks (packed ``cm × (fn - fp)``, upper trapezoidal);
VT pool; S entries of the stage (index relative to the front, value);
maps pool = all Rimap entries, then all Rjmap entries (int64).
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .._index_ranges import ranges
from . import bucket, native
from . import cache as disk       # ``cache`` names build_schedule's argument
from .dense import DENSE_COLUMNS_PER_LAUNCH, dense_defer, dense_front_mask
from .pattern_cache import PerPattern
from .tasks import (DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE, TASK_DTYPE,
                    TaskType, applies, empty_tasks, factorizes, longest_first, take_records)

__all__ = ["StageSchedule", "SparseSchedule", "build_schedule", "schedule_stats",
           "record_flops", "clear_schedule_cache", "schedule_digest", "S_CHUNK", "PACK_CHUNK"]

#: S entries per S-Assemble task.
S_CHUNK = 8192
#: Most contribution-block entries per Pack-Assemble task.
PACK_CHUNK = 16384


#: Records built per NumPy pass when materializing (keeps the pass in cache); also
#: the most records of a chunk of launches built at once by ``iter_launches``.
CHUNK = 8192
#: Most launches built at once by ``iter_launches``.
CHUNK_LAUNCHES = 32


@dataclass(eq=False)
class StageSchedule:
    """The task list of one stage.

    Records are materialized on demand: :attr:`tasks` builds (once) the whole
    stage, :meth:`launch_tasks` one launch only (what an engine overlapping
    the CPU with the GPU asks for). Both give the same records.

    Attributes
    ----------
    fronts : (int, int)
        First and last front (postorder, inclusive).
    launch_ptr : ndarray of int64
        Records of launch L are ``tasks[launch_ptr[L]:launch_ptr[L+1]]``.
    foff : ndarray of int64 (nfronts,)
        Front base in the stage's front pool (-1 outside the stage).
    carried : dict
        ``child -> offset`` of contribution blocks carried in from earlier
        stages (packed ``cm × (fn - fp)``, leading dimension ``fn - fp``).
    pool_size : int
        Elements of the stage's front pool.
    s_range : (int, int)
        The stage's slice of the analysis' S entries (``s_index``/``s_nz``).
    finish : dict
        Last launch of each front's factorization (-1: nothing to factorize).
    dense : dict
        ``front -> launch`` of the stage's dense fronts (factorized outside
        the task lists right after that launch, which completes their
        assembly; see :mod:`.dense`).
    dense_join : dict
        ``front -> launch`` before which each dense front must be done (its
        parent's Pack-Assemble; ``nlaunch``: the end of the stage).
    """

    fronts: tuple
    launch_ptr: np.ndarray
    foff: np.ndarray
    carried: dict
    pool_size: int
    s_range: tuple
    finish: dict = field(default_factory=dict)
    dense: dict = field(default_factory=dict)
    dense_join: dict = field(default_factory=dict)
    _maker: object = field(default=None, repr=False)
    _tasks: np.ndarray | None = field(default=None, repr=False)

    @property
    def nlaunch(self) -> int:
        return len(self.launch_ptr) - 1

    @property
    def ntasks(self) -> int:
        """Records of the stage (known without materializing them)."""
        return int(self.launch_ptr[-1])

    @property
    def tasks(self) -> np.ndarray:
        """All records of the stage (TASK_DTYPE, sorted by launch; built once)."""
        if self._tasks is None:
            self._tasks = self._maker.records(0, self.nlaunch)
        return self._tasks

    @property
    def materialized(self) -> bool:
        return self._tasks is not None

    def launch_tasks(self, L: int) -> np.ndarray:
        """Records of launch ``L`` (a view when the stage is materialized)."""
        if not 0 <= L < self.nlaunch:
            raise IndexError(f"launch {L} out of range [0, {self.nlaunch})")
        if self._tasks is not None:
            return self._tasks[self.launch_ptr[L]:self.launch_ptr[L + 1]]
        return self._maker.records(L, L + 1)

    def launch_range(self, L0: int, L1: int) -> list:
        """Records of launches ``L0 … L1-1``, one array per launch (views of one
        array built in one pass; views of :attr:`tasks` when materialized)."""
        if not 0 <= L0 <= L1 <= self.nlaunch:
            raise IndexError(f"launches [{L0}, {L1}) out of range [0, {self.nlaunch})")
        lp = self.launch_ptr
        if self._tasks is not None:
            t, base = self._tasks, 0
        else:
            t, base = self._maker.records(L0, L1), int(lp[L0])
        b = (lp[L0:L1 + 1] - base).tolist()
        return [t[b[k]:b[k + 1]] for k in range(L1 - L0)]

    def launch_chunks(self):
        """Launch ranges ``(L0, L1)`` :meth:`SparseSchedule.iter_launches` builds
        at once: 1 launch, then twice as many each time, up to
        :data:`CHUNK_LAUNCHES` launches or :data:`CHUNK` records (a launch
        larger than that alone)."""
        lp = self.launch_ptr.tolist()
        nlaunch = len(lp) - 1
        out = []
        L0, want = 0, 1
        while L0 < nlaunch:
            L1 = L0 + 1
            while L1 < nlaunch and L1 - L0 < want and lp[L1 + 1] - lp[L0] <= CHUNK:
                L1 += 1
            out.append((L0, L1))
            L0, want = L1, min(2 * want, CHUNK_LAUNCHES)
        return out


@dataclass(eq=False)
class SparseSchedule:
    """Task lists of a whole factorization (see :func:`build_schedule`).

    Attributes
    ----------
    stages : list of StageSchedule
    tile, bundle, granule : int
    pipelining : bool
    vt_base : ndarray of int64 (nfronts,)
        First VT tile element of each front in the VT pool (kept H: one
        tile per Factorize, never reused).
    vt_size : int
        Elements of the VT pool.
    nfact : ndarray of int64 (nfronts,)
        Columns each front eliminates (``min(fm, fn)``).
    critical_path : int
        Launches of the longest leaf-to-root chain (assembly, factorization
        and packing launches; no launch limit, one stage).
    seconds : float
        CPU time to build the schedule (with every record, unless it was
        built ``lazy``: then the plan only).
    dense_flops : float or None
        Threshold of the dense fronts (see :mod:`.dense`).
    dense : dict
        ``front -> global launch`` after which each dense front is factorized
        (launches numbered across stages).
    """

    stages: list
    tile: int
    bundle: int
    granule: int
    pipelining: bool
    vt_base: np.ndarray
    vt_size: int
    nfact: np.ndarray
    critical_path: int
    seconds: float
    dense_flops: float | None = None
    dense: dict = field(default_factory=dict)
    #: Objects the engines derive from this schedule alone and keep with it (as it is
    #: cached per pattern): e.g. the GPU engine's replay plans (``solve.plan_of``).
    extras: dict = field(default_factory=dict, repr=False)
    #: The plan file this schedule goes to once its records exist (:meth:`materialize`):
    #: at most one slot, taken by the first materialization; empty where the plan
    #: came from a file, was handed to the writer already, or the store is off.
    _unsaved: list = field(default_factory=list, repr=False)

    @property
    def nlaunch(self) -> int:
        return sum(s.nlaunch for s in self.stages)

    @property
    def ntasks(self) -> int:
        return sum(s.ntasks for s in self.stages)

    @property
    def nlaunch_with_tasks(self) -> int:
        """Launches with at least one record (a dense front's deferral launches
        are empty: they only delay its parent's pack)."""
        return sum(int(np.count_nonzero(np.diff(s.launch_ptr))) for s in self.stages)

    def materialize(self) -> "SparseSchedule":
        """Build every stage's records now (idempotent); returns self.

        A schedule :func:`build_schedule` made for a plan file is handed to the
        store's writer here, once: the file takes the records as made (a call
        materializes them anyway), so the writer never makes them again beside
        the call that is making them.
        """
        for st in self.stages:
            st.tasks
        try:
            where = self._unsaved.pop()         # one thread takes it (atomic)
        except IndexError:
            return self
        disk.write_behind(disk.save_plan, where, self, _plan_arrays)
        return self

    def iter_launches(self, prefetch: bool = True):
        """Yield ``(stage index, launch, records)`` launch after launch.

        Records are built only when asked for, a *chunk* of launches at a time
        (:meth:`StageSchedule.launch_chunks`: one launch first, then twice as
        many each time, up to :data:`CHUNK_LAUNCHES` launches or
        :data:`CHUNK` records; one NumPy pass per chunk instead of one per
        launch). With ``prefetch`` a worker thread builds the next chunk while
        the caller works on the launches of this one (the caller may keep the
        records; they are never reused).
        """
        jobs = [(i, L0, L1) for i, st in enumerate(self.stages)
                for L0, L1 in st.launch_chunks()]

        def build(job):
            i, L0, L1 = job
            return self.stages[i].launch_range(L0, L1)

        if not prefetch or len(jobs) < 2:
            for job in jobs:
                for L, rec in zip(range(job[1], job[2]), build(job)):
                    yield job[0], L, rec
            return
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuqr-launch-records")
        try:
            nxt = pool.submit(build, jobs[0])
            for k, job in enumerate(jobs):
                cur = nxt.result()
                if k + 1 < len(jobs):
                    nxt = pool.submit(build, jobs[k + 1])
                else:
                    pool.shutdown(wait=False)       # nothing left to build
                for L, rec in zip(range(job[1], job[2]), cur):
                    yield job[0], L, rec
        finally:
            # Never a join here: a generator left suspended (its caller takes
            # exactly the launches it needs) is closed by the garbage collector,
            # which may run inside threading's own locked sections, where
            # joining a thread deadlocks the process.
            pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------ per-pattern cache

#: Most schedules kept per process by pattern (:class:`.pattern_cache.PerPattern`).
MEMORY_ENTRIES = 8
#: Most bytes of schedule arrays kept per process by pattern.
MEMORY_BYTES = 1 << 30


def schedule_nbytes(sched) -> int:
    """Bytes of a schedule's arrays (its records only once materialized)."""
    total = int(sched.vt_base.nbytes + sched.nfact.nbytes)
    for v in list(getattr(sched, "extras", {}).values()):
        for a in vars(v).values() if hasattr(v, "__dict__") else ():
            if isinstance(a, np.ndarray):
                total += int(a.nbytes)
    for st in sched.stages:
        total += int(st.launch_ptr.nbytes + st.foff.nbytes)
        if st._tasks is not None:
            total += int(st._tasks.nbytes)
    return total


_SCHEDULES = PerPattern(MEMORY_ENTRIES, MEMORY_BYTES, schedule_nbytes)


def clear_schedule_cache(analysis=None) -> None:
    """Forget the cached schedules of ``analysis`` (its pattern's and its own;
    None: every schedule)."""
    _SCHEDULES.clear(analysis)


def _cache_get(analysis, key):
    return _SCHEDULES.get(analysis, key)


def _cache_put(analysis, key, sched) -> None:
    _SCHEDULES.put(analysis, key, sched)


# ------------------------------------------------------------------------ the builder

def _tiled_fronts(fs, tile, dense=None):
    """The fronts' tile buckets and what the pattern builders take of them:
    ``(buckets, bucket pointers, column tiles, factorized column tiles, the
    fronts factorized by tiles (not empty, not ``dense``), min(m, n) per front)``."""
    nfact = np.minimum(fs.fm, fs.fn).astype(np.int64)
    b, tptr = bucket.many_tile_buckets(fs.fm, fs.fn, nfact, fs.stair, fs.col_ptr, tile)
    nct = -(-fs.fn // tile)
    nfct = np.where(nfact > 0, -(-nfact // tile), 0)
    tiled = nfact > 0
    if dense is not None:
        tiled &= ~dense
    return b, tptr, nct, nfct, np.flatnonzero(tiled), nfact


def _front_patterns(fs, tile, bundle, pipelining, granule, dense=None):
    """The distinct tile schedules and each front's (-1: nothing to factorize, or a
    dense front, ``dense`` mask)."""
    b, tptr, nct, nfct, fac, nfact = _tiled_fronts(fs, tile, dense)
    uniq, which = bucket.front_patterns(b, tptr, nct, nfct, fac, bundle=bundle,
                                        pipelining=pipelining, granule=granule)
    pat_of = np.full(fs.nfronts, -1, dtype=np.int64)
    pat_of[fac] = which
    return uniq, pat_of, nfact


def _front_pattern_counts(fs, tile, bundle, pipelining, granule, dense=None):
    """:func:`_front_patterns`' VT tiles and records per distinct pattern, and each
    front's pattern (-1: nothing to factorize, or a dense front), without the
    patterns' rows where only the disk has them (:func:`.bucket.front_pattern_counts`)."""
    b, tptr, nct, nfct, fac, _ = _tiled_fronts(fs, tile, dense)
    nvt, nrec, which = bucket.front_pattern_counts(b, tptr, nct, nfct, fac, bundle=bundle,
                                                   pipelining=pipelining, granule=granule)
    pat_of = np.full(fs.nfronts, -1, dtype=np.int64)
    pat_of[fac] = which
    return nvt, nrec, pat_of


def _tail_lengths(fs, nl):
    """Launches from a front's start to the end of the root of its path."""
    nf = fs.nfronts
    parent = fs.parent.tolist()
    tail = [0] * nf
    for f in range(nf - 1, -1, -1):
        p = parent[f]
        tail[f] = nl[f] + 1 + (tail[p] if p >= 0 else 0)
    return tail


def _path_sums(parent, w):
    """``sum of w`` over the path from every front to its root (pointer jumping)."""
    s = np.asarray(w, dtype=np.int64).copy()
    up = np.asarray(parent, dtype=np.int64).copy()
    while True:
        has = up >= 0
        if not has.any():
            return s
        s[has] += s[up[has]]
        up[has] = up[up[has]]


def build_schedule(analysis, *, tile: int = DEFAULT_TILE, bundle: int = DEFAULT_BUNDLE,
                   pipelining: bool = True, granule: int = DEFAULT_APPLY_GRANULE,
                   max_gpu_memory: int | None = None, max_tasks: int | None = None,
                   plan=None, lazy: bool = False, cache: bool = True,
                   dense_flops: float | None = None,
                   dense_columns_per_launch: int = DENSE_COLUMNS_PER_LAUNCH,
                   dense_extra=None, stored_only: bool = False) -> SparseSchedule | None:
    """Build the task lists of every stage of a factorization.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    tile, bundle, granule : int
        Tunables of the bucket scheduler.
    pipelining : bool
        Apply+Factorize tasks and bundle growth.
    max_gpu_memory : int or None
        Byte budget for the staging plan (None: one stage).
    max_tasks : int or None
        Launch-size limit (records per launch; a single front step larger
        than the limit still runs alone).
    plan : StagePlan, optional
        Use this staging plan instead of ``analysis.stage_plan(max_gpu_memory)``.
    lazy : bool
        Plan only (front state machines, launch sizes, assembly records);
        the records of each launch are built when asked for
        (:meth:`StageSchedule.launch_tasks`, :meth:`SparseSchedule.iter_launches`)
        or all at once by :attr:`StageSchedule.tasks`. A new plan goes to
        its file (the store on) when :meth:`SparseSchedule.materialize` has
        made every record, here at once unless ``lazy``.
    cache : bool
        Reuse the schedule built before for an analysis of the same pattern
        (``pattern_key``; the same object when it has none) and arguments:
        ``refactor`` and a new factorization of a known pattern get it for
        free. The per-process table is bounded (:data:`MEMORY_ENTRIES`,
        :data:`MEMORY_BYTES`); a schedule of an analysis without a key lives
        as long as that analysis.
    dense_flops : float or None
        Fronts of at least this many Householder flops are *dense fronts*
        (no tile tasks; factorized by the engine after the launch that
        assembles them, see :mod:`.dense`). None: none (the default here;
        the engines pass :data:`~.dense.DEFAULT_DENSE_FLOPS`).
    dense_columns_per_launch : int
        A dense front defers its parent's Pack-Assemble by one launch per
        this many columns (:func:`~.dense.dense_defer`; 0: packed at the
        next launch).
    dense_extra : iterable of int, optional
        Fronts made dense fronts besides ``dense_flops``' choice (a
        multi-device factorization splits them over its devices,
        :mod:`.dense_split`).
    stored_only : bool
        Only a schedule kept in memory or whose plan an earlier process saved
        (read ahead of a call that will likely ask for it); None where there is
        neither (nothing is built).

    Returns
    -------
    SparseSchedule or None
        With ``cache`` the very object built the first time (treat it as
        read-only).
    """
    bucket.check_tunables(bundle, granule)
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    if plan is None:
        plan = analysis.stage_plan(max_gpu_memory)
    if dense_flops is not None and not np.isfinite(dense_flops):
        dense_flops = None
    extra = tuple(sorted({int(f) for f in dense_extra})) if dense_extra is not None else ()
    key = (int(tile), int(bundle), bool(pipelining), int(granule),
           None if max_tasks is None else int(max_tasks),
           tuple((int(a), int(b)) for a, b in plan.stages),
           None if dense_flops is None else float(dense_flops),
           int(dense_columns_per_launch) if dense_flops is not None or extra else 0) \
        + ((extra,) if extra else ())
    if cache:
        hit = _cache_get(analysis, key)
        if hit is not None:
            return hit if lazy else hit.materialize()
    t0 = time.process_time()
    # a plan built by an earlier process for the same structure and arguments
    dense = _dense_mask(analysis, dense_flops, extra)
    pargs = {"tile": int(tile), "bundle": int(bundle), "pipelining": bool(pipelining),
             "granule": int(granule), "max_tasks": key[4], "dense_flops": key[6],
             "dense_columns_per_launch": key[7]}
    where = disk.plan_slot(analysis, plan, dense, pargs)
    out = disk.load_plan(where, lambda a, facts: _plan_of_arrays(a, facts, analysis.fronts,
                                                                 pargs))
    if out is None and stored_only:
        return None
    if out is None:
        out = _build(analysis, plan, int(tile), int(bundle), bool(pipelining), int(granule),
                     max_tasks, dense_flops, int(dense_columns_per_launch), extra)
        if where is not None:               # written behind its materialization
            out._unsaved.append(where)
    if not lazy:
        out.materialize()
    out.seconds = time.process_time() - t0
    if cache:
        _cache_put(analysis, key, out)
    return out


def _dense_mask(analysis, dense_flops, extra=()):
    """The dense fronts: ``dense_flops``' choice and the fronts ``extra``."""
    dense = dense_front_mask(analysis, dense_flops)
    if len(extra):
        dense = dense.copy()
        dense[list(extra)] = True
    return dense


def _build(analysis, plan, tile, bundle, pipelining, granule, max_tasks,
           dense_flops=None, dense_cpl=DENSE_COLUMNS_PER_LAUNCH, extra=()) -> SparseSchedule:
    fs = analysis.fronts
    nf = fs.nfronts
    dense = _dense_mask(analysis, dense_flops, extra)
    uniq, pat_of, nfact = _front_patterns(fs, tile, bundle, pipelining, granule, dense)
    ctx = _Templates(uniq, fs, nfact, tile)
    has = pat_of >= 0
    pat = np.maximum(pat_of, 0)
    # every pattern's row and record pointers end to end (nlaunch + 1 entries each)
    p_nl = np.array([u.nlaunch for u in uniq], dtype=np.int64)
    p_nvt = np.array([u.nvt for u in uniq], dtype=np.int64)
    p_ptr = np.zeros(len(uniq) + 1, dtype=np.int64)
    np.cumsum(p_nl + 1, out=p_ptr[1:])
    p_rp = np.concatenate([u.row_ptr for u in uniq]) if uniq else np.zeros(0, np.int64)
    p_lp = np.concatenate([u.launch_ptr for u in uniq]) if uniq else np.zeros(0, np.int64)
    nl_a = np.where(has, p_nl[pat] if uniq else 0, 0)
    stage_of = np.zeros(nf, dtype=np.int64)
    for sid, (a, b) in enumerate(plan.stages):
        stage_of[a:b + 1] = sid
    # a dense front's local launches are empty: they only defer its parent's pack
    # (none when no parent packs it in this stage: the stage's end waits for it)
    defer = dense_defer(nfact, dense_cpl)
    par_a = fs.parent
    dfr_all = np.flatnonzero(dense)
    if len(dfr_all):
        p = par_a[dfr_all]
        own = (p >= 0) & (stage_of[np.maximum(p, 0)] == stage_of[dfr_all])
        nl_a[dfr_all] = np.where(own, defer[dfr_all], 0)
    nl = nl_a.tolist()
    nvt = np.where(has, p_nvt[pat] if uniq else 0, 0)
    tt = tile * tile
    vt_base = np.zeros(nf, dtype=np.int64)
    if nf:
        vt_base[1:] = np.cumsum(nvt)[:-1] * tt
    ctx.vt_base = vt_base
    path = _path_sums(par_a, nl_a + 1)
    crit = int(path.max()) + 1 if nf else 0
    fd = _first_descendants(fs) if max_tasks is None else None
    # per-step task counts of every front (for the launch limit)
    counts = tail = None
    if max_tasks is not None:
        tail = _tail_lengths(fs, nl)
        per_pat = [np.diff(u.launch_ptr).tolist() for u in uniq]
        counts = [per_pat[k] if k >= 0 else [0] * nl[f]
                  for f, k in enumerate(pat_of.tolist())]
    parent = fs.parent.tolist()
    chp, ch = fs.child_ptr.tolist(), fs.children.tolist()
    fn_l, fp_l = fs.fn.tolist(), fs.fp.tolist()
    cm_l = fs.cm.tolist()
    stage_of_l = stage_of.tolist()

    stages = []
    dense_global = {}
    launch0 = 0             # global number of the stage's first launch
    for sid, (first, last) in enumerate(plan.stages):
        members = range(first, last + 1)
        foff = np.full(nf, -1, dtype=np.int64)
        sizes = fs.fm[first:last + 1] * fs.fn[first:last + 1]
        foff[first:last + 1] = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        pool = int(sizes.sum())
        carried = {}
        for f in (members if sid else ()):      # the first stage carries nothing
            for c in ch[chp[f]:chp[f + 1]]:
                if stage_of_l[c] < sid:
                    carried[c] = pool
                    pool += cm_l[c] * (fn_l[c] - fp_l[c])
        if max_tasks is None:
            asm_a, fin_a = _state_machine_unlimited(first, last, fd, path, nl_a)
            step_launch = None
        else:
            step_launch, finish, asm_launch, _ = _state_machine(
                members, first, last, sid, ch, chp, parent, stage_of_l, nl, tail, counts,
                max_tasks)
            asm_a = np.array([asm_launch[f] for f in members], dtype=np.int64)
            fin_a = np.array([finish[f] for f in members], dtype=np.int64)
        # a front is packed into its parent (in the stage) the launch after its last step
        par_st = par_a[first:last + 1]
        in_st = (par_st >= 0) & (stage_of[np.maximum(par_st, 0)] == sid)
        pack_a = np.where(in_st, fin_a + 1, -1)
        has_steps = np.asarray(nl[first:last + 1]) > 0
        nlaunch = int(max(np.max(fin_a + 1, where=has_steps, initial=0),
                          np.max(pack_a + 1, initial=0), np.max(asm_a + 1, initial=0)))
        finish = dict(zip(range(first, last + 1), fin_a.tolist()))
        # ---- factorization blocks: (front, local step) -> global launch -------------
        fa = np.flatnonzero((nl_a[first:last + 1] > 0) & has[first:last + 1]) + first
        if len(fa):
            fac = fa.tolist()
            nlf = nl_a[fa]
            blk_front = np.repeat(fa, nlf)
            # local step k of front f: rows [rp[k], rp[k+1]) of its pattern
            k_of = np.arange(len(blk_front)) - np.repeat(np.cumsum(nlf) - nlf, nlf)
            if step_launch is None:     # a front's steps run in consecutive launches
                blk_L = np.repeat(asm_a[fa - first] + 1, nlf) + k_of
            else:
                blk_L = np.concatenate([np.asarray(step_launch[f], dtype=np.int64)
                                        for f in fac])
            bp = pat_of[blk_front]
            at = p_ptr[bp] + k_of
            blk_rstart = ctx.base[bp] + p_rp[at]
            blk_rlen = p_rp[at + 1] - p_rp[at]
            blk_len = p_lp[at + 1] - p_lp[at]
            o = np.argsort(blk_L, kind="stable")
            blk = (blk_L[o], blk_rstart[o], blk_rlen[o], blk_len[o], blk_front[o])
        else:
            z = np.zeros(0, dtype=np.int64)
            blk = (z, z, z, z, z)
        asm, asm_L = _assembly_sorted(fs, first, last, sid, stage_of, foff, carried,
                                      asm_a, pack_a, nlaunch)
        maker = _StageMaker(ctx, foff, blk, asm, asm_L, nlaunch)
        s0 = int(fs.s_ptr[first])
        s1 = int(fs.s_ptr[last + 1])
        # a dense front is "factorized externally" right after the launch that
        # completes its assembly (the state machine's finish of a front without
        # local launches); its parent packs it one launch later
        dfr = (np.flatnonzero(dense[first:last + 1]) + first).tolist()
        dmap = {f: int(asm_a[f - first]) for f in dfr}
        for f, L in dmap.items():
            dense_global[int(f)] = launch0 + L
        stages.append(StageSchedule(fronts=(first, last), launch_ptr=maker.launch_ptr,
                                    foff=foff, carried=carried, pool_size=pool,
                                    s_range=(s0, s1), finish=finish,
                                    dense={int(f): L for f, L in dmap.items()},
                                    dense_join={f: int(finish[f]) + 1 for f in dfr},
                                    _maker=maker))
        launch0 += nlaunch
    return SparseSchedule(stages=stages, tile=tile, bundle=bundle, granule=granule,
                          pipelining=pipelining, vt_base=vt_base,
                          vt_size=int(nvt.sum()) * tt, nfact=nfact,
                          critical_path=crit, seconds=0.0, dense_flops=dense_flops,
                          dense=dense_global)


# ------------------------------------------------------------------ plan <-> arrays

def _dict_arrays(d: dict):
    items = sorted(d.items())
    return np.array([k for k, _ in items], dtype=np.int64), \
        np.array([v for _, v in items], dtype=np.int64)


#: Most bytes of records a plan file keeps (:func:`_plan_arrays`): a larger
#: schedule's records are made again from the plan by each new process.
PLAN_RECORDS_MAX_BYTES = 48 << 20


def _plan_arrays(sched: SparseSchedule) -> tuple:
    """The arrays and JSON facts of a lazily built schedule's plan (what
    :func:`.cache.save_plan` writes; :func:`_plan_of_arrays` makes it again).

    Where all of its records take at most :data:`PLAN_RECORDS_MAX_BYTES`, every
    stage's records go in too, as the engines run them (each launch's longest
    first): a new process's first call of the pattern then materializes the
    schedule without filling, costing and reordering them again (tens of
    milliseconds for a grid 40³). They are the stages' own records
    (:attr:`StageSchedule.tasks`: the store writes a plan once it is
    materialized, :meth:`SparseSchedule.materialize`).

    Raises
    ------
    ValueError
        Stages with different templates (a plan not built by :func:`_build`).
    """
    st0 = sched.stages[0]
    ctx = st0._maker.ctx
    a = {"rows": ctx.rows, "mult": ctx.mult, "vt_base": sched.vt_base, "nfact": sched.nfact}
    a["dense_f"], a["dense_L"] = _dict_arrays(sched.dense)
    stages = []
    keep = sched.ntasks * TASK_DTYPE.itemsize <= PLAN_RECORDS_MAX_BYTES
    for i, st in enumerate(sched.stages):
        m = st._maker
        if m.ctx is not ctx:
            raise ValueError("stages with different templates")
        if keep:
            t = st.tasks
            a[f"s{i}_tasks"] = t.view(np.int64).reshape(len(t), TASK_DTYPE.itemsize // 8)
        for j, v in enumerate((m.blk_L, m.blk_rstart, m.blk_rlen, m.blk_len, m.blk_front)):
            a[f"s{i}_blk{j}"] = v
        a[f"s{i}_asm"] = m.asm
        a[f"s{i}_asm_L"] = np.repeat(np.arange(len(m.asm_ptr) - 1, dtype=np.int64),
                                     np.diff(m.asm_ptr))
        a[f"s{i}_foff"] = st.foff
        for name in ("carried", "finish", "dense", "dense_join"):
            a[f"s{i}_{name}_k"], a[f"s{i}_{name}_v"] = _dict_arrays(getattr(st, name))
        stages.append({"fronts": list(st.fronts), "pool_size": int(st.pool_size),
                       "s_range": list(st.s_range), "nlaunch": int(st.nlaunch)})
    facts = {"stages": stages, "vt_size": int(sched.vt_size),
             "critical_path": int(sched.critical_path), "granule": int(ctx.granule),
             "tile": int(ctx.tile)}
    return a, facts


def _plan_of_arrays(a: dict, facts: dict, fs, args: dict) -> SparseSchedule:
    """The lazily built schedule of :func:`_plan_arrays`' arrays and facts, for
    the fronts ``fs`` and the builder's arguments ``args``; materialized where
    the file keeps the records (their count checked against the plan's launch
    pointers: ValueError, a damaged file)."""
    ctx = object.__new__(_Templates)
    ctx.rows, ctx.mult = a["rows"], a["mult"]
    ctx.base = None
    ctx.granule, ctx.tile = facts["granule"], facts["tile"]
    nfact = a["nfact"]
    ctx.fm = fs.fm.astype(np.int32)
    ctx.fn = fs.fn.astype(np.int32)
    ctx.nfact = nfact.astype(np.int32)
    ctx.vt_base = a["vt_base"]
    stages = []
    for i, info in enumerate(facts["stages"]):
        blk = tuple(a[f"s{i}_blk{j}"] for j in range(5))
        asm = a[f"s{i}_asm"].view(TASK_DTYPE).ravel()
        d = {name: dict(zip(a[f"s{i}_{name}_k"].tolist(), a[f"s{i}_{name}_v"].tolist()))
             for name in ("carried", "finish", "dense", "dense_join")}
        maker = _StageMaker(ctx, a[f"s{i}_foff"], blk, asm, a[f"s{i}_asm_L"], info["nlaunch"])
        tasks = a.get(f"s{i}_tasks")
        if tasks is not None:
            if tasks.ndim != 2 or tasks.shape != (int(maker.launch_ptr[-1]),
                                                  TASK_DTYPE.itemsize // 8):
                raise ValueError("records of another plan")
            tasks = tasks.view(TASK_DTYPE).ravel()
        stages.append(StageSchedule(fronts=tuple(info["fronts"]), launch_ptr=maker.launch_ptr,
                                    foff=a[f"s{i}_foff"], carried=d["carried"],
                                    pool_size=info["pool_size"],
                                    s_range=tuple(info["s_range"]), finish=d["finish"],
                                    dense=d["dense"], dense_join=d["dense_join"],
                                    _maker=maker, _tasks=tasks))
    return SparseSchedule(stages=stages, tile=args["tile"], bundle=args["bundle"],
                          granule=args["granule"], pipelining=args["pipelining"],
                          vt_base=a["vt_base"], vt_size=facts["vt_size"], nfact=nfact,
                          critical_path=facts["critical_path"], seconds=0.0,
                          dense_flops=args["dense_flops"],
                          dense=dict(zip(a["dense_f"].tolist(), a["dense_L"].tolist())))


def _first_descendants(fs) -> np.ndarray:
    """First front of every front's subtree (postorder: the subtree of f is
    ``fd[f] … f``), by pointer jumping along first children."""
    nf = fs.nfronts
    chp = np.asarray(fs.child_ptr, dtype=np.int64)
    nch = np.diff(chp)
    jump = np.arange(nf, dtype=np.int64)
    has = nch > 0
    if has.any():
        jump[has] = np.minimum.reduceat(np.asarray(fs.children, dtype=np.int64),
                                        chp[:-1][has])
    while True:
        nxt = jump[jump]
        if np.array_equal(nxt, jump):
            return jump
        jump = nxt


def _state_machine_unlimited(first, last, fd, path, nl_a):
    """:func:`_state_machine` without a launch limit, in closed form (postorder).

    Every front that can make progress does, so a front assembles in the
    launch after its last in-stage child's last step (launch 0 for the
    stage's leaves), runs its ``nl`` steps in the launches right after its
    assembly, and is packed into its parent in the launch after its last
    step: its last step is ``max (path[d] - path[f]) + nl[f]`` over the
    in-stage fronts d of its subtree (``path``: sums of ``nl + 1`` from every
    front to its root; the subtree of f in the stage is ``max(fd[f], first) …
    f``). Returns the assembly launch and the last step's launch of every
    front of the stage (int64 arrays, stage order).
    """
    f = np.arange(first, last + 1, dtype=np.int64)
    lo = np.maximum(fd[first:last + 1], first) - first
    v = np.append(path[first:last + 1], 0)
    # max over v[lo:f+1] of every front: reduceat over the pairs (lo, f+1)
    idx = np.empty(2 * len(f), dtype=np.int64)
    idx[0::2] = lo
    idx[1::2] = f - first + 1
    top = np.maximum.reduceat(v, idx)[0::2] if len(f) else np.zeros(0, np.int64)
    fin = top - path[first:last + 1] + nl_a[first:last + 1]
    return fin - nl_a[first:last + 1], fin


def _state_machine(members, first, last, sid, ch, chp, parent, stage_of, nl, tail, counts,
                   max_tasks):
    """Front-level state machines of one stage, launch by launch.

    Returns the global launch of every local step of every front, the last
    factorization launch of each front, and the launches of each front's
    S-Assemble and of each child's Pack-Assemble.
    """
    pending = {f: sum(1 for c in ch[chp[f]:chp[f + 1]] if stage_of[c] == sid)
               for f in members}
    asm_launch = {}     # f -> launch of its S-Assemble (and carried packs)
    pack_launch = {}    # child -> launch of its Pack-Assemble into the parent
    step_launch = {}    # f -> list of global launches of its local steps
    finish = {}
    ready_heap = {}     # launch -> fronts that may start factorizing then
    for f in members:   # leaves of the stage (no in-stage children) assemble at launch 0
        if pending[f] == 0:
            asm_launch[f] = 0
            ready_heap.setdefault(1, []).append(f)
    active = []         # fronts factorizing: [-tail, f, next local step]
    L = 0
    done = 0
    nmem = last - first + 1
    while done < nmem:
        for f in ready_heap.pop(L, ()):
            step_launch[f] = []
            if nl[f] == 0:
                finish[f] = L - 1
                done += 1
                _release(f, L - 1, parent, stage_of, sid, pending, asm_launch,
                         pack_launch, ready_heap)
            else:
                active.append([-tail[f], f, 0])
        if done < nmem and not active and not ready_heap:
            raise AssertionError("sparse scheduler stalled")  # pragma: no cover
        active.sort()
        used = 0
        still = []
        for item in active:
            _, f, k = item
            cnt = counts[f][k]
            if max_tasks is not None and used and used + cnt > max_tasks:
                still.append(item)
                continue
            used += cnt
            step_launch[f].append(L)
            item[2] = k + 1
            if k + 1 == nl[f]:
                finish[f] = L
                done += 1
                _release(f, L, parent, stage_of, sid, pending, asm_launch,
                         pack_launch, ready_heap)
            else:
                still.append(item)
        active = still
        L += 1
    return step_launch, finish, asm_launch, pack_launch


def _release(f, L, parent, stage_of, sid, pending, asm_launch, pack_launch, ready_heap):
    """Front f's last step ran in launch L: pack it into its parent at L+1."""
    p = parent[f]
    if p < 0 or stage_of[p] != sid:
        return
    pack_launch[f] = L + 1
    pending[p] -= 1
    if pending[p] == 0:
        asm_launch[p] = L + 1
        ready_heap.setdefault(L + 2, []).append(p)


class _Templates:
    """The unique tile schedules' rows end to end (element units), per-front facts."""

    def __init__(self, scheds, fs, nfact, tile):
        words = TASK_DTYPE.itemsize // 8
        self.base = np.zeros(len(scheds), dtype=np.int64)
        self.granule = scheds[0].granule if scheds else 1
        # Patterns simulated together share one row block: a block mostly used here
        # goes in whole (its element rows made once for all its patterns, no copy per
        # pattern); the patterns of a block mostly unused (e.g. cached from another
        # matrix) go in one by one.
        used = {}
        for s in scheds:
            u = used.setdefault(id(s.block), [s.block, 0])
            u[1] += s.nrows
        rows, mult = [], []
        at = 0
        whole = {}
        for key, (blk, n) in used.items():
            if 2 * n >= len(blk):
                whole[key] = at
                rows.append(blk.element_rows(tile))
                mult.append(blk.cols["mult"])
                at += len(blk)
        alone = [k for k, s in enumerate(scheds) if id(s.block) not in whole]
        for k, s in enumerate(scheds):
            off = whole.get(id(s.block))
            if off is not None:
                self.base[k] = off + s.span[0]
        if alone:
            part = [scheds[k] for k in alone]
            cached = [s.element_rows(tile) if s.block.has_element_rows(tile)
                      else s.__dict__.get("_element_rows", {}).get(tile) for s in part]
            if all(c is not None for c in cached):
                rows.append(np.concatenate(cached))
            else:
                rc = {k: np.concatenate([s.rcols[k] for s in part]) for k in bucket.COLUMNS}
                rows.append(bucket.element_rows_of(rc, tile))
            mult.append(np.concatenate([s.rcols["mult"] for s in part]))
            nrow = np.array([s.nrows for s in part], dtype=np.int64)
            self.base[alone] = at + np.cumsum(nrow) - nrow
        if len(rows) == 1:          # one block (a cold plan): its arrays as they are
            self.rows, self.mult = rows[0], mult[0]
        else:
            self.rows = np.concatenate(rows) if rows else np.zeros((0, words), dtype=np.int64)
            self.mult = np.concatenate(mult) if mult else np.zeros(0, dtype=np.int32)
        self.fm = fs.fm.astype(np.int32)
        self.fn = fs.fn.astype(np.int32)
        self.nfact = nfact.astype(np.int32)
        self.tile = tile
        self.vt_base = None

    def fill(self, o, idx, k, front, foff) -> None:
        """Records of rows ``idx`` (granule ``k`` of an Apply run), fronts ``front``,
        into ``o`` (``(m, 12)`` int64 words, C-contiguous)."""
        np.take(self.rows, idx, axis=0, out=o)
        o32 = o.view(np.int32)
        tile = self.tile
        o[:, 0] = foff[front]
        vb = self.vt_base[front]
        o[:, 1] += vb
        isaf = o32[:, 8] == TaskType.APPLY_FACTORIZE
        o[:, 2] += vb * isaf
        fn = self.fn[front]
        nfa = self.nfact[front]
        o32[:, 9] = self.fm[front]
        o32[:, 10] = fn
        kg = (k * (self.granule * tile)).astype(np.int32)
        o32[:, 12] += kg
        np.minimum(o32[:, 13] + kg, fn, out=o32[:, 13])
        np.minimum(tile, nfa - o32[:, 11], out=o32[:, 14])
        o32[:, 15] = front
        o[:, 3] = isaf * np.minimum(tile, nfa - o32[:, 12])


class _StageMaker:
    """Builds any range of a stage's launches from the blocks and assembly records."""

    def __init__(self, ctx, foff, blk, asm, asm_L, nlaunch):
        self.ctx = ctx
        self.foff = foff
        self.blk_L, self.blk_rstart, self.blk_rlen, self.blk_len, self.blk_front = blk
        self.asm = asm.view(np.int64).reshape(len(asm), TASK_DTYPE.itemsize // 8)
        bounds = np.arange(nlaunch + 1)
        self.blk_ptr = np.searchsorted(self.blk_L, bounds)
        self.asm_ptr = np.searchsorted(asm_L, bounds)
        cum = np.zeros(len(self.blk_len) + 1, dtype=np.int64)
        np.cumsum(self.blk_len, out=cum[1:])
        self.blk_at = cum[:-1]                     # fac records before each block
        self.fac_ptr = cum[self.blk_ptr]           # fac records before launch L
        self.nfac = np.diff(self.fac_ptr)
        nasm = np.diff(self.asm_ptr)
        self.launch_ptr = np.zeros(nlaunch + 1, dtype=np.int64)
        np.cumsum(self.nfac + nasm, out=self.launch_ptr[1:])

    def records(self, L0: int, L1: int) -> np.ndarray:
        """Records of launches ``[L0, L1)`` in order (factorization, then assembly),
        each launch's longest first (:func:`~.tasks.longest_first`)."""
        lp = self.launch_ptr
        n = int(lp[L1] - lp[L0])
        out = np.empty(n, dtype=TASK_DTYPE)
        o64 = out.view(np.int64).reshape(n, TASK_DTYPE.itemsize // 8)
        b0, b1 = int(self.blk_ptr[L0]), int(self.blk_ptr[L1])
        lib = native.handle() if b1 > b0 else None
        if lib is not None:
            # each block's records go after its launch's earlier blocks' records
            L = self.blk_L[b0:b1]
            dst = lp[L] - lp[L0] + self.blk_at[b0:b1] - self.fac_ptr[L]
            c = self.ctx
            native.fill(lib, o64, self.blk_rstart[b0:b1], self.blk_rlen[b0:b1],
                        self.blk_front[b0:b1], dst, c.rows, c.mult, self.foff, c.vt_base,
                        c.fm, c.fn, c.nfact, c.tile, c.granule)
        elif b1 > b0:
            rlen = self.blk_rlen[b0:b1]
            rstart = self.blk_rstart[b0:b1]
            rows = ranges(rstart, rstart + rlen)
            idx, k = bucket.expand_rows(rows, self.ctx.mult)
            front = np.repeat(self.blk_front[b0:b1], self.blk_len[b0:b1])
            nfac = len(idx)
            a0, a1 = int(self.asm_ptr[L0]), int(self.asm_ptr[L1])
            if a1 == a0:            # the factorization records are contiguous
                for a in range(0, nfac, CHUNK):
                    e = min(a + CHUNK, nfac)
                    self.ctx.fill(o64[a:e], idx[a:e], k[a:e], front[a:e], self.foff)
            else:
                # launch L's factorization records: fac order [src, src+len) -> out [dst, ...)
                src = self.fac_ptr[L0:L1] - self.fac_ptr[L0]
                dst = lp[L0:L1] - lp[L0]
                ln = self.nfac[L0:L1]
                keep = ln > 0
                src, dst, ln = src[keep].tolist(), dst[keep].tolist(), ln[keep].tolist()
                buf = np.empty((min(CHUNK, nfac), o64.shape[1]), dtype=np.int64)
                j = 0
                for a in range(0, nfac, CHUNK):
                    e = min(a + CHUNK, nfac)
                    self.ctx.fill(buf[:e - a], idx[a:e], k[a:e], front[a:e], self.foff)
                    while j < len(src) and src[j] < e:
                        s0, s1 = max(src[j], a), min(src[j] + ln[j], e)
                        d0 = dst[j] + s0 - src[j]
                        o64[d0:d0 + s1 - s0] = buf[s0 - a:s1 - a]
                        if src[j] + ln[j] <= e:
                            j += 1
                        else:
                            break
        a0, a1 = int(self.asm_ptr[L0]), int(self.asm_ptr[L1])
        if a1 > a0:
            Ls = np.arange(L0, L1)
            na = np.diff(self.asm_ptr[L0:L1 + 1])
            dst = (np.repeat(lp[Ls] - lp[L0] + self.nfac[L0:L1] - (self.asm_ptr[Ls] - a0), na)
                   + np.arange(a1 - a0))
            o64[dst] = self.asm[a0:a1]
        return take_records(out, longest_first(out, lp[L0:L1 + 1] - lp[L0], self.ctx.tile))


def _assembly_sorted(fs, first, last, sid, stage_of, foff, carried, asm_a, pack_a, nlaunch):
    """:func:`_assembly_tasks` sorted by launch (stable; compiled when it can be)."""
    lib = native.handle()
    if lib is not None:
        got = native.assembly(lib, fs, first, last, sid, stage_of, foff, carried, asm_a,
                              pack_a, S_CHUNK, PACK_CHUNK, nlaunch)
        if got is not None:
            return got[0].view(TASK_DTYPE).ravel(), got[1]
    asm, asm_L = _assembly_tasks(fs, first, last, sid, stage_of, foff, carried, asm_a, pack_a)
    o = np.argsort(asm_L, kind="stable")
    words = TASK_DTYPE.itemsize // 8
    return asm.view(np.int64).reshape(-1, words)[o].view(TASK_DTYPE).ravel(), asm_L[o]


def _assembly_tasks(fs, first, last, sid, stage_of, foff, carried, asm_a, pack_a):
    """S-Assemble and Pack-Assemble records of one stage (vectorized), and launches.

    ``asm_a``, ``pack_a``: each front's assembly launch and the launch that
    packs it into its parent (-1: not in this stage), in stage order.
    """
    members = np.arange(first, last + 1, dtype=np.int64)
    asm_L = asm_a
    # ---- S-Assemble: chunks of S_CHUNK entries (stage-relative) per front
    sbase = int(fs.s_ptr[first])
    s0 = fs.s_ptr[first:last + 1] - sbase
    s1 = fs.s_ptr[first + 1:last + 2] - sbase
    nch = -(-(s1 - s0) // S_CHUNK)
    sf = np.repeat(np.arange(len(members)), nch)
    k = np.arange(len(sf)) - np.repeat(np.cumsum(nch) - nch, nch)
    ts = empty_tasks(len(sf))
    ts["type"] = TaskType.S_ASSEMBLE
    ts["F"] = foff[members[sf]]
    a = s0[sf] + k * S_CHUNK
    ts["vt"] = a
    ts["vt2"] = np.minimum(a + S_CHUNK, s1[sf])
    ts["front"] = members[sf]
    ls = asm_L[sf]
    # ---- Pack-Assemble: children of the stage's fronts, PACK_CHUNK entries a task
    c0, c1 = int(fs.child_ptr[first]), int(fs.child_ptr[last + 1])
    kids = fs.children[c0:c1].astype(np.int64)
    par = np.repeat(members, np.diff(fs.child_ptr[first:last + 2]))
    cmc = fs.cm[kids]
    cn = fs.fn[kids] - fs.fp[kids]
    keep = (cmc > 0) & (cn > 0)
    kids, par, cmc, cn = kids[keep], par[keep], cmc[keep], cn[keep]
    carried_kid = stage_of[kids] < sid
    base = foff[kids] + fs.frank[kids] * fs.fn[kids] + fs.fp[kids]
    ld = fs.fn[kids].astype(np.int64)
    Lp = np.where(carried_kid, 0, pack_a[np.clip(kids - first, 0, len(members) - 1)])
    for j in np.flatnonzero(carried_kid).tolist():
        base[j] = carried[int(kids[j])]
        ld[j] = cn[j]
    rows_per = np.maximum(1, PACK_CHUNK // cn)
    npk = -(-cmc // rows_per)
    pk = np.repeat(np.arange(len(kids)), npk)
    q = np.arange(len(pk)) - np.repeat(np.cumsum(npk) - npk, npk)
    r0 = q * rows_per[pk]
    tp = empty_tasks(len(pk))
    tp["type"] = TaskType.PACK_ASSEMBLE
    tp["F"] = foff[par[pk]]
    tp["vt"] = base[pk]
    tp["vt2"] = fs.rimap_ptr[kids[pk]]
    tp["aux"] = int(fs.rimap_ptr[-1]) + fs.rjmap_ptr[kids[pk]]
    tp["fn"] = fs.fn[par[pk]]
    tp["fm"] = cmc[pk]
    tp["col"] = ld[pk]
    tp["c0"] = 0
    tp["c1"] = cn[pk]
    tp["rows"][:, 0] = r0
    tp["rows"][:, 1] = np.minimum(r0 + rows_per[pk], cmc[pk])
    tp["front"] = kids[pk]
    tp["nfrows"] = 1
    words = TASK_DTYPE.itemsize // 8
    both = np.concatenate([ts.view(np.int64).reshape(-1, words),
                           tp.view(np.int64).reshape(-1, words)])
    return both.view(TASK_DTYPE).ravel(), np.concatenate([ls, Lp[pk]])


def schedule_digest(sched: SparseSchedule) -> str:
    """A short hash of everything a schedule hands the engines: every stage's
    launch pointers and records, the VT pool size and the dense fronts (tests,
    benchmarks: equal digests mean byte-identical task lists)."""
    h = hashlib.sha256()
    for st in sched.stages:
        h.update(st.launch_ptr.tobytes())
        h.update(st.tasks.tobytes())
    h.update(repr((sched.vt_size, sorted(sched.dense.items()))).encode())
    return h.hexdigest()[:16]


def record_flops(tasks: np.ndarray, tile: int) -> np.ndarray:
    """Nominal flops of each record as the tile kernels run it (zero padding included).

    Factorize part: ``2 n² (m - n/3)`` for ``m = nfrows·tile`` rows and ``n`` =
    its reflectors; Apply part: ``4 m n c`` for ``m = napply·tile`` rows, ``n =
    nref`` reflectors and ``c = c1 - c0`` columns; assembly records: 0.
    """
    typ = tasks["type"]
    out = np.zeros(len(tasks))
    app = applies(typ)
    m = tasks["napply"][app].astype(float) * tile
    out[app] = 4.0 * m * tasks["nref"][app] * (tasks["c1"][app] - tasks["c0"][app])
    for t_, nref_field in ((TaskType.FACTORIZE, "nref"), (TaskType.APPLY_FACTORIZE, "aux")):
        sel = typ == t_
        m = tasks["nfrows"][sel].astype(float) * tile
        n = tasks[nref_field][sel].astype(float)
        out[sel] += 2.0 * n * n * (m - n / 3.0)
    return out


def schedule_stats(analysis, pipelining: bool = True, *, tile: int = DEFAULT_TILE,
                   bundle: int = DEFAULT_BUNDLE, granule: int = DEFAULT_APPLY_GRANULE,
                   max_gpu_memory: int | None = None, max_tasks: int | None = None) -> dict:
    """Statistics of the schedule (JSON-serializable).

    Keys: ``launches`` (with the requested pipelining; every launch, the empty
    ones a dense front defers its parent's pack by included, which the engines'
    defaults have and this function's do not), ``launches_with_tasks``,
    ``launches_no_pipeline``,
    ``tasks`` (and ``tasks_no_pipeline``), ``tasks_by_type``,
    ``tasks_per_launch`` (mean, max), ``tasks_per_launch_by_type`` (type ->
    mean, max), ``tiles_touched_fraction`` (per launch, of the tiles of the
    stage's fronts: mean, max), ``critical_path`` (and
    ``critical_path_no_pipeline``), ``stages``, ``tile_flops`` (nominal flops
    of the tile kernels, :func:`record_flops`), ``build_seconds`` (CPU time
    of the requested schedule when first built), ``tile``, ``bundle``,
    ``granule``, ``pipelining``. The schedules come from the per-analysis
    cache (:func:`build_schedule`).
    """
    kw = dict(tile=tile, bundle=bundle, granule=granule, max_gpu_memory=max_gpu_memory,
              max_tasks=max_tasks)
    s = build_schedule(analysis, pipelining=pipelining, **kw)
    s_no = s if not pipelining else build_schedule(analysis, pipelining=False, lazy=True, **kw)
    by_type = {}
    per_launch = []
    per_type = {t.name.lower(): [] for t in TaskType if t != TaskType.NONE}
    frac = []
    flops = 0.0
    fs = analysis.fronts
    ntype = max(TaskType) + 1
    for st in s.stages:
        t = st.tasks
        typ = t["type"].astype(np.int64)
        cnt = np.diff(st.launch_ptr)
        launch = np.repeat(np.arange(st.nlaunch), cnt)
        pt = np.bincount(launch * ntype + typ, minlength=st.nlaunch * ntype).reshape(-1, ntype)
        for tt_ in TaskType:
            if tt_ != TaskType.NONE:
                per_type[tt_.name.lower()].append(pt[:, int(tt_)])
        a, b = st.fronts
        ntile = int(np.sum(-(-fs.fm[a:b + 1] // tile) * -(-fs.fn[a:b + 1] // tile)))
        touched = np.zeros(len(t), dtype=np.int64)
        fac = factorizes(typ)
        touched[fac] += t["nfrows"][fac]
        app = applies(typ)
        touched[app] += t["napply"][app] * (-(-(t["c1"][app] - t["c0"][app]) // tile))
        per_launch.extend(cnt.tolist())
        if len(t) and ntile:
            sums = np.add.reduceat(touched, st.launch_ptr[:-1][cnt > 0]) / ntile
            frac.extend(sums.tolist())
        flops += float(record_flops(t, tile).sum())
    for name, v in list(per_type.items()):
        v = np.concatenate(v) if v else np.zeros(0)
        if v.sum():
            by_type[name] = int(v.sum())
            per_type[name] = {"mean": float(v.mean()), "max": int(v.max())}
        else:
            del per_type[name]
    pl = np.asarray(per_launch) if per_launch else np.zeros(1)
    fr = np.asarray(frac) if frac else np.zeros(1)
    return {
        "launches": int(s.nlaunch),
        "launches_with_tasks": int(s.nlaunch_with_tasks),
        "launches_no_pipeline": int(s_no.nlaunch),
        "tasks": int(s.ntasks),
        "tasks_no_pipeline": int(s_no.ntasks),
        "tasks_by_type": by_type,
        "tasks_per_launch": {"mean": float(pl.mean()), "max": int(pl.max())},
        "tasks_per_launch_by_type": per_type,
        "tiles_touched_fraction": {"mean": float(fr.mean()), "max": float(fr.max())},
        "critical_path": int(s.critical_path),
        "critical_path_no_pipeline": int(s_no.critical_path),
        "stages": len(s.stages),
        "tile_flops": flops,
        "build_seconds": float(s.seconds),
        "tile": int(tile), "bundle": int(bundle), "granule": int(granule),
        "pipelining": bool(pipelining),
    }
