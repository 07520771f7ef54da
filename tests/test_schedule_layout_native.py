"""R's layout through the compiled arithmetic runs equals the NumPy one (CPU only).

The library is built into a temporary folder (never the user's cache).
Skipped only where no C compiler exists.
"""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import rlayout
from scipy_gpuqr._schedule import native
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares)

from _native_helpers import built_loader, needs_compiler, use_loader

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return built_loader(native, tmp_path_factory.mktemp("native"))[0]


def _runs(rng, n, dtype):
    length = rng.integers(1, 40, n)
    start = np.concatenate(([0], np.cumsum(length)[:-1]))
    hi = 2 ** 20 if dtype == np.int32 else 2 ** 40
    first = rng.integers(-hi, hi, n)
    step = rng.integers(-1000, 1000, n)
    return first, step, length, start, int(length.sum())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("threads", [0, 1, 3, 7])
def test_arith_runs_identical(lib, dtype, threads):
    rng = np.random.default_rng(threads + (dtype == np.int64))
    for n in (1, 2, 5, 1000, 20000):
        first, step, length, start, total = _runs(rng, n, dtype)
        want = rlayout._arith_runs_numpy(first, step, length, start, total, dtype)
        got = native.arith_runs(lib.get(True), first, step, length, start, total, dtype,
                                threads=threads)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_arith_runs_refuses_runs_that_do_not_cover(lib):
    first, step, length, start, total = _runs(np.random.default_rng(0), 10, np.int64)
    with pytest.raises(ValueError):
        native.arith_runs(lib.get(True), first, step, length, start, total + 1, np.int64)
    with pytest.raises(ValueError):
        native.arith_runs(lib.get(True), first[:0], step[:0], length[:0], start[:0], 3,
                          np.int64)
    with pytest.raises(ValueError):
        native.arith_runs(lib.get(True), first, step, length, start, total, np.float64)


#: Small matrices of every kind of R layout (a grid, a chessboard complex, random
#: least squares with dense rows and with duplicate columns), and their ids.
LAYOUT_MATRICES = [
    grid3d_least_squares(9),
    chessboard_boundary(4, 5, 2),
    random_least_squares(600, 150, density=0.02, dense_rows=3, seed=3),
    random_least_squares(500, 120, density=0.03, dense_rows=2, duplicate_cols=5, seed=4),
]
LAYOUT_IDS = ["grid9", "ch4-5-2", "rand", "rand-dup"]


@pytest.mark.parametrize("A", LAYOUT_MATRICES, ids=LAYOUT_IDS)
def test_layout_compiled_equals_numpy(lib, A, monkeypatch):
    an = analyze(A, cache=False)
    nf = an.fronts.nfronts
    plans = [[(0, nf - 1)]]
    if nf > 3:
        plans.append([(0, nf // 2), (nf // 2 + 1, nf - 1)])
    monkeypatch.setenv(native.ENV, "numpy")
    want = rlayout.r_layout(an, cache=False)
    want_maps = [want.stage_maps(p) for p in plans]
    use_loader(monkeypatch, native, lib)
    monkeypatch.setenv(native.ENV, "c")
    monkeypatch.setattr(native, "RUNS_PER_THREAD", 64)      # several threads even here
    monkeypatch.setattr(rlayout, "COPY_PER_THREAD", 64)
    got = rlayout.r_layout(an, cache=False)
    for k in ("indptr", "indices", "src", "fbase", "r1_pos", "r1_nz", "qorder"):
        a, b = getattr(want, k), getattr(got, k)
        assert a.dtype == b.dtype, k
        np.testing.assert_array_equal(a, b, err_msg=k)
    for p, wm in zip(plans, want_maps):
        for (pa, ia), (pb, ib) in zip(wm, got.stage_maps(p)):
            assert (pa is None) == (pb is None)
            if pa is not None:
                np.testing.assert_array_equal(pa, pb)
            assert ia.dtype == ib.dtype
            np.testing.assert_array_equal(ia, ib)
    ind, ptr = got.pattern_copy()
    np.testing.assert_array_equal(ind, want.indices)
    np.testing.assert_array_equal(ptr, want.indptr)
    assert ind.flags.writeable and not np.shares_memory(ind, got.indices)


def test_parallel_copy_is_a_copy(monkeypatch):
    monkeypatch.setattr(rlayout, "COPY_PER_THREAD", 10)
    a = np.arange(1001, dtype=np.int32)
    b = rlayout._copy(a)
    np.testing.assert_array_equal(a, b)
    assert b.dtype == a.dtype and not np.shares_memory(a, b)
