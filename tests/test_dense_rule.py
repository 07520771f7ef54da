"""The dense-front rule: a time model of both paths and of the tree's critical path."""

import numpy as np
import pytest

from scipy_gpuqr._schedule import dense
from scipy_gpuqr._schedule.dense import (DEFAULT_DENSE_FLOPS, DENSE_RULE, DenseModel,
                                         dense_front_mask, dense_path_seconds, dense_rule_mask,
                                         rule_prediction)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

# small enough that a 12³ grid has candidates
SMALL = DenseModel(min_columns=16, min_flops=1e5)


@pytest.fixture(scope="module")
def grid12():
    return analyze(grid3d_least_squares(12))


def _brute_seconds(an, mask, model):
    """The model's time by a plain walk over every front (no candidate groups)."""
    fs = an.fronts
    nf = fs.nfronts
    flops = np.asarray(an.front_flops, dtype=float)
    nfact = np.minimum(fs.fm, fs.fn)
    nl = -(-nfact // model.tile) + 1
    tdense = np.array([dense_path_seconds(fs.fm[f], fs.fn[f],
                                          fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]], model)
                       if mask[f] else 0.0 for f in range(nf)])

    def path(w):
        out = np.zeros(nf)
        for f in range(nf):
            a, s = f, 0.0
            while a >= 0:
                s += w[a]
                a = int(fs.parent[a])
            out[f] = s
        return out

    lu = np.where(mask, 0, nl).astype(float)
    n_u = max(path(lu).max(), 1.0)
    tau = model.launch_seconds + (flops.sum() - flops[mask].sum()) / (model.uber_rate * n_u)
    fin = path(np.where(mask, tdense, lu * tau)).max()
    return max(fin, model.dense_contention * tdense.sum())


def test_the_default_is_the_rule(grid12):
    assert DEFAULT_DENSE_FLOPS == DENSE_RULE < 0
    assert np.array_equal(dense_front_mask(grid12, DENSE_RULE), dense_rule_mask(grid12))
    # a threshold still chooses by size alone
    fl = grid12.front_flops
    thr = float(np.sort(fl)[-3])
    assert dense_front_mask(grid12, thr).sum() == 3


def test_small_problems_keep_every_front_in_the_uberkernel(grid12):
    # the calibrated model: no front of a small problem pays for the dense path
    assert not dense_rule_mask(grid12).any()


def test_model_time_matches_a_walk_over_every_front(grid12):
    prob = dense._RuleProblem(grid12, SMALL)
    K = len(prob.cand)
    assert K >= 8
    rng = np.random.default_rng(3)
    for _ in range(6):
        pick = rng.random(K) < 0.4
        mask = np.zeros(grid12.fronts.nfronts, dtype=bool)
        mask[prob.cand[pick]] = True
        got = rule_prediction(grid12, mask, SMALL)["seconds"]
        assert got == pytest.approx(_brute_seconds(grid12, mask, SMALL), rel=1e-12)


def test_greedy_choice_is_no_worse_than_none_or_any_single_front(grid12):
    for model in (SMALL, DenseModel(min_columns=16, min_flops=1e5, gemm_rate=1e15,
                                    column_seconds=1e-7, row_seconds=0.0, panel_seconds=0.0)):
        prob = dense._RuleProblem(grid12, model)
        K = len(prob.cand)
        chosen = prob.choose()
        t = prob.seconds(chosen)[0]
        assert t <= prob.seconds(np.zeros(K))[0]
        assert t <= prob.seconds(np.eye(K)).min() * (1 + 1e-12)


def test_free_dense_path_is_taken_and_a_slow_one_is_not(grid12):
    fast = DenseModel(min_columns=16, min_flops=1e5, gemm_rate=1e15, column_seconds=1e-8,
                      row_seconds=0.0, panel_seconds=0.0)
    slow = DenseModel(min_columns=16, min_flops=1e5, column_seconds=1e-2)
    m_fast = dense_rule_mask(grid12, fast)
    assert m_fast.any()
    # the root front (on every critical path) is the first a free dense path takes
    roots = np.flatnonzero(grid12.fronts.parent < 0)
    top = roots[np.argmax(grid12.front_flops[roots])]
    assert m_fast[top]
    assert not dense_rule_mask(grid12, slow).any()


def test_dense_path_seconds_reproduces_its_calibration():
    # dense fronts alone on an H200 (bench/RESULTS.md, issue 18): 0.318 s and 0.041 s
    assert dense_path_seconds(49340, 9375, None) == pytest.approx(0.318, rel=0.05)
    assert dense_path_seconds(20000, 4000, None) == pytest.approx(0.041, rel=0.1)
    # a staircase only removes work
    st = np.minimum(np.arange(1, 4001) * 5, 20000)
    assert dense_path_seconds(20000, 4000, st) < dense_path_seconds(20000, 4000, None)
    assert dense_path_seconds(10, 0, None) == 0.0


def test_calibration_points_and_the_rules_choice_on_ch7_8_b3():
    an = analyze(chessboard_boundary(7, 8, 3))
    fs = an.fronts
    off = rule_prediction(an, np.zeros(fs.nfronts, dtype=bool))["seconds"]
    old = rule_prediction(an, dense_front_mask(an, 1e10))["seconds"]
    # the uberkernel alone: 0.615 s of kernels (fitted); the old threshold 0.42-0.64 s
    assert off == pytest.approx(0.615, rel=0.05)
    assert 0.40 < old < 0.65
    rule = dense_rule_mask(an)
    root = int(np.flatnonzero(fs.parent < 0)[np.argmax(an.front_flops[fs.parent < 0])])
    assert rule[root]                                   # 49340 x 9375, ~2.5x faster dense
    assert rule.sum() < dense_front_mask(an, 1e10).sum()
    assert rule_prediction(an, rule)["seconds"] < min(off, old)


def _chain(nf, w=300):
    """A chain of ``nf`` fronts of 2w x w (a banded matrix's tree)."""
    from types import SimpleNamespace
    parent = np.arange(1, nf + 1, dtype=np.int64)
    parent[-1] = -1
    fs = SimpleNamespace(nfronts=nf, parent=parent, fm=np.full(nf, 2 * w), fn=np.full(nf, w),
                         col_ptr=np.arange(nf + 1, dtype=np.int64) * w,
                         stair=np.full(nf * w, 2 * w, dtype=np.int64))
    return SimpleNamespace(fronts=fs, front_flops=np.linspace(1e9, 4e9, nf))


def test_a_deep_tree_is_walked_in_log_steps():
    import time
    an = _chain(20000)          # no per-level loop over 20 000 levels
    t = time.perf_counter()
    dense_rule_mask(an)
    rule_prediction(an, np.ones(20000, dtype=bool))
    assert time.perf_counter() - t < 2.0
    # on a shorter chain, the candidate groups give the walk's time
    an = _chain(300)
    prob = dense._RuleProblem(an, DenseModel())
    assert len(prob.cand) == 64
    rng = np.random.default_rng(5)
    for _ in range(3):
        mask = np.zeros(300, dtype=bool)
        mask[prob.cand[rng.random(64) < 0.5]] = True
        assert rule_prediction(an, mask)["seconds"] == pytest.approx(
            _brute_seconds(an, mask, DenseModel()), rel=1e-12)


def test_the_choice_is_kept_per_pattern_and_handed_out_as_a_copy():
    an = analyze(grid3d_least_squares(12))
    first = dense_rule_mask(an, SMALL)
    assert first.any()
    first[:] = ~first                                   # the caller's copy only
    again = dense_rule_mask(analyze(grid3d_least_squares(12)), SMALL)
    assert np.array_equal(again, ~first)
