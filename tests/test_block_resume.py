"""A host LSQR/LSMR run that goes on in one GPU thread block from where it stopped.

Under ``auto`` a run on host data starts in the host loops and, where one GPU
thread block suits the problem, moves there (``HostFirst``); the host loop's
state after its last iteration (:class:`~scipy_gpuqr._iterative.host.Handoff`)
is written into the block's buffer as the kernel's own, and the block makes
the next iteration. Without a GPU the hand-off is checked against the kernel's
source (its state's and vectors' layout), between the compiled and the Python
loops (bit for bit), and through a NumPy emulation of the kernel
(``_block_emulator``): the resumed run makes SciPy's iterates, counts the
host's iterations and shows a watcher each iteration once. On the device the
resumed kernel follows SciPy's run (same istop, itn within a few, x within
the tolerance) on the ladder's matrices, moved at several iterations.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

import scipy_gpuqr
from _block_emulator import BlockEmulator
from conftest import REPO
from scipy_gpuqr._cli.solve_report import captured_decisions
from scipy_gpuqr._dispatch import iterate_first, placement
from scipy_gpuqr._factor import quick_iterate
from scipy_gpuqr._iterative import block, native
from scipy_gpuqr._iterative.block import (LSMR_STATE, LSQR_STATE, VECTORS, BlockProblem,
                                          block_lsmr, block_lsqr)
from scipy_gpuqr._iterative.host import (HANDOFF_SCALARS, HANDOFF_VECTORS, host_problem,
                                         lsmr_host, lsqr_host)
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares)

KERNEL = REPO / "kernels" / block.BLOCK_FILE
BLOCK = {"lsqr": block_lsqr, "lsmr": block_lsmr}
SCIPY = {"lsqr": sla.lsqr, "lsmr": sla.lsmr}
TOL = dict(atol=1e-10, btol=1e-10)


def _problem(seed=0, m=300, n=80):
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=0.1, rng=rng, format="csr")
    A = sp.csr_array(A + sp.eye_array(m, n, format="csr"))
    return A, rng.standard_normal(m), rng.standard_normal(n)


def _host_run(method, A, b, x0=None, stop_at=3, calc_var=False, **tol):
    """The host loops stopped by their callback after iteration ``stop_at``: (fields, info)."""
    P = host_problem(A, b, x0, np)
    tol = {**TOL, **tol}
    stop = lambda state: state.itn >= stop_at          # noqa: E731
    if method == "lsqr":
        return lsqr_host(P, 0.0, tol["atol"], tol["btol"], 1e8, None, calc_var, callback=stop,
                         handoff=True)
    return lsmr_host(P, 0.0, tol["atol"], tol["btol"], 1e8, None, callback=stop, handoff=True)


# ---------------------------------------------------------------------------
# the layout the hand-off writes

def _kernel_vectors(method: str) -> list[str]:
    """The kernel's vectors in the order of their offsets in ``vec``, read from the source
    (``double* u = vec;``, ``vec + m``, ``vec + m + n``, ``vec + m + 2 * (long long)n``)."""
    body = KERNEL.read_text().split(f"{method}_block(int m")[1].split("__global__")[0]
    found = []
    for name, expr in re.findall(r"double\* (\w+) = (vec[^;]*);", body):
        terms = [t.strip() for t in expr.split("+")[1:]]
        in_m = sum(t == "m" for t in terms)
        in_n = sum(int(t.split("*")[0]) if "*" in t else 1 for t in terms if t.endswith("n"))
        found.append(((in_m, in_n), name))
    return [name for _, name in sorted(found)]


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_handoff_names_follow_the_kernel(method):
    """The scalars handed on are the kernel's state after its scale factors, in order (the
    compiled loops write them in that order); the vectors are the kernel's, in ``vec``'s
    order."""
    state = LSQR_STATE if method == "lsqr" else LSMR_STATE
    scalars = HANDOFF_SCALARS[method]
    assert state[state.index("sv") + 1:] == scalars
    assert VECTORS[method] == HANDOFF_VECTORS[method] == tuple(_kernel_vectors(method))
    assert len(scalars) <= native.OUT - native.OUT_STATE


@pytest.mark.parametrize("x0", [False, True])
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_compiled_and_python_handoffs_agree(monkeypatch, method, x0):
    """The compiled loops hand on what the Python loops do, bit for bit (both are SciPy's
    statements)."""
    A, b, x0v = _problem(1)
    x0v = x0v if x0 else None
    runs = []
    for mode in ("c", "numpy"):
        monkeypatch.setenv(native.ENV, mode)
        try:
            fields, info = _host_run(method, A, b, x0v, stop_at=6, calc_var=True)
        except native.NativeUnavailable:
            pytest.skip("no compiled loops here")
        runs.append((fields, info["handoff"]))
    (f1, h1), (f2, h2) = runs
    assert h1.itn == h2.itn == f1[2] == 6 and f1[1] == 0
    assert list(h1.scalars) == list(HANDOFF_SCALARS[method])
    assert np.array(list(h1.scalars.values())).tobytes() == \
        np.array(list(h2.scalars.values())).tobytes()
    for name in HANDOFF_VECTORS[method]:
        assert h1.vectors[name].tobytes() == h2.vectors[name].tobytes(), name
    assert h1.x.tobytes() == h2.x.tobytes() and h1.x is f1[0]
    if method == "lsqr":
        assert h1.var.tobytes() == h2.var.tobytes() and np.any(h1.var)
    assert h1.tests == h2.tests and len(h1.tests) == 6
    assert h1.seconds > 0


def test_no_handoff_where_scipy_stops_or_none_asked():
    A, b, _ = _problem(2)
    P = host_problem(A, b, None, np)
    fields, info = lsqr_host(P, 0.0, 1e-6, 1e-6, 1e8, None, False, handoff=True)
    assert fields[1] in (1, 2) and info["handoff"] is None
    _, info = lsqr_host(P, 0.0, 1e-6, 1e-6, 1e8, None, False, callback=lambda s: True)
    assert "handoff" not in info
    _, info = lsmr_host(host_problem(A, np.zeros(A.shape[0]), None, np), 0.0, 1e-6, 1e-6, 1e8,
                        None, callback=lambda s: True, handoff=True)
    assert info["handoff"] is None                  # an exact start: nothing to go on from


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_resume_writes_the_kernels_state(method):
    """The buffer a resumed run uploads holds the host's state as the kernel reads it: started,
    not done, itn, scale factors 1, every scalar by name, the vectors at the kernel's offsets
    in ``vec``, x and var; the options as a fresh run's (no x0)."""
    A, b, x0 = _problem(3)
    _, info = _host_run(method, A, b, x0, stop_at=4, calc_var=True)
    h = info["handoff"]
    options = dict(damp=0.0, atol=1e-10, btol=1e-10, ctol=1e-8, iter_lim=160.0, calc_var=1.0)
    P = BlockProblem(method, A, b, None, options, rows=3, fill=np.nan)
    P.resume(h)
    buf, m, n = P.buffer, *A.shape
    state = dict(zip(P.state_names, P.view(buf, "state", len(P.state_names))))
    assert (state["started"], state["done"], state["itn"], state["istop"]) == (1, 0, 4, 0)
    assert (state["su"], state["sv"], state["has_x0"]) == (1, 1, 0)
    assert all(state[k] == v for k, v in h.scalars.items())
    assert state["iter_lim"] == 160 and state["hist_rows"] == 3
    vec = P.view(buf, "vec", m + (len(VECTORS[method]) - 1) * n)
    offsets = [0, m] + [m + k * n for k in range(1, len(VECTORS[method]) - 1)]
    for name, at in zip(_kernel_vectors(method), offsets):
        size = m if name == "u" else n
        assert np.array_equal(vec[at:at + size], h.vectors[name]), name
    assert np.array_equal(P.view(buf, "x", n), h.x)
    if method == "lsqr":
        assert np.array_equal(P.view(buf, "var", n), h.var)
    # the history is still the kernel's to write
    assert np.isnan(P.view(buf, "hist", 3 * len(block.HISTORY))).all()
    with pytest.raises(ValueError):
        BlockProblem("lsmr" if method == "lsqr" else "lsqr", A, b, None, options, 3).resume(h)


# ---------------------------------------------------------------------------
# the emulated block

@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_emulated_block_matches_scipy(method):
    """The emulation runs the kernel's statements: from its own start, SciPy's run."""
    A, b, x0 = _problem(4)
    for x in (None, x0):
        ref = SCIPY[method](A, b, x0=x, **TOL)
        res = BLOCK[method](A, b, x0=x, **TOL, _device=BlockEmulator)
        assert (res.istop, res.itn) == (ref[1], ref[2])
        assert np.linalg.norm(res.x - ref[0]) <= 1e-10 * np.linalg.norm(ref[0])


@pytest.mark.parametrize("x0", [False, True])
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_resumed_run_follows_scipy(method, x0):
    """Moved after iteration k, the block makes SciPy's next iterates: the same istop, itn
    and tuple; a watcher sees iterations k+1.. once each, their seconds going on from the
    host run's; the stretches start at k."""
    A, b, x0v = _problem(5)
    x0v = x0v if x0 else None
    ref = SCIPY[method](A, b, x0=x0v, **TOL)
    for k in (1, 2, 7, ref[2] - 1):
        _, info = _host_run(method, A, b, x0v, stop_at=k, calc_var=method == "lsqr")
        h = info["handoff"]
        seen = []
        devices = []

        def device(*args):
            devices.append(BlockEmulator(*args))
            return devices[-1]
        res = BLOCK[method](A, b, x0=x0v, **TOL, callback=lambda s: seen.append(s) and False,
                            calc_var=True, resume=h, _device=device) if method == "lsqr" else \
            BLOCK[method](A, b, x0=x0v, **TOL, callback=lambda s: seen.append(s) and False,
                          resume=h, _device=device)
        assert (res.istop, res.itn) == (ref[1], ref[2]), k
        assert np.linalg.norm(res.x - ref[0]) <= 1e-10 * np.linalg.norm(ref[0])
        assert np.allclose(res[3:8], ref[3:8], rtol=1e-9, atol=0)
        if method == "lsqr":
            full = sla.lsqr(A, b, x0=x0v, calc_var=True, **TOL)
            assert np.allclose(res.var, full[9], rtol=1e-9)
        assert [s.itn for s in seen] == list(range(k + 1, ref[2] + 1))
        times = [s.seconds for s in seen]
        assert times[0] >= h.seconds and times == sorted(times) and res.seconds >= times[-1]
        assert devices[0].launches[0][0] == k
        assert res.projected_iterations == 0


def test_resumed_run_stops_and_projects_as_one_run():
    """A resumed run stopped by its iteration limit projects from the host's tests and its
    own (the window is filled across the move)."""
    A, b, _ = _problem(6)
    _, info = _host_run("lsqr", A, b, stop_at=3, atol=1e-14, btol=1e-14)
    res = block_lsqr(A, b, atol=1e-14, btol=1e-14, iter_lim=6, resume=info["handoff"],
                     _device=BlockEmulator)
    assert (res.istop, res.itn) == (7, 6)
    ref = sla.lsqr(A, b, atol=1e-14, btol=1e-14, iter_lim=6)
    assert np.linalg.norm(res.x - ref[0]) <= 1e-12 * np.linalg.norm(ref[0])
    assert res.projected_iterations is not None     # six tests: three from the host


class _MoveAt(placement.HostFirst):
    """HostFirst that moves the run at iteration ``AT`` (whatever the seconds)."""

    AT = 1

    def __call__(self, state):
        if state.itn >= self.AT:
            self.moved, self.seconds, self.last = True, state.seconds, state
            return True
        return bool(self.watch(state)) if self.watch is not None else False


class _Counted(iterate_first.Allowance):
    """An Allowance that keeps every iteration it is shown."""

    shown: list = []

    def __call__(self, state):
        type(self).shown.append(state.itn)
        return super().__call__(state)

    def catch_up(self, states):
        type(self).shown.extend(s.itn for s in states)
        super().catch_up(states)


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_auto_goes_on_in_the_block(monkeypatch, method):
    """Under auto, a run moved after iteration k is answered by the block that went on from
    there: SciPy's istop and itn, x to rounding, the log saying so; a watcher of the run
    sees each iteration once across the move."""
    monkeypatch.setattr(quick_iterate, "iterate_in_block",
                        lambda m, n, nnz, on_gpu, longest: (0.0, 1e-9))
    monkeypatch.setattr(quick_iterate, "HostFirst", _MoveAt)
    monkeypatch.setattr(quick_iterate, "Allowance", _Counted)
    monkeypatch.setattr(quick_iterate, "needs_watching", lambda *a, **k: True)
    monkeypatch.setattr(quick_iterate, "block_lsqr",
                        functools.partial(block_lsqr, _device=BlockEmulator))
    monkeypatch.setattr(quick_iterate, "block_lsmr",
                        functools.partial(block_lsmr, _device=BlockEmulator))
    A, b, _ = _problem(7, 400, 120)
    ref = SCIPY[method](A, b)
    for k in (1, 4, ref[2] - 1):
        _MoveAt.AT = k
        _Counted.shown = []
        with captured_decisions() as decisions:
            res = getattr(scipy_gpuqr, method)(A, b)
        text = "\n".join(decisions)
        assert "one block" in decisions[-1] and f"after {k} iterations" in text, text
        assert (res[1], res[2]) == (ref[1], ref[2])
        assert np.linalg.norm(res[0] - ref[0]) <= 1e-10 * np.linalg.norm(ref[0])
        assert _Counted.shown == list(range(1, ref[2] + 1)), (k, _Counted.shown)


# ---------------------------------------------------------------------------
# on the device

def _ladder():
    """The drop-in ladder's rows that move to the block (bench/dropin.py's matrices)."""
    return {"ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
            "rand20000x4000": lambda: random_least_squares(20000, 4000, 0.0012, seed=1),
            "grid16": lambda: grid3d_least_squares(16)}


#: Rows whose SciPy run moves x by more than 1e-5 (relative) when its sums' rounding
#: changes: grid16 lsmr's x moves by 2.7e-5 (3.5e-5 with x0) with b scaled by 1 + 1e-16·N(0, 1)
#: elementwise, at the same istop and itn; one iteration more or less moves it by 2.5e-4.
#: The block's sums run in another order (resumed or not; the NumPy emulation of the
#: resumed kernel makes SciPy's x to the bit).
ROUNDING = {("grid16", "lsmr"): 2e-4}


def test_grid16_lsmr_rounding_spread():
    """What ROUNDING allows is what SciPy's own run shows under rounding, and the resumed
    run in NumPy's order is SciPy's: the spread is the sums' order, not the hand-off."""
    A = _matrix("grid16")
    rng = np.random.default_rng(11)
    b = rng.standard_normal(A.shape[0])
    ref = sla.lsmr(A, b)
    bumped = sla.lsmr(A, b * (1 + 1e-16 * rng.standard_normal(b.size)))
    spread = np.linalg.norm(bumped[0] - ref[0]) / np.linalg.norm(ref[0])
    assert bumped[2] == ref[2] and 1e-5 < spread < ROUNDING[("grid16", "lsmr")] / 4
    for k in (1, ref[2] // 2):
        _, info = _host_run("lsmr", A, b, stop_at=k, atol=1e-6, btol=1e-6)
        res = block_lsmr(A, b, resume=info["handoff"], _device=BlockEmulator)
        assert res.itn == ref[2] and np.linalg.norm(res.x - ref[0]) <= 1e-12 * np.linalg.norm(
            ref[0])


@functools.lru_cache(maxsize=None)
def _matrix(name):
    return sp.csr_array(_ladder()[name](), dtype=np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("x0", [False, True])
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
@pytest.mark.parametrize("name", ["ch7-8-b3", "rand20000x4000", "grid16"])
def test_resumed_kernel_follows_scipy(name, method, x0):
    """The kernel, resumed from the host loops' state after iteration k (several k), makes
    SciPy's run: the same istop, itn within 2, x within 1e-5 of SciPy's, the watcher seeing
    iterations k+1.. once each."""
    A = _matrix(name)
    m, n = A.shape
    rng = np.random.default_rng(11)
    b = rng.standard_normal(m)
    x0v = rng.standard_normal(n) if x0 else None
    ref = SCIPY[method](A, b, x0=x0v)
    for k in sorted({1, max(1, ref[2] // 2), max(1, ref[2] - 2)}):
        if k >= ref[2]:
            continue
        _, info = _host_run(method, A, b, x0v, stop_at=k, atol=1e-6, btol=1e-6)
        seen = []
        res = BLOCK[method](A, b, x0=x0v, callback=lambda s: seen.append(s.itn) and False,
                            resume=info["handoff"])
        assert res.istop == ref[1], (name, k, res.istop, ref[1])
        assert abs(res.itn - ref[2]) <= 2, (name, k, res.itn, ref[2])
        tol = ROUNDING.get((name, method), 1e-5)
        assert np.linalg.norm(res.x - ref[0]) <= tol * np.linalg.norm(ref[0]), (name, k)
        assert seen == list(range(k + 1, res.itn + 1))
        again = BLOCK[method](A, b, x0=x0v, resume=info["handoff"], _fill=np.nan)
        assert np.array_equal(again.x, res.x) and again.itn == res.itn


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_auto_resumes_in_the_kernel(monkeypatch, method):
    """Under auto on ch7-8-b3, moved after iteration k (forced), SciPy's answer from the block
    that went on there, ``itn`` counting the CPU's iterations."""
    monkeypatch.setattr(quick_iterate, "HostFirst", _MoveAt)
    A = _matrix("ch7-8-b3")
    b = np.random.default_rng(12).standard_normal(A.shape[0])
    ref = SCIPY[method](A, b)
    for k in (1, 3, 5):
        _MoveAt.AT = k
        with captured_decisions() as decisions:
            res = getattr(scipy_gpuqr, method)(A, b)
        text = "\n".join(decisions)
        assert "one block" in decisions[-1] and f"after {k} iterations" in text, text
        assert res[1] == ref[1] and abs(res[2] - ref[2]) <= 2
        assert np.linalg.norm(res[0] - ref[0]) <= 1e-5 * np.linalg.norm(ref[0])
