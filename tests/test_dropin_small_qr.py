"""The small CPU QR call's short cuts answer as the general code does (issue 15).

On a problem of a few hundred columns SciPy's run ends in milliseconds and the
QR that answers after it is mostly Python around SuiteSparseQR; these are the
pieces made cheaper there: R's triangular solves on a small triangle by
LAPACK (no SuperLU set-up), R's dense inverse by ``trtri``, ‖R‖₁ and the
canonical copy of A from the arrays, SuiteSparseQR's input copied without
SciPy's conversions, and what is per process checked once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr._factor import triangular
from scipy_gpuqr._factor.least_squares import _canonical_copy, _norm1, check_problem
from scipy_gpuqr._factor.triangular import (DENSE_SOLVE_LIMIT, UpperTriangular,
                                            _dense_inverse, sigma_min_upper)
from scipy_gpuqr._symbolic import analysis_cache
from scipy_gpuqr._validate import as_matrix


def _triangle(rng, q, lower=False, density=0.1):
    T = sp.random_array((q, q), density=density, format="csc", rng=rng)
    T = sp.tril(T, -1) if lower else sp.triu(T, 1)
    d = rng.uniform(0.5, 2.0, q) * rng.choice([-1.0, 1.0], q)
    return sp.csc_array(T + sp.diags_array(d))


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("q", [1, 40, DENSE_SOLVE_LIMIT])
def test_small_triangles_are_solved_densely_and_agree_with_superlu(rng, monkeypatch, q, lower):
    T = _triangle(rng, q, lower)
    C = rng.standard_normal((q, 3))
    tri = UpperTriangular(T)
    assert tri._dense is not None and tri._lu is None
    monkeypatch.setattr(triangular, "DENSE_SOLVE_LIMIT", 0)
    monkeypatch.setattr(triangular, "DENSE_SOLVE_FILL", math.inf)
    ref = UpperTriangular(T)
    assert ref._dense is None and ref._lu is not None
    Td = T.toarray()
    for trans in (False, True):
        X, Y = tri.solve(C, trans=trans), ref.solve(C, trans=trans)
        assert X.shape == C.shape
        np.testing.assert_allclose(X, Y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose((Td.T if trans else Td) @ X, C, atol=1e-10)
    one = tri.solve(C[:, 0])
    assert one.shape == (q, 1)
    np.testing.assert_allclose(one[:, 0], la.solve_triangular(Td, C[:, 0], lower=lower),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("density, dense", [(0.7, True), (0.05, False)])
def test_a_larger_triangle_is_solved_densely_where_it_fills_half(rng, monkeypatch, density,
                                                                  dense):
    """Beyond DENSE_SOLVE_LIMIT (up to DENSE_SIGMA_LIMIT) a triangle filling half its
    places (an R like hangGlider_2's, 84 % of its triangle) is solved by LAPACK, a
    sparse one by SuperLU; the dense solves agree with SuperLU's."""
    q = DENSE_SOLVE_LIMIT + 100
    T = _triangle(rng, q, density=density)
    assert (T.nnz >= triangular.DENSE_SOLVE_FILL * q * q) is dense
    tri = UpperTriangular(T)
    assert (tri._dense is not None) is dense and (tri._lu is None) is dense
    monkeypatch.setattr(triangular, "DENSE_SOLVE_FILL", math.inf)
    ref = UpperTriangular(T)
    assert ref._dense is None and ref._lu is not None
    C = rng.standard_normal((q, 4))
    for trans in (False, True):
        np.testing.assert_allclose(tri.solve(C, trans=trans), ref.solve(C, trans=trans),
                                   rtol=1e-10, atol=1e-12)


def test_triangles_the_dense_path_does_not_take(rng):
    q = 30
    T = _triangle(rng, q).tolil()
    T[3, 3] = 0.0                               # a zero pivot: SuperLU's rules (it refuses)
    T = sp.csc_array(T)
    assert UpperTriangular(T)._dense is None
    full = sp.csc_array(_triangle(rng, q) + sp.csc_array(([1.0], ([5], [2])), shape=(q, q)))
    assert UpperTriangular(full)._dense is None   # neither triangle: SuperLU
    single = sp.csc_array(_triangle(rng, q), dtype=np.float32)
    assert UpperTriangular(single)._dense is None  # float32 stays SuperLU's
    big = _triangle(rng, DENSE_SOLVE_LIMIT + 1, density=0.01)
    assert UpperTriangular(big)._dense is None and UpperTriangular(big)._lu is not None


@pytest.mark.parametrize("decades", [2, 8, 13])
def test_dense_inverse_by_trtri_gives_the_inverse_norms(rng, decades):
    """R⁻¹ by LAPACK's trtri: the norms the σ test reads are those of the triangular
    solve with I, and of σ_min from the SVD."""
    q = 150
    U, _ = np.linalg.qr(rng.standard_normal((q, q)))
    V, _ = np.linalg.qr(rng.standard_normal((q, q)))
    T = np.triu(np.linalg.qr((U * np.logspace(0, -decades, q)) @ V.T, mode="r"))
    X = _dense_inverse(T)
    Y = la.solve_triangular(T, np.eye(q), lower=False)
    assert np.all(np.tril(X, -1) == 0)
    assert np.linalg.norm(X) == pytest.approx(np.linalg.norm(Y), rel=1e-10)
    smin = np.linalg.svd(T, compute_uv=False)[-1]
    assert np.linalg.norm(X, 2) * smin == pytest.approx(1.0, rel=1e-8)
    est = sigma_min_upper(sp.csc_array(T), 0.0)
    assert est.bound and est.value <= smin * (1 + 1e-10)


def test_dense_inverse_of_a_singular_triangle_is_not_finite():
    T = np.triu(np.ones((4, 4)))
    T[2, 2] = 0.0
    assert not np.all(np.isfinite(_dense_inverse(T)))
    assert sigma_min_upper(sp.csc_array(T), 1e-3).value == 0.0


def test_norm1_is_scipys_column_sum_bit_for_bit(rng):
    for seed in range(20):
        R = sp.random_array((40, 50), density=0.2, format="csc", rng=seed)
        R.data -= 0.5
        want = float(abs(R).sum(axis=0).max())
        assert _norm1(R) == want and _norm1(sp.csr_array(R)) == want
    assert _norm1(sp.csc_array((3, 3))) == 0.0


@pytest.mark.parametrize("cls", [sp.csc_array, sp.csc_matrix])
def test_canonical_copy_is_as_matrix(rng, cls):
    A = cls(sp.random_array((30, 20), density=0.2, format="csc", rng=rng))
    got, want = _canonical_copy(A), as_matrix(A)
    assert got is not None and type(got.A) is sp.csc_array
    for f in ("dtype", "on_gpu", "was_sparse", "fmt", "sparse_class"):
        assert getattr(got, f) == getattr(want, f), f
    for f in ("data", "indices", "indptr"):
        assert np.array_equal(getattr(got.A, f), getattr(want.A, f))
        assert not np.shares_memory(getattr(got.A, f), getattr(A, f))
    assert got.A.has_canonical_format
    P = check_problem(A, rng.standard_normal(30), None, 0.0, func="lsqr")
    assert np.array_equal(P.matrix().A.toarray(), A.toarray())


def test_canonical_copy_leaves_other_input_to_as_matrix(rng):
    A = sp.random_array((10, 8), density=0.3, format="csc", rng=rng)
    assert _canonical_copy(sp.csr_array(A)) is None
    assert _canonical_copy(sp.csc_array(A, dtype=np.float32)) is None
    bad = A.copy()
    bad.data[0] = np.nan
    assert _canonical_copy(bad) is None
    dup = sp.csc_array((np.ones(2), np.array([1, 1]), np.array([0, 2] + [2] * 7)),
                       shape=(10, 8))
    assert _canonical_copy(dup) is None
    wide = sp.csc_matrix(A)
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    assert _canonical_copy(wide) is None          # as_matrix narrows its indices
    mine = _canonical_copy(sp.csc_array(wide))
    assert mine.A.indices.dtype == as_matrix(sp.csc_array(wide)).A.indices.dtype


def test_spqr_input_copy_of_a_canonical_matrix(rng):
    spqr = pytest.importorskip("scipy_gpuqr._cpu.spqr")
    if not spqr.spqr_available()[0]:
        pytest.skip("SuiteSparseQR not installed")
    A = sp.random_array((30, 20), density=0.2, format="csc", rng=rng)
    C = spqr._as_csc(A)
    assert C.indptr.dtype == np.int64 and C.indices.dtype == np.int64
    assert not np.shares_memory(C.data, A.data)
    assert not sp.issparse(C)                   # the arrays alone: no SciPy object made
    assert (sp.csc_array((C.data, C.indices, C.indptr), shape=C.shape) != A).nnz == 0
    bad = A.copy()
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        spqr._as_csc(bad)
    shuffled = sp.csc_array((A.data[::-1], A.indices[::-1], A.indptr), shape=A.shape)
    shuffled.has_sorted_indices = False
    D = spqr._as_csc(shuffled)
    assert D.has_canonical_format and D.indices.dtype == np.int64
    assert spqr.spqr_available() == spqr.spqr_available()
    num = spqr.spqr_factorize(A, tol=None)
    assert num.info["library"].startswith("SuiteSparseQR (")
    assert num.info["cholmod_version"].count(".") == 2


def test_code_stamp_is_made_once_and_names_the_folders_sources():
    names = analysis_cache._stamp_sources()
    assert "analysis_cache.py" in names and "../_version.py" in names
    assert analysis_cache._stamp_sources() is names
    assert analysis_cache.code_stamp() == analysis_cache.code_stamp()


def _wide_problem(rng, m=40, n=90):
    A = sp.random_array((m, n), density=0.1, format="csc", rng=rng)
    A = sp.csc_array(A + sp.eye_array(m, n, format="csc"))
    return A, rng.standard_normal(m)


def test_start_and_norms_take_the_products_without_a_transpose(rng, monkeypatch):
    """``start`` and ``damped_norms`` take ``Aᵀu`` and ``A v`` through SciPy's kernels
    (the same bits as ``A.T @ u``, ``A @ v``) without making the transpose's object."""
    from scipy_gpuqr._factor import least_squares as ls
    A, b = _wide_problem(rng)
    dx = rng.standard_normal(A.shape[1])
    r = b - A @ dx
    want_start = (float(np.sqrt(np.einsum("i,i->", b, b))),
                  float(np.sqrt(np.einsum("i,i->", A.T @ b, A.T @ b))))
    want_arnorm = ls.norm2(A.T @ r)

    def no_transpose(self, *args, **kwargs):
        raise AssertionError("a transpose object was made")
    monkeypatch.setattr(sp.csc_array, "transpose", no_transpose)
    begin = ls.start(A, b, None)
    assert (begin.bnorm, begin.alfa) == want_start and begin.beta == begin.bnorm
    norms = ls.damped_norms(A, b, dx, 0.0)
    assert norms.arnorm == want_arnorm and norms.r1norm == ls.norm2(r)


def test_full_rank_triangle_is_made_dense_once(rng, monkeypatch):
    """Where the 1-norm test settles full rank, its dense R is the triangular
    solves' triangle: R is made dense once for the decision and the solve."""
    from scipy_gpuqr._factor.lstsq import MinNormSolver
    T = _triangle(rng, 60)
    made = []
    real = sp.csc_array.toarray

    def counted(self, *args, **kwargs):
        made.append(self.shape)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(sp.csc_array, "toarray", counted)
    solver = MinNormSolver(T, 1e-12)
    assert solver.method == "triangular"
    C = rng.standard_normal((60, 2))
    Y = solver.solve(C)
    assert made == [(60, 60)]
    monkeypatch.setattr(sp.csc_array, "toarray", real)
    np.testing.assert_array_equal(Y, UpperTriangular(T).solve(C))


def test_spqr_commons_check_the_layout_once(monkeypatch):
    """SuiteSparseQR's calls start their commons without reading the layout again
    (checked once per process); a common made alone still checks it."""
    spqr = pytest.importorskip("scipy_gpuqr._cpu.spqr")
    if not spqr.spqr_available()[0]:
        pytest.skip("SuiteSparseQR not installed")
    from scipy_gpuqr._cpu import _cholmod
    checks = []
    real = _cholmod.Common._check_layout

    def counted(self):
        checks.append(1)
        return real(self)
    monkeypatch.setattr(_cholmod.Common, "_check_layout", counted)
    A = sp.csc_array(sp.eye_array(5) + sp.random_array((5, 5), density=0.3, rng=1))
    num = spqr.spqr_factorize(A, tol=None)
    num.qt_matmul(np.ones(5))
    assert checks == []
    libs = spqr._libs()
    with _cholmod.Common(libs.ffi, libs.cholmod):
        pass
    assert checks == [1]


def test_quick_path_problem_is_check_problems_without_its_checks(rng, monkeypatch):
    """The common input's checked problem (a QR answer after the host loops) is the one
    ``check_problem`` makes, field by field, without its checks made again."""
    from scipy_gpuqr._factor import least_squares as ls
    from scipy_gpuqr._factor import quick_iterate as qi
    from scipy_gpuqr._factor.least_squares import StoppingRules
    A = sp.csc_array(sp.random_array((60, 30), density=0.2, rng=rng) + sp.eye_array(60, 30))
    b = rng.standard_normal(60)
    want = ls.check_problem(A, b, None, 0.0, func="lsmr")

    def refused(*args, **kwargs):
        raise AssertionError("check_problem ran again")
    monkeypatch.setattr(ls, "check_problem", refused)
    monkeypatch.setattr(qi, "check_problem", refused, raising=False)
    rules = StoppingRules(1e-6, 1e-6, 1e8, 3, False)      # 3 iterations: istop 7, the QR
    quick = qi.quick_iterate("lsmr", A, b, None, 0.0, rules, None, None)
    assert quick is not None and quick.found is None
    got = quick.problem()
    for name in ("shape", "nnz", "dtype", "on_gpu", "b_dtype", "x0", "damp"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.A is A and want.A is A
    np.testing.assert_array_equal(got.b, want.b)
    assert got.b.flags.c_contiguous and not np.shares_memory(got.b, b)


def test_cffi_setter_address_without_ctypes(monkeypatch):
    """A cffi pool setter's address (the pools' record key, asked at every limited
    SuiteSparseQR call) is read through cffi at once, not after a failed ctypes cast."""
    spqr = pytest.importorskip("scipy_gpuqr._cpu.spqr")
    if not spqr.spqr_available()[0]:
        pytest.skip("SuiteSparseQR not installed")
    from scipy_gpuqr._cpu import blas_threads
    libs = spqr._libs()
    try:
        fn = libs.spqr.openblas_set_num_threads
    except (AttributeError, NotImplementedError):
        pytest.skip("SuiteSparseQR's BLAS is not OpenBLAS")
    want = int(blas_threads._cffi().cast("uintptr_t", fn))

    def refused(*args):
        raise AssertionError("ctypes.cast tried")
    monkeypatch.setattr(blas_threads.ctypes, "cast", refused)
    assert blas_threads._address(fn) == want
    assert blas_threads._address(libs.spqr.openblas_set_num_threads) == want


def test_full_rank_dense_r_is_not_kept_beyond_the_dense_solves_order(rng):
    """R made dense for the 1-norm test is kept for the solve only at orders whose
    triangle is solved densely (not q² doubles held by a factorization never solved)."""
    from scipy_gpuqr._factor.lstsq import MinNormSolver
    small = MinNormSolver(_triangle(rng, 50), 1e-12)
    large = MinNormSolver(_triangle(rng, DENSE_SOLVE_LIMIT + 20, density=0.02), 1e-12)
    assert small.method == large.method == "triangular"
    assert small._dense_r is not None and large._dense_r is None
