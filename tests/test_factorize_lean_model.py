"""The lean Factorize's order of work (``factorize_columns_lean`` and the
row-per-thread T of ``factorize_bundle<..., KIND 1>`` in
``kernels/sparse_qr/factorize.cuh``), on the CPU.

Each barrier-separated phase of the kernel is one NumPy step here, with the
kernel's index ranges: the reflector formed from the block's partial sums
(the scaled second pass where the sum of squares leaves the normal range),
``w`` and the update with ``v = scale * A[i, k]``, column ``k`` scaled into V
only at the start of column ``k + 1`` (the last one after the loop), and T a
row at a time from that row's own earlier entries. The result must be the NumPy executor's
(``householder_tile``): same R, V, tau and T to rounding. This checks the
reordering, not the hardware.
"""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._engine.host.simulate import householder_tile

TILE = 32
NORM_LO, NORM_HI, NORM_TINY = 1e-280, 1e280, 1e-290


def _reflector(alpha, xnorm):
    """``(tau, scale, beta)`` of column k's reflector from its head ``alpha`` and the
    norm ``xnorm`` of the rest, as the kernel forms it: ``tau = 0`` (the column
    left alone) below NORM_TINY."""
    nrm = float(np.hypot(alpha, xnorm)) if xnorm > 0.0 else 0.0
    if nrm < NORM_TINY:
        return 0.0, 0.0, None
    beta = -nrm if alpha >= 0.0 else nrm
    return (beta - alpha) / beta, 1.0 / (alpha - beta), beta


def _lean(A, nref):
    """The kernel's phases on the stacked tile ``A`` (M × TILE), in place."""
    tau = np.zeros(TILE)
    prev = 0.0
    for k in range(nref):
        if prev != 0.0:
            A[k:, k - 1] *= prev
        alpha = A[k, k]
        x = A[k + 1:, k]
        ss = float(x @ x)
        m = float(np.abs(x).max()) if x.size else 0.0
        xnorm = 0.0 if m == 0.0 else float(np.sqrt(ss))
        if not (m == 0.0 or NORM_LO <= ss <= NORM_HI):
            xs = x / m
            xnorm = m * float(np.sqrt(xs @ xs))
        tk, scale, beta = _reflector(alpha, xnorm)
        if tk != 0.0:
            A[k, k] = beta
        tau[k] = tk
        prev = scale if tk != 0.0 else 0.0
        if tk != 0.0:
            w = (scale * A[k + 1:, k]) @ A[k + 1:, k + 1:]
            Y = tk * (w + A[k, k + 1:])
            v = np.concatenate([[1.0], scale * A[k + 1:, k]])
            A[k:, k + 1:] -= np.outer(v, Y)
    if prev != 0.0:
        A[nref:, nref - 1] *= prev
    return tau, _row_per_thread_T(A, tau, nref)


def _row_per_thread_T(A, tau, nref):
    """Y[a][b] = V[:, a]ᵀ V[:, b] (a < b), then T a row per thread."""
    Yg = np.zeros((TILE, TILE))
    for a in range(nref):
        for b in range(a + 1, nref):
            Yg[a, b] = A[b, a] + A[b + 1:, a] @ A[b + 1:, b]
    T = np.zeros((TILE, TILE))
    for row in range(nref):
        T[row, row] = tau[row]
        for k in range(row + 1, nref):
            s = 0.0
            if tau[k] != 0.0:
                for l in range(row, k):
                    s += T[row, l] * Yg[l, k]
            T[row, k] = -tau[k] * s
    return T


@pytest.mark.parametrize("M,nref,kind", [(96, 32, "plain"), (64, 32, "plain"), (32, 32, "plain"),
                                         (96, 17, "plain"), (96, 1, "plain"), (64, 32, "scaled"),
                                         (96, 32, "zeros"), (32, 9, "scaled")])
def test_lean_factorize_matches_the_numpy_executor(M, nref, kind):
    rng = np.random.default_rng()
    A0 = rng.standard_normal((M, TILE))
    if kind == "scaled":                      # squares below and above the normal range
        A0[:, 3::7] *= 1e-160
        A0[:, 5::11] *= 1e160
    elif kind == "zeros":                     # identity reflectors (tau = 0) on the way
        A0[:, [2, 7]] = 0.0
        A0[4:, 11] = 0.0
    want, got = A0.copy(), A0.copy()
    with np.errstate(over="ignore"):          # squares of 1e160: the rescaled pass
        tau_w, T_w = householder_tile(want, nref)
        tau_g, T_g = _lean(got, nref)
    scale = np.maximum(np.abs(A0).max(axis=0), np.abs(want).max(axis=0))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(tau_g[:nref], tau_w, rtol=1e-12, atol=1e-15)
    assert (np.abs(got - want) <= 1e-12 * np.maximum(scale, 1e-300)[None, :] * 10).all()
    np.testing.assert_allclose(T_g[:nref, :nref], T_w, rtol=1e-10, atol=1e-12)
