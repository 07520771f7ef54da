"""A retiring stage's front pool, device → host, while the stage's launches run.

A staged factorization sends every stage's front pool but the last to the
host (``Q`` replays from it, the device needs the room for the next stage).
Sent after the stage's last launch, the copy sits on the critical path, and
R's values and the contribution blocks crossing to later stages travel a
second time. Here the fronts go down as they become final, on the copy
stream behind an event of the launch that finished them, straight into the
pinned host pool; R's values and the crossing blocks are then read from that
host pool (the caller's job). The carried contribution blocks after the
fronts (read by the stage's Pack-Assemble only) do not go down.

Finality: a stage's fronts lie in its pool in postorder (``foff``), the
carried contribution blocks after them. Front ``f``'s values are final once
no later launch writes them: its own tasks (every type but Pack-Assemble
names the front it writes), the Pack-Assemble of its children (it writes
``f``) and of ``f`` itself (it only reads the child; counted to be safe), and
a dense front's factorization up to the launch that joins it
(:func:`front_finality`). A front is sent once final, whatever the fronts
before it in the pool: one front of a late subtree early in postorder would
otherwise hold back every front after it. Fronts final together go as runs
of adjacent ones; a gap of a few fronts not final yet is sent with them and
again once they are (the copies run in order).

Blocks for a later host stage's pool (:meth:`_FrontCopy.attach`) go on the
copy stream too, each once its front was sent: attached before the launches
(the host stage's pool ready by then), right after their front's send, so
that they land while the stage runs and the host stage's assembly of them
(told through ``on_placed``) runs beside it; attached once every launch is
enqueued, those of fronts already sent at once, the others right after the
last send.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._schedule.tasks import record_launches
from .rcopy import whole_front_writes

__all__ = ["FrontFinality", "front_finality", "CupyPoolCopy", "NumpyPoolCopy",
           "MIN_RANGE_BYTES", "MERGE_GAP", "UPPER_ROWS", "upper_pieces",
           "place_upper"]

#: Fronts are sent once this many bytes became final since the last send
#: (fewer, larger copies; the rest goes after the last launch).
MIN_RANGE_BYTES = 64 << 20

#: Elements of fronts not final yet sent between two final runs, which then
#: go as one copy (the gap goes again once final).
MERGE_GAP = 1 << 15

@dataclass(frozen=True)
class FrontFinality:
    """Where a stage's fronts lie in its pool and when each is final.

    Attributes
    ----------
    start, end : ndarray of int64
        Each front's elements ``[start, end)`` of the pool, in pool order
        (fronts not in the pool, or empty, left out).
    last : ndarray of int64
        The launch after which the front is final (0 for a front no launch
        writes: it is final once the stage began).
    """

    start: np.ndarray
    end: np.ndarray
    last: np.ndarray


def front_finality(fs, stage) -> FrontFinality:
    """Each front of a stage whose records are known (:attr:`~StageSchedule.tasks`):
    its place in the pool and the launch after which it is final (see the
    module notes)."""
    first, last = (int(x) for x in stage.fronts)
    nl = int(stage.nlaunch)
    members = np.arange(first, last + 1)
    foff = np.asarray(stage.foff, dtype=np.int64)[first:last + 1]
    size = fs.fm[first:last + 1].astype(np.int64) * fs.fn[first:last + 1].astype(np.int64)
    t = stage.tasks
    if nl:
        whole = whole_front_writes(fs, stage, record_launches(stage.launch_ptr),
                                   t["type"].astype(np.int64), t["front"].astype(np.int64),
                                   np.ones(len(t), dtype=bool))[members]
    else:
        whole = np.zeros(len(members), dtype=np.int64)
    keep = (foff >= 0) & (size > 0)
    order = np.argsort(foff[keep], kind="stable")
    start = foff[keep][order]
    lastw = np.clip(whole[keep][order], 0, max(nl - 1, 0))
    return FrontFinality(start, start + size[keep][order], lastw)


def _runs(start: np.ndarray, end: np.ndarray, gap: int) -> list:
    """``[start, end)`` ranges (any order) merged where they touch or lie at most
    ``gap`` elements apart: ``[(a, b), ...]`` in pool order."""
    order = np.argsort(start, kind="stable")
    out = []
    for a, b in zip(start[order].tolist(), end[order].tolist()):
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class _FrontCopy:
    """The fronts of a pool sent once final (see the module notes): after each
    launch those it left final, once :data:`MIN_RANGE_BYTES` of them are
    waiting; after the last launch the rest. ``copies``: the sends made;
    ``placed``: the blocks placed into later host stages' pools."""

    def __init__(self, final: FrontFinality, itemsize: int, min_bytes: int):
        self.final = final
        self.order = np.argsort(final.last, kind="stable")
        self.next = 0
        self.waiting = []
        self.waiting_elems = 0
        self.min_elems = max(int(min_bytes) // int(itemsize), 1)
        self.copies = 0
        #: elements not final yet sent between two final runs (:data:`MERGE_GAP`;
        #: 0 for a mapped pool, whose chunks not mapped yet must not be read)
        self.gap = MERGE_GAP
        self.sent = np.zeros(len(final.start), dtype=bool)    # per front (pool order)
        self.extras = {}                # front (pool order) -> blocks to place after it
        self.placed = 0
        #: called ``on_placed(items, landed)`` with the ``(block, out)`` placed since
        #: the last call and what their copies' landing waits for (:meth:`tell`)
        self.on_placed = None
        self._untold = []

    def attach(self, front_start: int, block, out) -> None:
        """Place ``block`` (``(start, m, w, n, at)`` as :func:`place_upper` takes
        it) of the front at ``front_start`` into ``out`` (a later host stage's
        pool), with every launch enqueued: at once on the copy stream where
        that front was sent (the block was final with it, and the copy stream
        waited for that), else right after the last send."""
        i = int(np.searchsorted(self.final.start, int(front_start)))
        if i >= len(self.final.start) or int(self.final.start[i]) != int(front_start):
            raise ValueError(f"attach: no front at {front_start} in the pool")
        if self.sent[i]:
            self._put(block, out)
        else:
            self.extras.setdefault(i, []).append((block, out))

    def _put(self, block, out) -> None:
        self._place(block, out)
        self.placed += 1
        self._untold.append((block, out))

    def tell(self) -> None:
        """``on_placed`` told of the blocks placed since it last was, with an
        event after their copies (None where they are done already): a host
        stage's assembly of them may start once it has passed, while the
        device works on. Each send that places blocks tells; so does the
        caller after attaching blocks of fronts sent already."""
        items, self._untold = self._untold, []
        if items and self.on_placed is not None:
            self.on_placed(items, self._landed())

    def _landed(self):
        return None

    def landed(self):
        """What a reader of the host pool waits for before it reads what was sent
        so far (an event after the copies; None where they are done)."""
        return self._landed()

    def _take(self, L) -> None:
        fin, order = self.final, self.order
        k = self.next
        while k < len(order) and (L is None or fin.last[order[k]] <= L):
            i = int(order[k])
            self.waiting.append(i)
            self.waiting_elems += int(fin.end[i] - fin.start[i])
            k += 1
        self.next = k

    def _flush(self) -> None:
        if not self.waiting:
            return
        idx = np.asarray(self.waiting, dtype=np.int64)
        self.waiting, self.waiting_elems = [], 0
        self._copy(_runs(self.final.start[idx], self.final.end[idx], self.gap))
        self.copies += 1
        self.sent[idx] = True
        for i in idx.tolist():
            for block, out in self.extras.pop(i, ()):
                self._put(block, out)
        self.tell()

    def after_launch(self, L: int) -> None:
        """Launch ``L`` was enqueued: send what it leaves final, if enough."""
        self._take(int(L))
        if self.waiting_elems >= self.min_elems:
            self._flush()

    def send_final(self, L: int) -> None:
        """Every front final by launch ``L`` sent now, however few bytes (a
        mapped pool's chunks are unmapped once their fronts went)."""
        self._take(int(L))
        self._flush()

    def launches_done(self) -> None:
        """Every launch is enqueued: the rest goes after the last one."""
        self._take(None)
        self._flush()


class CupyPoolCopy(_FrontCopy):
    """The pool's fronts sent on the device's copy stream into a pinned host
    array, each run behind an event recorded after the launch that made it
    final; nothing blocks until :meth:`result`.

    Parameters
    ----------
    device : CupyDevice
        Its ``stream`` runs the launches, its ``copy_stream`` the copies.
    pool : cupy.ndarray
        The stage's front pool.
    host : ndarray
        Pinned host memory of the pool's size and dtype.
    final : FrontFinality
        :func:`front_finality` of the stage.
    min_bytes : int
        Smallest send before the last launch.
    """

    def __init__(self, device, pool, host, final, min_bytes: int = MIN_RANGE_BYTES):
        super().__init__(final, pool.dtype.itemsize, min_bytes)
        self.dev, self.pool, self.host = device, pool, host

    def _copy(self, runs) -> None:
        cp = self.dev.cp
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(self.dev.stream)
        cs = self.dev.copy_stream
        cs.wait_event(ev)
        rt = cp.cuda.runtime
        isz = self.pool.dtype.itemsize
        src, dst = self.pool.data.ptr, self.host.ctypes.data
        for a, b in runs:           # not blocking: the launch loop goes on
            rt.memcpyAsync(dst + a * isz, src + a * isz, (b - a) * isz,
                           rt.memcpyDeviceToHost, cs.ptr)

    def _place(self, block, out) -> None:
        place_upper(self.dev, self.pool, [block], out, stream=self.dev.copy_stream)

    def _landed(self):
        ev = self.dev.cp.cuda.Event(disable_timing=True)
        ev.record(self.dev.copy_stream)
        return ev

    def result(self) -> np.ndarray:
        """Wait for the copies (the blocks placed with them too); the host pool."""
        self.dev.copy_stream.synchronize()
        self.pool = None
        return self.host

    def abort(self) -> None:
        """The stage failed: let the copies in flight end before their memory goes."""
        try:
            self.dev.copy_stream.synchronize()
        finally:
            self.pool = self.host = None


class NumpyPoolCopy(_FrontCopy):
    """:class:`CupyPoolCopy` for the NumPy layer: the fronts each launch leaves
    final copied at once after it ran (``min_bytes`` 1 by default), so a front copied before it is final
    differs from the pool in the tests; the elements never sent (the carried
    blocks) are NaN, so that a read of them shows."""

    def __init__(self, pool, final, min_bytes: int = 1):
        super().__init__(final, pool.dtype.itemsize, min_bytes)
        self.pool = pool
        self.host = np.full_like(pool, np.nan)

    def _copy(self, runs) -> None:
        for a, b in runs:
            self.host[a:b] = self.pool[a:b]

    def _place(self, block, out) -> None:
        place_upper(None, self.pool, [block], out)

    def result(self) -> np.ndarray:
        self.pool = None
        return self.host

    def abort(self) -> None:
        self.pool = self.host = None


#: Rows of one strided copy of a contribution block's upper trapezoid
#: (:func:`upper_pieces`): each piece takes its rows from its first row's
#: diagonal on, so it also sends the small triangle below the diagonal inside
#: the piece; fewer rows, more copy calls.
UPPER_ROWS = 256


def upper_pieces(blocks, rows: int = UPPER_ROWS) -> list:
    """The upper trapezoids of contribution blocks as strided pieces.

    Parameters
    ----------
    blocks : iterable of (int, int, int, int, int)
        Per block ``(start, m, w, n, at)`` as :class:`~.stage_loop._Placing` takes them: ``m``
        rows of ``w`` elements, ``n`` apart from ``start`` in the pool, going to
        ``out[at:]`` row after row (``w`` apart).
    rows : int
        Rows per piece.

    Returns
    -------
    list of (int, int, int, int, int, int)
        ``(source, height, width, source pitch, target, target pitch)``: rows
        ``[r0, r1)`` of a block from its column ``r0`` on. Together they cover
        every entry ``(i, j)``, ``j >= i``, of each block, the only entries a
        parent's Pack-Assemble reads of it (``nfrows`` 1); rows past ``w``
        hold none.
    """
    out = []
    step = max(int(rows), 1)
    for a, m, w, n, at in blocks:
        a, m, w, n, at = int(a), int(m), int(w), int(n), int(at)
        for r0 in range(0, min(m, w), step):
            r1 = min(m, w, r0 + step)
            out.append((a + r0 * n + r0, r1 - r0, w - r0, n, at + r0 * w + r0, w))
    return out


def place_upper(device, pool, blocks, out, rows: int = UPPER_ROWS, stream=None):
    """Contribution blocks of a stage's pool copied into a later host stage's
    pool ``out``, their upper trapezoids only (``blocks`` and the pieces as
    :func:`upper_pieces` has them): below its diagonal a block holds Householder
    vectors, which its parent never reads (and which go to the host with the
    pool), about half of a square block's bytes.

    ``device``: a CUDA layer (one strided copy per piece into pinned ``out``;
    on its stage ``stream``, then returns the event to wait for before
    ``out`` is read there; or on ``stream``, whose own synchronization
    covers the copies: returns None) or a NumPy one (copied
    at once; the block's entries not copied are set to NaN, so that a read of
    them shows; returns None).
    """
    pieces = upper_pieces(blocks, rows)
    isz = pool.itemsize
    for s, h, w, sp, d, dp in pieces:
        if s + (h - 1) * sp + w > pool.size or d + (h - 1) * dp + w > out.size:
            raise ValueError("place_upper: a piece past its pool's end")
    cp = getattr(device, "cp", None)
    if cp is None:
        for a, m, w, n, at in blocks:
            if m and w:
                out[int(at): int(at) + int(m) * int(w)] = np.nan
        flat = out.reshape(-1)
        for s, h, w, sp, d, dp in pieces:
            src = np.lib.stride_tricks.as_strided(pool[s:], shape=(h, w), strides=(sp * isz, isz))
            dst = np.lib.stride_tricks.as_strided(flat[d:], shape=(h, w), strides=(dp * isz, isz))
            dst[...] = src
        return None
    rt = cp.cuda.runtime
    on = device.stream if stream is None else stream
    src, dst, kind, sptr = pool.data.ptr, out.ctypes.data, rt.memcpyDeviceToHost, on.ptr
    for s, h, w, sp, d, dp in pieces:
        rt.memcpy2DAsync(dst + d * isz, dp * isz, src + s * isz, sp * isz, w * isz, h, kind, sptr)
    if stream is not None:
        return None
    ev = cp.cuda.Event(disable_timing=True)
    ev.record(on)
    return ev
