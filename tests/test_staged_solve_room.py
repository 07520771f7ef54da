"""R's staged solves set up while ``Q``'s first stage waits on the device (issue 22).

A staged GPU factorization sends ``Q``'s first stage up as it ends
(``solve.prefetch_first``); R's solves are set up before ``Qᵀb`` reads that
pack, and R's first upload of rows lets it go (``solve.drop_first``). Its room
is counted as available at the set-up (``trsolve.setup_bytes``): were it
counted as taken, on top of the room kept free for ``Q``'s largest upload
(``trsolve.replay_upload_bytes``), the kept rows' budget would miss a host
front's rows of R, and every solve of a rank decision would upload them again.

Here the NumPy layer stands in for the device: the level kernels by
:meth:`FrontTriangular.step` on the uploaded rows, the memory by a chosen
number of bytes; the uploads are counted.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import solve, trsolve
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.reflector_upload import UploadedReflectors
from scipy_gpuqr._engine.memory import DeviceMemory, front_needs, min_budget, vt_elements
from scipy_gpuqr._schedule.dense import dense_front_mask
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values

TILE, BUNDLE = 32, 3
HOST_FLOPS = 1e6                # grid 8³'s largest fronts are dense fronts


class _Levels:
    """Stands in for the CUDA level kernel of one stage: its fronts one by one
    (:meth:`FrontTriangular.step`) from the array the solve hands it."""

    def __init__(self, ft, key, members, offsets, dtype):
        self.members = list(members)
        self.off_of = dict(zip(self.members, np.asarray(offsets).tolist()))

    def run(self, ft, Y, pool, *, trans):
        for i in (self.members if trans else reversed(self.members)):
            ft.step(i, Y, pool, trans=trans, off=self.off_of[i])


def _staged():
    A = random_values(grid3d_least_squares(8), np.random.default_rng(7))
    an = analyze(A)
    dense = dense_front_mask(an, HOST_FLOPS)
    vt = vt_elements(an, tile=TILE, bundle=BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    floor = min_budget(an, front_needs(an, 8, tile=TILE, vt_elems=vt, dense=dense))
    g = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=floor),
                      dense_flops=HOST_FLOPS)
    ref = gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE), dense_flops=HOST_FLOPS)
    assert g._host_stages and not ref._host_pools
    return an, g, ref


def _solves(ft, C, n):
    """``n`` solves alternating ``R⁻ᵀ`` and ``R⁻¹`` from ``C`` (a rank decision's
    order: ``R⁻ᵀΩ`` first)."""
    out, Y = [], C
    for k in range(n):
        Y = ft.upper_transposed(Y) if k % 2 == 0 else ft.upper(Y)
        Y = Y / np.abs(Y).max()
        out.append(Y)
    return out


@pytest.mark.parametrize("count_first_pack", [True, False])
def test_first_pack_room_keeps_the_host_fronts_rows_of_r_for_every_solve(count_first_pack,
                                                                          monkeypatch):
    an, g, ref = _staged()
    pools_of = {**g._host_pools, **g._stage_pools}
    drops = []

    def pools(sid):
        return pools_of[sid]
    pools.before_upload = lambda: drops.append(1)
    ft = trsolve.FrontTriangular(g, pools, np)
    host_sid = max(g._host_stages)          # the root's stage, rows of R the largest
    host_rows = trsolve._StageRows(ft, ft.plan.by_stage[host_sid], g._host_pools[host_sid],
                                   trsolve._KeepBudget(0)).total * 8
    all_rows = sum(trsolve._StageRows(ft, ft.plan.by_stage[s], g._host_pools[s],
                                      trsolve._KeepBudget(0)).total * 8
                   for s in g._host_pools)
    # as ch7-8-b3 at half its one-stage need: Q's first pack (held, and the largest
    # upload the kept rows leave room for) about 2.4 times the host front's rows,
    # the host stage's three times its rows fitting beside it
    pack = 3 * all_rows
    avail = pack + all_rows // 2
    assert avail >= 3 * host_rows
    pools.first_pack_bytes = lambda: pack
    monkeypatch.setattr(trsolve, "available_bytes",
                        lambda xp: DeviceMemory(avail, "pool limit", {}))
    monkeypatch.setattr(trsolve, "replay_upload_bytes", lambda qr: pack)
    monkeypatch.setattr(trsolve, "_LevelKernel", _Levels)
    monkeypatch.setattr(trsolve, "COUNT_FIRST_PACK", count_first_pack)
    uploads = []
    copy = trsolve._copy_runs

    def counted(xp, pool, runs, total, stream):
        uploads.append(total * 8)
        return copy(xp, pool, runs, total, stream)
    monkeypatch.setattr(trsolve, "_copy_runs", counted)
    ft._stages = trsolve._staged_levels(ft, an.fronts, g)
    assert all(kern is not None for _, _, kern, _ in ft._stages)    # no streamed panels

    C = np.random.default_rng(1).standard_normal((ft.n, 5))
    n = 6
    got = _solves(ft, C, n)
    host_uploads = uploads.count(host_rows)
    if count_first_pack:
        # every stage's rows up once, kept for the later solves
        assert host_uploads == 1 and sum(uploads) == all_rows
        assert len(drops) == len(uploads)
    else:
        # the pack counted as taken: the budget misses the host front's rows,
        # uploaded by every solve
        assert host_uploads == n and sum(uploads) > all_rows
    # the same answers as the solves from the pools themselves (the NumPy loop)
    plain = trsolve.FrontTriangular(g, lambda sid: pools_of[sid], np)
    for a, b in zip(got, _solves(plain, C, n)):
        np.testing.assert_array_equal(a, b)
    # and as the unstaged factorization's, within rounding
    unstaged = trsolve.FrontTriangular(ref, lambda sid: ref._stage_pools[sid], np)
    for a, b in zip(got, _solves(unstaged, C, n)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


def test_setup_bytes_adds_the_first_pack_only_where_known(monkeypatch):
    monkeypatch.setattr(trsolve, "available_bytes",
                        lambda xp: DeviceMemory(1000, "pool limit", {}))
    plain = types.SimpleNamespace()
    held = types.SimpleNamespace(first_pack_bytes=lambda: 300)
    assert trsolve.setup_bytes(np, plain) == 1000
    assert trsolve.setup_bytes(np, held) == 1300
    monkeypatch.setattr(trsolve, "COUNT_FIRST_PACK", False)
    assert trsolve.setup_bytes(np, held) == 1000
    monkeypatch.setattr(trsolve, "COUNT_FIRST_PACK", True)
    monkeypatch.setattr(trsolve, "available_bytes",
                        lambda xp: DeviceMemory(None, "unknown", {}))
    assert trsolve.setup_bytes(np, held) is None


def test_first_pack_bytes_are_those_of_a_pack_no_replay_read():
    ex = solve.CupyExecutor.__new__(solve.CupyExecutor)
    ex._pool_sid, ex._ahead = None, None
    assert ex.first_bytes() == 0
    up = UploadedReflectors(np.zeros(10), None, np.zeros(3, dtype=np.uint8))
    ex._ahead = (0, up)
    assert ex.first_bytes() == 83
    ex._pool_sid = 0                        # a replay running: not a first pack
    assert ex.first_bytes() == 0
    qr = types.SimpleNamespace(_replay={})
    assert solve.first_pack_bytes(qr) == 0
    ex._pool_sid = None
    qr._replay["cupy"] = ex
    assert solve.first_pack_bytes(qr) == 83


@pytest.mark.gpu
def test_first_pack_counted_is_the_room_its_drop_gives_back(monkeypatch):
    """On the device: a staged factorization's first pack (sent up as it ends) is
    what :func:`~scipy_gpuqr._engine.gpu.solve.first_pack_bytes` counts and what
    its drop gives back to the pool; R's solves set up beside it count it as
    available, and their answers do not depend on whether they do."""
    import gc

    import cupy as cp

    from scipy_gpuqr._engine.memory import available_bytes, plan_for_memory
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    from scipy_gpuqr._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE
    A = grid3d_least_squares(24)
    an = analyze(A)
    dense = dense_front_mask(an, DEFAULT_DENSE_FLOPS)
    vt = vt_elements(an, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    need = plan_for_memory(an, front_needs(an, 8, tile=DEFAULT_TILE, vt_elems=vt, dense=dense),
                           None).peak
    pool = cp.get_default_memory_pool()
    C = cp.asarray(np.cos(np.arange(A.shape[1] * 2, dtype=np.float64)).reshape(-1, 2))
    ys = []
    for count in (True, False):
        monkeypatch.setattr(trsolve, "COUNT_FIRST_PACK", count)
        for _ in range(2):          # the second run warm: its replay plan is kept
            g = gpu_factorize(A, an, max_gpu_memory=need // 2)
        assert g.info["stages"] > 1 and g.info["q_first_stage_early"] is not None
        up = g._replay["cupy"]._ahead[1]
        held = solve.first_pack_bytes(g)
        assert held == up.values.nbytes + up.records.nbytes > 0
        pools = solve._device_pools(g)
        room = trsolve.setup_bytes(cp, pools) - available_bytes(cp).available
        assert room == (held if count else 0)
        cp.cuda.Device().synchronize()
        used = pool.used_bytes()
        up = None
        assert solve.drop_first(g) and solve.first_pack_bytes(g) == 0
        assert held <= used - pool.used_bytes() <= held + 2 * 512   # blocks of 512 bytes
        ds = solve.device_solve_of(g)
        ys.append((ds.upper(C).get(), ds.upper_transposed(C).get()))
        ds = pools = None
        g.free()
        g = None
        gc.collect()
    for a, b in zip(*ys):
        np.testing.assert_array_equal(a, b)
