"""The GPU engine's memory plan kept per pattern (``driver._memory_plan``), on the CPU.

A warm call of a known pattern takes the fronts' device bytes and a plan of one
stage from a table instead of making them again (the plan's loop over every
front sat between the call's start and its first launch). The plan taken must
be the one :func:`~scipy_gpuqr._engine.memory.plan_for_memory` would make for
the bytes available now, whatever order the calls' available bytes come in.
"""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import driver
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.memory import front_needs, min_budget, plan_for_memory, vt_elements
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values


def _needs(an):
    vt = vt_elements(an, tile=32, bundle=3, pipelining=True, granule=DEFAULT_APPLY_GRANULE)
    return front_needs(an, 8, tile=32, vt_elems=vt)


def _same(a, b):
    assert a.plan == b.plan and a.need == b.need and a.available == b.available
    assert a.fixed == b.fixed and a.oversized == b.oversized and a.host == b.host


@pytest.mark.parametrize("order", ["down", "up", "shuffled"])
def test_the_kept_plan_is_the_plan_for_the_bytes_available(order):
    an = analyze(grid3d_least_squares(7))
    needs = _needs(an)
    whole = plan_for_memory(an, needs, 10 ** 12)
    assert len(whole.plan.stages) == 1
    peak = whole.peak
    # from far above to below the one-stage threshold (several stages there)
    avail = [int(peak * f) for f in (40.0, 3.0, 1.5, 1.01, 1.0, 0.97, 0.8, 0.6, 0.4)]
    avail += [peak + 1, peak - 1]
    if order == "up":
        avail = avail[::-1]
    elif order == "shuffled":
        np.random.default_rng(1).shuffle(avail)
    made = []
    key = ("test", order)
    driver._PLANS.clear(an)
    for a in avail:
        got_needs, got = driver._memory_plan(an, key, lambda: made.append(1) or needs, a, None)
        assert got_needs is needs
        _same(got, plan_for_memory(an, needs, a))
    assert made == [1]                  # the needs made once per pattern and key
    assert any(len(plan_for_memory(an, needs, a).plan.stages) > 1 for a in avail)


def test_a_plan_is_taken_only_at_or_above_the_bytes_it_was_made_for(monkeypatch):
    an = analyze(grid3d_least_squares(7))
    needs = _needs(an)
    peak = plan_for_memory(an, needs, 10 ** 12).peak
    driver._PLANS.clear(an)
    calls = []
    real = driver.plan_for_memory
    monkeypatch.setattr(driver, "plan_for_memory",
                        lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    key = ("test", "taken")
    for a in (4 * peak, 8 * peak, 4 * peak, 2 * peak, 3 * peak, peak - 1):
        driver._memory_plan(an, key, lambda: needs, a, None)
    # made at 4 peak, taken at 8 and 4, made again at 2 (below), taken at 3;
    # below the threshold (several stages) made every time
    assert calls == [4 * peak, 2 * peak, peak - 1]
    # no limit known (the NumPy device): the staging model, never kept
    got_needs, got = driver._memory_plan(an, ("test", "none"), lambda: needs, None, None)
    _same(got, plan_for_memory(an, needs, None))


def test_warm_calls_take_the_plan_and_give_the_same_r():
    rng = np.random.default_rng(5)
    A = random_values(grid3d_least_squares(6), rng)
    an = analyze(A)
    driver._PLANS.clear(an)
    limit = 1 << 33
    g1 = driver.gpu_factorize(A, an, device=NumpyDevice(32, 3, memory_limit=limit))
    kept = [v for k, v in driver._PLANS._lru.items() if k[0] == an.pattern_key]
    assert len(kept) == 1 and kept[0][1] is not None
    g2 = driver.gpu_factorize(A, an, device=NumpyDevice(32, 3, memory_limit=limit))
    assert g2.info["memory"]["stage_bytes"] == g1.info["memory"]["stage_bytes"]
    assert np.array_equal(g1.R.toarray(), g2.R.toarray())
    s = g2.info["seconds"]
    assert 0 < s["first_launch"] <= s["total"]
    # a smaller device: the kept plan does not fit, a plan of several stages is made
    needs, plan = kept[0]
    small = (plan.peak + min_budget(an, needs)) // 2
    g3 = driver.gpu_factorize(A, an, device=NumpyDevice(32, 3, memory_limit=small))
    assert g3.info["stages"] > 1
    R1, R3 = g1.R.toarray(), g3.R.toarray()
    assert np.abs(R3.T @ R3 - R1.T @ R1).max() <= 1e-10 * np.abs(R1.T @ R1).max()
