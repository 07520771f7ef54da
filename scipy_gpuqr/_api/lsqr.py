"""``lsqr`` and ``lsmr`` with SciPy's signatures, and their SciPy tuples.

SciPy's parameters (names, order, defaults) are an exact prefix of ours;
what we add (``backend``, ``gpuqr_options``) is keyword-only. Each function
checks its inputs (:func:`scipy_gpuqr._factor.least_squares.check_problem`;
for the commonest input, a SciPy CSR/CSC float64 A and a float64 vector b
under ``auto``, only what that input needs, by
:func:`scipy_gpuqr._factor.quick_iterate.quick_iterate`, the full check
waiting until the QR needs it), resolves its settings once, and answers:

* under backend ``'auto'``: SciPy's own algorithm with the caller's
  arguments when its convergence tests stop it within ``auto``'s allowance —
  SciPy's tuple as SciPy gives it (bit for bit on the CPU; on a GPU CuPy in,
  CuPy out without a host copy of b or x) — and otherwise the exact answer
  (:mod:`scipy_gpuqr._dispatch.iterate_first`): SciPy's SuperLU for a square
  A of full rank by lstsq's rule (:mod:`scipy_gpuqr._api.square_lu`), else
  the sparse QR;
* under an explicit backend: always the sparse QR.

The QR's answer is the minimum-norm least-squares solution, with SciPy's
tuple filled from it: the stopping tests (``istop``) applied to the final x,
``itn = 0``, and the ``show`` summary. Inputs we do not serve go to SciPy's
original function (:mod:`scipy_gpuqr._api.fallback`). Each call logs who
answered and why (logger ``scipy_gpuqr``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp

from .._factor.least_squares import (StoppingRules, check_problem, iterate, log_answer,
                                     solve_least_squares, start_problem, trivial_answer,
                                     vector_norm)
from .._factor.dense_least_squares import dense_answer, dense_answer_fits
from .._factor.quick_iterate import quick_iterate
from .._iterative._common import stopping_code
from .._options import resolve_settings
from .._validate import to_output, unsupported_reason
from .fallback import fallback
from .originals import original
from .square_lu import SquareLU, square_lu

__all__ = ["lsqr", "lsmr"]

_EPS = float(np.finfo(np.float64).eps)


def _istop(test1, test2, test3, t1, rtol, atol, ctol) -> int:
    """SciPy's stopping code for the QR's final x (no iteration limit applies to it)."""
    return stopping_code(0, 1, test1, test2, test3, t1, rtol, atol, ctol)


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


def _show(name: str, shape, istop: int, itn: int, who: str, lines, ans=None) -> None:
    """``show=True``: a closing summary in SciPy's terms, naming who answered (and,
    for the QR's answer ``ans``, the rank it kept)."""
    m, n = shape
    print(" ")
    print(f"{name} (scipy_gpuqr, {who}): A has {m} rows and {n} columns")
    print(_MSG[istop])
    print(f"istop ={istop:8g}   itn ={itn:8g}")
    for label, value in lines:
        print(f"{label:7s}={value:8.1e}")
    F = None if ans is None else ans.factorization
    if F is not None:
        print(f"rank   ={F.rank:8g}   ({F.info.get('rank_decision', {}).get('method', '')})")
    print(" ")


def _floating(value) -> Optional[np.dtype]:
    """The dtype of ``value`` (an array, a NumPy scalar, a list or a number) where it is
    a floating one other than float64; else None (sparse data too: SciPy's lsqr and
    lsmr take no sparse b, ours does)."""
    if value is None or sp.issparse(value):
        return None
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        dtype = np.asarray(value).dtype
    dtype = np.dtype(dtype) if dtype is not None else None
    return dtype if dtype is not None and dtype.kind == "f" and dtype != np.float64 else None


def _not_bitwise(method: str, A, b, x0, damp) -> Optional[str]:
    """Why our iterations on the CPU would not be SciPy's bit for bit on these
    arguments, or None.

    Ours iterate in float64 on the checked problem; SciPy keeps the caller's
    narrower floating types where NumPy's promotion keeps them: a float32 (or
    float16) ``damp`` is squared in its own type, a float32 b makes u and v
    float32 vectors (a different ``itn``), a dense A other than float64 is
    multiplied by NumPy (float32 products; BLAS on integers made float), and
    a float32 ``x0`` meets A's products in float32 (lsmr's x stays float32).
    Sparse A of any dtype and integer or boolean b are served bit for bit.
    """
    for what, value in (("damp", damp), ("b", b)):
        dtype = _floating(value)
        if dtype is not None:
            return f"a {dtype} {what}"
    if isinstance(A, np.ndarray) and A.dtype != np.float64:
        return f"a dense {A.dtype} A (NumPy's product, not ours)"
    if x0 is not None and _floating(x0) is not None:
        return f"a {_floating(x0)} x0"
    return None


def _own(method: str, A, b, x0, damp, rules: StoppingRules):
    """``iterate``'s ``own``: SciPy's own function where ours would not be bit for bit
    (:func:`_not_bitwise`), else None."""
    reason = _not_bitwise(method, A, b, x0, damp)
    if reason is None:
        return None
    scipy_function = original(method)

    def run(iter_lim: int):
        kwargs = dict(damp=damp, atol=rules.atol, btol=rules.btol, conlim=rules.conlim,
                      show=False, x0=x0)
        if method == "lsqr":
            kwargs.update(iter_lim=iter_lim, calc_var=rules.calc_var)
        else:
            kwargs.update(maxiter=iter_lim)
        try:
            return scipy_function(A, b, **kwargs)
        except (TypeError, ValueError):
            # SciPy refuses what the checks accepted (lsmr: NumPy's casting of an
            # integer x0 or a bool damp): ours answers, as for every such input
            return None
    return run, reason


def _rules(atol, btol, conlim, iter_lim, calc_var) -> StoppingRules:
    """The call's :class:`StoppingRules`, made as the tuple it is (its generated
    ``__new__`` is a Python function: a few microseconds from cold caches on every call)."""
    return tuple.__new__(StoppingRules, (atol, btol, conlim, iter_lim, calc_var))


def _undamped_square(shape, nnz, matrix) -> Optional[SquareLU]:
    """``quick_iterate``'s ``square_of`` where ``calc_var`` is off: the LU answer of a square
    host A (no damping on that path), by
    :func:`~scipy_gpuqr._api.square_lu.square_lu`."""
    return square_lu(shape, nnz, 0.0, False, False, matrix)


def _square(problem, settings, calc_var: bool) -> Optional[SquareLU]:
    """The general path's LU answer of a square A: under ``auto`` with iterate-first
    only (explicit backends and ``iterate_first=False`` keep the QR)."""
    if settings.backend != "auto" or not settings.options.iterate_first:
        return None
    return square_lu(problem.shape, problem.nnz, problem.damp, calc_var, problem.on_gpu,
                     lambda: problem.matrix().A)


def _exact(problem, begin, square: Optional[SquareLU], *, calc_var, settings, planned,
           made=None):
    """The exact answer of a non-trivial problem and who gave it: SuperLU's where
    ``square`` may answer (:mod:`scipy_gpuqr._api.square_lu`), else the sparse QR's
    (``made``'s where a worker made it beside the run: :mod:`scipy_gpuqr._factor.qr_ahead`;
    made here from the worker's plan or factors where it stopped before the answer),
    or for a tiny problem of ``auto`` the same answer by LAPACK on a dense copy
    (:mod:`scipy_gpuqr._factor.dense_least_squares`: made here, no worker started for it).
    The LU's outcome, when it did not answer, and what the worker made, where it did
    not make the answer, are added to ``why``'s text."""
    if square is not None:
        ans = square.answer(begin, problem.host_x0())
        if ans is not None:
            return ans, f"SuperLU on CPU (A square, {square.why})", ""
    if made is not None and made.answer is not None:
        return made.answer, _qr_who(made.answer), f"; {made.what} on a worker beside the run"
    worker = ""
    if made is not None and made.planned is not None:
        planned = made.planned
        worker = f"; {made.what} on a worker beside the run, its answer made here"
    note = "" if square is None else f"; the LU did not answer: {square.why}"
    if dense_answer_fits(problem, settings, planned):
        ans = dense_answer(problem, begin, calc_var=calc_var)
        return ans, ans.who, note + worker
    ans = solve_least_squares(problem, begin, calc_var=calc_var, settings=settings,
                              planned=planned,
                              known=None if square is None else square.known_norms())
    return ans, _qr_who(ans), note + worker


def _made(quick):
    """What the worker of a stalled run made (:class:`~scipy_gpuqr._factor.qr_ahead.QRAhead`,
    waited for), or None where none ran."""
    ahead = None if quick is None else quick.ahead
    return None if ahead is None else ahead.result()


def _release(ans) -> None:
    """Free the call's own factorization once its answer is read: its device
    memory goes back now, not at Python's next cyclic collection."""
    F = None if ans is None else ans.factorization
    if F is not None:
        F.free()


def _qr_who(ans) -> str:
    if ans.who:
        return ans.who
    F = ans.factorization
    if F is None:
        return "the start: x0 (or 0) is exact"
    backend = F.plan.backend
    return "QR on GPU" if backend == "gpu" else f"QR on CPU ({backend!r})"


def lsqr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8,
         iter_lim=None, show=False, calc_var=False, x0=None, *,
         backend=None, gpuqr_options=None):
    """Least-squares solution of ``A x = b`` with SciPy's ``lsqr`` interface.

    Under backend ``'auto'`` (the default) SciPy's LSQR runs with the
    caller's arguments — on the GPU when one is used (CuPy data, or a problem
    large enough), else on the CPU, bit for bit SciPy's result — and when
    its tolerance tests stop it (``istop`` 1, 2, 4 or 5) its tuple is the
    answer, exactly as SciPy's ``lsqr`` returns it. Otherwise — the caller's
    tolerances are 0, ``conlim`` or ``iter_lim`` stops (or would stop) the
    run, or iterating would cost more than factorizing
    (:mod:`scipy_gpuqr._dispatch.iterate_first`) — and under every explicit
    backend, a sparse QR answers with the minimum 2-norm least-squares
    solution: what the LSQR iteration converges to from x0 = 0, and what
    ``numpy.linalg.lstsq(A.toarray(), b, rcond=None)`` returns (rank rule:
    singular values ``<= eps·max(m, n)·σ_max`` are zero), at working
    precision. Rank-deficient, wide and tall A alike; no warnings. Under
    ``auto``, a square A (no ``damp``, no ``calc_var``) that is of full rank
    by that rule gets the same answer, ``A⁻¹ b``, from SciPy's SuperLU
    (:mod:`scipy_gpuqr._api.square_lu`), the QR deciding where it is not.

    Parameters
    ----------
    A : sparse matrix/array (any format), ndarray, LinearOperator, CuPy/cupyx
        Shape (m, n). LinearOperators, complex and pydata/sparse inputs are
        answered by SciPy's original ``lsqr``.
    b : array_like, shape (m,) or (m, 1)
    damp : float
        Solves ``min ‖[A; damp·I] x − [b; 0]‖``.
    atol, btol, conlim : float
        SciPy's stopping tolerances: they stop SciPy's iterations; for the
        QR's answer, SciPy's tests applied to the final x give ``istop``.
        ``atol = btol = 0`` asks for maximum precision: the QR answers.
        ``conlim = 0`` alone turns the condition limit off, as in SciPy
        (whose run then answers as usual).
    iter_lim : int or None
        SciPy's iteration limit (``2 n`` by default). A run that reaches it,
        or is projected to, is answered by the QR instead.
    show : bool
        Print a closing summary, naming who answered.
    calc_var : bool
        SciPy's estimate of ``diag(pinv(AᵀA + damp²I))`` when SciPy's LSQR
        answers; when the QR answers, the exact values through R (or a
        dense pseudo-inverse for wide A up to 4e6 entries), NaN where that is
        not affordable (rank-deficient problems with more than
        :data:`~scipy_gpuqr._factor.lstsq.DENSE_LIMIT` columns, large wide ones).
    x0 : array_like, shape (n,), optional
        Starting point: the answer is ``x0 +`` the correction.
    backend, gpuqr_options
        Keyword-only additions (see :class:`~scipy_gpuqr.QRFactorization`).

    Returns
    -------
    x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var
        SciPy's 10-tuple; ``x`` and ``var`` float64, CuPy when the caller
        passed CuPy data. From SciPy's LSQR: its tuple. From the QR:
        ``itn = 0``; ``r1norm``, ``r2norm``, ``arnorm`` and ``xnorm`` (of
        ``x − x0``, as SciPy's) computed from the final x; ``anorm`` is
        ``‖[A; damp·I]‖_F``; ``acond`` is ``anorm / σ_min`` with σ_min of the
        retained part (exact from an SVD of R when one was needed, otherwise
        an estimate).
    """
    rules = _rules(atol, btol, conlim, iter_lim, calc_var)
    quick = None if show else quick_iterate("lsqr", A, b, x0, damp, rules, backend, gpuqr_options,
                                            None if calc_var else _undamped_square)
    if quick is not None:
        if quick.found is not None:
            return quick.found.result
        problem, settings = quick.problem(), quick.settings
        planned, why, square = quick.planned, quick.why, quick.square
    else:
        reason = unsupported_reason(A, b, x0)
        if reason is not None:
            return fallback("lsqr", reason, A, b, damp=damp, atol=atol, btol=btol,
                            conlim=conlim, iter_lim=iter_lim, show=show,
                            calc_var=calc_var, x0=x0)
        problem = check_problem(A, b, x0, damp, func="lsqr")
        settings = resolve_settings(backend, gpuqr_options)
        own = None if problem.on_gpu else _own("lsqr", A, b, x0, damp, rules)
        square = _square(problem, settings, calc_var)
        found, planned, why = iterate(problem, "lsqr", rules, settings, own, square)
        if found is not None:
            log_answer("lsqr", problem, found.who, why)
            out = found.result
            if show:
                _show("LSQR", problem.shape, out[1], out[2], found.who,
                      zip(("r1norm", "r2norm", "anorm", "acond", "arnorm", "xnorm"),
                          out[3:9]))
            return out
    n = problem.shape[1]
    made = _made(quick)
    # where b lies: a CuPy b stays on its device
    begin = start_problem(problem) if made is None else made.begin
    if begin.trivial:                   # SciPy: x = x0 (or 0), istop 0
        ans = trivial_answer(begin, problem.x0, n)
        istop, xnorm = 0, 0.0
        out = (ans.x, 0, 0, ans.r1norm, ans.r2norm, 0, 0, 0.0, 0, ans.var)
        who, note = _qr_who(ans), ""
    else:
        ans, who, note = _exact(problem, begin, square, calc_var=calc_var, settings=settings,
                                planned=planned, made=made)
        xnorm = vector_norm(ans.dx)
        ctol = 1 / conlim if conlim > 0 else 0
        tests = _tests(ans.r2norm, ans.arnorm, ans.anorm, ans.acond, xnorm,
                       ans.bnorm, atol, btol, lsmr=False)
        istop = _istop(*tests, atol, ctol)
        out = (ans.x, istop, ans.itn, ans.r1norm, ans.r2norm, ans.anorm, ans.acond,
               ans.arnorm, xnorm, ans.var)
    log_answer("lsqr", problem, who, f"{why}{note}" if note else why)
    if show:
        _show("LSQR", problem.shape, istop, 0, who,
              zip(("r1norm", "r2norm", "anorm", "acond", "arnorm", "xnorm"), out[3:9]), ans)
    _release(ans)
    on_gpu = problem.on_gpu
    return (to_output(out[0], on_gpu),) + out[1:9] + (to_output(out[9], on_gpu),)


def lsmr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8,
         maxiter=None, show=False, x0=None, *, backend=None, gpuqr_options=None):
    """Least-squares solution of ``A x = b`` with SciPy's ``lsmr`` interface.

    The rule of :func:`lsqr` with SciPy's LSMR: under backend ``'auto'``
    SciPy's LSMR with the caller's arguments answers when its tolerance
    tests stop it, else (and under explicit backends) the sparse QR's
    minimum 2-norm least-squares solution. ``maxiter`` is SciPy's iteration
    limit (``min(m, n)`` by default).

    Returns
    -------
    x, istop, itn, normr, normar, norma, conda, normx
        SciPy's 8-tuple; x has the dtype of SciPy's lsmr: ``x0``'s where
        one is given, else ``result_type(A, b, float)`` (float64 for real
        data). Under ``auto`` on the CPU, arguments whose narrower floating
        types SciPy keeps (a float32 ``damp``, b, dense A or ``x0``) are
        iterated by SciPy's own function: its tuple exactly. From the QR: ``itn = 0``; ``normx`` is ``‖x‖``;
        ``conda`` as lsqr's ``acond``.
    """
    rules = _rules(atol, btol, conlim, maxiter, False)
    names = ("normr", "normar", "norma", "conda", "normx")
    quick = None if show else quick_iterate("lsmr", A, b, x0, damp, rules, backend,
                                            gpuqr_options, _undamped_square)
    if quick is not None:       # float64 A and b: x is float64, as SciPy's
        if quick.found is not None:
            return quick.found.result
        problem, settings = quick.problem(), quick.settings
        planned, why, square = quick.planned, quick.why, quick.square
        dtype = np.dtype(np.float64)
    else:
        reason = unsupported_reason(A, b, x0)
        if reason is not None:
            return fallback("lsmr", reason, A, b, damp=damp, atol=atol, btol=btol,
                            conlim=conlim, maxiter=maxiter, show=show, x0=x0)
        problem = check_problem(A, b, x0, damp, func="lsmr")
        # SciPy's x: zeros of result_type(A, b, float), or a copy of x0 in x0's dtype
        given = None if x0 is None or hasattr(x0, "device") else np.asarray(x0).dtype
        dtype = given if given is not None else np.result_type(problem.dtype, problem.b_dtype,
                                                               float)
        if dtype.kind != "f":
            dtype = np.dtype(np.float64)
        settings = resolve_settings(backend, gpuqr_options)
        own = None if problem.on_gpu else _own("lsmr", A, b, x0, damp, rules)
        square = _square(problem, settings, False)
        found, planned, why = iterate(problem, "lsmr", rules, settings, own, square)
        if found is not None:
            log_answer("lsmr", problem, found.who, why)
            out = found.result
            if show:
                _show("LSMR", problem.shape, out[1], out[2], found.who, zip(names, out[3:8]))
            x = out[0]
            if found.who.startswith("SciPy's"):     # SciPy's own tuple, its x's dtype
                return tuple(out)
            return (x if x.dtype == dtype else x.astype(dtype),) + tuple(out[1:])
    n = problem.shape[1]
    made = _made(quick)
    # where b lies: a CuPy b stays on its device
    begin = start_problem(problem) if made is None else made.begin
    ans, who, note = None, "the start: x0 (or 0) is exact", ""
    if begin.trivial:  # SciPy: x = x0 (or 0), istop 0
        x = trivial_answer(begin, problem.x0, n).x
        out, istop = (x, 0, 0, begin.beta, 0.0, begin.alfa, 1, 0), 0
    elif begin.bnorm == 0:  # SciPy returns x = 0 when b = 0 (even with x0)
        x = trivial_answer(begin, None, n).x
        out, istop = (x, 0, 0, begin.beta, begin.alfa * begin.beta, begin.alfa, 1, 0), 0
    else:
        ans, who, note = _exact(problem, begin, square, calc_var=False, settings=settings,
                                planned=planned, made=made)
        normr = ans.r2norm
        normx = vector_norm(ans.x)
        ctol = 1 / conlim if conlim > 0 else 0
        tests = _tests(normr, ans.arnorm, ans.anorm, ans.acond, normx, ans.bnorm,
                       atol, btol, lsmr=True)
        istop = _istop(*tests, atol, ctol)
        out = (ans.x, istop, ans.itn, normr, ans.arnorm, ans.anorm, ans.acond, normx)
    log_answer("lsmr", problem, who, f"{why}{note}" if note else why)
    if show:
        _show("LSMR", problem.shape, istop, 0, who, zip(names, out[3:8]), ans)
    _release(ans)
    x = out[0].astype(dtype, copy=False)
    return (to_output(x, problem.on_gpu),) + out[1:]
