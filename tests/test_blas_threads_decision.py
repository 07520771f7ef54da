"""The rank decision's BLAS thread counts beyond ``SINGLE_THREAD_ORDER``: its
SuiteSparseQR factorizations of R take the thread count of A's factorization
(``_dispatch.plan._wrap_spqr``), and σ_max's Lanczos on a sparse R runs every
OpenBLAS on one thread; the pools are restored and the answer is lstsq's."""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._cpu import blas_threads
from _blas_pools import pools_at
from conftest import banded_deficient
from scipy_gpuqr._cpu.spqr import spqr_available, spqr_factorize
from scipy_gpuqr._dispatch import plan as plan_mod
from scipy_gpuqr._factor import lstsq as lstsq_mod
from scipy_gpuqr._factor.lstsq import MinNormSolver


class _Analysis:
    def __init__(self, flops):
        self.flops = flops


class _Num:
    def __init__(self, flops):
        self.flops = flops


def test_wrap_spqr_gives_the_decisions_qrs_the_thread_count_of_as():
    hints = []

    def fake(A, *, ordering, colperm, tol, blas_threads_hint):
        hints.append(blas_threads_hint)
        return _Num(A)                  # A stands for the count SuiteSparseQR reports

    factorize = plan_mod._wrap_spqr(fake)
    factorize(1e6, tol=None)                                # nothing made yet: the library's
    factorize(2e6, tol=None, analysis=_Analysis(1e6))       # A's: small, one thread
    factorize(3e6, tol=1e-8)                                # the decision's QR of R
    factorize(4e6, tol=None)                                # and of R1ᵀ
    assert hints == [None, 1, 1, 1]
    hints.clear()
    big = blas_threads.SINGLE_THREAD_FLOPS * 10
    factorize(big, tol=None, analysis=_Analysis(big))       # a large A: the pools' own
    factorize(1.0, tol=1e-8)
    assert hints == [None, None]
    hints.clear()
    factorize(1e5, tol=None, analysis=_Analysis(None))      # an analysis without a count:
    factorize(1.0, tol=1e-8)                                # SuiteSparseQR's count of it
    assert hints == [None, 1]


@pytest.fixture
def two_threads():
    """Every real pool at two threads for the test (restored after it)."""
    with pools_at(2) as pools:
        yield pools


@pytest.mark.skipif(not spqr_available()[0], reason="SuiteSparseQR not installed")
def test_large_decision_lanczos_and_qrs_on_one_thread(two_threads, monkeypatch):
    pools = two_threads
    n, dead = 400, 5
    A = banded_deficient(n, dead, 3)
    b = np.random.default_rng(1).standard_normal(n)
    hints = []

    def watched(G, **kwargs):
        hints.append(kwargs.get("blas_threads_hint"))
        return spqr_factorize(G, **kwargs)
    factorize = plan_mod._wrap_spqr(watched)
    num = factorize(A, tol=None, analysis=_Analysis(1e6))          # A's: small
    R = sp.csc_array(num.R)

    def decision_qr(G, *, tol):
        return factorize(sp.csc_array(G), ordering="colamd", colperm=None, tol=tol,
                         analysis=None)
    seen = []
    lanczos = lstsq_mod.sigma_max_lanczos

    def watched_lanczos(M, *args, **kwargs):
        seen.append([int(get()) for get, _ in pools])
        return lanczos(M, *args, **kwargs)
    monkeypatch.setattr(lstsq_mod, "sigma_max_lanczos", watched_lanczos)
    monkeypatch.setattr(lstsq_mod, "SINGLE_THREAD_ORDER", 0)        # R beyond it
    cutoff = lstsq_mod.EPS * n
    solver = MinNormSolver(R, cutoff, factorize=decision_qr)
    assert solver.method == "cod"
    assert seen == [[1] * len(pools)]                   # Lanczos on one thread
    assert hints == [1, 1, 1]                           # A's, then the decision's two
    assert [int(get()) for get, _ in pools] == [2] * len(pools)
    c = num.qt_matmul(b)[:R.shape[0]]
    x = np.empty(n)
    x[num.colperm] = solver.solve(c).ravel()
    assert [int(get()) for get, _ in pools] == [2] * len(pools)
    x_ref, _, rank_ref, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert solver.rank == rank_ref == n - dead
    assert np.linalg.norm(x - x_ref) <= 1e-10 * np.linalg.norm(x_ref)
