"""``spsolve`` and ``factorized`` with SciPy's signatures: exact solves of square systems.

SciPy's parameters are an exact prefix of ours; ``backend`` and
``gpuqr_options`` are keyword-only additions. A square A is factorized by a
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

import warnings

import numpy as np
import scipy.sparse as sp
from scipy.sparse import SparseEfficiencyWarning

from .._factor.factored import factorize
from .._factor.factorization import wrap
from .._factor.lstsq import exactly_singular
from .._gpu import is_cupy_array
from .._options import resolve_settings
from .._validate import (SOLVE_RHS, SPSOLVE_RHS, as_matrix, check_rhs, check_superlu_cast,
                         to_output, unsupported_reason)
from .fallback import fallback
from .originals import MatrixRankWarning

__all__ = ["spsolve", "factorized", "PERMC_ORDERINGS"]

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
        return fallback("spsolve", reason, A, b, permc_spec=permc_spec,
                        use_umfpack=use_umfpack)
    result_class = sp.csc_array
    if not _is_sparse_of(A, ("csc", "csr")):
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
    rhs = check_rhs(b, N, SPSOLVE_RHS)
    dtype = _spsolve_dtype(mi.dtype, rhs.dtype)
    ordering = _permc_ordering(permc_spec)
    if rhs.is_sparse and rhs.fmt != "csc":
        warnings.warn("spsolve is more efficient when sparse b is in the CSC matrix format",
                      SparseEfficiencyWarning, stacklevel=2)
    on_gpu = mi.on_gpu or rhs.on_gpu
    F = factorize(mi, resolve_settings(backend, gpuqr_options), ordering=ordering)
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


def _spsolve_device_rhs(mi, b, *, ordering, backend, gpuqr_options):
    """``spsolve`` for a dense CuPy b: CuPy out, b and x never copied to the host
    when the factorization is on the GPU (else the host solve, then CuPy out)."""
    N = mi.shape[1]
    rhs = check_rhs(b, N, SPSOLVE_RHS, on_device=True)
    dtype = _spsolve_dtype(mi.dtype, rhs.dtype)
    F = factorize(mi, resolve_settings(backend, gpuqr_options), ordering=ordering)
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
        return fallback("factorized", reason, A)
    if not _is_sparse_of(A, ("csc",)):
        warnings.warn("splu converted its input to CSC format",
                      SparseEfficiencyWarning, stacklevel=2)
    mi = as_matrix(A)
    M, N = mi.shape
    if M != N:
        raise ValueError("can only factor square matrices")
    F = factorize(mi, resolve_settings(backend, gpuqr_options))
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
    return solve
