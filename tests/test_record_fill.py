"""A stage's records made once, chunk by chunk, whichever thread asks first
(:mod:`scipy_gpuqr._schedule.record_fill`): the launch loop and the records worker
of a GPU call's first factorization share them, and no launch is made twice."""

import threading
import time

import numpy as np
import pytest

from scipy_gpuqr._schedule import bucket, cache, sparse
from scipy_gpuqr._schedule.record_fill import RecordFill
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares


@pytest.fixture
def no_store(monkeypatch):
    monkeypatch.setenv(cache.ENV, "off")
    bucket.clear_cache()
    clear_schedule_cache()
    yield
    clear_schedule_cache()


@pytest.fixture
def makings(monkeypatch):
    """``(stage maker, L0, L1, thread name)`` of every making of records."""
    made = []
    real = sparse._StageMaker.records

    def records(self, L0, L1, into=None):
        made.append((self, L0, L1, threading.current_thread().name))
        return real(self, L0, L1, into)

    monkeypatch.setattr(sparse._StageMaker, "records", records)
    return made


def _counts(made, st) -> list:
    """How many times each launch of ``st`` was made."""
    count = np.zeros(st.nlaunch, dtype=np.int64)
    for m, L0, L1, _ in made:
        if m is st._maker:
            count[L0:L1] += 1
    return count.tolist()


def _whole(an, kw) -> list:
    """Each stage's records made whole by an independent build (one pass)."""
    ref = build_schedule(an, cache=False, lazy=True, **kw)
    return [st._maker.records(0, st.nlaunch) for st in ref.stages]


_KW = [dict(), dict(dense_flops=1e6, max_tasks=300), dict(budget_div=2, dense_flops=1e6)]


def _kw(an, kw):
    kw = dict(kw)
    div = kw.pop("budget_div", None)
    if div:
        kw["max_gpu_memory"] = int(an.gpu_bytes // div)
    return kw


@pytest.mark.parametrize("kw", _KW)
def test_launch_loop_and_records_worker_make_each_launch_once(no_store, makings, kw):
    # the cold call's two makers at once: the launch loop (iter_launches, its
    # prefetching worker) and the records worker (materialize); every launch made
    # once, the records those of a whole build, the loop's views of the stage's
    # array, the stage materialized with it
    an = analyze(grid3d_least_squares(10))
    kw = _kw(an, kw)
    want = _whole(an, kw)
    s = build_schedule(an, cache=False, lazy=True, **kw)
    makings.clear()
    worker = threading.Thread(target=s.materialize, name="gpuqr-records")
    worker.start()
    got = list(s.iter_launches(prefetch=True))
    worker.join()
    assert len(got) == s.nlaunch
    for st in s.stages:
        assert _counts(makings, st) == [1] * st.nlaunch
        assert st.materialized
    for st, w in zip(s.stages, want):
        assert st.tasks.tobytes() == w.tobytes()
    for i, L, rec in got:
        st = s.stages[i]
        assert rec.base is st.tasks.base or rec.base is st.tasks
        assert np.shares_memory(rec, st.tasks) or len(rec) == 0
        assert rec.tobytes() == want[i][st.launch_ptr[L]:st.launch_ptr[L + 1]].tobytes()


def test_a_chunk_being_made_is_waited_for_not_made_again(no_store, makings, monkeypatch):
    # the loop asks for a chunk the worker is making: it waits, then takes the
    # worker's; the worker skips the chunks the loop made itself meanwhile
    an = analyze(grid3d_least_squares(10))
    want = _whole(an, {})[0]
    real = sparse._StageMaker.records
    slow = threading.Event()
    chunks = []

    def records(self, L0, L1, into=None):       # (real: the fixture's, counting)
        if L0 == chunks[1][0] and threading.current_thread().name == "worker":
            slow.set()
            time.sleep(0.2)             # the loop asks for chunk 1 meanwhile
        return real(self, L0, L1, into)

    monkeypatch.setattr(sparse._StageMaker, "records", records)
    s = build_schedule(an, cache=False, lazy=True)
    st, = s.stages
    chunks += st.launch_chunks()
    assert len(chunks) > 4
    st.launch_range(*chunks[0])             # the first launch, on the loop
    worker = threading.Thread(target=lambda: st.tasks, name="worker")
    worker.start()
    assert slow.wait(10)
    mine = st.launch_range(*chunks[3])      # not taken: made here
    theirs = st.launch_range(*chunks[1])    # being made by the worker: waited for
    worker.join()
    assert _counts(makings, st) == [1] * st.nlaunch
    by = {(L0, L1): name for _, L0, L1, name in makings}
    main = threading.main_thread().name
    assert by[chunks[0]] == by[chunks[3]] == main and by[chunks[1]] == "worker"
    lp = st.launch_ptr
    for (L0, L1), recs in ((chunks[3], mine), (chunks[1], theirs)):
        for L, r in zip(range(L0, L1), recs):
            assert r.tobytes() == want[lp[L]:lp[L + 1]].tobytes()
    assert st.tasks.tobytes() == want.tobytes()


def test_a_making_that_fails_leaves_its_chunk_to_the_next():
    lp = np.array([0, 2, 5, 9], dtype=np.int64)
    calls = []

    def make(L0, L1, into):
        calls.append((L0, L1))
        if len(calls) == 2:
            raise MemoryError("once")
        into["front"] = np.arange(lp[L0], lp[L1])

    fill = RecordFill(make, lp)
    with pytest.raises(MemoryError):
        fill.whole()
    assert fill.done() is None
    t = fill.whole()
    assert t["front"].tolist() == list(range(9)) and fill.done() is t
    assert calls == [(0, 1), (1, 3), (1, 3)]
    assert fill.range(1, 2) is not t and np.shares_memory(fill.range(1, 2), t)


@pytest.mark.parametrize("budget_div", [None, 2])
def test_cold_engine_call_makes_each_launch_once_and_a_warm_call_none(no_store, makings,
                                                                      budget_div):
    # the GPU engine on the host layer: its first call of a pattern makes every
    # launch's records once (launch loop and records worker together), the
    # records of a whole pass; a second call takes the cached schedule and makes
    # none, with the same R
    from scipy_gpuqr._engine.gpu.device import NumpyDevice
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    A = grid3d_least_squares(8)
    an = analyze(A, cache=False)
    budget = None if budget_div is None else int(an.gpu_bytes // budget_div)
    g = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
    assert g.info["schedule_cold"]
    assert budget is None or len(g.schedule.stages) > 1
    for st in g.schedule.stages:
        assert st.materialized and _counts(makings, st) == [1] * st.nlaunch
    makings.clear()
    for st in g.schedule.stages:            # a whole pass of the same stage's maker
        assert st.tasks.tobytes() == st._maker.records(0, st.nlaunch).tobytes()
    makings.clear()
    g2 = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
    assert not g2.info["schedule_cold"] and g2.schedule is g.schedule
    assert makings == []
    assert abs(g2.R - g.R).max() == 0.0
    g.free()
    g2.free()
