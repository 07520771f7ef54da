"""A new process's first GPU call starts the CUDA driver on a thread of its own,
beside CuPy's import (issue 16 item 4): :func:`scipy_gpuqr._gpu.start_driver`.
The CPU tests run it on a stand-in driver library; the GPU test in a new process."""

import ctypes
import subprocess
import sys
import threading

import numpy as np
import pytest

from scipy_gpuqr import _gpu
from scipy_gpuqr._factor import factored


class _FakeDriver:
    """The four driver entry points ``start_driver`` uses, recording their calls."""

    def __init__(self, current_context: int = 0, init_status: int = 0):
        self.calls = []
        self.current_context = current_context
        self.init_status = init_status
        self.release = threading.Event()

    def cuCtxGetCurrent(self, ctx):
        self.calls.append("cuCtxGetCurrent")
        ctx._obj.value = self.current_context or None
        return 0 if self.current_context else 3        # CUDA_ERROR_NOT_INITIALIZED

    def cuInit(self, flags):
        self.release.wait(5)                # the caller goes on meanwhile
        self.calls.append(("cuInit", flags))
        return self.init_status

    def cuDeviceGet(self, dev, ordinal):
        self.calls.append(("cuDeviceGet", ordinal))
        dev._obj.value = 7
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        self.calls.append(("cuDevicePrimaryCtxRetain", dev.value))
        ctx._obj.value = 1234
        return 0


@pytest.fixture
def fake_driver(monkeypatch):
    """A stand-in driver library, and a process that has started no driver thread."""
    def install(**kw):
        lib = _FakeDriver(**kw)
        monkeypatch.setattr(_gpu, "_driver_library", lambda: lib)
        return lib
    _gpu._driver_thread.cache_clear()
    yield install
    _gpu._driver_thread.cache_clear()


def test_the_driver_starts_on_a_thread_once_per_process(fake_driver):
    lib = fake_driver()
    t = _gpu.start_driver()
    assert isinstance(t, threading.Thread) and t.name == "gpuqr-driver-start" and t.daemon
    assert lib.calls == ["cuCtxGetCurrent"]         # the caller did not wait for cuInit
    assert _gpu.start_driver() is t                 # once per process
    lib.release.set()
    t.join(5)
    assert not t.is_alive()
    assert lib.calls[-3:] == [("cuInit", 0), ("cuDeviceGet", 0),
                              ("cuDevicePrimaryCtxRetain", 7)]


def test_a_thread_with_a_context_or_no_driver_starts_nothing(fake_driver, monkeypatch):
    lib = fake_driver(current_context=99)
    assert _gpu.start_driver() is None
    assert lib.calls == ["cuCtxGetCurrent"]
    monkeypatch.setattr(_gpu, "_driver_library", lambda: None)
    assert _gpu.start_driver() is None
    assert _gpu._driver_thread.cache_info().currsize == 0


def test_a_failed_cuinit_ends_the_thread_quietly(fake_driver):
    lib = fake_driver(init_status=100)              # CUDA_ERROR_NO_DEVICE
    lib.release.set()
    t = _gpu.start_driver()
    t.join(5)
    assert not t.is_alive() and lib.calls[-1] == ("cuInit", 0)


def test_a_gpu_call_starts_the_driver_before_it_imports_cupy(monkeypatch):
    """plan_for's prefetch (every GPU factorization of lsqr, lsmr, spsolve and
    QRFactorization) starts the driver before gpu_info imports CuPy."""
    order = []
    monkeypatch.setattr(factored, "start_driver", lambda: order.append("driver"))
    monkeypatch.setattr(factored, "gpu_info",
                        lambda: order.append("gpu_info") or {"available": False})
    factored.prefetch_kernels(np.float64)
    assert order == ["driver", "gpu_info"]


def test_a_direct_engine_call_starts_the_driver_before_it_imports_cupy(monkeypatch):
    """gpu_factorize called directly (no plan_for) starts the driver before gpu_info."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._errors import GpuFallbackWarning
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    order = []
    monkeypatch.setattr(driver._gpu, "start_driver", lambda: order.append("driver"))
    monkeypatch.setattr(driver._gpu, "gpu_info",
                        lambda: order.append("gpu_info") or {"available": False,
                                                             "reason": "none here"})
    with pytest.warns(GpuFallbackWarning):
        driver.gpu_factorize(grid3d_least_squares(3))
    assert order == ["driver", "gpu_info"]


def test_the_real_library_is_loaded_once_or_absent():
    lib = _gpu._driver_library()
    assert lib is _gpu._driver_library()
    assert lib is None or isinstance(lib, ctypes.CDLL)


_NEW_PROCESS = r"""
import sys, threading
import numpy as np
from scipy_gpuqr import _gpu, lsqr
from scipy_gpuqr._testing_matrices import grid3d_least_squares
A = grid3d_least_squares(6)
b = A @ np.ones(A.shape[1]) + 1e-3 * np.cos(np.arange(A.shape[0]))
x = lsqr(A, b, backend="gpu")[0]
ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
started = _gpu._driver_thread.cache_info().currsize
t = _gpu._driver_thread() if started else None
print(started, "cupy" in sys.modules, float(np.abs(x - ref).max() / np.abs(ref).max()),
      t is not None and not t.is_alive())
"""


@pytest.mark.gpu
def test_a_new_process_first_gpu_call_starts_the_driver_and_answers():
    r = subprocess.run([sys.executable, "-c", _NEW_PROCESS], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    started, cupy_imported, err, ended = r.stdout.split()
    assert started == "1" and cupy_imported == "True" and ended == "True"
    assert float(err) < 1e-10
