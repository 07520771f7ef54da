"""Packaging: every package is listed in pyproject.toml; import does no GPU work."""

import subprocess
import sys
import tomllib

from conftest import REPO


def test_every_package_listed():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts)
             for p in (REPO / "scipy_gpuqr").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml packages: {sorted(found - listed)}"


def test_import_is_lazy():
    code = ("import sys, scipy_gpuqr; "
            "assert 'cupy' not in sys.modules, 'cupy imported at import time'; "
            "print(scipy_gpuqr.__version__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_gpu_info_never_raises():
    from scipy_gpuqr import gpu_info
    info = gpu_info()
    assert isinstance(info["available"], bool)
    assert info["reason"]
