"""Triangular solves through SuperLU, σ_min of a triangle, and the rank rules that use them.

The rules of :class:`scipy_gpuqr._factor.lstsq.MinNormSolver` exercised here: full rank
confirmed by σ_min where the 1-norm condition estimate is inconclusive; the
sparse complete orthogonal decomposition kept only where its rank provably
equals lstsq's (‖E‖₂ ≤ tol < σ_min(R11)), else the dense rules answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import QRFactorization
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor import triangular as _triangular
from scipy_gpuqr._factor.solve_rank import probe_margin
from scipy_gpuqr._factor.triangular import UpperTriangular, sigma_min_upper


def _upper(rng, q, density=0.05, cond_decades=0.0):
    T = sp.random_array((q, q), density=density, rng=rng, format="csc")
    T = sp.triu(T, format="csc")
    diag = np.logspace(0, -cond_decades, q) * rng.choice([-1.0, 1.0], q)
    return sp.csc_array(T + sp.diags_array(diag))


@pytest.mark.parametrize("q", [0, 1, 7, 200])
@pytest.mark.parametrize("k", [None, 1, 3])
def test_solves_match_dense(rng, q, k):
    T = _upper(rng, q)
    C = rng.standard_normal(q if k is None else (q, k))
    tri = UpperTriangular(T)
    Td = T.toarray()
    X = tri.solve(C)
    Xt = tri.solve(C, trans=True)
    C2 = C if C.ndim == 2 else C[:, None]
    assert X.shape == C2.shape and Xt.shape == C2.shape
    if q:
        assert np.allclose(Td @ X, C2, atol=1e-10)
        assert np.allclose(Td.T @ Xt, C2, atol=1e-10)
        up, upt = tri.solves()
        assert np.array_equal(up(C), X) and np.array_equal(upt(C), Xt)


def test_fallback_when_superlu_refuses(rng, monkeypatch):
    T = _upper(rng, 50)
    C = rng.standard_normal((50, 2))
    expected = UpperTriangular(T).solve(C)

    def refuse(*args, **kwargs):
        raise RuntimeError("Factor is exactly singular")
    monkeypatch.setattr(_triangular, "splu", refuse)
    tri = UpperTriangular(T)
    assert tri._lu is None
    assert np.allclose(tri.solve(C), expected, rtol=1e-10, atol=1e-12)
    assert np.allclose(T.toarray().T @ tri.solve(C, trans=True), C, atol=1e-10)


def _graded_triangle(rng, q, decades):
    """Upper triangular q×q with singular values logspace(0, -decades)."""
    U, _ = np.linalg.qr(rng.standard_normal((q, q)))
    V, _ = np.linalg.qr(rng.standard_normal((q, q)))
    R = np.linalg.qr((U * np.logspace(0, -decades, q)) @ V.T, mode="r")
    return sp.csc_array(np.triu(R))


def test_sigma_min_dense_bound_and_estimate(rng):
    T = _graded_triangle(rng, 300, 8)
    smin = np.linalg.svd(T.toarray(), compute_uv=False)[-1]
    low = sigma_min_upper(T, threshold=0.0)            # any bound above 0 will do
    assert low.bound and 0 < low.value <= smin * (1 + 1e-8)
    assert low.value >= smin / np.sqrt(300) * (1 - 1e-8)
    est = sigma_min_upper(T, threshold=smin)           # the bound cannot exceed σ_min
    assert not est.bound
    assert est.value == pytest.approx(smin, rel=1e-8)


def test_sigma_min_sparse_estimate(rng, monkeypatch):
    monkeypatch.setattr(_triangular, "DENSE_SIGMA_LIMIT", 10)
    T = _graded_triangle(rng, 400, 6)
    smin = np.linalg.svd(T.toarray(), compute_uv=False)[-1]
    est = sigma_min_upper(T, threshold=1.0)
    assert not est.bound
    assert est.value == pytest.approx(smin, rel=1e-2)


@pytest.mark.parametrize("decades", [3, 9, 14])
def test_device_norm_test_verdicts(rng, decades):
    """The GEMM certificate of the device's σ test (run here on NumPy arrays): a verdict
    only where the trace of ``G^(2^k)`` settles ``‖X‖₂ < limit`` one way, always the
    true one; open (None) within ``q^(1/2^(k+2))`` of the limit; its estimate at most
    ``‖X‖₂`` and close to it."""
    X = sp.linalg.inv(_graded_triangle(rng, 200, decades)).toarray()
    s = np.linalg.norm(X, 2)
    band = 200 ** (1 / 2 ** (_triangular.DEVICE_NORM_SQUARINGS + 2))
    for ratio in (0.3, 0.9, 0.99, 1.0, 1.01, 1.1, 3.0, 1e4):
        got = _triangular._device_norm_test(X, s / ratio)
        if 1 / band <= ratio < band * (1 + 1e-12):
            continue                          # may be open or settled (rightly)
        assert got is not None, ratio
        below, estimate = got
        assert below == (ratio < 1), ratio
        if np.isfinite(estimate):
            assert estimate <= s * (1 + 1e-12)
            assert estimate == pytest.approx(s, rel=1e-6)


def test_singular_triangle_has_zero_bound():
    T = sp.csc_array(np.array([[1.0, 2.0], [0.0, 0.0]]))
    assert sigma_min_upper(T, 1e-3).value == 0.0


# -- the rank rules ------------------------------------------------------------

def _graded(rng, n, decades, m=None):
    """A dense m×n matrix with singular values logspace(0, -decades) (no gap)."""
    m = m or n
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return sp.csc_array((U * np.logspace(0, -decades, n)) @ V.T)


@pytest.mark.parametrize("probe", [True, False])
def test_full_rank_confirmed_by_sigma_min(rng, probe, monkeypatch):
    """cond 1e12: the 1-norm test (rcond ≥ 10·q·cutoff) fails; the probe through R's
    solves (1/ν, ν ≤ ‖R⁻¹‖₂ within its margin) or, without it, σ_min decides full rank."""
    if not probe:
        monkeypatch.setattr(_lstsq.MinNormSolver, "_full_rank_probed", lambda self: False)
    A = _graded(rng, 120, 12, m=160)
    b = rng.standard_normal(160)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    info = F.info["rank_decision"]
    cutoff = _lstsq.lstsq_cutoff(160, 120)
    assert info["method"] == "triangular"
    assert info["rcond_estimate"] < 10 * 120 * cutoff      # the 1-norm test failed
    s = np.linalg.svd(A.toarray(), compute_uv=False)
    if probe:
        # 1/ν: never below σ_min, at most the probe's first margin above it
        assert s[-1] * (1 - 1e-8) <= info["sigma_min"] <= s[-1] * probe_margin(120, 1)
    else:
        # σ_min: the bound 1/‖R⁻¹‖_F (within √q below) or the Lanczos value
        assert s[-1] / np.sqrt(120) * (1 - 1e-8) <= info["sigma_min"] <= s[-1] * (1 + 1e-6)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-3 * np.linalg.norm(x_ref)


def test_diagonal_proves_deficiency_without_full_rank_test(rng, monkeypatch):
    A = sp.random_array((90, 40), density=0.2, rng=rng, format="csc")
    A = sp.hstack([A, A[:, :3] * 2.0], format="csc")      # exact dependencies
    called = []
    monkeypatch.setattr(_lstsq.MinNormSolver, "_full_rank_confirmed",
                        lambda self: called.append(1) or False)
    F = QRFactorization(A, backend="cpu")
    F.solve(np.ones(90))
    assert not called
    assert F.rank == np.linalg.matrix_rank(A.toarray())


def test_gap_checked_sparse_cod_keeps_exact_dependencies(rng, monkeypatch):
    """Exactly dependent columns: a clear gap, the sparse COD answers with lstsq's rank."""
    monkeypatch.setattr(_lstsq, "SPARSE_COD_MAX_DENSITY", 1.0)   # R of a small test matrix
    A = sp.random_array((400, 300), density=0.01, rng=rng, format="csc") + \
        sp.eye_array(400, 300, format="csc")
    A = sp.hstack([A, A[:, :20] + A[:, 20:40]], format="csc")
    b = rng.standard_normal(400)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    info = F.info["rank_decision"]
    assert info["method"] == "cod" and info["rank_revealed"]
    assert F.rank == np.linalg.matrix_rank(A.toarray()) == 300
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_gap_check_refuses_where_heath_misses_small_values(rng, monkeypatch):
    """Singular values falling through the cutoff with no column Heath's rule drops:
    the sparse COD's rank would be wrong, the check sends the problem to the SVD."""
    monkeypatch.setattr(_lstsq, "SPARSE_COD_MAX_DENSITY", 1.0)   # dense test matrix
    tried = []
    original = _lstsq.MinNormSolver._prepare_gap_checked_cod
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_gap_checked_cod",
                        lambda self: tried.append(original(self)) or tried[-1])
    n = 80
    A = _graded(rng, n, 18, m=100)
    b = rng.standard_normal(100)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    assert tried == [False]
    assert F.info["rank_decision"]["method"] == "svd"
    x_ref, _, rank, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert F.rank == rank < n
    # no gap: σ_r ~ 1e-14 carries a relative error ~1e-2 in both solvers, so the
    # forward error says little; the backward error is lstsq's or better
    Ad = A.toarray()

    def backward(y):
        r = b - Ad @ y
        return np.linalg.norm(Ad.T @ r) / (np.linalg.norm(Ad, 2) * np.linalg.norm(r))
    assert backward(x) <= max(10 * backward(x_ref), 100 * np.finfo(float).eps * 100)
    assert np.linalg.norm(x) == pytest.approx(np.linalg.norm(x_ref), rel=5e-2)


def test_large_triangle_skips_superlu(rng, monkeypatch):
    monkeypatch.setattr(_triangular, "SUPERLU_MAX_NNZ", 10)
    T = _upper(rng, 60)
    tri = UpperTriangular(T)
    assert tri._lu is None
    C = rng.standard_normal(60)
    assert np.allclose(T.toarray() @ tri.solve(C)[:, 0], C, atol=1e-10)


def test_superlu_memory_error_falls_back(rng, monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(_triangular, "splu", exhausted)
    T = _upper(rng, 40)
    tri = UpperTriangular(T)
    assert tri._lu is None
    C = rng.standard_normal((40, 2))
    assert np.allclose(T.toarray() @ tri.solve(C), C, atol=1e-10)


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("trans", ["N", "T"])
@pytest.mark.parametrize("shape", [(9,), (9, 1), (9, 4), (9, 0)])
def test_dense_triangle_solve_is_scipys_bit_for_bit(rng, lower, trans, shape):
    """The dense triangle's direct LAPACK call gives scipy.linalg.solve_triangular's bits
    (and, for any other B, is that function): 1-D and 2-D B, both sides, both operations."""
    import scipy.linalg as la
    T = _upper(rng, 9, density=0.4, cond_decades=3.0)
    Td = (T.T if lower else T).toarray(order="F")
    tri = _triangular._DenseTriangle(Td, lower)
    B = rng.standard_normal(shape)
    got = tri.solve(B, trans=trans)
    want = la.solve_triangular(Td, B, trans=0 if trans == "N" else 1, lower=lower,
                               check_finite=False)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(got, want)
    for other in (B.astype(np.float32), np.ascontiguousarray(B).tolist()):
        if np.size(other):
            assert np.array_equal(tri.solve(other, trans=trans),
                                  la.solve_triangular(Td, other, trans=0 if trans == "N" else 1,
                                                      lower=lower, check_finite=False))


def test_dense_triangle_singular_raises_scipys_error():
    import scipy.linalg as la
    Td = np.asfortranarray(np.triu(np.ones((4, 4))))
    Td[2, 2] = 0.0
    with pytest.raises(la.LinAlgError) as ours:
        _triangular._DenseTriangle(Td, False).solve(np.ones((4, 1)))
    with pytest.raises(la.LinAlgError) as scipys:
        la.solve_triangular(Td, np.ones((4, 1)), check_finite=False)
    assert str(ours.value) == str(scipys.value)
