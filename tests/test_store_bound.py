"""The store's size bound (:func:`scipy_gpuqr._store.bound`): the same deletions as
a stat of every entry on every write, without that stat where the bound holds.

A write lists the folder and stats only the entries this process has not seen
(the one just written among them); files other processes write or delete are
seen by the listing. CPU only, temporary folders.
"""

import os
import random

import pytest

from scipy_gpuqr import _store


def _write(where, name, size, age_ns=None):
    p = where / name
    p.write_bytes(b"x" * size)
    if age_ns is not None:
        os.utime(p, ns=(age_ns, age_ns))
    return p


@pytest.fixture
def stats(monkeypatch):
    """The paths ``os.stat`` is asked for (pathlib's stats included)."""
    seen = []
    real = os.stat

    def counting(path, *a, **k):
        seen.append(os.fspath(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "stat", counting)
    return seen


def _reference(where, prefix, keep, max_bytes, max_files, current):
    """What a stat of every entry deletes: other stamps first, then the oldest."""
    found = []
    for p in where.iterdir():
        if p.name.startswith(prefix) and p.suffix == ".bin":
            st = p.stat()
            mine = current is not None and p.name.startswith(current)
            found.append((mine, st.st_mtime_ns, p.name, p, st.st_size))
    found.sort()
    total, n, gone = sum(f[4] for f in found), len(found), []
    for _, _, _, p, size in found:
        if total <= max_bytes and n <= max_files:
            break
        if p == keep:
            continue
        gone.append(p.name)
        total -= size
        n -= 1
    return set(gone)


def test_a_write_within_the_bound_stats_only_the_new_entry(tmp_path, stats):
    for k in range(20):
        _write(tmp_path, f"e-{k:02d}.bin", 10)
    stats.clear()
    _store.bound(tmp_path, "e-", tmp_path / "e-19.bin", 10_000, 100)
    assert len(stats) == 20                              # first sight: each entry once
    new = _write(tmp_path, "e-20.bin", 10)
    stats.clear()
    _store.bound(tmp_path, "e-", new, 10_000, 100)
    assert stats == [os.fspath(new)]
    assert len(list(tmp_path.glob("e-*.bin"))) == 21


def test_other_processes_files_count_and_their_deletions_are_seen(tmp_path):
    t = 10 ** 18
    for k in range(3):
        _write(tmp_path, f"e-{k}.bin", 100, t + k)
        _store.bound(tmp_path, "e-", tmp_path / f"e-{k}.bin", 1_000, 4)
    _write(tmp_path, "e-other.bin", 100, t + 10)         # another process's, not bound here
    (tmp_path / "e-0.bin").unlink()                      # another process deleted it
    keep = _write(tmp_path, "e-3.bin", 100, t + 20)
    _store.bound(tmp_path, "e-", keep, 1_000, 4)
    assert sorted(p.name for p in tmp_path.glob("e-*.bin")) == [
        "e-1.bin", "e-2.bin", "e-3.bin", "e-other.bin"]
    keep = _write(tmp_path, "e-4.bin", 100, t + 30)
    _store.bound(tmp_path, "e-", keep, 1_000, 4)         # five: the oldest goes
    assert sorted(p.name for p in tmp_path.glob("e-*.bin")) == [
        "e-2.bin", "e-3.bin", "e-4.bin", "e-other.bin"]


def test_a_rewritten_entry_is_stat_ed_again(tmp_path):
    t = 10 ** 18
    a = _write(tmp_path, "e-a.bin", 100, t)
    _store.bound(tmp_path, "e-", a, 1_000, 10)
    b = _write(tmp_path, "e-b.bin", 100, t + 1)
    _store.bound(tmp_path, "e-", b, 1_000, 10)
    b = _write(tmp_path, "e-b.bin", 950, t + 2)          # the same name, larger
    _store.bound(tmp_path, "e-", b, 1_000, 10)
    assert not a.exists() and b.exists()


@pytest.mark.parametrize("seed", range(6))
def test_random_writes_delete_what_a_full_scan_deletes(tmp_path, seed):
    rng = random.Random(seed)
    max_bytes, max_files = rng.choice([(600, 5), (10_000, 4), (450, 100)])
    t, names = 10 ** 18, []
    for step in range(40):
        t += 1_000
        if names and rng.random() < 0.2:                 # a hit marks an entry used
            p = tmp_path / rng.choice(names)
            if p.exists():
                os.utime(p, ns=(t, t))
            continue
        stamp = rng.choice(["aa", "bb"])
        name = f"e-{stamp}-{step}.bin"
        if rng.random() < 0.15:                          # another process's write: no bound
            _write(tmp_path, name, rng.randint(1, 200), t)
            continue
        keep = _write(tmp_path, name, rng.randint(1, 200), t)
        names.append(name)
        want = _reference(tmp_path, "e-", keep, max_bytes, max_files, "e-bb-")
        before = {p.name for p in tmp_path.glob("e-*.bin")}
        _store.bound(tmp_path, "e-", keep, max_bytes, max_files, current="e-bb-")
        after = {p.name for p in tmp_path.glob("e-*.bin")}
        assert before - after == want, step
        assert keep.exists()


def test_other_prefixes_and_files_are_left_alone(tmp_path):
    keep = _write(tmp_path, "e-1.bin", 500)
    other = _write(tmp_path, "f-1.bin", 5_000)
    note = _write(tmp_path, "e-note.json", 5_000)
    _write(tmp_path, "e-0.bin", 500, 10 ** 18)
    _store.bound(tmp_path, "e-", keep, 600, 10)
    assert keep.exists() and other.exists() and note.exists()
    assert not (tmp_path / "e-0.bin").exists()


def test_a_missing_folder_is_no_error(tmp_path):
    _store.bound(tmp_path / "none", "e-", tmp_path / "none" / "e-1.bin", 1, 1)
