"""OpenBLAS pools for the BLAS-count tests: the process' real pools at a count of
the test's choosing, and a stand-in pool that records every count set on it."""

import contextlib

import numpy as np
import pytest
import scipy.linalg as la

from scipy_gpuqr._cpu import blas_threads


class FakeOpenBlas:
    """A stand-in OpenBLAS: its count and every count set on it; a library for
    :func:`~scipy_gpuqr._cpu.blas_threads.limited`, a pool (``.pool``) for
    :func:`~scipy_gpuqr._cpu.blas_threads.process_limited`."""

    def __init__(self, n):
        self.n, self.calls = n, []

    def openblas_get_num_threads(self):
        return self.n

    def openblas_set_num_threads(self, k):
        self.calls.append(k)
        self.n = k

    @property
    def pool(self):
        return (self.openblas_get_num_threads, self.openblas_set_num_threads)


def real_pools() -> list:
    """Every OpenBLAS pool of the process, NumPy's and SciPy's loaded first; the
    test is skipped where none is reachable (not Linux, or another BLAS)."""
    la.svd(np.eye(3))                    # SciPy's LAPACK (and so its OpenBLAS) loaded
    np.dot(np.ones((3, 3)), np.ones((3, 3)))
    pools = blas_threads.openblas_pools()
    if not pools:
        pytest.skip("no OpenBLAS reachable in this process (not Linux, or another BLAS)")
    return pools


@contextlib.contextmanager
def pools_at(n: int):
    """Every real pool at ``n`` threads for the body, restored after it."""
    pools = real_pools()
    before = [int(get()) for get, _ in pools]
    for _, set_ in pools:
        set_(n)
    try:
        yield pools
    finally:
        for (_, set_), k in zip(pools, before):
            set_(k)
