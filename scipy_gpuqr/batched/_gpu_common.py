"""Pieces shared by the GPU drivers of every order (``_gpu``, ``_gpu_blocked``).

* :func:`alloc`: every output array of the drivers is allocated here (the
  tests replace it to poison outputs with NaN before the kernels run);
* :func:`dtname`, :func:`device_id`: the cache keys of compiled kernels;
* :func:`solve_by_columns`: the solves with LU or Cholesky factors with a
  thread per (matrix, right-hand side column) of ``kernels/batched/solve.cu``,
  used for n <= 32 and n > 64;
* the *status word* of a public call (``kernels/batched/status.cu``):
  :func:`new_status` (four uint64 counters, one memset), :func:`scan_info`
  (one pass over ``info``: counts, ``check_finite=False`` clearing, NaN results
  of singular matrices), :func:`scan_nonfinite`, and :func:`read_status`, the
  one small device-to-host read (a synchronization) that the public functions
  need to warn or raise like SciPy; no per-matrix array is copied to the host.

Everything runs on the current device and stream. CuPy is imported only when
a function runs.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ._kernel_registry import (KERNEL_VARIANTS, SOLVE_FILE, STATUS_FILE, solve_name,
                               status_name)
from .._gpu import import_cupy
from .._kernels import load_module

__all__ = ["alloc", "dtname", "device_id", "solve_by_columns", "cupy",
           "new_status", "scan_info", "scan_nonfinite", "read_status",
           "STATUS_SINGULAR", "STATUS_NONFINITE", "STATUS_FACTOR", "STATUS_RHS",
           "rhs_operand"]

#: Threads per block of the solves by columns.
SOLVE_THREADS = 128

#: Threads per block and most blocks of the status kernels (grid-stride loops).
SCAN_THREADS = 256
SCAN_MAX_BLOCKS = 8192

#: Slots of the status word (kernels/batched/status.cu): matrices with
#: info > 0, matrices with info < 0 (inf/NaN input), an inf/NaN seen in a
#: factor, an inf/NaN seen in a right-hand side.
STATUS_SINGULAR, STATUS_NONFINITE, STATUS_FACTOR, STATUS_RHS = range(4)

#: A null pointer kernel argument.
NULL = np.uint64(0)

_CUPY = None


def cupy():
    """The ``cupy`` module (imported once; :func:`import_cupy` looks it up each call)."""
    global _CUPY
    if _CUPY is None:
        _CUPY = import_cupy()
    return _CUPY


def alloc(shape, dtype):
    """An uninitialized output array (tests replace this to poison outputs)."""
    return cupy().empty(shape, dtype=dtype)


def dtname(dtype) -> str:
    """``'float32'`` / ``'float64'``: the dtype's part of a kernel's cache key."""
    return np.dtype(dtype).name


def device_id() -> int:
    """The current CUDA device: a module loaded on one GPU is not usable on another."""
    return cupy().cuda.runtime.getDevice()


@functools.lru_cache(maxsize=None)
def _solve_function(kernel: str, dt: str, device: int):
    module = load_module(SOLVE_FILE, KERNEL_VARIANTS[SOLVE_FILE])
    return module.get_function(solve_name(kernel, dt))


def rhs_operand(b, dtype):
    """``(b, bstride)`` for the solve kernels from right-hand sides ``b`` (B, n, k).

    Each matrix's (n, k) block must be C-contiguous; the batch stride may be
    0 (one ``b`` broadcast to every matrix: no copy) or n * k elements. Any
    other layout, or another dtype, is copied once here.
    """
    cp = cupy()
    bsz, n, k = b.shape
    if b.dtype != dtype:
        b = b.astype(dtype)
    item = b.itemsize
    s0, s1, s2 = b.strides
    inner = (k <= 1 or s2 == item) and (n <= 1 or s1 == k * item)
    if inner and (s0 == 0 or bsz <= 1):
        return b, 0
    if not (inner and s0 == n * k * item):
        b = cp.ascontiguousarray(b)
    return b, n * k


def solve_by_columns(kernel: str, dtype, b, factors: tuple, flag: int, status=None):
    """``kernel`` (``getrs_batched`` / ``potrs_batched``: a thread per matrix and
    right-hand side column, any n): the solutions of ``b`` (B, n, k) in a new array.

    The kernel's arguments: ``factors`` (contiguous), b, the solution, n, k,
    B, ``flag`` (transposed / lower), b's batch stride and ``status`` (None:
    no finiteness checks; else the factor's and b's infs/NaNs are counted
    into its slots :data:`STATUS_FACTOR` and :data:`STATUS_RHS`).
    """
    bsz, n, k = b.shape
    x = alloc((bsz, n, k), dtype)
    if x.size == 0:
        return x
    src, bstride = rhs_operand(b, dtype)
    fn = _solve_function(kernel, dtname(dtype), device_id())
    grid = -(-(bsz * k) // SOLVE_THREADS)
    fn((grid,), (SOLVE_THREADS,),
       factors + (src, x, np.int32(n), np.int32(k), np.int64(bsz), np.int32(flag),
                  np.int64(bstride), NULL if status is None else status))
    return x


# ----------------------------------------------------------------------------
# the status word of a public call
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _status_function(kernel: str, dt: str, device: int):
    module = load_module(STATUS_FILE, KERNEL_VARIANTS[STATUS_FILE])
    return module.get_function(status_name(kernel, dt))


def _scan_grid(count: int) -> int:
    return max(1, min(SCAN_MAX_BLOCKS, -(-count // SCAN_THREADS)))


#: The status word of each device, per thread: a public call zeroes it, its
#: kernels add to it and it reads it back before returning, so one thread's
#: calls never overlap on it (each is synchronous from the memset to the read).
_STATUS = threading.local()


def new_status():
    """Four zeroed uint64 counters on the device (slots ``STATUS_*``): one memset
    on the current stream (the buffer is this thread's, reused)."""
    cp = cupy()
    bufs = getattr(_STATUS, "bufs", None)
    if bufs is None:
        bufs = _STATUS.bufs = {}
    dev = device_id()
    st = bufs.get(dev)
    if st is None:
        st = bufs[dev] = cp.empty(4, dtype=cp.uint64)
    cp.cuda.runtime.memsetAsync(st.data.ptr, 0, 32, cp.cuda.get_current_stream().ptr)
    return st


def scan_info(info, status=None, x=None, clear_neg: bool = False) -> None:
    """One pass over ``info`` (contiguous int32, any shape, one entry per matrix).

    Counts ``info > 0`` and ``info < 0`` into ``status`` (None: no counting);
    ``clear_neg``: ``info < 0`` (inf/NaN input) becomes 0; ``x`` (contiguous,
    ``info.size`` matrices): the matrices with ``info > 0`` are filled with NaN.
    """
    batch = info.size
    if batch == 0 or (status is None and x is None and not clear_neg):
        return
    nn = x.size // batch if x is not None else 0
    fn = _status_function("info_scan", dtname(x.dtype) if x is not None else "float64",
                          device_id())
    fn((_scan_grid(batch),), (SCAN_THREADS,),
       (info, np.int64(batch), NULL if x is None or nn == 0 else x, np.int64(nn),
        NULL if status is None else status, np.int32(1 if clear_neg else 0)))


def scan_nonfinite(x, status, slot: int) -> None:
    """Add the number of infs and NaNs of ``x`` (float32/float64) to ``status[slot]``."""
    if x.size == 0:
        return
    cp = cupy()
    x = x if x.flags.c_contiguous else cp.ascontiguousarray(x)
    fn = _status_function("nonfinite_scan", dtname(x.dtype), device_id())
    fn((_scan_grid(x.size),), (SCAN_THREADS,), (x, np.int64(x.size), status, np.int32(slot)))


#: A pinned host buffer per thread for :func:`read_status` (a direct DMA, no
#: staging through pageable memory; reused: the read completes before it returns).
_PINNED = threading.local()


def read_status(status) -> list:
    """The four counters as Python ints: one 32-byte copy to the host (waits
    for the work queued before it on the current stream)."""
    buf = getattr(_PINNED, "buf", None)
    if buf is None:
        import cupyx
        buf = _PINNED.buf = cupyx.empty_pinned((4,), dtype=np.uint64)
    status.get(out=buf)
    return buf.tolist()
