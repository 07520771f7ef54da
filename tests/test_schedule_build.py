"""The plan's fast paths give what the general ones give (CPU only)."""

import numpy as np
import pytest

from scipy_gpuqr._schedule import bucket
from scipy_gpuqr._schedule.sparse import build_schedule, schedule_digest
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares


@pytest.mark.parametrize("budget_div", [None, 3])
@pytest.mark.parametrize("dense_flops", [None, 1e6])
def test_state_machine_without_limit_is_the_limited_one_with_a_huge_limit(budget_div,
                                                                          dense_flops):
    an = analyze(grid3d_least_squares(10))
    budget = None if budget_div is None else int(an.gpu_bytes // budget_div)
    kw = dict(max_gpu_memory=budget, dense_flops=dense_flops, cache=False)
    a = build_schedule(an, **kw)
    b = build_schedule(an, max_tasks=10 ** 12, **kw)
    assert len(a.stages) == len(b.stages)
    if budget_div is not None:
        assert len(a.stages) > 1
    if dense_flops is not None:
        assert a.dense
    assert a.dense == b.dense
    for sa, sb in zip(a.stages, b.stages):
        np.testing.assert_array_equal(sa.launch_ptr, sb.launch_ptr)
        assert sa.tasks.tobytes() == sb.tasks.tobytes()
        assert sa.finish == sb.finish
        assert sa.dense == sb.dense and sa.dense_join == sb.dense_join


def test_templates_in_one_pass_equal_per_pattern_rows():
    an = analyze(chessboard_boundary(4, 5, 2))
    bucket.clear_cache()
    cold = build_schedule(an, cache=False)          # new patterns: rows in one pass
    scheds = list({id(s): s for s in bucket._CACHE._d.values()}.values())
    assert len(scheds) > 3
    rc = {k: np.concatenate([s.rcols[k] for s in scheds]) for k in bucket.COLUMNS}
    np.testing.assert_array_equal(bucket.element_rows_of(rc, 32),
                                  np.concatenate([s.element_rows(32) for s in scheds]))
    warm = build_schedule(an, cache=False)          # rows cached per pattern now
    for sa, sb in zip(cold.stages, warm.stages):
        assert sa.tasks.tobytes() == sb.tasks.tobytes()


def test_r_layout_one_stage_map_from_segments():
    from scipy_gpuqr._engine.gpu.rlayout import r_layout
    an = analyze(grid3d_least_squares(8))
    lay = r_layout(an, cache=False)
    assert lay._src is None                         # kept as segments
    (pos, idx), = lay.stage_maps([(0, an.fronts.nfronts - 1)])
    assert pos is None and idx.dtype == np.int32
    np.testing.assert_array_equal(idx, np.maximum(lay.src, 0))
    lay2 = r_layout(an, cache=False)
    lay2.src                                        # expanded first: the other path
    (_, idx2), = lay2.stage_maps([(0, an.fronts.nfronts - 1)])
    np.testing.assert_array_equal(idx, idx2)


def _random_patterns(rng, count):
    """Tile patterns as ``many_tile_buckets`` makes them (staircase, -1 beyond it)."""
    pats = []
    for _ in range(count):
        nrt = int(rng.integers(0, 25))
        nct = int(rng.integers(1, 20))
        nfct = int(rng.integers(0, min(nct, nrt) + 1)) if nrt else 0
        lead = np.sort(rng.integers(0, nct + 2, nrt))
        b = np.minimum(lead, np.arange(nrt))
        b[b >= nfct] = -1
        pats.append((b.astype(np.int32), nct, nfct))
    return pats


def _schedule_bytes(s):
    return (b"".join(np.ascontiguousarray(s.rcols[k]).tobytes() for k in sorted(s.rcols))
            + s.row_ptr.tobytes() + s.launch_ptr.tobytes()
            + repr((s.nlaunch, s.nvt, s.nct)).encode())


@pytest.mark.parametrize("bundle", [2, 3, 5])
@pytest.mark.parametrize("pipelining", [True, False])
def test_patterns_simulated_together_equal_patterns_alone(bundle, pipelining):
    # the lock-step simulation works on the buckets reached per launch and parks
    # lone tiles per bucket: nothing may leak between patterns simulated together
    rng = np.random.default_rng(bundle + 10 * pipelining)
    pats = _random_patterns(rng, 40)
    together = bucket._simulate(pats, bundle, pipelining, 2)
    for p, s in zip(pats, together):
        alone, = bucket._simulate([p], bundle, pipelining, 2)
        assert _schedule_bytes(s) == _schedule_bytes(alone)
        assert not s.row_ptr.flags.writeable and not s.rcols["rows"].flags.writeable


@pytest.mark.parametrize("kw, digest, built", [
    (dict(), "9f3f556ddd2b56d0", "a375062ae840473b"),
    (dict(dense_flops=1e6, max_tasks=300), "f03300ccbbaed9ad", "2eede77e42e9fa65"),
    (dict(tile=16, pipelining=False), "a6995ba2362d96a8", "a6f5b70f54105113"),
])
def test_records_pinned(kw, digest, built, monkeypatch):
    # records of grid 10³ as built before the simulation was compacted (commit
    # 53a2b2f), each launch's records in the order they are made (``digest``), and
    # as the engines get them, each launch's longest first (``built``): a change of
    # the bucket rules' outcome or of the order must be deliberate
    import scipy_gpuqr._schedule.sparse as sparse
    an = analyze(grid3d_least_squares(10))
    bucket.clear_cache()
    assert schedule_digest(build_schedule(an, cache=False, **kw)) == built
    monkeypatch.setattr(sparse, "longest_first", lambda r, lp, tile: np.arange(len(r)))
    bucket.clear_cache()
    assert schedule_digest(build_schedule(an, cache=False, **kw)) == digest


def test_each_launch_runs_its_longest_records_first(monkeypatch):
    # every launch holds the records it held in the order they are made, its
    # factorization records by cost (longest first, stable), then its assembly
    # records in their order; a lazy schedule's launches give the same records
    import scipy_gpuqr._schedule.sparse as sparse
    from scipy_gpuqr._schedule.tasks import TaskType, record_costs
    an = analyze(grid3d_least_squares(10))
    kw = dict(cache=False, max_tasks=300)
    got = build_schedule(an, **kw)
    monkeypatch.setattr(sparse, "longest_first", lambda r, lp, tile: np.arange(len(r)))
    made = build_schedule(an, **kw)
    monkeypatch.undo()
    lazy = build_schedule(an, lazy=True, **kw)
    moved = 0
    for sg, sm, sl in zip(got.stages, made.stages, lazy.stages):
        assert np.array_equal(sg.launch_ptr, sm.launch_ptr)
        lp = sg.launch_ptr
        for L in range(sg.nlaunch):
            g, m = sg.tasks[lp[L]:lp[L + 1]], sm.tasks[lp[L]:lp[L + 1]]
            assert np.array_equal(np.sort(g.view(np.dtype((np.void, g.itemsize)))),
                                  np.sort(m.view(np.dtype((np.void, m.itemsize)))))
            asm = g["type"] >= TaskType.S_ASSEMBLE
            k = int((~asm).sum())
            assert not asm[:k].any()
            assert np.array_equal(g[k:], m[k:])
            c = record_costs(g[:k])
            assert np.all(np.diff(c) <= 0)
            for v in np.unique(c):      # equal costs keep the order they were made in
                assert np.array_equal(g[:k][c == v], m[:k][record_costs(m[:k]) == v])
            assert np.array_equal(sl.launch_tasks(L), g)
            moved += int(np.any(g != m))
    assert moved > 0


@pytest.mark.parametrize("collide", [False, True])
def test_front_schedules_group_equal_patterns_exactly(collide, monkeypatch):
    # fronts grouped by a hash of their buckets: each front must get the schedule of
    # its own pattern, also when every hash collides (then every front is keyed)
    rng = np.random.default_rng(7)
    pats = _random_patterns(rng, 30)
    pats = [p for p in pats if p[2] > 0]
    pick = rng.integers(0, len(pats), 120)
    b = np.concatenate([pats[k][0] for k in pick]).astype(np.int32)
    nrt = np.array([len(pats[k][0]) for k in pick])
    tptr = np.concatenate(([0], np.cumsum(nrt)))
    nct = np.array([pats[k][1] for k in pick])
    nfct = np.array([pats[k][2] for k in pick])
    if collide:
        monkeypatch.setattr(bucket, "_mix64", lambda z: np.zeros_like(z))
    bucket.clear_cache()
    fronts = np.arange(0, len(pick), 2)
    got = bucket.front_schedules(b, tptr, nct, nfct, fronts, bundle=3, granule=2)
    for f, s in zip(fronts, got):
        want = bucket.tile_schedule(pats[pick[f]][0], nct[f], nfct[f], bundle=3, granule=2)
        assert _schedule_bytes(s) == _schedule_bytes(want)
    same = {}
    for f, s in zip(fronts.tolist(), got):
        same.setdefault(int(pick[f]), set()).add(id(s))
    assert all(len(v) == 1 for v in same.values())


def test_launch_chunks_cover_every_launch_once():
    from scipy_gpuqr._schedule.sparse import CHUNK, CHUNK_LAUNCHES
    an = analyze(grid3d_least_squares(10))
    s = build_schedule(an, cache=False, lazy=True, dense_flops=1e6)
    for st in s.stages:
        ch = st.launch_chunks()
        assert ch[0] == (0, 1)
        assert [a for a, _ in ch[1:]] == [b for _, b in ch[:-1]] and ch[-1][1] == st.nlaunch
        for a, b in ch:
            assert b - a <= CHUNK_LAUNCHES
            assert b - a == 1 or st.launch_ptr[b] - st.launch_ptr[a] <= CHUNK
        assert len(ch) < st.nlaunch / 4
        got = [r for a, b in ch for r in st.launch_range(a, b)]
        want = [st.launch_tasks(L) for L in range(st.nlaunch)]
        assert all(x.tobytes() == y.tobytes() for x, y in zip(got, want))
        assert len(got) == st.nlaunch
