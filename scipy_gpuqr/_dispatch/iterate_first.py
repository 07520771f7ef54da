"""``auto``'s rule for ``lsqr``/``lsmr``: SciPy's iterations first, the QR where they would not do.

Under backend ``'auto'`` (the default, what patched code gets) the caller's
arguments are the contract. SciPy's algorithm runs with them
(:mod:`scipy_gpuqr._iterative`: SciPy's recurrences and stopping tests, bit for
bit SciPy's result on the CPU, CuPy vectors and a cupyx matrix on a GPU). When
one of SciPy's convergence tests stops it (``istop`` 1 or 2, or their
machine-precision forms 4 and 5) its tuple is the answer, as SciPy gives it.
The sparse QR answers instead, with the minimum-norm solution, when SciPy's run
would not converge or would cost more than the factorization:

* the caller asked for maximum precision (:func:`zero_tolerances`);
* the run stopped otherwise: the condition limit (``istop`` 3, 6), the
  iteration limit (7), or this rule (:class:`Allowance`) stopped it because
  its projection says that ``iter_lim`` or ``conlim`` will stop it, or that
  iterating on would cost more than the factorization's predicted time.

Cost
----
The aim is that ``auto`` costs at most about 1.1 times the better of
"iterate to SciPy's stop" and "factorize". The run is watched through the
solvers' per-iteration callback (:class:`Allowance`), which measures the
seconds per iteration and projects the iterations still needed from the
trend of SciPy's two tolerance tests over the last
:data:`PROJECTION_WINDOW` iterations (and the growth of the condition
estimate towards ``conlim``). The projection is a straight line through a
quantity that often bends (LSQR and LSMR speed up late, or plateau for a
while), and the QR's predicted time leaves out what only the factorization
shows; so the rule leaves SciPy's run alone unless the evidence is clear:

1. Before the symbolic analysis (which the factorization needs anyway, and
   which the prediction needs) the run goes on while its projected total
   time stays within :data:`ANALYSIS_DEFERRAL` times the analysis' estimated
   cost (:func:`analysis_seconds`): a problem that converges that soon is
   answered without analysis, and one that needs the analysis pays at most
   ``1 / ANALYSIS_DEFERRAL`` of its iteration time for it.
2. Then the plan is made and the QR's time Q predicted: the factorization
   and solve (:func:`scipy_gpuqr._dispatch.cost_model.predicted_seconds`),
   plus the rank decision's dense work (:func:`rank_decision_seconds`) where
   the run shows the matrix may be ill-conditioned or rank deficient
   (:func:`rank_risk`: its condition estimate passed
   :data:`RANK_RISK_COND`, or it has run :data:`RANK_RISK_SHARE` of the
   columns' count of iterations; before that, :data:`RANK_PRIOR` of it). On
   such matrices the rank decision costs up to hundreds of factorizations.
   Where the rank decision is what keeps the QR from answering (the run
   looks as if it will not converge soon, and the factorization alone would
   be cheaper than iterating on), the factorization is made at once, once,
   if the caller can (``speculate``): when its R is clearly of full rank
   (one of lstsq's cheap tests passes: the 1-norm condition estimate, or the
   randomized probe through R's sparse solves) the rank decision costs a triangular
   condition estimate, not dense work, and the QR's remaining cost is its
   solve; so it is where a few of R's pivots lie below lstsq's cutoff with the
   rest clearly above (the null-space COD: a few solves with those columns);
   otherwise the prediction stands and the factors wait for the QR.
3. SciPy's run stops only on a verdict that holds at
   :data:`CONFIRMATIONS` checkpoints in a row:

   * its projection passes ``iter_lim`` and the iterations to ``iter_lim``
     cost more than Q (going on would cost more than the QR if the
     projection is right; projections past ``iter_lim``, even twice past
     it, were seen on runs that converged well before it). Once the
     window's projections have broken :data:`BROKEN_PROMISES` promises
     (:meth:`Allowance._keep_promises`: convergence promised by iteration
     ``N``, not there at :data:`PROMISE_SLACK` × ``N``), the projection is
     the later of the window's and the long trend's on log(itn) (the tests
     falling as a power of the iteration count, as they do on rajat01 to
     ``iter_lim``) where that passes ``iter_lim`` by :data:`POWER_MARGIN`;
   * its condition estimate projects past ``conlim`` before convergence;
   * the projected remaining iterations cost more than
     :data:`SWITCH_MARGIN` × Q (the margin covers the prediction's error),
     and so do those of the long trend where it projects SciPy's stop
     before ``iter_lim`` (:meth:`Allowance._trend`: the line through the
     window's mean values now and at half the iterations, which one window's
     noise does not move);
   * its tests have not fallen over a whole window (no projection) and it
     has spent Q (:data:`STALL_SHARE` × Q);
   * it has spent :data:`ALLOWANCE_SHARE` × Q and its projection does not
     promise convergence within Q.

On a square A whose exact answer SciPy's SuperLU may give
(:mod:`scipy_gpuqr._api.square_lu`, ``Allowance(square=)``), the LU comes
first: once the run has cost the LU's prediction (:func:`lu_seconds`: ski
rental) and its projection does not promise convergence within that time,
SuperLU factorizes and tests lstsq's rank rule (on a host with cores to spare
the factors are made ahead on a worker from :data:`LU_AHEAD_SHARE` of that time,
while the run goes on, and read there: the run waits for what is left of them,
not for all of them); where its factors may answer,
the exact answer's remaining cost is their solve and the verdicts above weigh
that (no analysis); otherwise the rule goes on as without it, except where the
LU showed A not of full rank (``deficient``: an exactly singular factor, or the
probe's lower bound of ``‖A⁻¹‖₂`` past lstsq's cutoff). Then R cannot pass the
cheap full-rank tests, so nothing is factorized ahead, and the QR costs at
least its rank decision's dense work (:func:`rank_decision_floor`, whichever
device the plan picks): the analysis waits until a verdict would stop the run
even at that floor. Every verdict stops at a lower QR time no later than at a
higher one, so the run stops where it would have stopped, and a run that
converges first (the ill-conditioned square matrices whose SciPy run needs a
few thousand iterations) pays for neither the analysis nor a factorization.
Where SuperLU found A exactly singular (``square.singular``) and R's order lies
from :data:`RANK_NULLSPACE_MIN_ORDER` to :data:`RANK_SPARSE_MIN_ORDER`, A's
exact dependences are likely a few dead pivots of R, far below the cutoff,
which the host's null-space COD decides with a few solves: there the floor is
0, the analysis is not deferred, and the factorization ahead reads R's pivots
(:data:`CLEAR_DEAD_PIVOTS`: the QR's rest is then that decision,
:data:`RANK_NULLSPACE_S_PER_SQUARE` × order², and its solve; otherwise the run
goes on to SciPy's stop, having paid one analysis and one factorization).
Where SuperLU's factors are deficient without being singular and U's pivots
split at lstsq's cutoff (``square.revealed_dead()``: a few under it, the rest
clearly above), on a host whose GPU would run the QR's dense rank work
(``dense_gpu``) and for R's orders from :data:`GAP_GPU_MIN_ORDER` to
:data:`RANK_SPARSE_MIN_ORDER`, the rank decision is predicted to be the
gap-checked sparse COD with its σ test on the device (:func:`gap_check_seconds`),
not dense work: the analysis is not deferred, and the run stops for the exact
answer unless its projection promises convergence within
:data:`PREDICTED_SHARE` of the QR's predicted time (LSQR's projections on such
matrices promise convergence far too soon; the long trend is read, whose
course the window's flicker does not break), at the first checkpoint that
says so (:data:`PREDICTED_CONFIRMATIONS`). A prediction that does not hold
costs time, not accuracy: the QR's own checks decide the rank. Where the plan
puts the factorization on the GPU (whose factorizer the sparse COD would use)
or R is too dense for that COD, the prediction is dropped and the rule goes on
as for any deficient LU. On a host without a GPU for that work (``dense_gpu()``
False) whose compiled sparse sweeps answer (``host_sweeps``) the same split
predicts the host's gap-checked sparse COD, which lstsq tries there before any
dense rule (its σ test on R11's compiled sweeps), at a cost that follows R's
entries (:func:`host_sparse_rank_seconds`), not the dense rules' cube; the same
verdict stops the run, and the plan drops the prediction
where it factorizes on the GPU, did not count R's entries, or R is too dense for
the sparse COD. Where U's pivots hide the deficiency instead (none at
lstsq's cutoff even with ``‖A‖_F`` for σ_max, ``square.hides_deficiency()``:
nnc1374, 66 singular values under the cutoff and no pivot there), the same holds
with the rank decision predicted as R's small singular subspace on the GPU
(:func:`subspace_seconds`: a few block solves with R made dense there, lstsq's
``DenseSubspaceCOD``), dropped where the plan saw no GPU (on a host without one nothing
is predicted: R's small singular subspace through R's host solves costs about as much as
SciPy's whole run on such a matrix); where R's singular values have no clear gap at the
cutoff that decision refuses and the SVD answers, later.
Beyond :data:`RANK_SPARSE_MIN_ORDER` (lstsq's ``DENSE_LIMIT``), on a host whose GPU
would run the QR's dense rank work, a deficient LU that is not singular predicts the
rank decision as R's small singular subspace on the GPU wherever lstsq would try it
there (``device_subspace``: the first block, sized by U's pivots under the cutoff, within
the largest, and R made dense within the device's memory), gap or not (lstsq's rule
beyond ``DENSE_LIMIT``): a few block solves (:func:`subspace_seconds`), not the dense
COD's q³ nor R's entries' sparse rules. The plan then factorizes on the GPU
(``plan_gpu``), whose rank decision tries that subspace first (a host R's gap-checked
sparse COD would come before it), and the run stops as above unless its trend promises
convergence within :data:`PREDICTED_SHARE` of the QR's predicted time. An exactly
singular LU keeps its own rule: its R's pivots at rounding make the subspace refuse.

Checks run at checkpoints spaced by :data:`CHECK_GROWTH` of the elapsed time
(at least :data:`CHECK_INTERVAL_S`), so that watching costs little more than
the callback itself. The seconds per iteration are the lower of the
window's rate and the run's average, and the run's time is at most its
iterations at the fastest one's pace, so that a process descheduled for a
moment on a busy machine does not turn a converging run into a "stalling"
one (nor set off the analysis early).

Where the iterations run: :func:`iterate_on_gpu`. A run on the caller's
host matrix whose iterations a GPU would make faster starts on the CPU all
the same and moves to the GPU only once it has cost as much as putting A
there (:func:`upload_seconds`, :class:`HostFirst`: ski rental). A run of a
few iterations, which the upload alone would make several times slower,
ends on the CPU; a long one pays at most one upload's worth of CPU time more
than starting on the GPU would have.

Middling problems on host data (from :data:`BLOCK_MIN_NNZ` entries) run in one
GPU thread block instead (:mod:`scipy_gpuqr._iterative.block`: many iterations
per launch, no copy between them) where its predicted iteration
(:func:`block_iteration_seconds`, A's longest lines included) beats the host
loop's and the CuPy path's (:func:`iterate_in_block`). The
run starts on the host all the same and moves to the block once its
iterations so far have cost, beyond what the block would have spent on them,
:data:`BLOCK_RENT` times the block's start (:func:`block_start_seconds`: packing A's CSR and CSC
arrays, the copy, a launch; :class:`HostFirst` with ``per_iteration``); the
block goes on from the host's last iteration (its state handed on), so no
iteration is made twice. A run of a few iterations ends on the host with
SciPy's bits, a long one moves.

Explicit backends (``gpu``, ``cpu``, ``reference``, ``simulate``) and
``GpuqrOptions(iterate_first=False)`` always factorize.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable, Optional

import numpy as np

from .._gpu import gpu_available
from .._schedule.native import usable_cpus
from .cost_model import predicted_seconds

__all__ = ["CPU_ITERATION_S", "CPU_MATVEC_RATE", "GPU_ITERATION_S", "GPU_MATVEC_RATE",
           "HOST_ITERATION_S", "host_iteration_seconds",
           "ANALYSIS_FIXED_S", "ANALYSIS_S_PER_LINE", "ANALYSIS_S_PER_ENTRY",
           "ANALYSIS_DEFERRAL", "STALL_SHARE", "ALLOWANCE_SHARE", "SWITCH_MARGIN",
           "ITER_LIM_MARGIN", "CONFIRMATIONS", "PREDICTED_CONFIRMATIONS", "RANK_RISK_COND",
           "RANK_RISK_SHARE",
           "RANK_PRIOR", "RANK_S_PER_CUBE", "RANK_DENSE_LIMIT", "RANK_SPARSE_MIN_ORDER",
           "RANK_SPARSE_MAX_DENSITY", "RANK_NULLSPACE_MIN_ORDER", "RANK_NULLSPACE_S_PER_SQUARE",
           "CLEAR_FULL_RANK", "CLEAR_DEAD_PIVOTS", "RANK_S_PER_R_ENTRY", "RANK_GPU_S_PER_SQUARE",
           "RANK_GPU_S_PER_CUBE", "PROMISE_SLACK", "BROKEN_PROMISES",
           "POWER_MARGIN", "PROJECTION_WINDOW", "rank_decision_floor",
           "GAP_GPU_S_PER_SQUARE", "GAP_GPU_MIN_ORDER", "PREDICTED_SHARE", "gap_check_seconds",
           "SUBSPACE_GPU_S_PER_SQUARE", "SUBSPACE_GPU_LARGE_S_PER_SQUARE",
           "SUBSPACE_GPU_PLAN_REASON", "subspace_seconds",
           "HOST_SPARSE_RANK_S_PER_R_ENTRY", "host_sparse_rank_seconds",
           "CHECK_GROWTH", "CHECK_INTERVAL_S", "UPLOAD_FIXED_S", "UPLOAD_BYTES_PER_S",
           "upload_seconds", "host_first_budget", "HostFirst", "SPECULATION_S_PER_ENTRY",
           "SPECULATION_MARGIN", "LU_FIXED_S", "LU_S_PER_ENTRY", "lu_seconds",
           "CONVERGED", "iteration_flops", "cpu_iteration_seconds", "gpu_iteration_seconds",
           "iterate_on_gpu", "BLOCK_FIXED_S", "BLOCK_ITERATION_S", "BLOCK_BYTES_PER_S",
           "BLOCK_TRANSPOSE_S_PER_ENTRY", "BLOCK_PACK_S_PER_ENTRY", "HOST_LOOP_SPEEDUP",
           "MOVE_BOUND", "BLOCK_RENT", "BLOCK_LINE_S", "BLOCK_MIN_NNZ", "BLOCK_MARGIN",
           "block_iteration_seconds", "block_start_seconds",
           "iterate_in_block", "analysis_seconds", "needs_watching", "zero_tolerances",
           "rank_risk", "rank_decision_seconds", "Allowance"]

_EPS = float(np.finfo(np.float64).eps)

#: Fixed seconds of one LSQR/LSMR iteration on the CPU: the Python scalar
#: recurrences and a dozen vector calls around the two products.
CPU_ITERATION_S = 1e-4
#: Flop rate of the CPU's matrix-vector products and vector updates (one
#: iteration is :func:`iteration_flops`): a memory-bound sparse product.
CPU_MATVEC_RATE = 1e9
#: Fixed seconds of one iteration of the host loops
#: (:mod:`scipy_gpuqr._iterative.host`, SciPy CSR/CSC float64 A): SciPy's
#: scalar recurrences on Python floats and some twenty in-place vector calls,
#: without the LinearOperator's dispatch; still pessimistic, as
#: :func:`needs_watching` needs.
HOST_ITERATION_S = 2e-5
#: Fixed seconds of one iteration on a GPU: the kernel launches and the one
#: device-to-host copy of the scalars the recurrences need.
GPU_ITERATION_S = 5e-4
#: Flop rate of the GPU's products and updates (memory bound as well, on
#: several times the bandwidth).
GPU_MATVEC_RATE = 1e11

#: Fixed seconds of a run in one GPU thread block on host data
#: (:mod:`scipy_gpuqr._iterative.block`): the packed buffer, its copy to the device,
#: a launch, the copy back and the result (measured on an H200 host: 0.18–0.29 ms
#: for problems of up to a few thousand entries).
BLOCK_FIXED_S = 2.5e-4
#: Fixed seconds of one iteration in the block: three block-wide sums (trees of
#: barriers) and the scalar recurrences every thread computes.
BLOCK_ITERATION_S = 4e-6
#: Bytes per second one thread block's products and vector updates move (one
#: multiprocessor gathering from cache and device memory).
BLOCK_BYTES_PER_S = 5e10
#: Seconds per entry of A's longest row and longest column: one thread forms each
#: row's and column's product alone, so a dense line is a serial chain of dependent
#: loads the block waits for (an H200: reorientation_1, lines of 632 entries, 35 µs
#: an iteration against 11 without them; rajat01, 1442, about 220 µs against 48).
BLOCK_LINE_S = 5e-8
#: Fewest stored entries of A for the block: below, the host loop's iterations
#: (9–15 µs on an H200's host for a few thousand entries) leave the block too little
#: to save for its start (measured there: bfwa62, gent113, lp_e226, reorientation_1
#: and tumorAntiAngiogenesis_2 slower in the block, west0067 and west0497 faster).
BLOCK_MIN_NNZ = 20000
#: The block's iteration must cost at most this share of the CuPy path's
#: (:func:`gpu_iteration_seconds`) to be chosen over it (grid 40³: the CuPy path
#: answered in 0.17 of SciPy's time, the block in 0.26, at a nominal tie).
BLOCK_MARGIN = 0.8
#: Seconds per stored entry of the host's conversion of A to its other compressed
#: format (the block's products need A by rows and by columns).
BLOCK_TRANSPOSE_S_PER_ENTRY = 3e-9
#: Seconds per stored entry of packing A's values and indices, by rows and by
#: columns, into the block's one host buffer (an H200 host: ch7-8-b3's start,
#: 235200 entries, about 3.6 ms against 2.8 without it).
BLOCK_PACK_S_PER_ENTRY = 4e-9
#: SciPy's LSQR/LSMR iteration over the host loops' (:mod:`scipy_gpuqr._iterative.host`)
#: on the same matrix (an H200 host: 1.4 on ch7-8-b3, 1.5 on a random 20000×4000).
HOST_LOOP_SPEEDUP = 1.4
#: The most a call under ``auto`` may cost against SciPy's own where SciPy's
#: iterations converge (issue 15's bound).
MOVE_BOUND = 1.1
#: The share of the block's start a run's host iterations must have cost (beyond
#: the block's own) before :class:`HostFirst` moves it: ``1 / (MOVE_BOUND ·
#: HOST_LOOP_SPEEDUP − 1)``. A run that moves after k host iterations and then
#: stops at once costs ``k·h + start + g``; SciPy's costs ``(k + 1)·HOST_LOOP_SPEEDUP·h``;
#: with ``(k − 1)·h >= BLOCK_RENT · start`` the move keeps that within ``MOVE_BOUND``
#: (what is left, ``(2·MOVE_BOUND·HOST_LOOP_SPEEDUP − 1)·h``, covers the call's own
#: start and the block's one iteration). Longer runs only gain from the block.
BLOCK_RENT = 1.0 / (MOVE_BOUND * HOST_LOOP_SPEEDUP - 1.0)

#: Fixed seconds of putting a host matrix on the GPU for the iterations: the
#: cupyx CSR matrix, its explicit transpose made on the device, and the first
#: launches of the iteration's kernels.
UPLOAD_FIXED_S = 2e-3
#: Bytes per second of the host-to-device copy of the matrix (pageable memory).
UPLOAD_BYTES_PER_S = 5e9

#: Seconds per entry of an order-q R (q² of them) of the cheap full-rank tests a
#: speculative factorization makes (R made dense, LAPACK's triangular
#: condition estimate, then a few sparse solves with R of 8 columns each where
#: that is inconclusive; the first call in a process is the dearest).
SPECULATION_S_PER_ENTRY = 3e-9
#: A speculative factorization is made only where the iterations it may save
#: cost at least this many times what it costs (the factorization's
#: prediction and the full-rank test): on a run whose R turns out not to be
#: clearly of full rank, it adds at most that share of the run.
SPECULATION_MARGIN = 2.0

#: Predicted seconds of SciPy's SuperLU on a square A and the test of lstsq's
#: rank rule on its factors (:mod:`scipy_gpuqr._api.square_lu`: a randomized
#: probe of ``‖A⁻¹‖₂``, five solves of 8 columns): a fixed part and a part per
#: stored entry of A (measured on the shared square matrices, 2 cores: 2-6e-7 s
#: an entry; the probe adds a third). Fill the ordering cannot avoid makes it
#: dearer; the rule tries the LU only once the run has cost this much.
LU_FIXED_S, LU_S_PER_ENTRY = 5e-5, 8e-7
#: On a host with at least LU_AHEAD_MIN_CPUS cores the process may use, the LU is
#: started on a worker thread once the run has cost LU_AHEAD_SHARE of its prediction
#: (``square.factor_ahead()``, where the LU's prediction is at most LU_AHEAD_MAX_S):
#: the rule still reads it where it would have made it, but finds it made (or waits
#: for the rest) instead of stopping the run for all of it. SciPy's run is not
#: touched (its answer stays bit for bit); a run that converges first leaves the
#: worker to finish on a core it did not use.
LU_AHEAD_MIN_CPUS, LU_AHEAD_SHARE, LU_AHEAD_MAX_S = 4, 0.1, 0.25

#: Estimated seconds of the symbolic analysis (ordering, elimination tree,
#: column counts, fronts, assembly maps) of the matrix factorized: a fixed
#: part, a part per row and column (the per-column and per-front work) and a
#: part per stored entry (the ordering's and the counts' passes over the
#: pattern). Its cost also grows with the fronts' sizes, which only the
#: analysis knows: the estimate is on the low side for matrices with large
#: fronts, so that it never defers the analysis for long.
ANALYSIS_FIXED_S, ANALYSIS_S_PER_LINE, ANALYSIS_S_PER_ENTRY = 1e-3, 1.5e-6, 5e-9
#: Before the analysis, the run goes on while its projected total time is at
#: most this many analysis times: the analysis then costs at most a tenth
#: of what iterating costs.
ANALYSIS_DEFERRAL = 10.0
#: Share of the QR's predicted time a run whose tests have not fallen over a
#: whole window may spend before the QR answers.
STALL_SHARE = 1.0
#: Share of the QR's predicted time after which a run stops unless its
#: projection promises convergence within the QR's time: what iterating can
#: add to the QR when the projections are wrong.
ALLOWANCE_SHARE = 3.0
#: The projected remaining iterations must cost more than this many times the
#: QR's predicted time before the QR answers instead: the prediction leaves
#: out parts of the QR's call (measured 1-5 times the factorization end to
#: end), and a converging run stopped wrongly costs the whole QR.
SWITCH_MARGIN = 3.0
#: A projection this many times past ``iter_lim`` makes the rule analyse the
#: matrix at once (for the prediction the iter_lim verdict needs) rather than
#: after the deferral, where the iterations left to ``iter_lim`` cost more than
#: the analysis' estimate (only stopping before ``iter_lim`` repays it).
ITER_LIM_MARGIN = 2.0
#: Consecutive checkpoints that must reach the same verdict before a run is
#: stopped (one window's projection can be an outlier).
CONFIRMATIONS = 2
#: ... except the verdict of U's pivots (:attr:`Allowance.gap_predicted`), which reads
#: the LU's factors and the run's long trend, not one window's projection: it stops
#: at the first checkpoint that reaches it.
PREDICTED_CONFIRMATIONS = 1
#: A run whose condition estimate reaches this is treated as one on a matrix
#: that may be ill-conditioned or rank deficient (LSQR's estimate grows
#: towards cond(A) but stays far below it: 1e5-3e6 at SciPy's stop on
#: matrices with cond 1e11-1e13).
RANK_RISK_COND = 1e4
#: ... and so is a run that has taken this share of min(m, n) iterations
#: (well-conditioned problems converge in a small fraction of it).
RANK_RISK_SHARE = 0.1
#: Weight of the rank decision's predicted time before :func:`rank_risk` holds:
#: early in a run nothing tells an ill-conditioned matrix (whose rank decision
#: costs up to hundreds of factorizations) from a well-conditioned one, and
#: stopping a converging run for a QR that turns out that slow costs far more
#: than iterating on a stalling one a little longer.
RANK_PRIOR = 0.1
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
#: Why the plan factorizes on the GPU where R's small singular subspace there is predicted
#: beyond :data:`RANK_SPARSE_MIN_ORDER` (``Allowance(plan_gpu=)``).
SUBSPACE_GPU_PLAN_REASON = ("the QR's rank decision predicted as R's small singular subspace "
                            "on the GPU beyond lstsq's DENSE_LIMIT: R made there")
#: Where U's pivots predict the gap-checked COD, the run stops unless its long trend
#: (:meth:`Allowance._trend`; the window's projection before there is one, whose
#: flicker would keep the verdict from being confirmed) promises convergence within
#: this share of the QR's predicted time. LSQR's projections on such matrices promise
#: far too soon (adder_dcop_05 at 410 iterations: 390 more by the trend, 1530 in
#: fact); a run that does converge that soon costs at most the QR's time more.
PREDICTED_SHARE = 0.1
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

#: ``speculate``'s answers where R's rank decision costs no dense work: R is
#: clearly of full rank (a triangular condition estimate or probe, then R's
#: solve), or a few of its pivots lie below lstsq's cutoff and the rest clearly
#: above (the null-space COD: :data:`RANK_NULLSPACE_S_PER_SQUARE`).
CLEAR_FULL_RANK = "R clearly of full rank"
CLEAR_DEAD_PIVOTS = "R of a few dead pivots (the null-space COD)"
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
#: an exact singularity (:meth:`Allowance._predicts_large_subspace`: the subspace's
#: cost, :func:`subspace_seconds`).
RANK_GPU_S_PER_CUBE = 1.3e-12
#: A projection at iteration ``i`` of ``f`` more iterations promised SciPy's
#: stop by ``i + f``; the promise is broken once the run passes this many
#: times ``i + f`` without it ...
PROMISE_SLACK = 2.0
#: ... and once this many are broken, the iter_lim verdict weighs the long
#: trend as a power of the iteration count where that is later
#: (:meth:`Allowance._beyond`) ...
BROKEN_PROMISES = 2
#: ... and passes ``iter_lim`` by this factor: converging runs that broke
#: promises had power trends up to 1.04 × ``iter_lim`` (reorientation_1),
#: rajat01's (which ends at ``iter_lim``) 1.25-2.5 ×.
POWER_MARGIN = 1.25
#: Iterations of test history a projection is fitted to (and the fewest
#: after which a projection is trusted).
PROJECTION_WINDOW = 20
#: The least-squares slope of values at PROJECTION_WINDOW consecutive
#: iterations is the sum of the values times these weights.
_SLOPE_WEIGHTS = tuple((k - (PROJECTION_WINDOW - 1) / 2)
                       / sum((j - (PROJECTION_WINDOW - 1) / 2) ** 2
                             for j in range(PROJECTION_WINDOW))
                       for k in range(PROJECTION_WINDOW))
#: Checkpoints follow each other after this share of the elapsed time ...
CHECK_GROWTH = 0.1
#: ... and at least this many seconds apart.
CHECK_INTERVAL_S = 1e-3

#: SciPy's ``istop`` codes of a converged run: its tolerance tests (1: ``Ax - b``
#: small enough, 2: the least-squares solution good enough) and their
#: machine-precision forms (4, 5), the same for LSQR and LSMR.
CONVERGED = frozenset((1, 2, 4, 5))


def iteration_flops(m: int, n: int, nnz: int) -> float:
    """Flops of one LSQR/LSMR iteration: two products with A and a few vector updates."""
    return 4.0 * nnz + 12.0 * (m + n)


def cpu_iteration_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of one CPU iteration (:data:`CPU_ITERATION_S`, :data:`CPU_MATVEC_RATE`)."""
    return CPU_ITERATION_S + iteration_flops(m, n, nnz) / CPU_MATVEC_RATE


def host_iteration_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of one iteration of the host loops (:data:`HOST_ITERATION_S`,
    :data:`CPU_MATVEC_RATE`)."""
    return HOST_ITERATION_S + iteration_flops(m, n, nnz) / CPU_MATVEC_RATE


def gpu_iteration_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of one GPU iteration (:data:`GPU_ITERATION_S`, :data:`GPU_MATVEC_RATE`)."""
    return GPU_ITERATION_S + iteration_flops(m, n, nnz) / GPU_MATVEC_RATE


def iterate_on_gpu(m: int, n: int, nnz: int, *, on_gpu: bool) -> tuple[bool, str]:
    """Whether the iterations run on the GPU, and why.

    On the GPU when one answers (:func:`scipy_gpuqr._gpu.gpu_available`) and
    either the caller's data is there (CuPy in, CuPy out, no copy) or the
    problem is large enough that a GPU iteration, with its fixed cost, beats
    a CPU one. Small host problems never ask for the GPU (nor import CuPy).

    Parameters
    ----------
    m, n, nnz : int
        Shape and stored entries of A.
    on_gpu : bool
        The caller passed CuPy/cupyx data.
    """
    cpu_s, gpu_s = cpu_iteration_seconds(m, n, nnz), gpu_iteration_seconds(m, n, nnz)
    if not on_gpu and cpu_s <= gpu_s:
        return False, f"CPU: a CPU iteration (about {cpu_s:.2g} s) beats a GPU one"
    if not gpu_available():
        return False, "CPU: no GPU"
    if on_gpu:
        return True, "GPU: the data is there"
    return True, f"GPU: a GPU iteration (about {gpu_s:.2g} s) beats a CPU one ({cpu_s:.2g} s)"


def block_iteration_seconds(m: int, n: int, nnz: int, longest: int = 0) -> float:
    """Nominal seconds of one iteration in one GPU thread block: :data:`BLOCK_ITERATION_S`,
    the bytes it moves (A's values, indices and gathered entries twice, the vectors'
    reads and writes) at :data:`BLOCK_BYTES_PER_S`, and ``longest`` (the entries of A's
    longest row plus its longest column) at :data:`BLOCK_LINE_S`."""
    return (BLOCK_ITERATION_S + (40.0 * nnz + 24.0 * m + 48.0 * n) / BLOCK_BYTES_PER_S
            + BLOCK_LINE_S * longest)


def block_start_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of a block run's start on host data (:data:`BLOCK_FIXED_S`, A's
    other format, the packing of both formats into one buffer, the copy of it, b and the
    vectors at :data:`UPLOAD_BYTES_PER_S`)."""
    return (BLOCK_FIXED_S + (BLOCK_TRANSPOSE_S_PER_ENTRY + BLOCK_PACK_S_PER_ENTRY) * nnz
            + (24.0 * nnz + 48.0 * (m + n)) / UPLOAD_BYTES_PER_S)


def iterate_in_block(m: int, n: int, nnz: int, *, on_gpu: bool,
                     longest: Optional[Callable[[], int]] = None
                     ) -> Optional[tuple[float, float]]:
    """``(start, per_iteration)`` of a run that may move to one GPU thread block, or None.

    None where the caller's data is on the GPU (the CuPy path keeps it there),
    where A has fewer than :data:`BLOCK_MIN_NNZ` entries, where a block
    iteration (:func:`block_iteration_seconds`, with ``longest()``: the
    entries of A's longest row plus its longest column, asked for only once
    the other tests pass) does not beat a host loop's
    (:func:`host_iteration_seconds`) and :data:`BLOCK_MARGIN` of a CuPy path's
    (:func:`gpu_iteration_seconds`), or where no GPU answers. Otherwise the
    block's start (:func:`block_start_seconds`: the ski-rental budget of
    :class:`HostFirst`) and its seconds per iteration.
    """
    if on_gpu or nnz < BLOCK_MIN_NNZ:
        return None
    host, cupy = host_iteration_seconds(m, n, nnz), BLOCK_MARGIN * gpu_iteration_seconds(m, n, nnz)
    block = block_iteration_seconds(m, n, nnz)
    if block >= host or block >= cupy:
        return None
    if longest is not None:
        block = block_iteration_seconds(m, n, nnz, longest())
        if block >= host or block >= cupy:
            return None
    if not gpu_available():
        return None
    return block_start_seconds(m, n, nnz), block


def upload_seconds(m: int, n: int, nnz: int) -> float:
    """Estimated seconds of putting an m×n host matrix with ``nnz`` entries on the GPU for the
    iterations (CSR with 4-byte indices and 8-byte values; :data:`UPLOAD_FIXED_S`,
    :data:`UPLOAD_BYTES_PER_S`)."""
    return UPLOAD_FIXED_S + (12.0 * nnz + 4.0 * (m + 1)) / UPLOAD_BYTES_PER_S


def host_first_budget(m: int, n: int, nnz: int) -> Optional[float]:
    """Seconds a run on host data iterates on the CPU before it moves to the GPU, or None.

    None where a GPU iteration does not beat a CPU one (the run stays on the
    CPU). Otherwise one upload of A (:func:`upload_seconds`): the ski-rental
    rule. Iterating on the CPU until the run has cost what the upload costs,
    then moving, spends at most about twice what the better of "all on the
    CPU" and "upload at once" would have: a run that ends first never paid
    for the upload; one that moves paid the upload's worth once more.
    """
    flops = iteration_flops(m, n, nnz)     # gpu_/cpu_iteration_seconds, made once each
    if GPU_ITERATION_S + flops / GPU_MATVEC_RATE >= CPU_ITERATION_S + flops / CPU_MATVEC_RATE:
        return None
    return upload_seconds(m, n, nnz)


class HostFirst:
    """The callback of a CPU run on host data that may move to the GPU (ski rental).

    Stops the run (returns True, :attr:`moved` set) once it has iterated
    ``budget`` seconds (:func:`host_first_budget`), not counting the time
    ``watch`` spent analysing; until then the run is ``watch``'s
    (:class:`Allowance`, or None: unwatched). Without ``per_iteration`` the
    caller then runs SciPy's algorithm again from the start on the GPU (the
    CuPy path, which takes no host state), so the answer follows SciPy's
    iterates there as it would have without the CPU's head start.

    With ``per_iteration`` (the predicted seconds per iteration ``g`` of one
    GPU thread block, which goes on from the run's last iteration) the run
    moves once its iterations since the first have cost ``rent`` times the
    block's start beyond what the block would have spent on them:
    ``Δt − Δitn·g >= rent·budget``, with ``Δt`` the seconds since the first
    iteration (the call's own start, which a move does not save, is left out).
    That is ski rental with the block's iterations as the price of owning,
    the rent raised (:data:`BLOCK_RENT`) so that a run that stops right after
    it moved still costs at most :data:`MOVE_BOUND` of SciPy's (whose
    iterations cost :data:`HOST_LOOP_SPEEDUP` times the host's) instead of
    twice the better choice. A run whose host iterations are not dearer than
    the block's (``h <= g``) never moves; a long one moves after about
    ``rent·budget / (h − g)`` iterations. The iteration that moves the
    run (:attr:`last`) is not shown to ``watch``: a caller whose run goes on
    with the same watcher hands it over (:meth:`Allowance.catch_up`).
    """

    def __init__(self, budget: float, watch: Optional["Allowance"] = None,
                 per_iteration: float = 0.0, rent: float = 1.0):
        self.budget = float(budget) * (float(rent) if per_iteration > 0 else 1.0)
        self.watch = watch
        self.per_iteration = float(per_iteration)
        self.moved = False
        self.seconds = 0.0
        self.last = None            # the state of the iteration that moved the run
        self._first = None          # (itn, seconds) of the first iteration seen
        self._itn = 0               # the last iteration seen

    def __call__(self, state) -> bool:
        spent = state.seconds - (self.watch.analysis_s if self.watch is not None else 0.0)
        self._itn = state.itn
        if self.per_iteration > 0:
            if self._first is None:
                self._first = (state.itn, spent)
            itn0, spent0 = self._first
            saved = spent - spent0 - (state.itn - itn0) * self.per_iteration
        else:
            saved = spent
        if saved >= self.budget:
            self.moved, self.seconds, self.last = True, spent, state
            return True
        return bool(self.watch(state)) if self.watch is not None else False

    def quiet_until(self) -> float:
        """The run's seconds before which no iteration makes the run move or reaches
        ``watch``'s checkpoint (the move's test at the next iteration: the block's
        seconds for the iterations made only grow with later ones)."""
        analysis = self.watch.analysis_s if self.watch is not None else 0.0
        if self.per_iteration > 0:
            if self._first is None:
                return 0.0
            itn0, spent0 = self._first
            own = spent0 + (self._itn + 1 - itn0) * self.per_iteration + self.budget
        else:
            own = self.budget
        own += analysis
        return min(own, self.watch.quiet_until()) if self.watch is not None else own

    def catch_up(self, states) -> None:
        """The iterations a run did not report, for ``watch`` (:meth:`Allowance.catch_up`)."""
        if self.watch is not None:
            self.watch.catch_up(states)


def lu_seconds(nnz: int) -> float:
    """Predicted seconds of SuperLU and its full-rank test on a square A with ``nnz``
    stored entries (:data:`LU_FIXED_S`, :data:`LU_S_PER_ENTRY`)."""
    return LU_FIXED_S + LU_S_PER_ENTRY * float(nnz)


def analysis_seconds(m: int, n: int, nnz: int) -> float:
    """Estimated seconds of the symbolic analysis of an m×n matrix with ``nnz`` entries."""
    return ANALYSIS_FIXED_S + ANALYSIS_S_PER_LINE * (m + n) + ANALYSIS_S_PER_ENTRY * nnz


def needs_watching(iter_lim: int, m: int, n: int, nnz: int, *, on_gpu: bool,
                   analysis: float, host_loop: bool = False,
                   per_iteration: Optional[float] = None) -> bool:
    """Whether a run could last long enough for :class:`Allowance` to act on it.

    A CPU run whose iterations up to ``iter_lim`` cost, at the nominal
    (pessimistic) rate, no more than the analysis deferral
    (:data:`ANALYSIS_DEFERRAL` × ``analysis``, the analysis' estimated
    seconds) ends before any rule could stop it: it runs unwatched, without
    the callback's cost on every iteration. The rate is :func:`host_iteration_seconds`
    where the run is a host loop (``host_loop``), else
    :func:`cpu_iteration_seconds`; ``per_iteration`` where given (a run in one
    GPU thread block: :func:`block_iteration_seconds`). Other GPU runs are
    always watched.
    """
    if per_iteration is None:
        if on_gpu:
            return True
        per_iteration = (host_iteration_seconds(m, n, nnz) if host_loop
                         else cpu_iteration_seconds(m, n, nnz))
    return iter_lim * per_iteration > ANALYSIS_DEFERRAL * analysis


def zero_tolerances(atol: float, btol: float, conlim: float) -> Optional[str]:
    """Why the caller's tolerances ask for maximum precision, or None.

    SciPy: "maximum precision can be obtained by setting atol = btol =
    conlim = 0" — the run then goes on until the machine-precision tests or
    ``iter_lim`` stop it. ``atol = btol = 0`` asks for the answer at working
    precision, which the factorization gives at once. ``conlim = 0`` alone
    only turns the condition limit off (SciPy still stops at ``atol``,
    ``btol``): SciPy's run answers as usual.
    """
    if not (atol > 0) and not (btol > 0):
        why = "atol = btol = 0 asks for maximum precision"
        return why + (" (and conlim = 0: no condition limit)" if not (conlim > 0) else "")
    return None


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
    cutoff (:attr:`Allowance.rank_host`): :data:`HOST_SPARSE_RANK_S_PER_R_ENTRY` ×
    ``r_entries``."""
    return HOST_SPARSE_RANK_S_PER_R_ENTRY * float(r_entries)


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


class Allowance:
    """The iterations' watcher: a solver callback that stops a run the QR should answer.

    Pass an instance as ``callback=`` to :func:`scipy_gpuqr._iterative.lsqr`
    or :func:`~scipy_gpuqr._iterative.lsmr`; it returns True (stop) when the
    rule of this module says so, recording why in :attr:`reason`. A run that
    SciPy's tests stop is never stopped by it (the solvers let the test win).

    Parameters
    ----------
    iter_lim : int
        The run's iteration limit (resolved: SciPy's default when None).
    atol : float
        The caller's ``atol`` (the least-squares test's scale).
    conlim : float
        The caller's ``conlim`` (0 or less: no limit).
    analysis : float
        Estimated seconds of the analysis of the matrix the factorization
        would factorize (:func:`analysis_seconds`).
    plan : callable
        ``plan() -> (M, Plan)``: the factorization's plan (the analysis
        included), made at most once, when the rule needs the prediction. It
        may raise MemoryError (the QR cannot fit): the run then goes on to
        SciPy's stop.
    order : int
        ``min(m, n)`` of the matrix the QR factorizes: the order of R whose
        rank the QR decides (:func:`rank_decision_seconds`); 0 leaves the
        rank decision out of the prediction.
    speculate : callable, optional
        ``speculate(planned) -> (planned, clear)``: factorize now with the
        plan, returning the plan that hands those factors to the QR, and
        whether R's rank decision costs no dense work: :data:`CLEAR_FULL_RANK`,
        :data:`CLEAR_DEAD_PIVOTS`, or '' (a bool True reads as the first).
        Called at most once, where the rank decision's prediction alone keeps
        the QR from answering. None: never.
    square : object, optional
        The exact answer by SciPy's SuperLU of a square A
        (:class:`scipy_gpuqr._api.square_lu.SquareLU`: ``factor() -> bool``,
        ``clear``, ``deficient``, ``singular``, ``why``), tried at most once,
        when the run has cost the LU's prediction (:func:`lu_seconds` of
        ``nnz``: ski rental) and its projection does not promise convergence
        within that time. Where the LU
        may answer, what is left of the exact answer is a solve: the rule's
        verdicts weigh that instead of the QR, and no analysis is made.
        Otherwise the rule goes on as without it (the LU's time is not counted
        as iterating), but where the LU showed A not of full rank
        (``deficient``) it factorizes nothing ahead and analyses only once a
        verdict would stop the run at :func:`rank_decision_floor`. On a host with
        :data:`LU_AHEAD_MIN_CPUS` cores, a square with ``factor_ahead()`` is started on
        a worker once the run has cost :data:`LU_AHEAD_SHARE` of the prediction, and
        read at the same checkpoint. None: no LU.
    nnz : int
        A's stored entries (the LU's prediction).
    dense_gpu : callable, optional
        ``dense_gpu() -> bool``: whether a GPU would run the QR's dense rank work
        (auto's, with a GPU present), asked once, where a deficient LU that is not
        singular could predict the gap-checked COD (``square.revealed_dead()``, asked
        only after it): on the GPU where True, on the host where False (with
        ``host_sweeps``). None: U's pivots are never read.
    device_subspace : callable, optional
        ``device_subspace(order, under) -> bool``: whether R's small singular subspace
        on the GPU would be tried on an order-``order`` R beyond
        :data:`RANK_SPARSE_MIN_ORDER` with about ``under`` pivots under lstsq's cutoff
        (lstsq's ``device_subspace_takes``: its first block within the largest, R made
        dense there within the device's memory), asked where a deficient LU that is
        not singular could predict that decision (after ``dense_gpu``). None: never.
    host_sweeps : callable, optional
        ``host_sweeps() -> bool``: whether the host's compiled sparse sweeps answer
        (``scipy_gpuqr._factor.native.at_hand``), asked where ``dense_gpu()`` is False
        and U's pivots split: the host's gap-checked COD is predicted only with them
        (its σ test is R11 made dense without them: q³/3 flops and dense Lanczos).
        None: U's pivots are not read on such a host.
    plan_gpu : callable, optional
        ``plan_gpu() -> (M, Plan)``: the plan with the factorization on a usable GPU
        (:data:`SUBSPACE_GPU_PLAN_REASON`), made instead of ``plan`` where that
        prediction holds: the GPU factorization's rank decision tries R's subspace
        there first, where a host R's gap-checked sparse COD comes before it. None:
        ``plan``.

    Attributes
    ----------
    reason : str
        Why the run was stopped, or ''.
    planned : (M, Plan) or None
        The plan when it was made (the factorization reuses it).
    predicted : float or None
        The factorization's predicted seconds, once planned.
    rank_s : float
        The rank decision's predicted seconds, weighted by :data:`RANK_PRIOR`
        until :func:`rank_risk` holds.
    plan_error : MemoryError or None
        Why the factorization cannot run, when the plan said so.
    analysis_s : float
        Seconds the analysis (and a speculative factorization) took, inside
        the run, not counted as iterating.
    speculated : bool or None
        None before a speculative factorization; then whether R was clearly
        of full rank (or SuperLU's factors may answer: ``lu_at``).
    lu_at : (int, float) or None
        The iteration and seconds at which ``square`` was factorized.
    gap_predicted : int
        U's pivots under the cutoff where they predict the gap-checked COD on the
        GPU (``square.revealed_dead()``), else 0 (also once the plan dropped it).
    subspace_predicted : bool
        Whether U's pivots hide the deficiency (``square.hides_deficiency()``), or R lies
        beyond :data:`RANK_SPARSE_MIN_ORDER` (``device_subspace``), and R's small singular
        subspace on the GPU is predicted to decide its rank (False once the plan dropped
        it).
    large_under : int
        U's pivots under lstsq's cutoff where the prediction beyond
        :data:`RANK_SPARSE_MIN_ORDER` was made, else -1.
    """

    def __init__(self, *, iter_lim: int, atol: float, conlim: float, analysis: float,
                 plan: Callable, order: int = 0, speculate: Optional[Callable] = None,
                 square=None, nnz: int = 0, dense_gpu: Optional[Callable] = None,
                 device_subspace: Optional[Callable] = None,
                 plan_gpu: Optional[Callable] = None, host_sweeps: Optional[Callable] = None):
        self.iter_lim = int(iter_lim)
        self.log_atol = math.log(max(float(atol), _EPS))
        self.log_conlim = math.log(conlim) if conlim > 0 else None
        self.analysis_estimate = float(analysis)
        self.deferral = ANALYSIS_DEFERRAL * self.analysis_estimate
        self.order = int(order)
        self._plan = plan
        self._speculate = speculate
        self._square = square
        self._dense_gpu = dense_gpu
        self._device_subspace = device_subspace
        self._plan_gpu = plan_gpu
        self._host_sweeps = host_sweeps
        self.gap_predicted = 0
        self.large_under = -1
        self.subspace_predicted = False
        self.rank_host = False                    # ... the gap-checked COD on the host
        self.gap_dropped = ""                     # why the plan dropped the prediction
        self.lu_s = lu_seconds(nnz) if square is not None else math.inf
        self.lu_at: Optional[tuple] = None
        # the run's seconds at which the LU starts on a worker (None: it does not)
        self._ahead_at: Optional[float] = (
            LU_AHEAD_SHARE * self.lu_s if square is not None and self.lu_s <= LU_AHEAD_MAX_S
            and hasattr(square, "factor_ahead") and usable_cpus() >= LU_AHEAD_MIN_CPUS
            else None)
        self.speculated: Optional[bool] = None
        self.speculated_how = ""                  # why R's rank decision is cheap, once speculated
        self.speculation_s = 0.0
        self.speculated_at = 0.0
        self.history = deque(maxlen=PROJECTION_WINDOW)
        self.next_check = 0.0
        self.reason = ""
        self.planned = None
        self.predicted: Optional[float] = None
        self.rank_s = 0.0
        self.r_entries: Optional[float] = None     # R's entries (the analysis'), host R only
        self.rank_device = "cpu"                   # where the rank decision runs (the plan's)
        self.at_risk = False
        self.plan_error: Optional[MemoryError] = None
        self.analysis_s = 0.0
        self.analysed_at: Optional[tuple] = None
        self.projection: Optional[tuple] = None     # (itn, further iterations, s/iteration)
        self.trend: Optional[int] = None           # further iterations by the long trend
        self.power: Optional[float] = None         # ... by the trend as a power of itn
        self.broken = 0                            # promises of convergence broken so far
        self._promises: list = []                  # (itn, further promised) not yet broken
        self._marks: list = []                     # (window centre, mean log tests) per checkpoint
        self._itn = 0                              # the iteration of the last projection
        self._verdict = ("", 0)                    # (kind, consecutive checkpoints)
        self._last: Optional[float] = None
        self.fastest = math.inf                    # the fastest iteration's seconds

    @property
    def qr_seconds(self) -> Optional[float]:
        """The QR's predicted seconds: factorization and solve, plus the rank decision
        where :func:`rank_risk` held; None before the plan."""
        return None if self.predicted is None else self.predicted + self.rank_s

    @property
    def allowance(self) -> Optional[float]:
        """Seconds after which the run stops unless its projection promises convergence
        within the QR's time."""
        q = self.qr_seconds
        return None if q is None else ALLOWANCE_SHARE * q

    def __call__(self, state) -> bool:
        """Record iteration ``state.itn``; at a checkpoint, decide whether to stop."""
        seconds = state.seconds
        self.history.append(state)
        last, self._last = self._last, seconds
        if last is not None and seconds - last < self.fastest:
            self.fastest = seconds - last
        t = seconds - self.analysis_s
        if self._ahead_at is not None and t >= self._ahead_at:
            self._ahead_at = None
            # U's pivots read ahead only where the rule may read them (:meth:`_predicts_gap`
            # less its question to dense_gpu, asked later where it counts)
            self._square.factor_ahead(readings=self._dense_gpu is not None and (
                GAP_GPU_MIN_ORDER <= self.order <= RANK_SPARSE_MIN_ORDER or
                (self.order > RANK_SPARSE_MIN_ORDER and self._device_subspace is not None)))
        if t < self.next_check:             # most iterations: nothing more to do
            return False
        self.next_check = max(t * (1 + CHECK_GROWTH), t + CHECK_INTERVAL_S)
        # a process paused by a busy machine: its iterations did not take that long
        return self.decide(state.itn, min(t, state.itn * self.fastest))

    def quiet_until(self) -> float:
        """The run's seconds before which no iteration reaches a checkpoint (a compiled
        host run reports none before, :func:`scipy_gpuqr._iterative.host._reporter`), or
        at which the LU starts on a worker (:data:`LU_AHEAD_SHARE`)."""
        at = self.next_check if self._ahead_at is None else min(self.next_check, self._ahead_at)
        return at + self.analysis_s

    def catch_up(self, states) -> None:
        """Iterations the run did not report, in order, before the next report's: kept in
        the history as each call would keep them, but not timed (their seconds are
        interpolated): the fastest iteration is that of iterations reported one after the
        other, whose time includes a report's, as when every iteration is reported."""
        self.history.extend(states)

    # -- the rule ------------------------------------------------------------

    def decide(self, itn: int, t: float) -> bool:
        """The rule at a checkpoint: ``itn`` iterations done in ``t`` seconds of iterating."""
        further, per_iteration = self._project(itn, t)
        trusted = itn >= PROJECTION_WINDOW
        if not self.at_risk and self.history:
            self.at_risk = rank_risk(self.history[-1].conda, itn, self.order)
        if further is not None:
            self.projection = (itn, further, per_iteration)
            why = self._conlim_reached(further)
            if why:
                return self._confirm("conlim", why)
        remaining = (further * per_iteration if further is not None
                     else (math.inf if trusted else None))
        if self.lu_at is None and trusted and t >= self.lu_s and \
                (remaining is None or remaining > self.lu_s) and self.speculated is None:
            self._lu(itn, t)
        if self.predicted is None and self.plan_error is None:
            if self._square is not None and self.lu_at is None and \
                    t < ALLOWANCE_SHARE * self.lu_s:
                # the LU comes first (where it may answer, no analysis is needed) while
                # the run's projection keeps promising convergence within its time
                return self._confirm("", "")
            if self._lu_deficient and not self._predicted_route and \
                    not self._stops_at_floor(itn, t, further, per_iteration, remaining):
                return self._confirm("", "")
            # analysing early pays only by stopping before iter_lim: not where the
            # iterations left to it cost less than the analysis itself
            past_limit = (further is not None and itn + further > ITER_LIM_MARGIN * self.iter_lim
                          and (self.iter_lim - itn) * per_iteration > self.analysis_estimate)
            # where SuperLU found A exactly singular the QR may cost only a few solves
            # more than its factorization, and where U's pivots predict the GPU's
            # gap-checked COD or subspace decision little more: analysed without the
            # deferral
            if not past_limit and not self._lu_singular and not self._predicted_route and \
                    t < self.deferral and (remaining is None or t + remaining <= self.deferral):
                return self._confirm("", "")
            self._analyse(itn, t)
            if self._predicted_route:
                self._keep_prediction()
        if self.plan_error is not None:         # the QR cannot run: SciPy's run goes on
            self.next_check = math.inf
            return False
        if self.rank_host:
            self.rank_s = host_sparse_rank_seconds(self.r_entries)
        elif self.gap_predicted:
            self.rank_s = gap_check_seconds(self.order)
        elif self.subspace_predicted:
            self.rank_s = subspace_seconds(self.order)
        elif self.order and not self.speculated:
            self.rank_s = rank_decision_seconds(self.order, self.predicted, self.r_entries,
                                                device=self.rank_device) * \
                (1.0 if self.at_risk else RANK_PRIOR)
        if self.rank_s and self.speculated is None and self._speculate is not None and \
                (not self._lu_deficient or self._lu_singular) and \
                self._would_stop(itn, t, further, per_iteration, remaining, self.predicted) \
                and self._worth_speculating(itn, further, per_iteration):
            self._speculation()
            self.speculated_at = t
        q = self.qr_seconds
        beyond = self._beyond(further)
        if further is not None and itn + beyond > self.iter_lim:
            # stopping costs q; going on costs the iterations to iter_lim more than q if
            # the projection is right, and saves q if it is wrong (it often is)
            to_limit = (self.iter_lim - itn) * per_iteration
            if to_limit > q:
                how = ("" if beyond == further else
                       f" (the trend as a power of itn, {self.broken} promises of the "
                       f"window's projection broken)")
                return self._confirm("iter_lim", f"projected {itn + beyond:.0f} iterations "
                                     f"exceed iter_lim {self.iter_lim}{how}, and the "
                                     f"{self.iter_lim - itn} "
                                     f"to it cost more ({to_limit:.3g} s) than the QR's "
                                     f"predicted {q:.3g} s")
        if further is not None and self._lasting(further) * per_iteration > SWITCH_MARGIN * q:
            return self._confirm("cost", f"projected {self._lasting(further)} more iterations "
                                 f"({self._lasting(further) * per_iteration:.3g} s) cost more "
                                 f"than {SWITCH_MARGIN:g} x the QR's predicted {q:.3g} s")
        promised = further if self.trend is None else self.trend
        if self._predicted_route and (promised is None or
                                      promised * per_iteration > PREDICTED_SHARE * q):
            where = "on the host" if self.rank_host else "on the GPU"
            shown = (f"SuperLU's U shows {self.gap_predicted} pivots under lstsq's cutoff and "
                     f"the rest clearly above: the QR's rank decision predicted as the "
                     f"gap-checked COD {where}" if self.gap_predicted else
                     f"SuperLU's factors are deficient ({self.large_under} of U's pivots under "
                     f"lstsq's cutoff) and R beyond lstsq's DENSE_LIMIT: the QR's rank "
                     f"decision predicted as R's small singular subspace on the GPU"
                     if self._large_route else
                     "SuperLU's factors are deficient and U's pivots hide it: the QR's rank "
                     "decision predicted as R's small singular subspace on the GPU")
            return self._confirm("predicted", f"{shown} (the QR's predicted {q:.3g} s), and "
                                 f"the run's trend does not promise convergence within "
                                 f"{PREDICTED_SHARE:g} x that", needed=PREDICTED_CONFIRMATIONS)
        if self.speculated and t - self.speculated_at >= q:
            # the factors are made and R's rank decision is cheap: the run has had as long
            # as the rest of the QR costs (ski rental: at most twice the better choice;
            # a projection of convergence flickers on runs that stall)
            made = ("SuperLU's factors are made (A of full rank)" if self._lu_answers
                    else f"the factors are made ({self.speculated_how})")
            return self._confirm("ahead", f"{made} and {t - self.speculated_at:.3g} s of "
                                 f"iterations since have not converged (the exact answer's "
                                 f"rest: about {q:.3g} s)")
        if further is None and trusted and t >= STALL_SHARE * q:
            return self._confirm("stall", f"the tests are not falling after {itn} iterations "
                                 f"({t:.3g} s, the QR's predicted {q:.3g} s)")
        if t >= ALLOWANCE_SHARE * q and (further is None or remaining > q):
            return self._confirm("allowance", f"the allowance ({ALLOWANCE_SHARE * q:.3g} s = "
                                 f"{ALLOWANCE_SHARE:g} x the QR's predicted {q:.3g} s) is "
                                 f"spent without a projection to converge within it")
        return self._confirm("", "")

    def _would_stop(self, itn: int, t: float, further, per_iteration: float, remaining,
                    q: float) -> bool:
        """Whether a verdict of :meth:`decide` would stop the run if the QR cost ``q``."""
        trusted = itn >= PROJECTION_WINDOW
        if further is not None and itn + self._beyond(further) > self.iter_lim and \
                (self.iter_lim - itn) * per_iteration > q:
            return True
        if further is not None and self._lasting(further) * per_iteration > SWITCH_MARGIN * q:
            return True
        return further is None and trusted and t >= STALL_SHARE * q

    def _stops_at_floor(self, itn: int, t: float, further, per_iteration: float,
                        remaining) -> bool:
        """Whether a verdict of :meth:`decide` would stop the run if the QR cost only its
        rank decision's floor (:func:`rank_decision_floor`, weighted as :attr:`rank_s`
        is): where none would, no QR time the analysis could predict would either."""
        floor = self._floor()
        if self._would_stop(itn, t, further, per_iteration, remaining, floor):
            return True
        return t >= ALLOWANCE_SHARE * floor and (further is None or remaining > floor)

    def _floor(self) -> float:
        """The rank decision's floor (:func:`rank_decision_floor`, weighted as
        :attr:`rank_s` is), 0 where SuperLU found A exactly singular and R's order
        lets the host's null-space COD decide (:attr:`_lu_singular`)."""
        if self._lu_singular:
            return 0.0
        return rank_decision_floor(self.order) * (1.0 if self.at_risk else RANK_PRIOR)

    def _beyond(self, further: Optional[int]):
        """The further iterations the iter_lim verdict weighs: the window's
        projection, or, once :data:`BROKEN_PROMISES` of its promises are broken
        (:meth:`_keep_promises`), the long trend's as a power of the iteration
        count (:meth:`_trend`) where that is later. The verdict still asks that
        the iterations to ``iter_lim`` cost more than the exact answer, so a run
        the power law misjudges pays at most that answer's time."""
        if further is None or self.broken < BROKEN_PROMISES or self.power is None or \
                self._itn + self.power <= POWER_MARGIN * self.iter_lim:
            return further
        return max(further, self.power)

    def _lasting(self, further: int) -> int:
        """The iterations the cost verdict weighs: the window's projection, or the long
        trend's (:meth:`_trend`) where that is sooner and ends before ``iter_lim`` — a
        run whose trend says SciPy's own stop comes first is not stopped on one
        window's flicker; a trend past ``iter_lim`` promises nothing."""
        trend = self.trend
        if trend is None or trend >= further or self._itn + trend > self.iter_lim:
            return further
        return trend

    def _worth_speculating(self, itn: int, further, per_iteration: float) -> bool:
        """Whether the iterations left (to the projection, or to ``iter_lim``) cost
        :data:`SPECULATION_MARGIN` times the speculation (the factorization's
        prediction and :data:`SPECULATION_S_PER_ENTRY` × order²)."""
        left = self.iter_lim - itn if further is None else min(further, self.iter_lim - itn)
        cost = self.predicted + SPECULATION_S_PER_ENTRY * float(self.order) ** 2
        return left * per_iteration >= SPECULATION_MARGIN * cost

    def _speculation(self) -> None:
        """Factorize now (:attr:`speculate`); where R's rank decision is cheap (R clearly
        of full rank, or a few dead pivots), the QR's remaining cost is its solve and
        that decision, not the predicted dense work."""
        t0 = time.perf_counter()
        try:
            self.planned, clear = self._speculate(self.planned)
        except MemoryError as exc:
            self.plan_error = exc
            clear = False
        spent = time.perf_counter() - t0
        self.analysis_s += spent
        self.speculation_s = spent
        self.speculated = bool(clear)
        self.speculated_how = (clear if isinstance(clear, str) else
                               CLEAR_FULL_RANK if clear else "")
        if clear:
            if self._square is not None and self._square.clear is None:
                self._square.decline(f"the QR's factors were made ahead, {self.speculated_how}")
            # what is left of the QR: its cheap rank test (or the null-space COD's few
            # solves) and solve
            self.rank_s = (RANK_NULLSPACE_S_PER_SQUARE * float(self.order) ** 2
                           if self.speculated_how == CLEAR_DEAD_PIVOTS else 0.0)
            self.predicted = max(self.predicted - spent, 0.1 * min(spent, self.predicted))

    @property
    def _lu_deficient(self) -> bool:
        """SuperLU's factors were made and showed A not of full rank by lstsq's rule
        (``square.deficient``): the QR's R cannot pass the cheap full-rank tests."""
        return self.lu_at is not None and self._square.deficient

    @property
    def _lu_singular(self) -> bool:
        """SuperLU's factorization found A exactly singular (``square.singular``) and
        R's order is one whose rank the host's null-space COD may decide
        (:data:`RANK_NULLSPACE_MIN_ORDER`): a factorization ahead may show R's
        dependent columns as a few tiny pivots, whose rank decision costs a few
        solves (``speculate``'s ``clear``)."""
        return self._lu_deficient and bool(self._square.singular) and \
            RANK_NULLSPACE_MIN_ORDER <= self.order <= RANK_SPARSE_MIN_ORDER

    @property
    def _lu_answers(self) -> bool:
        """SuperLU's factors were made and may answer."""
        return self.lu_at is not None and bool(self._square.clear)

    def _lu(self, itn: int, t: float) -> None:
        """Factorize ``square`` now; where its factors may answer, what is left of the
        exact answer is their solve (the verdicts weigh that, without an analysis)."""
        t0 = time.perf_counter()
        self._ahead_at = None               # not started by now: made here
        clear = self._square.factor()
        # the LU's own seconds (made here, or ahead on a worker while the run went on)
        spent = float(getattr(self._square, "seconds", 0.0)) or time.perf_counter() - t0
        self.lu_at = (itn, t)
        if self._square.deficient:
            self.at_risk = True         # the rank decision is dense work: shown, not guessed
            reads = self._reads_pivots()
            gpu = reads and bool(self._dense_gpu())
            if gpu:
                self.gap_predicted = self._square.revealed_dead()
                self.subspace_predicted = (not self.gap_predicted and
                                           bool(self._square.hides_deficiency()))
            elif reads and self._host_sweeps is not None:
                # no GPU for the dense work: U's pivots that split predict the host's
                # gap-checked sparse COD, where its σ test runs on R11's compiled sweeps
                dead = self._square.revealed_dead()
                if dead and self._host_sweeps():
                    self.gap_predicted, self.rank_host = dead, True
                elif dead:
                    self.gap_dropped = "the host's compiled sweeps not at hand"
            elif self._predicts_large_subspace():
                self.subspace_predicted = True
        self.analysis_s += time.perf_counter() - t0
        if clear:
            self.speculated, self.speculated_at, self.speculation_s = True, t, spent
            self.rank_s = 0.0
            # a solve and the residual's products: a small share of the factorization
            self.predicted = max(0.05 * spent, CHECK_INTERVAL_S)

    def _reads_pivots(self) -> bool:
        """Whether U's pivots may be worth reading (:attr:`gap_predicted`,
        :attr:`subspace_predicted`): a deficient LU that is not singular, R's order from
        :data:`GAP_GPU_MIN_ORDER` to :data:`RANK_SPARSE_MIN_ORDER` (where the gap-checked
        COD's σ test runs on the GPU, or the host's sparse COD comes before its dense
        rules), and the GPU's question given (``dense_gpu``, asked after this: a GPU for
        the dense rank work, else the host's, read where ``host_sweeps`` is given)."""
        return (self._dense_gpu is not None and not self._square.singular and
                GAP_GPU_MIN_ORDER <= self.order <= RANK_SPARSE_MIN_ORDER)

    def _predicts_large_subspace(self) -> bool:
        """Whether R's small singular subspace on the GPU is predicted to decide the rank of
        an R beyond :data:`RANK_SPARSE_MIN_ORDER` (lstsq's ``DENSE_LIMIT``): a deficient LU
        that is not singular (an exactly singular one leaves pivots at rounding, whose
        solves the subspace refuses), a GPU for the dense rank work (``dense_gpu``), and
        ``device_subspace`` with the count of U's pivots under the cutoff
        (``square.pivots_under_cutoff()``, recorded in :attr:`large_under`). There that
        decision costs a few block solves with R made dense on the device
        (:func:`subspace_seconds`), not the dense COD's q³ nor R's entries' sparse rules."""
        if self._device_subspace is None or self._dense_gpu is None or \
                self._square.singular or self.order <= RANK_SPARSE_MIN_ORDER or \
                not self._dense_gpu():
            return False
        under = int(self._square.pivots_under_cutoff())
        if not self._device_subspace(self.order, under):
            return False
        self.large_under = under
        return True

    @property
    def _large_route(self) -> bool:
        """The subspace prediction beyond :data:`RANK_SPARSE_MIN_ORDER` holds."""
        return self.subspace_predicted and self.large_under >= 0

    @property
    def _predicted_route(self) -> bool:
        """Whether U's pivots predict the QR's rank decision (the gap-checked COD or R's
        small singular subspace on the GPU, or the gap-checked COD on the host where
        :attr:`rank_host`)."""
        return bool(self.gap_predicted) or self.subspace_predicted

    def _keep_prediction(self) -> None:
        """Drop :attr:`gap_predicted` where the plan would not run the gap-checked COD
        with its σ test on the GPU: the factorization on the GPU (whose factorizer that
        COD would use), no GPU seen by the plan, R11 below :data:`GAP_GPU_MIN_ORDER`, or
        R (the analysis' count) denser than :data:`RANK_SPARSE_MAX_DENSITY`; drop
        :attr:`subspace_predicted` where the plan saw no GPU (a GPU factorization keeps
        it: R's dense work runs there; beyond :data:`RANK_SPARSE_MIN_ORDER` a host R's too,
        after its gap-checked sparse COD). The host's gap-checked COD
        (:attr:`rank_host`) is dropped where the plan factorizes on the GPU or did not
        count R's entries, or R is denser than :data:`RANK_SPARSE_MAX_DENSITY` (lstsq's
        sparse COD is not tried there, and the prediction follows R's entries)."""
        if self.rank_host:
            why = ("no plan" if self.planned is None else
                   "the plan factorizes on the GPU" if self.rank_device != "cpu" else
                   "R's entries not counted" if self.r_entries is None else
                   "R too dense for the sparse COD"
                   if self.r_entries > RANK_SPARSE_MAX_DENSITY * float(self.order) ** 2
                   else "")
            if why:
                self.gap_predicted, self.subspace_predicted = 0, False
                self.rank_host, self.gap_dropped = False, why
            return
        if self.subspace_predicted:
            why = ("no plan" if self.planned is None else
                   "the plan saw no GPU" if getattr(self.planned[1], "gpu_name", None) is None
                   else "")
            if why:
                self.subspace_predicted, self.gap_dropped = False, why
            return
        if self.planned is None:
            why = "no plan"
        elif self.rank_device != "cpu":
            why = "the plan factorizes on the GPU"
        elif getattr(self.planned[1], "gpu_name", None) is None:
            why = "the plan saw no GPU"
        elif self.order - self.gap_predicted < GAP_GPU_MIN_ORDER:
            why = "R11 too small for the GPU's σ test"
        elif self.r_entries is not None and \
                self.r_entries > RANK_SPARSE_MAX_DENSITY * float(self.order) ** 2:
            why = "R too dense for the sparse COD"
        else:
            return
        self.gap_predicted, self.gap_dropped = 0, why

    def _confirm(self, kind: str, reason: str, needed: Optional[int] = None) -> bool:
        """Stop once verdict ``kind`` held at ``needed`` (default :data:`CONFIRMATIONS`)
        checkpoints in a row ('' clears it)."""
        last, count = self._verdict
        count = count + 1 if kind and kind == last else (1 if kind else 0)
        self._verdict = (kind, count)
        if kind and count >= (CONFIRMATIONS if needed is None else needed):
            self.reason = reason
            return True
        return False

    def _analyse(self, itn: int, t: float) -> None:
        t0 = time.perf_counter()
        make = self._plan_gpu if self._large_route and self._plan_gpu is not None \
            else self._plan
        try:
            self.planned = make()
        except MemoryError as exc:
            self.plan_error = exc
        else:
            chosen = self.planned[1]
            flops = float(getattr(chosen.analysis, "flops", float("nan")))
            predicted = predicted_seconds(chosen.backend, flops, chosen.gpu_name)
            self.predicted = predicted if predicted == predicted else math.inf
            entries = getattr(chosen.analysis, "nnz_R", None)
            if chosen.backend != "gpu" and entries is not None:
                self.r_entries = float(entries)
            self.rank_device = "gpu" if chosen.backend == "gpu" else "cpu"
        self.analysis_s += time.perf_counter() - t0
        self.analysed_at = (itn, t)

    def _project(self, itn: int, t: float) -> tuple[Optional[int], float]:
        """Further iterations until a tolerance test is met (None: no estimate), s/iteration.

        A least-squares line through ``log(test1/rtol)`` and
        ``log(test2/atol)`` over the last :data:`PROJECTION_WINDOW`
        iterations (consecutive, so the slope is a fixed weighting of the
        values, :data:`_SLOPE_WEIGHTS`); the sooner of the two. The seconds
        per iteration are the lower of the window's (the first iterations
        carry set-up costs) and the run's average (a pause of the process
        inside the window would inflate the window's). Each projection also
        records the window's mean values (:attr:`trend`, :meth:`_trend`).
        """
        h = self.history
        average = t / max(itn, 1)
        if len(h) < PROJECTION_WINDOW:
            return None, average
        first, last = h[0], h[-1]
        seconds = last.seconds - first.seconds
        if self.analysed_at is not None and first.itn < self.analysed_at[0] <= last.itn:
            seconds -= self.analysis_s
        per_iteration = min(seconds / max(last.itn - first.itn, 1), average)
        best = None
        means = []
        for column in (self._log_test1(h), self._log_test2(h)):
            finite = all(map(math.isfinite, column))
            means.append(sum(column) / PROJECTION_WINDOW if finite else None)
            if column[-1] <= 0:
                return 0, per_iteration
            if not finite:
                continue
            slope = sum(w * y for w, y in zip(_SLOPE_WEIGHTS, column))
            if slope < 0:
                need = math.ceil(column[-1] / -slope)
                best = need if best is None else min(best, need)
        self._itn = itn
        self._keep_promises(itn, best)
        self.trend = self._trend((first.itn + last.itn) / 2.0, itn, means)
        return best, per_iteration

    def _keep_promises(self, itn: int, further: Optional[int]) -> None:
        """Count the projections' broken promises (:attr:`broken`) and record ``further``.

        A projection at iteration ``i`` of ``f`` more iterations promised
        SciPy's stop by ``i + f``; once the run passes :data:`PROMISE_SLACK` ×
        ``(i + f)`` iterations without it (the run is still watched, so it has
        not stopped) the promise is broken. LSQR's tests often fall
        in steps, so one window's line promises too soon on converging runs
        too; on a run whose tests fall as a power of the iteration count
        (rajat01: ``test1/rtol`` by a factor of ten each 6-7-fold of the
        iterations) the window's line promises a few hundred more at every
        checkpoint, to ``iter_lim``."""
        kept = []
        for then, promised in self._promises:
            if itn > PROMISE_SLACK * (then + promised):
                self.broken += 1
            else:
                kept.append((then, promised))
        if further is not None and further > 0:
            kept.append((itn, further))
        self._promises = kept

    def _trend(self, center: float, itn: int, means: list) -> Optional[int]:
        """Further iterations by the long trend (None: no estimate), and the window's
        means kept for later checkpoints.

        The straight line through the window's mean values now and those of
        the checkpoint whose window's centre lay nearest half the iterations of
        the current one's (at least :data:`PROJECTION_WINDOW` before it),
        extended from the current centre: the mean of 20 values
        and a slope over hundreds of iterations do not flicker with the tests'
        noise as one window's slope does (LSQR's ``test2`` jumps by factors of
        ten between iterations on some matrices), and still follow a run that
        speeds up late (the trend spans the later half of the run only).
        The same two means on log(itn) give :attr:`power`, the further
        iterations if the tests fall as a power of the iteration count (later
        than the straight line's wherever the tests fall; :meth:`_beyond`).
        """
        marks = self._marks
        best = None
        self.power = None
        if marks:
            goal = center / 2.0
            then = None
            for mark in marks:
                if center - mark[0] < PROJECTION_WINDOW:
                    break
                if then is None or abs(mark[0] - goal) <= abs(then[0] - goal):
                    then = mark
            if then is not None:
                span = center - then[0]
                power = None
                for now_y, then_y in zip(means, then[1:]):
                    if now_y is None or then_y is None or now_y >= then_y:
                        continue
                    need = math.ceil(now_y / ((then_y - now_y) / span) - (itn - center))
                    need = max(need, 0)
                    best = need if best is None else min(best, need)
                    if then[0] > 0:
                        # the same two means on log(itn): the tests falling as a power
                        # of the iteration count reach the tolerance at centre * e**x
                        x = now_y * math.log(center / then[0]) / (then_y - now_y)
                        reach = center * math.exp(min(x, 50.0)) - itn
                        power = reach if power is None else min(power, reach)
                self.power = None if power is None else max(power, 0.0)
        if not marks or marks[-1][0] < center:
            marks.append((center, *means))
        return best

    @staticmethod
    def _log_test1(h):
        return [math.log(max(state.test1, 1e-300) / max(state.rtol, _EPS)) for state in h]

    def _log_test2(self, h):
        return [math.log(max(state.test2, 1e-300)) - self.log_atol for state in h]

    def _conlim_reached(self, further: int) -> str:
        """Why the condition estimate will reach ``conlim`` within ``further`` iterations, or ''.

        The estimate's growth is extrapolated as a power of the iteration
        count, fitted to the window's ends: the estimates of LSQR and LSMR
        grow fast at first and level off towards cond(A), so an exponential
        model would stop runs that converge well below ``conlim``.
        """
        if self.log_conlim is None or further == 0:
            return ""
        h = self.history
        (i0, c0), (i1, c1) = (h[0].itn, h[0].conda), (h[-1].itn, h[-1].conda)
        if not (c1 > c0 > 0 and i1 > i0 > 0):
            return ""
        power = math.log(c1 / c0) / math.log(i1 / i0)
        projected = math.log(c1) + power * math.log((i1 + further) / i1)
        if projected < self.log_conlim:
            return ""
        need = math.ceil(i1 * (math.exp((self.log_conlim - math.log(c1)) / power) - 1))
        return (f"the condition estimate ({c1:.2g}) projects to reach conlim in {need} "
                f"iterations, before convergence ({further})")

    def summary(self) -> str:
        """The allowance and the projection, for the log."""
        parts = []
        if self.lu_at is not None:
            itn, t = self.lu_at
            parts.append(f"SuperLU's factors made after {itn} iterations ({t:.3g} s, the LU's "
                         f"prediction {self.lu_s:.3g} s) in {self._square.seconds:.3g} s: "
                         + (f"A {self._square.why}" if self._square.clear
                            else f"not used ({self._square.why})"))
            where = "on the host" if self.rank_host else "on the GPU"
            if self.gap_predicted:
                parts.append(f"U's pivots: {self.gap_predicted} under lstsq's cutoff, the "
                             f"rest clearly above (the gap-checked COD {where} predicted)")
            elif self._large_route:
                parts.append(f"{self.large_under} of U's pivots under lstsq's cutoff, R beyond "
                             f"DENSE_LIMIT (R's small singular subspace on the GPU predicted)")
            elif self.subspace_predicted:
                parts.append("U's pivots hide the deficiency (R's small singular subspace on "
                             "the GPU predicted)")
            elif self.gap_dropped:
                parts.append(f"U's pivots predicted the QR's rank decision; "
                             f"dropped: {self.gap_dropped}")
        if self.predicted is not None and self.analysed_at is not None:
            itn, t = self.analysed_at
            parts.append(f"analysed after {itn} iterations ({t:.3g} s) in "
                         f"{self.analysis_s:.3g} s; predicted factorization "
                         f"{self.predicted:.3g} s on {self.planned[1].backend!r}"
                         + (f" + rank decision {self.rank_s:.3g} s" if self.rank_s else ""))
            if self.speculated is not None and not self._lu_answers:
                parts.append(f"factorized ahead in {self.speculation_s:.3g} s: "
                             + (f"{self.speculated_how} (no dense rank work)"
                                if self.speculated else
                                "R neither clearly of full rank nor of a few dead pivots"))
        elif self.plan_error is not None:
            parts.append(f"the QR cannot run ({self.plan_error})")
        elif self.predicted is None and self._lu_singular:
            parts.append("no analysis (A exactly singular: SciPy's run converged before a "
                         "verdict could weigh the QR)")
        elif self.predicted is None and self._lu_deficient:
            floor = self._floor()
            parts.append(f"no analysis (A not of full rank: the QR's rank decision alone, "
                         f"at least {floor:.3g} s, costs more than iterating on)")
        elif self.predicted is None:
            parts.append(f"no analysis (deferred while the projected total stays within "
                         f"{self.deferral:.3g} s = {ANALYSIS_DEFERRAL:g} x its estimate)")
        if self.projection is not None:
            itn, further, per = self.projection
            parts.append(f"last projection at {itn} iterations: {further} more "
                         f"at {per:.3g} s each")
        return "; ".join(parts)
