"""A test helper: ``os.stat`` that records the paths it is asked for."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def counted_stats(monkeypatch):
    """Inside the block, ``os.stat`` records each path it is asked for in the
    list the block receives (for tests that count a code path's stats)."""
    stats = []
    real = os.stat

    def counted(path, *args, **kwargs):
        stats.append(str(path))
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "stat", counted)
    try:
        yield stats
    finally:
        monkeypatch.setattr(os, "stat", real)
