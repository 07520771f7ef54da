"""Every OpenBLAS of the process on one thread around small rank decisions
(:func:`scipy_gpuqr._cpu.blas_threads.process_limited`), results unchanged."""

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr._cpu import blas_threads
from _blas_pools import pools_at, real_pools
from scipy_gpuqr._factor import lstsq as lstsq_mod
from scipy_gpuqr._factor.lstsq import MinNormSolver


@pytest.fixture
def two_threads():
    """Every real pool at two threads for the test (restored after it)."""
    with pools_at(2) as pools:
        yield pools


def test_memory_map_paths_are_found(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /opt/x/numpy.libs/libscipy_openblas64_-ab.so\n"
        "7f01-7f02 r-xp 00000000 08:01 2 /usr/lib/libOpenBLAS.so.0\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/libOpenBLAS.so.0\n"
        "7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/libm.so.6\n"
        "7f04-7f05 rw-p 00000000 00:00 0\n")
    assert blas_threads._loaded_openblas_paths(str(maps)) == [
        "/opt/x/numpy.libs/libscipy_openblas64_-ab.so", "/usr/lib/libOpenBLAS.so.0"]
    assert blas_threads._loaded_openblas_paths(str(tmp_path / "absent")) == []


def test_numpys_pool_is_reached():
    pools = real_pools()
    # NumPy's own OpenBLAS (its wheel's copy, or the system's) is among them
    assert len(pools) >= 1
    assert all(int(get()) >= 1 for get, _ in pools)


def test_process_limited_lowers_lifts_and_restores(two_threads):
    pools = two_threads
    with blas_threads.process_limited(1) as lowered:
        assert [int(get()) for get, _ in pools] == [1] * len(pools)
        with lowered.lifted():
            assert [int(get()) for get, _ in pools] == [2] * len(pools)
        assert [int(get()) for get, _ in pools] == [1] * len(pools)
    assert [int(get()) for get, _ in pools] == [2] * len(pools)
    with pytest.raises(RuntimeError):
        with blas_threads.process_limited(1):
            raise RuntimeError("the body fails")
    assert [int(get()) for get, _ in pools] == [2] * len(pools)
    with blas_threads.process_limited(None):          # no request: untouched
        assert [int(get()) for get, _ in pools] == [2] * len(pools)


def _deficient(n, rank, seed, gap=True):
    """Square A of the given numerical rank: the dropped singular values
    exactly tiny (gap) or a decade or two below lstsq's cutoff."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.logspace(0, -6, n)
    s[rank:] = 1e-18 if gap else np.logspace(-15, -16, n - rank)
    A = (U * s) @ V.T
    return A


def _watch_svd(monkeypatch, pools) -> list:
    """The pools' counts at each of the rank decision's dense SVDs, as they happen."""
    seen = []
    svd = la.svd

    def watched_svd(*args, **kwargs):
        seen.append([int(get()) for get, _ in pools])
        return svd(*args, **kwargs)
    monkeypatch.setattr(lstsq_mod.la, "svd", watched_svd)
    return seen


@pytest.mark.parametrize("gap", [True, False])
def test_small_decision_on_one_thread_matches_lstsq(two_threads, monkeypatch, gap):
    pools = two_threads
    n, rank = 120, 100
    A = _deficient(n, rank, 7, gap=gap)
    R = sp.csc_array(np.triu(la.qr(A, mode="r")[0]))
    seen = _watch_svd(monkeypatch, pools)
    cutoff = lstsq_mod.EPS * n
    solver = MinNormSolver(R, cutoff)
    assert seen and all(c == [1] * len(pools) for c in seen)   # decided on one thread
    assert [int(get()) for get, _ in pools] == [2] * len(pools)
    Rd = R.toarray()
    b = np.random.default_rng(3).standard_normal(n)
    x_ref, _, rank_ref, _ = np.linalg.lstsq(Rd, b, rcond=None)
    assert solver.rank == rank_ref
    x = solver.solve(b).ravel()
    assert np.linalg.norm(x - x_ref) <= 1e-6 * np.linalg.norm(x_ref)
    # the same decision with the pools' own counts: the same answer, bit for bit
    monkeypatch.setattr(lstsq_mod, "SINGLE_THREAD_ORDER", 0)
    seen.clear()
    other = MinNormSolver(R, cutoff)
    assert seen and all(c == [2] * len(pools) for c in seen)
    assert other.rank == solver.rank


def test_large_svd_lifted_inside_a_one_thread_decision(two_threads, monkeypatch):
    pools = two_threads
    n = 60
    A = _deficient(n, 50, 11)
    R = sp.csc_array(np.triu(la.qr(A, mode="r")[0]))
    seen = _watch_svd(monkeypatch, pools)
    monkeypatch.setattr(lstsq_mod, "SVD_THREADED_FLOPS", 1.0)
    solver = MinNormSolver(R, lstsq_mod.EPS * n)
    assert seen and all(c == [2] * len(pools) for c in seen)
    assert solver.rank == np.linalg.matrix_rank(R.toarray(), tol=lstsq_mod.EPS * n * la.norm(R.toarray(), 2))


def test_lsqr_cpu_restores_the_pools_and_matches_lstsq(two_threads):
    import scipy_gpuqr
    pools = two_threads
    n = 150
    A = sp.csc_array(_deficient(n, 130, 5))
    b = np.random.default_rng(1).standard_normal(n)
    x = scipy_gpuqr.lsqr(A, b, backend="cpu")[0]
    assert [int(get()) for get, _ in pools] == [2] * len(pools)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-6 * np.linalg.norm(x_ref)


def test_pools_found_again_only_after_a_library_loads(monkeypatch):
    """openblas_pools reads the memory map once per set of loaded objects: the
    same pools as a fresh search, no read while nothing loads, a new search once
    the load counters move."""
    pools = real_pools()
    assert [(g.__name__, s.__name__) for g, s in pools] == \
        [(g.__name__, s.__name__) for g, s in blas_threads.find_openblas_pools()]
    if blas_threads.objects_loaded() is None:
        pytest.skip("the C library gives no load counters")
    reads = []
    real = blas_threads._loaded_openblas_paths
    monkeypatch.setattr(blas_threads, "_loaded_openblas_paths",
                        lambda *a: reads.append(1) or real(*a))
    blas_threads.openblas_pools()
    assert reads == []
    adds, subs = blas_threads.objects_loaded()
    monkeypatch.setattr(blas_threads, "objects_loaded", lambda: (adds + 1, subs))
    assert len(blas_threads.openblas_pools()) == len(pools) and reads == [1]


def test_load_counters_move_when_a_library_loads():
    """The counters objects_loaded reads grow when an extension module's library
    is loaded (in a new process, where it is not yet)."""
    import subprocess
    import sys
    code = ("from scipy_gpuqr._cpu.blas_threads import objects_loaded as o\n"
            "a = o()\nimport _sqlite3\nb = o()\n"
            "print('none' if a is None else int(b[0] > a[0] and b[1] == a[1]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "none":
        pytest.skip("the C library gives no load counters")
    assert out.stdout.strip() == "1"
