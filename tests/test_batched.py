"""CPU path of the batched LU / inverse / Cholesky against scipy.linalg per matrix."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg as sl
import scipy.sparse as sps
from scipy.linalg import LinAlgError, LinAlgWarning

import scipy_gpuqr as g
from test_batched_cases import (DTYPES, SIZES, eps, ill_conditioned_batch,
                            lapack_getrf, lu_backward_error, random_batch,
                            singular_batch, spd_batch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_lu_factor_matches_scipy(rng, n, dtype):
    a = random_batch(rng, (2, 3), n, dtype)
    a0 = a.copy()
    lu, piv = g.lu_factor_batched(a)
    assert lu.dtype == dtype and lu.shape == a.shape
    assert piv.dtype == np.int32 and piv.shape == (2, 3, n)
    ref_lu, ref_piv, ref_info = lapack_getrf(a.reshape(-1, n, n))
    np.testing.assert_array_equal(piv.reshape(-1, n), ref_piv)
    tol = 50 * n * eps(dtype) * max(1.0, np.abs(ref_lu).max())
    np.testing.assert_allclose(lu.reshape(-1, n, n), ref_lu, rtol=0, atol=tol)
    np.testing.assert_array_equal(a, a0)   # input untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3, 8, 17, 32, 40, 64])
def test_lu_ill_conditioned(rng, n, dtype):
    a = ill_conditioned_batch(rng, 6, n, dtype, cond=1e5 if dtype == np.float32 else 1e12)
    lu, piv = g.lu_factor_batched(a)
    assert lu_backward_error(a, lu, piv) < 20 * n * eps(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 5, 16, 33, 64])
def test_lu_singular_warns_and_info(rng, n, dtype):
    a = singular_batch(rng, 5, n, dtype)
    _, _, ref_info = lapack_getrf(a)
    with pytest.warns(LinAlgWarning, match=r"batch index \[0, 2, 4\]"):
        g.lu_factor_batched(a)
    lu, piv, info = g.lu_factor_batched(a, return_info=True)
    np.testing.assert_array_equal(info, ref_info)
    assert lu_backward_error(a, lu, piv) < 20 * n * eps(dtype)


@pytest.mark.parametrize("n", [8, 32, 40])
def test_one_singular_warns_once_naming_it(rng, n):
    """CPU path of the check the GPU test of the same name makes: one exactly
    singular matrix in a 2-D batch, lu_factor_batched warns once naming its
    index and its info, inv_batched / solve_batched raise naming it, and
    return_info gives that info for that matrix only (no warning)."""
    import warnings
    batch = (24, 40)
    a = random_batch(rng, batch, n, np.float64) + 3 * np.eye(n)
    a[17, 33, :, 5] = 0
    ref_info = lapack_getrf(a[17, 33][None])[2][0]
    assert ref_info == 6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g.lu_factor_batched(a)
    assert len(caught) == 1 and issubclass(caught[0].category, LinAlgWarning)
    msg = str(caught[0].message)
    assert "[(17, 33)]" in msg and "diagonal number 6 " in msg, msg
    with pytest.raises(LinAlgError, match=r"\[\(17, 33\)\]"):
        g.inv_batched(a)
    with pytest.raises(LinAlgError, match=r"\[\(17, 33\)\]"):
        g.solve_batched(a, np.ones(n))
    expect = np.zeros(batch, dtype=np.int32)
    expect[17, 33] = ref_info
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, info = g.lu_factor_batched(a, return_info=True)
    np.testing.assert_array_equal(info, expect)


def test_lu_names_at_most_ten(rng):
    a = np.zeros((25, 3, 3))
    with pytest.warns(LinAlgWarning, match="and 15 more"):
        g.lu_factor_batched(a)


@pytest.mark.parametrize("trans", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 4, 13, 32, 37, 70])
def test_lu_solve(rng, n, trans):
    a = random_batch(rng, (4,), n, np.float64)
    lu, piv = g.lu_factor_batched(a)
    b = rng.standard_normal((4, n, 3))
    x = g.lu_solve_batched((lu, piv), b, trans=trans)
    for i in range(4):
        ref = sl.lu_solve(sl.lu_factor(a[i]), b[i], trans=trans)
        np.testing.assert_allclose(x[i], ref, rtol=1e-9, atol=1e-9)
    # one vector for all matrices
    v = rng.standard_normal(n)
    xv = g.lu_solve_batched((lu, piv), v)
    assert xv.shape == (4, n)
    np.testing.assert_allclose(np.einsum("bij,bj->bi", a, xv), np.broadcast_to(v, (4, n)),
                               atol=1e-8 * n)


def test_lu_solve_complex(rng):
    a = rng.standard_normal((3, 6, 6)) + 1j * rng.standard_normal((3, 6, 6))
    lu, piv = g.lu_factor_batched(a)
    for i in range(3):
        rl, rp = sl.lu_factor(a[i])
        np.testing.assert_array_equal(piv[i], rp)
        np.testing.assert_allclose(lu[i], rl, atol=1e-12)
    b = rng.standard_normal((3, 6, 2)) + 0j
    for trans in (0, 1, 2):
        x = g.lu_solve_batched((lu, piv), b, trans=trans)
        for i in range(3):
            np.testing.assert_allclose(x[i], sl.lu_solve((lu[i], piv[i]), b[i], trans=trans),
                                       atol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 7, 16, 31, 32, 40, 64, 128])
def test_inv_matches_scipy(rng, n, dtype):
    a = random_batch(rng, (5,), n, dtype) + 2 * np.eye(n, dtype=dtype)
    x = g.inv_batched(a)
    assert x.dtype == dtype
    ref = np.array([sl.inv(m) for m in a])
    cond = max(np.linalg.cond(m.astype(np.float64)) for m in a)
    np.testing.assert_allclose(x, ref, rtol=0, atol=20 * n * eps(dtype) * cond * np.abs(ref).max())


def test_inv_singular_raises_and_info(rng):
    a = singular_batch(rng, 6, 5, np.float64)
    with pytest.raises(LinAlgError, match=r"batch index \[0, 2, 4\]"):
        g.inv_batched(a)
    x, info = g.inv_batched(a, return_info=True)
    assert (info[[0, 2, 4]] > 0).all() and (info[[1, 3, 5]] == 0).all()
    assert np.isnan(x[0]).all()
    np.testing.assert_allclose(x[1], sl.inv(a[1]), rtol=1e-10)


@pytest.mark.parametrize("n", [1, 3, 32, 50])
def test_solve_shapes(rng, n):
    a = random_batch(rng, (2, 3), n, np.float64)
    b = rng.standard_normal((2, 3, n, 4))
    x = g.solve_batched(a, b)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-8, atol=1e-8)
    b1 = rng.standard_normal((2, 3, n, 1))
    assert g.solve_batched(a, b1).shape == (2, 3, n, 1)
    v = rng.standard_normal(n)
    xv = g.solve_batched(a, v)
    assert xv.shape == (2, 3, n)
    bb = rng.standard_normal((n, 2))   # broadcast over the batch
    np.testing.assert_allclose(g.solve_batched(a, bb), np.linalg.solve(a, np.broadcast_to(bb, (2, 3, n, 2))),
                               rtol=1e-8, atol=1e-8)
    with pytest.raises(ValueError, match="incompatible shapes"):
        g.solve_batched(a, rng.standard_normal((2, 3, n + 1, 1)))


def test_solve_singular(rng):
    a = singular_batch(rng, 4, 3, np.float64)
    with pytest.raises(LinAlgError, match=r"\[0, 2\]"):
        g.solve_batched(a, np.ones(3))
    x, info = g.solve_batched(a, np.ones(3), return_info=True)
    assert np.isnan(x[0]).all() and np.isfinite(x[1]).all()
    assert list(info > 0) == [True, False, True, False]


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 9, 32, 33, 64])
def test_cholesky(rng, n, dtype, lower):
    s = spd_batch(rng, 4, n, dtype)
    # make the unread triangle differ so reading the wrong one is caught
    s_in = s.copy()
    if n > 1:
        if lower:
            s_in[:, 0, n - 1] += 7
        else:
            s_in[:, n - 1, 0] += 7
    c, low = g.cho_factor_batched(s_in, lower=lower)
    assert low is lower and c.dtype == dtype
    for i in range(4):
        ref, _ = sl.cho_factor(s_in[i], lower=lower)
        tri = np.tril if lower else np.triu   # SciPy: the other triangle is arbitrary
        np.testing.assert_allclose(tri(c[i]), tri(ref), rtol=0, atol=50 * n * eps(dtype) * np.abs(ref).max())
    b = rng.standard_normal((4, n, 2)).astype(dtype)
    x = g.cho_solve_batched((c, low), b)
    ref = np.array([sl.cho_solve((c[i], lower), b[i]) for i in range(4)])
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e3 * n * eps(dtype) * np.abs(ref).max())


def test_cholesky_not_pd(rng):
    s = spd_batch(rng, 5, 6, np.float64)
    s[3, 2, 2] = -100.0
    with pytest.raises(LinAlgError, match=r"batch index \[3\]"):
        g.cho_factor_batched(s)
    _, _, info = g.cho_factor_batched(s, return_info=True)
    ref = [sl.lapack.dpotrf(m, lower=0)[1] for m in s]
    np.testing.assert_array_equal(info, ref)


def test_cho_solve_accepts_scipy_lower_array(rng):
    s = spd_batch(rng, 3, 4, np.float64)
    c, low = sl.cho_factor(s)          # SciPy's batched form: lower is an array
    x = g.cho_solve_batched((c, low), np.ones((3, 4, 1)))
    np.testing.assert_allclose(x, np.linalg.solve(s, np.ones((3, 4, 1))), rtol=1e-10)


@pytest.mark.parametrize("func", [g.lu_factor_batched, g.inv_batched, g.cho_factor_batched])
def test_dtypes(func):
    a = np.array([[[4, 1], [1, 3]]] * 3)
    out = func(a)
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == np.float64
    assert (func(a.astype(np.float16))[0] if func is not g.inv_batched
            else func(a.astype(np.float16))).dtype == np.float32


@pytest.mark.parametrize("func", [g.lu_factor_batched, g.inv_batched, g.cho_factor_batched])
def test_bad_input(func):
    with pytest.raises(ValueError, match="shape"):
        func(np.ones(3))
    with pytest.raises(ValueError, match="square"):
        func(np.ones((2, 3, 4)))
    a = np.tile(np.eye(3), (4, 1, 1))
    a[2, 1, 1] = np.nan
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[2\]"):
        func(a)
    with pytest.raises(ValueError, match="numeric"):
        func(np.array([[["a"]]]))
    with pytest.raises(ValueError, match="sparse"):
        func(sps.eye(3, format="csr"))


@pytest.mark.parametrize("shape", [(0, 4, 4), (3, 0, 0), (2, 0, 5, 5)])
def test_empty(shape):
    a = np.zeros(shape)
    lu, piv = g.lu_factor_batched(a)
    assert lu.shape == shape and piv.shape == shape[:-1]
    assert g.inv_batched(a).shape == shape
    c, _ = g.cho_factor_batched(a)
    assert c.shape == shape
    assert g.solve_batched(a, np.zeros(shape[:-1] + (1,))).shape == shape[:-1] + (1,)


def test_single_matrix_no_batch(rng):
    a = rng.standard_normal((6, 6))
    lu, piv = g.lu_factor_batched(a)
    rl, rp = sl.lu_factor(a)
    np.testing.assert_array_equal(piv, rp)
    np.testing.assert_allclose(lu, rl, atol=1e-12)


def test_backend_value_checked(rng):
    with pytest.raises(ValueError, match="backend"):
        g.lu_factor_batched(np.eye(2)[None], backend="fast")


# ---------------------------------------------------------------------------
# block Jacobi
# ---------------------------------------------------------------------------

def _cg_iterations(A, b, M=None):
    from scipy.sparse.linalg import cg
    count = [0]

    def cb(_):
        count[0] += 1
    x, flag = cg(A, b, M=M, callback=cb, maxiter=10000, rtol=1e-8)
    assert flag == 0
    return count[0], x


@pytest.mark.parametrize("name,bs", [("494_bus.mtx", 8), ("494_bus.mtx", 12)])
def test_block_jacobi_reduces_cg_iterations(matrices_dir, name, bs):
    import scipy.io
    A = sps.csr_array(scipy.io.mmread(matrices_dir / name, spmatrix=False)).astype(np.float64)
    assert abs(A - A.T).max() == 0
    b = np.ones(A.shape[0])
    plain, _ = _cg_iterations(A, b)
    M = g.block_jacobi(A, bs)       # bs does not divide n: ragged last block
    assert A.shape[0] % bs != 0
    prec, x = _cg_iterations(A, b, M)
    assert prec < plain
    assert np.linalg.norm(A @ x - b) <= 1e-6 * np.linalg.norm(b)


def test_block_jacobi_applies_inverse_blocks(rng):
    n, bs = 11, 4
    d = rng.standard_normal((n, n)) + 5 * np.eye(n)
    A = sps.csr_matrix(d)
    M = g.block_jacobi(A, bs)
    x = rng.standard_normal(n)
    ref = np.zeros(n)
    for s in range(0, n, bs):
        e = min(n, s + bs)
        ref[s:e] = np.linalg.solve(d[s:e, s:e], x[s:e])
    np.testing.assert_allclose(M @ x, ref, rtol=1e-12)
    np.testing.assert_allclose(M.matmat(np.c_[x, 2 * x])[:, 1], 2 * ref, rtol=1e-12)


def test_block_jacobi_singular_block_named():
    d = np.eye(10)
    d[5, 5] = 0
    with pytest.raises(LinAlgError, match=r"\[1\]"):
        g.block_jacobi(sps.csr_matrix(d), 4)
    d = np.eye(10)
    d[9, 9] = 0
    with pytest.raises(LinAlgError, match="ragged last"):
        g.block_jacobi(sps.csr_matrix(d), 4)


def test_block_jacobi_operator(rng):
    """The operator is SciPy's ``LinearOperator`` of the given shape and
    dtype: products of vectors, (n, 1) and (n, k) arrays, ``@``, a scaled
    operator, the adjoint refused (none is defined), float32 kept."""
    import scipy.sparse.linalg as spla
    n, bs = 13, 5
    d = rng.standard_normal((n, n)) + 6 * np.eye(n)
    for dtype in (np.float64, np.float32):
        M = g.block_jacobi(sps.csr_matrix(d.astype(dtype)), bs)
        assert isinstance(M, spla.LinearOperator)
        assert M.shape == (n, n) and M.dtype == dtype
        x = rng.standard_normal(n).astype(dtype)
        ref = np.concatenate([np.linalg.solve(d[s:s + bs, s:s + bs].astype(dtype), x[s:s + bs])
                              for s in range(0, n, bs)])
        tol = 1e-12 if dtype == np.float64 else 1e-4
        np.testing.assert_allclose(M.matvec(x), ref, rtol=tol)
        assert M.matvec(x[:, None]).shape == (n, 1)
        np.testing.assert_allclose((M @ np.c_[x, -x])[:, 1], -ref, rtol=tol)
        np.testing.assert_allclose((2 * M).matvec(x), 2 * ref, rtol=tol)
        with pytest.raises(NotImplementedError):
            M.rmatvec(x)
        with pytest.raises(ValueError):
            M.matvec(np.ones(n + 1))


def test_block_jacobi_operator_made_like_its_constructor(rng):
    """``made`` (the short path's operator, without the base class's
    constructor) gives an operator with every attribute that the
    constructor sets, of the same values, and the same products; two
    orders or dtypes do not share their state."""
    import scipy.sparse.linalg as spla
    from scipy_gpuqr.batched import _jacobi
    Op = _jacobi._operator_class(spla.LinearOperator)
    n, bs = 11, 4
    d = rng.standard_normal((n, n)) + 6 * np.eye(n)
    full = np.linalg.inv(np.stack([d[s:s + bs, s:s + bs] for s in range(0, 8, bs)]))
    inverses = (full, np.linalg.inv(d[8:, 8:]))
    for dtype in (np.float64, np.float32):
        dt = np.dtype(dtype)
        ref = Op(np, n, bs, dt, inverses)
        op = Op.made(np, n, bs, dt, inverses)
        assert type(op) is Op and isinstance(op, spla.LinearOperator)
        assert op.__dict__.keys() == ref.__dict__.keys()
        for key, value in ref.__dict__.items():
            assert getattr(op, key) is value or getattr(op, key) == value, key
        x = rng.standard_normal(n)
        np.testing.assert_array_equal(op.matvec(x), ref.matvec(x))
        np.testing.assert_array_equal(op @ np.c_[x, -x], ref @ np.c_[x, -x])
    assert Op.made(np, 5, 5, np.dtype(np.float64), None).shape == (5, 5)
    assert Op.made(np, 6, 5, np.dtype(np.float32), None).dtype == np.float32


def test_report_words_are_report_args_as_integers():
    """The short path's (address, ctl) pair carries what ``report_args``
    gives the kernels: the same generation and flag, the word's address."""
    from types import SimpleNamespace
    from scipy_gpuqr.batched import _gpu_common as gc
    st = SimpleNamespace(ptr=1 << 40, gen=12345, buf=object())
    for clear in (False, True):
        addr, ctl = gc.report_words(st, clear_neg=clear)
        buf, want = gc.report_args(st, clear_neg=clear)
        assert buf is st.buf and addr == st.ptr
        assert type(ctl) is int and ctl == int(want)
        assert ctl & gc.CTL_CLEAR_NEG == (gc.CTL_CLEAR_NEG if clear else 0)


def test_block_jacobi_fused_inverse_variants_registered():
    """Every CSR twin of the inverse kernels that block_jacobi's short path
    can launch (each register size, float32/float64, int32/int64 indices;
    the tensor-core one at the float64 sizes that have one) is a registered
    variant of its dense twin's file: compiled by the warm-up and by
    ``build_kernels.py --check``."""
    from scipy_gpuqr.batched import _kernel_registry as kr
    for dt in ("float32", "float64"):
        for ix in ("int32", "int64"):
            for n in range(1, kr.SMALL_MAX + 1):
                size = kr.padded_size(n)
                kernels = ["getri_warp"] + (["getri_mma"] if dt == "float64"
                                            and size in kr.MMA_SIZES else [])
                for k in kernels:
                    name = kr.jacobi_inverse_name(k, dt, ix, size)
                    fname = kr.SMALL_FILES[kr.JACOBI_PREFIX + k]
                    assert fname == kr.SMALL_FILES[k] and fname in kr.SEPARATE_FILES
                    assert name in kr.KERNEL_VARIANTS[fname], name


PUBLIC = ("lu_factor_batched", "lu_solve_batched", "solve_batched", "inv_batched",
          "cho_factor_batched", "cho_solve_batched", "block_jacobi",
          "lu_factor_vbatched", "solve_vbatched", "inv_vbatched", "cho_factor_vbatched")


def test_subpackage_exports_the_public_functions():
    import scipy_gpuqr.batched as b
    assert sorted(b.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(b, name) is getattr(g, name), name
    with pytest.raises(AttributeError):
        b.no_such_function


def test_subpackage_imports_no_cupy():
    """Importing the subpackage and its public functions loads no CuPy."""
    code = ("import sys, scipy_gpuqr.batched as b\n"
            f"for name in {PUBLIC!r}: getattr(b, name)\n"
            "bad = sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('cupy', 'cupyx', 'cupy_backends'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
