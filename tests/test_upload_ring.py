"""The uploads' pinned ring (``_engine/gpu/upload_ring.py``, issue 16).

On the CPU a stand-in stream runs each copy only when an event recorded after
it is waited for (or at the end), reading the ring's bytes then, as a DMA
engine would: a part of the ring written again before its copy ran would put
the wrong bytes on the "device". On the GPU a factorization whose records and
S entries go through a ring of a few records (debug: the records' buffer
poisoned, so a launch whose records never arrived does nothing) gives the
default run's R bit for bit.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import upload_ring as ur
from scipy_gpuqr._engine.gpu.device import CupyDevice
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import TASK_BYTES
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares


class _Stream:
    """Copies queued in order, run when an event after them is waited for."""

    def __init__(self):
        self.queue = []         # (seq, fn)
        self.seq = 0
        self.ran = 0

    def push(self, fn):
        self.seq += 1
        self.queue.append((self.seq, fn))

    def run_to(self, seq):
        while self.queue and self.queue[0][0] <= seq:
            _, fn = self.queue.pop(0)
            fn()
            self.ran += 1

    def flush(self):
        self.run_to(self.seq)


class _Event:
    def __init__(self):
        self.stream, self.at = None, 0

    def record(self, stream):
        self.stream, self.at = stream, stream.seq

    @property
    def done(self):
        return not self.stream.queue or self.stream.queue[0][0] > self.at

    def synchronize(self):
        self.stream.run_to(self.at)


class _Device:
    """Device bytes whose slices' ``set`` queues a copy that reads the host
    buffer only when it runs."""

    def __init__(self, n):
        self.buf = np.full(n, 0xFF, dtype=np.uint8)

    def __getitem__(self, sl):
        owner = self

        class _Slice:
            def __getitem__(self, inner):
                lo = (sl.start or 0) + (inner.start or 0)
                hi = (sl.start or 0) + inner.stop
                return owner[slice(lo, hi)]

            def set(self, host, stream):
                def copy(host=host):
                    owner.buf[sl] = host
                stream.push(copy)
        return _Slice()


def _ring(nbytes, piece):
    return ur.UploadRing(np.zeros(nbytes, np.uint8), _Event, piece=piece)


@pytest.mark.parametrize("ring_bytes,piece", [(64, 64), (100, 30), (4096, 1000), (7, 3)])
def test_every_byte_arrives_whatever_the_ring(ring_bytes, piece):
    """Uploads of many sizes (smaller, equal to and larger than the ring), the
    copies run only when waited for: every destination holds its source."""
    rng = np.random.default_rng(7)
    stream = _Stream()
    ring = _ring(ring_bytes, piece)
    sizes = [1, 5, piece, piece + 1, ring_bytes, 3 * ring_bytes + 11, 2, 40, 17]
    dests = []
    for n in sizes:
        src = rng.integers(0, 255, n, dtype=np.uint8)
        dev = _Device(n)
        ring.upload(dev[slice(0, n)], src, stream)
        dests.append((dev, src))
    ring.settle(stream)
    stream.flush()
    for dev, src in dests:
        assert np.array_equal(dev.buf, src)
    assert ring.waits > 0       # the ring was reused while copies were queued


def test_a_part_is_written_again_only_after_its_copy():
    """A ring of two pieces: the third piece waits for the first's copy (and
    only for it), never overwriting bytes a queued copy still reads."""
    stream = _Stream()
    ring = _ring(8, 4)
    dev = _Device(12)
    src = np.arange(12, dtype=np.uint8)
    ring.upload(dev[slice(0, 12)], src, stream)
    # three copies queued; the third claimed the first piece: the first copy ran
    assert stream.ran == 1 and len(stream.queue) == 2
    assert np.array_equal(dev.buf[:4], src[:4])
    ring.settle(stream)
    stream.flush()
    assert np.array_equal(dev.buf, src)


def test_small_uploads_share_a_piece_and_its_event():
    """Uploads smaller than a piece are marked by one event per piece (the
    launch-by-launch records of a cold schedule: one event a launch would cost
    microseconds each)."""
    made = []

    def event():
        made.append(_Event())
        return made[-1]
    stream = _Stream()
    ring = ur.UploadRing(np.zeros(1000, np.uint8), event, piece=100)
    for _ in range(50):
        ring.upload(_Device(10)[slice(0, 10)], np.ones(10, np.uint8), stream)
    ring.settle(stream)
    assert len(made) == 5       # 500 bytes in pieces of 100


def _records_through_ring(st, chunk, whole, ring):
    """Every launch's records through ``CupyDevice._records_up`` with the ring;
    the launch "runs" after the copies queued before it."""
    nbytes = max(int(st.ntasks), 1) * TASK_BYTES
    src = np.ascontiguousarray(st.tasks).view(np.uint8).ravel()
    dev = _Device(nbytes)
    stream = _Stream()

    class _Layer:
        record_chunk_bytes = chunk
    layer = _Layer()
    layer.stream = stream
    h = {"dt": dev, "host": None, "ring": ring, "src": src if whole else None, "sent": 0}
    lp = np.asarray(st.launch_ptr)
    for L in range(len(lp) - 1):
        a, b = int(lp[L]), int(lp[L + 1])
        if b <= a:
            continue
        CupyDevice._records_up(layer, h, a, b, st.tasks[a:b])
        ring.settle(stream)
        stream.flush()          # the launch runs after every copy queued before it
        assert np.array_equal(dev.buf[a * TASK_BYTES: b * TASK_BYTES],
                              src[a * TASK_BYTES: b * TASK_BYTES]), (L, chunk)
    return dev, src


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("ring_records,chunk", [(3, 3 * TASK_BYTES), (5, 4 * TASK_BYTES),
                                                (64, 1000)])
def test_every_launch_finds_its_records_through_a_small_ring(whole, ring_records, chunk):
    an = analyze(grid3d_least_squares(8))
    st = build_schedule(an).stages[0]
    ring = _ring(ring_records * TASK_BYTES, 2 * TASK_BYTES)
    dev, src = _records_through_ring(st, chunk, whole, ring)
    assert np.array_equal(dev.buf, src)


def test_ring_pinned_waits_for_the_early_pinning(monkeypatch):
    """The device's ring is taken only once the early pinning is done (its block
    then a free block of the pool, not pinned twice); the early pinning starts
    one thread per process whoever asks at once, and a failure there is quiet."""
    order = []
    gate = threading.Event()

    def pin(nbytes):
        gate.wait(5)
        order.append(("pinned ahead", nbytes))
    monkeypatch.setattr(ur, "_pin", pin)
    ur.pin_ring_ahead.cache_clear()
    try:
        threads = []
        starters = [threading.Thread(target=lambda: threads.append(ur.pin_ring_ahead()))
                    for _ in range(4)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert len({id(t) for t in threads}) == 1 and threads[0].name == "gpuqr-pin-ring"

        def take(n, dtype):
            order.append(("taken", n))
            return np.zeros(n, dtype)
        threading.Timer(0.05, gate.set).start()
        buf = ur.ring_pinned(take)
        assert order == [("pinned ahead", ur.RING_BYTES), ("taken", ur.RING_BYTES)]
        assert buf.size == ur.RING_BYTES
    finally:
        ur.pin_ring_ahead.cache_clear()
    monkeypatch.setattr(ur, "_pin", lambda n: 1 / 0)
    try:
        ur.pin_ring_ahead().join(5)         # no error escapes the thread
        assert ur.ring_pinned(lambda n, dt: np.zeros(n, dt)).size == ur.RING_BYTES
    finally:
        ur.pin_ring_ahead.cache_clear()


def test_without_early_pinning_the_ring_is_taken_at_once():
    ur.pin_ring_ahead.cache_clear()
    assert ur.ring_pinned(lambda n, dt: np.zeros(n, dt)).size == ur.RING_BYTES


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000])
@pytest.mark.parametrize("debug", [True, False])
def test_factorization_through_a_tiny_ring_is_the_default_one(budget, debug, monkeypatch):
    """The maps, S entries and records through a ring of seven records (gone
    round many times; with ``debug`` the records' buffer poisoned, so a launch
    whose records never arrived does nothing; without, the host runs ahead of
    the copies): R bit for bit the default run's; the ring given back at each
    stage's end."""
    from scipy_gpuqr._engine.gpu import device as dmod
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._testing_matrices import random_values
    rng = np.random.default_rng(3)
    A = random_values(grid3d_least_squares(8), rng)
    an = analyze(A)
    gpu_factorize(A, an, max_gpu_memory=budget).free()      # the schedule materialized
    ref = gpu_factorize(A, an, max_gpu_memory=budget)
    rings = []

    class _Kept(ur.UploadRing):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            rings.append(self)
    monkeypatch.setattr(dmod, "UploadRing", _Kept)
    monkeypatch.setattr(ur, "RING_BYTES", 7 * TASK_BYTES)
    dev = CupyDevice(32, 3, debug=debug)
    dev.record_chunk_bytes = 3 * TASK_BYTES
    g = gpu_factorize(A, an, device=dev, max_gpu_memory=budget)
    assert rings and all(r.size == 7 * TASK_BYTES for r in rings)
    assert sum(r.laps for r in rings) > 10 and dev._ring is None
    assert len(rings) >= len(g.schedule.stages)
    assert np.array_equal(g.R.indices, ref.R.indices)
    assert np.array_equal(g.R.data, ref.R.data)
    g.free()
    ref.free()


@pytest.mark.gpu
def test_the_early_pinning_leaves_the_ring_in_the_pool():
    """After the early pinning the device's ring is a free block of CuPy's pinned
    pool: taking it pins nothing new."""
    import cupy
    pool = cupy.get_default_pinned_memory_pool()
    ur.pin_ring_ahead.cache_clear()
    try:
        ur.pin_ring_ahead().join(30)
        before = pool.n_free_blocks()
        assert before >= 1
        dev = CupyDevice(32, 3)
        ring = dev._upload_ring()
        assert ring.size == ur.RING_BYTES
        assert pool.n_free_blocks() == before - 1
        dev.close()
    finally:
        ur.pin_ring_ahead.cache_clear()

