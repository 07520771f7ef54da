"""A pinned host array seen from the device: kernels read it over the link.

Under unified addressing a page-locked host allocation (``cudaHostAlloc``,
CuPy's pinned memory) is mapped into the device's address space at its host
address, so a kernel can read it where it lies. A block whose rows are short
pieces of long host rows (a host front's panel: 256 columns of a front
thousands of columns wide) goes up by such a copy kernel at the link's speed,
where the copy engines' 2-D copies of short rows do not reach it. Pageable
memory has no device address: :func:`device_view` says so (None) and the
caller takes a copy instead.
"""

from __future__ import annotations

import numpy as np

__all__ = ["device_view"]

#: ``cudaPointerAttributes.type`` of page-locked host memory.
_HOST_PINNED = 1


def device_view(cp, F: np.ndarray):
    """``F`` as a CuPy array over the same host memory, or None.

    Parameters
    ----------
    cp : module
        CuPy.
    F : ndarray
        A host array (any strides).

    Returns
    -------
    cupy.ndarray or None
        Same shape, dtype and strides as ``F``, its data ``F``'s memory (read
        by kernels over the link; ``F`` is kept alive by it); None where ``F``
        is not page-locked memory the current device can address (or has a
        negative stride).
    """
    if F.size == 0 or any(st < 0 for st in F.strides):
        return None
    span = sum((n - 1) * st for n, st in zip(F.shape, F.strides)) + F.itemsize
    try:
        attrs = cp.cuda.runtime.pointerGetAttributes(F.ctypes.data)
        if int(attrs.type) != _HOST_PINNED:
            return None
        mem = cp.cuda.UnownedMemory(F.ctypes.data, span, F, cp.cuda.Device().id)
    except cp.cuda.runtime.CUDARuntimeError:
        return None
    return cp.ndarray(F.shape, dtype=F.dtype, memptr=cp.cuda.MemoryPointer(mem, 0),
                      strides=F.strides)
