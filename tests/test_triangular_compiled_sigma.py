"""σ_min of a sparse triangle of order up to DENSE_SIGMA_LIMIT on the compiled sweeps (issue 15).

:func:`scipy_gpuqr._factor.triangular.sigma_min_upper` takes T⁻¹ for the
Frobenius bound from the compiled sparse solve with the identity, and Lanczos
on ``T⁻¹T⁻ᵀ`` through the sweeps, where the dense path formed T⁻¹ by ``trtri``
and ran Lanczos on it. Checked here: the same verdict kind (bound or estimate)
and the same value up to rounding as the dense path (the library switched
off), and the dense path's answer where the compiled one does not apply.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._factor import native
from scipy_gpuqr._factor import triangular as _triangular
from scipy_gpuqr._factor.triangular import sigma_min_upper

needs_native = pytest.mark.skipif(native.handle() is None,
                                  reason="compiled sweeps not at hand")


def _sparse_graded(rng, q, decades, density=0.01):
    T = sp.triu(sp.random_array((q, q), density=density, rng=rng, format="csc"), k=1)
    diag = np.logspace(0, -decades, q) * rng.choice([-1.0, 1.0], q)
    return sp.csc_array(T + sp.diags_array(diag))


def _dense_path(T, threshold, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(_triangular, "native_handle", lambda: None)
        return sigma_min_upper(T, threshold)


@needs_native
@pytest.mark.parametrize("decades", [2, 9])
def test_bound_as_the_dense_path(rng, decades, monkeypatch):
    T = _sparse_graded(rng, 600, decades)
    got, want = sigma_min_upper(T, 0.0), _dense_path(T, 0.0, monkeypatch)
    assert got.bound and want.bound
    assert got.value == pytest.approx(want.value, rel=1e-12)


@needs_native
@pytest.mark.parametrize("decades", [2, 9])
def test_lanczos_estimate_as_the_dense_path(rng, decades, monkeypatch):
    T = _sparse_graded(rng, 600, decades)
    smin = np.linalg.svd(T.toarray(), compute_uv=False)[-1]
    got, want = sigma_min_upper(T, smin), _dense_path(T, smin, monkeypatch)
    assert not got.bound and not want.bound
    assert got.value == pytest.approx(want.value, rel=1e-10)
    assert got.value == pytest.approx(smin, rel=1e-8)


@needs_native
def test_compiled_path_not_taken_where_it_does_not_apply(rng, monkeypatch):
    def refuse(*args, **kw):
        raise AssertionError("compiled sweeps used")

    monkeypatch.setattr(_triangular, "SparseUpperSolves", refuse)
    dense_fill = sp.csc_array(np.triu(rng.standard_normal((80, 80))) + 10 * np.eye(80))
    assert sigma_min_upper(dense_fill, 0.0).bound                     # fills half of q²
    filled = _sparse_graded(rng, 300, 2, density=0.1)                # over the compiled share
    assert filled.nnz > _triangular.COMPILED_SIGMA_MAX_FILL * 300 ** 2
    assert sigma_min_upper(filled, 0.0).bound
    assert sigma_min_upper(dense_fill.toarray(), 0.0).bound          # dense T
    singular = _sparse_graded(rng, 100, 1).tolil()
    singular[50, 50] = 0.0
    assert sigma_min_upper(sp.csc_array(singular), 1e-3) == _triangular.SigmaMin(0.0, True)


@needs_native
def test_overflowing_inverse_left_to_the_dense_path(monkeypatch):
    q = 400
    T = sp.csc_array(sp.diags_array([np.full(q, 1e-300), np.full(q - 1, 1.0)], offsets=[0, 1]))
    got, want = sigma_min_upper(T, 1e-3), _dense_path(T, 1e-3, monkeypatch)
    assert got == want


@needs_native
@pytest.mark.parametrize("q", [3, 17, 301])
def test_inverse_frobenius_by_blocks(rng, q):
    T = _sparse_graded(rng, q, 3, density=0.05)
    want = np.linalg.norm(np.linalg.inv(T.toarray()))
    sweeps = native.SparseUpperSolves(native.handle(), T)
    assert _triangular._inverse_frobenius(sweeps, np.inf) == pytest.approx(want, rel=1e-12)
    partial = _triangular._inverse_frobenius(sweeps, 0.5 * want)
    assert 0.5 * want <= partial <= want * (1 + 1e-12)


@needs_native
def test_leading_triangle_solves_read_the_whole_arrays(rng):
    """``solve_leading`` is the solve with T's leading triangle, from T's own arrays."""
    T = _sparse_graded(rng, 60, 3, density=0.1)
    sweeps = native.SparseUpperSolves(native.handle(), T)
    C = rng.standard_normal((25, 4))
    want = np.linalg.solve(T.toarray()[:25, :25], C)
    np.testing.assert_allclose(sweeps.solve_leading(C, 25), want, rtol=1e-10, atol=0)
    with pytest.raises(ValueError):
        sweeps.solve_leading(C, 61)


@needs_native
def test_entries_below_the_diagonal_left_to_the_dense_path(rng, monkeypatch):
    T = _sparse_graded(rng, 200, 2).tolil()
    T[150, 20] = 1.0                     # not read by either path: trtri reads the upper part
    T = sp.csc_array(T)
    monkeypatch.setattr(_triangular, "SparseUpperSolves", None)
    assert sigma_min_upper(T, 0.0).bound
