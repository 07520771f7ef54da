"""Concatenated integer ranges, the gather index of every layer of the package.

A CSC matrix's columns taken in another order, a block's rows, the entries of
a set of fronts: each is the concatenation of ``arange(s, e)`` over many
ranges, made here by one ``repeat`` and one ``arange`` instead of a Python loop.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ranges"]


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, e) for s, e in zip(starts, ends)])`` (ends >= starts), int64."""
    starts = np.asarray(starts, dtype=np.int64)
    lens = np.asarray(ends, dtype=np.int64) - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    # each range's first position, shifted by the lengths before it
    shift = starts - (np.cumsum(lens) - lens)
    return np.repeat(shift, lens) + np.arange(total, dtype=np.int64)
