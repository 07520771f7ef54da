"""lstsq's rank of a dense square triangle with a modest null space, on NumPy or CuPy.

Used by :class:`scipy_gpuqr._factor.lstsq.MinNormSolver` where R's dense rank work
runs on a GPU and R (square, nonzero diagonal, dense on the device: up to lstsq's
``DENSE_LIMIT``, and beyond where it fits there) hides its deficiency from its
pivots: tens to a few hundred singular values under the cutoff, none of R's pivots
there (nnc1374: 66 under it, σ_{r} = 4.8 × the cutoff,
σ_{r+1} = 0.84 ×). Heath's greedy rule (the gap-checked sparse COD) misses them and
a full SVD of R is the dearest dense step (``gesvd`` of all of R). Here only the block
of R's small singular triplets is computed, from R's dense triangle ``R`` on the
array module ``xp`` it lies on, so the same code runs on the host (NumPy, tested
there) and on the device (CuPy: cuBLAS ``trsm`` and GEMMs, CholeskyQR2 of tall
blocks, a p × p SVD on the host per step).

Method
------
1. **Block inverse subspace iteration** on ``(RᵀR)⁻¹``: ``X ← orth(R⁻¹ orth(R⁻ᵀ X))``
   with p columns (two triangular solves; orthonormalized between them, so that
   the first solve's rounding along the smallest singular vectors, ``eps·κ(R)``
   relative, is not amplified by the second). **Rayleigh–Ritz on R itself**:
   ``R X = P Σ Wᵀ``, Ritz values σ_i ascending and vectors ``X W``, which the
   next step starts from. Ritz values from ``R X`` are upper bounds of R's
   smallest singular values (σ_{q−i+1} <= σ_i by Courant–Fischer) and their
   rounding is absolute (that of the product, ``eps·|R||X|``), so the values near
   the cutoff are resolved however small the smallest singular values are (Ritz
   values of the inverse would be resolved only to ``eps·tol/σ_min`` relative).
   Σ and W come from the eigenpairs of the p × p Gram matrix ``(R X)ᵀ(R X)``
   (one product on the device, ``syevd`` on the host) where its rounding,
   ``γ_q ‖R X‖_F²``, stays :data:`GRAM_RESOLUTION` × tol² or less and
   :data:`GRAM_SEPARATION` times under the smallest eigenvalue: then every Ritz
   value near the cutoff is resolved far below lstsq's own rounding
   (``eps·σ_max``) and each Ritz vector apart from the others as the next solve
   needs; otherwise from the SVD of the triangle of a thin QR of ``R X``, whose
   rounding is not squared. The block grows (doubling, new random columns) until
   its largest Ritz value exceeds :data:`STRADDLE` × the cutoff; it has settled
   when the count d of Ritz values under the cutoff is the last step's and the
   span of their vectors moved by at most :data:`SUBSPACE_RTOL`, or stopped
   moving less at the rate the straddling block guarantees (its rounding,
   :data:`NOISE_CEILING`), or, where σ_max is given, when its distance from R's
   subspace, estimated from the last two moves (a geometric rate), lies
   :data:`SETTLE_SHARE` × under what rounding R by ``eps·σ_max`` leaves that
   subspace in any method (Wedin: ``eps·σ_max / (σ_{d+1} − σ_d)``).
   **What a block of R's solves resolves.** The iteration (and the probe below)
   sees R's small singular directions only through R's triangular solves, each
   column of a block normalized, its rounding ``eps`` relative to its largest
   component. A direction a solve amplifies by ``a`` is resolved beside the most
   amplified one (``a_max``) only to ``eps·a_max/a``, and the directions that decide
   the rank, those at the cutoff, are amplified by about ``1/tol``: where a solve's
   growth on the block's orthonormal columns exceeds :data:`GROWTH_RESOLUTION`
   ``/(eps·tol)`` they are lost in its rounding. Exact arithmetic bounds the growth
   by ``1/σ_min``, one exact dependence (a pivot at its column's rounding) by about
   ``1/(eps·σ_max)``, far under the limit; several such pivots, one's quotient
   (rounding over rounding) feeding the next's through the columns between them,
   multiply their growths, and the block keeps only the most amplified of R's null
   directions: the Ritz values of those it lost are not under the cutoff, and the
   probe of ``‖S‖₂``, made of the same solves, does not see them either. The rank
   would come out too high with a certificate that holds for the solves, not for R
   (rajat01 factorized on the GPU: pivots at their columns' rounding, 56 singular
   values under the cutoff, 47 found; its solves grow by far more than
   ``1/(eps·tol)``). Such a growth refuses at once
   (:class:`~scipy_gpuqr._errors.SubspaceTooLarge`), and the decisions that do not
   divide by R's pivots (the dense COD's Householder QR, the SVD) answer.
2. **The certificate of a clear gap.** The d Ritz values at most ``tol`` bound d
   singular values at most the cutoff (upper bounds, as the gap-checked sparse
   COD's ``‖E‖₂ <= tol`` does). For the others, with
   ``V_d`` the d Ritz vectors and ``U_d = orth(R⁻ᵀ V_d)``, the vectors
   orthogonal to ``V_d`` are mapped by R onto those orthogonal to ``U_d``, so
   ``S = P_V R⁻¹ P_U`` (``P_U = I − U_dU_dᵀ``; ``P_V`` removes what rounding
   amplified along V_d) has ``‖S‖₂ = 1/σ_min(R restricted to V_d^⊥)``, and
   ``σ_{q−d} >= 1/‖S‖₂`` (Courant–Fischer: σ_{q−d} is the largest such minimum
   over subspaces of dimension q − d). A randomized power estimate ν of ``‖S‖₂``
   (:func:`~scipy_gpuqr._factor.solve_rank.probe_norm`, Gaussian start, margin
   M: ``‖S‖ <= M ν`` except with probability 1e-10 per step) with
   ``M·ν·GAP_MARGIN·tol < 1`` shows ``σ_{q−d} > GAP_MARGIN·tol``; and ``ν·σ_{d+1}``
   (Ritz) at most :data:`LEAK_FACTOR` shows that S does not leak the amplified
   components (inaccurate subspaces make ``‖S‖`` far larger). Where either side
   fails (no clear gap, the block too large, no convergence) the decision
   refuses (:class:`~scipy_gpuqr._errors.SubspaceTooLarge`) and the caller's
   SVD decides.
3. **Minimum-norm solves**: ``x = S c`` refined once with R's residual,
   ``x += S (c − R x)`` (for ``G = Rᵀ`` the transpose, ``Sᵀ = P_U R⁻ᵀ P_V`` with
   ``V = orth(R⁻¹ U_d)``): the truncated SVD's solution up to the subspaces'
   accuracy, as :mod:`scipy_gpuqr._factor.sparse_subspace` solves it.

Cost: per step two triangular solves and one product with p columns (``3·p·q²``
flops), two thin QRs of q × p and a p × p Gram matrix; then a solve with d columns,
the probe (at most eleven solves with :data:`PROBE_COLUMNS` columns), and per
right-hand side four solves. No q³ work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import scipy.linalg as la

from .._errors import SubspaceTooLarge
from .dense_cod import solve_triangular
from .solve_rank import block_ops, probe_norm

__all__ = ["DenseSubspaceCOD", "SubspaceTooLarge", "BLOCK", "STRADDLE", "SUBSPACE_RTOL",
           "NOISE_CEILING", "FLOOR_RATIO", "SETTLE_SHARE", "SETTLE_MAX_RATE",
           "GRAM_RESOLUTION", "GRAM_SEPARATION", "GROWTH_RESOLUTION", "MAX_STEPS",
           "GAP_MARGIN", "LEAK_FACTOR", "PROBE_COLUMNS", "PROBE_STEPS"]

#: First block of the iteration (at most a third of R's order).
BLOCK = 128

#: The block's largest Ritz value must exceed STRADDLE × the cutoff.
STRADDLE = 2.0

#: The iteration has settled once the span of the Ritz vectors under the cutoff moves
#: by at most SUBSPACE_RTOL in a step (``‖V₁ − V₀V₀ᵀV₁‖_F``): the solution then moves by
#: about that much relative, far below its own rounding in any method, ``eps·σ_max/σ_r``
#: (nnc1374: 1.5e-4) ...
SUBSPACE_RTOL = 1e-7

#: ... or by at most NOISE_CEILING and at least FLOOR_RATIO times its last move: it is
#: at its rounding (2e-8 on nnc1374, 6e-8 to 3e-7 on random triangles of order 300),
#: where before it moved less at a rate of ``(σ_d/σ_{p+1})²`` per step, at most
#: ``(1/STRADDLE)²`` = 0.25 once the block straddles.
NOISE_CEILING = 1e-5
FLOOR_RATIO = 0.5

#: Where σ_max is given, the iteration has also settled once its subspace's estimated
#: distance from R's (the last move times the rate of the last two, ``ρ/(1 − ρ)``: the
#: moves still to come) is at most SETTLE_SHARE × ``eps·σ_max / (σ_{d+1} − σ_d)``, the
#: distance rounding R leaves that subspace at in any method, the SVD's included
#: (nnc1374: 1.9e-4; the SVD's own subspace lies 2.0e-4 from the iteration's, and x
#: moves by 5e-5 where lstsq's and the SVD's differ by 2.6e-3) ...
SETTLE_SHARE = 0.1
#: ... with that rate below SETTLE_MAX_RATE (a run converging at it; nnc1374 0.007-0.01).
SETTLE_MAX_RATE = 0.25

#: Largest rounding of the Gram matrix ``(R X)ᵀ(R X)``, ``γ_q ‖R X‖_F²``, in units of
#: tol², for the Ritz pairs from its eigenpairs: a Ritz value near the cutoff then lies
#: within ``GRAM_RESOLUTION / 2`` of its own relative (lstsq's rounding is ``1/max(m, n)``
#: of the cutoff) ...
GRAM_RESOLUTION = 1e-6
#: ... and the smallest eigenvalue must be this many times that rounding: each Ritz
#: vector then lies within ``1/GRAM_SEPARATION`` relative of its own where the next
#: solve scales it by ``1/σ_i`` (a spectrum down to rounding level, an exact
#: dependence, takes the thin QR and its SVD).
GRAM_SEPARATION = 1e4

#: Largest ``eps·a·tol`` for a solve's growth ``a`` (the largest column norm of the
#: solve of an orthonormal block): the directions at the cutoff, amplified by about
#: ``1/tol``, are then resolved beside the most amplified ones to that (module notes).
GROWTH_RESOLUTION = 1e-3

#: Steps after which the iteration gives up: once the block straddles the cutoff its
#: subspace under the cutoff converges at 0.25 per step or faster.
MAX_STEPS = 16

#: The clear gap: the probe's bound of σ_{q−d} above GAP_MARGIN·tol (lstsq decides on
#: its own computed singular values, which differ from R's by rounding; lstsq's
#: ``_DENSE_SIGMA_MARGIN`` for its σ tests).
GAP_MARGIN = 1.05

#: Largest ``ν·σ_{d+1}`` (ν the probe's estimate of ``‖S‖₂``, σ_{d+1} the first Ritz
#: value above the cutoff) accepted: 1 for exact subspaces.
LEAK_FACTOR = 2.0

#: Columns and most power steps of the probe of ``‖S‖₂`` (margins at q = 1374: 76, 4.2,
#: 2.4, 1.9, 1.6, 1.5 after one to six steps; it stops at the first that passes): gaps
#: from about 1.6 × the cutoff are certified.
PROBE_COLUMNS = 32
PROBE_STEPS = 6


_EPS = float(np.finfo(np.float64).eps)


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


@dataclass
class DenseSubspaceCOD:
    """lstsq's rank and minimum-norm solves of G = R or Rᵀ from R's small singular subspace.

    Parameters
    ----------
    R : ndarray or cupy.ndarray, shape (q, q)
        Dense upper triangular, nonzero diagonal (kept, not changed: the solves use it).
    tol : float
        lstsq's absolute cutoff (``eps·max(m, n)·σ_max``): singular values at most it
        are dropped.
    transposed : bool
        Solve with ``G = Rᵀ``.
    block, max_block : int
        First and largest block of the iteration.
    seed : int
        Seed of the random blocks.
    sigma_max : float, optional
        R's largest singular value (lstsq's σ_max): the iteration may then settle by
        the rounding it leaves R's subspace at (:data:`SETTLE_SHARE`); 0 or less,
        only by :data:`SUBSPACE_RTOL` and :data:`NOISE_CEILING`.
    require_gap : bool
        Keep the rank only where the gap at the cutoff is certified (the caller's SVD,
        exactly lstsq's rule, decides otherwise). False: the rank of the Ritz values
        under the cutoff, gap or not, where the projections do not leak (``ν·σ_{d+1}``
        at most :data:`LEAK_FACTOR`): the truncated SVD's rank and solution up to the
        Ritz values' accuracy, the acceptance of the host's subspace decisions
        (:mod:`scipy_gpuqr._factor.sparse_subspace`), for an R whose SVD costs far more
        than they.

    Raises
    ------
    SubspaceTooLarge
        No decision here: the block would exceed ``max_block``, the iteration did not
        settle in :data:`MAX_STEPS` steps, a solve was not finite or grew beyond what
        the block resolves at the cutoff (:data:`GROWTH_RESOLUTION`), the projections
        leak, or (``require_gap``) the gap at the cutoff is not certified (see the
        module notes); the caller's SVD decides.

    Attributes
    ----------
    rank : int
        ``q − d``.
    ritz : ndarray
        The block's Ritz values (ascending), upper bounds of R's smallest singular values.
    sigma_min : float
        The first Ritz value above the cutoff (an estimate of σ_r; inf where none).
    nu, margin : float
        The probe's estimate of ``‖S‖₂`` and its margin.
    steps, block_used : int
        Iteration steps and the final block.
    growth : float
        The largest growth of a solve of the iteration's orthonormal blocks (a lower
        bound of ``‖R⁻¹‖₂`` as the solves compute it).
    """

    R: object
    tol: float
    transposed: bool = False
    block: int = BLOCK
    max_block: int = 1024
    seed: int = 0
    sigma_max: float = 0.0
    require_gap: bool = True
    rank: int = field(init=False, default=0)
    ritz: np.ndarray = field(init=False, default=None, repr=False)
    sigma_min: float = field(init=False, default=float("nan"))
    nu: float = field(init=False, default=float("nan"))
    margin: float = field(init=False, default=float("inf"))
    steps: int = field(init=False, default=0)
    block_used: int = field(init=False, default=0)
    growth: float = field(init=False, default=0.0)
    changes: list = field(init=False, default_factory=list, repr=False)
    _ops: object = field(init=False, default=None, repr=False)
    _u: object = field(init=False, default=None, repr=False)
    _v: object = field(init=False, default=None, repr=False)
    # the probe's start (Ω and its first image), made beside U_d's solve
    _start: Optional[tuple] = field(init=False, default=None, repr=False)

    def __post_init__(self):
        q = int(self.R.shape[0])
        if self.R.ndim != 2 or int(self.R.shape[1]) != q or q < 2 or not self.tol > 0:
            raise SubspaceTooLarge(f"not a square triangle with a cutoff: {self.R.shape}")
        self._ops = block_ops(_module_of(self.R))
        X, ritz = self._iterate(q)
        d = int(np.count_nonzero(ritz <= self.tol))
        self.ritz = ritz
        self.sigma_min = float(ritz[d]) if d < ritz.size else float("inf")
        if d == 0:
            raise SubspaceTooLarge("no singular value under the cutoff in the block")
        if self.require_gap and not self.sigma_min > GAP_MARGIN * self.tol:
            raise SubspaceTooLarge(f"σ_(q-d) at most {self.sigma_min / self.tol:.3g} x the "
                                   "cutoff: no clear gap")
        self._subspaces(X, d)
        self._certify(q)
        self.rank = q - d

    # -- step 1: the iteration -------------------------------------------------
    def _inv(self, C):
        return self._ops.dense(self._solve(C, trans=False))

    def _inv_t(self, C):
        return self._ops.dense(self._solve(C, trans=True))

    def _solve(self, C, trans: bool):
        """``R⁻¹ C`` (``R⁻ᵀ C``). A C-contiguous R on the device is solved through its
        transpose, an F-contiguous view of the same memory (lower triangular), which
        cuBLAS reads in place: cupyx copies a C-contiguous triangle to Fortran order
        at every solve (LAPACK's wrapper on the host solves the transposed system
        itself)."""
        R = self.R
        if _module_of(R) is not np and R.flags.c_contiguous and not R.flags.f_contiguous:
            from cupyx.scipy.linalg import solve_triangular as dev_solve  # optional dependency
            return dev_solve(R.T, C, trans=0 if trans else 1, lower=True)
        return solve_triangular(R, C, trans=trans)

    def _orth(self, Y, solved: bool = False):
        """Orthonormal basis of Y's columns, each scaled to unit norm first (the blocks'
        columns are nearly orthogonal, of very different lengths). ``solved``: Y is a
        solve of an orthonormal block, whose column norms are the solve's growth:
        beyond :data:`GROWTH_RESOLUTION` ``/(eps·tol)`` the directions at the cutoff
        are lost in its rounding (module notes) and the decision refuses."""
        ops = self._ops
        norms, bad = ops.norms(Y)
        n = _host(norms)
        if _host(bad).any() or not np.all(n > 0):
            raise SubspaceTooLarge("non-finite or zero block")
        if solved:
            self.growth = max(self.growth, float(n.max()))
            if not _EPS * self.growth * self.tol <= GROWTH_RESOLUTION:
                raise SubspaceTooLarge(
                    f"a solve grows by {self.growth:.3g}: directions at the cutoff lie "
                    f"under its rounding (eps·growth·tol = "
                    f"{_EPS * self.growth * self.tol:.3g})")
        return ops.dense(ops.orth(ops.scaled(Y, norms), want_r=False)[0])

    def _ritz(self, X) -> tuple:
        """``(Σ, Wᵀ)`` of ``R X = P Σ Wᵀ`` (ascending Σ, host arrays): from the Gram
        matrix's eigenpairs where its rounding allows (:meth:`_ritz_by_gram`), else
        from the SVD of R X's triangle."""
        ops = self._ops
        RX = ops.dense(self.R @ X)
        got = self._ritz_by_gram(RX)
        if got is not None:
            return got
        norms, bad = ops.norms(RX)
        n = _host(norms)
        if _host(bad).any():
            raise SubspaceTooLarge("non-finite product")
        n = np.where(n > 0, n, 1.0)
        T = _host(ops.orth(ops.scaled(RX, _module_of(X).asarray(n)))[1]) * n
        _, s, Wt = la.svd(T, full_matrices=False, check_finite=False, lapack_driver="gesdd")
        return s[::-1].copy(), Wt[::-1].copy()

    def _ritz_by_gram(self, RX) -> Optional[tuple]:
        """``(Σ, Wᵀ)`` from the eigenpairs of ``G = (R X)ᵀ(R X)`` (one product, a p × p
        read and ``syevd`` on the host), or None where G's rounding ``γ_q ‖R X‖_F²``
        (``γ_q = q·eps``) exceeds :data:`GRAM_RESOLUTION` × tol² or
        1/:data:`GRAM_SEPARATION` of G's smallest eigenvalue, or G is not finite."""
        G = np.asarray(self._ops.gram(RX), dtype=np.float64)
        if not np.all(np.isfinite(G)):
            return None
        noise = RX.shape[0] * _EPS * float(np.trace(G))
        if not noise <= GRAM_RESOLUTION * self.tol * self.tol:
            return None
        lam, W = la.eigh(G, driver="evd", check_finite=False)
        if not lam[0] >= GRAM_SEPARATION * noise:
            return None
        return np.sqrt(lam), np.ascontiguousarray(W.T)

    def _rounding(self, ritz, d: int) -> float:
        """``eps·σ_max / (σ_{d+1} − σ_d)`` from the Ritz values: how far rounding R leaves
        its subspace under the cutoff in any method (0 where σ_max was not given)."""
        if not (self.sigma_max > 0 and 0 < d < ritz.size and ritz[d] > ritz[d - 1]):
            return 0.0
        return _EPS * self.sigma_max / float(ritz[d] - ritz[d - 1])

    def _moved(self, V0, V1) -> float:
        """``‖V1 − V0 V0ᵀ V1‖_F``: how far the span of the orthonormal ``V1`` lies from
        that of ``V0`` (at least the sine of their largest angle)."""
        ops = self._ops
        return float(ops.fro(ops.project(V0, V1)))

    def _rotated(self, X, Wt):
        xp = _module_of(X)
        return self._ops.dense(X @ xp.asarray(np.ascontiguousarray(Wt.T)))

    def _iterate(self, q: int) -> tuple:
        """The converged block ``(X, ritz)``: X's columns the Ritz vectors, ascending."""
        ops, tol = self._ops, self.tol
        max_block = max(1, min(self.max_block, q))
        p = min(q, max(1, self.block), max_block)
        X = self._orth(ops.gaussian(self.seed, (q, p)))
        prev, prev_d, prev_change = None, -1, np.inf
        for step in range(1, MAX_STEPS + 1):
            self.steps = step
            # orthonormalized between the two solves: each solve's rounding along the
            # smallest singular vectors (eps·κ relative) is removed by the next
            # orthonormalization instead of being amplified by the second solve
            X = self._orth(self._inv(self._orth(self._inv_t(X), solved=True)), solved=True)
            ritz, Wt = self._ritz(X)
            X = self._rotated(X, Wt)
            if not np.all(np.isfinite(ritz)):
                raise SubspaceTooLarge("non-finite Ritz values")
            d = int(np.count_nonzero(ritz <= tol))
            if not (ritz[-1] > STRADDLE * tol or p == q):
                # the Ritz values bound the block's singular values from above: all of
                # them at most STRADDLE·tol, the block is too small for the window
                p_new = min(q, 2 * p)
                if p_new > max_block:
                    raise SubspaceTooLarge(f"block of {p} columns: largest Ritz value "
                                           f"{ritz[-1] / tol:.3g} x the cutoff")
                extra = ops.gaussian(self.seed + step, (q, p_new - p))
                X = self._orth(ops.stacked(X, ops.project(X, extra)))
                p, prev, prev_d, prev_change = p_new, None, -1, np.inf
                continue
            Vd = ops.split(X, d)[0] if d else None
            change = self._moved(prev, Vd) if prev is not None and d == prev_d else np.inf
            self.changes.append(change)
            # settled: the subspace of the Ritz vectors under the cutoff moved by at
            # most SUBSPACE_RTOL, or at its rounding (it no longer moves less at the
            # rate the straddling block guarantees), or the moves still to come at the
            # last two's rate stay well under what rounding R leaves that subspace at
            rate = (change / prev_change if np.isfinite(change) and np.isfinite(prev_change)
                    and prev_change > 0 else np.inf)
            ahead = change * rate / (1.0 - rate) if rate < SETTLE_MAX_RATE else np.inf
            if d and (change <= SUBSPACE_RTOL or (
                    change <= NOISE_CEILING and change >= FLOOR_RATIO * prev_change)
                    or ahead <= SETTLE_SHARE * self._rounding(ritz, d)):
                self.block_used = p
                return X, ritz
            prev, prev_d, prev_change = Vd, d, change
        raise SubspaceTooLarge(f"no convergence in {MAX_STEPS} steps (block {p})")

    # -- step 2: the subspaces and the certificate -------------------------------
    def _subspaces(self, X, d: int) -> None:
        """``U_d = orth(R⁻ᵀ V_d)`` (and ``V = orth(R⁻¹ U_d)`` for Rᵀ), the last of the
        two solves taking the probe's Gaussian start Ω as more columns: its first
        image, ``Sᵀ Ω = P_U R⁻ᵀ (P_V Ω)`` for R (``S Ω = P_V R⁻¹ (P_U Ω)`` for Rᵀ), is
        then had without a solve of its own (:meth:`_certify`)."""
        ops = self._ops
        q = int(X.shape[0])
        Vd = ops.split(X, d)[0]
        omega = ops.gaussian(self.seed + 7919, (q, min(PROBE_COLUMNS, q)))
        if self.transposed:
            U = self._orth(self._inv_t(Vd))
            Y, Z = ops.split(self._inv(ops.stacked(U, ops.project(U, omega))), d)
            V = self._orth(ops.dense(Y))
            self._start = (omega, ops.project(V, ops.dense(Z)))
        else:
            Y, Z = ops.split(self._inv_t(ops.stacked(Vd, ops.project(Vd, omega))), d)
            U, V = self._orth(ops.dense(Y)), Vd
            self._start = (omega, ops.project(U, ops.dense(Z)))
        self._u, self._v = U, V

    def _certify(self, q: int) -> None:
        """The probe of ``‖S‖₂`` (power method on ``S Sᵀ`` for R, on ``Sᵀ S`` for Rᵀ:
        either has ``‖S‖₂²`` as its norm), from the start :meth:`_subspaces` made."""
        tol = self.tol
        start, self._start = self._start, None
        first, second = ((self._apply_t, self._apply) if self.transposed
                         else (self._apply, self._apply_t))
        self.nu, self.margin = probe_norm(
            first, second, q, xp=_module_of(self.R), seed=self.seed + 7919,
            columns=PROBE_COLUMNS, steps=PROBE_STEPS, start=start,
            accept=lambda nu, m: m * nu * GAP_MARGIN * tol < 1.0)
        if not (np.isfinite(self.nu) and self.nu > 0):
            raise SubspaceTooLarge("non-finite solve in the probe")
        if self.require_gap and not self.margin * self.nu * GAP_MARGIN * tol < 1.0:
            raise SubspaceTooLarge(f"σ_(q-d) not shown above {GAP_MARGIN:g} x the cutoff "
                                   f"(probe: 1/(Mν) = {1 / (self.margin * self.nu * tol):.3g} x)")
        leak = self.nu * self.sigma_min
        if not leak <= LEAK_FACTOR:
            raise SubspaceTooLarge(f"‖S‖·σ_(q-d) = {leak:.3g}: the projections leak")

    # S = P_V R⁻¹ P_U and Sᵀ = P_U R⁻ᵀ P_V
    def _apply(self, C):
        ops = self._ops
        return ops.project(self._v, self._inv(ops.project(self._u, ops.dense(C))))

    def _apply_t(self, C):
        ops = self._ops
        return ops.project(self._u, self._inv_t(ops.project(self._v, ops.dense(C))))

    # -- step 3: solves -----------------------------------------------------------
    def solve(self, C) -> np.ndarray:
        """Minimum-norm ``Y`` with ``G Y ≈ C`` under the cutoff; C (host) of shape (q, p).

        ``Y = S C`` (``Sᵀ C`` for Rᵀ), then one step ``Y += S (C − G Y)`` with G's
        own residual. The result is a host array."""
        C = np.asarray(C, dtype=np.float64)
        if C.ndim == 1:
            C = C[:, None]
        q = int(self.R.shape[0])
        if C.shape[1] == 0:
            return np.zeros((q, 0))
        xp = _module_of(self.R)
        apply = self._apply_t if self.transposed else self._apply
        Cd = self._ops.dense(xp.asarray(np.ascontiguousarray(C)))
        Y = apply(Cd)
        G = self.R.T if self.transposed else self.R
        Y = Y + apply(Cd - G @ Y)
        return np.ascontiguousarray(_host(Y))


def _module_of(a):
    """NumPy or CuPy: the module of array ``a``."""
    if type(a).__module__.startswith("cupy"):
        import cupy                 # optional dependency
        return cupy
    return np
