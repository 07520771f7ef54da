"""The speculative factorization of ``auto``'s rule: stalling runs whose QR is cheap.

When only the predicted dense rank work keeps the QR from answering a run
that will not converge soon, :class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`
factorizes once, ahead (``speculate``); an R that is clearly of full rank
(:func:`~scipy_gpuqr._factor.quick_iterate.clearly_full_rank`) lets the QR
answer at once. The recorded histories of ``tests/data/lsqr_histories.npz``
are replayed on the fixed clock of ``tests/test_dropin_rule.py``; what
``speculate`` says per matrix was measured on 2 cores (lstsq's first
full-rank test on R of ``lsqr(backend='cpu')``). End to end, 494_bus and
olm500 (square, full rank, LSQR stalls until iter_lim) are answered exactly
from the factors made ahead, without a second factorization.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import lsqr
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch.iterate_first import Allowance
from scipy_gpuqr._factor import quick_iterate
from scipy_gpuqr._factor.quick_iterate import clearly_full_rank
from scipy_gpuqr.io import mmread
from conftest import banded_deficient
from test_dropin_rule import QR, _keys, watch_recording
from _dropin_stand_ins import PlanStandIn, StateStandIn

lsqr_api = importlib.import_module("scipy_gpuqr._api.lsqr")   # the module, not the function

#: lstsq's cheap full-rank tests on R (the 1-norm estimate, then the probe through R's
#: solves) as ``speculate`` makes them, per matrix (measured; 2 cores)
CLEAR = {"494_bus": True, "olm500": True, "lp_share1b": True, "lp_e226": True,
         "rajat19": True, "bp_1200": True, "rajat01": False, "hangGlider_2": True,
         "nnc1374": False, "adder_dcop_05": False, "bayer10": False, "dwt_878": False,
         "reorientation_1": False, "Groebner_id2003_aug": True, "grid16": False,
         "west0479": True, "west0497": True, "tumorAntiAngiogenesis_2": True}
#: seconds of the QR once its factors are made and R is clearly of full rank: the solve
CHEAP_SOLVE = 1e-3


def replay(histories, key):
    """``(stopped at, auto's seconds, SciPy's seconds, istop, speculations)`` with speculation."""
    name = key.rsplit(".", 1)[0]
    calls = []

    def speculate(planned):
        calls.append(planned)
        return planned, CLEAR[name]

    r = watch_recording(histories, key, speculate)
    scipy = r.itn * r.per_iteration
    # the QR's cost after the run: its solve when factorized ahead with a clear R
    after = (CHEAP_SOLVE if r.watch.speculated else r.qr)
    ahead = (3e-3 + r.flops / 8e9) if calls else 0.0      # nominal's factorization
    if r.stopped is not None:
        spent = r.stopped * r.per_iteration + ahead + after
    elif r.recorded < r.itn:
        spent = r.recorded * r.per_iteration + ahead + after
    else:
        spent = scipy + ahead + (0.0 if r.istop in (1, 2) else after)
    return r.stopped, spent, scipy, r.istop, len(calls)


@pytest.mark.parametrize("key", ["494_bus.lsqr", "olm500.lsqr", "rajat19.lsqr", "bp_1200.lsqr"])
def test_stalling_run_with_a_clearly_full_rank_r_ends_early(histories, nominal, key):
    """SciPy's iter_lim ends these runs; R is clearly of full rank: the QR answers
    well before iter_lim, for less than SciPy's run."""
    stopped, spent, scipy, istop, calls = replay(histories, key)
    assert istop == 7 and calls == 1
    assert stopped is not None and spent < scipy, (stopped, spent, scipy)


def test_speculation_happens_at_most_once_and_keeps_converging_runs(histories, nominal):
    """Every converging run whose R is not clearly of full rank (the QR's rank decision
    is dear there) is still SciPy's; a speculation costs one factorization, once."""
    kept = 0
    for key in _keys(histories):
        stopped, spent, scipy, istop, calls = replay(histories, key)
        assert calls <= 1, key
        if istop in (1, 2) and not CLEAR[key.split(".")[0]]:
            assert stopped is None, key
            kept += 1
    assert kept >= 5


def test_stalling_runs_cost_at_most_scipys_run_and_the_qr_with_speculation(histories, nominal):
    for key in _keys(histories):
        stopped, spent, scipy, istop, calls = replay(histories, key)
        if istop == 7:
            name = key.split(".")[0]
            factorization = 3e-3 + QR[name][0] / 8e9
            assert spent <= scipy + QR[name][1] + factorization + 1e-12, key


def test_no_speculation_without_rank_risk(monkeypatch):
    """A run whose QR prediction carries no rank work never factorizes ahead."""
    monkeypatch.setattr(policy, "predicted_seconds", lambda backend, flops, gpu=None: 1e-3)
    watch = Allowance(iter_lim=100, atol=1e-6, conlim=1e8, analysis=1e-3,
                      plan=lambda: (None, PlanStandIn(1e6)), order=0,
                      speculate=lambda planned: pytest.fail("no speculation"))
    for k in range(1, 100):
        if watch(StateStandIn(k, 1e-4 * k, 1e-6 * 10 ** (6 - k / 100), 1.0, 1e-6, 10.0)):
            break
    assert watch.speculated is None


def test_clearly_full_rank():
    rng = np.random.default_rng(0)
    R = sp.csc_array(np.triu(rng.standard_normal((30, 30))) + 10 * np.eye(30))
    assert clearly_full_rank(R, 1e-14)
    D = R.toarray()
    D[5, 5] = 0.0
    assert not clearly_full_rank(sp.csc_array(D), 1e-14)           # a zero pivot
    D[5, 5] = 1e-20
    assert not clearly_full_rank(sp.csc_array(D), 1e-14)           # below the cutoff
    assert not clearly_full_rank(sp.csc_array(np.triu(np.ones((3, 4)))), 1e-14)  # not square


@pytest.mark.parametrize("name", ["494_bus", "olm500"])
def test_stalling_square_problems_end_in_the_factors_made_ahead(matrices_dir, name,
                                                                  decisions, monkeypatch):
    """End to end: the QR answers (working precision) from the factors made ahead (its
    factorization is the kept plan's, which hands them over). The factorization's
    prediction is fixed at the measured order (0.3 ms), and the analysis' estimate
    small enough that the rule analyses within the first iterations, so that
    whether the speculation pays does not depend on the machine's load (on a
    fast host the run came within 1.5 % of its analysis deferral: analysed
    near iter_lim, the iterations left no longer paid for a speculation). Whether
    the iterations left pay for it also depends on the host's seconds per
    iteration (on a fast host, about 5 µs each, the check that would speculate
    came after the iteration beyond which they no longer did): the speculation's
    margin is 0 here, so that this test is about what a speculation hands the QR,
    not whether this host's iterations pay for one (the tests on recorded
    histories above weigh that)."""
    monkeypatch.setattr(policy, "predicted_seconds", lambda backend, flops, gpu=None: 3e-4)
    monkeypatch.setattr(policy, "SPECULATION_MARGIN", 0.0)
    monkeypatch.setattr(quick_iterate, "analysis_seconds", lambda m, n, nnz: 1e-5)
    # the square matrices' SuperLU answer (tests/test_dropin_square_lu.py) off: this is
    # the QR's speculation, which serves where SuperLU does not (rectangular A; square
    # A of 2e5 entries or more on a GPU host)
    monkeypatch.setattr(lsqr_api, "square_lu", lambda *args: None)
    calls = []
    real = quick_iterate.speculate

    def counting(planned, shape):
        planned, clear = real(planned, shape)
        M, plan = planned
        inner = plan.factorize_fn

        def once(*args, **kwargs):
            calls.append(1)
            return inner(*args, **kwargs)
        return (M, dataclasses.replace(plan, factorize_fn=once)), clear
    monkeypatch.setattr(quick_iterate, "speculate", counting)
    A = sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    x, istop, itn = lsqr(A, b)[:3]
    message = decisions()[-1]
    assert "QR on CPU" in message and "clearly of full rank" in message, message
    assert itn == 0 and calls == [1]
    r = b - A @ x           # a consistent square system: backward error at working precision
    assert np.linalg.norm(r) <= 1e-13 * (sp.linalg.norm(A) * np.linalg.norm(x)
                                         + np.linalg.norm(b))


@pytest.mark.parametrize("name", ["rajat19", "bp_1200"])
def test_full_rank_by_the_probe_without_a_dense_inverse(matrices_dir, name, monkeypatch):
    """Full-rank R whose 1-norm estimate misses lstsq's bound by its factor 10·q (rajat19:
    rcond 6e-12 against 3e-9): the probe through R's sparse solves confirms full rank,
    both in ``speculate``'s test and in the rank decision itself, with no dense inverse
    of R (it cost 12-33 ms of a 70 ms SciPy run); the answer is lstsq's."""
    from scipy_gpuqr._factor import triangular
    from scipy_gpuqr._factor.lstsq import MinNormSolver, _rcond_estimate, lstsq_cutoff
    A = sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)
    F = scipy_gpuqr_qr(A)
    R = sp.csc_array(F.R)
    cutoff = lstsq_cutoff(*A.shape)
    q = R.shape[0]
    assert _rcond_estimate(R) < 10 * q * cutoff          # the first test is inconclusive
    monkeypatch.setattr(triangular, "_dense_inverse",
                        lambda *a: pytest.fail("R's inverse made dense"))
    assert clearly_full_rank(R, cutoff)
    solver = MinNormSolver(R, cutoff)
    assert solver.method == "triangular" and solver.rank == q
    b = np.random.default_rng(3).standard_normal(A.shape[0])
    x = F.solve(b)
    ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    r = b - A @ x           # square, nonsingular: backward error at working precision
    assert np.linalg.norm(r) <= 1e-13 * (sp.linalg.norm(A) * np.linalg.norm(x)
                                         + np.linalg.norm(b))
    # forward error within c·eps·cond (cond 1e10 and 2e8) of lstsq's
    assert np.linalg.norm(x - ref) <= 1e-4 * np.linalg.norm(ref)


def scipy_gpuqr_qr(A):
    from scipy_gpuqr import QRFactorization
    return QRFactorization(A, backend="cpu")


def test_a_probe_that_cannot_pass_is_not_run_to_its_end(matrices_dir, monkeypatch):
    """Speculation on converging runs whose R is not of full rank under lstsq's rule
    (they pay for it): nnc1374's 1-norm estimate alone shows ‖R⁻¹‖₂ too large, so no
    probe runs; adder_dcop_05's probe stops once its estimate, which only grows, fails
    the last step's margin (3 solves, not 5). The verdict is the full probe's."""
    from scipy_gpuqr._factor.lstsq import lstsq_cutoff
    from scipy_gpuqr._factor.solve_rank import frobenius, probe_norm
    from scipy_gpuqr._factor.triangular import UpperTriangular
    calls = []

    def counting(apply, apply_t, q, **kwargs):
        def a(C):
            calls.append(1)
            return apply(C)

        def at(C):
            calls.append(1)
            return apply_t(C)
        return probe_norm(a, at, q, **kwargs)
    monkeypatch.setattr(quick_iterate, "probe_norm", counting)
    for name, solves in (("nnc1374", 0), ("adder_dcop_05", 3)):
        A = sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)
        R = sp.csc_array(scipy_gpuqr_qr(A).R)
        cutoff = lstsq_cutoff(*A.shape)
        del calls[:]
        assert not clearly_full_rank(R, cutoff)
        assert len(calls) == solves, name
        up, upt = UpperTriangular(R).solves()        # the whole probe fails as well
        nu, margin = probe_norm(up, upt, R.shape[0])
        assert margin * nu * cutoff * frobenius(R) >= 1.0


def test_factors_made_ahead_serve_only_their_matrix():
    """The plan speculate() hands the QR returns the factors made ahead for A alone:
    the rank decision's factorizations of R go through the same callable and get
    R's own factors, so the decision is the one a plain plan makes."""
    from scipy_gpuqr._options import resolve_settings
    from scipy_gpuqr._validate import as_matrix
    from scipy_gpuqr._factor import factored
    A = banded_deficient(400, 5, 3)
    b = np.random.default_rng(1).standard_normal(400)
    mi, settings = as_matrix(A), resolve_settings("cpu")
    (M, plan), clear = quick_iterate.speculate(factored.plan_for(mi, settings), A.shape)
    num = plan.factorize(M)
    assert plan.factorize(M) is num
    G = sp.random(50, 30, density=0.2, random_state=np.random.default_rng(2), format="csc") \
        + sp.eye(50, 30, format="csc")
    other = plan.factorize_fn(G, ordering="colamd", colperm=None, tol=None, analysis=None)
    assert other is not num and other.R.shape[1] == 30
    ahead = factored.factorize(mi, settings, planned=(M, plan))
    plain = factored.factorize(mi, settings, planned=factored.plan_for(mi, settings))
    x_ahead = ahead.least_squares(b[:, None]).ravel()
    x_plain = plain.least_squares(b[:, None]).ravel()
    assert ahead._solver.summary()["method"] == plain._solver.summary()["method"]
    assert ahead._solver.summary()["rank"] == plain._solver.summary()["rank"] == 395
    xr = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    np.testing.assert_allclose(x_ahead, xr, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(x_plain, xr, rtol=1e-10, atol=1e-12)
