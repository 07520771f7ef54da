"""A stage's one-time uploads without pinned buffers of their own, on the CPU.

CuPy's pinned pool reuses a block only for a request of its exact size, so the
pinned buffers a factorization made for R's maps, a stage's S entries and a
materialized stage's records were new ``cudaHostAlloc`` calls (tens of
megabytes) in every first call of a process and every first call on a pattern.
These arrays now go up from where they lie on the layer's upload stream
(``device.upload_stream``), and the layer's stream waits for each copy.

Here ``CupyDevice`` runs its own ``start``, ``begin_stage`` and ``launch`` over a
stand-in of the CuPy calls it makes, which keeps every stream operation in
order: each launch must find its records, the S entries and the maps copied
before it in its stream's order (a wait on an event recorded after the copy),
and nothing may ask for pinned memory but a stage built launch by launch.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import CupyDevice, pinned_class
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import TASK_BYTES
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares


class _Log:
    def __init__(self):
        self.ops = []
        self.current = None


class _Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __enter__(self):
        self._prev, self.log.current = self.log.current, self
        return self

    def __exit__(self, *exc):
        self.log.current = self._prev

    def wait_event(self, ev):
        self.log.ops.append(("wait", self.name, ev.id))


class _Event:
    count = 0

    def __init__(self, log):
        self.log = log
        _Event.count += 1
        self.id = _Event.count

    def record(self, stream=None):
        self.log.ops.append(("record", stream.name, self.id))


class _Array:
    """A device array: a NumPy buffer and its offset in the allocation."""

    def __init__(self, log, buf, alloc, base=0, stream=None):
        self.log, self.buf, self.alloc, self.base = log, buf, alloc, base
        self.stream = stream            # the stream current at its allocation

    @property
    def size(self):
        return self.buf.size

    @property
    def dtype(self):
        return self.buf.dtype

    def __getitem__(self, sl):
        start = sl.start or 0
        return _Array(self.log, self.buf[sl], self.alloc, self.base + start, self.stream)

    def set(self, host, stream=None):
        assert host.flags.c_contiguous and host.dtype == self.buf.dtype
        self.buf[...] = host
        self.log.ops.append(("copy", stream.name, self.alloc, self.base,
                             self.base + host.size))

    def fill(self, value):
        self.buf[...] = value
        self.log.ops.append(("fill", self.log.current.name, self.alloc))


class _Cupy:
    """The CuPy calls ``start``, ``begin_stage`` and ``launch`` make."""

    def __init__(self):
        self.log = _Log()
        self.allocs = 0
        log = self.log

        class cuda:
            class memory:
                class OutOfMemoryError(MemoryError):
                    pass

            @staticmethod
            def Event(*a, **k):
                return _Event(log)

        self.cuda = cuda

    def _new(self, n, dtype, value):
        self.allocs += 1
        cur = self.log.current
        self.log.ops.append(("alloc", cur.name if cur else "null", self.allocs))
        return _Array(self.log, np.full(int(n), value, dtype=dtype), self.allocs, 0, cur)

    def empty(self, n, dtype):
        return self._new(n, dtype, 0)

    def zeros(self, n, dtype):
        return self._new(n, dtype, 0)

    def full(self, n, fill, dtype):
        return self._new(n, dtype, fill)


def _device(chunk, debug=False):
    cp = _Cupy()
    dev = object.__new__(CupyDevice)
    dev.cp = cp
    dev.stream = _Stream(cp.log, "main")
    dev.upload_stream = _Stream(cp.log, "upload")
    dev.dtype = np.dtype(np.float64)
    dev.debug = debug
    dev.profile = False
    dev.record_chunk_bytes = chunk
    dev.seconds = {"upload": 0.0, "kernels": 0.0, "download": 0.0}
    dev.first_launch_at = None
    dev.launches = 0
    dev.threads, dev.smem, dev.slots = 128, 0, 1
    dev.apply_split_max, dev.apply_split_fill = 1, 1.0
    dev.pinned_calls = []

    def pinned(n, dtype):
        dev.pinned_calls.append(int(n))
        return np.zeros(int(n), dtype=dtype)

    dev._pinned = pinned

    def kernel(grid, block, args, shared_mem=0):
        dt = args[0]
        cp.log.ops.append(("launch", cp.log.current.name, dt.alloc, dt.base))

    dev.kernel = kernel
    return dev


def _covered(ops, alloc, lo, hi):
    """Whether elements [lo, hi) of allocation ``alloc`` were copied on the upload stream and
    the main stream waited, after it, for an event recorded after the copy."""
    done = set()            # byte positions copied (on the upload stream, in order)
    safe = np.zeros(hi, dtype=bool)
    pending = []            # copies on the upload stream not yet behind an event
    recorded = {}           # event -> copies it covers
    for op in ops:
        if op[0] == "copy" and op[1] == "upload" and op[2] == alloc:
            pending.append((op[3], op[4]))
        elif op[0] == "record" and op[1] == "upload":
            recorded[op[2]] = list(done | set(pending))
            done |= set(pending)
            pending = []
        elif op[0] == "wait" and op[1] == "main" and op[2] in recorded:
            for a, b in recorded[op[2]]:
                safe[a:min(b, hi)] = True
    return bool(safe[lo:hi].all())


@pytest.mark.parametrize("chunk", [TASK_BYTES, 1000, 4 << 20])
@pytest.mark.parametrize("debug", [False, True])
def test_a_materialized_stage_goes_up_without_pinned_buffers(chunk, debug):
    an = analyze(grid3d_least_squares(8))
    sched = build_schedule(an)
    st = sched.stages[0]
    assert st.materialized
    dev = _device(chunk, debug)
    fs = an.fronts
    maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
    dev._alloc = lambda n, dtype, fill=None: dev.cp._new(n, dtype, 0)
    dev.start(maps, sched.vt_size)
    s0, s1 = st.s_range
    vals = np.arange(s1 - s0, dtype=np.float64)
    h = dev.begin_stage(st, fs.s_index[s0:s1], vals, [])
    dev.debug = False           # (debug's checks after each launch need a GPU)
    lp = np.asarray(st.launch_ptr)
    for L in range(len(lp) - 1):
        dev.launch(h, L, st.tasks[lp[L]:lp[L + 1]])
    ops = dev.cp.log.ops
    assert dev.pinned_calls == []           # no pinned buffer for what is read once
    assert h["host"] is None
    # what the launches read: the maps, the S entries and the records, on the device
    assert np.array_equal(dev.maps.buf, maps)
    assert np.array_equal(h["sidx"].buf, np.asarray(fs.s_index[s0:s1], dtype=np.int64))
    assert np.array_equal(h["sval"].buf, vals)
    src = np.ascontiguousarray(st.tasks).view(np.uint8).ravel()
    assert np.array_equal(h["dt"].buf, src)
    # ... allocated on the upload stream (its pool's blocks) and copied there
    for arr in (dev.maps, h["sidx"], h["sval"], h["dt"]):
        assert arr.stream.name == "upload"
    copies = [op for op in ops if op[0] == "copy"]
    assert copies and all(op[1] == "upload" for op in copies)
    if debug:       # the records' poison before any copy into that buffer, same stream
        fill = ops.index(("fill", "upload", h["dt"].alloc))
        first = min(i for i, op in enumerate(ops) if op[0] == "copy" and op[2] == h["dt"].alloc)
        assert fill < first
    # each launch: after a wait for its records, the S entries and the maps
    for i, op in enumerate(ops):
        if op[0] != "launch":
            continue
        assert op[1] == "main"
        k = [L for L in range(len(lp) - 1) if lp[L] * TASK_BYTES == op[3]][0]
        before = ops[:i]
        assert _covered(before, h["dt"].alloc, int(lp[k]) * TASK_BYTES,
                        int(lp[k + 1]) * TASK_BYTES), k
        for arr in (h["sidx"], h["sval"], dev.maps):     # (positions in elements)
            assert _covered(before, arr.alloc, 0, arr.size)


def test_a_stage_built_launch_by_launch_keeps_its_pinned_buffer():
    an = analyze(grid3d_least_squares(6))
    sched = build_schedule(an)
    st = sched.stages[0]
    dev = _device(4 << 20)
    dev._alloc = lambda n, dtype, fill=None: dev.cp._new(n, dtype, 0)
    fs = an.fronts
    s0, s1 = st.s_range

    class _Cold:          # the stage as a cold run sees it: records come per launch
        materialized = False

        def __getattr__(self, name):
            return getattr(st, name)

    dev.vt = dev.maps = None
    h = dev.begin_stage(_Cold(), fs.s_index[s0:s1], np.ones(s1 - s0), [])
    assert dev.pinned_calls == [pinned_class(max(int(st.ntasks), 1) * TASK_BYTES)]
    lp = np.asarray(st.launch_ptr)
    for L in range(len(lp) - 1):
        dev.launch(h, L, st.tasks[lp[L]:lp[L + 1]])
    src = np.ascontiguousarray(st.tasks).view(np.uint8).ravel()
    assert np.array_equal(h["dt"].buf, src)
    # its records go up on the layer's stream, after the wait for the upload stream
    ops = dev.cp.log.ops
    dt_copies = [i for i, op in enumerate(ops) if op[0] == "copy" and op[2] == h["dt"].alloc]
    assert dt_copies and all(ops[i][1] == "main" for i in dt_copies)
    waits = [i for i, op in enumerate(ops) if op[0] == "wait" and op[1] == "main"]
    assert waits and max(waits) < min(dt_copies)


def test_records_built_launch_by_launch_share_a_pinned_size_class():
    # CuPy's pinned pool reuses a block for its exact size only: patterns of like
    # size ask for the same buffer, never smaller than their records
    sizes = [1, 96, 1 << 20, (1 << 20) + 1, 116_000_000, 127_800_000, 1 << 27, (1 << 27) + 96]
    got = [pinned_class(n) for n in sizes]
    assert got == [1 << 20, 1 << 20, 1 << 20, 1 << 21, 1 << 27, 1 << 27, 1 << 27, 1 << 28]
    assert all(g >= n for g, n in zip(got, sizes))
