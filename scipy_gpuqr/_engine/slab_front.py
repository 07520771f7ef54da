"""A dense front factorized through a device too small for it, in column slabs.

A host front (:mod:`scipy_gpuqr._engine.memory`: a dense front whose stage
does not fit the device) is assembled on the host. When even the front alone
does not fit, it still need not run on LAPACK: the blocked staircase QR of
:mod:`scipy_gpuqr._engine.dense_front` is left-looking over slabs of whole
panels, so only one slab of columns lies on the device at a time:

for each slab ``[c0, c1)`` (consecutive panels, or a block of the trailing
columns past ``min(fm, fn)``):

1. its columns ``F[:, c0:c1]`` are uploaded (one strided copy,
   ``cudaMemcpy2DAsync``: at the link's speed when ``F`` is pinned);
2. every earlier panel comes up the same way (its active rows from its
   diagonal down: where its reflectors ``V`` are), one panel while the one
   before is applied (two buffers, the copies on a stream of their own), and
   is applied to the slab, ``C ← C - V Tᵀ (Vᵀ C)`` on its active rows, ``V``
   taken out of the block on the device: the same updates, in the same order,
   that the right-looking factorization gives these columns;
3. the slab's own panels are factorized as a front of their own, its
   diagonal at ``(c0, c0)``: rows ``c0 ..`` of the slab with the panels moved
   by ``c0`` (the device dense path, panel kernel and cuBLAS);
4. the slab goes back to the host (queued; the copies and the work of one
   slab stay in one stream's order).

The result is the representation :class:`~scipy_gpuqr._engine.dense_front.DenseFront`
applies (V below each panel's diagonal, one ``T`` per panel), equal to
:func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`'s to rounding.
The device holds the slab being worked on, two earlier panels and the dense
path's workspace. The extra traffic is the earlier panels, uploaded once per
later slab: with ``s`` slabs about ``s/2`` times the front.
:func:`factorize_in_slabs` is written against a small device interface
(:class:`NumpySlabs` runs it on the host for CI, :class:`CupySlabs` on a GPU).
"""

from __future__ import annotations

import logging

import numpy as np

from .dense_front import factorize_cupy, factorize_numpy
from .gpu.array_ops import upload_block
from .gpu.finite_check import finite_check

__all__ = ["slab_ranges", "slab_columns", "whole_front_fits", "factorize_in_slabs", "NumpySlabs",
           "CupySlabs"]


def slab_ranges(panels: list, fn: int, width: int) -> list:
    """Column slabs ``(c0, c1, p0, p1)`` covering ``[0, fn)``.

    Consecutive panels ``p0 .. p1-1`` whose columns span at most ``width``
    (one panel at least), then the columns past the last panel in blocks of
    at most ``width`` (no panels: ``p0 == p1``).

    Parameters
    ----------
    panels : list of (j, rows, b)
        From :func:`~scipy_gpuqr._engine.dense_front.panels_of`.
    fn : int
        Columns of the front.
    width : int
        Most columns of a slab (at least a panel's width).
    """
    if width < 1:
        raise ValueError(f"slab width must be >= 1, got {width}")
    out = []
    p = 0
    while p < len(panels):
        c0 = panels[p][0]
        q = p + 1
        while q < len(panels) and panels[q][0] + panels[q][2] - c0 <= width:
            q += 1
        c1 = panels[q - 1][0] + panels[q - 1][2]
        out.append((c0, c1, p, q))
        p = q
    c = panels[-1][0] + panels[-1][2] if panels else 0
    while c < fn:
        c1 = min(fn, c + width)
        out.append((c, c1, len(panels), len(panels)))
        c = c1
    return out


def slab_columns(fm: int, nb: int, itemsize: int, available: int) -> int:
    """Most columns of a slab of an ``fm``-row front in ``available`` device bytes
    (the slab, two earlier panels, one panel's reflectors, the products of the
    updates and the dense path's workspace; 10 % left for the allocator), or 0
    when not even one panel fits."""
    fixed = (7 * fm * nb + 5 * nb * nb) * itemsize
    w = (0.9 * available - fixed) // ((fm + 2 * nb) * itemsize)
    return int(w) if w >= nb else 0


def whole_front_fits(fm: int, fn: int, nb: int, itemsize: int, available: int) -> bool:
    """Whether an ``fm × fn`` front and the dense path's workspace fit
    ``available`` device bytes (10 % left for the allocator)."""
    return (fm * fn + 5 * fm * nb + 2 * fn * nb + 5 * nb * nb) * itemsize <= 0.9 * available


def factorize_in_slabs(F: np.ndarray, panels: list, nb: int, width: int, dev,
                       fallback=None) -> np.ndarray:
    """Blocked staircase QR of the host front ``F`` (fm × fn) in place, slab by slab
    through ``dev``'s memory.

    Parameters
    ----------
    F : ndarray, shape (fm, fn), C-contiguous
        The assembled front, overwritten by R and the reflectors.
    panels : list of (j, rows, b)
        Its panels (:func:`~scipy_gpuqr._engine.dense_front.panels_of`, width ``nb``).
    nb : int
        Panel width.
    width : int
        Most columns of a slab (:func:`slab_columns`).
    dev : NumpySlabs or CupySlabs
        Where the slabs are worked on.
    fallback : NumpySlabs, optional
        Where a slab that failed on ``dev`` (out of its memory, or any error
        of the device path, logged) and every later one are worked on instead:
        a slab's columns of ``F`` change only once it is done, so it is redone
        from them. Without it the error propagates.

    Returns
    -------
    ndarray, shape (npanels, nb, nb)
        Each panel's compact-WY factor ``T`` (host).
    """
    T = np.zeros((len(panels), nb, nb), dtype=F.dtype)
    slabs = slab_ranges(panels, F.shape[1], max(int(width), nb))
    try:
        for k, slab in enumerate(slabs):
            try:
                _one_slab(F, T, panels, slabs[:k], slab, dev)
            except Exception as exc:    # noqa: BLE001 - redone on the host, see above
                if fallback is None or dev is fallback:
                    raise
                if not isinstance(exc, MemoryError):
                    logging.getLogger("scipy_gpuqr").warning(
                        "slab [%d, %d) of a %dx%d front failed on the device (%s: %s); it and "
                        "the rest run on the host", slab[0], slab[1], F.shape[0], F.shape[1],
                        type(exc).__name__, str(exc))
                dev.finish()            # the earlier slabs' results are in F
                dev = fallback
                _one_slab(F, T, panels, slabs[:k], slab, dev)
    finally:
        dev.finish()
    return T


def _one_slab(F, T, panels, earlier, slab, dev) -> None:
    """Slab ``(c0, c1, p0, p1)``: up, every earlier slab's reflectors, its
    panels, back into ``F`` (and their ``T``)."""
    c0, c1, p0, p1 = slab
    S = dev.upload(F, 0, F.shape[0], c0, c1, "slab")
    for q in range(p0):                 # every earlier slab's panels, in order
        j, rows, b = panels[q]
        slot = ("earlier", q % 2)       # uploaded while the previous one is applied
        E = dev.upload(F, j, j + rows, j, j + b, slot)
        dev.apply(S, j, rows, E, 0, 0, b, T[q, :b, :b])
        dev.release(slot)
    Tp = None
    if p1 > p0:                         # the slab's own panels, diagonal at (c0, c0)
        moved = [(j - c0, rows, b) for j, rows, b in panels[p0:p1]]
        Tp = dev.factorize(S, c0, moved, nb=T.shape[1])
    dev.download(S, F, c0, c1)
    if Tp is not None:
        T[p0:p1] = Tp


def _reflectors(xp, E, i0: int, k0: int, rows: int, b: int):
    """A panel's ``V`` (rows × b, unit lower trapezoid) out of a block of the front
    holding it from row ``i0``, column ``k0``."""
    V = xp.tril(E[i0:i0 + rows, k0:k0 + b], -1)
    V[xp.arange(b), xp.arange(b)] = 1
    return V


class NumpySlabs:
    """The slab operations on the host (the CI model of :class:`CupySlabs`);
    ``slabs`` counts the slabs worked on."""

    def __init__(self):
        self.slabs = 0

    def upload(self, F: np.ndarray, r0: int, r1: int, c0: int, c1: int, slot):
        """``F[r0:r1, c0:c1]`` where the slabs are worked on (a copy)."""
        self.slabs += slot == "slab"
        return F[r0:r1, c0:c1].copy()

    def release(self, slot) -> None:
        """The block of ``slot`` is no longer read (its buffer may be refilled)."""

    def download(self, S, F: np.ndarray, c0: int, c1: int) -> None:
        """The worked slab back into ``F[:, c0:c1]``."""
        F[:, c0:c1] = S

    def apply(self, S, j: int, rows: int, E, i0: int, k0: int, b: int, T) -> None:
        """``C ← C - V Tᵀ (Vᵀ C)`` on rows ``[j, j+rows)`` of the slab, V a panel's
        reflectors at ``(i0, k0)`` of the earlier block ``E``."""
        V = _reflectors(np, E, i0, k0, rows, b)
        C = S[j:j + rows]
        C -= V @ (T.T @ (V.T @ C))

    def factorize(self, S, c0: int, panels: list, nb: int) -> np.ndarray:
        """The slab's panels (``panels`` relative to ``(c0, c0)``); their ``T``."""
        return factorize_numpy(S[c0:], panels, nb)

    def finish(self) -> None:
        pass


class CupySlabs:
    """The slab operations on a CUDA device, on ``stream``: device buffers (the
    slab, two earlier panels) reused for every slab, strided copies queued (``F``
    pinned makes them asynchronous; the earlier panels' on a copy stream of
    their own, after the last slab's copy back into ``F``, each buffer refilled
    once the work reading it has passed), one
    synchronization per slab for its ``T``; ``slabs`` counts the slabs started
    there. Each worked slab is checked for non-finite values before it goes back
    (one launch reading it where it lies: :meth:`all_finite`), so the host need
    not read the front again."""

    def __init__(self, cp, stream):
        self.cp, self.stream = cp, stream
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.slabs = 0
        self._buffers = {}
        self._read = {}                 # slot -> event: the last work reading its buffer
        self._written = None            # event: the last slab's copy back into F
        self._flags = []

    def _buffer(self, slot, shape: tuple, dtype):
        n = shape[0] * shape[1]
        buf = self._buffers.get(slot)
        if buf is None or buf.size < n or buf.dtype != dtype:
            if buf is not None:         # a buffer in use on either stream is not freed
                self.stream.synchronize()
                self.copy_stream.synchronize()
            buf = None                  # freed before the larger one is taken
            self._buffers.pop(slot, None)
            buf = self._buffers[slot] = self.cp.empty(max(n, 1), dtype=dtype)
        return buf[:n].reshape(shape)

    def upload(self, F: np.ndarray, r0: int, r1: int, c0: int, c1: int, slot):
        """``F[r0:r1, c0:c1]`` into the slot's device buffer (one 2-D copy): the
        slab's on the work stream; an earlier panel's on the copy stream, after
        the work that read the buffer last, the work stream waiting for it."""
        self.slabs += slot == "slab"
        out = self._buffer(slot, (r1 - r0, c1 - c0), F.dtype)
        if slot == "slab":
            upload_block(F, r0, r1, c0, c1, out, self.stream)
            return out
        read = self._read.pop(slot, None)
        if read is not None:
            self.copy_stream.wait_event(read)
        if self._written is not None:   # the earlier slabs' values are back in F
            self.copy_stream.wait_event(self._written)
        upload_block(F, r0, r1, c0, c1, out, self.copy_stream)
        ready = self.cp.cuda.Event(disable_timing=True)
        ready.record(self.copy_stream)
        self.stream.wait_event(ready)
        return out

    def release(self, slot) -> None:
        """The work queued so far is the last to read ``slot``'s buffer."""
        read = self.cp.cuda.Event(disable_timing=True)
        read.record(self.stream)
        self._read[slot] = read

    def download(self, S, F: np.ndarray, c0: int, c1: int) -> None:
        """The worked slab back into ``F[:, c0:c1]`` (queued: :meth:`finish`)."""
        isz = F.itemsize
        rt = self.cp.cuda.runtime
        self._flags.append(finite_check(S.dtype).enqueue(S, self.stream))
        rt.memcpy2DAsync(F.ctypes.data + c0 * isz, F.shape[1] * isz, S.data.ptr,
                         (c1 - c0) * isz, (c1 - c0) * isz, F.shape[0],
                         rt.memcpyDeviceToHost, self.stream.ptr)
        self._written = self.cp.cuda.Event(disable_timing=True)
        self._written.record(self.stream)

    def apply(self, S, j: int, rows: int, E, i0: int, k0: int, b: int, T) -> None:
        """As :meth:`NumpySlabs.apply`, the last product accumulated into the slab
        by cuBLAS (no temporary of the slab's size)."""
        cp = self.cp
        from cupy import cublas         # optional dependency, present with cupy
        with self.stream:
            V = _reflectors(cp, E, i0, k0, rows, b)
            W = cp.asarray(T).T @ (V.T @ S[j:j + rows])
            cublas.gemm("N", "N", V, W, out=S[j:j + rows], alpha=-1.0, beta=1.0)

    def factorize(self, S, c0: int, panels: list, nb: int) -> np.ndarray:
        with self.stream:
            Td = factorize_cupy(S[c0:], panels, nb, stream=self.stream)
        return Td.get(stream=self.stream)

    def finish(self) -> None:
        """Every queued copy done; the buffers given back to the device, not only
        to CuPy's pool: a slab buffer is most of the device, and a cached block
        that later small arrays are cut from stays taken as a whole until all of
        them are freed (the solves' uploads would find no room)."""
        try:
            self.copy_stream.synchronize()
            self.stream.synchronize()
        finally:
            self._buffers.clear()
            self._read.clear()
            self._written = None
            self.cp.get_default_memory_pool().free_all_blocks()

    def all_finite(self) -> bool:
        """Whether every slab sent back so far held finite values only (after
        :meth:`finish`)."""
        return not any(int(f.get(stream=self.stream)[0]) for f in self._flags)
