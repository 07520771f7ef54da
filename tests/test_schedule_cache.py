"""The schedule cache store: tile schedules and whole plans on disk (CPU only;
temporary folders, never the user's)."""

import numpy as np
import pytest

from scipy_gpuqr._schedule import bucket, cache
from scipy_gpuqr._schedule.sparse import build_schedule, schedule_digest
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    # files written at once, so the tests see them (the writer thread: its own test)
    monkeypatch.setattr(cache, "write_behind", lambda fn, *a: fn(*a))
    bucket.clear_cache()
    yield tmp_path
    bucket.clear_cache()


@pytest.fixture
def count_simulations(monkeypatch):
    calls = []
    real = bucket._simulate

    def counted(patterns, *a, **k):
        calls.append(len(patterns))
        return real(patterns, *a, **k)

    monkeypatch.setattr(bucket, "_simulate", counted)
    return calls


def _make(cols, entries):
    """What the bucket scheduler hands the store to make its tile schedules."""
    return bucket._schedules_of_rows(cols, entries)


def _files(d):
    return sorted(p.name for p in d.rglob("seg-*.bin"))


def _cold(an, **kw):
    """A schedule as a new process with this disk cache builds it, without the
    whole-plan files (as for a new matrix of known tile patterns)."""
    import shutil
    folder = cache.folder()
    if folder is not None:
        shutil.rmtree(folder / "plans", ignore_errors=True)
    bucket.clear_cache()
    return build_schedule(an, cache=False, **kw)


# the pinned digests of tests/test_schedule_build.py::test_records_pinned (as built)
@pytest.mark.parametrize("kw, digest", [
    (dict(), "a375062ae840473b"),
    (dict(dense_flops=1e6, max_tasks=300), "2eede77e42e9fa65"),
    (dict(tile=16, pipelining=False), "a6f5b70f54105113"),
])
def test_schedule_from_disk_is_the_simulated_one(cache_dir, count_simulations, kw, digest):
    an = analyze(grid3d_least_squares(10))
    assert schedule_digest(_cold(an, **kw)) == digest           # simulated, written
    assert len(count_simulations) == 1
    assert len(_files(cache_dir)) == 1
    assert schedule_digest(_cold(an, **kw)) == digest           # read back, nothing simulated
    assert len(count_simulations) == 1


def test_off_writes_nothing(tmp_path, monkeypatch, count_simulations):
    monkeypatch.setenv(cache.ENV, "off")
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    assert cache.folder() is None
    an = analyze(grid3d_least_squares(6))
    _cold(an)
    _cold(an)
    assert len(count_simulations) == 2
    assert not any(tmp_path.rglob("*"))


def test_default_folder_follows_the_package_cache_dir(tmp_path):
    env = {"SCIPY_GPUQR_CACHE_DIR": str(tmp_path)}
    assert cache.folder(env) == tmp_path / "tile_schedules"
    assert cache.folder({"XDG_CACHE_HOME": str(tmp_path)}) == \
        tmp_path / "scipy_gpuqr" / "tile_schedules"
    assert cache.folder({cache.ENV: str(tmp_path / "x"), **env}) == tmp_path / "x"


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "stamp"])
def test_damaged_or_stale_file_is_ignored_and_replaced(cache_dir, count_simulations,
                                                       monkeypatch, damage):
    an = analyze(grid3d_least_squares(8))
    want = schedule_digest(_cold(an))
    path, = cache_dir.rglob("seg-*.bin")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0x10                           # a rows byte: the CRC fails
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "garbage":
        data = bytearray(b"\x00" * 64)
    elif damage == "empty":
        data = bytearray()
    else:                                            # written by other bucket rules
        monkeypatch.setattr(cache, "rules_stamp", lambda: "another-stamp")
    path.write_bytes(bytes(data))
    n = len(count_simulations)
    assert schedule_digest(_cold(an)) == want
    assert len(count_simulations) == n + 1          # simulated again
    assert schedule_digest(_cold(an)) == want
    assert len(count_simulations) == n + 1          # the rewritten segment is good
    if damage in ("flip", "truncate"):               # ours, damaged: deleted
        assert not path.exists()


def test_patterns_of_two_problems_merge_and_partial_hits_gather(cache_dir,
                                                                count_simulations):
    a = analyze(grid3d_least_squares(10))
    b = analyze(chessboard_boundary(4, 5, 2))
    da, db = schedule_digest(_cold(a)), schedule_digest(_cold(b))
    assert len(count_simulations) == 2
    assert schedule_digest(_cold(b)) == db                   # a few of the file's rows: gathered
    assert schedule_digest(_cold(a)) == da
    assert len(count_simulations) == 2               # both from their segments
    assert len(_files(cache_dir)) == 2


def _random_patterns(seed, count, lo=0):
    rng = np.random.default_rng(seed)
    pats = []
    for _ in range(count):
        nrt = int(rng.integers(lo, 25))
        nct = int(rng.integers(1, 20))
        nfct = int(rng.integers(0, min(nct, nrt) + 1)) if nrt else 0
        b = np.minimum(np.sort(rng.integers(0, nct + 2, nrt)), np.arange(nrt))
        b[b >= nfct] = -1
        pats.append((b.astype(np.int32), nct, nfct))
    return pats


def _keys(pats):
    return [(b.tobytes(), nct, nfct) for b, nct, nfct in pats]


def test_processes_writing_at_once_lose_nothing(cache_dir):
    tun = (3, True, 16)
    pa, pb, pc = (_random_patterns(s, 8, lo=2) for s in (1, 2, 3))
    path = cache.store(tun).path
    mine = cache.PatternStore(path, tun)
    other = cache.PatternStore(path, tun)            # "another process"
    assert mine.add(_keys(pa), bucket._simulate(pa, 3, True, 16))
    assert mine.lookup(_keys(pa[:1]), _make)
    other.lookup([], _make)                           # scans a's segment
    mine.add(_keys(pb), bucket._simulate(pb, 3, True, 16))
    other.add(_keys(pc), bucket._simulate(pc, 3, True, 16))
    fresh = cache.PatternStore(path, tun)
    assert len(fresh.lookup(_keys(pa + pb + pc), _make)) == len(set(_keys(pa + pb + pc)))
    assert len(_files(cache_dir)) == 3


def test_folder_is_bounded_oldest_segments_out(cache_dir):
    pats = [p for p in _random_patterns(3, 60, lo=4) if p[2] > 0][:30]
    st = cache.store((3, True, 16))
    st.max_bytes = 6_000
    st.max_segments = 4
    for k in range(0, len(pats), 5):
        bucket.tile_schedules(pats[k:k + 5], bundle=3, granule=16)
    segs = list(st.path.glob("seg-*.bin"))
    assert 0 < len(segs) <= 4
    assert sum(p.stat().st_size for p in segs) <= 6_000 or len(segs) == 1
    again = cache.PatternStore(st.path, (3, True, 16))
    found = again.lookup(_keys(pats), _make)
    assert _keys(pats[-1:])[0] in found               # the newest segment is kept
    assert _keys(pats[:1])[0] not in found            # the oldest went first
    assert all(k in found for k in _keys(pats[-5:]))


def test_random_patterns_round_trip(cache_dir):
    pats = _random_patterns(11, 60)
    want = bucket.tile_schedules(pats, bundle=2, pipelining=False, granule=3)
    bucket.clear_cache()
    got = bucket.tile_schedules(pats[::2], bundle=2, pipelining=False, granule=3)
    for s, w in zip(got, want[::2]):
        for k in w.rcols:
            np.testing.assert_array_equal(s.rcols[k], w.rcols[k])
            assert s.rcols[k].dtype == w.rcols[k].dtype
        np.testing.assert_array_equal(s.row_ptr, w.row_ptr)
        np.testing.assert_array_equal(s.launch_ptr, w.launch_ptr)
        assert s.row_ptr.dtype == w.row_ptr.dtype and s.launch_ptr.dtype == w.launch_ptr.dtype
        assert (s.nlaunch, s.nvt, s.nct, s.granule) == (w.nlaunch, w.nvt, w.nct, w.granule)
        assert s.tasks.tobytes() == w.tasks.tobytes()
        assert not s.rcols["rows"].flags.writeable and not s.row_ptr.flags.writeable


def test_lookup_reads_only_the_patterns_hit(cache_dir):
    # rows are read per run of adjacent patterns hit, each pattern's CRC checked:
    # damage in a pattern not asked for goes unseen, in one asked for drops the segment
    pats = [p for p in _random_patterns(5, 40, lo=3) if p[2] > 0][:20]
    bucket.tile_schedules(pats, bundle=3, granule=16)
    st = cache.store((3, True, 16))
    seg = st._segs[0]
    span = seg.keys["span"]
    j0 = next(j for j, k in enumerate(_keys(pats)) if st._index[k][1] == 0)
    assert span[1] > span[0]
    data = bytearray(seg.path.read_bytes())
    data[seg.rows_at + int(span[0]) * seg.rec.itemsize] ^= 0x01   # pattern 0's first row
    seg.path.write_bytes(bytes(data))
    fresh = cache.PatternStore(st.path, (3, True, 16))
    others = [k for j, k in enumerate(_keys(pats)) if j != j0]
    got = fresh.lookup(others, _make)
    assert len(got) == len(set(others))
    want = bucket._simulate([pats[j] for j, k in enumerate(_keys(pats)) if j != j0], 3, True, 16)
    for k, w in zip(others, want):
        assert got[k].tasks.tobytes() == w.tasks.tobytes()
    assert fresh.lookup(_keys(pats[j0:j0 + 1]), _make) == {}
    assert not seg.path.exists()                       # damaged: deleted


def test_bound_deletes_the_least_recently_used_segment(cache_dir):
    import os
    tun = (3, True, 16)
    groups = [[p for p in _random_patterns(20 + s, 12, lo=3) if p[2] > 0][:3] for s in range(4)]
    st = cache.store(tun)
    st.max_segments = 3
    for t, g in enumerate(groups[:3]):
        assert st.add(_keys(g), bucket._simulate(g, 3, True, 16))
        seg = st._segs[-1]
        os.utime(seg.path, ns=(10 ** 18 + t * 10 ** 9,) * 2)   # written in this order
    first = st._segs[0].path
    reader = cache.PatternStore(st.path, tun)
    assert reader.lookup(_keys(groups[0][:1]), _make)        # the oldest used now
    assert st.add(_keys(groups[3]), bucket._simulate(groups[3], 3, True, 16))
    left = set(st.path.glob("seg-*.bin"))
    assert first in left and st._segs[1].path not in left and len(left) == 3


# ------------------------------------------------------------------ whole plans

def _same_schedule(a, b):
    assert schedule_digest(a) == schedule_digest(b)
    for name in ("tile", "bundle", "granule", "pipelining", "vt_size", "critical_path",
                 "dense_flops", "dense", "nlaunch", "ntasks", "nlaunch_with_tasks"):
        assert getattr(a, name) == getattr(b, name), name
    np.testing.assert_array_equal(a.vt_base, b.vt_base)
    np.testing.assert_array_equal(a.nfact, b.nfact)
    assert len(a.stages) == len(b.stages)
    for sa, sb in zip(a.stages, b.stages):
        for name in ("fronts", "carried", "pool_size", "s_range", "finish", "dense",
                     "dense_join", "nlaunch", "ntasks"):
            assert getattr(sa, name) == getattr(sb, name), name
        np.testing.assert_array_equal(sa.foff, sb.foff)
        np.testing.assert_array_equal(sa.launch_ptr, sb.launch_ptr)
        for L0, L1 in sa.launch_chunks():
            assert all(x.tobytes() == y.tobytes()
                       for x, y in zip(sa.launch_range(L0, L1), sb.launch_range(L0, L1)))


def _same_plan_arrays(a, b):
    """Every array and fact a plan file keeps of ``a`` and ``b``
    (:func:`~scipy_gpuqr._schedule.sparse._plan_arrays`: the templates, the blocks,
    the assembly records, the offsets, the dicts, the records where kept) equal:
    dtype, shape and bytes."""
    from scipy_gpuqr._schedule import sparse
    xa, fa = sparse._plan_arrays(a)
    xb, fb = sparse._plan_arrays(b)
    assert fa == fb
    assert sorted(xa) == sorted(xb)
    for k in xa:
        assert (xa[k].dtype, xa[k].shape) == (xb[k].dtype, xb[k].shape), k
        assert xa[k].tobytes() == xb[k].tobytes(), k


def _mapped(arr) -> bool:
    """Whether ``arr`` is a view of a mapped file (no copy of its bytes)."""
    import mmap
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


@pytest.fixture
def count_builds(monkeypatch):
    from scipy_gpuqr._schedule import sparse
    calls = []
    real = sparse._build

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(sparse, "_build", counted)
    return calls


@pytest.mark.parametrize("kw", [dict(), dict(dense_flops=1e6, max_tasks=300),
                                dict(tile=16, pipelining=False), dict(budget_div=3),
                                dict(budget_div=2, dense_flops=1e6)])
def test_plan_from_disk_is_the_built_one(cache_dir, count_builds, kw):
    an = analyze(grid3d_least_squares(10))
    kw = dict(kw)
    div = kw.pop("budget_div", None)
    if div:
        kw["max_gpu_memory"] = int(an.gpu_bytes // div)
    built = build_schedule(an, cache=False, lazy=True, **kw)
    assert len(count_builds) == 1
    assert not list(cache_dir.rglob("plan-*.bin"))    # written once materialized
    built.materialize()
    assert len(list(cache_dir.rglob("plan-*.bin"))) == 1
    if div:
        assert len(built.stages) > 1
    again = build_schedule(analyze(grid3d_least_squares(10)), cache=False, lazy=True, **kw)
    assert len(count_builds) == 1                     # from the file
    _same_schedule(built, again)
    _same_plan_arrays(built, again)
    other = dict(kw, granule=3)                        # other arguments: built
    build_schedule(an, cache=False, lazy=True, **other)
    assert len(count_builds) == 2


def test_plan_of_another_structure_is_never_used(cache_dir, count_builds, monkeypatch):
    monkeypatch.setattr(cache, "_plan_key", lambda fp, args: "same")   # every key collides
    a = analyze(grid3d_least_squares(8))
    b = analyze(chessboard_boundary(4, 5, 2))
    build_schedule(a, cache=False)
    sb = build_schedule(b, cache=False)                # a's file, b's structure: built
    assert len(count_builds) == 2
    _same_schedule(sb, build_schedule(b, cache=False))
    assert len(count_builds) == 2                      # b's file now


@pytest.mark.parametrize("damage", ["flip", "truncate", "stamp"])
def test_damaged_or_stale_plan_is_rebuilt(cache_dir, count_builds, monkeypatch, damage):
    an = analyze(grid3d_least_squares(8))
    want = build_schedule(an, cache=False, lazy=True).materialize()
    path, = cache_dir.rglob("plan-*.bin")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-50] ^= 0x04
    elif damage == "truncate":
        data = data[:len(data) - 100]
    path.write_bytes(bytes(data))
    if damage == "stamp":
        real = cache.source_stamp
        monkeypatch.setattr(cache, "source_stamp",
                            lambda names: real(names) + ("x" if "sparse.py" in names else ""))
    got = build_schedule(an, cache=False, lazy=True).materialize()
    assert len(count_builds) == 2
    _same_schedule(want, got)
    build_schedule(an, cache=False, lazy=True)
    assert len(count_builds) == 2                      # the rewritten file is good


def test_small_families_from_disk_equal_built(cache_dir, monkeypatch):
    # degenerate shapes (empty arrays, single rows, no fronts) through both disk caches
    from scipy_gpuqr._testing_matrices import small_families
    for name, A in small_families():
        an = analyze(A)
        for kw in (dict(), dict(dense_flops=1e3), dict(max_tasks=50)):
            monkeypatch.setenv(cache.ENV, "off")
            want = build_schedule(an, cache=False, lazy=True, **kw)
            monkeypatch.setenv(cache.ENV, str(cache_dir))
            build_schedule(an, cache=False, lazy=True, **kw).materialize()   # written
            bucket.clear_cache()
            got = build_schedule(analyze(A), cache=False, lazy=True, **kw)   # read
            _same_schedule(want, got)


def test_plan_fingerprint_covers_every_front_array_the_builder_reads():
    # a plan file is keyed by the front arrays listed in the cache store: a builder
    # that starts reading another one must list it there too
    import re
    from pathlib import Path

    here = Path(cache.__file__).parent
    read = set()
    for name in ("sparse.py", "dense.py", "bucket.py"):
        read |= set(re.findall(r"\bfs\.([a-z_]+)", (here / name).read_text()))
    assert read - {"nfronts"} <= set(cache._FRONT_ARRAYS), read - set(cache._FRONT_ARRAYS)
    assert "fronts" in set(re.findall(r"\banalysis\.([a-z_]+)", (here / "sparse.py").read_text()))


def test_cache_files_written_behind_the_caller(tmp_path, monkeypatch):
    import threading
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    bucket.clear_cache()
    gate = threading.Event()
    real = cache.PatternStore.add

    def slow_add(self, keys, scheds):
        assert gate.wait(30)
        return real(self, keys, scheds)

    monkeypatch.setattr(cache.PatternStore, "add", slow_add)
    an = analyze(grid3d_least_squares(8))
    want = schedule_digest(build_schedule(an, cache=False))   # returns with the write held
    assert not list(tmp_path.rglob("seg-*.bin"))
    gate.set()
    cache.flush()
    assert len(list(tmp_path.rglob("seg-*.bin"))) == 1
    assert len(list(tmp_path.rglob("plan-*.bin"))) == 1
    cache.write_behind(lambda: 1 / 0)                     # errors: not written, no raise
    cache.flush()
    bucket.clear_cache()
    assert schedule_digest(build_schedule(analyze(grid3d_least_squares(8)), cache=False)) == want
    bucket.clear_cache()


def test_the_store_imports_no_scheduler():
    # one store for both kinds of entry, below the schedulers: they hand it functions
    import ast
    from pathlib import Path
    tree = ast.parse(Path(cache.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    assert not names & {"bucket", "sparse", "dense", "native", ".bucket", ".sparse",
                        ".dense", ".native"}, names


def test_one_store_for_schedules_plans_and_analyses(cache_dir, monkeypatch):
    # the storage rules sit below both users (the schedulers and the symbolic
    # analysis), which keep their entries in one folder
    import ast
    from pathlib import Path

    from scipy_gpuqr import _store
    from scipy_gpuqr._symbolic import analysis_cache
    tree = ast.parse(Path(_store.__file__).read_text())
    mods = {("." * n.level + (n.module or "")) for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom)}
    assert not {m for m in mods if "_schedule" in m or "_symbolic" in m}, mods
    assert cache.folder is _store.folder and cache.ENV == _store.ENV
    monkeypatch.setattr(analysis_cache, "DISK_MIN_NNZ", 0)
    monkeypatch.setattr(_store, "write_behind", lambda fn, *a: fn(*a))
    analysis_cache.clear()
    build_schedule(analyze(grid3d_least_squares(6)), cache=False, lazy=True).materialize()
    assert {p.parent.name for p in cache_dir.rglob("*.bin")} == \
        {"b3-p1-g16", "plans", "analyses"}
    analysis_cache.clear()


@pytest.mark.parametrize("kw", [dict(), dict(dense_flops=1e6, max_tasks=300),
                                dict(budget_div=2, dense_flops=1e6)])
def test_plan_file_keeps_the_records_and_a_new_process_makes_none(cache_dir, monkeypatch, kw):
    from scipy_gpuqr._schedule import sparse
    an = analyze(grid3d_least_squares(10))
    kw = dict(kw)
    div = kw.pop("budget_div", None)
    if div:
        kw["max_gpu_memory"] = int(an.gpu_bytes // div)
    built = build_schedule(an, cache=False, lazy=True, **kw)
    assert not built.stages[0].materialized
    digest = schedule_digest(built.materialize())                   # the file written
    monkeypatch.setattr(sparse._StageMaker, "records",
                        lambda *a: pytest.fail("records made again from the plan"))
    bucket.clear_cache()
    again = build_schedule(analyze(grid3d_least_squares(10)), cache=False, lazy=True, **kw)
    assert all(st.materialized for st in again.stages)
    _same_schedule(built, again)
    assert schedule_digest(again) == digest


def test_plan_file_without_records_past_the_bound(cache_dir, monkeypatch, count_builds):
    from scipy_gpuqr._schedule import sparse
    monkeypatch.setattr(sparse, "PLAN_RECORDS_MAX_BYTES", 1000)
    an = analyze(grid3d_least_squares(8))
    built = build_schedule(an, cache=False, lazy=True).materialize()
    again = build_schedule(an, cache=False, lazy=True)               # from the file
    assert len(count_builds) == 1
    assert not again.stages[0].materialized
    _same_plan_arrays(built, again)                 # the plan the records are made of
    _same_schedule(built, again)


@pytest.mark.parametrize("A", [grid3d_least_squares(10), chessboard_boundary(4, 5, 2)],
                         ids=["grid10", "ch4-5-b2"])
def test_schedule_made_ahead_from_its_file_equals_the_built_one(cache_dir, count_builds, A):
    # what a new process's schedule-load worker reads (the engine's arguments,
    # stored_only) is the schedule built, array by array; its arrays are views of
    # the mapped file (no copy), writable as a built schedule's
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS, DENSE_COLUMNS_PER_LAUNCH
    kw = dict(tile=32, bundle=3, pipelining=True, max_gpu_memory=None, max_tasks=None,
              lazy=True, dense_flops=DEFAULT_DENSE_FLOPS,
              dense_columns_per_launch=DENSE_COLUMNS_PER_LAUNCH, cache=False)
    an = analyze(A)
    assert build_schedule(an, stored_only=True, **kw) is None          # nothing stored
    built = build_schedule(an, **kw).materialize()                      # the file written
    bucket.clear_cache()
    got = build_schedule(analyze(A), stored_only=True, **kw)
    assert len(count_builds) == 1
    _same_plan_arrays(built, got)
    _same_schedule(built, got)
    st = got.stages[0]
    for arr in (st.tasks, st._maker.asm, st._maker.ctx.rows, got.vt_base, st.foff):
        assert _mapped(arr) and arr.flags.writeable


def test_writes_to_a_loaded_plan_stay_in_the_process(cache_dir):
    # the plan file is mapped privately (copy-on-write): a write to the loaded
    # schedule's arrays changes neither the file nor the next load
    an = analyze(grid3d_least_squares(8))
    built = build_schedule(an, cache=False, lazy=True).materialize()
    digest = schedule_digest(built)
    path, = cache_dir.rglob("plan-*.bin")
    raw = path.read_bytes()
    got = build_schedule(an, cache=False, lazy=True)                  # from the file
    assert schedule_digest(got) == digest
    st = got.stages[0]
    st.tasks.view(np.int64)[:] = -1
    st._maker.ctx.rows[:] = -1
    got.vt_base[:] = -1
    assert path.read_bytes() == raw
    again = build_schedule(an, cache=False, lazy=True)
    assert schedule_digest(again) == digest
    _same_plan_arrays(built, again)


def test_plan_file_records_of_another_count_are_damage(cache_dir, count_builds):
    from scipy_gpuqr._schedule import sparse
    an = analyze(grid3d_least_squares(8))
    built = build_schedule(an, cache=False, lazy=True)
    a, facts = sparse._plan_arrays(built)
    a["s0_tasks"] = a["s0_tasks"][:-1]
    with pytest.raises(ValueError, match="records"):
        sparse._plan_of_arrays(a, facts, an.fronts, {"tile": 32, "bundle": 3, "granule": 16,
                                                     "pipelining": True, "dense_flops": None})


@pytest.fixture
def whole_stage_records(monkeypatch):
    """``(stage maker, thread name)`` of every build of a whole stage's records."""
    import threading

    from scipy_gpuqr._schedule import sparse
    made = []
    real = sparse._StageMaker.records

    def records(self, L0, L1):
        if L0 == 0 and L1 == len(self.launch_ptr) - 1:
            made.append((self, threading.current_thread().name))
        return real(self, L0, L1)

    monkeypatch.setattr(sparse._StageMaker, "records", records)
    return made


def _kw(an, kw):
    kw = dict(kw)
    div = kw.pop("budget_div", None)
    if div:
        kw["max_gpu_memory"] = int(an.gpu_bytes // div)
    return kw


@pytest.mark.parametrize("kw", [dict(), dict(dense_flops=1e6, max_tasks=300),
                                dict(budget_div=2, dense_flops=1e6)])
def test_plan_written_from_the_records_the_call_made(cache_dir, monkeypatch,
                                                     whole_stage_records, kw):
    # a lazy schedule's plan goes to the writer once the call has made every record
    # (materialize, here on a thread of the call's), and the file takes those: no
    # stage's records made on the writer thread, none made twice; the file holds
    # what an independent build encodes (records included)
    import threading

    from scipy_gpuqr import _store
    from scipy_gpuqr._schedule import sparse
    handed = []

    def real_writer(fn, *a):
        if fn is cache.save_plan:
            handed.append(a)
        _store.write_behind(fn, *a)

    monkeypatch.setattr(cache, "write_behind", real_writer)
    an = analyze(grid3d_least_squares(10))
    kw = _kw(an, kw)
    built = build_schedule(an, cache=False, lazy=True, **kw)
    list(built.iter_launches())                 # the launch loop: records not kept
    cache.flush()
    assert not handed and not list(cache_dir.rglob("plan-*.bin"))
    assert not any(st.materialized for st in built.stages)
    whole_stage_records.clear()                 # (a small stage: one chunk of launches)
    t = threading.Thread(target=built.materialize, name="the-call")
    t.start()
    t.join()
    built.materialize()                          # again: nothing more written
    cache.flush()
    assert len(handed) == 1
    assert [m for m, _ in whole_stage_records] == [st._maker for st in built.stages]
    assert {name for _, name in whole_stage_records} == {"the-call"}
    path, = cache_dir.rglob("plan-*.bin")
    stored = cache.load_plan(handed[0][0], lambda a, facts: (dict(a), facts))
    monkeypatch.setenv(cache.ENV, "off")
    ref = build_schedule(an, cache=False, lazy=True, **kw)
    want = [(st._maker, st._maker.records(0, st.nlaunch)) for st in ref.stages]
    a, facts = sparse._plan_arrays(ref)
    assert stored[1] == facts
    assert set(a) == {k for k in stored[0] if not k.startswith("fp_")}
    for k, v in a.items():
        assert v.dtype == stored[0][k].dtype and np.array_equal(v, stored[0][k]), k
    for i, (_, rec) in enumerate(want):
        assert stored[0][f"s{i}_tasks"].tobytes() == rec.tobytes()


def test_plan_of_a_whole_build_written_from_its_records(cache_dir, monkeypatch,
                                                        whole_stage_records):
    # build_schedule(lazy=False) materializes on the caller: the file takes those
    import threading

    from scipy_gpuqr import _store
    monkeypatch.setattr(cache, "write_behind", _store.write_behind)     # the real writer
    an = analyze(grid3d_least_squares(10))
    built = build_schedule(an, cache=False, max_gpu_memory=int(an.gpu_bytes // 2))
    cache.flush()
    assert len(built.stages) > 1 and len(list(cache_dir.rglob("plan-*.bin"))) == 1
    assert [m for m, _ in whole_stage_records] == [st._maker for st in built.stages]
    assert {name for _, name in whole_stage_records} == {threading.main_thread().name}


_PLAN_CHILD = r"""
import json, sys
from scipy_gpuqr import _store
from scipy_gpuqr._schedule import sparse
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
second, div = sys.argv[1] == "second", int(sys.argv[2])
if second:
    def no(*a, **k):
        raise AssertionError("made again in the second process")
    sparse._build = no
    sparse._StageMaker.records = no
an = analyze(grid3d_least_squares(10), cache=False)
kw = dict(lazy=True, dense_flops=1e6)
if div:
    kw["max_gpu_memory"] = int(an.gpu_bytes // div)
s = sparse.build_schedule(an, stored_only=second, **kw)
done = [st.materialized for st in s.stages]
digest = sparse.schedule_digest(s.materialize())      # the first: as a call, the file written
_store.flush()
print(json.dumps({"digest": digest, "materialized": done, "stages": len(s.stages)}))
"""


@pytest.mark.parametrize("div", [0, 2])
def test_a_new_process_materializes_the_plan_without_making_records(tmp_path, div):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, SCIPY_GPUQR_SCHEDULE_CACHE=str(tmp_path),
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = []
    for which in ("first", "second"):
        r = subprocess.run([sys.executable, "-c", _PLAN_CHILD, which, str(div)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert not any(out[0]["materialized"]) and all(out[1]["materialized"])
    assert out[0]["stages"] == out[1]["stages"] == (1 if not div else out[0]["stages"])
    assert div == 0 or out[0]["stages"] > 1
    assert out[0]["digest"] == out[1]["digest"]
    assert len(list(tmp_path.rglob("plan-*.bin"))) == 1


def test_cold_engine_call_makes_each_stage_once_and_writes_the_plan(cache_dir, monkeypatch,
                                                                    whole_stage_records):
    # the GPU engine's cold call (host layer) materializes its lazy schedule on a
    # worker; the plan file is written from those records, not made again
    from scipy_gpuqr import _store
    from scipy_gpuqr._engine.gpu.device import NumpyDevice
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._schedule.sparse import clear_schedule_cache
    monkeypatch.setattr(cache, "write_behind", _store.write_behind)     # the real writer
    monkeypatch.setenv(_store.ENV, str(cache_dir))
    clear_schedule_cache()
    A = grid3d_least_squares(7)
    an = analyze(A, cache=False)
    g = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    assert g.info["schedule_cold"]
    _store.flush()
    assert len(list(cache_dir.rglob("plan-*.bin"))) == 1
    assert [m for m, _ in whole_stage_records] == [st._maker for st in g.schedule.stages]
    assert not any(name.startswith("scipy_gpuqr-cache-write") for _, name in whole_stage_records)
    g.free()
    clear_schedule_cache()


def test_memory_plan_counts_of_stored_patterns_read_no_rows(cache_dir, monkeypatch):
    from scipy_gpuqr._engine.memory import vt_elements
    an = analyze(grid3d_least_squares(10))
    kw = dict(tile=32, bundle=3, pipelining=True, granule=16)
    want = vt_elements(an, **kw)                     # simulated, the segment written
    assert want[0].sum() > 0 and want[1].sum() > 0
    bucket.clear_cache()
    cache.forget()
    monkeypatch.setattr(cache, "_load_rows", lambda *a: pytest.fail("rows read"))
    monkeypatch.setattr(bucket, "_simulate", lambda *a: pytest.fail("simulated"))
    got = vt_elements(analyze(grid3d_least_squares(10)), **kw)
    assert all(np.array_equal(x, y) for x, y in zip(want, got))


def test_memory_plan_counts_of_patterns_not_stored_are_simulated(cache_dir, monkeypatch,
                                                                 count_simulations):
    from scipy_gpuqr._engine.memory import vt_elements
    an = analyze(grid3d_least_squares(9))
    kw = dict(tile=32, bundle=3, pipelining=True, granule=16)
    monkeypatch.setenv(cache.ENV, "off")
    want = vt_elements(an, **kw)
    bucket.clear_cache()
    monkeypatch.setenv(cache.ENV, str(cache_dir))
    assert all(np.array_equal(x, y) for x, y in zip(want, vt_elements(an, **kw)))
    assert len(count_simulations) == 2
