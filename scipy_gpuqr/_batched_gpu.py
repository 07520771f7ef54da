"""GPU drivers of the batched dense kernels (``kernels/batched_*.cu``).

Every function takes and returns CuPy arrays: stacks ``(B, n, n)``
(C-contiguous, float32 or float64) and computes on the current device and
stream. Validation and the mapping of ``info`` to warnings and exceptions
live in :mod:`scipy_gpuqr._batched`.

* n <= 32: ``batched_lu.cu`` (LU, inverse: a warp per tile of matrices, a
  row per lane, persistent grid sized by the occupancy) and
  ``batched_small.cu`` (Cholesky: one thread per row).
* n > 32: ``getrf_panel`` / ``potrf_panel`` steps of ``batched_blocked.cu``
  with the trailing updates as cuBLAS strided-batched GEMMs.
* Solves (any n): ``getrs_batched`` / ``potrs_batched``.
"""

from __future__ import annotations

import functools

import numpy as np

from ._batched_variants import (KERNEL_VARIANTS, PANEL, SMALL_FILES,
                                SMALL_MAX, blocked_name, padded_size,
                                small_name)
from ._gpu import import_cupy
from ._kernels import load_module

__all__ = ["getrf", "getri", "getrs", "potrf", "potrs", "DEFAULT_THREADS",
           "small_launch", "warp_defaults", "warp_smem_bytes"]

#: Threads per block of the Cholesky n <= 32 kernel (matrices per block =
#: threads / next_pow2(n)).
DEFAULT_THREADS = 128

#: Threads per block of the blocked kernels (matches GPUQR_BLOCKED_THREADS).
BLOCKED_THREADS = 256

#: Largest block of the warp kernels (matches GPUQR_WARP_THREADS).
WARP_THREADS_MAX = 256

_SOLVE_THREADS = 128


def _alloc(shape, dtype):
    """Output allocation (tests replace it to poison outputs with NaN)."""
    return import_cupy().empty(shape, dtype=dtype)


def _dtname(dtype) -> str:
    return np.dtype(dtype).name


def _device_id() -> int:
    return import_cupy().cuda.runtime.getDevice()


def _small_function(kernel: str, dtype, n: int):
    """The compiled ``kernel<T, n>`` of the n <= 32 families."""
    return _small_function_cached(kernel, _dtname(dtype), n, _device_id())


@functools.lru_cache(maxsize=None)
def _small_function_cached(kernel: str, dt: str, n: int, device: int):
    # one module per variant, compiled when first used; keyed by device: a
    # module loaded on one GPU is not usable on another
    name = small_name(kernel, dt, n)
    module = load_module(SMALL_FILES[kernel], (name,))
    return module.get_function(name)


def _blocked_function(kernel: str, dtype):
    return _blocked_function_cached(kernel, _dtname(dtype), _device_id())


@functools.lru_cache(maxsize=None)
def _blocked_function_cached(kernel: str, dt: str, device: int):
    module = load_module("batched_blocked.cu", KERNEL_VARIANTS["batched_blocked.cu"])
    return module.get_function(blocked_name(kernel, dt))


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
# warp kernels (batched_lu.cu): layout, defaults, launch
# ----------------------------------------------------------------------------

def warp_smem_bytes(size: int, itemsize: int, warps: int, stages: int) -> int:
    """Dynamic shared memory of a ``getrf_warp``/``getri_warp`` block.

    Mirrors ``Layout`` in kernels/batched_warp.cuh: per warp two broadcast
    buffers per matrix of the tile and ``stages`` tiles.
    """
    vw = 16 // itemsize
    seg = _seg(size)
    mw = 32 // seg
    if size % vw == 0:
        units = size // vw
        ld = (units if units % 2 else units + 1) * vw
    else:
        ld = size | 1
    nbuf = -(-(size + 2) // vw) * vw
    return warps * (2 * mw * nbuf + stages * mw * size * ld) * itemsize


@functools.lru_cache(maxsize=None)
def warp_defaults(size: int, dt: str) -> tuple[int, int]:
    """(threads per block, stages) of the warp kernels for register size ``size``.

    Two tiles in flight per warp while a tile takes at most 4.5 KiB (the
    copy of the next tile then hides under the factorization); one for the
    larger tiles, whose shared memory would otherwise cap the warps per SM.
    """
    tile = warp_smem_bytes(size, np.dtype(dt).itemsize, 1, 1)
    return 128, (2 if tile <= 4608 else 1)


@functools.lru_cache(maxsize=None)
def _warp_config(kernel: str, dt: str, size: int, threads: int, stages: int,
                 device: int):
    """(function, resident blocks on the device, shared memory, matrices per warp)."""
    cp = import_cupy()
    from cupy_backends.cuda.api import driver

    fn = _small_function_cached(kernel, dt, size, device)
    smem = warp_smem_bytes(size, np.dtype(dt).itemsize, threads // 32, stages)
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
    sms = cp.cuda.Device(device).attributes["MultiProcessorCount"]
    return fn, max(1, int(per_sm)) * sms, smem, 32 // _seg(size)


def _launch_warp(kernel: str, size: int, n: int, x, out, batch: int, args_head,
                 args_tail, threads, stages) -> None:
    """Launch ``kernel<T, size>`` over ``batch`` matrices of size n (persistent grid)."""
    dt = _dtname(x.dtype)
    if threads is None or stages is None:
        d_threads, d_stages = warp_defaults(size, dt)
        threads = d_threads if threads is None else threads
        stages = d_stages if stages is None else stages
    threads = max(32, min(WARP_THREADS_MAX, (int(threads) // 32) * 32))
    fn, resident, smem, mw = _warp_config(kernel, dt, size, threads, int(stages),
                                          _device_id())
    warps = threads // 32
    tasks = -(-batch // mw)
    grid = max(1, min(resident, -(-tasks // warps)))
    vw = 16 // x.itemsize
    vec = int((x.data.ptr % 16 == 0) and (out.data.ptr % 16 == 0) and n % vw == 0)
    fn((grid,), (threads,), args_head + (np.int64(batch),) + args_tail
       + (np.int32(stages), np.int32(vec)), shared_mem=smem)


# ----------------------------------------------------------------------------
# LU
# ----------------------------------------------------------------------------

def getrf(a, threads: int | None = None, stages: int | None = None):
    """LU of a stack ``a`` (B, n, n); returns (lu, piv int32, info int32).

    ``info`` is -1 for a matrix holding an inf or NaN. ``threads`` and
    ``stages`` tune the n <= 32 kernel (default: :func:`warp_defaults`).
    """
    cp = import_cupy()
    bsz, n = a.shape[0], a.shape[-1]
    a = cp.ascontiguousarray(a)
    piv = _alloc((bsz, n), np.int32)
    info = _alloc((bsz,), np.int32)
    if bsz == 0 or n == 0:
        info.fill(0)
        return a.copy(), piv, info
    if n <= SMALL_MAX:
        lu = _alloc(a.shape, a.dtype)
        _launch_warp("getrf_warp", n, n, a, lu, bsz, (a, lu, piv, info), (),
                     threads, stages)
        return lu, piv, info
    lu = a.copy()
    info.fill(0)
    _blocked_lu(lu, piv, info)
    return lu, piv, info


def _gemm_strided(a, m: int, nn: int, k: int, a_off: int, lda: int,
                  b_off: int, ldb: int, c_off: int, ldc: int, trans_a: bool,
                  batch: int, stride: int, alpha: float, beta: float):
    """Column-major C = alpha op(A) B + beta C inside the stack ``a``."""
    cp = import_cupy()
    from cupy_backends.cuda.libs import cublas

    handle = cp.cuda.device.get_cublas_handle()
    item = a.itemsize
    base = a.data.ptr
    if a.dtype == np.float64:
        gemm = cublas.dgemmStridedBatched
        al, be = np.array(alpha, np.float64), np.array(beta, np.float64)
    else:
        gemm = cublas.sgemmStridedBatched
        al, be = np.array(alpha, np.float32), np.array(beta, np.float32)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        gemm(handle, cublas.CUBLAS_OP_T if trans_a else cublas.CUBLAS_OP_N,
             cublas.CUBLAS_OP_N, m, nn, k, al.ctypes.data,
             base + a_off * item, lda, stride,
             base + b_off * item, ldb, stride, be.ctypes.data,
             base + c_off * item, ldc, stride, batch)
    finally:
        cublas.setPointerMode(handle, mode)


def _panel_launch(fn, smem: int, bsz: int):
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    return (bsz,), (BLOCKED_THREADS,), smem


def _blocked_lu(a, piv, info) -> None:
    """Right-looking blocked LU of the stack ``a`` in place."""
    bsz, n = a.shape[0], a.shape[-1]
    fn = _blocked_function("getrf_panel", a.dtype)
    for k0 in range(0, n, PANEL):
        m = n - k0
        smem = m * PANEL * a.itemsize + 32 * (a.itemsize + 4)
        grid, block, smem = _panel_launch(fn, smem, bsz)
        fn(grid, block, (a, piv, info, np.int32(n), np.int32(k0)), shared_mem=smem)
        k1 = k0 + PANEL
        if k1 < n:
            r = n - k1
            # row-major A22 -= L21 @ U12  ==  column-major A22ᵀ -= U12ᵀ L21ᵀ
            _gemm_strided(a, r, r, PANEL, k0 * n + k1, n, k1 * n + k0, n,
                          k1 * n + k1, n, False, bsz, n * n, -1.0, 1.0)


# ----------------------------------------------------------------------------
# solves and inverse
# ----------------------------------------------------------------------------

def getrs(lu, piv, b, trans: int = 0):
    """Solve with LU factors; ``b`` (B, n, k) is not modified.

    ``trans`` 0: A x = b; 1 or 2 (real data): Aᵀ x = b.
    """
    cp = import_cupy()
    x = cp.array(b, dtype=lu.dtype, order="C", copy=True)
    bsz, n, k = x.shape
    if x.size == 0:
        return x
    fn = _blocked_function("getrs_batched", lu.dtype)
    total = bsz * k
    grid = -(-total // _SOLVE_THREADS)
    fn((grid,), (_SOLVE_THREADS,),
       (cp.ascontiguousarray(lu), cp.ascontiguousarray(piv, dtype=cp.int32), x,
        np.int32(n), np.int32(k), np.int64(bsz), np.int32(1 if trans else 0)))
    return x


def getri(a, threads: int | None = None, stages: int | None = None):
    """Inverse of every matrix of ``a`` (B, n, n); returns (inv, info)."""
    cp = import_cupy()
    bsz, n = a.shape[0], a.shape[-1]
    a = cp.ascontiguousarray(a)
    if bsz == 0 or n == 0:
        return a.copy(), cp.zeros((bsz,), dtype=np.int32)
    if n <= SMALL_MAX:
        out = _alloc(a.shape, a.dtype)
        info = _alloc((bsz,), np.int32)
        _launch_warp("getri_warp", padded_size(n), n, a, out, bsz, (a, out, info),
                     (np.int32(n),), threads, stages)
        return out, info
    lu, piv, info = getrf(a)
    eye = cp.broadcast_to(cp.eye(n, dtype=a.dtype), (bsz, n, n))
    return getrs(lu, piv, eye, 0), info


# ----------------------------------------------------------------------------
# Cholesky
# ----------------------------------------------------------------------------

def potrf(a, lower: bool, threads: int | None = None):
    """Cholesky of ``a`` (B, n, n) like LAPACK potrf; returns (c, info)."""
    cp = import_cupy()
    bsz, n = a.shape[0], a.shape[-1]
    a = cp.ascontiguousarray(a)
    if bsz == 0 or n == 0:
        return a.copy(), cp.zeros((bsz,), dtype=np.int32)
    if n <= SMALL_MAX:
        size = padded_size(n)
        out = _alloc(a.shape, a.dtype)
        info = _alloc((bsz,), np.int32)
        fn = _small_function("potrf_small", a.dtype, size)
        grid, block, smem = small_launch(fn, size, bsz, a.itemsize, threads)
        fn(grid, block, (a, out, info, np.int64(bsz), np.int32(n),
                         np.int32(1 if lower else 0)), shared_mem=smem)
        return out, info
    # blocked, on the lower triangle of the Hermitian matrix potrf reads
    finite = cp.isfinite(a).all(axis=(1, 2))
    w = a if lower else a.transpose(0, 2, 1)
    w = cp.ascontiguousarray(w)
    info = cp.zeros((bsz,), dtype=np.int32)
    fn = _blocked_function("potrf_panel", a.dtype)
    for k0 in range(0, n, PANEL):
        smem = PANEL * PANEL * a.itemsize
        grid, block, smem = _panel_launch(fn, smem, bsz)
        fn(grid, block, (w, info, np.int32(n), np.int32(k0)), shared_mem=smem)
        k1 = k0 + PANEL
        if k1 < n:
            r = n - k1
            # row-major A22 -= L21 L21ᵀ == column-major (L21ᵀ)ᵀ L21ᵀ
            _gemm_strided(w, r, r, PANEL, k1 * n + k0, n, k1 * n + k0, n,
                          k1 * n + k1, n, True, bsz, n * n, -1.0, 1.0)
    tri = cp.tril(cp.ones((n, n), dtype=bool))
    if lower:
        c = cp.where(tri, w, a)
    else:
        c = cp.where(tri.T, w.transpose(0, 2, 1), a)
    info = cp.where(finite, info, -1).astype(np.int32)
    return cp.ascontiguousarray(c), info


def potrs(c, lower: bool, b):
    """Solve with a Cholesky factor from :func:`potrf`; ``b`` (B, n, k)."""
    cp = import_cupy()
    x = cp.array(b, dtype=c.dtype, order="C", copy=True)
    bsz, n, k = x.shape
    if x.size == 0:
        return x
    fn = _blocked_function("potrs_batched", c.dtype)
    total = bsz * k
    grid = -(-total // _SOLVE_THREADS)
    fn((grid,), (_SOLVE_THREADS,),
       (cp.ascontiguousarray(c), x, np.int32(n), np.int32(k), np.int64(bsz),
        np.int32(1 if lower else 0)))
    return x
