"""The QR's exact answer of a short ``lsqr``/``lsmr`` run, made on a worker while the run goes on.

A run that ``auto``'s rule leaves unwatched
(:func:`~scipy_gpuqr._dispatch.iterate_first.needs_watching`: its iterations up
to ``iter_lim`` cost less than a few analyses) ends either by
SciPy's convergence tests, and SciPy's tuple answers, or at ``iter_lim``
(LSMR's default ``min(m, n)`` on the small LP matrices), and then the QR
answers: the call costs the run plus the QR. No sign in the run tells the two
apart early (converging runs sit as far from their tolerances near the end as
stalling ones), so the rule cannot stop such a run early. On a host with cores
to spare the QR can be made beside it instead: :class:`QRAhead` is the run's
callback, and once the run has made :data:`QR_AHEAD_SHARE` of its limit's
iterations it starts, on one worker thread, what the caller's thread would make
after a stall — the start (:func:`~scipy_gpuqr._factor.least_squares.start_problem`),
the plan (:func:`~scipy_gpuqr._factor.factored.plan_for`) and the answer
(:func:`~scipy_gpuqr._factor.least_squares.solve_least_squares`) — with the
same calls on the same operands, so the answer is the same bits. A stalled run
then costs about the longer of the run and the QR, not their sum.

SciPy's run is not touched: it runs in the compiled loops, which release the
interpreter's lock, and the worker's SuiteSparseQR calls (cffi) release it as
well. The worker's first step waits until the caller's thread has started it
and is on its way back to the run (:meth:`QRAhead.start`): a worker that ran
at once would hold the interpreter's lock through its first steps (the start
and the plan, Python between few C calls) while the run waited for it to take
up its iterations again. A run that converges cancels the worker
(:meth:`QRAhead.cancel`: it stops at its next step) and returns without
waiting for it; what it may wait for is the interpreter's lock, while the
worker runs Python between its C calls (a fraction of a millisecond on these
problems). Runs that converge before the share start no thread, and the
compiled loops report nothing before it (:meth:`QRAhead.first_report`).

A stalled run's caller that finds the worker still busy does not wait for all
of its work: :meth:`QRAhead.result` asks it to stop at its next step (after the
start, the plan or the factorization) and the caller's thread makes the rest
from there, with the same calls on the same operands (the factors handed on
in the plan, :meth:`~scipy_gpuqr._dispatch.plan.Plan.with_factors`, as
:func:`~scipy_gpuqr._factor.quick_iterate.speculate` hands them). The caller's
thread is the faster one for that rest: the steps allocate their large arrays
afresh on every call (R made dense, SuiteSparseQR's workspace), and glibc
serves a thread other than the process' first from an arena of its own, where
they land on pages faulted in again on each call, while the caller's thread
reuses its own.

The worker runs only where it cannot change the bits of anything else, and
where it may pay (:func:`qr_ahead_fits`):

* at least :data:`QR_AHEAD_MIN_CPUS` usable cores (as the LU made ahead);
* vectors of at most :data:`QR_AHEAD_MAX_LENGTH` entries: the rank decision
  on the worker may lower the process' OpenBLAS thread counts
  (:func:`~scipy_gpuqr._cpu.blas_threads.process_limited`) while SciPy's run
  takes its norms through NumPy's BLAS ``ddot``, which OpenBLAS splits among
  threads only above 10000 entries;
* a dense bound of the QR's flops of at most :data:`QR_AHEAD_MAX_FLOPS`
  (``2 q² (p − q/3)``, ``p ≥ q`` the matrix's dimensions): the worker's time and
  memory are small whatever the fill, and a run that converged does not leave
  it busy for long;
* a QR beyond the dense answer's size gate
  (:func:`~scipy_gpuqr._factor.dense_least_squares.dense_qr_small`): a tinier
  problem's exact answer, made densely on the caller's thread after the stall,
  costs less than a worker's start and hand-over;
* a run to the limit of at least :data:`QR_AHEAD_MIN_RUN_S` nominal seconds;
* a plan on the host: where the plan gives the QR a GPU, the worker stops
  and hands the plan to the caller's thread, which factorizes as without it.
"""

from __future__ import annotations

import math
import threading
from typing import Callable, NamedTuple, Optional

from .._dispatch.iterate_first import LU_AHEAD_MIN_CPUS
from .._dispatch.placement import host_iteration_seconds
from .._schedule.native import usable_cpus
from .factored import plan_for
from .dense_least_squares import dense_qr_flops, dense_qr_small
from .least_squares import LstsqAnswer, LstsqStart, solve_least_squares, start_problem

__all__ = ["QR_AHEAD_MIN_CPUS", "QR_AHEAD_SHARE", "QR_AHEAD_MIN_RUN_S", "QR_AHEAD_MAX_LENGTH",
           "QR_AHEAD_MAX_FLOPS", "qr_ahead_fits", "Made", "QRAhead"]

#: Fewest cores the process may use for a QR made ahead (one for SciPy's run, one for
#: the worker, and room for the BLAS pools and the rest of the host).
QR_AHEAD_MIN_CPUS = LU_AHEAD_MIN_CPUS
#: Share of the run's iteration limit after which the worker starts: converging runs on
#: these small matrices mostly stop within the first fifth of their limit (and then start
#: no thread) or near its end (Krylov's finite termination, where the stalled ones stop
#: too); a stalled run's QR starts this share of the run late.
QR_AHEAD_SHARE = 0.25
#: Least nominal seconds of a run to its limit (``iter_lim`` iterations at
#: :func:`~scipy_gpuqr._dispatch.placement.host_iteration_seconds`) for the QR ahead:
#: a shorter run could hide little of the QR behind it, and the callback that starts the
#: worker (a C callback and a report) costs tens of microseconds.
QR_AHEAD_MIN_RUN_S = 1e-3
#: Longest vector (``max(m, n)``) of a run beside which the worker may run (see above).
QR_AHEAD_MAX_LENGTH = 10000
#: Largest dense bound of the QR's flops for which it is made ahead.
QR_AHEAD_MAX_FLOPS = 1e8

#: Backends whose factorization the worker makes (all but the GPU's).
_HOST_BACKENDS = ("cpu", "reference", "simulate")


def qr_ahead_fits(shape, nnz: int, iter_lim: int) -> bool:
    """Whether the QR of an A of ``shape`` with ``nnz`` stored entries may be made ahead
    of a run to ``iter_lim`` on this host: enough usable cores, short vectors, a small
    dense bound of its flops but beyond the dense answer's, a run long enough to hide
    some of it (see the module)."""
    m, n = (int(d) for d in shape)
    p, q = max(m, n), min(m, n)
    if q == 0 or p > QR_AHEAD_MAX_LENGTH:
        return False
    if dense_qr_flops((m, n), 0.0) > QR_AHEAD_MAX_FLOPS or dense_qr_small((m, n)):
        return False
    if iter_lim * host_iteration_seconds(m, n, nnz) < QR_AHEAD_MIN_RUN_S:
        return False
    return usable_cpus() >= QR_AHEAD_MIN_CPUS


class Made(NamedTuple):
    """What the worker made: the caller's thread goes on from it after a stall."""

    begin: LstsqStart                   # start_problem's answer
    answer: Optional[LstsqAnswer]       # the QR's answer; None where begin is trivial, the
                                        # plan is the GPU's, or the worker stopped before it
    planned: Optional[tuple]            # (M, Plan) where the worker planned (the Plan with
                                        # M's factors where it factorized)
    what: str = ""                      # what it made, for the decision log ('' for the start
                                        # alone)


class QRAhead:
    """SciPy's run's callback that makes the QR's answer on a worker once the run has
    made :data:`QR_AHEAD_SHARE` of ``iter_lim``'s iterations without stopping.

    Parameters
    ----------
    problem : callable
        ``problem() -> LeastSquaresProblem``: the checked problem, made on the
        caller's thread when the worker starts (the worker then owns it until
        :meth:`result` returns).
    settings : Settings
        The call's settings (``auto``).
    iter_lim : int
        The run's iteration limit.
    calc_var : bool
        lsqr's ``calc_var``: the QR's answer computes the variances.
    """

    def __init__(self, problem: Callable, settings, *, iter_lim: int, calc_var: bool = False):
        self._problem = problem
        self._settings = settings
        self._calc_var = bool(calc_var)
        self.at_itn = max(1, math.ceil(QR_AHEAD_SHARE * int(iter_lim)))
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()
        self._go = threading.Event()
        self._cancelled = False
        self._waited = False
        self._made: Optional[Made] = None
        self._error: Optional[BaseException] = None

    # -- the run's callback (called on the caller's thread) ---------------------

    def __call__(self, state) -> bool:
        """Start the worker at the first iteration from :attr:`at_itn` on that does not
        stop the run; never stops it."""
        if self._thread is None and state.itn >= self.at_itn and state.istop == 0:
            self.start()
        return False

    def first_report(self) -> int:
        """The first iteration a compiled run reports (:attr:`at_itn`)."""
        return self.at_itn

    def quiet_until(self) -> float:
        """No iteration after the first report starts the worker: none is reported but
        the one that stops the run."""
        return math.inf

    def catch_up(self, states) -> None:
        """Iterations the run did not report: nothing to keep."""

    # -- the worker ------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the worker was started."""
        return self._thread is not None

    def start(self) -> None:
        """Start the worker (once). The checked problem is made here, on the caller's
        thread, so that the worker and the caller never both make it. The worker's
        first step waits until this has returned: the run goes on at once, not after
        the worker's first steps (Python, which hold the interpreter's lock). Where no
        thread can be started (the host's limit on threads), none is: the caller makes
        the answer after the run as without the worker."""
        if self._thread is not None or self._cancelled:
            return
        problem = self._problem()
        thread = threading.Thread(target=self._work, args=(problem,), daemon=True,
                                  name="scipy_gpuqr-qr-ahead")
        try:
            thread.start()
        except RuntimeError:        # "can't start new thread"
            return
        self._thread = thread
        self._go.set()

    def cancel(self) -> None:
        """SciPy's answer stands: the worker stops at its next step. Never waits."""
        self._cancelled = True

    def result(self) -> Optional[Made]:
        """What the worker made (waiting for it to end the step it is in: it stops
        there, and the caller makes the rest), or None where it never started (the
        caller makes the answer itself); raises what the worker raised."""
        if self._thread is None:
            return None
        self._waited = True
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._made

    def _stops(self) -> bool:
        """Whether the worker stops before its next step: the run converged, or the
        caller waits and makes the rest itself."""
        return self._cancelled or self._waited

    def _work(self, problem) -> None:
        begin = planned = None
        what = ""
        self._go.wait()
        try:
            begin = start_problem(problem)
            if begin.trivial or self._stops():
                return
            planned = plan_for(problem.qr_matrix(), self._settings)
            what = "the QR planned"
            if planned[1].backend not in _HOST_BACKENDS or self._stops():
                return
            M, plan = planned
            planned = (M, plan.with_factors(M, plan.factorize(M, tol=None)))
            what = "the QR factorized"
            if self._stops():
                return
            answer = solve_least_squares(problem, begin, calc_var=self._calc_var,
                                         settings=self._settings, planned=planned)
            self._made = Made(begin, answer, planned, "the QR made")
        except BaseException as exc:     # noqa: BLE001 - raised again by result()
            self._error = exc
        finally:
            if self._made is None and begin is not None:
                self._made = Made(begin, None, planned, what)
            self._done.set()
