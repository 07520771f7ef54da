"""The launch schedule of the blocked tensor-core LU (``_rows_lu`` with
``mma=True``) on the CPU: every kernel and GEMM it launches replaced by a
NumPy model of what the kernel's header says it does, the driver run as is.

What this checks without a GPU: the order of the launches, their grids and
column ranges (the panels' moves outside the panel by ``rows_swap`` from
``c_lo``, the first panel's moves as ``rows_copy_perm`` from the input, the
earlier blocks' L columns by ``rows_swap_left`` at the end), give LAPACK's
pivots and factors for every column block. The kernels themselves are
checked against LAPACK on a GPU (``tests/test_batched_blocked_gpu.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl


def _panel(grid, block, args, shared_mem=0):
    """getrf_mma_rows: the panel's LU (LAPACK's order), its rows written in
    their final order, the moves listed as (source, destination) pairs."""
    src, dst, piv, info, n, k0, moves = args
    n, k0 = int(n), int(k0)
    nb = min(32, n - k0)
    assert grid == (src.shape[0],) and block == (32 * -(-(n - k0) // 64),)
    for b in range(src.shape[0]):
        m = src[b, k0:, k0:k0 + nb].copy()
        lab = np.arange(n - k0)
        for k in range(nb):
            p = k + int(np.argmax(np.abs(m[k:, k])))
            piv[b, k0 + k] = k0 + p
            m[[k, p]] = m[[p, k]]
            lab[[k, p]] = lab[[p, k]]
            if m[k, k] != 0:
                m[k + 1:, k] /= m[k, k]
                m[k + 1:, k + 1:] -= np.outer(m[k + 1:, k], m[k, k + 1:])
        dst[b, k0:, k0:k0 + nb] = m
        pairs = [(s, d) for d, s in enumerate(lab) if s != d]
        moves[b] = -99                         # beyond the count: never read
        moves[b, 0] = len(pairs)
        for e, (s, d) in enumerate(pairs):
            moves[b, 1 + 2 * e], moves[b, 2 + 2 * e] = s, d
        info[b] = 0


def _move_pairs(moves, b, k0):
    cnt = moves[b, 0]
    return k0 + moves[b, 1:1 + 2 * cnt:2], k0 + moves[b, 2:2 + 2 * cnt:2]


def _rows_swap(grid, block, args, shared_mem=0):
    """rows_swap: the moves in columns [c_lo, k0) and [k0 + nb, n)."""
    a, moves, n, k0, nb, c_lo = (int(x) if isinstance(x, np.integer) else x for x in args)
    cols = [c for c in range(c_lo, n) if not k0 <= c < k0 + nb]
    assert grid == (a.shape[0], -(-len(cols) // 64)) and block == (256,)
    for b in range(a.shape[0]):
        s, d = _move_pairs(moves, b, k0)
        a[b][np.ix_(d, cols)] = a[b][np.ix_(s, cols)].copy()


def _rows_copy_perm(grid, block, args, shared_mem=0):
    """rows_copy_perm: dst's columns [nb, n) are src's rows in the panel's order."""
    src, dst, moves, n, nb = args
    n, nb = int(n), int(nb)
    assert grid == (src.shape[0], -(-n // 64)) and block == (256,)
    for b in range(src.shape[0]):
        s, d = _move_pairs(moves, b, 0)
        frm = np.arange(n)
        frm[d] = s
        dst[b, :, nb:] = src[b][frm, nb:]


def _rows_swap_left(grid, block, args, shared_mem=0):
    """rows_swap_left: block y's L columns get the pivots from (y + 1) outer on."""
    a, piv, n, outer, stage = args
    n, outer, stage = int(n), int(outer), int(stage)
    assert grid == (a.shape[0], -(-n // outer) - 1) and block == (256,)
    assert stage >= 8 * (n - outer) and shared_mem == 8 * stage
    for b in range(a.shape[0]):
        for y in range(grid[1]):
            kb, r0 = y * outer, (y + 1) * outer
            frm = np.arange(n)
            for k in range(r0, n):
                q = piv[b, k]
                frm[[k, q]] = frm[[q, k]]
            a[b, r0:, kb:r0] = a[b][frm[r0:], kb:r0]


def _trsm_lunit(grid, block, args, shared_mem=0):
    """trsm_lunit: rows [r0, r0 + nb) right of c0 solved with the unit L11."""
    lu, _info, n, r0, nb, c0 = (int(x) if isinstance(x, np.integer) else x for x in args)
    for b in range(lu.shape[0]):
        ell = np.tril(lu[b, r0:r0 + nb, r0:r0 + nb], -1) + np.eye(nb)
        lu[b, r0:r0 + nb, c0:] = sl.solve_triangular(ell, lu[b, r0:r0 + nb, c0:],
                                                     lower=True, unit_diagonal=True)


def _gemm_rows(a, n, r0, nr, c0, nc, kk, k, handle=None):
    if nr > 0 and nc > 0 and k > 0:
        a[:, r0:r0 + nr, c0:c0 + nc] -= a[:, r0:r0 + nr, kk:kk + k] @ a[:, kk:kk + k, c0:c0 + nc]


class _Stream:
    """A stream of _rows_lu's parts: which part's launches run inside it."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def record(self):
        return self.name

    def wait_event(self, event):
        self.log.append(("wait", self.name, event))

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, *exc):
        return False


class _Launch:
    def __init__(self, fn, log, name):
        self.fn, self.log, self.name = fn, log, name
        self.max_dynamic_shared_size_bytes = 1 << 20

    def __call__(self, *args, **kwargs):
        self.log.append(self.name)
        return self.fn(*args, **kwargs)


@pytest.fixture
def emulated(monkeypatch):
    from scipy_gpuqr.batched import _gpu_blocked as bb
    from scipy_gpuqr.batched import _kernel_registry as kr
    log = []
    models = {kr.MMA_ROWS_NAME: _panel, kr.MMA_SWAP_NAME: _rows_swap,
              kr.MMA_COPY_NAME: _rows_copy_perm, kr.MMA_LEFT_NAME: _rows_swap_left}
    monkeypatch.setattr(bb, "_mma64_function",
                        lambda dev, name=kr.MMA64_NAME: _Launch(models[name], log, name))
    monkeypatch.setattr(bb, "_rows_function",
                        lambda kernel, *a: _Launch(_trsm_lunit, log, kernel))
    monkeypatch.setattr(bb, "_gemm_rows", _gemm_rows)
    monkeypatch.setattr(bb, "device_id", lambda: 0)
    monkeypatch.setattr(bb, "_current_stream", lambda: _Stream(log, "main"))
    monkeypatch.setattr(bb, "_lanes", lambda dev, count: tuple(
        (_Stream(log, f"s{i}"), f"h{i}") for i in range(count)))
    monkeypatch.setattr(bb._common, "alloc",
                        lambda shape, dtype: np.full(shape, -7, dtype))
    return bb, log


@pytest.mark.parametrize("n,outer", [(n, o) for n in (65, 130, 300)
                                     for o in (32, 64, 128, 256, None)] + [(300, 96), (128, None), (512, None)])
@pytest.mark.parametrize("scheme", ["from a", "in place", "L every panel"])
def test_mma_schedule_matches_lapack(emulated, n, outer, scheme):
    bb, log = emulated
    rng = np.random.default_rng(n + (outer or 0))
    a = rng.standard_normal((2, n, n))
    a[1] = np.round(3 * a[1])                           # ties
    piv = np.full((2, n), -7, np.int32)
    info = np.full(2, -7, np.int32)
    if scheme == "from a":
        lu = np.full_like(a, np.nan)
        src = a.copy()
        bb._rows_lu(lu, piv, info, True, outer, src=src, streams=1)
        np.testing.assert_array_equal(src, a)
    else:
        lu = a.copy()
        bb._rows_lu(lu, piv, info, True, outer, defer_left=scheme == "in place", streams=1)
    for b in range(2):
        ref_lu, ref_piv = sl.lu_factor(a[b])
        np.testing.assert_array_equal(piv[b], ref_piv)
        np.testing.assert_allclose(lu[b], ref_lu, rtol=0, atol=1e-9 * np.abs(ref_lu).max())
    from scipy_gpuqr.batched import _kernel_registry as kr
    blocks = -(-n // (outer or bb.rows_outer(n)))
    assert log.count(kr.MMA_ROWS_NAME) == -(-n // 32)
    assert log.count(kr.MMA_COPY_NAME) == (scheme == "from a")
    assert log.count(kr.MMA_LEFT_NAME) == (scheme != "L every panel" and blocks > 1)


@pytest.mark.parametrize("n,outer", [(130, 64), (300, None), (512, None)])
@pytest.mark.parametrize("streams", [2, 3, 5])
def test_mma_schedule_in_parts_matches_lapack(emulated, n, outer, streams):
    """The batch in parts on streams of their own: each part's launches in
    its own stream, every stream after the caller's start event, the caller's
    stream after every part's last launch; LAPACK's pivots and factors for
    every matrix (parts of unequal size; more parts than matrices)."""
    bb, log = emulated
    rng = np.random.default_rng(n + streams)
    bsz = 4
    a = rng.standard_normal((bsz, n, n))
    a[1] = np.round(3 * a[1])
    piv = np.full((bsz, n), -7, np.int32)
    info = np.full(bsz, -7, np.int32)
    lu = np.full_like(a, np.nan)
    bb._rows_lu(lu, piv, info, True, outer, src=a.copy(), streams=streams)
    for b in range(bsz):
        ref_lu, ref_piv = sl.lu_factor(a[b])
        np.testing.assert_array_equal(piv[b], ref_piv)
        np.testing.assert_allclose(lu[b], ref_lu, rtol=0, atol=1e-9 * np.abs(ref_lu).max())
    from scipy_gpuqr.batched import _kernel_registry as kr
    parts = min(streams, bsz)
    names = [f"s{i}" for i in range(parts)]
    assert log.count(kr.MMA_ROWS_NAME) == parts * -(-n // 32)
    events = [e for e in log if isinstance(e, tuple)]
    assert events[:parts] == [("wait", s, "main") for s in names]
    assert events[-parts:] == [("wait", "main", s) for s in names]
    entered = [e[1] for e in events if e[0] == "enter"]
    assert entered[:2 * parts] == names + names                 # launches in turn
    assert sorted(set(entered)) == names


# ---------------------------------------------------------------------------
# the blocked inverse of n > 64 (inverse_blocks): its GEMM schedule
# ---------------------------------------------------------------------------

def _pivot_identity(piv, n):
    """pivot_identity: P of P A = L U from LAPACK's 0-based swaps."""
    perm = np.arange(n)
    for k, q in enumerate(piv):
        perm[[k, q]] = perm[[q, k]]
    return np.eye(n)[perm]


def _tri_inv_blocks(lu, n, nb):
    """tri_inv_blocks: (nblk, nb, nb) inverses of the diagonal blocks' unit
    lower and upper triangles, each padded to nb x nb with the identity."""
    nblk = -(-n // nb)
    dl, du = np.zeros((nblk, nb, nb)), np.zeros((nblk, nb, nb))
    for i in range(nblk):
        t = np.eye(nb)
        r0 = i * nb
        m = min(nb, n - r0)
        t[:m, :m] = lu[r0:r0 + m, r0:r0 + m]
        dl[i] = np.linalg.inv(np.tril(t, -1) + np.eye(nb))
        du[i] = np.linalg.inv(np.triu(t))
    return dl, du


@pytest.mark.parametrize("n,nb", [(65, 32), (96, 32), (128, 32), (129, 64), (200, 64),
                                  (256, 64), (100, 64), (64, 64)])
def test_inverse_gemm_schedule_gives_the_inverse(rng, n, nb):
    """inverse_gemms' GEMMs, run on flat per-matrix buffers as cuBLAS would
    (row-major C = alpha A B + beta C, B and C n wide, A's leading dimension
    as given), from P and the inverted diagonal triangles as the kernels'
    header describes them, give LAPACK's inverse; every read of X and Y
    is of entries written before (the buffers start as NaN)."""
    from scipy_gpuqr.batched._gpu_blocked import inverse_gemms
    a = rng.standard_normal((n, n))
    lu, piv = sl.lu_factor(a)
    dl, du = _tri_inv_blocks(lu, n, nb)
    buf = {"L": lu.ravel().copy(), "X": _pivot_identity(piv, n).ravel(),
           "Y": np.full(n * n, np.nan), "DL": dl.ravel(), "DU": du.ravel()}
    calls = 0
    for m, k, alpha, an, a_off, lda, bn, b_off, beta, cn, c_off in inverse_gemms(n, nb):
        A = np.lib.stride_tricks.as_strided(buf[an][a_off:], (m, k), (8 * lda, 8))
        B = buf[bn][b_off:b_off + k * n].reshape(k, n)
        C = buf[cn][c_off:c_off + m * n].reshape(m, n)
        assert an != cn and bn != cn
        prod = alpha * (A @ B)
        C[...] = prod if beta == 0 else prod + beta * C
        calls += 1
    nblk = -(-n // nb)
    assert calls == 4 * nblk - 2
    x = buf["X"].reshape(n, n)
    np.testing.assert_allclose(x, sl.inv(a), rtol=0,
                               atol=1e3 * n * np.finfo(float).eps * np.abs(sl.inv(a)).max())
