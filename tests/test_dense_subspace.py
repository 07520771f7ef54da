"""lstsq's rank of a dense triangle from its small singular subspace, on NumPy or CuPy
(:mod:`scipy_gpuqr._factor.dense_subspace`; issue 15).

Checked on NumPy against numpy.linalg.lstsq (rank and x) on triangles with planted
singular values (a gap at the cutoff, or none: then the decision refuses and the SVD
answers) and on nnc1374's R (66 singular values under the cutoff, none of its pivots
there); then in :class:`~scipy_gpuqr._factor.lstsq.MinNormSolver` with NumPy standing in
for the device. On a GPU: the same decision on CuPy, equal to the host's.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._errors import SubspaceTooLarge
from scipy_gpuqr._factor import dense_subspace as _ds
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor.dense_subspace import DenseSubspaceCOD
from scipy_gpuqr._factor.subspace_cod import sigma_max_lanczos
from scipy_gpuqr._factor.triangular import UpperTriangular

from conftest import stand_in_device

EPS = np.finfo(np.float64).eps


def _planted(q, sigmas, seed=0):
    """R of the QR of ``U diag(σ) Vᵀ`` (random U, V): a dense triangle with those
    singular values, its diagonal not showing the small ones."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((q, q)))
    V, _ = np.linalg.qr(rng.standard_normal((q, q)))
    R = np.linalg.qr((U * np.asarray(sigmas)) @ V.T, mode="r")
    return np.triu(R)


def _spectrum(q, small, gap_low, gap_high, seed=1):
    """Singular values: ``small`` of them spread from 1e-3 to ``gap_low`` × the cutoff,
    one at 1e-18 (an exact dependence), the rest from ``gap_high`` × the cutoff up to
    1, for a q × q matrix of σ_max 1 (cutoff eps·q)."""
    rng = np.random.default_rng(seed)
    tol = EPS * q
    low = tol * np.exp(rng.uniform(np.log(1e-3), np.log(gap_low), small - 1))
    high = np.exp(rng.uniform(np.log(gap_high * tol), 0.0, q - small - 1))
    return np.sort(np.concatenate([[1.0], high, low, [1e-18]]))[::-1]


def _lstsq_of(G, C, cutoff):
    x, _, rank, _ = np.linalg.lstsq(G, C, rcond=cutoff)
    return x, rank


def _close(x, ref, G):
    """x within rounding of lstsq's: the kept part's conditioning times eps (lstsq's own
    spread across LAPACK drivers is of that order)."""
    s = np.linalg.svd(G, compute_uv=False)
    kept = s[s > EPS * max(G.shape) * s[0]]
    scale = kept[0] / kept[-1] * EPS * 1e3
    return np.linalg.norm(x - ref) <= scale * np.linalg.norm(ref)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("small, gap_high", [(12, 3.0), (40, 10.0)])
def test_planted_gap_rank_and_x_equal_lstsqs(small, gap_high, transposed):
    q = 300
    R = _planted(q, _spectrum(q, small, 0.8, gap_high))
    cutoff = EPS * q
    tol = cutoff * np.linalg.norm(R, 2)
    cod = DenseSubspaceCOD(R.copy(), tol, transposed=transposed, block=64, max_block=150)
    G = R.T if transposed else R
    C = np.random.default_rng(2).standard_normal((q, 2))
    ref, rank = _lstsq_of(G, C, cutoff)
    assert cod.rank == rank == q - small
    assert cod.sigma_min > _ds.GAP_MARGIN * tol and cod.ritz[small - 1] <= tol
    assert _close(cod.solve(C), ref, G)


@pytest.mark.parametrize("transposed", [False, True])
def test_the_probe_starts_from_u_ds_solve(transposed, monkeypatch):
    """The probe's Gaussian start goes through the last solve of U_d's (V's for Rᵀ)
    as more columns: that step makes one solve, and the probe's ν and margin are those
    of the probe started on its own with the same draw (the same power method on
    ``S Sᵀ`` for R, on ``Sᵀ S`` for Rᵀ)."""
    from scipy_gpuqr._factor.solve_rank import probe_norm
    q = 300
    R = _planted(q, _spectrum(q, 12, 0.8, 3.0))
    tol = EPS * q * np.linalg.norm(R, 2)
    solves = []
    real_sub = DenseSubspaceCOD._subspaces

    def counted(self, X, d):
        real = self._solve
        self._solve = lambda C, trans: solves.append(C.shape[1]) or real(C, trans)
        try:
            return real_sub(self, X, d)
        finally:
            del self._solve
    monkeypatch.setattr(DenseSubspaceCOD, "_subspaces", counted)
    cod = DenseSubspaceCOD(R, tol, transposed=transposed, block=64, max_block=150)
    assert cod.rank == q - 12
    assert solves == ([12, 12 + _ds.PROBE_COLUMNS] if transposed else [12 + _ds.PROBE_COLUMNS])
    first, second = ((cod._apply_t, cod._apply) if transposed else (cod._apply, cod._apply_t))
    nu, margin = probe_norm(first, second, q, seed=cod.seed + 7919, columns=_ds.PROBE_COLUMNS,
                            steps=_ds.PROBE_STEPS,
                            accept=lambda nu, m: m * nu * _ds.GAP_MARGIN * tol < 1.0)
    assert margin == cod.margin and abs(nu - cod.nu) <= 1e-8 * nu


def test_a_block_too_small_grows():
    """80 singular values under the cutoff and a first block of 32: the block doubles
    until it straddles the cutoff, then decides as lstsq does."""
    q = 400
    R = _planted(q, _spectrum(q, 80, 0.5, 4.0, seed=3), seed=3)
    tol = EPS * q * np.linalg.norm(R, 2)
    cod = DenseSubspaceCOD(R, tol, block=32, max_block=200)
    assert cod.block_used >= 128 and cod.rank == q - 80


@pytest.mark.parametrize("deficient, low, top, block, max_block, seed", [
    (12, 0.8, 1.01, 64, 150, 4),    # spread through the cutoff: the next one above at 1.01 × it
    (120, 0.5, 5.0, 32, 100, 6),    # a null space wider than the largest block
], ids=["no-clear-gap", "beyond-the-largest-block"])
def test_refuses_without_a_certificate(deficient, low, top, block, max_block, seed):
    """No certificate where the singular values spread through the cutoff or the
    null space outgrows the largest block: the caller's SVD decides."""
    q = 300
    R = _planted(q, _spectrum(q, deficient, low, top, seed=seed), seed=seed)
    tol = EPS * q * np.linalg.norm(R, 2)
    with pytest.raises(SubspaceTooLarge):
        DenseSubspaceCOD(R, tol, block=block, max_block=max_block)


@pytest.mark.parametrize("transposed", [False, True])
def test_without_a_gap_the_hosts_rule_when_asked(transposed):
    """Singular values spread through the cutoff (the next above at 1.01 × it): with
    ``require_gap`` the decision refuses (the SVD decides); without, the Ritz values
    under the cutoff give the rank, as the host's subspace rule does (lstsq's within the
    values that lie at the cutoff's rounding), and x is the truncated problem's: its
    backward error on the kept part as small as lstsq's."""
    q = 300
    R = _planted(q, _spectrum(q, 12, 0.8, 1.01, seed=4), seed=4)
    cutoff = EPS * q
    tol = cutoff * np.linalg.norm(R, 2)
    with pytest.raises(SubspaceTooLarge):
        DenseSubspaceCOD(R.copy(), tol, transposed=transposed, block=64, max_block=150)
    cod = DenseSubspaceCOD(R.copy(), tol, transposed=transposed, block=64, max_block=150,
                           require_gap=False)
    G = R.T if transposed else R
    C = np.random.default_rng(3).standard_normal((q, 1))
    ref, rank = _lstsq_of(G, C, cutoff)
    s = np.linalg.svd(G, compute_uv=False)
    near = int(np.count_nonzero(np.abs(s - tol) <= 0.02 * tol))
    assert abs(cod.rank - rank) <= near and cod.rank <= q - 12
    assert cod.ritz[q - cod.rank - 1] <= tol < cod.sigma_min
    x = cod.solve(C)
    r, r_ref = C - G @ x, C - G @ ref
    assert np.linalg.norm(G.T @ r) <= (10 * np.linalg.norm(G.T @ r_ref)
                                       + 1e3 * EPS * s[0] * np.linalg.norm(r))


def _gpu_like_rajat01(matrices_dir, seed=0):
    """rajat01 (6833², lstsq's rank 6777: 56 singular values at R's rounding level) and
    its R as the GPU's task lists compute it (the reference executor), where the pivots
    the executor cancels to exact zeros are made what the GPU leaves there: rounding,
    ``±eps·‖R[:, i]‖`` times a uniform factor in [0.1, 1]. Its dead pivots then all lie
    at the rounding level of their columns, none at zero (the GPU's R, which the
    device's subspace decision once took, wrongly, for rank 6786)."""
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices_dir / "rajat01.mtx")))
    R = sp.csc_array(QRFactorization(A, backend="reference")._core.num.R)
    d = np.abs(R.diagonal())
    cols = np.sqrt(np.asarray(R.multiply(R).sum(axis=0)).ravel())
    zero = np.flatnonzero(d == 0)
    assert zero.size and np.all(d[zero] < EPS * cols[zero])
    rng = np.random.default_rng(seed)
    R = sp.lil_array(R)
    R[zero, zero] = (EPS * cols[zero] * rng.uniform(0.1, 1.0, zero.size)
                     * rng.choice([-1.0, 1.0], zero.size))
    return A, sp.csc_array(R)


@pytest.mark.parametrize("require_gap", [True, False])
def test_solves_growing_past_the_cutoffs_resolution_refuse(matrices_dir, require_gap):
    """rajat01's R made the GPU's way (pivots at their columns' rounding, one's
    quotient feeding the next's): R's solves grow so much that the directions at the
    cutoff lie under their rounding, and the iteration's block and the probe of
    ``‖S‖₂``, both made of those solves, lose directions of R's null space (47 of its
    56 found, with a certified "gap"). The decision refuses at its first solve,
    certificate asked for or not."""
    A, R = _gpu_like_rajat01(matrices_dir)
    Rd = R.toarray()
    q = Rd.shape[0]
    tol = _lstsq.lstsq_cutoff(*A.shape) * sigma_max_lanczos(R)
    with pytest.raises(SubspaceTooLarge, match="grows by"):
        DenseSubspaceCOD(Rd, tol, block=128, max_block=q // 3, require_gap=require_gap)


def test_the_growth_limit_is_the_cutoffs_resolution(monkeypatch):
    """An exact dependence (the planted 1e-18: the solves grow by 1/eps and more) is far
    within the limit, and its rank is decided; with the limit lowered under that
    growth the same triangle refuses at its first solve."""
    q = 300
    R = _planted(q, _spectrum(q, 12, 0.8, 3.0), seed=0)
    tol = EPS * q * np.linalg.norm(R, 2)
    cod = DenseSubspaceCOD(R.copy(), tol, block=64, max_block=150)
    assert cod.rank == q - 12 and 1e15 <= cod.growth
    assert EPS * cod.growth * tol <= 1e-6 * _ds.GROWTH_RESOLUTION
    monkeypatch.setattr(_ds, "GROWTH_RESOLUTION", 0.5 * EPS * cod.growth * tol)
    with pytest.raises(SubspaceTooLarge, match="grows by"):
        DenseSubspaceCOD(R.copy(), tol, block=64, max_block=150)


def test_just_under_the_cutoff_counts():
    """The largest of the small singular values just under the cutoff (0.95 ×), the next
    clearly above: counted under it (its Ritz value bounds it, as the gap-checked COD's
    ``‖E‖₂`` does), as lstsq counts it."""
    q = 300
    s = _spectrum(q, 12, 0.5, 5.0, seed=5)
    s[q - 12] = 0.95 * EPS * q
    R = _planted(q, s, seed=5)
    cutoff = EPS * q
    tol = cutoff * np.linalg.norm(R, 2)
    cod = DenseSubspaceCOD(R, tol, block=64, max_block=150)
    assert cod.rank == _lstsq_of(R, np.ones((q, 1)), cutoff)[1] == q - 12


def test_full_rank_refuses():
    q = 200
    R = _planted(q, np.logspace(0, -3, q), seed=7)
    with pytest.raises(SubspaceTooLarge):
        DenseSubspaceCOD(R, EPS * q * np.linalg.norm(R, 2), block=32, max_block=66)


def _nnc1374_r(matrices_dir):
    from scipy_gpuqr._dispatch.plan import backend_factorizer
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices_dir / "nnc1374.mtx"))).astype(np.float64)
    factorize, ran, _ = backend_factorizer("cpu")
    if ran != "cpu":
        pytest.skip("SuiteSparseQR not available")
    return A, sp.csc_array(factorize(A, tol=None).R), factorize


def test_nnc1374_rank_and_x_equal_the_svds(matrices_dir):
    """nnc1374's R (σ_1308 = 4.77 × the cutoff, σ_1309 = 0.84 ×): rank 1308 in a few
    steps of a 128-column block; x within rounding of the truncated SVD's and of
    lstsq's."""
    A, R, _ = _nnc1374_r(matrices_dir)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    tol = cutoff * sigma_max_lanczos(R)
    Rd = R.toarray()
    cod = DenseSubspaceCOD(Rd, tol, block=128, max_block=458)
    assert cod.rank == 1308 and cod.steps <= 8
    C = np.random.default_rng(0).standard_normal((R.shape[0], 1))
    ref, rank = _lstsq_of(Rd, C, cutoff)
    assert rank == 1308
    U, s, Vt = np.linalg.svd(Rd)
    svd = Vt[:1308].T @ ((U[:, :1308].T @ C) / s[:1308, None])
    x = cod.solve(C)
    assert np.linalg.norm(x - svd) <= 1e-3 * np.linalg.norm(svd)
    assert _close(x, ref, Rd)


def test_nnc1374_settles_by_rounding_with_sigma_max(matrices_dir):
    """Given σ_max, the iteration settles once the moves still to come (the last move at
    the last two's rate) lie a tenth under the rounding R leaves its subspace at: nnc1374
    in 3 steps where the moves alone take 5; the same rank, its subspace and x as close to
    the SVD's as the 5 steps' (the SVD's own subspace lies 2e-4 from either)."""
    A, R, _ = _nnc1374_r(matrices_dir)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    smax = sigma_max_lanczos(R)
    tol = cutoff * smax
    Rd = R.toarray()
    moves = DenseSubspaceCOD(Rd, tol, block=128, max_block=458)
    settled = DenseSubspaceCOD(Rd, tol, block=128, max_block=458, sigma_max=smax)
    assert (moves.steps, settled.steps) == (5, 3)
    assert moves.rank == settled.rank == 1308
    U, s, Vt = np.linalg.svd(Rd)
    null = Vt[1308:].T
    C = np.random.default_rng(0).standard_normal((R.shape[0], 1))
    svd = Vt[:1308].T @ ((U[:, :1308].T @ C) / s[:1308, None])
    for cod in (moves, settled):
        assert np.linalg.norm(cod._v - null @ (null.T @ cod._v)) <= 5e-4
        assert np.linalg.norm(cod.solve(C) - svd) <= 1e-4 * np.linalg.norm(svd)


def test_settling_by_rounding_needs_two_moves(monkeypatch):
    """The estimate of the moves to come needs a rate, two moves: however loose the share,
    the iteration makes at least three steps (the first has no move), and the rank is
    lstsq's."""
    q = 300
    R = _planted(q, _spectrum(q, 12, 0.8, 3.0))
    tol = EPS * q * np.linalg.norm(R, 2)
    monkeypatch.setattr(_ds, "SETTLE_SHARE", 1e12)
    cod = DenseSubspaceCOD(R, tol, block=64, max_block=150, sigma_max=np.linalg.norm(R, 2))
    assert cod.steps >= 3 and cod.rank == q - 12


def _record_gram_ritz(monkeypatch):
    """A list that records, step by step, whether the Ritz pairs came from the Gram
    matrix (``DenseSubspaceCOD._ritz_by_gram`` answered) or it declined."""
    taken = []
    real = DenseSubspaceCOD._ritz_by_gram

    def spy(self, RX):
        got = real(self, RX)
        taken.append(got is not None)
        return got
    monkeypatch.setattr(DenseSubspaceCOD, "_ritz_by_gram", spy)
    return taken


def test_gram_ritz_pairs_equal_the_triangles_svd(matrices_dir, monkeypatch):
    """On nnc1374's R (its smallest singular value 0.01 × the cutoff, no exact dependence)
    the Ritz pairs come from the Gram matrix's eigenpairs at every step, and the decision
    equals the one from the SVD of R X's triangle: the same steps and rank, each step's
    move within 1e-6 of its own, σ_(q-d) within 1e-9, x within 1e-10."""
    A, R, _ = _nnc1374_r(matrices_dir)
    tol = _lstsq.lstsq_cutoff(*A.shape) * sigma_max_lanczos(R)
    Rd = R.toarray()
    taken = _record_gram_ritz(monkeypatch)
    gram = DenseSubspaceCOD(Rd, tol, block=128, max_block=458)
    assert taken == [True] * gram.steps
    monkeypatch.setattr(DenseSubspaceCOD, "_ritz_by_gram", lambda self, RX: None)
    svd = DenseSubspaceCOD(Rd, tol, block=128, max_block=458)
    assert (gram.steps, gram.rank) == (svd.steps, svd.rank) == (5, 1308)
    assert np.allclose(gram.changes[1:], svd.changes[1:], rtol=1e-6)
    assert gram.sigma_min == pytest.approx(svd.sigma_min, rel=1e-9)
    C = np.random.default_rng(3).standard_normal((R.shape[0], 1))
    xg, xs = gram.solve(C), svd.solve(C)
    assert np.linalg.norm(xg - xs) <= 1e-8 * np.linalg.norm(xs)


def test_an_exact_dependence_takes_the_triangles_svd(monkeypatch):
    """A singular value at rounding level (1e-18 here) lies under the Gram matrix's
    rounding: its Ritz pairs come from the SVD of R X's triangle; without it (the
    smallest at 0.05 × the cutoff, the block's largest under 100 ×) from the Gram
    matrix; lstsq's rank either way."""
    q = 300
    taken = _record_gram_ritz(monkeypatch)
    rng = np.random.default_rng(5)
    cut = EPS * q
    near = np.concatenate([[1.0], cut * rng.uniform(3.0, 100.0, q - 13),
                           cut * rng.uniform(0.05, 0.8, 12)])
    for sig, gram_expected in ((_spectrum(q, 12, 0.8, 3.0), False), (near, True)):
        R = _planted(q, np.sort(sig)[::-1])
        tol = EPS * q * np.linalg.norm(R, 2)
        taken.clear()
        cod = DenseSubspaceCOD(R, tol, block=64, max_block=150)
        assert set(taken) == {gram_expected}
        _, rank = _lstsq_of(R, np.ones((q, 1)), EPS * q)
        assert cod.rank == rank == q - 12


# ---------------------------------------------------------------------------
# in MinNormSolver, NumPy standing in for the device

@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_min_norm_solver_on_nnc1374_decides_on_the_device(matrices_dir, monkeypatch, device):
    """R's dense work on the device (here NumPy in CuPy's place): the σ test of all of R
    fails, and R's small singular subspace decides on that one dense copy, before the
    gap check where the factorization was the GPU's (whose QR of R would run there),
    after it otherwise; no SVD. Rank 1308, the solution at working precision."""
    A, R, factorize = _nnc1374_r(matrices_dir)
    made = stand_in_device(monkeypatch)
    svds, factorized = [], []
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_svd",
                        lambda self, G=None: svds.append(1))

    def spy(G, tol=None):
        factorized.append(tol)
        return factorize(G, tol=tol)
    solver = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape), factorize=spy,
                                  device=device, dense_device="gpu",
                                  solves=UpperTriangular(R).solves())
    assert (solver.method, solver.rank, solver.cod_device) == ("dense_subspace", 1308, "gpu")
    assert solver._cod.steps == 3           # settled by rounding: σ_max is lstsq's
    assert made == [1374] and not svds
    assert bool(factorized) == (device == "cpu")     # the gap check's QR: host factorizer only
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    num = factorize(A, tol=None)
    y = solver.solve(np.asarray(num.qt_matmul(b.reshape(-1, 1)))[:R.shape[0]])
    assert solver.summary()["method"] == "dense_subspace"
    x = np.empty_like(y)
    x[num.colperm] = y
    r = b - A @ x.ravel()
    fro = sp.linalg.norm(A)
    assert np.linalg.norm(r) / (fro * np.linalg.norm(x) + np.linalg.norm(b)) <= 1e-12


def test_min_norm_solver_without_a_clear_gap_takes_the_svd(monkeypatch):
    """No clear gap (the next singular value at 1.01 × the cutoff): the subspace decision
    refuses and the SVD decides, on the same dense copy; lstsq's rank and x."""
    q = 620
    R = sp.csc_array(_planted(q, _spectrum(q, 12, 0.8, 1.01, seed=8), seed=8))
    made = stand_in_device(monkeypatch)
    cutoff = _lstsq.lstsq_cutoff(q, q)
    solver = _lstsq.MinNormSolver(R, cutoff, device="gpu", dense_device="gpu",
                                  solves=UpperTriangular(R).solves())
    assert solver.method == "svd" and made == [q]
    C = np.random.default_rng(9).standard_normal((q, 1))
    ref, rank = _lstsq_of(R.toarray(), C, cutoff)
    assert solver.rank == rank
    assert _close(solver.solve(C), ref, R.toarray())


def test_min_norm_solver_beyond_dense_limit_leaves_rounding_pivots_to_the_cod(matrices_dir,
                                                                              monkeypatch):
    """A GPU factorization's R beyond DENSE_LIMIT whose dead pivots lie at their columns'
    rounding (rajat01 made the GPU's way: the null-space COD refuses, 61 tiny pivots for
    56 singular values under the cutoff): R's small singular subspace on the device is
    refused, and the device's dense COD (Householder QR, no division by R's pivots)
    decides, not the subspace's rank 6786."""
    A, R = _gpu_like_rajat01(matrices_dir)
    stand_in_device(monkeypatch)
    monkeypatch.setattr(_lstsq, "device_subspace_fits", lambda q, p: True)
    monkeypatch.setattr(_lstsq.MinNormSolver, "_dense_cod_device", lambda self: "gpu")
    refused, cods = [], []
    real = _lstsq.DenseSubspaceCOD

    def subspace(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except SubspaceTooLarge as e:
            refused.append(str(e))
            raise
    monkeypatch.setattr(_lstsq, "DenseSubspaceCOD", subspace)

    def dense_cod(self, device, d):         # its q³ QR on NumPy here: recorded only
        cods.append(device)
        self.method, self.rank = "dense_cod", -1
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_dense_cod", dense_cod)
    solver = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape), device="gpu",
                                  dense_device="gpu", factorize=lambda G, tol=None: None,
                                  solves=UpperTriangular(R).solves())
    assert solver.method == "dense_cod" and cods == ["gpu"]
    assert len(refused) == 1 and "grows by" in refused[0]


# ---------------------------------------------------------------------------
# on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [False, True])
def test_on_the_gpu_the_decision_equals_the_hosts(matrices_dir, transposed):
    """nnc1374's R on CuPy: the rank of the host's decision, x within rounding of it, and
    the MinNormSolver of a GPU factorization takes it with R's one dense copy there."""
    cupy = pytest.importorskip("cupy")
    A, R, factorize = _nnc1374_r(matrices_dir)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    tol = cutoff * sigma_max_lanczos(R)
    Rd = R.toarray()
    host = DenseSubspaceCOD(Rd, tol, transposed=transposed, block=128, max_block=458)
    dev = DenseSubspaceCOD(cupy.asarray(Rd), tol, transposed=transposed, block=128,
                           max_block=458)
    assert dev.rank == host.rank == 1308
    C = np.random.default_rng(0).standard_normal((R.shape[0], 2))
    xh, xd = host.solve(C), dev.solve(C)
    assert isinstance(xd, np.ndarray)
    assert np.linalg.norm(xd - xh) <= 1e-3 * np.linalg.norm(xh)
    solver = _lstsq.MinNormSolver(R, cutoff, factorize=factorize, device="gpu",
                                  dense_device="gpu", solves=UpperTriangular(R).solves(),
                                  transposed=transposed)
    assert (solver.method, solver.rank, solver.cod_device) == ("dense_subspace", 1308, "gpu")


@pytest.mark.gpu
def test_on_the_gpu_ritz_pairs_by_the_gram_and_settled_by_rounding(matrices_dir, monkeypatch):
    """nnc1374's R on CuPy with σ_max: every step's Ritz pairs from the Gram matrix, settled
    in 3 steps as on the host, lstsq's rank; x within rounding of the host's decision and
    of the device's with the triangle's SVD and the moves alone (5 steps)."""
    cupy = pytest.importorskip("cupy")
    A, R, _ = _nnc1374_r(matrices_dir)
    smax = sigma_max_lanczos(R)
    tol = _lstsq.lstsq_cutoff(*A.shape) * smax
    Rd = R.toarray()
    taken = _record_gram_ritz(monkeypatch)
    host = DenseSubspaceCOD(Rd, tol, block=128, max_block=458, sigma_max=smax)
    taken.clear()
    dev = DenseSubspaceCOD(cupy.asarray(Rd), tol, block=128, max_block=458, sigma_max=smax)
    assert taken == [True] * dev.steps and dev.steps == host.steps == 3
    assert dev.rank == host.rank == 1308
    monkeypatch.setattr(DenseSubspaceCOD, "_ritz_by_gram", lambda self, RX: None)
    old = DenseSubspaceCOD(cupy.asarray(Rd), tol, block=128, max_block=458)
    assert (old.steps, old.rank) == (5, 1308)
    C = np.random.default_rng(0).standard_normal((R.shape[0], 2))
    xh, xd, xo = host.solve(C), dev.solve(C), old.solve(C)
    assert np.linalg.norm(xd - xh) <= 1e-3 * np.linalg.norm(xh)
    assert np.linalg.norm(xd - xo) <= 1e-3 * np.linalg.norm(xo)
