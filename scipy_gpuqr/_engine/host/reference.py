"""Reference multifrontal Householder QR on the CPU (NumPy + LAPACK): ``backend='reference'``.

The singleton rows of A (analysis ``R1``, see
:mod:`scipy_gpuqr._symbolic.singletons`) are rows of R as they stand; Q is the
identity on them. The rest runs as fronts in postorder, stage by stage
(:meth:`SymbolicAnalysis.stage_plan`; contribution blocks of fronts whose
parent is in a later stage are packed and set aside, as they would cross
through host memory). Each front is assembled by concatenation (rows of A
through the S-assembly map, children's contribution blocks through
Rimap/Rjmap), rows sorted by leftmost column, then factorized by a blocked
Householder QR that honours the staircase: a panel of ``NB`` columns is
factorized by LAPACK ``geqrt`` (which returns the compact-WY ``T``) on the
rows that reach it (``stair`` of its last column) only, and applied to the
columns right of it on those rows with two matrix products (``C -= V Tᵀ Vᵀ
C``). Dense ``geqrf`` on the whole front would do up to 4× the flops on the
fronts of a 3-D grid. Every front keeps its panels ``(first row, V, T)`` and
the global slot of each of its rows, so ``Qᵀ`` and ``Q`` are applied panel by
panel with the same products.

Rows of the vector Q is applied to are tracked by *slots*: row i of A lives in
slot i; a front's rows keep their slots while its reflectors act on them, and
a contribution-block row keeps its slot in the parent. After all fronts, the
slots that hold rows of R, in R's row order, come first in ``Qᵀb``.

Rank detection (``tol`` given) follows SuiteSparseQR's heuristic: a column
singleton is accepted only if its entry exceeds tol (the analysis is redone
with that value-aware search when a structural singleton fails it); a pivot
column whose remaining 2-norm (below the rows already used) is ``<= tol`` is
dropped: its remaining entries are zeroed, it gets no row of R, and it moves
to the end of ``colperm``; dead singleton columns too. Non-pivot columns are
never tested (they are tested in the parent). The test runs on the panels: a
panel is factorized on a copy, the reflectors before its first small pivot
are kept and applied to the rest, and the next panel starts after the
dropped column.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.linalg import lapack

from ..._cpu.blas_threads import Lowered, blas_limited
from ..._numeric import NumericQR
from ..._symbolic import SymbolicAnalysis, analyze
from ..inputs import engine_csc

__all__ = ["reference_factorize", "ReferenceQR", "default_tol", "resolve_tol", "NB",
           "answer_with_rank_detection"]

#: columns per panel of the blocked front factorization
NB = 32

#: fronts with more flops than this run with all BLAS threads, the others with
#: one. Default: never (one thread throughout). The panel products are small
#: (NB columns), and BLAS threads contending for busy cores make them many times
#: slower than one thread does. Set it on a machine with idle cores.
THREADED_FRONT_FLOPS = float("inf")


def default_tol(A: sp.csc_array, eps: float = np.finfo(np.float64).eps) -> float:
    """SuiteSparseQR's default tolerance 20·(m+n)·eps·(max column 2-norm)."""
    m, n = A.shape
    if A.nnz == 0:
        return 0.0
    colnorm = np.sqrt(np.asarray(abs(A).power(2).sum(axis=0)).ravel())
    return 20.0 * (m + n) * eps * float(colnorm.max())


def _geqrt(P: np.ndarray, w: int):
    """Compact-WY QR of a Fortran panel: (qr, T) with w reflectors."""
    fn = lapack.dgeqrt if P.dtype == np.float64 else lapack.sgeqrt
    qr, T, info = fn(w, P, overwrite_a=1)
    if info != 0:
        raise RuntimeError(f"geqrt failed with info={info} on a {P.shape} panel")
    return qr, T


def _unit_lower(qr: np.ndarray, w: int) -> np.ndarray:
    """The Householder vectors (unit diagonal) stored below the diagonal of qr[:, :w]."""
    V = np.tril(qr[:, :w], -1)
    V[np.arange(w), np.arange(w)] = 1.0
    return np.asfortranarray(V)


def _apply_qt(V, T, C):
    """C <- (I - V T Vᵀ)ᵀ C in place (C a view)."""
    if C.shape[1]:
        C -= V @ (T.T @ (V.T @ C))


@dataclass
class _Front:
    """Numeric result of one front."""

    slots: np.ndarray      # global slot of each front row (rows in factorization order)
    panels: list           # (row0, V (h×w, unit lower), T (w×w)) in order
    r_cols: np.ndarray     # local pivot column of each R row (rank_f,)
    R: np.ndarray          # (rank_f, fn) rows of R (entries left of each pivot zeroed)
    cb: np.ndarray         # (cm, fn - fp) contribution block (upper trapezoidal)
    dead: np.ndarray       # local pivot columns dropped by rank detection


def _rank_panel(F, g, t, k, kb, tol, r_cols, dead):
    """Rank-detecting factorization of the panel ``F[g:t, k:k+kb]`` in place.

    Columns are taken in order; a column whose norm below the rows already
    used is <= tol is dead (zeroed there, appended to ``dead``). Reflectors
    are kept in groups (one ``geqrt`` call up to the next dead column),
    applied at once to the rest of the panel, and merged into one block
    (V, T) for the columns right of the panel. Returns (rows used, columns
    used, V, T); V is None when no reflector was kept.
    """
    P = np.array(F[g:t, k:k + kb], order="F")
    h = t - g
    gl = c = 0
    groups = []
    while c < kb and gl < h:
        w = min(h - gl, kb - c)
        qr, T = _geqrt(np.array(P[gl:, c:], order="F"), w)
        small = np.flatnonzero(np.abs(np.diagonal(qr)[:w]) <= tol)
        j = int(small[0]) if len(small) else w
        if j == w:
            P[gl:, c:] = qr
            groups.append((gl, _unit_lower(qr, w), T))
        elif j:
            P[gl:, c:c + j] = qr[:, :j]
            Vg, Tg = _unit_lower(qr, j), np.array(T[:j, :j], order="F")
            _apply_qt(Vg, Tg, P[gl:, c + j:])
            groups.append((gl, Vg, Tg))
        r_cols.extend(range(k + c, k + c + j))
        gl += j
        c += j
        if j < w:                      # column k+c is dead
            P[gl:, c] = 0
            dead.append(k + c)
            c += 1
    # rows ran out: the panel's other columns are zero below (staircase), dead
    dead.extend(range(k + c, k + kb))
    F[g:t, k:k + kb] = P
    V = T = None
    for gl_i, Vg, Tg in groups:
        Vp = np.zeros((h, Vg.shape[1]), dtype=F.dtype, order="F")
        Vp[gl_i:] = Vg
        if V is None:
            V, T = Vp, Tg
        else:
            T12 = -T @ (V.T @ Vp) @ Tg
            T = np.block([[T, T12], [np.zeros((Tg.shape[0], T.shape[1]), dtype=F.dtype), Tg]])
            V = np.asfortranarray(np.hstack([V, Vp]))
    return gl, c, V, T


def _factor_front(F: np.ndarray, stair: np.ndarray, npiv: int, tol: float | None) -> _Front:
    """Blocked staircase Householder QR of one assembled front (Fortran, overwritten).

    Rows of F are sorted by leftmost column; ``stair[k]`` is the number of
    rows whose leftmost column is <= k.
    """
    fm, fn = F.shape
    g = k = 0
    panels, r_cols, dead = [], [], []
    while k < fn and g < fm:
        test = tol is not None and k < npiv
        end = npiv if test else fn
        kb = min(NB, end - k)
        t = min(fm, max(int(stair[k + kb - 1]), g + kb))
        h = t - g
        if not test:
            w = min(h, kb)
            qr, T = _geqrt(np.array(F[g:t, k:k + kb], order="F"), w)
            F[g:t, k:k + kb] = qr
            V = _unit_lower(qr, w)
            _apply_qt(V, T, F[g:t, k + kb:])
            panels.append((g, V, T))
            g += w
            k += kb
            continue
        gl, c, V, T = _rank_panel(F, g, t, k, kb, tol, r_cols, dead)
        if V is not None:
            _apply_qt(V, T, F[g:t, k + kb:])
            panels.append((g, V, T))
        g += gl
        k += kb
    if tol is None:
        rank = min(fm, npiv)
        r_cols = np.arange(rank, dtype=np.int64)
        R = np.triu(F[:rank, :])
    else:
        dead.extend(range(k, npiv))        # pivot columns left without rows
        rank = len(r_cols)
        r_cols = np.asarray(r_cols, dtype=np.int64)
        R = F[:rank, :].copy()
        R[np.arange(fn)[None, :] < r_cols[:, None]] = 0
    cm = min(fm - rank, fn - npiv)
    cb = np.triu(F[rank:rank + cm, npiv:])
    return _Front(slots=None, panels=panels, r_cols=r_cols, R=R, cb=cb,
                  dead=np.asarray(dead, dtype=np.int64))


@dataclass
class ReferenceQR(NumericQR):
    """Result of :func:`reference_factorize` (see :class:`~scipy_gpuqr._numeric.NumericQR`).

    Extra attributes: ``analysis`` (the :class:`SymbolicAnalysis` used) and
    ``qorder`` (slot of each row of ``Qᵀ``: R rows first).
    """

    analysis: SymbolicAnalysis | None = None
    qorder: np.ndarray | None = None
    _fronts: list = field(default_factory=list, repr=False)

    def _check(self, B, what):
        B = np.asarray(B)
        if B.ndim not in (1, 2) or B.shape[0] != self.shape[0]:
            raise ValueError(f"{what}: expected shape ({self.shape[0]},) or ({self.shape[0]}, k), "
                             f"got {B.shape}")
        dtype = np.result_type(B.dtype, self.R.dtype, np.float32)
        if np.issubdtype(dtype, np.complexfloating):
            raise TypeError(f"{what}: complex right-hand sides are not supported")
        return B, np.array(B[:, None] if B.ndim == 1 else B, dtype=self.R.dtype, order="C")

    def qt_matmul(self, B):
        B0, X = self._check(B, "qt_matmul")
        with blas_limited(1):
            for fr in self._fronts:
                if fr.panels:
                    Xf = X[fr.slots]
                    for r0, V, T in fr.panels:
                        _apply_qt(V, T, Xf[r0:r0 + V.shape[0]])
                    X[fr.slots] = Xf
        out = X[self.qorder]
        return out.reshape(B0.shape)

    def q_matmul(self, Y):
        Y0, Yc = self._check(Y, "q_matmul")
        X = np.zeros_like(Yc)
        X[self.qorder] = Yc
        with blas_limited(1):
            for fr in reversed(self._fronts):
                if fr.panels:
                    Xf = X[fr.slots]
                    for r0, V, T in reversed(fr.panels):
                        C = Xf[r0:r0 + V.shape[0]]
                        C -= V @ (T @ (V.T @ C))
                    X[fr.slots] = Xf
        return X.reshape(Y0.shape)

    def free(self) -> None:
        self._fronts = []


def answer_with_rank_detection(Ac, analysis, tol, max_gpu_memory, backend: str):
    """The reference engine's factorization for an engine whose task lists have no
    rank detection, called with a tolerance (``tol`` None or negative: None).

    ``info`` names the requested backend and why the reference answered.
    """
    if tol is None or (not isinstance(tol, str) and float(tol) < 0):
        return None
    why = f"the {backend} task lists have no rank detection: reference backend used"
    logging.getLogger("scipy_gpuqr").info(why)
    out = reference_factorize(Ac, analysis, tol=tol, max_gpu_memory=max_gpu_memory)
    out.info["requested_backend"] = backend
    out.info["fallback"] = why
    return out


def task_list_input(A, analysis, tol, max_gpu_memory, backend: str, caller: str):
    """What every task-list engine does first.

    A as the engines' canonical CSC (:func:`~scipy_gpuqr._engine.inputs.engine_csc`);
    the reference engine's answer where a tolerance asks for rank detection
    (:func:`answer_with_rank_detection`); else the analysis, made here or
    checked against A's pattern.

    Returns
    -------
    Ac : scipy.sparse.csc_array
    analysis : SymbolicAnalysis or None
        None only where ``answer`` is given (and none was passed).
    answer : NumericQR or None
        The reference engine's factorization, when it answered.
    """
    Ac = engine_csc(A, caller)
    out = answer_with_rank_detection(Ac, analysis, tol, max_gpu_memory, backend)
    if out is not None:
        return Ac, analysis, out
    if analysis is None:
        analysis = analyze(Ac)
    elif not analysis.matches_pattern(Ac):
        raise ValueError(f"{caller}: the analysis was made for another pattern")
    return Ac, analysis, None


def resolve_tol(tol, Ac, dtype):
    """Absolute dead-column tolerance for ``tol`` (None, 'default', a number; < 0: off)."""
    if isinstance(tol, str):
        if tol != "default":
            raise ValueError(f"tol must be None, 'default' or a number, got {tol!r}")
        return default_tol(Ac, np.finfo(dtype).eps)
    if tol is None:
        return None
    out = float(tol)
    if not np.isfinite(out):
        raise ValueError(f"tol must be finite, got {tol!r}")
    return None if out < 0 else out


def _singletons_pass(analysis: SymbolicAnalysis, data: np.ndarray, tol: float) -> bool:
    """Whether every singleton pivot of ``analysis`` exceeds ``tol`` (and so the
    value-aware singleton search would find the same block)."""
    if analysis.n1rows == 0:
        return True
    piv = data[analysis.r1_nz[analysis.r1_ptr[:-1]]]
    return bool(np.all(np.abs(piv) > tol))


def reference_factorize(A, analysis: SymbolicAnalysis | None = None, *, tol=None,
                        ordering: str = "colamd", colperm=None,
                        max_gpu_memory: int | None = None) -> ReferenceQR:
    """Multifrontal Householder QR ``A[:, colperm] = Q @ R`` with NumPy/LAPACK.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
        Real (float64, float32; integers and bools are factorized in float64).
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` on A's pattern (reused by
        ``refactor``); computed with ``ordering``/``colperm`` when None. With
        rank detection, an analysis whose (structural) column singletons
        include an entry ``<= tol`` is redone with ``colperm=analysis.colperm``
        and the value-aware singleton search (``info['reanalyzed']``).
    tol : None, 'default' or float
        None: no rank detection (R has ``min(m, n)`` rows, ``R[:n, :n]`` upper
        triangular). 'default': SuiteSparseQR's rule 20·(m+n)·eps·max column
        2-norm; a float >= 0: that tolerance; negative: off.
    ordering, colperm : see :func:`~scipy_gpuqr._symbolic.analyze`
    max_gpu_memory : int, optional
        Run stage by stage as the GPU would under this budget (same result).

    Returns
    -------
    ReferenceQR
    """
    t0 = time.perf_counter()
    Ac = engine_csc(A, "reference_factorize")
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    Ac = Ac.astype(dtype)
    m, n = Ac.shape
    tol_used = resolve_tol(tol, Ac, dtype)
    itemsize = np.dtype(dtype).itemsize
    reanalyzed = False
    if analysis is None:
        analysis = analyze(Ac, ordering=ordering, colperm=colperm, itemsize=itemsize,
                           singleton_tol=tol_used)
    elif not analysis.matches_pattern(Ac):
        raise ValueError("reference_factorize: the analysis was made for another pattern")
    elif tol_used is not None and not _singletons_pass(analysis, Ac.data, tol_used):
        analysis = analyze(Ac, colperm=analysis.colperm, itemsize=itemsize,
                           amalgamation=analysis.amalgamation, singleton_tol=tol_used)
        reanalyzed = True
    t1 = time.perf_counter()

    fs = analysis.fronts
    rowperm = analysis.rowperm
    nf = fs.nfronts
    # S entries as Fortran linear indices col*fm + row of their front
    s_owner = np.repeat(np.arange(nf, dtype=np.int64), np.diff(fs.s_ptr))
    fn_e, fm_e = fs.fn[s_owner], fs.fm[s_owner]
    srow, scol = np.divmod(fs.s_index, np.maximum(fn_e, 1))
    s_fidx = scol * fm_e + srow
    vals = Ac.data[fs.s_nz]
    plan = analysis.stage_plan(max_gpu_memory)
    fronts: list = [None] * nf
    stage_of = np.zeros(nf, dtype=np.int64)
    for sid, (a, b) in enumerate(plan.stages):
        stage_of[a:b + 1] = sid
    parked = {}                                   # CBs crossing a stage boundary
    cbs = {}                                      # CBs inside a stage
    fm_l, fn_l, fp_l = fs.fm.tolist(), fs.fn.tolist(), fs.fp.tolist()
    sptr, aptr = fs.s_ptr.tolist(), fs.arow_ptr.tolist()
    chp, ch = fs.child_ptr.tolist(), fs.children.tolist()
    cptr, par = fs.col_ptr.tolist(), fs.parent.tolist()
    big = (analysis.front_flops > THREADED_FRONT_FLOPS).tolist()
    with blas_limited(1) as lowered:
        for sid, (first, last) in enumerate(plan.stages):
            for f in range(first, last + 1):
                fm, fn, fp = fm_l[f], fn_l[f], fp_l[f]
                kids = ch[chp[f]:chp[f + 1]]
                s0, s1 = sptr[f], sptr[f + 1]
                a0, a1 = aptr[f], aptr[f + 1]
                got = [(parked.pop(c) if stage_of[c] < sid else cbs.pop(c)) for c in kids]
                if tol_used is None:
                    # static layout: S map, Rimap/Rjmap, fm rows sorted by leftmost column
                    F = np.zeros((fm, fn), dtype=dtype, order="F")
                    F.T.reshape(-1)[s_fidx[s0:s1]] = vals[s0:s1]
                    slots = np.empty(fm, dtype=np.int64)
                    slots[fs.arow_local[a0:a1]] = rowperm[a0:a1]
                    for c, (cb, cslots) in zip(kids, got):
                        ri = fs.rimap[fs.rimap_ptr[c]:fs.rimap_ptr[c + 1]]
                        rj = fs.rjmap[fs.rjmap_ptr[c]:fs.rjmap_ptr[c + 1]]
                        if cb.shape[0] != len(ri):
                            raise AssertionError(f"front {c}: CB has {cb.shape[0]} rows, "
                                                 f"Rimap {len(ri)}")
                        F[np.ix_(ri, rj)] = cb
                        slots[ri] = cslots
                    stair = fs.stair[cptr[f]:cptr[f + 1]]
                else:
                    # dynamic layout: children's CBs have the rows rank detection left
                    na = a1 - a0
                    ncb = [g[0].shape[0] for g in got]
                    mtot = na + sum(ncb)
                    lead = np.empty(mtot, dtype=np.int64)
                    lead[:na] = analysis.leftmost[a0:a1] - fs.pivot_ptr[f]
                    F = np.zeros((mtot, fn), dtype=dtype, order="F")
                    srow_loc = np.searchsorted(np.sort(fs.arow_local[a0:a1]),
                                               fs.s_index[s0:s1] // fn)
                    order = np.argsort(fs.arow_local[a0:a1], kind="stable")
                    F[srow_loc, fs.s_index[s0:s1] % fn] = vals[s0:s1]
                    parts_slots = [rowperm[a0:a1][order]]
                    lead[:na] = lead[:na][order]
                    r = na
                    for c, (cb, cslots) in zip(kids, got):
                        rj = fs.rjmap[fs.rjmap_ptr[c]:fs.rjmap_ptr[c + 1]]
                        F[r:r + cb.shape[0], rj] = cb
                        lead[r:r + cb.shape[0]] = rj[:cb.shape[0]]
                        parts_slots.append(cslots)
                        r += cb.shape[0]
                    slots = np.concatenate(parts_slots) if parts_slots else np.zeros(0, np.int64)
                    perm = np.argsort(lead, kind="stable")
                    F = np.asfortranarray(F[perm])
                    slots = slots[perm]
                    stair = np.cumsum(np.bincount(lead, minlength=fn)[:fn])
                with (lowered.lifted() if big[f] and isinstance(lowered, Lowered)
                      else contextlib.nullcontext()):
                    fr = _factor_front(F, stair, fp, tol_used)
                fr.slots = slots
                rank_f = fr.R.shape[0]
                cm = fr.cb.shape[0]
                cb_pack = (fr.cb, slots[rank_f:rank_f + cm])
                p = par[f]
                if p >= 0:
                    if stage_of[p] > sid:
                        parked[f] = (fr.cb.copy(), cb_pack[1].copy())
                    else:
                        cbs[f] = cb_pack
                fr.cb = None
                fronts[f] = fr
    t2 = time.perf_counter()

    # ---- assemble R: rows keyed by pivot column, R1 (singleton rows) first --------
    n1, r1 = analysis.n1cols, analysis.n1rows
    r1_rows = np.repeat(analysis.r1_pivot, np.diff(analysis.r1_ptr))
    rows_l, cols_l, vals_l = [r1_rows], [analysis.r1_cols], [Ac.data[analysis.r1_nz]]
    piv_l, slot_l, dead_l = [analysis.r1_pivot], [rowperm[:r1]], []
    if n1 > r1:
        live1 = np.zeros(n1, dtype=bool)
        live1[analysis.r1_pivot] = True
        dead_l.append(np.flatnonzero(~live1))
    for f, fr in enumerate(fronts):
        cols = fs.cols[cptr[f]:cptr[f + 1]]
        rk = fr.R.shape[0]
        if rk:
            piv = cols[fr.r_cols]
            mask = np.arange(fr.R.shape[1])[None, :] >= fr.r_cols[:, None]
            rr, cc = np.nonzero(mask)
            rows_l.append(piv[rr])
            cols_l.append(cols[cc])
            vals_l.append(fr.R[mask])
            piv_l.append(piv)
            slot_l.append(fr.slots[:rk])
        if len(fr.dead):
            dead_l.append(cols[fr.dead])
    piv = np.concatenate(piv_l)
    live_order = np.argsort(piv, kind="stable")
    rank_live = len(piv)
    rowof = np.full(n, -1, dtype=np.int64)
    rowof[piv[live_order]] = np.arange(rank_live)
    slots_r = np.concatenate(slot_l)[live_order]
    rest = np.ones(m, dtype=bool)
    rest[slots_r] = False
    qorder = np.concatenate([slots_r, np.flatnonzero(rest)]).astype(np.int64)
    dead = np.sort(np.concatenate(dead_l)) if dead_l else np.zeros(0, np.int64)
    # column order: with rank detection the dead columns go last
    if tol_used is not None and len(dead):
        is_dead = np.zeros(n, dtype=bool)
        is_dead[dead] = True
        newcol = np.concatenate([np.flatnonzero(~is_dead), dead])
    else:
        newcol = np.arange(n, dtype=np.int64)
    where = np.empty(n, dtype=np.int64)
    where[newcol] = np.arange(n)
    k = min(m, n)
    Rr = rowof[np.concatenate(rows_l)]
    Rc = where[np.concatenate(cols_l)]
    Rv = np.concatenate(vals_l).astype(dtype, copy=False)
    R = sp.csc_array(sp.coo_array((Rv, (Rr, Rc)), shape=(k, n)))
    R.sort_indices()
    rank = rank_live if tol_used is not None else k
    t3 = time.perf_counter()
    info = {"backend": "reference", "ordering": analysis.ordering_used,
            "nfronts": int(nf), "stages": int(plan.nstages),
            "n1cols": int(n1), "n1rows": int(r1), "reanalyzed": reanalyzed,
            "dead_columns": int(len(dead)),
            "seconds": {"setup": t1 - t0, "factorize": t2 - t1, "assemble_R": t3 - t2}}
    return ReferenceQR(shape=(m, n), R=R, colperm=analysis.colperm[newcol].astype(np.int64),
                       rank=int(rank), tol=tol_used, flops=float(analysis.flops), info=info,
                       analysis=analysis, qorder=qorder, _fronts=fronts)
