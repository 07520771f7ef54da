"""LSMR over NumPy or CuPy arrays: SciPy's recurrences and stopping tests, vectors on the device.

The algorithm is Fong and Saunders' LSMR (SIAM J. Sci. Comput. 33, 2011) as
SciPy's ``scipy.sparse.linalg.lsmr`` states it: the Golub-Kahan
bidiagonalization shared with LSQR, then the rotations that make ‖Aᵀr‖
decrease monotonically, the same estimates of ‖r‖, ‖A‖ and cond(A), ‖x‖
computed from x itself, and the same stopping tests in the same order, so
``istop``, ``itn`` and the norms mean what they mean in SciPy. On NumPy the
iterates are bit-identical to SciPy's for the same matrix-vector products.
How the device work and the host recurrences are interleaved (one
device→host copy per iteration) is described in
:mod:`scipy_gpuqr._iterative._common`.
"""

from __future__ import annotations

from math import sqrt
from typing import Callable, Optional

import numpy as np

from ._common import (SLOT_DEFERRED, GolubKahan, IterationState, begin, givens,
                      print_summary, result_class, stopping_code)
from .host import host_problem, lsmr_host

__all__ = ["lsmr", "LSMRResult", "SUMMARY_NORMS", "lsmr_result"]

LSMRResult = result_class(
    "LSMRResult", "x istop itn normr normar norma conda normx",
    """The result of :func:`lsmr`: SciPy's 8-tuple, with the run attributes of
    :class:`~scipy_gpuqr._iterative._common.RunInfo`.

    Unpacks, indexes and compares as SciPy's tuple
    ``(x, istop, itn, normr, normar, norma, conda, normx)``; the fields are
    also attributes (``res.x``, ``res.istop``); ``res.scipy_tuple()`` is the
    plain tuple. ``x`` is an array of the solver's array module, the rest
    Python numbers.
    """, __name__)

#: The norms of SciPy's closing summary, in the tuple's order (fields 3 to 7).
SUMMARY_NORMS = ("normr", "normar", "normA", "condA", "normx")


def lsmr_result(m: int, n: int, fields: tuple, info: dict, show: bool) -> LSMRResult:
    """SciPy's tuple ``fields`` of an m×n run as an :class:`LSMRResult` carrying
    ``info``, SciPy's closing summary printed first where ``show``."""
    if show:
        print_summary("LSMR", m, n, fields[1], fields[2], list(zip(SUMMARY_NORMS, fields[3:8])))
    return LSMRResult.build(fields, info)


class _LSMRState:
    """The host recurrences of one LSMR run and its device vectors x, h, hbar."""

    def __init__(self, gk: GolubKahan, x, *, damp, atol, btol, conlim, iter_lim,
                 normb, beta, alpha):
        xp = gk.xp
        self.gk, self.xp, self.x = gk, xp, x
        self.h = gk.v.copy()
        self.hbar = xp.zeros_like(x)
        self.damp = damp
        self.atol, self.btol, self.iter_lim = atol, btol, iter_lim
        self.ctol = 1 / conlim if conlim > 0 else 0
        self.normb = normb
        # the rotations that turn B_k into R_k and R_kᵀ into Rbar_k
        self.alpha = alpha
        self.zetabar = alpha * beta
        self.alphabar = alpha
        self.rho = self.rhobar = self.cbar = 1
        self.sbar = 0
        self.zeta = 0
        # the estimate of ‖r‖
        self.betadd = beta
        self.betad = 0
        self.rhodold = 1
        self.tautildeold = 0
        self.thetatilde = 0
        self.d = 0
        # the estimates of ‖A‖ and cond(A)
        self.normA2 = alpha * alpha
        self.maxrbar = 0
        self.minrbar = 1e+100
        self.normA = sqrt(self.normA2)
        self.condA = 1
        self.normx = 0
        self.normr = beta
        self.normar = alpha * beta
        self.istop = 0
        self.tests = (1.0, np.inf, 0.0)

    def launch(self):
        return self.gk.launch(self.alpha)

    def step(self, values, itn):
        """Rotations of iteration ``itn`` on the host, h, hbar and x updated on the device."""
        beta_sq, alpha_sq = values
        beta = np.sqrt(beta_sq)
        self.alpha = alpha = self.gk.adopt(beta, alpha_sq, self.alpha)

        # Qhat eliminates damp; Q turns B into R
        chat, shat, alphahat = givens(self.alphabar, self.damp)
        rhoold = self.rho
        c, s, rho = givens(alphahat, beta)
        self.rho = rho
        thetanew = s * alpha
        self.alphabar = c * alpha
        # Qbar turns Rᵀ into Rbar
        rhobarold = self.rhobar
        zetaold = self.zeta
        thetabar = self.sbar * rho
        rhotemp = self.cbar * rho
        self.cbar, self.sbar, rhobar = givens(self.cbar * rho, thetanew)
        self.rhobar = rhobar
        self.zeta = zeta = self.cbar * self.zetabar
        self.zetabar = -self.sbar * self.zetabar

        # hbar = h - (thetabar rho / (rhoold rhobarold)) hbar ; x += (zeta / (rho rhobar)) hbar ;
        # h = v - (thetanew / rho) h
        self.gk.ops.lsmr_update(self.x, self.h, self.hbar, self.gk.v,
                                -(thetabar * rho / (rhoold * rhobarold)), zeta / (rho * rhobar),
                                -(thetanew / rho), SLOT_DEFERRED)

        # ‖r‖: apply Qhat, Q, and Qtilde of the previous step
        betaacute = chat * self.betadd
        betacheck = -shat * self.betadd
        betahat = c * betaacute
        self.betadd = -s * betaacute
        thetatildeold = self.thetatilde
        ctildeold, stildeold, rhotildeold = givens(self.rhodold, thetabar)
        self.thetatilde = stildeold * rhobar
        self.rhodold = ctildeold * rhobar
        self.betad = -stildeold * self.betad + ctildeold * betahat
        self.tautildeold = (zetaold - thetatildeold * self.tautildeold) / rhotildeold
        taud = (zeta - self.thetatilde * self.tautildeold) / self.rhodold
        self.d = self.d + betacheck * betacheck
        self.normr = sqrt(self.d + (self.betad - taud) ** 2 + self.betadd * self.betadd)

        # ‖A‖ (Frobenius of B_k and damp) and cond(A) from the diagonal of Rbar
        self.normA2 = self.normA2 + beta * beta
        self.normA = sqrt(self.normA2)
        self.normA2 = self.normA2 + alpha * alpha
        self.maxrbar = max(self.maxrbar, rhobarold)
        if itn > 1:
            self.minrbar = min(self.minrbar, rhobarold)
        self.condA = max(self.maxrbar, rhotemp) / min(self.minrbar, rhotemp)
        self.normar = abs(self.zetabar)
        return SLOT_DEFERRED

    def judge(self, xx, itn):
        """Iteration ``itn``'s tests and SciPy's ``istop``, given ``‖x‖²``."""
        self.normx = normx = np.sqrt(xx)
        normA, normr, normb = self.normA, self.normr, self.normb
        test1 = normr / normb
        test2 = self.normar / (normA * normr) if (normA * normr) != 0 else np.inf
        test3 = 1 / self.condA
        t1 = test1 / (1 + normA * normx / normb)
        rtol = self.btol + self.atol * normA * normx / normb
        self.tests = (test1, test2, rtol)
        self.istop = stopping_code(itn, self.iter_lim, test1, test2, test3, t1, rtol,
                                   self.atol, self.ctol)
        return self.istop

    def state(self, itn, seconds):
        test1, test2, rtol = self.tests
        return IterationState(itn=itn, x=self.x, istop=self.istop, normr=float(self.normr),
                              normar=float(self.normar), norma=float(self.normA),
                              conda=float(self.condA), normx=float(self.normx),
                              test1=float(test1), test2=float(test2), rtol=float(rtol),
                              seconds=seconds)


def lsmr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, maxiter=None, show=False,
         x0=None, *, xp=None, max_seconds: Optional[float] = None,
         callback: Optional[Callable] = None):
    """LSMR for ``min ‖A x − b‖² + damp²‖x‖²`` with SciPy's recurrences, on NumPy or CuPy.

    SciPy's parameters come first, in SciPy's order and with its defaults
    (so a positional call means the same); what is added is keyword-only.

    Parameters
    ----------
    A : matrix or operator, shape (m, n)
        Anything with ``A @ v`` and ``A.T @ u`` in the array module (see
        :func:`~scipy_gpuqr._iterative.lsqr.lsqr`). Real only.
    b : array, shape (m,) or (m, 1)
    damp, atol, btol, conlim : float
        As in SciPy (0 disables a test; the machine-precision forms remain).
    maxiter : int, optional
        Iteration limit, ``min(m, n)`` by default (SciPy's).
    show : bool
        Print SciPy's closing summary (not its per-iteration lines).
    x0 : array, shape (n,), optional
        Starting point; LSMR iterates on the correction from ``b − A x0``.
    xp : module, optional
        ``numpy`` or ``cupy``; by default the module of ``b``.
    max_seconds : float, optional
        A wall-clock allowance, checked after each iteration; when spent
        before a stopping test fires the run returns with ``istop = 0`` and
        ``allowance_spent`` set.
    callback : callable, optional
        ``callback(state)`` after each iteration with an
        :class:`~scipy_gpuqr._iterative._common.IterationState`; a true
        return stops the run (``istop = 0``, ``stopped_by_callback`` set)
        unless a stopping test fired in that iteration.

    Returns
    -------
    LSMRResult
        SciPy's tuple ``(x, istop, itn, normr, normar, norma, conda,
        normx)`` with SciPy's meanings and ``istop`` codes 0-7 (see
        :func:`~scipy_gpuqr._iterative.lsqr.lsqr`). Extra attributes:
        ``allowance_spent``, ``stopped_by_callback``,
        ``projected_iterations``, ``seconds``, ``host_syncs``
        (:class:`~scipy_gpuqr._iterative._common.RunInfo`).

    Notes
    -----
    Per iteration: one product with A, one with Aᵀ, two new vectors (their
    results; h, hbar and x are updated in place), and ONE device→host copy
    of a 4-slot buffer of float64 sums of squares: beta² and alpha² of this
    iteration and ‖x‖² of the previous one, whose stopping test is judged
    then. Plus one copy at the start and one that carries the last
    iteration's test: ``itn + 2`` copies in all.

    Differences from SciPy: float64 throughout (float32 or integer input is
    promoted); complex input is refused; ``x`` is a new array, never x0.
    """
    return _lsmr(A, b, damp, atol, btol, conlim, maxiter, show, x0, xp=xp,
                 max_seconds=max_seconds, callback=callback)


def _lsmr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, maxiter=None, show=False,
          x0=None, *, xp=None, max_seconds=None, callback=None,
          pipelined: Optional[bool] = None):
    """:func:`lsmr`, with the driver open.

    ``pipelined`` None (the default): on NumPy with a SciPy CSR/CSC float64
    A, :func:`~scipy_gpuqr._iterative.host.lsmr_host` (SciPy's statements
    with less Python around them); otherwise :func:`~scipy_gpuqr._iterative._common.drive`,
    pipelined on CuPy and not on NumPy. True or False: ``drive``, pipelined
    or not (the tests compare the two).
    """
    host = None if pipelined is not None else host_problem(A, b, x0, xp)
    if host is not None:
        fields, info = lsmr_host(host, damp, atol, btol, conlim, maxiter,
                                 max_seconds=max_seconds, callback=callback)
        return lsmr_result(host.m, host.n, fields, info, show)
    start = begin(A, b, x0, xp, atol=atol, max_seconds=max_seconds)
    problem, gk, x = start.problem, start.gk, start.x
    m, n = problem.m, problem.n
    maxiter = min(m, n) if maxiter is None else int(maxiter)
    if not start.beta > 0:
        gk.v = problem.xp.zeros(n)
    state = _LSMRState(gk, x, damp=float(damp), atol=atol, btol=btol, conlim=conlim,
                       iter_lim=maxiter, normb=start.normb, beta=start.beta, alpha=start.alpha)

    if state.normar == 0 or start.normb == 0:
        # b - A x0 = 0 or Aᵀ(b - A x0) = 0: x0 (or 0) is the answer; b = 0: x = 0 (SciPy's rule)
        if not state.normar == 0:
            x[...] = 0
        run, exact = {}, True
    else:
        run = start.iterate(state, maxiter, pipelined=pipelined, callback=callback)
        exact = False
    istop, itn = run.get("istop", 0), run.get("itn", 0)
    fields = (state.x, istop, itn, float(state.normr), float(state.normar),
              float(state.normA), float(state.condA), float(state.normx))
    if show:
        print_summary("LSMR", m, n, istop, itn,
                      [("normr", state.normr), ("normar", state.normar),
                       ("normA", state.normA), ("condA", state.condA),
                       ("normx", state.normx)])
    return LSMRResult.build(fields, start.run_info(run, istop, itn, exact))
