"""The NumPy executor of task lists: ``backend='simulate'`` and CI's proof.

It runs the very records the uberkernel runs (``scipy_gpuqr._schedule.tasks``)
over the same memory layout: one float pool of row-major fronts, a pool of
``TILE × TILE`` VT tiles, S entries and the Rimap/Rjmap maps. Each task reads
and writes only what its record names, so a schedule that lets two tasks of
one launch touch the same tile is caught by running the launch's tasks in a
different order (the tests do).

Numerical conventions (the GPU kernels follow them exactly):

* reflectors as LAPACK's ``dlarfg``: ``H = I - tau v vᵀ`` with ``v[0] = 1``,
  ``beta = -sign(alpha)·‖x‖``; a column with nothing below the diagonal
  gives ``tau = 0``;
* a tile bundle is stacked top tile first, then the other slots in slot
  order; rows past ``fm`` and columns past ``fn`` are zeros, never stored;
* the VT tile is row-major ``TILE × TILE``: ``T`` (forward, columnwise
  compact WY, ``H1…Hk = I - V T Vᵀ``) on and above the diagonal, the top
  tile's ``V1`` strictly below it; only the first ``nref`` columns are set;
* Apply computes ``A ← A - V (Tᵀ (Vᵀ A))``, i.e. ``(H1…Hk)ᵀ A``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..._cpu.blas_threads import one_blas_thread
from ..._schedule.dense import DEFAULT_DENSE_FLOPS
from ..._schedule.sparse import build_schedule
from ..._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE, TaskType
from ..dense_front import DEFAULT_PANEL, DenseFront, factorize_numpy, panels_of
from ..tasklist_qr import TaskListQR
from .reference import task_list_input

__all__ = ["householder_tile", "front_slots", "assemble_r", "execute_task", "execute_launches", "apply_qt_front",
           "apply_qt_records", "apply_q_records", "one_blas_thread", "launch_conflicts",
           "simulate_factorize", "SimulateQR"]


#: Sums of squares outside ``[NORM_LO, NORM_HI]`` lose precision (squares leave the
#: normal range): the norm is then recomputed with scaling, as LAPACK's dnrm2
#: does. Columns whose norm (diagonal included) is below ``NORM_TINY`` are left
#: alone (tau = 0). The tile kernel (``kernels/sparse_qr/factorize.cuh``,
#: ``NormRange``) follows the same rule.
NORM_LO, NORM_HI, NORM_TINY = 1e-280, 1e280, 1e-290


def column_norm(x: np.ndarray) -> float:
    """``‖x‖₂`` without under- or overflow in the squares (float64)."""
    s = float(x @ x)
    if NORM_LO <= s <= NORM_HI:
        return float(np.sqrt(s))
    amax = float(np.abs(x).max()) if x.size else 0.0
    if amax == 0.0 or not np.isfinite(amax):
        return amax
    xs = x / amax
    return amax * float(np.sqrt(xs @ xs))


def householder_tile(A: np.ndarray, nref: int) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR of the first ``nref`` columns of ``A`` in place.

    All columns of ``A`` receive the reflectors. Returns ``(tau, T)`` with
    ``T`` the ``nref × nref`` upper triangular compact-WY factor; ``A`` holds
    R on and above the diagonal and the unit-diagonal V below it in the
    first ``nref`` columns.
    """
    m, n = A.shape
    k_max = min(nref, m)
    tau = np.zeros(nref)
    for k in range(k_max):
        alpha = A[k, k]
        x = A[k + 1:, k]
        xnorm = column_norm(x) if x.size else 0.0     # 0 only for an all-zero x
        nrm = float(np.hypot(alpha, xnorm)) if xnorm > 0.0 else 0.0
        if not nrm >= NORM_TINY:
            continue
        beta = -np.copysign(nrm, alpha)
        tk = (beta - alpha) / beta
        v = x / (alpha - beta)
        A[k, k] = beta
        A[k + 1:, k] = v
        if k + 1 < n:
            w = A[k, k + 1:] + v @ A[k + 1:, k + 1:]
            A[k, k + 1:] -= tk * w
            A[k + 1:, k + 1:] -= tk * np.outer(v, w)
        tau[k] = tk
    V = np.tril(A[:, :nref], -1)
    V[np.arange(min(m, nref)), np.arange(min(m, nref))] = 1.0
    T = np.zeros((nref, nref))
    for k in range(nref):
        T[k, k] = tau[k]
        if k and tau[k] != 0.0:
            T[:k, k] = -tau[k] * (T[:k, :k] @ (V[:, :k].T @ V[:, k]))
    return tau, T




def _gather_rows(fpool, F, fn, fm, rows, c0, c1, tile):
    """Stack the row tiles ``rows`` over columns [c0, c1) (zero padded)."""
    out = np.zeros((len(rows) * tile, c1 - c0))
    ce = min(c1, fn)
    if ce <= c0:
        return out
    for p, r in enumerate(rows):
        nr = min(tile, fm - r)
        if nr <= 0:
            continue
        base = F + r * fn
        blk = fpool[base: base + nr * fn].reshape(nr, fn)
        out[p * tile: p * tile + nr, : ce - c0] = blk[:, c0:ce]
    return out


def _scatter_rows(fpool, F, fn, fm, rows, c0, c1, tile, data):
    ce = min(c1, fn)
    if ce <= c0:
        return
    for p, r in enumerate(rows):
        nr = min(tile, fm - r)
        if nr <= 0:
            continue
        base = F + r * fn
        blk = fpool[base: base + nr * fn].reshape(nr, fn)
        blk[:, c0:ce] = data[p * tile: p * tile + nr, : ce - c0]


def _factorize(rec, fpool, vtpool, tile, rows, top, col, nref, vt):
    F, fm, fn = int(rec["F"]), int(rec["fm"]), int(rec["fn"])
    others = [r for r in rows if r != top]
    stack = [top] + others
    A = _gather_rows(fpool, F, fn, fm, stack, col, col + tile, tile)
    _, T = householder_tile(A, nref)
    VT = np.zeros((tile, tile))
    VT[:nref, :nref] = np.triu(T)
    low = np.tril(A[:tile, :nref], -1)
    VT[:, :nref] += low
    A[:tile, :nref] = np.triu(A[:tile, :nref])
    _scatter_rows(fpool, F, fn, fm, stack, col, col + tile, tile, A)
    vtpool[vt: vt + tile * tile] = VT.ravel()


def _load_v(rec, fpool, vtpool, tile, rows, col, nref, vt):
    """V (stacked rows, unit lower top tile from the VT tile) and T."""
    F, fm, fn = int(rec["F"]), int(rec["fm"]), int(rec["fn"])
    VT = vtpool[vt: vt + tile * tile].reshape(tile, tile)
    T = np.triu(VT[:nref, :nref])
    V = _gather_rows(fpool, F, fn, fm, rows, col, col + tile, tile)[:, :nref]
    V[:tile] = np.tril(VT[:, :nref], -1)
    V[np.arange(nref), np.arange(nref)] = 1.0
    return V, T


def _apply(rec, fpool, vtpool, tile, rows, col, nref, vt, c0, c1):
    F, fm, fn = int(rec["F"]), int(rec["fm"]), int(rec["fn"])
    V, T = _load_v(rec, fpool, vtpool, tile, rows, col, nref, vt)
    A = _gather_rows(fpool, F, fn, fm, rows, c0, c1, tile)
    A -= V @ (T.T @ (V.T @ A))
    _scatter_rows(fpool, F, fn, fm, rows, c0, c1, tile, A)


def execute_task(rec, fpool: np.ndarray, vtpool: np.ndarray, tile: int, *,
                 spool=None, maps=None) -> None:
    """Run one record in place over the pools.

    Parameters
    ----------
    rec : numpy.void of TASK_DTYPE
    fpool : ndarray of float64
        Front pool.
    vtpool : ndarray of float64
        VT tile pool.
    tile : int
        Tile edge.
    spool : tuple (index, value) or None
        S entries (index relative to the front base) for S-Assemble.
    maps : ndarray of int64 or None
        Rimap and Rjmap pool for Pack-Assemble.
    """
    typ = int(rec["type"])
    rows = [int(r) for r in rec["rows"]]
    if typ == TaskType.FACTORIZE:
        fs, nf = int(rec["fstart"]), int(rec["nfrows"])
        _factorize(rec, fpool, vtpool, tile, rows[fs: fs + nf], rows[int(rec["ftop"])],
                   int(rec["col"]), int(rec["nref"]), int(rec["vt"]))
    elif typ in (TaskType.APPLY, TaskType.APPLY_FACTORIZE):
        na = int(rec["napply"])
        _apply(rec, fpool, vtpool, tile, rows[:na], int(rec["col"]), int(rec["nref"]),
               int(rec["vt"]), int(rec["c0"]), int(rec["c1"]))
        if typ == TaskType.APPLY_FACTORIZE:
            fs, nf = int(rec["fstart"]), int(rec["nfrows"])
            _factorize(rec, fpool, vtpool, tile, rows[fs: fs + nf], rows[int(rec["ftop"])],
                       int(rec["c0"]), int(rec["aux"]), int(rec["vt2"]))
    elif typ == TaskType.S_ASSEMBLE:
        idx, val = spool
        s0, s1 = int(rec["vt"]), int(rec["vt2"])
        fpool[int(rec["F"]) + idx[s0:s1]] = val[s0:s1]
    elif typ == TaskType.PACK_ASSEMBLE:
        _pack(rec, fpool, maps)
    elif typ == TaskType.NONE:
        return
    else:
        raise ValueError(f"task type {typ} is not executable here")


def _pack(rec, fpool, maps):
    """Copy a piece of a child's contribution block into its parent."""
    P, pld = int(rec["F"]), int(rec["fn"])
    C, cld = int(rec["vt"]), int(rec["col"])
    ri, rj = int(rec["vt2"]), int(rec["aux"])
    r0, r1 = int(rec["rows"][0]), int(rec["rows"][1])
    c0, c1 = int(rec["c0"]), int(rec["c1"])
    if r1 <= r0 or c1 <= c0:
        return
    ci = np.arange(r0, r1)
    cj = np.arange(c0, c1)
    src = fpool[C + ci[:, None] * cld + cj[None, :]]
    dst = P + maps[ri + ci][:, None] * pld + maps[rj + cj][None, :]
    if int(rec["nfrows"]) == 1:
        keep = cj[None, :] >= ci[:, None]
        fpool[dst[keep]] = src[keep]
    else:
        fpool[dst] = src


def execute_launches(tasks: np.ndarray, launch: np.ndarray, fpool: np.ndarray,
                     vtpool: np.ndarray, tile: int, *, spool=None, maps=None,
                     rng: np.random.Generator | None = None) -> int:
    """Run records launch by launch (``launch`` nondecreasing); returns launches.

    With ``rng`` the tasks of each launch run in a random order, which gives
    bitwise the same result when the launch has no inner dependencies.
    """
    if len(tasks) == 0:
        return 0
    bounds = np.flatnonzero(np.diff(launch)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(tasks)]))
    with one_blas_thread():
        for s, e in zip(starts, ends):
            order = np.arange(s, e) if rng is None else s + rng.permutation(e - s)
            for k in order:
                execute_task(tasks[k], fpool, vtpool, tile, spool=spool, maps=maps)
    return len(starts)


def apply_qt_front(tasks: np.ndarray, fpool: np.ndarray, vtpool: np.ndarray,
                   tile: int, B: np.ndarray) -> None:
    """Apply Qᵀ of one front's factorization to ``B`` (fm × k) in place.

    Replays the reflectors of the front's Factorize and Apply+Factorize
    records in order (records of one launch act on disjoint rows).
    """
    with one_blas_thread():
        apply_qt_records(tasks, fpool, vtpool, tile, B)


def apply_qt_records(tasks, fpool, vtpool, tile, B) -> None:
    """``B ← Qᵀ B`` for the reflectors of ``tasks``, in order (rows past the front skipped).

    ``tasks``: a front's Factorize / Apply+Factorize records (``F`` relative to
    ``fpool``); ``B``: the front's rows (fm × k), float64, changed in place.
    """
    for idx, ok, V, T in _reflectors(tasks, fpool, vtpool, tile):
        X = np.zeros((len(idx), B.shape[1]))
        X[ok] = B[idx[ok]]
        X -= V @ (T.T @ (V.T @ X))
        B[idx[ok]] = X[ok]


def _task_tiles(rec, tile):
    """(reads, writes) as sets of (F, row, col) tile keys and ('vt', off)."""
    typ = int(rec["type"])
    F = int(rec["F"])
    rows = [int(r) for r in rec["rows"]]
    reads, writes = set(), set()
    if typ in (TaskType.APPLY, TaskType.APPLY_FACTORIZE):
        na = int(rec["napply"])
        col = int(rec["col"])
        reads.add(("vt", int(rec["vt"])))
        for r in rows[1:na]:
            reads.add((F, r, col))
        for r in rows[:na]:
            for c in range(int(rec["c0"]), int(rec["c1"]), tile):
                writes.add((F, r, c))
    if typ in (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE):
        fs, nf = int(rec["fstart"]), int(rec["nfrows"])
        col = int(rec["col"]) if typ == TaskType.FACTORIZE else int(rec["c0"])
        for r in rows[fs: fs + nf]:
            writes.add((F, r, col))
        writes.add(("vt", int(rec["vt"] if typ == TaskType.FACTORIZE else rec["vt2"])))
    return reads, writes


def launch_conflicts(tasks: np.ndarray, launch: np.ndarray, tile: int) -> list:
    """Pairs of records of one launch where one writes what the other touches.

    Tile granularity (front, first row, first column) plus VT tiles; used by
    the tests to prove launches have no inner dependencies.
    """
    bad = []
    for L in np.unique(launch):
        idx = np.flatnonzero(launch == L)
        owner: dict = {}
        rd: dict = {}
        for k in idx:
            r, w = _task_tiles(tasks[k], tile)
            for key in w:
                if key in owner and owner[key] != k:
                    bad.append((int(L), int(owner[key]), int(k), key))
                owner[key] = k
            for key in r:
                rd.setdefault(key, set()).add(k)
        for key, ks in rd.items():
            if key in owner and any(k != owner[key] for k in ks):
                bad.append((int(L), int(owner[key]), sorted(ks), key))
    return bad


# ---------------------------------------------------------------- whole factorization

@dataclass
class SimulateQR(TaskListQR):
    """Result of :func:`simulate_factorize`.

    A :class:`~scipy_gpuqr._engine.tasklist_qr.TaskListQR` whose every front
    keeps its factorized block on the host, so ``Q`` is applied
    by replaying the reflectors front by front (rows tracked by slots as in
    the reference: row i of A lives in slot i; ``qorder`` puts R's rows first
    in ``Qᵀb``). A dense front (no records, see
    :mod:`~scipy_gpuqr._schedule.dense`) applies its
    :class:`~scipy_gpuqr._engine.dense_front.DenseFront` in its postorder
    position.
    """

    def _check(self, B, what):
        B = np.asarray(B)
        if B.ndim not in (1, 2) or B.shape[0] != self.shape[0]:
            raise ValueError(f"{what}: expected shape ({self.shape[0]},) or "
                             f"({self.shape[0]}, k), got {B.shape}")
        if np.issubdtype(B.dtype, np.complexfloating):
            raise TypeError(f"{what}: complex right-hand sides are not supported")
        return B, np.array(B[:, None] if B.ndim == 1 else B, dtype=np.float64)

    def qt_matmul(self, B):
        B0, X = self._check(B, "qt_matmul")
        tile = self.schedule.tile
        with one_blas_thread():
            for f in range(len(self._fronts)):
                self._apply_front(f, X, tile, transpose=True)
        out = X[self.qorder].astype(self.R.dtype, copy=False)
        return out.reshape(B0.shape)

    def q_matmul(self, Y):
        Y0, Yc = self._check(Y, "q_matmul")
        X = np.zeros_like(Yc)
        X[self.qorder] = Yc
        tile = self.schedule.tile
        with one_blas_thread():
            for f in range(len(self._fronts) - 1, -1, -1):
                self._apply_front(f, X, tile, transpose=False)
        return X.astype(self.R.dtype, copy=False).reshape(Y0.shape)

    def _apply_front(self, f: int, X: np.ndarray, tile: int, *, transpose: bool) -> None:
        """Front f's reflectors (kept records, or its dense-front factor) on X's rows, in place."""
        slots, Ff, ftasks = self._fronts[f]
        if len(ftasks):
            Y = X[slots]
            (apply_qt_records if transpose else apply_q_records)(ftasks, Ff, self._vt, tile, Y)
        elif f in self._dense:
            Y = X[slots]
            (self._dense[f].apply_qt if transpose else self._dense[f].apply_q)(Y)
        else:
            return
        X[slots] = Y



def _reflectors(tasks, fpool, vtpool, tile):
    """(row indices, V, T) of every Factorize part of ``tasks``, in order."""
    for rec in tasks:
        typ = int(rec["type"])
        if typ == TaskType.FACTORIZE:
            col, nref, vt = int(rec["col"]), int(rec["nref"]), int(rec["vt"])
        elif typ == TaskType.APPLY_FACTORIZE:
            col, nref, vt = int(rec["c0"]), int(rec["aux"]), int(rec["vt2"])
        else:
            continue
        rows = [int(r) for r in rec["rows"]]
        fs, nf = int(rec["fstart"]), int(rec["nfrows"])
        top = rows[int(rec["ftop"])]
        stack = [top] + [r for r in rows[fs: fs + nf] if r != top]
        V, T = _load_v(rec, fpool, vtpool, tile, stack, col, nref, vt)
        idx = np.concatenate([np.arange(r, r + tile) for r in stack])
        yield idx, idx < int(rec["fm"]), V, T


def apply_q_records(tasks, fpool, vtpool, tile, B) -> None:
    """``B ← Q B``: the reflectors of ``tasks`` in reverse order (as :func:`apply_qt_records`)."""
    for idx, ok, V, T in reversed(list(_reflectors(tasks, fpool, vtpool, tile))):
        X = np.zeros((len(idx), B.shape[1]))
        X[ok] = B[idx[ok]]
        X -= V @ (T @ (V.T @ X))
        B[idx[ok]] = X[ok]


def front_slots(analysis, f: int, slots_of: list) -> np.ndarray:
    """Global row slot of each row of front ``f`` (its children's slots known)."""
    fs = analysis.fronts
    fm = int(fs.fm[f])
    slots = np.empty(fm, dtype=np.int64)
    a0, a1 = fs.arow_ptr[f], fs.arow_ptr[f + 1]
    slots[fs.arow_local[a0:a1]] = analysis.rowperm[a0:a1]
    for c in fs.children[fs.child_ptr[f]:fs.child_ptr[f + 1]]:
        c = int(c)
        rk, cmc = int(fs.frank[c]), int(fs.cm[c])
        slots[fs.rimap[fs.rimap_ptr[c]:fs.rimap_ptr[c + 1]]] = slots_of[c][rk:rk + cmc]
    return slots


def assemble_r(Ac, analysis, values: list, slots_of: list, dtype):
    """R (rows keyed by pivot column) and ``qorder`` from each front's factorized values.

    ``values[f]``: front f row-major (``fm × fn``); the singleton rows of A
    (the analysis' R1 block) are rows of R as they stand.
    """
    fs = analysis.fronts
    m, n = Ac.shape
    rowperm = analysis.rowperm
    r1 = int(getattr(analysis, "n1rows", 0))
    rows_l, cols_l, vals_l, piv_l, slot_l = [], [], [], [], []
    if r1:
        rows_l.append(np.repeat(analysis.r1_pivot, np.diff(analysis.r1_ptr)))
        cols_l.append(analysis.r1_cols)
        vals_l.append(Ac.data[analysis.r1_nz].astype(np.float64))
        piv_l.append(analysis.r1_pivot)
        slot_l.append(rowperm[:r1])
    for f in range(fs.nfronts):
        fm, fn, rk = int(fs.fm[f]), int(fs.fn[f]), int(fs.frank[f])
        if rk == 0:
            continue
        cols = fs.cols[fs.col_ptr[f]:fs.col_ptr[f + 1]]
        Rf = values[f].reshape(fm, fn)[:rk]
        rr, cc = np.nonzero(np.arange(fn)[None, :] >= np.arange(rk)[:, None])
        rows_l.append(cols[rr])
        cols_l.append(cols[cc])
        vals_l.append(Rf[rr, cc])
        piv_l.append(cols[:rk])
        slot_l.append(slots_of[f][:rk])
    piv = np.concatenate(piv_l) if piv_l else np.zeros(0, np.int64)
    live = np.argsort(piv)
    rowof = np.full(n, -1, dtype=np.int64)
    rowof[piv[live]] = np.arange(len(piv))
    slots_r = (np.concatenate(slot_l) if slot_l else np.zeros(0, np.int64))[live]
    rest = np.ones(m, dtype=bool)
    rest[slots_r] = False
    qorder = np.concatenate([slots_r, np.flatnonzero(rest)]).astype(np.int64)
    if rows_l:
        Rr, Rc, Rv = rowof[np.concatenate(rows_l)], np.concatenate(cols_l), np.concatenate(vals_l)
    else:
        Rr = Rc = np.zeros(0, np.int64)
        Rv = np.zeros(0)
    R = sp.csc_array(sp.coo_array((Rv.astype(dtype), (Rr, Rc)), shape=(min(m, n), n)))
    R.sort_indices()
    return R, qorder


def simulate_factorize(A, analysis=None, *, tol=None, pipelining: bool = True,
                       max_gpu_memory: int | None = None, tile: int = DEFAULT_TILE,
                       bundle: int = DEFAULT_BUNDLE, max_tasks: int | None = None,
                       rng: np.random.Generator | None = None,
                       dense_flops: float | None = DEFAULT_DENSE_FLOPS,
                       dense_panel: int = DEFAULT_PANEL):
    """Sparse QR ``A[:, colperm] = Q @ R`` by running the GPU task lists in NumPy.

    The sparse scheduler (:func:`scipy_gpuqr._schedule.sparse.build_schedule`)
    builds every stage's launches; this executor runs them over the same
    pools the GPU uses (front pool zeroed per stage, VT pool, S entries,
    Rimap/Rjmap), carrying contribution blocks across stages through host
    arrays.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` (computed when None).
    tol : None, 'default' or float
        The task lists have no rank detection: called directly with a
        tolerance, the reference backend answers, and ``info`` says so. The
        ``backend='simulate'`` entry points instead apply SuiteSparseQR's
        rule to R afterwards (:mod:`scipy_gpuqr._factor.rank_refine`), as the GPU
        backend does on the device.
    pipelining : bool
        Apply+Factorize tasks and bundle growth.
    max_gpu_memory : int, optional
        GPU byte budget of the staging plan (forces many stages when small).
    tile, bundle : int
        Bucket-scheduler tunables.
    max_tasks : int, optional
        Launch-size limit.
    rng : numpy.random.Generator, optional
        Run each launch's tasks in a random order (tests).
    dense_flops : float or None
        Threshold of the dense fronts (:mod:`~scipy_gpuqr._schedule.dense`),
        factorized here by the same blocked staircase QR as on the GPU, with
        LAPACK (:func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`);
        None: none.
    dense_panel : int
        Panel width of the dense fronts.

    Returns
    -------
    SimulateQR
        ``info["launches"]`` counts every launch of the schedule, the empty
        ones a dense front defers its parent's pack by included;
        ``info["launches_with_tasks"]`` those with at least one record.
    """
    t0 = time.perf_counter()
    Ac, analysis, out = task_list_input(A, analysis, tol, max_gpu_memory, "simulate",
                                        "simulate_factorize")
    if out is not None:
        return out
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    m, n = Ac.shape
    sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                           max_gpu_memory=max_gpu_memory, max_tasks=max_tasks,
                           dense_flops=dense_flops)
    t1 = time.perf_counter()
    fs = analysis.fronts
    nf = fs.nfronts
    vals = Ac.data.astype(np.float64)[fs.s_nz]
    maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
    vtpool = np.full(max(sched.vt_size, 1), np.nan)
    host_cb = {}                 # CBs crossing stages: front -> packed cm × cn array
    fronts = [None] * nf
    ftasks_of = [[] for _ in range(nf)]
    slots_of = [None] * nf
    nlaunch = 0
    dense = {}                   # front -> (panels, T)
    with one_blas_thread():
        for st in sched.stages:
            first, last = st.fronts
            pool = np.zeros(st.pool_size)
            for c, off in st.carried.items():
                cbk = host_cb.pop(c)
                pool[off: off + cbk.size] = cbk.ravel()
            s0, s1 = st.s_range
            spool = (fs.s_index[s0:s1], vals[s0:s1])
            dense_at = {}
            for f, Ld in st.dense.items():
                dense_at.setdefault(Ld, []).append(f)
            for L in range(st.nlaunch):
                a, b = st.launch_ptr[L], st.launch_ptr[L + 1]
                order = np.arange(a, b) if rng is None else a + rng.permutation(b - a)
                for k in order:
                    execute_task(st.tasks[k], pool, vtpool, tile, spool=spool, maps=maps)
                for f in dense_at.get(L, ()):       # assembled by launch L
                    fm, fn, off = int(fs.fm[f]), int(fs.fn[f]), int(st.foff[f])
                    panels = panels_of(fm, fn, fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]],
                                       dense_panel)
                    T = factorize_numpy(pool[off: off + fm * fn].reshape(fm, fn), panels,
                                        dense_panel)
                    dense[f] = (panels, T, nlaunch + L)
            nlaunch += st.nlaunch
            t = st.tasks
            fac = np.isin(t["type"], (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE))
            for k in np.flatnonzero(fac):
                ftasks_of[int(t["front"][k])].append(k)
            for f in range(first, last + 1):
                fm, fn = int(fs.fm[f]), int(fs.fn[f])
                off = int(st.foff[f])
                Ff = pool[off: off + fm * fn].copy()
                ft = t[np.asarray(ftasks_of[f], dtype=np.int64)].copy()
                ft["F"] = 0
                ftasks_of[f] = None
                fronts[f] = (Ff, ft)
                slots_of[f] = front_slots(analysis, f, slots_of)
                p = int(fs.parent[f])
                if p >= 0 and p > last:
                    rk, cmc, fp = int(fs.frank[f]), int(fs.cm[f]), int(fs.fp[f])
                    # as is: Pack-Assemble copies only its upper trapezoid
                    host_cb[f] = Ff.reshape(fm, fn)[rk:rk + cmc, fp:]
    t2 = time.perf_counter()

    # ---- R (rows keyed by pivot column, as the reference) -----------------------
    R, qorder = assemble_r(Ac, analysis, [fronts[f][0] for f in range(nf)], slots_of, dtype)
    t3 = time.perf_counter()
    info = {"backend": "simulate", "ordering": analysis.ordering_used,
            "nfronts": int(nf), "stages": len(sched.stages), "launches": int(nlaunch),
            "launches_with_tasks": int(sched.nlaunch_with_tasks),
            "tasks": int(sched.ntasks), "tile": int(tile), "bundle": int(bundle),
            "pipelining": bool(pipelining), "schedule_cpu_seconds": float(sched.seconds),
            "dense_fronts": len(dense), "dense_flops": sched.dense_flops,
            "seconds": {"schedule": t1 - t0, "execute": t2 - t1, "assemble_R": t3 - t2}}
    return SimulateQR(shape=(m, n), R=R, colperm=analysis.colperm.astype(np.int64),
                      rank=int(min(m, n)), tol=None, flops=float(analysis.flops), info=info,
                      analysis=analysis, qorder=qorder, schedule=sched,
                      _fronts=[(slots_of[f], fronts[f][0], fronts[f][1]) for f in range(nf)],
                      _vt=vtpool,
                      _dense={f: DenseFront(fronts[f][0].reshape(int(fs.fm[f]), int(fs.fn[f])),
                                            p, T, slots=slots_of[f], after_launch=Ld)
                              for f, (p, T, Ld) in dense.items()})
