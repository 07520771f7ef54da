"""Pieces shared by the GPU drivers of every order (``_gpu``, ``_gpu_blocked``).

* :func:`alloc_outputs`: every output array of the drivers is allocated
  here, the outputs of one call as views of one pool allocation (the tests
  replace it to poison outputs with NaN before the kernels run);
  :func:`alloc_layout`, the same allocation as addresses, for a caller that
  needs few of the arrays;
* :func:`dtname`, :func:`device_id`: the cache keys of compiled kernels;
* :func:`solve_by_columns`: the solves with LU or Cholesky factors with a
  thread per (matrix, right-hand side column) of ``kernels/batched/solve.cu``,
  used for n <= 32 and n > 64;
* the *status word* of a public call (``kernels/batched/status.cuh``):
  :func:`new_status` (five uint64 slots, never cleared: a call takes a new
  generation and the kernels write it into the slots of what they saw, so
  nothing is launched to reset it), :func:`report_args` (the ``status, ctl``
  arguments every factorization kernel of n <= 32 takes: it marks the word,
  clears ``info < 0`` for ``check_finite=False`` and writes the NaN results of
  singular matrices itself), :func:`scan_info` (the same as one pass over
  ``info``, for the drivers whose kernels do not report), :func:`scan_nonfinite`,
  and :func:`read_status`, the one wait (a synchronization) that the public
  functions need to warn or raise like SciPy: the kernels also mark the
  word's mirror in mapped pinned memory, so the host then reads its own
  memory; nothing is copied to the host.

Everything runs on the current device and stream. CuPy is imported only when
a function runs.
"""

from __future__ import annotations

import functools
import math
import struct
import threading

import numpy as np

from ._kernel_registry import (KERNEL_VARIANTS, SMALL_FILES, SMALL_MAX, SOLVE_FILE,
                               STATUS_FILE, small_name, solve_name, status_name)
from .._gpu import import_cupy
from .._kernels import load_module

__all__ = ["alloc", "alloc_outputs", "alloc_layout", "dtname", "device_id", "solve_by_columns",
           "solve_columns", "cupy",
           "new_status", "report_args", "report_words", "NO_REPORT", "finish_report", "scan_info",
           "scan_nonfinite", "read_status", "STATUS_SINGULAR", "STATUS_NONFINITE",
           "STATUS_FACTOR", "STATUS_RHS", "STATUS_SIZES", "STATUS_SLOTS", "CTL_CLEAR_NEG",
           "CTL_NAN_FILL", "rhs_operand",
           "launch", "arg_value", "read_words", "STATUS_WAIT", "WARP_GETRS",
           "WARP_POTRS", "potrs_checks_all"]

#: Threads per block of the solves by columns.
SOLVE_THREADS = 128

#: Threads per block and most blocks of the status kernels (grid-stride loops).
SCAN_THREADS = 256
SCAN_MAX_BLOCKS = 8192

#: Slots of the status word (kernels/batched/status.cuh): some matrix has
#: info > 0, some has info < 0 (inf/NaN input), an inf/NaN seen in a
#: factor, an inf/NaN seen in a right-hand side, a per-matrix size of a
#: padded stack outside [0, n] (the ``*_vbatched`` calls).
STATUS_SINGULAR, STATUS_NONFINITE, STATUS_FACTOR, STATUS_RHS, STATUS_SIZES = range(5)

#: Slots of a status word.
STATUS_SLOTS = 5

#: Flags of a kernel's ``ctl`` argument (its low two bits; the generation of
#: the status word above them): ``info < 0`` stored as 0; all-NaN results for
#: the matrices with ``info > 0``.
CTL_CLEAR_NEG, CTL_NAN_FILL = 1, 2

#: A null pointer kernel argument.
NULL = np.uint64(0)

#: ``(status, ctl)`` of a driver call that reports nothing and sets no flag.
NO_REPORT = (NULL, np.uint64(0))

#: Alignment of the outputs inside one allocation (the kernels' 16-byte
#: vector paths need 16; 256 as CuPy's pool gives).
_ALIGN = 256

_CUPY = None


def cupy():
    """The ``cupy`` module (imported once; :func:`import_cupy` looks it up each call)."""
    global _CUPY
    if _CUPY is None:
        _CUPY = import_cupy()
    return _CUPY


@functools.lru_cache(maxsize=512)
def _layout(specs) -> tuple:
    """((shape, dtype, byte offset), ...) and the total bytes of ``specs``
    in one allocation (a pure function of the shapes and dtypes)."""
    out, total = [], 0
    for shape, dtype in specs:
        dt = np.dtype(dtype)
        out.append((tuple(shape), dt, total))
        nbytes = math.prod(shape) * dt.itemsize
        total += -(-nbytes // _ALIGN) * _ALIGN
    return tuple(out), max(total, 1)


def alloc_outputs(specs):
    """Uninitialized output arrays of ``specs`` ((shape, dtype), ...): views
    of one allocation from CuPy's pool, each 256-byte aligned (the tests
    replace this to poison outputs)."""
    cp = cupy()
    try:
        layout, total = _layout(specs)
    except TypeError:                     # unhashable shapes (lists)
        layout, total = _layout(tuple((tuple(s), d) for s, d in specs))
    mem = cp.cuda.alloc(total)
    nd = cp.ndarray
    return [nd(shape, dt, memptr=mem + off) if off else nd(shape, dt, memptr=mem)
            for shape, dt, off in layout]


def alloc(shape, dtype):
    """One uninitialized output array (:func:`alloc_outputs`)."""
    return alloc_outputs(((shape, dtype),))[0]


def alloc_layout(specs) -> tuple:
    """The allocation of :func:`alloc_outputs` without its arrays: ``(memory,
    ((shape, dtype, byte offset), ...))``, ``memory`` a ``MemoryPointer`` of
    CuPy's pool. For a caller that passes addresses to its kernels and makes
    arrays only of what it returns (each ``cupy.ndarray`` costs about a
    microsecond of host time); the tests replace it to poison the memory.
    ``specs`` must be hashable (tuples)."""
    layout, total = _layout(specs)
    return cupy().cuda.alloc(total), layout


#: dtype -> its name, for the kernels' dtypes (``np.dtype.name`` is computed
#: in Python on every access: a few microseconds of each launch).
_DTNAMES = {np.dtype(t): np.dtype(t).name for t in (np.float32, np.float64, np.int32,
                                                    np.int64)}


def dtname(dtype) -> str:
    """``'float32'`` / ``'float64'``: the dtype's part of a kernel's cache key."""
    name = _DTNAMES.get(dtype)
    return name if name is not None else np.dtype(dtype).name


def device_id() -> int:
    """The current CUDA device: a module loaded on one GPU is not usable on another."""
    return cupy().cuda.runtime.getDevice()


class _LaunchArgs(threading.local):
    """This thread's parameter block for :func:`launch`: 8-byte slots and the
    array of their addresses that cuLaunchKernel reads (the driver copies the
    values at the launch, so the block is reused)."""

    SLOTS = 16

    def __init__(self):
        self.vals = np.zeros(self.SLOTS, dtype=np.uint64)
        self.ptrs = (np.arange(self.SLOTS, dtype=np.uint64) * np.uint64(8)
                     + np.uint64(self.vals.ctypes.data))
        self.addr = int(self.ptrs.ctypes.data)
        #: pack_into of k little-endian uint64 values, by k
        self.pack = [struct.Struct(f"<{k}Q").pack_into for k in range(self.SLOTS + 1)]
        self.launch_kernel = None          # CuPy's, looked up at the first launch

    def bind(self) -> None:
        from cupy_backends.cuda.api import driver

        self.launch_kernel = driver.launchKernel
        self.current_stream = cupy().cuda.get_current_stream


_LAUNCH_ARGS = _LaunchArgs()


def arg_value(x) -> int:
    """A kernel argument as :func:`launch` takes it: a CuPy array's address,
    else the integer itself."""
    if x is NULL:
        return 0
    data = getattr(x, "data", None)
    return data.ptr if data is not None and hasattr(data, "ptr") else int(x)


def launch(fptr: int, grid: int, block: int, smem: int, values) -> None:
    """cuLaunchKernel of the CUfunction ``fptr`` (``RawKernel.kernel.ptr``)
    on the current stream, 1-D grid and block.

    ``values``: the kernel's arguments as non-negative integers (addresses,
    sizes, flags; NumPy integer scalars too), each in an 8-byte slot from
    which a 4-byte parameter reads its low half (little-endian). The public
    calls' launches take this path: CuPy's kernel call converts each argument
    to a new object, which costs several microseconds of host time per launch.
    """
    buf = _LAUNCH_ARGS
    if buf.launch_kernel is None:
        buf.bind()
    buf.pack[len(values)](buf.vals, 0, *values)
    buf.launch_kernel(fptr, grid, 1, 1, block, 1, 1, smem, buf.current_stream().ptr,
                      buf.addr, 0)


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


def solve_by_columns(kernel: str, dtype, b, factors: tuple, flag: int,
                     report=NO_REPORT, info=None):
    """``kernel`` (``getrs_batched`` / ``potrs_batched``: a thread per matrix and
    right-hand side column, any n): the solutions of ``b`` (B, n, k) in a new array.

    The kernel's arguments: ``factors`` (contiguous), b, the solution, n, k,
    B, ``flag`` (transposed / lower), b's batch stride and ``report``
    (:func:`report_args`; a null status: no finiteness checks, else the
    factor's and b's infs/NaNs mark its slots :data:`STATUS_FACTOR` and
    :data:`STATUS_RHS`). ``info`` (``getrs_batched`` only): with
    :data:`CTL_NAN_FILL` in the report the solutions of the matrices whose
    ``info`` is > 0 are NaN.
    """
    bsz, n, k = b.shape
    x = alloc((bsz, n, k), dtype)
    if x.size == 0:
        return x
    src, bstride = rhs_operand(b, dtype)
    solve_columns(kernel, dtype, x, src, bstride, bsz, n, k,
                  tuple(f.data.ptr for f in factors), flag, report,
                  0 if info is None else info.data.ptr)
    return x


#: LU solves without transpose of n <= 32 by ``getrs_warp`` and Cholesky
#: solves of n <= 32 by ``potrs_warp`` (kernels/batched/solve_warp.cu: a
#: row of the factor per lane, the triangular solves by shuffles) instead of
#: ``getrs_batched`` / ``potrs_batched`` (a thread per matrix and column).
WARP_GETRS = True
WARP_POTRS = True

#: Threads per block of ``getrs_warp`` / ``potrs_warp``.
GETRS_WARP_THREADS = 256


def potrs_checks_all(n: int) -> bool:
    """Whether the Cholesky solve of order ``n`` looks at the whole factor
    for infs and NaNs itself (``potrs_warp``), so that the caller needs no
    :func:`scan_nonfinite` pass for SciPy's check of all of ``c``."""
    return WARP_POTRS and n <= SMALL_MAX


@functools.lru_cache(maxsize=None)
def _getrs_warp_plan(dt: str, n: int, device: int, kernel: str = "getrs_warp"):
    """(CUfunction, resident blocks on the device, matrices per warp) of
    ``kernel<dt, n>`` (``getrs_warp`` / ``potrs_warp``, compiled on its own
    when first used)."""
    from cupy_backends.cuda.api import driver

    name = small_name(kernel, dt, n)
    fn = load_module(SMALL_FILES[kernel], (name,)).get_function(name)
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr,
                                                              GETRS_WARP_THREADS, 0)
    sms = cupy().cuda.Device(device).attributes["MultiProcessorCount"]
    seg = 1
    while seg < n:
        seg *= 2
    return fn.kernel.ptr, max(1, int(per_sm)) * sms, 32 // seg


def solve_columns(kernel: str, dtype, x, b, bstride: int, bsz: int, n: int, k: int,
                  factors: tuple, flag: int, report=NO_REPORT, info: int = 0,
                  device: int | None = None) -> None:
    """The launch of :func:`solve_by_columns` into ``x`` (contiguous, ``bsz * n * k``
    elements, any shape): ``b`` read at batch stride ``bstride`` (each
    matrix's (n, k) block C-contiguous), ``factors`` and ``info`` as device
    addresses (``info`` 0: none), ``bsz``, ``n`` and ``k`` positive.
    ``getrs_batched`` without transpose of n <= 32 runs ``getrs_warp``
    instead (:data:`WARP_GETRS`), ``potrs_batched`` of n <= 32
    ``potrs_warp`` (:data:`WARP_POTRS`; it also checks the whole factor:
    :func:`potrs_checks_all`): the same arguments, the same results."""
    dev = device_id() if device is None else device
    if n <= SMALL_MAX and ((kernel == "getrs_batched" and flag == 0 and WARP_GETRS)
                           or (kernel == "potrs_batched" and WARP_POTRS)):
        warp = "getrs_warp" if kernel == "getrs_batched" else "potrs_warp"
        fptr, resident, mw = _getrs_warp_plan(dtname(dtype), n, dev, warp)
        tasks = -(-bsz // mw)
        grid = max(1, min(resident, -(-tasks // (GETRS_WARP_THREADS // 32))))
        if warp == "getrs_warp":
            values = (factors[0], factors[1], b.data.ptr, x.data.ptr, k, bsz, bstride,
                      arg_value(report[0]), report[1], info)
        else:
            values = (factors[0], b.data.ptr, x.data.ptr, k, bsz, flag, bstride,
                      arg_value(report[0]), report[1])
        launch(fptr, grid, GETRS_WARP_THREADS, 0, values)
        return
    fn = _solve_function(kernel, dtname(dtype), dev)
    values = list(factors)
    values += (b.data.ptr, x.data.ptr, n, k, bsz, flag, bstride,
               arg_value(report[0]), report[1])
    if kernel == "getrs_batched":
        values.append(info)
    launch(fn.kernel.ptr, -(-(bsz * k) // SOLVE_THREADS), SOLVE_THREADS, 0, values)


# ----------------------------------------------------------------------------
# the status word of a public call
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _status_function(kernel: str, dt: str, device: int):
    module = load_module(STATUS_FILE, KERNEL_VARIANTS[STATUS_FILE])
    return module.get_function(status_name(kernel, dt))


def _scan_grid(count: int) -> int:
    return max(1, min(SCAN_MAX_BLOCKS, -(-count // SCAN_THREADS)))


class _StatusWord:
    """The status word of one thread on one device and the generation of the
    call using it.

    ``buf``: :data:`STATUS_SLOTS` uint64 slots on the device, which the
    kernels compare with the call's generation before they write it;
    followed in the same allocation by the device address of ``host``, their
    mirror in mapped pinned memory, which the kernel that sets a device slot
    also writes (``SLOT_HOST`` in ``kernels/batched/status.cuh``). The host
    reads the mirror after waiting for the stream: no copy is queued.
    """

    __slots__ = ("buf", "ptr", "host", "gen")

    def __init__(self):
        cp = cupy()
        rt = cp.cuda.runtime
        nbytes = 8 * STATUS_SLOTS
        pinned = cp.cuda.PinnedMemory(nbytes, rt.hostAllocMapped | rt.hostAllocPortable)
        self.host = np.ndarray((STATUS_SLOTS,), np.uint64,
                               buffer=cp.cuda.PinnedMemoryPointer(pinned, 0))
        self.host.fill(0)
        mirror = rt.pointerGetAttributes(pinned.ptr).devicePointer
        word = cp.array([0] * STATUS_SLOTS + [mirror], dtype=np.uint64)
        self.buf = word[:STATUS_SLOTS]
        self.ptr = self.buf.data.ptr
        self.gen = 0


#: The status words of this thread, by device: a public call takes the next
#: generation and reads the word back before returning, so one thread's
#: calls never overlap on it.
_STATUS = threading.local()


def new_status(device: int | None = None):
    """The status word for a new call on ``device`` (default: the current
    one) (a new generation; nothing is launched: slots hold the generation
    of the call that last marked them)."""
    words = getattr(_STATUS, "words", None)
    if words is None:
        words = _STATUS.words = {}
    dev = device_id() if device is None else device
    st = words.get(dev)
    if st is None:
        st = words[dev] = _StatusWord()
    st.gen += 1
    return st


def report_args(status, clear_neg: bool = False, nan_fill: bool = False) -> tuple:
    """``(status, ctl)``, the last two arguments of the reporting kernels.

    ``status``: a word of :func:`new_status` or None (nothing is marked, the
    flags still apply); ``clear_neg``: ``info < 0`` is stored as 0;
    ``nan_fill``: matrices with ``info > 0`` get all-NaN results.
    """
    flags = (CTL_CLEAR_NEG if clear_neg else 0) | (CTL_NAN_FILL if nan_fill else 0)
    if status is None:
        return (NULL, np.uint64(flags))
    return (status.buf, np.uint64((status.gen << 2) | flags))


def report_words(status, clear_neg: bool = False) -> tuple:
    """:func:`report_args` of a :func:`new_status` word as two plain
    integers, the word's address and ``ctl``, for a launch on addresses
    (:func:`launch` packs integers; no NumPy scalar is made)."""
    return status.ptr, (status.gen << 2) | (CTL_CLEAR_NEG if clear_neg else 0)


def finish_report(info, report, x=None) -> None:
    """For drivers whose kernels do not report: one pass over ``info``
    applying ``report`` (:func:`scan_info`); nothing for :data:`NO_REPORT`."""
    if report[0] is NULL and int(report[1]) == 0:
        return
    scan_info(info, report, x)


def scan_info(info, report, x=None) -> None:
    """One pass over ``info`` (contiguous int32, any shape, one entry per matrix).

    Marks ``report``'s status word (:func:`report_args`) when some
    ``info > 0`` / ``info < 0`` and applies its flags: ``info < 0`` becomes 0,
    the matrices of ``x`` (contiguous, ``info.size`` matrices) with
    ``info > 0`` are filled with NaN.
    """
    batch = info.size
    if batch == 0:
        return
    nn = x.size // batch if x is not None else 0
    fn = _status_function("info_scan", dtname(x.dtype) if x is not None else "float64",
                          device_id())
    launch(fn.kernel.ptr, _scan_grid(batch), SCAN_THREADS, 0,
           (info.data.ptr, batch, 0 if x is None or nn == 0 else x.data.ptr, nn,
            arg_value(report[0]), report[1]))


def scan_nonfinite(x, report, slot: int) -> None:
    """Mark ``slot`` of ``report``'s status word when ``x`` (float32/float64)
    holds an inf or NaN."""
    if x.size == 0:
        return
    cp = cupy()
    x = x if x.flags.c_contiguous else cp.ascontiguousarray(x)
    fn = _status_function("nonfinite_scan", dtname(x.dtype), device_id())
    launch(fn.kernel.ptr, _scan_grid(x.size), SCAN_THREADS, 0,
           (x.data.ptr, x.size, arg_value(report[0]), report[1], slot))


#: How a status read waits for the device: ``"sync"``, cudaStreamSynchronize
#: (the driver's wait); ``"poll"``, cudaStreamQuery in a loop (the thread
#: stays on its CPU while the kernels run).
STATUS_WAIT = "sync"

#: cudaErrorNotReady, what cudaStreamQuery answers while work is pending.
_NOT_READY = 600


class _Reader(threading.local):
    """This thread's means of waiting for its calls and reading small device
    arrays, made at its first use: the stream lookup, the wait, and for
    :func:`read_words` a pinned buffer (a direct DMA, no staging through
    pageable memory) and the copy call. Reused: a read completes before it
    returns."""

    def __init__(self):
        self.ready = False

    def bind(self) -> None:
        import cupyx
        cp = cupy()
        rt = cp.cuda.runtime
        self.empty_pinned = cupyx.empty_pinned
        self.words = cupyx.empty_pinned((STATUS_SLOTS,), dtype=np.uint64)   # grown on demand
        self.copy, self.sync, self.query = rt.memcpyAsync, rt.streamSynchronize, rt.streamQuery
        self.wait = self._wait
        self.kind = rt.memcpyDeviceToHost
        self.stream = cp.cuda.get_current_stream
        self.ready = True

    def _wait(self, stream) -> None:
        """Wait for the work queued on ``stream`` (:data:`STATUS_WAIT`)."""
        if STATUS_WAIT == "poll":
            query = self.query
            while True:
                code = query(stream)
                if code == 0:
                    return
                if code != _NOT_READY:
                    break                 # an error: the synchronization raises it
        self.sync(stream)


_READER = _Reader()


def read_status(status) -> list:
    """The slots of a :func:`new_status` word as 0/1 (1: marked by this
    call's kernels): a wait for the work queued on the current stream, then
    the word's host mirror, which the kernels mark themselves (no copy is
    queued behind them)."""
    r = _READER
    if not r.ready:
        r.bind()
    r.wait(r.stream().ptr)
    gen = status.gen
    return [1 if v == gen else 0 for v in status.host.tolist()]


def read_words(arr) -> np.ndarray:
    """A small contiguous uint64 device array on the host (a new NumPy array):
    one copy into this thread's pinned buffer on the current stream and a
    wait for the work queued before it (``ndarray.get`` stages through pageable memory and
    makes a new host array each call)."""
    r = _READER
    if not r.ready:
        r.bind()
    count = arr.size
    if r.words.size < count:
        r.words = r.empty_pinned((max(count, 2 * r.words.size),), dtype=np.uint64)
    stream = r.stream().ptr
    r.copy(int(r.words.ctypes.data), arr.data.ptr, 8 * count, r.kind, stream)
    r.wait(stream)
    return r.words[:count].copy()
