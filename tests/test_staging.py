"""Staging under a real memory limit (host logic, NumPy device layer).

The NumPy device layer counts what the CUDA layer allocates and fails past its
``memory_limit`` like a limited CuPy pool, so the memory plan, the restaging
after out-of-memory and the CPU fallback run here without a GPU.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.gpu.device import NumpyDevice, pool_block
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.memory import (CHECK_CHUNK, POOL_USABLE, RESERVE, USABLE,
                                        DeviceMemory, GpuMemoryExhausted, available_bytes,
                                        front_needs, min_budget, min_budget_of_front,
                                        plan_for_memory, plan_need, solve_bytes,
                                        stage_bytes, vt_elements)
from scipy_gpuqr._errors import DeviceOutOfMemory, GpuFallbackWarning
from scipy_gpuqr._schedule.dense import dense_front_mask
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares, random_values)

TILE, BUNDLE = 32, 3


def _needs(an, dense_flops=None):
    dense = dense_front_mask(an, dense_flops)
    vt = vt_elements(an, tile=TILE, bundle=BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    return front_needs(an, 8, tile=TILE, vt_elems=vt, dense=dense)


def _one_stage_need(an, dense_flops=None):
    return plan_for_memory(an, _needs(an, dense_flops), None).peak


def _cases(big=False):
    rng = np.random.default_rng(7)
    out = [("grid7", random_values(grid3d_least_squares(7), rng)),
           ("chessboard", random_values(chessboard_boundary(4, 5, 2), rng))]
    if big:
        out.append(("randls", random_least_squares(3000, 1000, density=0.003, seed=3)))
    return out


def _limit(an, frac, dense_flops=None):
    """A limit ``1/frac`` of the way from the smallest plan to one stage (small
    problems' roots make the smallest plan a large share of one stage)."""
    need = _one_stage_need(an, dense_flops)
    floor = min_budget(an, _needs(an, dense_flops))
    return floor + (need - floor) // frac


# -- what the device has ------------------------------------------------------------------
class _Pool:
    def __init__(self, used, cached, limit):
        self.used, self.cached, self.limit = used, cached, limit

    def used_bytes(self):
        return self.used

    def free_bytes(self):
        return self.cached

    def get_limit(self):
        return self.limit


class _FakeCupy:
    """Just what :func:`available_bytes` reads."""

    def __init__(self, free, total, pool):
        runtime = type("R", (), {"memGetInfo": staticmethod(lambda: (free, total))})
        self.cuda = type("C", (), {"runtime": runtime})
        self._pool = pool

    def get_default_memory_pool(self):
        return self._pool


def test_available_bytes_reads_the_pool_limit_and_free_memory():
    gb = 1 << 30
    # no limit: free memory plus the pool's cached blocks, less the reserve
    m = available_bytes(_FakeCupy(40 * gb, 80 * gb, _Pool(3 * gb, 2 * gb, 0)))
    assert m.limited_by == "free device memory"
    assert m.available == int(USABLE * (42 * gb - RESERVE))
    assert m.detail["pool_cached"] == 2 * gb
    # a pool limit below: the limit less what the pool holds in use
    m = available_bytes(_FakeCupy(40 * gb, 80 * gb, _Pool(1 * gb, 2 * gb, 4 * gb)))
    assert m.limited_by == "pool limit"
    assert m.available == int(POOL_USABLE * 3 * gb)
    # another process took the device: free memory wins over a generous limit
    m = available_bytes(_FakeCupy(1 * gb, 80 * gb, _Pool(0, 0, 60 * gb)))
    assert m.limited_by == "free device memory"
    assert m.available == int(USABLE * (gb - RESERVE))


# -- the plan ------------------------------------------------------------------------------
def test_plan_counts_every_buffer_of_a_stage():
    for name, A in _cases(big=True):
        an = analyze(A)
        needs = _needs(an)
        sched_vt = build_schedule(an, tile=TILE, bundle=BUNDLE, cache=False).vt_size
        # the VT pool is exact (it does not depend on the plan), the maps too
        fs = an.fronts
        assert needs.fixed == sched_vt * 8 + (len(fs.rimap) + len(fs.rjmap)) * 8, name
        for frac in (1, 2, 4, 1000):
            available = _limit(an, frac)
            mp = plan_for_memory(an, needs, available)
            assert mp.feasible and mp.peak <= available, (name, frac)
            sched = build_schedule(an, tile=TILE, bundle=BUNDLE, plan=mp.plan, cache=False)
            exact = stage_bytes(sched, an, needs, 8)
            # the schedule's pools (carried blocks included) and records are within the plan
            assert all(e <= p for e, p in zip(exact, mp.need)), (name, frac, exact, mp.need)
            # and every stage holds at least its fronts and S entries
            for st, e in zip(sched.stages, exact):
                a, b = st.fronts
                assert e >= st.pool_size * 8 + int(np.diff(fs.s_ptr)[a:b + 1].sum()) * 16


def test_smallest_plan_is_the_largest_single_front_stage():
    A = _cases()[0][1]
    an = analyze(A)
    needs = _needs(an)
    floor = min_budget(an, needs)
    assert plan_for_memory(an, needs, floor).feasible
    below = plan_for_memory(an, needs, floor - 1)
    assert not below.feasible and below.oversized
    # a stage per front at the floor or close to it; never more stages than fronts
    assert plan_for_memory(an, needs, floor).plan.nstages <= an.fronts.nfronts
    # the analysis' forced stages (max_gpu_memory) still split the memory plan
    forced = an.stage_plan(20000)
    mp = plan_for_memory(an, needs, 10 * floor, max_gpu_memory=20000)
    starts = {a for a, _ in mp.plan.stages}
    assert {a for a, _ in forced.stages} <= starts


def test_no_limit_keeps_the_analysis_plan():
    A = _cases()[0][1]
    an = analyze(A)
    for budget in (None, 20000):
        mp = plan_for_memory(an, _needs(an), None, budget)
        assert mp.plan.stages == an.stage_plan(budget).stages
        assert mp.need == plan_need(an, _needs(an), mp.plan)


# -- the engine under a limit ---------------------------------------------------------------
@pytest.mark.parametrize("frac", [2, 4, 8])
def test_staged_under_a_device_limit_matches_the_unlimited_run(frac):
    for name, A in _cases():
        an = analyze(A)
        ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
        limit = _limit(an, frac)
        dev = NumpyDevice(TILE, BUNDLE, memory_limit=limit)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            g = gpu_factorize(A, an, device=dev, dense_flops=None)
        assert g.info["backend"] == "gpu" and g.info["restaged"] == 0, name
        assert g.info["stages"] > 1, (name, frac)
        assert dev.peak <= limit, (name, frac, dev.peak, limit)
        mem = g.info["memory"]
        assert mem["limited_by"] == "device limit" and mem["planned_peak"] <= limit
        assert dev.peak <= mem["planned_peak"], (name, frac)
        scale = abs(ref.R).max()
        assert abs(g.R - ref.R).max() <= 1e-12 * scale, (name, frac)
        b = np.cos(np.arange(A.shape[0]))
        np.testing.assert_allclose(g.qt_matmul(b), ref.qt_matmul(b), rtol=0,
                                   atol=1e-12 * np.linalg.norm(b))
        g.free()
        assert dev.held == 0


def test_dense_fronts_are_counted_under_a_limit():
    A = random_values(grid3d_least_squares(7), np.random.default_rng(1))
    an = analyze(A)
    tiny = 1e5                         # some fronts are dense fronts
    assert dense_front_mask(an, tiny).any()
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=tiny)
    limit = _limit(an, 3, tiny)
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=limit)
    g = gpu_factorize(A, an, device=dev, dense_flops=tiny)
    assert g.info["restaged"] == 0 and g.info["stages"] > 1 and dev.peak <= limit
    assert g.info["dense_fronts"] > 0
    assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()


class _Liar(NumpyDevice):
    """Reports more memory than it has (as another process taking memory meanwhile)."""

    def memory(self):
        return DeviceMemory(4 * self.memory_limit, "free device memory")


def test_out_of_memory_during_a_run_restages_and_frees_everything():
    A = _cases()[0][1]
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    limit = _limit(an, 3)
    dev = _Liar(TILE, BUNDLE, memory_limit=limit)
    g = gpu_factorize(A, an, device=dev)
    assert g.info["backend"] == "gpu" and g.info["restaged"] >= 1
    assert g.info["memory"]["out_of_memory"] and g.info["memory"]["limited_by"].startswith(
        "restaged")
    assert dev.peak <= limit
    assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()
    g.free()
    assert dev.held == 0


def test_impossible_on_the_gpu_falls_back_to_the_cpu_truthfully():
    A = _cases()[0][1]
    an = analyze(A)
    floor = min_budget(an, _needs(an))
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=floor - 1)
    with pytest.warns(GpuFallbackWarning, match="alone needs more device memory"):
        g = gpu_factorize(A, an, device=dev)
    assert g.info["backend"] in ("cpu", "reference")
    assert g.info["requested_backend"] == "gpu"
    assert "device memory" in g.info["fallback"] and g.info["fallback_ran"]
    assert dev.held == 0 and dev.launches == 0
    # the same R up to the rows' signs (same column order)
    d = np.sign(ref.R.diagonal()) * np.sign(g.R.diagonal())
    Rg = sp.diags(d) @ sp.csr_array(g.R)
    assert abs(Rg - ref.R).max() <= 1e-10 * abs(ref.R).max()
    with pytest.raises(GpuMemoryExhausted):
        gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=floor - 1),
                      fallback=False)
    # a device that always runs out falls back after restaging, with the reason
    with pytest.warns(GpuFallbackWarning, match="out of memory"):
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, fail_after=0))
    assert g.info["backend"] in ("cpu", "reference") and "out of memory" in g.info["fallback"]


def test_public_call_reports_what_ran(monkeypatch):
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._dispatch import plan as _dispatch

    A = _cases()[0][1]
    an = analyze(A)
    floor = min_budget(an, _needs(an))

    def factorize(A, analysis=None, **kw):
        return gpu_factorize(A, analysis, device=NumpyDevice(TILE, BUNDLE,
                                                             memory_limit=floor - 1), **kw)
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (factorize, "ok"))
    b = np.cos(np.arange(A.shape[0]))
    with pytest.warns(GpuFallbackWarning):
        F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    xr = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - xr) <= 1e-9 * np.linalg.norm(xr)
    info = F.info
    assert info["backend"] != "gpu" and info["backend_info"]["requested_backend"] == "gpu"
    assert any("fell back" in r for r in info["reasons"])


def test_check_chunk_is_a_bound_not_a_floor():
    # a small problem's smallest plan is far below the check's chunk
    A = _cases()[0][1]
    an = analyze(A)
    assert min_budget(an, _needs(an)) < CHECK_CHUNK


def test_device_layer_raises_past_its_limit():
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=1000)
    with pytest.raises(DeviceOutOfMemory):
        dev.start(np.zeros(200, dtype=np.int64), 10)


def test_solves_needs_decide_where_the_last_pool_stays(monkeypatch):
    """Under a limit the last stage's pool goes to the host too when it would not
    fit beside an uploaded one (the solves upload one stage pool at a time); the
    factors answer the same either way."""
    import dataclasses

    from scipy_gpuqr._engine.gpu import driver
    A = _cases()[0][1]
    an = analyze(A)
    needs = _needs(an)
    mp = plan_for_memory(an, needs, _limit(an, 8))
    sched = build_schedule(an, tile=TILE, bundle=BUNDLE, plan=mp.plan)
    assert len(sched.stages) > 1
    pools = [st.pool_size * 8 for st in sched.stages]
    base = needs.fixed + solve_bytes(an, sched)
    rk = an.fronts.frank.astype(np.int64)
    side = [int((rk[a:b + 1] ** 2).max()) * 8 for a, b in (st.fronts for st in sched.stages)]
    per = [p + s_ for p, s_ in zip(pools, side)]
    both = base + pools[-1] + max(per[:-1])
    alone = base + max(per)
    stage = needs.fixed + max(stage_bytes(sched, an, needs, 8))

    def check(available):
        return driver._memory_checks(an, sched, dataclasses.replace(mp, available=available),
                                     needs, 8)
    assert check(max(both, stage))[0]
    if both - 1 >= stage:               # the last pool alone does not fit beside another
        assert not check(both - 1)[0]
    for av in (stage - 1000, alone - 1000):     # the stage's count first, then the solves'
        with pytest.raises(driver._PlanOver) as exc:
            check(av)
        assert exc.value.excess == (stage - av if av < stage else alone - av)
    # the engine with the last pool sent to the host answers the same
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    monkeypatch.setattr(driver, "_memory_checks", lambda *a, **k: (False, False))
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 8)))
    assert g.info["stages"] > 1 and not g.info["last_pool_on_device"] and not g._stage_pools
    b = np.cos(np.arange(A.shape[0]))
    np.testing.assert_allclose(g.qt_matmul(b), ref.qt_matmul(b), rtol=0,
                               atol=1e-12 * np.linalg.norm(b))
    assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()


def test_dense_fronts_left_on_the_host_are_uploaded_per_use():
    from scipy_gpuqr._engine.dense_front import factorize_numpy, panels_of
    from scipy_gpuqr._engine.gpu.driver import _UploadedDense

    class _Xp:                          # a device array module: copies on asarray
        __name__ = "devicexp"

        @staticmethod
        def asarray(a):
            return np.array(a)

    rng = np.random.default_rng(0)
    F = rng.standard_normal((12, 5))
    panels = panels_of(12, 5, None, 4)
    T = factorize_numpy(F, panels, 4)
    d = _UploadedDense(F, panels, T)
    one, two = d._get(d._front, _Xp), d._get(d._front, _Xp)
    assert one is not two and "devicexp" not in d._front and "devicexp" not in d._T
    assert d._get(d._front, np) is F


# -- host fronts: a dense front that alone exceeds the device -------------------------------
_HOST_FLOPS = 1e6               # grid 8³'s largest fronts are dense fronts


def _host_case():
    A = random_values(grid3d_least_squares(8), np.random.default_rng(7))
    an = analyze(A)
    needs = _needs(an, _HOST_FLOPS)
    assert needs.hostable is not None and needs.hostable.any()
    return A, an, needs


def test_plan_puts_a_dense_front_too_large_alone_on_the_host():
    A, an, needs = _host_case()
    floor, floor_all = min_budget(an, needs), min_budget(an, needs, host=False)
    assert floor < floor_all
    mp = plan_for_memory(an, needs, floor)
    assert mp.feasible and mp.host
    for f in mp.host:
        assert needs.hostable[f]
        assert min_budget_of_front(an, needs, f) > floor       # it alone does not fit
    hs = mp.host_stages()
    assert sorted(hs.values()) == sorted(mp.host)
    for sid, f in hs.items():
        assert mp.plan.stages[sid] == (f, f) and mp.need[sid] == 0
    # every front in exactly one stage, in postorder
    flat = [f for a, b in mp.plan.stages for f in range(a, b + 1)]
    assert flat == list(range(an.fronts.nfronts))
    assert mp.need == plan_need(an, needs, mp.plan, mp.host)
    assert all(b <= floor - needs.fixed for b in mp.need)
    # without host fronts the same budget is infeasible
    assert not plan_for_memory(an, needs, floor, host=False).feasible
    # the fronts that alone fit stay on the device
    big = max(min_budget_of_front(an, needs, f) for f in mp.host)
    assert not plan_for_memory(an, needs, big).host


@pytest.mark.parametrize("where", ["floor", "between"])
def test_front_too_large_for_the_device_runs_on_the_host(where, monkeypatch):
    A, an, needs = _host_case()
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=_HOST_FLOPS)
    assert not ref.info["host_fronts"]
    floor = min_budget(an, needs)
    alone = sorted(min_budget_of_front(an, needs, f) for f in np.flatnonzero(needs.hostable))
    limit = floor if where == "floor" else (alone[-1] + alone[-2]) // 2
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=limit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no CPU fallback
        g = gpu_factorize(A, an, device=dev, dense_flops=_HOST_FLOPS)
    info = g.info
    assert info["backend"] == "gpu" and "fallback" not in info
    hf = info["host_fronts"]
    assert hf and dev.peak <= limit
    fs = an.fronts
    for h in hf:
        f = h["front"]
        assert h["shape"] == [int(fs.fm[f]), int(fs.fn[f])]
        assert h["device_bytes_alone"] > info["memory"]["available"]
        assert "host" in h["why"]
        # factorized on the host, not on the device layer
        assert all(fn_ != int(fs.fn[f]) or fm_ != int(fs.fm[f]) for _, fm_, fn_ in dev.dense_done)
    if where == "between":
        assert [h["front"] for h in hf] == [int(np.argmax(
            [min_budget_of_front(an, needs, f) for f in range(fs.nfronts)]))]
    assert info["seconds"]["host_fronts"] > 0
    # the same factorization within rounding: R's Gram matrix, Q R = A P, Qᵀ, the solves
    R0, R1 = ref.R.toarray(), g.R.toarray()
    scale = np.abs(R0).max() ** 2
    assert np.abs(R0.T @ R0 - R1.T @ R1).max() <= 1e-12 * scale
    assert np.abs(R0 - R1).max() <= 1e-10 * np.abs(R0).max()
    m, n = A.shape
    QR = g.q_matmul(np.vstack([R1, np.zeros((m - R1.shape[0], n))]))
    AP = A.toarray()[:, g.colperm]
    assert np.abs(QR - AP).max() <= 1e-12 * np.abs(AP).max() * m
    b = np.cos(np.arange(m))
    np.testing.assert_allclose(g.qt_matmul(b), ref.qt_matmul(b), rtol=0,
                               atol=1e-12 * np.linalg.norm(b))
    np.testing.assert_allclose(g.q_matmul(g.qt_matmul(b)), b, rtol=0,
                               atol=1e-12 * np.linalg.norm(b))
    g.free()
    assert dev.held == 0
    # the public call's solve under the same limit, against the unlimited one's
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._dispatch import plan as _dispatch

    def factorize(A, analysis=None, **kw):
        kw["dense_flops"] = _HOST_FLOPS
        return gpu_factorize(A, analysis, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                             **kw)
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (factorize, "ok"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F = QRFactorization(A, backend="gpu")
    assert F.info["backend"] == "gpu" and F.info["backend_info"]["host_fronts"]
    x = F.solve(b)
    xr = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    np.testing.assert_allclose(x, xr, rtol=0, atol=1e-10 * np.linalg.norm(xr))


def test_host_dense_front_applies_a_device_block_on_the_host():
    from scipy_gpuqr._engine.dense_front import HostDenseFront, factorize_numpy, panels_of

    class _DeviceBlock(np.ndarray):     # what HostDenseFront reads of a CuPy block
        def get(self):
            return np.array(self)

        def set(self, a):
            self[...] = a

    rng = np.random.default_rng(1)
    F = rng.standard_normal((20, 7))
    panels = panels_of(20, 7, None, 4)
    T = factorize_numpy(F, panels, 4)
    d = HostDenseFront(F, panels, T)
    Y = rng.standard_normal((20, 3))
    Yd = Y.copy().view(_DeviceBlock)
    d.apply_qt(Yd)
    ref = Y.copy()
    d.apply_qt(ref)
    np.testing.assert_array_equal(np.asarray(Yd), ref)
    d.apply_q(Yd)
    np.testing.assert_allclose(np.asarray(Yd), Y, atol=1e-13)
    assert set(d._front) == {"numpy"} and set(d._T) == {"numpy"}


def test_pinned_pool_cap_is_a_share_of_host_memory():
    """Stage pools sent to the host are pinned up to a share of the physical memory."""
    import os

    from scipy_gpuqr._engine.gpu.device import PINNED_POOL_SHARE, pinned_pool_cap
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < pinned_pool_cap() <= total
    assert pinned_pool_cap() == int(PINNED_POOL_SHARE * total)


def test_dense_cod_steps_to_the_host_when_the_device_runs_out(monkeypatch):
    """A rank decision whose dense COD runs out of device memory (a pool limit the
    estimate missed) decides on the host instead, with lstsq's rank and answer."""
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._factor import lstsq as _lstsq

    freed = []

    def _out_of_memory(R, xp):
        raise MemoryError("out of memory allocating the dense copy of R")

    rng = np.random.default_rng(7)
    A = sp.random_array((80, 50), density=0.15, rng=rng, format="csc")
    A = sp.hstack([A, A[:, :5] + A[:, 5:10]], format="csc")      # rank deficient by 5
    b = rng.standard_normal(80)
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 10)
    monkeypatch.setattr(_lstsq.MinNormSolver, "_dense_cod_device", lambda self: "gpu")
    monkeypatch.setattr(_lstsq, "dense_from_sparse", _out_of_memory)
    monkeypatch.setattr(_lstsq, "_free_device_pool", lambda: freed.append(1))
    F = QRFactorization(A)
    x = F.solve(b)
    decision = F.info["rank_decision"]
    assert (decision["method"], decision["device"]) == ("dense_cod", "cpu")
    assert freed == [1]                 # the device's cached blocks given back first
    assert F.rank == np.linalg.matrix_rank(A.toarray())
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_host_stage_assembly_compiled_equals_numpy(monkeypatch):
    """A host stage's Pack-Assemble records run compiled on threads
    (``native.pack``) give the factorization the NumPy records give, bit for bit."""
    from scipy_gpuqr._schedule import native
    A, an, needs = _host_case()
    limit = min_budget(an, needs)
    Rs = {}
    for how in ("numpy", "c"):
        monkeypatch.setenv(native.ENV, how)
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                          dense_flops=_HOST_FLOPS)
        assert g.info["host_fronts"]
        Rs[how] = g.R.toarray()
    np.testing.assert_array_equal(Rs["c"], Rs["numpy"])


def test_host_stage_carried_blocks_placed_as_their_stages_end(monkeypatch):
    """The contribution blocks a host front receives from device stages go into its
    stage's pool as their own stages end (``place_upper``: their upper
    trapezoids only, the entries below set to NaN on the NumPy layer), the
    rest of the pool zeroed up to them only: the same R, bit for bit, as
    copying them in at the host stage's start; and a placement one element
    off gives another R. (After their stages: ``place_early`` placing none.)"""
    from scipy_gpuqr._engine.gpu import stage_loop
    monkeypatch.setattr(stage_loop.StageLoop, "place_early", lambda self, st, down: None)
    A, an, needs = _host_case()
    limit = min_budget(an, needs)
    calls = []
    real = stage_loop.place_upper

    def counted(device, pool, blocks, out):
        calls.append(len(blocks))
        return real(device, pool, blocks, out)
    monkeypatch.setattr(stage_loop, "place_upper", counted)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                      dense_flops=_HOST_FLOPS)
    assert g.info["host_fronts"] and sum(calls) > 0
    sched = g.schedule
    hosted = [sched.stages[sid] for sid in g._host_stages]
    assert any(stage_loop._zero_end(an.fronts, st) < st.pool_size for st in hosted)
    placed = g.R.toarray()
    monkeypatch.setattr(stage_loop.StageLoop, "place_in_host_stages",
                        lambda self, st, pool, device, later: later)
    copied = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                           dense_flops=_HOST_FLOPS).R.toarray()
    np.testing.assert_array_equal(placed, copied)

    def off_by_one(device, pool, blocks, out):
        # one element before (a block may end its pool: one after would pass its end)
        return real(device, pool, [(a - 1 if a else a + 1, m, w, n, at)
                                   for a, m, w, n, at in blocks], out)
    monkeypatch.undo()
    monkeypatch.setattr(stage_loop.StageLoop, "place_early", lambda self, st, down: None)
    monkeypatch.setattr(stage_loop, "place_upper", off_by_one)
    wrong = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                          dense_flops=_HOST_FLOPS).R.toarray()
    assert np.abs(wrong - placed).max() > 1e-6 * np.abs(placed).max()


@pytest.mark.parametrize("rows", [1, 3, 256])
def test_upper_pieces_cover_each_blocks_upper_trapezoid(rows):
    """``upper_pieces``: every entry (i, j), j >= i, of each block (wide, tall,
    square, one row) reaches its place in the target, nothing beyond the
    block's rows there, and what it sends below the diagonal stays within
    ``rows`` of it; ``place_upper`` on the NumPy layer leaves NaN below."""
    from scipy_gpuqr._engine.gpu.pool_copy import place_upper, upper_pieces
    blocks = [(3, 5, 9, 12, 0), (70, 11, 4, 6, 45), (150, 1, 7, 7, 89), (160, 6, 6, 8, 96)]
    pool = np.arange(1.0, 260.0)
    out = np.full(132, -1.0)
    for s, h, w, sstep, d, dstep in upper_pieces(blocks, rows):
        for r in range(h):
            out[d + r * dstep: d + r * dstep + w] = pool[s + r * sstep: s + r * sstep + w]
    for a, m, w, n, at in blocks:
        got = out[at: at + m * w].reshape(m, w)
        src = np.lib.stride_tricks.as_strided(pool[a:], shape=(m, w), strides=(n * 8, 8))
        i, j = np.indices((m, w))
        np.testing.assert_array_equal(got[j >= i], src[j >= i])
        sent = got != -1.0
        assert np.all((i - j)[sent] < rows)
    placed = np.zeros(132)
    assert place_upper(None, pool, blocks, placed, rows) is None
    for a, m, w, n, at in blocks:
        got = placed[at: at + m * w].reshape(m, w)
        src = np.lib.stride_tricks.as_strided(pool[a:], shape=(m, w), strides=(n * 8, 8))
        i, j = np.indices((m, w))
        np.testing.assert_array_equal(got[j >= i], src[j >= i])
        assert np.isnan(got[j < i - rows + 1]).all()
    with pytest.raises(ValueError):
        place_upper(None, pool, [(250, 2, 9, 12, 0)], placed, rows)


def test_host_pool_zeroed_up_to_carried_blocks_that_fill_it():
    """A host stage's pool is zeroed only up to its carried blocks where they fill
    the rest of it without a gap; a gap, or blocks short of the end: all of it."""
    from scipy_gpuqr._engine.gpu.stage_loop import _zero_end
    fs = types.SimpleNamespace(cm=np.array([2, 3, 1]), fn=np.array([5, 4, 6]),
                               fp=np.array([1, 2, 3]))      # blocks of 8, 6 and 3
    st = types.SimpleNamespace(carried={0: 100, 1: 108, 2: 114}, pool_size=117)
    assert _zero_end(fs, st) == 100
    assert _zero_end(fs, types.SimpleNamespace(carried={0: 100, 1: 109, 2: 115},
                                               pool_size=118)) == 118
    assert _zero_end(fs, types.SimpleNamespace(carried={0: 100}, pool_size=117)) == 117
    assert _zero_end(fs, types.SimpleNamespace(carried={}, pool_size=50)) == 50


def test_staged_solves_keep_rows_within_one_shared_budget():
    """The stages' uploaded rows of R stay on the device only within one budget for
    all stages (each stage asking against what is left would keep most of it)."""
    from scipy_gpuqr._engine.gpu.trsolve import _KeepBudget
    keep = _KeepBudget(100)
    assert keep.take(60)
    assert not keep.take(50)        # refused: the rows are uploaded for each solve
    assert keep.take(40) and keep.left == 0


def test_panel_rows_follow_the_memory_and_stay_in_range():
    from scipy_gpuqr._engine.gpu.trsolve import STREAM_MIN_ROWS, _panel_rows
    assert _panel_rows(1000, 800, 24 * 1000 * 400 * 4) == 400   # a quarter for 3 copies
    assert _panel_rows(1000, 800, 1 << 40) == 800                # never past the front
    assert _panel_rows(1000, 800, 0) == STREAM_MIN_ROWS
    assert _panel_rows(1000, 10, 0) == 10
    assert 1 <= _panel_rows(10 ** 6, 5000, None) <= 5000


def test_host_stage_check_skips_only_what_the_device_checked():
    """A host front factorized on the GPU was checked there (its span in
    ``device_checked``): end_stage reads the rest of the pool, not the span,
    and refuses a span the device found non-finite."""
    from scipy_gpuqr._engine.gpu.device import GpuEngineError, HostFrontDevice
    dev = HostFrontDevice(32, 1)
    pool = np.zeros(1000)
    pool[500] = np.nan                                   # inside the checked span
    h = {"pool": pool, "device_checked": [(400, 700, True)]}
    assert dev.end_stage(h) is pool
    pool[900] = np.inf                                   # outside it
    with pytest.raises(GpuEngineError, match="front pool"):
        dev.end_stage(h)
    pool[900] = 0.0
    with pytest.raises(GpuEngineError, match="on the device"):
        dev.end_stage({"pool": pool, "device_checked": [(400, 700, False)]})
    with pytest.raises(GpuEngineError, match="front pool"):
        dev.end_stage({"pool": pool})                    # nothing checked: all read
    # the carried blocks after the fronts (from checked stages) are not read again
    assert dev.end_stage({"pool": pool, "fronts_end": 600,
                          "device_checked": [(400, 700, True)]}) is pool
    pool[300] = np.nan                                   # a front's value, unchecked
    with pytest.raises(GpuEngineError, match="front pool"):
        dev.end_stage({"pool": pool, "fronts_end": 600, "device_checked": [(400, 700, True)]})


def test_fronts_the_time_model_keeps_but_no_stage_fits_become_host_fronts(monkeypatch):
    """Under the dense-front time model a front too large for any stage is a tile
    front (no plan, the CPU would answer); the engine then takes dense fronts by
    size (STAGED_DENSE_FLOPS) and runs the too-large one on the host instead."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._schedule.dense import DENSE_RULE
    A, an, needs = _host_case()
    floor = min_budget(an, needs)
    assert not plan_for_memory(an, _needs(an, DENSE_RULE), floor).feasible
    monkeypatch.setattr(driver, "STAGED_DENSE_FLOPS", _HOST_FLOPS)
    monkeypatch.setattr(driver, "STAGED_DENSE", "size")
    dev = NumpyDevice(TILE, BUNDLE, memory_limit=floor)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no CPU fallback
        g = gpu_factorize(A, an, device=dev, dense_flops=DENSE_RULE)
    assert g.info["backend"] == "gpu" and g.info["host_fronts"] and dev.peak <= floor
    assert g.info["dense_flops"] == _HOST_FLOPS
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=_HOST_FLOPS)
    R0, R1 = ref.R.toarray(), g.R.toarray()
    assert np.abs(R0.T @ R0 - R1.T @ R1).max() <= 1e-12 * np.abs(R0).max() ** 2


def test_only_the_fronts_no_stage_fits_become_dense(monkeypatch):
    """``STAGED_DENSE = "oversized"`` (the default): the time model's dense fronts
    stay as they are and only the fronts that fit no stage (round by round:
    fewer tile fronts also make the fixed VT pool smaller) become dense fronts,
    the largest run on the host: fewer than by size, R as the unlimited run's.
    Near the smallest plan the rounds cascade (every front of grid 8³ at the
    by-size plan's floor): more than by size, so by size instead. A front that
    cannot be dense leaves no plan (None); an unknown setting is refused."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._schedule.dense import DENSE_RULE
    A, an, needs = _host_case()
    floor = min_budget(an, needs)
    mid = (floor + min_budget(an, _needs(an, DENSE_RULE), host=False)) // 2
    monkeypatch.setattr(driver, "STAGED_DENSE_FLOPS", _HOST_FLOPS)
    assert driver.STAGED_DENSE == "oversized"
    by_size = int(dense_front_mask(an, _HOST_FLOPS).sum())
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=_HOST_FLOPS)
    R0 = ref.R.toarray()
    for limit, oversized in ((mid, True), (floor, False)):
        assert not plan_for_memory(an, _needs(an, DENSE_RULE), limit).feasible
        dev = NumpyDevice(TILE, BUNDLE, memory_limit=limit)
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # no CPU fallback
            g = gpu_factorize(A, an, device=dev, dense_flops=DENSE_RULE)
        assert g.info["backend"] == "gpu" and g.info["host_fronts"] and dev.peak <= limit
        if oversized:
            assert g.info["dense_flops"] == DENSE_RULE
            assert int(dense_front_mask(an, DENSE_RULE).sum()) < g.info["dense_fronts"] < by_size
        else:
            assert g.info["dense_flops"] == _HOST_FLOPS and g.info["dense_fronts"] == by_size
        R1 = g.R.toarray()
        assert np.abs(R0.T @ R0 - R1.T @ R1).max() <= 1e-12 * np.abs(R0).max() ** 2
    import types
    fake = types.SimpleNamespace(fronts=types.SimpleNamespace(fm=np.array([5, 0, 9]),
                                                              fn=np.array([4, 4, 4])))
    over = types.SimpleNamespace(oversized=(1, 2))
    assert driver._oversized_dense(fake, lambda ex: None, over, floor, None) is None
    with pytest.raises(ValueError, match="STAGED_DENSE"):
        monkeypatch.setattr(driver, "STAGED_DENSE", "bogus")
        gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=floor),
                      dense_flops=DENSE_RULE)


def test_kept_rows_of_r_take_a_share_of_the_available_memory():
    from scipy_gpuqr._engine.gpu.trsolve import KEEP_SHARE, keep_bytes
    assert keep_bytes(None) == 0                    # no limit known: nothing kept
    assert keep_bytes(1000) == int(KEEP_SHARE * 1000) and 0 < KEEP_SHARE < 1


def test_release_kept_drops_the_rows_of_r_kept_between_solves():
    """A solve out of device memory first drops the stages' kept rows of R (they
    are uploaded per solve from then on: the shared budget keeps nothing more)."""
    from scipy_gpuqr._engine.gpu.trsolve import FrontTriangular, _KeepBudget, _StageRows
    budget = _KeepBudget(1000)
    rows = []
    for kept in ("device rows", None):
        r = _StageRows.__new__(_StageRows)
        r._kept, r._keep = kept, budget
        rows.append(r)
    ft = FrontTriangular.__new__(FrontTriangular)
    ft.pools = None                                  # no first pack of Q to let go
    ft._stages = [(0, [0], "kernel", rows[0]), (1, [1], "kernel", rows[1]),
                  (2, [2], "kernel", None)]          # a pool kept whole: nothing to drop
    assert ft.release_kept()
    assert all(r._kept is None for r in rows) and not budget.take(1)
    assert not ft.release_kept()
    ft._stages = None                                # host solves (NumPy): no stages
    assert not ft.release_kept()


def test_q_out_of_memory_drops_the_kept_rows_of_r_and_the_last_pool():
    """``Q``'s device replay out of memory makes room before it gives up on the
    device, cheapest to lose first: the rows of R the solves keep (known to the
    factorization weakly), then the device copies of dense fronts and the last
    stage's pool (to the host); nothing left to free: None (the host replays
    ``Q``)."""
    import types
    import weakref

    from scipy_gpuqr._engine.gpu.solve import _make_room
    calls = []

    class Solves:
        def __init__(self, kept):
            self.kept = kept

        def release_kept(self):
            calls.append("rows")
            kept, self.kept = self.kept, False
            return kept

    class Dense:
        def __init__(self):
            self.copy = True

        def has_device_copy(self):
            return self.copy

        def drop_device(self):
            calls.append("dense")
            self.copy = False

    pool = types.SimpleNamespace(free_all_blocks=lambda: calls.append("free"))
    cp = types.SimpleNamespace(get_default_memory_pool=lambda: pool)
    gone = Solves(True)
    solves = [Solves(True), gone]
    pending = [True]

    def pools_to_host():
        calls.append("pools")
        had, pending[0] = pending[0], False
        return had
    qr = types.SimpleNamespace(pools_to_host=pools_to_host, _dense={3: Dense()},
                               _device=types.SimpleNamespace(cp=cp),
                               _replay={"kept_rows": [weakref.ref(s) for s in solves]})
    del solves[1], gone                       # a solve object already collected
    assert "rows of R" in _make_room(qr) and calls == ["rows", "free"]
    calls.clear()
    assert "pools" in _make_room(qr) and calls == ["rows", "dense", "pools", "free"]
    calls.clear()
    assert _make_room(qr) is None and calls == ["rows", "pools", "free"]  # nothing left


def test_r_solves_out_of_memory_go_in_column_blocks():
    """A device solve of R that runs out of memory drops the kept rows once, then
    halves its block of columns down to one column before the host's solves are
    needed (None); the blocks' answers are the whole solve's."""
    import types

    from scipy_gpuqr._factor.factored import _solve_in_column_blocks

    class Dev(np.ndarray):                 # stands for a CuPy array (``get``)
        def get(self):
            return np.asarray(self).copy()

    freed = []
    cp = types.SimpleNamespace(
        ndarray=Dev, asarray=lambda X, dtype=None: np.asarray(X, dtype=dtype).view(Dev),
        get_default_memory_pool=lambda: types.SimpleNamespace(
            free_all_blocks=lambda: freed.append(1)))
    U = np.triu(np.random.default_rng(3).standard_normal((6, 6))) + 6 * np.eye(6)
    seen = []

    def solve_upto(limit):
        def solve(C):
            seen.append(C.shape[1])
            if C.shape[1] > limit:
                raise MemoryError("out of memory")
            return np.linalg.solve(U, np.asarray(C)).view(Dev)
        return solve
    C = np.random.default_rng(4).standard_normal((6, 7))
    kept = [True]

    def release():
        had, kept[0] = kept[0], False
        return had
    Y = _solve_in_column_blocks(solve_upto(2), C, release, cp)
    assert type(Y) is np.ndarray and np.allclose(U @ Y, C)
    assert seen[:4] == [7, 7, 3, 1] and not kept[0] and freed
    seen.clear()
    Yd = _solve_in_column_blocks(solve_upto(7), C.view(Dev), None, cp)   # device in, out
    assert isinstance(Yd, Dev) and seen == [7] and np.allclose(U @ Yd, C)
    assert _solve_in_column_blocks(solve_upto(0), C, None, cp) is None
    assert np.allclose(U @ _solve_in_column_blocks(solve_upto(0), C[:, :0], None, cp), 0)


def test_stage_rows_uploaded_compactly_from_the_host_pool():
    """A stage's rows of R copied out of its host pool into one compact array (empty
    fronts included; fronts closer than ``ROWS_GAP`` in the pool in one copy, the
    gap with them), kept while the shared budget allows."""
    from scipy_gpuqr._engine.gpu import trsolve
    rng = np.random.default_rng(0)
    sizes = [0, 5, 1, 0, 17, 3, 100, 0, 7]
    gaps = [0, 3, trsolve.ROWS_GAP + 1, 40, trsolve.ROWS_GAP, 9, 2 * trsolve.ROWS_GAP, 0, 1]
    offs = np.cumsum(np.array(gaps) + np.array([0] + sizes[:-1]))
    pool = rng.standard_normal(int(offs[-1]) + sizes[-1] + 5)
    perm = [3, 0, 8, 1, 5, 2, 7, 4, 6]              # members not in pool order
    ft = types.SimpleNamespace(xp=np, fronts=[(0, int(offs[i]), 0, 1, sizes[i]) for i in perm])
    budget = trsolve._KeepBudget(10 ** 9)
    rows = trsolve._StageRows(ft, list(range(len(sizes))), pool, budget)
    up = rows.upload()
    for j, i in enumerate(perm):
        assert np.array_equal(up[rows.offsets[j]: rows.offsets[j] + sizes[i]],
                              pool[offs[i]: offs[i] + sizes[i]])
    runs = rows._runs
    assert len(runs) == 3           # two gaps beyond ROWS_GAP split the copies
    assert rows.total == sum(n for _, n, _ in runs) < pool.size
    assert rows.upload() is up and budget.left == 10 ** 9 - up.nbytes
    budget = trsolve._KeepBudget(rows.total * 8 - 1)
    other = trsolve._StageRows(ft, [4, 6], pool, budget)        # fits the budget: kept
    assert other.upload() is other._kept
    again = trsolve._StageRows(ft, list(range(len(sizes))), pool, budget)
    assert np.array_equal(again.upload(), up) and again._kept is None      # budget spent


def test_stage_rows_make_room_before_each_upload():
    """A stage's rows of R call their pools' ``before_upload`` (``Q``'s first stage
    sent up as the factorization ended and read by no replay yet is dropped
    there: :func:`~scipy_gpuqr._engine.gpu.solve.drop_first`) before each copy
    off the host pool, not when the rows are kept from an earlier solve; on the
    NumPy layer nothing is sent up early."""
    from scipy_gpuqr._engine.gpu import solve, trsolve
    pool = np.arange(40, dtype=np.float64)
    calls = []

    def pools(sid):
        return pool
    pools.before_upload = lambda nbytes: calls.append(len(calls)) or sizes.append(nbytes)
    sizes = []
    ft = types.SimpleNamespace(xp=np, pools=pools, fronts=[(0, 3, 0, 1, 5), (0, 20, 0, 1, 4)])
    rows = trsolve._StageRows(ft, [0, 1], pool, trsolve._KeepBudget(10 ** 9))
    up = rows.upload()
    assert calls == [0] and rows.upload() is up and calls == [0]        # kept: no call
    assert sizes == [8 * rows.total]            # the bytes to come, for the room they need
    rows = trsolve._StageRows(ft, [0, 1], pool, trsolve._KeepBudget(0))
    rows.upload()
    rows.upload()
    assert calls == [0, 1, 2]
    A = _cases()[0][1]
    an = analyze(A)
    for _ in range(2):
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
    assert g.info["stages"] > 1 and g.info["q_first_stage_early"] is None
    assert solve.prefetch_first(g) is None and not solve.drop_first(g)


@pytest.mark.parametrize("rk,fn", [(600, 700), (512, 512), (1000, 1000), (511, 900)])
def test_large_fronts_rows_of_r_go_up_as_their_upper_trapezoid(rk, fn, monkeypatch):
    """A front of ``TRAPEZOID_MIN_ROWS`` rows of R or more sends only its rows from
    their diagonal on (row blocks of ``TRAPEZOID_BLOCK``), in its place in the
    compact array; the fronts and gaps around it in its run go whole. Entries
    left of its diagonal may stay unset (NaN on the NumPy layer): every reader of
    the rows reads on and above the diagonal, so the solves with them equal
    those with the whole rows."""
    from scipy.linalg import solve_triangular

    from scipy_gpuqr._engine.gpu import trsolve
    monkeypatch.setattr(trsolve, "TRAPEZOID_BLOCK", 128)
    rng = np.random.default_rng(rk)
    small = (0, 11, 0, 13, 9)                       # 9 × 13 rows of a small front
    offs = [5, 5 + 9 * 13 + 50]                     # one run: a gap under ROWS_GAP
    big = (0, offs[1], 0, fn, rk)
    tail = (0, offs[1] + rk * fn + 7, 0, 4, 3)      # after the big front, same run
    ft = types.SimpleNamespace(xp=np, fronts=[(0, offs[0]) + small[2:], big, tail])
    pool = rng.standard_normal(tail[1] + 12 + 3)
    rows = trsolve._StageRows(ft, [0, 1, 2], pool, trsolve._KeepBudget(0))
    assert len(rows._runs) == 1
    up = rows.upload()
    for j, (_, off, _, n, r) in enumerate(ft.fronts):
        got = up[rows.offsets[j]: rows.offsets[j] + r * n].reshape(r, n)
        want = pool[off: off + r * n].reshape(r, n)
        upper = np.triu(np.ones((r, n), dtype=bool))
        assert np.array_equal(got[upper], want[upper]), j
        if j != 1 or rk < trsolve.TRAPEZOID_MIN_ROWS:
            assert np.array_equal(got, want), j             # whole
    sent = sum(w * h for _, _, w, h, _ in rows._copies)
    if rk >= trsolve.TRAPEZOID_MIN_ROWS:
        assert np.isnan(up).any() and sent <= rows.total - rk * (rk - 128) // 2
        # R's solves from the rows read the triangle only (scipy's check of
        # finite values would see the NaN below it otherwise)
        U = up[rows.offsets[1]: rows.offsets[1] + rk * fn].reshape(rk, fn)[:, :rk]
        c = rng.standard_normal(rk)
        Uw = np.triu(pool[offs[1]: offs[1] + rk * fn].reshape(rk, fn)[:, :rk]) + 30 * np.eye(rk)
        U = np.where(np.triu(np.ones((rk, rk), dtype=bool)), U + 30 * np.eye(rk), 0.0)
        assert np.array_equal(solve_triangular(U, c), solve_triangular(Uw, c))
    else:
        assert sent == rows.total and not np.isnan(up).any()


def test_rows_go_up_in_a_first_packs_room_only_where_they_need_it(monkeypatch):
    """R's rows uploaded before ``Q``'s replay read the first pack sent up as the
    factorization ended (the rank decision's block beside ``Qᵀb``) let that pack
    go only where they would not fit beside it; after the replay read it there
    is nothing to let go. A solve out of memory lets it go with the kept rows."""
    from scipy_gpuqr._engine.gpu import solve, trsolve
    dropped = []

    class Executor:
        _ahead = ("stage 0", "pack")

        def drop_first(self):
            ahead, self._ahead = self._ahead, None
            dropped.append(ahead)
            return ahead is not None

    fits = []
    monkeypatch.setattr(solve, "_prefetch_fits", lambda cp, nbytes: fits.append(nbytes)
                        or nbytes <= 100)
    qr = types.SimpleNamespace(_replay={"cupy": Executor()},
                               _device=types.SimpleNamespace(cp=None))
    assert not solve._room_for_rows(qr, 100) and not dropped          # fits beside it
    assert solve._room_for_rows(qr, 101) and dropped == [("stage 0", "pack")]
    assert not solve._room_for_rows(qr, 10 ** 9) and len(dropped) == 1 and fits == [100, 101]
    assert not solve._room_for_rows(types.SimpleNamespace(_replay={}), 1)   # no replay yet
    # the solves' out-of-memory path: kept rows and the pack both let go
    qr._replay["cupy"] = Executor()
    ft = trsolve.FrontTriangular.__new__(trsolve.FrontTriangular)
    ft.pools = types.SimpleNamespace(drop_first=lambda: solve.drop_first(qr))
    ft._stages = None
    assert ft.release_kept() and qr._replay["cupy"]._ahead is None
    assert not ft.release_kept()


def test_a_staged_decision_fetches_qtb_beside_its_first_block(monkeypatch):
    """``FactoredQR`` fetches ``Qᵀb`` beside the decision's first block for GPU
    factors on the device whole, and for staged ones (stage pools on the host)
    where ``solve.STAGED_BESIDE`` says so; never for factors off the device."""
    from scipy_gpuqr._engine.gpu import solve
    from scipy_gpuqr._factor.factored import FactoredQR
    F = FactoredQR.__new__(FactoredQR)
    for beside in (True, False):
        monkeypatch.setattr(solve, "STAGED_BESIDE", beside)
        for on_device, host_pools, want in ((True, {}, True), (True, {0: None}, beside),
                                            (False, {}, False), (False, {0: None}, False)):
            F.num = types.SimpleNamespace(on_device=lambda v=on_device: v,
                                          _host_pools=host_pools)
            assert F._beside() is want, (beside, on_device, host_pools)


def test_kept_rows_leave_room_for_the_replay_uploads():
    """The kept rows' budget leaves the largest packed reflector upload of ``Q``'s
    replay free (bounded as the memory checks bound it); one stage: nothing to
    leave."""
    from scipy_gpuqr._engine.gpu import solve, trsolve
    assert trsolve.keep_bytes(1000, 700) == 300 and trsolve.keep_bytes(1000, 2000) == 0
    assert trsolve.keep_bytes(1000, 100) == int(trsolve.KEEP_SHARE * 1000)
    A = _cases()[0][1]
    an = analyze(A)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
    from scipy_gpuqr._engine.gpu.reflector_upload import packed_size_bound
    fs = an.fronts
    want = 0
    for sid, st in enumerate(g.schedule.stages):
        if sid not in g._host_pools:
            continue
        f = np.flatnonzero(np.asarray(st.foff) >= 0)
        want = max(want, packed_size_bound(np.asarray(st.foff)[f], fs.fm[f], fs.fn[f],
                                           np.isin(f, list(st.dense)), TILE))
        # at least what the stage's packed layout really takes (the replay's buffer)
        layout = solve._reflector_layout_of(g, sid)
        assert trsolve.replay_upload_bytes(g) >= 8 * layout.size
    assert trsolve.replay_upload_bytes(g) == 8 * want > 0
    one = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    assert trsolve.replay_upload_bytes(one) == 0       # the pool stays on the device


def test_pools_sent_down_during_their_stage_are_exact(monkeypatch):
    """A warm staged run sends each retiring pool down in ranges as launches finish
    them (the NumPy layer copies each range right after its launch ran); R, Qᵀb,
    the crossing blocks and the dense fronts read from those copies equal the
    unlimited run's. A finality that claims the whole pool after launch 0 gives
    another R: the check sees stale ranges."""
    from scipy_gpuqr._engine.gpu import stage_loop
    for name, A in _cases(big=True):
        an = analyze(A)
        ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
        b = np.cos(np.arange(A.shape[0]))
        for _ in range(2):              # the second run's schedule is warm
            g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE,
                                                        memory_limit=_limit(an, 4)))
        sent = g.info["pool_ranges_sent_during_stages"]
        assert not g.info["schedule_cold"] and len(sent) == g.info["stages"] - 1, name
        assert max(sent) > 1, (name, sent)          # ranges before the stage's end
        assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max(), name
        np.testing.assert_allclose(g.qt_matmul(b), ref.qt_matmul(b), rtol=0,
                                   atol=1e-12 * np.linalg.norm(b))
    A = _cases()[0][1]
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
    real = stage_loop.front_finality

    def all_at_once(fs, st):
        fin = real(fs, st)
        return dataclasses.replace(fin, last=np.zeros_like(fin.last))
    monkeypatch.setattr(stage_loop, "front_finality", all_at_once)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
    assert g.info["pool_ranges_sent_during_stages"]
    assert abs(g.R - ref.R).max() > 1e-6 * abs(ref.R).max()


def test_front_finality_never_passes_a_later_write():
    """Each front's final launch is at or after every launch that writes it (its
    own records, its children's Pack-Assemble, the Pack-Assemble reading it);
    the fronts lie in the pool one after another, before its carried blocks.
    Each front has its own finality: some front is final before a front ahead
    of it in the pool (a late one does not hold back those after it)."""
    from scipy_gpuqr._engine.gpu import pool_copy
    from scipy_gpuqr._schedule.tasks import TaskType
    A = _cases()[0][1]
    an = analyze(A)
    sched = build_schedule(an, tile=TILE, bundle=BUNDLE, plan=an.stage_plan(100000))
    fs = an.fronts
    assert len(sched.stages) > 1
    ahead = 0
    for st in sched.stages:
        first, last = st.fronts
        fin = pool_copy.front_finality(fs, st)
        assert np.all(fin.start[1:] >= fin.end[:-1]) and fin.end[-1] <= st.pool_size
        assert np.all((fin.last >= 0) & (fin.last < max(st.nlaunch, 1)))
        ahead += int(np.any(fin.last[1:] < np.maximum.accumulate(fin.last)[:-1]))
        t = st.tasks
        launch = np.repeat(np.arange(st.nlaunch), np.diff(st.launch_ptr))
        front = t["front"].astype(np.int64)
        pack = t["type"] == TaskType.PACK_ASSEMBLE
        at = {int(a): i for i, a in enumerate(fin.start.tolist())}
        for f, L in zip(np.concatenate([front, fs.parent[front[pack]]]).tolist(),
                        np.concatenate([launch, launch[pack]]).tolist()):
            if first <= f <= last and int(st.foff[f]) in at:
                assert fin.last[at[int(st.foff[f])]] >= L, (st.fronts, f, L)
    assert ahead > 0


class _PoolExecutor:
    """The NumPy replay whose dense fronts are read in their stage's pool (as the
    CUDA executor reads them in its uploaded pools)."""

    xp = np

    def __init__(self, plan, pools, vt):
        from scipy_gpuqr._engine.gpu import solve
        self._levels = solve.NumpyExecutor(plan, pools, vt)
        self.stage_pool = pools

    def level(self, lv, X, trans):
        self._levels.level(lv, X, trans)

    def done(self):
        pass


@pytest.mark.parametrize("dense_flops,band", [(None, 512), (2e5, 512), (None, 32),
                                             (None, 64), (2e5, 32)])
def test_q_replay_reads_only_the_uploaded_reflector_columns(dense_flops, band):
    """The pieces of an earlier stage's pool that ``Q``'s replay uploads (its
    fronts' reflector columns in column bands, its dense fronts whole,
    :mod:`.reflector_upload`), packed into a buffer of their size with the
    stage's records pointed into it, hold everything the replay reads: Qᵀb and
    Q y equal the replay from the whole pools bit for bit; and large fronts
    send fewer elements than whole. Narrow bands (one or two tiles) cut the
    fronts into many bands, each record into the band holding its columns."""
    from scipy_gpuqr._engine.gpu import driver, solve
    from scipy_gpuqr._engine.gpu.reflector_upload import (reflector_layout, reflector_pieces,
                                                          upload_reflectors)
    dense_seen = blocked = 0
    several = False
    for name, A in _cases(big=True):
        an = analyze(A)
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)),
                          dense_flops=dense_flops)
        assert g.info["stages"] > 1
        g._materialize()
        plan = solve.plan_of(g)
        sent = 0
        uploaded = {}
        for sid, host in g._host_pools.items():
            whole = [(d.pool_at[1], d.shape[0] * d.shape[1]) for d in g._dense.values()
                     if getattr(d, "pool_at", (None,))[0] == sid]
            dense_seen += len(whole) * (sid < g.info["stages"] - 1)
            layout = reflector_layout(plan, sid, small=64, whole=whole, band=band)
            uploaded[sid] = upload_reflectors(host, layout, np)
            _, pieces = reflector_pieces(plan, sid, small=64, whole=whole, band=band)
            bands = Counter(b[4] for b in pieces)
            several = several or max(bands.values(), default=0) > 1
            assert uploaded[sid].values.size == layout.size
            # the memory plan's bound, from the fronts' shapes alone, holds
            st = g.schedule.stages[sid]
            assert driver._stage_upload_elements(an.fronts, st, TILE) >= layout.size, (name, sid)
            assert layout.size == (sum(n for _, n, _ in layout.runs)
                                   + sum(m * w for _, m, w, _, _ in layout.blocks))
            sent += layout.size
            blocked += len(layout.blocks)
        assert sent < sum(h.size for h in g._host_pools.values()), name
        rng = np.random.default_rng(1)
        for trans in (True, False):
            X = rng.standard_normal((A.shape[0], 2))
            Y = X.copy()
            solve.replay(plan, _PoolExecutor(plan, g._host_pools.__getitem__, g._vt), X, trans)
            solve.replay(plan, _PoolExecutor(plan, uploaded.__getitem__, g._vt), Y, trans)
            np.testing.assert_array_equal(X, Y)
    assert blocked > 0
    assert several or band > 64 or dense_flops    # narrow bands: a front in several
    assert dense_seen > 0 if dense_flops else dense_seen == 0


def test_replay_reads_each_stage_once_in_order():
    """The stages ``Q``'s replay reads, in its order (what the CUDA executor
    prefetches from): ``Qᵀ`` every stage with kept reflectors once, in order;
    ``Q`` the same reversed."""
    from scipy_gpuqr._engine.gpu import solve
    _, A = next(iter(_cases(big=True)))
    an = analyze(A)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
    assert g.info["stages"] > 2
    plan = solve.plan_of(g)
    fwd = solve.stage_sequence(plan, True)
    assert fwd == sorted(set(plan.level_stage.tolist())) and len(fwd) > 2
    assert solve.stage_sequence(plan, False) == fwd[::-1]
    empty = solve.ReplayPlan(m=0, tile=TILE, bundle=BUNDLE, records=plan.records[:0],
                             rowmap=plan.rowmap[:0], level_ptr=np.zeros(1, np.int64),
                             level_stage=np.zeros(0, np.int64))
    assert solve.stage_sequence(empty, True) == []


def test_reflector_band_ending_the_pool_is_packed():
    """A band whose last row ends where the host pool ends (shorter than a whole
    pitch) is packed as the 2-D copy reads it: ``rows`` rows of ``width``
    elements, ``pitch`` apart; a band reaching past the pool is refused."""
    from scipy_gpuqr._engine.gpu.reflector_upload import ReflectorLayout, upload_reflectors
    from scipy_gpuqr._schedule.tasks import TASK_DTYPE
    host = np.arange(10_000, dtype=np.float64)
    m, w, pitch = 30, 20, 300
    a = host.size - (m - 1) * pitch - w
    blocks = [(a, m, w, pitch, 5), (0, 4, 3, 7, 5 + m * w)]
    layout = ReflectorLayout([(100, 5, 0)], blocks, 5 + m * w + 12,
                             np.zeros(0, dtype=TASK_DTYPE), {})
    got = upload_reflectors(host, layout, np).values
    want = np.concatenate([host[100:105]]
                          + [host[a + i * pitch: a + i * pitch + w] for i in range(m)]
                          + [host[i * 7: i * 7 + 3] for i in range(4)])
    np.testing.assert_array_equal(got, want)
    past = ReflectorLayout([], [(a + 1, m, w, pitch, 0)], m * w, np.zeros(0, dtype=TASK_DTYPE), {})
    with pytest.raises(ValueError, match="past a pool"):
        upload_reflectors(host, past, np)


def test_reflector_layouts_are_kept_with_the_schedule():
    """A stage's packed reflector layout is made once per schedule and replay plan:
    a later factorization of the pattern under the same limit reads the same
    (read-only) layout, and its replay from it equals the host's."""
    from scipy_gpuqr._engine.gpu import solve
    from scipy_gpuqr._engine.gpu.reflector_upload import upload_reflectors
    A = _cases()[0][1]
    an = analyze(A)
    runs = [gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
            for _ in range(3)]
    g, h = runs[1], runs[2]             # warm schedules: the same object
    assert g.schedule is h.schedule
    away = [sid for sid in h._host_pools if sid not in getattr(h, "_host_stages", {})]
    assert away
    uploaded = {}
    for sid in away:
        a, b = solve._reflector_layout_of(g, sid), solve._reflector_layout_of(h, sid)
        assert a is b and not b.records.flags.writeable
        uploaded[sid] = upload_reflectors(h._host_pools[sid], b, np)
    h._materialize()
    plan = solve.plan_of(h)
    pools = {**h._host_pools, **uploaded}
    b = np.cos(np.arange(A.shape[0]))[:, None]
    X = b.copy()
    solve.replay(plan, _PoolExecutor(plan, pools.__getitem__, h._vt), X, True)
    np.testing.assert_allclose(X[h.qorder][:, 0], h.qt_matmul(b[:, 0]), rtol=0,
                               atol=1e-12 * np.linalg.norm(b))


def test_last_stage_copies_r_while_its_launches_run(monkeypatch):
    """A warm staged run's last stage copies its entries of R as launches finish
    them (:func:`~scipy_gpuqr._engine.gpu.rcopy.final_entries` over the stage's
    own entries; the NumPy layer copies each range right after its launch):
    the same R as unlimited. A finality that claims every entry after launch 0
    gives another R."""
    from scipy_gpuqr._engine.gpu import rcopy
    A = _cases(big=True)[2][1]
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    limit = _limit(an, 4)
    for _ in range(2):
        dev = NumpyDevice(TILE, BUNDLE, memory_limit=limit)
        g = gpu_factorize(A, an, device=dev)
    assert g.info["r_copy_progressive"] and len(dev.r_copies) > g.info["stages"] + 1
    assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()
    # every entry claimed final after launch 0
    from scipy_gpuqr._engine.gpu import stage_loop
    exact = rcopy.final_entries

    def at_once(analysis, layout, sched, stage, tile, key, pos=None):
        out = exact(analysis, layout, stage, tile, pos)
        out[:] = out[-1]
        return out
    monkeypatch.setattr(stage_loop, "final_entries_cached", at_once)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit))
    assert g.info["stages"] > 1 and g.info["r_copy_progressive"]
    assert abs(g.R - ref.R).max() > 1e-6 * abs(ref.R).max()


def test_last_pool_sent_down_still_copies_r_progressively(monkeypatch):
    """Where the last stage's pool cannot stay on the device for the solves (it is
    sent to the host during its launches like the earlier ones), its R still
    streams from the device as its entries become final (nothing is left to
    overlap a host gather), the earlier stages' R comes from their host pools:
    R and the solves equal the one-stage run's."""
    from scipy_gpuqr._engine.gpu import driver
    checks = driver._memory_checks

    def send_last_down(*args, **kwargs):
        return False, checks(*args, **kwargs)[1]
    A = _cases(big=True)[0][1]
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    monkeypatch.setattr(driver, "_memory_checks", send_last_down)
    for _ in range(2):
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=_limit(an, 4)))
    hows = [how for how, _ in g.info["r_copy_stages"]]
    assert g.info["stages"] > 1 and not g.info["last_pool_on_device"]
    assert hows == ["from the host pool"] * (len(hows) - 1) + ["progressive"], hows
    assert len(g._host_pools) == g.info["stages"] and not g._stage_pools
    assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()
    b = np.cos(np.arange(A.shape[0]))
    np.testing.assert_allclose(g.qt_matmul(b), ref.qt_matmul(b), rtol=0,
                               atol=1e-12 * np.linalg.norm(b))


def _r_copies_follow_the_rule(g) -> list:
    """A warm run's R copies: a device stage's R streams as its entries become final
    (the last stage always) or comes from its pool sent to the host; only a host
    stage's R is gathered after its launches. Returns how each stage's came."""
    hows = [how for how, _ in g.info["r_copy_stages"]]
    n = g.info["stages"]
    assert len(hows) == n, hows
    for sid, how in enumerate(hows):
        if sid in g._host_stages:       # an earlier one's on a worker
            assert how == ("after the launches" if sid == n - 1 else
                           "after the launches, on a worker"), (sid, hows)
        elif sid == n - 1:
            assert how == "progressive", (sid, hows)
        else:
            assert how in ("progressive", "from the host pool"), (sid, hows)
    assert g.info["r_copy_progressive"] == ("progressive" in hows), hows
    return hows


def test_warm_runs_copy_every_device_stage_r_during_its_launches(monkeypatch):
    """Warm staged runs: earlier pools sent down give R from the host; where a pool
    cannot be sent down during its stage (the CUDA layer's pinned cap), its R
    streams from the device, the first stage's too (R's layout cached by the
    earlier run); a host stage's R comes after its launches; a matrix without
    fronts has no stage and copies nothing. R as the unlimited run's."""
    A = _cases()[0][1]
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    limit = _limit(an, 4)
    for _ in range(2):
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit))
    hows = _r_copies_follow_the_rule(g)
    assert len(hows) > 2 and hows[:-1] == ["from the host pool"] * (len(hows) - 1), hows
    # no pool sent down during its stage
    monkeypatch.setattr(NumpyDevice, "open_pool_copy", lambda self, pool, final: None)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit))
    assert _r_copies_follow_the_rule(g) == ["progressive"] * len(hows)
    assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()
    monkeypatch.undo()
    # a host stage
    A, an, needs = _host_case()
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=_HOST_FLOPS)
    for _ in range(2):
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE,
                                                    memory_limit=min_budget(an, needs)),
                          dense_flops=_HOST_FLOPS)
    hows = _r_copies_follow_the_rule(g)
    assert g._host_stages and "after the launches" in hows
    assert abs(g.R - ref.R).max() <= 1e-10 * abs(ref.R).max()
    # every column a singleton: no front, no stage
    W = sp.random(40, 90, density=0.08, random_state=0, format="csc")
    A = sp.csc_array(W + sp.eye(40, 90, format="csc"))
    an = analyze(A)
    for budget in (None, 20000):
        for _ in range(2):
            g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), max_gpu_memory=budget)
        assert g.info["stages"] == 0 and _r_copies_follow_the_rule(g) == []
        assert not g.info["r_copy_progressive"]


def test_make_room_frees_cached_blocks_only_where_a_limit_needs_it():
    """Under a pool limit CuPy counts its cached blocks against the limit and does
    not free them for a request that would pass it: a large buffer asks for room
    first, which frees them only where the request would not fit beside them."""
    from scipy_gpuqr._engine.memory import make_room

    class Pool:
        def __init__(self, used, cached, limit):
            self.used, self.cached, self.limit, self.freed = used, cached, limit, 0

        def get_limit(self):
            return self.limit

        def free_bytes(self):
            return self.cached

        def total_bytes(self):
            return self.used + self.cached

        def free_all_blocks(self):
            self.freed += 1
            self.cached = 0

    def cp(pool):
        return types.SimpleNamespace(get_default_memory_pool=lambda: pool)
    for used, cached, limit, n, frees in ((100, 50, 0, 10 ** 9, 0),    # no limit: CuPy frees
                                          (100, 0, 200, 150, 0),       # nothing cached
                                          (100, 50, 200, 50, 0),       # fits beside them
                                          (100, 50, 200, 51, 1),       # would not: freed
                                          (100, 50, 200, 500, 1)):     # fails anyway: freed
        pool = Pool(used, cached, limit)
        assert make_room(cp(pool), n) == bool(frees) and pool.freed == frees
        assert pool.used == used


def test_largest_block_counts_cached_blocks_left_in_partly_used_chunks():
    """A slab buffer is sized by what one allocation may take: CuPy gives back only
    chunks that are wholly free, so the cached blocks left after ``free_all_blocks``
    count against a pool limit (under 1/2 of ch7-8-b3's need on the H200: 1.2 GB in
    use, 2.4 GB held, and the buffer sized from ``limit - used`` ran out of memory)."""
    from scipy_gpuqr._engine.memory import POOL_USABLE, RESERVE, USABLE, largest_block_bytes

    class Pool:
        def __init__(self, used, releasable, stuck, limit):
            self.used, self.cached, self.stuck, self.limit = used, releasable + stuck, stuck, limit

        def get_limit(self):
            return self.limit

        def total_bytes(self):
            return self.used + self.cached

        def free_all_blocks(self):
            self.cached = self.stuck        # blocks of partly used chunks stay

    def cp(pool, free):
        runtime = types.SimpleNamespace(memGetInfo=lambda: (free, 10 * free))
        return types.SimpleNamespace(get_default_memory_pool=lambda: pool,
                                     cuda=types.SimpleNamespace(runtime=runtime))
    gb = 1 << 30
    pool = Pool(used=gb, releasable=gb // 2, stuck=gb, limit=4 * gb)
    assert largest_block_bytes(cp(pool, 100 * gb)) == int(POOL_USABLE * (2 * gb))
    assert pool.cached == gb                # the releasable blocks went back
    pool = Pool(used=gb, releasable=0, stuck=0, limit=0)        # no limit: the device's free
    assert largest_block_bytes(cp(pool, 3 * gb)) == int(USABLE * (3 * gb - RESERVE))
    pool = Pool(used=gb, releasable=0, stuck=3 * gb, limit=4 * gb)
    assert largest_block_bytes(cp(pool, 100 * gb)) == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gather_by_runs_equals_the_gather_by_index(dtype):
    """``gather_runs`` gives ``pool[index]`` for any index: R's columns of a
    row-major front (upper trapezoid, the rows of each column one stride apart),
    runs too short for a block, columns not adjacent, a block past the pool's
    end, a random index, an empty one."""
    from scipy_gpuqr._engine.gpu.rcopy import RUN_MIN, gather_runs, strided_runs
    rng = np.random.default_rng(5)
    fm, fn, off = 700, 300, 37
    pool = rng.standard_normal(off + fm * fn + 5).astype(dtype)
    lens = np.minimum(np.arange(fn) + 1, 250)
    col = np.repeat(np.arange(fn), lens)
    row = np.arange(len(col)) - np.repeat(np.cumsum(lens) - lens, lens)
    tri = off + row * fn + col
    skip = tri[(col % 7 != 3)]                          # a column left out now and then
    tail = np.arange(pool.size - 40 * 6, pool.size, 6)  # one run ending at the pool's end
    cases = {"triangle": tri, "int32": tri.astype(np.int32), "gaps": skip,
             "mixed": np.concatenate([rng.integers(0, pool.size, 500), tri[::-1][:900], tri]),
             "tail": np.concatenate([tri[:2000], tail]), "random": rng.integers(0, pool.size, 5000),
             "empty": np.zeros(0, dtype=np.int64)}
    for name, index in cases.items():
        stride = 6 if name == "tail" else fn
        runs = strided_runs(index, stride)
        out = np.empty(len(index), dtype=dtype)
        gather_runs(pool, index, runs, out)
        np.testing.assert_array_equal(out, pool[index], err_msg=name)
        covered = np.zeros(len(index), dtype=int)
        for s, m in zip(runs.start, runs.length):
            assert m >= RUN_MIN and np.all(np.diff(index[s:s + m]) == stride)
            covered[s:s + m] += 1
        covered[runs.rest] += 1
        assert np.all(covered == 1), name
        if name in ("triangle", "int32"):
            assert len(runs.rest) < RUN_MIN ** 2 and len(runs.block_ptr) > 2


def test_host_stage_r_gathered_by_runs_equals_the_gather_by_index(monkeypatch):
    """A host stage's R comes from its pool by the blocked gather of its runs (its
    index cut once per layout) into an array made and touched while the stage's
    launches run, bit for bit the R of the gather by index into a new array."""
    from scipy_gpuqr._engine.gpu import rcopy, stage_loop
    A, an, needs = _host_case()
    limit = min_budget(an, needs)
    calls = []
    real = rcopy.gather_runs

    def counted(pool, index, runs, out):
        calls.append(len(runs.start))
        return real(pool, index, runs, out)
    monkeypatch.setattr(rcopy, "gather_runs", counted)
    made = []
    real_touched = stage_loop.touched

    def touched(n, dtype, threads=None):    # the values' array, made during the launches
        out = real_touched(n, dtype, threads)
        if threads is not None:             # R's data array made ahead, not a host stage's
            return out
        assert not out.any()
        out[...] = np.nan                   # every value must be written by the gather
        made.append(out)
        return out
    monkeypatch.setattr(stage_loop, "touched", touched)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                      dense_flops=_HOST_FLOPS)
    assert g.info["host_fronts"] and len(calls) == len(g.info["host_fronts"]) and max(calls) > 0
    assert len(made) == len(calls) and all(np.isfinite(v).all() for v in made)
    by_runs = g.R.toarray()
    monkeypatch.setattr(stage_loop.StageLoop, "host_r_copy",
                        lambda self, sid, pool, gidx: rcopy.NumpyRCopy(pool, gidx))
    by_index = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                             dense_flops=_HOST_FLOPS).R.toarray()
    np.testing.assert_array_equal(by_runs, by_index)


def test_stage_seconds_say_where_each_stage_spent_its_time():
    """``info['stage_seconds']``: per stage its begin, launches, wait, R and
    hand-on wall seconds (a staged run's phases for the bench's log)."""
    A, an, needs = _host_case()
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE,
                                                memory_limit=min_budget(an, needs)),
                      dense_flops=_HOST_FLOPS)
    rows = g.info["stage_seconds"]
    assert len(rows) == g.info["stages"] > 1
    assert all(len(r) == 5 and min(r) >= 0 for r in rows)
    assert sum(map(sum, rows)) <= g.info["seconds"]["factorize"] + 1e-3


def test_alternating_limits_make_each_plans_gather_maps_once(monkeypatch):
    """A process alternating two memory limits on one pattern (two stage plans, and
    the one-stage plan without a limit) makes R's gather maps of each plan once:
    the layout keeps the maps of the last :data:`~.rlayout.STAGE_MAPS_KEPT`
    staged plans and of the one-stage plan, not those of the last plan only
    (made again per call they cost seconds on a large R). The answers stay the
    unlimited run's."""
    from scipy_gpuqr._engine.gpu import rlayout
    A = _cases()[0][1]
    an = analyze(A)
    rlayout.clear_r_layout_cache(an)        # made here, not by an earlier test
    made = Counter()
    build = rlayout.RLayout._make_stage_maps

    def counted(self, key):
        made[key] += 1
        return build(self, key)
    monkeypatch.setattr(rlayout.RLayout, "_make_stage_maps", counted)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    plans = set()
    for limit in [_limit(an, 2), _limit(an, 8)] * 3 + [None]:
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit))
        plans.add(tuple(tuple(st.fronts) for st in g.schedule.stages))
        assert abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()
        g.free()
    assert len(plans) == 3 and all(len(p) > 1 for p in plans - {((0, an.fronts.nfronts - 1),)})
    assert sorted(made.values()) == [1, 1, 1], made


def test_staged_plans_kept_per_limit(monkeypatch):
    """A staged factorization's plan (the stage plan and the dense fronts picked
    for it) is made once per pattern and bytes available: calls alternating two
    limits make each plan once (a plan over every front, per round of dense
    fronts, before the first launch); the same R as plans made per call; a
    host front's plan too."""
    from scipy_gpuqr._engine.gpu import driver
    made = Counter()
    real = driver.staged_dense_plan

    def counted(analysis, *args, **kwargs):
        made[args[4]] += 1                  # the bytes available
        return real(analysis, *args, **kwargs)
    fresh = type(driver._STAGED_PLANS)
    monkeypatch.setattr(driver, "staged_dense_plan", counted)
    monkeypatch.setattr(driver, "_STAGED_PLANS", fresh(32, 1 << 30, lambda value: 0))
    A = _cases()[0][1]
    an = analyze(A)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE))
    made.clear()
    for limit in [_limit(an, 2), _limit(an, 4)] * 3:
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit))
        assert g.info["stages"] > 1 and abs(g.R - ref.R).max() <= 1e-12 * abs(ref.R).max()
    assert sorted(made.values()) == [1, 1], made
    monkeypatch.setattr(driver, "_STAGED_PLANS", types.SimpleNamespace(
        get=lambda *args: None, put=lambda *args: None))
    made.clear()
    for _ in range(2):              # nothing kept: a plan per call, the same R
        g2 = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit))
        np.testing.assert_array_equal(g2.R.toarray(), g.R.toarray())
    assert sum(made.values()) == 2
    A, an, needs = _host_case()
    made.clear()
    monkeypatch.setattr(driver, "_STAGED_PLANS", fresh(32, 1 << 30, lambda value: 0))
    for _ in range(3):
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE,
                                                    memory_limit=min_budget(an, needs)),
                          dense_flops=_HOST_FLOPS)
        assert g._host_stages
    assert sum(made.values()) == 1, made


def test_host_stages_hand_on_behind_the_next_stages(monkeypatch):
    """A host stage's contribution block whose parent is a later host stage's front
    is copied into that pool by threads on a worker (``_Placing``), and an
    earlier host stage's R is gathered on a worker, both while the next
    stages run: R and ``Qᵀb`` bit for bit those of the blocks copied at once,
    in one piece each; a placement one element off gives another R."""
    from scipy_gpuqr._engine.gpu import stage_loop
    A, an, needs = _host_case()
    limit = min_budget(an, needs) * 13 // 10
    b = np.cos(np.arange(A.shape[0]))
    made = []
    real = stage_loop._Placing

    class Counted(real):
        def __init__(self, pool, blocks, out):
            made.append(len(blocks))
            super().__init__(pool, blocks, out)
    monkeypatch.setattr(stage_loop, "_Placing", Counted)
    for _ in range(2):                          # the second run warm
        g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                          dense_flops=_HOST_FLOPS)
    hows = _r_copies_follow_the_rule(g)
    host = sorted(g._host_stages)
    assert len(host) > 2 and made and sum(made) > 0, (host, made)
    assert hows.count("after the launches, on a worker") == len(host) - 1, hows
    behind = (g.R.toarray(), g.qt_matmul(b))

    class AtOnce:
        def __init__(self, pool, blocks, out):
            made.append(len(blocks))
            for a, m, w, n, at in blocks:
                out[at: at + m * w].reshape(m, w)[...] = pool_block(pool, a, m, w, n)

        def synchronize(self):
            pass
    monkeypatch.setattr(stage_loop, "_Placing", AtOnce)
    count = len(made)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                      dense_flops=_HOST_FLOPS)
    assert len(made) > count
    np.testing.assert_array_equal(g.R.toarray(), behind[0])
    np.testing.assert_array_equal(g.qt_matmul(b), behind[1])

    class OffByOne(real):
        def __init__(self, pool, blocks, out):
            super().__init__(pool, [(a + 1, m, w, n, at) for a, m, w, n, at in blocks], out)
    monkeypatch.setattr(stage_loop, "_Placing", OffByOne)
    wrong = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                          dense_flops=_HOST_FLOPS).R.toarray()
    assert np.abs(wrong - behind[0]).max() > 1e-6 * np.abs(behind[0]).max()


def test_staged_r_assembled_on_a_worker_beside_q_first_upload(monkeypatch):
    """A staged factorization assembles R on a worker while the engine's thread
    sends ``Q``'s first stage up: R and ``Qᵀb`` bit for bit those of the
    assembly run at once on the engine's thread (its worker's future stood in
    for by a finished one); a one-stage run assembles on the engine's thread."""
    import threading
    from concurrent.futures import Future

    from scipy_gpuqr._engine.gpu import driver
    A, an, needs = _host_case()
    limit = min_budget(an, needs) * 13 // 10
    b = np.cos(np.arange(A.shape[0]))
    where = []
    real = driver.assemble_r

    def traced(*args, **kwargs):
        where.append(threading.current_thread().name)
        return real(*args, **kwargs)
    monkeypatch.setattr(driver, "assemble_r", traced)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                      dense_flops=_HOST_FLOPS)
    assert g.info["stages"] > 1 and where[-1].startswith("gpuqr-assemble-r"), where
    behind = (g.R.toarray(), g.qt_matmul(b))
    worker = driver.on_worker

    def inline_assembly(name, fn, *args):
        if name != "gpuqr-assemble-r":
            return worker(name, fn, *args)
        done = Future()
        done.set_result(fn(*args))
        return done
    monkeypatch.setattr(driver, "on_worker", inline_assembly)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                      dense_flops=_HOST_FLOPS)
    assert where[-1] == threading.current_thread().name
    np.testing.assert_array_equal(g.R.toarray(), behind[0])
    np.testing.assert_array_equal(g.qt_matmul(b), behind[1])
    monkeypatch.setattr(driver, "on_worker", worker)
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=_HOST_FLOPS)
    assert g.info["stages"] == 1 and where[-1] == threading.current_thread().name


def test_oversized_rule_leaves_every_host_front_a_device_slab():
    """ch7-8-b3 at an eighth of its one-stage need: the 'oversized' rule's dense
    fronts keep tile fronts whose VT pool leaves its root host front (49340 x 9375)
    not one panel's column slab on the device, so LAPACK would factorize it on the
    host (the H200 run's first call passed 45 s); by size every host front gets
    slabs there (the root ~316 columns), so the plan is by size. At a quarter the
    rule's own plan slabs every host front and stays."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.slab_front import slab_columns
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    an = analyze(chessboard_boundary(7, 8, 3))
    fs = an.fronts

    def needs_for(flops, extra=()):
        return driver.stage_needs(an, flops, extra, tile=TILE, bundle=BUNDLE, pipelining=True,
                                  itemsize=8, panel=256)
    base = needs_for(DEFAULT_DENSE_FLOPS)
    need = plan_for_memory(an, base, None).peak
    assert driver.STAGED_DENSE == "oversized"
    for frac, by_size in ((8, True), (4, False)):
        avail = int(POOL_USABLE * (need // frac))
        flops, extra, needs, mp = driver.staged_dense_plan(
            an, needs_for, DEFAULT_DENSE_FLOPS, base, plan_for_memory(an, base, avail), avail,
            None, panel=256, itemsize=8)
        assert mp.feasible and mp.host, frac
        slabs = [slab_columns(int(fs.fm[f]), 256, 8, avail - needs.fixed) for f in mp.host]
        assert min(slabs) >= 256, (frac, slabs)
        assert (flops == driver.STAGED_DENSE_FLOPS) == by_size and bool(extra) != by_size, frac
        if by_size:         # what the rule alone gives: a host front without a slab
            got = driver._oversized_dense(an, lambda ex: needs_for(DEFAULT_DENSE_FLOPS, ex),
                                          plan_for_memory(an, base, avail), avail, None)
            assert got is not None and not driver._host_fronts_slab(an, got[1], got[2], avail,
                                                                    256, 8)


@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pool_gather_compiled_equals_take_then_scatter(dtype, itype, monkeypatch):
    """R's values of a pool sent down, gathered by threads in one compiled call
    each (:func:`scipy_gpuqr._engine.native.gather`), land as the take of all
    of them then their scatter put them (the path without the library) and
    as ``data[pos] = host[gidx]``; a range one entry short leaves an entry
    out; arrays the routine does not take are refused."""
    from scipy_gpuqr._engine import native as engine_native
    from scipy_gpuqr._engine.gpu import stage_loop
    from scipy_gpuqr._schedule import native
    monkeypatch.setenv(engine_native.ENV, "c")
    if engine_native.handle() is None:
        pytest.skip("the compiled library cannot be built here")
    rng = np.random.default_rng(5)
    host = rng.standard_normal(50000).astype(dtype)
    n = 30001
    gidx = rng.integers(0, len(host), n).astype(itype)
    pos = rng.permutation(40000)[:n].astype(np.int64)
    monkeypatch.setattr(stage_loop, "GATHER_PER_THREAD", 7000)
    calls = []
    real = native.run_ranges
    monkeypatch.setattr(native, "run_ranges",
                        lambda fn, bounds, *a: (calls.append(len(bounds) - 1),
                                                real(fn, bounds, *a)))
    fused = np.zeros(40000, dtype=dtype)
    stage_loop._gather_into(fused, pos, host, gidx)
    assert calls and calls[0] == native.thread_count(n, 7000, stage_loop.GATHER_THREADS)
    lib = engine_native.handle()
    monkeypatch.setattr(engine_native, "handle", lambda: None)
    plain = np.zeros(40000, dtype=dtype)
    stage_loop._gather_into(plain, pos, host, gidx)     # taken, then scattered
    monkeypatch.setattr(engine_native, "handle", lambda: lib)
    ref = np.zeros(40000, dtype=dtype)
    ref[pos] = host[gidx]
    np.testing.assert_array_equal(fused, plain)
    np.testing.assert_array_equal(fused, ref)
    short = np.zeros(40000, dtype=dtype)
    monkeypatch.setattr(native, "run_ranges",
                        lambda fn, bounds, *a: real(lambda i0, i1, *b: fn(i0, i1 - 1, *b),
                                                    bounds, *a))
    stage_loop._gather_into(short, pos, host, gidx)
    assert np.count_nonzero(short != ref) > 0
    with pytest.raises(ValueError):
        engine_native.gather(lib, np.zeros(40000, dtype=np.float16), pos, host, gidx)
    with pytest.raises(ValueError):
        engine_native.gather(lib, fused, pos[:-1], host, gidx)
    with pytest.raises(ValueError):
        engine_native.gather(lib, fused, pos, host, gidx.astype(np.int16))


def test_blocks_for_a_host_stage_placed_with_their_fronts_copies(monkeypatch):
    """A warm staged run hands a device stage's blocks for a host stage's front to
    its pool's copy (``place_early``) once the launches are enqueued: each goes
    into the host stage's pool on the copy's way. R and ``Qᵀb`` are bit for
    bit those of placing them after the stage; a block placed one element
    off gives another R."""
    from scipy_gpuqr._engine.gpu import pool_copy, stage_loop
    A, an, needs = _host_case()
    limit = min_budget(an, needs)
    b = np.cos(np.arange(A.shape[0]))

    def run():
        return gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                             dense_flops=_HOST_FLOPS)
    run()                                       # the schedule warm: pools sent down
    g = run()
    assert g._host_stages and sum(g.info["blocks_placed_early"]) > 0, g.info
    early = (g.R.toarray(), g.qt_matmul(b))
    monkeypatch.setattr(stage_loop.StageLoop, "place_early", lambda self, st, down: None)
    g = run()
    assert sum(g.info["blocks_placed_early"]) == 0
    np.testing.assert_array_equal(g.R.toarray(), early[0])
    np.testing.assert_array_equal(g.qt_matmul(b), early[1])
    monkeypatch.undo()
    real = pool_copy._FrontCopy.attach

    def off_by_one(self, front_start, block, out):
        a, m, w, n, at = block      # one element before (one after may pass the pool's end)
        return real(self, front_start, (a - 1 if a else a + 1, m, w, n, at), out)
    monkeypatch.setattr(pool_copy._FrontCopy, "attach", off_by_one)
    wrong = run().R.toarray()
    assert np.abs(wrong - early[0]).max() > 1e-6 * np.abs(early[0]).max()


def test_blocks_attached_after_the_launches_go_after_their_fronts_copies():
    """``_FrontCopy.attach`` after the launches: a block of a front already sent is
    placed at once, before the last send (the copy stream waited for its
    front's launch); one of a front not sent yet right after the send that
    takes it, never before; none is placed twice or left out."""
    from scipy_gpuqr._engine.gpu import pool_copy
    k = 1 << 20                                 # fronts apart: never merged into one run
    fin = pool_copy.FrontFinality(start=np.arange(4) * k, end=np.arange(4) * k + 10,
                                  last=np.array([0, 2, 1, 3]))

    class Traced(pool_copy._FrontCopy):
        def __init__(self):
            super().__init__(fin, 8, 8 * 25)         # a send once 25 elements are final
            self.log = []

        def _copy(self, runs):
            self.log.append(("copy", tuple(runs)))

        def _place(self, block, out):
            self.log.append(("place", block[0]))
    c = Traced()
    for L in range(4):
        c.after_launch(L)
    assert c.log == [("copy", ((0, 10), (k, k + 10), (2 * k, 2 * k + 10)))], c.log
    for front in (3 * k, 0, k, 2 * k):
        c.attach(front, (front + 1, 1, 1, 1, 0), None)
    c.launches_done()
    assert c.log[1:] == [("place", 1), ("place", k + 1), ("place", 2 * k + 1),
                         ("copy", ((3 * k, 3 * k + 10),)), ("place", 3 * k + 1)], c.log
    assert c.placed == 4 and not c.extras
    with pytest.raises(ValueError):
        c.attach(5, (6, 1, 1, 1, 0), None)


class _FakeCuda:
    """What :class:`~scipy_gpuqr._engine.gpu.pool_copy.CupyPoolCopy` calls of CuPy,
    each call logged."""

    def __init__(self):
        self.log = []
        log = self.log

        class Event:
            def __init__(self, **kwargs):
                self.n = sum(1 for e in log if e[0] == "record")

            def record(self, stream):
                log.append(("record", stream.name, self.n))

        class Stream:
            def __init__(self, name):
                self.name, self.ptr = name, name

            def wait_event(self, ev):
                log.append(("wait", self.name, ev.n))

            def synchronize(self):
                log.append(("sync", self.name))

        def memcpy(dst, src, nbytes, kind, stream):
            log.append(("copy", stream, src // 8, nbytes // 8))

        def memcpy2d(dst, dp, src, sp, w, h, kind, stream):
            log.append(("copy2d", stream, src // 8, h))
        rt = types.SimpleNamespace(memcpyAsync=memcpy, memcpy2DAsync=memcpy2d,
                                   memcpyDeviceToHost=2)
        self.cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, runtime=rt))
        self.stream, self.copy_stream = Stream("work"), Stream("copy")


def test_cuda_pool_copy_places_blocks_on_the_copy_stream_after_their_fronts():
    """``CupyPoolCopy``: each send records an event on the work stream after the
    launch that made its fronts final, and the copy stream waits for it
    before the send's runs; blocks attached once the launches are enqueued
    go on the copy stream without an event of their own, those of fronts sent
    at once (before the last send), the others after the last send's copy;
    ``result`` waits for the copy stream."""
    from scipy_gpuqr._engine.gpu import pool_copy
    k = 1 << 20
    fin = pool_copy.FrontFinality(start=np.arange(3) * k, end=np.arange(3) * k + 10,
                                  last=np.array([0, 1, 2]))
    pool = types.SimpleNamespace(dtype=np.dtype(np.float64), itemsize=8, size=3 * k,
                                 data=types.SimpleNamespace(ptr=0))
    host = types.SimpleNamespace(ctypes=types.SimpleNamespace(data=0))
    out = types.SimpleNamespace(size=1 << 30, ctypes=types.SimpleNamespace(data=0))
    fake = _FakeCuda()
    c = pool_copy.CupyPoolCopy(fake, pool, host, fin, min_bytes=8)
    for L in range(2):
        c.after_launch(L)
    c.attach(2 * k, (2 * k + 5, 2, 4, 6, 0), out)
    c.attach(k, (k + 5, 2, 4, 6, 0), out)
    c.launches_done()
    assert c.result() is host
    assert fake.log == [("record", "work", 0), ("wait", "copy", 0), ("copy", "copy", 0, 10),
                        ("record", "work", 1), ("wait", "copy", 1), ("copy", "copy", k, 10),
                        ("copy2d", "copy", k + 5, 2),
                        ("record", "work", 2), ("wait", "copy", 2), ("copy", "copy", 2 * k, 10),
                        ("copy2d", "copy", 2 * k + 5, 2),
                        ("sync", "copy")], fake.log
    assert c.placed == 2


def test_blocks_placed_early_only_into_page_locked_pools():
    """``_page_locked``: a CUDA layer places a block during the launches only into
    page-locked memory (an asynchronous copy into pageable memory would hold the
    launch loop); the NumPy layer always; an error reading the pointer's
    attributes answers no."""
    from scipy_gpuqr._engine.gpu import stage_loop

    class Error(Exception):
        pass

    def layer(kind):
        def attrs(ptr):
            if kind is None:
                raise Error("not a pointer the driver knows")
            return types.SimpleNamespace(type=kind)
        rt = types.SimpleNamespace(pointerGetAttributes=attrs, CUDARuntimeError=Error)
        return types.SimpleNamespace(cp=types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt)))
    a = np.zeros(4)
    assert stage_loop._page_locked(layer(1), a)
    assert not stage_loop._page_locked(layer(0), a)
    assert not stage_loop._page_locked(layer(None), a)
    assert stage_loop._page_locked(NumpyDevice(TILE, BUNDLE), a)


@pytest.mark.parametrize("how", ["numpy", "c"])
def test_host_stage_blocks_assembled_ahead_while_later_stages_run(how, monkeypatch):
    """A host stage's Pack-Assemble records that read blocks placed into its pool
    run on a worker ahead of it (``hand_ahead``: as the blocks land during
    their stage, or once the next stage's launches are enqueued), and its
    launch leaves them out: R and ``Qᵀb`` are bit for bit those of assembling
    every block as the host stage begins. A worker that skips its records
    gives another R (the launch does not run them again)."""
    from scipy_gpuqr._engine.gpu import device as device_mod
    from scipy_gpuqr._engine.gpu import stage_loop
    from scipy_gpuqr._schedule import native
    monkeypatch.setenv(native.ENV, how)
    A, an, needs = _host_case()
    limit = min_budget(an, needs)
    b = np.cos(np.arange(A.shape[0]))

    def run():
        return gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                             dense_flops=_HOST_FLOPS)
    run()                                       # the schedule warm
    g = run()
    assert g._host_stages and g.info["host_assembled_ahead"] > 0, g.info
    assert g.info["host_front_seconds"]["assemble_ahead"] > 0
    ahead = (g.R.toarray(), g.qt_matmul(b))
    monkeypatch.setattr(stage_loop.StageLoop, "hand_ahead", lambda self, *a: None)
    g = run()
    assert g.info["host_assembled_ahead"] == 0
    np.testing.assert_array_equal(g.R.toarray(), ahead[0])
    np.testing.assert_array_equal(g.qt_matmul(b), ahead[1])
    monkeypatch.undo()
    monkeypatch.setenv(native.ENV, how)
    monkeypatch.setattr(device_mod.HostFrontDevice, "_assemble",
                        lambda self, made, zeroed, records, *a: (len(records), 0.0))
    wrong = run().R.toarray()
    assert np.abs(wrong - ahead[0]).max() > 1e-6 * np.abs(ahead[0]).max()


def test_records_assembled_ahead_read_only_blocks_already_placed(monkeypatch):
    """The records handed to a worker ahead of their host stage are Pack-Assemble
    records whose source blocks lie in the stage's pool already (placed by a
    stage that ended), and none is handed twice."""
    from scipy_gpuqr._engine.gpu import device as device_mod
    from scipy_gpuqr._schedule.tasks import TaskType
    A, an, needs = _host_case()
    limit = min_budget(an, needs)
    seen = []
    real = device_mod.HostFrontDevice.assemble_ahead

    def spy(self, key, records, blocks, landed=None):
        placed = {k: list(v) for k, v in self._placed.items()}
        assert tuple(key) in placed             # its blocks were placed
        assert np.all(records["type"] == int(TaskType.PACK_ASSEMBLE))
        starts = np.array(sorted(a for a, _ in blocks))
        ends = starts + np.array([n for _, n in sorted(blocks)])
        i = np.searchsorted(starts, records["vt"], side="right") - 1
        assert np.all((i >= 0) & (records["vt"] < ends[i]))
        seen.extend((tuple(key), int(r["F"]), int(r["vt"]), int(r["rows"][0])) for r in records)
        return real(self, key, records, blocks, landed)
    monkeypatch.setattr(device_mod.HostFrontDevice, "assemble_ahead", spy)
    gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                  dense_flops=_HOST_FLOPS)
    assert seen and len(seen) == len(set(seen))


def test_blocks_placed_during_a_stage_are_assembled_as_they_land(monkeypatch):
    """A warm staged run attaches a device stage's blocks for a host stage's
    pool before its launches (the pool ready): each is placed after its
    front's send, during the launches, and the pool copy tells the loop
    (``_on_placed``), which hands their records ahead then; R is bit for bit
    that of attaching them after the launches."""
    from scipy_gpuqr._engine.gpu import stage_loop
    A, an, needs = _host_case()
    limit = min_budget(an, needs)

    def run():
        return gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                             dense_flops=_HOST_FLOPS)
    run()
    during = []
    state = {"in": False}
    real_launch, real_told = stage_loop.StageLoop.launch_all, stage_loop.StageLoop._on_placed

    def launch_all(self, *a, **k):
        state["in"] = True
        try:
            return real_launch(self, *a, **k)
        finally:
            state["in"] = False

    def told(self, items, landed):
        during.append((state["in"], len(items)))
        return real_told(self, items, landed)
    monkeypatch.setattr(stage_loop.StageLoop, "launch_all", launch_all)
    monkeypatch.setattr(stage_loop.StageLoop, "_on_placed", told)
    g = run()
    assert any(inside for inside, _ in during), during
    assert g.info["host_assembled_ahead"] > 0
    R = g.R.toarray()
    monkeypatch.undo()
    real_early = stage_loop.StageLoop.place_early

    def after_only(self, st, down):
        if state["launched"]:
            real_early(self, st, down)
    real_launch = stage_loop.StageLoop.launch_all

    def launch_then(self, *a, **k):
        state["launched"] = False
        real_launch(self, *a, **k)
        state["launched"] = True
    monkeypatch.setattr(stage_loop.StageLoop, "place_early", after_only)
    monkeypatch.setattr(stage_loop.StageLoop, "launch_all", launch_then)
    state["launched"] = False
    g = run()
    assert sum(g.info["blocks_placed_early"]) > 0
    np.testing.assert_array_equal(g.R.toarray(), R)
