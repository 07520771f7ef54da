"""R's layout is made once per pattern also when threads ask for it at once.

Two threads asking for the layout of one pattern at the same time (user threads
factorizing one pattern, or a call and the load started ahead of it) each made
their own before, and the one kept last replaced the other, with the gather maps
made on it (:meth:`~scipy_gpuqr._engine.gpu.rlayout.RLayout.stage_maps`).
``PerPattern.get_or_make`` makes one and hands it to both.
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
