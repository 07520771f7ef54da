"""The plan's fast paths give what the general ones give (CPU only)."""

import numpy as np
import pytest

from scipy_gpuqr._schedule import bucket
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares


@pytest.mark.parametrize("budget_div", [None, 3])
@pytest.mark.parametrize("dense_flops", [None, 1e6])
def test_state_machine_without_limit_is_the_limited_one_with_a_huge_limit(budget_div,
                                                                          dense_flops):
    an = analyze(grid3d_least_squares(10))
    budget = None if budget_div is None else int(an.gpu_bytes // budget_div)
    kw = dict(max_gpu_memory=budget, dense_flops=dense_flops, cache=False)
    a = build_schedule(an, **kw)
    b = build_schedule(an, max_tasks=10 ** 12, **kw)
    assert len(a.stages) == len(b.stages)
    if budget_div is not None:
        assert len(a.stages) > 1
    if dense_flops is not None:
        assert a.dense
    assert a.dense == b.dense
    for sa, sb in zip(a.stages, b.stages):
        np.testing.assert_array_equal(sa.launch_ptr, sb.launch_ptr)
        assert sa.tasks.tobytes() == sb.tasks.tobytes()
        assert sa.finish == sb.finish
        assert sa.dense == sb.dense and sa.dense_join == sb.dense_join


def test_templates_in_one_pass_equal_per_pattern_rows():
    an = analyze(chessboard_boundary(4, 5, 2))
    bucket.clear_cache()
    cold = build_schedule(an, cache=False)          # new patterns: rows in one pass
    scheds = list({id(s): s for s in bucket._CACHE._d.values()}.values())
    assert len(scheds) > 3
    rc = {k: np.concatenate([s.rcols[k] for s in scheds]) for k in bucket.COLUMNS}
    np.testing.assert_array_equal(bucket.element_rows_of(rc, 32),
                                  np.concatenate([s.element_rows(32) for s in scheds]))
    warm = build_schedule(an, cache=False)          # rows cached per pattern now
    for sa, sb in zip(cold.stages, warm.stages):
        assert sa.tasks.tobytes() == sb.tasks.tobytes()


def test_r_layout_one_stage_map_from_segments():
    from scipy_gpuqr._engine.gpu_rlayout import r_layout
    an = analyze(grid3d_least_squares(8))
    lay = r_layout(an, cache=False)
    assert lay._src is None                         # kept as segments
    (pos, idx), = lay.stage_maps([(0, an.fronts.nfronts - 1)])
    assert pos is None and idx.dtype == np.int32
    np.testing.assert_array_equal(idx, np.maximum(lay.src, 0))
    lay2 = r_layout(an, cache=False)
    lay2.src                                        # expanded first: the other path
    (_, idx2), = lay2.stage_maps([(0, an.fronts.nfronts - 1)])
    np.testing.assert_array_equal(idx, idx2)
