"""Dense fronts of the upper tree split over several devices, without a GPU.

The steps of :func:`scipy_gpuqr._engine.split_front.run_split` over the
NumPy backend (simulated devices: each owns its columns, the transfers are
copies) give the one-device dense path's front and ``T`` bit for bit; the
multi-GPU driver over NumPy device layers with split fronts gives the
one-device answer; the model and the rule
(:mod:`scipy_gpuqr._schedule.dense_split`) behave as documented.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from scipy_gpuqr._engine.dense_front import factorize_numpy, panels_of
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
from scipy_gpuqr._engine.split_front import (RING, NumpySplit, block_rows, run_split,
                                             split_factorize_numpy, split_steps)
from scipy_gpuqr._schedule.dense import DenseModel, dense_path_seconds
from scipy_gpuqr._schedule.dense_split import block_rows as block_rows_model
from scipy_gpuqr._schedule.dense_split import (SplitModel, block_owners, split_plan,
                                               split_rule, split_seconds)
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

from test_multi_device import _same_answer


def _front(rng, fm, fn):
    """A staircase front: column c nonzero in its first stair[c] rows."""
    F = rng.standard_normal((fm, fn))
    lead = np.sort(rng.integers(0, fm, fm))          # each row's first column
    lead[:min(fm, fn)] = np.minimum(lead[:min(fm, fn)], np.arange(min(fm, fn)))
    lead = np.sort(lead)
    stair = np.searchsorted(lead, np.arange(fn), side="right")
    for c in range(fn):
        F[stair[c]:, c] = 0.0
    return F, stair


@pytest.mark.parametrize("fm, fn, nb, k", [(300, 200, 16, 2), (150, 260, 16, 3),
                                           (500, 120, 32, 4), (40, 40, 16, 2),
                                           (64, 300, 16, 2), (90, 90, 8, 5)])
@pytest.mark.parametrize("how", ["model", "cyclic", "last"])
def test_split_steps_equal_one_device(fm, fn, nb, k, how):
    rng = np.random.default_rng(fm + fn + k)
    F, stair = _front(rng, fm, fn)
    panels = panels_of(fm, fn, stair, nb)
    F1 = F.copy()
    T1 = factorize_numpy(F1, panels, nb)
    nblk = -(-fn // nb)
    if how == "model":
        owners = block_owners(fm, fn, stair, k,
                              SplitModel(dense=DenseModel(panel=nb), min_columns=1))
    elif how == "cyclic":
        owners = np.array([0, 0] + [c % k for c in range(2, nblk)][:max(nblk - 2, 0)])[:nblk]
    else:                                   # every block past the first two on the last device
        owners = np.array([0, 0] + [k - 1] * max(nblk - 2, 0))[:nblk]
    assert len(owners) == nblk
    F2 = F.copy()
    T2, log = split_factorize_numpy(F2, panels, nb, owners)
    assert np.array_equal(F1, F2)
    assert np.array_equal(T1, T2)
    # every block of another device went out once and came back once
    others = [c for c in range(nblk) if owners[c] != 0]
    assert sorted(c for what, _, c, _ in log if what == "back") == others
    # the rows each block needs, the same as the schedule's count
    need = block_rows(panels, nblk)
    assert np.array_equal(need, block_rows_model(fm, fn, stair, nb))
    assert sum(n for what, _, _, n in log if what == "blocks") == sum(
        int(need[c]) * (min(fn, (c + 1) * nb) - c * nb) for c in others)


def test_run_split_checks_owners():
    F = np.zeros((8, 40))
    panels = panels_of(8, 40, None, 8)
    be = NumpySplit(F, panels, 8, [0] * 5)
    with pytest.raises(ValueError, match="block owners"):
        run_split(be, panels, 8, 40, [0] * 4)
    with pytest.raises(ValueError, match="main device"):
        run_split(be, panels, 8, 40, [0, 1, 0, 0, 0])


def test_block_owners_and_model():
    fm, fn = 49340, 9375
    m = SplitModel()
    one = dense_path_seconds(fm, fn, None, m.dense)
    assert np.all(block_owners(fm, fn, None, 1, m) == 0)
    t = {}
    for k in (2, 3, 4):
        own = block_owners(fm, fn, None, k, m)
        assert own[0] == own[1] == 0 and set(own.tolist()) == set(range(k))
        counts = np.bincount(own, minlength=k)
        # the others share evenly; the main device, busy with the chain, holds fewest
        assert counts[1:].max() - counts[1:].min() <= 1 and counts[0] <= counts[1:].min() + 2
        t[k] = split_seconds(fm, fn, None, own, m)
    # more devices never model slower; never below the chain alone
    assert one > t[2] >= t[3] >= t[4] > 0
    rows = np.full(-(-fn // 256), fm, dtype=float)
    assert t[4] > 0.9 * np.sum(m.dense.panel_seconds + 256 * (m.dense.column_seconds
                                                               + m.dense.row_seconds * rows))
    p = split_plan(fm, fn, None, 2, m)
    assert p.seconds == pytest.approx(t[2]) and p.one_device_seconds == pytest.approx(one)
    assert p.as_dict()["blocks"] == np.bincount(p.owners).tolist()


def test_split_rule_keeps_large_fronts_only():
    an = analyze(chessboard_boundary(7, 8, 3))
    fs = an.fronts
    root = int(np.flatnonzero(fs.parent < 0)[-1])
    small = int(np.argmax(np.where(np.minimum(fs.fm, fs.fn) < 512,
                                   np.minimum(fs.fm, fs.fn), -1)))
    assert split_rule(fs, [root, small], 1) == {}
    got = split_rule(fs, [root, small], 2)
    assert list(got) == [root]              # the 49340 x 9375 root; the small one is not worth it
    sp = got[root]
    assert sp.one_device_seconds - sp.seconds >= 0.1 * sp.one_device_seconds
    # a rule asking for more than it gains keeps nothing
    assert split_rule(fs, [root], 2, min_share=0.99) == {}


def _layers(k, panel=16):
    out = [NumpyDevice(32, 3) for _ in range(k)]
    for layer in out:
        layer.dense_panel = panel
    return out


@pytest.mark.parametrize("k", [2, 3, 4])
def test_gpu_driver_split_fronts_on_numpy_layers(k):
    """The multi-GPU driver with the upper tree's dense fronts split over NumPy
    layers equals the one-device driver (the same panels: bit for bit where the
    same records ran)."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    one_layer = NumpyDevice(32, 3)
    one_layer.dense_panel = 16
    one = gpu_factorize(A, an, device=one_layer, dense_flops=2e5)
    many = multi_gpu_factorize(A, an, layers=_layers(k), dense_flops=2e5, split_dense=True)
    split = many.info["split_fronts"]
    assert split, "no dense front of the upper tree was split"
    for e in split:
        assert sum(e["blocks"]) == -(-e["shape"][1] // 16)
        assert e["blocks"][0] >= 2 and sum(b > 0 for b in e["blocks"]) >= 2
        assert e["transfers"] > 0
    assert many.info["dense_fronts"] == one.info["dense_fronts"]
    _same_answer(A, one, many)
    # and without the split: the same answer, nothing split
    plain = multi_gpu_factorize(A, an, layers=_layers(k), dense_flops=2e5, split_dense=False)
    assert plain.info["split_fronts"] == []
    _same_answer(A, plain, many)


def test_split_rule_off_for_layers_of_one_gpu_and_small_fronts():
    """By default (the rule) nothing is split where the fronts are small, and
    NumPy layers count as distinct devices."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    many = multi_gpu_factorize(A, an, layers=_layers(2), dense_flops=2e5)
    assert many.info["split_fronts"] == []


@pytest.mark.parametrize("k", [2, 4])
def test_simulated_devices_split_fronts(k):
    """The NumPy executor of simulated devices with split upper dense fronts equals
    its run without them and the one-device executor."""
    from scipy_gpuqr._engine.host.multi_device import simulate_multi_device
    from scipy_gpuqr._engine.host.simulate import simulate_factorize
    A = grid3d_least_squares(8)
    an = analyze(A)
    one = simulate_factorize(A, an, dense_flops=2e5, dense_panel=16)
    many = simulate_multi_device(A, an, devices=k, dense_flops=2e5, dense_panel=16,
                                 split_dense=True)
    assert many.info["split_fronts"]
    for f, blocks, moved in many.info["split_fronts"]:
        assert len(blocks) == k and sum(b > 0 for b in blocks) >= 2 and moved > 0
    _same_answer(A, one, many)


def test_map_devices_weighs_split_fronts_in_the_upper_tree():
    """With a split model the mapping weighs the upper tree's splittable fronts at
    their split time: ch7-8-b3's root (80 % of the flops) is split, the modelled
    speedup rises, every plan invariant holds, and its split fronts lie in the
    upper tree on the upper device."""
    from dataclasses import replace
    from scipy_gpuqr._schedule.devices import makespan, map_devices, map_fronts
    from test_multi_device import _check_plan
    an = analyze(chessboard_boundary(7, 8, 3))
    fs = an.fronts
    root = int(np.flatnonzero(fs.parent < 0)[-1])
    for k in (2, 4):
        plain = map_devices(an, k)
        split = map_devices(an, k, split_model=SplitModel())
        plain_span = makespan(fs.parent, an.front_flops, split.owner)
        _check_plan(an, replace(split, makespan=plain_span), k)
        assert split.makespan < plain_span      # the split fronts at their split weight
        assert plain.split == {} and root in split.split
        assert split.modelled_speedup > plain.modelled_speedup + 0.2
        for f in split.split:
            assert split.upper[f] and split.owner[f] == split.upper_device
        assert split.as_dict()["split_fronts"] == sorted(split.split)
    # upper weights equal to the weights change nothing
    fl = np.asarray(an.front_flops)
    a = map_fronts(fs.parent, fs.child_ptr, fs.children, fl, 3)
    b = map_fronts(fs.parent, fs.child_ptr, fs.children, fl, 3, upper_weights=fl)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_map_devices_keeps_the_mapping_on_flops_where_it_models_better():
    """The mapping with split fronts weighed at their split time may pull so much
    into the upper tree that it models longer than the mapping on flops alone
    with that mapping's own upper-tree fronts split (grid 56³ on 2 devices):
    the plan is never the worse of the two, and its invariants hold."""
    from dataclasses import replace
    from scipy_gpuqr._schedule.dense_split import split_weights
    from scipy_gpuqr._schedule.devices import makespan, map_devices, map_fronts
    from test_multi_device import _check_plan
    for A, k in [(grid3d_least_squares(56), 2), (chessboard_boundary(7, 8, 3), 2)]:
        an = analyze(A)
        fs = an.fronts
        fl = np.asarray(an.front_flops, dtype=np.float64)
        w, plans = split_weights(fs, fl, k, SplitModel())
        own, up = map_fronts(fs.parent, fs.child_ptr, fs.children, fl, k)
        eff = fl.copy()
        for f in plans:
            if up[f] and own[f] == 0:
                eff[f] = w[f]
        flat = float(fl.sum()) / makespan(fs.parent, eff, own)
        plan = map_devices(an, k, split_model=SplitModel())
        assert plan.split and plan.modelled_speedup >= flat - 1e-12
        for f in plan.split:
            assert plan.upper[f] and plan.owner[f] == plan.upper_device
        _check_plan(an, replace(plan, makespan=makespan(fs.parent, fl, plan.owner)), k)



def _same_gram(A, one, many):
    """RᵀR equal to the one-device run's up to rounding, and Q R = A P: a split
    front's rows of R may differ from one device's by signs (their reflectors'
    order), so R itself is not compared."""
    m, n = A.shape
    G1, G2 = (one.R.T @ one.R).toarray(), (many.R.T @ many.R).toarray()
    assert np.abs(G1 - G2).max() <= 1e-12 * np.abs(G1).max()
    X = np.random.default_rng(0).standard_normal((n, 2))
    Y = np.zeros((m, 2))
    Y[:n] = many.R @ X
    AP = A[:, many.colperm] @ X
    assert np.abs(many.q_matmul(Y) - AP).max() <= 1e-11 * np.abs(AP).max()


def _small_model(panel=16):
    """A split model for small fronts (CPU tests): NumPy layers' panel width, no
    least gain."""
    return SplitModel(dense=DenseModel(panel=panel, launch_seconds=1e-3, column_seconds=0.0,
                                       panel_seconds=0.0, gemm_rate=1e9),
                      step_seconds=0.0, call_seconds=0.0, min_columns=2 * panel,
                      min_seconds=0.0, min_share=0.0)


def test_gpu_driver_split_rule_on_numpy_layers():
    """The rule (split_dense=None, the default) over NumPy layers: the plan's split fronts are made
    dense fronts even where dense_flops leaves them to the tile tasks, and are
    split; the answer equals the same plan's without the split (bit for bit: the
    same dense fronts, the NumPy steps are the dense path's) and the one-device
    answer up to the signs of R's rows (dense fronts there are tile fronts here)."""
    from scipy_gpuqr._schedule.devices import map_devices
    A = grid3d_least_squares(9)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, 2, split_model=model)
    assert plan.split, "the plan splits no front"
    many = multi_gpu_factorize(A, an, layers=_layers(2), devices=plan, dense_flops=1e30,
                               split_dense=None, split_model=model)
    assert [e["front"] for e in many.info["split_fronts"]] == sorted(plan.split)
    assert many.info["dense_fronts"] == len(plan.split)         # only they are dense
    ref = multi_gpu_factorize(A, an, layers=_layers(2), devices=plan, dense_flops=1e30,
                              split_dense=False)
    assert ref.info["split_fronts"] == [] and ref.info["dense_fronts"] == len(plan.split)
    assert (ref.R != many.R).nnz == 0
    _same_answer(A, ref, many)
    # the rule maps with the model itself when no plan is given (on flops: the calls
    # above measured speeds, which the default would map this one by)
    auto = multi_gpu_factorize(A, an, layers=_layers(2), dense_flops=1e30, split_dense=None,
                               split_model=model, device_speeds=None)
    assert auto.info["devices"]["split_fronts"] == sorted(plan.split)
    one_layer = NumpyDevice(32, 3)
    one = gpu_factorize(A, an, device=one_layer, dense_flops=None)
    _same_gram(A, one, many)


def test_split_choice_needs_two_gpus_for_the_rule():
    """The rule splits only where the layers lie on more than one GPU; True splits
    every dense front of the upper tree on its device; False none."""
    from types import SimpleNamespace
    from scipy_gpuqr._engine.gpu.multi_device import split_choice
    from scipy_gpuqr._schedule.devices import map_devices
    from scipy_gpuqr._schedule.sparse import build_schedule
    an = analyze(chessboard_boundary(7, 8, 3))
    plan = map_devices(an, 2, split_model=SplitModel())
    sched = build_schedule(an, plan=plan.stage_plan(), dense_flops=-1.0,
                           dense_extra=sorted(plan.split))
    dense = {f for st in sched.stages for f in st.dense}
    assert set(plan.split) <= dense

    def layers(*ids):
        return [SimpleNamespace(device_id=i, dtype=np.float64) for i in ids]
    assert split_choice(an, plan, sched, layers(0, 0), None, SplitModel()) == {}
    two = split_choice(an, plan, sched, layers(0, 1), None, SplitModel())
    assert set(two) == set(plan.split) and two
    forced = split_choice(an, plan, sched, layers(0, 0), True, SplitModel())
    assert set(forced) >= set(two) and all(v is None for v in forced.values())
    assert split_choice(an, plan, sched, layers(0, 1), False, SplitModel()) == {}
    assert split_choice(an, plan, sched, layers(0), None, SplitModel()) == {}


@pytest.mark.parametrize("k", [2, 3, 4])
def test_block_owners_leave_a_block_to_the_others(k):
    """A front of three or more blocks always has a block on another device (the
    leading blocks kept on the main device while the others' copies arrive never
    take them all): grid 14's upper dense fronts (3 blocks of 256 columns) were
    not split at all with ``split_dense=True`` on the H200s."""
    rng = np.random.default_rng(k)
    for fm, fn in [(1051, 659), (1808, 593), (600, 600), (5000, 1100)]:
        F, stair = _front(rng, fm, fn)
        own = block_owners(fm, fn, stair, k)
        nblk = -(-fn // 256)
        assert len(own) == nblk and own[0] == own[1] == 0
        assert own.max() > 0 if nblk >= 3 else own.max() == 0


def test_forced_split_on_numpy_layers_with_the_gpu_panel():
    """``split_dense=True`` with the GPU's panel width (256) over NumPy layers: the
    upper tree's dense fronts of grid 14 (as the GPU test) are all split, and the
    answer is the one-device driver's."""
    A = grid3d_least_squares(14)
    an = analyze(A)
    one = gpu_factorize(A, an, device=NumpyDevice(32, 3), dense_flops=1e7)
    many = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                               dense_flops=1e7, split_dense=True)
    split = many.info["split_fronts"]
    assert split and all("fallback" not in e for e in split), split
    assert all(sum(b > 0 for b in e["blocks"]) == 2 for e in split)
    _same_answer(A, one, many)


# -- each device's steps on a thread of its own ------------------------------------------

def _case(fm, fn, nb, k, how, seed=0):
    rng = np.random.default_rng(fm + fn + k + seed)
    F, stair = _front(rng, fm, fn)
    panels = panels_of(fm, fn, stair, nb)
    nblk = -(-fn // nb)
    if how == "cyclic":
        owners = np.array([0, 0] + [c % k for c in range(2, nblk)])[:nblk]
    elif how == "model":
        owners = block_owners(fm, fn, stair, k,
                              SplitModel(dense=DenseModel(panel=nb), min_columns=1))
    else:                                   # the main device's blocks after the others'
        owners = np.array([0, 0] + [1 + c % (k - 1) if c < nblk - 2 else 0
                                    for c in range(2, nblk)])[:nblk]
    return F, panels, owners


class _Workers:
    """One single-thread executor per split device (``workers[0]`` unused)."""

    def __init__(self, k):
        self.ex = [None] + [ThreadPoolExecutor(1, thread_name_prefix=f"split-dev-{d}")
                            for d in range(1, k)]

    def __enter__(self):
        return self.ex

    def __exit__(self, *exc):
        for e in self.ex[1:]:
            e.shutdown(wait=True)
        return False


class _Recorded(NumpySplit):
    """NumpySplit that records each step's thread and its start and end (one clock
    for every thread), and sleeps in chosen steps (a slow device)."""

    def __init__(self, *args, slow=(), delay=0.02):
        super().__init__(*args)
        self.events, self.slow, self.delay = [], set(slow), delay
        self.clock = iter(range(10 ** 9))
        self.lock = threading.Lock()

    def _tick(self):
        with self.lock:
            return next(self.clock)


def _record(name):
    def call(self, *args):
        t0 = self._tick()
        if (name, args[0] if args else None) in self.slow or name in self.slow:
            time.sleep(self.delay)
        getattr(NumpySplit, name)(self, *args)
        self.events.append((name, args, threading.current_thread().name, t0, self._tick()))
    return call


for _n in ("setup", "send_blocks", "factor", "send_panel", "lookahead", "update", "to_main",
           "ready", "finish"):
    setattr(_Recorded, _n, _record(_n))


@pytest.mark.parametrize("fm, fn, nb, k, how", [(300, 200, 16, 2, "cyclic"),
                                                (150, 260, 16, 3, "model"),
                                                (500, 200, 16, 4, "cyclic"),
                                                (90, 90, 8, 5, "cyclic"),
                                                (400, 300, 16, 3, "main last")])
def test_split_steps_on_device_threads_equal_one_thread(fm, fn, nb, k, how):
    """Every device's steps on a thread of its own (the main device's on the calling
    thread): each step on its device's thread, each device's steps in the one-thread
    order, every step begun after the steps it needs ended (the other devices slowed
    down, so a step that did not wait would run first), and the front and ``T`` the
    one-thread order's bit for bit (itself the one-device dense path's)."""
    F, panels, owners = _case(fm, fn, nb, k, how)
    ndev = int(owners.max()) + 1
    F1 = F.copy()
    T1 = factorize_numpy(F1, panels, nb)
    F0 = F.copy()
    be0 = NumpySplit(F0, panels, nb, owners)
    times0 = run_split(be0, panels, nb, fn, owners)
    assert np.array_equal(F0, F1) and np.array_equal(be0.T, T1)
    assert len(times0) == ndev and times0[0][1] == 0.0
    F2 = F.copy()
    be = _Recorded(F2, panels, nb, owners, slow=("to_main", "send_panel"), delay=0.002)
    with _Workers(ndev) as ws:
        times = run_split(be, panels, nb, fn, owners, workers=ws)
    assert np.array_equal(F2, F1) and np.array_equal(be.T, T1)
    assert len(times) == ndev and all(t >= w >= 0 for t, w in times)
    steps = split_steps(panels, nb, fn, owners)
    assert len(be.events) == len(steps)
    main = threading.current_thread().name
    where = {}
    for name, args, thread, t0, t1 in be.events:
        where[(name, _key(args))] = (thread, t0, t1)
    for i, s in enumerate(steps):
        thread, t0, _ = where[(s.name, _key(s.args))]
        assert thread == (main if s.device == 0 else f"split-dev-{s.device}_0"), (s, thread)
        for n in s.needs:
            need = steps[n]
            assert need.device != s.device
            assert where[(need.name, _key(need.args))][2] < t0, (need, s)
    for d in range(ndev):           # each device's steps in the one-thread order
        mine = [(s.name, _key(s.args)) for s in steps if s.device == d]
        ran = sorted(mine, key=lambda x: where[x][1])
        assert ran == mine


def _key(args):
    return tuple(tuple(a) if isinstance(a, list) else a for a in args)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_split_steps_needs(k):
    """The one-thread order lists every step after the steps it needs, on other
    devices; a panel is sent after it is factorized, a look-ahead block of another
    device comes back first, panel ``p`` waits for panel ``p - RING``'s copies,
    and the end for every device's last step."""
    fm, fn, nb = 400, 300, 16
    F, panels, owners = _case(fm, fn, nb, k, "cyclic")
    steps = split_steps(panels, nb, fn, owners)
    at = {(s.name, _key(s.args)): i for i, s in enumerate(steps)}
    for i, s in enumerate(steps):
        assert all(n < i and steps[n].device != s.device for n in s.needs)
        if s.name == "send_panel":
            assert [steps[n] for n in s.needs] == [steps[at[("factor", (s.args[0],))]]]
        if s.name == "lookahead" and owners[s.args[1]]:
            d = int(owners[s.args[1]])
            assert at[("to_main", (d, s.args[1]))] in s.needs
        if s.name == "factor" and s.args[0] >= RING:
            q = s.args[0] - RING
            sent = {at[x] for x in at if x[0] == "send_panel" and x[1][0] == q}
            assert sent and set(s.needs) == sent
    ends = {max(i for i, s in enumerate(steps) if s.device == d) for d in range(1, k)}
    assert steps[-1].name == "finish" and set(steps[-1].needs) == ends
    assert {s.device for s in steps} == set(range(k))


def test_split_on_threads_without_the_waits_differs(monkeypatch):
    """The check can fail: with the look-ahead's needs dropped (the main device's
    thread does not wait for the block to come back), a slow device's block comes
    back after the main device's look-ahead read it, and the front differs."""
    from scipy_gpuqr._engine import split_front as mod
    fm, fn, nb, k = 300, 200, 16, 2
    F, panels, owners = _case(fm, fn, nb, k, "cyclic")
    F1 = F.copy()
    factorize_numpy(F1, panels, nb)
    orig = mod.split_steps

    def careless(*args):
        return [s._replace(needs=()) if s.name == "lookahead" else s for s in orig(*args)]
    monkeypatch.setattr(mod, "split_steps", careless)
    F2 = F.copy()
    be = _Recorded(F2, panels, nb, owners, slow=("to_main",), delay=0.01)
    with _Workers(k) as ws:
        run_split(be, panels, nb, fn, owners, workers=ws)
    assert not np.array_equal(F2, F1)


@pytest.mark.parametrize("where", ["worker", "main"])
def test_split_on_threads_failure_stops_every_thread(where):
    """A step that fails on a device's thread is raised by ``run_split`` once every
    thread ended: the others stop at their next wait instead of waiting for ever."""
    fm, fn, nb, k = 300, 260, 16, 3
    F, panels, owners = _case(fm, fn, nb, k, "cyclic")

    class Broken(NumpySplit):
        def update(self, d, p, blocks):
            if p == 3 and d == (2 if where == "worker" else 0):
                raise RuntimeError(f"device {d} failed")
            super().update(d, p, blocks)

    be = Broken(F, panels, nb, owners)
    out = {}

    def go():
        with _Workers(k) as ws:
            try:
                run_split(be, panels, nb, fn, owners, workers=ws)
            except RuntimeError as exc:
                out["error"] = str(exc)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a device's thread kept waiting"
    assert out["error"] == f"device {2 if where == 'worker' else 0} failed"


def test_driver_enqueues_each_layers_share_on_its_own_thread(monkeypatch):
    """The multi-GPU driver over NumPy layers: a split front's main-device steps run
    on the main layer's thread, every other layer's on that layer's split worker
    (one per layer, ended with the call); the answer is the one-device driver's."""
    from scipy_gpuqr._engine import split_front as mod
    seen = []
    orig = mod.NumpySplit.update

    def update(self, d, p, blocks):
        seen.append((d, threading.current_thread().name))
        orig(self, d, p, blocks)
    monkeypatch.setattr(mod.NumpySplit, "update", update)
    A = grid3d_least_squares(8)
    an = analyze(A)
    one_layer = NumpyDevice(32, 3)
    one_layer.dense_panel = 16
    one = gpu_factorize(A, an, device=one_layer, dense_flops=2e5)
    before = {t.name for t in threading.enumerate()}
    many = multi_gpu_factorize(A, an, layers=_layers(3), dense_flops=2e5, split_dense=True)
    split = many.info["split_fronts"]
    assert split and all(
        len(e["enqueue_seconds"]) == 1 + max(i for i, b in enumerate(e["blocks"]) if b)
        for e in split)
    upper = many.info["devices"]["upper_device"]
    helpers = sorted({d for d, _ in seen if d})
    assert helpers
    for d, name in seen:
        if d == 0:
            assert not name.startswith("gpuqr-split"), name
        else:
            assert name.startswith("gpuqr-split-"), name
            layer = int(name.split("-")[2].split("_")[0])
            assert layer != upper
    # one worker per other layer, the same one for every front and step of that device
    names = {d: {n for dd, n in seen if dd == d} for d in helpers}
    assert all(len(v) == 1 for v in names.values())
    assert len(set().union(*names.values())) == len(helpers)
    left = {t.name for t in threading.enumerate()} - before
    assert not [n for n in left if n.startswith("gpuqr-split")], left
    _same_answer(A, one, many)


def test_default_is_the_rule(monkeypatch):
    """``multi_gpu_factorize``'s default splits by the rule: the mapping weighs the
    upper tree's splittable fronts at their split time (ch7-8-b3's root, split
    over two devices) and the run gets ``split_dense=None``; False maps on flops
    alone and splits nothing."""
    from scipy_gpuqr._engine.gpu import multi_device as md
    from scipy_gpuqr._schedule.devices import map_devices
    an = analyze(chessboard_boundary(7, 8, 3))
    seen = {}

    class Stop(Exception):
        pass

    def run(Ac, analysis, plan, layers, **kw):
        seen["plan"], seen["split_dense"] = plan, kw["split_dense"]
        raise Stop
    monkeypatch.setattr(md, "_run", run)
    A = chessboard_boundary(7, 8, 3)
    with pytest.raises(Stop):
        multi_gpu_factorize(A, an, layers=_layers(2), device_speeds=None)
    rule = map_devices(an, 2, split_model=SplitModel())
    assert seen["split_dense"] is None and rule.split
    assert sorted(seen["plan"].split) == sorted(rule.split)
    with pytest.raises(Stop):
        multi_gpu_factorize(A, an, layers=_layers(2), device_speeds=None, split_dense=False)
    assert seen["split_dense"] is False and not seen["plan"].split


def test_simulated_devices_split_by_the_rule_by_default():
    """``simulate_multi_device``'s default is the GPU driver's, the rule: it maps with
    the split model (the plan's split fronts made dense and split), equals the same
    plan's run without the split bit for bit and the one-device answer; False maps
    on flops alone and splits nothing."""
    from scipy_gpuqr._engine.host.multi_device import simulate_multi_device
    from scipy_gpuqr._engine.host.simulate import simulate_factorize
    from scipy_gpuqr._schedule.devices import map_devices
    A = grid3d_least_squares(9)
    an = analyze(A)
    model = _small_model()
    plan = map_devices(an, 2, split_model=model)
    assert plan.split, "the plan splits no front"
    many = simulate_multi_device(A, an, devices=2, dense_panel=16, split_model=model)
    assert many.info["devices"]["split_fronts"] == sorted(plan.split)
    assert set(plan.split) <= {f for f, _, _ in many.info["split_fronts"]}
    for f, blocks, moved in many.info["split_fronts"]:
        assert len(blocks) == 2 and min(blocks) > 0 and moved > 0
    ref = simulate_multi_device(A, an, devices=plan, dense_panel=16, split_dense=False)
    assert ref.info["split_fronts"] == [] and ref.info["dense_fronts"] == many.info["dense_fronts"]
    assert (ref.R != many.R).nnz == 0
    # the one-device answer up to the signs of R's rows (its dense fronts are tile fronts)
    one = simulate_factorize(A, an, dense_panel=16)
    G1, G2 = (one.R.T @ one.R).toarray(), (many.R.T @ many.R).toarray()
    assert np.abs(G1 - G2).max() <= 1e-12 * np.abs(G1).max()
    m, n = A.shape
    X = np.random.default_rng(0).standard_normal((n, 2))
    Y = np.zeros((m, 2))
    Y[:n] = many.R @ X
    AP = A[:, many.colperm] @ X
    assert np.abs(many.q_matmul(Y) - AP).max() <= 1e-11 * np.abs(AP).max()
    off = simulate_multi_device(A, an, devices=2, dense_panel=16, split_model=model,
                                split_dense=False)
    assert off.info["split_fronts"] == [] and off.info["devices"]["split_fronts"] == []
    flat = map_devices(an, 2)
    assert off.info["devices"]["modelled_speedup"] == flat.modelled_speedup
    assert off.info["devices"]["stages"] == flat.nstages


def test_dispatch_judges_several_gpus_by_the_split_model(monkeypatch):
    """The 'auto' rule of the public path decides on several GPUs by the modelled
    speedup of the mapping the call will run, with its dense fronts split
    (``run_speedup``): ch7-8-b3 models about 1.1 on two devices without the split,
    below :data:`MULTI_DEVICE_MIN_SPEEDUP`, and 1.5 with it, so it goes to two GPUs,
    and the reason says so."""
    from scipy_gpuqr import GpuqrOptions
    from scipy_gpuqr._dispatch import plan as plan_mod
    from scipy_gpuqr._schedule.devices import (MULTI_DEVICE_MIN_FLOPS, MULTI_DEVICE_MIN_SPEEDUP,
                                               map_devices, run_speedup)
    fake = {"available": True, "device_count": 2, "total_memory": 80 * 2 ** 30}
    monkeypatch.setattr(plan_mod._gpu, "gpu_info", lambda: dict(fake))
    an = analyze(chessboard_boundary(7, 8, 3))
    plain = map_devices(an, 2).modelled_speedup
    ruled = map_devices(an, 2, split_model=SplitModel()).modelled_speedup
    assert plain < MULTI_DEVICE_MIN_SPEEDUP <= ruled
    assert run_speedup(an, 2) == ruled and run_speedup(an, 1) == 1.0

    class Big:                  # the flop count past the gate, whatever the host's matrix
        def __init__(self, an):
            self.an, self.flops = an, 10 * MULTI_DEVICE_MIN_FLOPS

        def __getattr__(self, name):
            return getattr(self.an, name)

    def one(*a, **k):
        return "one-gpu"

    reasons = []
    got = plan_mod._gpu_devices(one, Big(an), GpuqrOptions(devices="auto"), reasons)
    assert got is not one, reasons
    assert "GPUs [0, 1]" in reasons[-1] and f"modelled speedup {ruled:.2f}" in reasons[-1]
    assert "split" in reasons[-1]
    # judged without the split (the rule before), the same tree stays on one GPU
    monkeypatch.setattr(plan_mod, "run_speedup",
                        lambda a, k, device_memory=None: map_devices(a, k).modelled_speedup)
    reasons = []
    assert plan_mod._gpu_devices(one, Big(an), GpuqrOptions(devices="auto"), reasons) is one
