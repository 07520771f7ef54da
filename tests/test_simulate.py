"""The NumPy executor runs the bucket schedule and reproduces dense QR."""

import numpy as np
import pytest

from scipy_gpuqr._engine.host.simulate import (apply_qt_front, execute_launches,
                                          householder_tile)
from scipy_gpuqr._schedule import bucket

EPS = np.finfo(float).eps


def _run(A, nfact=None, stair=None, tile=32, pipelining=True, bundle=3, rng=None):
    fm, fn = A.shape
    tasks, launch, nvt = bucket.dense_front_tasks(fm, fn, nfact, stair, tile=tile,
                                                  pipelining=pipelining, bundle=bundle)
    F = A.ravel().copy()
    VT = np.full(nvt * tile * tile, np.nan)  # poisoned: unused parts never read
    VT[:] = 0.0 if nvt == 0 else np.nan
    execute_launches(tasks, launch, F, VT, tile, rng=rng)
    return tasks, F, VT


def _check(A, tasks, F, VT, tile, nfact=None):
    fm, fn = A.shape
    k = min(fm, fn) if nfact is None else nfact
    Fa = F.reshape(fm, fn)
    assert np.isfinite(Fa).all()
    scale = max(np.linalg.norm(A), 1.0)
    tol = 50 * max(fm, fn) * EPS * scale
    Rn = np.linalg.qr(A, mode="r")
    R = np.triu(Fa[:k])
    s = np.sign(np.diag(R)) * np.sign(np.diag(Rn)[:k])
    s[s == 0] = 1
    assert np.abs(R - s[:, None] * Rn[:k]).max() <= tol
    # Qᵀ through the stored VT tiles and V, applied to A and to b
    B = A.copy()
    apply_qt_front(tasks, F, VT, tile, B)
    E = Fa.copy()
    for j in range(k):
        E[j + 1:, j] = 0.0
    assert np.abs(B - E).max() <= tol
    b = np.random.default_rng(1).standard_normal((fm, 1))
    qtb = b.copy()
    apply_qt_front(tasks, F, VT, tile, qtb)
    Q = np.linalg.qr(A, mode="complete")[0]
    ref = Q.T @ b
    assert np.allclose(qtb[:k, 0], s * ref[:k, 0], atol=tol)
    assert np.isclose(np.linalg.norm(qtb), np.linalg.norm(b))


SHAPES = [(1, 1), (1, 9), (9, 1), (33, 33), (100, 37), (37, 100), (96, 96),
          (130, 70), (70, 130), (257, 65)]


@pytest.mark.parametrize("pipelining", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_dense_fronts(shape, pipelining, rng):
    A = rng.standard_normal(shape)
    tasks, F, VT = _run(A, pipelining=pipelining)
    _check(A, tasks, F, VT, 32)


@pytest.mark.parametrize("tile,bundle", [(8, 2), (16, 3), (64, 3), (16, 4)])
def test_other_tiles_and_bundles(tile, bundle, rng):
    A = rng.standard_normal((150, 90))
    tasks, F, VT = _run(A, tile=tile, bundle=bundle)
    _check(A, tasks, F, VT, tile)


def test_very_tall_and_very_wide(rng):
    for shape in [(2000, 40), (40, 500)]:
        A = rng.standard_normal(shape)
        tasks, F, VT = _run(A)
        _check(A, tasks, F, VT, 32)


def test_pivot_columns_only(rng):
    A = rng.standard_normal((120, 90))
    for nfact in (50, 64, 1):
        tasks, F, VT = _run(A, nfact=nfact, tile=16)
        _check(A, tasks, F, VT, 16, nfact=nfact)


def _staircase_matrix(rng, fm, fn, lead):
    A = rng.standard_normal((fm, fn))
    A[np.arange(fn)[None, :] < lead[:, None]] = 0.0
    stair = np.searchsorted(lead, np.arange(fn), side="right")
    return A, stair


@pytest.mark.parametrize("pipelining", [False, True])
def test_staircase_fronts(pipelining, rng):
    for fm, fn in [(200, 120), (90, 150), (300, 64)]:
        lead = np.sort(rng.integers(0, fn, fm))
        lead[: min(fm, fn) // 4] = 0
        A, stair = _staircase_matrix(rng, fm, fn, lead)
        tasks, F, VT = _run(A, stair=stair, tile=16, pipelining=pipelining)
        _check(A, tasks, F, VT, 16)


def test_structurally_rank_deficient_staircase(rng):
    # rows start late: some diagonal tiles are empty in their column tile
    fm, fn = 80, 60
    lead = np.sort(np.concatenate([np.zeros(5, int), rng.integers(30, 60, fm - 5)]))
    A, stair = _staircase_matrix(rng, fm, fn, lead)
    tasks, F, VT = _run(A, stair=stair, tile=8)
    _check(A, tasks, F, VT, 8)


def test_launch_order_does_not_matter(rng):
    A = rng.standard_normal((200, 150))
    _, F1, _ = _run(A, tile=16)
    _, F2, _ = _run(A, tile=16, rng=np.random.default_rng(7))
    assert F1.tobytes() == F2.tobytes()


def test_householder_tile_compact_wy(rng):
    A = rng.standard_normal((40, 8))
    A0 = A.copy()
    _, T = householder_tile(A, 8)
    V = np.tril(A, -1)
    V[np.arange(8), np.arange(8)] = 1
    Q = np.eye(40) - V @ T @ V.T
    assert np.allclose(Q.T @ Q, np.eye(40))
    assert np.allclose(Q.T @ A0, np.triu(A[:8]).tolist() + [[0] * 8] * 32)


def _scaled_columns(rng, m, n):
    """Random m×n columns at 1, 1e-160 (squares below the normal range), 1e160
    (squares overflow) and 1e-300 (left alone) scales."""
    A = rng.standard_normal((m, n))
    A[:, 1::4] *= 1e-160
    A[:, 2::4] *= 1e160
    A[:, 3] *= 1e-300
    return A


def test_householder_tile_keeps_reflectors_orthogonal_at_extreme_scales(rng):
    # the plain sum of squares of a 1e-160 column underflows: its reflector then
    # was not orthogonal (‖QᵀQ - I‖ 2e-5 seen in a grid 32³ front), and every
    # column it was applied to lost accuracy
    A = _scaled_columns(rng, 64, 32)
    A0 = A.copy()
    tau, T = householder_tile(A, 32)
    V = np.tril(A, -1)
    V[np.arange(32), np.arange(32)] = 1
    Q = np.eye(64) - V @ T @ V.T
    assert np.abs(Q.T @ Q - np.eye(64)).max() <= 20 * EPS * 64
    R = np.triu(A[:32])
    colnorm = np.linalg.norm(A0, axis=0)
    assert np.all(np.linalg.norm(Q.T[:32] @ A0 - R, axis=0) <= 100 * EPS * colnorm)
    assert tau[3] == 0.0            # a 1e-300 column: no reflector
    assert np.isfinite(T).all()


@pytest.mark.parametrize("pipelining", [False, True])
def test_front_with_tiny_columns_keeps_its_norms(pipelining, rng):
    # ‖R x‖ = ‖A x‖ for all x when Q is orthogonal: a tiny early column must not
    # spoil the later, normal-sized ones
    fm, fn = 150, 90
    A = rng.standard_normal((fm, fn))
    A[:, 3:40:5] *= 1e-160
    tasks, F, VT = _run(A, tile=16, pipelining=pipelining)
    R = np.triu(F.reshape(fm, fn)[:fn])
    X = rng.standard_normal((fn, 4))
    X[3:40:5] = 0.0                 # probes of the normal-sized columns
    rel = np.abs(np.linalg.norm(R @ X, axis=0) / np.linalg.norm(A @ X, axis=0) - 1)
    assert rel.max() <= 1e3 * EPS
