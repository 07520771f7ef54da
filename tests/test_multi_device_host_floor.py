"""The time model's split fronts at least their host calls, and the upper tree's device
with the lightest subtree load (``TimeModel``), without a GPU: two devices' plans of
grid 40-64³ as before, four devices' grid 64³ with the upper device the lightest, the
plans on NumPy layers to the one-device answer."""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule import devices
from scipy_gpuqr._schedule.dense import DenseModel
from scipy_gpuqr._schedule.dense_split import SplitModel, split_seconds, split_weights
from scipy_gpuqr._schedule.devices import (SPLIT_CALL_FACTOR, TimeModel, front_seconds,
                                           map_devices, timed_split_seconds)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

from test_multi_device_split import _same_gram

#: The time model before it priced the host: the split model's seconds, the first device
#: of the longest-first sharing holding the upper tree, every front above the frontier on
#: it.
BEFORE = TimeModel(split_call_factor=1.0, upper_lightest=False, upper_anywhere=False)


def _loads(plan, t):
    """Modelled subtree seconds of each device (upper tree excluded)."""
    return np.bincount(plan.owner[~plan.upper], weights=t[~plan.upper],
                       minlength=plan.ndevices)


def test_upper_device_takes_the_lighter_subtree():
    """A split root over subtrees of 5 s and 4 s on two devices: the longest-first sharing
    gives device 0 (the upper tree's) the 5 s one; the time model swaps them (the same
    modelled seconds) so that the device enqueueing the split front is free first."""
    parent = np.array([2, 2, -1])
    child_ptr = np.array([0, 0, 0, 2])
    children = np.array([0, 1])
    secs = np.array([5.0, 4.0, 0.0])
    new = devices._timed_owner(parent, child_ptr, children, secs, 2, 0, {2: 1.0})
    old = devices._timed_owner(parent, child_ptr, children, secs, 2, 0, {2: 1.0},
                               upper_lightest=False)
    assert new[1].tolist() == old[1].tolist() == [False, False, True]
    assert old[0].tolist() == [0, 1, 0] and new[0].tolist() == [1, 0, 0]
    assert new[2] == old[2] == pytest.approx(6.0)
    # the other upper device: it takes the lighter one
    up1 = devices._timed_owner(parent, child_ptr, children, secs, 2, 1, {2: 1.0})
    assert up1[0].tolist() == [0, 1, 1]


def test_swap_kept_only_where_it_models_no_longer():
    """An upper front that is not split, over a subtree of 1 s, beside subtrees of 3 s and
    2 s: the upper device keeps the subtree its upper front waits for where taking the
    lightest load would start that front later."""
    # 0 (3 s) -> 4 (root, split); 1 (1 s) -> 2 (upper, 1 s, not split) -> 4; 3 (2 s) -> 4
    parent = np.array([4, 2, 4, 4, -1])
    child_ptr = np.array([0, 0, 0, 1, 1, 4])
    children = np.array([1, 0, 2, 3])
    secs = np.array([3.0, 1.0, 1.0, 2.0, 0.0])
    for lightest in (True, False):
        owner, upper, t = devices._timed_owner(parent, child_ptr, children, secs, 2, 0,
                                               {4: 0.5}, upper_lightest=lightest)
        whole = devices.timed_makespan(parent, owner, secs, {4: 0.5})
        assert t == pytest.approx(whole)
    new = devices._timed_owner(parent, child_ptr, children, secs, 2, 0, {4: 0.5})
    old = devices._timed_owner(parent, child_ptr, children, secs, 2, 0, {4: 0.5},
                               upper_lightest=False)
    assert new[2] <= old[2] * (1 + 1e-12)


@pytest.fixture(scope="module")
def grid64():
    an = analyze(grid3d_least_squares(64))
    return an, front_seconds(an)


def test_split_fronts_priced_at_their_host_calls(grid64):
    """Grid 64³'s split fronts on four devices: at least their calls at
    SPLIT_CALL_FACTOR times the split model's each (above the split rule's seconds for
    all three), the split
    model's own seconds with the floor off; the plan's seconds count them."""
    an, t = grid64
    fs = an.fronts
    model = SplitModel()
    _, splits = split_weights(fs, np.asarray(an.front_flops, dtype=np.float64), 4, model)
    floor = timed_split_seconds(fs, splits, model, TimeModel())
    off = timed_split_seconds(fs, splits, model, BEFORE)
    for f, sp in splits.items():
        assert off[f] == sp.seconds
        calls = split_seconds(int(fs.fm[f]), int(fs.fn[f]),
                              fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]], sp.owners,
                              SplitModel(call_seconds=1.0))
        assert floor[f] == pytest.approx(max(sp.seconds,
                                             calls * SPLIT_CALL_FACTOR * model.call_seconds))
    plan = map_devices(an, 4, split_model=model, cache=False)
    for f in (13070, 13071, 13072):
        assert f in plan.split and floor[f] > 1.1 * splits[f].seconds
    old = map_devices(an, 4, split_model=model, cache=False, time_model=BEFORE)
    assert plan.weight == old.weight == "time"
    assert plan.seconds > old.seconds + 0.1      # three split fronts, ~0.05 s each more


def test_four_devices_upper_device_lightest(grid64):
    """Grid 64³ on four devices: the time plan's upper device holds the least modelled
    subtree seconds (before: not), with the same per-device loads otherwise."""
    an, t = grid64
    model = SplitModel()
    plan = map_devices(an, 4, split_model=model, cache=False)
    old = map_devices(an, 4, split_model=model, cache=False, time_model=BEFORE)
    new_l, old_l = _loads(plan, t), _loads(old, t)
    assert new_l[plan.upper_device] == new_l.min()
    assert old_l[old.upper_device] > old_l.min()
    assert sorted(np.round(new_l, 9)) == sorted(np.round(old_l, 9))


@pytest.mark.parametrize("g", [40, 48, 56, 60, 64])
def test_two_devices_plans_unchanged(g):
    """Two devices keep the plans they had (grid 40-64³): the same owners, upper tree and
    split fronts with the host floor, the upper device's choice and the fronts above the
    frontier on any device (``upper_anywhere``) as without them."""
    an = analyze(grid3d_least_squares(g))
    model = SplitModel()
    plan = map_devices(an, 2, split_model=model, cache=False)
    old = map_devices(an, 2, split_model=model, cache=False, time_model=BEFORE)
    assert plan.weight == old.weight
    assert np.array_equal(plan.owner, old.owner) and np.array_equal(plan.upper, old.upper)
    assert sorted(plan.split) == sorted(old.split)


def force_time_mapping(monkeypatch):
    """Small grids mapped over several devices by the time model: no least problem
    size, no least modelled gain, and subtrees slow beside the small split model."""
    monkeypatch.setattr(devices, "MULTI_DEVICE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(devices, "TIMED_MAPPING_GAIN", -np.inf)
    monkeypatch.setattr(devices, "SUBTREE_RATE", 1e9)


def _small_model(panel=16):
    """A split model for small fronts (NumPy layers' panel width, no least gain)."""
    return SplitModel(dense=DenseModel(panel=panel, launch_seconds=1e-3, column_seconds=0.0,
                                       panel_seconds=0.0, gemm_rate=1e9),
                      step_seconds=0.0, call_seconds=0.0, min_columns=2 * panel,
                      min_seconds=0.0, min_share=0.0)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_lightest_upper_plan_on_numpy_layers(monkeypatch, k):
    """The time plan with the upper device the lightest (grid 9³, time mapping forced)
    runs over NumPy layers to the one-device answer: R's Gram and Q R = A P."""
    force_time_mapping(monkeypatch)
    A = grid3d_least_squares(9)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, k, split_model=model, cache=False)
    assert plan.weight == "time" and plan.split
    loads = _loads(plan, front_seconds(an))
    assert loads[plan.upper_device] <= loads.min() * (1 + 1e-12)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)],
                               devices=plan, dense_flops=1e30, split_dense=None,
                               split_model=model)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=None)
    _same_gram(A, one, many)
