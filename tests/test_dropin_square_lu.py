"""``lsqr``/``lsmr`` under ``auto`` on a square A: SciPy's SuperLU gives the exact answer
where lstsq's rank rule keeps every column (:mod:`scipy_gpuqr._api.square_lu`).

Where SciPy's iterations do not answer, the minimum-norm least-squares
solution of a square A that is of full rank by ``numpy.linalg.lstsq``'s rule
(σ_min above ``eps·n·σ_max``) is ``A⁻¹ b``; SuperLU's factors give it, checked
by a probe of ``‖A⁻¹‖₂`` through their solves and the answer's backward
error. A matrix near or below the cutoff, one SuperLU finds exactly
singular, explicit backends, damping and ``calc_var`` keep the QR.
"""

from __future__ import annotations

import importlib
import math
import time
import types

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import TEST_MATRICES
from scipy_gpuqr import lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._api.square_lu import BACKWARD_LIMIT, SquareLU
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import placement, rank_cost
from scipy_gpuqr._dispatch.iterate_first import Allowance, lu_seconds
from scipy_gpuqr._iterative import native
from scipy_gpuqr.io import mmread
from _dropin_stand_ins import PlanStandIn, StateStandIn, readings, recorded, stop_of

EPS = float(np.finfo(np.float64).eps)
SCIPY = {"lsqr": original("lsqr"), "lsmr": original("lsmr")}
OURS = {"lsqr": lsqr, "lsmr": lsmr}
lsqr_api = importlib.import_module("scipy_gpuqr._api.lsqr")   # the module, not the function


def _answered(messages, method):
    lines = [m for m in messages() if m.startswith(method + " ")]
    assert lines, messages()
    return lines[-1]


def _mtx(name):
    return sp.csc_array(mmread(str(TEST_MATRICES / f"{name}.mtx"))).astype(np.float64)


def _backward(A, x, b):
    """The square system's backward error ``‖b − A x‖ / (‖A‖_F·‖x‖ + ‖b‖)``."""
    r = b - A @ x
    return np.linalg.norm(r) / (sp.linalg.norm(A) * np.linalg.norm(x) + np.linalg.norm(b))


def _assert_lstsq(A, x, b):
    """x is numpy.linalg.lstsq's solution (forward error within eps·cond)."""
    Ad = A.toarray()
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    cond = s[0] / s[rank - 1]
    assert np.linalg.norm(x - x_ref) <= max(1e3 * EPS * cond * Ad.shape[0], 1e-10) * \
        np.linalg.norm(x_ref)
    return rank


def _near_singular(n=120, smallest=1e-15, seed=5):
    """A dense-stored square matrix whose smallest singular value lies below lstsq's
    cutoff (eps·n·σ_max = 2.7e-14 for n = 120): rank n − 1 by lstsq's rule, yet
    LU-factorizable (no zero pivot)."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.logspace(0, -6, n)
    s[-1] = smallest
    return sp.csc_array((U * s) @ V.T)


# ---------------------------------------------------------------------------
# SuperLU answers

@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("name", ["494_bus", "olm500", "bp_1200"])
def test_stalling_square_rows_end_in_superlus_exact_answer(name, method, decisions):
    """SciPy's run stops at its iteration limit (istop 7); ours answers with lstsq's
    solution from SuperLU's factors (itn 0), made while the run went on."""
    A = _mtx(name)
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    theirs = SCIPY[method](A, b)
    assert theirs[1] == 7
    out = OURS[method](A, b)
    line = _answered(decisions, method)
    assert "SuperLU on CPU (A square, of full rank by lstsq's rule" in line, line
    assert out[2] == 0 and out[1] in (1, 2, 4, 5)
    assert _backward(A, out[0], b) <= BACKWARD_LIMIT * EPS
    assert _backward(A, out[0], b) < _backward(A, theirs[0], b)
    assert _assert_lstsq(A, out[0], b) == A.shape[0]


def test_hangglider_2_is_answered_by_superlu_without_an_analysis(decisions, monkeypatch):
    """hangGlider_2 (cond 9e10, full rank by lstsq's rule with a margin of 30): the rule
    makes SuperLU's factors once the run has cost their prediction, and no QR analysis
    runs (the plan is never asked for)."""
    planned = []
    real = lsqr_api.quick_iterate.__globals__["plan_for"]

    def counting(*args, **kwargs):
        planned.append(1)
        return real(*args, **kwargs)
    monkeypatch.setitem(lsqr_api.quick_iterate.__globals__, "plan_for", counting)
    A = _mtx("hangGlider_2")
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    out = lsqr(A, b)
    line = _answered(decisions, "lsqr")
    assert "SuperLU on CPU" in line and "SuperLU's factors made after" in line, line
    assert out[2] == 0 and not planned, line
    assert _backward(A, out[0], b) <= BACKWARD_LIMIT * EPS


def test_a_converging_run_the_lu_overtakes(decisions, monkeypatch):
    """west0479's LSQR converges (istop 1 at 467 iterations) to a residual of 0.77 ‖b‖;
    SuperLU's factors, made once the run had cost their prediction while its projection
    went on, answer sooner with lstsq's solution (DESIGN §5: the allowance is tied to
    the exact answer's cost). The LU's prediction is set to 10 us, so that the LU comes
    at the first checkpoints whatever the host's speed (at its nominal 1.6 ms the run's
    last 3 ms decide). The iterations are the Python loops' (the compiled ones make the
    467 iterations in about 3 ms, between two of the rule's checkpoints)."""
    monkeypatch.setattr(policy, "lu_seconds", lambda nnz: 1e-5)
    monkeypatch.setenv(native.ENV, "numpy")
    A = _mtx("west0479")
    b = np.random.default_rng(len("west0479")).standard_normal(A.shape[0])
    theirs = SCIPY["lsqr"](A, b)
    assert theirs[1] == 1
    out = lsqr(A, b)
    line = _answered(decisions, "lsqr")
    assert "SuperLU on CPU" in line and "stopped by auto's rule" in line, line
    assert out[2] == 0
    assert _backward(A, out[0], b) <= BACKWARD_LIMIT * EPS
    _assert_lstsq(A, out[0], b)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_x0_answers_x0_plus_the_correction(method, decisions):
    """The general path (an x0): the LU solves for the correction."""
    A = _mtx("494_bus")
    b = np.random.default_rng(2).standard_normal(A.shape[0])
    x0 = np.random.default_rng(3).standard_normal(A.shape[1])
    out = OURS[method](A, b, x0=x0)
    assert "SuperLU on CPU" in _answered(decisions, method)
    assert out[2] == 0
    assert _backward(A, out[0], b) <= BACKWARD_LIMIT * EPS


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_maximum_precision_on_a_square_matrix(method, decisions):
    """atol = btol = 0 (no iterations): the exact answer at once, by SuperLU."""
    A = _mtx("olm500")
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    out = OURS[method](A, b, atol=0, btol=0)
    assert "SuperLU on CPU" in _answered(decisions, method)
    assert _backward(A, out[0], b) <= BACKWARD_LIMIT * EPS
    _assert_lstsq(A, out[0], b)


# ---------------------------------------------------------------------------
# the QR answers

@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_below_lstsqs_cutoff_the_qr_decides_the_rank(method, decisions):
    """σ_min = 1e-15 σ_max < eps·n·σ_max: LU factorizes, but the probe cannot show full
    rank; the QR answers with lstsq's rank n − 1 solution, not A⁻¹b."""
    A = _near_singular()
    b = np.random.default_rng(6).standard_normal(A.shape[0])
    out = OURS[method](A, b, atol=0, btol=0)
    line = _answered(decisions, method)
    assert "QR on CPU" in line and "the LU did not answer" in line, line
    assert "do not show full rank" in line, line
    assert _assert_lstsq(A, out[0], b) == A.shape[0] - 1
    x_inv = np.linalg.solve(A.toarray(), b)
    assert np.linalg.norm(out[0]) < 1e-3 * np.linalg.norm(x_inv)


def test_exactly_singular_for_superlu_the_qr_answers(decisions):
    """A zero column: SuperLU's factorization fails; the QR answers lstsq's solution."""
    A = _mtx("olm500").tolil()
    A[:, 7] = 0
    A = sp.csc_array(A)
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    out = lsqr(A, b, atol=0, btol=0)
    line = _answered(decisions, "lsqr")
    assert "QR on CPU" in line and "SuperLU: " in line, line
    assert _assert_lstsq(A, out[0], b) == A.shape[0] - 1


@pytest.mark.parametrize("kwargs", [{"backend": "cpu"}, {"calc_var": True},
                                    {"damp": 1e-3}])
def test_explicit_backends_damping_and_variances_keep_the_qr(kwargs, decisions):
    A = _mtx("494_bus")
    b = np.random.default_rng(8).standard_normal(A.shape[0])
    out = lsqr(A, b, **kwargs)
    line = _answered(decisions, "lsqr")
    assert "QR on CPU" in line and "SuperLU" not in line, line
    assert out[2] == 0


# ---------------------------------------------------------------------------
# the rule

class _Square:
    """A stand-in for :class:`SquareLU`: records its factorization."""

    def __init__(self, clear, deficient=False, singular=False):
        self._clear, self.clear, self.calls = clear, None, 0
        self.deficient = self.singular = False
        self._deficient, self._singular = deficient, singular
        self.why, self.seconds = ("of full rank" if clear else "not of full rank"), 0.0

    def factor(self):
        self.calls += 1
        self.clear, self.deficient = self._clear, self._deficient
        self.singular = self._singular
        return self.clear

    def decline(self, why):
        if self.clear is None:
            self.clear, self.why = False, why


def _watch(square, plans, nnz=10_000):
    return Allowance(iter_lim=10_000, atol=1e-6, conlim=1e8, analysis=1e-3,
                     plan=lambda: plans.append(1) or (None, PlanStandIn(1e6)), order=1000,
                     square=square, nnz=nnz)


def _stalling(watch, iterations, per=1e-5):
    """Feed a run whose tests fall slowly (projected far past iter_lim)."""
    for k in range(1, iterations + 1):
        # test2 falls by 1e-4 a decade per iteration: convergence some 20000 iterations on
        if watch(StateStandIn(k, k * per, 1.0, 10 ** (-1e-4 * k))):
            return k
    return None


def test_the_lu_is_tried_once_the_run_has_cost_its_prediction():
    square, plans = _Square(True), []
    watch = _watch(square, plans)
    lu = lu_seconds(10_000)
    stopped = _stalling(watch, 5000)
    assert square.calls == 1 and stopped is not None
    itn, t = watch.lu_at
    assert t >= lu and t < 2 * lu + policy.CHECK_INTERVAL_S
    assert not plans                # no analysis: the LU answers
    assert "SuperLU's factors made" in watch.summary()
    assert "A of full rank" in watch.summary()


def test_a_failed_lu_leaves_the_qrs_rule():
    square, plans = _Square(False), []
    watch = _watch(square, plans)
    _stalling(watch, 3000)
    assert square.calls == 1 and plans == [1]     # analysed after the LU, as before
    assert "not used" in watch.summary()


def test_no_lu_while_the_projection_promises_convergence_within_it():
    """A run that converges within the LU's prediction is never interrupted by it."""
    square, plans = _Square(True), []
    watch = _watch(square, plans, nnz=100_000)     # LU predicted at 80 ms
    per = 1e-5
    for k in range(1, 3001):     # test2 falls to atol within 3000 iterations (30 ms)
        assert not watch(StateStandIn(k, k * per, 1.0, 10 ** (-2 * k / 3000)))
    assert square.calls == 0 and watch.lu_at is None


def test_without_a_square_nothing_changes():
    plans = []
    watch = _watch(None, plans)
    assert watch.lu_s == math.inf
    _stalling(watch, 3000)
    assert watch.lu_at is None and plans == [1]


def test_square_lu_declines_where_the_qr_made_its_factors():
    lu = SquareLU(lambda: sp.csc_array(np.eye(3)), 3)
    lu.decline("the QR's factors were made ahead")
    assert lu.factor() is False and "made ahead" in lu.why


# ---------------------------------------------------------------------------
# an LU that shows A not of full rank: nothing ahead, the analysis deferred

@pytest.mark.parametrize("name", ["dwt_878", "adder_dcop_05", "nnc1374"])
def test_square_lu_shows_the_deficiency_of_the_stalling_square_rows(name):
    """dwt_878 is exactly singular for SuperLU; adder_dcop_05's and nnc1374's probes
    bound ‖A⁻¹‖₂ from below past lstsq's cutoff (rank 1788 of 1813, 1308 of 1374)."""
    lu = SquareLU(lambda: _mtx(name), _mtx(name).shape[0])
    assert lu.factor() is False
    assert lu.deficient, lu.why
    assert lu.singular is (name == "dwt_878"), lu.why


def test_square_lu_of_full_rank_or_unsure_is_not_deficient():
    lu = SquareLU(lambda: _mtx("494_bus"), 494)
    assert lu.factor() is True and not lu.deficient
    lu = SquareLU(lambda: sp.csc_array(np.eye(3)), 3)
    lu.decline("the QR's factors were made ahead")
    assert lu.factor() is False and not lu.deficient


def _converging(watch, iterations, per=2e-5, conda=1e6):
    """Feed a run whose test2 reaches atol at iteration ``iterations`` (linearly in its
    logarithm, from 1); return the iteration the rule stopped at, or None."""
    for k in range(1, iterations + 1):
        if watch(StateStandIn(k, k * per, 1.0, 10 ** (-6.0 * k / iterations), conda=conda)):
            return k
    return None


def _watch_order(square, plans, order, speculations=None, clear=""):
    def speculate(planned):
        speculations.append(planned)
        return planned, clear
    return Allowance(iter_lim=2 * order, atol=1e-6, conlim=1e8, analysis=1e-3,
                     plan=lambda: plans.append(1) or (None, PlanStandIn(1e6)), order=order,
                     speculate=None if speculations is None else speculate,
                     square=square, nnz=10_000)


def test_a_deficient_lu_leaves_a_converging_run_without_analysis_or_factors():
    """dwt_878's course: order 878, SciPy's stop after some 1600 iterations of 20 µs. The
    LU shows A deficient; the QR would cost at least its dense rank decision (0.12 s),
    more than the whole run: neither the analysis nor a factorization is made. With an
    LU that was merely not clear, the rule analyses and factorizes ahead (as before)."""
    for deficient, analysed in ((True, False), (False, True)):
        square, plans, speculations = _Square(False, deficient), [], []
        watch = _watch_order(square, plans, 878, speculations)
        assert _converging(watch, 1600) is None
        assert square.calls == 1
        assert bool(plans) is analysed and bool(speculations) is analysed, deficient
    assert watch.at_risk
    square, plans = _Square(False, True), []
    watch = _watch_order(square, plans, 878)
    _converging(watch, 1600)
    assert "no analysis (A not of full rank" in watch.summary(), watch.summary()


def test_a_deficient_lu_keeps_the_stop_of_a_stalling_run():
    """A run that stalls far past iter_lim (order 1000): the rule analyses once a verdict
    would stop it at the rank decision's floor, and stops where the rule without the
    LU's finding stops (every verdict is monotone in the QR's time)."""
    stops = {}
    for deficient in (True, False):
        square, plans = _Square(False, deficient), []
        watch = _watch_order(square, plans, 1000)
        stops[deficient] = (_stalling(watch, 20_000, per=2e-4), len(plans))
    assert stops[True] == stops[False] and stops[True][0] is not None, stops


def test_rank_decision_floor():
    q = 1000
    assert rank_cost.rank_decision_floor(q) == min(rank_cost.RANK_S_PER_CUBE * q ** 3,
                                                rank_cost.RANK_GPU_S_PER_SQUARE * q ** 2)
    for device in ("cpu", "gpu"):
        for order in (50, 878, 1813, rank_cost.RANK_SPARSE_MIN_ORDER):
            assert rank_cost.rank_decision_floor(order) <= \
                rank_cost.rank_decision_seconds(order, 0.0, 1.0, device=device)
    assert rank_cost.rank_decision_floor(rank_cost.RANK_SPARSE_MIN_ORDER + 1) == 0.0


def test_recorded_runs_stop_where_they_did_with_a_deficient_lu(histories, nominal):
    """Every recorded run of a square shared matrix, replayed with an LU that is not clear:
    shown deficient or not, the rule stops at the same iteration (analysis at zero time),
    and with the deficiency it never analyses more often nor factorizes ahead."""
    from test_dropin_rule import _keys, plan_of

    checked = 0
    for key in _keys(histories):
        name, method = key.rsplit(".", 1)
        (m, n, nnz, _, _), h = recorded(histories, key)
        if m != n:
            continue
        per = 1.5e-5 + placement.iteration_flops(m, n, nnz) / 1e9
        iter_lim = 2 * n if method == "lsqr" else n
        outcome = {}
        for deficient in (False, True):
            plans, speculations = [], []

            def speculate(planned, speculations=speculations):
                speculations.append(planned)
                return planned, False
            watch = Allowance(iter_lim=iter_lim, atol=1e-6, conlim=1e8,
                              analysis=policy.analysis_seconds(m, n, nnz),
                              plan=lambda plans=plans: plans.append(1) or (None, plan_of(name)),
                              order=n, speculate=speculate,
                              square=_Square(False, deficient), nnz=nnz)
            stopped = stop_of(watch, readings(h, per))
            outcome[deficient] = (stopped, len(plans), len(speculations))
        assert outcome[True][0] == outcome[False][0], (key, outcome)
        assert outcome[True][1] <= outcome[False][1] and outcome[True][2] == 0, (key, outcome)
        checked += 1
    assert checked >= 8


# ---------------------------------------------------------------------------
# an exactly singular LU: R's rank decision may be the null-space COD's few solves

def test_the_nullspace_orders_agree():
    from scipy_gpuqr._factor import lstsq
    assert rank_cost.RANK_NULLSPACE_MIN_ORDER == lstsq.NULLSPACE_HOST_MIN_ORDER
    assert rank_cost.RANK_SPARSE_MIN_ORDER == lstsq.DENSE_LIMIT


def test_an_exactly_singular_lu_factorizes_ahead_and_takes_the_exact_answer():
    """dwt_878's course (order 878, SciPy's stop after some 1600 iterations of 20 µs):
    SuperLU finds A exactly singular, so R's dependent columns are likely a few dead
    pivots; the rule analyses and factorizes ahead at once (no deferral), and where
    the factors show them (CLEAR_DEAD_PIVOTS) the QR's rest is the null-space COD's
    few solves: the run stops well before SciPy's own stop. Where they do not, the run
    goes on to SciPy's stop, having paid one analysis and one factorization. An LU
    that is deficient without being singular (adder_dcop_05, nnc1374) still makes
    neither."""
    square, plans, speculations = _Square(False, True, singular=True), [], []
    watch = _watch_order(square, plans, 878, speculations, clear=policy.CLEAR_DEAD_PIVOTS)
    stop = _converging(watch, 1600)
    # well before SciPy's 1600: near 1191 once warm; the rule counts its real analysis
    # seconds, and a new process's first pass spends up to ~0.2 ms more there (ten of
    # these 20-µs iterations: 1194-1202 seen)
    assert stop is not None and stop < 1300, stop
    assert len(plans) == 1 and len(speculations) == 1
    assert watch.rank_s == pytest.approx(rank_cost.RANK_NULLSPACE_S_PER_SQUARE * 878 ** 2)
    assert policy.CLEAR_DEAD_PIVOTS in watch.summary(), watch.summary()
    square, plans, speculations = _Square(False, True, singular=True), [], []
    watch = _watch_order(square, plans, 878, speculations, clear="")
    assert _converging(watch, 1600) is None
    assert len(plans) == 1 and len(speculations) == 1
    square, plans, speculations = _Square(False, True, singular=False), [], []
    watch = _watch_order(square, plans, 878, speculations, clear=policy.CLEAR_DEAD_PIVOTS)
    assert _converging(watch, 1600) is None
    assert not plans and not speculations


@pytest.mark.parametrize("order", [300, 3000])
def test_an_exactly_singular_lu_outside_the_nullspace_orders_keeps_the_floor(order):
    """Below RANK_NULLSPACE_MIN_ORDER the host's null-space COD is not tried first;
    beyond RANK_SPARSE_MIN_ORDER nothing is factorized ahead: a singular LU there is
    read as any deficient one (the floor, no factorization ahead)."""
    square, plans, speculations = _Square(False, True, singular=True), [], []
    watch = _watch_order(square, plans, order, speculations, clear=policy.CLEAR_DEAD_PIVOTS)
    _converging(watch, 1600)
    assert not speculations
    assert watch._floor() == (rank_cost.rank_decision_floor(order)
                              * (1.0 if watch.at_risk else policy.RANK_PRIOR))


@pytest.mark.parametrize("name, clear", [("dwt_878", policy.CLEAR_DEAD_PIVOTS),
                                         ("adder_dcop_05", ""),
                                         ("494_bus", policy.CLEAR_FULL_RANK)])
def test_speculate_says_why_r_is_clear(name, clear):
    """The factorization ahead reads R: dwt_878's 28 dead pivots (the null-space COD),
    adder_dcop_05's pivots without that shape (no gap at the cutoff), 494_bus of full
    rank; the factors are handed to the QR."""
    from scipy_gpuqr._factor.factored import plan_for
    from scipy_gpuqr._factor.quick_iterate import speculate
    from scipy_gpuqr._options import auto_settings, auto_source
    from scipy_gpuqr._factor.least_squares import check_problem
    A = _mtx(name)
    problem = check_problem(A, np.ones(A.shape[0]), None, 0.0, func="lsqr")
    planned = plan_for(problem.qr_matrix(), auto_settings(auto_source(None)))
    kept, got = speculate(planned, A.shape)
    assert got == clear
    M, plan = kept
    assert plan.factorize(M) is plan.factorize(M)          # A's factors, made once


def test_an_exactly_singular_lu_whose_run_converges_at_once_says_so():
    """A run that converges at the checkpoint where the LU found A exactly singular is
    left without an analysis, and the log does not claim a floor it did not weigh."""
    square, plans = _Square(False, True, singular=True), []
    watch = _watch_order(square, plans, 878)
    watch.decide(400, 0.0)                    # no history: no projection, not trusted
    square.factor()
    watch.lu_at = (400, 0.0)
    assert watch._lu_singular and watch._floor() == 0.0
    assert "A exactly singular" in watch.summary() and not plans


# ---------------------------------------------------------------------------
# the LU ahead on a worker (a host with cores to spare)

class _Ahead(_Square):
    """A stand-in that records when its factorization was started ahead."""

    def __init__(self, clear, deficient=False):
        super().__init__(clear, deficient=deficient)
        self.ahead_at = []

    def factor_ahead(self, readings=True):
        self.ahead_at.append(self._now)
        self.readings = readings
        self.factor()           # done at once: the rule reads it where it would make it


def _stalling_noting(watch, square, iterations, per=1e-5):
    for k in range(1, iterations + 1):
        square._now = k * per
        if watch(StateStandIn(k, k * per, 1.0, 10 ** (-1e-4 * k))):
            return k
    return None


@pytest.mark.parametrize("cpus", [2, 16])
def test_the_lu_starts_ahead_only_with_cores_to_spare(cpus, monkeypatch):
    """With LU_AHEAD_MIN_CPUS cores or more the LU starts on a worker once the run has
    cost LU_AHEAD_SHARE of its prediction; the rule reads it at the same checkpoint as
    without it, and stops the run at the same iteration. The rule's own clock is held
    still: it adds the stand-in LU's wall time to the analysis' seconds, and on a loaded
    host a few milliseconds there moved the two runs' stops apart."""
    monkeypatch.setattr(policy, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    monkeypatch.setattr(policy, "usable_cpus", lambda: cpus)
    square, plans = _Ahead(True), []
    watch = _watch(square, plans)
    stopped = _stalling_noting(watch, square, 5000)
    monkeypatch.setattr(policy, "usable_cpus", lambda: 1)
    ref, ref_plans = _Ahead(True), []
    ref_watch = _watch(ref, ref_plans)
    assert _stalling_noting(ref_watch, ref, 5000) == stopped
    assert watch.lu_at == ref_watch.lu_at and not ref.ahead_at
    if cpus >= policy.LU_AHEAD_MIN_CPUS:
        lu = lu_seconds(10_000)
        assert len(square.ahead_at) == 1
        assert policy.LU_AHEAD_SHARE * lu <= square.ahead_at[0] < watch.lu_at[1]
        assert square.ahead_at[0] <= policy.LU_AHEAD_SHARE * lu + 1e-5     # not a checkpoint late
        assert square.readings is False         # no dense_gpu: U's pivots are never read
    else:
        assert not square.ahead_at


def test_no_lu_ahead_where_the_lu_is_dear_or_there_is_none(monkeypatch):
    monkeypatch.setattr(policy, "usable_cpus", lambda: 16)
    nnz = int((policy.LU_AHEAD_MAX_S - policy.LU_FIXED_S) / policy.LU_S_PER_ENTRY) + 10
    square = _Ahead(True)
    assert _watch(square, [], nnz=nnz)._ahead_at is None
    assert _watch(_Square(True), [])._ahead_at is None      # no factor_ahead
    assert _watch(_Ahead(True), [])._ahead_at is not None


@pytest.mark.parametrize("name", ["nnc1374", "494_bus"])
def test_square_lu_ahead_equals_the_lu_made_at_once(name):
    """The LU made on a worker gives what the caller's own gives: clear, deficient, U's
    pivot readings, the known norms (nnc1374: deficient, its U hiding the deficiency)."""
    A = _mtx(name)
    at_once = SquareLU(lambda: A, A.shape[0])
    clear = at_once.factor()
    ahead = SquareLU(lambda: A, A.shape[0])
    ahead.factor_ahead()
    ahead.factor_ahead()                        # once
    without = SquareLU(lambda: A, A.shape[0])
    without.factor_ahead(readings=False)
    assert without.factor() is clear and without._revealed is None and without._sigma_max is None
    assert ahead.factor() is clear and ahead.seconds > 0
    assert (ahead.deficient, ahead.singular) == (at_once.deficient, at_once.singular)
    assert ahead._revealed == (None if clear else at_once.revealed_dead())
    if not clear:
        assert ahead.hides_deficiency() == at_once.hides_deficiency() == (name == "nnc1374")
        assert ahead.known_norms() == at_once.known_norms()


def test_square_lu_ahead_declined_and_failed():
    """A decline while the worker runs wins (the QR's factors answer) and factor() does
    not wait for the worker; an error on the worker is raised by factor()."""
    import threading
    gate = threading.Event()

    def slow():
        gate.wait(5)
        return sp.csc_array(np.eye(3))
    lu = SquareLU(slow, 3)
    lu.factor_ahead()
    lu.decline("the QR's factors were made ahead")
    t0 = time.perf_counter()
    assert lu.factor() is False and "made ahead" in lu.why
    assert time.perf_counter() - t0 < 1.0 and not gate.is_set()
    gate.set()
    lu._ahead.join(5)
    assert lu.clear is False and "made ahead" in lu.why      # A of full rank: still declined

    def broken():
        raise MemoryError("no room for the LU")
    lu = SquareLU(broken, 3)
    lu.factor_ahead()
    with pytest.raises(MemoryError):
        lu.factor()
