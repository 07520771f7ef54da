"""The prefetched device array operations (``scipy_gpuqr._engine.gpu.array_ops``)
against the CuPy operations they replace on a GPU call's path: the same values,
bit for bit (the column norms: to rounding), and no CuPy kernel compiled on the
calling thread by a first GPU ``lsqr`` in a new process.

CPU tests: the module's declarations (what a call prefetches, the kernel names
its functions launch exist in the source).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from scipy_gpuqr import _kernels
from scipy_gpuqr._engine.gpu import array_ops as ao
from scipy_gpuqr._engine.gpu import factorize_kernels as fk

from conftest import REPO


# ---------------------------------------------------------------- CPU

def test_a_call_prefetches_the_whole_file_once():
    use = ao.array_ops_use()
    assert use.file == ao.OPS_FILE and use.declared == () and not use.cooperative
    for dt in (np.float64, np.float32):
        assert [u for u in fk.engine_kernels(dt) if u.file == ao.OPS_FILE] == [use]
    assert _kernels.variant_group(use.needed[0], use.declared) == ()


def test_every_kernel_the_functions_launch_is_in_the_source():
    src = _kernels.flatten_source(ao.OPS_FILE)
    defined = set(re.findall(r"(\w+)_##SUF", src))
    sufs = {k: set(re.findall(rf"^{m}\((\w+),", src, flags=re.MULTILINE))
            for k, m in (("ew2d", "OPS_EW2D"), ("value", "OPS_VALUE"), ("index", "OPS_INDEX"),
                         ("rmul", "OPS_RMUL"))}
    assert defined == {"ew2d", "unit_tri", "wy_system", "column_norms", "column_absmax",
                       "divide_columns", "gather_rows", "scatter_rows", "rmul_upper",
                       "rmul_trans"}
    assert set(sufs["ew2d"]) == {"f64_f64", "f32_f32", "f64_f32"}
    assert set(sufs["value"]) == set(sufs["rmul"]) == set(ao._VALUE.values())
    assert set(sufs["index"]) == {f"{v}_{i}" for v in ao._VALUE.values()
                                  for i in ao._INDEX.values()}


_MASK32 = np.uint64(0xFFFFFFFF)


def _philox4x32_10(c, key):
    """Philox-4x32-10 of counters ``c`` (four uint64 arrays of 32-bit values)
    under ``key`` (two ints), in NumPy (the kernel's reference)."""
    c0, c1, c2, c3 = c
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK32,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK32)
        k0 = (k0 + np.uint64(0x9E3779B9)) & _MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _MASK32
    return c0, c1, c2, c3


def _normal_block_reference(seed: int, n: int) -> np.ndarray:
    """What ``normal_block_f64`` draws: Box–Muller on Philox's 53-bit uniforms."""
    k = np.arange((n + 1) // 2, dtype=np.uint64)
    zero = np.zeros_like(k)
    x0, x1, x2, x3 = _philox4x32_10((k & _MASK32, k >> np.uint64(32), zero, zero),
                                    (seed & 0xFFFFFFFF, seed >> 32))
    sh5, sh6 = np.uint64(5), np.uint64(6)
    u1 = 1.0 - ((x0 >> sh5) * 67108864.0 + (x1 >> sh6)) / 2.0 ** 53
    u2 = ((x2 >> sh5) * 67108864.0 + (x3 >> sh6)) / 2.0 ** 53
    r = np.sqrt(-2.0 * np.log(u1))
    out = np.empty(2 * k.size)
    out[0::2], out[1::2] = r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)
    return out[:n]


def test_philox_reference_known_answers():
    """The reference generator is Philox-4x32-10 (the published known answers)
    and its Box–Muller numbers look standard normal."""
    one = [np.array([v], dtype=np.uint64) for v in (0, 0, 0, 0)]
    assert [int(v[0]) for v in _philox4x32_10(one, (0, 0))] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    full = [np.array([0xFFFFFFFF], dtype=np.uint64)] * 4
    assert [int(v[0]) for v in _philox4x32_10(full, (0xFFFFFFFF, 0xFFFFFFFF))] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    z = _normal_block_reference(3, 200001)
    assert z.size == 200001 and np.all(np.isfinite(z))
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert not np.array_equal(z[:100], _normal_block_reference(4, 100))
    assert "normal_block_f64" in _kernels.flatten_source(ao.OPS_FILE)


# ---------------------------------------------------------------- GPU

def _cp():
    return pytest.importorskip("cupy")


def _same(a, b):
    a, b = a.get(), b.get()
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.gpu
def test_copies_and_updates_match_cupy():
    cp = _cp()
    rng = np.random.default_rng(1)
    F = cp.asarray(rng.standard_normal((70, 90)))
    for view in (F[3:40, 5:33], F[3:40, 5:33].T, F[:, :1], F[7]):
        _same(ao.contiguous_copy(view), cp.ascontiguousarray(view))
        _same(ao.contiguous_copy(view, order="F"), cp.asfortranarray(view))
    F32 = F.astype(np.float32)
    _same(ao.contiguous_copy(F32[2:30, 4:9], np.float64, order="F"),
          cp.array(F32[2:30, 4:9].astype(np.float64), order="F"))
    Z = F[10:50].copy()
    W = cp.asarray(rng.standard_normal((40, 90)))
    want = Z - W
    ao.subtract_into(Z, W)
    _same(Z, want)
    Y = cp.asarray(rng.standard_normal((20, 3)))
    _same(ao.fresh_float64(Y), Y.copy())
    _same(ao.fresh_float64(cp.asfortranarray(Y)), Y.copy())
    _same(ao.fresh_float64(Y.astype(np.float32)), Y.astype(np.float32).astype(np.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unit_triangles_and_the_wy_system_match_cupy(dtype):
    cp = _cp()
    rng = np.random.default_rng(2)
    F = cp.asarray(rng.standard_normal((60, 50)).astype(dtype))
    for rows, b in ((60, 17), (30, 30), (25, 40)):
        P = F[:rows, 3:3 + b]
        lo = cp.tril(P, -1)
        lo[cp.arange(min(rows, b)), cp.arange(min(rows, b))] = 1
        _same(ao.unit_triangle(P, lower=True), lo)
        up = cp.triu(P, 1)
        up[cp.arange(min(rows, b)), cp.arange(min(rows, b))] = 1
        out = cp.empty((rows, b), dtype=dtype)
        ao.unit_triangle(P, lower=False, out=out)
        _same(out, up)
    b = 37
    G = cp.asarray(rng.standard_normal((b, b)).astype(dtype))
    tau = cp.asarray(rng.uniform(-2, 2, b).astype(dtype))
    tau[3] = 0
    M, D = cp.empty((b, b), dtype=dtype), cp.empty((b, b), dtype=dtype)
    ao.wy_system(G, tau, M, D)
    Mw = cp.triu(G, 1) * tau[None, :]
    Mw += cp.eye(b, dtype=dtype)
    _same(M, Mw)
    _same(D, cp.diag(tau))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_t_factor_on_the_device_matches_the_generic_one(dtype):
    """The panel's T by the kernel + cuBLAS trsm is the generic ``_t_factor`` with
    cupyx's solve_triangular, bit for bit, in a full and in a short panel."""
    cp = _cp()
    from cupyx.scipy.linalg import solve_triangular

    from scipy_gpuqr._engine import dense_front as dfm
    rng = np.random.default_rng(3)
    nb = 64
    factor = dfm._PanelFactor(cp, np.dtype(dtype), "geqrf", 200, nb,
                              dfm._Work(cp, np.dtype(dtype), nb * nb))
    for rows, b in ((200, 64), (150, 23)):
        V = np.tril(rng.standard_normal((rows, b)), -1)
        V[np.arange(b), np.arange(b)] = 1
        Vt = cp.asarray(np.ascontiguousarray(V.T).astype(dtype))
        tau = cp.asarray(rng.uniform(0.5, 2, b).astype(dtype))
        Tp = cp.zeros((nb, nb), dtype=dtype)
        factor._t_factor(Vt, tau, Tp[:b, :b])
        want = cp.zeros((nb, nb), dtype=dtype)
        want[:b, :b] = dfm._t_factor(cp, solve_triangular, Vt.T, tau)
        _same(Tp, want)


@pytest.mark.gpu
def test_row_gathers_and_scatters_match_fancy_indexing():
    cp = _cp()
    rng = np.random.default_rng(4)
    X = cp.asarray(rng.standard_normal((100, 5)))
    x1 = cp.asarray(rng.standard_normal(300))
    for itype in (np.int64, np.int32):
        idx = cp.asarray(rng.permutation(100)[:37].astype(itype))
        _same(ao.take_rows(X, idx), X[idx])
        _same(ao.take_rows(X, idx, order="F"), cp.asfortranarray(X[idx]))
        i1 = cp.asarray(rng.integers(0, 300, 50).astype(itype))
        out = cp.empty(50)
        ao.take_rows(x1, i1, out=out)
        _same(out, cp.take(x1, i1))
        src = cp.asfortranarray(cp.asarray(rng.standard_normal((37, 5))))
        A, B = X.copy(), X.copy()
        A[idx] = src
        ao.put_rows(B, idx, src)
        _same(B, A)
        A[idx] -= src
        ao.put_rows(B, idx, src, subtract=True)
        _same(B, A)
    # a NumPy index is uploaded as CuPy would
    idx = rng.permutation(100)[:9]
    _same(ao.take_rows(X, idx), X[cp.asarray(idx)])


@pytest.mark.gpu
def test_normal_block_is_the_reference_generator():
    """The device's Gaussian block equals the NumPy reference to rounding (the
    device's log, sqrt and sincospi against NumPy's), odd sizes and 64-bit seeds
    included; the memory it lands in held NaN before (the pool's freed block)."""
    cp = _cp()
    for seed, shape in ((0, (1001, 7)), (2 ** 40 + 5, (3, 1)), (7, (65536, 4))):
        poison = cp.full(shape, np.nan)
        del poison
        got = ao.normal_block(seed, shape)
        assert got.shape == shape and got.flags.c_contiguous
        ref = _normal_block_reference(seed, int(np.prod(shape))).reshape(shape)
        np.testing.assert_allclose(got.get(), ref, rtol=1e-13, atol=1e-13)


@pytest.mark.gpu
def test_column_norms_and_scaling():
    cp = _cp()
    rng = np.random.default_rng(5)
    Y = cp.asarray(rng.standard_normal((5003, 8)))
    n, bad = ao.column_norms(Y)
    assert np.allclose(n.get(), cp.linalg.norm(Y, axis=0).get(), rtol=1e-14, atol=0)
    assert not bad.get().any()
    _same(ao.divide_columns(Y, n), Y / n)
    Y[17, 2] = np.nan
    Y[4000, 6] = -np.inf
    assert ao.column_norms(Y)[1].get().tolist() == [0, 0, 1, 0, 0, 0, 1, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_column_maxima_triangles_and_thin_qr_match_cupy(dtype):
    """The null-space rank decision's operations: column maxima and finite flags,
    a triangle with its own diagonal, and the thin QR by cuSOLVER called directly,
    equal to ``abs(Y).max(axis=0)``, ``triu``/``tril`` and ``cupy.linalg.qr``."""
    cp = _cp()
    rng = np.random.default_rng(7)
    Y = cp.asarray(rng.standard_normal((3001, 5)).astype(dtype))
    amax, bad = ao.column_absmax(Y)
    _same(amax, cp.abs(Y).max(axis=0))
    assert not bad.get().any()
    Y[5, 1] = np.inf
    Y[3000, 4] = np.nan
    amax, bad = ao.column_absmax(Y)
    assert bad.get().tolist() == [0, 1, 0, 0, 1]
    F = cp.asarray(rng.standard_normal((40, 30)).astype(dtype))
    for P in (F, F[2:25, 3:20], F[:20].T):
        _same(ao.unit_triangle(P, lower=False, unit=False), cp.triu(P))
        _same(ao.unit_triangle(P, lower=True, unit=False), cp.tril(P))
    for m, n in ((500, 7), (64, 64), (2000, 130)):
        X = cp.asarray(rng.standard_normal((m, n)).astype(dtype))
        X0 = X.copy()
        Q, R = ao.thin_qr(X)
        Qw, Rw = cp.linalg.qr(X, mode="reduced")
        _same(X, X0)
        assert Q.flags.f_contiguous and R.flags.f_contiguous
        _same(Q, cp.asfortranarray(Qw))
        _same(R, cp.asfortranarray(Rw))
        Q2, none = ao.thin_qr(X, want_r=False)
        _same(Q2, Q)
        assert none is None
    with pytest.raises(ValueError):
        ao.thin_qr(X[:5])


@pytest.mark.gpu
def test_matmul_operands_give_the_same_products_and_trsm_the_same_solves():
    cp = _cp()
    from cupyx.scipy.linalg import solve_triangular
    rng = np.random.default_rng(6)
    F = cp.asarray(rng.standard_normal((300, 400)))
    S = F[:120, 150:330]                       # non-contiguous, like R's S blocks
    Yg = cp.asarray(rng.standard_normal((180, 3)))
    _same(ao.matmul_operand(S, left=True) @ Yg, S @ Yg)
    y = cp.asfortranarray(cp.asarray(rng.standard_normal((120, 3))))
    _same(ao.matmul_operand(S.T, left=True) @ y, S.T @ y)
    Z = F[:, :7]
    V = cp.asarray(rng.standard_normal((300, 20)))
    _same(V.T @ ao.matmul_operand(Z, left=False), V.T @ Z)
    S32 = S.astype(np.float32)
    _same(ao.matmul_operand(S32.T, np.float64, left=True) @ y, S32.T @ y)
    U = F[:150, :150] + 50 * cp.eye(150)
    B = cp.asarray(rng.standard_normal((150, 4)))
    for trans in (False, True):
        Uf = ao.contiguous_copy(U, order="F")
        Bf = cp.asfortranarray(B)
        ao.trsm_left(Uf, 150, Bf, 150, 150, 4, lower=False, trans=trans, unit=False)
        _same(Bf, solve_triangular(U, B, lower=False, trans=1 if trans else 0))


_FIRST_CALL = r"""
import json, sys, threading, traceback
import numpy as np
import cupy
from cupy.cuda import compiler
seen = []
_cc = compiler._compile_with_cache_cuda
def cc(source, *a, **k):
    if threading.current_thread() is threading.main_thread():
        where = [f"{f.filename.split('scipy_gpuqr/')[-1]}:{f.lineno}"
                 for f in traceback.extract_stack() if "scipy_gpuqr/" in f.filename]
        seen.append(where[-1] if where else "?")
    return _cc(source, *a, **k)
compiler._compile_with_cache_cuda = cc
import scipy_gpuqr as sg
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares
spec = sys.argv[1]
cods = []
if spec.startswith("grid"):
    A = grid3d_least_squares(int(spec[4:]))
else:                       # a chessboard: the null-space COD on the device decides
    A = chessboard_boundary(*(int(v) for v in spec[2:].split("-")))
    _lstsq.SOLVE_RANK_MIN_ORDER = 1000
    real = _lstsq.NullspaceCOD
    def recorded(*a, xp=np, **k):
        cods.append(getattr(xp, "__name__", "?"))
        return real(*a, xp=xp, **k)
    _lstsq.NullspaceCOD = recorded
b = np.asarray(A @ (1.0 + np.sin(np.arange(A.shape[1])))) + 1e-3 * np.cos(np.arange(A.shape[0]))
x = sg.lsqr(A, b, backend="gpu")[0]
res = float(np.linalg.norm(A.T @ (A @ x - b)) / np.linalg.norm(A.T @ b))
print(json.dumps({"main_thread_compiles": seen, "residual": res, "cods": cods}))
"""

#: Files whose CuPy operations on a call's path the prefetched kernels replaced.
_REPLACED = ("_engine/dense_front.py", "_engine/gpu/rcopy.py", "_engine/gpu/trsolve.py",
             "_factor/solve_rank.py", "_engine/gpu/solve.py")


@pytest.mark.gpu
@pytest.mark.parametrize("problem", ["grid24", "ch5-7-3"])
def test_a_first_gpu_lsqr_compiles_no_cupy_kernel_of_the_replaced_operations(problem):
    """In a new process (the kernel cache as the session left it: a compile or a
    cache load alike goes through CuPy's compiler entry), the first GPU ``lsqr``
    asks CuPy for no kernel on the calling thread from the files whose
    operations the prefetched module does (our modules are compiled on worker
    threads): a grid with dense fronts and large fronts of R (full rank), and a
    chessboard whose rank the null-space COD decides on the device."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _FIRST_CALL, problem], capture_output=True,
                       text=True, timeout=600, env=env, cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["residual"] < 1e-10
    print("main-thread CuPy compiles:", out["main_thread_compiles"])
    if problem.startswith("ch"):
        assert "cupy" in out["cods"]
    assert [w for w in out["main_thread_compiles"] if w.startswith(_REPLACED)] == []
