"""The short path of ``lsqr``/``lsmr`` under ``auto`` (:mod:`scipy_gpuqr._factor.quick_iterate`).

A SciPy CSR/CSC float64 A with a float64 vector b, no x0, no damping and no
backend named take it. It must answer exactly as the general path does:
SciPy's tuple bit for bit when SciPy's iterations converge, the QR's exact
answer when they do not, DESIGN §10's errors for non-finite input, the
caller's arrays untouched, and every other input left to the general path.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import GpuqrOptions, lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._factor import quick_iterate as quick
from scipy_gpuqr._factor.least_squares import StoppingRules

SCIPY = {"lsqr": original("lsqr"), "lsmr": original("lsmr")}
OURS = {"lsqr": lsqr, "lsmr": lsmr}
CLASSES = [sp.csr_array, sp.csr_matrix, sp.csc_array, sp.csc_matrix]


def _problem(m, n, seed, cls=sp.csr_array):
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=0.1, rng=rng, format="csr") + \
        2.0 * sp.eye_array(m, n, format="csr")
    return cls(A), rng.standard_normal(m)


def _same_tuple(ours, theirs):
    assert type(ours) is tuple and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        else:
            assert a == b


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("shape", [(3, 2), (40, 40), (120, 30), (30, 90)])
def test_quick_path_is_scipy_bit_for_bit(method, cls, shape, decisions):
    A, b = _problem(*shape, seed=sum(shape), cls=cls)
    ours = OURS[method](A, b)
    _same_tuple(ours, SCIPY[method](A, b))
    assert f"{method.upper()} on CPU answered" in decisions()[-1]


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_quick_and_general_paths_agree(method):
    """Naming the default options sends the same call through the general path."""
    A, b = _problem(60, 25, seed=3)
    kwargs = dict(atol=1e-9, btol=1e-9)
    _same_tuple(OURS[method](A, b, **kwargs),
                OURS[method](A, b, gpuqr_options=GpuqrOptions(), **kwargs))


def test_calc_var_is_scipys():
    A, b = _problem(50, 20, seed=5)
    _same_tuple(lsqr(A, b, calc_var=True), SCIPY["lsqr"](A, b, calc_var=True))


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_iteration_limit_still_ends_in_the_qr(method, decisions):
    A, b = _problem(80, 40, seed=7)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    x, istop, itn = OURS[method](A, b, 0.0, 1e-14, 1e-14, 1e8, 2)[:3]
    assert itn == 0 and istop in (1, 2, 4, 5)
    assert np.allclose(x, x_ref, rtol=1e-10, atol=1e-12)
    assert "QR on CPU" in decisions()[-1]
    assert "iteration limit" in decisions()[-1]


@pytest.mark.parametrize("where", ["A", "b"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_input_is_refused(where, value):
    A, b = _problem(10, 6, seed=9)
    if where == "A":
        A = A.copy()
        A.data[3] = value
    else:
        b = b.copy()
        b[1] = value
    for f in (lsqr, lsmr):
        with pytest.raises(ValueError, match="non-finite"):
            f(A, b)


def test_inputs_untouched_even_with_duplicates():
    A, b = _problem(12, 8, seed=11)
    coo = A.tocoo()
    M = sp.csr_array((np.r_[coo.data, 1.0], (np.r_[coo.row, 0], np.r_[coo.col, 0])),
                     shape=A.shape)
    M = sp.csr_array((M.data, M.indices, M.indptr), shape=M.shape)   # keep the layout
    snap = (M.data.copy(), M.indices.copy(), M.indptr.copy(), b.copy())
    lsqr(M, b, iter_lim=2)
    lsmr(M, b)
    for before, after in zip(snap, (M.data, M.indices, M.indptr, b)):
        assert np.array_equal(before, after)


@pytest.mark.parametrize("args", [
    dict(x0=np.zeros(6)), dict(damp=0.5), dict(backend="cpu"),
    dict(gpuqr_options=GpuqrOptions()),
])
def test_other_arguments_take_the_general_path(args):
    A, b = _problem(10, 6, seed=13)
    x0, damp = args.get("x0"), args.get("damp", 0.0)
    assert quick.quick_iterate("lsqr", A, b, x0, damp, StoppingRules(1e-6, 1e-6, 1e8, None),
                               args.get("backend"), args.get("gpuqr_options")) is None


@pytest.mark.parametrize("make", [
    lambda A, b: (A.tocoo(), b), lambda A, b: (A.toarray(), b),
    lambda A, b: (A.astype(np.float32), b), lambda A, b: (A, b.astype(np.float32)),
    lambda A, b: (A, b[:, None]), lambda A, b: (A, list(b)),
])
def test_other_inputs_take_the_general_path(make):
    A, b = make(*_problem(10, 6, seed=15))
    assert quick.quick_iterate("lsmr", A, b, None, 0.0, StoppingRules(1e-6, 1e-6, 1e8, None),
                               None, None) is None


def test_auto_named_takes_the_short_path():
    A, b = _problem(10, 6, seed=19)
    run = quick.quick_iterate("lsqr", A, b, None, 0.0, StoppingRules(1e-6, 1e-6, 1e8, None),
                              "auto", None)
    assert run is not None and run.found is not None
    _same_tuple(lsqr(A, b, backend="auto"), SCIPY["lsqr"](A, b))


def test_environment_backend_takes_the_general_path(monkeypatch, decisions):
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "reference")
    A, b = _problem(10, 6, seed=17)
    assert quick.quick_iterate("lsqr", A, b, None, 0.0, StoppingRules(1e-6, 1e-6, 1e8, None),
                               None, None) is None
    assert lsqr(A, b)[2] == 0           # the QR answered


# ---------------------------------------------------------------------------
# host data on a machine with a GPU: the CPU first, the GPU after one upload (ski rental)

from scipy_gpuqr._dispatch import placement   # noqa: E402
from scipy_gpuqr._dispatch.placement import (HostFirst, host_first_budget,  # noqa: E402
                                              upload_seconds)


class _State:
    def __init__(self, itn, seconds):
        self.itn, self.seconds = itn, seconds


def test_upload_cost_model():
    assert upload_seconds(10, 10, 0) == pytest.approx(placement.UPLOAD_FIXED_S, rel=1e-3)
    assert upload_seconds(4967, 2456, 173670) > upload_seconds(4967, 2456, 1000)
    extra = upload_seconds(10, 10, 10 ** 9) - upload_seconds(10, 10, 0)
    assert extra == pytest.approx(12e9 / placement.UPLOAD_BYTES_PER_S)


def test_budget_only_where_a_gpu_iteration_is_faster(monkeypatch):
    assert host_first_budget(3, 2, 4) is None           # tiny: the CPU's iteration is cheaper
    m, n, nnz = 4967, 2456, 173670                      # Groebner_id2003_aug's sizes
    assert placement.gpu_iteration_seconds(m, n, nnz) < placement.cpu_iteration_seconds(m, n, nnz)
    assert host_first_budget(m, n, nnz) == upload_seconds(m, n, nnz)
    monkeypatch.setattr(placement, "GPU_ITERATION_S", 1.0)     # a slow GPU: stay on the CPU
    assert host_first_budget(m, n, nnz) is None


def test_host_first_moves_after_one_upload():
    """Iterations at 1 ms against an upload of 2.5 ms: the third iteration moves."""
    rule = HostFirst(2.5e-3)
    stops = [rule(_State(k, 1e-3 * k)) for k in range(1, 4)]
    assert stops == [False, False, True] and rule.moved
    assert rule.seconds == pytest.approx(3e-3)


def test_host_first_lets_the_watcher_stop_first_and_discounts_its_analysis():
    class Watch:
        analysis_s = 0.0

        def __call__(self, state):
            self.analysis_s = 5e-3              # analysed during this iteration
            return state.itn == 3

    rule = HostFirst(2.5e-3, Watch())
    assert not rule(_State(1, 1e-3))
    assert not rule(_State(2, 7e-3))            # 7 ms, 5 of them analysing: 2 ms iterating
    assert rule(_State(3, 8e-3)) and rule.moved  # 3 ms iterating: the budget is spent
    rule = HostFirst(1.0, Watch())
    assert rule(_State(3, 1e-3)) and not rule.moved   # the watcher's stop (the QR)


@pytest.fixture
def gpu_pays(monkeypatch):
    """A machine where a GPU answers and its iterations would beat the CPU's on any size:
    what the rule sees on the GPU host, without touching a GPU."""
    monkeypatch.setattr(quick, "gpu_available", lambda: True)
    monkeypatch.setattr(placement, "GPU_ITERATION_S", 0.0)
    monkeypatch.setattr(placement, "GPU_MATVEC_RATE", 1e30)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_short_run_on_host_data_ends_on_the_cpu(method, gpu_pays, monkeypatch, decisions):
    """A run of a few iterations costs less than one upload: SciPy's bits, from the CPU.
    (The upload made to cost a second: on a loaded 2-core host the few iterations'
    measured time passed the real estimate once.)"""
    monkeypatch.setattr(placement, "UPLOAD_FIXED_S", 1.0)
    A, b = _problem(120, 30, seed=21)
    run = quick.quick_iterate(method, A, b, None, 0.0, StoppingRules(1e-6, 1e-6, 1e8, None),
                              None, None)
    assert run is not None and run.found is not None
    _same_tuple(run.found.result, SCIPY[method](A, b))
    assert "CPU first" in str(run.why)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_long_run_on_host_data_moves_to_the_gpu(method, gpu_pays, monkeypatch, decisions):
    """A run still going after one upload's worth of CPU time hands over (None: the general
    path runs SciPy's algorithm again, on the GPU) and the log says so."""
    monkeypatch.setattr(placement, "UPLOAD_FIXED_S", 0.0)
    monkeypatch.setattr(placement, "UPLOAD_BYTES_PER_S", 1e30)   # an upload costs nothing
    A, b = _problem(300, 200, seed=23)
    run = quick.quick_iterate(method, A, b, None, 0.0,
                              StoppingRules(1e-14, 1e-14, 1e8, 10 ** 4), None, None)
    assert run is None
    assert "moves to the GPU after 1 iterations" in decisions()[-1]


# ---------------------------------------------------------------------------
# the finite check every call makes

from scipy_gpuqr._validate import DOT_FINITE_CHECK, SMALL_FINITE_CHECK, all_finite  # noqa: E402


@pytest.mark.parametrize("size", [1, 5, SMALL_FINITE_CHECK, SMALL_FINITE_CHECK + 1, 1000,
                                  DOT_FINITE_CHECK, DOT_FINITE_CHECK + 1])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_all_finite_small_and_large(size, dtype):
    x = np.ones(size, dtype=dtype)
    assert all_finite(x)
    for value in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[size // 2] = value
        assert not all_finite(y)
        assert not all_finite(y.reshape(1, -1).T)          # 2-D, not contiguous by rows
    big = np.full(size, np.finfo(dtype).max, dtype=dtype)
    assert all_finite(big)                                  # no overflow, no warning


def test_all_finite_other_kinds():
    assert all_finite(np.arange(5)) and all_finite(np.array([True, False]))
    assert not all_finite(np.array([1 + 1j, complex(np.nan, 0)]))
    assert all_finite(np.array([1 + 1j, 2j])) and all_finite(np.array([], dtype=float))
    assert not all_finite(np.ones((8, 8))[:, ::3] * np.nan)


@pytest.mark.parametrize("where", [0, 77, DOT_FINITE_CHECK - 1])
def test_all_finite_dot_path_sees_every_entry(where):
    """The dot-product test of real vectors: an inf or NaN anywhere, both infinities at
    once, a strided view; an overflowing sum of finite values is finite, with no warning."""
    x = np.random.default_rng(where).standard_normal(DOT_FINITE_CHECK)
    assert all_finite(x) and all_finite(x[::3])
    for bad in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf]):
        y = x.copy()
        y[where:where + len(bad)] = bad[:DOT_FINITE_CHECK - where]
        assert not all_finite(y)
    z = x[::2].copy()
    z[where // 2] = np.nan
    assert not all_finite(z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        huge = np.full(DOT_FINITE_CHECK, 1e200)
        assert all_finite(huge) and all_finite(-huge)


from scipy_gpuqr._options import (ENV_BACKEND, auto_settings, auto_source,  # noqa: E402
                                  resolve_settings)


@pytest.mark.parametrize("backend", [None, "auto", "AUTO", "cpu", "gpu", "bad", 3])
@pytest.mark.parametrize("env", [None, "auto", " Auto ", "  ", "cpu", "bad"])
def test_auto_source_is_the_precedence_rule(backend, env):
    """The short paths' reading of the settings agrees with resolve_settings: the source
    of auto, and None for every other backend and for values it refuses."""
    environ = {} if env is None else {ENV_BACKEND: env}
    try:
        settings = resolve_settings(backend, None, environ)
    except ValueError:
        settings = None
    source = auto_source(backend, environ)
    if settings is None or settings.backend != "auto":
        assert source is None
    else:
        assert source == settings.source and auto_settings(source) == settings


@pytest.mark.parametrize("value", [None, "", "auto", " cpu ", "1", "é-ü", "0"])
def test_getenv_reads_what_os_environ_get_reads(monkeypatch, value):
    """The short paths' environment read (os.environ's own table, no KeyError for a
    missing name) gives what os.environ.get gives, after setenv/delenv, and the
    precedence rule reads the real environment through it."""
    import os

    from scipy_gpuqr._options import getenv
    name = "SCIPY_GPUQR_TEST_GETENV"
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert getenv(name) == os.environ.get(name)
    assert getenv(name, {name: "x"}) == "x" and getenv(name, {}) is None
    monkeypatch.setenv(ENV_BACKEND, "cpu")
    assert auto_source(None) is None and auto_source("auto") == "keyword"
    monkeypatch.setenv(ENV_BACKEND, " auto")
    assert auto_source(None) == "environment"
    monkeypatch.delenv(ENV_BACKEND)
    assert auto_source(None) == "default"
