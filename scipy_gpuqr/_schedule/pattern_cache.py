"""Objects derived from a symbolic analysis, kept per sparsity pattern.

A schedule (:mod:`.sparse`) or R's layout (:mod:`scipy_gpuqr._engine.gpu.rlayout`)
depends on the analysis only, and analyses of one
:attr:`~scipy_gpuqr._symbolic.SymbolicAnalysis.pattern_key` are equal (the
analysis cache hands every caller a new object sharing one set of arrays).
So what is built from one analysis serves every later analysis of the same
key: a new ``QRFactorization`` of a known pattern finds the schedule and the
layout the first one built, as a ``refactor`` does.

:class:`PerPattern` keeps such objects in a bounded least-recently-used table
keyed by ``(pattern_key, key)`` (at most ``max_entries`` objects and
``max_bytes`` bytes, as reported by ``nbytes``, re-read at every insertion
since objects may grow after it, e.g. a lazily built schedule). An analysis
without a pattern key (made with ``cache=False``), or an object larger than
the byte bound, is kept per analysis *object* instead (a weak table: it lives
as long as that analysis).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable

__all__ = ["PerPattern"]


class PerPattern:
    """A bounded table ``(analysis pattern, key) -> object`` (thread-safe).

    Parameters
    ----------
    max_entries : int
        Most objects kept by pattern key.
    max_bytes : int
        Most bytes kept by pattern key (the least recently used leave first).
    nbytes : callable
        Bytes held by an object.
    """

    def __init__(self, max_entries: int, max_bytes: int, nbytes: Callable[[object], int]):
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._nbytes = nbytes
        self._lock = threading.Lock()
        self._lru: OrderedDict = OrderedDict()
        self._weak: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._lru)

    @staticmethod
    def _pkey(analysis):
        return getattr(analysis, "pattern_key", None)

    def get(self, analysis, key=None):
        """The object kept for ``analysis``'s pattern (or the object itself) and
        ``key``, or None."""
        pk = self._pkey(analysis)
        with self._lock:
            if pk is not None:
                hit = self._lru.get((pk, key))
                if hit is not None:
                    self._lru.move_to_end((pk, key))
                    return hit
            try:
                return self._weak.get(analysis, {}).get(key)
            except TypeError:           # not weak-referenceable: nothing kept
                return None

    def put(self, analysis, key, value) -> None:
        """Keep ``value`` for ``analysis``'s pattern and ``key``."""
        pk = self._pkey(analysis)
        size = int(self._nbytes(value)) if pk is not None else 0
        with self._lock:
            if pk is not None and size <= self.max_bytes and self.max_entries > 0:
                self._lru[(pk, key)] = value
                self._lru.move_to_end((pk, key))
                self._bound()
                return
            try:
                self._weak.setdefault(analysis, {})[key] = value
            except TypeError:
                pass

    def _bound(self) -> None:
        sizes = {k: int(self._nbytes(v)) for k, v in self._lru.items()}
        total = sum(sizes.values())
        while self._lru and (len(self._lru) > self.max_entries or total > self.max_bytes):
            k, _ = self._lru.popitem(last=False)
            total -= sizes[k]

    def clear(self, analysis=None) -> None:
        """Forget everything (None), or what is kept for ``analysis``: its
        object's entries and its pattern's."""
        with self._lock:
            if analysis is None:
                self._lru.clear()
                self._weak.clear()
                return
            pk = self._pkey(analysis)
            if pk is not None:
                for k in [k for k in self._lru if k[0] == pk]:
                    del self._lru[k]
            try:
                self._weak.pop(analysis, None)
            except TypeError:
                pass
