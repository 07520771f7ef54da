"""GPU kernels for n > 32 (kernels/batched/rows.cu, panel.cu) against LAPACK per matrix.

Each factorization method of :mod:`scipy_gpuqr.batched._gpu_blocked` is run
explicitly (one kernel per matrix, panels with a row per thread, panels with
a thread block per matrix) on fresh random batches, with outputs poisoned
(NaN) beforehand.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

from test_batched_cases import (DTYPES, eps, lapack_getrf, lu_backward_error,
                                poison_gpu_outputs, random_batch, singular_batch, spd_batch)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    poison_gpu_outputs(monkeypatch)


def _lu(a, method):
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_blocked as bb
    ad = cp.asarray(a)
    bsz, n = a.shape[0], a.shape[-1]
    piv = cp.full((bsz, n), -7, dtype=cp.int32)
    info = cp.full((bsz,), -7, dtype=cp.int32)
    lu = bb.getrf(ad, piv, info, method)
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(ad.get(), a)           # input untouched
    return lu.get(), piv.get(), info.get()


CASES = [("fused", 33), ("fused", 47), ("fused", 64), ("rows", 33), ("rows", 64),
         ("rows", 65), ("rows", 100), ("rows", 128), ("rows", 200), ("rows", 256),
         ("rows", 511), ("rows", 512), ("panel", 100)]


#: the tensor-core LU of n <= 64 and the tensor-core panels (float64 only)
MMA64_CASES = [("mma64", 33), ("mma64", 47), ("mma64", 63), ("mma64", 64),
               ("rows_mma", 65), ("rows_mma", 100), ("rows_mma", 128), ("rows_mma", 200),
               ("rows_mma", 256), ("rows_mma", 511), ("rows_mma", 512)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method,n", CASES + MMA64_CASES)
def test_lu_methods_match_lapack(rng, method, n, dtype):
    if method in ("mma64", "rows_mma") and dtype != np.float64:
        pytest.skip("float64 only")
    batch = 5 if n > 256 else 13
    a = random_batch(rng, (batch,), n, dtype)
    lu, piv, info = _lu(a, method)
    ref_lu, ref_piv, ref_info = lapack_getrf(a)
    np.testing.assert_array_equal(info, ref_info)
    same = (piv == ref_piv).all(axis=1)
    assert same.sum() >= batch - 1, np.flatnonzero(~same)
    tol = 50 * n * eps(dtype) * max(1.0, np.abs(ref_lu).max())
    np.testing.assert_allclose(lu[same], ref_lu[same], rtol=0, atol=tol)
    assert lu_backward_error(a, lu, piv) < 20 * n * eps(dtype)


@pytest.mark.parametrize("method,n", [("fused", 40), ("fused", 64), ("rows", 64),
                                      ("rows", 150), ("rows", 300), ("mma64", 40),
                                      ("mma64", 64), ("rows_mma", 150), ("rows_mma", 300)])
def test_lu_methods_singular_and_ties(rng, method, n):
    a = singular_batch(rng, 6, n, np.float64)
    a[1] = np.round(a[1])                     # many exact ties in |a_ij|
    a[3, :, :] = np.eye(n)[::-1]              # a permutation: ties among zeros
    a[5, :, 5:9] = 0                          # several zero columns
    lu, piv, info = _lu(a, method)
    ref_lu, ref_piv, ref_info = lapack_getrf(a)
    np.testing.assert_array_equal(info, ref_info)
    np.testing.assert_array_equal(piv[3], ref_piv[3])
    assert lu_backward_error(a, lu, piv) < 20 * n * eps(np.float64)


@pytest.mark.parametrize("method,n", [("fused", 50), ("rows", 64), ("rows", 300),
                                      ("rows", 97), ("mma64", 50), ("mma64", 64),
                                      ("rows_mma", 97), ("rows_mma", 300)])
@pytest.mark.parametrize("where", ["first", "last"])
def test_lu_methods_flag_nonfinite(rng, method, n, where):
    a = random_batch(rng, (4,), n, np.float64)
    if where == "first":
        a[2, 0, 0] = np.nan
    else:
        a[2, n - 1, n - 1] = np.inf
    _, _, info = _lu(a, method)
    assert info[2] == -1 and (info[[0, 1, 3]] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method,n", [("fused", 33), ("fused", 64), ("rows", 64),
                                      ("rows", 97), ("rows", 256), ("rows", 512)])
@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("finish", ["cupy", "kernel"])
def test_cholesky_methods(rng, method, n, dtype, lower, finish):
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_blocked as bb
    s = spd_batch(rng, 7, n, dtype)
    s[2, n // 2, n // 2] = -1e4                           # not positive definite
    s[5, n - 1, 0] = np.nan                               # info -1
    sd = cp.asarray(s)
    c, info = bb.potrf(sd, lower, method, finish)
    np.testing.assert_array_equal(sd.get(), s)           # input untouched
    c, info = c.get(), info.get()
    ref_info = [-1 if not np.isfinite(m).all() else
                sl.lapack.get_lapack_funcs("potrf", (m,))(m, lower=lower)[1] for m in s]
    np.testing.assert_array_equal(info, ref_info)
    tri = np.tril if lower else np.triu
    for i in (0, 3, 6):
        ref, _ = sl.cho_factor(s[i], lower=lower)
        np.testing.assert_allclose(tri(c[i]), tri(ref), rtol=0,
                                   atol=50 * n * eps(dtype) * np.abs(ref).max())
        other = np.triu(s[i], 1) if lower else np.tril(s[i], -1)
        np.testing.assert_array_equal(c[i] - tri(c[i]), other)


@pytest.mark.parametrize("method,n", [("fused", 40), ("rows", 97), ("rows", 256),
                                      ("rows", 512), ("panel", 100)])
@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("finish", ["cupy", "kernel"])
def test_cholesky_reads_one_triangle(rng, method, n, lower, finish):
    """Only the named triangle is read (LAPACK's potrf): the other one holds
    unrelated values, which come back unchanged, and the factor is that of
    the symmetric matrix of the named triangle. The upper factor is computed
    on the transpose (a tiled transpose kernel there and back), so a copy
    that does not transpose, or transposes a tile wrongly, fails here where
    a symmetric input would not see it."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_blocked as bb
    s = spd_batch(rng, 3, n, np.float64)
    other = np.tril if not lower else np.triu
    junk = rng.standard_normal(s.shape) * 100
    a = np.where(other(np.ones((n, n), bool), -1 if not lower else 1), junk, s)
    c, info = bb.potrf(cp.asarray(a), lower, method, finish)
    c, info = c.get(), info.get()
    assert (info == 0).all()
    tri = np.tril if lower else np.triu
    for i in range(3):
        ref, _ = sl.cho_factor(s[i], lower=lower)
        np.testing.assert_allclose(tri(c[i]), tri(ref), rtol=0,
                                   atol=50 * n * eps(np.float64) * np.abs(ref).max())
        np.testing.assert_array_equal(c[i] - tri(c[i]), a[i] - tri(a[i]))


@pytest.mark.parametrize("n", [33, 48, 64])
@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("k", [1, 3, 70])
def test_smem_lu_solve(rng, n, trans, k):
    import scipy_gpuqr as g
    import cupy as cp
    a = random_batch(rng, (6,), n, np.float64)
    b = rng.standard_normal((6, n, k))
    lu, piv = g.lu_factor_batched(cp.asarray(a))
    x = g.lu_solve_batched((lu, piv), cp.asarray(b), trans=trans).get()
    for i in range(6):
        ref = sl.lu_solve(sl.lu_factor(a[i]), b[i], trans=trans)
        np.testing.assert_allclose(x[i], ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [33, 64, 65, 128])
def test_inverse_and_cholesky_solve(rng, n, dtype):
    import scipy_gpuqr as g
    import cupy as cp
    a = random_batch(rng, (5,), n, dtype) + 4 * np.sqrt(n) * np.eye(n, dtype=dtype)
    x = g.inv_batched(cp.asarray(a)).get()
    ref = np.linalg.inv(a.astype(np.float64))
    np.testing.assert_allclose(x, ref, rtol=0, atol=200 * n * eps(dtype) * np.abs(ref).max())
    s = spd_batch(rng, 5, n, dtype)
    b = rng.standard_normal((5, n, 2)).astype(dtype)
    for lower in (False, True):
        c = g.cho_factor_batched(cp.asarray(s), lower=lower)
        xs = g.cho_solve_batched(c, cp.asarray(b)).get()
        refs = np.linalg.solve(s.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(xs, refs, rtol=0,
                                   atol=1e3 * n * eps(dtype) * np.abs(refs).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nb", [32, 64])
@pytest.mark.parametrize("n", [64, 65, 96, 128, 129, 200, 256])
def test_inverse_blocks_match_lapack(rng, n, nb, dtype):
    """The blocked inverse U⁻¹ L⁻¹ P (kernels/batched/inverse.cu and cuBLAS
    GEMMs by block rows of nb, ragged last block rows included) equals
    LAPACK's inverse within the inverse's rounding, on well and less well
    conditioned matrices (rows exchanged: random, not diagonally dominant);
    its exactly singular matrices come out NaN from inv_batched with
    return_info (default block rows), the others as good; outputs poisoned."""
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr.batched import _gpu_blocked as bb
    a = random_batch(rng, (6,), n, dtype)
    a[1] += 4 * np.sqrt(n) * np.eye(n, dtype=dtype)
    x, info = bb.inverse(cp.asarray(a), nb=nb)
    assert x.shape == a.shape and x.dtype == dtype
    ref = np.linalg.inv(a.astype(np.float64))
    tol = 20 * n * eps(dtype) * np.linalg.cond(a.astype(np.float64))[:, None, None]
    err = np.abs(x.get() - ref) / np.abs(ref).max(axis=(1, 2), keepdims=True)
    assert (err <= tol).all(), (err.max(axis=(1, 2)), tol.ravel())
    np.testing.assert_array_equal(info.get(), 0)
    a[[0, 4], :, 3] = 0                                  # exactly singular
    xs, info = g.inv_batched(cp.asarray(a), return_info=True)
    xs, info = xs.get(), info.get()
    assert (info[[0, 4]] > 0).all() and (np.delete(info, [0, 4]) == 0).all()
    assert np.isnan(xs[[0, 4]]).all()
    keep = [1, 2, 3, 5]
    assert (np.abs(xs[keep] - ref[keep]) / np.abs(ref[keep]).max(axis=(1, 2), keepdims=True)
            <= tol[keep]).all()


def test_inverse_blocks_default_block():
    """inverse_block picks one of the kernel's instantiated block sizes."""
    from scipy_gpuqr.batched import _gpu_blocked as bb
    from scipy_gpuqr.batched._kernel_registry import INV_BLOCKS
    assert all(bb.inverse_block(n) in INV_BLOCKS for n in (65, 128, 129, 512, 1000))


@pytest.mark.parametrize("mma,scheme", [(True, "from a"), (True, "from unaligned a"),
                                        (True, "in place"), (True, "L every panel"),
                                        (False, "from a"), (False, "in place")])
@pytest.mark.parametrize("n,outer", [(100, 128), (130, 128), (300, 128), (300, 256),
                                     (512, 128), (512, 256), (512, 512), (200, 32),
                                     (65, 64), (130, 64), (200, 96)])
def test_rows_lu_column_blocks_match_lapack(rng, mma, scheme, n, outer):
    """Every column block of the blocked LU (its trailing updates' k), with
    the tensor-core panels and rows_swap or the rows panels, gives LAPACK's
    pivots and factors; singular matrices, ties and NaN as well. ``from a``:
    the first panel reads the input (left untouched) and rows_copy_perm
    writes the rest of a NaN-filled output; the earlier blocks' L columns
    swapped at the end (rows_swap_left) or, ``L every panel``, by every
    panel's rows_swap. ``from unaligned a``: the input 8 bytes off 16-byte
    alignment (the panel kernel's 16-byte copies of it then not taken)."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_blocked as bb
    a = random_batch(rng, (6,), n, np.float64)
    a[1] = np.round(4 * a[1])                 # exact ties
    a[2, :, 40:47] = 0                        # zero columns: info, zero pivots
    a[3] = np.eye(n)[::-1]                    # a permutation
    a[4, n // 2, n - 1] = np.nan              # info -1
    piv = cp.full((6, n), -7, dtype=cp.int32)
    info = cp.full((6,), -7, dtype=cp.int32)           # the first panel sets it
    if scheme.startswith("from"):
        src = cp.asarray(a)
        if scheme == "from unaligned a":
            src = cp.empty(a.size + 1)[1:].reshape(a.shape)
            src[...] = cp.asarray(a)
            assert src.data.ptr % 16 == 8
        lu = cp.full(a.shape, np.nan)
        bb._rows_lu(lu, piv, info, mma, outer, src=src)
        np.testing.assert_array_equal(src.get(), a)
    else:
        lu = cp.asarray(a)
        bb._rows_lu(lu, piv, info, mma, outer, defer_left=scheme == "in place")
    lu, piv, info = lu.get(), piv.get(), info.get()
    ref_lu, ref_piv, ref_info = lapack_getrf(a)
    assert info[4] == -1
    keep = [0, 1, 2, 3, 5]
    np.testing.assert_array_equal(info[keep], ref_info[keep])
    np.testing.assert_array_equal(piv[[0, 3, 5]], ref_piv[[0, 3, 5]])
    tol = 50 * n * eps(np.float64) * max(1.0, np.abs(ref_lu[[0, 5]]).max())
    np.testing.assert_allclose(lu[[0, 5]], ref_lu[[0, 5]], rtol=0, atol=tol)
    assert lu_backward_error(a[keep], lu[keep], piv[keep]) < 20 * n * eps(np.float64)


def _left_swaps(a, piv, outer):
    """rows_swap_left's model: block y's columns [y outer, (y + 1) outer)
    take every exchange (k, piv[k]) for k from (y + 1) outer on, in order."""
    a = a.copy()
    n = a.shape[-1]
    for b in range(a.shape[0]):
        for r0 in range(outer, n, outer):
            frm = np.arange(n)
            for k in range(r0, n):
                frm[[k, piv[b, k]]] = frm[[piv[b, k], k]]
            a[b, r0:, r0 - outer:r0] = a[b][frm[r0:], r0 - outer:r0]
    return a


@pytest.mark.parametrize("n,outer", [(512, 128), (512, 64), (511, 128), (300, 96),
                                     (200, 32), (65, 64), (130, 64)])
@pytest.mark.parametrize("aligned", [True, False])
def test_rows_swap_left_matches_its_model(rng, n, outer, aligned):
    """rows_swap_left alone on random LAPACK-shaped pivots (piv[k] >= k):
    every earlier column block's rows below it take every later exchange,
    nothing else of the stack moves. Pivots of every kind: random (most
    rows move), none (no row moves), the reversal, and a few exchanges
    only; the stack 16-byte aligned (16-byte copies where n is even) or 8
    bytes off (8-byte copies)."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_blocked as bb
    from scipy_gpuqr.batched._kernel_registry import MMA_LEFT_NAME, left_stage
    bsz = 5
    a = rng.standard_normal((bsz, n, n))
    k = np.arange(n)
    piv = np.stack([k + (rng.random(n) * (n - k)).astype(int), k,
                    np.maximum(k, n - 1 - k), k, k]).astype(np.int32)
    few = rng.choice(n - 1, 5, replace=False)
    piv[3, few] = n - 1
    piv[4] = k + (rng.random(n) * (n - k)).astype(int)
    if aligned:
        ad = cp.asarray(a)
    else:
        ad = cp.empty(a.size + 1)[1:].reshape(a.shape)
        ad[...] = cp.asarray(a)
    assert (ad.data.ptr % 16 == 0) == aligned
    fn = bb._mma64_function(bb.device_id(), MMA_LEFT_NAME)
    stage = left_stage(n, outer)
    fn((bsz, -(-n // outer) - 1), (256,),
       (ad, cp.asarray(piv), np.int32(n), np.int32(outer), np.int32(stage)),
       shared_mem=bb._with_smem(fn, stage * 8))
    np.testing.assert_array_equal(ad.get(), _left_swaps(a, piv, outer))


@pytest.mark.parametrize("n,streams", [(130, 2), (300, 4), (512, 2), (512, 3)])
def test_rows_lu_in_parts_on_the_callers_stream(rng, n, streams):
    """The batch in parts, each on a stream of its own (``_rows_lu``'s
    ``streams``): LAPACK's pivots, factors and info for every matrix
    (singular, tied, NaN ones among them), the input untouched, and the
    output complete when read on the caller's stream (a non-blocking one,
    not the default stream) right after the call."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_blocked as bb
    bsz = 40
    a = random_batch(rng, (bsz,), n, np.float64)
    a[1] = np.round(4 * a[1])                 # exact ties
    a[2, :, 40:47] = 0                        # zero columns
    a[3] = np.eye(n)[::-1]                    # a permutation
    a[bsz - 1, n // 2, n - 1] = np.nan        # info -1, in the last part
    with cp.cuda.Stream(non_blocking=True):
        src = cp.asarray(a)
        lu = cp.full(a.shape, np.nan)
        piv = cp.full((bsz, n), -7, dtype=cp.int32)
        info = cp.full((bsz,), -7, dtype=cp.int32)
        bb._rows_lu(lu, piv, info, True, src=src, streams=streams)
        lu, piv, info, back = lu.get(), piv.get(), info.get(), src.get()
    np.testing.assert_array_equal(back, a)
    ref_lu, ref_piv, ref_info = lapack_getrf(a)
    assert info[bsz - 1] == -1
    keep = np.arange(bsz - 1)
    np.testing.assert_array_equal(info[keep], ref_info[keep])
    same = (piv[keep] == ref_piv[keep]).all(axis=1)
    assert same[0] and same[3] and same.sum() >= len(keep) - 2, np.flatnonzero(~same)
    good = keep[same]
    tol = 50 * n * eps(np.float64) * max(1.0, np.abs(ref_lu[good]).max())
    np.testing.assert_allclose(lu[good], ref_lu[good], rtol=0, atol=tol)
    assert lu_backward_error(a[keep], lu[keep], piv[keep]) < 20 * n * eps(np.float64)
