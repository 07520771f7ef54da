"""Iterate first, factorize only when iterating would cost more (lsqr/lsmr, backend 'auto').

A patched ``lsqr`` must never make a user's call many times slower. Many
least-squares problems are well conditioned, and SciPy's LSQR reaches a
backward error at working precision in a few hundred cheap iterations,
while a sparse QR of the same matrix costs seconds (measured here on the
8192×4096 3-D grid problem: LSQR to ‖Aᵀr‖/(‖A‖‖r‖) = 3e-15 in 361
iterations, 0.12 s; SuiteSparseQR 1.6 s; on ch5-6-b3: 12 iterations).

So under ``backend='auto'`` the least-squares entry points first run
SciPy's LSQR with machine-precision tolerances on a fixed budget of
matrix-vector work (:data:`ITERATION_FLOPS`, at most :data:`MAX_ITERATIONS`
iterations), and accept its answer only when the *true* backward error of
the final x is at working precision (:func:`accept`, :func:`backward_error`):
‖Āᵀr̄‖ ≤ 16·eps·‖Ā‖_F·‖r̄‖ for the (damped) least-squares problem, or
‖r̄‖ ≤ 16·eps·(‖Ā‖_F‖x‖ + ‖b‖) for a consistent one. Otherwise the direct
QR answers; a problem whose first 2·:data:`FIRST_CHUNK` iterations project
no convergence within the budget stops there.

The answer is still the minimum 2-norm least-squares solution: LSQR's
iterates from the starting point stay in range(Aᵀ), so the correction it
converges to is the minimum-norm one; directions of singular values below
the working precision stay unresolved (near zero), as numpy.linalg.lstsq's
rank rule zeroes them. ``backend='cpu'``/``'gpu'``/... (keyword, options
or environment) and ``GpuqrOptions(iterate_first=False)`` always factorize;
``calc_var=True`` always factorizes (the variances are exact through R).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from ._originals import original

__all__ = ["ITERATION_FLOPS", "MIN_ITERATIONS", "MAX_ITERATIONS", "FIRST_CHUNK",
           "iteration_budget", "IterativeAnswer", "DampedNorms", "damped_norms",
           "backward_error", "try_lsqr", "accept"]

_EPS = float(np.finfo(np.float64).eps)

#: Flops of matrix-vector work LSQR may spend before the factorization starts.
ITERATION_FLOPS = 2e9
#: Bounds on the iteration budget.
MIN_ITERATIONS, MAX_ITERATIONS = 20, 1000
#: Backward errors up to this many eps are accepted (see :func:`backward_error`).
ACCEPT_FACTOR = 16.0
#: Iterations of each of the first two pieces, after which hopeless problems stop.
FIRST_CHUNK = 50
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
    normalized by less than ‖r̄‖ would accept it (seen: watt_2, cond 1e11,
    after 50 iterations). Least-squares problems with a small but nonzero
    residual may miss this bound through the rounding of the computed
    residual alone; the direct QR then answers them.
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


def _lsqr(A, r0, damp, iter_lim, x0=None):
    with np.errstate(all="ignore"):
        out = original("lsqr")(A, r0, damp=damp, atol=_EPS, btol=_EPS,
                               conlim=1.0 / _EPS, iter_lim=iter_lim, x0=x0)
    return out[0], int(out[1]), int(out[2]), float(out[6])


def try_lsqr(A, r0: np.ndarray, damp: float) -> tuple[Optional[IterativeAnswer], str]:
    """Run SciPy's LSQR on the budget; return the answer if accepted, and why.

    Without damping the budget is spent in three pieces: two of
    :data:`FIRST_CHUNK` iterations, then, only if the backward error's
    decrease over the second piece projects convergence within the budget,
    the rest (each piece restarts from the last iterate, which keeps it in
    range(Aᵀ): the answer is still the minimum-norm one). Hopeless problems
    thus cost two pieces, not the whole budget. With damping (where a restart
    would change the problem) one run uses the whole budget.

    Parameters
    ----------
    A : sparse matrix, shape (m, n), float64
    r0 : ndarray, shape (m,)
        Right-hand side of the correction problem (``b − A x0``).
    damp : float

    Returns
    -------
    answer : IterativeAnswer or None
        None when LSQR did not reach working precision within the budget.
    reason : str
        What happened, for the log.
    """
    budget = iteration_budget(A)
    pieces = ([budget] if damp != 0 or budget <= 2 * FIRST_CHUNK
              else [FIRST_CHUNK, FIRST_CHUNK, budget - 2 * FIRST_CHUNK])
    dx, itn, acond, etas = None, 0, 0.0, []
    for k, piece in enumerate(pieces):
        dx, istop, steps, acond = _lsqr(A, r0, damp, piece, x0=dx)
        itn += steps
        if istop in (3, 6) or not np.all(np.isfinite(dx)):
            return None, f"LSQR stopped with istop {istop} after {itn} iterations"
        etas.append(backward_error(A, r0, dx, damp))
        if etas[-1] <= ACCEPT_FACTOR:
            return IterativeAnswer(dx, itn, acond), (
                f"LSQR reached working precision in {itn} iterations (budget {budget})")
        if istop != 7:  # LSQR's own estimate says converged; the true error disagrees
            break
        if k == 1:
            # linear convergence model from the second piece (the tail rate)
            rate = np.log(etas[1] / etas[0]) / steps if 0 < etas[1] < etas[0] else 0.0
            needed = np.log(ACCEPT_FACTOR / etas[1]) / rate if rate < 0 else np.inf
            if itn + needed > PROJECTION_SLACK * budget:
                return None, (f"LSQR too slow: backward error {etas[1]:.1e} eps after {itn} "
                              f"iterations projects {itn + needed:.0f} iterations, over "
                              f"{PROJECTION_SLACK:g} x the budget {budget}")
    return None, (f"LSQR's answer after {itn} iterations is not at working precision "
                  f"(backward error {etas[-1]:.1e} eps)")
