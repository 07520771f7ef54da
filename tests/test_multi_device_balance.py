"""The time model's fronts above its frontier on any device (``TimeModel.upper_anywhere``,
off by default) and the device count of devices='auto' by modelled seconds, without a GPU:
grid 56³ and 60³ on four devices with subtree work on every device, the plans' seconds
those of the whole tree, two devices' plans as before, ch7-8-b3 on two of four GPUs, and
such plans on NumPy layers to the one-device answer."""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule import devices
from scipy_gpuqr._schedule.dense_split import SplitModel
from scipy_gpuqr._schedule.devices import (TimeModel, devices_for, front_seconds,
                                           map_devices, run_seconds, timed_makespan,
                                           timed_split_seconds)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

from test_multi_device_host_floor import _small_model, force_time_mapping
from test_multi_device_split import _same_gram

#: The time model with every front above the frontier on the upper device (the default).
UPPER_ONLY = TimeModel(upper_anywhere=False)
#: The time model with fronts above the frontier placed on any device.
PLACED = TimeModel(upper_anywhere=True)


def _subtree_seconds(plan, t):
    """Modelled seconds of each device's fronts outside the upper tree."""
    return np.bincount(plan.owner[~plan.upper], weights=t[~plan.upper],
                       minlength=plan.ndevices)


def _placed_off_upper(plan, parent):
    """Fronts off the upper device with a child on another device (a front above the
    time model's frontier placed there)."""
    par = np.asarray(parent)
    kids = np.flatnonzero(par >= 0)
    moved = kids[plan.owner[kids] != plan.owner[par[kids]]]
    return sorted({int(par[c]) for c in moved
                   if plan.owner[par[c]] != plan.upper_device and not plan.upper[par[c]]})


@pytest.fixture(scope="module")
def grids():
    return {g: analyze(grid3d_least_squares(g)) for g in (56, 60)}


@pytest.mark.parametrize("g", [56, 60])
def test_four_devices_every_device_has_subtrees(grids, g):
    """Grid 56³ and 60³ on four devices: the time plan gives every device subtree work
    (at least a third of the mean; before, one device had none), models at least 10 %
    shorter than with every front above the frontier on the upper device, and its
    seconds are the whole tree's (:func:`timed_makespan`) with its split fronts."""
    an = grids[g]
    t = front_seconds(an)
    model = SplitModel()
    plan = map_devices(an, 4, split_model=model, cache=False, time_model=PLACED)
    old = map_devices(an, 4, split_model=model, cache=False)
    assert np.array_equal(old.owner, map_devices(an, 4, split_model=model, cache=False,
                                                 time_model=UPPER_ONLY).owner)
    assert plan.weight == old.weight == "time"
    sub, was = _subtree_seconds(plan, t), _subtree_seconds(old, t)
    assert was.min() < 0.1 * was.mean()
    assert sub.min() > sub.mean() / 3
    assert plan.seconds < 0.9 * old.seconds
    split_s = timed_split_seconds(an.fronts, plan.split, model, PLACED)
    assert plan.seconds == pytest.approx(timed_makespan(an.fronts.parent, plan.owner, t,
                                                        split_s))


def test_auto_takes_the_count_of_least_modelled_seconds():
    """devices='auto' on four GPUs: the count of least modelled seconds among those that
    fit (the fewest on a tie), all four without ``seconds``."""
    fast = dict(speedup=lambda k: 2.0)
    ids, _ = devices_for("auto", 4, 1e13, 1, None, **fast)
    assert ids == [0, 1, 2, 3]
    ids, why = devices_for("auto", 4, 1e13, 1, None, seconds=lambda k: ({2: 0.2, 4: 0.3}[k],
                                                                         True), **fast)
    assert ids == [0, 1] and "2 GPUs" in why
    ids, _ = devices_for("auto", 4, 1e13, 1, None, seconds=lambda k: (0.2, True), **fast)
    assert ids == [0, 1]
    ids, _ = devices_for("auto", 4, 1e13, 1, None, seconds=lambda k: ({2: 0.2, 4: 0.3}[k],
                                                                      k == 4), **fast)
    assert ids == [0, 1, 2, 3]
    ids, _ = devices_for("auto", 8, 1e13, 1, None, seconds=lambda k: (1.0 / k, True), **fast)
    assert ids == list(range(8))


def test_a_mapping_made_to_fit_the_memory_is_timed():
    """Where only a mapping weighted by bytes fits the devices' memory (map_devices does
    not time it), run_seconds gives that mapping's makespan in the same model, not the
    devices' cost alone (a zero would make 'auto' take that device count)."""
    an = analyze(grid3d_least_squares(16))
    full = map_devices(an, 2, split_model=SplitModel())
    memory = int(full.device_bytes.max() * 0.9)
    tight = map_devices(an, 2, device_memory=memory, split_model=SplitModel())
    assert tight.fits and tight.seconds == 0.0 and "bytes" in tight.weight
    seconds, fits = run_seconds(an, 2, device_memory=memory)
    assert fits
    assert seconds - 2 * devices.DEVICE_SECONDS == pytest.approx(
        timed_makespan(an.fronts.parent, tight.owner, front_seconds(an)))
    assert seconds > 2 * devices.DEVICE_SECONDS


def test_ch7_8_b3_runs_on_two_of_four():
    """ch7-8-b3 (4.4 TFlop): four devices model longer than two with each device's
    :data:`~scipy_gpuqr._schedule.devices.DEVICE_SECONDS`, so 'auto' takes two of four
    GPUs; grid 56³ takes all four."""
    an = analyze(chessboard_boundary(7, 8, 3))
    assert run_seconds(an, 2)[0] < run_seconds(an, 4)[0]
    ids, why = devices_for("auto", 4, float(an.flops), int(an.gpu_bytes), None,
                           speedup=lambda k: devices.run_speedup(an, k),
                           seconds=lambda k: run_seconds(an, k))
    assert ids == [0, 1], why


def test_auto_takes_four_for_grid56(grids):
    an = grids[56]
    ids, why = devices_for("auto", 4, float(an.flops), int(an.gpu_bytes), None,
                           speedup=lambda k: devices.run_speedup(an, k),
                           seconds=lambda k: run_seconds(an, k))
    assert ids == [0, 1, 2, 3], why


@pytest.mark.parametrize("g, k", [(10, 2), (8, 3), (8, 4)])
def test_placed_fronts_on_numpy_layers(monkeypatch, g, k):
    """A time plan with fronts above the frontier placed off the upper device (small
    grids, time mapping forced; on three and four devices beside split fronts) runs over
    NumPy layers to the one-device answer: R's Gram and Q R = A P."""
    force_time_mapping(monkeypatch)
    A = grid3d_least_squares(g)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, k, split_model=model, cache=False, time_model=PLACED)
    assert plan.weight == "time" and (k == 2 or plan.split)
    assert _placed_off_upper(plan, an.fronts.parent)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)],
                               devices=plan, dense_flops=1e30, split_dense=None,
                               split_model=model)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=None)
    _same_gram(A, one, many)
