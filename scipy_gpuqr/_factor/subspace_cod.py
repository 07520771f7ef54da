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
   Ritz values change by less than :data:`RITZ_RTOL` per step (or, converging
   geometrically, are predicted within it of their limit) and the count
   below the cutoff is stable. ``d`` = that count: lstsq's nullity (Ritz
   values are upper bounds, so an unconverged block can only undercount).
   Ritz values far below the cutoff converge first (at ``(σ/σ_{p+1})⁴`` per
   step): they are locked (taken out of the block) once settled, and the
   remaining steps run on the rest.
   The iteration starts from R⁻¹ of a random block (half a step for one
   solve). The tall blocks are factored by Cholesky QR on unit-scaled columns
   (:func:`orth_r`, :func:`triangular_factor`: Gram matrices and triangular
   solves at GEMM speed; Householder where a block is ill-conditioned); the
   start's and the first step's ill-conditioned blocks by one pass
   (:data:`ROUGH_COND`), whose loss of orthogonality keeps that step's Ritz
   values out of the convergence test and the locking (:data:`SETTLE_LOSS`).
   The iteration (:func:`small_subspace`) takes only the two solves, so
   :mod:`scipy_gpuqr._factor.sparse_subspace` runs it on a sparse R.
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
from .host_lanes import SERIAL, Lanes

__all__ = ["SubspaceCOD", "SubspaceTooLarge", "SmallSubspace", "small_subspace", "orth_r",
           "triangular_factor", "gemm", "STRADDLE", "WINDOW", "RITZ_RTOL", "RITZ_NOISE_LIMIT",
           "RATE_MAX", "RATE_MARGIN", "MAX_STEPS", "CHOLQR_ORTH", "GRAM_COND", "ROUGH_COND",
           "SETTLE_LOSS", "RATE_LOSS", "sigma_max_lanczos"]

#: The block's largest Ritz value must exceed STRADDLE × cutoff.
STRADDLE = 2.0

#: Ritz values up to WINDOW × cutoff must have settled (relative change per
#: step <= RITZ_RTOL); with STRADDLE they converge at a rate <= (WINDOW/STRADDLE)².
WINDOW = 1.25

#: Relative change per step of the Ritz values in the window at convergence.
RITZ_RTOL = 1e-10

#: Largest ratio of successive changes of the Ritz values for which the
#: iteration extrapolates their distance to the limit (geometric convergence),
#: and the margin below RITZ_RTOL that the extrapolated distance must keep.
RATE_MAX = 0.5
RATE_MARGIN = 10.0

#: Locking: once a step leaves the smallest Ritz values (at most LOCK_RATIO ×
#: the cutoff) changed by at most LOCK_RTOL, their vectors leave the block (no
#: more solves or products with them: the block's later steps work on the rest,
#: kept orthogonal to them), in runs of at least LOCK_MIN columns and a quarter
#: of the block. They converge at ``(σ/σ_{p+1})⁴`` per step, at most
#: ``(LOCK_RATIO/STRADDLE)⁴`` = 6e-6 once the block straddles.
LOCK_RATIO = 0.1
LOCK_RTOL = 1e-8
LOCK_MIN = 16

#: A column of the block whose norm the deflation against the locked vectors
#: divides by more than this is deflated a second time.
DEFLATE_REPEAT = 1e3

#: Steps after which the iteration gives up (SubspaceTooLarge).
MAX_STEPS = 60

#: Largest relative error of the Ritz values at the cutoff that the iteration
#: accepts (``eps·tol/σ_min``: the SVD of ``R⁻ᵀX`` resolves its values to
#: ``eps·θ_max``, ``θ_max = 1/σ_min``); beyond, SubspaceTooLarge. Near that
#: level the convergence test allows 10× this noise instead of RITZ_RTOL.
RITZ_NOISE_LIMIT = 1e-8

EPS = float(np.finfo(np.float64).eps)

#: Largest deviation from the identity (max entry) of the second Gram matrix of
#: :func:`orth_r`'s Cholesky QR for its result to be taken.
CHOLQR_ORTH = 0.1

#: Largest condition estimate of a unit-scaled block for one Cholesky QR pass
#: (its Gram matrix loses ``eps·cond²`` of orthogonality).
GRAM_COND = 100.0

#: The iteration's start and its first step factor their blocks by one Cholesky
#: QR pass up to this condition estimate (the unit-scaled Gram matrix, ``cond²``
#: = 1e12, is still positive definite in float64), where the two-pass or
#: Householder factorization would cost two or more q × p products: the block's
#: span is kept, its orthogonality (or T's singular values) lost to ``eps·cond²``
#: (2e-4 at the bound). That loss is carried to the step's Ritz values, which the
#: convergence test and the locking read only where it is small enough
#: (:data:`SETTLE_LOSS`). A random block's solves are that ill-conditioned
#: (bayer10: ~1e5-1e6); later blocks are factored as before (on a wide spectrum
#: under the cutoff ``R⁻ᵀX`` can stay ill-conditioned at every step, and rough
#: values at every step would never settle).
ROUGH_COND = 1e6

#: Largest loss (``eps·cond²`` of the step's factorizations, relative to each
#: Ritz value) of the Ritz values that the convergence test compares and the
#: locking takes: a one-pass factor within :data:`GRAM_COND`.
SETTLE_LOSS = float(np.finfo(np.float64).eps) * GRAM_COND ** 2

#: The geometric rule also reads the change before the last (its rate): that
#: change is taken where the loss of the step before it is at most this share of
#: it (the rate then within 1 % of the exact values').
RATE_LOSS = 0.01


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


def gemm(A: np.ndarray, B: np.ndarray, trans_a: bool = False,
         lanes: Lanes = SERIAL) -> np.ndarray:
    """``A B`` (``Aᵀ B``), Fortran order out; ``lanes`` splits a tall A by rows
    (:meth:`~scipy_gpuqr._factor.host_lanes.Lanes.gemm`). The iteration runs
    under a limit of one BLAS thread for every BLAS library loaded
    (:func:`~scipy_gpuqr._cpu.blas_threads.one_blas_thread`), so NumPy's
    and SciPy's BLAS do not spin on each other's cores.
    """
    return lanes.gemm(A, B, trans_a=trans_a)


#: Column norms outside this range are scaled before their Gram matrix is
#: formed (its entries would overflow or lose digits to underflow).
_GRAM_SAFE = (1e-140, 1e140)


def _scaled_cholesky(Y: np.ndarray, lanes: Lanes = SERIAL):
    """``(U, s)``: ``Ŷ = Y / s`` has unit columns and ``ŶᵀŶ = UᵀU``; None where the
    columns are zero or not finite, or the Gram matrix is not numerically
    positive definite.

    The Gram matrix is formed from Y and scaled afterwards (``ŶᵀŶ = D⁻¹ YᵀY D⁻¹``,
    the same rounding relative to each entry), so no scaled copy of Y is made,
    unless Y's column norms are outside :data:`_GRAM_SAFE`.
    """
    if not Y.shape[1]:
        return None
    G = lanes.gram(Y)
    s = np.sqrt(np.diag(G).copy())
    if not (np.all(np.isfinite(s)) and s.min() > _GRAM_SAFE[0] and s.max() < _GRAM_SAFE[1]):
        n = np.linalg.norm(Y, axis=0)
        if not (np.all(n > 0) and np.all(np.isfinite(n))):
            return None
        Gs = lanes.gram(Y / n)
        s = n
    else:
        Gs = G / s[:, None] / s[None, :]
    try:
        U = la.cholesky(Gs, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(U)):
        return None
    return U, s


def _cond_upper(U: np.ndarray) -> float:
    """1-norm condition estimate of an upper triangular U (LAPACK ``trcon``)."""
    rcond, info = la.lapack.dtrcon(U, norm="1", uplo="U", diag="N")
    return 1.0 / rcond if info == 0 and rcond > 0 else float("inf")


def triangular_factor(Y: np.ndarray, lanes: Lanes = SERIAL) -> np.ndarray:
    """The triangular factor T of a thin QR ``Y = Q T``, without Q.

    One Cholesky QR pass on the unit-scaled columns (a Gram matrix: one GEMM)
    where that block is well conditioned (:data:`GRAM_COND`): T's singular
    values are then Y's to about ``eps·cond²`` relative to each; otherwise
    :func:`orth_r`.
    """
    return _rough_factor(Y, lanes)[0]


def _upper_inverse(U: np.ndarray, s: np.ndarray = None):
    """``(U D)⁻¹`` (``D = diag(s)``, none: the identity) of upper triangular U:
    U's inverse by ``trtri``, its rows divided by s; None where ``trtri``
    fails (a zero pivot)."""
    Ui, info = la.lapack.dtrtri(U, lower=0)
    if info != 0:
        return None
    Ui = np.triu(Ui)
    if s is not None:
        Ui /= s[:, None]
    return Ui


def _times_inverse(U: np.ndarray, Y: np.ndarray, lanes: Lanes,
                   s: np.ndarray = None) -> np.ndarray:
    """``Y (U D)⁻¹`` (``D = diag(s)``, none: the identity) for a well-conditioned
    upper triangular U (:data:`GRAM_COND`): U's p × p inverse
    (:func:`_upper_inverse`) applied by GEMM on the lanes' row pieces. A
    right-side ``trsm`` does half the flops at a fraction of GEMM's speed, and
    SciPy's wrapper of it runs one lane at a time; for such a U the two agree
    to ``eps·cond(U)`` relative."""
    Ui = _upper_inverse(U, s)
    if Ui is None:
        return lanes.solve_right_upper(U * s if s is not None else U, Y)
    return lanes.gemm(Y, Ui)


def orth_r(Y: np.ndarray, lanes: Lanes = SERIAL, first: tuple = None, *,
           want_q: bool = True, inverse_first: bool = False) -> tuple:
    """Thin QR ``Y = Q T`` of a tall block (Q orthonormal, T upper triangular).

    Columns are scaled to unit norm first (the blocks of the subspace
    iteration have nearly orthogonal columns of very different lengths once
    they converge: scaled, they are well conditioned), then Cholesky QR
    (Gram matrices and triangular solves, at GEMM speed, where a
    Householder QR of a tall block runs at BLAS-2 speed): one pass where
    the scaled block's condition estimate is at most :data:`GRAM_COND`
    (orthogonality lost ≈ ``eps·cond²``), else two, the second accepted
    where its Gram matrix is within :data:`CHOLQR_ORTH` of the identity (the
    second pass then leaves Q orthonormal to rounding). Otherwise
    (ill-conditioned blocks: a random start, a block that grew)
    Householder QR answers. The scaling is folded into the triangular
    factor (``Q = Y (U D)⁻¹``); ``lanes`` splits the tall products by rows.
    A well-conditioned pass applies its factor's inverse by GEMM
    (:func:`_times_inverse`), an ill-conditioned first pass solves with it.
    ``first`` is :func:`_scaled_cholesky`'s answer for Y where the caller has
    it (not formed again; None: formed here). ``want_q`` False: ``(None, T)``
    (the last pass's q × p product, or Householder's Q, not formed).
    ``inverse_first``: an ill-conditioned first pass too applies its factor's
    inverse by GEMM (for blocks whose span is all that counts, as the
    iteration's next start: the product's error, ``eps·cond`` relative, moves
    the span no more than the solve's rounding does; Q T = Y then holds only
    to that).
    """
    Y = np.asarray(Y, dtype=np.float64)
    p = Y.shape[1]
    with np.errstate(all="ignore"):
        f = first if first is not None else _scaled_cholesky(Y, lanes)
        if f is not None:
            U1, s = f
            T1 = U1 * s                          # Ŷ = Y D⁻¹ = Q U1: Y = Q (U1 D)
            one_pass = _cond_upper(U1) <= GRAM_COND
            if one_pass and not want_q:
                return None, T1
            Q = (_times_inverse(U1, Y, lanes, s) if one_pass or inverse_first
                 else lanes.solve_right_upper(T1, Y))
            if np.all(np.isfinite(Q)):
                if one_pass:
                    return Q, T1
                G2 = lanes.gram(Q)
                if (np.all(np.isfinite(np.triu(G2)))
                        and np.abs(np.triu(G2) - np.eye(p)).max() <= CHOLQR_ORTH):
                    try:
                        U2 = la.cholesky(G2, lower=False, check_finite=False)
                    except np.linalg.LinAlgError:
                        U2 = None
                    if U2 is not None:
                        Q = _times_inverse(U2, Q, lanes) if want_q else None
                        return Q, U2 @ T1
    if not want_q:
        return None, la.qr(np.asfortranarray(Y), mode="r", check_finite=False)[0][:p]
    return la.qr(np.asfortranarray(Y), mode="economic", check_finite=False)


@dataclass(frozen=True)
class SmallSubspace:
    """Result of :func:`small_subspace`.

    Attributes
    ----------
    vectors : ndarray, shape (q, p)
        Right Ritz vectors ``V`` (orthonormal), ascending Ritz values.
    ritz : ndarray, shape (p,)
        Ritz values (ascending), upper bounds of R's p smallest singular values.
    steps, block : int
        Steps taken and the final block size.
    images : ndarray, shape (q, d)
        ``R⁻ᵀ V[:, :d]`` for the d Ritz values at most the cutoff, from the last
        step's solve (its columns are orthogonal: R's left Ritz vectors scaled
        by the inverse Ritz values).
    locked : int
        Ritz pairs locked before the last step (:data:`LOCK_RATIO`).
    """

    vectors: np.ndarray
    ritz: np.ndarray
    steps: int
    block: int
    images: np.ndarray = None
    locked: int = 0


def _hcat(*blocks: np.ndarray) -> np.ndarray:
    """Blocks side by side, in Fortran order (the BLAS calls' layout)."""
    out = np.empty((blocks[0].shape[0], sum(b.shape[1] for b in blocks)), order="F")
    j = 0
    for b in blocks:
        out[:, j:j + b.shape[1]] = b
        j += b.shape[1]
    return out


def _lockable(active: np.ndarray, moved: np.ndarray, tol: float, a: int) -> int:
    """How many of the smallest active Ritz values to lock: the leading run at most
    :data:`LOCK_RATIO` × ``tol`` whose last change was at most :data:`LOCK_RTOL`;
    none where that run is shorter than :data:`LOCK_MIN` or a quarter of the block."""
    ok = (active <= LOCK_RATIO * tol) & (moved <= LOCK_RTOL)
    k = int(np.argmin(ok)) if not ok.all() else ok.size
    return k if k >= max(LOCK_MIN, a // 4) and k < a else 0


def _deflate(L: np.ndarray, Y: np.ndarray, lanes: Lanes) -> np.ndarray:
    """``(I − L Lᵀ) Y`` for orthonormal L, a second pass for the columns the first
    one shrank by more than :data:`DEFLATE_REPEAT` (their components along L
    dominated: one pass leaves ``eps·‖Lᵀy‖`` of them)."""
    before = np.linalg.norm(Y, axis=0)
    Y = Y - lanes.gemm(L, lanes.gemm(L, Y, trans_a=True))
    after = np.linalg.norm(Y, axis=0)
    again = np.flatnonzero(after * DEFLATE_REPEAT < before)
    if again.size:
        Ya = np.asfortranarray(Y[:, again])
        Y[:, again] = Ya - lanes.gemm(L, lanes.gemm(L, Ya, trans_a=True))
    return Y


def _orth_deferred(Y: np.ndarray, lanes: Lanes, rough: bool = False) -> tuple:
    """``(Y, M, loss)`` with ``Y M`` orthonormal where one Cholesky QR pass answers
    (:func:`orth_r`'s well-conditioned case: ``M = (U D)⁻¹``, condition at most
    :data:`GRAM_COND`), so that the caller folds M into the p × p matrix it
    multiplies the block by next instead of a q × p product now; ``rough``: ``(Y M,
    None, loss)`` by one pass up to :data:`ROUGH_COND` (the product made here: a
    factor that ill-conditioned is not folded into the next rotation); ``(orth_r(Y),
    None, eps)`` otherwise. ``loss``: the orthogonality lost, ``eps·cond²``."""
    Y = np.asarray(Y, dtype=np.float64)
    with np.errstate(all="ignore"):
        f = _scaled_cholesky(Y, lanes)
        if f is not None:
            cond = _cond_upper(f[0])
            M = _upper_inverse(*f) if cond <= (ROUGH_COND if rough else GRAM_COND) else None
            if M is not None and np.all(np.isfinite(M)):
                if cond <= GRAM_COND:
                    return Y, M, EPS * cond * cond
                return lanes.gemm(Y, M), None, EPS * cond * cond
    return orth_r(Y, lanes, first=f, inverse_first=True)[0], None, EPS


def _rough_factor(Z: np.ndarray, lanes: Lanes, rough: bool = False) -> tuple:
    """``(T, loss)``: :func:`triangular_factor` of Z (one Cholesky QR pass up to
    :data:`GRAM_COND`; ``rough``: up to :data:`ROUGH_COND`: T's singular values Z's
    to ``loss = eps·cond²`` relative to each), else its two-pass or Householder
    fallback (``loss = eps``)."""
    Z = np.asarray(Z, dtype=np.float64)
    with np.errstate(all="ignore"):
        f = _scaled_cholesky(Z, lanes)
    if f is not None:
        cond = _cond_upper(f[0])
        if cond <= (ROUGH_COND if rough else GRAM_COND):
            return f[0] * f[1], EPS * cond * cond
    return orth_r(Z, lanes, first=f, want_q=False)[1], EPS


def _finish(L, Lz, lritz, X, Z, B, active, tol, step, p, lanes) -> "SmallSubspace":
    """The converged block: locked and active Ritz pairs in ascending order, with
    ``R⁻ᵀ`` of the vectors at most ``tol``; ``X B`` are the active Ritz vectors,
    ``Z B`` their images."""
    V = _hcat(L, lanes.gemm(X, B))
    ritz = np.concatenate([lritz, active])
    order = np.argsort(ritz, kind="stable")
    d = int(np.count_nonzero(ritz <= tol))
    da = int(np.count_nonzero(active <= tol))
    images = _hcat(Lz, lanes.gemm(Z, np.asfortranarray(B[:, :da]))) if da else Lz
    if not np.array_equal(order, np.arange(order.size)):
        V = np.asfortranarray(V[:, order])
        images = np.asfortranarray(images[:, order[:d]])
    return SmallSubspace(V, ritz[order], step, p, images[:, :d], L.shape[1])


def small_subspace(inv, inv_t, q: int, tol: float, *, block: int = 64,
                   max_block: int = 1024, seed: int = 0,
                   lanes: Lanes = SERIAL) -> SmallSubspace:
    """R's small right singular subspace by block inverse subspace iteration.

    From ``X = orth(R⁻¹Ω)`` (Ω random: R's right singular vectors weighted by
    1/σ, half a step for one solve), ``X ← orth(R⁻¹ R⁻ᵀ X W)`` with
    Rayleigh–Ritz on ``R⁻ᵀ X = P Θ Wᵀ`` each
    step (the SVD of the triangular factor of ``R⁻ᵀ X``, :func:`triangular_factor`);
    the block grows (doubling, new random columns) until its largest Ritz
    value exceeds :data:`STRADDLE` × ``tol``; converged when the Ritz values
    up to :data:`WINDOW` × ``tol`` change by less than :data:`RITZ_RTOL` per
    step, or converge geometrically (rate ρ <= :data:`RATE_MAX` between the
    last two changes) with a predicted distance to their limit ``change·ρ/(1 −
    ρ)`` :data:`RATE_MARGIN` times below it, and their count below ``tol``
    is stable. The rotation by W keeps the next block's columns near R's
    singular vectors (nearly orthogonal: Cholesky QR orthonormalizes them,
    :func:`orth_r`). **Locking**: once the block straddles, the smallest Ritz
    values (at most :data:`LOCK_RATIO` × ``tol``, their last change at most
    :data:`LOCK_RTOL`) leave the block with their vectors and their images
    ``R⁻ᵀ v`` (see :func:`_lockable`): the later steps solve and multiply only
    the rest, deflated against them after each ``R⁻¹`` (:func:`_deflate`);
    their Ritz values count as settled. A block that one Cholesky QR pass
    orthonormalizes is kept as ``Y M`` (:func:`_orth_deferred`): M goes into the
    next step's p × p rotation, which spares a q × p product per step.
    **A rough first step**: the start's block and the first step's ``R⁻ᵀX`` and
    next ``Y``, where their unit-scaled condition lies between :data:`GRAM_COND`
    and :data:`ROUGH_COND` (a random block's solves), are factored by one Cholesky
    QR pass (the span kept, the orthogonality or the factor's singular values lost
    to ``eps·cond²``), where two passes or Householder cost two or more q × p
    products more. A step's Ritz values carry the loss of the factors they come
    from; the convergence test compares only values within :data:`SETTLE_LOSS`
    (the rate's older change read where the loss before it is within
    :data:`RATE_LOSS` of it), the locking takes only vectors within it whose
    moves were read within ``RATE_LOSS·LOCK_RTOL``. The test and its constants
    are otherwise the same; from the second step on the factorizations are too.

    Parameters
    ----------
    inv, inv_t : callable
        ``C ↦ R⁻¹C`` and ``C ↦ R⁻ᵀC`` on (q, p) float64 arrays.
    q : int
        Order of R.
    tol : float
        Absolute cutoff.
    block, max_block : int
        First and largest block.
    seed : int
        Seed of the random start.
    lanes : Lanes
        Threads for the q × p products (:mod:`scipy_gpuqr._factor.host_lanes`).

    Raises
    ------
    SubspaceTooLarge
        The block would exceed ``max_block``, a solve was not finite, or no
        convergence in :data:`MAX_STEPS` steps.
    """
    rng = np.random.default_rng(seed)
    p = min(q, max(1, block))
    # the start: R⁻¹ of a random block (R⁻¹Ω = V Σ⁻¹ UᵀΩ, R's right singular
    # vectors weighted by 1/σ: half a step of the iteration for one solve); uniform
    # entries, drawn at a quarter of a Gaussian block's cost, in Fortran order (the
    # solves' and products' layout)
    Y = np.asarray(inv(rng.uniform(-1.0, 1.0, (p, q)).T))
    if not np.all(np.isfinite(Y)):
        raise SubspaceTooLarge("non-finite triangular solve")
    # the block is X M (M None: X itself), M from a well-conditioned Cholesky QR
    # pass (_orth_deferred), applied with the next p × p rotation; R⁻ᵀ(X M) = (R⁻ᵀX) M
    # and the triangular factor of Z M is Z's times M; x_loss: X M's orthogonality lost
    X, M, x_loss = _orth_deferred(Y, lanes, rough=True)
    # locked Ritz pairs: vectors L ⟂ X, their images R⁻ᵀL, their Ritz values
    L, Lz, lritz = np.empty((q, 0), order="F"), np.empty((q, 0), order="F"), np.empty(0)
    prev = None
    prev_d = -1
    prev_change = np.inf
    losses = []                                      # each step's Ritz values' loss
    for step in range(1, MAX_STEPS + 1):
        Z = np.asarray(inv_t(X))                     # R⁻ᵀ X = U Σ⁻¹ Vᵀ X
        if not np.all(np.isfinite(Z)):
            raise SubspaceTooLarge("non-finite triangular solve")
        T, t_loss = _rough_factor(Z, lanes, rough=step == 1)
        if M is not None:
            T = T @ M
        losses.append(max(x_loss, t_loss))
        _, th, Wt = la.svd(T, full_matrices=False, check_finite=False)
        # the block's rotations: (X M) Wᵀ = X B
        B = Wt.T if M is None else M @ Wt.T
        active = 1.0 / th                            # ascending
        ritz = np.concatenate([lritz, active])       # locked first, then the active block
        low = min(ritz[0], active[0])
        # the SVD resolves θ to eps·θ_max: Ritz values at the cutoff to about
        # eps·tol/σ_min relative (ritz[0] >= σ_min: a lower bound of that)
        noise = EPS * WINDOW * tol / low if low > 0 else np.inf
        if not noise <= RITZ_NOISE_LIMIT:
            raise SubspaceTooLarge(
                f"smallest singular value {low / tol:.3g} × cutoff: the Ritz values "
                f"at the cutoff are determined only to {noise:.3g}")
        d = int(np.count_nonzero(ritz <= tol))
        window = ritz <= WINDOW * tol
        straddles = active[-1] > STRADDLE * tol or p == q
        rtol = max(RITZ_RTOL, 10.0 * noise)
        change = np.inf
        moved = None
        if prev is not None and prev.size == ritz.size:
            moved = np.abs(ritz - prev) / ritz
            change = float(np.max(moved[window], initial=0.0))
        # converged: the last change within rtol, or (geometric convergence at
        # rate ρ = change / previous change <= RATE_MAX) the distance to the
        # limit it predicts, change·ρ/(1 − ρ)
        rate = (change / prev_change if np.isfinite(prev_change) and prev_change > 0
                else np.inf)
        # the values compared within SETTLE_LOSS; the rate's older change within
        # RATE_LOSS of the loss before it (a rough first step's values are not read)
        exact = len(losses) >= 2 and max(losses[-2:]) <= SETTLE_LOSS
        rated = exact and len(losses) >= 3 and losses[-3] <= RATE_LOSS * prev_change
        settled = exact and d == prev_d and (change <= rtol or (
            rated and rate <= RATE_MAX and change * rate / (1.0 - rate) <= rtol / RATE_MARGIN))
        prev_change = change
        if settled and straddles:
            return _finish(L, Lz, lritz, X, Z, B, active, tol, step, p, lanes)
        if not straddles and step >= 2:
            p_new = min(q, 2 * p)
            if p_new > max_block:
                raise SubspaceTooLarge(
                    f"block of {p} columns: largest Ritz value "
                    f"{ritz[-1] / tol:.3g} × cutoff")
            X = lanes.gemm(X, B)
            LX = _hcat(L, X)
            extra = rng.standard_normal((q, p_new - p))
            extra -= lanes.gemm(LX, lanes.gemm(LX, extra, trans_a=True))
            X, M, x_loss = orth_r(_hcat(X, extra), lanes)[0], None, EPS
            p, prev, prev_d, prev_change, losses = p_new, None, -1, np.inf, []
            continue
        prev, prev_d = ritz, d
        k = 0
        # locked vectors as orthonormal as the settled ones', their moves read
        # within LOCK_RTOL
        if moved is not None and straddles and losses[-1] <= SETTLE_LOSS and \
                losses[-2] <= LOCK_RTOL * RATE_LOSS:
            k = _lockable(active, moved[lritz.size:], tol, X.shape[1])
        if k:
            Bk = np.asfortranarray(B[:, :k])
            L = _hcat(L, lanes.gemm(X, Bk))
            Lz = _hcat(Lz, lanes.gemm(Z, Bk))
            lritz = np.concatenate([lritz, active[:k]])
        # R⁻¹ R⁻ᵀ X W = R⁻¹ P Θ
        Y = np.asarray(inv(lanes.gemm(Z, np.asfortranarray(B[:, k:]))))
        if not np.all(np.isfinite(Y)):
            raise SubspaceTooLarge("non-finite triangular solve")
        if L.shape[1]:
            Y = _deflate(L, Y, lanes)
        X, M, x_loss = _orth_deferred(Y, lanes, rough=step == 1)
    raise SubspaceTooLarge(f"no convergence in {MAX_STEPS} steps (block {p})")


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
        sub = small_subspace(
            lambda Y: la.solve_triangular(R, Y, trans=0, lower=False, check_finite=False),
            lambda Y: la.solve_triangular(R, Y, trans=1, lower=False, check_finite=False),
            q, self.tol, block=self.block, max_block=self.max_block, seed=self.seed)
        X = sub.vectors
        self.ritz, self.steps, self.block_used = sub.ritz, sub.steps, sub.block
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
