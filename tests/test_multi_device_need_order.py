"""Each device's stages in the order of the fronts their blocks feed
(``DevicePlan.stage_order='need'``, the default), without a GPU: the order by hand,
grid 64³'s four-device plan (the device of two subtrees runs first the one the first
split front takes), and plans whose devices leave postorder, over NumPy layers and
the NumPy executor of simulated devices, to the one-device answer."""

from dataclasses import replace

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._engine.host.multi_device import simulate_multi_device
from scipy_gpuqr._engine.host.simulate import simulate_factorize
from scipy_gpuqr._schedule import devices
from scipy_gpuqr._schedule.dense_split import SplitModel
from scipy_gpuqr._schedule.devices import DevicePlan, map_devices, stage_needs
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

from test_multi_device_host_floor import _small_model, force_time_mapping
from test_multi_device_split import _same_gram


def _plan(owner, stages, parent, order="need"):
    owner = np.asarray(owner)
    sdev = np.array([owner[a] for a, _ in stages])
    nd = int(owner.max()) + 1
    return DevicePlan(ndevices=nd, owner=owner, upper=np.zeros(len(owner), bool),
                      upper_device=0, stages=tuple(stages), stage_device=sdev, transfers=(),
                      device_flops=np.zeros(nd), subtree_flops=np.zeros(nd),
                      device_bytes=np.zeros(nd, np.int64), stage_order=order,
                      stage_need=stage_needs(stages, parent))


def test_stage_needs_and_order():
    """A stage feeding the root comes after one feeding an earlier front, a stage
    feeding a later stage of its own device before that stage, the root's last;
    ``'postorder'`` keeps postorder."""
    #      7 (root)
    #    /   \
    #   2     6
    #  / \   / \
    # 0   1 4   5
    #       |
    #       3
    parent = np.array([2, 2, 7, 4, 6, 6, 7, -1])
    stages = [(f, f) for f in range(8)]
    assert stage_needs(stages, parent).tolist() == [2, 2, 7, 4, 6, 6, 7, 8]
    owner = [1, 0, 1, 1, 0, 1, 0, 0]
    plan = _plan(owner, stages, parent)
    assert plan.device_stages(1) == [0, 3, 5, 2]
    assert plan.device_stages(0) == [1, 4, 6, 7]
    assert replace(plan, stage_order="postorder").device_stages(1) == [0, 2, 3, 5]
    assert replace(plan, stage_need=None).device_stages(1) == [0, 2, 3, 5]
    # a stage of several fronts goes by its first outgoing block
    assert stage_needs([(0, 1), (2, 2), (3, 4), (5, 5), (6, 7)], parent).tolist() == \
        [2, 7, 6, 6, 8]


def test_no_device_waits_on_a_later_stage():
    """Every carried block comes from a stage of smaller need than the stage taking
    it, so no device's order has it wait for a stage another device runs later."""
    an = analyze(grid3d_least_squares(12))
    par = np.asarray(an.fronts.parent)
    for k in (2, 3, 4):
        plan = map_devices(an, k, split_model=_small_model(), cache=False)
        stage_of = np.zeros(len(par), dtype=np.int64)
        for s, (a, b) in enumerate(plan.stages):
            stage_of[a:b + 1] = s
        kids = np.flatnonzero(par >= 0)
        for c in kids[stage_of[kids] != stage_of[par[kids]]]:
            assert plan.stage_need[stage_of[c]] < plan.stage_need[stage_of[par[c]]]


def test_grid64_four_devices():
    """Grid 64³ on four devices: the device with two subtrees (9640, feeding the first
    split front 13070, and 1885, feeding the root) runs 9640's first; every device's
    stages by need."""
    an = analyze(grid3d_least_squares(64))
    plan = map_devices(an, 4, split_model=SplitModel(), cache=False)
    par = np.asarray(an.fronts.parent)
    assert plan.stage_order == "need" and sorted(plan.split)[0] == 13070
    last = {b: s for s, (_, b) in enumerate(plan.stages)}
    assert int(par[9640]) == 13070 and int(par[1885]) == 13072
    d = int(plan.stage_device[last[9640]])
    assert d == int(plan.stage_device[last[1885]])
    order = plan.device_stages(d)
    assert order.index(last[9640]) < order.index(last[1885])
    for d in range(4):
        needs = [int(plan.stage_need[s]) for s in plan.device_stages(d)]
        assert needs == sorted(needs)


def _reordered(plan):
    return [plan.device_stages(d) for d in range(plan.ndevices)] != \
        [np.flatnonzero(plan.stage_device == d).tolist() for d in range(plan.ndevices)]


@pytest.mark.parametrize("g, k", [(7, 2), (7, 4), (8, 3), (9, 3), (11, 2), (12, 3)])
def test_need_order_on_numpy_layers(monkeypatch, g, k):
    """Time plans (small grids, the time mapping forced) whose devices take their stages
    out of postorder, beside split fronts, run over NumPy layers and on the simulated
    devices to the one-device answer, as in postorder: R's Gram and Q R = A P."""
    force_time_mapping(monkeypatch)
    A = grid3d_least_squares(g)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, k, split_model=model, cache=False)
    assert plan.stage_order == "need" and _reordered(plan)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=None)
    for p in (plan, replace(plan, stage_order="postorder")):
        many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)],
                                   devices=p, dense_flops=1e30, split_dense=None,
                                   split_model=model)
        _same_gram(A, one, many)
    one = simulate_factorize(A, an)
    for p in (plan, replace(plan, stage_order="postorder")):
        _same_gram(A, one, simulate_multi_device(A, an, devices=p, rng=np.random.default_rng(k)))
