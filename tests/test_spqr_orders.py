"""SuiteSparseQR's column order kept per pattern (``_cpu/spqr_orders.py``): a later
factorization of the same pattern runs in the kept order with the fixed ordering and
gives the first one's factors bit for bit; another pattern, rank detection or a
non-canonical A orders afresh; a reuse whose counts differ is refused; the table is
bounded. Also the trapezoidal form read off R's CSC arrays (``spqr._trapezoidal``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._cpu import spqr, spqr_orders
from scipy_gpuqr._cpu.spqr import spqr_available, spqr_factorize

from conftest import real_shared_matrices

OK, WHY = spqr_available()


@pytest.fixture(autouse=True)
def _empty_table():
    spqr_orders.clear()
    yield
    spqr_orders.clear()


def _singleton_rich(m, n, seed):
    """A sparse matrix with column singletons (chains of them) and a fill-reducing rest."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=6.0 / m, rng=rng, format="lil")
    for j in range(0, n, 7):                  # singleton columns
        A[:, j] = 0
        A[int(rng.integers(m)), j] = rng.standard_normal()
    A = sp.csc_array(A + sp.eye_array(m, n))
    A.sum_duplicates()
    A.sort_indices()
    return A


def _same_factors(f, g):
    assert f.rank == g.rank
    np.testing.assert_array_equal(f.colperm, g.colperm)
    for a, b in ((f.R, g.R), (f.H, g.H)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.data, b.data)     # bit for bit
    np.testing.assert_array_equal(f.HTau, g.HTau)
    np.testing.assert_array_equal(f.HPinv, g.HPinv)


def _spqr_counts(calls):
    """Wrap ``spqr._run`` to record the ordering code of each SuiteSparseQR call."""
    orig = spqr._run

    def run(libs, C, order_code, tol_code, threads):
        calls.append(order_code)
        return orig(libs, C, order_code, tol_code, threads)
    return run


@pytest.mark.skipif(not OK, reason=WHY)
@pytest.mark.parametrize("shape", [(300, 200), (200, 200), (120, 260)])
def test_a_kept_order_gives_the_same_factors_without_ordering_again(monkeypatch, shape):
    A = _singleton_rich(*shape, seed=sum(shape))
    calls = []
    monkeypatch.setattr(spqr, "_run", _spqr_counts(calls))
    first = spqr_factorize(A, tol=None)
    assert not first.info["ordering_kept"] and first.info["ordering_used"] == "colamd"
    # another matrix object with the same pattern and other values: the kept order
    B = A.copy()
    B.data = np.random.default_rng(1).standard_normal(B.nnz)
    ref = spqr_factorize(B, ordering="colamd", tol=None)      # kept order
    assert ref.info["ordering_kept"] and ref.info["ordering_used"] == "colamd"
    assert calls == [spqr.ORDERINGS["colamd"], spqr._FIXED]
    spqr_orders.clear()
    fresh = spqr_factorize(B, tol=None)                       # ordered afresh
    assert not fresh.info["ordering_kept"]
    _same_factors(ref, fresh)
    again = spqr_factorize(A, tol=None)
    assert again.info["ordering_kept"]
    _same_factors(first, again)
    b = np.random.default_rng(2).standard_normal(A.shape[0])
    np.testing.assert_array_equal(first.qt_matmul(b), again.qt_matmul(b))


@pytest.mark.skipif(not OK, reason=WHY)
def test_same_factors_on_every_shared_matrix(matrices_dir):
    checked = 0
    for name, A in real_shared_matrices(matrices_dir):
        A = sp.csc_array(A, dtype=np.float64)
        A.sum_duplicates()
        A.sort_indices()
        if A.nnz > 100_000 or name == "arrow.mtx":
            continue
        for M in (A, sp.csc_array(A.T)):
            spqr_orders.clear()
            fresh = spqr_factorize(M, tol=None)
            kept = spqr_factorize(M, tol=None)
            assert kept.info["ordering_kept"], name
            _same_factors(fresh, kept)
            checked += 1
    assert checked >= 80


@pytest.mark.skipif(not OK, reason=WHY)
def test_what_orders_afresh(monkeypatch):
    A = _singleton_rich(150, 100, seed=3)
    spqr_factorize(A, tol=None)
    calls = []
    monkeypatch.setattr(spqr, "_run", _spqr_counts(calls))
    # another pattern (one entry moved) misses
    B = A.tolil()
    B[0, 1], B[1, 1] = B[1, 1], 0.0
    B = sp.csc_array(B)
    B.eliminate_zeros()
    B.sort_indices()
    assert not spqr_factorize(B, tol=None).info["ordering_kept"]
    # rank detection (its singletons read the values), a given order, another ordering,
    # a matrix not in canonical format, a CSR matrix: SuiteSparseQR orders (or the given
    # order holds)
    assert not spqr_factorize(A, tol="default").info["ordering_kept"]
    assert not spqr_factorize(A, tol=None, colperm=np.arange(100)).info["ordering_kept"]
    assert not spqr_factorize(A, tol=None, ordering="natural").info["ordering_kept"]
    U = A.copy()
    U.has_canonical_format = False
    assert spqr_orders.pattern_key(U, "colamd") is None
    assert not spqr_factorize(sp.csr_array(A), tol=None).info["ordering_kept"]
    assert spqr_orders.pattern_key(A, "colamd") is not None
    assert spqr_factorize(A, tol=None).info["ordering_kept"]
    assert spqr._FIXED in calls and calls.count(spqr.ORDERINGS["colamd"]) >= 3


@pytest.mark.skipif(not OK, reason=WHY)
def test_a_reuse_whose_counts_differ_is_refused(monkeypatch):
    A = _singleton_rich(150, 100, seed=4)
    ref = spqr_factorize(A, tol=None)
    key = spqr_orders.pattern_key(A, "colamd")
    entry = spqr_orders.lookup(key, A)
    # the kept counts made wrong: the run in the kept order disagrees
    entry.counts = tuple(c + 1 for c in entry.counts)
    calls = []
    monkeypatch.setattr(spqr, "_run", _spqr_counts(calls))
    again = spqr_factorize(A, tol=None)
    assert calls == [spqr._FIXED, spqr.ORDERINGS["colamd"]]
    assert not again.info["ordering_kept"]
    _same_factors(ref, again)
    assert spqr_orders.refused(key) and spqr_orders.lookup(key, A) is None
    calls.clear()
    assert not spqr_factorize(A, tol=None).info["ordering_kept"]    # not kept again
    assert calls == [spqr.ORDERINGS["colamd"]]


@pytest.mark.skipif(not OK, reason=WHY)
def test_non_finite_values_raise_with_a_kept_order():
    A = _singleton_rich(80, 60, seed=5)
    spqr_factorize(A, tol=None)
    B = A.copy()
    B.data[3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        spqr_factorize(B, tol=None)


def test_the_table_is_bounded():
    lru = spqr_orders.OrderLRU(max_entries=2, max_bytes=10_000)

    def entry(nbytes):
        a = np.zeros(nbytes // 8 - 1, dtype=np.int64)
        z = np.zeros(0, dtype=np.int64)
        e = spqr_orders.KeptOrder((0, 0), a, z, z, (), "colamd")
        assert e.nbytes == nbytes
        return e
    lru.put("a", entry(800))
    lru.put("b", entry(800))
    lru.put("c", entry(800))
    assert len(lru) == 2 and lru.get("a") is None and lru.get("c") is not None
    lru.put("big", entry(80_000))            # larger than the table: not kept
    assert "big" not in lru and len(lru) == 2
    lru.put("d", entry(9_600))               # the bytes bound evicts the oldest
    assert len(lru) == 1 and lru.get("d") is not None
    lru.clear()
    assert len(lru) == 0


def _squeezed(rng, rank, n):
    """An R as SuiteSparseQR leaves it with a fixed order and rank detection: row i's
    leading entry at column c_i >= i (c increasing), rows from the rank on empty."""
    pivots = np.sort(rng.choice(n, size=rank, replace=False))
    D = np.zeros((n, n))
    for i, c in enumerate(pivots):
        D[i, c] = rng.uniform(0.5, 2.0)
        later = np.arange(c + 1, n)
        pick = later[rng.random(later.size) < 0.2]
        D[i, pick] = rng.standard_normal(pick.size)
    return sp.csc_array(D)


@pytest.mark.parametrize("seed", range(8))
def test_trapezoidal_read_off_the_csc_arrays(seed):
    rng = np.random.default_rng(seed)
    n = 40
    rank = int(rng.integers(1, n))
    R = _squeezed(rng, rank, n)
    trap = spqr._trapezoidal(R, rank)
    assert not spqr._trapezoidal_already(R, rank) or trap is None
    if trap is not None:
        T = R[:, trap]
        assert spqr._trapezoidal_already(sp.csc_array(T), rank)
        assert spqr._trapezoidal(sp.csc_array(T), rank) is None
    # an already trapezoidal R: an explicit zero on the diagonal or an entry below it
    # makes it not so
    T = sp.csc_array(np.triu(rng.uniform(0.5, 2.0, (n, n))))
    assert spqr._trapezoidal_already(T, rank)
    Z = T.copy()
    Z.data[Z.indptr[rank] - 1] = 0.0        # R[rank-1, rank-1] stored as 0
    assert not spqr._trapezoidal_already(Z, rank)
    L = T.toarray()
    L[rank - 1, 0] = 1.0
    assert not spqr._trapezoidal_already(sp.csc_array(L), rank)
    L = T.toarray()
    L[rank, 0] = 1.0                        # below the rank's rows: not R's rows
    assert spqr._trapezoidal_already(sp.csc_array(L), rank)
