"""A multi-device factorization's pools copied to Q's device before its solves
(:mod:`scipy_gpuqr._engine.gpu.pools_home`).

CPU: a stand-in for CuPy's device arrays, streams and peer copies (what is
copied where, in which order, under which room); GPU (marker ``gpu``, two
GPUs or more): the solves of a factorization over several GPUs give the same
bits with the pools brought home as read where they lie.
"""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import pools_home


class _Dev:
    def __init__(self, fake, i):
        self.fake, self.id = fake, i

    def __enter__(self):
        self.fake.stack.append(self.id)
        return self

    def __exit__(self, *exc):
        self.fake.stack.pop()

    def synchronize(self):
        self.fake.log.append(("sync device", self.id))


class _Arr:
    """A device array: values on the host, the device it lies on."""

    def __init__(self, fake, values, device):
        self.values = values
        self.device = types.SimpleNamespace(id=device)
        self.shape, self.dtype, self.nbytes = values.shape, values.dtype, values.nbytes
        self.data = types.SimpleNamespace(ptr=fake.register(self))


class _FakeCupy:
    """Just what :func:`pools_home.bring_home` and ``available_bytes`` call."""

    class OutOfMemoryError(MemoryError):
        pass

    def __init__(self, free_bytes):
        self.stack, self.log, self.arrays, self.streams = [0], [], {}, {}
        self.free = int(free_bytes)
        self.ndarray = _Arr
        fake = self

        class Stream:
            def __init__(self, non_blocking=False):
                self.device = fake.stack[-1]
                self.ptr = len(fake.streams) + 1000
                fake.streams[self.ptr] = self
                self.waited = []

            def wait_event(self, ev):
                self.waited.append(ev)

            def synchronize(self):
                fake.log.append(("sync stream", self.ptr))

        class Event:
            def __init__(self, disable_timing=False):
                self.stream = None

            def record(self, stream):
                self.stream = stream

        def memcpy_peer_async(dst, dst_id, src, src_id, nbytes, stream):
            a, b = fake.arrays[dst], fake.arrays[src]
            assert a.device.id == dst_id and b.device.id == src_id and nbytes == b.nbytes
            a.values[...] = b.values
            fake.log.append(("copy", src_id, dst_id, nbytes, stream))

        pool = types.SimpleNamespace(used_bytes=lambda: 0, free_bytes=lambda: 0,
                                     get_limit=lambda: 0)
        self.cuda = types.SimpleNamespace(
            Device=lambda i=None: _Dev(fake, fake.stack[-1] if i is None else i),
            Stream=Stream, Event=Event,
            get_current_stream=lambda: "current",
            memory=types.SimpleNamespace(OutOfMemoryError=_FakeCupy.OutOfMemoryError),
            runtime=types.SimpleNamespace(memGetInfo=lambda: (fake.free, 1 << 40),
                                          memcpyPeerAsync=memcpy_peer_async))
        self.get_default_memory_pool = lambda: pool

    def register(self, arr):
        ptr = 4096 * (len(self.arrays) + 1)
        self.arrays[ptr] = arr
        return ptr

    def empty(self, shape, dtype):
        return _Arr(self, np.full(shape, np.nan, dtype=dtype), self.stack[-1])

    def array_on(self, values, device):
        return _Arr(self, np.array(values), device)


def _qr(fake, sizes, home=0):
    """A stand-in factorization: stage ``sid`` of ``sizes[sid] = (elements, device)``."""
    pools = {sid: fake.array_on(np.arange(n, dtype=np.float64) + 100 * sid, d)
             for sid, (n, d) in enumerate(sizes)}
    dev = types.SimpleNamespace(cp=fake, device_id=home)
    return types.SimpleNamespace(_device=dev, _stage_pools=pools, _replay={}, info={})


def test_other_devices_pools_copied_home_once():
    fake = _FakeCupy(free_bytes=1 << 30)
    qr = _qr(fake, [(1000, 3), (3000, 2), (500, 0), (2000, 2)])
    before = {sid: p.values.copy() for sid, p in qr._stage_pools.items()}
    home_pool = qr._stage_pools[2]
    done = pools_home.bring_home(qr)
    assert done["stages"] == [0, 1, 3] and done["left"] == []
    assert done["bytes"] == 8 * (1000 + 3000 + 2000)
    assert qr.info["pools_home"] is done
    assert qr._stage_pools[2] is home_pool                  # on the home device already
    for sid, p in qr._stage_pools.items():
        assert p.device.id == 0 and np.array_equal(p.values, before[sid])
    copies = [e for e in fake.log if e[0] == "copy"]
    assert [c[3] for c in copies] == [8 * 3000, 8 * 2000, 8 * 1000]    # largest first
    assert {c[1] for c in copies} == {2, 3} and all(c[2] == 0 for c in copies)
    # one stream per source device, made on it, each waited for before the call returns
    streams = {c[1]: c[4] for c in copies}
    assert len(set(streams.values())) == 2
    assert {fake.streams[p].device for p in streams.values()} == {2, 3}
    synced = [e[1] for e in fake.log if e[0] == "sync stream"]
    assert sorted(synced) == sorted(streams.values())
    assert ("sync device", 2) in fake.log and ("sync device", 3) in fake.log
    n = len(fake.log)
    assert pools_home.bring_home(qr) is done and len(fake.log) == n     # once


def test_pools_that_do_not_fit_stay_where_they_lie():
    # available: 0.92 * (free - 256 MB reserve); half of it for the pools
    free = (256 << 20) + int(2 * 8 * 2500 / 0.92) + 64
    fake = _FakeCupy(free_bytes=free)
    qr = _qr(fake, [(1000, 1), (3000, 2), (1500, 3)])
    far = qr._stage_pools[1]
    done = pools_home.bring_home(qr)
    assert done["left"] == [1]                  # 3000 elements over the room of 2500
    assert done["stages"] == [0, 2] and done["bytes"] == 8 * 2500
    assert qr._stage_pools[1] is far and far.device.id == 2


def test_nothing_to_bring():
    fake = _FakeCupy(free_bytes=1 << 30)
    qr = _qr(fake, [(100, 0), (200, 0)])
    assert pools_home.bring_home(qr) is None and "pools_home" not in qr.info
    host = types.SimpleNamespace(_device=types.SimpleNamespace(), _replay={},
                                 _stage_pools={0: np.zeros(3)}, info={})
    assert pools_home.bring_home(host) is None           # NumPy layers
    qr = _qr(fake, [(100, 1)])
    with _switch(False):
        assert pools_home.bring_home(qr) is None
    assert qr._stage_pools[0].device.id == 1


@contextlib.contextmanager
def _switch(on: bool):
    old = pools_home.BRING_HOME
    pools_home.BRING_HOME = on
    try:
        yield
    finally:
        pools_home.BRING_HOME = old


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 4])
def test_solves_with_pools_brought_home_give_the_same_bits(k):
    """One factorization over ``k`` GPUs: Qᵀ, R⁻¹ and Q read over the link (the
    switch off), then with the other GPUs' pools brought to the first: the same bits."""
    from scipy_gpuqr._engine.gpu import solve as gs
    from scipy_gpuqr._engine.gpu.multi_device import device_count, multi_gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values
    if device_count() < k:
        pytest.skip(f"needs {k} GPUs")
    import cupy as cp
    A = random_values(grid3d_least_squares(14), np.random.default_rng(5))
    B = np.random.default_rng(6).standard_normal((A.shape[0], 3))
    n = A.shape[1]

    def answers(qr):
        qtb = gs.device_matmul(qr, B, trans=True, float64=True)
        y = gs.device_solve_of(qr).upper(cp.asarray(qtb[:n])).get()
        return qtb, y, gs.device_matmul(qr, qtb, trans=False, float64=True)

    with cp.cuda.Device(0):
        qr = multi_gpu_factorize(A, analyze(A), devices=tuple(range(k)))
        away = sorted(sid for sid, p in qr._stage_pools.items() if p.device.id != 0)
        if not away:
            pytest.skip("no stage pool left on another GPU (no peer access)")
        with _switch(False):
            ref = answers(qr)
        assert "pools_home" not in qr.info
        qr._replay.pop("cupy", None)                # the replay's pools taken again
        with _switch(True):
            got = answers(qr)
        moved = qr.info["pools_home"]
        assert moved["stages"] == away and moved["left"] == [] and moved["bytes"] > 0
        assert all(p.device.id == 0 for p in qr._stage_pools.values())
        for a, b in zip(ref, got):
            assert np.array_equal(a, b)
        qr.free()
