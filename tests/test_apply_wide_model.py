"""The TILE-64 tensor-core Apply and the TILE-64 variants' plumbing, on the CPU.

``apply_chunk_mma_wide`` and ``apply_t_fragments`` (``kernels/sparse_qr/apply.cuh``)
are emulated warp by warp: each ``mma.sync.m8n8k4.f64`` from what every lane
supplies (lane ``4g + q`` holds ``A[g][q]``, ``B[q][g]`` and ``D[g][2q..2q+1]``),
with the kernel's index expressions on flat shared arrays of the kernel's
padded strides, and ``-Tᵀ``'s fragments read from a VT tile as the Factorize
writes it (T on and above the diagonal, the top tile's V below it: the
fragments must mask it). The chunk's result is compared with the scalar Apply
``A - V (Tᵀ (Vᵀ A))``. This checks the tiling, the operand roles, the strides
and the structural skips, not the hardware (the GPU tests in
``test_gpu_tiles.py`` run the kernel against the NumPy executor). Also: the
shared-memory formula and what it lets an SM hold, the TILE-64 variants'
declaration apart from the default ones, their NVRTC compile, and a whole
factorization at TILE 64 through the engine's host logic against ``simulate``.
"""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import factorize_kernels as fk

TILE = 64
W = 16                  # the chunk's columns
LD = TILE + 4           # V's row stride (4 mod 16)
LDW = W + 4             # A's and C's row stride (4 mod 16)


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


def _t_fragments(VT, nref, w):
    """apply_t_fragments of warp ``w``: (TILE // 4, 32) fragments."""
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    col = 8 * w + g
    tf = np.zeros((TILE // 4, 32))
    for s in range(TILE // 4):
        k = 4 * s + q
        ok = (k <= col) & (col < nref)
        tf[s, ok] = -VT[k[ok] * TILE + col[ok]]
    return tf


def _chunk_wide(V, VT, A, C, M, nref):
    """apply_chunk_mma_wide on flat shared arrays; returns the (M, W) result."""
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    na = M // TILE
    kr = (nref + 3) & ~3
    acc, cs = {}, {}
    for I in range(8):
        for u in range(na):
            a = ((I * na + u) * 8 + g) * LDW + 2 * q
            acc[I, u] = [np.stack([A[a], A[a + 1]], axis=1),
                         np.stack([A[a + 8], A[a + 9]], axis=1)]
        c = [np.zeros((32, 2)), np.zeros((32, 2))]
        if I * 8 < nref:
            for k0 in range(I * 8, M, 4):
                a = V[q * LD + I * 8 + g + k0 * LD]
                _dmma(c[0], a, A[q * LDW + g + k0 * LDW])
                _dmma(c[1], a, A[q * LDW + g + k0 * LDW + 8])
        cs[I] = c

    def store(cs):
        for I, c in cs.items():
            r = (I * 8 + g) * LDW + 2 * q
            C[r], C[r + 1], C[r + 8], C[r + 9] = (c[0][:, 0], c[0][:, 1],
                                                  c[1][:, 0], c[1][:, 1])

    store(cs)                                      # barrier after the writes
    for I in range(8):
        tf = _t_fragments(VT, nref, I)
        ns = min(2 * (I + 1), kr >> 2)
        c = [np.zeros((32, 2)), np.zeros((32, 2))]
        for s in range(TILE // 4):
            if s < ns:
                _dmma(c[0], tf[s], C[q * LDW + g + 4 * s * LDW])
                _dmma(c[1], tf[s], C[q * LDW + g + 4 * s * LDW + 8])
        cs[I] = c
    store(cs)                                      # barrier, writes, barrier
    out = np.full((M, W), np.nan)
    for I in range(8):
        for k0 in range(0, kr, 4):
            b0 = C[q * LDW + g + k0 * LDW]
            b1 = C[q * LDW + g + k0 * LDW + 8]
            for u in range(na):
                a = V[(I * na * 8 + g) * LD + q + u * 8 * LD + k0]
                _dmma(acc[I, u][0], a, b0)
                _dmma(acc[I, u][1], a, b1)
        for u in range(na):
            i = (I * na + u) * 8 + g
            c = 2 * q
            out[i, c], out[i, c + 1] = acc[I, u][0][:, 0], acc[I, u][0][:, 1]
            out[i, c + 8], out[i, c + 9] = acc[I, u][1][:, 0], acc[I, u][1][:, 1]
    return out


def _operands(rng, na, nref):
    """V (as apply_bundle loads it), the VT tile (T upper, V1 below) and A."""
    M = na * TILE
    Vd = np.tril(rng.standard_normal((M, TILE)), -1)
    Vd[np.arange(TILE), np.arange(TILE)] = 1.0
    Vd[TILE:] = rng.standard_normal((M - TILE, TILE))
    Vd[:, nref:] = 0.0
    Td = np.triu(rng.standard_normal((TILE, TILE)))
    Td[:, nref:] = 0.0
    VT = Td + np.tril(rng.standard_normal((TILE, TILE)), -1)   # V1 below T: masked
    VT[:, nref:] = rng.standard_normal((TILE, TILE - nref))    # past nref: masked too
    Ad = rng.standard_normal((M, W))
    return M, Vd, Td, VT.ravel(), Ad


@pytest.mark.parametrize("na,nref", [(1, 64), (2, 64), (2, 33), (1, 1), (2, 5), (1, 17),
                                     (2, 62), (2, 8)])
def test_wide_mma_chunk_matches_the_scalar_apply(na, nref):
    rng = np.random.default_rng()
    M, Vd, Td, VT, Ad = _operands(rng, na, nref)
    want = Ad - Vd @ (Td.T @ (Vd.T @ Ad))
    V = np.full(M * LD, np.nan)                  # padding columns never read
    A = np.full(M * LDW, np.nan)
    for i in range(M):
        V[i * LD:i * LD + TILE] = Vd[i]
        A[i * LDW:i * LDW + W] = Ad[i]
    C = np.full(TILE * LDW, np.nan)
    got = _chunk_wide(V, VT, A, C, M, nref)
    np.testing.assert_allclose(got, want, atol=1e-12 * max(1.0, np.abs(want).max()))


def test_wide_mma_fragment_loads_are_conflict_free():
    # 8-byte shared loads go by half-warps: 16 distinct 8-byte bank pairs each
    lane = np.arange(32)
    g, q = lane >> 2, lane & 3
    for ld in (LD, LDW):
        for addr in (q * ld + g, g * ld + q):
            for half in (lane < 16, lane >= 16):
                assert len(set((addr[half] % 16).tolist())) == 16


def test_wide_shared_memory_lets_two_blocks_share_an_sm():
    # the kernel's *Smem structs, written out: Factorize without a Gram tile,
    # the Apply with V, a 16-column chunk and C (no T)
    from scipy_gpuqr._engine.gpu import device
    fac = (2 * 64 * 65 + 64 * 65 + 64 + 2 * 64) * 8
    app = (2 * 64 * 68 + 2 * 64 * 20 + 64 * 20) * 8
    assert fk.tile_smem_bytes(64, 2, 8, apply=3) == max(fac, app) == 101376
    h100 = {"multiProcessorCount": 132, "maxThreadsPerMultiProcessor": 2048,
            "sharedMemPerMultiprocessor": 233472, "regsPerMultiprocessor": 65536,
            "maxBlocksPerMultiProcessor": 32}
    smem = fk.tile_smem_bytes(64, 2, 8, apply=3)
    assert device.resident_blocks(h100, 256, smem, 128) == 132 * 2
    # the TILE-32 sizes are the ones they were
    assert fk.tile_smem_bytes(32, 3, 8, apply=3) == 73728
    assert fk.tile_smem_bytes(32, 3, 8, apply=0) == 67584


def test_wide_variants_are_declared_apart_and_named():
    from scipy_gpuqr import _kernels
    assert fk.uberkernel_file(64) == fk.UBERKERNEL_WIDE_FILE
    assert fk.uberkernel_file(32) == fk.UBERKERNEL_FILE
    wide = fk.KERNEL_VARIANTS[fk.UBERKERNEL_WIDE_FILE]
    assert fk.kernel_name("double", 64, 2, 256) in wide
    assert not set(wide) & set(fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE])
    # a default float64 call compiles the TILE-32 group only
    g = _kernels.variant_group(fk.kernel_name("double", 32, 3, 256),
                               fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE])
    assert all(", 64," not in e for e in g)
    assert fk.apply_variant("double", 64, {}) == 3
    assert fk.apply_variant("double", 64, {fk.ENV_APPLY: "scalar"}) == 0
    assert fk.apply_variant("double", 64, {fk.ENV_APPLY: "mma-async-lean"}) == 4
    assert fk.apply_variant("float", 64, {}) == 0
    uses = fk.engine_kernels(np.float64, 64, 2, solve=False, dense=False)
    assert uses and uses[0].file == fk.UBERKERNEL_WIDE_FILE
    assert fk.engine_kernels(np.float32, 64, 2) == []


def test_wide_variants_compile():
    pytest.importorskip("cupy")
    from scipy_gpuqr import _kernels
    names = [fk.kernel_name("double", 64, 2, 256, a) for a in (0, 3, 4)]
    names += [fk.smem_kernel_name("double", 64, 2, a) for a in (0, 3, 4)]
    try:
        r = _kernels._compile_one(fk.UBERKERNEL_WIDE_FILE, "sm_90", tuple(names))
    except Exception as exc:  # noqa: BLE001 - no NVRTC here
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert r["ok"], r["log"]


def test_whole_factorization_at_tile_64_matches_simulate():
    # the engine's host logic (schedule, stages, records) at TILE 64, BUNDLE 2,
    # with the NumPy device, against the NumPy executor's whole factorization
    from scipy_gpuqr._engine.gpu.device import NumpyDevice
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.host.simulate import simulate_factorize
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    A = grid3d_least_squares(8)
    got = gpu_factorize(A, device=NumpyDevice(64, 2), tile=64, bundle=2, dense_flops=None)
    ref = simulate_factorize(A, tile=64, bundle=2)
    Rg, Rr = got.R.toarray(), ref.R.toarray()
    assert np.abs(Rg - Rr).max() <= 1e-10 * np.abs(Rr).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [None, "default"])
def test_gpu_whole_factorization_at_tile_64_matches_simulate(dense):
    # the TILE-64 kernel (tensor-core Apply) in whole factorizations, dense fronts
    # off and by the default rule: R's Gram matrix equals simulate's at TILE 64
    # (R itself differs past numerically rank-deficient pivots: summation order)
    import scipy.sparse as sp

    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.host.simulate import simulate_factorize
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares
    thr = DEFAULT_DENSE_FLOPS if dense == "default" else None
    rng = np.random.default_rng()
    mats = [grid3d_least_squares(10), chessboard_boundary(5, 6, 2),
            sp.csc_array(sp.random(900, 400, density=0.01, random_state=int(rng.integers(1 << 30)))
                         + sp.eye(900, 400))]
    eps = np.finfo(float).eps
    for A in mats:
        A = sp.csc_array(A, dtype=np.float64)
        an = analyze(A)
        s = simulate_factorize(A, an, tile=64, bundle=2)
        g = gpu_factorize(A, an, tile=64, bundle=2, dense_flops=thr)
        m, n = A.shape
        normA = max(float(sp.linalg.norm(A)), 1.0)
        tol = 200 * max(m, n) * eps * normA
        assert g.info["stages"] == s.info["stages"]
        Rg, Rs = g.R.toarray(), s.R.toarray()
        assert Rg.shape == Rs.shape and np.isfinite(Rg).all()
        assert np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tol * normA
        g.free()
