"""A bounded least-recently-used table for the package's per-process caches.

The caches that keep a pattern's work for later calls in the same process (the
symbolic analyses, SuiteSparseQR's column orders) hold arrays whose sizes
vary by orders of magnitude: they are bounded by an entry count and by bytes,
the least recently used entries leaving first, and shared by the threads of a
call (one lock).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

__all__ = ["BoundedLRU"]


class BoundedLRU:
    """A thread-safe table ``key -> value`` bounded by entries and bytes.

    Parameters
    ----------
    max_entries : int
        Most entries kept.
    max_bytes : int
        Most bytes kept, counted by ``size_of``; a value larger than this is
        not kept (a put of it only removes the key's old value).
    size_of : callable
        The bytes of a value (``size_of(value) -> int``).
    """

    def __init__(self, max_entries: int, max_bytes: int, size_of: Callable[[object], int]):
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._size_of = size_of
        self._lock = threading.Lock()
        self._d: OrderedDict = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._d

    def get(self, key):
        """The value of ``key`` (made the most recently used), or None where absent."""
        with self._lock:
            got = self._d.get(key)
            if got is None:
                return None
            self._d.move_to_end(key)
            return got[0]

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key`` (the least recently used leave while over a bound)."""
        size = int(self._size_of(value))
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes or self.max_entries <= 0:
                return
            self._d[key] = (value, size)
            self._bytes += size
            while len(self._d) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, s) = self._d.popitem(last=False)
                self._bytes -= s

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes = 0
