"""CupyDevice's records uploaded with the launches (``_records_up``), on the CPU.

A materialized stage's records go to the device in chunks of at least
``record_chunk_bytes`` ahead of the launches that read them, a stage built
launch by launch one launch's at a time. Here the device buffer and the pinned
buffer are NumPy arrays: before every launch, the records it reads must be in
the device buffer, whatever the chunk size, and a chunk ends only past a
launch's end.
"""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu.device import CupyDevice, RECORD_CHUNK_BYTES
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._schedule.tasks import TASK_BYTES
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares


class _DeviceBytes:
    """A device byte buffer: slices of it take ``set(host, stream)`` copies."""

    def __init__(self, n):
        self.buf = np.full(n, 0xFF, dtype=np.uint8)     # poisoned, as in debug mode
        self.copies = []

    def __getitem__(self, sl):
        owner = self

        class _Slice:
            def set(self, host, stream=None):
                owner.buf[sl] = host
                owner.copies.append((sl.start, sl.stop))
        return _Slice()


class _Layer:
    """What ``CupyDevice._records_up`` reads of its layer."""

    def __init__(self, chunk):
        self.record_chunk_bytes = chunk
        self.stream = None


def _uploads(st, chunk, whole):
    nbytes = max(int(st.ntasks), 1) * TASK_BYTES
    src = np.ascontiguousarray(st.tasks).view(np.uint8).ravel()
    h = {"dt": _DeviceBytes(nbytes), "host": np.zeros(nbytes, np.uint8),
         "src": src if whole else None, "sent": 0}
    lp = np.asarray(st.launch_ptr)
    layer = _Layer(chunk)
    for L in range(len(lp) - 1):
        a, b = int(lp[L]), int(lp[L + 1])
        if b <= a:
            continue
        CupyDevice._records_up(layer, h, a, b, st.tasks[a:b])
        # the launch reads records [a, b): on the device, as the schedule has them
        assert np.array_equal(h["dt"].buf[a * TASK_BYTES: b * TASK_BYTES],
                              src[a * TASK_BYTES: b * TASK_BYTES]), (L, chunk)
    return h["dt"]


@pytest.mark.parametrize("budget", [None, 20000])
@pytest.mark.parametrize("chunk", [TASK_BYTES, 3 * TASK_BYTES, 1000, RECORD_CHUNK_BYTES])
def test_every_launch_finds_its_records_on_the_device(budget, chunk):
    an = analyze(grid3d_least_squares(8))
    sched = build_schedule(an, max_gpu_memory=budget)
    for st in sched.stages:
        lp = np.asarray(st.launch_ptr) * TASK_BYTES
        dev = _uploads(st, chunk, whole=True)
        # chunks follow each other, at least `chunk` long (but the list's end), and
        # end at a launch's end or past it
        starts = [c[0] for c in dev.copies]
        ends = [c[1] for c in dev.copies]
        assert starts == [0] + ends[:-1]
        assert all(e - s >= min(chunk, len(dev.buf) - s) for s, e in dev.copies)
        assert ends[-1] == int(lp[-1])
        assert all(e == len(dev.buf) or np.searchsorted(lp, e) < len(lp) for e in ends)
        # built launch by launch: one copy a launch with records, exactly its own
        dev1 = _uploads(st, chunk, whole=False)
        assert dev1.copies == [(int(a), int(b)) for a, b in zip(lp[:-1], lp[1:]) if b > a]


def test_the_poisoned_records_read_as_no_task():
    # the GPU test's debug-mode poison (0xFF bytes) decodes as type -1: a launch whose
    # records were never uploaded runs no task there
    an = analyze(grid3d_least_squares(6))
    st = build_schedule(an).stages[0]
    h = {"dt": _DeviceBytes(int(st.ntasks) * TASK_BYTES), "src": None}
    assert (h["dt"].buf[:TASK_BYTES] == 0xFF).all()
    rec = h["dt"].buf[:TASK_BYTES].view(st.tasks.dtype)
    assert int(rec["type"][0]) == -1
