"""A stage's records made once, chunk by chunk, by whichever thread asks first.

A GPU engine's first call of a pattern runs a stage's launches while its
records are still being made: the launch loop needs the first launches'
records before the whole stage exists, and a worker makes the whole stage
meanwhile (kept for the next call and the plan file). :class:`RecordFill`
lets both share one array, the stage's final one: its launches are cut into
fixed chunks (:func:`launch_chunks`), and each chunk is made once, by the
first thread that takes it, into its place in that array. A thread that
needs a chunk another thread is making waits for it; a thread that needs a
chunk no one has taken makes it itself, so the first launch waits for one
small chunk only and the worker makes whatever the loop has not taken.
"""

from __future__ import annotations

import threading

import numpy as np

from .tasks import TASK_DTYPE

__all__ = ["RecordFill", "launch_chunks", "CHUNK", "CHUNK_LAUNCHES"]

#: Most records of a chunk of launches made at once (keeps a NumPy pass in cache).
CHUNK = 8192
#: Most launches of a chunk.
CHUNK_LAUNCHES = 32

_FREE, _TAKEN, _MADE = 0, 1, 2


def launch_chunks(launch_ptr) -> list:
    """Launch ranges ``(L0, L1)`` made at once: 1 launch, then twice as many each
    time, up to :data:`CHUNK_LAUNCHES` launches or :data:`CHUNK` records (a
    launch larger than that alone). The first launch comes after one launch's
    records; later chunks are large enough that a NumPy pass's overhead does
    not count.

    Parameters
    ----------
    launch_ptr : array of int
        Records of launch L are ``launch_ptr[L]:launch_ptr[L + 1]``.
    """
    lp = np.asarray(launch_ptr).tolist()
    nlaunch = len(lp) - 1
    out = []
    L0, want = 0, 1
    while L0 < nlaunch:
        L1 = L0 + 1
        while L1 < nlaunch and L1 - L0 < want and lp[L1 + 1] - lp[L0] <= CHUNK:
            L1 += 1
        out.append((L0, L1))
        L0, want = L1, min(2 * want, CHUNK_LAUNCHES)
    return out


class RecordFill:
    """The records of one stage, made chunk by chunk into one array (thread-safe).

    Parameters
    ----------
    make : callable
        ``make(L0, L1, out)`` writes the records of launches ``[L0, L1)`` into
        ``out`` (TASK_DTYPE, ``launch_ptr[L1] - launch_ptr[L0]`` records).
    launch_ptr : ndarray of int64
        The stage's launch pointers.

    Notes
    -----
    Every chunk is made at most once (a chunk whose making raised is free
    again). Chunks are cut when first asked for, and the array allocated then
    (its pages touched as the chunks are made).
    """

    def __init__(self, make, launch_ptr):
        self._make = make
        self._lp = launch_ptr
        self._cond = threading.Condition()
        self._chunks = None         # (L0, L1) of each chunk
        self._first = None          # first launch of each chunk (searchsorted)
        self._state = None          # bytearray: _FREE, _TAKEN or _MADE per chunk
        self._out = None            # the stage's records
        self._left = None           # chunks not made yet

    @property
    def chunks(self) -> list:
        """The chunks ``(L0, L1)`` in launch order."""
        with self._cond:
            self._setup()
            return self._chunks

    def done(self):
        """The stage's records once every chunk is made, else None."""
        with self._cond:
            return self._out if self._left == 0 else None

    def whole(self) -> np.ndarray:
        """Every record of the stage (the chunks no thread took made here, in
        launch order; those being made elsewhere waited for)."""
        self.range(0, len(self._lp) - 1)
        return self._out

    def range(self, L0: int, L1: int) -> np.ndarray:
        """The records of launches ``[L0, L1)``: a view of the stage's array, the
        chunks that cover them made first (here, or waited for)."""
        with self._cond:
            self._setup()
            if self._left == 0 or L1 <= L0:
                return self._out[self._lp[L0]:self._lp[L1]]
            k0 = int(np.searchsorted(self._first, L0, side="right")) - 1
            k1 = int(np.searchsorted(self._first, L1, side="left"))
        self._cover(k0, k1)
        return self._out[self._lp[L0]:self._lp[L1]]

    def _setup(self) -> None:
        """Cut the chunks and allocate the array, once (under the lock)."""
        if self._chunks is None:
            chunks = launch_chunks(self._lp)
            self._first = np.array([a for a, _ in chunks], dtype=np.int64)
            self._state = bytearray(len(chunks))
            self._out = np.empty(int(self._lp[-1]), dtype=TASK_DTYPE)
            self._left = len(chunks)
            self._chunks = chunks

    def _cover(self, k0: int, k1: int) -> None:
        """Chunks ``k0 … k1-1`` made: each free one taken and made here in order,
        then those other threads are making waited for."""
        state, cond = self._state, self._cond
        while True:
            with cond:
                k = state.find(_FREE, k0, k1)
                if k < 0:
                    if state.find(_TAKEN, k0, k1) < 0:
                        return
                    cond.wait()
                    continue
                state[k] = _TAKEN
            L0, L1 = self._chunks[k]
            try:
                self._make(L0, L1, self._out[self._lp[L0]:self._lp[L1]])
            except BaseException:
                with cond:
                    state[k] = _FREE
                    cond.notify_all()
                raise
            with cond:
                state[k] = _MADE
                self._left -= 1
                cond.notify_all()
