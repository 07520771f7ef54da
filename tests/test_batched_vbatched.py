"""Variable-size batches (``*_vbatched``) against SciPy per matrix, CPU and GPU."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from scipy.linalg import LinAlgError, LinAlgWarning

import scipy_gpuqr as g
from scipy_gpuqr.batched import _vbatched as vb
from test_batched_cases import eps

SIZES = [3, 17, 5, 64, 1, 0, 40, 17, 100, 33, 8, 130]


def _mats(rng, sizes, dtype=np.float64):
    return [rng.standard_normal((n, n)).astype(dtype) for n in sizes]


def _padded(mats, fill=7.0):
    big = max(len(m) for m in mats)
    out = np.full((len(mats), big, big), fill, dtype=mats[0].dtype)
    for k, m in enumerate(mats):
        out[k, :len(m), :len(m)] = m
    return out


def _xp(on_gpu):
    if on_gpu:
        import cupy as cp
        return cp
    return np


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


GPU = pytest.param(True, marks=pytest.mark.gpu)


def test_size_classes():
    assert vb.size_class(5) == 5 and vb.size_class(9) == 12 and vb.size_class(33) == 40
    assert vb.size_class(512) == 512 and vb.size_class(513) == 640
    np.testing.assert_array_equal(vb.size_class(np.array([1, 30, 200])), [1, 32, 224])
    assert all(vb.size_class(c) == c for c in vb.SIZE_CLASSES)
    # one Python int (the GPU path's largest order) and an array agree everywhere
    orders = np.arange(0, 1100)
    np.testing.assert_array_equal([vb.size_class(int(k)) for k in orders], vb.size_class(orders))


@pytest.mark.parametrize("on_gpu", [False, GPU])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lu_factor_list_and_padded(rng, on_gpu, dtype):
    xp = _xp(on_gpu)
    mats = _mats(rng, SIZES, dtype)
    lu, piv = g.lu_factor_vbatched([xp.asarray(m) for m in mats])
    assert len(lu) == len(mats) and all(isinstance(x, xp.ndarray) for x in lu)
    for m, f, p in zip(mats, lu, piv):
        f, p = _host(f), _host(p)
        assert f.shape == m.shape and f.dtype == dtype and p.dtype == np.int32
        if m.size:
            ref, rpiv = sl.lu_factor(m)
            np.testing.assert_array_equal(p, rpiv)
            np.testing.assert_allclose(f, ref, rtol=0,
                                       atol=50 * len(m) * eps(dtype) * np.abs(ref).max())
    stack = _padded(mats)
    lu2, piv2 = g.lu_factor_vbatched(xp.asarray(stack), sizes=SIZES)
    lu2, piv2 = _host(lu2), _host(piv2)
    big = stack.shape[-1]
    for k, m in enumerate(mats):
        n = len(m)
        np.testing.assert_array_equal(lu2[k, :n, :n], _host(lu[k]))
        np.testing.assert_array_equal(piv2[k], np.r_[_host(piv[k]), np.arange(n, big)])
        np.testing.assert_array_equal(lu2[k, n:, n:], np.eye(big - n))
        assert not lu2[k, :n, n:].any() and not lu2[k, n:, :n].any()


@pytest.mark.parametrize("on_gpu", [False, GPU])
def test_singular_named_by_index(rng, on_gpu):
    xp = _xp(on_gpu)
    mats = _mats(rng, SIZES)
    mats[2][:, 1] = 0
    mats[8][:, 50] = 0
    dev = [xp.asarray(m) for m in mats]
    with pytest.warns(LinAlgWarning, match=r"index \[2, 8\]"):
        g.lu_factor_vbatched(dev)
    _, _, info = g.lu_factor_vbatched(dev, return_info=True)
    expect = np.zeros(len(mats), dtype=np.int32)
    expect[2], expect[8] = 2, 51
    np.testing.assert_array_equal(_host(info), expect)
    with pytest.raises(LinAlgError, match=r"\[2, 8\]"):
        g.inv_vbatched(dev)
    with pytest.raises(LinAlgError, match=r"\[2, 8\]"):
        g.solve_vbatched(dev, [xp.ones(len(m)) for m in mats])
    x, info = g.solve_vbatched(dev, [xp.ones(len(m)) for m in mats], return_info=True)
    assert np.isnan(_host(x[2])).all() and not np.isnan(_host(x[0])).any()
    dev[6][3, 4] = np.inf
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[6\]"):
        g.lu_factor_vbatched(dev)


@pytest.mark.parametrize("on_gpu", [False, GPU])
def test_solve_and_inverse(rng, on_gpu):
    xp = _xp(on_gpu)
    mats = _mats(rng, SIZES)
    vecs = [rng.standard_normal(len(m)) for m in mats]
    x = g.solve_vbatched([xp.asarray(m) for m in mats], [xp.asarray(v) for v in vecs])
    for m, v, s in zip(mats, vecs, x):
        assert _host(s).shape == v.shape
        if len(m):
            np.testing.assert_allclose(_host(s), np.linalg.solve(m, v), rtol=1e-8, atol=1e-8)
    rhs = [rng.standard_normal((len(m), k)) for m, k in zip(mats, [1, 2, 3] * 4)]
    x = g.solve_vbatched([xp.asarray(m) for m in mats], [xp.asarray(r) for r in rhs])
    for m, r, s in zip(mats, rhs, x):
        if len(m):
            np.testing.assert_allclose(_host(s), np.linalg.solve(m, r), rtol=1e-8, atol=1e-8)
    stack = _padded(mats)
    big = stack.shape[-1]
    bp = np.full((len(mats), big, 2), 5.0)
    for k, m in enumerate(mats):
        bp[k, :len(m)] = rng.standard_normal((len(m), 2))
    xpad = _host(g.solve_vbatched(xp.asarray(stack), xp.asarray(bp), sizes=SIZES))
    for k, m in enumerate(mats):
        n = len(m)
        if n:
            np.testing.assert_allclose(xpad[k, :n], np.linalg.solve(m, bp[k, :n]),
                                       rtol=1e-8, atol=1e-8)
        assert not xpad[k, n:].any()
    inv = g.inv_vbatched([xp.asarray(m) for m in mats])
    for m, i in zip(mats, inv):
        if len(m):
            ref = np.linalg.inv(m)
            np.testing.assert_allclose(_host(i), ref, rtol=0,
                                       atol=1e-9 * np.abs(ref).max() * np.linalg.cond(m))


@pytest.mark.parametrize("on_gpu", [False, GPU])
@pytest.mark.parametrize("lower", [False, True])
def test_cholesky(rng, on_gpu, lower):
    xp = _xp(on_gpu)
    spd = [m @ m.T + len(m) * np.eye(len(m)) for m in _mats(rng, SIZES)]
    c, low = g.cho_factor_vbatched([xp.asarray(s) for s in spd], lower=lower)
    assert low is lower
    tri = np.tril if lower else np.triu
    for s, f in zip(spd, c):
        f = _host(f)
        if len(s):
            ref, _ = sl.cho_factor(s, lower=lower)
            np.testing.assert_allclose(tri(f), tri(ref), rtol=0,
                                       atol=1e-12 * len(s) * np.abs(ref).max())
            np.testing.assert_array_equal(f - tri(f), s - tri(s))
    spd[9][5, 5] = -1.0
    with pytest.raises(LinAlgError, match=r"\[9\]"):
        g.cho_factor_vbatched([xp.asarray(s) for s in spd], lower=lower)
    _, _, info = g.cho_factor_vbatched(xp.asarray(_padded(spd)), sizes=SIZES,
                                       lower=lower, return_info=True)
    assert _host(info)[9] == 6 and (np.delete(_host(info), 9) == 0).all()


def test_bad_input(rng):
    with pytest.raises(ValueError, match="square"):
        g.lu_factor_vbatched([np.ones((2, 3))])
    with pytest.raises(ValueError, match="needs sizes"):
        g.lu_factor_vbatched(np.ones((2, 3, 3)))
    with pytest.raises(ValueError, match=r"lie in \[0, 3\]"):
        g.lu_factor_vbatched(np.ones((2, 3, 3)), sizes=[1, 4])
    with pytest.raises(ValueError, match="only for a padded stack"):
        g.lu_factor_vbatched([np.ones((2, 2))], sizes=[2])
    with pytest.raises(ValueError, match=r"b\[1\]"):
        g.solve_vbatched([np.eye(2), np.eye(3)], [np.ones(2), np.ones(2)])
    lu, piv = g.lu_factor_vbatched([])
    assert lu == [] and piv == []


def test_one_batched_call_per_size_class(rng, monkeypatch):
    calls = []
    real = g.lu_factor_batched

    def spy(a, **kw):
        calls.append(a.shape)
        return real(a, **kw)
    from scipy_gpuqr.batched import _functions as _batched
    monkeypatch.setattr(_batched, "lu_factor_batched", spy)
    g.lu_factor_vbatched(_mats(rng, [3, 9, 10, 12, 3, 70, 65, 9]))
    assert sorted(calls) == sorted([(2, 3, 3), (4, 12, 12), (2, 80, 80)])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8, 32, 40])
def test_gpu_padded_stack_of_one_order(rng, monkeypatch, n):
    """A padded stack whose matrices all fill it (sizes on the device) goes to
    the fixed-size routine as it is, one call, no gather: results equal
    that routine's; an inf is named by its index, bad sizes are refused."""
    import cupy as cp
    from scipy_gpuqr.batched import _functions as _batched
    a = rng.standard_normal((50, n, n)) + 3 * np.eye(n)
    ga, sz = cp.asarray(a), cp.full(50, n, dtype=cp.int64)
    calls = []
    real = _batched.inv_batched

    def spy(x, **kw):
        calls.append(x.data.ptr)
        return real(x, **kw)
    monkeypatch.setattr(_batched, "inv_batched", spy)
    inv = g.inv_vbatched(ga, sz)
    # n <= 32: the fixed-size kernel itself, reading the sizes (no fixed-size call)
    assert calls == ([] if n <= 32 else [ga.data.ptr])
    np.testing.assert_array_equal(_host(inv), _host(real(ga)))
    lu, piv = g.lu_factor_vbatched(ga, sz)
    rlu, rpiv = g.lu_factor_batched(ga)
    np.testing.assert_array_equal(_host(lu), _host(rlu))
    np.testing.assert_array_equal(_host(piv), _host(rpiv))
    b = rng.standard_normal((50, n, 2))
    np.testing.assert_array_equal(_host(g.solve_vbatched(ga, cp.asarray(b), sz)),
                                  _host(g.solve_batched(ga, cp.asarray(b))))
    spd = cp.asarray(a @ a.transpose(0, 2, 1) + n * np.eye(n))
    np.testing.assert_array_equal(_host(g.cho_factor_vbatched(spd, sz)[0]),
                                  _host(g.cho_factor_batched(spd)[0]))
    bad = ga.copy()
    bad[41, 2, 3] = np.nan
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[41\]"):
        g.inv_vbatched(bad, sz)
    _, info = g.inv_vbatched(bad, sz, check_finite=False, return_info=True)
    assert not _host(info).any()
    with pytest.raises(ValueError, match=rf"lie in \[0, {n}\]"):
        g.inv_vbatched(ga, cp.full(50, n + 1, dtype=cp.int64))


@pytest.mark.gpu
def test_gpu_padded_stack_classes_on_device(rng):
    """Several size classes in a padded stack with device sizes: gathers and
    scatters by kernel, padding the identity (matrices, inverses), the row
    index (pivots) and zero (solutions); infs named across classes."""
    import cupy as cp
    sizes = np.array([5, 32, 17, 0, 40, 3, 32, 12, 29, 1])
    mats = _mats(rng, sizes)
    for m in mats:
        m += 3 * np.eye(len(m))
    stack = _padded(mats)
    big = stack.shape[-1]
    gs, gz = cp.asarray(stack), cp.asarray(sizes)
    lu, piv = g.lu_factor_vbatched(gs, gz)
    inv = _host(g.inv_vbatched(gs, gz))
    lu, piv = _host(lu), _host(piv)
    for k, m in enumerate(mats):
        n = len(m)
        np.testing.assert_array_equal(piv[k, n:], np.arange(n, big))
        np.testing.assert_array_equal(lu[k, n:, n:], np.eye(big - n))
        np.testing.assert_array_equal(inv[k, n:, n:], np.eye(big - n))
        assert not lu[k, :n, n:].any() and not inv[k, n:, :n].any()
        if n:
            ref, rpiv = sl.lu_factor(m)
            np.testing.assert_array_equal(piv[k, :n], rpiv)
            np.testing.assert_allclose(lu[k, :n, :n], ref, rtol=0,
                                       atol=50 * n * eps(np.float64) * np.abs(ref).max())
            np.testing.assert_allclose(inv[k, :n, :n], np.linalg.inv(m), rtol=1e-9,
                                       atol=1e-9)
    bp = rng.standard_normal((len(sizes), big))
    x = _host(g.solve_vbatched(gs, cp.asarray(bp), gz))
    for k, m in enumerate(mats):
        n = len(m)
        assert not x[k, n:].any()
        if n:
            np.testing.assert_allclose(x[k, :n], np.linalg.solve(m, bp[k, :n]),
                                       rtol=1e-9, atol=1e-9)
    gs[4, 39, 0] = np.inf
    gs[8, 0, 28] = np.nan
    gs[8, 0, 30] = np.nan                          # beyond matrix 8 (order 29): ignored
    with pytest.raises(ValueError, match=r"infs or NaNs.*\[4, 8\]"):
        g.inv_vbatched(gs, gz)


@pytest.mark.gpu
def test_gpu_size_classes_counted_on_device():
    """The device's size classes of a padded stack (kernels/batched/vbatched.cu)
    are size_class's, the matrices filling the stack are recognized, sizes
    outside [0, N] refused."""
    import cupy as cp
    big = 700
    sizes = np.r_[np.arange(big + 1), np.full(40, 33), np.full(5, big)]
    rag = vb._Ragged(cp, None, None, cp.asarray(sizes), None, None, (len(sizes), big, big))
    classes, whole = vb._classes(rag, "x")
    assert not whole
    seen = np.zeros(len(sizes), dtype=int)
    for order, idx in classes.items():
        idx = _host(idx)
        seen[idx] += 1
        np.testing.assert_array_equal(vb.size_class(sizes[idx]), order)
    assert (seen == 1).all()
    rag = vb._Ragged(cp, None, None, cp.full(9, 24), None, None, (9, 24, 24))
    assert vb._classes(rag, "x") == ({24: None}, True)
    rag = vb._Ragged(cp, None, None, cp.full(9, 21), None, None, (9, 24, 24))
    assert vb._classes(rag, "x") == ({24: None}, False)
    rag = vb._Ragged(cp, None, None, cp.asarray([3, -1]), None, None, (2, 4, 4))
    with pytest.raises(ValueError, match=r"lie in \[0, 4\]"):
        vb._classes(rag, "x")


# ----------------------------------------------------------------------------
# padded stacks of order <= 32 on the GPU: one kernel reading the sizes
# ----------------------------------------------------------------------------

def _padded_case(rng, big, dtype, batch=37, spd=False):
    """A padded stack (junk outside each matrix: 7 and a NaN) and its sizes
    (0 and ``big`` among them)."""
    sizes = rng.integers(0, big + 1, size=batch)
    sizes[:2] = (0, big)
    mats = []
    for n in sizes:
        m = rng.standard_normal((n, n))
        m = m @ m.T + n * np.eye(n) if spd else m + 2 * np.eye(n)
        mats.append(m.astype(dtype))
    stack = np.full((batch, big, big), 7.0, dtype=dtype)
    for k, m in enumerate(mats):
        stack[k, :len(m), :len(m)] = m
        if len(m) < big:
            stack[k, big - 1, 0] = np.nan                 # outside the matrix: ignored
    return stack, sizes, mats


def _identity_outside(x, n):
    big = x.shape[-1]
    np.testing.assert_array_equal(x[n:, n:], np.eye(big - n))
    assert not x[:n, n:].any() and not x[n:, :n].any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("big", [1, 2, 3, 8, 13, 24, 32])
def test_gpu_padded_small_stack_per_matrix_orders(rng, monkeypatch, big, dtype):
    """A padded CuPy stack of order <= 32: one kernel launch reads each
    matrix's order (int32 or int64 sizes on the device, or host sizes),
    no size classes, no gather; outputs poisoned beforehand; each matrix
    as SciPy's, the identity (pivots: the row) and zero right-hand side
    rows outside it, junk there ignored."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common
    from test_batched_cases import poison_gpu_outputs
    poison_gpu_outputs(monkeypatch)
    launches = []
    real_launch = _gpu_common.launch

    def launch(*args):
        launches.append(args[0])
        return real_launch(*args)
    monkeypatch.setattr(_gpu_common, "launch", launch)
    monkeypatch.setattr(_gpu_common, "read_words", None)          # no size-class read
    stack, sizes, mats = _padded_case(rng, big, dtype)
    gs = cp.asarray(stack)
    tol = 200 * big * eps(dtype)
    for sz in (cp.asarray(sizes, dtype=cp.int32), cp.asarray(sizes), list(sizes)):
        launches.clear()
        lu, piv = g.lu_factor_vbatched(gs, sz)
        assert len(launches) == 1
        lu, piv = _host(lu), _host(piv)
        assert lu.dtype == dtype and piv.dtype == np.int32
        for k, m in enumerate(mats):
            n = len(m)
            _identity_outside(lu[k], n)
            np.testing.assert_array_equal(piv[k, n:], np.arange(n, big))
            if n:
                ref, rpiv = sl.lu_factor(m)
                np.testing.assert_array_equal(piv[k, :n], rpiv)
                np.testing.assert_allclose(lu[k, :n, :n], ref, rtol=0,
                                           atol=tol * np.abs(ref).max())
    sz = cp.asarray(sizes)
    inv = _host(g.inv_vbatched(gs, sz))
    for k, m in enumerate(mats):
        n = len(m)
        _identity_outside(inv[k], n)
        if n:
            ref = np.linalg.inv(m.astype(np.float64))
            cond = np.linalg.cond(m.astype(np.float64))
            np.testing.assert_allclose(inv[k, :n, :n], ref, rtol=0,
                                       atol=tol * cond * np.abs(ref).max())
    for bshape in ((len(mats), big), (len(mats), big, 3)):
        b = rng.standard_normal(bshape).astype(dtype)
        for k, m in enumerate(mats):
            b[k, len(m):] = np.inf                         # outside: ignored
        launches.clear()
        x = _host(g.solve_vbatched(gs, cp.asarray(b), sz))
        assert len(launches) == 1 and x.shape == bshape and x.dtype == dtype
        for k, m in enumerate(mats):
            n = len(m)
            assert not x[k, n:].any()
            if n:
                ref = np.linalg.solve(m.astype(np.float64), b[k, :n].astype(np.float64))
                cond = np.linalg.cond(m.astype(np.float64))
                np.testing.assert_allclose(x[k, :n], ref, rtol=0,
                                           atol=tol * cond * max(1.0, np.abs(ref).max()))
    spd_stack, _, spd = _padded_case(rng, big, dtype, spd=True)
    spd_stack[:] = np.where(np.isnan(spd_stack), 7.0, spd_stack)
    for k, m in enumerate(spd):
        spd_stack[k, :len(m), :len(m)] = m
    for lower in (False, True):
        c, low = g.cho_factor_vbatched(cp.asarray(spd_stack),
                                       cp.asarray([len(m) for m in spd]), lower=lower)
        c = _host(c)
        assert low is lower
        tri = np.tril if lower else np.triu
        for k, m in enumerate(spd):
            n = len(m)
            _identity_outside(c[k], n)
            if n:
                ref, _ = sl.cho_factor(m.astype(np.float64), lower=lower)
                np.testing.assert_allclose(tri(c[k, :n, :n]), tri(ref), rtol=0,
                                           atol=tol * np.abs(ref).max())
                np.testing.assert_array_equal(c[k, :n, :n] - tri(c[k, :n, :n]), m - tri(m))


@pytest.mark.gpu
@pytest.mark.parametrize("big", [2, 8, 32])
def test_gpu_padded_small_stack_errors(rng, monkeypatch, big):
    """The padded kernels' status: singular matrices named (warning, errors,
    info, NaN results), infs/NaNs inside a matrix named (a and b), sizes
    outside [0, N] refused (device and host sizes) -- and the asynchronous
    call reads nothing."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common
    stack, sizes, mats = _padded_case(rng, big, np.float64, batch=12)
    sizes[[3, 7]] = big
    for k in (3, 7):
        m = rng.standard_normal((big, big)) + 2 * np.eye(big)
        m[:, big // 2] = 0                                  # singular: info = big // 2 + 1
        stack[k] = m
    gs, sz = cp.asarray(stack), cp.asarray(sizes)
    with pytest.warns(LinAlgWarning, match=r"index \[3, 7\]"):
        g.lu_factor_vbatched(gs, sz)
    _, _, info = g.lu_factor_vbatched(gs, sz, return_info=True)
    expect = np.zeros(len(sizes), dtype=np.int32)
    expect[[3, 7]] = big // 2 + 1
    np.testing.assert_array_equal(_host(info), expect)
    with pytest.raises(LinAlgError, match=r"\[3, 7\]"):
        g.inv_vbatched(gs, sz)
    with pytest.raises(LinAlgError, match=r"\[3, 7\]"):
        g.solve_vbatched(gs, cp.ones((len(sizes), big)), sz)
    x, info = g.solve_vbatched(gs, cp.ones((len(sizes), big)), sz, return_info=True)
    x = _host(x)
    assert np.isnan(x[3]).all() and not np.isnan(np.delete(x, [3, 7], axis=0)).any()
    inv, info = g.inv_vbatched(gs, sz, return_info=True)
    assert np.isnan(_host(inv)[7]).all()
    ok = stack.copy()
    ok[[3, 7]] += 5 * np.eye(big)
    k = int(np.flatnonzero(sizes > 0)[-1])
    ok[k, 0, sizes[k] - 1] = np.inf
    with pytest.raises(ValueError, match=rf"infs or NaNs.*a at index \[{k}\]"):
        g.inv_vbatched(cp.asarray(ok), sz)
    _, info = g.inv_vbatched(cp.asarray(ok), sz, check_finite=False, return_info=True)
    assert not _host(info).any()
    b = np.ones((len(sizes), big))
    b[k, sizes[k] - 1] = np.nan
    ok[k, 0, sizes[k] - 1] = 1.0
    with pytest.raises(ValueError, match=rf"infs or NaNs.*b at index \[{k}\]"):
        g.solve_vbatched(cp.asarray(ok), cp.asarray(b), sz)
    for bad in (big + 1, -1):
        wrong = sz.copy()
        wrong[5] = bad
        for fn in (g.lu_factor_vbatched, g.inv_vbatched, g.cho_factor_vbatched):
            with pytest.raises(ValueError, match=rf"lie in \[0, {big}\]"):
                fn(cp.asarray(ok), wrong)
        with pytest.raises(ValueError, match=rf"lie in \[0, {big}\]"):
            g.solve_vbatched(cp.asarray(ok), cp.ones((len(sizes), big)), wrong)
        with pytest.raises(ValueError, match=rf"lie in \[0, {big}\]"):
            g.lu_factor_vbatched(cp.asarray(ok), _host(wrong))
    reads = []
    real_read = _gpu_common.read_status
    monkeypatch.setattr(_gpu_common, "read_status", lambda st: reads.append(1) or real_read(st))
    g.lu_factor_vbatched(gs, sz, return_info=True, check_finite=False)
    g.inv_vbatched(gs, sz, return_info=True, check_finite=False)
    g.solve_vbatched(gs, cp.ones((len(sizes), big)), sz, return_info=True, check_finite=False)
    g.cho_factor_vbatched(gs, sz, return_info=True, check_finite=False)
    assert reads == []


@pytest.mark.gpu
@pytest.mark.parametrize("big, dtype", [(8, np.float64), (13, np.float32), (24, np.float64),
                                        (32, np.float64), (32, np.float32)])
def test_gpu_padded_stack_larger_than_the_grid(big, dtype):
    """A padded stack of many more matrices than the persistent grid has warps
    (each warp then loops, the orders of its next tile or matrix loaded one
    ahead and, at N = 32 in float64, only each matrix's own block copied):
    every output equals the fixed-size call's on the stack with the identity
    outside each order, junk (NaN, inf, 7) there ignored; a bad size in the
    last matrix is still found."""
    import cupy as cp
    batch = 60000 if big <= 13 else 24000
    rs = cp.random.RandomState(5)
    sizes = rs.randint(0, big + 1, size=batch).astype(cp.int64)
    sizes[:3] = cp.asarray([0, big, big // 2])
    ix = cp.arange(big)
    inside = (ix[None, :, None] < sizes[:, None, None]) & (ix[None, None, :] < sizes[:, None, None])
    eye = cp.eye(big, dtype=dtype)
    a = (rs.standard_normal((batch, big, big)) + 2 * cp.eye(big)).astype(dtype)
    ident = cp.where(inside, a, eye)
    junk = cp.where(inside, a, cp.asarray([7.0, np.nan, np.inf], dtype=dtype)[ix % 3][None, :, None])
    tol = 64 * eps(dtype)

    def close(got, ref):
        got, ref = _host(got), _host(ref)
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol * max(1.0, np.abs(ref).max()))

    for sz in (sizes, sizes.astype(cp.int32)):
        lu, piv = g.lu_factor_vbatched(junk, sz)
        rlu, rpiv = g.lu_factor_batched(ident)
        np.testing.assert_array_equal(_host(piv), _host(rpiv))
        close(lu, rlu)
    close(g.inv_vbatched(junk, sizes), g.inv_batched(ident))
    b = rs.standard_normal((batch, big)).astype(dtype)
    inb = ix[None, :] < sizes[:, None]
    x = g.solve_vbatched(junk, cp.where(inb, b, np.inf).astype(dtype), sizes)
    close(x, g.solve_batched(ident, cp.where(inb, b, 0).astype(dtype)[..., None])[..., 0])
    spd_id = cp.where(inside, cp.matmul(ident, ident.transpose(0, 2, 1)) + big * eye, eye)
    for lower in (False, True):
        c, _ = g.cho_factor_vbatched(cp.where(inside, spd_id, junk), sizes, lower=lower)
        rc, _ = g.cho_factor_batched(spd_id, lower=lower)
        close(c, rc)
    wrong = sizes.copy()
    wrong[-1] = big + 1
    for fn in (g.lu_factor_vbatched, g.inv_vbatched, g.cho_factor_vbatched):
        with pytest.raises(ValueError, match=rf"lie in \[0, {big}\]"):
            fn(ident, wrong)
    lu, piv, info = g.lu_factor_vbatched(ident, wrong, check_finite=False, return_info=True)
    lu = _host(lu)
    assert np.isnan(lu[-1]).all() and not np.isnan(lu[:-1]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("big, dtype", [(4, np.float64), (5, np.float32), (8, np.float64),
                                        (8, np.float32), (13, np.float32), (24, np.float64),
                                        (32, np.float64)])
def test_gpu_bad_sizes_found_where_the_order_is_used(big, dtype):
    """Sizes outside [0, N] (-1 and N + 1, int64 and int32 entries) at matrices
    in the middle of tiles of a stack larger than the grid (the size entries
    travel with each tile's copy and are checked where the order is used):
    the asynchronous calls give exactly those matrices NaN results and every
    other one the fixed-size call's on the stack with the identity outside
    each order; the default calls raise."""
    import cupy as cp
    batch = 40000
    rs = cp.random.RandomState(11)
    sizes = rs.randint(0, big + 1, size=batch).astype(cp.int64)
    bad = np.array([1, 2, 777, 5001, batch // 2 + 3, batch - 2])
    sizes[cp.asarray(bad)] = cp.asarray([-1, big + 1, -1, big + 1, -1, big + 1])
    good = np.ones(batch, dtype=bool)
    good[bad] = False
    used = cp.clip(sizes, 0, big)                   # the reference's orders (bad ones: any)
    ix = cp.arange(big)
    inside = (ix[None, :, None] < used[:, None, None]) & (ix[None, None, :] < used[:, None, None])
    eye = cp.eye(big, dtype=dtype)
    ident = cp.where(inside, (rs.standard_normal((batch, big, big)) + 2 * cp.eye(big)).astype(dtype),
                     eye)
    spd = cp.where(inside, cp.matmul(ident, ident.transpose(0, 2, 1)) + big * eye, eye)
    tol = 64 * eps(dtype)

    def check(got, ref):
        got, ref = _host(got), _host(ref)
        assert np.isnan(got[bad]).all()
        assert not np.isnan(got[good]).any()
        np.testing.assert_allclose(got[good], ref[good], rtol=0,
                                   atol=tol * max(1.0, np.abs(ref[good]).max()))

    rlu, rpiv = g.lu_factor_batched(ident)
    rinv = g.inv_batched(ident)
    b = rs.standard_normal((batch, big)).astype(dtype)
    inb = ix[None, :] < used[:, None]
    rx = g.solve_batched(ident, cp.where(inb, b, 0).astype(dtype)[..., None])[..., 0]
    rc, _ = g.cho_factor_batched(spd)
    asy = dict(check_finite=False, return_info=True)
    for sz in (sizes, sizes.astype(cp.int32)):
        lu, piv, _ = g.lu_factor_vbatched(ident, sz, **asy)
        check(lu, rlu)
        np.testing.assert_array_equal(_host(piv)[good], _host(rpiv)[good])
        check(g.inv_vbatched(ident, sz, **asy)[0], rinv)
        check(g.solve_vbatched(ident, b, sz, **asy)[0], rx)
        check(g.cho_factor_vbatched(spd, sz, **asy)[0], rc)
        for fn, arg in ((g.lu_factor_vbatched, ident), (g.inv_vbatched, ident),
                        (g.cho_factor_vbatched, spd)):
            with pytest.raises(ValueError, match=rf"lie in \[0, {big}\]"):
                fn(arg, sz)
