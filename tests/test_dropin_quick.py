"""The short path of ``lsqr``/``lsmr`` under ``auto`` (:mod:`scipy_gpuqr._factor.quick_iterate`).

A SciPy CSR/CSC float64 A with a float64 vector b, no x0, no damping and no
backend named take it. It must answer exactly as the general path does:
SciPy's tuple bit for bit when SciPy's iterations converge, the QR's exact
answer when they do not, DESIGN §10's errors for non-finite input, the
caller's arrays untouched, and every other input left to the general path.
"""

from __future__ import annotations

import logging

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


@pytest.fixture
def decisions(caplog):
    caplog.set_level(logging.INFO, logger="scipy_gpuqr")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "scipy_gpuqr"]


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
    dict(x0=np.zeros(6)), dict(damp=0.5), dict(backend="auto"),
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


def test_environment_backend_takes_the_general_path(monkeypatch, decisions):
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "reference")
    A, b = _problem(10, 6, seed=17)
    assert quick.quick_iterate("lsqr", A, b, None, 0.0, StoppingRules(1e-6, 1e-6, 1e8, None),
                               None, None) is None
    assert lsqr(A, b)[2] == 0           # the QR answered
