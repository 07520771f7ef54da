"""The dense-front rule: a time model of both paths, of the tree's critical path
and of the device they share."""

from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._schedule import dense
from scipy_gpuqr._schedule.dense import (DEFAULT_DENSE_FLOPS, DENSE_RULE, DenseModel,
                                         dense_front_mask, dense_path_seconds, dense_rule_mask,
                                         rule_prediction)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           qap_linearization)

# small enough that a 12³ grid has candidates
SMALL = DenseModel(min_columns=16, min_flops=1e5)
# the dense path for free: a 12³ grid's large fronts pay on it
FREE = DenseModel(min_columns=16, min_flops=1e5, gemm_rate=1e15, column_seconds=1e-8,
                  row_seconds=0.0, panel_seconds=0.0, r_copy_rate=np.inf)
# the dense fronts in the launches' shadow: only their paths and their sum bound
# the time (the model's first version, with its fitted contention and tolerance)
SHADOW = DenseModel(dense_contention=1.28, launch_share=0.0, r_copy_rate=np.inf,
                    tolerance=0.05)


@pytest.fixture(scope="module")
def grid12():
    return analyze(grid3d_least_squares(12))


def _brute_seconds(an, mask, model, parts=False):
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
    kernels = max(fin, model.launch_share * tau * n_u + model.dense_contention * tdense.sum())
    r_copy = float(np.sum(np.asarray(an.front_nnz_R, dtype=float)[mask])) * 8 / model.r_copy_rate
    if parts:
        return {"kernels": kernels, "launches": tau * n_u, "dense": tdense.sum(),
                "r_copy": r_copy}
    return kernels + r_copy


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


@pytest.mark.parametrize("model", [
    SMALL, FREE,
    DenseModel(min_columns=16, min_flops=1e5, launch_share=0.0, r_copy_rate=np.inf),
    # the path bound can exceed the device's when the dense fronts overlap well
    DenseModel(min_columns=16, min_flops=1e5, launch_share=0.3, dense_contention=0.4)])
def test_model_time_matches_a_walk_over_every_front(grid12, model):
    prob = dense._RuleProblem(grid12, model)
    K = len(prob.cand)
    assert K >= 8
    rng = np.random.default_rng(3)
    for _ in range(6):
        pick = rng.random(K) < 0.4
        mask = np.zeros(grid12.fronts.nfronts, dtype=bool)
        mask[prob.cand[pick]] = True
        got = rule_prediction(grid12, mask, model)
        want = _brute_seconds(grid12, mask, model, parts=True)
        assert got["seconds"] == pytest.approx(want["kernels"] + want["r_copy"], rel=1e-12)
        assert got["kernel_seconds"] == pytest.approx(want["kernels"], rel=1e-12)
        assert got["launch_seconds"] == pytest.approx(want["launches"], rel=1e-12)
        assert got["dense_sum_seconds"] == pytest.approx(want["dense"], rel=1e-12, abs=1e-15)
        assert got["r_copy_seconds"] == pytest.approx(want["r_copy"], rel=1e-12, abs=1e-15)


def test_greedy_choice_is_no_worse_than_none_or_any_single_front(grid12):
    # tolerance 0: the greedy's best prefix itself
    for model in (DenseModel(min_columns=16, min_flops=1e5, tolerance=0.0),
                  replace(FREE, tolerance=0.0), replace(SHADOW, min_columns=16,
                                                        min_flops=1e5, tolerance=0.0)):
        prob = dense._RuleProblem(grid12, model)
        K = len(prob.cand)
        chosen = prob.choose()
        t = prob.seconds(chosen)[0]
        assert t <= prob.seconds(np.zeros(K))[0]
        assert t <= prob.seconds(np.eye(K)).min() * (1 + 1e-12)
    # with a tolerance, never slower than no dense front, and within it of the best
    prob = dense._RuleProblem(grid12, replace(FREE, tolerance=0.3))
    best = dense._RuleProblem(grid12, replace(FREE, tolerance=0.0))
    t = prob.seconds(prob.choose())[0]
    assert t <= prob.seconds(np.zeros(len(prob.cand)))[0]
    assert t <= 1.3 * best.seconds(best.choose())[0]
    assert prob.choose().sum() <= best.choose().sum()


def test_free_dense_path_is_taken_and_a_slow_one_is_not(grid12):
    slow = DenseModel(min_columns=16, min_flops=1e5, column_seconds=1e-2)
    m_fast = dense_rule_mask(grid12, FREE)
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
    return SimpleNamespace(fronts=fs, front_flops=np.linspace(1e9, 4e9, nf),
                           front_nnz_R=np.full(nf, w * (w + 1) // 2))


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
    first = dense_rule_mask(an, FREE)
    assert first.any()
    first[:] = ~first                                   # the caller's copy only
    again = dense_rule_mask(analyze(grid3d_least_squares(12)), FREE)
    assert np.array_equal(again, ~first)


def test_launches_and_dense_fronts_take_turns_on_the_device(grid12):
    """The dense fronts do not hide in the launches' shadow: the kernels last at
    least the launches' chain plus the dense fronts' sum (times the contention),
    so a dense front whose launches were off the longest chain only adds time;
    without that bound (launch_share 0) the model is the shadow model."""
    prob = dense._RuleProblem(grid12, SMALL)
    K = len(prob.cand)
    rng = np.random.default_rng(7)
    D = (rng.random((20, K)) < 0.3).astype(float)
    p = prob.parts(D)
    assert np.all(p["kernels"] >= p["launches"] + SMALL.dense_contention * p["dense"]
                  - 1e-15)
    assert np.all(p["kernels"] >= p["path"])
    # a candidate off the launches' longest chain: dense, it shortens no chain and
    # costs its dense path (times the contention) and its R's wait, less its flops
    # taken from the launches
    base = prob.parts(np.zeros(K))
    n0 = prob.lmax.max()
    off_chain = 0
    for k in range(K):
        e = np.zeros(K)
        e[k] = 1.0
        lu = prob.lmax - e @ (prob.chain * prob.nl_k).T
        if lu.max() < n0:
            continue
        off_chain += 1
        want = (SMALL.dense_contention * prob.dense_k[k] + prob.rbytes_k[k] / SMALL.r_copy_rate
                - prob.flops_k[k] / SMALL.uber_rate)
        assert prob.seconds(e)[0] - prob.seconds(np.zeros(K))[0] == pytest.approx(want)
        assert base["launches"][0] - prob.parts(e)["launches"][0] == pytest.approx(
            prob.flops_k[k] / SMALL.uber_rate)
    assert off_chain >= 2
    shadow = dense._RuleProblem(grid12, replace(SMALL, launch_share=0.0, r_copy_rate=np.inf))
    ps = shadow.parts(D)
    assert np.allclose(ps["kernels"], np.maximum(ps["path"], SMALL.dense_contention
                                                 * ps["dense"]))


def test_dense_fronts_rows_of_r_are_waited_for_after_the_kernels(grid12):
    prob = dense._RuleProblem(grid12, SMALL)
    K = len(prob.cand)
    D = (np.random.default_rng(11).random((8, K)) < 0.5).astype(float)
    no_copy = dense._RuleProblem(grid12, replace(SMALL, r_copy_rate=np.inf))
    rbytes = np.asarray(grid12.front_nnz_R, dtype=float)[prob.cand] * grid12.itemsize
    assert np.allclose(prob.seconds(D) - no_copy.seconds(D), D @ rbytes / SMALL.r_copy_rate)
    assert np.all(prob.parts(np.zeros(K))["r_copy"] == 0.0)


# One H200, one run, warm medians (bench/RESULTS.md, issue 18, "The dense-front rule
# refitted with the Apply cut on"): kernel seconds with every front in the uberkernel
# (None) and with the dense fronts of size thresholds (Householder flops).
_MEASURED_KERNELS = {
    "ch7-8-b3": {None: 0.606, 3e11: 0.354, 2e11: 0.355, 1e11: 0.370, 5e10: 0.421},
    "lp_nug20T": {None: 0.578, 3e11: 0.369, 2e11: 0.369, 1e11: 0.395, 5e10: 0.438},
    "grid40": {None: 0.248, 3e11: 0.246, 2e11: 0.251, 1e11: 0.256},
}


@pytest.fixture(scope="module")
def measured_analyses():
    return {"ch7-8-b3": analyze(chessboard_boundary(7, 8, 3)),
            "lp_nug20T": analyze(sp.csc_array(qap_linearization(20).T)),
            "grid40": analyze(grid3d_least_squares(40))}


def _front_shapes(an, mask):
    fs = an.fronts
    return {(int(fs.fm[f]), int(fs.fn[f])) for f in np.flatnonzero(mask)}


def test_the_model_fits_the_measured_kernels(measured_analyses):
    """The calibrated model's kernel time is within 0.045 s (about 12 %) of every
    measured configuration of the three problems, and within 0.025 s on average."""
    errors = []
    for name, an in measured_analyses.items():
        for thr, kernels in _MEASURED_KERNELS[name].items():
            mask = (np.zeros(an.fronts.nfronts, dtype=bool) if thr is None
                    else dense_front_mask(an, thr))
            errors.append(rule_prediction(an, mask)["kernel_seconds"] - kernels)
    errors = np.abs(errors)
    assert errors.max() < 0.045 and errors.mean() < 0.025, errors


def test_the_rule_chooses_what_measured_fastest(measured_analyses):
    """The rule's choice is modelled within its tolerance of the best it found, and
    it is what measured fastest (within noise): no dense front on grid 40³, the
    root on ch7-8-b3, the root and its largest child on lp_nug20ᵀ (one dense front
    there measured 0.42 s of kernels against 0.37 s)."""
    for name, an in measured_analyses.items():
        rule = dense_rule_mask(an)
        prob = dense._RuleProblem(an, DenseModel())
        best = dense._RuleProblem(an, replace(DenseModel(), tolerance=0.0))
        t_rule = prob.seconds(rule[prob.cand].astype(float))[0]
        t_best = best.seconds(best.choose())[0]
        assert t_best <= t_rule <= t_best * (1 + DenseModel().tolerance) + 1e-12, name
    assert not dense_rule_mask(measured_analyses["grid40"]).any()
    an = measured_analyses["ch7-8-b3"]
    assert _front_shapes(an, dense_rule_mask(an)) == {(49340, 9375)}
    an = measured_analyses["lp_nug20T"]
    assert _front_shapes(an, dense_rule_mask(an)) == {(37611, 9440), (19224, 8057)}
