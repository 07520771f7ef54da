"""The tensor-core Apply's fragment bookkeeping (``apply_chunk_mma_blocked`` in
``kernels/sparse_qr/apply.cuh``, the uberkernel's ``mma-async-lean`` Apply), on the CPU.

Each warp-wide ``mma.sync.m8n8k4.f64`` is emulated from what every lane
supplies (lane ``4g + q`` holds ``A[g][q]``, ``B[q][g]`` and ``D[g][2q..2q+1]``,
PTX's fragment layout), with the kernel's index expressions for the shared
arrays (unpadded 32-column rows with permuted column groups, ``apply_swz``; V's
top tile the VT tile as stored, masked per fragment), and the chunk's result is
compared with the scalar Apply ``A - V (Tᵀ (Vᵀ A))`` on V/T shaped as the
Factorize leaves them (V unit lower in the top tile and zero right of ``nref``,
T upper of ``nref`` columns). This checks the tiling, the operand roles, the
layout, the masks and the products' structural skips, not the hardware (nor the
cp.async copy of the next chunk).
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


def _swz(r, c):
    """The kernel's apply_swz: element (r, c) of a 32-column shared array."""
    return r * 32 + (c ^ ((r & 3) << 2))


def _chunk_blocked(V, A, C, M, nref):
    """The kernel's apply_chunk_mma_blocked on flat shared arrays (apply_swz)."""
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    sg, sq = (g & 3) << 2, q << 2
    na = M >> 5
    kr = (nref + 3) & ~3
    acc, cs = {}, {}
    for warp in range(8):
        I, j0 = warp >> 1, (warp & 1) * 16
        pa, pb, i = (j0 + 2 * q) ^ sg, (j0 + g) ^ sq, I * 8 + g
        for u in range(na):
            a = ((I * na + u) * 8 + g) * 32
            acc[warp, u] = [np.stack([A[a + pa], A[a + pa + 1]], axis=1),
                            np.stack([A[a + (pa ^ 8)], A[a + (pa ^ 8) + 1]], axis=1)]
        c = [np.zeros((32, 2)), np.zeros((32, 2))]
        if I * 8 < nref:
            vt = q * 32 + (i ^ sq)
            one = np.where(i < nref, 1.0, 0.0)
            for k0 in range(I * 8, M, 4):
                x = V[vt + k0 * 32]
                k = k0 + q
                a = np.where(k > i, x, np.where(k == i, one, 0.0)) if k0 < 32 else x
                _dmma(c[0], a, A[q * 32 + pb + k0 * 32])
                _dmma(c[1], a, A[q * 32 + (pb ^ 8) + k0 * 32])
        cs[warp] = c
    for warp, c in cs.items():                       # all warps write, then barrier
        I, j0 = warp >> 1, (warp & 1) * 16
        pa, r = (j0 + 2 * q) ^ sg, (I * 8 + g) * 32
        C[r + pa], C[r + pa + 1] = c[0][:, 0], c[0][:, 1]
        C[r + (pa ^ 8)], C[r + (pa ^ 8) + 1] = c[1][:, 0], c[1][:, 1]
    A[:] = np.nan                                    # the next chunk's copy lands
    for warp in range(8):
        I, j0 = warp >> 1, (warp & 1) * 16
        pb, i = (j0 + g) ^ sq, I * 8 + g
        vt = q * 32 + (i ^ sq)
        c = [np.zeros((32, 2)), np.zeros((32, 2))]
        for k0 in range(0, min((I + 1) * 8, kr), 4):
            a = -np.where(k0 + q <= i, V[vt + k0 * 32], 0.0)
            _dmma(c[0], a, C[q * 32 + pb + k0 * 32])
            _dmma(c[1], a, C[q * 32 + (pb ^ 8) + k0 * 32])
        cs[warp] = c
    for warp, c in cs.items():                       # barrier, write, barrier
        I, j0 = warp >> 1, (warp & 1) * 16
        pa, r = (j0 + 2 * q) ^ sg, (I * 8 + g) * 32
        C[r + pa], C[r + pa + 1] = c[0][:, 0], c[0][:, 1]
        C[r + (pa ^ 8)], C[r + (pa ^ 8) + 1] = c[1][:, 0], c[1][:, 1]
    out = np.full((M, W), np.nan)
    for warp in range(8):
        I, j0 = warp >> 1, (warp & 1) * 16
        pb = (j0 + g) ^ sq
        v = (I * na * 8 + g) * 32 + q
        for k0 in range(0, kr, 4):
            b0 = C[q * 32 + pb + k0 * 32]
            b1 = C[q * 32 + (pb ^ 8) + k0 * 32]
            kx, k = k0 ^ sg, k0 + q
            for u in range(na):
                r = (I * na + u) * 8 + g
                a = V[v + u * 8 * 32 + kx]
                if (I * na + u) * 8 < 32:            # the top tile: V unit lower
                    a = np.where(k < r, a, np.where((k == r) & (k < nref), 1.0, 0.0))
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
                                     (3, 9), (2, 30), (3, 31)])
def test_blocked_mma_chunk_matches_the_scalar_apply(na, nref):
    rng = np.random.default_rng()
    M, Vd, Td, Ad = _operands(rng, na, nref)
    want = Ad - Vd @ (Td.T @ (Vd.T @ Ad))
    # the shared arrays as apply_bundle fills them: V's top tile the VT tile (T on
    # and above the diagonal, V1 below, columns >= nref zero), every array apply_swz
    VTd = np.where(np.tri(TILE, dtype=bool, k=-1), Vd[:TILE], Td)
    VTd[:, nref:] = 0.0
    Vs = np.concatenate([VTd, Vd[TILE:]])
    V, A, C = np.full(M * 32, np.nan), np.full(M * 32, np.nan), np.full(TILE * 32, np.nan)
    for r in range(M):
        V[_swz(r, np.arange(32))] = Vs[r]
        A[_swz(r, np.arange(32))] = Ad[r]
    got = _chunk_blocked(V, A, C, M, nref)
    np.testing.assert_allclose(got, want, atol=1e-12 * max(1.0, np.abs(want).max()))


def test_swizzle_is_a_permutation_of_each_row():
    for r in range(96):
        assert sorted(_swz(r, np.arange(32)).tolist()) == list(range(r * 32, r * 32 + 32))


def test_blocked_mma_fragment_loads_are_conflict_free():
    # 8-byte shared loads go by half-warps: the 16 lanes of each must hit 16
    # distinct 8-byte bank pairs, for the transposed (rows k0 + q, columns c0 + g,
    # c0 a multiple of 8) and the direct (rows r0 + g, r0 a multiple of 8, columns
    # k0 + q) fragment patterns the blocked chunk uses
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    pats = [_swz(k0 + q, c0 + g) for k0 in range(0, 96, 4) for c0 in range(0, 32, 8)]
    pats += [_swz(r0 + g, k0 + q) for r0 in range(0, 96, 8) for k0 in range(0, 32, 4)]
    for addr in pats:
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
