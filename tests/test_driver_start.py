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


def test_gpu_info_waits_for_the_driver_thread_before_cupy_asks_for_devices(fake_driver,
                                                                         monkeypatch):
    """CuPy's runtime calls hold the GIL: gpu_info joins the driver thread first (a
    wait without the GIL), so cudaGetDeviceCount never blocks behind its cuInit."""
    import types
    lib = fake_driver()
    t = _gpu.start_driver()
    order = []

    class _Runtime:
        @staticmethod
        def getDeviceCount():
            order.append(("count", t.is_alive()))
            return 0
    cp = types.SimpleNamespace(__version__="0", cuda=types.SimpleNamespace(runtime=_Runtime))
    monkeypatch.setattr(_gpu, "import_cupy", lambda: cp)
    waiter = threading.Thread(target=lambda: order.append(("info", _gpu.gpu_info())))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and order == []       # waiting for cuInit, CuPy not asked
    spins = sum(1 for _ in range(10000))            # this thread runs meanwhile (no GIL held)
    assert spins == 10000
    lib.release.set()
    waiter.join(5)
    assert order[0] == ("count", False) and order[1][1]["reason"].startswith("no GPU found")


def test_wait_for_driver_returns_at_once_where_none_was_started(fake_driver):
    fake_driver()
    assert _gpu._driver_thread.cache_info().currsize == 0
    _gpu.wait_for_driver()                          # nothing started: nothing to wait for
    assert _gpu._driver_thread.cache_info().currsize == 0


def test_a_new_process_prefetches_beside_its_analysis(monkeypatch):
    """Where the driver is starting (a thread without a context), the GPU lookup and
    the kernels' prefetch run on a thread of their own: plan_for's caller goes on
    with the analysis instead of waiting for CUDA's start."""
    release = threading.Event()
    seen = []

    def info():
        release.wait(5)
        seen.append(threading.current_thread().name)
        return {"available": True}
    monkeypatch.setattr(factored, "start_driver", lambda: threading.current_thread())
    monkeypatch.setattr(factored, "gpu_info", info)
    monkeypatch.setattr(factored, "prefetch_engine_kernels",
                        lambda value: seen.append(np.dtype(value).name))
    factored.prefetch_kernels(np.float64)           # returns while the lookup waits
    assert seen == []
    release.set()
    for t in threading.enumerate():
        if t.name == "gpuqr-gpu-prefetch":
            t.join(5)
    assert seen == ["gpuqr-gpu-prefetch", "float64"]


def test_plan_for_starts_the_layout_load_once_the_analysis_is_made(monkeypatch):
    from scipy_gpuqr._options import resolve_settings
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    from scipy_gpuqr._validate import as_matrix
    calls = []
    monkeypatch.setattr(factored, "prefetch_kernels", lambda dtype: calls.append("prefetch"))
    monkeypatch.setattr(factored, "start_layout_load", lambda an: calls.append(an))
    M, plan = factored.plan_for(as_matrix(grid3d_least_squares(4)), resolve_settings("gpu", None))
    assert plan.backend == "gpu" and calls == ["prefetch", plan.analysis]
    calls.clear()
    factored.plan_for(as_matrix(grid3d_least_squares(4)), resolve_settings("cpu", None))
    assert calls == []


def test_one_layout_load_per_analysis_at_a_time(monkeypatch):
    """plan_for and gpu_factorize both ask for R's layout from disk: the second call
    while the load runs gets its future; a finished load leaves the table."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    an = analyze(grid3d_least_squares(4))
    release = threading.Event()
    loads = []

    def load(analysis):
        loads.append(analysis)
        release.wait(5)
        return None
    monkeypatch.setattr(driver, "_load_stored_layout", load)
    monkeypatch.setattr(driver, "r_layout_cached", lambda analysis: None)
    f1 = driver.start_layout_load(an)
    f2 = driver.start_layout_load(an)
    assert f1 is f2
    release.set()
    assert f1.result(5) is None and loads == [an]
    assert an not in driver._LAYOUT_LOADS
    f3 = driver.start_layout_load(an)               # a new call: a new load
    assert f3 is not f1 and f3.result(5) is None and len(loads) == 2


def test_a_layout_loaded_before_the_call_asked_makes_a_warm_run(monkeypatch):
    """A load that ended before gpu_factorize looked (its future gone, its layout in
    the cache) still makes a one-stage cold schedule's run warm: records materialized."""
    from scipy_gpuqr._engine.gpu import driver

    class _Sched:
        made = 0

        def materialize(self):
            self.made += 1
    s = _Sched()
    monkeypatch.setattr(driver, "r_layout_cached", lambda analysis: "layout")
    assert driver._warm_from_disk(None, s, "analysis") and s.made == 1
    monkeypatch.setattr(driver, "r_layout_cached", lambda analysis: None)
    assert not driver._warm_from_disk(None, s, "analysis") and s.made == 1


def test_start_gpu_starts_the_driver_and_returns_at_once(fake_driver, monkeypatch):
    """The public start: the driver's thread and the prefetch's, the caller not waiting
    for cuInit; a later call finds both started (nothing done twice)."""
    import scipy_gpuqr
    lib = fake_driver()
    seen = []

    def info():
        _gpu.wait_for_driver()
        return {"available": True}
    monkeypatch.setattr(factored, "gpu_info", info)
    monkeypatch.setattr(factored, "prefetch_engine_kernels",
                        lambda value: seen.append(np.dtype(value).name))
    assert scipy_gpuqr.start_gpu() is None
    assert "start_gpu" in scipy_gpuqr.__all__
    assert lib.calls == ["cuCtxGetCurrent", "cuCtxGetCurrent"]      # cuInit still held
    t = _gpu._driver_thread()
    assert t.is_alive()
    scipy_gpuqr.start_gpu(np.float32)
    assert _gpu._driver_thread() is t               # one driver thread per process
    lib.release.set()
    for th in threading.enumerate():
        if th.name in ("gpuqr-gpu-prefetch", "gpuqr-driver-start"):
            th.join(5)
    assert sorted(seen) == ["float32", "float64"]
    assert lib.calls.count(("cuInit", 0)) == 1


def test_start_gpu_without_a_driver_does_nothing(monkeypatch):
    import scipy_gpuqr
    monkeypatch.setattr(_gpu, "_driver_library", lambda: None)
    monkeypatch.setattr(factored, "gpu_info", lambda: {"available": False})
    _gpu._driver_thread.cache_clear()
    scipy_gpuqr.start_gpu()
    assert _gpu._driver_thread.cache_info().currsize == 0


def test_gpu_info_without_a_driver_library_does_not_import_cupy(monkeypatch):
    """Where no CUDA driver library loads, ``gpu_info`` says so without importing
    CuPy (a CPU-only host with CuPy installed would pay its import, a few hundred
    ms, at the first call that asks); with a driver, CuPy is asked."""
    imported = []
    monkeypatch.setattr(_gpu, "import_cupy", lambda: imported.append("cupy"))
    monkeypatch.setattr(_gpu, "_driver_library", lambda: None)
    info = _gpu.gpu_info()
    assert not info["available"] and "no CUDA driver" in info["reason"]
    assert imported == [] and not _gpu.gpu_available()
    monkeypatch.setattr(_gpu, "_driver_library", lambda: _FakeDriver())
    assert not _gpu.gpu_info()["available"] and imported == ["cupy"]


def test_a_cpu_host_call_that_asks_for_a_gpu_does_not_import_cupy():
    """A new process on a host without a CUDA driver: ``gpu_available`` answers,
    and CuPy stays unimported."""
    if _gpu._driver_library() is not None:
        pytest.skip("this host has a CUDA driver")
    code = ("import sys\nfrom scipy_gpuqr._gpu import gpu_available\n"
            "assert not gpu_available()\nprint('cupy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "False"
