"""A host front's children placed without a device buffer, under a real CuPy
pool limit (marker ``gpu``).

chessboard 6×7×3 at half its one-stage need (this engine's count) has a host
root; with :data:`~scipy_gpuqr._engine.memory.HOST_CHILDREN_PLACED` the fronts
below it run as one device stage (two without), within the limit, the answers
within rounding of the unlimited run's, ``info`` truthful, the pool as found.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from scipy_gpuqr._engine import memory
from scipy_gpuqr._engine.memory import plan_for_memory
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary
from _pool_limit import pool_limited, solve_unlimited_then_limited

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def problem():
    from scipy_gpuqr._engine.gpu import driver
    A = chessboard_boundary(6, 7, 3)
    an = analyze(A)
    needs = driver.stage_needs(an, driver.DEFAULT_DENSE_FLOPS, (), tile=32, bundle=3,
                               pipelining=True, itemsize=8, panel=256)
    need = plan_for_memory(an, needs, None).peak
    g = driver.gpu_factorize(A, an)
    assert g.info["stages"] == 1 and not g.info["host_fronts"]
    b = np.cos(np.arange(A.shape[0]))
    ref = (g.R.toarray(), g.qt_matmul(b))
    g.free()
    del g
    return A, need, b, ref


@pytest.mark.parametrize("on", [True, False])
def test_half_the_memory_host_root_children_placed(problem, on, monkeypatch):
    from scipy_gpuqr._engine.gpu import driver
    monkeypatch.setattr(memory, "HOST_CHILDREN_PLACED", on)
    A, need, b, (R0, z0) = problem
    with pool_limited(need // 2):
        an = analyze(A)                                 # a fresh analysis: no plan kept
        g = driver.gpu_factorize(A, an)
        info = g.info
        assert info["backend"] == "gpu" and info["restaged"] == 0, info.get("fallback")
        assert [h["front"] for h in info["host_fronts"]] == [an.fronts.nfronts - 1]
        assert info["stages"] == 2 if on else info["stages"] > 2
        assert info["memory"]["planned_peak"] <= need // 2
        top = np.abs(R0).max()
        R = g.R.toarray()
        assert np.abs(R.T @ R - R0.T @ R0).max() <= 1e-12 * top ** 2
        scale = np.linalg.norm(b)
        z = g.qt_matmul(b)
        k = R.shape[0]      # Qᵀb beyond the rank is not unique; Rᵀ (Qᵀb)[:k] = (A P)ᵀ b is
        np.testing.assert_allclose(R.T @ z[:k], R0.T @ z0[:k], rtol=0,
                                   atol=1e-10 * top * scale)
        np.testing.assert_allclose(g.q_matmul(g.qt_matmul(b)), b, rtol=0, atol=1e-12 * scale)
        g.free()
        del g
        gc.collect()


def test_public_call_at_half_answers_as_unlimited(problem):
    A, need, b, _ = problem
    x0, x, info = solve_unlimited_then_limited(A, b, need // 2)
    bi = info["backend_info"]
    assert info["backend"] == "gpu" and bi["stages"] == 2 and bi["host_fronts"]
    np.testing.assert_allclose(x, x0, rtol=0, atol=1e-9 * np.linalg.norm(x0))
