"""SuiteSparseQR's BLAS thread count, lowered around small factorizations only."""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._cpu import blas_threads
from _blas_pools import FakeOpenBlas
from scipy_gpuqr._cpu.spqr import _libs, spqr_available, spqr_factorize


def test_threads_for_small_problems_only():
    assert blas_threads.threads_for(None) is None
    assert blas_threads.threads_for(1e6) == 1
    assert blas_threads.threads_for(blas_threads.SINGLE_THREAD_FLOPS) is None
    assert blas_threads.threads_for(float("nan")) is None


def test_limited_lowers_and_restores():
    lib = FakeOpenBlas(16)
    with blas_threads.limited(lib, 1):
        assert lib.n == 1
    assert lib.n == 16 and lib.calls == [1, 16]
    with pytest.raises(RuntimeError):
        with blas_threads.limited(lib, 2):
            raise RuntimeError("the body fails")
    assert lib.n == 16                               # restored on error too
    lib.calls.clear()
    with blas_threads.limited(lib, None):            # no request: untouched
        pass
    with blas_threads.limited(FakeOpenBlas(1), 4):  # never raised above the setting
        pass
    assert lib.calls == []
    with blas_threads.limited(object(), 1):          # not OpenBLAS: a no-op
        pass


@pytest.mark.skipif(not spqr_available()[0], reason="SuiteSparseQR not installed")
def test_spqr_with_one_blas_thread_gives_the_same_factorization():
    rng = np.random.default_rng(3)
    A = sp.random_array((400, 150), density=0.05, random_state=rng, format="csc") \
        + sp.eye_array(400, 150, format="csc")
    lib = _libs().spqr
    before = blas_threads._controls(lib)[0]() if blas_threads._controls(lib) else None
    a = spqr_factorize(A, tol=None)
    b = spqr_factorize(A, tol=None, blas_threads_hint=1)
    assert b.blas_threads == 1
    assert np.array_equal(a.colperm, b.colperm)
    np.testing.assert_allclose(b.R.toarray(), a.R.toarray(), rtol=0, atol=1e-12)
    B = rng.standard_normal((400, 3))
    np.testing.assert_allclose(b.qt_matmul(B), a.qt_matmul(B), rtol=0, atol=1e-12)
    if before is not None:
        assert blas_threads._controls(lib)[0]() == before   # the setting is restored
