"""CuPy's own kernels of the device LSQR/LSMR path, compiled ahead of a first call.

The device path of :func:`~scipy_gpuqr._iterative.lsqr` and
:func:`~scipy_gpuqr._iterative.lsmr` runs its vector updates, norms and
reductions as CuPy elementwise and reduction kernels, which CuPy compiles on
their first use in an environment and keeps in its cache (``CUPY_CACHE_DIR``).
A user's first iterative GPU call on a fresh machine otherwise pays those
compiles inside the call (seconds). ``build_kernels.py`` (the cache warm-up)
runs :func:`warm_device_path` after compiling the package's own kernels.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .lsmr import lsmr
from .lsqr import lsqr

__all__ = ["warm_device_path"]


def warm_device_path() -> float:
    """Run LSQR and LSMR a few iterations on a small problem on the current GPU,
    in the variants whose kernels differ (plain, damped, with ``x0`` and with
    ``calc_var``), so that CuPy compiles the kernels of the device path now.

    Returns
    -------
    float
        Seconds taken.
    """
    import cupy
    import cupyx.scipy.sparse as csp

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((96, 48)) * (rng.random((96, 48)) < 0.1) + np.eye(96, 48)
    Ad = csp.csr_matrix(sp.csr_matrix(dense))
    b = cupy.asarray(rng.standard_normal(96))
    x0 = cupy.zeros(48)
    for kw in ({}, {"damp": 0.5}, {"x0": x0}):
        lsqr(Ad, b, iter_lim=8, **kw)
        lsmr(Ad, b, maxiter=8, **kw)
    lsqr(Ad, b, iter_lim=8, calc_var=True)
    cupy.cuda.Device().synchronize()
    return time.perf_counter() - t0
