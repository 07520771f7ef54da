"""``lsqr`` under ``auto`` on a square A beyond lstsq's ``DENSE_LIMIT`` whose SuperLU factors
show it deficient: on a GPU host the exact answer starts at the LU (issue 15).

Beyond ``DENSE_LIMIT`` a GPU factorization's R has its rank decided by R's small singular
subspace on the device first (lstsq's ``DenseSubspaceCOD``, gap or not), a few block solves
with R made dense there: bayer10 (q = 13436) in 0.28 s where the dense COD's q³ model said
3 s and R's entries' model 1.5 s. Where SuperLU's factors are deficient without being
exactly singular, a GPU would run the QR's dense rank work, and lstsq would try that
subspace (its first block, sized by U's pivots under the cutoff, within the largest; R
dense within the device's memory: ``device_subspace_takes``), the iterate-first rule
(:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`, ``device_subspace``) predicts
the rank decision at that cost, plans the factorization on the GPU (``plan_gpu``), and
stops the run at the LU unless its trend promises convergence within PREDICTED_SHARE of
the QR. The recorded histories show that bayer10's is the only recorded run whose outcome
moves; an exactly singular LU (rajat01) keeps its rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import lsqr
from scipy_gpuqr._api import square_lu as square_lu_module
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._api.square_lu import SquareLU
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import lu_route, rank_cost
from scipy_gpuqr._dispatch import plan as plan_module
from scipy_gpuqr._dispatch.iterate_first import Allowance
from scipy_gpuqr._dispatch.rank_cost import subspace_seconds
from scipy_gpuqr._factor import lstsq as lstsq_module
from scipy_gpuqr._factor import quick_iterate
from scipy_gpuqr.io import mmread
from _dropin_stand_ins import (PlanStandIn, SquareStandIn, answering, dropin_backward_error,
                               recorded, replay)


#: bayer10's plan, R's entries counted, the analysis having seen a GPU
_Plan = functools.partial(PlanStandIn, 3.34e7, gpu_name="a GPU", nnz_R=4.92e5)


#: Seconds an iteration: bayer10's run in one GPU thread block on the H200 (0.36–0.40 s for
#: 2746 iterations), the CuPy path's, and SciPy's on 2 cores.
CLOCKS = (1.3e-4, 1.45e-4, 2e-4, 3.7e-4)


def _replay(histories, key, *, square=None, dense_gpu=True, takes=True, per=1.3e-4,
            gpu_plan=True):
    """The rule watching a recorded run; ``takes``: ``device_subspace``'s answer (None: not
    given, today's rule). Returns ``(stopped at or None, watch, plans made, GPU plans
    made, device_subspace's questions)``."""
    name, method = key.rsplit(".", 1)
    (m, n, nnz, _, _), h = recorded(histories, key)
    gpu_plans, asked = [], []

    def device_subspace(order, under):
        asked.append((order, under))
        return takes
    stop, watch, plans = replay(
        h, _Plan("cpu"), per=per, iter_lim=2 * n if method == "lsqr" else min(m, n),
        analysis=policy.analysis_seconds(m, n, nnz), order=min(m, n),
        square=square if m == n else None, nnz=nnz, dense_gpu=answering(dense_gpu),
        device_subspace=None if takes is None else device_subspace,
        plan_gpu=(lambda: gpu_plans.append(1) or (None, _Plan("gpu"))) if gpu_plan else None)
    return stop, watch, plans, len(gpu_plans), asked


@pytest.mark.parametrize("per", CLOCKS)
def test_bayer10_on_a_gpu_host_stops_at_the_lu(histories, nominal, per):
    """bayer10's recorded run (SciPy's stop after 2940 iterations): with 73 of U's pivots
    under the cutoff and R's subspace fitting the device, the rule plans the factorization
    on the GPU at the LU, weighs the rank decision as that subspace, and stops at that
    checkpoint. Without ``device_subspace`` (today's rule) the run goes on to SciPy's stop."""
    square = SquareStandIn(under=73)
    stop, watch, plans, gpu_plans, asked = _replay(histories, "bayer10.lsqr", square=square,
                                                   per=per)
    assert stop is not None and stop == watch.lu_at[0] and stop < 1000, (stop, watch.lu_at)
    assert (plans, gpu_plans, asked) == (0, 1, [(13436, 73)])
    assert watch.route.subspace_predicted and watch.route.large_under == 73
    assert watch.rank_s == pytest.approx(subspace_seconds(13436))
    assert "R beyond lstsq's DENSE_LIMIT" in watch.reason, watch.reason
    assert "R's small singular subspace on the GPU predicted" in watch.summary()
    stop, watch, plans, gpu_plans, asked = _replay(histories, "bayer10.lsqr",
                                                   square=SquareStandIn(under=73), takes=None,
                                                   per=per)
    assert stop is None and gpu_plans == 0 and not watch.route.subspace_predicted


@pytest.mark.parametrize("case", ["singular", "no room", "no gpu", "no dense gpu"])
def test_bayer10_keeps_scipys_run_where_the_prediction_cannot_hold(histories, nominal, case):
    """An exactly singular LU (rajat01's kind), a subspace lstsq would not try (too many
    pivots under the cutoff, or R dense does not fit), or no GPU for the dense work: no
    prediction, and the run goes on to SciPy's stop as today."""
    kwargs = {"singular": dict(square=SquareStandIn(under=73, singular=True)),
              "no room": dict(square=SquareStandIn(under=73), takes=False),
              "no gpu": dict(square=SquareStandIn(under=73), dense_gpu=False),
              "no dense gpu": dict(square=SquareStandIn(under=73), dense_gpu=None)}[case]
    stop, watch, plans, gpu_plans, asked = _replay(histories, "bayer10.lsqr", **kwargs)
    assert stop is None and gpu_plans == 0 and not watch.route.subspace_predicted, case
    assert watch.route.large_under == -1
    if case in ("singular", "no gpu", "no dense gpu"):
        assert asked == [] and kwargs["square"].counted == 0


def test_without_plan_gpu_the_cpu_plan_keeps_or_drops_the_prediction(histories, nominal):
    """Without ``plan_gpu`` the plan's own choice: a CPU plan that saw the GPU keeps the
    prediction (a host R's gap-checked COD, then the subspace on the device); one that saw
    no GPU drops it, and the log says why."""
    stop, watch, plans, _, _ = _replay(histories, "bayer10.lsqr", square=SquareStandIn(under=73),
                                       gpu_plan=False)
    assert stop == watch.lu_at[0] and plans == 1
    watch = Allowance(iter_lim=26872, atol=1e-6, conlim=1e8, analysis=1e-2,
                      plan=lambda: (None, _Plan("cpu", gpu_name=None)), order=13436,
                      square=SquareStandIn(under=73), nnz=94926, dense_gpu=lambda: True,
                      device_subspace=lambda order, under: True)
    watch._lu(600, 0.08)
    assert watch.route.subspace_predicted
    watch._analyse(600, 0.08)
    watch.route.keep(watch.planned, watch.rank_device, watch.r_entries)
    assert not watch.route.subspace_predicted and "saw no GPU" in watch.summary()


def test_no_other_recorded_run_moves(histories, nominal):
    """Every recording (square ones with a deficient LU stand-in, not singular but for
    rajat01's, which SuperLU finds exactly singular): the same stop and the same analyses
    with the new callables as without, on every clock, but bayer10's; every order at most
    DENSE_LIMIT is not even asked. The converging rows of the ladder (SciPy's stop within
    1000 iterations) are among them."""
    moved = set()
    for key in sorted(k for k in histories if not k.endswith(".meta")):
        singular = key.startswith("rajat01.")
        for per in CLOCKS:
            old = _replay(histories, key, square=SquareStandIn(under=0, singular=singular),
                          takes=None, per=per)
            new = _replay(histories, key, square=SquareStandIn(under=0, singular=singular),
                          per=per)
            if (old[0], old[2] + old[3]) != (new[0], new[2] + new[3]):
                moved.add(key)
            m, n = (int(v) for v in histories[key + ".meta"][:2])
            if min(m, n) <= rank_cost.RANK_SPARSE_MIN_ORDER:
                assert new[4] == [], key
    assert moved == {"bayer10.lsqr"}


def test_the_rajat01_recording_is_not_asked(histories, nominal):
    """rajat01 (q = 6833): SuperLU finds it exactly singular; its rule is today's."""
    for per in CLOCKS:
        old = _replay(histories, "rajat01.lsqr",
                      square=SquareStandIn(under=56, singular=True), takes=None,
                      per=per)
        new = _replay(histories, "rajat01.lsqr",
                      square=SquareStandIn(under=56, singular=True), per=per)
        assert (old[0], old[2]) == (new[0], new[2]) and new[4] == []


def test_the_subspace_model_beyond_dense_limit():
    """Up to DENSE_LIMIT the latency-bound model (nnc1374); beyond, the block solves' model,
    never below the value at DENSE_LIMIT: bayer10 about 0.29 s (measured 0.28 s)."""
    at = subspace_seconds(rank_cost.RANK_SPARSE_MIN_ORDER)
    assert at == pytest.approx(rank_cost.SUBSPACE_GPU_S_PER_SQUARE * 2500.0 ** 2)
    assert subspace_seconds(1374) == pytest.approx(rank_cost.SUBSPACE_GPU_S_PER_SQUARE * 1374 ** 2)
    assert subspace_seconds(rank_cost.RANK_SPARSE_MIN_ORDER + 1) == pytest.approx(at)
    assert subspace_seconds(13436) == pytest.approx(0.289, rel=0.01)
    assert subspace_seconds(13436) < rank_cost.rank_decision_seconds(13436, 0.06, 4.92e5)


class _Avail:
    def __init__(self, available):
        self.available = available


@pytest.mark.parametrize("q, under, avail, expected", [
    (13436, 73, 80e9, True),            # bayer10 on an H200: block 212, 1.5 GB
    (13436, 73, 2e9, False),            # R dense and the blocks past half the memory
    (13436, 500, 80e9, False),          # first block 1064 > 1024
    (2500, 10, 80e9, False),            # up to DENSE_LIMIT: not this prediction
    (3000, 468, 80e9, True),            # block 1000 = q // 3 ...
    (3000, 469, 80e9, False)])          # ... and past it
def test_device_subspace_takes(monkeypatch, q, under, avail, expected):
    monkeypatch.setattr(lstsq_module, "available_bytes", lambda cp: _Avail(avail))
    monkeypatch.setattr(lstsq_module._gpu, "import_cupy", lambda: None)
    assert lstsq_module.device_subspace_takes(q, under) is expected


def test_device_subspace_takes_without_a_device(monkeypatch):
    def no_device(cp):
        raise RuntimeError("no CUDA device")
    monkeypatch.setattr(lstsq_module, "available_bytes", no_device)
    assert lstsq_module.device_subspace_takes(13436, 73) is False


def test_the_auto_plan_takes_the_gpu_for_the_reason(monkeypatch):
    """``gpu_reason`` under auto: a usable GPU whatever the intensity, logged; against
    SuperLU (spsolve's side) and where the GPU is unusable it changes nothing."""
    class _Analysis:
        intensity = 8.26
    options = type("O", (), {"intensity_threshold": 10.0, "spsolve_threshold": 10.0})()
    monkeypatch.setattr(plan_module, "gpu_unusable", lambda dtype: (None, "a GPU"))
    reasons = []
    chosen, threshold = plan_module._auto_choice(_Analysis(), options, np.float64, reasons)
    assert chosen == "cpu" and "8.26 <" in reasons[-1]
    chosen, threshold = plan_module._auto_choice(_Analysis(), options, np.float64, reasons,
                                                 "qr", "a reason")
    assert chosen == "gpu" and threshold[2] == "a GPU" and "a reason" in reasons[-1]
    monkeypatch.setattr(plan_module, "gpu_unusable", lambda dtype: ("no GPU", None))
    chosen, threshold = plan_module._auto_choice(_Analysis(), options, np.float64, reasons,
                                                 "qr", "a reason")
    assert chosen == "cpu" and threshold is None


def test_without_a_gpu_the_reason_leaves_the_cpu_plan(monkeypatch):
    from scipy_gpuqr._options import resolve_settings
    monkeypatch.setattr(plan_module, "gpu_unusable", lambda dtype: ("no GPU", None))
    A = sp.csc_array(sp.random(300, 200, density=0.02, random_state=3, format="csc") +
                     sp.eye(300, 200, format="csc"))
    plan = plan_module.plan_factorization(A, resolve_settings("auto", None),
                                          gpu_reason="a reason")
    assert plan.backend == "cpu" and plan.gpu_name is None


# ---------------------------------------------------------------------------
# SuperLU's pivots, and the whole call with a GPU host simulated on the CPU

def _mtx(matrices_dir, name):
    return sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)


@pytest.mark.parametrize("name, under", [("bayer10", 73), ("adder_dcop_05", 25),
                                         ("nnc1374", 0)])
def test_pivots_under_the_cutoff(matrices_dir, monkeypatch, name, under):
    """U's pivots under lstsq's cutoff, split or not (bayer10: 73, R has 74, 133 singular
    values lie there); σ_max's Lanczos run once, shared with the split's reading."""
    runs = []
    real = square_lu_module.sigma_max_lanczos
    monkeypatch.setattr(square_lu_module, "sigma_max_lanczos",
                        lambda A: runs.append(1) or real(A))
    A = _mtx(matrices_dir, name)
    lu = SquareLU(lambda: A, A.shape[0])
    lu.factor()
    assert lu.deficient and not lu.singular
    assert lu.pivots_under_cutoff() == under
    lu.revealed_dead()
    lu.hides_deficiency()
    assert len(runs) <= 1


def test_bayer10_on_a_simulated_gpu_host_takes_the_exact_answer(matrices_dir, monkeypatch,
                                                                 decisions):
    """The quick path on the host loop (no block, no move: a GPU host simulated on the CPU):
    the rule asks ``device_subspace`` with U's 73 pivots, plans with the GPU reason (here
    the CPU plan, no GPU usable, whose name is made up as the GPU's), and stops at the LU
    for the QR (itn 0), whose rank decision (the host's sparse subspace here) keeps 13303
    columns; its backward error is far below SciPy's."""
    asked, reasons = [], []
    real = quick_iterate.plan_for

    def plan_for(mi, settings, gpu_reason=None):
        reasons.append(gpu_reason)
        M, plan = real(mi, settings, gpu_reason=gpu_reason)
        # the rule sees a GPU's name; the QR's rank decision stays the host's ("auto" alone
        # sends R's dense work to the device that auto consulted)
        return M, dataclasses.replace(plan, gpu_name="a GPU", requested="auto, simulated")
    monkeypatch.setattr(quick_iterate, "gpu_available", lambda: True)
    monkeypatch.setattr(quick_iterate, "iterate_in_block", lambda *a, **k: None)
    monkeypatch.setattr(quick_iterate, "host_first_budget", lambda *a: None)
    monkeypatch.setattr(quick_iterate, "plan_for", plan_for)
    monkeypatch.setattr(quick_iterate, "device_subspace_takes",
                        lambda q, under: asked.append((q, under)) or True)
    A = sp.csr_array(_mtx(matrices_dir, "bayer10"))
    b = np.random.default_rng([20261126, zlib.crc32(b"bayer10")]).standard_normal(A.shape[0])
    out = lsqr(A, b)
    assert out[2] == 0, decisions()
    assert asked == [(13436, 73)] and reasons == [lu_route.SUBSPACE_GPU_PLAN_REASON]
    line = [m for m in decisions() if m.startswith("lsqr ")][-1]
    # the prediction, whichever verdict stopped the run (on a loaded host, where iterations
    # are slow, the projected cost may stop it before the predicted route's verdict)
    assert "R beyond DENSE_LIMIT (R's small singular subspace on the GPU predicted)" in line, line
    ref = original("lsqr")(A, b)
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)


# ---------------------------------------------------------------------------
# on a GPU

@pytest.mark.gpu
def test_on_the_gpu_bayer10_takes_the_exact_answer(matrices_dir, decisions):
    """On a GPU host: bayer10's run is stopped at the LU, the QR is factorized on the GPU
    and R's small singular subspace there decides (rank 13303), at working precision."""
    A = sp.csr_array(_mtx(matrices_dir, "bayer10"))
    b = np.random.default_rng([20261126, zlib.crc32(b"bayer10")]).standard_normal(A.shape[0])
    out = lsqr(A, b)
    text = "\n".join(decisions())
    assert out[2] == 0, text
    assert "R beyond lstsq's DENSE_LIMIT" in text and "QR on GPU" in text, text
    ref = original("lsqr")(A, b)
    assert dropin_backward_error(A, out[0], b) <= min(dropin_backward_error(A, ref[0], b), 1e-10)
    assert math.isfinite(out[3])
