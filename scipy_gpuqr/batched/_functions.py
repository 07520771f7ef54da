"""Batched LU, inverse and Cholesky of many small dense matrices.

Public functions take stacks of shape ``(..., n, n)`` and give, per matrix,
what ``scipy.linalg.lu_factor``, ``lu_solve``, ``solve``, ``inv``,
``cho_factor`` and ``cho_solve`` give (0-based pivots included). NumPy input
is computed on the CPU, vectorized over the batch
(:mod:`scipy_gpuqr.batched._cpu`), unless ``backend='gpu'``; CuPy input is
computed on its GPU by the kernels of :mod:`scipy_gpuqr.batched._gpu` and
returned as CuPy arrays.

Failure semantics follow SciPy per function: ``lu_factor_batched`` warns
(``LinAlgWarning``) about exactly singular matrices, ``inv_batched`` and
``solve_batched`` raise ``LinAlgError``, ``cho_factor_batched`` raises
``LinAlgError`` for a matrix that is not positive definite. Messages name the
offending batch indices (up to 10). ``return_info=True`` returns LAPACK-style
per-matrix ``info`` instead of warning or raising.

The ``*_vbatched`` functions take matrices of different orders in one call
(a list, or a padded stack with per-matrix sizes); they are implemented in
:mod:`scipy_gpuqr.batched._vbatched` on top of the fixed-size functions.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.linalg import LinAlgError, LinAlgWarning

from . import _cpu
from .._gpu import import_cupy, is_cupy_array, is_cupy_sparse
from .._options import log_decision, resolve_backend

__all__ = ["lu_factor_batched", "lu_solve_batched", "solve_batched",
           "inv_batched", "cho_factor_batched", "cho_solve_batched",
           "block_jacobi", "lu_factor_vbatched", "solve_vbatched",
           "inv_vbatched", "cho_factor_vbatched"]

#: How many offending indices an error message names.
MAX_NAMED = 10

_NONFINITE = "array must not contain infs or NaNs"


# ----------------------------------------------------------------------------
# validation and dispatch helpers
# ----------------------------------------------------------------------------

def _result_dtype(dtype, where: str) -> np.dtype:
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


def _use_gpu(x, backend, where: str) -> bool:
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
        from .._gpu import gpu_available
        if cp is None or not gpu_available():
            warnings.warn(f"{where}: backend='gpu' requested but no GPU is "
                          "available; computing on the CPU", RuntimeWarning,
                          stacklevel=3)
            return False
        return True
    return False


def _as_stack(a, where: str, name: str = "a"):
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
    dt = _result_dtype(arr.dtype, where)
    if arr.dtype != dt:
        arr = arr.astype(dt)
    return arr, tuple(arr.shape[:-2])


def _name(indices, batch_shape) -> str:
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


def _check_finite_np(arr, batch_shape, where: str, name: str = "a") -> None:
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    flat = arr.reshape((bsz,) + arr.shape[len(batch_shape):])
    ok = np.isfinite(flat).all(axis=(-2, -1))
    if not ok.all():
        raise ValueError(f"{where}: {_NONFINITE} ({name} at batch index "
                         f"{_name(np.flatnonzero(~ok), batch_shape)})")


def _require_finite(where: str, *named) -> None:
    """ValueError naming the first ``(name, array)`` (NumPy or CuPy) holding inf/NaN."""
    for name, x in named:
        ok = bool(x.size == 0 or (import_cupy().isfinite(x).all().get()
                                  if is_cupy_array(x) else np.isfinite(x).all()))
        if not ok:
            raise ValueError(f"{where}: {_NONFINITE} (in {name})")


def _host(x):
    return x.get() if is_cupy_array(x) else np.asarray(x)


def _nonfinite_from_info(info_h, batch_shape, where, check_finite):
    """GPU kernels flag non-finite input as info = -1."""
    bad = info_h < 0
    if bad.any():
        if check_finite:
            raise ValueError(f"{where}: {_NONFINITE} (matrices "
                             f"{_name(np.flatnonzero(bad), batch_shape)})")
        info_h = np.where(bad, 0, info_h)
    return info_h


def _gpu_module():
    from . import _gpu as _batched_gpu
    return _batched_gpu


def _to_device(x):
    cp = import_cupy()
    return cp.ascontiguousarray(cp.asarray(x))


def _restore(x, like_gpu_input: bool):
    """NumPy out for NumPy in, CuPy out for CuPy in."""
    if like_gpu_input:
        return x
    return x.get() if is_cupy_array(x) else x


def _gpu_supported(dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))


# ----------------------------------------------------------------------------
# LU
# ----------------------------------------------------------------------------

def _lu_core(arr, batch_shape, gpu: bool, where: str, check_finite: bool):
    """LU of a validated stack; returns (lu, piv, info_host) on arr's side."""
    n = arr.shape[-1]
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    if gpu and _gpu_supported(arr.dtype):
        a3 = _to_device(arr).reshape(bsz, n, n)
        lu, piv, info = _gpu_module().getrf(a3)
        info_h = _nonfinite_from_info(info.get(), batch_shape, where,
                                      check_finite)
        return lu, piv, info_h
    if gpu:
        log_decision("%s: dtype %s runs on the CPU", where, arr.dtype)
    host = _host(arr)
    if check_finite:
        _check_finite_np(host, batch_shape, where)
    lu, piv, info = _cpu.lu_factor(host.reshape(bsz, n, n))
    if gpu:
        lu, piv = _to_device(lu), _to_device(piv)
    return lu, piv, info


def lu_factor_batched(a, *, overwrite_a=False, check_finite=True,
                      return_info=False, backend=None):
    """LU factorization with partial pivoting of every matrix in a stack.

    Per matrix the result equals ``scipy.linalg.lu_factor`` (same 0-based
    pivots, same packed L and U).

    Parameters
    ----------
    a : array_like or cupy.ndarray, shape (..., n, n)
        Square matrices. float32 and complex64 stay single precision,
        float16 becomes float32, integers become float64.
    overwrite_a : bool
        Accepted for SciPy compatibility; the input is never modified.
    check_finite : bool
        Raise ValueError for infs or NaNs (on the GPU the kernel checks the
        data it loads, without an extra pass over memory).
    return_info : bool
        Also return ``info`` (int32, shape ``(...)``): 0, or ``k + 1`` when
        ``U[k, k]`` is exactly zero (LAPACK ``getrf``); no warning then.
    backend : {None, 'auto', 'cpu', 'gpu'}
        NumPy input runs on the CPU unless ``'gpu'``; CuPy input on its GPU.

    Returns
    -------
    lu : ndarray, shape (..., n, n)
    piv : ndarray of int32, shape (..., n)
    info : ndarray of int32, shape (...)
        Only with ``return_info=True``.

    Warns
    -----
    LinAlgWarning
        When some matrices are exactly singular (named by batch index), as
        ``scipy.linalg.lu_factor`` warns for one matrix.
    """
    where = "lu_factor_batched"
    arr, batch_shape = _as_stack(a, where)
    gpu = _use_gpu(a, backend, where)
    n = arr.shape[-1]
    lu, piv, info = _lu_core(arr, batch_shape, gpu, where, check_finite)
    lu = _restore(lu.reshape(arr.shape), is_cupy_array(a))
    piv = _restore(piv.reshape(batch_shape + (n,)), is_cupy_array(a))
    info = info.reshape(batch_shape).astype(np.int32)
    if return_info:
        return lu, piv, (_to_device(info) if is_cupy_array(a) else info)
    bad = np.flatnonzero(info.reshape(-1) > 0)
    if bad.size:
        first = int(info.reshape(-1)[bad[0]])
        warnings.warn(f"{where}: exactly singular matrices at batch index "
                      f"{_name(bad, batch_shape)} (first: diagonal number "
                      f"{first} is exactly zero). Singular matrix.",
                      LinAlgWarning, stacklevel=2)
    return lu, piv


def _rhs(b, batch_shape, n, where, xp_gpu: bool):
    """Normalize b to (B, n, k); return it with a function giving the result shape.

    b of shape (n,) is one vector for every matrix (result (..., n)); b of
    shape (..., n, k) is broadcast against the batch (result (..., n, k)).
    """
    if is_cupy_array(b):
        barr = b
    else:
        barr = np.asarray(b)
        if barr.dtype == object or barr.dtype.kind in "SUVM":
            raise ValueError(f"{where}: b must be numeric, got dtype {barr.dtype}")
    if barr.ndim == 0:
        raise ValueError(f"{where}: b must be at least 1-D, got a scalar")
    if barr.shape[-1 if barr.ndim == 1 else -2] != n:
        raise ValueError(f"{where}: incompatible shapes: matrices are {n}x{n} "
                         f"but b has shape {tuple(barr.shape)} (a batch of "
                         "vectors must have shape (..., n, 1))")
    if barr.ndim == 1:
        k = 1
        out_batch = batch_shape
        mat = barr[:, None]
        vector = True
    else:
        k = barr.shape[-1]
        try:
            out_batch = tuple(np.broadcast_shapes(batch_shape, barr.shape[:-2]))
        except ValueError:
            raise ValueError(f"{where}: batch shapes {batch_shape} and "
                             f"{tuple(barr.shape[:-2])} do not broadcast") from None
        if out_batch != batch_shape:
            raise ValueError(f"{where}: b's batch shape {tuple(barr.shape[:-2])} "
                             f"would enlarge the factors' batch {batch_shape}")
        mat = barr
        vector = False
    xp = np
    if xp_gpu:
        xp = import_cupy()
        mat = xp.asarray(mat)
    else:
        mat = _host(mat)
    mat = xp.broadcast_to(mat, batch_shape + (n, k))
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    mat = xp.ascontiguousarray(mat.reshape(bsz, n, k))

    def shape_out(x):
        if vector:
            return x.reshape(batch_shape + (n,))
        return x.reshape(batch_shape + (n, k))

    return mat, shape_out


def _solve_dtype(a_dtype, b_dtype, where):
    return np.promote_types(a_dtype, _result_dtype(b_dtype, where))


def lu_solve_batched(lu_and_piv, b, trans=0, *, overwrite_b=False,
                     check_finite=True, backend=None):
    """Solve ``a x = b`` for every matrix given its LU factors.

    Parameters
    ----------
    lu_and_piv : tuple (lu, piv)
        From :func:`lu_factor_batched`: ``lu`` (..., n, n), ``piv`` (..., n).
    b : array_like, shape (n,) or (..., n, k)
        One vector for every matrix, or per-matrix right-hand sides (a batch
        of vectors has shape (..., n, 1), as in ``scipy.linalg.lu_solve``).
    trans : {0, 1, 2}
        0: ``a x = b``; 1: ``aᵀ x = b``; 2: ``aᴴ x = b``.
    overwrite_b : bool
        Accepted for SciPy compatibility; ``b`` is never modified.
    check_finite : bool
        Raise ValueError when ``b`` or the factors hold infs or NaNs.
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    x : ndarray, shape (..., n) or (..., n, k)
    """
    where = "lu_solve_batched"
    try:
        lu, piv = lu_and_piv
    except (TypeError, ValueError):
        raise ValueError(f"{where}: lu_and_piv must be the pair (lu, piv) "
                         "returned by lu_factor_batched") from None
    if trans not in (0, 1, 2, "N", "T", "C"):
        raise ValueError(f"{where}: trans must be 0, 1 or 2, got {trans!r}")
    trans = {"N": 0, "T": 1, "C": 2}.get(trans, trans)
    arr, batch_shape = _as_stack(lu, where, "lu")
    n = arr.shape[-1]
    pv = piv if is_cupy_array(piv) else np.asarray(piv)
    if tuple(pv.shape) != batch_shape + (n,):
        raise ValueError(f"{where}: piv must have shape {batch_shape + (n,)}, "
                         f"got {tuple(pv.shape)}")
    gpu = _use_gpu(lu, backend, where)
    dt = _solve_dtype(arr.dtype, b.dtype if hasattr(b, "dtype") else
                      np.asarray(b).dtype, where)
    bmat, shape_out = _rhs(b, batch_shape, n, where,
                           gpu and _gpu_supported(dt))
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    if check_finite:
        _require_finite(where, ("lu", arr), ("b", bmat))
    if gpu and _gpu_supported(dt):
        cp = import_cupy()
        lu3 = cp.ascontiguousarray(cp.asarray(arr, dtype=dt)).reshape(bsz, n, n)
        piv2 = cp.ascontiguousarray(cp.asarray(pv, dtype=cp.int32)).reshape(bsz, n)
        x = _gpu_module().getrs(lu3, piv2, bmat.astype(dt, copy=False), trans)
    else:
        lu3 = _host(arr).astype(dt, copy=False).reshape(bsz, n, n)
        piv2 = _host(pv).astype(np.int64).reshape(bsz, n)
        if piv2.size and (piv2.min() < 0 or piv2.max() >= n):
            raise ValueError(f"{where}: pivot indices out of range [0, {n})")
        x = _cpu.lu_solve(lu3, piv2, _host(bmat).astype(dt, copy=False), trans)
        if gpu:
            x = _to_device(x)
    return _restore(shape_out(x), is_cupy_array(lu))


# ----------------------------------------------------------------------------
# solve and inverse
# ----------------------------------------------------------------------------

def _raise_singular(where, info, batch_shape):
    bad = np.flatnonzero(info.reshape(-1) > 0)
    if bad.size:
        raise LinAlgError(f"{where}: singular matrix at batch index "
                          f"{_name(bad, batch_shape)} (U[k, k] exactly zero)")


def solve_batched(a, b, *, check_finite=True, return_info=False,
                  backend=None):
    """Solve ``a x = b`` for every matrix of a stack (LU with partial pivoting).

    Parameters
    ----------
    a : array_like, shape (..., n, n)
    b : array_like, shape (n,) or (..., n, k)
        As for :func:`lu_solve_batched`.
    check_finite : bool
    return_info : bool
        Return ``(x, info)`` instead of raising; singular matrices get NaN.
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    x : ndarray, shape (..., n) or (..., n, k)

    Raises
    ------
    LinAlgError
        When some matrices are exactly singular (named by batch index).
    """
    where = "solve_batched"
    arr, batch_shape = _as_stack(a, where)
    gpu = _use_gpu(a, backend, where)
    n = arr.shape[-1]
    bdt = b.dtype if hasattr(b, "dtype") else np.asarray(b).dtype
    dt = _solve_dtype(arr.dtype, bdt, where)
    bmat, shape_out = _rhs(b, batch_shape, n, where, gpu and _gpu_supported(dt))
    if check_finite and not gpu:
        _check_finite_np(_host(bmat), (bmat.shape[0],), where, "b")
    if arr.dtype != dt:
        arr = arr.astype(dt)
    lu, piv, info = _lu_core(arr, batch_shape, gpu, where, check_finite)
    if not return_info:
        _raise_singular(where, info, batch_shape)
    bsz = bmat.shape[0]
    if gpu and _gpu_supported(dt):
        if check_finite:
            _require_finite(where, ("b", bmat))
        x = _gpu_module().getrs(lu, piv, bmat.astype(dt, copy=False), 0)
        if info.any():
            x[import_cupy().asarray(info.reshape(-1) > 0)] = np.nan
    else:
        with np.errstate(all="ignore"):   # singular ones are NaN-filled below
            x = _cpu.lu_solve(_host(lu).reshape(bsz, n, n),
                              _host(piv).astype(np.int64).reshape(bsz, n),
                              _host(bmat).astype(dt, copy=False), 0)
        x[info.reshape(-1) > 0] = np.nan
        if gpu:
            x = _to_device(x)
    x = _restore(shape_out(x), is_cupy_array(a))
    if return_info:
        info = info.reshape(batch_shape).astype(np.int32)
        return x, (_to_device(info) if is_cupy_array(a) else info)
    return x


def inv_batched(a, *, check_finite=True, return_info=False, backend=None):
    """Inverse of every matrix of a stack (``scipy.linalg.inv`` per matrix).

    On the GPU, n ≤ 32 uses a fused Gauss–Jordan kernel on [A | I] (partial
    pivoting, lazy row swaps; float64 n = 25..32 on sm_80+ blocked by
    panels of 8 columns with the other columns updated on the FP64 tensor
    cores, else the matrix in registers); larger n factorizes and solves
    with the identity.

    Parameters
    ----------
    a : array_like, shape (..., n, n)
    check_finite : bool
    return_info : bool
        Return ``(inv, info)`` instead of raising; singular matrices get NaN.
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    ainv : ndarray, shape (..., n, n)

    Raises
    ------
    LinAlgError
        When some matrices are exactly singular (named by batch index).
    """
    where = "inv_batched"
    arr, batch_shape = _as_stack(a, where)
    gpu = _use_gpu(a, backend, where)
    n = arr.shape[-1]
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    if gpu and _gpu_supported(arr.dtype):
        a3 = _to_device(arr).reshape(bsz, n, n)
        x, info = _gpu_module().getri(a3)
        info = _nonfinite_from_info(info.get(), batch_shape, where,
                                    check_finite)
        if not return_info:
            _raise_singular(where, info, batch_shape)
        if info.any():
            x[import_cupy().asarray(info > 0)] = np.nan
    else:
        host = _host(arr).reshape(bsz, n, n)
        if check_finite:
            _check_finite_np(host, (bsz,), where)
        info = np.zeros(bsz, dtype=np.int32)
        try:
            x = np.linalg.inv(host) if bsz and n else host.copy()
        except np.linalg.LinAlgError:
            _, _, info = _cpu.lu_factor(host)
            if not return_info:
                _raise_singular(where, info, batch_shape)
            x = np.full_like(host, np.nan)
            good = info == 0
            if good.any():
                x[good] = np.linalg.inv(host[good])
        x = x.astype(arr.dtype, copy=False)
        if gpu:
            x = _to_device(x)
    x = _restore(x.reshape(arr.shape), is_cupy_array(a))
    if return_info:
        info = info.reshape(batch_shape).astype(np.int32)
        return x, (_to_device(info) if is_cupy_array(a) else info)
    return x


# ----------------------------------------------------------------------------
# Cholesky
# ----------------------------------------------------------------------------

def cho_factor_batched(a, lower=False, *, overwrite_a=False,
                       check_finite=True, return_info=False, backend=None):
    """Cholesky factorization of every matrix of a stack.

    Per matrix the result equals ``scipy.linalg.cho_factor``: only the
    selected triangle of ``a`` is read, the factor is written there and the
    other triangle keeps ``a``'s entries.

    Parameters
    ----------
    a : array_like, shape (..., n, n)
    lower : bool
        Factor ``a = L Lᴴ`` (True) or ``a = Uᴴ U`` (False, SciPy's default).
    overwrite_a : bool
        Accepted for SciPy compatibility; the input is never modified.
    check_finite : bool
    return_info : bool
        Also return ``info``: 0, or ``k`` when the leading minor of order
        ``k`` is not positive definite (LAPACK ``potrf``); no exception then.
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    c : ndarray, shape (..., n, n)
    lower : bool
        A single bool for the whole stack (SciPy returns an array of them).
    info : ndarray of int32, shape (...)
        Only with ``return_info=True``.

    Raises
    ------
    LinAlgError
        When some matrices are not positive definite (named by batch index).
    """
    where = "cho_factor_batched"
    arr, batch_shape = _as_stack(a, where)
    gpu = _use_gpu(a, backend, where)
    lower = bool(lower)
    n = arr.shape[-1]
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    if gpu and _gpu_supported(arr.dtype):
        c, info = _gpu_module().potrf(_to_device(arr).reshape(bsz, n, n), lower)
        info = _nonfinite_from_info(info.get(), batch_shape, where,
                                    check_finite)
    else:
        host = _host(arr).reshape(bsz, n, n)
        if check_finite:
            _check_finite_np(host, (bsz,), where)
        c, info = _cpu.potrf(host, lower)
        if gpu:
            c = _to_device(c)
    if not return_info:
        bad = np.flatnonzero(info > 0)
        if bad.size:
            raise LinAlgError(
                f"{where}: not positive definite at batch index "
                f"{_name(bad, batch_shape)} (the {int(info[bad[0]])}-th leading "
                "minor of the first is not positive definite)")
    c = _restore(c.reshape(arr.shape), is_cupy_array(a))
    if return_info:
        info = info.reshape(batch_shape).astype(np.int32)
        return c, lower, (_to_device(info) if is_cupy_array(a) else info)
    return c, lower


def cho_solve_batched(c_and_lower, b, *, overwrite_b=False, check_finite=True,
                      backend=None):
    """Solve ``a x = b`` for every matrix given its Cholesky factor.

    Parameters
    ----------
    c_and_lower : tuple (c, lower)
        From :func:`cho_factor_batched` (``lower`` a bool, or an array of
        equal bools as ``scipy.linalg.cho_factor`` returns for a batch).
    b : array_like, shape (n,) or (..., n, k)
    overwrite_b : bool
        Accepted for SciPy compatibility; ``b`` is never modified.
    check_finite : bool
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    x : ndarray, shape (..., n) or (..., n, k)
    """
    where = "cho_solve_batched"
    try:
        c, lower = c_and_lower
    except (TypeError, ValueError):
        raise ValueError(f"{where}: c_and_lower must be the pair (c, lower) "
                         "returned by cho_factor_batched") from None
    low = np.unique(_host(lower))
    if low.size != 1:
        raise ValueError(f"{where}: mixed 'lower' flags are not supported")
    lower = bool(low[0])
    arr, batch_shape = _as_stack(c, where, "c")
    n = arr.shape[-1]
    gpu = _use_gpu(c, backend, where)
    bdt = b.dtype if hasattr(b, "dtype") else np.asarray(b).dtype
    dt = _solve_dtype(arr.dtype, bdt, where)
    bmat, shape_out = _rhs(b, batch_shape, n, where, gpu and _gpu_supported(dt))
    bsz = bmat.shape[0]
    if check_finite:
        _require_finite(where, ("c", arr), ("b", bmat))
    if gpu and _gpu_supported(dt):
        cp = import_cupy()
        c3 = cp.ascontiguousarray(cp.asarray(arr, dtype=dt)).reshape(bsz, n, n)
        x = _gpu_module().potrs(c3, lower, bmat.astype(dt, copy=False))
    else:
        c3 = _host(arr).astype(dt, copy=False).reshape(bsz, n, n)
        x = _cpu.potrs(c3, lower, _host(bmat).astype(dt, copy=False))
        if gpu:
            x = _to_device(x)
    return _restore(shape_out(x), is_cupy_array(c))


# ----------------------------------------------------------------------------
# block-Jacobi preconditioner
# ----------------------------------------------------------------------------

def block_jacobi(A, block_size, *, check_finite=True, backend=None):
    """Block-Jacobi preconditioner: the inverted diagonal blocks of ``A``.

    Parameters
    ----------
    A : scipy.sparse or cupyx.scipy.sparse matrix/array, or dense, shape (n, n)
    block_size : int
        Size of the diagonal blocks; the last block may be smaller.
    check_finite : bool
    backend : {None, 'auto', 'cpu', 'gpu'}
        Where the blocks are inverted (the operator lives on A's device).

    Returns
    -------
    M : scipy.sparse.linalg.LinearOperator or cupyx.scipy.sparse.linalg.LinearOperator
        ``M @ x`` applies ``blockdiag(A_11⁻¹, A_22⁻¹, ...)``; use it as
        ``M=`` in ``cg``/``gmres`` (SciPy for SciPy input, cupyx for cupyx).

    Raises
    ------
    LinAlgError
        When a diagonal block is exactly singular (the block is named).
    """
    from ._jacobi import build
    return build(A, block_size, check_finite=check_finite, backend=backend)


# ----------------------------------------------------------------------------
# variable-size batches
# ----------------------------------------------------------------------------

def lu_factor_vbatched(a, sizes=None, *, check_finite=True, return_info=False,
                       backend=None):
    """LU with partial pivoting of matrices of different orders.

    ``a`` is a list of square arrays (all NumPy or all CuPy) or a padded
    stack (B, N, N) with ``sizes`` (B,); results take the same form and equal
    ``scipy.linalg.lu_factor`` per matrix. Matrices are grouped into size
    classes, one batched factorization per class. See
    :func:`scipy_gpuqr.batched._vbatched.lu_factor_vbatched`.

    Returns
    -------
    lu, piv : lists of arrays, or arrays (B, N, N) and (B, N)
    info : ndarray of int32, shape (B,)
        Only with ``return_info=True``.
    """
    from ._vbatched import lu_factor_vbatched as impl
    return impl(a, sizes, check_finite=check_finite, return_info=return_info,
                backend=backend)


def solve_vbatched(a, b, sizes=None, *, check_finite=True, return_info=False,
                   backend=None):
    """Solve ``a_k x_k = b_k`` for matrices of different orders.

    ``b`` is a list of (n_k,) or (n_k, m_k) arrays for a list ``a``, or an
    array (B, N) / (B, N, m) for a padded ``a``. See
    :func:`scipy_gpuqr.batched._vbatched.solve_vbatched`.

    Returns
    -------
    x : list of arrays, or an array shaped like ``b``
    """
    from ._vbatched import solve_vbatched as impl
    return impl(a, b, sizes, check_finite=check_finite, return_info=return_info,
                backend=backend)


def inv_vbatched(a, sizes=None, *, check_finite=True, return_info=False,
                 backend=None):
    """Inverse of matrices of different orders (``scipy.linalg.inv`` each).

    See :func:`scipy_gpuqr.batched._vbatched.inv_vbatched`.

    Returns
    -------
    ainv : list of arrays, or array (B, N, N)
    """
    from ._vbatched import inv_vbatched as impl
    return impl(a, sizes, check_finite=check_finite, return_info=return_info,
                backend=backend)


def cho_factor_vbatched(a, sizes=None, lower=False, *, check_finite=True,
                        return_info=False, backend=None):
    """Cholesky factorization of matrices of different orders.

    Per matrix as ``scipy.linalg.cho_factor``. See
    :func:`scipy_gpuqr.batched._vbatched.cho_factor_vbatched`.

    Returns
    -------
    c : list of arrays, or array (B, N, N)
    lower : bool
    info : ndarray of int32, shape (B,)
        Only with ``return_info=True``.
    """
    from ._vbatched import cho_factor_vbatched as impl
    return impl(a, sizes, lower, check_finite=check_finite,
                return_info=return_info, backend=backend)
