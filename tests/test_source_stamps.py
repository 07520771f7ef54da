"""Source stamps recorded in the store: a new process stats the files of a set
recorded with its stamp instead of reading and hashing them."""

import json
import os
import time

import pytest
from _stat_counter import counted_stats

from scipy_gpuqr import _store


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A store folder and a source folder of this test; the process's stamps and
    records forgotten (a new process), the reads and hashes counted."""
    store, src = tmp_path / "store", tmp_path / "src"
    src.mkdir()
    monkeypatch.setenv(_store.ENV, str(store))
    monkeypatch.setattr(_store, "_STAMPS", {})
    monkeypatch.setattr(_store, "_RECORDS", {})
    hashed = []
    real = _store._hash_sources
    monkeypatch.setattr(_store, "_hash_sources", lambda key: hashed.append(key) or real(key))

    def write(name, text, age=60):
        p = src / name
        p.write_text(text)
        t = time.time() - age
        os.utime(p, (t, t))

    def new_process():
        _store.flush()
        monkeypatch.setattr(_store, "_STAMPS", {})
        monkeypatch.setattr(_store, "_RECORDS", {})
        hashed.clear()

    return store, src, write, hashed, new_process


def test_a_recorded_set_is_not_read_again(fresh):
    store, src, write, hashed, new_process = fresh
    write("a.py", "x = 1\n")
    write("b.py", "y = 2\n")
    s1 = _store.source_stamp(src, ("a.py", "b.py"))
    assert s1 and len(hashed) == 1
    assert _store.source_stamp(src, ("a.py", "b.py")) == s1 and len(hashed) == 1
    new_process()
    assert (store / _store.STAMPS_FILE).is_file()
    assert _store.source_stamp(src, ("a.py", "b.py")) == s1 and hashed == []
    assert _store._hash_sources((str(src), ("a.py", "b.py"))) == s1   # the contents' hash


def test_a_changed_file_is_hashed_again(fresh):
    store, src, write, hashed, new_process = fresh
    write("a.py", "x = 1\n")
    s1 = _store.source_stamp(src, ("a.py",))
    new_process()
    write("a.py", "x = 2\n", age=30)              # same size, another text and time
    s2 = _store.source_stamp(src, ("a.py",))
    assert s2 != s1 and len(hashed) == 1
    new_process()
    assert _store.source_stamp(src, ("a.py",)) == s2 and hashed == []


def test_a_file_edited_just_now_is_not_recorded(fresh):
    store, src, write, hashed, new_process = fresh
    write("a.py", "x = 1\n", age=0)
    s1 = _store.source_stamp(src, ("a.py",))
    new_process()
    assert _store.source_stamp(src, ("a.py",)) == s1 and len(hashed) == 1


def test_records_of_other_processes_are_kept_and_bounded(fresh, monkeypatch):
    store, src, write, hashed, new_process = fresh
    monkeypatch.setattr(_store, "STAMPS_MAX", 3)
    for k in range(5):
        write(f"m{k}.py", f"v = {k}\n")
        _store.source_stamp(src, (f"m{k}.py",))
        new_process()                       # each set recorded by a process of its own
    data = json.loads((store / _store.STAMPS_FILE).read_text())
    assert len(data) == 3                   # the three made last
    assert all(f"m{k}.py" in "".join(data) for k in (2, 3, 4))
    assert not list(store.glob("tmp-*.part"))


def test_no_store_no_record(tmp_path, monkeypatch):
    monkeypatch.setenv(_store.ENV, "off")
    monkeypatch.setattr(_store, "_STAMPS", {})
    monkeypatch.setattr(_store, "_RECORDS", {})
    (tmp_path / "a.py").write_text("x\n")
    assert _store.source_stamp(tmp_path, ("a.py",))
    _store.flush()
    assert not list(tmp_path.glob("*.json"))


def test_a_damaged_record_is_ignored(fresh):
    store, src, write, hashed, new_process = fresh
    write("a.py", "x = 1\n")
    store.mkdir()
    (store / _store.STAMPS_FILE).write_text("{not json")
    s1 = _store.source_stamp(src, ("a.py",))
    assert s1 and len(hashed) == 1
    new_process()
    assert _store.source_stamp(src, ("a.py",)) == s1 and hashed == []


# ------------------------------------------------------------ kernel sources

@pytest.fixture
def kernels_tree(tmp_path, monkeypatch, fresh):
    """A copy of the package's kernels/ in a temporary folder as the kernels' folder,
    the kernel hashes of this process forgotten, the flattenings counted."""
    import shutil
    from scipy_gpuqr import _kernels
    store, src, write, hashed, new_process = fresh
    tree = tmp_path / "kernels"
    shutil.copytree(_kernels.kernels_dir(), tree)
    past = time.time() - 60
    for p in tree.rglob("*"):
        os.utime(p, (past, past))
    monkeypatch.setattr(_kernels, "kernels_dir", lambda: tree)
    monkeypatch.setattr(_kernels, "_HASHES", _kernels._Hashes())
    reads = []
    real = _kernels._flatten
    monkeypatch.setattr(_kernels, "_flatten", lambda *a: reads.append(a[0]) or real(*a))

    def kernels_new_process():
        new_process()
        monkeypatch.setattr(_kernels, "_HASHES", _kernels._Hashes())
        reads.clear()

    return _kernels, tree, reads, kernels_new_process


ENGINE_FILE = "sparse_qr/uberkernel.cu"


def _headers(_kernels, tree, name):
    return [f for f in _kernels._flatten(name, tree)[1] if f.endswith(".cuh")]


def test_a_new_process_takes_the_recorded_kernel_hash(kernels_tree):
    _kernels, tree, reads, new_process = kernels_tree
    h1 = _kernels.source_hash(ENGINE_FILE)
    assert reads == [ENGINE_FILE]
    new_process()
    assert _kernels.source_hash(ENGINE_FILE) == h1
    assert reads == []                                  # stat'ed, not read
    assert h1 == _kernels.hashlib.sha256(
        _kernels.flatten_source(ENGINE_FILE, tree).encode()).hexdigest()[:16]


def test_a_recorded_kernel_hash_stats_each_file_once(kernels_tree, monkeypatch):
    # the stat that checks the record against the files also gives the stamp
    # the process keeps the hash with
    _kernels, tree, reads, new_process = kernels_tree
    h1 = _kernels.source_hash(ENGINE_FILE)
    files = _kernels._flatten(ENGINE_FILE, tree)[1]
    new_process()
    with counted_stats(monkeypatch) as stats:
        assert _kernels.source_hash(ENGINE_FILE) == h1 and reads == []
    ours = sorted(p for p in stats if p.startswith(str(tree)))
    assert ours == sorted(str(tree / f) for f in files), ours
    with counted_stats(monkeypatch) as stats:
        assert _kernels.source_hash(ENGINE_FILE) == h1 and reads == []     # kept: stat'ed again
    assert sorted(p for p in stats if p.startswith(str(tree))) == ours


def test_a_new_kernel_hash_stats_each_file_once(kernels_tree, monkeypatch):
    # with no record, the stat that takes the files' ids for the record also gives
    # the stamp the process keeps the hash with (beyond the flattening's own stats)
    _kernels, tree, reads, new_process = kernels_tree
    with counted_stats(monkeypatch) as stats:
        files = _kernels._flatten(ENGINE_FILE, tree)[1]
        flattening = [p for p in stats if p.startswith(str(tree))]
        stats.clear()
        reads.clear()
        h1 = _kernels.source_hash(ENGINE_FILE)
    assert reads == [ENGINE_FILE]
    ours = sorted(p for p in stats if p.startswith(str(tree)))
    assert ours == sorted(flattening + [str(tree / f) for f in files]), ours
    assert _kernels.source_hash(ENGINE_FILE) == h1 and reads == [ENGINE_FILE]    # kept


@pytest.mark.parametrize("which", ["first", "last", "file"])
def test_an_edited_kernel_header_changes_the_recorded_hash(kernels_tree, which):
    _kernels, tree, reads, new_process = kernels_tree
    heads = _headers(_kernels, tree, ENGINE_FILE)
    assert len(heads) >= 2
    h1 = _kernels.source_hash(ENGINE_FILE)
    new_process()
    edit = tree / {"first": heads[0], "last": heads[-1], "file": ENGINE_FILE}[which]
    text = edit.read_text()
    edit.write_text(text.replace("\n", "\n// edited\n", 1))
    past = time.time() - 30
    os.utime(edit, (past, past))
    h2 = _kernels.source_hash(ENGINE_FILE)
    assert h2 != h1 and reads == [ENGINE_FILE]
    new_process()
    assert _kernels.source_hash(ENGINE_FILE) == h2 and reads == []      # recorded again
    new_process()
    edit.write_text(text)                               # back, same size, another time
    os.utime(edit, (past + 5, past + 5))
    assert _kernels.source_hash(ENGINE_FILE) == h1 and reads == [ENGINE_FILE]


def test_a_header_created_beside_an_includer_changes_the_recorded_hash(kernels_tree):
    # an include found in the kernels' root is first looked for beside the file
    # including it: a header created there is the one included from then on
    _kernels, tree, reads, new_process = kernels_tree
    text, files, absent = _kernels._flatten(ENGINE_FILE, tree)
    assert absent
    h1 = _kernels.source_hash(ENGINE_FILE)
    new_process()
    shadow = tree / absent[0]
    shadow.write_text((tree / absent[0].split("/")[-1]).read_text() + "// shadowing\n")
    past = time.time() - 30
    os.utime(shadow, (past, past))
    assert _kernels.source_hash(ENGINE_FILE) != h1 and reads == [ENGINE_FILE]


def test_a_kernel_edited_just_now_is_not_recorded(kernels_tree):
    _kernels, tree, reads, new_process = kernels_tree
    (tree / ENGINE_FILE).write_text((tree / ENGINE_FILE).read_text() + "\n")
    _kernels.source_hash(ENGINE_FILE)
    new_process()
    _kernels.source_hash(ENGINE_FILE)
    assert reads == [ENGINE_FILE]


def test_no_store_no_kernel_record(tmp_path, monkeypatch):
    from scipy_gpuqr import _kernels
    monkeypatch.setenv(_store.ENV, "off")
    monkeypatch.setattr(_kernels, "_HASHES", _kernels._Hashes())
    assert _kernels._record_name(_kernels.kernels_dir(), ENGINE_FILE) is None
    assert _kernels.source_hash(ENGINE_FILE)
