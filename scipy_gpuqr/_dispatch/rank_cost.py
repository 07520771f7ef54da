"""The predicted seconds of the QR's rank decision, for ``auto``'s iterate-first rule.

Where R is not clearly of full rank, lstsq (:mod:`scipy_gpuqr._factor.lstsq`)
decides its rank by dense work on the host (the SVD, the dense COD or the
subspace iteration: the cube of R's order) up to :data:`RANK_DENSE_LIMIT`, by
sparse rules first on a sparse host R beyond :data:`RANK_SPARSE_MIN_ORDER`
(their cost follows R's entries), and by dense work on the device for a GPU
factorization's R (:func:`rank_decision_seconds`). On ill-conditioned matrices
that decision costs up to hundreds of factorizations, so the rule
(:mod:`scipy_gpuqr._dispatch.iterate_first`) adds it to the QR's predicted time
where the run shows the matrix may be ill-conditioned or rank deficient
(:func:`rank_risk`), and bounds it from below before the analysis has said
where R lies or how many entries it has (:func:`rank_decision_floor`). Where
SuperLU's factors of a square A predict the route lstsq's decision takes
(:class:`~scipy_gpuqr._dispatch.lu_route.LURoute`), it costs what that route
does: the gap-checked sparse COD with its σ test on the GPU
(:func:`gap_check_seconds`) or on the host (:func:`host_sparse_rank_seconds`),
or R's small singular subspace on the GPU (:func:`subspace_seconds`) or through
R's compiled host sweeps (:func:`host_subspace_seconds`).

The orders and the density that bound lstsq's rules are lstsq's own, written
here again because this part never imports :mod:`scipy_gpuqr._factor` (which
imports it); the tests compare them.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["RANK_RISK_COND", "RANK_RISK_SHARE", "RANK_S_PER_CUBE", "RANK_DENSE_LIMIT",
           "RANK_SPARSE_MIN_ORDER", "RANK_NULLSPACE_MIN_ORDER", "RANK_NULLSPACE_S_PER_SQUARE",
           "GAP_GPU_S_PER_SQUARE", "GAP_GPU_MIN_ORDER", "SUBSPACE_GPU_S_PER_SQUARE",
           "SUBSPACE_GPU_LARGE_S_PER_SQUARE", "HOST_SPARSE_RANK_S_PER_R_ENTRY",
           "RANK_SPARSE_MAX_DENSITY", "RANK_S_PER_R_ENTRY", "RANK_GPU_S_PER_SQUARE",
           "RANK_GPU_S_PER_CUBE", "rank_risk", "rank_decision_floor", "gap_check_seconds",
           "subspace_seconds", "host_sparse_rank_seconds", "HOST_SUBSPACE_STEPS",
           "HOST_SUBSPACE_BLOCK", "HOST_SWEEP_FLOPS", "HOST_GEMM_FLOPS", "host_subspace_seconds",
           "rank_decision_seconds"]

#: A run whose condition estimate reaches this is treated as one on a matrix
#: that may be ill-conditioned or rank deficient (LSQR's estimate grows
#: towards cond(A) but stays far below it: 1e5-3e6 at SciPy's stop on
#: matrices with cond 1e11-1e13).
RANK_RISK_COND = 1e4
#: ... and so is a run that has taken this share of min(m, n) iterations
#: (well-conditioned problems converge in a small fraction of it).
RANK_RISK_SHARE = 0.1
#: Seconds per q³ of the rank decision's dense work on an order-q R (SVD,
#: dense COD or the subspace iteration with its Lanczos estimates; measured
#: 0.4-2e-9 s on 2 cores on ill-conditioned shared matrices of order
#: 480-1800: nnc1374, adder_dcop_05, reorientation_1, dwt_878, west0479).
RANK_S_PER_CUBE = 2e-10
#: Largest order of R whose rank is decided by dense work on the host
#: (``scipy_gpuqr._factor.lstsq.DENSE_COD_HOST_LIMIT``); beyond it a second,
#: rank-revealing sparse factorization of R, costed as one more factorization.
RANK_DENSE_LIMIT = 14000
#: Beyond this order (lstsq's ``DENSE_LIMIT``) a sparse R on the host
#: (:data:`RANK_SPARSE_MAX_DENSITY`) has its rank decided by sparse rules
#: before any dense work: the gap-checked sparse COD (a rank-detecting sparse
#: QR of R), then the subspace iteration through R's triangular solves; their
#: cost grows with R's entries, not with the order's cube.
RANK_SPARSE_MIN_ORDER = 2500
#: Smallest order of a square R whose host rank decision tries the null-space COD
#: first where a few of R's pivots lie below the cutoff (lstsq's
#: ``NULLSPACE_HOST_MIN_ORDER``): two solves with that many columns and a probe,
#: no dense work. Where SuperLU found A exactly singular (``square.singular``:
#: exact dependences, whose singular values lie at rounding level, far below the
#: cutoff) such an R is likely, so the rank decision's floor there is 0 and the
#: factorization ahead may show it (dwt_878: 28 dead pivots, a clean gap).
RANK_NULLSPACE_MIN_ORDER = 500
#: Seconds per q² of that null-space COD and its solve on the host (dwt_878, q =
#: 878, 28 dead pivots: 8.5 ms of CPU time on the 2-core host, the lookup of the
#: process' BLAS pools included).
RANK_NULLSPACE_S_PER_SQUARE = 1e-8

#: Seconds per q² of the gap-checked sparse COD of a host R of order q whose σ test
#: runs on a GPU (auto with a GPU present: R11 made dense there, cuBLAS's inverse and
#: Lanczos), with σ_max by Lanczos, the rank-detecting sparse QR of R and the second
#: one of the host (measured on an H200 host, warm: adder_dcop_05, q = 1813, 28 ms).
GAP_GPU_S_PER_SQUARE = 1e-8
#: Smallest order of R11 whose σ test runs on the GPU (lstsq's ``SVD_GPU_MIN_ORDER``):
#: below, the host's dense Lanczos answers, at the cube's cost.
GAP_GPU_MIN_ORDER = 600
#: Seconds per q² of the rank decision from R's small singular subspace on a GPU (lstsq's
#: ``DenseSubspaceCOD``: R made dense there and its σ test, a few steps of a block inverse
#: subspace iteration with 128 columns, the probe of the gap), where U's pivots hide
#: A's deficiency: nnc1374's (q = 1374) on one H200, the median of an auto call's.
SUBSPACE_GPU_S_PER_SQUARE = 1.4e-8
#: ... and beyond :data:`RANK_SPARSE_MIN_ORDER` (lstsq's ``DENSE_LIMIT``), where the steps'
#: block solves (``3·p·q²`` flops) and R's dense copy outweigh the launches' latency:
#: seconds per q², never less than the decision at that order (bayer10's GPU R, q = 13436,
#: block 212, 4 steps: 0.28 s of a ``QRFactorization`` and solve of 0.32 s on one H200, warm).
SUBSPACE_GPU_LARGE_S_PER_SQUARE = 1.6e-9
#: On a host whose dense rank work is its own (no GPU: ``dense_gpu()`` False) and whose
#: compiled sparse sweeps answer (``host_sweeps()``), U's pivots that split at lstsq's cutoff
#: (``square.revealed_dead()``) predict the rank decision of an
#: R of order :data:`GAP_GPU_MIN_ORDER` to :data:`RANK_SPARSE_MIN_ORDER` as the host's
#: gap-checked sparse COD (lstsq tries it before any dense rule on a sparse host R: σ_max
#: known from the LU, a rank-detecting sparse QR of R, σ_min(R11) on R11's compiled sweeps,
#: a second sparse QR), whose cost follows R's entries, not the dense rules' cube:
#: seconds per entry of R (the analysis' count), on the dear side (adder_dcop_05 on 2
#: cores: 15-20 ms for 33 300 entries after the LU, against 1.19 s by the cube).
HOST_SPARSE_RANK_S_PER_R_ENTRY = 1e-6
#: On such a host, where U's pivots hide the deficiency (``square.hides_deficiency()``),
#: lstsq decides R's rank from R's small singular subspace through R's compiled host
#: sweeps (``sparse_subspace.decide``): a block inverse subspace iteration of p columns,
#: each step two sweeps through R's entries (``4·p·nnz(R)`` flops) and q × p Gram
#: products, rotations and Cholesky QRs (``8·q·p²`` flops). Its predicted cost
#: (:func:`host_subspace_seconds`) counts this many steps (nnc1374 4, bayer10 5) ...
HOST_SUBSPACE_STEPS = 5
#: ... of this block: lstsq's first block (64 columns) doubled, as R's pivots within
#: ``DIAG_HINT`` × the cutoff size it where U's pivots hide the deficiency (nnc1374) ...
HOST_SUBSPACE_BLOCK = 128
#: ... at these flops per second of the sweeps and of the dense products: process time
#: on 2 cores, both lanes counted (nnc1374's decision 0.063-0.072 s for q = 1374, the
#: analysis' 86 700 entries of R and p = 128: the model 0.067 s; bayer10's 0.95-1.14 s for
#: q = 13436, 490 000 entries and p = 212: the model 1.02 s).
HOST_SWEEP_FLOPS = 5e9
HOST_GEMM_FLOPS = 4e10
#: Largest share of R's q² entries that are nonzero for those sparse rules
#: (lstsq's ``SPARSE_COD_MAX_DENSITY``).
RANK_SPARSE_MAX_DENSITY = 0.05
#: Seconds per entry of R (the analysis' count) of the sparse rules: measured
#: on 2 cores, 1.1e-6 (rajat01, q = 6833, the sparse COD: 0.16-0.29 s where
#: the cube model said 64 s) to 2.9e-6 (bayer10, q = 13436, the subspace
#: iteration after the COD's gap check failed: 1.1-1.4 s where it said 485 s);
#: the dearer path, since nothing before the factorization tells them apart.
RANK_S_PER_R_ENTRY = 3e-6
#: Seconds per q² of the rank decision on a GPU factorization's R of order q up
#: to :data:`RANK_SPARSE_MIN_ORDER` (lstsq's ``DENSE_LIMIT``): R made dense on the
#: device, its σ test and cuSOLVER's SVD, which the panel steps' latency bounds
#: rather than the flops (measured on an H200, warm: dwt_878 0.125 s, nnc1374
#: 0.29 s, adder_dcop_05 0.35 s by the sparse COD with the GPU's factorizer).
RANK_GPU_S_PER_SQUARE = 1.6e-7
#: Seconds per q³ of the rank decision on a GPU factorization's R beyond
#: :data:`RANK_SPARSE_MIN_ORDER` up to :data:`RANK_DENSE_LIMIT`: the blocked
#: dense COD on the device (measured on an H200, warm: rajat01, q = 6833,
#: 0.36-0.44 s where the cube model said 64 s). R's small singular subspace on the
#: device comes first where R made dense fits there, and where it settles it costs
#: less (bayer10, q = 13436, no gap at the cutoff: 0.28 s); where it refuses (R's
#: solves growing past the cutoff's resolution: rajat01) the COD decides, and where
#: that finds no gap a sparse R's subspace through its host solves or cuSOLVER's SVD
#: of all of R. Nothing before the factorization tells these apart, and the COD's cost
#: is the prediction, but SuperLU's factors of a square A that show it deficient without
#: an exact singularity (:meth:`~scipy_gpuqr._dispatch.lu_route.LURoute.read`: the
#: subspace's cost, :func:`subspace_seconds`).
RANK_GPU_S_PER_CUBE = 1.3e-12


def rank_risk(conda: float, itn: int, order: int) -> bool:
    """Whether a run's course suggests an ill-conditioned or rank-deficient matrix.

    Its condition estimate ``conda`` reached :data:`RANK_RISK_COND`, or it
    has run ``itn >=`` :data:`RANK_RISK_SHARE` × ``order`` iterations
    (``order = min(m, n)``).
    """
    return conda >= RANK_RISK_COND or itn >= RANK_RISK_SHARE * order


def rank_decision_floor(order: int) -> float:
    """The least seconds :func:`rank_decision_seconds` predicts for an order-``order`` R
    before the analysis says where R lies or how many entries it has: up to
    :data:`RANK_SPARSE_MIN_ORDER` the dense rules of either device (the host's
    cube, the GPU's square), whichever is less; beyond, 0 (the host's sparse rules'
    cost follows R's entries, which only the analysis counts)."""
    if order > RANK_SPARSE_MIN_ORDER:
        return 0.0
    q = float(order)
    return min(RANK_S_PER_CUBE * q ** 3, RANK_GPU_S_PER_SQUARE * q * q)


def gap_check_seconds(order: int) -> float:
    """Predicted seconds of the gap-checked sparse COD of an order-``order`` host R whose
    σ test runs on a GPU (:data:`GAP_GPU_S_PER_SQUARE`)."""
    return GAP_GPU_S_PER_SQUARE * float(order) ** 2


def subspace_seconds(order: int) -> float:
    """Predicted seconds of the rank decision from R's small singular subspace on a GPU
    for an order-``order`` R: :data:`SUBSPACE_GPU_S_PER_SQUARE` × order² up to
    :data:`RANK_SPARSE_MIN_ORDER`; beyond, :data:`SUBSPACE_GPU_LARGE_S_PER_SQUARE` ×
    order², never less than at that order."""
    q = float(order)
    if order <= RANK_SPARSE_MIN_ORDER:
        return SUBSPACE_GPU_S_PER_SQUARE * q * q
    return max(SUBSPACE_GPU_S_PER_SQUARE * float(RANK_SPARSE_MIN_ORDER) ** 2,
               SUBSPACE_GPU_LARGE_S_PER_SQUARE * q * q)


def host_sparse_rank_seconds(r_entries: float) -> float:
    """Predicted seconds of the rank decision by the host's gap-checked sparse COD on a host
    R with ``r_entries`` entries (the analysis' count) where U's pivots split at lstsq's
    cutoff (:attr:`~scipy_gpuqr._dispatch.lu_route.LURoute.rank_host`):
    :data:`HOST_SPARSE_RANK_S_PER_R_ENTRY` × ``r_entries``."""
    return HOST_SPARSE_RANK_S_PER_R_ENTRY * float(r_entries)


def host_subspace_seconds(order: int, r_entries: float,
                          block: int = HOST_SUBSPACE_BLOCK) -> float:
    """Predicted seconds of the rank decision from R's small singular subspace through R's
    compiled host sweeps, for an order-``order`` R with ``r_entries`` entries (the
    analysis' count) and a ``block``-column iteration: :data:`HOST_SUBSPACE_STEPS` steps
    of two sweeps (``4·block·r_entries`` flops at :data:`HOST_SWEEP_FLOPS`) and the q × p
    dense products (``8·order·block²`` flops at :data:`HOST_GEMM_FLOPS`)."""
    p = float(block)
    return HOST_SUBSPACE_STEPS * p * (4.0 * float(r_entries) / HOST_SWEEP_FLOPS +
                                      8.0 * float(order) * p / HOST_GEMM_FLOPS)


def rank_decision_seconds(order: int, factorization: float,
                          r_entries: Optional[float] = None, *, device: str = "cpu") -> float:
    """Predicted seconds of the rank decision on an order-``order`` R that is not clearly
    of full rank: dense work, :data:`RANK_S_PER_CUBE` × order³, up to
    :data:`RANK_DENSE_LIMIT`; beyond, one more factorization (``factorization``
    seconds). Where R lies on the host with ``r_entries`` entries (the analysis'
    count; None: unknown, or R on a GPU, which keeps its dense rules there)
    beyond :data:`RANK_SPARSE_MIN_ORDER` and at most
    :data:`RANK_SPARSE_MAX_DENSITY` of q² of them, the sparse rules come first:
    :data:`RANK_S_PER_R_ENTRY` × ``r_entries`` where that is less.

    ``device='gpu'`` (a GPU factorization's R, whose dense rules run on the
    device): :data:`RANK_GPU_S_PER_SQUARE` × order² up to
    :data:`RANK_SPARSE_MIN_ORDER`, :data:`RANK_GPU_S_PER_CUBE` × order³ beyond, up to
    :data:`RANK_DENSE_LIMIT`.
    """
    if device == "gpu" and order <= RANK_DENSE_LIMIT:
        q = float(order)
        return (RANK_GPU_S_PER_SQUARE * q * q if order <= RANK_SPARSE_MIN_ORDER
                else RANK_GPU_S_PER_CUBE * q ** 3)
    dense = RANK_S_PER_CUBE * float(order) ** 3 if order <= RANK_DENSE_LIMIT else factorization
    if r_entries is not None and order > RANK_SPARSE_MIN_ORDER and \
            0 < r_entries <= RANK_SPARSE_MAX_DENSITY * float(order) ** 2:
        return min(dense, RANK_S_PER_R_ENTRY * float(r_entries))
    return dense
