"""The stages before a host front hold no gather buffer for its children.

A contribution block whose parent is a host front goes from its stage's pool
straight into the host front's pool (strided copies to the host), so the
memory plan counts no device buffer for it
(:data:`~scipy_gpuqr._engine.memory.HOST_CHILDREN_PLACED`): the stages before
a host front hold as many fronts as really fit, the host fronts are the same.
The NumPy layer counts what a CUDA layer allocates (``memory_limit``), so its
peak checks the count. ch7-8-b3 at half its one-stage need: the device part
is one stage (the unlimited run's launches) instead of two.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from scipy_gpuqr._engine import memory
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.memory import (min_budget, min_budget_of_front, placed_children,
                                        plan_for_memory, plan_need, stage_bytes)
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values

from test_staging import BUNDLE, TILE, _HOST_FLOPS, _needs


@pytest.fixture
def placed(monkeypatch):
    """Set :data:`HOST_CHILDREN_PLACED` for the test (restored after)."""
    def set_(on: bool):
        monkeypatch.setattr(memory, "HOST_CHILDREN_PLACED", bool(on))
    return set_


def _case():
    A = random_values(grid3d_least_squares(8), np.random.default_rng(7))
    an = analyze(A)
    return A, an, _needs(an, _HOST_FLOPS)


def _budgets(an, needs, k=40):
    lo = min_budget(an, needs)
    hi = max(min_budget_of_front(an, needs, f) for f in range(an.fronts.nfronts))
    return np.linspace(lo, hi, k).astype(np.int64).tolist()


def _merging_budget(an, needs, placed):
    """A budget whose plan with the children placed has fewer device stages."""
    for b in _budgets(an, needs):
        placed(False)
        off = plan_for_memory(an, needs, b)
        placed(True)
        on = plan_for_memory(an, needs, b)
        if on.feasible and off.host and len(on.plan.stages) < len(off.plan.stages):
            return b, off, on
    pytest.fail("no budget where the host fronts' children split the stages")


def test_plan_without_the_host_childrens_buffers(placed):
    A, an, needs = _case()
    b, off, on = _merging_budget(an, needs, placed)
    assert on.host == off.host                  # the same host fronts
    hs = on.host_stages()
    assert sorted(hs.values()) == sorted(on.host)
    flat = [f for a, z in on.plan.stages for f in range(a, z + 1)]
    assert flat == list(range(an.fronts.nfronts))
    placed(True)
    assert on.need == plan_need(an, needs, on.plan, on.host)
    assert all(x <= b - needs.fixed for x in on.need)
    # counted with the children's buffers, some stage of it would not fit
    placed(False)
    assert max(plan_need(an, needs, on.plan, on.host)) > b - needs.fixed
    # placed_children drops exactly the host fronts' children's buffers
    p = placed_children(an, needs, on.host)
    kids = np.isin(an.fronts.parent, list(on.host))
    assert (p.leaving[kids] == 0).all() and kids.any()
    np.testing.assert_array_equal(p.leaving[~kids], needs.leaving[~kids])


def test_plan_unchanged_without_host_fronts_or_when_infeasible(placed):
    A, an, needs = _case()
    for b in _budgets(an, needs, 12) + [None]:
        placed(False)
        off = plan_for_memory(an, needs, b)
        placed(True)
        on = plan_for_memory(an, needs, b)
        if not off.host or not off.feasible:
            assert on == off
    placed(True)
    low = min_budget(an, needs) - 1
    assert plan_for_memory(an, needs, low, host=True) == _off(placed, an, needs, low)


def _off(placed, an, needs, b):
    placed(False)
    try:
        return plan_for_memory(an, needs, b)
    finally:
        placed(True)


def test_stage_bytes_leave_out_the_host_childrens_buffers(placed):
    A, an, needs = _case()
    b, off, on = _merging_budget(an, needs, placed)
    sched = build_schedule(an, plan=on.plan, dense_flops=_HOST_FLOPS)
    hs = sorted(on.host_stages())
    placed(True)
    got = stage_bytes(sched, an, needs, 8, host=hs)
    placed(False)
    old = stage_bytes(sched, an, needs, 8, host=hs)
    fs = an.fronts
    for sid, st in enumerate(sched.stages):
        a, z = st.fronts
        away = [f for f in range(a, z + 1) if fs.parent[f] > z or fs.parent[f] < 0]
        kids = [f for f in away if fs.parent[f] in on.host]
        want = 0 if sid in hs else int(needs.leaving[kids].sum())
        assert old[sid] - got[sid] == want


def _run(A, limit, on, placed):
    """``gpu_factorize`` on a fresh analysis (no plan kept from another arm)
    under ``limit`` bytes of the NumPy layer; no CPU fallback."""
    placed(on)
    an = analyze(A)
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=int(limit))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = gpu_factorize(A, an, device=dev, dense_flops=_HOST_FLOPS)
    return g, dev


def test_engine_under_a_limit_runs_fewer_stages_within_it(placed):
    A, an, needs = _case()
    limit, off, on = _merging_budget(an, needs, placed)     # the NumPy layer's bytes available
    ref, _ = _run(A, 10 * limit, False, placed)          # unlimited: one stage
    g0, d0 = _run(A, limit, False, placed)
    g1, d1 = _run(A, limit, True, placed)
    i0, i1 = g0.info, g1.info
    assert i1["backend"] == "gpu" and "fallback" not in i1 and i1["restaged"] == 0
    assert i1["stages"] < i0["stages"]
    assert [h["front"] for h in i1["host_fronts"]] == [h["front"] for h in i0["host_fronts"]]
    assert d1.peak <= limit and i1["memory"]["planned_peak"] <= limit
    assert i1["stages"] == len(i1["memory"]["stage_bytes"])
    R0, R1, Rr = g0.R.toarray(), g1.R.toarray(), ref.R.toarray()
    top = np.abs(Rr).max()
    assert np.abs(R1 - R0).max() <= 1e-10 * top and np.abs(R1 - Rr).max() <= 1e-10 * top
    m = A.shape[0]
    b = np.cos(np.arange(m))
    for g in (g0, ref):
        np.testing.assert_allclose(g1.qt_matmul(b), g.qt_matmul(b), rtol=0,
                                   atol=1e-12 * np.linalg.norm(b))
    np.testing.assert_allclose(g1.q_matmul(g1.qt_matmul(b)), b, rtol=0,
                               atol=1e-12 * np.linalg.norm(b))
    for g, d in ((g0, d0), (g1, d1)):
        g.free()
        assert d.held == 0
    ref.free()


def test_same_plan_same_bits(placed):
    """Where the children's buffers split nothing, the runs are the same bit for bit."""
    A, an, needs = _case()
    for b in reversed(_budgets(an, needs, 16)):
        placed(False)
        off = plan_for_memory(an, needs, b)
        placed(True)
        if off.host and plan_for_memory(an, needs, b).plan.stages == off.plan.stages:
            break
    else:
        pytest.skip("no budget with host fronts and the same plan")
    g0, _ = _run(A, b, False, placed)
    g1, _ = _run(A, b, True, placed)
    if g0.info["stages"] != g1.info["stages"]:
        pytest.skip("the runs' available bytes gave different plans")
    R0, R1 = g0.R.tocsr(), g1.R.tocsr()
    for part in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(R0, part), getattr(R1, part))
    bb = np.sin(np.arange(A.shape[0]))
    np.testing.assert_array_equal(g0.qt_matmul(bb), g1.qt_matmul(bb))
    g0.free()
    g1.free()


@pytest.mark.slow
def test_chessboard_at_half_runs_its_device_part_as_one_stage(placed):
    """ch7-8-b3 at half its one-stage need (the driver's plan, CPU only): the
    fronts below the host root in one stage of the unlimited run's launches,
    within the memory checks."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    an = analyze(chessboard_boundary(7, 8, 3))

    def needs_for(flops, extra=()):
        return driver.stage_needs(an, flops, extra, tile=TILE, bundle=BUNDLE,
                                  pipelining=True, itemsize=8, panel=256)
    needs0 = needs_for(DEFAULT_DENSE_FLOPS)
    avail = int(memory.POOL_USABLE * (plan_for_memory(an, needs0, None).peak // 2))
    got = {}
    for on in (False, True):
        placed(on)
        flops, extra, needs, mp = driver.staged_dense_plan(
            an, needs_for, DEFAULT_DENSE_FLOPS, needs0, plan_for_memory(an, needs0, avail),
            avail, None, panel=256, itemsize=8)
        sched = build_schedule(an, plan=mp.plan, dense_flops=flops, lazy=True,
                               dense_extra=extra or None)
        sched.materialize()
        driver._memory_checks(an, sched, mp, needs, 8)      # raises where over
        got[on] = (mp.plan.stages, mp.host, [int(s.nlaunch) for s in sched.stages])
    root = an.fronts.nfronts - 1
    assert got[False][1] == got[True][1] == (root,)
    assert len(got[False][0]) == 3
    assert got[True][0] == ((0, root - 1), (root, root))
    assert sum(got[True][2]) < sum(got[False][2])
