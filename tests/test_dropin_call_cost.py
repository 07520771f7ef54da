"""What the short path of ``lsqr``/``lsmr`` under ``auto`` makes only where a run needs it.

:mod:`scipy_gpuqr._factor.quick_iterate` answers most patched calls, many of
them runs of a few iterations that cost tens of microseconds; around them it
asks whether a GPU answers only where a GPU could take the run, counts A's
longest lines (a pass over its indices) only where a GPU thread block could,
makes the square A's LU answer only where the rule watches the run or the
QR answers, and formats the log's text only where the log is written. These
tests spy on each, and check the answers stay SciPy's.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._dispatch import placement
from scipy_gpuqr._factor import quick_iterate as quick
from scipy_gpuqr._factor.least_squares import StoppingRules

SCIPY = {"lsqr": original("lsqr"), "lsmr": original("lsmr")}
OURS = {"lsqr": lsqr, "lsmr": lsmr}


def _problem(m, n, density, seed):
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=density, rng=rng, format="csr") + \
        2.0 * sp.eye_array(m, n, format="csr")
    return sp.csr_array(A), rng.standard_normal(m)


def _rules(iter_lim=None):
    return StoppingRules(1e-6, 1e-6, 1e8, iter_lim)


def _bits(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        else:
            assert np.float64(a).tobytes() == np.float64(b).tobytes(), (a, b)


@pytest.fixture
def spies(monkeypatch):
    """Counts of the GPU question and of A's longest lines, the real answers kept."""
    asked = {"gpu": 0, "lines": 0}
    gpu, lines = quick.gpu_available, quick._longest_lines

    def gpu_available():
        asked["gpu"] += 1
        return gpu()

    def longest_lines(A):
        asked["lines"] += 1
        return lines(A)
    monkeypatch.setattr(quick, "gpu_available", gpu_available)
    monkeypatch.setattr(quick, "_longest_lines", longest_lines)
    return asked


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_no_gpu_no_longest_lines(method, spies, monkeypatch):
    """Where no GPU answers, a problem large enough for the GPU block is not scanned for its
    longest lines, and the GPU is asked about once; SciPy's bits answer."""
    monkeypatch.setattr(quick, "gpu_available", lambda: spies.__setitem__(
        "gpu", spies["gpu"] + 1) or False)
    A, b = _problem(4000, 2000, 0.004, seed=5)
    assert A.nnz >= placement.BLOCK_MIN_NNZ
    run = quick.quick_iterate(method, A, b, None, 0.0, _rules(), None, None)
    assert run is not None and run.found is not None
    _bits(run.found.result, SCIPY[method](A, b))
    assert spies["lines"] == 0
    assert spies["gpu"] <= 1


def test_a_gpu_counts_the_longest_lines(spies, monkeypatch):
    """Where a GPU answers and the block's cheap tests pass, the rule reads A's longest
    lines (the block's chain of one thread per line), once."""
    monkeypatch.setattr(quick, "gpu_available", lambda: True)
    monkeypatch.setattr(placement, "gpu_available", lambda: True)
    seen = []

    def block(m, n, nnz, *, on_gpu, longest):
        seen.append(longest())
        return None                                     # the host loop answers
    monkeypatch.setattr(quick, "iterate_in_block", block)
    A, b = _problem(4000, 2000, 0.004, seed=6)
    run = quick.quick_iterate("lsqr", A, b, None, 0.0, _rules(), None, None)
    assert run.found is not None
    rows, columns = np.diff(A.indptr).max(), np.bincount(A.indices).max()
    assert spies["lines"] == 1 and seen == [rows + columns]


def test_small_problems_never_ask_for_a_gpu(spies):
    """Below the block's size, where a CPU iteration beats a GPU one, nothing asks whether
    a GPU answers."""
    A, b = _problem(60, 40, 0.1, seed=7)
    run = quick.quick_iterate("lsqr", A, b, None, 0.0, _rules(), None, None)
    assert run.found is not None
    assert spies == {"gpu": 0, "lines": 0}


def _counting_square(made):
    def square_of(shape, nnz, matrix):
        made.append(shape)
        return None
    return square_of


def test_the_square_lu_is_made_only_where_needed():
    """A square run that converges unwatched makes no LU answer; one that ends at its
    iteration limit (the QR's or the LU's answer) makes it, once."""
    A, b = _problem(50, 50, 0.1, seed=8)
    made = []
    run = quick.quick_iterate("lsqr", A, b, None, 0.0, _rules(), None, None,
                              _counting_square(made))
    assert run.found is not None and made == [] and run.square is None
    _bits(run.found.result, SCIPY["lsqr"](A, b))
    run = quick.quick_iterate("lsqr", A, b, None, 0.0, _rules(iter_lim=2), None, None,
                              _counting_square(made))
    assert run.found is None and made == [(50, 50)]


def test_the_log_says_where_the_run_ran(caplog):
    """The log's text, formatted only when written, says why the CPU ran it."""
    caplog.set_level(logging.INFO, logger="scipy_gpuqr")
    A, b = _problem(60, 40, 0.1, seed=9)
    lsqr(A, b)
    text = [r.getMessage() for r in caplog.records if r.name == "scipy_gpuqr"][-1]
    cpu_s = placement.cpu_iteration_seconds(60, 40, A.nnz)
    assert f"CPU: a CPU iteration (about {cpu_s:.2g} s) beats a GPU one" in text, text
    assert "LSQR on CPU answered" in text


def test_where_formats_lazily():
    where = quick._Where("about %.2g s", 1.234e-5)
    assert str(where) == "about 1.2e-05 s" and f"{where}" == "about 1.2e-05 s"


@pytest.mark.parametrize("method", ["lsqr", "lsmr"])
def test_one_dimensional_csr_gets_the_general_error(method):
    """A one-dimensional CSR array is not the short path's input: the general path's
    ValueError, not an unpacking error."""
    A = sp.csr_array(np.array([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="2-D"):
        OURS[method](A, np.ones(3))
