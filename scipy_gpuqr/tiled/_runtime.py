"""The executor of the tiled QR's tile DAG over several devices.

The manager (the calling thread) walks the tile columns and issues every
device its work in dependency order; devices run it asynchronously:

* a GPU (:class:`._gpu_device.GpuDevice`) enqueues on its own streams (a
  panel stream for T/E on the main device, a compute stream for UT/UE, a copy
  stream for incoming transfers), ordered across devices by CUDA events;
* the CPU (:class:`._cpu_device.HostDevice`) runs its tasks in order on one
  worker thread (LAPACK tile kernels and threaded BLAS), ordered with the
  others by futures and event synchronisation.

Step ``k`` (a look-ahead of one tile column, as in the paper's DAG, Fig. 3):

1. the main device's panel ``k`` (T and E of column ``k``) goes to every
   device that owns a column right of ``k + 1``;
2. the main device updates column ``k+1`` with panel ``k`` (UT, UE) on its
   look-ahead stream and factorizes panel ``k+1`` at once: when another
   device owns column ``k+1`` it sent rows ``k0:`` of it to the main device
   one step earlier, so this chain (the critical path) never waits on a
   transfer or on another device;
3. every device updates the rest of its columns with panel ``k``, the owner
   of column ``k+2`` that column first, which it then sends to the main
   device (the next step's look-ahead copy).

A :class:`Pending` is a value that another device may still be computing,
with what it takes to wait for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

__all__ = ["Pending", "Layout", "run_tiled_qr"]


class Pending:
    """A value plus what must complete before it can be read.

    Parameters
    ----------
    value : object, optional
        The value, when it exists already (a GPU array still being written).
    event : cupy.cuda.Event, optional
        Recorded after the last write of ``value`` on a GPU stream.
    future : concurrent.futures.Future, optional
        Produces the value on a CPU worker thread.
    """

    __slots__ = ("_value", "event", "future")

    def __init__(self, value=None, event=None, future=None):
        self._value = value
        self.event = event
        self.future = future

    def get(self):
        """The value; blocks until a CPU future has produced it."""
        if self.future is not None:
            return self.future.result()
        return self._value

    def wait_host(self):
        """Block the calling thread until the value is complete; return it."""
        value = self.get()
        if self.event is not None:
            self.event.synchronize()
        return value


@dataclasses.dataclass(frozen=True)
class Layout:
    """Shapes of the tiling: ``m x n`` in column tiles of width ``tile``."""

    m: int
    n: int
    tile: int
    dtype: Any = None

    @property
    def n_blocks(self) -> int:
        return -(-self.n // self.tile) if self.n else 0

    @property
    def n_panels(self) -> int:
        return -(-min(self.m, self.n) // self.tile) if min(self.m, self.n) else 0

    def cols(self, j: int) -> tuple[int, int]:
        return j * self.tile, min(self.n, (j + 1) * self.tile)


def _move(pending: Pending, src, dst) -> Pending:
    if src is dst:
        return pending
    return dst.receive(pending, src)


def run_tiled_qr(a, devices: Sequence[Any], owners: Sequence[int],
                 layout: Layout, want_q: bool, out_device):
    """Factorize ``a`` with column tiles distributed by ``owners``.

    Parameters
    ----------
    a : ndarray (NumPy or CuPy)
        The matrix, validated, of the working dtype; not modified.
    devices : sequence of device objects
        ``devices[0]`` is the main device.
    owners : sequence of int
        Owner (index into ``devices``) of each column tile; ``owners[0] == 0``.
    layout : Layout
    want_q : bool
        Also form the economic ``Q`` (on the main device).
    out_device : device object
        Where the results are assembled (the input's device).

    Returns
    -------
    R : array (m x n) on ``out_device``
    Q : array (m x min(m, n)) on ``out_device``, or None
    """
    main = devices[0]
    K = layout.n_panels
    nb = layout.n_blocks
    tile = layout.tile
    mine = [[j for j in range(nb) if owners[j] == d]
            for d in range(len(devices))]
    for d, dev in enumerate(devices):
        dev.load(a, layout, mine[d])

    def first_rest(k):
        """First column tile that step ``k``'s ordinary updates touch."""
        return k + 2 if k + 1 < K else k + 1

    # panel k goes to device d when d updates a column >= first_rest(k)
    last = [max(js) if js else -1 for js in mine]
    panels = [None] * K          # Pending panels on the main device
    recv = [dict() for _ in devices]
    # the main device keeps its own copy of the look-ahead column j (rows
    # (j-1)*tile:), so panel j-1 -> update of column j -> panel j never
    # leaves it; the owner sends the column one step early
    ahead = {}
    lookrows = {}
    if K:
        col0 = _move(devices[owners[0]].column(0, 0), devices[owners[0]], main)
        panels[0] = main.factor(col0, 0)
        if K > 1 and owners[1] != 0:
            o = devices[owners[1]]
            ahead[1] = _move(o.column(1, 0), o, main)
    try:
        for k in range(K):
            k0 = k * tile
            for d, dev in enumerate(devices):
                if d == 0 or last[d] >= first_rest(k):
                    recv[d][k] = _move(panels[k], main, dev)
            nxt = k + 1
            if nxt < K:
                o = owners[nxt]
                if o == 0:
                    main.update(recv[0][k], k0, [nxt], urgent=True)
                    col = main.column(nxt, nxt * tile)
                else:
                    buf = main.update_column(recv[0][k], ahead.pop(nxt))
                    lookrows[nxt] = buf
                    col = main.rows_of(buf, tile, None)
                panels[nxt] = main.factor(col, nxt * tile)
            fr = first_rest(k)
            for d, dev in enumerate(devices):
                rest = [j for j in mine[d] if j >= fr]
                # the column after next first: it is the next look-ahead
                if rest and rest[0] == fr and fr < K:
                    if len(rest) > 1 or d != 0:
                        dev.update(recv[d][k], k0, rest[:1])
                        rest = rest[1:]
                    if d != 0:
                        ahead[fr] = _move(dev.column(fr, (k + 1) * tile),
                                          dev, main)
                if rest:
                    dev.update(recv[d][k], k0, rest)
        # assemble R: rows above the panel from the owner (the row block just
        # above it from the main device's look-ahead copy), the panel's R block
        pieces = []
        for j in range(nb):
            dev = devices[owners[j]]
            j0 = j * tile
            own_rows = min(j0 - tile if j in lookrows else j0, layout.m)
            if own_rows > 0:
                pieces.append((j, 0, _move(dev.block_rows(j, 0, own_rows),
                                           dev, out_device)))
            if j in lookrows:
                pieces.append((j, j0 - tile, _move(
                    main.rows_of(lookrows[j], 0, tile), main, out_device)))
            if j < K:
                pieces.append((j, j0, _move(main.panel_r(panels[j]), main,
                                            out_device)))
        Q = None
        if want_q:
            Q = _move(main.form_q([recv[0][k] for k in range(K)], layout),
                      main, out_device)
        R = out_device.assemble_r(layout, pieces)
        for dev in devices:
            dev.finish()
        R = R.wait_host()
        if Q is not None:
            Q = Q.wait_host()
        return R, Q
    finally:
        for dev in devices:
            dev.close()
