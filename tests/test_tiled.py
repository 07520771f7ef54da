"""qr_tiled on the CPU (CI) and the multi-device runtime with NumPy devices."""

import numpy as np
import pytest
import scipy.linalg

from scipy_gpuqr import qr_tiled
from scipy_gpuqr.tiled import _ops as ops
from scipy_gpuqr.tiled._qr import resolve_devices
from scipy_gpuqr.tiled._cpu_device import HostDevice
from scipy_gpuqr.tiled._runtime import Layout, run_tiled_qr

TOL = {np.float32: 60, np.float64: 60}


def check_qr(a, q, r, mode):
    """R equals SciPy's up to row signs; Q orthonormal; Q R = A."""
    a64 = a.astype(np.float64)
    eps = np.finfo(a.dtype).eps
    m, n = a.shape
    k = min(m, n)
    (r0,) = scipy.linalg.qr(a64, mode="r")
    if mode == "r":
        assert r.shape == (m, n)
        assert np.all(r[k:] == 0)
    else:
        assert q.shape == (m, k) and r.shape == (k, n)
        assert q.dtype == a.dtype
    assert r.dtype == a.dtype
    assert np.all(np.tril(r[:k], -1) == 0)
    d = np.sign(np.diag(r[:k])) * np.sign(np.diag(r0[:k]))
    d[d == 0] = 1
    scale = max(np.abs(a64).max(), 1.0) * max(m, n)
    c = TOL[a.dtype.type]
    assert np.abs(r[:k] * d[:, None] - r0[:k]).max() <= c * eps * scale
    if q is not None:
        assert np.abs(q.T.astype(np.float64) @ q - np.eye(k)).max() <= c * eps * max(m, n)
        assert np.abs(q.astype(np.float64) @ r - a64).max() <= c * eps * scale


@pytest.mark.parametrize("shape", [(300, 300), (450, 170), (170, 450),
                                   (257, 129), (64, 64), (1, 7), (9, 1)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["economic", "r"])
def test_cpu_matches_scipy(shape, dtype, mode, rng):
    a = rng.standard_normal(shape).astype(dtype)
    a_copy = a.copy()
    out = qr_tiled(a, mode=mode, devices=["cpu"], tile_size=64)
    assert isinstance(out, tuple)
    if mode == "r":
        assert len(out) == 1
        check_qr(a, None, out[0], mode)
    else:
        q, r = out
        check_qr(a, q, r, mode)
    np.testing.assert_array_equal(a, a_copy)


def test_default_tile_and_auto_without_gpu(rng, monkeypatch):
    import scipy_gpuqr.tiled._qr as tiled
    monkeypatch.setattr(tiled, "_gpu_count", lambda: 0)
    a = rng.standard_normal((600, 520))
    q, r = qr_tiled(a)        # 'auto' -> the CPU alone, tile 256
    check_qr(a, q, r, "economic")


def test_rank_deficient_and_structured(rng):
    a = rng.standard_normal((200, 5)) @ rng.standard_normal((5, 150))
    a[:, 10] = 0.0
    q, r = qr_tiled(a, devices="cpu", tile_size=32)
    assert np.abs(q @ r - a).max() < 1e-12 * 200 * np.abs(a).max()
    e = np.triu(rng.standard_normal((130, 130)))   # already triangular
    q, r = qr_tiled(e, devices="cpu", tile_size=32)
    assert np.abs(q @ r - e).max() < 1e-12 * 130 * np.abs(e).max()


def test_integer_and_half_inputs(rng):
    a = rng.integers(-5, 5, size=(70, 40))
    (r,) = qr_tiled(a, mode="r", devices="cpu", tile_size=16)
    assert r.dtype == np.float64
    (r,) = qr_tiled(a.astype(np.float16), mode="r", devices="cpu", tile_size=16)
    assert r.dtype == np.float32


@pytest.mark.parametrize("shape", [(0, 0), (0, 4), (4, 0)])
@pytest.mark.parametrize("mode", ["economic", "r"])
def test_empty_shapes_like_scipy(shape, mode):
    a = np.zeros(shape)
    ours = qr_tiled(a, mode=mode, devices="cpu")
    theirs = scipy.linalg.qr(a, mode=mode)
    assert len(ours) == len(theirs)
    for x, y in zip(ours, theirs):
        assert x.shape == y.shape


def test_bad_input():
    with pytest.raises(ValueError, match="infs or NaNs"):
        qr_tiled(np.array([[1.0, np.nan], [0.0, 1.0]]), devices="cpu")
    with pytest.raises(ValueError, match="infs or NaNs"):
        qr_tiled(np.array([[1.0, np.inf]]), devices="cpu")
    with pytest.raises(ValueError, match="2-D"):
        qr_tiled(np.ones(4), devices="cpu")
    with pytest.raises(ValueError, match="2-D"):
        qr_tiled(np.ones((2, 2, 2)), devices="cpu")
    with pytest.raises(ValueError, match="mode"):
        qr_tiled(np.ones((2, 2)), mode="full", devices="cpu")
    with pytest.raises(TypeError, match="numeric"):
        qr_tiled(np.array([["a", "b"]]), devices="cpu")
    with pytest.raises(ValueError, match="tile_size"):
        qr_tiled(np.ones((2, 2)), devices="cpu", tile_size=0)


def test_complex_goes_to_scipy(rng):
    a = rng.standard_normal((30, 20)) + 1j * rng.standard_normal((30, 20))
    q, r = qr_tiled(a, devices="cpu")
    assert np.allclose(q @ r, a)


def test_resolve_devices():
    assert resolve_devices("auto", n_gpus=2) == (["cpu", "gpu:0", "gpu:1"], True)
    assert resolve_devices(["cpu", 1, "cuda:0"], n_gpus=2) == (
        ["cpu", "gpu:1", "gpu:0"], False)
    assert resolve_devices("gpu", n_gpus=2) == (["gpu:0", "gpu:1"], False)
    for bad in (["cpu", "cpu"], "tpu", ["gpu:2"], [], "gpu:x"):
        with pytest.raises(ValueError):
            resolve_devices(bad, n_gpus=2)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_devices("gpu", n_gpus=0)


def _apply_lapack(panel, C, trans):
    return ops._apply_tiles_lapack(panel, C.copy(order="F"), trans)


@pytest.mark.parametrize("trans", ["T", "N"])
@pytest.mark.parametrize("rows,w,ib", [(160, 32, 8), (150, 32, 32), (100, 20, 6)])
def test_tile_ops_matrix_product_form_matches_lapack(rows, w, ib, trans, rng):
    # the GPU's way of applying a CPU-made tile panel, run with NumPy
    col = rng.standard_normal((rows, w))
    panel = ops.factor_tiles(col, 0, w, ib)
    C = rng.standard_normal((rows, 13))
    ref = _apply_lapack(panel, C, trans)
    got = ops._apply_tiles_xp(np, panel, C.copy(), trans)
    np.testing.assert_allclose(got, ref, atol=1e-12 * rows)
    if trans == "T":   # Q^T col = [R; 0]
        z = ops._apply_tiles_lapack(panel, col.copy(order="F"), "T")
        np.testing.assert_allclose(np.abs(z[:w]), np.abs(panel.R), atol=1e-12 * rows)
        assert np.abs(z[w:]).max() < 1e-12 * rows


@pytest.mark.parametrize("rows,w", [(90, 33), (40, 40), (20, 35), (64, 16)])
def test_wy_factor_and_gram_larft(rows, w, rng):
    col = rng.standard_normal((rows, w))
    col[:, 3] = 0.0                    # a zero column: tau = 0
    p = ops.factor_wy(np, col, 0)
    r = min(rows, w)
    Q = np.eye(rows) - p.V @ p.T @ p.V.T
    np.testing.assert_allclose(Q.T @ Q, np.eye(rows), atol=1e-12 * rows)
    np.testing.assert_allclose(Q[:, :r] @ p.R, col, atol=1e-12 * rows)
    # the batched-merge T equals LAPACK's larft recurrence
    h, tau = np.linalg.qr(col, mode="raw")
    V = p.V
    T = np.zeros((r, r))
    for i in range(r):
        T[i, i] = tau[i]
        T[:i, i] = -tau[i] * T[:i, :i] @ (V[:, :i].T @ V[:, i])
    np.testing.assert_allclose(p.T, T, atol=1e-13 * rows)


@pytest.mark.parametrize("rows,w,leaf", [(300, 64, 8), (64, 64, 16), (200, 50, 7),
                                         (129, 40, 64), (90, 33, 1)])
def test_recursive_wy_panel_matches_one_geqrf(rows, w, leaf, rng):
    col = rng.standard_normal((rows, w))
    col[:, 5] = 0.0                    # a zero column: tau = 0
    p = ops.factor_wy(np, col, 3, leaf=leaf)
    p0 = ops.factor_wy(np, col, 3)
    assert p.k0 == 3 and p.V.shape == p0.V.shape and p.T.shape == p0.T.shape
    Q = np.eye(rows) - p.V @ p.T @ p.V.T
    np.testing.assert_allclose(Q.T @ Q, np.eye(rows), atol=1e-13 * rows)
    np.testing.assert_allclose(Q[:, :w] @ p.R, col, atol=1e-13 * rows)
    # the same Householder QR (LAPACK's signs): same R, V and T
    np.testing.assert_allclose(p.R, p0.R, atol=1e-13 * rows)
    np.testing.assert_allclose(p.V, p0.V, atol=1e-12 * rows)
    np.testing.assert_allclose(p.T, p0.T, atol=1e-12 * rows)
    assert np.all(np.triu(p.T) == p.T)


def _run(a, devices, owners, tile, want_q):
    layout = Layout(a.shape[0], a.shape[1], tile, a.dtype)
    out = HostDevice("out", threaded=False)
    try:
        return run_tiled_qr(a, devices, owners, layout, want_q, out)
    finally:
        out.close()


@pytest.mark.parametrize("kinds", [("tiles", "wy", "tiles"), ("wy", "tiles", "wy")])
@pytest.mark.parametrize("shape", [(333, 250), (200, 333)])
def test_runtime_three_devices_mixed_panels(kinds, shape, rng):
    # three NumPy devices, each on its own worker thread: the main device's
    # panels are of one kind, the others apply them to their columns
    a = rng.standard_normal(shape)
    devs = [HostDevice(f"d{i}", panel_kind=k) for i, k in enumerate(kinds)]
    from scipy_gpuqr.tiled._model import column_owners, guide_array
    nb = -(-shape[1] // 32)
    owners = column_owners(nb, guide_array([2, 3, 1]), 0)
    R, Q = _run(a, devs, owners, 32, True)
    k = min(shape)
    check_qr(a, Q, R[:k], "economic")


@pytest.mark.parametrize("owners", [[0, 1, 1, 0, 1, 1, 1], [0, 1, 2, 1, 2, 0, 2],
                                    [0, 0, 0, 1, 1, 1, 1]])
@pytest.mark.parametrize("shape", [(230, 220), (100, 220), (220, 100)])
def test_runtime_lookahead_owned_elsewhere(owners, shape, rng):
    # the look-ahead column owned by another device: the main device works
    # on its own copy; R rows come from three places (owner, copy, panel)
    a = rng.standard_normal(shape)
    devs = [HostDevice("m", panel_kind="wy", panel_leaf=8),
            HostDevice("b"), HostDevice("c", panel_kind="wy")]
    nb = -(-shape[1] // 32)
    R, Q = _run(a, devs, owners[:nb], 32, True)
    check_qr(a, Q, R[:min(shape)], "economic")


def test_runtime_worker_failure_is_raised(rng):
    class Broken(HostDevice):
        def update(self, panel, k0, blocks, urgent=False):
            def boom():
                raise FloatingPointError("injected")
            self._submit(boom)
    a = rng.standard_normal((100, 100))
    with pytest.raises(FloatingPointError, match="injected"):
        _run(a, [HostDevice("m"), Broken("b")], [0, 1, 0, 1], 32, False)


def test_calibration_cache_roundtrip(tmp_path, monkeypatch):
    from scipy_gpuqr.tiled import _calibrate as calib
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    assert calib.cache_dir() == tmp_path
    profs, bw = calib.get_profiles(["cpu"], 32, np.float64)
    assert profs[0].name == "cpu" and profs[0].t_UE > 0 and bw == {}
    assert (tmp_path / calib.CACHE_NAME).is_file()
    calls = []
    monkeypatch.setattr(calib, "measure_device",
                        lambda *a: calls.append(a))
    again, _ = calib.get_profiles(["cpu"], 32, np.float64)
    assert calls == [] and again == profs


def test_measure_sync_with_numpy_devices():
    from scipy_gpuqr.tiled import _calibrate as calib
    made = []

    def make(name):
        made.append(name)
        return HostDevice(name, threaded=(name != "a"))
    fixed, step = calib.measure_sync("a", "b", np.float64, make_device=make,
                                     reps=1)
    assert fixed >= 0.0 and step >= 0.0 and np.isfinite(fixed + step)
    assert set(made) == {"a", "b"}
    assert calib._sync_partner("gpu:0", ["cpu", "gpu:0", "gpu:1"]) == "gpu:1"
    assert calib._sync_partner("cpu", ["cpu", "gpu:0", "gpu:1"]) == "gpu:0"
    assert calib._sync_partner("gpu:1", ["cpu", "gpu:1"]) == "cpu"


def test_calibration_sync_cached_and_attached(tmp_path, monkeypatch):
    from scipy_gpuqr.tiled import _calibrate as calib
    from scipy_gpuqr.tiled._model import DeviceProfile
    calls = []
    monkeypatch.setattr(calib, "device_key", lambda name: f"{name}[x]")
    monkeypatch.setattr(calib, "measure_device", lambda name, tile, dt:
                        DeviceProfile(name, 1.0, 1.0, 1.0, 1.0))
    monkeypatch.setattr(calib, "measure_bandwidth", lambda s, d: 1e9)
    monkeypatch.setattr(calib, "measure_sync", lambda base, other, dt:
                        calls.append((base, other)) or (0.5, 0.25))
    profs, bw = calib.get_profiles(["cpu", "gpu:0"], 64, np.float64,
                                   cache_dir=tmp_path)
    assert calls == [("gpu:0", "cpu"), ("cpu", "gpu:0")]
    assert all(p.t_sync_fixed == 0.5 and p.t_sync_step == 0.25 for p in profs)
    again, _ = calib.get_profiles(["cpu", "gpu:0"], 64, np.float64,
                                  cache_dir=tmp_path)
    assert len(calls) == 2 and again == profs


def test_cache_dir_defaults(tmp_path):
    from scipy_gpuqr.tiled._calibrate import cache_dir
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "scipy_gpuqr"
    assert cache_dir({}).name == "scipy_gpuqr"


def test_cli_plan_cpu(tmp_path, monkeypatch, capsys):
    from scipy_gpuqr._cli.main import main
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--tiled", "--devices", "cpu", "--size", "300", "200",
                 "--tile-size", "32"]) == 0
    text = capsys.readouterr().out
    assert "main cpu, p = 1" in text and "guide array [0]" in text
    assert main(["calibrate", "--tiled", "--devices", "tpu"]) == 2


def test_package_exposes_qr_tiled_lazily():
    import subprocess
    import sys
    code = ("import sys, scipy_gpuqr, scipy_gpuqr.tiled as t\n"
            "assert 'scipy_gpuqr.tiled._qr' not in sys.modules\n"
            "assert t.qr_tiled is scipy_gpuqr.qr_tiled and 'qr_tiled' in dir(t)\n"
            "assert 'cupy' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
