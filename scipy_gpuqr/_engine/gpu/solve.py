"""Q, Qᵀ and the least-squares solve on the device for a GPU factorization.

A GPU factorization (:class:`~scipy_gpuqr._engine.gpu.driver.GpuQR`) leaves its
Householder data where the factorization made it: the VT tile pool and the
last stage's front pool on the device, earlier stages' pools on the host.
This module applies ``Q``/``Qᵀ`` from that data without copying it to the
host, and solves least-squares problems with the result.

Replay plan (host, NumPy; :func:`build_replay_plan`)
    Every kept block reflector (the Factorize part of a Factorize or
    Apply+Factorize record) becomes one normalized record of type
    ``TASK_APPLY_QT`` (fields in ``kernels/sparse_qr/applyq.cu``): its row tiles
    stacked top first, its V tile, its T tile and the offset of its front's
    row map (the global row slot of each front row). The *levels* are the
    factorization's launches: records of one launch touch disjoint tiles of
    their fronts, and two fronts of one launch never share a row (a parent's
    rows that come from a child are assembled only after the child's last
    reflector), so a level's records touch disjoint global rows
    (:func:`check_levels` verifies it; the tests and debug mode run it) and
    run in one kernel launch; a level reads one stage's pool. Dense fronts
    factorized outside the task lists (``GpuQR._dense``: front → object with
    ``slots``, ``after_launch``, ``apply_qt(Y)``, ``apply_q(Y)``) are applied
    after the records of the level of ``after_launch`` (several in front
    order, children first). Levels follow the launches rather than the rows
    each record touches: grouping by rows would save some launches but costs
    far more host time per factorization than it saves on the device. The
    plan depends on the pattern and the schedule, not on the values: it is
    made once per pattern, kept with the schedule in the process and on disk
    between processes (:func:`plan_of`, :mod:`.replay_store`).

Execution
    ``Qᵀ X``: levels in order, each the kernel (one block per record and 32
    right-hand-side columns) then its dense fronts; ``Q X``: levels in
    reverse order, dense fronts first. X is float64 (m, k), row-major, in
    column chunks bounded by :data:`CHUNK_ELEMENTS`. The last stage's pool is
    used where it lies; an earlier stage's host pool is uploaded for its
    levels and dropped after. With :data:`PREFETCH`, the next stage's
    reflectors go up on a side stream while the current stage's levels run,
    where both fit the device memory (else one upload at a time).

Solve (:class:`DeviceSolve`)
    Full rank only (the rank rules that need the host stay on the host, see
    :mod:`scipy_gpuqr._factor.factorization`): ``x[perm] = R⁻¹ (Qᵀ b)[:n]`` for tall A and
    ``x = Q [R⁻ᵀ b[perm]; 0]`` for the transposed factorization of wide A,
    the triangular solves front by front from R's blocks in the front pools
    (:mod:`.trsolve`).

:class:`NumpyExecutor` runs the same plan with NumPy (CI's check of the plan
against the host replay, no GPU needed).
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..._kernels import load_module
from ..._schedule.tasks import (TASK_BYTES, TASK_DTYPE, TaskType, empty_tasks, factorizes,
                                join_records, take_records)
from ..._store import write_behind
from ..host.simulate import apply_q_records, apply_qt_records, one_blas_thread
from ..memory import RESERVE
from . import array_ops
from . import replay_split
from . import replay_store
from . import solve_kernels as av
from .reflector_upload import UploadedReflectors, reflector_layout, upload_reflectors
from .rproduct import FrontProduct
from .trsolve import FrontTriangular, TriangularPlan, stage_devices

__all__ = ["ReplayPlan", "build_replay_plan", "reflector_records", "replay", "plan_of",
           "plan_arrays", "plan_of_arrays", "stage_sequence",
           "NumpyExecutor", "CupyExecutor", "DeviceSolve", "CHUNK_ELEMENTS", "PREFETCH",
           "PREFETCH_FIRST", "prefetch_first", "drop_first", "triangular_plan_of",
           "STAGED_BESIDE", "fetch_beside", "SPLIT_REPLAY", "replay_lanes"]

#: Largest X chunk (elements of float64) applied at once; more columns are
#: applied chunk by chunk (1 GiB).
CHUNK_ELEMENTS = 1 << 27

#: ``Q``'s replay of a staged factorization uploads the next stage's reflectors
#: on a side stream while the current stage's levels run (:class:`CupyExecutor`),
#: where the memory allows both stages' packs: the uploads, bound by the link,
#: then hide the levels' kernels. Off: one stage's upload after the other's
#: levels, on the replay's stream.
PREFETCH = True
#: Device bytes a prefetched pack leaves free under a pool limit (share of the
#: limit; at least :data:`PREFETCH_MARGIN_BYTES`): the solve's other buffers
#: (a dense front's panels, R's rows) must still fit beside both packs (where
#: they do not, the replay's out-of-memory path frees what is kept and goes on).
PREFETCH_MARGIN = 0.05
PREFETCH_MARGIN_BYTES = 16 << 20
#: A staged factorization sends the first stage ``Qᵀ`` reads up as it ends
#: (:func:`prefetch_first`: while R is assembled and a solve prepares), where it
#: fits as a prefetch does; the first ``Qᵀ`` replay takes it, the first upload
#: of R's rows for the solves drops it (:func:`drop_first`).
PREFETCH_FIRST = True
#: ``Q``'s replay of a multi-device factorization runs the levels of a stage
#: whose pool lies on another GPU on that GPU (:mod:`.replay_split`), moving
#: only the rows of ``X`` its fronts touch; off: every level on the home
#: device, reading the other GPUs' pools over the link.
SPLIT_REPLAY = True


# ----------------------------------------------------------------------------- plan

def reflector_records(tasks: np.ndarray, F, rowmap_off) -> np.ndarray:
    """Normalized ``TASK_APPLY_QT`` records of kept reflectors.

    Parameters
    ----------
    tasks : ndarray of TASK_DTYPE
        Factorize / Apply+Factorize records.
    F : int or ndarray of int64
        Base of each record's front in its stage's pool.
    rowmap_off : int or ndarray of int64
        Offset of each record's front row map in the plan's ``rowmap``.

    Returns
    -------
    ndarray of TASK_DTYPE
        One record per reflector: ``F``, ``vt``, ``col``, ``nref``, ``fm``,
        ``fn``, ``aux`` (row map offset), ``napply`` row tiles in ``rows``
        (top tile first, then the others in slot order).
    """
    n = len(tasks)
    out = empty_tasks(n)
    if n == 0:
        return out
    typ = tasks["type"].astype(np.int64)
    if not np.all(factorizes(typ)):
        raise ValueError("reflector_records: only Factorize and Apply+Factorize records")
    isf = typ == TaskType.FACTORIZE
    rows = tasks["rows"].astype(np.int64)
    fs = tasks["fstart"].astype(np.int64)[:, None]
    nf = tasks["nfrows"].astype(np.int64)[:, None]
    ftop = tasks["ftop"].astype(np.int64)[:, None]
    slot = np.arange(rows.shape[1])[None, :]
    inr = (slot >= fs) & (slot < fs + nf)
    if not np.all(np.take_along_axis(inr, ftop, axis=1)):
        raise ValueError("reflector_records: a top tile outside its factorize rows")
    # the top tile first, then the record's other factorize row tiles in slot order
    # (the slots of ``inr`` but ftop), the rest empty
    cnt = inr.sum(axis=1)
    src = np.maximum(fs, 0) + slot - 1
    src += src >= ftop
    src[:, 0] = ftop[:, 0]
    stack = np.take_along_axis(rows, np.minimum(src, rows.shape[1] - 1), axis=1)
    stack[slot >= cnt[:, None]] = -1
    out["type"] = TaskType.APPLY_QT
    out["F"] = F
    out["vt"] = np.where(isf, tasks["vt"], tasks["vt2"])
    out["col"] = np.where(isf, tasks["col"], tasks["c0"])
    out["nref"] = np.where(isf, tasks["nref"], tasks["aux"])
    out["fm"] = tasks["fm"]
    out["fn"] = tasks["fn"]
    out["aux"] = rowmap_off
    out["napply"] = cnt
    out["front"] = tasks["front"]
    out["rows"] = stack
    return out


@dataclass
class ReplayPlan:
    """Kept reflectors of a factorization grouped into levels (see the module doc).

    Attributes
    ----------
    m : int
        Rows of Q.
    tile, bundle : int
    records : ndarray of TASK_DTYPE
        ``TASK_APPLY_QT`` records sorted by level.
    rowmap : ndarray of int64
        Global row of every front row (fronts with records, concatenated).
    level_ptr : ndarray of int64, shape (nlevels + 1,)
        Records of level ``l``: ``records[level_ptr[l]:level_ptr[l+1]]``.
    level_stage : ndarray of int64, shape (nlevels,)
        The stage whose front pool level ``l`` reads.
    level_dense : dict
        level → list of dense-front objects applied after its records.
    """

    m: int
    tile: int
    bundle: int
    records: np.ndarray
    rowmap: np.ndarray
    level_ptr: np.ndarray
    level_stage: np.ndarray
    level_dense: dict = field(default_factory=dict)
    level_dense_fronts: dict = field(default_factory=dict)

    @property
    def nlevels(self) -> int:
        return len(self.level_stage)


def _global_rows(rec: np.ndarray, rowmap: np.ndarray, tile: int, pad: int) -> np.ndarray:
    """(records, BUNDLE·TILE) global rows touched by each record, ``pad`` where none."""
    n, ns = len(rec), rec["rows"].shape[1]
    r = rec["rows"].astype(np.int64)[:, :, None] + np.arange(tile)[None, None, :]
    ok = (rec["rows"][:, :, None] >= 0) & (r < rec["fm"].astype(np.int64)[:, None, None])
    ok &= (np.arange(ns)[None, :, None] < rec["napply"].astype(np.int64)[:, None, None])
    idx = rec["aux"].astype(np.int64)[:, None, None] + r
    G = np.full(r.shape, pad, dtype=np.int64)
    G[ok] = rowmap[idx[ok]]
    return G.reshape(n, ns * tile)


def build_replay_plan(m: int, fronts: list, *, tile: int, bundle: int,
                      launch_base: list, dense: dict | None = None,
                      verify: bool = False, by_launch: bool = False) -> ReplayPlan:
    """Group the kept reflectors of a factorization into levels.

    Parameters
    ----------
    m : int
        Rows of the factorized matrix (rows of X).
    fronts : list of tuple
        Per front ``(slots, tasks, launches, stage, offset)``: the global row
        of each front row, the kept Factorize / Apply+Factorize records (in
        order), the global launch index of each record, the stage and the
        front's base in the stage's pool.
    tile, bundle : int
        The schedule's tile edge and the kernel's largest stack of row tiles.
    launch_base : list of int
        First global launch index of each stage.
    dense : dict, optional
        Front → object with ``slots`` and ``after_launch`` (global launch
        index; its reflectors act after that launch's records).
    verify : bool
        Check that the records of every level touch disjoint global rows
        (O(rows touched); the tests and debug mode do).
    by_launch : bool
        A level's stage is the one ``launch_base`` puts its launch in, not its
        fronts' stage: a stage whose pool went to the host whole but is read
        in parts of its launches (a mapped pool, each part's reflectors
        uploaded in turn; ``launch_base`` then holds the parts' first launches).

    Returns
    -------
    ReplayPlan

    Raises
    ------
    ValueError
        A reflector stacks more row tiles than the kernel holds, or (with
        ``verify``) two records of one level share a row.
    """
    dense = dense or {}
    kept = [fr for fr in fronts if fr[1] is not None and len(fr[1])]
    cat = (lambda x: np.concatenate(x) if x else np.zeros(0, np.int64))
    # per front: its records, slots, stage and offset; per record by np.repeat
    count = np.fromiter((len(fr[1]) for fr in kept), dtype=np.int64, count=len(kept))
    nslot = np.fromiter((len(fr[0]) for fr in kept), dtype=np.int64, count=len(kept))
    rowmap = cat([np.asarray(fr[0], dtype=np.int64) for fr in kept])
    lau = cat([np.asarray(fr[2], dtype=np.int64) for fr in kept])
    stg = np.repeat(np.fromiter((fr[3] for fr in kept), dtype=np.int64, count=len(kept)), count)
    if kept:
        allt = join_records([fr[1] for fr in kept])
        F = np.repeat(np.fromiter((fr[4] for fr in kept), dtype=np.int64, count=len(kept)),
                      count)
        moff = np.repeat(np.cumsum(nslot) - nslot, count)
        rec = reflector_records(allt, F, moff)
    else:
        rec = empty_tasks(0)
    if len(rec) and int(rec["napply"].max()) > bundle:
        raise ValueError(f"a reflector stacks {int(rec['napply'].max())} row tiles; "
                         f"the device kernel holds {bundle}")
    order = np.argsort(lau, kind="stable")
    rec = take_records(rec, order)
    lau, stg = lau[order], stg[order]
    if by_launch:
        stg = np.searchsorted(np.asarray(launch_base if len(launch_base) else [0],
                                         dtype=np.int64), lau, side="right") - 1
    # levels: the factorization's launches that kept reflectors or end with a dense front
    dense_at: dict = {}
    for f in sorted(dense):
        dense_at.setdefault(int(dense[f].after_launch), []).append(dense[f])
    keys = np.array(sorted(set(np.unique(lau).tolist()) | set(dense_at)), dtype=np.int64)
    ptr = np.searchsorted(lau, keys, side="left").tolist() + [len(rec)]
    ptr = np.asarray(ptr, dtype=np.int64)
    bounds = np.asarray(launch_base if len(launch_base) else [0], dtype=np.int64)
    level_stage = np.searchsorted(bounds, keys, side="right") - 1
    has = ptr[1:] > ptr[:-1]
    level_stage[has] = stg[ptr[:-1][has]]
    level_dense = {i: dense_at[int(L)] for i, L in enumerate(keys.tolist()) if L in dense_at}
    fronts_at: dict = {}
    for f in sorted(dense):
        fronts_at.setdefault(int(dense[f].after_launch), []).append(int(f))
    plan = ReplayPlan(m=int(m), tile=int(tile), bundle=int(bundle), records=rec,
                      rowmap=rowmap, level_ptr=ptr, level_stage=level_stage.astype(np.int64),
                      level_dense=level_dense,
                      level_dense_fronts={i: fronts_at[int(L)] for i, L in
                                          enumerate(keys.tolist()) if L in fronts_at})
    if verify:
        check_levels(plan)
    return plan


def check_levels(plan: ReplayPlan) -> None:
    """Raise ValueError when two records of one level share a global row."""
    owner = np.zeros(plan.m, dtype=np.int64)
    for lv in range(plan.nlevels):
        a, b = int(plan.level_ptr[lv]), int(plan.level_ptr[lv + 1])
        if b - a < 2:
            continue
        G = _global_rows(plan.records[a:b], plan.rowmap, plan.tile, plan.m)
        flat = G[G < plan.m]
        pos = np.arange(flat.size)
        owner[flat] = pos
        if not np.array_equal(owner[flat], pos):
            raise ValueError(f"records of replay level {lv} share global rows")


def stage_sequence(plan: ReplayPlan, trans: bool) -> list:
    """The stages whose pools a replay reads, in the order it reads them
    (``Qᵀ``: levels in order; ``Q``: reversed), each once."""
    order = np.asarray(plan.level_stage, dtype=np.int64)
    if not trans:
        order = order[::-1]
    if not len(order):
        return []
    keep = np.r_[True, order[1:] != order[:-1]]
    return order[keep].tolist()


# ----------------------------------------------------------------------------- executors

class NumpyExecutor:
    """The kernel's arithmetic in NumPy over the plan (CPU check of the plan).

    Parameters
    ----------
    plan : ReplayPlan
    pools : callable
        ``pools(stage) -> ndarray``: the stage's front pool.
    vt : ndarray
        VT tile pool.
    """

    xp = np
    #: a :class:`~.replay_split.ReplaySplit` and its lanes (device → lane), where
    #: the replay runs over several devices (:func:`replay`)
    split = None
    lanes = None

    def __init__(self, plan: ReplayPlan, pools, vt):
        self.plan, self.pools, self.vt = plan, pools, vt

    def level(self, lv: int, X: np.ndarray, trans: bool) -> None:
        p = self.plan
        a, b = int(p.level_ptr[lv]), int(p.level_ptr[lv + 1])
        if b <= a:
            return
        pool = self.pools(int(p.level_stage[lv]))
        recs = p.records[a:b]
        if isinstance(pool, UploadedReflectors):
            recs, pool = pool.level_records(lv, b - a), pool.values
        tile = p.tile
        for rec in recs:
            V, T, g = _load_reflector(rec, pool, self.vt, p.rowmap, tile)
            Y = X[g]
            C = V.T @ Y
            C = (T.T if trans else T) @ C
            X[g] = Y - V @ C

    def done(self) -> None:
        pass


def _load_reflector(rec, pool, vt, rowmap, tile):
    """(V, T, global rows) of one APPLY_QT record (rows >= fm dropped)."""
    fm, fn, col, nref = int(rec["fm"]), int(rec["fn"]), int(rec["col"]), int(rec["nref"])
    F0, v0, aux = int(rec["F"]), int(rec["vt"]), int(rec["aux"])
    VTt = np.asarray(vt[v0: v0 + tile * tile], dtype=np.float64).reshape(tile, tile)
    T = np.triu(VTt[:nref, :nref])
    blocks, rows = [], []
    for p in range(int(rec["napply"])):
        r0 = int(rec["rows"][p])
        r = np.arange(r0, min(r0 + tile, fm))
        if p == 0:
            Vt = np.tril(VTt[:, :nref], -1)
            Vt[np.arange(nref), np.arange(nref)] = 1.0
            Vb = Vt[: len(r)]
        else:
            Vb = np.asarray(pool[F0 + r[:, None] * fn + col + np.arange(nref)[None, :]],
                            dtype=np.float64)
        blocks.append(Vb)
        rows.append(r)
    r = np.concatenate(rows)
    return np.vstack(blocks), T, rowmap[aux + r]


class CupyExecutor:
    """The plan's levels as launches of ``kernels/sparse_qr/applyq.cu``.

    Parameters
    ----------
    plan : ReplayPlan
    pools : callable
        ``pools(stage) -> cupy.ndarray``: the stage's front pool on the device
        (an earlier stage's host pool is uploaded by the caller's callable).
    vt : cupy.ndarray
        VT tile pool.
    dtype : numpy.dtype
        The pools' dtype (float64 or float32).
    stream : cupy.cuda.Stream, optional
    """

    #: see :class:`NumpyExecutor` (set by :func:`replay_lanes`)
    split = None
    lanes = None

    def __init__(self, plan: ReplayPlan, pools, vt, dtype, stream=None):
        import cupy as cp
        self.cp = cp
        self.plan, self.pools, self.vt = plan, pools, vt
        ctype = "double" if np.dtype(dtype) == np.float64 else "float"
        if (ctype, plan.tile, plan.bundle) not in av.APPLYQ_VARIANTS:
            raise ValueError(f"no applyq variant for {ctype}, TILE {plan.tile}, "
                             f"BUNDLE {plan.bundle}")
        mod = load_module(av.APPLYQ_FILE, av.KERNEL_VARIANTS[av.APPLYQ_FILE])
        self.kern = {tr: mod.get_function(av.applyq_name(ctype, plan.tile, plan.bundle, tr))
                     for tr in (True, False)}
        self.smem = av.applyq_smem_bytes(plan.tile, plan.bundle)
        for k in self.kern.values():
            if self.smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = self.smem
        self.stream = stream if stream is not None else cp.cuda.get_current_stream()
        with self.stream:
            self.d_rec = cp.asarray(np.ascontiguousarray(plan.records).view(np.uint8))
            self.d_map = cp.asarray(plan.rowmap if len(plan.rowmap) else np.zeros(1, np.int64))
        self._pool_sid = None
        self._pool = None
        self.prefetch = PREFETCH
        self._next = {tr: dict(zip(q[:-1], q[1:]))           # stage -> the one read after it
                      for tr in (True, False) for q in (stage_sequence(plan, tr),)}
        self._trans = True
        self._side = None           # the prefetches' copy stream, made on the first
        self._ahead = None          # (stage, UploadedReflectors) going up on it
        self.prefetched = 0         # stages whose pack came from a prefetch
        # (what, event) of one replay while the package logs at debug level: the
        # stages' uploads and dense fronts on the device's clock (:meth:`done`)
        self._marks = None

    def level(self, lv: int, X, trans: bool) -> None:
        p = self.plan
        a, b = int(p.level_ptr[lv]), int(p.level_ptr[lv + 1])
        if b <= a:
            return
        pool = self.stage_pool(int(p.level_stage[lv]))
        recs = self.d_rec[a * TASK_BYTES:]
        if isinstance(pool, UploadedReflectors):
            recs, pool = pool.level_records(lv, b - a), pool.values
        k = X.shape[1]
        grid = (b - a, (k + av.APPLYQ_COLUMNS - 1) // av.APPLYQ_COLUMNS)
        with self.stream:
            self.kern[bool(trans)](grid, (av.APPLYQ_THREADS,),
                                   (recs, pool, self.vt,
                                    self.d_map, X, np.int32(k), np.int64(k)),
                                   shared_mem=self.smem)

    def begin(self, trans: bool) -> None:
        """A replay starts: ``Qᵀ`` (``trans``) reads the stages in order, ``Q`` in reverse."""
        self._trans = bool(trans)

    def stage_pool(self, sid: int):
        """Stage ``sid``'s pool on the device (an earlier stage's uploaded, the
        previous upload dropped first; its prefetch waited for where one went
        up), then the next stage's prefetch started (:data:`PREFETCH`)."""
        if sid != self._pool_sid:
            self._pool = None           # drop an uploaded pool before the next
            self.mark(f"u{sid}")
            ahead, self._ahead = self._ahead, None
            if ahead is not None and ahead[0] == sid:
                self._pool = ahead[1]
                self._pool.wait(self.stream)    # the levels wait for its copies
                self.prefetched += 1
            else:
                self._drop(ahead)
                with self.stream:       # an upload goes before the level's kernels
                    self._pool = self.pools(sid)
            self._pool_sid = sid
            self.mark(f"l{sid}")
            self._prefetch(self._next[self._trans].get(sid))
        return self._pool

    def _prefetch(self, sid) -> None:
        """Stage ``sid``'s reflectors sent up on the side stream behind the work
        queued so far (its buffers taken on the replay's stream, where a block
        the replay freed may be reused), where the pools' callable can
        (``pools.prefetch``: an earlier stage's pack that fits beside the
        current one)."""
        fetch = getattr(self.pools, "prefetch", None)
        if not self.prefetch or sid is None or fetch is None:
            return
        if self._side is None:
            self._side = self.cp.cuda.Stream(non_blocking=True)
        with self.stream:
            up = fetch(sid, self._side)
        if up is not None:
            self._ahead = (sid, up)
            self.mark(f"p{sid}")

    def prefetch_first(self):
        """Outside a replay: the first stage ``Qᵀ`` reads sent up now, as a prefetch
        (the next ``Qᵀ`` replay takes it; :meth:`drop_first`); that stage, or None
        (nothing to send, or it does not fit)."""
        seq = stage_sequence(self.plan, True)
        if self._pool_sid is not None or self._ahead is not None or not seq:
            return None
        self._prefetch(seq[0])
        self._marks = None              # a replay's timeline starts with the replay
        return None if self._ahead is None else self._ahead[0]

    def drop_first(self) -> bool:
        """Outside a replay: a pack prefetched and not yet read let go (later work
        on the replay's stream waits for its copies); whether there was one."""
        if self._pool_sid is not None or self._ahead is None:
            return False
        ahead, self._ahead = self._ahead, None
        self._drop(ahead)
        return True

    def _drop(self, ahead) -> None:
        """A prefetched pack not used: later work on the replay's stream (which
        may reuse its blocks) waits for its copies first."""
        if ahead is not None:
            ahead[1].wait(self.stream)

    def mark(self, what: str) -> None:
        """A point of the replay's timeline (debug logging only: timed events)."""
        if self._marks is None:
            if not logging.getLogger("scipy_gpuqr").isEnabledFor(logging.DEBUG):
                return
            self._marks = [("start", self._timed())]
        self._marks.append((what, self._timed()))

    def _timed(self):
        ev = self.cp.cuda.Event()
        ev.record(self.stream)
        return ev

    def done(self) -> None:
        """Release an uploaded pool; at debug level, log the replay's timeline
        (``what:ms`` from its start: ``u<stage>`` a stage's upload queued,
        ``l<stage>`` its levels begin, ``p<stage>`` its prefetch queued,
        ``d``/``e`` dense fronts begin/end)."""
        self._pool = None
        self._pool_sid = None
        ahead, self._ahead = self._ahead, None
        self._drop(ahead)
        marks, self._marks = self._marks, None
        if marks:
            marks.append(("end", self._timed()))
            marks[-1][1].synchronize()
            t0 = marks[0][1]
            logging.getLogger("scipy_gpuqr").debug(
                "Q replay, ms from the start: %s", " ".join(
                    f"{w}:{self.cp.cuda.get_elapsed_time(t0, ev):.1f}" for w, ev in marks[1:]))


def replay(plan: ReplayPlan, executor, X, trans: bool) -> None:
    """``X ← Qᵀ X`` (``trans``) or ``X ← Q X`` in place; X of shape (m, k), float64.

    X is in the factorization's row slots (row i of A in slot i), before
    ``qorder``; it must be C-contiguous for the CUDA executor.
    """
    order = range(plan.nlevels) if trans else range(plan.nlevels - 1, -1, -1)
    begin = getattr(executor, "begin", None)
    if begin is not None:
        begin(trans)
    split = getattr(executor, "split", None)
    try:
        if split is not None:       # lanes on the devices holding their stages
            replay_split.split_replay(split, functools.partial(_home_level, plan, executor),
                                      executor.lanes, X, trans)
        else:
            for lv in order:
                _home_level(plan, executor, lv, X, trans)
    finally:
        executor.done()


def _home_level(plan, executor, lv: int, X, trans: bool) -> None:
    """Level ``lv`` on X and its dense fronts (after it for ``Qᵀ``, before for ``Q``)."""
    objs = plan.level_dense.get(lv, [])
    if not trans:
        _dense(objs, X, trans, executor)
    executor.level(lv, X, trans)
    if trans:
        _dense(objs, X, trans, executor)


def _dense(objs, X, trans, executor=None):
    """The dense fronts ``objs`` of a level on X; one whose values lie in a stage
    pool (``pool_at``) reads them there through the executor's device pool (no
    second copy of the front beside its uploaded pool)."""
    stage_pool = getattr(executor, "stage_pool", None)
    host = isinstance(X, np.ndarray) or not X.flags.c_contiguous   # else prefetched kernels
    mark = getattr(executor, "mark", None)
    if objs and mark is not None:
        mark("d")
    for obj in (objs if trans else objs[::-1]):
        s = obj.slots
        Y = X[s] if host else array_ops.take_rows(X, s)
        front = None
        at = getattr(obj, "pool_at", None)
        if at is not None and stage_pool is not None:
            sid, off = at
            fm, fn = obj.shape
            pool = stage_pool(sid)
            front = (pool.front(off, fm * fn) if isinstance(pool, UploadedReflectors)
                     else pool[off: off + fm * fn]).reshape(fm, fn)
        apply = obj.apply_qt if trans else obj.apply_q
        if front is None:
            apply(Y)
        else:
            apply(Y, front=front)
        if host:
            X[s] = Y
        else:
            array_ops.put_rows(X, s, Y)
    if objs and mark is not None:
        mark("e")


# ----------------------------------------------------------------------------- solve

class DeviceSolve:
    """Full-rank solves with R on the device.

    Parameters
    ----------
    R : scipy.sparse matrix, shape (k, q)
        The factor; its leading square ``min(k, q)`` block is solved with.
    colperm : ndarray of int64
        Column permutation of the factorization.
    fronts : FrontTriangular
        R's blocks read from the front pools (:mod:`.trsolve`).
    device_id : int, optional
        The CUDA device holding the factors: every solve runs there, whichever
        device is current (default: the current one).
    """

    def __init__(self, R, colperm, fronts, device_id: int | None = None):
        import cupy as cp
        self.cp = cp
        self.device_id = cp.cuda.Device().id if device_id is None else int(device_id)
        self.q = min(R.shape)
        self.square = R.shape[0] == R.shape[1]
        self.fronts = fronts
        self._product = None        # FrontProduct, made on the first multiply (False: none)
        with cp.cuda.Device(self.device_id):
            self.perm = cp.asarray(np.asarray(colperm, dtype=np.int64))

    def upper(self, C):
        """``R⁻¹ C`` (C: cupy (q, k) float64)."""
        return self._triangular(C, transposed=False)

    def release_kept(self) -> bool:
        """Drop the rows of R kept on the device between solves (staged
        factorizations); whether any were kept."""
        return self.fronts.release_kept()

    def upper_transposed(self, C):
        """``R⁻ᵀ C``."""
        return self._triangular(C, transposed=True)

    def multiply(self, C, transposed: bool = False):
        """``R C`` or ``Rᵀ C`` (C: cupy (q, k) float64) from the front blocks on the
        device (:class:`.rproduct.FrontProduct`), or None where the device cannot
        form it (R not square, a stage solved from the host in panels)."""
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            if self._product is None:
                self._product = (FrontProduct.of(self.fronts) if self.square else None) or False
            if self._product is False:
                return None
            return self._product.multiply(_here(cp, cp.asarray(C)), trans=transposed)

    def _triangular(self, C, transposed: bool):
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            if self.q == 0 or C.shape[1] == 0:
                return cp.zeros((self.q, C.shape[1]))
            C = _here(cp, cp.asarray(C))
            return self.fronts.upper_transposed(C) if transposed else self.fronts.upper(C)

    def forward(self, qt_matmul, B, n: int):
        """``X[perm] = R⁻¹ (Qᵀ B)[:q]``: least squares of tall A, or ``A X = B``."""
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            C = cp.ascontiguousarray(qt_matmul(B)[: self.q])
            Y = self.upper(C)
            X = cp.empty((n, B.shape[1]), dtype=np.float64)
            array_ops.put_rows(X, self.perm, Y)     # X[perm] = Y, a prefetched kernel
            return X

    def backward(self, q_matmul, B, mq: int):
        """``X = Q [R⁻ᵀ B[perm]; 0]`` (Q of order ``mq``): minimum-norm of wide A, or ``Aᵀ X = B``."""
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            B = _here(cp, cp.asarray(B))
            Z = self.upper_transposed(cp.ascontiguousarray(B[self.perm]))
            pad = cp.zeros((mq, B.shape[1]), dtype=np.float64)
            pad[: Z.shape[0]] = Z
            return q_matmul(pad)


# ----------------------------------------------------------------------------- GpuQR glue

def plan_of(qr) -> ReplayPlan:
    """The replay plan of a :class:`~scipy_gpuqr._engine.gpu.driver.GpuQR` (built once).

    Its arrays depend on the schedule, R's layout (the fronts' row slots) and
    where each front lies, not on the values: they are kept with the schedule
    (cached per pattern, :func:`~scipy_gpuqr._schedule.sparse.build_schedule`)
    under those (:func:`kept_plan`), so a new factorization of a known pattern
    only attaches its own dense fronts to the levels; and on disk
    (:mod:`.replay_store`), so a new process's first solve of a pattern an
    earlier process solved maps them instead of building them. A first
    factorization of a pattern may have started that work while its last
    stage ran (``_replay['plan_ahead']``, :mod:`.replay_ahead`): it is waited
    for first.
    """
    plan = qr._replay.get("plan")
    if plan is None:
        ahead = qr._replay.pop("plan_ahead", None)
        if ahead is not None:
            try:
                ahead.result()
            except Exception:  # noqa: BLE001 - made here as without the early start
                pass
        dense = getattr(qr, "_dense", {}) or {}
        hit = kept_plan(qr)
        if hit is not None:
            plan = ReplayPlan(m=hit.m, tile=hit.tile, bundle=hit.bundle,   # own copies
                              records=hit.records.copy(), rowmap=hit.rowmap.copy(),
                              level_ptr=hit.level_ptr.copy(),
                              level_stage=hit.level_stage.copy(),
                              level_dense={i: [dense[f] for f in fl]
                                           for i, fl in hit.level_dense_fronts.items()},
                              level_dense_fronts=hit.level_dense_fronts)
            if bool(getattr(qr._device, "debug", False)):
                check_levels(plan)
        else:
            plan = _built_plan(qr)
        qr._replay["plan"] = plan
    return plan


def kept_plan(qr) -> ReplayPlan | None:
    """The read-only replay plan kept with ``qr``'s schedule (``extras``) for its
    rows, fronts' places and dense fronts (:func:`_plan_key`): kept already,
    else read from its file (:mod:`.replay_store`), else built (then written
    behind the caller); None where the schedule keeps nothing (the caller
    builds its own). Its ``level_dense`` is empty: each factorization attaches
    its own dense fronts (:func:`plan_of`).

    ``qr`` needs ``shape``, ``analysis``, ``schedule``, ``_fronts`` (slots and
    kept records of each front), ``_front_loc``, ``_front_launch``,
    ``_launch_base``, ``_dense`` (front → an object with ``after_launch``),
    ``_device`` (its ``debug``) and ``_replay``: a
    :class:`~scipy_gpuqr._engine.gpu.driver.GpuQR`, or what
    :mod:`.replay_ahead` makes before the factorization ends.
    """
    kept = getattr(qr.schedule, "extras", None)
    if kept is None:
        return None
    key = _plan_key(qr)
    hit = kept.get(key)
    if hit is None:                     # a plan an earlier process stored
        where = replay_store.slot(qr)
        hit = replay_store.load(where, lambda a: _kept_plan(qr, a))
        if hit is None:
            plan = _built_plan(qr)
            arr = (plan.records, plan.rowmap, plan.level_ptr, plan.level_stage)
            for a in arr:               # read-only, shared by later factorizations
                a.flags.writeable = False
            hit = ReplayPlan(m=plan.m, tile=plan.tile, bundle=plan.bundle,
                             records=arr[0], rowmap=arr[1], level_ptr=arr[2],
                             level_stage=arr[3], level_dense_fronts=plan.level_dense_fronts)
            if where is not None:       # written off the caller's path
                write_behind(replay_store.save, where, plan_arrays(hit))
        hit = kept.setdefault(key, hit)
    return hit


def _built_plan(qr) -> ReplayPlan:
    """:func:`build_replay_plan` of ``qr``'s kept records, fronts and dense fronts."""
    fronts = []
    for f, (slots, _, tasks) in enumerate(qr._fronts):
        sid, off = qr._front_loc[f]
        fronts.append((slots, tasks, qr._front_launch[f], sid, off))
    sched = qr.schedule
    return build_replay_plan(qr.shape[0], fronts, tile=sched.tile, bundle=sched.bundle,
                             launch_base=qr._launch_base,
                             dense=getattr(qr, "_dense", {}) or {},
                             verify=bool(getattr(qr._device, "debug", False)),
                             by_launch=bool(getattr(qr, "_replay_by_launch", False)))


def _plan_key(qr) -> tuple:
    """The key of ``qr``'s replay plan among those kept with its schedule: the
    rows, the stages' first launches, where each front lies and which launch
    each dense front follows."""
    key = qr._replay.get("plan_key")
    if key is None:
        dense = getattr(qr, "_dense", {}) or {}
        key = qr._replay["plan_key"] = (
            "replay_plan", int(qr.shape[0]), tuple(qr._launch_base),
            bool(getattr(qr, "_replay_by_launch", False)),
            tuple(tuple(x) for x in qr._front_loc),
            tuple(sorted((int(f), int(d.after_launch)) for f, d in dense.items())))
    return key


def plan_arrays(plan: ReplayPlan) -> dict:
    """A plan's arrays as :mod:`.replay_store` keeps them (its dense-front objects
    left out: only which fronts follow which level)."""
    dl = sorted(plan.level_dense_fronts)
    fl = [[int(f) for f in plan.level_dense_fronts[lv]] for lv in dl]
    return {"records": np.ascontiguousarray(plan.records).view(np.uint8),
            "rowmap": np.asarray(plan.rowmap, dtype=np.int64),
            "level_ptr": np.asarray(plan.level_ptr, dtype=np.int64),
            "level_stage": np.asarray(plan.level_stage, dtype=np.int64),
            "dense_level": np.asarray(dl, dtype=np.int64),
            "dense_ptr": np.cumsum([0] + [len(x) for x in fl], dtype=np.int64),
            "dense_front": np.asarray([f for x in fl for f in x], dtype=np.int64)}


def plan_of_arrays(a: dict, *, m: int, tile: int, bundle: int) -> ReplayPlan:
    """The plan (no dense-front objects) of :func:`plan_arrays`' arrays, views of
    them (read-only where they are).

    Raises
    ------
    ValueError
        Arrays that cannot be a plan's (a damaged file).
    """
    raw = a["records"]
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size % TASK_BYTES:
        raise ValueError("replay records: bad size")
    records = raw.view(TASK_DTYPE)
    ptr, stage, rowmap = a["level_ptr"], a["level_stage"], a["rowmap"]
    for v in (ptr, stage, rowmap, a["dense_level"], a["dense_ptr"], a["dense_front"]):
        if v.dtype != np.int64 or v.ndim != 1:
            raise ValueError("replay arrays: bad dtype")
    nl = len(stage)
    if len(ptr) != nl + 1 or int(ptr[0]) != 0 or int(ptr[-1]) != len(records) \
            or np.any(np.diff(ptr) < 0):
        raise ValueError("replay levels: bad pointers")
    if len(rowmap) and (int(rowmap.min()) < 0 or int(rowmap.max()) >= m):
        raise ValueError("replay row map: rows out of range")
    dl, dp, df = a["dense_level"], a["dense_ptr"], a["dense_front"]
    if len(dp) != len(dl) + 1 or (len(dp) and int(dp[-1]) != len(df)):
        raise ValueError("replay dense fronts: bad pointers")
    dense = {int(lv): [int(f) for f in df[dp[i]:dp[i + 1]]] for i, lv in enumerate(dl.tolist())}
    return ReplayPlan(m=int(m), tile=int(tile), bundle=int(bundle), records=records,
                      rowmap=rowmap, level_ptr=ptr, level_stage=stage,
                      level_dense_fronts=dense)


def _kept_plan(qr, a: dict) -> ReplayPlan:
    """:func:`plan_of_arrays` for ``qr`` (its rows, the schedule's tile and bundle)."""
    return plan_of_arrays(a, m=int(qr.shape[0]), tile=int(qr.schedule.tile),
                          bundle=int(qr.schedule.bundle))


def _check_rhs(B, m: int, what: str):
    shape = tuple(B.shape)
    if len(shape) not in (1, 2) or shape[0] != m:
        raise ValueError(f"{what}: expected shape ({m},) or ({m}, k), got {shape}")
    if np.dtype(B.dtype).kind == "c":
        raise TypeError(f"{what}: complex right-hand sides are not supported")
    if np.dtype(B.dtype).kind not in "biuf":
        raise TypeError(f"{what}: numeric right-hand sides expected, got {B.dtype}")


def apply_plan(qr, B2, trans: bool, executor):
    """``Qᵀ B2`` (rows in R's order, ``qorder``) or ``Q B2``; B2 (m, k), float64.

    ``executor.xp`` (NumPy or CuPy) holds B2 and the result.
    """
    xp = executor.xp
    plan = plan_of(qr)
    m, k = B2.shape
    out = xp.empty((m, k), dtype=np.float64)
    step = max(1, min(k, CHUNK_ELEMENTS // max(m, 1))) if k else 1
    qorder = qr._replay.get(("qorder", xp.__name__))
    if qorder is None:
        qorder = xp.asarray(qr.qorder)
        qr._replay[("qorder", xp.__name__)] = qorder
    host = getattr(xp, "__name__", "") != "cupy"     # CuPy: prefetched kernels, no CuPy copies
    for c0 in range(0, k, step):
        c1 = min(k, c0 + step)
        if trans:
            if host:
                X = xp.array(B2[:, c0:c1], dtype=np.float64, order="C")
            else:
                X = array_ops.fresh_float64(B2[:, c0:c1])
            replay(plan, executor, X, True)
            if host:
                out[:, c0:c1] = X[qorder]
            else:
                array_ops.take_rows(X, qorder, out=out[:, c0:c1])
        else:
            X = xp.zeros((m, c1 - c0), dtype=np.float64)
            if host:
                X[qorder] = B2[:, c0:c1]
            else:
                array_ops.put_rows(X, qorder, B2[:, c0:c1])
            replay(plan, executor, X, False)
            if host:
                out[:, c0:c1] = X
            else:
                array_ops.copy_into(out[:, c0:c1], X)
    return out


def _device_pools(qr, *, reflectors_only: bool = False):
    """``pools(stage)``: the stage's pool on the device (earlier stages uploaded,
    from pinned memory at the link's speed; a host front's stays on the host).

    ``reflectors_only``: for ``Q``'s replay, an earlier stage goes up as only
    what the replay reads of its pool, its fronts' reflector columns and its
    dense fronts whole, packed (:class:`~.reflector_upload.UploadedReflectors`,
    with the stage's records pointed into it). That replay's executor is kept in
    the factorization (``_replay``), so its pools reach the factorization weakly:
    a strong reference would make the two a cycle, freed only by the cyclic
    collector (R's host arrays and the device pools kept until it runs). R's
    solves may outlive their caller's reference and keep it strongly."""
    cp = qr._device.cp
    owner = weakref.ref(qr) if reflectors_only else (lambda: qr)

    def pools(sid):
        qr = owner()
        pool = qr._stage_pools.get(sid)
        if pool is not None:
            return pool
        host = qr._host_pools[sid]
        if sid in getattr(qr, "_host_stages", {}):
            return host
        if reflectors_only:
            return upload_reflectors(host, _reflector_layout_of(qr, sid), cp)
        drop_first(qr)
        dev = cp.empty(host.shape, dtype=host.dtype)
        dev.set(host)
        return dev

    pinned = {}                 # stage -> its records' bytes in pinned memory

    def prefetch(sid, copy_stream):
        """Stage ``sid``'s pack taken on the current stream and sent up on
        ``copy_stream`` (:func:`~.reflector_upload.upload_reflectors`), or None:
        a pool on the device or a host stage's (nothing to send), or a pack
        that would not leave :data:`PREFETCH_MARGIN` of the memory free."""
        qr = owner()
        if sid in qr._stage_pools or sid in getattr(qr, "_host_stages", {}):
            return None
        host = qr._host_pools.get(sid)
        if host is None or not getattr(host, "flags", None) or not host.flags.c_contiguous:
            return None
        layout = _reflector_layout_of(qr, sid)
        raw = np.ascontiguousarray(layout.records).view(np.uint8).reshape(-1)
        nbytes = layout.size * host.itemsize + raw.nbytes
        if not _prefetch_fits(cp, nbytes):
            return None
        rec = pinned.get(sid)
        if rec is None:
            import cupyx
            rec = pinned[sid] = cupyx.empty_pinned(raw.shape, dtype=np.uint8)
            rec[...] = raw
        try:
            return upload_reflectors(host, layout, cp, copy_stream=copy_stream,
                                     records_host=rec)
        except cp.cuda.memory.OutOfMemoryError:
            return None

    if reflectors_only:
        pools.prefetch = prefetch
    else:                       # R's rows go up in the room of a first pack not read
        pools.before_upload = functools.partial(_room_for_rows, qr)
        pools.drop_first = functools.partial(drop_first, qr)
    return pools


def _room_for_rows(qr, nbytes: int) -> bool:
    """Before ``nbytes`` of R's rows go up for a solve: a first pack that
    :func:`prefetch_first` sent up and no replay read yet is let go
    (:func:`drop_first`) only where the rows would not fit beside it as a
    prefetch does (:func:`_prefetch_fits`): a solve queued before ``Qᵀ``'s replay
    (the rank decision's first block beside ``Qᵀb``, :func:`fetch_beside`) then
    leaves that replay its first stage on the device. Whether it was let go."""
    ex = qr._replay.get("cupy")
    if ex is None or ex._ahead is None:
        return False
    if _prefetch_fits(qr._device.cp, int(nbytes)):
        return False
    return drop_first(qr)


#: The rank decision of a staged factorization solves its first block with R
#: (``R⁻ᵀΩ``) on a stream of its own while ``Qᵀb`` replays (:func:`fetch_beside`):
#: the replay is bound by the link (earlier stages' reflectors and a host front's
#: panels go up), the block's solves by the device. Off: ``Qᵀb`` first, then
#: the block.
STAGED_BESIDE = True


def fetch_beside(qr) -> bool:
    """Whether the rank decision may fetch ``Qᵀb`` beside its first block's solve
    (:class:`~scipy_gpuqr._factor.solve_rank.NullspaceCOD`'s ``rhs_beside``) for a
    staged factorization on the device (:data:`STAGED_BESIDE`); R's rows then go
    up on the block's stream, in a first pack's room only where they do not fit
    beside it (:func:`_room_for_rows`)."""
    return bool(STAGED_BESIDE and qr.on_device() and getattr(qr, "_host_pools", None))


def _prefetch_fits(cp, nbytes: int) -> bool:
    """Whether ``nbytes`` more on the device leave the prefetch's margin free:
    under a pool limit, of the limit (what the pool holds in use counted: its
    cached blocks are reused, or given back first, which synchronizes the
    device once but leaves the copies beside the levels queued after), else of
    the device's free memory (the pool's cached blocks counted free)."""
    pool = cp.get_default_memory_pool()
    limit = int(pool.get_limit())
    if limit:
        margin = max(int(PREFETCH_MARGIN * limit), PREFETCH_MARGIN_BYTES)
        return int(pool.used_bytes()) + int(nbytes) + margin <= limit
    free, _ = cp.cuda.runtime.memGetInfo()
    return int(nbytes) + RESERVE + PREFETCH_MARGIN_BYTES <= int(free) + int(pool.free_bytes())


def _reflector_layout_of(qr, sid: int):
    """:func:`~.reflector_upload.reflector_layout` of stage ``sid``: made once per
    plan and kept with the schedule beside the plan (read-only, shared by the
    later factorizations of the pattern: a staged stage's layout takes tens of
    milliseconds of host time to make)."""
    key = ("reflector_layout", sid)
    layout = qr._replay.get(key)
    if layout is None:
        whole = []
        for d in (getattr(qr, "_dense", {}) or {}).values():
            at = getattr(d, "pool_at", None)
            if at is not None and at[0] == sid:
                fm, fn = d.shape
                whole.append((int(at[1]), int(fm * fn)))
        kept = getattr(qr.schedule, "extras", None)
        shared = (_plan_key(qr), "reflector_layout", int(sid), tuple(sorted(whole)))
        layout = kept.get(shared) if kept is not None else None
        if layout is None:
            layout = reflector_layout(plan_of(qr), sid, whole=whole)
            layout.records.flags.writeable = False
            if kept is not None:
                kept[shared] = layout
        qr._replay[key] = layout
    return layout


def _device_of(qr):
    """A context making the factorization's CUDA device current."""
    dev = qr._device
    return dev.cp.cuda.Device(getattr(dev, "device_id", dev.cp.cuda.Device().id))


def device_solve_of(qr) -> DeviceSolve:
    """The :class:`DeviceSolve` of a full-rank GPU factorization (R from the pools).

    Its rows of R kept on the device between solves are known to the
    factorization (``_replay['kept_rows']``, weakly): ``Q``'s replay drops them
    when it runs out of device memory (:func:`_make_room`)."""
    with _device_of(qr) as d:
        fronts = FrontTriangular(qr, _device_pools(qr), qr._device.cp,
                                 plan=triangular_plan_of(qr))
        live = [r for r in qr._replay.get("kept_rows", ()) if r() is not None]
        qr._replay["kept_rows"] = live + [weakref.ref(fronts)]
        return DeviceSolve(qr.R, qr.colperm, fronts, device_id=d.id)


def triangular_plan_of(qr) -> TriangularPlan:
    """R's solve plan of ``qr`` (:class:`~.trsolve.TriangularPlan`: its fronts,
    levels and level tables, none of which depends on R's values), kept with
    its schedule under where each front lies (as Q's replay plan,
    :func:`_plan_key`): a repeated factorization of a known pattern walks its
    fronts in Python once, not at each solve set-up."""
    kept = getattr(qr.schedule, "extras", None)
    key = ("front_triangular",) + _plan_key(qr)[1:]
    plan = kept.get(key) if kept is not None else None
    if plan is None:
        plan = TriangularPlan(qr.analysis.fronts, qr._front_loc)
        if kept is not None:
            kept[key] = plan
    return plan


def prefetch_first(qr):
    """The first stage ``Qᵀ`` reads of a staged factorization sent up now
    (:data:`PREFETCH_FIRST`; :meth:`CupyExecutor.prefetch_first`): the replay's
    executor made as the factorization ends, where the replay plan of its
    pattern is already kept (a new pattern's is made by the first solve, not
    here). That stage, or None."""
    if not (PREFETCH and PREFETCH_FIRST and qr.on_device()):
        return None
    if qr._replay.get("plan") is None:
        kept = getattr(qr.schedule, "extras", None)
        if kept is None or kept.get(_plan_key(qr)) is None:
            return None
    cp = qr._device.cp
    with _device_of(qr):
        try:
            return _cupy_executor(qr).prefetch_first()
        except cp.cuda.memory.OutOfMemoryError:     # the solves make it when they run
            qr._replay.pop("cupy", None)
            return None


def drop_first(qr) -> bool:
    """A pack :func:`prefetch_first` sent up and no replay read yet let go (R's
    solves upload their rows in its room); whether there was one."""
    ex = qr._replay.get("cupy")
    return bool(ex is not None and ex.drop_first())


def _cupy_executor(qr):
    ex = qr._replay.get("cupy")
    if ex is None:
        dev = qr._device
        cp = dev.cp
        ex = CupyExecutor(plan_of(qr), _device_pools(qr, reflectors_only=True), dev.vt,
                           dev.dtype)
        ex.xp = cp
        replay_lanes(qr, ex)
        qr._replay["cupy"] = ex
    return ex


def replay_lanes(qr, ex) -> None:
    """Give the home executor ``ex`` its lanes (:data:`SPLIT_REPLAY`): the levels of
    the stages held by other GPUs run there (:mod:`.replay_split`), each lane
    with its plan, its stages' pools where they lie and their VT tiles: the lane
    GPU's own VT pool that the factorization kept (``_replay['lane_vt']``,
    :mod:`.multi_device`), else the tiles copied from the home pool. The lanes
    (records, row map, row indices uploaded to each GPU) are made once per
    factorization. The split and
    the lanes' plans depend on the pattern and where the stages lie: kept with
    the schedule beside the replay plan. Nothing changes where no stage lies
    off the home device."""
    if not SPLIT_REPLAY:
        return
    cp = qr._device.cp
    where, home = stage_devices(qr, cp)
    if not where:
        return
    plan = ex.plan
    kept = getattr(qr.schedule, "extras", None)
    key = (_plan_key(qr), "replay_split", tuple(sorted(where.items())))
    hit = kept.get(key) if kept is not None else None
    if hit is None:
        split = replay_split.split_levels(plan, where, home)
        subs = ({d: replay_split.lane_plan(plan, lv, plan.tile)
                 for d, lv in split.levels.items()} if split is not None else {})
        hit = (split, subs)
        if kept is not None:
            kept[key] = hit
    split, subs = hit
    if split is None:
        return
    owner = weakref.ref(qr)     # the executor is kept in the factorization: no cycle

    def pools(sid):
        return owner()._stage_pools[sid]

    vt_home = qr._device.vt
    isz = vt_home.itemsize
    kept_vt = qr._replay.get("lane_vt", {})
    lanes = {}
    for d, (sub, v0, v1) in subs.items():
        with cp.cuda.Device(d):
            stream = cp.cuda.Stream(non_blocking=True)
            own = kept_vt.get(d)
            if own is not None and own.device.id == d and len(own) >= v1:
                vt = own[v0:]           # the tiles its factorization wrote, where they lie
            else:
                with stream:            # its tiles copied from the home pool (complete)
                    vt = cp.empty(max(v1 - v0, 1), dtype=vt_home.dtype)
                    if v1 > v0:
                        vt.data.copy_from_device_async(vt_home.data + v0 * isz,
                                                       (v1 - v0) * isz, stream)
            lane_ex = CupyExecutor(sub, pools, vt, qr._device.dtype, stream=stream)
            lane_ex.xp = cp
            lane_ex.prefetch = False
        rows = {t: r for t, (dev, r) in enumerate(split.segments) if dev == d}
        lanes[d] = replay_split.CupyLane(d, lane_ex, rows, home, ex.stream)
    ex.split, ex.lanes = split, lanes


def device_matmul(qr, B, *, trans: bool, float64: bool = False):
    """``Qᵀ B`` / ``Q B`` on the device; NumPy in → NumPy out, CuPy in → CuPy out.

    The result has R's dtype (float64 with ``float64``: the solves keep the
    precision of the float64 arithmetic). Falls back to the host replay (with
    a log line) when the device runs out of memory.
    """
    cp = qr._device.cp
    what = "qt_matmul" if trans else "q_matmul"
    on_gpu = isinstance(B, cp.ndarray)
    if not on_gpu:
        B = np.asarray(B)
    _check_rhs(B, qr.shape[0], what)
    B2 = B.reshape(B.shape[0], -1) if B.ndim == 2 else B.reshape(-1, 1)
    with _device_of(qr):
        return _device_matmul_here(qr, B, B2, trans=trans, float64=float64, on_gpu=on_gpu,
                                   what=what)


def _device_matmul_here(qr, B, B2, *, trans, float64, on_gpu, what):
    """:func:`device_matmul` with the factorization's device current."""
    cp = qr._device.cp
    log = logging.getLogger("scipy_gpuqr")
    Bd = _here(cp, B2) if on_gpu else cp.asarray(B2)
    out = None
    while out is None:
        try:
            out = apply_plan(qr, Bd, trans, _cupy_executor(qr))
        except cp.cuda.memory.OutOfMemoryError as exc:
            qr._replay.pop("cupy", None)
            freed = _make_room(qr)
            if freed is None:
                log.info("%s: device out of memory (%s); Q applied on the host", what, str(exc))
                break
            log.info("%s: device out of memory (%s); %s, applied on the device again",
                     what, str(exc), freed)    # the text: a record keeps no frames alive
    if out is None:
        qr._materialize()
        host = host_matmul(qr, B.get() if on_gpu else B, trans=trans)
        return cp.asarray(host) if on_gpu else host
    if not float64:
        out = out.astype(qr.R.dtype, copy=False)
    out = out.reshape(B.shape)
    return out if on_gpu else out.get()


def _here(cp, X):
    """CuPy array ``X`` on the current device (copied there from another GPU)."""
    if X.device.id == cp.cuda.Device().id:
        return X
    with X.device:
        X = cp.ascontiguousarray(X)
    out = cp.empty(X.shape, dtype=X.dtype)
    out.data.copy_from_device(X.data, X.nbytes)
    return out


def _make_room(qr) -> str | None:
    """Free the next of what a factorization keeps on the device beyond its VT
    pool, cheapest to lose first, so that ``Q`` is applied uploading one pool at
    a time: the rows of R its solves keep between calls (uploaded again per
    solve from then on), then the device copies of dense fronts and the kept
    stage pool (to the host); the memory pool's cached blocks are released
    either way. What was freed, or None when nothing was left to free."""
    freed = None
    for ref in qr._replay.get("kept_rows", ()):
        solves = ref()
        if solves is not None and solves.release_kept():
            freed = "the rows of R kept by the solves dropped"
    if freed is None:
        dense = [d for d in (getattr(qr, "_dense", {}) or {}).values() if d.has_device_copy()]
        for d in dense:
            d.drop_device()
        if qr.pools_to_host() or dense:
            freed = "pools and dense fronts moved to the host"
    qr._device.cp.get_default_memory_pool().free_all_blocks()
    return freed


def host_matmul(qr, B, *, trans: bool):
    """The host replay front by front (postorder), dense fronts included.

    The fronts are fetched to the host first (``qr._materialize()``).
    """
    qr._materialize()
    what = "qt_matmul" if trans else "q_matmul"
    B = np.asarray(B)
    _check_rhs(B, qr.shape[0], what)
    Bc = np.array(B[:, None] if B.ndim == 1 else B, dtype=np.float64)
    if trans:
        X = Bc
    else:
        X = np.zeros_like(Bc)
        X[qr.qorder] = Bc
    dense = getattr(qr, "_dense", {}) or {}
    tile = qr.schedule.tile
    seq = range(len(qr._fronts)) if trans else range(len(qr._fronts) - 1, -1, -1)
    with one_blas_thread():
        for f in seq:
            slots, Ff, ftasks = qr._fronts[f]
            if f in dense:
                obj = dense[f]
                Y = X[obj.slots]
                (obj.apply_qt if trans else obj.apply_q)(Y)
                X[obj.slots] = Y
            if len(ftasks):
                Y = X[slots]
                (apply_qt_records if trans else apply_q_records)(ftasks, Ff, qr._vt, tile, Y)
                X[slots] = Y
    out = X[qr.qorder] if trans else X
    return out.astype(qr.R.dtype, copy=False).reshape(B.shape)
