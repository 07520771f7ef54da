"""The tensor-core Apply's fragment bookkeeping (``apply_chunk_mma_blocked`` in
``kernels/sparse_qr/apply.cuh``, the uberkernel's ``mma-async-lean`` Apply), on the CPU.

Each warp-wide ``mma.sync.m8n8k4.f64`` is emulated from what every lane
supplies (lane ``4g + q`` holds ``A[g][q]``, ``B[q][g]`` and ``D[g][2q..2q+1]``,
PTX's fragment layout), with the kernel's index expressions for the shared
arrays (padded row strides ``LD`` = ``LDW``), and the chunk's result is compared with
the scalar Apply ``A - V (Tᵀ (Vᵀ A))`` on V/T shaped as the kernel loads them
(V unit lower in the top tile and zero right of ``nref``, T upper of ``nref``
columns). This checks the tiling, the operand roles, the padded strides and
the products' structural skips, not the hardware (nor the cp.async copy of
the next chunk).
"""

from __future__ import annotations

import numpy as np
import pytest

TILE = W = 32


def _dmma(d, a, b):
    """One m8n8k4 step: ``a``/``b`` per lane (32,), ``d`` per lane (32, 2)."""
    g = np.arange(32) >> 2
    q = np.arange(32) & 3
    Am = np.zeros((8, 4))
    Bm = np.zeros((4, 8))
    Am[g, q] = a
    Bm[q, g] = b
    P = Am @ Bm
    d[:, 0] += P[g, 2 * q]
    d[:, 1] += P[g, 2 * q + 1]


LDP = TILE + 4          # the kernel's padded row strides LD = LDW (4 mod 16)


def _chunk_blocked(V, Tm, A, C, M, nref):
    """The kernel's apply_chunk_mma_blocked on flat shared arrays (strides LDP)."""
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    na = M >> 5
    kr = (nref + 3) & ~3
    acc, cs = {}, {}
    for warp in range(8):
        I, j0 = warp >> 1, (warp & 1) * 16
        for u in range(na):
            a = ((I * na + u) * 8 + g) * LDP + j0 + 2 * q
            acc[warp, u] = [np.stack([A[a], A[a + 1]], axis=1),
                            np.stack([A[a + 8], A[a + 9]], axis=1)]
        c = [np.zeros((32, 2)), np.zeros((32, 2))]
        if I * 8 < nref:
            for k0 in range(I * 8, M, 4):
                a = V[(k0 + q) * LDP + I * 8 + g]
                _dmma(c[0], a, A[(k0 + q) * LDP + j0 + g])
                _dmma(c[1], a, A[(k0 + q) * LDP + j0 + g + 8])
        cs[warp] = c
    for warp, c in cs.items():                       # all warps write, then barrier
        I, j0 = warp >> 1, (warp & 1) * 16
        r = (I * 8 + g) * LDP + j0 + 2 * q
        C[r], C[r + 1], C[r + 8], C[r + 9] = c[0][:, 0], c[0][:, 1], c[1][:, 0], c[1][:, 1]
    for warp in range(8):
        I, j0 = warp >> 1, (warp & 1) * 16
        c = [np.zeros((32, 2)), np.zeros((32, 2))]
        for k0 in range(0, min((I + 1) * 8, kr), 4):
            a = -Tm[(k0 + q) * LDP + I * 8 + g]
            _dmma(c[0], a, C[(k0 + q) * LDP + j0 + g])
            _dmma(c[1], a, C[(k0 + q) * LDP + j0 + g + 8])
        cs[warp] = c
    for warp, c in cs.items():                       # barrier, write, barrier
        I, j0 = warp >> 1, (warp & 1) * 16
        r = (I * 8 + g) * LDP + j0 + 2 * q
        C[r], C[r + 1], C[r + 8], C[r + 9] = c[0][:, 0], c[0][:, 1], c[1][:, 0], c[1][:, 1]
    out = np.full((M, W), np.nan)
    for warp in range(8):
        I, j0 = warp >> 1, (warp & 1) * 16
        for k0 in range(0, kr, 4):
            b0 = C[(k0 + q) * LDP + j0 + g]
            b1 = C[(k0 + q) * LDP + j0 + g + 8]
            for u in range(na):
                a = V[((I * na + u) * 8 + g) * LDP + q + k0]
                _dmma(acc[warp, u][0], a, b0)
                _dmma(acc[warp, u][1], a, b1)
        for u in range(na):
            i = (I * na + u) * 8 + g
            c = j0 + 2 * q
            out[i, c], out[i, c + 1] = acc[warp, u][0][:, 0], acc[warp, u][0][:, 1]
            out[i, c + 8], out[i, c + 9] = acc[warp, u][1][:, 0], acc[warp, u][1][:, 1]
    return out


def _operands(rng, na, nref):
    M = na * TILE
    Vd = np.tril(rng.standard_normal((M, TILE)), -1)
    Vd[np.arange(TILE), np.arange(TILE)] = 1.0
    Vd[TILE:] = rng.standard_normal((M - TILE, TILE))
    Vd[:, nref:] = 0.0
    Td = np.triu(rng.standard_normal((TILE, TILE)))
    Td[:, nref:] = 0.0
    Ad = rng.standard_normal((M, W))
    return M, Vd, Td, Ad


@pytest.mark.parametrize("na,nref", [(1, 32), (2, 32), (3, 32), (3, 17), (2, 1), (1, 5),
                                     (3, 9), (2, 30)])
def test_blocked_mma_chunk_matches_the_scalar_apply(na, nref):
    rng = np.random.default_rng()
    M, Vd, Td, Ad = _operands(rng, na, nref)
    want = Ad - Vd @ (Td.T @ (Vd.T @ Ad))
    V = np.full(M * LDP, np.nan)                 # padding columns never read
    Tm = np.full(TILE * LDP, np.nan)
    A = np.full(M * LDP, np.nan)
    for i in range(M):
        V[i * LDP:i * LDP + TILE] = Vd[i]
        A[i * LDP:i * LDP + W] = Ad[i]
    for i in range(TILE):
        Tm[i * LDP:i * LDP + TILE] = Td[i]
    C = np.full(TILE * LDP, np.nan)
    got = _chunk_blocked(V, Tm, A, C, M, nref)
    np.testing.assert_allclose(got, want, atol=1e-12 * max(1.0, np.abs(want).max()))


def test_blocked_mma_fragment_loads_are_conflict_free():
    # 8-byte shared loads go by half-warps: the 16 lanes of each must hit 16
    # distinct 8-byte bank pairs, for the transposed (row k0+q, column g) and
    # the direct (row g, column q) fragment patterns the blocked chunk uses
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    for addr in (q * LDP + g, g * LDP + q):
        for half in (lane < 16, lane >= 16):
            assert len(set((addr[half] % 16).tolist())) == 16


def test_every_apply_variant_compiles():
    # build_kernels.py --check compiles the engine's (default) variants; the
    # others, chosen through SCIPY_GPUQR_APPLY, are compiled here
    pytest.importorskip("cupy", reason="NVRTC check needs the kernel-check extra")
    from scipy_gpuqr._engine.gpu import factorize_kernels as fk
    from scipy_gpuqr._kernels import _compile_one
    names = []
    for a in sorted(set(fk.APPLY_VARIANTS.values())):
        names += [fk.kernel_name("double", 32, 3, fk.ENGINE_THREADS, a),
                  fk.smem_kernel_name("double", 32, 3, a)]
    try:
        r = _compile_one(fk.UBERKERNEL_FILE, "sm_80", tuple(names))
    except Exception as exc:  # noqa: BLE001 - no NVRTC library on this machine
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert r["ok"], r["log"]
