"""scipy_gpuqr: SciPy-compatible sparse least squares and sparse solves on the GPU.

A multifrontal sparse QR (CPU symbolic analysis, a bucket scheduler per front,
one uberkernel running the tasks of many fronts per launch) answers
``lsqr``, ``lsmr``, ``spsolve``, ``factorized`` and ``qr`` with SciPy's
signatures, on the GPU when the problem's arithmetic intensity makes it
worthwhile and on the CPU (SuiteSparseQR) otherwise.

Sparse solvers
--------------
lsqr, lsmr, spsolve, factorized, qr, QRFactorization, QRResult

Patching SciPy
--------------
patch, unpatch, patched, is_patched

Batched small dense matrices
----------------------------
lu_factor_batched, lu_solve_batched, solve_batched, inv_batched,
cho_factor_batched, cho_solve_batched, block_jacobi,
lu_factor_vbatched, solve_vbatched, inv_vbatched, cho_factor_vbatched

Tiled dense QR
--------------
qr_tiled

Utilities
---------
GpuqrOptions, gpu_info, io

Nothing is computed and CuPy is not imported when this package is imported;
each public name is loaded from its module on first use.
"""

from __future__ import annotations

import importlib

from ._version import __version__

#: public name -> private module that defines it
_PUBLIC = {
    "gpu_info": "._gpu",
    "GpuqrOptions": "._options",
    "QRFactorization": "._factor",
    "QRResult": "._adapters",
    "qr": "._adapters",
    "lsqr": "._adapters",
    "lsmr": "._adapters",
    "spsolve": "._adapters",
    "factorized": "._adapters",
    "patch": "._patch",
    "unpatch": "._patch",
    "patched": "._patch",
    "is_patched": "._patch",
    "lu_factor_batched": "._batched",
    "lu_solve_batched": "._batched",
    "solve_batched": "._batched",
    "inv_batched": "._batched",
    "cho_factor_batched": "._batched",
    "cho_solve_batched": "._batched",
    "block_jacobi": "._batched",
    "lu_factor_vbatched": "._batched",
    "solve_vbatched": "._batched",
    "inv_vbatched": "._batched",
    "cho_factor_vbatched": "._batched",
    "qr_tiled": "._tiled",
}

_SUBMODULES = ("io",)

__all__ = sorted(_PUBLIC) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        module = importlib.import_module(_PUBLIC[name], __name__)
        return getattr(module, name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'scipy_gpuqr' has no attribute {name!r}")


def __dir__():
    return __all__
