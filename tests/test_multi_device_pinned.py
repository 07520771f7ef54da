"""A multi-device call's pinned host memory allocated before its devices' threads start
(:class:`~scipy_gpuqr._engine.gpu.pinned_ahead.PinnedAhead`), on the CPU.

Pinning host memory while the devices' threads enqueue stalls all of them. The
call sizes what they pin from the plan and the schedule, pins it (or takes the
blocks an earlier call left) before the threads start, and hands it out in
slices. Here the pinning is a fake (NumPy memory, every call noted) and the
device layers are NumPy layers that ask for pinned memory as
:class:`~scipy_gpuqr._engine.gpu.device.CupyDevice` does (its own ``_pinned`` and
``_pinned_copy``); a fake CuPy module checks that ``CupyDevice.start`` and
``begin_stage`` ask for no more than their lanes hold.
"""

from __future__ import annotations

import contextlib
import threading
import time
import types

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import multi_device as md
from scipy_gpuqr._engine.gpu import pinned_ahead as pa
from scipy_gpuqr._engine.gpu.device import CupyDevice, NumpyDevice
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._engine.gpu.pinned_ahead import PINNED_ALIGN, PinnedAhead, lane_needs, pinned_needs
from scipy_gpuqr._engine.gpu.rcopy import PinnedStaging, StagingTurns
from scipy_gpuqr._schedule.devices import map_devices
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import TASK_BYTES
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares


class _Pins:
    """The fake pinning: NumPy bytes, each call noted with whether a device's
    thread had started then."""

    def __init__(self):
        self.calls = []                 # (bytes, a device thread started already)
        self.started = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, nbytes):
        with self.lock:
            self.calls.append((int(nbytes), self.started.is_set()))
        return np.empty(max(int(nbytes), 1), dtype=np.uint8)


@pytest.fixture
def pins(monkeypatch):
    """The fake pinning, a fresh store of kept blocks, and lanes without slack (sized
    as tightly as the layers ask)."""
    p = _Pins()
    monkeypatch.setattr(pa, "PINNED_LANE_SLACK", 0)
    monkeypatch.setattr(pa, "_pinned_bytes", p)
    monkeypatch.setattr(pa, "_KEPT", pa._KeptBlocks())
    return p


class _PinningLayer(NumpyDevice):
    """A NumPy layer asking for pinned host memory where ``CupyDevice`` does: its
    maps' upload as it starts, per stage the S entries' two uploads and the
    records' buffer (through ``CupyDevice``'s own ``_pinned`` and
    ``_pinned_copy``, so its lane serves them)."""

    _pinned = CupyDevice._pinned
    _pinned_copy = CupyDevice._pinned_copy

    def __init__(self, *a, pins=None, **k):
        super().__init__(*a, **k)
        self.pinned_ahead = None
        self.pins = pins
        self.asked = 0                  # requests made to the lane
        self.shared = 0                 # uploads served where the data lie pinned

    def _up(self, host):
        if host.size == 0:
            host = np.zeros(1, dtype=host.dtype)
        assert self.pinned_ahead is not None, "a request outside the devices' run"
        if self.pinned_ahead.holds(host):
            self.shared += 1
        else:
            self.asked += 1
        buf = self._pinned_copy(host)
        assert np.array_equal(buf, host.ravel())

    def start(self, maps, vt_size):
        if self.pins is not None:
            self.pins.started.set()
        super().start(maps, vt_size)
        self._up(np.ascontiguousarray(maps, dtype=np.int64))

    def begin_stage(self, st, s_index, s_value, carried):
        h = super().begin_stage(st, s_index, s_value, carried)
        self._up(np.ascontiguousarray(s_index, dtype=np.int64))
        self._up(np.ascontiguousarray(s_value, dtype=self.dtype))
        self.asked += 1
        rec = self._pinned(max(int(st.ntasks), 1) * TASK_BYTES, np.uint8)
        assert rec.nbytes == max(int(st.ntasks), 1) * TASK_BYTES
        return h


def _cases():
    yield "grid7", grid3d_least_squares(7).astype(np.float64)
    yield "chess", chessboard_boundary(5, 6, 2).astype(np.float64)


@pytest.mark.parametrize("k", [2, 3])
def test_every_pin_before_the_devices_threads(pins, k):
    """The layers' every request is served from memory pinned before the first
    device thread started: none during the run, the same R as plain NumPy
    layers; ``info['pinned_ahead']`` says what was pinned and that nothing was
    during the run."""
    for name, A in _cases():
        an = analyze(A)
        plain = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)],
                                    device_speeds=None)
        assert plain.info["pinned_ahead"] is None
        pins.calls.clear()
        pins.started.clear()
        pa.release_kept_pinned()            # the last case's blocks: pinned anew here
        layers = [_PinningLayer(32, 3, pins=pins) for _ in range(k)]
        many = multi_gpu_factorize(A, an, layers=layers, device_speeds=None)
        assert np.array_equal(many.R.toarray(), plain.R.toarray()), name
        info = many.info["pinned_ahead"]
        assert info["during_run"] == {"allocations": 0, "bytes": 0}, name
        assert pins.calls and not any(during for _, during in pins.calls), pins.calls
        fs = an.fronts
        maps = (len(fs.rimap) + len(fs.rjmap)) * 8
        assert info["shared_bytes"] >= maps + len(fs.s_index) * 8 + len(fs.s_nz) * 8
        assert info["staging_bytes"] == 0           # NumPy layers copy R themselves
        assert len(info["lane_bytes"]) == k and all(b > 0 for b in info["lane_bytes"])
        assert info["bytes"] == info["shared_bytes"] + sum(info["lane_bytes"])
        assert info["block_bytes"] >= info["bytes"]
        assert sum(n for n, _ in pins.calls) == info["pinned_now_bytes"] > 0
        # every stage asked its lane for its records, the maps and S entries came
        # from where they lie pinned
        stages = many.info["stages"]
        assert sum(x.asked for x in layers) >= stages
        assert sum(x.shared for x in layers) >= k + stages
        assert all(x.pinned_ahead is None for x in layers)     # handed back after the run


def test_a_later_call_pins_nothing(pins):
    """The blocks are kept after the call: the next call (here of the same
    pattern, then of a smaller one) pins nothing at all."""
    A = grid3d_least_squares(7).astype(np.float64)
    an = analyze(A)
    first = multi_gpu_factorize(A, an, layers=[_PinningLayer(32, 3) for _ in range(2)],
                                device_speeds=None)
    n_first = len(pins.calls)
    assert first.info["pinned_ahead"]["pinned_now_bytes"] > 0
    assert pa.kept_pinned_bytes() == first.info["pinned_ahead"]["block_bytes"]
    for B in (A, grid3d_least_squares(5).astype(np.float64)):
        again = multi_gpu_factorize(B, analyze(B), layers=[_PinningLayer(32, 3)
                                                           for _ in range(2)],
                                    device_speeds=None)
        info = again.info["pinned_ahead"]
        assert info["pinned_now_bytes"] == 0 and len(pins.calls) == n_first
        assert info["during_run"]["allocations"] == 0
    pa.release_kept_pinned()
    assert pa.kept_pinned_bytes() == 0


def test_requests_past_a_lane_are_pinned_and_counted(pins, monkeypatch):
    """Lanes sized too small (here: empty): each request past one is pinned while
    the devices run, and counted; the answer is the same."""
    A = grid3d_least_squares(7).astype(np.float64)
    an = analyze(A)
    plain = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                                device_speeds=None)
    monkeypatch.setattr(md, "lane_needs",
                        lambda plan, sched, layers: [PINNED_ALIGN] * len(layers))
    layers = [_PinningLayer(32, 3, pins=pins) for _ in range(2)]
    many = multi_gpu_factorize(A, an, layers=layers, device_speeds=None)
    assert np.array_equal(many.R.toarray(), plain.R.toarray())
    run = many.info["pinned_ahead"]["during_run"]
    assert run["allocations"] == sum(x.asked for x in layers) > 0
    during = [n for n, d in pins.calls if d]
    assert len(during) == run["allocations"] and sum(during) == run["bytes"]


def test_a_failed_run_never_lends_its_blocks_again(pins):
    """A device that failed may still use its memory: the call's blocks are not kept."""
    class _Failing(_PinningLayer):
        def launch(self, h, L, records):
            raise RuntimeError("test: this layer fails")

    A = grid3d_least_squares(7).astype(np.float64)
    with pytest.raises(RuntimeError, match="this layer fails"):
        multi_gpu_factorize(A, analyze(A), layers=[_Failing(32, 3) for _ in range(2)],
                            device_speeds=None)
    assert pa.kept_pinned_bytes() == 0


class _CudaLike:
    """A layer that looks like a CUDA one to the sizing (``cp`` and ``pinned_ahead``)."""

    cp = object()
    pinned_ahead = None
    dtype = np.dtype(np.float64)


def test_stagings_cut_from_the_shared_block(pins):
    """Each CUDA layer has one pair of R slots ahead, which its stages' copiers
    take in turn (a stage's copies run on its device's one copy stream in
    order): a slot is the R slot or the largest of its stages' R bytes,
    whichever is fewer; the turns of one device share its slots, the devices'
    slots are apart, and nothing is pinned for them past the shared block. A
    device with several stages needs fewer bytes than a pair per stage."""
    A = chessboard_boundary(5, 6, 2).astype(np.float64)
    an = analyze(A, ordering="natural")     # stages alternate devices, whatever COLAMD is there
    plan = map_devices(an, 2)
    layers = [_CudaLike(), _CudaLike()]
    r_slot = 1 << 16
    needs = pinned_needs(an, plan, layers, np.float64, r_slot)
    fs = an.fronts
    fr, fn = fs.frank.astype(np.int64), fs.fn.astype(np.int64)
    per_stage = {}
    for sid, (a, b) in enumerate(plan.stages):
        nr = int((fr[a:b + 1] * fn[a:b + 1] - fr[a:b + 1] * (fr[a:b + 1] - 1) // 2).sum())
        per_stage[sid] = pa._align(min(r_slot, max(nr, 1) * 8))
    devices = sorted({int(d) for d in plan.stage_device})
    assert sorted(needs["staging"]) == devices
    for k in devices:
        assert needs["staging"][k] == max(b for sid, b in per_stage.items()
                                          if int(plan.stage_device[sid]) == k)
    assert len(plan.stages) > len(devices)
    assert sum(needs["staging"].values()) < sum(per_stage.values())
    ahead = PinnedAhead(needs)
    ahead.make_shared(lambda name, out: out.fill(0))
    n_pins = len(pins.calls)
    assert n_pins == 1                          # one block for all of it
    lo, hi = ahead.blocks[0].ctypes.data, ahead.blocks[0].ctypes.data + ahead.nbytes
    seen = {}
    for sid in range(len(plan.stages)):         # the stages' copiers, in stage order
        k = int(plan.stage_device[sid])
        turn = ahead.staging(k)
        assert turn.nbytes == needs["staging"][k]
        turn.wait()                             # the device's turn before was released
        slots = turn.slots
        assert [s.nbytes for s in slots] == [needs["staging"][k]] * 2
        assert all(lo <= s.ctypes.data and s.ctypes.data + s.nbytes <= hi for s in slots)
        addr = tuple(s.ctypes.data for s in slots)
        assert seen.setdefault(k, addr) == addr     # every stage of k: k's slots
        turn.release()
    spans = sorted((a, a + needs["staging"][k]) for k, addr in seen.items() for a in addr)
    assert all(e <= b for (_, e), (b, _) in zip(spans, spans[1:]))     # apart
    assert len(pins.calls) == n_pins
    sched = build_schedule(an, plan=plan.stage_plan())
    ahead.make_lanes(lane_needs(plan, sched, layers))
    assert len(pins.calls) == n_pins + 1        # no room for the lanes asked for
    info = ahead.info()
    assert info["staging_bytes"] == 2 * sum(needs["staging"].values())
    assert info["bytes"] == info["shared_bytes"] + info["staging_bytes"] + sum(
        info["lane_bytes"])
    assert not info["lanes_in_shared"]
    ahead.give_back()
    assert pa.kept_pinned_bytes() == info["block_bytes"]


def _turn_workers(turns, hold=0.02):
    """Each turn's copy on a thread of its own, started in reverse order: waits for
    its turn, writes its mark into both slots, holds them, checks that they
    still hold its mark. Returns (the order they held the slots, overwritten)."""
    order, clobbered, lock = [], [], threading.Lock()

    def copy(i, t):
        t.wait()
        for slot in t.slots:
            slot[:] = i
        time.sleep(hold)
        if any(np.any(slot != i) for slot in t.slots):
            clobbered.append(i)
        with lock:
            order.append(i)
        t.release()

    threads = [threading.Thread(target=copy, args=(i, t)) for i, t in enumerate(turns)]
    for th in reversed(threads):
        th.start()
        time.sleep(hold / 4)
    for th in threads:
        th.join(10)
    return order, clobbered


def test_staging_turns_fill_the_slots_one_copy_after_another():
    """A device's stagings in turn: the copies fill the shared slots in the order
    their turns were handed out (the stages' order), whatever order their
    workers start in, and none writes the slots while another holds them."""
    block = np.zeros(2 * 1024, dtype=np.uint8)
    turns_of = StagingTurns(PinnedStaging(1024, slots=[block[:1024], block[1024:]]))
    turns = [turns_of.turn() for _ in range(4)]
    assert turns_of.turns == 4 and all(t.nbytes == 1024 for t in turns)
    order, clobbered = _turn_workers(turns)
    assert order == [0, 1, 2, 3] and clobbered == []
    # a turn released before its copy started (its copier failed to open) passes
    # on only once the turn before it ended
    a, b, c = (turns_of.turn() for _ in range(3))
    b.release()
    started = threading.Event()
    th = threading.Thread(target=lambda: (c.wait(), started.set()))
    th.start()
    assert not started.wait(0.1)
    a.wait()
    a.release()
    assert started.wait(5)
    th.join(5)


def test_pinned_staging_given_slots():
    """Slots given: used as they are (cut to the size), checked."""
    block = np.zeros(4096, dtype=np.uint8)
    st = PinnedStaging(1000, slots=[block[:1024], block[1024:2048]])
    assert [s.nbytes for s in st.slots] == [1000, 1000]
    assert st.slots[1].ctypes.data == block[1024:].ctypes.data
    with pytest.raises(ValueError):
        PinnedStaging(1000, slots=[block[:512], block[512:1024]])
    with pytest.raises(ValueError):
        PinnedStaging(8, slots=[block[:8]])


# -- CupyDevice's own requests, over a fake CuPy -------------------------------------------

class _DevArray(np.ndarray):
    def set(self, host, stream=None):
        self[...] = np.asarray(host).reshape(self.shape)


class _FakeCp:
    """What ``CupyDevice.start`` and ``begin_stage`` call of CuPy."""

    class _Event:
        def record(self, stream=None):
            pass

    def __init__(self):
        self.cuda = types.SimpleNamespace(
            Event=self._Event,
            memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))

    @staticmethod
    def _arr(n, dtype, fill=0):
        return np.full(int(n), fill, dtype=dtype).view(_DevArray)

    def zeros(self, n, dtype=np.float64):
        return self._arr(n, dtype)

    def full(self, n, fill, dtype=np.float64):
        return self._arr(n, dtype, fill)

    def empty(self, n, dtype=np.float64):
        return self._arr(n, dtype, 0x5A if np.dtype(dtype) == np.uint8 else 0)


def _fake_cupy_device():
    dev = object.__new__(CupyDevice)
    dev.cp = _FakeCp()
    dev.dtype = np.dtype(np.float64)
    dev.debug = False
    dev.stream = contextlib.nullcontext()
    dev.seconds = {"upload": 0.0}
    dev.pinned_ahead = None
    return dev


def test_cupy_device_asks_no_more_than_its_lane(pins):
    """``CupyDevice.start`` and every ``begin_stage`` of a layer's stages take
    from its lane as :func:`lane_needs` sized it: the maps and S entries
    uploaded from where they lie pinned, nothing pinned past the lane; the
    uploaded maps and S entries are the analysis'."""
    A = chessboard_boundary(5, 6, 2).astype(np.float64)
    an = analyze(A)
    fs = an.fronts
    plan = map_devices(an, 2)
    sched = build_schedule(an, plan=plan.stage_plan())
    layers = [_fake_cupy_device() for _ in range(2)]
    ahead = PinnedAhead(pinned_needs(an, plan, layers, np.float64, 1 << 20))
    vals = A.tocsc().data[fs.s_nz]
    ahead.make_shared(lambda name, out: out.__setitem__(Ellipsis, {
        "maps": np.concatenate([fs.rimap, fs.rjmap]), "s_index": fs.s_index,
        "s_value": vals}[name]))
    ahead.make_lanes(lane_needs(plan, sched, layers))
    n_pins = len(pins.calls)
    for k, dev in enumerate(layers):
        dev.pinned_ahead = ahead.lane(k)
        dev.start(ahead.shared["maps"], int(sched.vt_size))
        assert np.array_equal(dev.maps, np.concatenate([fs.rimap, fs.rjmap]))
        for sid, st in enumerate(sched.stages):
            if int(plan.stage_device[sid]) != k:
                continue
            s0, s1 = st.s_range
            h = dev.begin_stage(st, ahead.shared["s_index"][s0:s1],
                                ahead.shared["s_value"][s0:s1], [])
            assert np.array_equal(h["sidx"][:s1 - s0], fs.s_index[s0:s1])
            assert np.array_equal(h["sval"][:s1 - s0], vals[s0:s1])
            assert h["host"].nbytes == max(int(st.ntasks), 1) * TASK_BYTES
            lane = ahead.lane(k)
            assert lane.block.ctypes.data <= h["host"].ctypes.data < (
                lane.block.ctypes.data + lane.block.nbytes)
    assert len(pins.calls) == n_pins
    assert ahead.info()["during_run"]["allocations"] == 0


def test_bench_counts_cupy_pins_while_the_devices_enqueue():
    """bench/multi_gpu.py's pinned column: ``info['pinned_ahead']`` and the CuPy
    allocations that began between the first device thread's start and the last
    one's stages enqueued (a counter's log stands in for CuPy's)."""
    from conftest import load_bench
    bench = load_bench("multi_gpu.py", "multi_gpu_bench_pinned")
    counter = object.__new__(bench.PinnedCounter)
    counter._lock = threading.Lock()
    t = 100.0
    counter.log = [(t + 0.01, 0.02, 1 << 20, "MainThread"),       # before the threads
                   (t + 0.30, 0.10, 4 << 20, "gpuqr-device-1"),   # while they enqueue
                   (t + 0.90, 0.01, 1 << 10, "MainThread")]       # after
    info = {"pinned_ahead": {"bytes": 5e8, "pinned_now_bytes": 0, "seconds": 0.001,
                             "during_run": {"allocations": 0, "bytes": 0}},
            "devices": {"devices": [{"timeline_seconds": (0.05, 0.6, 0.8)},
                                    {"timeline_seconds": (0.06, 0.5, 0.7)}]},
            "seconds": {"total": 1.0}}
    got = bench._pinned_of(info, counter, t)
    assert got["cupy_while_enqueueing"]["allocations"] == 1
    assert got["cupy_while_enqueueing"]["threads"] == ["gpuqr-device-1"]
    assert got["cupy_in_call"]["allocations"] == 3
    text = bench.pinned_text(got)
    assert text.startswith("500 (0) MB") and "lib 0" in text and "CuPy 1 (4 MB" in text
    assert bench.pinned_text(bench._pinned_of({"devices": {"devices": [
        {"timeline_seconds": (0, 1, 1)}]}}, None, t)).startswith("nothing ahead")


def test_bench_public_row_reads_the_gpus_a_call_took():
    """bench/multi_gpu.py's public row: the GPUs a public call ran on, from its plan's
    reasons (devices='auto' may take fewer than the run's GPUs); one without them."""
    from conftest import load_bench
    bench = load_bench("multi_gpu.py", "multi_gpu_bench_public")
    assert bench.gpus_used({"reasons": ["auto: GPU (intensity 9 >= 1)",
                                        "GPUs [0, 1]: modelled 0.232 s on 2: 2 GPUs"]}) == 2
    assert bench.gpus_used({"reasons": ["GPUs [0, 1, 2, 3]: 4 device(s) requested"]}) == 4
    assert bench.gpus_used({"reasons": ["one GPU (GpuqrOptions.devices is None)"]}) == 1
    assert bench.gpus_used({}) == 1


def test_release_pinned_memory_gives_the_kept_blocks_back(monkeypatch):
    """The public release: the bytes of the blocks kept for later calls, none
    kept afterwards, 0 where none were."""
    import sys

    import scipy_gpuqr
    monkeypatch.setattr(pa, "_KEPT", pa._KeptBlocks())
    monkeypatch.setattr(pa, "_physical_bytes", lambda: 1 << 34)
    assert "release_pinned_memory" in scipy_gpuqr.__all__
    assert scipy_gpuqr.release_pinned_memory() == 0
    pa._KEPT.give_back([np.zeros(3 << 20, np.uint8), np.zeros(1 << 20, np.uint8)])
    assert pa.kept_pinned_bytes() == 4 << 20
    freed = []
    fake = types.SimpleNamespace(get_default_pinned_memory_pool=lambda: types.SimpleNamespace(
        free_all_blocks=lambda: freed.append(1)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert scipy_gpuqr.release_pinned_memory() == 4 << 20
    assert pa.kept_pinned_bytes() == 0 and freed == [1]


# -- the first call's lanes with the shared part; the pattern parts kept -------------------

@pytest.mark.parametrize("k", [2, 3])
def test_lane_bound_covers_the_schedules_lanes(k):
    """The lanes' bound known before the schedule (:func:`lane_bound`) is at least
    what each layer's stages ask for once it is built (:func:`lane_needs`)."""
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS, dense_front_mask
    from scipy_gpuqr._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE
    for name, A in _cases():
        an = analyze(A)
        plan = map_devices(an, k)
        layers = [_PinningLayer(32, 3) for _ in range(k)]
        for tile, dense_flops in ((32, None), (DEFAULT_TILE, DEFAULT_DENSE_FLOPS), (8, 0.0)):
            sched = build_schedule(an, tile=tile, plan=plan.stage_plan(),
                                   dense_flops=dense_flops)
            bound = pa.lane_bound(an, plan, layers, tile=tile, bundle=DEFAULT_BUNDLE,
                                  pipelining=True, dense=dense_front_mask(an, dense_flops))
            need = lane_needs(plan, sched, layers)
            assert all(b >= n > 0 for b, n in zip(bound, need)), (name, tile, bound, need)


def test_lane_bound_kept_for_later_calls(monkeypatch):
    """A later call of the pattern, plan and tunables finds the bound made before
    (a repeated call's pinning worker does not count the records again); another
    plan counts them."""
    made = []
    real = pa._lane_bound
    monkeypatch.setattr(pa, "_lane_bound", lambda *a: made.append(1) or real(*a))
    monkeypatch.setattr(pa, "_BOUNDS", pa.PerPattern(8, 1 << 20, lambda v: 64))
    A = grid3d_least_squares(7).astype(np.float64)
    layers = [_PinningLayer(32, 3) for _ in range(3)]
    got = [pa.lane_bound(analyze(A), map_devices(analyze(A), k, cache=False), layers[:k],
                         tile=32, bundle=4, pipelining=True) for k in (2, 2, 3, 2)]
    assert len(made) == 2 and got[0] == got[1] == got[3] and len(got[2]) == 3


def test_a_first_call_pins_one_block(pins, monkeypatch):
    """A first call pins its lanes with the shared part, in one allocation made
    while the schedule is built (none after it); lanes past their bound are
    pinned after the schedule as before, with the same answer."""
    for name, A in _cases():
        an = analyze(A)
        plain = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(3)],
                                    device_speeds=None)
        pa.release_kept_pinned()
        pins.calls.clear()
        many = multi_gpu_factorize(A, an, layers=[_PinningLayer(32, 3, pins=pins)
                                                  for _ in range(3)], device_speeds=None)
        info = many.info["pinned_ahead"]
        assert np.array_equal(many.R.toarray(), plain.R.toarray()), name
        assert len(pins.calls) == 1 and info["lanes_in_shared"], (name, pins.calls)
        assert info["during_run"]["allocations"] == 0
        assert info["block_bytes"] == info["pinned_now_bytes"] >= info["bytes"]
    # a bound too small: the lanes get a block of their own after the schedule
    pa.release_kept_pinned()
    pins.calls.clear()
    monkeypatch.setattr(md, "lane_bound", lambda *a, **k: [PINNED_ALIGN] * 3)
    A = grid3d_least_squares(7).astype(np.float64)
    an = analyze(A)
    plain = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(3)],
                                device_speeds=None)
    many = multi_gpu_factorize(A, an, layers=[_PinningLayer(32, 3, pins=pins)
                                              for _ in range(3)], device_speeds=None)
    info = many.info["pinned_ahead"]
    assert np.array_equal(many.R.toarray(), plain.R.toarray())
    assert len(pins.calls) == 2 and not info["lanes_in_shared"]
    assert info["during_run"]["allocations"] == 0


def test_a_repeated_call_fills_no_pattern_part_again(pins):
    """The maps and S indices are filled into the shared block once per pattern:
    a later call of the same analysis' fronts, given the kept block that holds
    them, fills only the S values (new values too: R is the new matrix's);
    another pattern in that block, or another front structure, fills them
    again. R is plain NumPy layers' bit for bit at every call."""
    A = grid3d_least_squares(7).astype(np.float64)
    B = grid3d_least_squares(5).astype(np.float64)
    an, bn = analyze(A), analyze(B)
    A2 = A.copy()
    A2.data = A2.data * 1.5 - 0.25
    every = ["maps", "s_index", "s_value"]

    def call(M, anl):
        plain = multi_gpu_factorize(M, anl, layers=[NumpyDevice(32, 3) for _ in range(2)],
                                    device_speeds=None)
        got = multi_gpu_factorize(M, anl, layers=[_PinningLayer(32, 3) for _ in range(2)],
                                  device_speeds=None)
        assert np.array_equal(got.R.toarray(), plain.R.toarray())
        assert got.info["pinned_ahead"]["during_run"]["allocations"] == 0
        return got.info["pinned_ahead"]["filled"]

    assert call(A, an) == every
    assert call(A, an) == ["s_value"]
    assert call(A2, an) == ["s_value"]              # the same pattern, new values
    assert call(A, analyze(A)) == ["s_value"]       # the analysis cache's: same fronts
    assert call(B, bn) == every                     # the kept block now holds B's
    assert call(A, an) == every
    assert call(A, an) == ["s_value"]
    assert call(A, analyze(A, cache=False)) == every    # other fronts, equal or not
    pa.release_kept_pinned()
    assert call(A, an) == every                     # a fresh block


class _FakeStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_event(self, ev):
        pass

    def synchronize(self):
        pass


class _HostArr(np.ndarray):
    """A 'device' array: ``set`` and ``get`` as CuPy's, done at once."""

    def set(self, host, stream=None):
        self[...] = np.asarray(host).reshape(self.shape)

    def get(self, stream=None, out=None, blocking=True):
        out[...] = self
        return out


def _fake_copy_device(slot_bytes):
    ev = types.SimpleNamespace(record=lambda stream=None: None, synchronize=lambda: None)
    cp = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext(),
                                   Event=lambda disable_timing=True: ev),
        empty=lambda n, dtype=np.float64: np.zeros(int(n), dtype=dtype).view(_HostArr))
    return types.SimpleNamespace(cp=cp, dtype=np.dtype(np.float64), stream=_FakeStream(),
                                 copy_stream=_FakeStream(), device_id=0,
                                 r_copy_slot_bytes=slot_bytes, r_copy_min_chunk_bytes=8)


def test_cupy_r_copies_of_one_device_take_its_staging_in_turn(monkeypatch):
    """Two stages' R copiers (:class:`CupyRCopy`, over a CuPy stand-in whose copies
    land at once) on one staging in turn: the second stage's copier, opened
    while the first still has a range in a slot that its worker has not read
    out yet, fills the slots only after the first ended, so each stage's values
    reach its sink unchanged. A copier given a locked :class:`PinnedStaging`
    (the one-GPU engine's) unlocks it when it ends."""
    from scipy_gpuqr._engine.gpu import rcopy
    monkeypatch.setattr(rcopy, "take_rows",
                        lambda pool, idx, out: out.__setitem__(Ellipsis, pool[np.asarray(idx)]))
    dev = _fake_copy_device(32)                     # slots of 4 values
    block = np.zeros(64, dtype=np.uint8)
    turns = StagingTurns(PinnedStaging(32, slots=[block[:32], block[32:]]))
    rng = np.random.default_rng(5)
    pools = [rng.standard_normal(40).view(_HostArr) for _ in range(2)]
    index = [rng.permutation(40)[:16].astype(np.int64) for _ in range(2)]
    got = [np.full(16, np.nan), np.full(16, np.nan)]

    def sink(i):
        return lambda first, vals: got[i].__setitem__(slice(first, first + len(vals)), vals)

    final = np.array([4, 16], dtype=np.int64)
    ev = dev.cp.cuda.Event()
    first = rcopy.CupyRCopy(dev, pools[0], index[0], turns.turn(), lambda: final,
                            sink=sink(0))
    first.q.put((0, ev))            # its first range into slot 0, not read out yet
    time.sleep(0.1)
    second = rcopy.CupyRCopy(dev, pools[1], index[1], turns.turn(), lambda: final,
                             sink=sink(1))
    second.q.put((0, ev))
    second.launches_done()
    time.sleep(0.2)                 # time for the second's worker (it must wait)
    first.launches_done()
    first.result()
    second.result()
    for i in range(2):
        assert np.array_equal(got[i], pools[i][index[i]]), i
    one = PinnedStaging(32, slots=[block[:32], block[32:]])
    one.lock.acquire()
    out = rcopy.CupyRCopy(dev, pools[0], index[0], one, lambda: final)
    out.launches_done()
    assert np.array_equal(out.result(), pools[0][index[0]])
    assert not one.lock.locked()
