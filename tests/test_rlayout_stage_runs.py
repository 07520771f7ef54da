"""R's gather maps of a staged plan made from the sources' column segments.

A new device mapping's first call makes the gather maps of its stages
(:meth:`~scipy_gpuqr._engine.gpu.rlayout.RLayout.stage_maps`). Masking every
entry's source once per stage reads all of R's entries per stage; since each
column segment of sources lies within one front, a stage's entries are whole
segments, selected from the segments and written once. Both give the same maps.
"""

from dataclasses import replace

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import rlayout
from scipy_gpuqr._schedule.dense_split import SplitModel
from scipy_gpuqr._schedule.devices import map_devices
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
from test_schedule_layout_native import LAYOUT_IDS, LAYOUT_MATRICES


def _plans(an):
    nf = an.fronts.nfronts
    out = [[(0, nf - 1)]]
    if nf > 3:
        out.append([(0, nf // 2), (nf // 2 + 1, nf - 1)])
    if nf > 8:
        cuts = sorted(set(np.random.default_rng(nf).integers(1, nf - 1, 5).tolist()))
        b = [0] + cuts + [nf]
        out.append([(b[i], b[i + 1] - 1) for i in range(len(b) - 1)])
    for k in (2, 4):
        out.append(list(map_devices(an, k, split_model=SplitModel()).stages))
    return out


@pytest.mark.parametrize("A", LAYOUT_MATRICES, ids=LAYOUT_IDS)
def test_stage_maps_from_segments_equal_the_masked_ones(A, monkeypatch):
    an = analyze(A, cache=False)
    lay = rlayout.r_layout(an, cache=False)
    assert lay._segments_in_fronts() is not None
    if np.any(lay._segs[0] < 0):
        assert len(lay.r1_pos)                  # singleton-row entries in some stage's columns
    masked = rlayout.r_layout(an, cache=False)
    monkeypatch.setattr(masked, "_segments_in_fronts", lambda: None)
    for plan in _plans(an):
        got, want = lay.stage_maps(plan), masked.stage_maps(plan)
        assert len(got) == len(want) == len(plan)
        for (pa, ia), (pb, ib) in zip(got, want):
            assert (pa is None) == (pb is None)
            if pa is not None:
                assert pa.dtype == pb.dtype
                np.testing.assert_array_equal(pa, pb)
            assert ia.dtype == ib.dtype
            np.testing.assert_array_equal(ia, ib)
        if len(plan) > 1:                       # every entry of a front in exactly one stage
            pos = np.concatenate([p for p, _ in got])
            assert len(np.unique(pos)) == len(pos) == lay.nnz - len(lay.r1_pos)


def test_a_segment_across_fronts_falls_back_to_masks():
    """The check can fail: a layout whose segments were not each within one front
    would give a stage whole segments of another; it is found, and the stage's
    maps come from the masks."""
    an = analyze(grid3d_least_squares(6), cache=False)
    lay = rlayout.r_layout(an, cache=False)
    first, step, length, start = lay._segs
    fb = lay.fbase
    i = int(np.flatnonzero((first >= 0) & (step > 0) & (length > 1))[0])
    f = int(np.searchsorted(fb, first[i], side="right")) - 1
    moved = first.copy()
    moved[i] = int(fb[f + 1]) - 1              # starts on the front's last element
    bad = replace(lay, _segs=(moved, step, length, start), _extras={}, _stage_maps={})
    assert bad._segments_in_fronts() is None
    assert lay._segments_in_fronts() is not None
