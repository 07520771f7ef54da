"""LSQR over NumPy or CuPy arrays: SciPy's recurrences and stopping tests, vectors on the device.

The algorithm is Paige and Saunders' LSQR (ACM TOMS 8, 1982) as SciPy's
``scipy.sparse.linalg.lsqr`` states it: the same Golub-Kahan
bidiagonalization, the same plane rotations (with the damping rotation
when ``damp > 0``), the same estimates of ‖r‖, ‖Aᵀr‖, ‖A‖, cond(A) and ‖x‖
and the same stopping tests in the same order, so ``istop``, ``itn`` and the
norms mean what they mean in SciPy. On NumPy the iterates are bit-identical
to SciPy's for the same matrix-vector products. How the device work and the
host recurrences are interleaved (one device→host copy per iteration) is
described in :mod:`scipy_gpuqr._iterative._common`.
"""

from __future__ import annotations

import contextlib
import functools
from math import sqrt
from typing import Callable, Optional

import numpy as np

from ._common import (EPS, SLOT_DEFERRED, GolubKahan, IterationState, begin, givens,
                      print_summary, result_class, stopping_code)
from .host import host_problem, lsqr_host

__all__ = ["lsqr", "LSQRResult", "SUMMARY_NORMS", "lsqr_result"]

LSQRResult = result_class(
    "LSQRResult", "x istop itn r1norm r2norm anorm acond arnorm xnorm var",
    """The result of :func:`lsqr`: SciPy's 10-tuple, with the run attributes of
    :class:`~scipy_gpuqr._iterative._common.RunInfo`.

    Unpacks, indexes and compares as SciPy's tuple
    ``(x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var)``;
    the fields are also attributes (``res.x``, ``res.istop``);
    ``res.scipy_tuple()`` is the plain tuple. ``x`` and ``var`` are arrays of
    the solver's array module, the rest Python numbers.
    """, __name__)

#: The norms of SciPy's closing summary, in the tuple's order (fields 3 to 8).
SUMMARY_NORMS = ("r1norm", "r2norm", "anorm", "acond", "arnorm", "xnorm")


def lsqr_result(m: int, n: int, fields: tuple, info: dict, show: bool) -> LSQRResult:
    """SciPy's tuple ``fields`` of an m×n run as an :class:`LSQRResult` carrying
    ``info``, SciPy's closing summary printed first where ``show``."""
    if show:
        print_summary("LSQR", m, n, fields[1], fields[2], list(zip(SUMMARY_NORMS, fields[3:9])))
    return LSQRResult.build(fields, info)


class _LSQRState:
    """The host recurrences of one LSQR run and its device vectors x and w."""

    def __init__(self, gk: GolubKahan, x, *, damp, atol, btol, conlim, iter_lim, calc_var,
                 bnorm, beta, alfa):
        xp = gk.xp
        self.gk, self.xp, self.x = gk, xp, x
        self.w = gk.v.copy()
        self.var = xp.zeros_like(x)
        self.calc_var = calc_var
        self.damp, self.dampsq = damp, damp ** 2
        self.atol, self.btol, self.iter_lim = atol, btol, iter_lim
        self.ctol = 1 / conlim if conlim > 0 else 0
        self.bnorm = bnorm
        # ‖b‖ = 0 with x0 given: the tests divide by 0 (inf and nan, as in SciPy)
        self.quiet = functools.partial(np.errstate, divide="ignore", invalid="ignore") \
            if bnorm == 0 else contextlib.nullcontext
        # host recurrences, named as in Paige & Saunders
        self.alfa = alfa
        self.anorm = 0
        self.acond = 0
        self.ddnorm = 0
        self.res2 = 0
        self.xnorm = 0
        self.xxnorm = 0
        self.z = 0
        self.cs2, self.sn2 = -1, 0
        self.rhobar, self.phibar = alfa, beta
        self.psi = self.tau = 0
        self.r1norm = self.r2norm = beta
        self.arnorm = alfa * beta
        self.istop = 0
        self.tests = (1.0, np.inf, 0.0)
        self.dd_factor = 1.0

    def launch(self):
        return self.gk.launch(self.alfa)

    def step(self, values, itn):
        """Rotations of iteration ``itn`` on the host, x and w updated on the device."""
        beta_sq, alfa_sq = values
        beta = np.sqrt(beta_sq)
        if beta > 0:
            self.anorm = sqrt(self.anorm ** 2 + self.alfa ** 2 + beta ** 2 + self.dampsq)
        self.alfa = alfa = self.gk.adopt(beta, alfa_sq, self.alfa)

        # the damping rotation turns rhobar into rhobar1 (cs1 = 1, sn1 = 0 undamped)
        if self.damp > 0:
            rhobar1 = sqrt(self.rhobar ** 2 + self.dampsq)
            cs1 = self.rhobar / rhobar1
            sn1 = self.damp / rhobar1
            self.psi = sn1 * self.phibar
            self.phibar = cs1 * self.phibar
        else:
            rhobar1 = self.rhobar
            self.psi = 0.
        # the rotation that eliminates beta: lower bidiagonal -> upper bidiagonal
        cs, sn, rho = givens(rhobar1, beta)
        theta = sn * alfa
        self.rhobar = -cs * alfa
        phi = cs * self.phibar
        self.phibar = sn * self.phibar
        self.tau = sn * phi

        # x += (phi/rho) w ;  w = v - (theta/rho) w ;  ‖w/rho‖² (for cond(A)) to its slot
        self.dd_factor = self.gk.ops.lsqr_update(
            self.x, self.w, self.gk.v, self.var if self.calc_var else None, rho, phi, theta,
            SLOT_DEFERRED)

        # the rotation on the right that eliminates theta gives the estimate of ‖x‖
        delta = self.sn2 * rho
        gambar = -self.cs2 * rho
        rhs = phi - delta * self.z
        zbar = rhs / gambar
        self.xnorm = sqrt(self.xxnorm + zbar ** 2)
        gamma = sqrt(gambar ** 2 + theta ** 2)
        self.cs2 = gambar / gamma
        self.sn2 = theta / gamma
        self.z = rhs / gamma
        self.xxnorm = self.xxnorm + self.z ** 2
        return SLOT_DEFERRED

    def judge(self, dd, itn):
        """Iteration ``itn``'s estimates and SciPy's ``istop``, given ``‖d‖²`` (over its factor)."""
        self.ddnorm = self.ddnorm + np.sqrt(dd * self.dd_factor) ** 2
        anorm, xnorm, bnorm = self.anorm, self.xnorm, self.bnorm
        self.acond = anorm * sqrt(self.ddnorm)
        res1 = self.phibar ** 2
        self.res2 = self.res2 + self.psi ** 2
        rnorm = sqrt(res1 + self.res2)
        self.arnorm = self.alfa * abs(self.tau)
        # r1norm = ‖b - Ax‖ from r2norm² = r1norm² + damp²‖x - x0‖²; it may cancel
        if self.damp > 0:
            r1sq = rnorm ** 2 - self.dampsq * self.xxnorm
            self.r1norm = sqrt(abs(r1sq))
            if r1sq < 0:
                self.r1norm = -self.r1norm
        else:
            self.r1norm = rnorm
        self.r2norm = rnorm
        with self.quiet():
            test1 = rnorm / bnorm
            test2 = self.arnorm / (anorm * rnorm + EPS)
            test3 = 1 / (self.acond + EPS)
            t1 = test1 / (1 + anorm * xnorm / bnorm)
            rtol = self.btol + self.atol * anorm * xnorm / bnorm
        self.tests = (test1, test2, rtol)
        self.istop = stopping_code(itn, self.iter_lim, test1, test2, test3, t1, rtol,
                                   self.atol, self.ctol)
        return self.istop

    def state(self, itn, seconds):
        test1, test2, rtol = self.tests
        return IterationState(itn=itn, x=self.x, istop=self.istop, normr=float(self.r2norm),
                              normar=float(self.arnorm), norma=float(self.anorm),
                              conda=float(self.acond), normx=float(self.xnorm),
                              test1=float(test1), test2=float(test2), rtol=float(rtol),
                              seconds=seconds)


def lsqr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, iter_lim=None, show=False,
         calc_var=False, x0=None, *, xp=None, max_seconds: Optional[float] = None,
         callback: Optional[Callable] = None):
    """LSQR for ``min ‖A x − b‖² + damp²‖x − x0‖²`` with SciPy's recurrences, on NumPy or CuPy.

    SciPy's parameters come first, in SciPy's order and with its defaults
    (so a positional call means the same); what is added is keyword-only.

    Parameters
    ----------
    A : matrix or operator, shape (m, n)
        Anything with ``A @ v`` and ``A.T @ u`` in the array module: a SciPy
        sparse matrix or array, a NumPy array or a SciPy LinearOperator under
        NumPy; a cupyx sparse matrix or a CuPy array under CuPy (a SciPy
        sparse matrix or NumPy array is copied to the device once). Real
        only.
    b : array, shape (m,) or (m, 1)
    damp, atol, btol, conlim : float
        As in SciPy: the damping, the tolerances of the compatible-system
        and least-squares tests, and the condition limit (0 disables each
        test; the machine-precision forms remain).
    iter_lim : int, optional
        Iteration limit, ``2 n`` by default (SciPy's).
    show : bool
        Print SciPy's closing summary (not its per-iteration lines).
    calc_var : bool
        Accumulate SciPy's estimate of ``diag((AᵀA + damp²I)⁻¹)`` in ``var``
        (zeros otherwise).
    x0 : array, shape (n,), optional
        Starting point; LSQR then solves for the correction ``x − x0``
        (``xnorm`` estimates its norm, as in SciPy).
    xp : module, optional
        ``numpy`` or ``cupy``; by default the module of ``b``.
    max_seconds : float, optional
        A wall-clock allowance. Checked after each iteration (so at least
        one runs); when spent before a stopping test fires, the run returns
        with ``istop = 0`` and ``allowance_spent`` set.
    callback : callable, optional
        ``callback(state)`` after each iteration with an
        :class:`~scipy_gpuqr._iterative._common.IterationState`; a true
        return stops the run (``istop = 0``, ``stopped_by_callback`` set)
        unless a stopping test fired in that iteration.

    Returns
    -------
    LSQRResult
        SciPy's tuple ``(x, istop, itn, r1norm, r2norm, anorm, acond,
        arnorm, xnorm, var)`` with the same meanings: ``istop`` 0 x = 0 (or
        x0) is exact, 1 ``test1 <= rtol``, 2 ``test2 <= atol``, 3 ``cond >=
        conlim``, 4-6 the same at machine precision, 7 ``itn`` reached
        ``iter_lim``. Extra attributes: ``allowance_spent``,
        ``stopped_by_callback``, ``projected_iterations``, ``seconds``,
        ``host_syncs`` (:class:`~scipy_gpuqr._iterative._common.RunInfo`).

    Notes
    -----
    Per iteration: one product with A, one with Aᵀ, two new vectors (their
    results; every other vector is updated in place), and ONE device→host
    copy, of a 4-slot buffer of float64 sums of squares: beta² and alpha²
    of this iteration and ‖d‖² of the previous one, whose stopping test is
    judged then (see :mod:`~scipy_gpuqr._iterative._common`). Plus one copy
    at the start (‖b‖², beta², alpha² together) and one that carries the
    last iteration's test: ``itn + 2`` copies in all. The returned x is the iterate of the
    last judged iteration; a run that a test stops has queued one extra,
    dropped, pair of products.

    Differences from SciPy: float64 throughout (float32 or integer input
    is promoted; SciPy keeps float32 vectors for float32 input); complex
    input is refused; ``x`` is a new array, never ``x0`` itself.
    """
    return _lsqr(A, b, damp, atol, btol, conlim, iter_lim, show, calc_var, x0, xp=xp,
                 max_seconds=max_seconds, callback=callback)


def _lsqr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, iter_lim=None, show=False,
          calc_var=False, x0=None, *, xp=None, max_seconds=None, callback=None,
          pipelined: Optional[bool] = None):
    """:func:`lsqr`, with the driver open.

    ``pipelined`` None (the default): on NumPy with a SciPy CSR/CSC float64
    A, :func:`~scipy_gpuqr._iterative.host.lsqr_host` (SciPy's statements
    with less Python around them); otherwise :func:`~scipy_gpuqr._iterative._common.drive`,
    pipelined on CuPy and not on NumPy. True or False: ``drive``, pipelined
    or not (the tests compare the two).
    """
    host = None if pipelined is not None else host_problem(A, b, x0, xp)
    if host is not None:
        fields, info = lsqr_host(host, damp, atol, btol, conlim, iter_lim, calc_var,
                                 max_seconds=max_seconds, callback=callback)
        return lsqr_result(host.m, host.n, fields, info, show)
    start = begin(A, b, x0, xp, atol=atol, max_seconds=max_seconds)
    problem, gk, x = start.problem, start.gk, start.x
    n = problem.n
    iter_lim = 2 * n if iter_lim is None else int(iter_lim)
    if not start.beta > 0:
        gk.v = x.copy()
    state = _LSQRState(gk, x, damp=float(damp), atol=atol, btol=btol, conlim=conlim,
                       iter_lim=iter_lim, calc_var=calc_var, bnorm=start.normb,
                       beta=start.beta, alfa=start.alpha)

    if state.arnorm == 0:               # b - A x0 = 0, or Aᵀ(b - A x0) = 0
        run, exact = {}, True
    else:
        run = start.iterate(state, iter_lim, pipelined=pipelined, callback=callback)
        exact = False
    istop, itn = run.get("istop", 0), run.get("itn", 0)
    fields = (state.x, istop, itn, float(state.r1norm), float(state.r2norm),
              float(state.anorm), float(state.acond), float(state.arnorm),
              float(state.xnorm), state.var)
    if show:
        print_summary("LSQR", problem.m, n, istop, itn,
                      [("r1norm", state.r1norm), ("r2norm", state.r2norm),
                       ("anorm", state.anorm), ("acond", state.acond),
                       ("arnorm", state.arnorm), ("xnorm", state.xnorm)])
    return LSQRResult.build(fields, start.run_info(run, istop, itn, exact))
