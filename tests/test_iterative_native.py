"""The compiled LSQR/LSMR loops (scipy_gpuqr._iterative.native) against SciPy's own, bit for bit.

Every test of ``test_iterative_host`` runs here again twice: with the compiled
loops asked for (``c``: built into a temporary folder, never the user's
cache) and with the Python loops (``numpy``). The promise is SciPy's tuple
exactly (``istop``, ``itn``, the bytes of x and var, every norm). Beside
them: random problems of every shape and option against SciPy's functions,
callback states and the run attributes against the Python loops', and the
fallbacks (no compiler, a BLAS ddot that does not give ``numpy.dot``'s sums).
Skipped only where no C compiler exists; a compiler that fails is a failure.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from _native_helpers import built_loader, env_with_cache, needs_compiler, use_loader
from scipy_gpuqr import _native_build
from scipy_gpuqr._errors import NativeUnavailable
from scipy_gpuqr._iterative import _common, host, lsmr, lsqr, native
from test_iterative_host import *  # noqa: F401,F403 - each runs again with both loops
from test_iterative_host import PROBLEMS, assert_same

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    ld, _ = built_loader(native, tmp_path_factory.mktemp("iterative-native"))
    return ld


@pytest.fixture(autouse=True, params=["c", "numpy"])
def loops(request, built, monkeypatch):
    """Which loops answer (``c`` or ``numpy``); the runs the compiled loops finished are
    counted in the list returned."""
    use_loader(monkeypatch, native, built)
    monkeypatch.setenv(native.ENV, request.param)
    finished = []
    real = host._compiled

    def spy(*args, **kw):
        out = real(*args, **kw)
        finished.append(out is not None)
        return out
    monkeypatch.setattr(host, "_compiled", spy)
    return request.param, finished


def _random_problem(seed: int):
    """A random problem and the options of one call (shape, format, index type, damping,
    x0, tolerances, limits, zero b, a zero column)."""
    rng = np.random.default_rng([2026, seed])
    m, n = (int(v) for v in rng.integers(1, 90, 2))
    shape = seed % 3
    if shape == 1:
        m = max(m, n + 5)
    elif shape == 2:
        n = max(n, m + 5)
    A = sp.random_array((m, n), density=float(rng.uniform(0.05, 0.5)), rng=rng, format="csr")
    A = A + sp.eye_array(m, n, format="csr") * float(rng.uniform(0.1, 3))
    A = sp.csr_array(A)
    if seed % 7 == 3 and n > 1:
        A = sp.csr_array(A @ sp.diags_array(np.where(np.arange(n) == n // 2, 0.0, 1.0)))
    if seed % 5 == 4:
        A = sp.csr_array(A @ sp.diags_array(np.logspace(0, -9, n)))
    if seed % 2:
        A = A.tocsc()
    if seed % 4 == 1:
        A.indptr, A.indices = A.indptr.astype(np.int64), A.indices.astype(np.int64)
    b = rng.standard_normal(m) * 10.0 ** float(rng.uniform(-3, 3))
    if seed % 11 == 5:
        b = np.zeros(m)
    kw = {}
    if seed % 3 == 0:
        kw["damp"] = float(rng.choice([1e-4, 0.3, 5.0]))
    if seed % 4 == 2 and b.any():
        kw["x0"] = rng.standard_normal(n)
    tol = [None, 1e-12, 1e-3, 1e-8][seed % 4]
    if tol is not None:
        kw["atol"], kw["btol"] = tol, tol * 10
    if seed % 6 == 5:
        kw["conlim"] = 50.0
    limit = None if seed % 8 < 5 else int(rng.integers(1, 12))
    return A, b, kw, limit


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_random_problems_bit_for_bit(loops, solver, seed):
    A, b, kw, limit = _random_problem(seed)
    if solver == "lsqr":
        kw = dict(kw, iter_lim=limit, calc_var=bool(seed % 2))
        ours, theirs = lsqr, sla.lsqr
    else:
        kw = dict(kw, maxiter=limit)
        ours, theirs = lsmr, sla.lsmr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # b = 0 with x0: SciPy's 0/0
        ref = theirs(A, b, **kw)
        got = ours(A, b, **kw)
    assert_same(got, ref)


def _breakdowns():
    """Problems whose bidiagonalization breaks down exactly (beta or alpha 0 inside the
    loop: _sym_ortho's zero branches): identities, padded and scaled, a cyclic shift."""
    out = []
    for n in (1, 3, 8):
        eye = sp.eye_array(n, format="csr")
        out += [eye, sp.csr_array(sp.vstack([eye, sp.csr_array((2, n))])),
                sp.csr_array(sp.hstack([eye, sp.csr_array((n, 2))])),
                sp.csr_array(sp.diags_array(np.where(np.arange(n) % 2, 2.0, 0.5)))]
        if n > 1:
            out.append(sp.csr_array(sp.eye_array(n, k=1) + sp.eye_array(n, k=1 - n)))
    return out


@pytest.mark.parametrize("k", range(len(_breakdowns())))
def test_exact_breakdowns_bit_for_bit(loops, k):
    A = _breakdowns()[k]
    m, n = A.shape
    for b in (np.ones(m), np.arange(1.0, m + 1), -np.ones(m)):
        for kw in ({}, {"damp": 0.5}, {"x0": np.ones(n)}, {"x0": -np.arange(n, dtype=float)}):
            assert_same(lsqr(A, b, **kw), sla.lsqr(A, b, **kw))
            assert_same(lsmr(A, b, **kw), sla.lsmr(A, b, **kw))
    path, finished = loops
    assert all(finished) if path == "c" else not any(finished)


def test_the_compiled_loops_answer(loops):
    """Asked for, the compiled loops finish ordinary runs (none falls back)."""
    path, finished = loops
    for A, b, x0 in PROBLEMS.values():
        for kw in ({}, {"damp": 0.5, "x0": x0}):
            assert_same(lsqr(A, b, **kw), sla.lsqr(A, b, **kw))
            assert_same(lsmr(A, b, **kw), sla.lsmr(A, b, **kw))
    assert finished == ([True] * 12 if path == "c" else [False] * 12)


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_callback_states_are_the_python_loops(loops, monkeypatch, solver):
    """A callback sees the same states (every field but the seconds, x's bytes included),
    and a stop at iteration 9 leaves the same iterate, as with the Python loops."""
    path, finished = loops
    A, b, _ = PROBLEMS["square"]
    run = lsqr if solver == "lsqr" else lsmr
    results = {}
    for which in ("numpy", path):
        monkeypatch.setenv(native.ENV, which)
        states = []

        def watch(state):
            assert isinstance(state, _common.IterationState)
            states.append((state.itn, state.x.tobytes(), *state[2:-1]))
            return state.itn == 9
        results[which] = (states, run(A, b, callback=watch))
    (want, ref), (got, res) = results["numpy"], results[path]
    assert got == want and len(got) == 9
    assert_same(res, ref)
    assert res.stopped_by_callback and res.istop == 0
    assert finished[-1] is (path == "c")


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_run_attributes_are_the_python_loops(loops, monkeypatch, solver):
    """The allowance of seconds, the projection of a run that hit its limit."""
    path, _ = loops
    A, b, _ = PROBLEMS["tall"]
    run = lsqr if solver == "lsqr" else lsmr
    limit = {"iter_lim" if solver == "lsqr" else "maxiter": 25}
    spent = run(A, b, max_seconds=0.0)
    assert spent.allowance_spent and spent.itn == 1 and spent.istop == 0
    capped = run(A, b, **limit)
    monkeypatch.setenv(native.ENV, "numpy")
    ref = run(A, b, **limit)
    assert_same(capped, ref)
    assert capped.istop == 7
    assert capped.projected_iterations == ref.projected_iterations is not None


def test_overflowing_data_falls_back(loops, monkeypatch):
    """Entries near the overflow threshold raise floating-point flags in the products and
    norms: the compiled run gives up, and the Python loops answer as they do alone."""
    path, finished = loops
    A, b, _ = PROBLEMS["tall"]
    big = sp.csr_array(A * 1e200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = lsqr(big, b * 1e150)
        monkeypatch.setenv(native.ENV, "numpy")
        assert_same(got, lsqr(big, b * 1e150))
    assert finished[0] is False and not np.isfinite(got.x).all()


def _unchecked(A, b, unchecked: bool):
    """A's and b's :class:`~scipy_gpuqr._iterative.host.HostProblem`, checked by its run
    where ``unchecked``."""
    P = host.host_problem(A, b, None, None)
    return host.HostProblem(P.m, P.n, P.forward, P.backward, P.arrays, P.b, None,
                            unchecked=unchecked)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_a_run_that_checks_its_problem_is_the_same_run(loops, fmt):
    """Finite data: a run that checks A and b first (the compiled loops' first pass, or
    the Python check) gives the unchecked run's tuple bit for bit."""
    path, finished = loops
    for A, b, _ in PROBLEMS.values():
        A = A.asformat(fmt)
        for run in (lambda P: host.lsqr_host(P, 0.0, 1e-8, 1e-8, 1e8, None, True),
                    lambda P: host.lsmr_host(P, 0.0, 1e-8, 1e-8, 1e8, None)):
            (want, want_info), (got, got_info) = (run(_unchecked(A, b, u)) for u in (False, True))
            assert_same(got, want)
            got_p, want_p = (p() if callable(p) else p for p in
                             (got_info["projected_iterations"], want_info["projected_iterations"]))
            assert got_p == want_p
    assert all(finished) if path == "c" else not any(finished)


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
@pytest.mark.parametrize("where", ["data", "last value", "b"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_run_that_checks_its_problem_refuses_an_inf_or_nan(loops, solver, where, value):
    """An unchecked problem holding an inf or NaN (in A's values, the last one included,
    or in b) raises NotFinite before any iteration: the callback never hears of one.
    Checked (the caller vouched for it), the same problem runs."""
    A, b, _ = PROBLEMS["tall"]
    A, b = A.copy(), b.copy()
    if where == "b":
        b[len(b) // 2] = value
    else:
        A.data[-1 if where == "last value" else 7] = value
    heard = []

    def run(P):
        if solver == "lsqr":
            return host.lsqr_host(P, 0.0, 1e-8, 1e-8, 1e8, None, False, callback=heard.append)
        return host.lsmr_host(P, 0.0, 1e-8, 1e-8, 1e8, None, callback=heard.append)
    path, finished = loops
    with pytest.raises(host.NotFinite):
        run(_unchecked(A, b, True))
    assert heard == []
    # compiled: refused by the loops' own check (no run given up and left to Python's)
    assert finished == ([] if path == "c" else [False])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run(_unchecked(A, b, False))
    assert heard


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
@pytest.mark.parametrize("where", ["A", "b"])
def test_auto_refuses_an_inf_or_nan_that_the_loops_find(loops, solver, where):
    """Under ``auto`` a small problem's finite check is the loops' first pass: an inf or
    NaN there still ends in the general path's ValueError (DESIGN §10), and without it
    the call is SciPy's bit for bit."""
    import scipy_gpuqr
    rng = np.random.default_rng(15)
    A = sp.csc_array(sp.random_array((80, 50), density=0.1, rng=rng, format="csc")
                     + 2.0 * sp.eye_array(80, 50, format="csc"))
    b = rng.standard_normal(80)
    assert_same(getattr(scipy_gpuqr, solver)(A, b), getattr(sla, solver)(A, b))
    A, b = A.copy(), b.copy()
    if where == "A":
        A.data[0] = np.nan
    else:
        b[-1] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        getattr(scipy_gpuqr, solver)(A, b)


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_the_loops_first_use_is_not_the_runs_time(loops, monkeypatch, solver):
    """What asking for the compiled loops costs (a process's first run builds or checks
    them) is not counted as the run's: the seconds of its first iteration and its total
    leave it out (auto's rule would read a slow first iteration)."""
    real = native.handle

    def slow(*args, **kwargs):
        time.sleep(0.2)
        return real(*args, **kwargs)
    monkeypatch.setattr(native, "handle", slow)
    A, b, _ = PROBLEMS["tall"]
    P = host.host_problem(A, b, None, None)
    seen = []
    if solver == "lsqr":
        _, info = host.lsqr_host(P, 0.0, 1e-8, 1e-8, 1e8, None, False, callback=seen.append)
    else:
        _, info = host.lsmr_host(P, 0.0, 1e-8, 1e-8, 1e8, None, callback=seen.append)
    assert seen and seen[0].seconds < 0.1 and info["seconds"] < 0.1


def test_the_window_is_the_projection_window():
    assert native.WINDOW == _common.PROJECTION_WINDOW
    assert len(_common.IterationState._fields) == native.REPORT + 2      # + x, seconds


# ---------------------------------------------------------------------------
# the checks and the fallbacks

def test_numpys_ddot_is_found_and_checked(built):
    address, where = native.blas_ddot()
    assert address is not None, where
    assert native._ddot_matches(address) is None
    assert native._products_match(built.get(True)) is None


def test_the_ddot_check_can_fail():
    """A ddot summing in one accumulator, in order (not OpenBLAS' kernels), is refused."""
    @native._DDOT
    def plain(n, x, incx, y, incy):
        a = np.ctypeslib.as_array(ctypes.cast(x, ctypes.POINTER(ctypes.c_double)), (n,))
        c = np.ctypeslib.as_array(ctypes.cast(y, ctypes.POINTER(ctypes.c_double)), (n,))
        total = 0.0
        for u, v in zip(a.tolist(), c.tolist()):
            total += u * v
        return total
    why = native._ddot_matches(ctypes.cast(plain, ctypes.c_void_p).value)
    assert why is not None and "ddot" in why


@pytest.mark.parametrize("broken", ["ddot", "products", "no_blas"])
def test_failed_checks_leave_the_python_loops(built, monkeypatch, broken):
    """A check that fails: mode ``auto`` runs the Python loops (SciPy's result still),
    mode ``c`` raises."""
    if broken == "ddot":
        monkeypatch.setattr(native, "_ddot_matches", lambda address: "ddot differs")
    elif broken == "products":
        monkeypatch.setattr(native, "_products_match", lambda lib: "products differ")
    else:
        monkeypatch.setattr(native, "blas_ddot", lambda: (None, "no cblas_ddot"))
    use_loader(monkeypatch, native, built)
    monkeypatch.setattr(native, "_CHECKED", native.Checked())
    monkeypatch.setenv(native.ENV, "auto")
    assert native.handle() is None and native._CHECKED.why
    A, b, x0 = PROBLEMS["wide"]
    assert_same(lsqr(A, b, damp=0.2), sla.lsqr(A, b, damp=0.2))
    assert_same(lsmr(A, b, x0=x0), sla.lsmr(A, b, x0=x0))
    monkeypatch.setenv(native.ENV, "c")
    with pytest.raises(NativeUnavailable, match="LSQR/LSMR"):
        native.handle()


def test_no_compiler_leaves_the_python_loops(tmp_path, monkeypatch):
    """A compiler that fails (or none): ``auto`` runs the Python loops, ``c`` raises."""
    env = env_with_cache(tmp_path, CC="false")
    failing = _native_build.Loader(native._SPEC)
    assert failing.get(True, env) is None and failing.status().startswith("unavailable")
    use_loader(monkeypatch, native, failing)
    monkeypatch.setenv(native.ENV, "auto")
    assert native.handle() is None
    A, b, _ = PROBLEMS["tall"]
    assert_same(lsqr(A, b), sla.lsqr(A, b))
    assert_same(lsmr(A, b), sla.lsmr(A, b))
    monkeypatch.setenv(native.ENV, "c")
    with pytest.raises(NativeUnavailable):
        native.handle()


def test_the_source_is_shipped():
    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]
    assert "*.c" in data["scipy_gpuqr._iterative"]
    assert (root / "scipy_gpuqr" / "_iterative" / "_native.c").is_file()


def test_the_build_uses_no_contraction(tmp_path):
    """The flags are in the build command and in the build key (other flags: another
    library)."""
    path, cmd = native._SPEC.where(env_with_cache(tmp_path))
    assert "-ffp-contract=off" in cmd and path.name.startswith("iterative-")
    plain = cmd[:-len(native.EXTRA_FLAGS)]
    without = dataclasses.replace(native._SPEC, extra_flags=())
    assert native._SPEC.key(plain, b"x") != without.key(plain, b"x")



# ---------------------------------------------------------------------------
# reports gated by the callback (auto's rule says when it would next act)

class _Gated:
    """A callback in the shape of auto's rule: ``quiet_until`` (run seconds before which it
    would not act; far away here once it has seen ``quiet_after`` reports), ``catch_up``."""

    def __init__(self, quiet_after: int = 2, stop_at_report: int = 0):
        self.reports, self.caught, self.quiet_after = [], [], quiet_after
        self.stop_at_report = stop_at_report

    def _keep(self, state):
        return (state.itn, *state[2:-1])

    def __call__(self, state) -> bool:
        self.reports.append((self._keep(state), state.seconds))
        return len(self.reports) == self.stop_at_report

    def quiet_until(self) -> float:
        return 0.0 if len(self.reports) < self.quiet_after else 1e9

    def catch_up(self, states) -> None:
        self.caught.append([(self._keep(s), s.seconds) for s in states])


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_a_gated_callback_is_reported_fewer_iterations_with_theirs_caught_up(loops, solver):
    """The compiled loops report a callback that says when it next acts only from then
    (and the iteration that stops the run), handing it the iterations in between (their
    last WINDOW, the same states a callback of every iteration sees, the seconds
    interpolated between the reports') before the next report; the run is SciPy's bit for
    bit. The Python loops report every iteration."""
    path, finished = loops
    A, b, _ = PROBLEMS["tall"]
    run = lsqr if solver == "lsqr" else lsmr
    every = []
    ref = run(A, b, atol=1e-10, btol=1e-10,
              callback=lambda s: every.append((s.itn, *s[2:-1])) and False)
    gated = _Gated()
    res = run(A, b, atol=1e-10, btol=1e-10, callback=gated)
    assert_same(res, ref)
    assert_same(res, (sla.lsqr if solver == "lsqr" else sla.lsmr)(A, b, atol=1e-10, btol=1e-10))
    itn = res.itn
    assert itn > native.WINDOW + 3
    if path == "numpy":
        assert [r for r, _ in gated.reports] == every and gated.caught == []
        return
    assert finished[-1] is True
    assert [r[0][0] for r in gated.reports] == [1, 2, itn]
    assert [r for r, _ in gated.reports] == [every[0], every[1], every[-1]]
    (caught,) = gated.caught
    assert [c for c, _ in caught] == every[itn - native.WINDOW:itn - 1]
    seconds = [gated.reports[1][1]] + [s for _, s in caught] + [gated.reports[2][1]]
    assert all(a < b for a, b in zip(seconds, seconds[1:]))


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_a_gated_callback_stops_the_run_at_a_report(loops, solver):
    """A gated callback's stop takes effect at the report it answers: the iterate is that
    iteration's, as with the Python loops."""
    path, _ = loops
    A, b, _ = PROBLEMS["tall"]
    run = lsqr if solver == "lsqr" else lsmr
    stop = _Gated(quiet_after=99, stop_at_report=7)
    res = run(A, b, atol=1e-10, btol=1e-10, callback=stop)
    ref = run(A, b, atol=1e-10, btol=1e-10, callback=lambda s: s.itn == 7)
    assert res.stopped_by_callback and res.itn == 7 and res.istop == 0
    assert_same(res, ref)
