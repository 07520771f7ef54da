"""GPU kernels of the batched LU / inverse / Cholesky against SciPy per matrix.

Outputs are poisoned (NaN) before the kernels run, inputs are fresh random
batches, and results are compared with LAPACK (scipy.linalg) matrix by matrix.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from scipy.linalg import LinAlgError, LinAlgWarning

import scipy_gpuqr as g
from test_batched_cases import (DTYPES, eps, ill_conditioned_batch, lapack_getrf,
                                lu_backward_error, poison_gpu_outputs, random_batch,
                                singular_batch, spd_batch)

pytestmark = pytest.mark.gpu

GPU_SIZES = list(range(1, 41)) + [47, 64, 100, 128, 200]


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    poison_gpu_outputs(monkeypatch)


def _cp(x):
    import cupy as cp
    return cp.asarray(x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", GPU_SIZES)
def test_gpu_lu_matches_lapack(rng, n, dtype):
    import cupy as cp
    batch = 37                      # not a multiple of matrices per block
    a = random_batch(rng, (batch,), n, dtype)
    lu, piv = g.lu_factor_batched(_cp(a))
    assert isinstance(lu, cp.ndarray) and lu.dtype == dtype and piv.dtype == np.int32
    lu, piv = lu.get(), piv.get()
    ref_lu, ref_piv, ref_info = lapack_getrf(a)
    same = (piv == ref_piv).all(axis=1)
    # pivots equal LAPACK's (a near tie can be decided by rounding: allow 1)
    assert same.sum() >= batch - 1, np.flatnonzero(~same)
    tol = 50 * n * eps(dtype) * max(1.0, np.abs(ref_lu).max())
    np.testing.assert_allclose(lu[same], ref_lu[same], rtol=0, atol=tol)
    assert lu_backward_error(a, lu, piv) < 20 * n * eps(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4, 16, 32, 64, 150])
def test_gpu_lu_ill_conditioned_and_singular(rng, n, dtype):
    a = ill_conditioned_batch(rng, 8, n, dtype, cond=1e5 if dtype == np.float32 else 1e12)
    lu, piv, info = g.lu_factor_batched(_cp(a), return_info=True)
    assert (info.get() == 0).all()
    assert lu_backward_error(a, lu.get(), piv.get()) < 20 * n * eps(dtype)
    s = singular_batch(rng, 6, n, dtype)
    with pytest.warns(LinAlgWarning, match=r"\[0, 2, 4\]"):
        g.lu_factor_batched(_cp(s))
    _, _, info = g.lu_factor_batched(_cp(s), return_info=True)
    np.testing.assert_array_equal(info.get(), lapack_getrf(s)[2])


@pytest.mark.parametrize("kernel", ["warp", "mma"])
def test_gpu_lu_n32_both_kernels(rng, kernel):
    """n = 32 float64 through each LU kernel (the tensor-core one is the default
    on sm_80+): random, exact ties, zero columns, non-finite, and 8-byte
    aligned (not 16) input and output, against LAPACK per matrix."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    if kernel == "mma" and bg.getrf_kernel(32, np.float64) != "getrf_mma":
        pytest.skip("no FP64 tensor cores")
    n, batch = 32, 301
    a = random_batch(rng, (batch,), n, np.float64)
    a[5:40:3, :, 7] = 0                          # singular: zero column
    a[6:40:3, 9:, 9] = 0                         # a column zero below its row 9
    a[7] = np.round(a[7] * 2)                     # exact ties
    a[11, 4, 20] = np.inf
    a[12, 30, 3] = np.nan
    ref_lu, ref_piv, ref_info = lapack_getrf(a)
    ref_info[[11, 12]] = -1
    for offset in (0, 1):                        # 16-byte and 8-byte aligned
        buf = cp.empty(a.size + 1)
        ga = buf[offset:offset + a.size].reshape(a.shape)
        ga[...] = cp.asarray(a)
        lu, piv, info = bg.getrf(ga, kernel=kernel)
        lu, piv, info = lu.get(), piv.get(), info.get()
        np.testing.assert_array_equal(info, ref_info)
        ok = info == 0
        same = (piv == ref_piv).all(axis=1) & ok
        assert same.sum() >= ok.sum() - 1
        tol = 50 * n * eps(np.float64) * max(1.0, np.abs(ref_lu[same]).max())
        np.testing.assert_allclose(lu[same], ref_lu[same], rtol=0, atol=tol)
        sing = np.flatnonzero(info > 0)
        assert lu_backward_error(a[sing], lu[sing], piv[sing]) < 20 * n * eps(np.float64)


@pytest.mark.parametrize("op", ["lu", "inv"])
def test_gpu_mma_block_sizes_give_the_same_bits(rng, op):
    """The n = 32 tensor-core LU and inverse at every block size (the default
    MMA_THREADS among them) give the same outputs bit for bit, on a batch
    larger than the resident warps (each warp loops over several matrices),
    and the default block size's LU matches LAPACK on a sample."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    if bg.getrf_kernel(32, np.float64) != "getrf_mma":
        pytest.skip("no FP64 tensor cores")
    n = 32
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    batch = 3 * 32 * sms + 7
    a = random_batch(rng, (batch,), n, np.float64)
    a[3, :, 5] = 0                               # one exactly singular matrix
    ga = cp.asarray(a)
    run = ((lambda t: bg.getrf(ga, threads=t, kernel="mma")) if op == "lu" else
           (lambda t: bg.getri(ga, threads=t, kernel="mma")))
    ref = [x.get() for x in run(bg.MMA_THREADS)]
    for t in (32, 64, 96, 128, 160, 256):
        out = [x.get() for x in run(t)]
        for x, y in zip(ref, out):
            np.testing.assert_array_equal(x, y)
    info = ref[-1]
    assert info[3] > 0 and (np.delete(info, 3) == 0).all()
    if op == "lu":
        sel = np.r_[0:5, batch - 5:batch]
        rl, rp, _ = lapack_getrf(a[sel])
        np.testing.assert_array_equal(ref[1][sel], rp)
        np.testing.assert_allclose(ref[0][sel], rl, rtol=0,
                                   atol=50 * n * eps(np.float64) * np.abs(rl).max())


@pytest.mark.parametrize("n", [3, 32, 70])
def test_gpu_nonfinite_flagged_by_kernel(rng, n):
    a = random_batch(rng, (5,), n, np.float64)
    a[3, n - 1, 0] = np.inf
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[3\]"):
        g.lu_factor_batched(_cp(a))
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[3\]"):
        g.inv_batched(_cp(a))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 16, 17, 24, 31, 32, 33, 64, 100])
def test_gpu_inverse(rng, n, dtype):
    a = random_batch(rng, (3, 11), n, dtype) + 3 * np.eye(n, dtype=dtype)
    x = g.inv_batched(_cp(a)).get()
    assert x.dtype == dtype and x.shape == a.shape
    ref = np.linalg.inv(a.astype(np.float64))
    cond = max(np.linalg.cond(m) for m in a.reshape(-1, n, n).astype(np.float64))
    np.testing.assert_allclose(x, ref, rtol=0, atol=30 * n * eps(dtype) * cond * np.abs(ref).max())


@pytest.mark.parametrize("n", [32, 27])
@pytest.mark.parametrize("kernel", ["warp", "mma"])
def test_gpu_inverse_n32_both_kernels(rng, kernel, n):
    """float64 inverses of size 32 (n = 27: padded to 32) through each kernel
    (the tensor-core Gauss-Jordan is the default on sm_80+): random, exact
    ties, zero columns (info as LAPACK's getrf), non-finite (-1), and 8-byte
    aligned (not 16) input, against SciPy per matrix."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    if kernel == "mma" and bg.getri_kernel(n, np.float64) != "getri_mma":
        pytest.skip("no FP64 tensor cores")
    batch = 301
    a = random_batch(rng, (batch,), n, np.float64)
    a[5:40:3, :, 7] = 0                          # singular: zero column
    a[6:40:3, 9:, 9] = 0                         # a column zero below its row 9
    a[7] = np.round(a[7] * 2)                     # exact ties
    a[8] = np.round(a[8] * 2) + 3 * np.eye(n)
    a[11, 4, 20] = np.inf
    a[12, n - 2, 3] = np.nan
    ref_info = lapack_getrf(a)[2]
    ref_info[[11, 12]] = -1
    ok = ref_info == 0
    ref = np.zeros_like(a)
    ref[ok] = np.linalg.inv(a[ok])
    cond = np.linalg.cond(a[ok])
    for offset in (0, 1):                        # 16-byte and 8-byte aligned
        buf = cp.empty(a.size + 1)
        ga = buf[offset:offset + a.size].reshape(a.shape)
        ga[...] = cp.asarray(a)
        x, info = bg.getri(ga, kernel=kernel)
        x, info = x.get(), info.get()
        np.testing.assert_array_equal(info, ref_info)
        err = np.abs(x[ok] - ref[ok]).max(axis=(1, 2)) / np.abs(ref[ok]).max(axis=(1, 2))
        assert (err <= 30 * n * eps(np.float64) * cond).all(), err.max()
        for i in np.flatnonzero(ok)[:5]:
            np.testing.assert_allclose(x[i], sl.inv(a[i]), rtol=0,
                                       atol=30 * n * eps(np.float64) * cond.max()
                                       * np.abs(ref[i]).max())


def test_gpu_mma_extreme_pivots(rng):
    """The tensor-core kernels' rare pivots (a warp-uniform branch on the
    pivot's exponent), mixed with ordinary matrices in one batch: pivots of
    2**1022 and more (1/pivot subnormal: scaled), subnormal pivots, zero
    pivots. Scaling a matrix or a column by a power of two scales U (or the
    inverse) exactly, so the references are LAPACK's / NumPy's results on
    the unscaled matrices; subnormal pivots are checked by the backward
    error (OpenBLAS's getrf does not keep subnormal pivots)."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    if bg.getrf_kernel(32, np.float64) != "getrf_mma":
        pytest.skip("no FP64 tensor cores")
    n, batch, big, col = 32, 16, 2.0 ** 1017, 2.0 ** 1021
    base = random_batch(rng, (batch,), n, np.float64)
    base[0:4] += 32 * np.eye(n)
    a = base.copy()
    a[0:4] *= big                                # every pivot >= 2**1022
    a[4:6, :, 3] *= col                          # one column of such pivots
    a[6:8, :, 0] = 0
    a[6:8, 5, 0] = 1e-310                        # a subnormal first pivot
    a[8, 7] *= 2.0 ** -1050                      # a subnormal row (last pivot)
    a[9, :, 4] = 0                               # zero pivot (info 5)
    lu, piv, info = (x.get() for x in bg.getrf(cp.asarray(a), kernel="mma"))
    ref_lu, ref_piv, ref_info = lapack_getrf(base)
    ref_lu[0:4] = np.tril(ref_lu[0:4], -1) + np.triu(ref_lu[0:4]) * big
    ref_lu[4:6, :4, 3] *= col
    ref_info[9] = lapack_getrf(a[9:10])[2][0]
    np.testing.assert_array_equal(info, ref_info)
    for m in (0, 1, 2, 3, 4, 5):
        np.testing.assert_array_equal(piv[m], ref_piv[m])
        tol = 50 * n * eps(np.float64) * np.abs(ref_lu[m]).max()
        np.testing.assert_allclose(lu[m], ref_lu[m], rtol=0, atol=tol, err_msg=f"matrix {m}")
    assert (piv[6:8, 0] == 5).all()
    assert lu_backward_error(a[6:10], lu[6:10], piv[6:10]) < 20 * n * eps(np.float64)
    # inverses of the huge matrices and of those with a huge column
    x, xinfo = (y.get() for y in bg.getri(cp.asarray(a[0:6]), kernel="mma"))
    assert (xinfo == 0).all()
    x[0:4] *= big
    x[4:6, 3] *= col
    ref = np.linalg.inv(base[0:6])
    cond = np.linalg.cond(base[0:6])
    err = np.abs(x - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
    assert (err <= 30 * n * eps(np.float64) * cond).all(), err


def test_gpu_inverse_singular(rng):
    for n in (6, 40):
        s = singular_batch(rng, 5, n, np.float64)
        with pytest.raises(LinAlgError, match=r"\[0, 2, 4\]"):
            g.inv_batched(_cp(s))
        x, info = g.inv_batched(_cp(s), return_info=True)
        assert (info.get()[[0, 2, 4]] > 0).all() and np.isnan(x.get()[0]).all()


@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("n", [1, 7, 32, 45, 128])
@pytest.mark.parametrize("k", [1, 5])
def test_gpu_lu_solve_and_solve(rng, n, trans, k):
    a = random_batch(rng, (9,), n, np.float64)
    lu, piv = g.lu_factor_batched(_cp(a))
    b = rng.standard_normal((9, n, k))
    x = g.lu_solve_batched((lu, piv), _cp(b), trans=trans).get()
    for i in range(9):
        ref = sl.lu_solve(sl.lu_factor(a[i]), b[i], trans=trans)
        np.testing.assert_allclose(x[i], ref, rtol=1e-8, atol=1e-8)
    xs = g.solve_batched(_cp(a), _cp(b)).get()
    np.testing.assert_allclose(xs, np.linalg.solve(a, b), rtol=1e-8, atol=1e-8)
    v = g.solve_batched(_cp(a), _cp(b[0, :, 0]))
    assert v.shape == (9, n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 17, 24, 31, 32])
def test_gpu_gesv_one_kernel_matches_two(rng, n, dtype):
    """solve_batched's one-kernel LU and solve (gesv_warp / gesv_mma) against
    the LU kernel followed by the solve kernel and against NumPy: per-matrix
    and broadcast right-hand sides, one and several columns, more matrices
    than a warp's tile; singular matrices get NaN solutions (with the NaN
    flag) and their info; an inf in b marks the right-hand side slot."""
    import cupy as cp
    from scipy_gpuqr.batched import _common as bcm
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    batch = (7, 11)
    a = random_batch(rng, batch, n, dtype) + (2 * np.sqrt(n) * np.eye(n)).astype(dtype)
    a[2, 3, :, 0] = 0                                  # exactly singular
    ref_info = np.zeros(batch, dtype=np.int32)
    ref_info[2, 3] = lapack_getrf(a[2, 3][None])[2][0]
    ga = cp.asarray(a)
    tol = 200 * n * eps(dtype)
    for bshape in [batch + (n, 1), batch + (n, 3), (n,), (n, 2)]:
        b = rng.standard_normal(bshape).astype(dtype)
        rhs = bcm.gpu_rhs(cp.asarray(b), batch, n, np.dtype(dtype))
        outs = []
        for fused in (True, False):
            st = gc.new_status()
            x, info = bg.gesv(ga, rhs, gc.report_args(st),
                              gc.report_args(st, nan_fill=True), True, fused=fused)
            counts = gc.read_status(st)
            outs.append(_host(x))
            np.testing.assert_array_equal(_host(info), ref_info)
            assert counts[gc.STATUS_SINGULAR] == 1 and counts[gc.STATUS_RHS] == 0
        x1, x2 = outs
        assert np.isnan(x1[2, 3]).all() and np.isnan(x2[2, 3]).all()
        ok = np.ones(batch, dtype=bool)
        ok[2, 3] = False
        bb = b if b.ndim > 1 else b[:, None]
        full = np.broadcast_to(bb, batch + bb.shape[-2:]) if b.ndim <= 2 else bb
        ref = np.linalg.solve(a[ok].astype(np.float64), full[ok].astype(np.float64))
        got = x1[ok].reshape(ref.shape)
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol * max(1.0, scale))
        np.testing.assert_allclose(got, x2[ok].reshape(ref.shape), rtol=0,
                                   atol=tol * max(1.0, scale))
    # an inf in b: the right-hand side slot, the solutions of the others still exact
    b = rng.standard_normal(batch + (n, 1)).astype(dtype)
    b[4, 5, n - 1, 0] = np.inf
    st = gc.new_status()
    rhs = bcm.gpu_rhs(cp.asarray(b), batch, n, np.dtype(dtype))
    x, info = bg.gesv(ga, rhs, gc.report_args(st), gc.report_args(st), False, fused=True)
    counts = gc.read_status(st)
    assert counts[gc.STATUS_RHS] == 1
    ref = np.linalg.solve(a[0, 0].astype(np.float64), b[0, 0].astype(np.float64))
    np.testing.assert_allclose(_host(x)[0, 0], ref, rtol=0,
                               atol=tol * max(1.0, np.abs(ref).max()))


def _warp_solves_agree(rng, monkeypatch, flag, solve, A, dtype, tol):
    """``solve(b)`` with the warp kernel (``flag`` of ``_gpu_common`` on) and without,
    for a b per matrix (3 columns) and one b for all (2 columns, batch stride 0),
    each against NumPy's solve with ``A``; the flag left on."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common as gc
    bsz, n = A.shape[:2]
    for b in (rng.standard_normal((bsz, n, 3)), rng.standard_normal((1, n, 2))):
        gb = cp.asarray(b.astype(dtype))
        if b.shape[0] == 1:                          # batch stride 0
            gb = cp.broadcast_to(gb, (bsz,) + b.shape[1:])
        outs = []
        for warp in (True, False):
            monkeypatch.setattr(gc, flag, warp)
            outs.append(_host(solve(gb)))
        ref = np.linalg.solve(A.astype(np.float64),
                              np.broadcast_to(b, (bsz,) + b.shape[1:]).astype(np.float64))
        scale = max(1.0, np.abs(ref).max())
        np.testing.assert_allclose(outs[0], ref, rtol=0, atol=tol * scale)
        np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=tol * scale)
    monkeypatch.setattr(gc, flag, True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 17, 24, 31, 32])
def test_gpu_getrs_warp_matches_columns(rng, monkeypatch, n, dtype):
    """The LU solve of n <= 32 by getrs_warp (a row of the factor per lane)
    against getrs_batched (a thread per column) and NumPy: several columns,
    one b for every matrix, more matrices than a tile; an inf in the factor
    and in b mark their status slots; NaN solutions for info > 0 with the
    NaN flag."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    bsz = 45
    a = random_batch(rng, (bsz,), n, dtype) + (2 * np.sqrt(n) * np.eye(n)).astype(dtype)
    lu, piv, _ = bg.getrf(cp.asarray(a))
    tol = 200 * n * eps(dtype)
    _warp_solves_agree(rng, monkeypatch, "WARP_GETRS", lambda gb: bg.getrs(lu, piv, gb), a,
                       dtype, tol)
    b = rng.standard_normal((bsz, n, 1)).astype(dtype)
    for where in ("lu", "b"):
        bad_lu, bad_b = lu.copy(), b.copy()
        if where == "lu":
            bad_lu[4, n - 1, n - 1] = np.inf
        else:
            bad_b[7, 0, 0] = np.nan
        st = gc.new_status()
        x = bg.getrs(bad_lu, piv, cp.asarray(bad_b), 0, gc.report_args(st))
        counts = gc.read_status(st)
        assert counts[gc.STATUS_FACTOR] == (where == "lu")
        assert counts[gc.STATUS_RHS] == (where == "b")
        good = _host(x)[20]
        np.testing.assert_allclose(good, np.linalg.solve(a[20].astype(np.float64),
                                                         b[20].astype(np.float64)),
                                   rtol=0, atol=tol * max(1.0, np.abs(good).max()))
    info = cp.zeros(bsz, dtype=cp.int32)
    info[9] = 2
    st = gc.new_status()
    x = _host(bg.getrs(lu, piv, cp.asarray(b), 0, gc.report_args(st, nan_fill=True), info))
    assert np.isnan(x[9]).all() and np.isfinite(np.delete(x, 9, axis=0)).all()


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 24, 32])
def test_gpu_potrs_warp_matches_columns(rng, monkeypatch, n, dtype, lower):
    """The Cholesky solve of n <= 32 by potrs_warp against potrs_batched and
    NumPy (several columns, one b for every matrix); an inf in the triangle
    the solve does not use still marks the factor's slot (SciPy checks all
    of c), an inf in b the right-hand side's."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    bsz = 45
    s = spd_batch(rng, bsz, n, dtype)
    c, _ = bg.potrf(cp.asarray(s), lower)
    tol = 300 * n * eps(dtype)
    _warp_solves_agree(rng, monkeypatch, "WARP_POTRS", lambda gb: bg.potrs(c, lower, gb), s,
                       dtype, tol)
    b = rng.standard_normal((bsz, n, 1)).astype(dtype)
    for where in ("c", "b"):
        bad_c, bad_b = c.copy(), b.copy()
        if where == "c":
            if n == 1:
                bad_c[4, 0, 0] = np.inf
            elif lower:
                bad_c[4, 0, n - 1] = np.inf             # the unused (upper) triangle
            else:
                bad_c[4, n - 1, 0] = np.inf             # the unused (lower) triangle
        else:
            bad_b[7, n - 1, 0] = np.nan
        st = gc.new_status()
        x = bg.potrs(bad_c, lower, cp.asarray(bad_b), gc.report_args(st))
        counts = gc.read_status(st)
        assert counts[gc.STATUS_FACTOR] == (where == "c")
        assert counts[gc.STATUS_RHS] == (where == "b")
        good = _host(x)[20]
        np.testing.assert_allclose(good, np.linalg.solve(s[20].astype(np.float64),
                                                         b[20].astype(np.float64)),
                                   rtol=0, atol=tol * max(1.0, np.abs(good).max()))


@pytest.mark.parametrize("n", [5, 32, 70])
@pytest.mark.parametrize("bshape", ["vector", "matrix", "batch1", "batch3", "float32"])
def test_gpu_solves_right_hand_side_shapes(rng, n, bshape):
    """The solves' short path for CuPy b (read in place: one b for every
    matrix at batch stride 0, or per-matrix b) on a 2-D batch, and the
    general path (b of another dtype, cast): SciPy's answers in the shape
    NumPy's broadcasting gives, b untouched."""
    import cupy as cp
    batch = (3, 4)
    a = random_batch(rng, batch, n, np.float64) + 2 * np.sqrt(n) * np.eye(n)
    spd = spd_batch(rng, 12, n, np.float64).reshape(batch + (n, n))
    b = {"vector": rng.standard_normal(n), "matrix": rng.standard_normal((n, 2)),
         "batch1": rng.standard_normal(batch + (n, 1)),
         "batch3": rng.standard_normal(batch + (n, 3)),
         "float32": rng.standard_normal(batch + (n, 2)).astype(np.float32)}[bshape]
    bb = b.astype(np.float64)
    full = np.broadcast_to(bb if bb.ndim > 1 else bb[:, None], batch + bb.shape[-2:]
                           if bb.ndim > 1 else batch + (n, 1))
    ref = np.linalg.solve(a, full)
    ref_c = np.linalg.solve(spd, full)
    if bb.ndim == 1:
        ref, ref_c = ref[..., 0], ref_c[..., 0]
    gb = cp.asarray(b)
    lu, piv = g.lu_factor_batched(cp.asarray(a))
    c, low = g.cho_factor_batched(cp.asarray(spd))
    tol = dict(rtol=1e-9, atol=1e-9)
    for x in (g.solve_batched(cp.asarray(a), gb), g.lu_solve_batched((lu, piv), gb)):
        assert x.shape == ref.shape and x.dtype == np.float64
        np.testing.assert_allclose(x.get(), ref, **tol)
    x = g.cho_solve_batched((c, low), gb)
    assert x.shape == ref.shape
    np.testing.assert_allclose(x.get(), ref_c, **tol)
    x, info = g.solve_batched(cp.asarray(a), gb, check_finite=False, return_info=True)
    np.testing.assert_allclose(x.get(), ref, **tol)
    assert info.shape == batch and not info.get().any()
    np.testing.assert_array_equal(gb.get(), b)


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 16, 20, 32, 33, 64, 100])
def test_gpu_cholesky(rng, n, dtype, lower):
    s = spd_batch(rng, 21, n, dtype)
    if n > 1:
        s[:, 0, n - 1] += 3.0 if lower else 0.0
        s[:, n - 1, 0] += 0.0 if lower else 3.0
    c, low = g.cho_factor_batched(_cp(s), lower=lower)
    c = c.get()
    for i in range(0, 21, 4):
        ref, _ = sl.cho_factor(s[i], lower=lower)
        tri = np.tril if lower else np.triu   # SciPy: the other triangle is arbitrary
        np.testing.assert_allclose(tri(c[i]), tri(ref), rtol=0, atol=50 * n * eps(dtype) * np.abs(ref).max())
    b = rng.standard_normal((21, n, 2)).astype(dtype)
    x = g.cho_solve_batched((_cp(c), low), _cp(b)).get()
    ref = np.array([sl.cho_solve((c[i], lower), b[i]) for i in range(21)])
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e3 * n * eps(dtype) * np.abs(ref).max())


@pytest.mark.parametrize("n", [5, 32, 80])
def test_gpu_cholesky_not_pd(rng, n):
    s = spd_batch(rng, 6, n, np.float64)
    s[4, n // 2, n // 2] = -1e3
    with pytest.raises(LinAlgError, match=r"\[4\]"):
        g.cho_factor_batched(_cp(s))
    _, _, info = g.cho_factor_batched(_cp(s), return_info=True)
    np.testing.assert_array_equal(info.get(), [sl.lapack.dpotrf(m)[1] for m in s])


def test_gpu_numpy_in_numpy_out_with_backend_gpu(rng):
    a = random_batch(rng, (4,), 6, np.float64)
    lu, piv = g.lu_factor_batched(a, backend="gpu")
    assert isinstance(lu, np.ndarray)
    np.testing.assert_array_equal(piv, lapack_getrf(a)[1])


def test_gpu_large_batch_many_blocks(rng):
    a = random_batch(rng, (70001,), 8, np.float32)
    lu, piv = g.lu_factor_batched(_cp(a))
    sel = rng.choice(70001, 50, replace=False)
    rl, rp, _ = lapack_getrf(a[sel])
    np.testing.assert_array_equal(piv.get()[sel], rp)
    np.testing.assert_allclose(lu.get()[sel], rl, atol=1e-4)


def test_gpu_lu_large_batch_in_parts(rng):
    """A batch large enough for the blocked LU's parts on streams of their own
    (n = 512): LAPACK's pivots and factors for matrices of every part, one
    singular matrix warned about once and flagged in its part."""
    from scipy_gpuqr.batched import _gpu_blocked as bb
    n, batch = 512, 2 * bb.ROWS_PART_ENTRIES // (512 * 512) + 3
    assert bb.rows_streams(n, batch) >= 2
    a = random_batch(rng, (batch,), n, np.float64)
    bad = batch - 2
    a[bad, :, 7] = 0                          # singular, in the last part
    with pytest.warns(LinAlgWarning) as rec:
        lu, piv = g.lu_factor_batched(_cp(a))
    msg = str(rec[0].message)
    assert len(rec) == 1 and str(bad) in msg and "diagonal number 8 " in msg, msg
    sel = np.r_[0, 1, batch // 2 - 1, batch // 2, batch // 2 + 1, bad, batch - 1]
    rl, rp, ri = lapack_getrf(a[sel])
    assert ri[5] == 8
    lu, piv = lu.get()[sel], piv.get()[sel]
    same = (piv == rp).all(axis=1)
    assert same.sum() >= len(sel) - 1, np.flatnonzero(~same)
    tol = 50 * n * eps(np.float64) * max(1.0, np.abs(rl).max())
    np.testing.assert_allclose(lu[same], rl[same], rtol=0, atol=tol)
    assert lu_backward_error(a[sel], lu, piv) < 20 * n * eps(np.float64)


def test_gpu_block_jacobi_cg(matrices_dir):
    import cupy as cp
    import cupyx.scipy.sparse as xsp
    import scipy.io
    import scipy.sparse as sps
    from cupyx.scipy.sparse.linalg import cg
    A = sps.csr_array(scipy.io.mmread(matrices_dir / "494_bus.mtx", spmatrix=False)).astype(np.float64)
    Ag = xsp.csr_matrix(A)
    b = cp.ones(A.shape[0])
    counts = []
    for M in (None, g.block_jacobi(Ag, 8)):
        it = [0]

        def cb(_):
            it[0] += 1
        x, flag = cg(Ag, b, M=M, callback=cb, maxiter=10000)
        counts.append(it[0])
        assert float(cp.linalg.norm(Ag @ x - b)) <= 1e-4 * float(cp.linalg.norm(b))
    assert counts[1] < counts[0]
    Mc = g.block_jacobi(A, 8)
    v = np.random.default_rng(0).standard_normal(A.shape[0])
    np.testing.assert_allclose(g.block_jacobi(Ag, 8).matvec(cp.asarray(v)).get().ravel(),
                               Mc.matvec(v).ravel(), rtol=1e-10)


@pytest.mark.parametrize("bs", [1, 3, 8, 40])
def test_gpu_block_jacobi_gather_kernel(rng, bs):
    """The diagonal blocks gathered on the GPU (one kernel over CSR rows, int32
    and int64 indices, duplicates summed; CSC and COO through CSR; a dense
    matrix by a strided copy) equal the CPU scatter's, ragged last block
    included; outputs poisoned beforehand."""
    import cupy as cp
    import cupyx.scipy.sparse as xsp
    import scipy.sparse as sps
    from scipy_gpuqr.batched import _jacobi
    n = 203
    A = sps.random(n, n, density=0.08, random_state=3, format="coo")
    A = sps.coo_array((np.r_[A.data, [1.5, 2.5]], (np.r_[A.row, [5, 5]], np.r_[A.col, [6, 6]])),
                       shape=(n, n))                      # a duplicate, summed
    for dtype in (np.float64, np.float32):
        ref_full, ref_last = _jacobi._blocks(A.row.astype(np.int64), A.col.astype(np.int64),
                                             A.data, n, bs, np, dtype)
        csr = xsp.csr_matrix(A.tocsr().astype(dtype))
        wide = xsp.csr_matrix((csr.data, csr.indices.astype(cp.int64),
                               csr.indptr.astype(cp.int64)), shape=(n, n))
        dense = cp.asarray(A.toarray().astype(dtype))
        for M in (csr, wide, xsp.csc_matrix(csr), xsp.coo_matrix(A.astype(dtype)), dense):
            full, last = _jacobi._gpu_blocks(M, n, bs, dtype)
            assert full.dtype == dtype and last.dtype == dtype
            np.testing.assert_allclose(full.get(), ref_full, rtol=1e-6, atol=0)
            np.testing.assert_allclose(last.get(), ref_last, rtol=1e-6, atol=0)
    M = g.block_jacobi(xsp.csr_matrix(A.tocsr() + 10 * sps.eye(n)), bs)
    Mc = g.block_jacobi(A.tocsr() + 10 * sps.eye(n), bs)
    v = rng.standard_normal(n)
    np.testing.assert_allclose(M.matvec(cp.asarray(v)).get().ravel(), Mc.matvec(v).ravel(),
                               rtol=1e-10)


@pytest.mark.parametrize("bs", [4, 8, 40])
def test_gpu_block_jacobi_short_path(rng, monkeypatch, bs):
    """A CuPy CSR or dense matrix takes block_jacobi's short path: the gather
    and the inverses of the full and the ragged blocks read one status word
    (no call of the public inverse), and the operator applies exactly what
    the general path (``backend='gpu'``: the public inv_batched per stack)
    gives, float32 and float64, with and without a ragged last block; a
    singular full or ragged block raises the general path's LinAlgError, an
    inf raises its ValueError, and without check_finite both paths answer
    the same."""
    import cupy as cp
    import cupyx.scipy.sparse as xsp
    import scipy.sparse as sps
    from scipy_gpuqr.batched import _functions, _gpu_common
    reads, inverses = [], []
    real_read, real_inv = _gpu_common.read_status, _functions.inv_batched

    def read(st):
        reads.append(st.buf.size)
        return real_read(st)

    def inv(*args, **kwargs):
        inverses.append(args[0].shape)
        return real_inv(*args, **kwargs)
    monkeypatch.setattr(_gpu_common, "read_status", read)
    monkeypatch.setattr(_functions, "inv_batched", inv)
    for n in (6 * bs, 6 * bs + 3):
        d = sps.random(n, n, density=0.2, random_state=n, format="csr") + 4 * sps.eye(n)
        for dtype in (np.float64, np.float32):
            A = xsp.csr_matrix(d.astype(dtype))
            for M in (A, A.toarray()):
                del reads[:], inverses[:]
                op = g.block_jacobi(M, bs)
                assert reads == [_SLOTS] and inverses == [], (reads, inverses)
                ref = g.block_jacobi(M, bs, backend="gpu")
                assert len(inverses) == (2 if n % bs else 1)
                assert op.dtype == ref.dtype == dtype and op.shape == (n, n)
                x = cp.asarray(rng.standard_normal((n, 2)), dtype=dtype)
                np.testing.assert_array_equal(op.matmat(x).get(), ref.matmat(x).get())
                np.testing.assert_array_equal(op.matvec(x[:, 0]).get(),
                                              ref.matvec(x[:, 0]).get())
    n = 6 * bs + 3
    for row, match in ((bs + 1, r"block index = batch index.*\[1\]"),
                       (n - 1, "ragged last diagonal block")):
        d = np.eye(n)
        d[row, row] = 0
        with pytest.raises(LinAlgError, match=match):
            g.block_jacobi(xsp.csr_matrix(sps.csr_array(d)), bs)
        with pytest.raises(LinAlgError, match=match):
            g.block_jacobi(sps.csr_array(d), bs)
    d = np.eye(n)
    d[2, 2] = np.inf
    with pytest.raises(ValueError, match="infs or NaNs"):
        g.block_jacobi(xsp.csr_matrix(sps.csr_array(d)), bs)
    outcomes = []
    for backend in (None, "gpu"):
        del reads[:]
        try:
            g.block_jacobi(xsp.csr_matrix(sps.csr_array(d)), bs, check_finite=False,
                           backend=backend)
            outcomes.append(None)
        except LinAlgError as exc:       # the inf's block may read as singular
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert reads and all(r == _SLOTS for r in reads)


def _jacobi_csr(rng, n, bs, dtype, index):
    """A CuPy CSR matrix of order n with ``index`` indices: entries inside
    and outside the diagonal blocks, each row's entries in a random storage
    order, a duplicate (summed), an explicit zero, a row holding its
    diagonal only, and well-conditioned diagonal blocks (every 5th with an
    exact tie between the candidates of its first pivot)."""
    import cupyx.scipy.sparse as xsp
    import scipy.sparse as sps
    d = sps.random(n, n, density=min(1.0, 6.0 / n), random_state=n + bs,
                   format="coo", dtype=np.float64)
    blk = np.arange(n) // bs
    r, c = np.nonzero(blk[:, None] == blk[None, :])
    v = rng.standard_normal(r.size)
    v[r == c] += 2.0 * bs
    for k in range(0, -(-n // bs), 5):
        lo = k * bs
        if lo + 1 < n and blk[lo + 1] == k:
            v[(r == lo + 1) & (c == lo)] = v[(r == lo) & (c == lo)]
    rows = np.r_[d.row, r, [0, 1]]
    cols = np.r_[d.col, c, [0, min(2, n - 1)]]
    vals = np.r_[d.data, v, [0.25, 0.0]]
    alone = n // 2
    keep = (rows != alone) | (cols == alone)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    perm = rng.permutation(rows.size)
    rows, cols, vals = rows[perm], cols[perm], vals[perm]
    order = np.argsort(rows, kind="stable")       # by row, random order inside
    it = np.int32 if index == "int32" else np.int64
    indptr = np.r_[0, np.cumsum(np.bincount(rows, minlength=n))].astype(it)
    h = sps.csr_array((vals[order].astype(dtype), cols[order].astype(it), indptr),
                      shape=(n, n))
    A = xsp.csr_matrix(h)
    if A.indices.dtype != it:                     # cupyx may narrow the indices
        A.indices, A.indptr = A.indices.astype(it), A.indptr.astype(it)
    return A


@pytest.mark.parametrize("bs", [1, 2, 3, 4, 5, 8, 13, 16, 20, 24, 27, 32])
def test_gpu_block_jacobi_fused_inverse(rng, monkeypatch, bs):
    """The short path reads the diagonal blocks straight from CSR in the
    inverse kernel (one launch per stack: the full blocks, the ragged last
    one), on every kernel shape (a thread per matrix, warp tiles of every
    register size, the tensor cores' order), float32/float64, int32/int64
    indices, unsorted rows with duplicates, entries outside the blocks and
    ragged last blocks of several orders: its inverses equal to the bit the
    gather followed by the inverse driver (inv_batched's kernels) and
    LAPACK's inverse of the CPU-gathered blocks to rounding; outputs
    poisoned beforehand."""
    from scipy_gpuqr.batched import _gpu, _gpu_common, _jacobi
    launches = []
    real_launch = _gpu_common.launch

    def launch(fptr, *args):
        launches.append(fptr)
        return real_launch(fptr, *args)
    monkeypatch.setattr(_gpu_common, "launch", launch)
    dev = _gpu_common.device_id()
    for rest in sorted({0, 1, bs // 2, bs - 1} - {bs} if bs > 1 else {0}):
        n = 37 * bs + rest                        # 37 blocks: not whole warp tiles
        for dtype in (np.float64, np.float32):
            dt = np.dtype(dtype)
            for index in ("int32", "int64"):
                A = _jacobi_csr(rng, n, bs, dtype, index)
                del launches[:]
                arrays = _jacobi._short_sparse(A, bs, dt, dev, _gpu_common.NO_REPORT)
                inv_full, inv_last = arrays()
                assert len(launches) == (2 if rest else 1), (bs, rest, len(launches))
                full, last = _jacobi._gpu_blocks(A, n, bs, dt, dev)
                ref_full = _gpu.getri(full)[0]
                np.testing.assert_array_equal(inv_full.get(), ref_full.get())
                assert (inv_last is None) == (rest == 0)
                if rest:
                    np.testing.assert_array_equal(inv_last.get(), _gpu.getri(last)[0].get())
                h = sps_blocks(A.get(), n, bs, dtype)
                tol = 200 * bs * float(np.finfo(dtype).eps)
                want = np.linalg.inv(h[0].astype(np.float64))
                got = inv_full.get().astype(np.float64)
                assert np.abs(got - want).max() <= tol * np.abs(want).max(), (bs, rest, dtype)
                if rest:
                    want = np.linalg.inv(h[1].astype(np.float64))
                    assert (np.abs(inv_last.get() - want).max()
                            <= tol * np.abs(want).max()), (bs, rest, dtype)
    # the public call: its kernels are those launches and nothing else runs
    A = _jacobi_csr(rng, 11 * bs + (bs - 1), bs, np.float64, "int32")
    del launches[:]
    g.block_jacobi(A, bs)
    assert len(launches) == (2 if bs > 1 else 1)


def sps_blocks(A, n, bs, dtype):
    """(full, ragged) diagonal blocks of a SciPy matrix by the CPU scatter."""
    from scipy_gpuqr.batched import _jacobi
    coo = A.tocoo()
    return _jacobi._blocks(coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data,
                           n, bs, np, dtype)


@pytest.mark.parametrize("bs", [2, 8, 32])
def test_gpu_block_jacobi_fused_singular_and_nonfinite(rng, bs):
    """The fused kernels' status: a singular full or ragged block (an empty
    row) raises the general path's LinAlgError naming it; an inf or a NaN
    raises its ValueError with check_finite and, without, the inverse of
    that block is all NaN or the call raises as the general path does."""
    import cupyx.scipy.sparse as xsp
    import scipy.sparse as sps
    n = 9 * bs + 1 if bs > 1 else 9
    for row, match in ((bs + (bs > 1), r"block index = batch index.*\[1\]"),
                       (n - 1, "ragged last diagonal block")):
        d = sps.lil_array(np.eye(n) * 2.0)
        d[row, row] = 0.0
        for dtype in (np.float64, np.float32):
            A = xsp.csr_matrix(sps.csr_array(d).astype(dtype))
            with pytest.raises(LinAlgError, match=match):
                g.block_jacobi(A, bs)
    for bad in (np.inf, np.nan):
        d = np.eye(n) * 2.0
        d[1, 0] = bad
        A = xsp.csr_matrix(sps.csr_array(d))
        with pytest.raises(ValueError, match="infs or NaNs"):
            g.block_jacobi(A, bs)
        outcomes = []
        for backend in (None, "gpu"):
            try:
                op = g.block_jacobi(A, bs, check_finite=False, backend=backend)
                outcomes.append(np.isnan(op.matvec(_cp(np.ones(n))).get()).tolist())
            except LinAlgError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]


# ---------------------------------------------------------------------------
# the public call path: device-side info, one status read, no per-matrix copy
# ---------------------------------------------------------------------------

def _guarded_outputs(monkeypatch):
    """Outputs poisoned and of a cupy.ndarray subclass whose get() refuses more
    than MAX_NAMED elements (a host copy of info or of a result; the indices
    an error message names may come over); returns the list of status reads
    the calls make (each the size of the word read: STATUS_SLOTS slots)."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common

    class NoHostCopy(cp.ndarray):
        def get(self, *args, **kwargs):
            assert self.size <= 10, f"host copy of a per-matrix array ({self.shape})"
            return super().get(*args, **kwargs)

    poison_gpu_outputs(monkeypatch, NoHostCopy)
    reads = []
    real_read = _gpu_common.read_status

    def read(st):
        reads.append(st.buf.size)
        return real_read(st)
    monkeypatch.setattr(_gpu_common, "read_status", read)
    return reads


def _host(x):
    import cupy as cp
    return cp.ndarray.get(x)         # the base class's get: past the guard


#: Slots of a status word (one read of the public calls).
_SLOTS = 5


@pytest.mark.parametrize("n", [8, 32, 40, 100])
def test_gpu_one_singular_warns_once_without_host_copy_of_info(rng, monkeypatch, n):
    """One exactly singular matrix in a 2-D batch: lu_factor_batched warns
    once naming its index (and its info), inv_batched / solve_batched raise
    naming it; each call reads one status word (40 bytes) and copies no
    per-matrix array (info, results) to the host."""
    import warnings
    import cupy as cp
    reads = _guarded_outputs(monkeypatch)
    batch = (24, 40)
    a = random_batch(rng, batch, n, np.float64) + 3 * np.eye(n)
    a[17, 33, :, 5] = 0
    ref_info = lapack_getrf(a[17, 33][None])[2][0]
    assert ref_info == 6
    ga = cp.asarray(a)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lu, piv = g.lu_factor_batched(ga)
    assert len(caught) == 1 and issubclass(caught[0].category, LinAlgWarning)
    msg = str(caught[0].message)
    assert "[(17, 33)]" in msg and "diagonal number 6 " in msg, msg
    assert reads == [_SLOTS]
    del reads[:]
    with pytest.raises(LinAlgError, match=r"\[\(17, 33\)\]"):
        g.inv_batched(ga)
    with pytest.raises(LinAlgError, match=r"\[\(17, 33\)\]"):
        g.solve_batched(ga, cp.ones(n))
    assert reads == [_SLOTS, _SLOTS]
    # return_info: info stays on the device, the singular matrix's results are NaN
    del reads[:]
    x, info = g.inv_batched(ga, return_info=True)
    expect = np.zeros(batch, dtype=np.int32)
    expect[17, 33] = ref_info
    np.testing.assert_array_equal(_host(info), expect)
    xh = _host(x)
    assert np.isnan(xh[17, 33]).all() and np.isfinite(np.delete(xh.reshape(-1, n, n),
                                                                17 * 40 + 33, 0)).all()
    assert reads == [_SLOTS]


@pytest.mark.parametrize("n", [8, 40])
def test_gpu_status_reads_one_call_each(rng, n):
    """The status word read back gives each call its own marks: a singular
    matrix warns (named), an inf raises (named), the solves name b, a clean
    call after them neither warns nor raises, and inv_vbatched's one-pass
    summary names its singular matrix."""
    import warnings
    import cupy as cp
    a = random_batch(rng, (12,), n, np.float64) + 3 * np.eye(n)
    bad = a.copy()
    bad[7, :, 2] = 0
    with pytest.warns(LinAlgWarning, match=r"\[7\]"):
        g.lu_factor_batched(cp.asarray(bad))
    bad[3, 1, 1] = np.inf
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[3\]"):
        g.inv_batched(cp.asarray(bad))
    lu, piv = g.lu_factor_batched(cp.asarray(a))
    b = rng.standard_normal((12, n, 1))
    b[5, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"in b"):
        g.lu_solve_batched((lu, piv), cp.asarray(b))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = g.solve_batched(cp.asarray(a), cp.ones(n))
    np.testing.assert_allclose(x.get(), np.linalg.solve(a, np.ones((12, n, 1)))[..., 0],
                               rtol=1e-9, atol=1e-9)
    vb = a[:7].copy()
    vb[6, :, 2] = 0
    with pytest.raises(LinAlgError, match=r"index \[6\]"):
        g.inv_vbatched(cp.asarray(vb), cp.full(7, n))


@pytest.mark.parametrize("n", [3, 8, 32, 40])
def test_gpu_return_info_without_check_finite_is_asynchronous(rng, monkeypatch, n):
    """return_info=True, check_finite=False reads nothing back: info (with
    the non-finite matrix's -1 cleared to 0) and the NaN results of the
    singular matrix come from the device."""
    import cupy as cp
    reads = _guarded_outputs(monkeypatch)
    a = random_batch(rng, (16,), n, np.float64) + 3 * np.eye(n)
    a[2, :, 1] = 0                                 # singular: info 2
    a[5, n - 1, 0] = np.nan                        # non-finite: info 0 here
    ga = cp.asarray(a)
    ok = [i for i in range(16) if i not in (2, 5)]
    expect = np.zeros(16, dtype=np.int32)
    expect[2] = 2
    _, _, info = g.lu_factor_batched(ga, check_finite=False, return_info=True)
    np.testing.assert_array_equal(_host(info), expect)
    x, info = g.inv_batched(ga, check_finite=False, return_info=True)
    np.testing.assert_array_equal(_host(info), expect)
    xh = _host(x)
    assert np.isnan(xh[2]).all() and np.isfinite(xh[ok]).all()
    b = rng.standard_normal((16, n, 2))
    x, info = g.solve_batched(ga, cp.asarray(b), check_finite=False, return_info=True)
    np.testing.assert_array_equal(_host(info), expect)
    xh = _host(x)
    assert np.isnan(xh[2]).all()
    np.testing.assert_allclose(xh[ok], np.linalg.solve(a[ok], b[ok]), rtol=1e-8, atol=1e-8)
    s = spd_batch(rng, 16, n, np.float64)
    s[4, n // 2, n // 2] = -1e3
    _, _, info = g.cho_factor_batched(cp.asarray(s), check_finite=False, return_info=True)
    np.testing.assert_array_equal(_host(info), [sl.lapack.dpotrf(m)[1] for m in s])
    assert reads == []
    # with check_finite the non-finite matrix is named (one status read)
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[5\]"):
        g.inv_batched(ga, return_info=True)
    assert reads == [_SLOTS]


@pytest.mark.parametrize("n", [5, 40, 70])
def test_gpu_solves_check_finite(rng, n):
    """The solves check the factor and b as SciPy does (the whole of c for
    cho_solve), in the solve kernels for n <= 32 and n > 64 and by a pass
    beside solve_smem for 32 < n <= 64; b of shape (n,) is broadcast to every
    matrix without a copy."""
    import cupy as cp
    a = random_batch(rng, (6,), n, np.float64) + 2 * np.sqrt(n) * np.eye(n)
    ga = cp.asarray(a)
    lu, piv = g.lu_factor_batched(ga)
    b = rng.standard_normal((6, n, 2))
    v = rng.standard_normal(n)
    vs = np.tile(v[:, None], (6, 1, 1))          # the broadcast vector as (6, n, 1)
    for trans in (0, 1):
        x = g.lu_solve_batched((lu, piv), cp.asarray(v), trans=trans).get()
        ref = np.linalg.solve(a.transpose(0, 2, 1) if trans else a, vs[:6])[..., 0]
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(g.solve_batched(ga, cp.asarray(v)).get(),
                               np.linalg.solve(a, vs[:6])[..., 0], rtol=1e-9, atol=1e-9)
    bad_b = b.copy()
    bad_b[4, n - 1, 1] = np.nan
    with pytest.raises(ValueError, match=r"infs or NaNs \(in b\)"):
        g.lu_solve_batched((lu, piv), cp.asarray(bad_b))
    with pytest.raises(ValueError, match=r"infs or NaNs \(in b\)"):
        g.solve_batched(ga, cp.asarray(bad_b))
    x = g.solve_batched(ga, cp.asarray(bad_b), check_finite=False).get()
    np.testing.assert_allclose(x[:4], np.linalg.solve(a[:4], b[:4]), rtol=1e-8, atol=1e-8)
    for i, j in ((0, n - 1), (n - 1, 0), (n // 2, n // 2)):
        bad_lu = lu.copy()
        bad_lu[3, i, j] = np.inf
        for trans in (0, 1):
            with pytest.raises(ValueError, match=r"infs or NaNs \(in lu\)"):
                g.lu_solve_batched((bad_lu, piv), cp.asarray(b), trans=trans)
        g.lu_solve_batched((bad_lu, piv), cp.asarray(b), check_finite=False)
    s = spd_batch(rng, 5, n, np.float64)
    for lower in (False, True):
        c, low = g.cho_factor_batched(cp.asarray(s), lower=lower)
        x = g.cho_solve_batched((c, low), cp.asarray(v)).get()
        np.testing.assert_allclose(x, np.linalg.solve(s, vs[:5])[..., 0],
                                   rtol=1e-9, atol=1e-9)
        c_bad = c.copy()                  # a NaN in the triangle the solve does not use
        if lower:
            c_bad[2, 0, n - 1] = np.nan
        else:
            c_bad[2, n - 1, 0] = np.nan
        with pytest.raises(ValueError, match=r"infs or NaNs \(in c\)"):
            g.cho_solve_batched((c_bad, low), cp.asarray(b[:5]))
        with pytest.raises(ValueError, match=r"infs or NaNs \(in b\)"):
            g.cho_solve_batched((c, low), cp.asarray(bad_b[:5]))


@pytest.mark.parametrize("n", [2, 8, 32])
def test_gpu_small_calls_are_one_launch_without_info_pass(rng, monkeypatch, n):
    """For n <= 32 the factorization kernels report to the status word
    themselves: no pass over info (scan_info) runs, with or without
    return_info, and a status word is never cleared by a launch."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common
    scans = []
    monkeypatch.setattr(_gpu_common, "scan_info", lambda *a, **k: scans.append(a))
    a = random_batch(rng, (20,), n, np.float64) + 3 * np.eye(n)
    a[4, :, 1] = 0                                  # singular
    ga = cp.asarray(a)
    with pytest.warns(LinAlgWarning, match=r"\[4\]"):
        g.lu_factor_batched(ga)
    with pytest.raises(LinAlgError, match=r"\[4\]"):
        g.inv_batched(ga)
    with pytest.raises(LinAlgError, match=r"\[4\]"):
        g.solve_batched(ga, cp.ones(n))
    g.lu_factor_batched(ga, return_info=True, check_finite=False)
    x, info = g.inv_batched(ga, return_info=True, check_finite=False)
    assert np.isnan(_host(x)[4]).all() and int(_host(info)[4]) == 2
    s = spd_batch(rng, 20, n, np.float64)
    s[7, 0, 0] = -1.0
    with pytest.raises(LinAlgError, match=r"\[7\]"):
        g.cho_factor_batched(cp.asarray(s))
    assert scans == []


def test_gpu_status_read_by_polling(rng, monkeypatch):
    """STATUS_WAIT = "poll" (cudaStreamQuery in a loop instead of a stream
    synchronization): the same warnings, errors and results."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common as gc
    monkeypatch.setattr(gc, "STATUS_WAIT", "poll")
    a = random_batch(rng, (30,), 8, np.float64) + 3 * np.eye(8)
    a[4, :, 1] = 0
    ga = cp.asarray(a)
    with pytest.warns(LinAlgWarning, match=r"\[4\]"):
        lu, piv = g.lu_factor_batched(ga)
    np.testing.assert_array_equal(_host(piv)[5:], lapack_getrf(a[5:])[1])
    with pytest.raises(LinAlgError, match=r"\[4\]"):
        g.solve_batched(ga, cp.ones(8))
    good = cp.asarray(a[5:])
    np.testing.assert_allclose(_host(g.solve_batched(good, cp.ones(8))),
                               np.linalg.solve(a[5:], np.ones(8)), rtol=1e-10, atol=1e-10)


def test_gpu_status_marks_of_earlier_calls_are_ignored(rng):
    """A status word holds the marks of whichever call last saw something:
    a later call on good matrices neither warns nor raises, even after a
    kernel marked the word for a call that never read it."""
    import warnings
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    for n in (8, 40):
        good = cp.asarray(random_batch(rng, (30,), n, np.float64) + 3 * np.eye(n))
        bad = good.copy()
        bad[3, :, 0] = 0
        bad[5, 1, 1] = np.nan
        with pytest.raises(ValueError, match=r"\[5\]"):
            g.lu_factor_batched(bad)
        bg.getrf(bad, report=gc.report_args(gc.new_status()))   # marked, never read
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lu, piv = g.lu_factor_batched(good)
            g.inv_batched(good)
            g.solve_batched(good, cp.ones(n))
        np.testing.assert_array_equal(_host(piv), lapack_getrf(_host(good))[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,kernel", [(1, None), (2, None), (3, None), (8, None),
                                      (17, None), (24, None), (32, "warp"), (32, None),
                                      (27, "warp"), (27, None)])
def test_gpu_inverse_kernels_write_nan_and_clear_info(rng, n, kernel, dtype):
    """getri's report flags applied by every inverse kernel variant (a thread
    per matrix, a row per lane, the 2-D row split, the tensor cores): the
    singular matrices' results all NaN, info < 0 cleared, the others exact."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    if kernel is None and dtype == np.float32 and n in (27, 32):
        kernel = "warp"
    a = random_batch(rng, (40,), n, dtype) + 3 * np.eye(n, dtype=dtype)
    a[[3, 17, 33], :, n - 1] = 0                   # singular: info n
    a[9, 0, n - 1] = np.inf                         # non-finite: info -1 -> 0
    st = gc.new_status()
    x, info = bg.getri(cp.asarray(a), kernel=kernel,
                       report=gc.report_args(st, clear_neg=True, nan_fill=True))
    marks = gc.read_status(st)
    assert marks[gc.STATUS_SINGULAR] == 1 and marks[gc.STATUS_NONFINITE] == 1
    x, info = _host(x), _host(info)
    expect = np.zeros(40, dtype=np.int32)
    expect[[3, 17, 33]] = n
    np.testing.assert_array_equal(info, expect)
    assert np.isnan(x[[3, 17, 33]]).all()
    ok = [i for i in range(40) if i not in (3, 9, 17, 33)]
    ref = np.linalg.inv(a[ok].astype(np.float64))
    cond = max(np.linalg.cond(m) for m in a[ok].astype(np.float64))
    np.testing.assert_allclose(x[ok], ref, rtol=0,
                               atol=30 * n * eps(dtype) * cond * np.abs(ref).max())
