"""A finished call's factorization is freed when the call returns, not at Python's
next cyclic collection: its device memory (gigabytes on large problems) must not
outlive the call (issue 16: a new process's later calls planned with less memory)."""

import gc
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

import scipy_gpuqr as sg
from scipy_gpuqr import _gpu
from scipy_gpuqr._engine.gpu import driver
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._factor import factored
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares


@pytest.fixture
def numpy_gpu(monkeypatch):
    """The GPU backend's path with the NumPy device layer (no GPU, no kernels)."""
    info = {"available": True, "reason": "ok", "cupy_version": None, "device_count": 1,
            "device_id": 0, "name": "numpy stand-in", "compute_capability": "90",
            "total_memory": 80 << 30, "multiprocessors": 132,
            "shared_memory_per_block_optin": 227 << 10}
    monkeypatch.setattr(_gpu, "gpu_info", lambda: dict(info))
    monkeypatch.setattr(driver, "prefetch_engine_kernels", lambda *a, **k: [])
    monkeypatch.setattr(factored, "prefetch_engine_kernels", lambda *a, **k: [])
    monkeypatch.setattr(driver, "CupyDevice",
                        lambda tile, bundle, dtype=np.float64, debug=False:
                        NumpyDevice(tile, bundle, dtype=dtype))


def _alive(name):
    return sum(type(o).__name__ == name for o in gc.get_objects())


@pytest.mark.parametrize("which", ["grid", "chessboard"])
def test_lsqr_frees_its_factorization_on_return(numpy_gpu, which):
    """Full rank (grid) and rank-deficient (chessboard: the minimum-norm solver and
    its sparse COD factorizer): no factorization object survives the call."""
    A = sp.csc_array(grid3d_least_squares(5) if which == "grid"
                     else chessboard_boundary(3, 4, 2))
    b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    gc.collect()
    before = (_alive("GpuQR"), _alive("FactoredQR"))
    gc.disable()
    try:
        x = sg.lsqr(A, b, backend="gpu")[0]
        assert np.isfinite(x).all()
        assert (_alive("GpuQR"), _alive("FactoredQR")) == before
    finally:
        gc.enable()


def test_dropped_factorization_object_is_freed(numpy_gpu):
    A = sp.csc_array(chessboard_boundary(3, 4, 2))
    b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    gc.collect()
    before = _alive("GpuQR")
    gc.disable()
    try:
        F = sg.QRFactorization(A, backend="gpu")
        F.solve(b)
        assert _alive("GpuQR") == before + 1
        del F
        assert _alive("GpuQR") == before
    finally:
        gc.enable()


@pytest.mark.parametrize("call", ["lsqr", "lsmr", "spsolve", "qr"])
def test_public_calls_free_their_own_factorization(numpy_gpu, monkeypatch, call):
    """Every factorization a call makes for itself is freed before the call returns
    (not left to the collector: on a GPU its reference cycles hold device memory)."""
    made, freed = [], []
    orig_init, orig_free = factored.FactoredQR.__init__, factored.FactoredQR.free
    orig_gpu_free = driver.GpuQR.free

    def init(self, *a, **k):
        made.append(id(self))
        orig_init(self, *a, **k)

    def free(self):
        freed.append(id(self))
        orig_free(self)

    gpu_freed = []

    def gpu_free(self):
        gpu_freed.append(id(self))
        orig_gpu_free(self)
    monkeypatch.setattr(factored.FactoredQR, "__init__", init)
    monkeypatch.setattr(factored.FactoredQR, "free", free)
    monkeypatch.setattr(driver.GpuQR, "free", gpu_free)
    A = sp.csc_array(grid3d_least_squares(5))
    if call == "spsolve":
        A = sp.csc_array(A[:A.shape[1]])
    b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    if call == "qr":
        sg.qr(A, mode="economic", tol=None, backend="gpu")   # no rank refinement
        assert len(gpu_freed) == 1
        return
    out = getattr(sg, call)(A, b, backend="gpu")
    x = out if call == "spsolve" else out[0]
    assert np.isfinite(x).all()
    assert made and sorted(made) == sorted(set(freed))
    assert len(gpu_freed) >= 1


@pytest.mark.gpu
def test_repeated_factorizations_take_the_blocks_their_predecessor_freed():
    """CuPy's pool keeps a freed block for the stream it was allocated on: the
    device layer's streams are the thread's, so a factorization after another
    takes the blocks the first freed, and the pool does not grow by a whole
    factorization's peak per call. Layers of one GPU and other threads have
    streams of their own."""
    import threading

    import cupy as cp
    from scipy_gpuqr._engine.gpu.device import CupyDevice
    from scipy_gpuqr._symbolic import analyze
    A = grid3d_least_squares(16)
    an = analyze(A)
    pool = cp.get_default_memory_pool()
    driver.gpu_factorize(A, an).free()
    cp.cuda.Device().synchronize()
    held = pool.total_bytes()
    for _ in range(3):
        driver.gpu_factorize(A, an).free()
    cp.cuda.Device().synchronize()
    assert pool.total_bytes() <= held + (held >> 3) + (64 << 20), (held, pool.total_bytes())
    a, b = CupyDevice(32, 3), CupyDevice(32, 3)
    assert a.stream is b.stream and a.dense_streams == b.dense_streams
    assert CupyDevice(32, 3, layer=1).stream is not a.stream
    other = []
    t = threading.Thread(target=lambda: other.append(CupyDevice(32, 3).stream))
    t.start()
    t.join()
    assert other[0] is not a.stream


def _cyclic_leftovers(garbage) -> list:
    """What a cyclic collection found that a call should have freed by reference
    counting: the package's own objects, and host or device arrays held by the
    cycles (arrays are not tracked by the collector: they show as referents)."""
    def ours(o):
        return isinstance(o, np.ndarray) or type(o).__module__.startswith(("cupy", "scipy_gpuqr"))
    held = [r for o in garbage for r in gc.get_referents(o) if ours(r)]
    return [o for o in garbage if ours(o)] + held


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["known", "new"])
@pytest.mark.parametrize("which", ["grid", "chessboard"])
def test_gpu_lsqr_leaves_nothing_to_the_cyclic_collector(which, pattern):
    """On the CUDA path a finished ``lsqr`` holds nothing in reference cycles. A cycle
    there keeps R's host arrays and the factorization's device memory until Python's
    next cyclic collection: calls on large problems in a row then grow the host
    memory by R per call and plan the next factorization with less device memory
    (staged, its pools sent to the host). The NumPy device's path is checked by
    ``test_numpy_device_lsqr_leaves_nothing_to_the_cyclic_collector``; this checks
    the CuPy one. A ``new`` pattern's call makes its schedule and R's layout
    while it runs (the cold run's copiers, opened late), a ``known`` one's
    reuses them."""
    A = sp.csc_array(grid3d_least_squares(12) if which == "grid"
                     else chessboard_boundary(4, 5, 2))
    b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    sg.lsqr(A.copy(), b, backend="gpu")          # kernels, caches and pools made
    if pattern == "new":
        A = sp.csc_array(grid3d_least_squares(13) if which == "grid"
                         else chessboard_boundary(4, 6, 2))
        b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        x = sg.lsqr(A.copy(), b, backend="gpu")[0]
        assert np.isfinite(x).all()
        del x
        gc.collect()
        left = _cyclic_leftovers(gc.garbage)
        assert not left, Counter(type(o).__qualname__ for o in left).most_common(20)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.gpu
def test_gpu_dropped_factorization_object_is_freed():
    """The CUDA twin of ``test_dropped_factorization_object_is_freed``: a
    ``QRFactorization`` dropped without ``free()`` after a solve on the device is
    freed by reference counting. (Its replay executor, kept in the factorization's
    ``_replay``, holds a closure over the factorization: a cycle unless it breaks.)"""
    A = sp.csc_array(chessboard_boundary(4, 5, 2))
    b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    sg.QRFactorization(A.copy(), backend="gpu").free()
    gc.collect()
    before = _alive("GpuQR")
    gc.disable()
    try:
        F = sg.QRFactorization(A.copy(), backend="gpu")
        assert np.isfinite(F.solve(b)).all()
        assert _alive("GpuQR") == before + 1
        del F
        assert _alive("GpuQR") == before
    finally:
        gc.enable()


@pytest.mark.parametrize("which", ["grid", "chessboard"])
def test_numpy_device_lsqr_leaves_nothing_to_the_cyclic_collector(numpy_gpu, which):
    """The check above on the NumPy device's path, and the check itself: an array in
    a reference cycle is what it reports."""
    A = sp.csc_array(grid3d_least_squares(5) if which == "grid"
                     else chessboard_boundary(3, 4, 2))
    b = np.asarray(A @ np.ones(A.shape[1])) + 0.01
    sg.lsqr(A.copy(), b, backend="gpu")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        sg.lsqr(A.copy(), b, backend="gpu")
        cycle = {"R": np.ones(3)}
        cycle["self"] = cycle
        del cycle
        gc.collect()
        left = _cyclic_leftovers(gc.garbage)
        assert [o.shape for o in left] == [(3,)], [type(o) for o in left]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
