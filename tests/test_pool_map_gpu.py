"""A stage pool mapped chunk by chunk under a real CuPy pool limit (marker ``gpu``).

Grid 30³ at half its one-stage need (this engine's count) runs as one stage
whose pool is backed only where fronts are alive (4 MiB chunks: the default
32 MiB is for grid 40³-sized pools), with the unlimited run's schedule: the
same R bit for bit, ``Q`` within rounding of its parts' replay, ``info``
truthful, the pool and the device memory as found. At a quarter the fronts
alive do not fit: it stages as before. The address range's own calls are
checked on the device too.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from scipy_gpuqr._engine.memory import plan_for_memory
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
from _pool_limit import pool_limited, solve_unlimited_then_limited

pytestmark = pytest.mark.gpu

CHUNK = 4 << 20


def _free_device_bytes():
    import cupy as cp
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    cp.cuda.Device().synchronize()
    return int(cp.cuda.runtime.memGetInfo()[0])


@pytest.fixture(scope="module")
def problem():
    from scipy_gpuqr._engine.gpu import driver
    A = grid3d_least_squares(30)
    an = analyze(A)
    needs = driver.stage_needs(an, driver.DEFAULT_DENSE_FLOPS, (), tile=32, bundle=3,
                               pipelining=True, itemsize=8, panel=256)
    need = plan_for_memory(an, needs, None).peak
    g = driver.gpu_factorize(A, an)
    assert g.info["stages"] == 1
    b = np.cos(np.arange(A.shape[0]))
    ref = (g.R.tocsc(copy=True), g.qt_matmul(b), g.q_matmul(b))
    g.free()
    del g
    return A, an, need, b, ref


def _device():
    from scipy_gpuqr._engine.gpu.device import CupyDevice
    dev = CupyDevice(32, 3)
    dev.map_chunk_bytes = CHUNK
    return dev


def test_mapped_range_on_the_device():
    import cupy as cp
    from scipy_gpuqr._engine.gpu import vmm
    dev = cp.cuda.Device().id
    g = vmm.granularity(dev)
    assert g > 0 and CHUNK % g == 0
    before = _free_device_bytes()
    r = vmm.MappedRange(dev, 8 * CHUNK + 5, CHUNK)
    a = r.array(cp, (8 * CHUNK + 5) // 8, np.float64)
    n = CHUNK // 8
    r.map(0)
    r.map(5)
    a[:n] = 1.5
    a[5 * n: 6 * n] = cp.arange(n, dtype=np.float64)
    assert float(a[:n].sum()) == 1.5 * n and float(a[5 * n: 6 * n].sum()) == n * (n - 1) / 2
    r.unmap(0)
    r.map(7)                                # chunk 0's memory again
    assert r.made == 2
    a[7 * n: 7 * n + 4] = 0
    cp.cuda.Device().synchronize()
    r.close()
    del a
    assert abs(_free_device_bytes() - before) <= 4 * CHUNK


def test_half_the_memory_runs_one_mapped_stage(problem):
    import cupy as cp
    from scipy_gpuqr._engine.gpu import driver
    A, an, need, b, (R0, z0, y0) = problem
    before = _free_device_bytes()
    limit = need // 2
    with pool_limited(limit) as (pool, base):
        dev = _device()
        g = driver.gpu_factorize(A, an, device=dev)
        info = g.info
        assert info["backend"] == "gpu" and info["stages"] == 1, info.get("fallback")
        pm = info["pool_map"]
        assert pm is not None and info["memory"]["pool_map"] is not None
        assert pm["peak_chunks"] <= pm["cap_chunks"] and pm["unmaps"] > 0
        assert info["memory"]["planned_peak"] <= limit
        assert int(pool.used_bytes()) - base + pm["peak_bytes"] <= limit
        R = g.R.tocsc()
        for part in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(R, part), getattr(R0, part))
        scale = np.linalg.norm(b)
        np.testing.assert_allclose(g.qt_matmul(b), z0, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(g.q_matmul(b), y0, rtol=0, atol=1e-12 * scale)
        bc = cp.asarray(b)
        np.testing.assert_allclose(cp.asnumpy(g.qt_matmul(bc)), z0, rtol=0, atol=1e-12 * scale)
        g.free()
        del g, bc
        gc.collect()
    assert abs(_free_device_bytes() - before) <= 64 << 20


def test_a_quarter_stages_as_before(problem):
    from scipy_gpuqr._engine.gpu import driver
    A, an, need, b, (R0, z0, y0) = problem
    limit = need // 4
    with pool_limited(limit):
        g = driver.gpu_factorize(A, an, device=_device())
        assert g.info["pool_map"] is None and g.info["memory"]["pool_map"] is None
        if g.info["backend"] == "gpu":
            assert g.info["stages"] > 1
            np.testing.assert_allclose(np.abs(g.qt_matmul(b)[:A.shape[1]]),
                                       np.abs(z0[:A.shape[1]]), rtol=0,
                                       atol=1e-9 * np.linalg.norm(b))
        g.free()
        del g
        gc.collect()


def test_public_call_at_half_answers_as_unlimited(problem):
    """``QRFactorization(A, backend='gpu')`` at half the need with the default
    chunks (not mapped here: grid 30³'s pool is too small for them) answers as
    the unlimited run, the pool as found."""
    A, an, need, b, (R0, z0, y0) = problem
    x0, x, info = solve_unlimited_then_limited(A, b, need // 2)
    assert info["backend"] == "gpu"
    np.testing.assert_allclose(x, x0, rtol=0, atol=1e-9 * np.linalg.norm(x0))
