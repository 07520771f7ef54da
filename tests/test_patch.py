"""Patching SciPy: which names change, idempotence, restoration, `run` of a script."""

import importlib
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.optimize._lsq.trf as trf
import scipy.sparse.linalg as ssl

import scipy_gpuqr
from scipy_gpuqr._api import lsqr as _lsqr_module
from scipy_gpuqr._api import spsolve as _spsolve_module
from scipy_gpuqr._api.originals import ORIGINALS, original
from scipy_gpuqr._api.patch import PATCHED_NAMES, TARGET_MODULES, is_patched

from conftest import REPO


def _holders():
    out = {}
    for modname in TARGET_MODULES:
        mod = importlib.import_module(modname)
        for name in PATCHED_NAMES:
            if name in vars(mod):
                out[(modname, name)] = vars(mod)[name]
    return out


@pytest.fixture(autouse=True)
def _always_unpatched():
    scipy_gpuqr.unpatch()
    yield
    scipy_gpuqr.unpatch()


def test_patch_replaces_every_holder_and_unpatch_restores():
    before = _holders()
    assert all(obj is original(name) for (_, name), obj in before.items())
    assert ("scipy.sparse.linalg._isolve.lsqr", "lsqr") in before
    assert ("scipy.sparse.linalg._dsolve.linsolve", "factorized") in before
    scipy_gpuqr.patch()
    ours = {"lsqr": _lsqr_module.lsqr, "lsmr": _lsqr_module.lsmr,
            "spsolve": _spsolve_module.spsolve, "factorized": _spsolve_module.factorized}
    assert all(obj is ours[name] for (_, name), obj in _holders().items())
    assert ssl.lsqr is scipy_gpuqr.lsqr is _lsqr_module.lsqr and is_patched()
    scipy_gpuqr.unpatch()
    assert _holders() == before and not is_patched()


def test_patch_twice_is_harmless():
    scipy_gpuqr.patch()
    first = _holders()
    scipy_gpuqr.patch()
    assert _holders() == first
    scipy_gpuqr.unpatch()
    scipy_gpuqr.unpatch()
    assert not is_patched()


def test_patched_restores_the_state_it_found():
    with scipy_gpuqr.patched():
        assert is_patched()
    assert not is_patched()
    scipy_gpuqr.patch()
    with scipy_gpuqr.patched():
        assert is_patched()
    assert is_patched()  # it was patched before the block


def test_scipy_internal_users_left_alone():
    bound = vars(trf).get("lsmr")
    with scipy_gpuqr.patched():
        assert vars(trf).get("lsmr") is bound


def test_patching_raises_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with scipy_gpuqr.patched():
            pass


def test_patched_calls_reach_our_code_and_give_scipy_answers(rng):
    import scipy.sparse as sp
    A = sp.random(60, 20, density=0.2, random_state=1, format="csr") + sp.eye(60, 20)
    b = rng.standard_normal(60)
    with scipy_gpuqr.patched():
        assert ssl.lsqr is not ORIGINALS["lsqr"]
        ours = ssl.lsqr(A, b)
        exact = ssl.lsqr(A, b, atol=0, btol=0)[0]
    # SciPy's answer where SciPy's iterations converge (bit for bit on the CPU) ...
    theirs = ORIGINALS["lsqr"](A, b)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[1:3] == theirs[1:3]
    # ... and lstsq's minimum-norm answer when the caller asks for full precision
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    np.testing.assert_allclose(exact, x_ref, rtol=1e-8, atol=1e-10)


def test_run_unmodified_script_is_answered_by_us(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np
        import scipy.sparse as sp
        from scipy.sparse.linalg import lsqr
        A = sp.random(300, 80, density=0.05, random_state=0, format="csr") + sp.eye(300, 80)
        b = np.ones(300)
        x, istop, itn = lsqr(A, b)[:3]
        print("module", lsqr.__module__, "itn", itn, "arg", sys.argv[1])
    """))
    cmd = [sys.executable, "-W", "error", "-m", "scipy_gpuqr", "run", str(script), "hello"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                         env={**__import__("os").environ, "SCIPY_GPUQR_VERBOSE": "1"})
    assert out.returncode == 0, out.stderr
    assert "module scipy_gpuqr._api.lsqr" in out.stdout
    assert "arg hello" in out.stdout
    assert "scipy_gpuqr:" in out.stderr  # the verbose decision line


def test_is_patched_is_public():
    assert "is_patched" in scipy_gpuqr.__all__ and "is_patched" in dir(scipy_gpuqr)
    assert scipy_gpuqr.is_patched is is_patched
    from scipy_gpuqr import is_patched as imported
    assert not imported()
    with scipy_gpuqr.patched():
        assert imported()
