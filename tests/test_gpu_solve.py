"""Q, Qᵀ and the solve on the device for GPU factorizations (scipy_gpuqr._engine.gpu.solve).

CPU tests run the replay plan (records normalized from the factorization's
Factorize / Apply+Factorize records, levels = launches, stage pools, dense
fronts) with the NumPy executor, which does the kernel's arithmetic, and
compare it with the host replay front by front. GPU tests (marker ``gpu``)
compare ``kernels/gpuqr_applyq.cu`` with the host replay on fresh random
data (VT pool poisoned with NaN by the debug factorization, so an entry read
that the factorization never wrote shows up), check orthogonality, and solve
least-squares and square systems against ``numpy.linalg.lstsq`` by backward
error, CuPy in → CuPy out with no host copy of b or x, many right-hand sides,
forced multi-stage factorizations, wide A and float32.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._schedule.tasks import TaskType, empty_tasks
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, engine_families,
                                           grid3d_least_squares, random_least_squares,
                                           random_values)

EPS = np.finfo(np.float64).eps


def _numpy_executor(g):
    plan = gs.plan_of(g)

    def pools(sid):
        pool = g._stage_pools.get(sid)
        return pool if pool is not None else g._host_pools[sid]
    return gs.NumpyExecutor(plan, pools, g._device.vt)


# ---------------------------------------------------------------- CPU: the plan

@pytest.mark.parametrize("budget", [None, 20000])
def test_plan_replay_matches_host_replay(budget):
    rng = np.random.default_rng()
    for name, A in engine_families(rng):
        g = gpu_factorize(A, analyze(A), device=NumpyDevice(32, 3), max_gpu_memory=budget)
        plan = gs.plan_of(g)
        gs.check_levels(plan)
        assert plan.nlevels <= g.info["launches"], name
        assert len(plan.records) == sum(len(t) for _, _, t in g._fronts), name
        assert np.all(np.diff(plan.level_stage) >= 0), name
        ex = _numpy_executor(g)
        B = rng.standard_normal((A.shape[0], 3))
        for trans in (True, False):
            got = gs.apply_plan(g, B, trans, ex)
            ref = gs.host_matmul(g, B, trans=trans)
            assert np.abs(got - ref).max() <= 50 * EPS * np.abs(B).max() * A.shape[0], name
        g.free()


def test_reflector_records_stack_the_top_tile_first():
    t = empty_tasks(2)
    t["type"] = [TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE]
    t["fm"], t["fn"] = 200, 90
    t["col"], t["nref"], t["vt"] = [32, 0], [20, 0], [1024, 0]
    t["c0"], t["aux"], t["vt2"] = [0, 64], [0, 26], [0, 2048]
    t["rows"][0, :3] = [96, 32, 64]
    t["fstart"][0], t["nfrows"][0], t["ftop"][0] = 0, 3, 1
    t["rows"][1, :4] = [0, 96, 128, 160]
    t["fstart"][1], t["nfrows"][1], t["ftop"][1] = 1, 3, 2
    r = gs.reflector_records(t, np.array([7, 9]), np.array([0, 200]))
    assert list(r["type"]) == [TaskType.APPLY_QT] * 2
    assert list(r["rows"][0, :4]) == [32, 96, 64, -1] and r["napply"][0] == 3
    assert list(r["rows"][1, :4]) == [128, 96, 160, -1] and r["napply"][1] == 3
    assert list(r["col"]) == [32, 64] and list(r["nref"]) == [20, 26]
    assert list(r["vt"]) == [1024, 2048] and list(r["F"]) == [7, 9]
    assert list(r["aux"]) == [0, 200]


def test_reflector_records_reject_a_top_tile_outside_its_rows():
    t = empty_tasks(1)
    t["type"] = TaskType.FACTORIZE
    t["rows"][0, :2] = [0, 32]
    t["fstart"], t["nfrows"], t["ftop"] = 0, 1, 1
    with pytest.raises(ValueError, match="top tile"):
        gs.reflector_records(t, 0, 0)


def test_check_levels_catches_shared_rows():
    A = grid3d_least_squares(5)
    g = gpu_factorize(A, analyze(A), device=NumpyDevice(32, 3))
    plan = gs.plan_of(g)
    gs.check_levels(plan)
    lv = int(np.argmax(np.diff(plan.level_ptr)))
    a = int(plan.level_ptr[lv])
    assert plan.level_ptr[lv + 1] - a >= 2
    plan.records[a + 1] = plan.records[a]           # two records on the same rows
    with pytest.raises(ValueError, match="share global rows"):
        gs.check_levels(plan)


class _FakeDense:
    """An orthogonal transform of some rows standing for a dense front."""

    def __init__(self, slots, after_launch, rng):
        self.slots = np.asarray(slots)
        self.after_launch = after_launch
        self.G = np.linalg.qr(rng.standard_normal((len(slots), len(slots))))[0]
        self.calls = 0
        self.shape = (len(slots), -1)

    def set_front(self, F):             # the engine hands over the host copy of V
        pass

    def host(self):
        pass

    def apply_qt(self, Y):
        Y[...] = self.G.T @ Y
        self.calls += 1

    def apply_q(self, Y):
        Y[...] = self.G @ Y
        self.calls += 1


def test_dense_fronts_take_part_in_both_replays():
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(5), rng)
    g = gpu_factorize(A, analyze(A), device=NumpyDevice(32, 3))
    root = len(g._fronts) - 1
    slots, Ff, _ = g._fronts[root]
    g._fronts[root] = (slots, Ff, g._fronts[root][2][:0])   # the root becomes "dense"
    g._front_launch[root] = g._front_launch[root][:0]
    d = _FakeDense(slots, g.info["launches"] - 1, rng)
    g._dense = {root: d}
    plan = gs.plan_of(g)
    assert sum(len(v) for v in plan.level_dense.values()) == 1
    ex = _numpy_executor(g)
    B = rng.standard_normal((A.shape[0], 2))
    for trans in (True, False):
        got = gs.apply_plan(g, B, trans, ex)
        ref = gs.host_matmul(g, B, trans=trans)
        np.testing.assert_allclose(got, ref, atol=1e-12 * np.abs(B).max() * A.shape[0])
    assert d.calls == 4
    # an orthogonal Q still: Qᵀ Q = I
    Y = gs.apply_plan(g, gs.apply_plan(g, B, False, ex), True, ex)
    np.testing.assert_allclose(Y, B, atol=1e-12 * A.shape[0])


def _singletons_full_rank(rng):
    """60 column singletons (rows of R taken from A) above a full-rank random block."""
    D = sp.diags(rng.uniform(1, 2, 60))
    B = sp.random(60, 60, density=0.05, random_state=int(rng.integers(1 << 30)))
    C = sp.random(240, 60, density=0.1, random_state=int(rng.integers(1 << 30)))
    return sp.csc_array(sp.bmat([[D, B], [None, C + sp.eye(240, 60)]]))


@pytest.mark.parametrize("budget", [None, 20000])
def test_front_triangular_matches_sparse_solve(budget):
    from scipy.sparse.linalg import spsolve_triangular

    from scipy_gpuqr._engine.gpu.trsolve import FrontTriangular
    rng = np.random.default_rng()
    cases = [("grid5", random_values(grid3d_least_squares(5), rng)),
             ("randls", random_least_squares(400, 150, density=0.03, dense_rows=3,
                                             seed=int(rng.integers(1 << 30)))),
             ("singletons", _singletons_full_rank(rng))]
    for name, A in cases:
        an = analyze(A)
        g = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
        if name == "singletons":
            assert an.n1cols == 60
        ft = FrontTriangular(g, lambda sid: g._stage_pools.get(sid, g._host_pools.get(sid)), np)
        R = sp.csr_array(g.R)
        C = rng.standard_normal((R.shape[1], 3))
        C0 = C.copy()
        y, z = ft.upper(C), ft.upper_transposed(C)
        np.testing.assert_array_equal(C, C0)
        yr = spsolve_triangular(R, C, lower=False)
        zr = spsolve_triangular(sp.csr_array(R.T), C, lower=True)
        assert np.abs(y - yr).max() <= 1e-10 * np.abs(yr).max(), name
        assert np.abs(z - zr).max() <= 1e-10 * np.abs(zr).max(), name
        g.free()


def _colmajor(X, ld, rows, cols):
    """The column-major rows × cols matrix with leading dimension ``ld`` at the start
    of X's memory (a view), as cuBLAS reads a device pointer."""
    mem = X.ravel(order="K")
    assert np.shares_memory(mem, X)
    return np.lib.stride_tricks.as_strided(mem, shape=(rows, cols),
                                           strides=(mem.itemsize, mem.itemsize * ld))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_device_step_reads_r_where_it_lies(monkeypatch, dtype):
    """:meth:`FrontTriangular._device_step` with its device operations done by NumPy
    on the memory they would read (cuBLAS ``trsm`` column-major with the leading
    dimension it is given): a float64 pool's rows of R are solved in place (read
    as Uᵀ, lower, leading dimension fn: no copy of U), a float32 pool's from a
    float64 column-major copy; front by front, both solves equal SciPy's."""
    from scipy.linalg import solve_triangular
    from scipy.sparse.linalg import spsolve_triangular

    from scipy_gpuqr._engine.gpu import trsolve as gt
    rng = np.random.default_rng(3)
    A = random_least_squares(400, 150, density=0.03, dense_rows=3, seed=11)
    an = analyze(A)
    g = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    copies = []

    def take_rows(src, idx, out=None, order="C"):
        return np.array(src[np.asarray(idx)], order=order)

    def put_rows(dst, idx, src, subtract=False):
        if subtract:
            dst[np.asarray(idx)] -= src
        else:
            dst[np.asarray(idx)] = src

    def subtract_into(dst, src):
        dst -= src

    def matmul_operand(a, dtype=None, *, left):
        return np.asarray(a, dtype=a.dtype if dtype is None else dtype)

    def contiguous_copy(a, dtype=None, order="C"):
        copies.append(a.shape)
        return np.array(a, dtype=a.dtype if dtype is None else dtype, order=order)

    def trsm_left(Am, lda, B, ldb, m, n, *, lower, trans, unit):
        assert Am.dtype == B.dtype == np.float64
        a, b = _colmajor(Am, lda, m, m), _colmajor(B, ldb, m, n)
        b[...] = solve_triangular(a.copy(), b.copy(), lower=lower, trans=1 if trans else 0,
                                  unit_diagonal=unit, check_finite=False)
    fake = types.SimpleNamespace(take_rows=take_rows, put_rows=put_rows,
                                 subtract_into=subtract_into, matmul_operand=matmul_operand,
                                 contiguous_copy=contiguous_copy, trsm_left=trsm_left)
    monkeypatch.setattr(gt, "ops", fake)

    def pools(sid):
        pool = g._stage_pools.get(sid, g._host_pools.get(sid))
        return np.asarray(pool, dtype=dtype)
    ft = gt.FrontTriangular(g, pools, np)
    assert not ft.n1
    R = sp.csr_array(g.R)
    n = R.shape[1]
    C = rng.standard_normal((n, 3))
    out = {}
    for trans in (False, True):
        Y = C.copy()
        order = range(len(ft.fronts)) if trans else range(len(ft.fronts) - 1, -1, -1)
        for i in order:
            ft._device_step(i, Y, pools(ft.fronts[i][0]), trans=trans, off=None)
        out[trans] = Y
    yr = spsolve_triangular(R, C, lower=False)
    zr = spsolve_triangular(sp.csr_array(R.T), C, lower=True)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    assert np.abs(out[False] - yr).max() <= tol * np.abs(yr).max()
    assert np.abs(out[True] - zr).max() <= tol * np.abs(zr).max()
    # U copied only from a float32 pool (one copy per front and solve, and S's)
    fronts_u = {(f[4], f[4]) for f in ft.fronts}
    assert (not any(c in fronts_u for c in copies)) == (dtype == np.float64)
    g.free()


def test_smem_mirror_matches_the_kernel_layout():
    from scipy_gpuqr._engine.gpu import solve_kernels as av
    # ApplyQSmem<32, 3>: V + T + X + C doubles
    ld, ldw = 33, 33
    assert av.applyq_smem_bytes(32, 3) == 8 * (3 * 32 * ld + 32 * ld + 3 * 32 * ldw + 32 * ldw)
    names = av.KERNEL_VARIANTS[av.APPLYQ_FILE]
    assert len(names) == 5 and av.applyq_name("float64", 32, 3, True) in names


# ---------------------------------------------------------------- GPU

def _cp():
    import cupy as cp
    return cp


def _factor_gpu(A, budget=None, debug=True):
    return gpu_factorize(A, analyze(A), max_gpu_memory=budget, debug=debug)


@pytest.mark.gpu
def test_applyq_kernel_smem_matches_mirror():
    cp = _cp()
    from scipy_gpuqr._engine.gpu import solve_kernels as av
    from scipy_gpuqr._kernels import load_module
    mod = load_module(av.APPLYQ_FILE, av.KERNEL_VARIANTS[av.APPLYQ_FILE])
    out = cp.zeros(1, dtype=cp.int64)
    mod.get_function(av.applyq_smem_name(32, 3))((1,), (1,), (out,))
    assert int(out.get()[0]) == av.applyq_smem_bytes(32, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000])
def test_device_q_matches_host_replay(budget):
    cp = _cp()
    rng = np.random.default_rng()
    stages = []
    for name, A in engine_families(rng):
        g = _factor_gpu(A, budget)
        assert g.on_device()
        stages.append(g.info["stages"])
        gs.check_levels(gs.plan_of(g))
        m = A.shape[0]
        for k in (1, 3, 40):
            B = rng.standard_normal((m, k)) if k > 1 else rng.standard_normal(m)
            qt_d = g.qt_matmul(cp.asarray(B))          # device pools where they are
            q_d = g.q_matmul(cp.asarray(B))
            assert isinstance(qt_d, cp.ndarray) and qt_d.shape == B.shape
            assert bool(cp.isfinite(qt_d).all()) and bool(cp.isfinite(q_d).all())
            qt_n = g.qt_matmul(B)                        # NumPy in -> NumPy out
            assert isinstance(qt_n, np.ndarray)
            np.testing.assert_array_equal(qt_n, qt_d.get())
            st = dict(g._replay)
            g._materialize()                             # host replay (fronts fetched)
            qt_h = gs.host_matmul(g, B, trans=True)
            q_h = gs.host_matmul(g, B, trans=False)
            tol = 100 * EPS * np.abs(B).max() * m
            assert np.abs(qt_d.get() - qt_h).max() <= tol, (name, k)
            assert np.abs(q_d.get() - q_h).max() <= tol, (name, k)
            # after the host fetch every stage's pool is uploaded for its levels
            qt_u = g.qt_matmul(cp.asarray(B)).get()
            assert np.abs(qt_u - qt_h).max() <= tol, (name, k)
            assert st.get("plan") is g._replay.get("plan")
        g.free()
    if budget is not None:
        assert max(stages) > 1, stages


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000])
def test_triangular_solves_by_levels_per_stage(budget):
    """R's solves by the level kernel stage by stage (earlier stages from compact
    copies of their rows of R in pinned memory) equal SciPy's sparse triangular
    solves with R, and the front-by-front loop."""
    from scipy.sparse.linalg import spsolve_triangular
    cp = _cp()
    rng = np.random.default_rng()
    stages = []
    for name, A in engine_families(rng):
        g = _factor_gpu(A, budget)
        stages.append(g.info["stages"])
        n = A.shape[1]
        R = sp.csr_array(g.R)
        d = np.abs(R.diagonal()) if R.shape[0] == n else np.zeros(1)
        if A.dtype != np.float64 or d.min() <= 1e-6 * d.max():
            g.free()                        # R not square, or not safely invertible
            continue
        ds = gs.device_solve_of(g)
        assert ds.fronts._stages is not None
        compact = [st for st in ds.fronts._stages if st[3] is not None]
        assert len(compact) == (g.info["stages"] - 1 if budget else 0), name
        C = rng.standard_normal((n, 3))
        cp.cuda.Device().synchronize()
        y = ds.upper(cp.asarray(C)).get()
        z = ds.upper_transposed(cp.asarray(C)).get()
        yr = spsolve_triangular(R, C, lower=False)
        zr = spsolve_triangular(sp.csr_array(R.T), C, lower=True)
        assert np.abs(y - yr).max() <= 1e-9 * np.abs(yr).max(), name
        assert np.abs(z - zr).max() <= 1e-9 * np.abs(zr).max(), name
        ds.fronts._stages = None            # the front-by-front loop, whole pools
        yl = ds.upper(cp.asarray(C)).get()
        zl = ds.upper_transposed(cp.asarray(C)).get()
        assert np.abs(y - yl).max() <= 1e-10 * np.abs(yl).max(), name
        assert np.abs(z - zl).max() <= 1e-10 * np.abs(zl).max(), name
        g.free()
    if budget is not None:
        assert max(stages) > 1, stages


@pytest.mark.gpu
@pytest.mark.parametrize("k", [64, 129, 300])
def test_wide_level_kernel_solves_as_the_per_column_kernel(monkeypatch, k):
    """From ``WIDE_MIN_COLUMNS`` right-hand-side columns on, a level's fronts of at most
    ``RSOLVE_WIDE_ROWS`` rows of R go to the wide kernel (one thread per column; a
    last block of columns part full): R's and Rᵀ's solves equal SciPy's and the
    per-column kernel's (Rᵀ's to its atomic adds' order, R's to the sums' order),
    on a chessboard whose levels hold both kinds of front and big ones."""
    from scipy.sparse.linalg import spsolve_triangular

    from scipy_gpuqr._engine.gpu import solve_kernels as sk
    from scipy_gpuqr._engine.gpu import trsolve as gpu_trsolve
    cp = _cp()
    rng = np.random.default_rng(11)
    A = random_values(chessboard_boundary(6, 7, 3), rng)
    an = analyze(A)
    rk = np.asarray(an.fronts.frank)
    assert (rk > sk.RSOLVE_WIDE_ROWS).any() and ((rk > 0) & (rk <= sk.RSOLVE_WIDE_ROWS)).any()
    g = gpu_factorize(A, an)
    R = sp.csr_array(g.R)
    n = A.shape[1]
    C = rng.standard_normal((n, k))
    got = {}
    assert 0 < gpu_trsolve.WIDE_MIN_COLUMNS <= 64
    for arm, wide in (("wide", gpu_trsolve.WIDE_MIN_COLUMNS), ("per column", 0)):
        monkeypatch.setattr(gpu_trsolve, "WIDE_MIN_COLUMNS", wide)
        ds = gs.device_solve_of(g)
        got[arm] = (ds.upper(cp.asarray(C)).get(), ds.upper_transposed(cp.asarray(C)).get())
        kern = ds.fronts._stages[0][2]
        assert (kern._wide is not None) is bool(wide)
    (y, z), (yn, zn) = got["wide"], got["per column"]
    yr = spsolve_triangular(R, C, lower=False)
    zr = spsolve_triangular(sp.csr_array(R.T), C, lower=True)
    assert np.abs(y - yr).max() <= 1e-9 * np.abs(yr).max()
    assert np.abs(z - zr).max() <= 1e-9 * np.abs(zr).max()
    assert np.abs(y - yn).max() <= 1e-10 * np.abs(yn).max()
    assert np.abs(z - zn).max() <= 1e-10 * np.abs(zn).max()
    g.free()


@pytest.mark.gpu
@pytest.mark.parametrize("k", [3, 40])
def test_level_kernel_gathers_long_rows_in_chunks_and_big_fronts_solve_in_place(k):
    """Fronts whose rows of R reach past their pivots by more than the level
    kernel's shared-memory chunk (``RSOLVE_CHUNK``, 1024 values: several chunks per
    row) and a big front solved by cuBLAS from its rows where they lie (no copy of
    U): R's solves equal SciPy's and the front-by-front loop's."""
    from scipy.sparse.linalg import spsolve_triangular

    from scipy_gpuqr._engine.gpu import trsolve as gpu_trsolve
    cp = _cp()
    rng = np.random.default_rng(7)
    A = random_values(chessboard_boundary(6, 7, 3), rng)
    an = analyze(A)
    fs = an.fronts
    rk, fn = np.asarray(fs.frank), np.asarray(fs.fn)
    small = (rk > 0) & (rk < gpu_trsolve.BIG_FRONT_ROWS)
    assert (fn - rk)[small].max() > 2 * 1024 and (rk >= gpu_trsolve.BIG_FRONT_ROWS).any()
    g = gpu_factorize(A, an)
    R = sp.csr_array(g.R)
    n = A.shape[1]
    d = np.abs(R.diagonal())
    assert R.shape[0] == n and d.min() > 1e-8 * d.max()
    ds = gs.device_solve_of(g)
    C = rng.standard_normal((n, k))
    y = ds.upper(cp.asarray(C)).get()
    z = ds.upper_transposed(cp.asarray(C)).get()
    yr = spsolve_triangular(R, C, lower=False)
    zr = spsolve_triangular(sp.csr_array(R.T), C, lower=True)
    assert np.abs(y - yr).max() <= 1e-9 * np.abs(yr).max()
    assert np.abs(z - zr).max() <= 1e-9 * np.abs(zr).max()
    ds.fronts._stages = None            # every front by cuBLAS, from its rows
    yl = ds.upper(cp.asarray(C)).get()
    zl = ds.upper_transposed(cp.asarray(C)).get()
    assert np.abs(yl - yr).max() <= 1e-9 * np.abs(yr).max()
    assert np.abs(zl - zr).max() <= 1e-9 * np.abs(zr).max()
    g.free()


@pytest.mark.gpu
def test_staged_dense_fronts_read_in_their_uploaded_pool():
    """A staged factorization with dense fronts: Q on the device reads each dense
    front inside its stage's uploaded pool (no copy of its own) and equals the
    host replay; R's staged solves equal SciPy's."""
    from scipy.sparse.linalg import spsolve_triangular
    cp = _cp()
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(9), rng)
    an = analyze(A)
    g = gpu_factorize(A, an, dense_flops=2e6, max_gpu_memory=an.gpu_bytes // 4, debug=True)
    assert g.info["stages"] > 1 and g.info.get("dense_fronts", 0) > 0, g.info
    away = [d for d in g._dense.values() if d.pool_at[0] < g.info["stages"] - 1]
    assert away, "no dense front in an earlier stage"
    m, n = A.shape
    B = rng.standard_normal((m, 3))
    qt_d, q_d = g.qt_matmul(cp.asarray(B)).get(), g.q_matmul(cp.asarray(B)).get()
    assert not any(d.has_device_copy() for d in away)
    C = rng.standard_normal((n, 2))
    ds = gs.device_solve_of(g)
    y = ds.upper(cp.asarray(C)).get()
    R = sp.csr_array(g.R)
    yr = spsolve_triangular(R, C, lower=False)
    assert np.abs(y - yr).max() <= 1e-9 * np.abs(yr).max()
    g._materialize()
    tol = 100 * EPS * np.abs(B).max() * m
    assert np.abs(qt_d - gs.host_matmul(g, B, trans=True)).max() <= tol
    assert np.abs(q_d - gs.host_matmul(g, B, trans=False)).max() <= tol
    g.free()


@pytest.mark.gpu
def test_dense_fronts_on_device_q_and_triangular_solve():
    cp = _cp()
    from scipy.sparse.linalg import spsolve_triangular
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(9), rng)
    g = gpu_factorize(A, analyze(A), dense_flops=2e6, debug=True)
    assert g.info.get("dense_fronts", 0) > 0, g.info
    m, n = A.shape
    B = rng.standard_normal((m, 4))
    qt_d, q_d = g.qt_matmul(cp.asarray(B)).get(), g.q_matmul(cp.asarray(B)).get()
    ds = gs.device_solve_of(g)
    C = rng.standard_normal((n, 2))
    y = ds.upper(cp.asarray(C)).get()
    z = ds.upper_transposed(cp.asarray(C)).get()
    R = sp.csr_array(g.R)
    yr = spsolve_triangular(R, C, lower=False)
    zr = spsolve_triangular(sp.csr_array(R.T), C, lower=True)
    assert np.abs(y - yr).max() <= 1e-9 * np.abs(yr).max()
    assert np.abs(z - zr).max() <= 1e-9 * np.abs(zr).max()
    # the level kernel (one pool) against the front-by-front loop, 3 columns
    assert ds.fronts._stages is not None and len(ds.fronts._stages) == 1
    C3 = cp.asarray(rng.standard_normal((n, 3)))
    yk, zk = ds.fronts.upper(C3), ds.fronts.upper_transposed(C3)
    from scipy_gpuqr._engine.gpu import trsolve as gpu_trsolve
    big = gpu_trsolve.BIG_FRONT_ROWS
    try:                                   # levels with their big fronts through cuBLAS
        gpu_trsolve.BIG_FRONT_ROWS = 16
        dh = gs.device_solve_of(g)
        assert any(len(b) for b in dh.fronts._stages[0][2].levels[False][2])
        yh, zh = dh.fronts.upper(C3), dh.fronts.upper_transposed(C3)
    finally:
        gpu_trsolve.BIG_FRONT_ROWS = big
    ds.fronts._stages = None
    yl, zl = ds.fronts.upper(C3), ds.fronts.upper_transposed(C3)
    for yy, zz in ((yk, zk), (yh, zh)):
        assert float(cp.abs(yy - yl).max()) <= 1e-10 * float(cp.abs(yl).max())
        assert float(cp.abs(zz - zl).max()) <= 1e-10 * float(cp.abs(zl).max())
    g._materialize()
    tol = 100 * EPS * np.abs(B).max() * m
    assert np.abs(qt_d - gs.host_matmul(g, B, trans=True)).max() <= tol
    assert np.abs(q_d - gs.host_matmul(g, B, trans=False)).max() <= tol
    g.free()


@pytest.mark.gpu
def test_device_q_is_orthogonal_on_many_columns():
    cp = _cp()
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(8), rng)
    g = _factor_gpu(A)
    m = A.shape[0]
    B = cp.asarray(rng.standard_normal((m, 70)))
    C = g.qt_matmul(B)
    np.testing.assert_allclose(cp.linalg.norm(C, axis=0).get(), cp.linalg.norm(B, axis=0).get(),
                               rtol=1e-12)
    np.testing.assert_allclose(g.q_matmul(C).get(), B.get(), atol=1e-12 * m)
    # Qᵀ A[:, perm] = [R; 0]
    Ad = cp.asarray(A[:, g.colperm].toarray())
    QtA = g.qt_matmul(Ad).get()
    R = g.R.toarray()
    k = R.shape[0]
    scale = np.abs(R).max()
    assert np.abs(QtA[:k] - R).max() <= 1e-12 * scale * m
    assert np.abs(QtA[k:]).max() <= 1e-12 * scale * m
    g.free()


@pytest.mark.gpu
@pytest.mark.slow
def test_grid32_least_squares_is_backward_stable():
    # grid 32³ has structurally rank-deficient fronts whose contribution blocks
    # carry columns of 1e-108 … 1e-160: before the tile kernel rescaled its
    # column norms their reflectors were not orthogonal (backward error 7e-10)
    _cp()
    A = grid3d_least_squares(32)
    rng = np.random.default_rng(3)
    b = A @ rng.standard_normal(A.shape[1]) + 1e-3 * rng.standard_normal(A.shape[0])
    g = _factor_gpu(A)
    R = g.R
    X = rng.standard_normal((A.shape[1], 3))
    rel = np.abs(np.linalg.norm(R @ X, axis=0)
                 / np.linalg.norm(A[:, g.colperm] @ X, axis=0) - 1)
    assert rel.max() <= 1e-13
    g.free()
    from scipy_gpuqr import lsqr
    x = lsqr(A, b, backend="gpu")[0]
    r = b - A @ x
    assert (np.linalg.norm(A.T @ r)
            <= 1000 * EPS * sp.linalg.norm(A) * np.linalg.norm(r))


@pytest.mark.gpu
def test_device_solve_refines_ill_conditioned_problems_like_the_host():
    # full rank, cond 1e11 (eps·cond > REFINE_ABOVE): the device solve refines with
    # A's own residuals, as the host solve does, and gets the host's backward error
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._factor import factored as _factored
    cp = _cp()
    rng = np.random.default_rng(20261126)
    m, n = 400, 300
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = (U * np.logspace(0, -11, n)) @ V.T
    As = sp.csc_array(A)
    b = rng.standard_normal(m)
    norm2 = np.linalg.norm(A, 2)

    def be(x):
        r = b - A @ x
        return np.linalg.norm(A.T @ r) / (norm2 * np.linalg.norm(r))

    host = QRFactorization(As, backend="reference")
    dev = QRFactorization(As, backend="gpu")
    assert dev._core.rank_decision().method == "triangular" and dev._core.refines()
    x_dev = dev.solve(b)
    x_dev_cupy = dev.solve(cp.asarray(b)).get()
    saved = _factored.REFINE_STEPS
    try:
        _factored.REFINE_STEPS = 0
        plain = be(QRFactorization(As, backend="gpu").solve(b))
    finally:
        _factored.REFINE_STEPS = saved
    ref = be(host.solve(b))
    assert be(x_dev) <= max(2 * ref, 10 * EPS), (be(x_dev), ref, plain)
    assert be(x_dev_cupy) <= max(2 * ref, 10 * EPS)
    # refinement lowers the backward error (0.16-0.67 of the unrefined one
    # measured on fresh random problems: the gain varies, its sign does not)
    assert be(x_dev) < plain


def _lstsq_ok(A, x, b):
    Ad = A.toarray()
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    normA = s[0]
    m, n = Ad.shape
    for xx, ref in ((x, False), (x_ref, True)):
        r = b - Ad @ xx
        nr = np.linalg.norm(r)
        ls = np.linalg.norm(Ad.T @ r) / (normA * nr) if nr > 0 else 0.0
        cons = nr / (normA * np.linalg.norm(xx) + np.linalg.norm(b))
        if ref:
            ls_ref, cons_ref = ls, cons
        else:
            ls_x, cons_x = ls, cons
    c = 100 * EPS * max(m, n)
    assert ls_x <= max(10 * ls_ref, c) or cons_x <= max(10 * cons_ref, c), (ls_x, cons_x)
    cond = s[0] / s[rank - 1]
    tol = max(1e3 * EPS * cond * max(m, n), 1e-10)
    assert np.linalg.norm(x - x_ref) <= tol * np.linalg.norm(x_ref)


def _device_solve_near_lstsq(F, A, b, rtol):
    """``F.solve`` of a CuPy ``b``: CuPy, within ``rtol`` of float64 lstsq; returns x."""
    cp = _cp()
    x = F.solve(cp.asarray(b))
    assert isinstance(x, cp.ndarray)
    x_ref = np.linalg.lstsq(A.toarray().astype(np.float64), b.astype(np.float64), rcond=None)[0]
    assert np.linalg.norm(x.get() - x_ref) <= rtol * np.linalg.norm(x_ref)
    return x


def _no_host_path(monkeypatch):
    """Fail if a solve copies a CuPy b to the host or replays Q there."""
    from scipy_gpuqr import _validate
    from scipy_gpuqr._gpu import is_cupy_array
    to_host = _validate.to_host

    def guarded(x):
        if is_cupy_array(x):
            raise AssertionError("host path taken: b copied to the host")
        return to_host(x)

    def boom(*a, **k):
        raise AssertionError("host path taken")
    monkeypatch.setattr(_validate, "to_host", guarded)
    monkeypatch.setattr(gs, "host_matmul", boom)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000])
def test_solve_on_device_matches_lstsq(monkeypatch, budget):
    cp = _cp()
    from scipy_gpuqr import QRFactorization, GpuqrOptions
    rng = np.random.default_rng()
    opts = GpuqrOptions(max_gpu_memory=budget) if budget else None
    cases = [("grid6", random_values(grid3d_least_squares(6), rng)),
             ("singletons", _singletons_full_rank(rng)),
             ("randls", random_least_squares(500, 160, density=0.03, dense_rows=2,
                                             seed=int(rng.integers(1 << 30)))),
             ("wide", sp.csc_array(random_least_squares(300, 120, density=0.05,
                                                        seed=int(rng.integers(1 << 30))).T))]
    for name, A in cases:
        m, n = A.shape
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            F = QRFactorization(A, backend="gpu", gpuqr_options=opts)
        assert F.numeric.on_device(), name
        assert F._core.device_least_squares_ok(), (name, F._core.rank_decision().method)
        b = rng.standard_normal(m)
        Bk = rng.standard_normal((m, 5))
        with monkeypatch.context() as mp:
            _no_host_path(mp)
            x = F.solve(cp.asarray(b))
            X = F.solve(cp.asarray(Bk))
        assert isinstance(x, cp.ndarray) and x.shape == (n,) and x.dtype == np.float64
        assert isinstance(X, cp.ndarray) and X.shape == (n, 5)
        _lstsq_ok(A, x.get(), b)
        for j in range(5):
            _lstsq_ok(A, X[:, j].get(), Bk[:, j])
        xn = F.solve(b)                                   # NumPy in -> NumPy out
        assert isinstance(xn, np.ndarray)
        # the same device solve; reductions may sum in another order between calls
        np.testing.assert_allclose(xn, x.get(), rtol=1e-12,
                                   atol=1e-14 * np.linalg.norm(xn))
        F.free()


@pytest.mark.gpu
def test_solve_on_device_shared_matrices(matrices_dir):
    cp = _cp()
    from scipy_gpuqr import QRFactorization
    from conftest import real_shared_matrices
    rng = np.random.default_rng()
    on_device = []
    for name, A in real_shared_matrices(matrices_dir):
        if max(A.shape) > 2500:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # a fallback warning is not this test's matter
            F = QRFactorization(A, backend="gpu")
        if not F._core.device_least_squares_ok():
            F.free()
            continue
        b = rng.standard_normal(A.shape[0])
        x = F.solve(cp.asarray(b))
        assert isinstance(x, cp.ndarray)
        _lstsq_ok(A, x.get(), b)
        on_device.append(name)
        F.free()
    assert len(on_device) >= 5, on_device


@pytest.mark.gpu
def test_rank_deficient_solve_keeps_the_host_rule():
    from scipy_gpuqr import QRFactorization
    A = chessboard_boundary(4, 5, 2).astype(np.float64)      # rank-deficient
    F = QRFactorization(A, backend="gpu")
    assert not F._core.device_least_squares_ok()
    b = np.random.default_rng().standard_normal(A.shape[0])
    _device_solve_near_lstsq(F, A, b, 1e-8)
    F.free()


@pytest.mark.gpu
def test_spsolve_factorized_and_float32_on_device():
    from scipy_gpuqr import QRFactorization, factorized, spsolve
    rng = np.random.default_rng()
    S = random_values(grid3d_least_squares(6), rng)[:216]
    S = sp.csc_array(S + 8 * sp.eye(216, format="csc"))
    b = rng.standard_normal(216)
    x = spsolve(S, b, backend="gpu")
    nS = sp.linalg.norm(S)
    assert np.linalg.norm(S @ x - b) <= 100 * EPS * (nS * np.linalg.norm(x) + np.linalg.norm(b))
    solve = factorized(S, backend="gpu")
    assert solve.factorization.numeric.on_device()
    xt = solve(b, trans="T")
    assert np.linalg.norm(S.T @ xt - b) <= 100 * EPS * (nS * np.linalg.norm(xt)
                                                        + np.linalg.norm(b))
    A = random_values(grid3d_least_squares(6), rng).astype(np.float32)
    F = QRFactorization(A, backend="gpu")
    assert F._core.device_least_squares_ok()
    bb = rng.standard_normal(A.shape[0]).astype(np.float32)
    x32 = _device_solve_near_lstsq(F, A, bb, 1e-3)
    assert x32.dtype == np.float32
    F.free()


@pytest.mark.gpu
def test_spsolve_and_factorized_cupy_in_cupy_out_on_device(monkeypatch):
    """A dense CuPy b: checked and solved on the device, never copied to the host."""
    cp = _cp()
    from scipy_gpuqr import factorized, spsolve
    rng = np.random.default_rng()
    S = random_values(grid3d_least_squares(6), rng)[:216]
    S = sp.csc_array(S + 8 * sp.eye(216, format="csc"))
    nS = sp.linalg.norm(S)
    b = rng.standard_normal(216)
    Bk = rng.standard_normal((216, 3))
    solve = factorized(S, backend="gpu")
    with monkeypatch.context() as mp:
        _no_host_path(mp)
        x = spsolve(S, cp.asarray(b), backend="gpu")
        x1 = spsolve(S, cp.asarray(b[:, None]), backend="gpu")   # (n, 1) -> (n,)
        X = spsolve(S, cp.asarray(Bk), backend="gpu")
        xt = solve(cp.asarray(b), trans="T")
        Xf = solve(cp.asarray(Bk))
    for y, rhs, mat in ((x, b, S), (x1, b, S), (xt, b, S.T)):
        assert isinstance(y, cp.ndarray) and y.shape == (216,) and y.dtype == np.float64
        yh = y.get()
        assert np.linalg.norm(mat @ yh - rhs) <= 100 * EPS * (nS * np.linalg.norm(yh)
                                                              + np.linalg.norm(rhs))
    for Y in (X, Xf):
        assert isinstance(Y, cp.ndarray) and Y.shape == (216, 3)
        np.testing.assert_allclose(S @ Y.get(), Bk, atol=1e-9)
    with pytest.raises(ValueError, match="dimension mismatch"):
        spsolve(S, cp.ones(5), backend="gpu")
    with pytest.raises(ValueError, match="non-finite"):
        spsolve(S, cp.full(216, cp.nan), backend="gpu")
    xc = spsolve(S, cp.asarray(b), backend="cpu")                # CPU factors: CuPy out still
    assert isinstance(xc, cp.ndarray)
    np.testing.assert_allclose(xc.get(), x.get(), rtol=1e-9, atol=1e-12)
    solve.factorization.free()


@pytest.mark.gpu
def test_qr_householder_operator_on_device():
    cp = _cp()
    import cupyx.scipy.sparse as csp

    from scipy_gpuqr import qr
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(5), rng)
    res = qr(csp.csr_matrix(sp.csr_matrix(A)), mode="householder", tol=None, backend="gpu")
    Q = res.Q
    y = cp.asarray(rng.standard_normal(A.shape[0]))
    z = Q.matvec(y)
    assert isinstance(z, cp.ndarray)
    np.testing.assert_allclose(Q.rmatvec(z).get(), y.get(), atol=1e-12 * A.shape[0])
    Rd = res.R.toarray().get() if hasattr(res.R, "get") else res.R.toarray()
    perm = res.perm.get() if hasattr(res.perm, "get") else res.perm
    E = cp.asarray(np.vstack([Rd, np.zeros((A.shape[0] - Rd.shape[0], Rd.shape[1]))]))
    QR = Q.matmat(E).get()
    assert np.abs(QR - A.toarray()[:, perm]).max() <= 1e-12 * A.shape[0] * np.abs(Rd).max()


@pytest.mark.parametrize("budget", [None, 20000])
def test_triangular_plan_is_shared_by_a_patterns_factorizations(budget):
    """R's solve plan (fronts, where they lie, levels, level tables) is kept with
    the schedule: a second factorization of the pattern takes the first one's, and
    its tables are those the level kernel built per solve before."""
    from scipy_gpuqr._engine.gpu import trsolve
    rng = np.random.default_rng(5)
    A = random_values(grid3d_least_squares(5), rng)
    an = analyze(A)
    g1 = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
    g2 = gpu_factorize(random_values(A, rng), an, device=NumpyDevice(32, 3),
                       max_gpu_memory=budget)
    p1, p2 = gs.triangular_plan_of(g1), gs.triangular_plan_of(g2)
    assert p1 is p2 and g1.schedule is g2.schedule
    fs = an.fronts
    # the fronts as FrontTriangular listed them, front by front
    want = [(g1._front_loc[f][0], int(g1._front_loc[f][1]), int(fs.fm[f]), int(fs.fn[f]),
             int(fs.frank[f]), int(fs.col_ptr[f]), int(fs.col_ptr[f + 1]))
            for f in range(fs.nfronts) if int(fs.frank[f])]
    assert p1.fronts == want and p1.front_ids == [f for f in range(fs.nfronts)
                                                  if int(fs.frank[f])]
    assert np.array_equal(p1.cols, fs.cols) and not p1.cols.flags.writeable
    depth, height = trsolve._tree_levels(fs)
    assert np.array_equal(p1.depth, depth) and np.array_equal(p1.height, height)
    ft = trsolve.FrontTriangular(g2, lambda sid: g2._stage_pools.get(sid, g2._host_pools.get(sid)),
                                 np, plan=p2)
    assert ft.fronts is p1.fronts
    # a stage's level tables: each level's fronts by depth (R) / height (Rᵀ), stable
    by_stage = {}
    for i, fr in enumerate(p1.fronts):
        by_stage.setdefault(fr[0], []).append(i)
    assert p1.by_stage == by_stage
    for sid, members in by_stage.items():
        offsets = [p1.fronts[i][1] for i in members]
        t = p1.level_tables((sid, "pool"), members, offsets)
        assert p1.level_tables((sid, "pool"), members, offsets) is t
        assert t["off_of"] == dict(zip(members, offsets))
        for trans, key in ((False, depth), (True, height)):
            desc, ptr, bigs = t["levels"][trans]
            small = [i for i in members if p1.fronts[i][4] < trsolve.BIG_FRONT_ROWS]
            lv = {i: int(key[p1.front_ids[i]]) for i in members}
            lo = min(lv.values())
            order = sorted(small, key=lambda i: lv[i])
            assert desc.tolist() == [[p1.fronts[i][1], p1.fronts[i][3], p1.fronts[i][4],
                                      p1.fronts[i][5]] for i in order]
            assert ptr[-1] == len(order) and len(ptr) == max(lv.values()) - lo + 2
            for L in range(len(ptr) - 1):
                assert all(lv[i] - lo == L for i in order[ptr[L]:ptr[L + 1]])
            assert sum(len(b) for b in bigs) == len(members) - len(small)
    # the big fronts' threshold is read when the tables are asked for (a test lowers it)
    sid, members = next(iter(by_stage.items()))
    offsets = [p1.fronts[i][1] for i in members]
    big = max(p1.fronts[i][4] for i in members)
    base = p1.level_tables((sid, "pool"), members, offsets)
    try:
        trsolve.BIG_FRONT_ROWS = big
        low = p1.level_tables((sid, "pool"), members, offsets)
    finally:
        trsolve.BIG_FRONT_ROWS = 512
    assert low is not base and sum(len(b) for b in low["levels"][False][2]) > 0
    assert p1.level_tables((sid, "pool"), members, offsets) is base
    g1.free()
    g2.free()


def test_wide_level_tables_split_each_level_by_rows_of_r():
    """The wide kernel's tables (``level_tables(..., wide=True)``, made once per
    stage): each level's fronts of at most ``RSOLVE_WIDE_ROWS`` rows of R and the
    others, each in the per-column tables' order, together the level's fronts;
    the big fronts as they were."""
    from scipy_gpuqr._engine.gpu import solve_kernels as sk
    from scipy_gpuqr._engine.gpu import trsolve
    fs = analyze(chessboard_boundary(5, 6, 2)).fronts
    plan = trsolve.TriangularPlan(fs, [(0, 1000 * f) for f in range(fs.nfronts)])
    members = list(range(len(plan.fronts)))
    offsets = [plan.fronts[i][1] for i in members]
    base = plan.level_tables((0, "pool"), members, offsets)
    wide = plan.level_tables((0, "pool"), members, offsets, wide=True)
    assert plan.level_tables((0, "pool"), members, offsets, wide=True) is wide
    assert plan.level_tables((0, "pool"), members, offsets) is base
    seen = set()
    for trans in (False, True):
        desc, ptr, bigs = base["levels"][trans]
        (wd, wp), (pd, pp), wbigs = wide[trans]
        assert wbigs is bigs and len(wp) == len(pp) == len(ptr)
        assert not wd.flags.writeable and not pd.flags.writeable
        for lv in range(len(ptr) - 1):
            rows = desc[ptr[lv]:ptr[lv + 1]].tolist()
            few = wd[wp[lv]:wp[lv + 1]].tolist()
            many = pd[pp[lv]:pp[lv + 1]].tolist()
            assert few == [r for r in rows if r[2] <= sk.RSOLVE_WIDE_ROWS]
            assert many == [r for r in rows if r[2] > sk.RSOLVE_WIDE_ROWS]
            seen.update(("few" if few else None, "many" if many else None))
    assert {"few", "many"} <= seen
