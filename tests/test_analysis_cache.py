"""The analysis cache: one symbolic analysis per sparsity pattern, in memory and on disk.

A hit must equal a new analysis field by field; another pattern (one entry
moved), other options or, with ``singleton_tol``, another set of entries above
the tolerance must miss. Disk entries go to temporary folders only.
"""

from __future__ import annotations

import dataclasses
import pickle
import time

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import real_shared_matrices
from scipy_gpuqr._symbolic import Amalgamation, analysis_cache, analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, engine_families,
                                           grid3d_least_squares, random_least_squares,
                                           singleton_rich, small_families)


def assert_same_analysis(a, b, path="analysis"):
    """Every field equal (arrays: dtype, shape and values), ``timings`` aside."""
    assert type(a).__name__ == type(b).__name__, path
    for f in dataclasses.fields(a):
        if f.name == "timings":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        where = f"{path}.{f.name}"
        if dataclasses.is_dataclass(x):
            assert_same_analysis(x, y, where)
        elif isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray), where
            assert x.dtype == y.dtype and x.shape == y.shape, where
            np.testing.assert_array_equal(x, y, err_msg=where)
        else:
            assert x == y and type(x) is type(y), (where, x, y)


@pytest.fixture(autouse=True)
def fresh_memory():
    analysis_cache.clear()
    yield
    analysis_cache.clear()


@pytest.fixture
def count_analyses(monkeypatch):
    """How often ``analyze`` (with the cache) really analyses: its misses."""
    calls = []
    real = analysis_cache.keep

    def counted(k, an):
        calls.append(an.shape)
        return real(k, an)

    monkeypatch.setattr(analysis_cache, "keep", counted)
    return calls


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A disk cache in a temporary folder, every matrix kept, files written at once."""
    monkeypatch.setenv("SCIPY_GPUQR_SCHEDULE_CACHE", str(tmp_path))
    monkeypatch.setattr(analysis_cache, "DISK_MIN_NNZ", 0)
    monkeypatch.setattr(analysis_cache._store, "write_behind", lambda fn, *a: fn(*a))
    return tmp_path


def _entries(folder):
    return sorted((folder / "analyses").glob("an-*.bin"))


def _matrices():
    for name, A in small_families():
        yield name, A
    for name, A in engine_families(np.random.default_rng(3)):
        yield f"engine-{name}", A
    for s in range(3):
        yield f"random{s}", random_least_squares(120, 50, 0.06, dense_rows=s, seed=s)
        yield f"singletons{s}", singleton_rich(70, 45, seed=s)
    yield "grid6", grid3d_least_squares(6)
    yield "chessboard", chessboard_boundary(4, 5, 2)


MATRICES = list(_matrices())


@pytest.mark.parametrize("name,A", MATRICES, ids=[m[0] for m in MATRICES])
def test_hit_equals_a_new_analysis(name, A, count_analyses):
    first = analyze(A)
    hit = analyze(A)
    assert len(count_analyses) == 1
    assert hit is not first and set(hit.timings) == {"cache"}
    assert_same_analysis(hit, analyze(A, cache=False))
    assert_same_analysis(first, hit)


def test_hit_equals_a_new_analysis_on_the_shared_matrices(matrices_dir, count_analyses):
    n = 0
    for name, A in real_shared_matrices(matrices_dir):
        if A.nnz > 300_000:
            continue
        analysis_cache.clear()
        analyze(A)
        before = len(count_analyses)
        hit = analyze(A)
        assert len(count_analyses) == before, name
        assert_same_analysis(hit, analyze(A, cache=False), name)
        n += 1
    assert n > 10


@pytest.mark.parametrize("name,A", MATRICES[:8] + MATRICES[-2:],
                         ids=[m[0] for m in MATRICES[:8] + MATRICES[-2:]])
def test_disk_hit_equals_a_new_analysis(name, A, disk, count_analyses):
    analyze(A)
    assert len(_entries(disk)) == 1
    analysis_cache.clear()                               # as a new process would
    hit = analyze(A)
    assert len(count_analyses) == 1
    assert_same_analysis(hit, analyze(A, cache=False))
    assert all(not a.flags.writeable for a in analysis_cache._arrays_of(hit))


def test_one_entry_moved_misses(disk, count_analyses):
    A = sp.csc_array(random_least_squares(200, 80, 0.05, seed=11))
    B = A.tolil()
    i, j = (int(x) for x in np.argwhere(A.toarray() != 0)[7])
    free = np.flatnonzero(A.toarray()[:, j] == 0)
    B[i, j] = 0
    B[int(free[0]), j] = 1.5
    B = sp.csc_array(B)
    B.eliminate_zeros()
    assert B.nnz == A.nnz and B.shape == A.shape
    analyze(A)
    got = analyze(B)
    assert len(count_analyses) == 2
    assert_same_analysis(got, analyze(B, cache=False))
    analysis_cache.clear()
    analyze(B)                                           # from disk: B's own entry
    assert len(count_analyses) == 2


def test_a_checksum_collision_is_a_miss(disk, monkeypatch, count_analyses):
    # every pattern gets the same key: the exact pattern check must tell them apart,
    # in memory and on disk
    real = analysis_cache.key

    def colliding(*a, **k):
        got = real(*a, **k)
        return None if got is None else dataclasses.replace(got, digest="0" * 32)

    monkeypatch.setattr(analysis_cache, "key", colliding)
    A = grid3d_least_squares(4)
    B = grid3d_least_squares(5)
    a = analyze(A)
    b = analyze(B)
    assert len(count_analyses) == 2
    assert_same_analysis(b, analyze(B, cache=False))
    analysis_cache.clear()
    got = analyze(A)                                     # the file holds B's analysis
    assert len(count_analyses) == 3
    assert_same_analysis(got, a)


def test_values_do_not_matter_but_the_tolerance_mask_does(count_analyses):
    rng = np.random.default_rng(5)
    A = singleton_rich(60, 40, seed=3)
    B = A.copy()
    B.data = rng.standard_normal(B.nnz)
    analyze(A)
    assert_same_analysis(analyze(B), analyze(A, cache=False))
    assert len(count_analyses) == 1
    # with a tolerance the entries above it decide the singletons: same mask, a hit
    tol = 0.5
    C = A.copy()
    C.data = np.where(np.abs(A.data) > tol, 2.0, 0.1)
    analyze(A, singleton_tol=tol)
    assert len(count_analyses) == 2
    assert_same_analysis(analyze(C, singleton_tol=tol), analyze(A, singleton_tol=tol,
                                                                 cache=False))
    assert len(count_analyses) == 2
    # one entry moved below the tolerance: a miss, and the analysis sees it
    D = C.copy()
    big = np.flatnonzero(np.abs(D.data) > tol)
    D.data[big[0]] = 1e-3
    got = analyze(D, singleton_tol=tol)
    assert len(count_analyses) == 3
    assert_same_analysis(got, analyze(D, singleton_tol=tol, cache=False))


@pytest.mark.parametrize("kw", [
    dict(ordering="natural"), dict(ordering="amd"), dict(ordering="metis"),
    dict(colperm="reversed"), dict(max_gpu_memory=60_000), dict(itemsize=4),
    dict(amalgamation=Amalgamation(enabled=False)),
    dict(amalgamation=Amalgamation(nrelax=(2, 8, 24))), dict(singletons=False),
    dict(singleton_tol=1e-3),
])
def test_every_option_is_in_the_key(kw, count_analyses):
    A = singleton_rich(80, 50, seed=7)
    if kw.get("colperm") == "reversed":
        kw = dict(colperm=np.arange(A.shape[1])[::-1].copy())
    analyze(A)
    got = analyze(A, **kw)
    assert len(count_analyses) == 2
    assert_same_analysis(got, analyze(A, cache=False, **kw))
    again = analyze(A, **kw)
    assert len(count_analyses) == 2
    assert_same_analysis(again, got)


def test_a_given_colperm_is_keyed_by_its_values(count_analyses):
    A = random_least_squares(60, 30, 0.1, seed=2)
    p = np.random.default_rng(0).permutation(30)
    analyze(A, colperm=p)
    analyze(A, colperm=p.astype(np.int32))               # same values: a hit
    assert len(count_analyses) == 1
    q = p.copy()
    q[[0, 1]] = q[[1, 0]]
    analyze(A, colperm=q)
    assert len(count_analyses) == 2
    with pytest.raises(ValueError):                      # still validated
        analyze(A, colperm=np.zeros(30, dtype=int))


def test_every_input_form_of_one_pattern_hits(count_analyses):
    A = sp.csc_array(random_least_squares(90, 40, 0.08, seed=4))
    analyze(A)
    A32 = sp.csc_array((A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32)),
                       shape=A.shape)
    # duplicates summed and indices unsorted: the canonical pattern is the same
    coo = sp.coo_array(A)
    dup = sp.coo_array((np.concatenate([coo.data / 2, coo.data / 2]),
                        (np.concatenate([coo.row, coo.row]), np.concatenate([coo.col, coo.col]))),
                       shape=A.shape)
    for form in (A32, sp.csr_array(A), sp.csc_matrix(A), coo, dup, A.toarray()):
        assert_same_analysis(analyze(form), analyze(A, cache=False))
    assert len(count_analyses) == 1


def test_key_reads_int32_indices_without_a_copy_and_matches_int64():
    """The pattern's checksums are of the int32 values where every index fits
    (a SciPy matrix's own arrays, no copy), the same for int64 arrays."""
    A = sp.csc_array(random_least_squares(90, 40, 0.08, seed=4))
    opts = dict(ordering="colamd", colperm=None, max_gpu_memory=None, itemsize=8,
                amalgamation=Amalgamation(), singletons=True, singleton_tol=None)
    k32 = analysis_cache.key(A.shape, A.indptr.astype(np.int32), A.indices.astype(np.int32),
                             None, opts)
    k64 = analysis_cache.key(A.shape, A.indptr.astype(np.int64), A.indices.astype(np.int64),
                             None, opts)
    assert k32.digest == k64.digest
    ix = A.indices.astype(np.int32)
    assert analysis_cache._narrow(ix, True) is ix or np.shares_memory(
        analysis_cache._narrow(ix, True), ix)
    big = analysis_cache._narrow(A.indices.astype(np.int32), False)
    assert big.dtype == np.dtype("<i8") and np.array_equal(big, A.indices)


def test_arrays_are_read_only_and_the_cache_unchanged(count_analyses):
    A = grid3d_least_squares(4)
    an = analyze(A)
    with pytest.raises(ValueError):
        an.colperm[0] = 1
    with pytest.raises(ValueError):
        an.fronts.cols[0] = 1
    assert all(not a.flags.writeable for a in analysis_cache._arrays_of(analyze(A)))
    assert all(not a.flags.writeable
               for a in analysis_cache._arrays_of(analyze(A, cache=False)))
    # a hit pickles and unpickles like a new analysis
    back = pickle.loads(pickle.dumps(analyze(A)))
    assert_same_analysis(back, an)


def test_cache_false_neither_reads_nor_keeps(count_analyses):
    A = grid3d_least_squares(4)
    analyze(A, cache=False)
    analyze(A, cache=False)
    assert len(count_analyses) == 0 and len(analysis_cache._MEMORY) == 0
    analyze(A)
    assert_same_analysis(analyze(A), analyze(A, cache=False))
    assert len(count_analyses) == 1 and len(analysis_cache._MEMORY) == 1


def test_memory_table_is_bounded():
    lru = analysis_cache.AnalysisLRU(max_entries=2, max_bytes=1 << 30)
    ans = [analyze(grid3d_least_squares(k), cache=False) for k in (3, 4, 5)]
    for i, an in enumerate(ans):
        lru.put(str(i), an)
    assert len(lru) == 2 and lru.get("0") is None and lru.get("2") is ans[2]
    lru.get("1")                                         # used: the other one leaves first
    lru.put("3", ans[0])
    assert lru.get("1") is ans[1] and lru.get("2") is None
    small = analysis_cache.AnalysisLRU(max_entries=10,
                                       max_bytes=analysis_cache._nbytes(ans[1]) + 1)
    small.put("a", ans[0])
    small.put("b", ans[1])
    assert small.get("a") is None and small.get("b") is ans[1]
    small.put("c", ans[2])                               # alone larger than the bound
    assert small.get("c") is None
    assert analysis_cache.MEMORY_ENTRIES >= 1 and analysis_cache.MEMORY_BYTES > 0


def test_disk_entries_are_bounded(disk, monkeypatch):
    monkeypatch.setattr(analysis_cache, "MAX_DISK_FILES", 2)
    for k in (3, 4, 5, 6):
        analyze(grid3d_least_squares(k))
    assert len(_entries(disk)) == 2


def test_small_matrices_stay_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("SCIPY_GPUQR_SCHEDULE_CACHE", str(tmp_path))
    monkeypatch.setattr(analysis_cache._store, "write_behind", lambda fn, *a: fn(*a))
    analyze(grid3d_least_squares(4))                     # below DISK_MIN_NNZ
    assert not _entries(tmp_path)
    analyze(grid3d_least_squares(14))                    # above it
    assert len(_entries(tmp_path)) == 1


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SCIPY_GPUQR_SCHEDULE_CACHE", "off")
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(analysis_cache, "DISK_MIN_NNZ", 0)
    analyze(grid3d_least_squares(5))
    analysis_cache.flush()
    assert analysis_cache.folder() is None
    assert not any(tmp_path.rglob("*"))


def test_default_folder_is_the_schedule_store(tmp_path, monkeypatch):
    monkeypatch.delenv("SCIPY_GPUQR_SCHEDULE_CACHE", raising=False)
    monkeypatch.setenv("SCIPY_GPUQR_CACHE_DIR", str(tmp_path))
    assert analysis_cache.folder() == tmp_path / "tile_schedules" / "analyses"


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "stamp"])
def test_damaged_or_stale_file_is_ignored_and_replaced(disk, monkeypatch, count_analyses,
                                                       damage):
    A = grid3d_least_squares(6)
    want = analyze(A)
    path, = _entries(disk)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-40] ^= 0x10
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "garbage":
        data = bytearray(b"\x01" * 80)
    elif damage == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))
    if damage == "stamp":                                # written by other analysis code
        monkeypatch.setattr(analysis_cache, "code_stamp", lambda: "another-stamp-0000")
    analysis_cache.clear()
    got = analyze(A)
    assert len(count_analyses) == 2                      # analysed again
    assert_same_analysis(got, want)
    analysis_cache.clear()
    analyze(A)
    assert len(count_analyses) == 2                      # the rewritten file is good
    if damage == "stamp":
        assert path.exists() and len(_entries(disk)) == 2   # another stamp's: left to the bound


def test_writes_are_behind_the_caller_and_atomic(tmp_path, monkeypatch):
    import threading
    monkeypatch.setenv("SCIPY_GPUQR_SCHEDULE_CACHE", str(tmp_path))
    monkeypatch.setattr(analysis_cache, "DISK_MIN_NNZ", 0)
    gate = threading.Event()
    real = analysis_cache._save

    def slow_save(*a):
        assert gate.wait(30)
        return real(*a)

    monkeypatch.setattr(analysis_cache, "_save", slow_save)
    analyze(grid3d_least_squares(5))                     # returns with the write held
    assert not _entries(tmp_path)
    gate.set()
    analysis_cache.flush()
    assert len(_entries(tmp_path)) == 1
    assert not list((tmp_path / "analyses").glob("tmp-*"))


def test_hit_costs_little_on_grid40():
    A = grid3d_least_squares(40)
    analyze(A)
    best = np.inf
    for _ in range(10):
        t = time.perf_counter()
        analyze(A)
        best = min(best, time.perf_counter() - t)
    assert best <= 0.010, f"a hit took {best * 1e3:.1f} ms"


def test_pattern_key_names_the_pattern_and_options():
    A = grid3d_least_squares(4)
    first, hit = analyze(A), analyze(A)
    assert first.pattern_key is not None and hit.pattern_key == first.pattern_key
    assert len(first.pattern_key) == 32
    assert analyze(A, cache=False).pattern_key is None
    assert analyze(A, itemsize=4).pattern_key != first.pattern_key
    assert analyze(grid3d_least_squares(5)).pattern_key != first.pattern_key
    assert pickle.loads(pickle.dumps(hit)).pattern_key == hit.pattern_key
    assert dataclasses.replace(hit).pattern_key is None      # a changed copy is not keyed


@pytest.mark.parametrize("name", ["colamd", "amd"])
def test_ordering_library_file_from_the_loader_equals_the_mappings(monkeypatch, name):
    """The ordering library's file in the key, asked of the loader (dlinfo), is the
    one the process's mappings name (symbolic links resolved, size included); the
    mappings answer where the loader cannot."""
    from scipy_gpuqr._cpu._libs import LibraryNotFound, find_library
    try:
        soname = find_library(name)
    except LibraryNotFound:
        pytest.skip(f"no {name}")
    asked = analysis_cache._library_file(soname)
    path = analysis_cache._loaded_path(soname)
    assert path is not None and asked.startswith(path.rsplit("/", 1)[-1] + ":")
    monkeypatch.setattr(analysis_cache, "_loaded_path", lambda s: None)
    assert analysis_cache._library_file(soname) == asked


def test_a_hit_is_a_replace_of_the_kept_analysis(count_analyses):
    """A hit's copy holds the kept analysis' field objects, as ``dataclasses.replace``
    would make it (no field dropped or added), with its own ``timings``."""
    from scipy_gpuqr._symbolic import analysis as _analysis
    A = singleton_rich(60, 40, seed=3)
    first = analyze(A)
    second = analyze(A)
    assert len(count_analyses) == 1 and second is not first
    want = dataclasses.replace(first, timings={"cache": 0.0})
    got = _analysis._renewed(first, {"cache": 0.0})
    assert type(got) is type(want) and set(vars(got)) == set(vars(want))
    for f in dataclasses.fields(want):
        assert getattr(got, f.name) is getattr(want, f.name) or f.name == "timings", f.name
    assert got.timings == {"cache": 0.0} and got.timings is not first.timings
    assert "cache" in second.timings and second.pattern_key == first.pattern_key
    assert_same_analysis(second, analyze(A, cache=False))


def test_key_facts_are_hashed_once_and_alike(monkeypatch):
    """The key's facts are hashed once per set of facts (:func:`_head_hash`) and give the
    same digest as hashed anew; facts equal as numbers but written otherwise (an
    amalgamation of floats) still make another key."""
    A = sp.csc_array(random_least_squares(70, 30, 0.1, seed=6))
    opts = dict(ordering="colamd", colperm=None, max_gpu_memory=None, itemsize=8,
                amalgamation=Amalgamation(), singletons=True, singleton_tol=None)
    k1 = analysis_cache.key(A.shape, A.indptr, A.indices, A.data, opts)
    analysis_cache._head_hash.cache_clear()
    k2 = analysis_cache.key(A.shape, A.indptr, A.indices, A.data, opts)
    k3 = analysis_cache.key(A.shape, A.indptr, A.indices, A.data, opts)
    assert k1.digest == k2.digest == k3.digest
    assert analysis_cache._head_hash.cache_info().hits >= 1
    floats = dict(opts, amalgamation=Amalgamation(nrelax=(4.0, 16, 48)))
    assert Amalgamation(nrelax=(4.0, 16, 48)) == Amalgamation()
    k4 = analysis_cache.key(A.shape, A.indptr, A.indices, A.data, floats)
    assert k4.digest != k1.digest
    unhashable = dict(opts, amalgamation=Amalgamation(nrelax=[4, 16, 48]))
    k5 = analysis_cache.key(A.shape, A.indptr, A.indices, A.data, unhashable)
    assert k5 is not None and k5.digest == k1.digest
    monkeypatch.setattr(analysis_cache, "code_stamp", lambda: "another-stamp-0000")
    k6 = analysis_cache.key(A.shape, A.indptr, A.indices, A.data, opts)
    assert k6.digest != k1.digest                        # the stamp is read on every key
