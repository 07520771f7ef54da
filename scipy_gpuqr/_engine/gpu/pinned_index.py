"""R copiers' gather indices kept in pinned host memory, per R layout.

Each R copier of a multi-device factorization first sends its stage's gather
index up (:class:`~.rcopy.CupyRCopy`; hundreds of millions of entries for an
upper stage of the largest problems). From pageable memory that costs a copy
into pinned memory on every call, on the copier's worker, before its first
range of R can go down (:func:`~.rcopy.upload_through_pinned`); a copy of
the index kept in pinned memory goes up in one asynchronous transfer instead.
The copies are kept with R's layout (:func:`kept_pinned_index`): freed with
it when its cache lets go of it, and bounded, at most
:data:`PINNED_INDEX_SHARE` of the host's physical memory per layout, the
least recently used let go of first. They are made at the end of the call
that first wanted them (:func:`keep_pinned_indices`), with the devices idle:
that call's copiers send their indices through pinned chunks. Indices up to
:data:`PINNED_INDEX_MIN_BYTES` are not kept (they go up in one copy).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

from ..._schedule.native import run_split

__all__ = ["kept_pinned_index", "keep_pinned_indices", "KeptIndices", "PINNED_INDEX_SHARE",
           "PINNED_INDEX_MIN_BYTES"]

#: Share of the host's physical memory that one layout's kept pinned indices may hold.
PINNED_INDEX_SHARE = 1 / 32
#: Smallest index (bytes) kept pinned: smaller ones go up in one copy anyway
#: (the staging slot's size, :data:`~.rcopy.SLOT_BYTES`).
PINNED_INDEX_MIN_BYTES = 32 << 20
#: Entries per thread of the copy into pinned memory.
PIN_COPY_PER_THREAD = 1 << 22


def _physical_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _pinned_empty(cp, shape, dtype) -> np.ndarray:
    """A NumPy array in its own pinned allocation (not CuPy's pinned pool, which
    would keep the block after it is let go of): freed once unreferenced;
    portable, as CuPy's own (pinned for every device's context)."""
    nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
    mem = cp.cuda.pinned_memory.PinnedMemoryPointer(
        cp.cuda.pinned_memory.PinnedMemory(nbytes, cp.cuda.runtime.hostAllocPortable), 0)
    return np.ndarray(shape, dtype=dtype, buffer=mem)


class KeptIndices:
    """One layout's pinned copies of gather indices, by key, within ``cap`` bytes.

    A copy is made once for a key (:meth:`make`) and found (:meth:`find`) while
    the index it was made from is the same array (held weakly: the layout's
    maps keep it); a new array for the key (the maps made again) replaces it.
    Thread-safe: the devices' copiers of one call ask at once.
    """

    def __init__(self, cap: int):
        self.cap = int(cap)
        self._lock = threading.Lock()
        self._kept = OrderedDict()      # key -> (weakref to the index, pinned copy)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return int(sum(p.nbytes for _, p in self._kept.values()))

    def find(self, key, index: np.ndarray):
        """The pinned copy of ``index`` kept for ``key``, else None."""
        with self._lock:
            hit = self._kept.get(key)
            if hit is None or hit[0]() is not index:
                return None
            self._kept.move_to_end(key)
            return hit[1]

    def make(self, key, index: np.ndarray, cp):
        """:meth:`find`, else a pinned copy of ``index`` made now where it fits within
        :attr:`cap` with the others (the least recently used let go of to make
        room), else None."""
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None and hit[0]() is index:
                self._kept.move_to_end(key)
                return hit[1]
            self._kept.pop(key, None)
            need = int(index.nbytes)
            if need > self.cap:
                return None
            held = sum(p.nbytes for _, p in self._kept.values())
            while self._kept and held + need > self.cap:
                held -= self._kept.popitem(last=False)[1][1].nbytes
            pin = _pinned_empty(cp, index.shape, index.dtype)

            def part(i0, i1):           # NumPy's copy releases the GIL
                np.copyto(pin[i0:i1], index[i0:i1])
            run_split(part, 0, len(index), PIN_COPY_PER_THREAD)
            self._kept[key] = (weakref.ref(index), pin)
            return pin


def _kept(layout):
    return layout.extra(("pinned gather indices",),
                        lambda: KeptIndices(PINNED_INDEX_SHARE * _physical_bytes()))


def _worth(index: np.ndarray) -> bool:
    return int(index.nbytes) > PINNED_INDEX_MIN_BYTES and index.flags.c_contiguous


def kept_pinned_index(layout, key, index: np.ndarray):
    """The pinned copy of ``index`` (a 1-D gather index of ``layout``'s maps) kept
    with ``layout`` for ``key`` (:func:`keep_pinned_indices`), or None.

    Parameters
    ----------
    layout : RLayout
        Keeps the copies (:meth:`~.rlayout.RLayout.extra`), freed with it.
    key : hashable
        Names the stage whose index it is.
    index : ndarray
        The index as the layout's maps hold it.
    """
    return _kept(layout).find(key, index) if _worth(index) else None


def keep_pinned_indices(wanted, cp) -> int:
    """Make the pinned copies of the indices ``wanted`` asked for (``(layout, key,
    index)`` each, :func:`kept_pinned_index` found none), once the devices are
    idle: pinning host memory stalls every thread that calls CUDA meanwhile,
    so a call's copiers only find copies, made at the end of the call before.
    Skips small indices (:data:`PINNED_INDEX_MIN_BYTES`), those that would pass
    their layout's share (:data:`PINNED_INDEX_SHARE`) alone, and stops where
    pinned memory cannot be had. Returns the bytes newly pinned."""
    made = 0
    for layout, key, index in wanted:
        if not _worth(index):
            continue
        kept = _kept(layout)
        if kept.find(key, index) is not None:
            continue
        try:
            pin = kept.make(key, index, cp)
        except (MemoryError, cp.cuda.runtime.CUDARuntimeError):
            break
        made += 0 if pin is None else int(pin.nbytes)
    return made
