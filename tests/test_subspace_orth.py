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
