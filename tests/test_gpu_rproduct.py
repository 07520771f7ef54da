"""R's products with a block on the device from its front blocks
(``scipy_gpuqr._engine.gpu.rproduct``), used by the rank decision's refinement.

GPU: ``R X`` and ``Rᵀ X`` against the host's sparse R on full-rank, rank-deficient,
singleton and staged factorizations, float64 and float32 pools; a rank-deficient
``lsqr`` takes the device product and answers as lstsq. CPU: the solver's choice
between a given product and R's sparse copy.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares, random_values)


def _singletons_full_rank(rng):
    """60 column singletons (rows of R taken from A) above a full-rank random block."""
    D = sp.diags(rng.uniform(1, 2, 60))
    B = sp.random(60, 60, density=0.05, random_state=int(rng.integers(1 << 30)))
    C = sp.random(240, 60, density=0.1, random_state=int(rng.integers(1 << 30)))
    return sp.csc_array(sp.bmat([[D, B], [None, C + sp.eye(240, 60)]]))


# ---------------------------------------------------------------- CPU

def test_solver_takes_a_given_product_and_the_sparse_copy_where_it_declines(rng):
    """``products`` answer the refinement's ``G Y``; one that answers None (the
    device cannot form it) leaves it to R's sparse copy; without products the
    sparse copy answers. G is Rᵀ for a transposed solver."""
    R = sp.csc_array(sp.triu(sp.random(30, 30, density=0.3, random_state=1)) + 3 * sp.eye(30))
    Y = rng.standard_normal((30, 2))
    calls = []

    def given(tag, answer):
        def product(Z):
            calls.append(tag)
            return answer(Z)
        return product
    for transposed in (False, True):
        G = (R.T if transposed else R).toarray()
        plain = _lstsq.MinNormSolver(R, 1e-14, transposed=transposed)
        np.testing.assert_allclose(plain._g_product()(Y), G @ Y, rtol=0, atol=1e-13)
        calls.clear()
        s = _lstsq.MinNormSolver(R, 1e-14, transposed=transposed,
                                 products=(given("R", lambda Z: 2 * Z), given("Rt", lambda Z: 3 * Z)))
        np.testing.assert_array_equal(s._g_product()(Y), (3 if transposed else 2) * Y)
        assert calls == (["Rt"] if transposed else ["R"])
        declines = _lstsq.MinNormSolver(R, 1e-14, transposed=transposed,
                                        products=(lambda Z: None, lambda Z: None))
        np.testing.assert_allclose(declines._g_product()(Y), G @ Y, rtol=0, atol=1e-13)


# ---------------------------------------------------------------- GPU

def _cases(rng):
    return [("grid6", random_values(grid3d_least_squares(6), rng)),
            ("chess", chessboard_boundary(4, 5, 2)),
            ("singletons", _singletons_full_rank(rng)),
            ("randls", random_least_squares(500, 160, density=0.03, dense_rows=2,
                                            seed=int(rng.integers(1 << 30)))),
            ("wide", sp.csc_array(random_least_squares(300, 120, density=0.05,
                                                       seed=int(rng.integers(1 << 30))).T))]


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_front_product_equals_the_sparse_product(budget, dtype):
    import cupy as cp
    from scipy_gpuqr import GpuqrOptions, QRFactorization
    rng = np.random.default_rng()
    opts = GpuqrOptions(max_gpu_memory=budget) if budget else None
    for name, A in _cases(rng):
        A = sp.csc_array(A, dtype=dtype)
        F = QRFactorization(A, backend="gpu", gpuqr_options=opts)
        assert F.numeric.on_device(), name
        ds = F._core.device_solves()
        R = sp.csc_array(F._core.num.R).astype(np.float64)
        X = rng.standard_normal((R.shape[1], 3))
        for trans in (False, True):
            Y = ds.multiply(cp.asarray(X), trans)
            assert Y is not None, (name, budget)
            ref = (R.T if trans else R) @ X
            tol = (1e-13 if dtype == np.float64 else 1e-12) * np.linalg.norm(ref)
            assert np.linalg.norm(Y.get() - ref) <= tol, (name, trans, budget)
        F.free()


@pytest.mark.gpu
def test_rank_deficient_lsqr_refines_with_the_device_product(monkeypatch, rng):
    """The null-space COD's refinement multiplies on the device (never with R's
    sparse copy), and the answer is lstsq's."""
    from scipy_gpuqr import lsqr
    from scipy_gpuqr._engine.gpu import solve as gs
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 1000)
    used = []
    real = gs.DeviceSolve.multiply

    def counted(self, C, transposed=False):
        out = real(self, C, transposed)
        used.append(out is not None)
        return out
    monkeypatch.setattr(gs.DeviceSolve, "multiply", counted)
    A = chessboard_boundary(5, 7, 3)                      # 4200×2100, rank 1714
    b = rng.standard_normal(A.shape[0])
    x = lsqr(A, b, backend="gpu")[0]
    assert used and all(used)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
