"""METIS nested dissection of a graph through ctypes (no compiler, no Python package).

SuiteSparse's CHOLMOD is built against METIS 5 on Debian and Ubuntu, so
``libmetis.so.5`` comes with ``libsuitesparse-dev``. One function is called,
``METIS_NodeND``, with METIS's default options: its own seeded random numbers
make the order a function of the graph and the library alone.

METIS is compiled with 32- or 64-bit indices (``idx_t``); the width is read
once per process from ``METIS_SetDefaultOptions``, which writes
``METIS_NOPTIONS`` entries of ``idx_t`` into a buffer large enough for either.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ._libs import LibraryNotFound, open_cdll

__all__ = ["nested_dissection", "metis_available"]

#: entries of METIS 5's options array
_NOPTIONS = 40
_METIS_OK = 1


@functools.lru_cache(maxsize=1)
def _lib() -> tuple[ctypes.CDLL, type]:
    """The METIS library with ``METIS_NodeND`` declared, and its index type
    (once per process: the handle is immutable once opened)."""
    lib = open_cdll("metis")
    lib.METIS_SetDefaultOptions.argtypes = [ctypes.c_void_p]
    lib.METIS_SetDefaultOptions.restype = ctypes.c_int
    lib.METIS_NodeND.argtypes = [ctypes.c_void_p] * 7
    lib.METIS_NodeND.restype = ctypes.c_int
    probe = np.zeros(_NOPTIONS, dtype=np.int64)           # room for 64-bit indices
    lib.METIS_SetDefaultOptions(probe.ctypes.data)
    # every default option is -1: 32-bit indices fill only the first half
    itype = np.int64 if probe[-1] == -1 else np.int32
    return lib, itype


def metis_available() -> tuple[bool, str]:
    """Whether the METIS library loads, and why not."""
    try:
        _lib()
    except (LibraryNotFound, ImportError) as exc:
        return False, str(exc)
    return True, "ok"


def nested_dissection(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Fill-reducing order of a symmetric graph by METIS' nested dissection.

    Parameters
    ----------
    indptr, indices : ndarray of int
        The graph's adjacency in CSR form: symmetric, no self loops.

    Returns
    -------
    perm : ndarray of int64, shape (n,)
        Elimination order: vertex ``perm[k]`` is eliminated k-th.

    Raises
    ------
    LibraryNotFound
        When METIS is not installed.
    OverflowError
        When the graph's size does not fit the library's index type.
    RuntimeError
        When METIS reports an error.
    """
    lib, itype = _lib()
    n = int(indptr.shape[0] - 1)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if int(indptr[-1]) > np.iinfo(itype).max:
        raise OverflowError(f"a graph of {int(indptr[-1])} edges is too large for METIS' "
                            f"{np.dtype(itype).itemsize * 8}-bit indices")
    xadj = np.ascontiguousarray(indptr, dtype=itype)
    adjncy = np.ascontiguousarray(indices, dtype=itype)
    nvtxs = np.array([n], dtype=itype)
    options = np.empty(_NOPTIONS, dtype=itype)
    lib.METIS_SetDefaultOptions(options.ctypes.data)
    perm = np.empty(n, dtype=itype)
    iperm = np.empty(n, dtype=itype)
    # ctypes releases the GIL for the call
    status = lib.METIS_NodeND(nvtxs.ctypes.data, xadj.ctypes.data, adjncy.ctypes.data, None,
                              options.ctypes.data, perm.ctypes.data, iperm.ctypes.data)
    if status != _METIS_OK:
        raise RuntimeError(f"METIS_NodeND failed with status {status} on a graph of {n} "
                           f"vertices")
    return perm.astype(np.int64)
