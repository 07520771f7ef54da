"""R's layout is made once per pattern also when threads ask for it at once.

Two threads asking for the layout of one pattern at the same time (user threads
factorizing one pattern, or a call and the load started ahead of it) each made
their own before, and the one kept last replaced the other, with the gather maps
made on it (:meth:`~scipy_gpuqr._engine.gpu.rlayout.RLayout.stage_maps`).
``PerPattern.get_or_make`` makes one and hands it to both. Likewise a staging
plan's gather maps, asked for at once by the host side's worker and a stage's
R copier: one caller makes them, the others wait for them.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from scipy_gpuqr._engine.gpu import rlayout
from scipy_gpuqr._schedule.pattern_cache import PerPattern
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares


class _Pattern:
    """An object with a pattern key, as an analysis has."""

    def __init__(self, key):
        self.pattern_key = key


def _at_once(fn, n=4):
    """``fn()`` in ``n`` threads released together: their results."""
    start = threading.Barrier(n)

    def run():
        start.wait()
        return fn()
    with ThreadPoolExecutor(n) as ex:
        return [f.result() for f in [ex.submit(run) for _ in range(n)]]


def test_get_or_make_makes_once_for_callers_at_once():
    cache = PerPattern(8, 1 << 20, lambda v: 8)
    made = []

    def make():
        time.sleep(0.05)                # long enough for every caller to miss
        made.append(object())
        return made[-1]
    a, b = _Pattern("p"), _Pattern("p")     # two objects of one pattern
    got = _at_once(lambda: cache.get_or_make(a, "k", make)) + [cache.get_or_make(b, "k", make)]
    assert len(made) == 1 and all(g is made[0] for g in got)
    other = cache.get_or_make(_Pattern("q"), "k", make)     # another pattern: its own
    assert len(made) == 2 and other is made[1]
    assert not cache._making                 # no lock left behind


def test_get_or_make_after_a_failed_make():
    cache = PerPattern(8, 1 << 20, lambda v: 8)
    a = _Pattern("p")

    def fail():
        raise RuntimeError("no")
    with pytest.raises(RuntimeError):
        cache.get_or_make(a, None, fail)
    assert cache.get_or_make(a, None, lambda: "made") == "made"
    assert not cache._making


def test_r_layout_made_once_when_threads_ask_at_once(monkeypatch):
    an = analyze(grid3d_least_squares(5), cache=False)
    rlayout.clear_r_layout_cache(an)
    built = []
    real = rlayout._build

    def slow_build(analysis):
        time.sleep(0.05)
        built.append(real(analysis))
        return built[-1]
    monkeypatch.setattr(rlayout, "_build", slow_build)
    try:
        got = _at_once(lambda: rlayout.r_layout(an))
        assert len(built) == 1 and all(g is built[0] for g in got)
        assert rlayout.r_layout_cached(an) is built[0]
    finally:
        rlayout.clear_r_layout_cache(an)


def _two_stage_plan(an):
    """A staging plan of two stages cut in the middle of the fronts."""
    nf = an.fronts.nfronts
    return [(0, nf // 2 - 1), (nf // 2, nf - 1)]


def test_stage_maps_made_once_when_threads_ask_at_once(monkeypatch):
    an = analyze(grid3d_least_squares(5), cache=False)
    rlayout.clear_r_layout_cache(an)
    lay = rlayout.r_layout(an)
    made = []
    real = rlayout.RLayout._make_stage_maps

    def slow(self, key):
        time.sleep(0.05)                # long enough for every caller to miss
        made.append(key)
        return real(self, key)
    monkeypatch.setattr(rlayout.RLayout, "_make_stage_maps", slow)
    try:
        plan = _two_stage_plan(an)
        got = _at_once(lambda: lay.stage_maps(plan))
        assert len(made) == 1 and all(g is got[0] for g in got)
        assert lay.stage_maps(plan) is got[0] and not lay._building
    finally:
        rlayout.clear_r_layout_cache(an)


def test_stage_maps_after_a_failed_make(monkeypatch):
    """A make that fails raises in its caller and in a caller waiting for it; the next
    call makes the maps again."""
    an = analyze(grid3d_least_squares(5), cache=False)
    rlayout.clear_r_layout_cache(an)
    lay = rlayout.r_layout(an)
    real = rlayout.RLayout._make_stage_maps
    calls, gate, waiting = [], threading.Event(), threading.Event()

    def fail_once(self, key):
        calls.append(key)
        if len(calls) == 1:
            gate.wait(5)
            raise MemoryError("no room for the maps")
        return real(self, key)

    class SeenFuture(rlayout.Future):
        def result(self, timeout=None):
            waiting.set()
            return super().result(timeout)
    monkeypatch.setattr(rlayout.RLayout, "_make_stage_maps", fail_once)
    monkeypatch.setattr(rlayout, "Future", SeenFuture)
    try:
        plan = _two_stage_plan(an)
        with ThreadPoolExecutor(2) as ex:
            first = ex.submit(lay.stage_maps, plan)
            while not calls:
                time.sleep(0.001)
            waiter = ex.submit(lay.stage_maps, plan)       # finds the maps being made
            assert waiting.wait(5)
            gate.set()
            with pytest.raises(MemoryError):
                first.result(5)
            with pytest.raises(MemoryError):
                waiter.result(5)
        assert not lay._building and len(calls) == 1
        maps = lay.stage_maps(plan)                         # made again, and kept
        assert len(calls) == 2 and len(maps) == 2 and lay.stage_maps(plan) is maps
    finally:
        gate.set()
        rlayout.clear_r_layout_cache(an)
