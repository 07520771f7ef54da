"""Packaging: every package is listed in pyproject.toml; import does no GPU work."""

import fnmatch
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


def test_every_c_source_is_package_data():
    """The C sources built on first use ship in the wheel: without one, an
    installed package silently takes that part's NumPy path."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]
    missing = []
    for src in (REPO / "scipy_gpuqr").rglob("*.c"):
        package = ".".join(src.parent.relative_to(REPO).parts)
        if not any(fnmatch.fnmatch(src.name, pat) for pat in data.get(package, [])):
            missing.append(str(src.relative_to(REPO)))
    assert not missing, f"add to pyproject.toml package-data: {missing}"


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
