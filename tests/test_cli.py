"""The command line: every command answers, errors are one line (no traceback)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "scipy_gpuqr", *args], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_info_json():
    out = _cli("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert {"scipy_gpuqr", "gpu", "suitesparse", "kernels"} <= set(info)
    assert isinstance(info["gpu"]["available"], bool)


def test_no_command_prints_help():
    out = _cli()
    assert out.returncode == 2 and "COMMAND" in out.stdout


@pytest.mark.parametrize("content", [
    "", "%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n",
    "not a matrix market file\n", "%%MatrixMarket matrix coordinate real general\n2 2 1\n5 1 1.0\n",
    "%%MatrixMarket matrix coordinate integer general\n2 2 2\n1 1 3\n2 2 18446744073709551615\n",
    "%%MatrixMarket matrix array integer general\n2 1\n5\n-9223372036854775809\n",
])
@pytest.mark.parametrize("command", ["solve", "analyze"])
def test_malformed_file_is_one_line_error(tmp_path, content, command):
    path = tmp_path / "bad.mtx"
    path.write_text(content)
    out = _cli(command, str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "bad.mtx" in out.stderr


def test_integer_out_of_range_names_file_and_line(tmp_path):
    path = tmp_path / "big.mtx"
    path.write_text("%%MatrixMarket matrix coordinate integer general\n" + "% c\n" * 5
                    + "2 2 2\n1 1 3\n2 2 18446744073709551615\n")
    out = _cli("solve", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (f"scipy-gpuqr solve: error: {path}, line 9: integer "
                                  "18446744073709551615 out of range (int64)")


def _cli_strict(*args):
    """Run the CLI with every warning turned into an error."""
    return subprocess.run([sys.executable, "-W", "error", "-m", "scipy_gpuqr", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("shape", [(3, 4), (4, 3)])
@pytest.mark.parametrize("rhs", [None, "zeros", "ones"])
def test_solve_matrix_without_entries(tmp_path, shape, rhs):
    m, n = shape
    path = tmp_path / "empty.mtx"
    path.write_text(f"%%MatrixMarket matrix coordinate real general\n{m} {n} 0\n")
    args = [str(path)]
    if rhs is not None:
        b = tmp_path / "b.mtx"
        value = "0" if rhs == "zeros" else "1"
        b.write_text(f"%%MatrixMarket matrix array real general\n{m} 1\n" + f"{value}\n" * m)
        args.append(str(b))
    out = _cli_strict("solve", *args, "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    report = json.loads(out.stdout)
    assert report["shape"] == [m, n] and report["nnz"] == 0
    for who in ("ours", "scipy"):
        assert report[who]["backward_error"] == 0.0, report
    assert "nan" not in report["text"].lower()


def test_backward_error_of_a_zero_matrix():
    import numpy as np
    import scipy.sparse as sp

    import scipy_gpuqr
    from scipy_gpuqr._cli.solve_report import _backward_error

    A = sp.csc_array((3, 4))
    b = np.array([1.0, -2.0, 3.0])
    x = scipy_gpuqr.lsqr(A, b)[0]
    np.testing.assert_array_equal(x, np.zeros(4))  # minimum-norm least-squares solution
    with np.errstate(all="raise"):
        assert _backward_error(A, x, b) == 0.0
        assert _backward_error(A, x, np.zeros(3)) == 0.0
        assert np.isnan(_backward_error(A, np.full(4, np.nan), b))
        # a nonzero matrix keeps the usual definitions
        B = sp.csc_array(np.array([[1.0, 0], [0, 1.0], [0, 0]]))
        assert _backward_error(B, np.array([1.0, -2.0]), b) < 1e-15
        assert _backward_error(B, np.zeros(2), np.zeros(3)) == 0.0
        assert _backward_error(B, np.zeros(2), b) > 0.1


def test_missing_file_is_one_line_error(tmp_path):
    out = _cli("solve", str(tmp_path / "nope.mtx"))
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_solve_real_matrix(matrices_dir):
    out = _cli("solve", str(matrices_dir / "lp_e226_transposed.mtx"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["shape"] == [472, 223]
    # never less accurate than SciPy's own call with the same tolerances
    assert report["ours"]["backward_error"] <= 1.01 * report["scipy"]["backward_error"] + 1e-15
    assert report["ours"]["decisions"], "no decision was logged"


def test_demo_runs_small_grid():
    out = _cli("demo", "--grid", "6")
    assert out.returncode == 0, out.stderr
    assert "scipy_gpuqr.lsqr" in out.stdout and "backward error" in out.stdout


def test_calibrate_without_gpu_says_why():
    from scipy_gpuqr._gpu import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present: calibrate would run the whole ladder")
    out = _cli("calibrate")
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_build_kernels_without_gpu_says_why(tmp_path):
    from scipy_gpuqr._gpu import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present")
    out = _cli("build-kernels", env={"SCIPY_GPUQR_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 2 and "no GPU" in out.stderr
    assert "spqr kept, amd kept" in out.stdout               # the declarations on any host


def test_build_kernels_script_writes_the_declarations_without_a_gpu(tmp_path):
    from scipy_gpuqr._gpu import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, str(REPO / "build_kernels.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SCIPY_GPUQR_CACHE_DIR": str(tmp_path / "c")})
    assert out.returncode == 1 and "no GPU" in out.stdout
    assert "spqr kept, amd kept" in out.stdout
    assert len(list((tmp_path / "c" / "cffi").glob("*.py"))) == 2


def test_schedule_command_json(matrices_dir):
    out = _cli("schedule", str(matrices_dir / "494_bus.mtx"), "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats["launches"] >= 1 and stats["launches"] <= stats["launches_no_pipeline"]
    assert stats["tasks"] >= stats["launches"]


def test_analyze_with_schedule_json(matrices_dir):
    out = _cli("analyze", str(matrices_dir / "494_bus.mtx"), "--schedule", "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert {"m", "n", "nnz", "fronts", "flops", "nnz_R", "intensity", "stages",
            "launches", "launches_no_pipeline", "tasks"} <= set(stats)


def test_only_the_subcommand_given_is_imported():
    code = ("import sys\n"
            "from scipy_gpuqr._cli import main as m\n"
            "subs = {'scipy_gpuqr._cli.' + v[0] for v in m.COMMANDS.values()}\n"
            "m.build_parser([])\n"
            "assert not subs & set(sys.modules), subs & set(sys.modules)\n"
            "assert m.main(['info', '--json']) == 0\n"
            "assert subs & set(sys.modules) == {'scipy_gpuqr._cli.info'}\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_build_kernels_warms_the_iterative_device_path_and_the_rank_decisions(monkeypatch,
                                                                             capsys, tmp_path):
    # the cache warm-up writes the cffi declarations, compiles the package's
    # kernels, then runs the device LSQR/LSMR once and the GPU QR's rank
    # decisions, so CuPy's own kernels of those paths are cached too
    import argparse
    from scipy_gpuqr import _gpu, _kernels
    from scipy_gpuqr._cli import build_kernels
    order = []
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_gpu, "gpu_info", lambda: {"available": True})
    monkeypatch.setattr(_kernels, "warm_cache", lambda cache_dir=None: order.append("kernels") or [])
    monkeypatch.setattr(build_kernels, "warm_device_path", lambda: order.append("iterative") or 0.5)
    monkeypatch.setattr(build_kernels, "warm_rank_decisions", lambda: order.append("rank") or 0.5)
    assert build_kernels.run(argparse.Namespace(cache_dir=None)) == 0
    assert order == ["kernels", "iterative", "rank"]
    out = capsys.readouterr().out
    assert "iterative device path" in out and "GPU QR rank decisions" in out
    assert out.startswith("cffi declarations") and "spqr kept, amd kept" in out
    assert (tmp_path / "cffi").is_dir()


@pytest.mark.gpu
def test_warm_device_path_runs_on_the_gpu():
    from scipy_gpuqr._iterative.warmup import warm_device_path
    assert warm_device_path() > 0
