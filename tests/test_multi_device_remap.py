"""A pattern's calls by measured speeds keep their plan unless the time model predicts
the plan mapped by new speeds clearly shorter (devices.speeds_to_map_by), without a GPU:
NumPy device layers and the mapping functions."""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import multi_device as md
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._schedule import devices, sparse
from scipy_gpuqr._schedule.devices import (REMAP_GAIN, map_devices, modelled_seconds,
                                           remember_mapping_seconds, remember_speeds,
                                           remembered_speeds, speeds_to_map_by)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

from test_multi_device_host_floor import _small_model


@pytest.fixture
def calls(monkeypatch):
    """Grid 9³ over two NumPy layers, the calls' own (host-timed) speeds not
    remembered and their seconds sending no mapping back to flops: what the next
    call weighs is what the test remembers. Yields (A, analysis, device set key,
    call, schedules made so far)."""
    monkeypatch.setattr(md, "measured_speeds", lambda qr: None)
    monkeypatch.setattr(devices, "MAPPING_SLOWER", np.inf)
    made = []
    put = sparse._cache_put

    def counted(analysis, key, sched):
        made.append(key)
        return put(analysis, key, sched)
    monkeypatch.setattr(sparse, "_cache_put", counted)
    A = grid3d_least_squares(9)
    A.data = np.random.default_rng(3).standard_normal(A.nnz)
    an = analyze(A, cache=False)            # its own table entries
    key = md.speeds_key([NumpyDevice(32, 3)] * 2, np.float64)

    def call(**kw):
        return multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)], **kw)
    yield A, an, key, call, made


def _subtrees(qr):
    return [d["subtree_flops"] for d in qr.info["devices"]["per_device"]]


def test_speeds_within_the_noise_keep_the_plan(calls, monkeypatch):
    """New remembered speeds whose plan the model predicts less than REMAP_GAIN
    shorter: the call keeps the flops plan of the first call (no schedule built,
    R bit for bit), and info says which speeds it was made with and why it was kept;
    the next call does not weigh the same speeds again."""
    monkeypatch.setattr(devices, "REMAP_SECONDS", 0.0)      # the fraction decides
    A, an, key, call, made = calls
    first = call()
    mp = first.info["devices"]["mapping"]
    assert mp["by"] == "flops" and mp["decision"] is None
    kept = remember_speeds(an, key, [0.97, 1.03])
    old, new = map_devices(an, 2), map_devices(an, 2, speeds=kept)
    t_old, t_new = modelled_seconds(an, old, kept), modelled_seconds(an, new, kept)
    assert not np.array_equal(old.owner, new.owner)         # a new plan was possible
    assert t_new > (1 - REMAP_GAIN) * t_old                 # but models no clear gain
    n = len(made)
    second = call()
    mp = second.info["devices"]["mapping"]
    assert mp["by"] == "flops" and mp["speeds"] is None
    assert mp["remembered"] == pytest.approx(kept)
    d = mp["decision"]
    assert d["remapped"] is False and d["current"] is None and d["same_plan"] is False
    assert d["candidate"] == pytest.approx(kept)
    assert d["modelled_seconds"] == pytest.approx([t_old, t_new])
    assert len(made) == n                                   # no new schedule
    assert _subtrees(second) == _subtrees(first)
    assert np.array_equal(second.R.data, first.R.data)
    weighed = []
    monkeypatch.setattr(devices, "map_devices",
                        lambda *a, **k: weighed.append(k) or map_devices(*a, **k))
    third = call()
    assert third.info["devices"]["mapping"]["decision"] == d
    assert third.info["devices"]["mapping"]["by"] == "flops" and not weighed
    assert len(made) == n


def test_a_lasting_large_change_remaps(calls, monkeypatch):
    """Device 0 twice as slow, remembered: the plan mapped by those speeds models
    clearly shorter, so the next call maps by them (a new schedule), with the one
    answer; the call after finds the plan it made (nothing weighed or built)."""
    monkeypatch.setattr(devices, "REMAP_SECONDS", 0.0)      # a tiny grid's seconds
    A, an, key, call, made = calls
    first = call()
    for _ in range(10):
        kept = remember_speeds(an, key, [2 / 3, 4 / 3])
    n = len(made)
    second = call()
    mp = second.info["devices"]["mapping"]
    assert mp["by"] == "measured speeds" and mp["speeds"] == pytest.approx(kept)
    d = mp["decision"]
    assert d["remapped"] is True and d["current"] is None
    t_old, t_new = d["modelled_seconds"]
    assert t_new <= (1 - REMAP_GAIN) * t_old
    assert _subtrees(second) == pytest.approx(
        map_devices(an, 2, speeds=kept).subtree_flops.tolist())
    assert _subtrees(second)[1] > _subtrees(first)[1]
    assert len(made) == n + 1
    assert abs(second.R - first.R).max() <= 1e-12 * max(abs(first.R).max(), 1.0)
    third = call()
    mp = third.info["devices"]["mapping"]
    assert mp["by"] == "measured speeds" and mp["decision"] is None
    assert mp["speeds"] == pytest.approx(kept)
    assert len(made) == n + 1
    assert np.array_equal(third.R.data, second.R.data)


def test_a_tiny_pattern_keeps_its_plan(calls):
    """The same large change on a pattern whose whole modelled time is far below
    REMAP_SECONDS: nothing a new plan gains pays for it, the flops plan stays."""
    A, an, key, call, made = calls
    call()
    for _ in range(10):
        remember_speeds(an, key, [2 / 3, 4 / 3])
    mp = call().info["devices"]["mapping"]
    assert mp["by"] == "flops" and mp["decision"]["remapped"] is False
    assert max(mp["decision"]["modelled_seconds"]) < devices.REMAP_SECONDS


def test_speeds_to_map_by_weighs_each_new_speeds_once(monkeypatch):
    """speeds_to_map_by alone: nothing remembered, flops; new speeds weighed once
    (two mappings), then found; a plan kept stays until the speeds change again;
    a measured mapping that ran slower sends the device set back to flops."""
    monkeypatch.setattr(devices, "REMAP_SECONDS", 0.0)
    an = analyze(grid3d_least_squares(8), cache=False)
    key = ("remap", 2)
    weighed = []
    real = devices.map_devices
    monkeypatch.setattr(devices, "map_devices",
                        lambda *a, **k: weighed.append(k.get("speeds")) or real(*a, **k))
    assert speeds_to_map_by(an, key, 2) == (None, None)
    for _ in range(10):
        kept = remember_speeds(an, key, [0.5, 1.5])
    speeds, d = speeds_to_map_by(an, key, 2)
    assert speeds == kept and d["remapped"] and len(weighed) == 2
    assert speeds_to_map_by(an, key, 2) == (kept, None) and len(weighed) == 2
    monkeypatch.setattr(devices, "REMAP_GAIN", 1.0)         # nothing pays from now on
    for _ in range(10):
        other = remember_speeds(an, key, [1.5, 0.5])
    assert remembered_speeds(an, key) == other != kept
    speeds, d = speeds_to_map_by(an, key, 2)
    assert speeds == kept and d["remapped"] is False
    assert d["current"] == pytest.approx(kept) and d["candidate"] == pytest.approx(other)
    assert len(weighed) == 4
    assert speeds_to_map_by(an, key, 2) == (kept, d) and len(weighed) == 4
    remember_mapping_seconds(an, key, "flops", 1.0)
    remember_mapping_seconds(an, key, "measured speeds", 2.0)
    speeds, d = speeds_to_map_by(an, key, 2)
    assert speeds is None and d == {"remapped": False, "why": "measured mapping lost"}
    assert speeds_to_map_by(an, key, 3) == (None, None)     # other device counts


def test_modelled_seconds_with_a_split_model():
    """modelled_seconds: a split model's plans by the time model (their split fronts
    at their split seconds), given speeds; without one, the flops makespan at
    SUBTREE_RATE; equal speeds are none."""
    an = analyze(grid3d_least_squares(12), cache=False)
    model = _small_model()
    plan = map_devices(an, 2, split_model=model)
    free = devices._speed_free(an, 2, 0, model, 8, devices.TimeModel())
    want = devices.timed_makespan(an.fronts.parent, plan.owner, free.seconds,
                                  {f: free.split_seconds[f] for f in plan.split}, (0.8, 1.2))
    assert modelled_seconds(an, plan, (0.8, 1.2), split_model=model) == pytest.approx(want)
    assert modelled_seconds(an, plan, (1.0, 1.0), split_model=model) == pytest.approx(
        modelled_seconds(an, plan, split_model=model))
    flat = map_devices(an, 2)
    assert modelled_seconds(an, flat, (0.8, 1.2)) == pytest.approx(
        devices.makespan(an.fronts.parent, an.front_flops, flat.owner, (0.8, 1.2))
        / devices.SUBTREE_RATE)
