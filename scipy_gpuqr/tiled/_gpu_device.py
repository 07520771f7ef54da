"""A CUDA GPU as one device of the tiled QR (CuPy; imported only when used).

Each GPU has its own stream set: ``panel`` (triangulation and elimination of
a tile column on the main device: one cuSOLVER ``geqrf``, or the recursive
panel whose leaves are ``geqrf`` and the rest matrix products, plus the
compact-WY ``T``), ``lookahead`` (the main device's update of the next
column), ``compute`` (updates: cuBLAS products) and ``copy`` (incoming
transfers: peer-to-peer between GPUs where the pair allows it, pinned
host memory to and from the CPU). Streams are ordered by CUDA events, so
transfers overlap the updates of earlier columns.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from . import _ops as ops
from .._gpu import import_cupy
from ._runtime import Layout, Pending

__all__ = ["GpuDevice"]


class GpuDevice:
    """GPU ``index`` with its three streams.

    Parameters
    ----------
    index : int
        CUDA device ordinal.
    panel_leaf : int
        Leaf width of the recursive panel factorization (0: one ``geqrf`` of
        the whole tile column; see :func:`._ops.factor_wy`).
    """

    is_gpu = True
    panel_kind = "wy"

    def __init__(self, index: int, panel_leaf: int = 0):
        cp = import_cupy()
        if cp is None:
            raise RuntimeError("CuPy is not available")
        self.cp = cp
        self.index = int(index)
        self.panel_leaf = int(panel_leaf)
        self.name = f"gpu:{self.index}"
        self._keep = []
        with cp.cuda.Device(self.index):
            self.compute = cp.cuda.Stream(non_blocking=True)
            # the critical path (T/E on the main device, the look-ahead column
            # update) runs on high-priority streams so the big updates of the
            # compute stream do not hold it back
            self.panel_stream = _priority_stream(cp)
            self.lookahead = _priority_stream(cp)
            self.copy = cp.cuda.Stream(non_blocking=True)
            self._enable_peers()
        self._loaded = None
        self._block_event = {}
        self.A = None
        self.offsets = {}
        self.layout = None

    # -- plumbing ---------------------------------------------------------
    def _enable_peers(self):
        rt = self.cp.cuda.runtime
        for j in range(rt.getDeviceCount()):
            if j == self.index or not rt.deviceCanAccessPeer(self.index, j):
                continue
            try:
                rt.deviceEnablePeerAccess(j)
            except Exception:  # already enabled
                pass

    def _event(self, stream):
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    def _wait(self, pending: Pending, stream):
        """Order ``stream`` after ``pending``; return its value."""
        value = pending.get()          # a CPU future blocks the manager here
        if pending.event is not None:
            stream.wait_event(pending.event)
        return value

    def _ctx(self, stream):
        return _DeviceStream(self.cp, self.index, stream)

    # -- data ----------------------------------------------------------
    def load(self, a, layout: Layout, blocks: Sequence[int]) -> None:
        cp = self.cp
        self.layout = layout
        self.offsets = {}
        cols, off = [], 0
        for j in blocks:
            c0, c1 = layout.cols(j)
            self.offsets[j] = (off, off + c1 - c0)
            off += c1 - c0
            cols.append(np.arange(c0, c1))
        with self._ctx(self.compute):
            if not blocks:
                self.A = cp.zeros((layout.m, 0), dtype=layout.dtype, order="F")
                return self._mark_loaded()
            idx = np.concatenate(cols)
            if isinstance(a, np.ndarray):
                self.A = cp.asfortranarray(cp.asarray(a[:, idx]))
                return self._mark_loaded()
        src_dev = a.device.id
        if src_dev == self.index:
            with self._ctx(self.compute):
                self.A = cp.asfortranarray(a[:, cp.asarray(idx)])
            return self._mark_loaded()
        with cp.cuda.Device(src_dev):
            part = cp.asfortranarray(a[:, cp.asarray(idx)])
            cp.cuda.get_current_stream().synchronize()
        with self._ctx(self.compute):
            self.A = cp.empty(part.shape, dtype=part.dtype, order="F")
            cp.cuda.runtime.memcpyPeerAsync(self.A.data.ptr, self.index,
                                            part.data.ptr, src_dev,
                                            part.nbytes, self.compute.ptr)
            self._keep.append(part)
        self._mark_loaded()

    def _mark_loaded(self):
        with self._ctx(self.compute):
            self._loaded = self._event(self.compute)

    def _span(self, blocks):
        return self.offsets[blocks[0]][0], self.offsets[blocks[-1]][1]

    def column(self, j: int, k0: int) -> Pending:
        """Rows ``k0:`` of column tile ``j``, copied on the look-ahead stream."""
        s, e = self.offsets[j]
        with self._ctx(self.lookahead):
            ev = self._block_event.get(j, self._loaded)
            if ev is not None:
                self.lookahead.wait_event(ev)
            x = self.cp.ascontiguousarray(self.A[k0:, s:e])
            self._keep.append(x)
            return Pending(x, self._event(self.lookahead))

    def block_rows(self, j: int, r0: int, r1: int) -> Pending:
        s, e = self.offsets[j]
        with self._ctx(self.compute):
            if j in self._block_event:   # last written on the look-ahead stream
                self.compute.wait_event(self._block_event[j])
            x = self.cp.ascontiguousarray(self.A[r0:r1, s:e])
            self._keep.append(x)
            return Pending(x, self._event(self.compute))

    # -- tile operations -------------------------------------------------
    def factor(self, col: Pending, k0: int) -> Pending:
        cp = self.cp
        with self._ctx(self.panel_stream):
            c = self._wait(col, self.panel_stream)
            p = ops.factor_wy(cp, cp.asfortranarray(c), k0,
                              leaf=self.panel_leaf)
            p = ops.rebuild_panel(p, [cp.ascontiguousarray(x)
                                      for x in ops.panel_arrays(p)])
            self._keep.append(p)
            return Pending(p, self._event(self.panel_stream))

    def update(self, panel: Pending, k0: int, blocks: Sequence[int],
               urgent: bool = False) -> None:
        """UT + UE of ``blocks`` with ``panel``; ``urgent``: the look-ahead column."""
        blocks = list(blocks)
        s, e = self._span(blocks)
        stream = self.lookahead if urgent else self.compute
        with self._ctx(stream):
            if urgent:
                ev = self._block_event.get(blocks[0], self._loaded)
                if ev is not None:
                    stream.wait_event(ev)
            p = self._wait(panel, stream)
            ops.apply_panel(p, self.A[k0:, s:e], "T")
            if len(blocks) == 1:
                self._block_event[blocks[0]] = self._event(stream)

    def update_column(self, panel: Pending, col: Pending) -> Pending:
        """Apply ``panel`` to a received look-ahead column copy, in place."""
        stream = self.lookahead
        with self._ctx(stream):
            p = self._wait(panel, stream)
            x = self._wait(col, stream)
            ops.apply_panel(p, x, "T")
            self._keep.append(x)
            return Pending(x, self._event(stream))

    def rows_of(self, pending: Pending, r0: int, r1=None) -> Pending:
        """Rows ``r0:r1`` of a value of this device (a view)."""
        return Pending(pending.get()[r0:r1], pending.event, None)

    def panel_r(self, panel: Pending) -> Pending:
        return Pending(panel.get().R, panel.event, None)

    def form_q(self, panels: Sequence[Pending], layout: Layout) -> Pending:
        kq = min(layout.m, layout.n)
        with self._ctx(self.compute):
            ps = [self._wait(p, self.compute) for p in panels]
            Q = ops.explicit_q(lambda p, C: ops.apply_panel(p, C, "N"),
                               layout.m, kq, layout.dtype, self.cp,
                               layout.tile, ps)
            return Pending(Q, self._event(self.compute))

    # -- transfers -----------------------------------------------------
    def _map(self, value, fn):
        if isinstance(value, (ops.WYPanel, ops.TilePanel)):
            return ops.rebuild_panel(value, [fn(x) for x in ops.panel_arrays(value)])
        return fn(value)

    def receive(self, pending: Pending, src) -> Pending:
        """Copy a value from ``src`` (the CPU or another GPU) to this GPU."""
        cp = self.cp
        with self._ctx(self.copy):
            value = self._wait(pending, self.copy)
            if not src.is_gpu:
                def h2d(x):
                    x = np.ascontiguousarray(x)
                    y = cp.empty(x.shape, dtype=x.dtype)
                    y.set(x, stream=self.copy)
                    return y
                out = self._map(value, h2d)
            else:
                def peer(x):
                    if not (x.flags.c_contiguous or x.flags.f_contiguous):
                        raise RuntimeError("internal error: a non-contiguous "
                                           "array crosses GPUs")
                    y = cp.empty(x.shape, dtype=x.dtype,
                                 order="C" if x.flags.c_contiguous else "F")
                    if x.nbytes:
                        cp.cuda.runtime.memcpyPeerAsync(
                            y.data.ptr, self.index, x.data.ptr, src.index,
                            x.nbytes, self.copy.ptr)
                    return y
                out = self._map(value, peer)
            self._keep.append((value, out))
            return Pending(out, self._event(self.copy))

    def to_host(self, pending: Pending) -> Pending:
        """Copy a value of this GPU into pinned host memory, asynchronously."""
        cp = self.cp
        import cupyx  # optional dependency, with CuPy
        with self._ctx(self.copy):
            value = self._wait(pending, self.copy)

            def d2h(x):
                if not (x.flags.c_contiguous or x.flags.f_contiguous):
                    x = cp.ascontiguousarray(x)
                order = "C" if x.flags.c_contiguous else "F"
                out = cupyx.empty_pinned(x.shape, dtype=x.dtype, order=order)
                if x.size:
                    try:
                        x.get(stream=self.copy, out=out, blocking=False)
                    except TypeError:  # CuPy < 13: a blocking copy
                        x.get(stream=self.copy, out=out)
                self._keep.append(x)
                return out
            out = self._map(value, d2h)
            return Pending(out, self._event(self.copy))

    def assemble_r(self, layout: Layout, pieces) -> Pending:
        cp = self.cp
        with self._ctx(self.compute):
            R = cp.zeros((layout.m, layout.n), dtype=layout.dtype)
            for j, r0, p in pieces:
                blk = self._wait(p, self.compute)
                if isinstance(blk, np.ndarray):
                    blk = cp.asarray(blk)
                c0, _ = layout.cols(j)
                r1 = min(layout.m, r0 + blk.shape[0])
                R[r0:r1, c0:c0 + blk.shape[1]] = blk[:r1 - r0]
            R = cp.triu(R)
            return Pending(R, self._event(self.compute))

    def finish(self) -> None:
        with self.cp.cuda.Device(self.index):
            for s in (self.panel_stream, self.lookahead, self.compute, self.copy):
                s.synchronize()

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self._keep.clear()
            self.A = None


def _priority_stream(cp):
    try:
        _, greatest = cp.cuda.runtime.deviceGetStreamPriorityRange()
        return cp.cuda.Stream(non_blocking=True, priority=greatest)
    except (AttributeError, TypeError):
        return cp.cuda.Stream(non_blocking=True)


class _DeviceStream:
    """``with`` this GPU current and ``stream`` the current stream."""

    def __init__(self, cp, index, stream):
        self._dev = cp.cuda.Device(index)
        self._stream = stream

    def __enter__(self):
        self._dev.__enter__()
        self._stream.__enter__()
        return self._stream

    def __exit__(self, *exc):
        self._stream.__exit__(*exc)
        return self._dev.__exit__(*exc)
