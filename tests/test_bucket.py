"""The bucket scheduler of one front: structure, launch counts, independence."""

import numpy as np
import pytest

from scipy_gpuqr._engine.host.simulate import launch_conflicts
from scipy_gpuqr._schedule import bucket
from scipy_gpuqr._schedule.tasks import TaskType


def test_pipelining_needs_fewer_launches_on_1024x512():
    _, l_off, _ = bucket.dense_front_tasks(1024, 512, pipelining=False)
    _, l_on, _ = bucket.dense_front_tasks(1024, 512, pipelining=True)
    n_off, n_on = l_off[-1] + 1, l_on[-1] + 1
    assert n_on < n_off
    assert n_on <= 0.75 * n_off, (n_on, n_off)


@pytest.mark.parametrize("tile", [16, 32, 64])
@pytest.mark.parametrize("pipelining", [False, True])
@pytest.mark.parametrize("shape", [(256, 160), (300, 70), (70, 300), (2000, 40), (1, 1)])
def test_launches_have_no_inner_dependencies(shape, pipelining, tile):
    tasks, launch, _ = bucket.dense_front_tasks(*shape, tile=tile, pipelining=pipelining)
    assert np.all(np.diff(launch) >= 0)
    assert launch_conflicts(tasks, launch, tile) == []


def test_staircase_zero_tiles_never_touched():
    tile = 32
    fm, fn = 320, 256
    # rows' leftmost columns: 4 row tiles start at column tile 0, then
    # 2 row tiles at column tile 3, 4 at column tile 5
    lead = np.repeat([0] * 4 + [96] * 2 + [160] * 4, tile)
    stair = np.searchsorted(lead, np.arange(fn), side="right")
    tasks, launch, _ = bucket.dense_front_tasks(fm, fn, stair=stair, tile=tile)
    first_col = {}
    for rec in tasks:
        typ = TaskType(int(rec["type"]))
        rows = rec["rows"]
        if typ in (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE):
            fs, nf = int(rec["fstart"]), int(rec["nfrows"])
            col = int(rec["col"]) if typ == TaskType.FACTORIZE else int(rec["c0"])
            for r in rows[fs:fs + nf]:
                first_col[int(r)] = min(first_col.get(int(r), 10**9), col)
        if typ in (TaskType.APPLY, TaskType.APPLY_FACTORIZE):
            for r in rows[:int(rec["napply"])]:
                first_col[int(r)] = min(first_col.get(int(r), 10**9), int(rec["c0"]))
    for r, c in first_col.items():
        # a row tile is never touched left of its leftmost nonzero column tile
        # (nor left of its diagonal tile, where the two differ)
        assert c >= min(lead[r] // tile * tile, r), (r, c)


def test_buckets_from_staircase():
    stair = np.array([3, 3, 5, 9, 9, 9, 12, 12])  # fm = 12, fn = 8
    b = bucket.tile_buckets(12, 8, stair, nfact=8, tile=2)
    # row tiles start at rows 0,2,4,6,8,10 -> leftmost cols 0,0,2,3,3,6
    # -> column tiles 0,0,1,1,1,3 ; min with tile index -> 0,0,1,1,1,3
    assert b.tolist() == [0, 0, 1, 1, 1, 3]
    b = bucket.tile_buckets(12, 8, stair, nfact=4, tile=2)
    assert b.tolist() == [0, 0, 1, 1, 1, -1]


def test_schedule_shared_between_equal_patterns():
    s1 = bucket.tile_schedule((0, 0, 0, 1), 4, 4)
    s2 = bucket.tile_schedule([0, 0, 0, 1], 4, 4)
    assert s1 is s2
    assert not s1.tasks.flags.writeable


def test_deterministic():
    a = bucket.dense_front_tasks(500, 300, pipelining=True)[0]
    bucket.clear_cache()
    b = bucket.dense_front_tasks(500, 300, pipelining=True)[0]
    assert a.tobytes() == b.tobytes()


def test_vt_recycling_reuses_tiles():
    b = bucket.tile_buckets(1024, 512, None, 512, 32)
    s = bucket.tile_schedule(b, 16, 16)
    ids, nslots = bucket.vt_slots_recycled(s)
    assert nslots < s.nvt
    # a recycled tile is never written while its reflector is still pending
    born = {}
    for k in np.flatnonzero(np.isin(s.tasks["type"], [1, 3])):
        v = s.tasks["vt"][k] if s.tasks["type"][k] == 1 else s.tasks["vt2"][k]
        born[int(v)] = int(s.launch[k])
    by_slot = {}
    for v, t in born.items():
        by_slot.setdefault(int(ids[v]), []).append(t)
    for ts in by_slot.values():
        ts.sort()
        assert all(b2 - a2 >= 2 for a2, b2 in zip(ts, ts[1:]))
