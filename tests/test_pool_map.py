"""A stage pool mapped chunk by chunk (host logic, NumPy device layer).

Where a memory limit would split a factorization into stages but its fronts
alive at once fit, the engine runs one stage whose pool is backed only where
fronts are alive (:mod:`scipy_gpuqr._engine.pool_map`): the NumPy layer counts
the chunks mapped against its limit and leaves a chunk not mapped NaN, so a
read of it before it is mapped, or after it was given back, shows. The run
has the unlimited run's schedule, so R and ``Q`` are the same bits.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import driver, mapped_stage
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.pool_copy import NumpyPoolCopy, front_finality
from scipy_gpuqr._engine.gpu.solve import build_replay_plan
from scipy_gpuqr._engine.memory import (front_needs, min_budget, plan_for_memory, stage_bytes,
                                        vt_elements)
from scipy_gpuqr._engine.pool_map import (PoolMap, front_lifetimes, part_elements, pool_map,
                                          replay_parts)
from scipy_gpuqr._errors import DeviceOutOfMemory, GpuEngineError
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE, TaskType, factorizes
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_values)

TILE, BUNDLE = 32, 3
CHUNK = 4096


def _needs(an):
    vt = vt_elements(an, tile=TILE, bundle=BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=None)
    return front_needs(an, 8, tile=TILE, vt_elems=vt, dense=None)


@pytest.fixture(scope="module")
def grid9():
    A = random_values(grid3d_least_squares(9), np.random.default_rng(3))
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=None)
    assert ref.info["stages"] == 1
    needs = _needs(an)
    one = plan_for_memory(an, needs, None)
    sched = build_schedule(an, plan=one.plan, dense_flops=None, lazy=True)
    assert sched.stages[0].materialized       # the unlimited run made it
    return A, an, ref, needs, one, sched


def _mapped_limit(an, needs, sched, chunk=CHUNK, slack=0.03):
    """A limit the mapped stage fits a little over (and the one-stage pool does not)."""
    st = sched.stages[0]
    pm = pool_map(an.fronts, st, 8, chunk)
    other = stage_bytes(sched, an, needs, 8, mapped={0: 0})[0]
    return int((needs.fixed + other + pm.peak_bytes()) * (1 + slack))


def _forget_maps(sched):
    """The schedule's kept pool maps and mapped-stage plans dropped."""
    for k in [k for k in list(sched.extras)
              if type(k) is tuple and k[:1] in (("pool_map",), ("mapped_stage",))]:
        sched.extras.pop(k, None)


def _device(limit, chunk=CHUNK):
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=limit)
    dev.map_chunk_bytes = chunk
    return dev


def _same_answers(g, ref, A):
    assert g.R.shape == ref.R.shape
    np.testing.assert_array_equal(g.R.toarray(), ref.R.toarray())
    b = np.cos(np.arange(A.shape[0]))
    np.testing.assert_array_equal(g.qt_matmul(b), ref.qt_matmul(b))
    y = np.sin(np.arange(A.shape[0]))
    np.testing.assert_array_equal(g.q_matmul(y), ref.q_matmul(y))


# -- the plan ---------------------------------------------------------------------------------
def test_front_lifetimes_hold_every_record_that_touches_a_front(grid9):
    A, an, ref, needs, one, sched = grid9
    fs, st = an.fronts, sched.stages[0]
    lo, hi = front_lifetimes(fs, st)
    t = st.tasks
    lp = np.asarray(st.launch_ptr)
    launch = np.repeat(np.arange(len(lp) - 1), np.diff(lp))
    for r in range(len(t)):
        f = int(t["front"][r])
        if f < 0:
            continue
        touched = [f]
        if t["type"][r] == int(TaskType.PACK_ASSEMBLE) and fs.parent[f] >= 0:
            touched.append(int(fs.parent[f]))
        for g in touched:
            assert lo[g] <= launch[r] <= hi[g], (r, g)
    fin = front_finality(fs, st)        # the pool's copy sends a front inside its life
    off = np.asarray(st.foff)
    for a, last in zip(fin.start.tolist(), fin.last.tolist()):
        f = int(np.flatnonzero(off == a)[0])
        assert lo[f] <= max(last, 0) <= hi[f]


@pytest.mark.parametrize("chunk", [CHUNK, 4 * CHUNK])
def test_chunks_cover_the_fronts_alive_and_the_peak_is_counted(grid9, chunk):
    A, an, ref, needs, one, sched = grid9
    fs, st = an.fronts, sched.stages[0]
    pm = pool_map(fs, st, 8, chunk)
    lo, hi = front_lifetimes(fs, st)
    c = pm.chunk
    assert pm.nchunks * c >= st.pool_size
    for f in range(fs.nfronts):
        size = int(fs.fm[f]) * int(fs.fn[f])
        if size == 0 or st.foff[f] < 0:
            continue
        for k in range(int(st.foff[f]) // c, (int(st.foff[f]) + size - 1) // c + 1):
            assert pm.first[k] <= lo[f] and pm.last[k] >= hi[f], (f, k)
    assert pm.first[0] == 0 and pm.last[0] == pm.nlaunch - 1     # the kernels' null address
    live = [sum(1 for k in range(pm.nchunks) if 0 <= pm.first[k] <= L <= pm.last[k])
            for L in range(pm.nlaunch)]
    assert pm.peak() == max(live)
    assert pm.peak(5) >= pm.peak() and pm.peak_bytes() == pm.peak() * chunk
    assert pm.peak_bytes() < st.pool_size * 8        # fronts die before the root lives


def test_pool_map_refuses_odd_chunks_and_carried_blocks(grid9):
    A, an, ref, needs, one, sched = grid9
    with pytest.raises(ValueError):
        pool_map(an.fronts, sched.stages[0], 8, 4100)
    staged = build_schedule(an, plan=plan_for_memory(an, needs, None, 20000).plan,
                            dense_flops=None, lazy=False)
    st = next(s for s in staged.stages if s.carried)
    with pytest.raises(ValueError):
        pool_map(an.fronts, st, 8, CHUNK)


def test_replay_parts_fit_their_room(grid9):
    A, an, ref, needs, one, sched = grid9
    fs, st = an.fronts, sched.stages[0]
    t = st.tasks
    lp = np.asarray(st.launch_ptr)
    launch = np.repeat(np.arange(len(lp) - 1), np.diff(lp))
    kk = factorizes(t["type"])
    small = 1 << 10
    for room in (1 << 17, 1 << 18, 1 << 20):
        parts = replay_parts(fs, st, room, TILE, small)
        if parts is None:
            continue
        assert parts[0] == 0 and all(a < b for a, b in zip(parts, parts[1:]))
        ends = parts[1:] + [st.nlaunch]
        counted = part_elements(fs, st, parts, TILE, small)
        for i, (a, b) in enumerate(zip(parts, ends)):
            sel = kk & (launch >= a) & (launch < b)
            held = 0
            for f in np.unique(t["front"][sel]).tolist():
                fm, fn = int(fs.fm[f]), int(fs.fn[f])
                width = min(fn, -(-fm // TILE) * TILE)
                held += fm * fn if (width >= fn or fm * fn <= small) else fm * width
            assert held <= counted[i] <= room, (room, a, b)
    assert replay_parts(fs, st, 10, TILE, small) is None


def test_replay_by_launch_with_one_part_is_the_plain_plan(grid9):
    A, an, ref, needs, one, sched = grid9
    fronts = [(slots, tasks, ref._front_launch[f], *ref._front_loc[f])
              for f, (slots, _, tasks) in enumerate(ref._fronts)]
    a = build_replay_plan(A.shape[0], fronts, tile=TILE, bundle=BUNDLE, launch_base=[0])
    b = build_replay_plan(A.shape[0], fronts, tile=TILE, bundle=BUNDLE, launch_base=[0],
                          by_launch=True)
    np.testing.assert_array_equal(a.level_stage, b.level_stage)
    c = build_replay_plan(A.shape[0], fronts, tile=TILE, bundle=BUNDLE, launch_base=[0, 20],
                          by_launch=True)
    keys = np.unique(np.concatenate([x for x in ref._front_launch if len(x)]))
    np.testing.assert_array_equal(c.level_stage, (keys >= 20).astype(np.int64))


# -- the engine -------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [CHUNK, 4 * CHUNK])
def test_mapped_stage_runs_as_one_stage_with_the_same_bits(grid9, chunk):
    A, an, ref, needs, one, sched = grid9
    limit = _mapped_limit(an, needs, sched, chunk)
    assert limit < one.peak                     # one stage of the whole pool would not fit
    dev = _device(limit, chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = gpu_factorize(A, an, device=dev, dense_flops=None)
    info = g.info
    assert info["backend"] == "gpu" and info["stages"] == 1 and info["restaged"] == 0
    assert info["launches"] == ref.info["launches"]
    pm, plan = info["pool_map"], info["memory"]["pool_map"]
    assert pm is not None and plan is not None and pm["chunk_bytes"] == chunk
    assert pm["peak_chunks"] <= pm["cap_chunks"] == plan["cap_chunks"]
    assert 0 < pm["maps"] <= pm["chunks"]
    assert pm["unmaps"] > 0 and pm["peak_bytes"] < sched.stages[0].pool_size * 8
    assert not info["last_pool_on_device"]
    assert dev.peak <= limit and info["memory"]["planned_peak"] <= limit
    _same_answers(g, ref, A)
    assert plan["replay_parts"] == len(g._launch_base)
    g.free()
    assert dev.held == 0


def test_a_limit_the_mapped_stage_misses_stages_as_before(grid9):
    A, an, ref, needs, one, sched = grid9
    limit = _mapped_limit(an, needs, sched, CHUNK, slack=-0.03)
    dev = _device(limit)
    g = gpu_factorize(A, an, device=dev, dense_flops=None)
    assert g.info["stages"] > 1 and g.info["pool_map"] is None
    assert g.info["memory"]["pool_map"] is None and dev.peak <= limit
    np.testing.assert_allclose(g.R.toarray(), ref.R.toarray(), rtol=0,
                               atol=1e-12 * abs(ref.R).max())
    g.free()


def test_switched_off_stages_as_before(grid9, monkeypatch):
    A, an, ref, needs, one, sched = grid9
    monkeypatch.setattr(driver, "MAP_POOL", False)
    limit = _mapped_limit(an, needs, sched)
    g = gpu_factorize(A, an, device=_device(limit), dense_flops=None)
    assert g.info["stages"] > 1 and g.info["memory"]["pool_map"] is None
    g.free()


def test_copies_sent_late_are_sent_before_their_chunks_go(grid9):
    """The pool's copy waits for many bytes: a chunk unmapped for room makes it
    send the fronts it holds first (``send_final``)."""
    A, an, ref, needs, one, sched = grid9
    dev = _device(_mapped_limit(an, needs, sched))
    dev.pool_copy_min_bytes = 1 << 40
    g = gpu_factorize(A, an, device=dev, dense_flops=None)
    assert g.info["stages"] == 1 and g.info["pool_map"]["waits"] > 0
    _same_answers(g, ref, A)
    g.free()


def test_a_chunk_mapped_late_shows(grid9, monkeypatch):
    """A plan whose chunks are mapped one launch after their first writer: the
    NumPy layer leaves a chunk NaN until mapped and zeroes it then, so the run
    raises or answers otherwise, never silently the same."""
    A, an, ref, needs, one, sched = grid9
    real = mapped_stage.pool_map

    def early(fs, st, isz, chunk):
        pm = real(fs, st, isz, chunk)
        first = np.where(pm.last > pm.first, pm.first + 1, pm.first)
        return PoolMap(pm.chunk, first, pm.last, pm.nlaunch, pm.itemsize)
    limit = _mapped_limit(an, needs, sched)
    monkeypatch.setattr(mapped_stage, "pool_map", early)
    _forget_maps(sched)
    dev = _device(limit)
    try:
        try:
            g = gpu_factorize(A, an, device=dev, dense_flops=None)
        except GpuEngineError:
            return
        assert g.info["pool_map"] is not None
        assert not np.isfinite(g.R.data).all() or not np.array_equal(g.R.toarray(),
                                                                     ref.R.toarray())
    finally:
        _forget_maps(sched)


def test_out_of_memory_in_the_mapped_stage_falls_back_to_stages(grid9, monkeypatch):
    A, an, ref, needs, one, sched = grid9
    limit = _mapped_limit(an, needs, sched)
    dev = _device(limit)
    calls = []

    def refuse(self, h, chunks):
        calls.append(len(chunks))
        raise DeviceOutOfMemory("Out of memory allocating a chunk (test)")
    monkeypatch.setattr(NumpyDevice, "map_chunks", refuse)
    g = gpu_factorize(A, an, device=dev, dense_flops=None)
    assert calls and g.info["backend"] == "gpu" and g.info["stages"] > 1
    assert g.info["restaged"] == 1 and g.info["memory"]["out_of_memory"]
    assert g.info["memory"]["pool_map"] is None and "mapped" in g.info["memory"]["limited_by"]
    np.testing.assert_allclose(g.R.toarray(), ref.R.toarray(), rtol=0,
                               atol=1e-12 * abs(ref.R).max())
    g.free()
    assert dev.held == 0


def test_a_cold_pattern_is_not_mapped():
    """The first factorization of a pattern under a limit: the one-stage
    schedule's records are not known, so the plan stages as before."""
    A = random_values(chessboard_boundary(4, 5, 2), np.random.default_rng(5))
    an = analyze(A)
    needs = _needs(an)
    limit = (min_budget(an, needs) + plan_for_memory(an, needs, None).peak) // 2
    g = gpu_factorize(A, an, device=_device(limit), dense_flops=None)
    assert g.info["memory"]["pool_map"] is None
    g.free()


def test_mapped_pool_copy_sends_no_gap():
    """A mapped pool's copy never sends fronts not final between final ones
    (their chunks may not be mapped yet)."""
    class St:
        fronts = (0, 2)
        nlaunch = 3
        foff = np.array([0, 10, 20])
        tasks = np.zeros(0)
    fin = type("F", (), {})()
    fin.start, fin.end, fin.last = np.array([0, 10, 20]), np.array([10, 20, 30]), \
        np.array([0, 2, 0])
    pool = np.arange(30, dtype=float)
    c = NumpyPoolCopy(pool, fin)
    c.gap = 0
    c.after_launch(0)
    assert np.isnan(c.host[10:20]).all() and (c.host[:10] == pool[:10]).all()
    c.send_final(2)
    np.testing.assert_array_equal(c.host, pool)


# -- the CUDA layer's address range, over a stand-in driver --------------------------------------
class _FakeDriver:
    """The driver entry points :mod:`~scipy_gpuqr._engine.gpu.vmm` calls, counting."""

    GRAN = 2 << 20

    def __init__(self, fail_create_after=None):
        self.created, self.released, self.mapped, self.freed = 0, 0, {}, []
        self.fail_create_after = fail_create_after

    def cuMemGetAllocationGranularity(self, g, prop, option):
        g._obj.value = self.GRAN
        return 0

    def cuMemAddressReserve(self, ptr, size, align, addr, flags):
        ptr._obj.value = 1 << 40
        return 0

    def cuMemAddressFree(self, ptr, size):
        self.freed.append((ptr, size))
        return 0

    def cuMemCreate(self, h, size, prop, flags):
        if self.fail_create_after is not None and self.created >= self.fail_create_after:
            return 2                        # CUDA_ERROR_OUT_OF_MEMORY
        self.created += 1
        h._obj.value = 100 + self.created
        return 0

    def cuMemRelease(self, h):
        self.released += 1
        return 0

    def cuMemMap(self, ptr, size, off, h, flags):
        assert ptr not in self.mapped
        self.mapped[ptr] = h
        return 0

    def cuMemUnmap(self, ptr, size):
        del self.mapped[ptr]
        return 0

    def cuMemSetAccess(self, ptr, size, desc, count):
        assert ptr in self.mapped and desc._obj.flags == 3
        return 0


def test_mapped_range_reuses_its_allocations_and_gives_all_back(monkeypatch):
    from scipy_gpuqr._engine.gpu import vmm
    fake = _FakeDriver()
    monkeypatch.setattr(vmm, "_driver", lambda: fake)
    chunk = 4 << 20
    r = vmm.MappedRange(0, 10 << 20, chunk)
    assert r.nchunks == 3 and r.size == 3 * chunk
    r.map(0)
    r.map(1)
    r.map(1)                                # mapped already: nothing
    assert fake.created == 2 and len(fake.mapped) == 2
    r.unmap(0)
    r.map(2)                                # the allocation chunk 0 held
    assert fake.created == 2 and r.made == 2
    assert sorted(fake.mapped) == [r.address(1), r.address(2)]
    r.close()
    r.close()
    assert not fake.mapped and fake.released == 2 and len(fake.freed) == 1


def test_mapped_range_out_of_memory_and_odd_chunks(monkeypatch):
    from scipy_gpuqr._engine.gpu import vmm
    fake = _FakeDriver(fail_create_after=1)
    monkeypatch.setattr(vmm, "_driver", lambda: fake)
    r = vmm.MappedRange(0, 8 << 20, 2 << 20)
    r.map(0)
    with pytest.raises(DeviceOutOfMemory):
        r.map(1)
    r.close()
    assert fake.released == 1 and not fake.mapped
    with pytest.raises(DeviceOutOfMemory):
        vmm.MappedRange(0, 8 << 20, 3 << 20)
    monkeypatch.setattr(vmm, "_driver", lambda: None)
    assert not vmm.available() and vmm.granularity(0) == 0


def test_q_replay_reads_the_mapped_stage_in_parts(grid9):
    """``Q``'s replay plan of a mapped stage: its levels' stages are the parts of
    its launches, each part's reflectors packed out of the one host pool take at
    most what the memory plan counted, and the replay over those packs is the
    unlimited run's, bit for bit."""
    from scipy_gpuqr._engine.gpu import solve, trsolve
    from scipy_gpuqr._engine.gpu.reflector_upload import SMALL_FRONT, upload_reflectors
    A, an, ref, needs, one, sched = grid9
    g = gpu_factorize(A, an, device=_device(_mapped_limit(an, needs, sched)), dense_flops=None)
    parts = list(g._launch_base)
    assert g._replay_by_launch and len(parts) > 1 and set(g._host_pools) == set(range(len(parts)))
    plan = solve.plan_of(g)
    keys = np.unique(np.concatenate([x for x in g._front_launch if len(x)]))
    np.testing.assert_array_equal(plan.level_stage,
                                  np.searchsorted(parts, keys, side="right") - 1)
    bound = part_elements(an.fronts, g.schedule.stages[0], parts, TILE, SMALL_FRONT)
    packs = {}
    for sid in range(len(parts)):
        layout = solve._reflector_layout_of(g, sid)
        assert layout.size <= bound[sid], (sid, layout.size, bound[sid])
        packs[sid] = upload_reflectors(g._host_pools[sid], layout, np)
    assert trsolve.replay_upload_bytes(g) == 8 * max(bound)
    ref_plan = solve.plan_of(ref)

    def ref_pools(sid):
        pool = ref._stage_pools.get(sid)
        return pool if pool is not None else ref._host_pools[sid]
    rng = np.random.default_rng(2)
    for trans in (True, False):
        X = rng.standard_normal((A.shape[0], 2))
        Y = X.copy()
        solve.replay(plan, solve.NumpyExecutor(plan, packs.__getitem__, g._device.vt), X, trans)
        solve.replay(ref_plan, solve.NumpyExecutor(ref_plan, ref_pools, ref._device.vt), Y,
                     trans)
        np.testing.assert_array_equal(X, Y)
    g.free()


def test_r_gathered_in_two_parts_once_the_split_is_made(grid9):
    """A pattern's first mapped run makes its R entries' split on a worker; the
    next gathers the entries final by the split launch during the later
    launches (timeline ``h0``..``H0``) and the rest after: the same R."""
    import time
    from scipy_gpuqr._engine.gpu.rlayout import r_layout_cached
    A, an, ref, needs, one, sched = grid9
    limit = _mapped_limit(an, needs, sched)
    gpu_factorize(A, an, device=_device(limit), dense_flops=None).free()
    lay = r_layout_cached(an)
    t0 = time.monotonic()
    while not any(type(k) is tuple and k[:1] == ("mapped_r_split",) for k in list(lay._extras)):
        assert time.monotonic() - t0 < 30, "the split was not made"
        time.sleep(0.05)
    g = gpu_factorize(A, an, device=_device(limit), dense_flops=None)
    marks = [w for w, _ in g.info["timeline"]]
    assert "h0" in marks and "H0" in marks and g.info["stages"] == 1
    _same_answers(g, ref, A)
    g.free()


def test_cuda_layer_maps_zeroes_checks_and_gives_back(monkeypatch):
    """The CUDA layer's chunk calls over a stand-in CuPy and driver: a chunk is
    mapped and zeroed on the stage's stream; unmapping checks it finite on that
    stream, waits for both streams, then unmaps; the range goes with the pool."""
    import types
    from scipy_gpuqr._engine.gpu import device as devmod, vmm
    calls = []

    class Stream:
        def __init__(self, name):
            self.ptr, self.name = name, name

        def synchronize(self):
            calls.append(("sync", self.name))

    class Event:
        def __init__(self, disable_timing=False):
            self.on = None

        def record(self, s):
            self.on = s.name

        def synchronize(self):
            calls.append(("wait", self.on))

    class Flag:
        def __init__(self, bad):
            self.bad = bad

        def get(self, stream=None):
            return np.array([self.bad])

    class Check:
        def enqueue(self, x, stream):
            calls.append(("check", stream.name, len(x)))
            return Flag(int(not np.isfinite(x).all()))

    rt = types.SimpleNamespace(
        memsetAsync=lambda p, v, n, s: calls.append(("memset", p, v, n, s)),
        CUDARuntimeError=RuntimeError)
    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt, Event=Event))
    fake = _FakeDriver()
    monkeypatch.setattr(vmm, "_driver", lambda: fake)
    monkeypatch.setattr(devmod, "finite_check", lambda dtype: Check())
    dev = devmod.CupyDevice.__new__(devmod.CupyDevice)
    dev.cp, dev.dtype, dev.seconds, dev.debug = cp, np.dtype(np.float64), {}, False
    dev.stream, dev.copy_stream = Stream("launch"), Stream("copy")
    dev.device_id, dev.pinned_pools, dev._ranges = 0, 0, {}
    chunk = 2 << 20
    pm = PoolMap(chunk // 8, np.array([0, 1, 1]), np.array([2, 3, 3]), 4, 8)
    rng = vmm.MappedRange(0, 3 * chunk - 8, chunk)
    pool = np.zeros((3 * chunk - 8) // 8)
    dev._ranges[id(pool)] = rng
    h = {"range": rng, "pmap": pm, "flags": [], "pool": pool}
    assert dev.can_map(3 * chunk, chunk) and not dev.can_map(3 * chunk, chunk + 8)
    dev.map_chunks(h, [0, 2])
    assert ("memset", rng.address(0), 0, chunk, "launch") in calls
    assert sorted(rng.handles) == [0, 2]
    calls.clear()
    dev.unmap_chunks(h, [2])
    assert calls[0] == ("check", "launch", (3 * chunk - 8) // 8 - 2 * (chunk // 8))
    assert ("wait", "launch") in calls and ("wait", "copy") in calls
    assert calls.index(("wait", "copy")) > calls.index(calls[0])
    assert sorted(rng.handles) == [0] and len(h["flags"]) == 1 and "unmap_wait" in dev.seconds
    calls.clear()
    dev.release(pool)
    assert ("sync", "launch") in calls and ("sync", "copy") in calls
    assert not dev._ranges and rng.ptr is None and not fake.mapped and fake.released == 2
    rng2 = vmm.MappedRange(0, chunk, chunk)
    dev._ranges[1] = rng2
    dev.vt = dev.maps = None
    dev.close()
    assert rng2.ptr is None and not dev._ranges
