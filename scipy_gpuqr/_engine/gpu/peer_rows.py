"""Rows of a home GPU's array lent to another GPU and taken back.

The solves of a multi-device factorization run the stages another GPU holds
on that GPU (:mod:`.replay_split` for ``Q``, :mod:`.trsolve` for ``R⁻¹``), on
a copy of the rows of the right-hand sides those stages read. A
:class:`PeerRows` moves them: ``lend`` gathers the rows on the home device,
copies the compact block to the lane's device and scatters it into the lane's
own array; ``take_back`` the other way for the rows the lane wrote. Neither
waits for a device: the two streams wait for each other by events. A block
one device's memory pool gave is written by the other device's stream only
after that stream waited for the giving stream's work queued so far (CuPy's
pool reuses a freed block on the stream that freed it, in that stream's
order).
"""

from __future__ import annotations

import numpy as np

from . import array_ops

__all__ = ["PeerRows"]


class PeerRows:
    """Rows moved between a home GPU's array and a lane GPU's.

    Parameters
    ----------
    device_id : int
        The lane's GPU.
    home : int
        The home GPU.
    stream : cupy.cuda.Stream
        The lane's stream (on ``device_id``).
    home_stream : cupy.cuda.Stream or None
        The home work's stream (None: the home device's current stream at
        each move).
    rows : dict
        key → ``(lent, taken)``: the rows lent to the lane and those taken
        back (int64 arrays; uploaded to both devices once, the same array
        once for both).
    cp : module, optional
        CuPy (default: imported; a stand-in in the CPU tests).
    """

    def __init__(self, device_id, home, stream, home_stream, rows, cp=None):
        if cp is None:
            import cupy as cp
        self.cp = cp
        self.id, self.home = int(device_id), int(home)
        self.stream, self.home_stream = stream, home_stream
        self.rows = {}
        hs = self._home_stream()
        for key, pair in rows.items():      # each on the stream that reads it
            both = []
            for r in pair:
                if both and r is pair[0]:   # the rows lent are those taken back: once
                    both.append(both[0])
                    continue
                r = np.asarray(r, dtype=np.int64)
                with cp.cuda.Device(self.home), hs:
                    at_home = cp.asarray(r)
                with cp.cuda.Device(self.id), self.stream:
                    here = cp.asarray(r)
                both.append((at_home, here))
            self.rows[key] = both

    def _home_stream(self):
        if self.home_stream is not None:
            return self.home_stream
        with self.cp.cuda.Device(self.home):
            return self.cp.cuda.get_current_stream()

    def _wait(self, waiter, waiter_device, stream, device) -> None:
        """``waiter`` (of ``waiter_device``) waits for the work queued on ``stream``
        (of ``device``) so far."""
        cp = self.cp
        with cp.cuda.Device(device):
            ev = cp.cuda.Event(block=False, disable_timing=True)
            ev.record(stream)
        with cp.cuda.Device(waiter_device):
            waiter.wait_event(ev)

    def lend(self, X, key):
        """The lane's array (X's shape, on its GPU) holding X's rows ``lent`` of
        ``key`` (its other rows not set)."""
        cp = self.cp
        at_home, here = self.rows[key][0]
        hs = self._home_stream()
        with cp.cuda.Device(self.home), hs:
            part = array_ops.take_rows(X, at_home)
        with cp.cuda.Device(self.id), self.stream:
            got = cp.empty(part.shape, dtype=part.dtype)
            Xd = cp.empty(X.shape, dtype=X.dtype)
        self._wait(hs, self.home, self.stream, self.id)
        with cp.cuda.Device(self.home):
            got.data.copy_from_device_async(part.data, part.nbytes, hs)
        self._wait(self.stream, self.id, hs, self.home)
        with cp.cuda.Device(self.id), self.stream:
            array_ops.put_rows(Xd, here, got)
        return Xd

    def take_back(self, Xd, key, X) -> None:
        """The lane's rows ``taken`` of ``key`` put in X (later home work waits)."""
        cp = self.cp
        at_home, here = self.rows[key][1]
        hs = self._home_stream()
        with cp.cuda.Device(self.id), self.stream:
            part = array_ops.take_rows(Xd, here)
        with cp.cuda.Device(self.home), hs:
            got = cp.empty(part.shape, dtype=part.dtype)
        self._wait(self.stream, self.id, hs, self.home)
        with cp.cuda.Device(self.id):
            got.data.copy_from_device_async(part.data, part.nbytes, self.stream)
        self._wait(hs, self.home, self.stream, self.id)
        with cp.cuda.Device(self.home), hs:
            array_ops.put_rows(X, at_home, got)
