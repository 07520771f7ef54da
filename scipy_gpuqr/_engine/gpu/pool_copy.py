"""A retiring stage's front pool, device → host, while the stage's launches run.

A staged factorization sends every stage's front pool but the last to the
host (``Q`` replays from it, the device needs the room for the next stage).
Sent after the stage's last launch, the copy sits on the critical path, and
R's values and the contribution blocks crossing to later stages travel a
second time. Here the pool goes down in ranges as they become final, on the
copy stream behind an event of the launch that finished them, straight into
the pinned host pool; R's values and the crossing blocks are then read from
that host pool (the caller's job).

Finality: a stage's fronts lie one after another in its pool (in postorder,
``foff``), the carried contribution blocks after them. Front ``f``'s values
are final once no later launch writes them: its own tasks (every type but
Pack-Assemble names the front it writes), the Pack-Assemble of its children
(it writes ``f``) and of ``f`` itself (it only reads the child; counted to be
safe), and a dense front's factorization up to the launch that joins it. A
running maximum over the fronts in pool order gives, after each launch, the
prefix of the pool that no later launch touches.
"""

from __future__ import annotations

import numpy as np

from .rcopy import launch_of_records, whole_front_writes

__all__ = ["pool_final", "CupyPoolCopy", "NumpyPoolCopy", "MIN_RANGE_BYTES"]

#: A range is sent once this many bytes became final since the last one
#: (fewer, larger copies; the rest goes after the last launch).
MIN_RANGE_BYTES = 64 << 20


def pool_final(fs, stage) -> np.ndarray:
    """Elements of a stage's front pool final after each of its launches.

    Parameters
    ----------
    fs : FrontStructure
        The analysis' fronts (``fm``, ``fn``, ``parent``).
    stage : StageSchedule
        A stage whose records are known (:attr:`~StageSchedule.tasks`).

    Returns
    -------
    ndarray of int64, shape (nlaunch,)
        ``pool[:out[L]]`` is final once launch ``L`` completed
        (nondecreasing; the last value is the pool's size, carried blocks
        included).
    """
    first, last = (int(x) for x in stage.fronts)
    nl = int(stage.nlaunch)
    size = int(stage.pool_size)
    out = np.full(nl, size, dtype=np.int64)
    if nl == 0:
        return out
    launch_of = launch_of_records(stage)
    t = stage.tasks
    # every record writes the front it names (Pack-Assemble: its parent too)
    whole = whole_front_writes(fs, stage, launch_of, t["type"].astype(np.int64),
                               t["front"].astype(np.int64), np.ones(len(t), dtype=bool))
    last_write = whole[first:last + 1]
    np.maximum.accumulate(last_write, out=last_write)
    # fronts [first, first + k) are final after launch L, k = #(running max <= L)
    k = np.searchsorted(last_write, np.arange(nl, dtype=np.int64), side="right")
    foff = np.asarray(stage.foff, dtype=np.int64)[first:last + 1]
    ends = np.concatenate((foff, [int(foff[-1] + int(fs.fm[last]) * int(fs.fn[last]))]))
    out[:] = ends[k]
    out[-1] = size
    return out


class CupyPoolCopy:
    """The pool's final ranges sent on the device's copy stream into a pinned
    host array, each behind an event recorded after the launch that made it
    final; nothing blocks until :meth:`result`.

    Parameters
    ----------
    device : CupyDevice
        Its ``stream`` runs the launches, its ``copy_stream`` the copies.
    pool : cupy.ndarray
        The stage's front pool.
    host : ndarray
        Pinned host memory of the pool's size and dtype.
    final : ndarray
        :func:`pool_final` of the stage.
    min_bytes : int
        Smallest range sent before the last launch.
    """

    def __init__(self, device, pool, host, final, min_bytes: int = MIN_RANGE_BYTES):
        self.dev, self.pool, self.host = device, pool, host
        self.final = final
        self.min_elems = max(int(min_bytes) // pool.dtype.itemsize, 1)
        self.issued = 0
        self.copies = 0

    def _send(self, cut: int) -> None:
        cp = self.dev.cp
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(self.dev.stream)
        cs = self.dev.copy_stream
        cs.wait_event(ev)
        a = self.issued
        # not blocking: CuPy's default waits for the copy, so for the launch
        self.pool[a:cut].get(stream=cs, out=self.host[a:cut], blocking=False)
        self.issued = cut
        self.copies += 1

    def after_launch(self, L: int) -> None:
        """Launch ``L`` was enqueued: send what it leaves final, if enough."""
        cut = int(self.final[L])
        if cut - self.issued >= self.min_elems:
            self._send(cut)

    def launches_done(self) -> None:
        """Every launch is enqueued: the rest goes after the last one."""
        if self.issued < self.pool.size:
            self._send(int(self.pool.size))

    def result(self) -> np.ndarray:
        """Wait for the copies; the host pool."""
        self.dev.copy_stream.synchronize()
        self.pool = None
        return self.host

    def abort(self) -> None:
        """The stage failed: let the copies in flight end before their memory goes."""
        try:
            self.dev.copy_stream.synchronize()
        finally:
            self.pool = self.host = None


class NumpyPoolCopy:
    """:class:`CupyPoolCopy` for the NumPy layer: each final range copied at once
    after its launch ran, so a range copied before it is final differs from
    the pool in the tests."""

    def __init__(self, pool, final):
        self.pool, self.final = pool, final
        self.host = np.empty_like(pool)
        self.issued = 0
        self.copies = 0

    def _send(self, cut: int) -> None:
        if cut > self.issued:
            self.host[self.issued:cut] = self.pool[self.issued:cut]
            self.issued = cut
            self.copies += 1

    def after_launch(self, L: int) -> None:
        self._send(int(self.final[L]))

    def launches_done(self) -> None:
        self._send(int(self.pool.size))

    def result(self) -> np.ndarray:
        self.pool = None
        return self.host

    def abort(self) -> None:
        self.pool = self.host = None
