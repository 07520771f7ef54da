"""The compiled bucket simulation gives the NumPy one's rows byte for byte (CPU only).

The library is built into temporary folders here (never the user's cache).
Skipped only where no C compiler exists; a compiler that fails is a failure.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from scipy_gpuqr import _native_build
from scipy_gpuqr._schedule import bucket, native
from scipy_gpuqr._schedule.sparse import build_schedule, schedule_digest
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

from _native_helpers import built_loader, env_with_cache as _env, needs_compiler, use_loader
from test_schedule_build import _random_patterns, _schedule_bytes

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def loader(tmp_path_factory):
    return built_loader(native, tmp_path_factory.mktemp("native"))


@pytest.fixture
def compiled(loader, monkeypatch):
    """``bucket._simulate`` forced onto the compiled path of ``loader``."""
    use_loader(monkeypatch, native, loader[0])
    monkeypatch.setenv(native.ENV, "c")
    bucket.clear_cache()
    yield loader[0].get(True)
    bucket.clear_cache()


def _both(handle, pats, bundle, pipelining, granule):
    want = bucket._simulate_numpy(pats, bundle, pipelining, granule)
    got = bucket._schedules_of_native(native.simulate(handle, pats, bundle, pipelining, granule),
                                      [int(p[1]) for p in pats], granule)
    assert len(got) == len(want)
    for p, a, b in zip(pats, want, got):
        assert _schedule_bytes(a) == _schedule_bytes(b), p
        assert a.granule == b.granule and a.nct == b.nct
        assert not b.row_ptr.flags.writeable and not b.rcols["rows"].flags.writeable
    return got


def _front_patterns(A, tile):
    """Every front's tile pattern of ``A`` (as the plan makes them), distinct ones."""
    fs = analyze(A).fronts
    nfact = np.minimum(fs.fm, fs.fn)
    b, tptr = bucket.many_tile_buckets(fs.fm, fs.fn, nfact, fs.stair, fs.col_ptr, tile)
    nct = -(-fs.fn // tile)
    nfct = np.where(nfact > 0, -(-nfact // tile), 0)
    seen = {}
    for f in range(fs.nfronts):
        pb = b[tptr[f]:tptr[f + 1]]
        seen.setdefault((pb.tobytes(), int(nct[f]), int(nfct[f])), (pb, int(nct[f]), int(nfct[f])))
    return list(seen.values())


@pytest.mark.parametrize("bundle", [2, 3, 5])
@pytest.mark.parametrize("pipelining", [True, False])
@pytest.mark.parametrize("granule", [1, 16])
def test_random_patterns_byte_identical(loader, bundle, pipelining, granule):
    rng = np.random.default_rng(100 * bundle + 10 * pipelining + granule)
    pats = _random_patterns(rng, 150)
    # chessboards: every other row tile starting late, and dense and empty ones
    for n in (1, 2, 7, 16):
        lead = np.arange(2 * n) // 2
        pats.append((np.minimum(lead, np.arange(2 * n)).astype(np.int32), n + 1, n))
    pats += [(np.arange(6, dtype=np.int32) * 0, 9, 1), (np.full(4, -1, np.int32), 3, 0),
             (np.zeros(0, np.int32), 2, 0), (np.zeros(1, np.int32), 1, 1)]
    _both(loader[0].get(True), pats, bundle, pipelining, granule)


@pytest.mark.parametrize("tile", [16, 32])
@pytest.mark.parametrize("bundle, pipelining", [(3, True), (3, False), (2, True), (4, False)])
def test_grid_and_chessboard_fronts_byte_identical(loader, tile, bundle, pipelining):
    h = loader[0].get(True)
    for A in (grid3d_least_squares(9), chessboard_boundary(4, 5, 2)):
        _both(h, _front_patterns(A, tile), bundle, pipelining, 16)


def test_nothing_simulated_is_empty_too(loader):
    h = loader[0].get(True)
    for pats in ([], [(np.full(3, -1, np.int32), 2, 0)]):
        got = _both(h, pats, 3, True, 16)
        assert all(s.nlaunch == 0 and s.nvt == 0 for s in got)


@pytest.mark.parametrize("tile", [16, 32, 64])
def test_tile_buckets_identical(loader, tile):
    h = loader[0].get(True)
    for A in (grid3d_least_squares(9), chessboard_boundary(5, 6, 2)):
        fs = analyze(A).fronts
        for nfact in (np.minimum(fs.fm, fs.fn), fs.fp, np.zeros_like(fs.fm)):
            nrt = -(-fs.fm // tile)
            tptr = np.concatenate(([0], np.cumsum(nrt)))
            for stair in (fs.stair, None):
                want, _ = bucket._many_tile_buckets_numpy(fs.fm, fs.fn, nfact, stair, fs.col_ptr,
                                                          tile, nrt, tptr)
                got = native.tile_buckets(h, fs.fm, fs.fn, nfact, stair, fs.col_ptr, tile,
                                          int(tptr[-1]))
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    bad = np.array([3, 1])                       # a decreasing staircase: NumPy decides
    assert native.tile_buckets(h, [40], [2], [2], bad, [0, 2], 16, 3) is None
    assert native.tile_buckets(h, [40], [2], [2], None, [0, 2], 16, 2) is None   # 3 tiles


def test_element_rows_identical(loader):
    h = loader[0].get(True)
    pats = _random_patterns(np.random.default_rng(5), 80)
    for s in bucket._simulate_numpy(pats, 3, True, 16)[:1]:
        rc = s.block.cols                    # every pattern's rows, one block
        for tile in (16, 32, 64):
            want = bucket._element_rows_numpy(rc, tile)
            got = native.element_rows(h, rc, tile)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("threads", [2, 3, 7, 500])
def test_simulation_split_over_threads_is_one_call(loader, threads):
    """Ranges of patterns simulated on several threads give one call's arrays (rows
    end to end, every pattern's first and last row moved by the ranges before)."""
    h = loader[0].get(True)
    rng = np.random.default_rng(11)
    pats = _random_patterns(rng, 120) + _front_patterns(grid3d_least_squares(9), 16)
    pats += [(np.zeros(0, np.int32), 2, 0), (np.full(3, -1, np.int32), 2, 0)]
    for bundle, pipelining, granule in ((3, True, 16), (2, False, 1)):
        one = native.simulate(h, pats, bundle, pipelining, granule, threads=1)
        got = native.simulate(h, pats, bundle, pipelining, granule, threads=threads)
        assert len(got) == len(one)
        for a, b in zip(one, got):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    # the per-thread floor: a small set stays one call; none at all is empty
    assert native.simulate(h, [], 3, True, 16, threads=4)[4].shape == (0, 4)


def test_simulation_split_rejects_as_one_call(loader):
    """Patterns the library rejects in a later range give None as one call does (the
    NumPy path then decides)."""
    h = loader[0].get(True)
    pats = _random_patterns(np.random.default_rng(3), 40)
    bad = (np.zeros(2, np.int32), 2, 5)         # more bucket columns than row tiles
    for threads in (1, 2, 5):
        assert native.simulate(h, pats + [bad], 3, True, 16, threads=threads) is None
        assert native.simulate(h, [bad] + pats, 3, True, 16, threads=threads) is None


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_element_rows_split_over_threads_identical(loader, threads):
    h = loader[0].get(True)
    pats = _random_patterns(np.random.default_rng(6), 80)
    rc = bucket._simulate_numpy(pats, 3, True, 16)[0].block.cols
    for tile in (16, 32):
        one = native.element_rows(h, rc, tile, threads=1)
        got = native.element_rows(h, rc, tile, threads=threads)
        assert got.shape == one.shape and got.tobytes() == one.tobytes()


@pytest.mark.parametrize("A, kw", [
    ("grid", dict()), ("grid", dict(dense_flops=1e6, max_tasks=300)),
    ("grid", dict(tile=16, pipelining=False)), ("grid", dict(bundle=4, granule=3)),
    ("grid", dict(max_gpu_memory="third", dense_flops=1e7)),
    ("chess", dict()), ("chess", dict(max_gpu_memory="third", max_tasks=500))])
def test_whole_schedules_identical(compiled, A, kw, monkeypatch):
    # simulation, element rows and records (whole stages and per-launch chunks)
    an = analyze(grid3d_least_squares(10) if A == "grid" else chessboard_boundary(5, 6, 2))
    if kw.get("max_gpu_memory") == "third":
        kw = dict(kw, max_gpu_memory=int(an.gpu_bytes // 3))

    def both():
        bucket.clear_cache()
        s = build_schedule(an, cache=False, **kw)
        lazy = build_schedule(an, cache=False, lazy=True, **kw)
        chunks = b"".join(t.tobytes() for _, _, t in lazy.iter_launches(prefetch=False))
        return schedule_digest(s), chunks, len(s.stages)

    got = both()
    if "max_gpu_memory" in kw:
        assert got[2] > 1
    monkeypatch.setenv(native.ENV, "numpy")
    assert both() == got


def test_pinned_records_through_the_compiled_path(compiled):
    # tests/test_schedule_build.py::test_records_pinned's first digest (each launch's
    # records longest first)
    an = analyze(grid3d_least_squares(10))
    assert schedule_digest(build_schedule(an, cache=False)) == "a375062ae840473b"


def test_mode_and_fallback(tmp_path, monkeypatch):
    assert native.mode({}) == "auto"
    assert native.mode({native.ENV: " NumPy "}) == "numpy"
    with pytest.raises(ValueError):
        native.mode({native.ENV: "fortran"})
    # a compiler that fails: the NumPy path (auto), an error (c)
    ld = _native_build.Loader(native._SPEC)
    env = _env(tmp_path, CC=f"{sys.executable} -c 'raise SystemExit(3)'")
    assert ld.get(True, env) is None
    assert ld.status().startswith("unavailable: compiler failed")
    assert list((tmp_path / "native").iterdir()) == []          # no temporary file left
    use_loader(monkeypatch, native, ld)
    pats = _random_patterns(np.random.default_rng(3), 20)
    want = bucket._simulate_numpy(pats, 3, True, 16)
    monkeypatch.setenv(native.ENV, "auto")
    got = bucket._simulate(pats, 3, True, 16)
    assert [_schedule_bytes(s) for s in got] == [_schedule_bytes(s) for s in want]
    monkeypatch.setenv(native.ENV, "c")
    with pytest.raises(native.NativeUnavailable):
        bucket._simulate(pats, 3, True, 16)
    # numpy: the library is not even looked for
    monkeypatch.setenv(native.ENV, "numpy")

    class Unasked:
        def get(self, *args, **kwargs):
            pytest.fail("looked up")

        def status(self):
            return "not loaded"
    use_loader(monkeypatch, native, Unasked())
    got = bucket._simulate(pats, 3, True, 16)
    assert [_schedule_bytes(s) for s in got] == [_schedule_bytes(s) for s in want]


def test_built_once_then_loaded_and_damage_rebuilt(tmp_path):
    env = _env(tmp_path)
    first = _native_build.Loader(native._SPEC)
    assert first.get(False, env) is None or first.status() == "loaded"   # built on a thread
    assert first.get(True, env) is not None and first.build_s is not None
    so, = (tmp_path / "native").glob("native-*.so")
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == \
        [so.name, so.name + native.MANIFEST_SUFFIX]
    assert _native_build.intact(so)
    second = _native_build.Loader(native._SPEC)
    assert second.get(False, env) is not None and second.build_s is None  # loaded, not built
    # a damaged file (another folder: the loader maps a path once per process)
    other = tmp_path / "other"
    (other / "native").mkdir(parents=True)
    (other / "native" / so.name).write_bytes(b"not a library")
    third = _native_build.Loader(native._SPEC)
    assert third.get(True, _env(other)) is not None and third.build_s is not None
    assert sorted(p.name for p in (other / "native").iterdir()) == \
        [so.name, so.name + native.MANIFEST_SUFFIX]
    assert _native_build.intact(other / "native" / so.name)


def test_nothing_built_at_import(tmp_path):
    code = ("import scipy_gpuqr, scipy_gpuqr._schedule.sparse, scipy_gpuqr._schedule.native")
    subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), check=True, timeout=120)
    assert not (tmp_path / "native").exists()


def test_old_builds_pruned(tmp_path):
    d = tmp_path / "native"
    d.mkdir()
    for k in range(native.MAX_BUILDS + 3):
        p = d / f"native-old{k:02d}.so"
        p.write_bytes(b"x")
        _native_build.manifest_path(p).write_text(_native_build.manifest_text(1, "0" * 64))
        os.utime(p, (1000 + k, 1000 + k))
    for name in (".native-dead.so", ".native-dead.sha256", "native-gone.so.sha256"):
        (d / name).write_bytes(b"x")
        os.utime(d / name, (1000, 1000))
    (d / "native-young.so.sha256").write_bytes(b"x")       # maybe a build between renames
    ld = _native_build.Loader(native._SPEC)
    assert ld.get(True, _env(tmp_path)) is not None
    left = sorted(p.name for p in d.glob("native-*.so"))
    assert len(left) == native.MAX_BUILDS
    assert "native-old00.so" not in left and f"native-old{native.MAX_BUILDS + 2:02d}.so" in left
    manifests = sorted(p.name for p in d.glob("native-*.so" + native.MANIFEST_SUFFIX))
    assert manifests == sorted([n + native.MANIFEST_SUFFIX for n in left]
                               + ["native-young.so.sha256"])
    assert not any(p.name.startswith(".") for p in d.iterdir())


def test_fill_refuses_blocks_that_do_not_fit(loader):
    h = loader[0].get(True)
    tmpl = np.zeros((3, 12), dtype=np.int64)
    mult = np.array([1, 4, 1], dtype=np.int32)
    z = np.zeros(1, dtype=np.int64)
    one = np.ones(1, dtype=np.int32)
    args = (tmpl, mult, z, z, one, one, one, 16, 2)
    native.fill(h, np.zeros((6, 12), np.int64), [0], [3], [0], [0], *args)   # 6 records fit
    with pytest.raises(ValueError):
        native.fill(h, np.zeros((5, 12), np.int64), [0], [3], [0], [0], *args)
    with pytest.raises(ValueError):
        native.fill(h, np.zeros((6, 12), np.int64), [0], [3], [0], [1], *args)


# A damaged library on disk: checked against its manifest before it is mapped,
# deleted and built again. Each case runs in a fresh process (a SIGBUS there is a
# negative return code, not the end of pytest), which this process never maps.

_CHILD = """
import json
from scipy_gpuqr._schedule import native
from scipy_gpuqr._schedule.sparse import build_schedule, schedule_digest
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
lib = native.library(wait=True)
d = schedule_digest(build_schedule(analyze(grid3d_least_squares(10)), cache=False))
print(json.dumps(dict(status=native.status(), build_s=native._NATIVE.loader.build_s, digest=d)))
"""
_DIGEST = "a375062ae840473b"          # test_pinned_records_through_the_compiled_path's


def _child(env):
    """Load the library and plan a small schedule in a fresh process: its report."""
    import json
    r = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                       timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr.decode(errors="replace")[-2000:])
    got = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert got["digest"] == _DIGEST
    return got


def _manifest_matches(so):
    """The manifest beside ``so`` records its size and SHA-256 (computed here)."""
    import hashlib
    data = so.read_bytes()
    return _native_build.read_manifest(so) == (len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
def built(tmp_path):
    """``(environment, library path, its bytes)``: a library built by another process
    (mode ``c``) into a temporary cache folder, then loaded there without a build."""
    env = _env(tmp_path, **{native.ENV: "c"})
    assert _child(env)["build_s"] is not None
    so, = (tmp_path / "native").glob("native-*.so")
    assert _manifest_matches(so)
    assert _child(env) == dict(status="loaded", build_s=None, digest=_DIGEST)
    return env, so, so.read_bytes()


def _rebuilt(env, so, good):
    got = _child(env)
    assert got["status"] == "loaded" and got["build_s"] is not None, got
    assert _manifest_matches(so) and so.stat().st_size == len(good)
    assert not any(p.name.startswith(".") for p in so.parent.iterdir())   # no temporaries
    assert _child(env)["build_s"] is None                 # and loaded from then on


def test_truncated_library_rebuilt(built):
    env, so, good = built
    os.truncate(so, len(good) // 2)                   # in place (the old code: SIGBUS)
    _rebuilt(env, so, good)


def test_overwritten_library_rebuilt(built):
    env, so, good = built
    with open(so, "r+b") as f:                        # in place, the size kept
        f.seek(len(good) // 2)
        f.write(b"\xff" * 256)
    _rebuilt(env, so, good)


def test_missing_manifest_rebuilt(built):
    env, so, good = built
    _native_build.manifest_path(so).unlink()
    _rebuilt(env, so, good)


def test_damaged_manifest_rebuilt(built):
    env, so, good = built
    m = _native_build.manifest_path(so)
    m.write_text(m.read_text().replace("size ", "size 1"))
    _rebuilt(env, so, good)
    m.write_text("garbage")
    _rebuilt(env, so, good)


def test_damaged_library_without_compiler_numpy_path(built, tmp_path):
    # the same key (the same $CC command), but the compiler now fails: the NumPy
    # path gives the same schedule, and the damaged file is gone
    env, so, good = built
    import shlex
    cc = tmp_path / "cc.sh"
    real = shlex.join(_native_build.compiler(os.environ))
    cc.write_text(f'#!/bin/sh\n[ -n "$SGQ_TEST_CC_FAIL" ] && exit 3\nexec {real} "$@"\n')
    cc.chmod(0o755)
    env = dict(env, CC=str(cc), **{native.ENV: "auto"})
    assert _child(env)["build_s"] is not None
    so, = (p for p in so.parent.glob("native-*.so") if p != so)
    os.truncate(so, len(so.read_bytes()) // 2)
    got = _child(dict(env, SGQ_TEST_CC_FAIL="1"))
    assert got["status"].startswith("unavailable: compiler failed"), got
    assert not so.exists() and not _native_build.manifest_path(so).exists()
    assert _child(env)["build_s"] is not None and _manifest_matches(so)   # compiler back


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pack_equals_the_numpy_pack_assemble(loader, dtype):
    """A launch's Pack-Assemble records compiled (``native.pack``, on threads) write
    what ``simulate.execute_task`` writes, the upper trapezoid of the triangle
    pieces only, and nothing else of the pool."""
    from scipy_gpuqr._engine.host.simulate import execute_task
    from scipy_gpuqr._schedule.tasks import TASK_DTYPE, TaskType
    lib = loader[0].get(True, loader[1])
    rng = np.random.default_rng(3)
    cm, cn, pm, pn = 70, 50, 120, 90          # a child's block and its parent front
    C, P = 0, cm * cn + 17
    rows_of = rng.permutation(pm)[:cm]        # block rows -> parent rows, distinct
    cols_of = np.sort(rng.permutation(pn)[:cn])
    maps = np.concatenate((rows_of, cols_of)).astype(np.int64)
    recs = np.zeros(0, TASK_DTYPE)
    for r0 in range(0, cm, 32):
        for c0 in range(0, cn, 32):
            rec = np.zeros(1, TASK_DTYPE)
            rec["type"] = int(TaskType.PACK_ASSEMBLE)
            rec["F"], rec["fn"], rec["vt"], rec["col"] = P, pn, C, cn
            rec["vt2"], rec["aux"] = 0, cm
            rec["rows"][0, :2] = (r0, min(cm, r0 + 32))
            rec["c0"], rec["c1"] = c0, min(cn, c0 + 32)
            rec["nfrows"] = int(r0 == c0)     # the diagonal pieces: triangles
            recs = np.concatenate((recs, rec))
    pool = rng.standard_normal(P + pm * pn).astype(dtype)
    before = pool.copy()
    want = pool.copy()
    for rec in recs:
        execute_task(rec, want, np.zeros(1, dtype), 32, maps=maps)
    native.pack(lib, pool, maps, recs)
    np.testing.assert_array_equal(pool, want)
    moved = np.count_nonzero(pool != before)
    assert moved >= cm * cn // 2              # the trapezoid reached the parent
