"""Per-pattern objects kept on disk between processes: R's layout and the
schedule's plan (CPU only; temporary folders, never the user's)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scipy_gpuqr import _store
from scipy_gpuqr._engine.gpu import rlayout, rlayout_store
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    monkeypatch.setattr(rlayout, "write_behind", lambda fn, *a: fn(*a))   # at once
    rlayout.clear_r_layout_cache()
    yield tmp_path
    rlayout.clear_r_layout_cache()


def _files(d):
    return sorted(d.rglob("lay-*.bin"))


def _one(an):
    return [(0, an.fronts.nfronts - 1)]


def _same(a, b, an):
    for k in ("indptr", "indices", "fbase", "r1_pos", "r1_nz", "qorder", "src"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype, k
        np.testing.assert_array_equal(x, y, err_msg=k)
    assert a.shape == b.shape
    assert len(a.slots_of) == len(b.slots_of)
    for x, y in zip(a.slots_of, b.slots_of):
        np.testing.assert_array_equal(x, y)
    nf = an.fronts.nfronts
    plans = [_one(an)] + ([[(0, nf // 2), (nf // 2 + 1, nf - 1)]] if nf > 3 else [])
    for p in plans:
        for (pa, ia), (pb, ib) in zip(a.stage_maps(p), b.stage_maps(p)):
            assert (pa is None) == (pb is None)
            if pa is not None:
                np.testing.assert_array_equal(pa, pb)
            assert ia.dtype == ib.dtype
            np.testing.assert_array_equal(ia, ib)


@pytest.mark.parametrize("A", [
    grid3d_least_squares(8),
    chessboard_boundary(4, 5, 2),
    random_least_squares(500, 120, density=0.03, dense_rows=2, duplicate_cols=5, seed=4),
], ids=["grid8", "ch4-5-2", "rand-dup"])
def test_cleared_tables_load_the_stored_layout(store_dir, A, monkeypatch):
    an = analyze(A)
    built = rlayout.r_layout(an)
    assert not _files(store_dir)                    # written once the one-stage map is made
    built.stage_maps(_one(an))
    path, = _files(store_dir)
    rlayout.clear_r_layout_cache()
    monkeypatch.setattr(rlayout, "_build", lambda an: pytest.fail("built again"))
    got = rlayout.r_layout(analyze(A))
    assert got._segs is None and got._src is None   # from the file
    assert not got.indices.flags.writeable
    monkeypatch.undo()
    monkeypatch.setenv(_store.ENV, str(store_dir))
    ref = rlayout.r_layout(an, cache=False)
    _same(ref, got, an)
    ind, ptr = got.pattern_copy()
    assert ind.flags.writeable and ptr.flags.writeable


@pytest.mark.parametrize("damage", ["flip", "truncate", "stamp"])
def test_damaged_or_stale_layout_is_rebuilt(store_dir, monkeypatch, damage):
    A = grid3d_least_squares(7)
    an = analyze(A)
    rlayout.r_layout(an).stage_maps(_one(an))
    path, = _files(store_dir)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-40] ^= 0x10
    elif damage == "truncate":
        data = data[:len(data) - 100]
    path.write_bytes(bytes(data))
    if damage == "stamp":
        monkeypatch.setattr(rlayout_store, "_stamp", lambda: "another-stamp-000")
    rlayout.clear_r_layout_cache()
    calls = []
    real = rlayout._build
    monkeypatch.setattr(rlayout, "_build", lambda a: calls.append(1) or real(a))
    lay = rlayout.r_layout(analyze(A))
    assert calls == [1]                             # rebuilt
    lay.stage_maps(_one(an))                        # and written again
    rlayout.clear_r_layout_cache()
    again = rlayout.r_layout(analyze(A))
    assert calls == [1]                             # the rewritten file is good
    _same(rlayout.r_layout(an, cache=False), again, an)


def test_file_of_another_analysis_is_never_used(store_dir, monkeypatch):
    fixed = store_dir / "rlayouts" / "lay-same.bin"
    monkeypatch.setattr(rlayout_store, "slot", lambda an: fixed)   # every key collides
    a = analyze(grid3d_least_squares(6))
    b = analyze(chessboard_boundary(4, 5, 2))
    rlayout.r_layout(a).stage_maps(_one(a))
    assert fixed.exists()
    lb = rlayout.r_layout(b)
    assert lb._segs is not None or lb._src is not None     # built, not a's file
    _same(rlayout.r_layout(b, cache=False), lb, b)


def test_off_or_keyless_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(rlayout, "write_behind", lambda fn, *a: fn(*a))
    monkeypatch.setenv(_store.ENV, "off")
    an = analyze(grid3d_least_squares(6))
    rlayout.clear_r_layout_cache()
    rlayout.r_layout(an).stage_maps(_one(an))
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    rlayout.clear_r_layout_cache()
    kl = analyze(grid3d_least_squares(6), cache=False)
    assert kl.pattern_key is None
    rlayout.r_layout(kl).stage_maps(_one(kl))
    assert not list(tmp_path.rglob("lay-*.bin"))
    rlayout.clear_r_layout_cache()


_CHILD = r"""
import json, sys, hashlib
import numpy as np
from scipy_gpuqr import _store
from scipy_gpuqr._schedule import sparse
from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
from scipy_gpuqr._engine.gpu import rlayout
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
second = sys.argv[1] == "second"
if second:
    def no(*a, **k):
        raise AssertionError("built in the second process")
    sparse._build = no
    rlayout._build = no
an = analyze(grid3d_least_squares(9))
s = sparse.build_schedule(an, lazy=True, dense_flops=DEFAULT_DENSE_FLOPS)
lay = rlayout.r_layout(an)
maps = lay.stage_maps([st.fronts for st in s.stages])
h = hashlib.sha1()
for a in (lay.indptr, lay.indices, maps[0][1], lay.qorder, lay.src):
    h.update(np.ascontiguousarray(a).tobytes())
h.update(sparse.schedule_digest(s.materialize()).encode())
_store.flush()
print(json.dumps({"digest": h.hexdigest(), "disk": lay._r1_src is not None,
                  "stages": len(s.stages)}))
"""


def test_new_process_loads_schedule_and_layout(tmp_path):
    env = dict(os.environ, SCIPY_GPUQR_SCHEDULE_CACHE=str(tmp_path),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = []
    for which in ("first", "second"):
        r = subprocess.run([sys.executable, "-c", _CHILD, which], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert out[0]["stages"] == 1
    assert not out[0]["disk"] and out[1]["disk"]
    assert out[0]["digest"] == out[1]["digest"]
    assert list(tmp_path.rglob("plan-*.bin")) and list(tmp_path.rglob("lay-*.bin"))
