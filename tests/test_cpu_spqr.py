"""SuiteSparseQR and COLAMD through cffi: factorization invariants, rank, layout, edge cases."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._cpu import _cholmod
from scipy_gpuqr._cpu.colamd import colamd, colamd_available
from scipy_gpuqr._cpu.spqr import (ORDERINGS, SpqrQR, _apply_numpy, _libs, default_tol,
                                   spqr_available, spqr_factorize, spqr_solve_default)

OK, WHY = spqr_available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)
EPS = np.finfo(np.float64).eps


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def random_sparse(rng, m, n, density=0.2):
    A = sp.random_array((m, n), density=density, rng=rng, format="csc")
    # make every column nonzero so that full-rank shapes are generic
    return sp.csc_array(A + sp.eye_array(m, n) * 0.5)


def rank_deficient(rng, m, n, r):
    U = sp.random_array((m, r), density=0.5, rng=rng)
    V = sp.random_array((r, n), density=0.5, rng=rng)
    return sp.csc_array(U @ V)


def check_qr(A, f: SpqrQR, rtol_factor=100.0):
    """A[:, colperm] = Q @ R to roundoff (or to norm_E_fro), R upper trapezoidal."""
    m, n = A.shape
    k = min(m, n)
    Ad = A.toarray() if sp.issparse(A) else np.asarray(A)
    assert f.shape == (m, n)
    assert f.R.shape == (k, n)
    assert sorted(f.colperm.tolist()) == list(range(n))
    R = f.R.toarray()
    assert np.count_nonzero(np.tril(R, -1)) == 0
    Q = f.q_matmul(np.eye(m))
    assert np.linalg.norm(Q.T @ Q - np.eye(m)) <= 100 * EPS * m
    resid = np.linalg.norm(Ad[:, f.colperm] - Q[:, :k] @ R)
    scale = max(np.linalg.norm(Ad), 1.0)
    bound = rtol_factor * EPS * (m + n) * scale + 1.01 * f.info.get("norm_E_fro", 0.0)
    assert resid <= bound, (resid, bound)
    return Q, R


# --------------------------------------------------------------------------
# availability and layout
# --------------------------------------------------------------------------

def test_available_names_library():
    assert OK and "SuiteSparseQR" in WHY and "CHOLMOD" in WHY


def _find_headers() -> Path | None:
    roots = [os.environ.get("CONDA_PREFIX", ""), "/usr", "/usr/local", "/opt/homebrew"]
    for root in roots:
        if not root:
            continue
        for sub in ("include/suitesparse", "include"):
            d = Path(root) / sub
            if (d / "cholmod.h").is_file():
                return d
    return None


PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include "cholmod.h"
#define F(f) printf("%s %zu\n", #f, offsetof(cholmod_common, f));
#define S(T, f) printf(#T "." #f " %zu\n", offsetof(T, f));
int main(void) {
    printf("sizeof_common %zu\n", sizeof(cholmod_common));
    printf("istat_len %zu\n", sizeof(((cholmod_common *)0)->SPQR_istat) / sizeof(long long));
    printf("sizeof_sparse %zu\nsizeof_dense %zu\n", sizeof(cholmod_sparse), sizeof(cholmod_dense));
    %FIELDS%
    S(cholmod_sparse, nrow) S(cholmod_sparse, ncol) S(cholmod_sparse, nzmax) S(cholmod_sparse, p)
    S(cholmod_sparse, i) S(cholmod_sparse, nz) S(cholmod_sparse, x) S(cholmod_sparse, z)
    S(cholmod_sparse, stype) S(cholmod_sparse, itype) S(cholmod_sparse, xtype)
    S(cholmod_sparse, dtype) S(cholmod_sparse, sorted) S(cholmod_sparse, packed)
    S(cholmod_dense, nrow) S(cholmod_dense, ncol) S(cholmod_dense, nzmax) S(cholmod_dense, d)
    S(cholmod_dense, x) S(cholmod_dense, z) S(cholmod_dense, xtype) S(cholmod_dense, dtype)
    return 0;
}
"""


def test_layout_matches_installed_headers(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = _find_headers()
    if cc is None or inc is None:
        pytest.skip("no C compiler or no SuiteSparse headers (cholmod.h)")
    fields = " ".join(f"F({name})" for name in _cholmod.COMMON_FIELDS)
    (tmp_path / "probe.c").write_text(PROBE.replace("%FIELDS%", fields))
    exe = tmp_path / "probe"
    subprocess.run([cc, f"-I{inc}", str(tmp_path / "probe.c"), "-o", str(exe)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    found = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    for name, (offset, _) in _cholmod.COMMON_FIELDS.items():
        assert found[name] == offset, name
    assert found["sizeof_common"] <= _cholmod.COMMON_BYTES
    assert found["istat_len"] >= len(_cholmod.SPQR_ISTAT)
    ffi = _libs().ffi
    for struct in ("cholmod_sparse", "cholmod_dense"):
        assert ffi.sizeof(struct) == found[f"sizeof_{struct[8:]}"]
        for key, value in found.items():
            if key.startswith(struct + "."):
                assert ffi.offsetof(struct, key.split(".")[1]) == value, key


def test_runtime_layout_check_refuses_wrong_defaults(monkeypatch):
    libs = _libs()
    bad = dict(_cholmod.COMMON_FIELDS, SPQR_small=(2096, "double"))
    monkeypatch.setattr(_cholmod, "COMMON_FIELDS", bad)
    with pytest.raises(_cholmod.CholmodLayoutError):
        with _cholmod.Common(libs.ffi, libs.cholmod):
            pass


def test_status_mapping():
    libs = _libs()
    with _cholmod.Common(libs.ffi, libs.cholmod) as cc:
        cc.check("f_ok")
        cc["status"] = -2
        with pytest.raises(MemoryError, match="f_oom: SuiteSparse ran out of memory"):
            cc.check("f_oom")
        cc["status"] = -4
        with pytest.raises(RuntimeError, match=r"f_bad failed with status -4 \(CHOLMOD_INVALID\)"):
            cc.check("f_bad")
        cc["status"] = 0
        with pytest.raises(RuntimeError, match="status 0"):
            cc.check("f_null", ok=False)


def test_qmult_symbol_found():
    # the C++ SuiteSparseQR_qmult<double> is exported by SuiteSparse 5.x and 7.x
    assert _libs().qmult is not None


# --------------------------------------------------------------------------
# factorization invariants on random matrices
# --------------------------------------------------------------------------

SHAPES = [(40, 25), (30, 30), (20, 35), (1, 1), (1, 5), (6, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ordering", ["colamd", "natural", "amd", "default"])
def test_qr_invariants(rng, shape, ordering):
    A = random_sparse(rng, *shape)
    f = spqr_factorize(A, ordering=ordering)
    check_qr(A, f)
    assert f.rank == min(shape)
    assert f.flops >= 0 and np.isfinite(f.flops)  # 0 when all columns are singletons
    assert f.tol == pytest.approx(default_tol(A), rel=1e-12)
    x = rng.standard_normal(shape[0])
    np.testing.assert_allclose(f.qt_matmul(f.q_matmul(x)), x, atol=100 * EPS)
    np.testing.assert_allclose(f.q_matmul(f.qt_matmul(x)), x, atol=100 * EPS)


def test_unsorted_duplicates_int64_indices(rng):
    m, n = 30, 18
    A = random_sparse(rng, m, n).tocoo()
    # split every entry into two halves, shuffle, int64 indices
    order = rng.permutation(2 * A.nnz)
    rows = np.concatenate([A.row, A.row]).astype(np.int64)[order]
    cols = np.concatenate([A.col, A.col]).astype(np.int64)[order]
    vals = np.concatenate([A.data / 2, A.data / 2])[order]
    B = sp.coo_array((vals, (rows, cols)), shape=(m, n))
    before = (B.row.copy(), B.col.copy(), B.data.copy())
    fB = spqr_factorize(B)
    check_qr(A, fB)
    fA = spqr_factorize(A)
    np.testing.assert_allclose(abs(fB.R.toarray()), abs(fA.R.toarray()), atol=1e-12)
    # the input is not modified
    for a, b in zip(before, (B.row, B.col, B.data)):
        np.testing.assert_array_equal(a, b)
    # an unsorted CSC with int64 indices
    C = sp.csc_array(A)
    perm = np.concatenate([rng.permutation(np.arange(C.indptr[j], C.indptr[j + 1]))
                           for j in range(n)])
    C2 = sp.csc_array((C.data[perm], C.indices[perm].astype(np.int64),
                       C.indptr.astype(np.int64)), shape=C.shape)
    C2.has_sorted_indices = False
    check_qr(A, spqr_factorize(C2))


def test_dense_input_and_block_rhs(rng):
    A = random_sparse(rng, 25, 12).toarray()
    f = spqr_factorize(A)
    check_qr(A, f)
    B = rng.standard_normal((25, 3))
    np.testing.assert_allclose(f.qt_matmul(B)[:, 1], f.qt_matmul(B[:, 1]), atol=1e-14)
    assert f.qt_matmul(B).shape == (25, 3)
    assert f.qt_matmul(np.zeros((25, 0))).shape == (25, 0)
    Bc = B + 1j * rng.standard_normal((25, 3))
    np.testing.assert_allclose(f.qt_matmul(Bc), f.qt_matmul(B.real) + 1j * f.qt_matmul(Bc.imag))
    with pytest.raises(ValueError, match="shape"):
        f.qt_matmul(np.ones(24))


@pytest.mark.parametrize("shape", [(40, 25), (25, 40), (30, 30)])
def test_numpy_householder_fallback_matches_spqr(rng, shape):
    A = random_sparse(rng, *shape)
    f = spqr_factorize(A)
    X = np.asfortranarray(rng.standard_normal((shape[0], 4)))
    for method, apply in ((0, f.qt_matmul), (1, f.q_matmul)):
        np.testing.assert_allclose(_apply_numpy(method, f.H, f.HTau, f.HPinv, X), apply(X),
                                   atol=1e-13)


# --------------------------------------------------------------------------
# rank detection, orderings, tolerances
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape,r", [((40, 25), 11), ((25, 25), 7), ((18, 30), 9)])
@pytest.mark.parametrize("ordering", ["colamd", "natural"])
def test_rank_deficient(rng, shape, r, ordering):
    A = rank_deficient(rng, *shape, r)
    f = spqr_factorize(A, ordering=ordering)
    assert f.rank == np.linalg.matrix_rank(A.toarray(), tol=f.tol) == r
    _, R = check_qr(A, f)
    R11 = R[:r, :r]
    assert np.all(np.diag(R11) != 0)
    assert np.count_nonzero(np.tril(R11, -1)) == 0
    assert np.count_nonzero(R[r:]) == 0
    assert f.info["norm_E_fro"] <= f.tol * np.sqrt(shape[1])


def test_natural_keeps_order_and_moves_dropped_columns_last(rng):
    # column singletons would be moved first by SPQR_ORDERING_NATURAL; 'natural' keeps them
    B = random_sparse(rng, 20, 10, density=0.4).toarray()
    S = np.zeros((20, 4))
    S[[3, 7, 11, 15], [0, 1, 2, 3]] = [1.0, 2.0, 3.0, -1.0]
    A = sp.csc_array(np.hstack([S, B]))
    f = spqr_factorize(A, ordering="natural")
    np.testing.assert_array_equal(f.colperm, np.arange(14))
    check_qr(A, f)
    # an early dependent column goes to the end, the others keep their order
    D = random_sparse(rng, 12, 8, density=0.5).toarray()
    D[:, 1] = 2 * D[:, 0]
    D[:, 4] = D[:, 2] - D[:, 3]
    f = spqr_factorize(D, ordering="natural")
    assert f.rank == 6
    np.testing.assert_array_equal(f.colperm, [0, 2, 3, 5, 6, 7, 1, 4])
    _, R = check_qr(D, f)
    assert np.all(np.diag(R)[:6] != 0)


def test_given_colperm(rng):
    A = random_sparse(rng, 30, 20)
    p = rng.permutation(20)
    f = spqr_factorize(A, colperm=p)
    np.testing.assert_array_equal(f.colperm, p)
    check_qr(A, f)
    assert f.info["ordering_requested"] == "given"
    np.testing.assert_array_equal(spqr_factorize(A, ordering="given", colperm=p).colperm, p)
    with pytest.raises(ValueError, match="needs colperm"):
        spqr_factorize(A, ordering="given")
    D = rank_deficient(rng, 30, 20, 8)
    f = spqr_factorize(D, colperm=p)
    assert f.rank == 8
    _, R = check_qr(D, f)
    assert np.all(np.diag(R)[:8] != 0) and np.count_nonzero(np.tril(R[:8, :8], -1)) == 0
    # the kept columns stay in the given relative order
    kept = f.colperm[:8]
    pos = {c: i for i, c in enumerate(p)}
    assert [pos[c] for c in kept] == sorted(pos[c] for c in kept)
    for bad in (p[:-1], np.r_[p[:-1], p[0]], p + 0.5):
        with pytest.raises(ValueError, match="colperm"):
            spqr_factorize(A, colperm=bad)


def test_tolerances(rng):
    A = rank_deficient(rng, 30, 20, 6)
    f = spqr_factorize(A, tol=None)
    assert f.tol is None and f.rank == 20 and f.info["norm_E_fro"] == 0
    check_qr(A, f)
    f = spqr_factorize(A, tol=1e-8)
    assert f.tol == 1e-8 and f.rank == 6
    # a huge tolerance drops everything
    f = spqr_factorize(A, tol=1e6)
    assert f.rank == 0
    check_qr(A, f)
    for bad in (-1.0, np.nan, "tight"):
        with pytest.raises(ValueError, match="tol"):
            spqr_factorize(A, tol=bad)
    with pytest.raises(ValueError, match="ordering"):
        spqr_factorize(A, ordering="fastest")


def test_metis_and_best_orderings_run(rng):
    A = random_sparse(rng, 60, 40, density=0.08)
    for ordering in ("metis", "best", "bestamd"):
        f = spqr_factorize(A, ordering=ordering)
        check_qr(A, f)
        assert f.info["ordering_used"] in ORDERINGS or f.info["ordering_used"] == "cholmod"


# --------------------------------------------------------------------------
# degenerate shapes, dtypes, bad input, pickling, threads
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (4, 0)])
def test_empty_shapes(shape):
    m, n = shape
    f = spqr_factorize(sp.csc_array(shape))
    assert f.R.shape == (0, n) and f.rank == 0 and f.colperm.shape == (n,)
    x = np.arange(m, dtype=float)
    np.testing.assert_array_equal(f.qt_matmul(x), x)
    np.testing.assert_array_equal(f.q_matmul(x), x)
    assert spqr_solve_default(sp.csc_array(shape), np.ones(m)).shape == (n,)


def test_zero_matrix():
    f = spqr_factorize(sp.csc_array((5, 4)))
    assert f.rank == 0
    check_qr(np.zeros((5, 4)), f)
    f = spqr_factorize(sp.csc_array((5, 4)), tol=None)
    assert f.rank == 4


def test_dtypes_and_bad_input(rng):
    A = random_sparse(rng, 20, 10)
    f32 = spqr_factorize(A.astype(np.float32))
    assert f32.R.dtype == np.float64
    check_qr(A.astype(np.float32).astype(np.float64), f32)
    fi = spqr_factorize(sp.csc_array(np.eye(6, 4, dtype=np.int32) * 3))
    assert fi.rank == 4
    with pytest.raises(TypeError, match="real"):
        spqr_factorize(A.astype(np.complex128))
    B = A.copy()
    B.data[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        spqr_factorize(B)
    with pytest.raises(ValueError, match="2-D"):
        spqr_factorize(np.ones(3))


def test_pickle_roundtrip(rng):
    A = random_sparse(rng, 25, 15)
    f = spqr_factorize(A)
    g = pickle.loads(pickle.dumps(f))
    assert isinstance(g, SpqrQR)
    x = rng.standard_normal(25)
    np.testing.assert_array_equal(g.qt_matmul(x), f.qt_matmul(x))
    np.testing.assert_array_equal(g.colperm, f.colperm)
    g.free()
    g.free()


def test_threads_give_identical_results(rng):
    mats = [random_sparse(rng, 60, 40, density=0.1) for _ in range(6)]
    serial = [spqr_factorize(A).R.toarray() for A in mats]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda A: spqr_factorize(A).R.toarray(), mats * 2))
    for k, R in enumerate(threaded):
        np.testing.assert_array_equal(R, serial[k % len(mats)])


def test_solve_default(rng):
    A = random_sparse(rng, 40, 20)
    b = rng.standard_normal(40)
    x = spqr_solve_default(A, b)
    r = A @ x - b
    assert np.linalg.norm(A.T @ r) <= 1e3 * EPS * sp.linalg.norm(A) ** 2 * np.linalg.norm(b)
    np.testing.assert_allclose(x, np.linalg.lstsq(A.toarray(), b, rcond=None)[0], rtol=1e-10)
    X = spqr_solve_default(A, np.column_stack([b, 2 * b]))
    np.testing.assert_allclose(X[:, 1], 2 * x, rtol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        spqr_solve_default(A, np.ones(39))


# --------------------------------------------------------------------------
# real matrices
# --------------------------------------------------------------------------

REAL_MATRICES = ["494_bus", "ash219", "bfwa62", "lp_e226", "lp_e226_transposed", "west0479",
                 "GD06_theory", "Ragusa16_pattern", "Tina_AskCal", "lpi_galenet", "n3c4-b4",
                 # SuiteSparse's relaxed files (0-based, blank first line), via our reader
                 "a1", "a2", "a4", "az88", "r2", "s32", "row0"]


ILL_CONDITIONED = {"west0479"}


def _load(path: Path):
    from scipy_gpuqr.io import mmread

    return sp.csc_array(mmread(path)).astype(np.float64)


@pytest.mark.parametrize("name", REAL_MATRICES)
def test_real_matrices(matrices_dir, rng, name):
    A = _load(matrices_dir / f"{name}.mtx")
    m, n = A.shape
    f = spqr_factorize(A)
    svd_rank = np.linalg.matrix_rank(A.toarray(), tol=f.tol)
    if name in ILL_CONDITIONED:
        # SPQR's rank is a greedy estimate: on west0479 (cond ~1e12) it keeps a
        # column whose singular value is just below tol
        assert abs(f.rank - svd_rank) <= 1
    else:
        assert f.rank == svd_rank
    # A[:, p] x = Q (R x) on random x, without forming Q
    x = rng.standard_normal(n)
    lhs = A[:, f.colperm] @ x
    Rx = np.zeros(m)
    Rx[:f.R.shape[0]] = f.R @ x
    rhs = f.q_matmul(Rx)
    bound = 1e3 * EPS * (m + n) * sp.linalg.norm(A) * np.linalg.norm(x) + \
        1.01 * f.info["norm_E_fro"] * np.linalg.norm(x)
    assert np.linalg.norm(lhs - rhs) <= bound
    y = rng.standard_normal(m)
    np.testing.assert_allclose(f.q_matmul(f.qt_matmul(y)), y, atol=1e3 * EPS * np.linalg.norm(y))


def test_solve_default_real_least_squares(matrices_dir):
    # lp_e226_transposed: 472 x 223, full column rank
    A = _load(matrices_dir / "lp_e226_transposed.mtx")
    b = np.ones(A.shape[0])
    x = spqr_solve_default(A, b)
    r = b - A @ x
    assert np.linalg.norm(A.T @ r) <= 1e-10 * sp.linalg.norm(A) * np.linalg.norm(r)


# --------------------------------------------------------------------------
# COLAMD
# --------------------------------------------------------------------------

def grid_laplacian(k):
    T = sp.diags_array([-1.0, 2.0, -1.0], offsets=[-1, 0, 1], shape=(k, k))
    return sp.csc_array(sp.kron(sp.eye_array(k), T) + sp.kron(T, sp.eye_array(k)))


@pytest.mark.skipif(not colamd_available()[0], reason="COLAMD not installed")
def test_colamd_permutation_and_fill(rng):
    A = grid_laplacian(20)[:, rng.permutation(400)]
    p = colamd(A)
    assert p.dtype == np.int64 and sorted(p.tolist()) == list(range(400))
    nnz_colamd = spqr_factorize(A, colperm=p).R.nnz
    nnz_natural = spqr_factorize(A, ordering="natural").R.nnz
    assert nnz_colamd <= nnz_natural
    assert nnz_colamd < 0.5 * nnz_natural  # a random column order fills badly
    # tall, wide and empty
    for shape in [(50, 20), (20, 50)]:
        q = colamd(sp.random_array(shape, density=0.2, rng=rng))
        assert sorted(q.tolist()) == list(range(shape[1]))
    assert colamd(sp.csc_array((5, 0))).shape == (0,)
