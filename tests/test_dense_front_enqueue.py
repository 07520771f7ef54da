"""The host calls a dense front's enqueue makes (CPU: recording stand-ins for CUDA).

:func:`~scipy_gpuqr._engine.dense_front.factorize_cupy` runs its own code
over the fakes of ``_cuda_record``: every cuBLAS, cuSOLVER, runtime and
kernel call is recorded instead of made. A front of ``P`` panels of 256
columns (8 panel-kernel launches each) must make its arithmetic calls in the
blocked algorithm's order (those of
:func:`~scipy_gpuqr._engine.dense_front.factorize_blocked_numpy`), with the
cuBLAS handle in host pointer mode at every GEMM, and few others: the
handle's stream and pointer mode set once per front (not around each
panel's GEMMs), no events on one stream, no kernel attribute query per
launch.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from _cuda_record import STATE_CALLS, install
from scipy_gpuqr._engine.dense_front import factorize_cupy, panels_of
from scipy_gpuqr._engine.gpu.dense_panel import PANEL_WIDTH

#: the thread's cuBLAS handle in the fakes
HANDLE = 0x11


def _front(rec, fm, fn, nb, stair=None, **kw):
    F = rec.alloc((fm, fn), np.float64)
    panels = panels_of(fm, fn, stair, nb)
    factorize_cupy(F, panels, nb, **kw)
    return F, panels


def _expected(panels, fn):
    """The arithmetic calls of the blocked algorithm, per panel: the panel kernel and
    three GEMMs per sub-panel (``(m, n, k, alpha, beta)`` of each), ``T`` (``VᵀV``,
    the system's kernel, ``trsm``, the copy), the trailing update's three GEMMs."""
    out = []
    for j, rows, b in panels:
        out.append(("memset",))
        for q in range(0, b, PANEL_WIDTH):
            w = min(PANEL_WIDTH, b - q)
            mi = rows - q
            out.append(("panel", mi, w))
            nci = b - q - w
            if nci > 0:
                out += [("gemm", nci, w, mi, 1.0, 0.0), ("gemm", nci, w, w, 1.0, 0.0),
                        ("gemm", nci, mi, w, -1.0, 1.0)]
        out += [("matmul", b), ("wy_system", b), ("trsm", b, b), ("copy", b)]
        nc = fn - j - b
        if nc > 0:
            out += [("gemm", nc, b, rows, 1.0, 0.0), ("gemm", nc, b, b, 1.0, 0.0),
                    ("gemm", nc, rows, b, -1.0, 1.0)]
    return out


def _arithmetic(rec, nb):
    """The recorded arithmetic calls in :func:`_expected`'s terms (after the
    front's own buffers were zeroed: the memsets of ``T`` and ``tau`` and the
    panel kernel's flag words come first)."""
    out = []
    for name, a in rec.arithmetic():
        if name == "cudaMemsetAsync":
            out.append(("memset",))
        elif name.startswith("launch:panel_qr"):
            out.append(("panel", a[3][2], a[3][3]))
        elif name == "cublasdgemm":
            out.append(("gemm", a[3], a[4], a[5], a[6], a[11]))
        elif name == "cupy_matmul":
            out.append(("matmul", a[0][0]))
        elif name.startswith("launch:wy_system"):
            out.append(("wy_system", a[3][2]))
        elif name == "cublasdtrsm":
            out.append(("trsm", a[5], a[6]))
        elif name.startswith("launch:ew2d"):
            out.append(("copy", a[3][6]))
        else:
            out.append((name,))
    return out[3:]


@pytest.mark.parametrize("fm,fn,nb,stair", [(1024, 1024, 256, None), (700, 900, 256, None),
                                            (600, 520, 100, "stair")])
def test_dense_front_makes_the_blocked_algorithms_calls(monkeypatch, fm, fn, nb, stair):
    rec = install(monkeypatch)
    st = None
    if stair is not None:
        st = np.minimum(np.arange(fn) * fm // fn + 40, fm)
    rec.blas.mode[HANDLE] = rec.blas.CUBLAS_POINTER_MODE_DEVICE     # the caller's mode
    F, panels = _front(rec, fm, fn, nb, st)
    assert _arithmetic(rec, nb) == _expected(panels, fn)
    # every GEMM ran in host pointer mode (the fake asserts it) and the caller's
    # mode is back
    assert rec.blas.mode[HANDLE] == rec.blas.CUBLAS_POINTER_MODE_DEVICE


def test_dense_front_host_calls_per_panel(monkeypatch):
    """Per panel of 256 columns: 8 launches, 24 GEMMs, ``VᵀV``, ``trsm``, two small
    kernels and the panel's memset (37 calls) and CuPy's stream set in each cuBLAS
    call (26); the pointer mode once per front, no events, no attribute query."""
    rec = install(monkeypatch)
    _front(rec, 512, 512, 256)              # the panel kernel's first launches
    rec.calls.clear()
    F, panels = _front(rec, 4096, 4096, 256)
    P = len(panels)
    c = collections.Counter(n for n, _ in rec.calls)
    assert c["cublasGetPointerMode"] == 1 and c["cublasSetPointerMode"] == 2
    for name in ("cudaEventCreate", "cudaEventRecord", "cudaStreamWaitEvent",
                 "cuFuncGetAttribute", "cuFuncSetAttribute", "cudaStreamSynchronize"):
        assert c[name] == 0, name
    assert c["launch:panel_qr_f64"] == 8 * P
    assert c["cublasdgemm"] == 24 * P - 3        # the last panel has no trailing columns
    state = sum(v for k, v in c.items() if k in STATE_CALLS)
    assert state <= 26 * P + 4
    assert len(rec.calls) <= 63 * P + 8


def test_lookahead_front_keeps_its_events_and_the_pointer_mode(monkeypatch):
    """With look-ahead the two streams are ordered by events (one per panel and
    stream), the pointer mode set once per front all the same."""
    rec = install(monkeypatch)
    rec.blas.mode[HANDLE] = rec.blas.CUBLAS_POINTER_MODE_DEVICE
    F, panels = _front(rec, 2048, 2048, 256, lookahead=True)
    c = collections.Counter(n for n, _ in rec.calls)
    P = len(panels)
    assert c["cudaStreamWaitEvent"] == 2 * P - 1
    assert c["cublasGetPointerMode"] == 2 and c["cublasSetPointerMode"] == 4
    assert rec.blas.mode[HANDLE] == rec.blas.CUBLAS_POINTER_MODE_DEVICE
    gemms = [a for n, a in rec.calls if n == "cublasdgemm"]
    assert len({g[-1] for g in gemms}) == 2          # GEMMs on both streams


def test_panel_kernel_raises_its_shared_memory_once(monkeypatch):
    """The panel kernel reads and raises its function's shared-memory attribute
    only for a launch needing more than any before; plans are kept per height."""
    from scipy_gpuqr._engine import dense_front
    rec = install(monkeypatch)
    kern = dense_front.panel_kernel(np.float64)
    ws = type("WS", (), {"work": rec.alloc(8, np.float64), "flags": rec.alloc(8, np.uint64),
                         "next_epoch": lambda self: 1})()
    for m in (5000, 5000, 3000, 5000):
        kern.launch(0, 32, m, 32, 0, m, 0, 0, ws)
    c = collections.Counter(n for n, _ in rec.calls)
    assert c["cuFuncGetAttribute"] == 1 and c["cuFuncSetAttribute"] == 1
    assert c["launch:panel_qr_f64"] == 4
    plan = kern.plan(5000)
    kern.launch(0, 32, 40000, 32, 0, 40000, 0, 0, ws)      # more rows per block
    c = collections.Counter(n for n, _ in rec.calls)
    big = kern.plan(40000)
    assert big[0] > plan[0]
    assert c["cuFuncGetAttribute"] == 2 and c["cuFuncSetAttribute"] == 2


def test_split_chain_panel_takes_its_trsm_through_its_own_handle(monkeypatch):
    """The split's chain panel (:class:`~scipy_gpuqr._engine.gpu.split_front._LeanPanel`)
    makes the one-device panel's arithmetic calls, its GEMMs and ``T``'s ``trsm``
    through the chain's own handle (stream and host pointer mode set when it was
    made): no pointer mode set and put back per panel, no attribute query."""
    import sys

    from scipy_gpuqr._engine.dense_front import _PanelFactor, _Work
    from scipy_gpuqr._engine.gpu.split_front import _Gemm, _LeanPanel
    rec = install(monkeypatch)
    cp = sys.modules["cupy"]
    fm = fn = 1024
    nb = 256
    panels = panels_of(fm, fn, None, nb)

    def run(lean):
        F = rec.alloc((fm, fn), np.float64)
        T = rec.alloc((len(panels), nb, nb), np.float64)
        tau = rec.alloc((len(panels), nb), np.float64)
        vt = rec.alloc((nb * fm,), np.float64)
        s = cp.cuda.Stream()
        with s:
            work = _Work(cp, np.float64, fn * nb)
            if lean:
                g = _Gemm(cp, np.float64, s)
                fac = _LeanPanel(cp, np.dtype(np.float64), "kernel", fm, nb, work, g)
            else:
                fac = _PanelFactor(cp, np.dtype(np.float64), "kernel", fm, nb, work)
            fac(F, panels[0], tau[0], vt[:nb * fm].reshape(nb, fm), T[0])   # first launches
            rec.calls.clear()
            for p, (j, rows, b) in enumerate(panels):
                fac(F, panels[p], tau[p], vt[:b * rows].reshape(b, rows), T[p])
        calls = list(rec.calls)
        return calls, (g.h if lean else HANDLE)

    one, _ = run(False)
    lean, h = run(True)
    names = collections.Counter(n for n, _ in lean)
    assert names["cublasGetPointerMode"] == names["cublasSetPointerMode"] == 0
    assert names["cuFuncGetAttribute"] == 0
    assert all(a[0] == h for n, a in lean if n in ("cublasdgemm", "cublasdtrsm"))

    def shapes(calls):
        out = []
        for n, a in calls:
            if n == "cublasdgemm":
                out.append((n, a[3], a[4], a[5], a[6], a[11]))
            elif n == "cublasdtrsm":
                out.append((n,) + tuple(a[1:8]))
            elif n.startswith("launch:"):
                out.append((n, a[0], a[1], a[2]))
            elif n not in STATE_CALLS:
                out.append((n,))
        return out
    assert shapes(lean) == shapes(one)


@pytest.mark.parametrize("lookahead", [False, True])
def test_geqrf_panels_set_the_solver_handles_stream(monkeypatch, lookahead):
    """cuSOLVER panels: the solver's handle gets the panels' stream when it is made
    (inside the front's one pointer-mode entry), one ``geqrf`` per panel."""
    rec = install(monkeypatch)
    F, panels = _front(rec, 700, 600, 256, panel_method="geqrf", lookahead=lookahead)
    names = [n for n, _ in rec.calls]
    assert names.count("cusolverGeqrf") == len(panels)
    solver_stream = None
    for n, a in rec.calls:
        if n == "cusolverSetStream":
            solver_stream = a[1]
        elif n == "cusolverGeqrf":
            assert a[0] == solver_stream        # the stream the panel is enqueued on
    assert names.count("cublasGetPointerMode") == (2 if lookahead else 1)
