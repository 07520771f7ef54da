"""Staging under a real CuPy pool limit (marker ``gpu``).

Limits at 1/2, 1/4 and 1/8 of the one-stage need (this engine's count,
:mod:`scipy_gpuqr._engine.memory`): a plan that fits runs staged on the GPU, one
that cannot answers on the CPU with the reason in ``info``; both give the
unlimited run's answer within rounding and leave the pool as they found it.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

from scipy_gpuqr._engine.memory import (POOL_USABLE, front_needs, min_budget,
                                        plan_for_memory, vt_elements)
from scipy_gpuqr._errors import GpuFallbackWarning
from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS, dense_front_mask
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

pytestmark = pytest.mark.gpu


def _needs(an):
    dense = dense_front_mask(an, DEFAULT_DENSE_FLOPS)
    vt = vt_elements(an, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    return front_needs(an, 8, tile=DEFAULT_TILE, vt_elems=vt, dense=dense)


@pytest.fixture(scope="module")
def problem():
    import cupy as cp

    from scipy_gpuqr import QRFactorization
    A = grid3d_least_squares(24)
    b = np.cos(np.arange(A.shape[0]))
    an = analyze(A)
    needs = _needs(an)
    need = plan_for_memory(an, needs, None).peak
    F = QRFactorization(A, backend="gpu")
    x0 = F.solve(b)
    assert F.info["backend"] == "gpu"
    F.free()
    del F
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    return A, b, an, needs, need, x0


def _limited(limit_bytes):
    import cupy as cp
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    pool.set_limit(size=base + int(limit_bytes))
    return pool, base


@pytest.mark.parametrize("frac", [2, 4, 8])
def test_pool_limit_stages_or_falls_back_truthfully(problem, frac):
    from scipy_gpuqr import QRFactorization
    A, b, an, needs, need, x0 = problem
    limit = need // frac
    fits = plan_for_memory(an, needs, int(POOL_USABLE * limit)).feasible
    pool, base = _limited(limit)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            F = QRFactorization(A, backend="gpu")
            x = F.solve(b)
        info = F.info
        bi = info["backend_info"]
        fell = [w for w in seen if issubclass(w.category, GpuFallbackWarning)]
        if fits:
            assert info["backend"] == "gpu" and bi["backend"] == "gpu", bi.get("fallback")
            assert bi["stages"] > 1 and not fell
            assert bi["memory"]["limited_by"] == "pool limit"
            assert bi["memory"]["planned_peak"] <= limit
        else:
            assert info["backend"] == "cpu" and bi["requested_backend"] == "gpu"
            assert "device memory" in bi["fallback"] and fell
            assert min_budget(an, needs) > POOL_USABLE * limit
        np.testing.assert_allclose(x, x0, rtol=0, atol=1e-9 * np.linalg.norm(x0))
        F.free()
        del F
        gc.collect()
    finally:
        pool.set_limit(size=0)
    assert pool.used_bytes() <= base, (pool.used_bytes(), base)
    if frac == 2:
        assert fits, (need, min_budget(an, needs))


def test_out_of_memory_mid_run_restages_without_leaking(problem, monkeypatch):
    """The device claims more than the pool allows (as when another process takes
    memory): the run hits CuPy's out-of-memory, frees it all and restages."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.memory import DeviceMemory
    A, b, an, needs, need, x0 = problem
    limit = need // 2
    calls = []
    real = driver._device_memory

    def lying(device):
        m = real(device)
        calls.append(m.available)
        if len(calls) == 1:                 # the first plan believes in 4x the memory
            return DeviceMemory(4 * m.available, m.limited_by, m.detail)
        return m
    monkeypatch.setattr(driver, "_device_memory", lying)
    pool, base = _limited(limit)
    try:
        g = driver.gpu_factorize(A, an)
        assert g.info["backend"] == "gpu" and g.info["restaged"] >= 1
        assert g.info["memory"]["out_of_memory"]
        y = g.qt_matmul(b)
        g.free()
        del g
        gc.collect()
    finally:
        pool.set_limit(size=0)
    assert pool.used_bytes() <= base
    # the process stays usable: an unlimited run answers the same
    monkeypatch.setattr(driver, "_device_memory", real)
    h = driver.gpu_factorize(A, an)
    np.testing.assert_allclose(h.qt_matmul(b), y, rtol=0, atol=1e-9 * np.linalg.norm(b))
    h.free()
