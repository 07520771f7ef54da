"""lstsq's rank of a dense triangular factor without a full SVD (host).

Used by :class:`scipy_gpuqr._factor.lstsq.MinNormSolver` on the host when Heath's
rule cannot reveal ``numpy.linalg.lstsq``'s rank (no gap in the singular
values around the cutoff), for less than a full SVD costs. ``G`` is ``R`` or
``Rᵀ`` for a square upper triangular R with a nonzero diagonal; only a
block of its smallest singular triplets is computed.

Method (orthogonal transformations throughout):

1. **Block inverse subspace iteration** for R's small right singular
   subspace: ``X ← orth(R⁻¹ R⁻ᵀ X)`` with ``p`` columns (two triangular
   solves, BLAS-3). Rayleigh–Ritz on the inverse, ``R⁻ᵀ X = P Θ Wᵀ``, gives
   Ritz values ``1/θ`` (upper bounds of R's smallest singular values, exact
   at convergence) and right Ritz vectors ``X W``. Each solve is backward
   stable, so the Ritz pairs are those of a matrix within rounding of R,
   like an SVD's. The block grows (doubling, new random columns) until its
   largest Ritz value exceeds :data:`STRADDLE` × the cutoff, so that every
   singular value up to :data:`WINDOW` × the cutoff converges at a rate of
   at most ``(WINDOW/STRADDLE)²`` per step; the iteration stops when those
   Ritz values change by less than :data:`RITZ_RTOL` per step and the count
   below the cutoff is stable. ``d`` = that count: lstsq's nullity (Ritz
   values are upper bounds, so an unconverged block can only undercount).
2. **Deflation**: the d Ritz vectors ``V_d`` are moved out with one block
   Householder reflector ``H = I − Ỹ T Ỹᵀ`` (the QR of ``V_d`` with its rows
   reversed, so H's *last* d columns span ``V_d``): ``R H = [R W  R V_d]``
   with ``‖R V_d‖ ≈ σ_{r+1} <=`` cutoff. Dropping ``R V_d`` is lstsq's
   truncation (up to the Ritz vectors' accuracy); ``R W`` (q × (q−d)) has
   singular values ``σ_1..σ_r``.
3. **Re-triangularization** of ``R H = R − U Ỹᵀ`` (``U = R Ỹ T``, a rank-d
   update of a triangle) in ``O(q²·d)`` flops by GEMMs on windows of rows
   (:func:`_retriangularize`: a bottom-up sweep of QRs moves U into its top
   d rows and fills at most 2d subdiagonals, the update goes into those
   rows, a left-to-right sweep of QRs of 3d × d blocks restores the
   triangle), so ``R H = Q R̃`` and ``R W = Q R̃[:, :r]`` with ``R₃ =
   R̃[:r, :r]``. The minimum-norm solution of the rank-r problem is
   ``y = H [R₃⁻¹ (Qᵀ c)[:r]; 0]`` (y ⟂ V_d); for ``G = Rᵀ`` the transpose
   of that truncated pseudo-inverse, ``y = Q [R₃⁻ᵀ (Hᵀ c)[:r]; 0]``. R is
   deflated in both cases: R's rows are graded like its singular values,
   so the products ``R H`` carry errors relative to each row (a deflation
   on the Rᵀ side, ``Rᵀ H``, loses orders of magnitude more of the
   solution).

Nothing is subtracted from ``G⁻¹c`` (no projection of a solution that the
small singular values blow up): the only solves with small pivots are in
the iteration, whose results are normalized.

Cost: ``2·p·q²`` flops per step (p: block columns), then about ``15·d·q²``
for steps 2 and 3 (where a dense ``geqrf`` of ``R W`` would take
``4/3·q³``), against ``8/3·q³`` for the
``geqrf + orgqr`` of the dense COD's second QR it replaces
(:mod:`scipy_gpuqr._factor.dense_cod`). A block that would
exceed ``max_block`` columns (many small singular values: Heath's rule
settles those) raises :class:`SubspaceTooLarge`.

It runs on the host. The same steps map onto CuPy (``cupyx.scipy.linalg.
solve_triangular``, a small SVD per step, cuSOLVER ``geqrf``/``ormqr``), which
would lift the GPU's SVD limit (:data:`scipy_gpuqr._factor.lstsq.SVD_FALLBACK_LIMIT`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as la
from scipy.sparse.linalg import LinearOperator, eigsh

from .._errors import SubspaceTooLarge

__all__ = ["SubspaceCOD", "SubspaceTooLarge", "STRADDLE", "WINDOW", "RITZ_RTOL", "MAX_STEPS",
           "sigma_max_lanczos"]

#: The block's largest Ritz value must exceed STRADDLE × cutoff.
STRADDLE = 2.0

#: Ritz values up to WINDOW × cutoff must have settled (relative change per
#: step <= RITZ_RTOL); with STRADDLE they converge at a rate <= (WINDOW/STRADDLE)².
WINDOW = 1.25

#: Relative change per step of the Ritz values in the window at convergence.
RITZ_RTOL = 1e-10

#: Steps after which the iteration gives up (SubspaceTooLarge).
MAX_STEPS = 60


def _lwork(routine, *args, **kwargs) -> int:
    """LAPACK workspace query (``lwork=-1``)."""
    out = routine(*args, lwork=-1, **kwargs)
    return max(1, int(out[-2][0]))


def sigma_max_lanczos(R, rtol: float = 1e-12) -> float:
    """σ_max of a (sparse or dense) matrix by Lanczos on ``RᵀR`` to ``rtol``.

    lstsq's cutoff scales with σ_max, so the estimate must be accurate to far
    better than the spacing of the singular values near the cutoff; power
    iteration stalls when the largest ones are close together.

    A zero R (no entries, or only explicit zeros) has σ_max = 0; ARPACK
    cannot run on it (a zero operator maps every start to zero, its error
    "Starting vector is zero"). The start is the constant vector, unless R
    annihilates it (rows summing to zero, e.g. graph Laplacians): then a
    seeded random vector, for the same reason.
    """
    q = R.shape[1]
    if q == 0 or R.shape[0] == 0:
        return 0.0
    values = R.data if hasattr(R, "toarray") else np.asarray(R)
    if not np.any(values):
        return 0.0
    if min(R.shape) <= 2:
        dense = R.toarray() if hasattr(R, "toarray") else np.asarray(R)
        return float(np.linalg.norm(dense, 2))
    RT = R.T
    op = LinearOperator((q, q), dtype=np.float64, matvec=lambda v: RT @ (R @ v.ravel()))
    start = np.ones(q)
    if not np.any(R @ start):
        start = np.random.default_rng(q).standard_normal(q)
    lam = eigsh(op, k=1, which="LM", tol=rtol, v0=start,
                return_eigenvectors=False)[0]
    return float(np.sqrt(max(lam, 0.0)))


def _retriangularize(A: np.ndarray, U: np.ndarray, Yt: np.ndarray) -> list:
    """``A ← Qᵀ (A − U Ytᵀ)`` upper triangular, in place, for upper triangular A.

    O(q²·d) flops for a rank-d update, all in GEMMs on windows of rows:
    (1) bottom-up, a full QR of U's rows ``[a, a+2d)`` moves U into its
    top d rows (applied to A's rows, which fills in at most 2d subdiagonals);
    (2) the top d rows take the update; (3) left to right, a QR of each d
    columns' ``3d`` rows restores the triangle. Returns Q as the list of
    windows ``(row0, Q_w)`` in application order (``Qᵀ = ∏ Q_wᵀ``).
    """
    q, d = U.shape
    windows = []
    b = q
    while b > d or not windows:
        a = max(0, b - 2 * d)
        Qw = la.qr(U[a:b], mode="full", check_finite=False)[0]
        U[a:b] = Qw.T @ U[a:b]
        U[a + d:b] = 0.0
        A[a:b, a:] = Qw.T @ A[a:b, a:]
        windows.append((a, Qw))
        b -= d
    A[:d] -= U[:d] @ Yt.T
    for j in range(0, q - 1, d):
        rend = min(q, j + 3 * d)
        Qw = la.qr(A[j:rend, j:j + d], mode="full", check_finite=False)[0]
        A[j:rend, j:] = Qw.T @ A[j:rend, j:]
        windows.append((j, Qw))
    return windows


def _apply_windows(windows: list, C: np.ndarray, *, transpose: bool) -> np.ndarray:
    """``Qᵀ C`` (``transpose``) or ``Q C`` for the windows of :func:`_retriangularize`."""
    C = np.array(C, dtype=np.float64, order="F", copy=True)
    seq = windows if transpose else reversed(windows)
    for row0, Qw in seq:
        rows = slice(row0, row0 + Qw.shape[0])
        C[rows] = (Qw.T if transpose else Qw) @ C[rows]
    return C


def _orth(X: np.ndarray) -> np.ndarray:
    return np.linalg.qr(X, mode="reduced")[0]


@dataclass
class SubspaceCOD:
    """Minimum-norm solves with G = R or Rᵀ under lstsq's absolute cutoff ``tol``.

    Parameters
    ----------
    R : ndarray, shape (q, q)
        Dense upper triangular, nonzero diagonal; consumed (overwritten).
    tol : float
        Absolute cutoff: singular values ``<= tol`` are dropped.
    transposed : bool
        Solve with ``G = Rᵀ``.
    block : int
        Initial block size.
    max_block : int
        Largest block (beyond: :class:`SubspaceTooLarge`).
    seed : int
        Seed of the random starting block.

    Attributes
    ----------
    rank : int
        Number of singular values above ``tol`` (``q − d``).
    ritz : ndarray
        The converged Ritz values (ascending), G's ``p`` smallest singular values.
    sigma_min : float
        Smallest kept singular value (``σ_r``; inf when the block kept none below).
    steps, block_used : int
        Iteration steps and final block size.
    """

    R: np.ndarray
    tol: float
    transposed: bool = False
    block: int = 64
    max_block: int = 1024
    seed: int = 0
    rank: int = field(init=False, default=0)
    ritz: np.ndarray = field(init=False, default=None, repr=False)
    sigma_min: float = field(init=False, default=float("nan"))
    steps: int = field(init=False, default=0)
    block_used: int = field(init=False, default=0)
    _vd: tuple = field(init=False, default=None, repr=False)
    _windows: list = field(init=False, default=None, repr=False)
    _r3: np.ndarray = field(init=False, default=None, repr=False)

    def __post_init__(self):
        R = np.asfortranarray(self.R, dtype=np.float64)
        self.R = None
        q = R.shape[0]
        X = self._iterate(R)
        d = int(np.count_nonzero(self.ritz <= self.tol))
        self.rank = q - d
        kept = self.ritz[d:]
        self.sigma_min = float(kept[0]) if kept.size else float("inf")
        if d == 0:
            self._vd, self._windows, self._r3 = None, [], R
            return
        # H = J Hq J (J: reversal) with J V_d = Hq [T_v; 0]: H's last d columns
        # span V_d, its first q − d are W; H = I − Ỹ T Ỹᵀ with Ỹ = J Y.
        vqr, T, info = la.lapack.dgeqrt(d, np.asfortranarray(X[::-1, :d]), overwrite_a=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"dgeqrt of the Ritz vectors: info {info}")
        self._vd = (vqr, np.diag(T).copy())             # Hq = I − Y T Yᵀ, τ = diag(T)
        Y = np.tril(vqr, -1)
        Y[np.arange(d), np.arange(d)] = 1.0
        Yt = Y[::-1]
        U = (R @ Yt) @ T                                # R H = R − U Ỹᵀ
        self._windows = _retriangularize(R, U, Yt)
        self._r3 = R
    # -- step 1: block inverse subspace iteration ---------------------------------
    def _iterate(self, R: np.ndarray) -> np.ndarray:
        """Converged Ritz vectors (q × p, ascending Ritz values in ``self.ritz``)."""
        q = R.shape[0]
        inv = lambda Y: la.solve_triangular(R, Y, trans=0, lower=False,      # noqa: E731
                                            check_finite=False)
        inv_t = lambda Y: la.solve_triangular(R, Y, trans=1, lower=False,    # noqa: E731
                                              check_finite=False)
        rng = np.random.default_rng(self.seed)
        p = min(q, max(1, self.block))
        X = _orth(rng.standard_normal((q, p)))
        prev = None
        prev_d = -1
        for step in range(1, MAX_STEPS + 1):
            Z = inv_t(X)                                 # R⁻ᵀ X = U Σ⁻¹ Vᵀ X
            if not np.all(np.isfinite(Z)):
                raise SubspaceTooLarge("non-finite triangular solve")
            P, th, Wt = la.svd(Z, full_matrices=False, check_finite=False)
            ritz = 1.0 / th                              # ascending
            X = X @ Wt.T                                 # right Ritz vectors
            d = int(np.count_nonzero(ritz <= self.tol))
            window = ritz <= WINDOW * self.tol
            straddles = ritz[-1] > STRADDLE * self.tol or p == q
            settled = (prev is not None and prev.size == ritz.size and d == prev_d
                       and np.all(np.abs(ritz[window] - prev[window])
                                  <= RITZ_RTOL * ritz[window]))
            self.ritz, self.steps, self.block_used = ritz, step, p
            if settled and straddles:
                return X
            if not straddles and step >= 2:
                p_new = min(q, 2 * p)
                if p_new > self.max_block:
                    raise SubspaceTooLarge(
                        f"block of {p} columns: largest Ritz value "
                        f"{ritz[-1] / self.tol:.3g} × cutoff")
                extra = rng.standard_normal((q, p_new - p))
                extra -= X @ (X.T @ extra)
                X = _orth(np.hstack([X, extra]))
                p, prev, prev_d = p_new, None, -1
                continue
            prev, prev_d = ritz, d
            Y = inv(P * th)                              # R⁻¹ R⁻ᵀ X W
            if not np.all(np.isfinite(Y)):
                raise SubspaceTooLarge("non-finite triangular solve")
            X = _orth(Y)
        raise SubspaceTooLarge(f"no convergence in {MAX_STEPS} steps (block {p})")

    # -- steps 2 and 3 ---------------------------------------------------------------
    def _apply_h(self, C: np.ndarray, trans: str) -> np.ndarray:
        """``H C`` or ``Hᵀ C`` (H = J Hq J, Hq the reflectors of J V_d)."""
        vqr, vtau = self._vd
        C = np.asfortranarray(C[::-1])
        lw = _lwork(la.lapack.dormqr, "L", trans, vqr, vtau, C)
        out, _, info = la.lapack.dormqr("L", trans, vqr, vtau, C, lw, overwrite_c=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"dormqr: info {info}")
        return out[::-1]

    def solve(self, C: np.ndarray) -> np.ndarray:
        """Minimum-norm ``Y`` with ``G Y ≈ C`` under the cutoff; C of shape (q, p).

        With ``R H = Q [R₃ *; 0 *]`` (H's first r columns W ⟂ V_d), the
        truncated pseudo-inverse of R is ``R⁺ = H [R₃⁻¹ (Qᵀ ·)[:r]; 0]`` and
        that of Rᵀ its transpose, ``Q [R₃⁻ᵀ (Hᵀ ·)[:r]; 0]``: both from the
        one deflation of R.
        """
        C = np.asarray(C, dtype=np.float64)
        q, r = self._r3.shape[0], self.rank
        R3 = self._r3[:r, :r]
        Y = np.zeros((q, C.shape[1]), order="F")
        if C.shape[1] == 0 or r == 0:
            return np.ascontiguousarray(Y)
        if self._vd is None:
            return la.solve_triangular(R3, C, trans=1 if self.transposed else 0,
                                       lower=False, check_finite=False)
        if self.transposed:
            D = self._apply_h(C, "T")
            Y[:r] = la.solve_triangular(R3, D[:r], trans=1, lower=False, check_finite=False)
            return np.ascontiguousarray(_apply_windows(self._windows, Y, transpose=False))
        D = _apply_windows(self._windows, C, transpose=True)
        Y[:r] = la.solve_triangular(R3, D[:r], lower=False, check_finite=False)
        return np.ascontiguousarray(self._apply_h(Y, "N"))
