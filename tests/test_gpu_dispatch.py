"""Dispatch on a GPU machine: an unmodified patched script runs large problems on the GPU.

A column-scaled 3-D grid problem (cond ~1e8: LSQR cannot reach working precision
on its budget) is factorized; the large one (intensity above the threshold)
on the GPU, the small one (intensity ~4) on the CPU, and SCIPY_GPUQR_VERBOSE=1
says so on stderr.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.linalg import lsqr
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    k = int(sys.argv[1])
    A = grid3d_least_squares(k)
    A = sp.csc_array(A @ sp.diags_array(np.logspace(0, -8, A.shape[1])))
    b = A @ np.ones(A.shape[1]) + 1e-3 * np.random.default_rng(0).standard_normal(A.shape[0])
    x, istop, itn = lsqr(A, b)[:3]
    r = b - A @ x
    print("itn", itn, "bwd", np.linalg.norm(A.T @ r) / (sp.linalg.norm(A) * np.linalg.norm(r)))
""")


@pytest.mark.gpu
@pytest.mark.parametrize("k,where", [(20, "running 'gpu'"), (4, "running 'cpu'")])
def test_patched_script_runs_where_the_problem_belongs(tmp_path, k, where):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "SCIPY_GPUQR_VERBOSE": "1",
           "SCIPY_GPUQR_CACHE_DIR": str(tmp_path / "cache")}  # not calibrated: default threshold
    out = subprocess.run([sys.executable, "-W", "error", "-m", "scipy_gpuqr", "run", str(script),
                          str(k)], cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert where in out.stderr, out.stderr
    assert "itn 0" in out.stdout  # the factorization answered
    bwd = float(out.stdout.split("bwd")[1])
    assert bwd < 1e-10
