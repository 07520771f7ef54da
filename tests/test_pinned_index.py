"""R copiers' gather indices kept pinned per layout, and the chunked upload's
threaded fill, without a GPU (stand-ins for CuPy's pinned memory and events)."""

import sys
import types

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import pinned_index, rcopy
from scipy_gpuqr._engine.gpu.pinned_index import (KeptIndices, keep_pinned_indices,
                                                   kept_pinned_index)


class _Pinned:
    """Stand-in for ``cupy.cuda.pinned_memory``: plain bytes, counted."""

    def __init__(self):
        self.made = 0

        class PinnedMemory:
            def __init__(mem, nbytes, flags):
                self.made += 1
                mem.buf = bytearray(nbytes)

        def pointer(mem, offset):
            return memoryview(mem.buf)
        self.PinnedMemory = PinnedMemory
        self.PinnedMemoryPointer = pointer


def _fake_cp():
    pinned = _Pinned()

    class CUDARuntimeError(Exception):
        pass
    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        pinned_memory=pinned, runtime=types.SimpleNamespace(
            CUDARuntimeError=CUDARuntimeError, hostAllocPortable=1)))
    return cp, pinned


class _Layout:
    def __init__(self):
        self.extras = {}

    def extra(self, key, make):
        if key not in self.extras:
            self.extras[key] = make()
        return self.extras[key]


def test_kept_copy_made_once_and_found_while_the_index_is_the_same():
    cp, pinned = _fake_cp()
    kept = KeptIndices(1 << 20)
    idx = np.arange(1000, dtype=np.int32)[::-1].copy()
    assert kept.find("s0", idx) is None
    a = kept.make("s0", idx, cp)
    assert np.array_equal(a, idx) and a is not idx and pinned.made == 1
    assert kept.find("s0", idx) is a and kept.make("s0", idx, cp) is a and pinned.made == 1
    again = idx.copy()                  # the maps made again: a new array
    assert kept.find("s0", again) is None
    b = kept.make("s0", again, cp)
    assert b is not a and np.array_equal(b, again) and pinned.made == 2
    assert kept.nbytes == idx.nbytes


def test_kept_copies_stay_within_the_cap_least_recent_let_go():
    cp, _ = _fake_cp()
    idx = [np.full(100, k, dtype=np.int64) for k in range(3)]      # 800 bytes each
    kept = KeptIndices(2000)
    a = kept.make(0, idx[0], cp)
    kept.make(1, idx[1], cp)
    assert kept.find(0, idx[0]) is a            # 0 used last: 1 goes first
    kept.make(2, idx[2], cp)
    assert kept.nbytes == 1600
    assert kept.find(0, idx[0]) is a and kept.find(1, idx[1]) is None
    assert KeptIndices(700).make(0, idx[0], cp) is None      # alone over the cap


def test_copies_made_at_a_calls_end_found_by_the_next(monkeypatch):
    """A call's copiers find nothing; keep_pinned_indices makes the copies of the
    large indices (once), which the next call's copiers find; a share of 0 keeps
    none."""
    cp, pinned = _fake_cp()
    lay = _Layout()
    monkeypatch.setattr(pinned_index, "PINNED_INDEX_MIN_BYTES", 400)
    monkeypatch.setattr(pinned_index, "PIN_COPY_PER_THREAD", 16)      # several threads
    small = np.arange(100, dtype=np.int32)
    big = np.random.default_rng().integers(0, 1 << 30, 1001).astype(np.int32)
    wanted = [(lay, "s", small), (lay, "b", big)]
    assert all(kept_pinned_index(*w) is None for w in wanted)
    assert keep_pinned_indices(wanted, cp) == big.nbytes and pinned.made == 1
    got = kept_pinned_index(lay, "b", big)
    assert np.array_equal(got, big) and kept_pinned_index(lay, "s", small) is None
    assert keep_pinned_indices(wanted, cp) == 0 and pinned.made == 1
    monkeypatch.setattr(pinned_index, "PINNED_INDEX_SHARE", 0.0)
    other = _Layout()
    assert keep_pinned_indices([(other, "b", big)], cp) == 0
    assert kept_pinned_index(other, "b", big) is None


@pytest.mark.parametrize("per_thread", [1, 3, 1 << 20])
def test_chunked_upload_fills_each_chunk_on_threads(monkeypatch, per_thread):
    """Each chunk's copy into its pinned buffer split over threads: every entry
    lands once, in place, for chunks filled by one to eight threads."""
    class Event:
        def __init__(self, disable_timing=True):
            pass

        def record(self, stream):
            pass

        def synchronize(self):
            pass

    class Target:
        def __init__(self, arr):
            self.arr = arr

        def __getitem__(self, sl):
            return Target(self.arr[sl])

        def set(self, src, stream=None):
            self.arr[...] = src

    fake_cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event))
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.empty(shape, dtype=dtype)))
    monkeypatch.setattr(rcopy, "UPLOAD_PER_THREAD", per_thread)
    rng = np.random.default_rng()
    for n in (9, 40, 45, 1000):
        host = rng.integers(0, 1 << 30, n).astype(np.int64)
        out = np.full(n, -1, dtype=np.int64)
        rcopy.upload_through_pinned(fake_cp, Target(out), host, None, chunk_bytes=8 * 8)
        assert np.array_equal(out, host), (n, per_thread)


@pytest.mark.gpu
@pytest.mark.parametrize("ids", [(0, 0), (0, 1)])
def test_multi_device_r_with_kept_pinned_indices(monkeypatch, ids):
    """Every copier's index kept pinned (no size floor): the first call makes the
    copies at its end, the second sends them up from there; R bit for bit the
    first call's, and the same answer as one GPU's (Gram of R)."""
    import cupy as cp

    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.gpu.multi_device import device_count, multi_gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    monkeypatch.setattr(pinned_index, "PINNED_INDEX_MIN_BYTES", 0)
    A = random_values(grid3d_least_squares(14), np.random.default_rng(4))
    an = analyze(A)
    with cp.cuda.Device(ids[0]):
        one = gpu_factorize(A, an)
        first = multi_gpu_factorize(A, an, devices=ids, device_speeds=None)
        made = first.info["pinned_indices"]
        assert made["bytes"] > 0, made
        second = multi_gpu_factorize(A, an, devices=ids, device_speeds=None)
        assert second.info["pinned_indices"]["bytes"] == 0
        assert np.array_equal(second.R.indices, first.R.indices)
        assert np.array_equal(second.R.data, first.R.data)
        R1, R2 = one.R.toarray(), second.R.toarray()
        scale = max(np.abs(R1).max(), 1.0)
        assert np.abs(R1.T @ R1 - R2.T @ R2).max() <= 1e-11 * scale * scale
        for q in (one, first, second):
            q.free()
