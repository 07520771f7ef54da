"""Iterate first, factorize only when iterating would cost more (lsqr/lsmr, backend 'auto').

A patched ``lsqr`` must never make a user's call many times slower. Many
least-squares problems are well conditioned, and SciPy's LSQR reaches a
backward error at working precision in a few hundred cheap iterations,
while a sparse QR of the same matrix may cost an order of magnitude more.

So under ``backend='auto'`` the least-squares entry points first run
SciPy's LSQR with machine-precision tolerances within an *allowance*
(:func:`iterate_first`):
:data:`ITERATION_SHARE` of the factorization's predicted time
(:mod:`scipy_gpuqr._dispatch.cost_model`: the analysis' flops against the
calibrated timings of the backend ``auto`` chose), capped by the
matrix-vector work :data:`ITERATION_FLOPS` and :data:`MAX_ITERATIONS`. A
matrix with up to :data:`ANALYSIS_FIRST_NNZ` entries is analysed first
(milliseconds); a larger one runs one piece of :data:`PRE_ANALYSIS_ITERATIONS`
iterations before its analysis, so a well-conditioned large problem is
answered without it. LSQR's answer is accepted
only when the *true* backward error of the final x is at working precision
(:func:`accept`, :func:`backward_error`): ‖Āᵀr̄‖ ≤ 16·eps·‖Ā‖_F·‖r̄‖ for
the (damped) least-squares problem, or ‖r̄‖ ≤ 16·eps·(‖Ā‖_F‖x‖ + ‖b‖) for a
consistent one. Otherwise the direct QR answers, with the plan already
made; a problem whose first two pieces project no convergence within the
allowance stops there. So a call that iterates in vain costs at most about
``1 + ITERATION_SHARE`` times the factorization (plus the prediction's
error), and one that converges costs less than that share of it.

The answer is still the minimum 2-norm least-squares solution: LSQR's
iterates from the starting point stay in range(Aᵀ), so the correction it
converges to is the minimum-norm one; directions of singular values below
the working precision stay unresolved (near zero), as numpy.linalg.lstsq's
rank rule zeroes them. ``backend='cpu'``/``'gpu'``/... (keyword, options
or environment) and ``GpuqrOptions(iterate_first=False)`` always factorize;
``calc_var=True`` always factorizes (the variances are exact through R).

The LSQR that runs is SciPy's own, which the caller passes in (``lsqr=``):
never a name that :func:`scipy_gpuqr.patch` may have replaced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from .._options import Settings, log_decision
from .cost_model import predicted_seconds

__all__ = ["ITERATION_FLOPS", "MIN_ITERATIONS", "MAX_ITERATIONS", "FIRST_CHUNK",
           "PRE_ANALYSIS_ITERATIONS",
           "ITERATION_SHARE", "ANALYSIS_FIRST_NNZ", "iteration_budget", "IterativeAnswer",
           "DampedNorms", "damped_norms", "backward_error", "try_lsqr", "accept",
           "LsqrProgress", "iterate_first"]

_EPS = float(np.finfo(np.float64).eps)

#: Flops of matrix-vector work LSQR may spend before the factorization starts.
ITERATION_FLOPS = 2e9
#: Bounds on the iteration budget.
MIN_ITERATIONS, MAX_ITERATIONS = 20, 1000
#: Backward errors up to this many eps are accepted (see :func:`backward_error`).
ACCEPT_FACTOR = 16.0
#: Iterations of each of the first two pieces, after which hopeless problems stop.
FIRST_CHUNK = 50
#: Iterations of the piece a matrix over :data:`ANALYSIS_FIRST_NNZ` entries runs
#: before its analysis: enough for the well-conditioned problems that converge
#: within a few tens of iterations, few enough that a problem which then
#: factorizes loses little.
PRE_ANALYSIS_ITERATIONS = 20
#: Share of the factorization's predicted time (:mod:`scipy_gpuqr._dispatch.cost_model`)
#: LSQR may spend before the factorization answers. The prediction may be up
#: to about twice the real time (it knows the flops alone), and ``auto`` should
#: cost at most 10 % more than the better backend.
ITERATION_SHARE = 0.03
#: Up to this many stored entries the symbolic analysis (milliseconds) runs first and
#: sets LSQR's whole allowance; beyond, one piece of LSQR runs before it.
ANALYSIS_FIRST_NNZ = 200_000
#: An allowance buying fewer iterations than this is not spent (a handful of
#: iterations almost never reaches working precision).
MIN_USEFUL_ITERATIONS = 10
#: Nominal cost of one LSQR iteration before any was timed: fixed seconds, matvec flop/s.
#: The fixed part grows with the host's BLAS threads (SciPy's lsqr makes vector
#: BLAS calls); the first piece is sized with this, so an optimistic value
#: overspends the allowance.
NOMINAL_ITERATION_S, NOMINAL_MATVEC_RATE = 1e-4, 1e9
#: The linear projection is crude (restarts, superlinear phases): a problem goes on
#: unless it projects more than this many budgets.
PROJECTION_SLACK = 2.0


class IterativeAnswer(NamedTuple):
    """An accepted LSQR answer: correction ``dx``, iterations, LSQR's cond estimate."""

    dx: np.ndarray
    itn: int
    acond: float


def iteration_budget(A) -> int:
    """Iterations allowed for A: :data:`ITERATION_FLOPS` over one iteration's flops."""
    m, n = A.shape
    per_iteration = 4.0 * A.nnz + 12.0 * (m + n)
    budget = int(ITERATION_FLOPS // max(per_iteration, 1.0))
    return int(np.clip(budget, MIN_ITERATIONS, MAX_ITERATIONS))


class DampedNorms(NamedTuple):
    """Norms of the damped problem ``min ‖r0 − A dx‖² + damp²‖dx‖²`` at ``dx``."""

    r1norm: float   # ‖r0 − A dx‖
    r2norm: float   # sqrt(r1norm² + damp²‖dx‖²)
    anorm: float    # ‖[A; damp·I]‖_F
    arnorm: float   # ‖Aᵀr − damp²·dx‖


def damped_norms(A, r0: np.ndarray, dx: np.ndarray, damp: float) -> DampedNorms:
    """The residual norms SciPy's lsqr/lsmr report, computed from ``dx``."""
    r = r0 - A @ dx
    r1norm = float(np.linalg.norm(r))
    return DampedNorms(
        r1norm, float(np.hypot(r1norm, damp * np.linalg.norm(dx))),
        float(np.sqrt(sp.linalg.norm(A, "fro") ** 2 + damp ** 2 * A.shape[1])),
        float(np.linalg.norm(A.T @ r - damp ** 2 * dx)))


def backward_error(A, r0: np.ndarray, dx: np.ndarray, damp: float) -> float:
    """Normwise backward error of ``dx`` for ``min ‖r0 − A dx‖² + damp²‖dx‖²``, in units of eps.

    The smaller of the consistent-system error ‖r̄‖ / (‖Ā‖_F‖dx‖ + ‖r0‖) and the
    least-squares error ‖Āᵀr̄‖ / (‖Ā‖_F ‖r̄‖). Both are demanding on purpose:
    on an ill-conditioned problem an unconverged iterate can have a tiny
    ‖Āᵀr̄‖ (its residual lies along small singular directions), so anything
    normalized by less than ‖r̄‖ would accept it. Least-squares problems with
    a small but nonzero residual may miss this bound through the rounding of
    the computed residual alone; the direct QR then answers them.
    """
    norms = damped_norms(A, r0, dx, damp)
    if not (np.isfinite(norms.r2norm) and np.isfinite(norms.arnorm)):
        return np.inf
    scale = norms.anorm * np.linalg.norm(dx) + np.linalg.norm(r0)
    if scale == 0 or norms.r2norm == 0:
        return 0.0
    consistent = norms.r2norm / scale
    least_squares = (norms.arnorm / (norms.anorm * norms.r2norm) if norms.anorm > 0
                     else 0.0)
    return float(min(consistent, least_squares) / _EPS)


def accept(A, r0: np.ndarray, dx: np.ndarray, damp: float) -> bool:
    """Whether ``dx`` solves ``min ‖r0 − A dx‖² + damp²‖dx‖²`` to working precision."""
    return backward_error(A, r0, dx, damp) <= ACCEPT_FACTOR


def _lsqr(lsqr, A, r0, damp, iter_lim, x0=None):
    with np.errstate(all="ignore"):
        out = lsqr(A, r0, damp=damp, atol=_EPS, btol=_EPS, conlim=1.0 / _EPS,
                   iter_lim=iter_lim, x0=x0)
    return out[0], int(out[1]), int(out[2]), float(out[6])


@dataclass
class LsqrProgress:
    """Where an interrupted :func:`try_lsqr` stands (it can be resumed from here)."""

    dx: Optional[np.ndarray] = None
    itn: int = 0
    seconds: float = 0.0
    acond: float = 0.0
    etas: list = field(default_factory=list)
    done: bool = False          # no point going on (stopped, or hopeless)

    def seconds_per_iteration(self, A) -> float:
        """Measured, or before any iteration a nominal two-matvec estimate."""
        if self.itn > 0 and self.seconds > 0:
            return self.seconds / self.itn
        m, n = A.shape
        return NOMINAL_ITERATION_S + (4.0 * A.nnz + 12.0 * (m + n)) / NOMINAL_MATVEC_RATE


def try_lsqr(A, r0: np.ndarray, damp: float, *, lsqr, seconds: Optional[float] = None,
             progress: Optional[LsqrProgress] = None
             ) -> tuple[Optional[IterativeAnswer], str, LsqrProgress]:
    """Run SciPy's LSQR within an allowance; return the answer if accepted, and why.

    Without damping the allowance is spent in pieces: two of at most
    :data:`FIRST_CHUNK` iterations, then, only if the backward error's decrease
    over the second piece projects convergence within the allowance, the
    rest (each piece restarts from the last iterate, which keeps it in
    range(Aᵀ): the answer is still the minimum-norm one). Hopeless problems
    thus cost two pieces, not the whole allowance. With damping (where a
    restart would change the problem) one run uses the whole allowance.

    Parameters
    ----------
    A : sparse matrix, shape (m, n), float64
    r0 : ndarray, shape (m,)
        Right-hand side of the correction problem (``b − A x0``).
    damp : float
    lsqr : callable
        SciPy's original ``lsqr``.
    seconds : float, optional
        Time allowance, converted to iterations with the measured time per
        iteration (default: the flop budget :func:`iteration_budget`).
    progress : LsqrProgress, optional
        Resume an earlier call (its iterations and time count against the
        allowance).

    Returns
    -------
    answer : IterativeAnswer or None
        None when LSQR did not reach working precision within the allowance.
    reason : str
        What happened, for the log.
    progress : LsqrProgress
        The state to resume from.
    """
    st = progress if progress is not None else LsqrProgress()
    cap = iteration_budget(A)

    def allowed() -> int:
        """Total iterations the allowance buys (at least what has run)."""
        if seconds is None:
            return cap
        more = (seconds - st.seconds) / st.seconds_per_iteration(A)
        return int(min(cap, st.itn + max(more, 0.0)))

    if st.done:
        return None, "LSQR stopped before", st
    if st.itn == 0 and seconds is not None and allowed() < MIN_USEFUL_ITERATIONS:
        return None, (f"the allowance ({seconds:.2g} s) buys fewer than "
                      f"{MIN_USEFUL_ITERATIONS} LSQR iterations"), st
    while True:
        budget = allowed()
        left = budget - st.itn
        if left <= 0 or (damp != 0 and st.itn > 0):
            break
        piece = left if damp != 0 else min(left, FIRST_CHUNK) if len(st.etas) < 2 else left
        t0 = time.perf_counter()
        dx, istop, steps, st.acond = _lsqr(lsqr, A, r0, damp, piece, x0=st.dx)
        st.seconds += time.perf_counter() - t0
        st.dx, st.itn = dx, st.itn + steps
        if istop in (3, 6) or not np.all(np.isfinite(dx)):
            st.done = True
            return None, f"LSQR stopped with istop {istop} after {st.itn} iterations", st
        st.etas.append(backward_error(A, r0, dx, damp))
        if st.etas[-1] <= ACCEPT_FACTOR:
            return IterativeAnswer(dx, st.itn, st.acond), (
                f"LSQR reached working precision in {st.itn} iterations "
                f"({st.seconds:.3g} s)"), st
        if istop != 7:  # LSQR's own estimate says converged; the true error disagrees
            st.done = True
            break
        if len(st.etas) == 2:
            # linear convergence model from the second piece (the tail rate)
            e0, e1 = st.etas
            rate = np.log(e1 / e0) / steps if 0 < e1 < e0 else 0.0
            needed = np.log(ACCEPT_FACTOR / e1) / rate if rate < 0 else np.inf
            if st.itn + needed > PROJECTION_SLACK * max(allowed(), 1):
                st.done = True
                return None, (f"LSQR too slow: backward error {e1:.1e} eps after {st.itn} "
                               f"iterations projects {st.itn + needed:.0f} iterations, over "
                               f"{PROJECTION_SLACK:g} x the allowance"), st
    if not st.etas:
        return None, "no LSQR iteration fits the allowance", st
    return None, (f"LSQR's answer after {st.itn} iterations ({st.seconds:.3g} s) is not at "
                  f"working precision (backward error {st.etas[-1]:.1e} eps)"), st


def iterate_first(A, r0: np.ndarray, damp: float, settings: Settings, plan: Callable, *,
                  lsqr: Callable) -> tuple[Optional[IterativeAnswer], Optional[tuple]]:
    """LSQR within a share of the factorization's predicted time, under backend 'auto'.

    Parameters
    ----------
    A : sparse matrix, shape (m, n)
    r0 : ndarray, shape (m,)
        Right-hand side of the correction problem (``b − A x0``).
    damp : float
    settings : Settings
        The call's resolved settings: only ``'auto'`` with ``iterate_first``
        on iterates.
    plan : callable
        ``plan() -> (M, Plan)``: the factorization's plan, made at most once
        and only when needed (it sizes LSQR's allowance).
    lsqr : callable
        SciPy's original ``lsqr``.

    Returns
    -------
    answer : IterativeAnswer or None
        LSQR's accepted answer, or None: the factorization answers.
    planned : (M, Plan) or None
        The plan when it was made, for the factorization to reuse.
    """
    if settings.backend != "auto" or not settings.options.iterate_first:
        return None, None
    A64 = A if A.dtype == np.float64 else A.astype(np.float64)
    m, n = A.shape
    progress, planned, found, why = None, None, None, ""
    if A.nnz > ANALYSIS_FIRST_NNZ and damp == 0:
        # a first piece before the analysis: well-conditioned large problems end here
        first = PRE_ANALYSIS_ITERATIONS * LsqrProgress().seconds_per_iteration(A64)
        found, why, progress = try_lsqr(A64, r0, damp, lsqr=lsqr, seconds=first)
    if found is None and not (progress is not None and progress.done):
        planned = plan()
        chosen = planned[1]
        flops = float(getattr(chosen.analysis, "flops", float("nan")))
        allowance = ITERATION_SHARE * predicted_seconds(chosen.backend, flops, chosen.gpu_name)
        found, why, progress = try_lsqr(A64, r0, damp, lsqr=lsqr, seconds=allowance,
                                        progress=progress)
        why += f"; allowance {allowance:.3g} s = {ITERATION_SHARE:g} x predicted {chosen.backend}"
    log_decision("least squares %dx%d nnz=%d: backend 'auto' from %s; %s; %s", m, n,
                 A.nnz, settings.source, why, "answered without factorizing" if found
                 else "factorizing")
    return found, planned
