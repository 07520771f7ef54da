"""A dense front factorized through a device too small for it, in column slabs.

A host front (:mod:`scipy_gpuqr._engine.memory`: a dense front whose stage
does not fit the device) is assembled on the host. When even the front alone
does not fit, it still need not run on LAPACK: the blocked staircase QR of
:mod:`scipy_gpuqr._engine.dense_front` is left-looking over slabs of whole
panels, so only one slab of columns lies on the device at a time:

for each slab ``[c0, c1)`` (consecutive panels, or a block of the trailing
columns past ``min(fm, fn)``):

1. its columns ``F[:, c0:c1]`` are uploaded;
2. every earlier panel's reflectors (``V`` from the host front, where the
   earlier slabs left them, and its ``T``) are applied to them in order,
   ``C ← C - V Tᵀ (Vᵀ C)`` on the panel's active rows: the same updates, in the
   same order, that the right-looking factorization gives these columns;
3. the slab's own panels are factorized as a front of their own, its
   diagonal at ``(c0, c0)``: rows ``c0 ..`` of the slab with the panels moved
   by ``c0`` (the device dense path, panel kernel and cuBLAS);
4. the slab goes back to the host.

The result is the representation :class:`~scipy_gpuqr._engine.dense_front.DenseFront`
applies (V below each panel's diagonal, one ``T`` per panel), equal to
:func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`'s to rounding.
The extra traffic is the earlier panels' reflectors, uploaded once per later
slab: with slabs of ``w`` columns about ``fm · fn² / (2 w)`` elements.
:func:`factorize_in_slabs` is written against a small device interface
(:class:`NumpySlabs` runs it on the host for CI, :class:`CupySlabs` on a GPU).
"""

from __future__ import annotations

import logging

import numpy as np

from .dense_front import factorize_cupy, factorize_numpy

__all__ = ["slab_ranges", "slab_columns", "factorize_in_slabs", "NumpySlabs", "CupySlabs"]


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
    (the slab, one earlier panel's reflectors, the dense path's workspace; 10 %
    left for the allocator), or 0 when not even one panel fits."""
    fixed = (4 * fm * nb + 5 * nb * nb) * itemsize
    w = (0.9 * available - fixed) // ((fm + 2 * nb) * itemsize)
    return int(w) if w >= nb else 0


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
    for c0, c1, p0, p1 in slab_ranges(panels, F.shape[1], max(int(width), nb)):
        try:
            _one_slab(F, T, panels, nb, c0, c1, p0, p1, dev)
        except Exception as exc:        # noqa: BLE001 - redone on the host, see above
            if fallback is None or dev is fallback:
                raise
            if not isinstance(exc, MemoryError):
                logging.getLogger("scipy_gpuqr").warning(
                    "slab [%d, %d) of a %dx%d front failed on the device (%s: %s); it and the "
                    "rest run on the host", c0, c1, F.shape[0], F.shape[1],
                    type(exc).__name__, exc)
            dev = fallback
            _one_slab(F, T, panels, nb, c0, c1, p0, p1, dev)
    return T


def _one_slab(F, T, panels, nb, c0, c1, p0, p1, dev) -> None:
    """Slab ``[c0, c1)`` with panels ``p0 .. p1-1``: up, earlier reflectors, its
    panels, back into ``F`` (and their ``T``)."""
    S = dev.upload(np.ascontiguousarray(F[:, c0:c1]))
    for q in range(p0):                 # the earlier panels' reflectors, in order
        j, rows, b = panels[q]
        V = np.tril(F[j:j + rows, j:j + b], -1)
        V[np.arange(b), np.arange(b)] = 1
        dev.apply(S, j, rows, V, T[q, :b, :b])
    Tp = None
    if p1 > p0:                         # the slab's own panels, diagonal at (c0, c0)
        moved = [(j - c0, rows, b) for j, rows, b in panels[p0:p1]]
        Tp = dev.factorize(S, c0, moved, nb)
    F[:, c0:c1] = dev.download(S)
    if Tp is not None:
        T[p0:p1] = Tp


class NumpySlabs:
    """The slab operations on the host (the CI model of :class:`CupySlabs`);
    ``slabs`` counts the slabs worked on."""

    def __init__(self):
        self.slabs = 0

    def upload(self, a: np.ndarray) -> np.ndarray:
        self.slabs += 1
        return a.copy()

    def download(self, S: np.ndarray) -> np.ndarray:
        return S

    def apply(self, S, j: int, rows: int, V: np.ndarray, T: np.ndarray) -> None:
        """``C ← C - V Tᵀ (Vᵀ C)`` on rows ``[j, j+rows)`` of the slab."""
        C = S[j:j + rows]
        C -= V @ (T.T @ (V.T @ C))

    def factorize(self, S, c0: int, panels: list, nb: int) -> np.ndarray:
        """The slab's panels (``panels`` relative to ``(c0, c0)``); their ``T``."""
        return factorize_numpy(S[c0:], panels, nb)


class CupySlabs:
    """The slab operations on a CUDA device, on ``stream`` (synchronized per slab);
    ``slabs`` counts the slabs started there."""

    def __init__(self, cp, stream):
        self.cp, self.stream = cp, stream
        self.slabs = 0

    def upload(self, a: np.ndarray):
        self.slabs += 1
        out = self.cp.empty(a.shape, dtype=a.dtype)
        out.set(a, stream=self.stream)
        return out

    def download(self, S) -> np.ndarray:
        out = S.get(stream=self.stream)
        self.stream.synchronize()
        return out

    def apply(self, S, j: int, rows: int, V: np.ndarray, T: np.ndarray) -> None:
        cp = self.cp
        with self.stream:
            Vd, Td = cp.asarray(V), cp.asarray(T)
            C = S[j:j + rows]
            C -= Vd @ (Td.T @ (Vd.T @ C))

    def factorize(self, S, c0: int, panels: list, nb: int) -> np.ndarray:
        with self.stream:
            Td = factorize_cupy(S[c0:], panels, nb, stream=self.stream)
        return Td.get(stream=self.stream)
