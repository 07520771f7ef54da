"""The task record: NumPy dtype and the kernel struct agree (NVRTC, no GPU)."""

import numpy as np
import pytest

from scipy_gpuqr import _kernels
from scipy_gpuqr._schedule import tasks


def _compile(src: str):
    pytest.importorskip("cupy", reason="NVRTC check needs the kernel-check extra (pip install -e '.[kernel-check]')")
    from cupy.cuda import nvrtc
    prog = nvrtc.createProgram(src, "task_layout.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=sm_80",
                                        *_kernels.COMPILE_OPTIONS])
        except Exception as exc:
            return False, f"{exc}\n{nvrtc.getProgramLog(prog)}"
        return True, ""
    finally:
        nvrtc.destroyProgram(prog)


def test_dtype_fixed_size_and_aligned():
    assert tasks.TASK_BYTES == 96
    for name in tasks.TASK_DTYPE.names:
        sub, off = tasks.TASK_DTYPE.fields[name][:2]
        base = sub.base if sub.shape else sub
        assert off % base.itemsize == 0, name
    t = tasks.empty_tasks(3)
    assert (t["rows"] == -1).all() and (t["type"] == 0).all()


def test_kernel_struct_matches_dtype():
    src = _kernels.flatten_source("sparse_qr/task.cuh") + "\n" + tasks.c_struct_asserts()
    try:
        ok, log = _compile(src)
    except Exception as exc:  # NVRTC library missing
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert ok, log


def test_layout_check_can_fail():
    """A drifted offset must be caught by the generated asserts."""
    src = _kernels.flatten_source("sparse_qr/task.cuh").replace(
        "int front;", "int front; int drift;")
    src += "\n" + tasks.c_struct_asserts()
    try:
        ok, _ = _compile(src)
    except Exception as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert not ok


# -- Apply records cut into pieces (the uberkernel's gridDim.y) ------------------------

def _pieces_loop(c0, c1, s, tile):
    """The pieces by a plain loop over the record's column tiles."""
    nt = -(-(c1 - c0) // tile) if c1 > c0 else 0
    out = []
    for k in range(s):
        t0, t1 = k * nt // s, (k + 1) * nt // s
        out.append((c0 + t0 * tile, min(c0 + t1 * tile, c1)))
    return out


def test_apply_pieces_cover_the_record_in_tile_aligned_runs():
    import numpy as np
    rng = np.random.default_rng(5)
    for _ in range(300):
        tile = int(rng.choice([16, 32, 64]))
        c0 = int(rng.integers(0, 3000))
        c1 = c0 + int(rng.integers(0, 20 * tile))
        s = int(rng.integers(1, 20))
        a, b = tasks.apply_piece_columns(c0, c1, np.arange(s), s, tile)
        assert [(int(x), int(y)) for x, y in zip(a, b)] == _pieces_loop(c0, c1, s, tile)
        cols = np.concatenate([np.arange(x, y) for x, y in zip(a, b) if y > x] or [[]])
        assert np.array_equal(cols, np.arange(c0, c1))       # every column once, in order
        assert all((x - c0) % tile == 0 for x, y in zip(a, b) if y > x)
        nt = -(-(c1 - c0) // tile)
        widths = [-(-(y - x) // tile) for x, y in zip(a, b) if y > x]
        if widths:
            assert max(widths) - min(widths) <= 1 and max(widths) == -(-nt // s)


def _launch_records(widths, others=0):
    import numpy as np
    t = tasks.empty_tasks(len(widths) + others)
    t["type"][:len(widths)] = tasks.TaskType.APPLY
    t["c1"][:len(widths)] = np.asarray(widths)
    t["type"][len(widths):] = tasks.TaskType.APPLY_FACTORIZE
    t["c1"][len(widths):] = 32
    return t


def test_apply_split_cuts_only_launches_that_leave_the_device_idle():
    import numpy as np
    f = tasks.apply_split
    wide = _launch_records([512] * 100, others=50)
    assert f(wide["type"], wide["c0"], wide["c1"], 396, 1) == 1          # never cut
    assert f(wide["type"], wide["c0"], wide["c1"], 150, 8) == 1          # fills the device
    s = f(wide["type"], wide["c0"], wide["c1"], 396, 8)
    assert s == 4 and 50 + 100 * 4 >= 396 and 50 + 100 * 2 < 396      # smallest that fills
    assert f(wide["type"], wide["c0"], wide["c1"], 10**6, 8) == 8       # capped
    assert f(wide["type"], wide["c0"], wide["c1"], 10**6, 6) == 6       # cap not a power of 2
    narrow = _launch_records([64] * 10)
    assert f(narrow["type"], narrow["c0"], narrow["c1"], 396, 8) == 2   # 2 tiles: 2 pieces
    one = _launch_records([20] * 10)
    assert f(one["type"], one["c0"], one["c1"], 396, 8) == 1            # one tile: no cut
    fac = _launch_records([], others=20)
    assert f(fac["type"], fac["c0"], fac["c1"], 396, 8) == 1            # no Apply record
    assert f(fac["type"][:0], fac["c0"][:0], fac["c1"][:0], 396, 8) == 1
    rng = np.random.default_rng(2)
    for _ in range(200):
        w = rng.integers(1, 17, rng.integers(1, 300)) * 32 - rng.integers(0, 32)
        t = _launch_records(w.tolist(), others=int(rng.integers(0, 100)))
        slots, mx = int(rng.integers(50, 800)), int(rng.choice([2, 4, 8, 16]))
        s = f(t["type"], t["c0"], t["c1"], slots, mx)
        assert 1 <= s <= mx
        nt = -(-w // 32)
        busy = lambda k: (len(t) - len(w)) + int(np.minimum(nt, k).sum())  # noqa: E731
        if len(t) >= slots:
            assert s == 1
        elif s > 1:
            assert busy(s // 2) < slots or s // 2 >= nt.max()           # a smaller one fails
            assert busy(s) >= slots or s == mx or s >= nt.max()


def test_longest_first_orders_records_within_their_launch():
    # launch 0: Apply (1 tile x 3 row tiles), Apply+Factorize (2 x 2 + a Factorize),
    # Factorize, S-Assemble; launch 1: Apply (5 x 1), Pack-Assemble, Apply (no column)
    from scipy_gpuqr._schedule.tasks import (FACTORIZE_COST, TaskType, empty_tasks,
                                             longest_first, record_costs)
    t = empty_tasks(7)
    t["type"] = [TaskType.APPLY, TaskType.APPLY_FACTORIZE, TaskType.FACTORIZE,
                 TaskType.S_ASSEMBLE, TaskType.APPLY, TaskType.PACK_ASSEMBLE, TaskType.APPLY]
    t["c0"] = [64, 32, 0, 0, 0, 0, 96]
    t["c1"] = [96, 96, 0, 500, 150, 40, 96]
    t["napply"] = [3, 2, 0, 0, 1, 0, 3]
    assert record_costs(t).tolist() == [3, 4 + FACTORIZE_COST, FACTORIZE_COST, 0, 5, 0, 0]
    assert longest_first(t, [0, 4, 7]).tolist() == [1, 2, 0, 3, 4, 5, 6]
    assert longest_first(t, [0, 7]).tolist() == [1, 2, 4, 0, 3, 5, 6]
    assert longest_first(t[:0], [0]).tolist() == []


def test_records_moved_whole_and_type_masks():
    from scipy_gpuqr._schedule.tasks import (TASK_DTYPE, TaskType, applies, empty_tasks,
                                             factorizes, join_records, take_records)
    rng = np.random.default_rng(3)
    rec = empty_tasks(40)
    rec["type"] = rng.integers(0, len(TaskType), 40)
    rec["front"] = rng.integers(0, 9, 40)
    rec["c1"] = rng.integers(0, 500, 40)
    rec["rows"][:, 0] = rng.integers(0, 99, 40)
    order = rng.permutation(40)
    assert take_records(rec, order).tobytes() == rec[order].tobytes()
    assert take_records(rec, rec["front"] > 4).tobytes() == rec[rec["front"] > 4].tobytes()
    joined = join_records([rec[:7], rec[7:7], rec[7:]])
    assert joined.dtype == TASK_DTYPE and joined.tobytes() == rec.tobytes()
    t = rec["type"]
    np.testing.assert_array_equal(applies(t), np.isin(t, (TaskType.APPLY,
                                                          TaskType.APPLY_FACTORIZE)))
    np.testing.assert_array_equal(factorizes(t), np.isin(t, (TaskType.FACTORIZE,
                                                             TaskType.APPLY_FACTORIZE)))
