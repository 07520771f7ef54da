"""The solve rules of scipy_gpuqr._factor.lstsq on real matrices and synthetic ones.

Least squares: lsqr/lsmr agree with numpy.linalg.lstsq(rcond=None) (minimum
norm, rank from singular values below eps·max(m,n)·σ_max), judged by
backward error and by ‖x‖ (DESIGN.md §5: never a bare tolerance on x).
Exact solves: spsolve's singularity rule warns exactly where SciPy does.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from scipy_gpuqr import lsmr, lsqr, spsolve
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._api.originals import original

from conftest import nullspace_blocks_fail_on

EPS = np.finfo(np.float64).eps

# (name, slow): dense lstsq must stay affordable; Groebner_id2003_aug (4967x2456:
# 90 s of lstsq; agrees to 4.6e-15 when run by hand),
# Franz6_id1959_aug, bayer10, rajat01 (lstsq) and arrow are too large for it.
LSTSQ_MATRICES = [
    ("494_bus", False), ("GD01_b", False), ("GD06_theory", False), ("GD98_a", False),
    ("LFAT5", False), ("Ragusa16", False), ("Ragusa16_pattern", False),
    ("Tina_AskCal", False), ("Tina_AskCal_perm", False), ("a1", False), ("a2", False),
    ("a4", False), ("ash219", False), ("az88", False), ("b1_ss", False),
    ("bcspwr01", False), ("bfwa62", False), ("bp_1200", True), ("cage3", False),
    ("cage5", False), ("dwt_878", True), ("gent113", False), ("lfat5b", False),
    ("lp_e226", False), ("lp_e226_transposed", False), ("lp_share1b", False),
    ("lpi_galenet", False), ("lpi_itest6", False), ("n3c4-b4", False),
    ("olm500", False), ("permuted_b1_ss", False), ("problem", False), ("pwr01b", False),
    ("r2", False), ("reorientation_1", True), ("row0", False), ("s32", False),
    ("temp", False), ("tumorAntiAngiogenesis_2", False), ("west0067", False),
    ("west0479", False), ("west0497", False), ("rajat19", True), ("nnc1374", True),
    ("hangGlider_2", True), ("adder_dcop_05", False), ("watt_2", False),
]
# adder_dcop_05 (1813², rank 1788 by lstsq and by the gap-checked sparse COD,
# cond 1.8e12) and watt_2 (1856², cond 1.4e11, full rank confirmed without an
# SVD) take about 2 s of dense lstsq each on two cores.


def _read(matrices_dir, name):
    try:
        from scipy_gpuqr.io import mmread
    except ImportError:  # pragma: no cover - reader not there yet
        from scipy.io import mmread
    try:
        A = mmread(str(matrices_dir / f"{name}.mtx"))
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"cannot read {name}: {exc}")
    return sp.csc_array(A)


def _params(items):
    return [pytest.param(n, marks=pytest.mark.slow) if slow else n for n, slow in items]


def _ls_backward_error(A, x, b, normA):
    r = b - A @ x
    nr = np.linalg.norm(r)
    ls = np.linalg.norm(A.T @ r) / (normA * nr) if nr > 0 else 0.0
    consistent = nr / (normA * np.linalg.norm(x) + np.linalg.norm(b))
    return ls, consistent


@pytest.mark.parametrize("name", _params(LSTSQ_MATRICES))
def test_lsqr_lsmr_match_lstsq(matrices_dir, name):
    A = _read(matrices_dir, name)
    if np.iscomplexobj(A.data):
        pytest.skip("complex")
    A = A.astype(np.float64)
    m, n = A.shape
    b = np.random.default_rng(7).standard_normal(m)
    Ad = A.toarray()
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    normA = s[0] if s.size else 0.0
    ls_ref, cons_ref = _ls_backward_error(Ad, x_ref, b, normA)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # auto asked for the maximum precision (zero tolerances: the direct
        # QR answers), and, where the SVD step of the direct rule stays cheap,
        # the direct QR on both CPU backends
        results = {"lsqr": lsqr(A, b, atol=0, btol=0), "lsmr": lsmr(A, b, atol=0, btol=0)}
        if max(m, n) <= 1000:
            results["lsqr-cpu"] = lsqr(A, b, backend="cpu")
            results["lsqr-reference"] = lsqr(A, b, backend="reference")
    for func, out in results.items():
        x = out[0]
        assert x.shape == (n,) and x.dtype == np.float64
        ls, cons = _ls_backward_error(Ad, x, b, normA)
        c = 100 * EPS * max(m, n)
        # Either a least-squares backward error as small as lstsq's, or a
        # consistent-system backward error at working precision.
        assert ls <= max(10 * ls_ref, c) or cons <= max(10 * cons_ref, c), (func, ls, cons)
        # Minimum norm: ‖x‖ agrees with lstsq's. The forward error of an
        # ill-conditioned problem is eps·cond(A) (over the retained part).
        cond = s[0] / s[rank - 1] if rank else 1.0
        tol = max(1e3 * EPS * cond * max(m, n), 1e-10)
        nx, nref = np.linalg.norm(x), np.linalg.norm(x_ref)
        assert abs(nx - nref) <= tol * max(nref, 1e-300) + 1e-300, (func, nx, nref)
        assert np.linalg.norm(x - x_ref) <= tol * nref + 1e-300


SQUARE = [
    ("494_bus", False), ("GD01_b", False), ("LFAT5", False), ("Ragusa16", False),
    ("Tina_AskCal", False), ("b1_ss", False), ("bcspwr01", False), ("bfwa62", False),
    ("bp_1200", False), ("cage5", False), ("dwt_878", False), ("gent113", False),
    ("hangGlider_2", True), ("lfat5b", False), ("nnc1374", False), ("olm500", False),
    ("pwr01b", False), ("rajat01", True), ("rajat19", False), ("reorientation_1", False),
    ("temp", False), ("tumorAntiAngiogenesis_2", False), ("watt_2", True),
    ("west0067", False), ("west0479", False), ("west0497", False), ("adder_dcop_05", False),
    ("bayer10", True),
]


@pytest.mark.parametrize("name", _params(SQUARE))
def test_spsolve_warns_exactly_where_scipy_does(matrices_dir, name):
    A = _read(matrices_dir, name).astype(np.float64)
    n = A.shape[0]
    b = np.ones(n)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        try:
            original("spsolve")(A, b)
        except RuntimeError:  # SuperLU fails outright on some singular ones
            pytest.skip("SciPy's SuperLU raised")
    scipy_warns = any(issubclass(w.category, spla.MatrixRankWarning) for w in rec)
    for backend in ("auto", "reference"):  # SuiteSparseQR and our multifrontal QR
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            x = spsolve(A, b, backend=backend)
        ours = [w for w in rec if issubclass(w.category, spla.MatrixRankWarning)]
        assert bool(ours) == scipy_warns, backend
        assert len(rec) == len(ours)  # nothing else
        if scipy_warns:
            assert str(ours[0].message) == "Matrix is exactly singular"
            assert np.all(np.isnan(x))
        else:
            normA = spla.norm(A, 1)
            berr = (np.linalg.norm(A @ x - b, 1)
                    / (normA * np.linalg.norm(x, 1) + np.linalg.norm(b, 1)))
            assert berr <= 100 * EPS * n, backend


# -- the rule module on synthetic problems -------------------------------------

def _rank_deficient(rng, m, n, r, scale_gap=1e-14):
    U, _ = np.linalg.qr(rng.standard_normal((m, m)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.zeros(min(m, n))
    s[:r] = np.logspace(0, -3, r)
    s[r:] = scale_gap * 1e-3
    return (U[:, :s.size] * s) @ V[:, :s.size].T


@pytest.mark.parametrize("m,n,r", [(60, 40, 40), (60, 40, 25), (40, 60, 30), (50, 50, 49)])
def test_min_norm_through_contract(rng, m, n, r):
    A = _rank_deficient(rng, m, n, r)
    b = rng.standard_normal(m)
    x = lsqr(sp.csc_array(A), b, atol=0, btol=0)[0]
    x_ref = np.linalg.lstsq(A, b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-8 * np.linalg.norm(x_ref)


@pytest.mark.parametrize("host_limit,method", [(0, "cod"), (10**6, "dense_cod")])
def test_cod_path_matches_svd_path(rng, monkeypatch, host_limit, method):
    """Beyond DENSE_LIMIT a complete orthogonal decomposition answers (sparse or dense)."""
    from scipy_gpuqr import QRFactorization
    A = sp.random_array((80, 50), density=0.15, rng=rng, format="csc")
    A = sp.hstack([A, A[:, :5] + A[:, 5:10]], format="csc")  # rank deficient by 5
    b = rng.standard_normal(80)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    monkeypatch.setattr(_lstsq, "DENSE_COD_HOST_LIMIT", host_limit)
    F = QRFactorization(A)
    x = F.solve(b)
    assert F.info["rank_decision"]["method"] == method
    assert F.rank == np.linalg.matrix_rank(A.toarray())
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_triangular_fast_path_when_well_conditioned(rng):
    from scipy_gpuqr import QRFactorization
    A = sp.random_array((300, 100), density=0.05, rng=rng, format="csc") + \
        sp.eye_array(300, 100, format="csc")
    F = QRFactorization(A)
    F.solve(np.ones(300))
    assert F.info["rank_decision"]["method"] == "triangular"


def test_exactly_singular_rule_is_column_relative():
    # A badly scaled but nonsingular matrix: tiny diagonal relative to the
    # largest, not relative to its own column.
    R = sp.csc_array(np.diag([1e20, 1.0, 1e-20]))
    assert not _lstsq.exactly_singular(R, 3)
    R = sp.csc_array(np.array([[1.0, 1.0], [0.0, 1e-17]]))
    assert _lstsq.exactly_singular(R, 2)
    R = sp.csc_array(np.array([[1.0, 1.0], [0.0, 0.0]]))
    assert _lstsq.exactly_singular(R, 2)


def test_refinement_brings_backward_error_to_lstsq_level(rng):
    """No gap in the singular values (1 .. 1e-15, columns scaled over 2 decades): the
    host solve refines with A's own residuals; the backward error is then no worse
    than numpy.linalg.lstsq's, and without refinement it is not better."""
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._factor import factored as _factored
    m = n = 300
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = ((U * np.logspace(0, -15, n)) @ V.T) * 1e4 * np.logspace(0, 2, n)[rng.permutation(n)]
    As = sp.csc_array(A)
    b = np.ones(m)
    x_ref = np.linalg.lstsq(A, b, rcond=None)[0]
    norm2 = np.linalg.norm(A, 2)
    ref = _ls_backward_error(A, x_ref, b, norm2)[0]
    F = QRFactorization(As, backend="reference")
    refined = _ls_backward_error(A, F.solve(b), b, norm2)[0]
    assert F.info["rank_decision"]["method"] == "svd"
    saved = _factored.REFINE_STEPS
    try:
        _factored.REFINE_STEPS = 0
        plain = _ls_backward_error(A, QRFactorization(As, backend="reference").solve(b), b,
                                   norm2)[0]
    finally:
        _factored.REFINE_STEPS = saved
    assert refined <= ref and refined < 0.1 * plain, (refined, ref, plain)


# bayer10 (13436², no gap in its singular values at lstsq's cutoff): numpy.linalg.lstsq
# (A.toarray(), b, rcond=None) with b = default_rng(7).standard_normal(13436), run once on
# the 2-core host (1341 s): rank 13303, ‖x‖ = 1.01340288563e8, ‖A‖₂ = 14142.7989638,
# ‖Aᵀr‖/(‖A‖₂‖r‖) = 9.6e-10. Heath's rule alone keeps 13362 columns.
BAYER10_LSTSQ = {"rank": 13303, "norm_x": 1.01340288563e8, "norm_a": 14142.7989638,
                 "berr": 9.6e-10}


@pytest.mark.slow
def test_bayer10_host_rank_is_lstsq_rank(matrices_dir):
    """The host path beyond its SVD limit reveals lstsq's rank, through R's sparse
    triangular solves (no dense copy of R: scipy_gpuqr._factor.sparse_subspace)."""
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._factor.sparse_subspace import SparseSubspaceCOD
    A = _read(matrices_dir, "bayer10").astype(np.float64)
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "subspace_cod" and dec["rank_revealed"], dec
    assert isinstance(F._core.rank_decision()._cod, SparseSubspaceCOD)
    assert F.rank == BAYER10_LSTSQ["rank"]
    assert abs(np.linalg.norm(x) / BAYER10_LSTSQ["norm_x"] - 1) <= 1e-5
    r = b - A @ x
    berr = np.linalg.norm(A.T @ r) / (BAYER10_LSTSQ["norm_a"] * np.linalg.norm(r))
    assert berr <= 10 * BAYER10_LSTSQ["berr"]


def test_nullspace_blocks_stay_on_the_host_when_the_device_is_full(monkeypatch):
    """A device whose q × d blocks do not fit beside the factors (MemoryError):
    the nullspace COD runs again with host blocks (the solves' results copied
    back), not the dense COD of all of R, and answers as lstsq."""
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._testing_matrices import chessboard_boundary

    class _FullDevice:                  # stands for CuPy: no block fits
        pass
    full = _FullDevice()
    tried = nullspace_blocks_fail_on(monkeypatch, full)
    solve_ops = _lstsq.MinNormSolver._solve_ops
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 100)
    monkeypatch.setattr(_lstsq, "_free_device_pool", lambda: None)
    monkeypatch.setattr(_lstsq, "DenseCOD", None)           # must not be reached
    monkeypatch.setattr(_lstsq.MinNormSolver, "_solve_ops",
                        lambda self: solve_ops(self)[:2] + (full,))
    A = chessboard_boundary(5, 6, 2)
    b = np.random.default_rng(5).standard_normal(A.shape[0])
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    assert tried == [full, np]
    assert F.info["rank_decision"]["method"] == "nullspace_cod"
    x_ref, _, rank, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert F.rank == rank
    assert np.linalg.norm(x - x_ref) <= 1e-12 * np.linalg.norm(x_ref)
