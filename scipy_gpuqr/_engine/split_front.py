"""A dense front factorized over several devices: the steps, and their NumPy executor.

The plan (:class:`~scipy_gpuqr._schedule.dense_split.SplitPlan`) gives every
block of ``nb`` columns of the front an owner; the front itself stays on the
*main* device (device 0 of the split, where it was assembled) and the
factorization is the one-device dense path's (:mod:`.dense_front`) column
for column, so R, the reflectors below the diagonal, every panel's ``T``
and the contribution block end where that path leaves them:

* before the first panel, every other device receives its blocks (the rows
  the factorization touches, :func:`block_rows`);
* step ``p``: the main device factorizes panel ``p`` (block ``p``, already
  updated by panels ``0 … p-1``); its reflectors and ``T`` go to every device
  that still owns a block ``≥ p+2``; the main device applies panel ``p`` to
  block ``p+1`` (the *look-ahead*: block ``p+1`` is then ready for panel
  ``p+1`` without waiting for any other device), after the block's owner
  sent it back when that is another device; every device applies panel
  ``p`` to its blocks ``≥ p+2``, block ``p+2`` first, which its owner then
  sends to the main device (the next step's look-ahead block);
* after the last panel, blocks past the look-ahead come back.

:func:`run_split` walks these steps over a *backend* that does the
arithmetic and the copies: :class:`NumpySplit` on NumPy arrays (the
simulated devices of CI: every "device" owns its arrays, the transfers are
copies), :class:`~scipy_gpuqr._engine.gpu.split_front.CupySplit` on the
GPUs, where each call only enqueues on the device's streams, ordered by
events.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import get_lapack_funcs

from .dense_front import factor_panel_numpy

__all__ = ["run_split", "NumpySplit", "split_factorize_numpy", "block_rows"]


def block_rows(panels: list, nblk: int) -> np.ndarray:
    """Rows of each column block that the factorization reads or writes: block
    ``c`` takes the updates of panels ``≤ c`` (it is panel ``c``), whose active
    rows end where panel ``min(c, last)``'s do; below, the block stays as
    assembled (zero past the staircase), so copies between devices stop there."""
    if not panels:
        return np.zeros(nblk, dtype=np.int64)
    top = np.array([j + r for j, r, _ in panels], dtype=np.int64)
    return top[np.minimum(np.arange(nblk), len(top) - 1)]


def run_split(be, panels: list, nb: int, fn: int, owners) -> None:
    """The steps of a split dense front over the backend ``be``.

    Parameters
    ----------
    be : backend
        ``setup()``, ``factor(p)``, ``send_panel(p, d)``, ``lookahead(p, c)``,
        ``update(d, p, blocks)``, ``to_main(d, c)``, ``ready(c)``,
        ``finish()`` (see :class:`NumpySplit`).
    panels : list of (j, rows, b)
        The front's panels (``panels_of`` with width ``nb``).
    nb : int
        Columns per panel and per block.
    fn : int
        Columns of the front.
    owners : sequence of int
        Device of every block of ``nb`` columns (0: the main device).
    """
    owners = [int(o) for o in owners]
    nblk = len(owners)
    if nblk != -(-int(fn) // int(nb)):
        raise ValueError(f"{nblk} block owners for {fn} columns in blocks of {nb}")
    if nblk and (owners[0] != 0 or (nblk > 1 and owners[1] != 0)):
        raise ValueError("blocks 0 and 1 belong to the main device")
    ndev = max(owners, default=0) + 1
    mine = [[c for c in range(nblk) if owners[c] == d] for d in range(ndev)]
    last = [max(m) if m else -1 for m in mine]
    P = len(panels)
    be.setup()
    if P:
        be.factor(0)
    for p in range(P):
        for d in range(1, ndev):
            if last[d] >= p + 2:
                be.send_panel(p, d)
        nxt = p + 1
        if nxt < nblk:
            be.lookahead(p, nxt)
            if nxt < P:
                be.factor(nxt)
        fr = p + 2
        for d in range(ndev):
            rest = [c for c in mine[d] if c >= fr]
            if not rest:
                continue
            if rest[0] == fr:
                be.update(d, p, [fr])
                if d == 0:
                    be.ready(fr)
                else:
                    be.to_main(d, fr)
                rest = rest[1:]
            if rest:
                be.update(d, p, rest)
    # blocks never brought back as a look-ahead block (past the last panel's)
    for d in range(1, ndev):
        for c in mine[d]:
            if c >= P + 2:
                be.to_main(d, c)
    be.finish()


class NumpySplit:
    """The backend of :func:`run_split` on NumPy arrays (LAPACK panels, as
    :func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`).

    Every device other than the main one holds its blocks in an array of
    its own (``fm × its columns``), filled by :meth:`setup` and copied back
    block by block (:meth:`to_main`); the panel's reflectors and ``T`` are
    copied to it (:meth:`send_panel`). ``log`` records the transfers
    ``(what, device, index, elements)``.
    """

    def __init__(self, F: np.ndarray, panels: list, nb: int, owners):
        self.F, self.panels, self.nb = F, list(panels), int(nb)
        self.owners = np.asarray(owners, dtype=np.int64)
        self.fm, self.fn = F.shape
        self.ndev = int(self.owners.max()) + 1 if len(self.owners) else 1
        self.T = np.zeros((len(self.panels), nb, nb), dtype=F.dtype)
        self.V = {}                     # panel -> (V, T) on the main device
        self.recv = [dict() for _ in range(self.ndev)]      # device -> panel -> (V, T)
        self.local = [None] * self.ndev                      # device -> its columns
        self.col_of = [None] * self.ndev                     # device -> block -> local col
        self.log = []
        self.need = block_rows(self.panels, len(self.owners))
        self.geqrf, = get_lapack_funcs(("geqrf",), (F,))

    def _cols(self, c):
        return c * self.nb, min(self.fn, (c + 1) * self.nb)

    def setup(self) -> None:
        for d in range(1, self.ndev):
            blocks = np.flatnonzero(self.owners == d).tolist()
            at, width = {}, 0
            for c in blocks:
                a, b = self._cols(c)
                at[c] = width
                width += b - a
            loc = np.empty((self.fm, width), dtype=self.F.dtype)
            moved = 0
            for c in blocks:
                a, b = self._cols(c)
                r = int(self.need[c])
                loc[:r, at[c]:at[c] + b - a] = self.F[:r, a:b]
                moved += r * (b - a)
            self.local[d], self.col_of[d] = loc, at
            self.log.append(("blocks", d, len(blocks), moved))

    def factor(self, p: int) -> None:
        j, rows, b = self.panels[p]
        V, Tp = factor_panel_numpy(self.F, j, rows, b, self.geqrf)
        self.T[p, :b, :b] = Tp
        self.V[p] = (V, Tp)

    def send_panel(self, p: int, d: int) -> None:
        V, Tp = self.V[p]
        self.recv[d][p] = (V.copy(), Tp.copy())
        self.log.append(("panel", d, p, int(V.size + Tp.size)))

    @staticmethod
    def _apply(C, V, Tp) -> None:
        C -= V @ (Tp.T @ (V.T @ C))

    def lookahead(self, p: int, c: int) -> None:
        j, rows, b = self.panels[p]
        a, e = self._cols(c)
        V, Tp = self.V[p]
        self._apply(self.F[j:j + rows, a:e], V, Tp)

    def update(self, d: int, p: int, blocks) -> None:
        j, rows, b = self.panels[p]
        if d == 0:
            V, Tp = self.V[p]
            for c in blocks:
                a, e = self._cols(c)
                self._apply(self.F[j:j + rows, a:e], V, Tp)
            return
        V, Tp = self.recv[d][p]
        loc, at = self.local[d], self.col_of[d]
        first = at[blocks[0]]
        a, e = self._cols(blocks[-1])
        end = at[blocks[-1]] + e - a
        self._apply(loc[j:j + rows, first:end], V, Tp)

    def to_main(self, d: int, c: int) -> None:
        a, e = self._cols(c)
        at = self.col_of[d][c]
        r = int(self.need[c])
        self.F[:r, a:e] = self.local[d][:r, at:at + e - a]
        self.log.append(("back", d, c, r * (e - a)))

    def ready(self, c: int) -> None:
        pass

    def finish(self) -> None:
        self.V.clear()
        self.recv = [dict() for _ in range(self.ndev)]
        self.local = [None] * self.ndev


def split_factorize_numpy(F: np.ndarray, panels: list, nb: int, owners):
    """Blocked staircase QR of ``F`` in place, its column blocks on ``owners``
    (simulated devices); returns ``(T, log)`` (``T`` as
    :func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`'s)."""
    be = NumpySplit(F, panels, nb, owners)
    run_split(be, panels, nb, F.shape[1], owners)
    return be.T, be.log
