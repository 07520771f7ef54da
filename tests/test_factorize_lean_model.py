"""The lean Factorize's order of work (``factorize_columns_lean`` and the
row-per-thread T of ``factorize_bundle<..., KIND 1>`` in
``kernels/sparse_qr/factorize.cuh``) and the lane-per-column one
(``factorize_columns_lanes``, KIND 2: each warp's rows summed in order, the
warps' partials in warp order, V scaled in place before w) and that one with
the tile in registers (``factorize_columns_regs``, KIND 3: the same bits as
KIND 2), on the CPU.

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
    norm ``xnorm`` of the rest, as both kernels form it: ``tau = 0`` (the column
    left alone) below NORM_TINY."""
    nrm = float(np.hypot(alpha, xnorm)) if xnorm > 0.0 else 0.0
    if nrm < NORM_TINY:
        return 0.0, 0.0, None
    beta = -nrm if alpha >= 0.0 else nrm
    return (beta - alpha) / beta, 1.0 / (alpha - beta), beta


def _lean(A, nref):
    """The kernel's phases on the stacked tile ``A`` (M × TILE), in place."""
    M = A.shape[0]
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


def _lanes(A, nref, NW=8):
    """``factorize_columns_lanes`` on the stacked tile ``A`` (M × TILE), in place:
    a lane per column, warp ``w`` owning rows ``w, w + NW, ...``; each warp's
    partial sums in its row order, the warps' partials added in warp order."""
    M = A.shape[0]
    tau = np.zeros(TILE)
    rows = [np.arange(w, M, NW) for w in range(NW)]

    def seq(vals):                      # a lane's sequential sum
        s = 0.0
        for x in vals:
            s += x
        return s

    for k in range(nref):
        ssw = [seq(A[i, k] * A[i, k] for i in rows[w] if i > k) for w in range(NW)]
        mxw = [max([abs(A[i, k]) for i in rows[w] if i > k], default=0.0) for w in range(NW)]
        ss, m = seq(ssw), max(mxw)
        alpha = A[k, k]
        xnorm = 0.0 if m == 0.0 else float(np.sqrt(ss))
        if not (m == 0.0 or NORM_LO <= ss <= NORM_HI):
            qw = [seq((A[i, k] / m) * (A[i, k] / m) for i in rows[w] if i > k)
                  for w in range(NW)]
            xnorm = m * float(np.sqrt(seq(qw)))
        tk, scale, beta = _reflector(alpha, xnorm)
        if tk != 0.0:
            A[k + 1:, k] *= scale
            A[k, k] = beta
        tau[k] = tk
        if tk != 0.0:
            wp = np.zeros((NW, TILE))
            for w in range(NW):
                for i in rows[w]:
                    if i == k:
                        wp[w] += A[k]
                    elif i > k:
                        wp[w] += A[i, k] * A[i]
            wj = np.zeros(TILE)
            for w in range(NW):
                wj += wp[w]
            wj *= tk
            A[k, k + 1:] -= wj[k + 1:]
            A[k + 1:, k + 1:] -= np.outer(A[k + 1:, k], wj[k + 1:])
    return tau, _row_per_thread_T(A, tau, nref)


def _regs(A, nref, NW=8, BUNDLE=3):
    """``factorize_columns_regs`` on the stacked tile ``A`` (M × TILE), in place: the
    kernel's registers ``a[w][r][j] = A[w + NW r][j]`` (zeros from row M on) with its
    predicates, lane k's values read by the other lanes as its shuffles; written
    back into ``A`` at the end."""
    M = A.shape[0]
    R = BUNDLE * TILE // NW
    a = np.zeros((NW, R, TILE))
    idx = np.arange(NW)[:, None] + NW * np.arange(R)[None, :]      # row of (w, r)
    a[idx < M] = A[idx[idx < M]]
    tau = np.zeros(TILE)
    lanes = np.arange(TILE)

    def partials(c):
        ssw, mxw, alpha = [], [], None
        for w in range(NW):
            p = mx = 0.0
            for r in range(R):
                i = idx[w, r]
                if i < M:
                    if i > c:
                        p += a[w, r, c] * a[w, r, c]
                        mx = max(mx, abs(a[w, r, c]))
                    elif i == c:
                        alpha = a[w, r, c]
            ssw.append(p)
            mxw.append(mx)
        return ssw, mxw, alpha

    P = partials(0) if nref > 0 else None
    for k in range(nref):
        ssw, mxw, alpha = P
        ss = m = 0.0
        for w in range(NW):
            ss += ssw[w]
            m = max(m, mxw[w])
        xnorm = 0.0 if m == 0.0 else float(np.sqrt(ss))
        if not (m == 0.0 or NORM_LO <= ss <= NORM_HI):
            sq = 0.0
            for w in range(NW):
                q = 0.0
                for r in range(R):
                    if M > idx[w, r] > k:
                        x = a[w, r, k] / m
                        q += x * x
                sq += q
            xnorm = m * float(np.sqrt(sq))
        tk, scale, beta = _reflector(alpha, xnorm)
        if tk != 0.0:
            for w in range(NW):
                for r in range(R):
                    if M > idx[w, r] > k:
                        a[w, r, k] *= scale
                    elif idx[w, r] == k:
                        a[w, r, k] = beta
        tau[k] = tk
        if tk != 0.0:
            Y = np.zeros((NW, TILE))
            for w in range(NW):
                wp = np.zeros(TILE)
                for r in range(R):
                    i, v = idx[w, r], a[w, r, k]            # v: lane k's, shuffled
                    if i == k:
                        wp += a[w, r]
                    elif M > i > k:
                        wp += v * a[w, r]
                Y[w] = wp
            wj = np.zeros(TILE)
            for w in range(NW):
                wj += Y[w]
            wj *= tk
            upd = lanes > k
            for w in range(NW):
                for r in range(R):
                    i, v = idx[w, r], a[w, r, k]
                    if i == k:
                        a[w, r, upd] -= wj[upd]
                    elif M > i > k:
                        a[w, r, upd] -= v * wj[upd]
        if k + 1 < nref:
            P = partials(k + 1)
    A[idx[idx < M]] = a[idx < M]
    return tau, _row_per_thread_T(A, tau, nref)


def test_registers_loop_gives_the_lanes_loop_bits():
    # factorize_columns_regs keeps factorize_columns_lanes' order of work exactly
    rng = np.random.default_rng(5)
    for M, nref in [(96, 32), (64, 32), (32, 9), (96, 1)]:
        A0 = rng.standard_normal((M, TILE))
        A0[:, 3::7] *= 1e-160
        A0[:, [2]] = 0.0
        x, y = A0.copy(), A0.copy()
        with np.errstate(over="ignore"):
            tau_l, T_l = _lanes(x, nref)
            tau_r, T_r = _regs(y, nref)
        assert np.array_equal(x, y) and np.array_equal(tau_l, tau_r) and np.array_equal(T_l, T_r)


@pytest.mark.parametrize("model", [_lean, _lanes, _regs])
@pytest.mark.parametrize("M,nref,kind", [(96, 32, "plain"), (64, 32, "plain"), (32, 32, "plain"),
                                         (96, 17, "plain"), (96, 1, "plain"), (64, 32, "scaled"),
                                         (96, 32, "zeros"), (32, 9, "scaled")])
def test_lean_factorize_matches_the_numpy_executor(M, nref, kind, model):
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
        tau_g, T_g = model(got, nref)
    scale = np.maximum(np.abs(A0).max(axis=0), np.abs(want).max(axis=0))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(tau_g[:nref], tau_w, rtol=1e-12, atol=1e-15)
    assert (np.abs(got - want) <= 1e-12 * np.maximum(scale, 1e-300)[None, :] * 10).all()
    np.testing.assert_allclose(T_g[:nref, :nref], T_w, rtol=1e-10, atol=1e-12)
