"""One pinned buffer of fixed size through which a one-GPU factorization's
uploads go: R's maps, a stage's S entries and its records.

Pinning host memory (``cudaHostAlloc``) takes time in proportion to its size,
and CuPy's pinned pool gives a block back only for a request of its exact
size. A buffer per upload, sized to it, was pinned anew in each new process
and for each new pattern, on the call's own thread before its first launch
(tens of megabytes of records for a matrix of ten thousand columns). Through
:class:`UploadRing` every upload goes up in pieces of at most
:data:`RING_PIECE_BYTES` copied into one buffer of :data:`RING_BYTES`, whose
bytes are written again only once the stream passed the copy that read them
(an event per piece): the same block serves every stage, call and pattern of
the process, and it is pinned once, as soon as CUDA is up, on a thread of its
own (:func:`pin_ring_ahead`) while the call's thread loads its kernels.

The host then runs at most :data:`RING_BYTES` of uploads ahead of the
device's copies, which read them in stream order; a piece of one launch's
records waits only for copies enqueued before it, never for a kernel not yet
launched.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque

import numpy as np

__all__ = ["UploadRing", "RING_BYTES", "RING_PIECE_BYTES", "pin_ring_ahead", "ring_pinned"]

#: Bytes of a piece: one copy and one event at most; a piece of the ring is
#: written again once its copy is done.
RING_PIECE_BYTES = 4 << 20

#: Bytes of the ring (pinned once per process, then reused from CuPy's pinned
#: pool): as many pieces as may be in flight before the host waits. The host
#: may run this far ahead of the device's copies, which wait behind the
#: launches enqueued before them: enough records for a good share of a
#: factorization's launches, so that a host ahead of the device is seldom held
#: back.
RING_BYTES = 8 * RING_PIECE_BYTES


class UploadRing:
    """Host-to-device uploads through one pinned buffer, its parts reused in turn.

    Parameters
    ----------
    buf : ndarray of uint8
        The pinned buffer (1-D, contiguous).
    event : callable
        ``event()`` returns a new event (CuPy's ``cuda.Event``:
        ``record(stream)``, ``done``, ``synchronize()``).
    piece : int
        Bytes copied and marked by one event at most; small uploads share a
        piece, whose event is recorded once it holds ``piece`` bytes or the
        ring wraps.

    Notes
    -----
    The parts in flight form an arc of the buffer in the order they were
    taken (``pending``: start, end, event); a new part begins where the last
    ended (at the buffer's start when it would not fit before its end), so
    the parts it overlaps are the oldest ones, waited for first.
    """

    def __init__(self, buf: np.ndarray, event, *, piece: int = RING_PIECE_BYTES):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise ValueError("the ring's buffer is a 1-D uint8 array")
        self.buf = buf
        self.size = int(buf.size)
        self.piece = max(1, min(int(piece), self.size))
        self._event = event
        self.pos = 0
        self.pending = deque()          # (start, end, event), oldest first
        self._open = None               # [start, end) of the piece not yet marked
        #: times the ring went back to its start; copies waited for before their
        #: part was written again, and the seconds
        self.laps = 0
        self.waits = 0
        self.wait_seconds = 0.0

    def upload(self, dst, src: np.ndarray, stream) -> None:
        """``dst[:n] = src`` on ``stream`` (asynchronous), ``src`` a contiguous 1-D
        uint8 array of ``n`` bytes and ``dst`` a device byte array (its slices
        take ``set(host, stream=stream)``), in pieces copied through the ring."""
        n = int(src.size)
        i = 0
        while i < n:
            k = min(self.piece, n - i)
            a = self._claim(k, stream)
            seg = self.buf[a: a + k]
            seg[...] = src[i: i + k]
            dst[i: i + k].set(seg, stream=stream)
            self._mark(a, a + k, stream)
            i += k

    def _claim(self, n: int, stream) -> int:
        """The start of ``n`` free bytes (``n`` <= the piece), after waiting for the
        copies that still read them."""
        a = self.pos
        if a + n > self.size:               # the tail is skipped: its parts go first
            self._close(stream)
            while self.pending and self.pending[0][0] >= a:
                self._retire()
            a = 0
            self.laps += 1
        b = a + n
        while self.pending and self.pending[0][0] < b and self.pending[0][1] > a:
            self._retire()
        self.pos = b
        return a

    def _mark(self, a: int, b: int, stream) -> None:
        """``[a, b)`` was just copied: it joins the open piece, marked by an event
        once the piece holds :attr:`piece` bytes."""
        if self._open is None or self._open[1] != a:
            self._close(stream)
            self._open = [a, b]
        else:
            self._open[1] = b
        if self._open[1] - self._open[0] >= self.piece:
            self._close(stream)

    def _close(self, stream) -> None:
        """The open piece marked: an event after its copies."""
        if self._open is None:
            return
        ev = self._event()
        ev.record(stream)
        self.pending.append((self._open[0], self._open[1], ev))
        self._open = None

    def _retire(self) -> None:
        """Wait for the oldest part's copies (the caller's thread blocks without
        the GIL in CuPy's ``synchronize``)."""
        _, _, ev = self.pending.popleft()
        if not ev.done:
            t0 = time.perf_counter()
            ev.synchronize()
            self.waits += 1
            self.wait_seconds += time.perf_counter() - t0

    def settle(self, stream) -> None:
        """Mark the open piece (every copy then carries an event)."""
        self._close(stream)


def _pin(nbytes: int) -> None:
    import cupyx
    cupyx.empty_pinned((int(nbytes),), dtype=np.uint8)     # dropped: a free block of the pool


def _quiet_pin(nbytes: int) -> None:
    try:
        _pin(nbytes)
    except Exception:  # noqa: BLE001 - the call pins its ring itself
        pass


#: Makes :func:`pin_ring_ahead`'s look-up and start one step.
_PIN_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _pin_thread() -> threading.Thread:
    t = threading.Thread(target=_quiet_pin, args=(RING_BYTES,), name="gpuqr-pin-ring",
                         daemon=True)
    t.start()
    return t


def pin_ring_ahead() -> threading.Thread:
    """Pin the ring's :data:`RING_BYTES` once per process on a daemon thread
    (``gpuqr-pin-ring``) and leave them to CuPy's pinned pool as a free block,
    which the factorization's :func:`ring_pinned` then takes without pinning.

    Called where a call starts its kernels' prefetch, once CUDA is up: the
    pinning (about a millisecond a megabyte) then runs while the call's
    thread loads its kernels and reads its schedule. Needs CuPy and a CUDA
    context. Returns the thread (the same one on later calls).
    """
    with _PIN_LOCK:
        return _pin_thread()


pin_ring_ahead.cache_clear = _pin_thread.cache_clear


def ring_pinned(pinned) -> np.ndarray:
    """The ring's buffer from ``pinned(nbytes, dtype)`` (the device layer's pinned
    allocation), once the process' early pinning (:func:`pin_ring_ahead`), if
    started, is done: its block is then a free block of CuPy's pool of this
    size, and waiting for it costs at most what pinning anew would."""
    with _PIN_LOCK:
        started = _pin_thread.cache_info().currsize > 0
    if started:
        _pin_thread().join()
    return pinned(RING_BYTES, np.uint8)
