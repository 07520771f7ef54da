"""Dense fronts: blocked staircase QR outside the task lists.

CPU: the LAPACK version of the blocked factorization against numpy's QR, the
scheduler's bookkeeping of fronts "factorized externally", and whole
factorizations (simulate and the GPU engine's host logic on the NumPy device)
with a tiny threshold so that many fronts of small problems are dense. GPU
(marker ``gpu``): the cuSOLVER/cuBLAS version against the LAPACK one, and
whole factorizations with dense fronts against simulate.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.dense_front import DenseFront, factorize_numpy, panels_of
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.host.simulate import simulate_factorize
from scipy_gpuqr._schedule.dense import dense_front_mask
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import TaskType
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._symbolic.counts import front_work
from scipy_gpuqr._testing_matrices import (engine_families, grid3d_least_squares, random_values,
                                          staircase_front)

EPS = np.finfo(np.float64).eps
#: Small enough that the larger fronts of the small test problems are dense.
TINY = 2e4


def _check_front(F0, F, panels, T, tol):
    fm, fn = F0.shape
    k = min(fm, fn)
    R = np.triu(F[:k])
    np.testing.assert_allclose(R.T @ R, F0.T @ F0, atol=tol * max(np.abs(F0).max(), 1) ** 2)
    d = DenseFront(F, panels, T)
    Y = F0.copy()
    d.apply_qt(Y)                       # Qᵀ F0 = [R; 0]
    want = np.zeros_like(F0)
    want[:k] = R
    np.testing.assert_allclose(Y, want, atol=tol * max(np.abs(F0).max(), 1))
    d.apply_q(Y)
    np.testing.assert_allclose(Y, F0, atol=tol * max(np.abs(F0).max(), 1))


@pytest.mark.parametrize("fm,fn,nb", [(60, 25, 8), (25, 60, 8), (40, 40, 16), (1, 5, 4),
                                      (7, 1, 4), (90, 33, 128), (64, 64, 7)])
def test_blocked_staircase_qr_matches_a_dense_qr(fm, fn, nb):
    rng = np.random.default_rng()
    F0, stair = staircase_front(fm, fn, rng, dense_rows=min(fm, 3))
    F = F0.copy()
    panels = panels_of(fm, fn, stair, nb)
    T = factorize_numpy(F, panels, nb)
    assert T.shape == (len(panels), nb, nb)
    _check_front(F0, F, panels, T, 100 * max(fm, fn) * EPS)
    # rows past the staircase of a panel are never touched
    for j, rows, b in panels:
        assert rows >= b and j + rows <= fm
        assert np.all(F[j + rows:, j:j + b] == 0.0)


def test_panels_follow_the_staircase():
    stair = np.array([2, 2, 3, 5, 5, 9, 9, 10])
    assert panels_of(10, 8, stair, 2) == [(0, 2, 2), (2, 3, 2), (4, 5, 2), (6, 4, 2)]
    assert panels_of(10, 8, None, 3) == [(0, 10, 3), (3, 7, 3), (6, 4, 2)]
    assert panels_of(3, 8, None, 2) == [(0, 3, 2), (2, 1, 1)]
    with pytest.raises(ValueError):
        panels_of(3, 3, None, 0)


def test_zero_columns_give_zero_tau():
    F0 = np.zeros((6, 4))
    F0[:, 2] = 1.0
    F = F0.copy()
    panels = panels_of(6, 4, None, 2)
    T = factorize_numpy(F, panels, 2)
    _check_front(F0, F, panels, T, 1e-13)


def test_schedule_treats_dense_fronts_as_factorized_externally():
    rng = np.random.default_rng()
    for name, A in engine_families(rng, grid=6):
        an = analyze(A)
        fs = an.fronts
        mask = dense_front_mask(an, TINY)
        w = front_work(fs)["flops"]
        assert mask.any() and ((~mask).any() or fs.nfronts == 1), name
        assert np.array_equal(mask, (w >= TINY) & (np.minimum(fs.fm, fs.fn) > 0))
        for budget, cpl in ((None, 16), (20000, 16), (None, 0), (20000, 1)):
            s = build_schedule(an, dense_flops=TINY, max_gpu_memory=budget, cache=False,
                               dense_columns_per_launch=cpl)
            s0 = build_schedule(an, max_gpu_memory=budget, cache=False)
            assert set(s.dense) == set(np.flatnonzero(mask).tolist()), name
            assert s0.dense == {} and s.vt_size < s0.vt_size
            base = 0
            for st in s.stages:
                t = st.tasks
                launch = np.repeat(np.arange(st.nlaunch), np.diff(st.launch_ptr))
                tiled = np.isin(t["type"], (TaskType.FACTORIZE, TaskType.APPLY,
                                            TaskType.APPLY_FACTORIZE))
                for f, L in st.dense.items():
                    assert s.dense[f] == base + L
                    assert not np.any(tiled & (t["front"] == f)), (name, f)
                    # its assembly ends with launch L, its parent packs it after L
                    mine = (t["type"] == TaskType.S_ASSEMBLE) & (t["front"] == f)
                    kids = fs.children[fs.child_ptr[f]:fs.child_ptr[f + 1]]
                    packs = (t["type"] == TaskType.PACK_ASSEMBLE) & np.isin(t["front"], kids)
                    assert launch[mine | packs].max(initial=0) <= L
                    up = (t["type"] == TaskType.PACK_ASSEMBLE) & (t["front"] == f)
                    J = st.dense_join[f]
                    assert np.all(launch[up] == J), (name, f)
                    # the pack waits one launch per cpl columns (the side stream's work)
                    nfact = min(int(fs.fm[f]), int(fs.fn[f]))
                    p = int(fs.parent[f])
                    packed_here = p >= 0 and st.fronts[0] <= p <= st.fronts[1]
                    d = -(-nfact // cpl) if cpl and packed_here else 0
                    assert J == L + 1 + d, (name, f, J, L)
                    assert J <= st.nlaunch
                base += st.nlaunch


def _gram_tol(A):
    m, n = A.shape
    normA = max(float(sp.linalg.norm(A)), 1.0)
    return 200 * max(m, n) * EPS * normA ** 2, 200 * max(m, n) * EPS * normA


def _check_q(F, A, R, rng, tq, name):
    """Q [R; 0] X = A P X and Q Qᵀ b = b for the factorization ``F`` (dense ``R``);
    returns (b, Qᵀ b)."""
    m, n = A.shape
    k = min(m, n)
    X = rng.standard_normal((n, 2))
    QR = F.q_matmul(np.vstack([R @ X, np.zeros((m - k, 2))]))
    assert np.abs(A.toarray()[:, F.colperm] @ X - QR).max() <= tq * np.abs(X).max(), name
    b = rng.standard_normal((m, 2))
    y = F.qt_matmul(b)
    assert np.abs(F.q_matmul(y) - b).max() <= tq, name
    return b, y


@pytest.mark.parametrize("budget", [None, 20000, 1])
def test_simulate_with_dense_fronts(budget):
    rng = np.random.default_rng()
    for name, A in engine_families(rng, grid=6):
        an = analyze(A)
        s0 = simulate_factorize(A, an, max_gpu_memory=budget, dense_flops=None)
        s = simulate_factorize(A, an, max_gpu_memory=budget, dense_flops=TINY, dense_panel=8)
        assert s.info["dense_fronts"] > 0 and s0.info["dense_fronts"] == 0, name
        assert set(s._dense) == set(s.schedule.dense)
        for f, d in s._dense.items():
            assert len(s._fronts[f][2]) == 0 and d.after_launch == s.schedule.dense[f]
            np.testing.assert_array_equal(d.slots, s._fronts[f][0])
        tg, tq = _gram_tol(A)
        R, R0 = s.R.toarray(), s0.R.toarray()
        assert np.abs(R.T @ R - R0.T @ R0).max() <= tg, name
        b, y = _check_q(s, A, R, rng, tq, name)
        np.testing.assert_allclose(np.linalg.norm(y, axis=0), np.linalg.norm(b, axis=0))


@pytest.mark.parametrize("budget", [None, 20000])
def test_engine_host_logic_with_dense_fronts(budget):
    """The NumPy device runs the same LAPACK path: R and Q bitwise as simulate."""
    rng = np.random.default_rng()
    for name, A in engine_families(rng, grid=6):
        an = analyze(A)
        s = simulate_factorize(A, an, max_gpu_memory=budget, dense_flops=TINY, dense_panel=8)
        dev = NumpyDevice(32, 3)
        dev.dense_panel = 8
        g = gpu_factorize(A, an, device=dev, max_gpu_memory=budget, dense_flops=TINY)
        assert g.info["dense_fronts"] == s.info["dense_fronts"] > 0, name
        assert len(dev.dense_done) == g.info["dense_fronts"]
        assert abs(g.R - s.R).max() == 0.0, name
        assert {f: d.after_launch for f, d in g._dense.items()} == \
            {f: d.after_launch for f, d in s._dense.items()}
        b = rng.standard_normal((A.shape[0], 2))
        np.testing.assert_allclose(g.qt_matmul(b), s.qt_matmul(b), rtol=0, atol=1e-12)
        np.testing.assert_allclose(g.q_matmul(b), s.q_matmul(b), rtol=0, atol=1e-12)
        g.free()


def test_progressive_r_copy_with_dense_fronts():
    """Warm one-stage runs copy R ranges as they become final, dense fronts included
    (a range taken before its dense front is factorized would differ)."""
    rng = np.random.default_rng()
    ncopies = []
    for name, A in engine_families(rng, grid=6):
        an = analyze(A)
        gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=TINY).free()
        A2 = random_values(A, rng)
        dev = NumpyDevice(32, 3, rng=rng)
        g = gpu_factorize(A2, an, device=dev, dense_flops=TINY)
        assert g.info["r_copy_progressive"] and g.info["dense_fronts"] > 0, name
        ncopies.append(len(dev.r_copies))
        s = simulate_factorize(A2, an, dense_flops=TINY)
        assert abs(g.R - s.R).max() == 0.0, name
        g.free()
    assert max(ncopies) >= 2, ncopies


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cupy_blocked_qr_matches_lapack(dtype):
    import cupy as cp

    from scipy_gpuqr._engine.dense_front import factorize_cupy
    rng = np.random.default_rng()
    eps = np.finfo(dtype).eps
    for fm, fn, nb in [(700, 300, 64), (300, 700, 64), (513, 513, 128), (2000, 257, 96),
                       (5, 3, 128)]:
        F0, stair = staircase_front(fm, fn, rng, dense_rows=3)
        F0 = F0.astype(dtype)
        panels = panels_of(fm, fn, stair, nb)
        pool = cp.full(fm * fn + 11, cp.nan, dtype=dtype)     # poisoned around the front
        pool[5:5 + fm * fn] = cp.asarray(F0.ravel())
        Fd = pool[5:5 + fm * fn].reshape(fm, fn)
        Td = factorize_cupy(Fd, panels, nb)
        cp.cuda.Device().synchronize()
        got = cp.asnumpy(pool)
        assert np.isnan(got[:5]).all() and np.isnan(got[5 + fm * fn:]).all()
        F = got[5:5 + fm * fn].reshape(fm, fn).astype(np.float64)
        assert np.isfinite(F).all()
        _check_front(F0.astype(np.float64), F, panels, cp.asnumpy(Td).astype(np.float64),
                     50 * max(fm, fn) * eps)
        # Qᵀ on the device, CuPy in → CuPy out, same as on the host
        d = DenseFront(Fd, panels, Td)
        Y = rng.standard_normal((fm, 3))
        Yd = cp.asarray(Y)
        d.apply_qt(Yd)
        d.host()
        d.apply_qt(Y)
        np.testing.assert_allclose(cp.asnumpy(Yd), Y, atol=50 * max(fm, fn) * eps * 10)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000, 1])
def test_gpu_engine_with_dense_fronts_matches_simulate(budget):
    rng = np.random.default_rng()
    for name, A in engine_families(rng, grid=6):
        an = analyze(A)
        s = simulate_factorize(A, an, max_gpu_memory=budget, dense_flops=None)
        g = gpu_factorize(A, an, max_gpu_memory=budget, dense_flops=TINY,
                          debug=budget == 20000)
        assert g.info["dense_fronts"] > 0, name
        tg, tq = _gram_tol(A)
        Rg, Rs = g.R.toarray(), s.R.toarray()
        assert np.isfinite(Rg).all() and np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tg, name
        b, y = _check_q(g, A, Rg, rng, tq, name)
        assert np.abs(np.linalg.norm(y, axis=0) - np.linalg.norm(b, axis=0)).max() <= tq
        # the same through the host replay of the simulate engine's own dense fronts
        s2 = simulate_factorize(A, an, max_gpu_memory=budget, dense_flops=TINY)
        R2 = s2.R.toarray()
        assert np.abs(Rg.T @ Rg - R2.T @ R2).max() <= tg, name
        g.free()


@pytest.mark.gpu
def test_gpu_engine_dense_warm_and_float32():
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(10), rng)
    an = analyze(A)
    s = simulate_factorize(A, an, dense_flops=None)
    tg, _ = _gram_tol(A)
    for _ in range(2):                      # cold, then warm (progressive R copy)
        g = gpu_factorize(A, an, dense_flops=1e6)
        assert g.info["dense_fronts"] > 0
        Rg, Rs = g.R.toarray(), s.R.toarray()
        assert np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tg
        g.free()
    g = gpu_factorize(A.astype(np.float32), an, dense_flops=1e6)
    assert g.R.dtype == np.float32 and g.info["dense_fronts"] > 0
    Rg = g.R.toarray().astype(np.float64)
    tol32 = 50 * max(A.shape) * np.finfo(np.float32).eps * float(sp.linalg.norm(A)) ** 2
    assert np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tol32
    g.free()
