"""lstsq's rank and minimum-norm solution through R's sparse triangular solves (issue 16, item 3).

scipy_gpuqr._factor.sparse_subspace decides the rank of a square sparse R
without a gap at lstsq's cutoff (bayer10's case) from R's small singular
subspace and solves ``x = P_V R⁻¹ P_U c`` without forming or
re-triangularizing R. Checked against the truncated SVD of the same R (rank,
Ritz values, solution, both R and Rᵀ) and, through lsqr, against
numpy.linalg.lstsq, on sparse gapless matrices generated here (CI has no
shared matrices).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor import subspace_cod as _subspace_cod
from scipy_gpuqr._factor.host_lanes import SERIAL, host_lanes
from scipy_gpuqr._factor.sparse_subspace import SparseSubspaceCOD, chunked, decide
from scipy_gpuqr._factor.subspace_cod import (SubspaceCOD, orth_r, sigma_max_lanczos,
                                              small_subspace, triangular_factor)
from scipy_gpuqr._factor.triangular import UpperTriangular

EPS = np.finfo(np.float64).eps


def _gapless_sparse(rng, blocks=24, size=32, lo=-13.5, rotations=30, tiny=0):
    """Sparse square A (``blocks·size`` columns) whose singular values have no gap
    at lstsq's cutoff: a block diagonal of dense blocks with interleaved
    geometric spectra from 1 to about ``10^lo``, its columns mixed by random
    rotations between blocks, its rows permuted. With the defaults 64 of 768
    singular values lie below the cutoff, the nearest 0.986 and 1.028 × it
    (none within 10·eps·σ_max), σ_min = 0.07 × it; SuiteSparseQR's R has 6.6 %
    of its upper triangle nonzero. ``tiny``: one more block of that many singular
    values from 0.01 to 0.05 × the cutoff (the iteration locks them)."""
    q = blocks * size + tiny
    parts = []
    for k in range(blocks):
        U, _ = np.linalg.qr(rng.standard_normal((size, size)))
        V, _ = np.linalg.qr(rng.standard_normal((size, size)))
        s = np.logspace(0, lo, size) * 10 ** (lo * k / (blocks * (size - 1)))
        parts.append((U * s) @ V.T)
    if tiny:
        U, _ = np.linalg.qr(rng.standard_normal((tiny, tiny)))
        V, _ = np.linalg.qr(rng.standard_normal((tiny, tiny)))
        parts.append((U * np.logspace(-2, -1.3, tiny) * EPS * q) @ V.T)
    At = sp.lil_array(sp.block_diag(parts, format="csr").T)      # rows: A's columns
    for _ in range(rotations):
        i, j = rng.choice(q, 2, replace=False)
        t = rng.uniform(0, 2 * np.pi)
        ri, rj = At[[i]].toarray()[0], At[[j]].toarray()[0]
        At[[i]] = np.cos(t) * ri - np.sin(t) * rj
        At[[j]] = np.sin(t) * ri + np.cos(t) * rj
    return sp.csc_array(sp.csc_array(At.T)[rng.permutation(q)])


def _gapless_sparse_r(rng, **kwargs):
    """SuiteSparseQR's R of :func:`_gapless_sparse` (sparse, upper triangular)."""
    from scipy_gpuqr import QRFactorization
    R = sp.csc_array(QRFactorization(_gapless_sparse(rng, **kwargs), backend="cpu").R)
    R.sort_indices()
    return R


def _truncated(G, C, tol):
    U, s, Vt = np.linalg.svd(G)
    r = int(np.count_nonzero(s > tol))
    return r, s, Vt[:r].T @ ((U[:, :r].T @ C) / s[:r, None])


def _cod(R, tol, transposed=False, block=64):
    up = UpperTriangular(R)
    low = UpperTriangular(sp.csc_array(R.T))
    return SparseSubspaceCOD(chunked(up.solve), chunked(low.solve),
                             lambda Y, t: (R.T @ Y) if t else (R @ Y), R.shape[0], tol,
                             transposed=transposed, block=block, max_block=R.shape[0] // 3)


@pytest.mark.parametrize("transposed", [False, True])
def test_sparse_subspace_is_the_truncated_svd(rng, transposed):
    R = _gapless_sparse_r(rng)
    q = R.shape[0]
    assert R.nnz < 0.1 * q * q / 2
    Rd = R.toarray()
    smax = np.linalg.norm(Rd, 2)
    assert sigma_max_lanczos(R) == pytest.approx(smax, rel=1e-10)
    tol = EPS * q * smax
    G = Rd.T if transposed else Rd
    C = rng.standard_normal((q, 3))
    r, s, Y_ref = _truncated(G, C, tol)
    # gapless: singular values on both sides within a few per cent of the cutoff,
    # none within rounding of it (so the rank is not a call of rounding)
    assert 0 < q - r < q / 6
    assert s[r - 1] < 2 * tol and s[r] > tol / 2
    assert np.min(np.abs(s - tol)) > 10 * EPS * smax
    cod = _cod(R, tol, transposed, block=8)
    assert cod.rank == r and cod.block_used > 8
    np.testing.assert_allclose(cod.ritz[:q - r], s[r:][::-1], rtol=0, atol=10 * EPS * smax)
    assert cod.sigma_min == pytest.approx(s[r - 1], rel=1e-6)
    assert cod.leak <= 1.0 + 1e-6
    Y = cod.solve(C)
    # the kept part's condition number is 1/(q·eps) here: the truncated SVD's
    # solution is itself determined only to ~1e-4 (forward error bound eps·σ_1/σ_r
    # = 1.3e-3). The test: as close to the SVD's as the dense path it replaces,
    # and a least-squares backward error no larger than the SVD's
    old = SubspaceCOD(Rd.copy(), tol, transposed=transposed, block=8)
    assert old.rank == r
    Y_old = old.solve(C)
    assert np.linalg.norm(Y - Y_ref) <= 2 * np.linalg.norm(Y_old - Y_ref)
    assert np.linalg.norm(Y - Y_ref) <= 1e-3 * np.linalg.norm(Y_ref)
    for j in range(C.shape[1]):
        assert _ls_berr(G, Y[:, j], C[:, j], smax) <= 2 * _ls_berr(G, Y_ref[:, j], C[:, j], smax)


def _ls_berr(G, y, c, norm):
    r = c - G @ y
    return np.linalg.norm(G.T @ r) / (norm * np.linalg.norm(r))


def test_sparse_subspace_full_rank_under_the_cutoff(rng):
    """No singular value below the cutoff: rank q and R⁻¹ itself."""
    R = _gapless_sparse_r(rng)
    q = R.shape[0]
    s = np.linalg.svd(R.toarray(), compute_uv=False)
    tol = 0.5 * s[-1]
    cod = _cod(R, tol)
    assert cod.rank == q and cod._u is None
    c = rng.standard_normal((q, 1))
    x = cod.solve(c)
    # R⁻¹c refined once (cond 1e14 here: a residual of rounding size relative to ‖x‖)
    assert np.linalg.norm(R @ x - c) <= 10 * EPS * s[0] * np.linalg.norm(x)


def test_decide_refuses_a_block_beyond_its_limit(rng):
    R = _gapless_sparse_r(rng)
    d = np.abs(R.diagonal())
    assert decide(R, EPS * R.shape[0], d, block=64, max_block=32) is None


def test_decide_dense_r_takes_dense_solves(rng):
    """A dense triangle (beyond DENSE_SOLVES_DENSITY) is solved with BLAS: same answer."""
    G = _gapless_sparse(rng, blocks=3, size=100, rotations=0).toarray()
    R = sp.csc_array(np.linalg.qr(G, mode="r"))
    q = R.shape[0]
    cut = EPS * q
    cod = decide(R, cut, np.abs(R.diagonal()), block=16, max_block=q // 3)
    assert cod is not None
    C = rng.standard_normal((q, 2))
    r, _, Y_ref = _truncated(R.toarray(), C, cut * cod.sigma_max)
    assert cod.rank == r
    # the truncated problem's condition number is 1/(q·eps) (see above)
    assert np.linalg.norm(cod.solve(C) - Y_ref) <= 1e-5 * np.linalg.norm(Y_ref)


@pytest.mark.parametrize("extra_rows", [0, 150])
def test_lsqr_gapless_sparse_matches_lstsq(rng, monkeypatch, extra_rows):
    """Through lsqr on the host, beyond DENSE_LIMIT (lowered): the sparse subspace
    decides, with lstsq's rank, its ‖x‖ and a backward error no worse than 10× its."""
    from scipy_gpuqr import QRFactorization, lsqr
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 100)
    A = _gapless_sparse(rng)
    q = A.shape[1]
    if extra_rows:
        # tall: a few rows again, scaled down (the singular values barely move)
        A = sp.vstack([A, 1e-3 * A[rng.choice(q, extra_rows, replace=False)]])
    A = sp.csc_array(A)
    m = A.shape[0]
    b = rng.standard_normal(m)
    Ad = A.toarray()
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    assert np.min(np.abs(s - EPS * max(m, q) * s[0])) > 10 * EPS * s[0]
    F = QRFactorization(A, backend="cpu")
    x_f = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "subspace_cod" and dec["rank_revealed"], dec
    assert F.rank == rank < q
    x = lsqr(A, b, backend="cpu")[0]
    assert np.linalg.norm(x - x_f) <= 1e-8 * np.linalg.norm(x_f)

    def berr(y):
        r = b - Ad @ y
        return np.linalg.norm(Ad.T @ r) / (s[0] * np.linalg.norm(r))

    # as in test_dense_cod's gapless tests: ‖x‖ to the truncated problem's own
    # sensitivity (its condition number is 1/(q·eps)), backward error no worse
    assert abs(np.linalg.norm(x) / np.linalg.norm(x_ref) - 1) <= 1e-3
    assert berr(x) <= 10 * berr(x_ref)


# -- the tall-block factorizations of the iteration ---------------------------------

@pytest.mark.parametrize("spread", [0, 6, 14])
def test_orth_r_and_triangular_factor(rng, spread):
    """Y = Q T with Q orthonormal for nearly orthogonal columns of very different
    lengths (Cholesky QR) and for an ill-conditioned block (Householder); T is
    Householder's to rounding relative to each column."""
    q, p = 3000, 40
    Q0, _ = np.linalg.qr(rng.standard_normal((q, p)))
    scale = np.logspace(0, spread, p)
    Y = (Q0 + 1e-6 * rng.standard_normal((q, p))) * scale
    Q, T = orth_r(Y)
    assert np.abs(Q.T @ Q - np.eye(p)).max() <= 1e-13
    assert np.linalg.norm(Q @ T - Y, axis=0).max() <= 1e-13 * scale.max()
    assert np.all(np.abs(np.linalg.norm(Q @ T - Y, axis=0)) <= 1e-13 * scale)
    # T itself, column by column relative to each column's length (Householder's
    # with the diagonal made positive): the Rayleigh–Ritz step's singular values
    # are then those of Y to the same relative accuracy
    T_ref = la.qr(Y, mode="r")[0][:p]
    T_ref *= np.sign(np.diag(T_ref))[:, None]
    for T in (triangular_factor(Y), orth_r(Y)[1]):
        assert np.all(np.linalg.norm(T - T_ref, axis=0) <= 1e-12 * scale)
    bad = (rng.standard_normal((q, 5)) @ rng.standard_normal((5, p))
           + 1e-12 * rng.standard_normal((q, p)))
    Q, T = orth_r(bad)
    assert np.abs(Q.T @ Q - np.eye(p)).max() <= 1e-12
    assert np.linalg.norm(Q @ T - bad) <= 1e-13 * np.linalg.norm(bad)


# -- locking, the threads ------------------------------------------------------------

@pytest.mark.parametrize("transposed", [False, True])
def test_locked_ritz_pairs_keep_the_truncated_svd(rng, monkeypatch, transposed):
    """48 singular values far below the cutoff besides the gapless ones: they are
    locked after a few steps, and the Ritz values, the rank and the solution are
    the truncated SVD's, as close to it as without locking."""
    R = _gapless_sparse_r(rng, tiny=48)
    q = R.shape[0]
    Rd = R.toarray()
    smax = np.linalg.norm(Rd, 2)
    tol = EPS * q * smax
    G = Rd.T if transposed else Rd
    C = rng.standard_normal((q, 2))
    r, s, Y_ref = _truncated(G, C, tol)
    assert np.count_nonzero(s <= 0.06 * tol) >= 48
    up, low = UpperTriangular(R), UpperTriangular(sp.csc_array(R.T))
    sub = small_subspace(up.solve, low.solve, q, tol, block=160, max_block=q // 3)
    assert sub.locked >= 48
    np.testing.assert_allclose(sub.ritz[:q - r], s[r:][::-1], rtol=0, atol=10 * EPS * smax)
    # images: R⁻ᵀ of the Ritz vectors at most the cutoff (a backward error of a solve)
    Vd = sub.vectors[:, :q - r]
    assert np.all(np.linalg.norm(Rd.T @ sub.images - Vd, axis=0)
                  <= 100 * EPS * smax * np.linalg.norm(sub.images, axis=0))
    cod = _cod(R, tol, transposed, block=160)
    assert cod.rank == r
    Y = cod.solve(C)
    monkeypatch.setattr(_subspace_cod, "LOCK_RATIO", 0.0)          # no locking
    unlocked = _cod(R, tol, transposed, block=160)
    assert unlocked.rank == r
    Y_unlocked = unlocked.solve(C)
    assert np.linalg.norm(Y - Y_ref) <= 2 * np.linalg.norm(Y_unlocked - Y_ref)
    assert np.linalg.norm(Y - Y_ref) <= 1e-3 * np.linalg.norm(Y_ref)
    for j in range(C.shape[1]):
        assert _ls_berr(G, Y[:, j], C[:, j], smax) <= 2 * _ls_berr(G, Y_ref[:, j], C[:, j], smax)


def test_lanes_split_the_same_products(rng, monkeypatch):
    """Row pieces on threads: the products, Gram matrices, right triangular solves and
    column-piece solves of one lane to rounding; one lane without a BLAS limit."""
    from scipy_gpuqr._factor import host_lanes as hl
    monkeypatch.setattr(hl, "MIN_ROWS_PER_LANE", 100)
    A = rng.standard_normal((1001, 40))
    B = rng.standard_normal((40, 7))
    C = rng.standard_normal((1001, 7))
    U = np.triu(rng.standard_normal((40, 40))) + 10 * np.eye(40)
    with host_lanes(False) as one:
        assert one is SERIAL
    with host_lanes(True, lanes=3) as ln:
        assert ln.n == 3
        np.testing.assert_allclose(ln.gemm(A, B), A @ B, rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(ln.gemm(A, C, trans_a=True), A.T @ C, rtol=1e-13, atol=1e-11)
        np.testing.assert_allclose(np.triu(ln.gram(A)), np.triu(A.T @ A), rtol=1e-13,
                                   atol=1e-11)
        np.testing.assert_allclose(ln.solve_right_upper(U, A), A @ np.linalg.inv(U),
                                   rtol=1e-12, atol=1e-13)
        seen = []

        def solve(X):
            seen.append(X.shape[1])
            return 2.0 * X
        np.testing.assert_array_equal(ln.columns(solve, 3)(C), 2.0 * C)
        assert sorted(seen) == [1, 3, 3]
        np.testing.assert_array_equal(ln.columns(solve, None)(C), 2.0 * C)


def test_decide_on_threads_is_decide_on_one(rng):
    """The same rank, Ritz values and solution with two lanes as with one."""
    R = _gapless_sparse_r(rng)
    q = R.shape[0]
    d = np.abs(R.diagonal())
    one = decide(R, EPS * q, d, block=32, max_block=q // 3, lanes=1)
    two = decide(R, EPS * q, d, block=32, max_block=q // 3, lanes=2)
    assert one is not None and two is not None
    assert one.rank == two.rank < q
    np.testing.assert_allclose(one.ritz, two.ritz, rtol=1e-9)
    c = rng.standard_normal(q)
    y1, y2 = one.solve(c), two.solve(c)
    assert np.linalg.norm(y1 - y2) <= 1e-6 * np.linalg.norm(y1)
