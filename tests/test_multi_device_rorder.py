"""R's values of a multi-device stage taken in the order they become final.

A stage's R copier moves a prefix of its entries after each launch. In R's CSC
order a column is final only once every front holding it is, so an upper
stage, whose fronts hold the root's columns, had no entry final before its last
launch and copied all of them after the devices ended.
:meth:`~scipy_gpuqr._engine.gpu.rlayout.RLayout.stage_maps_by` orders each
stage's column segments by the launch after which they are final
(:func:`~scipy_gpuqr._engine.gpu.multi_device.final_launches`); the maps hold the
same entries, and a copy of a prefix before it is final would change R (the
NumPy layers of ``tests/test_multi_device.py`` copy after every launch).
"""

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import multi_device, rlayout
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.gpu.multi_device import _host_side, final_launches, multi_gpu_factorize
from scipy_gpuqr._engine.gpu.rcopy import NumpyRCopy, final_entries
from scipy_gpuqr._schedule.tasks import record_launches
from scipy_gpuqr._schedule.dense_split import SplitModel
from scipy_gpuqr._schedule.devices import defer_carried_packs, map_devices
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import TaskType
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

#: Dense fronts from this many flops (small, so that the upper stages of these
#: small grids have some, as grid 64^3's have).
DENSE_FLOPS = 2e5


def counted_deferrals(monkeypatch) -> list:
    """The stages whose carried packs :func:`defer_carried_packs` defers from now on
    (their fronts, in call order), the function itself still run."""
    calls = []
    real = multi_device.defer_carried_packs

    def counted(st, parent):
        calls.append(st.fronts)
        return real(st, parent)
    monkeypatch.setattr(multi_device, "defer_carried_packs", counted)
    return calls


def assert_same_maps(first, again):
    """Two host sides' ordered maps are the very same objects (kept with the layout),
    with equal final launches."""
    for (pa, ia, fa), (pb, ib, fb) in zip(first, again):
        assert pa is pb and ia is ib
        np.testing.assert_array_equal(fa, fb)


def _scheduled(A, k):
    an = analyze(A, cache=False)
    plan = map_devices(an, k, split_model=SplitModel())
    sched = build_schedule(an, plan=plan.stage_plan(), dense_flops=DENSE_FLOPS,
                           dense_extra=sorted(plan.split), cache=False)
    return an, plan, sched


CASES = [(grid3d_least_squares(9), 2), (grid3d_least_squares(10), 4),
         (chessboard_boundary(6, 7, 3), 3)]


@pytest.mark.parametrize("A, k", CASES, ids=["grid9-2", "grid10-4", "chess-3"])
def test_ordered_maps_hold_the_stage_maps_entries_by_final_launch(A, k):
    an, plan, sched = _scheduled(A, k)
    assert len(sched.stages) > 1
    lay = rlayout.r_layout(an, cache=False)
    stages = [defer_carried_packs(st, an.fronts.parent)[0] for st in sched.stages]
    fronts = [st.fronts for st in stages]
    got = lay.stage_maps_by(fronts, final_launches(an.fronts, stages, int(sched.tile)), "t")
    want = lay.stage_maps(fronts)
    assert got is not None and len(got) == len(want)
    factorized = 0                  # entries whose column tile a Factorize record writes
    for i, ((pos, idx, count), (wpos, widx)) in enumerate(zip(got, want)):
        assert idx.dtype == widx.dtype and int(count.sum()) == len(idx) == len(widx)
        o = np.argsort(pos, kind="stable")
        np.testing.assert_array_equal(pos[o], wpos)         # the same entries, each once
        np.testing.assert_array_equal(idx[o], widx)
        # ranks nondecreasing along the entries, each entry's its front's column tile's
        rank = np.repeat(np.arange(len(count)), count)
        fb = lay.fbase
        src = idx.astype(np.int64) + fb[fronts[i][0]]
        f = np.searchsorted(fb, src, side="right") - 1
        col = (src - fb[f]) % an.fronts.fn.astype(np.int64)[f]
        want_rank = final_launches(an.fronts, stages, int(sched.tile))(i, f, col)
        np.testing.assert_array_equal(rank, want_rank)
        # never before its column tile's Factorize record, never after the CSC prefix
        tile = int(sched.tile)
        t, launch = stages[i].tasks, record_launches(stages[i].launch_ptr)
        fac = t["type"] == TaskType.FACTORIZE
        ntile = (an.fronts.fn.astype(np.int64) + tile - 1) // tile
        base = np.concatenate([[0], np.cumsum(ntile)])
        cell = np.full(int(base[-1]), -1, dtype=np.int64)
        np.maximum.at(cell, base[t["front"][fac].astype(np.int64)]
                      + t["col"][fac].astype(np.int64) // tile, launch[fac])
        least = cell[base[f] + col // tile]
        assert np.all(rank >= least)
        factorized += int(np.count_nonzero(least > 0))
        csc = final_entries(an, lay, stages[i], tile, wpos)
        by = np.searchsorted(csc, np.searchsorted(wpos, pos), side="right")
        assert np.all(np.minimum(rank, stages[i].nlaunch - 1) <= by)
    assert factorized > 0
    assert lay.stage_maps_by(fronts, None, "t") is got      # kept: the rank is not asked again


def test_host_side_finals_are_never_later_and_earlier_in_an_upper_stage():
    """Against the CSC prefix (:func:`final_entries`): at every launch at least as
    many entries final, and on the upper tree's stage strictly more before its last
    launch (the CSC prefix there is empty until the end)."""
    an, plan, sched = _scheduled(grid3d_least_squares(10), 2)
    lay, maps = _host_side(an, sched)
    upper = int(plan.stage_device[-1])
    more = False
    for sid, st in enumerate(sched.stages):
        st = defer_carried_packs(st, an.fronts.parent)[0]
        pos, idx, final = maps[sid]
        assert final is not None and final.shape == (st.nlaunch,)
        # the last launch's event precedes the joins of dense fronts joined after it:
        # their entries are copied after every launch (the copier's end), none before
        late = [f for f, j in st.dense_join.items() if j >= st.nlaunch]
        fb = lay.fbase
        src = idx.astype(np.int64) + fb[st.fronts[0]]
        in_late = np.isin(np.searchsorted(fb, src, side="right") - 1, late)
        assert np.all(np.diff(final) >= 0) and final[-1] == len(idx) - in_late.sum()
        assert not in_late[:final[-1]].any()
        csc = np.searchsorted(np.sort(pos), final_entries(an, lay, st, int(sched.tile)))
        assert np.all(final[:-1] >= csc[:-1])
        if int(plan.stage_device[sid]) == upper and st.nlaunch > 1:
            more |= bool(final[-2] > csc[-2])
    assert more


def test_segments_made_again_for_a_layout_read_back():
    """A layout read back from disk keeps no column segments; they are made again
    from its analysis (the built layout's), and the ordered maps are the same.
    Another pattern's analysis makes none."""
    from dataclasses import replace
    an, plan, sched = _scheduled(grid3d_least_squares(9), 2)
    built = rlayout.r_layout(an, cache=False)
    back = replace(built, _segs=None, _extras={}, _stage_maps={})
    assert back._segments_in_fronts() is None
    other = analyze(grid3d_least_squares(8), cache=False)
    assert not back.segments_from(other) and back._segs is None
    assert back.segments_from(an)
    for a, b in zip(back._segs, built._segs):
        np.testing.assert_array_equal(a, b)
    assert back._segments_in_fronts() is not None
    stages = [defer_carried_packs(st, an.fronts.parent)[0] for st in sched.stages]
    fronts = [st.fronts for st in stages]
    rank = final_launches(an.fronts, stages, int(sched.tile))
    for x, y in zip(back.stage_maps_by(fronts, rank, "t"), built.stage_maps_by(fronts, rank, "t")):
        for a, b in zip(x, y):
            np.testing.assert_array_equal(a, b)


def test_host_side_without_segments_keeps_csc_order(monkeypatch):
    """A layout without column segments (rows of R not in front order) keeps its
    maps in CSC order (``final`` None: the copier computes the CSC prefix); R is
    the same."""
    A = grid3d_least_squares(8)
    an, plan, sched = _scheduled(A, 2)
    lay = rlayout.r_layout(an)
    monkeypatch.setattr(type(lay), "_segments_in_fronts", lambda self: None)
    monkeypatch.setattr(type(lay), "segments_from", lambda self, analysis: False)
    _, maps = _host_side(an, sched)
    for pos, idx, final in maps:
        assert final is None and np.all(np.diff(pos) > 0)
    got = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                              dense_flops=DENSE_FLOPS)
    monkeypatch.undo()
    rlayout.clear_r_layout_cache()
    want = multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                               dense_flops=DENSE_FLOPS)
    assert abs(got.R - want.R).max() == 0


def test_numpy_layers_copy_the_upper_stage_before_its_last_launch(monkeypatch):
    """On NumPy layers (each launch done when it returns) the upper stage's copier
    moves entries before its last launch; in CSC order it moved none."""
    A = grid3d_least_squares(10)
    an = analyze(A)
    made, moved = {}, []
    real_copier, real_after = multi_device._MultiStageRun._copier, NumpyRCopy.after_launch

    def copier(self, sid, st, k, layer, h):
        out = real_copier(self, sid, st, k, layer, h)
        made[sid] = (out[0], int(st.nlaunch))
        return out

    def after_launch(self, L):
        real_after(self, L)
        moved.append((self, L, self.done))
    monkeypatch.setattr(multi_device._MultiStageRun, "_copier", copier)
    monkeypatch.setattr(NumpyRCopy, "after_launch", after_launch)
    multi_gpu_factorize(A, an, layers=[NumpyDevice(32, 3) for _ in range(2)],
                        dense_flops=DENSE_FLOPS, split_dense=False)
    up, nl = made[max(made)]
    early = [done for c, L, done in moved if c is up and L < nl - 1]
    assert early and max(early) > 0


def test_host_side_of_a_repeated_call_ranks_nothing(monkeypatch):
    """The ordered maps are kept with the layout: a repeated call's host side (on a
    helper, beside the devices' enqueueing threads, every call) neither defers the
    stages' packs nor ranks again."""
    an, plan, sched = _scheduled(grid3d_least_squares(9), 2)
    first = _host_side(an, sched)[1]
    calls = counted_deferrals(monkeypatch)
    again = _host_side(an, sched)[1]
    assert calls == []
    assert_same_maps(first, again)
