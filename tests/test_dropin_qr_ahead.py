"""The QR made on a worker beside a short run (:mod:`scipy_gpuqr._factor.qr_ahead`).

Under ``auto``, an unwatched LSQR/LSMR run on a non-square A that stalls at its
limit (the small LP matrices' LSMR at ``min(m, n)``) is answered by the QR; on a
host with cores to spare the QR is made on one worker thread from a share of
the run on. The answer is the same bits as without the worker; a run that
converges returns SciPy's tuple without waiting for the worker; only hosts with
:data:`~scipy_gpuqr._factor.qr_ahead.QR_AHEAD_MIN_CPUS` usable cores (patched
here: this machine may have two) start one, and only where the gate says so.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from _native_helpers import needs_compiler
from conftest import TEST_MATRICES
from scipy_gpuqr import lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._factor import dense_least_squares, qr_ahead
from scipy_gpuqr._factor.qr_ahead import (QR_AHEAD_MAX_LENGTH, QR_AHEAD_MIN_CPUS,
                                          QR_AHEAD_SHARE, QRAhead, qr_ahead_fits)
from scipy_gpuqr._iterative import native
from scipy_gpuqr._iterative._common import format_kernels
from scipy_gpuqr._iterative.host import HostProblem, lsmr_host
from scipy_gpuqr.io import mmread

OURS = {"lsqr": lsqr, "lsmr": lsmr}
#: The dense answer's gate as shipped (the fixture below turns it off).
DENSE_GATE = dense_least_squares.DENSE_ANSWER_MAX_FLOPS


def _mtx(name):
    return sp.csc_array(mmread(str(TEST_MATRICES / f"{name}.mtx"))).astype(np.float64)


def _b(A, seed=7):
    return np.random.default_rng(seed).standard_normal(A.shape[0])


def _bits(out):
    return [out[0].tobytes()] + [np.float64(v).tobytes() for v in out[1:]]


@pytest.fixture(autouse=True)
def no_dense_answer(monkeypatch):
    """The worker's mechanics on these small matrices: their dense answer
    (:mod:`~scipy_gpuqr._factor.dense_least_squares`, which makes a tiny problem's
    answer on the caller's thread with no worker) turned off, except where a test
    turns it back on."""
    monkeypatch.setattr(dense_least_squares, "DENSE_ANSWER_MAX_FLOPS", 0.0)


@pytest.fixture
def cores(monkeypatch):
    """``cores(k)``: the gate's count of usable cores."""
    return lambda k: monkeypatch.setattr(qr_ahead, "usable_cpus", lambda: k)


@pytest.fixture
def started(monkeypatch):
    """The iterations at which workers were started (and the QRAhead objects)."""
    seen = []
    real = QRAhead.start

    def start(self):
        seen.append(self)
        return real(self)
    monkeypatch.setattr(QRAhead, "start", start)
    return seen


# -- the gate -----------------------------------------------------------------

def test_the_gate_needs_cores_short_vectors_a_small_qr_and_a_run_worth_hiding(cores):
    A = _mtx("lp_e226")
    m, n = A.shape
    cores(QR_AHEAD_MIN_CPUS)
    assert qr_ahead_fits((m, n), A.nnz, min(m, n))
    cores(QR_AHEAD_MIN_CPUS - 1)
    assert not qr_ahead_fits((m, n), A.nnz, min(m, n))
    cores(64)
    assert not qr_ahead_fits((QR_AHEAD_MAX_LENGTH + 1, 10), 100, 20)    # long vectors
    assert not qr_ahead_fits((3000, 2000), 10 ** 4, 2000)                # a QR that may be dear
    assert not qr_ahead_fits((m, n), A.nnz, 3)                           # a run of nothing
    assert not qr_ahead_fits((0, 5), 0, 10)


def test_a_problem_the_dense_answer_takes_starts_no_worker(cores, started, monkeypatch, caplog):
    """Within the dense answer's gate the caller's thread answers after the stall, with
    no worker: lp_share1b's LSMR (117 × 253) stalls at its limit and is answered densely,
    as ``backend='cpu'``'s sparse QR answers to rounding."""
    monkeypatch.setattr(dense_least_squares, "DENSE_ANSWER_MAX_FLOPS", DENSE_GATE)
    cores(64)
    A = _mtx("lp_share1b")
    b = _b(A)
    assert dense_least_squares.dense_qr_small(A.shape)
    assert not qr_ahead_fits(A.shape, A.nnz, min(A.shape))
    with caplog.at_level("INFO", logger="scipy_gpuqr"):
        auto = lsmr(A, b)
    assert not started
    assert "dense QR on CPU (LAPACK" in caplog.text and "worker" not in caplog.text
    cpu = lsmr(A, b, backend="cpu")
    assert np.linalg.norm(auto[0] - cpu[0]) <= 1e-10 * np.linalg.norm(cpu[0])
    assert auto[1:3] == cpu[1:3]


@pytest.mark.parametrize("name,method", [("lp_share1b", "lsmr"), ("lp_e226_transposed", "lsmr")])
def test_a_stalled_run_starts_one_worker_at_the_share(cores, started, name, method):
    cores(16)
    A = _mtx(name)
    OURS[method](A, _b(A))
    assert len(started) == 1
    assert started[0].at_itn == int(np.ceil(QR_AHEAD_SHARE * min(A.shape)))


def test_no_worker_on_two_cores_a_square_a_or_a_run_that_converges_early(cores, started):
    A = _mtx("lp_share1b")
    cores(2)
    lsmr(A, _b(A))
    assert not started
    cores(16)
    W = _mtx("west0067")                    # square: the LU answers a stall
    assert lsmr(W, _b(W))[2] == 0
    assert not started
    S = _mtx("ash219")                      # converges before the share
    out = lsmr(S, _b(S))
    assert out[1] in (1, 2) and not started


# -- the same bits --------------------------------------------------------------

@pytest.mark.parametrize("name,method", [("lp_share1b", "lsmr"), ("lp_e226", "lsmr"),
                                         ("lp_e226_transposed", "lsmr"), ("lp_share1b", "lsqr")])
def test_the_answer_made_ahead_is_the_same_bits(cores, started, monkeypatch, name, method):
    """The worker makes the whole answer where it ends before the caller waits for it
    (held here until it has: its thread joined first)."""
    A = _mtx(name)
    b = _b(A)
    cores(1)
    without = OURS[method](A, b)
    cores(16)
    made = []
    import scipy_gpuqr._api.lsqr as lsqr_api
    real = lsqr_api.solve_least_squares
    real_result = QRAhead.result

    def on_this_thread(*args, **kw):        # the caller's thread makes no QR of its own
        made.append(threading.current_thread())
        return real(*args, **kw)

    def joined_first(self):
        self._thread.join(30)
        return real_result(self)
    monkeypatch.setattr(lsqr_api, "solve_least_squares", on_this_thread)
    monkeypatch.setattr(QRAhead, "result", joined_first)
    with_worker = OURS[method](A, b)
    assert len(started) == 1 and not made
    assert started[0].result().what == "the QR made"
    assert without[2] == with_worker[2] == 0        # the QR answered, both times
    assert _bits(with_worker) == _bits(without)


def test_a_worker_that_cannot_start_leaves_the_answer_to_the_caller(cores, started,
                                                                    monkeypatch):
    """Where the host gives no thread (``Thread.start`` raises), the run goes on and the
    caller makes the answer after the stall, the same bits as without a worker (it
    does not wait for a worker that never ran)."""
    A = _mtx("lp_e226")
    b = _b(A)
    cores(1)
    without = lsmr(A, b)

    class NoThread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")
    monkeypatch.setattr(qr_ahead, "threading",
                        SimpleNamespace(Thread=NoThread, Event=threading.Event))
    cores(16)
    refused = lsmr(A, b)
    assert len(started) == 1 and not started[0].started
    assert started[0].result() is None
    assert _bits(refused) == _bits(without)


def _held_in(monkeypatch, step):
    """Hold the worker in ``step`` ('start', 'plan' or 'factors') until the caller waits
    for it (:meth:`QRAhead.result`, which waits for the worker to reach the step first);
    returns the list of threads that made the answer."""
    reached, entered = threading.Event(), threading.Event()
    real_result = QRAhead.result

    def result(self):
        assert reached.wait(30)
        self._waited = True             # what result() says first, seen by the held step
        entered.set()
        return real_result(self)
    monkeypatch.setattr(QRAhead, "result", result)

    def held(real):
        def step(*args, **kw):
            reached.set()
            out = real(*args, **kw)
            assert entered.wait(30)
            return out
        return step
    if step == "start":
        monkeypatch.setattr(qr_ahead, "start_problem", held(qr_ahead.start_problem))
    elif step == "plan":
        monkeypatch.setattr(qr_ahead, "plan_for", held(qr_ahead.plan_for))
    else:
        from scipy_gpuqr._dispatch.plan import Plan
        monkeypatch.setattr(Plan, "with_factors", held(Plan.with_factors))
    import scipy_gpuqr._api.lsqr as lsqr_api
    answered = []
    real = lsqr_api.solve_least_squares

    def on_this_thread(*args, **kw):
        answered.append(threading.current_thread())
        return real(*args, **kw)
    monkeypatch.setattr(lsqr_api, "solve_least_squares", on_this_thread)
    return answered


@pytest.mark.parametrize("step,what", [("start", ""), ("plan", "the QR planned"),
                                       ("factors", "the QR factorized")])
@pytest.mark.parametrize("name,method", [("lp_e226", "lsmr"), ("lp_share1b", "lsqr")])
def test_a_caller_that_waits_makes_the_rest_the_same_bits(cores, started, monkeypatch, caplog,
                                                          step, what, name, method):
    """Where the run stalls before the worker is done, the worker stops after its step and
    the caller's thread makes the rest from what it made: the same bits, the log saying
    what the worker made."""
    A = _mtx(name)
    b = _b(A)
    cores(1)
    without = OURS[method](A, b)
    cores(16)
    answered = _held_in(monkeypatch, step)
    with caplog.at_level("INFO", logger="scipy_gpuqr"):
        with_worker = OURS[method](A, b)
    assert len(started) == 1
    made = started[0].result()
    assert made.answer is None and made.what == what
    assert (made.planned is None) == (step == "start")
    assert answered == [threading.main_thread()]
    assert _bits(with_worker) == _bits(without)
    line = [r.getMessage() for r in caplog.records if "answered" in r.getMessage()][-1]
    worker = f"; {what} on a worker beside the run, its answer made here"
    assert line.endswith(worker) if what else "on a worker" not in line


def test_the_worker_begins_once_the_caller_has_gone_back_to_the_run(cores, started,
                                                                    monkeypatch):
    """The worker's first step waits for :meth:`QRAhead.start` to return, so the run does
    not wait for the interpreter's lock while the worker's first steps run."""
    cores(16)
    returned, seen = threading.Event(), []
    real_start, real_first = QRAhead.start, qr_ahead.start_problem

    def start(self):
        real_start(self)
        returned.set()

    def first(problem):
        seen.append(returned.is_set())
        return real_first(problem)
    monkeypatch.setattr(QRAhead, "start", start)
    monkeypatch.setattr(qr_ahead, "start_problem", first)
    A = _mtx("lp_e226")
    lsmr(A, _b(A))
    assert seen == [True]


def test_lsqr_with_calc_var_made_ahead_is_the_same_bits(cores, started):
    A = _mtx("lp_share1b")
    b = _b(A)
    cores(1)
    without = lsqr(A, b, calc_var=True)
    cores(16)
    with_worker = lsqr(A, b, calc_var=True)
    assert len(started) == 1 and with_worker[2] == 0
    assert _bits(with_worker[:9]) == _bits(without[:9])
    assert with_worker[9].tobytes() == without[9].tobytes()


# -- a converging run never waits for the worker ----------------------------------

def test_a_converging_run_returns_scipys_answer_without_waiting(cores, started, monkeypatch):
    """lp_e226ᵀ's LSQR converges after the share (267 of 446 iterations): the worker
    starts, and is held in its first step until the call has returned."""
    cores(16)
    hold, entered = threading.Event(), threading.Event()
    planned = []
    real_start = qr_ahead.start_problem

    def held(problem):
        entered.set()
        assert hold.wait(30)
        return real_start(problem)
    monkeypatch.setattr(qr_ahead, "start_problem", held)
    monkeypatch.setattr(qr_ahead, "plan_for", lambda *a, **k: planned.append(1))
    A = _mtx("lp_e226_transposed")
    b = _b(A)
    try:
        ours = lsqr(A, b)                   # returns while the worker is held
        assert len(started) == 1 and entered.wait(10)
        worker = started[0]._thread
        assert worker.is_alive()
    finally:
        hold.set()
    theirs = original("lsqr")(A, b)
    assert theirs[1] in (1, 2) and ours[2] == theirs[2] > started[0].at_itn
    assert _bits(ours) == _bits(theirs)
    worker.join(30)
    assert not worker.is_alive() and not planned          # cancelled: it stopped there


# -- the worker's own outcomes ------------------------------------------------------

def test_an_error_on_the_worker_is_raised_by_the_call(cores, started, monkeypatch):
    cores(16)

    def fails(*args, **kw):
        raise RuntimeError("the worker's QR failed")
    monkeypatch.setattr(qr_ahead, "start_problem", fails)     # its first step, always made
    A = _mtx("lp_share1b")
    with pytest.raises(RuntimeError, match="worker's QR failed"):
        lsmr(A, _b(A))
    assert len(started) == 1


def test_a_plan_on_the_gpu_goes_back_to_the_callers_thread(monkeypatch):
    """The worker factorizes only on the host: a GPU plan is handed back unused."""
    gpu_plan = ("M", SimpleNamespace(backend="gpu"))
    monkeypatch.setattr(qr_ahead, "plan_for", lambda *a, **k: gpu_plan)
    monkeypatch.setattr(qr_ahead, "solve_least_squares",
                        lambda *a, **k: pytest.fail("factorized on the worker"))
    begin = SimpleNamespace(trivial=False)
    monkeypatch.setattr(qr_ahead, "start_problem", lambda problem: begin)
    problem = SimpleNamespace(qr_matrix=lambda: None)
    ahead = QRAhead(lambda: problem, settings=None, iter_lim=40)
    assert ahead.result() is None           # never started: the caller makes the answer
    ahead(SimpleNamespace(itn=ahead.at_itn, istop=0))
    ahead._thread.join(30)                  # the worker ends before the caller waits
    made = ahead.result()
    assert made.begin is begin and made.answer is None and made.planned is gpu_plan
    assert made.what == "the QR planned"


def test_the_worker_never_starts_at_the_stopping_iteration_or_before_the_share():
    ahead = QRAhead(lambda: pytest.fail("started"), settings=None, iter_lim=100)
    assert ahead.at_itn == 25 and ahead.first_report() == 25
    ahead(SimpleNamespace(itn=24, istop=0))
    ahead(SimpleNamespace(itn=30, istop=7))
    ahead.cancel()
    ahead(SimpleNamespace(itn=31, istop=0))
    assert not ahead.started and ahead.quiet_until() == np.inf


@needs_compiler
def test_the_compiled_loops_report_nothing_before_first_report(monkeypatch):
    monkeypatch.setenv(native.ENV, "c")
    A = _mtx("lp_e226")
    b = _b(A)
    m, n = A.shape
    seen = []

    class Recorder:
        def __call__(self, state):
            seen.append(state.itn)
            return False

        def first_report(self):
            return 40

        def quiet_until(self):
            return np.inf

        def catch_up(self, states):
            pass
    forward, backward = format_kernels("csc")

    def run(callback):
        P = HostProblem(m, n, forward, backward, (A.indptr, A.indices, A.data), b, None)
        return lsmr_host(P, 0.0, 1e-6, 1e-6, 1e8, min(m, n), callback=callback)[0]
    watched, plain = run(Recorder()), run(None)
    assert seen == [40, min(m, n)]          # the gate, then the stopping iteration
    assert _bits(watched) == _bits(plain)


# -- on a GPU host -----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lp_share1b", "lp_e226", "lp_e226_transposed"])
def test_on_a_gpu_host_the_lp_rows_qr_is_planned_on_the_host_and_made_ahead(cores, started,
                                                                             name):
    """With a GPU present the plan still gives these small QRs the CPU: the worker makes
    the answer, or the caller's thread the rest of it from the worker's host plan, the
    same bits as without it."""
    A = _mtx(name)
    b = _b(A)
    cores(1)
    without = lsmr(A, b)
    cores(16)
    with_worker = lsmr(A, b)
    assert len(started) == 1
    made = started[0].result()
    assert made.planned is None or made.planned[1].backend == "cpu"
    assert _bits(with_worker) == _bits(without)
