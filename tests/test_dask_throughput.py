"""Dask: what a chunk's task costs (one call, one wait) and the benchmark's
throughput runs (batches in flight, the modelled GPU) on CPU workers.

The task-level checks count the calls each chunk's task makes to the public
batched functions (the local synchronous scheduler runs them in this process).
The benchmark runs on a ``LocalCluster`` of CPU worker processes with its GPU
modelled by a clock (``--model-gpu``), as on a host without one.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy.linalg import LinAlgError, LinAlgWarning

import scipy_gpuqr as g
from conftest import REPO, load_bench

dask = pytest.importorskip("dask", reason="the dask extra is part of the test extra")
da = pytest.importorskip("dask.array")
pytest.importorskip("dask.distributed")

from scipy_gpuqr.batched import _functions as F  # noqa: E402
from scipy_gpuqr.distributed import _batched_api  # noqa: E402,F401 (wraps F's functions first)
from scipy_gpuqr.distributed import dask_batched as db  # noqa: E402


def _stack(rng, count, n):
    return rng.standard_normal((count, n, n)) + n * np.eye(n)


@pytest.fixture
def calls(monkeypatch):
    """Every call of the public batched functions as the chunk tasks make them:
    ``(name, return_info)``, in order."""
    seen = []
    for name in ("lu_factor_batched", "inv_batched", "solve_batched", "cho_factor_batched"):
        real = getattr(F, name)

        @functools.wraps(real)
        def spy(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, bool(kwargs.get("return_info"))))
            return _real(*args, **kwargs)
        monkeypatch.setattr(F, name, spy)
    return seen


@pytest.mark.parametrize("name", ["inv_batched", "solve_batched", "cho_factor_batched"])
def test_a_chunk_is_one_call_and_only_a_failing_chunk_a_second(rng, calls, name):
    """Without return_info each chunk makes the public call once (its one wait on a
    GPU); the chunk that raises is called again with return_info=True, and the
    error names the matrix by its global batch index."""
    a = _stack(rng, 12, 4)
    if name == "cho_factor_batched":
        a = a @ np.swapaxes(a, -1, -2)
    args = (rng.standard_normal((12, 4, 1)),) if name == "solve_batched" else ()
    d = da.from_array(a, chunks=(4, 4, 4))
    fn = getattr(g, name)
    dargs = tuple(da.from_array(x, chunks=(4, 4, 1)) for x in args)
    out = fn(d, *dargs)
    calls.clear()                                  # (the graph's probe call)
    dask.compute(out, scheduler="sync")
    assert calls == [(name, False)] * 3
    bad = a.copy()
    bad[9] = 0.0 if name != "cho_factor_batched" else -np.eye(4)
    out = fn(da.from_array(bad, chunks=(4, 4, 4)), *dargs)
    calls.clear()
    with pytest.raises(LinAlgError, match=r"batch index \[9\].*\[8:12\]"):
        dask.compute(out, scheduler="sync")
    assert calls[-2:] == [(name, False), (name, True)]
    assert calls.count((name, True)) == 1


def test_lu_factor_chunk_one_call_and_global_warning(rng, calls):
    """lu_factor_batched's task: one public call per chunk (NumPy chunks take the
    public call; CuPy chunks the counted GPU path), the warning by global index."""
    a = _stack(rng, 9, 3)
    a[7, :, 1] = 0.0
    lu, piv = g.lu_factor_batched(da.from_array(a, chunks=(3, 3, 3)))
    calls.clear()
    with pytest.warns(LinAlgWarning, match=r"batch index \[7\]"):
        dask.compute(lu, piv, scheduler="sync")
    assert calls == [("lu_factor_batched", True)] * 3


def test_counted_lu_leaves_numpy_to_the_public_call(rng):
    assert F._lu_factor_counted(_stack(rng, 2, 3), True) is None


def test_large_arguments_are_not_hashed_for_their_name(rng):
    """A NumPy argument beside a Dask one becomes one chunk; a large one gets a
    random name (hashing it would read all of it), a small one its hash."""
    small = np.ones(16)
    assert db._as_dask(small, "b", "w").name == db._as_dask(small, "b", "w").name
    big = np.ones(db._HASH_MAX_BYTES // 8 + 1)
    x, y = db._as_dask(big, "b", "w"), db._as_dask(big, "b", "w")
    assert x.name != y.name
    np.testing.assert_array_equal(x.compute(), big)


# ----------------------------------------------------------------------------
# bench/dask_batched.py: the modelled GPU and batches in flight
# ----------------------------------------------------------------------------

def _bench():
    return load_bench("dask_batched.py", "_bench_dask_throughput")


def test_model_device_queues_in_order_and_waits():
    b = _bench()
    dev = b.ModelDevice()
    t0 = time.monotonic()
    first = dev.queue(0.05)
    second = dev.queue(0.05)
    assert time.monotonic() - t0 < 0.04               # queuing does not wait
    assert second == pytest.approx(first + 0.05)
    dev.wait()
    assert time.monotonic() - t0 >= 0.1 - 1e-3
    dev.wait()                                        # nothing queued: no wait
    assert time.monotonic() - t0 < 0.2


def test_model_device_streams_share_the_device():
    """Per-thread streams: one device's time, each wait for its own stream."""
    import threading
    b = _bench()
    dev = b.ModelDevice(per_thread=True)
    t0 = time.monotonic()
    mine = dev.queue(0.05)
    other = []
    t = threading.Thread(target=lambda: other.append(dev.queue(0.05)))
    t.start()
    t.join()
    assert other[0] == pytest.approx(mine + 0.05)       # after mine: one device
    assert dev.done_at() == mine
    dev.wait()
    assert time.monotonic() - t0 < other[0] - t0       # not for the other stream


@pytest.mark.parametrize("per_thread", [False, True])
def test_model_default_checksum_waits_as_one_stream_does(per_thread):
    """The default call waits for its chunk's factorization, then for its checksum:
    on one stream the first wait is also for another thread's chunk queued in
    between (the two threads then wait together), on per-thread streams not; the
    device does one piece of work at a time either way."""
    import threading
    b = _bench()
    dev = b.ModelDevice(per_thread=per_thread)
    t0 = time.monotonic()
    dev.chunk(0.05)
    t = threading.Thread(target=dev.chunk, args=(0.05,))
    t.start()
    t.join()
    dev.wait()                              # the factorization's wait (status read)
    took = time.monotonic() - t0
    if per_thread:
        assert 0.05 * (1 - b.CHECKSUM_SHARE) - 1e-3 <= took < 0.08
    else:
        assert took >= 0.1 * (1 - b.CHECKSUM_SHARE) - 1e-3
    dev.checksum(wait=True)                 # queued after the other chunk: one device
    assert time.monotonic() - t0 >= 0.1 - 1e-3


def test_model_chunk_and_total():
    """A modelled chunk is its first matrix, its work queued on the process's
    device; the async checksum carries when that work is done and total waits
    for it."""
    b = _bench()
    b.model_device.cache_clear()
    t0 = time.monotonic()
    a = b.make_chunk(5, size=1000, n=4, dt="float64", gpu=False, model=5e-5)
    np.testing.assert_array_equal(a, b.make_chunk(5, size=1, n=4, dt="float64", gpu=False))
    lu, piv = g.lu_factor_batched(a)
    part = b.checksum_async(lu, piv, model=True)
    assert part.shape == (1, 1, 2) and part[0, 0, 1] >= t0 + 0.05
    assert time.monotonic() - t0 < 0.04
    assert b.total(part, part) == pytest.approx(2 * part[0, 0, 0])
    assert time.monotonic() >= part[0, 0, 1]
    done = b.checksum(lu, piv, model=True)
    assert done[0, 0, 1] == 0 and done[0, 0, 0] == part[0, 0, 0]


def test_bench_batches_in_flight_on_modelled_gpus(tmp_path):
    """Two CPU workers with modelled GPUs, one batch and two in flight: every
    batch's sum is the direct run's, each chunk one task, times per batch."""
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "dask_batched.py"), "--cpu",
                        "--model-gpu", "1e-5", "--workers", "2",
                        "--call", "default,async,async_read", "--count", "800", "--n", "4", "--chunk", "100", "--reps", "1",
                        "--batches", "1,2", "--saturation", "inf", "--json", str(out),
                        "--max-seconds", "150"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "equal: True" in p.stdout
    res = json.loads(out.read_text())
    direct = {d["call"]: d for d in res["direct"]}
    assert direct["default"]["median_s"] >= 800 * 1e-5          # the modelled work
    assert sorted((r["call"], r["batches"]) for r in res["rows"]) == \
        [("async", 1), ("async", 2), ("async_read", 1), ("async_read", 2),
         ("default", 1), ("default", 2)]
    assert res["task_functions_from"] == "dask_batched"      # by reference, not __main__
    for r in res["rows"]:
        assert r["checksum"] == pytest.approx(direct["default"]["checksum"], rel=1e-12)
        assert r["checksums_equal"] and r["chunks"] == 8
        # one task per chunk and one aggregate per batch, no finalize task
        assert sum(d["tasks"] for d in r["worker_idle"].values()) == 9 * r["batches"], r
        assert r["median_s"] > 0 and r["efficiency_vs_direct"] > 0
        t = r["timeline_s"]                       # each step a median of its own
        assert 0 <= t["graph_at_scheduler"] <= t["graph_ready"] <= t["result_in_client"]
        # every chunk and aggregate starts after the first chunk task; the last chunk
        # task may end after the last aggregate (seen on CI's 2-core host with two
        # batches in flight: 38 against 34 ms), which the bench does not explain yet
        assert t["first_task"] <= t["last_chunk_task_end"]
        assert t["first_task"] <= t["last_aggregate_end"]
    # a run without a baseline of its own takes an earlier run's
    again = tmp_path / "c.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "dask_batched.py"), "--cpu",
                        "--model-gpu", "1e-5", "--workers", "1", "--call", "async",
                        "--count", "800", "--n", "4", "--chunk", "100", "--reps", "1",
                        "--no-direct", "--direct-from", str(out), "--json", str(again),
                        "--max-seconds", "100"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    row, = json.loads(again.read_text())["rows"]
    assert row["efficiency_vs_direct"] == pytest.approx(
        direct["async"]["median_s"] / row["median_s"])


_PICKLED_TASKS = r"""
import sys
sys.path.insert(0, {bench!r})
import __main__                  # the script's functions in __main__, as when run directly
__main__.__file__ = {bench!r} + "/dask_batched.py"
src = open(__main__.__file__).read().rsplit('if __name__ == "__main__":', 1)[0]
exec(compile(src, __main__.__file__, "exec"), __main__.__dict__)
import dask
import dask_batched              # the same functions from the module
from dask._task_spec import convert_legacy_graph
from distributed.protocol.pickle import dumps
for where in (dask_batched, __main__):
    g, _ = where.pipeline(1 << 12, 4, 1 << 10, "float64", False, "async", model=1e-9)
    (g,) = dask.optimize(g)
    tasks = convert_legacy_graph(dict(g.__dask_graph__()))
    print(where.__name__, max(len(dumps(t)) for k, t in tasks.items() if "total" not in str(k)))
"""


def test_bench_tasks_pickle_by_reference_not_by_value():
    """What a worker gets per chunk task, as the scheduler pickles it: the bench's
    functions from the module ``dask_batched`` (how its script runs) are names; from
    ``__main__`` (``--tasks-in-main``, a script's own functions) Dask pickles each
    task by value, the functions' code and what they reach, several times larger."""
    p = subprocess.run([sys.executable, "-c", _PICKLED_TASKS.format(bench=str(REPO / "bench"))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    size = {name: int(n) for name, n in (line.split() for line in p.stdout.splitlines())}
    assert size["dask_batched"] * 3 < size["__main__"], size


def _lu_counted_on_the_gpu():
    import cupy as cp
    rng = np.random.default_rng(0)
    a = cp.asarray(_stack(rng, 6, 5))
    lu, piv, info, singular = F._lu_factor_counted(a, True)
    assert not singular
    ref = g.lu_factor_batched(a.get())
    np.testing.assert_allclose(lu.get(), ref[0], rtol=1e-12, atol=1e-12)
    a[4, :, 2] = 0
    lu, piv, info, singular = F._lu_factor_counted(a, True)
    assert singular and int(info[4]) > 0 and int(cp.count_nonzero(info)) == 1
    a[1, 0, 0] = cp.nan
    with pytest.raises(ValueError, match="matrices"):
        F._lu_factor_counted(a, True)
    assert F._lu_factor_counted(a, False)[3]          # no check: still warns for [4]
    assert F._lu_factor_counted(a.astype(cp.complex128), True) is None


@pytest.mark.gpu
def test_lu_counted_on_the_gpu():
    """The counted GPU path: one status read gives the singular flag (and the
    ValueError for NaN with check_finite); complex input is left to the public call."""
    pytest.importorskip("cupy")
    _lu_counted_on_the_gpu()
