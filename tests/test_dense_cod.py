"""The blocked Heath complete orthogonal decomposition (scipy_gpuqr._factor.dense_cod).

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

from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor.dense_cod import DenseCOD, heath_qr, sigma_max_estimate
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
    dropped = []
    live, blocks, rank = heath_qr(G, tol, upper=upper, panel=panel, dropped=dropped)
    assert rank == r == int(live.sum())
    # the dropped parts are listed (at rounding level here: the values have a gap)
    assert len(dropped) <= n - r and all(0 <= x <= 1e-3 * tol for x in dropped)
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


# -- no gap at the cutoff: the host's subspace rank decision (issue 2) ------------

def _gapless(rng, m, n, lo, cluster=False):
    """Singular values 1 .. 10^lo, geometric (no gap); ``cluster``: 30 of them
    scattered within ±3 % of lstsq's cutoff."""
    k = min(m, n)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    s = np.logspace(0, lo, k)
    if cluster:
        cut = EPS * max(m, n)
        k = int(np.searchsorted(-s, -cut))
        s[k - 15:k + 15] = cut * (1 + 0.03 * rng.uniform(-1, 1, 30))
        s = np.sort(s)[::-1]
    return (U * s) @ V.T


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("cluster", [False, True])
def test_subspace_cod_is_the_truncated_svd(rng, transposed, cluster):
    """SubspaceCOD's rank, singular values and minimum-norm solution are the
    truncated SVD's of the same G (R or Rᵀ); a small first block must grow."""
    from scipy_gpuqr._factor.subspace_cod import SubspaceCOD
    m, n = 480, 400
    R = np.linalg.qr(_gapless(rng, m, n, -13.5, cluster), mode="r")
    G = R.T if transposed else R
    U, s, Vt = np.linalg.svd(G)
    tol = EPS * m * s[0]
    r = int(np.count_nonzero(s > tol))
    assert 0 < n - r < 40
    cod = SubspaceCOD(R.copy(), tol, transposed=transposed, block=8)
    assert cod.block_used > 8
    # both are computed to about eps·σ_max absolute (0.2 % of this cutoff): only
    # values that close to the cutoff may be counted differently
    band = int(np.count_nonzero(np.abs(s - tol) <= 10 * EPS * s[0]))
    assert abs(cod.rank - r) <= band and (cluster or band == 0)
    np.testing.assert_allclose(cod.ritz[:n - r], s[r:][::-1], rtol=0, atol=10 * EPS * s[0])
    C = rng.standard_normal((n, 2))
    Y = cod.solve(C)
    Y_ref = Vt[:r].T @ ((U[:, :r].T @ C) / s[:r, None])
    if not cluster:
        assert np.linalg.norm(Y - Y_ref) <= 1e-7 * np.linalg.norm(Y_ref)
    else:
        # singular vectors 0.1 % apart at the cutoff are determined only to about
        # eps·σ_max / (their gap): SVDs of G and Gᵀ differ by 30 % here
        for c in range(2):
            assert _ls_berr(G, Y[:, c], C[:, c]) <= 10 * _ls_berr(G, Y_ref[:, c], C[:, c])


def _ls_berr(A, x, b):
    r = b - A @ x
    return np.linalg.norm(A.T @ r) / (np.linalg.norm(A, 2) * np.linalg.norm(r))


@pytest.mark.parametrize("m,n", [(520, 400), (400, 400), (300, 420)])
def test_gapless_rank_is_lstsq_rank_on_the_host(rng, monkeypatch, m, n):
    """Beyond the host's SVD limit, no gap at the cutoff: lsqr's rank is lstsq's,
    ‖x‖ agrees, the backward error is lstsq's order and the rank is revealed."""
    from scipy_gpuqr import QRFactorization
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    monkeypatch.setattr(_lstsq, "SVD_FALLBACK_LIMIT", {"cpu": 10, "gpu": 10})
    A = _gapless(rng, m, n, -13.5)
    b = rng.standard_normal(m)
    x_ref, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
    cut = EPS * max(m, n) * s[0]
    # no singular value within 4·eps·σ_max of the cutoff (here 4.7 to 17): the
    # rank is not a call of rounding (lstsq's gelsd values err by up to ~30·eps·σ_max
    # on larger problems; bench/RESULTS.md, issue 2)
    assert np.min(np.abs(s - cut)) > 4 * EPS * s[0]
    F = QRFactorization(sp.csc_array(A))
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "subspace_cod" and dec["rank_revealed"], dec
    assert F.rank == rank < min(m, n)
    nx, nref = np.linalg.norm(x), np.linalg.norm(x_ref)
    assert abs(nx - nref) <= 1e-2 * nref
    assert _ls_berr(A, x, b) <= 10 * _ls_berr(A, x_ref, b)


def test_gapless_clustered_rank_within_the_rounding_band(rng, monkeypatch):
    """Singular values clustered within ±3 % of the cutoff: the rank is the SVD
    count of R itself, and differs from lstsq's at most by the number of values
    within lstsq's own rounding of the cutoff (gelsd's singular values of A are
    off by up to ~30·eps·σ_max: measured 1.8 % of the cutoff at n = 1500)."""
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    monkeypatch.setattr(_lstsq, "SVD_FALLBACK_LIMIT", {"cpu": 10, "gpu": 10})
    m, n = 480, 400
    A = _gapless(rng, m, n, -13.5, cluster=True)
    b = rng.standard_normal(m)
    x_ref, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
    Q, R = np.linalg.qr(A)
    solver = _lstsq.MinNormSolver(sp.csc_array(R), EPS * m, factorize=lambda *a, **k: None)
    assert solver.method == "subspace_cod" and solver.revealed
    band = int(np.count_nonzero(np.abs(s - EPS * m * s[0]) <= np.sqrt(m) * EPS * s[0]))
    assert abs(solver.rank - rank) <= band
    sR = np.linalg.svd(R, compute_uv=False)
    assert solver.rank == int(np.count_nonzero(sR > EPS * m * sR[0]))
    x = solver.solve(Q.T @ b)[:, 0]
    assert _ls_berr(A, x, b) <= 10 * _ls_berr(A, x_ref, b)


def test_kahan_rank_without_svd(monkeypatch):
    """Kahan's matrix beyond the host's SVD limit: the subspace decides (n − 1)."""
    n, c = 90, 0.285
    s = np.sqrt(1 - c * c)
    K = np.diag(s ** np.arange(n)) @ (np.eye(n) - c * np.triu(np.ones((n, n)), 1))
    U, sv, Vt = np.linalg.svd(K)
    cutoff = 2 * sv[-1] / sv[0]
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    monkeypatch.setattr(_lstsq, "SVD_FALLBACK_LIMIT", {"cpu": 10, "gpu": 10})
    monkeypatch.setattr(_lstsq, "SUBSPACE_BLOCK", 8)
    solver = _lstsq.MinNormSolver(sp.csc_array(K), cutoff, factorize=lambda *a, **k: None)
    assert solver.method == "subspace_cod" and solver.rank == n - 1 and solver.revealed
    b = np.ones((n, 1))
    x_ref = Vt[:-1].T @ ((U[:, :-1].T @ b) / sv[:-1, None])
    assert np.linalg.norm(solver.solve(b) - x_ref) <= 1e-8 * np.linalg.norm(x_ref)


def test_subspace_too_large_keeps_heath_rank_unrevealed(rng, monkeypatch):
    """A block cap below lstsq's nullity: Heath's rank stands and is reported so."""
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    monkeypatch.setattr(_lstsq, "SVD_FALLBACK_LIMIT", {"cpu": 10, "gpu": 10})
    monkeypatch.setattr(_lstsq, "SUBSPACE_BLOCK", 4)
    monkeypatch.setattr(_lstsq, "SUBSPACE_MAX_BLOCK", 8)
    m, n = 480, 400
    R = np.linalg.qr(_gapless(rng, m, n, -13.5), mode="r")
    solver = _lstsq.MinNormSolver(sp.csc_array(R), EPS * m, factorize=lambda *a, **k: None)
    assert solver.method == "dense_cod" and not solver.revealed
    assert not solver.summary()["rank_revealed"]


@pytest.mark.parametrize("q,d", [(50, 7), (40, 13), (30, 1), (9, 3)])
def test_retriangularize_triangle_plus_rank_d(rng, q, d):
    """Q R̃ = A − U Ytᵀ with R̃ upper triangular and Q orthogonal (windowed QRs)."""
    from scipy_gpuqr._factor.subspace_cod import _apply_windows, _retriangularize
    A = np.asfortranarray(np.triu(rng.standard_normal((q, q))))
    U, Yt = rng.standard_normal((q, d)), rng.standard_normal((q, d))
    M = A - U @ Yt.T
    windows = _retriangularize(A, U.copy(), Yt)
    Rt = np.triu(A)
    assert np.linalg.norm(A - Rt) <= 1e-13 * np.linalg.norm(M)     # triangle restored
    assert np.allclose(_apply_windows(windows, Rt, transpose=False), M, atol=1e-12)
    X = rng.standard_normal((q, 2))
    assert np.allclose(_apply_windows(windows, _apply_windows(windows, X, transpose=True),
                                      transpose=False), X)
