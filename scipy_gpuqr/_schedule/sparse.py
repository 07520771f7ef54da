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
pattern (``bucket.tile_schedule`` is cached) and instantiated for all fronts
of a stage at once by vectorized NumPy; only the front-level state machine
is a Python loop (over fronts and launches, never over tasks).

Memory of a stage (what the GPU engine allocates; the executor uses the same):
front pool = the stage's fronts row-major one after the other, then the
carried contribution blocks (packed ``cm × (fn - fp)``, upper trapezoidal);
VT pool; S entries of the stage (index relative to the front, value);
maps pool = all Rimap entries, then all Rjmap entries (int64).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import bucket
from .tasks import (DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE, TASK_DTYPE,
                    TaskType, empty_tasks)

__all__ = ["StageSchedule", "SparseSchedule", "build_schedule", "schedule_stats",
           "S_CHUNK", "PACK_CHUNK"]

#: S entries per S-Assemble task.
S_CHUNK = 8192
#: Most contribution-block entries per Pack-Assemble task.
PACK_CHUNK = 16384


@dataclass
class StageSchedule:
    """The task list of one stage.

    Attributes
    ----------
    fronts : (int, int)
        First and last front (postorder, inclusive).
    tasks : ndarray of TASK_DTYPE
        All records, sorted by launch.
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
    """

    fronts: tuple
    tasks: np.ndarray
    launch_ptr: np.ndarray
    foff: np.ndarray
    carried: dict
    pool_size: int
    s_range: tuple
    finish: dict = field(default_factory=dict)

    @property
    def nlaunch(self) -> int:
        return len(self.launch_ptr) - 1


@dataclass
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
        CPU time to build the schedule.
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

    @property
    def nlaunch(self) -> int:
        return sum(s.nlaunch for s in self.stages)

    @property
    def ntasks(self) -> int:
        return sum(len(s.tasks) for s in self.stages)


def _front_templates(fs, tile, bundle, pipelining, granule):
    """Tile schedule of every front (shared between equal patterns)."""
    nf = fs.nfronts
    fm, fn = fs.fm.tolist(), fs.fn.tolist()
    nfact = np.minimum(fs.fm, fs.fn)
    nfl = nfact.tolist()
    cp = fs.col_ptr.tolist()
    scheds = []
    for f in range(nf):
        m, n, k = fm[f], fn[f], nfl[f]
        if k <= 0:
            scheds.append(None)
            continue
        b = bucket.tile_buckets(m, n, fs.stair[cp[f]:cp[f + 1]], k, tile)
        scheds.append(bucket.tile_schedule(b, -(-n // tile), -(-k // tile), bundle=bundle,
                                           pipelining=pipelining, granule=granule))
    return scheds, nfact


def _tail_lengths(fs, nl):
    """Launches from a front's start to the end of the root of its path."""
    nf = fs.nfronts
    parent = fs.parent.tolist()
    tail = [0] * nf
    for f in range(nf - 1, -1, -1):
        p = parent[f]
        tail[f] = nl[f] + 1 + (tail[p] if p >= 0 else 0)
    return tail


def build_schedule(analysis, *, tile: int = DEFAULT_TILE, bundle: int = DEFAULT_BUNDLE,
                   pipelining: bool = True, granule: int = DEFAULT_APPLY_GRANULE,
                   max_gpu_memory: int | None = None, max_tasks: int | None = None,
                   plan=None) -> SparseSchedule:
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
    """
    t0 = time.process_time()
    fs = analysis.fronts
    nf = fs.nfronts
    if plan is None:
        plan = analysis.stage_plan(max_gpu_memory)
    scheds, nfact = _front_templates(fs, tile, bundle, pipelining, granule)
    nl = [s.nlaunch if s is not None else 0 for s in scheds]
    nvt = np.array([s.nvt if s is not None else 0 for s in scheds], dtype=np.int64)
    tt = tile * tile
    vt_base = np.concatenate(([0], np.cumsum(nvt)[:-1])) * tt if nf else np.zeros(0, np.int64)
    tail = _tail_lengths(fs, nl)
    crit = max(tail) + 1 if nf else 0
    # per-step task counts of every front (for the launch limit)
    counts = [np.bincount(s.launch, minlength=s.nlaunch).tolist() if s is not None else []
              for s in scheds]
    parent = fs.parent.tolist()
    chp, ch = fs.child_ptr.tolist(), fs.children.tolist()
    fm_l, fn_l, fp_l = fs.fm.tolist(), fs.fn.tolist(), fs.fp.tolist()
    frank = fs.frank.tolist()
    cm_l = fs.cm.tolist()
    stage_of = np.zeros(nf, dtype=np.int64)
    for sid, (a, b) in enumerate(plan.stages):
        stage_of[a:b + 1] = sid
    stage_of_l = stage_of.tolist()

    stages = []
    for sid, (first, last) in enumerate(plan.stages):
        members = range(first, last + 1)
        foff = np.full(nf, -1, dtype=np.int64)
        sizes = fs.fm[first:last + 1] * fs.fn[first:last + 1]
        foff[first:last + 1] = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        pool = int(sizes.sum())
        carried = {}
        for f in members:
            for c in ch[chp[f]:chp[f + 1]]:
                if stage_of_l[c] < sid:
                    carried[c] = pool
                    pool += cm_l[c] * (fn_l[c] - fp_l[c])
        # ---- the state machine, front-level, launch by launch -------------------
        # ready[f]: first launch f may factorize; assemble launch of f
        pending = {f: sum(1 for c in ch[chp[f]:chp[f + 1]] if stage_of_l[c] == sid)
                   for f in members}
        asm_launch = {}     # f -> launch of its S-Assemble (and carried packs)
        pack_launch = {}    # child -> launch of its Pack-Assemble into the parent
        step_launch = {}    # f -> list of global launches of its local steps
        finish = {}
        ready_at = {}       # front -> launch it may start factorizing
        # leaves of the stage (no in-stage children) assemble at launch 0
        for f in members:
            if pending[f] == 0:
                asm_launch[f] = 0
                ready_at[f] = 1
        active = []         # fronts factorizing: [tail, f, next local step]
        L = 0
        waiting_ready = sorted(ready_at.items(), key=lambda x: x[1])
        ready_heap = {}
        for f, r in waiting_ready:
            ready_heap.setdefault(r, []).append(f)
        done = 0
        nmem = last - first + 1
        while done < nmem:
            for f in ready_heap.pop(L, ()):
                if nl[f] == 0:
                    finish[f] = L - 1
                    step_launch[f] = []
                    done += 1
                    _release(f, L - 1, parent, stage_of_l, sid, pending, asm_launch,
                             pack_launch, ready_heap)
                else:
                    active.append([-tail[f], f, 0])
                    step_launch[f] = []
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
                    _release(f, L, parent, stage_of_l, sid, pending, asm_launch,
                             pack_launch, ready_heap)
                else:
                    still.append(item)
            active = still
            L += 1
        nlaunch = max([L] + [v + 1 for v in pack_launch.values()] +
                      [v + 1 for v in asm_launch.values()])
        # ---- records --------------------------------------------------------------
        parts, plaunch = [], []
        fac_fronts = [f for f in members if scheds[f] is not None]
        if fac_fronts:
            lens = np.array([len(scheds[f].tasks) for f in fac_fronts], dtype=np.int64)
            big = np.concatenate([scheds[f].tasks for f in fac_fronts])
            loc = np.concatenate([scheds[f].launch for f in fac_fronts]).astype(np.int64)
            fr = np.repeat(np.array(fac_fronts, dtype=np.int64), lens)
            gl_flat = np.concatenate([np.asarray(step_launch[f], dtype=np.int64)
                                      for f in fac_fronts])
            gl_ptr = np.concatenate(([0], np.cumsum([nl[f] for f in fac_fronts])[:-1]))
            gl_ptr_t = np.repeat(gl_ptr, lens)
            plaunch.append(gl_flat[gl_ptr_t + loc])
            parts.append(_instantiate(big, fr, fs, nfact, foff, vt_base, tile))
        parts_a, launch_a = _assembly_tasks(fs, members, sid, stage_of_l, foff, carried,
                                            asm_launch, pack_launch, frank, cm_l)
        parts.append(parts_a)
        plaunch.append(launch_a)
        tasks = np.concatenate(parts) if parts else empty_tasks(0)
        gl = np.concatenate(plaunch) if plaunch else np.zeros(0, np.int64)
        order = np.argsort(gl, kind="stable")
        tasks = tasks[order]
        gl = gl[order]
        launch_ptr = np.searchsorted(gl, np.arange(nlaunch + 1)).astype(np.int64)
        s0 = int(fs.s_ptr[first])
        s1 = int(fs.s_ptr[last + 1])
        stages.append(StageSchedule(fronts=(first, last), tasks=tasks, launch_ptr=launch_ptr,
                                    foff=foff, carried=carried, pool_size=pool,
                                    s_range=(s0, s1), finish=finish))
    seconds = time.process_time() - t0
    return SparseSchedule(stages=stages, tile=tile, bundle=bundle, granule=granule,
                          pipelining=pipelining, vt_base=vt_base.astype(np.int64),
                          vt_size=int(nvt.sum()) * tt, nfact=nfact.astype(np.int64),
                          critical_path=crit, seconds=seconds)


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


def _instantiate(big, fr, fs, nfact, foff, vt_base, tile):
    """Vectorized :func:`bucket.front_tasks` over the tasks of many fronts."""
    t = big.copy()
    fn = fs.fn[fr]
    t["F"] = foff[fr]
    t["fm"] = fs.fm[fr]
    t["fn"] = fn
    t["front"] = fr
    rows = t["rows"]
    t["rows"] = np.where(rows >= 0, rows * tile, -1)
    col = t["col"].astype(np.int64) * tile
    t["col"] = col
    nfa = nfact[fr]
    t["nref"] = np.minimum(tile, nfa - col)
    c0 = t["c0"].astype(np.int64) * tile
    af = t["type"] == TaskType.APPLY_FACTORIZE
    t["aux"] = np.where(af, np.minimum(tile, nfa - c0), 0)
    t["c0"] = c0
    t["c1"] = np.minimum(t["c1"].astype(np.int64) * tile, fn)
    tt = tile * tile
    vb = vt_base[fr]
    vt, vt2 = t["vt"], t["vt2"]
    t["vt"] = np.where(vt >= 0, vb + vt * tt, -1)
    t["vt2"] = np.where(vt2 >= 0, vb + vt2 * tt, -1)
    return t


def _assembly_tasks(fs, members, sid, stage_of, foff, carried, asm_launch, pack_launch,
                    frank, cm):
    """S-Assemble and Pack-Assemble records of one stage."""
    recs = []
    launches = []
    nrimap = int(fs.rimap_ptr[-1])
    chp, ch = fs.child_ptr.tolist(), fs.children.tolist()
    sp_l = fs.s_ptr.tolist()
    fn_l, fp_l = fs.fn.tolist(), fs.fp.tolist()
    parent = fs.parent.tolist()
    sbase = sp_l[members[0]] if len(members) else 0
    for f in members:
        s0, s1 = sp_l[f] - sbase, sp_l[f + 1] - sbase
        La = asm_launch.get(f, 0)
        for a in range(s0, s1, S_CHUNK):
            recs.append((int(TaskType.S_ASSEMBLE), int(foff[f]), a, min(a + S_CHUNK, s1), 0,
                         0, 0, 0, 0, 0, 0, f))
            launches.append(La)
        for c in ch[chp[f]:chp[f + 1]]:
            cmc = cm[c]
            cn = fn_l[c] - fp_l[c]
            if cmc == 0 or cn == 0:
                continue
            if stage_of[c] < sid:
                base, ld, Lp = carried[c], cn, 0
            else:
                base = int(foff[c]) + frank[c] * fn_l[c] + fp_l[c]
                ld, Lp = fn_l[c], pack_launch[c]
            rows_per = max(1, PACK_CHUNK // cn)
            for r0 in range(0, cmc, rows_per):
                r1 = min(r0 + rows_per, cmc)
                recs.append((int(TaskType.PACK_ASSEMBLE), int(foff[f]), base,
                             int(fs.rimap_ptr[c]), nrimap + int(fs.rjmap_ptr[c]),
                             fn_l[f], ld, 0, cn, r0, r1, c))
                launches.append(Lp)
    n = len(recs)
    t = empty_tasks(n)
    if n:
        cols = list(zip(*recs))
        t["type"] = cols[0]
        t["F"] = cols[1]
        t["vt"] = cols[2]
        t["vt2"] = cols[3]
        t["aux"] = cols[4]
        t["fn"] = cols[5]
        t["col"] = cols[6]
        t["c0"] = cols[7]
        t["c1"] = cols[8]
        rows = np.full((n, t["rows"].shape[1]), -1, dtype=np.int32)
        rows[:, 0] = cols[9]
        rows[:, 1] = cols[10]
        t["rows"] = rows
        t["front"] = cols[11]
        pack = t["type"] == TaskType.PACK_ASSEMBLE
        t["nfrows"] = np.where(pack, 1, 0)
        t["fm"] = np.where(pack, [cm[x] for x in cols[11]], 0)
    return t, np.asarray(launches, dtype=np.int64)


def schedule_stats(analysis, pipelining: bool = True, *, tile: int = DEFAULT_TILE,
                   bundle: int = DEFAULT_BUNDLE, granule: int = DEFAULT_APPLY_GRANULE,
                   max_gpu_memory: int | None = None, max_tasks: int | None = None) -> dict:
    """Statistics of the schedule (JSON-serializable).

    Keys: ``launches`` (with the requested pipelining), ``launches_no_pipeline``,
    ``tasks``, ``tasks_by_type``, ``tasks_per_launch`` (mean, max),
    ``tiles_touched_fraction`` (per launch, of the tiles of the stage's
    fronts: mean, max), ``critical_path``, ``stages``, ``build_seconds``
    (CPU time of the requested schedule), ``tile``, ``bundle``.
    """
    kw = dict(tile=tile, bundle=bundle, granule=granule, max_gpu_memory=max_gpu_memory,
              max_tasks=max_tasks)
    s = build_schedule(analysis, pipelining=pipelining, **kw)
    s_no = s if not pipelining else build_schedule(analysis, pipelining=False, **kw)
    by_type = {}
    per_launch = []
    frac = []
    fs = analysis.fronts
    for st in s.stages:
        t = st.tasks
        for typ in TaskType:
            c = int(np.count_nonzero(t["type"] == typ))
            if c:
                by_type[typ.name.lower()] = by_type.get(typ.name.lower(), 0) + c
        a, b = st.fronts
        ntile = int(np.sum(-(-fs.fm[a:b + 1] // tile) * -(-fs.fn[a:b + 1] // tile)))
        touched = np.zeros(len(t), dtype=np.int64)
        typ = t["type"]
        fac = (typ == TaskType.FACTORIZE) | (typ == TaskType.APPLY_FACTORIZE)
        touched[fac] += t["nfrows"][fac]
        app = (typ == TaskType.APPLY) | (typ == TaskType.APPLY_FACTORIZE)
        touched[app] += t["napply"][app] * (-(-(t["c1"][app] - t["c0"][app]) // tile))
        cnt = np.diff(st.launch_ptr)
        per_launch.extend(cnt.tolist())
        if len(t) and ntile:
            sums = np.add.reduceat(touched, st.launch_ptr[:-1][cnt > 0]) / ntile
            frac.extend(sums.tolist())
    pl = np.asarray(per_launch) if per_launch else np.zeros(1)
    fr = np.asarray(frac) if frac else np.zeros(1)
    return {
        "launches": int(s.nlaunch),
        "launches_no_pipeline": int(s_no.nlaunch),
        "tasks": int(s.ntasks),
        "tasks_by_type": by_type,
        "tasks_per_launch": {"mean": float(pl.mean()), "max": int(pl.max())},
        "tiles_touched_fraction": {"mean": float(fr.mean()), "max": float(fr.max())},
        "critical_path": int(s.critical_path),
        "stages": len(s.stages),
        "build_seconds": float(s.seconds),
        "tile": int(tile), "bundle": int(bundle), "pipelining": bool(pipelining),
    }
