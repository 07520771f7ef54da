"""DESIGN.md §10: inputs SciPy accepts work; inputs it rejects fail with its types."""

from __future__ import annotations

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
