"""cuBLAS made ready on a worker thread while a new process's first GPU call starts.

A process's first cuBLAS handle initializes the library, and each GEMM or
TRSM kernel is loaded into the CUDA context when first launched (CUDA's lazy
module loading): together a tenth of a second or more on the call's thread,
at its first dense front, longer while the GPU is busy with the call's
launches. :func:`start_blas_warmup` does that set-up on a daemon thread
instead, once per process, device and value type, while the call's thread
goes on (schedule, first launches, a kernel compile): a handle of its own, on
a non-blocking stream of its own, runs the products the dense fronts run, on
operands of the same kinds of shapes (:data:`GEMM_SHAPES`) in a scratch
buffer of the stream-ordered allocator, and the triangular solves of the
panels' T factors and of R's blocks (:data:`TRSM_ORDERS`), then frees
everything. The loaded kernels and the library's state are the context's, so
the call's own handle finds them.

The solves' operands are two small arrays of CuPy's pool (1 MB in float64), not of
the stream-ordered allocator: cuBLAS's ``trsm`` on memory of
``cudaMallocAsync`` read out of bounds under ``compute-sanitizer --tool
memcheck`` on an H200 whichever handle solved first, and faulted with an
illegal address in about one process in three when it ran after a ``trsm``
on CuPy's handle; on ordinary device memory both orders were clean.

On device 0, the device whose primary context a new process's driver
thread makes (:func:`scipy_gpuqr._gpu.start_driver`), the set-up needs no
CuPy (:func:`driver_warmup`): cuBLAS is loaded the way CuPy loads it
(``cuda.pathfinder``, which keeps one loaded copy per process) and called
through ``ctypes`` on that context, on buffers of the driver's allocator,
so that a new process's first call, which starts the warm-up before CuPy's
import, has cuBLAS ready about when the import ends instead of a few tenths
of a second after it. Where that cannot run (no ``cuda.pathfinder``, a
library that does not load) the thread sets up through CuPy instead.

Nothing here changes a result: the thread writes only its own buffers, never
the call's arrays, and never waits for the device as a whole (its stream,
not the legacy default stream). A failure (no stream-ordered allocator, say)
ends the thread silently: the call pays the set-up itself, as without it.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ... import _gpu

__all__ = ["GEMM_SHAPES", "TRSM_ORDERS", "TRSM_KINDS", "EDGE", "start_blas_warmup", "driver_warmup"]

#: The largest dimension of a warm-up operand (a front's rows and columns are
#: capped at it: the kernels cuBLAS picks for larger ones are of the same
#: kinds; three EDGE² arrays are the scratch buffer).
EDGE = 1024

#: ``(opA, opB, m, n, k)`` of the column-major products of a dense front
#: (:mod:`scipy_gpuqr._engine.dense_front`; ``E`` = :data:`EDGE`): a panel's
#: trailing update (``W = Cᵀ V``, ``W2 = W T``, ``Cᵀ -= W2 Vᵀ``, 256-column
#: panels) on a large and a small remainder, the sub-panel updates inside a
#: panel (32 columns), and ``VᵀV`` of the panel's T factor.
GEMM_SHAPES: tuple = (
    ("N", "N", "E", 256, "E"), ("N", "T", "E", 256, 256), ("N", "T", "E", "E", 256),
    ("N", "N", 64, 256, "E"), ("N", "T", 64, 256, 256), ("N", "T", 64, "E", 256),
    ("N", "N", 224, 32, "E"), ("N", "T", 224, 32, 32), ("N", "T", 224, "E", 32),
    ("N", "N", 32, 32, "E"), ("N", "T", 32, 32, 32), ("N", "T", 32, "E", 32),
    ("T", "N", 256, 256, "E"),
)

#: Orders of the warm-up's triangular solves (side left, as many right-hand
#: sides as the order): a panel's T factor (lower, unit diagonal, 256 and its
#: 32-column sub-panels) and R's diagonal blocks (upper, ``R⁻¹`` and ``R⁻ᵀ``).
TRSM_ORDERS: tuple = (256, 32)

#: ``(fill, op, diagonal)`` of the solves at each order of :data:`TRSM_ORDERS`:
#: T factors (lower, unit), ``R⁻¹`` and ``R⁻ᵀ`` (upper, not unit).
TRSM_KINDS: tuple = (("L", "N", "U"), ("U", "N", "N"), ("U", "T", "N"))


def _dim(d) -> int:
    return EDGE if d == "E" else int(d)


def _gemm_calls():
    """``(opA, opB, m, n, k, lda, ldb)`` of each product of :data:`GEMM_SHAPES`
    (column-major operands, ``ldc = m``)."""
    for ta, tb, m, n, k in GEMM_SHAPES:
        m, n, k = _dim(m), _dim(n), _dim(k)
        yield ta, tb, m, n, k, (m if ta == "N" else k), (k if tb == "N" else n)


def start_blas_warmup(device: int, dtype: str) -> threading.Thread:
    """Start the set-up of cuBLAS for ``device`` and ``dtype`` ('float64' or
    'float32') on a daemon thread (``gpuqr-blas-warmup``), once per process,
    device and value type; returns the thread (the same one on later calls).

    Once also where callers ask at the same moment, as a new process's first
    call does (its prefetch thread and its own thread, a few milliseconds
    apart): a cache alone let both start a thread, and two warm-ups then ran
    beside the call's first launches, each with its handle and products."""
    with _START_LOCK:
        return _started(int(device), np.dtype(dtype).name)


#: Makes :func:`start_blas_warmup`'s look-up and start one step.
_START_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _started(device: int, dtype: str) -> threading.Thread:
    t = threading.Thread(target=_quiet_warmup, args=(device, np.dtype(dtype)),
                         name="gpuqr-blas-warmup", daemon=True)
    t.start()
    return t


start_blas_warmup.cache_clear = _started.cache_clear


def _quiet_warmup(device: int, dtype: np.dtype) -> None:
    try:
        if not (device == 0 and driver_warmup(dtype)):
            warmup(device, dtype)
    except Exception:  # noqa: BLE001 - the call's own first use sets cuBLAS up instead
        pass


def warmup(device: int, dtype) -> None:
    """The set-up itself, on the calling thread (see the module's notes)."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    dtype = np.dtype(dtype)
    single = dtype == np.float32
    gemm = cublas.sgemm if single else cublas.dgemm
    op = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}
    one, zero = np.ones(1, dtype=dtype), np.zeros(1, dtype=dtype)
    isz = dtype.itemsize
    block = EDGE * EDGE * isz
    rt = cp.cuda.runtime
    with cp.cuda.Device(device):
        stream = cp.cuda.Stream(non_blocking=True)
        handle = cublas.create()
        try:
            cublas.setStream(handle, stream.ptr)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            ptr = rt.mallocAsync(3 * block, stream.ptr)
            try:
                rt.memsetAsync(ptr, 0, 3 * block, stream.ptr)
                A, B, C = ptr, ptr + block, ptr + 2 * block
                for ta, tb, m, n, k, lda, ldb in _gemm_calls():
                    gemm(handle, op[ta], op[tb], m, n, k, one.ctypes.data, A, lda, B, ldb,
                         zero.ctypes.data, C, m)
                stream.synchronize()
                _warm_trsm(cp, cublas, handle, stream, dtype)
            finally:
                rt.freeAsync(ptr, stream.ptr)
                stream.synchronize()
        finally:
            cublas.destroy(handle)


def _warm_trsm(cp, cublas, handle, stream, dtype: np.dtype) -> None:
    """The solves of :data:`TRSM_ORDERS` on ``handle`` and ``stream``: ``I⁻¹ 0``
    in two arrays of CuPy's pool, freed when the stream is done."""
    trsm = cublas.strsm if dtype == np.float32 else cublas.dtrsm
    one = np.ones(1, dtype=dtype)
    rt = cp.cuda.runtime
    fills = {"L": cublas.CUBLAS_FILL_MODE_LOWER, "U": cublas.CUBLAS_FILL_MODE_UPPER}
    ops = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}
    diags = {"U": cublas.CUBLAS_DIAG_UNIT, "N": cublas.CUBLAS_DIAG_NON_UNIT}
    kinds = [(fills[f], ops[o], diags[d]) for f, o, d in TRSM_KINDS]
    b = max(TRSM_ORDERS)
    A = cp.empty(b * b, dtype=dtype)
    B = cp.empty(b * b, dtype=dtype)
    try:
        for n in TRSM_ORDERS:
            eye = np.eye(n, dtype=dtype).ravel()
            rt.memcpyAsync(A.data.ptr, eye.ctypes.data, eye.nbytes, rt.memcpyHostToDevice,
                           stream.ptr)
            rt.memsetAsync(B.data.ptr, 0, eye.nbytes, stream.ptr)
            for fill, trans, diag in kinds:
                trsm(handle, cublas.CUBLAS_SIDE_LEFT, fill, trans, diag, n, n, one.ctypes.data,
                     A.data.ptr, n, B.data.ptr, n)
            stream.synchronize()            # eye lives until its copy is done
    finally:
        stream.synchronize()
        del A, B


#: cuBLAS's enumerations as the v2 API numbers them (``cublas_api.h``).
_OP = {"N": 0, "T": 1}
_FILL = {"L": 0, "U": 1}
_DIAG = {"N": 0, "U": 1}
_SIDE_LEFT = 0

#: ``cuStreamCreate``'s flag for a stream that does not wait for the legacy
#: default stream.
_STREAM_NON_BLOCKING = 1


def driver_warmup(dtype, driver=None, load_cublas=None) -> bool:
    """The set-up of :func:`warmup` on device 0 without CuPy, on the calling
    thread: after the process's driver thread (:func:`scipy_gpuqr._gpu.
    wait_for_driver`), on device 0's primary context (the one CuPy's runtime
    uses), a handle of its own on a non-blocking stream of its own, the same
    products and solves on buffers of the driver's allocator, everything
    freed. Returns False, having done nothing, where cuBLAS or the driver
    cannot be had this way.

    ``driver`` and ``load_cublas`` (the driver library, and a callable that
    returns cuBLAS's) are for tests; by default ``libcuda.so.1`` and the
    copy of cuBLAS ``cuda.pathfinder`` loads, which is the one CuPy's
    ``cupy_backends.cuda.libs.cublas`` then uses (one loaded copy per process).
    """
    lib = _gpu.driver_library() if driver is None else driver
    if lib is None:
        return False
    _gpu.wait_for_driver()
    blas = (load_cublas or _pathfinder_cublas)()
    if blas is None:
        return False
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), 0) \
            or lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev):
        return False
    try:
        if lib.cuCtxSetCurrent(ctx):
            return False
        _driver_products(lib, blas, np.dtype(dtype))
        return True
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)


def _pathfinder_cublas():
    """cuBLAS as ``ctypes.CDLL`` of the file ``cuda.pathfinder`` loads, or None."""
    try:
        from cuda import pathfinder
        return ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:  # noqa: BLE001 - no pathfinder (an older CuPy), or no cuBLAS found
        return None


def _check(status, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} returned {status}")


def _driver_products(lib, blas, dtype: np.dtype) -> None:
    """:data:`GEMM_SHAPES` and :data:`TRSM_ORDERS` through ``blas`` on the
    calling thread's current context (see :func:`driver_warmup`)."""
    single = dtype == np.float32
    scalar = ctypes.c_float if single else ctypes.c_double
    gemm = blas.cublasSgemm_v2 if single else blas.cublasDgemm_v2
    trsm = blas.cublasStrsm_v2 if single else blas.cublasDtrsm_v2
    one, zero = scalar(1.0), scalar(0.0)
    isz = dtype.itemsize
    block = EDGE * EDGE * isz
    stream, handle, mem = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    _check(lib.cuStreamCreate(ctypes.byref(stream), ctypes.c_uint(_STREAM_NON_BLOCKING)),
           "cuStreamCreate")
    try:
        _check(lib.cuMemAlloc_v2(ctypes.byref(mem), ctypes.c_size_t(3 * block)), "cuMemAlloc")
        try:
            _check(blas.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
            try:
                _check(blas.cublasSetStream_v2(handle, stream), "cublasSetStream")
                _driver_calls(lib, blas, gemm, trsm, handle, stream, mem.value, block,
                              one, zero, dtype)
            finally:
                blas.cublasDestroy_v2(handle)
        finally:
            lib.cuStreamSynchronize(stream)
            lib.cuMemFree_v2(mem)
    finally:
        lib.cuStreamDestroy_v2(stream)


def _driver_calls(lib, blas, gemm, trsm, handle, stream, base: int, block: int,
                  one, zero, dtype: np.dtype) -> None:
    """The products in three ``EDGE²`` blocks at ``base``, then the solves with an
    identity in the first block (every solve's ``A``) and the second (its ``B``)."""
    ptr = ctypes.c_void_p
    _check(lib.cuMemsetD8Async(ctypes.c_uint64(base), ctypes.c_ubyte(0),
                               ctypes.c_size_t(3 * block), stream), "cuMemsetD8Async")
    A, B, C = ptr(base), ptr(base + block), ptr(base + 2 * block)
    for ta, tb, m, n, k, lda, ldb in _gemm_calls():
        _check(gemm(handle, _OP[ta], _OP[tb], m, n, k, ctypes.byref(one), A, lda, B, ldb,
                    ctypes.byref(zero), C, m), "cublas gemm")
    b = max(TRSM_ORDERS)
    eye = np.eye(b, dtype=dtype)
    _check(lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(base), eye.ctypes.data_as(ptr),
                                    ctypes.c_size_t(eye.nbytes), stream), "cuMemcpyHtoDAsync")
    for n in TRSM_ORDERS:
        for fill, trans, diag in TRSM_KINDS:
            _check(trsm(handle, _SIDE_LEFT, _FILL[fill], _OP[trans], _DIAG[diag], n, n,
                        ctypes.byref(one), A, b, B, b), "cublas trsm")
    _check(lib.cuStreamSynchronize(stream), "cuStreamSynchronize")     # eye lives until here
