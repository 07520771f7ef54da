"""The per-call cost of a small exact answer on the host, kept answers (issue 15): adder_dcop_05's
``lsqr`` answered by the gap-checked sparse COD. A call after the first factorizes A and R₁ᵀ
in SuiteSparseQR's kept orders (:mod:`scipy_gpuqr._cpu.spqr_orders`: no ordering of its
own) and gives the first call's tuple bit for bit; the gap check's blocks of R are R's
leading arrays (``lstsq._leading_block``), the one-column sweeps of σ_min(R₁₁)'s Lanczos
run the same operations as the block sweeps (``_native.c``)."""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import lsqr
from scipy_gpuqr._cpu import spqr, spqr_orders
from scipy_gpuqr._factor import lstsq as lstsq_module
from scipy_gpuqr._factor import native
from scipy_gpuqr.io import mmread

from _native_helpers import built_library


def _digest(out) -> str:
    h = hashlib.sha1()
    for v in out:
        h.update(np.asarray(v, dtype=np.float64).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def adder(matrices_dir):
    A = sp.csc_array(mmread(str(matrices_dir / "adder_dcop_05.mtx")))
    # the drop-in ladder's b (bench/dropin.py's row_rhs)
    b = np.random.default_rng([20261126, zlib.crc32(b"adder_dcop_05")]).standard_normal(
        A.shape[0])
    return A, b


@pytest.mark.skipif(not spqr.spqr_available()[0], reason="SuiteSparseQR not available")
@pytest.mark.parametrize("backend", ["cpu", None])
def test_a_call_after_the_first_factorizes_in_kept_orders_with_the_same_tuple(
        monkeypatch, adder, backend):
    A, b = adder
    spqr_orders.clear()
    calls = []
    run = spqr._run

    def counted(libs, C, order_code, tol_code, threads):
        calls.append((C.shape, order_code, tol_code == spqr.SPQR_NO_TOL))
        return run(libs, C, order_code, tol_code, threads)
    monkeypatch.setattr(spqr, "_run", counted)
    first = lsqr(A, b, backend=backend)
    assert first[1] == 1 and first[2] == 0          # the QR's answer, itn 0
    ordered = [c for c in calls if c[2]]
    # A and R₁ᵀ without rank detection, R with it: each ordered by SuiteSparseQR
    assert len(ordered) == 2 and all(c[1] == spqr.ORDERINGS["colamd"] for c in calls)
    calls.clear()
    second = lsqr(A, b, backend=backend)
    assert [c[1] for c in calls if c[2]] == [spqr._FIXED, spqr._FIXED]
    assert [c[1] for c in calls if not c[2]] == [spqr.ORDERINGS["colamd"]]
    assert _digest(second) == _digest(first)
    spqr_orders.clear()
    assert _digest(lsqr(A, b, backend=backend)) == _digest(first)


def _trapezoidal_r(rng, r, n, k):
    D = np.zeros((k, n))
    D[:r] = np.triu(rng.standard_normal((r, n)) * (rng.random((r, n)) < 0.1))
    D[np.arange(r), np.arange(r)] = rng.uniform(0.5, 2.0, r)
    return sp.csc_array(D)


@pytest.mark.parametrize("seed", range(4))
def test_leading_block_is_scipys_slice(seed):
    rng = np.random.default_rng(seed)
    n = 60
    r = int(rng.integers(1, n))
    R = _trapezoidal_r(rng, r, n, n)
    R.indices = R.indices.astype(np.int64)
    R.indptr = R.indptr.astype(np.int64)
    for rows, cols in ((r, r), (r, n)):
        got, ref = lstsq_module._leading_block(R, rows, cols), R[:rows, :cols]
        assert got.shape == ref.shape
        for a in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got, a), getattr(ref, a))
        assert not np.shares_memory(got.data, R.data)
    # an entry in a row from ``rows`` on: SciPy's slice
    D = R.toarray()
    D[r if r < n else 0, 0] = 3.0
    S = sp.csc_array(D)
    got = lstsq_module._leading_block(S, r, r)
    np.testing.assert_array_equal(got.toarray(), D[:r, :r])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return built_library(native, tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("trans", [False, True])
def test_one_column_sweeps_are_the_block_sweeps_bit_for_bit(lib, trans):
    """The one-column path of ``sgf_upper_solve`` against its block path on a block of
    the same column twice: the same bits (entries below the diagonal skipped,
    non-finite values propagated)."""
    rng = np.random.default_rng(7)
    for q in (1, 2, 17, 300):
        R = sp.random_array((q, q), density=min(1.0, 8.0 / q), rng=rng, format="csc")
        R = sp.csc_array(sp.triu(R, k=1) + sp.tril(R, k=-1)
                         + sp.diags_array(rng.uniform(0.1, 2.0, q) * rng.choice([-1, 1], q)))
        f = native.SparseUpperSolves(lib, R)
        solve = f.solve_t if trans else f.solve
        for v in (rng.standard_normal(q) * 1e3, np.where(np.arange(q) == q // 2, np.nan, 1.0)):
            one = solve(v)
            block = solve(np.column_stack([v, v]))
            np.testing.assert_array_equal(one, block[:, 0])
            np.testing.assert_array_equal(solve(v[:, None])[:, 0], one)
