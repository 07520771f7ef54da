"""``lsqr``/``lsmr`` under ``auto`` on a square A whose SuperLU factors show its deficiency by
U's pivots: on a GPU host the exact answer starts at the LU (issue 15).

Where SuperLU's factors show A not of full rank by lstsq's rule without being exactly
singular, U's pivots may split at lstsq's cutoff: a few under it, the rest clearly above
(:meth:`~scipy_gpuqr._api.square_lu.SquareLU.revealed_dead`; adder_dcop_05: 25 pivots at
0.98 of the cutoff, the next at 1.47). That predicts that the QR's gap-checked sparse COD
settles R's rank, which a GPU makes cheap (its σ test on the device, or on the host's
compiled sweeps where they cost less than the device's first use), so the iterate-first
rule (:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`, ``dense_gpu``) analyses
at once and stops the run for the exact answer. Where U's pivots hide the deficiency
(nnc1374: none under the cutoff, 66 singular values there) the QR's rank decision is
predicted as R's small singular subspace on the GPU, and the run stops the same way.
Where no GPU runs the dense work, the host's own predictions answer
(tests/test_dropin_host_gap.py, tests/test_dropin_host_subspace.py); where the pivots
neither split nor hide it (reorientation_1: a quarter of the columns under the cutoff,
the next pivot at 1.08), nothing changes. The QR's own checks decide the rank, so a wrong
prediction costs time, not accuracy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from conftest import REPO, banded_deficient
from scipy_gpuqr import lsqr
from scipy_gpuqr._api import square_lu as square_lu_module
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._api.square_lu import PIVOT_GAP, SquareLU
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import rank_cost
from scipy_gpuqr._dispatch.iterate_first import Allowance
from scipy_gpuqr._dispatch.rank_cost import gap_check_seconds
from scipy_gpuqr._factor import quick_iterate
from scipy_gpuqr._factor.lstsq import lstsq_cutoff
from scipy_gpuqr.io import mmread
from _dropin_stand_ins import (PlanStandIn, SquareStandIn, dropin_backward_error, recorded,
                               replay)


def _mtx(matrices_dir, name):
    return sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)


# ---------------------------------------------------------------------------
# U's pivots

def _near_deficient(n, dead, scale, seed=1):
    """``banded_deficient`` whose ``dead`` dependent columns are moved off their
    dependence by ``scale`` × lstsq's absolute cutoff (adder_dcop_05's shape: singular
    values and pivots just under the cutoff where ``scale < 1``)."""
    A = banded_deficient(n, dead, seed).tolil()
    tol = lstsq_cutoff(n, n) * np.linalg.norm(A.toarray(), 2)
    for j in range(n - dead, n):
        A[j, j] += scale * tol
    return sp.csc_array(A)


def _factored(A):
    lu = SquareLU(lambda: A, A.shape[0])
    lu.factor()
    return lu


@pytest.mark.parametrize("scale", [0.5, 0.9])
def test_pivots_just_under_the_cutoff_are_counted(scale):
    """Six columns dependent up to ``scale`` × the cutoff: six singular values and six
    pivots under it, the rest far above; the LU is deficient, not singular."""
    A = _near_deficient(300, 6, scale)
    s = np.linalg.svd(A.toarray(), compute_uv=False)
    assert np.count_nonzero(s <= lstsq_cutoff(300, 300) * s[0]) == 6
    lu = _factored(A)
    assert lu.deficient and not lu.singular, lu.why
    assert lu.revealed_dead() == 6
    assert lu.revealed_dead() == 6          # once: kept


def test_no_deficiency_no_pivots():
    """The same columns three cutoffs off their dependence: nothing under the cutoff."""
    lu = _factored(_near_deficient(300, 6, 3.0))
    assert not lu.deficient and lu.revealed_dead() == 0


def test_pivots_spread_through_the_cutoff_are_not_a_split():
    """Columns scaled geometrically from 1 to 1e-16: the singular values and the pivots
    fall through the cutoff without a gap (reorientation_1's shape): no prediction."""
    n = 300
    rng = np.random.default_rng(2)
    B = sp.diags([rng.uniform(1, 2, n), rng.uniform(-.3, .3, n - 1), rng.uniform(-.3, .3, n - 1)],
                 [0, 1, -1], format="csc")
    lu = _factored(sp.csc_array(B @ sp.diags(np.geomspace(1, 1e-16, n))))
    assert lu.deficient and lu.revealed_dead() == 0


def test_singular_values_under_the_cutoff_without_small_pivots(monkeypatch):
    """An upper bidiagonal matrix with 1 and -2 (σ_min about 2^-n, every pivot 1):
    deficient, yet no pivot lies under even ``cutoff·‖A‖_F`` (nnc1374's shape), so the
    split is refused without σ_max's Lanczos run."""
    n = 80
    A = sp.csc_array(sp.diags([np.ones(n), -2 * np.ones(n - 1)], [0, 1]))
    lu = _factored(A)
    assert lu.deficient
    monkeypatch.setattr(square_lu_module, "sigma_max_lanczos",
                        lambda A: pytest.fail("no Lanczos run needed"))
    assert lu.revealed_dead() == 0


def test_the_split_needs_the_gap(monkeypatch):
    """The pivots above the cutoff must lie PIVOT_GAP × above it: with σ_max read a little
    larger the first of them falls short and nothing is predicted."""
    A = _near_deficient(300, 6, 0.5)
    d = np.sort(np.abs(spla.splu(A).U.diagonal()))
    smax = np.linalg.norm(A.toarray(), 2)
    tol = lstsq_cutoff(300, 300) * smax
    assert d[6] >= PIVOT_GAP * tol
    # the 7th pivot just under PIVOT_GAP × the cutoff, the first six still under it
    big = 1.01 * d[6] / (PIVOT_GAP * lstsq_cutoff(300, 300))
    monkeypatch.setattr(square_lu_module, "sigma_max_lanczos", lambda A: big)
    assert big * lstsq_cutoff(300, 300) < d[6]
    assert _factored(A).revealed_dead() == 0


def test_an_exactly_singular_or_clear_lu_reveals_nothing():
    lu = _factored(banded_deficient(300, 6, 1))
    assert lu.singular and lu.revealed_dead() == 0
    lu = _factored(sp.csc_array(sp.eye(50) * 3.0))
    assert lu.clear and lu.revealed_dead() == 0


@pytest.mark.parametrize("name, dead, hides", [("adder_dcop_05", 25, False),
                                               ("nnc1374", 0, True),
                                               ("reorientation_1", 0, False),
                                               ("dwt_878", 0, False)])
def test_the_shared_rows(matrices_dir, name, dead, hides):
    """adder_dcop_05: 25 pivots at 0.98 of the cutoff, the next at 1.47 (its gap-checked COD
    passes); nnc1374: none under the cutoff of its 66 singular values there (U hides the
    deficiency); reorientation_1: 173 of 677, the next at 1.08; dwt_878: exactly singular
    for SuperLU."""
    A = _mtx(matrices_dir, name)
    lu = _factored(A)
    assert lu.deficient
    assert lu.revealed_dead() == dead
    assert lu.hides_deficiency() == hides


# ---------------------------------------------------------------------------
# the rule

#: adder_dcop_05's plan, the analysis having seen a GPU (R's entries not counted)
_Plan = functools.partial(PlanStandIn, 5.58e5, gpu_name="a GPU")


def _replay(histories, key, square, dense_gpu, plan=None, per=3.3e-5, **questions):
    """The rule watching a recorded run at ``per`` seconds an iteration (adder_dcop_05's
    one-threaded host loop on the H200's host); ``(stopped at or None, watch, analyses,
    dense_gpu's calls)``. ``questions``: the Allowance's other questions (``host_sweeps``,
    ``host_sigma``)."""
    (m, n, nnz, _, _), h = recorded(histories, key)
    asked = []

    def gpu():
        asked.append(1)
        return dense_gpu
    stop, watch, plans = replay(h, plan or _Plan(), per=per, iter_lim=2 * n,
                                analysis=policy.analysis_seconds(m, n, nnz), order=n,
                                speculate=lambda planned: (planned, ""), square=square, nnz=nnz,
                                dense_gpu=None if dense_gpu is None else gpu, **questions)
    return stop, watch, plans, len(asked)


def test_a_revealed_split_on_a_gpu_host_stops_at_the_lu(histories, nominal):
    """adder_dcop_05's recorded run (SciPy's stop after 2171 iterations): with U's 25
    pivots and a GPU for the dense work, the rule analyses at the LU and stops at that
    checkpoint for the QR, whose rank decision it weighs as the GPU's gap-checked
    COD. Without the GPU, or without the split, the run goes on to SciPy's stop (a host
    without a GPU whose compiled sweeps answer: tests/test_dropin_host_gap.py)."""
    stop, watch, plans, asked = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), True)
    lu_itn = watch.lu_at[0]
    assert stop is not None and stop < lu_itn + 150 and stop < 700, (stop, lu_itn)
    assert stop == lu_itn        # one checkpoint: the verdict reads the LU's factors
    assert "pivots under lstsq's cutoff" in watch.reason and plans == 1 and asked == 1
    assert watch.rank_s == pytest.approx(gap_check_seconds(1813))
    assert "U's pivots: 25 under lstsq's cutoff" in watch.summary()
    for square, gpu in ((SquareStandIn(25), False), (SquareStandIn(0), True),
                        (SquareStandIn(25), None)):
        stop, watch, plans, asked = _replay(histories, "adder_dcop_05.lsqr", square, gpu)
        assert stop is None and plans == 0, (square.revealed, gpu, stop)
        assert watch.lu_at is not None and watch.route.gap_predicted == 0
        assert square.asked == (1 if gpu else 0)
        assert asked == (0 if gpu is None else 1)


def test_a_hidden_deficiency_on_a_gpu_host_stops_at_the_lu(histories, nominal):
    """nnc1374's recorded run (SciPy's stop after 1136 iterations): its LU is deficient and
    U's pivots hide it; with a GPU for the dense work the rule analyses at the LU and stops
    at that checkpoint for the QR, whose rank decision it weighs as R's small singular
    subspace on the GPU, with the factorization on the GPU as well. Without the GPU, the
    run goes on to SciPy's stop."""
    for backend in ("cpu", "gpu"):
        stop, watch, plans, asked = _replay(histories, "nnc1374.lsqr", SquareStandIn(0, hides=True),
                                            True, plan=_Plan(backend))
        assert stop == watch.lu_at[0] and plans == 1 and asked == 1, (backend, stop)
        assert "U's pivots hide it" in watch.reason
        assert watch.rank_s == pytest.approx(rank_cost.subspace_seconds(1374))
        assert "small singular subspace on the GPU predicted" in watch.summary()
    for gpu in (False, None):
        stop, watch, plans, _ = _replay(histories, "nnc1374.lsqr", SquareStandIn(0, hides=True),
                                        gpu)
        assert stop is None and plans == 0 and not watch.route.subspace_predicted


def test_a_hidden_deficiency_with_a_plan_that_saw_no_gpu_drops_the_prediction(histories,
                                                                               nominal):
    stop, watch, plans, _ = _replay(histories, "nnc1374.lsqr", SquareStandIn(0, hides=True), True,
                                    plan=_Plan("cpu", gpu_name=None))
    assert stop is None and plans == 1 and not watch.route.subspace_predicted
    assert "saw no GPU" in watch.summary(), watch.summary()


@pytest.mark.parametrize("backend, gpu_name, why", [("gpu", "a GPU", "factorizes on the GPU"),
                                                    ("cpu", None, "saw no GPU")])
def test_a_plan_without_the_gpus_sigma_test_drops_the_prediction(histories, nominal,
                                                                 backend, gpu_name, why):
    """The analysis made at the LU puts the factorization on the GPU (whose factorizer the
    sparse COD would use) or saw no GPU: the prediction is dropped, the run goes on to SciPy's
    stop as with any deficient LU, and the log says why."""
    stop, watch, plans, _ = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), True,
                                    plan=_Plan(backend, gpu_name=gpu_name))
    assert stop is None and plans == 1 and watch.route.gap_predicted == 0
    assert why in watch.summary(), watch.summary()


def test_a_sigma_test_on_the_hosts_sweeps_predicts_the_hosts_gap_check(histories, nominal):
    """The plan keeps the gap-checked COD on a GPU host with the factorization on the host,
    and lstsq would test σ_min(R11) on the host's compiled sweeps for less than the
    device's test with its dense libraries' first use (``host_sigma``: lstsq's
    ``host_factors_sigma_pays``, asked with R11's predicted order and R's entries): the
    route is the host's gap-checked COD, priced by R's entries, and the run still stops at
    the LU. Where ``host_sigma`` says no, or the sweeps are not at hand, the GPU's."""
    from scipy_gpuqr._factor.lstsq import host_factors_sigma_pays
    plan = _Plan()
    plan.analysis.nnz_R = 33_300                    # adder_dcop_05's R by the analysis
    asked = []

    def sigma(order, entries):
        asked.append((order, entries))
        return host_factors_sigma_pays(order, entries)
    stop, watch, plans, _ = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), True,
                                    plan=plan, host_sweeps=lambda: True, host_sigma=sigma)
    assert asked == [(1813 - 25, 33_300)]
    assert stop == watch.lu_at[0] and plans == 1, stop
    assert watch.route.rank_host and watch.route.gap_predicted == 25
    assert watch.rank_s == pytest.approx(rank_cost.host_sparse_rank_seconds(33_300))
    assert "gap-checked COD on the host" in watch.reason
    for sweeps, pays in ((True, False), (False, True)):
        stop, watch, _, _ = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), True,
                                    plan=plan, host_sweeps=lambda s=sweeps: s,
                                    host_sigma=lambda order, entries, p=pays: p)
        assert stop == watch.lu_at[0] and not watch.route.rank_host
        assert watch.rank_s == pytest.approx(gap_check_seconds(1813))
        assert "gap-checked COD on the GPU" in watch.reason


def test_the_runs_trend_promising_convergence_keeps_the_run(histories, nominal, monkeypatch):
    """A gap-checked COD predicted ten times dearer: the run's trend (about 400 more
    iterations at the LU) promises convergence within PREDICTED_SHARE of the QR, and the run
    goes on to SciPy's stop with the prediction standing."""
    monkeypatch.setattr(rank_cost, "GAP_GPU_S_PER_SQUARE", 10 * rank_cost.GAP_GPU_S_PER_SQUARE)
    stop, watch, plans, _ = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), True)
    assert stop is None and plans == 1 and watch.route.gap_predicted == 25


@pytest.mark.parametrize("square, order", [(SquareStandIn(25, clear=True), 1813),
                                           (SquareStandIn(25, singular=True), 1813),
                                           (SquareStandIn(25), 500), (SquareStandIn(25), 3000)])
def test_the_gpu_is_asked_only_where_a_split_could_count(square, order):
    """A clear LU answers; a singular one has the null-space COD's rule; orders below
    GAP_GPU_MIN_ORDER or beyond RANK_SPARSE_MIN_ORDER keep their rank decisions' floors:
    neither the GPU nor U's pivots are asked."""
    asked = []
    watch = Allowance(iter_lim=2 * order, atol=1e-6, conlim=1e8, analysis=1e-3,
                      plan=lambda: (None, _Plan()), order=order, square=square, nnz=10_000,
                      dense_gpu=lambda: asked.append(1) or True)
    watch._lu(400, 0.01)
    assert not asked and square.asked == 0 and watch.route.gap_predicted == 0


def test_every_recorded_square_run_without_a_split_stops_where_it_did(histories, nominal):
    """Every recorded square run, with a deficient LU whose pivots do not split: a GPU host
    (``dense_gpu`` True) and a host without one (False) stop at the same iteration, with as
    many analyses, as a rule that does not read U's pivots (None)."""
    checked = 0
    for key in sorted(k for k in histories if not k.endswith(".meta")):
        m, n = (int(v) for v in histories[key + ".meta"][:2])
        if m != n:
            continue
        outcome = {gpu: _replay(histories, key, SquareStandIn(0), gpu, per=2e-5)[::2]
                   for gpu in (None, True, False)}
        assert outcome[None] == outcome[True] == outcome[False], (key, outcome)
        checked += 1
    assert checked >= 8


def test_the_orders_agree():
    from scipy_gpuqr._factor import lstsq
    assert rank_cost.GAP_GPU_MIN_ORDER == lstsq.SVD_GPU_MIN_ORDER
    assert square_lu_module.REVEALED_MAX_FRACTION == lstsq.NULLSPACE_MAX_FRACTION


# ---------------------------------------------------------------------------
# the whole call, a GPU host simulated on the CPU

def _b(name, m):
    return np.random.default_rng(zlib.crc32(name.encode())).standard_normal(m)


@pytest.fixture
def simulated_gpu_host(monkeypatch):
    """The quick path's GPU question answers yes and the plan has seen a GPU (so the QR's
    dense rank work is the GPU's: here its host fallback, no CuPy call made)."""
    real = quick_iterate.plan_for
    monkeypatch.setattr(quick_iterate, "gpu_available", lambda: True)
    monkeypatch.setattr(quick_iterate, "plan_for", lambda mi, settings: (
        lambda planned: (planned[0], dataclasses.replace(planned[1], gpu_name="a GPU")))(
            real(mi, settings)))


def test_adder_dcop_05_on_a_simulated_gpu_host_takes_the_exact_answer(
        matrices_dir, simulated_gpu_host, decisions):
    """The run stops at the LU for the QR (itn 0), whose gap-checked COD keeps 1788 columns;
    its backward error is far below SciPy's (1.4e-5). The factorization is the host's and
    R11's compiled sweeps cost less than the device's σ test with its first use: the
    gap-checked COD on the host predicted (where the sweeps are at hand)."""
    from scipy_gpuqr._factor import native
    A = sp.csr_array(_mtx(matrices_dir, "adder_dcop_05"))
    b = _b("adder_dcop_05", A.shape[0])
    ref = original("lsqr")(A, b)
    out = lsqr(A, b)
    assert out[2] == 0, decisions()
    line = [m for m in decisions() if m.startswith("lsqr ")][-1]
    assert "QR on CPU" in line and "pivots under lstsq's cutoff" in line, line
    where = "on the host" if native.at_hand() else "on the GPU"
    assert f"gap-checked COD {where} predicted" in line, line
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)


def test_the_qr_reads_what_the_lu_learnt(matrices_dir, simulated_gpu_host, monkeypatch):
    """After the LU, the QR's rank decision takes A's σ_max (the pivot split's Lanczos) and
    the LU's failed probe of ‖A⁻¹‖₂ for its own (R has A's singular values): no probe
    through R's solves, no Lanczos on R; the same rank, at working precision."""
    from scipy_gpuqr._factor import lstsq as lstsq_module
    A = sp.csr_array(_mtx(matrices_dir, "adder_dcop_05"))
    b = _b("adder_dcop_05", A.shape[0])
    probes, lanczos, decisions_made = [], [], []
    real_probe, real_smax = lstsq_module.probe_norm, lstsq_module.sigma_max_lanczos
    monkeypatch.setattr(lstsq_module, "probe_norm",
                        lambda *a, **k: probes.append(1) or real_probe(*a, **k))
    monkeypatch.setattr(lstsq_module, "sigma_max_lanczos",
                        lambda *a, **k: lanczos.append(1) or real_smax(*a, **k))
    real_post = lstsq_module.MinNormSolver.__post_init__

    def post(self):
        real_post(self)
        decisions_made.append(self)
    monkeypatch.setattr(lstsq_module.MinNormSolver, "__post_init__", post)
    out = lsqr(A, b)
    assert out[2] == 0
    solver, = decisions_made
    assert (solver.method, solver.rank) == ("cod", 1788)
    assert not probes and not lanczos
    assert solver.sigma_max == pytest.approx(spla.svds(A, k=1, return_singular_vectors=False)[0],
                                             rel=1e-10)
    assert dropin_backward_error(A, out[0], b) <= 1e-10


def test_nnc1374_on_a_simulated_gpu_host_takes_the_exact_answer(matrices_dir,
                                                                 simulated_gpu_host, decisions):
    """U's pivots hide nnc1374's deficiency: the rule weighs the QR's rank decision as R's
    small singular subspace on the GPU and stops the run for the QR (itn 0), whose rank
    decision (here the host's, no CuPy call made) keeps 1308 columns; its backward error
    is far below SciPy's."""
    A = sp.csr_array(_mtx(matrices_dir, "nnc1374"))
    b = _b("nnc1374", A.shape[0])
    ref, out = original("lsqr")(A, b), lsqr(A, b)
    assert out[2] == 0, decisions()
    line = [m for m in decisions() if m.startswith("lsqr ")][-1]
    assert "QR on CPU" in line and "small singular subspace on the GPU predicted" in line, line
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)


# ---------------------------------------------------------------------------
# on a GPU

@pytest.mark.gpu
def test_on_the_gpu_adder_dcop_05_and_nnc1374_take_the_exact_answer(matrices_dir, decisions):
    """On a GPU host: adder_dcop_05 is stopped at the LU and the QR answers (its σ test on
    the host's compiled sweeps where they are at hand), at working precision; so is
    nnc1374 (R's small singular subspace on the device decides its rank)."""
    A = sp.csr_array(_mtx(matrices_dir, "adder_dcop_05"))
    b = _b("adder_dcop_05", A.shape[0])
    ref, out = original("lsqr")(A, b), lsqr(A, b)
    line = [m for m in decisions() if m.startswith("lsqr ")][-1]
    assert out[2] == 0 and "pivots under lstsq's cutoff" in line, line
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)
    A = sp.csr_array(_mtx(matrices_dir, "nnc1374"))
    b = _b("nnc1374", A.shape[0])
    ref, out = original("lsqr")(A, b), lsqr(A, b)
    line = [m for m in decisions() if m.startswith("lsqr ")][-1]
    assert out[2] == 0 and "small singular subspace on the GPU predicted" in line, line
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)
    assert not math.isnan(out[3])


_NEW_PROCESS = r"""
import json, sys, zlib
import numpy as np, scipy.sparse as sp
sys.path.insert(0, sys.argv[2])
from _dropin_stand_ins import dropin_backward_error
from scipy_gpuqr import lsqr
from scipy_gpuqr._cli.solve_report import captured_decisions
from scipy_gpuqr._factor import lstsq
from scipy_gpuqr.io import mmread
made = []
real = lstsq.dense_from_sparse
lstsq.dense_from_sparse = lambda T, xp: made.append(T.shape[0]) or real(T, xp)
A = sp.csr_array(sp.csc_array(mmread(sys.argv[1])).astype(np.float64))
b = np.random.default_rng(zlib.crc32(b"adder_dcop_05")).standard_normal(A.shape[0])
with captured_decisions() as decided:
    out = lsqr(A, b)
line = [m for m in decided if m.startswith("lsqr ")][-1]
print(json.dumps({"itn": int(out[2]), "made": made, "line": line,
                  "be": dropin_backward_error(A, out[0], b)}))
"""


@pytest.mark.gpu
def test_on_the_gpu_a_new_processs_adder_dcop_05_tests_sigma_on_the_host(matrices_dir):
    """A new process on a GPU host (nothing has used the device's dense libraries):
    adder_dcop_05's QR runs on the host and its gap-checked COD tests σ_min(R11) on the
    host's compiled sweeps (built first here), predicted so by the rule, with no dense
    copy on the device; at working precision."""
    env = dict(os.environ, SCIPY_GPUQR_FACTOR_NATIVE="c",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    got = json.loads(subprocess.run(
        [sys.executable, "-c", _NEW_PROCESS, str(matrices_dir / "adder_dcop_05.mtx"),
         str(REPO / "tests")], env=env, check=True, capture_output=True, text=True,
        timeout=300).stdout.splitlines()[-1])
    assert got["itn"] == 0 and "QR on CPU" in got["line"], got["line"]
    assert "gap-checked COD on the host predicted" in got["line"], got["line"]
    assert got["made"] == [] and got["be"] <= 1e-10
