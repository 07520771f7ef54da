"""cuBLAS set up on a worker thread at a GPU call's start (issue 16, item 4).

CPU: the warm-up's calls recorded by stand-ins for CuPy and cuBLAS (every
operand inside its own scratch buffer, its own stream and handle, everything
freed, CuPy's pool untouched); GPU: it runs and the products it warmed give
the same values afterwards.
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
        (base, n), = self.live.items()
        assert base <= ptr and ptr + size <= base + n, "outside the scratch buffer"

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
        self._inside(A, lda * m * isz)
        self._inside(B, ldb * n * isz)
        self.calls.append(("trsm", m, n))

    def dtrsm(self, *a):
        self._trsm(8, *a)

    def strsm(self, *a):
        self._trsm(4, *a)


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
        raise AssertionError("the warm-up must not use CuPy's memory pool")
    cuda = types.SimpleNamespace(runtime=rec, Device=_Device, Stream=_Stream)
    cp = types.SimpleNamespace(cuda=cuda, empty=no_pool, zeros=no_pool,
                               get_default_memory_pool=no_pool)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.cublas = rec
    monkeypatch.setitem(sys.modules, "cupy_backends", types.ModuleType("cupy_backends"))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda", types.ModuleType("cupy_backends.cuda"))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    return rec


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_warmup_stays_in_its_buffer_and_frees_everything(recorder, dtype):
    bw.warmup(0, dtype)
    gemms = [c for c in recorder.calls if c[0] == "gemm"]
    assert len(gemms) == len(bw.GEMM_SHAPES)
    assert not [c for c in recorder.calls if c[0] == "trsm"]      # see the module's notes
    assert recorder.live == {} and recorder.handles == set()
    (_, size, s), = [c for c in recorder.calls if c[0] == "malloc"]
    assert s == _Stream.PTR and size == 3 * bw.EDGE ** 2 * np.dtype(dtype).itemsize


def test_warmup_starts_once_and_fails_quietly(monkeypatch):
    ran = []

    def boom(device, dtype):
        ran.append((device, dtype, threading.current_thread().name))
        raise RuntimeError("no GPU")
    monkeypatch.setattr(bw, "warmup", boom)
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


@pytest.mark.gpu
def test_warmup_runs_on_the_gpu():
    """After a triangular solve on CuPy's handle (as a call's R solves do; a
    warm-up ``trsm`` on its own handle then faulted), the warm-up leaves the
    context usable."""
    cp = pytest.importorskip("cupy")
    from scipy_gpuqr._engine.gpu import array_ops as ao
    U = cp.asfortranarray(cp.eye(150) * 3 + cp.triu(cp.ones((150, 150))))
    B = cp.asfortranarray(cp.ones((150, 4)))
    ao.trsm_left(U, 150, B, 150, 150, 4, lower=False, trans=False, unit=False)
    cp.cuda.Device().synchronize()
    for dt in (np.float64, np.float32):
        bw.warmup(cp.cuda.Device().id, dt)
        a = cp.arange(12, dtype=dt).reshape(3, 4)
        assert cp.allclose(a @ a.T, cp.asarray(a.get() @ a.get().T))
