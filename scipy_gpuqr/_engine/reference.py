"""Reference multifrontal Householder QR on the CPU (NumPy + LAPACK): ``backend='reference'``.

Fronts run in postorder, stage by stage (:meth:`SymbolicAnalysis.stage_plan`;
contribution blocks of fronts whose parent is in a later stage are packed and
set aside, as they would cross through host memory). Each front is assembled
by concatenation (rows of A through the S-assembly map, children's
contribution blocks through Rimap/Rjmap), then factorized densely by LAPACK
``geqrf`` (with its workspace query). Every front keeps its Householder
vectors and scalars, so ``Q`` (m×m, row permutation included) is applied by
``ormqr`` front by front.

Rows of the vector Q is applied to are tracked by *slots*: row i of A lives in
slot i; a front's rows keep their slots while its reflectors act on them, and
a contribution-block row keeps its slot in the parent. After all fronts, the
slots that hold rows of R, in R's row order, come first in ``Qᵀb``.

Rank detection (``tol`` given) follows SuiteSparseQR's heuristic: a pivot
column whose remaining 2-norm (below the rows already used) is ``<= tol`` is
dropped: its remaining entries are zeroed, it gets no row of R, and it moves
to the end of ``colperm``; non-pivot columns are never tested (they are
tested in the parent). The test runs on LAPACK panels of ``PANEL`` columns:
a panel is factorized, the reflectors before its first small pivot are kept
and applied to the rest, and the panel restarts after the dropped column.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.linalg import lapack

from .._numeric import NumericQR
from .._symbolic import SymbolicAnalysis, analyze, canonical_csc

__all__ = ["reference_factorize", "ReferenceQR", "default_tol", "PANEL"]

#: columns per LAPACK panel in the rank-detecting front factorization
PANEL = 32


def default_tol(A: sp.csc_array, eps: float = np.finfo(np.float64).eps) -> float:
    """SuiteSparseQR's default tolerance 20·(m+n)·eps·(max column 2-norm)."""
    m, n = A.shape
    if A.nnz == 0:
        return 0.0
    colnorm = np.sqrt(np.asarray(abs(A).power(2).sum(axis=0)).ravel())
    return 20.0 * (m + n) * eps * float(colnorm.max())


def _lapack(dtype):
    prefix = {np.dtype(np.float64): "d", np.dtype(np.float32): "s"}[np.dtype(dtype)]
    return (getattr(lapack, prefix + "geqrf"), getattr(lapack, prefix + "geqrf_lwork"),
            getattr(lapack, prefix + "ormqr"))


def _geqrf(F: np.ndarray):
    """In-place-ish QR of a Fortran array: returns (qr, tau)."""
    geqrf, geqrf_lwork, _ = _lapack(F.dtype)
    mm, nn = F.shape
    if mm == 0 or nn == 0:
        return F, np.zeros(0, dtype=F.dtype)
    work, info = geqrf_lwork(mm, nn)
    lwork = max(1, int(work))
    qr, tau, _, info = geqrf(F, lwork=lwork, overwrite_a=1)
    if info != 0:
        raise RuntimeError(f"geqrf failed with info={info} on a {mm}x{nn} front")
    return qr, tau


def _ormqr(V: np.ndarray, tau: np.ndarray, C: np.ndarray, trans: str) -> np.ndarray:
    """Apply the reflectors (V, tau) from the left: trans 'T' gives Qᵀ C, 'N' gives Q C."""
    if len(tau) == 0 or C.shape[0] == 0 or C.shape[1] == 0:
        return C
    _, _, ormqr = _lapack(V.dtype)
    C = np.asfortranarray(C)
    _, work, info = ormqr("L", trans, V, tau, C, -1)
    lwork = max(1, int(work[0].real))
    out, _, info = ormqr("L", trans, V, tau, C, lwork, overwrite_c=1)
    if info != 0:
        raise RuntimeError(f"ormqr failed with info={info}")
    return out


@dataclass
class _Front:
    """Numeric result of one front."""

    slots: np.ndarray      # global slot of each front row
    V: np.ndarray          # (fm, nh) Fortran, reflector r stored below row r of column r
    tau: np.ndarray        # (nh,)
    r_cols: np.ndarray     # local pivot column of each R row (rank_f,)
    R: np.ndarray          # (rank_f, fn) rows of R (dead-column entries below the pivot row zeroed)
    cb: np.ndarray         # (cm, fn - fp) contribution block (upper trapezoidal)
    dead: np.ndarray       # local pivot columns dropped by rank detection


def _factor_front(F: np.ndarray, npiv: int, tol: float | None) -> _Front:
    """Factorize one assembled front (Fortran array, overwritten)."""
    fm, fn = F.shape
    dtype = F.dtype
    if tol is None:
        qr, tau = _geqrf(F)
        nh = len(tau)
        rank = min(fm, npiv)
        cm = min(fm - rank, fn - npiv)
        R = np.triu(qr[:rank, :])
        cb = np.triu(qr[rank:rank + cm, npiv:])
        return _Front(slots=None, V=np.asfortranarray(qr[:, :nh]), tau=tau,
                      r_cols=np.arange(rank, dtype=np.int64), R=R, cb=cb,
                      dead=np.zeros(0, dtype=np.int64))
    # rank-detecting path: panels over the pivot columns
    g = 0
    k = 0
    vcols, taus, dead = [], [], []       # column holding reflector r, its tau
    while k < npiv and g < fm:
        kb = min(PANEL, npiv - k)
        panel, ptau = _geqrf(np.array(F[g:, k:k + kb], order="F"))   # a copy: F's columns
        # past the first small pivot must stay untouched
        nref = len(ptau)
        diag = np.abs(np.diagonal(panel)[:nref])
        small = np.flatnonzero(diag <= tol)
        j = int(small[0]) if len(small) else nref
        if j:
            F[g:, k:k + j] = panel[:, :j]
            rest = F[g:, k + j:]
            if rest.shape[1]:
                F[g:, k + j:] = _ormqr(panel[:, :j], ptau[:j], rest, "T")
            vcols.extend(range(k, k + j))
            taus.extend(ptau[:j].tolist())
        g += j
        k += j
        if j < kb and j < nref:
            # column k is dead: its remaining entries are below tol
            F[g:, k] = 0
            dead.append(k)
            k += 1
        elif j == nref and nref < kb:
            break   # rows ran out inside the panel
    # pivot columns left without rows are dead too
    dead.extend(range(k, npiv))
    rank = g
    # non-pivot columns: plain QR of the remaining rows
    if g < fm and npiv < fn:
        sub, stau = _geqrf(np.asfortranarray(F[g:, npiv:]))
        F[g:, npiv:] = sub
        vcols.extend(range(npiv, npiv + len(stau)))
        taus.extend(stau.tolist())
    nh = len(vcols)
    V = np.zeros((fm, nh), dtype=dtype, order="F")
    for r, c in enumerate(vcols):
        V[r:, r] = F[r:, c]
    R = F[:rank, :].copy()
    r_cols = np.asarray(vcols[:rank], dtype=np.int64)
    # zero what lies left of each row's pivot (reflector storage) in R
    colidx = np.arange(fn)
    R[colidx[None, :] < r_cols[:, None]] = 0
    cm = min(fm - rank, fn - npiv)
    cb = np.triu(F[rank:rank + cm, npiv:])
    return _Front(slots=None, V=V, tau=np.asarray(taus, dtype=dtype), r_cols=r_cols, R=R,
                  cb=cb, dead=np.asarray(dead, dtype=np.int64))


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
        return B, np.array(B[:, None] if B.ndim == 1 else B, dtype=self.R.dtype, order="F")

    def qt_matmul(self, B):
        B0, X = self._check(B, "qt_matmul")
        for fr in self._fronts:
            if len(fr.tau):
                X[fr.slots] = _ormqr(fr.V, fr.tau, X[fr.slots], "T")
        out = X[self.qorder]
        return out.reshape(B0.shape)

    def q_matmul(self, Y):
        Y0, Yc = self._check(Y, "q_matmul")
        X = np.zeros_like(Yc, order="F")
        X[self.qorder] = Yc
        for fr in reversed(self._fronts):
            if len(fr.tau):
                X[fr.slots] = _ormqr(fr.V, fr.tau, X[fr.slots], "N")
        return X.reshape(Y0.shape)

    def free(self) -> None:
        self._fronts = []


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
        ``refactor``); computed with ``ordering``/``colperm`` when None.
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
    if sp.issparse(A) or isinstance(A, np.ndarray):
        pass
    else:
        A = np.asarray(A)
    Ac = canonical_csc(A)
    if np.issubdtype(Ac.dtype, np.complexfloating):
        raise TypeError("reference_factorize: complex matrices are not supported")
    if not (np.issubdtype(Ac.dtype, np.number) or Ac.dtype == np.bool_):
        raise TypeError(f"reference_factorize: non-numeric dtype {Ac.dtype}")
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    Ac = Ac.astype(dtype)
    if not np.all(np.isfinite(Ac.data)):
        raise ValueError("reference_factorize: A contains non-finite values")
    m, n = Ac.shape
    if analysis is None:
        analysis = analyze(Ac, ordering=ordering, colperm=colperm,
                           itemsize=np.dtype(dtype).itemsize)
    elif not analysis.matches_pattern(Ac):
        raise ValueError("reference_factorize: the analysis was made for another pattern")
    if isinstance(tol, str):
        if tol != "default":
            raise ValueError(f"tol must be None, 'default' or a number, got {tol!r}")
        tol_used = default_tol(Ac, np.finfo(dtype).eps)
    elif tol is None:
        tol_used = None
    else:
        tol_used = float(tol)
        if not np.isfinite(tol_used):
            raise ValueError(f"tol must be finite, got {tol!r}")
        if tol_used < 0:
            tol_used = None
    t1 = time.perf_counter()

    fs = analysis.fronts
    vals = Ac.data[fs.s_nz]
    rowperm = analysis.rowperm
    plan = analysis.stage_plan(max_gpu_memory)
    nf = fs.nfronts
    fronts: list = [None] * nf
    stage_of = np.zeros(nf, dtype=np.int64)
    for sid, (a, b) in enumerate(plan.stages):
        stage_of[a:b + 1] = sid
    parked = {}                                   # CBs crossing a stage boundary
    cbs = {}                                      # CBs inside a stage
    flops_done = 0.0
    for sid, (first, last) in enumerate(plan.stages):
        for f in range(first, last + 1):
            fm, fn, fp = int(fs.fm[f]), int(fs.fn[f]), int(fs.fp[f])
            kids = fs.children[fs.child_ptr[f]:fs.child_ptr[f + 1]]
            s0, s1 = fs.s_ptr[f], fs.s_ptr[f + 1]
            a0, a1 = fs.arow_ptr[f], fs.arow_ptr[f + 1]
            srows = rowperm[a0:a1]
            if tol_used is None:
                # static layout: S map, Rimap/Rjmap, fm rows
                F = np.zeros((fm, fn), dtype=dtype, order="C")
                F.ravel()[fs.s_index[s0:s1]] = vals[s0:s1]
                slots = np.empty(fm, dtype=np.int64)
                slots[fs.arow_local[a0:a1]] = srows
                for c in kids:
                    c = int(c)
                    cb, cslots = (parked.pop(c) if stage_of[c] < sid else cbs.pop(c))
                    ri = fs.rimap[fs.rimap_ptr[c]:fs.rimap_ptr[c + 1]]
                    rj = fs.rjmap[fs.rjmap_ptr[c]:fs.rjmap_ptr[c + 1]]
                    if cb.shape[0] != len(ri):
                        raise AssertionError(f"front {c}: CB has {cb.shape[0]} rows, Rimap {len(ri)}")
                    F[np.ix_(ri, rj)] = cb
                    slots[ri] = cslots
                F = np.asfortranarray(F)
            else:
                # dynamic layout: S rows first, then the children's actual CB rows
                na = a1 - a0
                order = np.argsort(fs.arow_local[a0:a1], kind="stable")
                loc = fs.s_index[s0:s1]
                srow_of_entry = np.searchsorted(np.sort(fs.arow_local[a0:a1]), loc // fn)
                parts_slots = [srows[order]]
                got = [(parked.pop(int(c)) if stage_of[c] < sid else cbs.pop(int(c))) for c in kids]
                mtot = na + sum(g[0].shape[0] for g in got)
                F = np.zeros((mtot, fn), dtype=dtype, order="F")
                F[srow_of_entry, loc % fn] = vals[s0:s1]
                r = na
                for c, (cb, cslots) in zip(kids, got):
                    c = int(c)
                    rj = fs.rjmap[fs.rjmap_ptr[c]:fs.rjmap_ptr[c + 1]]
                    F[r:r + cb.shape[0], rj] = cb
                    parts_slots.append(cslots)
                    r += cb.shape[0]
                slots = np.concatenate(parts_slots) if parts_slots else np.zeros(0, np.int64)
            fr = _factor_front(F, fp, tol_used)
            fr.slots = slots
            rank_f = fr.R.shape[0]
            cm = fr.cb.shape[0]
            cb_pack = (fr.cb, slots[rank_f:rank_f + cm])
            p = int(fs.parent[f])
            if p >= 0:
                if stage_of[p] > sid:
                    parked[f] = (fr.cb.copy(), cb_pack[1].copy())
                else:
                    cbs[f] = cb_pack
            fr.cb = None
            fronts[f] = fr
            flops_done += float(analysis.front_flops[f])
    t2 = time.perf_counter()

    # ---- assemble R --------------------------------------------------------
    colperm_a = analysis.colperm
    rows_l, cols_l, vals_l, piv_l, slot_l, dead_l = [], [], [], [], [], []
    for f, fr in enumerate(fronts):
        cols = fs.cols[fs.col_ptr[f]:fs.col_ptr[f + 1]]
        rk = fr.R.shape[0]
        if rk:
            piv = cols[fr.r_cols]
            rr, cc = np.nonzero(np.ones_like(fr.R, dtype=bool) &
                                (np.arange(fr.R.shape[1])[None, :] >= fr.r_cols[:, None]))
            rows_l.append(piv[rr])                   # keyed by pivot column for now
            cols_l.append(cols[cc])
            vals_l.append(fr.R[rr, cc])
            piv_l.append(piv)
            slot_l.append(fr.slots[:rk])
        if len(fr.dead):
            dead_l.append(cols[fr.dead])
    piv = np.concatenate(piv_l) if piv_l else np.zeros(0, np.int64)
    live_order = np.argsort(piv)
    rank_live = len(piv)
    rowof = np.full(n, -1, dtype=np.int64)
    rowof[piv[live_order]] = np.arange(rank_live)
    slots_r = (np.concatenate(slot_l) if slot_l else np.zeros(0, np.int64))[live_order]
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
    if rows_l:
        Rr = rowof[np.concatenate(rows_l)]
        Rc = where[np.concatenate(cols_l)]
        Rv = np.concatenate(vals_l)
    else:
        Rr = Rc = np.zeros(0, np.int64)
        Rv = np.zeros(0, dtype)
    R = sp.csc_array(sp.coo_array((Rv, (Rr, Rc)), shape=(k, n)))
    R.sort_indices()
    rank = rank_live if tol_used is not None else k
    t3 = time.perf_counter()
    info = {"backend": "reference", "ordering": analysis.ordering_used,
            "nfronts": int(nf), "stages": int(plan.nstages),
            "dead_columns": int(len(dead)),
            "seconds": {"setup": t1 - t0, "factorize": t2 - t1, "assemble_R": t3 - t2}}
    return ReferenceQR(shape=(m, n), R=R, colperm=colperm_a[newcol].astype(np.int64),
                       rank=int(rank), tol=tol_used, flops=float(analysis.flops), info=info,
                       analysis=analysis, qorder=qorder, _fronts=fronts)
