"""SciPy-signature entry points: ``lsqr``, ``lsmr``, ``spsolve``, ``factorized``, ``qr``.

SciPy 1.17's parameters (names, order, defaults) are an exact prefix of
ours; what we add (``backend``, ``gpuqr_options``) is keyword-only
(``tests/test_adapters.py`` compares ``inspect.signature``). Each function
validates its inputs (:mod:`._validate`), factorizes through
:class:`~scipy_gpuqr.QRFactorization` and answers by the rules of
:mod:`._lstsq`. What we cannot serve — a LinearOperator, complex data,
pydata/sparse arrays — goes to SciPy's *original* function
(:mod:`._originals`, saved before any patching), with the reason logged.

CuPy in → CuPy out. With a GPU factorization the solves run on the device
(:mod:`scipy_gpuqr._engine.gpu.solve`); these entry points still validate
b on the host, so b and x cross once each way (``QRFactorization.solve``
keeps CuPy data on the device).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Optional

import numpy as np
import scipy.sparse as sp
from scipy.sparse import SparseEfficiencyWarning
from scipy.sparse.linalg import LinearOperator

from .._dispatch.plan import plan_factorization
from .._dispatch.cost_model import predicted_seconds
from .._factor.factorization import QRFactorization, device_rhs, plan_for
from .._dispatch.iterate_first import (ANALYSIS_FIRST_NNZ, ITERATION_SHARE, PRE_ANALYSIS_ITERATIONS,
                             LsqrProgress, damped_norms, try_lsqr)
from .._factor.lstsq import exactly_singular
from .._options import log_decision, resolve_backend, resolve_options
from .._gpu import is_cupy_array
from .originals import MatrixRankWarning, original
from .._validate import (MatrixInput, as_matrix, check_finite, check_superlu_cast, lstsq_rhs,
                        solve_rhs, spsolve_rhs, to_output, unsupported_reason)

__all__ = ["lsqr", "lsmr", "spsolve", "factorized", "qr", "QRResult"]

_EPS = float(np.finfo(np.float64).eps)

#: SciPy's permc_spec → our column ordering (MMD_* → AMD: SuperLU's minimum
#: degree on AᵀA or Aᵀ+A; AMD is the same family).
PERMC_ORDERINGS = {None: "colamd", "COLAMD": "colamd", "NATURAL": "natural",
                   "MMD_ATA": "amd", "MMD_AT_PLUS_A": "amd"}


def _fallback(name: str, reason: str, *args, **kwargs):
    log_decision("%s: SciPy's original answers (%s)", name, reason)
    return original(name)(*args, **kwargs)


# ---------------------------------------------------------------------------
# least squares
# ---------------------------------------------------------------------------

class _LstsqAnswer(NamedTuple):
    x: np.ndarray
    dx: np.ndarray
    r1norm: float
    r2norm: float
    anorm: float
    acond: float
    arnorm: float
    bnorm: float
    var: Optional[np.ndarray]
    early: bool
    factorization: Optional[QRFactorization]
    itn: int = 0


def _x0_vector(x0, n: int) -> Optional[np.ndarray]:
    if x0 is None:
        return None
    from .._validate import _host
    x0, _ = _host(x0)
    arr = np.atleast_1d(np.asarray(x0))
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"x0 must be numeric, got dtype {arr.dtype}")
    if arr.ndim > 1:
        arr = np.atleast_1d(arr.squeeze())
    if arr.shape != (n,):
        raise ValueError(f"dimension mismatch: x0 must have shape ({n},), got {np.shape(x0)}")
    check_finite(arr, "x0", shape=np.shape(x0))
    return arr.astype(np.float64)


def _acond_estimate(F: QRFactorization, anorm: float) -> float:
    """cond(Abar) estimate: ‖Abar‖_F / σ_min(kept), from the rank decision."""
    s = F._min_norm_solver()
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


def _solve_lstsq(mi: MatrixInput, b: np.ndarray, damp: float, x0, *, calc_var: bool,
                 backend, gpuqr_options) -> _LstsqAnswer:
    A = mi.A
    m, n = A.shape
    damp = float(damp)
    if not np.isfinite(damp):
        raise ValueError(f"damp must be finite, got {damp!r}")
    bnorm = float(np.linalg.norm(b))
    r0 = b if x0 is None else b - A @ x0
    beta = float(np.linalg.norm(r0))
    alfa = float(np.linalg.norm(A.T @ r0)) if beta > 0 else 0.0
    x_start = np.zeros(n) if x0 is None else x0.copy()
    if alfa * beta == 0:
        return _LstsqAnswer(x_start, np.zeros(n), beta, beta, 0.0, 0.0, 0.0, bnorm,
                            np.zeros(n), True, None)
    if damp != 0:
        M = sp.vstack([A, damp * sp.eye_array(n, format="csc")], format="csc")
        rhs = np.concatenate([r0, np.zeros(n)])
        Mi = MatrixInput(A=sp.csc_array(M), dtype=mi.dtype, on_gpu=False,
                         was_sparse=True, fmt="csc", sparse_class=sp.csc_array)
    else:
        Mi, rhs = mi, r0
    planned = None
    if not calc_var:
        answer, planned = _iterate_first(A, Mi, r0, damp, x_start, bnorm, backend,
                                         gpuqr_options)
        if answer is not None:
            return answer
    F = QRFactorization(Mi, tol=None, backend=backend, gpuqr_options=gpuqr_options,
                        _planned=planned)
    dx = F._solve_host(rhs[:, None])[:, 0]
    norms = damped_norms(A, r0, dx, damp)
    acond = _acond_estimate(F, norms.anorm)
    var = np.zeros(n)
    if calc_var:
        var = _variance(F, Mi.A)
    return _LstsqAnswer(x_start + dx, dx, norms.r1norm, norms.r2norm, norms.anorm, acond,
                        norms.arnorm, bnorm, var, False, F)


def _iterate_first(A, Mi, r0, damp, x_start, bnorm, backend, gpuqr_options):
    """LSQR within a share of the factorization's predicted time, under backend 'auto'.

    Returns ``(answer or None, (M, plan) or None)``: the plan, when it was
    made to size LSQR's allowance, is handed to the factorization (see
    :mod:`._iterate_first`).
    """
    chosen, source = resolve_backend(backend, gpuqr_options)
    if chosen != "auto" or not resolve_options(gpuqr_options).iterate_first:
        return None, None
    A64 = A if A.dtype == np.float64 else A.astype(np.float64)
    m, n = A.shape
    progress, planned, found, why = None, None, None, ""
    if A.nnz > ANALYSIS_FIRST_NNZ and damp == 0:
        # a first piece before the analysis: well-conditioned large problems end here
        first = PRE_ANALYSIS_ITERATIONS * LsqrProgress().seconds_per_iteration(A64)
        found, why, progress = try_lsqr(A64, r0, damp, seconds=first)
    if found is None and not (progress is not None and progress.done):
        planned = plan_for(Mi, backend=backend, gpuqr_options=gpuqr_options)
        plan = planned[1]
        flops = float(getattr(plan.analysis, "flops", float("nan")))
        allowance = ITERATION_SHARE * predicted_seconds(plan.backend, flops, plan.gpu_name)
        found, why, progress = try_lsqr(A64, r0, damp, seconds=allowance, progress=progress)
        why += f"; allowance {allowance:.3g} s = {ITERATION_SHARE:g} x predicted {plan.backend}"
    log_decision("least squares %dx%d nnz=%d: backend 'auto' from %s; %s; %s", m, n,
                 A.nnz, source, why, "answered without factorizing" if found
                 else "factorizing")
    if found is None:
        return None, planned
    norms = damped_norms(A64, r0, found.dx, damp)
    return _LstsqAnswer(x_start + found.dx, found.dx, norms.r1norm, norms.r2norm, norms.anorm,
                        found.acond, norms.arnorm, bnorm, np.zeros(n), False, None,
                        found.itn), planned


def _variance(F: QRFactorization, M: sp.csc_array) -> np.ndarray:
    """diag(pinv(MᵀM)) in A's column order (M = A or [A; damp·I])."""
    n = M.shape[1]
    if not F.transposed:
        v = F._min_norm_solver().inverse_gram_diagonal()
        out = np.empty(n)
        out[F.perm] = v
        return out
    if M.shape[0] * M.shape[1] <= 4_000_000:
        P = np.linalg.pinv(M.toarray(), rcond=_EPS * max(M.shape))
        return (P ** 2).sum(axis=1)
    return np.full(n, np.nan)


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


def _show(name, m, n, istop, ans, xnorm, F):
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
        return _fallback("lsqr", reason, A, b, damp=damp, atol=atol, btol=btol,
                         conlim=conlim, iter_lim=iter_lim, show=show,
                         calc_var=calc_var, x0=x0)
    mi = as_matrix(A)
    m, n = mi.shape
    bb, b_gpu, _ = lstsq_rhs(b, m, func="lsqr")
    x0v = _x0_vector(x0, n)
    ans = _solve_lstsq(mi, bb, damp, x0v, calc_var=calc_var, backend=backend,
                       gpuqr_options=gpuqr_options)
    xnorm = float(np.linalg.norm(ans.dx))
    if ans.early:
        istop = 0
        out = (ans.x, 0, 0, ans.r1norm, ans.r2norm, 0, 0, 0.0, 0, ans.var)
    else:
        ctol = 1 / conlim if conlim > 0 else 0
        tests = _tests(ans.r2norm, ans.arnorm, ans.anorm, ans.acond, xnorm,
                       ans.bnorm, atol, btol, lsmr=False)
        istop = _istop(*tests, atol, ctol)
        out = (ans.x, istop, ans.itn, ans.r1norm, ans.r2norm, ans.anorm, ans.acond,
               ans.arnorm, xnorm, ans.var)
    if show:
        _show("LSQR", m, n, istop, ans, xnorm, ans.factorization)
    on_gpu = mi.on_gpu or b_gpu
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
        return _fallback("lsmr", reason, A, b, damp=damp, atol=atol, btol=btol,
                         conlim=conlim, maxiter=maxiter, show=show, x0=x0)
    mi = as_matrix(A)
    m, n = mi.shape
    bb, b_gpu, b_dtype = lstsq_rhs(b, m, func="lsmr")
    x0v = _x0_vector(x0, n)
    dtypes = [mi.dtype, b_dtype] + ([np.asarray(x0).dtype] if x0 is not None
                                    and not hasattr(x0, "device") else [])
    dtype = np.result_type(*dtypes, np.float32)
    if dtype.kind != "f":
        dtype = np.dtype(np.float64)
    r0 = bb if x0v is None else bb - mi.A @ x0v
    beta = float(np.linalg.norm(r0))
    alpha = float(np.linalg.norm(mi.A.T @ r0)) if beta > 0 else 0.0
    ans = None
    if alpha * beta == 0:  # SciPy: x = x0 (or 0), istop 0
        x = np.zeros(n) if x0v is None else x0v
        out, istop = (x, 0, 0, beta, 0.0, alpha, 1, 0), 0
    elif np.linalg.norm(bb) == 0:  # SciPy returns x = 0 when b = 0 (even with x0)
        out, istop = (np.zeros(n), 0, 0, beta, alpha * beta, alpha, 1, 0), 0
    else:
        ans = _solve_lstsq(mi, bb, damp, x0v, calc_var=False, backend=backend,
                           gpuqr_options=gpuqr_options)
        normr = ans.r2norm
        normx = float(np.linalg.norm(ans.x))
        ctol = 1 / conlim if conlim > 0 else 0
        tests = _tests(normr, ans.arnorm, ans.anorm, ans.acond, normx, ans.bnorm,
                       atol, btol, lsmr=True)
        istop = _istop(*tests, atol, ctol)
        out = (ans.x, istop, ans.itn, normr, ans.arnorm, ans.anorm, ans.acond, normx)
    if show and ans is not None:
        _show("LSMR", m, n, istop, ans, float(np.linalg.norm(out[0])), ans.factorization)
    elif show:
        print(_MSG[0])
    x = np.asarray(out[0]).astype(dtype, copy=False)
    return (to_output(x, mi.on_gpu or b_gpu),) + out[1:]


# ---------------------------------------------------------------------------
# exact solves
# ---------------------------------------------------------------------------

def _permc_ordering(permc_spec) -> str:
    key = permc_spec.upper() if isinstance(permc_spec, str) else permc_spec
    if key not in PERMC_ORDERINGS:
        raise ValueError(f"permc_spec must be one of {list(PERMC_ORDERINGS)}, got {permc_spec!r}")
    return PERMC_ORDERINGS[key]


def _is_csc_or_csr(A) -> bool:
    fmt = getattr(A, "format", None)
    return (sp.issparse(A) or type(A).__module__.startswith("cupyx")) and fmt in ("csc", "csr")


def spsolve(A, b, permc_spec=None, use_umfpack=True, *, backend=None, gpuqr_options=None):
    """Solve the square sparse system ``A x = b`` with SciPy's ``spsolve`` interface.

    An exact solve through sparse QR without rank detection. When R has a
    zero, non-finite or rounding-level diagonal entry
    (:func:`~scipy_gpuqr._factor.lstsq.exactly_singular`), ``MatrixRankWarning``
    ("Matrix is exactly singular") and a NaN result, as SciPy gives.

    Parameters
    ----------
    A : sparse matrix/array, ndarray, CuPy/cupyx; shape (n, n)
        Non-CSC/CSR input warns ``SparseEfficiencyWarning`` like SciPy.
    b : ndarray or sparse, shape (n,), (n, 1) or (n, k)
        A sparse b with k > 1 columns gives a sparse x of A's class.
    permc_spec : {None, 'COLAMD', 'NATURAL', 'MMD_ATA', 'MMD_AT_PLUS_A'}
        Column ordering: None/'COLAMD' → COLAMD, 'NATURAL' → natural,
        'MMD_ATA'/'MMD_AT_PLUS_A' → AMD.
    use_umfpack : bool
        Accepted and ignored.

    Returns
    -------
    x : ndarray or sparse
        dtype ``promote_types(A, b)`` after SciPy's float upcast; shape (n,)
        for a vector b, (n, k) otherwise.
    """
    reason = unsupported_reason(A, b)
    if reason is not None:
        return _fallback("spsolve", reason, A, b, permc_spec=permc_spec,
                         use_umfpack=use_umfpack)
    result_class = sp.csc_array
    if not _is_csc_or_csr(A):
        warnings.warn("spsolve requires A be CSC or CSR matrix format",
                      SparseEfficiencyWarning, stacklevel=2)
    elif sp.issparse(A):
        result_class = type(A)
    mi = as_matrix(A)
    M, N = mi.shape
    if M != N:
        raise ValueError(f"matrix must be square (has shape {(M, N)})")
    if is_cupy_array(b):
        # checked where it lies; solved there too when the factors are on the GPU
        return _spsolve_device_rhs(mi, b, ordering=_permc_ordering(permc_spec),
                                   backend=backend, gpuqr_options=gpuqr_options)
    rhs = spsolve_rhs(b, N)
    dtype = _spsolve_dtype(mi.dtype, rhs.dtype)
    ordering = _permc_ordering(permc_spec)
    if rhs.is_sparse and rhs.fmt != "csc":
        warnings.warn("spsolve is more efficient when sparse b is in the CSC matrix format",
                      SparseEfficiencyWarning, stacklevel=2)
    on_gpu = mi.on_gpu or rhs.on_gpu
    F = QRFactorization(mi, ordering=ordering, tol=None, backend=backend,
                        gpuqr_options=gpuqr_options)
    singular = exactly_singular(F.R, N)
    if singular and rhs.is_sparse:
        raise RuntimeError("Factor is exactly singular")
    if singular:
        warnings.warn("Matrix is exactly singular", MatrixRankWarning, stacklevel=2)
        X = np.full(rhs.B.shape, np.nan)
    else:
        X = F._exact_solve(rhs.B)
    X = X.astype(dtype, copy=False)
    if rhs.is_vector:
        return to_output(X[:, 0], on_gpu)
    if rhs.is_sparse:
        rows, cols = np.nonzero(X.T)
        Xs = result_class((X[cols, rows], (cols, rows)), shape=X.shape, dtype=dtype)
        return to_output(Xs, on_gpu)
    return to_output(X, on_gpu)


def _spsolve_dtype(a_dtype, b_dtype) -> np.dtype:
    """spsolve's result dtype: A's and b's promoted, float64 unless floating."""
    dtype = np.promote_types(a_dtype, b_dtype)
    return dtype if dtype.kind == "f" else np.dtype(np.float64)


def _spsolve_device_rhs(mi, b, *, ordering, backend, gpuqr_options):
    """``spsolve`` for a dense CuPy b: CuPy out, b and x never copied to the host
    when the factorization is on the GPU (else the host solve, then CuPy out)."""
    N = mi.shape[1]
    if b.ndim in (1, 2) and b.shape[0] != N:
        raise ValueError(f"matrix - rhs dimension mismatch (({N}, {N}) - {b.shape[0]})")
    B, _ = device_rhs(b, N)
    is_vector = b.ndim == 1 or b.shape[1] == 1        # SciPy: (n, 1) gives (n,)
    dtype = _spsolve_dtype(mi.dtype, b.dtype)
    F = QRFactorization(mi, ordering=ordering, tol=None, backend=backend,
                        gpuqr_options=gpuqr_options)
    if exactly_singular(F.R, N):
        warnings.warn("Matrix is exactly singular", MatrixRankWarning, stacklevel=3)
        import cupy as cp
        X = cp.full(B.shape, cp.nan)
    elif F._on_device():
        X = F._exact_solve_device(B)
    else:
        X = to_output(F._exact_solve(B.get()), True)
    X = X.astype(dtype, copy=False)
    return X[:, 0] if is_vector else X


def factorized(A, *, backend=None, gpuqr_options=None):
    """Factorize square A once; return a solver ``solve(b, trans='N')``.

    Like SciPy's ``factorized`` without UMFPACK (``splu(A).solve``):
    non-CSC input warns ``SparseEfficiencyWarning``; non-square A raises
    ``ValueError("can only factor square matrices")``; an exactly singular
    A raises ``RuntimeError("Factor is exactly singular")``. The solver takes
    b of shape (n,) or (n, k) and ``trans`` in {'N', 'T', 'H'}; its result
    has A's floating dtype. A b whose dtype does not cast to that dtype by
    NumPy's 'safe' rule (complex b, float64 b for float32 A) raises SuperLU's
    TypeError (:func:`~scipy_gpuqr._validate.check_superlu_cast`).
    """
    reason = unsupported_reason(A)
    if reason is not None:
        return _fallback("factorized", reason, A)
    if not (getattr(A, "format", None) == "csc"
            and (sp.issparse(A) or type(A).__module__.startswith("cupyx"))):
        warnings.warn("splu converted its input to CSC format",
                      SparseEfficiencyWarning, stacklevel=2)
    mi = as_matrix(A)
    M, N = mi.shape
    if M != N:
        raise ValueError("can only factor square matrices")
    F = QRFactorization(mi, tol=None, backend=backend, gpuqr_options=gpuqr_options)
    if exactly_singular(F.R, N):
        raise RuntimeError("Factor is exactly singular")
    dtype, on_gpu_a = mi.dtype, mi.on_gpu

    def solve(b, trans="N"):
        if trans not in ("N", "T", "H"):
            raise ValueError("trans must be N, T, or H")
        check_superlu_cast(b, dtype)
        if is_cupy_array(b) and F._on_device():
            # CuPy in → CuPy out on the device, b and x never copied to the host
            Bd, is_vector = device_rhs(b, N)
            X = F._exact_solve_device(Bd, trans=trans != "N").astype(dtype, copy=False)
            return X[:, 0] if is_vector else X
        B, is_vector, on_gpu = solve_rhs(b, N)
        X = F._exact_solve(B, trans=trans != "N").astype(dtype, copy=False)
        return to_output(X[:, 0] if is_vector else X, on_gpu or on_gpu_a)

    solve.factorization = F
    return solve


# ---------------------------------------------------------------------------
# sparse QR
# ---------------------------------------------------------------------------

class QRResult(NamedTuple):
    """``A[:, perm] ≈ Q @ R`` from :func:`qr`."""

    Q: object
    R: object
    perm: object
    rank: int


_QR_MODES = ("economic", "r", "householder")


def qr(A, *, mode="economic", ordering="colamd", tol="default", backend=None,
       gpuqr_options=None) -> QRResult:
    """Sparse QR factorization with column permutation, ``A[:, perm] ≈ Q @ R``.

    Parameters
    ----------
    A : sparse matrix/array (any format), ndarray, CuPy/cupyx; real, (m, n)
    mode : {'economic', 'r', 'householder'}
        'economic': Q is a sparse m×k matrix (k = rows of R), built by
        applying Q to k identity columns: O(m·k) memory and k Householder
        applications, fine for moderate sizes. 'r': Q is None.
        'householder': Q is an m×m LinearOperator applying the kept
        Householder vectors (``Q @ y``, ``Q.T @ y``, ``Q.H @ y``).
    ordering : {'colamd', 'natural', 'amd', 'metis'}
    tol : 'default', None or float
        'default': SuiteSparseQR's rule ``20·(m+n)·eps·max column 2-norm``
        and the rank it reports; a number sets the tolerance; None turns
        rank detection off (rank = min(m, n)).
    backend : None or str
        None resolves by the usual precedence (options, environment, then
        'auto').

    Returns
    -------
    QRResult(Q, R, perm, rank)
        R is a sparse upper trapezoidal ``csc_array`` (k×n), perm an int64
        column permutation, rank the numerical rank.
    """
    if mode not in _QR_MODES:
        raise ValueError(f"mode must be one of {_QR_MODES}, got {mode!r}")
    if isinstance(A, LinearOperator):
        raise TypeError("qr needs an explicit matrix, not a LinearOperator")
    from .._factor.factorization import _check_tol
    tol = _check_tol(tol)
    mi = as_matrix(A)
    m, n = mi.shape
    plan = plan_factorization(mi.A, backend=backend, gpuqr_options=resolve_options(gpuqr_options),
                              ordering=ordering, dtype=mi.dtype)
    num = plan.factorize(mi.A, tol=tol)
    R = sp.csc_array(num.R)
    k = R.shape[0]
    if mode == "economic":
        E = np.zeros((m, k))
        E[np.arange(min(m, k)), np.arange(min(m, k))] = 1.0
        Qd = np.asarray(num.q_matmul(E)) if k else E
        Q = sp.csc_array(Qd)
        Q.eliminate_zeros()
        Q = to_output(Q, mi.on_gpu)
    elif mode == "r":
        Q = None
    else:
        Q = _householder_operator(num, m, mi.on_gpu)
    perm = np.asarray(num.colperm, dtype=np.int64)
    return QRResult(Q, to_output(R, mi.on_gpu), to_output(perm, mi.on_gpu), int(num.rank))


def _householder_operator(num, m: int, on_gpu: bool):
    """Q of ``qr(mode='householder')`` as a LinearOperator applying the kept reflectors.

    CuPy input gives a ``cupyx.scipy.sparse.linalg.LinearOperator`` (CuPy in →
    CuPy out; on the device for GPU factorizations); otherwise SciPy's.
    """
    on_device = getattr(num, "on_device", None)
    on_device = bool(on_device is not None and on_device())
    if on_gpu:
        import cupy as cp
        from cupyx.scipy.sparse.linalg import LinearOperator as CupyOperator

        def dev(fn):
            if on_device:
                return lambda y: fn(y)
            return lambda y: cp.asarray(fn(cp.asnumpy(y).astype(np.float64)))
        return CupyOperator((m, m), dtype=np.float64,
                            matvec=dev(num.q_matmul), rmatvec=dev(num.qt_matmul),
                            matmat=dev(num.q_matmul), rmatmat=dev(num.qt_matmul))

    def host(fn):
        return lambda y: fn(np.asarray(y, dtype=np.float64))
    return LinearOperator((m, m), dtype=np.float64,
                          matvec=host(num.q_matmul), rmatvec=host(num.qt_matmul),
                          matmat=host(num.q_matmul), rmatmat=host(num.qt_matmul))
