"""Sparse QR over several devices, without a GPU: the device plan's properties
(every front owned once, subtrees closed, balance) and the multi-device task
lists run on 2-4 simulated devices (NumPy executor, and the GPU driver's host
logic over NumPy device layers) giving the one-device answer."""

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import real_shared_matrices
from scipy_gpuqr import GpuqrOptions
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._engine.host.multi_device import simulate_multi_device
from scipy_gpuqr._engine.host.simulate import simulate_factorize
from scipy_gpuqr._schedule import devices
from scipy_gpuqr._schedule.devices import (MULTI_DEVICE_MIN_FLOPS, devices_for, makespan,
                                           map_devices, map_fronts)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares, small_families)

#: Modelled makespan over its lower bound (mean load, longest path): the worst
#: seen on the shared matrices and grids is 1.41.
MAKESPAN_BOUND = 1.5


def _critical_path(an) -> float:
    fs = an.fronts
    fl = np.asarray(an.front_flops, dtype=float)
    below = np.zeros(fs.nfronts)
    path = np.zeros(fs.nfronts)
    for f in range(fs.nfronts):
        path[f] = below[f] + fl[f]
        p = fs.parent[f]
        if p >= 0:
            below[p] = max(below[p], path[f])
    return float(path.max()) if fs.nfronts else 0.0


def _check_plan(an, plan, k):
    fs = an.fronts
    nf = fs.nfronts
    own = plan.owner
    assert own.shape == (nf,) and own.min(initial=0) >= 0 and own.max(initial=0) < k
    # the stages partition the postorder into runs of one device
    covered = np.zeros(nf, dtype=int)
    nxt = 0
    for (a, b), d in zip(plan.stages, plan.stage_device):
        assert a == nxt and b >= a
        assert np.all(own[a:b + 1] == d)
        covered[a:b + 1] += 1
        nxt = b + 1
    assert nxt == nf and np.all(covered == 1)
    par = fs.parent
    for f in range(nf):
        p = par[f]
        if p < 0:
            continue
        if not plan.upper[f]:               # a subtree below the upper tree: one device
            assert plan.upper[p] or own[p] == own[f]
        else:                               # the upper tree is closed upwards
            assert plan.upper[p]
    # the transfers are exactly the blocks crossing devices
    cross = {(int(c), int(par[c])) for c in range(nf)
             if par[c] >= 0 and own[c] != own[par[c]]
             and fs.cm[c] > 0 and fs.fn[c] > fs.fp[c]}
    assert {(t[0], t[1]) for t in plan.transfers} == cross
    for c, p, s, t, nbytes in plan.transfers:
        assert (s, t) == (own[c], own[p]) and nbytes > 0
    # every front's flops are on exactly one device
    assert np.isclose(plan.device_flops.sum(), float(np.sum(an.front_flops)))
    assert np.isclose(plan.makespan, makespan(fs.parent, an.front_flops, own))


def _planner_cases():
    yield "grid10", grid3d_least_squares(10)
    yield "grid16", grid3d_least_squares(16)
    yield "chess", chessboard_boundary(6, 7, 3)
    yield "randls", random_least_squares(600, 250, 0.01, seed=3)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("name, A", list(_planner_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_plan_properties_on_grids(name, A, k):
    an = analyze(A)
    plan = map_devices(an, k)
    _check_plan(an, plan, k)
    lb = max(float(np.sum(an.front_flops)) / k, _critical_path(an))
    assert plan.makespan <= MAKESPAN_BOUND * lb
    if k == 1:
        assert plan.stages == ((0, an.fronts.nfronts - 1),) and not plan.transfers


@pytest.mark.parametrize("k", [2, 3, 4])
def test_plan_properties_on_shared_matrices(matrices_dir, k):
    seen = 0
    for name, A in real_shared_matrices(matrices_dir):
        if A.nnz > 300_000:
            continue
        an = analyze(A)
        if an.fronts.nfronts == 0:
            continue
        plan = map_devices(an, k)
        _check_plan(an, plan, k)
        lb = max(float(np.sum(an.front_flops)) / k, _critical_path(an))
        assert plan.makespan <= MAKESPAN_BOUND * lb, name
        seen += 1
    assert seen >= 20


def test_wide_trees_balance():
    """A tree of many independent subtrees: loads near the mean on every device."""
    A = sp.block_diag([random_least_squares(60, 30, 0.15, seed=s) for s in range(24)],
                      format="csc")
    an = analyze(sp.csc_array(A))
    for k in (2, 3, 4):
        plan = map_devices(an, k)
        _check_plan(an, plan, k)
        assert plan.balance <= 1.25
        assert plan.modelled_speedup >= 0.75 * k


def test_map_fronts_by_hand():
    #      6
    #    /   \
    #   2     5          weights: leaves 1, internal 1, root 1
    #  / \   / \
    # 0   1 3   4
    parent = np.array([2, 2, 6, 5, 5, 6, -1])
    child_ptr = np.array([0, 0, 0, 2, 2, 2, 4, 6])
    children = np.array([0, 1, 3, 4, 2, 5])
    owner, upper = map_fronts(parent, child_ptr, children, np.ones(7), 2)
    assert upper.tolist() == [False] * 6 + [True]
    assert owner[6] == 0 and len({owner[0], owner[1], owner[2]}) == 1
    assert len({owner[3], owner[4], owner[5]}) == 1 and owner[2] != owner[5]
    owner4, upper4 = map_fronts(parent, child_ptr, children, np.ones(7), 4)
    assert upper4[[2, 5, 6]].all() and sorted(set(owner4[[0, 1, 3, 4]].tolist())) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        map_fronts(parent, child_ptr, children, np.ones(7), 0)


def test_speeds_share_the_subtrees():
    """Measured speeds: a device twice as fast gets about twice the subtree flops,
    the plan stays a valid one, and its makespan counts each device's speed."""
    A = sp.block_diag([random_least_squares(60, 30, 0.15, seed=s) for s in range(24)],
                      format="csc")
    an = analyze(sp.csc_array(A))
    fs = an.fronts
    even = map_devices(an, 2)
    for speeds in ([1.0, 2.0], [2.0, 1.0]):
        plan = map_devices(an, 2, speeds=speeds)
        _check_plan_speeds(an, plan, speeds)
        ratio = plan.subtree_flops[1] / plan.subtree_flops[0]
        assert ratio == pytest.approx(speeds[1] / speeds[0], rel=0.2)
    assert even.subtree_flops[1] / even.subtree_flops[0] == pytest.approx(1.0, rel=0.2)
    # makespan: one device at half the speed takes its fronts' flops twice over
    own = np.zeros(fs.nfronts, dtype=np.int64)
    fl = np.asarray(an.front_flops, dtype=float)
    assert makespan(fs.parent, fl, own, [1.0, 1.0]) == pytest.approx(fl.sum())
    assert makespan(fs.parent, fl, own, [1.0, 3.0]) == pytest.approx(2 * fl.sum())
    # a split front's weight is its split time whatever its device's speed
    top = fs.nfronts - 1
    assert makespan(fs.parent, fl, own, [1.0, 3.0], [top]) == \
        pytest.approx(2 * fl.sum() - fl[top])
    with pytest.raises(ValueError, match="speeds"):
        map_fronts(fs.parent, fs.child_ptr, fs.children, fl, 2, speeds=[1.0, 0.0])
    with pytest.raises(ValueError, match="speeds"):
        map_fronts(fs.parent, fs.child_ptr, fs.children, fl, 2, speeds=[1.0])


def test_map_devices_cached_by_pattern():
    """A second mapping of the pattern reuses the first's (same arrays), the budget
    given now deciding fits; uncached, the same plan."""
    from scipy_gpuqr._schedule.dense_split import SplitModel

    an = analyze(grid3d_least_squares(12))
    first = map_devices(an, 2, split_model=SplitModel())
    again = map_devices(an, 2, device_memory=1 << 40, split_model=SplitModel())
    assert again.owner is first.owner and again.budget == 1 << 40 and again.fits
    fresh = map_devices(an, 2, device_memory=1 << 40, split_model=SplitModel(), cache=False)
    assert fresh.owner is not first.owner
    assert np.array_equal(fresh.owner, first.owner) and fresh.stages == first.stages
    assert fresh.makespan == again.makespan and sorted(fresh.split) == sorted(again.split)
    tight = map_devices(an, 2, device_memory=int(0.8 * first.device_bytes.max()))
    assert tight.budget == int(0.8 * first.device_bytes.max())
    assert tight.weight != "flops" or tight.fits
    assert map_devices(an, 2, speeds=[1.0, 2.0]).owner is not map_devices(an, 2).owner


def _check_plan_speeds(an, plan, speeds):
    """_check_plan's checks, the makespan modelled at ``speeds``."""
    fs = an.fronts
    assert np.isclose(plan.makespan, makespan(fs.parent, an.front_flops, plan.owner, speeds))
    assert np.isclose(plan.device_flops.sum(), float(np.sum(an.front_flops)))
    covered = np.zeros(fs.nfronts, dtype=int)
    for (a, b), d in zip(plan.stages, plan.stage_device):
        assert np.all(plan.owner[a:b + 1] == d)
        covered[a:b + 1] += 1
    assert np.all(covered == 1)


def test_measured_speeds_and_device_speeds():
    """measured_speeds: flops outside the split fronts per second less theirs (busy,
    or the thread's enqueueing less its waits for blocks where longer), mean 1;
    a factorization mapped with them (NumPy layers) is still right."""
    from types import SimpleNamespace

    from scipy_gpuqr._engine.gpu.multi_device import measured_speeds

    A = grid3d_least_squares(9)
    an = analyze(A)
    fl = np.asarray(an.front_flops, dtype=float)
    top = int(an.fronts.nfronts - 1)
    per = [{"flops": 3e9 + fl[top], "busy_seconds": 1.0 + 0.5},
           {"flops": 2e9, "busy_seconds": 1.0}]
    info = {"devices": {"upper_device": 0, "devices": per},
            "split_fronts": [{"front": top, "seconds": 0.5},
                             {"front": 0, "fallback": "out of memory"}]}
    got = measured_speeds(SimpleNamespace(info=info, analysis=an))
    assert got == pytest.approx([1.2, 0.8])
    # a device bound by its enqueueing thread: that thread's time counts
    per[0]["enqueue_seconds"], per[0]["wait_blocks_seconds"] = 3.5, 0.5   # 3.0 > 1.5 busy
    per[1]["enqueue_seconds"], per[1]["wait_blocks_seconds"] = 0.5, 0.0   # < 1.0 busy
    got = measured_speeds(SimpleNamespace(info=info, analysis=an))
    assert got == pytest.approx([0.75, 1.25])       # 3e9 / 2.5 s against 2e9 / 1 s
    per[1]["busy_seconds"] = per[1]["enqueue_seconds"] = 0.0
    assert measured_speeds(SimpleNamespace(info=info, analysis=an)) is None
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                               device_speeds=[0.5, 1.5])
    _same_answer(A, one, many)
    sub = [d["subtree_flops"] for d in many.info["devices"]["per_device"]]
    even = map_devices(an, 2)
    assert sub[1] / sub[0] > even.subtree_flops[1] / even.subtree_flops[0]


def test_measured_speeds_are_bounded_and_need_time():
    """measured_speeds: None where a device's share took less than SPEED_MIN_SECONDS
    (noise), and a speed far from the mean brought back to SPEED_RANGE."""
    from types import SimpleNamespace

    from scipy_gpuqr._engine.gpu import multi_device as md

    an = analyze(grid3d_least_squares(6))
    lo, hi = md.SPEED_RANGE
    per = [{"flops": 1e9, "busy_seconds": 1.0}, {"flops": 1e9, "busy_seconds": 100.0}]
    info = {"devices": {"upper_device": 0, "devices": per}, "split_fronts": []}
    got = md.measured_speeds(SimpleNamespace(info=info, analysis=an))
    assert np.mean(got) == pytest.approx(1.0)
    # relative speeds 200/101 and 2/101; the second brought up to lo, then mean 1
    assert got[1] / got[0] == pytest.approx(lo / (200 / 101))
    per[1]["busy_seconds"] = 0.5 * md.SPEED_MIN_SECONDS
    assert md.measured_speeds(SimpleNamespace(info=info, analysis=an)) is None


def test_remember_speeds_per_pattern_and_device_set():
    """The first measurement is kept (mean 1); a later one is averaged with it
    (geometric mean) and replaces it only past SPEEDS_CHANGE; other device sets and
    other patterns keep their own."""
    from scipy_gpuqr._schedule.devices import (SPEEDS_CHANGE, remember_speeds,
                                               remembered_speeds)
    an = analyze(grid3d_least_squares(6), cache=False)      # its own table entry
    other = analyze(grid3d_least_squares(5), cache=False)
    two, three = ("two", 8), ("three", 8)
    assert remembered_speeds(an, two) is None
    assert remember_speeds(an, two, [1.0, 3.0]) == pytest.approx((0.5, 1.5))
    assert remembered_speeds(an, two) == pytest.approx((0.5, 1.5))
    # a second measurement: the geometric mean of both, normalized
    g = np.sqrt(np.array([0.5, 1.5]) * np.array([1.0, 1.0]))
    assert remember_speeds(an, two, [2.0, 2.0]) == pytest.approx(tuple(g / g.mean()))
    kept = remembered_speeds(an, two)
    # a measurement within the change bound leaves them as they are (same mapping)
    near = np.array(kept) * np.array([1 + SPEEDS_CHANGE, 1 - SPEEDS_CHANGE])
    assert remember_speeds(an, two, near) == kept
    assert remembered_speeds(an, two) == kept
    assert remembered_speeds(an, three) is None and remembered_speeds(other, two) is None
    remember_speeds(an, three, [1.0, 1.0, 4.0])
    assert remembered_speeds(an, two) == kept
    for bad in ([1.0, 0.0], [1.0, np.nan], [], [[1.0]]):
        with pytest.raises(ValueError):
            remember_speeds(an, two, bad)


def test_speeds_scattering_from_call_to_call_settle_one_mapping():
    """Speeds measured 20 % off either way at alternate calls (as four GPUs' calls
    scattered): the kept speeds, those the next call maps by, change at the first
    calls only and then stay (the average of the measurements settles), near the
    middle; a lasting change still moves them."""
    from scipy_gpuqr._schedule.devices import SPEEDS_CHANGE, remember_speeds
    an = analyze(grid3d_least_squares(6), cache=False)
    key = ("scatter", 8)
    kept = [remember_speeds(an, key, [1.2, 0.8] if i % 2 == 0 else [0.8, 1.2])
            for i in range(20)]
    changes = [i for i in range(1, 20) if kept[i] != kept[i - 1]]
    assert changes and max(changes) < 8, changes
    assert abs(kept[-1][0] - 1.0) <= 2 * SPEEDS_CHANGE
    for _ in range(12):                     # a lasting change: device 0 twice as fast
        last = remember_speeds(an, key, [4 / 3, 2 / 3])
    assert last[0] > 1.2


def test_second_call_maps_by_the_speeds_the_first_measured(monkeypatch):
    """multi_gpu_factorize's default (device_speeds='measured') on NumPy layers: a
    pattern's first call maps on flops and remembers the speeds it measured; the next
    call on the same devices maps by what is remembered, says so in info, and gives
    the one-device answer; device_speeds=None maps on flops again; another device set
    starts on flops."""
    from scipy_gpuqr._engine.gpu import multi_device as md
    from scipy_gpuqr._schedule.devices import remember_speeds, remembered_speeds

    monkeypatch.setattr(md, "SPEED_MIN_SECONDS", 0.0)   # host timings of tiny shares
    # a tiny grid's modelled gain is far below what a new plan costs a large one
    monkeypatch.setattr(devices, "REMAP_SECONDS", 0.0)
    A = grid3d_least_squares(9)
    an = analyze(A, cache=False)
    key = md.speeds_key([NumpyDevice(32, 3)] * 2, np.float64)

    def layers(k):
        return [NumpyDevice(32, 3) for _ in range(k)]

    first = multi_gpu_factorize(A, an, layers=layers(2))
    mp = first.info["devices"]["mapping"]
    assert mp["by"] == "flops" and mp["speeds"] is None
    assert np.array_equal(first.info["devices"]["per_device"][0]["flops"],
                          map_devices(an, 2).as_dict()["per_device"][0]["flops"])
    assert mp["measured"] == pytest.approx(md.measured_speeds(first))
    assert tuple(mp["remembered"]) == remembered_speeds(an, key)
    # speeds of our choosing for the next call (host timings are noise): measured
    # again and again, the kept ones come within SPEEDS_CHANGE of them
    for _ in range(10):
        kept = remember_speeds(an, key, [0.4, 1.6])
    assert kept[0] < 0.5 < 1.5 < kept[1]
    second = multi_gpu_factorize(A, an, layers=layers(2))
    mp = second.info["devices"]["mapping"]
    assert mp["by"] == "measured speeds" and mp["speeds"] == pytest.approx(kept)
    want = map_devices(an, 2, speeds=kept)
    got = [d["subtree_flops"] for d in second.info["devices"]["per_device"]]
    assert got == pytest.approx(want.subtree_flops.tolist())
    even = map_devices(an, 2)
    assert got[1] / got[0] > even.subtree_flops[1] / even.subtree_flops[0]
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    _same_answer(A, one, second)
    flops = multi_gpu_factorize(A, an, layers=layers(2), device_speeds=None)
    assert flops.info["devices"]["mapping"]["by"] == "flops"
    assert [d["subtree_flops"] for d in flops.info["devices"]["per_device"]] == \
        pytest.approx(even.subtree_flops.tolist())
    three = multi_gpu_factorize(A, an, layers=layers(3))
    assert three.info["devices"]["mapping"]["by"] == "flops"
    given = multi_gpu_factorize(A, an, layers=layers(2), device_speeds=[1.0, 1.0])
    assert given.info["devices"]["mapping"]["by"] == "given speeds"
    with pytest.raises(ValueError):
        multi_gpu_factorize(A, an, layers=layers(2), device_speeds="fast")


def test_mapping_seconds_decide_whether_measured_speeds_keep_mapping():
    """remember_mapping_seconds keeps the last devices' seconds per mapping, pattern
    and device set; measured_mapping_lost once the measured mapping's last call took
    MAPPING_SLOWER longer than the flops mapping's, not within it nor without both."""
    from scipy_gpuqr._schedule.devices import (MAPPING_SLOWER, mapping_seconds,
                                               measured_mapping_lost,
                                               remember_mapping_seconds)
    an = analyze(grid3d_least_squares(6), cache=False)      # its own table entry
    other = analyze(grid3d_least_squares(5), cache=False)
    two, four = ("two", 8), ("four", 8)
    assert mapping_seconds(an, two) == {} and not measured_mapping_lost(an, two)
    remember_mapping_seconds(an, two, "measured speeds", 3.0)
    assert not measured_mapping_lost(an, two)               # nothing on flops to weigh
    remember_mapping_seconds(an, two, "flops", 2.0)
    assert mapping_seconds(an, two) == {"flops": 2.0, "measured speeds": 3.0}
    assert measured_mapping_lost(an, two)
    remember_mapping_seconds(an, two, "measured speeds", 2.0 * (1 + 0.5 * MAPPING_SLOWER))
    assert not measured_mapping_lost(an, two)               # within the margin: noise
    assert mapping_seconds(an, four) == {} and mapping_seconds(other, two) == {}


def test_default_mapping_leaves_measured_speeds_that_ran_slower(monkeypatch):
    """multi_gpu_factorize's default on NumPy layers: with speeds remembered, the call
    maps by them unless the pattern's last call by them took longer on the devices
    than its last call on flops; then it maps on flops, with the one-device answer.
    Every call keeps its devices' seconds under what it mapped by."""
    from scipy_gpuqr._engine.gpu import multi_device as md
    from scipy_gpuqr._schedule.devices import (mapping_seconds, remember_mapping_seconds,
                                               remember_speeds)

    monkeypatch.setattr(md, "SPEED_MIN_SECONDS", 0.0)   # host timings of tiny shares
    # a tiny grid's modelled gain is far below what a new plan costs a large one
    monkeypatch.setattr(devices, "REMAP_SECONDS", 0.0)
    A = grid3d_least_squares(9)
    an = analyze(A, cache=False)
    key = md.speeds_key([NumpyDevice(32, 3)] * 2, np.float64)

    def call(**kw):
        return multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)], **kw)

    first = call()
    mp = first.info["devices"]["mapping"]
    span = md.devices_seconds(first.info)
    assert mp["by"] == "flops" and span is not None and span > 0
    assert mp["seconds"] == {"flops": pytest.approx(span)}
    for _ in range(10):
        kept = remember_speeds(an, key, [0.4, 1.6])
    remember_mapping_seconds(an, key, "flops", 1.0)
    remember_mapping_seconds(an, key, "measured speeds", 0.5)
    assert call().info["devices"]["mapping"]["by"] == "measured speeds"
    remember_mapping_seconds(an, key, "flops", 1.0)
    remember_mapping_seconds(an, key, "measured speeds", 2.0)
    third = call()
    mp = third.info["devices"]["mapping"]
    assert mp["by"] == "flops" and mp["speeds"] is None
    even = map_devices(an, 2)
    got = [d["subtree_flops"] for d in third.info["devices"]["per_device"]]
    assert got == pytest.approx(even.subtree_flops.tolist())
    assert mapping_seconds(an, key)["flops"] == pytest.approx(md.devices_seconds(third.info))
    _same_answer(A, gpu_factorize(A, an, device=NumpyDevice(32, 3)), third)
    given = call(device_speeds=kept)        # given speeds are kept apart
    assert given.info["devices"]["mapping"]["by"] == "given speeds"
    assert mapping_seconds(an, key)["measured speeds"] == 2.0


def test_memory_weight_when_flops_overflow_a_device():
    an = analyze(grid3d_least_squares(10))
    free = map_devices(an, 2)
    budget = int(0.8 * free.device_bytes.max())
    plan = map_devices(an, 2, device_memory=budget)
    _check_plan(an, plan, 2)
    assert plan.budget == budget
    assert plan.device_bytes.max() <= free.device_bytes.max()
    assert plan.fits == bool(plan.device_bytes.max() <= budget)
    d = plan.as_dict()
    assert d["ndevices"] == 2 and len(d["per_device"]) == 2


def test_devices_rule():
    big = MULTI_DEVICE_MIN_FLOPS
    # None: one GPU whatever the problem; 'auto' applies the rule
    assert devices_for(None, 4, 10 * big, 300, 100)[0] == [0]
    assert devices_for("auto", 1, 10 * big, 0, None)[0] == [0]
    assert devices_for("auto", 4, 10 * big, 0, None)[0] == [0, 1, 2, 3]
    assert devices_for("auto", 4, big / 10, 0, None)[0] == [0]
    # a tree whose work is one chain gains nothing from more GPUs
    assert devices_for("auto", 4, 10 * big, 0, None, speedup=lambda k: 1.02)[0] == [0]
    assert devices_for("auto", 4, 10 * big, 0, None, speedup=lambda k: 1.5)[0] == [0, 1, 2, 3]
    # too big for one GPU but within the sum: all of them, whatever the flops
    assert devices_for("auto", 2, 1.0, 150, 100)[0] == [0, 1]
    assert devices_for("auto", 2, 1.0, 250, 100)[0] == [0]
    assert devices_for(2, 4, 1.0, 0, None)[0] == [0, 1]
    assert devices_for([0, 0], 1, 1.0, 0, None)[0] == [0, 0]
    for bad in (0, 5, [], [7]):
        with pytest.raises(ValueError):
            devices_for(bad, 4, 1.0, 0, None)


def test_options_devices():
    assert GpuqrOptions().devices is None
    assert GpuqrOptions(devices="auto").devices == "auto"
    assert GpuqrOptions(devices=[0, 1]).devices == (0, 1)
    assert GpuqrOptions(devices=2).devices == 2
    hash(GpuqrOptions(devices=[0, 0]))
    for bad in (0, -1, [], [-1], "0", "all", [0.5]):
        with pytest.raises((ValueError, TypeError)):
            GpuqrOptions(devices=bad)


# ---------------------------------------------------------------- the executors

def _executor_cases():
    rng = np.random.default_rng(7)
    A = grid3d_least_squares(7).astype(float)
    A.data = rng.standard_normal(A.nnz)
    yield "grid7", A
    yield "chess", chessboard_boundary(5, 6, 2).astype(np.float64)
    yield "randls", random_least_squares(300, 120, 0.03, dense_rows=2, seed=2)
    yield "wide", random_least_squares(60, 140, 0.05, seed=3)
    yield "blocks", sp.csc_array(sp.block_diag(
        [random_least_squares(40, 20, 0.2, seed=s) for s in range(9)], format="csc"))


def _same_answer(A, one, many):
    """R equal up to rounding, Q R = A P, Qᵀ and Q as the one-device run's, solves."""
    m, n = A.shape
    scale = max(abs(one.R).max() if one.R.nnz else 1.0, 1.0)
    assert abs(many.R - one.R).max() <= 1e-13 * scale
    assert np.array_equal(many.colperm, one.colperm)
    rng = np.random.default_rng(1)
    B = rng.standard_normal((m, 2))
    assert np.allclose(many.qt_matmul(B), one.qt_matmul(B), rtol=0, atol=1e-12 * abs(B).max())
    assert np.allclose(many.q_matmul(B), one.q_matmul(B), rtol=0, atol=1e-12 * abs(B).max())
    k = min(m, n)
    X = rng.standard_normal((n, 2))
    Y = np.zeros((m, 2))
    Y[:k] = many.R @ X
    QR = many.q_matmul(Y)
    AP = A[:, many.colperm] @ X
    assert np.abs(QR - AP).max() <= 1e-11 * max(1.0, np.abs(AP).max())
    if m >= n:                               # least squares through Q and R
        b = rng.standard_normal(m)
        c = many.qt_matmul(b)[:n]
        Rd = many.R.toarray()
        if np.abs(np.diag(Rd)).min() > 1e-8 * np.abs(np.diag(Rd)).max():
            x = np.zeros(n)
            x[many.colperm] = np.linalg.solve(np.triu(Rd), c)
            ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
            assert np.allclose(x, ref, atol=1e-8 * max(1.0, abs(ref).max()))


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("name, A", list(_executor_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_simulated_devices_equal_one_device(name, A, k):
    an = analyze(A)
    one = simulate_factorize(A, an)
    many = simulate_multi_device(A, an, devices=k, rng=np.random.default_rng(k))
    _same_answer(A, one, many)
    info = many.info["devices"]
    assert info["ndevices"] == k
    per = info["devices"]
    assert sum(d["stages"] for d in per) == many.info["stages"]
    # what left one device arrived at another, every block that crosses is moved
    assert sum(d["sent_bytes"] for d in per) == sum(d["received_bytes"] for d in per)
    assert len(many.info["transfers"]) == info["transfers"]
    for c, s, t, nbytes, _ in many.info["transfers"]:
        assert s != t and nbytes > 0


def test_simulated_devices_with_dense_fronts_and_launch_limits():
    A = grid3d_least_squares(7)
    an = analyze(A)
    for kw in ({"dense_flops": 2e5}, {"max_tasks": 7}, {"pipelining": False}):
        one = simulate_factorize(A, an, **kw)
        many = simulate_multi_device(A, an, devices=3, **kw)
        _same_answer(A, one, many)
    assert many.info["dense_fronts"] == 0
    assert simulate_multi_device(A, an, devices=2, dense_flops=2e5).info["dense_fronts"] > 0


def test_simulated_devices_small_families():
    for name, A in small_families():
        an = analyze(A)
        one = simulate_factorize(A, an)
        many = simulate_multi_device(A, an, devices=3)
        assert many.R.shape == one.R.shape, name
        if min(A.shape):
            _same_answer(A, one, many)


def test_simulated_devices_memory_within_budget():
    """Each device's front pools stay within the plan's bytes (no host staging)."""
    A = grid3d_least_squares(7)
    an = analyze(A)
    plan = map_devices(an, 2)
    many = simulate_multi_device(A, an, devices=plan)
    _same_answer(A, simulate_factorize(A, an), many)
    sched = many.schedule
    for d in range(2):
        elems = sum(sched.stages[s].pool_size for s in plan.device_stages(d))
        assert elems * 8 <= plan.device_bytes[d]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_gpu_driver_host_logic_on_numpy_layers(k):
    """The multi-GPU driver over NumPy device layers equals the one-GPU driver."""
    for name, A in list(_executor_cases())[:3]:
        an = analyze(A)
        one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
        many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)])
        _same_answer(A, one, many)
        per = many.info["devices"]["devices"]
        assert len(per) == k and sum(d["stages"] for d in per) == many.info["stages"]
        assert {t[0] for t in many.info["transfers"]} == \
            {t[0] for t in map_devices(an, k).transfers}


def test_defer_carried_packs():
    """Carried blocks' Pack-Assemble records move from a stage's first launch to the
    launch before their parent is first read; nothing else changes."""
    from scipy_gpuqr._schedule.devices import defer_carried_packs
    from scipy_gpuqr._schedule.sparse import build_schedule
    from scipy_gpuqr._schedule.tasks import TaskType

    moved_some = False
    for n, k, kw in ((8, 2, {}), (8, 4, {}), (10, 3, {"max_tasks": 9}),
                     (9, 3, {"dense_flops": 2e5})):
        an = analyze(grid3d_least_squares(n))
        fs = an.fronts
        sched = build_schedule(an, plan=map_devices(an, k).stage_plan(), **kw)
        for st in sched.stages:
            new, at = defer_carried_packs(st, fs.parent)
            assert set(at) == set(st.carried)
            assert new.nlaunch == st.nlaunch and new.ntasks == st.ntasks
            words = st.tasks.dtype.itemsize

            def rows(t):
                return sorted(bytes(r) for r in t.view(np.uint8).reshape(len(t), words))
            assert rows(new.tasks) == rows(st.tasks)
            lp0, lp1 = st.launch_ptr, new.launch_ptr
            for L in range(st.nlaunch):
                old_t = st.tasks[lp0[L]:lp0[L + 1]]
                new_t = new.tasks[lp1[L]:lp1[L + 1]]
                carried_pack = ((old_t["type"] == TaskType.PACK_ASSEMBLE)
                                & np.isin(old_t["front"], list(st.carried)))
                assert not carried_pack.any() or L == 0
                # every other record stays in its launch, in its order
                keep_new = ~((new_t["type"] == TaskType.PACK_ASSEMBLE)
                             & np.isin(new_t["front"], list(st.carried)))
                assert new_t[keep_new].tobytes() == old_t[~carried_pack].tobytes()
                for c in np.unique(new_t["front"][~keep_new]).tolist():
                    assert at[c] == L
            for c, L in at.items():
                p = int(fs.parent[c])
                t = new.tasks
                launch = np.repeat(np.arange(new.nlaunch), np.diff(lp1))
                reads = launch[(t["front"] == p) & (t["type"] != TaskType.S_ASSEMBLE)]
                if len(reads):
                    assert L < reads.min()
                if p in new.dense:
                    assert L <= new.dense[p]
                moved_some |= L > 0
    assert moved_some


@pytest.mark.parametrize("k", [2, 3])
def test_gpu_driver_threads_progressive_r(monkeypatch, k):
    """Each layer on its own thread, R copied while the launches run (R's layout ready
    before the first launch: the helper runs at once), blocks packed late: the
    one-device answer, and R's copies really happened in several pieces."""
    import concurrent.futures as cf

    from scipy_gpuqr._engine.gpu import multi_device as md

    class _AtOnce:
        def __init__(self, max_workers=None):
            pass

        def submit(self, fn, *a, **kw):
            f = cf.Future()
            f.set_result(fn(*a, **kw))
            return f

        def shutdown(self, wait=True):
            pass

    monkeypatch.setattr(md, "ThreadPoolExecutor", _AtOnce)
    for name, A in list(_executor_cases())[:3]:
        an = analyze(A)
        one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
        layers = [NumpyDevice(32, 3) for _ in range(k)]
        many = multi_gpu_factorize(A, an, layers=layers)
        _same_answer(A, one, many)
        assert many.info["r_copy_progressive"] == many.info["stages"], name
        if name == "grid7":
            # some stage's copy came in more than one piece (ranges final early)
            assert max(len(layer.r_copies) for layer in layers) > many.info["stages"]
        per = many.info["devices"]["devices"]
        assert all(d["enqueue_seconds"] >= d["wait_blocks_seconds"] >= 0 for d in per)
        # every entry of R's gather maps put in R's data once, counted for its device
        nnz_r = many.R.nnz
        assert sum(d["r_copy"]["entries"] for d in per) <= nnz_r
        for d in per:
            rc = d["r_copy"]
            assert rc["scattered"] == rc["entries"], name
            assert 0 <= rc["scattered_by_enqueued"] <= rc["entries"]
            assert rc["scatter_seconds"] >= 0 and rc["data_wait_seconds"] >= 0
        # each thread's start, stages enqueued and R scattered, within the call
        total = many.info["seconds"]["total"]
        for d in per:
            start, enqueued, end = d["timeline_seconds"]
            assert 0 <= start <= enqueued <= end <= total
            assert enqueued - start == pytest.approx(d["enqueue_seconds"], abs=1e-9)
            parts = d["enqueue_parts"]
            assert set(parts) == {"begin", "launch", "dense", "blocks_out", "other"}
            assert all(v >= 0 for v in parts.values())
            assert sum(parts.values()) <= d["enqueue_seconds"] + 1e-6
            if d["stages"]:
                assert sum(parts.values()) > 0 and d["enqueue_cpu_seconds"] > 0


def test_stage_values_scattered_by_ranges():
    """A stage's R values scattered range by range as they land (a CUDA copier's
    sink), in any order, give R's data as one scatter after the stage does;
    positions None: the stage's values are data's prefix. Each range counts for
    its device."""
    from concurrent.futures import Future

    from scipy_gpuqr._engine.gpu.multi_device import _RData

    rng = np.random.default_rng(4)
    n = 1000
    pos = np.sort(rng.choice(4 * n, size=n, replace=False)).astype(np.int64)
    vals = rng.standard_normal(n)
    for p in (pos, None):
        made = Future()
        made.set_result(np.zeros(4 * n))
        r = _RData(2, np.float64, made)
        cuts = [0, 1, 250, 251, 700, n]
        for a, b in reversed(list(zip(cuts, cuts[1:]))):
            r.put(1, p, a, vals[a:b])
        want = np.zeros(4 * n)
        want[pos if p is not None else slice(0, n)] = vals
        assert np.array_equal(r.take(), want)
        assert r.entries == [0, n] and r.seconds[1] >= 0 and r.waited[1] >= 0
    # without an array made ahead: zeros of R's size
    r = _RData(1, np.float64, size=lambda: 4 * n)
    r.put(0, pos, 0, vals)
    assert np.array_equal(r.take()[pos], vals)


def test_r_scatter_threads_follow_the_enqueueing(monkeypatch):
    """While a device's thread still enqueues, a range is scattered by few threads
    (each started would wait for the GIL), once every device enqueued by more:
    SCATTER_PER_THREAD's two sizes."""
    from concurrent.futures import Future

    from scipy_gpuqr._engine.gpu import multi_device as md
    from scipy_gpuqr._schedule import native

    if native.handle() is None:
        pytest.skip("no compiled helpers")
    asked = []
    real = native.scatter

    def scatter(lib, out, pos, values, threads=0):
        asked.append(threads)
        return real(lib, out, pos, values, threads=threads)

    monkeypatch.setattr(native, "scatter", scatter)
    monkeypatch.setattr(native, "thread_count", lambda n, per, most=16: {
        md.SCATTER_PER_THREAD[0]: 1, md.SCATTER_PER_THREAD[1]: 4}[per])
    assert md.SCATTER_PER_THREAD[0] > md.SCATTER_PER_THREAD[1]
    n = 1 << 12
    made = Future()
    made.set_result(np.zeros(2 * n))
    r = md._RData(2, np.float64, made)
    pos = np.arange(0, 2 * n, 2, dtype=np.int64)
    vals = np.arange(n, dtype=np.float64)
    r.put(0, pos, 0, vals[: n // 2])
    r.enqueued(1)
    r.put(0, pos, n // 4, vals[n // 4: n // 2])     # written twice: the same values
    r.enqueued(0)
    r.put(1, pos, n // 2, vals[n // 2:])
    assert asked == [1, 1, 4]
    assert r.at_enqueued == [n // 2 + n // 4, 0] and r.enqueueing == 0
    assert np.array_equal(r.take()[pos], vals)


def test_r_copy_slots_within_the_budget():
    """The CUDA copiers' larger slots where the plan's devices have room for them,
    the one-GPU engine's where a device would pass its budget."""
    from scipy_gpuqr._engine.gpu.multi_device import R_SLOT_BYTES, _r_slot_bytes
    from scipy_gpuqr._engine.gpu.rcopy import SLOT_BYTES

    an = analyze(grid3d_least_squares(8))
    plan = map_devices(an, 2)
    assert R_SLOT_BYTES > SLOT_BYTES
    assert _r_slot_bytes(plan) == R_SLOT_BYTES           # no budget
    most = int(plan.device_bytes.max())
    roomy = map_devices(an, 2, device_memory=most + (4 << 30), cache=False)
    assert roomy.fits and _r_slot_bytes(roomy) == R_SLOT_BYTES
    tight = map_devices(an, 2, device_memory=most + (64 << 20), cache=False)
    assert tight.fits and _r_slot_bytes(tight) == SLOT_BYTES


def test_gpu_driver_makes_each_device_current_for_its_calls(monkeypatch):
    """Every call on a device layer (start, launches, a stage's end) runs with
    that layer's device current on the calling thread, as CuPy requires of a
    stream made on it: the layers here record which one ``_on`` made current."""
    import contextlib
    import threading

    from scipy_gpuqr._engine.gpu import multi_device

    current = threading.local()

    @contextlib.contextmanager
    def on(layer):
        before = getattr(current, "layer", None)
        current.layer = layer
        try:
            yield
        finally:
            current.layer = before

    monkeypatch.setattr(multi_device, "_on", on)
    wrong = []
    layers = [NumpyDevice(32, 3) for _ in range(2)]
    for layer in layers:
        for name in ("start", "launch", "end_stage"):
            def checked(*args, _layer=layer, _f=getattr(layer, name), _name=name):
                if getattr(current, "layer", None) is not _layer:
                    wrong.append(_name)
                return _f(*args)
            setattr(layer, name, checked)
    A = grid3d_least_squares(9)
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    many = multi_gpu_factorize(A, an, layers=layers, devices=map_devices(an, 2))
    _same_answer(A, one, many)
    assert not wrong, sorted(set(wrong))


def test_gpu_driver_failure_on_one_device_stops_the_others():
    """A device that runs out of memory mid-factorization: the threads of the others
    (waiting for its blocks) stop, and the fallback gives the one-device answer."""
    import warnings

    A = grid3d_least_squares(8)
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    plan = map_devices(an, 2)
    layers = [NumpyDevice(32, 3) for _ in range(2)]
    # the device of the first stage fails in its first stage: the other waits for its block
    bad = int(plan.stage_device[0])

    def boom(*a, **k):
        from scipy_gpuqr._errors import DeviceOutOfMemory
        raise DeviceOutOfMemory("test: no memory")

    assert bad != 0             # the fallback runs on the first layer, a sound one
    layers[bad].launch = boom

    def within(fn, seconds=120):
        """``fn()`` on a thread, failing the test rather than hanging it."""
        import threading
        out = {}

        def go():
            try:
                out["value"] = fn()
            except BaseException as exc:   # noqa: BLE001 - re-raised below
                out["error"] = exc
        t = threading.Thread(target=go, daemon=True)
        t.start()
        t.join(seconds)
        assert not t.is_alive(), "the multi-device threads hung"
        if "error" in out:
            raise out["error"]
        return out["value"]

    with pytest.raises(MemoryError):
        broken = [NumpyDevice(32, 3), NumpyDevice(32, 3)]
        broken[bad].launch = boom
        within(lambda: multi_gpu_factorize(A, an, layers=broken, devices=plan,
                                           fallback=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        back = within(lambda: multi_gpu_factorize(A, an, layers=layers, devices=plan))
    assert "multi_device_fallback" in back.info
    _same_answer(A, one, back)


def test_gpu_driver_host_logic_dense_fronts():
    A = grid3d_least_squares(7)
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=2e5)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(3)],
                               dense_flops=2e5)
    assert many.info["dense_fronts"] == one.info["dense_fronts"] > 0
    _same_answer(A, one, many)


# ---------------------------------------------------------------- the public wiring

def test_dispatch_picks_the_multi_gpu_engine(monkeypatch):
    """With several GPUs visible (faked), ``devices`` and the ``'auto'`` rule reach the
    multi-GPU engine; a request the host cannot meet warns and stays on one GPU."""
    import warnings

    from scipy_gpuqr._dispatch import plan as plan_mod
    from scipy_gpuqr._errors import GpuFallbackWarning

    fake = {"available": True, "device_count": 2, "total_memory": 80 * 2 ** 30}
    monkeypatch.setattr(plan_mod._gpu, "gpu_info", lambda: dict(fake))
    an = analyze(grid3d_least_squares(6))

    def one(*a, **k):
        return "one-gpu"

    reasons = []
    got = plan_mod._gpu_devices(one, an, GpuqrOptions(devices=[0, 1]), reasons)
    assert got is not one and "GPUs [0, 1]" in reasons[-1]
    reasons = []
    auto = GpuqrOptions(devices="auto")
    assert plan_mod._gpu_devices(one, an, auto, reasons) is one  # small: one GPU
    class Big:                  # an analysis whose flop count passes the threshold
        def __init__(self, an):
            self.an, self.flops = an, 10 * MULTI_DEVICE_MIN_FLOPS

        def __getattr__(self, name):
            return getattr(self.an, name)

    tree = Big(analyze(grid3d_least_squares(12)))
    assert plan_mod._gpu_devices(one, tree, auto, reasons) is not one
    assert plan_mod._gpu_devices(one, tree, GpuqrOptions(), reasons) is one  # default: one
    dense = Big(analyze(sp.csc_array(np.random.default_rng(0).standard_normal((60, 40)))))
    assert plan_mod._gpu_devices(one, dense, auto, reasons) is one  # one front
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert plan_mod._gpu_devices(one, an, GpuqrOptions(devices=3), reasons) is one
    assert any(issubclass(x.category, GpuFallbackWarning) for x in w)


@pytest.mark.parametrize("k", [2, 4])
def test_public_simulate_backend_with_devices(k):
    """``backend='simulate'`` with ``devices``: the task lists of k simulated devices
    behind the public solve (minimum-norm least squares as with one device)."""
    from scipy_gpuqr import QRFactorization

    A = random_least_squares(200, 80, 0.05, seed=8)
    b = np.random.default_rng(9).standard_normal(200)
    ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    with QRFactorization(A, backend="simulate", gpuqr_options=GpuqrOptions(devices=k)) as F:
        x = F.solve(b)
        info = F.info
    assert info["backend_info"]["devices"]["ndevices"] == k
    assert np.abs(x - ref).max() <= 1e-10 * max(1.0, np.abs(ref).max())


def test_larger_than_one_device_runs_within_the_sum():
    """A factorization that overflows one simulated device's memory runs on four
    (each device's pools, maps, VT pool and inbox counted) without host staging,
    with the one-device answer."""
    from scipy_gpuqr._errors import DeviceOutOfMemory

    A = grid3d_least_squares(7)
    an = analyze(A)
    need = simulate_multi_device(A, an, devices=1).info["devices"]["devices"][0]["peak_bytes"]
    budget = int(0.9 * need)
    with pytest.raises(DeviceOutOfMemory):
        simulate_multi_device(A, an, devices=1, device_memory=budget)
    plan = map_devices(an, 4, device_memory=budget)
    assert plan.fits and plan.device_bytes.max() <= budget
    many = simulate_multi_device(A, an, devices=plan, device_memory=budget)
    _same_answer(A, simulate_factorize(A, an), many)
    peaks = [d["peak_bytes"] for d in many.info["devices"]["devices"]]
    assert max(peaks) <= budget < sum(peaks)


@pytest.mark.parametrize("k", [2, 4])
def test_gpu_driver_unstaged_where_one_device_stages(k):
    """Under a device memory limit that makes the one-GPU engine stage through the
    host, the multi-GPU driver runs on k devices of that limit unstaged (NumPy
    layers counting the CUDA layer's allocations), with the same R; past what the
    devices hold together it falls back to the first device, staged."""
    import warnings

    A = grid3d_least_squares(8)
    an = analyze(A)
    free = NumpyDevice(32, 3)
    one = gpu_factorize(A, an, device=free)
    limit = int(0.85 * free.peak)
    staged = gpu_factorize(A, an, device=NumpyDevice(32, 3, memory_limit=limit))
    assert staged.info["stages"] >= 2
    layers = [NumpyDevice(32, 3, memory_limit=limit) for _ in range(k)]
    many = multi_gpu_factorize(A, an, layers=layers)
    assert "multi_device_fallback" not in many.info
    assert many.info["stages"] == map_devices(an, k, device_memory=limit).nstages
    assert max(layer.peak for layer in layers) <= limit < sum(layer.peak for layer in layers)
    _same_answer(A, one, many)
    tiny = [NumpyDevice(32, 3, memory_limit=int(0.7 * free.peak)) for _ in range(k)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        back = multi_gpu_factorize(A, an, layers=tiny)
    assert "multi_device_fallback" in back.info
    assert back.info["backend"] == "gpu" and back.info["stages"] >= 2
    _same_answer(A, one, back)
