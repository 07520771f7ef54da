"""Device layers of the GPU engine: the CUDA one (CuPy) and a NumPy stand-in.

The engine (:mod:`scipy_gpuqr._engine.gpu.driver`) drives a factorization stage by
stage, launch by launch, so its host-side logic (staging, carried
contribution blocks, R's gather maps, Q bookkeeping) runs on a machine
without a GPU against :class:`NumpyDevice`, which executes the very same
records with the NumPy executor:

``start(maps, vt_size)``
    maps (Rimap then Rjmap, int64) uploaded once; the VT pool allocated.
``begin_stage(stage, s_index, s_value, carried) -> handle``
    zeroed front pool, carried contribution blocks and S entries uploaded;
    the stage's records go up with its launches (below).
``launch(handle, L, records)``
    launch ``L`` of the stage, its records uploaded before it asynchronously
    from pinned memory: a materialized stage's in chunks of at least
    :data:`RECORD_CHUNK_BYTES` ahead of the launches that read them (the
    first launch waits for one chunk, not for the whole list), a stage built
    launch by launch one launch's at a time.
``open_r_copy(pool, index, layout, final=None) -> copier``
    R's values ``pool[index]`` to the host (:mod:`.rcopy`): with
    ``final`` (one-stage schedules) ranges already final are copied while
    later launches run (``copier.after_launch(L)``); ``launches_done()``
    then ``result()`` (an ordinary NumPy array; no pinned allocation per
    factorization: a staging buffer cached with R's layout).
``dense_factorize(handle, offset, fm, fn, stair) -> (front, panels, T, done)``
    a dense front of the stage (see :mod:`.dense_front`) factorized in
    place after the launch just enqueued (which completed its assembly), on
    a side stream; returns the front's view, its panels' ``T`` and a token
    for ``dense_join``.
``dense_join(handle, done)``
    later launches wait for that dense front (before its parent's pack).
``mark_kernels_end(handle)``
    the end of the stage's kernels (for the kernel time).
``end_stage(handle) -> pool``
    waits for the stage, checks every launch (CUDA error) and the pool for
    non-finite values on the device.
``fetch(pool, segments)``, ``to_host(pool)``, ``release(pool)``
    contribution blocks and pools for later stages and for Q.
``open_pool_copy(pool, final)`` (optional)
    a pool that leaves the device after its stage, sent down in ranges as
    the launches finish them (:mod:`.pool_copy`), or None.
``vt_host()``, ``close()``
    the VT pool on the host (lazily, for Q); device memory released.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..._cpu.blas_threads import SINGLE_THREAD_FLOPS
from ..._errors import DeviceOutOfMemory, GpuEngineError
from ..._gpu import device_attributes, device_name, import_cupy
from ..._kernels import load_module
from ..._schedule import native
from ..._schedule.native import run_split
from ..._schedule.tasks import TASK_BYTES, TaskType, apply_split
from ..dense_front import (DEFAULT_PANEL, factorize_cupy, factorize_numpy, geqrf_panels,
                           panels_of)
from ..host.simulate import execute_task, one_blas_thread
from ..memory import CHECK_CHUNK, DeviceMemory, available_bytes, largest_block_bytes
from ..pool_map import CHUNK_BYTES
from ..slab_front import (PART_ROW_BYTES, CupySlabs, NumpySlabs, factorize_in_slabs,
                          one_slab_parts, slab_columns, whole_front_fits)
from . import factorize_kernels as variants
from .array_ops import upload_block
from .finite_check import finite_check
from . import vmm
from .pool_copy import CupyPoolCopy, NumpyPoolCopy
from .rcopy import (MIN_CHUNK_BYTES, SLOT_BYTES, CupyRCopy, NumpyRCopy, PinnedStaging,
                    staging_for)
from .worker import on_worker

__all__ = ["GpuEngineError", "DeviceOutOfMemory", "CupyDevice", "NumpyDevice",
           "HostFrontDevice"]

#: Threads per block of the engine's uberkernel variants.
ENGINE_THREADS = variants.ENGINE_THREADS
#: Side streams on which dense fronts run (concurrently with the launches and
#: with each other).
DENSE_STREAMS = 4

#: Bytes of a materialized stage's records copied to pinned memory and uploaded
#: at once, ahead of the launches that read them (:meth:`CupyDevice.launch`):
#: the whole list before the first launch held it back by its host copy (40 MB,
#: milliseconds, on grid 40^3).
RECORD_CHUNK_BYTES = 4 << 20


#: Most pieces the uberkernel cuts an Apply record (and an Apply+Factorize
#: record's Apply) into in a launch of fewer records than the device runs at once
#: (:func:`~scipy_gpuqr._schedule.tasks.apply_split`; 1: never cut). A small
#: launch's time is its longest record's chain of column tiles; the cut spreads
#: them over the idle blocks.
APPLY_SPLIT_MAX = 8
#: A launch is cut until its blocks with work reach this many times the blocks
#: the device runs at once.
APPLY_SPLIT_FILL = 1.0
#: Environment variable giving ``max[:fill]`` for comparisons (benchmarks, tests).
ENV_APPLY_SPLIT = "SCIPY_GPUQR_APPLY_SPLIT"


def apply_split_setting(environ=os.environ) -> tuple:
    """``(max pieces, fill)``: :data:`ENV_APPLY_SPLIT` when set, else
    :data:`APPLY_SPLIT_MAX`, :data:`APPLY_SPLIT_FILL`."""
    raw = environ.get(ENV_APPLY_SPLIT, "").strip()
    if not raw:
        return APPLY_SPLIT_MAX, APPLY_SPLIT_FILL
    mx, _, fill = raw.partition(":")
    try:
        out = (max(1, int(mx)), float(fill) if fill else APPLY_SPLIT_FILL)
    except ValueError:
        raise ValueError(f"{ENV_APPLY_SPLIT}={raw!r}: 'max' or 'max:fill'") from None
    if not out[1] > 0:
        raise ValueError(f"{ENV_APPLY_SPLIT}={raw!r}: fill must be > 0")
    return out


def resident_blocks(props: dict, threads: int, smem: int, regs: int) -> int:
    """Thread blocks of ``threads`` threads, ``smem`` bytes of dynamic shared memory
    and ``regs`` registers a thread the device runs at once (SMs times the
    blocks an SM holds by threads, shared memory with its 1 KB reserved per
    block, and registers; at least one per SM)."""
    sms = int(props.get("multiProcessorCount", 1))
    by_threads = int(props.get("maxThreadsPerMultiProcessor", 2048)) // max(threads, 1)
    sm_smem = int(props.get("sharedMemPerMultiprocessor", 0))
    by_smem = sm_smem // (smem + 1024) if sm_smem else by_threads
    by_regs = (int(props.get("regsPerMultiprocessor", 65536)) // (max(regs, 1) * threads)
               if regs else by_threads)
    return sms * max(1, min(by_threads, by_smem, by_regs,
                            int(props.get("maxBlocksPerMultiProcessor", 32))))


#: Share of the host's physical memory one factorization may pin for the stage
#: pools it sends to the host (pinned pages cannot be swapped or reclaimed).
PINNED_POOL_SHARE = 0.25


def pinned_pool_cap() -> int:
    """Bytes of stage pools one factorization may keep in pinned host memory:
    :data:`PINNED_POOL_SHARE` of the physical memory (0 when it cannot be read)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
    return int(PINNED_POOL_SHARE * total)


#: Elements of one piece when a host pool is filled by threads.
_FILL_PIECE = 1 << 23

#: The device layers' streams, per thread (``by_device``: (device id, layer) → streams).
_THREAD_STREAMS = threading.local()


def layer_streams(cp, device_id: int, layer: int = 0) -> tuple:
    """``(stream, copy_stream, dense_streams)`` of a device layer: made once per
    thread, device and ``layer`` (the layers of one GPU in a multi-device
    factorization each have their own), the same for every factorization the
    thread runs there.

    CuPy's memory pool keeps a freed block for the stream it was allocated on:
    a factorization on fresh streams could not take the blocks its predecessor
    freed (its front pools, allocated on the layer's stream), so the pool grew
    by a whole factorization's peak per call and each call allocated its pools
    from the driver again. Per thread, because two threads' factorizations must
    not queue behind each other.
    """
    per = getattr(_THREAD_STREAMS, "by_device", None)
    if per is None:
        per = _THREAD_STREAMS.by_device = {}
    key = (int(device_id), int(layer))
    streams = per.get(key)
    if streams is None:
        with cp.cuda.Device(device_id):
            streams = per[key] = (
                cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True),
                tuple(cp.cuda.Stream(non_blocking=True) for _ in range(DENSE_STREAMS)))
    return streams


def pool_block(pool: np.ndarray, start: int, rows: int, width: int, pitch: int) -> np.ndarray:
    """The ``rows`` × ``width`` view of the host ``pool`` whose rows begin
    ``pitch`` elements apart from ``start`` (a front or carried block as a
    stage pool stores it).

    Raises
    ------
    ValueError
        The block reaches past the pool's end.
    """
    if start + (rows - 1) * pitch + width > pool.size:
        raise ValueError("pool_block: a block past the pool's end")
    isz = pool.itemsize
    return np.lib.stride_tricks.as_strided(pool[start:], shape=(rows, width),
                                           strides=(pitch * isz, isz))


def _all_finite(pool: np.ndarray) -> bool:
    """Whether every value of a host pool is finite: chunks of
    :data:`CHECK_CHUNK` on threads (no temporary of the pool's size; a host
    front's pool can hold gigabytes)."""
    n = pool.size
    bounds = np.arange(0, n + CHECK_CHUNK, CHECK_CHUNK).clip(max=n)
    bad = []

    def check(c0, c1):
        for a in range(int(c0), int(c1)):
            if not np.isfinite(pool[bounds[a]:bounds[a + 1]]).all():
                bad.append(a)
                return

    run_split(check, 0, len(bounds) - 1, 1)
    return not bad


def _mapped_chunk(h, k: int):
    """Chunk ``k`` of a mapped stage pool (``h``: the stage's handle, its pool array
    and :class:`~scipy_gpuqr._engine.pool_map.PoolMap`): a view, the last one short."""
    c = int(h["pmap"].chunk)
    return h["pool"][int(k) * c: (int(k) + 1) * c]


class NumpyDevice:
    """The device calls over NumPy arrays (CI and the host-logic tests).

    Parameters
    ----------
    tile, bundle : int
        Must match the schedule.
    fail_after : int, optional
        Raise :class:`DeviceOutOfMemory` for stages whose pool exceeds this
        many elements (exercises the engine's restaging).
    rng : numpy.random.Generator, optional
        Run each launch's tasks in a random order.
    memory_limit : int, optional
        Bytes this stand-in device has: it counts what :class:`CupyDevice`
        allocates (maps, VT pool; per stage the pool, S entries, records, R's
        gather index and slots, the check's chunk, dense fronts' ``T`` and
        workspaces, the gather buffer of leaving contribution blocks), reports
        the rest as available (:meth:`memory`) and raises
        :class:`DeviceOutOfMemory` past it (``peak`` records the most held).
    """

    name = "numpy (no GPU)"

    def __init__(self, tile: int, bundle: int, *, dtype=np.float64,
                 fail_after: int | None = None, rng=None, debug: bool = False,
                 memory_limit: int | None = None):
        self.tile, self.bundle, self.dtype = tile, bundle, np.dtype(dtype)
        self.fail_after = fail_after
        self.memory_limit = None if memory_limit is None else int(memory_limit)
        self.held = 0
        self.peak = 0
        self._stage_held = 0
        self.rng = rng
        self.debug = debug
        self.launches = 0
        #: ``time.perf_counter()`` when the first launch ran (None: none yet)
        self.first_launch_at = None
        self.seconds = {"upload": 0.0, "kernels": 0.0, "download": 0.0}
        #: end of every range of R copied (the progressive copy's steps)
        self.r_copies = []
        #: panel width of dense fronts, and the fronts factorized so
        self.dense_panel = DEFAULT_PANEL
        self.dense_done = []
        #: fewest bytes of a pool's copy to the host sent at once (:meth:`open_pool_copy`)
        self.pool_copy_min_bytes = 1
        #: bytes of a mapped pool's chunk (:mod:`scipy_gpuqr._engine.pool_map`)
        self.map_chunk_bytes = CHUNK_BYTES

    def memory(self) -> DeviceMemory:
        """The bytes left under ``memory_limit`` (None: unlimited)."""
        if self.memory_limit is None:
            return DeviceMemory(None, "none")
        return DeviceMemory(self.memory_limit - self.held, "device limit",
                            {"limit": self.memory_limit, "held": self.held})

    def _take(self, nbytes: int, what: str) -> None:
        nbytes = int(nbytes)
        if self.memory_limit is not None and self.held + nbytes > self.memory_limit:
            raise DeviceOutOfMemory(f"Out of memory allocating {nbytes:,} bytes for {what} "
                                    f"(held {self.held:,}, limit {self.memory_limit:,})")
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def start(self, maps: np.ndarray, vt_size: int) -> None:
        self.held = 0
        self.first_launch_at = None
        self._take(maps.nbytes, "maps")
        self._take(max(vt_size, 1) * self.dtype.itemsize, "the VT pool")
        self.maps = maps
        self.vt = np.full(max(vt_size, 1), np.nan, dtype=self.dtype)

    def begin_stage(self, st, s_index, s_value, carried, pool_map=None):
        """The stage's pool and S entries. ``pool_map``: the pool is mapped chunk by
        chunk (:meth:`map_chunks`): only its mapped chunks are counted, and a
        chunk not mapped holds NaN, so that a read of it shows."""
        if self.fail_after is not None and st.pool_size > self.fail_after:
            raise DeviceOutOfMemory(f"stage pool of {st.pool_size} elements")
        isz = self.dtype.itemsize
        self._stage_start = self.held
        if pool_map is None:
            self._take(st.pool_size * isz, "a stage pool")
        self._take(len(s_index) * (8 + isz), "S entries")
        self._take(max(int(st.launch_ptr[-1]) if len(st.launch_ptr) else 0, 1) * TASK_BYTES,
                   "the task list")
        h = {"spool": (s_index, s_value.astype(self.dtype)), "st": st}
        if pool_map is None:
            h["pool"] = self._stage_pool(st.pool_size, carried, key=tuple(st.fronts))
        else:
            h["pool"] = np.full(st.pool_size, np.nan, dtype=self.dtype)
            h["pmap"], h["on"] = pool_map, set()
        return h

    def can_map(self, nbytes: int, chunk_bytes: int) -> bool:
        """Whether a pool of ``nbytes`` may be mapped in chunks of ``chunk_bytes``."""
        return True

    def map_chunks(self, h, chunks) -> None:
        """Chunks of a mapped pool backed (counted) and zeroed."""
        chunks = list(chunks)
        self._take(len(chunks) * h["pmap"].chunk_bytes, "mapped chunks of a stage pool")
        for k in chunks:
            _mapped_chunk(h, k)[...] = 0
            h["on"].add(int(k))

    def unmap_chunks(self, h, chunks) -> None:
        """Chunks of a mapped pool given back: checked finite, then NaN."""
        chunks = list(chunks)
        for k in chunks:
            v = _mapped_chunk(h, k)
            if not np.isfinite(v).all():
                raise GpuEngineError(f"non-finite values in chunk {k} of the front pool")
            v[...] = np.nan
            h["on"].discard(int(k))
        self.held -= len(chunks) * h["pmap"].chunk_bytes

    def _stage_pool(self, n: int, carried, key=None) -> np.ndarray:
        """A stage's pool of ``n`` zeros with the carried contribution blocks
        (``(offset, block)`` pairs) in (``key``: the stage's fronts)."""
        pool = np.zeros(n, dtype=self.dtype)
        for off, cb in carried:
            pool[off: off + cb.size] = cb.ravel()
        return pool

    def launch(self, h, L, records) -> None:
        n = len(records)
        if n and self.first_launch_at is None:
            self.first_launch_at = time.perf_counter()
        order = range(n) if self.rng is None else self.rng.permutation(n)
        for k in order:
            execute_task(records[k], h["pool"], self.vt, self.tile, spool=h["spool"],
                         maps=self.maps)
        self.launches += n > 0

    def dense_factorize(self, h, off, fm, fn, stair):
        F = h["pool"][off: off + fm * fn].reshape(fm, fn)
        panels = panels_of(fm, fn, stair, self.dense_panel)
        if self.memory_limit is not None:
            nb, isz = self.dense_panel, self.dtype.itemsize
            work = (3 * fm * nb + 2 * fn * nb + 4 * nb * nb) * isz
            self._take(len(panels) * nb * nb * isz + work, "a dense front")
            self.held -= work
        with one_blas_thread():         # as the simulate engine: the same rounding
            T = factorize_numpy(F, panels, self.dense_panel)
        self.dense_done.append((int(off), int(fm), int(fn)))
        return F, panels, T, None

    def dense_join(self, h, done) -> None:
        pass

    def open_r_copy(self, pool, index, layout=None, final=None):
        nslot = min(32 << 20, max(getattr(layout, "nnz", len(index)), 1) * 8)
        self._take(len(index) * 8 + 2 * nslot, "R's copy")
        return NumpyRCopy(pool, index, final, dtype=self.dtype, counter=self.r_copies)

    def open_pool_copy(self, pool, final):
        """The stage's pool copied to a host array range by range as launches finish
        (:class:`~.pool_copy.NumpyPoolCopy`, :attr:`pool_copy_min_bytes` at once)."""
        return NumpyPoolCopy(pool, final, self.pool_copy_min_bytes)

    def mark_kernels_end(self, h) -> None:
        pass

    def end_stage(self, h) -> np.ndarray:
        pool = h["pool"]
        self._take(min(pool.size, CHECK_CHUNK), "the finite check")
        self.held -= min(pool.size, CHECK_CHUNK)
        if "pmap" in h:             # a mapped pool: its chunks mapped now (the others were)
            ok = all(np.isfinite(_mapped_chunk(h, k)).all() for k in h["on"])
        else:
            ok = _all_finite(pool)
        if not ok:
            raise GpuEngineError("non-finite values in the front pool after the stage")
        return pool

    def fetch(self, pool, segments) -> np.ndarray:
        n = int(sum(k for _, k in segments)) * self.dtype.itemsize
        self._take(n, "leaving contribution blocks")
        self.held -= n
        parts = [pool[a: a + n] for a, n in segments]
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)

    def to_host(self, pool) -> np.ndarray:
        return pool

    def release(self, pool) -> None:
        """The stage's allocations end (its pool, S entries, records, R's copy)."""
        self.held = getattr(self, "_stage_start", self.held)

    def vt_host(self) -> np.ndarray:
        return self.vt

    def close(self) -> None:
        self.held = 0


class HostFrontDevice(NumpyDevice):
    """The device calls for a host stage: one dense front too large for the device.

    The engine's memory plan (:mod:`scipy_gpuqr._engine.memory`) gives such a
    front a stage of its own; this layer runs that stage's records (its
    S-Assemble and its children's Pack-Assemble, compiled on threads where the
    schedule's native library is loaded: a dense front has no tile tasks, which
    this layer refuses) on its host pool (pinned when a GPU layer is given),
    factorizes the front on the GPU when one is given (whole, or in column
    slabs: :meth:`_on_gpu`), else with LAPACK ``geqrf`` panels and BLAS
    trailing updates using all the BLAS library's threads
    (:func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`), and hands R's
    rows and the contribution block on like a device stage. The stage's data
    never stay on the device. A front of fewer than
    :data:`~scipy_gpuqr._cpu.blas_threads.SINGLE_THREAD_FLOPS` Householder
    flops runs on one BLAS thread (a pool of spinning workers costs such a
    front more than it gains).
    """

    name = "host (LAPACK)"

    #: Record types a host stage may hold.
    ALLOWED = (int(TaskType.S_ASSEMBLE), int(TaskType.PACK_ASSEMBLE), int(TaskType.NONE))

    def __init__(self, tile: int, bundle: int, *, dtype=np.float64, gpu=None):
        super().__init__(tile, bundle, dtype=dtype)
        #: the engine's :class:`CupyDevice` (None: LAPACK only)
        self.gpu = gpu
        #: per front factorized, where: ``"gpu"`` or ``"host"`` (and why)
        self.factorized_on = []
        self._ready = {}                # stage key -> (pool future, zeros future)
        self._placed = {}               # stage key -> what its placed blocks wait for
        self._ahead = {}                # stage key -> [(block starts, ends, job)]
        #: Pack-Assemble records run ahead of their stage (:meth:`assemble_ahead`)
        self.assembled_ahead = 0

    def prepare(self, stages) -> None:
        """Start making the host stages' pools on a worker thread: ``stages``
        ``(key, elements, zero_end)`` (``key`` the stage's fronts; elements
        ``[0, zero_end)`` zeroed: its front, the carried blocks after it are
        written whole). The earlier stages keep the device busy meanwhile, and a
        host front's pool takes gigabytes. :meth:`take_pool` hands a pool out
        once allocated (its zeros may still be written), :meth:`_stage_pool`
        once zeroed (a pool never taken is dropped with this layer)."""
        stages = [(tuple(k), int(n), int(z)) for k, n, z in stages]
        if not stages:
            return
        ex = ThreadPoolExecutor(1, thread_name_prefix="gpuqr-host-pool")
        for key, n, z in stages:
            made = ex.submit(self._allocated, n)
            self._ready[key] = (made, ex.submit(self._zero, made, 0, min(z, n)), min(z, n))
        ex.shutdown(wait=False)

    def take_pool(self, key, start: int, wait: bool = True):
        """The pool :meth:`prepare` makes for the stage ``key``, for writing from
        element ``start`` on (a carried block placed early, :meth:`placed`): once
        allocated, and once zeroed where ``start`` lies in its zeroed part;
        None when none was prepared (or, without ``wait``, when it is not ready
        yet)."""
        entry = self._ready.get(tuple(key))
        if entry is None:
            return None
        if not wait and not (entry[0].done() and (start >= entry[2] or entry[1].done())):
            return None
        if start < entry[2]:
            entry[1].result()
        return entry[0].result()

    def placed(self, key, wait) -> None:
        """A carried block was written into stage ``key``'s pool ahead of its
        stage (``wait``: what to wait for before the pool is read, or None);
        the stage then leaves it out of its ``carried``."""
        self._placed.setdefault(tuple(key), []).append(wait)

    def assemble_ahead(self, key, records, blocks, landed=None) -> bool:
        """Stage ``key``'s Pack-Assemble ``records`` that read the carried blocks
        ``blocks`` (``(start, elements)`` in its pool, placed there: by stages
        that ended (:meth:`placed`), or by the stage running, whose copies
        ``landed`` waits for) run on a worker thread, while the device works on
        the stages before it: a root's blocks are gigabytes, and the host
        stage would otherwise assemble them all as it begins, with the device
        idle. The stage's workers run one after another, in the order given.
        Every launch of the stage then waits for them and leaves those records
        out (:meth:`launch`). Their writes are disjoint from every other
        record's of the stage (a parent's rows come from one child each, its
        own S rows from none), so the pool is the same bit for bit. False
        (nothing started) where the stage's pool was not prepared
        (:meth:`prepare`) or there is nothing to do."""
        key = tuple(key)
        entry = self._ready.get(key)
        if entry is None or not len(records) or not len(blocks):
            return False
        made, zeroed = entry[0], entry[1]
        waits = [w for w in list(self._placed.get(key, ())) + [landed] if w is not None]
        blocks = sorted((int(a), int(a) + int(n)) for a, n in blocks)
        starts = np.array([a for a, _ in blocks], dtype=np.int64)
        ends = np.array([b for _, b in blocks], dtype=np.int64)
        jobs = self._ahead.setdefault(key, [])
        before = jobs[-1][2] if jobs else None
        job = on_worker("gpuqr-host-assemble", self._assemble, made, zeroed, np.array(records),
                        waits, before)
        jobs.append((starts, ends, job))
        return True

    def _assemble(self, made, zeroed, records, waits, before=None) -> tuple:
        """:meth:`assemble_ahead`'s worker: the stage's worker before it (its
        failure is its own), the placed blocks' copies and the pool's zeros
        waited for, the records run; ``(records, seconds they took)``."""
        if before is not None:
            concurrent.futures.wait([before])
        gpu = self.gpu
        with (gpu.cp.cuda.Device(gpu.device_id) if gpu is not None      # events of its device
              else contextlib.nullcontext()):
            for wait in waits:
                wait.synchronize()
        pool = made.result()
        zeroed.result()
        t0 = time.perf_counter()
        lib = native.handle()
        if lib is not None:
            native.pack(lib, pool, self.maps, records)
        else:
            for rec in records:
                execute_task(rec, pool, self.vt, self.tile, maps=self.maps)
        return len(records), time.perf_counter() - t0

    def _not_ahead(self, h, records):
        """``records`` less the Pack-Assemble records run ahead for ``h``'s stage
        (:meth:`assemble_ahead`), its workers waited for on the first call."""
        done = h.get("ahead")
        if done is None:
            jobs = self._ahead.pop(tuple(h["st"].fronts), [])
            starts = np.concatenate([s for s, _, _ in jobs] or [np.zeros(0, np.int64)])
            ends = np.concatenate([e for _, e, _ in jobs] or [np.zeros(0, np.int64)])
            t0 = time.perf_counter()
            for _, _, job in jobs:
                n, secs = job.result()
                self.assembled_ahead += n
                self.seconds["assemble_ahead"] = self.seconds.get("assemble_ahead", 0.0) + secs
            if jobs:
                self.seconds["assemble_ahead_wait"] = (
                    self.seconds.get("assemble_ahead_wait", 0.0) + time.perf_counter() - t0)
            order = np.argsort(starts)
            done = h["ahead"] = (starts[order], ends[order])
        starts, ends = done
        if not len(starts) or not len(records):
            return records
        return records[~packs_reading(records, starts, ends)]

    def _allocated(self, n: int) -> np.ndarray:
        """``n`` elements, not set: pinned when a GPU layer is given and its pinned
        budget allows (the front goes up and down, whole or in slabs, at the
        link's speed only from pinned pages)."""
        pinned = getattr(self.gpu, "pinned_within_cap", None)
        pool = pinned(n, self.dtype) if pinned is not None else None
        return np.empty(n, dtype=self.dtype) if pool is None else pool

    @staticmethod
    def _zero(made, a: int, b: int) -> None:
        """Zeros into ``[a, b)`` of the pool ``made`` gives, by threads in pieces."""
        pool = made.result() if hasattr(made, "result") else made

        def zeros(i0, i1):
            for k in range(int(i0), int(i1)):           # NumPy releases the GIL
                pool[a + k * _FILL_PIECE: min(b, a + (k + 1) * _FILL_PIECE)] = 0

        run_split(zeros, 0, -(-(b - a) // _FILL_PIECE), 1)

    def _zeroed(self, n: int) -> np.ndarray:
        """``n`` zeros (:meth:`_allocated`, zeroed by threads)."""
        pool = self._allocated(n)
        self._zero(pool, 0, n)
        return pool

    def _stage_pool(self, n: int, carried, key=None) -> np.ndarray:
        """The stage's pool: zeros (made ahead by :meth:`prepare`, else now) with
        the carried blocks copied in by threads in pieces (the pool of a host
        front holds gigabytes); blocks placed ahead (:meth:`placed`) waited for."""
        t0 = time.perf_counter()
        entry = self._ready.pop(tuple(key), None) if key is not None else None
        if entry is None:
            pool = self._zeroed(n)
        else:
            pool, _ = entry[0].result(), entry[1].result()
        for wait in self._placed.pop(tuple(key), []) if key is not None else ():
            if wait is not None:
                wait.synchronize()
        self.seconds["begin_wait"] = self.seconds.get("begin_wait", 0.0) + (
            time.perf_counter() - t0)
        pieces, pos = [], 0                 # (start, stop, source rows)
        for off, cb in sorted(((int(o), cb) for o, cb in carried), key=lambda oc: oc[0]):
            if off < pos:
                raise GpuEngineError("carried contribution blocks overlap in a host pool")
            rows = cb.reshape(len(cb), -1) if cb.ndim > 1 else cb.reshape(-1, 1)
            ncol = max(rows.shape[1], 1)    # whole rows a piece (a view: no copy)
            step = max(1, _FILL_PIECE // ncol)
            pieces.extend((off + r * ncol, off + min(len(rows), r + step) * ncol, rows[r:r + step])
                          for r in range(0, len(rows), step))
            pos = off + cb.size

        def fill(i0, i1):
            for a, b, src in pieces[i0:i1]:             # NumPy releases the GIL
                pool[a:b].reshape(src.shape)[...] = src

        run_split(fill, 0, len(pieces), 1)
        return pool

    def launch(self, h, L, records) -> None:
        if len(records):
            bad = ~np.isin(records["type"], self.ALLOWED)
            if bad.any():
                raise GpuEngineError(f"a host stage holds a record of type "
                                     f"{int(records['type'][bad][0])} (assembly only)")
        records = self._not_ahead(h, records)
        t0 = time.perf_counter()
        lib = native.handle() if len(records) else None
        if lib is None:
            super().launch(h, L, records)
        else:
            # Pack-Assemble compiled on threads (a root's blocks come in
            # thousands of pieces: one NumPy call chain each costs more than
            # its copy); the S entries as the NumPy device does them
            pack = records["type"] == int(TaskType.PACK_ASSEMBLE)
            native.pack(lib, h["pool"], self.maps, records[pack])
            for rec in records[~pack]:
                execute_task(rec, h["pool"], self.vt, self.tile, spool=h["spool"],
                             maps=self.maps)
            self.launches += 1
        self.seconds["kernels"] += time.perf_counter() - t0

    def begin_stage(self, st, s_index, s_value, carried):
        t0 = time.perf_counter()
        carried = list(carried)
        h = super().begin_stage(st, s_index, s_value, carried)
        # the carried blocks lie after the fronts (those placed ahead too, left out
        # of ``carried``); they were checked in their stages
        h["fronts_end"] = min((int(off) for off in st.carried.values()),
                              default=h["pool"].size)
        self.seconds["begin"] = self.seconds.get("begin", 0.0) + time.perf_counter() - t0
        return h

    def end_stage(self, h) -> np.ndarray:
        """The stage's pool after the check for non-finite values of its fronts: a
        front factorized on the GPU was checked there before it came back (its
        span in ``h['device_checked']``), the rest of the fronts are read here;
        the carried blocks after them come from stages checked already."""
        t0 = time.perf_counter()
        pool = h["pool"]
        end = int(h.get("fronts_end", pool.size))
        spans = sorted(h.get("device_checked", ()))
        if not all(ok for _, _, ok in spans):
            raise GpuEngineError("non-finite values in a host front after its factorization "
                                 "on the device")
        pos = 0
        for a, b in [(a, b) for a, b, _ in spans] + [(end, end)]:
            if min(a, end) > pos and not _all_finite(pool[pos:min(a, end)]):
                raise GpuEngineError("non-finite values in the front pool after the stage")
            pos = max(pos, b)
        self.seconds["check"] = self.seconds.get("check", 0.0) + time.perf_counter() - t0
        return pool

    def dense_factorize(self, h, off, fm, fn, stair):
        """The front factorized in place: on the GPU when a GPU layer is given (the
        front assembled here uploaded whole, or in column slabs when it alone
        does not fit: :meth:`_on_gpu`; the stage's other data never reach the
        device), else, or when not even one slab fits, with the BLAS library's
        threads. ``factorized_on`` records which and why."""
        t0 = time.perf_counter()
        F = h["pool"][off: off + fm * fn].reshape(fm, fn)
        panels = panels_of(fm, fn, stair, self.dense_panel)
        T, how, ok = (None, "no GPU layer", None) if self.gpu is None else self._on_gpu(F, panels)
        if ok is not None:                  # checked on the device: end_stage skips it
            h.setdefault("device_checked", []).append((int(off), int(off + fm * fn), ok))
        if T is None:
            flops = sum(2.0 * rows * b * (b + 2 * (fn - j - b)) for j, rows, b in panels)
            with (one_blas_thread() if flops < SINGLE_THREAD_FLOPS
                  else contextlib.nullcontext()):
                T = factorize_numpy(F, panels, self.dense_panel)
            self.factorized_on.append(f"host (LAPACK): {how}")
        else:
            self.factorized_on.append(f"gpu ({how})")
        self.dense_done.append((int(off), int(fm), int(fn)))
        self.seconds["dense"] = self.seconds.get("dense", 0.0) + time.perf_counter() - t0
        return F, panels, T, None

    def _on_gpu(self, F, panels):
        """``(T, where, finite)`` after factorizing ``F`` (a host view, overwritten)
        on the GPU: whole when it fits there, else in column slabs
        (:mod:`~scipy_gpuqr._engine.slab_front`: one slab where the front's
        parts down to its staircase fit, :func:`one_slab_parts`; slabs that still run out of
        memory, and the rest, with LAPACK); ``(None, why not, None)`` when not
        even one panel's slab fits (nothing left allocated there). ``finite``:
        whether the factorized front holds finite values only, read on the
        device before it came back (None where part of it ran on the host)."""
        gpu = self.gpu
        cp = gpu.cp
        nb, isz = self.dense_panel, F.dtype.itemsize
        mem = gpu.memory()
        avail = mem.available
        whole = f"the front and its workspace do not fit the device ({avail} bytes available)"
        if avail is None or whole_front_fits(*F.shape, nb, isz, avail):
            try:
                with gpu.stream:
                    Fd = cp.empty(F.shape, dtype=F.dtype)
                    Fd.set(F, stream=gpu.stream)
                    Td = factorize_cupy(Fd, panels, nb, stream=gpu.stream)
                    flag = finite_check(Fd.dtype).enqueue(Fd, gpu.stream)
                    Fd.get(stream=gpu.stream, out=F)
                    T = Td.get(stream=gpu.stream)
                gpu.stream.synchronize()
                return T, "front alone uploaded", not int(flag.get(stream=gpu.stream)[0])
            except cp.cuda.memory.OutOfMemoryError as exc:
                whole = f"the front alone does not fit the device ({exc})"
            finally:
                Fd = Td = None
        if avail is not None:           # one slab buffer: what one allocation may take
            avail = min(avail, largest_block_bytes(cp))
        w = slab_columns(F.shape[0], nb, isz, avail) if avail is not None else 0
        # the whole front as one slab where its parts down to their staircases fit
        one = (one_slab_parts(panels, *F.shape, nb, isz, avail, PART_ROW_BYTES,
                              geqrf=geqrf_panels(panels, F.dtype))
               if avail is not None else 0)
        if not w and not one:
            return None, f"{whole}; not even a slab of one panel fits ({avail} bytes)", None
        host = NumpySlabs()
        slabs = CupySlabs(cp, gpu.stream, on_part=getattr(self, "on_slab_part", None))
        T = factorize_in_slabs(F, panels, nb, F.shape[1] if one else w, slabs, fallback=host,
                               parts=one or None)
        held = int((mem.detail or {}).get("pool_used", 0))
        shape = (f"one slab of {one} parts, each down to its staircase" if one
                 else f"slabs of {w}")
        return T, (f"in column slabs: {shape} (the front alone does not fit; {avail:,} bytes "
                   f"for a slab beside {held:,} held)"
                   + (f"; its last {host.slabs} slabs on the host (LAPACK/BLAS) after the "
                      f"device failed one (log)" if host.slabs else "")), \
            (None if host.slabs else slabs.all_finite())


def packs_reading(records, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per record, whether it is a Pack-Assemble reading one of the blocks
    ``[starts[i], ends[i])`` of the pool (``starts`` sorted; a Pack-Assemble's
    ``vt`` is its source block's first element)."""
    src = records["vt"].astype(np.int64)
    i = np.searchsorted(starts, src, side="right") - 1
    inside = (i >= 0) & (src < ends[np.clip(i, 0, None)])
    return inside & (records["type"] == int(TaskType.PACK_ASSEMBLE))


class CupyDevice:
    """The CUDA device layer (one stream, pinned host buffers, CuPy memory pools).

    Parameters
    ----------
    tile, bundle : int
        Variant of the uberkernel (with the dtype, one of
        ``factorize_kernels.ENGINE_VARIANTS``).
    dtype : float64 or float32
    debug : bool
        Synchronize and check after every launch; the VT pool starts as NaN and
        the records' buffer as type -1 (no task), so that a tile read before it
        is written, or a launch whose records were never uploaded, shows.
    profile : bool
        Record an event pair around every launch and dense front
        (:meth:`launch_times`, :meth:`dense_times`).
    """

    def __init__(self, tile: int, bundle: int, *, dtype=np.float64, debug: bool = False,
                 profile: bool = False, layer: int = 0):
        cp = import_cupy()
        self.cp = cp
        threads = ENGINE_THREADS
        self.tile, self.bundle, self.threads = tile, bundle, threads
        self.dtype = np.dtype(dtype)
        self.debug = bool(debug)
        ctype = "double" if self.dtype == np.float64 else "float"
        if (ctype, tile, bundle, threads) not in set(variants.ENGINE_VARIANTS):
            raise ValueError(f"no uberkernel variant for {ctype}, TILE {tile}, "
                             f"BUNDLE {bundle}, {threads} threads")
        mod = load_module(variants.UBERKERNEL_FILE,
                          variants.KERNEL_VARIANTS[variants.UBERKERNEL_FILE])
        self.kernel = mod.get_function(variants.kernel_name(ctype, tile, bundle, threads))
        self.smem = variants.tile_smem_bytes(tile, bundle, self.dtype.itemsize)
        if self.smem > 48 * 1024:
            self.kernel.max_dynamic_shared_size_bytes = self.smem
        dev = cp.cuda.Device()
        self.device_id = dev.id
        self.name = device_name(dev.id)
        #: blocks the device runs at once, and the Apply cut (:func:`apply_split_setting`)
        self.slots = resident_blocks(device_attributes(dev.id), threads, self.smem,
                                     int(getattr(self.kernel, "num_regs", 0) or 0))
        self.apply_split_max, self.apply_split_fill = apply_split_setting()
        self.stream, self.copy_stream, dense_streams = layer_streams(cp, dev.id, layer)
        self.launches = 0
        #: ``time.perf_counter()`` when the first launch was enqueued (None: none yet)
        self.first_launch_at = None
        self.seconds = {"upload": 0.0, "kernels": 0.0, "download": 0.0}
        self.kernel_events = []
        self.profile = bool(profile)
        #: with ``profile``: (stage, launch, tasks, start event, end event) per launch
        self.launch_events = []
        #: with ``profile``: (fm, fn, start event, end event) per dense front
        self.dense_events = []
        #: panel width of dense fronts (:mod:`.dense_front`) and their side streams
        self.dense_panel = DEFAULT_PANEL
        self.dense_streams = list(dense_streams)
        self._dense_k = 0
        self._vt_host = None
        #: bytes of a materialized stage's records uploaded at once
        self.record_chunk_bytes = RECORD_CHUNK_BYTES
        #: R copy-back tunables (bytes of a pinned slot; the smallest range
        #: copied while launches still run) and the number of slot copies made
        self.r_copy_slot_bytes = SLOT_BYTES
        self.r_copy_min_chunk_bytes = MIN_CHUNK_BYTES
        self.r_copies = 0
        #: bytes of stage pools this factorization keeps in pinned host memory
        self.pinned_pools = 0
        #: mapped pools' ranges (:mod:`.vmm`) by the pool array's id, until released,
        #: and the bytes of their chunks (:mod:`scipy_gpuqr._engine.pool_map`)
        self._ranges = {}
        self.map_chunk_bytes = CHUNK_BYTES
        #: pinned host memory allocated ahead for this layer's part of a multi-device
        #: call (its ``take(n, dtype)`` and ``holds(array)``: see
        #: :class:`~.pinned_ahead.PinnedAhead`), set by that call while its devices'
        #: threads run; None: each buffer pinned when asked for
        self.pinned_ahead = None

    # -- helpers ---------------------------------------------------------------------
    def _pinned(self, n: int, dtype) -> np.ndarray:
        ahead = getattr(self, "pinned_ahead", None)
        if ahead is not None:
            return ahead.take(int(n), dtype)
        import cupyx
        return cupyx.empty_pinned((int(n),), dtype=dtype)

    def _pinned_copy(self, host: np.ndarray) -> np.ndarray:
        """``host`` (contiguous) in pinned memory: itself where it lies in memory
        pinned and filled ahead (``pinned_ahead.holds``), else a copy."""
        ahead = getattr(self, "pinned_ahead", None)
        if ahead is not None and ahead.holds(host):
            return host
        buf = self._pinned(host.size, host.dtype)
        buf[...] = host.ravel()
        return buf

    def _upload(self, host: np.ndarray):
        cp = self.cp
        if host.size == 0:
            host = np.zeros(1, dtype=host.dtype)
        buf = self._pinned_copy(host)
        out = cp.empty(host.size, dtype=host.dtype)
        out.set(buf, stream=self.stream)
        return out, buf      # keep buf alive until the stream passed the copy

    def _alloc(self, n: int, dtype, fill=None):
        cp = self.cp
        try:
            with self.stream:
                if fill is None:
                    return cp.zeros(max(int(n), 1), dtype=dtype)
                return cp.full(max(int(n), 1), fill, dtype=dtype)
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(str(exc)) from exc

    def _check(self, what: str) -> None:
        cp = self.cp
        try:
            self.stream.synchronize()
        except cp.cuda.runtime.CUDARuntimeError as exc:
            raise GpuEngineError(f"CUDA error {what}: {exc}") from exc

    def memory(self) -> DeviceMemory:
        """What a factorization may allocate on this device now
        (:func:`scipy_gpuqr._engine.memory.available_bytes`)."""
        with self.cp.cuda.Device(self.device_id):
            return available_bytes(self.cp)

    # -- the four calls -------------------------------------------------------------
    def launch_times(self) -> list:
        """(stage fronts, launch, tasks, seconds, Apply pieces) of every profiled launch."""
        cp = self.cp
        return [(fr, L, n, cp.cuda.get_elapsed_time(a, b) / 1e3, k)
                for fr, L, n, a, b, k in self.launch_events]

    def start(self, maps: np.ndarray, vt_size: int) -> None:
        t0 = time.perf_counter()
        self.first_launch_at = None
        self._keep = []
        try:
            self.maps, buf = self._upload(np.ascontiguousarray(maps, dtype=np.int64))
        except self.cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(str(exc)) from exc
        self._keep.append(buf)
        self.vt = self._alloc(vt_size, self.dtype, fill=np.nan if self.debug else None)
        self.seconds["upload"] += time.perf_counter() - t0

    def can_map(self, nbytes: int, chunk_bytes: int) -> bool:
        """Whether a pool of ``nbytes`` may be mapped in chunks of ``chunk_bytes``
        (:mod:`.vmm`): the driver's entry points load, the chunk is a multiple
        of the device's granularity, and the pool's host copy fits the pinned
        cap (a mapped pool goes to the host during its stage)."""
        try:
            g = vmm.granularity(self.device_id)
        except Exception:  # noqa: BLE001 - no virtual memory management: not mapped
            return False
        return (not self.debug and g > 0 and int(chunk_bytes) % g == 0
                and self.pinned_pools + int(nbytes) <= pinned_pool_cap())

    def begin_stage(self, st, s_index, s_value, carried, pool_map=None):
        """The stage's pool (zeroed), its carried blocks, S entries and records'
        buffer. ``pool_map``: the pool is an address range mapped chunk by chunk
        (:class:`~.vmm.MappedRange`; :meth:`map_chunks` zeroes each chunk it
        maps), no carried blocks."""
        cp = self.cp
        t0 = time.perf_counter()
        stream = self.stream
        rng = None
        if pool_map is None:
            pool = self._alloc(st.pool_size, self.dtype)
        else:
            rng = vmm.MappedRange(self.device_id, int(st.pool_size) * self.dtype.itemsize,
                                  pool_map.chunk_bytes)
            try:
                pool = rng.array(cp, st.pool_size, self.dtype)
            except Exception as exc:    # noqa: BLE001 - the plan's stages run instead
                rng.close()
                raise DeviceOutOfMemory(f"a mapped pool's array: {exc!r}") from exc
            self._ranges[id(pool)] = rng
        keep = []
        whole = bool(getattr(st, "materialized", True))
        try:
            for off, cb in carried:
                if cb.size == 0:
                    continue
                rows = cb.reshape(len(cb), -1) if cb.ndim > 1 else cb.reshape(1, -1)
                if cb.dtype == self.dtype and rows.strides[1] == rows.itemsize:
                    # rows contiguous (a fetched block's upper trapezoid, a view of
                    # pinned memory): one strided copy, no host copy of the block
                    upload_block(rows, 0, rows.shape[0], 0, rows.shape[1],
                                 pool[off: off + cb.size].reshape(rows.shape), stream)
                    keep.append(cb)
                    continue
                buf = self._pinned(cb.size, self.dtype)
                buf.reshape(cb.shape)[...] = cb     # one copy, from a strided view
                pool[off: off + cb.size].set(buf, stream=stream)
                keep.append(buf)
            sidx, b1 = self._upload(np.ascontiguousarray(s_index, dtype=np.int64))
            sval, b2 = self._upload(np.ascontiguousarray(s_value, dtype=self.dtype))
            keep += [b1, b2]
            nbytes = max(int(st.ntasks), 1) * TASK_BYTES
            # the records go up with the launches (:meth:`launch`): a materialized
            # stage's from its task list, in chunks ahead of the launches
            src = (np.ascontiguousarray(st.tasks).view(np.uint8).ravel() if whole
                   else None)
            host = self._pinned(nbytes, np.uint8)
            with stream:
                dt = cp.empty(nbytes, dtype=np.uint8)
                if self.debug:      # a record never uploaded reads as type -1: no task
                    dt.fill(0xFF)
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(str(exc)) from exc
        e0 = cp.cuda.Event()
        e0.record(stream)
        self.seconds["upload"] += time.perf_counter() - t0
        h = {"st": st, "pool": pool, "dt": dt, "host": host, "src": src, "sent": 0,
             "keep": keep, "sidx": sidx, "sval": sval, "e0": e0,
             "lp": st.launch_ptr.tolist(), "t_loop": time.perf_counter()}
        if rng is not None:
            h["range"], h["pmap"], h["flags"] = rng, pool_map, []
        return h

    def map_chunks(self, h, chunks) -> None:
        """Chunks of a mapped pool backed and zeroed on the stage's stream (before
        the launches enqueued after)."""
        rng, rt = h["range"], self.cp.cuda.runtime
        for k in chunks:
            rng.map(k)
            rt.memsetAsync(rng.address(k), 0, rng.chunk_bytes, self.stream.ptr)

    def unmap_chunks(self, h, chunks) -> None:
        """Chunks of a mapped pool given back once the device is done with them:
        each checked finite on the stage's stream (read at :meth:`end_stage`),
        then the stream and the copy stream waited for (the launches that touched
        them and the pool's copies of them were enqueued before), then unmapped."""
        cp = self.cp
        t0 = time.perf_counter()
        check = finite_check(self.dtype)
        chunks = list(chunks)
        for k in chunks:
            h["flags"].append(check.enqueue(_mapped_chunk(h, k), self.stream))
        for s_ in (self.stream, self.copy_stream):
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(s_)
            ev.synchronize()
        for k in chunks:
            h["range"].unmap(k)
        self.seconds["unmap_wait"] = self.seconds.get("unmap_wait", 0.0) + (
            time.perf_counter() - t0)

    def _records_up(self, h, a: int, b: int, records) -> None:
        """Records ``[a, b)`` of the stage on the device before the next launch:
        a materialized stage's (``h["src"]``) from the first not yet sent, at
        least ``record_chunk_bytes`` at a time; else the launch's own
        ``records``. Copied into the stage's pinned buffer, then uploaded on
        the stage's stream (asynchronous)."""
        dt, host, src = h["dt"], h["host"], h["src"]
        lo, hi = a * TASK_BYTES, b * TASK_BYTES
        if src is None:
            raw = np.ascontiguousarray(records).view(np.uint8).ravel()
        else:
            if hi <= h["sent"]:
                return
            lo = h["sent"]
            hi = min(len(src), max(hi, lo + self.record_chunk_bytes))
            raw = src[lo:hi]
            h["sent"] = hi
        seg = host[lo:hi]
        seg[...] = raw
        dt[lo:hi].set(seg, stream=self.stream)

    def launch(self, h, L, records) -> None:
        cp = self.cp
        stream = self.stream
        a, b = h["lp"][L], h["lp"][L + 1]
        if b <= a:
            return
        dt = h["dt"]
        self._records_up(h, a, b, records)
        if self.first_launch_at is None:
            self.first_launch_at = time.perf_counter()
        split = 1
        target = int(self.apply_split_fill * self.slots)
        if self.apply_split_max > 1 and b - a < target:
            split = apply_split(records["type"], records["c0"], records["c1"], target,
                                self.apply_split_max, self.tile)
        with stream:  # RawKernel launches on the current stream
            if self.profile:
                ea = cp.cuda.Event()
                ea.record(stream)
            self.kernel((b - a, split), (self.threads,),
                        (dt[a * TASK_BYTES:], h["pool"], self.vt, h["sidx"], h["sval"],
                         self.maps), shared_mem=self.smem)
            if self.profile:
                eb = cp.cuda.Event()
                eb.record(stream)
                self.launch_events.append((h["st"].fronts, L, b - a, ea, eb, split))
        self.launches += 1
        if self.debug:
            self._check(f"after launch {L} of stage {h['st'].fronts}")
            ok = finite_check(h["pool"].dtype)(h["pool"], stream)
            if not ok:
                raise GpuEngineError(f"non-finite values after launch {L} of stage "
                                     f"{h['st'].fronts}")

    def dense_factorize(self, h, off, fm, fn, stair):
        """Factorize a dense front of the stage in place on a side stream, after
        the launches enqueued so far (cuSOLVER panels, cuBLAS trailing updates;
        nothing synchronizes). Returns ``(front, panels, T, done event)``."""
        cp = self.cp
        pool = h["pool"]
        F = pool[off: off + fm * fn].reshape(fm, fn)
        panels = panels_of(fm, fn, stair, self.dense_panel)
        side = self.dense_streams[self._dense_k % len(self.dense_streams)]
        self._dense_k += 1
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(self.stream)
        side.wait_event(ready)
        try:
            with side:
                if self.profile:
                    ea = cp.cuda.Event()
                    ea.record(side)
                T = factorize_cupy(F, panels, self.dense_panel, stream=side)
                done = cp.cuda.Event(disable_timing=not self.profile)
                done.record(side)
                if self.profile:
                    self.dense_events.append((int(fm), int(fn), ea, done))
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceOutOfMemory(str(exc)) from exc
        if self.debug:
            try:
                side.synchronize()
            except cp.cuda.runtime.CUDARuntimeError as exc:
                raise GpuEngineError(f"CUDA error in the dense front at {off} "
                                     f"({fm}x{fn}): {exc}") from exc
        return F, panels, T, done

    def dense_join(self, h, done) -> None:
        """Later work on the stage's stream waits for a dense front."""
        self.stream.wait_event(done)

    def dense_times(self) -> list:
        """(fm, fn, seconds) of every profiled dense front."""
        cp = self.cp
        return [(m, n, cp.cuda.get_elapsed_time(a, b) / 1e3)
                for m, n, a, b in self.dense_events]

    def open_pool_copy(self, pool, final):
        """The stage's pool sent to pinned host memory in ranges as launches finish
        them (:class:`~.pool_copy.CupyPoolCopy`); None where this factorization's
        pinned pools would pass their cap or pinned memory cannot be had."""
        host = self.pinned_within_cap(pool.size, pool.dtype)
        return None if host is None else CupyPoolCopy(self, pool, host, final)

    def mark_kernels_end(self, h) -> None:
        """Record the end of the stage's kernels (kernel time excludes the copies)."""
        if "e1" not in h:
            h["e1"] = self.cp.cuda.Event()
            h["e1"].record(self.stream)

    def open_r_copy(self, pool, index, layout=None, final=None):
        """Start copying ``pool[index]`` to the host (see :mod:`.rcopy`).

        ``layout``: R's layout, whose cached pinned staging buffer is used
        (a temporary one without it or when busy)."""
        t0 = time.perf_counter()
        if layout is not None:
            staging = staging_for(layout)
        else:
            staging = PinnedStaging(int(min(SLOT_BYTES, max(len(index), 1) * 8)))
            staging.lock.acquire()
        c = CupyRCopy(self, pool, index, staging, final)
        self.seconds["open_copy"] = self.seconds.get("open_copy", 0.0) + (
            time.perf_counter() - t0)
        return c

    def end_stage(self, h):
        cp = self.cp
        stream = self.stream
        st, pool = h["st"], h["pool"]
        t1 = time.perf_counter()
        e1 = h.get("e1")
        if e1 is None:
            e1 = cp.cuda.Event()
            e1.record(stream)
        if "range" in h:            # a mapped pool: its chunks mapped now, and the others'
            flags = [finite_check(pool.dtype).enqueue(_mapped_chunk(h, k), stream)
                     for k in sorted(h["range"].handles)] + h["flags"]
        else:
            flags = [finite_check(pool.dtype).enqueue(pool, stream)]   # one launch, no temporary
        variants.prefetch_later_libraries()     # imported while this thread waits
        self._check(f"in stage {st.fronts}")
        h["keep"] = None
        h["host"] = h["src"] = None
        if any(int(f.get(stream=stream)[0]) for f in flags):
            raise GpuEngineError(f"non-finite values in the front pool of stage {st.fronts}")
        self.kernel_events.append((h["e0"], e1))
        self.seconds["kernels"] += cp.cuda.get_elapsed_time(h["e0"], e1) / 1e3
        self.seconds["launch_loop"] = self.seconds.get("launch_loop", 0.0) + (
            t1 - h["t_loop"])
        self.seconds["wait"] = self.seconds.get("wait", 0.0) + (time.perf_counter() - t1)
        return pool

    def fetch(self, pool, segments) -> np.ndarray:
        """Segments ``(start, length)`` of a device pool, gathered on the device and
        copied with one transfer into pinned host memory (concatenated)."""
        cp = self.cp
        t0 = time.perf_counter()
        total = int(sum(n for _, n in segments))
        host = self._pinned(total, self.dtype)
        if total:
            with self.stream:
                buf = cp.empty(total, dtype=self.dtype)
                p = 0
                for a, n in segments:
                    if n:
                        buf[p: p + n] = pool[a: a + n]
                        p += n
            buf.get(stream=self.stream, out=host)
            self._check("copying R rows back")
        self.seconds["download"] += time.perf_counter() - t0
        return host

    def pinned_within_cap(self, n: int, dtype):
        """``n`` elements of pinned host memory, or None where this factorization's
        pinned pools would exceed :func:`pinned_pool_cap` or the driver refuses
        (pageable memory still works, slower)."""
        nbytes = int(n) * np.dtype(dtype).itemsize
        if self.pinned_pools + nbytes > pinned_pool_cap():
            return None
        try:
            out = self._pinned(n, dtype)
        except Exception:           # noqa: BLE001 - cudaHostAlloc refused
            return None
        self.pinned_pools += nbytes
        return out

    def to_host(self, pool) -> np.ndarray:
        """The whole pool on the host, in pinned memory (a pageable copy runs at a
        fraction of the link's speed, and so would every upload of it for the
        solves) while this factorization's pinned pools stay within
        :func:`pinned_pool_cap` and pinned memory can be had; else pageable."""
        t0 = time.perf_counter()
        out = self.pinned_within_cap(pool.size, pool.dtype)
        if out is None:
            out = pool.get(stream=self.stream)
        else:
            pool.get(stream=self.stream, out=out)
            self.stream.synchronize()
        self._check("copying a front pool back")
        self.seconds["download_pool"] = self.seconds.get("download_pool", 0.0) + (
            time.perf_counter() - t0)
        return out

    def release(self, pool) -> None:
        """A stage's pool let go; a mapped one's range closed once the device and
        its copies are done with it."""
        rng = self._ranges.pop(id(pool), None)
        del pool
        if rng is not None:
            self._close_range(rng)

    def _close_range(self, rng) -> None:
        """``rng`` closed once the streams that may use it are done (a stream in
        error after a failed stage: closed anyway, the error left to the caller's
        own check)."""
        try:
            self.stream.synchronize()
            self.copy_stream.synchronize()
        except self.cp.cuda.runtime.CUDARuntimeError:
            pass
        finally:
            rng.close()

    def vt_host(self) -> np.ndarray:
        if self._vt_host is None:
            if self.vt is None:
                raise RuntimeError("the factorization was freed")
            self._vt_host = self.vt.get(stream=self.stream)
            self.stream.synchronize()
        return self._vt_host

    def close(self) -> None:
        self.vt = None
        self.maps = None
        self._keep = []
        ranges, self._ranges = list(self._ranges.values()), {}
        for rng in ranges:          # a failed attempt's mapped pool
            self._close_range(rng)
