"""Sparse calibration: the crossover fit, the per-GPU cache file, dispatch reading it, the CLI.

Timings are injected (``timer=``), so everything here runs without a GPU;
the real measurement (``warm_median`` on the GPU engine) runs only on a GPU
machine (``scipy-gpuqr calibrate``).
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from _stat_counter import counted_stats
from conftest import REPO
from scipy_gpuqr._dispatch import calibrate as _calibrate
from scipy_gpuqr._dispatch import plan as _dispatch
from scipy_gpuqr import _gpu as gpu_mod
from scipy_gpuqr._dispatch.calibrate import (LadderProblem, calibrate_sparse, fit_threshold,
                                             warm_median)
from scipy_gpuqr._dispatch.calibration import (Calibration, calibration_file, load_calibration,
                                               load_threshold, store_calibration)
from scipy_gpuqr._options import resolve_settings
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

DEVICE = {"name": "Test GPU 9000", "compute_capability": "90", "cupy_version": "0.test"}


def _ladder():
    """Tiny problems, intensities about 2, 3.8, 6.2, 15.6, 25.5, 45."""
    return [LadderProblem(f"grid{k}", lambda k=k: grid3d_least_squares(k)) for k in (3, 4, 5, 8)] + [
        LadderProblem("ch5-6-b2", lambda: chessboard_boundary(5, 6, 2)),
        LadderProblem("grid12", lambda: grid3d_least_squares(12))]


def _power_law_timer(crossover, calls=None):
    """CPU time = flops/1e9; GPU/CPU ratio = (crossover / intensity) ** 0.7."""
    def timer(backend, name, A, analysis):
        if calls is not None:
            calls.append((backend, name))
        cpu = analysis.flops / 1e9
        return cpu if backend == "cpu" else cpu * (crossover / analysis.intensity) ** 0.7
    return timer


# -- the fit ---------------------------------------------------------------------------

def test_fit_finds_power_law_crossover():
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(0, np.log(2000), 12))
    x = np.exp(x)
    for c in (3.0, 37.2, 400.0):
        r = (c / x) ** 0.8
        if not (r[0] >= 1 > r[-1]):
            continue
        assert fit_threshold(x, r) == pytest.approx(c, rel=1e-9)
        # order of the points does not matter
        perm = rng.permutation(x.size)
        assert fit_threshold(x[perm], r[perm]) == pytest.approx(c, rel=1e-9)


def test_fit_edges_and_noise():
    x = [1.0, 10.0, 100.0, 1000.0]
    assert fit_threshold(x, [0.9, 0.5, 0.2, 0.1]) == 1.0           # GPU faster everywhere
    assert math.isinf(fit_threshold(x, [3, 2, 1.5, 1.01]))            # CPU faster everywhere
    assert math.isinf(fit_threshold(x, [3, 0.5, 0.5, 1.2]))           # GPU loses at the top
    # an isolated fast GPU point below a slower one does not lower the threshold
    t = fit_threshold(x, [2.0, 0.5, 1.5, 0.3])
    assert 100.0 < t <= 1000.0
    # equal intensities: a slower point at the same intensity keeps it below
    t = fit_threshold([1, 10, 10, 100], [2, 0.5, 1.2, 0.5])
    assert 10.0 < t < 100.0
    # NaN GPU time counts as slower; the threshold stays inside the bracket
    t = fit_threshold(x, [np.nan, 3.0, 0.9, 0.5])
    assert 10.0 < t <= 100.0
    with pytest.raises(ValueError):
        fit_threshold([], [])
    with pytest.raises(ValueError):
        fit_threshold([0.0, 1.0], [1.0, 0.5])


# -- measurement with injected timings and the cache ------------------------------------

def test_calibrate_fits_stores_and_reads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    calls, seen = [], []
    cal = calibrate_sparse(_ladder(), timer=_power_law_timer(20.0, calls), device=DEVICE,
                           progress=seen.append)
    assert len(cal.points) == 6 and len(seen) == 6
    assert {b for b, _ in calls} == {"cpu", "gpu"} and len(calls) == 12
    xs = sorted(p.intensity for p in cal.points)
    assert xs[0] < 3 and xs[-1] > 40            # the ladder spans the crossover
    assert cal.threshold == pytest.approx(20.0, rel=1e-9)
    assert all((p.ratio < 1) == (p.intensity > 20) for p in cal.points)
    assert all(p.analyze_s >= 0 and p.flops > 0 for p in cal.points)
    path = calibration_file()
    assert cal.path == str(path) and path.parent == tmp_path and path.exists()
    data = json.loads(path.read_text())
    entry = data["gpus"][DEVICE["name"]]
    assert entry["compute_capability"] == "90" and entry["cupy_version"] == "0.test"
    assert entry["date"] == cal.date and len(entry["points"]) == 6
    back = load_calibration(DEVICE["name"])
    assert back == cal and back.describe().startswith("threshold 20 flops/byte, calibrated")
    assert load_threshold(DEVICE["name"]) == pytest.approx(20.0)
    assert load_threshold("Some Other GPU") is None and load_threshold(None) is None


def test_cache_keeps_models_apart_and_stores_inf(tmp_path):
    a = calibrate_sparse(_ladder()[:3], timer=_power_law_timer(1e6), device=DEVICE,
                         directory=tmp_path)
    assert math.isinf(a.threshold)
    other = {**DEVICE, "name": "Other GPU"}
    b = calibrate_sparse(_ladder()[:3], timer=_power_law_timer(0.5), device=other,
                         directory=tmp_path)
    assert b.threshold == pytest.approx(min(p.intensity for p in b.points))
    assert math.isinf(load_threshold(DEVICE["name"], directory=tmp_path))
    assert load_threshold("Other GPU", directory=tmp_path) == pytest.approx(b.threshold)
    json.loads(calibration_file(tmp_path).read_text())  # strict JSON ("inf" is a string)
    # a newer calibration of the same model replaces the old one (mtime-keyed read)
    c = calibrate_sparse(_ladder()[:3], timer=_power_law_timer(0.5), device=DEVICE,
                         directory=tmp_path)
    os.utime(calibration_file(tmp_path), ns=(1, 1))  # a different mtime than any read so far
    assert load_threshold(DEVICE["name"], directory=tmp_path) == pytest.approx(c.threshold)


def test_a_calibration_read_stats_its_file_once(tmp_path, monkeypatch):
    # a file version not read yet is parsed under the stamp of the one stat
    c = calibrate_sparse(_ladder()[:3], timer=_power_law_timer(0.5), device=DEVICE,
                         directory=tmp_path)
    path = str(calibration_file(tmp_path))
    os.utime(path, ns=(2, 2))
    with counted_stats(monkeypatch) as stats:
        assert load_calibration(DEVICE["name"], directory=tmp_path) == c
        assert stats.count(path) == 1
        assert load_calibration(DEVICE["name"], directory=tmp_path) == c      # parsed once
        assert stats.count(path) == 2


def test_corrupt_cache_reads_as_uncalibrated(tmp_path):
    calibration_file(tmp_path).write_text("{not json")
    assert load_calibration(DEVICE["name"], directory=tmp_path) is None
    calibration_file(tmp_path).write_text(json.dumps(
        {"gpus": {DEVICE["name"]: {"gpu_name": DEVICE["name"], "threshold": -3}}}))
    assert load_threshold(DEVICE["name"], directory=tmp_path) is None


def test_calibrate_refuses_without_gpu_and_bad_arguments(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_mod, "gpu_info",
                        lambda: {"available": False, "reason": "no device (test)"})
    with pytest.raises(RuntimeError, match="needs a GPU"):
        calibrate_sparse(_ladder()[:1], directory=tmp_path)
    with pytest.raises(ValueError):
        calibrate_sparse(_ladder()[:1], backends=("cpu",), timer=_power_law_timer(1),
                         device=DEVICE, directory=tmp_path)
    with pytest.raises(ValueError):
        calibrate_sparse([], timer=_power_law_timer(1), device=DEVICE, directory=tmp_path)
    assert not calibration_file(tmp_path).exists()


def test_warm_median_runs_warm_up_and_budget():
    calls = []

    class Num:
        freed = 0

        def free(self):
            Num.freed += 1

    def factorize(A, *, ordering, colperm, tol, analysis):
        calls.append(analysis)
        return Num()

    t = warm_median(factorize, None, "an", 5)
    assert len(calls) == 6 and Num.freed == 6 and set(calls) == {"an"} and t >= 0
    calls.clear()
    import time as _t

    def slow(A, **kw):
        calls.append(1)
        _t.sleep(0.02)
    warm_median(slow, None, None, 10, budget_s=0.03)
    assert len(calls) == 2  # warm-up + one timed call (budget exhausted)


# -- dispatch reads the calibration -----------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """'auto' sees a GPU and an engine (the reference engine answers for it)."""
    from scipy_gpuqr._engine.host.reference import reference_factorize
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    monkeypatch.setattr(gpu_mod, "gpu_info", lambda: {"available": True, "reason": "ok",
                                                      **DEVICE})
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (reference_factorize, "ok"))
    return tmp_path


def _store(threshold, directory):
    cal = Calibration(gpu_name=DEVICE["name"], compute_capability="90",
                      cupy_version="0.test", threshold=threshold, points=(),
                      date="2026-11-22")
    store_calibration(calibration_file(directory), cal)


def test_dispatch_uses_calibrated_threshold(fake_gpu, monkeypatch, capsys):
    from scipy_gpuqr import GpuqrOptions, QRFactorization
    from scipy_gpuqr._validate import as_matrix
    A = as_matrix(grid3d_least_squares(8)).A          # intensity about 15.6
    plan = _dispatch.plan_factorization(A)
    assert plan.backend == "gpu" and plan.threshold == 10.0      # default, uncalibrated
    assert "not calibrated" in plan.threshold_source
    _store(40.0, fake_gpu)
    plan = _dispatch.plan_factorization(A)
    s = plan.summary()
    assert plan.backend == "cpu" and s["threshold"] == 40.0
    assert s["threshold_source"] == f"calibrated 2026-11-22 for {DEVICE['name']}"
    assert any("threshold 40 flops/byte, calibrated 2026-11-22" in r for r in s["reasons"])
    _store(5.0, fake_gpu)
    monkeypatch.setenv("SCIPY_GPUQR_VERBOSE", "1")
    F = QRFactorization(grid3d_least_squares(8))
    assert F.info["backend"] == "gpu" and F.info["threshold"] == 5.0
    assert "calibrated 2026-11-22" in capsys.readouterr().err
    # the options object wins over the calibration
    plan = _dispatch.plan_factorization(
        A, resolve_settings(gpuqr_options=GpuqrOptions(intensity_threshold=100)))
    assert plan.backend == "cpu" and plan.threshold_source == "from gpuqr_options"
    _store(math.inf, fake_gpu)
    assert _dispatch.plan_factorization(A).backend == "cpu"
    # explicit backends never consult the threshold
    assert _dispatch.plan_factorization(A, resolve_settings("cpu")).threshold is None


# -- the CLI ---------------------------------------------------------------------------

def test_cli_without_gpu_one_line_exit_2(tmp_path):
    if gpu_mod.gpu_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, "-m", "scipy_gpuqr", "calibrate", "--quick"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SCIPY_GPUQR_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a GPU" in lines[0] and "Traceback" not in out.stderr
    assert not calibration_file(tmp_path).exists()


def test_cli_with_injected_timings(fake_gpu, monkeypatch, capsys):
    from scipy_gpuqr._cli import main as _cli
    monkeypatch.setattr(_calibrate, "default_ladder", lambda quick=False: _ladder())
    monkeypatch.setattr(_calibrate, "_default_timer",
                        lambda backends, repeats, solve: (_power_law_timer(20.0),
                                                          {"cpu": "cpu", "gpu": "gpu"}))
    assert _cli.main(["calibrate", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "GPU/CPU" in text and "threshold 20 flops/byte, calibrated" in text
    assert str(calibration_file(fake_gpu)) in text
    assert _cli.main(["calibrate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threshold"] == pytest.approx(20.0) and data["gpu_name"] == DEVICE["name"]
    assert len(data["points"]) == 6 and data["path"] == str(calibration_file(fake_gpu))


def test_measurement_needs_the_solve_it_times(fake_gpu):
    """Without an injected timer the caller passes the least-squares solve to time."""
    with pytest.raises(ValueError, match="solve="):
        calibrate_sparse(_ladder()[:1], device=DEVICE, directory=fake_gpu)
    assert not calibration_file(fake_gpu).exists()


def test_default_timer_times_factorization_and_least_squares_solve(monkeypatch):
    """The real timer (CPU backends here) runs lsqr's solve on each factorization it times."""
    from scipy_gpuqr._factor.factored import FactoredQR, least_squares_probe
    from scipy_gpuqr._symbolic import analyze

    solved = []
    original = FactoredQR.least_squares

    def counting(self, B):
        X = original(self, B)
        solved.append((self.plan.backend, B.shape, X.shape))
        return X

    monkeypatch.setattr(FactoredQR, "least_squares", counting)
    timer, ran = _calibrate._default_timer(("cpu", "reference"), 2, least_squares_probe)
    A = chessboard_boundary(5, 6, 2)          # rank-deficient: the rank decision is timed too
    seconds = timer("reference", "ch5-6-b2", A, analyze(A))
    assert seconds > 0 and ran["reference"] == "reference"
    # one warm-up and two timed calls, each factorizing and solving one right-hand side
    assert solved == [("reference", (A.shape[0], 1), (A.shape[1], 1))] * 3
