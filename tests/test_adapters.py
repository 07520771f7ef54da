"""SciPy-signature entry points: signatures, dtypes, shapes, warnings, fallbacks."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse import SparseEfficiencyWarning

import scipy_gpuqr
from scipy_gpuqr import factorized, lsmr, lsqr, qr, spsolve
from scipy_gpuqr._api import fallback as _fallback
from scipy_gpuqr._api.originals import ORIGINALS

EPS = np.finfo(np.float64).eps


@pytest.mark.parametrize("name", ["lsqr", "lsmr", "spsolve", "factorized"])
def test_signature_prefix_matches_scipy(name):
    ours = inspect.signature(getattr(scipy_gpuqr, name)).parameters
    theirs = inspect.signature(ORIGINALS[name]).parameters
    ours_list = list(ours.values())
    theirs_list = list(theirs.values())
    assert [(p.name, p.default, p.kind) for p in ours_list[:len(theirs_list)]] == \
        [(p.name, p.default, p.kind) for p in theirs_list]
    for extra in ours_list[len(theirs_list):]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY
    assert {"backend", "gpuqr_options"} <= set(ours)


def test_originals_are_scipys_defining_functions():
    import importlib
    assert ORIGINALS["lsqr"] is vars(importlib.import_module(
        "scipy.sparse.linalg._isolve.lsqr"))["lsqr"]
    assert ORIGINALS["spsolve"].__module__.startswith("scipy.")


def _well(rng, m, n):
    return (sp.random_array((m, n), density=0.2, rng=rng, format="csc")
            + sp.eye_array(m, n, format="csc"))


def test_lsqr_tuple_and_istop(rng):
    A = _well(rng, 30, 20)
    x_true = rng.standard_normal(20)
    out = lsqr(A, A @ x_true, backend="cpu")
    assert len(out) == 10 and out[2] == 0  # direct: no iterations
    x, istop, itn, r1, r2, anorm, acond, arnorm, xnorm, var = out
    assert istop == 1  # consistent system
    assert np.linalg.norm(x - x_true) <= 1e-10 * np.linalg.norm(x_true) * acond
    assert np.isclose(xnorm, np.linalg.norm(x))
    assert np.isclose(anorm, spla.norm(A, "fro"))
    assert np.all(var == 0)
    b = rng.standard_normal(30)
    out = lsqr(A, b, backend="cpu")
    assert out[1] == 2  # least-squares solution good enough
    assert np.isclose(out[3], np.linalg.norm(b - A @ out[0]))
    sc = ORIGINALS["lsqr"](A, b, atol=1e-12, btol=1e-12, iter_lim=1000)
    assert sc[1] == 2
    assert np.linalg.norm(out[0] - sc[0]) <= 1e-6 * np.linalg.norm(sc[0])


def test_lsqr_zero_rhs_and_x0(rng):
    A = _well(rng, 20, 10)
    out = lsqr(A, np.zeros(20))
    assert out[1] == 0 and np.all(out[0] == 0) and out[0].dtype == np.float64
    b = rng.standard_normal(20)
    x0 = rng.standard_normal(10)
    x = lsqr(A, b, x0=x0, backend="cpu")[0]
    # full rank: same LS solution
    assert np.allclose(x, lsqr(A, b, backend="cpu")[0], rtol=1e-10, atol=1e-12)
    # rank-deficient: x0 + minimum-norm correction
    Ad = np.hstack([A.toarray(), A.toarray()[:, :3]])
    x = lsqr(sp.csc_array(Ad), b, x0=np.ones(13), backend="cpu")[0]
    dx = np.linalg.lstsq(Ad, b - Ad @ np.ones(13), rcond=None)[0]
    assert np.allclose(x, 1 + dx, atol=1e-10)
    # under auto: SciPy's answer from x0
    ours, theirs = lsqr(A, b, x0=x0), ORIGINALS["lsqr"](A, b, x0=x0)
    assert np.array_equal(ours[0], theirs[0]) and ours[1:9] == theirs[1:9]


def test_lsqr_damp_and_calc_var(rng):
    A = _well(rng, 25, 12)
    b = rng.standard_normal(25)
    damp = 0.3
    out = lsqr(A, b, damp=damp, calc_var=True, backend="cpu")
    Ad = A.toarray()
    G = Ad.T @ Ad + damp ** 2 * np.eye(12)
    x_ref = np.linalg.solve(G, Ad.T @ b)
    assert np.allclose(out[0], x_ref, rtol=1e-10)
    assert np.allclose(out[9], np.diag(np.linalg.inv(G)), rtol=1e-8)
    r = b - Ad @ out[0]
    assert np.isclose(out[4], np.hypot(np.linalg.norm(r), damp * np.linalg.norm(out[0])))
    assert np.isclose(out[7], np.linalg.norm(Ad.T @ r - damp ** 2 * out[0]))
    # under auto: SciPy's estimate of the variances, as SciPy computes it
    ours = lsqr(A, b, damp=damp, calc_var=True)
    theirs = ORIGINALS["lsqr"](A, b, damp=damp, calc_var=True)
    assert np.array_equal(ours[9], theirs[9]) and np.array_equal(ours[0], theirs[0])


def test_lsqr_show_prints(rng, capsys):
    lsqr(_well(rng, 10, 5), np.ones(10), show=True)
    assert "istop" in capsys.readouterr().out


def test_lsmr_tuple_and_dtype(rng):
    A = _well(rng, 30, 20)
    b = rng.standard_normal(30)
    out = lsmr(A, b, backend="cpu")
    assert len(out) == 8 and out[2] == 0
    x = out[0]
    sc = ORIGINALS["lsmr"](A, b, atol=1e-12, btol=1e-12, maxiter=2000)
    assert np.linalg.norm(x - sc[0]) <= 1e-6 * np.linalg.norm(sc[0])
    assert np.isclose(out[7], np.linalg.norm(x))
    x32 = lsmr(A.astype(np.float32), b.astype(np.float32))[0]
    assert x32.dtype == ORIGINALS["lsmr"](A.astype(np.float32), b.astype(np.float32))[0].dtype
    assert lsmr(A.astype(np.float32), b)[0].dtype == np.float64
    assert lsqr(A.astype(np.float32), b.astype(np.float32))[0].dtype == np.float64


@pytest.mark.parametrize("shape", [(40, 25), (25, 40), (30, 30)])
def test_no_warnings_ever(rng, shape):
    m, n = shape
    A = sp.random_array(shape, density=0.3, rng=rng, format="csr")
    A = sp.hstack([A, A[:, :2]], format="coo")  # rank deficient, non-CSC
    cond = sp.diags_array(np.logspace(0, -11, A.shape[0])) @ A  # ill-conditioned
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for M in (A, cond, A.toarray()):
            lsqr(M, np.ones(m))
            lsmr(M, np.ones(m))
            lsqr(M, np.ones(m), damp=0.1, calc_var=True)


# backend None: 'auto' (SciPy's SuperLU answers without a GPU); 'cpu': the sparse QR
SQUARE_BACKENDS = [None, "cpu"]


@pytest.mark.parametrize("backend", SQUARE_BACKENDS)
def test_spsolve_shapes_dtypes_and_sparse_b(rng, backend):
    A = _well(rng, 12, 12)
    b = rng.standard_normal(12)
    x = spsolve(A, b, backend=backend)
    assert x.shape == (12,) and np.allclose(A @ x, b)
    assert spsolve(A, b[:, None], backend=backend).shape == (12,)
    X = spsolve(A, np.ones((12, 3)), backend=backend)
    assert X.shape == (12, 3) and np.allclose(A @ X, 1)
    A32 = A.astype(np.float32)
    assert spsolve(A32, b.astype(np.float32), backend=backend).dtype == np.float32
    assert spsolve(A32, np.ones(12, dtype=np.int64), backend=backend).dtype == np.float64
    assert spsolve(A.astype(np.int64).astype(np.float64), b, backend=backend).dtype == np.float64
    for cls in (sp.csc_matrix, sp.csr_matrix, sp.csc_array, sp.csr_array):
        Bs = sp.csc_array(np.eye(12)[:, :3])
        with warnings.catch_warnings():
            # SciPy's own spsolve factorizes CSR A for a sparse b through splu, which warns
            warnings.simplefilter("ignore", SparseEfficiencyWarning)
            Xs = spsolve(cls(A), Bs, backend=backend)
            ref = ORIGINALS["spsolve"](cls(A), Bs)
        assert type(Xs) is cls
        assert np.allclose(A @ Xs.toarray(), np.eye(12)[:, :3])
        assert type(ref) is type(Xs)
    with pytest.warns(SparseEfficiencyWarning, match="sparse b"):
        spsolve(A, sp.csr_array(np.eye(12)[:, :2]), backend=backend)
    with pytest.warns(SparseEfficiencyWarning, match="CSC or CSR"):
        spsolve(sp.coo_array(A), b, backend=backend)
    assert spsolve(A, sp.csc_array(b[:, None]), backend=backend).shape == (12,)


@pytest.mark.parametrize("backend", SQUARE_BACKENDS)
@pytest.mark.parametrize("permc", [None, "COLAMD", "NATURAL", "MMD_ATA", "MMD_AT_PLUS_A"])
def test_spsolve_permc_spec(rng, permc, backend):
    A = _well(rng, 15, 15)
    b = rng.standard_normal(15)
    assert np.allclose(A @ spsolve(A, b, permc_spec=permc, backend=backend), b)


@pytest.mark.parametrize("backend", SQUARE_BACKENDS)
def test_spsolve_singular_like_scipy(backend):
    A = sp.csc_array(np.array([[1.0, 2.0], [2.0, 4.0]]))
    with pytest.warns(spla.MatrixRankWarning, match="exactly singular"):
        x = spsolve(A, np.ones(2), backend=backend)
    assert np.all(np.isnan(x))


@pytest.mark.parametrize("backend", SQUARE_BACKENDS)
def test_factorized_trans_and_2d(rng, backend):
    A = _well(rng, 10, 10)
    solve = factorized(A, backend=backend)
    b = rng.standard_normal(10)
    assert np.allclose(A @ solve(b), b)
    assert np.allclose(A.T @ solve(b, trans="T"), b)
    assert np.allclose(A.T @ solve(b, "H"), b)
    B = rng.standard_normal((10, 4))
    assert np.allclose(A @ solve(B), B)
    with pytest.raises(ValueError, match="trans"):
        solve(b, trans="X")
    with pytest.raises(RuntimeError, match="exactly singular"):
        factorized(sp.csc_array(np.diag([1.0, 0.0])), backend=backend)
    with pytest.warns(SparseEfficiencyWarning):
        factorized(sp.csr_array(A), backend=backend)


@pytest.mark.parametrize("shape", [(30, 20), (20, 30), (25, 25)])
@pytest.mark.parametrize("tol", ["default", None, 1e-3])
def test_qr_modes(rng, shape, tol):
    A = sp.random_array(shape, density=0.25, rng=rng, format="csr")
    Q, R, perm, rank = qr(A, tol=tol)
    m, n = shape
    assert sp.issparse(R) and R.shape[1] == n
    Rd = R.toarray()
    assert np.allclose(np.tril(Rd, -1), 0)
    Ad = A.toarray()
    err = np.linalg.norm(Ad[:, perm] - Q @ Rd)
    normA = np.linalg.norm(Ad)
    if tol is None:
        assert err <= 100 * EPS * normA * max(shape)
        assert rank == min(shape)
    else:
        assert err <= 1e-2 * normA  # the dropped part is at most ~tol·sqrt(n)
        assert rank <= min(shape)
    QtQ = (Q.T @ Q).toarray()
    assert np.allclose(QtQ, np.eye(QtQ.shape[0]), atol=1e-12)
    assert qr(A, mode="r", tol=tol).Q is None
    H = qr(A, mode="householder", tol=tol).Q
    y = rng.standard_normal(m)
    assert np.allclose(H.T @ (H @ y), y)
    assert np.allclose((H @ np.eye(m)[:, :R.shape[0]]), Q.toarray())
    with pytest.raises(ValueError, match="mode"):
        qr(A, mode="full")


def test_qr_rank_is_spqr_default_rule(rng):
    B = sp.random_array((40, 10), density=0.4, rng=rng, format="csc")
    A = sp.hstack([B, B[:, :3] * 2.0], format="csc")
    assert qr(A).rank == 10
    assert qr(A, tol=None).rank == 13


def test_fallbacks_call_scipy_originals(rng, monkeypatch):
    A = _well(rng, 10, 10)
    calls = []
    real = dict(ORIGINALS)

    def spy(name):
        def f(*args, **kwargs):
            calls.append(name)
            return real[name](*args, **kwargs)
        return f
    monkeypatch.setattr(_fallback, "original", spy)
    Ac = A.astype(np.complex128)
    bc = np.ones(10) + 1j
    x = lsqr(Ac, bc, atol=1e-12, btol=1e-12)[0]
    assert x.dtype == np.complex128 and np.allclose(Ac @ x, bc, atol=1e-6)
    assert lsmr(Ac, bc)[0].dtype == np.complex128
    assert np.allclose(Ac @ spsolve(Ac, bc), bc)
    lsqr(spla.aslinearoperator(A), np.ones(10))
    factorized(Ac)
    assert calls == ["lsqr", "lsmr", "spsolve", "lsqr", "factorized"]


def test_complex_and_operators_answered_under_patch(rng):
    """Even with SciPy patched by hand, fallbacks reach the saved originals."""
    import scipy.sparse.linalg as mod
    A = spla.aslinearoperator(_well(rng, 8, 8))
    saved = mod.lsqr
    mod.lsqr = lsqr
    try:
        out = mod.lsqr(A, np.ones(8))
    finally:
        mod.lsqr = saved
    assert len(out) == 10


def _bwd(A, x, b):
    r = b - A @ x
    return np.linalg.norm(A.T @ r) / (spla.norm(A, "fro") * np.linalg.norm(r))


def test_iterate_first_answers_well_conditioned_problems(rng):
    """Under 'auto', SciPy's LSQR answers well-conditioned problems: SciPy's tuple.

    ch5-6-b3 (1800×1200, 0.6 GFlop to factorize): LSQR needs about 12
    iterations. With the caller's tolerances at 0 the QR answers, at working
    precision.
    """
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    A = chessboard_boundary(5, 6, 3)
    b = rng.standard_normal(A.shape[0])
    auto, scipys = lsqr(A, b), ORIGINALS["lsqr"](A, b)
    assert auto[2] > 0 and np.array_equal(auto[0], scipys[0]) and auto[1:9] == scipys[1:9]
    direct, exact = lsqr(A, b, backend="cpu"), lsqr(A, b, atol=0, btol=0)
    assert direct[2] == 0 and exact[2] == 0
    assert _bwd(A, direct[0], b) <= 16 * EPS and _bwd(A, exact[0], b) <= 16 * EPS
    assert np.linalg.norm(auto[0] - direct[0]) <= 1e-5 * np.linalg.norm(direct[0])
    m_auto, m_scipy = lsmr(A, b), ORIGINALS["lsmr"](A, b)
    assert m_auto[2] > 0 and np.array_equal(m_auto[0], m_scipy[0])


def test_iterate_first_respects_explicit_backends_and_options(rng, monkeypatch):
    A = _well(rng, 200, 80)
    b = rng.standard_normal(200)
    assert lsqr(A, b)[2] > 0
    assert lsqr(A, b, gpuqr_options={"iterate_first": False})[2] == 0
    assert lsqr(A, b, gpuqr_options={"backend": "reference"})[2] == 0
    assert lsqr(A, b, calc_var=True)[2] > 0        # SciPy's variance estimate
    assert lsqr(A, b, calc_var=True, backend="cpu")[2] == 0
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "cpu")
    assert lsqr(A, b)[2] == 0


def test_iterate_first_falls_back_on_ill_conditioned_problems(rng):
    """Singular values spread over 1e-13..1: asked for 1e-12, SciPy's LSQR stops at its
    iteration limit (or at conlim given more iterations); the QR answers instead."""
    n = 60
    U, _ = np.linalg.qr(rng.standard_normal((150, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = sp.csc_array((U * np.logspace(0, -13, n)) @ V.T)
    b = rng.standard_normal(150)
    for limit in (None, 10_000):
        tols = {"atol": 1e-12, "btol": 1e-12, "iter_lim": limit}
        assert ORIGINALS["lsqr"](A, b, **tols)[1] in (3, 7)
        out = lsqr(A, b, **tols)
        assert out[2] == 0  # the factorization answered
        x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
        assert abs(np.linalg.norm(out[0]) - np.linalg.norm(x_ref)) <= \
            1e-2 * np.linalg.norm(x_ref)


def test_iterate_first_damp_and_x0(rng):
    """Damping and a starting point: SciPy's answer under 'auto', the QR's agrees."""
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    A = chessboard_boundary(5, 6, 3)
    m, n = A.shape
    b = rng.standard_normal(m)
    x0 = rng.standard_normal(n)
    for kwargs in ({"damp": 0.3}, {"x0": x0}, {"damp": 0.1, "x0": x0}):
        auto, scipys = lsqr(A, b, **kwargs), ORIGINALS["lsqr"](A, b, **kwargs)
        assert auto[2] > 0 and np.array_equal(auto[0], scipys[0]) and auto[1:9] == scipys[1:9]
        exact, direct = lsqr(A, b, atol=0, btol=0, **kwargs), lsqr(A, b, backend="cpu",
                                                                    **kwargs)
        assert exact[2] == 0
        np.testing.assert_allclose(exact[0], direct[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(exact[3:5], direct[3:5], rtol=1e-8)
        assert np.linalg.norm(auto[0] - direct[0]) <= 1e-4 * np.linalg.norm(direct[0])


def test_iterate_first_returns_scipys_answer_even_when_inexact(matrices_dir):
    """watt_2 (cond 1.4e11): SciPy's LSQR stops after a few iterations, its tests
    satisfied though x is far off; 'auto' returns that answer as SciPy does. Asked
    for maximum precision (atol = btol = 0), the QR answers at working precision."""
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices_dir / "watt_2.mtx"))).astype(np.float64)
    b = A @ np.random.default_rng(7).standard_normal(A.shape[1])
    scipys = ORIGINALS["lsqr"](A, b)
    auto = lsqr(A, b)
    assert scipys[1] in (1, 2) and np.array_equal(auto[0], scipys[0])
    x = lsqr(A, b, atol=0, btol=0)[0]
    r = b - A @ x
    square = np.linalg.norm(r) / (spla.norm(A) * np.linalg.norm(x) + np.linalg.norm(b))
    assert square <= 100 * EPS


def test_iterate_first_small_residual_least_squares_still_right(rng):
    """Noisy right-hand side: SciPy's answer under 'auto'; the exact one agrees to atol."""
    A = _well(rng, 400, 150)
    b = A @ rng.standard_normal(150) + 1e-3 * rng.standard_normal(400)
    auto, scipys = lsqr(A, b), ORIGINALS["lsqr"](A, b)
    assert np.array_equal(auto[0], scipys[0])
    direct = lsqr(A, b, backend="cpu")
    np.testing.assert_allclose(lsqr(A, b, atol=0, btol=0)[0], direct[0], rtol=1e-9, atol=0)
    np.testing.assert_allclose(auto[0], direct[0], rtol=1e-4, atol=0)


def test_iterate_first_stops_early_when_hopeless(rng):
    """A problem whose tests fall too slowly is handed to the QR long before SciPy's
    run would end (it would run to iter_lim)."""
    import logging
    n = 300
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = sp.csc_array((U * np.logspace(0, -14, n)) @ U.T)
    b = rng.standard_normal(n)
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logger = logging.getLogger("scipy_gpuqr")
    handler, level = Collect(level=logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        out = lsqr(A, b, atol=1e-12, btol=1e-12, conlim=1e16, iter_lim=50_000)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert out[2] == 0
    line = [r for r in records if r.startswith("lsqr ")][-1]
    assert "stopped by auto's rule" in line, line
    assert int(line.split("istop 0 after ")[1].split()[0]) < 2000


def test_iterate_first_allowance_follows_predicted_factorization_time(rng, monkeypatch):
    """Once analysed, the iterations may spend ALLOWANCE_SHARE of the predicted
    factorization time, no more."""
    from scipy_gpuqr._dispatch import iterate_first as _iterate_first
    from scipy_gpuqr._dispatch import rank_cost
    A = _well(rng, 300, 120)
    b = rng.standard_normal(300)
    monkeypatch.setattr(_iterate_first, "ANALYSIS_DEFERRAL", 0.0)    # analyse at once
    monkeypatch.setattr(_iterate_first, "CHECK_INTERVAL_S", 0.0)     # a checkpoint soon
    monkeypatch.setattr(rank_cost, "RANK_S_PER_CUBE", 0.0)          # the QR costs nothing
    monkeypatch.setattr(_iterate_first, "predicted_seconds", lambda *a, **k: 0.0)
    assert lsqr(A, b)[2] == 0                       # no allowance: the QR answers
    monkeypatch.setattr(_iterate_first, "predicted_seconds", lambda *a, **k: 1e3)
    out, scipys = lsqr(A, b), ORIGINALS["lsqr"](A, b)
    assert out[2] > 0 and np.array_equal(out[0], scipys[0])


def test_cost_model_interpolation():
    from scipy_gpuqr._dispatch.cost_model import interpolate_seconds, predicted_seconds
    pts = [(1e6, 1e-3), (1e9, 1e-1), (1e10, 0.5)]
    assert interpolate_seconds(pts, 1e3) == 1e-3              # fixed cost below
    assert np.isclose(interpolate_seconds(pts, 1e9), 0.1)
    assert np.isclose(interpolate_seconds(pts, 1e11), 5.0)    # the largest point's rate
    mid = interpolate_seconds(pts, np.sqrt(1e6 * 1e9))        # log-log midpoint
    assert np.isclose(mid, np.sqrt(1e-3 * 1e-1))
    assert predicted_seconds("cpu", 1e12) > predicted_seconds("cpu", 1e9) > 0
    assert predicted_seconds("gpu", 1e12) < predicted_seconds("cpu", 1e12)
