"""Options object and the backend precedence rule (DESIGN.md section 6)."""

import pytest

from scipy_gpuqr import GpuqrOptions
from scipy_gpuqr._options import BACKENDS, resolve_backend, resolve_options


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
