"""A new process's first factorization of a pattern reads and checks only its own stored files.

Every per-pattern store (analysis, plan, R's layout, ``Q``'s replay plan) names a
file by the pattern's key; a large pattern stored beside it must cost a small
pattern's first call nothing: no file of the large one mapped or read whole,
no CRC over more bytes than the small pattern's own files hold. (The tile
schedules' segments are shared by every pattern: their keys are read once per
process and their rows by the byte ranges a look-up hits, not through the
whole-file readers counted here.) CPU only: the NumPy device layer, temporary
folders, never the user's.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import _store
from scipy_gpuqr._engine.gpu import rlayout
from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import DEFAULT_BUNDLE, DEFAULT_TILE, gpu_factorize
from scipy_gpuqr._schedule import cache as schedule_store
from scipy_gpuqr._schedule.sparse import clear_schedule_cache
from scipy_gpuqr._symbolic import analysis_cache, analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares, random_values


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(_store.ENV, str(tmp_path))
    _forget()
    yield tmp_path
    _forget()


def _forget():
    """A new process's memory: only the disk is left."""
    _store.flush()
    clear_schedule_cache()
    rlayout.clear_r_layout_cache()
    analysis_cache.clear()
    schedule_store.forget()


def _first_call(A):
    """A pattern's factorization and its first ``Qᵀ`` plan, the writes behind it done."""
    g = gpu_factorize(A, analyze(A), device=NumpyDevice(DEFAULT_TILE, DEFAULT_BUNDLE))
    gs.plan_of(g)
    _store.flush()
    return g


def _entries(d):
    """The per-pattern entry files of the store (the shared segments and the
    record of source stamps aside)."""
    return {p for p in d.rglob("*.bin") if not p.name.startswith("seg-")}


def test_small_pattern_reads_only_its_own_files(store_dir, monkeypatch):
    rng = np.random.default_rng(3)
    large = sp.csc_array(random_values(grid3d_least_squares(9), rng))
    small = sp.csc_array(random_values(grid3d_least_squares(4), rng))
    _first_call(large)
    large_files = _entries(store_dir)
    _first_call(small)
    small_files = _entries(store_dir) - large_files
    kinds = {p.parent.name for p in large_files}
    assert {"rlayouts", "replays", "plans"} <= kinds       # the large pattern is stored
    assert {p.parent.name for p in small_files} >= {"rlayouts", "replays", "plans"}
    _forget()

    read, checked = [], []
    real_crc = _store.crc32

    def reader(real):
        def read_whole(path, **kw):
            out = real(path, **kw)
            if out is not None:                 # a file there (a missing one costs a stat)
                read.append(path)
            return out
        return read_whole
    monkeypatch.setattr(_store, "read_mapped", reader(_store.read_mapped))
    monkeypatch.setattr(_store, "crc32",
                        lambda data: checked.append(memoryview(data).nbytes) or real_crc(data))
    _first_call(small)

    assert read                                             # its own entries were used
    assert set(read) <= small_files, sorted(p.name for p in set(read) - small_files)
    assert sum(checked) <= sum(p.stat().st_size for p in small_files)
    assert sum(p.stat().st_size for p in large_files) > 4 * sum(checked)
