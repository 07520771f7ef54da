"""R of a split front joined after its stage's last launch copied panel by panel.

The root of a multi-device factorization is the upper stage's last front,
split over the devices and joined after the stage's last launch: its R used to
be copied after every kernel had run. Its columns are final block by block
(block ``p`` once panel ``p`` is factorized), so its entries are ranked by
column block (:func:`~scipy_gpuqr._engine.gpu.multi_device.final_launches`
with ``split_nb``), :func:`~scipy_gpuqr._engine.gpu.multi_device._host_side`
gives one more ``final`` entry per block, and the split's backend tells R's
copier after each panel (``on_panel``). On NumPy layers each copy runs when it
is told, so an entry copied before it is final would change R.
"""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import multi_device
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import late_split_front, multi_gpu_factorize
from scipy_gpuqr._engine.gpu.rcopy import NumpyRCopy
from scipy_gpuqr._schedule.devices import defer_carried_packs
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares

from test_multi_device import _same_answer
from test_multi_device_rorder import assert_same_maps, counted_deferrals

PANEL = 16


def _layers(k, panel=PANEL):
    out = [NumpyDevice(32, 3) for _ in range(k)]
    for layer in out:
        layer.dense_panel = panel
    return out


def _factorize(monkeypatch, A, an, k, cuts, host=None):
    """``multi_gpu_factorize`` on ``k`` NumPy layers with the upper dense fronts
    split; every stage waits for R's maps before it starts (so that every stage
    has its copier at its first split front); ``cuts`` collects the copiers'
    ``after_cut`` calls ``(copier, cut, entries)``; ``host`` the host side's
    arguments and result."""
    real_stage = multi_device._MultiStageRun._stage
    real_cut = NumpyRCopy.after_cut
    real_host = multi_device._host_side

    def stage(self, *args):
        self.host_side.result()
        return real_stage(self, *args)

    def after_cut(self, cut, ev=None):
        real_cut(self, cut, ev)
        cuts.append((self, int(cut), len(self.index), self.done))

    def host_side(analysis, sched, split_nb=None):
        out = real_host(analysis, sched, split_nb)
        if host is not None:
            host.append((sched, dict(split_nb or {}), out))
        return out
    monkeypatch.setattr(multi_device._MultiStageRun, "_stage", stage)
    monkeypatch.setattr(NumpyRCopy, "after_cut", after_cut)
    monkeypatch.setattr(multi_device, "_host_side", host_side)
    try:
        return multi_gpu_factorize(A, an, layers=_layers(k), dense_flops=2e5,
                                   split_dense=True)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("k", [2, 3, 4])
def test_late_split_front_ranked_by_its_blocks(monkeypatch, k):
    """The upper stage's ``final`` has one entry per block of the split root past its
    launches; entries between ``final[nl - 1]`` and ``final[nl + p]`` are the
    root's, in its columns before ``(p + 1) * nb``; every entry once."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    host = []
    _factorize(monkeypatch, A, an, k, [], host)
    (sched, split_nb, (lay, maps)), = host
    assert split_nb and set(split_nb.values()) == {PANEL}
    fs = an.fronts
    seen = 0
    for sid, st in enumerate(sched.stages):
        st = defer_carried_packs(st, fs.parent)[0]
        pos, idx, final = maps[sid]
        nl = int(st.nlaunch)
        g = late_split_front(st, split_nb)
        assert np.all(np.diff(final) >= 0)
        if g is None:
            assert len(final) == nl
            continue
        assert final[-1] == len(idx)
        seen += 1
        nblk = -(-int(fs.fn[g]) // PANEL)
        assert nl < len(final) <= nl + nblk
        fb = lay.fbase
        src = idx.astype(np.int64) + fb[st.fronts[0]]
        f = np.searchsorted(fb, src, side="right") - 1
        col = (src - fb[f]) % fs.fn.astype(np.int64)[f]
        assert np.all(f[final[nl - 1]:] == g) and not np.any(f[:final[nl - 1]] == g)
        for p in range(len(final) - nl):
            part = col[final[nl - 1]: final[nl + p]]
            assert np.all(part < (p + 1) * PANEL)
            assert np.all(col[final[nl + p]:] >= (p + 1) * PANEL)
    assert seen == 1                # the root, on the upper stage


@pytest.mark.parametrize("k", [2, 4])
def test_root_copied_by_panels_gives_the_same_answer(monkeypatch, k):
    """R's copier of the upper stage is told after the root's panels (several cuts
    before its end, each copied when told on NumPy layers), and R, Q and the
    solves are the one-device driver's."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    one_layer = NumpyDevice(32, 3)
    one_layer.dense_panel = PANEL
    one = gpu_factorize(A, an, device=one_layer, dense_flops=2e5)
    cuts = []
    many = _factorize(monkeypatch, A, an, k, cuts)
    assert many.info["split_fronts"]
    early = [(cut, n) for _, cut, n, done in cuts if cut < n]
    assert len(early) >= 2 and all(done == min(cut, n) for _, cut, n, done in cuts)
    assert [c for c, _ in early] == sorted(c for c, _ in early)
    _same_answer(A, one, many)


def test_no_cuts_without_a_split_front(monkeypatch):
    """Without split fronts the maps keep one ``final`` entry per launch and no copier
    is told any cut."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    cuts = []
    monkeypatch.setattr(NumpyRCopy, "after_cut",
                        lambda self, cut, ev=None: cuts.append(cut))
    out = multi_gpu_factorize(A, an, layers=_layers(2), dense_flops=2e5, split_dense=False)
    assert out.info["split_fronts"] == [] and cuts == []


def test_repeated_host_side_finds_the_late_fronts_kept(monkeypatch):
    """The late split fronts are found once per layout: a repeated call's host side
    (on a helper beside the devices' threads) defers no stage again."""
    A = grid3d_least_squares(8)
    an = analyze(A)
    host = []
    _factorize(monkeypatch, A, an, 2, [], host)
    (sched, split_nb, (_, first)), = host
    calls = counted_deferrals(monkeypatch)
    _, again = multi_device._host_side(an, sched, split_nb)
    assert calls == []
    assert_same_maps(first, again)


@pytest.mark.gpu
@pytest.mark.parametrize("ids", [(0, 0), (0, 1), (0, 1, 2, 3)])
def test_root_copied_by_panels_on_the_gpus(monkeypatch, ids):
    """On CUDA layers, with R's slots small enough that the root's blocks make
    chunks: the upper stage's copier is handed the root's panels' cuts, and the
    factorization equals one GPU's (R's Gram, Q R = A P, Qᵀ and Q)."""
    import cupy as cp

    from scipy_gpuqr._engine.gpu.multi_device import device_count
    from scipy_gpuqr._engine.gpu.rcopy import CupyRCopy
    from test_multi_device_gpu import _compare
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    A = grid3d_least_squares(14)
    an = analyze(A)
    handed = []
    real_stage = multi_device._MultiStageRun._stage
    real_cut = CupyRCopy.after_cut

    def stage(self, *args):
        self.host_side.result()
        return real_stage(self, *args)

    def after_cut(self, cut, ev):
        real_cut(self, cut, ev)
        if self._sent_cut == min(int(cut), self.n):
            handed.append((int(cut), self.n))
    monkeypatch.setattr(multi_device._MultiStageRun, "_stage", stage)
    monkeypatch.setattr(CupyRCopy, "after_cut", after_cut)
    with cp.cuda.Device(ids[0]):
        one = gpu_factorize(A, an, dense_flops=1e7)
        many = multi_gpu_factorize(A, an, devices=ids, dense_flops=1e7, split_dense=True,
                                   r_slot_bytes=1 << 16)
        assert many.info["split_fronts"] and "multi_device_fallback" not in many.info
        assert len([c for c, n in handed if c < n]) >= 2
        _compare(A, one, many)
        many.free()
        one.free()
