"""The CUDA backend of a split dense front, its order of operations checked without a GPU.

:class:`~scipy_gpuqr._engine.gpu.split_front.CupySplit` runs unchanged over
the stand-in of ``tests/_stream_sim.py``: every copy, panel, GEMM update and
memset becomes a task on its stream, ordered as CUDA orders it (streams,
events, ``wait_event``; a cuBLAS handle's GEMMs on the stream it was given,
a handle's workspace written by each of its GEMMs). For block owners with a
block of the main device after others' (the pattern of ch7-8-b3's root,
whose split differed from one GPU on two H200) no two tasks on different
streams touch the same bytes unordered, and every order the graph allows
gives the one-device dense path's front and ``T`` bit for bit. The checks
find the races they are meant to find: a look-ahead that does not wait for
its block, the bulk and the chain on one cuBLAS handle, and the pattern of
the GPU test that failed (a pool zeroed on the legacy default stream while
the front is uploaded on the layer's stream).
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from _stream_sim import FakeLayer, Sim, array_region, fake_cupy, install
from scipy_gpuqr._engine.dense_front import factorize_numpy, panels_of
from scipy_gpuqr._engine.split_front import run_split
from scipy_gpuqr._schedule.dense import DenseModel
from scipy_gpuqr._schedule.dense_split import SplitModel, block_owners
from test_multi_device_split import _front

#: ch7-8-b3's root (49340 x 9375) over two devices: its block owners by the model
CH7_OWNERS = "0000000001111101111111111101111111111"


def _owners(how, fm, fn, stair, nb, k):
    nblk = -(-fn // nb)
    if how == "model":
        return block_owners(fm, fn, stair, k, SplitModel(dense=DenseModel(panel=nb),
                                                         min_columns=1))
    if how == "cyclic":                 # as the GPU test: the main device's blocks 2, 4, ...
        return np.array([0, 0] + [c % k for c in range(2, nblk)])
    own = np.array([int(c) for c in CH7_OWNERS])
    assert len(own) == nblk
    return own


def _build(monkeypatch, how, ids, lean, *, pool_on_null=False, shape=(300, 190), nb=16,
           handle_workspace=True, workers=False):
    """The split enqueued over fake layers: (sim, front, backend, one-device front and T);
    ``workers``: each device's steps enqueued by a thread of its own."""
    sim = Sim()
    cp = fake_cupy(sim)
    install(sim, monkeypatch, handle_workspace)
    from scipy_gpuqr._engine.gpu.split_front import CupySplit
    fm, fn = shape
    Fh, stair = _front(np.random.default_rng(fm + fn), fm, fn)
    panels = panels_of(fm, fn, stair, nb)
    F1 = Fh.copy()
    T1 = factorize_numpy(F1, panels, nb)
    own = _owners(how, fm, fn, stair, nb, len(ids))
    layers = [FakeLayer(cp, i) for i in ids]
    main = layers[0]
    if pool_on_null:                    # the legacy default stream (the GPU test's pattern)
        pool = cp.zeros(fm * fn + 7)
    else:
        with main.stream:
            pool = cp.zeros(fm * fn + 7)
    F2 = pool[7:].reshape(fm, fn)

    def upload():
        F2[...] = Fh
    sim.task(main.stream, [], [array_region(F2)], upload, "upload")
    ready = cp.cuda.Event()
    ready.record(main.stream)
    be = CupySplit(main, layers[1:], F2, panels, nb, own, ready, lean=lean)
    be.prepare()
    if workers:
        ex = [None] + [ThreadPoolExecutor(1) for _ in range(1, int(own.max()) + 1)]
        try:
            run_split(be, panels, nb, fn, own, workers=ex)
        finally:
            for e in ex[1:]:
                e.shutdown(wait=True)
    else:
        run_split(be, panels, nb, fn, own)
    main.stream.wait_event(be.done)
    return sim, F2, be, F1, T1


@pytest.mark.parametrize("ids, how", [((0, 0), "model"), ((0, 0), "cyclic"),
                                      ((0, 1), "model"), ((0, 1), "cyclic"),
                                      ((0, 1, 2), "model"), ((0, 1, 2), "cyclic"),
                                      ((0, 1), "ch7")])
@pytest.mark.parametrize("lean", [True, False])
def test_cuda_split_order_has_no_race(monkeypatch, ids, how, lean):
    shape = (900, 37 * 16 - 5) if how == "ch7" else (300, 190)
    sim, F2, be, F1, T1 = _build(monkeypatch, how, ids, lean, shape=shape)
    races = sim.races()
    assert races == [], [(a.label, a.stream.name, b.label, b.stream.name) for a, b, _ in races]
    sim.run()                           # enqueue order: the one-device answer, bit for bit
    assert np.array_equal(np.asarray(F2), F1)
    assert np.array_equal(np.asarray(be.T), T1)
    sim, F2, be, _, _ = _build(monkeypatch, how, ids, lean, shape=shape)
    sim.run(seed=len(ids) + lean)       # another order the streams allow: the same
    assert np.array_equal(np.asarray(F2), F1)


@pytest.mark.parametrize("ids, how", [((0, 1), "model"), ((0, 1, 2), "cyclic"),
                                      ((0, 1, 2, 3), "cyclic"), ((0, 0, 1), "model"),
                                      ((0, 1), "ch7")])
@pytest.mark.parametrize("lean", [True, False])
def test_cuda_split_on_device_threads_has_no_race(monkeypatch, ids, how, lean):
    """Each device's calls enqueued by a thread of its own (the stand-in's current
    device and stream per thread, as CUDA's): no race, and the one-device front and
    ``T`` bit for bit in the enqueue order and in another order the streams allow."""
    shape = (900, 37 * 16 - 5) if how == "ch7" else (300, 190)
    sim, F2, be, F1, T1 = _build(monkeypatch, how, ids, lean, shape=shape, workers=True)
    races = sim.races()
    assert races == [], [(a.label, a.stream.name, b.label, b.stream.name) for a, b, _ in races]
    sim.run()
    assert np.array_equal(np.asarray(F2), F1)
    assert np.array_equal(np.asarray(be.T), T1)
    sim, F2, be, _, _ = _build(monkeypatch, how, ids, lean, shape=shape, workers=True)
    sim.run(seed=len(ids) + 2 * lean)
    assert np.array_equal(np.asarray(F2), F1)


def test_device_threads_without_the_lookaheads_wait_race(monkeypatch):
    """The check can fail: when the main device's thread does not wait (on the host)
    for a slow device's thread to enqueue the block's copy back, the look-ahead
    finds no event to wait for and races with that copy."""
    from scipy_gpuqr._engine import split_front as smod
    from scipy_gpuqr._engine.gpu import split_front as mod
    orig_steps, orig_back = smod.split_steps, mod.CupySplit.to_main

    def careless(*args):
        return [s._replace(needs=()) if s.name == "lookahead" else s for s in orig_steps(*args)]

    def slow_back(self, d, c):
        time.sleep(0.01)
        orig_back(self, d, c)
    monkeypatch.setattr(smod, "split_steps", careless)
    monkeypatch.setattr(mod.CupySplit, "to_main", slow_back)
    sim, F2, be, F1, _ = _build(monkeypatch, "cyclic", (0, 1), True, workers=True)
    assert any("update" in a.label + b.label for a, b, _ in sim.races())


def test_a_lookahead_without_its_wait_is_found(monkeypatch):
    """The check can fail: a look-ahead that does not wait for its block to come
    back races with the block's copy, and some order gives another front."""
    from scipy_gpuqr._engine.gpu import split_front as mod
    orig = mod.CupySplit.lookahead

    def careless(self, p, c):
        self.ev_ready.pop(c, None)
        orig(self, p, c)
    monkeypatch.setattr(mod.CupySplit, "lookahead", careless)
    sim, F2, be, F1, _ = _build(monkeypatch, "cyclic", (0, 1), True)
    assert any("update" in a.label + b.label for a, b, _ in sim.races())
    sim.run(key=lambda t: (t.stream.name.endswith("@1"), t.id))    # the other device late
    assert not np.array_equal(np.asarray(F2), F1)


def test_one_cublas_handle_on_two_streams_is_found(monkeypatch):
    """Without handles of their own (lean=False before this fix), the bulk's and a
    helper's GEMMs went through the chain's (the thread's) handle on other
    streams: its workspace written by GEMMs running at once."""
    from scipy_gpuqr._engine.gpu import split_front as mod
    monkeypatch.setattr(mod.CupySplit, "_private", lambda self, work: work)
    sim, *_ = _build(monkeypatch, "cyclic", (0, 0), False)
    races = sim.races()
    assert races and all("thread handle" in a.label and "thread handle" in b.label
                         for a, b, _ in races)


def test_gpu_test_pool_zeroed_on_the_default_stream_races():
    """The failing GPU test zeroed its pool on the legacy default stream (behind the
    one-device factorization enqueued there) and uploaded the front on the
    layer's non-blocking stream: the memset may land after the upload, and the
    split then factorizes a front whose leading rows are zero (the H200 run's
    front: its first rows zero)."""
    mp = pytest.MonkeyPatch()
    try:
        sim, F2, be, F1, _ = _build(mp, "cyclic", (0, 0), True, pool_on_null=True)
        races = sim.races()
        assert any(a.label == "memset" and a.stream.name == "null" and b.label == "upload"
                   for a, b, _ in races)
        sim.run(key=lambda t: (t.label != "upload", t.id))      # the upload, then the memset
        got = np.asarray(F2)
        assert not np.array_equal(got, F1) and not got[0].any()
        sim, *_ = _build(mp, "cyclic", (0, 0), True, pool_on_null=False)
        assert sim.races() == []
    finally:
        mp.undo()


def _build_call(monkeypatch, ids, lean, shapes, *, nb=16, workers=False):
    """Several split fronts of one call enqueued over fake layers through one
    :class:`SplitResources`, one after the other as the main device's thread does
    (each front in a pool of its own, uploaded on the main layer's stream, which
    does not wait for the previous front's end); returns (sim, resources, [(front,
    backend, one-device front, T)])."""
    sim = Sim()
    cp = fake_cupy(sim)
    install(sim, monkeypatch)
    from scipy_gpuqr._engine.gpu.split_front import CupySplit, SplitResources
    made = []
    orig_gemm = CupySplit._gemm
    monkeypatch.setattr(CupySplit, "_gemm",
                        lambda self, key, s: made.append(key) or orig_gemm(self, key, s))
    layers = [FakeLayer(cp, i) for i in ids]
    main = layers[0]
    res = SplitResources(cp)
    out = []
    ex = [None] + [ThreadPoolExecutor(1) for _ in ids[1:]] if workers else None
    try:
        for i, (fm, fn) in enumerate(shapes):
            Fh, stair = _front(np.random.default_rng(fm + fn + i), fm, fn)
            panels = panels_of(fm, fn, stair, nb)
            F1 = Fh.copy()
            T1 = factorize_numpy(F1, panels, nb)
            own = _owners("model" if i % 2 else "cyclic", fm, fn, stair, nb, len(ids))
            with main.stream:
                pool = cp.zeros(fm * fn + 3)
            F2 = pool[3:].reshape(fm, fn)
            sim.task(main.stream, [], [array_region(F2)],
                     lambda F2=F2, Fh=Fh: F2.__setitem__(Ellipsis, Fh), "upload")
            ready = cp.cuda.Event()
            ready.record(main.stream)
            be = CupySplit(main, layers[1:], F2, panels, nb, own, ready, lean=lean,
                           resources=res)
            be.prepare()
            run_split(be, panels, nb, fn, own,
                      workers=None if ex is None else ex[:int(own.max()) + 1])
            out.append((F2, be, F1, T1))
    finally:
        for e in ex[1:] if ex else ():
            e.shutdown(wait=True)
    return sim, res, made, out


@pytest.mark.parametrize("ids", [(0, 1), (0, 1, 2), (0, 0, 1)])
@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("workers", [False, True])
def test_split_fronts_of_a_call_share_streams_and_buffers(monkeypatch, ids, lean, workers):
    """The split fronts of one call share their streams, cuBLAS handles and work
    buffers (made by the first front, grown by a larger one, kept by a smaller
    one): each is made once per call, no two tasks race (a front's streams start
    after the previous front's end), and every front is the one-device dense
    path's bit for bit, in the enqueue order and in another order the streams
    allow. (Each front's streams also wait for the previous front's end; the
    streams' order alone, every stream of a front ending before its end, already
    keeps the fronts apart here.)"""
    shapes = [(300, 190), (420, 260), (200, 120)]
    sim, res, made, out = _build_call(monkeypatch, ids, lean, shapes, workers=workers)
    k = len(ids)
    assert len(res.streams) == 2 * k            # chain, bulk; compute, copy per helper
    assert len({s for s in res.streams.values()}) == 2 * k
    if lean:
        assert len(res.gemms) == k + 1          # chain, bulk and each helper's
        assert len(made) == len(shapes) * (k + 1)
    else:
        # a handle for the bulk's and each helper's work, and for each larger one made
        grown = sum(getattr(o, "own", None) is not None for o in res.kept)
        assert res.gemms == [] and len(res.closers) == k + grown
    assert res.kept, "the larger front made no larger buffer"
    races = sim.races(limit=5)
    assert races == [], [(a.label, a.stream.name, b.label, b.stream.name) for a, b, _ in races]
    sim.run()
    for F2, be, F1, T1 in out:
        assert np.array_equal(np.asarray(F2), F1)
        assert np.array_equal(np.asarray(be.T), T1)
    assert out[0][1].T is not out[1][1].T       # each front keeps its own T
    sim, res, made, out = _build_call(monkeypatch, ids, lean, shapes, workers=workers)
    sim.run(seed=k + 2 * lean + workers)
    for F2, be, F1, T1 in out:
        assert np.array_equal(np.asarray(F2), F1)
    res.close()
    assert res.streams == {} and res.gemms == [] and res.done is None


def test_one_buffer_for_two_devices_races(monkeypatch):
    """The check can fail: shared buffers kept per device of the split (its place and
    id); handed to two helpers on one GPU under one key, their blocks' arrays are
    one memory written by both, and some order gives another front."""
    from scipy_gpuqr._engine.gpu.split_front import SplitResources
    orig = SplitResources.buffer

    def careless(self, cp, key, shape, dtype):
        return orig(self, cp, ("any",) + key[1:], shape, dtype)
    monkeypatch.setattr(SplitResources, "buffer", careless)
    sim, res, _, out = _build_call(monkeypatch, (0, 0, 0), True, [(300, 190)])
    races = sim.races(limit=3)
    assert races and all(a.stream is not b.stream for a, b, _ in races)
    wrong = 0
    for seed in range(4):               # some order the streams allow gives another front
        sim, res, _, out = _build_call(monkeypatch, (0, 0, 0), True, [(300, 190)])
        sim.run(seed=seed)
        wrong += not np.array_equal(np.asarray(out[0][0]), out[0][2])
    assert wrong
