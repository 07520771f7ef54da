"""Sparse QR over the GPUs of one host: subtrees on devices, contribution blocks peer to peer.

The device plan (:func:`scipy_gpuqr._schedule.devices.map_devices`) maps
independent subtrees of the front tree to devices by proportional mapping on
the analysis' flops (and bytes); its stages are postorder runs of one device,
so the sparse scheduler builds their task lists unchanged
(:func:`~scipy_gpuqr._schedule.sparse.build_schedule` with the plan's
stages). Each device has its own device layer (:class:`~.device.CupyDevice`
made under ``cupy.cuda.Device(i)``: its stream, uberkernel handle, maps, VT
pool and memory pool), and runs the per-stage calls of the one-GPU engine
(``begin_stage``, ``launch``, ``dense_factorize``, ``end_stage``, R's
copy). Every stage stays on its device: nothing is staged through the host.

Each device has its own host thread (its CUDA device current there, its
own CuPy handles) that enqueues its stages in postorder on its stream and
never waits for the GPU while enqueueing. A stage's carried contribution
blocks come from the end of an earlier stage: cut (upper trapezoidal,
packed) on the source device's stream by the source's thread, an event
recorded there; the target's thread waits (on the host) only until the
block is cut, then makes its stream wait for the event and copies the block
into the stage's pool, peer to peer (``cudaMemcpyPeerAsync``) between
devices, a device copy within one. The copy comes right before the launch
that packs the block into its parent
(:func:`~scipy_gpuqr._schedule.devices.defer_carried_packs` moves those
records from the stage's first launch to the last one before the parent is
read), so a device runs its own subtrees while another still factorizes the
child. R's values of a stage are copied to the host while its launches run,
each range once final, and scattered into R's ``data`` as they land; the
stage's entries are taken in the order they become final (each front's rows
of R once its columns are written for the last time,
:func:`final_launches`), not in R's CSC order, where an upper stage's
entries wait for the root. The root itself, split over the devices and joined
after the stage's last launch, is ranked by column block: its copier is told
after each of its panels (an event on the panel chain), so most of the root's
R is copied while its later panels run (:func:`late_split_front`). After every
thread ended only the singleton rows and the CSC wrapper remain.

``Q`` and the solves run on the first device of the list (the one of the
roots): the other devices' VT tiles are copied into its VT pool, and their
front pools are read where they lie (peer access) when the devices can
reach each other, else fetched to the host (uploaded level by level by the
replay, as for staged one-GPU factorizations); dense fronts factorized on
another GPU (and their ``T``) are copied to it, since their products run
through cuBLAS there. Each device sends its tiles and dense fronts as soon
as its stages ended, while the first device may still compute.

The host memory the devices' threads pin (each layer's maps, each stage's S
entries and records, each device's R staging slots, which its stages' copies
take in turn) is sized from the plan (the records bounded before the
schedule) and pinned before the threads start, in one block while the
schedule is built (:class:`~.pinned_ahead.PinnedAhead`, the blocks kept for
later calls, with the pattern's maps and S indices in them): pinning while
they enqueue stalls all of them.

Several layers may share one physical GPU (``devices=[0, 0]``): each has
its own streams, so the multi-device path runs, and is tested, on one GPU;
with :class:`~.device.NumpyDevice` layers it runs on the host (CI).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from ... import _gpu
from ..._errors import DeviceOutOfMemory
from ..._schedule.dense import DEFAULT_DENSE_FLOPS, DENSE_COLUMNS_PER_LAUNCH, dense_front_mask
from ..._schedule.dense_split import SplitModel, block_owners, split_rule
from ..._schedule import native
from ..._schedule.devices import (DevicePlan, defer_carried_packs, map_devices,
                                  mapping_seconds, remember_mapping_seconds,
                                  remember_speeds, remembered_speeds, speeds_to_map_by)
from ..._schedule.sparse import build_schedule
from ..._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE
from ..dense_front import DenseFront, panels_of
from ..host.reference import task_list_input
from ..host.simulate import one_blas_thread
from ..split_front import NumpySplit, run_split
from . import driver
from .array_ops import unit_triangle
from .device import CupyDevice, pinned_pool_cap
from .pinned_ahead import PinnedAhead, lane_bound, lane_needs, pinned_needs
from .rcopy import (MIN_CHUNK_BYTES, SLOT_BYTES, CupyRCopy, final_entries, staging_for,
                    tile_final_launches, touched)
from .rlayout import r_layout
from .split_front import CupySplit, SplitResources, enable_peers
from .stage_loop import stage_reflector_records

__all__ = ["multi_gpu_factorize", "cupy_layers", "device_count", "measured_speeds",
           "speeds_key", "interpreter_switch"]

_log = logging.getLogger("scipy_gpuqr")

#: ``cudaMemcpyDeviceToDevice``
_D2D = 3

#: Kinds of a device's enqueueing seconds (``info["devices"]``' ``enqueue_parts``): stage
#: set-up and uploads, uberkernel launches, dense (and split) fronts, contribution blocks
#: cut for later stages, the rest (blocks waited for and copied in; R's copier; the loop
#: itself).
ENQUEUE_PARTS = ("begin", "launch", "dense", "blocks_out", "other")

#: Kinds of a device thread's steps (``info["devices"]``' ``events``: kind, stage or
#: front, start and end seconds from the call's start): a stage's set-up (``begin``,
#: by stage), the wait for a carried block to be cut (``wait``, by child front), a
#: dense front enqueued on the device or split over the devices (``dense``,
#: ``split``, by front), the stage's outgoing blocks cut (``cut``, by stage), the
#: stage's whole enqueueing (``stage``, by stage).
EVENT_KINDS = ("begin", "wait", "dense", "split", "cut", "stage")

#: Bytes of each of the two pinned slots a stage's R copier moves R's values through
#: (``CupyRCopy``'s slot, and half of it the least new range a launch hands it): each
#: slot's gather, copy, wait and scatter takes the GIL back several times, and while the
#: other devices' threads enqueue, each of those waits up to an interpreter switch
#: interval, so larger slots copy more per wait. Smaller (the one-GPU engine's) where
#: the devices' budget leaves no room for them (:func:`_r_slot_bytes`).
R_SLOT_BYTES = 128 << 20

#: R entries per thread of a scatter into R's data (:meth:`_RData.put`): while a
#: device's thread still enqueues, and after. While one does, few threads: each
#: thread started, and each one's return, first takes the GIL from the enqueueing
#: threads (a slot of the one-GPU engine's size is scattered by the copier's own
#: thread); after, as many as a chunk of R's tail needs.
SCATTER_PER_THREAD = (1 << 22, 1 << 19)

#: Least seconds every device's share must take for :func:`measured_speeds` to
#: measure the devices' speeds: shorter shares are timer and launch noise (a
#: problem that small runs on one GPU under ``devices='auto'`` anyway).
SPEED_MIN_SECONDS = 0.02

#: Range of a measured relative speed (to the mean): a device that mostly waited
#: would otherwise be given almost nothing by the next mapping, and a device given
#: nothing measures nothing again.
SPEED_RANGE = (0.25, 4.0)

#: The interpreter's switch interval (seconds) while the devices' threads run
#: (:func:`multi_gpu_factorize`'s ``switch_interval``; the process' own is 5 ms
#: unless changed): a device thread that took its call's time back from a thread
#: running Python waits at most this long for the interpreter's lock.
SWITCH_INTERVAL = 2e-4


def device_count() -> int:
    """CUDA devices visible to the process (0 without CuPy or a driver)."""
    if not _gpu.gpu_info().get("available"):
        return 0
    cp = _gpu.import_cupy()
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:                           # noqa: BLE001 - no driver: no device
        return 0


def measured_speeds(qr) -> list | None:
    """Each device's relative speed on its share of a factorization, as measured.

    ``qr``: a :func:`multi_gpu_factorize` result. A device's time on its share
    is the longer of its busy seconds and its thread's enqueueing seconds (less
    the waits for other devices' blocks): a device whose host thread enqueues
    more slowly than its kernels run is bound by that thread, and every device
    has been so on the 3-D grids. Its speed is the flops it ran outside the
    split fronts over that time less the split fronts' seconds (its upper
    tree's other fronts count with its subtrees), normalized to mean 1: for
    ``device_speeds`` of a later factorization of the pattern, whose mapping
    then gives a device that was slower per flop less of the subtrees. None
    where a device ran no such flops or its time on them is below
    :data:`SPEED_MIN_SECONDS`; a speed outside :data:`SPEED_RANGE` of the mean
    is brought back to it.
    """
    info = qr.info
    per = info.get("devices", {}).get("devices")
    if not per or len(per) < 2:
        return None
    flops = np.asarray(qr.analysis.front_flops, dtype=np.float64)
    upper = int(info["devices"].get("upper_device", 0))
    work = np.array([float(d["flops"]) for d in per])
    busy = np.array([max(float(d["busy_seconds"]),
                         float(d.get("enqueue_seconds", 0.0))
                         - float(d.get("wait_blocks_seconds", 0.0))) for d in per])
    for e in info.get("split_fronts", []):
        if "fallback" in e or e.get("seconds") is None:
            continue
        work[upper] -= float(flops[int(e["front"])])
        busy[upper] -= float(e["seconds"])
    if np.any(work <= 0) or np.any(busy < SPEED_MIN_SECONDS):
        return None
    speed = work / busy
    speed = np.clip(speed / speed.mean(), *SPEED_RANGE)
    return (speed / speed.mean()).tolist()


def speeds_key(layers, dtype) -> tuple:
    """What names a device set for the speeds its factorizations measure
    (:func:`~scipy_gpuqr._schedule.devices.remembered_speeds`): each layer's
    device id and name, in order, and the dtype's size."""
    return (tuple((getattr(layer, "device_id", None), str(getattr(layer, "name", "?")))
                  for layer in layers), int(np.dtype(dtype).itemsize))


@contextlib.contextmanager
def interpreter_switch(seconds):
    """The interpreter's switch interval set to ``seconds`` (:func:`sys.setswitchinterval`)
    inside the block, and put back after it; None: left as it is.

    Why: every CUDA or cuBLAS call of a device's enqueueing thread releases
    the interpreter's lock and takes it back. If another thread then runs
    Python without releasing the lock, the returning thread waits until that
    thread's switch interval has run out (5 ms by default) before it asks for
    the lock back: one wait per call of the thread that calls the most. A
    shorter interval bounds each such wait at the cost of more switches.

    The interval is the process' own: it is put back only where nothing else
    changed it meanwhile, so two calls that overlap leave the value found by
    the first when both ended (the second one's may then run part of its time
    on the process' interval: a matter of speed, never of results).
    """
    if seconds is None:
        yield
        return
    seconds = float(seconds)
    if not seconds > 0:
        raise ValueError(f"interpreter_switch: seconds > 0 or None, got {seconds!r}")
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    mine = sys.getswitchinterval()
    try:
        yield
    finally:
        if sys.getswitchinterval() == mine:
            _set_read_interval(old)


def _set_read_interval(read: float) -> None:
    """The switch interval set back to a value :func:`sys.getswitchinterval` returned:
    the interpreter keeps whole microseconds and returns them times 1e-6, which set
    as it is can truncate to one microsecond less (each call would then shorten the
    process' interval)."""
    sys.setswitchinterval((round(read * 1e6) + 0.5) * 1e-6)


def cupy_layers(devices, *, tile: int = DEFAULT_TILE, bundle: int = DEFAULT_BUNDLE,
                dtype=np.float64, debug: bool = False, profile: bool = False) -> list:
    """One :class:`~.device.CupyDevice` per entry of ``devices`` (CUDA device ids;
    repeats give several layers on one GPU), each made under its device."""
    cp = _gpu.import_cupy()
    out = []
    for i, d in enumerate(devices):
        with cp.cuda.Device(int(d)):
            out.append(CupyDevice(tile, bundle, dtype=dtype, debug=debug, profile=profile,
                                  layer=i))
    return out


def _on(layer):
    """Context making the layer's GPU current (nothing for a NumPy layer)."""
    cp = getattr(layer, "cp", None)
    if cp is None:
        return contextlib.nullcontext()
    return cp.cuda.Device(layer.device_id)


def _available(layer) -> int | None:
    """Bytes the layer's device may use now (None: no limit known)."""
    memory = getattr(layer, "memory", None)
    if callable(memory):
        return memory().available
    cp = getattr(layer, "cp", None)
    if cp is None:
        return None
    free, _ = cp.cuda.runtime.memGetInfo()
    return int(0.85 * (free + cp.get_default_memory_pool().free_bytes()))


def _budget(layers) -> int | None:
    """The smallest budget of the layers' devices (None for NumPy layers)."""
    out = None
    for layer in layers:
        with _on(layer):
            b = _available(layer)
        if b is not None:
            out = b if out is None else min(out, b)
    return out


def _debug_default() -> bool:
    return os.environ.get("SCIPY_GPUQR_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


class _Aborted(Exception):
    """Another device's thread failed: this one stops."""


class _RData:
    """R's ``data`` as the devices' R values land in it, and how they landed.

    Parameters
    ----------
    ndev : int
        Devices (each counts its own entries and seconds).
    dtype : dtype
    made : Future, optional
        The array, zeros with its pages touched ahead (on a helper, while the
        devices run); None: :meth:`array` makes zeros of ``size()`` entries.
    size : callable, optional
        R's number of entries (for an array not made ahead).
    """

    def __init__(self, ndev: int, dtype, made=None, size=None):
        self.dtype = np.dtype(dtype)
        self.made, self._size = made, size
        self.data = None
        self._lock = threading.Lock()       # the array's making
        self._count = threading.Lock()      # the counters (several copiers per device)
        #: device threads still enqueueing (the scatters' thread count follows it)
        self.enqueueing = int(ndev)
        self.entries = [0] * ndev           # R entries each device's stages put in data
        self.at_enqueued = [None] * ndev    # of them, by the end of its enqueueing
        self.seconds = [0.0] * ndev         # scattering
        self.waited = [0.0] * ndev          # waiting for the array to be made

    def array(self) -> np.ndarray:
        """R's ``data`` (the one made ahead, waited for; else new zeros)."""
        with self._lock:
            if self.data is None:
                self.data = (self.made.result() if self.made is not None
                             else np.zeros(self._size(), dtype=self.dtype))
            return self.data

    def put(self, k, pos, first, vals) -> None:
        """Values ``first …`` of a stage of device ``k`` into R's ``data`` (at their
        positions ``pos[first:]``; ``data[first:]`` for None): as each range lands
        (a CUDA copier's worker), or all of them after the stage."""
        t0 = time.perf_counter()
        data = self.array()
        t1 = time.perf_counter()
        v = np.ascontiguousarray(vals, dtype=self.dtype)
        if pos is None:
            data[first: first + len(v)] = v
        else:
            p = pos[first: first + len(v)]
            lib = native.handle()
            if lib is not None:         # compiled, the GIL released
                per = SCATTER_PER_THREAD[0 if self.enqueueing else 1]
                threads = native.thread_count(len(v), per)
                native.scatter(lib, data, p, v, threads=threads)
            else:
                data[p] = v
        t2 = time.perf_counter()
        with self._count:
            self.entries[k] += len(v)
            self.waited[k] += t1 - t0
            self.seconds[k] += t2 - t1

    def enqueued(self, k) -> None:
        """Device ``k``'s thread has enqueued its stages."""
        with self._count:
            self.at_enqueued[k] = self.entries[k]
            self.enqueueing -= 1

    def take(self) -> np.ndarray:
        """R's ``data``, handed over (this object forgets it)."""
        data = self.array()
        self.data = None
        return data


def _r_slot_bytes(plan) -> int:
    """The R copiers' slot bytes (:data:`R_SLOT_BYTES`), or the one-GPU engine's where a
    device of the plan would pass its budget with three copiers' slots more."""
    extra = 3 * 4 * (R_SLOT_BYTES - SLOT_BYTES)     # two device and two pinned slots each
    if plan.budget is not None and int(plan.device_bytes.max()) + extra > plan.budget:
        return SLOT_BYTES
    return R_SLOT_BYTES


class _Transfers:
    """Contribution blocks cut at the end of a stage, and their copies into later stages.

    Each device's thread cuts the blocks of its stages (:meth:`put_stage`) and
    takes those its stages carry (:meth:`into`), waiting on the host until
    the source's thread cut them; :meth:`fail` wakes every waiting thread.
    """

    def __init__(self):
        self.blocks = {}            # front -> (buffer, event, source layer index)
        self.keep = []              # buffers held until the factorization ends
        self.log = []               # (child, source, target, bytes)
        self.cv = threading.Condition()
        self.failed = False

    def fail(self) -> None:
        with self.cv:
            self.failed = True
            self.cv.notify_all()

    def put_stage(self, k, layer, pool, blocks) -> None:
        """The outgoing blocks of a stage of layer ``k``, cut and handed over.

        ``blocks``: ``(front, base, cm, fn, fp)`` per block, the front's block
        ``pool[base:].reshape(cm, fn)[:, fp:]``, upper trapezoidal, packed. On a
        CUDA layer every block goes into one buffer of the stage by one
        :mod:`.array_ops` kernel each, behind one event (a buffer, a triangle's
        kernels and an event per block held the device's enqueueing thread a
        third of a millisecond a block: hundreds of blocks at a stage's end).
        """
        cp = getattr(layer, "cp", None)
        views = {}
        ev = None
        if cp is None:
            for c, base, cm, fn, fp in blocks:
                views[c] = np.triu(pool[base: base + cm * fn].reshape(cm, fn)[:, fp:]).copy()
        elif blocks:
            try:
                with layer.stream:
                    buf = cp.empty(sum(cm * (fn - fp) for _, _, cm, fn, fp in blocks),
                                   dtype=pool.dtype)
                    at = 0
                    for c, base, cm, fn, fp in blocks:
                        n = cm * (fn - fp)
                        views[c] = unit_triangle(pool[base: base + cm * fn].reshape(cm, fn)[:, fp:],
                                                 lower=False, unit=False,
                                                 out=buf[at: at + n].reshape(cm, fn - fp))
                        at += n
                    ev = cp.cuda.Event(disable_timing=True)
                    ev.record(layer.stream)
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise DeviceOutOfMemory(str(exc)) from exc
        with self.cv:
            for c, view in views.items():
                self.blocks[c] = (view, ev, k)
            self.cv.notify_all()

    def take(self, c):
        """The block of front ``c`` once cut (blocks the calling thread until then)."""
        with self.cv:
            while c not in self.blocks:
                if self.failed:
                    raise _Aborted()
                self.cv.wait()
            return self.blocks.pop(c)

    def into(self, c, k, layer, pool, off, layers):
        """Block of front ``c`` into ``pool[off:]`` on layer ``k`` (after its cut).

        Returns the events around the stream's wait and copy on a CUDA layer
        (their interval is time the device did not compute), else None.
        """
        buf, ev, src = self.take(c)
        n = int(buf.size)
        if src != k:
            self.log.append((int(c), int(src), int(k), n * buf.itemsize))
        cp = getattr(layer, "cp", None)
        if cp is None:
            pool[off: off + n] = buf.ravel()
            return None
        self.keep.append(buf)
        if n == 0:
            return None
        a = cp.cuda.Event()
        a.record(layer.stream)
        layer.stream.wait_event(ev)
        _copy_async(cp, pool.data.ptr + off * pool.itemsize, layer.device_id, buf.data.ptr,
                    layers[src].device_id, n * buf.itemsize, layer.stream)
        b = cp.cuda.Event()
        b.record(layer.stream)
        return a, b


def multi_gpu_factorize(A, analysis=None, *, devices=(0, 1), layers=None, tol=None,
                        max_gpu_memory: int | None = None, tile: int = DEFAULT_TILE,
                        bundle: int = DEFAULT_BUNDLE, pipelining: bool = True,
                        max_tasks: int | None = None, debug: bool | None = None,
                        profile: bool = False, fallback: bool = True,
                        dense_flops: float | None = DEFAULT_DENSE_FLOPS,
                        dense_columns_per_launch: int = DENSE_COLUMNS_PER_LAUNCH,
                        split_dense: bool | None = None,
                        split_model: SplitModel | None = None, device_speeds="measured",
                        r_slot_bytes: int | None = None, switch_interval="default"):
    """Sparse QR ``A[:, colperm] = Q @ R`` over several GPUs of one host.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
    analysis : SymbolicAnalysis, optional
        From :func:`~scipy_gpuqr._symbolic.analyze` (computed when None).
    devices : sequence of int or DevicePlan
        CUDA device ids (the first runs the roots and keeps ``Q``: apply
        ``Q`` and solve with it current, as with the one-GPU engine's device;
        repeats: several devices simulated on one GPU), or a plan for
        ``layers``.
    layers : list, optional
        Device layers instead of ``devices`` (e.g.
        :class:`~.device.NumpyDevice` objects: the host logic without a GPU).
    tol : None, 'default' or float
        As :func:`~.driver.gpu_factorize`.
    max_gpu_memory : int, optional
        Bytes each device may hold (default: 85 % of the free memory of the
        device with least).
    tile, bundle, pipelining, max_tasks, dense_flops, dense_columns_per_launch
        As :func:`~.driver.gpu_factorize`.
    debug : bool, optional
        Synchronize and check after every launch.
    profile : bool
        Event pairs around every launch (CUDA layers).
    fallback : bool
        When a device runs out of memory, factorize on the first device alone
        (the one-GPU engine restages) with a warning; False: raise MemoryError.
    split_dense : bool or None
        Dense fronts of the upper tree factorized over every device
        (:mod:`scipy_gpuqr._engine.split_front`): None (the default), the
        mapping weighs the upper tree's splittable fronts at their split
        time (:func:`~scipy_gpuqr._schedule.devices.map_devices`'
        ``split_model``) and those fronts, and the others where
        :func:`~scipy_gpuqr._schedule.dense_split.split_rule` models a gain,
        are split (only when the layers are on more than one GPU); True,
        every dense front of the upper tree; False, none. The rule is the
        default because without it the upper tree's large dense fronts run
        on one GPU while the others wait: on a 3-D grid the mapping then
        cannot model much past 1.4 times one GPU, on two GPUs or four.
    split_model : SplitModel, optional
        The model of that rule.
    device_speeds : 'measured', None or sequence of float
        Relative speeds of the devices on their subtrees, by which the
        mapping shares the subtrees
        (:func:`~scipy_gpuqr._schedule.devices.map_devices`' ``speeds``).
        ``'measured'`` (the default): a pattern's first call on a device set
        maps on flops alone, and later calls keep the plan of the last one
        until the speeds the earlier factorizations of the pattern on these
        devices measured
        (:func:`~scipy_gpuqr._schedule.devices.remembered_speeds`) are new and
        the time model, given them, models the plan mapped by them clearly
        shorter than the current plan
        (:func:`~scipy_gpuqr._schedule.devices.speeds_to_map_by`: at least
        :data:`~scipy_gpuqr._schedule.devices.REMAP_GAIN` and
        :data:`~scipy_gpuqr._schedule.devices.REMAP_SECONDS`): a new plan's
        first call builds its schedule and R's maps again, which speeds moved
        by the noise between calls should not cost. On flops again where the
        pattern's last call by measured speeds took longer on its devices than
        its last call on flops
        (:func:`~scipy_gpuqr._schedule.devices.measured_mapping_lost`). None:
        on flops alone; a sequence: these speeds. Every call
        that runs on several devices measures them (:func:`measured_speeds`)
        and has them remembered for the next
        (:func:`~scipy_gpuqr._schedule.devices.remember_speeds`): devices of
        one model are not equally fast on their shares (the upper tree's
        device also enqueues the upper tree), which a mapping on flops cannot
        know.
    r_slot_bytes : int, optional
        Bytes of each pinned slot R's values of a stage move through on CUDA
        layers (default :data:`R_SLOT_BYTES`, or the one-GPU engine's
        ``SLOT_BYTES`` where the plan's budget has no room for them).
    switch_interval : float, None or 'default'
        The interpreter's switch interval (seconds) while the devices' threads
        run (:func:`interpreter_switch`): each device's thread releases the
        interpreter's lock for every CUDA call and waits to take it back
        while another thread runs Python; None leaves the process' interval;
        ``'default'``: :data:`SWITCH_INTERVAL`.

    Returns
    -------
    GpuQR
        ``info["devices"]``: the plan (:meth:`~scipy_gpuqr._schedule.devices.DevicePlan.as_dict`)
        and per device its id, name, stages, launches, busy seconds (its
        stages' kernels from events, less the stream's waits for other
        devices' blocks and their copies), and its thread's seconds
        enqueueing (``enqueue_seconds``; of them ``wait_blocks_seconds``
        waiting for blocks to be cut; ``enqueue_cpu_seconds``, the CPU time of
        the enqueueing thread for it; ``enqueue_parts``, its host seconds by
        kind, :data:`ENQUEUE_PARTS`) and waiting for R's copies after its
        stages ended (``wait_r_copy_seconds``), and when, counted from the
        call's start, its thread started, had enqueued its stages and had
        scattered its R values (``timeline_seconds``) and its thread's steps
        (``events``, :data:`EVENT_KINDS`) and the bytes of its VT tiles and
        dense fronts sent to the first device after its stages, with its
        thread's seconds enqueueing them (``to_home``; None for the first
        device); ``info["seconds"]["result"]``, the seconds after R (Q's
        parts gathered, ``info`` made); ``info["switch_interval"]``, the
        interpreter's switch interval the devices' threads ran under (None:
        the process' own);
        ``info["devices"]["mapping"]``: what the subtrees were shared by
        (``by``: ``'flops'``, ``'measured speeds'`` of earlier calls,
        ``'given speeds'`` or ``'given plan'``; ``speeds``, those the plan was
        made with; ``measured``, this call's; ``remembered``, the measured
        speeds kept, which the next call of the pattern on these devices
        weighs; ``decision``, by measured speeds where new remembered speeds
        were weighed, whether the plan was kept and why: the speeds weighed,
        both plans' modelled seconds given them,
        :func:`~scipy_gpuqr._schedule.devices.speeds_to_map_by`);
        ``info["transfers"]``: every contribution block moved between
        devices ``(child, source, target, bytes)``; ``info["split_fronts"]``:
        per dense front factorized over the devices its front, shape, blocks
        per device, modelled and (CUDA) measured seconds, and per device its
        enqueueing thread's seconds on the front and, of them, waiting for the
        other devices' threads (``enqueue_seconds``), and (CUDA) the main
        device's thread's seconds on it by part (``host_seconds``: before the
        split's ``ready`` event, recording it, the split's preparation, its
        steps; ``before_parts``: of the first, the blocks' owners, the split
        workers, peer access, and the thread's CPU seconds, and before it all
        the seconds making R's copier and ``on_panel``); a front chosen but
        factorized on its device alone has a ``"fallback"`` saying why;
        ``info["pinned_ahead"]``: the pinned host memory made ready before the
        devices' threads started (:meth:`PinnedAhead.info`: bytes, of them
        pinned by this call, seconds, and the pinned allocations still made
        while they ran, ``during_run``; None where no layer pins).
    """
    t_start = time.perf_counter()
    Ac, analysis, out = task_list_input(A, analysis, tol, max_gpu_memory, "gpu",
                                        "multi_gpu_factorize")
    if out is not None:
        return out
    debug = _debug_default() if debug is None else bool(debug)
    if isinstance(switch_interval, str) and switch_interval == "default":
        switch_interval = SWITCH_INTERVAL
    if switch_interval is not None and not float(switch_interval) > 0:
        raise ValueError(f"switch_interval: seconds > 0, None or 'default', "
                         f"got {switch_interval!r}")
    dtype = np.float32 if Ac.dtype == np.float32 else np.float64
    given_plan = devices if isinstance(devices, DevicePlan) else None
    one_gpu = dict(tile=tile, bundle=bundle, pipelining=pipelining, max_tasks=max_tasks,
                   debug=debug, dense_flops=dense_flops,
                   dense_columns_per_launch=dense_columns_per_launch)
    if layers is None:
        if not _gpu.gpu_info().get("available"):     # the one-GPU engine's fallback, warned
            return driver.gpu_factorize(Ac, analysis, **one_gpu)
        ids = [int(d) for d in devices]
        layers = cupy_layers(ids, tile=tile, bundle=bundle, dtype=dtype, debug=debug,
                             profile=profile)
    budget = max_gpu_memory if max_gpu_memory is not None else _budget(layers)
    model = split_model if split_model is not None else SplitModel()
    ruled = split_dense is None and len(_gpus(layers)) > 1
    key = speeds_key(layers, dtype)
    decision = None
    if given_plan is not None:
        speeds, by = None, "given plan"
    else:
        speeds, by, decision = _speeds_for(device_speeds, analysis, key, len(layers),
                                           budget, model if ruled else None)
    plan = given_plan or map_devices(analysis, len(layers), device_memory=budget,
                                     split_model=model if ruled else None,
                                     speeds=speeds)
    if plan.ndevices != len(layers):
        raise ValueError(f"a plan of {plan.ndevices} devices for {len(layers)} layers")
    if not plan.fits:
        _log.info("multi-GPU plan exceeds %s bytes on a device: %s", budget,
                  plan.device_bytes.tolist())
    try:
        out = _run(Ac, analysis, plan, layers, tile=tile, bundle=bundle,
                   pipelining=pipelining, max_tasks=max_tasks, dense_flops=dense_flops,
                   dense_cpl=dense_columns_per_launch, dtype=dtype, t_start=t_start,
                   split_dense=split_dense, split_model=model, r_slot_bytes=r_slot_bytes,
                   switch=switch_interval)
    except DeviceOutOfMemory as exc:
        for layer in layers:
            with _on(layer):
                layer.close()
                cp = getattr(layer, "cp", None)
                if cp is not None:
                    cp.get_default_memory_pool().free_all_blocks()
        msg = f"a device ran out of memory across {len(layers)} devices ({exc})"
        if not fallback:
            raise MemoryError(msg) from exc
        warnings.warn(msg + "; factorizing on the first device alone", RuntimeWarning,
                      stacklevel=2)
        with _on(layers[0]):         # its layer again (a fresh start), staged as it needs
            out = driver.gpu_factorize(Ac, analysis, device=layers[0], **one_gpu)
        out.info["multi_device_fallback"] = msg
        return out
    out.info["budget"] = budget
    out.info["switch_interval"] = switch_interval
    measured = measured_speeds(out)
    span = devices_seconds(out.info)
    if span is not None and by in ("flops", "measured speeds"):
        remember_mapping_seconds(analysis, key, by, span)
    out.info["devices"]["mapping"] = {
        "by": by, "speeds": None if speeds is None else [float(x) for x in speeds],
        "measured": measured,
        "remembered": (list(remember_speeds(analysis, key, measured)) if measured
                       else _as_list(remembered_speeds(analysis, key))),
        "decision": decision,
        "seconds": mapping_seconds(analysis, key)}
    return out


def devices_seconds(info) -> float | None:
    """The devices' part of a :func:`multi_gpu_factorize` call: from the first
    device thread's start to the last one's R values scattered
    (``timeline_seconds``), so without the building of a new mapping's schedule
    and layout before the threads start; None where the call has no timeline."""
    per = (info.get("devices") or {}).get("devices") or []
    lines = [d.get("timeline_seconds") for d in per]
    if len(lines) < 2 or any(not t or len(t) < 3 for t in lines):
        return None
    return float(max(t[2] for t in lines) - min(t[0] for t in lines))


def _as_list(speeds):
    return None if speeds is None else list(speeds)


def _speeds_for(device_speeds, analysis, key, ndev, budget=None, split_model=None) -> tuple:
    """The speeds a call maps by, what they are (``info["devices"]["mapping"]["by"]``)
    and, by measured speeds, the decision to keep or leave the current plan
    (:func:`~scipy_gpuqr._schedule.devices.speeds_to_map_by`)."""
    if device_speeds is None:
        return None, "flops", None
    if isinstance(device_speeds, str):
        if device_speeds != "measured":
            raise ValueError(f"device_speeds: 'measured', None or {ndev} speeds, "
                             f"got {device_speeds!r}")
        speeds, decision = speeds_to_map_by(analysis, key, ndev, device_memory=budget,
                                            split_model=split_model)
        if decision is not None:            # the kept one stays as it was, whatever info meets
            decision = {k: list(v) if isinstance(v, list) else v for k, v in decision.items()}
        return speeds, ("flops" if speeds is None else "measured speeds"), decision
    return tuple(float(x) for x in device_speeds), "given speeds", None


def _run(Ac, analysis, plan, layers, *, tile, bundle, pipelining, max_tasks, dense_flops,
         dense_cpl, dtype, t_start, split_dense=None, split_model=None,
         r_slot_bytes=None, switch=None):
    t0 = time.perf_counter()
    r_slot = int(r_slot_bytes) if r_slot_bytes is not None else _r_slot_bytes(plan)
    # the plan's split fronts are dense fronts whatever dense_flops chose (split
    # or not: split_dense=False with the same plan gives the same fronts)
    extra = sorted(plan.split) if dense_flops is not None else None
    # the pinned memory the devices' threads use, its shared part (with room for
    # the lanes) pinned (or lent) and filled on a worker while the schedule is
    # built (:class:`PinnedAhead`)
    ahead = None                        # no layer takes pinned memory ahead
    if any(hasattr(x, "pinned_ahead") for x in layers):
        pinner = ThreadPoolExecutor(max_workers=1)
        tun = {"tile": tile, "bundle": bundle, "pipelining": pipelining,
               "dense_flops": dense_flops, "extra": extra}
        try:
            ahead = pinner.submit(_pin_shared, Ac, analysis, plan, layers,
                                  layers[0].dtype, r_slot, tun)
        finally:
            pinner.shutdown(wait=False)
    try:
        sched = build_schedule(analysis, tile=tile, bundle=bundle, pipelining=pipelining,
                               max_tasks=max_tasks, plan=plan.stage_plan(),
                               dense_flops=dense_flops, dense_columns_per_launch=dense_cpl,
                               dense_extra=extra)
        model = split_model if split_model is not None else SplitModel()
        split = split_choice(analysis, plan, sched, layers, split_dense, model)
    except BaseException:
        if ahead is not None:
            _release_ahead(ahead.result(), layers, ok=True)
        raise
    t1 = time.perf_counter()
    ahead, pin_wait = _pin_lanes(ahead, plan, sched, layers)
    helper = ThreadPoolExecutor(max_workers=1)
    # the CUDA layers' R copy slots for this run (restored after: a fallback to one
    # GPU on the first layer copies as the one-GPU engine does)
    cuda = [x for x in layers if getattr(x, "cp", None) is not None]
    saved = [(getattr(x, "r_copy_slot_bytes", SLOT_BYTES),
              getattr(x, "r_copy_min_chunk_bytes", MIN_CHUNK_BYTES)) for x in cuda]
    ok = False
    try:
        # the split fronts' panel widths (as _split_front takes them): a late one's R
        # is copied by its panels
        nb = int(getattr(layers[0], "dense_panel", model.dense.panel))
        host_side = helper.submit(_host_side, analysis, sched, dict.fromkeys(split, nb))
        # then, while the devices run: the array R's values land in, its pages
        # touched (scattered into fresh pages, each write would fault its page
        # in), and a fresh copy of R's pattern (read by R's assembly only)
        data = helper.submit(lambda: touched(host_side.result()[0].nnz, dtype))
        pattern = helper.submit(lambda: host_side.result()[0].pattern_copy())
        run = _MultiStageRun(Ac, analysis, plan, layers, sched, host_side, dtype,
                             ahead=ahead)
        run.r = _RData(len(layers), dtype, data)
        run.r_slot = r_slot
        for x in cuda:
            x.r_copy_slot_bytes, x.r_copy_min_chunk_bytes = run.r_slot, run.r_slot // 2
        run.t_call = t_start
        run.split, run.split_model, run.panel_nb = split, model, nb
        for k, x in enumerate(layers):      # each layer's lane, while its thread runs
            if hasattr(x, "pinned_ahead"):
                x.pinned_ahead = None if ahead is None else ahead.lane(k)
        t_devices = time.perf_counter()
        try:
            with interpreter_switch(switch):
                run.run_devices()
        finally:
            for x in layers:
                if hasattr(x, "pinned_ahead"):
                    x.pinned_ahead = None
        t2 = time.perf_counter()
        layout = host_side.result()[0]
        pattern = pattern.result()
        ok = True
    finally:
        helper.shutdown(wait=True)
        for x, (slot, chunk) in zip(cuda, saved):
            x.r_copy_slot_bytes, x.r_copy_min_chunk_bytes = slot, chunk
        pinned = None if ahead is None else ahead.info()
        _release_ahead(ahead, layers, ok)
    R = run.finish_r(Ac, layout, pattern)
    t3 = time.perf_counter()
    out = run.result(Ac, layout, R, seconds={
        "schedule": t1 - t0, "enqueue": max(run.t_enqueue, default=0.0),
        "factorize": t2 - t1, "assemble_R": t3 - t2, "total": t3 - t_start,
        # from the call's start until the devices' enqueueing began (their layers
        # started: maps uploaded, VT pools allocated)
        "devices_start": t_devices - t_start,
        # waiting after the schedule for the pinned memory's shared part
        "pin_wait": pin_wait,
        "wait_blocks": max(run.t_wait_blocks, default=0.0)})
    out.info["pinned_ahead"] = pinned
    # after R: Q's parts gathered on the home layer, ``info`` made
    out.info["seconds"]["result"] = time.perf_counter() - t3
    return out


def _pin_shared(Ac, analysis, plan, layers, dtype, r_slot, tun=None):
    """:class:`PinnedAhead` with its shared part (the maps and S entries, filled;
    the R stagings; room for the lanes, :func:`lane_bound` by the schedule's
    tunables ``tun``) made; None where no layer takes pinned memory ahead, or
    where the shared part alone passes :func:`~.device.pinned_pool_cap` or
    cannot be pinned (the layers then pin as they go)."""
    needs = pinned_needs(analysis, plan, layers, dtype, r_slot)
    if not needs["shared"]:
        return None
    fs = analysis.fronts
    ahead = PinnedAhead(needs, fronts=fs)
    cap = pinned_pool_cap()
    if ahead.shared_bytes + ahead.staging_bytes > cap:
        return None
    if tun is not None:
        dense = dense_front_mask(analysis, tun["dense_flops"])
        if tun["extra"]:
            dense = dense.copy()
            dense[list(tun["extra"])] = True
        room = sum(lane_bound(analysis, plan, layers, tile=tun["tile"],
                              bundle=tun["bundle"], pipelining=tun["pipelining"],
                              dense=dense))
        if ahead.shared_bytes + ahead.staging_bytes + room <= cap:
            needs["lane_room"] = room
    nr = len(fs.rimap)

    def fill(name, out):
        if name == "maps":
            out[:nr] = fs.rimap
            out[nr:] = fs.rjmap
        elif name == "s_index":
            out[...] = fs.s_index
        elif out.dtype == Ac.data.dtype:
            # straight into the pinned block (unbuffered: the indices are valid)
            np.take(Ac.data, fs.s_nz, out=out, mode="clip")
        else:
            out[...] = Ac.data[fs.s_nz]
    try:
        ahead.make_shared(fill)
    except Exception:                   # noqa: BLE001 - cudaHostAlloc refused: pin as we go
        ahead.drop()
        return None
    return ahead


def _pin_lanes(pending, plan, sched, layers):
    """``(ahead, seconds waited)``: the shared part waited for, the layers' lanes
    pinned (or lent; without memory where all of it would pass
    :func:`~.device.pinned_pool_cap`: each request is then pinned and counted)."""
    if pending is None:
        return None, 0.0
    t0 = time.perf_counter()
    ahead = pending.result()
    waited = time.perf_counter() - t0
    if ahead is not None:
        sizes = lane_needs(plan, sched, layers)
        fits = (ahead.shared_bytes + ahead.staging_bytes + sum(sizes)) <= pinned_pool_cap()
        try:
            ahead.make_lanes(sizes, pin=fits)
        except Exception:               # noqa: BLE001 - cudaHostAlloc refused
            ahead.make_lanes(sizes, pin=False)
    return ahead, waited


def _release_ahead(ahead, layers, ok: bool) -> None:
    """The pinned blocks back to the kept ones once no device reads or writes
    them (the layers' streams waited for); let go of where that cannot be
    known (a device failed)."""
    if ahead is None:
        return
    try:
        for layer in layers:
            cp = getattr(layer, "cp", None)
            if cp is not None:
                with _on(layer):
                    layer.stream.synchronize()
                    layer.copy_stream.synchronize()
    except Exception:                   # noqa: BLE001 - a failed device: never lend again
        ok = False
    if ok:
        ahead.give_back()
    else:
        ahead.drop()


def _gpus(layers) -> set:
    """The distinct devices of the layers (NumPy layers count as distinct)."""
    return {getattr(layer, "device_id", ("host", k)) for k, layer in enumerate(layers)}


def split_choice(analysis, plan, sched, layers, split_dense, model) -> dict:
    """The dense fronts of the upper tree factorized over every layer: front ->
    :class:`~scipy_gpuqr._schedule.dense_split.SplitPlan` (None: chosen by
    ``split_dense=True``, no model consulted).

    By the rule (``split_dense=None``, layers on more than one GPU): the plan's
    split fronts (:attr:`~scipy_gpuqr._schedule.devices.DevicePlan.split`,
    mapped knowing they split), and the upper tree's other dense fronts where
    :func:`~scipy_gpuqr._schedule.dense_split.split_rule` models a gain.
    """
    if split_dense is False or len(layers) < 2:
        return {}
    dense = sorted(f for st in sched.stages for f in st.dense)
    cand = [f for f in dense if plan.upper[f] and plan.owner[f] == plan.upper_device]
    if split_dense:
        return {f: None for f in cand}
    if len(_gpus(layers)) < 2:      # layers on one GPU: nothing to gain
        return {}
    out = {f: plan.split[f] for f in cand if f in plan.split}
    isz = int(np.dtype(layers[0].dtype).itemsize)
    out.update(split_rule(analysis.fronts, [f for f in cand if f not in out], len(layers),
                          model, itemsize=isz))
    return out


def _host_side(analysis, sched, split_nb=None):
    """R's layout and its gather maps for the stages (on the helper: the stages'
    R copies start once they are there): per stage ``(pos, index, final)``.

    Each stage's entries are taken in the order they become final
    (:meth:`~.rlayout.RLayout.stage_maps_by`, ranked by :func:`final_launches`):
    the R copier moves a prefix of them after each launch, and in R's CSC
    order an upper stage's entries are final only after its last launch
    (every column of the root's holds rows of each front below it), so all of
    them would be copied after the devices ended. ``final[L]``: the stage's
    first entries final after launch ``L``; None where the layout has no column
    segments (:meth:`~.rlayout.RLayout.segments_from`: rows of R not in front
    order), whose maps are in CSC order (:func:`~.rcopy.final_entries` then).

    ``split_nb``: the fronts split over the devices, each with its panel width
    (front -> columns). A stage whose only front joined after its last launch
    is one of them, factorized after that launch (:func:`late_split_front`),
    has its entries ranked by that front's column blocks too, and ``final``
    has one more entry per block: ``final[nlaunch + p]``, the stage's first
    entries final once the front's panel ``p`` is factorized (its block's
    columns are written for the last time then), so that the root's R is
    copied while its later panels run, not after them all.
    """
    split_nb = {int(f): int(nb) for f, nb in (split_nb or {}).items()}
    lay = r_layout(analysis)
    stages = sched.stages
    # the stages as scheduled name the maps (their carried packs' deferral follows
    # from them); ranked, once per schedule, as enqueued
    name = ("final launch", int(sched.tile), int(sched.bundle), bool(sched.pipelining),
            sched.dense_flops, tuple((int(st.nlaunch), int(st.ntasks),
                                      hash(np.asarray(st.launch_ptr).tobytes()),
                                      tuple(sorted(st.dense.items())))
                                     for st in stages), tuple(sorted(split_nb.items())))
    fronts = [st.fronts for st in stages]
    ordered = None
    if len(stages) > 1 and lay.segments_from(analysis):
        rank = final_launches(analysis.fronts, stages, int(sched.tile),
                              parent=analysis.fronts.parent, split_nb=split_nb)
        ordered = lay.stage_maps_by(fronts, rank, name)
    if ordered is None:
        return lay, [(pos, idx, None) for pos, idx in lay.stage_maps(fronts)]
    # each stage's late split front (its stage deferred), once per layout and name
    late = (lay.extra(("late split front", name), lambda: [
        late_split_front(defer_carried_packs(st, analysis.fronts.parent)[0], split_nb)
        for st in stages]) if split_nb else [None] * len(stages))
    out = []
    for st, g, (pos, idx, count) in zip(stages, late, ordered):      # nlaunch as deferred
        nl = int(st.nlaunch)
        final = np.zeros(nl, dtype=np.int64)
        m = min(len(count), nl)
        if m:
            np.cumsum(count[:m], out=final[:m])
            final[m:] = final[m - 1]
        if g is not None and len(count) > nl:   # the late split front's blocks
            final = np.concatenate([final, np.cumsum(count)[nl:]])
        out.append((pos, idx, final))
    return lay, out


def late_split_front(st, split_nb) -> int | None:
    """The front of stage ``st`` (its carried packs deferred) whose R is copied by
    its panels (:func:`_host_side`): the stage's only front joined after its last
    launch, split over the devices (a key of ``split_nb``) and factorized after
    that launch, so that once its panel ``p`` is factorized every other entry of
    the stage and its own columns before ``(p + 1) * nb`` are final. None where
    the stage has no such front."""
    if not split_nb:
        return None
    nl = int(st.nlaunch)
    late = [int(f) for f, j in st.dense_join.items() if int(j) >= nl]
    if len(late) != 1 or late[0] not in split_nb or int(st.dense[late[0]]) != nl - 1:
        return None
    return late[0]


def final_launches(fs, stages, tile: int, parent=None, split_nb=None):
    """``rank(i, front, column)`` for :meth:`~.rlayout.RLayout.stage_maps_by`: the
    launch of stage ``i`` after which the rows of R of ``front`` in its local
    ``column`` are final (:func:`~.rcopy.tile_final_launches`; 0 for those no
    launch writes), or ``nlaunch`` for a dense front joined after the stage's
    last launch: the copier's event of the last launch comes before those joins
    (:meth:`_MultiStageRun._stage`), so that a front joined into the last launch
    is copied while the root's factorization runs. ``stages``: the stages as
    they are enqueued (their carried blocks' packs deferred,
    :func:`~scipy_gpuqr._schedule.devices.defer_carried_packs`), or as
    scheduled with the fronts' ``parent`` given (deferred then, by ``rank``).
    ``split_nb`` (front -> panel width of the fronts split over the devices):
    the stage's :func:`late_split_front` ranks ``nlaunch + column // nb``, its
    column block (final once the block's panel is factorized)."""
    def rank(i, front, column):
        st = stages[i]
        if parent is not None:
            st = defer_carried_packs(st, parent)[0]
        nl = int(st.nlaunch)
        cellbase, last = tile_final_launches(fs, st, tile)
        for f, joined in st.dense_join.items():
            if int(joined) >= nl:
                last[cellbase[f]:cellbase[f + 1]] = nl
        out = np.maximum(last[cellbase[front] + column // tile], 0)
        g = late_split_front(st, split_nb)
        if g is not None:
            mine = np.asarray(front) == g
            out[mine] = nl + np.asarray(column)[mine] // int(split_nb[g])
        return out
    return rank


def _to_home(arr, home):
    """``arr`` (a CuPy array) on the home layer's device: itself, or a peer copy."""
    cp = home.cp
    src = arr.data.device_id
    if src == home.device_id:
        return arr
    with cp.cuda.Device(src):
        arr = cp.ascontiguousarray(arr)
        cp.cuda.Device(src).synchronize()
    with cp.cuda.Device(home.device_id):
        out = cp.empty(arr.shape, dtype=arr.dtype)
        cp.cuda.runtime.memcpyPeer(out.data.ptr, home.device_id, arr.data.ptr, src,
                                   arr.nbytes)
    _settle(cp, (src, home.device_id))
    return out


def _settle(cp, device_ids) -> None:
    """Wait for the copies issued on the legacy default stream of these devices.

    ``cudaMemcpy``/``cudaMemcpyPeer`` between device buffers may return before
    the copy is done, and the layers' streams are non-blocking (not ordered
    after the default stream): work enqueued on them later must not read the
    destination before this returns.
    """
    for d in dict.fromkeys(int(i) for i in device_ids):
        with cp.cuda.Device(d):
            cp.cuda.Device(d).synchronize()


def _copy_async(cp, dst, dst_id, src, src_id, nbytes, stream) -> None:
    """``nbytes`` from device ``src_id``'s ``src`` to device ``dst_id``'s ``dst`` on
    ``stream``: peer to peer, or within one device."""
    if dst_id == src_id:
        cp.cuda.runtime.memcpyAsync(dst, src, nbytes, _D2D, stream.ptr)
    else:
        cp.cuda.runtime.memcpyPeerAsync(dst, dst_id, src, src_id, nbytes, stream.ptr)


class _MultiStageRun:
    """The stages of one factorization on their devices, and what they leave for R and Q."""

    def __init__(self, Ac, analysis, plan, layers, sched, host_side, dtype, ahead=None):
        fs = analysis.fronts
        self.analysis, self.fs, self.plan, self.layers, self.sched = (analysis, fs, plan,
                                                                     layers, sched)
        self.host_side, self.dtype = host_side, dtype
        #: the call's pinned memory allocated ahead (:class:`PinnedAhead`; None: none)
        self.ahead = ahead
        #: GPU → the VT pool of a layer whose stage pools stay on it (``_gather_q``)
        self.lane_vt = {}
        if ahead is not None and ahead.shared:      # pinned and filled ahead
            self.vals = ahead.shared["s_value"]
            self.s_index = ahead.shared["s_index"]
            #: every layer's maps (uploaded as its enqueueing starts)
            self.maps = ahead.shared["maps"]
        else:
            self.vals = Ac.data.astype(layers[0].dtype)[fs.s_nz]
            self.s_index = fs.s_index
            self.maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
        self.xfer = _Transfers()
        self.pools = {}
        self.dense_parts = {}
        self.launch_base = np.concatenate(
            ([0], np.cumsum([st.nlaunch for st in sched.stages]))).astype(np.int64)
        nd = len(layers)
        self.busy = [0.0] * nd
        self.launches = [0] * nd
        self.t_enqueue = [0.0] * nd         # each thread: enqueueing its stages
        self.t_wait_blocks = [0.0] * nd     # of that, waiting for other devices' blocks
        self.t_wait_r = [0.0] * nd          # each thread: R's copies after its stages ended
        self.cpu_enqueue = [0.0] * nd       # CPU seconds of the enqueueing thread for each
        #: host seconds of each device's enqueueing by kind
        self.enqueue_parts = [dict.fromkeys(ENQUEUE_PARTS, 0.0) for _ in range(nd)]
        self.t_call = None                  # perf_counter at the call's start
        self.timeline = [None] * nd         # each thread: start, stages enqueued, end
        #: each thread's steps, (kind, stage or front, start, end) in perf_counter
        #: seconds (from the call's start in ``info``): :data:`EVENT_KINDS`
        self.events = [[] for _ in range(nd)]
        self.progressive = 0                # stages whose R copy started during the launches
        #: R's values as they land (:class:`_RData`; the array made ahead by ``_run``)
        self.r = _RData(nd, dtype, size=lambda: self.host_side.result()[0].nnz)
        #: the CUDA copiers' slot bytes
        self.r_slot = _r_slot_bytes(plan)
        self.split, self.split_model = {}, SplitModel()
        #: the panel width R's ranks cut the late split fronts by (:func:`_host_side`)
        self.panel_nb = None
        self.split_log = []                 # per split front: what ran, its backend
        self._peers = None                  # peer access between every pair of layers (None: not asked)
        #: main layer -> the streams, handles and buffers its split fronts share (made
        #: by its thread at its first split front; closed by split_info)
        self.split_res = {}
        #: layer -> the thread that enqueues its share of split fronts (made at the
        #: first split front; ended with the devices' threads)
        self.split_workers = {}
        self._workers_lock = threading.Lock()
        #: the home layer's VT pool allocated (a CUDA event on its stream after its
        #: start; None: a NumPy home layer, or its start failed), and set once it is
        #: known (:meth:`_home_started`, or the home thread's failure)
        self.home_ready = None
        self.home_known = threading.Event()
        #: per device whose VT tiles and dense fronts went to the home layer once its
        #: stages ended (:meth:`_send_home`): the event after those copies, bytes, and
        #: its thread's seconds enqueueing them
        self.sent_home = {}
        #: dense front -> (F, T) on the home layer, copied by :meth:`_send_home`
        self.home_dense = {}
        self.fkey = (tuple(tuple(int(x) for x in st.fronts) for st in sched.stages),
                     int(sched.tile), int(sched.bundle), bool(sched.pipelining),
                     int(sched.ntasks), sched.dense_flops)

    def layer_of(self, sid):
        k = int(self.plan.stage_device[sid])
        return k, self.layers[k]

    # -- the devices' enqueueing -------------------------------------------------------
    def run_devices(self) -> None:
        """Every device's stages enqueued, waited for and their R values scattered;
        returns when all ended.

        Each device on its own host thread (the upper tree's device on the
        calling thread: its cuBLAS and cuSOLVER handles, which the upper
        tree's dense fronts use most, are made once per thread and kept),
        which enqueues its stages, then waits for them and scatters their R
        values. A failure on one device stops the others (at their next wait
        for a block, or after their stages) and is raised here.
        """
        nd = len(self.layers)
        errors = [None] * nd
        host = all(getattr(layer, "cp", None) is None for layer in self.layers)
        # host layers (NumPy) run their dense fronts under one BLAS thread; the
        # limit is set once for all of them here, since changing OpenBLAS's
        # thread count while another thread is inside it corrupts that call's
        # results (seen: a dense front's T, so Q differed and R did not)
        try:
            with one_blas_thread() if host else contextlib.nullcontext():
                self._threads(errors)
        finally:
            for ex in self.split_workers.values():
                ex.shutdown(wait=True)
            self.split_workers = {}
        self.xfer.keep = []
        real = [e for e in errors if e is not None and not isinstance(e, _Aborted)]
        if real:
            oom = [e for e in real if isinstance(e, DeviceOutOfMemory)]
            raise (oom or real)[0]

    def _upper_device(self) -> int:
        """The layer running the upper tree (the plan's, or the first where the
        plan names none of these layers)."""
        up = int(self.plan.upper_device)
        return up if 0 <= up < len(self.layers) else 0

    def _threads(self, errors) -> None:
        """A host thread per device: enqueue its stages, then wait for them."""
        nd = len(self.layers)

        def one(k):
            try:
                t0, c0 = time.perf_counter(), time.thread_time()
                with _on(self.layers[k]):
                    self.layers[k].start(self.maps, self.sched.vt_size)
                    if k == 0:
                        self._home_started()
                    opened = self._enqueue(k)
                self.r.enqueued(k)
                self.t_enqueue[k] = time.perf_counter() - t0
                self.cpu_enqueue[k] = time.thread_time() - c0
                self._finish(k, opened, t0)
            except BaseException as exc:    # noqa: BLE001 - raised below, after the join
                errors[k] = exc
                self.xfer.fail()
                if k == 0:                  # no VT pool to send to (if not started)
                    self.home_known.set()

        here = self._upper_device()
        threads = [threading.Thread(target=one, args=(k,), name=f"gpuqr-device-{k}",
                                    daemon=True) for k in range(nd) if k != here]
        for t in threads:
            t.start()
        one(here)
        for t in threads:
            t.join()

    def _enqueue(self, k):
        """Device ``k``'s stages enqueued in its order (:meth:`DevicePlan.device_stages`)
        with the device current; returns the open stages."""
        layer = self.layers[k]
        opened = []
        try:
            for sid in self.plan.device_stages(k):
                item = self._stage(sid, self.sched.stages[sid], k, layer)
                opened.append(item)
        except BaseException:
            for item in opened:
                item[2].abort()
            raise
        return opened

    def _finish(self, k, opened, t0) -> None:
        """Device ``k``'s stages, enqueued, each waited for and checked, its R
        values scattered into R's data. Makes the device current itself: the
        calling thread may have another device current."""
        layer = self.layers[k]
        t1 = t0 + self.t_enqueue[k]
        try:
            with _on(layer):
                while opened:
                    sid, h, copier, pos, idle = opened[0]
                    before = layer.seconds.get("kernels", 0.0)
                    self.pools[sid] = layer.end_stage(h)
                    busy = layer.seconds.get("kernels", 0.0) - before
                    for a, b in idle:       # waits for other devices' blocks, and the copies
                        busy -= layer.cp.cuda.get_elapsed_time(a, b) / 1e3
                    self.busy[k] += max(busy, 0.0)
                    tw = time.perf_counter()
                    vals = copier.result()
                    opened.pop(0)
                    if pos is not None or len(vals):     # else scattered as it landed
                        self.r.put(k, pos, 0, vals)
                    self.t_wait_r[k] += time.perf_counter() - tw
                self._send_home(k)
        except BaseException:
            for item in opened:
                item[2].abort()
            raise
        base = t0 if self.t_call is None else self.t_call
        self.timeline[k] = (t0 - base, t1 - base, time.perf_counter() - base)

    def _home_started(self) -> None:
        """The home layer (the first: Q's) has its VT pool: an event on its stream
        after it, which the other devices' copies into it wait for (CUDA)."""
        home = self.layers[0]
        cp = getattr(home, "cp", None)
        if cp is not None:
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(home.stream)
            self.home_ready = ev
        self.home_known.set()

    def _send_home(self, k) -> None:
        """Device ``k``'s VT tiles and dense fronts (and their ``T``) copied to the
        home layer on ``k``'s stream once its stages ended, with its device current.

        ``Q`` runs on the home layer: :meth:`_gather_q` and :meth:`result` copied
        them after every device ended, so each call ended with these copies
        (grid 64^3 on two GPUs: 2 GB of VT tiles and a 2.5 GB dense front); a
        device that ended earlier sends them while the home device still
        computes. Waits for the home layer's start where it has not started yet
        (a small problem's device may end first). Nothing on NumPy layers, where
        the home layer failed to start, or where the home device has no room now
        (:meth:`result` then copies them as before).
        """
        home, layer = self.layers[0], self.layers[k]
        cp = getattr(layer, "cp", None)
        if k == 0 or cp is None or getattr(home, "cp", None) is None:
            return
        self.home_known.wait()
        if self.home_ready is None:
            return
        t0 = time.perf_counter()
        sched = self.sched
        lo = np.asarray(sched.vt_base, dtype=np.int64)
        hi = np.append(lo[1:], sched.vt_size)
        stream = layer.stream
        stream.wait_event(self.home_ready)
        isz = home.vt.itemsize
        sent, dense = 0, {}
        try:
            for sid in self.plan.device_stages(k):
                st = sched.stages[sid]
                a, b = int(lo[st.fronts[0]]), int(hi[st.fronts[1]])
                if b > a:
                    _copy_async(cp, home.vt.data.ptr + a * isz, home.device_id,
                                layer.vt.data.ptr + a * isz, layer.device_id, (b - a) * isz,
                                stream)
                    sent += (b - a) * isz
                for f in st.dense:
                    part = self.dense_parts.get(f)
                    if part is None or part[0] != sid:
                        continue
                    _, Fv, _, T = part
                    with stream:
                        Fv, T = cp.ascontiguousarray(Fv), cp.ascontiguousarray(T)
                    with cp.cuda.Device(home.device_id):
                        dense[f] = (cp.empty(Fv.shape, dtype=Fv.dtype),
                                    cp.empty(T.shape, dtype=T.dtype))
                    for dst, src in zip(dense[f], (Fv, T)):
                        _copy_async(cp, dst.data.ptr, home.device_id, src.data.ptr,
                                    layer.device_id, src.nbytes, stream)
                        sent += src.nbytes
        except cp.cuda.memory.OutOfMemoryError:
            # the home device is full for now: the dense fronts wait for the call's end
            dense = {}
        done = cp.cuda.Event(disable_timing=True)
        done.record(stream)
        self.home_dense.update(dense)
        self.sent_home[k] = {"event": done, "bytes": sent,
                             "seconds": time.perf_counter() - t0}

    def _copier(self, sid, st, k, layer, h):
        """R's copier of device ``k``'s stage, progressive (``final`` per launch):
        (copier, pos).

        On a CUDA layer the copier scatters each range into R's ``data`` as it
        lands (:meth:`_RData.put`; ``pos`` None then, nothing left to scatter
        after the stage): scattered after the stage, a large stage's values and
        positions (16 bytes per entry of R) would be read again while every
        device waits. Its slots are :attr:`r_slot` bytes (the layer's
        ``r_copy_slot_bytes``, set for the run by ``_run``). The stage's entries
        come in the order they become final where :func:`_host_side` could
        order them, else in R's CSC order.
        """
        layout, gmaps = self.host_side.result()
        pos, gidx, final = gmaps[sid]
        key = ("multi_device_final", self.fkey, int(sid), int(st.nlaunch), int(st.ntasks),
               hash(np.asarray(st.launch_ptr).tobytes()))

        def _final(st=st, lay=layout, pos=pos):
            if final is not None:
                return final

            def make():
                g = final_entries(self.analysis, lay, st, int(self.sched.tile))
                g = g if pos is None else np.searchsorted(pos, g).astype(np.int64)
                if any(int(j) >= st.nlaunch for j in st.dense_join.values()):
                    # the last launch's event precedes those joins: the rest at the end
                    g[-1] = g[-2] if len(g) > 1 else 0
                return g
            return lay.extra(key, make)
        if getattr(layer, "cp", None) is None:
            return layer.open_r_copy(h["pool"], gidx, layout, final=_final), pos
        sink = functools.partial(self.r.put, k, pos)
        # the device's staging made ahead, in turn after its earlier stages' copies
        # (taken here, in stage order; its worker waits for the turn)
        staging = None if self.ahead is None else self.ahead.staging(k)
        if staging is None:
            staging = staging_for(layout, self.r_slot)
        try:        # its index through pinned chunks: the devices' threads enqueue meanwhile
            return CupyRCopy(layer, h["pool"], gidx, staging, _final, sink=sink,
                             index_through_pinned=True), None
        except BaseException:
            staging.release()           # no worker started: the next turn may go
            raise

    def _stage(self, sid, st, k, layer):
        """Enqueue one stage on its layer (with its device current), waiting on
        the host for each carried block to be cut before the launch that packs
        it.

        Returns ``(sid, handle, copier, positions, idle events)``; the stage's
        outgoing blocks are cut at its end. Adds its host seconds by kind to
        ``enqueue_parts[k]``.
        """
        fs = self.fs
        parts = self.enqueue_parts[k]
        events = self.events[k]
        clock = time.perf_counter
        t = t_stage = clock()
        st, carry_at = defer_carried_packs(st, fs.parent)
        s0, s1 = st.s_range
        h = layer.begin_stage(st, self.s_index[s0:s1], self.vals[s0:s1], [])
        copier = pos = None
        idle = []
        t, parts["begin"] = clock(), parts["begin"] + clock() - t
        events.append(("begin", int(sid), t_stage, t))
        try:
            dense_at, join_at, into_at = {}, {}, {}
            for f, Ld in st.dense.items():
                dense_at.setdefault(Ld, []).append(f)
            for c, L in carry_at.items():       # empty blocks are never cut nor copied
                if int(fs.cm[c]) > 0 and int(fs.fn[c]) > int(fs.fp[c]):
                    into_at.setdefault(L, []).append(c)
            for L in range(st.nlaunch):
                for c in into_at.pop(L, ()):        # a block its launch L packs
                    tw = clock()
                    ev = self.xfer.into(c, k, layer, h["pool"], st.carried[c], self.layers)
                    self.t_wait_blocks[k] += clock() - tw
                    events.append(("wait", int(c), tw, clock()))
                    if ev is not None:
                        idle.append(ev)
                for done in join_at.pop(L, ()):
                    layer.dense_join(h, done)
                t0 = clock()
                parts["other"] += t0 - t
                layer.launch(h, L, st.launch_tasks(L))
                t = clock()
                parts["launch"] += t - t0
                for f in dense_at.get(L, ()):
                    args = (h, int(st.foff[f]), int(fs.fm[f]), int(fs.fn[f]),
                            fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]])
                    out = None
                    if f in self.split:
                        if copier is None and self.host_side.done():
                            copier, pos = self._copier(sid, st, k, layer, h)
                            self.progressive += 1
                        out = self._split_front(f, k, *args,
                                                on_panel=self._panel_copy(sid, st, f, copier),
                                                since=t)
                    Fv, panels, T, done = out or layer.dense_factorize(*args)
                    self.dense_parts[f] = (sid, Fv, panels, T)
                    join_at.setdefault(min(st.dense_join[f], st.nlaunch), []).append(done)
                    td = t
                    t, parts["dense"] = clock(), parts["dense"] + clock() - t
                    events.append(("split" if out else "dense", int(f), td, t))
                if copier is None and self.host_side.done():
                    copier, pos = self._copier(sid, st, k, layer, h)
                    self.progressive += 1
                if copier is not None:      # before the joins after the last launch
                    copier.after_launch(L)
                if L == st.nlaunch - 1:
                    for done in join_at.pop(st.nlaunch, ()):
                        layer.dense_join(h, done)
                parts["other"] += clock() - t
                t = clock()
            for c in [c for v in into_at.values() for c in v]:     # a stage without launches
                self.xfer.into(c, k, layer, h["pool"], st.carried[c], self.layers)
            for done in [d for v in join_at.values() for d in v]:
                layer.dense_join(h, done)
            layer.mark_kernels_end(h)
            if copier is None:
                copier, pos = self._copier(sid, st, k, layer, h)
            copier.launches_done()
            self.launches[k] += int(np.count_nonzero(np.diff(st.launch_ptr)))
            first, last = st.fronts
            t0 = clock()
            parts["other"] += t0 - t
            out = []                                 # blocks for later stages
            for f in range(first, last + 1):
                p = int(fs.parent[f])
                if p > last and int(fs.cm[f]) > 0 and int(fs.fn[f]) > int(fs.fp[f]):
                    base = int(st.foff[f]) + int(fs.frank[f]) * int(fs.fn[f])
                    out.append((f, base, int(fs.cm[f]), int(fs.fn[f]), int(fs.fp[f])))
            self.xfer.put_stage(k, layer, h["pool"], out)
            t = clock()
            parts["blocks_out"] += t - t0
            events += [("cut", int(sid), t0, t), ("stage", int(sid), t_stage, t)]
        except BaseException:
            if copier is not None:
                copier.abort()
            raise
        return sid, h, copier, pos, idle

    def _panel_copy(self, sid, st, f, copier):
        """What R's copier of stage ``sid`` (``st`` as enqueued) is told after each
        panel of split front ``f``: ``on_panel(p, event)`` hands it the entries
        final once the panel's factorization (``event``) ended (``final[nlaunch +
        p]``, :func:`_host_side`); None where ``f`` is not the stage's
        :func:`late_split_front` (or no copier or no such entries)."""
        if copier is None or not hasattr(copier, "after_cut"):
            return None
        final = self.host_side.result()[1][sid][2]
        nl = int(st.nlaunch)
        if final is None or len(final) <= nl or late_split_front(st, self.split) != f:
            return None
        cuts = [int(x) for x in final[nl:]]

        def on_panel(p, ev):
            if p < len(cuts):
                copier.after_cut(cuts[p], ev)
        return on_panel

    def _split_worker(self, i):
        """The thread that enqueues layer ``i``'s share of the split fronts (one per
        layer and call: its steps run in order, the layer's own thread goes on
        with its stages meanwhile)."""
        with self._workers_lock:
            ex = self.split_workers.get(i)
            if ex is None:
                ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpuqr-split-{i}")
                self.split_workers[i] = ex
            return ex

    def _split_front(self, f, k, h, off, fm, fn, stair, on_panel=None, since=None):
        """Dense front ``f`` of device ``k``'s stage factorized over every layer
        (:func:`~scipy_gpuqr._engine.split_front.run_split`); returns what
        ``dense_factorize`` returns, or None to leave it to device ``k`` alone
        (one column block per device or fewer; a device out of memory).

        Device ``k``'s thread enqueues the main device's steps; every other
        layer's steps are enqueued by that layer's split worker
        (:meth:`_split_worker`), each after the steps whose events it waits
        for, so the front's host calls are shared by its devices' threads.
        ``info["split_fronts"]``' ``enqueue_seconds`` has each device's
        thread's seconds on the front and, of them, waiting for the others'.
        ``on_panel`` (:meth:`_panel_copy`) is given to the backend, which calls
        it after each panel's factorization on device ``k``'s thread. ``since``
        (``perf_counter`` seconds): when the stage turned to the front (R's
        copier and ``on_panel`` made since), for ``host_seconds``' ``copier``.
        """
        clock = time.perf_counter
        t_in, c_in = clock(), time.thread_time()
        layer = self.layers[k]
        idx = [i for i in range(len(self.layers)) if i != k]
        others = [self.layers[i] for i in idx]
        nb = int(getattr(layer, "dense_panel", self.split_model.dense.panel))
        model = self.split_model
        if nb != model.dense.panel:
            model = replace(model, dense=replace(model.dense, panel=nb))
        owners = block_owners(fm, fn, stair, len(self.layers), model)
        sp = self.split.get(f)
        entry = {"front": int(f), "shape": (int(fm), int(fn)), "device": k,
                 "blocks": np.bincount(owners, minlength=len(self.layers)).tolist(),
                 "modelled_seconds": None if sp is None else float(sp.seconds),
                 "one_device_modelled_seconds": (None if sp is None
                                                 else float(sp.one_device_seconds))}
        if int(owners.max(initial=0)) == 0:     # said in info: asked for, not split
            entry["fallback"] = "every column block on the main device"
            self.split_log.append(entry)
            return None
        panels = panels_of(fm, fn, stair, nb)
        F = h["pool"][off: off + fm * fn].reshape(fm, fn)
        cp = getattr(layer, "cp", None)
        nsplit = int(owners.max()) + 1
        t_owners = clock()
        workers = [None] + [self._split_worker(i) for i in idx[:nsplit - 1]]
        t_workers = clock()
        if nb != self.panel_nb:         # R's ranks were cut by another width
            on_panel = None
        if cp is None:                  # NumPy layers: the steps on host arrays
            be = NumpySplit(F, panels, nb, owners)
            be.on_panel = on_panel
            entry["enqueue_seconds"] = run_split(be, panels, nb, fn, owners, workers=workers)
            T, log = be.T, be.log
            entry["transfers"] = len(log)
            self.split_log.append(entry)
            return F, panels, T, None
        if self._peers is None:         # once: peer access between every pair
            self._peers = enable_peers(cp, [x.device_id for x in self.layers])
        if not self._peers:
            entry["fallback"] = "no peer access between the devices"
            self.split_log.append(entry)
            return None
        t_peers, c_peers = clock(), time.thread_time()
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(layer.stream)
        t_ready = clock()
        res = self.split_res.get(k)
        if res is None:
            res = self.split_res[k] = SplitResources(cp)
        be = CupySplit(layer, others, F, panels, nb, owners, ready, timing=True,
                       resources=res)
        be.on_panel = on_panel
        try:
            be.prepare()
        except cp.cuda.memory.OutOfMemoryError:
            be.release()
            entry["fallback"] = "out of memory"
            self.split_log.append(entry)
            return None
        t_prep = clock()
        try:
            entry["enqueue_seconds"] = run_split(be, panels, nb, fn, owners, workers=workers)
        except cp.cuda.memory.OutOfMemoryError as exc:      # the engine's fallback
            raise DeviceOutOfMemory(str(exc)) from exc
        # the main thread's seconds in this call by part (the first split front of a
        # call has taken 0.1-0.2 s more than its steps on four H200)
        entry["host_seconds"] = {"before": t_peers - t_in, "ready": t_ready - t_peers,
                                 "prepare": t_prep - t_ready, "steps": clock() - t_prep,
                                 "before_parts": {"owners": t_owners - t_in,
                                                  "workers": t_workers - t_owners,
                                                  "peers": t_peers - t_workers,
                                                  "cpu": c_peers - c_in,
                                                  "copier": (None if since is None
                                                             else t_in - since)}}
        entry["backend"] = be
        self.split_log.append(entry)
        return F, panels, be.T, be.done

    def split_info(self) -> list:
        """``info["split_fronts"]`` (after the devices' streams ended): measured
        seconds of each split front on CUDA layers; their buffers dropped, the
        handles they shared closed."""
        out = []
        for e in self.split_log:
            e = dict(e)
            be = e.pop("backend", None)
            if be is not None:
                e["seconds"] = be.seconds()
                be.release()
            out.append(e)
        self.split_log = out
        for res in self.split_res.values():
            res.close()
        self.split_res = {}
        return out

    # -- R ------------------------------------------------------------------------------
    def finish_r(self, Ac, layout, pattern):
        """R from the scattered values: the singleton rows' entries from A."""
        data = self.r.take()
        if len(layout.r1_pos):
            data[layout.r1_pos] = Ac.data[layout.r1_nz]
        return layout.csc(data, pattern)

    def _home_reaches(self, home, layer) -> bool:
        """Whether the home layer's kernels can read the layer's memory."""
        if layer.device_id == home.device_id:
            return True
        cp = home.cp
        if not cp.cuda.runtime.deviceCanAccessPeer(home.device_id, layer.device_id):
            return False
        rt = cp.cuda.runtime
        with cp.cuda.Device(home.device_id):
            try:
                # CuPy's variant clears the runtime's last error when access was
                # enabled already (left set, it would surface in a later library
                # call that checks cudaGetLastError, e.g. Thrust's)
                ensure = getattr(rt, "_deviceEnsurePeerAccess", None)
                if ensure is not None:
                    ensure(layer.device_id)
                else:
                    rt.deviceEnablePeerAccess(layer.device_id)
            except rt.CUDARuntimeError as exc:
                if "PeerAccessAlreadyEnabled" not in str(exc):
                    return False
        return True

    def _gather_q(self):
        """The home layer's VT pool completed with the other devices' tiles; each
        stage's pool where the home device reads it (device) or on the host."""
        sched = self.sched
        home = self.layers[0]
        lo = np.asarray(sched.vt_base, dtype=np.int64)
        hi = np.append(lo[1:], sched.vt_size)
        stage_pools, host_pools = {}, {}
        copied = set()
        for sent in self.sent_home.values():     # the copies of _send_home ended
            sent["event"].synchronize()
        for sid, st in enumerate(sched.stages):
            k, layer = self.layer_of(sid)
            first, last = st.fronts
            a, b = int(lo[first]), int(hi[last])
            if k != 0 and b > a and k not in self.sent_home:
                if getattr(home, "cp", None) is None:
                    home.vt[a:b] = layer.vt[a:b]
                else:
                    cp = home.cp
                    isz = home.vt.itemsize
                    with cp.cuda.Device(home.device_id):
                        if layer.device_id == home.device_id:
                            cp.cuda.runtime.memcpy(home.vt.data.ptr + a * isz,
                                                   layer.vt.data.ptr + a * isz,
                                                   (b - a) * isz, _D2D)
                        else:
                            cp.cuda.runtime.memcpyPeer(home.vt.data.ptr + a * isz,
                                                       home.device_id,
                                                       layer.vt.data.ptr + a * isz,
                                                       layer.device_id, (b - a) * isz)
                    copied.update((home.device_id, layer.device_id))
            pool = self.pools[sid]
            if getattr(home, "cp", None) is None or self._home_reaches(home, layer):
                stage_pools[sid] = pool
            else:
                with _on(layer):
                    host_pools[sid] = layer.to_host(pool)
        if copied:                          # the VT copies done before Q's launches
            _settle(home.cp, copied)
        for layer in self.layers[1:]:       # their pools live on in ``stage_pools``
            if layer is not home:
                # its VT pool too, where its stages' pools stay on its GPU: the
                # solves run those stages' replay levels there (.replay_split)
                if (getattr(layer, "cp", None) is not None and layer.vt is not None
                        and layer.device_id != home.device_id):
                    self.lane_vt[layer.device_id] = layer.vt
                with _on(layer):
                    layer.close()
        return stage_pools, host_pools

    def result(self, Ac, layout, R, *, seconds):
        """The :class:`~.driver.GpuQR` (Q kept on the first device)."""
        fs, sched, plan = self.fs, self.sched, self.plan
        m, n = Ac.shape
        stage_pools, host_pools = self._gather_q()
        slots_of = layout.slots_of
        fronts, front_loc, front_launch, pending = [], [], [], {}
        sizes = (fs.fm.astype(np.int64) * fs.fn.astype(np.int64)).tolist()
        # one front at a time in Python, the loop's every step counted (13073 fronts
        # of grid 64^3 after every device ended): lists made whole, slices by zip
        for sid, st in enumerate(sched.stages):
            kept = stage_reflector_records(sched, sid, st, self.launch_base[sid])
            allf, alll = kept.records, kept.launches
            first, last = st.fronts
            ptr = np.searchsorted(allf["front"], np.arange(first, last + 2)).tolist()
            fr = range(first, last + 1)
            offs = np.asarray(st.foff[first:last + 1], dtype=np.int64).tolist()
            front_loc += [(sid, off) for off in offs]
            front_launch += [alll[a:b] for a, b in zip(ptr[:-1], ptr[1:])]
            recs = [allf[a:b] for a, b in zip(ptr[:-1], ptr[1:])]
            if sid in host_pools:
                pool = host_pools[sid]
                fronts += [(slots_of[f], pool[off: off + sizes[f]], r)
                           for f, off, r in zip(fr, offs, recs)]
            else:
                pending.update({f: (sid, off, sizes[f]) for f, off in zip(fr, offs)})
                fronts += [(slots_of[f], None, r) for f, r in zip(fr, recs)]
        dense = {}
        home = self.layers[0]
        for f, (sid, Fv, panels, T) in self.dense_parts.items():
            if sid in host_pools:
                off = int(sched.stages[sid].foff[f])
                Fv = host_pools[sid][off: off + Fv.size].reshape(Fv.shape)
                T = T.get() if hasattr(T, "get") else T
            elif f in self.home_dense:                      # sent by _send_home
                Fv, T = self.home_dense[f]
            elif getattr(home, "cp", None) is not None:     # Q's dense products run on home
                Fv, T = _to_home(Fv, home), _to_home(T, home)
            Ld = int(self.launch_base[sid]) + sched.stages[sid].dense[f]
            dense[f] = DenseFront(Fv, panels, T, slots=slots_of[f], after_launch=Ld)
        gmaps = self.host_side.result()[1]
        r_entries = [0] * len(self.layers)
        for sid in range(len(sched.stages)):
            r_entries[int(plan.stage_device[sid])] += len(gmaps[sid][1])
        per = []
        base = self.t_call if self.t_call is not None else 0.0
        for k, layer in enumerate(self.layers):
            per.append({"device": getattr(layer, "device_id", k),
                        "name": getattr(layer, "name", "?"),
                        "stages": len(plan.device_stages(k)), "launches": self.launches[k],
                        "busy_seconds": self.busy[k],
                        "enqueue_seconds": self.t_enqueue[k],
                        "wait_blocks_seconds": self.t_wait_blocks[k],
                        "enqueue_cpu_seconds": self.cpu_enqueue[k],
                        "enqueue_parts": dict(self.enqueue_parts[k]),
                        "wait_r_copy_seconds": self.t_wait_r[k],
                        # R's values: the device's entries, those put in R's data
                        # in all and by the end of its enqueueing, seconds
                        # scattering them and waiting for R's data array
                        "r_copy": {"entries": r_entries[k],
                                   "scattered": self.r.entries[k],
                                   "scattered_by_enqueued": self.r.at_enqueued[k],
                                   "scatter_seconds": self.r.seconds[k],
                                   "data_wait_seconds": self.r.waited[k]},
                        # from the call's start: its thread started, its stages
                        # enqueued, its R values scattered
                        "timeline_seconds": self.timeline[k],
                        "events": [(kind, i, a - base, b - base)
                                   for kind, i, a, b in self.events[k]],
                        # its VT tiles and dense fronts copied to the home layer once
                        # its stages ended (:meth:`_send_home`): bytes, enqueueing s
                        "to_home": ({key: self.sent_home[k][key] for key in ("bytes", "seconds")}
                                    if k in self.sent_home else None),
                        "flops": float(plan.device_flops[k])})
        info = {"backend": "gpu", "device": getattr(self.layers[0], "name", "?"),
                "ordering": self.analysis.ordering_used, "nfronts": int(fs.nfronts),
                "stages": len(sched.stages), "launches": int(sched.nlaunch),
                "launches_with_tasks": int(sched.nlaunch_with_tasks),
                "tasks": int(sched.ntasks), "tile": int(sched.tile),
                "bundle": int(sched.bundle), "pipelining": bool(sched.pipelining),
                "dense_fronts": len(dense), "dense_flops": sched.dense_flops,
                "devices": {**plan.as_dict(), "devices": per},
                "transfers": list(self.xfer.log),
                "split_fronts": self.split_info(),
                "q_device": getattr(self.layers[0], "device_id", 0),
                "q_pools_on_host": sorted(host_pools),
                "r_copy_progressive": int(self.progressive),
                "restaged": 0, "seconds": seconds}
        return driver.GpuQR(shape=(m, n), R=R, colperm=self.analysis.colperm.astype(np.int64),
                            rank=int(min(m, n)), tol=None, flops=float(self.analysis.flops),
                            info=info, analysis=self.analysis, qorder=layout.qorder.copy(),
                            schedule=sched, _fronts=fronts, _vt=None, _dense=dense,
                            _device=self.layers[0], _pending=pending,
                            _stage_pools=stage_pools, _host_pools=host_pools,
                            _replay={"lane_vt": self.lane_vt},
                            _front_loc=front_loc, _front_launch=front_launch,
                            _launch_base=self.launch_base.tolist())

