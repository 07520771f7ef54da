"""A one-device call's pinned host buffers pinned in one block on a worker before
its stage begins (:mod:`scipy_gpuqr._engine.gpu.call_pins`), on the CPU.

The pinning is the multi-device tests' fake (NumPy memory, every call noted), the
device layer a NumPy layer asking for pinned memory where
:class:`~scipy_gpuqr._engine.gpu.device.CupyDevice` does (its own ``_pinned``):
the maps as it starts, then the S entries and the records' buffer.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import test_multi_device_pinned as tmp
from scipy_gpuqr._engine.gpu import call_pins, driver
from scipy_gpuqr._engine.gpu import pinned_ahead as pa
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache
from scipy_gpuqr._schedule.tasks import TASK_BYTES
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

pins = tmp.pins


class _Layer(tmp._PinningLayer):
    """The pinning layer, noting the thread of every pinning and what its lane holds."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.lanes = []

    def begin_stage(self, st, s_index, s_value, carried):
        self.lanes.append(self.pinned_ahead)
        return super().begin_stage(st, s_index, s_value, carried)


@pytest.fixture
def no_cuda_check(monkeypatch):
    """The call pins ahead on the NumPy layer too (the driver asks for a CUDA layer)."""
    monkeypatch.setattr(call_pins, "wanted",
                        lambda device, mplan: getattr(device, "pinned_ahead", False) is None
                        and call_pins.one_stage(mplan))


@pytest.mark.parametrize("name, A", [("grid7", grid3d_least_squares(7).astype(np.float64)),
                                     ("chess", chessboard_boundary(5, 6, 2).astype(np.float64))])
def test_one_block_pinned_on_a_worker_and_kept(pins, no_cuda_check, monkeypatch, name, A):
    """A first call pins one block on ``gpuqr-call-pins`` before its stage begins; the
    layer takes the maps, the S entries and the records from it (nothing pinned as
    asked, the bound of the records holding the schedule's); the block goes back to
    the kept ones after the stage and a repeated call pins nothing; R is the same as
    without it."""
    threads = []
    real = pins.__call__

    def noted(nbytes):
        threads.append(threading.current_thread().name)
        return real(nbytes)
    monkeypatch.setattr(pa, "_pinned_bytes", noted)
    clear_schedule_cache()
    an = analyze(A)
    ref = gpu_factorize(A, an, device=tmp.NumpyDevice(32, 3))
    made = []
    monkeypatch.setattr(call_pins, "start", lambda sizes, _s=call_pins.start: made.append(
        sizes) or _s(sizes))
    for rep in range(2):
        layer = _Layer(32, 3)
        g = gpu_factorize(A, an, device=layer)
        assert g.info["stages"] == 1
        lane, = layer.lanes
        assert isinstance(lane, call_pins.CallPins)
        assert layer.pinned_ahead is None               # given back after the stage
        info = lane.info()
        assert info["during_run"] == {"allocations": 0, "bytes": 0}
        assert layer.asked == 4
        assert (g.R != ref.R).nnz == 0
        np.testing.assert_array_equal(g.colperm, ref.colperm)
    assert len(made) == 2
    sizes = made[0]
    fs = an.fronts
    assert sizes[:3] == [(len(fs.rimap) + len(fs.rjmap)) * 8, len(fs.s_index) * 8,
                         len(fs.s_nz) * 8]
    assert sizes[3] >= int(g.schedule.stages[0].ntasks) * TASK_BYTES
    assert threads == ["gpuqr-call-pins_0"]            # pinned once, on the worker
    assert pa.kept_pinned_bytes() >= sum(sizes)


def test_sizes_of_a_stored_one_stage_schedule():
    """A new process's sizes come from the one-stage schedule read from its file:
    its records exactly; none for a schedule of several stages."""
    A = grid3d_least_squares(6).astype(np.float64)
    an = analyze(A)
    sched = build_schedule(an, lazy=True)
    s = call_pins.sizes_of_schedule(an, sched, np.float32)
    assert s[2] == len(an.fronts.s_nz) * 4
    assert s[3] == int(sched.stages[0].ntasks) * TASK_BYTES
    assert call_pins.sizes_of_schedule(an, None, np.float64) is None
    assert driver._done_result(None) is None


def test_a_failed_pinning_pins_as_asked(pins, monkeypatch):
    """Where the block cannot be pinned the layer's buffers are pinned as asked
    (CuPy's pinned pool), and nothing is given back."""
    def refuse(nbytes):
        raise RuntimeError("cudaHostAlloc refused")
    monkeypatch.setattr(pa, "_pinned_bytes", refuse)
    c = call_pins.start([4096, 4096])
    assert c._future.result() is None
    asked = []
    import sys
    import types
    fake = types.SimpleNamespace(empty_pinned=lambda shape, dtype: asked.append(shape)
                                 or np.empty(shape, dtype))
    monkeypatch.setitem(sys.modules, "cupyx", fake)
    out = c.take(10, np.float64)
    assert out.shape == (10,) and asked == [(10,)]
    c.finish()
    assert pa.kept_pinned_bytes() == 0
    c.take(3, np.int64)                                 # after the run: as asked
    assert asked == [(10,), (3,)]


def test_pins_of_one_stage_given_back_for_a_staged_plan(pins):
    """Pins started for a one-stage run (a new process, before the memory plan) are
    given back unused where the plan has stages: such a run pins the pools it sends
    to the host, which outlive the call."""
    from types import SimpleNamespace
    one = SimpleNamespace(feasible=True, host=(), plan=SimpleNamespace(stages=[(0, 9)]))
    two = SimpleNamespace(feasible=True, host=(), plan=SimpleNamespace(stages=[(0, 4), (5, 9)]))
    host = SimpleNamespace(feasible=True, host=(9,), plan=SimpleNamespace(stages=[(0, 9)]))
    c = call_pins.start([4096, 4096])
    assert call_pins.for_plan(c, one) is c
    assert call_pins.for_plan(None, two) is None
    assert call_pins.for_plan(c, two) is None
    assert pa.kept_pinned_bytes() >= 8192           # back among the kept blocks
    assert c._lane() is None                        # nothing handed out after
    c2 = call_pins.start([4096])
    assert call_pins.for_plan(c2, host) is None
