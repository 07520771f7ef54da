"""Turn what users pass into what we compute on, in one place.

Every entry point (``lsqr``, ``lsmr``, ``spsolve``, ``factorized``, ``qr``,
``QRFactorization``) sends its inputs through these helpers:

* ``A`` — any SciPy sparse matrix or array (every format), a dense ndarray
  or array-like, a ``cupyx.scipy.sparse`` matrix or a CuPy array — becomes a
  fresh canonical ``csc_array`` (duplicates summed, indices sorted, int32 or
  int64 indices as SciPy chooses) in float64. The user's object is never
  modified: we always work on a copy.
* The dtype SciPy would report is kept beside it (:class:`MatrixInput`), so
  the entry points can return SciPy's dtype (float32 stays float32 where SciPy
  keeps it; integers and booleans become float64).
* ``b`` is checked by one function, :func:`check_rhs`, against the rule of
  its entry point (:data:`LSTSQ_RHS`, :data:`SPSOLVE_RHS`, :data:`SOLVE_RHS`)
  with SciPy's exception types and messages; a CuPy ``b`` may be checked on
  its device without a copy to the host.
* ``x0``, ``damp`` and ``tol`` have their own small checks.
* Non-finite values in ``A`` or ``b`` raise ValueError before any work (like
  ``scipy.linalg``'s ``check_finite``).

Inputs we do not serve (LinearOperator, complex dtypes, pydata/sparse
arrays) are recognised by :func:`unsupported_reason`; the entry points send
them to SciPy's original function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.linalg.blas import ddot as _ddot
from scipy.sparse.linalg import LinearOperator

from ._gpu import import_cupy, is_cupy_array, is_cupy_sparse

__all__ = ["MatrixInput", "as_matrix", "unsupported_reason", "to_host", "SMALL_FINITE_CHECK",
           "DOT_FINITE_CHECK", "all_finite", "check_finite",
           "check_x0", "check_damp", "check_tol", "RhsRule", "Rhs", "LSTSQ_RHS",
           "SPSOLVE_RHS", "SOLVE_RHS", "check_rhs", "check_superlu_cast", "to_output", "device_csr",
           "scipy_float_dtype"]

_NUMERIC_KINDS = "biuf"


@dataclass(frozen=True)
class MatrixInput:
    """A validated matrix and what we remember about the caller's object.

    Attributes
    ----------
    A : scipy.sparse.csc_array
        Canonical float64 copy (sorted indices, no duplicates).
    dtype : numpy.dtype
        The floating dtype SciPy would compute in (float32 or float64).
    on_gpu : bool
        The caller passed CuPy/cupyx data (results go back as CuPy).
    was_sparse : bool
        The caller passed a sparse matrix or array.
    fmt : str or None
        The caller's sparse format ('csc', 'csr', 'coo', ...), None if dense.
    sparse_class : type or None
        The caller's SciPy sparse class (e.g. ``csr_matrix``); for cupyx
        input, the SciPy class of the host copy.
    """

    A: sp.csc_array
    dtype: np.dtype
    on_gpu: bool
    was_sparse: bool
    fmt: str | None
    sparse_class: type | None

    @property
    def shape(self) -> tuple:
        return self.A.shape


def scipy_float_dtype(dtype) -> np.dtype:
    """SciPy's ``_asfptype`` rule: float32 stays, float16 → float32, else float64."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(np.complex64) if dtype == np.complex64 else np.dtype(np.complex128)
    if dtype in (np.float16, np.float32):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _is_pydata_sparse(x) -> bool:
    module = type(x).__module__
    return (module == "sparse" or module.startswith("sparse.")) and hasattr(x, "to_scipy_sparse")


def unsupported_reason(A, *others) -> str | None:
    """Why we cannot serve this input (SciPy's original will), or None.

    Parameters
    ----------
    A : object
        The matrix argument.
    *others : object
        Further array arguments (b, x0) whose dtype matters (complex).
    """
    if isinstance(A, LinearOperator):
        return "A is a LinearOperator (no explicit matrix to factorize)"
    args = (A,) + others
    for x in args:
        if _is_pydata_sparse(x):
            return "pydata/sparse arrays are served by SciPy"
    for i, x in enumerate(args):
        dtype = getattr(x, "dtype", None)
        if dtype is None and x is not None and not sp.issparse(x):
            try:
                dtype = np.asarray(x).dtype
            except Exception:
                dtype = None
        if dtype is not None:
            if not isinstance(dtype, np.dtype):
                dtype = np.dtype(dtype)
            if dtype.kind == "c":
                return f"complex dtype ({'b' if i else 'A'}: {dtype}) is not supported yet"
    return None


def to_host(x):
    """``(x, on_gpu)``: a host copy of CuPy/cupyx data, other objects as they are."""
    if is_cupy_sparse(x) or is_cupy_array(x):
        return x.get(), True
    return x, False


def _numeric_dtype_or_raise(dtype, what: str, exc=TypeError) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in _NUMERIC_KINDS + "c":
        raise exc(f"{what} must have a numeric dtype, got dtype {dtype}")
    return dtype


def as_matrix(A, *, name: str = "A") -> MatrixInput:
    """Validate ``A`` and return a canonical float64 CSC copy.

    Parameters
    ----------
    A : sparse matrix/array, ndarray, array-like, cupyx sparse or CuPy array
        The matrix, 2-D.
    name : str
        Name used in error messages.

    Returns
    -------
    MatrixInput

    Raises
    ------
    TypeError
        Non-numeric data.
    ValueError
        Not 2-D, or non-finite entries.
    """
    A, on_gpu = to_host(A)
    if sp.issparse(A):
        fmt = A.format
        sparse_class = type(A)
        dtype = _numeric_dtype_or_raise(A.dtype, name)
        if dtype.kind == "c":
            raise TypeError(f"{name} is complex ({dtype}); complex matrices are "
                            "served by SciPy's original functions")
        if A.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {A.shape}")
        # one copy: SciPy copies a CSC input itself and converts any other format
        # into new arrays (A.tocsc(copy=True) first made a second copy of CSC input)
        C = sp.csc_array(A, dtype=np.float64, copy=True)
        was_sparse = True
    else:
        fmt = None
        sparse_class = None
        arr = np.asarray(A)
        if arr.dtype.kind == "O":
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{name} has object dtype with non-numeric "
                                f"entries ({exc})") from None
        dtype = _numeric_dtype_or_raise(arr.dtype, name)
        if dtype.kind == "c":
            raise TypeError(f"{name} is complex ({dtype}); complex matrices are "
                            "served by SciPy's original functions")
        if arr.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got shape {arr.shape}")
        C = sp.csc_array(arr.astype(np.float64, copy=False))
        was_sparse = False
    C.sum_duplicates()  # also sorts the indices
    C.sort_indices()
    if not np.all(np.isfinite(C.data)):
        bad = int(np.count_nonzero(~np.isfinite(C.data)))
        raise ValueError(f"{name} (shape {C.shape}) contains {bad} non-finite "
                         "value(s) (inf or NaN)")
    return MatrixInput(A=C, dtype=scipy_float_dtype(dtype), on_gpu=on_gpu,
                       was_sparse=was_sparse, fmt=fmt, sparse_class=sparse_class)


#: Up to this many entries, :func:`all_finite` tests Python floats one by one:
#: from cold caches (a call after the garbage collector has walked the heap)
#: NumPy's ufunc and reduction machinery costs tens of microseconds before it
#: has read one value, far more than the loop over a few dozen floats.
SMALL_FINITE_CHECK = 64
#: NumPy's float64 descriptor (:func:`all_finite` compares by identity).
_F64 = np.dtype(np.float64)
#: Real vectors up to this many entries are checked by their dot product first
#: (below the length where BLAS splits a dot product over threads).
DOT_FINITE_CHECK = 8192


def all_finite(x: np.ndarray) -> bool:
    """Whether every entry of the NumPy array ``x`` is finite (integer and boolean
    arrays are).

    A float64 vector up to :data:`DOT_FINITE_CHECK` entries: its dot product
    with itself first (one BLAS call, the cheapest test from cold caches at
    every length). Otherwise, and when that product is not finite: for a
    small real array (:data:`SMALL_FINITE_CHECK`) ``math.isfinite`` over its
    values, else one ufunc and one C reduction (not ``ndarray.all``'s Python
    wrapper). This runs on every call, beside sub-millisecond SciPy calls.
    """
    dtype = x.dtype
    # x·x is finite only if every entry is (squares cannot cancel an inf, a NaN
    # stays NaN): one BLAS call (SciPy's wrapper, which leaves the floating-point
    # flags alone: no overflow warning), far less code than the ufunc machinery.
    # Not finite: an inf or NaN, or a sum that overflowed; the tests below decide.
    # float64 by identity with NumPy's own descriptor (comparing with the type
    # np.float64 converts it first; an equal descriptor that is not it takes the
    # general tests; BLAS rejects an empty vector).
    if dtype is _F64 and x.ndim == 1 and 0 < x.size <= DOT_FINITE_CHECK \
            and math.isfinite(_ddot(x, x)):
        return True
    kind = dtype.kind
    if kind == "f" and x.size <= SMALL_FINITE_CHECK:
        return all(map(math.isfinite, (x if x.ndim == 1 else x.ravel()).tolist()))
    return kind not in "fc" or bool(np.logical_and.reduce(np.isfinite(x), axis=None))


def check_finite(x: np.ndarray, name: str, *, shape: tuple | None = None) -> None:
    """Raise ValueError when ``x`` holds inf or NaN.

    ``shape``: the shape the caller passed, reported in the message when ``x``
    is a reshaped view of it (default ``x.shape``).
    """
    if not all_finite(x):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        shown = x.shape if shape is None else tuple(shape)
        raise ValueError(f"{name} (shape {shown}) contains {bad} non-finite "
                         "value(s) (inf or NaN)")


def _dense_numeric(b, name: str) -> np.ndarray:
    """``b`` as an ndarray of a numeric kind (complex included: each caller
    answers complex b with its own TypeError); ValueError otherwise."""
    arr = np.asarray(b)
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} has non-numeric entries ({exc})") from None
    if arr.dtype.kind not in _NUMERIC_KINDS + "c":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return arr


def check_x0(x0, n: int) -> np.ndarray | None:
    """``x0`` of ``lsqr``/``lsmr``: None, or float64 of shape (n,) (SciPy squeezes it).

    Raises
    ------
    ValueError
        Not numeric, not of n entries after squeezing, or not finite.
    """
    if x0 is None:
        return None
    x0, _ = to_host(x0)
    arr = np.atleast_1d(np.asarray(x0))
    if arr.dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"x0 must be numeric, got dtype {arr.dtype}")
    if arr.ndim > 1:
        arr = np.atleast_1d(arr.squeeze())
    if arr.shape != (n,):
        raise ValueError(f"dimension mismatch: x0 must have shape ({n},), got {np.shape(x0)}")
    check_finite(arr, "x0", shape=np.shape(x0))
    return arr.astype(np.float64)


def check_damp(damp) -> float:
    """``damp`` of ``lsqr``/``lsmr`` as a finite float (ValueError otherwise)."""
    damp = float(damp)
    if not np.isfinite(damp):
        raise ValueError(f"damp must be finite, got {damp!r}")
    return damp


def check_tol(tol):
    """The rank-detection ``tol`` of ``qr``/``QRFactorization``: None, 'default' or a float >= 0."""
    if tol is None or (isinstance(tol, str) and tol == "default"):
        return tol
    if isinstance(tol, str):
        raise ValueError(f"tol must be 'default', None or a number >= 0, got {tol!r}")
    value = float(tol)
    if not (value >= 0 and np.isfinite(value)):
        raise ValueError(f"tol must be 'default', None or a finite number >= 0, got {tol!r}")
    return value


@dataclass(frozen=True)
class RhsRule:
    """How one family of entry points reads its right-hand side (SciPy's rules for it).

    Attributes
    ----------
    sparse : {'densify', 'keep', 'reject'}
        A sparse b is densified (``lsqr``/``lsmr``), kept as sparse (``spsolve``:
        x is sparse when b has several columns), or refused with TypeError
        (``SuperLU.solve``'s rule, for ``factorized`` and ``QRFactorization.solve``).
    squeeze : bool
        SciPy's ``atleast_1d(b).squeeze()`` and a b of exactly (n,) after it
        (``lsqr``/``lsmr``); otherwise b is 1-D or 2-D with n rows.
    column_is_vector : bool
        A b of shape (n, 1) gives a 1-D x (``spsolve``).
    complex_message : str
        The TypeError's message for complex b.
    mismatch : str
        The ValueError's message for a b of the wrong size; formatted with
        ``n``, ``rows`` (b's), ``shape`` (b's), ``func`` and ``name``.
    """

    sparse: str
    squeeze: bool
    column_is_vector: bool
    complex_message: str
    mismatch: str


#: ``lsqr``/``lsmr``: b of shape (m,) or (m, 1), sparse accepted.
LSTSQ_RHS = RhsRule(
    sparse="densify", squeeze=True, column_is_vector=True,
    complex_message="complex b is served by SciPy's original function",
    mismatch="dimension mismatch: {func} needs b of shape ({n},) or ({n}, 1) "
             "for A with {n} rows, got {shape}")

#: ``spsolve``: b of shape (n,), (n, 1) or (n, k), dense or sparse.
SPSOLVE_RHS = RhsRule(
    sparse="keep", squeeze=False, column_is_vector=True,
    complex_message="complex b is served by SciPy's original function",
    mismatch="matrix - rhs dimension mismatch (({n}, {n}) - {rows})")

#: ``factorized``'s solver and ``QRFactorization.solve``: dense b of shape (n,) or (n, k).
SOLVE_RHS = RhsRule(
    sparse="reject", squeeze=False, column_is_vector=False,
    complex_message="complex right-hand sides are not supported yet",
    mismatch="{name} is of incompatible size: expected {n} rows, got shape {shape}")


@dataclass(frozen=True)
class Rhs:
    """A validated right-hand side.

    Attributes
    ----------
    B : ndarray or cupy.ndarray of float64, shape (n, k)
        A copy; CuPy when b was checked on its device (``on_device=True``).
    is_vector : bool
        x is 1-D (b was (n,), or (n, 1) where the rule says so).
    is_sparse : bool
        b was sparse with several columns and the rule keeps it sparse: x is sparse.
    dtype : numpy.dtype
        b's own dtype (result-dtype rules).
    fmt : str or None
        b's sparse format.
    on_gpu : bool
        The caller passed CuPy/cupyx data.
    """

    B: object
    is_vector: bool
    is_sparse: bool
    dtype: np.dtype
    fmt: str | None
    on_gpu: bool


def check_rhs(b, n: int, rule: RhsRule, *, name: str = "b", func: str = "",
              on_device: bool = False) -> Rhs:
    """Check a right-hand side against ``rule`` with SciPy's exception types and messages.

    Parameters
    ----------
    b : array_like, sparse, CuPy or cupyx
        The caller's right-hand side.
    n : int
        Rows b must have.
    rule : RhsRule
        :data:`LSTSQ_RHS`, :data:`SPSOLVE_RHS` or :data:`SOLVE_RHS`.
    name : str
        b's name in messages.
    func : str
        The entry point's name in messages (``lsqr``/``lsmr``).
    on_device : bool
        b is a dense CuPy array to be checked and kept on its device (the
        finiteness check reads back one flag, never b); it is never copied
        to the host.

    Returns
    -------
    Rhs

    Raises
    ------
    TypeError
        Complex b; sparse b where the rule refuses it.
    ValueError
        Non-numeric, of the wrong size or dimension, or non-finite b.
    """
    if on_device:
        return _device_rhs(b, n, rule, name)
    b, on_gpu = to_host(b)
    if sp.issparse(b):
        if rule.sparse == "reject":
            raise TypeError(f"{name} must be a dense array, got {type(b).__name__}")
        if rule.sparse == "keep":
            return _sparse_rhs(b, n, rule, name, on_gpu)
        b = b.toarray()
    arr = _dense_numeric(b, name)
    if rule.squeeze:
        arr = np.atleast_1d(arr)
    if arr.dtype.kind == "c":
        raise TypeError(rule.complex_message)
    shape = arr.shape
    if rule.squeeze:
        if arr.ndim > 1:
            arr = np.atleast_1d(arr.squeeze())
        if arr.shape != (n,):
            raise ValueError(rule.mismatch.format(n=n, rows=shape[0], shape=shape,
                                                  func=func, name=name))
        is_vector = True
    else:
        _check_rhs_ndim(arr.ndim, shape, name)
        if shape[0] != n:
            raise ValueError(rule.mismatch.format(n=n, rows=shape[0], shape=shape,
                                                  func=func, name=name))
        is_vector = arr.ndim == 1 or (rule.column_is_vector and shape[1] == 1)
    B = arr.reshape(n, 1 if arr.ndim == 1 else arr.shape[1]).astype(np.float64)
    check_finite(B, name, shape=shape)
    return Rhs(B=B, is_vector=is_vector, is_sparse=False, dtype=arr.dtype, fmt=None,
               on_gpu=on_gpu)


def _check_rhs_ndim(ndim: int, shape: tuple, name: str) -> None:
    """b of ``spsolve``/``factorized`` is 1-D or 2-D: SciPy's ValueError and message
    ("object too deep for desired array", NumPy's) for more dimensions."""
    if ndim > 2:
        raise ValueError("object too deep for desired array")
    if ndim < 1:
        raise ValueError(f"{name} must be 1-D or 2-D, got shape {shape}")


def _sparse_rhs(b, n: int, rule: RhsRule, name: str, on_gpu: bool) -> Rhs:
    """A sparse b kept sparse (``spsolve``): x is sparse when b has several columns."""
    dtype = b.dtype
    shape = b.shape
    if dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"{name} must be numeric, got dtype {dtype}")
    if b.ndim != 2:
        b = sp.csc_array(b.reshape(-1, 1)) if b.ndim == 1 else b
    if b.shape[0] != n:
        raise ValueError(rule.mismatch.format(n=n, rows=b.shape[0], shape=shape, func="",
                                              name=name))
    is_vector = b.shape[1] == 1
    B = b.toarray().astype(np.float64)
    check_finite(B, name, shape=shape)
    return Rhs(B=B, is_vector=is_vector, is_sparse=not is_vector, dtype=np.dtype(dtype),
               fmt=b.format, on_gpu=on_gpu)


def _device_rhs(b, n: int, rule: RhsRule, name: str) -> Rhs:
    """A dense CuPy b checked where it lies (same rules and messages as on the host)."""
    xp = import_cupy()
    if b.dtype.kind == "c":
        raise TypeError(rule.complex_message)
    if b.dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"{name} must be numeric, got dtype {b.dtype}")
    _check_rhs_ndim(b.ndim, b.shape, name)
    if b.shape[0] != n:
        raise ValueError(rule.mismatch.format(n=n, rows=b.shape[0], shape=b.shape, func="",
                                              name=name))
    if b.size and not bool(xp.isfinite(b).all()):
        bad = int(xp.count_nonzero(~xp.isfinite(b)))
        raise ValueError(f"{name} (shape {b.shape}) contains {bad} non-finite "
                         "value(s) (inf or NaN)")
    B = xp.ascontiguousarray(b.reshape(n, -1) if b.ndim == 2 else b.reshape(n, 1),
                             dtype=np.float64)
    is_vector = b.ndim == 1 or (rule.column_is_vector and b.shape[1] == 1)
    return Rhs(B=B, is_vector=is_vector, is_sparse=False, dtype=np.dtype(b.dtype),
               fmt=None, on_gpu=True)


def check_superlu_cast(b, dtype) -> None:
    """SuperLU.solve's dtype rule for ``factorized``'s b: NumPy's 'safe' cast.

    SciPy's ``factorized`` (SuperLU; scikit-umfpack is not consulted) converts
    b to A's floating dtype with ``casting='safe'`` and raises NumPy's
    TypeError when that cannot be done: complex b with real A, float64 or
    int64 b with float32 A, non-numeric b. The same type and message are
    raised here, before the size checks as SciPy does. b of other than 1 or
    2 dimensions is left to the shape check (SciPy's ValueError comes
    first there).

    Parameters
    ----------
    b : array_like, NumPy or CuPy
        The right-hand side as the caller passed it (sparse b is left alone).
    dtype : numpy.dtype
        The factor's dtype (the solution's).

    Raises
    ------
    TypeError
        ``b``'s dtype does not cast safely to ``dtype``.
    """
    if sp.issparse(b) or is_cupy_sparse(b):
        return
    arr = b if hasattr(b, "dtype") and hasattr(b, "ndim") else np.asarray(b)
    if arr.ndim not in (1, 2):
        return
    if not np.can_cast(arr.dtype, dtype, casting="safe"):
        raise TypeError(f"Cannot cast array data from {np.dtype(arr.dtype)!r} to "
                        f"{np.dtype(dtype)!r} according to the rule 'safe'")


def device_csr(A):
    """Host sparse ``A`` as a float64 cupyx CSR matrix on the current device, its
    canonical-format flag carried over: known on the host, cupyx would otherwise
    check it on the device at the first product or triangular solve, with
    kernels (CUB's) that CuPy compiles on their first use in an environment."""
    import cupyx.scipy.sparse as csp      # optional dependency
    S = sp.csr_matrix(A, dtype=np.float64)
    D = csp.csr_matrix(S)
    if S.has_canonical_format:
        D.has_canonical_format = True
    return D


def to_output(x, on_gpu: bool):
    """Return host data ``x`` as CuPy (dense or cupyx sparse) when the caller used CuPy.

    Results computed on the host go back to the current CuPy device this way;
    results computed on the device are returned as they are by their callers.
    """
    if not on_gpu:
        return x
    cp = import_cupy()
    if cp is None:  # cannot happen: the input was CuPy
        return x
    if sp.issparse(x):
        import cupyx.scipy.sparse as csp      # optional dependency
        return csp.csc_matrix(sp.csc_matrix(x))
    return cp.asarray(x)
