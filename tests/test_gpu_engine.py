"""The GPU engine (scipy_gpuqr._engine.gpu).

CPU tests run the engine's host logic (staging, carried contribution blocks,
R assembly, Q bookkeeping, restaging after out-of-memory) against the NumPy
device layer. GPU tests (marker ``gpu``) compare the uberkernel with the
NumPy executor launch by launch (fresh random values, VT pool poisoned with
NaN), whole factorizations with the simulate/reference engines on generated
families and the shared matrices (also with many stages), and
``QRFactorization(A, backend='gpu')`` end to end.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.gpu import GpuEngineError, gpu_factorize
from scipy_gpuqr._engine.gpu_device import NumpyDevice
from scipy_gpuqr._engine.simulate import execute_task, simulate_factorize
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares)

EPS = np.finfo(np.float64).eps


def _random_values(A, rng):
    A = sp.csc_array(A, dtype=np.float64, copy=True)
    A.data = rng.standard_normal(A.nnz)
    return A


def _families(rng):
    yield "grid5", _random_values(grid3d_least_squares(5), rng)
    yield "chess-4-5-2", chessboard_boundary(4, 5, 2).astype(np.float64)
    yield "randls", random_least_squares(400, 150, density=0.03, dense_rows=3,
                                         seed=int(rng.integers(1 << 30)))


# ---------------------------------------------------------------- CPU: host logic

@pytest.mark.parametrize("budget", [None, 20000])
def test_host_logic_matches_simulate(budget):
    rng = np.random.default_rng()
    for name, A in _families(rng):
        an = analyze(A)
        s = simulate_factorize(A, an, max_gpu_memory=budget)
        g = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
        assert g.info["stages"] == s.info["stages"], name
        assert abs(g.R - s.R).max() == 0.0, name
        b = rng.standard_normal((A.shape[0], 2))
        np.testing.assert_array_equal(g.qt_matmul(b), s.qt_matmul(b))
        np.testing.assert_array_equal(g.q_matmul(b), s.q_matmul(b))
        g.free()


def test_restages_after_out_of_memory_and_falls_back():
    A = grid3d_least_squares(5)
    an = analyze(A)
    s = simulate_factorize(A, an)
    one = an.stage_plan(None)
    small = max(st.pool_size for st in build_schedule(an, max_gpu_memory=20000).stages)
    g = gpu_factorize(A, an, device=NumpyDevice(32, 3, fail_after=small))
    assert g.info["restaged"] >= 1 and g.info["stages"] > len(one.stages)
    assert abs(g.R - s.R).max() == 0.0
    with pytest.warns(RuntimeWarning, match="out of memory"):
        r = gpu_factorize(A, an, device=NumpyDevice(32, 3, fail_after=0))
    assert "fallback" in r.info
    with pytest.raises(MemoryError):
        gpu_factorize(A, an, device=NumpyDevice(32, 3, fail_after=0), fallback=False)


def test_non_finite_pool_raises():
    class Bad(NumpyDevice):
        def run_stage(self, st, s_index, s_value, carried):
            pool = super().run_stage(st, s_index, s_value, carried)
            pool[0] = np.nan
            if not np.isfinite(pool).all():
                raise GpuEngineError("non-finite values")
            return pool
    with pytest.raises(GpuEngineError):
        gpu_factorize(grid3d_least_squares(3), device=Bad(32, 3))


def test_rank_detection_is_delegated_and_said():
    A = sp.csc_array(sp.random(40, 30, density=0.2, random_state=3) + sp.eye(40, 30))
    out = gpu_factorize(A, tol="default", device=NumpyDevice(32, 3))
    assert "fallback" in out.info


# ---------------------------------------------------------------- GPU

def _gpu_launch_by_launch(A, ctype, rng, budget):
    import cupy as cp

    from scipy_gpuqr._engine import variants
    from scipy_gpuqr._kernels import load_module
    from scipy_gpuqr._schedule.tasks import TASK_BYTES
    an = analyze(A)
    sched = build_schedule(an, max_gpu_memory=budget)
    fs = an.fronts
    dt = np.float64 if ctype == "double" else np.float32
    mod = load_module(variants.UBERKERNEL_FILE, variants.KERNEL_VARIANTS[variants.UBERKERNEL_FILE])
    kern = mod.get_function(variants.kernel_name(ctype, 32, 3, 256))
    smem = variants.tile_smem_bytes(32, 3, np.dtype(dt).itemsize)
    kern.max_dynamic_shared_size_bytes = smem
    from scipy_gpuqr._symbolic import canonical_csc
    vals = canonical_csc(A).data.astype(np.float64)[fs.s_nz]
    maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
    vt_h = np.full(max(sched.vt_size, 1), np.nan)
    vt_d = cp.full(vt_h.shape, cp.nan, dtype=dt)
    maps_d = cp.asarray(maps)
    st = sched.stages[0]          # no carried blocks: both start from zeros
    s0, s1 = st.s_range
    sidx, sval = fs.s_index[s0:s1], vals[s0:s1]
    pool_h = np.zeros(st.pool_size)
    pool_d = cp.zeros(st.pool_size, dtype=dt)
    tasks_d = cp.asarray(np.ascontiguousarray(st.tasks).view(np.uint8))
    sidx_d, sval_d = cp.asarray(sidx), cp.asarray(sval.astype(dt))
    scale = max(np.abs(vals).max(), 1.0) * np.sqrt(max(A.shape))
    tol = (1000 * max(A.shape) * EPS if dt == np.float64 else 2e-3) * scale
    seen = set()
    for L in range(st.nlaunch):
        a, b = int(st.launch_ptr[L]), int(st.launch_ptr[L + 1])
        if b <= a:
            continue
        types = set(st.tasks["type"][a:b].tolist())
        seen |= types
        kern((b - a,), (256,), (tasks_d[a * TASK_BYTES:], pool_d, vt_d, sidx_d, sval_d, maps_d),
             shared_mem=smem)
        for k in a + rng.permutation(b - a):
            execute_task(st.tasks[k], pool_h, vt_h, 32, spool=(sidx, sval), maps=maps)
        if L == 0:  # leaves' S-Assemble only, before any reflector: exact
            got = cp.asnumpy(pool_d).astype(np.float64)
            assert np.isfinite(got).all(), L
            assert np.abs(got - pool_h).max(initial=0.0) <= tol, L
    # Reflectors built from rounding noise (numerically rank-deficient trailing columns of a
    # front, seen on 494_bus and the grid: diagonal 1e-14 relative) differ legitimately
    # between summation orders, so fronts are compared through their Gram matrices
    # triu(F)ᵀ triu(F), which every valid factorization of the same assembled front shares.
    got = cp.asnumpy(pool_d).astype(np.float64)
    assert np.isfinite(got).all()
    first, last = st.fronts
    for f in range(first, last + 1):
        fm, fn, off = int(fs.fm[f]), int(fs.fn[f]), int(st.foff[f])
        k = min(fm, fn)
        Rg = np.triu(got[off: off + fm * fn].reshape(fm, fn)[:k])
        Rh = np.triu(pool_h[off: off + fm * fn].reshape(fm, fn)[:k])
        gs = max(np.abs(Rh).max(initial=0.0), 1.0)
        assert np.abs(Rg.T @ Rg - Rh.T @ Rh).max(initial=0.0) <= tol * gs * max(k, 1), f
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("ctype", ["double", "float"])
def test_uberkernel_matches_numpy_launch_by_launch(ctype):
    from scipy_gpuqr._schedule.tasks import TaskType
    rng = np.random.default_rng()
    seen = set()
    for name, A in _families(rng):
        seen |= _gpu_launch_by_launch(A, ctype, rng, None)
    assert {int(TaskType.S_ASSEMBLE), int(TaskType.PACK_ASSEMBLE), int(TaskType.FACTORIZE),
            int(TaskType.APPLY), int(TaskType.APPLY_FACTORIZE)} <= seen, seen


def _check_against_simulate(A, budget, debug=False, name=""):
    """R's Gram matrix equals simulate's, Q R = A P, and Q is orthogonal.

    (R itself is not compared entrywise: rows past a numerically rank-deficient
    pivot come from rounding noise and differ between summation orders.)
    """
    an = analyze(A)
    s = simulate_factorize(A, an, max_gpu_memory=budget)
    g = gpu_factorize(A, an, max_gpu_memory=budget, debug=debug)
    m, n = A.shape
    k = min(m, n)
    normA = max(float(sp.linalg.norm(A)), 1.0)
    tol = 200 * max(m, n) * EPS * normA
    assert g.info["stages"] == s.info["stages"], name
    assert g.R.shape == s.R.shape and np.isfinite(g.R.data).all(), name
    Rg, Rs = g.R.toarray(), s.R.toarray()
    assert np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tol * normA, name
    rng = np.random.default_rng()
    X = rng.standard_normal((n, 2))
    QR = g.q_matmul(np.vstack([Rg @ X, np.zeros((m - k, 2))]))
    assert np.abs(A.toarray()[:, g.colperm] @ X - QR).max() <= tol * np.abs(X).max(), name
    b = rng.standard_normal((m, 2))
    y = g.qt_matmul(b)
    assert np.abs(np.linalg.norm(y, axis=0) - np.linalg.norm(b, axis=0)).max() <= tol, name
    assert np.abs(g.q_matmul(y) - b).max() <= tol, name
    g.free()
    return g


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000, 1])
def test_whole_factorization_matches_simulate(budget):
    rng = np.random.default_rng()
    for name, A in _families(rng):
        _check_against_simulate(A, budget, debug=budget == 20000, name=name)


@pytest.mark.gpu
def test_larger_families_match_reference():
    from scipy_gpuqr._engine.reference import reference_factorize
    rng = np.random.default_rng()
    for A in (_random_values(grid3d_least_squares(12), rng), chessboard_boundary(5, 6, 2)):
        A = A.astype(np.float64)
        an = analyze(A)
        g = gpu_factorize(A, an)
        r = reference_factorize(A, an)
        m, n = A.shape
        normA = max(float(sp.linalg.norm(A)), 1.0)
        Rg, Rr = g.R.toarray(), r.R.toarray()
        tol = 200 * max(m, n) * EPS * normA
        assert np.abs(Rg.T @ Rg - Rr.T @ Rr).max() <= tol * normA
        g.free()


@pytest.mark.gpu
def test_shared_matrices_match_simulate(matrices_dir):
    from scipy_gpuqr.io import mmread
    checked = []
    for f in sorted(matrices_dir.glob("*.mtx")):
        try:
            A = sp.csc_array(mmread(str(f)))
        except Exception:                       # noqa: BLE001 - a reader gap is not ours
            continue
        if np.iscomplexobj(A.data) or min(A.shape) == 0:
            continue
        A = A.astype(np.float64)
        an = analyze(A)
        if an.flops > 3e7 or max(A.shape) > 5000:
            continue
        _check_against_simulate(A, 1 if len(checked) % 3 == 2 else None, name=f.name)
        checked.append(f.name)
    assert len(checked) >= 5, checked


@pytest.mark.gpu
def test_qrfactorization_backend_gpu_solves_least_squares():
    from scipy_gpuqr import QRFactorization
    rng = np.random.default_rng()
    A = _random_values(grid3d_least_squares(8), rng)
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    xr = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - xr) <= 1e-8 * max(np.linalg.norm(xr), 1.0)
    info = F.info
    assert info["backend"] == "gpu", info
    assert info["backend_info"]["backend"] == "gpu", info["backend_info"]
    F.free()
