"""The host's sparse subspace decision: its first block from R's diagonal where the
diagonal hides the deficiency, the lanes' pieces of the compiled sweeps, and the
sweeps' rounding (the same on every machine and instruction set)."""

import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import scipy.io as sio
import scipy.sparse as sp

import scipy_gpuqr
from scipy_gpuqr._factor import host_lanes
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor import native
from scipy_gpuqr._factor import sparse_subspace as ss

MATRICES = Path(__file__).parent / "data" / "matrices"


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def _compiled():
    if not native.at_hand():
        pytest.skip("the compiled sweeps cannot be built here")
    return native.handle()


def test_hidden_deficiency_starts_with_the_diagonals_block(monkeypatch):
    """nnc1374: no pivot of R under lstsq's cutoff, 65 within ten times it, 66 singular
    values under it. The first block covers them (65 + 64 columns, at most twice 64)
    and the iteration converges in four steps, where a block of 64 grew to 128 after
    two steps and started again (six steps). Same rank."""
    _compiled()
    seen = []
    decide = _lstsq.sparse_subspace_decide

    def record(R, cutoff, diag, **kw):
        cod = decide(R, cutoff, diag, **kw)
        seen.append((cutoff, np.asarray(diag), kw["block"], cod))
        return cod

    monkeypatch.setattr(_lstsq, "sparse_subspace_decide", record)
    A = sp.csc_array(sio.mmread(str(MATRICES / "nnc1374.mtx")))
    b = np.random.default_rng([20261126, zlib.crc32(b"nnc1374")]).standard_normal(A.shape[0])
    x = scipy_gpuqr.lsqr(A, b, backend="cpu")[0]
    assert len(seen) == 1
    cutoff, diag, block, cod = seen[0]
    tol = cutoff * cod.sigma_max
    assert not np.any(diag <= tol)
    hinted = int(np.count_nonzero(diag <= ss.DIAG_HINT * tol))
    assert hinted == 65
    assert cod.rank == 1308
    assert cod.block_used == min(hinted + block, 2 * block) == 128
    assert cod.steps == 4
    # backward error (the x of lstsq's rule is large: σ_r is 4.8 × the cutoff)
    r = b - A @ x
    assert np.linalg.norm(r) <= 1e-11 * (sp.linalg.norm(A) * np.linalg.norm(x)
                                         + np.linalg.norm(b))


class _Record(Exception):
    pass


@pytest.mark.parametrize("near, dead, first", [
    (0, 0, 64),             # nothing near the cutoff: the increment
    (30, 0, 94),            # 30 pivots within DIAG_HINT × the cutoff
    (30, 20, 104),          # twice the pivots under it is more
    (100, 0, 128),          # the hint at most doubles the block
    (500, 10, 150),         # and stops at the largest block
])
def test_first_block(monkeypatch, near, dead, first):
    """The first block: 2·(pivots ≤ cutoff) + block, or (pivots ≤ DIAG_HINT × cutoff)
    + block where more, at most twice that and the largest block; the hint never
    refuses."""
    q = 600
    R = sp.csc_array(sp.eye(q))
    diag = np.ones(q)
    diag[:near] = 0.5 * ss.DIAG_HINT * 1e-3
    diag[:dead] = 0.5e-3
    got = []

    def cod(*args, **kw):
        got.append(kw["block"])
        raise _Record

    monkeypatch.setattr(ss, "SparseSubspaceCOD", cod)
    with pytest.raises(_Record):
        ss.decide(R, 1e-3, diag, block=64, max_block=150, sigma_max=1.0)
    assert got == [first]


def test_first_block_beyond_the_largest_is_refused():
    q = 600
    diag = np.ones(q)
    diag[:19] = 1e-4                  # 2·19 + 64 = 102 > 100
    assert ss.decide(sp.csc_array(sp.eye(q)), 1e-3, diag, block=64, max_block=100,
                     sigma_max=1.0) is None


@pytest.mark.parametrize("rows, columns, pieces", [
    (4000, 1, 1), (4000, 8, 1), (4000, 16, 1), (4000, 17, 2), (4000, 64, 4), (4000, 129, 8),
    (4000, 300, 8),
    (1374, 129, 4),         # short blocks: pieces up to PIECE_BYTES
    (100, 300, 1),
])
def test_compiled_sweeps_pieces(rows, columns, pieces):
    """Without a chunk the lanes cut a block into PIECES_PER_LANE pieces per lane of at
    least MIN_COLUMNS_PER_PIECE columns (a probe's eight columns go out in one call),
    short blocks into pieces of up to PIECE_BYTES."""
    calls = []

    def solve(C):
        calls.append(C.shape[1])
        return 2.0 * C

    C = np.arange(float(rows * columns)).reshape(rows, columns)
    with ThreadPoolExecutor(2) as pool:
        out = host_lanes.Lanes(pool, 2).columns(solve)(C)
    assert len(calls) == pieces
    assert sum(calls) == columns
    np.testing.assert_array_equal(out, 2.0 * C)


def _plain(R: sp.csc_array, C: np.ndarray, trans: bool) -> np.ndarray:
    """The sweeps' operations in their order, one NumPy row operation at a time."""
    q = R.shape[0]
    X = np.array(C, dtype=np.float64, copy=True)
    d = R.diagonal()
    cols = [(R.indices[R.indptr[j]:R.indptr[j + 1]], R.data[R.indptr[j]:R.indptr[j + 1]])
            for j in range(q)]
    if not trans:
        for j in range(q - 1, -1, -1):
            X[j] /= d[j]
            for i, r in zip(*cols[j]):
                if i < j:
                    X[i] -= r * X[j]
    else:
        for j in range(q):
            for i, r in zip(*cols[j]):
                if i < j:
                    X[j] -= r * X[i]
            X[j] /= d[j]
    return X


@pytest.mark.parametrize("k", [1, 3, 13, 40])
@pytest.mark.parametrize("trans", [False, True])
def test_compiled_sweeps_round_like_the_plain_loops(rng, k, trans):
    """Bit for bit the plain order of operations, whatever vector width the loaded
    library runs (its columns are independent; no fused multiply-adds)."""
    lib = _compiled()
    q = 60
    T = sp.random(q, q, density=0.2, random_state=7, format="csc")
    R = sp.csc_array(sp.triu(T, 1) + sp.diags(rng.uniform(0.5, 2.0, q)))
    C = rng.standard_normal((q, k))
    S = native.SparseUpperSolves(lib, R)
    got = S.solve_t(C) if trans else S.solve(C)
    np.testing.assert_array_equal(got, _plain(R, C, trans))
