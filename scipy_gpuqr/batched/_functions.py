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
:mod:`scipy_gpuqr.batched._vbatched`, which is handed the fixed-size
function it calls once per size class. :func:`block_jacobi` is built by
:mod:`scipy_gpuqr.batched._jacobi` on :func:`inv_batched` the same way.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.linalg import LinAlgError, LinAlgWarning

from . import _cpu, _gpu, _jacobi, _vbatched
from . import _gpu_common as _gc
from ._common import (NONFINITE, as_stack, bad_indices, batch_names, check_finite_np,
                      cholesky_pair, cupy_stack, gpu_rhs, gpu_supported, lu_pair,
                      require_finite, restore, result_dtype, rhs_view, to_device, to_host,
                      use_gpu)
from ._kernel_registry import SMALL_MAX
from .._gpu import is_cupy_array
from .._options import log_decision

__all__ = ["lu_factor_batched", "lu_solve_batched", "solve_batched",
           "inv_batched", "cho_factor_batched", "cho_solve_batched",
           "block_jacobi", "lu_factor_vbatched", "solve_vbatched",
           "inv_vbatched", "cho_factor_vbatched"]


# ----------------------------------------------------------------------------
# GPU calls: info and the finiteness checks summarized on the device
# ----------------------------------------------------------------------------
#
# A GPU call allocates its outputs once, launches its kernel(s) on the current
# stream and then, to warn or raise like SciPy, needs one fact from the
# device: does any matrix have info != 0 (or an inf/NaN in a right-hand
# side)? The kernels mark a five-slot status word themselves, and its
# mirror in mapped pinned memory (kernels/batched/status.cuh; for n > 32 one
# pass over info does): the host waits for the stream once, the call's only
# synchronization, and reads the mirror in its own memory; nothing is
# copied. Only when something was found are the
# offending indices looked up (on the device; the first MAX_NAMED come to
# the host for the message).
#
# return_info=True with check_finite=False needs nothing from the device: the
# call is then fully asynchronous (info comes back on the device; the kernels
# clear info < 0 and write the NaN results of singular matrices).

def _dev(arr):
    """``arr`` on the device (NumPy input with ``backend='gpu'`` is copied there)."""
    return arr if is_cupy_array(arr) else to_device(arr)


def _gpu_stack(a, backend, where) -> tuple:
    """``(arr, batch_shape, cupy_in, gpu)`` of a one-stack call: a validated CuPy
    stack takes the short path; else ``a`` is validated, and ``cupy_in`` is None
    where the CPU answers (``gpu``: whether a GPU was asked for or chosen; NumPy
    input without one, or a dtype the kernels lack), else ``arr`` is on the
    device."""
    if backend is None and cupy_stack(a):        # the common GPU call, validated
        return a, a.shape[:-2], True, True
    arr, batch_shape = as_stack(a, where)
    gpu = use_gpu(a, backend, where)
    if not (gpu and gpu_supported(arr.dtype)):
        return arr, batch_shape, None, gpu
    return _dev(arr), batch_shape, is_cupy_array(a), True


def _new_status(check_finite, return_info, nan_fill=False, device=None):
    """(status word, kernel report) of a call on ``device`` (default: the
    current one): the word is None for ``return_info`` without
    ``check_finite``, which needs nothing from the device; the report clears
    ``info < 0`` without ``check_finite`` and, with ``nan_fill`` and
    ``return_info``, gives singular matrices NaN results."""
    st = None if (return_info and not check_finite) else _gc.new_status(device)
    return st, _gc.report_args(st, clear_neg=not check_finite,
                               nan_fill=nan_fill and return_info)


def _gpu_status(where, info, batch_shape, check_finite, status):
    """The slots of ``status`` (None: none, the call stays asynchronous),
    read once after the call's kernels; ValueError naming the matrices with
    ``info < 0`` (an inf or NaN in the input) with ``check_finite``."""
    if status is None:
        return None
    counts = _gc.read_status(status)
    if check_finite and counts[_gc.STATUS_NONFINITE]:
        first, total = bad_indices(info < 0)
        raise ValueError(f"{where}: {NONFINITE} (matrices "
                         f"{batch_names(first, batch_shape, total)})")
    return counts


def _singular(counts) -> bool:
    return bool(counts and counts[_gc.STATUS_SINGULAR])


def _first_bad(info, batch_shape):
    """(names of the matrices with info > 0, info of the first) of a device ``info``."""
    first, total = bad_indices(info > 0)
    return (batch_names(first, batch_shape, total),
            int(info.reshape(-1)[int(first[0])]) if total else 0)


# ----------------------------------------------------------------------------
# LU
# ----------------------------------------------------------------------------

def _lu_core(arr, batch_shape, gpu: bool, where: str, check_finite: bool):
    """LU of a validated stack on the CPU; returns (lu, piv, info_host).

    ``gpu``: the dtype has no GPU kernel (complex), the results go back to the device.
    """
    n = arr.shape[-1]
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    if gpu:
        log_decision("%s: dtype %s runs on the CPU", where, arr.dtype)
    host = to_host(arr)
    if check_finite:
        check_finite_np(host, batch_shape, where)
    lu, piv, info = _cpu.lu_factor(host.reshape(bsz, n, n))
    if gpu:
        lu, piv = to_device(lu), to_device(piv)
    return lu, piv, info


def _warn_singular(where, names, first, stacklevel=3):
    warnings.warn(f"{where}: exactly singular matrices at batch index "
                  f"{names} (first: diagonal number "
                  f"{first} is exactly zero). Singular matrix.",
                  LinAlgWarning, stacklevel=stacklevel)


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

    Notes
    -----
    On the GPU (CuPy input) the call is one kernel plus one pass over
    ``info`` on the current stream, and waits for them once, to read a
    summary they write to host memory (whether to warn or raise);
    ``return_info=True, check_finite=False`` does not wait at all (fully
    asynchronous).
    """
    where = "lu_factor_batched"
    arr, batch_shape, cupy_in, gpu = _gpu_stack(a, backend, where)
    if cupy_in is None:
        return _lu_factor_cpu(a, arr, batch_shape, gpu, where, check_finite, return_info)
    dev = _gc.device_id()
    st, report = _new_status(check_finite, return_info, device=dev)
    lu, piv, info = _gpu.getrf(arr, report=report, device=dev)
    counts = _gpu_status(where, info, batch_shape, check_finite, st)
    if return_info:
        return restore(lu, cupy_in), restore(piv, cupy_in), restore(info, cupy_in)
    if _singular(counts):
        _warn_singular(where, *_first_bad(info, batch_shape))
    return restore(lu, cupy_in), restore(piv, cupy_in)


def _lu_factor_counted(a, check_finite: bool):
    """``(lu, piv, info, singular)`` of a CuPy stack with one wait, or None.

    For the Dask chunk tasks (:mod:`scipy_gpuqr.distributed.dask_batched`),
    which warn about singular matrices by their global batch index and so
    need ``info`` and whether to warn: this is the GPU path of
    :func:`lu_factor_batched` without ``return_info`` (the status word read
    once, ValueError for infs or NaNs with ``check_finite``), returning
    ``info`` and the status's singular flag instead of warning. Without it
    a task would wait twice per chunk (in the call, then to scan ``info``).
    None where ``a`` is not a CuPy stack the kernels take as it is (the
    caller then makes the public call).
    """
    if not cupy_stack(a):
        return None
    dev = _gc.device_id()
    st, report = _new_status(check_finite, False, device=dev)
    lu, piv, info = _gpu.getrf(a, report=report, device=dev)
    counts = _gpu_status("lu_factor_batched", info, a.shape[:-2], check_finite, st)
    return lu, piv, info, _singular(counts)


def _lu_factor_cpu(a, arr, batch_shape, gpu, where, check_finite, return_info):
    """:func:`lu_factor_batched` of a validated stack on the CPU."""
    n = arr.shape[-1]
    lu, piv, info = _lu_core(arr, batch_shape, gpu, where, check_finite)
    lu = restore(lu.reshape(arr.shape), is_cupy_array(a))
    piv = restore(piv.reshape(batch_shape + (n,)), is_cupy_array(a))
    info = info.reshape(batch_shape).astype(np.int32)
    if return_info:
        return lu, piv, (to_device(info) if is_cupy_array(a) else info)
    bad = np.flatnonzero(info.reshape(-1) > 0)
    if bad.size:
        _warn_singular(where, batch_names(bad, batch_shape),
                       int(info.reshape(-1)[bad[0]]), stacklevel=4)
    return lu, piv


def _rhs(b, batch_shape, n, where, xp_gpu: bool, dtype=None):
    """Normalize b to (B, n, k); return it with a function giving the result shape.

    b of shape (n,) is one vector for every matrix (result (..., n)); b of
    shape (..., n, k) is broadcast against the batch (result (..., n, k)).
    On the GPU (``xp_gpu``) b is cast to ``dtype`` before it is broadcast and
    not copied otherwise: the (B, n, k) result may be a broadcast view (batch
    stride 0), which the solve kernels read as it is.
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
    bsz = math.prod(batch_shape)
    if xp_gpu:
        cp = _gc.cupy()
        mat = cp.asarray(mat)
        if dtype is not None and mat.dtype != dtype:
            mat = mat.astype(dtype)
        if mat.shape != batch_shape + (n, k):
            mat = cp.broadcast_to(mat, batch_shape + (n, k))
        mat = mat.reshape(bsz, n, k)
    else:
        mat = np.broadcast_to(to_host(mat), batch_shape + (n, k))
        mat = np.ascontiguousarray(mat.reshape(bsz, n, k))

    def shape_out(x):
        if vector:
            return x.reshape(batch_shape + (n,))
        return x.reshape(batch_shape + (n, k))

    return mat, shape_out


#: lu_solve_batched's trans by its LAPACK letter
_TRANS = {"N": 0, "T": 1, "C": 2}


def _stack3(x):
    """A contiguous stack (..., n, n) as (B, n, n) (itself when it has that shape)."""
    return x if x.ndim == 3 else x.reshape(math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1])


def _stack2(x):
    """A contiguous (..., n) array as (B, n)."""
    return x if x.ndim == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _solve_dtype(a_dtype, b_dtype, where):
    return np.promote_types(a_dtype, result_dtype(b_dtype, where))


def _raise_nonfinite_inputs(where, counts, names) -> None:
    """ValueError for the first of ``names`` ((slot, name)) whose status slot is set."""
    for slot, name in names:
        if counts[slot]:
            raise ValueError(f"{where}: {NONFINITE} (in {name})")


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
        Raise ValueError when ``b`` or the factors hold infs or NaNs (on the
        GPU the solve kernel checks what it loads; the call then waits once
        for its summary, without it the call does not wait).
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    x : ndarray, shape (..., n) or (..., n, k)
    """
    where = "lu_solve_batched"
    lu, piv = lu_pair(lu_and_piv, where)
    if trans not in (0, 1, 2, "N", "T", "C"):
        raise ValueError(f"{where}: trans must be 0, 1 or 2, got {trans!r}")
    trans = _TRANS.get(trans, trans)
    if backend is None and cupy_stack(lu) and is_cupy_array(piv):
        # the common GPU call: factors as lu_factor_batched gives them, b as the
        # solve kernel reads it (no copy, no cast)
        shape = lu.shape
        if piv.dtype == np.int32 and piv.shape == shape[:-1] and piv._c_contiguous:
            rhs = gpu_rhs(b, shape[:-2], shape[-1], lu.dtype)
            if rhs is not None:
                bsrc, bstride, bsz, k, out_shape = rhs
                n = shape[-1]
                st = _gc.new_status() if check_finite else None
                report = _gc.report_args(st)
                if n <= SMALL_MAX and lu._c_contiguous:
                    x = _gc.alloc(out_shape, lu.dtype)
                    _gc.solve_columns("getrs_batched", lu.dtype, x, bsrc, bstride, bsz, n, k,
                                      (lu.data.ptr, piv.data.ptr), 1 if trans else 0, report)
                else:
                    x = _gpu.getrs(_stack3(lu), _stack2(piv),
                                   rhs_view(bsrc, bstride, bsz, n, k), trans, report)
                    x = x if x.shape == out_shape else x.reshape(out_shape)
                if st is not None:
                    _raise_nonfinite_inputs(where, _gc.read_status(st),
                                            ((_gc.STATUS_FACTOR, "lu"), (_gc.STATUS_RHS, "b")))
                return x
    arr, batch_shape = as_stack(lu, where, "lu")
    n = arr.shape[-1]
    pv = piv if is_cupy_array(piv) else np.asarray(piv)
    if tuple(pv.shape) != batch_shape + (n,):
        raise ValueError(f"{where}: piv must have shape {batch_shape + (n,)}, "
                         f"got {tuple(pv.shape)}")
    gpu = use_gpu(lu, backend, where)
    dt = _solve_dtype(arr.dtype, b.dtype if hasattr(b, "dtype") else
                      np.asarray(b).dtype, where)
    on_gpu = gpu and gpu_supported(dt)
    bmat, shape_out = _rhs(b, batch_shape, n, where, on_gpu, dt)
    bsz = math.prod(batch_shape)
    if on_gpu:
        cp = _gc.cupy()
        lu3 = cp.asarray(arr, dtype=dt).reshape(bsz, n, n)
        piv2 = cp.asarray(pv, dtype=cp.int32).reshape(bsz, n)
        st = _gc.new_status() if check_finite else None
        x = _gpu.getrs(lu3, piv2, bmat, trans, _gc.report_args(st))
        if st is not None:
            _raise_nonfinite_inputs(where, _gc.read_status(st),
                                    ((_gc.STATUS_FACTOR, "lu"), (_gc.STATUS_RHS, "b")))
    else:
        if check_finite:
            require_finite(where, ("lu", arr), ("b", bmat))
        lu3 = to_host(arr).astype(dt, copy=False).reshape(bsz, n, n)
        piv2 = to_host(pv).astype(np.int64).reshape(bsz, n)
        if piv2.size and (piv2.min() < 0 or piv2.max() >= n):
            raise ValueError(f"{where}: pivot indices out of range [0, {n})")
        x = _cpu.lu_solve(lu3, piv2, to_host(bmat).astype(dt, copy=False), trans)
        if gpu:
            x = to_device(x)
    return restore(shape_out(x), is_cupy_array(lu))


# ----------------------------------------------------------------------------
# solve and inverse
# ----------------------------------------------------------------------------

def _raise_singular(where, info, batch_shape):
    bad = np.flatnonzero(info.reshape(-1) > 0)
    if bad.size:
        _raise_singular_names(where, batch_names(bad, batch_shape))


def _raise_singular_names(where, names):
    raise LinAlgError(f"{where}: singular matrix at batch index "
                      f"{names} (U[k, k] exactly zero)")


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

    Notes
    -----
    On the GPU: for n <= 32 and CuPy ``b`` of ``a``'s dtype one kernel (the
    LU and the solves, the factors kept on chip, ``b`` read in place and
    checked), else the LU kernel and the solve kernel; then one wait for
    their summary, none with ``return_info=True, check_finite=False``.
    """
    where = "solve_batched"
    rhs = None
    if backend is None and cupy_stack(a):          # the common GPU call
        shape = a.shape
        rhs = gpu_rhs(b, shape[:-2], shape[-1], a.dtype)
    if rhs is not None:
        arr, batch_shape, cupy_in = a, a.shape[:-2], True
    else:
        arr, batch_shape = as_stack(a, where)
        gpu = use_gpu(a, backend, where)
        n = arr.shape[-1]
        bdt = b.dtype if hasattr(b, "dtype") else np.asarray(b).dtype
        dt = _solve_dtype(arr.dtype, bdt, where)
        on_gpu = gpu and gpu_supported(dt)
        bmat, shape_out = _rhs(b, batch_shape, n, where, on_gpu, dt)
        if check_finite and not on_gpu:
            check_finite_np(to_host(bmat), (bmat.shape[0],), where, "b")
        if arr.dtype != dt:
            arr = arr.astype(dt)
        if not on_gpu:
            return _solve_cpu(a, arr, bmat, shape_out, batch_shape, gpu, dt, where,
                              check_finite, return_info)
        arr, cupy_in = _dev(arr), is_cupy_array(a)
    dev = _gc.device_id()
    st, report = _new_status(check_finite, return_info, device=dev)
    solve_report = _gc.report_args(st if check_finite else None, nan_fill=return_info)
    if rhs is not None and arr.shape[-1] <= SMALL_MAX:
        # one allocation; the LU kernel, then the solve kernel reading b in place
        x, info = _gpu.gesv(arr, rhs, report, solve_report, return_info, dev)
    else:
        if rhs is not None:
            bsrc, bstride, bsz, k, out_shape = rhs
            bmat = rhs_view(bsrc, bstride, bsz, arr.shape[-1], k)

            def shape_out(x):
                return x if x.shape == out_shape else x.reshape(out_shape)
        lu, piv, info = _gpu.getrf(arr, report=report, device=dev)
        x = shape_out(_gpu.getrs(_stack3(lu), _stack2(piv), bmat, 0, solve_report,
                                 info.reshape(-1) if return_info else None))
    counts = _gpu_status(where, info, batch_shape, check_finite, st)
    if not return_info and _singular(counts):
        _raise_singular_names(where, _first_bad(info, batch_shape)[0])
    if check_finite:
        _raise_nonfinite_inputs(where, counts, ((_gc.STATUS_RHS, "b"),))
    x = restore(x, cupy_in)
    return (x, restore(info, cupy_in)) if return_info else x


def _solve_cpu(a, arr, bmat, shape_out, batch_shape, gpu, dt, where, check_finite,
               return_info):
    """:func:`solve_batched` of a validated stack and right-hand sides on the CPU."""
    n = arr.shape[-1]
    bsz = bmat.shape[0]
    lu, piv, info = _lu_core(arr, batch_shape, gpu, where, check_finite)
    if not return_info:
        _raise_singular(where, info, batch_shape)
    with np.errstate(all="ignore"):   # singular ones are NaN-filled below
        x = _cpu.lu_solve(to_host(lu).reshape(bsz, n, n),
                          to_host(piv).astype(np.int64).reshape(bsz, n),
                          to_host(bmat).astype(dt, copy=False), 0)
    x[info.reshape(-1) > 0] = np.nan
    if gpu:
        x = to_device(x)
    x = restore(shape_out(x), is_cupy_array(a))
    if return_info:
        info = info.reshape(batch_shape).astype(np.int32)
        return x, (to_device(info) if is_cupy_array(a) else info)
    return x


def inv_batched(a, *, check_finite=True, return_info=False, backend=None):
    """Inverse of every matrix of a stack (``scipy.linalg.inv`` per matrix).

    On the GPU, n ≤ 32 uses a fused Gauss–Jordan kernel on [A | I] (partial
    pivoting, lazy row swaps; float64 n = 25..32 on sm_80+ blocked by
    panels of 8 columns with the other columns updated on the FP64 tensor
    cores, else the matrix in registers); n = 33..63 factorizes and solves
    with the identity; from n = 64 on, the LU's U⁻¹ L⁻¹ P is formed by
    block rows, cuBLAS GEMMs around the inverted diagonal blocks'
    triangles (about 2 n³ flops after the LU).

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

    Notes
    -----
    On the GPU: the kernel and one pass over ``info`` (which also writes the
    NaN results of ``return_info``), then one wait for their summary;
    none with ``return_info=True, check_finite=False``.
    """
    where = "inv_batched"
    arr, batch_shape, cupy_in, gpu = _gpu_stack(a, backend, where)
    if cupy_in is None:
        return _inv_cpu(a, arr, batch_shape, gpu, where, check_finite, return_info)
    dev = _gc.device_id()
    st, report = _new_status(check_finite, return_info, nan_fill=True, device=dev)
    x, info = _gpu.getri(arr, report=report, device=dev)
    counts = _gpu_status(where, info, batch_shape, check_finite, st)
    if not return_info and _singular(counts):
        _raise_singular_names(where, _first_bad(info, batch_shape)[0])
    x = restore(x, cupy_in)
    return (x, restore(info, cupy_in)) if return_info else x


def _inv_cpu(a, arr, batch_shape, gpu, where, check_finite, return_info):
    """:func:`inv_batched` of a validated stack on the CPU."""
    n = arr.shape[-1]
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    host = to_host(arr).reshape(bsz, n, n)
    if check_finite:
        check_finite_np(host, (bsz,), where)
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
        x = to_device(x)
    x = restore(x.reshape(arr.shape), is_cupy_array(a))
    if return_info:
        info = info.reshape(batch_shape).astype(np.int32)
        return x, (to_device(info) if is_cupy_array(a) else info)
    return x


# ----------------------------------------------------------------------------
# Cholesky
# ----------------------------------------------------------------------------

def _raise_not_pd(where, names, first):
    raise LinAlgError(f"{where}: not positive definite at batch index "
                      f"{names} (the {first}-th leading "
                      "minor of the first is not positive definite)")


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

    Notes
    -----
    On the GPU: the kernel and one pass over ``info``, then one wait for
    their summary; none with ``return_info=True, check_finite=False``.
    """
    where = "cho_factor_batched"
    lower = bool(lower)
    arr, batch_shape, cupy_in, gpu = _gpu_stack(a, backend, where)
    if cupy_in is None:
        return _cho_factor_cpu(a, arr, batch_shape, gpu, lower, where, check_finite,
                               return_info)
    dev = _gc.device_id()
    st, report = _new_status(check_finite, return_info, device=dev)
    c, info = _gpu.potrf(arr, lower, report=report, device=dev)
    counts = _gpu_status(where, info, batch_shape, check_finite, st)
    if not return_info and _singular(counts):
        _raise_not_pd(where, *_first_bad(info, batch_shape))
    c = restore(c, cupy_in)
    return (c, lower, restore(info, cupy_in)) if return_info else (c, lower)


def _cho_factor_cpu(a, arr, batch_shape, gpu, lower, where, check_finite, return_info):
    """:func:`cho_factor_batched` of a validated stack on the CPU."""
    n = arr.shape[-1]
    bsz = int(np.prod(batch_shape, dtype=np.int64))
    host = to_host(arr).reshape(bsz, n, n)
    if check_finite:
        check_finite_np(host, (bsz,), where)
    c, info = _cpu.potrf(host, lower)
    if gpu:
        c = to_device(c)
    if not return_info:
        bad = np.flatnonzero(info > 0)
        if bad.size:
            _raise_not_pd(where, batch_names(bad, batch_shape), int(info[bad[0]]))
    c = restore(c.reshape(arr.shape), is_cupy_array(a))
    if return_info:
        info = info.reshape(batch_shape).astype(np.int32)
        return c, lower, (to_device(info) if is_cupy_array(a) else info)
    return c, lower


def _lower_flag(lower, where) -> bool:
    if isinstance(lower, (bool, np.bool_)):
        return bool(lower)
    low = np.unique(to_host(lower))
    if low.size != 1:
        raise ValueError(f"{where}: mixed 'lower' flags are not supported")
    return bool(low[0])


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
        Raise ValueError when ``c`` (all of it, as SciPy) or ``b`` hold infs
        or NaNs (on the GPU checked by the solve kernel; the call then waits
        once for its summary, without it the call does not wait).
    backend : {None, 'auto', 'cpu', 'gpu'}

    Returns
    -------
    x : ndarray, shape (..., n) or (..., n, k)
    """
    where = "cho_solve_batched"
    c, lower = cholesky_pair(c_and_lower, where)
    lower = _lower_flag(lower, where)
    if backend is None and cupy_stack(c):          # the common GPU call
        shape = c.shape
        rhs = gpu_rhs(b, shape[:-2], shape[-1], c.dtype)
        if rhs is not None:
            bsrc, bstride, bsz, k, out_shape = rhs
            n = shape[-1]
            st = _gc.new_status() if check_finite else None
            report = _gc.report_args(st)
            if n <= SMALL_MAX and c._c_contiguous:
                if st is not None and not _gc.potrs_checks_all(n):
                    # the whole of c, as SciPy (the kernel reads one triangle)
                    _gc.scan_nonfinite(c, report, _gc.STATUS_FACTOR)
                x = _gc.alloc(out_shape, c.dtype)
                _gc.solve_columns("potrs_batched", c.dtype, x, bsrc, bstride, bsz, n, k,
                                  (c.data.ptr,), 1 if lower else 0, report)
            else:
                x = _gpu.potrs(_stack3(c), lower, rhs_view(bsrc, bstride, bsz, n, k), report)
                x = x if x.shape == out_shape else x.reshape(out_shape)
            if st is not None:
                _raise_nonfinite_inputs(where, _gc.read_status(st),
                                        ((_gc.STATUS_FACTOR, "c"), (_gc.STATUS_RHS, "b")))
            return x
    arr, batch_shape = as_stack(c, where, "c")
    n = arr.shape[-1]
    gpu = use_gpu(c, backend, where)
    bdt = b.dtype if hasattr(b, "dtype") else np.asarray(b).dtype
    dt = _solve_dtype(arr.dtype, bdt, where)
    on_gpu = gpu and gpu_supported(dt)
    bmat, shape_out = _rhs(b, batch_shape, n, where, on_gpu, dt)
    bsz = bmat.shape[0]
    if on_gpu:
        cp = _gc.cupy()
        c3 = cp.asarray(arr, dtype=dt).reshape(bsz, n, n)
        st = _gc.new_status() if check_finite else None
        x = _gpu.potrs(c3, lower, bmat, _gc.report_args(st))
        if st is not None:
            _raise_nonfinite_inputs(where, _gc.read_status(st),
                                    ((_gc.STATUS_FACTOR, "c"), (_gc.STATUS_RHS, "b")))
    else:
        if check_finite:
            require_finite(where, ("c", arr), ("b", bmat))
        c3 = to_host(arr).astype(dt, copy=False).reshape(bsz, n, n)
        x = _cpu.potrs(c3, lower, to_host(bmat).astype(dt, copy=False))
        if gpu:
            x = to_device(x)
    return restore(shape_out(x), is_cupy_array(c))


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
    return _jacobi.build(A, block_size, inv_batched, check_finite=check_finite,
                         backend=backend)


# ----------------------------------------------------------------------------
# variable-size batches
# ----------------------------------------------------------------------------

def lu_factor_vbatched(a, sizes=None, *, check_finite=True, return_info=False,
                       backend=None):
    """LU with partial pivoting of matrices of different orders.

    Per matrix the result equals ``scipy.linalg.lu_factor`` (0-based pivots).
    Matrices are grouped into size classes, one :func:`lu_factor_batched`
    call per class (:mod:`scipy_gpuqr.batched._vbatched`); a padded CuPy
    stack of order N <= 32 is one kernel that reads the sizes itself.

    Parameters
    ----------
    a : list of (n_k, n_k) arrays, or array of shape (B, N, N)
        All NumPy or all CuPy; a stack needs ``sizes``.
    sizes : array_like of int, shape (B,), optional
        Order of each matrix of a padded stack (``a[k, :n_k, :n_k]``).
        Sizes outside [0, N] raise ValueError; on the device with
        ``return_info=True, check_finite=False`` (a call that reads nothing
        back) such a matrix gets NaN results instead.
    check_finite : bool
        Raise ValueError for infs or NaNs (naming the matrices).
    return_info : bool
        Also return LAPACK's ``info`` per matrix (int32, shape (B,)) instead
        of warning about singular matrices.
    backend : {None, 'auto', 'cpu', 'gpu'}
        As for :func:`lu_factor_batched`.

    Returns
    -------
    lu : list of arrays or array (B, N, N)
    piv : list of int32 arrays or int32 array (B, N)
    info : ndarray of int32, shape (B,)
        Only with ``return_info=True``.

    Warns
    -----
    LinAlgWarning
        When some matrices are exactly singular (named by index).
    """
    return _vbatched.lu_factor(a, sizes, batched=lu_factor_batched,
                               check_finite=check_finite,
                               return_info=return_info, backend=backend)


def solve_vbatched(a, b, sizes=None, *, check_finite=True, return_info=False,
                   backend=None):
    """Solve ``a_k x_k = b_k`` for matrices of different orders.

    One :func:`solve_batched` call per size class
    (:mod:`scipy_gpuqr.batched._vbatched`); a padded CuPy stack of order
    N <= 32 is one kernel that reads the sizes itself (see
    :func:`lu_factor_vbatched` for sizes outside [0, N]).

    Parameters
    ----------
    a : list of (n_k, n_k) arrays, or array of shape (B, N, N) with ``sizes``
    b : list of (n_k,) or (n_k, m_k) arrays for a list ``a``; array of shape
        (B, N) or (B, N, m) for a padded ``a`` (rows beyond n_k ignored)
    sizes : array_like of int, shape (B,), optional
    check_finite, return_info, backend
        As for :func:`solve_batched`; ``return_info`` returns
        ``(x, info)`` with NaN solutions for singular matrices.

    Returns
    -------
    x : list of arrays or array shaped like ``b`` (zero beyond n_k)

    Raises
    ------
    LinAlgError
        When some matrices are exactly singular (named by index).
    """
    return _vbatched.solve(a, b, sizes, batched=solve_batched,
                           check_finite=check_finite, return_info=return_info,
                           backend=backend)


def inv_vbatched(a, sizes=None, *, check_finite=True, return_info=False,
                 backend=None):
    """Inverse of matrices of different orders (``scipy.linalg.inv`` each).

    One :func:`inv_batched` call per size class
    (:mod:`scipy_gpuqr.batched._vbatched`); a padded CuPy stack of order
    N <= 32 is one kernel that reads the sizes itself (see
    :func:`lu_factor_vbatched` for sizes outside [0, N]).

    Parameters
    ----------
    a : list of (n_k, n_k) arrays, or array of shape (B, N, N) with ``sizes``
    sizes : array_like of int, shape (B,), optional
    check_finite, return_info, backend
        As for :func:`inv_batched`.

    Returns
    -------
    ainv : list of arrays or array (B, N, N) (the identity beyond n_k)

    Raises
    ------
    LinAlgError
        When some matrices are exactly singular (named by index).
    """
    return _vbatched.inv(a, sizes, batched=inv_batched, check_finite=check_finite,
                         return_info=return_info, backend=backend)


def cho_factor_vbatched(a, sizes=None, lower=False, *, check_finite=True,
                        return_info=False, backend=None):
    """Cholesky factorization of matrices of different orders.

    Per matrix the result equals ``scipy.linalg.cho_factor`` (the factor in
    the selected triangle, ``a``'s entries in the other one). One
    :func:`cho_factor_batched` call per size class
    (:mod:`scipy_gpuqr.batched._vbatched`); a padded CuPy stack of order
    N <= 32 is one kernel that reads the sizes itself (see
    :func:`lu_factor_vbatched` for sizes outside [0, N]).

    Parameters
    ----------
    a : list of (n_k, n_k) arrays, or array of shape (B, N, N) with ``sizes``
    sizes : array_like of int, shape (B,), optional
    lower : bool
    check_finite, return_info, backend
        As for :func:`cho_factor_batched`.

    Returns
    -------
    c : list of arrays or array (B, N, N) (the identity beyond n_k)
    lower : bool
    info : ndarray of int32, shape (B,)
        Only with ``return_info=True``.

    Raises
    ------
    LinAlgError
        When some matrices are not positive definite (named by index).
    """
    return _vbatched.cho_factor(a, sizes, lower, batched=cho_factor_batched,
                                check_finite=check_finite,
                                return_info=return_info, backend=backend)
