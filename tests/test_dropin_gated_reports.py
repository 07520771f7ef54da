"""auto's rule told only where it may act: a compiled host run's reports, gated.

:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance` and ``HostFirst`` say
when they would next act (``quiet_until``: the run's seconds before which no
iteration reaches a checkpoint or the move), and take the iterations in between
in one piece (``catch_up``). A compiled host run
(:func:`scipy_gpuqr._iterative.host._reporter`) reports them only from then:
fed that way, the rule stops where it stops when it sees every iteration, and
a patched call is still SciPy's to the bit, with a few reports instead of one
per iteration.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from _dropin_stand_ins import PlanStandIn, stop_of
from _native_helpers import needs_compiler
from conftest import TEST_MATRICES
from scipy_gpuqr import lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import projection
from scipy_gpuqr._dispatch.iterate_first import Allowance
from scipy_gpuqr._dispatch.placement import BLOCK_RENT, HostFirst
from scipy_gpuqr._iterative import native
from scipy_gpuqr._iterative._common import IterationState
from scipy_gpuqr.io import mmread

WINDOW = projection.PROJECTION_WINDOW


def _state(itn, seconds, test1, test2=1.0, rtol=1e-6, conda=10.0):
    return IterationState(itn, None, 0, 1.0, 1.0, 1.0, conda, 1.0, test1, test2, rtol, seconds)


def _gated(watch, states):
    """Where ``watch`` stops ``states`` (as :func:`stop_of`), told as a compiled run tells
    it: only from ``quiet_until()`` on (and the last iteration), the last WINDOW iterations
    in between through ``catch_up`` first. Returns (stop, reports)."""
    skipped, reports = [], 0
    for k, s in enumerate(states):
        if s.seconds < watch.quiet_until() and k + 1 < len(states):
            skipped.append(s)
            continue
        if skipped:
            watch.catch_up(skipped[-WINDOW:])
            skipped = []
        reports += 1
        if watch(s):
            return s.itn, reports
    return None, reports


def _slow_run():
    # falling slowly, 10 µs per iteration: the analysis, then the projection stops it
    return [_state(k, 1e-5 * k, 10 ** (2 - k / 10 ** 4)) for k in range(1, 10 ** 5)]


def test_allowance_fed_the_gated_way_decides_alike(monkeypatch):
    monkeypatch.setattr(policy, "predicted_seconds", lambda backend, flops, gpu: 0.05)
    # the analysis' own seconds (measured, so they differ from run to run) made 0
    monkeypatch.setattr(policy, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    runs = []
    for feed in (stop_of, _gated):
        plans = []
        watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1e-3,
                          plan=lambda: plans.append(1) or (None, PlanStandIn(1e9)))
        out = feed(watch, _slow_run())
        stop, reports = out if isinstance(out, tuple) else (out, None)
        runs.append((stop, watch.reason, watch.analysed_at, len(plans), reports))
    (stop, reason, analysed, plans, _), gated = runs[0], runs[1]
    assert stop is not None and plans == 1 and "the QR's predicted" in reason
    assert gated[:2] == (stop, reason) and gated[3] == plans
    assert gated[2][0] == analysed[0] and gated[2][1] == pytest.approx(analysed[1], rel=1e-9)
    assert gated[4] < stop / 10


def test_allowance_catch_up_keeps_the_history_as_calls_would():
    a = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1.0, plan=lambda: None)
    b = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1.0, plan=lambda: None)
    states = [_state(k, 1e-5 * k * (1 + 0.1 * (k % 3)), 10 ** (2 - k / 20)) for k in range(1, 60)]
    for s in states:
        a(s)
    b(states[0])
    b.catch_up(states[1:-1])
    b(states[-1])
    assert list(a.projector.history) == list(b.projector.history)
    assert b.fastest == states[-1].seconds - states[0].seconds     # of reported iterations
    assert b.quiet_until() == b.next_check + b.analysis_s


@pytest.mark.parametrize("per_iteration", [0.0, 1e-5])
@pytest.mark.parametrize("watched", [False, True])
def test_host_first_moves_at_the_same_iteration(per_iteration, watched):
    """``quiet_until`` is never later than the move: told the gated way, the run moves at
    the iteration it moves at when told each one."""
    moved = []
    for feed in (stop_of, _gated):
        watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1.0,
                          plan=lambda: None) if watched else None
        first = HostFirst(2e-3, watch, per_iteration=per_iteration, rent=BLOCK_RENT)
        states = [_state(k, 5e-4 + 3e-5 * k, 10 ** (2 - k / 1000)) for k in range(1, 400)]
        out = feed(first, states)
        moved.append((out[0] if isinstance(out, tuple) else out, first.moved, first.seconds))
    assert moved[0] == moved[1] and moved[0][1]


@needs_compiler
@pytest.mark.parametrize("name,method", [("west0497", "lsqr"), ("lp_e226", "lsqr"),
                                         ("reorientation_1", "lsqr"), ("reorientation_1", "lsmr"),
                                         ("nnc1374", "lsmr")])
def test_a_watched_compiled_run_reports_few_iterations_and_is_scipys(monkeypatch, name, method):
    """A patched call on a run long enough to be watched: the rule is told a fraction of
    its iterations, and where SciPy's run answers (the rule, on a slow host, may stop it
    for the exact answer) the tuple is SciPy's to the bit."""
    monkeypatch.setenv(native.ENV, "c")
    calls = []
    real = Allowance.__call__

    def counted(self, state):
        calls.append(state.itn)
        return real(self, state)
    monkeypatch.setattr(Allowance, "__call__", counted)
    A = sp.csc_array(mmread(str(TEST_MATRICES / f"{name}.mtx"))).astype(np.float64)
    b = np.random.default_rng(len(name)).standard_normal(A.shape[0])
    ours = (lsqr if method == "lsqr" else lsmr)(A, b)
    theirs = original(method)(A, b)
    assert theirs[1] in (1, 2) and theirs[2] > 100
    assert calls and len(calls) < calls[-1] / 4 + 3
    if ours[2] != 0:                                        # SciPy's run answered
        assert calls[-1] == ours[2] == theirs[2]
        assert ours[0].tobytes() == theirs[0].tobytes()
        assert [np.float64(v).tobytes() for v in ours[1:]] == \
            [np.float64(v).tobytes() for v in theirs[1:len(ours)]]
