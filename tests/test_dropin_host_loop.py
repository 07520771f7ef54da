"""``auto``'s CPU runs in the host loops (:mod:`scipy_gpuqr._iterative.host`).

The short path (:mod:`scipy_gpuqr._factor.quick_iterate`) and the general
path run SciPy's algorithm through our ``lsqr``/``lsmr``, which on a SciPy
CSR/CSC float64 matrix are the host loops: the answer, when SciPy's tests
stop the run, is SciPy's tuple to the last bit. The host loops' nominal cost
decides which runs are watched by the rule: one too short for the rule to
act on runs without a callback.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import TEST_MATRICES
from scipy_gpuqr import lsmr, lsqr
from scipy_gpuqr._api.originals import original
from scipy_gpuqr._dispatch import iterate_first as policy
from scipy_gpuqr._dispatch import placement
from scipy_gpuqr._factor import quick_iterate as quick
from scipy_gpuqr._factor.qr_ahead import QRAhead
from scipy_gpuqr._iterative import host
from scipy_gpuqr.io import mmread

SCIPY = {"lsqr": original("lsqr"), "lsmr": original("lsmr")}
OURS = {"lsqr": lsqr, "lsmr": lsmr}


def _matrix(name, fmt="csc"):
    return sp.csc_array(mmread(str(TEST_MATRICES / f"{name}.mtx"))).astype(np.float64) \
        .asformat(fmt)


def _bits_equal(ours, theirs):
    assert type(ours) is tuple and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        else:
            assert np.float64(a).tobytes() == np.float64(b).tobytes(), (a, b)


@pytest.mark.parametrize("fmt", ["csc", "csr"])
@pytest.mark.parametrize("name,method", [("lp_e226", "lsqr"), ("lp_e226_transposed", "lsqr"),
                                         ("ash219", "lsqr"), ("GD06_theory", "lsqr"),
                                         ("bfwa62", "lsqr")])
def test_auto_is_scipy_to_the_bit(name, method, fmt):
    A = _matrix(name, fmt)
    b = np.random.default_rng(len(name)).standard_normal(A.shape[0])
    theirs = SCIPY[method](A, b)
    assert theirs[1] in (1, 2)
    ours = OURS[method](A, b)
    _bits_equal(ours, theirs)


def test_the_short_path_runs_the_host_loop(monkeypatch):
    calls = []
    real = host.lsmr_host

    def spy(*args, **kwargs):
        calls.append(kwargs.get("callback"))
        return real(*args, **kwargs)
    monkeypatch.setattr(quick, "lsmr_host", spy)
    A = _matrix("lp_e226")
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    lsmr(A, b)
    assert len(calls) == 1


def test_short_runs_are_not_watched():
    """lp_e226's LSMR (223 iterations at most): at the host loop's nominal cost its whole run
    ends within the analysis deferral, so no callback watches it; at the generic CPU cost it
    would be watched. A run of 988 iterations on 494_bus is watched either way."""
    m, n, nnz = 223, 472, 2768
    analysis = policy.analysis_seconds(m, n, nnz)
    assert policy.needs_watching(223, m, n, nnz, on_gpu=False, analysis=analysis)
    assert not policy.needs_watching(223, m, n, nnz, on_gpu=False, analysis=analysis,
                                     host_loop=True)
    m = n = 494
    nnz = 1666
    analysis = policy.analysis_seconds(m, n, nnz)
    assert policy.needs_watching(988, m, n, nnz, on_gpu=False, analysis=analysis,
                                 host_loop=True)
    assert placement.host_iteration_seconds(m, n, nnz) < placement.cpu_iteration_seconds(m, n, nnz)
    assert policy.needs_watching(1, m, n, nnz, on_gpu=True, analysis=analysis, host_loop=True)


@pytest.mark.parametrize("name,method,watched", [("lp_e226", "lsmr", False),
                                                 ("494_bus", "lsqr", True)])
def test_the_short_path_watches_what_the_rule_can_act_on(monkeypatch, name, method, watched):
    seen = []
    real = quick.lsmr_host if method == "lsmr" else quick.lsqr_host

    def spy(*args, callback=None, **kwargs):
        seen.append(callback)
        return real(*args, callback=callback, **kwargs)
    monkeypatch.setattr(quick, method + "_host", spy)
    A = _matrix(name)
    b = np.random.default_rng(3).standard_normal(A.shape[0])
    OURS[method](A, b)
    assert len(seen) == 1
    assert isinstance(seen[0], policy.Allowance) == watched
    if not watched:     # at most the QR made ahead on a worker, on a host with cores to spare
        assert seen[0] is None or isinstance(seen[0], QRAhead)
