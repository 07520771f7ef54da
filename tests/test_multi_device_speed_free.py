"""A mapping by new device speeds reuses what every speed shares (issue 21), without a GPU.

A multi-device call by measured speeds maps again each time the remembered speeds
move. The split fronts' weights and the time model's own mapping take no speeds:
they are made once per pattern and device count (``devices._speed_free``), so such
a call's host set-up before its devices' threads start is the speed-dependent part
alone. The plans are those of a mapping made from nothing, and the makespan loops
give what the plain loops give.
"""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule import devices
from scipy_gpuqr._schedule.dense import DenseModel
from scipy_gpuqr._schedule.dense_split import SplitModel
from scipy_gpuqr._schedule.devices import makespan, map_devices, timed_makespan
from scipy_gpuqr._schedule.pattern_cache import PerPattern
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

from test_multi_device_host_floor import force_time_mapping


def _small_model(panel=16):
    """A split model for small fronts (NumPy layers' panel width, no least gain)."""
    return SplitModel(dense=DenseModel(panel=panel, launch_seconds=1e-3, column_seconds=0.0,
                                       panel_seconds=0.0, gemm_rate=1e9),
                      step_seconds=0.0, call_seconds=0.0, min_columns=2 * panel,
                      min_seconds=0.0, min_share=0.0)


@pytest.fixture
def counted(monkeypatch):
    """A fresh mapping table, the time mapping forced on small grids, and the calls of
    the speed-free parts (the split weights, the time model's mapping) counted."""
    force_time_mapping(monkeypatch)
    monkeypatch.setattr(devices, "_PLANS", PerPattern(16, 64 << 20, devices._plans_nbytes))
    calls = {"split_weights": 0, "_timed_owner": 0}
    for name in calls:
        orig = getattr(devices, name)

        def counting(*a, _orig=orig, _name=name, **k):
            calls[_name] += 1
            return _orig(*a, **k)
        monkeypatch.setattr(devices, name, counting)
    return calls


def _same_plan(a, b):
    assert (a.weight, a.ndevices, a.upper_device) == (b.weight, b.ndevices, b.upper_device)
    for name in ("owner", "upper", "stage_device", "device_flops", "device_bytes",
                 "stage_need"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.stages == b.stages and a.transfers == b.transfers
    assert sorted(a.split) == sorted(b.split)
    assert a.seconds == b.seconds and a.makespan == b.makespan


@pytest.mark.parametrize("time_wins", [True, False])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_new_speeds_map_without_the_speed_free_part(counted, monkeypatch, k, time_wins):
    """Grid 9³: the first mapping makes the split weights and the time model's mapping
    once; mappings by new speeds (and a new analysis of the pattern) make neither, and
    equal the mappings made from nothing (``cache=False``), whether the time model's
    mapping or one by the speeds is taken."""
    if not time_wins:
        monkeypatch.setattr(devices, "TIMED_MAPPING_GAIN", np.inf)
    A = grid3d_least_squares(9)
    an = analyze(A)
    model = _small_model()
    first = map_devices(an, k, split_model=model)
    assert first.split
    assert counted == {"split_weights": 1, "_timed_owner": 1}
    rng = np.random.default_rng(k)
    for i in range(1, 4):
        speeds = tuple(np.clip(1.0 + 0.3 * rng.standard_normal(k), 0.3, 3.0))
        got = map_devices(analyze(A), k, split_model=model, speeds=speeds)
        assert (got.weight == "time") == time_wins
        assert counted == {"split_weights": i, "_timed_owner": i}
        # from nothing: its own speed-free part
        _same_plan(got, map_devices(an, k, split_model=model, speeds=speeds, cache=False))
        assert counted == {"split_weights": i + 1, "_timed_owner": i + 1}


def test_no_split_model_or_one_device_makes_no_speed_free_part(counted):
    """Without a split model, or on one device, nothing speed-free is made or kept."""
    an = analyze(grid3d_least_squares(9))
    map_devices(an, 3)
    map_devices(an, 1, split_model=_small_model())
    assert counted == {"split_weights": 0, "_timed_owner": 0}
    assert not [k for k in devices._PLANS._lru if k[1][0] == "speed-free"]


def test_cache_false_keeps_nothing(counted):
    an = analyze(grid3d_least_squares(9))
    map_devices(an, 2, split_model=_small_model(), speeds=(1.2, 0.8), cache=False)
    assert len(devices._PLANS) == 0


def _plain_makespan(parent, flops, owner, speeds=None, unscaled=()):
    """:func:`makespan` as a plain loop of max() (its definition)."""
    par = np.asarray(parent, dtype=np.int64).tolist()
    own = np.asarray(owner, dtype=np.int64)
    fl = np.asarray(flops, dtype=np.float64)
    if speeds is not None:
        sp = np.asarray(speeds, dtype=np.float64)
        keep = np.asarray(sorted(unscaled), dtype=np.int64)
        fixed = fl[keep]
        fl = fl / (sp / sp.mean())[own]
        fl[keep] = fixed
    ready, free, end = [0.0] * len(par), {}, 0.0
    for f, p in enumerate(par):
        d = int(own[f])
        t = max(free.get(d, 0.0), ready[f]) + float(fl[f])
        free[d] = t
        end = max(end, t)
        if p >= 0 and t > ready[p]:
            ready[p] = t
    return end


def _plain_timed(parent, owner, seconds, split_seconds=None, speeds=None):
    """:func:`timed_makespan` as a plain loop of max() (its definition)."""
    par = np.asarray(parent, dtype=np.int64).tolist()
    own = np.asarray(owner, dtype=np.int64)
    t = np.asarray(seconds, dtype=np.float64)
    if speeds is not None:
        sp = np.asarray(speeds, dtype=np.float64)
        t = t / (sp / sp.mean())[own]
    split = dict(split_seconds or {})
    ndev = int(own.max(initial=0)) + 1
    free, ready = [0.0] * ndev, [0.0] * len(par)
    for f, p in enumerate(par):
        d = int(own[f])
        if f in split:
            e = max(ready[f], max(free)) + float(split[f])
            free = [e] * ndev
        else:
            e = max(free[d], ready[f]) + float(t[f])
            free[d] = e
        if p >= 0 and e > ready[p]:
            ready[p] = e
    return max(free, default=0.0)


@pytest.mark.parametrize("seed", range(6))
def test_makespans_equal_the_plain_loops(seed):
    """Random postorder trees, owners (some devices without fronts), zero weights,
    speeds, unscaled and split fronts: the same floats as the plain loops."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    parent = np.array([int(rng.integers(f + 1, n)) if f < n - 1 and rng.random() < 0.95
                       else -1 for f in range(n)])
    ndev = int(rng.integers(1, 5))
    owner = rng.integers(0, ndev, n)
    w = rng.random(n) * (rng.random(n) < 0.9)
    speeds = None if seed % 3 == 0 else rng.random(ndev) + 0.5
    some = rng.choice(n, size=min(n, 5), replace=False).tolist()
    assert makespan(parent, w, owner) == _plain_makespan(parent, w, owner)
    assert (makespan(parent, w, owner, speeds, some)
            == _plain_makespan(parent, w, owner, speeds, some))
    split = {f: float(rng.random()) for f in some}
    assert (timed_makespan(parent, owner, w, split, speeds)
            == _plain_timed(parent, owner, w, split, speeds))
    assert timed_makespan(parent, owner, w) == _plain_timed(parent, owner, w)


def test_empty_tree_makespans():
    empty = np.zeros(0, dtype=np.int64)
    assert makespan(empty, np.zeros(0), empty) == 0.0
    assert timed_makespan(empty, empty, np.zeros(0)) == 0.0


def test_calls_by_new_speeds_run_as_from_nothing(counted):
    """Grid 7³ over two NumPy layers, time mapping forced: a call by new given speeds
    maps without the speed-free part and its R is the first call's (one plan)."""
    A = grid3d_least_squares(7)
    A.data = np.random.default_rng(2).standard_normal(A.nnz)
    an = analyze(A)
    model = _small_model()

    def call(speeds):
        return multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                                   dense_flops=1e30, split_dense=None, split_model=model,
                                   device_speeds=speeds)
    a = call(None)
    made = dict(counted)
    b = call((1.05, 0.95))
    assert counted == made
    assert b.info["devices"]["mapping"]["by"] == "given speeds"
    assert np.array_equal(a.R.indptr, b.R.indptr)
    assert np.array_equal(a.R.data, b.R.data)
