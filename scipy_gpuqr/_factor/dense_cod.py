"""Rank-revealing complete orthogonal decomposition of a dense factor, on NumPy or CuPy.

Used by :class:`scipy_gpuqr._factor.lstsq.MinNormSolver` for a rank-deficient R
that is too large for a dense SVD but fits densely in memory (on the GPU
when the factorization ran there, so the GPU is never turned off for rank).

Method (two orthogonal factorizations, both backward stable):

1. **Heath's rule on G, blocked** (:func:`heath_qr`): columns are taken in
   order; a column whose part below the current pivot row has 2-norm
   ``<= tol`` is *dead*: that part is set to zero (a perturbation of at most
   ``tol`` per column) and the pivot row does not advance; a live column gets
   a Householder reflector. This is SuiteSparseQR's rank detection, applied
   to R (its decisions depend only on the distances of the columns to the span
   of the earlier live columns, which a left orthogonal factor does not change).
   Columns are processed in panels of :data:`PANEL`: the panel is factored
   column by column on the host (it has ``dead + PANEL`` rows when G is upper
   triangular), its live reflectors form a compact WY block ``I − V T Vᵀ``
   and update the trailing columns with two matrix products on the array's
   device. Cost ``≈ 2(d + PANEL)·q²`` flops for d dead columns of an upper
   triangular q×q G (``≈ 2 k q²`` for a general k×q G).
2. **Minimum norm** (:meth:`DenseCOD.solve`): the live rows ``S = [R11 R12]``
   (r×q, R11 upper triangular) are factored again, ``Sᵀ = Q₂ R₂``, and
   ``y = Q₂ R₂⁻ᵀ (Zᵀ c)[:r]`` is the minimum-norm solution of ``S y = (Zᵀc)[:r]``.
   This QR is done on first use (:meth:`DenseCOD.sigma_min_estimate` or
   :meth:`DenseCOD.solve`), so a caller that decides the rank elsewhere after
   step 1 (the host's subspace decision, :mod:`scipy_gpuqr._factor.subspace_cod`)
   does not pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

__all__ = ["PANEL", "DenseCOD", "heath_qr", "sigma_max_estimate", "solve_triangular",
           "dense_from_sparse", "apply_blocks"]

#: Columns per panel of the blocked Heath factorization.
PANEL = 64


def _xp_of(a):
    """The array module of ``a`` (CuPy for device arrays, else NumPy)."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy                 # optional dependency
        return cupy
    return np


def _to_host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


@dataclass
class _Block:
    """One panel's live reflectors: rows ``row0 : row0 + V.shape[0]`` ← ``(I − V Tᵀ Vᵀ)``."""

    row0: int
    V: object       # (rows, nlive) on the array's device, unit lower trapezoidal
    T: object       # (nlive, nlive) upper triangular (LAPACK larft, forward, columnwise)


def dense_from_sparse(R, xp):
    """Dense float64 copy of a SciPy sparse matrix on ``xp`` (CuPy: built on the device)."""
    R = sp.csc_array(R)
    if xp is np:
        return R.toarray().astype(np.float64, copy=False)
    k, q = R.shape
    out = xp.zeros((k, q), dtype=xp.float64)
    if R.nnz:
        cols = np.repeat(np.arange(q, dtype=np.int64), np.diff(R.indptr))
        out[xp.asarray(R.indices.astype(np.int64)), xp.asarray(cols)] = xp.asarray(
            R.data.astype(np.float64))
    return out


def apply_blocks(blocks, C, *, transpose: bool = False) -> None:
    """``C ← Z C`` (or ``Zᵀ C``) in place for the block reflectors of :func:`heath_qr`."""
    seq = reversed(blocks) if transpose else blocks
    for b in seq:
        rows = slice(b.row0, b.row0 + b.V.shape[0])
        T = b.T if transpose else b.T.T
        C[rows] -= b.V @ (T @ (b.V.T @ C[rows]))


def _householder(x: np.ndarray) -> tuple[np.ndarray, float, float]:
    """LAPACK ``larfg``: ``(I − τ v vᵀ) x = β e₁``, ``v[0] = 1``."""
    alpha = float(x[0])
    sigma = float(np.linalg.norm(x[1:])) if x.size > 1 else 0.0
    v = np.zeros_like(x)
    v[0] = 1.0
    if sigma == 0.0:
        return v, 0.0, alpha
    beta = -np.copysign(np.hypot(alpha, sigma), alpha)
    v[1:] = x[1:] / (alpha - beta)
    return v, (beta - alpha) / beta, beta


def _larft(V: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """T of ``H₁ H₂ ⋯ H_k = I − V T Vᵀ`` (forward, columnwise)."""
    k = tau.size
    T = np.zeros((k, k))
    for i in range(k):
        T[i, i] = tau[i]
        if i:
            T[:i, i] = -tau[i] * (T[:i, :i] @ (V[:, :i].T @ V[:, i]))
    return T


def _factor_panel(P: np.ndarray, tol: float,
                  dropped: list | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Heath's rule on one host panel, in place.

    Returns ``(live, V, tau)``: the panel's live columns (bool), the
    reflectors (rows × nlive) and their τ. On return ``P`` holds the R part
    (live column i has its pivot at row i) and zeros below it. ``dropped``
    (optional) receives the 2-norm of each dead column's dropped part.
    """
    rows, w = P.shape
    live = np.zeros(w, dtype=bool)
    V = np.zeros((rows, min(rows, w)))
    tau = np.zeros(min(rows, w))
    p = 0
    for j in range(w):
        if p >= rows:
            break                           # no row left: the rest is dead
        x = P[p:, j]
        nx = float(np.linalg.norm(x))
        if nx <= tol:
            P[p:, j] = 0.0
            if dropped is not None:
                dropped.append(nx)
            continue
        v, t, beta = _householder(x.copy())
        if j + 1 < w and t != 0.0:
            blk = P[p:, j + 1:]
            blk -= t * np.outer(v, v @ blk)
        P[p, j] = beta
        P[p + 1:, j] = 0.0
        V[p:, p] = v
        tau[p] = t
        live[j] = True
        p += 1
    return live, V[:, :p], tau[:p]


def heath_qr(G, tol: float, *, upper: bool = False, panel: int = PANEL,
             dropped: list | None = None):
    """Blocked QR of ``G`` (k×q, NumPy or CuPy) with Heath's dead-column rule, in place.

    Parameters
    ----------
    G : ndarray (NumPy or CuPy), shape (k, q), float64
        Overwritten: rows ``0 : rank`` hold the live rows ``S`` (live columns
        upper triangular in their order), the rest is zero.
    tol : float
        Absolute column-norm threshold of a dead column.
    upper : bool
        G is upper triangular (rows at and beyond a panel's end are then zero
        and are skipped).
    panel : int
        Columns per panel.
    dropped : list, optional
        Receives the 2-norm of each dead column's dropped part (columns that
        meet no row left are not listed: their dropped part is the column
        below the last row, zero for upper triangular G).

    Returns
    -------
    live : ndarray of bool, shape (q,)
        Live columns (host).
    blocks : list of _Block
        The orthogonal factor Z as block reflectors, in application order.
    rank : int
    """
    xp = _xp_of(G)
    k, q = G.shape
    live = np.zeros(q, dtype=bool)
    blocks: list[_Block] = []
    p = 0
    for c in range(0, q, panel):
        c1 = min(q, c + panel)
        rend = min(k, c1) if upper else k
        if rend <= p:
            if not upper:
                break
            continue                        # no remaining rows: dead columns
        P = _to_host(G[p:rend, c:c1]).astype(np.float64, copy=True)
        lv, V, tau = _factor_panel(P, tol, dropped)
        G[p:rend, c:c1] = xp.asarray(P)
        live[c:c1] = lv
        nlive = V.shape[1]
        if nlive == 0:
            continue
        Vd = xp.asarray(V)
        Td = xp.asarray(_larft(V, tau))
        if c1 < q:
            trail = G[p:rend, c1:]
            trail -= Vd @ (Td.T @ (Vd.T @ trail))
        blocks.append(_Block(p, Vd, Td))
        p += nlive
    return live, blocks, p


def sigma_max_estimate(G, iterations: int = 40) -> float:
    """σ_max of G by power iteration on ``GᵀG`` (a lower bound, a few digits).

    Starts from the constant vector; where G annihilates it but is not zero
    (rows summing to zero), from a seeded random vector instead, so that only
    a zero G gives 0.
    """
    xp = _xp_of(G)
    q = G.shape[1]
    if q == 0 or G.shape[0] == 0:
        return 0.0
    v = xp.ones(q, dtype=G.dtype) / np.sqrt(q)
    s = 0.0
    for step in range(iterations):
        w = G.T @ (G @ v)
        nw = float(xp.linalg.norm(w))
        if nw == 0.0 and step == 0 and bool(xp.any(G)):
            start = np.random.default_rng(q).standard_normal(q)
            v = xp.asarray(start / np.linalg.norm(start), dtype=G.dtype)
            w = G.T @ (G @ v)
            nw = float(xp.linalg.norm(w))
        if nw == 0.0:
            return 0.0
        s_new = np.sqrt(nw)
        v = w / nw
        if abs(s_new - s) <= 1e-6 * s_new:
            s = s_new
            break
        s = s_new
    return float(s)


def solve_triangular(R, B, *, trans: bool):
    """``R⁻¹ B`` (or ``R⁻ᵀ B``) for upper triangular R on NumPy or CuPy."""
    if _xp_of(R) is np:
        return la.solve_triangular(R, B, trans=1 if trans else 0, lower=False,
                                   check_finite=False)
    from cupyx.scipy.linalg import solve_triangular as dev_solve      # optional dependency
    return dev_solve(R, B, trans=1 if trans else 0, lower=False)


@dataclass
class DenseCOD:
    """Complete orthogonal decomposition ``Z G P = [[R11 R12], [0 0]]`` of a dense G.

    Parameters
    ----------
    G : ndarray (NumPy or CuPy), shape (k, q)
        Consumed (overwritten).
    tol : float
        Absolute dead-column threshold (:func:`heath_qr`).
    upper : bool
        G is upper triangular.
    """

    G: object
    tol: float
    upper: bool = False
    rank: int = field(init=False, default=0)
    live: np.ndarray = field(init=False, default=None, repr=False)
    _blocks: list = field(init=False, default_factory=list, repr=False)
    _second_qr: tuple = field(init=False, default=None, repr=False)

    def __post_init__(self):
        self.live, self._blocks, self.rank = heath_qr(self.G, self.tol, upper=self.upper)

    @property
    def _second(self) -> tuple:
        """The live rows' factorization (step 2), computed on first use."""
        if self._second_qr is None:
            xp = _xp_of(self.G)
            r, q = self.rank, self.G.shape[1]
            S = self.G[:r]
            if r < q:
                Q2, R2 = xp.linalg.qr(S.T, mode="reduced")
                self._second_qr = ("qr", Q2, R2)
            else:
                self._second_qr = ("triangular", None, S)
            self.G = None
        return self._second_qr

    def sigma_min_estimate(self, iterations: int = 30) -> float:
        """σ_min of the live rows S by inverse iteration with its triangular factor."""
        kind, _, Rt = self._second
        xp = _xp_of(Rt)
        r = Rt.shape[0]
        if r == 0:
            return 0.0
        Rt = Rt[:, :r] if kind == "triangular" else Rt
        v = xp.ones((r, 1), dtype=xp.float64) / np.sqrt(r)
        lam = 0.0
        for _ in range(iterations):
            w = solve_triangular(Rt, solve_triangular(Rt, v, trans=True), trans=False)
            nw = float(xp.linalg.norm(w))
            if not np.isfinite(nw) or nw == 0.0:
                return 0.0
            v = w / nw
            if abs(nw - lam) <= 1e-3 * nw:
                lam = nw
                break
            lam = nw
        return float(1.0 / np.sqrt(lam))

    @property
    def xp(self):
        return _xp_of(self._second[2])

    def apply_zt(self, C):
        """``Z C`` (the blocks' product applied to C, k rows), in place on a copy."""
        xp = self.xp
        C = xp.array(C, dtype=xp.float64, copy=True)
        apply_blocks(self._blocks, C)
        return C

    def solve(self, C):
        """Minimum-norm ``Y`` with ``G Y ≈ C`` under the decided rank; C of shape (k, p)."""
        xp = self.xp
        D = self.apply_zt(C)[:self.rank]
        kind, Q2, R2 = self._second
        q = self.live.size
        if self.rank == 0:
            return xp.zeros((q, D.shape[1]))
        if kind == "triangular":
            return solve_triangular(R2, D, trans=False)
        # S y = D with S = R2ᵀ Q2ᵀ: z = R2⁻ᵀ D, y = Q2 z
        return Q2 @ solve_triangular(R2, D, trans=True)
