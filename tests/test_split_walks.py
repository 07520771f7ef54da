"""The splits of a multi-device factorization's solves made by array operations
(:func:`replay_split.split_levels`, :func:`trsolve.split_stages`) against the
walks they replace, kept here as the reference: one step per level (per
stage), every front's rows looked up as it goes.

CPU tests over NumPy device layers (2 and 4 simulated devices): the real
plans' mapping and random mappings of stages to devices, with and without
dense fronts, give the walk's split exactly (its levels, segments' rows and
steps) and each lane's plan the same records; plans the array form declines
(a row's fronts interleave, two fronts of one level share a row) are not
split; a plan whose fronts pass rows to two fronts (not a tree) is split as
the walk splits it.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.gpu import replay_split as rs
from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu import trsolve as trs
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule.devices import map_devices
from scipy_gpuqr._schedule.tasks import empty_tasks
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares)


# ---------------------------------------------------------------- the walks

def _walk_levels(plan, stage_device, home):
    """``split_levels`` as a walk over the levels: per level its fronts' rows
    looked up in a table of who touched each row last."""
    nl = int(plan.nlevels)
    dev_of = [stage_device.get(int(s), home) for s in np.asarray(plan.level_stage).tolist()]
    for lv in plan.level_dense:
        dev_of[lv] = home
    if all(d == home for d in dev_of):
        return None
    levels = {}
    for lv, d in enumerate(dev_of):
        if d != home:
            levels.setdefault(d, []).append(lv)
    local = {}
    for d, lv in levels.items():
        local.update({x: j for j, x in enumerate(lv)})
    levels = {d: np.asarray(lv, dtype=np.int64) for d, lv in levels.items()}
    rowmap = np.asarray(plan.rowmap, dtype=np.int64)
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    rlev = np.repeat(np.arange(nl, dtype=np.int64), np.diff(lp))
    aux = plan.records["aux"].astype(np.int64)
    fm = plan.records["fm"].astype(np.int64)
    order = np.lexsort((aux, rlev))
    rlev, aux, fm = rlev[order], aux[order], fm[order]
    keep = np.r_[True, (rlev[1:] != rlev[:-1]) | (aux[1:] != aux[:-1])] if len(rlev) \
        else np.zeros(0, bool)
    faux, ffm = aux[keep].tolist(), fm[keep].tolist()
    fptr = np.searchsorted(rlev[keep], np.arange(nl + 1)).tolist()
    dense, key = {}, len(rowmap)
    for lv in sorted(plan.level_dense):
        dense[lv] = []
        for obj in plan.level_dense[lv]:
            dense[lv].append((key, np.asarray(obj.slots, dtype=np.int64)))
            key += 1
    segments, ops = [], {}
    for trans in (True, False):
        last = np.full(int(plan.m), -1, dtype=np.int64)
        seen, home_step, started, finished, running, current = {}, {}, {}, {}, {}, {}
        seg_rows, steps = {}, []

        def put_back(t):
            steps.append(("finish", t))
            finished[t] = len(steps)
            d = running.pop(t)
            if current.get(d) == t:
                del current[d]

        def stale(t, cur):
            if t == -1 or t == cur:
                return False
            if t <= -2:
                return home_step[-2 - t] > started[cur]
            return t in running or finished[t] > started[cur]

        for lv in (range(nl) if trans else range(nl - 1, -1, -1)):
            d = dev_of[lv]
            fronts = [(faux[j], ffm[j]) for j in range(fptr[lv], fptr[lv + 1])]
            fronts += [(k, None) for k, _ in dense.get(lv, ())]
            slots = dict(dense.get(lv, ()))
            prev = set()
            for k, n in fronts:
                t = seen.get(k)
                if t is None:
                    r = rowmap[k: k + n] if n is not None else slots[k]
                    prev.update(np.unique(last[r]).tolist())
                else:
                    prev.add(t)
            if d == home:
                for t in sorted(x for x in prev if x in running):
                    put_back(t)
                steps.append(("home", lv))
                mark = None
            else:
                seg = current.get(d)
                if seg is None or any(stale(t, seg) for t in prev):
                    for t in sorted(x for x in prev if x in running):
                        put_back(t)
                    seg = len(segments)
                    segments.append((d, None))
                    seg_rows[seg] = []
                    running[seg] = d
                    current[d] = seg
                    steps.append(("start", seg))
                    started[seg] = len(steps)
                steps.append(("level", seg, local[lv]))
                mark = seg
            for k, n in fronts:
                who = -2 - k if mark is None else mark
                if mark is None:
                    home_step[k] = len(steps)
                if seen.get(k) != who:
                    r = rowmap[k: k + n] if n is not None else slots[k]
                    last[r] = who
                    seen[k] = who
                    if mark is not None:
                        seg_rows[mark].append(r)
        for t in list(running):
            put_back(t)
        for t, parts in seg_rows.items():
            segments[t] = (segments[t][0], np.unique(np.concatenate(parts)) if parts
                           else np.zeros(0, np.int64))
        ops[trans] = steps
    return rs.ReplaySplit(levels=levels, segments=segments, ops=ops)


def _walk_stages(plan, stages, where, home, n):
    """``split_stages`` as a walk over the stages, their columns gathered front
    by front."""
    if all(where.get(sid, home) == home for sid, _ in stages):
        return None
    cols = np.asarray(plan.cols, dtype=np.int64)
    last = np.full(int(n), -1, dtype=np.int64)
    running, segments, ops = set(), [], []
    for i in range(len(stages) - 1, -1, -1):
        sid, members = stages[i]
        fr = [plan.fronts[j] for j in members]
        cat = (lambda x: np.unique(np.concatenate(x)) if x else np.zeros(0, np.int64))
        read = cat([cols[f[5]: f[6]] for f in fr])
        wrote = cat([cols[f[5]: f[5] + f[4]] for f in fr])
        for t in np.unique(last[read]).tolist():
            if t in running:
                ops.append(("finish", t))
                running.discard(t)
        d = where.get(sid, home)
        if d == home:
            ops.append(("home", i))
            last[wrote] = -2
            continue
        seg = len(segments)
        segments.append((d, i, read, wrote))
        ops += [("start", seg), ("run", seg)]
        running.add(seg)
        last[wrote] = seg
    ops += [("finish", t) for t in sorted(running)]
    return segments, ops


def _walk_lane_plan(plan, levels, tile):
    """``lane_plan`` with its records gathered level by level."""
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    levels = np.asarray(levels, dtype=np.int64)
    counts = lp[levels + 1] - lp[levels]
    idx = np.concatenate([np.arange(lp[lv], lp[lv + 1]) for lv in levels.tolist()]) \
        if len(levels) else np.zeros(0, np.int64)
    rec = plan.records[idx].copy()
    if len(rec):
        v0, v1 = int(rec["vt"].min()), int(rec["vt"].max()) + tile * tile
        a0, a1 = int(rec["aux"].min()), int((rec["aux"].astype(np.int64) + rec["fm"]).max())
    else:
        v0 = v1 = a0 = a1 = 0
    rec["vt"] -= v0
    rec["aux"] -= a0
    return dataclasses.replace(
        plan, records=rec, rowmap=np.ascontiguousarray(plan.rowmap[a0:a1]),
        level_ptr=np.r_[0, np.cumsum(counts)].astype(np.int64),
        level_stage=np.asarray(plan.level_stage, dtype=np.int64)[levels].copy(),
        level_dense={}, level_dense_fronts={}), v0, v1


def _same_split(got, want):
    assert (got is None) == (want is None)
    if got is None:
        return
    assert list(got.levels) == list(want.levels)
    for d in want.levels:
        np.testing.assert_array_equal(got.levels[d], want.levels[d])
        assert got.levels[d].dtype == want.levels[d].dtype
    assert len(got.segments) == len(want.segments)
    for (d1, r1), (d2, r2) in zip(got.segments, want.segments):
        assert d1 == d2
        np.testing.assert_array_equal(r1, r2)
        assert r1.dtype == r2.dtype
    assert got.ops == want.ops


def _same_stages(got, want):
    assert (got is None) == (want is None)
    if got is None:
        return
    assert got[1] == want[1]
    assert len(got[0]) == len(want[0])
    for s, t in zip(got[0], want[0]):
        assert s[:2] == t[:2]
        for a, b in ((s[2], t[2]), (s[3], t[3])):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype


# ---------------------------------------------------------------- real plans

def _matrices():
    rng = np.random.default_rng(5)
    A = grid3d_least_squares(8).astype(float)
    A.data = rng.standard_normal(A.nnz)
    yield "grid8", A, None
    yield "chess", chessboard_boundary(5, 6, 2).astype(np.float64), None
    yield "randls", random_least_squares(300, 120, 0.03, dense_rows=2, seed=2), None
    yield "blocks", sp.csc_array(sp.block_diag(
        [random_least_squares(40, 20, 0.2, seed=s) for s in range(9)], format="csc")), None
    yield "dense", grid3d_least_squares(9).astype(float), 2e5


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name, A, dense", list(_matrices()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_splits_equal_the_walks(name, A, dense, k):
    """The factorization's own mapping and random ones: Q's replay split and
    R⁻¹'s, each the walk's exactly."""
    an = analyze(A)
    kw = {} if dense is None else {"dense_flops": dense}
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(k)], **kw)
    if dense is not None:
        assert many.info["dense_fronts"] > 0
    plan = gs.plan_of(many)
    ns = len(many.schedule.stages)
    dp = map_devices(an, k)
    mappings = [{s: int(d) for s, d in enumerate(dp.stage_device) if int(d) != 0}]
    rng = np.random.default_rng(k)
    mappings += [{s: int(d) for s, d in enumerate(rng.integers(0, k, ns)) if d}
                 for _ in range(6)]
    for where in mappings:
        split = rs.split_levels(plan, where, 0)
        _same_split(split, _walk_levels(plan, where, 0))
        for lv in (split.levels.values() if split is not None else ()):
            got, want = rs.lane_plan(plan, lv, plan.tile), _walk_lane_plan(plan, lv, plan.tile)
            assert got[1:] == want[1:]
            assert got[0].records.tobytes() == want[0].records.tobytes()
            for name in ("rowmap", "level_ptr", "level_stage"):
                np.testing.assert_array_equal(getattr(got[0], name), getattr(want[0], name))
    if A.shape[0] < A.shape[1]:
        return
    ft = trs.FrontTriangular(many, lambda sid: None, np)
    stages = sorted(ft.plan.by_stage.items())
    sids = [s for s, _ in stages]
    for where in mappings:
        where = {s: d for s, d in where.items() if s in sids}
        _same_stages(trs.split_stages(ft.plan, stages, where, 0, ft.n),
                     _walk_stages(ft.plan, stages, where, 0, ft.n))


def test_segment_rows_marked_a_few_segments_at_a_time(monkeypatch):
    """A table of room for one or two segments at a time: the same rows."""
    A = grid3d_least_squares(8).astype(float)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(4)])
    plan = gs.plan_of(many)
    ns = len(many.schedule.stages)
    rng = np.random.default_rng(7)
    maps = [{s: int(d) for s, d in enumerate(rng.integers(0, 4, ns)) if d} for _ in range(4)]
    want = [rs.split_levels(plan, w, 0) for w in maps]
    for rows in (1, 2):
        monkeypatch.setattr(rs, "_TABLE_BYTES", rows * int(plan.m))
        for w, split in zip(maps, want):
            _same_split(rs.split_levels(plan, w, 0), split)
            _same_split(split, _walk_levels(plan, w, 0))


# ---------------------------------------------------------------- made-up plans

def _plan(fronts, m, stages=None):
    """A replay plan of fronts ``(level, rows)`` (one record per front and
    level; a front's rows its row map slice), level ``l`` on stage
    ``stages[l]`` (default: its number)."""
    rowmap, aux, recs = [], {}, []
    for i, (levels, rows) in enumerate(fronts):
        aux[i] = sum(len(r) for r in rowmap)
        rowmap.append(np.asarray(rows, dtype=np.int64))
        recs += [(lv, aux[i], len(rows)) for lv in levels]
    recs.sort()
    rec = empty_tasks(len(recs))
    rec["aux"] = [a for _, a, _ in recs]
    rec["fm"] = [n for _, _, n in recs]
    nl = max(lv for lv, _, _ in recs) + 1
    lv = np.array([lv for lv, _, _ in recs])
    return gs.ReplayPlan(m=m, tile=32, bundle=3, records=rec, rowmap=np.concatenate(rowmap),
                         level_ptr=np.searchsorted(lv, np.arange(nl + 1)).astype(np.int64),
                         level_stage=np.asarray(stages if stages is not None else range(nl),
                                                dtype=np.int64))


def test_rows_passed_to_two_fronts_split_as_the_walk():
    """Front 0's rows go on to fronts 2 and 3 (not a tree): the pairs are
    sorted out row by row, and the split is the walk's."""
    plan = _plan([([0], [0, 1, 6]), ([0], [2, 3]), ([1, 2], [0, 2, 4]), ([2], [1, 3, 5]),
                  ([3], [4, 5, 7])], 8)
    for where in ({0: 1}, {1: 1}, {2: 1}, {0: 1, 2: 2}, {1: 2, 3: 1}, {0: 1, 1: 1, 3: 2},
                  {0: 1, 1: 2, 2: 1, 3: 2}):
        _same_split(rs.split_levels(plan, where, 0), _walk_levels(plan, where, 0))
    assert rs._chain_edges(rs._level_fronts(plan), plan.nlevels, plan.m) is not None


def test_dense_front_rows_join_the_chain():
    """A dense front's slots (home) read and pass on the lanes' rows."""
    plan = _plan([([0], [0, 1, 2]), ([0], [3, 4]), ([2], [0, 3, 5])], 6)
    plan.level_dense[1] = [types.SimpleNamespace(slots=np.array([1, 2, 4]))]
    for where in ({0: 1}, {0: 1, 2: 2}, {2: 1}):
        _same_split(rs.split_levels(plan, where, 0), _walk_levels(plan, where, 0))


@pytest.mark.parametrize("fronts", [
    [([0, 2], [0, 1]), ([1], [1, 2])],              # front 0, front 1, front 0 on row 1
    [([0], [0, 1]), ([0], [1, 2]), ([1], [0, 2])],  # fronts of one level share row 1
], ids=["interleaved", "one level"])
def test_fronts_that_do_not_chain_are_not_split(fronts):
    """Rows whose fronts do not follow each other level after level: no split
    (the replay runs on the home device, as without one)."""
    plan = _plan(fronts, 3)
    assert rs.split_levels(plan, {1: 1}, 0) is None
