"""The compiled loops' products shared between threads: SciPy's bits whatever the threads.

Every test of ``test_iterative_native`` (and through it ``test_iterative_host``)
runs here again with the products on a pool of three threads from a run's first
iteration (``host.product_threads`` and ``host.POOL_FROM`` set for each test),
whatever the host's cores. Beside them: the products alone on pools of two to
five threads against SciPy's kernels (duplicates, unsorted indices, empty
lines, both index widths, both formats), the workers' floating-point
exception flags seen by the caller, and the rule that picks the threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from _native_helpers import needs_compiler, use_loader
from scipy_gpuqr._iterative import host, native
from scipy_gpuqr._iterative._common import compressed_kernels
from test_iterative_native import *  # noqa: F401,F403 - each runs again on the pool
from test_iterative_native import built  # noqa: F401 - the library, built once

pytestmark = needs_compiler

#: The rule itself (each test here runs with a stand-in).
_THREADS = host.product_threads


@pytest.fixture(autouse=True)
def pooled(monkeypatch):
    """Three threads for every compiled run, from its first iteration."""
    monkeypatch.setattr(host, "product_threads", lambda nnz, cores=None: 3)
    monkeypatch.setattr(host, "POOL_FROM", 1)


def _lib(monkeypatch, built):  # noqa: F811 - the fixture's value
    use_loader(monkeypatch, native, built)
    monkeypatch.setenv(native.ENV, "c")
    handle = native.handle()
    assert handle is not None, native._CHECKED.why
    return handle.lib


def _scrambled(m: int, n: int, fmt: str, wide: bool, seed: int):
    """An m×n CSR/CSC matrix with duplicate entries, unsorted indices and empty lines."""
    rng = np.random.default_rng(seed)
    A = sp.random(m, n, density=0.15, format="coo", random_state=rng)
    rows = np.concatenate([A.row, A.row[: A.nnz // 4]])
    cols = np.concatenate([A.col, A.col[: A.nnz // 4]])
    keep = (rows % 7 != 3) & (cols % 5 != 2)          # empty rows and columns
    vals = rng.standard_normal(keep.sum()) * np.exp(rng.uniform(-20, 20, keep.sum()))
    M = sp.coo_matrix((vals, (rows[keep], cols[keep])), shape=(m, n)).asformat(fmt)
    M.sum_duplicates = lambda: None                   # keep the duplicates
    for k in range(M.shape[0 if fmt == "csr" else 1]):
        lo, hi = M.indptr[k], M.indptr[k + 1]
        order = rng.permutation(hi - lo) + lo
        M.indices[lo:hi], M.data[lo:hi] = M.indices[order], M.data[order]
    dtype = np.int64 if wide else np.int32
    M.indptr, M.indices = M.indptr.astype(dtype), M.indices.astype(dtype)
    return M


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("shape", [(120, 70), (70, 120), (300, 300), (5, 400)])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_pooled_products_are_scipys_bit_for_bit(monkeypatch, built, fmt, wide, shape,  # noqa: F811
                                                threads):
    lib = _lib(monkeypatch, built)
    m, n = shape
    M = _scrambled(m, n, fmt, wide, seed=m * 1000 + n + threads)
    rng = np.random.default_rng(threads)
    x, u = rng.standard_normal(n), rng.standard_normal(m)
    forward, backward = compressed_kernels(M)
    want_y, want_z = np.zeros(m), np.zeros(n)
    forward(m, n, M.indptr, M.indices, M.data, x, want_y)
    backward(n, m, M.indptr, M.indices, M.data, u, want_z)
    for _ in range(3):
        y, z = np.full(m, np.nan), np.full(n, np.nan)
        flags = lib.sgi_products(m, n, int(fmt == "csr"), int(wide), M.indptr.ctypes.data,
                                 M.indices.ctypes.data, M.data.ctypes.data, x.ctypes.data,
                                 y.ctypes.data, u.ctypes.data, z.ctypes.data, threads)
        assert flags == 0
        assert y.tobytes() == want_y.tobytes() and z.tobytes() == want_z.tobytes()


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_a_workers_overflow_reaches_the_caller(monkeypatch, built, fmt):  # noqa: F811
    """An overflow in the last outputs' part (the workers' unless the caller claimed it)
    is raised in the caller's thread, which the loops test before each report."""
    lib = _lib(monkeypatch, built)
    m = n = 400
    A = sp.identity(n, format="lil")
    A[m - 1, n - 1] = 1e300
    A[n - 1, m - 1] = 1e300
    M = A.asformat(fmt)
    M.indptr, M.indices = M.indptr.astype(np.int32), M.indices.astype(np.int32)
    x = np.ones(n)
    x[n - 1] = 1e300
    for _ in range(20):
        y, z = np.empty(m), np.empty(n)
        flags = lib.sgi_products(m, n, int(fmt == "csr"), 0, M.indptr.ctypes.data,
                                 M.indices.ctypes.data, M.data.ctypes.data, x.ctypes.data,
                                 y.ctypes.data, x.ctypes.data, z.ctypes.data, 4)
        assert flags != 0 and np.isinf(y[m - 1]) and np.isinf(z[n - 1])


def test_the_threads_rule():
    many = host.POOL_MAX_THREADS * host.POOL_NNZ_PER_THREAD * 10
    assert _THREADS(host.POOL_MIN_NNZ - 1, cores=64) == 1
    assert _THREADS(many, cores=host.POOL_MIN_CORES - 1) == 1
    assert _THREADS(many, cores=64) == host.POOL_MAX_THREADS
    assert _THREADS(many, cores=6) == 3
    assert _THREADS(3 * host.POOL_NNZ_PER_THREAD, cores=64) == 3
