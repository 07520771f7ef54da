"""The per-pattern host pieces of a first GPU call against plain reference versions
(CPU only): the range maxima of R's final entries, ``Q``'s kept and reflector
records and replay plan, the Apply cut. Each reference is the straightforward form (a write per element, a
sort per record, a loop per front); the engine's versions must give the same
arrays bit for bit."""

from pathlib import Path

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import rcopy
from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu.rlayout import r_layout
from scipy_gpuqr._engine.gpu.stage_loop import stage_reflector_records
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache
from scipy_gpuqr._schedule.tasks import TaskType, apply_split, empty_tasks
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_least_squares


def _range_max_reference(out, start, length, value):
    for s, n, v in zip(start.tolist(), length.tolist(), value.tolist()):
        if n > 0:
            np.maximum(out[s:s + n], v, out=out[s:s + n])


@pytest.mark.parametrize("seed", range(6))
def test_range_max_is_the_maximum_over_every_range(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n = int(rng.integers(1, 300))
        k = int(rng.integers(0, 80))
        start = rng.integers(0, n, k)
        length = np.minimum(rng.integers(-3, 70, k), n - start)
        value = rng.integers(-1, 5000, k)
        out = rng.integers(-1, 100, n)
        ref = out.copy()
        _range_max_reference(ref, start, length, value)
        rcopy._range_max(out, start, length, value)
        np.testing.assert_array_equal(out, ref)


def _reflector_records_reference(tasks, F, rowmap_off):
    """One record at a time: the top tile, then the other slots of
    ``[fstart, fstart + nfrows)`` (within the record's slots) in order."""
    out = empty_tasks(len(tasks))
    ns = tasks["rows"].shape[1]
    for i, t in enumerate(tasks):
        inr = [s for s in range(ns) if t["fstart"] <= s < t["fstart"] + t["nfrows"]]
        order = [int(t["ftop"])] + [s for s in inr if s != t["ftop"]]
        out["rows"][i, :len(order)] = t["rows"][order]
        out["napply"][i] = len(order)
        isf = t["type"] == TaskType.FACTORIZE
        out["vt"][i] = t["vt"] if isf else t["vt2"]
        out["col"][i] = t["col"] if isf else t["c0"]
        out["nref"][i] = t["nref"] if isf else t["aux"]
    out["type"] = TaskType.APPLY_QT
    out["F"] = F
    out["aux"] = rowmap_off
    for f in ("fm", "fn", "front"):
        out[f] = tasks[f]
    return out


def test_reflector_records_order_the_row_tiles_as_the_reference():
    rng = np.random.default_rng(3)
    n = 400
    t = empty_tasks(n)
    ns = t["rows"].shape[1]
    t["type"] = rng.choice([TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE], n)
    t["rows"] = rng.integers(-1, 10 ** 6, (n, ns))
    # fstart below 0 and past the slots' end included
    lo = rng.integers(-2, ns, n)
    t["fstart"] = lo
    t["nfrows"] = rng.integers(np.maximum(1 - lo, 1), ns + 3)
    first, last = np.maximum(lo, 0), np.minimum(lo + t["nfrows"], ns)
    t["ftop"] = rng.integers(first, last)
    for f in ("vt", "vt2", "col", "c0", "nref", "aux", "fm", "fn", "front"):
        t[f] = rng.integers(0, 10 ** 6, n)
    F = rng.integers(0, 10 ** 6, n)
    got = gs.reflector_records(t, F, 17)
    ref = _reflector_records_reference(t, F, 17)
    assert got.tobytes() == ref.tobytes()


def _build_replay_plan_reference(m, fronts, tile, bundle, launch_base):
    """The plan's records, row map and levels with a loop per front."""
    recs, lau, stg, rowmap = [], [], [], []
    off = 0
    for slots, ft, la, sid, base in fronts:
        if ft is None or not len(ft):
            continue
        recs.append(gs.reflector_records(ft, base, off))
        lau.append(np.asarray(la, dtype=np.int64))
        stg.append(np.full(len(ft), sid, dtype=np.int64))
        rowmap.append(np.asarray(slots, dtype=np.int64))
        off += len(slots)
    rec = np.concatenate(recs)
    lau, stg = np.concatenate(lau), np.concatenate(stg)
    order = np.argsort(lau, kind="stable")
    keys = np.unique(lau)
    ptr = np.append(np.searchsorted(lau[order], keys), len(rec))
    return rec[order], np.concatenate(rowmap), ptr


@pytest.mark.parametrize("make", [lambda: grid3d_least_squares(8),
                                  lambda: random_least_squares(900, 300, density=0.02, seed=4)])
def test_replay_plan_and_kept_records_as_the_reference(make):
    clear_schedule_cache()
    A = make()
    an = analyze(A, cache=False)
    sched = build_schedule(an, lazy=True, dense_flops=None).materialize()
    st = sched.stages[0]
    t = st.tasks
    kk = np.flatnonzero((t["type"] == TaskType.FACTORIZE)
                        | (t["type"] == TaskType.APPLY_FACTORIZE))
    kk = kk[np.argsort(t["front"][kk], kind="stable")]
    kept = stage_reflector_records(sched, 0, st, 0)
    ref = t[kk]
    ref["F"] = 0
    assert kept.records.tobytes() == ref.tobytes()
    lay = r_layout(an, cache=False)
    nf = an.fronts.nfronts
    cnt = np.bincount(kept.records["front"], minlength=nf)
    ptr = np.concatenate(([0], np.cumsum(cnt)))
    fronts = [(lay.slots_of[f], kept.records[ptr[f]:ptr[f + 1]],
               kept.launches[ptr[f]:ptr[f + 1]], 0, int(st.foff[f])) for f in range(nf)]
    plan = gs.build_replay_plan(A.shape[0], fronts, tile=sched.tile, bundle=sched.bundle,
                                launch_base=[0], verify=True)
    rec, rowmap, lptr = _build_replay_plan_reference(A.shape[0], fronts, sched.tile,
                                                     sched.bundle, [0])
    assert plan.records.tobytes() == rec.tobytes()
    np.testing.assert_array_equal(plan.rowmap, rowmap)
    np.testing.assert_array_equal(plan.level_ptr, lptr)


def _apply_split_reference(types, c0, c1, slots, max_split, tile):
    n = len(types)
    if max_split <= 1 or n >= slots or n == 0:
        return 1
    tiles = [max(-(-(int(b) - int(a)) // tile), 0) for ty, a, b in zip(types, c0, c1)
             if ty in (TaskType.APPLY, TaskType.APPLY_FACTORIZE)]
    if not tiles:
        return 1
    s = 1
    while s < max_split and s < max(tiles):
        s = min(2 * s, max_split)
        if n - len(tiles) + sum(min(x, s) for x in tiles) >= slots:
            break
    return s


def test_apply_split_as_the_reference():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 40))
        types = rng.choice([TaskType.FACTORIZE, TaskType.APPLY, TaskType.APPLY_FACTORIZE,
                            TaskType.S_ASSEMBLE], n).astype(np.int32)
        c0 = rng.integers(0, 600, n).astype(np.int32)
        c1 = (c0 + rng.integers(-40, 600, n)).astype(np.int32)
        slots, smax = int(rng.integers(1, 120)), int(rng.choice([1, 2, 4, 8]))
        assert (apply_split(types, c0, c1, slots, smax, 32)
                == _apply_split_reference(types, c0, c1, slots, smax, 32))


def test_r_pattern_copy_does_not_hold_up_the_layout(monkeypatch):
    """A cold run's host side hands R's layout and gather maps on (the late R copy
    opens, the launches go on) before R's own copy of the pattern is made: here
    that copy waits for the last launch, which waits for the layout."""
    import threading

    from scipy_gpuqr._engine.gpu import driver, rlayout
    from scipy_gpuqr._engine.gpu.device import NumpyDevice
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.host.simulate import simulate_factorize
    from scipy_gpuqr._testing_matrices import random_values

    ready, done, waited = threading.Event(), threading.Event(), []

    class Gated(NumpyDevice):
        def launch(self, h, L, records):
            if L == 1:
                assert ready.wait(30)
            super().launch(h, L, records)
            if L == h["st"].nlaunch - 1:
                done.set()

    real_copy, real_side = rlayout.RLayout.pattern_copy, driver._host_side

    def pattern_copy(self):
        waited.append(done.wait(5))         # False: the layout waited for this copy
        return real_copy(self)

    def host_side(*a):
        out = real_side(*a)
        ready.set()
        return out

    monkeypatch.setattr(rlayout.RLayout, "pattern_copy", pattern_copy)
    monkeypatch.setattr(driver, "_host_side", host_side)
    A = random_values(grid3d_least_squares(6), np.random.default_rng(5))
    an = analyze(A, cache=False)
    g = gpu_factorize(A, an, device=Gated(32, 3))
    assert g.info["schedule_cold"] and g.info["stages"] == 1
    assert waited == [True]
    assert g.info["r_copy_progressive"]
    assert abs(g.R - simulate_factorize(A, an).R).max() == 0.0
    g.free()


def test_cold_records_made_beside_the_layout(monkeypatch):
    """A cold run's host side makes the stage's records while R's layout is made:
    here the layout waits until the records have begun."""
    import threading

    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.gpu.device import NumpyDevice
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._schedule.sparse import SparseSchedule

    begun, waited = threading.Event(), []
    real_layout, real_materialize = driver.r_layout, SparseSchedule.materialize

    def materialize(self):
        begun.set()
        return real_materialize(self)

    def r_layout(analysis, *a, **k):
        waited.append(begun.wait(5))        # False: the records came after the layout
        return real_layout(analysis, *a, **k)

    monkeypatch.setattr(SparseSchedule, "materialize", materialize)
    monkeypatch.setattr(driver, "r_layout", r_layout)
    clear_schedule_cache()
    A = grid3d_least_squares(6)
    g = gpu_factorize(A, analyze(A, cache=False), device=NumpyDevice(32, 3))
    assert g.info["schedule_cold"]
    assert waited and all(waited)
    assert all(st.materialized for st in g.schedule.stages)
    g.free()


def test_gap_bench_reports_the_spans_of_a_first_call(capsys):
    """bench/first_call_gap.py and end_to_end's spans: the pinned buffers summed
    (count, bytes, seconds), the other steps of a millisecond or more listed with
    their thread, the medians and the gap's range per tree."""
    import importlib.util
    import pathlib
    bench = pathlib.Path(__file__).resolve().parents[1] / "bench"
    spec = importlib.util.spec_from_file_location("first_call_gap", bench / "first_call_gap.py")
    fcg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fcg)
    spans = [(0.005, 0.25, "gpuqr-gpu-prefetch", "import_cupy", None),
             (0.30, 0.02, "MainThread", "pinned buffer", 30 << 20),
             (0.32, 0.01, "MainThread", "pinned buffer", 10 << 20),
             (0.33, 0.0004, "MainThread", "device.start", None)]
    fcg.e2e.print_spans("ch", spans)
    out = capsys.readouterr().out
    assert "import_cupy" in out and "gpuqr-gpu-prefetch" in out
    assert "device.start" not in out                     # under a millisecond
    assert "pinned buffers: 2, 40.0 MB, 30.0 ms (first at 300.0 ms)" in out
    rows = [{"first": f, "gap": g, "cuda_ready": 0.25, "ours": g - 0.25, "pinned_mb": 40.0,
             "pinned_s": 0.03, "nvrtc_runs": 0} for f, g in ((0.9, 0.45), (0.95, 0.5), (1.0, 0.6))]
    s = fcg.summary(rows)
    assert "n=3 first 0.950 gap +0.500 [+0.450, +0.600]" in s and "pinned 40.0 MB 30.0 ms" in s
    # the first stage's start
    for r in rows:
        r.update(begin_stage_at=0.33)
    assert "pinned 40.0 MB 30.0 ms; first begin_stage at 0.330;" in fcg.summary(rows)


# ----------------------------------------------------------------- the schedule made ahead

@pytest.mark.parametrize("k", [6, 9])
def test_the_schedule_made_ahead_is_the_one_the_call_asks_for(k, tmp_path, monkeypatch):
    """start_schedule_load reads the one-stage schedule only where its plan was
    saved before (first pass: none, nothing built; the call builds and saves it);
    the schedule it read (second pass, the scheduler's memory emptied) is the
    very object the call's own build_schedule then gets, with the arguments
    _factorize passes it for a plan that fits (plan_for_memory with room to
    spare, the dense fronts' rule unchanged): a hit of the scheduler's cache,
    nothing read or built again."""
    import threading

    from scipy_gpuqr import _store
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.memory import plan_for_memory
    from scipy_gpuqr._schedule import sparse
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS, DENSE_COLUMNS_PER_LAUNCH
    monkeypatch.setenv("SCIPY_GPUQR_SCHEDULE_CACHE", str(tmp_path))
    A = grid3d_least_squares(k)
    reads = []
    real_read = _store.read_mapped

    def read(path, **kw):                           # the plan files' reads (the store maps
        if Path(path).parent.name == "plans":       # analyses and layouts too)
            reads.append(threading.current_thread().name)
        return real_read(path, **kw)
    monkeypatch.setattr(_store, "read_mapped", read)
    for saved in (False, True):
        sparse.clear_schedule_cache()
        an = analyze(A)
        first = len(reads)
        fut = driver.start_schedule_load(an, tile=32, bundle=3, pipelining=True, max_tasks=None,
                                         dense_flops=DEFAULT_DENSE_FLOPS,
                                         dense_columns_per_launch=DENSE_COLUMNS_PER_LAUNCH)
        early = fut.result()
        assert (early is None) == (not saved)
        n_reads = len(reads)
        needs = driver.stage_needs(an, DEFAULT_DENSE_FLOPS, tile=32, bundle=3,
                                   pipelining=True, itemsize=8, panel=256)
        mplan = plan_for_memory(an, needs, 1 << 40, None)
        assert len(mplan.plan.stages) == 1
        got = sparse.build_schedule(an, tile=32, bundle=3, pipelining=True, max_gpu_memory=None,
                                    max_tasks=None, lazy=True, dense_flops=DEFAULT_DENSE_FLOPS,
                                    dense_columns_per_launch=DENSE_COLUMNS_PER_LAUNCH,
                                    plan=mplan.plan, dense_extra=None)
        if saved:
            assert got is early
            assert len(reads) == n_reads            # the call read nothing
            assert set(reads[first:]) == {"gpuqr-schedule-load_0"}      # the worker did
        else:
            got.materialize()
            _store.flush()                          # the plan file written
    sparse.clear_schedule_cache()


def test_no_schedule_ahead_where_the_plan_has_stages(monkeypatch):
    from scipy_gpuqr._engine.gpu import driver
    an = analyze(grid3d_least_squares(6))

    class _Staged:
        stages = ((0, 3), (4, an.fronts.nfronts - 1))
    monkeypatch.setattr(type(an), "stage_plan", lambda self, budget: _Staged())
    assert driver.start_schedule_load(an, tile=32, bundle=3, pipelining=True, max_tasks=None,
                                      dense_flops=None, dense_columns_per_launch=1) is None
