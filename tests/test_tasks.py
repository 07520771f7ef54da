"""The task record: NumPy dtype and the kernel struct agree (NVRTC, no GPU)."""

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
