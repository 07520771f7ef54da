"""``auto``'s rule with a GPU factorization's rank decision costed as the device runs it.

On a GPU host the plan of rajat01 (q = 6833) factorizes on the GPU, whose R keeps
its dense rules on the device: the blocked dense COD took 0.36-0.44 s there (an
H200, warm), where the host's cube model predicted 64 s, so the rule let SciPy's
run go to ``iter_lim`` (13666 iterations, 1.9 s) before the QR answered. The
recorded runs are replayed as in ``test_dropin_rule.py``, with the plan's backend
'gpu'.
"""

from __future__ import annotations

import functools

import pytest

import test_dropin_rule as rule
from scipy_gpuqr._dispatch import rank_cost
from scipy_gpuqr._dispatch.rank_cost import rank_decision_seconds
from _dropin_stand_ins import PlanStandIn


@pytest.fixture
def gpu_plans(monkeypatch):
    monkeypatch.setattr(rule, "PlanStandIn", functools.partial(PlanStandIn, backend="gpu"))


def test_a_gpu_rank_decision_is_costed_on_the_device():
    # rajat01's order: the dense COD on the device, not the host's cube
    assert rank_decision_seconds(6833, 0.01, device="gpu") == \
        pytest.approx(rank_cost.RANK_GPU_S_PER_CUBE * 6833.0 ** 3)
    assert 0.2 < rank_decision_seconds(6833, 0.01, device="gpu") < 1.0
    assert rank_decision_seconds(6833, 0.01) > 50.0
    # up to lstsq's DENSE_LIMIT: the device's SVD, bound by latency (q²)
    assert rank_decision_seconds(1374, 0.01, device="gpu") == \
        pytest.approx(rank_cost.RANK_GPU_S_PER_SQUARE * 1374.0 ** 2)
    # beyond RANK_DENSE_LIMIT the host's rule stands: one more factorization
    big = rank_cost.RANK_DENSE_LIMIT + 1
    assert rank_decision_seconds(big, 0.5, device="gpu") == 0.5


def test_rajat01_on_a_gpu_plan_is_stopped_early(histories, nominal, gpu_plans, monkeypatch):
    """With the device's cost (0.42 s) the rule stops rajat01's recording in every
    clock model within its first 400 iterations; with the host's cube model for a
    GPU R (64 s, R's entries unknown) in none."""
    stops = rule.stops_over_clock_models(histories, "rajat01.lsqr")
    assert all(s is not None and s <= 400 for s in stops), stops
    monkeypatch.setattr(rank_cost, "RANK_GPU_S_PER_CUBE", rank_cost.RANK_S_PER_CUBE)
    assert rule.stops_over_clock_models(histories, "rajat01.lsqr") == \
        [None] * len(rule.CLOCK_MODELS)


def test_gpu_plans_stop_no_converging_run(histories, nominal, gpu_plans):
    """No recorded run that SciPy's tests end (istop 1 or 2) is stopped in any clock
    model with a GPU plan: their QR would cost the device's SVD (nnc1374 0.29 s,
    dwt_878 0.125 s on an H200) against iterations of a few hundredths of a second."""
    for key in rule._keys(histories):
        if int(histories[key + ".meta"][3]) in (1, 2):
            assert rule.stops_over_clock_models(histories, key) == \
                [None] * len(rule.CLOCK_MODELS), key
