"""The answer behind ``lsqr`` and ``lsmr``: SciPy's iterations, or the minimum-norm solution.

Under backend ``'auto'`` (with ``GpuqrOptions.iterate_first`` on) SciPy's
algorithm runs first with the caller's arguments (:func:`iterate`): our
LSQR/LSMR (:mod:`scipy_gpuqr._iterative`) on the caller's own matrix, so that
on the CPU the result is SciPy's bit for bit, or over CuPy on a GPU, watched by
``auto``'s rule (:mod:`scipy_gpuqr._dispatch.iterate_first`). When SciPy's
convergence tests stop it, its tuple is the answer. Otherwise, and always
under an explicit backend, ``min ‖[A; damp·I] x − [b; 0]‖`` is solved from the
starting point x0 for the correction ``dx = x − x0`` by a direct sparse QR of A
(or of ``[A; damp·I]``) and the solve rules of :mod:`scipy_gpuqr._factor.lstsq`
(:func:`solve_least_squares`); the norms SciPy's functions report are computed
from the final correction, and the entry points (:mod:`scipy_gpuqr._api.lsqr`)
turn them into SciPy's tuples.

Inputs are checked once (:func:`check_problem`), as
:func:`scipy_gpuqr._validate.as_matrix` checks them, but the canonical copy
of A the QR needs is made only when the QR runs: SciPy's iterations multiply
with the caller's own matrix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from .._dispatch.iterate_first import (CONVERGED, Allowance, analysis_seconds, needs_watching,
                                       zero_tolerances)
from .._dispatch.lu_route import SUBSPACE_GPU_PLAN_REASON
from .._dispatch.placement import iterate_on_gpu
from .._gpu import gpu_available, import_cupy, is_cupy_array, is_cupy_sparse
from .._iterative import lsmr as iterative_lsmr
from .._iterative import lsqr as iterative_lsqr
from .._iterative._common import _compressed_products
from .._iterative.host import host_problem
from .._options import Settings, log_decision
from .._trusted_csc import csc_of
from .._validate import (LSTSQ_RHS, MatrixInput, as_matrix, check_damp, check_rhs, check_x0,
                         device_csr, scipy_float_dtype, to_output)
from .factored import FactoredQR, factorize, plan_for
from .host_norms import frobenius_norm, norm2
from .lstsq import KnownNorms, MinNormSolver, device_subspace_takes, host_factors_sigma_pays
from .native import at_hand as sweeps_at_hand

__all__ = ["LeastSquaresProblem", "check_problem", "StoppingRules", "IterativeAnswer",
           "LstsqStart", "LstsqAnswer", "DampedNorms", "damped_norms", "start", "start_problem",
           "vector_norm",
           "trivial_answer", "iterate", "settle", "solve_least_squares", "acond_estimate", "variance",
           "VARIANCE_DENSE_LIMIT"]

_EPS = float(np.finfo(np.float64).eps)

#: Largest m·n of a wide problem whose variances come from a dense pseudo-inverse.
VARIANCE_DENSE_LIMIT = 4_000_000

#: Sparse formats whose ``data`` array holds every stored value (checked in place).
_DATA_FORMATS = ("csr", "csc", "coo", "bsr")

_CSC_CLASSES = (sp.csc_array, sp.csc_matrix)


# ---------------------------------------------------------------------------
# the checked problem

@dataclass
class LeastSquaresProblem:
    """A checked ``lsqr``/``lsmr`` problem.

    Attributes
    ----------
    A : matrix
        The operand of SciPy's iterations: the caller's own object wherever
        SciPy would multiply with it (any SciPy sparse format, an ndarray, a
        cupyx matrix or CuPy array), else the canonical copy.
    shape : (int, int)
    nnz : int
        Stored entries of A (all entries of a dense A).
    dtype : numpy.dtype
        SciPy's floating dtype of A.
    on_gpu : bool
        The caller passed CuPy/cupyx data (results go back as CuPy).
    b : ndarray or cupy.ndarray, shape (m,), float64
        On the device only when the caller's b was.
    b_dtype : numpy.dtype
        The caller's b's dtype (SciPy's result-dtype rules).
    x0 : ndarray or cupy.ndarray of shape (n,), or None
    damp : float
    """

    A: object
    shape: tuple
    nnz: int
    dtype: np.dtype
    on_gpu: bool
    b: object
    b_dtype: np.dtype
    x0: object
    damp: float
    _mi: Optional[MatrixInput] = field(default=None, repr=False)
    _qr: Optional[MatrixInput] = field(default=None, repr=False)
    _Ad: object = field(default=None, repr=False)

    def matrix(self) -> MatrixInput:
        """The canonical float64 CSC copy of A (made once, on the host)."""
        if self._mi is None:
            self._mi = _canonical_copy(self.A) or as_matrix(self.A)
        return self._mi

    def qr_matrix(self) -> MatrixInput:
        """What the QR factorizes: A, or ``[A; damp·I]`` with damping."""
        if self._qr is None:
            mi = self.matrix()
            if self.damp != 0:
                n = self.shape[1]
                M = sp.vstack([mi.A, self.damp * sp.eye_array(n, format="csc")], format="csc")
                mi = MatrixInput(A=sp.csc_array(M), dtype=mi.dtype, on_gpu=False,
                                 was_sparse=True, fmt="csc", sparse_class=sp.csc_array)
            self._qr = mi
        return self._qr

    def host_b(self) -> np.ndarray:
        return _host(self.b)

    @property
    def b_on_device(self) -> bool:
        """b lies on a CUDA device (the caller's CuPy b): the QR's answer stays there."""
        return is_cupy_array(self.b)

    def device_matrix(self):
        """A as a float64 cupyx CSR matrix on the current device: the caller's own
        (cupyx) matrix when it is one, else the canonical copy uploaded once."""
        if self._Ad is None:
            import cupyx.scipy.sparse as csp        # optional dependency: b is CuPy
            A = self.A
            if is_cupy_sparse(A):
                A = A.tocsr()
                self._Ad = A if A.dtype == np.float64 else A.astype(np.float64)
            elif is_cupy_array(A):
                self._Ad = csp.csr_matrix(A.astype(np.float64))
            else:
                self._Ad = device_csr(self.matrix().A)
        return self._Ad

    def host_x0(self) -> Optional[np.ndarray]:
        return None if self.x0 is None else _host(self.x0)


def _host(v) -> np.ndarray:
    return v.get() if is_cupy_array(v) else v


def _canonical_copy(A) -> Optional[MatrixInput]:
    """:func:`~scipy_gpuqr._validate.as_matrix` of a SciPy CSC float64 A already in
    canonical format with finite values: a copy of its three arrays, without
    SciPy's format conversions; None for any other A (``as_matrix`` answers;
    also for a ``csc_matrix`` with 64-bit indices, which its conversion narrows)."""
    if type(A) not in _CSC_CLASSES or A.dtype != np.float64 or not A.has_canonical_format:
        return None
    if type(A) is sp.csc_matrix and A.indices.dtype != np.int32:
        return None
    if not np.isfinite(A.data).all():
        return None
    C = csc_of(A.data.copy(), A.indices.copy(), A.indptr.copy(), A.shape)
    C.has_canonical_format = True
    return MatrixInput(A=C, dtype=np.dtype(np.float64), on_gpu=False, was_sparse=True,
                       fmt="csc", sparse_class=type(A))


def _as_given(A) -> tuple[object, int] | None:
    """``(A, nnz)`` when :func:`~scipy_gpuqr._validate.as_matrix` would accept A, seen
    without copying it; None when only ``as_matrix`` can tell (it then raises, or copies).

    Formats whose ``data`` array holds every value are checked in place: a
    numeric real dtype, two dimensions, finite values (on the device for
    CuPy data: one flag read back).
    """
    if is_cupy_sparse(A) or is_cupy_array(A):
        data, xp = (A.data if is_cupy_sparse(A) else A), import_cupy()
    elif sp.issparse(A) and A.format in _DATA_FORMATS:
        data, xp = A.data, np
    elif isinstance(A, np.ndarray):
        data, xp = A, np
    else:
        return None
    if getattr(A, "ndim", 2) != 2 or data.dtype.kind not in "biuf":
        return None
    if data.size and not bool(xp.isfinite(data).all()):
        return None
    nnz = int(A.nnz) if hasattr(A, "nnz") else int(A.size)
    return A, nnz


def _device_x0(x0, n: int):
    """A CuPy ``x0`` checked on its device (the rules of :func:`check_x0`), float64 (n,)."""
    cp = import_cupy()
    arr = cp.atleast_1d(x0)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"x0 must be numeric, got dtype {arr.dtype}")
    if arr.ndim > 1:
        arr = cp.atleast_1d(arr.squeeze())
    if arr.shape != (n,):
        raise ValueError(f"dimension mismatch: x0 must have shape ({n},), got {x0.shape}")
    if not bool(cp.isfinite(arr).all()):
        bad = int(cp.count_nonzero(~cp.isfinite(arr)))
        raise ValueError(f"x0 (shape {x0.shape}) contains {bad} non-finite value(s) "
                         "(inf or NaN)")
    return arr.astype(np.float64)


def check_problem(A, b, x0, damp, *, func: str) -> LeastSquaresProblem:
    """Check ``lsqr``/``lsmr``'s A, b, x0 and damp, in that order, with SciPy's errors.

    The checks and messages are those of :func:`~scipy_gpuqr._validate.as_matrix`,
    :func:`~scipy_gpuqr._validate.check_rhs` (:data:`~scipy_gpuqr._validate.LSTSQ_RHS`),
    :func:`~scipy_gpuqr._validate.check_x0` and
    :func:`~scipy_gpuqr._validate.check_damp`. CuPy b and x0 (1-D, or a b of one
    column) are checked on their device and stay there.
    """
    given = _as_given(A)
    if given is None:
        mi = as_matrix(A)
        keep = sp.issparse(A) or (isinstance(A, np.ndarray) and A.dtype.kind in "biuf")
        operand, nnz = (A, int(A.nnz) if sp.issparse(A) else int(np.size(A))) if keep \
            else (mi.A, int(mi.A.nnz))
        shape, dtype, on_gpu = mi.shape, mi.dtype, mi.on_gpu
    else:
        operand, nnz = given
        mi = None
        shape = tuple(int(s) for s in A.shape)
        dtype = scipy_float_dtype(A.dtype)
        on_gpu = is_cupy_sparse(A) or is_cupy_array(A)
    m, n = shape
    device_b = is_cupy_array(b) and (b.ndim == 1 or (b.ndim == 2 and b.shape[1] == 1))
    rhs = check_rhs(b, m, LSTSQ_RHS, func=func, on_device=device_b)
    if is_cupy_array(x0) and (device_b or on_gpu):
        x0v = _device_x0(x0, n)
    else:
        x0v = check_x0(x0, n)
    return LeastSquaresProblem(A=operand, shape=shape, nnz=nnz, dtype=dtype,
                               on_gpu=on_gpu or rhs.on_gpu, b=rhs.B[:, 0],
                               b_dtype=np.dtype(rhs.dtype), x0=x0v,
                               damp=check_damp(damp), _mi=mi)


class StoppingRules(NamedTuple):
    """The caller's stopping arguments of ``lsqr``/``lsmr``."""

    atol: float
    btol: float
    conlim: float
    iter_lim: Optional[int]     # lsqr's iter_lim, lsmr's maxiter
    calc_var: bool = False


# ---------------------------------------------------------------------------
# SciPy's iterations

class IterativeAnswer(NamedTuple):
    """SciPy's tuple from its own algorithm, as SciPy returns it, and which solver ran where."""

    result: tuple       # lsqr's 10-tuple or lsmr's 8-tuple; x (and var) NumPy or CuPy
    who: str            # e.g. 'LSQR on CPU'


def _default_iter_lim(method: str, shape) -> int:
    m, n = shape
    return 2 * n if method == "lsqr" else min(m, n)


def iterate(problem: LeastSquaresProblem, method: str, rules: StoppingRules,
            settings: Settings, own=None, square=None
            ) -> tuple[Optional[IterativeAnswer], object, str]:
    """SciPy's algorithm within ``auto``'s allowance (:mod:`~scipy_gpuqr._dispatch.iterate_first`).

    Our LSQR/LSMR (:mod:`scipy_gpuqr._iterative`) runs with the caller's
    arguments on the caller's own matrix: on the CPU its result is SciPy's
    bit for bit; on a GPU (:func:`~scipy_gpuqr._dispatch.placement.iterate_on_gpu`)
    over CuPy. Its tuple is the answer when SciPy's convergence tests stop
    it (or the start is already exact, or the QR cannot run at all).

    Parameters
    ----------
    problem : LeastSquaresProblem
    method : {'lsqr', 'lsmr'}
    rules : StoppingRules
    settings : Settings
        Only ``'auto'`` with ``iterate_first`` on iterates.
    own : (callable, str), optional
        ``(run, why)``: SciPy's own function for a run on the CPU where ours
        would not be SciPy's bit for bit (``why`` says which argument);
        ``run(iter_lim)`` returns SciPy's tuple, or None where SciPy refused
        the arguments (ours then runs). It runs unwatched (SciPy's functions
        take no callback).
    square : SquareLU, optional
        The exact answer by SuperLU of a square A
        (:mod:`scipy_gpuqr._api.square_lu`), which the rule may factorize
        while the run goes on (:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`).

    Returns
    -------
    answer : IterativeAnswer or None
        SciPy's answer, or None: the QR answers.
    planned : (M, Plan) or None
        The factorization's plan when the rule made it.
    why : object
        What happened, for the log: its ``str()`` is the text (formatted only
        when the log is written).
    """
    if settings.backend != "auto":
        return None, None, f"backend {settings.backend!r} from {settings.source}"
    if not settings.options.iterate_first:
        return None, None, "GpuqrOptions(iterate_first=False)"
    zero = zero_tolerances(rules.atol, rules.btol, rules.conlim)
    if zero:
        return None, None, zero
    m, n = problem.shape
    iter_lim = (_default_iter_lim(method, problem.shape) if rules.iter_lim is None
                else int(rules.iter_lim))
    if iter_lim <= 0:
        return None, None, f"iteration limit {iter_lim}: SciPy's run stops before it starts"
    on_device, where = iterate_on_gpu(m, n, problem.nnz, on_gpu=problem.on_gpu)
    xp = import_cupy() if on_device else np
    name = f"{method.upper()} on {'GPU' if on_device else 'CPU'}"
    damped = problem.damp != 0                 # the QR factorizes [A; damp·I]
    analysis = analysis_seconds(m + (n if damped else 0), n,
                                problem.nnz + (n if damped else 0))
    watch = Allowance(iter_lim=iter_lim, atol=rules.atol, conlim=rules.conlim,
                      analysis=analysis, plan=lambda: plan_for(problem.qr_matrix(), settings),
                      order=n if damped else min(m, n),
                      square=None if on_device else square, nnz=problem.nnz,
                      dense_gpu=gpu_available, device_subspace=device_subspace_takes,
                      host_sweeps=sweeps_at_hand, host_sigma=host_factors_sigma_pays,
                      plan_gpu=lambda: plan_for(problem.qr_matrix(), settings,
                                                gpu_reason=SUBSPACE_GPU_PLAN_REASON))
    out = None
    if own is not None and not on_device:
        run, reason = own
        t0 = time.perf_counter()
        out = run(iter_lim)
    if out is not None:
        how = _RunNote(out[1], out[2], time.perf_counter() - t0,
                       f"{where}; SciPy's own function ({reason})", None)
        name = f"SciPy's {method} on CPU"
        if settle(how, name, None) == "qr":
            return None, None, how
        return IterativeAnswer(tuple(out), name), None, how
    A, b, x0 = _operands(problem, on_device)
    host_loop = not on_device and host_problem(A, b, x0, np) is not None
    callback = watch if needs_watching(iter_lim, m, n, problem.nnz, on_gpu=on_device,
                                       analysis=analysis, host_loop=host_loop) else None
    t0 = time.perf_counter()
    try:
        if method == "lsqr":
            res = iterative_lsqr(A, b, problem.damp, rules.atol, rules.btol, rules.conlim,
                                 iter_lim, False, rules.calc_var, x0, xp=xp, callback=callback)
        else:
            res = iterative_lsmr(A, b, problem.damp, rules.atol, rules.btol, rules.conlim,
                                 iter_lim, False, x0, xp=xp, callback=callback)
    except MemoryError as exc:
        if not on_device:
            raise
        return None, watch.planned, f"{name} ran out of memory ({exc}); {where}"
    seconds = time.perf_counter() - t0
    how = _RunNote(res.istop, res.itn, seconds, where, watch if callback else None)
    outcome = settle(how, name, watch)
    if outcome == "qr":
        return None, watch.planned, how
    return (IterativeAnswer(_scipy_result(res, problem, method), name),
            watch.planned if outcome == "scipy" else None, how)


def settle(how: "_RunNote", name: str, watch) -> str:
    """Who answers a finished run, with the log's prefix set on ``how``.

    ``'scipy'``: SciPy's tests stopped it (or the start was already exact),
    its tuple answers. ``'stands'``: it did not converge but the QR cannot run
    (the plan said so), so SciPy's tuple answers all the same. ``'qr'``: the
    QR answers (``istop`` 3, 6, 7, or ``auto``'s rule stopped the run).
    ``watch`` is the run's :class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`
    (None: unwatched).
    """
    istop = how.istop
    if istop in CONVERGED or (istop == 0 and how.itn == 0):
        how.prefix = "" if istop else "x0 (or 0) is exact: "
        return "scipy"
    if watch is not None and watch.plan_error is not None:
        how.prefix = "the QR cannot run, so SciPy's answer stands: "
        return "stands"
    stopped = (f"stopped by auto's rule: {watch.reason}" if istop == 0 else
               {3: "stopped: the condition estimate reached conlim",
                6: "stopped: the condition estimate reached 1/eps",
                7: "stopped: the iteration limit was reached"}.get(istop, f"istop {istop}"))
    how.prefix = f"{name} {stopped}; "
    return "qr"


class _RunNote:
    """What a run did, for the decision log: formatted only when the log is written
    (a millisecond call would otherwise spend tens of microseconds on it)."""

    def __init__(self, istop: int, itn: int, seconds: float, where: str, watch):
        self.istop, self.itn, self.seconds, self.where, self.watch = istop, itn, seconds, where, \
            watch
        self.prefix = ""

    def __str__(self) -> str:
        w = self.watch
        return (f"{self.prefix}istop {self.istop} after {self.itn} iterations in "
                f"{self.seconds:.3g} s"
                + (f" ({w.analysis_s:.3g} s of it analysing)" if w is not None and w.analysis_s
                   else "")
                + f"; {self.where}; "
                + (w.summary() if w is not None else "unwatched: too short for the rule to act"))


def _scipy_result(res, problem: LeastSquaresProblem, method: str) -> tuple:
    """The plain SciPy tuple of a run, its arrays where the caller's data was."""
    out = list(res.scipy_tuple())
    for k in ((0, 9) if method == "lsqr" else (0,)):
        if problem.on_gpu:
            out[k] = to_output(out[k], True) if isinstance(out[k], np.ndarray) else out[k]
        elif is_cupy_array(out[k]):
            out[k] = out[k].get()
    return tuple(out)


def _operands(problem: LeastSquaresProblem, on_device: bool):
    """A, b and x0 for the iterations (CuPy data is copied to the host only to run there)."""
    if on_device or not problem.on_gpu:
        return problem.A, problem.b, problem.x0
    A = problem.matrix().A if (is_cupy_sparse(problem.A) or is_cupy_array(problem.A)) \
        else problem.A
    return A, problem.host_b(), problem.host_x0()


# ---------------------------------------------------------------------------
# the direct answer

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


def _products(A):
    """``(v ↦ A v, u ↦ Aᵀ u)`` on float64 host vectors: SciPy's own kernels called as
    ``A @ v`` and ``A.T @ u`` call them for a float64 CSR/CSC A (the same bits,
    without the transpose's object and the operator's dispatch, which cost more than
    the product on a small A), else those operators."""
    products = _compressed_products(A)
    if products is None:
        return A.__matmul__, (lambda u: A.T @ u)
    return products


def start(A, b: np.ndarray, x0: Optional[np.ndarray]) -> LstsqStart:
    """The correction problem of ``A x ≈ b`` from ``x0`` (None: from 0)."""
    bnorm = norm2(b)
    matvec, rmatvec = _products(A)
    r0 = b if x0 is None else b - matvec(x0)
    beta = bnorm if x0 is None else norm2(r0)
    alfa = norm2(rmatvec(r0)) if beta > 0 else 0.0
    return LstsqStart(r0, bnorm, beta, alfa)


def start_problem(problem: LeastSquaresProblem) -> LstsqStart:
    """:func:`start` of a checked problem, where its b lies: on the device for a CuPy b
    (``r0`` a CuPy vector, A used as :meth:`LeastSquaresProblem.device_matrix`;
    only the three norms come to the host), else on the host."""
    if not problem.b_on_device:
        return start(problem.matrix().A, problem.b, problem.host_x0())
    cp = import_cupy()
    x0 = problem.x0
    if x0 is not None and not is_cupy_array(x0):
        x0 = cp.asarray(x0, dtype=np.float64)
    Ad = problem.device_matrix()
    b = problem.b
    bnorm = float(cp.linalg.norm(b))
    r0 = b if x0 is None else b - Ad @ x0
    beta = float(cp.linalg.norm(r0))
    alfa = float(cp.linalg.norm(Ad.T @ r0)) if beta > 0 else 0.0
    return LstsqStart(r0, bnorm, beta, alfa)


def vector_norm(v) -> float:
    """‖v‖₂ of a NumPy or CuPy vector, as a Python float."""
    if is_cupy_array(v):
        return float(import_cupy().linalg.norm(v))
    return norm2(v)


class LstsqAnswer(NamedTuple):
    """A least-squares answer of the QR and the norms SciPy reports with it."""

    x: np.ndarray
    dx: np.ndarray
    r1norm: float
    r2norm: float
    anorm: float
    acond: float
    arnorm: float
    bnorm: float
    var: Optional[np.ndarray]
    factorization: Optional[FactoredQR]     # None for a trivial problem or a dense answer
    itn: int = 0
    who: str = ""                           # who answered, where no factorization did
                                            # ('' for the QR's and a trivial answer)


class DampedNorms(NamedTuple):
    """Norms of the damped problem ``min ‖r0 − A dx‖² + damp²‖dx‖²`` at ``dx``."""

    r1norm: float   # ‖r0 − A dx‖
    r2norm: float   # sqrt(r1norm² + damp²‖dx‖²)
    anorm: float    # ‖[A; damp·I]‖_F
    arnorm: float   # ‖Aᵀr − damp²·dx‖


def damped_norms(A, r0: np.ndarray, dx: np.ndarray, damp: float) -> DampedNorms:
    """The residual norms SciPy's lsqr/lsmr report, computed from ``dx``."""
    matvec, rmatvec = _products(A)
    r = r0 - matvec(dx)
    r1norm = norm2(r)
    return DampedNorms(
        r1norm, float(np.hypot(r1norm, damp * norm2(dx))),
        float(np.sqrt(frobenius_norm(A) ** 2 + damp ** 2 * A.shape[1])),
        norm2(rmatvec(r) - damp ** 2 * dx))


def trivial_answer(begin: LstsqStart, x0: Optional[np.ndarray], n: int) -> LstsqAnswer:
    """The answer of a ``trivial`` problem: x0 (or 0), as SciPy's lsqr gives it (CuPy
    arrays when ``begin`` was made on the device)."""
    xp = import_cupy() if is_cupy_array(begin.r0) else np
    if x0 is not None and xp is np:
        x0 = _host(x0)
    x = xp.zeros(n) if x0 is None else xp.array(x0, dtype=np.float64)
    return LstsqAnswer(x, xp.zeros(n), begin.beta, begin.beta, 0.0, 0.0, 0.0, begin.bnorm,
                       xp.zeros(n), None)


def solve_least_squares(problem: LeastSquaresProblem, begin: LstsqStart, *, calc_var: bool,
                        settings: Settings, planned=None,
                        known: Optional[KnownNorms] = None) -> LstsqAnswer:
    """The minimum-norm least-squares answer of a non-trivial problem, by the sparse QR.

    Parameters
    ----------
    problem : LeastSquaresProblem
    begin : LstsqStart
        :func:`start` of the problem (on the canonical A); not ``trivial``.
    calc_var : bool
        Compute ``diag(pinv(AᵀA + damp²I))`` exactly.
    settings : Settings
        The call's resolved settings.
    planned : (M, Plan), optional
        The plan made while iterating (:func:`iterate`), reused.
    known : KnownNorms, optional
        A's norms learnt before the QR (a square A's LU), for the rank decision;
        read only where the QR factors A itself (no damping, A not wide).
    """
    mi = problem.matrix()
    A, n, damp = mi.A, problem.shape[1], problem.damp
    Mi = problem.qr_matrix()
    if damp != 0 or problem.shape[0] < n:
        known = None
    F = factorize(Mi, settings, tol=None, planned=planned, known=known)
    if is_cupy_array(begin.r0):
        return _device_answer(problem, begin, F, Mi, calc_var=calc_var)
    r0 = begin.r0
    x0 = problem.host_x0()
    x_start = np.zeros(n) if x0 is None else x0.copy()
    rhs = np.concatenate([r0, np.zeros(n)]) if damp != 0 else r0
    dx = F.least_squares(rhs[:, None])[:, 0]
    norms = damped_norms(A, r0, dx, damp)
    acond = acond_estimate(F.rank_decision(), norms.anorm)
    var = variance(F, Mi.A) if calc_var else np.zeros(n)
    return LstsqAnswer(x_start + dx, dx, norms.r1norm, norms.r2norm, norms.anorm, acond,
                       norms.arnorm, begin.bnorm, var, F)


def _device_answer(problem: LeastSquaresProblem, begin: LstsqStart, F: FactoredQR, Mi,
                   *, calc_var: bool) -> LstsqAnswer:
    """:func:`solve_least_squares` for a b on the device: CuPy x (and dx, var).

    Where the factors are on the GPU and lstsq's rule finds R of full rank
    (:meth:`~scipy_gpuqr._factor.factored.FactoredQR.device_least_squares_ok`),
    b, r0, dx and x never leave the device; only norms come to the host.
    Otherwise the rank rules run on the host (:mod:`scipy_gpuqr._factor.lstsq`):
    r0 goes there and the correction comes back.
    """
    cp = import_cupy()
    n, damp = problem.shape[1], problem.damp
    r0 = begin.r0
    rhs = cp.concatenate([r0, cp.zeros(n)]) if damp != 0 else r0
    rhs = cp.ascontiguousarray(rhs[:, None], dtype=np.float64)
    if F.device_least_squares_ok(rhs):
        dx = F.device_least_squares(rhs)[:, 0]
    else:
        rh = r0.get()
        rhs = np.concatenate([rh, np.zeros(n)]) if damp != 0 else rh
        dx = cp.asarray(F.least_squares(rhs[:, None])[:, 0])
    Ad = problem.device_matrix()
    r = r0 - Ad @ dx
    r1norm = float(cp.linalg.norm(r))
    dxnorm = float(cp.linalg.norm(dx))
    anorm = float(np.sqrt(frobenius_norm(problem.matrix().A) ** 2 + damp ** 2 * n))
    arnorm = float(cp.linalg.norm(Ad.T @ r - damp ** 2 * dx))
    acond = acond_estimate(F.rank_decision(), anorm)
    var = cp.asarray(variance(F, Mi.A)) if calc_var else cp.zeros(n)
    x0 = problem.x0
    x = dx.copy() if x0 is None else cp.asarray(x0, dtype=np.float64) + dx
    return LstsqAnswer(x, dx, r1norm, float(np.hypot(r1norm, damp * dxnorm)), anorm, acond,
                       arnorm, begin.bnorm, var, F)


def log_answer(method: str, problem: LeastSquaresProblem, who: str, why: str) -> None:
    """The decision line of one ``lsqr``/``lsmr`` call: who answered, and why."""
    m, n = problem.shape
    log_decision("%s %dx%d nnz=%d: %s answered; %s", method, m, n, problem.nnz, who, why)


def acond_estimate(solver: MinNormSolver, anorm: float) -> float:
    """cond(Abar) estimate ``‖Abar‖_F / σ_min(kept)``, from the rank decision."""
    s = solver
    if s.method in ("empty", "zero") or s.rank == 0:
        return 0.0
    smin = s.sigma_min
    if not (smin > 0) and s.rcond == s.rcond and s.rcond > 0:
        smin = s.rcond * _norm1(s.R)  # 1/‖R⁻¹‖₁, within a factor sqrt(q) of σ_min
    if not (smin > 0):
        smin = s.cutoff * s.sigma_max
    return anorm / smin if smin > 0 else np.inf


def _norm1(R) -> float:
    """‖R‖₁ (the largest column sum of magnitudes) of a sparse R, from its arrays
    when it is CSC (no sparse copies; the column sums are SciPy's, in its order)."""
    if type(R) not in _CSC_CLASSES:
        R = sp.csc_array(R)
    if not R.nnz:
        return 0.0
    indptr = R.indptr
    filled = (indptr[1:] != indptr[:-1]).nonzero()[0]
    return float(np.add.reduceat(np.abs(R.data), indptr[filled]).max())


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
