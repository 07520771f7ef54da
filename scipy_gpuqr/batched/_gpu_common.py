"""Pieces shared by the GPU drivers of every order (``_gpu``, ``_gpu_blocked``).

* :func:`alloc`: every output array of the drivers is allocated here (the
  tests replace it to poison outputs with NaN before the kernels run);
* :func:`dtname`, :func:`device_id`: the cache keys of compiled kernels;
* :func:`solve_by_columns`: the solves with LU or Cholesky factors with a
  thread per (matrix, right-hand side column) of ``kernels/batched/solve.cu``,
  used for n <= 32 and n > 64.

CuPy is imported only when a function runs.
"""

from __future__ import annotations

import functools

import numpy as np

from ._kernel_registry import KERNEL_VARIANTS, SOLVE_FILE, solve_name
from .._gpu import import_cupy
from .._kernels import load_module

__all__ = ["alloc", "dtname", "device_id", "solve_by_columns"]

#: Threads per block of the solves by columns.
SOLVE_THREADS = 128


def alloc(shape, dtype):
    """An uninitialized output array (tests replace this to poison outputs)."""
    return import_cupy().empty(shape, dtype=dtype)


def dtname(dtype) -> str:
    """``'float32'`` / ``'float64'``: the dtype's part of a kernel's cache key."""
    return np.dtype(dtype).name


def device_id() -> int:
    """The current CUDA device: a module loaded on one GPU is not usable on another."""
    return import_cupy().cuda.runtime.getDevice()


@functools.lru_cache(maxsize=None)
def _solve_function(kernel: str, dt: str, device: int):
    module = load_module(SOLVE_FILE, KERNEL_VARIANTS[SOLVE_FILE])
    return module.get_function(solve_name(kernel, dt))


def solve_by_columns(kernel: str, dtype, b, factors: tuple, flag: int):
    """``kernel`` (``getrs_batched`` / ``potrs_batched``: a thread per matrix and
    right-hand side column, any n) on a copy of ``b`` (B, n, k).

    The kernel's arguments: ``factors`` (contiguous), the solution, n, k, B
    and ``flag`` (transposed / lower).
    """
    cp = import_cupy()
    x = cp.array(b, dtype=dtype, order="C", copy=True)
    bsz, n, k = x.shape
    if x.size == 0:
        return x
    fn = _solve_function(kernel, dtname(dtype), device_id())
    grid = -(-(bsz * k) // SOLVE_THREADS)
    fn((grid,), (SOLVE_THREADS,),
       factors + (x, np.int32(n), np.int32(k), np.int64(bsz), np.int32(flag)))
    return x
