"""``spsolve``/``factorized`` under ``auto``: SciPy's own function below the threshold.

Without a GPU (or its engine) SciPy's SuperLU answers at once, bit for bit
SciPy's answer with SciPy's warnings and exceptions; with one, the QR
analysis' intensity against the threshold calibrated against SuperLU
decides. Explicit backends always factorize with the QR. The GPU is faked
here (``gpu_info`` and the engine; the reference engine stands in for the
GPU's), so everything runs on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as ssl
from scipy.sparse import SparseEfficiencyWarning

import scipy_gpuqr
from scipy_gpuqr import GpuqrOptions, QRFactorization, factorized, spsolve
from scipy_gpuqr import _gpu as gpu_mod
from scipy_gpuqr._api import spsolve as _spsolve_module
from scipy_gpuqr._api.originals import MatrixRankWarning, original, spsolve_gssv
from scipy_gpuqr._dispatch import calibrate as _calibrate
from scipy_gpuqr._dispatch import plan as _dispatch
from scipy_gpuqr._dispatch.calibrate import LadderProblem, calibrate_sparse, format_table
from scipy_gpuqr._dispatch.calibration import (Calibration, calibration_file, load_calibration,
                                               load_spsolve_threshold, load_threshold,
                                               store_calibration)
from scipy_gpuqr._errors import GpuFallbackWarning
from scipy_gpuqr._options import DEFAULT_SPSOLVE_THRESHOLD
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
from scipy_gpuqr.io import mmread

DEVICE = {"name": "Test GPU 9000", "compute_capability": "90", "cupy_version": "0.test"}


@pytest.fixture
def no_gpu(monkeypatch):
    """'auto' with no GPU answering (as on a machine without one), backend from no one."""
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    monkeypatch.setattr(gpu_mod, "gpu_info", lambda: {"available": False,
                                                      "reason": "no device (test)",
                                                      "cupy_version": None})


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """'auto' sees a GPU and an engine (the reference engine answers for it)."""
    from scipy_gpuqr._engine.host.reference import reference_factorize
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    monkeypatch.setattr(gpu_mod, "gpu_info", lambda: {"available": True, "reason": "ok",
                                                      **DEVICE})
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (reference_factorize, "ok"))
    # the tests' matrices are small: let the intensity decide instead of the size gate
    monkeypatch.setattr(_dispatch, "SUPERLU_ALWAYS_NNZ", 0)
    return tmp_path


def test_small_systems_are_superlu_without_analysis(fake_gpu, scipy_calls, monkeypatch, rng,
                                                    caplog):
    """Below the size gate SciPy answers at once, even with a GPU and a low threshold."""
    monkeypatch.setattr(_dispatch, "SUPERLU_ALWAYS_NNZ", 10**6)
    monkeypatch.setattr(_dispatch, "symbolic_analyze",
                        lambda *a, **k: pytest.fail("analysed a small system"))
    A = sp.random(200, 200, density=0.05, random_state=3, format="csc") + 4 * sp.eye(200)
    b = rng.standard_normal(200)
    with caplog.at_level("INFO", logger="scipy_gpuqr"):
        x = spsolve(A, b, gpuqr_options={"spsolve_threshold": 0.0})
    np.testing.assert_array_equal(x, original("spsolve")(A, b))
    assert scipy_calls == ["spsolve"]
    assert "stored entries, below" in caplog.text


@pytest.mark.parametrize("verbose", [None, "", "0", "1"])
def test_small_system_decision_shown_when_verbose(monkeypatch, capsys, caplog, rng, verbose):
    """The short SuperLU call skips its decision line only when nobody would see it:
    ``SCIPY_GPUQR_VERBOSE`` set to anything but '' or '0' prints it, as does a logger at
    INFO; unset, with the logger at WARNING, nothing is printed."""
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    if verbose is None:
        monkeypatch.delenv("SCIPY_GPUQR_VERBOSE", raising=False)
    else:
        monkeypatch.setenv("SCIPY_GPUQR_VERBOSE", verbose)
    A = sp.csc_array(sp.random(30, 30, density=0.1, random_state=4) + 4 * sp.eye(30))
    b = rng.standard_normal(30)
    with caplog.at_level("WARNING", logger="scipy_gpuqr"):
        x = spsolve(A, b)
    np.testing.assert_array_equal(x, original("spsolve")(A, b))
    printed = capsys.readouterr().err
    assert ("SuperLU (SciPy) answered" in printed) == (verbose == "1")
    with caplog.at_level("INFO", logger="scipy_gpuqr"):
        spsolve(A, b)
    assert "SuperLU (SciPy) answered" in caplog.text


@pytest.fixture
def scipy_calls(monkeypatch):
    """The names of SciPy's originals our spsolve module called, in order ('spsolve'
    also for SciPy's spsolve's own SuperLU call made directly, :func:`spsolve_gssv`)."""
    calls = []

    def spy(name):
        def f(*args, **kwargs):
            calls.append(name)
            return original(name)(*args, **kwargs)
        return f

    def gssv_spy(use_umfpack):
        gssv = spsolve_gssv(use_umfpack)
        if gssv is None:
            return None

        def f(*args, **kwargs):
            calls.append("spsolve")
            return gssv(*args, **kwargs)
        return f
    monkeypatch.setattr(_spsolve_module, "original", spy)
    monkeypatch.setattr(_spsolve_module, "spsolve_gssv", gssv_spy)
    return calls


# -- comparing with SciPy ---------------------------------------------------------------

def _run(call):
    """``(outcome, warnings)``: the result or the exception, and every warning raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome = ("returned", call())
        except Exception as exc:            # noqa: BLE001 - compared with SciPy's
            outcome = ("raised", type(exc), str(exc))
    return outcome, [(w.category, str(w.message)) for w in caught]


def _bits(x):
    """What must be equal bit for bit: class, dtype, shape and every stored byte."""
    if sp.issparse(x):
        arrays = [getattr(x, a) for a in ("data", "indices", "indptr", "row", "col")
                  if hasattr(x, a)]
        return (type(x), x.format, x.dtype, x.shape, [a.tobytes() for a in arrays])
    if isinstance(x, np.ndarray):
        return (type(x), x.dtype, x.shape, x.tobytes())
    return x


def assert_same_as_scipy(ours, theirs):
    """``ours()`` and ``theirs()`` return the same bits (or raise the same exception)
    with the same warnings; ``theirs`` may be an outcome of :func:`_run` already."""
    (o, ow) = _run(ours)
    (t, tw) = theirs if isinstance(theirs, tuple) else _run(theirs)
    assert ow == tw
    if o[0] == "returned" and t[0] == "returned":
        assert _bits(o[1]) == _bits(t[1])
    else:
        assert o == t
    return o


def _square(rng, n, density=0.15, fmt="csc", dtype=np.float64):
    A = sp.random_array((n, n), density=density, rng=rng, format="csc") + 3 * sp.eye_array(n)
    return A.astype(dtype).asformat(fmt)


def _matrix(matrices_dir, name):
    return sp.csc_array(mmread(str(matrices_dir / name)))


# -- auto without a GPU: SciPy's own function, bit for bit --------------------------------

@pytest.mark.parametrize("fmt", ["csc", "csr", "coo", "dense"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spsolve_auto_without_gpu_is_scipys(no_gpu, scipy_calls, rng, fmt, dtype):
    n = 40
    S = _square(rng, n, dtype=dtype)
    A = S.toarray() if fmt == "dense" else S.asformat(fmt)
    rhs = [rng.standard_normal(n), rng.standard_normal((n, 1)), rng.standard_normal((n, 3)),
           np.arange(n), rng.standard_normal(n).astype(np.float32),
           sp.csc_array(sp.random_array((n, 3), density=0.3, rng=rng)),
           sp.csr_array(sp.random_array((n, 2), density=0.3, rng=rng)),
           sp.csc_array(rng.standard_normal((n, 1)))]
    for b in rhs:
        for permc in (None, "NATURAL", "MMD_AT_PLUS_A"):
            assert_same_as_scipy(lambda: spsolve(A, b, permc_spec=permc),
                                 lambda: original("spsolve")(A, b, permc_spec=permc))
    assert set(scipy_calls) == {"spsolve"}


def test_spsolve_vector_is_scipys_superlu_call(no_gpu, scipy_calls, rng, monkeypatch):
    """A float64 vector b with canonical CSR/CSC float64 A: SciPy's one SuperLU call made
    directly (the same bits); a singular A: SciPy's warning, pointing at the caller's
    line as SciPy's does, and NaN; UMFPACK turned on: SciPy's spsolve itself (here its
    RuntimeError, scikit-umfpack being absent)."""
    for fmt in ("csc", "csr"):
        A = _square(rng, 30, fmt=fmt)
        b = rng.standard_normal(30)
        assert_same_as_scipy(lambda: spsolve(A, b), lambda: original("spsolve")(A, b))
    assert scipy_calls == ["spsolve", "spsolve"]
    S = sp.csc_array(np.array([[1.0, 2.0], [2.0, 4.0]]))
    assert_same_as_scipy(lambda: spsolve(S, np.ones(2)),
                         lambda: original("spsolve")(S, np.ones(2)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        x = spsolve(S, np.ones(2))
    assert np.isnan(x).all() and x.shape == (2,)
    assert [(w.category, w.filename, w.lineno) for w in caught] == \
        [(MatrixRankWarning, __file__, line)]
    linsolve = sys.modules["scipy.sparse.linalg._dsolve.linsolve"]
    monkeypatch.setattr(linsolve.useUmfpack, "u", True, raising=False)
    del scipy_calls[:]
    A = _square(rng, 10)
    outcome = assert_same_as_scipy(lambda: spsolve(A, np.ones(10)),
                                   lambda: original("spsolve")(A, np.ones(10)))
    assert outcome[0] == "raised" if linsolve.noScikit else outcome[0] == "returned"
    assert scipy_calls == ["spsolve"]
    np.testing.assert_array_equal(spsolve(A, np.ones(10), use_umfpack=False),
                                  original("spsolve")(A, np.ones(10), use_umfpack=False))


def test_spsolve_auto_errors_are_scipys(no_gpu, rng):
    A = _square(rng, 8)
    for args in [(A, np.ones(7)), (A, np.ones((8, 2, 2))), (_square(rng, 8)[:, :6], np.ones(8)),
                 (A, np.ones(8), "BOGUS"), (A, np.array(["x"] * 8)),
                 ([[1.0, 2.0], [3.0]], np.ones(2))]:    # ragged: not even its size is known
        outcome = assert_same_as_scipy(lambda: spsolve(*args),
                                       lambda: original("spsolve")(*args))
        assert outcome[0] == "raised"


@pytest.mark.parametrize("fmt", ["csc", "csr", "dense"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_factorized_auto_without_gpu_is_scipys(no_gpu, scipy_calls, rng, fmt, dtype):
    n = 30
    S = _square(rng, n, dtype=dtype)
    A = S.toarray() if fmt == "dense" else S.asformat(fmt)
    rhs = [rng.standard_normal(n), rng.standard_normal((n, 4)), np.ones(n, dtype=np.int8),
           rng.standard_normal(n).astype(np.float32),
           np.ones(n) + 1j, np.ones((n, 2), dtype=np.complex64),       # SuperLU's TypeError
           np.ones(n - 1), np.ones((n, 2, 2)), sp.csc_array(np.ones((n, 1))),
           np.array(["a"] * n)]
    for b in rhs:
        for trans in ("N", "T", "H"):
            assert_same_as_scipy(lambda: factorized(A)(b, trans),
                                 lambda: original("factorized")(A)(b, trans))
    assert_same_as_scipy(lambda: factorized(A)(np.ones(n), trans="X"),
                         lambda: original("factorized")(A)(np.ones(n), trans="X"))
    assert set(scipy_calls) == {"factorized"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SparseEfficiencyWarning)
        solve = factorized(A)
    assert solve.info["backend"] == "superlu" and "stored entries, below" in solve.info["reasons"][0]
    assert type(solve.factorization).__name__ == "SuperLU"


def test_factorized_integer_A_keeps_superlus_cast_rule(no_gpu):
    """SuperLU factors an int8 A in float32: a float64 b is its TypeError, not our
    non-finite ValueError."""
    A = (3 * sp.eye_array(6, format="csc")).astype(np.int8)
    for b in (np.r_[np.ones(5), np.inf], np.ones(6), np.ones(6, dtype=np.float32)):
        assert_same_as_scipy(lambda: factorized(A)(b), lambda: original("factorized")(A)(b))
    with pytest.raises(ValueError, match="non-finite"):
        factorized(A)(np.r_[np.ones(5), np.inf].astype(np.float32))


@pytest.mark.parametrize("name", ["494_bus.mtx", "west0479.mtx"])
def test_real_matrices_auto_without_gpu_are_scipys(no_gpu, matrices_dir, rng, name):
    A = _matrix(matrices_dir, name)
    n = A.shape[0]
    for b in (np.ones(n), rng.standard_normal((n, 2))):
        assert_same_as_scipy(lambda: spsolve(A, b), lambda: original("spsolve")(A, b))
        assert_same_as_scipy(lambda: factorized(A)(b, "T"),
                             lambda: original("factorized")(A)(b, "T"))
    assert_same_as_scipy(lambda: spsolve(sp.coo_array(A), np.ones(n)),
                         lambda: original("spsolve")(sp.coo_array(A), np.ones(n)))


def test_singular_rajat01_warns_and_nans_like_scipy(no_gpu, matrices_dir):
    A = _matrix(matrices_dir, "rajat01.mtx")
    b = np.ones(A.shape[0])
    outcome = assert_same_as_scipy(lambda: spsolve(A, b), lambda: original("spsolve")(A, b))
    assert np.isnan(outcome[1]).all()
    with pytest.warns(MatrixRankWarning, match="exactly singular"):
        spsolve(A, b)
    outcome = assert_same_as_scipy(lambda: factorized(A), lambda: original("factorized")(A))
    assert outcome[:2] == ("raised", RuntimeError)


def test_auto_without_gpu_runs_no_analysis_and_logs(no_gpu, monkeypatch, rng, caplog):
    """Above the size gate, no GPU is the reason SciPy answers (still without analysis)."""
    def no_analysis(*args, **kwargs):
        raise AssertionError("the symbolic analysis ran")
    monkeypatch.setattr(_dispatch, "symbolic_analyze", no_analysis)
    monkeypatch.setattr(_dispatch, "SUPERLU_ALWAYS_NNZ", 0)
    A = _square(rng, 20)
    with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
        spsolve(A, np.ones(20))
        factorized(A)(np.ones(20))
    said = [r.getMessage() for r in caplog.records]
    assert said == ["spsolve: SuperLU (SciPy) answered: backend 'auto' from default; "
                    "no GPU: no device (test)",
                    "factorized: SuperLU (SciPy) answered: backend 'auto' from default; "
                    "no GPU: no device (test)"]


def test_small_systems_never_ask_for_a_gpu(monkeypatch, scipy_calls, rng, caplog):
    """Below the size gate the size alone decides: neither gpu_info nor the engine is
    asked (their cost would be most of our per-call overhead), and the log says so."""
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    monkeypatch.setattr(gpu_mod, "gpu_info", lambda: pytest.fail("asked gpu_info"))
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: pytest.fail("asked gpu_engine"))
    A = _square(rng, 20)
    with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
        assert_same_as_scipy(lambda: spsolve(A, np.ones(20)),
                             lambda: original("spsolve")(A, np.ones(20)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SparseEfficiencyWarning)
            solve = factorized(A.toarray())     # dense: its size counts
    why = "stored entries, below 200000 where the GPU QR cannot pay off (GPU not consulted)"
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"spsolve: SuperLU (SciPy) answered: backend 'auto' from default; "
                    f"{A.nnz} {why}",
                    f"factorized: SuperLU (SciPy) answered: backend 'auto' from default; "
                    f"400 {why}"]
    assert solve.info["reasons"] == [f"backend 'auto' from default; 400 {why}",
                                     "SciPy's SuperLU answers"]
    assert scipy_calls == ["spsolve", "factorized"]


def test_auto_without_gpu_engine_is_scipys(monkeypatch, scipy_calls, rng):
    """No CuPy (so no GPU engine): SciPy answers, whatever gpu_info would say."""
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    monkeypatch.setattr(_dispatch, "SUPERLU_ALWAYS_NNZ", 0)
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (None, "cupy is absent (test)"))
    monkeypatch.setattr(gpu_mod, "gpu_info", lambda: {"available": True, "reason": "ok",
                                                      **DEVICE})
    A = _square(rng, 15)
    assert_same_as_scipy(lambda: spsolve(A, np.ones(15)),
                         lambda: original("spsolve")(A, np.ones(15)))
    assert "cupy is absent (test)" in factorized(A).info["reasons"][0]
    assert scipy_calls == ["spsolve", "factorized"]


def _with_duplicate(A, fmt):
    """A in ``fmt`` (CSC/CSR) with its first stored entry split into two duplicates."""
    M = A.asformat(fmt)
    data = np.r_[M.data[:1] * 0.5, M.data[:1] * 0.5, M.data[1:]]
    indices = np.r_[M.indices[:1], M.indices[:1], M.indices[1:]]
    indptr = M.indptr.copy()
    indptr[1:] += 1
    return type(M)((data, indices, indptr), shape=M.shape)


@pytest.mark.parametrize("fmt", ["csc", "csr"])
def test_auto_never_modifies_inputs_scipy_would(no_gpu, rng, fmt):
    """SciPy sums a CSC/CSR A's duplicates in place; it is handed a copy, same bits."""
    A = _square(rng, 12)
    M = _with_duplicate(A, fmt)
    before = [a.copy() for a in (M.data, M.indices, M.indptr)]
    assert_same_as_scipy(lambda: spsolve(M, np.ones(12)),
                         lambda: original("spsolve")(M.copy(), np.ones(12)))
    assert_same_as_scipy(lambda: factorized(M)(np.ones(12)),
                         lambda: original("factorized")(M.copy())(np.ones(12)))
    for a, b in zip(before, (M.data, M.indices, M.indptr)):
        assert np.array_equal(a, b)
    assert not M.has_canonical_format


def test_non_finite_input_raises_before_scipy(no_gpu, scipy_calls, rng):
    """DESIGN §10: inf/NaN in A or b raise ValueError before any work, also when
    SciPy would answer (SciPy itself returns NaN)."""
    A = _square(rng, 6)
    bad = A.copy()
    bad.data[0] = np.nan
    for M in (bad, bad.tolil(), bad.toarray()):
        with pytest.raises(ValueError, match=r"A \(shape \(6, 6\)\) contains 1 non-finite"):
            spsolve(M, np.ones(6))
    with pytest.raises(ValueError, match=r"b \(shape \(6, 2\)\) contains"):
        spsolve(A, np.full((6, 2), np.inf))
    with pytest.raises(ValueError, match="non-finite"):
        factorized(bad)
    with pytest.raises(ValueError, match=r"b \(shape \(6,\)\) contains"):
        factorized(A)(np.r_[np.ones(5), np.inf])
    # SuperLU's cast rule comes first: a float64 b for float32 A is its TypeError
    with pytest.raises(TypeError, match="rule 'safe'"):
        factorized(A.astype(np.float32))(np.r_[np.ones(5), np.inf])
    assert scipy_calls == ["factorized", "factorized"]


def test_patched_scipy_sparse_b_decides_once(no_gpu, rng, caplog):
    """SciPy's spsolve solves a sparse b through ``factorized`` looked up in its module
    (ours once patched): that inner call is SciPy's own, not a second decision."""
    A = _square(rng, 25, fmt="csr")
    B = sp.csc_array(sp.random_array((25, 4), density=0.4, rng=rng))
    scipys = _run(lambda: original("spsolve")(A, B))        # SciPy unpatched
    assert (SparseEfficiencyWarning, "splu converted its input to CSC format") in scipys[1]
    with scipy_gpuqr.patched():
        assert ssl.spsolve is spsolve
        with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
            assert_same_as_scipy(lambda: ssl.spsolve(A, B), scipys)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("spsolve: SuperLU (SciPy) answered")


# -- explicit backends: the QR, as before ------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "reference", "simulate", "gpu"])
def test_explicit_backends_factorize_with_qr(no_gpu, scipy_calls, rng, backend, caplog):
    A = _square(rng, 30)
    b = rng.standard_normal(30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpuFallbackWarning)     # 'gpu' without a GPU
        with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
            x = spsolve(A, b, backend=backend)
        solve = factorized(A, gpuqr_options={"backend": backend})
    assert isinstance(solve.factorization, QRFactorization)
    assert solve.info["requested"] == backend and solve.info["backend"] != "superlu"
    ref = original("spsolve")(A, b)
    scale = np.linalg.norm(ref)
    assert np.linalg.norm(x - ref) <= 1e-10 * scale
    assert np.linalg.norm(solve(b, "T") - original("factorized")(A)(b, "T")) <= 1e-10 * scale
    assert scipy_calls == []
    assert any(" QR on " in r.getMessage() for r in caplog.records)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpuFallbackWarning)
        with pytest.warns(MatrixRankWarning):
            spsolve(sp.csc_array(np.diag([1.0, 0.0])), np.ones(2), backend=backend)


def test_environment_backend_is_explicit(no_gpu, scipy_calls, monkeypatch, rng):
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "reference")
    assert factorized(_square(rng, 10)).info["backend"] == "reference"
    spsolve(_square(rng, 10), np.ones(10))
    assert scipy_calls == []


# -- with a GPU: the intensity against the threshold calibrated against SuperLU -----------

def _intensity(A):
    return analyze(sp.csc_array(A), ordering="colamd").intensity


def test_threshold_decides_between_superlu_and_qr(fake_gpu, scipy_calls, caplog):
    A = sp.csc_array(grid3d_least_squares(6)[:216])   # the square 3-D Laplacian
    b = np.ones(216)
    t = _intensity(A)
    at = GpuqrOptions(spsolve_threshold=t)
    above = GpuqrOptions(spsolve_threshold=t * 1.001)
    with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
        x = spsolve(A, b, gpuqr_options=at)
        solve = factorized(A, gpuqr_options=at)
    assert scipy_calls == []
    assert solve.info["backend"] == "gpu" and solve.info["threshold"] == t
    assert solve.info["threshold_source"] == "from gpuqr_options"
    assert np.allclose(A @ x, b)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("QR on GPU: " in m for m in said)
    assert f"auto: GPU (intensity {t:.3g} >= threshold {t:.3g} flops/byte" in said[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
        assert_same_as_scipy(lambda: spsolve(A, b, gpuqr_options=above),
                             lambda: original("spsolve")(A, b))
        solve = factorized(A, gpuqr_options=above)
    assert solve.info["backend"] == "superlu" and solve.info["intensity"] == t
    assert scipy_calls == ["spsolve", "factorized"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("SuperLU (SciPy) answered: " in m for m in said)
    assert "auto: SuperLU (intensity" in said[0]


def test_monkeypatched_intensity_and_default_threshold(fake_gpu, monkeypatch, scipy_calls):
    """The default threshold against SuperLU applies, not the QR one."""
    real = _dispatch.symbolic_analyze
    intensity = {}

    def analysis_of(A, **kwargs):
        return dataclasses.replace(real(A, **kwargs), intensity=intensity["value"])
    monkeypatch.setattr(_dispatch, "symbolic_analyze", analysis_of)
    A = sp.csc_array(grid3d_least_squares(4)[:64])
    intensity["value"] = DEFAULT_SPSOLVE_THRESHOLD
    info = factorized(A).info
    assert info["backend"] == "gpu" and info["threshold"] == DEFAULT_SPSOLVE_THRESHOLD
    assert info["threshold_source"].startswith("default, not calibrated against SuperLU")
    intensity["value"] = DEFAULT_SPSOLVE_THRESHOLD * 0.99     # above the QR threshold of 10
    assert factorized(A).info["backend"] == "superlu"
    assert QRFactorization(A).info["backend"] == "gpu"          # the QR's own threshold
    assert scipy_calls == ["factorized"]


def test_calibrated_spsolve_threshold_is_read_back(fake_gpu, scipy_calls):
    A = sp.csc_array(grid3d_least_squares(6)[:216])
    t = _intensity(A)
    for spsolve_t, qr_t, expect in [(t, math.inf, "gpu"), (t * 1.01, 0.0, "superlu"),
                                    (None, 0.0, "superlu" if t < DEFAULT_SPSOLVE_THRESHOLD
                                     else "gpu")]:
        cal = Calibration(gpu_name=DEVICE["name"], compute_capability="90",
                          cupy_version="0.test", threshold=qr_t, points=(),
                          date="2026-11-22", spsolve_threshold=spsolve_t)
        store_calibration(calibration_file(fake_gpu), cal)
        info = factorized(A).info
        assert info["backend"] == expect
        if spsolve_t is not None:
            assert info["threshold"] == spsolve_t
            assert info["threshold_source"] == ("calibrated against SuperLU 2026-11-22 "
                                                f"for {DEVICE['name']}")
    # the options object wins over the calibration
    info = factorized(A, gpuqr_options={"spsolve_threshold": 0.0}).info
    assert info["backend"] == "gpu" and info["threshold_source"] == "from gpuqr_options"


# -- calibrating the threshold against SuperLU --------------------------------------------

def _qr_ladder():
    return [LadderProblem(f"grid{k}", lambda k=k: grid3d_least_squares(k)) for k in (3, 4, 8)]


def _square_ladder():
    return [LadderProblem(f"cd{d}-{k}", lambda k=k, d=d: _calibrate.convection_diffusion(k, d))
            for k, d in ((4, 3), (16, 2), (8, 3), (12, 3), (16, 3))]


def _timer(qr_crossover, superlu_crossover, calls=None):
    """CPU time = flops/1e9; GPU/CPU = (crossover / intensity) ** 0.7 per CPU side."""
    def timer(backend, name, A, analysis):
        if calls is not None:
            calls.append((backend, name))
        cpu = analysis.flops / 1e9
        if backend in ("cpu", _calibrate.SUPERLU):
            return cpu
        c = superlu_crossover if name.startswith("cd") else qr_crossover
        return cpu * (c / analysis.intensity) ** 0.7
    return timer


def test_calibration_fits_and_stores_the_spsolve_threshold(tmp_path, capsys):
    calls, seen = [], []
    cal = calibrate_sparse(_qr_ladder(), timer=_timer(8.0, 30.0, calls), device=DEVICE,
                           directory=tmp_path, spsolve_ladder=_square_ladder(),
                           progress=seen.append)
    assert cal.threshold == pytest.approx(8.0) and cal.spsolve_threshold == pytest.approx(30.0)
    assert len(cal.points) == 3 and len(cal.spsolve_points) == 5 and len(seen) == 8
    assert {p.cpu_backend for p in cal.spsolve_points} == {"superlu"}
    assert [b for b, n in calls if n.startswith("cd")] == ["superlu", "gpu"] * 5
    assert load_spsolve_threshold(DEVICE["name"], directory=tmp_path) == pytest.approx(30.0)
    assert load_threshold(DEVICE["name"], directory=tmp_path) == pytest.approx(8.0)
    back = load_calibration(DEVICE["name"], directory=tmp_path)
    assert back == cal
    entry = json.loads(calibration_file(tmp_path).read_text())["gpus"][DEVICE["name"]]
    assert entry["spsolve_threshold"] == pytest.approx(30.0) and len(entry["spsolve_points"]) == 5
    text = format_table(cal)
    assert "GPU/SuperLU" in text and "GPU/CPU" in text
    assert "spsolve threshold 30 flops/byte (GPU QR against SciPy's SuperLU)" in text
    # SuperLU faster everywhere: never the GPU
    cal = calibrate_sparse(_qr_ladder(), timer=_timer(8.0, 1e6), device=DEVICE,
                           directory=tmp_path, spsolve_ladder=_square_ladder())
    assert math.isinf(load_spsolve_threshold(DEVICE["name"], directory=tmp_path))
    json.loads(calibration_file(tmp_path).read_text())


def test_injected_timer_without_square_ladder_leaves_it_unmeasured(tmp_path):
    cal = calibrate_sparse(_qr_ladder(), timer=_timer(8.0, 30.0), device=DEVICE,
                           directory=tmp_path)
    assert cal.spsolve_threshold is None and cal.spsolve_points == ()
    assert "spsolve_threshold" not in cal.to_json()
    assert load_spsolve_threshold(DEVICE["name"], directory=tmp_path) is None
    assert "spsolve threshold not measured" in format_table(cal)


def test_measurement_times_superlu_against_the_gpu_square_solve(fake_gpu, monkeypatch):
    """Measuring (no timer): the QR ladder with ``solve``, the square ladder with SuperLU
    against the GPU and ``square_solve`` (default ``solve``)."""
    made = []

    def fake_default_timer(backends, repeats, solve):
        made.append((tuple(backends), solve))
        return _timer(8.0, 30.0), {b: b for b in backends}
    monkeypatch.setattr(_calibrate, "_default_timer", fake_default_timer)
    probe, square = object(), object()
    cal = calibrate_sparse(_qr_ladder(), device=DEVICE, directory=fake_gpu, solve=probe,
                           spsolve_ladder=_square_ladder(), square_solve=square)
    assert made == [(("cpu", "gpu"), probe), (("superlu", "gpu"), square)]
    assert cal.spsolve_threshold == pytest.approx(30.0)
    made.clear()
    monkeypatch.setattr(_calibrate, "default_spsolve_ladder",
                        lambda quick=False: _square_ladder()[:2] if quick else 1 / 0)
    cal = calibrate_sparse(_qr_ladder(), device=DEVICE, directory=fake_gpu, solve=probe)
    assert made[1] == (("superlu", "gpu"), probe) and len(cal.spsolve_points) == 2


def test_default_timer_runs_superlu_and_the_exact_solve(monkeypatch):
    from scipy_gpuqr._factor.factored import FactoredQR

    solved = []
    exact = FactoredQR.exact_solve

    def counting(self, B, **kw):
        solved.append((self.plan.backend, B.shape))
        return exact(self, B, **kw)
    monkeypatch.setattr(FactoredQR, "exact_solve", counting)
    timer, ran = _calibrate._default_timer((_calibrate.SUPERLU, "reference"), 2,
                                           _spsolve_module.spsolve_probe)
    A = _calibrate.convection_diffusion(5, 3)
    an = analyze(A)
    assert timer("superlu", "cd3-5", A, an) > 0 and solved == []
    assert timer("reference", "cd3-5", A, an) > 0
    assert ran == {"superlu": "superlu", "reference": "reference"}
    assert solved == [("reference", (125, 1))] * 3       # warm-up and two timed calls


def test_spsolve_ladder_spans_the_default_threshold():
    quick = _calibrate.default_spsolve_ladder(quick=True)
    full = _calibrate.default_spsolve_ladder()
    assert {p.name for p in quick} < {p.name for p in full}
    xs = [analyze(p.make()).intensity for p in quick]
    assert min(xs) < 5 and max(xs) > 3 * DEFAULT_SPSOLVE_THRESHOLD
    A = _calibrate.convection_diffusion(7, 2)
    assert A.shape == (49, 49) and A.nnz == 49 + 4 * 42
    assert (A != A.T).nnz > 0       # unsymmetric, like the systems spsolve is given


def test_unsupported_reason_names_what_goes_to_scipy():
    """The inputs we hand to SciPy's original and why: LinearOperators, pydata/sparse
    arrays (anywhere among the arguments, before any dtype), complex data (A or b)."""
    from scipy_gpuqr._validate import unsupported_reason

    class FakePydata:               # what pydata/sparse's arrays look like to the check
        __module__ = "sparse._coo.core"
        dtype = np.dtype(np.complex128)

        def to_scipy_sparse(self):
            raise AssertionError("not converted")

    A = sp.eye_array(3, format="csc")
    assert unsupported_reason(A, np.ones(3)) is None
    assert unsupported_reason(A, np.ones(3), None) is None
    assert unsupported_reason(A.toarray().tolist(), [1, 2, 3]) is None
    assert "LinearOperator" in unsupported_reason(ssl.aslinearoperator(A), np.ones(3))
    assert unsupported_reason(A, FakePydata()) == "pydata/sparse arrays are served by SciPy"
    assert unsupported_reason(A * 1j, np.ones(3), FakePydata()) == \
        "pydata/sparse arrays are served by SciPy"
    assert unsupported_reason(A * 1j, np.ones(3)) == \
        "complex dtype (A: complex128) is not supported yet"
    assert unsupported_reason(A, [1j, 0, 0]) == "complex dtype (b: complex128) is not supported yet"
    assert unsupported_reason(None, np.ones(3, np.complex64)) == \
        "complex dtype (b: complex64) is not supported yet"
    assert unsupported_reason(A, None, np.ones(3, np.complex64)) == \
        "complex dtype (b: complex64) is not supported yet"
    assert unsupported_reason(A, "not an array") is None     # SciPy's own error follows


@pytest.mark.parametrize("backend, env, source", [(None, None, "default"),
                                                  ("auto", "cpu", "keyword"),
                                                  (None, "auto", "environment")])
def test_short_path_info_is_the_plans_summary(monkeypatch, rng, backend, env, source):
    """factorized's short path (CSR/CSC A below the size gate) says what the general
    path's SuperLU plan says, with the source of auto as the precedence rule gives it."""
    if env is None:
        monkeypatch.delenv("SCIPY_GPUQR_BACKEND", raising=False)
    else:
        monkeypatch.setenv("SCIPY_GPUQR_BACKEND", env)
    A = _square(rng, 12)
    info = factorized(A, backend=backend).info
    why = (f"backend 'auto' from {source}; {A.nnz} stored entries, below "
           f"{_dispatch.SUPERLU_ALWAYS_NNZ} where the GPU QR cannot pay off (GPU not consulted)")
    assert info == _dispatch.Plan(backend=_dispatch.SUPERLU, requested="auto", source=source,
                                  reasons=[why, "SciPy's SuperLU answers"]).summary()
