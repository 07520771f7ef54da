"""The interpreter's switch interval while the devices' threads run, and each device
thread's steps in ``info`` (CPU: NumPy device layers)."""

import sys

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import multi_device as md
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import (EVENT_KINDS, interpreter_switch,
                                                  multi_gpu_factorize)
from scipy_gpuqr._schedule.devices import map_devices
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares


@pytest.fixture
def process_interval():
    """The process' switch interval, put back after the test whatever it did."""
    old = sys.getswitchinterval()
    yield old
    sys.setswitchinterval(old)


def _as_set(seconds) -> float:
    """What the interpreter keeps of an interval (it rounds to its own resolution)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    out = sys.getswitchinterval()
    sys.setswitchinterval(old)
    return out


class _Watching(NumpyDevice):
    """A NumPy layer that notes the switch interval at each of its launches."""

    def __init__(self, *a, fail=False, **k):
        super().__init__(*a, **k)
        self.seen, self.fail = [], fail

    def launch(self, h, L, records):
        self.seen.append(sys.getswitchinterval())
        if self.fail:
            raise RuntimeError("test: this layer fails")
        return super().launch(h, L, records)


def test_interpreter_switch_sets_and_puts_back(process_interval):
    sys.setswitchinterval(0.007)
    base = sys.getswitchinterval()
    with interpreter_switch(3e-4):
        assert sys.getswitchinterval() == _as_set(3e-4) != base
    assert sys.getswitchinterval() == base
    with interpreter_switch(None):
        assert sys.getswitchinterval() == base
    with pytest.raises(KeyError):            # put back after an error too
        with interpreter_switch(2e-4):
            raise KeyError("x")
    assert sys.getswitchinterval() == base
    # changed by someone else meanwhile: left as they set it
    with interpreter_switch(2e-4):
        sys.setswitchinterval(0.003)
    assert sys.getswitchinterval() == _as_set(0.003)
    for bad in (0, -1e-3):
        with pytest.raises(ValueError):
            with interpreter_switch(bad):
                pass


def test_devices_run_under_the_switch_interval(process_interval, monkeypatch):
    """Every launch of every device's thread runs under the call's interval; the
    process' comes back after the call (and after a failed one); 'default' takes
    SWITCH_INTERVAL, None the process' own; the answer is the one device's."""
    sys.setswitchinterval(0.006)
    base = sys.getswitchinterval()
    A = grid3d_least_squares(7)
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    for asked, expect in ((3e-4, _as_set(3e-4)), (None, base), ("default", _as_set(4e-4))):
        monkeypatch.setattr(md, "SWITCH_INTERVAL", 4e-4)
        layers = [_Watching(32, 3) for _ in range(3)]
        many = multi_gpu_factorize(A, an, layers=layers, switch_interval=asked)
        seen = [x for layer in layers for x in layer.seen]
        assert seen and all(x == expect for x in seen), asked
        assert sys.getswitchinterval() == base
        assert many.info["switch_interval"] == (4e-4 if asked == "default" else asked)
        scale = max(abs(one.R).max(), 1.0)
        assert abs(many.R - one.R).max() <= 1e-13 * scale
    # without the argument: the module's default, shorter than the process' 5 ms
    monkeypatch.setattr(md, "SWITCH_INTERVAL", 2.5e-4)
    layers = [_Watching(32, 3) for _ in range(2)]
    multi_gpu_factorize(A, an, layers=layers)
    assert {x for layer in layers for x in layer.seen} == {_as_set(2.5e-4)}
    monkeypatch.undo()
    assert 0 < md.SWITCH_INTERVAL < 0.005
    # a device's thread fails: the call raises, the interval is the process' again
    plan = map_devices(an, 3)
    layers = [_Watching(32, 3, fail=(i == int(plan.stage_device[0]))) for i in range(3)]
    with pytest.raises(RuntimeError, match="this layer fails"):
        multi_gpu_factorize(A, an, layers=layers, devices=plan, switch_interval=3e-4)
    assert sys.getswitchinterval() == base
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="switch_interval"):
            multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                                switch_interval=bad)
    assert sys.getswitchinterval() == base


@pytest.mark.parametrize("k", [2, 4])
def test_device_threads_steps(k):
    """Each device's ``events``: its stages once each, in its order, one after the
    other within its enqueueing; a stage's set-up and cut within it; a wait for
    every block carried into its stages (those from other devices among them);
    a split step for every front split over the devices."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    layers = [NumpyDevice(32, 3) for _ in range(k)]
    for layer in layers:            # panels narrow enough for the upper fronts to split
        layer.dense_panel = 16
    many = multi_gpu_factorize(A, an, layers=layers, dense_flops=2e5, split_dense=True)
    info = many.info
    plan_stages = [int(s) for s in range(info["stages"])]
    per = info["devices"]["devices"]
    total = info["seconds"]["total"]
    sched = many.schedule
    split = [e["front"] for e in info["split_fronts"] if "fallback" not in e]
    assert split, "the test needs a split front"
    seen_split, seen_stages = [], []
    into = {}
    for c, src, dst, nbytes in info["transfers"]:
        into.setdefault(dst, set()).add(c)
    for d, dev in enumerate(per):
        ev = dev["events"]
        assert ev and {e[0] for e in ev} <= set(EVENT_KINDS)
        start, enqueued, _ = dev["timeline_seconds"]
        for kind, i, a, b in ev:
            assert 0 <= start - 1e-9 <= a <= b <= enqueued + 1e-9 <= total + 1e-9, (kind, i)
        stages = [e for e in ev if e[0] == "stage"]
        assert len(stages) == dev["stages"]
        assert all(s1[3] <= s2[2] for s1, s2 in zip(stages, stages[1:]))
        seen_stages += [e[1] for e in stages]
        for kind in ("begin", "cut"):
            mine = [e for e in ev if e[0] == kind]
            assert [e[1] for e in mine] == [e[1] for e in stages]
            for e, s in zip(mine, stages):
                assert s[2] <= e[2] <= e[3] <= s[3]
        waits = {e[1] for e in ev if e[0] == "wait"}
        carried = {int(c) for s in (e[1] for e in stages)
                   for c in sched.stages[s].carried
                   if int(an.fronts.cm[c]) > 0 and int(an.fronts.fn[c]) > int(an.fronts.fp[c])}
        assert waits == carried and into.get(d, set()) <= waits
        seen_split += [e[1] for e in ev if e[0] == "split"]
    assert sorted(seen_stages) == plan_stages
    assert sorted(seen_split) == sorted(split)
    assert np.all([e[0] != "dense" or e[1] not in split for dev in per for e in dev["events"]])
