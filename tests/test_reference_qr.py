"""Reference multifrontal QR: A P = Q R, Q orthogonal, R against dense QR and SuiteSparseQR."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.host.reference import default_tol, reference_factorize
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (small_families, grid3d_least_squares, random_least_squares,
                                           singleton_rich)

EPS = np.finfo(np.float64).eps

#: reference factorizations above this many flops are left out of CI
MAX_FLOPS = 6e7


def _spqr():
    try:
        from scipy_gpuqr._cpu import spqr
    except ImportError:
        return None
    ok, _ = spqr.spqr_available()
    return spqr if ok else None


FAMILIES = list(small_families())


def _check_factorization(A, qr, rtol=50):
    """A P = Q R, QᵀQ = I, R upper trapezoidal, RᵀR = (AP)ᵀ(AP), through random probes."""
    A = sp.csc_array(A)
    m, n = A.shape
    k = min(m, n)
    rng = np.random.default_rng(0)
    assert qr.R.shape == (k, n)
    assert qr.colperm.shape == (n,)
    np.testing.assert_array_equal(np.sort(qr.colperm), np.arange(n))
    AP = A[:, qr.colperm]
    anorm = max(sp.linalg.norm(A), 1.0) if A.nnz else 1.0
    tol = rtol * EPS * anorm * max(m, n, 1)
    R = qr.R.toarray()
    assert np.allclose(np.tril(R[:, :k], -1), 0)
    X = rng.standard_normal((n, 3))
    RX = np.zeros((m, 3))
    RX[:k] = R @ X
    lhs = AP @ X
    if qr.tol is None:
        assert np.linalg.norm(qr.q_matmul(RX) - lhs) <= tol * np.linalg.norm(X)
    else:
        # dropped columns lose at most tol per column
        assert np.linalg.norm(qr.q_matmul(RX) - lhs) <= (tol + qr.tol * n) * np.linalg.norm(X)
    Y = rng.standard_normal((m, 2))
    assert np.linalg.norm(qr.qt_matmul(qr.q_matmul(Y)) - Y) <= 1e-12 * max(1, np.linalg.norm(Y))
    assert np.linalg.norm(qr.q_matmul(qr.qt_matmul(Y)) - Y) <= 1e-12 * max(1, np.linalg.norm(Y))
    y1 = qr.qt_matmul(Y[:, 0])
    assert y1.shape == (m,)
    np.testing.assert_allclose(y1, qr.qt_matmul(Y)[:, 0], atol=1e-14)
    if qr.tol is None:
        G = AP.T @ (AP @ X)
        np.testing.assert_allclose(R.T @ (R @ X), G, atol=tol * anorm * np.linalg.norm(X))


@pytest.mark.parametrize("name,A", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_factorization_no_rank_detection(name, A):
    qr = reference_factorize(A)
    _check_factorization(A, qr)
    assert qr.rank == min(A.shape)
    assert qr.R.nnz == qr.analysis.nnz_R
    # with rank detection too
    qrt = reference_factorize(A, tol="default")
    _check_factorization(A, qrt)
    Ad = sp.csc_array(A).toarray()
    if Ad.size:
        s = np.linalg.svd(Ad, compute_uv=False)
        gap_ok = not np.any((s > 1e-3 * qrt.tol) & (s < 1e3 * max(qrt.tol, 1e-300)))
        if gap_ok:
            assert qrt.rank == int(np.sum(s > qrt.tol))


#: the families of full column rank (R unique up to row signs); 'square' is rank-deficient
FULL_RANK_FAMILIES = FAMILIES[:2] + FAMILIES[7:9]


@pytest.mark.parametrize("name,A", FULL_RANK_FAMILIES, ids=[f[0] for f in FULL_RANK_FAMILIES])
def test_R_equals_dense_qr_up_to_row_signs(name, A):
    """Full column rank and m >= n: R is unique up to the signs of its rows."""
    A = sp.csc_array(A)
    m, n = A.shape
    if m < n:
        A = sp.csc_array(A.T)
        m, n = n, m
    qr = reference_factorize(A)
    Rd = np.linalg.qr(A.toarray()[:, qr.colperm], mode="r")
    R = qr.R.toarray()
    assert np.min(np.abs(np.diag(Rd))) >= 1e-8 * np.abs(Rd).max(), "not of full column rank"
    s = np.sign(np.diag(R)) * np.sign(np.diag(Rd))
    np.testing.assert_allclose(R * s[:, None], Rd, atol=100 * EPS * np.abs(Rd).max() * m)


def test_staged_run_gives_the_same_R():
    A = sp.csc_array(sp.block_diag([grid3d_least_squares(3)] * 4 + [grid3d_least_squares(4)]))
    an = analyze(A)
    r1 = reference_factorize(A, an)
    r2 = reference_factorize(A, an, max_gpu_memory=1)      # every front its own stage
    assert r2.info["stages"] == an.nfronts > 10
    assert (r1.R != r2.R).nnz == 0
    Y = np.random.default_rng(1).standard_normal((A.shape[0], 2))
    np.testing.assert_array_equal(r1.qt_matmul(Y), r2.qt_matmul(Y))


def test_analysis_reuse_and_pattern_check():
    A = random_least_squares(50, 20, 0.1, seed=9)
    an = analyze(A)
    B = A.copy()
    B.data = np.random.default_rng(2).standard_normal(B.nnz)
    qr = reference_factorize(B, an)
    _check_factorization(B, qr)
    C = random_least_squares(50, 20, 0.1, seed=10)
    with pytest.raises(ValueError):
        reference_factorize(C, an)


def test_inputs_not_modified_and_pickle():
    A = random_least_squares(30, 12, 0.2, seed=3)
    A0 = A.copy()
    qr = reference_factorize(A)
    assert (A != A0).nnz == 0
    qr2 = pickle.loads(pickle.dumps(qr))
    Y = np.ones((30, 1))
    np.testing.assert_array_equal(qr.qt_matmul(Y), qr2.qt_matmul(Y))


def test_float32_and_integer_inputs():
    A = random_least_squares(30, 12, 0.2, seed=3)
    q32 = reference_factorize(A.astype(np.float32))
    assert q32.R.dtype == np.float32
    Ai = sp.csc_array((np.round(A.data * 3).astype(np.int64), A.indices, A.indptr), shape=A.shape)
    Ai.eliminate_zeros()
    qi = reference_factorize(Ai)
    assert qi.R.dtype == np.float64
    _check_factorization(Ai.astype(np.float64), qi)


def test_bad_inputs():
    A = random_least_squares(10, 5, 0.3, seed=1).tolil()
    A[0, 0] = np.nan
    with pytest.raises(ValueError):
        reference_factorize(sp.csc_array(A))
    with pytest.raises(TypeError):
        reference_factorize(sp.csc_array(np.eye(3) * 1j))
    with pytest.raises(ValueError):
        reference_factorize(sp.csc_array(np.eye(3)), tol="bogus")
    qr = reference_factorize(sp.csc_array(np.eye(3)))
    with pytest.raises(ValueError):
        qr.qt_matmul(np.ones(4))


# ---- against SuiteSparseQR ----------------------------------------------------------

def _shared(matrices_dir):
    from conftest import real_shared_matrices
    return real_shared_matrices(matrices_dir, nonempty=False)


def _spqr_bound(spqr, A):
    """SuiteSparseQR's istat with COLAMD, no rank detection, and whether it
    comes from a full factorization (``SuiteSparseQR_C``, what we mirror) or,
    for the costly matrices without column singletons, from its symbolic
    analysis (``SuiteSparseQR_C_symbolic`` orders through another CHOLMOD path
    and finds no singletons: nnz(R) a little different, e.g. 7184 against
    7137 on 494_bus)."""
    from scipy_gpuqr._cpu import _cholmod
    from scipy_gpuqr._cpu._libs import open_library
    import cffi
    A = sp.csc_array(A, dtype=np.float64)
    A.sum_duplicates()
    A.sort_indices()
    ours = analyze(A)
    if ours.n1cols or ours.flops < 2e8:
        return spqr.spqr_factorize(A, tol=None).info["istat"], ours, True
    ffi = cffi.FFI()
    ffi.cdef(_cholmod.CDEF)
    ffi.cdef("""
        typedef struct { int xtype; void *factors; } SuiteSparseQR_C_factorization;
        SuiteSparseQR_C_factorization *SuiteSparseQR_C_symbolic(int ordering, int allow_tol,
            cholmod_sparse *A, cholmod_common *cc);
        int SuiteSparseQR_C_free(SuiteSparseQR_C_factorization **QR, cholmod_common *cc);""")
    lib = open_library(ffi, "spqr")
    keep: list = []
    A.indptr = A.indptr.astype(np.int64)
    A.indices = A.indices.astype(np.int64)
    with _cholmod.Common(ffi, lib) as cc:
        q = lib.SuiteSparseQR_C_symbolic(spqr.ORDERINGS["colamd"], 0,
                                         _cholmod.sparse_view(ffi, A, keep), cc.ptr)
        cc.check("SuiteSparseQR_C_symbolic", q != ffi.NULL)
        ist = cc.istat()
        qp = ffi.new("SuiteSparseQR_C_factorization **")
        qp[0] = q
        lib.SuiteSparseQR_C_free(qp, cc.ptr)
    return ist, ours, False


def test_nnz_R_matches_suitesparseqr_on_every_shared_matrix(matrices_dir):
    """nnz(R) with COLAMD within 10% of SuiteSparseQR's (its structural bound,
    which counts stored entries as ours does) on every real/integer matrix;
    equal to a full SuiteSparseQR run's, with the same number of fronts and
    column singletons."""
    spqr = _spqr()
    if spqr is None:
        pytest.skip("SuiteSparseQR not available")
    names = []
    exact = 0
    for name, A in _shared(matrices_dir):
        if min(A.shape) == 0:
            continue
        ist, an, full = _spqr_bound(spqr, A)
        assert abs(an.nnz_R - ist["nnz_R_bound"]) <= 0.1 * ist["nnz_R_bound"], \
            (name, an.nnz_R, ist["nnz_R_bound"])
        if full:
            assert an.nnz_R == ist["nnz_R_bound"], (name, an.nnz_R, ist["nnz_R_bound"])
            assert an.nfronts == ist["n_fronts"], (name, an.nfronts, ist["n_fronts"])
            exact += 1
        if an.n1cols:
            assert an.n1cols == ist["n_column_singletons"], name
            assert an.n1rows == ist["n_singleton_rows"], name
        names.append(name)
    assert len(names) >= 45 and "arrow.mtx" in names and "bp_1200.mtx" in names
    assert exact >= 40


@pytest.mark.slow
def test_shared_matrices_against_dense_and_suitesparseqr(matrices_dir):
    spqr = _spqr()
    checked = exact = 0
    for name, A in _shared(matrices_dir):
        A = A.astype(np.float64)
        an = analyze(A)
        if an.flops > MAX_FLOPS or min(A.shape) > 2000:
            continue
        qr = reference_factorize(A, an)
        _check_factorization(A, qr)
        checked += 1
        if spqr is None:
            continue
        # same column order, no rank detection
        s = spqr.spqr_factorize(A, colperm=qr.colperm, tol=None)
        Rs = s.R.toarray()
        R = qr.R.toarray()
        np.testing.assert_allclose(R.T @ R, Rs.T @ Rs,
                                   atol=1e3 * EPS * max(sp.linalg.norm(A), 1) ** 2 * max(A.shape),
                                   err_msg=name)
        d = np.abs(np.diag(R[:, :min(A.shape)]))
        if A.shape[0] >= A.shape[1] and d.size and d.min() > 1e-6 * d.max():
            sg = np.sign(np.diag(R)) * np.sign(np.diag(Rs))
            np.testing.assert_allclose(R * sg[:, None], Rs,
                                       atol=1e3 * EPS * np.abs(R).max() * A.shape[0], err_msg=name)
        # nnz(R) counts stored entries of R (SPQR's nnz_R_bound; SPQR's R.nnz drops
        # exact zeros): equal with the same permutation (SPQR's fixed ordering finds
        # the same leading singletons)
        ist = s.info.get("istat", {})
        if "nnz_R_bound" in ist:
            assert ist["nnz_R_bound"] == an.nnz_R, (name, ist["nnz_R_bound"], an.nnz_R)
            exact += ist["n_fronts"] == an.nfronts
        # rank with the same permutation and tolerance
        qt = reference_factorize(A, an, tol="default")
        st = spqr.spqr_factorize(A, colperm=an.colperm, tol="default")
        assert qt.rank == st.rank, (name, qt.rank, st.rank)
        assert qt.tol == pytest.approx(default_tol(A))
    assert checked >= 20
    if spqr is not None:
        assert exact >= 0.9 * checked, (exact, checked)


def test_rank_matches_suitesparseqr_on_rank_deficient_families():
    spqr = _spqr()
    if spqr is None:
        pytest.skip("SuiteSparseQR not available")
    for seed in range(6):
        A = random_least_squares(60, 35, 0.08, duplicate_cols=3, empty_cols=2, seed=seed)
        an = analyze(A)
        qt = reference_factorize(A, an, tol="default")
        st = spqr.spqr_factorize(A, colperm=an.colperm, tol="default")
        assert qt.rank == st.rank, (seed, qt.rank, st.rank)
        _check_factorization(A, qt)


def test_singletons_tol_and_reanalysis():
    """R1 rows come straight from A; with rank detection a singleton whose entry
    is below tol is refused (the analysis is redone) as SuiteSparseQR does."""
    A = singleton_rich(60, 40, seed=5)
    an = analyze(A)
    assert an.n1rows > 5
    qr = reference_factorize(A, an)
    R = qr.R.toarray()
    Sd = A.toarray()[an.rowperm][:, an.colperm]
    np.testing.assert_array_equal(R[:an.n1rows], Sd[:an.n1rows])
    np.testing.assert_array_equal(qr.qorder[:an.n1rows], an.rowperm[:an.n1rows])
    # a tiny singleton pivot
    B = A.tolil()
    j = int(an.colperm[an.r1_pivot[1]])
    B[int(an.rowperm[1]), j] = 1e-14
    B = sp.csc_array(B)
    qb = reference_factorize(B, an, tol="default")
    assert qb.info["reanalyzed"]
    assert qb.analysis.n1rows < an.n1rows
    _check_factorization(B, qb)
    spqr = _spqr()
    if spqr is not None:
        st = spqr.spqr_factorize(B, colperm=an.colperm, tol="default")
        assert qb.rank == st.rank
        st2 = spqr.spqr_factorize(B, colperm=qb.analysis.colperm, tol="default")
        assert st2.info["istat"]["n_column_singletons"] == qb.analysis.n1cols
        assert st2.info["istat"]["nnz_R_bound"] == qb.analysis.nnz_R
    # without rank detection the structural analysis stands
    q0 = reference_factorize(B, an)
    assert not q0.info["reanalyzed"] and q0.analysis is an


def test_rank_detection_with_many_dead_columns():
    """A rank-deficient chessboard complex: dead columns inside panels; the rank
    matches SuiteSparseQR's with the same order, and A P = Q R holds."""
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    A = chessboard_boundary(5, 6, 3)
    an = analyze(A)
    qt = reference_factorize(A, an, tol="default")
    assert qt.info["dead_columns"] > 100
    assert qt.rank == A.shape[1] - qt.info["dead_columns"]
    _check_factorization(A, qt)
    spqr = _spqr()
    if spqr is not None:
        st = spqr.spqr_factorize(A, colperm=an.colperm, tol="default")
        assert qt.rank == st.rank
