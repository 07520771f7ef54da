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
as long as that analysis). A table made with ``large_bytes`` also keeps one
*large* object by pattern: the last one put that is over the byte bound (or
grew past it in the table) but within ``large_bytes()``. R's layout of a
large problem is such an object: without that entry each new
``QRFactorization`` of the pattern, whose analysis is a new object, would
build it again while its launches run.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, Optional

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
    large_bytes : callable, optional
        ``large_bytes()``: the most bytes of the one large entry (read when an
        object becomes it); None: no large entry (objects over ``max_bytes``
        are kept per analysis object only).
    """

    def __init__(self, max_entries: int, max_bytes: int, nbytes: Callable[[object], int],
                 large_bytes: Optional[Callable[[], int]] = None):
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._nbytes = nbytes
        self._large_bytes = large_bytes
        self._lock = threading.Lock()
        self._lru: OrderedDict = OrderedDict()
        self._large = None              # ((pattern key, key), object) or None
        self._weak: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._making: dict = {}         # (pattern or object, key) -> lock of its make

    def __len__(self) -> int:
        """Objects kept by pattern (the large entry included)."""
        return len(self._lru) + (self._large is not None)

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
                if self._large is not None and self._large[0] == (pk, key):
                    return self._large[1]
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
                if self._large is not None and self._large[0] == (pk, key):
                    self._large = None
                self._lru[(pk, key)] = value
                self._lru.move_to_end((pk, key))
                self._bound()
                return
            if pk is not None and self._fits_large(size):
                self._lru.pop((pk, key), None)
                self._large = ((pk, key), value)
                return
            try:
                self._weak.setdefault(analysis, {})[key] = value
            except TypeError:
                pass

    def get_or_make(self, analysis, key, make: Callable[[], object]):
        """The object kept for ``analysis``'s pattern and ``key``, made by ``make()``
        and kept where there is none.

        One make per pattern and key at a time: a caller that finds another's
        make under way waits for it and takes its object, so that two threads
        asking at once (a call and the worker loading ahead for it) hold one
        object, not each their own with the later one kept.
        """
        hit = self.get(analysis, key)
        if hit is not None:
            return hit
        pk = self._pkey(analysis)
        slot = (("pattern", pk) if pk is not None else ("object", id(analysis)), key)
        with self._lock:
            making = self._making.setdefault(slot, threading.Lock())
        try:
            with making:
                hit = self.get(analysis, key)
                if hit is None:
                    hit = make()
                    self.put(analysis, key, hit)
                return hit
        finally:
            with self._lock:
                if self._making.get(slot) is making:
                    del self._making[slot]

    def _fits_large(self, size: int) -> bool:
        """Whether an object of ``size`` bytes may be the large entry."""
        return self._large_bytes is not None and size <= int(self._large_bytes())

    def _bound(self) -> None:
        sizes = {k: int(self._nbytes(v)) for k, v in self._lru.items()}
        for k in [k for k, n in sizes.items() if n > self.max_bytes]:
            value, n = self._lru.pop(k), sizes.pop(k)    # grew past the bound in the table
            if self._fits_large(n):
                self._large = (k, value)
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
                self._large = None
                self._weak.clear()
                return
            pk = self._pkey(analysis)
            if pk is not None:
                for k in [k for k in self._lru if k[0] == pk]:
                    del self._lru[k]
                if self._large is not None and self._large[0][0] == pk:
                    self._large = None
            try:
                self._weak.pop(analysis, None)
            except TypeError:
                pass
