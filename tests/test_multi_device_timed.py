"""The time model of a multi-device mapping, without a GPU: a split front holds every
device (``timed_makespan``), the time model's mapping models what its own search
found, and its plans run on NumPy device layers to the one-device answer."""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule import devices
from scipy_gpuqr._schedule.dense import DenseModel
from scipy_gpuqr._schedule.dense_split import SplitModel, split_weights
from scipy_gpuqr._schedule.devices import (front_seconds, map_devices, subtree_weights,
                                           timed_makespan)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

from test_multi_device_host_floor import force_time_mapping
from test_multi_device_split import _same_gram


def _small_model(panel=16):
    """A split model for small fronts (NumPy layers' panel width, no least gain)."""
    return SplitModel(dense=DenseModel(panel=panel, launch_seconds=1e-3, column_seconds=0.0,
                                       panel_seconds=0.0, gemm_rate=1e9),
                      step_seconds=0.0, call_seconds=0.0, min_columns=2 * panel,
                      min_seconds=0.0, min_share=0.0)


def test_split_front_waits_for_every_device():
    """Fronts 0 and 1 (device 0 and 1, 1 s each) under front 3, and a root 2 on device
    1 (5 s): front 3 split starts once device 1 ends front 2 (6 s), on device 0 alone
    once its children are done (1 s)."""
    parent = np.array([3, 3, -1, -1])
    owner = np.array([0, 1, 1, 0])
    secs = np.array([1.0, 1.0, 5.0, 1.0])
    assert timed_makespan(parent, owner, secs, {3: 1.0}) == pytest.approx(7.0)
    assert timed_makespan(parent, owner, secs) == pytest.approx(6.0)
    assert devices.makespan(parent, secs, owner) == pytest.approx(6.0)
    # device 1 twice as fast as device 0: its fronts 1 and 2 end at 0.75 · 6 = 4.5 s,
    # the split front keeps its second
    fast = timed_makespan(parent, owner, secs, {3: 1.0}, speeds=[2 / 3, 4 / 3])
    assert fast == pytest.approx(5.5)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_time_mapping_models_its_own_plan(k):
    """The time model's search (on the tree cut at its frontier) gives the seconds
    ``timed_makespan`` gives its plan on the whole tree; its subtrees each lie on one
    device and its upper tree on the first."""
    an = analyze(grid3d_least_squares(12))
    fs = an.fronts
    flops = np.asarray(an.front_flops, dtype=np.float64)
    _, splits = split_weights(fs, flops, k, _small_model())
    split_s = {f: sp.seconds for f, sp in splits.items()}
    t = front_seconds(an)
    owner, upper, secs = devices._timed_owner(fs.parent, fs.child_ptr, fs.children, t, k, 0,
                                              split_s)
    assert np.all(owner[upper] == 0)
    whole = timed_makespan(fs.parent, owner, t, {f: split_s[f] for f in np.flatnonzero(upper)
                                                 if f in split_s})
    assert secs == pytest.approx(whole, rel=1e-12)
    par = np.asarray(fs.parent)
    for f in np.flatnonzero(~upper & (par >= 0)):
        if not upper[par[f]]:
            assert owner[f] == owner[par[f]]
    # no worse than putting everything on one device, and every device used
    assert secs <= float(np.sum(t)) * (1 + 1e-12)
    assert len(set(owner.tolist())) == k
    # subtree loads: the largest below the upper tree's own seconds plus the mean
    loads = np.bincount(owner[~upper], weights=t[~upper], minlength=k)
    tops = [f for f in np.flatnonzero(~upper) if par[f] < 0 or upper[par[f]]]
    biggest = max(subtree_weights(par, t)[tops])
    assert loads.max() <= loads.sum() / k + biggest + 1e-15


def _forced(monkeypatch):
    """The time model's mapping taken for any size and gain, its subtrees' fronts as
    slow against the small split model as to give it split fronts on grid 9³."""
    force_time_mapping(monkeypatch)


@pytest.mark.parametrize("k", [2, 4])
def test_time_plan_on_numpy_layers(monkeypatch, k):
    """A plan of the time model over NumPy layers (split fronts split): R's Gram and
    Q R = A P as the one-device run's (its dense fronts are tile fronts here)."""
    _forced(monkeypatch)
    A = grid3d_least_squares(9)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, k, split_model=model, cache=False)
    assert plan.weight == "time" and plan.seconds > 0
    assert plan.as_dict()["modelled_seconds"] == plan.seconds
    assert plan.split and len(set(plan.owner.tolist())) == k     # the case is not trivial
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)],
                               devices=plan, dense_flops=1e30, split_dense=None,
                               split_model=model)
    assert many.info["devices"]["weight"] == "time"
    assert sorted(e["front"] for e in many.info["split_fronts"]) == sorted(plan.split)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=None)
    _same_gram(A, one, many)


def test_time_mapping_only_where_it_gains(monkeypatch):
    """Below MULTI_DEVICE_MIN_FLOPS, or without the gain, the proportional mapping stays;
    every mapping with a split model is timed."""
    A = grid3d_least_squares(9)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, 4, split_model=model, cache=False)
    assert plan.weight != "time" and plan.seconds > 0
    assert map_devices(an, 4, cache=False).seconds == 0.0      # no split model: not timed
    monkeypatch.setattr(devices, "MULTI_DEVICE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(devices, "TIMED_MAPPING_GAIN", 1.0)     # never 100 % shorter
    assert map_devices(an, 4, split_model=model, cache=False).weight != "time"
    _forced(monkeypatch)
    timed = map_devices(an, 4, split_model=model, cache=False)
    assert timed.weight == "time"
