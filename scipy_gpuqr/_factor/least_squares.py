"""The answer behind ``lsqr`` and ``lsmr``: the minimum-norm (damped) least-squares solution.

``min ‖[A; damp·I] x − [b; 0]‖`` from a starting point x0 is solved for the
correction ``dx = x − x0``: under backend ``'auto'`` by SciPy's LSQR when it
reaches working precision within its allowance
(:func:`scipy_gpuqr._dispatch.iterate_first.iterate_first`), otherwise by a
direct sparse QR of A (or of ``[A; damp·I]``) and the solve rules of
:mod:`scipy_gpuqr._factor.lstsq`. The norms SciPy's functions report are
computed from the final correction; the entry points
(:mod:`scipy_gpuqr._api.lsqr`) turn them into SciPy's tuples.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from .._dispatch.iterate_first import damped_norms, iterate_first
from .._options import Settings
from .._validate import MatrixInput
from .factored import FactoredQR, factorize, plan_for
from .lstsq import MinNormSolver

__all__ = ["LstsqStart", "LstsqAnswer", "start", "trivial_answer", "solve_least_squares",
           "acond_estimate", "variance", "VARIANCE_DENSE_LIMIT"]

_EPS = float(np.finfo(np.float64).eps)

#: Largest m·n of a wide problem whose variances come from a dense pseudo-inverse.
VARIANCE_DENSE_LIMIT = 4_000_000


class LstsqStart(NamedTuple):
    """The correction problem ``min ‖r0 − A dx‖`` at the starting point."""

    r0: np.ndarray      # b − A x0 (b without x0)
    bnorm: float        # ‖b‖
    beta: float         # ‖r0‖
    alfa: float         # ‖Aᵀ r0‖ (0 when r0 = 0)

    @property
    def trivial(self) -> bool:
        """x0 (or 0) is the answer: r0 = 0 or Aᵀ r0 = 0."""
        return self.alfa * self.beta == 0


def start(A, b: np.ndarray, x0: Optional[np.ndarray]) -> LstsqStart:
    """The correction problem of ``A x ≈ b`` from ``x0`` (None: from 0)."""
    bnorm = float(np.linalg.norm(b))
    r0 = b if x0 is None else b - A @ x0
    beta = float(np.linalg.norm(r0))
    alfa = float(np.linalg.norm(A.T @ r0)) if beta > 0 else 0.0
    return LstsqStart(r0, bnorm, beta, alfa)


class LstsqAnswer(NamedTuple):
    """A least-squares answer and the norms SciPy reports with it."""

    x: np.ndarray
    dx: np.ndarray
    r1norm: float
    r2norm: float
    anorm: float
    acond: float
    arnorm: float
    bnorm: float
    var: Optional[np.ndarray]
    factorization: Optional[FactoredQR]     # None when LSQR answered
    itn: int = 0                            # LSQR's iterations when it answered


def trivial_answer(begin: LstsqStart, x0: Optional[np.ndarray], n: int) -> LstsqAnswer:
    """The answer of a ``trivial`` problem: x0 (or 0), as SciPy's lsqr gives it."""
    x = np.zeros(n) if x0 is None else x0.copy()
    return LstsqAnswer(x, np.zeros(n), begin.beta, begin.beta, 0.0, 0.0, 0.0, begin.bnorm,
                       np.zeros(n), None)


def solve_least_squares(mi: MatrixInput, x0: Optional[np.ndarray], damp: float,
                        begin: LstsqStart, *, calc_var: bool, settings: Settings,
                        lsqr: Callable) -> LstsqAnswer:
    """The minimum-norm least-squares answer of a non-trivial problem.

    Parameters
    ----------
    mi : MatrixInput
        A, shape (m, n).
    x0 : ndarray of shape (n,) or None
        The starting point (checked).
    damp : float
        Finite damping (checked).
    begin : LstsqStart
        :func:`start` of the problem; not ``trivial``.
    calc_var : bool
        Compute ``diag(pinv(AᵀA + damp²I))`` (then the QR always answers).
    settings : Settings
        The call's resolved settings.
    lsqr : callable
        SciPy's original ``lsqr`` (for the iterate-first rule).
    """
    A = mi.A
    n = A.shape[1]
    r0 = begin.r0
    x_start = np.zeros(n) if x0 is None else x0.copy()
    if damp != 0:
        M = sp.vstack([A, damp * sp.eye_array(n, format="csc")], format="csc")
        rhs = np.concatenate([r0, np.zeros(n)])
        Mi = MatrixInput(A=sp.csc_array(M), dtype=mi.dtype, on_gpu=False,
                         was_sparse=True, fmt="csc", sparse_class=sp.csc_array)
    else:
        Mi, rhs = mi, r0
    planned = None
    if not calc_var:
        found, planned = iterate_first(A, r0, damp, settings,
                                       lambda: plan_for(Mi, settings), lsqr=lsqr)
        if found is not None:
            norms = damped_norms(A, r0, found.dx, damp)
            return LstsqAnswer(x_start + found.dx, found.dx, norms.r1norm, norms.r2norm,
                               norms.anorm, found.acond, norms.arnorm, begin.bnorm,
                               np.zeros(n), None, found.itn)
    F = factorize(Mi, settings, tol=None, planned=planned)
    dx = F.least_squares(rhs[:, None])[:, 0]
    norms = damped_norms(A, r0, dx, damp)
    acond = acond_estimate(F.rank_decision(), norms.anorm)
    var = variance(F, Mi.A) if calc_var else np.zeros(n)
    return LstsqAnswer(x_start + dx, dx, norms.r1norm, norms.r2norm, norms.anorm, acond,
                       norms.arnorm, begin.bnorm, var, F)


def acond_estimate(solver: MinNormSolver, anorm: float) -> float:
    """cond(Abar) estimate ``‖Abar‖_F / σ_min(kept)``, from the rank decision."""
    s = solver
    if s.method in ("empty", "zero") or s.rank == 0:
        return 0.0
    smin = s.sigma_min
    if not (smin > 0) and s.rcond == s.rcond and s.rcond > 0:
        R = sp.csc_array(s.R)
        norm1 = float(abs(R).sum(axis=0).max())
        smin = s.rcond * norm1  # 1/‖R⁻¹‖₁, within a factor sqrt(q) of σ_min
    if not (smin > 0):
        smin = s.cutoff * s.sigma_max
    return anorm / smin if smin > 0 else np.inf


def variance(F: FactoredQR, M: sp.csc_array) -> np.ndarray:
    """``diag(pinv(MᵀM))`` in A's column order (M = A or [A; damp·I]).

    Exact through R for tall M (NaN where the rank decision cannot afford
    it); a dense pseudo-inverse for wide M up to :data:`VARIANCE_DENSE_LIMIT`
    entries, NaN beyond.
    """
    n = M.shape[1]
    if not F.transposed:
        v = F.rank_decision().inverse_gram_diagonal()
        out = np.empty(n)
        out[F.perm] = v
        return out
    if M.shape[0] * M.shape[1] <= VARIANCE_DENSE_LIMIT:
        P = np.linalg.pinv(M.toarray(), rcond=_EPS * max(M.shape))
        return (P ** 2).sum(axis=1)
    return np.full(n, np.nan)
