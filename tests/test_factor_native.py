"""The host rank decision's compiled sparse triangular solves (``_factor/_native.c``):
R⁻¹C and R⁻ᵀC against SciPy's, and the decision's rank and answer with and without
them (CPU; built on first use, skipped where no C compiler is found)."""

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr._factor import native
from scipy_gpuqr._factor import sparse_subspace as S

from _native_helpers import built_library
from test_sparse_subspace import EPS, _gapless_sparse_r


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return built_library(native, tmp_path_factory.mktemp("cache"))


def _upper(q, density, seed, below=False):
    rng = np.random.default_rng(seed)
    R = sp.random_array((q, q), density=density, rng=rng, format="csc")
    R = sp.triu(R, k=1) + sp.diags_array(rng.uniform(0.5, 2.0, q) * rng.choice([-1, 1], q))
    if below:                       # entries below the diagonal: not read
        R = R + sp.tril(sp.random_array((q, q), density=density, rng=rng), k=-1)
    return sp.csc_array(R)


@pytest.mark.parametrize("k", [1, 3, 17, 64])
@pytest.mark.parametrize("below", [False, True])
def test_solves_match_dense_triangular_solves(lib, k, below):
    R = _upper(300, 0.02, k, below)
    U = np.triu(R.toarray())
    C = np.random.default_rng(1).standard_normal((300, k))
    f = native.SparseUpperSolves(lib, R)
    np.testing.assert_allclose(f.solve(C), la.solve_triangular(U, C), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(f.solve_t(C), la.solve_triangular(U, C, trans=1), rtol=1e-10,
                               atol=1e-12)


def test_vectors_fortran_blocks_and_unsorted_indices(lib):
    R = _upper(120, 0.05, 3)
    C = np.asfortranarray(np.random.default_rng(2).standard_normal((120, 5)))
    f = native.SparseUpperSolves(lib, R)
    ref = f.solve(C)
    R2 = R.copy()
    R2.has_sorted_indices = False
    for j in range(R2.shape[1]):            # each column's entries reversed
        a, b = R2.indptr[j], R2.indptr[j + 1]
        R2.indices[a:b] = R2.indices[a:b][::-1].copy()
        R2.data[a:b] = R2.data[a:b][::-1].copy()
    np.testing.assert_allclose(native.SparseUpperSolves(lib, R2).solve(C), ref, rtol=1e-13)
    np.testing.assert_allclose(f.solve(C[:, 2]), ref[:, 2], rtol=1e-13)
    assert f.solve(np.zeros((120, 0))).shape == (120, 0)
    with pytest.raises(ValueError):
        f.solve(np.ones(7))


def test_non_finite_values_propagate(lib):
    R = _upper(50, 0.1, 4)
    C = np.ones((50, 2))
    C[10, 0] = np.nan
    X = native.SparseUpperSolves(lib, R).solve_t(C)
    assert np.isnan(X[10:, 0]).any() and np.all(np.isfinite(X[:, 1]))


@pytest.mark.parametrize("transposed", [False, True])
def test_decision_same_rank_and_answer_with_compiled_and_superlu_solves(lib, monkeypatch,
                                                                        transposed):
    """A sparse R without a gap at the cutoff (test_sparse_subspace's): the same rank,
    Ritz values and minimum-norm answer to rounding with the compiled sweeps as with
    SuperLU's."""
    R = _gapless_sparse_r(np.random.default_rng(11))
    q = R.shape[0]
    d = np.abs(R.diagonal())
    c = np.random.default_rng(12).standard_normal(q)
    got = {}
    for path in ("superlu", "compiled"):
        monkeypatch.setattr(S, "native_handle", lambda p=path: lib if p == "compiled" else None)
        cod = S.decide(R, EPS * q, d, transposed=transposed, block=32, max_block=q // 3)
        assert cod is not None
        got[path] = cod
    a, b = got["superlu"], got["compiled"]
    assert a.rank == b.rank < q
    window = a.ritz <= 2.0 * EPS * q * a.sigma_max      # converged; the rest need not be
    np.testing.assert_allclose(b.ritz[window], a.ritz[window], rtol=1e-9)
    y0, y1 = a.solve(c), b.solve(c)
    assert np.linalg.norm(y1 - y0) <= 1e-6 * np.linalg.norm(y0)


def test_decision_beyond_superlus_limit_on_the_compiled_sweeps(lib, monkeypatch):
    """R over SUPERLU_MAX_NNZ entries: the compiled sweeps decide it, as they do
    under the limit (same rank, Ritz values and answer, bit for bit); without the
    library the decision refuses (SciPy's slow sweeps would answer), as before;
    and where the compiled copy of R's arrays would not fit the memory share,
    it refuses too."""
    R = _gapless_sparse_r(np.random.default_rng(11))
    q = R.shape[0]
    d = np.abs(R.diagonal())
    c = np.random.default_rng(12).standard_normal(q)
    monkeypatch.setattr(S, "native_handle", lambda: lib)
    under = S.decide(R, EPS * q, d, block=32, max_block=q // 3)
    monkeypatch.setattr(S, "SUPERLU_MAX_NNZ", R.nnz - 1)
    over = S.decide(R, EPS * q, d, block=32, max_block=q // 3)
    assert under is not None and over is not None
    assert over.rank == under.rank < q
    assert np.array_equal(over.ritz, under.ritz)
    assert np.array_equal(over.solve(c), under.solve(c))
    monkeypatch.setattr(S, "BLOCK_COPIES", 1e-9)          # the blocks fit in any case
    monkeypatch.setattr(S, "available_host_memory", lambda: 100 * R.nnz)
    assert S.decide(R, EPS * q, d, block=32, max_block=q // 3) is not None
    monkeypatch.setattr(S, "available_host_memory", lambda: 16 * R.nnz)
    assert S.decide(R, EPS * q, d, block=32, max_block=q // 3) is None
    monkeypatch.undo()
    monkeypatch.setattr(S, "SUPERLU_MAX_NNZ", R.nnz - 1)
    monkeypatch.setattr(S, "native_handle", lambda: None)
    assert S.decide(R, EPS * q, d, block=32, max_block=q // 3) is None


def _sparse_dead_pivots(q, dead, seed):
    """A sparse upper triangular R whose last ``dead`` columns are combinations of
    the others plus 1e-17 on the diagonal: a clean gap under lstsq's cutoff."""
    rng = np.random.default_rng(seed)
    R1 = sp.triu(0.1 * sp.random_array((q - dead, q - dead), density=0.01, rng=rng), k=1)
    R1 = sp.csc_array(R1 + sp.diags_array(rng.uniform(0.5, 2.0, q - dead)))
    C = R1 @ sp.random_array((q - dead, dead), density=0.02, rng=rng, format="csc")
    T = sp.diags_array(np.full(dead, 1e-17))
    return sp.csc_array(sp.block_array([[R1, C], [None, T]]))


def test_host_rules_same_rank_and_answer_with_compiled_and_superlu_solves(lib, monkeypatch):
    """The host's probe and null-space COD (lstsq.MinNormSolver._solve_ops) take R's
    compiled sweeps where the library is at hand, SuperLU's otherwise: the same
    method and rank, answers within rounding; a full-rank R is confirmed alike (by
    the 1-norm estimate, before any solve)."""
    from scipy_gpuqr._dispatch.plan import backend_factorizer
    from scipy_gpuqr._factor import lstsq as L
    from scipy_gpuqr._factor.factored import _cod_factorizer
    b = np.random.default_rng(5).standard_normal(800)
    for dead, R in ((3, _sparse_dead_pivots(800, 3, 4)), (0, _upper(800, 0.004, 6))):
        out = {}
        for path in ("compiled", "superlu"):
            monkeypatch.setattr(L, "native_handle", lambda p=path: lib if p == "compiled" else None)
            solver = L.MinNormSolver(R, EPS * 800, factorize=_cod_factorizer(
                backend_factorizer("cpu")[0]))
            if dead:
                assert bool(solver._rnative) == (path == "compiled")
            out[path] = (solver.method, solver.rank, solver.solve(b).ravel())
        (m1, r1, x1), (m2, r2, x2) = out["compiled"], out["superlu"]
        assert (m1, r1) == (m2, r2)
        assert np.linalg.norm(x1 - x2) <= 1e-10 * np.linalg.norm(x2)
        assert r1 == 800 - dead
