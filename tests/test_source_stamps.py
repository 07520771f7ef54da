"""Source stamps recorded in the store: a new process stats the files of a set
recorded with its stamp instead of reading and hashing them."""

import json
import os
import time

import pytest

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
