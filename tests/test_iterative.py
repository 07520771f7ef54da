"""Our LSQR/LSMR (scipy_gpuqr._iterative) against SciPy's on the same input.

The promise is SciPy's recurrences and stopping tests, so each case checks
the same ``istop`` and ``itn``, x within 1e-10·‖x‖ and every norm within
1e-10 relative; on NumPy with sparse A the runs are in fact bit-identical
(checked where it is the point). Every case runs twice: with the stopping
test judged at once (the NumPy way) and pipelined one step behind (the GPU
way, one device→host copy per iteration), which must not change a bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from conftest import TEST_MATRICES
from scipy_gpuqr._iterative import IterationState, LSMRResult, LSQRResult, lsmr, lsqr
from scipy_gpuqr._iterative import _common
from scipy_gpuqr._iterative.lsmr import _lsmr
from scipy_gpuqr._iterative.lsqr import _lsqr

RTOL = 1e-10
LSQR_NORMS = ("r1norm", "r2norm", "anorm", "acond", "arnorm", "xnorm")
LSMR_NORMS = ("normr", "normar", "norma", "conda", "normx")


# ---------------------------------------------------------------------------
# problems

def _sparse(m, n, density, seed, shift=1.0):
    A = sp.random(m, n, density=density, random_state=seed, format="csr")
    return (A + shift * sp.eye(m, n, format="csr")).tocsr()


def _rhs(m, seed):
    return np.random.default_rng(seed).standard_normal(m)


def _ill_conditioned(n=60, seed=3):
    # singular values spread over 1e-8..1: LSQR/LSMR's cond estimate crosses conlim early
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n + 20, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return sp.csr_array((U * np.logspace(0, -8, n)) @ V.T)


def _mtx(name):
    return sp.csr_array(scipy.io.mmread(str(TEST_MATRICES / name)))


#: name -> (A, b, keyword arguments shared by both solvers)
def _cases():
    tall, square, wide = _sparse(300, 100, 0.05, 1), _sparse(200, 200, 0.03, 2), \
        _sparse(80, 200, 0.05, 4)
    x_true = _rhs(200, 9)
    return {
        "tall": (tall, _rhs(300, 0), {}),
        "square": (square, _rhs(200, 1), {}),
        "square_consistent": (square, square @ x_true, {}),
        "wide": (wide, _rhs(80, 2), {}),
        "tall_damp": (tall, _rhs(300, 0), {"damp": 0.7}),
        "wide_damp": (wide, _rhs(80, 2), {"damp": 1e-2}),
        "tall_x0": (tall, _rhs(300, 0), {"x0": _rhs(100, 5)}),
        "damp_x0": (square, _rhs(200, 1), {"damp": 0.3, "x0": _rhs(200, 6)}),
        "iteration_limit": (_mtx("494_bus.mtx"), _rhs(494, 3), {"limit": 25}),
        "conlim": (_ill_conditioned(), _rhs(80, 4), {"conlim": 1e3}),
        "machine_precision": (tall, _rhs(300, 0), {"atol": 0.0, "btol": 0.0}),
        "all_zero_tolerances": (_ill_conditioned(30, 7), _rhs(50, 8),
                                {"atol": 0.0, "btol": 0.0, "conlim": 0.0}),
        "loose": (square, _rhs(200, 1), {"atol": 1e-2, "btol": 1e-2}),
        "column_rhs": (tall, _rhs(300, 0).reshape(-1, 1), {}),
        "integer_rhs": (tall, np.arange(300) % 7 - 3, {}),
        "identity_breakdown": (sp.eye(50, format="csr"), _rhs(50, 10), {}),
        "diagonal_breakdown": (sp.diags_array(np.repeat([1.0, 2.0, 3.0], 10)).tocsr(),
                               _rhs(30, 11), {}),
        "csc": (tall.tocsc(), _rhs(300, 0), {}),
        "coo_wide": (wide.tocoo(), _rhs(80, 2), {"damp": 0.1}),
        "lp_e226_transposed": (_mtx("lp_e226_transposed.mtx"), _rhs(472, 12), {}),
        "lp_e226": (_mtx("lp_e226.mtx"), _rhs(223, 13), {}),
        "west0479": (_mtx("west0479.mtx"), _rhs(479, 14), {}),
        "494_bus": (_mtx("494_bus.mtx"), _rhs(494, 15), {}),
        "494_bus_damp": (_mtx("494_bus.mtx"), _rhs(494, 15), {"damp": 1e-3, "limit": 300}),
    }


CASES = _cases()


def _kwargs(kw, solver):
    kw = dict(kw)
    limit = kw.pop("limit", None)
    if limit is not None:
        kw["iter_lim" if solver == "lsqr" else "maxiter"] = limit
    return kw


# ---------------------------------------------------------------------------
# comparison helpers

def _close(ours, theirs, what):
    ours, theirs = float(ours), float(theirs)
    assert ours == pytest.approx(theirs, rel=RTOL, abs=1e-300), \
        f"{what}: ours {ours!r}, SciPy {theirs!r}"


def _same_x(x, xs):
    x, xs = np.asarray(x), np.asarray(xs)
    assert x.shape == xs.shape
    scale = max(np.linalg.norm(xs), 1e-300)
    err = np.linalg.norm(x - xs)
    assert err <= RTOL * scale, f"‖x − x_scipy‖ = {err:.3e}, ‖x_scipy‖ = {scale:.3e}"


def _check_lsqr(res, ref):
    assert isinstance(res, LSQRResult) and len(res) == 10
    assert (res.istop, res.itn) == (ref[1], ref[2])
    _same_x(res.x, ref[0])
    for name, ours, theirs in zip(LSQR_NORMS, res[3:9], ref[3:9]):
        _close(ours, theirs, name)
    _same_x(res.var, ref[9])


def _check_lsmr(res, ref):
    assert isinstance(res, LSMRResult) and len(res) == 8
    assert (res.istop, res.itn) == (ref[1], ref[2])
    _same_x(res.x, ref[0])
    for name, ours, theirs in zip(LSMR_NORMS, res[3:8], ref[3:8]):
        _close(ours, theirs, name)


# ---------------------------------------------------------------------------
# the cases

@pytest.mark.parametrize("pipelined", [False, True], ids=["direct", "pipelined"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_lsqr_matches_scipy(case, pipelined):
    A, b, kw = CASES[case]
    kw = _kwargs(kw, "lsqr")
    ref = sla.lsqr(A, b, **kw)
    _check_lsqr(_lsqr(A, b, pipelined=pipelined, **kw), ref)


@pytest.mark.parametrize("pipelined", [False, True], ids=["direct", "pipelined"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_lsmr_matches_scipy(case, pipelined):
    A, b, kw = CASES[case]
    kw = _kwargs(kw, "lsmr")
    ref = sla.lsmr(A, b, **kw)
    _check_lsmr(_lsmr(A, b, pipelined=pipelined, **kw), ref)


def test_cases_reach_every_stopping_code():
    """The case list exercises istop 1, 2, 3, 4 or 5, and 7 in both solvers."""
    seen = {"lsqr": set(), "lsmr": set()}
    for A, b, kw in CASES.values():
        seen["lsqr"].add(sla.lsqr(A, b, **_kwargs(kw, "lsqr"))[1])
        seen["lsmr"].add(sla.lsmr(A, b, **_kwargs(kw, "lsmr"))[1])
    for solver, codes in seen.items():
        assert {1, 2, 3, 7} <= codes, (solver, codes)
        assert codes & {4, 5, 6}, (solver, codes)


def test_bit_identical_to_scipy_on_sparse_input():
    """Same products, same expressions: every output equal, not merely close."""
    A, b, _ = CASES["tall_damp"]
    for pipelined in (False, True):
        ours, ref = _lsqr(A, b, damp=0.7, calc_var=True, pipelined=pipelined), \
            sla.lsqr(A, b, damp=0.7, calc_var=True)
        assert np.array_equal(ours.x, ref[0]) and np.array_equal(ours.var, ref[9])
        assert tuple(ours[1:9]) == tuple(ref[1:9])
        ours, ref = _lsmr(A, b, damp=0.7, pipelined=pipelined), sla.lsmr(A, b, damp=0.7)
        assert np.array_equal(ours.x, ref[0]) and tuple(ours[1:]) == tuple(ref[1:])


def test_lsqr_calc_var():
    A, b, _ = CASES["tall"]
    _check_lsqr(lsqr(A, b, calc_var=True), sla.lsqr(A, b, calc_var=True))
    res = lsqr(A, b)
    assert not np.any(res.var)


@pytest.mark.parametrize("kind", ["dense", "operator"])
def test_other_operators(kind):
    A, b, _ = CASES["tall"]
    op = A.toarray() if kind == "dense" else sla.aslinearoperator(A)
    _check_lsqr(lsqr(op, b), sla.lsqr(op, b))
    _check_lsmr(lsmr(op, b), sla.lsmr(op, b))
    with pytest.raises(TypeError):
        lsqr(np.asarray(A.toarray(), dtype=complex), b)


# ---------------------------------------------------------------------------
# special starts: b = 0, b - A x0 = 0, Aᵀb = 0, no iterations

def _zero_rhs_cases():
    A = CASES["tall"][0]
    x0 = _rhs(100, 20)
    # Aᵀb = 0: b orthogonal to range(A) (A has an empty column block)
    B = sp.hstack([sp.eye(40, 20), sp.csr_array((40, 5))]).tocsr()
    b_perp = np.zeros(40)
    b_perp[30:] = 1.0
    return {
        "b_zero": (A, np.zeros(300), {}),
        "b_zero_x0": (A, np.zeros(300), {"x0": x0}),
        "b_zero_x0_zero_tolerances": (A, np.zeros(300), {"x0": x0, "atol": 0.0, "btol": 0.0}),
        "b_equals_Ax0": (A, A @ x0, {"x0": x0}),
        "At_b_zero": (B, b_perp, {}),
        "no_iterations": (A, CASES["tall"][1], {"limit": 0}),
        "negative_limit": (A, CASES["tall"][1], {"limit": -3}),
        "one_iteration": (A, CASES["tall"][1], {"limit": 1}),
    }


ZERO_CASES = _zero_rhs_cases()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # SciPy divides by ‖b‖ = 0
@pytest.mark.parametrize("pipelined", [False, True], ids=["direct", "pipelined"])
@pytest.mark.parametrize("case", sorted(ZERO_CASES))
def test_special_starts(case, pipelined):
    A, b, kw = ZERO_CASES[case]
    kw_q, kw_m = _kwargs(kw, "lsqr"), _kwargs(kw, "lsmr")
    with np.errstate(all="ignore"):
        ref_q, ref_m = sla.lsqr(A, b, **kw_q), sla.lsmr(A, b, **kw_m)
    res_q = _lsqr(A, b, pipelined=pipelined, **kw_q)
    res_m = _lsmr(A, b, pipelined=pipelined, **kw_m)
    _check_lsqr(res_q, ref_q)
    _check_lsmr(res_m, ref_m)
    if "x0" in kw:          # x0 itself is never modified
        assert np.array_equal(kw["x0"], ZERO_CASES[case][2]["x0"])
        assert res_q.x is not kw["x0"]
    if res_q.itn == 0 and res_q.istop == 0 and case not in ("no_iterations", "negative_limit"):
        assert res_q.projected_iterations == 0


def test_x0_not_modified():
    A, b, _ = CASES["tall"]
    x0 = _rhs(100, 21)
    keep = x0.copy()
    lsqr(A, b, x0=x0)
    lsmr(A, b, x0=x0)
    assert np.array_equal(x0, keep)


# ---------------------------------------------------------------------------
# the result object, the allowance, the callback, the projection

def test_result_is_scipy_tuple():
    A, b, _ = CASES["tall"]
    res = lsqr(A, b)
    x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var = res
    assert res.x is x and res.istop == istop and res[2] == itn
    plain = res.scipy_tuple()
    assert type(plain) is tuple and len(plain) == 10
    assert res.allowance_spent is False and res.stopped_by_callback is False
    assert res.seconds >= 0 and res.host_syncs == 0          # NumPy: nothing to copy
    assert "istop=" in repr(res)
    out = lsmr(A, b)
    assert type(out.scipy_tuple()) is tuple and len(out) == 8
    assert isinstance(out.normr, float)


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_allowance_stops_with_marker(solver):
    A, b = _mtx("494_bus.mtx"), _rhs(494, 15)
    ours = {"lsqr": lsqr, "lsmr": lsmr}[solver]
    res = ours(A, b, max_seconds=0.0)
    assert res.allowance_spent and res.istop == 0 and res.itn == 1
    # x is the iterate SciPy has after one iteration
    theirs = {"lsqr": sla.lsqr, "lsmr": sla.lsmr}[solver]
    limit = {"lsqr": "iter_lim", "lsmr": "maxiter"}[solver]
    ref = theirs(A, b, **{limit: 1})
    assert np.array_equal(res.x, ref[0])
    # a generous allowance changes nothing
    res = ours(A, b, max_seconds=60.0)
    assert not res.allowance_spent and (res.istop, res.itn) == theirs(A, b)[1:3]
    with pytest.raises(ValueError):
        ours(A, b, max_seconds=-1.0)


@pytest.mark.parametrize("pipelined", [False, True], ids=["direct", "pipelined"])
@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_callback_sees_scipy_iterates_and_can_stop(solver, pipelined):
    A, b = _mtx("west0479.mtx"), _rhs(479, 14)
    ours = {"lsqr": _lsqr, "lsmr": _lsmr}[solver]
    theirs = {"lsqr": sla.lsqr, "lsmr": sla.lsmr}[solver]
    limit = {"lsqr": "iter_lim", "lsmr": "maxiter"}[solver]
    seen = []

    def watch(state):
        assert isinstance(state, IterationState)
        seen.append((state.itn, state.x.copy(), state.normr, state.normx, state.istop))
        return state.itn == 7

    res = ours(A, b, callback=watch, pipelined=pipelined)
    assert res.stopped_by_callback and not res.allowance_spent
    assert res.istop == 0 and res.itn == 7
    assert [s[0] for s in seen] == list(range(1, 8))
    for itn, x, normr, normx, istop in seen:
        ref = theirs(A, b, **{limit: itn})
        assert np.array_equal(x, ref[0])
        _close(normr, ref[4] if solver == "lsqr" else ref[3], "normr")
        _close(normx, ref[8] if solver == "lsqr" else ref[7], "normx")
        assert istop == 0
    assert np.array_equal(res.x, seen[-1][1])


def test_callback_cannot_hide_a_stopping_test():
    A, b, _ = CASES["tall"]
    ref = sla.lsqr(A, b)
    res = lsqr(A, b, callback=lambda state: state.itn == ref[2])
    assert res.istop == ref[1] and not res.stopped_by_callback


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_projected_iterations(solver):
    ours = {"lsqr": lsqr, "lsmr": lsmr}[solver]
    limit = {"lsqr": "iter_lim", "lsmr": "maxiter"}[solver]
    A, b, _ = CASES["tall"]
    assert ours(A, b).projected_iterations == 0                 # converged
    A, b, kw = CASES["conlim"]
    res = ours(A, b, **kw)
    assert res.istop == 3 and res.projected_iterations is None
    assert ours(A, b, **{limit: 2}).projected_iterations is None  # too few to fit
    # cut short half way on steadily converging problems: the right order
    for case in ("tall", "wide"):
        A, b, _ = CASES[case]
        full = ours(A, b)
        cut = ours(A, b, **{limit: full.itn // 2})
        assert cut.istop == 7
        p, left = cut.projected_iterations, full.itn - cut.itn
        assert p is not None and 0.5 * left <= p <= 2 * left, (case, p, left)


# ---------------------------------------------------------------------------
# one device→host copy per iteration (counted on NumPy through the link)

@pytest.mark.parametrize("limit", [None, 10])
@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_one_fetch_per_iteration_when_pipelined(monkeypatch, solver, limit):
    calls = []
    fetch = _common.NumpyOps.fetch

    def counted(self, *scalars):
        calls.append(len(scalars))
        return fetch(self, *scalars)

    monkeypatch.setattr(_common.NumpyOps, "fetch", counted)
    A, b = _mtx("west0479.mtx"), _rhs(479, 14)
    run = {"lsqr": _lsqr, "lsmr": _lsmr}[solver]
    kw = {} if limit is None else {"iter_lim" if solver == "lsqr" else "maxiter": limit}
    res = run(A, b, pipelined=True, **kw)
    # the start, one per iteration (carrying the previous iteration's test), and
    # the one that carries the last iteration's test
    assert len(calls) == res.itn + 2
    assert all(n <= 3 for n in calls)
    calls.clear()
    res = run(A, b, pipelined=False, **kw)
    assert len(calls) == 1 + 2 * res.itn


def test_bad_input():
    A, b, _ = CASES["tall"]
    with pytest.raises(ValueError):
        lsqr(A, b[:-1])
    with pytest.raises(ValueError):
        lsmr(A, b, x0=np.zeros(99))
    with pytest.raises(TypeError):
        lsqr(A, b + 1j)
    with pytest.raises(TypeError):
        lsmr(A, b, xp=sp)


def test_show_prints_summary(capsys):
    A, b, _ = CASES["tall"]
    lsqr(A, b, show=True)
    lsmr(A, b, show=True)
    out = capsys.readouterr().out
    assert "LSQR" in out and "LSMR" in out and "istop" in out


# ---------------------------------------------------------------------------
# the GPU: the same runs on CuPy arrays and cupyx sparse matrices

#: case -> the relative distance from SciPy's x allowed on the GPU. Two LSQR/LSMR
#: runs whose products and sums round differently agree to about the stopping
#: tolerance on well-conditioned problems and drift apart with the condition
#: number (loss of orthogonality takes different paths); measured on an H200
#: with a margin of 10 or more.
GPU_CASES = {"tall": 1e-5, "wide": 1e-5, "tall_damp": 1e-5, "tall_x0": 1e-5, "wide_damp": 1e-5,
             "machine_precision": 1e-10, "identity_breakdown": 1e-12,
             "diagonal_breakdown": 1e-12, "iteration_limit": 0.1, "west0479": 0.2,
             "494_bus": 0.05, "lp_e226_transposed": 0.2}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_matches_scipy(case):
    import cupy as cp
    import cupyx.scipy.sparse as csp

    A, b, kw = CASES[case]
    b = np.asarray(b, dtype=np.float64).ravel()
    for solver, ours, theirs in (("lsqr", lsqr, sla.lsqr), ("lsmr", lsmr, sla.lsmr)):
        kwo = _kwargs(kw, solver)
        ref = theirs(A, b, **kwo)
        kwd = dict(kwo)
        if "x0" in kwd:
            kwd["x0"] = cp.asarray(kwd["x0"])
        res = ours(csp.csr_matrix(sp.csr_matrix(A)), cp.asarray(b), **kwd)
        assert isinstance(res.x, cp.ndarray)
        assert res.istop == ref[1], (solver, res.istop, ref[1])
        assert abs(res.itn - ref[2]) <= 2, (solver, res.itn, ref[2])
        x, xs = cp.asnumpy(res.x), ref[0]
        assert np.linalg.norm(x - xs) <= GPU_CASES[case] * np.linalg.norm(xs), solver
        # the residual is as small as SciPy's
        r, rs = np.linalg.norm(b - A @ x), np.linalg.norm(b - A @ xs)
        assert r <= 1.01 * rs + 1e-12 * np.linalg.norm(b), (solver, r, rs)
        # one copy per iteration, plus the start and the last iteration's test
        assert res.host_syncs == res.itn + 2
        # a SciPy matrix with CuPy b goes to the device as well
        again = ours(A, cp.asarray(b), **kwd)
        assert again.istop == res.istop and abs(again.itn - res.itn) <= 2


@pytest.mark.gpu
def test_gpu_pipelining_and_extras():
    """On the device: pipelined or not, the same run; calc_var, callback and allowance work."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    A, b, _ = CASES["tall"]
    Ad, bd = csp.csr_matrix(sp.csr_matrix(A)), cp.asarray(b)
    for run in (_lsqr, _lsmr):
        one, two = run(Ad, bd, pipelined=False), run(Ad, bd, pipelined=True)
        assert (one.istop, one.itn) == (two.istop, two.itn)
        assert cp.array_equal(one.x, two.x)
        assert run(Ad, bd, max_seconds=0.0).allowance_spent
        res = run(Ad, bd, callback=lambda state: state.itn == 3)
        assert res.stopped_by_callback and res.itn == 3
    # var: tight over a few iterations; late ones are rounding-sensitive (as anorm)
    res, ref = lsqr(Ad, bd, calc_var=True, iter_lim=5), sla.lsqr(A, b, calc_var=True, iter_lim=5)
    assert np.linalg.norm(cp.asnumpy(res.var) - ref[9]) <= 1e-10 * np.linalg.norm(ref[9])
    res, ref = lsqr(Ad, bd, calc_var=True), sla.lsqr(A, b, calc_var=True)
    assert np.linalg.norm(cp.asnumpy(res.var) - ref[9]) <= 1e-2 * np.linalg.norm(ref[9])
    dense = lsqr(cp.asarray(A.toarray()), bd)
    assert dense.istop == 2 and abs(dense.itn - sla.lsqr(A, b)[2]) <= 2


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 255, 4097, 3_000_001])
def test_gpu_vector_kernels_against_numpy(n):
    # kernels/iterative/vector_ops.cu: every operation of CupyOps against
    # NumPy on fresh random vectors, the slot poisoned first; the sum of
    # squares the same bits on a second call (a fixed summation order)
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(n)
    ops = _common.CupyOps(n)
    vec = lambda: rng.standard_normal(n)
    x, u, v, w, h, hb, var = (vec() for _ in range(7))
    X, U, V, W, H, HB, VAR = (cp.asarray(a) for a in (x, u, v, w, h, hb, var))
    ops.buffer[:] = cp.nan
    ops.sumsq(X, 1)
    first = float(ops.fetch(1)[0])
    assert abs(first - x @ x) <= 1e-13 * (x @ x)
    ops.sumsq(X, 1)
    assert float(ops.fetch(1)[0]) == first
    ops.subtract_scaled(U, V, 0.75)
    np.testing.assert_allclose(U.get(), u - 0.75 * v, rtol=1e-15, atol=1e-15)
    ops.scale_by_inverse_root(U, 1)
    np.testing.assert_allclose(U.get(), (u - 0.75 * v) / np.sqrt(first), rtol=1e-14, atol=1e-15)
    ops.subtract_root_scaled(V, W, 1)
    np.testing.assert_allclose(V.get(), v - np.sqrt(first) * w, rtol=1e-14, atol=1e-13)
    d2 = ops.lsqr_update(X, W, U, VAR, 2.0, 0.5, 0.25, 2)
    wk = w
    np.testing.assert_allclose(VAR.get(), var + (wk / 2.0) ** 2, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(X.get(), x + 0.25 * wk, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(W.get(), (u - 0.75 * v) / np.sqrt(first) - 0.125 * wk,
                               rtol=1e-13, atol=1e-14)
    assert d2 == 0.25 and abs(float(ops.fetch(2)[0]) - wk @ wk) <= 1e-13 * (wk @ wk)
    x2 = X.get()
    ops.lsmr_update(X, H, HB, U, 0.5, 0.25, -0.5, 3)
    hbar = h + 0.5 * hb
    np.testing.assert_allclose(HB.get(), hbar, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(X.get(), x2 + 0.25 * hbar, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(H.get(), U.get() - 0.5 * h, rtol=1e-14, atol=1e-14)
    xn = X.get()
    assert abs(float(ops.fetch(3)[0]) - xn @ xn) <= 1e-13 * (xn @ xn)
