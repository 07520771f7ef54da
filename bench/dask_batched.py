#!/usr/bin/env python3
"""Batched LU over Dask GPU workers: throughput on 1, 2 and 4 GPUs against one.

    python3 bench/dask_batched.py [--count 16777216] [--n 32] [--chunk 1048576[,524288]]
                                  [--workers 1,2,4] [--threads 1[,2]] [--call default[,async,async_read]]
                                  [--saturation 1.1[,inf]] [--batches 1[,4]] [--ptds]
                                  [--dtype float64] [--reps 3] [--json out.json]
    python3 bench/dask_batched.py --cpu --model-gpu 8.9e-9 --count 16777216 --chunk 1048576 \
                                  --n 4 --workers 1,2 --batches 1,4   # GPUs modelled by a clock
    bash bench/dask_gpu_run.sh     # the run on a 2- or 4-GPU machine (what to carry: its header)
    python3 bench/dask_batched.py --quick --json out.json   # 2**22 on 1 and 2 GPU workers
    python3 bench/dask_batched.py --cpu [--count 65536 --n 8 --chunk 8192]   # smoke test
    python3 bench/dask_batched.py --cpu --pinned --workers 2   # the pinned cluster, no GPU

The work: ``count`` ``n x n`` matrices as a Dask array of CuPy chunks of
``chunk`` matrices, each chunk made on the GPU of the worker that factorizes
it (one write pass: entries uniform in [-1, 1) from a hash of their global
index, ``n`` added to the diagonal; a matrix is the same in any chunking;
2**24 float64 32 x 32 matrices are 128 GiB, more than one GPU holds: the
data never exists all at once), ``scipy_gpuqr.lu_factor_batched`` of the
Dask array, and per chunk a checksum of ``lu`` and ``piv`` (one kernel), all
chunks' checksums summed by one aggregate task (a Delayed: no finalize task
after it), which is what a timed run waits for. Each chunk is one task (made,
factorized, summed).
Three calls (``--call``):

* ``default``: ``lu_factor_batched(a)``, which waits once per chunk for its GPU
  (to warn about singular matrices, to raise for infs or NaNs); the checksum
  comes to the host per chunk;
* ``async``: ``lu_factor_batched(a, return_info=True, check_finite=False)``,
  which waits for nothing (``info`` is not used here); the checksums stay on
  the GPUs until the aggregate reads them. A worker's task returns once its
  kernels are queued, so its GPU does not wait for Dask between chunks;
* ``async_read``: the same call, its chunk's checksum read to the host inside
  the chunk's task. The wait for the worker's GPU is then on the task's
  thread, where the next task's kernels are queued meanwhile, instead of in
  a transfer of a CuPy sum between workers: a sender copies the sum to the
  host on its event loop, behind every kernel queued on its GPU, and starts
  no task meanwhile.

Workers: one per GPU, ``--threads`` threads each, no host-memory limit —
dask-cuda's ``LocalCUDACluster`` when ``dask_cuda`` is installed, else a
``SpecCluster`` of ``Nanny`` workers each started with
``CUDA_VISIBLE_DEVICES`` set to its GPU (what LocalCUDACluster does;
``--pinned`` forces it), each worker reporting the PCI bus id of the GPU it
sees. The scheduler's ``worker-saturation`` (``--saturation``) decides how
many chunk tasks a worker holds ahead (Dask's default 1.1: about one per
thread plus one). Per cluster: every worker compiles the kernels and fills its
memory pool, then per chunk size the same graph with tasks that do nothing
(what Dask alone costs) and per call one untimed run and ``--reps`` timed
runs of the whole count, ``--pause`` seconds apart; the median wall time of
``compute()`` gives the throughput. The task stream gives per worker the
tasks run, the time no task ran and the gaps between tasks.

The baseline, in the same run and first, without Dask, on the first GPU: the
same chunks made, factorized and summed one after another in this process
(``direct``), per call and chunk size; then, apart, the device time (CUDA
events) of making the chunks, of the LU calls and of the checksums. The
table gives each Dask run's efficiency against the direct run of the same
call and chunk size and against the fastest direct run (``direct wall /
(workers x Dask wall)``: 1 is linear), and every run's checksum is checked
equal (the matrices do not depend on the chunking).

Batches in flight (``--batches B``): a timed run submits B batches of the
whole count (the same matrices under other keys) in one ``client.compute``
and gathers the B sums; the time per batch is a throughput, what a user with
a stream of batches sees, each batch's fixed cost (the graph sent, ordered
and started, its results gathered) overlapping the others' work. B = 1 is a
single ``compute()``, a latency. Every run also gives a timeline (ms after
the compute call, medians): the graph at the scheduler and ready there, the
first chunk task starting, the last ending, the aggregates, the results in
the client.

``--cpu`` runs the same pipeline on NumPy chunks over CPU worker processes
(for checking the script where there is no GPU; its numbers mean nothing
for the GPU question). ``--cpu --model-gpu S`` models each worker's GPU by a
clock (:class:`ModelDevice`, S seconds of work per matrix): the chunk's task
queues its work and returns, the default call's checksum waits for it, the
async call's aggregate waits until every chunk's modelled work is done; the
Dask graph, tasks, messages and the library's calls (on one matrix per
chunk) are real. It reproduces Dask's costs against a GPU-like pipeline
where there is no GPU.

Where the tasks' functions come from. Run as a script, this file imports
itself as the module ``dask_batched`` (its directory is first on
``sys.path``, which Dask's worker processes inherit) and runs from there, so
that the tasks name its functions (the chunk maker, the checksums) by
reference, as a user's tasks do when their functions come from a module.
Dask pickles a task that names a function of ``__main__`` by value
(cloudpickle, with every function, class and string that function reaches),
once per task, when the scheduler sends it to a worker; and the worker
unpickles it, once per task. ``--tasks-in-main`` keeps the functions in
``__main__`` (what a script that defines its chunk maker itself pays:
bench/RESULTS.md, issue 21). The JSON's ``task_functions_from`` says which.

``--max-seconds T``: the client and every worker dump the stacks of all
their threads after ``T`` seconds (``faulthandler``); then the client kills
its worker processes (a killed client leaves them running: they held a GPU
and the disk while the next command ran) and exits. A hang shows where it
waits instead of ending without output. Each step prints the seconds since
the start.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

import numpy as np  # noqa: E402

#: the scheduler and workers listen here: one host, no network needed
HOST = "127.0.0.1"

#: what --quick runs (2**22 float64 32 x 32 matrices are 32 GiB: 8 chunks of 4 GiB)
QUICK = {"count": 1 << 22, "n": 32, "chunk": str(1 << 19), "workers": "1,2", "reps": 3}

#: the calls of lu_factor_batched timed (--call): see :func:`factor`
CALLS = ("default", "async", "async_read")

# ----------------------------------------------------------------------------
# run on the workers (and by the direct baseline)
# ----------------------------------------------------------------------------


#: The chunks' entries, made in one write pass on the GPU and bit for bit the
#: same by the NumPy copy below: a 32-bit hash (murmur3's finalizer) of the
#: matrix's global index, the entry and the seed, as uniform in [-1, 1), plus
#: ``n`` on the diagonal (every matrix strictly diagonally dominant: nonsingular,
#: well conditioned, whatever the seed). A block of 32 x 32 threads per matrix and
#: no division, so that the pass is bound by memory, not arithmetic (CuPy's
#: ``standard_normal`` and a hash with 64-bit divisions per entry were not: the
#: chunks' making, not the LU, was most of a run; bench/RESULTS.md, issue 21).
_MAKE_SRC = r"""
__device__ __forceinline__ unsigned int fmix32(unsigned int h) {
  h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
  return h;
}
template <typename T>
__device__ void make(T* a, unsigned long long first, unsigned int seed, int n) {
  unsigned long long m = first + blockIdx.x;
  unsigned int hm = fmix32((unsigned int)m ^ fmix32((unsigned int)(m >> 32) + seed));
  T* out = a + (unsigned long long)blockIdx.x * n * n;
  for (int r = threadIdx.y; r < n; r += 32)
    for (int c = threadIdx.x; c < n; c += 32) {
      unsigned int h = fmix32(hm + (unsigned int)(r * n + c) * 0x9e3779b9u);
      double v = 2.0 * ((double)h * 2.3283064365386963e-10) - 1.0;
      out[r * n + c] = (T)(v + (r == c ? (double)n : 0.0));
    }
}
extern "C" __global__ void make_f8(double* a, unsigned long long first, unsigned int seed, int n) { make(a, first, seed, n); }
extern "C" __global__ void make_f4(float* a, unsigned long long first, unsigned int seed, int n) { make(a, first, seed, n); }
"""


def _fmix32(h: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finalizer on a uint32 array (the kernel's ``fmix32``)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


#: Per matrix ``U[0, 0] + U[n-1, n-1]`` (the last depends on the whole
#: elimination) and the sum of ``piv``, a block's sum to ``part[block]``: one
#: launch reading two sectors of ``lu`` per matrix and ``piv`` (the whole
#: diagonal costs a memory sector per entry).
_CHECKSUM_SRC = r"""
template <typename T>
__device__ void checksum(const T* lu, const int* piv, long long count, int n, double* part) {
  __shared__ double s[256];
  long long m = (long long)blockIdx.x * 256 + threadIdx.x;
  double v = 0.0;
  if (m < count) {
    const T* a = lu + m * n * n;
    const int* p = piv + m * n;
    v = (double)a[0] + (double)a[n * n - 1];
    for (int k = 0; k < n; ++k) v += (double)p[k];
  }
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = s[0];
}
extern "C" __global__ void checksum_f8(const double* lu, const int* piv, long long count, int n, double* part) { checksum(lu, piv, count, n, part); }
extern "C" __global__ void checksum_f4(const float* lu, const int* piv, long long count, int n, double* part) { checksum(lu, piv, count, n, part); }
"""

@functools.lru_cache(maxsize=None)
def _gpu_kernels():
    """(the chunk maker, the checksum) modules, made once per process."""
    import cupy
    return (cupy.RawModule(code=_MAKE_SRC, options=("--std=c++17",)),
            cupy.RawModule(code=_CHECKSUM_SRC, options=("--std=c++17",)))


def _make_numpy(seed: int, start: int, size: int, n: int, dt) -> np.ndarray:
    """The NumPy copy of :data:`_MAKE_SRC` (equal bit for bit)."""
    m = np.arange(start, start + size, dtype=np.uint64)
    lo = (m & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (m >> np.uint64(32)).astype(np.uint32)
    hm = _fmix32(lo ^ _fmix32(hi + np.uint32(seed)))
    e = np.arange(n * n, dtype=np.uint32) * np.uint32(0x9E3779B9)
    h = _fmix32(hm[:, None] + e[None, :])
    v = 2.0 * (h.astype(np.float64) * 2.3283064365386963e-10) - 1.0
    v = v.reshape(size, n, n)
    v[:, np.arange(n), np.arange(n)] += float(n)
    return v.astype(dt)


class ModelDevice:
    """A GPU stand-in for ``--model-gpu`` (CPU runs): work is queued in order and
    done at a time on the host's monotonic clock, which every process of the host
    shares; nothing runs. ``queue`` returns at once (a kernel launch), ``wait``
    sleeps until the work queued so far on the caller's stream is done (a stream
    synchronization), releasing the GIL as a GPU wait does.

    One device, one stream per process; with ``per_thread`` (CuPy's per-thread
    default streams, ``--ptds``) a stream per thread: the device still does one
    piece of work at a time in the order queued, but a wait is for the calling
    thread's work only."""

    def __init__(self, per_thread: bool = False):
        self._lock = threading.Lock()
        self._per_thread = per_thread
        self.free_at = 0.0
        self._done: dict = {}           # stream -> when its last queued work is done
        self._checksum: dict = {}       # thread -> seconds of its chunk's checksum, to queue

    def _stream(self) -> int:
        return threading.get_ident() if self._per_thread else 0

    def queue(self, seconds: float) -> float:
        """Queue ``seconds`` of work on the caller's stream; when it will be done."""
        with self._lock:
            self.free_at = max(time.monotonic(), self.free_at) + seconds
            self._done[self._stream()] = self.free_at
            return self.free_at

    def done_at(self) -> float:
        """When the work queued so far on the caller's stream will be done."""
        return self._done.get(self._stream(), 0.0)

    def wait(self) -> None:
        """Return once the work queued so far on the caller's stream is done."""
        time.sleep(max(self.done_at() - time.monotonic(), 0.0))

    def chunk(self, seconds: float) -> None:
        """Queue a chunk's making and factorization, all but :data:`CHECKSUM_SHARE` of
        its ``seconds``; the rest is queued by its checksum (:meth:`checksum`)."""
        self.queue(seconds * (1 - CHECKSUM_SHARE))
        self._checksum[threading.get_ident()] = seconds * CHECKSUM_SHARE

    def checksum(self, wait: bool) -> float:
        """The checksum of this thread's last chunk: ``wait`` (the default call) waits
        for the factorization first (the call's status read), queues the checksum
        and waits again (its read), as the GPU pipeline does; else it only queues.
        When the checksum will be done."""
        if wait:
            self.wait()
        done = self.queue(self._checksum.pop(threading.get_ident(), 0.0))
        if wait:
            self.wait()
        return done


#: The share of a modelled chunk's GPU time that is its checksum (queued after the
#: factorization's wait in the default call)
CHECKSUM_SHARE = 0.02


@functools.lru_cache(maxsize=None)
def model_device() -> ModelDevice:
    """This process's :class:`ModelDevice` (a worker's GPU), with a stream per
    thread where CuPy would give each thread its own default stream
    (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``, ``--ptds``)."""
    return ModelDevice(os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM") == "1")


def make_chunk(start: int = 0, *, size: int, n: int, dt: str, gpu: bool, seed: int = 1,
               model: float = 0.0, batch: int = 0, block_info=None):
    """Matrices ``start, ..., start + size - 1`` of the benchmark's stack, made where
    this runs (one write pass on the GPU): entries uniform in [-1, 1) from a hash
    of their global index and ``seed``, plus ``n`` on the diagonal.

    With ``block_info`` (a Dask ``map_blocks`` call without input arrays) the
    start and the size are the chunk's: a matrix is the same whatever the
    chunking, so every run's checksum is the same. ``batch`` changes nothing in
    the matrices, only the Dask name (batches in flight at once are distinct
    keys, each the same work).

    ``model`` (CPU runs, ``--model-gpu``): seconds of GPU work per matrix
    (making, factorizing and summing it), queued on this process's
    :class:`ModelDevice`; only the chunk's first matrix is made (the library's
    Dask path runs on it: the tasks, their calls and their waits are real, the
    GPU's work is modelled).
    """
    if block_info is not None:
        size = block_info[None]["chunk-shape"][0]
        start = block_info[None]["array-location"][0][0]
    if model:
        model_device().chunk(size * model)
        return _make_numpy(seed, int(start), min(size, 1), n, np.dtype(dt))
    if not gpu:
        return _make_numpy(seed, int(start), size, n, np.dtype(dt))
    import cupy
    a = cupy.empty((size, n, n), dtype=dt)
    if size:
        kind = {np.dtype(np.float64): "make_f8", np.dtype(np.float32): "make_f4"}[a.dtype]
        _gpu_kernels()[0].get_function(kind)(
            (size,), (32, 32), (a, np.uint64(start), np.uint32(seed), np.int32(n)))
    return a


def _host_sum(lu, piv) -> float:
    """The checksum of NumPy ``lu, piv`` (what :data:`_CHECKSUM_SRC` sums)."""
    return float((lu[:, 0, 0].real + lu[:, -1, -1].real).sum() + piv.sum(dtype=np.float64))


def _device_sum(lu, piv):
    """The chunk's checksum as a CuPy scalar (nothing waited for)."""
    import cupy
    count, n = lu.shape[0], lu.shape[-1]
    kind = {np.dtype(np.float64): "checksum_f8", np.dtype(np.float32): "checksum_f4"}.get(lu.dtype)
    if (kind is None or piv.dtype != np.int32 or not count
            or not (lu.flags.c_contiguous and piv.flags.c_contiguous)):
        return (lu[:, 0, 0].real + lu[:, -1, -1].real).sum() + piv.sum(dtype=np.float64)
    blocks = -(-count // 256)
    part = cupy.empty(blocks, dtype=np.float64)
    _gpu_kernels()[1].get_function(kind)(
        (blocks,), (256,), (lu, piv, np.int64(count), np.int32(n), part))
    return part.sum()


def checksum(lu, piv, *, model: bool = False):
    """One host float per chunk (``U[0, 0] + U[n-1, n-1]`` and the pivots of every
    matrix, summed), shaped ``(1, 1, 1)``: one kernel over the chunk, a sum of its
    blocks' sums, one wait. ``model``: the :class:`ModelDevice`'s two waits
    (the factorization's, the checksum's), and the result is ``(1, 1, 2)``: the
    sum and 0 (done)."""
    if model:
        model_device().checksum(wait=True)
        return np.array([[[_host_sum(lu, piv), 0.0]]])
    if isinstance(lu, np.ndarray):
        return np.full((1, 1, 1), _host_sum(lu, piv))
    return np.full((1, 1, 1), float(_device_sum(lu, piv)))


def checksum_async(lu, piv, *, model: bool = False):
    """The chunk's checksum left on the device, shaped ``(1, 1, 1)`` (no wait:
    Dask moves it, or the final sum reads it, when it is needed). ``model``:
    ``(1, 1, 2)``, the sum and when the :class:`ModelDevice` will have done the
    chunk (:func:`total` waits until then)."""
    if model:
        return np.array([[[_host_sum(lu, piv), model_device().checksum(wait=False)]]])
    if isinstance(lu, np.ndarray):
        return checksum(lu, piv)
    return _device_sum(lu, piv).reshape(1, 1, 1)


def total(*parts) -> float:
    """The sum of the chunks' checksums (one aggregate task): CuPy parts are summed
    on their device and read once (a wait for everything queued on this
    worker's stream, later batches' chunks too); a model run's parts
    ``(1, 1, 2)`` likewise, once this worker's modelled queue is empty and every
    chunk's modelled work is done."""
    if not parts:
        return 0.0
    if parts[0].shape[-1] == 2:
        # as a read of CuPy sums: this worker's queue drained (one stream), the
        # other workers' chunks done (their sums sent once done)
        model_device().wait()
        time.sleep(max(max(float(p[0, 0, 1]) for p in parts) - time.monotonic(), 0.0))
        return float(sum(float(p[0, 0, 0]) for p in parts))
    acc = parts[0].sum()
    for p in parts[1:]:
        acc = acc + p.sum()
    return float(acc)


def factor(a, call: str):
    """``lu, piv`` of ``scipy_gpuqr.lu_factor_batched`` of ``a``: its default call
    (``call='default'``: waits once for the GPU, to warn about singular matrices
    or raise for infs) or the fully asynchronous one (``'async'`` and
    ``'async_read'``: ``return_info=True, check_finite=False``; ``info`` is not
    used here)."""
    import scipy_gpuqr as gq
    if call != "default":
        lu, piv, _ = gq.lu_factor_batched(a, return_info=True, check_finite=False)
        return lu, piv
    return gq.lu_factor_batched(a)


def warm(n: int, dtype: str, size: int, gpu: bool, model: float = 0.0) -> str:
    """Compile the kernels (the maker, both calls, the checksums) and fill this
    worker's memory pool with one chunk's needs; returns what this worker sees (its
    ``CUDA_VISIBLE_DEVICES`` and its GPU's PCI bus id, which tells physical GPUs
    apart; whether CuPy uses per-thread default streams)."""
    a = make_chunk(0, size=size, n=n, dt=dtype, gpu=gpu, model=model)
    for call in CALLS:
        lu, piv = factor(a, call)
        checksum(lu, piv, model=bool(model))
        del lu, piv
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
    if gpu:
        import cupy
        seen += f" bus {cupy.cuda.Device().pci_bus_id} of {cupy.cuda.runtime.getDeviceCount()}"
        if cupy.cuda.get_current_stream() == getattr(cupy.cuda.Stream, "ptds", None):
            seen += " ptds"
    return seen


def arm_stack_dump(seconds: float) -> str:
    """Dump every thread's stack to stderr after ``seconds`` (this process; the
    process goes on). Run on the workers through ``Client.run``."""
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=False, file=sys.stderr)
    return f"pid {os.getpid()}"


_T0 = time.perf_counter()


def _bail(seconds: float) -> None:
    """After ``seconds``: every thread's stack, the child processes killed, exit 3."""
    def go():
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            import psutil
            for c in psutil.Process().children(recursive=True):
                c.kill()
        except Exception as exc:           # noqa: BLE001 - exiting anyway
            print(f"could not kill the workers: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    t = threading.Timer(seconds, go)
    t.daemon = True
    t.start()
    # should the GIL never come back to that timer, dump and exit from C
    faulthandler.dump_traceback_later(seconds + 15, exit=True, file=sys.stderr)


def _say(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f} s] {msg}", flush=True)


# ----------------------------------------------------------------------------
# the Dask pipeline
# ----------------------------------------------------------------------------

def _sizes(count: int, chunk: int) -> list[int]:
    return [chunk] * (count // chunk) + ([count % chunk] if count % chunk else [])


def _no_work(*_, block_info=None, batch: int = 0):
    """A chunk's task of the Dask-only graph: nothing made, nothing computed."""
    return np.zeros((1, 1, 1))


def pipeline(count: int, n: int, chunk: int, dtype: str, gpu: bool, call: str = "default",
             seed: int = 1, empty: bool = False, model: float = 0.0, batch: int = 0):
    """The Dask graph: generated chunks -> lu_factor_batched -> per-chunk checksums
    -> their sum; ``(a Delayed of the sum, chunks)``. Every chunk is one task
    (generation, the factorization and the checksum fused), plus one aggregate
    (:func:`total`, a Delayed: no finalize task after it).

    ``call``: ``'default'`` (the library's default call; the checksum brought to
    the host per chunk), ``'async'`` (``return_info=True, check_finite=False``;
    the checksums stay on the GPUs until the aggregate) or ``'async_read'`` (the
    same call, the checksum brought to the host per chunk). ``empty``: the same graph
    with tasks that do nothing (what Dask alone costs). ``model``: seconds of
    modelled GPU work per matrix (:class:`ModelDevice`, CPU runs). ``batch``: a
    different ``batch`` gives the same work under other keys (batches in flight).
    """
    import dask
    import dask.array as da

    import scipy_gpuqr as gq
    sizes = _sizes(count, chunk)
    host = np.empty((0, 0, 0), dtype=np.float64)
    if empty:
        a = da.map_blocks(_no_work, chunks=(tuple(sizes), (1,), (1,)), dtype=np.float64,
                          meta=host, batch=batch)
        sums = da.blockwise(_no_work, "zij", a, "zij", dtype=np.float64,
                            adjust_chunks={"z": 1}, meta=host)
    else:
        meta = host
        if gpu:
            import cupy
            meta = cupy.empty((0, 0, 0), dtype=dtype)
        # no input array: the chunk's place and size come from block_info, so the
        # generation is a blockwise layer with no data or task of its own
        a = da.map_blocks(make_chunk, seed=seed, size=chunk, n=n, dt=dtype, gpu=gpu,
                          model=model, batch=batch, chunks=(tuple(sizes), (n,), (n,)),
                          dtype=dtype, meta=meta)
        if call == "async":
            lu, piv, _ = gq.lu_factor_batched(a, return_info=True, check_finite=False)
            fn = checksum_async
            out_meta = np.empty_like(meta, dtype=np.float64) if gpu and not model else host
        elif call == "async_read":
            lu, piv, _ = gq.lu_factor_batched(a, return_info=True, check_finite=False)
            fn, out_meta = checksum, host
        else:
            lu, piv = gq.lu_factor_batched(a)
            fn, out_meta = checksum, host
        # indexed like lu (one element per chunk, no axis contracted): Dask fuses the
        # pick of lu and piv from the factorization's task into this task
        sums = da.blockwise(fn, "zij", lu, "zij", piv, "zi", dtype=np.float64,
                            adjust_chunks={"z": 1, "i": 1, "j": 2 if model else 1},
                            concatenate=True, meta=out_meta, model=bool(model))
    # one aggregate of every chunk's sum, as a Delayed (an array's compute() adds
    # a finalize task after it)
    parts = sums.to_delayed(optimize_graph=True).ravel().tolist()
    return dask.delayed(total, pure=True)(*parts, dask_key_name=f"total-{sums.name}"), len(sizes)


def gpu_ids(gpu: bool, limit: int) -> list[str]:
    if not gpu:
        return [str(i) for i in range(limit)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v.strip() for v in visible.split(",") if v.strip()]
    import cupy
    return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def pinned_cluster(ids: list[str], threads: int = 1):
    """A ``SpecCluster`` of one single-threaded ``Nanny`` worker process per id, each
    started with ``CUDA_VISIBLE_DEVICES`` set to its id (what dask-cuda's
    ``LocalCUDACluster`` does): the worker's CUDA context (made when its first task
    imports CuPy) sees that one GPU as device 0."""
    from dask.distributed import Nanny, Scheduler, SpecCluster
    # memory_limit 0: no host-memory management. Its default ("auto": the host's
    # memory times nthreads / cores, 8 GiB of 512 on a 64-core host) counts the CuPy
    # chunks too and spilled them, pickled, to disk: minutes per run
    workers = {f"gpu{d}": {"cls": Nanny,
                           "options": {"nthreads": threads, "host": HOST, "memory_limit": 0,
                                       "env": {"CUDA_VISIBLE_DEVICES": str(d)}}}
               for d in ids}
    return SpecCluster(workers=workers,
                       scheduler={"cls": Scheduler,
                                  "options": {"dashboard_address": ":0", "host": HOST}})


def start_cluster(ids: list[str], gpu: bool, pinned: bool = False, threads: int = 1):
    """(cluster, kind): one single-threaded worker per id (GPU or CPU process).

    ``pinned``: the :func:`pinned_cluster` even where dask_cuda is installed (or,
    with CPU chunks, to check it without a GPU)."""
    if pinned:
        return pinned_cluster(ids, threads), "SpecCluster of Nanny workers, CUDA_VISIBLE_DEVICES per worker"
    if not gpu:
        from dask.distributed import LocalCluster
        return LocalCluster(n_workers=len(ids), threads_per_worker=threads, processes=True,
                            host=HOST, dashboard_address=":0"), "LocalCluster (CPU processes)"
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return pinned_cluster(ids, threads), "SpecCluster of Nanny workers, CUDA_VISIBLE_DEVICES per worker"
    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(ids), threads_per_worker=threads,
                            host=HOST, dashboard_address=":0",
                            memory_limit=0), "dask_cuda.LocalCUDACluster"


def _timed(client, graphs, reps: int, k: int, nchunks: int, pause: float = 0.0):
    """(walls, values, task phases and idle per worker of the last run) of ``reps``
    runs, after one untimed run; each run ``pause`` seconds after the previous one.
    A run computes every Delayed of ``graphs`` (the batches) in one
    ``client.compute`` and gathers the results: its wall time is until the last
    batch's sum is in this process; a value is the mean of the batches' sums."""
    from dask.distributed import get_task_stream

    def run():
        return [float(v) for v in client.gather(client.compute(graphs))]
    run()
    times, values, lines = [], [], []
    for rep in range(reps):
        time.sleep(pause)
        with get_task_stream(client) as stream:
            w0 = time.time()
            t0 = time.perf_counter()
            got = run()
            times.append(time.perf_counter() - t0)
            w1 = time.time()
        values.append(statistics.fmean(got))
        if max(got) - min(got) > 1e-12 * abs(got[0]):
            _say(f"  the batches' sums differ: {got}")
            values[-1] = float("nan")
        lines.append(timeline(client, stream.data, w0, w1))
        if rep == reps - 1:
            phases = task_phases(stream.data, k)
            idle = worker_idle(stream.data, w0, w1, nchunks * len(graphs))
    line = {key: statistics.median(t[key] for t in lines) for key in lines[0]}
    return times, values, phases, idle, line


#: the steps of one timed run (seconds after the client's compute call): see timeline
STEPS = ("graph_at_scheduler", "graph_ready", "first_task", "last_chunk_task_end",
         "first_aggregate_start", "last_aggregate_end", "result_in_client")


def timeline(client, records, w0: float, w1: float) -> dict:
    """When each step of a run happened, in seconds after the client's
    ``client.compute`` call at ``w0`` (``time.time()``, the clock of every
    process of this host): the graph reaching the scheduler and its tasks made
    there (the scheduler's update-graph events), the first chunk task starting
    on a worker, the last one ending, the first aggregate starting and the last
    ending (the task stream), and the results in this process (``w1``).

    An aggregate's start waits for the chunk sums that other workers hold; its
    end, for its GPU (it reads the sums)."""
    graphs = [m for t, m in client.get_events("scheduler")
              if t >= w0 and m.get("action") == "update-graph" and "metrics" in m]
    spans: dict = {"chunk": [], "aggregate": []}
    for rec in records:
        kind = "aggregate" if str(rec.get("key", "")).startswith("('total") or \
            str(rec.get("key", "")).startswith("total") else "chunk"
        for ss in rec.get("startstops", ()):
            if ss["action"] == "compute" and ss["start"] >= w0:
                spans[kind].append((ss["start"], ss["stop"]))
    nan = float("nan")
    starts = [m["metrics"]["start_timestamp_seconds"] for m in graphs]
    ready = [m["metrics"]["start_timestamp_seconds"] + m["metrics"]["duration_seconds"]
             for m in graphs]
    return {"graph_at_scheduler": min(starts, default=nan + w0) - w0,
            "graph_ready": max(ready, default=nan + w0) - w0,
            "first_task": min((a for a, _ in spans["chunk"]), default=nan + w0) - w0,
            "last_chunk_task_end": max((b for _, b in spans["chunk"]), default=nan + w0) - w0,
            "first_aggregate_start": min((a for a, _ in spans["aggregate"]),
                                         default=nan + w0) - w0,
            "last_aggregate_end": max((b for _, b in spans["aggregate"]), default=nan + w0) - w0,
            "result_in_client": w1 - w0}


def _steps(line: dict) -> str:
    """A run's :func:`timeline` as text (ms)."""
    return ", ".join(f"{key.replace('_', ' ')} {1e3 * line[key]:.1f}" for key in STEPS)


def _env(name: str, value):
    """A context in which ``os.environ[name]`` is ``value`` (unset: None)."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        old = os.environ.get(name)
        if value is not None:
            os.environ[name] = value
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return ctx()


def run_workers(k: int, threads: int, saturation: float, ids: list[str], args,
                gpu: bool) -> list[dict]:
    """One cluster of ``k`` workers with ``threads`` threads each and the scheduler's
    ``worker-saturation``; a row per call, chunk size and batches in flight (and
    the Dask-only graph's time per chunk size and batches)."""
    from dask.distributed import Client
    t0 = time.perf_counter()
    tag = f"{k} worker(s) x {threads} thread(s), saturation {saturation}"
    _say(f"{tag}: starting the cluster")
    import dask
    # the scheduler runs in this process: its root-task queuing follows this
    # setting; the workers inherit the environment (--ptds: CuPy's per-thread
    # default stream, read when a worker first imports CuPy)
    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}), \
            _env("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1" if args.ptds else None):
        cluster, kind = start_cluster(ids[:k], gpu, args.pinned, threads)
    rows = []
    with cluster, Client(cluster) as client:
        client.wait_for_workers(k, timeout=120)
        t_start = time.perf_counter() - t0
        _say(f"{tag}: {kind} up in {t_start:.1f} s")
        if args.max_seconds:
            left = args.max_seconds - (time.perf_counter() - _T0)
            client.run(arm_stack_dump, max(left - 2, 1))
        seen = client.gather([client.submit(warm, args.n, args.dtype, max(args.chunks), gpu,
                                            args.model_gpu, workers=[w], pure=False)
                              for w in client.scheduler_info()["workers"]])
        _say(f"{tag}: warm ({seen})")
        if gpu and len(set(s.split(" bus ")[-1] for s in seen)) != len(seen):
            print(f"  WARNING: workers share a GPU: {seen}", flush=True)
        for chunk in args.chunks:
            for batches in args.batches:
                floor = [pipeline(args.count, args.n, chunk, args.dtype, gpu, empty=True,
                                  batch=b)[0] for b in range(batches)]
                floor_times, *_, floor_line = _timed(client, floor, args.reps, k, 1,
                                                     args.pause)
                floor_s = statistics.median(floor_times) / batches
                _say(f"{tag}: the graph doing nothing, chunks of {chunk}, {batches} "
                     f"batch(es): {1e3 * floor_s:.1f} ms per batch; "
                     + _steps(floor_line))
                for call in args.calls:
                    try:
                        rows.append(_one(client, k, threads, saturation, call, chunk, batches,
                                         floor_s, args, gpu))
                    except Exception as exc:   # noqa: BLE001 - a one-shot run keeps the rest
                        _say(f"{tag}, {call} call, chunks of {chunk}, {batches} batch(es): "
                             f"FAILED: {''.join(traceback.format_exception(exc))[-3000:]}")
                        continue
                    rows[-1].update({"cluster": kind, "devices": sorted(seen),
                                     "start_seconds": t_start, "ptds": bool(args.ptds)})
    return rows


def _one(client, k: int, threads: int, saturation: float, call: str, chunk: int,
         batches: int, floor_s: float, args, gpu: bool) -> dict:
    """The row of one call, chunk size and number of batches in flight on a started
    cluster (times per batch)."""
    tag = (f"{k} worker(s) x {threads} thread(s), saturation {saturation}, {call} call, "
           f"chunks of {chunk}, {batches} batch(es) in flight")
    # every worker thread's memory pool holds its chunks before timing
    warmup, _ = pipeline(2 * k * threads * chunk, args.n, chunk, args.dtype, gpu, call,
                         seed=10**6, model=args.model_gpu)
    client.compute(warmup, sync=True)
    graphs, nchunks = [], 0
    for b in range(batches):
        g, nchunks = pipeline(args.count, args.n, chunk, args.dtype, gpu, call,
                              model=args.model_gpu, batch=b)
        graphs.append(g)
    times, values, phases, idle, line = _timed(client, graphs, args.reps, k, nchunks,
                                               args.pause)
    per = [t / batches for t in times]
    _say(f"{tag}: timed runs, per batch {['%.3f' % x for x in per]} s (the same graph "
         f"doing nothing: {floor_s:.3f} s per batch)")
    _say("  median run, ms after compute(): " + _steps(line))
    _say("  seconds per worker in the last run, by task and action: "
         + ", ".join(f"{name} {sec:.3f}" for name, sec in phases.items()))
    _say("  last run per worker: " + "; ".join(
        f"{w}: {d['tasks']} tasks ({d['tasks_per_chunk']:.2f} per chunk), busy "
        f"{d['busy_s']:.3f} s, no task running {d['idle_s']:.3f} s of "
        f"{d['wall_s']:.3f} ({1e3 * d['idle_per_chunk_s']:.2f} ms per chunk; "
        f"between tasks median {1e3 * d['gap_median_s']:.2f} ms, max "
        f"{1e3 * d['gap_max_s']:.2f} ms; before the first "
        f"{1e3 * d['lead_s']:.1f} ms, after the last {1e3 * d['tail_s']:.1f} ms)"
        for w, d in idle.items()))
    ok = [v for v in values if v == v]
    return {"workers": k, "threads": threads, "call": call, "chunk": chunk,
            "chunks": nchunks, "batches": batches, "times_s": per,
            "median_s": statistics.median(per), "dask_only_s": floor_s,
            "checksum": values[0], "task_phases_s": phases,
            "worker_idle": idle, "saturation": saturation, "timeline_s": line,
            "checksums_equal": len(ok) == len(values)
            and max(ok) - min(ok) <= 1e-12 * abs(ok[0])}


def worker_idle(records, t0: float, t1: float, nchunks: int) -> dict:
    """Per worker, of one ``compute()`` from ``t0`` to ``t1`` (``time.time()``,
    the workers' clock on this host): its tasks, the seconds in which it ran
    one (the union of their compute intervals) and in which it ran none, per
    chunk, and the gaps between one task's end and the next one's start. A GPU
    worker's idle time is time its GPU waits, unless the last task left work
    queued on the device."""
    by: dict = {}
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss["action"] == "compute":
                by.setdefault(rec.get("worker", "?"), []).append((ss["start"], ss["stop"]))
    out = {}
    workers = max(len(by), 1)
    for w, spans in sorted(by.items()):
        spans.sort()
        busy, end, gaps = 0.0, None, []
        for a, b in spans:
            if end is not None:
                gaps.append(max(a - end, 0.0))
            lo = a if end is None else max(a, end)
            busy += max(b - lo, 0.0)
            end = b if end is None else max(end, b)
        wall = t1 - t0
        out[w] = {"tasks": len(spans), "tasks_per_chunk": len(spans) * workers / max(nchunks, 1),
                  "busy_s": busy, "wall_s": wall, "idle_s": wall - busy,
                  "idle_per_chunk_s": (wall - busy) * workers / max(nchunks, 1),
                  "gap_median_s": statistics.median(gaps) if gaps else 0.0,
                  "gap_max_s": max(gaps, default=0.0),
                  "lead_s": spans[0][0] - t0, "tail_s": t1 - end}
    return out


def task_phases(records, workers: int) -> dict:
    """Seconds per worker of one ``compute()`` by task name and action (``compute``,
    ``transfer``, ``disk-read``...), from Dask's task stream: where a worker's wall
    time goes, against the direct run's per-chunk costs."""
    from dask.utils import key_split
    sums: dict = {}
    for rec in records:
        for ss in rec.get("startstops", ()):
            name = f"{key_split(rec['key'])}:{ss['action']}"
            sums[name] = sums.get(name, 0.0) + (ss["stop"] - ss["start"]) / workers
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def run_direct(args, gpu: bool) -> list[dict]:
    """The same chunks one after another in this process, no Dask (first GPU): per
    chunk size and call, the median wall of the whole count; then, apart, the GPU
    time (CUDA events) of making the chunks, of the LU calls and of the checksums."""
    model = args.model_gpu
    warm(args.n, args.dtype, max(args.chunks), gpu, model)
    rows = []
    for chunk in args.chunks:
        starts = np.cumsum([0] + _sizes(args.count, chunk))
        for call in args.calls:
            walls, value = [], 0.0
            for _ in range(args.reps + 1):
                t0 = time.perf_counter()
                parts = []
                for start, stop in zip(starts[:-1], starts[1:]):
                    a = make_chunk(int(start), size=int(stop - start), n=args.n,
                                   dt=args.dtype, gpu=gpu, model=model)
                    lu, piv = factor(a, call)
                    sums = checksum_async if call == "async" else checksum
                    parts.append(sums(lu, piv, model=bool(model)))
                    del a, lu, piv
                value = total(*parts)
                walls.append(time.perf_counter() - t0)
            rows.append({"chunk": chunk, "call": call, "times_s": walls[1:],
                         "median_s": statistics.median(walls[1:]), "checksum": value})
            _say(f"direct, {call} call, chunks of {chunk}: {['%.3f' % x for x in walls[1:]]} s")
        if not model:
            rows.append({"chunk": chunk, "call": "parts",
                         **_direct_parts(args, gpu, chunk, starts)})
    if gpu:
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _direct_parts(args, gpu: bool, chunk: int, starts) -> dict:
    """Median over ``reps`` of the whole count's device seconds (CUDA events; host
    wall on the CPU) making the chunks, in the LU calls and in the checksums."""
    def clock():
        if not gpu:
            return time.perf_counter
        import cupy

        def mark():
            e = cupy.cuda.Event()
            e.record()
            return e
        return mark

    def seconds(t0, t1):
        if not gpu:
            return t1 - t0
        import cupy
        t1.synchronize()
        return cupy.cuda.get_elapsed_time(t0, t1) / 1e3

    now = clock()
    parts = {"make_chunks_s": [], "lu_only_s": [], "checksums_s": []}
    for _ in range(args.reps):
        got = dict.fromkeys(parts, 0.0)
        for start, stop in zip(starts[:-1], starts[1:]):
            t0 = now()
            a = make_chunk(int(start), size=int(stop - start), n=args.n, dt=args.dtype, gpu=gpu)
            t1 = now()
            lu, piv = factor(a, "async")
            t2 = now()
            s = checksum_async(lu, piv)
            t3 = now()
            float(s.sum())
            got["make_chunks_s"] += seconds(t0, t1)
            got["lu_only_s"] += seconds(t1, t2)
            got["checksums_s"] += seconds(t2, t3)
            del a, lu, piv
        for key, v in got.items():
            parts[key].append(v)
    return {key: statistics.median(v) for key, v in parts.items()}


def _ints(text: str) -> list[int]:
    return [int(v) for v in str(text).split(",") if v.strip()]


def report(rows: list[dict], direct: list[dict], count: int, gpu: bool,
           model: float = 0.0) -> None:
    """The table: each Dask row (times per batch) against the direct run of the
    same call and chunk size, against the fastest direct run, and against one
    worker with as many batches in flight."""
    walls = {(d["chunk"], d["call"]): d["median_s"] for d in direct if d["call"] != "parts"}
    best = min(walls.values(), default=float("nan"))
    one = {(r["threads"], r["saturation"], r["call"], r["chunk"], r["batches"]): r["median_s"]
           for r in rows if r["workers"] == 1}
    print("\n| workers x threads | saturation | call | chunk | batches in flight | "
          "wall ms per batch | M matrices/s | speedup vs 1 worker | "
          "efficiency vs direct (same call, chunk) | vs fastest direct | Dask alone ms per batch | "
          "no task running, ms per chunk | first task after compute(), ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        key = (r["threads"], r["saturation"], r["call"], r["chunk"], r["batches"])
        r["matrices_per_s"] = count / r["median_s"]
        r["speedup"] = one[key] / r["median_s"] if key in one else float("nan")
        same = walls.get((r["chunk"], r["call"]), float("nan"))
        r["efficiency_vs_direct"] = same / r["median_s"] / r["workers"]
        r["efficiency_vs_fastest_direct"] = best / r["median_s"] / r["workers"]
        idle = statistics.median([d["idle_per_chunk_s"] for d in r["worker_idle"].values()] or [0])
        lead = min([d["lead_s"] for d in r["worker_idle"].values()] or [float("nan")])
        print(f"| {r['workers']} x {r['threads']}{' ptds' if r.get('ptds') else ''} | "
              f"{r['saturation']:g} | {r['call']} | {r['chunk']} | {r['batches']} | "
              f"{r['median_s'] * 1e3:.1f} | {r['matrices_per_s'] / 1e6:.1f} | {r['speedup']:.2f} | "
              f"{r['efficiency_vs_direct']:.2f} | {r['efficiency_vs_fastest_direct']:.2f} | "
              f"{r['dask_only_s'] * 1e3:.1f} | {idle * 1e3:.2f} | {lead * 1e3:.1f} |")
    where = "GPU" if gpu else ("modelled GPU" if model else "process")
    for d in direct:
        if d["call"] == "parts":
            print(f"| direct, chunks of {d['chunk']}: of the whole count, "
                  f"{'device' if gpu else 'host'} seconds | making the chunks "
                  f"{d['make_chunks_s'] * 1e3:.1f} ms | LU calls {d['lu_only_s'] * 1e3:.1f} ms "
                  f"({count / d['lu_only_s'] / 1e6:.1f} M/s) | checksums "
                  f"{d['checksums_s'] * 1e3:.1f} ms | | | | | | | | | |")
        else:
            print(f"| direct (no Dask, one {where}) | | {d['call']} | {d['chunk']} | 1 | "
                  f"{d['median_s'] * 1e3:.1f} | {count / d['median_s'] / 1e6:.1f} | | 1.00 | "
                  f"{best / d['median_s']:.2f} | | | |")
    # a model run makes one matrix per chunk: its sums depend on the chunking
    groups: dict = {}
    for r in rows + [d for d in direct if "checksum" in d]:
        groups.setdefault(r["chunk"] if model else 0, []).append(r["checksum"])
    if groups:
        same = all(max(v) - min(v) <= 1e-9 * abs(v[0]) for v in groups.values())
        print(f"checksums of every run (Dask and direct, "
              f"{'per chunk size' if model else 'every chunk size'}) equal: {same}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=None, help="matrices (default 2**24; --cpu 2**16)")
    p.add_argument("--n", type=int, default=None, help="order (default 32; --cpu 8)")
    p.add_argument("--chunk", default=None,
                   help="matrices per chunk, a comma list (default 2**20; --cpu 2**13)")
    p.add_argument("--workers", default="1,2,4", help="worker counts (capped at the GPUs)")
    p.add_argument("--threads", default="1", help="threads per worker, a comma list")
    p.add_argument("--call", default="default",
                   help="comma list of 'default' (lu_factor_batched(a): one wait per chunk) "
                        "'async' (return_info=True, check_finite=False: none) and "
                        "'async_read' (the same call, its checksum read in the chunk's task)")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="NumPy chunks on CPU worker processes")
    p.add_argument("--no-direct", action="store_true", help="skip the no-Dask baseline")
    p.add_argument("--direct-from", metavar="JSON",
                   help="with --no-direct: the baseline rows of an earlier run's --json "
                        "(same machine, count and chunks) for the efficiencies")
    p.add_argument("--pinned", action="store_true",
                   help="Nanny workers with CUDA_VISIBLE_DEVICES each even if dask_cuda exists")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['count']} matrices in chunks of {QUICK['chunk']} over "
                        f"{QUICK['workers']} worker(s), {QUICK['reps']} repetitions")
    p.add_argument("--saturation", default="1.1",
                   help="distributed.scheduler.worker-saturation, a comma list (Dask's "
                        "default 1.1: a worker holds at most ceil(1.1 x threads) root "
                        "tasks, each further one sent after one finished; inf: all at once)")
    p.add_argument("--pause", type=float, default=0.02,
                   help="seconds between timed Dask runs (default 0.02: each compute() is "
                        "timed as a single call; back to back, the client's batched stream "
                        "to the scheduler, a 10 ms interval, holds the next graph behind "
                        "the previous run's key releases)")
    p.add_argument("--batches", default="1",
                   help="batches in flight, a comma list (default 1: one compute() of the "
                        "count, a latency; B: B batches of the count submitted in one "
                        "client.compute and gathered, the time per batch a throughput)")
    p.add_argument("--model-gpu", type=float, default=0.0, metavar="SECONDS",
                   help="with --cpu: model each worker's GPU (seconds of work per matrix, "
                        "e.g. 8.9e-9, the direct H200 run's 149 ms per 2**24): the Dask "
                        "graph, tasks and waits are real, the GPU work a clock")
    p.add_argument("--ptds", action="store_true",
                   help="workers with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 (each worker "
                        "thread on its own stream: with --threads 2 a task's wait is for "
                        "its own chunk only). Default call only: the async call's sums, "
                        "unfinished when its task returns, are read by other threads "
                        "(the worker's event loop sends them) on other streams")
    p.add_argument("--tasks-in-main", action="store_true",
                   help="run from __main__: the tasks name this script's functions as "
                        "__main__'s, which Dask pickles by value for every task (see the "
                        "module's docstring); without it they come from the module "
                        "dask_batched")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="dump every thread's stack (client and workers) and exit after this")
    args = p.parse_args(argv)
    if args.max_seconds:
        _bail(args.max_seconds)
    if args.quick and args.cpu:
        p.error("--quick is sized for GPU workers (32 GiB of matrices); drop --cpu")
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) in (None, p.get_default(key)):
                setattr(args, key, value)
    # the workers inherit this: Dask's INFO lines would bury the table
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    gpu = not args.cpu
    args.count = args.count or (1 << 24 if gpu else 1 << 16)
    args.n = args.n or (32 if gpu else 8)
    # largest first: a memory pool's blocks of a large chunk split for smaller ones
    args.chunks = sorted(_ints(args.chunk or (1 << 20 if gpu else 1 << 13)), reverse=True)
    args.calls = [c.strip() for c in args.call.split(",") if c.strip()]
    args.saturations = [float(v) for v in str(args.saturation).split(",") if v.strip()]
    args.batches = _ints(args.batches)
    if args.model_gpu and gpu:
        p.error("--model-gpu models the GPU in a --cpu run")
    if args.ptds and set(args.calls) - {"default"} and gpu:
        p.error("--ptds: the default call only (see --help)")
    if set(args.calls) - set(CALLS):
        p.error(f"--call: each of {CALLS}")
    wanted = _ints(args.workers)
    ids = gpu_ids(gpu, max(wanted))
    counts = [k for k in wanted if k <= len(ids)]
    skipped = [k for k in wanted if k > len(ids)]
    device = "CPU"
    if gpu:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        device = name.decode() if isinstance(name, bytes) else str(name)
    print(f"device: {device} x {len(ids)} visible; {args.count} matrices {args.n}x{args.n} "
          f"{args.dtype}, chunks of {args.chunks}; calls {args.calls}; median of {args.reps}; "
          f"threads per worker {args.threads}; worker-saturation {args.saturation}; "
          f"{args.pause} s between timed Dask runs; batches in flight {args.batches}"
          + (f"; GPU modelled at {args.model_gpu:g} s per matrix" if args.model_gpu else "")
          + ("; per-thread default streams" if args.ptds else ""), flush=True)
    import scipy_gpuqr
    print(f"scipy_gpuqr from {Path(scipy_gpuqr.__file__).parent}; the tasks' functions from "
          f"the module {make_chunk.__module__}", flush=True)
    if skipped:
        print(f"skipped worker counts {skipped}: only {len(ids)} devices", flush=True)
    rows, direct = [], []

    def save():
        if args.json:                   # after each step: a run cut short keeps the rest
            Path(args.json).write_text(json.dumps({"device": device, "args": vars(args),
                                                   "task_functions_from": make_chunk.__module__,
                                                   "rows": rows, "direct": direct}, indent=1))
    if not args.no_direct:
        # first: the baseline exists even when a Dask run is cut short
        direct = run_direct(args, gpu)
        save()
    elif args.direct_from:
        try:
            direct = json.loads(Path(args.direct_from).read_text())["direct"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"no baseline from {args.direct_from}: {exc}", flush=True)
    for k in counts:
        for threads in _ints(args.threads):
            for saturation in args.saturations:
                try:
                    rows.extend(run_workers(k, threads, saturation, ids, args, gpu))
                except Exception as exc:   # noqa: BLE001 - a one-shot run keeps the rest
                    _say(f"{k} worker(s) x {threads} thread(s), saturation {saturation}: "
                         f"FAILED: {''.join(traceback.format_exception(exc))[-3000:]}")
                save()
    report(rows, direct, args.count, gpu, args.model_gpu)
    save()
    return 0


if __name__ == "__main__":
    if "--tasks-in-main" in sys.argv[1:]:
        sys.exit(main())
    # the tasks' functions by reference: from this file imported as a module (see
    # the docstring, "Where the tasks' functions come from")
    import dask_batched
    sys.exit(dask_batched.main())
