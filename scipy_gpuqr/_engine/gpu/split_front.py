"""A dense front factorized over several GPUs: the CUDA backend of :func:`~..split_front.run_split`.

The front lies in its stage's pool on the main device (row-major ``fm × fn``).
The main device has two streams of its own: the *chain* (panels, their
``T``, the look-ahead block's update: the same kernels and cuBLAS calls as
:func:`~scipy_gpuqr._engine.dense_front.factorize_cupy`), of the highest
priority (the panel kernel's cooperative grid needs the whole device: when
SMs free up, it goes before the other updates), and the *bulk* (its own
blocks' updates). Every other device has two: a *copy* stream brings its
blocks from the front into an array of its own (``fm × its columns``, the
rows the factorization touches, one ``cudaMemcpy2DAsync`` per block, peer to
peer under unified addressing), each panel's ``Vᵀ`` and ``T`` into one of
two slots (once the updates that read that slot ended) and each block back
into the front once its update ended; the *compute* stream updates its
blocks ≥ ``p+2`` (block ``p+2`` first, then the others by three GEMMs over
all of them at once). Events order it all; the host never waits. The main
device's panels' ``Vᵀ`` sit in a ring of three slots: a slot is written
again only after every copy and update that read it.

Everything is allocated by :meth:`CupySplit.prepare` before anything is
enqueued, so that a device out of memory leaves the front untouched (the
caller then factorizes it on its device alone).
"""

from __future__ import annotations

import numpy as np

from ..dense_front import DEFAULT_PANEL_METHOD, _PanelFactor, _Work, _wy_update
from ..split_front import block_rows

__all__ = ["CupySplit", "enable_peers"]

#: ``cudaMemcpyDefault``: the direction from the pointers (unified addressing)
_DEFAULT = 4

#: slots of the main device's ring of panel reflectors
_RING = 3

#: priority of the main device's chain stream (lower is higher; clamped by CUDA)
_CHAIN_PRIORITY = -5


def enable_peers(cp, ids) -> bool:
    """Peer access between every pair of the devices ``ids``; returns whether every
    pair has it (the split's 2-D copies between devices need it: they run over
    the link, as ``cudaMemcpy2DAsync`` with the direction from the pointers)."""
    rt = cp.cuda.runtime
    ids = list(dict.fromkeys(int(i) for i in ids))
    ok = True
    for a in ids:
        for b in ids:
            if a == b:
                continue
            if not rt.deviceCanAccessPeer(a, b):
                ok = False
                continue
            with cp.cuda.Device(a):
                try:
                    # CuPy's variant clears the runtime's last error when access was
                    # enabled already (see multi_device._home_reaches)
                    ensure = getattr(rt, "_deviceEnsurePeerAccess", None)
                    if ensure is not None:
                        ensure(b)
                    else:
                        rt.deviceEnablePeerAccess(b)
                except rt.CUDARuntimeError as exc:
                    if "PeerAccessAlreadyEnabled" not in str(exc):
                        ok = False
    return ok


class CupySplit:
    """The backend of :func:`~scipy_gpuqr._engine.split_front.run_split` on CUDA devices.

    Parameters
    ----------
    main : CupyDevice
        The layer whose stage pool holds the front.
    helpers : list of CupyDevice
        The other devices (split devices 1, 2, ...).
    F : cupy.ndarray
        The front, a C-contiguous ``fm × fn`` view of the stage pool on ``main``.
    panels : list of (j, rows, b)
    nb : int
    owners : ndarray of int
        Device of each block of ``nb`` columns.
    ready : cupy.cuda.Event
        Recorded on ``main``'s stream after the front's assembly.
    panel_method : str, optional
        As :func:`~scipy_gpuqr._engine.dense_front.factorize_cupy`.
    timing : bool
        Events with timing around the whole front (:attr:`seconds`).
    """

    def __init__(self, main, helpers, F, panels, nb, owners, ready, panel_method=None,
                 timing: bool = False):
        self.cp = main.cp
        self.layers = [main] + list(helpers)
        self.ids = [int(layer.device_id) for layer in self.layers]
        self.F, self.panels, self.nb = F, list(panels), int(nb)
        self.owners = np.asarray(owners, dtype=np.int64)
        self.fm, self.fn = (int(x) for x in F.shape)
        self.dt = np.dtype(F.dtype)
        self.isz = self.dt.itemsize
        self.ready_event = ready
        self.method = DEFAULT_PANEL_METHOD if panel_method is None else panel_method
        self.timing = bool(timing)
        self.ndev = int(self.owners.max()) + 1 if len(self.owners) else 1
        self.need = block_rows(self.panels, len(self.owners))
        if self.ndev > len(self.layers):
            raise ValueError(f"owners name {self.ndev} devices, {len(self.layers)} given")
        self.ev_fac = {}
        self.ev_ready = {}
        self.free_after = {}            # panel -> events after which its ring slot is free
        self._bulk_waited = -1
        self.start = self.done = None

    def _dev(self, d):
        return self.cp.cuda.Device(self.ids[d])

    def _event(self, stream, timing=False):
        ev = self.cp.cuda.Event(disable_timing=not timing)
        ev.record(stream)
        return ev

    def _cols(self, c):
        return c * self.nb, min(self.fn, (c + 1) * self.nb)

    # -- before anything is enqueued --------------------------------------------------
    def prepare(self) -> None:
        """Peer access, streams and every buffer of the split (raises CuPy's
        OutOfMemoryError; RuntimeError where two of the devices cannot reach
        each other)."""
        cp, nb, dt = self.cp, self.nb, self.dt
        used = self.ids[:self.ndev]
        if len(set(used)) > 1 and not enable_peers(cp, used):
            raise RuntimeError(f"no peer access between the devices {used}")
        P = len(self.panels)
        rmax = max((r for _, r, _ in self.panels), default=1)
        with self._dev(0):
            # CUDA clamps a priority to the device's range (as factorize_cupy's look-ahead)
            self.s_chain = cp.cuda.Stream(non_blocking=True, priority=_CHAIN_PRIORITY)
            self.s_bulk = cp.cuda.Stream(non_blocking=True)
            with self.s_chain:
                self.T = cp.zeros((max(P, 0), nb, nb), dtype=dt)
                self.tau = cp.zeros((max(P, 1), nb), dtype=dt)
                self.vring = cp.empty((_RING, nb * rmax), dtype=dt)
                self.w_chain = _Work(cp, dt, max(self.fn, nb) * nb)
                self.fac = _PanelFactor(cp, dt, self.method, rmax, nb, self.w_chain)
            with self.s_bulk:
                self.w_bulk = _Work(cp, dt, max(self.fn, nb) * nb)
        self.streams = [self.s_bulk]
        self.copies = [None]
        self.used = [dict() for _ in range(self.ndev)]      # device -> panel -> updates done
        self.local = [None] * self.ndev
        self.col_of = [None] * self.ndev
        self.width = [0] * self.ndev
        self.hv = [None] * self.ndev
        self.hT = [None] * self.ndev
        self.work = [None] * self.ndev
        for d in range(1, self.ndev):
            blocks = np.flatnonzero(self.owners == d).tolist()
            at, w = {}, 0
            for c in blocks:
                a, e = self._cols(c)
                at[c] = w
                w += e - a
            with self._dev(d):
                s = cp.cuda.Stream(non_blocking=True)
                self.streams.append(s)
                self.copies.append(cp.cuda.Stream(non_blocking=True))
                with s:
                    self.local[d] = cp.empty((self.fm, max(w, 1)), dtype=dt)
                    self.hv[d] = cp.empty((2, nb * rmax), dtype=dt)
                    self.hT[d] = cp.empty((2, nb, nb), dtype=dt)
                    self.work[d] = _Work(cp, dt, max(w, nb) * nb)
            self.col_of[d], self.width[d] = at, w

    def _vslot(self, p):
        j, rows, b = self.panels[p]
        return self.vring[p % _RING, :b * rows].reshape(b, rows)

    # -- the steps -------------------------------------------------------------------
    def setup(self) -> None:
        cp, isz = self.cp, self.isz
        with self._dev(0):
            self.s_chain.wait_event(self.ready_event)
            self.s_bulk.wait_event(self.ready_event)
            if self.timing:         # from the front's assembly on
                self.start = self._event(self.s_chain, timing=True)
        src0 = self.F.data.ptr
        for d in range(1, self.ndev):
            s = self.copies[d]
            with self._dev(d):
                s.wait_event(self.ready_event)
                loc = self.local[d]
                for c, at in self.col_of[d].items():
                    a, e = self._cols(c)
                    if self.need[c]:
                        cp.cuda.runtime.memcpy2DAsync(
                            loc.data.ptr + at * isz, self.width[d] * isz, src0 + a * isz,
                            self.fn * isz, (e - a) * isz, int(self.need[c]), _DEFAULT, s.ptr)
                self.streams[d].wait_event(self._event(s))      # before its first update

    def factor(self, p: int) -> None:
        with self._dev(0):
            for ev in self.free_after.pop(p - _RING, ()):
                self.s_chain.wait_event(ev)
            with self.s_chain:
                self.fac(self.F, self.panels[p], self.tau[p], self._vslot(p), self.T[p])
            self.ev_fac[p] = self._event(self.s_chain)

    def send_panel(self, p: int, d: int) -> None:
        cp, isz = self.cp, self.isz
        j, rows, b = self.panels[p]
        s = self.copies[d]
        with self._dev(d):
            s.wait_event(self.ev_fac[p])
            prev = self.used[d].pop(p - 2, None)        # the slot's last reader
            if prev is not None:
                s.wait_event(prev)
            rt = cp.cuda.runtime
            rt.memcpyAsync(self.hv[d][p % 2].data.ptr, self._vslot(p).data.ptr,
                           b * rows * isz, _DEFAULT, s.ptr)
            rt.memcpyAsync(self.hT[d][p % 2].data.ptr, self.T[p].data.ptr,
                           self.nb * self.nb * isz, _DEFAULT, s.ptr)
            got = self._event(s)
            self.free_after.setdefault(p, []).append(got)
            self.streams[d].wait_event(got)

    def lookahead(self, p: int, c: int) -> None:
        j, rows, b = self.panels[p]
        a, e = self._cols(c)
        with self._dev(0):
            ev = self.ev_ready.pop(c, None)
            if ev is not None:
                self.s_chain.wait_event(ev)
            with self.s_chain:
                _wy_update(self.w_chain, self.F, j, rows, b, self._vslot(p), self.T[p], a, e)

    def update(self, d: int, p: int, blocks) -> None:
        j, rows, b = self.panels[p]
        if d == 0:
            with self._dev(0):
                if self._bulk_waited < p:
                    self.s_bulk.wait_event(self.ev_fac[p])
                    self._bulk_waited = p
                with self.s_bulk:
                    run = None
                    for c in list(blocks) + [None]:         # runs of adjacent blocks
                        if run is not None and c == run[1]:
                            run[1] = c + 1
                            continue
                        if run is not None:
                            a, _ = self._cols(run[0])
                            _, e = self._cols(run[1] - 1)
                            _wy_update(self.w_bulk, self.F, j, rows, b, self._vslot(p),
                                       self.T[p], a, e)
                        run = None if c is None else [c, c + 1]
                self.free_after.setdefault(p, []).append(self._event(self.s_bulk))
            return
        at = self.col_of[d]
        a0 = at[blocks[0]]
        a, e = self._cols(blocks[-1])
        e0 = at[blocks[-1]] + e - a
        s = self.streams[d]
        with self._dev(d), s:
            Vt = self.hv[d][p % 2, :b * rows].reshape(b, rows)
            _wy_update(self.work[d], self.local[d], j, rows, b, Vt, self.hT[d][p % 2], a0, e0)
            self.used[d][p] = self._event(s)

    def to_main(self, d: int, c: int) -> None:
        cp, isz = self.cp, self.isz
        a, e = self._cols(c)
        at = self.col_of[d][c]
        s = self.copies[d]
        with self._dev(d):
            s.wait_event(self._event(self.streams[d]))     # after the block's last update
            if self.need[c]:
                cp.cuda.runtime.memcpy2DAsync(
                    self.F.data.ptr + a * isz, self.fn * isz,
                    self.local[d].data.ptr + at * isz, self.width[d] * isz,
                    (e - a) * isz, int(self.need[c]), _DEFAULT, s.ptr)
            self.ev_ready[c] = self._event(s)

    def ready(self, c: int) -> None:
        with self._dev(0):
            self.ev_ready[c] = self._event(self.s_bulk)

    def finish(self) -> None:
        evs = []
        for d, s in enumerate(self.streams):
            with self._dev(d):
                evs.append(self._event(s))
                if d:
                    evs.append(self._event(self.copies[d]))
        with self._dev(0):
            for ev in evs:
                self.s_chain.wait_event(ev)
            self.done = self._event(self.s_chain, timing=self.timing)
        self.free_after.clear()
        self.ev_ready.clear()
        self.ev_fac.clear()
        self.used = [dict() for _ in range(self.ndev)]

    def seconds(self) -> float | None:
        """Seconds from the split's start to its end (after ``done`` completed;
        None without ``timing``)."""
        if self.start is None or self.done is None:
            return None
        return self.cp.cuda.get_elapsed_time(self.start, self.done) / 1e3

    def release(self) -> None:
        """Drop the buffers (after ``done`` completed)."""
        self.local = self.hv = self.hT = self.work = None
        self.vring = self.w_chain = self.w_bulk = self.fac = None
