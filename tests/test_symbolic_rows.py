"""The analysis' patterns by rows (:mod:`scipy_gpuqr._symbolic.rows`) and the column
etree read off A's columns: the compiled loops give the NumPy functions' arrays, and
both give what SciPy's column selection, transposition and sorts give (the way
the analysis made them before), on many matrices (CPU only).

The library is built into a temporary folder here (never the user's cache).
"""


import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._symbolic import etree, native, rows
from scipy_gpuqr._symbolic.analysis import canonical_csc
from scipy_gpuqr._symbolic._arrays import stable_argsort
from scipy_gpuqr._symbolic.ordering import column_ordering
from scipy_gpuqr._symbolic.singletons import find_singletons
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

from _native_helpers import assert_analysis_same_either_path, built_loader, needs_compiler

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    ld, _ = built_loader(native, tmp_path_factory.mktemp("symrows"))
    return ld.get(True)


def _matrices():
    rng = np.random.default_rng(11)
    out = {
        "grid8": grid3d_least_squares(8),
        "ch5-6-b2": chessboard_boundary(5, 6, 2),
        "diag": sp.eye(7, format="csc"),
        "dense-row": sp.csc_array(np.vstack([np.ones((1, 70)), np.eye(70)])),
        "empty-rows-cols": sp.csc_array(sp.random(50, 40, density=0.03, random_state=9)),
    }
    for k, (m, n, d) in enumerate([(300, 120, 0.02), (80, 200, 0.02), (500, 60, 0.005),
                                   (60, 60, 0.2), (2000, 700, 0.004)]):
        A = sp.random(m, n, density=d, random_state=int(rng.integers(1 << 30)), format="csc")
        out[f"rand{k}-{m}x{n}"] = sp.csc_array(A)
        out[f"rand{k}+I"] = sp.csc_array(A + sp.eye(m, n))     # singletons
    return {k: canonical_csc(v) for k, v in out.items()}


MATRICES = _matrices()


def _before(A, keep, perm):
    """The pattern by rows and S as the analysis made them before (SciPy)."""
    m, n = A.shape
    pos = sp.csc_array((np.arange(A.nnz, dtype=np.int64), A.indices, A.indptr), shape=(m, n))
    B = sp.csr_array((pos if keep is None else pos[keep])[:, perm])
    B.sort_indices()
    left = etree.leftmost_columns(B.indptr, B.indices, len(perm))
    rowperm = stable_argsort(left, len(perm) + 1)
    S = B[rowperm]
    S.sort_indices()
    return B, left, rowperm, S


def _cases(A):
    """(keep, perm) pairs: all rows and columns in COLAMD's order, and the rows and
    columns left after the singletons (rows kept, columns dropped)."""
    m, n = A.shape
    perm, _ = column_ordering(A, "colamd")
    out = [(None, perm)]
    single = find_singletons(A, None)
    taken = np.zeros(m, dtype=bool)
    taken[single.rows[single.rows >= 0]] = True
    is1 = np.zeros(n, dtype=bool)
    is1[single.cols] = True
    if single.n1cols:
        out.append((np.flatnonzero(~taken).astype(np.int64), perm[~is1[perm]]))
    return out


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_rows_and_tree_equal_scipy_either_path(lib, monkeypatch, name):
    A = MATRICES[name]
    m = A.shape[0]
    for path in ("numpy", "c"):
        monkeypatch.setattr(native, "handle", (lambda: None) if path == "numpy" else
                            (lambda: lib))
        for keep, perm in _cases(A):
            B, left, rowperm, S = _before(A, keep, perm)
            n2 = len(perm)
            _equal(rows.permuted_rows(A, keep, perm), (B.indptr, B.indices, B.data, left))
            _equal(rows.sorted_rows(A, keep, perm),
                   (rowperm, S.indptr, S.indices, S.data, left[rowperm]))
            # the tree off A's columns equals the tree of the rows (star edges)
            want = etree.column_etree_numpy(B.indptr, B.indices, n2, left)
            got = etree.column_etree_by_columns(A, perm, rows.row_map(m, keep),
                                                lambda: rows.permuted_rows(A, keep, perm))
            np.testing.assert_array_equal(got, want)
            # and in a postorder's labels too
            post = etree.postorder_numpy(want)
            B2, left2, rowperm2, S2 = _before(A, keep, perm[post])
            _equal(rows.sorted_rows(A, keep, perm[post]),
                   (rowperm2, S2.indptr, S2.indices, S2.data, left2[rowperm2]))


def test_sorted_rows_refuses_a_wrong_row_count(lib):
    A = MATRICES["grid8"]
    perm = np.arange(A.shape[1], dtype=np.int64)
    with pytest.raises(ValueError):
        native.sorted_rows(lib, A.shape[0], A.indptr, A.indices, perm, None, A.shape[0] - 1)


@pytest.mark.parametrize("name", ["grid8", "ch5-6-b2", "rand0+I", "rand4-2000x700",
                                  "dense-row", "diag"])
def test_analysis_same_with_either_path(lib, monkeypatch, name):
    assert_analysis_same_either_path(monkeypatch, native, lib, MATRICES[name])
