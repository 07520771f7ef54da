"""The GPU engine's memory plan: what the device really has, what each stage allocates.

The analysis' staging model (:mod:`scipy_gpuqr._symbolic.staging`) sizes
stages for a byte budget chosen by the caller (``max_gpu_memory``, a knob that
forces stages). This module sizes them for the memory a run can really use
and counts every device allocation the engine makes
(:mod:`scipy_gpuqr._engine.gpu.device`), so that a plan that fits does fit:

held for the whole factorization (``fixed``)
    the VT pool of every front (``schedule.vt_size``) and the Rimap/Rjmap
    maps (int64);
held while a stage runs (per front of the stage)
    its front in the stage's pool, its S entries (int64 index and value),
    the gather index of its rows of R (int64 per entry), its records of the
    task list (:data:`~scipy_gpuqr._schedule.tasks.TASK_BYTES` each; an upper
    bound while planning, the schedule's count when checked), a dense
    front's ``T`` factors;
per stage
    the carried contribution blocks (packed ``cm × (fn - fp)`` in the pool),
    the gather buffer of the contribution blocks leaving for a later stage
    (``cm × fn`` each), the workspaces of the dense fronts running at once on
    the side streams (cuSOLVER ``geqrf``, the panel copy, the GEMM buffers;
    the largest :data:`DENSE_STREAMS`), R's two device copy slots and the
    finiteness check's chunk.

The memory available (:func:`available_bytes`) is the smaller of the CuPy
pool's limit less what the pool already holds in use (scaled by
:data:`POOL_USABLE`), and the free device memory plus the pool's cached free
blocks (other processes' use shows there) less a reserve for the libraries'
own allocations outside the pool (cuBLAS, cuSOLVER handles and workspaces),
scaled by :data:`USABLE` (pool fragmentation).

:func:`plan_for_memory` groups the fronts greedily in postorder like the
paper's §3.4, closing a stage when the next front would not fit; with
``max_gpu_memory`` a stage also closes where the analysis' own plan for that
budget does (so that knob still forces the same stages as the NumPy
executor's). A dense front that alone does not fit becomes a *host front*: a
stage of its own that runs on the host (assembled there from its S entries and
its children's contribution blocks, factorized by LAPACK, its own contribution
block handed on like any other stage's; the engine's host stage), holding
nothing on the device but the fixed bytes (:attr:`MemoryPlan.host`). Any other
front that alone does not fit makes the plan infeasible
(:attr:`MemoryPlan.feasible`): the engine then answers on the CPU.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from .._schedule import sparse as _sparse
from .._schedule.tasks import TASK_BYTES
from .._symbolic.staging import StagePlan
from .dense_front import DEFAULT_PANEL

__all__ = ["solve_bytes", "USABLE", "POOL_USABLE", "RESERVE", "CHECK_CHUNK", "R_SLOT_BYTES",
           "DENSE_STREAMS", "DeviceMemory", "FrontNeeds", "MemoryPlan", "GpuMemoryExhausted",
           "available_bytes", "largest_block_bytes", "make_room", "vt_elements", "front_needs",
           "HOST_CHILDREN_PLACED", "plan_for_memory", "placed_children", "plan_need",
           "stage_bytes", "min_budget", "min_budget_of_front"]

#: Fraction of the available bytes a plan may use (the pool's rounding and
#: fragmentation, CuPy's temporaries of small reductions).
USABLE = 0.92
#: Fraction of a CuPy pool limit (less what the pool holds in use) a plan may
#: use: every allocation of a run goes through the pool, which frees its cached
#: blocks before it fails, so only its rounding of sizes is left to cover.
POOL_USABLE = 0.97
#: Bytes left outside the plan for the libraries' allocations that bypass
#: CuPy's pool (cuBLAS/cuSOLVER handles and workspaces, loaded modules).
RESERVE = 256 << 20
#: Elements of one chunk of the device's finiteness check (a bool temporary).
CHECK_CHUNK = 1 << 25
#: Bytes of one of R's two device copy slots (:data:`.gpu.rcopy.SLOT_BYTES`).
R_SLOT_BYTES = 32 << 20
#: Side streams on which dense fronts run at once (:data:`.gpu.device.DENSE_STREAMS`).
DENSE_STREAMS = 4

#: A contribution block whose parent is a host front is copied from its stage's
#: pool straight into the host front's pool (strided copies to the host, no
#: device buffer: :meth:`~.gpu.stage_loop.StageLoop.place_in_host_stages`), so
#: the plan counts no gather buffer for it (:func:`plan_for_memory`,
#: :func:`stage_bytes`). False: counted as any leaving block's (the plan
#: before; for comparison runs).
HOST_CHILDREN_PLACED = True


class GpuMemoryExhausted(MemoryError):
    """The GPU cannot run this factorization in the memory available (even staged)."""


@dataclass(frozen=True)
class DeviceMemory:
    """What a run may use on the device.

    Attributes
    ----------
    available : int or None
        Bytes the plan may use (None: no limit known, the NumPy device).
    limited_by : str
        Which limit gave ``available``: ``'pool limit'``, ``'free device
        memory'``, ``'device limit'`` (a stand-in device's) or ``'none'``.
    detail : dict
        The numbers read (bytes): free, pool limit, pool used, pool cached.
    """

    available: int | None
    limited_by: str
    detail: dict = field(default_factory=dict)


def available_bytes(cp) -> DeviceMemory:
    """The device memory a factorization may allocate now through CuPy's default pool.

    Parameters
    ----------
    cp : module
        CuPy.
    """
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    used, cached, limit = int(pool.used_bytes()), int(pool.free_bytes()), int(pool.get_limit())
    detail = {"free": int(free), "total": int(total), "pool_used": used,
              "pool_cached": cached, "pool_limit": limit}
    cands = [(int(USABLE * (int(free) + cached - RESERVE)), "free device memory")]
    if limit > 0:
        cands.append((int(POOL_USABLE * (limit - used)), "pool limit"))
    avail, why = min(cands)
    return DeviceMemory(max(avail, 0), why, detail)


def make_room(cp, nbytes: int) -> bool:
    """Give CuPy's cached free blocks back to the device where a request of
    ``nbytes`` would not fit beside them under the pool's limit; whether it did.

    Under a limit (``set_limit``) CuPy counts its cached blocks against it and
    raises at once when a new allocation would pass it: it neither frees them
    first (as it does when the device itself is full) nor reuses them for a
    larger request or on another stream. :func:`available_bytes` counts them as
    available, so a large buffer sized by it asks for room first.

    Parameters
    ----------
    cp : module
        CuPy.
    nbytes : int
        The request.
    """
    pool = cp.get_default_memory_pool()
    limit = int(pool.get_limit())
    if not limit or not int(pool.free_bytes()):
        return False
    if int(pool.total_bytes()) + int(nbytes) <= limit:
        return False
    pool.free_all_blocks()
    return True


def largest_block_bytes(cp) -> int:
    """Bytes one new allocation of CuPy's default pool may take now, after its
    cached free blocks went back to the device.

    CuPy carves its blocks out of larger chunks and gives a chunk back only when
    all of it is free: a cached block beside one in use stays counted against
    a pool limit (``total_bytes``) while :func:`available_bytes` counts it as
    available (``limit - used``). Reused for smaller requests, it is no room for
    one large buffer, which this bound is for (a front's column slabs).

    Parameters
    ----------
    cp : module
        CuPy.
    """
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    free, _ = cp.cuda.runtime.memGetInfo()
    cands = [int(USABLE * (int(free) - RESERVE))]
    limit = int(pool.get_limit())
    if limit > 0:
        cands.append(int(POOL_USABLE * (limit - int(pool.total_bytes()))))
    return max(min(cands), 0)


@dataclass(frozen=True)
class FrontNeeds:
    """Device bytes of each front (see the module's docstring), itemsize included.

    Attributes
    ----------
    front : ndarray of int64
        Its values in its stage's pool (``fm × fn``).
    known : ndarray of int64
        Its S entries, R's gather index of its rows, a dense front's ``T``.
    records : ndarray of int64
        Its records of the task list (its tile pattern's, its S-Assemble and
        Pack-Assemble chunks; a built schedule's count replaces the sum,
        :func:`stage_bytes`).
    carried : ndarray of int64
        Its contribution block in its parent's pool when the parent lies in
        a later stage (``cm × (fn - fp)``).
    leaving : ndarray of int64
        Its gather buffer when its parent lies in a later stage (``cm × fn``).
    dense_work : ndarray of int64
        A dense front's workspace while it factorizes (0 for the others).
    fixed : int
        Held for the whole factorization: VT pool and maps.
    per_stage : int
        R's two copy slots (the check's chunk, a byte per pool element up to
        :data:`CHECK_CHUNK`, is added per stage).
    hostable : ndarray of bool, optional
        Fronts that may run on the host when they alone do not fit (the dense
        fronts: no tile tasks, so the host runs only their assembly and a
        LAPACK factorization); None: none.
    """

    front: np.ndarray
    known: np.ndarray
    records: np.ndarray
    carried: np.ndarray
    leaving: np.ndarray
    dense_work: np.ndarray
    fixed: int
    per_stage: int
    itemsize: int = 8
    hostable: np.ndarray | None = None

    def may_host(self, f: int) -> bool:
        """Whether front ``f`` may run on the host (:attr:`hostable`)."""
        return self.hostable is not None and bool(self.hostable[f])

    @functools.cached_property
    def own(self) -> np.ndarray:
        """Bytes held while its stage runs (summed once: the stage plan reads one
        front's value at a time, for every front)."""
        return self.front + self.known + self.records


def vt_elements(analysis, *, tile, bundle, pipelining, granule, dense=None) -> tuple:
    """``(vt, records)`` of each front: its VT pool elements (what the schedule's
    ``vt_size`` sums; it does not depend on the staging plan) and its Factorize /
    Apply records. The tile patterns' counts come from the scheduler's cache (on
    disk, their keys only: :func:`~scipy_gpuqr._schedule.bucket.front_pattern_counts`)."""
    fs = analysis.fronts
    nvt, nrec, pat_of = _sparse._front_pattern_counts(fs, tile, bundle, pipelining, granule,
                                                      dense)
    has = pat_of >= 0
    k = np.maximum(pat_of, 0)
    vt = np.where(has, nvt[k] if len(nvt) else 0, 0).astype(np.int64) * int(tile) * int(tile)
    rec = np.where(has, nrec[k] if len(nrec) else 0, 0).astype(np.int64)
    return vt, rec


def front_needs(analysis, itemsize: int, *, tile: int, vt_elems, dense=None,
                panel: int = DEFAULT_PANEL) -> FrontNeeds:
    """:class:`FrontNeeds` of every front of ``analysis`` for the engine.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    itemsize : int
        Bytes of a value on the device (8 or 4).
    tile : int
        The schedule's tile.
    vt_elems : (ndarray, ndarray) of int64
        VT pool elements and Factorize/Apply records of each front
        (:func:`vt_elements`).
    dense : ndarray of bool, optional
        The dense fronts (:func:`scipy_gpuqr._schedule.dense.dense_front_mask`).
    panel : int
        Dense fronts' panel width.
    """
    fs = analysis.fronts
    fm, fn = fs.fm.astype(np.int64), fs.fn.astype(np.int64)
    fp, cm = fs.fp.astype(np.int64), fs.cm.astype(np.int64)
    isz = int(itemsize)
    s_count = np.diff(fs.s_ptr).astype(np.int64)
    nnz_r = np.asarray(analysis.front_nnz_R, dtype=np.int64)
    cb = cm * (fn - fp)
    vt_e, tile_rec = vt_elems
    # records: its tile records, S-Assemble chunks, its children's Pack-Assemble
    # pieces (rows of a block in chunks of PACK_CHUNK entries; they run in the
    # parent's stage) and slack
    pack = np.where(cm > 0, -(-cm // np.maximum(1, _sparse.PACK_CHUNK // np.maximum(fn - fp, 1))),
                    0)
    kids_pack = np.zeros(len(fm), dtype=np.int64)
    has = fs.parent >= 0
    np.add.at(kids_pack, fs.parent[has], pack[has])
    records = (np.asarray(tile_rec, dtype=np.int64) + -(-s_count // _sparse.S_CHUNK)
               + kids_pack + 2) * TASK_BYTES
    known = s_count * (8 + isz) + nnz_r * 8
    work = np.zeros(len(fm), dtype=np.int64)
    if dense is not None and np.any(dense):
        d = np.flatnonzero(dense)
        nb = int(panel)
        npan = -(-np.minimum(fm[d], fn[d]) // nb)
        known[d] += npan * nb * nb * isz                               # T, kept
        # panel copy, Vᵀ, geqrf's workspace (rows × nb each at most), two GEMM buffers
        work[d] = (3 * fm[d] * nb + 2 * fn[d] * nb + 4 * nb * nb) * isz
    vt = int(np.asarray(vt_e, dtype=np.int64).sum()) * isz
    maps = (len(fs.rimap) + len(fs.rjmap)) * 8
    r_slots = 2 * min(R_SLOT_BYTES, max(int(analysis.nnz_R), 1) * 8)
    return FrontNeeds(front=fm * fn * isz, known=known, records=records, carried=cb * isz,
                      leaving=cm * fn * isz, dense_work=work, fixed=vt + int(maps),
                      per_stage=int(r_slots), itemsize=isz,
                      hostable=None if dense is None else np.asarray(dense, dtype=bool).copy())


@dataclass(frozen=True)
class MemoryPlan:
    """Result of :func:`plan_for_memory`.

    Attributes
    ----------
    plan : StagePlan
        The stages.
    need : tuple of int
        Bytes each stage allocates by this module's count (records estimated).
    available : int or None
        Bytes the plan was made for (fixed bytes included; None: no limit).
    fixed : int
    oversized : tuple of int
        Fronts that alone (with what their stage must hold) exceed
        ``available`` and may not run on the host; the plan is infeasible
        when any.
    host : tuple of int
        Host fronts: dense fronts that alone exceed ``available``, each the
        only front of its stage, which runs on the host (0 device bytes in
        ``need`` besides the fixed ones).
    """

    plan: StagePlan
    need: tuple
    available: int | None
    fixed: int
    oversized: tuple
    host: tuple = ()

    def host_stages(self) -> dict:
        """Stage → its host front."""
        hs = set(self.host)
        return {sid: a for sid, (a, b) in enumerate(self.plan.stages) if a == b and a in hs}

    @property
    def feasible(self) -> bool:
        return not self.oversized

    @property
    def peak(self) -> int:
        """Bytes of the largest stage plus the fixed bytes."""
        return self.fixed + (max(self.need) if self.need else 0)


def plan_need(analysis, needs: FrontNeeds, plan: StagePlan, host=()) -> tuple:
    """Bytes each stage of ``plan`` allocates by this module's count (0 for a
    stage whose only front is a host front, in ``host``; their children's gather
    buffers not counted, :data:`HOST_CHILDREN_PLACED`)."""
    fs = analysis.fronts
    hs = set(host)
    if HOST_CHILDREN_PLACED and hs:
        needs = placed_children(analysis, needs, hs)
    chp, ch = fs.child_ptr.tolist(), fs.children.tolist()
    stage_of = np.zeros(fs.nfronts, dtype=np.int64)
    for sid, (a, b) in enumerate(plan.stages):
        stage_of[a:b + 1] = sid
    so = stage_of.tolist()
    out = []
    for sid, (a, b) in enumerate(plan.stages):
        if a == b and a in hs:
            out.append(0)
            continue
        cur = _Stage(needs)
        bytes_ = 0
        for f in range(a, b + 1):
            kids = ch[chp[f]:chp[f + 1]]
            bytes_, state = cur.with_front(
                f, [c for c in kids if so[c] == sid],
                sum(int(needs.carried[c]) for c in kids if so[c] < sid))
            cur.take(state)
        out.append(int(bytes_))
    return tuple(out)


class _Stage:
    """The running count of an open stage."""

    def __init__(self, needs: FrontNeeds):
        self.n = needs
        self.sum = 0            # own + carried in
        self.elems = 0          # pool elements (the finite check's temporary)
        self.leaving = 0        # gather buffers of fronts whose parent is not in the stage
        self.work = []          # the DENSE_STREAMS largest dense workspaces (min-heap)

    def with_front(self, f, kids_in, cb_in):
        """``(bytes, state)`` of the stage with front f added."""
        n = self.n
        leaving = self.leaving - sum(int(n.leaving[c]) for c in kids_in) + int(n.leaving[f])
        work = list(self.work)
        w = int(n.dense_work[f])
        if w:
            if len(work) < DENSE_STREAMS:
                heapq.heappush(work, w)
            elif w > work[0]:
                heapq.heapreplace(work, w)
        s = self.sum + int(n.own[f]) + cb_in
        el = self.elems + (int(n.front[f]) + cb_in) // n.itemsize
        return (s + leaving + sum(work) + n.per_stage + min(el, CHECK_CHUNK),
                (s, leaving, work, el))

    def take(self, state):
        self.sum, self.leaving, self.work, self.elems = state


def plan_for_memory(analysis, needs: FrontNeeds, available: int | None,
                    max_gpu_memory: int | None = None, *, host: bool = True) -> MemoryPlan:
    """Stages in postorder whose every allocation fits ``available`` bytes.

    A front that alone does not fit runs on the host, in a stage of its own,
    when ``host`` and :meth:`FrontNeeds.may_host` allow (:attr:`MemoryPlan.host`);
    otherwise it makes the plan infeasible. A feasible plan with host fronts is
    made again without their children's gather buffers
    (:data:`HOST_CHILDREN_PLACED`, :func:`placed_children`): the same host
    fronts, and the stages before them hold as many fronts as really fit.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    needs : FrontNeeds
    available : int or None
        Device bytes the factorization may use, fixed bytes included (None:
        no limit: the plan is ``analysis.stage_plan(max_gpu_memory)``).
    max_gpu_memory : int or None
        The caller's budget for the analysis' staging model: a stage also
        closes where ``analysis.stage_plan(max_gpu_memory)`` closes one.
    """
    model = analysis.stage_plan(max_gpu_memory)
    if available is None:
        return MemoryPlan(model, plan_need(analysis, needs, model), None, needs.fixed, ())
    got = _greedy(analysis, needs, int(available), model, host)
    if not (HOST_CHILDREN_PLACED and got.host and got.feasible):
        return got
    # the host fronts' children leave no gather buffer: the stages before a host
    # front may hold more fronts. A front is a host front where it alone does not
    # fit, whatever its children's buffers, so the second pass makes the same
    # ones (an infeasible plan is left as it is: the caller's choice of dense
    # fronts reads it)
    again = _greedy(analysis, placed_children(analysis, needs, got.host), int(available),
                    model, host)
    return again if again.host == got.host else got


def placed_children(analysis, needs: FrontNeeds, host_fronts) -> FrontNeeds:
    """``needs`` without the gather buffer (:attr:`FrontNeeds.leaving`) of the
    fronts whose parent is one of ``host_fronts``: their blocks go from their
    stage's pool straight into the host front's (:data:`HOST_CHILDREN_PLACED`)."""
    par = np.asarray(analysis.fronts.parent, dtype=np.int64)
    kids = np.isin(par, np.asarray(list(host_fronts), dtype=np.int64)) & (par >= 0)
    if not kids.any():
        return needs
    leaving = np.where(kids, 0, needs.leaving).astype(needs.leaving.dtype, copy=False)
    return replace(needs, leaving=leaving)


def _greedy(analysis, needs: FrontNeeds, available: int, model, host: bool) -> MemoryPlan:
    """:func:`plan_for_memory`'s greedy pass in postorder under ``available``."""
    fs = analysis.fronts
    nf = fs.nfronts
    if nf == 0:
        return MemoryPlan(StagePlan(int(available), (), (), ()), (), int(available),
                          needs.fixed, ())
    cap = int(available) - needs.fixed
    forced = {a for a, _ in model.stages}      # the model's stage starts
    chp, ch = fs.child_ptr.tolist(), fs.children.tolist()
    stage_of = [0] * nf
    stages, sbytes, oversized, on_host = [], [], [], []
    cur = _Stage(needs)
    start, sid, last_bytes = 0, 0, 0
    for f in range(nf):
        kids = ch[chp[f]:chp[f + 1]]
        if f != start and f not in forced:
            kids_in = [c for c in kids if stage_of[c] == sid]
            cb_in = sum(int(needs.carried[c]) for c in kids if stage_of[c] < sid)
            b, state = cur.with_front(f, kids_in, cb_in)
            if b <= cap:
                cur.take(state)
                stage_of[f], last_bytes = sid, b
                continue
        if f != start:                      # close the open stage, open one at f
            stages.append((start, f - 1))
            sbytes.append(last_bytes)
            sid += 1
            start = f
            cur = _Stage(needs)
        cb_in = sum(int(needs.carried[c]) for c in kids if stage_of[c] < sid)
        b, state = cur.with_front(f, [], cb_in)
        stage_of[f] = sid
        if b > cap and host and needs.may_host(f):
            # a stage of its own on the host; the next front opens a new stage
            on_host.append(f)
            stages.append((f, f))
            sbytes.append(0)
            sid += 1
            start = f + 1
            cur = _Stage(needs)
            continue
        cur.take(state)
        last_bytes = b
        if b > cap:
            oversized.append(f)
    if start < nf:
        stages.append((start, nf - 1))
        sbytes.append(last_bytes)
    plan = StagePlan(int(available), tuple(stages), tuple(int(b) for b in sbytes),
                     tuple(oversized))
    return MemoryPlan(plan, plan.stage_bytes, int(available), needs.fixed, tuple(oversized),
                      tuple(on_host))


def _alone(analysis, needs: FrontNeeds) -> np.ndarray:
    """Device bytes of each front alone in a stage (the front, its children's
    carried blocks, its own gather buffer, its workspace, the per-stage buffers),
    the fixed bytes excluded."""
    fs = analysis.fronts
    kids_cb = np.zeros(fs.nfronts, dtype=np.int64)
    par = fs.parent
    has = par >= 0
    np.add.at(kids_cb, par[has], needs.carried[np.flatnonzero(has)])
    el = (needs.front + kids_cb) // needs.itemsize
    return (needs.own + kids_cb + needs.leaving + needs.dense_work + needs.per_stage
            + np.minimum(el, CHECK_CHUNK))


def min_budget(analysis, needs: FrontNeeds, *, host: bool = True) -> int:
    """The smallest ``available`` with a feasible plan: the fixed bytes and the
    largest single-front stage (the front, its children's carried blocks, its
    own gather buffer, its workspace and the per-stage buffers) of the fronts
    that may not run on the host (all of them without ``host``)."""
    if analysis.fronts.nfronts == 0:
        return needs.fixed
    one = _alone(analysis, needs)
    if host and needs.hostable is not None:
        one = one[~needs.hostable]
    return int(needs.fixed + (one.max() if len(one) else 0))


def min_budget_of_front(analysis, needs: FrontNeeds, f: int) -> int:
    """Device bytes of a stage holding front ``f`` alone, the fixed bytes included."""
    return int(needs.fixed + _alone(analysis, needs)[int(f)])


def stage_bytes(sched, analysis, needs: FrontNeeds, itemsize: int, host=(),
                mapped=None) -> list:
    """Bytes of each stage of a built schedule: its exact pool (fronts and carried
    blocks) and records, with ``needs``' other parts (see :func:`plan_for_memory`);
    0 for the stages in ``host`` (stage indices: they run on the host).
    ``mapped``: stage → bytes of its pool mapped at most (a pool backed chunk
    by chunk, :mod:`.pool_map`), counted instead of the whole pool; such a
    stage's R is gathered from its pool sent to the host, so the device holds
    no gather index of R's entries for it."""
    fs = analysis.fronts
    hs = set(host)
    if HOST_CHILDREN_PLACED and hs:
        needs = placed_children(analysis, needs, [int(sched.stages[sid].fronts[0]) for sid in hs])
    mapped = dict(mapped or {})
    out = []
    for sid, st in enumerate(sched.stages):
        if sid in hs:
            out.append(0)
            continue
        first, last = st.fronts
        sl = slice(first, last + 1)
        par = fs.parent[sl]
        away = np.flatnonzero((par < 0) | (par > last)) + first
        work = sorted(needs.dense_work[sl].tolist(), reverse=True)[:DENSE_STREAMS]
        ntasks = int(st.launch_ptr[-1]) if len(st.launch_ptr) else 0
        pool = mapped.get(sid, int(st.pool_size) * int(itemsize))
        known = int(needs.known[sl].sum())
        if sid in mapped:
            known -= int(np.asarray(analysis.front_nnz_R, dtype=np.int64)[sl].sum()) * 8
        out.append(int(pool) + known
                   + ntasks * TASK_BYTES + int(needs.leaving[away].sum()) + int(sum(work))
                   + needs.per_stage + min(int(st.pool_size), CHECK_CHUNK))
    return out


def solve_bytes(analysis, sched) -> int:
    """Device bytes of the solves besides the fixed bytes, the stage pools and a
    front's companions (the GPU driver's memory checks): the replay's records and row
    map, a few vectors of length m + n (float64)."""
    return int(sched.ntasks) * 96 + 8 * (int(analysis.m) + int(analysis.n)) * 8
