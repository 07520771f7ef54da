"""One record of the process' lowered OpenBLAS counts
(:mod:`scipy_gpuqr._cpu.blas_threads`): bodies that overlap, in one thread or
several, never restore a count another body lowered, nor leave a pool lowered;
:func:`~scipy_gpuqr._cpu.blas_threads.held_counts` keeps every count as set."""

import ctypes
import os
import threading
import time

import numpy as np
import pytest

from scipy_gpuqr._cpu import blas_threads
from _blas_pools import FakeOpenBlas, pools_at


def test_a_body_ending_first_leaves_the_later_ones_lowered():
    p = FakeOpenBlas(8)
    a = blas_threads.process_limited(1, [p.pool])
    b = blas_threads.process_limited(1, [p.pool])
    a.__enter__()
    b.__enter__()                       # another thread's body, begun while a's runs
    a.__exit__(None, None, None)        # a ends first: b still runs its small calls
    assert p.n == 1
    b.__exit__(None, None, None)
    assert p.n == 8 and p.calls == [1, 8]


def test_bodies_of_two_limits_restore_the_first_count():
    p = FakeOpenBlas(8)
    two = blas_threads.process_limited(2, [p.pool])
    one = blas_threads.process_limited(1, [p.pool])
    two.__enter__()
    one.__enter__()
    assert p.n == 1                     # the lowest limit of the bodies running
    two.__exit__(None, None, None)
    assert p.n == 1                     # one's body runs on at its own limit
    one.__exit__(None, None, None)
    assert p.n == 8                     # not 2: that was a lowered count, not the pool's own
    assert p.calls == [2, 1, 8]


def test_a_lift_gives_the_earlier_count_for_its_length_only():
    p = FakeOpenBlas(8)
    with blas_threads.process_limited(1, [p.pool]) as low:
        with blas_threads.process_limited(1, [p.pool]):
            with low.lifted():
                assert p.n == 8
            assert p.n == 1
        assert p.n == 1
    assert p.n == 8 and p.calls == [1, 8, 1, 8]


def test_held_counts_keeps_the_pools_as_set():
    p = FakeOpenBlas(8)
    with blas_threads.process_limited(1, [p.pool]):
        assert p.n == 1
        with blas_threads.held_counts():        # a multi-device call begins
            assert p.n == 8
            with blas_threads.process_limited(1, [p.pool]):
                assert p.n == 8                 # no lowering while it runs
            with blas_threads.held_counts():
                pass
            assert p.n == 8
        assert p.n == 1                         # the body still running is lowered again
    assert p.n == 8 and p.calls == [1, 8, 1, 8]


def test_one_pool_through_two_handles_is_lowered_once_and_limited_shares_the_record():
    p = FakeOpenBlas(8)
    twice = [p.pool, (p.openblas_get_num_threads, p.openblas_set_num_threads)]
    with blas_threads.process_limited(1, twice):
        assert p.n == 1
        with blas_threads.limited(p, 1):        # SuiteSparseQR's call, same pool
            assert p.n == 1
        assert p.n == 1                         # limited restores no count it did not lower
    assert p.n == 8 and p.calls == [1, 8]
    with blas_threads.limited(p, 2):
        lim = blas_threads.process_limited(1, [p.pool])
        lim.__enter__()
    assert p.n == 1                             # limited ended first: the body stays lowered
    lim.__exit__(None, None, None)
    assert p.n == 8


def test_a_failing_body_restores_and_leaves_no_record():
    p = FakeOpenBlas(8)
    with pytest.raises(RuntimeError):
        with blas_threads.process_limited(1, [p.pool]):
            raise RuntimeError("the body fails")
    assert p.n == 8
    with pytest.raises(RuntimeError):
        with blas_threads.held_counts():
            raise RuntimeError("the body fails")
    p.n = 6                                     # set by someone else meanwhile
    with blas_threads.process_limited(1, [p.pool]):
        assert p.n == 1                         # no hold left over
    assert p.n == 6                             # the count saved now, not the earlier one


@pytest.fixture
def four_threads():
    """Every real pool at four threads for the test (restored after it)."""
    with pools_at(4) as pools:
        yield pools


def _pthreads_local_setters():
    """``(get, set_local)`` of each OpenBLAS loaded that is a pthreads build with
    ``openblas_set_num_threads_local``."""
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)
    found = []
    for path in blas_threads._loaded_openblas_paths():
        lib = ctypes.CDLL(path, mode=mode)
        local = getattr(lib, "openblas_set_num_threads_local", None)
        parallel = next((getattr(lib, n) for n in (
            "scipy_openblas_get_parallel64_", "scipy_openblas_get_parallel",
            "openblas_get_parallel") if hasattr(lib, n)), None)
        get = next((getattr(lib, g) for g, _ in blas_threads._SYMBOLS if hasattr(lib, g)), None)
        if local is None or parallel is None or get is None or parallel() != 1:  # 1: pthreads
            continue
        local.restype, local.argtypes = ctypes.c_int, [ctypes.c_int]
        get.restype, get.argtypes = ctypes.c_int, []
        found.append((get, local))
    return found


def test_set_num_threads_local_is_process_wide(four_threads):
    """What the module's docstring says of OpenBLAS's ``_local`` setter in its
    pthreads builds (so it is not used): it returns the earlier count, and the
    count it sets in one thread is the one another thread reads."""
    setters = _pthreads_local_setters()
    if not setters:
        pytest.skip("no pthreads OpenBLAS with openblas_set_num_threads_local loaded")
    for get, local in setters:
        returned = []
        t = threading.Thread(target=lambda: returned.append(local(1)))
        t.start()
        t.join()
        seen = int(get())               # read in this thread, after the other's call
        local(4)
        assert returned == [4]
        assert seen == 1


def test_concurrent_bodies_stay_lowered_and_restore(four_threads):
    """Four threads entering bodies of limits 1 and 2 over and over: inside each,
    every pool is at most its limit (another thread's body ending does not raise
    it), and every pool is back at four after them."""
    pools = four_threads
    S = np.ones((40, 40))
    bad, errors = [], []
    start = threading.Barrier(4)

    def bodies(limit):
        try:
            start.wait()
            for _ in range(300):
                with blas_threads.process_limited(limit, pools):
                    time.sleep(1e-4)    # let the other threads' bodies begin and end
                    S @ S
                    counts = [int(get()) for get, _ in pools]
                    if max(counts) > limit:
                        bad.append((limit, counts))
        except Exception as exc:           # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=bodies, args=(1 + i % 2,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert not bad, bad[:3]
    assert [int(get()) for get, _ in pools] == [4] * len(pools)


def test_held_counts_in_one_thread_keeps_another_threads_body_from_lowering(four_threads):
    pools = four_threads
    held, done = threading.Event(), threading.Event()

    def device_call():
        with blas_threads.held_counts():
            held.set()
            done.wait(30)

    t = threading.Thread(target=device_call)
    t.start()
    try:
        assert held.wait(30)
        with blas_threads.process_limited(1, pools):
            assert [int(get()) for get, _ in pools] == [4] * len(pools)
            done.set()
            t.join(30)
            assert [int(get()) for get, _ in pools] == [1] * len(pools)  # lowered once it ends
    finally:
        done.set()
        t.join(30)
    assert [int(get()) for get, _ in pools] == [4] * len(pools)


def test_one_blas_thread_goes_through_the_record(four_threads):
    """The executors' and the rank decision's one-thread bodies (one_blas_thread,
    blas_limited) lower every real pool through the record: a hold keeps them,
    a lift inside gives the earlier count back, the end restores it."""
    pools = four_threads
    with blas_threads.one_blas_thread() as lowered:
        assert [int(get()) for get, _ in pools] == [1] * len(pools)
        with lowered.lifted():
            assert [int(get()) for get, _ in pools] == [4] * len(pools)
        assert [int(get()) for get, _ in pools] == [1] * len(pools)
    assert [int(get()) for get, _ in pools] == [4] * len(pools)
    with blas_threads.held_counts():
        with blas_threads.blas_limited(1):
            assert [int(get()) for get, _ in pools] == [4] * len(pools)
    with blas_threads.blas_limited(None):
        assert [int(get()) for get, _ in pools] == [4] * len(pools)


def test_reference_engine_lifts_its_large_fronts(four_threads, monkeypatch):
    """The reference engine's fronts above THREADED_FRONT_FLOPS run at the pools'
    own count inside its one-thread body, the others at one; same R either way."""
    import scipy.sparse as sp

    from scipy_gpuqr._engine.host import reference
    pools = four_threads
    seen = []
    real = reference._factor_front

    def spy(*a, **k):
        seen.append(max(int(get()) for get, _ in pools))
        return real(*a, **k)

    monkeypatch.setattr(reference, "_factor_front", spy)
    A = sp.random(60, 30, density=0.2, random_state=np.random.default_rng(3), format="csc")
    A = A + sp.eye(60, 30, format="csc")
    one = reference.reference_factorize(A).R.toarray()
    assert seen and set(seen) == {1}
    seen.clear()
    monkeypatch.setattr(reference, "THREADED_FRONT_FLOPS", -1.0)
    lifted = reference.reference_factorize(A).R.toarray()
    assert set(seen) == {4}
    np.testing.assert_allclose(lifted, one, rtol=1e-12, atol=1e-12)
