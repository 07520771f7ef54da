"""DESIGN.md §10: inputs SciPy accepts work; inputs it rejects fail with its types."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse import SparseEfficiencyWarning

from scipy_gpuqr import QRFactorization, factorized, lsmr, lsqr, qr, spsolve

FORMATS = ["csc", "csr", "coo", "lil", "dok", "bsr", "dia"]


def _A(rng, m=8, n=6):
    return (sp.random_array((m, n), density=0.4, rng=rng) + sp.eye_array(m, n)).tocsc()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["array", "matrix"])
def test_every_sparse_format(rng, fmt, kind):
    A = _A(rng)
    M = A.asformat(fmt)
    if kind == "matrix":
        M = sp.csc_matrix(M).asformat(fmt)
    b = rng.standard_normal(8)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.allclose(lsqr(M, b)[0], x_ref)
        assert np.allclose(lsmr(M, b)[0], x_ref)
    S = (_A(rng, 6, 6)).asformat(fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SparseEfficiencyWarning)
        x = spsolve(S, np.ones(6))
    assert np.allclose(S @ x, 1)


@pytest.mark.parametrize("shape", [(0, 0), (0, 4), (4, 0)])
def test_empty_shapes(shape):
    m, n = shape
    A = sp.csc_array(shape)
    for f in (lsqr, lsmr):
        x = f(A, np.ones(m))[0]
        assert x.shape == (n,) and np.all(x == 0)
    if m == n:
        assert spsolve(A, np.ones(0)).shape == (0,)
        assert factorized(A)(np.ones(0)).shape == (0,)
    F = QRFactorization(A)
    assert F.solve(np.ones(m)).shape == (n,)
    assert qr(A).R.shape[1] == n


def test_int64_indices_and_unsorted_duplicates(rng):
    A = _A(rng)
    coo = A.tocoo()
    # duplicates: split each entry into two halves; shuffle the order
    order = rng.permutation(coo.nnz)
    row = np.concatenate([coo.row, coo.row])[np.concatenate([order, order])]
    col = np.concatenate([coo.col, coo.col])[np.concatenate([order, order])]
    data = np.concatenate([coo.data / 2, coo.data / 2])[np.concatenate([order, order])]
    D = sp.coo_array((data, (row.astype(np.int64), col.astype(np.int64))), shape=A.shape)
    C = sp.csc_array((A.data, A.indices.astype(np.int64), A.indptr.astype(np.int64)),
                     shape=A.shape)
    U = sp.csc_array(D)  # CSC with duplicates, unsorted
    U.has_canonical_format = False
    b = rng.standard_normal(8)
    ref = lsqr(A, b)[0]
    for M in (D, C, U):
        assert np.allclose(lsqr(M, b)[0], ref)


@pytest.mark.parametrize("bad_b,exc", [
    (np.ones((8, 2)), ValueError), (np.ones(7), ValueError), (np.ones((8, 1, 2)), ValueError),
    (np.array(["a"] * 8), ValueError),
])
def test_lstsq_bad_b(rng, bad_b, exc):
    A = _A(rng)
    for f in (lsqr, lsmr):
        with pytest.raises(exc):
            f(A, bad_b)


def test_lsqr_accepts_column_and_squeezable_b(rng):
    A = _A(rng)
    b = rng.standard_normal(8)
    ref = lsqr(A, b)[0]
    assert np.allclose(lsqr(A, b[:, None])[0], ref)
    assert np.allclose(lsqr(A, b[:, None, None])[0], ref)  # SciPy squeezes
    assert np.allclose(lsqr(A, list(b))[0], ref)


def test_spsolve_bad_inputs(rng):
    A = _A(rng, 6, 6)
    with pytest.raises(ValueError, match="matrix must be square"):
        spsolve(_A(rng, 6, 5), np.ones(6))
    with pytest.raises(ValueError, match="dimension mismatch"):
        spsolve(A, np.ones(5))
    with pytest.raises(ValueError):
        spsolve(A, np.ones((6, 1, 1)))
    with pytest.raises(ValueError):
        spsolve(A, np.array(["x"] * 6))
    with pytest.raises(ValueError, match="can only factor square"):
        factorized(_A(rng, 6, 5))
    with pytest.raises(ValueError, match="incompatible size"):
        factorized(A)(np.ones(5))
    with pytest.raises(TypeError):
        factorized(A)(sp.csc_array(np.ones((6, 1))))


def test_non_numeric_A():
    for f in (lsqr, lsmr):
        with pytest.raises(TypeError):
            f(np.array([["a", "b"], ["c", "d"]]), np.ones(2))
        with pytest.raises(TypeError):
            f(np.array([["a", None], [1, 2]], dtype=object), np.ones(2))
    with pytest.raises(ValueError):
        lsqr(np.ones(3), np.ones(3))  # 1-D A


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_raise_before_work(rng, value):
    A = _A(rng, 6, 6)
    Abad = A.copy()
    Abad.data[0] = value
    b = np.ones(6)
    bbad = b.copy()
    bbad[2] = value
    for f in (lsqr, lsmr, spsolve):
        with pytest.raises(ValueError, match="non-finite"):
            f(Abad, b)
        with pytest.raises(ValueError, match="non-finite"):
            f(A, bbad)
    with pytest.raises(ValueError, match="non-finite"):
        QRFactorization(Abad)
    with pytest.raises(ValueError, match="non-finite"):
        factorized(A)(bbad)
    with pytest.raises(ValueError, match="non-finite"):
        lsqr(A, b, x0=bbad)


def test_bad_options():
    A = sp.eye_array(3, format="csc")
    with pytest.raises(ValueError):
        lsqr(A, np.ones(3), backend="fast")
    with pytest.raises(ValueError):
        spsolve(A, np.ones(3), permc_spec="BOGUS")
    with pytest.raises(ValueError):
        qr(A, tol="loose")
    with pytest.raises(TypeError):
        lsqr(A, np.ones(3), gpuqr_options=42)


@pytest.mark.parametrize("fmt", ["csc", "csr", "coo", "dense"])
def test_inputs_not_modified(rng, fmt):
    A = _A(rng, 7, 7)
    coo = A.tocoo()
    # duplicates and unsorted indices, which a careless sum_duplicates would fix in place
    D = sp.coo_array((np.r_[coo.data, 1.0], (np.r_[coo.row, 0], np.r_[coo.col, 0])),
                     shape=A.shape)
    M = D.toarray() if fmt == "dense" else D.asformat(fmt)
    if fmt == "csc":
        M = sp.csc_array((M.data, M.indices, M.indptr), shape=M.shape)
    b = rng.standard_normal(7)
    B = rng.standard_normal((7, 2))
    x0 = rng.standard_normal(7)
    snap = [M.copy(), b.copy(), B.copy(), x0.copy()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SparseEfficiencyWarning)
        lsqr(M, b, x0=x0, damp=0.1, calc_var=True)
        lsmr(M, b, x0=x0)
        spsolve(M, B)
        factorized(M)(B)
        qr(M)
        QRFactorization(M).solve(B)
    for before, after in zip(snap, [M, b, B, x0]):
        if sp.issparse(before):
            assert type(before) is type(after)
            for attr in ("data", "indices", "indptr", "row", "col"):
                if hasattr(before, attr):
                    assert np.array_equal(getattr(before, attr), getattr(after, attr))
        else:
            assert np.array_equal(before, after)


def _scipy_error(call):
    try:
        call()
    except Exception as exc:        # noqa: BLE001 - the reference behaviour
        return type(exc), str(exc)
    return None, None


@pytest.mark.parametrize("a_dtype,b", [
    (np.float64, np.ones(6) + 1j),
    (np.float64, np.ones((6, 2), dtype=np.complex64)),
    (np.float32, np.ones(6)),
    (np.float32, np.ones((6, 2))),
    (np.float32, np.ones(6) + 1j),
    (np.float32, np.ones(6, dtype=np.int64)),
    (np.float32, np.ones(5)),            # the cast is checked before the size
    (np.float64, np.array(["a"] * 6)),
    (np.float64, np.ones(6, dtype=object)),
])
@pytest.mark.parametrize("trans", ["N", "T"])
def test_factorized_b_dtype_not_safely_castable_is_scipys_type_error(rng, a_dtype, b, trans):
    """SuperLU.solve casts b to A's dtype by NumPy's 'safe' rule and raises
    TypeError when it cannot (complex b with real A, float64 b with float32 A)."""
    import scipy.sparse.linalg as spla
    A = (_A(rng, 6, 6) + 4 * sp.eye_array(6)).tocsc().astype(a_dtype)
    exc, msg = _scipy_error(lambda: spla.factorized(A)(b, trans))
    assert exc is TypeError and "according to the rule 'safe'" in msg
    with pytest.raises(TypeError) as info:
        factorized(A)(b, trans)
    assert str(info.value) == msg


@pytest.mark.parametrize("a_dtype,b_dtype", [
    (np.float32, np.float32), (np.float32, np.int8), (np.float32, np.bool_),
    (np.float32, np.float16), (np.float64, np.float32), (np.float64, np.int64),
])
def test_factorized_b_dtype_safely_castable_is_accepted(rng, a_dtype, b_dtype):
    import scipy.sparse.linalg as spla
    A = (_A(rng, 6, 6) + 4 * sp.eye_array(6)).tocsc().astype(a_dtype)
    b = np.ones(6, dtype=b_dtype)
    ref = spla.factorized(A)(b)
    x = factorized(A)(b)
    assert x.dtype == ref.dtype
    np.testing.assert_allclose(x, ref, rtol=1e-5 if a_dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("b_shape", [(6,), (6, 1), (6, 2)])
def test_non_finite_b_message_reports_the_callers_shape(rng, b_shape):
    A = (_A(rng, 6, 6) + 4 * sp.eye_array(6)).tocsc()
    b = np.ones(b_shape)
    b[2] = np.inf
    with pytest.raises(ValueError, match=rf"b \(shape {re.escape(str(b_shape))}\)"):
        spsolve(A, b)
    with pytest.raises(ValueError, match=rf"b \(shape {re.escape(str(b_shape))}\)"):
        factorized(A)(b)
    with pytest.raises(ValueError, match=rf"b \(shape {re.escape(str(b_shape))}\)"):
        QRFactorization(A).solve(b)
    if b_shape != (6, 2):
        for f in (lsqr, lsmr):
            with pytest.raises(ValueError, match=rf"b \(shape {re.escape(str(b_shape))}\)"):
                f(A, b)
            with pytest.raises(ValueError,
                               match=rf"x0 \(shape {re.escape(str(b_shape))}\)"):
                f(A, np.ones(6), x0=b)


def test_qrfactorization_complex_b_is_a_type_error(rng):
    """Complex b is refused with TypeError (as SciPy's real solvers do), not
    mistaken for a non-numeric b."""
    F = QRFactorization(_A(rng))
    for b in (np.ones(8) + 1j, np.ones((8, 2), dtype=np.complex64)):
        with pytest.raises(TypeError, match="complex"):
            F.solve(b)
