"""The numerical solve rules, built only on the :class:`NumericQR` contract.

Every backend returns ``M[:, colperm] = Q @ R``; the rules below turn that
into answers, so they are the same on every backend.

Least squares (``lsqr``, ``lsmr``, ``QRFactorization.solve``)
    The minimum 2-norm least-squares solution with ``numpy.linalg.lstsq``'s
    rank rule: singular values ``<= eps·max(m, n)·σ_max`` count as zero.
    Method: QR **without** rank detection (tol=None), then

    0. ``R`` without a nonzero value (A = 0): rank 0, the solution is 0
       (method ``'zero'``; no estimate runs on the zero operator).
    1. ``R``'s diagonal and a condition estimate decide whether ``R`` is
       safely of full rank: ``min|r_ii| > cutoff·max|r_ii|`` (necessary:
       σ_min ≤ min|r_ii| and σ_max ≥ max|r_ii|, so a failure proves the
       deficiency and no further full-rank test runs) and
       ``rcond_1(R) >= 10·q·cutoff`` (LAPACK ``trcon`` for q ≤
       :data:`DENSE_LIMIT`, Higham's ``onenormest`` of ``R⁻¹`` beyond). The
       factor ``10·q`` covers the gap between 1-norm and 2-norm condition
       numbers (at most q) and the estimator's underestimate. Where that
       test is inconclusive, σ_max by Lanczos and σ_min of the triangle
       (:func:`scipy_gpuqr._factor.triangular.sigma_min_upper`: the bound
       ``1/‖R⁻¹‖_F``, else Lanczos on the explicit inverse for q ≤
       DENSE_LIMIT; Lanczos on ``(RᵀR)⁻¹`` through triangular solves beyond,
       trusted with a margin of 4) decide. Then ``R⁻¹`` answers
       (SuperLU's triangular sweeps, :class:`~scipy_gpuqr._factor.triangular.UpperTriangular`).
       From :data:`SOLVE_RANK_MIN_ORDER` columns (beyond DENSE_LIMIT) a
       randomized probe through R's solves comes first
       (:func:`~scipy_gpuqr._factor.solve_rank.probe_norm`: σ_min ≥ 1/(Mν)
       with probability 1 − 1e-10, σ_max ≤ ‖R‖_F; one to three solves with 8
       columns, on the device for GPU factors); the tests above answer where
       it is inconclusive. Below that order, with R's solves on the host, the
       same probe runs where the 1-norm estimate is inconclusive, before the σ
       test (whose dense inverse costs q³/3 flops against a few sparse solves).
       A probe that fails leaves ν, a lower bound of ``‖R⁻¹‖₂`` (so σ_min ≤
       1/ν for certain): with σ_max by Lanczos in place of ``‖R‖_F`` it
       confirms full rank where ``M·ν·cutoff·σ_max < 1``; where 1/ν lies
       within the σ test's margin of the cutoff that test cannot confirm and
       is not run (rule 2 decides, full rank included); after a probe that
       failed with a margin below 10 the 1-norm test is not run either (its
       factor ``10·q`` exceeds what the probe leaves, see the code). Beyond
       DENSE_LIMIT a densely stored R is solved with BLAS on one dense copy
       (:class:`~scipy_gpuqr._factor.dense_upper.DenseUpper`), shared by
       these tests and rule 2.
    2. Otherwise the rank is decided on ``R`` alone (it has A's singular
       values), with ``cutoff·σ_max`` as the absolute threshold ``tol``.
       From :data:`SOLVE_RANK_MIN_ORDER` columns (from
       :data:`NULLSPACE_HOST_MIN_ORDER` where R's solves are the host's:
       :func:`nullspace_candidate`), where R is square with a nonzero diagonal
       and a few tiny pivots leave a clear gap, the **null-space COD** answers
       (:class:`~scipy_gpuqr._factor.solve_rank.NullspaceCOD`: two solves
       with d columns give the small singular subspaces, checked by
       ``‖R V_d‖ <= tol/2`` and a probe of σ_{q−d}; ``x = P_V R⁻¹ P_U c``
       refined once with R's residual), on the device for GPU factors.
       First, where R is sparse (at most :data:`SPARSE_COD_MAX_DENSITY`
       nonzero) and the alternative is a dense refinement on the host, a
       **gap-checked sparse COD**: a rank-detecting sparse QR of R at
       ``tol``, ``R P = Q [R11 R12; 0 E]``, E formed exactly as the rows
       ``r:`` of ``Qᵀ R P[:, r:]``; it is kept only where
       ``‖E‖₂ <= tol < σ_min(R11)`` (then σ_{r+1} ≤ ‖E‖₂ and σ_r ≥
       σ_min(R11): lstsq's rank is r and its solution differs from the
       COD's by a perturbation below the cutoff). Exactly dependent columns
       of a large sparse R are so decided far more cheaply than by any dense
       refinement. Where the check fails (no gap, or Heath's greedy rule
       misses singular values below the cutoff) and the dense rules would run
       on the host from :data:`SPARSE_SUBSPACE_MIN_ORDER` columns (the dense SVD
       below DENSE_LIMIT, the dense COD beyond), a square R with a nonzero diagonal is
       decided from its small singular subspace through its sparse triangular
       solves (:mod:`scipy_gpuqr._factor.sparse_subspace`: the subspace
       iteration below, then ``x = P_V R⁻¹ P_U c`` refined with R's residual;
       no dense copy of R, cost proportional to nnz(R) times the block).
       Where that refuses, the dense rules below answer. Where R's dense work runs
       on the GPU (``dense_device``, from :data:`SVD_GPU_MIN_ORDER` columns; beyond
       DENSE_LIMIT where R made dense fits there beside the decision's blocks) and R
       is square with a nonzero diagonal, R's small singular subspace decides on R
       made dense there first
       (:class:`~scipy_gpuqr._factor.dense_subspace.DenseSubspaceCOD`: block
       inverse subspace iteration, Rayleigh–Ritz on R; a few solves with the block
       where the SVD of all of R, or beyond DENSE_LIMIT the dense COD of all of R,
       is the dearest dense step): before the gap check where the factorization
       was the GPU's (whose second sparse QR of R would run there), before the
       dense SVD or the dense COD otherwise. Up to DENSE_LIMIT the rank is kept
       only where the gap at the cutoff is certified (the SVD, lstsq's rule itself,
       decides otherwise); beyond, gap or not unless the projections leak (the
       host's subspace rule, for an R whose dense COD costs ``q³`` flops and finds
       no gap where the Ritz values have none). Where R's solves grow so much
       that the directions at the cutoff lie under their rounding (chains of
       pivots at their columns' rounding), the decision refuses (see
       :mod:`~scipy_gpuqr._factor.dense_subspace`): the rules that do not divide
       by R's pivots answer.

       * q ≤ :data:`DENSE_LIMIT`: a dense SVD of ``R`` gives exactly lstsq's
         rank and the pseudo-inverse solution (on the GPU from
         :data:`SVD_GPU_MIN_ORDER` columns when one is used, see
         ``dense_device``).
       * q ≤ :data:`DENSE_COD_HOST_LIMIT` (or R fits on the GPU that
         factored A, or that ``auto`` saw): a dense blocked complete orthogonal decomposition
         (:mod:`scipy_gpuqr._factor.dense_cod`): Heath's dead-column rule, then a
         QR of the live rows for the minimum-norm part. Where the singular
         values have a gap at the cutoff its rank is lstsq's (checked:
         σ_min of the live rows above the threshold). Where they do not
         (Heath's rule keeps columns lstsq drops), the rank must be decided
         on R itself: Heath's dropped parts, up to the threshold per column,
         move singular values near the cutoff. On the host, where
         Heath's rule drops columns (or σ_min of the live rows is below the
         threshold) and R has a nonzero diagonal, R's small singular
         subspace decides (:mod:`scipy_gpuqr._factor.subspace_cod`: block inverse
         subspace iteration with Rayleigh–Ritz, the Ritz vectors below the
         threshold moved out by one block Householder reflector, the
         rest re-triangularized as a triangle plus a rank-d update in
         O(q²d); σ_max by Lanczos to 1e-12), gap or not: its rank
         and solution are the truncated SVD's of R, and it costs less than
         the COD's second QR (then never computed) or an SVD. Where its
         first block (twice Heath's dead columns + 64) exceeds
         ``min(SUBSPACE_MAX_BLOCK, q/3)`` or it does not settle, a dense SVD
         decides up to :data:`SVD_FALLBACK_LIMIT` columns (also the GPU's
         rule, on the device); beyond, Heath's rank stands and
         ``summary()['rank_revealed']`` is False.
       * beyond: the sparse complete orthogonal decomposition (a second,
         rank-detecting QR of ``R`` with the absolute tolerance
         ``cutoff·σ_max``, then a QR of ``[R11 R12]ᵀ`` for the minimum-norm
         part) without the gap check's guarantee where that check failed.

       lstsq itself decides on A's computed singular values, so where one
       lies within rounding of the cutoff the two ranks may differ by the
       number of such values.

    SuiteSparseQR's default tolerance (20·(m+n)·eps·max column norm) is
    *not* this rule: it drops columns greedily and loses accuracy on
    ill-conditioned square matrices.

Exact solves (``spsolve``, ``factorized``)
    No rank detection. :func:`exactly_singular` decides when SciPy's
    ``MatrixRankWarning`` and a NaN result are due.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, onenormest

from .. import _gpu
from .._cpu.blas_threads import process_limited
from .._dispatch.plan import available_host_memory
from .._engine.memory import available_bytes
from .._trusted_csc import csc_of, transposed_csc
from .dense_cod import DenseCOD, dense_from_sparse, sigma_max_estimate
from .dense_subspace import DenseSubspaceCOD
from .dense_upper import DenseUpper, stored_densely
from .host_norms import frobenius_norm
from .native import SparseUpperSolves
from .native import handle as native_handle
from .solve_rank import NullspaceCOD, NullspaceRefused, abs_diagonal, frobenius, probe_norm
from .subspace_cod import SubspaceCOD, SubspaceTooLarge, sigma_max_lanczos
from .sparse_subspace import decide as sparse_subspace_decide
from .triangular import (COMPILED_SIGMA_MAX_FILL, DENSE_SIGMA_LIMIT, DENSE_SOLVE_FILL,
                         DENSE_SOLVE_LIMIT, SUPERLU_MAX_NNZ, UpperTriangular,
                         compiled_sigma_applies, compiled_sigma_seconds, norm2_lanczos,
                         sigma_min_upper)

__all__ = ["exact_solve", "DENSE_LIMIT", "SINGULAR_RTOL", "lstsq_cutoff", "MinNormSolver", "KnownNorms",
           "NULLSPACE_HOST_MIN_ORDER", "nullspace_candidate", "device_subspace_takes",
           "host_sigma_pays", "host_factors_sigma_pays", "exactly_singular", "solve_upper",
           "solve_upper_transposed"]

EPS = float(np.finfo(np.float64).eps)

#: Largest number of columns of R refined by a dense SVD (q² doubles and
#: about 10·q³ flops: 2500 → 50 MB).
DENSE_LIMIT = 2500

#: spsolve's singularity rule: column i of R is "exactly" dependent when
#: |r_ii| <= SINGULAR_RTOL · ‖R[:, i]‖₂ (= the 2-norm of A's column colperm[i]).
#: See :func:`exactly_singular` for the evidence behind the value.
SINGULAR_RTOL = 100 * EPS

#: Largest dimension of R refined by a dense blocked COD on the host
#: (:mod:`scipy_gpuqr._factor.dense_cod`; 14000² doubles = 1.6 GB per copy).
DENSE_COD_HOST_LIMIT = 14000

#: Largest dimension for which a dense SVD settles the rank when Heath's rule
#: cannot (no gap in the singular values): host (gesdd, whose O(q³) time
#: limits it; on the host it is the fallback of the cheaper subspace decision,
#: :mod:`scipy_gpuqr._factor.subspace_cod`) and GPU (cuSOLVER gesvd).
SVD_FALLBACK_LIMIT = {"cpu": 5000, "gpu": 20000}

#: Initial block (and block increment per Heath-dead column × 2) of the host's
#: subspace rank decision (:mod:`scipy_gpuqr._factor.subspace_cod`), and its largest
#: block: 2·p·q² flops per step (p = 1024, q = 14000: 4e11).
SUBSPACE_BLOCK = 64
SUBSPACE_MAX_BLOCK = 1024

#: Least first block of the device's subspace decision
#: (:class:`~scipy_gpuqr._factor.dense_subspace.DenseSubspaceCOD`): a solve with the
#: block costs about what one with a few columns costs there, and a block that
#: straddles the cutoff from the first step saves a doubling.
DEVICE_SUBSPACE_BLOCK = 128

#: q × p arrays the device's subspace decision holds at once beside R (the block, its
#: solves, R times it, their thin QRs' factors), for its memory check beyond
#: DENSE_LIMIT.
DEVICE_SUBSPACE_BLOCKS = 6

#: Smallest min(k, q) of R whose dense SVD runs on the GPU when one may be
#: used (below it the host's gesdd is as fast as cuSOLVER's, transfers included).
SVD_GPU_MIN_ORDER = 600

#: Fraction of the free device memory a dense COD on the GPU may take.
DENSE_COD_GPU_FRACTION = 0.5

#: Predicted seconds of the gap check's σ test of a triangle of order up to
#: DENSE_SIGMA_LIMIT on a GPU whose dense libraries the process has set up (T made dense
#: there, cuBLAS's inverse, the norm test's products or Lanczos, a few round trips):
#: :func:`host_sigma_pays`.
DEVICE_SIGMA_S = 0.005
#: ... and what the first use of the device's dense libraries in a process adds (cuBLAS's
#: set-up and its kernels' loads: about a tenth of a second on one H200), charged where
#: the factorization ran on the host: nothing in the call has set them up (a GPU
#: factorization starts their set-up beside its analysis).
DEVICE_DENSE_FIRST_USE_S = 0.1

#: Margin above the cutoff at which Lanczos' σ_min estimate is trusted
#: (sparse R: Lanczos on ``(RᵀR)⁻¹`` to 1e-3).
_SIGMA_MARGIN = 4.0

#: The same for a dense R (Lanczos on the explicit inverse to 1e-12 from a
#: random start): lstsq's own decision is only as sharp as its computed
#: singular values (relative ~1e-3 and less near the cutoff on the tests).
_DENSE_SIGMA_MARGIN = 1.05

#: Largest fraction of nonzero entries of R for which the sparse complete
#: orthogonal decomposition is tried before a dense refinement.
SPARSE_COD_MAX_DENSITY = 0.05

#: Largest order of R whose rank decision and minimum-norm solves run every
#: OpenBLAS of the process (NumPy's, SciPy's, SuiteSparseQR's) on one thread:
#: their steps are matrix-vector products, Lanczos and ARPACK vector work, sparse
#: factorizations of R and a triangular inverse of at most q³/3 ≈ 2.7e9 flops,
#: each too short for a pool of workers to wake, whose spinning then slows the
#: next call of the other pool (:mod:`scipy_gpuqr._cpu.blas_threads`).
SINGLE_THREAD_ORDER = 2000

#: A dense SVD of at least this many flops (about ``10·q³``) runs with the
#: pools' own thread counts inside a one-thread decision.
SVD_THREADED_FLOPS = 1e10

#: Smallest order of a square R whose rank the host decides from its small
#: singular subspace through its sparse solves (:mod:`scipy_gpuqr._factor.sparse_subspace`)
#: before a dense SVD (about 10·q³ flops: 1e10 here, against a few block solves
#: costing ``4·p·nnz(R)`` each); where it refuses, the SVD decides.
SPARSE_SUBSPACE_MIN_ORDER = 1000

#: Smallest order of a square R whose rank is decided through its triangular solves
#: first (:mod:`scipy_gpuqr._factor.solve_rank`: the randomized full-rank probe
#: beyond DENSE_LIMIT, the null-space COD of a few dependent columns).
SOLVE_RANK_MIN_ORDER = 3000

#: Smallest order of a square R whose null-space COD (a few tiny pivots with a
#: clear gap) is tried first where R's solves run on the host (SuperLU's sweeps):
#: two solves with d columns and thin q × d QRs, several times cheaper than the
#: gap-checked sparse COD's two sparse QRs of R, Lanczos for σ_max and dense
#: inverse of R11 for σ_min(R11). Below it the dense rules cost little.
NULLSPACE_HOST_MIN_ORDER = 500

#: Largest number of tiny pivots (and fraction of q) the null-space COD takes on:
#: two solves with that many columns and thin QRs of q × d blocks.
NULLSPACE_MAX_DEAD = 4096
NULLSPACE_MAX_FRACTION = 0.25

#: Largest fraction of the available host memory that a dense copy of R beyond
#: DENSE_LIMIT, stored densely, may take for BLAS solves and products
#: (:class:`~scipy_gpuqr._factor.dense_upper.DenseUpper`).
DENSE_UPPER_MEMORY_FRACTION = 0.25

#: Largest ``rows × dead columns`` of the dense block formed to check the
#: sparse COD's rank (8 bytes each: 400 MB).
GAP_CHECK_MAX_ENTRIES = 50_000_000


def lstsq_cutoff(m: int, n: int) -> float:
    """numpy.linalg.lstsq's default relative cutoff ``eps·max(m, n)``."""
    return EPS * max(m, n, 1)


def _as_2d(C: np.ndarray) -> np.ndarray:
    return C.reshape(C.shape[0], 1) if C.ndim == 1 else C


def solve_upper(R: sp.csc_array, C: np.ndarray) -> np.ndarray:
    """``R⁻¹ C`` for square upper triangular sparse R with a nonzero diagonal."""
    return UpperTriangular(R).solve(C)


def solve_upper_transposed(R: sp.csc_array, C: np.ndarray) -> np.ndarray:
    """``R⁻ᵀ C`` for square upper triangular sparse R with a nonzero diagonal."""
    return UpperTriangular(R).solve(C, trans=True)


def exactly_singular(R: sp.csc_array, n: int) -> bool:
    """spsolve's rule: is the square factor R singular "exactly" (like SuperLU)?

    SuperLU reports ``Matrix is exactly singular`` when it meets an exactly
    zero pivot. Householder QR rarely produces an exact zero on a singular
    matrix; the pivot of a dependent column is instead at rounding level
    relative to that column. The rule: R has fewer than n rows, or a zero
    or non-finite diagonal entry, or ``|r_ii| <= SINGULAR_RTOL·‖R[:, i]‖₂``
    for some i (SINGULAR_RTOL = 100·eps; ``‖R[:, i]‖₂`` is the norm of the
    pivot column of A, so the test is scale-invariant per column).

    Evidence (SuiteSparseQR with COLAMD, b = ones; tests/test_lstsq_rules.py
    checks it on every square matrix in shared/matrices): the matrices on
    which SciPy's spsolve warns have exact zero pivots (GD01_b, gent113,
    rajat01, Ragusa16, Tina_AskCal) or min |r_ii|/‖R[:, i]‖ = 3.3e-17
    (dwt_878); the nonsingular ones are all >= 3.9e-11 (temp; nnc1374 4.4e-11,
    reorientation_1 2.6e-9, bayer10 1.0e-6, west0479 1.1e-5). 100·eps = 2.2e-14
    sits between with a margin of about 700 on each side. A global test
    ``min|r_ii|/max|r_jj|`` cannot separate them (temp: 1.5e-31, not singular;
    dwt_878: 3.3e-17, singular).
    """
    k, q = R.shape
    if k < n or q < n:
        return True
    if n == 0:
        return False
    R = sp.csc_array(R)
    d = np.abs(R.diagonal()[:n])
    if not np.all(np.isfinite(d)) or np.any(d == 0):
        return True
    colnorm = np.sqrt(np.asarray(R.multiply(R).sum(axis=0)).ravel()[:n])
    return bool(np.any(d <= SINGULAR_RTOL * colnorm))


def _dead_pivots(d: np.ndarray, lo: float) -> int:
    """The pivots ``|r_ii| <= lo`` that the null-space COD takes on, or 0 where there
    are none or more than :data:`NULLSPACE_MAX_DEAD` (and
    :data:`NULLSPACE_MAX_FRACTION` of q)."""
    dead = int(np.count_nonzero(d <= lo))
    return 0 if dead > min(NULLSPACE_MAX_DEAD, NULLSPACE_MAX_FRACTION * d.size) else dead


def _subspace_blocks(q: int, dead: int) -> tuple[int, int]:
    """(first block, largest block) of R's small singular subspace decisions for an
    order-``q`` R with ``dead`` pivots under the cutoff: twice those and
    :data:`SUBSPACE_BLOCK`, and ``min(SUBSPACE_MAX_BLOCK, q/3)``; the decision does not
    apply where the first exceeds the largest."""
    return 2 * int(dead) + SUBSPACE_BLOCK, min(SUBSPACE_MAX_BLOCK, q // 3)


def device_subspace_fits(q: int, max_block: int) -> bool:
    """Whether an order-``q`` R made dense on the device with the subspace decision's
    blocks (about :data:`DEVICE_SUBSPACE_BLOCKS` q × ``max_block`` arrays) takes at most
    :data:`DENSE_COD_GPU_FRACTION` of what the device may give now (free memory, CuPy's
    pool limit), the dense COD's own share."""
    need = 8 * q * (q + DEVICE_SUBSPACE_BLOCKS * max_block)
    avail = available_bytes(_gpu.import_cupy()).available
    return need <= DENSE_COD_GPU_FRACTION * avail


def device_subspace_takes(q: int, under: int) -> bool:
    """Whether R's small singular subspace on the device
    (:meth:`MinNormSolver._prepare_device_subspace`) would be tried on a square order-``q``
    R beyond :data:`DENSE_LIMIT` with about ``under`` pivots under lstsq's cutoff: its
    first block (twice those pivots and :data:`SUBSPACE_BLOCK`) within the largest
    (:data:`SUBSPACE_MAX_BLOCK`, a third of q), and R made dense there with the blocks
    within the device's memory (:func:`device_subspace_fits`). The iterate-first rule asks
    it with the count of SuperLU's pivots under the cutoff (a prediction: R's own pivots
    decide, in the QR). Asked only with a GPU present."""
    first, max_block = _subspace_blocks(q, under)
    if q <= DENSE_LIMIT or first > max_block:
        return False
    try:
        return device_subspace_fits(q, max_block)
    except Exception:  # noqa: BLE001 - no device to ask: the prediction is not made
        return False


def host_sigma_pays(order: int, entries: float, *, device_set_up: bool) -> bool:
    """Whether σ_min of a sparse triangle of this order with ``entries`` entries is had
    for less on the host's compiled sweeps than on the GPU, where both could answer (the
    gap check's σ test, :meth:`MinNormSolver._sigma_min_on_device`): the sweeps apply
    by the triangle's fill (:data:`~scipy_gpuqr._factor.triangular.COMPILED_SIGMA_MAX_FILL`)
    and their predicted seconds
    (:func:`~scipy_gpuqr._factor.triangular.compiled_sigma_seconds`) are at most the
    device's: :data:`DEVICE_SIGMA_S`, plus :data:`DEVICE_DENSE_FIRST_USE_S` unless
    ``device_set_up`` (the factorization ran on the GPU). A prediction by sizes alone, so
    one problem's decision runs on one device whatever the process did before.

    The iterate-first rule asks it with R's entries (the analysis' count) for the order
    of R11 that U's pivots predict, where the factorization is planned on the host."""
    if not order > 0 or entries > COMPILED_SIGMA_MAX_FILL * float(order) ** 2:
        return False
    device = DEVICE_SIGMA_S + (0.0 if device_set_up else DEVICE_DENSE_FIRST_USE_S)
    return compiled_sigma_seconds(order, entries) <= device


def host_factors_sigma_pays(order: int, entries: float) -> bool:
    """:func:`host_sigma_pays` where the factorization runs on the host (nothing in the
    call sets the device's dense libraries up): the iterate-first rule's ``host_sigma``
    for a plan on the host."""
    return host_sigma_pays(order, entries, device_set_up=False)


def nullspace_candidate(R, cutoff: float) -> bool:
    """Whether :class:`MinNormSolver` tries the null-space COD first on host R, from
    R's diagonal alone: square R of order at least :data:`NULLSPACE_HOST_MIN_ORDER`
    with a finite nonzero diagonal, some pivots at most ``cutoff·max|r_ii|`` (a
    lower bound of lstsq's absolute cutoff) but not too many, and the same pivots
    at most ``cutoff·‖R‖_F`` (an upper bound of it): no pivot lies where σ_max's
    value would decide. The COD then costs two solves with those few columns and a
    probe, no dense work; it still checks the gap itself and may refuse (the
    tiny pivots need not be the small singular values).

    Parameters
    ----------
    R : sparse matrix
        Upper triangular.
    cutoff : float
        lstsq's relative cutoff (:func:`lstsq_cutoff`).
    """
    R = sp.csc_array(R)
    k, q = R.shape
    if k != q or q < min(NULLSPACE_HOST_MIN_ORDER, SOLVE_RANK_MIN_ORDER):
        return False
    d = abs_diagonal(R)
    if not (np.all(np.isfinite(d)) and np.all(d > 0)):
        return False
    dead = _dead_pivots(d, cutoff * float(d.max()))
    return dead > 0 and int(np.count_nonzero(d <= cutoff * frobenius(R))) == dead


def _host_triangular(R: sp.csc_array) -> tuple[Callable, Callable]:
    """``(C ↦ R⁻¹C, C ↦ R⁻ᵀC)`` for square upper triangular sparse R, on the host."""
    return UpperTriangular(R).solves()


def _dense_rcond(Rd: np.ndarray) -> float:
    """LAPACK's ``dtrcon`` (1-norm) of a dense upper triangular R; 0 where it fails."""
    rcond, info = la.lapack.dtrcon(Rd, norm="1", uplo="U", diag="N")
    return float(rcond) if info == 0 else 0.0


def _rcond_estimate(R: sp.csc_array, solves: Optional[tuple] = None) -> float:
    """Reciprocal 1-norm condition number estimate of triangular R.

    ``solves``: ``(R⁻¹·, R⁻ᵀ·)`` on host arrays (e.g. through the GPU's
    triangular solve); default SciPy's sparse triangular solves.
    """
    q = R.shape[0]
    if q <= DENSE_LIMIT:
        return _dense_rcond(R.toarray())
    up, upt = solves or _host_triangular(R)
    inv = LinearOperator(
        (q, q), dtype=np.float64,
        matvec=lambda v: np.asarray(up(v.reshape(-1, 1))).ravel(),
        rmatvec=lambda v: np.asarray(upt(v.reshape(-1, 1))).ravel(),
        matmat=lambda V: np.asarray(up(V)),          # one solve per block, not per column
        rmatmat=lambda V: np.asarray(upt(V)))
    norm_inv = onenormest(inv)
    norm_r = float(abs(R).sum(axis=0).max())
    if not np.isfinite(norm_inv) or norm_inv == 0 or norm_r == 0:
        return 0.0
    return 1.0 / (norm_r * norm_inv)


def _clearly_above(est, order: int, threshold: float) -> bool:
    """σ_min (a :class:`~scipy_gpuqr._factor.triangular.SigmaMin` of a triangle of this
    order) above ``threshold``: a bound as it is, an estimate with its margin
    (:data:`_DENSE_SIGMA_MARGIN` up to DENSE_LIMIT, :data:`_SIGMA_MARGIN` beyond)."""
    margin = 1.0 if est.bound else (_DENSE_SIGMA_MARGIN if order <= DENSE_LIMIT
                                    else _SIGMA_MARGIN)
    return bool(est.value > margin * threshold)


def _leading_block(R: sp.csc_array, rows: int, cols: int) -> sp.csc_array:
    """``R[:rows, :cols]`` of a CSC R whose first ``cols`` columns hold no entry in rows
    ``rows:`` (a rank-detecting QR's R: its rows from the rank on are empty): copies of
    R's leading arrays, what SciPy's slice returns after passing every entry through a
    filter that drops none; SciPy's slice where an entry lies there."""
    p = int(R.indptr[cols])
    indices = R.indices[:p]
    if p and int(indices.max()) >= rows:
        return R[:rows, :cols]
    return csc_of(R.data[:p].copy(), indices.copy(), R.indptr[:cols + 1].copy(), (rows, cols))


def sigma_min_ceiling(T, seed: int = 0) -> Optional[float]:
    """An upper bound of σ_min of sparse upper triangular T, proved up to rounding,
    from one power step: ``y = T⁻ᵀx``, ``z = T⁻¹y`` (x random) on the compiled
    sweeps (:class:`~scipy_gpuqr._factor.native.SparseUpperSolves`).

    ``‖z‖ <= ‖T⁻¹‖·‖y‖``, so ``σ_min(T) <= ‖y‖/‖z‖`` for exact solves; the computed
    ``z`` is the exact solve with a triangle ``T + Δ``, ``|Δ| <= γ_k|T|`` (k the
    most entries in a row of T: a substitution's backward error), and
    ``σ_min(T) <= σ_min(T + Δ) + ‖Δ‖₂`` adds ``γ_k·‖T‖_F``. Where T has a few
    singular values far below the others (the case it is asked about) one step
    lands within a small factor of σ_min.

    Returns None where it does not apply: the library not at hand, T over
    :data:`~scipy_gpuqr._factor.triangular.SUPERLU_MAX_NNZ` entries, a zero or
    non-finite diagonal entry or solve.
    """
    T = sp.csc_array(T)
    r = T.shape[0]
    if r == 0 or T.nnz > SUPERLU_MAX_NNZ or T.dtype != np.float64:
        return None
    diag = T.diagonal()
    if not (np.all(np.isfinite(diag)) and np.all(diag != 0)):
        return None
    lib = native_handle()
    if lib is None:
        return None
    solves = SparseUpperSolves(lib, T)
    x = np.random.default_rng(seed).standard_normal(r)
    y = solves.solve_t(x)
    z = solves.solve(y)
    ny, nz = float(np.linalg.norm(y)), float(np.linalg.norm(z))
    if not (np.isfinite(ny) and np.isfinite(nz) and nz > 0):
        return None
    k = int(np.bincount(T.indices, minlength=r).max())
    gamma = k * EPS / (1.0 - k * EPS)
    return ny / nz + gamma * float(np.linalg.norm(T.data))


Factorize = Callable[..., object]  # factorize(A, *, tol) -> NumericQR


def frobenius_bound(M, rounding: Optional[float] = None) -> Optional[float]:
    """An upper bound of ``‖R‖_F`` for the R of an orthogonal factorization of M
    (``M P = Q R``), from M's stored values: ``‖M‖_F (1 + rounding)``.

    ``Q`` orthogonal keeps the Frobenius norm, ``‖R‖_F = ‖M‖_F``; in floating
    point a Householder QR is the exact factorization of a matrix within
    ``γ‖M‖_F`` of M (γ of the order of ``m n eps``), which ``rounding``
    (default ``16 m n eps``, at least ``1e-12``) covers. One pass over
    ``nnz(M)`` values instead of ``nnz(R)``, which for a sparse QR is often
    a hundred times more. None where M's stored values are not its entries
    (a sparse matrix with duplicates not summed) or not finite.
    """
    if sp.issparse(M) and not getattr(M, "has_canonical_format", False):
        return None
    value = frobenius_norm(M)
    if not np.isfinite(value):
        return None
    m, n = M.shape
    if rounding is None:
        rounding = max(16.0 * m * n * EPS, 1e-12)
    return value * (1.0 + rounding)


def _free_device_pool() -> None:
    """CuPy's cached device blocks given back (after a device step ran out of
    memory, before the host takes over)."""
    cp = _gpu.import_cupy()
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()


def _results_on_host(solve: Callable) -> Callable:
    """``solve`` (a device solve: host or device blocks in) with its result copied
    to the host, for blocks kept in host memory."""
    def on_host(C):
        Y = solve(C)
        return Y.get() if hasattr(Y, "get") else Y
    return on_host


@dataclass(frozen=True)
class KnownNorms:
    """What a caller already learnt of the factored matrix's norms, which R shares
    (``M P = Q R``: R has M's singular values), for :class:`MinNormSolver` to read in
    place of its own estimates of R's.

    Parameters
    ----------
    sigma_max : float or None
        σ_max of M by Lanczos to 1e-12 (as :func:`sigma_max_lanczos` gives it).
    inverse_norm : (float, float) or None
        ``(ν, margin)`` of a randomized probe of ``‖M⁻¹‖₂``
        (:func:`~scipy_gpuqr._factor.solve_rank.probe_norm` through another
        factorization's solves, a square M's LU) that did not confirm full rank
        by lstsq's rule (``margin·ν·cutoff·‖M‖_F >= 1``): ν is a lower bound of
        ``‖R⁻¹‖₂``, and R's own probe, the same test on the same norm, would
        fail as well.
    """

    sigma_max: Optional[float] = None
    inverse_norm: Optional[tuple] = None


@dataclass
class MinNormSolver:
    """Minimum-norm least-squares solves with a fixed k×q matrix G = R or Rᵀ.

    Built once per factorization (the rank decision and any refinement are
    cached), then :meth:`solve` answers any number of right-hand sides.

    Parameters
    ----------
    R : scipy.sparse.csc_array, shape (k, q)
        Upper trapezoidal factor.
    cutoff : float
        Relative singular value cutoff (``eps·max(m, n)`` of the original A).
    transposed : bool
        Solve with ``Rᵀ`` instead of ``R`` (wide A, factored as Aᵀ).
    factorize : callable or None
        ``factorize(G, tol=...) -> NumericQR`` used for the sparse complete
        orthogonal decomposition when R is too large for a dense SVD.
    device : {'cpu', 'gpu'}
        Where the factorization ran. A GPU factorization tries the sparse
        COD first only up to :data:`DENSE_LIMIT` columns (its factorizer is
        the GPU's); beyond, its dense COD stays on the device.
    dense_device : {'cpu', 'gpu'} or None
        Where the dense refinements (SVD, dense COD) run; None: ``device``.
        The caller says 'gpu' when the factorization ran there, or when
        ``auto`` factorized on the CPU with a GPU present. A dense SVD goes
        to the GPU from :data:`SVD_GPU_MIN_ORDER` columns on (cuSOLVER,
        faster than the host's gesdd there); the host's subspace decision
        needs ``dense_device='cpu'``.
    solves : (callable, callable), optional
        ``C ↦ R⁻¹C`` and ``C ↦ R⁻ᵀC`` on host arrays for the condition and
        σ estimates of a square R (e.g. the GPU's front-structured solve);
        default SciPy's sparse triangular solves.
    products : (callable, callable), optional
        ``Y ↦ R Y`` and ``Y ↦ Rᵀ Y`` on host arrays for the refinement of the
        null-space COD's solves (the GPU's, from R's rows on the device); one
        that answers None leaves that product to R's sparse copy, as the
        default does.
    rhs : callable, optional
        ``rhs()``: the right-hand sides C (rows of G × p, host) the first
        :meth:`solve` will be given, fetched only by a rule that solves with
        ``R⁻¹`` anyway and takes them into that solve (the null-space COD of
        G = R): that first solve then costs no solve with R of its own. Not
        kept once the decision is made.
    rhs_beside : bool
        ``rhs()`` reads only what lies on the device (``Qᵀb`` of a GPU
        factorization whose every stage's pool is there): the null-space COD
        fetches it while its first block is solved on a stream of its own
        (:class:`~scipy_gpuqr._factor.solve_rank.NullspaceCOD`'s ``rhs_beside``).
    rhs_device : callable, optional
        With ``rhs_beside``: ``rhs_device()`` queues the block ``rhs()`` gives on
        the device and returns it there, not waited for; the null-space COD
        reads it on the device and fetches ``rhs()`` only once its solve with
        ``R⁻¹`` is queued (:class:`~scipy_gpuqr._factor.solve_rank.NullspaceCOD`'s
        ``rhs_device``). Not kept once the decision is made.
    probe_start : (array, array), optional
        ``(Ω, R⁻¹Ω)``: the full-rank probe's Gaussian block (as
        :func:`~scipy_gpuqr._factor.solve_rank.probe_norm` draws it) and its
        solve, formed by the caller in the same solve with R as its
        least-squares right-hand sides. The probe then takes ``R⁻ᵀ`` as its
        operator (whose 2-norm is ``R⁻¹``'s), and its first step costs no
        solve. Not kept once the decision is made.
    diagonal : ndarray, optional
        ``|diag(R)|`` where the caller has it already
        (:func:`~scipy_gpuqr._factor.solve_rank.abs_diagonal` of this R): not
        gathered again from R's scattered entries.
    fro_bound : float, optional
        An upper bound of ``‖R‖_F`` known without a pass over R's values (see
        :func:`frobenius_bound`: the factored matrix's own norm, which an
        orthogonal factorization keeps). The rules use ``‖R‖_F`` only as an
        upper bound of ``σ_max`` (a looser one can only make a test stricter),
        so this serves in its place; default: one pass over R's values.
    known : KnownNorms, optional
        The factored matrix's σ_max and a failed probe of its inverse's norm,
        learnt by the caller (G = R only, not ``transposed``): the decision takes
        them for its own Lanczos on R and its own probe through R's solves.
    """

    R: sp.csc_array
    cutoff: float
    transposed: bool = False
    factorize: Optional[Factorize] = None
    device: str = "cpu"
    solves: Optional[tuple] = field(default=None, repr=False)
    dense_device: Optional[str] = None
    products: Optional[tuple] = field(default=None, repr=False)
    rhs: Optional[Callable] = field(default=None, repr=False)
    rhs_beside: bool = False
    rhs_device: Optional[Callable] = field(default=None, repr=False)
    fro_bound: Optional[float] = None
    probe_start: Optional[tuple] = field(default=None, repr=False)
    diagonal: Optional[np.ndarray] = field(default=None, repr=False)
    known: Optional[KnownNorms] = field(default=None, repr=False)
    method: str = field(init=False, default="")
    cod_device: str = field(init=False, default="cpu")
    revealed: bool = field(init=False, default=True)
    rank: int = field(init=False, default=0)
    sigma_max: float = field(init=False, default=float("nan"))
    sigma_min: float = field(init=False, default=float("nan"))
    rcond: float = field(init=False, default=float("nan"))
    _svd: tuple = field(init=False, default=None, repr=False)
    _cod: tuple = field(init=False, default=None, repr=False)
    _tri: Optional[UpperTriangular] = field(init=False, default=None, repr=False)
    _fro: Optional[float] = field(init=False, default=None, repr=False)
    # R's host solves once set up (SuperLU's sweeps, or BLAS on a dense copy: _host_upper)
    _rtri: Optional[object] = field(init=False, default=None, repr=False)
    # R's compiled sweeps for the host's probe and null-space COD (False: not at hand)
    _rnative: object = field(init=False, default=None, repr=False)
    # σ_max of R by Lanczos to 1e-12 once a rule computed it, on the host or on R made
    # dense on the GPU (the next rules reuse it)
    _smax_lanczos: Optional[float] = field(init=False, default=None, repr=False)
    # (ν, margin) of a probe of ‖R⁻¹‖₂ that did not confirm full rank
    _probe: Optional[tuple] = field(init=False, default=None, repr=False)
    # the threshold at which the σ test of all of R failed
    _sigma_failed: Optional[float] = field(init=False, default=None, repr=False)
    # ‖R‖_F being computed on a worker thread (_late_upper_cutoff)
    _fro_pending: Optional[Future] = field(init=False, default=None, repr=False)
    # the pools process_limited lowered for the decision (None outside it)
    _lowered: Optional[object] = field(init=False, default=None, repr=False)
    # the BLAS threads of the decision and its solves (None: the pools' own counts)
    _threads: Optional[int] = field(init=False, default=None, repr=False)
    # R made dense (Fortran order) by the 1-norm test that settled full rank, where the
    # triangular solves take a dense triangle of that order: theirs, not made again
    _dense_r: Optional[np.ndarray] = field(init=False, default=None, repr=False)
    # R made dense on the device by the σ test of all of R that failed: the device rules
    # after it (the subspace decision, the SVD) read it, not a copy made again; dropped
    # with the decision
    _device_r: Optional[object] = field(init=False, default=None, repr=False)
    # whether the device's subspace decision was tried (once per decision)
    _subspace_tried: bool = field(init=False, default=False, repr=False)

    def __post_init__(self):
        if self.fro_bound is not None and np.isfinite(self.fro_bound):
            self._fro = float(self.fro_bound)
        known, self.known = self.known, None
        if known is not None and not self.transposed:
            if known.sigma_max is not None and np.isfinite(known.sigma_max) \
                    and known.sigma_max > 0:
                self._smax_lanczos = float(known.sigma_max)
            if known.inverse_norm is not None:
                self._probe = tuple(float(v) for v in known.inverse_norm)
        try:
            threads = self._blas_threads()
            if threads is not None and self._full_rank_unlimited():
                return                  # R⁻¹ answers: nothing for the pools to spread
            self._threads = threads
            with process_limited(threads) as self._lowered:
                self._decide()
        finally:
            self._lowered = None
            self._device_r = None
            self.rhs = None             # it may hold its caller (a factorization)
            self.rhs_device = None
            self.probe_start = None
            if self._fro_pending is not None:
                self._frobenius()       # the worker's pass ends with the decision

    def _nullspace_min_order(self) -> int:
        """Smallest order at which the null-space COD is tried first:
        :data:`NULLSPACE_HOST_MIN_ORDER` where R's solves are the host's (no
        device solves given), else :data:`SOLVE_RANK_MIN_ORDER`."""
        if self.solves is None and self.device == "cpu":
            return min(NULLSPACE_HOST_MIN_ORDER, SOLVE_RANK_MIN_ORDER)
        return SOLVE_RANK_MIN_ORDER

    def _full_rank_unlimited(self) -> bool:
        """Full rank by the 1-norm test alone, before the process' BLAS pools are
        lowered.

        For a square host R of order up to :data:`DENSE_LIMIT` with a finite
        diagonal whose smallest entry is above ``cutoff·max|r_ii|``, and whose
        σ test would run on the host (no device solves; the GPU's dense σ test
        from :data:`SVD_GPU_MIN_ORDER` keeps its place), the first rule is LAPACK's
        ``dtrcon`` on R made dense: level-2 work on one thread. Where it settles
        full rank, R⁻¹ answers through SuperLU's sweeps, so neither the decision
        nor its solves make a BLAS call a pool could spread. Otherwise the
        estimate is kept for :meth:`_full_rank_confirmed` and the decision runs
        with the pools lowered as before.
        """
        R = self._csc_r()
        k, q = R.shape
        if k != q or q == 0 or q > DENSE_LIMIT or self.solves is not None:
            return False
        if (self.dense_device or self.device) == "gpu" and q >= SVD_GPU_MIN_ORDER:
            return False
        d = self.diagonal
        if d is None or d.shape != (q,):
            d = abs_diagonal(R)
        if not (np.isfinite(d).all() and d.min() > 0 and d.min() > self.cutoff * d.max()):
            return False
        if self._one_norm_test_hopeless():
            return False
        Rd = R.toarray(order="F")
        self.rcond = _dense_rcond(Rd)
        if not self.rcond >= 10.0 * q * self.cutoff:
            return False
        self._dense_r = Rd if q <= DENSE_SOLVE_LIMIT else None     # kept only till the solve
        self.method, self.rank = "triangular", q
        return True

    def _blas_threads(self) -> Optional[int]:
        """BLAS threads for the decision and the solves: one for R of order up to
        :data:`SINGLE_THREAD_ORDER`, else the pools' own counts (None)."""
        return 1 if max(self.R.shape) <= SINGLE_THREAD_ORDER else None

    def _csc_r(self) -> sp.csc_array:
        """``R`` as a ``csc_array`` (converted once, kept in its place): the
        1-norm test and the decision after it read the same one."""
        if type(self.R) is not sp.csc_array:
            self.R = sp.csc_array(self.R)
        return self.R

    def _decide(self):
        R = self._csc_r()
        if self.dense_device is None:
            self.dense_device = self.device
        k, q = R.shape
        if k == 0 or q == 0:
            self.method, self.rank = "empty", 0
            self.sigma_max = self.sigma_min = 0.0
            return
        d = self.diagonal
        if d is None or d.shape != (min(k, q),):
            d = abs_diagonal(R)
        # a nonzero diagonal entry settles ‖R‖ > 0 without a pass over R's values
        if not (d.size and d.max() > 0) and not np.any(R.data):
            # ‖R‖ = 0 (no entries, or explicit zeros only): rank 0, x = 0. Decided
            # here because the estimates below cannot run on a zero operator
            # (ARPACK's Lanczos stops with "Starting vector is zero").
            self.method, self.rank = "zero", 0
            self.sigma_max = self.sigma_min = 0.0
            return
        square_ok = (k == q and np.all(np.isfinite(d)) and np.all(d > 0))
        # σ_min(R) <= min|r_ii| and σ_max(R) >= max|r_ii|: a small diagonal
        # entry proves the deficiency, and no full-rank test is tried
        if square_ok and d.min() > self.cutoff * d.max():
            if self._full_rank_confirmed():
                return
        if square_ok and q >= self._nullspace_min_order() and self._prepare_nullspace_cod(d):
            return
        # a GPU factorization's gap check would factorize R again on the GPU: R's small
        # singular subspace on the device comes first there (beyond DENSE_LIMIT before
        # the device's dense COD of all of R too)
        if square_ok and self.device == "gpu" and self._prepare_device_subspace(d):
            return
        if self._sparse_cod_first() and self._prepare_gap_checked_cod():
            return
        if square_ok and self._prepare_sparse_subspace(d):
            return
        if max(k, q) <= DENSE_LIMIT or self.factorize is None:
            if square_ok and self._prepare_device_subspace(d):
                return
            self._prepare_svd(self._dense_g_on_gpu())
            return
        # beyond DENSE_LIMIT with R's dense work on the GPU (auto's CPU factorization
        # with a GPU present): its small singular subspace there before the dense COD
        if square_ok and self._prepare_device_subspace(d):
            return
        device = self._dense_cod_device()
        if device == "gpu":
            try:
                self._prepare_dense_cod(device, d)
                return
            except MemoryError:
                # the device's memory is shared or limited (CuPy's pool limit;
                # CuPy's OutOfMemoryError is a MemoryError): the host's COD
                # where it fits, else the sparse COD below
                _free_device_pool()
                device = "cpu" if max(self.R.shape) <= DENSE_COD_HOST_LIMIT else None
        if device is not None:
            self._prepare_dense_cod(device, d)
            return
        if not np.isfinite(self.sigma_max):
            self.sigma_max = self._sigma_max()
        self._prepare_cod()

    # -- full rank: R⁻¹ answers --------------------------------------------------
    def _full_rank_confirmed(self) -> bool:
        """Decide that square R with a nonzero diagonal has full rank under lstsq's rule.

        First the 1-norm condition estimate (cheap, with the factor ``10·q``
        for the 1-norm/2-norm gap); failing that, the randomized probe through
        R's solves (:meth:`_full_rank_probed`; first of all from
        :data:`SOLVE_RANK_MIN_ORDER` columns beyond DENSE_LIMIT); failing
        that, σ_max by Lanczos and σ_min
        by :func:`~scipy_gpuqr._factor.triangular.sigma_min_upper` (a guaranteed
        lower bound or an accurate estimate for q ≤ DENSE_LIMIT, Lanczos with
        the margin :data:`_SIGMA_MARGIN` beyond). Where the dense refinements
        run on the GPU (``dense_device``, q from :data:`SVD_GPU_MIN_ORDER` to
        DENSE_LIMIT) the σ test runs there without the 1-norm estimate, after
        the probe where R's solves are the host's (:meth:`_device_sigma_max`).

        Where the probe ran and failed, its ν (a lower bound of ``‖R⁻¹‖₂``,
        so ``σ_min <= 1/ν`` for certain) is tested again with σ_max by Lanczos
        in place of its bound ``‖R‖_F`` (:meth:`_probe_settles`): it confirms
        full rank where ``M·ν·cutoff·σ_max < 1``, and where ``1/ν`` is already
        within the σ test's margin of the cutoff no σ_min estimate can
        legitimately pass, so none is computed (the rank-deficiency rules
        decide, and they also find full rank where σ_min lies just above the
        cutoff).
        """
        R = self.R
        q = R.shape[0]
        probe_first = q > DENSE_LIMIT and q >= SOLVE_RANK_MIN_ORDER
        if probe_first and self._full_rank_probed():
            return True
        if q <= DENSE_LIMIT and self._dense_gpu_pays():
            # R densely on the GPU: the σ test itself costs a few cuBLAS calls
            # (less than the host's triangular solves and Lanczos), so it
            # decides without the 1-norm estimate
            smax, settled, Rgpu = self._device_sigma_max()
            if settled is not None:
                if not settled:
                    self._device_r = Rgpu   # the device rules after it read it (or None)
                return settled
            if Rgpu is None:
                Rgpu = self._dense_on_gpu(as_g=False)
            est = sigma_min_upper(Rgpu, self.cutoff * smax, margin=_DENSE_SIGMA_MARGIN)
            self._device_r = Rgpu       # the device rules after a failed test read it
            del Rgpu
        else:
            solves = self._estimate_solves()
            # a failed probe may show that the 1-norm test below could pass only by
            # its estimate's shortfall: then it is not run
            probed = self._one_norm_test_hopeless()
            if not probed and not np.isfinite(self.rcond):     # not estimated yet
                self.rcond = _rcond_estimate(R, solves)
                if self.rcond >= 10.0 * q * self.cutoff:
                    self.method, self.rank = "triangular", q
                    return True
            # the probe through R's sparse solves on the host (a few solves with 8
            # columns) before the σ test (R⁻¹ made dense, q³/3 flops): on
            # ill-conditioned full-rank R the 1-norm estimate misses by its factor
            # 10·q (given solves, a GPU's, keep the σ test: not measured there)
            if not probe_first and self.solves is None and self._full_rank_probed():
                return True
            smax = self._sigma_max()
            settled = self._probe_settles(smax)
            if settled is not None:
                return settled
            est = sigma_min_upper(R, self.cutoff * smax, solves=solves)
        self.sigma_min, self.sigma_max = float(est.value), smax
        if _clearly_above(est, q, self.cutoff * smax):
            self.method, self.rank = "triangular", q
            return True
        self._sigma_failed = self.cutoff * smax
        return False

    def _device_sigma_max(self) -> tuple:
        """``(σ_max, settled, R on the device or None)`` before the GPU's σ test of
        all of R.

        Where R's solves are the host's (no device solves given: SuperLU's sweeps
        on a sparse R), the randomized probe through them comes first, as on the
        host: a few block solves confirm most full-rank R (``settled`` True), and
        where the probe fails its ν, with σ_max, may show that no σ_min estimate
        can pass the test (``settled`` False: the rank-deficiency rules decide,
        and no dense copy of R goes to the device for it). σ_max is then the
        host's Lanczos on R where R is sparse enough for the gap-checked sparse
        COD, which reads the same value next. Otherwise (device solves given: the
        σ test runs on the device whatever σ_max is) it is Lanczos on R made dense
        on the GPU, and that copy is returned for the σ test. Either σ_max is kept
        for the rules after this test. ``settled`` None: the σ test decides."""
        if self.solves is None:
            if self._full_rank_probed():
                return self.sigma_max, True, None
            if self._smax_lanczos is not None or self._sparse_cod_first():
                smax = self._sigma_max()
                return smax, self._probe_settles(smax), None
        Rgpu = self._dense_on_gpu(as_g=False)
        if self._smax_lanczos is None:
            self._smax_lanczos = norm2_lanczos(Rgpu)
        smax = self._smax_lanczos
        return smax, self._probe_settles(smax), Rgpu

    def _estimate_solves(self) -> Optional[tuple]:
        """R's solves for the 1-norm and σ_min estimates: the given ones, else the
        host's already set up for the probe (None: each estimate sets up its own)."""
        if self.solves is not None:
            return self.solves
        if self._rtri is None and self._rnative:
            return self._rnative.solve, self._rnative.solve_t
        return self._rtri.solves() if self._rtri is not None else None

    def _one_norm_test_hopeless(self) -> bool:
        """Whether a failed probe of ``‖R⁻¹‖₂`` (its own, or the caller's: :class:`KnownNorms`)
        shows that the 1-norm test (``rcond >= 10·q·cutoff``) could pass only by its
        estimate's shortfall: ``‖R‖_F <= √q‖R‖₁`` and ``ν <= ‖R⁻¹‖₂ <= √q‖R⁻¹‖₁`` give
        ``‖R‖₁‖R⁻¹‖₁ >= ν·‖R‖_F/q``, at least ``1/(10·q·cutoff)`` where ``ν·cutoff·‖R‖_F >=
        0.1`` (a probe that failed with a margin M < 10 had ``M·ν·cutoff·‖R‖_F >= 1``).
        The test is then not run (it costs R made dense on the host, or solves)."""
        if self._probe is None:
            return False
        nu, margin = self._probe
        if margin < 10.0:
            return True
        return bool(np.isfinite(nu) and nu > 0 and nu * self.cutoff * self._frobenius() >= 0.1)

    def _probe_settles(self, smax: float) -> Optional[bool]:
        """The failed probe's ν tested with σ_max (Lanczos): True (full rank, as
        :meth:`_full_rank_probed` with ``σ_max`` for ``‖R‖_F``), False (``σ_min <=
        1/ν`` within the σ test's margin of the cutoff: that test cannot confirm),
        None (no probe, or the σ test decides)."""
        if self._probe is None:
            return None
        nu, margin = self._probe
        q = self.R.shape[0]
        tol = self.cutoff * smax
        if not (np.isfinite(nu) and nu > 0 and tol > 0):
            return None
        if margin * nu * tol < 1.0:
            self.method, self.rank = "triangular", q
            self.sigma_min, self.sigma_max = 1.0 / nu, smax
            self._tri = self._rtri
            return True
        if self._sigma_test_hopeless(q, tol):
            self.sigma_min, self.sigma_max = 1.0 / nu, smax     # σ_min at most this
            return False
        return None

    def _sigma_test_hopeless(self, order: int, threshold: float) -> bool:
        """Whether the σ test of R, or of a triangle of this order with R's singular
        values, cannot pass at ``threshold``: R's own σ test failed at a threshold
        no larger, or a failed probe's ν (``σ_min(R) <= 1/ν``) lies within the σ
        test's margin of ``threshold`` (:func:`_clearly_above`'s for this order)."""
        if self._sigma_failed is not None and order == min(self.R.shape) \
                and threshold >= self._sigma_failed:
            return True
        if self._probe is None:
            return False
        nu = self._probe[0]
        margin = _DENSE_SIGMA_MARGIN if order <= DENSE_LIMIT else _SIGMA_MARGIN
        return bool(np.isfinite(nu) and nu > 0 and 1.0 / nu <= margin * threshold)

    # -- decisions through R's triangular solves (scipy_gpuqr._factor.solve_rank) --
    def _solve_ops(self) -> tuple:
        """``(C ↦ R⁻¹C, C ↦ R⁻ᵀC, xp)``: the given solves (the GPU's, blocks kept
        on the device where the dense refinements run there) or the host's."""
        if self.solves is not None:
            up, upt = self.solves
            xp = np
            if self.dense_device == "gpu" and _gpu.gpu_available():
                xp = _gpu.import_cupy()
            return up, upt, xp
        compiled = self._compiled_upper()
        if compiled is not None:
            return compiled.solve, compiled.solve_t, np
        up, upt = self._host_upper().solves()
        return up, upt, np

    def _compiled_upper(self) -> Optional[SparseUpperSolves]:
        """R's compiled sweeps (:class:`~scipy_gpuqr._factor.native.SparseUpperSolves`:
        R read once per block, not column by column, and no SuperLU set-up) where
        :meth:`_host_upper` would set up SuperLU's and the library is at hand; None
        otherwise (SuperLU's, BLAS on R's dense copy or the small dense triangle
        answer). Set up once per decision."""
        if self._rnative is None:
            self._rnative = False
            R = self.R
            q = R.shape[0]
            sparse = (q > DENSE_SOLVE_LIMIT and R.nnz <= SUPERLU_MAX_NNZ
                      and not (q <= DENSE_SIGMA_LIMIT and R.nnz >= DENSE_SOLVE_FILL * q * q)
                      and not self._dense_upper_fits())
            lib = native_handle() if sparse and R.dtype == np.float64 else None
            if lib is not None:
                r = R.diagonal()
                if np.all(np.isfinite(r)) and np.all(r != 0):
                    self._rnative = SparseUpperSolves(lib, R)
        return self._rnative or None

    def _g_product(self) -> Callable:
        """``Y ↦ G Y`` on host arrays (G = R, or Rᵀ when transposed): the given
        product where it answers, else R's sparse copy."""
        G = self.R.T if self.transposed else self.R
        given = self.products[1 if self.transposed else 0] if self.products else None
        if given is None:
            return lambda Y: G @ Y

        def product(Y):
            out = given(Y)
            return G @ Y if out is None else out
        return product

    def _host_upper(self):
        """R's solves on the host, set up once: BLAS on a dense copy where R is
        stored densely beyond DENSE_LIMIT and the copy fits
        (:class:`~scipy_gpuqr._factor.dense_upper.DenseUpper`), else SuperLU's
        sweeps (:class:`~scipy_gpuqr._factor.triangular.UpperTriangular`)."""
        if self._rtri is None:
            R = self.R
            self._rtri = DenseUpper(R) if self._dense_upper_fits() else UpperTriangular(R)
        return self._rtri

    def _dense_upper_fits(self) -> bool:
        """Whether R's host solves are BLAS's on a dense copy: R stored densely
        beyond DENSE_LIMIT, and the copy fits in host memory."""
        R = self.R
        q = R.shape[0]
        if not (q > DENSE_LIMIT and stored_densely(R)):
            return False
        avail = available_host_memory()
        return avail is None or 8 * q * q <= DENSE_UPPER_MEMORY_FRACTION * avail

    def _sigma_max(self) -> float:
        """σ_max of R by Lanczos to 1e-12, computed once per decision (BLAS
        products on R's dense copy where :meth:`_host_upper` made one).

        On a sparse R every OpenBLAS runs it on one thread at any order: its
        BLAS is ARPACK's vector work on a few q-vectors per step beside R's
        sparse products, which a pool of workers does not speed up and whose
        woken workers then spin through the decision's next steps."""
        if self._smax_lanczos is None:
            tri = self._rtri
            if isinstance(tri, DenseUpper):
                self._smax_lanczos = tri.sigma_max()
            else:
                with process_limited(1):
                    self._smax_lanczos = sigma_max_lanczos(self.R)
        return self._smax_lanczos

    def _frobenius(self) -> float:
        if self._fro is None:
            pending, self._fro_pending = self._fro_pending, None
            self._fro = pending.result() if pending is not None else frobenius(self.R)
        return self._fro

    def _late_upper_cutoff(self, d: np.ndarray, dead: int):
        """``cutoff·‖R‖_F`` for :class:`~scipy_gpuqr._factor.solve_rank.NullspaceCOD`'s
        ``tol_range``, given late: a callable (``‖R‖_F``, one pass over R's
        values on the host, runs on a worker thread meanwhile, NumPy's dot
        releasing the GIL) that raises NullspaceRefused where a pivot lies
        between the cutoff's bounds (``count(d <= hi) != dead``, the test the
        dead count was taken without); the value itself where ``‖R‖_F`` is known."""
        if self._fro is None and self._fro_pending is None:
            ex = ThreadPoolExecutor(1, thread_name_prefix="gpuqr-fro")
            try:
                self._fro_pending = ex.submit(frobenius, self.R)
            finally:
                ex.shutdown(wait=False)     # the thread ends with its one task

        def hi() -> float:
            value = self.cutoff * self._frobenius()
            if int(np.count_nonzero(d <= value)) != dead:
                raise NullspaceRefused("pivots between the cutoff's bounds")
            return value
        return hi

    def _full_rank_probed(self) -> bool:
        """Full rank by :func:`~scipy_gpuqr._factor.solve_rank.probe_norm`: ν ≈
        ``‖R⁻¹‖₂`` from one to three block solves, confirmed where ``M·ν·cutoff·‖R‖_F
        < 1`` (σ_min ≥ 1/(Mν) except with probability PROBE_FAILURE per step,
        σ_max ≤ ‖R‖_F; M the margin of the step). False at once where a probe of
        the same norm already failed (:class:`KnownNorms`)."""
        if self._probe is not None:
            return False
        up, upt, xp = self._solve_ops()
        q = self.R.shape[0]
        bound = self.cutoff * self._frobenius()
        start, self.probe_start = self.probe_start, None
        try:
            if start is not None:       # S = R⁻ᵀ: its first step, R⁻¹Ω, is given
                nu, margin = probe_norm(upt, up, q, xp=xp, start=start,
                                        accept=lambda nu, m: m * nu * bound < 1.0)
            else:
                nu, margin = probe_norm(up, upt, q, xp=xp,
                                        accept=lambda nu, m: m * nu * bound < 1.0)
        except MemoryError:
            # the probe's blocks do not fit beside the factors (a GPU under a
            # memory limit; CuPy's OutOfMemoryError is a MemoryError): the
            # one-column rules below decide instead
            return False
        if not (np.isfinite(nu) and nu > 0):
            return False                # a non-finite solve: nothing learnt
        if not margin * nu * bound < 1.0:
            self._probe = (float(nu), float(margin))
            return False
        self.method, self.rank = "triangular", q
        self.sigma_min, self.sigma_max = 1.0 / nu, self._fro
        self._tri = self._rtri          # the host's solves, set up for the probe (or None)
        return True

    def _prepare_nullspace_cod(self, d: np.ndarray) -> bool:
        """lstsq's rank and solution where a few tiny pivots leave a clear gap
        (:class:`~scipy_gpuqr._factor.solve_rank.NullspaceCOD`); False where it
        does not apply (pivots near the cutoff, too many, no gap, a zero pivot).

        The cutoff is bracketed by ``max|r_ii| <= σ_max <= ‖R‖_F``; only where the
        checks depend on where σ_max lies in that range is σ_max estimated by
        Lanczos.
        """
        q = self.R.shape[0]
        lo = self.cutoff * float(d.max())
        # the pivots under the lower bound; those under the upper one must be the
        # same (checked once ‖R‖_F is known, computed while the device solves)
        dead = _dead_pivots(d, lo)
        if dead == 0:
            return False
        hi = self._late_upper_cutoff(d, dead)
        up, upt, xp = self._solve_ops()
        on_host = False             # device solves whose blocks stay on the host
        try:
            cod = NullspaceCOD(up, upt, q, dead, (lo, hi), transposed=self.transposed, xp=xp,
                               rhs=self.rhs, rhs_beside=self.rhs_beside,
                               rhs_device=self.rhs_device)
        except NullspaceRefused:                    # no clear gap
            return False
        except MemoryError:
            if xp is np:
                return False
            # the q × d blocks do not fit beside the factors (a GPU under a memory
            # limit; CuPy's OutOfMemoryError is a MemoryError): they stay on the
            # host and the device solves them one call at a time, far cheaper
            # than the dense COD of all of R that would answer instead
            _free_device_pool()
            up, upt, on_host = _results_on_host(up), _results_on_host(upt), True
            try:
                cod = NullspaceCOD(up, upt, q, dead, (lo, hi), transposed=self.transposed,
                                   xp=np, rhs=self.rhs)
            except (NullspaceRefused, MemoryError):
                return False
        smax = self._frobenius()
        if not cod.certain():
            smax = self._sigma_max()
            if not cod.holds(self.cutoff * smax):
                return False
        self.method, self.rank = "nullspace_cod", int(cod.rank)
        self.sigma_max, self.sigma_min = float(smax), float(cod.sigma_min)
        self.cod_device = "gpu" if xp is not np or on_host else "cpu"
        self._cod = cod
        return True

    # -- sparse COD whose rank is checked against lstsq's rule --------------------
    def _sparse_cod_first(self) -> bool:
        """Try the sparse COD before any dense refinement?

        Where a rank-detecting sparse QR of G is cheap (R sparse: at most
        :data:`SPARSE_COD_MAX_DENSITY` of its entries nonzero) and a dense
        refinement would run on the host (an SVD, or a dense COD whose
        second QR costs ``2r²q`` flops, far more than a sparse QR of a sparse
        R). A GPU factorization keeps
        its dense COD on the device beyond :data:`DENSE_LIMIT` columns.
        """
        k, q = self.R.shape
        if self.factorize is None or not self.cutoff > 0:
            return False
        if self.R.nnz > SPARSE_COD_MAX_DENSITY * k * q:
            return False
        return self.device == "cpu" or max(k, q) <= DENSE_LIMIT

    def _prepare_gap_checked_cod(self) -> bool:
        """The sparse COD, kept only where its rank is provably lstsq's.

        ``G P = Q [R11 R12; 0 E]`` with the rank-detecting QR at the absolute
        tolerance ``tol = cutoff·σ_max(G)`` (σ_max by Lanczos to 1e-12): E is
        what the QR dropped, computed exactly as rows ``r:`` of ``Qᵀ G P[:, r:]``.
        Then ``σ_{r+1}(G) <= ‖E‖₂`` and ``σ_r(G) >= σ_min(R11)`` (singular
        values of a matrix bound those of its blocks), so ``‖E‖₂ <= tol <
        σ_min(R11)`` means lstsq's rank is r and the truncated SVD's solution
        is the COD's up to a perturbation ``<= ‖E‖₂``. σ_min(R11) comes from
        :func:`~scipy_gpuqr._factor.triangular.sigma_min_upper` (a bound, or an
        estimate with a margin), on the GPU where the dense refinements run there
        and the host's compiled sweeps would not answer for less
        (:meth:`_sigma_min_on_device`). False
        (nothing kept) when either test fails, or where the QR kept every column and
        R's own σ test failed, or a failed probe of R's inverse shows that it cannot
        pass (R11 then has R's singular values), or where one power step on R11's
        compiled sweeps proves ``σ_min(R11) <= tol`` (:func:`sigma_min_ceiling`,
        before E is formed: R's singular values spread across the cutoff, e.g.
        bayer10, where the QR's greedy rank keeps columns lstsq drops).
        """
        G = sp.csc_array(self.R.T) if self.transposed else self.R
        kG, qG = G.shape
        smax = self._sigma_max()            # σ_max(Rᵀ) = σ_max(R)
        if not smax > 0:
            return False
        tol = self.cutoff * smax
        first = self.factorize(G, tol=tol)
        r = int(first.rank)
        dead = qG - r
        if r == 0 or kG * dead > GAP_CHECK_MAX_ENTRIES:
            return False
        if dead == 0 and self._sigma_test_hopeless(r, tol):
            # every column kept: R11 is R's triangle again (R's singular values), whose
            # σ test already failed, or could not pass after a failed probe
            return False
        Rf = sp.csc_array(first.R)
        R11, R1 = _leading_block(Rf, r, r), _leading_block(Rf, r, qG)
        # σ_min(R11) <= tol proved (one power step) where it is far below: the
        # check below cannot pass (its estimate would have to exceed σ_min(R11)
        # several-fold), and E and σ_min(R11)'s estimate are not paid for
        ceiling = sigma_min_ceiling(R11)
        if ceiling is not None and ceiling <= tol:
            return False
        if dead:
            cols = np.asarray(first.colperm)[r:]
            E = np.asarray(first.qt_matmul(G[:, cols].toarray()))[r:]
            e_norm = float(np.linalg.norm(E, 2)) if E.size else 0.0
            if not e_norm <= tol:
                return False
        tri = UpperTriangular(R11) if r > DENSE_SIGMA_LIMIT else None
        est = self._sigma_min_on_device(R11, tol) if tri is None else None
        if est is None:
            est = sigma_min_upper(R11, tol, solves=tri.solves() if tri else None)
        if not _clearly_above(est, r, tol):
            return False
        second = self.factorize(transposed_csc(R1), tol=None) if dead else None
        if second is None:
            self._tri = tri             # solve() uses R11 itself: set up once
        self.method, self.rank = "cod", r
        self.sigma_max, self.sigma_min = smax, float(est.value)
        self.cod_device = self.device
        self._cod = (first, second, R1)
        return True

    def _sigma_min_on_device(self, T: sp.csc_array, threshold: float):
        """σ_min of the gap check's triangle T (order at most DENSE_SIGMA_LIMIT) on the
        GPU where the dense refinements run there (:attr:`dense_device`) and T has at
        least :data:`SVD_GPU_MIN_ORDER` columns: T made dense on the device, its inverse
        by cuBLAS and Lanczos on it (:func:`~scipy_gpuqr._factor.triangular.sigma_min_upper`),
        a few milliseconds where the host's ``trtri`` and dense Lanczos on one thread
        take about ``q³/3`` flops and ``q²`` per step. None: the host answers (no GPU,
        a smaller T, T does not fit beside what the device holds, or the host's compiled
        sweeps answer T for less, :func:`host_sigma_pays`: the device's dense libraries'
        first use is counted where the factorization ran on the host)."""
        q = T.shape[0]
        if self.dense_device != "gpu" or q < SVD_GPU_MIN_ORDER or not _gpu.gpu_available():
            return None
        if host_sigma_pays(q, T.nnz, device_set_up=self.device == "gpu") and \
                compiled_sigma_applies(T):
            return None
        try:
            Td = dense_from_sparse(T, _gpu.import_cupy())
            return sigma_min_upper(Td, threshold, margin=_DENSE_SIGMA_MARGIN)
        except MemoryError:
            # CuPy's OutOfMemoryError is a MemoryError: the device is shared or limited
            _free_device_pool()
            return None

    # -- dense refinement: exactly lstsq's rule -------------------------------
    def _dense_gpu_pays(self) -> bool:
        """Whether R's dense work goes to the GPU: :attr:`dense_device` says so,
        it pays (``min(k, q) >= SVD_GPU_MIN_ORDER``) and a GPU is there."""
        return (self.dense_device == "gpu" and min(self.R.shape) >= SVD_GPU_MIN_ORDER
                and _gpu.gpu_available())

    def _dense_on_gpu(self, as_g: bool = True):
        """G (R or Rᵀ; R itself when not ``as_g``) dense on the GPU where
        :meth:`_dense_gpu_pays`, else None (the host answers)."""
        if not self._dense_gpu_pays():
            return None
        G = dense_from_sparse(self.R, _gpu.import_cupy())
        return G.T.copy() if (self.transposed and as_g) else G

    def _dense_g_on_gpu(self):
        """G dense on the GPU for the SVD (:meth:`_dense_on_gpu`), from R's device copy
        where the σ test left one."""
        Rgpu, self._device_r = self._device_r, None
        if Rgpu is None or not self._dense_gpu_pays():
            return self._dense_on_gpu()
        return Rgpu.T.copy() if self.transposed else Rgpu

    def _prepare_device_subspace(self, d: np.ndarray) -> bool:
        """lstsq's rank and solutions from R's small singular subspace on the device
        (:class:`~scipy_gpuqr._factor.dense_subspace.DenseSubspaceCOD`), where R's dense
        work runs on the GPU (:meth:`_dense_gpu_pays`) and R is square with a nonzero
        diagonal, beyond DENSE_LIMIT where R made dense fits there with the decision's
        blocks (:func:`device_subspace_fits`): block inverse subspace iteration with R's
        triangular solves on R made dense there. A modest null space (tens to a few
        hundred singular values under the cutoff) is so decided for a few solves with the
        block (``3·p·q²`` flops a step), where the SVD of all of R (``10·q³``) or beyond
        DENSE_LIMIT the dense COD (``q³``, and where Heath's rule leaves no gap a decision
        after it) is the dearest dense step. Up to DENSE_LIMIT the rank is kept only where
        the gap at the cutoff is certified, the SVD deciding otherwise; beyond, gap or not
        unless the projections leak (``require_gap=False``: the host's subspace rule).
        Where R's solves grow beyond what the block resolves at the cutoff (pivots at
        their columns' rounding feeding one another) the decision refuses, and the rules
        that do not divide by R's pivots answer. Tried once."""
        if self._subspace_tried:
            return False
        self._subspace_tried = True
        k, q = self.R.shape
        if k != q or not self._dense_gpu_pays():
            return False
        max_block = _subspace_blocks(q, 0)[1]
        if q > DENSE_LIMIT and not device_subspace_fits(q, max_block):
            return False
        try:
            Rgpu = self._device_r
            if Rgpu is None:
                Rgpu = self._device_r = self._dense_on_gpu(as_g=False)
            if self._smax_lanczos is None:
                self._smax_lanczos = norm2_lanczos(Rgpu)
            smax = self._smax_lanczos
            tol = self.cutoff * smax
            if not tol > 0:
                return False
            # twice the pivots under the cutoff and more: more than the largest block,
            # and the null space is not modest (the SVD decides)
            first = _subspace_blocks(q, np.count_nonzero(d <= tol))[0]
            if first > max_block:
                return False
            # up to DENSE_LIMIT the SVD (lstsq's rule itself) decides where no gap is
            # certified; beyond, the host's rule: the rank of the Ritz values, gap or not
            cod = DenseSubspaceCOD(Rgpu, tol, transposed=self.transposed,
                                   block=min(max(first, DEVICE_SUBSPACE_BLOCK), max_block),
                                   max_block=max_block, sigma_max=smax,
                                   require_gap=q <= DENSE_LIMIT)
        except SubspaceTooLarge:
            return False
        except MemoryError:
            # CuPy's OutOfMemoryError is a MemoryError: the device is shared or limited
            self._device_r = None
            _free_device_pool()
            return False
        self.method, self.rank = "dense_subspace", int(cod.rank)
        self.sigma_max, self.sigma_min = float(smax), float(cod.sigma_min)
        self.cod_device = "gpu"
        self._cod = cod
        return True

    def _prepare_svd(self, G=None):
        """SVD of G (dense, NumPy or CuPy; default R or Rᵀ on the host)."""
        if G is None:
            G = self.R.toarray()
            if self.transposed:
                G = G.T
        if isinstance(G, np.ndarray):
            big = 10.0 * min(G.shape) ** 2 * max(G.shape) >= SVD_THREADED_FLOPS
            with (self._lowered.lifted() if big and self._lowered is not None
                  else contextlib.nullcontext()):
                U, s, Vt = la.svd(G, full_matrices=False, lapack_driver="gesdd",
                                  check_finite=False)
            self.cod_device = "cpu"
        else:                       # CuPy: stays on the device until solve
            import cupy                 # optional dependency
            U, s, Vt = cupy.linalg.svd(G, full_matrices=False)
            s = s.get()
            self.cod_device = "gpu"
        smax = s[0] if s.size else 0.0
        r = int(np.count_nonzero(s > self.cutoff * smax)) if smax > 0 else 0
        self.method, self.rank = "svd", r
        self.sigma_max = float(smax)
        self.sigma_min = float(s[r - 1]) if r else 0.0
        self._svd = (U[:, :r], s[:r], Vt[:r])

    # -- dense refinement beyond the SVD: blocked Heath COD (host or GPU) -------
    def _dense_cod_device(self) -> Optional[str]:
        """Where a dense COD of G fits: 'gpu' (within half of what the device may
        give now: free memory and CuPy's pool limit), 'cpu' or None (use the
        sparse COD)."""
        k, q = self.R.shape
        need = 8 * (3 * k * q + min(k, q) ** 2)      # G, its backup, Q₂ and R₂
        if self.dense_device == "gpu":
            if _gpu.gpu_available():
                avail = available_bytes(_gpu.import_cupy()).available
                if self._device_r is not None:      # R made dense there becomes G
                    avail += int(self._device_r.nbytes)
                if need <= DENSE_COD_GPU_FRACTION * avail:
                    return "gpu"
        if max(k, q) <= DENSE_COD_HOST_LIMIT:
            return "cpu"
        return None

    def _prepare_dense_cod(self, device: str, d: np.ndarray):
        """Heath's rule on R made dense on ``device`` (:class:`DenseCOD`, reusing the dense
        copy a rule before made on the GPU); where it keeps a column that lstsq's rule
        drops (no gap), R's small singular subspace or the SVD decides. ``d``: R's
        ``|r_ii|`` (:meth:`_decide`'s), for the sparse subspace after the device's COD.
        A MemoryError on the GPU reaches the caller."""
        Rgpu, self._device_r = self._device_r, None
        if device == "gpu" and Rgpu is not None:
            Rd = Rgpu                   # R made dense there by a rule before (overwritten)
        elif device == "gpu":
            Rd = dense_from_sparse(self.R, _gpu.import_cupy())
        else:
            Rd = self.R.toarray()
        G = Rd.T.copy() if self.transposed else Rd
        del Rd, Rgpu
        self.sigma_max = sigma_max_estimate(G)
        tol = self.cutoff * self.sigma_max
        svd_affordable = max(G.shape) <= SVD_FALLBACK_LIMIT[device]
        backup = G.copy() if svd_affordable else None
        cod = DenseCOD(G, tol, upper=not self.transposed)
        self.cod_device = device
        del G
        dead = int(cod.live.size - cod.rank)
        # host: where R's small singular subspace fits a small block it decides
        # lstsq's rank exactly, gap or not, for less than the COD's second QR
        # (which is then never computed) and than an SVD; the SVD remains its
        # fallback
        subspace = device == "cpu" and self._subspace_block(dead) is not None
        if subspace and dead:
            if self._prepare_subspace_cod(dead):
                return
            subspace = False
        self.sigma_min = cod.sigma_min_estimate()
        if cod.rank and self.sigma_min <= tol:
            # Heath's rule kept a column that lstsq's rule drops (no gap in
            # the singular values): R's small singular subspace (host: on R's
            # dense copy; after the device's COD: through R's sparse solves, as
            # the host decides a sparse R beyond DENSE_LIMIT) or the SVD (on the
            # same device, where affordable) decides; else Heath's rank stands
            # (reported).
            if subspace and self._prepare_subspace_cod(dead):
                return
            if device == "gpu" and self._prepare_sparse_subspace(d, after_device_cod=True):
                del cod, backup
                return
            if svd_affordable:
                del cod
                self._prepare_svd(backup)
                return
            self.revealed = False
        del backup
        self.method, self.rank = "dense_cod", int(cod.rank)
        self._cod = cod

    def _subspace_block(self, dead: int) -> Optional[tuple[int, int]]:
        """(first block, largest block) of the subspace decision, or None where it
        does not apply: R not square with a nonzero finite diagonal, or a first
        block (twice Heath's dead columns and :data:`SUBSPACE_BLOCK`) over
        ``min(SUBSPACE_MAX_BLOCK, q/3)``."""
        k, q = self.R.shape
        d = np.abs(self.R.diagonal())
        if k != q or not (np.all(np.isfinite(d)) and np.all(d > 0)):
            return None
        block, max_block = _subspace_blocks(q, dead)
        return (block, max_block) if block <= max_block else None

    def _prepare_subspace_cod(self, dead: int) -> bool:
        """lstsq's rank from R's small singular subspace (:mod:`scipy_gpuqr._factor.subspace_cod`).

        False where it does not apply (:meth:`_subspace_block`) or the
        subspace turns out to need a larger block.
        """
        blocks = self._subspace_block(dead)
        if blocks is None:
            return False
        # lstsq's cutoff needs σ_max far more accurately than Heath's rule does
        smax = self._sigma_max()
        try:
            cod = SubspaceCOD(self.R.toarray(order="F"), self.cutoff * smax,
                              transposed=self.transposed, block=blocks[0],
                              max_block=blocks[1])
        except SubspaceTooLarge:
            return False
        self.sigma_max = smax
        self.method, self.rank = "subspace_cod", int(cod.rank)
        self.sigma_min = cod.sigma_min
        self.cod_device = "cpu"
        self._cod = cod
        return True

    def _prepare_sparse_subspace(self, d: np.ndarray, after_device_cod: bool = False) -> bool:
        """lstsq's rank and solutions from R's small singular subspace through R's
        sparse triangular solves on the host
        (:func:`scipy_gpuqr._factor.sparse_subspace.decide`), where the dense rules
        would run on the host beyond DENSE_LIMIT, or from
        :data:`SPARSE_SUBSPACE_MIN_ORDER` columns up to it (the SVD it spares is
        then its fallback). ``after_device_cod``: where the device's dense COD found no
        gap at the cutoff beyond DENSE_LIMIT and R, square with a nonzero diagonal, is
        sparse (:data:`SPARSE_COD_MAX_DENSITY`): a few block solves through R's entries
        instead of cuSOLVER's SVD of all of R (``10·q³`` flops)."""
        k, q = self.R.shape
        small = q <= DENSE_LIMIT and q < SPARSE_SUBSPACE_MIN_ORDER
        if small or self.factorize is None:
            return False
        if after_device_cod:
            if (k != q or q <= DENSE_LIMIT or self.R.nnz > SPARSE_COD_MAX_DENSITY * k * q
                    or not (np.all(np.isfinite(d)) and np.all(d > 0))):
                return False
        elif self.dense_device != "cpu":
            return False
        # the decision compiles its own sweeps where the probe's were compiled
        tri = self._rtri if self._compiled_upper() is not None else self._host_upper()
        cod = sparse_subspace_decide(self.R, self.cutoff, d, transposed=self.transposed,
                                     upper=tri if isinstance(tri, UpperTriangular) else None,
                                     dense=tri.dense if isinstance(tri, DenseUpper) else None,
                                     block=SUBSPACE_BLOCK,
                                     max_block=SUBSPACE_MAX_BLOCK,
                                     sigma_max=self._sigma_max())
        if cod is None:
            return False
        self.method, self.rank = "subspace_cod", int(cod.rank)
        self.sigma_max, self.sigma_min = cod.sigma_max, cod.sigma_min
        self.cod_device = "cpu"
        self._cod = cod
        return True

    # -- sparse refinement: complete orthogonal decomposition -----------------
    def _prepare_cod(self):
        G = sp.csc_array(self.R.T) if self.transposed else self.R
        tol_abs = self.cutoff * self.sigma_max
        first = self.factorize(G, tol=tol_abs)
        r = int(first.rank)
        R1 = sp.csc_array(first.R)[:r]
        second = None
        if r < G.shape[1]:
            second = self.factorize(sp.csc_array(R1.T), tol=None)
        self.method, self.rank = "cod", r
        self._cod = (first, second, R1)

    def solve(self, C: np.ndarray) -> np.ndarray:
        """Minimum-norm least-squares ``Y`` with ``G Y ≈ C``; C of shape (rows of G, p)."""
        C = _as_2d(np.asarray(C, dtype=np.float64))
        if self._threads is None:       # process_limited(None) changes nothing
            return self._solve(C)
        with process_limited(self._threads):
            return self._solve(C)

    def _solve(self, C: np.ndarray) -> np.ndarray:
        k, q = self.R.shape
        rows, cols = (q, k) if self.transposed else (k, q)
        if self.method in ("empty", "zero"):
            return np.zeros((cols, C.shape[1]))
        if self.method == "triangular":
            if self._tri is None:
                self._tri = UpperTriangular(self.R, dense=self._dense_r)
                self._dense_r = None
            return self._tri.solve(C, trans=self.transposed)
        if self.method == "svd":
            U, s, Vt = self._svd
            if not isinstance(U, np.ndarray):       # computed on the GPU
                import cupy                 # optional dependency
                Cd = cupy.asarray(C)
                return (Vt.T @ ((U.T @ Cd) / cupy.asarray(s)[:, None])).get()
            return Vt.T @ ((U.T @ C) / s[:, None])
        if self.method == "nullspace_cod":
            return self._cod.solve(C, matmul=self._g_product())
        if self.method in ("subspace_cod", "dense_subspace"):
            return self._cod.solve(C)
        if self.method == "dense_cod":
            cod = self._cod
            if self.cod_device == "gpu":
                Y = cod.solve(cod.xp.asarray(C)).get()
            else:
                Y = cod.solve(C)
            return Y
        first, second, R1 = self._cod
        r = self.rank
        D = np.asarray(first.qt_matmul(C))[:r]
        if self._tri is None:
            self._tri = UpperTriangular(
                _leading_block(sp.csc_array((first if second is None else second).R), r, r))
        if second is None:
            Y1 = self._tri.solve(D)
        else:
            W = self._tri.solve(D[second.colperm], trans=True)
            pad = np.zeros((cols, C.shape[1]))
            pad[:r] = W
            Y1 = second.q_matmul(pad)
        Y = np.empty((cols, C.shape[1]))
        Y[first.colperm] = Y1
        return Y

    def retained_condition(self) -> float:
        """Estimated 2-norm condition number of the part of G the solutions use.

        Exact for the SVD, estimates otherwise (1-norm for the triangular fast
        path); ``inf`` where nothing is known (sparse COD).
        """
        if self.method in ("empty", "zero"):
            return 1.0
        if self.method == "triangular" and np.isfinite(self.rcond) and self.rcond > 0:
            return 1.0 / self.rcond
        if (self.method in ("svd", "dense_cod", "subspace_cod", "dense_subspace",
                            "nullspace_cod", "triangular")
                and self.sigma_min > 0):
            return float(self.sigma_max / self.sigma_min)
        return float("inf")

    def decided_on(self) -> str:
        """Where the decision's work ran: the COD's or SVD's device, or for
        ``'triangular'`` (no COD) where R's solves ran, the factorization's
        device when it supplied them (``solves``), else the host."""
        if self.method == "triangular":
            return self.device if self.solves is not None else "cpu"
        return self.cod_device

    def summary(self) -> dict:
        """JSON-ready description of the rank decision."""
        return {"method": self.method, "rank": int(self.rank), "device": self.decided_on(),
                "rank_revealed": bool(self.revealed),
                "cutoff": self.cutoff, "rcond_estimate": self.rcond,
                "sigma_min": self.sigma_min, "sigma_max": self.sigma_max}

    def inverse_gram_diagonal(self) -> np.ndarray:
        """``diag(pinv(GᵀG))`` in G's column order (for lsqr's ``calc_var``).

        Exact from the SVD or from ``R⁻¹`` computed by columns; NaN where
        neither is affordable (rank-deficient and beyond DENSE_LIMIT).
        """
        k, q = self.R.shape
        cols = k if self.transposed else q
        if self.method in ("empty", "zero"):
            return np.zeros(cols)
        if self.method == "svd":
            _, s, Vt = self._svd
            if not isinstance(Vt, np.ndarray):
                Vt = Vt.get()
            return ((Vt / s[:, None]) ** 2).sum(axis=0)
        if self.method == "triangular" and not self.transposed:
            # (RᵀR)⁻¹ = R⁻¹R⁻ᵀ: squared row norms of R⁻¹ (tall case).
            out = np.zeros(q)
            step = max(1, min(q, 2_000_000 // max(q, 1)))
            if self._tri is None:
                self._tri = UpperTriangular(self.R)
            for j in range(0, q, step):
                E = np.zeros((q, min(step, q - j)))
                E[np.arange(j, j + E.shape[1]), np.arange(E.shape[1])] = 1.0
                X = self._tri.solve(E, trans=True)  # columns of R⁻ᵀ = rows of R⁻¹
                out[j:j + E.shape[1]] = (X ** 2).sum(axis=0)
            return out
        return np.full(cols, np.nan)



def exact_solve(num, B: np.ndarray, *, trans: bool = False) -> np.ndarray:
    """Solve ``A X = B`` (or ``Aᵀ X = B``) exactly for square A = Q R Pᵀ.

    No rank detection: the caller has checked :func:`exactly_singular`.
    ``A X = B``: ``X[colperm] = R⁻¹ Qᵀ B``; ``Aᵀ X = B``: ``X = Q R⁻ᵀ B[colperm]``.
    """
    B = _as_2d(np.asarray(B, dtype=np.float64))
    n = num.shape[1]
    if B.shape[1] == 0 or n == 0:
        return np.zeros((n, B.shape[1]))
    R = sp.csc_array(num.R)[:n, :n]
    if trans:
        return np.asarray(num.q_matmul(solve_upper_transposed(R, B[num.colperm])))
    X = np.empty((n, B.shape[1]))
    X[num.colperm] = solve_upper(R, np.asarray(num.qt_matmul(B))[:n])
    return X
