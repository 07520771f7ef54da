"""backend='simulate': the sparse scheduler's task lists, run by the NumPy executor,
reproduce the reference multifrontal QR (R up to row signs, Qᵀb, solutions)."""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.host.reference import reference_factorize
from scipy_gpuqr._engine.host.simulate import launch_conflicts, simulate_factorize
from scipy_gpuqr._schedule.sparse import build_schedule, schedule_stats
from scipy_gpuqr._schedule.tasks import TaskType
from scipy_gpuqr._symbolic import analyze

EPS = np.finfo(float).eps


def _families():
    rng = np.random.default_rng(5)
    out = []
    A = sp.random(300, 120, density=0.03, random_state=1, format="csc") + sp.eye(300, 120)
    out.append(("random_ls", sp.csc_array(A)))
    A = sp.random(90, 200, density=0.05, random_state=2, format="csc") + sp.eye(90, 200)
    out.append(("random_wide", sp.csc_array(A)))
    k = 6                                              # 2-D grid Laplacian stacked on 0.1 I
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    L = sp.kronsum(T, T)
    out.append(("grid", sp.csc_array(sp.vstack([L, 0.1 * sp.eye(k * k)]))))
    dense = rng.standard_normal((70, 45))
    out.append(("dense", sp.csc_array(dense)))
    out.append(("single_row", sp.csc_array(rng.standard_normal((1, 7)))))
    out.append(("single_col", sp.csc_array(rng.standard_normal((9, 1)))))
    return out


def _check_against_reference(A, s, r):
    m, n = A.shape
    k = min(m, n)
    normA = max(sp.linalg.norm(A), 1.0)
    tol = 100 * max(m, n) * EPS * normA
    Rs, Rr = s.R.toarray(), r.R.toarray()
    assert Rs.shape == Rr.shape == (k, n)
    assert np.array_equal(s.colperm, r.colperm)
    # row signs from each row's largest entry (rows of R are keyed by their pivot
    # column, so the diagonal of a wide R is not the pivot entry)
    big = np.argmax(np.abs(Rr), axis=1)
    sg = np.sign(Rs[np.arange(k), big]) * np.sign(Rr[np.arange(k), big])
    sg[sg == 0] = 1
    sv = np.linalg.svd(Rr, compute_uv=False)
    if m >= n and sv[-1] > 1e-8 * sv[0]:
        assert np.abs(Rs - sg[:, None] * Rr).max() <= tol
    else:   # R is unique only up to the numerical rank: compare RᵀR
        assert np.abs(Rs.T @ Rs - Rr.T @ Rr).max() <= tol * normA
    b = np.random.default_rng(3).standard_normal((m, 2))
    qs, qr = s.qt_matmul(b), r.qt_matmul(b)
    if m >= n and sv[-1] > 1e-8 * sv[0]:
        assert np.abs(qs[:k] - sg[:, None] * qr[:k]).max() <= tol * np.abs(b).max()
    assert np.allclose(np.linalg.norm(qs, axis=0), np.linalg.norm(b, axis=0))
    assert np.abs(s.q_matmul(qs) - b).max() <= tol * np.abs(b).max()
    # A[:, colperm] = Q R
    X = np.random.default_rng(4).standard_normal((n, 3))
    QR = s.q_matmul(np.vstack([Rs @ X, np.zeros((m - k, 3))]))
    assert np.abs(A.toarray()[:, s.colperm] @ X - QR).max() <= tol * np.abs(X).max()
    if m >= n:   # full column rank families: same least-squares solution
        xs = np.linalg.solve(np.triu(Rs[:n]), qs[:n])
        xr = np.linalg.solve(np.triu(Rr[:n]), qr[:n])
        assert np.allclose(xs, xr, rtol=1e-9, atol=1e-9 * np.abs(xr).max())


@pytest.mark.parametrize("name,A", _families(), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("pipelining", [True, False])
def test_families_match_reference(name, A, pipelining):
    an = analyze(A)
    r = reference_factorize(A, an)
    s = simulate_factorize(A, an, pipelining=pipelining)
    assert s.info["backend"] == "simulate"
    _check_against_reference(A, s, r)


@pytest.mark.parametrize("name,A", _families()[:3], ids=lambda x: x if isinstance(x, str) else "")
def test_many_stages_launch_limit_and_shuffled_launches(name, A):
    an = analyze(A)
    r = reference_factorize(A, an)
    s = simulate_factorize(A, an, max_gpu_memory=1, max_tasks=7,
                           rng=np.random.default_rng(11))
    assert s.info["stages"] > 1
    _check_against_reference(A, s, r)


def test_tiles_and_bundles(rng):
    A = sp.csc_array(sp.random(260, 150, density=0.04, random_state=7) + sp.eye(260, 150))
    an = analyze(A)
    r = reference_factorize(A, an)
    for tile, bundle in [(8, 2), (16, 4), (64, 3)]:
        s = simulate_factorize(A, an, tile=tile, bundle=bundle)
        _check_against_reference(A, s, r)


def _grid3d(k):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(k, k))
    L = sp.kronsum(sp.kronsum(T, T), T)
    return sp.csc_array(sp.vstack([L, 0.1 * sp.eye(k ** 3)]))


def test_launches_independent_and_ordered():
    an = analyze(_grid3d(6))
    for pip in (True, False):
        s = build_schedule(an, pipelining=pip, max_tasks=50)
        for st in s.stages:
            t = st.tasks
            launch = np.repeat(np.arange(st.nlaunch), np.diff(st.launch_ptr))
            assert launch_conflicts(t, launch, s.tile) == []
            sizes = np.diff(st.launch_ptr)
            # the limit is honoured except by a single front step larger than it
            fac_launch = {}
            for L, typ, f in zip(launch, t["type"], t["front"]):
                if typ in (TaskType.FACTORIZE, TaskType.APPLY, TaskType.APPLY_FACTORIZE):
                    fac_launch.setdefault(int(f), []).append(int(L))
            for L, typ, f in zip(launch, t["type"], t["front"]):
                if typ == TaskType.PACK_ASSEMBLE:
                    # the child is done before, the parent starts after
                    assert max(fac_launch.get(int(f), [-1])) < L
                    p = int(an.fronts.parent[int(f)])
                    assert min(fac_launch.get(p, [10**9])) > L
            assert sizes.max() <= 50 or sizes.max() == max(
                np.bincount(t["front"][launch == np.argmax(sizes)]))


def test_pipelining_fewer_launches_on_large_sparse_problem():
    an = analyze(_grid3d(12))
    st = schedule_stats(an, pipelining=True)
    assert st["launches"] < st["launches_no_pipeline"]
    for key in ("launches", "launches_no_pipeline", "tasks", "tasks_by_type",
                "tiles_touched_fraction", "critical_path", "build_seconds"):
        assert key in st
    assert st["tasks"] == sum(st["tasks_by_type"].values())
    assert 0 < st["tiles_touched_fraction"]["mean"] <= 1


def test_deterministic():
    an = analyze(_grid3d(7))
    a = build_schedule(an, max_gpu_memory=200_000)
    from scipy_gpuqr._schedule import bucket
    bucket.clear_cache()
    b = build_schedule(an, max_gpu_memory=200_000)
    assert len(a.stages) == len(b.stages) > 1
    for x, y in zip(a.stages, b.stages):
        assert x.tasks.tobytes() == y.tasks.tobytes()
        assert np.array_equal(x.launch_ptr, y.launch_ptr)


def test_rank_detection_is_delegated_and_said():
    A = sp.csc_array(sp.random(40, 30, density=0.2, random_state=3) + sp.eye(40, 30))
    s = simulate_factorize(A, tol="default")
    assert "fallback" in s.info


def _shared(matrices_dir):
    from conftest import real_shared_matrices
    return real_shared_matrices(matrices_dir)


@pytest.mark.slow
def test_shared_matrices_match_reference(matrices_dir):
    checked = []
    for name, A in _shared(matrices_dir):
        an = analyze(A)
        if an.flops > 3e7 or max(A.shape) > 3000:
            continue
        s = simulate_factorize(A, an, max_gpu_memory=1 if len(checked) % 2 else None)
        r = reference_factorize(A, an)
        m, n = A.shape
        k = min(m, n)
        normA = max(sp.linalg.norm(A), 1.0)
        tol = 200 * max(m, n) * EPS * normA
        Rs, Rr = s.R.toarray(), r.R.toarray()
        # Gram matrices agree (R is unique up to row signs only where A has full rank)
        assert np.abs(Rs.T @ Rs - Rr.T @ Rr).max() <= tol * normA, name
        X = np.random.default_rng(4).standard_normal((n, 2))
        QR = s.q_matmul(np.vstack([Rs @ X, np.zeros((m - k, 2))]))
        assert np.abs(A.toarray()[:, s.colperm] @ X - QR).max() <= tol * np.abs(X).max(), name
        checked.append(name)
    assert len(checked) >= 5, checked


def test_lazy_launches_equal_materialized_stage():
    an = analyze(_grid3d(7))
    full = build_schedule(an, max_gpu_memory=200_000, max_tasks=40, cache=False)
    lazy = build_schedule(an, max_gpu_memory=200_000, max_tasks=40, cache=False, lazy=True)
    assert len(full.stages) > 1
    assert not any(st.materialized for st in lazy.stages)
    got = list(lazy.iter_launches(prefetch=True))
    assert len(got) == full.nlaunch == lazy.nlaunch
    for i, L, recs in got:
        st = full.stages[i]
        assert recs.tobytes() == st.tasks[st.launch_ptr[L]:st.launch_ptr[L + 1]].tobytes()
    # a range of launches at once (factorization and assembly records interleaved)
    for a, b in zip(full.stages, lazy.stages):
        assert b._maker.records(1, b.nlaunch).tobytes() == a.tasks[a.launch_ptr[1]:].tobytes()


def test_launches_left_suspended_close_without_joining_a_thread(monkeypatch):
    """The engine takes exactly the launches it needs, so ``iter_launches`` stays
    suspended with its record builder alive and is closed later, possibly by the
    garbage collector inside threading's own locked sections (a GPU test run
    deadlocked there). Closing must not join a thread; the builder's thread ends
    on its own."""
    import threading

    an = analyze(_grid3d(7))
    lazy = build_schedule(an, max_gpu_memory=200_000, max_tasks=40, cache=False, lazy=True)
    for taken in (1, lazy.nlaunch):
        it = lazy.iter_launches(prefetch=True)
        for _ in range(taken):
            next(it)

        def no_join(*args, **kwargs):
            raise AssertionError("a thread was joined while the launches were closed")
        with monkeypatch.context() as m:
            m.setattr(threading.Thread, "join", no_join)
            it.close()
    for t in threading.enumerate():
        if t.name.startswith("gpuqr-launch-records"):
            t.join(timeout=10)
            assert not t.is_alive()


def test_schedule_cached_per_pattern():
    an = analyze(_grid3d(5))
    a = build_schedule(an, tile=16)
    assert build_schedule(an, tile=16) is a
    assert build_schedule(an, tile=16, pipelining=False) is not a
    b = build_schedule(an, tile=16, cache=False)
    assert b is not a and b.stages[0].tasks.tobytes() == a.stages[0].tasks.tobytes()
    an2 = analyze(_grid3d(5))        # a new analysis of the same pattern shares it
    assert an2 is not an and build_schedule(an2, tile=16) is a
    an3 = analyze(_grid3d(5), cache=False)      # no pattern key: its own schedule
    assert build_schedule(an3, tile=16) is not a


@pytest.mark.parametrize("name,A", _families() + [("grid3d_6", None)],
                         ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("kw", [{}, {"max_gpu_memory": 200_000}, {"max_tasks": 25}],
                         ids=["one_stage", "stages", "limit"])
def test_lazy_per_launch_equals_eager_on_families(name, A, kw):
    """Records built launch by launch (cold, nothing materialized) are byte-for-byte
    the eagerly built stage, on every family, with stages and a launch limit."""
    from scipy_gpuqr._schedule import bucket
    an = analyze(_grid3d(6) if A is None else A)
    bucket.clear_cache()
    lazy = build_schedule(an, cache=False, lazy=True, **kw)
    bucket.clear_cache()
    eager = build_schedule(an, cache=False, **kw)
    assert lazy.nlaunch == eager.nlaunch and lazy.vt_size == eager.vt_size
    assert np.array_equal(lazy.vt_base, eager.vt_base)
    n = 0
    for i, L, recs in lazy.iter_launches(prefetch=True):
        st = eager.stages[i]
        assert recs.tobytes() == st.tasks[st.launch_ptr[L]:st.launch_ptr[L + 1]].tobytes()
        n += 1
    assert n == eager.nlaunch


def test_info_counts_launches_with_tasks_apart():
    # a dense front's deferral launches are empty: "launches" keeps counting them
    # (the global launch numbering), "launches_with_tasks" does not
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    A = grid3d_least_squares(6)
    an = analyze(A)
    s = simulate_factorize(A, an, dense_flops=1e5)
    sched = build_schedule(an, dense_flops=1e5)
    assert s.info["dense_fronts"] > 0
    nonempty = sum(int(np.count_nonzero(np.diff(st.launch_ptr))) for st in sched.stages)
    assert s.info["launches"] == sched.nlaunch
    assert s.info["launches_with_tasks"] == nonempty < s.info["launches"]
    st = schedule_stats(an)
    assert st["launches_with_tasks"] == st["launches"]        # no dense front there
