"""The drop-in promise of ``lsqr``/``lsmr`` under backend 'auto'.

Where SciPy's own algorithm converges (its tolerance tests stop it), ``auto``
returns SciPy's tuple: on the CPU bit for bit (same x bits, same istop, itn
and norms). Where it would not (its tolerances are 0, ``iter_lim`` or
``conlim`` stops it, or iterating costs more than factorizing), the sparse QR
answers with the minimum-norm least-squares solution that
``numpy.linalg.lstsq`` gives. The log says who answered and why. Explicit
backends always factorize.

Which path answers a problem whose iterations cost about as much as its
factorization depends on the machine's speed; the tests that pin SciPy's
tuple on such a problem widen the allowance (:func:`patient`) rather than
depend on the timing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from scipy_gpuqr import GpuqrOptions, lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import placement, projection
from scipy_gpuqr._dispatch.iterate_first import Allowance, zero_tolerances
from scipy_gpuqr._dispatch.placement import iterate_on_gpu
from scipy_gpuqr.io import mmread
from _dropin_stand_ins import PlanStandIn, StateStandIn, stop_of

EPS = np.finfo(np.float64).eps
SCIPY = {"lsqr": original("lsqr"), "lsmr": original("lsmr")}
OURS = {"lsqr": lsqr, "lsmr": lsmr}


# ---------------------------------------------------------------------------
# helpers

def _random(m, n, seed, density=0.05, shift=2.0):
    """A random sparse matrix plus ``shift`` on the diagonal (well conditioned)."""
    A = sp.random_array((m, n), density=density, rng=np.random.default_rng(seed),
                        format="csr")
    return (A + shift * sp.eye_array(m, n, format="csr")).tocsr()


def _rhs(m, seed):
    return np.random.default_rng(seed).standard_normal(m)


def _mtx(matrices_dir, name):
    return sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)


def _assert_scipy_tuple(ours, theirs):
    """Same tuple as SciPy's: arrays bit for bit (and dtype), numbers equal."""
    assert len(ours) == len(theirs)
    assert type(ours) is tuple
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype, k
            assert np.array_equal(a, b), (k, np.max(np.abs(a - b)))
        else:
            assert a == b, (k, a, b)


def _ls_errors(A, x, b):
    """Least-squares and consistent-system backward errors of x (2-norm of A from an SVD)."""
    Ad = A.toarray() if sp.issparse(A) else A
    normA = np.linalg.norm(Ad, 2)
    r = b - Ad @ x
    nr = np.linalg.norm(r)
    ls = np.linalg.norm(Ad.T @ r) / (normA * nr) if nr > 0 else 0.0
    return ls, nr / (normA * np.linalg.norm(x) + np.linalg.norm(b))


def _assert_lstsq(A, x, b):
    """x is numpy.linalg.lstsq's minimum-norm solution to working precision."""
    Ad = A.toarray()
    m, n = Ad.shape
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    ls, cons = _ls_errors(Ad, x, b)
    ls_ref, cons_ref = _ls_errors(Ad, x_ref, b)
    c = 100 * EPS * max(m, n)
    assert ls <= max(10 * ls_ref, c) or cons <= max(10 * cons_ref, c), (ls, cons)
    cond = s[0] / s[rank - 1] if rank else 1.0
    tol = max(1e3 * EPS * cond * max(m, n), 1e-10)
    assert np.linalg.norm(x - x_ref) <= tol * np.linalg.norm(x_ref)


@pytest.fixture
def patient(monkeypatch):
    """An allowance no timing can exhaust: SciPy's run goes on to its stop unless its
    projection passes iter_lim or conlim."""
    monkeypatch.setattr(policy, "ANALYSIS_DEFERRAL", 1e9)
    monkeypatch.setattr(policy, "predicted_seconds", lambda *args: math.inf)


def _answered(messages, method):
    lines = [m for m in messages() if m.startswith(method + " ")]
    assert lines, messages()
    return lines[-1]


# ---------------------------------------------------------------------------
# SciPy's answer, bit for bit

SHAPES = {"tall": (300, 100, 2.0), "square": (200, 200, 4.0), "wide": (80, 200, 2.0)}


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_auto_is_scipy_bit_for_bit(method, shape, decisions):
    """Well-conditioned problems (a few tens of iterations): SciPy's LSQR/LSMR answers."""
    m, n, shift = SHAPES[shape]
    A, b = _random(m, n, 1, shift=shift), _rhs(m, 2)
    ours, theirs = OURS[method](A, b), SCIPY[method](A, b)
    assert theirs[1] in (1, 2)
    _assert_scipy_tuple(ours, theirs)
    assert f"{method.upper()} on CPU answered" in _answered(decisions, method)


_SHARED_ARGUMENTS = [{"damp": 0.3}, {"x0": "x0"}, {"damp": 0.1, "x0": "x0"},
                     {"atol": 1e-10, "btol": 1e-10}, {"atol": 1e-3, "btol": 0}, {"conlim": 1e4},
                     {"iter_lim": 500}]
#: calc_var is lsqr's alone
_LSQR_ARGUMENTS = [{"calc_var": True}, {"damp": 0.2, "calc_var": True, "x0": "x0"}]


@pytest.mark.parametrize("method,kwargs",
                         [(m, k) for m in ("lsqr", "lsmr") for k in _SHARED_ARGUMENTS]
                         + [("lsqr", k) for k in _LSQR_ARGUMENTS])
def test_auto_is_scipy_with_arguments(method, kwargs, patient):
    A = _random(300, 100, 3)
    b = _rhs(300, 4)
    kwargs = dict(kwargs)
    if kwargs.get("x0") == "x0":
        kwargs["x0"] = _rhs(100, 5)
    if method == "lsmr" and "iter_lim" in kwargs:
        kwargs["maxiter"] = kwargs.pop("iter_lim")
    ours, theirs = OURS[method](A, b, **kwargs), SCIPY[method](A, b, **kwargs)
    assert theirs[1] in (1, 2)
    _assert_scipy_tuple(ours, theirs)


@pytest.mark.parametrize("kind", ["csc_array", "coo_matrix", "lil_array", "dense", "int"])
def test_auto_is_scipy_for_every_input_kind(kind, patient):
    A, b = _random(200, 60, 6), _rhs(200, 7)
    A = {"csc_array": sp.csc_array, "coo_matrix": sp.coo_matrix, "lil_array": sp.lil_array,
         "dense": lambda M: M.toarray(),
         "int": lambda M: sp.csr_array(np.round(10 * M.toarray()).astype(np.int64))}[kind](A)
    for method in ("lsqr", "lsmr"):
        _assert_scipy_tuple(OURS[method](A, b), SCIPY[method](A, b))


@pytest.mark.parametrize("name", ["Groebner_id2003_aug", "Franz6_id1959_aug"])
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_auto_is_scipy_on_real_matrices(matrices_dir, name, method, decisions):
    """Well-conditioned problems that converge in a few iterations: SciPy's answer, no QR.

    Groebner_id2003_aug's factorization costs seconds; SciPy's LSQR answers in
    about a millisecond. (Whether the analysis ran depends on the machine's
    load: three iterations of a busy process can outlast the analysis'
    deferral; the answer must be SciPy's either way.)
    """
    A = _mtx(matrices_dir, name)
    b = A @ np.ones(A.shape[1]) + 1e-3 * _rhs(A.shape[0], 0)
    ours, theirs = OURS[method](A, b), SCIPY[method](A, b)
    _assert_scipy_tuple(ours, theirs)
    line = _answered(decisions, method)
    assert f": {method.upper()} on CPU answered;" in line


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_auto_is_scipy_on_lp_e226_transposed(matrices_dir, method, patient):
    """About 240 iterations, costing about what the factorization costs: with time
    to spare, SciPy's tuple comes back as SciPy computes it."""
    A = _mtx(matrices_dir, "lp_e226_transposed")
    b = A @ np.ones(A.shape[1]) + 1e-3 * _rhs(A.shape[0], 0)
    limit = {"lsqr": {}, "lsmr": {"maxiter": 1000}}[method]
    theirs = SCIPY[method](A, b, **limit)
    assert theirs[1] in (1, 2) and theirs[2] > 100
    _assert_scipy_tuple(OURS[method](A, b, **limit), theirs)


def test_trivial_problems_are_scipys(rng):
    """What SciPy answers up front (b = 0; b = A x0; lsmr: b = 0 with x0) comes back as
    SciPy gives it, under maximum precision too."""
    A = _random(40, 20, 8)
    x0 = rng.standard_normal(20)
    cases = {"lsqr": ((np.zeros(40), {}), (A @ x0, {"x0": x0})),
             "lsmr": ((np.zeros(40), {}), (np.zeros(40), {"x0": x0}), (A @ x0, {"x0": x0}))}
    for method, problems in cases.items():
        for b, kwargs in problems:
            theirs = SCIPY[method](A, b, **kwargs)
            assert theirs[1] == 0 and theirs[2] == 0
            _assert_scipy_tuple(OURS[method](A, b, **kwargs), theirs)
            zero = OURS[method](A, b, atol=0, btol=0, **kwargs)
            assert zero[1] == 0 and np.array_equal(zero[0], theirs[0])
    # lsqr iterates from x0 when b = 0 (SciPy's rule): its tuple again
    with np.errstate(divide="ignore", invalid="ignore"):
        theirs = SCIPY["lsqr"](A, np.zeros(40), x0=x0)
        _assert_scipy_tuple(lsqr(A, np.zeros(40), x0=x0), theirs)


def test_float32_keeps_scipys_dtypes():
    A, b = _random(120, 40, 9), _rhs(120, 10)
    A32, b32 = A.astype(np.float32), b.astype(np.float32)
    with np.errstate(over="ignore"):        # SciPy's float32 run overflows its 1e100 start
        theirs = SCIPY["lsmr"](A32, b32)
        ours = lsmr(A32, b32)
    _assert_scipy_tuple(ours, theirs)
    assert ours[1] in (1, 2)
    assert lsmr(A32, b)[0].dtype == SCIPY["lsmr"](A32, b)[0].dtype == np.float64
    assert lsqr(A32, b32)[0].dtype == np.float64


def _kinds(m, n):
    """(name, A, b, damp, x0) of arguments whose narrower types SciPy keeps, and of
    their neighbours that our iterations serve bit for bit."""
    A, b = _random(m, n, 21, density=0.2), _rhs(m, 22)
    x0 = np.random.default_rng(23).standard_normal(n)
    return [("float32 damp", A, b, np.float32(0.3), None),
            ("float16 damp", A, b, np.float16(0.3), None),
            ("float32 b", A, b.astype(np.float32), 0.0, None),
            ("float16 b", A, b.astype(np.float16), 0.0, None),
            ("float32 b, damp", A, b.astype(np.float32), 0.3, None),
            ("float32 x0", A, b, 0.0, x0.astype(np.float32)),
            ("float32 A, float32 x0", A.astype(np.float32), b, 0.0, x0.astype(np.float32)),
            ("dense float32 A", A.toarray().astype(np.float32), b, 0.0, None),
            ("dense int A", (10 * A.toarray()).astype(np.int64), b, 0.0, None),
            ("float32 A, bool b", A.astype(np.float32), b > 0, 0.0, None),
            ("float64 0-d damp", A, b, np.array(0.3), None),
            ("numpy int damp", A, b, np.int64(1), None),
            ("int b", A, (10 * b).astype(np.int64), 0.0, None),
            ("float64 x0, damp", A, b, 0.3, x0)]


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("index", range(14))
def test_auto_is_scipys_tuple_for_narrow_types(method, index, decisions):
    """Under auto on the CPU SciPy's exact tuple is the promise: what our float64
    iterations cannot match bit for bit (SciPy keeps a float32 damp, b, dense A or x0
    in its type) is iterated by SciPy's own function, and the log says so."""
    name, A, b, damp, x0 = _kinds(60, 25)[index]
    with np.errstate(over="ignore"):
        theirs = SCIPY[method](A, b, damp=damp, x0=x0)
        ours = OURS[method](A, b, damp=damp, x0=x0)
    assert theirs[1] in (1, 2), name
    _assert_scipy_tuple(ours, theirs)
    line = _answered(decisions, method)
    narrow = ("float32" in name or "float16" in name or "dense" in name) and \
        name != "float32 A, bool b"
    assert ("SciPy's own function" in line) is narrow, (name, line)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_a_sparse_float32_b_is_still_ours(method, decisions):
    """SciPy's functions take no sparse b; ours does, whatever its dtype (SciPy's own
    function is not asked)."""
    A, b = _random(60, 25, 21, density=0.2), _rhs(60, 22)
    out = OURS[method](A, sp.csr_array(b.astype(np.float32)[:, None]))
    assert out[1] in (1, 2)
    assert "SciPy's own function" not in _answered(decisions, method)


def test_scipys_own_run_that_stalls_ends_in_the_qr(decisions):
    """A float32 b whose SciPy run its iteration limit ends: the QR answers."""
    A, b = _ill_conditioned(), _rhs(150, 5)
    out = lsqr(A, b.astype(np.float32), iter_lim=5)
    assert out[2] == 0
    line = _answered(decisions, "lsqr")
    assert "SciPy's own function (a float32 b)" in line and "QR" in line
    _assert_lstsq(A, out[0], b.astype(np.float32).astype(np.float64))


def test_general_path_runs_the_host_loop_unwatched_when_short(monkeypatch):
    """The general path (here: an x0) weighs a host loop's run at the host loop's rate
    (needs_watching(host_loop=True)), as the short path does."""
    from scipy_gpuqr._factor import least_squares
    seen = []
    real = least_squares.needs_watching

    def spy(*args, **kwargs):
        seen.append(kwargs.get("host_loop"))
        return real(*args, **kwargs)
    monkeypatch.setattr(least_squares, "needs_watching", spy)
    A, b = _random(300, 100, 4), _rhs(300, 5)
    x0 = np.zeros(100)
    _assert_scipy_tuple(lsqr(A, b, x0=x0), SCIPY["lsqr"](A, b, x0=x0))
    lsqr(sla.aslinearoperator(A).matmat(np.eye(100)), b, x0=x0)     # dense: the generic driver
    assert seen == [True, False]


# ---------------------------------------------------------------------------
# the QR where SciPy's iterations would not converge

def _ill_conditioned(m=150, n=60, smallest=1e-10, seed=3):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return sp.csc_array((U * np.logspace(0, math.log10(smallest), n)) @ V.T)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_iteration_limit_gives_the_exact_answer(matrices_dir, method, decisions):
    A = _mtx(matrices_dir, "lp_e226_transposed")
    b = _rhs(A.shape[0], 11)
    limit = {"lsqr": {"iter_lim": 30}, "lsmr": {"maxiter": 30}}[method]
    assert SCIPY[method](A, b, **limit)[1] == 7        # SciPy stops at its limit
    out = OURS[method](A, b, **limit)
    assert out[2] == 0
    _assert_lstsq(A, out[0], b)
    line = _answered(decisions, method)
    assert "QR on CPU" in line and f"{method.upper()} on CPU" in line


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_default_iteration_limit_gives_the_exact_answer(matrices_dir, method, decisions):
    """494_bus: SciPy's LSQR runs into its default limit (2 n) with istop 7. A square
    matrix of full rank by lstsq's rule: SciPy's SuperLU answers exactly."""
    A = _mtx(matrices_dir, "494_bus")
    b = _rhs(A.shape[0], 12)
    assert SCIPY[method](A, b)[1] == 7
    out = OURS[method](A, b)
    assert out[2] == 0
    _assert_lstsq(A, out[0], b)
    assert "SuperLU on CPU (A square, of full rank" in _answered(decisions, method)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_conlim_gives_the_exact_answer(method, decisions):
    A = _ill_conditioned()
    b = _rhs(150, 13)
    limit = {"lsqr": {"iter_lim": 10_000}, "lsmr": {"maxiter": 10_000}}[method]
    # SciPy stops at the condition limit
    assert SCIPY[method](A, b, conlim=1e4, **limit)[1] == 3
    out = OURS[method](A, b, conlim=1e4, **limit)
    assert out[2] == 0
    _assert_lstsq(A, out[0], b)
    assert "QR on CPU" in _answered(decisions, method)


@pytest.mark.parametrize("kwargs", [{"atol": 0, "btol": 0},
                                    {"atol": 0, "btol": 0, "conlim": 0}])
def test_zero_tolerances_give_the_exact_answer_at_once(kwargs, decisions):
    A = _ill_conditioned(smallest=1e-6)
    b = _rhs(150, 14)
    for method in ("lsqr", "lsmr"):
        out = OURS[method](A, b, **kwargs)
        assert out[2] == 0
        _assert_lstsq(A, out[0], b)
        line = _answered(decisions, method)
        assert "maximum precision" in line and "QR on CPU" in line
        assert f"{method.upper()} on" not in line      # no iteration ran


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("conlim", [0, -1.0])
def test_conlim_zero_alone_is_scipys_run(method, conlim, decisions):
    """conlim <= 0 only turns SciPy's condition limit off: SciPy still iterates to its
    tolerances, and so does auto (SciPy's tuple, bit for bit)."""
    A, b = _random(300, 100, 31), _rhs(300, 32)
    theirs = SCIPY[method](A, b, conlim=conlim)
    assert theirs[1] in (1, 2)
    _assert_scipy_tuple(OURS[method](A, b, conlim=conlim), theirs)
    line = _answered(decisions, method)
    assert f"{method.upper()} on CPU answered" in line and "maximum precision" not in line


def test_hopeless_iterations_end_in_the_qr(rng, decisions):
    """Singular values down to 1e-14: SciPy's tests fall too slowly; the QR answers
    long before SciPy's run would end."""
    n = 300
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = sp.csc_array((U * np.logspace(0, -14, n)) @ U.T)
    b = rng.standard_normal(n)
    out = lsqr(A, b, atol=1e-12, btol=1e-12, conlim=1e16, iter_lim=100_000)
    assert out[2] == 0
    _assert_lstsq(A, out[0], b)
    line = _answered(decisions, "lsqr")
    assert "QR on CPU" in line and "stopped by auto's rule" in line, line
    itn = int(line.split("istop 0 after ")[1].split()[0])
    assert itn < 2000


@pytest.mark.slow
def test_bayer10_iteration_limit_gives_a_working_precision_answer(matrices_dir, decisions):
    """bayer10 (13436², cond about 1e11 for LSQR): SciPy's run stops at iter_lim 50
    far from the solution; the QR's answer is at working precision."""
    A = _mtx(matrices_dir, "bayer10")
    b = A @ np.ones(A.shape[1]) + 1e-3 * _rhs(A.shape[0], 0)
    theirs = SCIPY["lsqr"](A, b, iter_lim=50)
    assert theirs[1] == 7
    out = lsqr(A, b, iter_lim=50)
    assert out[2] == 0 and "QR on CPU" in _answered(decisions, "lsqr")
    r = b - A @ out[0]
    normA = sla.norm(A)
    ls = np.linalg.norm(A.T @ r) / (normA * np.linalg.norm(r))
    cons = np.linalg.norm(r) / (normA * np.linalg.norm(out[0]) + np.linalg.norm(b))
    assert min(ls, cons) <= 100 * EPS * A.shape[0]
    r_ref = b - A @ theirs[0]
    assert np.linalg.norm(A.T @ r) < 1e-3 * np.linalg.norm(A.T @ r_ref)


# ---------------------------------------------------------------------------
# explicit backends and options: always the QR

@pytest.mark.parametrize("how", [{"backend": "cpu"}, {"backend": "reference"},
                                 {"backend": "simulate"},
                                 {"gpuqr_options": GpuqrOptions(iterate_first=False)},
                                 {"gpuqr_options": {"backend": "cpu"}}])
def test_explicit_backends_always_factorize(how, decisions):
    A, b = _random(120, 50, 15), _rhs(120, 16)
    for method in ("lsqr", "lsmr"):
        out = OURS[method](A, b, **how)
        assert out[2] == 0
        _assert_lstsq(A, out[0], b)
        assert "QR on CPU" in _answered(decisions, method)


def test_environment_backend_always_factorizes(monkeypatch):
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "cpu")
    A, b = _random(120, 50, 15), _rhs(120, 16)
    assert lsqr(A, b)[2] == 0 and lsmr(A, b)[2] == 0


# ---------------------------------------------------------------------------
# the log and show

def test_show_names_who_answered(capsys):
    A, b = _random(100, 40, 17), _rhs(100, 18)
    lsqr(A, b, show=True)
    out = capsys.readouterr().out
    assert "LSQR on CPU" in out and "istop" in out
    lsmr(A, b, show=True, atol=0, btol=0)
    assert "QR on CPU" in capsys.readouterr().out


def test_the_log_says_why(decisions):
    A, b = _random(300, 100, 19), _rhs(300, 20)
    lsqr(A, b)
    line = _answered(decisions, "lsqr")
    assert "LSQR on CPU answered" in line and "istop" in line and "iterations in" in line
    assert "CPU: a CPU iteration" in line or "CPU: no GPU" in line


# ---------------------------------------------------------------------------
# the rule itself

def test_allowance_stops_at_projected_iteration_limit(monkeypatch):
    """A projection far past iter_lim stops the run (after the analysis, confirmed at two
    checkpoints); one just past it does not while the QR costs more than the
    iterations to iter_lim (LSQR often speeds up late)."""
    monkeypatch.setattr(policy, "predicted_seconds", lambda backend, flops, gpu: 1e-3)
    # test1/rtol falls by a factor 10 per 100 iterations: about 600 more needed
    states = [StateStandIn(k, 1e-4 * k, 1e-6 * 10 ** (6 - k / 100)) for k in range(1, 100)]
    watch = Allowance(iter_lim=100, atol=1e-6, conlim=1e8, analysis=1e-3,
                      plan=lambda: (None, PlanStandIn(1e6)))
    stopped = stop_of(watch, states)
    assert stopped is not None and stopped >= projection.PROJECTION_WINDOW
    assert "exceed iter_lim 100" in watch.reason
    # about 30 % past iter_lim 500, the QR predicted at 10 s: SciPy's run goes on
    monkeypatch.setattr(policy, "predicted_seconds", lambda backend, flops, gpu: 10.0)
    states = [StateStandIn(k, 1e-4 * k, 1e-6 * 10 ** (6.5 - k / 100)) for k in range(1, 500)]
    watch = Allowance(iter_lim=500, atol=1e-6, conlim=1e8, analysis=1e-3,
                      plan=lambda: (None, PlanStandIn(1e6)))
    assert stop_of(watch, states) is None


def test_allowance_defers_the_analysis_then_bounds_the_iterations(monkeypatch):
    plans = []
    monkeypatch.setattr(policy, "predicted_seconds", lambda backend, flops, gpu: 0.05)
    watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1e-3,
                      plan=lambda: plans.append(1) or (None, PlanStandIn(1e9)))
    deferral = watch.deferral                      # 10 x 1 ms
    # falling slowly, 1 ms per iteration: projected far beyond the deferral
    states = [StateStandIn(k, 1e-3 * k, 10 ** (2 - k / 1000)) for k in range(1, 10 ** 4)]
    stopped = stop_of(watch, states)
    assert plans == [1] and watch.analysed_at[1] <= deferral + 1e-3
    assert watch.predicted == 0.05 and stopped is not None
    assert "the QR's predicted" in watch.reason


def test_allowance_lets_a_converging_run_finish_without_analysis():
    watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1.0,
                      plan=lambda: pytest.fail("no analysis needed"))
    # converging fast at 10 µs per iteration: projected well within the deferral
    states = [StateStandIn(k, 1e-5 * k, 10 ** (2 - k / 20)) for k in range(1, 200)]
    assert stop_of(watch, states) is None and watch.predicted is None


def test_allowance_without_room_for_the_qr_lets_scipy_finish():
    def no_room():
        raise MemoryError("needs 26 GB")
    watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1e-3, plan=no_room)
    states = [StateStandIn(k, 1e-3 * k, 10 ** (2 - k / 1e5)) for k in range(1, 3000)]
    assert stop_of(watch, states) is None
    assert watch.plan_error is not None and "cannot run" in watch.summary()


def test_allowance_conlim_projection_is_a_power_law():
    """A condition estimate that levels off (LSQR's usual) is not projected past conlim."""
    watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1.0,
                      plan=lambda: pytest.fail("no analysis needed"))
    states = [StateStandIn(k, 1e-5 * k, 10 ** (2 - k / 100), conda=30.0 * k ** 1.5)
              for k in range(1, 400)]
    assert stop_of(watch, states) is None
    watch = Allowance(iter_lim=10 ** 6, atol=1e-6, conlim=1e8, analysis=1.0,
                      plan=lambda: pytest.fail("no analysis needed"))
    states = [StateStandIn(k, 1e-5 * k, 10 ** (2 - k / 1000), conda=10.0 * k ** 4)
              for k in range(1, 400)]
    assert stop_of(watch, states) is not None and "conlim" in watch.reason


def test_zero_tolerances_rule():
    assert zero_tolerances(0, 0, 1e8) and zero_tolerances(0, 0, 0)
    assert zero_tolerances(1e-6, 1e-6, 0) is None and zero_tolerances(1e-6, 1e-6, -1.0) is None
    assert zero_tolerances(0, 1e-6, 1e8) is None and zero_tolerances(1e-6, 0, 1e8) is None


def test_where_the_iterations_run(monkeypatch):
    monkeypatch.setattr(placement, "gpu_available", lambda: True)
    assert not iterate_on_gpu(300, 100, 1500, on_gpu=False)[0]          # small: CPU
    assert iterate_on_gpu(300, 100, 1500, on_gpu=True)[0]               # CuPy data: GPU
    assert iterate_on_gpu(10 ** 6, 10 ** 5, 10 ** 7, on_gpu=False)[0]   # large: GPU
    cpu = placement.cpu_iteration_seconds(10 ** 6, 10 ** 5, 10 ** 7)
    assert cpu > placement.gpu_iteration_seconds(10 ** 6, 10 ** 5, 10 ** 7)
    monkeypatch.setattr(placement, "gpu_available", lambda: False)
    assert not iterate_on_gpu(10 ** 6, 10 ** 5, 10 ** 7, on_gpu=False)[0]


# ---------------------------------------------------------------------------
# on the GPU (run on the GPU machine)

@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_gpu_cupy_in_cupy_out(method, decisions):
    """CuPy in, CuPy out, whoever answers; SciPy's answer when the GPU iterations do."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    A, b = _random(3000, 1000, 21), _rhs(3000, 22)
    theirs = SCIPY[method](A, b)
    for Ad, bd in ((csp.csr_matrix(sp.csr_matrix(A)), cp.asarray(b)), (A, cp.asarray(b))):
        out = OURS[method](Ad, bd)
        assert isinstance(out[0], cp.ndarray)
        line = _answered(decisions, method)
        if f"{method.upper()} on GPU answered" in line:
            assert (out[1], out[2]) == (theirs[1], theirs[2])
            x = out[0].get()
            assert np.linalg.norm(x - theirs[0]) <= 1e-6 * np.linalg.norm(theirs[0])
        else:   # the policy found the QR cheaper: the exact answer
            assert "QR on" in line and out[2] == 0
            _assert_lstsq(A, out[0].get(), b)


@pytest.mark.gpu
def test_gpu_large_host_problem_iterates_on_the_gpu(decisions):
    A, b = _random(400_000, 100_000, 23, density=1e-4), _rhs(400_000, 24)
    theirs = SCIPY["lsqr"](A, b)
    out = lsqr(A, b)
    assert isinstance(out[0], np.ndarray)
    assert (out[1], out[2]) == (theirs[1], theirs[2])
    # the same iterations in another summation order: equal to rounding, not bitwise
    assert np.linalg.norm(out[0] - theirs[0]) <= 1e-6 * np.linalg.norm(theirs[0])
    assert "LSQR on GPU answered" in _answered(decisions, "lsqr")


@pytest.mark.gpu
def test_gpu_stalled_iterations_end_in_the_qr(matrices_dir, decisions):
    import cupy as cp
    A = _mtx(matrices_dir, "lp_e226_transposed")
    b = _rhs(A.shape[0], 11)
    out = lsqr(A, cp.asarray(b), iter_lim=30)
    assert isinstance(out[0], cp.ndarray) and out[2] == 0
    _assert_lstsq(A, out[0].get(), b)
    line = _answered(decisions, "lsqr")
    assert "LSQR on GPU" in line and "QR on" in line


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("where", ["cupyx A", "host A"])
def test_gpu_qr_answer_keeps_b_and_x_on_the_device(method, where, monkeypatch, decisions):
    """The QR's answer (here: atol = btol = 0) for a CuPy b: CuPy x, and b is never
    copied to the host (the problem's host copy of b is not asked for)."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from scipy_gpuqr._factor.least_squares import LeastSquaresProblem

    def no_host_b(self):
        raise AssertionError("b was copied to the host")
    monkeypatch.setattr(LeastSquaresProblem, "host_b", no_host_b)
    A, b = _random(3000, 1000, 25), _rhs(3000, 26)
    Ad = csp.csr_matrix(sp.csr_matrix(A)) if where == "cupyx A" else A
    out = OURS[method](Ad, cp.asarray(b), atol=0, btol=0, backend="gpu")
    assert isinstance(out[0], cp.ndarray) and out[2] == 0
    _assert_lstsq(A, out[0].get(), b)
    assert "QR on GPU" in _answered(decisions, method)
