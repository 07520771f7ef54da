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

Errors and warnings
-------------------
GpuEngineError, GpuFallbackWarning, MatrixMarketError

Dask (the ``dask`` extra)
-------------------------
distributed: the batched functions above take Dask arrays;
distributed.solve_many solves many sparse problems across workers

Utilities
---------
GpuqrOptions, gpu_info, start_gpu, release_pinned_memory, io

Nothing is computed and CuPy is not imported when this package is imported;
each public name is loaded from its module on first use. ``start_gpu()``
begins a process's CUDA start and kernel loads in the background when a
script asks for it.
"""

from __future__ import annotations

import importlib

from ._version import __version__

#: public name -> private module that defines it
_PUBLIC = {
    "gpu_info": "._gpu",
    "start_gpu": "._api.warmup",
    "release_pinned_memory": "._api.memory",
    "GpuEngineError": "._errors",
    "GpuFallbackWarning": "._errors",
    "MatrixMarketError": "._errors",
    "GpuqrOptions": "._options",
    "QRFactorization": "._factor.factorization",
    "QRResult": "._api.qr",
    "qr": "._api.qr",
    "lsqr": "._api.lsqr",
    "lsmr": "._api.lsqr",
    "spsolve": "._api.spsolve",
    "factorized": "._api.spsolve",
    "patch": "._api.patch",
    "unpatch": "._api.patch",
    "patched": "._api.patch",
    "is_patched": "._api.patch",
    "lu_factor_batched": ".distributed._batched_api",
    "lu_solve_batched": ".distributed._batched_api",
    "solve_batched": ".distributed._batched_api",
    "inv_batched": ".distributed._batched_api",
    "cho_factor_batched": ".distributed._batched_api",
    "cho_solve_batched": ".distributed._batched_api",
    "block_jacobi": ".distributed._batched_api",
    "lu_factor_vbatched": ".batched._functions",
    "solve_vbatched": ".batched._functions",
    "inv_vbatched": ".batched._functions",
    "cho_factor_vbatched": ".batched._functions",
    "qr_tiled": ".tiled._qr",
}

_SUBMODULES = ("io", "distributed")

__all__ = sorted(_PUBLIC) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    # Called only for names not yet in the module's namespace: the loaded
    # object is bound there, so later lookups are plain attribute reads.
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'scipy_gpuqr' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__
