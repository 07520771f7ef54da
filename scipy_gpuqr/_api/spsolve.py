"""``spsolve`` and ``factorized`` with SciPy's signatures: exact solves of square systems.

SciPy's parameters are an exact prefix of ours; ``backend`` and
``gpuqr_options`` are keyword-only additions.

Who answers
    Under ``auto`` (the default, what patched code gets) SciPy's own
    function (SuperLU, the original saved in :mod:`scipy_gpuqr._api.originals`)
    answers unless the GPU sparse QR is faster: at once for a system below
    :data:`~scipy_gpuqr._dispatch.plan.SUPERLU_ALWAYS_NNZ` stored entries
    (the GPU not even asked: our own work stays a few microseconds beside
    SciPy's call) or without a GPU, else when the QR analysis' arithmetic
    intensity is below the threshold calibrated against SuperLU
    (:func:`scipy_gpuqr._dispatch.plan.spsolve_threshold`). Its answer is
    SciPy's: the same x bits, warnings and exceptions, except that inf/NaN
    in A or b raise ValueError first (DESIGN §10) and an input SciPy would
    change in place (duplicate entries it sums) is given to it as a copy.
    CuPy input always stays on the device with the QR. The decision is
    logged (logger ``scipy_gpuqr``): ``SuperLU (SciPy) answered: <why>`` or
    ``QR on GPU: <why>``.

The QR
    At or above the threshold, and always for explicit backends (``gpu``,
    ``cpu``, ``reference``, ``simulate``), a square A is factorized by a
    sparse QR without rank detection (:mod:`scipy_gpuqr._factor.factored`);
    an exactly singular one (:func:`scipy_gpuqr._factor.lstsq.exactly_singular`)
    gets SciPy's ``MatrixRankWarning`` and NaN (``spsolve``) or its
    RuntimeError (``factorized``). SciPy's format warnings
    (``SparseEfficiencyWarning``) and messages are kept. Inputs we do not serve
    go to SciPy's original function (:mod:`scipy_gpuqr._api.fallback`).

CuPy in → CuPy out; a dense CuPy b on GPU factors is checked and solved on
the device, never copied to the host.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.sparse import SparseEfficiencyWarning

from .._dispatch import plan as dispatch_plan
from .._dispatch.plan import (SIZE_GATE_REASON, SUPERLU, Plan, plan_factorization,
                              superlu_at_once)
from .._factor.factored import FactoredQR, factorize, released
from .._factor.factorization import wrap
from .._factor.lstsq import exactly_singular
from .._factor.rank_refine import factorizer, with_rank_detection
from .._gpu import is_cupy_array, is_cupy_sparse
from .._options import (ENV_VERBOSE, auto_source, getenv, log_decision, logger,
                        resolve_settings)
from .._validate import (SOLVE_RHS, SPSOLVE_RHS, all_finite, as_matrix, check_finite,
                         check_rhs, check_superlu_cast, to_output, unsupported_reason)
from .fallback import fallback
from .originals import MatrixRankWarning, original, spsolve_gssv

__all__ = ["spsolve", "factorized", "PERMC_ORDERINGS", "spsolve_probe"]

#: True while SciPy's own ``spsolve`` answers one of our calls. SciPy's spsolve
#: solves a sparse b of several columns with ``factorized(A)`` looked up in its
#: module, which is ours once SciPy is patched; that inner call is part of
#: SciPy's answer, so SciPy's ``factorized`` serves it (no second decision).
#: Context-local: set and reset around that one call.
_SCIPY_ANSWERING = contextvars.ContextVar("scipy_gpuqr_scipy_answering", default=False)

_F64 = np.dtype(np.float64)

#: Sparse formats whose ``data`` holds exactly the stored entries.
_DATA_FORMATS = ("csr", "csc", "coo", "bsr")

#: SciPy's CSR/CSC classes: the input SciPy's spsolve and factorized take as it is.
_COMPRESSED = (sp.csr_array, sp.csr_matrix, sp.csc_array, sp.csc_matrix)

#: The decision line of a small system SuperLU answers at once (formatted only when
#: logged): ``superlu_at_once``'s text, with the settings' source, A's entries, the gate.
_SMALL_SYSTEM_LOG = "spsolve: SuperLU (SciPy) answered: backend 'auto' from %s; " + \
    SIZE_GATE_REASON

#: SciPy's permc_spec → our column ordering (MMD_* → AMD: SuperLU's minimum
#: degree on AᵀA or Aᵀ+A; AMD is the same family).
PERMC_ORDERINGS = {None: "colamd", "COLAMD": "colamd", "NATURAL": "natural",
                   "MMD_ATA": "amd", "MMD_AT_PLUS_A": "amd"}


def _permc_ordering(permc_spec) -> str:
    key = permc_spec.upper() if isinstance(permc_spec, str) else permc_spec
    if key not in PERMC_ORDERINGS:
        raise ValueError(f"permc_spec must be one of {list(PERMC_ORDERINGS)}, got {permc_spec!r}")
    return PERMC_ORDERINGS[key]


def _is_sparse_of(A, formats) -> bool:
    """A is a SciPy or cupyx sparse matrix in one of ``formats``."""
    fmt = getattr(A, "format", None)
    return (sp.issparse(A) or type(A).__module__.startswith("cupyx")) and fmt in formats


def _spsolve_dtype(a_dtype, b_dtype) -> np.dtype:
    """spsolve's result dtype: A's and b's promoted, float64 unless floating."""
    dtype = np.promote_types(a_dtype, b_dtype)
    return dtype if dtype.kind == "f" else np.dtype(np.float64)


def _on_device(A, b=None) -> bool:
    """A or b is CuPy/cupyx data (SciPy cannot take it: the QR answers on the device)."""
    for x in (A, b):
        # the module's name first: it rules out NumPy and SciPy objects at once
        if type(x).__module__.startswith("cupy") and (is_cupy_array(x) or is_cupy_sparse(x)):
            return True
    return False


def _check_finite_as_given(x, name: str) -> None:
    """DESIGN §10's ValueError for inf/NaN in A or b, before SciPy converts x.

    Reads the stored values of a sparse x (``data``, or a COO copy for
    formats whose ``data`` is not just the entries) or a dense x as NumPy
    sees it; non-floating data cannot be non-finite and is left to SciPy's
    own checks, as is anything NumPy cannot read.
    """
    if type(x) is np.ndarray:
        data = x
    elif sp.issparse(x):
        data = x.data if x.format in _DATA_FORMATS else x.tocoo().data
    else:
        try:
            data = np.asarray(x)
        except Exception:           # noqa: BLE001 - SciPy raises its own error for it
            return
    if not all_finite(data):
        check_finite(data, name, shape=x.shape if sp.issparse(x) else data.shape)


def _check_finite_castable(b, dtype) -> None:
    """:func:`_check_finite_as_given` for the b of SciPy's ``factorized`` solver, only
    where SuperLU's TypeError (b does not cast safely to ``dtype``) does not come first."""
    if type(b) is np.ndarray:
        arr = b
    else:
        try:
            arr = np.asarray(b)
        except Exception:           # noqa: BLE001 - SciPy raises its own error for it
            return
    if (arr.dtype.kind in "fc" and (arr.dtype == dtype or np.can_cast(arr.dtype, dtype,
                                                                      casting="safe"))
            and not all_finite(arr)):
        check_finite(arr, "b")


def _superlu_dtype(dtype) -> np.dtype:
    """The dtype of SciPy's SuperLU factors of an A of ``dtype`` (SciPy's ``_asfptype``:
    float32/64 and complex stay, others become the first of them they cast to safely)."""
    dtype = np.dtype(dtype)
    if dtype.char in "fdFD":
        return dtype
    return next((np.dtype(c) for c in "fdFD" if np.can_cast(dtype, c)), np.dtype(np.float64))


def _unshared(A, formats):
    """A, or a copy where SciPy would sum its duplicate entries in place.

    SciPy's ``spsolve`` (CSC/CSR A) and ``splu`` (CSC A) call
    ``A.sum_duplicates()`` on the caller's own matrix; inputs are never
    modified here, so a non-canonical one is handed over as a copy (the
    same values, the same result bits).
    """
    if sp.issparse(A) and A.format in formats and not A.has_canonical_format:
        return A.copy()
    return A


def _superlu_source(A, backend, gpuqr_options):
    """Where ``auto`` came from, for a call SciPy's SuperLU answers at once seen from A alone,
    or None.

    The common call: a SciPy CSR/CSC A of real values and fewer than
    :data:`~scipy_gpuqr._dispatch.plan.SUPERLU_ALWAYS_NNZ` entries (read from
    its module at each call, like :func:`~scipy_gpuqr._dispatch.plan.superlu_at_once`), no
    options object, ``auto`` named, from the environment or by default
    (:func:`~scipy_gpuqr._options.auto_source`: the environment read once).
    The general path would reach the same answer (SciPy's) through checks
    that cannot fail for such an A; this skips them.
    """
    if gpuqr_options is not None or type(A) not in _COMPRESSED:
        return None
    if A.data.dtype.kind not in "biuf" or \
            not int(A.indptr[-1]) < dispatch_plan.SUPERLU_ALWAYS_NNZ:
        return None
    return auto_source(backend)


def _scipy_vector_solve(A, b, permc_spec, use_umfpack, nnz):
    """SciPy's ``spsolve(A, b)`` for canonical CSR/CSC A and a dense b, as SciPy answers it.

    For float64 A and a float64 vector b of A's order, SciPy's ``spsolve``
    converts nothing and makes one call of SuperLU's ``gssv``
    (:func:`~scipy_gpuqr._api.originals.spsolve_gssv`); that call is made
    here with SciPy's arguments (the same x bits, SciPy's singular-matrix
    warning and NaN), without the Python around it, which on a system of a
    few hundred unknowns costs as much as our own checks. Every other input
    (another dtype, a 2-D b, a shape SciPy rejects, UMFPACK) goes to SciPy's
    ``spsolve`` itself. ``nnz``: A's stored entries (``A.indptr[-1]``, read by the caller).
    """
    n = A.shape[0]
    gssv = None
    # float64 by identity with NumPy's own descriptor (a dtype equal to it but not it,
    # rare, takes SciPy's call; comparing with the type np.float64 converts it first)
    if (b.ndim == 1 and A.shape[1] == n and b.shape[0] == n and A.data.dtype is _F64
            and b.dtype is _F64):
        gssv = spsolve_gssv(use_umfpack)
    if gssv is None:
        return original("spsolve")(A, b, permc_spec, use_umfpack)
    x, info = gssv(n, nnz, A.data, A.indices.astype(np.intc, copy=False),
                   A.indptr.astype(np.intc, copy=False), b, 1 if A.format == "csc" else 0,
                   options={"ColPerm": permc_spec})
    if info != 0:
        warnings.warn("Matrix is exactly singular", MatrixRankWarning, stacklevel=3)
        x.fill(np.nan)
    return x


def _decisions_shown() -> bool:
    """Whether a decision logged now would be seen: the ``scipy_gpuqr`` logger takes
    INFO, or ``SCIPY_GPUQR_VERBOSE`` is set (what :func:`~scipy_gpuqr._options.log_decision`
    then does with it), read at each call: the short calls skip the formatting and
    the look-ups of a decision nobody reads, which from cold caches cost as much as
    a tenth of SciPy's call on a small system."""
    return logger.isEnabledFor(logging.INFO) or getenv(ENV_VERBOSE) is not None


def _superlu_info(source: str, why: str) -> dict:
    """``solve.info`` of a ``factorized`` SciPy's SuperLU answers at once (the summary of
    its plan: :meth:`~scipy_gpuqr._dispatch.plan.Plan.summary` of a SuperLU plan)."""
    return {"backend": SUPERLU, "requested": "auto", "source": source,
            "reasons": [why, "SciPy's SuperLU answers"], "ordering": "colamd",
            "analyze_time": 0.0}


def _scipy_spsolve(A, b, permc_spec, use_umfpack):
    """SciPy's own ``spsolve`` answers (its result, warnings and exceptions)."""
    _check_finite_as_given(A, "A")
    _check_finite_as_given(b, "b")
    A = _unshared(A, ("csc", "csr"))
    if not sp.issparse(b):
        # SciPy's spsolve calls factorized only for a sparse b
        return original("spsolve")(A, b, permc_spec=permc_spec, use_umfpack=use_umfpack)
    token = _SCIPY_ANSWERING.set(True)
    try:
        return original("spsolve")(A, b, permc_spec=permc_spec, use_umfpack=use_umfpack)
    finally:
        _SCIPY_ANSWERING.reset(token)


def _scipy_factorized(A, info: dict):
    """SciPy's own ``factorized(A)`` answers, its solver wrapped to check b's values.

    The solver's results and exceptions are those of SciPy's (``splu(A).solve``:
    ``trans``, 2-D b, its TypeError for b that does not cast safely, which
    is checked before the values); ``factorization`` is SciPy's ``SuperLU``
    object and ``info`` says why SciPy answered.
    """
    _check_finite_as_given(A, "A")
    scipy_solve = original("factorized")(_unshared(A, ("csc",)))
    dtype = _superlu_dtype(A.dtype if sp.issparse(A) else np.asarray(A).dtype)

    def solve(b, trans="N"):
        # no reference to solve itself here: a cycle would keep the factors alive
        # until the garbage collector runs
        on_gpu = is_cupy_array(b)
        if on_gpu:
            b = b.get()             # CuPy in → CuPy out, as the QR's host solve gives it
        if not sp.issparse(b):
            _check_finite_castable(b, dtype)
        x = scipy_solve(b, trans)
        return to_output(x, True) if on_gpu else x

    solve.__doc__ = getattr(scipy_solve, "__doc__", None)
    solve.factorization = getattr(scipy_solve, "__self__", None)
    solve.info = info
    return solve


def spsolve_probe(A, analysis, backend: str):
    """``run(num)``: the exact solve ``spsolve`` runs on a factorization ``num`` of
    square A (its singularity test and one right-hand side, the host solve of a
    NumPy b), for the calibration of the threshold against SuperLU
    (``square_solve=`` of :func:`scipy_gpuqr._dispatch.calibrate.calibrate_sparse`)."""
    b = np.asarray(A @ np.ones(A.shape[1]), dtype=np.float64)[:, None]

    own = factorizer(backend)[0]            # any factorization but A's: the backend itself

    def run(num):
        plan = Plan(backend=backend, requested=backend, source="calibration",
                    analysis=analysis, factorize_fn=own).with_factors(A, num)
        F = FactoredQR(as_matrix(A), (A, plan))
        if not exactly_singular(F.num.R, A.shape[1]):
            F.exact_solve(b)

    return run


def _plan_square(mi, settings, ordering, *, cpu_side):
    """``(M, plan)`` for factorizing square A (as :func:`~scipy_gpuqr._factor.factored.plan_for`
    gives it), ``auto`` weighing the GPU against SciPy's SuperLU when ``cpu_side='superlu'``
    (the plan's backend is then ``'superlu'`` where SciPy should answer)."""
    M = mi.A
    M.sort_indices()
    plan = plan_factorization(M, settings, ordering=ordering, dtype=mi.dtype,
                              cpu_side=cpu_side)
    if plan.backend != SUPERLU:
        plan = dataclasses.replace(plan, factorize_fn=with_rank_detection(plan.factorize_fn,
                                                                          plan.backend))
    return M, plan


def spsolve(A, b, permc_spec=None, use_umfpack=True, *, backend=None, gpuqr_options=None):
    """Solve the square sparse system ``A x = b`` with SciPy's ``spsolve`` interface.

    Under ``auto`` SciPy's own ``spsolve`` (SuperLU) answers unless a GPU is
    present and the QR analysis' arithmetic intensity reaches the threshold
    calibrated against SuperLU: then, and for every explicit backend, an
    exact solve through sparse QR without rank detection. When R has a
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
        SuperLU's column ordering when SciPy answers; for the QR
        None/'COLAMD' → COLAMD, 'NATURAL' → natural,
        'MMD_ATA'/'MMD_AT_PLUS_A' → AMD.
    use_umfpack : bool
        Passed to SciPy when it answers; ignored by the QR.
    backend : {None, 'auto', 'gpu', 'cpu', 'reference', 'simulate'}
        Keyword only; see :class:`~scipy_gpuqr.GpuqrOptions`.
    gpuqr_options : GpuqrOptions, dict or None
        Keyword only; ``spsolve_threshold`` sets the threshold against SuperLU.

    Returns
    -------
    x : ndarray or sparse
        dtype ``promote_types(A, b)`` after SciPy's float upcast; shape (n,)
        for a vector b, (n, k) otherwise.
    """
    if type(b) is np.ndarray and gpuqr_options is None and type(A) in _COMPRESSED:
        # the common call, SciPy's SuperLU at once below the size gate (written out
        # here rather than through _superlu_source: each call level costs
        # microseconds from cold caches beside a 50 µs SciPy call)
        # item(): a Python int at once (no NumPy scalar); backend named 'auto' is
        # auto_source's first answer, without its call
        data, nnz, gate = A.data, A.indptr.item(-1), dispatch_plan.SUPERLU_ALWAYS_NNZ
        source = (("keyword" if backend == "auto" else auto_source(backend))
                  if nnz < gate and data.dtype.kind in "biuf" and b.dtype.kind in "biuf"
                  else None)
        if source is not None:
            if _decisions_shown():
                log_decision(_SMALL_SYSTEM_LOG, source, nnz, gate)
            # SciPy's call for CSR/CSC A and a dense b (no sparse b: no inner factorized)
            if not all_finite(data):
                check_finite(data, "A", shape=A.shape)
            if not all_finite(b):
                check_finite(b, "b")
            if not A.has_canonical_format:
                A = A.copy()            # SciPy would sum the caller's duplicates in place
                A.sum_duplicates()      # as SciPy's spsolve does, on our copy
                nnz = A.indptr.item(-1)
            return _scipy_vector_solve(A, b, permc_spec, use_umfpack, nnz)
    reason = unsupported_reason(A, b)
    if reason is not None:
        return fallback("spsolve", reason, A, b, permc_spec=permc_spec,
                        use_umfpack=use_umfpack)
    settings = resolve_settings(backend, gpuqr_options)
    on_device = _on_device(A, b)
    if not on_device:
        why = superlu_at_once(settings, A)
        if why is not None:
            log_decision("spsolve: SuperLU (SciPy) answered: %s", why)
            return _scipy_spsolve(A, b, permc_spec, use_umfpack)
    ordering = _permc_ordering(permc_spec)
    result_class = sp.csc_array
    csx = _is_sparse_of(A, ("csc", "csr"))
    if csx and sp.issparse(A):
        result_class = type(A)
    mi = as_matrix(A)
    M, N = mi.shape
    if M != N:
        if not csx:
            warnings.warn("spsolve requires A be CSC or CSR matrix format",
                          SparseEfficiencyWarning, stacklevel=2)
        raise ValueError(f"matrix must be square (has shape {(M, N)})")
    planned = _plan_square(mi, settings, ordering, cpu_side="qr" if on_device else SUPERLU)
    if planned[1].backend == SUPERLU:
        return _scipy_spsolve(A, b, permc_spec, use_umfpack)
    if not csx:
        warnings.warn("spsolve requires A be CSC or CSR matrix format",
                      SparseEfficiencyWarning, stacklevel=2)
    if is_cupy_array(b):
        # checked where it lies; solved there too when the factors are on the GPU
        return _spsolve_device_rhs(mi, b, settings, planned)
    rhs = check_rhs(b, N, SPSOLVE_RHS)
    dtype = _spsolve_dtype(mi.dtype, rhs.dtype)
    if rhs.is_sparse and rhs.fmt != "csc":
        warnings.warn("spsolve is more efficient when sparse b is in the CSC matrix format",
                      SparseEfficiencyWarning, stacklevel=2)
    on_gpu = mi.on_gpu or rhs.on_gpu
    with released(factorize(mi, settings, planned=planned)) as F:
        singular = exactly_singular(F.num.R, N)
        if singular and rhs.is_sparse:
            raise RuntimeError("Factor is exactly singular")
        if singular:
            warnings.warn("Matrix is exactly singular", MatrixRankWarning, stacklevel=2)
            X = np.full(rhs.B.shape, np.nan)
        else:
            X = F.exact_solve(rhs.B)
        X = X.astype(dtype, copy=False)
        if rhs.is_vector:
            return to_output(X[:, 0], on_gpu)
        if rhs.is_sparse:
            rows, cols = np.nonzero(X.T)
            Xs = result_class((X[cols, rows], (cols, rows)), shape=X.shape, dtype=dtype)
            return to_output(Xs, on_gpu)
        return to_output(X, on_gpu)


def _spsolve_device_rhs(mi, b, settings, planned):
    """``spsolve`` for a dense CuPy b: CuPy out, b and x never copied to the host
    when the factorization is on the GPU (else the host solve, then CuPy out)."""
    N = mi.shape[1]
    rhs = check_rhs(b, N, SPSOLVE_RHS, on_device=True)
    dtype = _spsolve_dtype(mi.dtype, rhs.dtype)
    with released(factorize(mi, settings, planned=planned)) as F:
        if exactly_singular(F.num.R, N):
            warnings.warn("Matrix is exactly singular", MatrixRankWarning, stacklevel=3)
            import cupy as cp               # optional dependency: b is CuPy
            X = cp.full(rhs.B.shape, cp.nan)
        elif F.on_device():
            X = F.exact_solve_device(rhs.B)
        else:
            X = to_output(F.exact_solve(rhs.B.get()), True)
        X = X.astype(dtype, copy=False)
        return X[:, 0] if rhs.is_vector else X


def factorized(A, *, backend=None, gpuqr_options=None):
    """Factorize square A once; return a solver ``solve(b, trans='N')``.

    Under ``auto``, below the threshold against SuperLU (at once without a
    GPU), SciPy's own ``factorized(A)`` answers: the solver gives its
    results and exceptions, ``solve.factorization`` is SciPy's ``SuperLU``
    object. Otherwise, and for every explicit backend, the sparse QR, like
    SciPy's ``factorized`` without UMFPACK (``splu(A).solve``):
    non-CSC input warns ``SparseEfficiencyWarning``; non-square A raises
    ``ValueError("can only factor square matrices")``; an exactly singular
    A raises ``RuntimeError("Factor is exactly singular")``. The solver takes
    b of shape (n,) or (n, k) and ``trans`` in {'N', 'T', 'H'}; its result
    has A's floating dtype. A b whose dtype does not cast to that dtype by
    NumPy's 'safe' rule (complex b, float64 b for float32 A) raises SuperLU's
    TypeError (:func:`~scipy_gpuqr._validate.check_superlu_cast`);
    ``solve.factorization`` is the :class:`~scipy_gpuqr.QRFactorization`.
    Either way ``solve.info`` says what answered and why.
    """
    source = _superlu_source(A, backend, gpuqr_options)
    if source is not None:              # SciPy's SuperLU answers at once
        if _SCIPY_ANSWERING.get():
            # SciPy's own spsolve (answering one of our calls) factorizes a sparse b's A
            return original("factorized")(A)
        why = f"backend 'auto' from {source}; " + SIZE_GATE_REASON % (
            A.indptr[-1], dispatch_plan.SUPERLU_ALWAYS_NNZ)
        log_decision("factorized: SuperLU (SciPy) answered: %s", why)
        return _scipy_factorized(A, _superlu_info(source, why))
    reason = unsupported_reason(A)
    if reason is not None:
        return fallback("factorized", reason, A)
    if _SCIPY_ANSWERING.get():
        return original("factorized")(A)
    settings = resolve_settings(backend, gpuqr_options)
    on_device = _on_device(A)
    if not on_device:
        why = superlu_at_once(settings, A)
        if why is not None:
            log_decision("factorized: SuperLU (SciPy) answered: %s", why)
            info = Plan(backend=SUPERLU, requested=settings.backend, source=settings.source,
                        reasons=[why, "SciPy's SuperLU answers"]).summary()
            return _scipy_factorized(A, info)
    csc = _is_sparse_of(A, ("csc",))
    mi = as_matrix(A)
    M, N = mi.shape
    if M != N:
        if not csc:
            warnings.warn("splu converted its input to CSC format",
                          SparseEfficiencyWarning, stacklevel=2)
        raise ValueError("can only factor square matrices")
    planned = _plan_square(mi, settings, None, cpu_side="qr" if on_device else SUPERLU)
    if planned[1].backend == SUPERLU:
        return _scipy_factorized(A, planned[1].summary())
    if not csc:
        warnings.warn("splu converted its input to CSC format",
                      SparseEfficiencyWarning, stacklevel=2)
    F = factorize(mi, settings, planned=planned)
    if exactly_singular(F.num.R, N):
        raise RuntimeError("Factor is exactly singular")
    dtype, on_gpu_a = mi.dtype, mi.on_gpu

    def solve(b, trans="N"):
        if trans not in ("N", "T", "H"):
            raise ValueError("trans must be N, T, or H")
        check_superlu_cast(b, dtype)
        if is_cupy_array(b) and F.on_device():
            # CuPy in → CuPy out on the device, b and x never copied to the host
            rhs = check_rhs(b, N, SOLVE_RHS, on_device=True)
            X = F.exact_solve_device(rhs.B, trans=trans != "N").astype(dtype, copy=False)
            return X[:, 0] if rhs.is_vector else X
        rhs = check_rhs(b, N, SOLVE_RHS)
        X = F.exact_solve(rhs.B, trans=trans != "N").astype(dtype, copy=False)
        return to_output(X[:, 0] if rhs.is_vector else X, rhs.on_gpu or on_gpu_a)

    solve.factorization = wrap(F)
    solve.info = solve.factorization.info
    return solve
