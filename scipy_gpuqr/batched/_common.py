"""Validation and host/device helpers shared by the batched functions.

Used by :mod:`scipy_gpuqr.batched._functions` (fixed-size stacks) and
:mod:`scipy_gpuqr.batched._vbatched` (matrices of different orders): SciPy's
dtype rule, stack validation, the GPU-or-CPU decision, finiteness checks,
batch indices as error messages name them (found on the device for CuPy:
:func:`bad_indices`, :func:`info_counts`), and moves between NumPy and CuPy.
Imports numpy, the package's leaf modules and :mod:`._gpu_common` only (CuPy
lazily).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from . import _gpu_common as gc
from .._gpu import gpu_available, import_cupy, is_cupy_array, is_cupy_sparse
from .._options import ENV_BACKEND, log_decision, resolve_backend

__all__ = ["MAX_NAMED", "NONFINITE", "result_dtype", "use_gpu", "as_stack",
           "batch_names", "check_finite_np", "require_finite", "to_host",
           "to_device", "restore", "gpu_supported", "cupy_stack", "gpu_rhs", "rhs_view",
           "bad_indices", "info_counts"]

#: How many offending indices an error message names.
MAX_NAMED = 10

NONFINITE = "array must not contain infs or NaNs"


#: result_dtype of the dtypes seen so far (the rule is a pure function of the dtype)
_RESULT_DTYPES: dict = {}


def result_dtype(dtype, where: str) -> np.dtype:
    """SciPy's LAPACK dtype rule: f32/f64/c64/c128 kept, f16 → f32, ints → f64."""
    try:
        hit = _RESULT_DTYPES.get(dtype)
    except TypeError:                   # unhashable: not a dtype object
        hit = None
    if hit is not None:
        return hit
    out = _result_dtype(dtype, where)
    if isinstance(dtype, np.dtype):
        _RESULT_DTYPES[dtype] = out
    return out


def _result_dtype(dtype, where: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    if dtype == np.float16:
        return np.dtype(np.float32)
    if dtype.kind in "fc" and dtype.itemsize <= 16 and dtype != np.longdouble:
        return dtype
    if dtype == np.longdouble or dtype == np.clongdouble:
        return np.dtype(np.float64 if dtype.kind == "f" else np.complex128)
    raise ValueError(f"{where}: unsupported array dtype {dtype} "
                     "(expected a real or complex floating or integer type)")


def use_gpu(x, backend, where: str) -> bool:
    """True when the work runs on the GPU (CuPy input, or backend='gpu')."""
    if backend is None and is_cupy_array(x) and not os.environ.get(ENV_BACKEND):
        return True          # the common case, without building the options
    name, source = resolve_backend(backend)
    if is_cupy_array(x):
        if name in ("cpu", "reference", "simulate") and source == "keyword":
            log_decision("%s: CuPy input computed on the CPU (backend=%r)",
                         where, name)
            return False
        return True
    if name == "gpu":
        cp = import_cupy()
        if cp is None or not gpu_available():
            warnings.warn(f"{where}: backend='gpu' requested but no GPU is "
                          "available; computing on the CPU", RuntimeWarning,
                          stacklevel=3)
            return False
        return True
    return False


def as_stack(a, where: str, name: str = "a"):
    """Validate a (..., n, n) stack; return (array on its device, batch shape)."""
    if is_cupy_array(a):
        arr = a
    else:
        if is_cupy_sparse(a) or hasattr(a, "tocsr"):
            raise ValueError(f"{where}: sparse {name} is not supported; pass a "
                             "dense array of shape (..., n, n)")
        arr = np.asarray(a)
        if arr.dtype == object or arr.dtype.kind in "SUVM":
            raise ValueError(f"{where}: {name} must be numeric, got dtype "
                             f"{arr.dtype}")
    check_square_stack(arr.shape, where, name)
    dt = result_dtype(arr.dtype, where)
    if arr.dtype != dt:
        arr = arr.astype(dt)
    return arr, tuple(arr.shape[:-2])


def check_square_stack(shape, where: str, name: str = "a") -> None:
    """Raise ValueError unless ``shape`` is that of a stack ``(..., n, n)``."""
    if len(shape) < 2:
        raise ValueError(f"{where}: expected {name} of shape (..., n, n), got "
                         f"shape {tuple(shape)}")
    if shape[-1] != shape[-2]:
        raise ValueError(f"{where}: expected square matrices, got {name}.shape="
                         f"{tuple(shape)}")


def lu_pair(lu_and_piv, where: str):
    """``(lu, piv)`` from the pair :func:`lu_factor_batched` returns (ValueError if not one)."""
    try:
        lu, piv = lu_and_piv
    except (TypeError, ValueError):
        raise ValueError(f"{where}: lu_and_piv must be the pair (lu, piv) "
                         "returned by lu_factor_batched") from None
    return lu, piv


def cholesky_pair(c_and_lower, where: str):
    """``(c, lower)`` from the pair :func:`cho_factor_batched` returns (ValueError if not one)."""
    try:
        c, lower = c_and_lower
    except (TypeError, ValueError):
        raise ValueError(f"{where}: c_and_lower must be the pair (c, lower) "
                         "returned by cho_factor_batched") from None
    return c, lower


def batch_names(indices, batch_shape, total: int | None = None) -> str:
    """Readable batch indices, at most MAX_NAMED named.

    ``total``: how many there are when ``indices`` holds only the first ones
    (:func:`bad_indices`).
    """
    idx = [int(i) for i in indices]
    total = len(idx) if total is None else int(total)
    shown = idx[:MAX_NAMED]
    if len(batch_shape) > 1:
        text = [str(tuple(int(j) for j in np.unravel_index(i, batch_shape)))
                for i in shown]
    elif len(batch_shape) == 1:
        text = [str(i) for i in shown]
    else:
        text = ["(the only matrix)"]
    more = f" and {total - len(shown)} more" if total > len(shown) else ""
    return "[" + ", ".join(text) + "]" + more


def bad_indices(mask):
    """(the first MAX_NAMED flat indices where ``mask`` holds, their total count).

    ``mask`` NumPy or CuPy; for CuPy only those few indices and the count
    come to the host (the error paths of the public functions).
    """
    idx = (import_cupy() if is_cupy_array(mask) else np).flatnonzero(mask)
    first = idx[:MAX_NAMED]
    return (first.get() if is_cupy_array(first) else first), int(idx.size)


def info_counts(info):
    """(matrices with info > 0, matrices with info < 0) of a NumPy or CuPy ``info``.

    CuPy: one pass on the device and one wait
    (:func:`scipy_gpuqr.batched._gpu_common.read_status`), which tells only
    whether there are any: the counts are then 0 or 1.
    """
    if is_cupy_array(info):
        st = gc.new_status()
        gc.scan_info(info if info.flags.c_contiguous else info.copy(), gc.report_args(st))
        counts = gc.read_status(st)
        return counts[gc.STATUS_SINGULAR], counts[gc.STATUS_NONFINITE]
    info = np.asarray(info)
    return int(np.count_nonzero(info > 0)), int(np.count_nonzero(info < 0))


def check_finite_np(arr, batch_shape, where: str, name: str = "a") -> None:
    """ValueError naming the matrices of a NumPy stack that hold inf/NaN."""
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    flat = arr.reshape((bsz,) + arr.shape[len(batch_shape):])
    ok = np.isfinite(flat).all(axis=(-2, -1))
    if not ok.all():
        raise ValueError(f"{where}: {NONFINITE} ({name} at batch index "
                         f"{batch_names(np.flatnonzero(~ok), batch_shape)})")


def require_finite(where: str, *named) -> None:
    """ValueError naming the first ``(name, array)`` (NumPy or CuPy) holding inf/NaN."""
    for name, x in named:
        ok = bool(x.size == 0 or (import_cupy().isfinite(x).all().get()
                                  if is_cupy_array(x) else np.isfinite(x).all()))
        if not ok:
            raise ValueError(f"{where}: {NONFINITE} (in {name})")


def to_host(x):
    """``x`` as a NumPy array (copied from the GPU when it is a CuPy array)."""
    return x.get() if is_cupy_array(x) else np.asarray(x)


def to_device(x):
    """``x`` as a C-contiguous CuPy array on the current device."""
    cp = import_cupy()
    return cp.ascontiguousarray(cp.asarray(x))


def restore(x, like_gpu_input: bool):
    """NumPy out for NumPy in, CuPy out for CuPy in."""
    if like_gpu_input:
        return x
    return x.get() if is_cupy_array(x) else x


#: The dtypes of the GPU kernels.
_GPU_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def gpu_supported(dtype) -> bool:
    """The GPU kernels take float32 and float64 (other dtypes run on the CPU)."""
    return (dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)) in _GPU_DTYPES


def cupy_stack(a) -> bool:
    """``a`` is a CuPy float32/float64 stack ``(..., n, n)``: a valid input of
    the GPU kernels as it is (the public functions' short path, without
    :func:`as_stack`'s conversions and :func:`use_gpu`'s backend rules, which
    send such input to the GPU when no backend is named)."""
    if not is_cupy_array(a):
        return False
    shape = a.shape
    return len(shape) >= 2 and shape[-1] == shape[-2] and a.dtype in _GPU_DTYPES


def gpu_rhs(b, batch_shape: tuple, n: int, dtype):
    """Right-hand sides as the GPU solves read them, without a copy:
    ``(b, its batch stride in elements, B, k, the solution's shape)``.

    Only for a C-contiguous CuPy ``b`` of ``dtype`` shaped ``(n,)`` or
    ``(n, k)`` (one for every matrix: batch stride 0) or
    ``batch_shape + (n, k)``, with ``B`` (the matrices), ``n`` and ``k``
    positive; None for anything else (the general path validates, casts and
    broadcasts it). :func:`rhs_view` makes the (B, n, k) array of the drivers.
    """
    if not is_cupy_array(b) or b.dtype != dtype or not b._c_contiguous:
        return None
    shape = b.shape
    nd = len(shape)
    if nd == 1:
        if shape[0] != n:
            return None
        k, out, stride = 1, batch_shape + (n,), 0
    elif nd == 2:
        if shape[0] != n:
            return None
        k = shape[1]
        out, stride = batch_shape + (n, k), 0
    elif shape[:-2] == batch_shape and shape[-2] == n:
        k, out = shape[-1], shape
        stride = n * k
    else:
        return None
    bsz = 1
    for d in batch_shape:
        bsz *= d
    if not (bsz and n and k):
        return None
    return b, stride, bsz, k, out


def rhs_view(b, stride: int, bsz: int, n: int, k: int):
    """``b`` of :func:`gpu_rhs` as a (bsz, n, k) CuPy array read at batch
    stride ``stride`` elements (a view: no copy)."""
    if b.ndim == 3 and stride:
        return b
    item = b.itemsize
    return gc.cupy().ndarray((bsz, n, k), b.dtype, memptr=b.data,
                             strides=(stride * item, k * item, item))
