"""Turn what users pass into what we compute on, in one place.

Every entry point (``lsqr``, ``lsmr``, ``spsolve``, ``factorized``, ``qr``,
``QRFactorization``) sends its inputs through these helpers:

* ``A`` — any SciPy sparse matrix or array (every format), a dense ndarray
  or array-like, a ``cupyx.scipy.sparse`` matrix or a CuPy array — becomes a
  fresh canonical ``csc_array`` (duplicates summed, indices sorted, int32 or
  int64 indices as SciPy chooses) in float64. The user's object is never
  modified: we always work on a copy.
* The dtype SciPy would report is kept beside it (:class:`MatrixInput`), so
  the adapters can return SciPy's dtype (float32 stays float32 where SciPy
  keeps it; integers and booleans become float64).
* ``b`` is checked against each entry point's shape rules with SciPy's
  exception types.
* Non-finite values in ``A`` or ``b`` raise ValueError before any work
  (DESIGN.md section 10, like ``scipy.linalg``'s ``check_finite``).

Inputs we do not serve (LinearOperator, complex dtypes, pydata/sparse
arrays) are recognised by :func:`unsupported_reason`; the adapters send them
to SciPy's original function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from ._gpu import is_cupy_array, is_cupy_sparse

__all__ = ["MatrixInput", "as_matrix", "unsupported_reason", "check_finite",
           "lstsq_rhs", "spsolve_rhs", "solve_rhs", "to_output",
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
    return type(x).__module__.split(".")[0] == "sparse" and hasattr(x, "to_scipy_sparse")


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
    if _is_pydata_sparse(A) or any(_is_pydata_sparse(o) for o in others):
        return "pydata/sparse arrays are served by SciPy"
    for name, x in (("A", A),) + tuple(("b", o) for o in others):
        dtype = getattr(x, "dtype", None)
        if dtype is None and x is not None and not sp.issparse(x):
            try:
                dtype = np.asarray(x).dtype
            except Exception:
                dtype = None
        if dtype is not None and np.dtype(dtype).kind == "c":
            return f"complex dtype ({name}: {np.dtype(dtype)}) is not supported yet"
    return None


def _host(x):
    """Host copy of CuPy/cupyx data; other objects pass through."""
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
    A, on_gpu = _host(A)
    if sp.issparse(A):
        fmt = A.format
        sparse_class = type(A)
        dtype = _numeric_dtype_or_raise(A.dtype, name)
        if dtype.kind == "c":
            raise TypeError(f"{name} is complex ({dtype}); complex matrices are "
                            "served by SciPy's original functions")
        if A.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {A.shape}")
        C = sp.csc_array(A.tocsc(copy=True), dtype=np.float64, copy=True)
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


def check_finite(x: np.ndarray, name: str, *, shape: tuple | None = None) -> None:
    """Raise ValueError when ``x`` holds inf or NaN.

    ``shape``: the shape the caller passed, reported in the message when ``x``
    is a reshaped view of it (default ``x.shape``).
    """
    if x.size and not np.all(np.isfinite(x)):
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


def lstsq_rhs(b, m: int, *, func: str = "lsqr") -> tuple[np.ndarray, bool, np.dtype]:
    """``b`` for ``lsqr``/``lsmr``: SciPy's rule ``atleast_1d(b).squeeze()``.

    A sparse ``b`` with one column is accepted (SciPy raises on it; being
    lenient here cannot break code that works with SciPy).

    Returns
    -------
    b : ndarray of float64, shape (m,)
    on_gpu : bool
    dtype : numpy.dtype
        b's own dtype (for the result-dtype rule of lsmr).

    Raises
    ------
    ValueError
        ``dimension mismatch`` (SciPy's message) when b is not (m,) or (m, 1)
        after squeezing, or when it is not numeric or not finite.
    """
    b, on_gpu = _host(b)
    if sp.issparse(b):
        b = b.toarray()
    arr = np.atleast_1d(_dense_numeric(b, "b"))
    if arr.dtype.kind == "c":
        raise TypeError("complex b is served by SciPy's original function")
    orig_shape = arr.shape
    if arr.ndim > 1:
        arr = arr.squeeze()
        arr = np.atleast_1d(arr)
    if arr.shape != (m,):
        raise ValueError(f"dimension mismatch: {func} needs b of shape ({m},) "
                         f"or ({m}, 1) for A with {m} rows, got {orig_shape}")
    check_finite(arr, "b", shape=orig_shape)
    return arr.astype(np.float64), on_gpu, arr.dtype


@dataclass(frozen=True)
class SpsolveRhs:
    """A validated right-hand side for ``spsolve``.

    Attributes
    ----------
    B : ndarray of float64, shape (n, k)
        Dense copy (sparse b densified column block by column block later
        would save memory; for now it is densified once).
    is_vector : bool
        SciPy returns a 1-D x: b was (n,), (n, 1), or a sparse (n, 1).
    is_sparse : bool
        b was sparse with more than one column: x is sparse.
    dtype : numpy.dtype
        b's dtype.
    fmt : str or None
        b's sparse format.
    on_gpu : bool
    """

    B: np.ndarray
    is_vector: bool
    is_sparse: bool
    dtype: np.dtype
    fmt: str | None
    on_gpu: bool


def spsolve_rhs(b, n: int) -> SpsolveRhs:
    """``b`` for ``spsolve`` with SciPy's shape rules and exception types."""
    b, on_gpu = _host(b)
    if sp.issparse(b):
        dtype = b.dtype
        orig_shape = b.shape
        if dtype.kind not in _NUMERIC_KINDS:
            raise ValueError(f"b must be numeric, got dtype {dtype}")
        if b.ndim != 2:
            b = sp.csc_array(b.reshape(-1, 1)) if b.ndim == 1 else b
        if b.shape[0] != n:
            raise ValueError(f"matrix - rhs dimension mismatch (({n}, {n}) - {b.shape[0]})")
        is_vector = b.shape[1] == 1
        B = b.toarray().astype(np.float64)
        check_finite(B, "b", shape=orig_shape)
        return SpsolveRhs(B=B, is_vector=is_vector, is_sparse=not is_vector,
                          dtype=np.dtype(dtype), fmt=b.format, on_gpu=on_gpu)
    arr = _dense_numeric(b, "b")
    if arr.dtype.kind == "c":
        raise TypeError("complex b is served by SciPy's original function")
    if arr.ndim not in (1, 2):
        raise ValueError(f"b must be 1-D or 2-D, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"matrix - rhs dimension mismatch (({n}, {n}) - {arr.shape[0]})")
    is_vector = arr.ndim == 1 or arr.shape[1] == 1
    B = arr.reshape(n, 1 if arr.ndim == 1 else arr.shape[1]).astype(np.float64)
    check_finite(B, "b", shape=arr.shape)
    return SpsolveRhs(B=B, is_vector=is_vector, is_sparse=False,
                      dtype=arr.dtype, fmt=None, on_gpu=on_gpu)


def solve_rhs(b, n: int, *, name: str = "b") -> tuple[np.ndarray, bool, bool]:
    """Dense ``b`` of shape (n,) or (n, k) for ``factorized``/``QRFactorization``.

    Returns
    -------
    B : ndarray of float64, shape (n, k)
    is_vector : bool
        b was 1-D (the result is 1-D).
    on_gpu : bool

    Raises
    ------
    TypeError
        Sparse b (SuperLU.solve's rule).
    ValueError
        Wrong size, too many dimensions, non-numeric or non-finite.
    """
    b, on_gpu = _host(b)
    if sp.issparse(b):
        raise TypeError(f"{name} must be a dense array, got {type(b).__name__}")
    arr = _dense_numeric(b, name)
    if arr.dtype.kind == "c":
        raise TypeError("complex right-hand sides are not supported yet")
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} is of incompatible size: expected {n} rows, "
                         f"got shape {arr.shape}")
    check_finite(arr, name)
    B = arr.reshape(n, 1 if arr.ndim == 1 else arr.shape[1]).astype(np.float64)
    return B, arr.ndim == 1, on_gpu


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


def to_output(x, on_gpu: bool):
    """Return ``x`` as CuPy (dense or cupyx sparse) when the caller used CuPy.

    Notes
    -----
    For now the computation runs on the host and results are copied to the
    current CuPy device; the GPU engine will compute there directly.
    """
    if not on_gpu:
        return x
    from ._gpu import import_cupy
    cp = import_cupy()
    if cp is None:  # cannot happen: the input was CuPy
        return x
    if sp.issparse(x):
        import cupyx.scipy.sparse as csp
        return csp.csc_matrix(sp.csc_matrix(x))
    return cp.asarray(x)
