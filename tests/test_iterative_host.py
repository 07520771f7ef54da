"""The host loops (scipy_gpuqr._iterative.host) against SciPy's own lsqr/lsmr, bit for bit.

On NumPy with a SciPy CSR/CSC float64 matrix, our ``lsqr``/``lsmr`` run
SciPy's statements with less Python around them; the promise is SciPy's
result exactly: the same ``istop`` and ``itn``, x (and lsqr's var) with the
same bytes (signed zeros included), every norm the same float. Checked on
every real shared matrix (both solvers, SciPy's defaults, with an iteration
cap on the large ones), on generated problems with every argument SciPy
takes (damp, x0, atol/btol, conlim, iter_lim, calc_var, tolerance types),
on the matrix formats and index types SciPy's kernels accept, on unsorted
and duplicate entries, and through the replay that takes over when
Python's float arithmetic raises where NumPy's returns inf or NaN.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from conftest import TEST_MATRICES, real_shared_matrices
from scipy_gpuqr._iterative import IterationState, host, lsmr, lsqr, native
from scipy_gpuqr._iterative.lsmr import _lsmr
from scipy_gpuqr._iterative.lsqr import _lsqr

#: Iteration cap of the runs on every shared matrix (seconds of iterations otherwise), and
#: the smaller one on matrices of more than BIG entries (their dot products may wait for
#: a loaded machine's BLAS threads).
CAP, BIG_CAP, BIG = 300, 30, 50_000
LARGE = {"arrow.mtx"}


def _bits(value) -> bytes:
    return np.asarray(value, dtype=np.float64).tobytes()


def assert_same(ours, ref):
    """Every field of SciPy's tuple equal to the bit (x and var by their bytes)."""
    assert len(ours) == len(ref)
    assert (ours[1], ours[2]) == (ref[1], ref[2]), (ours[1:3], ref[1:3])
    assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
    assert ours[0].tobytes() == ref[0].tobytes(), "x differs"
    for k in range(3, len(ref)):
        if isinstance(ref[k], np.ndarray):
            assert ours[k].tobytes() == ref[k].tobytes(), f"field {k} differs"
        else:
            assert _bits(ours[k]) == _bits(ref[k]), (k, ours[k], ref[k])


def _rhs(name: str, m: int) -> np.ndarray:
    return np.random.default_rng([7, sum(map(ord, name))]).standard_normal(m)


def _shared():
    out = []
    for name, A in real_shared_matrices(TEST_MATRICES):
        if name in LARGE or A.nnz == 0:
            continue
        out.append((name, A))
    return out


SHARED = _shared()


@pytest.fixture(autouse=True)
def no_replay(request, monkeypatch):
    """Ordinary runs take Python's scalars throughout (the fast path, not the replay);
    the tests named for the replay check their own."""
    replayed = []
    real = host._replaying

    def spy(body, run, args):
        out = real(body, run, args)
        replayed.append(run.replayed)
        return out
    monkeypatch.setattr(host, "_replaying", spy)
    yield
    if "replay" not in request.node.name:
        assert not any(replayed), "a run was replayed with NumPy scalars"


def test_every_shared_matrix_is_seen():
    assert len(SHARED) >= 40


@pytest.mark.parametrize("name", [name for name, _ in SHARED])
def test_shared_matrices_bit_for_bit(name):
    A = dict(SHARED)[name]
    m, n = A.shape
    b = _rhs(name, m)
    cap = CAP if A.nnz <= BIG else BIG_CAP
    for fmt in ("csc", "csr"):
        M = A.asformat(fmt)
        ref = sla.lsqr(M, b, iter_lim=min(2 * n, cap))
        assert_same(lsqr(M, b, iter_lim=min(2 * n, cap)), ref)
        ref = sla.lsmr(M, b, maxiter=min(m, n, cap))
        assert_same(lsmr(M, b, maxiter=min(m, n, cap)), ref)


def test_shared_matrices_with_scipy_defaults():
    """Uncapped runs of SciPy's defaults on the matrices the drop-in ladder times."""
    for name in ("lp_e226.mtx", "lp_e226_transposed.mtx", "lp_share1b.mtx", "west0479.mtx",
                 "494_bus.mtx", "bfwa62.mtx", "GD06_theory.mtx"):
        A = dict(SHARED)[name]
        b = _rhs(name, A.shape[0])
        assert_same(lsqr(A, b), sla.lsqr(A, b))
        assert_same(lsmr(A, b), sla.lsmr(A, b))


# ---------------------------------------------------------------------------
# every argument

def _problem(m, n, density, seed):
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=density, rng=rng, format="csr")
    A = (A + sp.eye_array(m, n, format="csr")).tocsr()
    return A, rng.standard_normal(m), rng.standard_normal(n)


PROBLEMS = {"tall": _problem(300, 120, 0.05, 1), "square": _problem(150, 150, 0.04, 2),
            "wide": _problem(90, 200, 0.05, 3)}

ARGS = {
    "default": {},
    "damp": {"damp": 0.7},
    "small_damp": {"damp": 1e-3},
    "int_damp": {"damp": 2},
    "x0": {"x0": "x0"},
    "damp_x0": {"damp": 0.3, "x0": "x0"},
    "tight": {"atol": 1e-12, "btol": 1e-12},
    "loose": {"atol": 1e-2, "btol": 1e-3},
    "atol_only": {"atol": 1e-9, "btol": 0.0},
    "btol_only": {"atol": 0.0, "btol": 1e-9},
    "zero_tolerances": {"atol": 0.0, "btol": 0.0, "conlim": 0.0},
    "conlim": {"conlim": 10.0},
    "conlim_off": {"conlim": 0.0},
    "limit": {"limit": 7},
    "limit_one": {"limit": 1},
    "limit_zero": {"limit": 0},
    "float32_tolerances": {"atol": np.float32(1e-5), "btol": np.float32(1e-5)},
    "float64_tolerances": {"atol": np.float64(1e-7), "btol": np.float64(1e-7),
                           "conlim": np.float64(1e6)},
    "float32_damp": {"damp": np.float32(0.1)},
    "int_tolerances": {"atol": 0, "btol": 1, "conlim": 100},
}


def _call(solver, A, b, x0, kw, ours=True):
    kw = dict(kw)
    limit = kw.pop("limit", None)
    if limit is not None:
        kw["iter_lim" if solver == "lsqr" else "maxiter"] = limit
    if kw.get("x0") == "x0":
        kw["x0"] = x0.copy()
    if solver == "lsqr":
        return (lsqr if ours else sla.lsqr)(A, b, **kw)
    return (lsmr if ours else sla.lsmr)(A, b, **kw)


@pytest.mark.parametrize("args", sorted(ARGS))
@pytest.mark.parametrize("shape", sorted(PROBLEMS))
@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_every_argument(solver, shape, args):
    A, b, x0 = PROBLEMS[shape]
    kw = ARGS[args]
    if args == "conlim":
        A = _graded(A)
    assert_same(_call(solver, A, b, x0, kw), _call(solver, A, b, x0, kw, ours=False))


def _graded(A):
    """A with columns scaled over eight decades: the condition estimate passes conlim."""
    return (A @ sp.diags_array(np.logspace(0, -8, A.shape[1]))).tocsr()


@pytest.mark.parametrize("calc_var", [False, True])
def test_lsqr_variances(calc_var):
    for A, b, x0 in PROBLEMS.values():
        for kw in ({}, {"damp": 0.5}, {"x0": x0}):
            assert_same(lsqr(A, b, calc_var=calc_var, **kw),
                        sla.lsqr(A, b, calc_var=calc_var, **kw))


def test_every_stopping_code_is_reached():
    seen = {"lsqr": set(), "lsmr": set()}
    for shape in PROBLEMS:
        A, b, x0 = PROBLEMS[shape]
        for name, kw in ARGS.items():
            M = _graded(A) if name == "conlim" else A
            for solver in seen:
                seen[solver].add(_call(solver, M, b, x0, kw)[1])
    for solver, codes in seen.items():
        assert {0, 1, 2, 3, 7} <= codes and codes & {4, 5, 6}, (solver, codes)


# ---------------------------------------------------------------------------
# formats, index types, entries

def _variants(A):
    """The same matrix as CSR/CSC arrays and matrices, int32 and int64 indices, with its
    entries stored out of order and split into duplicates."""
    csr = sp.csr_array(A)
    out = {"csr_array": csr, "csc_array": csr.tocsc(), "csr_matrix": sp.csr_matrix(csr),
           "csc_matrix": sp.csc_matrix(csr)}
    wide = csr.copy()
    wide.indptr, wide.indices = wide.indptr.astype(np.int64), wide.indices.astype(np.int64)
    out["csr_int64"] = wide
    # unsorted columns within each row
    shuffled = csr.copy()
    rng = np.random.default_rng(5)
    for i in range(shuffled.shape[0]):
        lo, hi = shuffled.indptr[i], shuffled.indptr[i + 1]
        order = lo + rng.permutation(hi - lo)
        shuffled.indices[lo:hi] = shuffled.indices[order]
        shuffled.data[lo:hi] = shuffled.data[order]
    shuffled.has_sorted_indices = False
    out["csr_unsorted"] = shuffled
    # each entry split into two stored halves (not summed)
    out["csr_duplicates"] = _split(csr, sp.csr_array)
    out["csc_duplicates"] = _split(csr.tocsc(), sp.csc_array)
    return out


def _split(M, kind):
    """``M`` (canonical CSR/CSC) with each stored entry split into two stored halves."""
    indptr, indices, data = M.indptr, M.indices, M.data
    parts_i, parts_d = [], []
    for k in range(len(indptr) - 1):
        lo, hi = indptr[k], indptr[k + 1]
        half = data[lo:hi] / 2
        parts_i += [indices[lo:hi], indices[lo:hi]]
        parts_d += [half, data[lo:hi] - half]
    out = kind((np.concatenate(parts_d), np.concatenate(parts_i), 2 * indptr), shape=M.shape)
    assert out.nnz == 2 * M.nnz and not out.has_canonical_format
    return out


@pytest.mark.parametrize("variant", sorted(_variants(PROBLEMS["tall"][0])))
def test_formats_and_entries(variant):
    A, b, x0 = PROBLEMS["tall"]
    M = _variants(A)[variant]
    assert host.host_problem(M, b, None, None) is not None
    for kw in ({}, {"damp": 0.2, "x0": x0}):
        assert_same(lsqr(M, b, **kw), sla.lsqr(M, b, **kw))
        assert_same(lsmr(M, b, **kw), sla.lsmr(M, b, **kw))


def test_what_the_host_loop_serves():
    A, b, x0 = PROBLEMS["tall"]
    assert host.host_problem(A, b, None, None) is not None
    assert host.host_problem(A, list(b), x0, np) is not None
    assert host.host_problem(A, b.reshape(-1, 1), None, None) is not None
    assert host.host_problem(A.tocoo(), b, None, None) is None
    assert host.host_problem(A.astype(np.float32), b, None, None) is None
    assert host.host_problem(A.toarray(), b, None, None) is None
    assert host.host_problem(sla.aslinearoperator(A), b, None, None) is None
    assert host.host_problem(A, b.astype(complex), None, None) is None
    assert host.host_problem(A, b[:-1], None, None) is None
    assert host.host_problem(A, b, x0[:-1], None) is None


def test_b_and_x0_are_not_modified():
    A, b, x0 = PROBLEMS["tall"]
    keep_b, keep_x0 = b.copy(), x0.copy()
    lsqr(A, b, x0=x0, damp=0.1)
    lsmr(A, b, x0=x0, damp=0.1)
    lsqr(A, b)
    lsmr(A, b)
    assert np.array_equal(b, keep_b) and np.array_equal(x0, keep_x0)


# ---------------------------------------------------------------------------
# the replay with NumPy scalars

def test_zero_b_with_x0_replays_with_scipys_values():
    """‖b‖ = 0 with x0: SciPy's tests divide by zero (inf, NaN); Python would raise."""
    A, _, x0 = PROBLEMS["tall"]
    b = np.zeros(A.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = sla.lsqr(A, b, x0=x0)
    ours = lsqr(A, b, x0=x0)
    assert_same(ours, ref)
    assert ours.replayed
    assert_same(lsmr(A, b, x0=x0), sla.lsmr(A, b, x0=x0))     # SciPy returns at once


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_replay_reports_each_iteration_once(monkeypatch, solver):
    """A division by zero in Python's arithmetic at iteration 5 replays the run with NumPy's
    scalars: the callback sees iterations 1, 2, ... once each, the result is SciPy's (the
    Python loops' replay: the compiled loops are not asked for)."""
    monkeypatch.setenv(native.ENV, "numpy")
    A, b, _ = PROBLEMS["square"]
    calls = {"n": 0}
    real = host._givens_float
    per_iteration = 4 if solver == "lsmr" else 1

    def failing(a, b_):
        calls["n"] += 1
        if calls["n"] == 4 * per_iteration + 1:
            raise ZeroDivisionError("as Python raises where NumPy returns inf")
        return real(a, b_)
    monkeypatch.setattr(host, "_givens_float", failing)
    seen = []

    def watch(state):
        assert isinstance(state, IterationState)
        seen.append(state.itn)
        return False
    ours = (lsqr if solver == "lsqr" else lsmr)(A, b, callback=watch)
    ref = (sla.lsqr if solver == "lsqr" else sla.lsmr)(A, b)
    assert ours.replayed
    assert_same(ours, ref)
    assert seen == list(range(1, ref[2] + 1))


def test_callback_errors_propagate_at_once():
    """An arithmetic error raised by the callback is the callback's: it propagates, the run
    is not run again on NumPy scalars (the callback is called once)."""
    A, b, _ = PROBLEMS["tall"]
    calls = []

    def broken(state):
        calls.append(state.itn)
        return 1 / 0
    for solver in (lsqr, lsmr):
        calls.clear()
        with pytest.raises(ZeroDivisionError):
            solver(A, b, callback=broken)
        assert calls == [1]


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_host_loop_matches_the_generic_driver(solver):
    """The host loop and the generic driver (pipelined or not) give the same run, callback
    states included."""
    A, b, _ = PROBLEMS["wide"]
    run = _lsqr if solver == "lsqr" else _lsmr
    states = {}
    for mode in (None, False, True):
        seen = []
        res = run(A, b, pipelined=mode, callback=lambda s, seen=seen: seen.append(s[2:]))
        states[mode] = (seen, res)
    for mode in (False, True):
        assert [s[:-1] for s in states[mode][0]] == [s[:-1] for s in states[None][0]]
        assert_same(states[mode][1], states[None][1])
        assert states[mode][1].projected_iterations == states[None][1].projected_iterations


# ---------------------------------------------------------------------------
# what the Python-float arithmetic relies on

def test_givens_on_python_floats_is_scipys_sym_ortho():
    """Every branch of SciPy's ``_sym_ortho`` (signed zeros, NaN, infinities, either
    magnitude larger): the same three values to the bit."""
    from scipy.sparse.linalg._isolve.lsqr import _sym_ortho
    rng = np.random.default_rng(11)
    special = [0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 1e-310, -1e300]
    pairs = [(a, b) for a in special for b in special]
    scale = 10.0 ** rng.integers(-8, 8, (2000, 2))
    pairs += [tuple(v) for v in rng.standard_normal((2000, 2)) * scale]
    with np.errstate(all="ignore"):
        for a, b in pairs:
            ours = host._givens_float(float(a), float(b))
            theirs = _sym_ortho(np.float64(a), np.float64(b))
            assert [_bits(v) for v in ours] == [_bits(v) for v in theirs], (a, b, ours, theirs)


def test_python_float_power_is_numpys():
    """``x ** 2`` on a Python float and on a NumPy float64 call the same C ``pow`` (which is
    not always ``x * x``): the loops rely on it."""
    rng = np.random.default_rng(12)
    values = rng.standard_normal(20000) * 10.0 ** rng.integers(-150, 150, 20000)
    for x in values.tolist():
        assert _bits(x ** 2) == _bits(np.float64(x) ** 2), x
