"""Validation and host/device helpers shared by the batched functions.

Used by :mod:`scipy_gpuqr.batched._functions` (fixed-size stacks) and
:mod:`scipy_gpuqr.batched._vbatched` (matrices of different orders): SciPy's
dtype rule, stack validation, the GPU-or-CPU decision, finiteness checks,
batch indices as error messages name them, and moves between NumPy and CuPy.
Imports numpy and the package's leaf modules only (CuPy lazily).
"""

from __future__ import annotations

import warnings

import numpy as np

from .._gpu import gpu_available, import_cupy, is_cupy_array, is_cupy_sparse
from .._options import log_decision, resolve_backend

__all__ = ["MAX_NAMED", "NONFINITE", "result_dtype", "use_gpu", "as_stack",
           "batch_names", "check_finite_np", "require_finite", "to_host",
           "nonfinite_from_info", "to_device", "restore", "gpu_supported"]

#: How many offending indices an error message names.
MAX_NAMED = 10

NONFINITE = "array must not contain infs or NaNs"


def result_dtype(dtype, where: str) -> np.dtype:
    """SciPy's LAPACK dtype rule: f32/f64/c64/c128 kept, f16 → f32, ints → f64."""
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
    if arr.ndim < 2:
        raise ValueError(f"{where}: expected {name} of shape (..., n, n), got "
                         f"shape {tuple(arr.shape)}")
    if arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"{where}: expected square matrices, got {name}.shape="
                         f"{tuple(arr.shape)}")
    dt = result_dtype(arr.dtype, where)
    if arr.dtype != dt:
        arr = arr.astype(dt)
    return arr, tuple(arr.shape[:-2])


def batch_names(indices, batch_shape) -> str:
    """Readable batch indices, at most MAX_NAMED named."""
    idx = [int(i) for i in indices]
    shown = idx[:MAX_NAMED]
    if len(batch_shape) > 1:
        text = [str(tuple(int(j) for j in np.unravel_index(i, batch_shape)))
                for i in shown]
    elif len(batch_shape) == 1:
        text = [str(i) for i in shown]
    else:
        text = ["(the only matrix)"]
    more = f" and {len(idx) - len(shown)} more" if len(idx) > len(shown) else ""
    return "[" + ", ".join(text) + "]" + more


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


def nonfinite_from_info(info_h, batch_shape, where, check_finite):
    """GPU kernels flag non-finite input as info = -1."""
    bad = info_h < 0
    if bad.any():
        if check_finite:
            raise ValueError(f"{where}: {NONFINITE} (matrices "
                             f"{batch_names(np.flatnonzero(bad), batch_shape)})")
        info_h = np.where(bad, 0, info_h)
    return info_h


def to_device(x):
    """``x`` as a C-contiguous CuPy array on the current device."""
    cp = import_cupy()
    return cp.ascontiguousarray(cp.asarray(x))


def restore(x, like_gpu_input: bool):
    """NumPy out for NumPy in, CuPy out for CuPy in."""
    if like_gpu_input:
        return x
    return x.get() if is_cupy_array(x) else x


def gpu_supported(dtype) -> bool:
    """The GPU kernels take float32 and float64 (other dtypes run on the CPU)."""
    return np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))
