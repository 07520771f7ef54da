"""The tiled QR's device model against the paper's worked examples."""

import pytest

from scipy_gpuqr.tiled import _model as model
from scipy_gpuqr.tiled._model import DeviceProfile


def test_guide_array_paper_example():
    # "three devices ... can process 8, 12 and 4 tiles in a unit time ...
    #  the ratio will be 2 : 3 : 1 ... the array will be {1, 0, 1, 0, 1, 2}"
    assert model.integer_ratio([8, 12, 4]) == [2, 3, 1]
    assert model.guide_array([2, 3, 1]) == [1, 0, 1, 0, 1, 2]


@pytest.mark.parametrize("ratio", [[1], [1, 1], [3, 1], [1, 4, 2], [5, 5, 1]])
def test_guide_array_counts_and_order(ratio):
    g = model.guide_array(ratio)
    assert len(g) == sum(ratio)
    assert [g.count(i) for i in range(len(ratio))] == ratio
    assert g[0] == max(range(len(ratio)), key=lambda i: (ratio[i], -i))


def test_integer_ratio_real_speeds():
    assert model.integer_ratio([2.0, 2.01]) == [1, 1]
    assert model.integer_ratio([1.0, 2.98, 1.02]) == [1, 3, 1]
    r = model.integer_ratio([1.0, 1000.0], max_sum=64)
    assert sum(r) <= 64 and r[0] >= 1 and r[1] > 30
    with pytest.raises(ValueError):
        model.integer_ratio([1.0, 0.0])


def test_column_owners_equation_12():
    guide = [1, 0, 1, 0, 1, 2]
    owners = model.column_owners(8, guide, main=0)
    # column 0 to the main device, column j to guide[j % 6]
    assert owners == [0, 0, 1, 0, 1, 2, 1, 0]


def _prof(name, t, e, ut, ue):
    return DeviceProfile(name, t, e, ut, ue)


def test_select_main_prefers_slowest_capable_updater():
    # like the paper's GTX580 (fast T/E, slower updates) vs GTX680 (faster
    # updates): the capable device with the lower update speed is the main.
    gtx580 = _prof("g580", 1.0, 1.0, 2.0, 2.0)
    gtx680 = _prof("g680", 1.5, 1.5, 1.0, 1.0)
    cpu = _prof("cpu", 50.0, 50.0, 20.0, 20.0)
    assert model.select_main([cpu, gtx680, gtx580], 10, 10) == 2
    # the CPU cannot finish T before the others' UE: never a candidate
    assert model.select_main([cpu, gtx680], 10, 10) == 1
    assert model.select_main([cpu], 10, 10) == 0


def test_select_main_fallback_fastest_te():
    a = _prof("a", 10.0, 10.0, 1.0, 1.0)
    b = _prof("b", 5.0, 5.0, 1.0, 1.0)
    # one column tile: no updates at all, nobody qualifies -> fastest T+E
    assert model.select_main([a, b], 4, 1) == 1


def test_t_op_and_t_comm_by_hand():
    main = _prof("m", 1.0, 2.0, 0.5, 0.5)
    other = _prof("o", 9.0, 9.0, 0.25, 0.25)
    M = 4
    owners = [0, 1, 0, 1, 1]          # columns 1..4 -> o, m, o, o
    # main: M*(T+E) + #tile(m)*(UT+UE) = 4*3 + 4*1*1 = 16; other: 4*3*0.5 = 6
    assert model.t_op([main, other], owners, M) == pytest.approx(16.0)
    bw = {("m", "o"): 100.0, ("o", "m"): 50.0}
    # 3 M T^2 s / speed(m, o) + (M-1) T^2 s / speed(owner(1), m)
    T, s = 2, 8
    expect = 3 * M * T * T * s / 100.0 + (M - 1) * T * T * s / 50.0
    assert model.t_comm(["m", "o"], owners, M, T, s, bw) == pytest.approx(expect)
    # one device: no transfers
    assert model.t_comm(["m"], [0] * 5, M, T, s, {}) == 0.0


def test_select_count_tradeoff():
    gpu = _prof("g0", 1e-3, 1e-3, 1e-3, 1e-3)
    gpu2 = _prof("g1", 1e-3, 1e-3, 1e-3, 1e-3)
    fast_bw = {("g0", "g1"): 1e12, ("g1", "g0"): 1e12}
    slow_bw = {("g0", "g1"): 1e3, ("g1", "g0"): 1e3}
    # big matrix, fast link: two devices win; slow link: one device wins
    p, pred = model.select_count([gpu, gpu2], fast_bw, 32, 32, 512, 8)
    assert p == 2 and pred[1] < pred[0]
    p, pred = model.select_count([gpu, gpu2], slow_bw, 32, 32, 512, 8)
    assert p == 1 and pred[0] < pred[1]


def test_make_plan_orders_main_first_and_distributes():
    cpu = _prof("cpu", 5e-2, 5e-2, 2e-2, 2e-2)
    g0 = _prof("gpu:0", 1e-3, 1e-3, 1e-4, 1e-4)
    g1 = _prof("gpu:1", 1e-3, 1e-3, 1e-4, 1e-4)
    bw = {(a, b): 5e10 for a in ("cpu", "gpu:0", "gpu:1")
          for b in ("cpu", "gpu:0", "gpu:1") if a != b}
    plan = model.make_plan([cpu, g0, g1], bw, 16384, 16384, 512, 8)
    assert plan.main in ("gpu:0", "gpu:1")
    assert plan.devices[0] == plan.main
    assert plan.candidates[-1] == "cpu"
    assert len(plan.predicted) == 3 and plan.p == len(plan.devices)
    assert plan.owners[0] == 0 and len(plan.owners) == 32
    assert set(plan.owners) == set(range(plan.p))
    kept = model.make_plan([cpu, g0, g1], bw, 1024, 1024, 512, 8,
                           choose_count=False)
    assert kept.p == 3


def test_update_shares_finish_together():
    main = _prof("m", 2.0, 2.0, 0.5, 0.5)
    other = _prof("o", 9.0, 9.0, 0.5, 0.5)
    M, N = 4, 9
    x = model.update_shares([main, other], M, N)
    assert sum(x) == pytest.approx(M * (N - 1))
    # main: M (T + E) + x0 u0 == other: x1 u1
    assert M * 4.0 + x[0] * 1.0 == pytest.approx(x[1] * 1.0)
    # main too busy with T and E: it updates nothing
    busy = _prof("b", 100.0, 100.0, 0.5, 0.5)
    assert model.update_shares([busy, other], M, N)[0] == 0.0
    assert model.update_shares([main], M, N) == [pytest.approx(M * (N - 1))]


def test_sync_term_keeps_small_sizes_on_one_device():
    import dataclasses
    g0 = _prof("g0", 1e-3, 1e-3, 1e-4, 1e-4)
    g1 = _prof("g1", 1e-3, 1e-3, 1e-4, 1e-4)
    bw = {("g0", "g1"): 1e12, ("g1", "g0"): 1e12}
    # without a sync cost a second GPU "helps" even a 4 x 4 tile matrix
    p, pred = model.select_count([g0, g1], bw, 4, 4, 1024, 8)
    assert p == 2
    g1s = dataclasses.replace(g1, t_sync_step=2e-4, t_sync_fixed=1.2e-2)
    assert model.t_sync([g0, g1s], 4, 4) == pytest.approx(2e-4 + 1.2e-2 / 4)
    assert model.t_sync([g1s, g0], 4, 4) == 0.0     # the main device adds none
    p, pred2 = model.select_count([g0, g1s], bw, 4, 4, 1024, 8)
    assert p == 1 and pred2[0] == pred[0]
    assert pred2[1] == pytest.approx(pred[1] + 2e-4 + 3e-3)
    # large matrices still take both GPUs: the cost is shared over the steps
    p, _ = model.select_count([g0, g1s], bw, 32, 32, 1024, 8)
    assert p == 2
    # a profile round-trips through JSON with its sync costs
    assert model.DeviceProfile.from_json(g1s.to_json()) == g1s
