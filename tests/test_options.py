"""Options object, the backend precedence rule, and settings resolved once per call."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import GpuqrOptions
from scipy_gpuqr import _options
from scipy_gpuqr._options import (BACKENDS, Settings, resolve_backend, resolve_options,
                                  resolve_settings, settings_for)


@pytest.mark.parametrize("name", BACKENDS)
def test_keyword_wins(name):
    env = {"SCIPY_GPUQR_BACKEND": "reference"}
    assert resolve_backend(name, GpuqrOptions(backend="cpu"), env) == (name, "keyword")


def test_options_beat_environment():
    env = {"SCIPY_GPUQR_BACKEND": "reference"}
    assert resolve_backend(None, GpuqrOptions(backend="cpu"), env) == ("cpu", "options")
    assert resolve_backend(None, {"backend": "gpu"}, env) == ("gpu", "options")


def test_environment_beats_default():
    assert resolve_backend(None, None, {"SCIPY_GPUQR_BACKEND": "CPU"}) == ("cpu", "environment")
    assert resolve_backend(None, None, {}) == ("auto", "default")
    assert resolve_backend(None, None, {"SCIPY_GPUQR_BACKEND": "  "}) == ("auto", "default")


@pytest.mark.parametrize("where", ["keyword", "options", "environment"])
def test_bad_backend_names_raise(where):
    with pytest.raises(ValueError, match="must be one of"):
        if where == "keyword":
            resolve_backend("cuda", None, {})
        elif where == "options":
            GpuqrOptions(backend="cuda")
        else:
            resolve_backend(None, None, {"SCIPY_GPUQR_BACKEND": "cuda"})


def test_options_validation_and_immutability():
    with pytest.raises(ValueError):
        GpuqrOptions(ordering="best-guess")
    with pytest.raises(ValueError):
        GpuqrOptions(max_gpu_memory=0)
    with pytest.raises(TypeError):
        resolve_options(42)
    opts = GpuqrOptions()
    with pytest.raises(AttributeError):
        opts.backend = "gpu"
    assert opts.replace(backend="cpu").backend == "cpu" and opts.backend is None


def test_debug_flag_from_environment():
    assert GpuqrOptions().debug_enabled({"SCIPY_GPUQR_DEBUG": "1"})
    assert not GpuqrOptions().debug_enabled({})
    assert not GpuqrOptions(debug=False).debug_enabled({"SCIPY_GPUQR_DEBUG": "1"})


def test_settings_apply_the_precedence_rule():
    env = {"SCIPY_GPUQR_BACKEND": "reference"}
    s = resolve_settings(None, {"ordering": "amd"}, env)
    assert (s.backend, s.source, s.options.ordering) == ("reference", "environment", "amd")
    assert resolve_settings("CPU", None, env) == Settings("cpu", "keyword", GpuqrOptions())
    opts = GpuqrOptions(backend="gpu")
    assert settings_for(None, opts, env) == Settings("gpu", "options", opts)
    assert settings_for(None, opts, env).options is opts
    assert resolve_settings(None, None, {}) == Settings("auto", "default", GpuqrOptions())
    with pytest.raises(TypeError):
        resolve_settings("cpu", 42, {})          # the options are read first
    with pytest.raises(ValueError, match="must be one of"):
        resolve_settings("cuda", None, {})


def test_default_settings_are_one_immutable_object_and_the_environment_is_read_each_call():
    """Calls naming nothing share one frozen Settings (no per-call construction on the
    drop-in path), yet each call still reads ``SCIPY_GPUQR_BACKEND`` afresh."""
    first = resolve_settings(None, None, {})
    assert first == Settings("auto", "default", GpuqrOptions())
    assert resolve_settings(None, None, {}) is first
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.backend = "cpu"
    env = {"SCIPY_GPUQR_BACKEND": "cpu"}
    assert resolve_settings(None, None, env) == Settings("cpu", "environment", GpuqrOptions())
    env.clear()
    assert resolve_settings(None, None, env) is first
    assert resolve_settings("auto", None, {}) == Settings("auto", "keyword", GpuqrOptions())


@pytest.mark.parametrize("call", ["lsqr", "lsqr_cpu", "lsmr", "spsolve", "qr",
                                  "QRFactorization"])
def test_one_call_resolves_its_settings_once(monkeypatch, call):
    import scipy_gpuqr
    counts = {"options": 0, "backend": 0}
    real_options, real_backend = _options.resolve_options, _options._backend_of

    def options(*a, **k):
        counts["options"] += 1
        return real_options(*a, **k)

    def backend(*a, **k):
        counts["backend"] += 1
        return real_backend(*a, **k)
    monkeypatch.setattr(_options, "resolve_options", options)
    monkeypatch.setattr(_options, "_backend_of", backend)
    rng = np.random.default_rng(0)
    A = sp.random_array((60, 30), density=0.1, rng=rng, format="csc") + \
        sp.eye_array(60, 30, format="csc")
    b = rng.standard_normal(60)
    S = sp.csc_array(A[:30] + 4 * sp.eye_array(30, format="csc"))
    if call == "lsqr":
        scipy_gpuqr.lsqr(A, b)
    elif call == "lsqr_cpu":
        scipy_gpuqr.lsqr(A, b, backend="cpu", calc_var=True)
    elif call == "lsmr":
        scipy_gpuqr.lsmr(A, b, damp=0.5)
    elif call == "spsolve":
        scipy_gpuqr.spsolve(S, b[:30])
    elif call == "qr":
        scipy_gpuqr.qr(A)
    else:
        scipy_gpuqr.QRFactorization(A, gpuqr_options={"ordering": "amd"}).solve(b)
    assert counts["options"] <= 1 and counts["backend"] <= 1, counts
