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
The aim is that ``auto`` costs at most about 1.1 times the better of "iterate
to SciPy's stop" and "factorize". The run is watched through the solvers'
per-iteration callback (:class:`Allowance`), which measures the seconds per
iteration and projects the iterations still needed from the trend of SciPy's
two tolerance tests over the last
:data:`~scipy_gpuqr._dispatch.projection.PROJECTION_WINDOW` iterations (and the
growth of the condition estimate towards ``conlim``). The projection is a
straight line through a quantity that often bends (LSQR and LSMR speed up late,
or plateau for a while), and the QR's predicted time leaves out what only the
factorization shows; so the rule leaves SciPy's run alone unless the evidence
is clear:

1. Before the symbolic analysis (which the factorization needs anyway, and
   which the prediction needs) the run goes on while its projected total
   time stays within :data:`ANALYSIS_DEFERRAL` times the analysis' estimated
   cost (:func:`analysis_seconds`): a problem that converges that soon is
   answered without analysis, and one that needs the analysis pays at most
   ``1 / ANALYSIS_DEFERRAL`` of its iteration time for it.
2. Then the plan is made and the QR's time Q predicted: the factorization and
   solve (:func:`scipy_gpuqr._dispatch.cost_model.predicted_seconds`), plus the
   rank decision's dense work
   (:func:`~scipy_gpuqr._dispatch.rank_cost.rank_decision_seconds`) where the
   run shows the matrix may be ill-conditioned or rank deficient
   (:func:`~scipy_gpuqr._dispatch.rank_cost.rank_risk`: its condition estimate
   passed :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_RISK_COND`, or it has
   run :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_RISK_SHARE` of the columns'
   count of iterations; before that, :data:`RANK_PRIOR` of it). On such
   matrices the rank decision costs up to hundreds of factorizations. Where the
   rank decision is what keeps the QR from answering (the run looks as if it
   will not converge soon, and the factorization alone would be cheaper than
   iterating on), the factorization is made at once, once, if the caller can
   (``speculate``): when its R is clearly of full rank (one of lstsq's cheap
   tests passes: the 1-norm condition estimate, or the randomized probe through
   R's sparse solves) the rank decision costs a triangular condition estimate,
   not dense work, and the QR's remaining cost is its solve; so it is where a
   few of R's pivots lie below lstsq's cutoff with the rest clearly above (the
   null-space COD: a few solves with those columns); otherwise the prediction
   stands and the factors wait for the QR.
3. SciPy's run stops only on a verdict that holds at
   :data:`CONFIRMATIONS` checkpoints in a row:

   * its projection passes ``iter_lim`` and the iterations to ``iter_lim`` cost
     more than Q (going on would cost more than the QR if the projection is
     right; projections past ``iter_lim``, even twice past it, were seen on
     runs that converged well before it). Once the window's projections have
     broken :data:`~scipy_gpuqr._dispatch.projection.BROKEN_PROMISES` promises
     (:meth:`~scipy_gpuqr._dispatch.projection.Projector._keep_promises`:
     convergence promised by iteration ``N``, not there at
     :data:`~scipy_gpuqr._dispatch.projection.PROMISE_SLACK` × ``N``), the
     projection is the later of the window's and the long trend's on log(itn)
     (the tests falling as a power of the iteration count, as they do on
     rajat01 to ``iter_lim``) where that passes ``iter_lim`` by
     :data:`~scipy_gpuqr._dispatch.projection.POWER_MARGIN`;
   * its condition estimate projects past ``conlim`` before convergence;
   * the projected remaining iterations cost more than :data:`SWITCH_MARGIN` ×
     Q (the margin covers the prediction's error), and so do those of the long
     trend where it projects SciPy's stop before ``iter_lim``
     (:meth:`~scipy_gpuqr._dispatch.projection.Projector._trend`: the line
     through the window's mean values now and at half the iterations, which one
     window's noise does not move);
   * its tests have not fallen over a whole window (no projection) and it
     has spent Q (:data:`STALL_SHARE` × Q);
   * it has spent :data:`ALLOWANCE_SHARE` × Q and its projection does not
     promise convergence within Q.

On a square A whose exact answer SciPy's SuperLU may give
(:mod:`scipy_gpuqr._api.square_lu`, ``Allowance(square=)``), the LU comes
first: once the run has cost the LU's prediction (:func:`lu_seconds`: ski
rental) and its projection does not promise convergence within that time,
SuperLU factorizes and tests lstsq's rank rule (on a host with cores to spare
the factors are made ahead on a worker from :data:`LU_AHEAD_SHARE` of that
time, while the run goes on, and read there: the run waits for what is left of
them, not for all of them); where its factors may answer, the exact answer's
remaining cost is their solve and the verdicts above weigh that (no analysis);
otherwise the rule goes on as without it, except where the LU showed A not of
full rank (``deficient``: an exactly singular factor, or the probe's lower
bound of ``‖A⁻¹‖₂`` past lstsq's cutoff). Then R cannot pass the cheap
full-rank tests, so nothing is factorized ahead, and the QR costs at least its
rank decision's dense work
(:func:`~scipy_gpuqr._dispatch.rank_cost.rank_decision_floor`, whichever device
the plan picks): the analysis waits until a verdict would stop the run even at
that floor. Every verdict stops at a lower QR time no later than at a higher
one, so the run stops where it would have stopped, and a run that converges
first (the ill-conditioned square matrices whose SciPy run needs a few thousand
iterations) pays for neither the analysis nor a factorization. Where SuperLU
found A exactly singular (``square.singular``) and R's order lies from
:data:`~scipy_gpuqr._dispatch.rank_cost.RANK_NULLSPACE_MIN_ORDER` to
:data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER`, A's exact
dependences are likely a few dead pivots of R, far below the cutoff, which the
host's null-space COD decides with a few solves: there the floor is 0, the
analysis is not deferred, and the factorization ahead reads R's pivots
(:data:`CLEAR_DEAD_PIVOTS`: the QR's rest is then that decision,
:data:`~scipy_gpuqr._dispatch.rank_cost.RANK_NULLSPACE_S_PER_SQUARE` × order²,
and its solve; otherwise the run goes on to SciPy's stop, having paid one
analysis and one factorization).
Where SuperLU's factors are deficient without being singular, U's pivots may
predict which of lstsq's rank rules the QR's R will meet, and so the cost of its
rank decision (:class:`~scipy_gpuqr._dispatch.lu_route.LURoute`: the gap-checked
sparse COD with its σ test on the GPU or on the host, or R's small singular
subspace on the GPU, which beyond lstsq's ``DENSE_LIMIT`` has the plan factorize
on the GPU, ``plan_gpu``). Where such a prediction holds the analysis is not
deferred, and the run stops for the exact answer unless its projection promises
convergence within :data:`PREDICTED_SHARE` of the QR's predicted time (LSQR's
projections on such matrices promise convergence far too soon; the long trend
is read, whose course the window's flicker does not break), at the first
checkpoint that says so (:data:`PREDICTED_CONFIRMATIONS`). Where the plan shows
the QR would not take the predicted route, the prediction is dropped and the
rule goes on as for any deficient LU. One route waits for the run: where U's
pivots hide the deficiency on a host without a GPU for the dense work, R's small
singular subspace through R's host sweeps costs about as much as SciPy's whole
run where that run converges soon, so it holds only once the run has passed
``min(m, n)`` iterations (LSQR's and LSMR's bound in exact arithmetic;
``LURoute.opens_at``): the run is told that iteration's checkpoint
(:meth:`Allowance.quiet_until`), and a run that converges before it keeps
SciPy's answer.

Checks run at checkpoints spaced by :data:`CHECK_GROWTH` of the elapsed time
(at least :data:`CHECK_INTERVAL_S`), so that watching costs little more than
the callback itself. The seconds per iteration are the lower of the
window's rate and the run's average, and the run's time is at most its
iterations at the fastest one's pace, so that a process descheduled for a
moment on a busy machine does not turn a converging run into a "stalling"
one (nor set off the analysis early).

Where the iterations run, and their move from the host to the GPU or to one GPU
thread block once they have cost as much as the move (ski rental), is
:mod:`scipy_gpuqr._dispatch.placement`'s.

Explicit backends (``gpu``, ``cpu``, ``reference``, ``simulate``) and
``GpuqrOptions(iterate_first=False)`` always factorize.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from .._schedule.native import usable_cpus
from .cost_model import predicted_seconds
from .lu_route import LURoute
from .placement import cpu_iteration_seconds, host_iteration_seconds
from .projection import PROJECTION_WINDOW, Projector
from .rank_cost import (RANK_NULLSPACE_MIN_ORDER, RANK_NULLSPACE_S_PER_SQUARE,
                        RANK_SPARSE_MIN_ORDER, rank_decision_floor, rank_decision_seconds,
                        rank_risk)

__all__ = ["SPECULATION_S_PER_ENTRY", "SPECULATION_MARGIN", "LU_FIXED_S", "LU_S_PER_ENTRY",
           "LU_AHEAD_MIN_CPUS", "LU_AHEAD_SHARE", "LU_AHEAD_MAX_S", "ANALYSIS_FIXED_S",
           "ANALYSIS_S_PER_LINE", "ANALYSIS_S_PER_ENTRY", "ANALYSIS_DEFERRAL", "STALL_SHARE",
           "ALLOWANCE_SHARE", "SWITCH_MARGIN", "ITER_LIM_MARGIN", "CONFIRMATIONS",
           "PREDICTED_CONFIRMATIONS", "RANK_PRIOR", "PREDICTED_SHARE", "CLEAR_FULL_RANK",
           "CLEAR_DEAD_PIVOTS", "CHECK_GROWTH", "CHECK_INTERVAL_S", "CONVERGED", "lu_seconds",
           "analysis_seconds", "needs_watching", "zero_tolerances", "Allowance"]

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
#: ... except the verdict of U's pivots (:class:`~scipy_gpuqr._dispatch.lu_route.LURoute`),
#: which reads
#: the LU's factors and the run's long trend, not one window's projection: it stops
#: at the first checkpoint that reaches it.
PREDICTED_CONFIRMATIONS = 1
#: Weight of the rank decision's predicted time before
#: :func:`~scipy_gpuqr._dispatch.rank_cost.rank_risk` holds: early in a run nothing tells an
#: ill-conditioned matrix (whose rank decision costs up to hundreds of factorizations) from a
#: well-conditioned one, and stopping a converging run for a QR that turns out that slow costs far
#: more than iterating on a stalling one a little longer.
RANK_PRIOR = 0.1
#: Where U's pivots predict the gap-checked COD, the run stops unless its long trend
#: (:meth:`~scipy_gpuqr._dispatch.projection.Projector._trend`; the window's projection before
#: there is one, whose flicker would keep the verdict from being confirmed) promises convergence
#: within this share of the QR's predicted time. LSQR's projections on such matrices promise far
#: too soon (adder_dcop_05 at 410 iterations: 390 more by the trend, 1530 in fact); a run that does
#: converge that soon costs at most the QR's time more.
PREDICTED_SHARE = 0.1

#: ``speculate``'s answers where R's rank decision costs no dense work: R is
#: clearly of full rank (a triangular condition estimate or probe, then R's solve), or a few of its
#: pivots lie below lstsq's cutoff and the rest clearly above (the null-space COD:
#: :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_NULLSPACE_S_PER_SQUARE`).
CLEAR_FULL_RANK = "R clearly of full rank"
CLEAR_DEAD_PIVOTS = "R of a few dead pivots (the null-space COD)"
#: Checkpoints follow each other after this share of the elapsed time ...
CHECK_GROWTH = 0.1
#: ... and at least this many seconds apart.
CHECK_INTERVAL_S = 1e-3

#: SciPy's ``istop`` codes of a converged run: its tolerance tests (1: ``Ax - b``
#: small enough, 2: the least-squares solution good enough) and their
#: machine-precision forms (4, 5), the same for LSQR and LSMR.
CONVERGED = frozenset((1, 2, 4, 5))


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
    (:data:`ANALYSIS_DEFERRAL` × ``analysis``, the analysis' estimated seconds)
    ends before any rule could stop it: it runs unwatched, without the
    callback's cost on every iteration. The rate is
    :func:`~scipy_gpuqr._dispatch.placement.host_iteration_seconds` where the
    run is a host loop (``host_loop``), else
    :func:`~scipy_gpuqr._dispatch.placement.cpu_iteration_seconds`;
    ``per_iteration`` where given (a run in one GPU thread block:
    :func:`~scipy_gpuqr._dispatch.placement.block_iteration_seconds`). Other
    GPU runs are always watched.
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
        ``min(m, n)`` of the matrix the QR factorizes: the order of R whose rank the QR decides
        (:func:`~scipy_gpuqr._dispatch.rank_cost.rank_decision_seconds`); 0 leaves the rank
        decision out of the prediction.
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
        (``deficient``) it factorizes nothing ahead and analyses only once a verdict would stop the
        run at :func:`~scipy_gpuqr._dispatch.rank_cost.rank_decision_floor`. On a host with
        :data:`LU_AHEAD_MIN_CPUS` cores, a square with ``factor_ahead()`` is started on a worker
        once the run has cost :data:`LU_AHEAD_SHARE` of the prediction, and read at the same
        checkpoint. None: no LU.
    nnz : int
        A's stored entries (the LU's prediction).
    dense_gpu : callable, optional
        ``dense_gpu() -> bool``: whether a GPU would run the QR's dense rank work
        (auto's, with a GPU present), asked once, where a deficient LU that is not
        singular could predict the gap-checked COD (``square.revealed_dead()``, asked
        only after it): on the GPU where True, on the host where False (with
        ``host_sweeps``). None: U's pivots are never read.
    device_subspace : callable, optional
        ``device_subspace(order, under) -> bool``: whether R's small singular subspace on the GPU
        would be tried on an order-``order`` R beyond
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` with about ``under`` pivots
        under lstsq's cutoff (lstsq's ``device_subspace_takes``: its first block within the
        largest, R made dense there within the device's memory), asked where a deficient LU that is
        not singular could predict that decision (after ``dense_gpu``). None: never.
    host_sweeps : callable, optional
        ``host_sweeps() -> bool``: whether the host's compiled sparse sweeps answer
        (``scipy_gpuqr._factor.native.at_hand``), asked where ``dense_gpu()`` is False
        and U's pivots split: the host's gap-checked COD is predicted only with them
        (its σ test is R11 made dense without them: q³/3 flops and dense Lanczos).
        None: U's pivots are not read on such a host.
    plan_gpu : callable, optional
        ``plan_gpu() -> (M, Plan)``: the plan with the factorization on a usable GPU
        (:data:`~scipy_gpuqr._dispatch.lu_route.SUBSPACE_GPU_PLAN_REASON`), made instead of
        ``plan`` where that prediction holds: the GPU factorization's rank decision tries R's
        subspace there first, where a host R's gap-checked sparse COD comes before it. None:
        ``plan``.
    host_sigma : callable, optional
        ``host_sigma(order, entries) -> bool``: whether lstsq would test σ_min of the
        gap-checked COD's R11 on the host's compiled sweeps though a GPU runs the dense
        rank work (lstsq's ``host_sigma_pays``, the factorization on the host): the
        prediction is then the host's gap-checked COD. None: the GPU's.

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
        until :func:`~scipy_gpuqr._dispatch.rank_cost.rank_risk` holds.
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
    projector : Projector
        The run's course: its last iterations, the window's projection and the long
        trend (:class:`~scipy_gpuqr._dispatch.projection.Projector`).
    route : LURoute
        What U's pivots of a deficient LU predict of the QR's rank decision
        (:class:`~scipy_gpuqr._dispatch.lu_route.LURoute`; ``dense_gpu``,
        ``device_subspace``, ``host_sweeps`` and ``host_sigma`` are its questions).
    """

    def __init__(self, *, iter_lim: int, atol: float, conlim: float, analysis: float,
                 plan: Callable, order: int = 0, speculate: Optional[Callable] = None,
                 square=None, nnz: int = 0, dense_gpu: Optional[Callable] = None,
                 device_subspace: Optional[Callable] = None,
                 plan_gpu: Optional[Callable] = None, host_sweeps: Optional[Callable] = None,
                 host_sigma: Optional[Callable] = None):
        self.iter_lim = int(iter_lim)
        self.projector = Projector(iter_lim, atol, conlim)
        self.analysis_estimate = float(analysis)
        self.deferral = ANALYSIS_DEFERRAL * self.analysis_estimate
        self.order = int(order)
        self._plan = plan
        self._speculate = speculate
        self._square = square
        self._plan_gpu = plan_gpu
        self.route = LURoute(square, self.order, dense_gpu=dense_gpu,
                             device_subspace=device_subspace, host_sweeps=host_sweeps,
                             host_sigma=host_sigma)
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
        self._verdict = ("", 0)                    # (kind, consecutive checkpoints)
        self._last: Optional[float] = None
        self._last_itn = 0                         # the last report's iteration
        self._bound_checked = False                # a checkpoint past route.opens_at made
        self.fastest = math.inf                    # the fastest iteration's seconds
        self._pace = math.inf                      # the fastest s/iteration between reports

    @property
    def qr_seconds(self) -> Optional[float]:
        """The QR's predicted seconds: factorization and solve, plus the rank decision
        where :func:`~scipy_gpuqr._dispatch.rank_cost.rank_risk` held; None before the plan."""
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
        if self.route.opens_at < math.inf:
            # the pace between reports, for :meth:`quiet_until` (a gated run's reports lie
            # many iterations apart)
            done = state.itn - self._last_itn
            if done > 0 and self._last is not None:
                self._pace = min(self._pace, (seconds - self._last) / done)
        self._last_itn = state.itn
        self.projector.history.append(state)
        last, self._last = self._last, seconds
        if last is not None and seconds - last < self.fastest:
            self.fastest = seconds - last
        t = seconds - self.analysis_s
        if self._ahead_at is not None and t >= self._ahead_at:
            self._ahead_at = None
            self._square.factor_ahead(readings=self.route.reads_ahead())
        if t < self.next_check and (state.itn < self.route.opens_at or self._bound_checked):
            return False                    # most iterations: nothing more to do
        # the first report past the bound is a checkpoint; then the schedule's again
        self._bound_checked = state.itn >= self.route.opens_at
        self.next_check = max(t * (1 + CHECK_GROWTH), t + CHECK_INTERVAL_S)
        # a process paused by a busy machine: its iterations did not take that long
        return self.decide(state.itn, min(t, state.itn * self.fastest))

    def quiet_until(self) -> float:
        """The run's seconds before which no iteration reaches a checkpoint (a compiled
        host run reports none before, :func:`scipy_gpuqr._iterative.host._reporter`), or
        at which the LU starts on a worker (:data:`LU_AHEAD_SHARE`), or before which the
        run cannot reach the iteration from which the predicted route holds
        (``route.opens_at``, at the fastest pace between reports)."""
        at = self.next_check if self._ahead_at is None else min(self.next_check, self._ahead_at)
        at += self.analysis_s
        opens = self.route.opens_at
        if self._last is not None and self._last_itn < opens < math.inf:
            at = min(at, self._last + (opens - self._last_itn) * self._pace)
        return at

    def catch_up(self, states) -> None:
        """Iterations the run did not report, in order, before the next report's: kept in
        the history as each call would keep them, but not timed (their seconds are
        interpolated): the fastest iteration is that of iterations reported one after the
        other, whose time includes a report's, as when every iteration is reported."""
        self.projector.history.extend(states)

    # -- the rule ------------------------------------------------------------

    def decide(self, itn: int, t: float) -> bool:
        """The rule at a checkpoint: ``itn`` iterations done in ``t`` seconds of iterating."""
        history = self.projector.history
        further, per_iteration = self.projector.project(
            itn, t, None if self.analysed_at is None else self.analysed_at[0], self.analysis_s)
        trusted = itn >= PROJECTION_WINDOW
        if itn >= self.route.opens_at:
            self.route.open()               # past the Krylov bound: the host's subspace
            if self.predicted is not None:  # analysed before (a slow run): the plan's say
                self.route.keep(self.planned, self.rank_device, self.r_entries)
        if not self.at_risk and history:
            self.at_risk = rank_risk(history[-1].conda, itn, self.order)
        if further is not None:
            self.projection = (itn, further, per_iteration)
            why = self.projector.conlim_reached(further)
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
            if self._lu_deficient and not self.route.holds and \
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
            if not past_limit and not self._lu_singular and not self.route.holds and \
                    t < self.deferral and (remaining is None or t + remaining <= self.deferral):
                return self._confirm("", "")
            self._analyse(itn, t)
            if self.route.holds:
                self.route.keep(self.planned, self.rank_device, self.r_entries)
        if self.plan_error is not None:         # the QR cannot run: SciPy's run goes on
            self.next_check = math.inf
            return False
        routed = self.route.rank_seconds(self.r_entries)
        if routed is not None:
            self.rank_s = routed
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
        beyond = self.projector.beyond(further)
        if further is not None and itn + beyond > self.iter_lim:
            # stopping costs q; going on costs the iterations to iter_lim more than q if
            # the projection is right, and saves q if it is wrong (it often is)
            to_limit = (self.iter_lim - itn) * per_iteration
            if to_limit > q:
                how = ("" if beyond == further else
                       f" (the trend as a power of itn, {self.projector.broken} promises of the "
                       f"window's projection broken)")
                return self._confirm("iter_lim", f"projected {itn + beyond:.0f} iterations "
                                     f"exceed iter_lim {self.iter_lim}{how}, and the "
                                     f"{self.iter_lim - itn} "
                                     f"to it cost more ({to_limit:.3g} s) than the QR's "
                                     f"predicted {q:.3g} s")
        lasting = None if further is None else self.projector.lasting(further)
        if lasting is not None and lasting * per_iteration > SWITCH_MARGIN * q:
            return self._confirm("cost", f"projected {lasting} more iterations "
                                 f"({lasting * per_iteration:.3g} s) cost more "
                                 f"than {SWITCH_MARGIN:g} x the QR's predicted {q:.3g} s")
        promised = further if self.projector.trend is None else self.projector.trend
        if self.route.holds and (promised is None or
                                 promised * per_iteration > PREDICTED_SHARE * q):
            return self._confirm("predicted", f"{self.route.shown()} (the QR's predicted "
                                 f"{q:.3g} s), and "
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
        projector = self.projector
        if further is not None and itn + projector.beyond(further) > self.iter_lim and \
                (self.iter_lim - itn) * per_iteration > q:
            return True
        if further is not None and projector.lasting(further) * per_iteration > SWITCH_MARGIN * q:
            return True
        return further is None and trusted and t >= STALL_SHARE * q

    def _stops_at_floor(self, itn: int, t: float, further, per_iteration: float,
                        remaining) -> bool:
        """Whether a verdict of :meth:`decide` would stop the run if the QR cost only its rank
        decision's floor (:func:`~scipy_gpuqr._dispatch.rank_cost.rank_decision_floor`, weighted as
        :attr:`rank_s` is): where none would, no QR time the analysis could predict would
        either."""
        floor = self._floor()
        if self._would_stop(itn, t, further, per_iteration, remaining, floor):
            return True
        return t >= ALLOWANCE_SHARE * floor and (further is None or remaining > floor)

    def _floor(self) -> float:
        """The rank decision's floor (:func:`~scipy_gpuqr._dispatch.rank_cost.rank_decision_floor`,
        weighted as :attr:`rank_s` is), 0 where SuperLU found A exactly singular and R's order lets
        the host's null-space COD decide (:attr:`_lu_singular`)."""
        if self._lu_singular:
            return 0.0
        return rank_decision_floor(self.order) * (1.0 if self.at_risk else RANK_PRIOR)

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
        """SuperLU's factorization found A exactly singular (``square.singular``) and R's order is
        one whose rank the host's null-space COD may decide
        (:data:`~scipy_gpuqr._dispatch.rank_cost.RANK_NULLSPACE_MIN_ORDER`): a factorization ahead
        may show R's dependent columns as a few tiny pivots, whose rank decision costs a few solves
        (``speculate``'s ``clear``)."""
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
            self.route.read()
        self.analysis_s += time.perf_counter() - t0
        if clear:
            self.speculated, self.speculated_at, self.speculation_s = True, t, spent
            self.rank_s = 0.0
            # a solve and the residual's products: a small share of the factorization
            self.predicted = max(0.05 * spent, CHECK_INTERVAL_S)

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
        make = self._plan_gpu if self.route.large and self._plan_gpu is not None \
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

    def summary(self) -> str:
        """The allowance and the projection, for the log."""
        parts = []
        if self.lu_at is not None:
            itn, t = self.lu_at
            parts.append(f"SuperLU's factors made after {itn} iterations ({t:.3g} s, the LU's "
                         f"prediction {self.lu_s:.3g} s) in {self._square.seconds:.3g} s: "
                         + (f"A {self._square.why}" if self._square.clear
                            else f"not used ({self._square.why})"))
            route = self.route.summary()
            if route:
                parts.append(route)
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
