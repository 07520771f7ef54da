"""``Q``'s replay plan kept on disk between processes (:mod:`scipy_gpuqr._engine.gpu.replay_store`;
CPU only: the NumPy device layer, temporary folders, never the user's)."""

import numpy as np
import pytest

from scipy_gpuqr import _store
from scipy_gpuqr._engine.gpu import replay_store, rlayout, stage_loop
from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.memory import front_needs, min_budget, plan_for_memory, vt_elements
from scipy_gpuqr._schedule.dense import dense_front_mask
from scipy_gpuqr._schedule.sparse import clear_schedule_cache
from scipy_gpuqr._schedule.tasks import DEFAULT_APPLY_GRANULE
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    monkeypatch.setattr(gs, "write_behind", lambda fn, *a: fn(*a))        # at once
    monkeypatch.setattr(rlayout, "write_behind", lambda fn, *a: fn(*a))
    _forget()
    yield tmp_path
    _forget()


def _forget():
    """A new process's memory: no schedule, layout or replay plan kept."""
    clear_schedule_cache()
    rlayout.clear_r_layout_cache()


def _files(d):
    return sorted(d.rglob("rpl-*.bin"))


@pytest.fixture(scope="module")
def A():
    return random_values(grid3d_least_squares(6), np.random.default_rng(5))


TILE, BUNDLE = 32, 3


def _staged_limit(an, dense_flops):
    """A device limit that stages ``an``'s factorization (a quarter of the way from
    the smallest plan to one stage, as the staging tests do)."""
    dense = dense_front_mask(an, dense_flops)
    vt = vt_elements(an, tile=TILE, bundle=BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    needs = front_needs(an, 8, tile=TILE, vt_elems=vt, dense=dense)
    need = plan_for_memory(an, needs, None).peak
    floor = min_budget(an, needs)
    return floor + (need - floor) // 4


def _factorize(A, *, staged=False, dense_flops=None):
    an = analyze(A)
    limit = _staged_limit(an, dense_flops) if staged else None
    return gpu_factorize(A, an, device=NumpyDevice(TILE, BUNDLE, memory_limit=limit),
                         dense_flops=dense_flops)


def _fresh(g):
    """The plan built from ``g``'s records now (no cache of any kind)."""
    fronts = []
    for f, (slots, _, tasks) in enumerate(g._fronts):
        sid, off = g._front_loc[f]
        fronts.append((slots, tasks, g._front_launch[f], sid, off))
    return gs.build_replay_plan(g.shape[0], fronts, tile=g.schedule.tile,
                                bundle=g.schedule.bundle, launch_base=g._launch_base,
                                dense=g._dense, verify=True)


def _same_plan(got, ref):
    """Field by field, bit for bit (dense fronts: the same objects)."""
    assert (got.m, got.tile, got.bundle) == (ref.m, ref.tile, ref.bundle)
    assert got.records.dtype == ref.records.dtype
    assert got.records.tobytes() == ref.records.tobytes()
    for k in ("rowmap", "level_ptr", "level_stage"):
        x, y = getattr(got, k), getattr(ref, k)
        assert x.dtype == y.dtype, k
        np.testing.assert_array_equal(x, y, err_msg=k)
    assert got.level_dense_fronts == ref.level_dense_fronts
    assert got.level_dense.keys() == ref.level_dense.keys()
    for lv, objs in ref.level_dense.items():
        assert [id(o) for o in got.level_dense[lv]] == [id(o) for o in objs]


def _pools(g):
    def pools(sid):
        pool = g._stage_pools.get(sid)
        return pool if pool is not None else g._host_pools[sid]
    return pools


def _replays_equal(g, plan, ref_plan):
    """Qᵀ B and Q B through ``plan`` equal those through ``ref_plan`` bit for bit,
    and the host replay to rounding."""
    B = np.random.default_rng(2).standard_normal((g.shape[0], 3))
    for trans in (True, False):
        got = gs.apply_plan(g, B, trans, gs.NumpyExecutor(plan, _pools(g), g._device.vt))
        g._replay["plan"] = ref_plan
        ref = gs.apply_plan(g, B, trans, gs.NumpyExecutor(ref_plan, _pools(g), g._device.vt))
        g._replay["plan"] = plan
        assert got.tobytes() == ref.tobytes()
        host = gs.host_matmul(g, B, trans=trans)
        np.testing.assert_allclose(got, host, rtol=1e-12, atol=1e-12)


def _no_build(monkeypatch):
    calls = []
    real = gs.build_replay_plan
    monkeypatch.setattr(gs, "build_replay_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


CASES = {
    "one stage": {},
    "dense fronts": {"dense_flops": 2e5},
    "staged": {"staged": True},
    "staged, dense fronts": {"staged": True, "dense_flops": 2e5},
}


@pytest.mark.parametrize("case", list(CASES))
def test_new_process_loads_the_stored_plan(store_dir, A, monkeypatch, case):
    kw = CASES[case]
    g1 = _factorize(A, **kw)
    assert (g1.info["stages"] > 1) == ("staged" in kw)
    if "dense_flops" in kw:
        assert g1._dense
    p1 = gs.plan_of(g1)
    path, = _files(store_dir)
    _same_plan(p1, _fresh(g1))
    g1.free()
    _forget()                                   # a new process: only the disk is left
    g2 = _factorize(random_values(A, np.random.default_rng(9)), **kw)
    calls = _no_build(monkeypatch)
    p2 = gs.plan_of(g2)
    assert not calls                            # mapped, not built
    assert _files(store_dir) == [path]
    ref = _fresh(g2)
    _same_plan(p2, ref)
    assert p2.records.flags.writeable           # the factorization's own copies
    _replays_equal(g2, p2, ref)
    g2.free()


@pytest.mark.parametrize("damage", ["flip", "truncate", "stamp", "garbage"])
def test_damaged_or_stale_plan_is_rebuilt(store_dir, A, monkeypatch, damage):
    gs.plan_of(_factorize(A))
    path, = _files(store_dir)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-20] ^= 0x04
    elif damage == "truncate":
        data = data[:len(data) - 50]
    elif damage == "garbage":
        data = b"\0" * len(data)
    path.write_bytes(bytes(data))
    if damage == "stamp":
        monkeypatch.setattr(replay_store, "_stamp", lambda: "another-stamp-0000000")
    _forget()
    calls = _no_build(monkeypatch)
    g = _factorize(A)
    p = gs.plan_of(g)
    assert calls == [1]                         # built again
    _same_plan(p, _fresh(g))
    _forget()
    g2 = _factorize(A)
    calls.clear()
    p2 = gs.plan_of(g2)
    assert calls == []                          # the file written again is good
    _same_plan(p2, _fresh(g2))


def test_damage_inside_the_arrays_is_caught(store_dir, A, monkeypatch):
    """A plan whose arrays pass the CRC but cannot be a plan's (a file written
    wrong) counts as damage: deleted, the plan built again."""
    g = _factorize(A)
    where = replay_store.slot(g)
    good = gs.plan_arrays(gs.plan_of(g))
    bad = dict(good, level_ptr=good["level_ptr"][:-1])
    where.path.unlink()
    assert replay_store.save(where, bad)
    _forget()
    calls = _no_build(monkeypatch)
    g2 = _factorize(A)
    p2 = gs.plan_of(g2)
    assert calls == [1]                         # the file refused (deleted), built again
    _same_plan(p2, _fresh(g2))
    _forget()
    calls.clear()
    g3 = _factorize(A)
    p3 = gs.plan_of(g3)
    assert calls == []                          # and written again, good
    _same_plan(p3, _fresh(g3))


@pytest.mark.parametrize("other", ["dense fronts", "staged", "staged, dense fronts"])
def test_another_schedule_never_uses_the_plan(store_dir, A, monkeypatch, other):
    """A plan stored for one schedule of a pattern is not used for another (memory
    budget, staging, dense-front threshold): another file, and even where every
    name collides, the fingerprint refuses it."""
    g1 = _factorize(A)
    gs.plan_of(g1)
    one, = _files(store_dir)
    g1.free()
    _forget()
    g2 = _factorize(A, **CASES[other])
    s1, s2 = replay_store.slot(g1), replay_store.slot(g2)
    assert s2.path != one
    calls = _no_build(monkeypatch)
    p2 = gs.plan_of(g2)
    assert calls == [1]
    _same_plan(p2, _fresh(g2))
    assert len(_files(store_dir)) == 2
    # every name and header collides: the other schedule's file is read and
    # refused by its fingerprint, not deleted
    _forget()
    monkeypatch.setattr(replay_store, "slot",
                        lambda qr, real=replay_store.slot: _renamed(real(qr), s1))
    g3 = _factorize(A, **CASES[other])
    _refused(g3, one)
    calls.clear()
    p3 = gs.plan_of(g3)
    assert calls == [1] and one.exists()
    _same_plan(p3, _fresh(g3))


def _renamed(s, like):
    """``s`` pointed at the file of ``like``, with its header's facts."""
    if s is not None:
        s.path, s.facts = like.path, like.facts
    return s


def test_file_of_another_analysis_is_never_used(store_dir, A, monkeypatch):
    g1 = _factorize(A)
    gs.plan_of(g1)
    one, = _files(store_dir)
    s1 = replay_store.slot(g1)
    _forget()
    B = random_values(grid3d_least_squares(5), np.random.default_rng(1))
    monkeypatch.setattr(replay_store, "slot",
                        lambda qr, real=replay_store.slot: _renamed(real(qr), s1))
    g2 = _factorize(B)
    _refused(g2, one)
    calls = _no_build(monkeypatch)
    p2 = gs.plan_of(g2)
    assert calls == [1]
    _same_plan(p2, _fresh(g2))


def _refused(g, path):
    """The file at ``path`` (under ``g``'s name and header) is refused by its
    fingerprint: never decoded into a plan, left as it is."""
    before = path.read_bytes()
    got = replay_store.load(replay_store.slot(g),
                            lambda a: pytest.fail("another's plan decoded"))
    assert got is None and path.read_bytes() == before


def test_off_or_keyless_writes_nothing(tmp_path, A, monkeypatch):
    monkeypatch.setattr(gs, "write_behind", lambda fn, *a: fn(*a))
    monkeypatch.setenv(_store.ENV, "off")
    _forget()
    g = _factorize(A)
    assert replay_store.slot(g) is None
    gs.plan_of(g)
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    _forget()
    g = gpu_factorize(A, analyze(A, cache=False), device=NumpyDevice(32, 3))
    assert replay_store.slot(g) is None
    gs.plan_of(g)
    assert not _files(tmp_path)
    _forget()


def test_later_factorization_in_the_process_reads_no_file(store_dir, A, monkeypatch):
    """Within a process the plan kept with the schedule is used: no file read."""
    gs.plan_of(_factorize(A))
    monkeypatch.setattr(replay_store, "load", lambda *a: pytest.fail("read the file"))
    g = _factorize(A)
    _same_plan(gs.plan_of(g), _fresh(g))


def _records_as_before(st, base):
    """A warm stage's kept records and launches as the driver sorted them before
    they were kept with the schedule (records copied, then sorted by front)."""
    from scipy_gpuqr._engine.gpu.stage_loop import FACTORIZE_TYPES
    t = st.tasks
    kk = np.flatnonzero(np.isin(t["type"], FACTORIZE_TYPES))
    allf = t[kk]
    alll = base + np.searchsorted(st.launch_ptr, kk, side="right") - 1
    order = np.argsort(allf["front"], kind="stable")
    allf = allf[order]
    allf["F"] = 0
    return allf, np.asarray(alll, dtype=np.int64)[order]


@pytest.mark.parametrize("case", list(CASES))
def test_kept_reflector_records_made_once_per_schedule(A, monkeypatch, case):
    """The records a warm factorization keeps for ``Q`` are made once per schedule
    (kept with it, read-only, shared by later factorizations of the pattern) and
    equal, front by front, the cold run's and those sorted as before."""
    monkeypatch.setenv(_store.ENV, "off")
    _forget()
    kw = CASES[case]
    g1 = _factorize(A, **kw)                    # cold: the records as launched
    assert g1.info["schedule_cold"]
    g2 = _factorize(A, **kw)
    g3 = _factorize(A, **kw)
    assert not g2.info["schedule_cold"] and g2.schedule is g3.schedule
    assert (g2.info["stages"] > 1) == ("staged" in kw)
    kept = []
    for sid, st in enumerate(g2.schedule.stages):
        base = g2._launch_base[sid]
        ref_f, ref_l = _records_as_before(st, base)
        k = g2.schedule.extras[("reflector_records", sid, base)]
        assert k.records.tobytes() == ref_f.tobytes()
        np.testing.assert_array_equal(k.launches, ref_l)
        assert k.launches.dtype == np.int64
        assert not k.records.flags.writeable and not k.launches.flags.writeable
        kept.append(k.records)
    for f in range(len(g1._fronts)):
        r1, r2, r3 = g1._fronts[f][2], g2._fronts[f][2], g3._fronts[f][2]
        assert r1.tobytes() == r2.tobytes() == r3.tobytes()
        np.testing.assert_array_equal(g1._front_launch[f], g2._front_launch[f])
        if len(r2):
            k = kept[g2._front_loc[f][0]]
            assert np.shares_memory(r2, k) and np.shares_memory(r3, k)
    p3 = gs.plan_of(g3)
    _same_plan(p3, _fresh(g3))
    assert p3.records.tobytes() == _fresh(g1).records.tobytes()     # as from the cold run's
    _forget()


def test_kept_records_of_a_new_process_made_on_a_worker(A, monkeypatch):
    """A warm run whose schedule holds no kept records yet (a new process's first
    factorization of a known pattern) makes them on a worker thread while its
    launches run, and keeps the same records."""
    import threading
    monkeypatch.setenv(_store.ENV, "off")
    _forget()
    g1 = _factorize(A)
    ref = [r.tobytes() for _, _, r in g1._fronts]
    g1.schedule.extras.clear()                  # as a schedule read back from disk
    threads = []
    real = stage_loop.stage_reflector_records
    def made(sched, sid, st, base):             # the threads that made them (not found)
        if ("reflector_records", sid, base) not in sched.extras:
            threads.append(threading.current_thread().name)
        return real(sched, sid, st, base)
    monkeypatch.setattr(stage_loop, "stage_reflector_records", made)
    g2 = _factorize(A)
    assert not g2.info["schedule_cold"]
    assert len(threads) == 1 and threads[0].startswith("gpuqr-kept-records")
    assert [r.tobytes() for _, _, r in g2._fronts] == ref
    g3 = _factorize(A)                          # kept: no worker, nothing made
    assert len(threads) == 1
    assert [r.tobytes() for _, _, r in g3._fronts] == ref
    _forget()


AHEAD_CASES = {"one stage": {}, "dense fronts": {"dense_flops": 2e5}}


@pytest.mark.parametrize("case", list(AHEAD_CASES))
@pytest.mark.parametrize("stored", [False, True])
def test_plan_made_ahead_is_the_plan_of_the_factorization(store_dir, A, monkeypatch, case,
                                                          stored):
    """A first one-stage factorization makes ``Q``'s replay plan on a worker while its
    stage runs (:mod:`~scipy_gpuqr._engine.gpu.replay_ahead`; forced here on the NumPy
    layer): under the key ``plan_of`` looks for, the same plan bit for bit as one
    built from the factorization's own records, and ``plan_of`` builds nothing;
    a new process reads the stored plan there instead of building it."""
    import threading
    from scipy_gpuqr._engine.gpu import replay_ahead
    kw = AHEAD_CASES[case]
    if stored:                                  # an earlier process stored the plan
        gs.plan_of(_factorize(A, **kw))
        _forget()
    monkeypatch.setattr(replay_ahead, "wanted", lambda device, sched, host: True)
    where = []
    real = gs.kept_plan
    monkeypatch.setattr(gs, "kept_plan", lambda q: where.append(
        threading.current_thread().name) or real(q))
    built, read = _no_build(monkeypatch), []
    real_load = replay_store.load
    monkeypatch.setattr(replay_store, "load", lambda *a: read.append(1) or real_load(*a))
    g = _factorize(random_values(A, np.random.default_rng(3)), **kw)
    if "dense_flops" in kw:
        assert g._dense
    ahead = g._replay["plan_ahead"]
    kept = ahead.result()
    assert where and where[0].startswith("gpuqr-replay-ahead")
    assert (len(read), len(built)) == ((1, 0) if stored else (1, 1))
    assert g.schedule.extras[gs._plan_key(g)] is kept
    p = gs.plan_of(g)
    assert len(built) == (0 if stored else 1)   # plan_of found it kept: nothing built
    assert "plan_ahead" not in g._replay
    ref = _fresh(g)
    _same_plan(p, ref)
    assert p.records.flags.writeable and not kept.records.flags.writeable
    _replays_equal(g, p, ref)
    g.free()


def test_ahead_factorization_has_the_factorization_s_facts(A, monkeypatch):
    """What the plan is made from before the stage ends equals what the
    factorization holds after it: each front's slots, kept records and launches,
    its place, the dense fronts' launches; and the key and file slot of the plan."""
    from scipy_gpuqr._engine.gpu import replay_ahead
    monkeypatch.setenv(_store.ENV, "off")
    _forget()
    g = _factorize(A, dense_flops=2e5)
    q = replay_ahead.ahead_factorization(*g.shape, g.analysis, g.schedule,
                                         rlayout.r_layout(g.analysis), g._device)
    assert gs._plan_key(q) == gs._plan_key(g)
    for f in range(len(g._fronts)):
        np.testing.assert_array_equal(q._fronts[f][0], g._fronts[f][0])
        assert q._fronts[f][2].tobytes() == g._fronts[f][2].tobytes()
        np.testing.assert_array_equal(q._front_launch[f], g._front_launch[f])
    assert [tuple(x) for x in q._front_loc] == [tuple(x) for x in g._front_loc]
    assert {f: d.after_launch for f, d in q._dense.items()} == \
        {f: d.after_launch for f, d in g._dense.items()}
    monkeypatch.setenv(_store.ENV, "/nonexistent-but-named")
    a, b = replay_store.slot(q), replay_store.slot(g)
    assert a is not None and a.path == b.path and a.facts == b.facts
    _forget()


def test_no_plan_ahead_on_the_numpy_layer_or_when_kept(A, monkeypatch):
    """The plan starts ahead only on a CUDA layer, for one stage without host
    fronts, and not where the schedule keeps a plan already (a repeated call)."""
    from types import SimpleNamespace
    from scipy_gpuqr._engine.gpu import replay_ahead
    monkeypatch.setenv(_store.ENV, "off")
    _forget()
    g = _factorize(A)
    assert "plan_ahead" not in g._replay
    cuda = SimpleNamespace(cp=object())
    sched = g.schedule
    assert not replay_ahead.wanted(g._device, sched, {})
    assert replay_ahead.wanted(cuda, sched, {})
    assert not replay_ahead.wanted(cuda, sched, {0: 3})
    gs.plan_of(g)
    assert not replay_ahead.wanted(cuda, sched, {})
    _forget()
