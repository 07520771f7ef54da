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

:func:`split_steps` lists these steps as backend calls, each tagged with
the device whose streams it uses and the other devices' steps it needs;
:func:`run_split` walks them over a *backend* that does the arithmetic and
the copies: :class:`NumpySplit` on NumPy arrays (the simulated devices of
CI: every "device" owns its arrays, the transfers are copies),
:class:`~scipy_gpuqr._engine.gpu.split_front.CupySplit` on the GPUs, where
each call only enqueues on the device's streams, ordered by events. Either
one thread runs every step in order, or each device's steps run on a thread
of that device (the main device's on the calling thread), each step once
the steps it needs have run: the host calls of a front over ``k`` devices
are then shared by ``k`` threads instead of bounding one.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

import numpy as np
from scipy.linalg import get_lapack_funcs

from .dense_front import factor_panel_numpy

__all__ = ["run_split", "split_steps", "Step", "RING", "NumpySplit", "split_factorize_numpy",
           "block_rows", "local_columns"]


def block_rows(panels: list, nblk: int) -> np.ndarray:
    """Rows of each column block that the factorization reads or writes: block
    ``c`` takes the updates of panels ``≤ c`` (it is panel ``c``), whose active
    rows end where panel ``min(c, last)``'s do; below, the block stays as
    assembled (zero past the staircase), so copies between devices stop there."""
    if not panels:
        return np.zeros(nblk, dtype=np.int64)
    top = np.array([j + r for j, r, _ in panels], dtype=np.int64)
    return top[np.minimum(np.arange(nblk), len(top) - 1)]


def local_columns(owners, d: int, nb: int, fn: int) -> tuple:
    """Where device ``d`` keeps its blocks of ``nb`` columns (``owners``: the device
    of each) in its own array: ``({block: first column}, width)``, the blocks side
    by side in their order (the last block of a front of ``fn`` columns may be
    narrower)."""
    at, width = {}, 0
    for c in np.flatnonzero(np.asarray(owners) == d).tolist():
        at[c] = width
        width += min(fn, (c + 1) * nb) - c * nb
    return at, width


#: Panels whose reflectors the main device keeps at once (the CUDA backend's ring
#: of slots): panel ``p`` is factorized only once every device has received panel
#: ``p - RING`` (its slot is then free), a dependency between the devices' threads.
RING = 3


class Step(NamedTuple):
    """One call of a split front's backend: ``getattr(be, name)(*args)`` enqueued by
    ``device``'s thread once the steps ``needs`` (indices into the one-thread
    order, of other devices) have been."""

    device: int
    name: str
    args: tuple
    needs: tuple


def split_steps(panels: list, nb: int, fn: int, owners) -> list:
    """The steps of a split dense front in the one-thread order.

    Parameters
    ----------
    panels : list of (j, rows, b)
        The front's panels (``panels_of`` with width ``nb``).
    nb : int
        Columns per panel and per block.
    fn : int
        Columns of the front.
    owners : sequence of int
        Device of every block of ``nb`` columns (0: the main device).

    Returns
    -------
    list of Step
        Every backend call, in the order one thread enqueues them. A step's
        ``device`` is the device whose streams it enqueues on (the main
        device's chain and bulk, or another device's copies and updates);
        its ``needs`` are the earlier steps of other devices whose events it
        waits for: a panel sent after it was factorized, a look-ahead block
        updated after it came back, a panel factorized into a ring slot after
        every device received the slot's last panel, the end after every
        device's last step. Run per device in this order, each step after its
        needs, the steps make the same calls on the same data as in the
        one-thread order.
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
    steps, at = [], {}

    def add(d, name, args, key=None, needs=()):
        if key is not None:
            at[key] = len(steps)
        steps.append(Step(d, name, tuple(args), tuple(sorted(at[k] for k in needs))))

    def factor(p):
        q = p - RING
        add(0, "factor", (p,), ("factor", p),
            [("panel", q, d) for d in range(1, ndev) if q >= 0 and ("panel", q, d) in at])

    add(0, "setup", ())
    for d in range(1, ndev):
        add(d, "send_blocks", (d,))
    if P:
        factor(0)
    for p in range(P):
        for d in range(1, ndev):
            if last[d] >= p + 2:
                add(d, "send_panel", (p, d), ("panel", p, d), [("factor", p)])
        nxt = p + 1
        if nxt < nblk:
            back = [("back", nxt)] if owners[nxt] else []
            add(0, "lookahead", (p, nxt), needs=back)
            if nxt < P:
                factor(nxt)
        fr = p + 2
        for d in range(ndev):
            rest = [c for c in mine[d] if c >= fr]
            if not rest:
                continue
            if rest[0] == fr:
                add(d, "update", (d, p, [fr]))
                if d == 0:
                    add(0, "ready", (fr,))
                else:
                    add(d, "to_main", (d, fr), ("back", fr))
                rest = rest[1:]
            if rest:
                add(d, "update", (d, p, rest))
    # blocks never brought back as a look-ahead block (past the last panel's)
    for d in range(1, ndev):
        for c in mine[d]:
            if c >= P + 2:
                add(d, "to_main", (d, c), ("back", c))
    ends = [max((i for i, s in enumerate(steps) if s.device == d), default=-1)
            for d in range(ndev)]
    steps.append(Step(0, "finish", (), tuple(sorted(i for i in ends[1:] if i >= 0))))
    return steps


def run_split(be, panels: list, nb: int, fn: int, owners, workers=None) -> list:
    """The steps of a split dense front (:func:`split_steps`) over the backend ``be``.

    Parameters
    ----------
    be : backend
        ``setup()``, ``send_blocks(d)``, ``factor(p)``, ``send_panel(p, d)``,
        ``lookahead(p, c)``, ``update(d, p, blocks)``, ``to_main(d, c)``,
        ``ready(c)``, ``finish()`` (see :class:`NumpySplit`).
    panels : list of (j, rows, b)
        The front's panels (``panels_of`` with width ``nb``).
    nb : int
        Columns per panel and per block.
    fn : int
        Columns of the front.
    owners : sequence of int
        Device of every block of ``nb`` columns (0: the main device).
    workers : sequence of Executor, optional
        ``workers[d]`` (``d ≥ 1``; ``workers[0]`` is not used) runs device
        ``d``'s steps (``submit``, as :class:`concurrent.futures.Executor`),
        while the calling thread runs the main device's: each device's share
        is enqueued by a thread of its own, so a front over ``k`` devices does
        not cost one thread the host calls of all ``k``. A step waits (on the
        host) until the steps it needs have been run by their threads, so
        every event it waits for has been recorded. None: the calling thread
        runs every step in the one-thread order.

    Returns
    -------
    list of (float, float)
        Per device, the seconds its thread spent on its steps and, of them,
        waiting for other devices' steps (zero waits without ``workers``).
    """
    steps = split_steps(panels, nb, fn, owners)
    ndev = max((s.device for s in steps), default=0) + 1
    if workers is None or ndev == 1:
        t0 = time.perf_counter()
        for s in steps:
            getattr(be, s.name)(*s.args)
        return [(time.perf_counter() - t0, 0.0)] + [(0.0, 0.0)] * (ndev - 1)
    if len(workers) < ndev:
        raise ValueError(f"{len(workers)} workers for {ndev} devices")
    order = [[] for _ in range(ndev)]       # per device: (step, needs as (device, count))
    pos = []
    for s in steps:
        pos.append((s.device, len(order[s.device])))
        need = {}
        for i in s.needs:
            d, k = pos[i]
            need[d] = max(need.get(d, 0), k + 1)
        order[s.device].append((s, tuple(need.items())))
    prog = _Progress(ndev)
    times = [(0.0, 0.0)] * ndev

    def loop(d):
        t0, waited = time.perf_counter(), 0.0
        try:
            for s, need in order[d]:
                if need:
                    tw = time.perf_counter()
                    prog.wait(need)
                    waited += time.perf_counter() - tw
                getattr(be, s.name)(*s.args)
                prog.advance(d)
        except BaseException:
            prog.fail()
            raise
        finally:
            times[d] = (time.perf_counter() - t0, waited)

    futures = [workers[d].submit(loop, d) for d in range(1, ndev)]
    errors = []
    try:
        loop(0)
    except _Stopped:
        pass
    except BaseException as exc:    # noqa: BLE001 - raised below, once every worker ended
        errors.append(exc)
    for fut in futures:             # every worker ends: a failure wakes the waiting ones
        try:
            fut.result()
        except _Stopped:
            pass
        except BaseException as exc:    # noqa: BLE001 - raised below
            errors.append(exc)
    if errors:
        raise errors[0]
    return times


class _Stopped(Exception):
    """Another device's thread failed: this one stops waiting."""


class _Progress:
    """How many of its steps each device's thread has run; a thread waits for a
    count of another's, and is woken only when that count is reached (or a
    thread failed): no wake-ups of every waiting thread at every step, each
    of which would take the interpreter's lock from the threads enqueueing."""

    def __init__(self, ndev: int):
        self.lock = threading.Lock()
        self.done = [0] * ndev
        self.waiting = [[] for _ in range(ndev)]    # device -> (count, event) waited for
        self.failed = False

    def advance(self, d: int) -> None:
        ready = ()
        with self.lock:
            n = self.done[d] = self.done[d] + 1
            w = self.waiting[d]
            if w:
                ready = [ev for k, ev in w if k <= n]
                self.waiting[d] = [(k, ev) for k, ev in w if k > n]
        for ev in ready:
            ev.set()

    def wait(self, need) -> None:
        """Until device ``d`` has run ``count`` steps for every ``(d, count)`` of
        ``need`` (raises :class:`_Stopped` once a thread failed)."""
        for d, k in need:
            while True:
                with self.lock:
                    if self.failed:
                        raise _Stopped
                    if self.done[d] >= k:
                        break
                    ev = threading.Event()
                    self.waiting[d].append((k, ev))
                ev.wait()

    def fail(self) -> None:
        with self.lock:
            self.failed = True
            evs = [ev for w in self.waiting for _, ev in w]
            self.waiting = [[] for _ in self.waiting]
        for ev in evs:
            ev.set()


class NumpySplit:
    """The backend of :func:`run_split` on NumPy arrays (LAPACK panels, as
    :func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`).

    Every device other than the main one holds its blocks in an array of
    its own (``fm × its columns``), filled by :meth:`send_blocks` and copied
    back block by block (:meth:`to_main`); the panel's reflectors and ``T``
    are copied to it (:meth:`send_panel`). ``log`` records the transfers
    ``(what, device, index, elements)`` (in the order the threads ran them
    when the devices' steps run on workers). A device's arrays are touched
    by its own steps only, and the front's columns of another device's
    blocks by that device's :meth:`send_blocks` and :meth:`to_main` and then
    by the main device's steps that need them, so the steps may run on one
    thread per device.

    ``on_panel``, where set, is called as ``on_panel(p, None)`` on the main
    device's thread once panel ``p`` is factorized: every column of block
    ``p`` of the front is then final (later steps write only later blocks).
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
        #: ``on_panel(p, None)`` after panel ``p`` is factorized (None: nothing)
        self.on_panel = None

    def _cols(self, c):
        return c * self.nb, min(self.fn, (c + 1) * self.nb)

    def setup(self) -> None:
        pass

    def send_blocks(self, d: int) -> None:
        at, width = local_columns(self.owners, d, self.nb, self.fn)
        loc = np.empty((self.fm, width), dtype=self.F.dtype)
        moved = 0
        for c in at:
            a, b = self._cols(c)
            r = int(self.need[c])
            loc[:r, at[c]:at[c] + b - a] = self.F[:r, a:b]
            moved += r * (b - a)
        self.local[d], self.col_of[d] = loc, at
        self.log.append(("blocks", d, len(at), moved))

    def factor(self, p: int) -> None:
        j, rows, b = self.panels[p]
        V, Tp = factor_panel_numpy(self.F, j, rows, b, self.geqrf)
        self.T[p, :b, :b] = Tp
        self.V[p] = (V, Tp)
        if self.on_panel is not None:       # block p's columns are final now
            self.on_panel(p, None)

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


def split_factorize_numpy(F: np.ndarray, panels: list, nb: int, owners, workers=None):
    """Blocked staircase QR of ``F`` in place, its column blocks on ``owners``
    (simulated devices; ``workers`` as :func:`run_split`'s); returns
    ``(T, log)`` (``T`` as
    :func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`'s)."""
    be = NumpySplit(F, panels, nb, owners)
    run_split(be, panels, nb, F.shape[1], owners, workers=workers)
    return be.T, be.log
