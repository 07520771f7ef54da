"""The blocked Heath complete orthogonal decomposition (scipy_gpuqr._dense_cod).

Invariants on random and structured inputs: Z G = S with S's live columns
upper triangular and its dead rows zero; the rank equals the SVD rank when
the singular values have a gap; minimum-norm solutions equal
numpy.linalg.lstsq's; and where Heath's rule cannot reveal the rank (Kahan's
matrix) the solver notices and the SVD decides.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import _lstsq
from scipy_gpuqr._dense_cod import DenseCOD, heath_qr, sigma_max_estimate
from scipy_gpuqr._testing_matrices import chessboard_boundary

EPS = np.finfo(np.float64).eps


def _gapped(rng, m, n, r, floor=1e-16, decades=2):
    U, _ = np.linalg.qr(rng.standard_normal((m, m)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.full(min(m, n), floor)
    s[:r] = np.logspace(0, -decades, r)
    return (U[:, :s.size] * s) @ V[:, :s.size].T


def _apply_blocks(blocks, C):
    C = C.copy()
    for b in blocks:
        rows = slice(b.row0, b.row0 + b.V.shape[0])
        C[rows] -= b.V @ (b.T.T @ (b.V.T @ C[rows]))
    return C


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("m,n,r,panel", [(90, 70, 50, 16), (70, 70, 69, 8), (40, 100, 30, 64),
                                         (130, 130, 130, 32)])
def test_heath_qr_invariants(rng, upper, m, n, r, panel):
    A = _gapped(rng, m, n, r)
    G0 = np.linalg.qr(A, mode="r") if upper else A
    G = G0.copy()
    tol = 1e-10
    live, blocks, rank = heath_qr(G, tol, upper=upper, panel=panel)
    assert rank == r == int(live.sum())
    # Z G0 = G with the dead parts removed: ‖Z G0 − G‖ ≤ tol·sqrt(dead)
    assert np.linalg.norm(_apply_blocks(blocks, G0) - G) <= tol * np.sqrt(n) + 1e3 * EPS
    assert np.all(G[rank:] == 0)
    S11 = G[:rank][:, live]
    assert np.allclose(S11, np.triu(S11))
    assert np.all(np.abs(np.diag(S11)) > tol)
    # Z orthogonal: norms preserved
    X = rng.standard_normal((G0.shape[0], 3))
    assert np.allclose(np.linalg.norm(_apply_blocks(blocks, X), axis=0),
                       np.linalg.norm(X, axis=0))


@pytest.mark.parametrize("m,n,r", [(80, 60, 40), (60, 60, 59), (50, 90, 35)])
def test_dense_cod_min_norm_equals_lstsq(rng, m, n, r):
    A = _gapped(rng, m, n, r)
    B = rng.standard_normal((m, 2))
    smax = sigma_max_estimate(A)
    assert abs(smax - np.linalg.norm(A, 2)) <= 1e-3 * smax
    cod = DenseCOD(A.copy(), EPS * max(m, n) * smax)
    X = cod.solve(B)
    Xref = np.linalg.lstsq(A, B, rcond=None)[0]
    assert cod.rank == r
    assert np.linalg.norm(X - Xref) <= 1e-9 * np.linalg.norm(Xref)


def test_solver_transposed_ill_conditioned(rng, monkeypatch):
    """Wide A (Rᵀ solves), signal singular values over 6 decades, noise at 1e-15:
    the rank and the minimum-norm answer are lstsq's."""
    m, n, r = 50, 90, 35
    A = _gapped(rng, m, n, r, floor=1e-15, decades=6)
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    cutoff = EPS * max(m, n)
    R = np.linalg.qr(A.T, mode="r")                         # wide A: factor Aᵀ
    solver = _lstsq.MinNormSolver(sp.csc_array(R), cutoff, transposed=True,
                                  factorize=lambda *a, **k: None)
    assert solver.rank == r
    # Rᵀ Y = C with C = Pᵀ b: compare with lstsq on Rᵀ
    C = rng.standard_normal((m, 2))
    Y = solver.solve(C)
    Yref = np.linalg.lstsq(R.T, C, rcond=cutoff)[0]
    assert np.linalg.norm(Y - Yref) <= 1e-8 * np.linalg.norm(Yref)


def test_chessboard_rank_and_solution_through_solver(rng, monkeypatch):
    """A rank-deficient chessboard boundary matrix beyond DENSE_LIMIT: the dense COD answers."""
    from scipy_gpuqr import QRFactorization
    A = chessboard_boundary(5, 6, 2)                    # 1200×300, rank 271
    b = rng.standard_normal(A.shape[0])
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 100)
    F = QRFactorization(A)
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "dense_cod" and dec["device"] == "cpu"
    Ad = A.toarray()
    x_ref = np.linalg.lstsq(Ad, b, rcond=None)[0]
    assert F.rank == np.linalg.matrix_rank(Ad) == 271
    assert np.linalg.norm(x - x_ref) <= 1e-10 * np.linalg.norm(x_ref)


def test_heath_failure_falls_back_to_svd(monkeypatch):
    """Kahan's matrix: QR without pivoting keeps every column, lstsq drops one."""
    n, c = 90, 0.285
    s = np.sqrt(1 - c * c)
    K = np.diag(s ** np.arange(n)) @ (np.eye(n) - c * np.triu(np.ones((n, n)), 1))
    sv = np.linalg.svd(K, compute_uv=False)
    cutoff = 2 * sv[-1] / sv[0]                           # only σ_min falls below
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    solver = _lstsq.MinNormSolver(sp.csc_array(K), cutoff, factorize=lambda *a, **k: None)
    assert solver.method == "svd" and solver.rank == n - 1
    b = np.ones((n, 1))
    U, sv, Vt = np.linalg.svd(K)
    x_ref = Vt[:-1].T @ ((U[:, :-1].T @ b) / sv[:-1, None])
    assert np.linalg.norm(solver.solve(b) - x_ref) <= 1e-8 * np.linalg.norm(x_ref)
