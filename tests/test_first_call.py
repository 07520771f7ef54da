"""No first-call penalty per object (issue 16): what is per pattern is kept per
pattern, what is per process is made once, and a call compiles only the kernel
variants it uses (CPU: the NumPy device layer and NVRTC, no GPU needed)."""

import functools
import gc
import sys
import types

import numpy as np
import pytest

from scipy_gpuqr import _kernels
from scipy_gpuqr._engine.gpu import factorize_kernels as fk
from scipy_gpuqr._engine.gpu import rcopy
from scipy_gpuqr._engine.gpu import solve_kernels as sk
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache, r_layout, r_layout_cached
from scipy_gpuqr._engine.host.simulate import simulate_factorize
from scipy_gpuqr._schedule.pattern_cache import PerPattern
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values


class _An:
    """An analysis stand-in: only its pattern key matters to the table."""

    def __init__(self, key):
        self.pattern_key = key


def test_per_pattern_table_is_keyed_by_pattern_and_bounded():
    t = PerPattern(max_entries=2, max_bytes=100, nbytes=len)
    a1, a2 = _An("p"), _An("p")
    t.put(a1, "k", "x" * 10)
    assert t.get(a2, "k") == "x" * 10           # another object of the same pattern
    assert t.get(a2, "other") is None and t.get(_An("q"), "k") is None
    t.put(_An("q"), "k", "y" * 10)
    t.put(_An("r"), "k", "z" * 10)             # three entries: the oldest ("p") leaves
    assert len(t) == 2 and t.get(a1, "k") is None
    t.put(_An("s"), "k", "w" * 95)              # bytes: 10 + 95 > 100, "q" leaves
    assert t.get(_An("q"), "k") is None and t.get(_An("s"), "k") == "w" * 95
    t.clear(_An("s"))
    assert t.get(_An("s"), "k") is None


def test_per_pattern_table_keeps_keyless_or_huge_objects_per_object():
    t = PerPattern(max_entries=4, max_bytes=10, nbytes=len)
    a, b = _An(None), _An(None)
    t.put(a, "k", "small")
    assert t.get(a, "k") == "small" and t.get(b, "k") is None
    big = _An("p")
    t.put(big, "k", "x" * 50)                   # over the byte bound: with its object only
    assert len(t) == 0 and t.get(big, "k") == "x" * 50 and t.get(_An("p"), "k") is None
    del a, big
    gc.collect()
    assert len(t._weak) == 0                    # gone with their analyses


def test_per_pattern_table_keeps_one_large_object_by_pattern():
    t = PerPattern(max_entries=4, max_bytes=10, nbytes=len, large_bytes=lambda: 100)
    t.put(_An("p"), "k", "x" * 50)              # over the bound, within the large one
    assert t.get(_An("p"), "k") == "x" * 50 and len(t) == 1
    assert t.get(_An("p"), "other") is None
    t.put(_An("s"), "k", "small")
    t.put(_An("q"), "k", "y" * 60)              # the last large object replaces it
    assert t.get(_An("p"), "k") is None and t.get(_An("q"), "k") == "y" * 60
    assert t.get(_An("s"), "k") == "small" and len(t) == 2
    huge = _An("h")
    t.put(huge, "k", "z" * 500)                 # over the large bound: its object only
    assert t.get(_An("h"), "k") is None and t.get(huge, "k") == "z" * 500
    assert t.get(_An("q"), "k") == "y" * 60
    t.put(_An("q"), "k", "short")               # within the bound again: in the table
    assert t.get(_An("q"), "k") == "short" and len(t) == 2
    t.put(_An("q"), "k", "y" * 60)
    t.clear(_An("q"))
    assert t.get(_An("q"), "k") is None and t.get(_An("s"), "k") == "small"


def test_per_pattern_object_grown_past_the_bound_becomes_the_large_one():
    t = PerPattern(max_entries=4, max_bytes=10, nbytes=len, large_bytes=lambda: 100)
    grows = [0] * 5
    t.put(_An("g"), "k", grows)
    grows += [0] * 30                           # as a layout's gather maps, after the put
    t.put(_An("s"), "k", [0])                   # the bound is read again at every put
    assert t.get(_An("g"), "k") is grows and t.get(_An("s"), "k") == [0]
    t2 = PerPattern(max_entries=4, max_bytes=10, nbytes=len)     # no large entry
    grows2 = [0] * 5
    t2.put(_An("g"), "k", grows2)
    grows2 += [0] * 30
    t2.put(_An("s"), "k", [0])
    assert t2.get(_An("g"), "k") is None and t2.get(_An("s"), "k") == [0]


@pytest.mark.parametrize("fraction", [1 / 8, 0.0])
def test_new_analysis_finds_a_layout_over_the_byte_bound(monkeypatch, fraction):
    """A layout larger than the table's byte bound (grid 56³: 6 GB against 1 GB) is
    kept by pattern as its one large entry: a new analysis object (a new
    ``QRFactorization``) finds it; with no room for a large entry, only the
    analysis that made it does (the control)."""
    from scipy_gpuqr._engine.gpu import rlayout
    monkeypatch.setattr(rlayout._CACHE, "max_bytes", 1)
    monkeypatch.setattr(rlayout, "LARGE_FRACTION", fraction)
    clear_r_layout_cache()
    A = grid3d_least_squares(5)
    an1, an2 = analyze(A), analyze(A)
    lay = r_layout(an1, cache=True)
    assert r_layout_cached(an1) is lay
    assert (r_layout_cached(an2) is lay) == (fraction > 0)
    clear_r_layout_cache()


def test_new_analysis_of_a_known_pattern_finds_schedule_and_layout():
    A = grid3d_least_squares(5)
    an1, an2 = analyze(A), analyze(A)
    assert an1 is not an2 and an1.pattern_key == an2.pattern_key is not None
    s1 = build_schedule(an1, lazy=True)
    assert build_schedule(an2, lazy=True) is s1
    lay = r_layout(an1)
    assert r_layout_cached(an2) is lay and r_layout(an2) is lay
    clear_schedule_cache(an2)
    clear_r_layout_cache(an2)
    assert build_schedule(an1, lazy=True) is not s1 and r_layout_cached(an1) is None


def test_new_factorization_object_runs_warm():
    """The second factorization, with a *new* analysis of the same pattern, takes
    the warm path (schedule materialized, progressive R copy) and the same R."""
    rng = np.random.default_rng(7)
    A = random_values(grid3d_least_squares(5), rng)
    clear_schedule_cache()
    clear_r_layout_cache()
    g1 = gpu_factorize(A, analyze(A), device=NumpyDevice(32, 3))
    assert g1.info["schedule_cold"]
    an2 = analyze(A)
    A2 = random_values(A, rng)
    g2 = gpu_factorize(A2, an2, device=NumpyDevice(32, 3))
    assert not g2.info["schedule_cold"] and g2.info["r_copy_progressive"]
    assert abs(g2.R - simulate_factorize(A2, an2).R).max() == 0.0
    g1.free()
    g2.free()


def test_first_call_of_a_stored_pattern_runs_warm(tmp_path, monkeypatch):
    """A new process's first factorization of a pattern an earlier process stored
    (analysis, schedule and R's layout on disk, nothing in memory) loads the layout
    on its own thread from the call's start and runs as a warm call: records
    materialized, R copied progressively from the first launch; the same R."""
    import threading

    from scipy_gpuqr import _store
    from scipy_gpuqr._engine.gpu import driver, rlayout_store
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    rng = np.random.default_rng(11)
    A = random_values(grid3d_least_squares(6), rng)
    clear_schedule_cache()
    clear_r_layout_cache()
    an1 = analyze(A)
    assert driver.start_layout_load(an1).result() is None     # nothing stored yet
    g1 = gpu_factorize(A, an1, device=NumpyDevice(32, 3))
    assert g1.info["schedule_cold"]
    _store.flush()
    assert rlayout_store.stored(an1)
    assert driver.start_layout_load(an1) is None        # in memory: nothing to load
    clear_schedule_cache()                              # a new process: only the disk
    clear_r_layout_cache()
    loads = []
    real = driver.r_layout

    def spy(*a, **k):
        loads.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(driver, "r_layout", spy)
    A2 = random_values(A, rng)
    an2 = analyze(A2)
    g2 = gpu_factorize(A2, an2, device=NumpyDevice(32, 3))
    assert loads and loads[0].startswith("gpuqr-layout-load")
    assert not g2.info["schedule_cold"] and g2.info["r_copy_progressive"]
    assert abs(g2.R - simulate_factorize(A2, an2).R).max() == 0.0
    g1.free()
    g2.free()
    clear_schedule_cache()
    clear_r_layout_cache()


def test_a_failed_early_layout_load_leaves_the_run_cold(monkeypatch):
    """An early load that raises: the run stays cold (the worker makes the layout)
    and R is the same."""
    from concurrent.futures import Future

    from scipy_gpuqr._engine.gpu import driver
    rng = np.random.default_rng(12)
    A = random_values(grid3d_least_squares(5), rng)
    an = analyze(A, cache=False)

    def broken(analysis):
        f = Future()
        f.set_exception(OSError("unreadable"))
        return f

    monkeypatch.setattr(driver, "start_layout_load", broken)
    g = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    assert g.info["schedule_cold"]
    assert abs(g.R - simulate_factorize(A, an).R).max() == 0.0
    g.free()


def test_keyless_analysis_keeps_its_own_schedule():
    A = grid3d_least_squares(4)
    an = analyze(A, cache=False)
    assert an.pattern_key is None
    s = build_schedule(an, lazy=True)
    assert build_schedule(an, lazy=True) is s
    assert build_schedule(analyze(A, cache=False), lazy=True) is not s


def test_staging_buffer_is_made_once_per_process(monkeypatch):
    made = []

    class Fake:
        def __init__(self, nbytes):
            import threading
            self.nbytes = nbytes
            self.lock = threading.Lock()
            made.append(nbytes)

    monkeypatch.setattr(rcopy, "PinnedStaging", Fake)
    monkeypatch.setattr(rcopy, "_STAGING", rcopy._SharedStaging())

    class Lay:
        def __init__(self, nnz):
            self.nnz = nnz

    s1 = rcopy.staging_for(Lay(1000))
    s1.lock.release()
    assert rcopy.staging_for(Lay(500)) is s1     # any layout, smaller: the same buffer
    busy = rcopy.staging_for(Lay(10))           # held: a temporary one
    assert busy is not s1
    s1.lock.release()
    busy.lock.release()
    s3 = rcopy.staging_for(Lay(10 ** 9))         # larger: grown once, to the slot bound
    assert s3.nbytes == rcopy.SLOT_BYTES and made == [8000, 80, rcopy.SLOT_BYTES]


def test_r_staging_slots_are_made_on_first_use_once(monkeypatch):
    """R's pinned staging is allocated where its slots are first asked for (the copy's
    worker), not where the buffer is taken (the call's thread, before its first launch)."""
    made = []
    fake = types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: made.append(shape) or np.zeros(shape, dtype))
    monkeypatch.setitem(sys.modules, "cupyx", fake)
    st = rcopy.PinnedStaging(64)
    assert made == []
    slots = st.slots
    assert made == [(64,), (64,)] and len(slots) == 2 and slots[0].nbytes == 64
    assert st.slots is slots and len(made) == 2


# ------------------------------------------------------------------------- kernels

def test_variant_group_takes_one_value_type():
    declared = fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE]
    d = fk.kernel_name("double", 32, 3, fk.ENGINE_THREADS)
    g = _kernels.variant_group(d, declared)
    assert g[0] == d and all("float" not in e for e in g)
    assert fk.smem_kernel_name("double", 32, 3) in g and len(g) == 2
    f = _kernels.variant_group(fk.kernel_name("float", 32, 3, fk.ENGINE_THREADS), declared)
    assert all("double" not in e for e in f)
    q = _kernels.variant_group(sk.applyq_name("double", 32, 3, True),
                               sk.KERNEL_VARIANTS[sk.APPLYQ_FILE])
    assert set(q) == {sk.applyq_name("double", 32, 3, t) for t in (True, False)}
    assert _kernels.variant_group("k", ("a<double>",)) == ("k",)
    assert _kernels.variant_group("k", ()) == ()


def test_engine_kernels_name_what_a_call_uses():
    """The factorization's, its dense fronts' and its solves' kernels, of the call's
    value type only (no other variant, no experiment)."""
    from scipy_gpuqr._engine.gpu import array_ops as ao
    from scipy_gpuqr._engine.gpu import dense_panel as dp
    from scipy_gpuqr._engine.gpu import finite_check as fc
    for dt, c, panel in ((np.float64, "double", "panel_qr_f64"),
                         (np.float32, "float", "panel_qr_f32")):
        got = fk.engine_kernels(dt)
        assert [u.file for u in got] == [fk.UBERKERNEL_FILE, fc.CHECK_FILE, ao.OPS_FILE,
                                         dp.PANEL_FILE, sk.APPLYQ_FILE, sk.RSOLVE_FILE]
        for u in got:
            if u.declared:
                assert set(u.needed) <= set(u.declared) and all(c in e for e in u.needed)
                group = _kernels.variant_group(u.needed[0], u.declared)
                other = "float" if c == "double" else "double"
                assert all(other not in e.split("<")[1] for e in group)
            assert u.cooperative == (u.file in dp.COOPERATIVE_FILES)
        assert got[3].needed == (panel,) and got[3].declared == () and got[3].cooperative
        assert got[2] == ao.array_ops_use() and got[2].declared == ()
    assert fk.engine_kernels(np.float64, tile=17) == []
    assert [u.file for u in fk.engine_kernels(np.float64, solve=False)] == [
        fk.UBERKERNEL_FILE, fc.CHECK_FILE, ao.OPS_FILE, dp.PANEL_FILE]
    assert len(fk.engine_kernels(np.float64, solve=False, dense=False)) == 3
    assert _kernels.registered_cooperative() == frozenset(dp.COOPERATIVE_FILES)


class _FakeDevice:
    """``cupy.cuda.Device()`` without a GPU: device 0, usable as a context."""

    id = 0

    def __init__(self, *a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _FakeModule:
    def __init__(self, key):
        self.key = key
        self.looked_up = []

    def get_function(self, name):
        import threading
        self.looked_up.append((name, threading.current_thread().name))
        return (self.key, name)


class _RecordingCompiled(_kernels._Compiled):
    """The module table with the compile replaced by a record of what was asked
    for, and by which thread."""

    def __init__(self):
        super().__init__()
        import threading
        self.made, self.lock = [], threading.Lock()

    def get(self, name, group, options, digest, device, cooperative=False):
        import threading
        key = (name, group, options, digest, bool(cooperative))
        with self._lock:
            entry = self._modules.setdefault(key, [threading.Lock(), None])
        with entry[0]:
            if entry[1] is None:
                with self.lock:
                    self.made.append((key, threading.current_thread().name))
                entry[1] = _FakeModule(key)
            return entry[1]


@pytest.fixture
def fake_compile(monkeypatch):
    """No GPU, no NVRTC: record the modules prefetch and the engine's users compile."""
    cupy = pytest.importorskip("cupy", reason="the prefetch imports cupy")
    table = _RecordingCompiled()
    monkeypatch.setattr(_kernels, "_COMPILED", table)
    monkeypatch.setattr(cupy.cuda, "Device", _FakeDevice)
    monkeypatch.setattr(fk, "prefetch_libraries", lambda: None)
    monkeypatch.setattr(fk, "start_blas_warmup", lambda device, dtype: None)
    return table


def test_prefetch_schedules_every_module_of_a_call_once(fake_compile):
    """One thread looks the modules up, one thread per module the call uses (the
    dense panel kernel included) compiles it; a second prefetch, while or after
    they compile, starts none; the panel kernel a dense front asks for is the
    module prefetched (no compile on the call's path)."""
    from scipy_gpuqr._engine.gpu import dense_panel as dp
    n = len(fk.engine_kernels(np.float64))
    threads = fk.prefetch_engine_kernels(np.float64)
    assert len(threads) == 1 and threads[0].name == "gpuqr-prefetch" and threads[0].daemon
    assert fk.prefetch_engine_kernels(np.float64) == []       # asked for: none again
    for t in threads:
        t.join()
    made = fake_compile.made
    assert len(made) == n and all(name == "gpuqr-nvrtc" for _, name in made)
    want = set()
    for u in fk.engine_kernels(np.float64):
        m = u.module()
        want.add((u.file, _kernels.variant_group(u.needed[0], u.declared), m.options,
                  m.digest, u.cooperative))
    assert {k for k, _ in made} == want
    for u in fk.engine_kernels(np.float64):       # each kernel asked for looked up there
        m = u.module()
        key = (u.file, _kernels.variant_group(u.needed[0], u.declared), m.options, m.digest,
               u.cooperative)
        looked = fake_compile._modules[key][1].looked_up
        assert {(e, "gpuqr-nvrtc") for e in u.needed} <= set(looked)
    assert fk.prefetch_engine_kernels(np.float64) == []
    # what the engine's users ask for: the same modules, nothing compiled again
    dp._panel_kernel.cache_clear()
    try:
        import unittest.mock as um
        with um.patch.object(dp, "_device_limits", lambda d: (132, 227 * 1024)):
            k = dp.panel_kernel(np.float64)
        assert k.fn[1] == "panel_qr_f64" and k.fn[0][-1] is True and k.fn[0][1] == ()
    finally:
        dp._panel_kernel.cache_clear()
    for u in fk.engine_kernels(np.float64):
        _kernels.load_module(u.file, u.declared,
                             cooperative=u.cooperative).get_function(u.needed[0])
    from scipy_gpuqr._engine.gpu import finite_check as fc
    fc._finite_check.cache_clear()
    try:
        assert fc.finite_check(np.float64).fn[1] == fc.nonfinite_name(np.float64)
    finally:
        fc._finite_check.cache_clear()
    assert len(made) == n
    # a float32 call compiles its own groups only (the panel file and the array
    # operations, one module each for both value types, are compiled already)
    from scipy_gpuqr._engine.gpu import array_ops as ao
    t32 = fk.prefetch_engine_kernels(np.float32)
    for t in t32:
        t.join()
    new = [k for k, _ in made[n:]]
    assert len(t32) == 1 and len(new) == n - 2
    assert all(name == "gpuqr-nvrtc" for _, name in made[n:])
    assert not {dp.PANEL_FILE, ao.OPS_FILE} & {k[0] for k in new}
    assert all("double" not in " ".join(k[1]) for k in new)


def test_prefetch_looks_modules_up_off_the_calling_thread(fake_compile, monkeypatch):
    """The calling thread starts one thread; the sources are read and hashed there."""
    import threading
    seen = []
    real = _kernels._HASHES.get

    def get(name, directory):
        seen.append(threading.current_thread().name)
        return real(name, directory)
    monkeypatch.setattr(_kernels._HASHES, "get", get)
    for t in fk.prefetch_engine_kernels(np.float64):
        t.join()
    assert seen and set(seen) == {"gpuqr-prefetch"}


def test_source_hash_is_kept_until_a_file_changes(tmp_path, monkeypatch):
    """A module lookup stats the files of its last hash instead of reading them;
    an edited header (or a file edited within the last seconds) is hashed again."""
    import os
    import time
    monkeypatch.setattr(_kernels, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(_kernels, "_HASHES", _kernels._Hashes())
    (tmp_path / "h.cuh").write_text("int x;\n")
    (tmp_path / "k.cu").write_text('#include "h.cuh"\n')
    past = time.time() - 60
    for f in ("h.cuh", "k.cu"):
        os.utime(tmp_path / f, (past, past))
    reads = []
    real = _kernels._flatten
    monkeypatch.setattr(_kernels, "_flatten", lambda *a: reads.append(a) or real(*a))
    h1 = _kernels.source_hash("k.cu")
    assert _kernels.source_hash("k.cu") == h1 and len(reads) == 1
    (tmp_path / "h.cuh").write_text("int yy;\n")          # edited just now
    h2 = _kernels.source_hash("k.cu")
    assert h2 != h1 and len(reads) == 2
    assert _kernels.source_hash("k.cu") == h2 and len(reads) == 3     # too recent to keep
    os.utime(tmp_path / "h.cuh", (past + 1, past + 1))
    assert _kernels.source_hash("k.cu") == h2 and len(reads) == 4
    assert _kernels.source_hash("k.cu") == h2 and len(reads) == 4     # kept
    assert h2 == _kernels.hashlib.sha256(
        _kernels.flatten_source("k.cu").encode()).hexdigest()[:16]


class _FakeCompiler:
    """CuPy's compiler module as the preprocess record sees it: its table of
    empty-file PTX and NVRTC's version."""

    def __init__(self):
        self._empty_file_preprocess_cache = {}

    @staticmethod
    def _get_nvrtc_version():
        return (13, 5)


#: A CuPy key of the empty-file table: (arch, options, NVRTC version, backend, flags...).
_ENV = ("90", ("--std=c++17", "-ftz=true"), (13, 5), "nvrtc", "-arch=sm_90", "cubin")


def test_empty_file_ptx_is_recorded_and_seeded_for_the_same_nvrtc(tmp_path, monkeypatch):
    """A process that made CuPy's empty-file PTX records it; a new process (its
    records read again) finds it in CuPy's table before its first module, under
    CuPy's own key (tuples again), without replacing an entry CuPy made; a
    record of another NVRTC build is not used, and nothing is kept without a store."""
    from scipy_gpuqr import _store
    ident = [[13, 5], "/lib/libnvrtc.so.13", 100, 1]
    monkeypatch.setattr(_kernels, "_nvrtc_identity", lambda compiler: list(ident))
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    monkeypatch.setattr(_store, "_RECORDS", {})
    first = _FakeCompiler()
    first._empty_file_preprocess_cache[_ENV] = "// PTX of nothing\n"
    seeded = _kernels._seed_table(first)
    assert seeded == frozenset()
    _kernels._remember_preprocess(seeded, first)
    _store.flush()
    monkeypatch.setattr(_store, "_RECORDS", {})             # a new process
    new = _FakeCompiler()
    seeded = _kernels._seed_table(new)
    assert seeded == {_ENV} and new._empty_file_preprocess_cache == {_ENV: "// PTX of nothing\n"}
    assert hash(next(iter(new._empty_file_preprocess_cache))) == hash(_ENV)
    made = _FakeCompiler()
    made._empty_file_preprocess_cache[_ENV] = "CuPy's own"
    _kernels._seed_table(made)
    assert made._empty_file_preprocess_cache[_ENV] == "CuPy's own"
    writes = []
    monkeypatch.setattr(_store, "record", lambda name, value: writes.append(name))
    _kernels._remember_preprocess(seeded, new)             # nothing new: nothing written
    assert writes == []
    monkeypatch.setattr(_store, "_RECORDS", {})
    ident[3] = 2                                            # NVRTC rebuilt (same version)
    other = _FakeCompiler()
    assert _kernels._seed_table(other) == frozenset()
    assert other._empty_file_preprocess_cache == {}
    monkeypatch.setenv(_store.ENV, "off")
    monkeypatch.setattr(_store, "_RECORDS", {})
    ident[3] = 1
    none = _FakeCompiler()
    assert _kernels._seed_table(none) == frozenset()
    assert none._empty_file_preprocess_cache == {}


def test_nvrtc_identity_names_the_loaded_library():
    """Once CuPy has loaded NVRTC, the record's identity is its version and one
    library file (no GPU needed)."""
    compiler = pytest.importorskip("cupy.cuda.compiler")
    try:
        version = compiler._get_nvrtc_version()
    except Exception as exc:                        # noqa: BLE001 - no NVRTC here
        pytest.skip(f"NVRTC unavailable: {exc}")
    ident = _kernels._nvrtc_identity(compiler)
    assert ident is not None and ident[0] == list(version)
    assert "libnvrtc.so" in ident[1] and ident[2] > 0


def test_module_lookups_seed_first_and_once(monkeypatch):
    """The lookups' thread seeds CuPy's table before it starts any module's
    thread; callers at once (the call's own thread among them) seed it once."""
    import threading
    import time
    order = []

    def seed():
        order.append("seed")
        time.sleep(0.05)                # long enough for the others to arrive meanwhile
        return frozenset()
    monkeypatch.setattr(_kernels, "_seed_once", functools.lru_cache(maxsize=1)(seed))

    class _Use:
        needed = ("k",)

        def module(self):
            order.append("lookup")
            return types.SimpleNamespace(prefetch=lambda needed, device: [],
                                         _load=lambda needed, device: None)
    _kernels._prefetch_uses([_Use(), _Use()], 0)
    assert order == ["seed", "lookup", "lookup", "lookup"]
    _kernels._seed_once.cache_clear()
    del order[:]
    threads = [threading.Thread(target=_kernels._seed_preprocess) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["seed"]


def test_the_first_module_loads_alone_before_the_others_start(monkeypatch):
    """The use launched first (the engine's uberkernel) is compiled, or waited for, on
    the lookups' thread before any other module's thread starts: its load does not
    share the interpreter with theirs. A failure there leaves the others to start."""
    import threading
    monkeypatch.setattr(_kernels, "_seed_once", lambda: frozenset())
    events = []

    class _Use:
        def __init__(self, name, fail=False):
            self.name, self.fail, self.needed = name, fail, (name + "<double>",)

        def module(self):
            use = self

            def load(needed, device):
                events.append(("load", use.name, needed))
                if use.fail:
                    raise RuntimeError("no cubin")

            def prefetch(needed, device):
                events.append(("start", use.name))
                t = threading.Thread(target=lambda: events.append(("ran", use.name)))
                t.start()
                return [t]
            return types.SimpleNamespace(_load=load, prefetch=prefetch)
    _kernels._prefetch_uses([_Use("uber"), _Use("panel"), _Use("solve")], 3)
    assert events[0] == ("load", "uber", ("uber<double>",))
    assert [e for e in events if e[0] == "start"] == [("start", "uber"), ("start", "panel"),
                                                      ("start", "solve")]
    del events[:]
    _kernels._prefetch_uses([_Use("uber", fail=True), _Use("panel")], 3)
    assert events[0][:2] == ("load", "uber") and ("ran", "panel") in events


def test_module_compile_is_seeded_and_remembered(monkeypatch):
    """The module table seeds CuPy's empty-file table before a module compiles
    and records it after."""
    cupy = pytest.importorskip("cupy", reason="the table compiles through cupy")
    order = []
    monkeypatch.setattr(_kernels, "_seed_preprocess",
                        lambda: order.append("seed") or frozenset({"x"}))
    monkeypatch.setattr(_kernels, "_remember_preprocess",
                        lambda seeded: order.append(("remember", seeded)))

    class _Raw:
        def __init__(self, **kw):
            pass

        def compile(self):
            order.append("compile")
    monkeypatch.setattr(cupy, "RawModule", _Raw)
    monkeypatch.setattr(cupy.cuda, "Device", _FakeDevice)
    monkeypatch.setattr(_kernels, "flatten_source", lambda name: "")
    _kernels._Compiled().get("k.cu", (), (), "d", 0)
    assert order == ["seed", "compile", ("remember", frozenset({"x"}))]


def test_colamd_loads_without_cffi():
    """COLAMD (an analysis' ordering, and its key on a cache hit) goes through
    ctypes: no C declarations parsed by cffi in a new process."""
    import subprocess
    import sys
    code = ("import sys, scipy.sparse as sp, numpy as np\n"
            "from scipy_gpuqr._cpu.colamd import colamd, colamd_available\n"
            "ok, why = colamd_available()\n"
            "if ok:\n"
            "    p = colamd(sp.random_array((60, 40), density=0.1, rng=1))\n"
            "    assert sorted(p.tolist()) == list(range(40))\n"
            "print(ok, 'cffi' in sys.modules, 'pycparser' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[1:] == ["False", "False"], out


def test_load_module_compiles_nothing_until_asked():
    declared = fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE]
    mod = _kernels.load_module(fk.UBERKERNEL_FILE, declared)
    assert isinstance(mod, _kernels.LazyModule)
    assert mod is _kernels.load_module(fk.UBERKERNEL_FILE, declared)
    for e in declared:
        group = _kernels.variant_group(e, declared)
        assert not _kernels._COMPILED.ready(mod.name, group, mod.options, mod.digest)


def test_prefetch_needs_a_gpu(monkeypatch):
    from scipy_gpuqr._factor import factored
    calls = []
    monkeypatch.setattr(factored, "gpu_info", lambda: {"available": False})
    monkeypatch.setattr(factored, "prefetch_engine_kernels", lambda *a, **k: calls.append(a))
    factored.prefetch_kernels(np.float64)
    assert calls == []
    monkeypatch.setattr(factored, "gpu_info", lambda: {"available": True})
    factored.prefetch_kernels(np.float32)
    assert calls == [(np.float32,)]


@pytest.mark.slow
def test_a_variant_group_compiles_alone_with_nvrtc():
    """The float64 group of each file a float64 call prefetches (the dense panel
    kernel included) compiles by itself with NVRTC, and for a file with declared
    variants is smaller than the whole file."""
    pytest.importorskip("cupy", reason="NVRTC check needs the kernel-check extra "
                        "(pip install -e '.[kernel-check]')")
    uses = fk.engine_kernels(np.float64)
    assert "sparse_qr/panel_qr.cu" in [u.file for u in uses]
    for u in uses:
        group = _kernels.variant_group(u.needed[0], u.declared)
        one = _kernels._compile_one(u.file, "sm_90", group)
        assert one["ok"], one["log"]
        if u.declared:
            whole = _kernels._compile_one(u.file, "sm_90", tuple(u.declared))
            assert one["cubin_bytes"] < whole["cubin_bytes"]


@pytest.mark.gpu
def test_prefetch_compiles_the_groups_a_call_uses():
    threads = fk.prefetch_engine_kernels(np.float64)
    for t in threads:
        t.join()
    for u in fk.engine_kernels(np.float64):
        mod = u.module()
        assert mod.ready(u.needed[0])
        assert mod.get_function(u.needed[0]) is not None
    assert fk.prefetch_engine_kernels(np.float64) == []     # compiled: no thread again


@pytest.mark.gpu
def test_a_seeded_process_finds_its_module_without_nvrtc(tmp_path, monkeypatch):
    """On the device: a module CuPy compiled (or found in its cache) leaves its
    empty-file PTX recorded; with CuPy's table emptied and the records read
    again (a new process), the seeded table makes CuPy find the same module
    without running NVRTC. (CuPy's own compile, not ``RawModule``: that one is
    kept per process, so a module made before would never reach the table.)"""
    from cupy.cuda import compiler
    from scipy_gpuqr import _store
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    monkeypatch.setattr(_store, "_RECORDS", {})
    monkeypatch.setattr(compiler, "_empty_file_preprocess_cache", {})
    src = 'extern "C" __global__ void gpuqr_seed_probe(double* x) { x[0] = 1.0; }'
    compiler._compile_module_with_cache(src, _kernels.COMPILE_OPTIONS)
    assert compiler._empty_file_preprocess_cache
    _kernels._remember_preprocess(frozenset(), compiler)
    _store.flush()
    monkeypatch.setattr(_store, "_RECORDS", {})             # a new process
    monkeypatch.setattr(compiler, "_empty_file_preprocess_cache", {})
    runs = []
    real = compiler._preprocess
    monkeypatch.setattr(compiler, "_preprocess", lambda *a: runs.append(a) or real(*a))
    assert _kernels._seed_table(compiler)
    mod = compiler._compile_module_with_cache(src, _kernels.COMPILE_OPTIONS)
    assert runs == [] and mod.get_function("gpuqr_seed_probe") is not None


@pytest.mark.gpu
def test_stored_pattern_runs_warm_on_the_gpu(tmp_path, monkeypatch):
    """On the device: the first factorization of a stored pattern with nothing in
    memory (a new process's) loads R's layout early and runs warm (progressive R
    copy from the first launch); R as the cold run's, bit for bit."""
    from scipy_gpuqr import _store
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    rng = np.random.default_rng(5)
    A = random_values(grid3d_least_squares(10), rng)
    clear_schedule_cache()
    clear_r_layout_cache()
    g1 = gpu_factorize(A, analyze(A))
    assert g1.info["schedule_cold"]
    R1 = g1.R.copy()
    g1.free()
    _store.flush()
    clear_schedule_cache()
    clear_r_layout_cache()
    g2 = gpu_factorize(A, analyze(A))
    assert not g2.info["schedule_cold"] and g2.info["r_copy_progressive"]
    assert (g2.R != R1).nnz == 0
    g2.free()
    clear_schedule_cache()
    clear_r_layout_cache()


class _GatedDevice(NumpyDevice):
    """Launch ``gate_at`` waits for ``gate`` (an Event) first; ``done`` is set after
    the last launch."""

    def __init__(self, *a, gate=None, gate_at=0, **k):
        super().__init__(*a, **k)
        import threading
        self.gate, self.gate_at, self.done = gate, gate_at, threading.Event()
        self.nlaunched = 0

    def launch(self, h, L, records):
        if self.gate is not None and L == self.gate_at:
            assert self.gate.wait(60)
        super().launch(h, L, records)
        self.nlaunched += 1
        if L == h["st"].nlaunch - 1:
            self.done.set()


@pytest.mark.parametrize("late", [True, False])
def test_cold_one_stage_run_copies_R_once_the_layout_is_ready(monkeypatch, late):
    """A first (cold) one-stage factorization opens the progressive R copy as soon as
    the worker made R's layout (here: before launch 1), else copies R after the last
    launch; R is the same either way."""
    import threading

    from scipy_gpuqr._engine.gpu import driver
    rng = np.random.default_rng(3)
    A = random_values(grid3d_least_squares(6), rng)
    an = analyze(A, cache=False)                # keyless: cold schedule and layout
    ready = threading.Event()
    real = driver._host_side
    dev_box = {}

    def host_side(*a):
        if not late:                            # the layout only after every launch
            assert dev_box["dev"].done.wait(60)
        out = real(*a)
        ready.set()
        return out

    monkeypatch.setattr(driver, "_host_side", host_side)
    dev = _GatedDevice(32, 3, gate=ready if late else None, gate_at=1)
    dev_box["dev"] = dev
    g = gpu_factorize(A, an, device=dev)
    assert g.info["schedule_cold"] and g.info["stages"] == 1
    assert g.info["r_copy_progressive"] is late
    if late:
        assert len(dev.r_copies) >= 2           # ranges copied after launches, then the rest
    assert abs(g.R - simulate_factorize(A, an).R).max() == 0.0
    g.free()


@pytest.mark.parametrize("dense_flops", [None, 2e5])
def test_replay_plan_kept_with_the_schedule(dense_flops):
    """A new factorization of a known pattern reuses the replay plan's arrays (kept
    with the schedule) with its own dense fronts, and applies the same Qᵀ as a plan
    built afresh."""
    from scipy_gpuqr._engine.gpu import solve as gs
    rng = np.random.default_rng(11)
    A = random_values(grid3d_least_squares(6), rng)
    clear_schedule_cache()
    clear_r_layout_cache()
    kw = {} if dense_flops is None else {"dense_flops": dense_flops}
    g1 = gpu_factorize(A, analyze(A), device=NumpyDevice(32, 3), **kw)
    p1 = gs.plan_of(g1)
    A2 = random_values(A, rng)
    g2 = gpu_factorize(A2, analyze(A), device=NumpyDevice(32, 3), **kw)
    assert g2.schedule is g1.schedule
    if dense_flops is not None:
        assert g2._dense
    p2 = gs.plan_of(g2)
    assert p1.records.tobytes() == p2.records.tobytes()
    kept = [v for k, v in g2.schedule.extras.items() if k[0] == "replay_plan"]
    assert len(kept) == 1 and not kept[0].records.flags.writeable
    calls = []
    real = gs.build_replay_plan
    gs.build_replay_plan = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        g3 = gpu_factorize(A2, analyze(A), device=NumpyDevice(32, 3), **kw)
        p3 = gs.plan_of(g3)
    finally:
        gs.build_replay_plan = real
    assert not calls and p3.records.tobytes() == p2.records.tobytes()    # kept, not rebuilt
    g3.free()
    fronts = []
    for f, (slots, _, tasks) in enumerate(g2._fronts):
        sid, off = g2._front_loc[f]
        fronts.append((slots, tasks, g2._front_launch[f], sid, off))
    fresh = gs.build_replay_plan(g2.shape[0], fronts, tile=32, bundle=3,
                                 launch_base=g2._launch_base, dense=g2._dense, verify=True)
    assert p2.records.tobytes() == fresh.records.tobytes()
    for k in ("rowmap", "level_ptr", "level_stage"):
        np.testing.assert_array_equal(getattr(p2, k), getattr(fresh, k))
    assert p2.level_dense.keys() == fresh.level_dense.keys()
    for lv, objs in fresh.level_dense.items():
        assert [id(o) for o in p2.level_dense[lv]] == [id(o) for o in objs]
    def pools(sid):
        pool = g2._stage_pools.get(sid)
        return pool if pool is not None else g2._host_pools[sid]
    B = rng.standard_normal((A.shape[0], 2))
    for trans in (True, False):
        got = gs.apply_plan(g2, B, trans, gs.NumpyExecutor(p2, pools, g2._device.vt))
        ref = gs.host_matmul(g2, B, trans=trans)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    g1.free()
    g2.free()


# ------------------------------------------------------------------ disk writes

def test_layout_file_is_written_behind_the_call(tmp_path, monkeypatch):
    """The call that makes R's one-stage gather map returns before the layout file
    (checksums and writes) is written, on the writer thread; the file appears
    whole (written under a temporary name, then renamed) and loads back."""
    import threading

    from scipy_gpuqr import _store
    from scipy_gpuqr._engine.gpu import rlayout_store
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    A = grid3d_least_squares(5)
    an = analyze(A)
    clear_r_layout_cache()
    go, seen = threading.Event(), []
    real = rlayout_store.save

    def slow_save(*a):
        seen.append(threading.current_thread())
        assert go.wait(60)
        return real(*a)

    monkeypatch.setattr(rlayout_store, "save", slow_save)
    try:
        lay = r_layout(an)
        nf = len(lay.fbase) - 1
        lay.stage_maps([(0, nf - 1)])           # returns with the write still held
        path = rlayout_store.slot(an)
        assert not path.exists()
    finally:
        go.set()
        _store.flush()
    assert seen and all(t is not threading.main_thread() for t in seen)
    assert path.is_file() and not list(path.parent.glob("tmp-*.part"))
    clear_r_layout_cache()
    back = r_layout(analyze(A))
    assert back is not lay and back._stage_maps            # mapped from the file, map and all
    assert np.array_equal(back.indices, lay.indices)
    clear_r_layout_cache()


def test_bound_deletes_a_killed_writers_temporary_files(tmp_path):
    import os
    import time

    from scipy_gpuqr import _store
    old, new = tmp_path / "tmp-old.part", tmp_path / "tmp-new.part"
    entry = tmp_path / "lay-x.bin"
    for p in (old, new, entry):
        p.write_bytes(b"x")
    past = time.time() - _store.STALE_SECONDS - 10
    os.utime(old, (past, past))
    _store.bound(tmp_path, "lay-", entry, 1 << 20, 4)
    assert not old.exists() and new.exists() and entry.exists()


@pytest.fixture
def imported(monkeypatch):
    """The names the libraries' threads import (recorded, not imported), those
    threads forgotten before and after the test."""
    import importlib

    done = []
    monkeypatch.setattr(importlib, "import_module", lambda name: done.append(name))
    fk.prefetch_libraries.cache_clear()
    yield done
    fk.prefetch_libraries.cache_clear()


def test_library_loading_starts_once_on_its_own_thread(imported):
    """The CUDA libraries' modules are imported on one daemon thread per process,
    started by the prefetch (a module that cannot load is left for its user)."""
    t = fk.prefetch_libraries()
    assert t.daemon and t.name == "gpuqr-libraries"
    assert fk.prefetch_libraries() is t
    t.join(30)
    assert imported == list(fk.ENGINE_LIBRARIES)
    fk._import_all(("scipy_gpuqr.no_such_module",))       # no error


def test_later_libraries_start_once_on_a_thread_of_their_own(imported):
    """What only the solves and rank decisions import (cupyx.scipy.linalg, which
    imports cupyx.scipy and with it cupyx.scipy.sparse; cuSPARSE) is not imported
    beside the launch loop's start, but on its own thread once the factorization
    first waits (the device layer's end_stage asks for it): one thread per
    process whoever asks, the loop's libraries not among them."""
    import inspect

    from scipy_gpuqr._engine.gpu import device as dmod
    t = fk.prefetch_later_libraries()
    assert t.daemon and t.name == "gpuqr-later-libraries"
    assert fk.prefetch_later_libraries() is t
    t.join(30)
    assert imported == list(fk.LATER_LIBRARIES)
    early = fk.prefetch_libraries()
    assert early is not t and early.name == "gpuqr-libraries"
    early.join(30)
    assert imported[len(fk.LATER_LIBRARIES):] == list(fk.ENGINE_LIBRARIES)
    assert not set(fk.ENGINE_LIBRARIES) & set(fk.LATER_LIBRARIES)
    assert "cupyx.scipy.linalg" in fk.LATER_LIBRARIES
    assert "prefetch_later_libraries()" in inspect.getsource(dmod.CupyDevice.end_stage)


class _SlowStart:
    """A thread stand-in whose start takes a while (others ask meanwhile); counts starts."""

    started = []

    def __init__(self, target=None, args=(), name=None, daemon=None):
        self.name, self.daemon = name, daemon

    def start(self):
        import time
        _SlowStart.started.append(self.name)
        time.sleep(0.05)


def _ask_at_once(fn, thread, n=4):
    """``fn()`` from ``n`` threads (made by ``thread``) at once; their answers."""
    import threading
    barrier = threading.Barrier(n)
    got = []

    def ask():
        barrier.wait()
        got.append(fn())
    threads = [thread(target=ask) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_warmup_and_libraries_start_once_when_asked_at_once(monkeypatch):
    """A new process's first call asks for cuBLAS's warm-up and the libraries'
    imports from its prefetch thread and its own thread at about the same time:
    one thread each (two warm-ups ran beside the call's launches before)."""
    import threading
    from scipy_gpuqr._engine.gpu import blas_warmup as bw
    real = threading.Thread
    monkeypatch.setattr(threading, "Thread", _SlowStart)
    _SlowStart.started = []
    bw.start_blas_warmup.cache_clear()
    fk.prefetch_libraries.cache_clear()
    try:
        got = _ask_at_once(lambda: bw.start_blas_warmup(0, "float64"), real)
        assert _SlowStart.started == ["gpuqr-blas-warmup"]
        assert len(got) == 4 and all(g is got[0] for g in got)
        assert bw.start_blas_warmup(0, np.float64) is got[0]        # the same key
        _SlowStart.started = []
        got = _ask_at_once(fk.prefetch_libraries, real)
        assert _SlowStart.started == ["gpuqr-libraries"]
        assert all(g is got[0] for g in got)
    finally:
        bw.start_blas_warmup.cache_clear()
        fk.prefetch_libraries.cache_clear()


def test_finite_check_model_and_names():
    from scipy_gpuqr._engine.gpu import finite_check as fc
    assert fc.nonfinite_flag_numpy(np.zeros(0)) == 0
    x = np.arange(10.0)
    assert fc.nonfinite_flag_numpy(x) == 0
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[7] = bad
        assert fc.nonfinite_flag_numpy(y) == 1
    assert fc.nonfinite_name(np.float32) == "gpuqr::nonfinite_flag<float>"
    with pytest.raises(TypeError):
        fc.nonfinite_name(np.int32)
    assert fc.CHECK_FILE in _kernels.registered_variants()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_finite_check_matches_the_model(dtype):
    import cupy as cp

    from scipy_gpuqr._engine.gpu import finite_check as fc
    check = fc.finite_check(dtype)
    rng = np.random.default_rng(5)
    for n in (0, 1, 255, 256, 257, 100_003, fc.MAX_BLOCKS * fc.CHECK_THREADS * 3 + 17):
        x = rng.standard_normal(n).astype(dtype)
        cases = [x]
        for pos in {0, n // 2, n - 1} if n else ():
            for bad in (np.nan, np.inf, -np.inf):
                y = x.copy()
                y[pos] = bad
                cases.append(y)
        for h in cases:
            d = cp.asarray(h)
            want = fc.nonfinite_flag_numpy(h)
            assert int(check.enqueue(d).get()[0]) == want
            assert check(d) == (want == 0)


def test_r_copy_events_only_once_the_final_entries_are_known():
    """The launch loop records an event for R's copy worker only after a launch
    that makes at least a chunk more of R final, and none before the worker has
    computed which entries are final (the first event then covers them all):
    an event per launch took 0.04-0.08 s of the loop per GPU ``lsqr``."""
    import queue
    recorded = []

    class Event:
        def __init__(self, **kw):
            pass

        def record(self, stream):
            recorded.append(stream)
    stub = types.SimpleNamespace(
        final=lambda: None, _final_seen=None, _sent_cut=0, _min_chunk=10, q=queue.SimpleQueue(),
        cp=types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event)),
        dev=types.SimpleNamespace(stream="s"))
    for L in range(5):                          # the worker has not the final entries yet
        rcopy.CupyRCopy.after_launch(stub, L)
    assert stub.q.empty() and not recorded
    stub._final_seen = np.array([0, 3, 12, 15, 21, 40, 40, 45])
    for L in range(5, 8):
        rcopy.CupyRCopy.after_launch(stub, L)
    assert [stub.q.get()[0]] == [5] and stub.q.empty()      # 40 final; 45 is < a chunk more
    stub._final_seen, stub._sent_cut = np.array([0, 12, 15, 30]), 0
    for L in range(4):
        rcopy.CupyRCopy.after_launch(stub, L)
    assert [stub.q.get()[0] for _ in range(2)] == [1, 3] and stub.q.empty()
    stub.final = None                           # no progressive copy: never an event
    rcopy.CupyRCopy.after_launch(stub, 3)
    assert stub.q.empty() and len(recorded) == 3


def test_device_facts_without_the_property_query(monkeypatch):
    """The device's occupancy facts come from ``cudaDeviceGetAttribute`` and its
    name and memory from the driver, once per process: ``cudaGetDeviceProperties``
    (0.05 s of a new process's first GPU call) only where the driver cannot be
    asked."""
    from scipy_gpuqr import _gpu
    named = _gpu._driver_name_and_memory(0)     # None without a driver or a device
    if _gpu.gpu_info()["available"]:             # the driver's answers are the properties'
        props = _gpu.import_cupy().cuda.runtime.getDeviceProperties(0)
        assert named == (_gpu._decode(props["name"]), int(props["totalGlobalMem"]))
    else:
        assert named is None
    asked = []

    class Runtime:
        def __init__(self):
            for i, attr in enumerate(_gpu._ATTRIBUTES.values()):
                setattr(self, attr, i)

        def deviceGetAttribute(self, attr, device):
            asked.append(("attr", attr, device))
            return 100 + attr

        def getDeviceProperties(self, device):
            asked.append(("props", device))
            return {"name": b"Model X", "totalGlobalMem": 7}
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=Runtime(), Device=lambda i: types.SimpleNamespace(compute_capability="90")))
    monkeypatch.setattr(_gpu, "import_cupy", lambda: fake)
    for fn in (_gpu.device_attributes, _gpu._device_properties):
        monkeypatch.setattr(_gpu, fn.__name__, functools.lru_cache(maxsize=None)(fn.__wrapped__))
    monkeypatch.setattr(_gpu, "_driver_name_and_memory", lambda d: ("Model D", 5 << 30))
    attrs = _gpu.device_attributes(3)
    assert attrs == {k: 100 + i for i, k in enumerate(_gpu._ATTRIBUTES)}
    assert attrs["multiProcessorCount"] == 100
    p = _gpu._device_properties(3)
    assert p == {"name": "Model D", "compute_capability": "90", "total_memory": 5 << 30,
                 "multiprocessors": 100, "shared_memory_per_block_optin": 101}
    assert _gpu.device_name(3) == "Model D" and _gpu._device_properties(3) is p
    assert not [a for a in asked if a[0] == "props"]
    assert len(asked) == len(_gpu._ATTRIBUTES)          # read once
    monkeypatch.setattr(_gpu, "_driver_name_and_memory", lambda d: None)
    assert _gpu._device_properties(4)["name"] == "Model X" and ("props", 4) in asked

