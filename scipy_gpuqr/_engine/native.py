"""R's gather from a host pool in compiled code (``_native.c``), built on first use.

A staged factorization sends some stages' pools to the host while they run;
R's values of such a stage are then gathered from the host pool into R's data
array on a worker thread while the next stages' launch loop runs Python on the
engine's thread (:func:`scipy_gpuqr._engine.gpu.stage_loop._gather_into`).
``sge_gather`` does ``out[pos] = src[idx]`` over a range in one call, which
ctypes makes without the GIL: each worker thread takes the GIL twice per
gather, not once per NumPy call of a stepwise take-then-scatter (each of which
makes the launch loop give the GIL up within the interpreter's switch
interval).

The library is plain C99 without Python headers, built on the first use in a
process that finds no built library (never at import) into ``native/`` of the
package cache folder as ``engine-{key}.so``, checked against its manifest
before it is loaded, by :mod:`scipy_gpuqr._native_build` (which says when,
where and how).

``$SCIPY_GPUQR_ENGINE_NATIVE`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it is at hand; while it is being built, on a worker
thread started by the first gather of a process that finds none, the NumPy
steps run), ``c`` (wait for the build; :class:`NativeUnavailable` when it
cannot be had), ``numpy``.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _native_build
from .._errors import NativeUnavailable
from .._schedule import native as schedule_native

__all__ = ["ENV", "ABI", "MODES", "NativeUnavailable", "mode", "library", "handle", "status",
           "gather"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_ENGINE_NATIVE"
MODES = _native_build.MODES
#: Interface version of ``_native.c`` (``sge_abi()``).
ABI = 1


def _declare(lib: ctypes.CDLL) -> None:
    """Type the library's functions."""
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.sge_gather.argtypes = [i64, i64, ptr, ptr, i32, ptr, ptr, i32]
    lib.sge_gather.restype = None


#: The library: ``_native.c`` beside this module, built as ``engine-{key}.so``.
_SPEC = _native_build.NativeLibrary.beside(__file__, "engine-", ABI, "sge_abi", ENV, _declare)
#: This process' library (:class:`~scipy_gpuqr._native_build.NativePart`): the
#: path :data:`ENV` asks for (``mode``), the library (``library``), the library
#: for the call at hand (``handle``) and the loader's state (``status``).
_NATIVE = _native_build.NativePart(_SPEC, "compiled R gather")
mode, library, handle, status = _NATIVE.mode, _NATIVE.library, _NATIVE.handle, _NATIVE.status


def gather(lib, out: np.ndarray, pos: np.ndarray, src: np.ndarray, idx: np.ndarray,
           threads: int = 1) -> None:
    """``out[pos] = src[idx]`` compiled, split over ``threads`` threads, each one
    call without the GIL.

    ``out`` and ``src`` are contiguous and share a 4- or 8-byte dtype; ``pos``
    is contiguous int64, ``idx`` contiguous int32 or int64; the caller
    guarantees indices in range and distinct positions (R's layout does; no
    check here, as for NumPy's ``take(mode='clip')`` the gather replaces).

    Raises
    ------
    ValueError
        Dtypes, contiguity or lengths the routine does not take.
    """
    if out.dtype != src.dtype or out.dtype.itemsize not in (4, 8):
        raise ValueError(f"gather: {src.dtype} into {out.dtype}")
    if pos.dtype != np.int64 or idx.dtype not in (np.int32, np.int64):
        raise ValueError(f"gather: positions {pos.dtype}, indices {idx.dtype}")
    if not all(a.flags.c_contiguous for a in (out, pos, src, idx)):
        raise ValueError("gather: contiguous arrays only")
    if len(pos) != len(idx):
        raise ValueError(f"gather: {len(idx)} indices for {len(pos)} positions")
    n = len(pos)
    bounds = np.linspace(0, n, max(int(threads), 1) + 1).astype(np.int64)
    schedule_native.run_ranges(lib.sge_gather, bounds, pos.ctypes.data, idx.ctypes.data,
                               idx.dtype.itemsize, src.ctypes.data, out.ctypes.data,
                               out.dtype.itemsize)
