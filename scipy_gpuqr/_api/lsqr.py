"""``lsqr`` and ``lsmr`` with SciPy's signatures, and their SciPy tuples.

SciPy's parameters (names, order, defaults) are an exact prefix of ours;
what we add (``backend``, ``gpuqr_options``) is keyword-only. Each function
validates its inputs (:mod:`scipy_gpuqr._validate`), resolves its settings
once, gets the minimum-norm least-squares answer
(:mod:`scipy_gpuqr._factor.least_squares`) and shapes SciPy's tuple: the
stopping tests (``istop``) applied to the final x, and the ``show`` summary.
Inputs we do not serve go to SciPy's original function
(:mod:`scipy_gpuqr._api.fallback`).

CuPy in → CuPy out. b is checked on the host, so b and x cross once each way;
with a GPU factorization the solve itself runs on the device.
"""

from __future__ import annotations

import numpy as np

from .._factor.least_squares import solve_least_squares, start, trivial_answer
from .._options import resolve_settings
from .._validate import (LSTSQ_RHS, as_matrix, check_damp, check_rhs, check_x0, to_output,
                         unsupported_reason)
from .fallback import fallback
from .originals import original

__all__ = ["lsqr", "lsmr"]

_EPS = float(np.finfo(np.float64).eps)


def _istop(test1, test2, test3, t1, rtol, atol, ctol) -> int:
    """SciPy's stopping tests, in SciPy's order (the last true one wins)."""
    istop = 0
    if 1 + test3 <= 1:
        istop = 6
    if 1 + test2 <= 1:
        istop = 5
    if 1 + t1 <= 1:
        istop = 4
    if test3 <= ctol:
        istop = 3
    if test2 <= atol:
        istop = 2
    if test1 <= rtol:
        istop = 1
    return istop


def _tests(rnorm, arnorm, anorm, acond, xnorm, bnorm, atol, btol, *, lsmr: bool):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bnorm_ = bnorm if bnorm > 0 else np.inf
        test1 = rnorm / bnorm if bnorm > 0 else (0.0 if rnorm == 0 else np.inf)
        if lsmr:
            test2 = arnorm / (anorm * rnorm) if anorm * rnorm != 0 else np.inf
            test3 = 1 / acond if acond else np.inf
        else:
            test2 = arnorm / (anorm * rnorm + _EPS)
            test3 = 1 / (acond + _EPS)
        t1 = test1 / (1 + anorm * xnorm / bnorm_)
        rtol = btol + atol * anorm * xnorm / bnorm_
    return test1, test2, test3, t1, rtol


_MSG = ('The exact solution is x = 0, or x = x0                   ',
        'Ax - b is small enough, given atol, btol                  ',
        'The least-squares solution is good enough, given atol     ',
        'The estimate of cond(Abar) has exceeded conlim            ',
        'Ax - b is small enough for this machine                   ',
        'The least-squares solution is good enough for this machine',
        'Cond(Abar) seems to be too large for this machine         ',
        'The iteration limit has been reached                      ')


def _show(name, m, n, istop, ans, xnorm):
    F = ans.factorization
    how = (f"direct sparse QR on {F.info['backend']!r}" if F is not None
           else f"LSQR iterations under backend 'auto', {ans.itn} iterations")
    print(" ")
    print(f"{name} (scipy_gpuqr, {how}): A has {m} rows and {n} columns")
    print(_MSG[istop])
    print(f"istop ={istop:8g}   r1norm ={ans.r1norm:8.1e}   anorm ={ans.anorm:8.1e}   "
          f"arnorm ={ans.arnorm:8.1e}")
    print(f"itn   ={ans.itn:8g}   r2norm ={ans.r2norm:8.1e}   acond ={ans.acond:8.1e}   "
          f"xnorm  ={xnorm:8.1e}")
    if F is not None:
        print(f"rank  ={F.rank:8g}   ({F.info.get('rank_decision', {}).get('method', '')})")
    print(" ")


def lsqr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8,
         iter_lim=None, show=False, calc_var=False, x0=None, *,
         backend=None, gpuqr_options=None):
    """Least-squares solution of ``A x = b`` with SciPy's ``lsqr`` interface.

    Returns the minimum 2-norm least-squares solution — what the LSQR
    iteration converges to from x0 = 0, and what
    ``numpy.linalg.lstsq(A.toarray(), b, rcond=None)`` returns (rank rule:
    singular values ``<= eps·max(m, n)·σ_max`` are zero), at working
    precision. Rank-deficient, wide and tall A alike; no warnings. Under
    backend 'auto' LSQR runs first on a small budget and answers when it
    reaches working precision (well-conditioned problems); otherwise a
    direct sparse QR answers (:mod:`scipy_gpuqr._dispatch.iterate_first`).

    Parameters
    ----------
    A : sparse matrix/array (any format), ndarray, LinearOperator, CuPy/cupyx
        Shape (m, n). LinearOperators, complex and pydata/sparse inputs are
        answered by SciPy's original ``lsqr``.
    b : array_like, shape (m,) or (m, 1)
    damp : float
        Solves ``min ‖[A; damp·I] x − [b; 0]‖``.
    atol, btol, conlim : float
        Used only for ``istop``: SciPy's own tests applied to the final x.
    iter_lim : int or None
        Accepted and ignored (a direct method has no iterations).
    show : bool
        Print a short summary.
    calc_var : bool
        Return ``diag(pinv(AᵀA + damp²I))``: exact through R (or a dense
        pseudo-inverse for wide A up to 4e6 entries); NaN where that is not
        affordable (rank-deficient problems with more than
        :data:`~scipy_gpuqr._factor.lstsq.DENSE_LIMIT` columns, large wide ones).
    x0 : array_like, shape (n,), optional
        Starting point: the answer is ``x0 +`` the minimum-norm correction.
    backend, gpuqr_options
        Keyword-only additions (see :class:`~scipy_gpuqr.QRFactorization`).

    Returns
    -------
    x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var
        SciPy's 10-tuple. ``x`` is float64. ``itn`` is the number of LSQR
        iterations when the iterate-first pass answered (backend 'auto',
        see :mod:`scipy_gpuqr._dispatch.iterate_first`), else 0. ``r1norm``,
        ``r2norm``, ``arnorm`` and ``xnorm`` (of ``x − x0``, as SciPy's) are
        computed from the final x; ``anorm`` is ``‖[A; damp·I]‖_F``;
        ``acond`` is ``anorm / σ_min`` with σ_min of the retained part
        (exact from an SVD of R when one was needed, otherwise an
        estimate).
    """
    reason = unsupported_reason(A, b, x0)
    if reason is not None:
        return fallback("lsqr", reason, A, b, damp=damp, atol=atol, btol=btol,
                        conlim=conlim, iter_lim=iter_lim, show=show,
                        calc_var=calc_var, x0=x0)
    mi = as_matrix(A)
    m, n = mi.shape
    rhs = check_rhs(b, m, LSTSQ_RHS, func="lsqr")
    x0v = check_x0(x0, n)
    damp = check_damp(damp)
    begin = start(mi.A, rhs.B[:, 0], x0v)
    if begin.trivial:                   # SciPy: x = x0 (or 0), istop 0
        ans = trivial_answer(begin, x0v, n)
        istop, xnorm = 0, 0.0
        out = (ans.x, 0, 0, ans.r1norm, ans.r2norm, 0, 0, 0.0, 0, ans.var)
    else:
        settings = resolve_settings(backend, gpuqr_options)
        ans = solve_least_squares(mi, x0v, damp, begin, calc_var=calc_var,
                                  settings=settings, lsqr=original("lsqr"))
        xnorm = float(np.linalg.norm(ans.dx))
        ctol = 1 / conlim if conlim > 0 else 0
        tests = _tests(ans.r2norm, ans.arnorm, ans.anorm, ans.acond, xnorm,
                       ans.bnorm, atol, btol, lsmr=False)
        istop = _istop(*tests, atol, ctol)
        out = (ans.x, istop, ans.itn, ans.r1norm, ans.r2norm, ans.anorm, ans.acond,
               ans.arnorm, xnorm, ans.var)
    if show:
        _show("LSQR", m, n, istop, ans, xnorm)
    on_gpu = mi.on_gpu or rhs.on_gpu
    return (to_output(out[0], on_gpu),) + out[1:9] + (to_output(out[9], on_gpu),)


def lsmr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8,
         maxiter=None, show=False, x0=None, *, backend=None, gpuqr_options=None):
    """Least-squares solution of ``A x = b`` with SciPy's ``lsmr`` interface.

    Same solution rule as :func:`lsqr` (minimum 2-norm least squares by a
    direct sparse QR). ``maxiter`` is accepted and ignored.

    Returns
    -------
    x, istop, itn, normr, normar, norma, conda, normx
        SciPy's 8-tuple; x has dtype ``result_type(A, b, x0, float)`` like
        SciPy's lsmr (float32 in, float32 out). ``itn`` as lsqr's; ``normx`` is
        ``‖x‖``; ``conda`` as lsqr's ``acond``.
    """
    reason = unsupported_reason(A, b, x0)
    if reason is not None:
        return fallback("lsmr", reason, A, b, damp=damp, atol=atol, btol=btol,
                        conlim=conlim, maxiter=maxiter, show=show, x0=x0)
    mi = as_matrix(A)
    m, n = mi.shape
    rhs = check_rhs(b, m, LSTSQ_RHS, func="lsmr")
    x0v = check_x0(x0, n)
    dtypes = [mi.dtype, rhs.dtype] + ([np.asarray(x0).dtype] if x0 is not None
                                      and not hasattr(x0, "device") else [])
    dtype = np.result_type(*dtypes, np.float32)
    if dtype.kind != "f":
        dtype = np.dtype(np.float64)
    bb = rhs.B[:, 0]
    begin = start(mi.A, bb, x0v)
    ans = None
    if begin.trivial:  # SciPy: x = x0 (or 0), istop 0
        x = np.zeros(n) if x0v is None else x0v
        out, istop = (x, 0, 0, begin.beta, 0.0, begin.alfa, 1, 0), 0
    elif begin.bnorm == 0:  # SciPy returns x = 0 when b = 0 (even with x0)
        out, istop = (np.zeros(n), 0, 0, begin.beta, begin.alfa * begin.beta, begin.alfa,
                      1, 0), 0
    else:
        damp = check_damp(damp)
        settings = resolve_settings(backend, gpuqr_options)
        ans = solve_least_squares(mi, x0v, damp, begin, calc_var=False, settings=settings,
                                  lsqr=original("lsqr"))
        normr = ans.r2norm
        normx = float(np.linalg.norm(ans.x))
        ctol = 1 / conlim if conlim > 0 else 0
        tests = _tests(normr, ans.arnorm, ans.anorm, ans.acond, normx, ans.bnorm,
                       atol, btol, lsmr=True)
        istop = _istop(*tests, atol, ctol)
        out = (ans.x, istop, ans.itn, normr, ans.arnorm, ans.anorm, ans.acond, normx)
    if show and ans is not None:
        _show("LSMR", m, n, istop, ans, float(np.linalg.norm(out[0])))
    elif show:
        print(_MSG[0])
    x = np.asarray(out[0]).astype(dtype, copy=False)
    return (to_output(x, mi.on_gpu or rhs.on_gpu),) + out[1:]
