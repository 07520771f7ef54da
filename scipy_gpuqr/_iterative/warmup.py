"""CuPy's own kernels of the device LSQR/LSMR path, compiled ahead of a first call.

The device path of :func:`~scipy_gpuqr._iterative.lsqr` and
:func:`~scipy_gpuqr._iterative.lsmr` runs its vector updates and sums of
squares in the package's own kernels (``kernels/iterative/vector_ops.cu``,
compiled by the cache warm-up like every kernel file), but A's upload, the
starting vectors' copies and casts and the residual of ``x0`` are CuPy
operations, which CuPy compiles on their first use in an environment and keeps
in its cache (``CUPY_CACHE_DIR``). ``build_kernels.py`` (the cache warm-up)
runs :func:`warm_device_path` after compiling the package's own kernels, so
that a first call compiles none of them.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .lsmr import lsmr
from .lsqr import lsqr

__all__ = ["warm_device_path", "WARM_SHAPE"]


#: Shape of the warm-up problem: CuPy specializes its reductions by the
#: lengths reduced (block sizes), so vectors this long take the variants that
#: every larger problem takes.
WARM_SHAPE = (16384, 8192)


def warm_device_path() -> float:
    """Run LSQR and LSMR a few iterations on a sparse problem of :data:`WARM_SHAPE`
    on the current GPU, given as a host SciPy matrix as ``auto`` gives it (its
    upload and its first product's canonical-format check included), in the
    variants whose kernels differ (plain, damped, with ``x0`` and with
    ``calc_var``), so that CuPy compiles the kernels of the device path now.

    Returns
    -------
    float
        Seconds taken.
    """
    import cupy

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    m, n = WARM_SHAPE
    rows = np.concatenate([np.arange(n), rng.integers(0, m, 4 * n)])
    cols = np.concatenate([np.arange(n), np.repeat(np.arange(n), 4)])
    A = sp.csc_array((rng.standard_normal(len(rows)), (rows, cols)), shape=(m, n))
    b = rng.standard_normal(m)
    for kw in ({}, {"damp": 0.5}, {"x0": np.zeros(n)}):
        lsqr(A, b, iter_lim=8, xp=cupy, **kw)
        lsmr(A, b, maxiter=8, xp=cupy, **kw)
    lsqr(A, b, iter_lim=8, calc_var=True, xp=cupy)
    cupy.cuda.Device().synchronize()
    return time.perf_counter() - t0
