"""A CPU stand-in for the CUDA calls of :class:`~scipy_gpuqr._engine.gpu.split_front.CupySplit`.

The backend's own code runs unchanged over a fake ``cupy`` module: its
arrays are NumPy arrays (``.data.ptr`` their real addresses, so the
backend's pointer arithmetic and 2-D copies work as written), its streams,
events and ``wait_event`` build a graph of *tasks* (one per copy, GEMM
update, panel, memset) with the bytes each reads and writes. The panel and
the GEMM updates are replaced by NumPy stand-ins doing the arithmetic of
:class:`~scipy_gpuqr._engine.split_front.NumpySplit` on the same memory, a
cuBLAS GEMM on the stream its handle was given (lean handles) or on the
current stream (the thread's handle), as CUDA would run them. Each cuBLAS
handle (a lean one, a a ``_Work``'s own, the thread's of each device)
has a few bytes standing for its workspace, written by every GEMM through
it: one handle's GEMMs on two streams at once show as a race.

Then :meth:`Sim.races` lists every pair of tasks on different streams that
touch the same bytes (one writing) with no event ordering them, and
:meth:`Sim.run` executes the tasks in any order the streams and events
allow (enqueue order, or a random one): with a race, some order gives
another answer. ``cp.empty`` fills with NaN, so a read of memory nobody
wrote shows. The current device and stream are per thread (as CUDA's and
CuPy's), so a backend whose devices' calls are enqueued by threads of their
own runs over it too.
"""

from __future__ import annotations

import random
import threading

import numpy as np
from scipy.linalg import get_lapack_funcs, solve_triangular

from scipy_gpuqr._engine.dense_front import _t_factor


def _addr(a) -> int:
    return int(a.__array_interface__["data"][0])


class _Ptr:
    def __init__(self, p):
        self.ptr = p


class DevArray(np.ndarray):
    """A NumPy array standing for a device array (``.data.ptr``: its address)."""

    @property
    def data(self):
        return _Ptr(_addr(self))

    def get(self):
        return np.array(self)


class Region:
    """Bytes ``start + i*pitch + [0, width)`` for ``i < height``."""

    def __init__(self, start, pitch, width, height):
        self.start, self.pitch, self.width, self.height = (int(start), int(pitch), int(width),
                                                           int(height))

    def intervals(self):
        if self.height <= 0 or self.width <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        s = self.start + self.pitch * np.arange(self.height, dtype=np.int64)
        return s, s + self.width


def _overlap(a: Region, b: Region) -> bool:
    sa, ea = a.intervals()
    sb, eb = b.intervals()
    if not len(sa) or not len(sb) or ea.max() <= sb.min() or eb.max() <= sa.min():
        return False
    i = np.searchsorted(sb, ea, side="left") - 1
    ok = i >= 0
    return bool(np.any(eb[i[ok]] > sa[ok]))


def matrix_region(ptr, ld, rows, cols, isz=8) -> Region:
    """A row-major ``rows × cols`` block at ``ptr`` with leading dimension ``ld``."""
    return Region(ptr, ld * isz, cols * isz, rows)


def array_region(a) -> Region:
    a = np.asarray(a)
    if a.flags.c_contiguous:
        return Region(_addr(a), 0, a.nbytes, 1)
    if a.ndim == 2 and a.strides[1] == a.itemsize:
        return Region(_addr(a), a.strides[0], a.shape[1] * a.itemsize, a.shape[0])
    raise ValueError("region of an array neither contiguous nor row-strided")


class Task:
    def __init__(self, tid, stream, deps, reads, writes, fn, label):
        self.id, self.stream, self.deps = tid, stream, deps
        self.reads, self.writes, self.fn, self.label = reads, writes, fn, label


class Sim:
    """The task graph of one run (see the module notes)."""

    def __init__(self):
        self.tasks = []
        self.allocs = []            # base arrays (kept alive: their addresses are pointers)
        self.streams = {}           # ptr -> stream
        self.null = None
        self._lock = threading.Lock()       # tasks added by several threads
        self._here = threading.local()      # per thread, as CUDA's and CuPy's

    @property
    def current(self):
        """The calling thread's current stream (None: the legacy default stream)."""
        return getattr(self._here, "current", None)

    @current.setter
    def current(self, s):
        self._here.current = s

    @property
    def device(self):
        """The calling thread's current device."""
        return getattr(self._here, "device", 0)

    @device.setter
    def device(self, d):
        self._here.device = d

    # -- memory --------------------------------------------------------------------------
    def view(self, ptr, shape, strides, dtype=np.float64):
        """A NumPy view of the bytes at ``ptr`` (inside one allocation; raises past its end)."""
        for base in self.allocs:
            a = _addr(base)
            if a <= ptr < a + base.nbytes:
                isz = np.dtype(dtype).itemsize
                off = ptr - a
                last = off + sum((n - 1) * s for n, s in zip(shape, strides)) + isz
                if min(shape) > 0 and last > base.nbytes:
                    raise ValueError(f"a view of {shape} past its allocation's end")
                raw = base.reshape(-1).view(np.uint8)[off:last]
                return np.lib.stride_tricks.as_strided(raw.view(dtype), shape=shape,
                                                       strides=strides, writeable=True)
        raise ValueError(f"pointer {ptr:#x} in no allocation")

    def alloc(self, shape, dtype, fill):
        base = np.full(shape, fill, dtype=dtype)
        self.allocs.append(base)
        return base.view(DevArray)

    # -- tasks ---------------------------------------------------------------------------
    def stream_of(self, s):
        return s if s is not None else self.null_stream()

    def null_stream(self):
        if self.null is None:
            self.null = FakeStream(self, name="null")
        return self.null

    def task(self, stream, reads, writes, fn, label):
        stream = self.stream_of(stream)
        with self._lock:
            t = Task(len(self.tasks), stream, set(stream.frontier), list(reads),
                     list(writes), fn, label)
            self.tasks.append(t)
            stream.frontier = {t.id}
        return t

    def _reach(self):
        reach = []
        for t in self.tasks:
            r = 0
            for d in t.deps:
                r |= reach[d] | (1 << d)
            reach.append(r)
        return reach

    def races(self, limit=20):
        """Pairs of unordered tasks on different streams touching the same bytes, one
        writing: ``(task a, task b, what)``."""
        reach = self._reach()
        out = []
        n = len(self.tasks)
        for b in range(n):
            tb = self.tasks[b]
            for a in range(b):
                if (reach[b] >> a) & 1:
                    continue
                ta = self.tasks[a]
                hit = None
                for wa in ta.writes:
                    if any(_overlap(wa, x) for x in tb.writes + tb.reads):
                        hit = "write/other"
                        break
                if hit is None:
                    for wb in tb.writes:
                        if any(_overlap(wb, x) for x in ta.reads):
                            hit = "read/write"
                            break
                if hit is not None:
                    out.append((ta, tb, hit))
                    if len(out) >= limit:
                        return out
        return out

    def run(self, seed=None, key=None):
        """Execute every task in an order the graph allows: enqueue order, a random
        one (``seed``), or the ready task of least ``key(task)`` first."""
        n = len(self.tasks)
        indeg = [len(t.deps) for t in self.tasks]
        succ = [[] for _ in range(n)]
        for t in self.tasks:
            for d in t.deps:
                succ[d].append(t.id)
        ready = [t.id for t in self.tasks if not t.deps]
        rng = random.Random(seed)
        done = 0
        while ready:
            if key is not None:
                k = min(range(len(ready)), key=lambda i: key(self.tasks[ready[i]]))
            elif seed is None:
                k = min(range(len(ready)), key=ready.__getitem__)
            else:
                k = rng.randrange(len(ready))
            tid = ready.pop(k)
            self.tasks[tid].fn()
            done += 1
            for s in succ[tid]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        assert done == n, "a cycle in the task graph"


class FakeStream:
    _next = 0x1000

    def __init__(self, sim, non_blocking=True, priority=0, name=None):
        self.sim = sim
        FakeStream._next += 16
        self.ptr = FakeStream._next
        self.frontier = set()
        self.name = name or f"s{self.ptr:#x}@{sim.device}"
        self.device = sim.device
        sim.streams[self.ptr] = self
        self._prev = []

    def wait_event(self, ev):
        self.frontier = set(self.frontier) | set(ev.frontier)

    def __enter__(self):
        self._prev.append(self.sim.current)
        self.sim.current = self
        return self

    def __exit__(self, *exc):
        self.sim.current = self._prev.pop()
        return False

    def synchronize(self):
        pass


class FakeEvent:
    def __init__(self, sim, disable_timing=False):
        self.sim = sim
        self.frontier = set()

    def record(self, stream=None):
        self.frontier = set(self.sim.stream_of(stream).frontier)


def fake_cupy(sim: Sim):
    """A module-like object with what CupySplit uses of CuPy."""
    from types import SimpleNamespace

    class Device:
        def __init__(self, i=None):
            self.id = sim.device if i is None else int(i)
            self._prev = []

        def __enter__(self):
            self._prev.append(sim.device)
            sim.device = self.id
            return self

        def __exit__(self, *exc):
            sim.device = self._prev.pop()
            return False

        def synchronize(self):
            pass

    class CUDARuntimeError(RuntimeError):
        pass

    def memcpy2d(dst, dpitch, src, spitch, width, height, kind, sptr):
        s = sim.streams[sptr]
        rs, rd = Region(src, spitch, width, height), Region(dst, dpitch, width, height)

        def fn():
            a = sim.view(src, (height, width), (spitch, 1), np.uint8)
            b = sim.view(dst, (height, width), (dpitch, 1), np.uint8)
            b[...] = a
        sim.task(s, [rs], [rd], fn, f"copy2d {height}x{width // 8}")

    def memcpy(dst, src, n, kind, sptr):
        s = sim.streams[sptr]

        def fn():
            sim.view(dst, (n,), (1,), np.uint8)[...] = sim.view(src, (n,), (1,), np.uint8)
        sim.task(s, [Region(src, 0, n, 1)], [Region(dst, 0, n, 1)], fn, f"copy {n // 8}")

    def zeros(shape, dtype=np.float64):
        a = sim.alloc(shape, dtype, 0)
        sim.task(sim.current, [], [array_region(a)], lambda: a.fill(0), "memset")
        return a

    def empty(shape, dtype=np.float64):
        return sim.alloc(shape, dtype, np.nan if np.dtype(dtype).kind == "f" else 0)

    runtime = SimpleNamespace(
        memcpy2DAsync=memcpy2d, memcpyAsync=memcpy, CUDARuntimeError=CUDARuntimeError,
        deviceCanAccessPeer=lambda a, b: True, _deviceEnsurePeerAccess=lambda b: None)
    cuda = SimpleNamespace(
        Device=Device, runtime=runtime,
        Stream=lambda non_blocking=True, priority=0: FakeStream(sim, non_blocking, priority),
        Event=lambda disable_timing=False: FakeEvent(sim, disable_timing),
        get_elapsed_time=lambda a, b: 1.0,
        memory=SimpleNamespace(OutOfMemoryError=MemoryError),
        get_current_stream=lambda: sim.stream_of(sim.current))
    return SimpleNamespace(cuda=cuda, zeros=zeros, empty=empty, float64=np.float64)


# -- the arithmetic stand-ins ----------------------------------------------------------------

def _update(sim, C_ptr, ldc, nc, rows, b, V_ptr, ldv, T_ptr, ldt, W_ptr, W2_ptr, handle_ws):
    """Task body and regions of ``C ← C - V Tᵀ (Vᵀ C)`` (``C`` row-major rows × nc at
    ``C_ptr``; ``V`` column-major rows × b = ``Vᵀ`` row-major b × ldv; ``T`` row-major)."""
    isz = 8

    def fn():
        C = sim.view(C_ptr, (rows, nc), (ldc * isz, isz))
        Vt = sim.view(V_ptr, (b, rows), (ldv * isz, isz))
        T = sim.view(T_ptr, (b, b), (ldt * isz, isz))
        V = np.ascontiguousarray(Vt.T)
        Tp = np.ascontiguousarray(T)
        C -= V @ (Tp.T @ (V.T @ C))
    reads = [matrix_region(V_ptr, ldv, b, rows), matrix_region(T_ptr, ldt, b, b),
             matrix_region(C_ptr, ldc, rows, nc)]
    writes = [matrix_region(C_ptr, ldc, rows, nc), Region(W_ptr, 0, nc * b * isz, 1),
              Region(W2_ptr, 0, nc * b * isz, 1)]
    if handle_ws is not None:
        writes.append(handle_ws)
    return fn, reads, writes


class _Handle:
    """A cuBLAS handle's workspace (a few bytes standing for it): GEMMs through one
    handle on two streams at once share it."""

    def __init__(self, sim):
        self.ws = sim.alloc((4,), np.float64, 0)
        self.region = array_region(self.ws)


def install(sim: Sim, monkeypatch, model_handle_workspace: bool = True):
    """The stand-ins for the panel, the GEMMs and cuBLAS handles in the backend's module."""
    from scipy_gpuqr._engine.gpu import split_front as mod
    thread_handles = {}

    def thread_handle():
        if sim.device not in thread_handles:
            thread_handles[sim.device] = _Handle(sim)
        h = thread_handles[sim.device]
        return h.region if model_handle_workspace else None

    class Work:
        def __init__(self, cp, dt, size):
            self.W = cp.zeros(size, dt)
            self.W2 = cp.zeros(size, dt)
            self.own = None             # a handle of its own (else the thread's)

    def own_handle(work):
        work.own = _Handle(sim)
        return lambda: None

    def wy_update(work, F, j, rows, b, Vt, Tp, c0, c1):
        nc = c1 - c0
        if nc <= 0:
            return
        fn = F.shape[1]
        f, reads, writes = _update(sim, _addr(F) + (j * fn + c0) * 8, fn, nc, rows, b,
                                   _addr(Vt), rows, _addr(Tp), Tp.shape[-1],
                                   _addr(work.W), _addr(work.W2),
                                   thread_handle() if work.own is None
                                   else (work.own.region if model_handle_workspace else None))
        sim.task(sim.current, reads, writes, f, f"update(thread handle) cols {c0}:{c1}")

    class Gemm:
        def __init__(self, cp, dtype, stream):
            self.stream = stream            # a handle runs on the stream it was given
            self.h = _Handle(sim)

        def wy(self, W, W2, C, ldc, nc, rows, b, V, ldv, T, ldt):
            f, reads, writes = _update(sim, C, ldc, nc, rows, b, V, ldv, T, ldt, W, W2,
                                       self.h.region if model_handle_workspace else None)
            sim.task(self.stream, reads, writes, f, f"update(own handle) nc {nc}")

        def close(self):
            pass

    geqrf = None

    class Panel:
        def __init__(self, cp, dt, method, rmax, nb, work, gemm=None):
            self.work = work

        def __call__(self, F, panel, tau, Vt, Tp):
            nonlocal geqrf
            j, rows, b = panel
            fn = F.shape[1]
            base = _addr(F) + (j * fn + j) * 8
            if geqrf is None:
                geqrf, = get_lapack_funcs(("geqrf",), (np.zeros(1),))
            vt_ptr, tau_ptr, t_ptr, ldt = _addr(Vt), _addr(tau), _addr(Tp), Tp.shape[-1]

            def fn_():
                P = sim.view(base, (rows, b), (fn * 8, 8))
                qr, t, _, info = geqrf(np.array(P, order="F"), overwrite_a=True)
                P[...] = qr
                V = np.tril(qr, -1)
                V[np.arange(b), np.arange(b)] = 1.0
                sim.view(vt_ptr, (b, rows), (rows * 8, 8))[...] = V.T
                sim.view(tau_ptr, (b,), (8,))[...] = t
                Tp = _t_factor(np, solve_triangular, V, t)
                sim.view(t_ptr, (b, b), (ldt * 8, 8))[...] = Tp
            writes = [matrix_region(base, fn, rows, b), Region(vt_ptr, 0, b * rows * 8, 1),
                      Region(tau_ptr, 0, b * 8, 1), matrix_region(t_ptr, ldt, b, b),
                      array_region(self.work.W), array_region(self.work.W2)]
            sim.task(sim.current, [matrix_region(base, fn, rows, b)], writes, fn_,
                     f"panel at {j}")

    monkeypatch.setattr(mod, "_Work", Work)
    monkeypatch.setattr(mod, "_own_handle", own_handle)
    monkeypatch.setattr(mod, "_wy_update", wy_update)
    monkeypatch.setattr(mod, "_Gemm", Gemm)
    monkeypatch.setattr(mod, "_PanelFactor", Panel)
    monkeypatch.setattr(mod, "_LeanPanel", Panel)


class FakeLayer:
    """What CupySplit reads of a device layer."""

    def __init__(self, cp, device_id):
        self.cp, self.device_id = cp, int(device_id)
        with cp.cuda.Device(device_id):
            self.stream = cp.cuda.Stream(non_blocking=True)
