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

Nothing here changes a result: the thread writes only its own buffers, never
the call's arrays, and never waits for the device as a whole (its stream,
not the legacy default stream). A failure (no stream-ordered allocator, say)
ends the thread silently: the call pays the set-up itself, as without it.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

__all__ = ["GEMM_SHAPES", "TRSM_ORDERS", "EDGE", "start_blas_warmup"]

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


def _dim(d) -> int:
    return EDGE if d == "E" else int(d)


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
                for ta, tb, m, n, k in GEMM_SHAPES:
                    m, n, k = _dim(m), _dim(n), _dim(k)
                    lda = m if ta == "N" else k
                    ldb = k if tb == "N" else n
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
    kinds = ((cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_OP_N, cublas.CUBLAS_DIAG_UNIT),
             (cublas.CUBLAS_FILL_MODE_UPPER, cublas.CUBLAS_OP_N, cublas.CUBLAS_DIAG_NON_UNIT),
             (cublas.CUBLAS_FILL_MODE_UPPER, cublas.CUBLAS_OP_T, cublas.CUBLAS_DIAG_NON_UNIT))
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
