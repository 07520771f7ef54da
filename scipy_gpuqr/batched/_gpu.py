"""GPU drivers of the batched dense kernels (``kernels/batched/``), every n.

Every function takes and returns CuPy arrays (float32 or float64) and
computes on the current device and stream: the factorizations and the
inverse take stacks ``(..., n, n)`` of any batch shape and allocate each
output once in that shape (``info`` of shape ``(...)``; the kernels read the
input and write the output, a non-contiguous input is copied once); the
solves take ``(B, n, n)`` factors and ``(B, n, k)`` right-hand sides.
What does not depend on the batch (kernel, block, shared memory, resident
blocks) is resolved once per (dtype, n, device) (:func:`_warp_plan`), so a
launch costs little host time. The factorizations and the inverse take a
``report`` (:func:`scipy_gpuqr.batched._gpu_common.report_args`): the
status word the kernels mark and the flags they apply to ``info`` and the
results; for n <= 32 the kernels do it themselves (a call is one launch and
one allocation), for n > 32 one pass over ``info`` does. Validation and the
mapping of the status word to warnings and exceptions live in
:mod:`scipy_gpuqr.batched._functions`.

* n <= 32: ``batched/lu_warp.cu`` (LU, inverse: a warp per tile of matrices, a
  row per lane, persistent grid sized by the occupancy),
  ``batched/lu_mma.cu`` (float64 LU of the sizes in ``MMA_SIZES`` and inverse
  of the sizes padded to them, on sm_80+: a warp per matrix, panels of 8
  columns, the other columns updated on the FP64 tensor cores) and
  ``batched/cholesky.cu`` (Cholesky: one thread per row).
* n > 32: :mod:`scipy_gpuqr.batched._gpu_blocked` (one kernel per matrix for
  n <= 64, panels with a row per thread and cuBLAS strided-batched GEMM
  updates up to n = 512, panels with a thread block per matrix beyond).
* Solves (n <= 32): ``getrs_batched`` / ``potrs_batched``
  (:func:`scipy_gpuqr.batched._gpu_common.solve_by_columns`; LU solves
  without transpose by ``getrs_warp``, a row of the factor per lane); the LU and
  solve of ``solve_batched`` in one kernel (:func:`gesv`: ``gesv_warp`` /
  ``gesv_mma``, the factors kept on chip).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import _gpu_blocked as _blocked
from . import _gpu_common as _common
from ._gpu_common import NO_REPORT, device_id, dtname, solve_by_columns
from ._kernel_registry import (JACOBI_PREFIX, MMA_SIZES, SMALL_FILES, SMALL_MAX, TINY_MAX,
                               VB_SUFFIX, jacobi_inverse_name, padded_size, small_name)
from .._kernels import load_module

__all__ = ["getrf", "getri", "inverse_call", "launch_inverse", "jacobi_inverse_call",
           "launch_jacobi_inverse", "getrs", "gesv", "potrf", "potrs",
           "DEFAULT_THREADS", "sizes_args",
           "small_launch", "warp_defaults", "warp_smem_bytes", "mma_smem_bytes",
           "getrf_kernel", "getri_kernel", "getrf_defaults", "MMA_KERNELS"]

#: Threads per block of the Cholesky n <= 32 kernel (matrices per block =
#: threads / next_pow2(n)).
DEFAULT_THREADS = 128

#: Largest block of the warp kernels (matches GPUQR_WARP_THREADS).
WARP_THREADS_MAX = 256


#: The tensor-core kernels of kernels/batched/lu_mma.cu (a warp per matrix;
#: their twins with per-matrix orders too).
MMA_KERNELS = ("getrf_mma", "getri_mma", "gesv_mma") + tuple(
    k + VB_SUFFIX for k in ("getrf_mma", "getri_mma", "gesv_mma"))

#: Threads per block of those kernels: 24 warps per SM (3 blocks; 80
#: registers a thread, 8.4 / 8.6 KiB of shared memory a warp). Blocks of 160
#: threads would fit 25 warps by registers and by the SM's 228 KiB, but the
#: occupancy API gives them 4 blocks (20 warps) on an H200, also with the
#: preferred shared-memory carveout at 100 %, and the LU ran 6 % slower; 64
#: and 128 threads hold 24 warps too and ran 2 % slower.
MMA_THREADS = 256

#: Shared memory an sm_90 SM gives its blocks (the stage rule of warp_defaults).
_SMEM_PER_SM = 227 * 1024


def _small_function(kernel: str, dtype, n: int):
    """The compiled ``kernel<T, n>`` of the n <= 32 families."""
    return _small_function_cached(kernel, dtname(dtype), n, device_id())


@functools.lru_cache(maxsize=None)
def _small_function_cached(kernel: str, dt: str, n: int, device: int, index: str | None = None):
    # one module per variant, compiled when first used; keyed by device: a
    # module loaded on one GPU is not usable on another. index: the CSR twin
    # of an inverse kernel (jacobi_inverse_call) with that index type
    if index is None:
        name = small_name(kernel, dt, n)
    else:
        name, kernel = jacobi_inverse_name(kernel, dt, index, n), JACOBI_PREFIX + kernel
    module = load_module(SMALL_FILES[kernel], (name,))
    return module.get_function(name)


def _seg(n: int) -> int:
    s = 1
    while s < n:
        s *= 2
    return s


def small_launch(kernel, size: int, batch: int, itemsize: int,
                 threads: int | None = None, extra_int_per_row: int = 0):
    """Grid, block and shared memory of a ``potrf_small`` launch.

    Mirrors the kernel's layout: per matrix two broadcast buffers of
    ``NB`` elements and a staging area of ``size * (size | 1)`` elements
    (plus ``extra_int_per_row`` ints per row).
    """
    threads = DEFAULT_THREADS if threads is None else int(threads)
    seg = _seg(size)
    threads = max(32, (max(threads, seg) // 32) * 32)
    mpb = threads // seg
    vw = 16 // itemsize
    nb = -(-size // vw) * vw
    smem = mpb * ((2 * nb + size * (size | 1)) * itemsize
                  + extra_int_per_row * size * 4)
    if smem > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = smem
    grid = -(-batch // mpb)
    return (grid,), (threads,), smem


# ----------------------------------------------------------------------------
# warp kernels (batched/lu_warp.cu): layout, defaults, launch
# ----------------------------------------------------------------------------

def warp_smem_bytes(size: int, itemsize: int, warps: int, stages: int,
                    tiny_max: int = TINY_MAX, vb: bool = False) -> int:
    """Dynamic shared memory of a ``getrf_warp``/``getri_warp`` block.

    Mirrors ``Layout`` in kernels/batched/warp.cuh: per warp two broadcast
    buffers per matrix of the tile and ``stages`` tiles (none at all for
    ``size <= tiny_max``: a thread per matrix). ``tiny_max`` is the
    kernels' ``GPUQR_TINY_MAX`` (a compile-time variant may change it).
    ``vb``: the twin with per-matrix orders (``<name>_vb``), which also
    keeps each tile's size entries, an 8-byte slot per matrix and stage,
    after the rest from the next 8-byte boundary (``order_slots``).
    """
    if size <= tiny_max:
        return 0
    vw = 16 // itemsize
    seg = _seg(size)
    mw = 32 // seg
    if size % vw == 0:
        units = size // vw
        ld = (units if units % 2 else units + 1) * vw
    else:
        ld = size | 1
    nbuf = -(-(size + 2) // vw) * vw + (6 * vw if mw == 1 else 0)
    base = warps * (2 * mw * nbuf + stages * mw * size * ld) * itemsize
    if vb:
        return -(-base // 8) * 8 + warps * stages * mw * 8
    return base


@functools.lru_cache(maxsize=None)
def warp_defaults(size: int, dt: str) -> tuple[int, int]:
    """(threads per block, stages) of the warp kernels for register size ``size``.

    256 threads; two tiles in flight per warp (the copy of the next tile
    then hides under the factorization) while 16 warps -- the most that 128
    registers per thread allow on an SM -- still fit in the shared memory of
    an sm_90 SM with two tiles each, else one (n = 32 in double: two would
    cap the warps per SM). Measured the fastest of 64/128/256 threads and
    1/2 stages (bench/batched.py tunes them per n).
    """
    two = warp_smem_bytes(size, np.dtype(dt).itemsize, 16, 2) <= _SMEM_PER_SM
    return 256, (2 if two else 1)


def mma_smem_bytes(size: int, warps: int, stages: int, inverse: bool = False) -> int:
    """Dynamic shared memory of a ``getrf_mma`` / ``getri_mma`` block
    (kernels/batched/lu_mma.cu).

    Per warp ``stages`` tiles of ``size`` rows of whole 128-byte units (a
    row of 16-byte units rounded up to a multiple of 8) and the scratch of the
    pivot chain: 64 ints and 16 doubles (LU), 32 doubles, 64 ints and 16
    doubles (``inverse``).
    """
    units = -(-size // 2)
    ldu = -(-units // 8) * 8
    return warps * (stages * size * ldu * 2 + (80 if inverse else 48)) * 8


def _has_mma(device: int) -> bool:
    """FP64 tensor cores (mma.m8n8k4.f64): compute capability 8.0 or newer."""
    return _blocked.has_mma(device)


def getrf_kernel(n: int, dtype, kernel: str | None = None) -> str:
    """The LU kernel for order n and ``dtype`` on the current device.

    ``'getrf_mma'`` for float64 and n in ``MMA_SIZES`` on sm_80+, else
    ``'getrf_warp'``; ``kernel`` ('warp' or 'mma') forces one.
    """
    if kernel not in (None, "warp", "mma"):
        raise ValueError(f"kernel must be None, 'warp' or 'mma', got {kernel!r}")
    mma_ok = (np.dtype(dtype) == np.float64 and n in MMA_SIZES
              and _has_mma(device_id()))
    if kernel == "mma" and not mma_ok:
        raise ValueError(f"no tensor-core LU for n={n}, {np.dtype(dtype).name} on this device")
    return "getrf_mma" if (mma_ok and kernel != "warp") else "getrf_warp"


def getri_kernel(n: int, dtype, kernel: str | None = None) -> str:
    """The n <= 32 inverse kernel for order n and ``dtype`` on the current device.

    ``'getri_mma'`` (blocked Gauss-Jordan on the FP64 tensor cores) for
    float64 whose padded size is in ``MMA_SIZES`` (n = 25..32) on sm_80+,
    else ``'getri_warp'``; ``kernel`` ('warp' or 'mma') forces one.
    """
    if kernel not in (None, "warp", "mma"):
        raise ValueError(f"kernel must be None, 'warp' or 'mma', got {kernel!r}")
    mma_ok = (np.dtype(dtype) == np.float64 and 0 < n <= SMALL_MAX
              and padded_size(n) in MMA_SIZES and _has_mma(device_id()))
    if kernel == "mma" and not mma_ok:
        raise ValueError(f"no tensor-core inverse for n={n}, {np.dtype(dtype).name} on this device")
    return "getri_mma" if (mma_ok and kernel != "warp") else "getri_warp"


def getrf_defaults(n: int, dt: str, kernel: str = "getrf_warp") -> tuple[int, int]:
    """(threads per block, stages) that :func:`getrf` / :func:`getri` use for
    ``kernel`` (``n``: the kernel's register size).

    ``getrf_mma`` / ``getri_mma``: one matrix in flight per warp (two stages
    would leave room for 8 warps only) and blocks of :data:`MMA_THREADS`.
    """
    if kernel in MMA_KERNELS:
        return MMA_THREADS, 1
    return warp_defaults(n, dt)


@functools.lru_cache(maxsize=None)
def _warp_config(kernel: str, dt: str, size: int, threads: int, stages: int,
                 device: int, index: str | None = None):
    """(function, resident blocks on the device, shared memory, matrices per
    warp); ``index``: the kernel's CSR twin (:func:`jacobi_inverse_call`)."""
    cp = _common.cupy()
    from cupy_backends.cuda.api import driver

    fn = _small_function_cached(kernel, dt, size, device, index)
    if kernel in MMA_KERNELS:
        smem = mma_smem_bytes(size, threads // 32, stages, inverse=kernel.startswith("getri"))
    else:
        smem = warp_smem_bytes(size, np.dtype(dt).itemsize, threads // 32, stages,
                               vb=kernel.endswith(VB_SUFFIX))
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
    sms = cp.cuda.Device(device).attributes["MultiProcessorCount"]
    mw = 1 if kernel in MMA_KERNELS else 32 if size <= TINY_MAX else 32 // _seg(size)
    return fn, max(1, int(per_sm)) * sms, smem, mw


@functools.lru_cache(maxsize=None)
def _warp_plan(op: str, dt: str, n: int, kernel, threads, stages, device: int,
               vb: bool = False, index: str | None = None):
    """Everything of an n <= 32 LU (``op`` 'lu'), LU and solve ('gesv') or
    inverse ('inv') launch that does not depend on the batch, resolved once
    per (dtype, n, options, device): (function, register size, threads,
    stages, shared memory, resident blocks, matrices per warp, elements per
    16-byte vector, CUfunction). ``vb``: the kernel's twin with per-matrix
    orders (same block and stages; the warp kernels' twins take 8 bytes more
    shared memory per matrix and stage: :func:`warp_smem_bytes`). ``index``:
    the inverse's twin reading CSR blocks (:func:`jacobi_inverse_call`)."""
    if op == "lu":
        name, size = getrf_kernel(n, dt, kernel), n
    elif op == "gesv":                    # the LU kernel's fused twin
        name, size = "gesv" + getrf_kernel(n, dt, kernel)[5:], n
    else:
        name, size = getri_kernel(n, dt, kernel), padded_size(n)
    if threads is None or stages is None:
        d_threads, d_stages = getrf_defaults(size, dt, name)
        threads = d_threads if threads is None else threads
        stages = d_stages if stages is None else stages
    threads = max(32, min(WARP_THREADS_MAX, (int(threads) // 32) * 32))
    fn, resident, smem, mw = _warp_config(name + (VB_SUFFIX if vb else ""), dt, size,
                                          threads, int(stages), device, index)
    return (fn, size, threads, int(stages), smem, resident, mw,
            16 // np.dtype(dt).itemsize, fn.kernel.ptr)


def _grid(plan, batch: int) -> int:
    """Blocks of a :func:`_warp_plan` launch over ``batch`` matrices (persistent grid)."""
    fn, size, threads, stages, smem, resident, mw, vw, fptr = plan
    if size <= TINY_MAX:
        # a thread per matrix: one matrix per thread beats the persistent grid
        return max(1, -(-batch // threads))
    tasks = -(-batch // mw)
    return max(1, min(resident, -(-tasks // (threads // 32))))


@functools.lru_cache(maxsize=512)
def _small_call(op: str, shape: tuple, dtype, kernel, threads, stages, device: int,
                vb: bool = False, index: str | None = None):
    """Everything of an n <= 32 call of ``op`` ('lu', 'gesv', 'inv' or 'chol') on a
    C-contiguous stack of ``shape`` and ``dtype`` that does not depend on
    the arrays, resolved once: (output specs for
    :func:`scipy_gpuqr.batched._gpu_common.alloc_outputs`, CUfunction, grid,
    threads, shared memory, matrices, stages, whether n allows the kernels'
    16-byte vector path). A call is then one allocation and one launch.
    ``vb``: the kernels with per-matrix orders (:func:`sizes_args`);
    ``index``: the inverse's CSR twin (:func:`jacobi_inverse_call`)."""
    n = shape[-1]
    batch_shape = shape[:-2]
    bsz = math.prod(batch_shape)
    dt = dtname(dtype)
    if op == "chol":
        fptr, block, per_block, smem = _potrf_plan(dt, padded_size(n), threads, device, vb)
        return (((shape, dtype), (batch_shape, np.int32)), fptr, -(-bsz // per_block),
                block, smem, bsz, 0, False)
    plan = _warp_plan(op, dt, n, kernel, threads, stages, device, vb, index)
    specs = (((shape, dtype), (batch_shape + (n,), np.int32), (batch_shape, np.int32))
             if op == "lu" else ((batch_shape, np.int32),) if op == "gesv"
             else ((shape, dtype), (batch_shape, np.int32)))
    return specs, plan[8], _grid(plan, bsz), plan[2], plan[4], bsz, plan[3], n % plan[7] == 0


def _launch_plan(plan, n: int, x, out, batch: int, args_head, args_tail, report) -> None:
    """Launch a :func:`_warp_plan` over ``batch`` matrices of size n (persistent
    grid): ``args_head`` (arrays), the batch, ``args_tail`` (ints), stages,
    the vector flag and ``report`` (status, ctl), through
    :func:`scipy_gpuqr.batched._gpu_common.launch`."""
    vec = 1 if (x.data.ptr % 16 == 0 and out.data.ptr % 16 == 0 and n % plan[7] == 0) else 0
    values = [a.data.ptr for a in args_head]
    values.append(batch)
    values += args_tail
    values += (plan[3], vec, _common.arg_value(report[0]), report[1])
    _common.launch(plan[8], _grid(plan, batch), plan[2], plan[4], values)


def sizes_args(sizes) -> tuple:
    """``(address, entry width)``, the ``sizes, szw`` arguments of the n <= 32
    factorization kernels' twins with per-matrix orders (``<name>_vb``), for
    ``sizes`` (a C-contiguous
    CuPy int32 or int64 array, one entry per matrix of the stack): matrix k is
    the leading ``sizes[k]`` block, read (and written) as the identity
    outside it; a size outside [0, n] marks slot
    :data:`~scipy_gpuqr.batched._gpu_common.STATUS_SIZES` of the status word
    and makes that matrix all NaN (kernels/batched/batched.cuh)."""
    return (sizes.data.ptr, sizes.itemsize)


def _contiguous(a):
    return a if a._c_contiguous else _common.cupy().ascontiguousarray(a)


def _batch(a):
    """(matrices, n, batch shape) of a stack (..., n, n)."""
    shape = a.shape
    n = shape[-1]
    batch_shape = shape[:-2]
    bsz = a.size // (n * n) if n else math.prod(batch_shape)
    return bsz, n, batch_shape


def _stack3(x, bsz: int, n: int):
    return x if x.ndim == 3 else x.reshape(bsz, n, n)


# ----------------------------------------------------------------------------
# LU
# ----------------------------------------------------------------------------

def getrf(a, threads: int | None = None, stages: int | None = None,
          kernel: str | None = None, report=NO_REPORT, device: int | None = None,
          sizes=None):
    """LU of a stack ``a`` (..., n, n); returns (lu, piv int32, info int32)
    of shapes (..., n, n), (..., n) and (...).

    ``a`` is not modified (the kernels read it and write ``lu``; a
    non-contiguous ``a`` is copied once). ``info`` is -1 for a matrix
    holding an inf or NaN (0 with ``report``'s clearing flag). ``threads``
    and ``stages`` tune the n <= 32 kernel (default:
    :func:`getrf_defaults`); ``kernel`` ('warp' or 'mma') forces the kernel
    (:func:`getrf_kernel`); ``report``: see the module docstring; ``device``:
    the current device's id when the caller has it; ``sizes``
    (:func:`sizes_args`, 0 < n <= 32 only): per-matrix orders of a padded stack.
    """
    a = _contiguous(a)
    n = a.shape[-1]
    if 0 < n <= SMALL_MAX and a.size:
        specs, fptr, grid, thr, smem, bsz, stg, vec = _small_call(
            "lu", a.shape, a.dtype, kernel, threads, stages,
            device_id() if device is None else device, sizes is not None)
        lu, piv, info = _common.alloc_outputs(specs)
        src, dst = a.data.ptr, lu.data.ptr
        _common.launch(fptr, grid, thr, smem,
                       (src, dst, piv.data.ptr, info.data.ptr, bsz, stg,
                        1 if vec and not (src | dst) & 15 else 0,
                        _common.arg_value(report[0]), report[1]) + (sizes or ()))
        return lu, piv, info
    bsz, n, batch_shape = _batch(a)
    if bsz == 0 or n == 0:
        piv, info = _common.alloc_outputs(((batch_shape + (n,), np.int32),
                                           (batch_shape, np.int32)))
        info.fill(0)
        return a.copy(), piv, info
    piv, info = _common.alloc_outputs(((batch_shape + (n,), np.int32), (batch_shape, np.int32)))
    lu = _blocked.getrf(_stack3(a, bsz, n), piv.reshape(bsz, n), info.reshape(bsz))
    _common.finish_report(info, report)
    return lu.reshape(a.shape), piv, info


# ----------------------------------------------------------------------------
# solves and inverse
# ----------------------------------------------------------------------------

def getrs(lu, piv, b, trans: int = 0, report=NO_REPORT, info=None):
    """Solve with LU factors ``lu`` (B, n, n), ``piv`` (B, n); ``b`` (B, n, k)
    (a batch stride of 0 broadcasts one b) is not modified.

    ``trans`` 0: A x = b; 1 or 2 (real data): Aᵀ x = b. ``report`` (from
    :func:`scipy_gpuqr.batched._gpu_common.report_args`): infs/NaNs of the
    factor and of b mark its status word (in the solve kernel for n <= 32
    and n > 64, by a pass over each beside it for 32 < n <= 64); with its
    NaN flag and ``info`` (the factorization's, (B,)) the solutions of the
    matrices whose ``info`` is > 0 are NaN.
    """
    if lu.shape[-1] > SMALL_MAX:
        return _blocked.getrs(lu, piv, b, trans, report, info)
    cp = _common.cupy()
    factors = (_contiguous(lu), _contiguous(piv if piv.dtype == np.int32
                                            else piv.astype(cp.int32)))
    return solve_by_columns("getrs_batched", lu.dtype, b, factors, 1 if trans else 0,
                            report, info)


#: solve_batched of n <= 32 by one kernel (``gesv_warp`` / ``gesv_mma``: the
#: LU and the solves with the factors on chip, neither written); False: the
#: LU kernel, then the solve kernel (``getrs_batched``) on the written factors.
FUSED_GESV = True


def gesv(a, rhs, report=NO_REPORT, solve_report=NO_REPORT, nan_info: bool = False,
         device: int | None = None, fused: bool | None = None, sizes=None):
    """LU and solve of a stack ``a`` (..., n, n), 0 < n <= 32, with one
    allocation for the outputs: returns (x, info).

    ``rhs``: the right-hand sides as
    :func:`scipy_gpuqr.batched._common.gpu_rhs` gives them (b, batch stride,
    matrices, k, the solution's shape); ``report``: the factorization's,
    ``solve_report``: the solve's (:func:`getrs`: an inf or NaN in b marks
    :data:`~scipy_gpuqr.batched._gpu_common.STATUS_RHS`); ``nan_info``:
    singular matrices get NaN solutions (with the NaN flag of
    ``solve_report``). ``fused`` (default :data:`FUSED_GESV`): one launch
    (the factors stay on chip; the factor's own finiteness is not looked at,
    ``solve_batched`` does not ask for it), else two. ``sizes``
    (:func:`sizes_args`): per-matrix orders of a padded stack (fused only:
    b's rows from a matrix's order on are read as zero, its solution's
    rows there are zero).
    """
    a = _contiguous(a)
    b, bstride, bsz, k, out_shape = rhs
    dev = device_id() if device is None else device
    if FUSED_GESV if fused is None else fused:
        specs, fptr, grid, thr, smem, bsz, stg, vec = _small_call(
            "gesv", a.shape, a.dtype, None, None, None, dev, sizes is not None)
        info, x = _common.alloc_outputs(specs + ((out_shape, a.dtype),))
        src = a.data.ptr
        _common.launch(fptr, grid, thr, smem,
                       (src, info.data.ptr, bsz, stg, 1 if vec and not src & 15 else 0,
                        _common.arg_value(report[0]), report[1], b.data.ptr, x.data.ptr, k,
                        bstride, _common.arg_value(solve_report[0]),
                        solve_report[1] if nan_info else solve_report[1] & ~_CTL_NAN)
                       + (sizes or ()))
        return x, info
    if sizes is not None:
        raise ValueError("gesv: per-matrix sizes need the fused kernel")
    specs, fptr, grid, thr, smem, bsz, stg, vec = _small_call(
        "lu", a.shape, a.dtype, None, None, None, dev)
    lu, piv, info, x = _common.alloc_outputs(specs + ((out_shape, a.dtype),))
    src, dst, pv, inf = a.data.ptr, lu.data.ptr, piv.data.ptr, info.data.ptr
    _common.launch(fptr, grid, thr, smem,
                   (src, dst, pv, inf, bsz, stg, 1 if vec and not (src | dst) & 15 else 0,
                    _common.arg_value(report[0]), report[1]))
    _common.solve_columns("getrs_batched", a.dtype, x, b, bstride, bsz, a.shape[-1], k,
                          (dst, pv), 0, solve_report, inf if nan_info else 0, dev)
    return x, info


_CTL_NAN = np.uint64(_common.CTL_NAN_FILL)


def getri(a, threads: int | None = None, stages: int | None = None,
          kernel: str | None = None, report=NO_REPORT, device: int | None = None,
          sizes=None):
    """Inverse of every matrix of ``a`` (..., n, n); returns (inv, info) of
    shapes (..., n, n) and (...).

    ``info`` is k + 1 for the first exactly zero pivot (that matrix's
    inverse is then meaningless, or all NaN with ``report``'s NaN flag) and
    -1 for a matrix holding an inf or NaN. ``threads`` and ``stages`` tune
    the n <= 32 kernel; ``kernel`` ('warp' or 'mma') forces it
    (:func:`getri_kernel`); ``sizes`` as for :func:`getrf`.
    """
    a = _contiguous(a)
    n = a.shape[-1]
    if 0 < n <= SMALL_MAX and a.size:
        call = _small_call("inv", a.shape, a.dtype, kernel, threads, stages,
                           device_id() if device is None else device, sizes is not None)
        out, info = _common.alloc_outputs(call[0])
        launch_inverse(call, n, a.data.ptr, out.data.ptr, info.data.ptr, report, sizes or ())
        return out, info
    bsz, n, batch_shape = _batch(a)
    if bsz == 0 or n == 0:
        return a.copy(), _common.cupy().zeros(batch_shape, dtype=np.int32)
    out, info = _blocked.inverse(_stack3(a, bsz, n))
    _common.finish_report(info, report, out)
    return out.reshape(a.shape), info.reshape(batch_shape)


def inverse_call(shape: tuple, dtype, device: int):
    """The n <= 32 inverse of :func:`getri` with its defaults on a C-contiguous
    stack of ``shape`` (0 < n <= 32, not empty), resolved once: the
    ``call`` of :func:`launch_inverse`."""
    return _small_call("inv", shape, dtype, None, None, None, device, False)


def launch_inverse(call, n: int, src: int, dst: int, info: int, report,
                   sizes: tuple = ()) -> None:
    """The launch of :func:`getri`'s n <= 32 kernel on addresses: the stack at
    ``src`` (C-contiguous, of the shape and dtype that ``call`` was resolved
    for: :func:`inverse_call` or :func:`_small_call`) into ``dst`` and
    ``info``; ``report`` and ``sizes`` as for :func:`getri`. For a caller
    holding its arrays in one allocation (``block_jacobi``) that makes
    arrays only of what it returns."""
    _, fptr, grid, thr, smem, bsz, stg, vec = call
    _common.launch(fptr, grid, thr, smem,
                   (src, dst, info, bsz, n, stg, 1 if vec and not (src | dst) & 15 else 0,
                    _common.arg_value(report[0]), report[1]) + sizes)


def jacobi_inverse_call(shape: tuple, dtype, index: str, device: int):
    """The twin of :func:`inverse_call` that reads its matrices, the diagonal
    blocks of order n of a CSR matrix with ``index`` ('int32' or 'int64')
    indices, straight from it (``jacobi_getri_warp`` / ``jacobi_getri_mma``,
    kernels/batched/csr_blocks.cuh): the same kernel for the same order and
    dtype, so the same inverses as the gather and :func:`getri`, one launch
    instead of two and no stack of blocks written and read back. One tile in
    flight per warp (stages 1: the rows are summed, not copied). ``shape``:
    (blocks, n, n), or (n, n) for the ragged last block; resolved once: the
    ``call`` of :func:`launch_jacobi_inverse`."""
    return _small_call("inv", shape, dtype, None, None, 1, device, False, index)


def launch_jacobi_inverse(call, n: int, csr: tuple, row0: int, dst: int, info: int,
                          report) -> None:
    """The launch of a :func:`jacobi_inverse_call`: the diagonal blocks of order
    ``n`` from row and column ``row0`` on of the CSR matrix at ``csr``
    (indptr, indices, data addresses) inverted into ``dst`` and ``info``
    (addresses; ``report`` as for :func:`getri`)."""
    _, fptr, grid, thr, smem, bsz, stg, vec = call
    _common.launch(fptr, grid, thr, smem,
                   csr + (row0, dst, info, bsz, n, stg, 1 if vec and not dst & 15 else 0,
                          _common.arg_value(report[0]), report[1]))


# ----------------------------------------------------------------------------
# Cholesky
# ----------------------------------------------------------------------------

def potrf(a, lower: bool, threads: int | None = None, report=NO_REPORT,
          device: int | None = None, sizes=None):
    """Cholesky of ``a`` (..., n, n) like LAPACK potrf; returns (c, info) of
    shapes (..., n, n) and (...); ``report``, ``device``, ``sizes``: see
    :func:`getrf`."""
    a = _contiguous(a)
    n = a.shape[-1]
    if 0 < n <= SMALL_MAX and a.size:
        specs, fptr, grid, block, smem, bsz, _, _ = _small_call(
            "chol", a.shape, a.dtype, None, threads, None,
            device_id() if device is None else device, sizes is not None)
        out, info = _common.alloc_outputs(specs)
        _common.launch(fptr, grid, block, smem,
                       (a.data.ptr, out.data.ptr, info.data.ptr, bsz, n, 1 if lower else 0,
                        _common.arg_value(report[0]), report[1]) + (sizes or ()))
        return out, info
    bsz, n, batch_shape = _batch(a)
    if bsz == 0 or n == 0:
        return a.copy(), _common.cupy().zeros(batch_shape, dtype=np.int32)
    c, info = _blocked.potrf(_stack3(a, bsz, n), lower)
    _common.finish_report(info, report)
    return c.reshape(a.shape), info.reshape(batch_shape)


@functools.lru_cache(maxsize=None)
def _potrf_plan(dt: str, size: int, threads, device: int, vb: bool = False):
    """(CUfunction, threads per block, matrices per block, shared memory) of
    ``potrf_small`` (``vb``: its twin with per-matrix orders)."""
    fn = _small_function_cached("potrf_small" + (VB_SUFFIX if vb else ""), dt, size, device)
    grid, block, smem = small_launch(fn, size, 1, np.dtype(dt).itemsize, threads)
    return fn.kernel.ptr, block[0], block[0] // _seg(size), smem


def potrs(c, lower: bool, b, report=NO_REPORT):
    """Solve with a Cholesky factor from :func:`potrf` (``c`` (B, n, n));
    ``b`` (B, n, k) is not modified; ``report`` as for :func:`getrs` (the
    whole of c is checked, as SciPy's cho_solve does)."""
    if c.shape[-1] > SMALL_MAX:
        return _blocked.potrs(c, lower, b, report)
    c = _contiguous(c)
    if report[0] is not _common.NULL and not _common.potrs_checks_all(c.shape[-1]):
        # the whole of c (the kernel reads one triangle)
        _common.scan_nonfinite(c, report, _common.STATUS_FACTOR)
    return solve_by_columns("potrs_batched", c.dtype, b, (c,), 1 if lower else 0, report)
