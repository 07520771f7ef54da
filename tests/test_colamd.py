"""COLAMD through ctypes: the ``int`` functions give the ``long`` ones' order."""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._cpu import colamd as colamd_mod
from scipy_gpuqr._cpu.colamd import colamd, colamd_available
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

pytestmark = pytest.mark.skipif(not colamd_available()[0], reason="COLAMD not installed")


def _wide(A, monkeypatch, **knobs):
    """The order from the ``long`` functions (every index taken as too large for ``int``)."""
    with monkeypatch.context() as mp:
        mp.setattr(colamd_mod, "_INT_MAX", 0)
        return colamd(A, **knobs)


def _matrices():
    rng = np.random.default_rng(7)
    out = [chessboard_boundary(4, 5, 2), grid3d_least_squares(6)]
    for _ in range(12):
        m, n = (int(v) for v in rng.integers(1, 400, 2))
        out.append(sp.random_array((m, n), density=float(rng.uniform(0.002, 0.08)), rng=rng,
                                   format="csc"))
    return out


@pytest.mark.parametrize("knobs", [{}, {"dense_row": -1.0},
                                   {"dense_row": 0.5, "dense_col": 0.3}])
def test_int_and_long_functions_give_one_order(knobs, monkeypatch):
    for A in _matrices():
        p = colamd(A, **knobs)
        assert p.dtype == np.int64
        assert np.array_equal(np.sort(p), np.arange(A.shape[1]))
        assert np.array_equal(p, _wide(A, monkeypatch, **knobs))


def test_duplicates_and_unsorted_rows_give_the_canonical_order(monkeypatch):
    A = sp.csc_array(sp.random_array((300, 120), density=0.03, rng=3))
    A.sort_indices()
    ref = colamd(A)
    # each column's rows reversed (unsorted) and its first row stored twice
    ptr, idx = [0], []
    for j in range(A.shape[1]):
        rows = A.indices[A.indptr[j]:A.indptr[j + 1]][::-1].tolist()
        idx += rows + rows[:1]
        ptr.append(len(idx))
    M = sp.csc_array((np.ones(len(idx)), np.array(idx), np.array(ptr)), shape=A.shape)
    assert not M.has_canonical_format
    assert np.array_equal(colamd(M), ref)
    assert np.array_equal(_wide(M, monkeypatch), ref)


def test_the_callers_arrays_are_left_alone():
    A = sp.csc_array(grid3d_least_squares(5))
    A.indptr = A.indptr.astype(np.int32)
    A.indices = A.indices.astype(np.int32)
    ptr, idx = A.indptr.copy(), A.indices.copy()
    colamd(A)
    assert np.array_equal(A.indptr, ptr) and np.array_equal(A.indices, idx)
