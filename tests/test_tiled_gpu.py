"""qr_tiled on one and two GPUs (and the CPU with them); run on the GPU machine."""

import numpy as np
import pytest

from scipy_gpuqr import qr_tiled
from scipy_gpuqr._gpu import import_cupy

from test_tiled import check_qr

pytestmark = pytest.mark.gpu


def _n_gpus():
    cp = import_cupy()
    try:
        return cp.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


two_gpus = pytest.mark.skipif(_n_gpus() < 2, reason="needs 2 GPUs")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))


def _host(x):
    cp = import_cupy()
    return cp.asnumpy(x)


@pytest.mark.parametrize("shape", [(1000, 700), (700, 1000), (1100, 1100), (513, 1)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["economic", "r"])
def test_one_gpu_cupy_in_cupy_out(shape, dtype, mode, rng):
    cp = import_cupy()
    a = rng.standard_normal(shape).astype(dtype)
    with cp.cuda.Device(0):
        ad = cp.asarray(a)
    out = qr_tiled(ad, mode=mode, devices=["gpu:0"], tile_size=256)
    for x in out:
        assert isinstance(x, cp.ndarray) and x.device.id == 0
    np.testing.assert_array_equal(_host(ad), a)
    if mode == "r":
        check_qr(a, None, _host(out[0]), mode)
    else:
        check_qr(a, _host(out[0]), _host(out[1]), mode)


def test_one_gpu_numpy_in_numpy_out(rng):
    a = rng.standard_normal((900, 600))
    q, r = qr_tiled(a, devices="gpu:0", tile_size=128)
    assert isinstance(q, np.ndarray) and isinstance(r, np.ndarray)
    check_qr(a, q, r, "economic")


def test_gpu_with_cpu_numpy(rng):
    a = rng.standard_normal((800, 900))
    q, r = qr_tiled(a, devices=["cpu", "gpu:0"], tile_size=128)
    check_qr(a, q, r, "economic")


def test_bad_input_cupy():
    cp = import_cupy()
    with pytest.raises(ValueError, match="infs or NaNs"):
        qr_tiled(cp.asarray([[1.0, cp.nan]]), devices="gpu:0")
    with pytest.raises(ValueError, match="2-D"):
        qr_tiled(cp.ones(3), devices="gpu:0")


@two_gpus
@pytest.mark.parametrize("devices", [["gpu:0", "gpu:1"], ["cpu", "gpu:0", "gpu:1"],
                                     ["gpu:1", "gpu:0"]])
@pytest.mark.parametrize("shape", [(1500, 1300), (1300, 1700)])
def test_two_gpus(devices, shape, rng):
    cp = import_cupy()
    a = rng.standard_normal(shape)
    with cp.cuda.Device(1):
        ad = cp.asarray(a)
    q, r = qr_tiled(ad, devices=devices, tile_size=256)
    assert q.device.id == 1 and r.device.id == 1
    check_qr(a, _host(q), _host(r), "economic")


@two_gpus
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_two_gpus_recursive_panel(dtype, rng):
    cp = import_cupy()
    a = rng.standard_normal((1500, 1100)).astype(dtype)
    a[:, 7] = 0.0
    with cp.cuda.Device(0):
        ad = cp.asarray(a)
    q, r = qr_tiled(ad, devices=["gpu:1", "gpu:0"], tile_size=256,
                    panel_leaf=32)
    check_qr(a, _host(q), _host(r), "economic")


@two_gpus
def test_two_gpus_float32_r(rng):
    a = rng.standard_normal((2048, 2048)).astype(np.float32)
    (r,) = qr_tiled(a, mode="r", devices="gpu", tile_size=512)
    check_qr(a, None, r, "r")


def test_auto_plan_and_run(rng):
    from scipy_gpuqr.tiled._qr import plan_tiled
    plan, profiles, bw = plan_tiled((4096, 4096), np.float64, "auto")
    assert plan.main.startswith("gpu:")
    assert plan.devices[0] == plan.main
    a = rng.standard_normal((1200, 1000))
    q, r = qr_tiled(a)
    check_qr(a, q, r, "economic")
