"""``Q``'s replay of a multi-device factorization split over the devices holding
its stages (scipy_gpuqr._engine.gpu.replay_split).

CPU tests: the multi-GPU driver over NumPy device layers (2-4 simulated
devices); each lane runs its own plan (records, VT tiles and row map sliced)
on an X of its own that holds NaN outside the rows the split gives it, so a
row the split leaves out shows up. ``Qᵀ B`` and ``Q B`` must be the unsplit
replay's bit for bit (every row sees the same updates in the same order) and
the one-device factorization's within rounding. A random mapping of stages
to devices either is refused or gives the same bits. GPU tests (marker
``gpu``, 2 and 4 GPUs): the same on CuPy lanes against ``SPLIT_REPLAY`` off.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.gpu import replay_split as rs
from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu import trsolve as trs
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule.devices import map_devices
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares)


def _cases():
    rng = np.random.default_rng(5)
    A = grid3d_least_squares(8).astype(float)
    A.data = rng.standard_normal(A.nnz)
    yield "grid8", A
    yield "chess", chessboard_boundary(5, 6, 2).astype(np.float64)
    yield "randls", random_least_squares(300, 120, 0.03, dense_rows=2, seed=2)
    yield "blocks", sp.csc_array(sp.block_diag(
        [random_least_squares(40, 20, 0.2, seed=s) for s in range(9)], format="csc"))


def _pools(g):
    def pools(sid):
        pool = g._stage_pools.get(sid)
        return pool if pool is not None else g._host_pools[sid]
    return pools


def _executor(g, stage_device=None):
    """The NumPy executor of ``g``, split over ``stage_device`` where given (None
    when the split is refused)."""
    plan = gs.plan_of(g)
    ex = gs.NumpyExecutor(plan, _pools(g), g._device.vt)
    if stage_device is None:
        return ex
    split = rs.split_levels(plan, stage_device, 0)
    if split is None:
        return None
    ex.split, ex.lanes = split, {}
    for d, lv in split.levels.items():
        sub, v0, v1 = rs.lane_plan(plan, lv, plan.tile)
        vt = np.array(g._device.vt[v0:v1])          # the lane's own copy of its tiles
        ex.lanes[d] = rs.NumpyLane(gs.NumpyExecutor(sub, _pools(g), vt))
    return ex


def _stage_device(an, k) -> dict:
    plan = map_devices(an, k)
    return {s: int(d) for s, d in enumerate(plan.stage_device) if int(d) != 0}


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("name, A", list(_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_split_replay_equals_one_device(name, A, k):
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)])
    where = _stage_device(an, k)
    plain = _executor(many)
    split = _executor(many, where)
    if where and len(many.schedule.stages) > 1:
        assert split is not None, name          # subtrees on other devices: split
        assert split.split.levels
        assert set(split.split.levels) == set(where.values()) - {0}
    if split is None:
        return
    rng = np.random.default_rng(k)
    m = A.shape[0]
    B = rng.standard_normal((m, 3))
    ref_one = {tr: gs.apply_plan(one, B, tr, _executor(one)) for tr in (True, False)}
    for trans in (True, False):
        got = gs.apply_plan(many, B, trans, split)
        ref = gs.apply_plan(many, B, trans, plain)
        assert not np.isnan(got).any(), name
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_allclose(got, ref_one[trans], rtol=0,
                                   atol=1e-12 * np.abs(B).max() * m)


def test_split_levels_by_hand():
    """Every level once per direction, on its stage's device; a segment started
    before its levels and put back after; the lanes started ahead of the home
    levels for ``Qᵀ``; a lane plan reading the whole plan's tiles and rows."""
    A = grid3d_least_squares(8).astype(float)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(3)])
    plan = gs.plan_of(many)
    where = _stage_device(an, 3)
    split = rs.split_levels(plan, where, 0)
    assert split is not None
    lstage = np.asarray(plan.level_stage)
    for d, lv in split.levels.items():
        assert all(where.get(int(s), 0) == d for s in lstage[lv])
    for trans, ops in split.ops.items():
        seen, state = [], {}
        for op in ops:
            if op[0] == "home":
                assert where.get(int(lstage[op[1]]), 0) == 0
                seen.append(op[1])
            elif op[0] == "level":
                assert state[op[1]] == "on"
                d = split.segments[op[1]][0]
                seen.append(int(split.levels[d][op[2]]))
            elif op[0] == "start":
                assert op[1] not in state
                state[op[1]] = "on"
            else:
                assert state[op[1]] == "on"
                state[op[1]] = "off"
        assert all(v == "off" for v in state.values())
        want = list(range(plan.nlevels)) if trans else list(range(plan.nlevels))[::-1]
        assert sorted(seen) == sorted(want) and len(seen) == plan.nlevels
        # the levels in the plan's order within each device
        for d in list(split.levels) + [0]:
            mine = [x for x in seen if where.get(int(lstage[x]), 0) == d]
            assert mine == [x for x in want if x in set(mine)]
    first_home = next(i for i, op in enumerate(split.ops[True]) if op[0] == "home")
    started = {split.segments[op[1]][0] for op in split.ops[True][:first_home]
               if op[0] == "start"}
    assert started == set(split.levels)
    # the sliced plan of a lane reads the same tiles and rows as the whole plan
    d, lv = next(iter(split.levels.items()))
    sub, v0, v1 = rs.lane_plan(plan, lv, plan.tile)
    lp = np.asarray(plan.level_ptr)
    whole = np.concatenate([plan.records[lp[x]:lp[x + 1]] for x in lv])
    assert np.array_equal(sub.records["vt"] + v0, whole["vt"])
    assert np.array_equal(sub.rowmap[sub.records["aux"]], plan.rowmap[whole["aux"]])
    assert v1 - v0 <= len(many._device.vt)
    # nothing off the home device: no split
    assert rs.split_levels(plan, {}, 0) is None


def test_random_stage_mappings_are_refused_or_exact():
    """Any mapping of stages to devices (an upper front off the home device, a
    device's stages far apart) gives the unsplit replay's bits."""
    A = grid3d_least_squares(8).astype(float)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(4)])
    ns = len(many.schedule.stages)
    rng = np.random.default_rng(3)
    B = rng.standard_normal((A.shape[0], 2))
    plain = _executor(many)
    ref = {tr: gs.apply_plan(many, B, tr, plain) for tr in (True, False)}
    for _ in range(12):
        where = {s: int(d) for s, d in enumerate(rng.integers(0, 4, ns)) if d}
        ex = _executor(many, where)
        assert (ex is None) == (not where)
        if ex is None:
            continue
        for trans in (True, False):
            got = gs.apply_plan(many, B, trans, ex)
            assert not np.isnan(got).any()
            np.testing.assert_array_equal(got, ref[trans])


@pytest.mark.parametrize("k", [2, 3])
def test_split_replay_with_dense_fronts(k):
    """Dense fronts (on every device's stages) run on the home device with their
    levels; the rest of the lanes' levels on their devices; the same bits."""
    A = grid3d_least_squares(9).astype(float)
    A.data = np.random.default_rng(k).standard_normal(A.nnz)
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=2e5)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)],
                               dense_flops=2e5)
    assert many.info["dense_fronts"] > 0
    where = _stage_device(an, k)
    ex = _executor(many, where)
    assert ex is not None
    plan = gs.plan_of(many)
    lane_levels = set(np.concatenate(list(ex.split.levels.values())).tolist())
    assert not lane_levels & set(plan.level_dense)
    B = np.random.default_rng(0).standard_normal((A.shape[0], 2))
    for trans in (True, False):
        got = gs.apply_plan(many, B, trans, ex)
        np.testing.assert_array_equal(got, gs.apply_plan(many, B, trans, _executor(many)))
        np.testing.assert_allclose(got, gs.apply_plan(one, B, trans, _executor(one)),
                                   rtol=0, atol=1e-12 * np.abs(B).max() * A.shape[0])


def test_random_stage_mappings_with_dense_fronts():
    """Random mappings of a factorization with dense fronts on its stages."""
    A = grid3d_least_squares(9).astype(float)
    A.data = np.random.default_rng(9).standard_normal(A.nnz)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(3)],
                               dense_flops=2e5)
    assert many.info["dense_fronts"] > 0
    ns = len(many.schedule.stages)
    rng = np.random.default_rng(11)
    B = rng.standard_normal((A.shape[0], 2))
    ref = {tr: gs.apply_plan(many, B, tr, _executor(many)) for tr in (True, False)}
    for _ in range(8):
        where = {s: int(d) for s, d in enumerate(rng.integers(0, 3, ns)) if d}
        ex = _executor(many, where)
        if ex is None:
            continue
        for trans in (True, False):
            np.testing.assert_array_equal(gs.apply_plan(many, B, trans, ex), ref[trans])


# ---------------------------------------------------------------- GPU

def _gpus():
    try:
        import cupy as cp
        return cp.cuda.runtime.getDeviceCount()
    except Exception:       # noqa: BLE001 - no CuPy or no driver
        return 0


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 4])
def test_split_solves_on_gpus(k, monkeypatch):
    """On k GPUs: Qᵀ B and Q B with the lanes (:data:`solve.SPLIT_REPLAY`) and
    R⁻¹ C with the stages on their GPUs (:data:`trsolve.SPLIT_SOLVE`) give the
    bits of the solves reading the other GPUs' pools over the link."""
    if _gpus() < k:
        pytest.skip(f"{k} GPUs needed")
    import cupy as cp
    A = grid3d_least_squares(24).astype(float)
    A.data = np.random.default_rng(1).standard_normal(A.nnz)
    an = analyze(A)
    rng = np.random.default_rng(2)
    B = rng.standard_normal((A.shape[0], 5))
    C = rng.standard_normal((A.shape[1], 33))
    with cp.cuda.Device(0):
        qr = multi_gpu_factorize(A, an, devices=tuple(range(k)))
        assert trs.stage_devices(qr, cp)[0]            # subtrees on the other GPUs
        got = {}
        for on in (True, False):
            monkeypatch.setattr(gs, "SPLIT_REPLAY", on)
            monkeypatch.setattr(trs, "SPLIT_SOLVE", on)
            qr._replay.pop("cupy", None)
            ex = gs._cupy_executor(qr)
            assert (ex.split is not None) == on
            ds = gs.device_solve_of(qr)
            got[on] = [gs.device_matmul(qr, B, trans=tr, float64=True) for tr in (True, False)]
            got[on].append(ds.upper(cp.asarray(C)).get())
            assert (ds.fronts._lanes() is not None) == on
            for d in range(k):
                cp.cuda.Device(d).synchronize()
        for a, b in zip(got[True], got[False]):
            np.testing.assert_array_equal(a, b)
        qr.free()


# ---------------------------------------------------------------- R⁻¹ over the devices

class _NumpySolveLane:
    """A simulated device's stages of R⁻¹: its own Y (NaN outside the lent rows)."""

    def __init__(self, ft, stages, segments, pools):
        self.ft, self.stages, self.segments, self.pools = ft, stages, segments, pools

    def start(self, Y, seg):
        Yd = np.full_like(Y, np.nan)
        rows = self.segments[seg][2]
        Yd[rows] = Y[rows]
        return Yd

    def run(self, seg, Yd):
        sid, members = self.stages[self.segments[seg][1]]
        pool = self.pools(sid)
        for i in reversed(members):
            self.ft.step(i, Yd, pool, trans=False)

    def finish(self, Yd, seg, Y):
        rows = self.segments[seg][3]
        Y[rows] = Yd[rows]


def _solve_split(ft, where, C):
    stages = sorted(ft.plan.by_stage.items())
    made = trs.split_stages(ft.plan, stages, where, 0, ft.n)
    if made is None:
        return None
    segments, ops = made
    pools = ft.pools

    def home(i, Y):
        sid, members = stages[i]
        pool = pools(sid)
        for j in reversed(members):
            ft.step(j, Y, pool, trans=False)
    lanes = {d: _NumpySolveLane(ft, stages, segments, pools) for d, *_ in segments}
    Y = np.array(C, dtype=np.float64)
    trs.run_split(segments, ops, home, lanes, Y)
    return Y, segments, ops


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("name, A", list(_cases())[:3], ids=lambda v: v if isinstance(v, str) else "")
def test_split_back_substitution_equals_one_device(name, A, k):
    """R⁻¹ over the simulated devices: the unsplit solve's bits, each lane only
    given the columns its fronts read (NaN elsewhere), and the one-device R⁻¹."""
    m, n = A.shape
    if m < n:
        pytest.skip("tall")
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)])
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    ft = trs.FrontTriangular(many, _pools(many), np)
    C = np.random.default_rng(k).standard_normal((n, 3))
    ref = np.array(C)
    ft._loop(ref, False)
    where = _stage_device(an, k)
    got = _solve_split(ft, where, C)
    if not where:
        assert got is None
        return
    Y, segments, ops = got
    assert not np.isnan(Y).any()
    np.testing.assert_array_equal(Y, ref)
    # each stage once, at home or on its device; lanes solved after the upper tree
    assert sorted([op[1] for op in ops if op[0] == "home"] + [s[1] for s in segments]) \
        == list(range(len(ft.plan.by_stage)))
    ft1 = trs.FrontTriangular(one, _pools(one), np)
    y1 = np.array(C)
    ft1._loop(y1, False)
    np.testing.assert_allclose(Y, y1, rtol=1e-9, atol=1e-9 * np.abs(y1).max())


def test_split_back_substitution_random_mappings():
    """Any mapping of R's stages to devices gives the unsplit solve's bits."""
    A = grid3d_least_squares(8).astype(float)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(4)])
    ft = trs.FrontTriangular(many, _pools(many), np)
    C = np.random.default_rng(0).standard_normal((A.shape[1], 2))
    ref = np.array(C)
    ft._loop(ref, False)
    ns = len(ft.plan.by_stage)
    rng = np.random.default_rng(4)
    for _ in range(10):
        where = {s: int(d) for s, d in zip(sorted(ft.plan.by_stage), rng.integers(0, 4, ns))
                 if d}
        got = _solve_split(ft, where, C)
        assert (got is None) == (not where)
        if got is not None:
            np.testing.assert_array_equal(got[0], ref)


def test_stage_split_made_once_per_placement(monkeypatch):
    """A pattern's plan makes R⁻¹'s split once per placement of its stages (the
    host walk is a fifth of a second on a four-GPU grid 64³): a second
    factorization's solve reads the one made for the first; another placement
    makes its own, equal to :func:`split_stages`."""
    A = grid3d_least_squares(8).astype(float)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(4)])
    ft = trs.FrontTriangular(many, _pools(many), np)
    stages = sorted(ft.plan.by_stage.items())
    made, real = [], trs.split_stages

    def counted(*a, **k):
        made.append(a[2])
        return real(*a, **k)
    monkeypatch.setattr(trs, "split_stages", counted)
    sids = [s for s, _ in stages]
    where1 = {sids[0]: 1, sids[1]: 2}
    where2 = {sids[0]: 3}
    first = ft.plan.stage_split(stages, where1, 0, ft.n)
    assert ft.plan.stage_split(stages, dict(reversed(list(where1.items()))), 0, ft.n) is first
    other = ft.plan.stage_split(stages, where2, 0, ft.n)
    assert made == [where1, where2]
    for got, where in ((first, where1), (other, where2)):
        segments, ops = real(ft.plan, stages, where, 0, ft.n)
        assert got[1] == ops
        for s, t in zip(got[0], segments):
            assert s[:2] == t[:2]
            np.testing.assert_array_equal(s[2], t[2])
            np.testing.assert_array_equal(s[3], t[3])
