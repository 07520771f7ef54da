"""Tiled dense QR over the CPU and every GPU: :func:`qr_tiled`.

The matrix is cut into column tiles; a device model (:mod:`._model`, fed by a
short calibration cached on disk, :mod:`._calibrate`) picks the main device,
how many devices take part and which columns each owns, and the executor
(:mod:`._runtime`) runs the tile DAG over the devices (:mod:`._cpu_device`:
LAPACK tile kernels; :mod:`._gpu_device`: cuSOLVER and cuBLAS through CuPy;
:mod:`._ops`: the tile operations of both).

Imports: NumPy and SciPy, the package's GPU probe, options and cache folder;
CuPy only when a GPU device or CuPy input is used, never at import (nor is
:func:`qr_tiled`'s module: it is loaded on first access). Nothing from the
sparse QR.
"""

from __future__ import annotations

import importlib

__all__ = ["qr_tiled"]


def __getattr__(name: str):
    if name == "qr_tiled":
        return importlib.import_module("._qr", __name__).qr_tiled
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
