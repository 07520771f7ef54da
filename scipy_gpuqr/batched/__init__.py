"""Batched LU, inverse and Cholesky of many small dense matrices.

Stacks of shape ``(..., n, n)`` (or matrices of different orders, the
``*_vbatched`` functions) are factorized, solved or inverted per matrix with
SciPy's results and failure semantics: on the CPU vectorized over the batch
with NumPy, on the GPU by the CUDA kernels of ``kernels/batched/`` through
CuPy. :func:`block_jacobi` builds a preconditioner from the inverted
diagonal blocks of a sparse matrix.

Public functions (also exported by :mod:`scipy_gpuqr`)
------------------------------------------------------
lu_factor_batched, lu_solve_batched, solve_batched, inv_batched,
cho_factor_batched, cho_solve_batched, block_jacobi,
lu_factor_vbatched, solve_vbatched, inv_vbatched, cho_factor_vbatched

Modules
-------
_functions
    The public functions: validation, CPU/GPU dispatch, ``info`` mapped to
    SciPy's warnings and exceptions.
_vbatched, _jacobi
    Variable-size batches and block-Jacobi; the fixed-size routine they use
    is passed in by ``_functions`` (they import nothing of it).
_common
    Validation and host/device helpers shared by the two above.
_cpu
    NumPy implementations, vectorized over the batch.
_gpu, _gpu_blocked, _gpu_common
    GPU drivers: n <= 32 kernels and the dispatch for every n; n > 32;
    output allocation, the solves shared by both, and the status word of a
    public call (``info`` summarized by the kernels into host memory, one wait).
_kernel_registry
    Kernel files, template instantiations and size limits (read by
    :mod:`scipy_gpuqr._kernels` as ``KERNEL_VARIANTS``).

Dependencies: numpy and scipy; CuPy (and cupyx, cuBLAS through
``cupy_backends``) only lazily, inside the functions that run on the GPU, via
:func:`scipy_gpuqr._gpu.import_cupy`; of the package only its leaf modules
:mod:`scipy_gpuqr._gpu`, :mod:`scipy_gpuqr._kernels` and
:mod:`scipy_gpuqr._options`. Nothing of the other parts (sparse QR, tiled
QR) is imported, and they import nothing from here.

Importing this package imports none of its modules: each public name is
loaded from its module on first use.
"""

from __future__ import annotations

import importlib

#: the fixed-size functions exported Dask-aware: the functions of ._functions
#: behind a type check that sends Dask arrays to scipy_gpuqr.distributed
_DASK_AWARE = ("lu_factor_batched", "lu_solve_batched", "solve_batched",
               "inv_batched", "cho_factor_batched", "cho_solve_batched", "block_jacobi")

#: public name -> module that defines it
_PUBLIC = {
    name: "..distributed._batched_api" if name in _DASK_AWARE else "._functions"
    for name in _DASK_AWARE + ("lu_factor_vbatched", "solve_vbatched",
                               "inv_vbatched", "cho_factor_vbatched")
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    # Called only for names not yet in the module's namespace: the loaded
    # function is bound there, so later lookups are plain attribute reads.
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
