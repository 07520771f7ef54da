"""cuBLAS set up on a worker thread at a GPU call's start (issue 16, item 4).

CPU: the warm-up's calls recorded by stand-ins for CuPy and cuBLAS (every
product's operand inside its own scratch buffer, every solve's inside the two
small arrays it takes from CuPy's pool, its own stream and handle, everything
freed); GPU: it runs, beside and after solves on CuPy's handle, and the
products and solves give the same values afterwards.
"""

import sys
import threading
import types

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import blas_warmup as bw


class _Recorder:
    """CuPy's runtime, Device, Stream and cuBLAS as far as the warm-up uses them."""

    def __init__(self):
        self.calls = []
        self.live = {}
        self.handles = set()
        self.pool_bytes = []

    # runtime
    memcpyHostToDevice = 1

    def mallocAsync(self, size, stream):
        ptr = 1 << 40
        self.live[ptr] = size
        self.calls.append(("malloc", size, stream))
        return ptr

    def freeAsync(self, ptr, stream):
        self.calls.append(("free", self.live.pop(ptr), stream))

    def memsetAsync(self, ptr, value, size, stream):
        self._inside(ptr, size)

    def memcpyAsync(self, dst, src, size, kind, stream):
        self._inside(dst, size)

    def _inside(self, ptr, size):
        assert any(base <= ptr and ptr + size <= base + n for base, n in self.live.items()), \
            "outside the warm-up's buffers"

    # CuPy's pool, as the solves use it
    def empty(self, size, dtype):
        return _PoolArray(self, int(size) * np.dtype(dtype).itemsize)

    # cuBLAS
    CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
    CUBLAS_POINTER_MODE_HOST = 0
    CUBLAS_SIDE_LEFT = 0
    CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER = 0, 1
    CUBLAS_DIAG_NON_UNIT, CUBLAS_DIAG_UNIT = 0, 1

    def create(self):
        self.handles.add(7)
        return 7

    def destroy(self, h):
        self.handles.remove(h)

    def setStream(self, h, s):
        assert s == _Stream.PTR

    def setPointerMode(self, h, mode):
        pass

    def _gemm(self, isz, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        ra, ca = (m, k) if ta == self.CUBLAS_OP_N else (k, m)
        rb, cb = (k, n) if tb == self.CUBLAS_OP_N else (n, k)
        assert lda >= ra and ldb >= rb and ldc >= m
        for p, ld, cols in ((A, lda, ca), (B, ldb, cb), (C, ldc, n)):
            self._inside(p, ld * cols * isz)
        self.calls.append(("gemm", ta, tb, m, n, k))

    def dgemm(self, *a):
        self._gemm(8, *a)

    def sgemm(self, *a):
        self._gemm(4, *a)

    def _trsm(self, isz, h, side, fill, trans, diag, m, n, alpha, A, lda, B, ldb):
        assert side == self.CUBLAS_SIDE_LEFT and lda >= m and ldb >= m
        self._inside(A, lda * m * isz)
        self._inside(B, ldb * n * isz)
        self.calls.append(("trsm", m, n, fill, trans, diag))

    def dtrsm(self, *a):
        self._trsm(8, *a)

    def strsm(self, *a):
        self._trsm(4, *a)


class _PoolArray:
    """An array of CuPy's pool: its bytes count as live until it is collected."""

    _next = 1 << 44

    def __init__(self, rec, nbytes):
        ptr = _PoolArray._next
        _PoolArray._next += 1 << 30
        self.data = types.SimpleNamespace(ptr=ptr)
        self.rec = rec
        rec.live[ptr] = nbytes
        rec.pool_bytes.append(nbytes)

    def __del__(self):
        self.rec.live.pop(self.data.ptr, None)


class _Stream:
    PTR = 1234
    made = []

    def __init__(self, non_blocking=False):
        assert non_blocking, "the legacy default stream would wait for the call's work"
        self.ptr = self.PTR
        _Stream.made.append(self)

    def synchronize(self):
        pass


class _Device:
    def __init__(self, i):
        self.id = i

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()

    def no_pool(*a, **k):
        raise AssertionError("the warm-up takes only empty arrays of CuPy's pool")
    cuda = types.SimpleNamespace(runtime=rec, Device=_Device, Stream=_Stream)
    cp = types.SimpleNamespace(cuda=cuda, empty=rec.empty, zeros=no_pool,
                               get_default_memory_pool=no_pool)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.cublas = rec
    monkeypatch.setitem(sys.modules, "cupy_backends", types.ModuleType("cupy_backends"))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda", types.ModuleType("cupy_backends.cuda"))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    return rec


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_warmup_stays_in_its_buffers_and_frees_everything(recorder, dtype):
    bw.warmup(0, dtype)
    isz = np.dtype(dtype).itemsize
    gemms = [c for c in recorder.calls if c[0] == "gemm"]
    assert len(gemms) == len(bw.GEMM_SHAPES)
    solves = [c for c in recorder.calls if c[0] == "trsm"]
    assert [c[1] for c in solves] == [n for n in bw.TRSM_ORDERS for _ in range(3)]
    kinds = {c[3:] for c in solves}          # T factors' lower unit, R's upper (N and T)
    assert len(kinds) == 3
    # the solves come after every product, and only they use CuPy's pool: two
    # arrays of the largest order, given back
    assert recorder.calls.index(solves[0]) > recorder.calls.index(gemms[-1])
    assert recorder.pool_bytes == [max(bw.TRSM_ORDERS) ** 2 * isz] * 2
    assert recorder.live == {} and recorder.handles == set()
    (_, size, s), = [c for c in recorder.calls if c[0] == "malloc"]
    assert s == _Stream.PTR and size == 3 * bw.EDGE ** 2 * isz


def test_warmup_starts_once_and_fails_quietly(monkeypatch):
    ran = []

    def boom(device, dtype):
        ran.append((device, dtype, threading.current_thread().name))
        raise RuntimeError("no GPU")
    monkeypatch.setattr(bw, "warmup", boom)
    monkeypatch.setattr(bw, "driver_warmup", lambda dtype: False)
    bw.start_blas_warmup.cache_clear()
    try:
        t = bw.start_blas_warmup(0, "float64")
        assert t.daemon and t.name == "gpuqr-blas-warmup"
        assert bw.start_blas_warmup(0, "float64") is t
        t.join(30)
        assert ran == [(0, np.dtype(np.float64), "gpuqr-blas-warmup")]
        assert bw.start_blas_warmup(0, "float32") is not t
    finally:
        bw.start_blas_warmup.cache_clear()


class _DriverAndBlas:
    """The driver's and cuBLAS's entry points :func:`bw.driver_warmup` calls through
    ``ctypes``, checking every operand against the buffers allocated."""

    def __init__(self, device_status: int = 0):
        self.calls, self.live, self.handles, self.streams = [], {}, set(), set()
        self.device_status = device_status
        self.retained = 0

    @staticmethod
    def _val(x):
        x = getattr(x, "_obj", x)           # ctypes.byref(...) -> its object
        return x.value if hasattr(x, "value") else x

    def _inside(self, ptr, size):
        ptr = self._val(ptr)
        assert any(base <= ptr and ptr + size <= base + n for base, n in self.live.items()), \
            "outside the warm-up's buffers"

    # driver
    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, dev, ordinal):
        dev._obj.value = ordinal
        return self.device_status

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        self.retained += 1
        ctx._obj.value = 4321
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, dev):
        self.retained -= 1
        return 0

    def cuCtxSetCurrent(self, ctx):
        assert self._val(ctx) == 4321
        self.calls.append("current")
        return 0

    def cuStreamCreate(self, stream, flags):
        assert self._val(flags) == 1, "the legacy default stream would wait for the call's work"
        stream._obj.value = 99
        self.streams.add(99)
        return 0

    def cuStreamDestroy_v2(self, stream):
        self.streams.remove(self._val(stream))
        return 0

    def cuStreamSynchronize(self, stream):
        self.calls.append("sync")
        return 0

    def cuMemAlloc_v2(self, mem, size):
        mem._obj.value = 1 << 40
        self.live[1 << 40] = self._val(size)
        return 0

    def cuMemFree_v2(self, mem):
        self.live.pop(self._val(mem))
        return 0

    def cuMemsetD8Async(self, ptr, value, size, stream):
        self._inside(ptr, self._val(size))
        return 0

    def cuMemcpyHtoDAsync_v2(self, ptr, src, size, stream):
        self._inside(ptr, self._val(size))
        self.calls.append("eye")
        return 0

    # cuBLAS
    def cublasCreate_v2(self, handle):
        handle._obj.value = 7
        self.handles.add(7)
        return 0

    def cublasDestroy_v2(self, handle):
        self.handles.remove(self._val(handle))
        return 0

    def cublasSetStream_v2(self, handle, stream):
        assert self._val(stream) == 99
        return 0

    def _gemm(self, isz, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        ra, ca = (m, k) if ta == 0 else (k, m)
        rb, cb = (k, n) if tb == 0 else (n, k)
        assert lda >= ra and ldb >= rb and ldc >= m
        for p, ld, cols in ((A, lda, ca), (B, ldb, cb), (C, ldc, n)):
            self._inside(p, ld * cols * isz)
        self.calls.append(("gemm", isz, self._val(alpha), self._val(beta)))
        return 0

    def cublasDgemm_v2(self, *a):
        return self._gemm(8, *a)

    def cublasSgemm_v2(self, *a):
        return self._gemm(4, *a)

    def _trsm(self, isz, h, side, fill, trans, diag, m, n, alpha, A, lda, B, ldb):
        assert side == 0 and lda >= m and ldb >= m
        self._inside(A, lda * m * isz)
        self._inside(B, ldb * n * isz)
        self.calls.append(("trsm", isz, m, fill, trans, diag))
        return 0

    def cublasDtrsm_v2(self, *a):
        return self._trsm(8, *a)

    def cublasStrsm_v2(self, *a):
        return self._trsm(4, *a)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_driver_warmup_stays_in_its_buffers_and_frees_everything(dtype):
    lib = _DriverAndBlas()
    assert bw.driver_warmup(dtype, driver=lib, load_cublas=lambda: lib) is True
    isz = np.dtype(dtype).itemsize
    assert lib.calls[0] == "current"                # on device 0's primary context
    gemms = [c for c in lib.calls if c[0] == "gemm"]
    assert gemms == [("gemm", isz, 1.0, 0.0)] * len(bw.GEMM_SHAPES)
    solves = [c for c in lib.calls if c[0] == "trsm"]
    assert [c[2] for c in solves] == [n for n in bw.TRSM_ORDERS for _ in range(3)]
    assert {c[1] for c in solves} == {isz} and len({c[3:] for c in solves}) == 3
    # the identity goes in after the products and before the solves, and the
    # stream is waited for before its buffer goes
    assert lib.calls.index(gemms[-1]) < lib.calls.index("eye") < lib.calls.index(solves[0])
    assert lib.calls[-1] == "sync"
    assert lib.live == {} and lib.handles == set() and lib.streams == set()
    assert lib.retained == 0                        # the context's reference given back


def test_driver_warmup_does_nothing_without_cublas_or_a_device():
    lib = _DriverAndBlas()
    assert bw.driver_warmup("float64", driver=lib, load_cublas=lambda: None) is False
    assert lib.calls == [] and lib.retained == 0
    lib = _DriverAndBlas(device_status=100)         # CUDA_ERROR_NO_DEVICE
    assert bw.driver_warmup("float64", driver=lib, load_cublas=lambda: lib) is False
    assert lib.calls == [] and lib.live == {} and lib.retained == 0


def test_the_thread_sets_up_through_cupy_where_the_driver_cannot(monkeypatch):
    """Device 0 takes the driver's way first, CuPy's where that returns False;
    another device, CuPy's way at once."""
    ran = []
    monkeypatch.setattr(bw, "driver_warmup", lambda dtype: ran.append(("driver", dtype)) or False)
    monkeypatch.setattr(bw, "warmup", lambda device, dtype: ran.append(("cupy", device)))
    bw._quiet_warmup(0, np.dtype(np.float64))
    bw._quiet_warmup(1, np.dtype(np.float64))
    assert ran == [("driver", np.dtype(np.float64)), ("cupy", 0), ("cupy", 1)]
    ran.clear()
    monkeypatch.setattr(bw, "driver_warmup", lambda dtype: ran.append(("driver", dtype)) or True)
    bw._quiet_warmup(0, np.dtype(np.float32))
    assert ran == [("driver", np.dtype(np.float32))]


_NEW_PROCESS = r"""
import threading, numpy as np
from scipy_gpuqr import _gpu
from scipy_gpuqr._engine.gpu import blas_warmup as bw
assert _gpu.start_driver() is not None
ok = {}
t = threading.Thread(target=lambda: ok.update(driver=bw.driver_warmup("float64")))
t.start()
import cupy as cp
t.join()
a = cp.asarray(np.arange(12.0).reshape(3, 4))
assert np.allclose((a @ a.T).get(), a.get() @ a.get().T)
paths = {line.split()[-1] for line in open("/proc/self/maps") if "libcublas.so" in line}
print(ok["driver"], len(paths))
"""


@pytest.mark.gpu
def test_driver_warmup_in_a_new_process_shares_cupys_cublas():
    """In a new process, before CuPy's import: the driver's way runs, and CuPy
    then uses the same loaded cuBLAS (one file mapped) and computes right."""
    pytest.importorskip("cupy")
    import subprocess
    p = subprocess.run([sys.executable, "-c", _NEW_PROCESS], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["True", "1"]


@pytest.mark.gpu
def test_warmup_runs_on_the_gpu():
    """After, beside and before triangular solves on CuPy's handle (as a call's
    T factors and R solves run them; a warm-up ``trsm`` on memory of the
    stream-ordered allocator faulted after one), the warm-up leaves the
    context usable and the solves right."""
    cp = pytest.importorskip("cupy")
    from scipy_gpuqr._engine.gpu import array_ops as ao

    def solve_and_check(n=150):
        U = cp.asfortranarray(cp.eye(n) * 3 + cp.triu(cp.ones((n, n))))
        B = cp.asfortranarray(cp.ones((n, 4)))
        ao.trsm_left(U, n, B, n, n, 4, lower=False, trans=False, unit=False)
        assert np.allclose(U.get() @ B.get(), 1.0, rtol=0, atol=1e-12)

    solve_and_check()
    cp.cuda.Device().synchronize()
    for dt in (np.float64, np.float32):
        bw.warmup(cp.cuda.Device().id, dt)
        a = cp.arange(12, dtype=dt).reshape(3, 4)
        assert cp.allclose(a @ a.T, cp.asarray(a.get() @ a.get().T))
        solve_and_check()
    beside = threading.Thread(target=bw.warmup, args=(cp.cuda.Device().id, np.float64))
    beside.start()
    for n in (256, 32, 700):
        solve_and_check(n)
    beside.join()
    cp.cuda.Device().synchronize()
