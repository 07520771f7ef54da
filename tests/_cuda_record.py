"""A CPU stand-in that records the host calls of a dense front's enqueue.

:func:`install` puts a fake ``cupy`` and fake ``cupy_backends`` cuBLAS and
cuSOLVER modules in ``sys.modules`` (and a fake kernel lookup in
:mod:`~scipy_gpuqr._engine.gpu.array_ops` and the panel kernel of
:mod:`~scipy_gpuqr._engine.dense_front`), so that
:func:`~scipy_gpuqr._engine.dense_front.factorize_cupy`, the split's panel
and :class:`~scipy_gpuqr._engine.gpu.split_front.CupySplit` (devices, peer
copies) run their own code unchanged over NumPy buffers and every call they
would make into CUDA, cuBLAS, cuSOLVER or a kernel is appended to
:attr:`Recorder.calls` instead: ``(name, args)``. Nothing is computed (the
buffers are uninitialized); what is checked is which calls a front makes and
how many. Pointers in the arguments are written as ``(allocation, offset)``
(allocations numbered in order) and host scalars by their value, so that two
runs' arithmetic calls compare equal when they are the same calls on the
same operands. CuPy's cuBLAS wrappers set the handle's stream before every
call; the stand-ins record that ``cublasSetStream`` too.
"""

from __future__ import annotations

import ctypes
import sys
from types import ModuleType, SimpleNamespace

import numpy as np

#: Calls that only set a handle's state or order streams (no arithmetic).
STATE_CALLS = ("cublasSetStream", "cublasGetPointerMode", "cublasSetPointerMode",
               "cusolverSetStream", "cudaEventCreate", "cudaEventRecord",
               "cudaStreamWaitEvent", "cuFuncGetAttribute", "cuFuncSetAttribute")


def _addr(a) -> int:
    return int(a.__array_interface__["data"][0])


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, p):
        self.ptr = p


class DevArray(np.ndarray):
    """A NumPy array standing for a device array (``.data.ptr``: its address);
    ``fill`` and ``@`` are recorded as the calls CuPy makes for them."""

    rec = None

    @property
    def data(self):
        return _Ptr(_addr(self))

    def fill(self, value):
        DevArray.rec.add("cudaMemsetAsync" if value == 0 else "fill_kernel", self)

    def __matmul__(self, other):
        rec = DevArray.rec
        rec.add("cublasSetStream")          # CuPy's wrapper sets its handle's stream
        rec.add("cupy_matmul", self.shape, self.strides, other.shape, other.strides,
                rec.norm(_addr(self)), rec.norm(_addr(other)))
        return rec.alloc((self.shape[0], other.shape[1]), self.dtype)


class Recorder:
    """The calls made, the allocations (their addresses name pointers), streams."""

    def __init__(self):
        self.calls = []
        self.allocs = []
        self.current = None
        self.null = FakeStream(self, "null")
        #: only the calls' names (no pointer lookups): for timing the caller's Python
        self.quiet = False
        self.device = 0

    def alloc(self, shape, dtype):
        base = np.empty(shape, dtype=dtype)         # nothing is computed in it
        self.allocs.append(base)
        return base.view(DevArray)

    def norm(self, p):
        """``(allocation number, byte offset)`` of a device pointer, else the value."""
        if self.quiet:
            return p
        for i, base in enumerate(self.allocs):
            a = _addr(base)
            if a <= p < a + max(base.nbytes, 1):
                return ("dev", i, p - a)
        return ("host", p)

    def add(self, name, *args):
        self.calls.append((name, () if self.quiet else args))

    def count(self, names=None) -> int:
        return sum(1 for n, _ in self.calls if names is None or n in names)

    def arithmetic(self) -> list:
        """The calls that are not :data:`STATE_CALLS`."""
        return [c for c in self.calls if c[0] not in STATE_CALLS]

    def stream(self):
        return self.current if self.current is not None else self.null


class FakeStream:
    _next = 0x1000

    def __init__(self, rec, name=None):
        FakeStream._next += 16
        self.ptr = FakeStream._next
        self.rec = rec
        self.name = name
        self._prev = []

    def __enter__(self):
        self._prev.append(self.rec.current)
        self.rec.current = self
        return self

    def __exit__(self, *exc):
        self.rec.current = self._prev.pop()
        return False

    def record(self, event=None):
        ev = FakeEvent(self.rec) if event is None else event
        ev.record(self)
        return ev

    def wait_event(self, ev):
        self.rec.add("cudaStreamWaitEvent", self.ptr)

    def synchronize(self):
        self.rec.add("cudaStreamSynchronize", self.ptr)


class FakeEvent:
    def __init__(self, rec, disable_timing=True):
        self.rec = rec
        rec.add("cudaEventCreate")

    def record(self, stream=None):
        self.rec.add("cudaEventRecord", (stream or self.rec.stream()).ptr)


class FakeFunction:
    """A kernel: a launch records its grid, block, shared memory and arguments;
    ``max_dynamic_shared_size_bytes`` is a driver attribute (recorded)."""

    def __init__(self, rec, name):
        self.rec, self.name = rec, name
        self._smem = 48 * 1024

    @property
    def max_dynamic_shared_size_bytes(self):
        self.rec.add("cuFuncGetAttribute", self.name)
        return self._smem

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, v):
        self.rec.add("cuFuncSetAttribute", self.name, int(v))
        self._smem = int(v)

    def __call__(self, grid, block, args, shared_mem=0):
        rec = self.rec
        out = []
        for a in args:
            if isinstance(a, np.ndarray):
                out.append(rec.norm(_addr(a)))
            elif isinstance(a, np.integer) and int(a) > 1 << 32:
                out.append(rec.norm(int(a)))
            else:
                out.append(int(a) if isinstance(a, np.integer) else a)
        rec.add("launch:" + self.name, tuple(grid), tuple(block), int(shared_mem), tuple(out))


def _blas_module(rec):
    m = ModuleType("cupy_backends.cuda.libs.cublas")
    m.CUBLAS_OP_N, m.CUBLAS_OP_T = 0, 1
    m.CUBLAS_POINTER_MODE_HOST, m.CUBLAS_POINTER_MODE_DEVICE = 0, 1
    m.CUBLAS_SIDE_LEFT, m.CUBLAS_FILL_MODE_LOWER, m.CUBLAS_FILL_MODE_UPPER = 0, 0, 1
    m.CUBLAS_DIAG_NON_UNIT, m.CUBLAS_DIAG_UNIT = 0, 1
    mode = {}

    def value(p, dt):
        ctype = ctypes.c_double if dt == np.float64 else ctypes.c_float
        return float(ctype.from_address(p).value)

    def gemm(dt):
        def f(h, ta, tb, m_, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
            rec.add("cublasSetStream")      # CuPy's wrapper: the current stream, each call
            assert mode.get(h, 0) == 0, "a GEMM with host scalars in device pointer mode"
            rec.add(f"cublas{dt.char}gemm", h, ta, tb, m_, n, k, value(alpha, dt), rec.norm(A),
                    lda, rec.norm(B), ldb, value(beta, dt), rec.norm(C), ldc,
                    rec.stream().ptr)
        return f

    def trsm(dt):
        def f(h, side, uplo, trans, diag, m_, n, alpha, A, lda, B, ldb):
            rec.add("cublasSetStream")
            assert mode.get(h, 0) == 0, "a trsm with host scalars in device pointer mode"
            rec.add(f"cublas{dt.char}trsm", h, side, uplo, trans, diag, m_, n,
                    value(alpha, dt), rec.norm(A), lda, rec.norm(B), ldb, rec.stream().ptr)
        return f

    m.dgemm, m.sgemm = gemm(np.dtype("d")), gemm(np.dtype("f"))
    m.dtrsm, m.strsm = trsm(np.dtype("d")), trsm(np.dtype("f"))
    m.setStream = lambda h, s: rec.add("cublasSetStream", h, s)

    def get_mode(h):
        rec.add("cublasGetPointerMode", h)
        return mode.get(h, 0)

    def set_mode(h, v):
        rec.add("cublasSetPointerMode", h, v)
        mode[h] = v
    m.getPointerMode, m.setPointerMode = get_mode, set_mode
    m.create = lambda: rec.add("cublasCreate") or (0x7000 + len(rec.calls))
    m.destroy = lambda h: rec.add("cublasDestroy", h)
    m.mode = mode
    return m


def _solver_module(rec):
    m = ModuleType("cupy_backends.cuda.libs.cusolver")
    m.setStream = lambda h, s: rec.add("cusolverSetStream", h, s)
    m.dgeqrf_bufferSize = m.sgeqrf_bufferSize = lambda *a: 64
    m.dgeqrf = m.sgeqrf = lambda *a: rec.add("cusolverGeqrf", rec.stream().ptr,
                                             *[rec.norm(x) for x in a[3:]])
    return m


def install(monkeypatch, panel_sms: int = 132, smem_limit: int = 227 * 1024) -> Recorder:
    """Fake CuPy, cuBLAS, cuSOLVER and kernels for the dense front's modules;
    returns the :class:`Recorder` (``panel_sms``/``smem_limit``: the panel
    kernel's device)."""
    from scipy_gpuqr._engine import dense_front
    from scipy_gpuqr._engine.gpu import array_ops, dense_panel

    rec = Recorder()
    DevArray.rec = rec
    blas, solver = _blas_module(rec), _solver_module(rec)

    def zeros(shape, dtype=np.float64):
        a = rec.alloc(shape, dtype)
        rec.add("cudaMemsetAsync", rec.norm(_addr(a)))
        return a

    def empty(shape, dtype=np.float64, order="C"):
        return rec.alloc(shape, dtype)

    device = SimpleNamespace(get_cublas_handle=lambda: 0x11,
                             get_cusolver_handle=lambda: 0x22)

    class Device:
        """``with Device(i):`` (CuPy: ``cudaGetDevice``, then ``cudaSetDevice`` in and
        out where ``i`` is another device)."""

        def __init__(self, i=None):
            self.id = rec.device if i is None else int(i)
            self._prev = []

        def __enter__(self):
            rec.add("cudaGetDevice")
            self._prev.append(rec.device)
            if self.id != rec.device:
                rec.add("cudaSetDevice", self.id)
                rec.device = self.id
            return self

        def __exit__(self, *exc):
            prev = self._prev.pop()
            if prev != rec.device:
                rec.add("cudaSetDevice", prev)
                rec.device = prev
            return False

        def synchronize(self):
            rec.add("cudaDeviceSynchronize")

    class CUDARuntimeError(RuntimeError):
        pass

    runtime = SimpleNamespace(
        getDevice=lambda: rec.device, CUDARuntimeError=CUDARuntimeError,
        memcpy2DAsync=lambda *a: rec.add("cudaMemcpy2DAsync", *[rec.norm(x) for x in a]),
        memcpyAsync=lambda *a: rec.add("cudaMemcpyAsync", *[rec.norm(x) for x in a]),
        deviceCanAccessPeer=lambda a, b: True, _deviceEnsurePeerAccess=lambda b: None)
    cuda = SimpleNamespace(
        Stream=lambda non_blocking=True, priority=0: FakeStream(rec),
        Event=lambda disable_timing=True: FakeEvent(rec, disable_timing),
        get_current_stream=rec.stream, device=device, runtime=runtime, Device=Device,
        memory=SimpleNamespace(OutOfMemoryError=MemoryError),
        get_elapsed_time=lambda a, b: 1.0)
    cp = ModuleType("cupy")
    cp.cuda, cp.zeros, cp.empty, cp.float64, cp.float32 = cuda, zeros, empty, np.float64, np.float32
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cublas", blas)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cusolver", solver)
    libs = ModuleType("cupy_backends.cuda.libs")
    libs.cublas, libs.cusolver = blas, solver
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)

    kernels = {}

    def fn(name):
        if name not in kernels:
            kernels[name] = FakeFunction(rec, name)
        return kernels[name]
    monkeypatch.setattr(array_ops, "_fn", fn)

    made = {}

    def panel_kernel(dtype, max_blocks=None):
        dt = np.dtype(dtype)
        if dt.name not in made:
            k = dense_panel.PanelKernel.__new__(dense_panel.PanelKernel)
            k.cp, k.dtype = cp, dt
            k.fn = FakeFunction(rec, dense_panel.panel_kernel_name(dt))
            k.sms, k.smem_limit = panel_sms, smem_limit
            k.blocks = panel_sms
            init = getattr(k, "_init_caches", None)
            if init is not None:
                init()
            made[dt.name] = k
        return made[dt.name]
    monkeypatch.setattr(dense_front, "panel_kernel", panel_kernel)
    rec.blas = blas
    return rec
