"""A one-device call's pinned buffers from one block whose pages are made while CUDA
starts (:mod:`scipy_gpuqr._engine.gpu.call_block`), on the CPU.

CUDA's registration is a stand-in CuPy runtime noting every call; the kept
blocks a fresh store; the device layer the multi-device tests' NumPy layer asking
for pinned memory where :class:`~scipy_gpuqr._engine.gpu.device.CupyDevice` does.
"""

from __future__ import annotations

import gc
import sys
import types
from concurrent.futures import Future

import numpy as np
import pytest

import test_multi_device_pinned as tmp
from scipy_gpuqr import _gpu
from scipy_gpuqr._engine.gpu import call_block as cb
from scipy_gpuqr._engine.gpu import pinned_ahead as pa
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.rcopy import SLOT_BYTES
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache
from scipy_gpuqr._schedule.tasks import TASK_BYTES
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares


class _Runtime:
    """``cudaHostRegister``/``cudaHostUnregister`` noted, not made."""

    def __init__(self):
        self.calls = []

    def hostRegister(self, ptr, size, flags):
        self.calls.append(("register", int(ptr), int(size), int(flags)))

    def hostUnregister(self, ptr):
        self.calls.append(("unregister", int(ptr)))


@pytest.fixture
def cuda(monkeypatch):
    """A stand-in CuPy (its runtime's registrations noted, ``cupyx.empty_pinned``
    NumPy memory, each request noted) and a fresh store of kept blocks."""
    rt = _Runtime()
    asked = []

    class _Dev:
        def __init__(self, i=0):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt, Device=_Dev))
    cupyx = types.SimpleNamespace(empty_pinned=lambda shape, dtype: asked.append(
        (shape, np.dtype(dtype).str)) or np.empty(shape, dtype))
    monkeypatch.setattr(_gpu, "import_cupy", lambda: cp)
    monkeypatch.setattr(_gpu, "wait_for_driver", lambda: None)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(pa, "_KEPT", pa._KeptBlocks())
    return types.SimpleNamespace(runtime=rt, asked=asked)


def _done(value):
    f = Future()
    f.set_result(value)
    return f


def test_touched_pages_are_aligned_registered_then_released_in_order(cuda):
    """Pages on a 2 MiB boundary, rounded up to the block's granule, zeros; a
    registration made once on demand; when no view of them is left, unregistered
    first and then unmapped."""
    pages = cb.touched_pages(5 << 20)
    assert pages.addr % cb.HUGE_PAGE == 0
    assert pages.nbytes == cb.BLOCK_ROUND and pages.array.size == pages.nbytes
    assert pages.array.ctypes.data == pages.addr and not pages.array[::4096].any()
    assert not pages.registered
    pages.register(_gpu.import_cupy())
    pages.register(_gpu.import_cupy())
    assert cuda.runtime.calls == [("register", pages.addr, pages.nbytes,
                                   cb.HOST_REGISTER_PORTABLE)]
    view = pages.array[100:200].view(np.uint32)
    addr = pages.addr
    pages = None
    gc.collect()
    assert len(cuda.runtime.calls) == 1            # a view is left: nothing released
    view[:] = 7                                    # and it is still mapped
    del view
    gc.collect()
    assert cuda.runtime.calls[-1] == ("unregister", addr)


@pytest.mark.parametrize("name, A", [("grid7", grid3d_least_squares(7).astype(np.float64)),
                                     ("chess", chessboard_boundary(5, 6, 2).astype(np.float64))])
def test_the_block_serves_the_four_buffers_and_r_slots_then_is_kept(cuda, name, A):
    """A block made from touched pages (registered on the layer's thread at its first
    buffer) serves the maps, the S entries and the records in that order, each in
    its place, and R's two slots; a request larger than its place, or any other
    one, is pinned as asked; after the call the block is kept, and a later call of
    the pattern borrows it (nothing pinned, nothing touched)."""
    an = analyze(A)
    sched = build_schedule(an, lazy=True)
    sizes = cb._sizes(an, sched, np.float64)
    fs = an.fronts
    assert sizes[:4] == [(len(fs.rimap) + len(fs.rjmap)) * 8, len(fs.s_index) * 8,
                         len(fs.s_nz) * 8, max(int(sched.stages[0].ntasks), 1) * TASK_BYTES]
    assert 0 < sizes[4] <= SLOT_BYTES
    block = cb.start(an, _done(sched), np.float64)
    maps = block.take(sizes[0] // 8, np.int64)
    assert cuda.runtime.calls[0][0] == "register"
    sidx = block.take(sizes[1] // 8, np.int64)
    sval = block.take(sizes[2] // 8, np.float64)
    rec = block.take(sizes[3], np.uint8)
    bufs = [maps, sidx, sval, rec]
    base = block._block.ctypes.data
    assert all(base <= b.ctypes.data and b.ctypes.data + b.nbytes <= base + block._block.size
               for b in bufs)
    ends = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b in bufs)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:]))     # apart
    assert cuda.asked == []
    extra = block.take(10, np.float64)              # a fifth request: pinned as asked
    assert cuda.asked == [((10,), "<f8")] and extra.shape == (10,)
    staging = block.r_staging(sizes[4])
    assert staging.lock.locked() and len(staging.slots) == 2
    lo = max(e for _, e in ends)
    assert all(s.ctypes.data >= lo and s.size == sizes[4] for s in staging.slots)
    assert block.r_staging(sizes[4]) is None         # once a call
    staging.release()
    info = block.info()
    assert info["touched"] and info["served"] == sum(sizes[:4]) + 2 * sizes[4]
    assert info["pinned_as_asked"] == 80
    block.finish()
    assert pa.kept_pinned_bytes() == info["bytes"]
    again = cb.borrow(an, sched, np.float64)
    assert pa.kept_pinned_bytes() == 0
    m2 = again.take(sizes[0] // 8, np.int64)
    assert m2.ctypes.data == maps.ctypes.data and not again.info()["touched"]
    assert len([c for c in cuda.runtime.calls if c[0] == "register"]) == 1
    again.finish()
    assert pa.kept_pinned_bytes() == info["bytes"]


def test_a_block_too_small_or_of_more_stages_is_not_used(cuda):
    """No kept block large enough: nothing borrowed (nothing pinned); a schedule of
    more stages, or none read: no block and no pages."""
    A = grid3d_least_squares(6).astype(np.float64)
    an = analyze(A)
    sched = build_schedule(an, lazy=True)
    pa.give_back_kept_pinned(np.zeros(1024, dtype=np.uint8))
    assert cb.borrow(an, sched, np.float64) is None
    assert pa.kept_pinned_bytes() == 1024
    assert cb.block_bytes(an, None, np.float64) is None
    none = cb.start(an, _done(None), np.float64)
    assert none.take(4, np.int64).shape == (4,) and cuda.asked == [((4,), "<i8")]
    none.finish()
    assert pa.kept_pinned_bytes() == 1024 and cuda.runtime.calls == []


def test_unregistered_pages_are_never_kept(cuda, monkeypatch):
    """Pages made ahead but never registered (the call took no buffer: a plan of
    stages) are let go of, not kept; registered on the worker (a new process's
    first call names the device) they are kept."""
    A = grid3d_least_squares(6).astype(np.float64)
    an = analyze(A)
    sched = build_schedule(an, lazy=True)
    b1 = cb.start(an, _done(sched), np.float64)
    b1._future.result()
    b1.finish()
    assert pa.kept_pinned_bytes() == 0 and cuda.runtime.calls == []
    b2 = cb.start(an, _done(sched), np.float64, register_on=0)
    pages, _ = b2._future.result()
    assert pages.registered and cuda.runtime.calls[0][0] == "register"
    b2.finish()
    assert pa.kept_pinned_bytes() == pages.nbytes


class _Layer(tmp._PinningLayer):
    """The pinning layer as a CUDA layer to the driver (its ``cp`` set), R's
    copier asking the block for its slots as ``CupyDevice.open_r_copy`` does."""

    cp = object()

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.blocks = []
        self.r_slots = []

    def _up(self, host):
        if self.pinned_ahead is not None:
            return super()._up(host)
        self.asked += 1                 # no block: CuPy's pinned pool (the stand-in)
        buf = self._pinned_copy(host if host.size else np.zeros(1, dtype=host.dtype))
        assert buf.size == max(host.size, 1)

    def begin_stage(self, st, s_index, s_value, carried):
        self.blocks.append(self.pinned_ahead)
        return super().begin_stage(st, s_index, s_value, carried)

    def open_r_copy(self, pool, index, layout=None, final=None):
        if layout is not None and hasattr(self.pinned_ahead, "r_staging"):
            s = self.pinned_ahead.r_staging(int(min(SLOT_BYTES, max(layout.nnz, 1) * 8)))
            self.r_slots.append(s)
            if s is not None:
                s.release()
        return super().open_r_copy(pool, index, layout, final)


def test_a_repeated_one_stage_call_borrows_the_kept_block(cuda):
    """The driver lends a kept block that holds a one-stage run's buffers to the
    layer for the run (maps, S entries, records and R's slots from it, nothing
    pinned as asked), gives it back after R is copied, and R is the same as
    without it; a run without a kept block pins as asked."""
    A = grid3d_least_squares(7).astype(np.float64)
    clear_schedule_cache()
    an = analyze(A)
    ref = gpu_factorize(A, an, device=tmp.NumpyDevice(32, 3))
    plain = _Layer(32, 3)
    g0 = gpu_factorize(A, an, device=plain)
    assert plain.blocks == [None] and "call_block" not in g0.info
    assert len(cuda.asked) == 4                     # pinned as asked, as before
    sched = build_schedule(an, lazy=True)
    pa.give_back_kept_pinned(np.zeros(cb.block_bytes(an, sched, np.float64), dtype=np.uint8))
    layer = _Layer(32, 3)
    g = gpu_factorize(A, an, device=layer)
    blk, = layer.blocks
    assert isinstance(blk, cb.CallBlock) and layer.pinned_ahead is None
    assert layer.r_slots and layer.r_slots[0] is not None
    info = g.info["call_block"]
    assert info["pinned_as_asked"] == 0 and not info["touched"] and info["served"] > 0
    assert pa.kept_pinned_bytes() == info["bytes"]
    assert (g.R != ref.R).nnz == 0 and (g0.R != ref.R).nnz == 0


@pytest.mark.gpu
def test_stored_pattern_takes_its_buffers_from_a_block_on_the_gpu(tmp_path, monkeypatch):
    """On the device: a first factorization of a stored pattern with nothing in memory
    (a new process's) takes its four buffers and R's slots from pages touched ahead
    and registered at its first buffer, nothing pinned as asked; the block is kept
    and a repeated factorization borrows it; R bit for bit the cold run's."""
    from scipy_gpuqr import _store
    from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    rng = np.random.default_rng(7)
    from scipy_gpuqr._testing_matrices import random_values
    A = random_values(grid3d_least_squares(10), rng)
    pa.release_kept_pinned()
    clear_schedule_cache()
    clear_r_layout_cache()
    g1 = gpu_factorize(A, analyze(A))
    assert g1.info["schedule_cold"] and "call_block" not in g1.info
    R1 = g1.R.copy()
    g1.free()
    _store.flush()
    clear_schedule_cache()
    clear_r_layout_cache()
    pa.release_kept_pinned()
    g2 = gpu_factorize(A, analyze(A))
    info = g2.info["call_block"]
    assert info["touched"] and info["served"] > 0 and info["pinned_as_asked"] == 0, info
    assert not g2.info["schedule_cold"] and g2.info["r_copy_progressive"]
    assert (g2.R != R1).nnz == 0
    g2.free()
    assert pa.kept_pinned_bytes() >= info["bytes"]
    g3 = gpu_factorize(A, analyze(A))
    info3 = g3.info["call_block"]
    assert not info3["touched"] and info3["pinned_as_asked"] == 0, info3
    assert (g3.R != R1).nnz == 0
    g3.free()
    pa.release_kept_pinned()
    clear_schedule_cache()
    clear_r_layout_cache()
