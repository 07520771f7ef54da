"""lstsq's rank and minimum-norm solves of a large square R through its triangular solves.

Used by :class:`scipy_gpuqr._factor.lstsq.MinNormSolver` on the host where the
rank must be decided on R itself without a gap at the cutoff (Heath's rule
and the null-space COD cannot decide: bayer10), for square R with a nonzero
diagonal. It needs only ``C ↦ R⁻¹C``, ``C ↦ R⁻ᵀC`` and ``Y ↦ R Y``: R kept
sparse, solved by the compiled row-major sweeps of
:mod:`scipy_gpuqr._factor.native` (R's CSC arrays read once per block, for
R and Rᵀ alike), or where that library is not at hand by SuperLU's
(:class:`~scipy_gpuqr._factor.triangular.UpperTriangular` of R, and of Rᵀ for
``R⁻ᵀ``, its untransposed sweep being the faster one) in pieces of
:data:`SOLVE_CHUNK` columns; nothing of size q² is formed (unless R is
itself dense, :data:`DENSE_SOLVES_DENSITY`: then BLAS triangular solves).
The pieces, and the row pieces of the q × p products, run on one thread per
core (:mod:`scipy_gpuqr._factor.host_lanes`) with BLAS held to one thread.
Cost: per step of the iteration two solves with p columns (``4·p·nnz(R)``
flops) and a few q × p Gram products, products and triangular solves
(``≈ 4·q·p²``); per right-hand side two solves and eight projections on
q × d blocks. The dense alternative (:mod:`scipy_gpuqr._factor.subspace_cod`)
forms R (q² doubles) and re-triangularizes it in ``O(q²·d)``.

Method:

1. **Small singular subspace**: :func:`~scipy_gpuqr._factor.subspace_cod.small_subspace`
   (block inverse subspace iteration with Rayleigh–Ritz, the rules and
   constants of :mod:`scipy_gpuqr._factor.subspace_cod`) gives the Ritz
   values ``ritz`` and the right Ritz vectors; ``d`` = the number of Ritz
   values ``<=`` tol (lstsq's nullity), ``V_d`` their vectors.
2. **The rank-r problem without deflating R.** For ``x ⟂ V_d`` the products
   ``R x`` are exactly the vectors orthogonal to ``R⁻ᵀ V_d`` (``(R⁻ᵀV_d)ᵀ R x
   = V_dᵀ x = 0``, and both spaces have dimension q − d). So with ``U_d =
   orth(R⁻ᵀ V_d)`` the least-squares problem ``min ‖R x − c‖, x ⟂ V_d`` is
   solved by ``x = R⁻¹ P_U c`` (``P_U = I − U_d U_dᵀ``): the same solution
   as the dense path's ``x = W (R W)⁺ c`` with ``W ⟂ V_d``, i.e. the
   truncated SVD's up to the Ritz vectors' accuracy. For ``G = Rᵀ`` the
   roles swap: ``y ⟂ U_d`` and ``y = R⁻ᵀ P_V c`` with ``V_d' = orth(R⁻¹ U_d)``.
3. **Rounding**: the solve with R is backward stable, so its error along
   the tiny singular directions is amplified by ``1/σ_i``; those directions
   are ``V_d``'s, which ``P_V`` (applied after the solve, twice: the
   projected block's components are large) removes:
   ``S = P_V R⁻¹ P_U`` (``Sᵀ = P_U R⁻ᵀ P_V`` for Rᵀ). What the projection
   leaves (the Ritz vectors' error times the amplified component) lies in
   the kept directions, where R's residual sees it: one refinement step
   ``x += S (c − G x)`` takes it to the truncated problem's rounding level.
4. **Check**: ``‖S‖₂`` must be ``1/σ_r`` (σ_r the smallest kept Ritz value);
   a leak of the amplified components makes it far larger. A randomized
   power estimate (:func:`~scipy_gpuqr._factor.solve_rank.probe_norm`, a
   lower bound of ``‖S‖``) above :data:`LEAK_FACTOR`/σ_r refuses
   (:class:`~scipy_gpuqr._errors.SubspaceTooLarge`), and the dense rules answer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp

from .._cpu.blas_threads import one_blas_thread
from .._dispatch.plan import available_host_memory
from .._errors import SubspaceTooLarge
from .host_lanes import SERIAL, Lanes, host_lanes
from .native import SparseUpperSolves
from .native import handle as native_handle
from .nogil_blas import trsm_upper
from .solve_rank import probe_norm
from .subspace_cod import gemm, orth_r, sigma_max_lanczos, small_subspace
from .triangular import SUPERLU_MAX_NNZ, UpperTriangular

__all__ = ["SparseSubspaceCOD", "decide", "chunked", "one_blas_thread", "LEAK_FACTOR",
           "SOLVE_CHUNK", "DENSE_SOLVES_DENSITY", "DENSE_SOLVE_CHUNK", "DIAG_HINT", "BLOCK_COPIES",
           "HOST_MEMORY_FRACTION", "NARROW_COLUMNS"]

#: Largest ``‖S‖₂·σ_r`` (lower estimate) accepted: exactly 1 for exact subspaces.
LEAK_FACTOR = 2.0

#: q × p blocks alive at once in the iteration (X, Z, Y, scaled copies, products),
#: and the fraction of the host's available memory they may take: the block
#: limit is lowered to fit.
BLOCK_COPIES = 8
HOST_MEMORY_FRACTION = 0.25

#: Columns per sparse triangular solve: SuperLU's sweeps run over all
#: right-hand sides per column of R, and slow down once the block leaves the
#: cache.
#: The compiled sweeps (which read R once per piece) take the lanes' own split.
SOLVE_CHUNK = 32


#: Fraction of nonzero entries of the upper triangle from which R is formed
#: densely and solved with BLAS-3 triangular solves (a sparse sweep runs a
#: few GFlop/s, ``trsm`` ten times that).
DENSE_SOLVES_DENSITY = 0.1

#: Blocks of fewer columns are projected by single BLAS calls, not on the lanes:
#: a product with a few columns reads B at memory speed either way, and the
#: lanes' row pieces and the sum of their Gram pieces cost more than they share
#: (the leak probe's 8 columns).
NARROW_COLUMNS = 16

#: Columns per dense triangular solve on a lane (each piece reads all of R:
#: fewer, wider pieces than the sparse sweeps').
DENSE_SOLVE_CHUNK = 64

#: Pivots ``|r_ii|`` up to this many times the cutoff size the first block too
#: (their count plus the increment, where that exceeds twice the count of the
#: pivots at most the cutoff; at most twice that block): a deficiency that R's
#: diagonal hides (no pivot under the cutoff, many just above it) would otherwise
#: be found only once a block too small to straddle it has cost two steps, and
#: the doubled block starts again from new random columns. The bound keeps a
#: diagonal crowded near the cutoff over few small singular values from costing
#: more than the one doubling it spares.
DIAG_HINT = 10.0


def chunked(solve: Callable, chunk: int = SOLVE_CHUNK, lanes: Lanes = SERIAL) -> Callable:
    """``solve`` applied to column pieces of at most ``chunk`` columns (shared
    among ``lanes``' threads)."""
    return lanes.columns(solve, chunk)




def _project(B: np.ndarray, C: np.ndarray, lanes: Lanes = SERIAL) -> np.ndarray:
    """``(I − B Bᵀ) C`` twice (reorthogonalization: C's components along B are large);
    a block of fewer than :data:`NARROW_COLUMNS` columns as single BLAS calls."""
    if C.shape[1] < NARROW_COLUMNS:
        lanes = SERIAL
    for _ in range(2):
        C = C - gemm(B, gemm(B, C, trans_a=True, lanes=lanes), lanes=lanes)
    return C


@dataclass
class SparseSubspaceCOD:
    """Minimum-norm solves with G = R or Rᵀ under lstsq's absolute cutoff, R left as it is.

    Parameters
    ----------
    inv, inv_t : callable
        ``C ↦ R⁻¹C`` and ``C ↦ R⁻ᵀC`` on (q, p) float64 arrays (host).
    matmul : callable
        ``(Y, transposed) ↦ G Y`` with ``G = Rᵀ`` when ``transposed`` (R's residuals).
    q : int
        Order of R.
    tol : float
        Absolute cutoff: singular values ``<= tol`` are dropped.
    transposed : bool
        Solve with ``G = Rᵀ``.
    block, max_block : int
        First and largest block of the iteration.
    seed : int
        Seed of the random blocks.
    lanes : Lanes
        Threads for the decision's block solves and q × p products
        (:mod:`scipy_gpuqr._factor.host_lanes`); given back to one lane once
        the decision is made (the threads do not outlive it).
    chunk : int, optional
        Columns per call of ``inv``/``inv_t`` (:data:`SOLVE_CHUNK` for SuperLU's
        sweeps); None: one call per lane.

    Raises
    ------
    SubspaceTooLarge
        The iteration needs a block over ``max_block`` or does not settle, or
        the check of ``‖S‖`` fails.

    Attributes
    ----------
    rank : int
        ``q − d``.
    sigma_max : float
        σ_max of R as the caller estimated it (:func:`decide`: Lanczos), NaN otherwise.
    ritz : ndarray
        Converged Ritz values (ascending).
    sigma_min : float
        Smallest kept Ritz value σ_r (inf where the block kept none).
    steps, block_used : int
        Iteration steps and final block size.
    leak : float
        ``ν·σ_r`` of the check (ν the lower estimate of ``‖S‖₂``).
    """

    inv: Callable
    inv_t: Callable
    matmul: Callable
    q: int
    tol: float
    transposed: bool = False
    block: int = 64
    max_block: int = 1024
    seed: int = 0
    lanes: Lanes = field(default=SERIAL, repr=False)
    chunk: Optional[int] = None
    rank: int = field(init=False, default=0)
    sigma_max: float = field(init=False, default=float("nan"))
    ritz: np.ndarray = field(init=False, default=None, repr=False)
    sigma_min: float = field(init=False, default=float("nan"))
    steps: int = field(init=False, default=0)
    block_used: int = field(init=False, default=0)
    leak: float = field(init=False, default=float("nan"))
    _u: np.ndarray = field(init=False, default=None, repr=False)
    _v: np.ndarray = field(init=False, default=None, repr=False)

    def __post_init__(self):
        try:
            self._decide()
        finally:
            self.lanes = SERIAL

    def _inv(self, C):
        return self.lanes.columns(self.inv, self.chunk)(C)

    def _inv_t(self, C):
        return self.lanes.columns(self.inv_t, self.chunk)(C)

    def _decide(self):
        q, lanes = self.q, self.lanes
        sub = small_subspace(self._inv, self._inv_t, q, self.tol, block=self.block,
                             max_block=self.max_block, seed=self.seed, lanes=lanes)
        self.ritz, self.steps, self.block_used = sub.ritz, sub.steps, sub.block
        d = int(np.count_nonzero(sub.ritz <= self.tol))
        self.rank = q - d
        kept = sub.ritz[d:]
        self.sigma_min = float(kept[0]) if kept.size else float("inf")
        if d == 0:
            return
        # the pair (primary space, orth of its image under the inverse): the
        # primary space is G's right small singular subspace. R⁻ᵀ of the right
        # Ritz vectors came with the iteration's last step (sub.images: the
        # same span as R⁻ᵀ V for V = orth(vectors), whose columns differ by a
        # triangular factor within rounding of I)
        images = sub.images if sub.images is not None else self._inv_t(sub.vectors[:, :d])
        U = orth_r(self._finite(images), lanes)[0]
        if not self.transposed:
            V = orth_r(sub.vectors[:, :d], lanes)[0]
        else:
            V = orth_r(self._finite(self._inv(U)), lanes)[0]
        self._u, self._v = U, V
        if self.rank:
            nu, _ = probe_norm(self._apply, self._apply_t, q, seed=self.seed + 1, steps=2)
            self.leak = float(nu * self.sigma_min)
            if not (np.isfinite(self.leak) and self.leak <= LEAK_FACTOR):
                raise SubspaceTooLarge(f"‖S‖·σ_r = {self.leak:.3g}: the projections leak "
                                       "amplified components")

    @staticmethod
    def _finite(Y) -> np.ndarray:
        Y = np.asarray(Y, dtype=np.float64)
        if not np.all(np.isfinite(Y)):
            raise SubspaceTooLarge("non-finite triangular solve")
        return Y

    # S = P_V R⁻¹ P_U and Sᵀ = P_U R⁻ᵀ P_V
    def _apply(self, C):
        C = np.asarray(C, dtype=np.float64)
        if self._u is None:
            return np.asarray(self._inv(C))
        lanes = self.lanes
        return _project(self._v, np.asarray(self._inv(_project(self._u, C, lanes))), lanes)

    def _apply_t(self, C):
        C = np.asarray(C, dtype=np.float64)
        if self._u is None:
            return np.asarray(self._inv_t(C))
        lanes = self.lanes
        return _project(self._u, np.asarray(self._inv_t(_project(self._v, C, lanes))), lanes)

    def solve(self, C: np.ndarray) -> np.ndarray:
        """Minimum-norm ``Y`` with ``G Y ≈ C`` under the cutoff; C of shape (q, p).

        ``Y = S C`` (``Sᵀ C`` for Rᵀ), then one step ``Y += S (C − G Y)`` with
        G's own residual (see the module notes).
        """
        C = np.asarray(C, dtype=np.float64)
        if C.ndim == 1:
            C = C[:, None]
        if C.shape[1] == 0 or self.rank == 0:
            return np.zeros((self.q, C.shape[1]))
        apply = self._apply_t if self.transposed else self._apply
        with one_blas_thread():         # q × d products with a few columns
            Y = np.array(apply(C), dtype=np.float64)
            Y += apply(C - np.asarray(self.matmul(Y, self.transposed)))
        return Y


def decide(R: sp.csc_array, cutoff: float, diag: np.ndarray, *, transposed: bool = False,
           upper: UpperTriangular = None, block: int = 64, max_block: int = 1024,
           seed: int = 0, sigma_max: Optional[float] = None, lanes: Optional[int] = None,
           dense: Optional[np.ndarray] = None):
    """:class:`SparseSubspaceCOD` of square upper triangular R under lstsq's rule, or None.

    Parameters
    ----------
    R : scipy.sparse.csc_array, shape (q, q)
        Upper triangular, nonzero finite diagonal ``diag`` (``|r_ii|``).
    cutoff : float
        Relative cutoff; the absolute one is ``cutoff·σ_max`` (σ_max by Lanczos,
        :func:`~scipy_gpuqr._factor.subspace_cod.sigma_max_lanczos`).
    diag : ndarray
        ``|r_ii|``: the pivots at most the cutoff size the first block
        (``2·count + block``; where more pivots lie within :data:`DIAG_HINT`
        × the cutoff, their count + block, at most twice that and the largest
        block).
    transposed : bool
        Solve with ``Rᵀ``.
    upper : UpperTriangular, optional
        R's SuperLU solves where already set up, used where the compiled
        sweeps (:mod:`scipy_gpuqr._factor.native`) are not at hand. ``R⁻ᵀC``
        is then solved with ``Rᵀ``'s own (SuperLU's sweep without
        transposition is the faster one). Both are applied to pieces of
        :data:`SOLVE_CHUNK` columns.
    block, max_block : int
        The iteration's block increment and largest block (at most q/3, and
        as many columns as :data:`BLOCK_COPIES` q × p blocks fit in
        :data:`HOST_MEMORY_FRACTION` of the available host memory).
    seed : int
        Seed of the random blocks.
    sigma_max : float, optional
        σ_max of R where the caller already has
        :func:`~scipy_gpuqr._factor.subspace_cod.sigma_max_lanczos`'s value
        (not recomputed).
    dense : ndarray, optional
        R as a dense Fortran-ordered array where the caller already made one
        (used where R is stored densely, :data:`DENSE_SOLVES_DENSITY`).
    lanes : int, optional
        Threads of the decision (:func:`~scipy_gpuqr._factor.host_lanes.host_lanes`:
        one per core, at most :data:`~scipy_gpuqr._factor.host_lanes.MAX_LANES`,
        where BLAS is held to one thread).

    Returns
    -------
    SparseSubspaceCOD or None
        None where it does not apply: R beyond SuperLU's limit while sparse
        and the compiled sweeps not at hand (with them, any R whose copy of
        its arrays fits in :data:`HOST_MEMORY_FRACTION` of the available host
        memory), a first block over ``min(max_block, q/3)``, or the iteration
        or the check refused.
    """
    q = R.shape[0]
    max_block = min(max_block, q // 3)
    avail = available_host_memory()
    if avail is not None:
        max_block = min(max_block, int(HOST_MEMORY_FRACTION * avail / (8 * BLOCK_COPIES * q)))
    smax = sigma_max_lanczos(R) if sigma_max is None else float(sigma_max)
    if not smax > 0:
        return None
    tol = cutoff * smax
    first = 2 * int(np.count_nonzero(diag <= tol)) + block
    if first > max_block:
        return None
    hinted = int(np.count_nonzero(diag <= DIAG_HINT * tol)) + block
    first = max(first, min(hinted, 2 * first, max_block))
    if R.nnz > DENSE_SOLVES_DENSITY * q * (q + 1) / 2:
        Rd = dense if dense is not None else np.asfortranarray(R.toarray(), dtype=np.float64)
        # BLAS trsm without the interpreter lock: the lanes' pieces run side by side
        inv = lambda C: trsm_upper(Rd, C)                    # noqa: E731
        inv_t = lambda C: trsm_upper(Rd, C, trans=True)      # noqa: E731
        G, chunk = Rd, DENSE_SOLVE_CHUNK
    else:
        lib = native_handle()
        if lib is not None:
            # the compiled sweeps' copy of R's arrays (int64 indices, values)
            if avail is not None and 16 * R.nnz > HOST_MEMORY_FRACTION * avail:
                return None
            r = R.diagonal()
            if not (np.all(np.isfinite(r)) and np.all(r != 0)):
                return None
            compiled = SparseUpperSolves(lib, R)
            inv, inv_t, chunk = compiled.solve, compiled.solve_t, None
        elif R.nnz > SUPERLU_MAX_NNZ:      # SciPy's slow sweeps would answer
            return None
        else:
            upper = upper if upper is not None else UpperTriangular(R)
            lower = UpperTriangular(sp.csc_array(R.T))          # works for any triangle
            if lower._lu is None or upper._lu is None:
                return None
            inv, inv_t, chunk = upper.solve, lower.solve, SOLVE_CHUNK
        G = R
    limit = one_blas_thread()
    try:
        with limit, host_lanes(not isinstance(limit, contextlib.nullcontext), lanes) as ln:
            cod = SparseSubspaceCOD(inv, inv_t, lambda Y, t: (G.T @ Y) if t else (G @ Y), q,
                                    tol, transposed=transposed, block=first,
                                    max_block=max_block, seed=seed, lanes=ln, chunk=chunk)
    except SubspaceTooLarge:
        return None
    cod.sigma_max = smax
    return cod
