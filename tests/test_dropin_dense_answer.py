"""The exact answer of a tiny problem by LAPACK on a dense copy
(:mod:`scipy_gpuqr._factor.dense_least_squares`).

Under ``auto``, where SciPy's iterations stall on a problem whose dense QR is
tiny, the answer is the sparse QR's (the minimum-norm least-squares solution,
lstsq's rank rule) made densely: the same rank, x to rounding, the same
tuple's meaning; the log says the dense route answered. Explicit backends and
larger problems keep the sparse QR.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import TEST_MATRICES
from scipy_gpuqr import lsmr, lsqr
from scipy_gpuqr._factor.dense_least_squares import (dense_answer, dense_answer_fits,
                                                     dense_qr_flops)
from scipy_gpuqr._factor.least_squares import (check_problem, solve_least_squares,
                                               start_problem)
from scipy_gpuqr._options import resolve_settings
from scipy_gpuqr.io import mmread

#: small shared matrices (temp, scaled to 1e38, is left to the backward-error tests)
SMALL = ["lp_share1b", "ash219", "gent113", "GD06_theory", "n3c4-b4", "problem", "r2",
         "row0", "west0067", "lpi_itest6", "bfwa62"]


def _mtx(name):
    return sp.csc_array(mmread(str(TEST_MATRICES / f"{name}.mtx"))).astype(np.float64)


def _b(A, seed=7):
    return np.random.default_rng(seed).standard_normal(A.shape[0])


def _rel(u, v):
    return float(np.linalg.norm(u - v) / max(np.linalg.norm(v), 1e-300))


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("damp", [0.0, 0.3])
@pytest.mark.parametrize("with_x0", [False, True])
def test_dense_answer_is_the_sparse_qrs(name, damp, with_x0):
    A = _mtx(name)
    m, n = A.shape
    x0 = np.random.default_rng(3).standard_normal(n) if with_x0 else None
    problem = check_problem(A, _b(A), x0, damp, func="lsqr")
    begin = start_problem(problem)
    sparse = solve_least_squares(problem, begin, calc_var=True,
                                 settings=resolve_settings("cpu", None))
    dense = dense_answer(problem, begin, calc_var=True)
    assert dense.factorization is None and dense.who.startswith("dense QR on CPU")
    assert f"rank {sparse.factorization.rank} of" in dense.who
    assert _rel(dense.x, sparse.x) < 1e-10
    if np.isfinite(sparse.var).all():
        assert _rel(dense.var, sparse.var) < 1e-10
    else:       # the sparse path's NaN (a rank decision without R's SVD): the exact values
        M = sp.vstack([A, damp * sp.eye_array(n)]).toarray() if damp else A.toarray()
        P = np.linalg.pinv(M, rcond=np.finfo(float).eps * max(M.shape))
        assert _rel(dense.var, (P ** 2).sum(axis=1)) < 1e-10
    for field in ("anorm", "bnorm", "r2norm"):
        assert getattr(dense, field) == pytest.approx(getattr(sparse, field), rel=1e-9,
                                                      abs=1e-12 * dense.anorm * dense.bnorm)
    # the least-squares optimality of both: ‖Aᵀr − damp²dx‖ at rounding's level
    scale = dense.anorm * (dense.r2norm + dense.anorm * np.linalg.norm(dense.dx)) + 1
    assert dense.arnorm <= 1e-12 * scale and sparse.arnorm <= 1e-12 * scale
    # acond: ‖Abar‖_F / σ_min of the kept part (an estimate where no SVD ran)
    assert dense.acond == pytest.approx(sparse.acond, rel=2.0)
    sparse.factorization.free()


@pytest.mark.parametrize("shape,rank", [((40, 12), 12), ((40, 12), 7), ((12, 40), 12),
                                        ((12, 40), 5), ((20, 20), 13)])
def test_dense_answer_is_lstsqs(shape, rank):
    """Tall, wide, square; full rank and deficient: numpy.linalg.lstsq's answer."""
    rng = np.random.default_rng(11)
    m, n = shape
    D = rng.standard_normal((m, rank)) @ rng.standard_normal((rank, n))
    A = sp.csc_array(D)
    b = rng.standard_normal(m)
    problem = check_problem(A, b, None, 0.0, func="lsqr")
    ans = dense_answer(problem, start_problem(problem), calc_var=True)
    x = np.linalg.lstsq(D, b, rcond=None)[0]
    assert f"rank {rank} of" in ans.who
    assert _rel(ans.x, x) < 1e-10
    P = np.linalg.pinv(D, rcond=np.finfo(float).eps * max(m, n))
    assert _rel(ans.var, (P ** 2).sum(axis=1)) < 1e-10


def _logged(caplog, call):
    with caplog.at_level(logging.INFO, logger="scipy_gpuqr"):
        caplog.clear()
        out = call()
    return out, " ".join(r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_stalled_tiny_run_answered_densely(method, caplog):
    """lp_share1b under auto, the run stopped at its limit: the dense route answers,
    with the explicit CPU backend's rank, x and tuple (istop, itn, norms)."""
    A = _mtx("lp_share1b")
    b = _b(A)
    f = {"lsqr": lsqr, "lsmr": lsmr}[method]
    lim = {"lsqr": "iter_lim", "lsmr": "maxiter"}[method]
    auto, log = _logged(caplog, lambda: f(A, b, **{lim: 5}))
    assert "dense QR on CPU (LAPACK" in log and "answered" in log
    cpu = f(A, b, **{lim: 5}, backend="cpu")
    assert _rel(auto[0], cpu[0]) < 1e-10
    assert auto[1:3] == cpu[1:3]
    last = 9 if method == "lsqr" else 8
    for k in range(3, last):
        a, c = auto[k], cpu[k]
        if k == 6:          # acond: the 1-norm estimates of two R's (rel=2 below)
            assert a == pytest.approx(c, rel=2.0)
            continue
        # residual norms at rounding's level (a consistent wide system) differ by it
        assert a == pytest.approx(c, rel=1e-6, abs=1e-8 * np.linalg.norm(b))


def test_calc_var_damped_x0_through_lsqr():
    A = _mtx("ash219")
    b = _b(A)
    x0 = np.random.default_rng(5).standard_normal(A.shape[1])
    kw = dict(damp=0.2, x0=x0, calc_var=True, iter_lim=2)
    auto = lsqr(A, b, **kw)
    cpu = lsqr(A, b, **kw, backend="cpu")
    assert _rel(auto[0], cpu[0]) < 1e-10 and _rel(auto[9], cpu[9]) < 1e-10
    assert auto[1:3] == cpu[1:3]
    for k in (3, 4, 5, 7, 8):
        assert auto[k] == pytest.approx(cpu[k], rel=1e-8, abs=1e-12)


def test_gate():
    A = _mtx("lp_share1b")
    p = check_problem(A, _b(A), None, 0.0, func="lsmr")
    auto = resolve_settings(None, None)
    assert dense_answer_fits(p, auto)
    assert not dense_answer_fits(p, resolve_settings("cpu", None))     # explicit backend
    assert not dense_answer_fits(p, auto, planned=object())             # the rule planned
    big = check_problem(_mtx("lp_e226"), _b(_mtx("lp_e226")), None, 0.0, func="lsmr")
    assert not dense_answer_fits(big, auto)
    assert dense_qr_flops((100, 10), 1.0) == dense_qr_flops((110, 10), 0.0)


def test_explicit_backend_keeps_the_sparse_qr(caplog):
    A = _mtx("lp_share1b")
    _, log = _logged(caplog, lambda: lsmr(A, _b(A), backend="cpu"))
    assert "dense QR" not in log and "QR on CPU" in log


@pytest.mark.gpu
def test_on_a_gpu_host_lp_share1b_is_answered_densely(caplog):
    """With a GPU present, lp_share1b's stalled LSMR (its default limit) is still answered
    on the host, densely on the caller's thread, with the sparse QR's answer."""
    A = _mtx("lp_share1b")
    b = _b(A)
    auto, log = _logged(caplog, lambda: lsmr(A, b))
    assert "dense QR on CPU (LAPACK" in log, log
    cpu = lsmr(A, b, backend="cpu")
    assert _rel(auto[0], cpu[0]) < 1e-10 and auto[1:3] == cpu[1:3]
