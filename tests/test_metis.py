"""METIS through ctypes: the ``'metis'`` column ordering and its fallback."""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._cpu import metis as metis_mod
from scipy_gpuqr._cpu._libs import LibraryNotFound
from scipy_gpuqr._cpu.metis import metis_available, nested_dissection
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._symbolic import ordering as ordering_mod
from scipy_gpuqr._symbolic.ordering import column_ordering
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

needs_metis = pytest.mark.skipif(not metis_available()[0], reason="METIS not installed")


def _path_graph(n):
    """Adjacency of the path 0 - 1 - ... - n-1 (CSR, no self loops)."""
    G = sp.diags_array([np.ones(n - 1), np.ones(n - 1)], offsets=[-1, 1], format="csr")
    return G.indptr, G.indices


@needs_metis
def test_index_width_probe_reads_the_library():
    _, itype = metis_mod._lib()
    assert itype in (np.int32, np.int64)


@needs_metis
@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_nested_dissection_is_a_permutation(n):
    indptr, indices = _path_graph(n) if n > 1 else (np.array([0, 0]), np.array([], int))
    perm = nested_dissection(indptr, indices)
    assert perm.dtype == np.int64
    assert np.array_equal(np.sort(perm), np.arange(n))


@needs_metis
@pytest.mark.parametrize("A", [grid3d_least_squares(8), chessboard_boundary(4, 5, 2)],
                         ids=["grid8", "ch4-5-b2"])
def test_metis_order_is_reproducible_and_reduces_fill(A):
    """One graph, one order (METIS seeds its own random numbers); the order is an
    elimination order (less than half its inverse's fill on a grid)."""
    A = sp.csc_array(A)
    perm, used = column_ordering(A, "metis")
    assert used == "metis"
    again, _ = column_ordering(A.copy(), "metis")
    assert np.array_equal(perm, again)
    if A.shape[1] == 512:
        an = analyze(A, colperm=perm, cache=False)
        inverse = np.argsort(perm)
        assert 2 * an.nnz_R < analyze(A, colperm=inverse, cache=False).nnz_R


def test_metis_missing_falls_back_to_colamd(monkeypatch):
    def missing(name, *a, **k):
        raise LibraryNotFound(f"no {name}")
    monkeypatch.setattr(ordering_mod, "nested_dissection",
                        lambda *a: missing("metis"))
    A = sp.csc_array(grid3d_least_squares(3))
    perm, used = column_ordering(A, "metis")
    expect, colamd_used = column_ordering(A, "colamd")
    assert np.array_equal(perm, expect)
    assert used.startswith(colamd_used) and "METIS unavailable" in used
