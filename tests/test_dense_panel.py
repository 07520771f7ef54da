"""The dense fronts' one-launch panel QR (``kernels/sparse_qr/panel_qr.cu``).

CPU: the NumPy model of the kernel's arithmetic (one reduction per column,
the rescaled pass, the tiny-column rule, ``T`` from the same dot products)
against LAPACK, and the GPU path's blocking (sub-panels of 32 columns inside
a panel, :func:`factorize_blocked_numpy`) against the LAPACK blocked QR on
staircase fronts. GPU (marker ``gpu``): the kernel against the model and
LAPACK, poisoned memory around the panel and its outputs, and
:func:`factorize_cupy` by kernel and by ``geqrf``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.linalg import lapack

from scipy_gpuqr._engine.dense_front import (DenseFront, factorize_blocked_numpy,
                                             factorize_numpy, panels_of)
from scipy_gpuqr._engine.gpu import dense_panel as dp
from scipy_gpuqr._engine.host import simulate
from scipy_gpuqr._kernels import kernels_dir
from scipy_gpuqr._testing_matrices import staircase_front

EPS = np.finfo(np.float64).eps


def _q_of(V, T):
    return np.eye(V.shape[0]) - V @ T @ V.T


def _check_panel(A, P, V, tau, T, tol):
    """Q from (V, T) is orthogonal and maps A to [R; 0]; P holds R and V."""
    m, w = A.shape
    Q = _q_of(V.astype(np.float64), T.astype(np.float64))
    scale = max(np.abs(A).max(), np.finfo(np.float64).tiny)
    assert np.abs(Q.T @ Q - np.eye(m)).max() <= tol
    R = np.triu(P[:w]).astype(np.float64)
    want = np.zeros((m, w))
    want[:w] = R
    assert np.abs(Q.T @ A.astype(np.float64) - want).max() <= tol * scale
    np.testing.assert_array_equal(np.tril(P, -1), np.tril(V, -1))
    np.testing.assert_array_equal(np.diag(T), tau)


@pytest.mark.parametrize("m,w,R", [(500, 32, 64), (100, 7, 32), (40, 32, 32), (33, 32, 200),
                                   (1, 1, 64), (300, 1, 64), (257, 31, 40)])
def test_panel_model_matches_lapack(m, w, R):
    rng = np.random.default_rng()
    A = rng.standard_normal((m, w))
    P = A.copy()
    V, tau, T = dp.panel_qr_numpy(P, R)
    _check_panel(A, P, V, tau, T, 50 * m * EPS)
    qr, tau0, _, info = lapack.dgeqrf(A)
    assert info == 0
    np.testing.assert_allclose(np.triu(P[:w]), np.triu(qr[:w]), atol=50 * m * EPS * 10)
    np.testing.assert_allclose(tau, tau0, atol=1e3 * EPS)
    # T is LAPACK's dlarft of the same reflectors (the tile kernels' householder_tile)
    _, T_tile = simulate.householder_tile(A.copy(), w)
    np.testing.assert_allclose(T, T_tile, atol=1e4 * m * EPS)


def test_panel_model_float32():
    rng = np.random.default_rng()
    A = rng.standard_normal((300, 32)).astype(np.float32)
    P = A.copy()
    V, tau, T = dp.panel_qr_numpy(P, 64)
    assert P.dtype == V.dtype == tau.dtype == T.dtype == np.float32
    _check_panel(A, P, V, tau, T, 50 * 300 * np.finfo(np.float32).eps)


@pytest.mark.parametrize("scale", [1e-160, 1e-150, 1e150, 1e-300])
def test_panel_model_rescales_out_of_range_columns(scale):
    """Sums of squares outside the norm range take the rescaled pass and still
    give orthogonal reflectors (columns down to 1e-160 occur in rank-deficient
    fronts' contribution blocks)."""
    rng = np.random.default_rng()
    A = rng.standard_normal((200, 16))
    A[:, 3:9] *= scale
    P = A.copy()
    V, tau, T = dp.panel_qr_numpy(P, 64)
    assert np.isfinite(P).all() and np.isfinite(T).all()
    Q = _q_of(V, T)
    assert np.abs(Q.T @ Q - np.eye(200)).max() <= 1e3 * EPS
    # column by column: Qᵀ a_k = r_k to the column's own scale
    R = np.triu(P[:16])
    QA = Q.T @ A
    for k in range(16):
        ck = np.abs(A[:, :k + 1]).max()
        assert np.abs(QA[:16, k] - R[:, k]).max() <= 1e3 * EPS * ck
        assert np.abs(QA[16:, k]).max() <= 1e3 * EPS * ck


def test_panel_model_tiny_and_zero_columns():
    A = np.zeros((50, 6))
    A[0, 0] = 1.0                    # zero below the diagonal: identity, R kept as is
    A[2, 2] = 3.0                    # (column 1 is all zero)
    A[:, 3] = np.random.default_rng().standard_normal(50)
    A[4:, 4] = 1e-295                # norm below NORM_TINY: left alone
    A[:, 5] = np.arange(50.0)
    P = A.copy()
    V, tau, T = dp.panel_qr_numpy(P, 16)
    assert tau[0] == tau[1] == tau[2] == tau[4] == 0 and tau[3] != 0 and tau[5] != 0
    assert P[0, 0] == 1.0 and P[2, 2] == 3.0
    assert np.all(T[4] == 0) and np.all(T[:, 4] == 0)
    Q = _q_of(V, T)
    assert np.abs(Q.T @ Q - np.eye(50)).max() <= 100 * EPS
    np.testing.assert_allclose(np.triu(Q.T @ A)[:6], np.triu(P[:6]), atol=1e-12)


def test_norm_rules_mirror_the_tile_kernels():
    assert (dp.NORM_LO, dp.NORM_HI, dp.NORM_TINY) == \
        (simulate.NORM_LO, simulate.NORM_HI, simulate.NORM_TINY)
    src = (kernels_dir() / "sparse_qr" / "factorize.cuh").read_text()
    f32 = re.search(r"NormRange<float>\s*\{[^}]*LO = ([^,]+)f, HI = ([^,]+)f, TINY = ([^;]+)f;",
                    src)
    assert tuple(float(x) for x in f32.groups()) == dp.NORM_RANGE[np.dtype(np.float32)]


def test_shared_memory_layout_mirrors_the_kernel():
    src = (kernels_dir() / dp.PANEL_FILE).read_text()
    const = {k: int(v) for k, v in re.findall(r"constexpr int (PANEL_\w+) = (\d+);", src)}
    assert const["PANEL_NT"] == dp.PANEL_THREADS
    assert const["PANEL_LD"] == dp._LD and const["PANEL_PART"] == dp._PART
    body = re.search(r"PANEL_EXTRA = (.*?);", src, re.S).group(1)
    body = " ".join(re.sub(r"//[^\n]*", "", body).split())
    body = body.replace("PANEL_NW", str(dp.PANEL_THREADS // 32))
    body = body.replace("PANEL_PART", str(dp._PART))
    assert eval(body) == dp.PANEL_SMEM_EXTRA     # noqa: S307 - integer arithmetic only
    assert dp.panel_smem_bytes(10, 8) == (10 * 33 + dp.PANEL_SMEM_EXTRA) * 8


def test_rows_per_block_plan():
    limit = 227 * 1024
    for m in (1, 31, 32, 64, 65, 1000, 49340, 100000):
        R, nbk = dp.panel_rows_per_block(m, 132, limit, 8)
        assert R >= 32 and nbk <= 132 and (nbk - 1) * R < m <= nbk * R
        assert dp.panel_smem_bytes(R, 8) <= limit
    assert dp.panel_rows_per_block(132 * 900, 132, limit, 8) is None
    assert dp.panel_rows_per_block(132 * 900, 132, limit, 4) is not None


def _check_front(F0, F, panels, T, tol):
    fm, fn = F0.shape
    k = min(fm, fn)
    R = np.triu(F[:k])
    s = max(np.abs(F0).max(), 1)
    np.testing.assert_allclose(R.T @ R, F0.T @ F0, atol=tol * s ** 2)
    d = DenseFront(F, panels, T)
    Y = F0.copy()
    d.apply_qt(Y)
    want = np.zeros_like(F0)
    want[:k] = R
    np.testing.assert_allclose(Y, want, atol=tol * s)
    d.apply_q(Y)
    np.testing.assert_allclose(Y, F0, atol=tol * s)


@pytest.mark.parametrize("fm,fn,nb", [(300, 120, 64), (120, 300, 64), (200, 200, 40),
                                      (150, 70, 256), (90, 33, 32), (64, 64, 7),
                                      (400, 100, 70)])
def test_blocked_panels_match_the_lapack_blocked_qr(fm, fn, nb):
    rng = np.random.default_rng()
    F0, stair = staircase_front(fm, fn, rng, dense_rows=min(fm, 3))
    panels = panels_of(fm, fn, stair, nb)
    F1, F2 = F0.copy(), F0.copy()
    T1 = factorize_numpy(F1, panels, nb)
    T2 = factorize_blocked_numpy(F2, panels, nb, rows_per_block=48)
    tol = 100 * max(fm, fn) * EPS
    _check_front(F0, F2, panels, T2, tol)
    # same reflectors as LAPACK's (same sign convention): R, V and T agree
    np.testing.assert_allclose(F2, F1, atol=tol * 10)
    np.testing.assert_allclose(T2, T1, atol=tol * 10)
    for j, rows, b in panels:
        assert np.all(F2[j + rows:, j:j + b] == 0.0)


# ---------------------------------------------------------------- GPU

def _gpu_panel(A, itemsize_dtype, pad=7):
    """Run the kernel on A (m × w) embedded in a poisoned row-major pool of
    leading dimension w + 5; returns (panel, V, tau, T, pool, Vbuf) on the host."""
    import cupy as cp
    m, w = A.shape
    dt = np.dtype(itemsize_dtype)
    ld = w + 5
    pool = cp.full(pad + m * ld + pad, cp.nan, dtype=dt)
    Fd = pool[pad:pad + m * ld].reshape(m, ld)
    Fd[:, :w] = cp.asarray(A.astype(dt))
    Vbuf = cp.full(w * (m + 3), cp.nan, dtype=dt)
    Vd = Vbuf.reshape(w, m + 3)
    Vd[...] = 0                                  # the caller zeroes V's upper part...
    Vd[:, m:] = cp.nan                           # ...but nothing past its rows
    tau = cp.full(w + 1, cp.nan, dtype=dt)
    T = cp.full((32, 32), cp.nan, dtype=dt)
    k = dp.PanelKernel(dt)
    k.launch(Fd.data.ptr, ld, m, w, Vd.data.ptr, m + 3, tau.data.ptr, T.data.ptr, k.workspace())
    cp.cuda.Device().synchronize()
    got = cp.asnumpy(pool)
    return (got[pad:pad + m * ld].reshape(m, ld), cp.asnumpy(Vd), cp.asnumpy(tau),
            cp.asnumpy(T), got, pad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m,w", [(49340, 32), (5000, 32), (777, 17), (32, 32), (40, 1),
                                 (131 * 64 + 3, 32)])
def test_gpu_panel_kernel_matches_the_model(dtype, m, w):
    rng = np.random.default_rng()
    A = rng.standard_normal((m, w)).astype(dtype)
    Fh, Vd, tau, T, pool, pad = _gpu_panel(A, dtype)
    ld = w + 5
    assert np.isnan(pool[:pad]).all() and np.isnan(pool[pad + m * ld:]).all()
    assert np.isnan(Fh[:, w:]).all()                 # columns right of the panel untouched
    assert np.isnan(Vd[:, m:]).all() and np.isnan(tau[w:]).all()
    P = Fh[:, :w]
    assert np.isfinite(P).all() and np.isfinite(T).all()
    assert np.all(T[w:] == 0) and np.all(T[:, w:] == 0)
    V = Vd[:, :m].T
    eps = np.finfo(dtype).eps
    np.testing.assert_array_equal(np.diag(T)[:w], tau[:w])
    np.testing.assert_array_equal(np.tril(V, -1), np.tril(P, -1))
    np.testing.assert_array_equal(np.diag(V), np.ones(w, dtype))
    assert np.all(np.triu(V, 1) == 0)
    # against LAPACK: R by its Gram matrix, Q orthogonal (applied, not formed)
    A64, P64, V64, T64 = (x.astype(np.float64) for x in (A, P, V, T[:w, :w]))
    R = np.triu(P64[:w])
    tol = 30 * np.sqrt(m) * eps
    s = np.abs(A64).max()
    assert np.abs(R.T @ R - A64.T @ A64).max() <= tol * m * s ** 2
    X = rng.standard_normal((m, 3))
    QtX = X - V64 @ (T64.T @ (V64.T @ X))
    np.testing.assert_allclose(np.linalg.norm(QtX, axis=0), np.linalg.norm(X, axis=0),
                               rtol=tol)
    QtA = A64 - V64 @ (T64.T @ (V64.T @ A64))
    assert np.abs(QtA[:w] - R).max() <= tol * s * 10
    assert np.abs(QtA[w:]).max(initial=0.0) <= tol * s * 10
    # the NumPy model of the same arithmetic (other summation order: rounding only)
    Pm = A.copy()
    Vm, taum, Tm = dp.panel_qr_numpy(Pm, dp.panel_rows_per_block(m, 132, 227 * 1024, 8)[0])
    np.testing.assert_allclose(P64, Pm, atol=tol * s * 10)
    np.testing.assert_allclose(tau[:w], taum, atol=tol * 10)


@pytest.mark.gpu
def test_gpu_panel_kernel_rescaled_and_tiny_columns():
    rng = np.random.default_rng()
    A = rng.standard_normal((3000, 32))
    A[:, 3:9] *= 1e-160
    A[:, 0] = 0.0                    # zero below the diagonal: an identity reflector
    A[0, 0] = 2.0
    A[:, 20] = 1e-295                # stays below NORM_TINY under the reflectors before it
    A[:, 25] *= 1e150
    Fh, Vd, tau, T, pool, pad = _gpu_panel(A, np.float64)
    P = Fh[:, :32]
    assert np.isfinite(P).all() and np.isfinite(T).all()
    Pm = A.copy()
    Vm, taum, Tm = dp.panel_qr_numpy(Pm, 64)
    assert tau[0] == taum[0] == 0 and tau[20] == taum[20] == 0 and P[0, 0] == 2.0
    V = Vd[:, :3000].T
    X = rng.standard_normal((3000, 4))
    QtX = X - V @ (T.T @ (V.T @ X))
    np.testing.assert_allclose(np.linalg.norm(QtX, axis=0), np.linalg.norm(X, axis=0),
                               rtol=1e-12)
    QtA = A - V @ (T.T @ (V.T @ A))
    R = np.triu(P[:32])
    for k in range(32):
        ck = np.abs(A[:, :k + 1]).max()
        assert np.abs(QtA[:32, k] - R[:, k]).max() <= 1e-11 * ck, k
        assert np.abs(QtA[32:, k]).max() <= 1e-11 * ck, k


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", ["kernel", "kernel:noahead", "geqrf", "geqrf:noahead"])
def test_gpu_blocked_qr_by_panel_method(dtype, method):
    import cupy as cp

    from scipy_gpuqr._engine.dense_front import factorize_cupy
    method, _, opt = method.partition(":")
    rng = np.random.default_rng()
    eps = np.finfo(dtype).eps
    for fm, fn, nb in [(3000, 700, 256), (700, 1500, 128), (513, 513, 96), (2000, 257, 70),
                       (5, 3, 256)]:
        F0, stair = staircase_front(fm, fn, rng, dense_rows=3)
        F0 = F0.astype(dtype)
        panels = panels_of(fm, fn, stair, nb)
        pool = cp.full(fm * fn + 11, cp.nan, dtype=dtype)
        pool[5:5 + fm * fn] = cp.asarray(F0.ravel())
        Fd = pool[5:5 + fm * fn].reshape(fm, fn)
        Td = factorize_cupy(Fd, panels, nb, panel_method=method, lookahead=opt != "noahead")
        cp.cuda.Device().synchronize()
        got = cp.asnumpy(pool)
        assert np.isnan(got[:5]).all() and np.isnan(got[5 + fm * fn:]).all()
        F = got[5:5 + fm * fn].reshape(fm, fn).astype(np.float64)
        assert np.isfinite(F).all()
        _check_front(F0.astype(np.float64), F, panels, cp.asnumpy(Td).astype(np.float64),
                     50 * max(fm, fn) * eps)
        if dtype == np.float64:
            F1 = F0.copy()
            T1 = factorize_numpy(F1, panels, nb)
            np.testing.assert_allclose(F, F1, atol=1e-9)
            np.testing.assert_allclose(cp.asnumpy(Td), T1, atol=1e-9)


@pytest.mark.gpu
def test_gpu_panel_method_is_checked():
    import cupy as cp

    from scipy_gpuqr._engine.dense_front import factorize_cupy
    F = cp.zeros((4, 4))
    with pytest.raises(ValueError, match="panel_method"):
        factorize_cupy(F, panels_of(4, 4, None, 2), 2, panel_method="nope")
    k = dp.PanelKernel(np.float64)
    with pytest.raises(ValueError):
        k.launch(F.data.ptr, 4, 4, 33, F.data.ptr, 4, F.data.ptr, F.data.ptr, k.workspace())


@pytest.mark.gpu
def test_gpu_fronts_on_concurrent_streams():
    """Dense fronts run on several side streams at once: their panel kernels
    (grid barriers) and look-ahead streams overlap and stay correct."""
    import cupy as cp

    from scipy_gpuqr._engine.dense_front import factorize_cupy
    rng = np.random.default_rng()
    jobs = []
    for k in range(4):
        fm, fn = (20000, 1200) if k % 2 == 0 else (6000, 900)
        F0, stair = staircase_front(fm, fn, rng, dense_rows=3)
        panels = panels_of(fm, fn, stair, 256)
        jobs.append((F0, panels, cp.asarray(F0), cp.cuda.Stream(non_blocking=True)))
    cp.cuda.Device().synchronize()
    Ts = [factorize_cupy(Fd, panels, 256, stream=s) for _, panels, Fd, s in jobs]
    cp.cuda.Device().synchronize()
    for (F0, panels, Fd, s), Td in zip(jobs, Ts):
        _check_front(F0, cp.asnumpy(Fd), panels, cp.asnumpy(Td), 50 * F0.shape[0] * EPS)
