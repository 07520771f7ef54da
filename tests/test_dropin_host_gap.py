"""``lsqr`` under ``auto`` on a host without a GPU, on a square A whose SuperLU factors show
its deficiency by U's pivots split at lstsq's cutoff: the exact answer starts at the LU
(issue 15).

On such a host lstsq decides a sparse R's rank below ``DENSE_LIMIT`` by the gap-checked
sparse COD first (σ_max, a rank-detecting sparse QR of R, σ_min(R11) on R11's compiled
sweeps, a second sparse QR), whose cost follows R's entries: adder_dcop_05's 15-20 ms
after the LU, where the dense rules' cube said 1.19 s. Where U's pivots split (a few under
the cutoff, the rest clearly above: ``SquareLU.revealed_dead``), the iterate-first rule
(:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`, ``dense_gpu()`` False) predicts
that decision by R's entries (``host_sparse_rank_seconds``), analyses at once and stops the
run unless its trend promises convergence within PREDICTED_SHARE of the QR. Where the plan
factorizes on the GPU, did not count R's entries, or R is too dense for the sparse COD,
the prediction is dropped. Failed probes of ``‖R⁻¹‖₂`` that the LU hands the QR also spare
R's 1-norm condition estimate where it could pass only by its estimate's shortfall.
"""

from __future__ import annotations

import functools
import logging
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import rank_cost
from scipy_gpuqr._dispatch.rank_cost import host_sparse_rank_seconds
from scipy_gpuqr._factor import lstsq as lstsq_module
from scipy_gpuqr._factor import quick_iterate
from scipy_gpuqr._factor.lstsq import KnownNorms, MinNormSolver
from scipy_gpuqr.io import mmread
from _dropin_stand_ins import (PlanStandIn, SquareStandIn, answering, dropin_backward_error,
                               recorded, replay)

#: adder_dcop_05's R: the analysis' count of its entries
ADDER_R_ENTRIES = 33300
#: Seconds an iteration: auto's compiled host loop on 2 cores (27-30 µs), SciPy's own (62 µs),
#: and a slower host.
CLOCKS = (2e-5, 3e-5, 6e-5, 1.3e-4)


#: adder_dcop_05's plan on the host, R's entries counted
_Plan = functools.partial(PlanStandIn, 5.58e5, nnz_R=ADDER_R_ENTRIES)


def _replay(histories, key, square, dense_gpu=False, plan=None, per=3e-5, sweeps=True):
    """The rule watching a recorded run (``sweeps``: ``host_sweeps``'s answer, None: not
    given); ``(stopped at or None, watch, analyses)``."""
    _, method = key.rsplit(".", 1)
    (m, n, nnz, _, _), h = recorded(histories, key)
    return replay(h, plan or _Plan(), per=per,
                  iter_lim=2 * n if method == "lsqr" else min(m, n),
                  analysis=policy.analysis_seconds(m, n, nnz), order=min(m, n),
                  speculate=lambda planned: (planned, ""),
                  square=square if m == n else None, nnz=nnz,
                  dense_gpu=answering(dense_gpu), host_sweeps=answering(sweeps))


@pytest.mark.parametrize("per", CLOCKS)
def test_a_split_on_a_host_without_a_gpu_stops_at_the_lu(histories, nominal, per):
    """adder_dcop_05's recorded run (SciPy's stop after 2171 iterations), no GPU: U's 25
    pivots predict the host's gap-checked COD, weighed by R's entries, and the run stops
    at the LU's checkpoint; without the split (or with an exactly singular LU, whose rule
    is its own) it goes on to SciPy's stop, as before. An LU that hides the deficiency
    stops the run only past min(m, n) = 1813 iterations (R's small singular subspace on the
    host: tests/test_dropin_host_subspace.py)."""
    stop, watch, plans = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), per=per)
    assert stop is not None and stop == watch.lu_at[0] and stop < 1000, (stop, watch.lu_at)
    assert plans == 1 and watch.route.rank_host and watch.route.gap_predicted == 25
    assert watch.rank_s == pytest.approx(host_sparse_rank_seconds(ADDER_R_ENTRIES))
    assert watch.rank_s < 0.1 * rank_cost.RANK_S_PER_CUBE * 1813.0 ** 3
    assert "gap-checked COD on the host" in watch.reason, watch.reason
    assert "gap-checked COD on the host predicted" in watch.summary()
    for kwargs in (dict(), dict(revealed=25, singular=True)):
        stop, watch, plans = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(**kwargs),
                                     per=per)
        old = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(**kwargs), dense_gpu=None,
                      per=per)
        assert (stop, plans) == (old[0], old[2]) and stop is None and not watch.route.rank_host
    stop, watch, _ = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(hides=True), per=per)
    assert stop > 1813 and watch.route.rank_host and watch.route.host_block
    assert not watch.route.gap_predicted


def test_without_the_compiled_sweeps_nothing_is_predicted(histories, nominal):
    """The host's compiled sweeps not at hand (no C compiler, or mode ``numpy``): the σ
    test would make R11 dense, so the split predicts nothing, the log says why, and the
    run goes on to SciPy's stop; without ``host_sweeps`` U's pivots are not even read."""
    square = SquareStandIn(25)
    stop, watch, plans = _replay(histories, "adder_dcop_05.lsqr", square, sweeps=False)
    assert stop is None and plans == 0 and square.asked == 1 and not watch.route.rank_host
    assert "compiled sweeps not at hand" in watch.summary(), watch.summary()
    square = SquareStandIn(25)
    stop, watch, plans = _replay(histories, "adder_dcop_05.lsqr", square, sweeps=None)
    assert stop is None and plans == 0 and square.asked == 0


@pytest.mark.parametrize("plan, why", [(_Plan("gpu"), "factorizes on the GPU"),
                                       (_Plan(nnz_R=None), "entries not counted"),
                                       (_Plan(nnz_R=0.06 * 1813 ** 2), "too dense")])
def test_the_plan_drops_the_host_prediction(histories, nominal, plan, why):
    """A plan whose R is not the host's sparse COD's: the prediction is dropped, the log
    says why, and the run goes on to SciPy's stop (the rank decision's cube keeps it)."""
    stop, watch, plans = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), plan=plan)
    assert stop is None and plans == 1
    assert not watch.route.rank_host and watch.route.gap_predicted == 0
    assert why in watch.summary(), watch.summary()


def test_a_gpu_host_keeps_its_own_prediction(histories, nominal):
    """With a GPU for the dense work the prediction is the GPU's gap-checked COD, not the
    host's (the plan's ``gpu_name`` set: :mod:`test_dropin_pivot_gap`)."""
    plan = _Plan()
    plan.gpu_name = "a GPU"
    stop, watch, _ = _replay(histories, "adder_dcop_05.lsqr", SquareStandIn(25), dense_gpu=True,
                             plan=plan)
    assert stop == watch.lu_at[0] and not watch.route.rank_host
    assert watch.rank_s == pytest.approx(rank_cost.gap_check_seconds(1813))


#: The shared square matrices' SuperLU outcomes (``SquareLU``: of full rank, or deficient
#: with U's pivots split, hiding it, or exactly singular); the rest are of full rank.
REAL_LU = {"adder_dcop_05": dict(revealed=25), "nnc1374": dict(hides=True),
           "reorientation_1": dict(), "dwt_878": dict(singular=True),
           "rajat01": dict(singular=True), "bayer10": dict(revealed=73)}


def test_only_adder_dcop_05_moves_among_the_recordings(histories, nominal):
    """Every recording with its matrix's real LU outcome, on a host without a GPU at every
    clock: the same stop and analyses as a rule that does not read U's pivots, but
    adder_dcop_05's (bayer10 lies beyond DENSE_LIMIT, nnc1374's pivots hide its deficiency
    and its recorded run converges within min(m, n) iterations, before the host's subspace
    route holds)."""
    moved = set()
    for key in sorted(k for k in histories if not k.endswith(".meta")):
        name = key.rsplit(".", 1)[0]
        lu = REAL_LU.get(name, dict(clear=True))
        for per in CLOCKS:
            old = _replay(histories, key, SquareStandIn(**lu), dense_gpu=None, per=per)
            new = _replay(histories, key, SquareStandIn(**lu), per=per)
            if (old[0], old[2]) != (new[0], new[2]):
                moved.add(key)
    assert moved == {"adder_dcop_05.lsqr"}


# ---------------------------------------------------------------------------
# U's pivots read without σ_max's Lanczos run where a lower bound refuses the split

def test_too_many_pivots_under_the_cutoff_need_no_lanczos(matrices_dir, monkeypatch):
    """reorientation_1: 173 of its 677 pivots lie under the cutoff with A's largest column
    norm for σ_max (a lower bound of it), more than REVEALED_MAX_FRACTION: no split, found
    without σ_max's Lanczos run (which the rule, reading the pivots on a host without a GPU
    too, would pay on this converging row); adder_dcop_05's 25 still need it."""
    from scipy_gpuqr._api import square_lu as square_lu_module
    from scipy_gpuqr._api.square_lu import SquareLU
    runs = []
    real = square_lu_module.sigma_max_lanczos
    monkeypatch.setattr(square_lu_module, "sigma_max_lanczos",
                        lambda A: runs.append(1) or real(A))
    for name, dead, lanczos in (("reorientation_1", 0, 0), ("adder_dcop_05", 25, 1)):
        A = _mtx(matrices_dir, name)
        lu = SquareLU(lambda: A, A.shape[0])
        lu.factor()
        runs.clear()
        assert lu.revealed_dead() == dead and len(runs) == lanczos, name
    A = sp.csr_array(sp.random(40, 30, density=0.2, random_state=3))
    A.data[:] = 2.0                     # duplicates summed before they are squared
    dup = sp.csc_array((np.array([1.0, 2.0]), np.array([0, 0]), np.array([0, 2])), shape=(2, 1))
    assert square_lu_module._largest_column_norm(dup) == pytest.approx(3.0)
    assert square_lu_module._largest_column_norm(A) == pytest.approx(
        np.linalg.norm(A.toarray(), axis=0).max())


# ---------------------------------------------------------------------------
# the 1-norm test spared by a failed probe

def _mtx(matrices_dir, name):
    return sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)


def _r_and_factorize(A):
    """R of A's CPU factorization and the decision's sparse QR (SuiteSparseQR's)."""
    from scipy_gpuqr._cpu.spqr import spqr_factorize
    from scipy_gpuqr._dispatch import plan as plan_mod
    factorize = plan_mod._wrap_spqr(spqr_factorize)
    R = sp.csc_array(factorize(A, tol=None, analysis=None).R)

    def decision_qr(G, *, tol):
        return factorize(sp.csc_array(G), ordering="colamd", colperm=None, tol=tol,
                         analysis=None)
    return R, decision_qr


@pytest.mark.parametrize("nu, margin, hopeless", [(1e20, 50.0, True), (1e20, 5.0, True),
                                                  (1.0, 5.0, True), (1.0, 50.0, False),
                                                  (float("nan"), 50.0, False)])
def test_the_probe_spares_the_one_norm_test(nu, margin, hopeless):
    """``rcond₁ <= q/(ν·‖R‖_F)``: hopeless where ``ν·cutoff·‖R‖_F >= 0.1`` (or where a probe
    with a margin under 10 failed, as before); not where ν is small or not finite."""
    R = sp.csc_array(sp.diags([np.full(50, 2.0), np.full(49, 0.5)], [0, 1]))
    solver = MinNormSolver.__new__(MinNormSolver)
    solver.R, solver.cutoff = R, 50 * np.finfo(float).eps
    solver._probe, solver._fro, solver._fro_pending = (nu, margin), None, None
    assert solver._one_norm_test_hopeless() == hopeless
    solver._probe = None
    assert not solver._one_norm_test_hopeless()


def test_a_known_probe_spares_r_made_dense(matrices_dir, monkeypatch):
    """adder_dcop_05's R with the LU's failed probe (ν = 4.89e11): R's diagonal does not show
    the deficiency, yet the 1-norm test is not run (no R made dense for it); the rank and
    the solution are those of the decision without the probe."""
    from scipy_gpuqr._api.square_lu import SquareLU
    A = _mtx(matrices_dir, "adder_dcop_05")
    lu = SquareLU(lambda: A, A.shape[0])
    assert not lu.factor() and lu.deficient
    known = lu.known_norms()
    assert known is not None and known.inverse_norm is not None
    R, decision_qr = _r_and_factorize(A)
    cutoff = lstsq_module.lstsq_cutoff(*A.shape)
    plain = MinNormSolver(R, cutoff, factorize=decision_qr)
    called = []
    real = lstsq_module._dense_rcond
    monkeypatch.setattr(lstsq_module, "_dense_rcond", lambda Rd: called.append(1) or real(Rd))
    probed = MinNormSolver(R, cutoff, factorize=decision_qr, known=KnownNorms(
        inverse_norm=known.inverse_norm))
    assert not called
    assert (probed.rank, probed.method) == (plain.rank, plain.method) == (1788, "cod")


# ---------------------------------------------------------------------------
# the whole call on this host (no GPU asked)

def test_adder_dcop_05_without_a_gpu_takes_the_exact_answer(matrices_dir, monkeypatch,
                                                            caplog):
    """No GPU (the compiled sweeps built here, as on the CI host): the run stops at the LU
    for the QR on the CPU (itn 0), whose gap-checked COD keeps 1788 columns; its backward
    error is far below SciPy's (1.4e-5)."""
    caplog.set_level(logging.INFO, logger="scipy_gpuqr")
    monkeypatch.setattr(quick_iterate, "gpu_available", lambda: False)
    from scipy_gpuqr._factor import native
    if native.library() is None:
        pytest.skip(f"no compiled sweeps: {native.status()}")
    A = sp.csr_array(_mtx(matrices_dir, "adder_dcop_05"))
    b = np.random.default_rng(zlib.crc32(b"adder_dcop_05")).standard_normal(A.shape[0])
    ref, out = original("lsqr")(A, b), lsqr(A, b)
    lines = [r.getMessage() for r in caplog.records if r.name == "scipy_gpuqr"]
    assert out[2] == 0, lines
    line = [m for m in lines if m.startswith("lsqr ")][-1]
    assert "QR on CPU" in line and "gap-checked COD on the host" in line, line
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)
    exact = lsqr(A, b, backend="cpu")[0]         # the explicit backend's answer
    assert np.linalg.norm(out[0] - exact) <= 1e-8 * np.linalg.norm(exact)
