"""The subspace iteration's thin QRs (``subspace_cod.orth_r``): a well-conditioned
pass applies its factor's inverse by GEMM, an ill-conditioned first pass solves with
it; both leave Q orthonormal and ``Q T = Y`` to rounding (CPU)."""

import numpy as np
import pytest
import scipy.linalg as la

from scipy_gpuqr._factor import subspace_cod as C
from scipy_gpuqr._factor.host_lanes import SERIAL, host_lanes


def _block(rng, q, p, cond):
    """q × p with columns of very different lengths, condition ``cond`` once scaled."""
    U, _ = np.linalg.qr(rng.standard_normal((q, p)))
    V, _ = np.linalg.qr(rng.standard_normal((p, p)))
    Y = (U * np.geomspace(1.0, 1.0 / cond, p)) @ V.T
    return np.asfortranarray(Y * np.geomspace(1e-6, 1e6, p))


@pytest.mark.parametrize("cond", [2.0, 50.0, 1e5])
@pytest.mark.parametrize("lanes", [1, 2])
def test_orth_r_orthonormal_and_exact(cond, lanes):
    rng = np.random.default_rng(int(cond) + lanes)
    Y = _block(rng, 3000, 40, cond)
    with host_lanes(True, lanes) as ln:
        Q, T = C.orth_r(Y, ln)
    assert np.abs(Q.T @ Q - np.eye(40)).max() < 1e-13
    assert np.linalg.norm(Q @ T - Y, axis=0).max() <= 1e-13 * np.linalg.norm(Y, axis=0).max()
    assert np.allclose(np.tril(T, -1), 0.0)


def test_times_inverse_is_the_triangular_solve():
    rng = np.random.default_rng(3)
    Y = rng.standard_normal((2000, 30))
    U = la.cholesky(Y.T @ Y / 2000)
    s = np.geomspace(1e-3, 1e3, 30)
    ref = la.solve_triangular(U * s, Y.T, trans=1).T      # Y (U D)⁻¹
    got = C._times_inverse(U, Y, SERIAL, s)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(C._times_inverse(U, Y, SERIAL),
                               la.solve_triangular(U, Y.T, trans=1).T, rtol=1e-12, atol=1e-12)


def test_triangular_factor_hands_its_gram_to_orth_r(monkeypatch):
    """An ill-conditioned block's Gram matrix is formed once (triangular_factor's
    Cholesky goes to orth_r)."""
    Y = _block(np.random.default_rng(4), 2000, 30, 1e5)
    calls = []
    real = C._scaled_cholesky
    monkeypatch.setattr(C, "_scaled_cholesky", lambda *a: calls.append(1) or real(*a))
    T = C.triangular_factor(Y)
    assert len(calls) == 1
    np.testing.assert_allclose(np.abs(T), np.abs(la.qr(Y, mode="r")[0][:30]), rtol=1e-8,
                               atol=1e-8 * np.abs(T).max())


def _estimate(Y):
    """The 1-norm condition estimate of the unit-scaled block (None: its Gram
    matrix not positive definite)."""
    f = C._scaled_cholesky(Y)
    return None if f is None else C._cond_upper(f[0])


@pytest.mark.parametrize("cond", [2.0, 1e3, 1e7, 1e9])
def test_orth_deferred_leaves_the_factor_to_the_caller(cond):
    """A well-conditioned block comes back as it is with ``M`` (``Y M`` orthonormal, M
    upper triangular: orth_r's one pass without its q × p product); ``rough``: one up
    to ROUGH_COND as that pass's product ``Y M`` (orthogonality lost to about
    ``eps·cond²``, the loss it reports, Y's span kept); a worse one, or any beyond
    GRAM_COND without ``rough``, as orth_r's Q."""
    Y = _block(np.random.default_rng(int(cond) % 1000), 3000, 40, cond)
    estimate = _estimate(Y)
    X, M, loss = C._orth_deferred(Y, SERIAL, rough=True)
    if cond != 2.0:             # not rough: orth_r's Q beyond GRAM_COND
        X2, M2, loss2 = C._orth_deferred(Y, SERIAL)
        assert M2 is None and loss2 == C.EPS
        np.testing.assert_array_equal(X2, C.orth_r(Y, inverse_first=True)[0])
    if cond == 2.0:
        assert estimate <= C.GRAM_COND and loss <= C.SETTLE_LOSS
        assert X is Y and M is not None and np.allclose(np.tril(M, -1), 0.0)
        Q = X @ M
        np.testing.assert_allclose(Q, C.orth_r(Y)[0], rtol=0, atol=1e-13)
        assert np.abs(Q.T @ Q - np.eye(40)).max() < 1e-13
        return
    assert M is None
    if cond == 1e3:
        assert C.GRAM_COND < estimate <= C.ROUGH_COND
        assert loss == pytest.approx(C.EPS * estimate ** 2) and loss > C.SETTLE_LOSS
        assert 1e-14 < np.abs(X.T @ X - np.eye(40)).max() <= loss
        Qs = C.orth_r(Y)[0]
        assert np.linalg.norm(X - Qs @ (Qs.T @ X), 2) < 1e-10
    else:
        assert (estimate is None or estimate > C.ROUGH_COND) and loss == C.EPS
        assert np.abs(X.T @ X - np.eye(40)).max() < 1e-13


@pytest.mark.parametrize("cond", [2.0, 1e3, 1e7])
def test_rough_factor_one_pass_up_to_its_bound(cond):
    """``_rough_factor``: triangular_factor's T bit for bit within GRAM_COND; ``rough``:
    one Cholesky pass up to ROUGH_COND (the unit-scaled block's singular values to its
    reported loss, ``eps·cond²``, relative), without it triangular_factor's two passes;
    orth_r's factor beyond."""
    Y = _block(np.random.default_rng(9), 2000, 30, cond)
    T, loss = C._rough_factor(Y, SERIAL, rough=True)
    estimate = _estimate(Y)
    if cond == 2.0:
        assert estimate <= C.GRAM_COND and loss <= C.SETTLE_LOSS
        assert np.array_equal(T, C.triangular_factor(Y))
    elif cond == 1e3:
        assert C.GRAM_COND < estimate <= C.ROUGH_COND
        assert loss == pytest.approx(C.EPS * estimate ** 2) and loss > C.SETTLE_LOSS
        s = np.linalg.norm(Y, axis=0)
        np.testing.assert_allclose(la.svdvals(T / s), la.svdvals(Y / s), rtol=loss)
        # not rough (the iteration after its first step): triangular_factor's two passes
        T2, loss2 = C._rough_factor(Y, SERIAL)
        assert loss2 == C.EPS and np.array_equal(T2, C.triangular_factor(Y))
    else:
        assert estimate > C.ROUGH_COND and loss == C.EPS
        assert np.array_equal(T, C.orth_r(Y, want_q=False)[1])


@pytest.mark.parametrize("lanes", [1, 2])
def test_small_subspace_same_with_the_factor_deferred(monkeypatch, lanes):
    """The iteration with the one-pass factors folded into the next rotation (and the
    first steps' ill-conditioned blocks factored by one pass, ROUGH_COND) against the
    same iteration with every block orthonormalized explicitly: the same steps, count
    under the cutoff, Ritz values to 1e-10 and subspaces (vectors to 3e-7: the rough
    passes move the first blocks by eps·cond, and the converged subspace moves within
    the iteration's own spread, 7.6e-8–1.2e-7 here between two seeds; images)."""
    from test_sparse_subspace import _gapless_sparse_r
    from scipy_gpuqr._factor.sparse_subspace import chunked
    from scipy_gpuqr._factor.triangular import UpperTriangular
    import scipy.sparse as sp
    R = _gapless_sparse_r(np.random.default_rng(5), tiny=24)
    q = R.shape[0]
    tol = np.finfo(np.float64).eps * q * C.sigma_max_lanczos(R)
    up, low = UpperTriangular(R), UpperTriangular(sp.csc_array(R.T))
    got, deferred = {}, []
    real = C._orth_deferred

    def spy(Y, ln, **kw):
        out = real(Y, ln, **kw)
        deferred.append(out[1] is not None)
        return out
    monkeypatch.setattr(C, "_orth_deferred", spy)
    for way in ("deferred", "explicit"):
        if way == "explicit":
            monkeypatch.setattr(C, "_orth_deferred",
                                lambda Y, ln, **kw: (C.orth_r(Y, ln)[0], None, C.EPS))
        with host_lanes(True, lanes) as ln:
            got[way] = C.small_subspace(chunked(up.solve, lanes=ln), chunked(low.solve, lanes=ln),
                                        q, tol, block=16, max_block=q // 3, seed=3, lanes=ln)
    a, b = got["deferred"], got["explicit"]
    assert sum(deferred) >= 2 and a.locked           # deferred steps, locking among them
    assert (a.steps, a.block, a.locked) == (b.steps, b.block, b.locked)
    d = int(np.count_nonzero(b.ritz <= tol))
    assert 0 < d == int(np.count_nonzero(a.ritz <= tol))
    window = b.ritz <= 1.25 * tol
    np.testing.assert_allclose(a.ritz[window], b.ritz[window], rtol=1e-10)
    assert np.abs(a.vectors.T @ a.vectors - np.eye(a.vectors.shape[1])).max() < 1e-12
    # the same subspace of the vectors under the cutoff, and the same images
    Va, Vb = a.vectors[:, :d], b.vectors[:, :d]
    assert np.linalg.norm(Va - Vb @ (Vb.T @ Va), 2) < 3e-7
    Ia, Ib = a.images, b.images
    np.testing.assert_allclose(np.linalg.norm(Ia, axis=0), np.linalg.norm(Ib, axis=0), rtol=1e-8)


@pytest.mark.parametrize("cond", [2.0, 1e5, 1e12])
def test_orth_r_without_q_gives_the_same_factor(cond):
    """``want_q=False``: the same T, bit for bit (one pass, two passes, Householder up
    to the signs LAPACK gives either way), without the last q × p product."""
    Y = _block(np.random.default_rng(7), 2000, 30, cond)
    Q, T = C.orth_r(Y)
    none, T2 = C.orth_r(Y, want_q=False)
    assert none is None
    if cond < 1e10:
        assert np.array_equal(T, T2)
    else:                                   # Householder: T's rows up to sign
        np.testing.assert_allclose(np.abs(T2), np.abs(T), rtol=1e-12, atol=1e-12 * np.abs(T).max())


def test_orth_r_inverse_first_spans_y():
    """An ill-conditioned block's first pass by the factor's inverse (GEMM): Q
    orthonormal, and its span Y's to ``eps·cond``."""
    Y = _block(np.random.default_rng(8), 3000, 40, 1e5)
    Q, _ = C.orth_r(Y, inverse_first=True)
    assert np.abs(Q.T @ Q - np.eye(40)).max() < 1e-13
    Qs, _ = C.orth_r(Y)
    assert np.linalg.norm(Q - Qs @ (Qs.T @ Q), 2) < 1e-9
