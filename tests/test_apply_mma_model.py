"""The tensor-core Apply's fragment bookkeeping (``apply_chunk_mma`` in
``kernels/sparse_qr/apply.cuh``, compiled with ``GPUQR_APPLY_MMA=1``), on the CPU.

Each warp-wide ``mma.sync.m8n8k4.f64`` is emulated from what every lane
supplies (lane ``4g + q`` holds ``A[g][q]``, ``B[q][g]`` and ``D[g][2q..2q+1]``,
PTX's fragment layout), with the kernel's index expressions for the shared
arrays (row strides ``LD``/``LDW``), and the chunk's result is compared with
the scalar Apply ``A - V (Tᵀ (Vᵀ A))`` on V/T shaped as the kernel loads them
(V unit lower in the top tile and zero right of ``nref``, T upper of ``nref``
columns). This checks the tiling and the operand roles, not the hardware.
"""

from __future__ import annotations

import numpy as np
import pytest

TILE = W = 32
LD = LDW = TILE + 1
NT = 256


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


def _chunk(V, Tm, A, C, M):
    """The kernel's apply_chunk_mma on flat shared arrays; returns out[i, j] (M × W)."""
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    nw = NT // 32
    tpw = 16 // nw
    d = {}
    for warp in range(nw):
        for u in range(tpw):
            tile = warp + u * nw
            i = (tile >> 2) * 8 + g
            j = (tile & 3) * 8
            acc = np.zeros((32, 2))
            for k0 in range(0, M, 4):
                _dmma(acc, V[(k0 + q) * LD + i], A[(k0 + q) * LDW + j + g])
            d[warp, u] = acc
    for (warp, u), acc in d.items():
        tile = warp + u * nw
        i = (tile >> 2) * 8 + g
        j = (tile & 3) * 8 + 2 * q
        C[i * LDW + j] = acc[:, 0]
        C[i * LDW + j + 1] = acc[:, 1]
    d = {}
    for warp in range(nw):
        for u in range(tpw):
            tile = warp + u * nw
            i = (tile >> 2) * 8 + g
            j = (tile & 3) * 8
            acc = np.zeros((32, 2))
            for k0 in range(0, TILE, 4):
                _dmma(acc, Tm[(k0 + q) * LD + i], C[(k0 + q) * LDW + j + g])
            d[warp, u] = acc
    for (warp, u), acc in d.items():
        tile = warp + u * nw
        i = (tile >> 2) * 8 + g
        j = (tile & 3) * 8 + 2 * q
        C[i * LDW + j] = acc[:, 0]
        C[i * LDW + j + 1] = acc[:, 1]
    out = np.full((M, W), np.nan)
    for warp in range(nw):
        for tile in range(warp, (M // 8) * 4, nw):
            i = (tile >> 2) * 8 + g
            j = (tile & 3) * 8
            acc = np.stack([A[i * LDW + j + 2 * q], A[i * LDW + j + 2 * q + 1]], axis=1)
            for k0 in range(0, TILE, 4):
                _dmma(acc, -V[i * LD + k0 + q], C[(k0 + q) * LDW + j + g])
            out[i, j + 2 * q] = acc[:, 0]
            out[i, j + 2 * q + 1] = acc[:, 1]
    return out


@pytest.mark.parametrize("na,nref", [(1, 32), (2, 32), (3, 32), (3, 17), (2, 1), (1, 5)])
def test_mma_chunk_matches_the_scalar_apply(na, nref):
    rng = np.random.default_rng()
    M = na * TILE
    Vd = np.tril(rng.standard_normal((M, TILE)), -1)
    Vd[np.arange(TILE), np.arange(TILE)] = 1.0
    Vd[TILE:] = rng.standard_normal((M - TILE, TILE))
    Vd[:, nref:] = 0.0
    Td = np.triu(rng.standard_normal((TILE, TILE)))
    Td[:, nref:] = 0.0
    Ad = rng.standard_normal((M, W))
    want = Ad - Vd @ (Td.T @ (Vd.T @ Ad))
    V = np.zeros(M * LD)
    Tm = np.zeros(TILE * LD)
    A = np.zeros(M * LDW)
    for i in range(M):
        V[i * LD:i * LD + TILE] = Vd[i]
        A[i * LDW:i * LDW + W] = Ad[i]
    for i in range(TILE):
        Tm[i * LD:i * LD + TILE] = Td[i]
    C = np.full(TILE * LDW, np.nan)              # stale shared memory: all overwritten
    got = _chunk(V, Tm, A, C, M)
    np.testing.assert_allclose(got, want, atol=1e-12 * max(1.0, np.abs(want).max()))
