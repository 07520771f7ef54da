"""Rank decisions through R's triangular solves (scipy_gpuqr._factor.solve_rank), on the host.

The same code runs on the device with CuPy blocks and the GPU engine's solves
(tests/test_gpu_rank.py); here NumPy blocks and SuperLU's sweeps. Answers are
judged against numpy.linalg.lstsq (rank, minimum-norm solution).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr import QRFactorization
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor import solve_rank as _sr
from scipy_gpuqr._factor.solve_rank import (PROBE_COLUMNS, PROBE_FAILURE, NullspaceCOD,
                                            NullspaceRefused, abs_diagonal, frobenius,
                                            gaussian_block, probe_margin, probe_norm)
from scipy_gpuqr._factor.triangular import UpperTriangular
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

EPS = np.finfo(np.float64).eps


def _graded_triangle(rng, q, decades):
    U, _ = np.linalg.qr(rng.standard_normal((q, q)))
    V, _ = np.linalg.qr(rng.standard_normal((q, q)))
    return np.triu(la.qr((U * np.logspace(0, -decades, q)) @ V.T, mode="r")[0])


def test_probe_margin_meets_the_failure_bound():
    for q in (10, 4096, 64000, 10 ** 6, 10 ** 8):
        for k in (1, 2, 3):
            m = probe_margin(q, k)
            bound = (np.sqrt(q) * m ** (1 - 2 * k)) ** PROBE_COLUMNS
            assert bound == pytest.approx(PROBE_FAILURE, rel=1e-9)
    assert probe_margin(64000, 1) == pytest.approx(4500, rel=0.01)
    assert probe_margin(64000, 2) == pytest.approx(16.5, rel=0.01)


def _counted_solves(T, calls):
    """``T⁻¹·`` and ``T⁻ᵀ·`` by SciPy, each call appended to ``calls``."""
    def inv(C):
        calls.append(1)
        return la.solve_triangular(T, C)

    def inv_t(C):
        calls.append(1)
        return la.solve_triangular(T, C, trans=1)
    return inv, inv_t


@pytest.mark.parametrize("decades", [0.5, 4, 10])
def test_probe_norm_within_the_margin(rng, decades):
    """ν ≤ ‖T⁻¹‖₂ always (a Rayleigh quotient) and ≥ ‖T⁻¹‖₂/M (here far closer);
    ``accept`` stops early, with the margin of the step it stopped at."""
    T = _graded_triangle(rng, 300, decades)
    exact = 1.0 / np.linalg.svd(T, compute_uv=False)[-1]
    calls = []

    inv, inv_t = _counted_solves(T, calls)
    for seed in range(3):
        for steps in (1, 2, 3):
            calls.clear()
            nu, margin = probe_norm(inv, inv_t, 300, seed=seed, steps=steps)
            assert len(calls) == 2 * steps - 1
            assert margin == pytest.approx(probe_margin(300, steps))
            assert exact / margin <= nu <= exact * (1 + 1e-12)
        calls.clear()
        nu, margin = probe_norm(inv, inv_t, 300, seed=seed, accept=lambda n, m: True)
        assert len(calls) == 1 and margin == pytest.approx(probe_margin(300, 1))


def test_gaussian_block_is_one_block_whatever_the_threads(monkeypatch):
    """The pieces lie where the block's size puts them: one, two or eight threads
    draw the same numbers; another seed, other numbers; standard normal moments."""
    shape = (3 * _sr.DRAW_CHUNK // 40 + 7, 40)            # four pieces, the last short
    blocks = []
    for threads in (1, 2, 8):
        monkeypatch.setattr(_sr, "DRAW_THREADS", threads)
        blocks.append(gaussian_block(5, shape))
    assert all(np.array_equal(blocks[0], b) for b in blocks[1:])
    X = blocks[0]
    assert X.shape == shape and X.dtype == np.float64 and X.flags.c_contiguous
    assert abs(X.mean()) < 5e-3 and abs(X.std() - 1) < 5e-3
    flat = X.reshape(-1)
    first = np.random.Generator(np.random.PCG64(np.random.SeedSequence(5).spawn(4)[0]))
    assert np.array_equal(flat[:_sr.DRAW_CHUNK], first.standard_normal(_sr.DRAW_CHUNK))
    assert not np.array_equal(gaussian_block(6, shape)[:5], X[:5])
    assert gaussian_block(1, (0, 3)).shape == (0, 3)
    assert np.array_equal(gaussian_block(2, (9, 8)), gaussian_block(2, (9, 8)))


def test_probe_norm_zero_pivot_is_infinite():
    T = np.triu(np.ones((5, 5)))
    T[2, 2] = 0.0

    def back(M, C, lower):                  # substitution that divides by the zero
        X = np.array(C, dtype=float)
        order = range(5) if lower else range(4, -1, -1)
        for i in order:
            others = [j for j in range(5) if j != i]
            X[i] = (X[i] - M[i, others] @ X[others]) / M[i, i]
        return X
    with np.errstate(all="ignore"):
        nu, _ = probe_norm(lambda C: back(T, C, False), lambda C: back(T.T, C, True), 5)
    assert nu == np.inf


def test_abs_diagonal_fast_path_and_fallback(rng):
    R = sp.csc_array(sp.triu(sp.random_array((50, 50), density=0.2, rng=rng)) + sp.eye_array(50))
    R.sort_indices()
    assert np.array_equal(abs_diagonal(R), np.abs(R.diagonal()))
    # unsorted rows in a column: the last entry is not the diagonal
    Ru = R.copy()
    j = 10
    a, b = Ru.indptr[j], Ru.indptr[j + 1]
    Ru.indices[a:b] = Ru.indices[a:b][::-1]
    Ru.data[a:b] = Ru.data[a:b][::-1]
    assert np.array_equal(abs_diagonal(Ru), np.abs(R.diagonal()))
    # a column without its diagonal entry
    D = R.toarray()
    D[7, 7] = 0.0
    Rz = sp.csc_array(D)
    assert np.array_equal(abs_diagonal(Rz), np.abs(D.diagonal()))
    assert frobenius(R) == pytest.approx(np.linalg.norm(R.toarray()), rel=1e-14)


def _chess_r(shape):
    A = chessboard_boundary(*shape)
    F = QRFactorization(A, backend="cpu")
    return A, F._core.num, sp.csc_array(F._core.num.R)


def _chess_cod(transposed):
    """The null-space COD's inputs for a 1200×300 chessboard's R (rank 271) and the
    host path's decision: ``(q, up, upt, dead, tol, host)``."""
    A, num, R = _chess_r((5, 6, 2))
    q = R.shape[0]
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    d = abs_diagonal(R)
    dead = int(np.count_nonzero(d <= cutoff * frobenius(R)))
    up, upt = UpperTriangular(R).solves()
    tol = (cutoff * d.max(), cutoff * frobenius(R))
    return q, up, upt, dead, tol, NullspaceCOD(up, upt, q, dead, tol, transposed=transposed)


@pytest.mark.parametrize("transposed", [False, True])
def test_nullspace_cod_is_lstsq_on_exact_dependencies(rng, transposed):
    A, num, R = _chess_r((5, 6, 2))                     # 1200×300, rank 271
    q = R.shape[0]
    Rd = R.toarray()
    smax = np.linalg.norm(Rd, 2)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    d = abs_diagonal(R)
    dead = int(np.count_nonzero(d <= cutoff * frobenius(R)))
    tri = UpperTriangular(R)
    up, upt = tri.solves()
    cod = NullspaceCOD(up, upt, q, dead, (cutoff * d.max(), cutoff * frobenius(R)),
                       transposed=transposed)
    assert cod.rank == 271 == np.linalg.matrix_rank(A.toarray())
    assert cod.certain() and cod.holds(cutoff * smax)
    s = np.linalg.svd(Rd, compute_uv=False)
    assert s[cod.rank - 1] * (1 - 1e-9) <= cod.sigma_min <= cod.margin * s[cod.rank - 1]
    assert cod.residual <= 0.5 * cutoff * smax
    C = rng.standard_normal((q, 3))
    G = Rd.T if transposed else Rd
    Y = cod.solve(C)
    Yref = np.linalg.lstsq(G, C, rcond=cutoff)[0]
    assert np.linalg.norm(Y - Yref) <= 1e-10 * np.linalg.norm(Yref)


def test_nullspace_cod_refuses_without_a_gap(rng):
    """Singular values logspace(0, -14): no gap at the cutoff, the checks refuse."""
    T = _graded_triangle(rng, 200, 14)
    R = sp.csc_array(T)
    cutoff = 200 * EPS
    d = abs_diagonal(R)
    dead = max(1, int(np.count_nonzero(d <= cutoff * frobenius(R))))
    up, upt = UpperTriangular(R).solves()
    with pytest.raises(NullspaceRefused):
        NullspaceCOD(up, upt, 200, dead, (cutoff * d.max(), cutoff * frobenius(R)))


def test_norm2_upper_bounds_the_two_norm(rng):
    """The Gram bound is above ``‖X‖₂`` and, for columns in many directions,
    well below ``‖X‖_F``; a non-finite Gram gives no bound."""
    for q, d in ((2000, 30), (500, 1), (300, 200)):
        X = rng.standard_normal((q, d)) * 1e-14
        fro = np.linalg.norm(X)
        bound = _sr.norm2_upper(X.T @ X, fro)
        assert np.linalg.norm(X, 2) <= bound <= fro * (1 + 1e-3)
        if d >= 30:
            assert bound <= 0.5 * fro
    assert _sr.norm2_upper(np.full((2, 2), np.nan), 1.0) == np.inf


def test_nullspace_residual_two_norm_where_frobenius_does_not_decide():
    """A cutoff range whose lower end lies between ``‖R V_d‖₂`` and ``‖R V_d‖_F``:
    the Frobenius bound alone would not decide for every cutoff; the 2-norm from
    the Gram matrix does, and it still bounds ``‖R V_d‖₂``."""
    q, up, upt, dead, (lo, hi), host = _chess_cod(False)
    assert host.certain()                       # decided by Frobenius alone
    Z = upt(_sr.gaussian_block(host.seed, (q, dead)))   # the block COD's own R V_d
    U, _ = la.qr(Z / np.abs(Z).max(), mode="economic")
    W = _sr.gaussian_block(host.seed + 1, (q, PROBE_COLUMNS))
    W = W - U @ (U.T @ W)
    W = W - U @ (U.T @ W)
    Y = up(np.concatenate((U, W), axis=1))[:, :dead]    # solved beside the probe's start
    scale = np.abs(Y).max()
    _, Ry = la.qr(Y / scale, mode="economic")
    RV = la.solve_triangular(Ry, (U / scale).T, trans=True).T
    fro = host.residual
    assert fro == pytest.approx(np.linalg.norm(RV), rel=1e-8)
    two = np.linalg.norm(RV, 2)
    assert two < 0.5 * fro                      # 29 dead columns: room for √29
    lo_between = 2 * np.sqrt(two * fro)         # ½·lo between the two norms
    cod = NullspaceCOD(up, upt, q, dead, (lo_between, hi))
    assert two * (1 - 1e-6) <= cod.residual <= 0.5 * lo_between < fro
    assert cod.certain() and cod.rank == host.rank


@pytest.mark.parametrize("shape,wide", [((5, 6, 2), False), ((5, 6, 2), True),
                                        ((4, 6, 2), False)])
def test_solver_takes_the_nullspace_cod(rng, monkeypatch, shape, wide):
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 100)
    A = chessboard_boundary(*shape)
    if wide:
        A = sp.csc_array(A.T)
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "nullspace_cod" and dec["device"] == "cpu"
    Ad = A.toarray()
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    assert F.rank == rank
    assert np.linalg.norm(x - x_ref) <= 1e-12 * np.linalg.norm(x_ref)

    def backward(y):                    # least squares (tall) or consistent (wide)
        r = b - Ad @ y
        if wide:
            return np.linalg.norm(r) / (s[0] * np.linalg.norm(y) + np.linalg.norm(b))
        return np.linalg.norm(Ad.T @ r) / (s[0] * np.linalg.norm(r))
    # the refinement with R's residual brings it to lstsq's level
    assert backward(x) <= max(10 * backward(x_ref), 10 * EPS)


def test_solver_zero_pivot_leaves_the_nullspace_cod(rng, monkeypatch):
    """An empty column gives an exactly zero pivot: the dense rules decide."""
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 10)
    A = sp.random_array((120, 60), density=0.2, rng=rng, format="lil")
    A[:, 7] = 0.0
    A = sp.csc_array(A)
    b = rng.standard_normal(120)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    assert F.info["rank_decision"]["method"] != "nullspace_cod"
    x_ref, _, rank, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert F.rank == rank
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_full_rank_probe_confirms_a_grid(rng, monkeypatch):
    """4096 columns (beyond DENSE_LIMIT and SOLVE_RANK_MIN_ORDER): the probe decides,
    σ_max is reported as ‖R‖_F (an upper bound), σ_min as 1/ν (within the margin)."""
    A = grid3d_least_squares(16)
    b = rng.standard_normal(A.shape[0])
    seen = []

    def recorded(*args, **kwargs):
        out = probe_norm(*args, **kwargs)
        seen.append(out)
        return out
    monkeypatch.setattr(_lstsq, "probe_norm", recorded)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "triangular" and np.isnan(dec["rcond_estimate"])
    # well conditioned: one solve with the block confirms (the first step's margin)
    assert len(seen) == 1 and seen[0][1] == pytest.approx(probe_margin(4096, 1))
    # ‖A‖_F = ‖R‖_F, with frobenius_bound's rounding allowance (16 m n eps)
    assert sp.linalg.norm(A) <= dec["sigma_max"] <= sp.linalg.norm(A) * (1 + 2e-7)
    # σ_min(A) of this grid: the 7-point Laplacian's least eigenvalue over the shift
    lam = 3 * (2 - 2 * np.cos(np.pi / 17))
    smin = np.hypot(lam, 0.1)
    assert smin * (1 - 1e-9) <= dec["sigma_min"] <= probe_margin(4096, 1) * smin
    R = sp.csc_array(F._core.num.R)
    y = UpperTriangular(R).solve(np.asarray(F._core.num.qt_matmul(b[:, None]))[:R.shape[0]])
    x_ref = np.empty_like(x)
    x_ref[F.perm] = y.ravel()
    assert np.linalg.norm(x - x_ref) <= 1e-12 * np.linalg.norm(x_ref)


def test_inconclusive_probe_falls_back(rng, monkeypatch):
    """A probe that cannot confirm (forced: ν = inf) leaves the previous estimates to decide."""
    monkeypatch.setattr(_lstsq, "probe_norm", lambda *a, **k: (float("inf"), 1.0))
    A = grid3d_least_squares(16)
    F = QRFactorization(A, backend="cpu")
    F.solve(np.ones(A.shape[0]))
    dec = F.info["rank_decision"]
    assert dec["method"] == "triangular" and np.isfinite(dec["rcond_estimate"])


def test_probe_out_of_memory_falls_back(rng, monkeypatch):
    """Blocks of the probe or the null-space COD that do not fit (a GPU under a pool
    limit raises CuPy's OutOfMemoryError, a MemoryError) leave the one-column rules
    to decide, with the same answer."""
    def no_memory(*args, **kwargs):
        raise MemoryError("out of memory allocating the probe's block")

    A = grid3d_least_squares(16)
    b = rng.standard_normal(A.shape[0])
    x_ref = QRFactorization(A, backend="cpu").solve(b)
    monkeypatch.setattr(_lstsq, "probe_norm", no_memory)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "triangular" and np.isfinite(dec["rcond_estimate"])
    assert np.linalg.norm(x - x_ref) <= 1e-12 * np.linalg.norm(x_ref)

    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 100)
    monkeypatch.setattr(_lstsq, "NullspaceCOD", no_memory)
    C = chessboard_boundary(5, 6, 2)
    c = rng.standard_normal(C.shape[0])
    G = QRFactorization(C, backend="cpu")
    y = G.solve(c)
    assert G.info["rank_decision"]["method"] != "nullspace_cod"
    y_ref, _, rank, _ = np.linalg.lstsq(C.toarray(), c, rcond=None)
    assert G.rank == rank
    assert np.linalg.norm(y - y_ref) <= 1e-9 * np.linalg.norm(y_ref)


# ------------------------------------------------ the device path's block operations

def _colmajor(X, ld, rows, cols):
    """The column-major rows × cols matrix with leading dimension ``ld`` at the start
    of X's memory (a view: writes go to X), as cuBLAS reads a device pointer."""
    mem = X.ravel(order="K")
    assert np.shares_memory(mem, X)
    return np.lib.stride_tricks.as_strided(mem, shape=(rows, cols),
                                           strides=(mem.itemsize, mem.itemsize * ld))


def _graded(rng, q: int, s) -> np.ndarray:
    """A q × len(s) block with singular values ``s`` and random singular vectors
    (C order)."""
    d = len(s)
    U, _ = np.linalg.qr(rng.standard_normal((q, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return np.ascontiguousarray((U * s) @ V.T)


def _fake_device(monkeypatch):
    """A stand-in for CuPy (NumPy arrays, a module named 'cupy') and for
    ``array_ops`` (each operation by NumPy on the arrays' memory as the kernels and
    the libraries read it); returns the names of the operations called."""
    import types

    from scipy_gpuqr._factor import solve_rank as sr
    called = []

    def op(fn):
        def run(*a, **k):
            called.append(fn.__name__)
            return fn(*a, **k)
        return run

    def fresh_float64(C):
        return np.array(C, dtype=np.float64, order="C", copy=True)

    def column_norms(Y):
        return np.linalg.norm(Y, axis=0), (~np.isfinite(Y).all(axis=0)).astype(np.int32)

    def column_absmax(Y):
        fin = np.isfinite(Y)
        return np.where(fin, np.abs(Y), 0.0).max(axis=0), (~fin.all(axis=0)).astype(np.int32)

    def divide_columns(Y, d, out=None):
        assert Y.flags.c_contiguous and d.shape == (Y.shape[1],)
        return Y / d[None, :]

    def subtract_into(dst, src):
        dst -= src

    def thin_qr(X, want_r=True):
        Q, R = la.qr(np.array(X, order="F"), mode="economic")
        return np.asfortranarray(Q), (np.asfortranarray(R) if want_r else None)

    def trsm_left(A, lda, B, ldb, m, n, *, lower, trans, unit):
        a, b = _colmajor(A, lda, m, m), _colmajor(B, ldb, m, n)
        try:
            b[...] = la.solve_triangular(a.copy(), b.copy(), lower=lower,
                                         trans=1 if trans else 0, unit_diagonal=unit,
                                         check_finite=False)
        except la.LinAlgError:              # a zero pivot: cuBLAS's trsm gives non-finite values
            b[...] = np.nan

    def cholesky_upper(G):                  # potrf: the upper triangle, column-major
        n = G.shape[0]
        a = _colmajor(G, n, n, n)
        c, info = la.lapack.dpotrf(np.array(a), lower=0, clean=0)
        iu = np.triu_indices(n)
        a[iu] = c[iu]
        return int(info)

    def cholesky_upper_queued(G):           # its info as a device array, read later
        return np.array([cholesky_upper(G)], dtype=np.int32)

    def copy_into(dst, src):
        dst[...] = src

    def contiguous_copy(a, dtype=None, order="C"):
        return np.array(a, dtype=a.dtype if dtype is None else dtype, order=order, copy=True)

    def unit_triangle(src, lower, out=None, *, unit=True):
        assert out is None and not unit
        return np.ascontiguousarray(np.tril(src) if lower else np.triu(src))

    def normal_block(seed, shape):          # the host's draws: the rest compared on the
        return sr.gaussian_block(seed, shape)   # same block (the device's generator is
                                                # test_gpu_array_ops')
    fake = types.SimpleNamespace(**{f.__name__: op(f) for f in (
        fresh_float64, column_norms, column_absmax, divide_columns, subtract_into, thin_qr,
        trsm_left, cholesky_upper, cholesky_upper_queued, copy_into, contiguous_copy,
        unit_triangle, normal_block)})
    monkeypatch.setattr(sr, "array_ops", fake)
    xp = types.ModuleType("cupy")
    xp.asarray = np.asarray
    xp.empty = np.empty
    xp.broadcast_to = np.broadcast_to
    xp.cuda = _FakeCuda()
    return xp, called


class _FakeCuda:
    """A stand-in for ``cupy.cuda``'s devices, streams and events: the thread's
    current stream (the default stream, id 0, until a ``with stream:``) and the
    log ``events`` of ``(stream id, what, other stream id)``."""

    def __init__(self):
        import threading
        self._local = threading.local()
        self.events = []
        self.made = []
        cuda = self

        class Event:
            def __init__(self, stream):
                self.stream = stream

        class Stream:
            def __init__(self, non_blocking=False):
                self.non_blocking = non_blocking
                self.id = len(cuda.made) + 1
                cuda.made.append(self)

            def record(self):
                cuda.events.append((self.id, "record", None))
                return Event(self.id)

            def wait_event(self, ev):
                cuda.events.append((self.id, "wait", ev.stream))

            def __enter__(self):
                cuda._stack().append(self)
                return self

            def __exit__(self, *exc):
                cuda._stack().pop()
                return False

        class Default(Stream):
            def __init__(self):
                self.id = 0

        class Device:
            def __init__(self, id=None):
                self.id = 0 if id is None else id

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.Stream, self.Device, self._default = Stream, Device, Default()

    def _stack(self):
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def get_current_stream(self):
        stack = self._stack()
        return stack[-1] if stack else self._default


@pytest.mark.parametrize("transposed", [False, True])
def test_device_blocks_give_the_host_answers(rng, monkeypatch, transposed):
    """The device path's operations (prefetched kernels, cuSOLVER's QR and cuBLAS's
    trsm called directly, Gaussian blocks drawn on the device), each emulated by
    NumPy on the memory the device would read, give the host path's rank, estimates
    and solutions on the same draws: the same layouts as the operations they
    replace. The device's thin QRs are CholeskyQR2 (the host's Householder): the
    bases differ by rounding, ``‖R V_d‖`` (rounding noise of R's dead singular
    values) is compared with its true value for either basis."""
    q, up, upt, dead, tol, host = _chess_cod(transposed)
    xp, called = _fake_device(monkeypatch)
    dev = NullspaceCOD(up, upt, q, dead, tol, transposed=transposed, xp=xp)
    assert {"cholesky_upper", "trsm_left", "column_absmax", "subtract_into", "copy_into",
            "contiguous_copy", "unit_triangle", "normal_block"} <= set(called)
    assert "thin_qr" not in called
    assert dev.rank == host.rank == 271
    Rd = _chess_r((5, 6, 2))[2].toarray()
    for cod in (dev, host):
        for B in (cod._u, cod._v):
            assert np.linalg.norm(B.T @ B - np.eye(dead)) <= 1e-13
        # the residual is ‖R V_d‖_F up to the solves' backward error (a few ulps of R)
        assert abs(cod.residual - np.linalg.norm(Rd @ cod._v)) <= 100 * EPS * np.linalg.norm(Rd)
        assert cod.certain() and cod.residual <= 0.5 * tol[0]
    assert dev.residual == pytest.approx(host.residual, rel=1e-2)
    assert dev.nu == pytest.approx(host.nu, rel=1e-10) and dev.margin == host.margin
    C = rng.standard_normal((q, 3))
    Y, Yh = dev.solve(C), host.solve(C)
    assert np.linalg.norm(Y - Yh) <= 1e-12 * np.linalg.norm(Yh)
    # the probe alone (a graded triangle): the same draws on either side
    T = _graded_triangle(rng, 200, 4)

    def inv(C):
        return la.solve_triangular(T, C)

    def inv_t(C):
        return la.solve_triangular(T, C, trans=1)
    for s in range(2):
        assert probe_norm(inv, inv_t, 200, xp=xp, seed=s) == pytest.approx(
            probe_norm(inv, inv_t, 200, seed=s), rel=1e-12)


def test_device_blocks_refuse_non_finite_solves(monkeypatch):
    """A NaN in a solve's block (a zero pivot) is refused on the device path too."""
    T = np.triu(np.ones((6, 6))) + 5 * np.eye(6)

    def inv(C):
        return la.solve_triangular(T, C)

    def inv_nan(C):
        out = la.solve_triangular(T, C, trans=1)
        out[2, 0] = np.nan
        return out
    xp, _ = _fake_device(monkeypatch)
    with pytest.raises(NullspaceRefused, match="non-finite"):
        NullspaceCOD(inv, inv_nan, 6, 1, (1e-12, 1e-12), xp=xp)


@pytest.mark.parametrize("decades", [0, 3, 6])
def test_device_thin_qr_by_cholesky_qr2(rng, monkeypatch, decades):
    """The device's thin QR (CholeskyQR2 on the emulated cuBLAS/cuSOLVER memory):
    orthonormal Q, ``X = Q R`` with R upper triangular (read as ``right_solve``
    reads it), X kept, no Householder, for condition numbers up to 1e6; one pass
    where the first leaves Q orthonormal to working precision (condition 1),
    two otherwise, the departure measured exactly (``G − I``, G restored)."""
    xp, called = _fake_device(monkeypatch)
    blocks = _sr._DeviceBlocks(xp)
    d = 60
    X = _graded(rng, 700, np.logspace(0, -decades, d))
    X0 = X.copy()
    Q, R = blocks.orth(X)
    assert "thin_qr" not in called
    assert called.count("cholesky_upper_queued") == 1      # the first pass's potrf
    assert called.count("cholesky_upper") == (0 if decades == 0 else 1)
    assert np.array_equal(X, X0)
    assert np.linalg.norm(Q.T @ Q - np.eye(d)) <= (
        _sr.CHOLQR_ONE_PASS * d * EPS if decades == 0 else 1e-14)
    G = Q.T @ Q
    G0 = G.copy()
    departure = blocks._departure_read(*blocks._departure_queued(G, *blocks.unit_vectors(d)))
    assert departure == pytest.approx(np.linalg.norm(G0 - np.eye(d)), rel=1e-6)
    assert np.array_equal(G, G0)
    assert np.array_equal(R, np.triu(R)) and np.all(np.diag(R) > 0)
    assert np.linalg.norm(Q @ R - X) <= 1e-14 * np.linalg.norm(X)
    # R as right_solve reads it: X R⁻¹ = Q
    assert np.linalg.norm(blocks.right_solve(X.copy(), R) - Q) <= 1e-14 * 10 ** decades
    Q2, none = blocks.orth(X, want_r=False)
    assert none is None and np.array_equal(Q2, Q)


@pytest.mark.parametrize("how", ["cholesky fails", "departure", "rank-deficient",
                                 "not finite"])
def test_device_thin_qr_falls_back_to_householder(rng, monkeypatch, how):
    """Where CholeskyQR2 would not be accurate (the Gram's Cholesky fails, or the
    first pass leaves ``‖Q₁ᵀQ₁ − I‖_F`` above CHOLQR_MAX_DEPARTURE) the device's
    thin QR is Householder's, the same as ``thin_qr`` alone."""
    xp, called = _fake_device(monkeypatch)
    blocks = _sr._DeviceBlocks(xp)
    q, d = 500, 40
    s = np.logspace(0, -8.5 if how == "departure" else -11, d)
    if how == "rank-deficient":
        s[-5:] = 0.0
    X = _graded(rng, q, s)
    if how == "not finite":
        X = rng.standard_normal((q, d))
        X[3, 7] = np.inf
    with np.errstate(all="ignore"):
        got = blocks.orth_queued(X, blocks.unit_vectors(d), both=False)
        if how == "not finite":     # (the emulated Householder QR checks finiteness)
            with pytest.raises(ValueError, match="infs or NaNs"):
                got.result()
            assert "thin_qr" in called
            return
        got.result()
    assert "thin_qr" in called
    if how == "departure":      # the first pass ran, its Q₁ too far from orthonormal
        assert called.count("cholesky_upper_queued") == called.count("trsm_left") == 1
        assert "cholesky_upper" not in called
    called.clear()
    Q, R = blocks.orth(X)
    assert "thin_qr" in called
    if how in ("cholesky fails", "departure"):
        assert np.linalg.norm(Q.T @ Q - np.eye(d)) <= 1e-13
        assert np.linalg.norm(Q @ R - X) <= 1e-14


def test_probe_norm_from_a_given_first_step(rng):
    """A start block and its image given (solved by the caller with other columns):
    the same estimate as the probe that draws and applies them itself, one
    application fewer."""
    T = _graded_triangle(rng, 300, 6)
    calls = []

    inv, inv_t = _counted_solves(T, calls)
    for steps in (1, 2, 3):
        calls.clear()
        ref = probe_norm(inv, inv_t, 300, seed=4, steps=steps)
        assert len(calls) == 2 * steps - 1
        W = gaussian_block(4, (300, PROBE_COLUMNS))
        image = la.solve_triangular(T, W, trans=1)
        calls.clear()
        got = probe_norm(inv, inv_t, 300, steps=steps, start=(W, image))
        assert len(calls) == 2 * steps - 2
        assert got[0] == pytest.approx(ref[0], rel=1e-12) and got[1] == ref[1]
    with pytest.raises(ValueError):
        probe_norm(inv, inv_t, 300, start=(W[:, :3], image[:, :3]))


@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [False, True])
def test_device_blocks_on_a_gpu_give_the_host_answers(rng, monkeypatch, transposed):
    """With CuPy blocks (the solves: the host's, their results uploaded) the
    null-space COD's rank, estimates and solutions are the host path's, to
    rounding (cuSOLVER's QR and cuBLAS's products in place of LAPACK's), on the
    host's draws; on the device's own draws the rank, the certainty and the
    solutions are the same, ν (a randomized estimate) within its margin."""
    cp = pytest.importorskip("cupy")
    q, up, upt, dead, tol, host = _chess_cod(transposed)

    def dev_up(C):
        return cp.asarray(up(cp.asnumpy(C)))

    def dev_upt(C):
        return cp.asarray(upt(cp.asnumpy(C)))
    own = NullspaceCOD(dev_up, dev_upt, q, dead, tol, transposed=transposed, xp=cp)
    with monkeypatch.context() as mp:
        mp.setattr(_sr._DeviceBlocks, "gaussian",
                   staticmethod(lambda seed, shape: cp.asarray(_sr.gaussian_block(seed, shape))))
        dev = NullspaceCOD(dev_up, dev_upt, q, dead, tol, transposed=transposed, xp=cp)
    assert isinstance(dev._u, cp.ndarray) and isinstance(dev._v, cp.ndarray)
    assert dev.rank == own.rank == host.rank == 271
    assert dev.certain() and own.certain() and host.certain()
    # ‖R V_d‖ is rounding noise on either side; ν = ‖S‖ (the same draws) is not
    assert dev.residual <= 0.5 * tol[0] and own.residual <= 0.5 * tol[0]
    assert dev.nu == pytest.approx(host.nu, rel=1e-3)
    s_kept = np.linalg.svd(_chess_r((5, 6, 2))[2].toarray(), compute_uv=False)[270]
    assert own.nu <= (1 + 1e-9) / s_kept <= own.nu * own.margin
    C = rng.standard_normal((q, 3))
    Y, Yh, Yo = dev.solve(C), host.solve(C), own.solve(C)
    assert isinstance(Y, np.ndarray)
    assert np.linalg.norm(Yo - Yh) <= 1e-9 * np.linalg.norm(Yh)
    assert np.linalg.norm(Y - Yh) <= 1e-9 * np.linalg.norm(Yh)


@pytest.mark.parametrize("device,transposed", [(False, False), (True, False), (False, True)])
def test_nullspace_cod_solves_the_given_rhs_with_its_blocks(rng, monkeypatch, device, transposed):
    """``rhs`` (G = R): its ``R⁻¹ P_U C`` comes with the decision's solve with
    ``R⁻¹`` (one solve with R in all, the same as without), and the first solve
    of C uses it: no solve of its own without refinement, one with it; the
    answers equal those of a COD without ``rhs``; another C, or C again, is
    solved afresh. For G = Rᵀ (solves start with ``R⁻ᵀ``) ``rhs`` is not asked."""
    q, up, upt, dead, tol, host = _chess_cod(transposed)
    xp = np
    if device:
        xp, _ = _fake_device(monkeypatch)
    calls = []

    def inv(C):
        calls.append(("inv", C.shape[1]))
        return up(C)

    def inv_t(C):
        calls.append(("inv_t", C.shape[1]))
        return upt(C)
    C = rng.standard_normal((q, 2))
    asked = []

    def rhs():
        asked.append(1)
        calls.append(("rhs",))
        return C
    plain = NullspaceCOD(up, upt, q, dead, tol, transposed=transposed, xp=xp)
    cod = NullspaceCOD(inv, inv_t, q, dead, tol, transposed=transposed, xp=xp, rhs=rhs)
    assert cod.rhs is None and cod.rank == plain.rank == 271
    if transposed:
        assert not asked and cod._first is None
        return
    assert asked == [1]
    # C asked for before any solve with R (a staged GPU factorization's Qᵀ reads
    # the stage sent up as it ended before R's rows take the device's room)
    assert calls == [("rhs",), ("inv_t", dead), ("inv", dead + PROBE_COLUMNS + 2)]
    G = _chess_r((5, 6, 2))[2]
    ref = plain.solve(C, matmul=lambda Y: G @ Y)
    calls.clear()
    Y = cod.solve(C, matmul=lambda Y: G @ Y)
    assert calls == [("inv", 2)]                    # the refinement's solve only
    assert np.linalg.norm(Y - ref) <= 1e-12 * np.linalg.norm(ref)
    calls.clear()
    Y2 = cod.solve(C)                               # again: solved afresh
    assert calls == [("inv", 2)]
    assert np.linalg.norm(Y2 - plain.solve(C)) <= 1e-12 * np.linalg.norm(Y2)
    # a different block of the same shape is not taken for the given one
    cod2 = NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=rhs)
    calls.clear()
    D = C + 1.0
    assert np.linalg.norm(cod2.solve(D) - plain.solve(D)) <= 1e-12 * np.linalg.norm(plain.solve(D))
    assert calls == [("inv", 2)]


def test_nullspace_cod_takes_its_upper_cutoff_late(rng):
    """``tol_range``'s hi given as a callable: called once, after the first solve,
    its value kept; one that raises NullspaceRefused refuses."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    order = []

    def upt_logged(C):
        order.append("solve")
        return upt(C)

    def hi():
        order.append("hi")
        return tol[1]
    cod = NullspaceCOD(up, upt_logged, q, dead, (tol[0], hi))
    assert order == ["solve", "hi"] and cod.tol_range == tol
    assert cod.rank == host.rank and cod.certain() == host.certain()

    def refuse():
        raise NullspaceRefused("pivots between the cutoff's bounds")
    with pytest.raises(NullspaceRefused, match="between"):
        NullspaceCOD(up, upt, q, dead, (tol[0], refuse))


def test_solver_upper_cutoff_computed_aside(monkeypatch):
    """MinNormSolver's late upper cutoff: ``cutoff·‖R‖_F`` from the worker's pass,
    refused where a pivot lies between the bounds (the dead count taken with the
    lower one differs), and no pass left running once the decision is made."""
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 100)
    A, num, R = _chess_r((5, 6, 2))
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    s = _lstsq.MinNormSolver(R, cutoff)
    assert s.method == "nullspace_cod" and s._fro_pending is None
    assert s._fro == pytest.approx(frobenius(R), rel=1e-15)
    s._fro = None
    d = abs_diagonal(R)
    dead = int(np.count_nonzero(d <= cutoff * d.max()))
    hi = s._late_upper_cutoff(d, dead)
    assert s._fro_pending is not None
    assert hi() == pytest.approx(cutoff * frobenius(R), rel=1e-15)
    assert s._fro_pending is None
    between = d.copy()
    between[0] = 0.5 * (cutoff * d.max() + cutoff * frobenius(R))     # one more under hi
    with pytest.raises(NullspaceRefused):
        s._late_upper_cutoff(between, dead)()


def test_least_squares_takes_qtb_into_the_decision(rng, monkeypatch):
    """A tall rank-deficient ``QRFactorization.solve`` on the host: the decision's
    solve with ``R⁻¹`` takes Qᵀb (computed once), the solution's first step needs no
    solve with R of its own; lstsq's rank and minimum-norm answer."""
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 100)
    A = chessboard_boundary(5, 6, 2)
    b = rng.standard_normal(A.shape[0])
    widths = []
    qt = []
    orig_ops = _lstsq.MinNormSolver._solve_ops

    def ops(self):
        up, upt, xp = orig_ops(self)

        def counted(C):
            widths.append(C.shape[1])
            return up(C)
        return counted, upt, xp
    monkeypatch.setattr(_lstsq.MinNormSolver, "_solve_ops", ops)
    F = QRFactorization(A, backend="cpu")
    orig_qt = type(F._core.num).qt_matmul

    def qt_matmul(self, B):
        qt.append(B.shape)
        return orig_qt(self, B)
    monkeypatch.setattr(type(F._core.num), "qt_matmul", qt_matmul)
    x = F.solve(b)
    assert F.info["rank_decision"]["method"] == "nullspace_cod"
    q = A.shape[1]
    dead = q - F.rank
    assert widths[0] == dead + PROBE_COLUMNS + 1       # U, the probe's W, Qᵀb
    assert widths[1:] == [1]                           # the refinement's solve
    assert len(qt) == 1 and F._core._qtb is None
    x_ref, _, rank, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert F.rank == rank
    assert np.linalg.norm(x - x_ref) <= 1e-12 * np.linalg.norm(x_ref)


def test_nullspace_cod_leaves_many_rhs_to_the_solve(rng):
    """Over RHS_MAX_COLUMNS right-hand sides: not taken into the decision's solve
    (its blocks stay q × (d + 8 + p)); the first solve solves them itself."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    widths = []

    def inv(C):
        widths.append(C.shape[1])
        return up(C)
    C = rng.standard_normal((q, _sr.RHS_MAX_COLUMNS + 1))
    cod = NullspaceCOD(inv, upt, q, dead, tol, rhs=lambda: C)
    assert widths == [dead + PROBE_COLUMNS] and cod._first is None
    assert np.linalg.norm(cod.solve(C) - host.solve(C)) <= 1e-12 * np.linalg.norm(host.solve(C))


def test_frobenius_bound_covers_r_of_every_backend(rng):
    """‖M‖_F with the rounding allowance bounds ‖R‖_F of M's QR from above, and by
    little: tall, wide (Aᵀ factored), damped, a dead column; duplicates not summed
    give no bound."""
    from scipy_gpuqr._factor.lstsq import frobenius_bound
    A = sp.random(300, 80, density=0.05, random_state=3, format="csc") + sp.eye(300, 80)
    keep = np.ones(80)
    keep[5] = 0.0                           # a dead column
    A = sp.csc_array(A @ sp.diags(keep))
    A.eliminate_zeros()
    for M in (A, A.T, sp.vstack([A, 0.3 * sp.eye(80)])):
        M = sp.csc_array(M)
        F = QRFactorization(M, backend="cpu")
        fro = _sr.frobenius(sp.csc_array(F._core.num.R))
        bound = frobenius_bound(F._core.M)
        assert fro <= bound <= fro * (1 + 1e-6)
    dup = sp.csc_array((np.ones(3), np.array([0, 0, 1]), np.array([0, 2, 3])), shape=(2, 2))
    dup.has_canonical_format = False
    assert frobenius_bound(dup) is None


def test_frobenius_bound_spares_the_pass_over_r(monkeypatch, rng):
    """The rank decision of a factorization takes ‖R‖_F from the factored matrix:
    no pass over R's values, the same decision as with that pass."""
    A = grid3d_least_squares(16)
    b = rng.standard_normal(A.shape[0])
    x_ref = QRFactorization(A, backend="cpu").solve(b)

    def no_pass(R):
        raise AssertionError("a pass over R's values")
    monkeypatch.setattr(_lstsq, "frobenius", no_pass)
    F = QRFactorization(A, backend="cpu")
    x = F.solve(b)
    assert F.info["rank_decision"]["method"] == "triangular"
    assert np.array_equal(x, x_ref)


def test_host_norms_equal_numpys_without_its_blas(monkeypatch):
    """norm2 / frobenius_norm agree with NumPy's norms to rounding, and never reach
    NumPy's dot (the BLAS whose worker threads would spin after it)."""
    from scipy_gpuqr._factor import host_norms
    rng = np.random.default_rng(5)
    x = rng.standard_normal(50_001) * np.exp(rng.uniform(-30, 30, 50_001))
    M = sp.random(400, 300, density=0.05, random_state=1, format="csc")
    expected = (np.linalg.norm(x), np.linalg.norm(x[::7]), sp.linalg.norm(M), np.linalg.norm(M.toarray()))

    def no_blas(*args, **kwargs):
        raise AssertionError("NumPy's BLAS dot")
    monkeypatch.setattr(np, "dot", no_blas)
    monkeypatch.setattr(np.linalg, "norm", no_blas)
    got = (host_norms.norm2(x), host_norms.norm2(x[::7]), host_norms.frobenius_norm(M),
           host_norms.frobenius_norm(M.toarray()))
    for g, e in zip(got, expected):
        assert g == pytest.approx(e, rel=1e-14)
    assert host_norms.norm2(np.zeros(0)) == 0.0


def test_probe_from_a_given_start_decides_as_the_probe_alone(rng):
    """MinNormSolver's probe_start (Ω, R⁻¹Ω), formed with the caller's solve: the
    probe runs on R⁻ᵀ from that image, applies no solve for its first step, and
    confirms full rank with a ν of ‖R⁻¹‖₂'s size, as the probe alone does."""
    A = grid3d_least_squares(16)
    F = QRFactorization(A, backend="cpu")
    R = sp.csc_array(F._core.num.R)
    q = R.shape[0]
    tri = UpperTriangular(R)
    calls = []

    def counted(which):
        def solve(C):
            calls.append(which)
            return tri.solves()[0 if which == "up" else 1](C)
        return solve
    omega = _sr.gaussian_block(0, (q, PROBE_COLUMNS))
    start = (omega, tri.solves()[0](omega))
    alone = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape), solves=(counted("up"), counted("upt")))
    n_alone = len(calls)
    del calls[:]
    given = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape), probe_start=start,
                                 solves=(counted("up"), counted("upt")))
    assert alone.method == given.method == "triangular" and alone.rank == given.rank == q
    assert n_alone == 1 and calls == []          # the first step's solve was given
    assert given.probe_start is None
    assert given.sigma_min == pytest.approx(alone.sigma_min, rel=0.5)



def _on_streams(cuda, up, upt, C):
    """``(calls, inv, inv_t, rhs)``: R's two solves and the host block ``C``, each call
    recorded with the stream it ran on (the fake device's ``cuda``)."""
    calls = []

    def inv_t(X):
        calls.append(("inv_t", cuda.get_current_stream().id))
        return upt(X)

    def inv(X):
        calls.append(("inv", cuda.get_current_stream().id))
        return up(X)

    def rhs():
        calls.append(("rhs", cuda.get_current_stream().id))
        return C
    return calls, inv, inv_t, rhs

def test_first_block_beside_the_fetch(rng, monkeypatch):
    """``rhs_beside`` on the device: ``R⁻ᵀΩ`` is queued on a non-blocking stream
    of its own (after the caller's stream's work so far), ``rhs()`` is fetched on
    the caller's stream after that solve was queued, the thin QR runs on the side
    stream and the caller's stream waits for it; the same stream serves the next
    decision; rank, residual, ν and the solutions are those of the fetch first.
    Without it, on the host, or for G = Rᵀ, ``rhs()`` comes first and no stream
    is made."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    xp, _ = _fake_device(monkeypatch)
    monkeypatch.setattr(_sr, "_SIDE_STREAMS", __import__("threading").local())
    cuda = xp.cuda
    C = rng.standard_normal((q, 2))
    calls, inv, inv_t, rhs = _on_streams(cuda, up, upt, C)
    cod = NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=rhs, rhs_beside=True)
    assert len(cuda.made) == 1 and cuda.made[0].non_blocking
    side = cuda.made[0].id
    assert calls == [("inv_t", side), ("rhs", 0), ("inv", 0)]
    assert cuda.events == [(0, "record", None), (side, "wait", 0), (side, "record", None),
                           (0, "wait", side)]
    first = NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=rhs)
    assert calls[3:] == [("rhs", 0), ("inv_t", 0), ("inv", 0)]
    again = NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=rhs, rhs_beside=True)
    assert len(cuda.made) == 1 and calls[6:] == [("inv_t", side), ("rhs", 0), ("inv", 0)]
    G = _chess_r((5, 6, 2))[2]
    for other in (first, again):
        assert other.rank == cod.rank == 271
        assert other.residual == cod.residual and other.nu == cod.nu
        np.testing.assert_array_equal(other.solve(C, matmul=lambda Y: G @ Y),
                                      cod.solve(C, matmul=lambda Y: G @ Y))
    n = len(cuda.made)
    calls.clear()
    NullspaceCOD(up, upt, q, dead, tol, rhs=rhs, rhs_beside=True)         # host blocks
    NullspaceCOD(up, inv_t, q, dead, tol, xp=xp, rhs=rhs, rhs_beside=True, transposed=True)
    assert len(cuda.made) == n and ("rhs", 0) == calls[0]


def test_queued_decision_solves_beside_the_replay(rng, monkeypatch):
    """``rhs_device`` with ``rhs_beside``: the decision's steps up to ``R V_d`` are
    queued on the side stream (``R⁻ᵀΩ``, then ``R⁻¹[U_d, P_U W]``) before the
    calling thread queues the block on its own stream (not waited for);
    ``R⁻¹ P_U C`` follows on the caller's stream once ``U_d`` is made, then the
    host copy (``rhs()``) is asked for; the caller's stream waits for the side
    stream before the probe. Rank and ν are those of the fetch first, the
    residual and the solutions to rounding (``V_d`` by two CholeskyQR passes
    always), and the first solve of C takes its columns from the decision's
    solve (no solve of its own)."""
    import threading
    q, up, upt, dead, tol, host = _chess_cod(False)
    xp, _ = _fake_device(monkeypatch)
    monkeypatch.setattr(_sr, "_SIDE_STREAMS", threading.local())
    cuda = xp.cuda
    C = rng.standard_normal((q, 2))
    calls, inv, inv_t, rhs = _on_streams(cuda, up, upt, C)
    threads = []

    def rhs_device():
        calls.append(("rhs_device", cuda.get_current_stream().id))
        threads.append(threading.get_ident())
        return C.copy()
    cod = NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=rhs, rhs_beside=True,
                       rhs_device=rhs_device)
    side = cuda.made[0].id
    assert calls == [("inv_t", side), ("inv", side), ("rhs_device", 0), ("inv", 0), ("rhs", 0)]
    assert threads == [threading.get_ident()]
    assert cuda.events == [(0, "record", None), (side, "wait", 0), (side, "record", None),
                           (0, "wait", side), (side, "record", None), (0, "wait", side)]
    assert cod.rhs_device is None and cod.rhs is None
    first = NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=rhs, rhs_beside=True)
    G = _chess_r((5, 6, 2))[2]
    assert first.rank == cod.rank == 271
    assert cod.residual == pytest.approx(first.residual, rel=1e-2)    # rounding noise
    assert cod.certain() and first.certain()
    assert cod.nu == pytest.approx(first.nu, rel=1e-10) and cod.margin == first.margin
    del calls[:]
    Y, Yf = cod.solve(C), first.solve(C)
    assert calls == []                          # both took R⁻¹ P_U C from their decision
    assert np.linalg.norm(Y - Yf) <= 1e-12 * np.linalg.norm(Yf)
    Y, Yf = (c.solve(C, matmul=lambda Y: G @ Y) for c in (cod, first))
    assert np.linalg.norm(Y - Yf) <= 1e-12 * np.linalg.norm(Yf)


@pytest.mark.parametrize("refused", [1, 3])
def test_queued_decision_takes_householder_where_cholesky_qr2_refuses(rng, monkeypatch,
                                                                      refused):
    """A queued thin QR whose Cholesky factorization fails (the ``refused``-th
    ``potrf``: U_d's first pass, or V_d's) is replaced by Householder's, as the
    synchronous steps' ``orth`` does: the decision and the solutions stand."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    xp, called = _fake_device(monkeypatch)
    monkeypatch.setattr(_sr, "_SIDE_STREAMS", __import__("threading").local())
    real = _sr.array_ops.cholesky_upper_queued
    count = []

    def failing(G):
        count.append(1)
        info = real(G)
        return np.array([1], dtype=np.int32) if len(count) == refused else info
    monkeypatch.setattr(_sr.array_ops, "cholesky_upper_queued", failing)
    C = rng.standard_normal((q, 2))
    cod = NullspaceCOD(up, upt, q, dead, tol, xp=xp, rhs=lambda: C, rhs_beside=True,
                       rhs_device=lambda: C.copy())
    assert called.count("thin_qr") == 1
    assert cod.rank == host.rank == 271 and cod.certain()
    for B in (cod._u, cod._v):
        assert np.linalg.norm(B.T @ B - np.eye(dead)) <= 1e-13
    np.testing.assert_allclose(cod.solve(C), host.solve(C), rtol=0,
                               atol=1e-12 * np.linalg.norm(host.solve(C)))


@pytest.mark.parametrize("which", ["inv_t", "inv"])
def test_queued_decision_refuses_non_finite_solves(rng, monkeypatch, which):
    """A NaN in ``R⁻ᵀΩ`` or in ``R⁻¹[U_d, P_U W]`` (a zero pivot) is refused once
    the replay is queued, as the synchronous steps refuse it."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    xp, _ = _fake_device(monkeypatch)
    monkeypatch.setattr(_sr, "_SIDE_STREAMS", __import__("threading").local())
    C = rng.standard_normal((q, 2))

    def nan(solve):
        def run(X):
            out = solve(X)
            if X.shape[1] > 2:          # not R⁻¹ P_U C's
                out[3, 0] = np.nan
            return out
        return run
    inv, inv_t = (nan(up), upt) if which == "inv" else (up, nan(upt))
    queued = []
    with pytest.raises(NullspaceRefused, match="non-finite"):
        NullspaceCOD(inv, inv_t, q, dead, tol, xp=xp, rhs=lambda: C, rhs_beside=True,
                     rhs_device=lambda: queued.append(1) or C.copy())
    assert queued == [1]


@pytest.mark.parametrize("both", [True, False])
@pytest.mark.parametrize("decades", [0, 3, 6, 14])
def test_queued_thin_qr_equals_orth(rng, monkeypatch, decades, both):
    """``orth_queued``: ``orth``'s Q and R to the bit where CholeskyQR2 takes two
    passes (conditions 1e3, 1e6), and with the second pass left to ``result()``
    (``both`` False) wherever; with both passes queued where one would do
    (condition 1), Q orthonormal and ``X = Q R`` all the same; a block CholeskyQR2
    cannot factor accurately (condition 1e14): Householder's, as ``orth``'s. X is
    kept."""
    xp, called = _fake_device(monkeypatch)
    blocks = _sr._DeviceBlocks(xp)
    d = 60
    X = _graded(rng, 700, np.logspace(0, -decades, d))
    X0 = X.copy()
    with np.errstate(all="ignore"):
        got = blocks.orth_queued(X, blocks.unit_vectors(d), both=both)
        assert np.array_equal(X, X0)
        Qg, Rg = got.result()
        Q, R = blocks.orth(X)
    assert called.count("thin_qr") == (2 if decades == 14 else 0)
    if decades or not both:
        np.testing.assert_array_equal(Qg, Q)
        np.testing.assert_array_equal(Rg, R)
    if decades == 14:
        return
    assert np.linalg.norm(Qg.T @ Qg - np.eye(d)) <= 1e-14
    assert np.linalg.norm(Qg @ Rg - X) <= 1e-14 * np.linalg.norm(X)
    assert np.array_equal(np.triu(Rg), Rg)
    Qn, none = blocks.orth_queued(X, blocks.unit_vectors(d), want_r=False, both=both).result()
    assert none is None and np.array_equal(Qn, Qg)


def test_scale_kept_on_the_device(rng, monkeypatch):
    """``scaled_by_absmax``: the block ``divided(Z, finite_absmax(Z))`` gives, to the
    bit, the same scale read back, and NaN where Z holds a NaN."""
    xp, _ = _fake_device(monkeypatch)
    blocks = _sr._DeviceBlocks(xp)
    Z = np.ascontiguousarray(rng.standard_normal((50, 7)) * np.logspace(0, 5, 7))
    X, pending, scale = blocks.scaled_by_absmax(Z)
    s = blocks.finite_absmax(Z)
    assert blocks.read_absmax(pending) == s
    np.testing.assert_array_equal(X, blocks.divided(Z, s))
    np.testing.assert_array_equal(blocks.divide_columns(Z, scale), X)
    Z[4, 2] = np.nan
    assert np.isnan(blocks.read_absmax(blocks.scaled_by_absmax(Z)[1]))


def test_queued_rhs_of_another_shape_is_not_taken(rng, monkeypatch):
    """A queued block over RHS_MAX_COLUMNS columns (or of other rows) goes into no
    solve and its host copy is not asked for; the decision is the same."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    xp, _ = _fake_device(monkeypatch)
    monkeypatch.setattr(_sr, "_SIDE_STREAMS", __import__("threading").local())
    asked, widths = [], []

    def inv(X):
        widths.append(X.shape[1])
        return up(X)
    for shape in ((q, _sr.RHS_MAX_COLUMNS + 1), (q - 1, 2)):
        C = rng.standard_normal(shape)
        cod = NullspaceCOD(inv, upt, q, dead, tol, xp=xp, rhs=lambda: asked.append(1) or C,
                           rhs_beside=True, rhs_device=lambda: C)
        assert cod.rank == 271 and cod._first is None
    assert asked == [] and widths == [dead + _sr.PROBE_COLUMNS] * 2


def test_least_squares_queues_qtb_only_for_resident_gpu_factors():
    """``FactoredQR`` gives the decision ``rhs_device`` only for GPU factors on the
    device whole with a host block's callable; ``_qt_rows`` of the same B then
    fetches the queued copy instead of applying ``Qᵀ`` again, once."""
    import types

    from scipy_gpuqr._factor.factored import FactoredQR
    F = FactoredQR.__new__(FactoredQR)
    replays = []
    C = np.arange(12.0).reshape(6, 2)

    class Queued:                   # a device array: its host copy by get()
        def get(self):
            replays.append("get")
            return C[:4].copy()
    for host_pools, given, want in (({}, True, True), ({0: None}, True, False),
                                    ({}, False, False)):
        F.num = types.SimpleNamespace(on_device=lambda: True, _host_pools=host_pools)
        got = F._device_rhs(C, (lambda: None) if given else None)
        assert (got is not None) is want
    F.num = types.SimpleNamespace(R=sp.csc_array((4, 4)), on_device=lambda: True,
                                  qt_matmul=lambda B: replays.append("replay") or B)
    B = C.copy()
    F._qtb, F._qtb_queued = None, (B, Queued())
    got = F._qt_rows(B)
    np.testing.assert_array_equal(got, C[:4])
    assert F._qt_rows(B) is got and replays == ["get"] and F._qtb_queued is None
    F._qtb, F._qtb_queued = None, (C, Queued())                # another B: replayed
    np.testing.assert_array_equal(F._qt_rows(B), C[:4])
    assert replays == ["get", "replay"]


def test_first_block_beside_refuses_as_the_fetch_first(rng, monkeypatch):
    """A non-finite ``R⁻ᵀΩ`` solved beside the fetch is refused after the fetch,
    as with the fetch first; the caller's stream is not left waiting for it."""
    q, up, upt, dead, tol, host = _chess_cod(False)
    xp, _ = _fake_device(monkeypatch)
    monkeypatch.setattr(_sr, "_SIDE_STREAMS", __import__("threading").local())
    C = rng.standard_normal((q, 2))
    asked = []

    def nan_t(X):
        return np.full_like(upt(X), np.nan)

    def rhs():
        asked.append(1)
        return C
    for beside in (True, False):
        with pytest.raises(NullspaceRefused, match="non-finite"):
            NullspaceCOD(up, nan_t, q, dead, tol, xp=xp, rhs=rhs, rhs_beside=beside)
    assert asked == [1, 1]
    assert (0, "wait", 1) not in xp.cuda.events


def test_least_squares_fetches_beside_only_resident_gpu_factors(monkeypatch):
    """``FactoredQR`` asks the decision to fetch ``Qᵀb`` beside its first block only
    for GPU factors with no stage pool on the host."""
    import types

    from scipy_gpuqr._factor.factored import FactoredQR
    F = FactoredQR.__new__(FactoredQR)
    for on_device, host_pools, want in ((True, {}, True), (True, {0: None}, False),
                                        (False, {}, False)):
        F.num = types.SimpleNamespace(on_device=lambda v=on_device: v, _host_pools=host_pools)
        assert F._resident() is want
    F.num = types.SimpleNamespace(on_device=lambda: True)        # no stage pools known
    assert F._resident() is False


@pytest.mark.parametrize("device, given, expected", [
    ("cpu", False, "cpu"), ("gpu", True, "gpu"), ("gpu", False, "cpu")])
def test_triangular_decision_names_where_r_solves_ran(rng, device, given, expected):
    """A 'triangular' decision runs no COD: its ``device`` is where R's solves ran,
    the factorization's device when it supplied them, else the host."""
    T = _graded_triangle(rng, 200, 1)
    calls = []
    solves = _counted_solves(T, calls) if given else None
    solver = _lstsq.MinNormSolver(sp.csc_array(T), _lstsq.lstsq_cutoff(200, 200),
                                  device=device, solves=solves)
    dec = solver.summary()
    assert dec["method"] == "triangular" and dec["rank"] == 200
    assert dec["device"] == expected
