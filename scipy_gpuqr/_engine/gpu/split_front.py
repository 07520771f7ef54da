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
all of them at once). Events order it all; the host never waits for a
device. The main device's panels' ``Vᵀ`` sit in a ring of
:data:`~..split_front.RING` slots: a slot is written again only after every
copy and update that read it.

Everything is allocated by :meth:`CupySplit.prepare` before anything is
enqueued, so that a device out of memory leaves the front untouched (the
caller then factorizes it on its device alone). The split fronts of one
factorization share their streams, cuBLAS handles, panel factor and work
buffers (:class:`SplitResources`): made by the first front that needs them,
grown when a later front needs more, so that the thread of the main device,
which prepares every front, makes them once per call and not once per front.
A front's streams start after the previous front's end, so what it reuses
is no longer read or written by that front. Each front's ``T`` and ``tau``
are its own (``T`` stays with the front: ``Q`` is applied with it).

Each device's calls may be enqueued by a thread of that device
(:func:`~..split_front.run_split` with ``workers``): a step only waits on
events that the steps it needs recorded, and those have run (on the host)
before it; what one device's calls write (its events, its slots' readers)
is read by another device's thread only through those needs. A step of a
large front is about fifty library calls on the main device alone: the
host's time per call matters. With
``lean`` (the default) every stream has a cuBLAS handle of its own, its
stream and pointer mode set once, and the GEMMs (the trailing updates, the
panel's sub-panel updates) are called with their pointers at hand: the same
cuBLAS calls on the same operands as :mod:`..dense_front`'s, without setting
the shared handle's stream and pointer mode around each update. Without
``lean`` the chain keeps the thread's handle (as ``factorize_cupy``), and the
bulk and every other device's updates get a handle of their own all the
same: a cuBLAS handle's default workspace serves one stream at a time, and
these streams run at once.

``serial`` (a diagnostic) synchronizes the devices after every call: the same
operations, in the same order, with no overlap between the streams.
"""

from __future__ import annotations

import numpy as np

from ..dense_front import DEFAULT_PANEL_METHOD, _PanelFactor, _Work, _wy_update
from ..split_front import RING, block_rows, local_columns
from .dense_panel import PANEL_WIDTH

__all__ = ["CupySplit", "SplitResources", "enable_peers"]

#: ``cudaMemcpyDefault``: the direction from the pointers (unified addressing)
_DEFAULT = 4

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


def _own_handle(work):
    """Give ``work`` (a :class:`~..dense_front._Work` of the current device) a cuBLAS
    handle of its own in place of the thread's; returns what closes it."""
    from cupy_backends.cuda.libs import cublas
    h = cublas.create()
    work.blas.hb = h
    return lambda: cublas.destroy(h)


class _Gemm:
    """cuBLAS GEMMs on one stream through a handle of its own (its stream and the
    host pointer mode set once)."""

    def __init__(self, cp, dtype, stream):
        from cupy_backends.cuda.libs import cublas
        self.cb = cublas
        dt = np.dtype(dtype)
        self.gemm = cublas.sgemm if dt == np.float32 else cublas.dgemm
        self.trsm = cublas.strsm if dt == np.float32 else cublas.dtrsm
        self.N, self.T = cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T
        self._scalars = np.array([1.0, 0.0, -1.0], dtype=dt)
        base, isz = self._scalars.ctypes.data, dt.itemsize
        self.one, self.zero, self.mone = base, base + isz, base + 2 * isz
        self.h = cublas.create()
        cublas.setStream(self.h, stream.ptr)
        cublas.setPointerMode(self.h, cublas.CUBLAS_POINTER_MODE_HOST)

    def wy(self, W, W2, C, ldc, nc, rows, b, V, ldv, T, ldt) -> None:
        """``Cᵀ -= ((Cᵀ V) op(T)) Vᵀ`` as :func:`~..dense_front._wy_update` (pointers:
        ``C`` the first element of the ``rows × nc`` block, row-major, ``ldc``;
        ``V`` column-major ``rows × b``, ``ldv``; ``T`` row-major, ``ldt``)."""
        g, h, N, Tr = self.gemm, self.h, self.N, self.T
        g(h, N, N, nc, b, rows, self.one, C, ldc, V, ldv, self.zero, W, nc)
        g(h, N, Tr, nc, b, b, self.one, W, nc, T, ldt, self.zero, W2, nc)
        g(h, N, Tr, nc, rows, b, self.mone, W2, nc, V, ldv, self.one, C, ldc)

    def trsm_unit_lower(self, A, B, m: int) -> None:
        """``B ← A⁻¹ B`` (pointers, m × m column-major, ``A`` unit lower): the call
        :meth:`~..dense_front._Cublas.trsm_unit_lower` makes, through this handle
        (its host pointer mode already set)."""
        cb = self.cb
        self.trsm(self.h, cb.CUBLAS_SIDE_LEFT, cb.CUBLAS_FILL_MODE_LOWER, cb.CUBLAS_OP_N,
                  cb.CUBLAS_DIAG_UNIT, m, m, self.one, A, m, B, m)

    def close(self) -> None:
        if self.h is not None:
            self.cb.destroy(self.h)
            self.h = None


class _LeanPanel(_PanelFactor):
    """:class:`~..dense_front._PanelFactor` whose kernel panels update their later
    sub-panel columns through a :class:`_Gemm` (the same three GEMMs), and whose
    ``T`` takes its triangular solve through it too (the same ``trsm``, on the
    chain's handle: no pointer mode set and put back per panel)."""

    def __init__(self, cp, dt, method, rmax, nb, work, gemm):
        super().__init__(cp, dt, method, rmax, nb, work)
        self.g = gemm

    def __call__(self, F, panel, tau, Vt, Tp):
        j, rows, b = panel
        if self.kern is None or self.kern.plan(rows) is None:
            return super().__call__(F, panel, tau, Vt, Tp)
        Vt.fill(0)
        isz = F.dtype.itemsize
        fn = F.shape[1]
        base, V0, t0 = F.data.ptr, Vt.data.ptr, tau.data.ptr
        W, W2, Tq = self.work.W.data.ptr, self.work.W2.data.ptr, self.Tq.data.ptr
        for q in range(0, b, PANEL_WIDTH):
            w = min(PANEL_WIDTH, b - q)
            mi = rows - q
            Vq = V0 + (q * rows + q) * isz
            self.kern.launch(base + ((j + q) * fn + j + q) * isz, fn, mi, w, Vq, rows,
                             t0 + q * isz, Tq, self.ws)
            nci = b - q - w
            if nci > 0:
                self.g.wy(W, W2, base + ((j + q) * fn + j + q + w) * isz, fn, nci, mi, w,
                          Vq, rows, Tq, PANEL_WIDTH)
        self._t_factor(Vt, tau[:b], Tp[:b, :b])
        return None

    def _trsm(self, M, D, b: int) -> None:
        self.g.trsm_unit_lower(M, D, b)


class SplitResources:
    """Streams, cuBLAS handles, panel factors and work buffers the split fronts of one
    factorization share (see the module notes).

    Each is made on first use under the current device (and stream, for the
    memory pool) and kept under its key; an object of a given size is made
    again only when a later front needs a larger one, and the one it replaces
    is kept alive until :meth:`close` (an earlier front's work may still read
    it on the device). :attr:`done` is the last front's end event, which the
    next front's streams wait for before they touch what it reused.
    """

    def __init__(self, cp):
        self.cp = cp
        self.streams = {}           # key -> stream
        self.objs = {}              # key -> (size, object)
        self.gemms = []             # (device, _Gemm) made
        self.closers = []           # (device, close) of the handles lean=False made
        self.kept = []              # objects replaced by larger ones
        self.done = None

    def stream(self, cp, key, priority=None):
        """The stream of ``key`` (made on the current device the first time)."""
        s = self.streams.get(key)
        if s is None:
            kw = {} if priority is None else {"priority": priority}
            s = self.streams[key] = cp.cuda.Stream(non_blocking=True, **kw)
        return s

    def get(self, key, size, make):
        """The object of ``key`` made for at least ``size`` (compared with ``>=``);
        ``make()`` makes one where there is none yet or a smaller one."""
        got = self.objs.get(key)
        if got is not None and got[0] >= size:
            return got[1]
        if got is not None:
            self.kept.append(got[1])
        obj = make()
        self.objs[key] = (size, obj)
        return obj

    def buffer(self, cp, key, shape, dtype):
        """An uninitialized array of ``shape``: a view of the flat buffer of ``key``."""
        n = max(int(np.prod(shape)), 1)
        flat = self.get(key, n, lambda: cp.empty(n, dtype=dtype))
        return flat[:int(np.prod(shape))].reshape(shape)

    def close(self) -> None:
        """Close the handles and drop everything (after the last front's ``done``)."""
        for dev, g in self.gemms:
            with self.cp.cuda.Device(dev):
                g.close()
        for dev, close in self.closers:
            with self.cp.cuda.Device(dev):
                close()
        self.gemms, self.closers = [], []
        self.streams, self.objs, self.kept = {}, {}, []
        self.done = None


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
    lean : bool
        Every stream's GEMMs through a cuBLAS handle of its own, called with
        their pointers (see the module notes); False: through
        ``factorize_cupy``'s calls (the chain on the thread's handle).
    serial : bool
        Synchronize the devices after every call (a diagnostic: no overlap).
    resources : SplitResources, optional
        What the split fronts of one factorization share (the caller closes
        it after the last front's ``done``); None: this front's own, closed
        by :meth:`release`.

    Notes
    -----
    ``on_panel``, where set, is called as ``on_panel(p, event)`` on the main
    device's thread after panel ``p``'s factorization is enqueued, ``event``
    recorded on the chain after it: once it completed, block ``p``'s columns
    of the front are final (the block came back, took its look-ahead update
    and its panel; later steps write later blocks only), so R's copier may
    read them while the later panels run.
    """

    def __init__(self, main, helpers, F, panels, nb, owners, ready, panel_method=None,
                 timing: bool = False, lean: bool = True, serial: bool = False,
                 resources: SplitResources | None = None):
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
        self.lean = bool(lean)
        self.serial = bool(serial)
        self.own_res = resources is None
        self.res = SplitResources(main.cp) if resources is None else resources
        self.after = None               # the previous front's end (its streams reused)
        self.ndev = int(self.owners.max()) + 1 if len(self.owners) else 1
        self.need = block_rows(self.panels, len(self.owners))
        if self.ndev > len(self.layers):
            raise ValueError(f"owners name {self.ndev} devices, {len(self.layers)} given")
        self.ev_fac = {}
        self.ev_ready = {}
        #: device -> panel -> the event after which it no longer reads the panel's ring
        #: slot (the main device's bulk update, another device's copy of the panel)
        self.free_after = [dict() for _ in range(self.ndev)]
        self._bulk_waited = -1
        self.start = self.done = None
        #: ``on_panel(p, event)`` after panel ``p`` is enqueued, with the event on the
        #: main device after its factorization (None: nothing)
        self.on_panel = None

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
        each other). Streams, handles, the panel factor and the work buffers
        come from :attr:`res` (made by an earlier front of the call where it
        made them large enough); ``T`` and ``tau`` are the front's own."""
        cp, nb, dt, res = self.cp, self.nb, self.dt, self.res
        used = self.ids[:self.ndev]
        if len(set(used)) > 1 and not enable_peers(cp, used):
            raise RuntimeError(f"no peer access between the devices {used}")
        self.after = res.done
        P = len(self.panels)
        rmax = max((r for _, r, _ in self.panels), default=1)
        wmain = max(self.fn, nb) * nb
        key0 = (0, self.ids[0], dt.str)
        with self._dev(0):
            # CUDA clamps a priority to the device's range (as factorize_cupy's look-ahead)
            self.s_chain = res.stream(cp, key0 + ("chain",), priority=_CHAIN_PRIORITY)
            self.s_bulk = res.stream(cp, key0 + ("bulk",))
            with self.s_chain:
                self.T = cp.zeros((max(P, 0), nb, nb), dtype=dt)
                self.tau = cp.zeros((max(P, 1), nb), dtype=dt)
                self.vring = res.buffer(cp, key0 + ("vring", nb), (RING, nb * rmax), dt)
                self.w_chain = res.get(key0 + ("w_chain",), wmain,
                                       lambda: _Work(cp, dt, wmain))
                self.g_chain = self._gemm(key0 + ("chain",), self.s_chain)
                if self.g_chain is None:
                    self.fac = res.get(key0 + ("fac", self.method, nb, id(self.w_chain)), rmax,
                                       lambda: _PanelFactor(cp, dt, self.method, rmax, nb,
                                                            self.w_chain))
                else:
                    self.fac = res.get(key0 + ("lean fac", self.method, nb, id(self.w_chain)),
                                       rmax, lambda: _LeanPanel(cp, dt, self.method, rmax, nb,
                                                                self.w_chain, self.g_chain))
            with self.s_bulk:
                self.w_bulk = res.get(key0 + ("w_bulk",), wmain,
                                      lambda: self._private(_Work(cp, dt, wmain)))
                self.g_bulk = self._gemm(key0 + ("bulk",), self.s_bulk)
        self.streams = [self.s_bulk]
        self.copies = [None]
        self.used = [dict() for _ in range(self.ndev)]      # device -> panel -> updates done
        self.local = [None] * self.ndev
        self.col_of = [None] * self.ndev
        self.width = [0] * self.ndev
        self.hv = [None] * self.ndev
        self.hT = [None] * self.ndev
        self.work = [None] * self.ndev
        self.g_help = [None] * self.ndev
        for d in range(1, self.ndev):
            at, w = local_columns(self.owners, d, nb, self.fn)
            key = (d, self.ids[d], dt.str)
            wd = max(w, nb) * nb
            with self._dev(d):
                s = res.stream(cp, key + ("compute",))
                self.streams.append(s)
                self.copies.append(res.stream(cp, key + ("copy",)))
                with s:
                    self.local[d] = res.buffer(cp, key + ("local",), (self.fm, max(w, 1)), dt)
                    self.hv[d] = res.buffer(cp, key + ("hv", nb), (2, nb * rmax), dt)
                    self.hT[d] = res.buffer(cp, key + ("hT", nb), (2, nb, nb), dt)
                    self.work[d] = res.get(key + ("work",), wd,
                                           lambda: self._private(_Work(cp, dt, wd)))
                    self.g_help[d] = self._gemm(key + ("compute",), s)
            self.col_of[d], self.width[d] = at, w

    def _gemm(self, key, stream):
        """The :class:`_Gemm` of ``key`` on ``stream`` (the current device's), or None
        without ``lean``."""
        if not self.lean:
            return None

        def make():
            g = _Gemm(self.cp, self.dt, stream)
            self.res.gemms.append((self.cp.cuda.Device().id, g))
            return g
        return self.res.get(key + ("gemm",), 0, make)

    def _private(self, work):
        """Without ``lean``: ``work``'s GEMMs through a handle of their own (not the
        thread's, which the chain uses on another stream at the same time);
        returns ``work``."""
        if not self.lean:
            self.res.closers.append((self.cp.cuda.Device().id, _own_handle(work)))
        return work

    def _settle(self) -> None:
        """With ``serial``: wait for every device of the split."""
        if not self.serial:
            return
        for i in dict.fromkeys(self.ids[:self.ndev]):
            with self.cp.cuda.Device(i) as dev:
                dev.synchronize()

    def _wy(self, g, work, F, j, rows, b, Vt, Tp, c0, c1) -> None:
        """``_wy_update`` of ``F``'s columns ``c0:c1`` (through ``g`` when lean)."""
        if g is None:
            _wy_update(work, F, j, rows, b, Vt, Tp, c0, c1)
            return
        nc = c1 - c0
        if nc <= 0:
            return
        isz = F.dtype.itemsize
        fn = F.shape[1]
        g.wy(work.W.data.ptr, work.W2.data.ptr, F.data.ptr + (j * fn + c0) * isz, fn, nc,
             rows, b, Vt.data.ptr, rows, Tp.data.ptr, Tp.shape[-1])

    def _vslot(self, p):
        j, rows, b = self.panels[p]
        return self.vring[p % RING, :b * rows].reshape(b, rows)

    # -- the steps -------------------------------------------------------------------
    def setup(self) -> None:
        """The main device's streams after the front's assembly."""
        with self._dev(0):
            for ev in (self.after, self.ready_event):
                if ev is not None:
                    self.s_chain.wait_event(ev)
                    self.s_bulk.wait_event(ev)
            if self.timing:         # from the front's assembly on
                self.start = self._event(self.s_chain, timing=True)
        self._settle()

    def send_blocks(self, d: int) -> None:
        """Device ``d``'s blocks from the front into its array (after the assembly)."""
        cp, isz = self.cp, self.isz
        src0 = self.F.data.ptr
        s = self.copies[d]
        with self._dev(d):
            if self.after is not None:      # the previous front's end: its buffers free
                s.wait_event(self.after)
            s.wait_event(self.ready_event)
            loc = self.local[d]
            for c, at in self.col_of[d].items():
                a, e = self._cols(c)
                if self.need[c]:
                    cp.cuda.runtime.memcpy2DAsync(
                        loc.data.ptr + at * isz, self.width[d] * isz, src0 + a * isz,
                        self.fn * isz, (e - a) * isz, int(self.need[c]), _DEFAULT, s.ptr)
            self.streams[d].wait_event(self._event(s))      # before its first update
        self._settle()

    def factor(self, p: int) -> None:
        with self._dev(0):
            for d in range(self.ndev):      # the ring slot's last readers
                ev = self.free_after[d].pop(p - RING, None)
                if ev is not None:
                    self.s_chain.wait_event(ev)
            with self.s_chain:
                self.fac(self.F, self.panels[p], self.tau[p], self._vslot(p), self.T[p])
            self.ev_fac[p] = self._event(self.s_chain)
            if self.on_panel is not None:   # block p's columns are final after it
                self.on_panel(p, self.ev_fac[p])
        self._settle()

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
            self.free_after[d][p] = got
            self.streams[d].wait_event(got)
        self._settle()

    def lookahead(self, p: int, c: int) -> None:
        j, rows, b = self.panels[p]
        a, e = self._cols(c)
        with self._dev(0):
            ev = self.ev_ready.pop(c, None)
            if ev is not None:
                self.s_chain.wait_event(ev)
            with self.s_chain:
                self._wy(self.g_chain, self.w_chain, self.F, j, rows, b, self._vslot(p),
                         self.T[p], a, e)
        self._settle()

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
                            self._wy(self.g_bulk, self.w_bulk, self.F, j, rows, b,
                                     self._vslot(p), self.T[p], a, e)
                        run = None if c is None else [c, c + 1]
                self.free_after[0][p] = self._event(self.s_bulk)
            self._settle()
            return
        at = self.col_of[d]
        a0 = at[blocks[0]]
        a, e = self._cols(blocks[-1])
        e0 = at[blocks[-1]] + e - a
        s = self.streams[d]
        with self._dev(d), s:
            Vt = self.hv[d][p % 2, :b * rows].reshape(b, rows)
            self._wy(self.g_help[d], self.work[d], self.local[d], j, rows, b, Vt,
                     self.hT[d][p % 2], a0, e0)
            self.used[d][p] = self._event(s)
        self._settle()

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
        self._settle()

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
        self.res.done = self.done
        self.free_after = [dict() for _ in range(self.ndev)]
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
        """Drop the front's references to its buffers, and close the handles where the
        resources are its own (after ``done`` completed)."""
        if self.own_res:
            self.res.close()
        self.local = self.hv = self.hT = self.work = self.g_help = None
        self.vring = self.w_chain = self.w_bulk = self.fac = None
        self.g_chain = self.g_bulk = None
