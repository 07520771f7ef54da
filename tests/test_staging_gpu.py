"""Staging under a real CuPy pool limit (marker ``gpu``).

Limits at 1/2, 1/4 and 1/8 of the one-stage need (this engine's count,
:mod:`scipy_gpuqr._engine.memory`): a plan that fits runs staged on the GPU, one
that cannot answers on the CPU with the reason in ``info``; both give the
unlimited run's answer within rounding and leave the pool as they found it.
At 1/4 and 1/8 of grid 30³'s need (its largest fronts dense) the root front
alone exceeds the pool: it runs on the host (``info['host_fronts']``), the rest
staged on the GPU, with the same R, Q and solves.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

from scipy_gpuqr._engine.memory import (POOL_USABLE, front_needs, min_budget,
                                        plan_for_memory, vt_elements)
from scipy_gpuqr._errors import GpuFallbackWarning
from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS, dense_front_mask
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
from _pool_limit import pool_limited

pytestmark = pytest.mark.gpu


def _needs(an):
    dense = dense_front_mask(an, DEFAULT_DENSE_FLOPS)
    vt = vt_elements(an, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    return front_needs(an, 8, tile=DEFAULT_TILE, vt_elems=vt, dense=dense)


@pytest.fixture(scope="module")
def problem():
    import cupy as cp

    from scipy_gpuqr import QRFactorization
    A = grid3d_least_squares(24)
    b = np.cos(np.arange(A.shape[0]))
    an = analyze(A)
    needs = _needs(an)
    need = plan_for_memory(an, needs, None).peak
    F = QRFactorization(A, backend="gpu")
    x0 = F.solve(b)
    assert F.info["backend"] == "gpu"
    F.free()
    del F
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    return A, b, an, needs, need, x0


@pytest.mark.parametrize("frac", [2, 4, 8])
def test_pool_limit_stages_or_falls_back_truthfully(problem, frac):
    from scipy_gpuqr import QRFactorization
    A, b, an, needs, need, x0 = problem
    limit = need // frac
    fits = plan_for_memory(an, needs, int(POOL_USABLE * limit)).feasible
    with pool_limited(limit):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            F = QRFactorization(A, backend="gpu")
            x = F.solve(b)
        info = F.info
        bi = info["backend_info"]
        fell = [w for w in seen if issubclass(w.category, GpuFallbackWarning)]
        if fits:
            assert info["backend"] == "gpu" and bi["backend"] == "gpu", bi.get("fallback")
            assert bi["stages"] > 1 and not fell
            assert bi["memory"]["limited_by"] == "pool limit"
            assert bi["memory"]["planned_peak"] <= limit
        else:
            assert info["backend"] == "cpu" and bi["requested_backend"] == "gpu"
            assert "device memory" in bi["fallback"] and fell
            assert min_budget(an, needs) > POOL_USABLE * limit
        np.testing.assert_allclose(x, x0, rtol=0, atol=1e-9 * np.linalg.norm(x0))
        F.free()
        del F
        gc.collect()
    if frac == 2:
        assert fits, (need, min_budget(an, needs))


def test_out_of_memory_mid_run_restages_without_leaking(problem, monkeypatch):
    """The device claims more than the pool allows (as when another process takes
    memory): the run hits CuPy's out-of-memory, frees it all and restages."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.memory import DeviceMemory
    A, b, an, needs, need, x0 = problem
    limit = need // 2
    calls = []
    real = driver._device_memory

    def lying(device):
        m = real(device)
        calls.append(m.available)
        if len(calls) == 1:                 # the first plan believes in 4x the memory
            return DeviceMemory(4 * m.available, m.limited_by, m.detail)
        return m
    monkeypatch.setattr(driver, "_device_memory", lying)
    with pool_limited(limit):
        g = driver.gpu_factorize(A, an)
        assert g.info["backend"] == "gpu" and g.info["restaged"] >= 1
        assert g.info["memory"]["out_of_memory"]
        y = g.qt_matmul(b)
        g.free()
        del g
        gc.collect()
    # the process stays usable: an unlimited run answers the same
    monkeypatch.setattr(driver, "_device_memory", real)
    h = driver.gpu_factorize(A, an)
    # the same Qᵀb up to the signs of R's rows (a staged run sums the fronts'
    # contributions in another order: a pivot that cancels to rounding may take
    # the other sign), and the same residual norm below R's rows
    n = A.shape[1]
    z = h.qt_matmul(b)
    np.testing.assert_allclose(np.abs(z[:n]), np.abs(y[:n]), rtol=0,
                               atol=1e-9 * np.linalg.norm(b))
    assert abs(np.linalg.norm(z[n:]) - np.linalg.norm(y[n:])) <= 1e-9 * np.linalg.norm(b)
    h.free()


# -- host fronts: the root front alone exceeds the pool limit ---------------------------------
_HOST_FLOPS = 1e9       # grid 30³'s largest fronts are dense fronts at this threshold


@pytest.fixture(scope="module")
def host_problem():
    import cupy as cp

    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    A = grid3d_least_squares(30)
    an = analyze(A)
    dense = dense_front_mask(an, _HOST_FLOPS)
    vt = vt_elements(an, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    needs = front_needs(an, 8, tile=DEFAULT_TILE, vt_elems=vt, dense=dense)
    need = plan_for_memory(an, needs, None).peak
    b = np.cos(np.arange(A.shape[0]))
    ref = gpu_factorize(A, an, dense_flops=_HOST_FLOPS)
    assert ref.info["backend"] == "gpu" and not ref.info["host_fronts"]
    out = {"R": ref.R, "qtb": ref.qt_matmul(b)}
    ref.free()
    del ref
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    return A, b, an, needs, need, out


@pytest.mark.parametrize("frac", [4, 8])
def test_root_front_too_large_for_the_pool_runs_on_the_host(host_problem, frac, monkeypatch,
                                                            caplog):
    import cupy as cp
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._dispatch import plan as _dispatch
    from scipy_gpuqr._engine.gpu import solve as gpu_solve
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.memory import min_budget_of_front
    A, b, an, needs, need, ref = host_problem
    fs = an.fronts
    root = int(np.flatnonzero(fs.parent < 0)[-1])
    limit = need // frac
    assert min_budget_of_front(an, needs, root) > POOL_USABLE * limit   # the root alone
    mp = plan_for_memory(an, needs, int(POOL_USABLE * limit))
    assert mp.feasible and root in mp.host
    m, n = A.shape
    with pool_limited(limit):
        with warnings.catch_warnings():
            warnings.simplefilter("error", GpuFallbackWarning)
            g = gpu_factorize(A, an, dense_flops=_HOST_FLOPS)
        info = g.info
        assert info["backend"] == "gpu" and "fallback" not in info
        assert info["memory"]["limited_by"] in ("pool limit", "restaged after out of memory")
        assert info["memory"]["planned_peak"] <= limit
        hosted = [h["front"] for h in info["host_fronts"]]
        assert root in hosted and info["seconds"]["host_fronts"] > 0
        for h in info["host_fronts"]:
            assert h["shape"] == [int(fs.fm[h["front"]]), int(fs.fn[h["front"]])]
            assert h["device_bytes_alone"] > info["memory"]["available"]
        # R within rounding (rows' signs aside), |Qᵀ b|, Q (R v) = A P v
        R0, R1 = sp.csc_array(ref["R"]), sp.csc_array(g.R)
        d = np.sign(R0.diagonal()) * np.sign(R1.diagonal())
        assert abs(sp.diags(d) @ R1 - R0).max() <= 1e-10 * abs(R0).max()
        qtb = g.qt_matmul(b)
        np.testing.assert_allclose(np.abs(qtb[:n]), np.abs(ref["qtb"][:n]), rtol=0,
                                   atol=1e-9 * np.linalg.norm(b))
        v = np.sin(np.arange(n))
        Rv = np.zeros(m)
        Rv[:R1.shape[0]] = R1 @ v
        np.testing.assert_allclose(g.q_matmul(Rv), A[:, g.colperm] @ v, rtol=0,
                                   atol=1e-10 * np.linalg.norm(Rv))
        # R's solves with the device's front blocks (the host front's on the host)
        ds = gpu_solve.device_solve_of(g)
        C = np.stack([np.cos(np.arange(n)), np.sin(np.arange(n))], axis=1)
        nR = spla.norm(R1)
        y = ds.fronts.upper(cp.asarray(C)).get()
        assert np.linalg.norm(R1 @ y - C) <= 1e-12 * nR * np.linalg.norm(y)
        yt = ds.fronts.upper_transposed(cp.asarray(C)).get()
        assert np.linalg.norm(R1.T @ yt - C) <= 1e-12 * nR * np.linalg.norm(yt)
        del ds
        g.free()
        del g
        gc.collect()

        # the public call's least-squares solve under the same limit
        def factorize(A, analysis=None, **kw):
            kw.setdefault("dense_flops", _HOST_FLOPS)
            return gpu_factorize(A, analysis, **kw)
        monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (factorize, "ok"))
        F = QRFactorization(A, backend="gpu")
        bi = F.info["backend_info"]
        assert F.info["backend"] == "gpu" and bi["host_fronts"], (
            bi.get("stages"), bi.get("dense_flops"), bi.get("memory"), F.info.get("timings"))
        with caplog.at_level("INFO", logger="scipy_gpuqr"):
            x = F.solve(b)
        r = A @ x - b
        assert np.linalg.norm(A.T @ r) <= 1e-10 * np.linalg.norm(A.T @ b)
        # Q and R stay on the device: the rank decision's kept rows of R make room
        # for Q's pool uploads instead of sending Q's replay to the host
        assert not [r.message for r in caplog.records if "on the host" in r.message
                    or "host's solves" in r.message]
        F.free()
        del F
        gc.collect()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_streamed_solve_of_a_host_front_equals_the_dense_solve(dtype, monkeypatch):
    # a host front's rows of R go up in row panels (a ragged last one); R y = c and
    # Rᵀ y = c over its columns equal the whole block's solves, other rows untouched
    import cupy as cp
    import cupyx
    from scipy.linalg import solve_triangular

    from scipy_gpuqr._engine.gpu import trsolve
    rng = np.random.default_rng()
    n, fn, rk, a, off = 300, 170, 150, 40, 7
    F = rng.standard_normal((rk, fn))
    F[:, :rk] += 20 * np.eye(rk)
    F = F.astype(dtype)
    pool = cupyx.empty_pinned(off + rk * fn + 5, dtype=dtype)
    pool[:] = np.nan                         # poison: only the front's rows may be read
    pool[off: off + rk * fn] = F.ravel()
    ft = trsolve.FrontTriangular.__new__(trsolve.FrontTriangular)
    ft.xp, ft._cupy = cp, True
    cols = rng.permutation(n)
    ft.cols = cp.asarray(cols)
    ft.fronts = [(0, off, fn + 10, fn, rk, a, a + fn)]
    monkeypatch.setattr(trsolve, "_panel_rows", lambda fn, rk, avail: 37)
    F64 = F.astype(np.float64)
    U, S = np.triu(F64[:, :rk]), F64[:, rk:]
    piv, rest = cols[a: a + rk], cols[a + rk: a + fn]
    for trans in (False, True):
        Y0 = rng.standard_normal((n, 3))
        Y = cp.asarray(Y0)
        ft.step(0, Y, pool, trans=trans)
        want = Y0.copy()
        if trans:
            z = solve_triangular(U, want[piv], trans=1)
            want[piv] = z
            want[rest] -= S.T @ z
        else:
            want[piv] = solve_triangular(U, want[piv] - S @ want[rest])
        got = Y.get()
        assert np.all(np.isfinite(got))
        assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max(), trans
        outside = np.setdiff1d(np.arange(n), cols[a: a + fn])
        assert np.array_equal(got[outside], Y0[outside])



@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_host_front_panels_read_where_the_pinned_front_lies(dtype, monkeypatch):
    # Qᵀ / Q of a device block with a host front's panels brought up by the copy
    # kernel reading the pinned front (a staircase front inside a poisoned pool,
    # as a stage's host pool holds it) equal the 2-D copies' bit for bit and the
    # host's within rounding; a pageable front takes the copy
    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine import dense_front
    from scipy_gpuqr._engine.dense_front import (DenseFront, HostDenseFront, factorize_numpy,
                                                 panels_of)
    from scipy_gpuqr._testing_matrices import staircase_front
    rng = np.random.default_rng(3)
    fm, fn, nb, off = 700, 300, 64, 11
    F0, stair = staircase_front(fm, fn, rng, dense_rows=5)
    F0 = F0.astype(dtype)
    panels = panels_of(fm, fn, stair, nb)
    Fh = F0.copy()
    T = factorize_numpy(Fh, panels, nb)
    pool = cupyx.empty_pinned(off + fm * fn + 7, dtype=dtype)
    pool[:] = np.nan                    # only the panels' lower triangles may be read
    front = pool[off: off + fm * fn].reshape(fm, fn)
    front[...] = Fh
    rows = np.arange(fm)[:, None]
    for j, r, b in panels:              # the rows below a panel's staircase: never read
        front[j + r:, j:j + b] = np.nan
    front[np.triu(np.ones((fm, fn), dtype=bool)) & (rows < fn)] = np.nan   # R: never read
    Y0 = rng.standard_normal((fm, 3)).astype(dtype)
    want = Y0.astype(np.float64)
    DenseFront(Fh.astype(np.float64), panels, T.astype(np.float64)).apply_qt(want)
    got = {}
    for how, src in (("mapped", front), ("copy2d", front), ("pageable", Fh)):
        d = HostDenseFront(src, panels, T, upload="copy2d" if how == "copy2d" else "mapped")
        Y = cp.asarray(Y0)
        d.apply_qt(Y)
        assert d.mapped_panels == (len(panels) if how == "mapped" else 0), how
        got[how] = Y.get()
        tol = (1e-12 if dtype == np.float64 else 1e-4) * np.abs(want).max()
        assert np.all(np.isfinite(got[how])), how
        assert np.abs(got[how] - want).max() <= tol, how
        d.apply_q(Y)
        assert np.abs(Y.get() - Y0).max() <= tol, how
    if dtype == np.float64:
        np.testing.assert_array_equal(got["mapped"], got["copy2d"])
        np.testing.assert_array_equal(got["mapped"], got["pageable"])
    # the read by a grid of a few blocks (dense_front.MAPPED_READ_BLOCKS): the same bits
    monkeypatch.setattr(dense_front, "MAPPED_READ_BLOCKS", 3)
    d = HostDenseFront(front, panels, T, upload="mapped")
    Y = cp.asarray(Y0)
    d.apply_qt(Y)
    assert d.mapped_panels == len(panels)
    np.testing.assert_array_equal(Y.get(), got["mapped"])
    with pytest.raises(ValueError, match="upload must be one of"):
        HostDenseFront(Fh, panels, T, upload="bogus")


@pytest.mark.parametrize("how", ["mapped", "copy2d"])
def test_reflector_bands_read_where_the_pinned_pool_lies(how, monkeypatch):
    # an earlier stage's reflector pieces packed on the device: bands read by the
    # copy kernel from the pinned pool (those of at least MAPPED_BAND_BYTES) or by
    # 2-D copies, runs by 1-D copies, equal the NumPy model's buffer bit for bit;
    # a pageable pool takes the copies
    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.gpu import reflector_upload as ru
    from scipy_gpuqr._schedule.tasks import TASK_DTYPE
    rng = np.random.default_rng(5)
    n = 200_000
    pinned = cupyx.empty_pinned(n, dtype=np.float64)
    pinned[:] = rng.standard_normal(n)
    runs = [(0, 1000, 0), (5000, 17, 1000)]
    end = n - 299 * 500 - 200           # a band whose last row ends the pool
    blocks = [(6000, 300, 120, 250, 1017), (90_000, 40, 7, 9, 1017 + 36_000),
              (100_000, 700, 96, 130, 1017 + 36_000 + 280),
              (end, 300, 200, 500, 1017 + 36_000 + 280 + 700 * 96)]
    size = 1017 + 36_000 + 280 + 700 * 96 + 300 * 200
    layout = ru.ReflectorLayout(runs, blocks, size, np.zeros(0, dtype=TASK_DTYPE), {})
    want = ru.upload_reflectors(pinned, layout, np).values
    kernels, copy_into = [], ru.copy_into

    def counted(dst, src):
        kernels.append(dst.shape)
        return copy_into(dst, src)
    monkeypatch.setattr(ru, "copy_into", counted)
    monkeypatch.setattr(ru, "MAPPED_BAND_BYTES", 300 * 120 * 8)
    for host in (pinned, np.array(pinned)):
        kernels.clear()
        got = ru.upload_reflectors(host, layout, cp, band_upload=how)
        cp.cuda.get_current_stream().synchronize()
        np.testing.assert_array_equal(got.values.get(), want)
        mapped = how == "mapped" and host is pinned
        assert kernels == ([(300, 120), (700, 96), (300, 200)] if mapped else []), (how, kernels)
    with pytest.raises(ValueError, match="band_upload must be one of"):
        ru.upload_reflectors(pinned, layout, cp, band_upload="bogus")


@pytest.mark.parametrize("share,dense_flops", [((1, 2), DEFAULT_DENSE_FLOPS),
                                               ((2, 5), DEFAULT_DENSE_FLOPS), ((2, 5), 3e8)])
def test_prefetched_replay_equals_one_upload_at_a_time(problem, share, dense_flops,
                                                       monkeypatch):
    """Q's replay under a real pool limit with the next stage's reflectors sent up
    on a side stream while the current stage's levels run: Qᵀ and Q bit for bit
    as with one upload after the other, some stage taken from its prefetch, and
    nothing left on the device; with dense fronts in the uploaded stages too
    (3e8: 15 dense fronts over 5 stages, their device copies not kept: read in
    the uploaded packs)."""
    from scipy_gpuqr._engine.gpu import driver, solve
    A, b, an, needs, need, x0 = problem
    if dense_flops != DEFAULT_DENSE_FLOPS:
        dense = dense_front_mask(an, dense_flops)
        vt = vt_elements(an, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE, pipelining=True,
                         granule=DEFAULT_APPLY_GRANULE, dense=dense)
        need = plan_for_memory(an, front_needs(an, 8, tile=DEFAULT_TILE, vt_elems=vt,
                                               dense=dense), None).peak
    B = np.cos(np.arange(A.shape[0] * 3, dtype=np.float64)).reshape(-1, 3)
    with pool_limited(need * share[0] // share[1]):      # 5 to 7 stages
        g = driver.gpu_factorize(A, an, dense_flops=dense_flops)
        assert g.info["backend"] == "gpu" and g.info["stages"] > 2
        assert (g.info["dense_fronts"] > 0) == (dense_flops != DEFAULT_DENSE_FLOPS)
        out = {}
        for on in (False, True):
            monkeypatch.setattr(solve, "PREFETCH", on)
            g._replay.pop("cupy", None)
            out[on] = (g.qt_matmul(B), g.q_matmul(B))
            if on:
                assert g._replay["cupy"].prefetched > 0
        for a, c in zip(out[False], out[True]):
            np.testing.assert_array_equal(a, c)
        g.free()
        del g
        gc.collect()


def test_first_stage_sent_up_as_the_factorization_ends(problem, monkeypatch):
    """A warm staged factorization sends the first stage ``Qᵀ`` reads up as it ends
    (``solve.prefetch_first``, while R is assembled): the first
    ``Qᵀ`` replay takes it (no upload of its own), Qᵀ and Q bit for bit as
    without it; R's solves uploading their rows first drop a pack no replay
    read (``solve.drop_first``) where the rows do not fit beside it, and leave
    it to the replay where they do; nothing is left on the device."""
    import cupy as cp

    from scipy_gpuqr._engine.gpu import driver, solve
    A, b, an, needs, need, x0 = problem
    B = np.cos(np.arange(A.shape[0] * 3, dtype=np.float64)).reshape(-1, 3)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    out = {}
    counted = pools = None
    fits = solve._prefetch_fits
    for on, first_use in ((False, "replay"), (True, "replay"), (True, "rows"),
                          (True, "rows beside")):
        monkeypatch.setattr(solve, "PREFETCH_FIRST", on)
        monkeypatch.setattr(solve, "_prefetch_fits", fits)
        for _ in range(2):          # the second run warm: its replay plan is kept
            g = driver.gpu_factorize(A, an, max_gpu_memory=need // 2)
        assert g.info["backend"] == "gpu" and g.info["stages"] > 1
        first = solve.stage_sequence(solve.plan_of(g), True)[0]
        assert g.info["q_first_stage_early"] == (first if on else None)
        if first_use == "replay":
            ex = solve._cupy_executor(g)
            uploads, pools = [], ex.pools

            def counted(sid):
                uploads.append(sid)
                return pools(sid)
            counted.prefetch = pools.prefetch
            ex.pools = counted
            out[on] = (g.qt_matmul(B), g.q_matmul(B))
            assert (first in uploads) == (not on), uploads
        else:
            ex = g._replay["cupy"]
            assert ex._ahead is not None and ex._ahead[0] == first
            held = pool.used_bytes()
            beside = first_use == "rows beside"
            # the rows fit beside the pack (no pool limit here), or not (forced)
            monkeypatch.setattr(solve, "_prefetch_fits",
                                lambda cp, nbytes: beside and fits(cp, nbytes))
            solve.device_solve_of(g).upper(cp.ones((A.shape[1], 2)))
            cp.cuda.Device().synchronize()
            assert (ex._ahead is not None) == beside
            taken = ex.prefetched
            np.testing.assert_array_equal(g.qt_matmul(B), out[True][0])
            assert ex.prefetched > taken if beside else not solve.drop_first(g)
            assert held > 0
        g.free()
        g = ex = counted = pools = None      # nothing of it kept alive here
        gc.collect()
    for a, c in zip(out[False], out[True]):
        np.testing.assert_array_equal(a, c)
    pool.free_all_blocks()
    assert pool.used_bytes() <= base, (pool.used_bytes(), base)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_trapezoid_rows_solve_as_the_whole_rows(dtype, monkeypatch):
    """A large front's rows of R sent up as their upper trapezoid (the host pool
    poisoned left of the diagonal: nothing there may be read): ``R y = c``,
    ``Rᵀ y = c`` and the products with R from them equal those from the whole
    rows bit for bit."""
    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.gpu import trsolve
    from scipy_gpuqr._engine.gpu.rproduct import FrontProduct
    monkeypatch.setattr(trsolve, "TRAPEZOID_MIN_ROWS", 64)
    monkeypatch.setattr(trsolve, "TRAPEZOID_BLOCK", 48)
    rng = np.random.default_rng(7)
    n, fn, rk, a, off = 400, 300, 260, 30, 9
    F = rng.standard_normal((rk, fn))
    F[:, :rk] += 30 * np.eye(rk)
    pool = cupyx.empty_pinned(off + rk * fn + 5, dtype=dtype)
    pool[:] = 0
    pool[off: off + rk * fn] = F.astype(dtype).ravel()
    whole = cp.asarray(pool)                                # every row whole, on the device
    view = pool[off: off + rk * fn].reshape(rk, fn)
    view[np.tril_indices(rk, -1)] = np.nan                  # Householder data: never read
    ft = trsolve.FrontTriangular.__new__(trsolve.FrontTriangular)
    ft.xp, ft._cupy, ft.pools, ft.n1 = cp, True, None, 0
    ft.cols = cp.asarray(rng.permutation(n))
    ft.fronts = [(0, off, fn + 10, fn, rk, a, a + fn)]
    rows = trsolve._StageRows(ft, [0], pool, trsolve._KeepBudget(0))
    assert any(h > 1 for _, _, _, h, _ in rows._copies)
    up = rows.upload()
    for trans in (False, True):
        Y0 = cp.asarray(rng.standard_normal((n, 3)))
        Y1, Y2 = Y0.copy(), Y0.copy()
        ft._device_step(0, Y1, up, trans=trans, off=int(rows.offsets[0]))
        ft._device_step(0, Y2, whole, trans=trans, off=None)
        assert bool(cp.all(cp.isfinite(Y1)))
        assert cp.array_equal(Y1, Y2), trans
    desc = cp.asarray(np.asarray([(int(rows.offsets[0]), fn, rk, a, r0)
                                  for r0 in range(0, rk, 64)], dtype=np.int64))
    wdesc = cp.asarray(np.asarray([(off, fn, rk, a, r0) for r0 in range(0, rk, 64)],
                                  dtype=np.int64))
    X = cp.asarray(rng.standard_normal((n, 2)))
    for trans in (False, True):
        got = FrontProduct(ft, [(0, None, desc)])
        want = FrontProduct(ft, [(0, None, wdesc)])
        ft.pools = lambda sid, p=up: p
        g = got.multiply(X, trans=trans)
        ft.pools = lambda sid, p=whole: p
        w = want.multiply(X, trans=trans)
        ft.pools = None
        assert bool(cp.all(cp.isfinite(g))) and cp.allclose(g, w, rtol=1e-14, atol=0), trans


def test_staged_decision_solves_its_first_block_beside_qtb(monkeypatch):
    """A rank-deficient problem staged under a pool limit (half its one-stage need:
    three stages, the root a host front): its rank decision solves ``R⁻ᵀΩ`` on a
    stream of its own while ``Qᵀb`` replays (``solve.STAGED_BESIDE``), R's rows
    going up beside Q's first pack where they fit; rank and x are lstsq's and
    those of ``Qᵀb`` first; nothing is left on the device."""
    import cupy as cp

    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._engine.gpu import solve
    from scipy_gpuqr._factor import lstsq as _lstsq
    from scipy_gpuqr._factor import solve_rank as sr
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 1000)
    A = chessboard_boundary(6, 7, 3)                      # 12600×4200, rank 3611
    b = np.cos(np.arange(A.shape[0]))
    an = analyze(A)
    need = plan_for_memory(an, _needs(an), None).peak
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    sides = []
    real = sr._side_stream
    monkeypatch.setattr(sr, "_side_stream", lambda cp_: sides.append(real(cp_)) or sides[-1])
    xs = {}
    with pool_limited(need // 2) as (pool, _):
        for beside in (True, False, True):
            monkeypatch.setattr(solve, "STAGED_BESIDE", beside)
            before = len(sides)
            F = QRFactorization(A, backend="gpu")
            bi = F.info["backend_info"]
            assert F.info["backend"] == "gpu" and bi["stages"] > 1 and bi["host_fronts"], bi
            x = F.solve(b)
            solver = F._core.rank_decision()
            assert solver.method == "nullspace_cod" and solver.rank == 3611
            assert (len(sides) > before) == beside
            assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
            xs.setdefault(beside, x)
            F.free()
            del F, solver
            gc.collect()
    assert np.linalg.norm(xs[True] - xs[False]) <= 1e-10 * np.linalg.norm(xs[False])
    pool.free_all_blocks()
