"""LSQR/LSMR in one GPU thread block (scipy_gpuqr._iterative.block) against SciPy's.

The block runs SciPy's recurrences and stopping tests with its sums in
another order, so its promise is that of the CuPy path: the same ``istop``,
``itn`` within a few and x within the tolerance on well-conditioned
problems; on ill-conditioned ones (west0479, where SciPy's own run changes
istop and itn by tens of iterations when b moves by 1e-15) a converged
answer whose residual is SciPy's. Device tests carry the ``gpu`` marker; the
layout of the kernel's state, the packing and the dispatch are checked
without one.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

import scipy_gpuqr
from conftest import REPO
from test_iterative import CASES, GPU_CASES, _kwargs
from scipy_gpuqr._cli.solve_report import captured_decisions
from scipy_gpuqr._dispatch import placement
from scipy_gpuqr._factor import quick_iterate
from scipy_gpuqr._iterative import block
from scipy_gpuqr._iterative import IterationState
from scipy_gpuqr._iterative import lsmr as host_lsmr
from scipy_gpuqr._iterative import lsqr as host_lsqr
from scipy_gpuqr._iterative.block import (HISTORY, LSMR_STATE, LSQR_STATE, OPTIONS, BlockProblem,
                                          block_lsmr, block_lsqr, block_suits, block_threads)

KERNEL = REPO / "kernels" / block.BLOCK_FILE

#: Cases whose runs follow SciPy's closely (istop equal, itn within 2, x within GPU_CASES).
CLOSE = ("tall", "wide", "tall_damp", "tall_x0", "wide_damp", "machine_precision",
         "identity_breakdown", "diagonal_breakdown", "damp_x0", "coo_wide", "integer_rhs")
#: Ill-conditioned cases: a converged (or equally stopped) run with SciPy's residual.
LOOSE = ("iteration_limit", "west0479", "494_bus", "lp_e226_transposed", "lp_e226")


def _enum(name: str) -> list[str]:
    """The names of enum ``name`` in the kernel source, prefixes and the end marker dropped."""
    body = re.search(r"enum " + name + r" \{(.*?)\};", KERNEL.read_text(), re.S).group(1)
    names = [w.split("=")[0].strip() for w in body.split(",") if w.strip()]
    return [re.sub(r"^(OPT|LQ|LM|H)_", "", w).lower() for w in names
            if w not in ("N_OPTIONS", "LQ_END", "LM_END", "H_FIELDS")]


def test_state_layout_matches_the_kernel():
    assert _enum("Options") == list(OPTIONS)
    assert _enum("LsqrState") == [s.lower() for s in LSQR_STATE[len(OPTIONS):]]
    assert _enum("LsmrState") == [s.lower() for s in LSMR_STATE[len(OPTIONS):]]
    assert _enum("History") == list(HISTORY)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_packing(fmt, method):
    A = sp.random_array((7, 5), density=0.5, rng=np.random.default_rng(1), format=fmt)
    b, x0 = np.arange(7.0), np.arange(5.0) + 1
    options = dict(damp=0.5, atol=1e-7, btol=1e-8, ctol=1e-6, iter_lim=10.0, calc_var=1.0)
    P = BlockProblem(method, A, b, x0, options, rows=3, fill=np.nan)
    assert all(off % 8 == 0 for off in P.offsets.values()) and P.nbytes % 8 == 0
    buf = P.buffer

    def ints(name, size):
        return buf[P.offsets[name]:P.offsets[name] + 4 * size].view(np.int32)

    def floats(name, size):
        return P.view(buf, name, size)

    by_rows = sp.csr_array((floats("a_val", A.nnz), ints("a_idx", A.nnz), ints("a_ptr", 8)),
                           shape=(7, 5))
    by_cols = sp.csc_array((floats("t_val", A.nnz), ints("t_idx", A.nnz), ints("t_ptr", 6)),
                           shape=(7, 5))
    assert np.array_equal(by_rows.toarray(), A.toarray())
    assert np.array_equal(by_cols.toarray(), A.toarray())
    assert np.array_equal(floats("b", 7), b) and np.array_equal(floats("x0", 5), x0)
    state = floats("state", len(P.state_names))
    assert list(state[:len(OPTIONS)]) == [0.5, 1e-7, 1e-8, 1e-6, 10.0, 1.0, 1.0, 3.0]
    assert not np.any(state[len(OPTIONS):])             # started = 0: the kernel starts the run
    # what the copy back reads (history, x, var) is poisoned until the kernel writes it
    assert np.isnan(floats("x", 5)).all() and P.readback == P.offsets["vec"]


def test_threads_and_suitability():
    assert block_threads(4, 3) == 32 and block_threads(100, 20) == 128
    assert block_threads(10 ** 6, 10) == 1024
    A = sp.random_array((6, 4), density=0.5, rng=np.random.default_rng(0), format="csr")
    assert block_suits(A, np.ones(6), None) and block_suits(A.tocsc(), np.ones(6), np.ones(4))
    assert not block_suits(A.tocoo(), np.ones(6), None)
    assert not block_suits(A.astype(np.float32), np.ones(6), None)
    assert not block_suits(A, np.ones(5), None)
    assert not block_suits(A, np.ones(6, dtype=complex), None)


def test_block_rule(monkeypatch):
    """The block is chosen from BLOCK_MIN_NNZ entries where its iteration beats the host
    loop's and a margin of the CuPy path's; dense lines count against it."""
    monkeypatch.setattr(placement, "gpu_available", lambda: True)
    grid24 = (27648, 13824, 107136)
    start, per = placement.iterate_in_block(*grid24, on_gpu=False, longest=lambda: 14)
    assert start == placement.block_start_seconds(*grid24)
    assert per == placement.block_iteration_seconds(*grid24, 14)
    assert placement.iterate_in_block(*grid24, on_gpu=True) is None
    assert placement.iterate_in_block(24, 24, 81, on_gpu=False) is None     # too small
    grid40 = (128000, 64000, 502400)                    # a nominal tie with the CuPy path
    assert placement.iterate_in_block(*grid40, on_gpu=False) is None
    # rajat01, lines of 1442 entries: twice a block iteration above the host loop's
    # (98 µs on an H200's host), so HostFirst never moves the run
    _, per = placement.iterate_in_block(6833, 6833, 43250, on_gpu=False,
                                            longest=lambda: 2884)
    assert 2 * per > 98e-6
    asked = []
    assert placement.iterate_in_block(24, 24, 81, on_gpu=False,
                                          longest=lambda: asked.append(1) or 0) is None
    assert asked == []                                  # not asked where cheap tests decide
    monkeypatch.setattr(placement, "gpu_available", lambda: False)
    assert placement.iterate_in_block(*grid24, on_gpu=False) is None


def test_longest_lines():
    A = sp.csr_array(np.array([[1.0, 0, 0], [1, 1, 1], [1, 0, 1], [1, 0, 0]]))
    assert quick_iterate._longest_lines(A) == 3 + 4
    assert quick_iterate._longest_lines(sp.csc_array(A)) == 4 + 3


def test_host_first_charges_the_block_iterations_once():
    """With the block's seconds per iteration, a run moves once its iterations so far have
    cost the block's start beyond what the block would have spent on them (the block goes
    on from there: they are not made again); never where h <= g. The moving iteration is
    kept for the caller, not shown to the watcher."""
    def state(itn, seconds):
        return IterationState(itn, None, 0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, seconds)

    class Watch:
        analysis_s = 0.0

        def __init__(self):
            self.seen = []

        def __call__(self, s):
            self.seen.append(s.itn)
            return False

        def quiet_until(self):
            return float("inf")

    watch = Watch()
    move = placement.HostFirst(1e-3, watch, per_iteration=1e-5)
    assert not move(state(1, 5e-4))                 # the call's start is not counted
    assert not move(state(11, 5e-4 + 1.05e-3)) and not move.moved
    assert move.quiet_until() == 5e-4 + 11 * 1e-5 + 1e-3
    assert move(state(12, 5e-4 + 1.15e-3)) and move.moved and move.seconds == 5e-4 + 1.15e-3
    assert watch.seen == [1, 11] and move.last.itn == 12
    slow = placement.HostFirst(1e-3, per_iteration=1e-5)
    assert not any(slow(state(k, 1e-3 + 1e-5 * k)) for k in range(1, 10000))
    plain = placement.HostFirst(1e-3)
    assert plain(state(1, 1e-3))


def test_block_rent_keeps_a_move_within_the_bound():
    """With the rent, a run that moves and stops at the next iteration costs at most
    MOVE_BOUND of SciPy's (host iterations HOST_LOOP_SPEEDUP times cheaper than SciPy's),
    whatever the block's start; a long run still moves, rent times later than plain ski
    rental."""
    f = placement
    assert f.BLOCK_RENT == pytest.approx(1 / (f.MOVE_BOUND * f.HOST_LOOP_SPEEDUP - 1))

    def state(itn, seconds):
        return IterationState(itn, None, 0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, seconds)

    for start in (5e-4, 3.7e-3, 2e-2):
        for h, g in ((1.2e-3, 2.3e-4), (1.2e-3, 1.1e-3), (1.4e-4, 4e-5), (4e-4, 3e-4)):
            call = h                                # the call's start: one iteration's worth
            move = f.HostFirst(start, per_iteration=g, rent=f.BLOCK_RENT)
            k = next((k for k in range(1, 10 ** 5)
                      if move(state(k, call + k * h))), None)
            if k is None:
                continue
            ours = call + k * h + start + g         # moved, then stopped at once
            assert ours <= f.MOVE_BOUND * f.HOST_LOOP_SPEEDUP * (k + 1) * h, (start, h, g, k)
            plain = f.HostFirst(start, per_iteration=g)
            k1 = next(k for k in range(1, 10 ** 5) if plain(state(k, call + k * h)))
            assert k >= k1 and (k - 1) * (h - g) >= f.BLOCK_RENT * start
    # ch7-8-b3 (7 iterations of about 1.2 ms on an H200's host): stays on the host
    ch7 = f.block_start_seconds(58800, 11760, 235200), f.block_iteration_seconds(
        58800, 11760, 235200, 24)
    move = f.HostFirst(ch7[0], per_iteration=ch7[1], rent=f.BLOCK_RENT)
    assert not any(move(state(k, 1.2e-3 * (k + 1))) for k in range(1, 8))
    assert f.HostFirst(1e-3, rent=5.0)(state(1, 1e-3))     # the upload's rule has no rent


def _fake_block(calls):
    """block_lsqr/lsmr run by our host loops (SciPy's bits), counting the calls."""
    def run(method):
        def fn(A, b, damp, atol, btol, conlim, iter_lim, show, *rest, callback=None,
               resume=None):
            calls.append(method)
            assert resume is not None and resume.method == method and resume.itn >= 1
            if method == "lsqr":
                return host_lsqr(A, b, damp, atol, btol, conlim, iter_lim, show, rest[0], None,
                                 xp=np, callback=callback)
            return host_lsmr(A, b, damp, atol, btol, conlim, iter_lim, show, None, xp=np,
                        callback=callback)
        return fn
    return run


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_auto_moves_to_the_block(monkeypatch, method):
    """Under auto a run that outlasts the block's start moves there and answers from it; a
    run that ends first stays on the CPU (SciPy's bits)."""
    calls = []
    fake = _fake_block(calls)
    monkeypatch.setattr(quick_iterate, "block_lsqr", fake("lsqr"))
    monkeypatch.setattr(quick_iterate, "block_lsmr", fake("lsmr"))
    A, b, _ = CASES["tall"]
    ours, theirs = getattr(scipy_gpuqr, method), getattr(sla, method)
    ref = theirs(A, b)
    for budget, moved in ((0.0, True), (10.0, False)):
        calls.clear()
        monkeypatch.setattr(quick_iterate, "iterate_in_block",
                            lambda m, n, nnz, on_gpu, longest, budget=budget: (budget, 0.0))
        with captured_decisions() as decisions:
            res = ours(A, b)
        assert calls == ([method] if moved else [])
        assert res[1] == ref[1] and res[2] == ref[2]
        assert np.array_equal(res[0], ref[0])
        assert ("one block" in decisions[-1]) == moved, decisions[-1]


# ---------------------------------------------------------------------------
# on the device

def _residual(A, b, x):
    return np.linalg.norm(b - A @ x)


def _check(case, res, ref, b, A):
    assert isinstance(res.x, np.ndarray) and res.x.shape == ref[0].shape
    if case in CLOSE:
        assert res.istop == ref[1], (case, res.istop, ref[1])
        assert abs(res.itn - ref[2]) <= 2, (case, res.itn, ref[2])
        tol = GPU_CASES.get(case, 1e-5)
        assert np.linalg.norm(res.x - ref[0]) <= tol * np.linalg.norm(ref[0]), case
    else:
        converged = (1, 2)
        assert res.istop == ref[1] or (res.istop in converged and ref[1] in converged), \
            (case, res.istop, ref[1])
        assert abs(res.itn - ref[2]) <= max(3, 0.1 * ref[2]), (case, res.itn, ref[2])
    r, rs = _residual(A, b, res.x), _residual(A, b, ref[0])
    assert r <= 1.05 * rs + 1e-12 * np.linalg.norm(b), (case, r, rs)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("case", CLOSE + LOOSE)
def test_block_matches_scipy(case, fmt):
    A, b, kw = CASES[case]
    A = sp.csr_array(A) if fmt == "csr" else sp.csc_array(A)
    b = np.asarray(b, dtype=np.float64).ravel()
    for solver, ours, theirs in (("lsqr", block_lsqr, sla.lsqr), ("lsmr", block_lsmr, sla.lsmr)):
        kwo = _kwargs(kw, solver)
        ref = theirs(A, b, **kwo)
        _check(case, ours(A, b, **kwo), ref, b, A)
        # the parts read back poisoned with NaN: the kernel writes all it returns
        poisoned = ours(A, b, **kwo, _fill=np.nan)
        assert np.all(np.isfinite(poisoned.x))
        assert np.array_equal(poisoned.x, ours(A, b, **kwo).x)      # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(4))
def test_block_random(seed):
    rng = np.random.default_rng(seed)
    m, n = [(300, 80), (80, 300), (2000, 1500), (5000, 700)][seed]
    A = sp.random_array((m, n), density=min(1.0, 8 / n), rng=rng, format="csr")
    A = (A + sp.eye_array(m, n, format="csr")).tocsr()
    b = rng.standard_normal(m)
    for ours, theirs in ((block_lsqr, sla.lsqr), (block_lsmr, sla.lsmr)):
        ref = theirs(A, b)
        res = ours(A, b)
        assert res.istop == ref[1] and abs(res.itn - ref[2]) <= 2
        assert np.linalg.norm(res.x - ref[0]) <= 1e-5 * np.linalg.norm(ref[0])


@pytest.mark.gpu
def test_block_var_and_exact_starts():
    A, b, _ = CASES["tall"]
    res, ref = block_lsqr(A, b, calc_var=True, iter_lim=5), sla.lsqr(A, b, calc_var=True,
                                                                    iter_lim=5)
    assert np.linalg.norm(res.var - ref[9]) <= 1e-10 * np.linalg.norm(ref[9])
    res, ref = block_lsqr(A, b, calc_var=True), sla.lsqr(A, b, calc_var=True)
    assert np.linalg.norm(res.var - ref[9]) <= 1e-2 * np.linalg.norm(ref[9])
    assert not np.any(block_lsqr(A, b).var)
    m, n = A.shape
    for ours in (block_lsqr, block_lsmr):
        zero = ours(A, np.zeros(m))
        assert (zero.istop, zero.itn) == (0, 0) and not np.any(zero.x)
        assert zero.projected_iterations == 0
    # x0 exact (integers: b − A x0 is 0 in any order of the sums)
    C = sp.csr_array(np.array([[1.0, 2, 0], [0, 1, 3], [4, 0, 1], [1, 1, 1]]))
    x_true = np.array([1.0, 2, 3])
    for ours in (block_lsqr, block_lsmr):
        exact = ours(C, C @ x_true, x0=x_true)
        assert exact.itn == 0 and np.array_equal(exact.x, x_true)


@pytest.mark.gpu
def test_block_stretches_resume_the_run():
    """A watched run, launched in stretches, is the unwatched run bit for bit; the callback
    sees every iteration; callback and allowance stop it between launches."""
    A, b, kw = CASES["494_bus"]
    for ours in (block_lsqr, block_lsmr):
        one = ours(A, b)
        seen = []
        two = ours(A, b, callback=lambda state: seen.append(state.itn) and False)
        assert (one.istop, one.itn) == (two.istop, two.itn) and np.array_equal(one.x, two.x)
        assert seen == list(range(1, two.itn + 1)) and one.host_syncs == 1
        assert two.host_syncs > 1
        stop = ours(A, b, callback=lambda state: state.itn == 40)
        assert stop.stopped_by_callback and stop.istop == 0 and 40 <= stop.itn <= 64
        spent = ours(A, b, max_seconds=0.0)
        assert spent.allowance_spent and spent.itn == block.FIRST_STRETCH


@pytest.mark.gpu
def test_auto_answers_from_the_block(monkeypatch):
    """A host run that moves (at once, here) is answered by SciPy's run in the block."""
    monkeypatch.setattr(quick_iterate, "iterate_in_block",
                        lambda m, n, nnz, on_gpu, longest: (0.0, 0.0))
    A, b, _ = CASES["lp_e226_transposed"]
    ref = sla.lsqr(A, b)
    scipy_gpuqr.lsqr(A, b)                      # the kernels compiled
    with captured_decisions() as decisions:
        res = scipy_gpuqr.lsqr(A, b)
    assert "one block" in decisions[-1], decisions[-1]
    assert res[1] in (1, 2) and abs(res[2] - ref[2]) <= 0.1 * ref[2]
    assert _residual(A, b, res[0]) <= 1.05 * _residual(A, b, ref[0])
