"""Helpers of the tests of the package's compiled libraries (the compiled
schedule loops and analysis tree loops, :mod:`scipy_gpuqr._native_build`), and the
check that the analysis gives the same on either path.

Their libraries are built into temporary cache folders (never the user's);
their tests are skipped only where no C compiler exists.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from scipy_gpuqr import _native_build
from scipy_gpuqr._symbolic import analyze

#: Mark for a module whose tests need a C compiler (skipped where none exists;
#: a compiler that fails is a failure).
needs_compiler = pytest.mark.skipif(_native_build.compiler(os.environ) is None,
                                    reason="no C compiler")


def env_with_cache(folder, **kw) -> dict:
    """This process' environment with the package cache folder at ``folder``
    and the variables ``kw`` set."""
    env = dict(os.environ)
    env["SCIPY_GPUQR_CACHE_DIR"] = str(folder)
    env.update(kw)
    return env


def use_loader(monkeypatch, native, loader) -> None:
    """For this test, the ``native`` module's ``library``, ``handle`` and
    ``status`` served by ``loader`` (a :class:`~scipy_gpuqr._native_build.Loader`
    or anything with its ``get`` and ``status``), through the module's
    :class:`~scipy_gpuqr._native_build.NativePart`."""
    monkeypatch.setattr(native._NATIVE, "loader", loader)


def built_loader(native, folder) -> tuple:
    """``(loader, environment)``: a fresh loader of the ``native`` module's
    library that built (or found) it in the cache folder ``folder``."""
    ld = _native_build.Loader(native._SPEC)
    env = env_with_cache(folder)
    assert ld.get(True, env) is not None, ld.status()
    return ld, env


class Preloaded:
    """A loader (for :func:`use_loader`) that serves one library already loaded:
    a test's library built once per module, without the loader's checks."""

    def __init__(self, lib):
        self._lib = lib

    def get(self, wait, environ=os.environ):
        return self._lib

    def status(self):
        return "loaded"


def assert_analysis_same_either_path(monkeypatch, native, lib, A) -> None:
    """The analysis of ``A`` on the NumPy path and on the compiled path (the
    symbolic library ``lib`` of the ``native`` module, :mod:`scipy_gpuqr._symbolic.native`)
    gives the same permutations, trees, counts, R pattern, fronts and totals."""
    monkeypatch.setenv(native.ENV, "numpy")
    ref = analyze(A, cache=False)
    use_loader(monkeypatch, native, Preloaded(lib))
    monkeypatch.setenv(native.ENV, "c")
    got = analyze(A, cache=False)
    for k in ("colperm", "rowperm", "leftmost", "etree", "col_counts", "r1_ptr", "r1_cols",
              "r1_nz", "front_flops"):
        np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=k)
    assert vars(got.fronts).keys() == vars(ref.fronts).keys()
    for k, v in vars(ref.fronts).items():
        np.testing.assert_array_equal(getattr(got.fronts, k), v, err_msg=f"fronts.{k}")
    assert (got.flops, got.nnz_R, got.nnz_H, got.nfronts) == \
        (ref.flops, ref.nnz_R, ref.nnz_H, ref.nfronts)


def built_library(native, folder):
    """The compiled library of the package module ``native`` (one with ``_SPEC``),
    built into the cache folder ``folder``; the test is skipped where none can be
    built (its loader's status says why)."""
    loader = native._native_build.Loader(native._SPEC)
    out = loader.get(True, env_with_cache(folder))
    if out is None:
        pytest.skip(f"no compiled library: {loader.status()}")
    return out
