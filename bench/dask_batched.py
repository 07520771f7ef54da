#!/usr/bin/env python3
"""Batched LU over Dask GPU workers: throughput on 1, 2 and 4 GPUs against one.

    python3 bench/dask_batched.py [--count 16777216] [--n 32] [--chunk 1048576]
                                  [--workers 1,2,4] [--dtype float64] [--reps 3]
                                  [--json out.json]
    python3 bench/dask_batched.py --quick --json out.json   # 2**22 on 1 and 2 GPU workers
    python3 bench/dask_batched.py --cpu [--count 65536 --n 8 --chunk 8192]   # smoke test
    python3 bench/dask_batched.py --cpu --pinned --workers 2   # the pinned cluster, no GPU

The work: ``count`` random ``n x n`` matrices (``n`` added to the diagonal)
as a Dask array of CuPy chunks of ``chunk`` matrices, each
chunk generated on the GPU of the worker that factorizes it (2**24 float64
32 x 32 matrices are 128 GiB, more than one GPU holds: the data never exists
all at once), ``scipy_gpuqr.lu_factor_batched`` of the Dask array (its
default call: one task per chunk, each warning about singular matrices like
the NumPy call), and a per-chunk checksum of ``lu`` and ``piv`` brought to
the client, which is what the timed ``compute()`` waits for.

Workers: one per GPU, a single thread each — dask-cuda's
``LocalCUDACluster`` when ``dask_cuda`` is installed, else a ``SpecCluster``
of ``Nanny`` workers each started with ``CUDA_VISIBLE_DEVICES`` set to its
GPU (what LocalCUDACluster does; ``--pinned`` forces it), each worker
reporting the PCI bus id of the GPU it sees. Per worker count: the cluster is started,
every worker compiles the kernels and fills its memory pool (one untimed
chunk on each worker, then one untimed run of one chunk per worker), then ``--reps`` timed runs of the
whole count; the median wall time of ``compute()`` gives the throughput.
Baselines in the same run, without Dask, on the first GPU: the same
chunks generated, factorized and summed one after another in this process
(``direct``), and of that the LU calls alone (CUDA events, ``lu only``).

``--cpu`` runs the same pipeline on NumPy chunks over CPU worker processes
(for checking the script where there is no GPU; its numbers mean nothing
for the GPU question).

``--max-seconds T``: the client and every worker dump the stacks of all
their threads after ``T`` seconds (``faulthandler``); then the client kills
its worker processes (a killed client leaves them running: they held a GPU
and the disk while the next command ran) and exits. A hang shows where it
waits instead of ending without output. Each step prints the seconds since
the start.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

import numpy as np  # noqa: E402

#: the scheduler and workers listen here: one host, no network needed
HOST = "127.0.0.1"

#: what --quick runs (2**22 float64 32 x 32 matrices are 32 GiB: 16 chunks of 2 GiB)
QUICK = {"count": 1 << 22, "n": 32, "chunk": 1 << 18, "workers": "1,2", "reps": 3}

# ----------------------------------------------------------------------------
# run on the workers (and by the direct baseline)
# ----------------------------------------------------------------------------


def make_chunk(seed, *, size: int, n: int, dt: str, gpu: bool, block_info=None):
    """``size`` random ``n x n`` matrices plus ``n`` on the diagonal, made where it runs.

    ``seed``: an int; with ``block_info`` (a Dask ``map_blocks`` call without
    input arrays) the seed is ``seed`` plus the chunk's index and the size is
    the chunk's.
    """
    if gpu:
        import cupy as xp
    else:
        xp = np
    if block_info is not None:
        size = block_info[None]["chunk-shape"][0]
        seed = seed + block_info[None]["chunk-location"][0]
    a = xp.random.default_rng(int(seed)).standard_normal((size, n, n), dtype=np.dtype(dt))
    i = xp.arange(n)
    a[:, i, i] += n
    return a


def checksum(lu, piv):
    """One host float per chunk (the trace of every ``lu`` and the pivots, summed),
    shaped ``(1, 1, 1)``, read with one wait.

    Summed per matrix first, then over the chunk: CuPy reduces a whole array
    to one value with a single thread block, which on a chunk's 2**24 strided
    diagonal entries takes milliseconds; per matrix the first pass has a block
    per few matrices.
    """
    per = lu.diagonal(axis1=1, axis2=2).sum(axis=1) + piv.sum(axis=1, dtype=lu.dtype)
    return np.full((1, 1, 1), float(per.sum()))


def warm(n: int, dtype: str, size: int, gpu: bool) -> str:
    """Compile the kernels and fill this worker's memory pool with one chunk's needs;
    returns what this worker sees (its ``CUDA_VISIBLE_DEVICES`` and its GPU's PCI bus
    id, which tells physical GPUs apart)."""
    import scipy_gpuqr as gq
    a = make_chunk(0, size=size, n=n, dt=dtype, gpu=gpu)
    lu, piv = gq.lu_factor_batched(a)
    checksum(lu, piv)
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
    if gpu:
        import cupy
        seen += f" bus {cupy.cuda.Device().pci_bus_id} of {cupy.cuda.runtime.getDeviceCount()}"
    return seen


def arm_stack_dump(seconds: float) -> str:
    """Dump every thread's stack to stderr after ``seconds`` (this process; the
    process goes on). Run on the workers through ``Client.run``."""
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=False, file=sys.stderr)
    return f"pid {os.getpid()}"


_T0 = time.perf_counter()


def _bail(seconds: float) -> None:
    """After ``seconds``: every thread's stack, the child processes killed, exit 3."""
    def go():
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            import psutil
            for c in psutil.Process().children(recursive=True):
                c.kill()
        except Exception as exc:           # noqa: BLE001 - exiting anyway
            print(f"could not kill the workers: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    t = threading.Timer(seconds, go)
    t.daemon = True
    t.start()
    # should the GIL never come back to that timer, dump and exit from C
    faulthandler.dump_traceback_later(seconds + 15, exit=True, file=sys.stderr)


def _say(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f} s] {msg}", flush=True)


# ----------------------------------------------------------------------------
# the Dask pipeline
# ----------------------------------------------------------------------------

def pipeline(count: int, n: int, chunk: int, dtype: str, gpu: bool, seed0: int = 1):
    """The Dask graph: generated chunks -> lu_factor_batched -> per-chunk checksums, summed."""
    import dask.array as da

    import scipy_gpuqr as gq
    sizes = [chunk] * (count // chunk) + ([count % chunk] if count % chunk else [])
    if gpu:
        import cupy
        meta = cupy.empty((0, 0, 0), dtype=dtype)
    else:
        meta = np.empty((0, 0, 0), dtype=dtype)
    # no input array: the chunk's seed and size come from block_info, so the
    # generation is a blockwise layer with no data or task of its own
    a = da.map_blocks(make_chunk, seed=seed0, size=chunk, n=n, dt=dtype, gpu=gpu,
                      chunks=(tuple(sizes), (n,), (n,)), dtype=dtype, meta=meta)
    lu, piv = gq.lu_factor_batched(a)
    # indexed like lu (one element per chunk, no axis contracted): Dask fuses the
    # pick of lu and piv from the factorization's task and the reduction's first
    # step into this task
    sums = da.blockwise(checksum, "zij", lu, "zij", piv, "zi", dtype=np.float64,
                        adjust_chunks={"z": 1, "i": 1, "j": 1}, concatenate=True,
                        meta=np.empty((0, 0, 0), np.float64))
    # one aggregate of every chunk's sum (Dask's tree reduction would add a
    # task per few chunks)
    return sums.sum(split_every={0: max(len(sizes), 2), 1: 2, 2: 2}), len(sizes)


def gpu_ids(gpu: bool, limit: int) -> list[str]:
    if not gpu:
        return [str(i) for i in range(limit)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v.strip() for v in visible.split(",") if v.strip()]
    import cupy
    return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def pinned_cluster(ids: list[str], threads: int = 1):
    """A ``SpecCluster`` of one single-threaded ``Nanny`` worker process per id, each
    started with ``CUDA_VISIBLE_DEVICES`` set to its id (what dask-cuda's
    ``LocalCUDACluster`` does): the worker's CUDA context (made when its first task
    imports CuPy) sees that one GPU as device 0."""
    from dask.distributed import Nanny, Scheduler, SpecCluster
    # memory_limit 0: no host-memory management. Its default ("auto": the host's
    # memory times nthreads / cores, 8 GiB of 512 on a 64-core host) counts the CuPy
    # chunks too and spilled them, pickled, to disk: minutes per run
    workers = {f"gpu{d}": {"cls": Nanny,
                           "options": {"nthreads": threads, "host": HOST, "memory_limit": 0,
                                       "env": {"CUDA_VISIBLE_DEVICES": str(d)}}}
               for d in ids}
    return SpecCluster(workers=workers,
                       scheduler={"cls": Scheduler,
                                  "options": {"dashboard_address": ":0", "host": HOST}})


def start_cluster(ids: list[str], gpu: bool, pinned: bool = False, threads: int = 1):
    """(cluster, kind): one single-threaded worker per id (GPU or CPU process).

    ``pinned``: the :func:`pinned_cluster` even where dask_cuda is installed (or,
    with CPU chunks, to check it without a GPU)."""
    if pinned:
        return pinned_cluster(ids, threads), "SpecCluster of Nanny workers, CUDA_VISIBLE_DEVICES per worker"
    if not gpu:
        from dask.distributed import LocalCluster
        return LocalCluster(n_workers=len(ids), threads_per_worker=threads, processes=True,
                            host=HOST, dashboard_address=":0"), "LocalCluster (CPU processes)"
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return pinned_cluster(ids, threads), "SpecCluster of Nanny workers, CUDA_VISIBLE_DEVICES per worker"
    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(ids), threads_per_worker=threads,
                            host=HOST, dashboard_address=":0",
                            memory_limit=0), "dask_cuda.LocalCUDACluster"


def run_workers(k: int, ids: list[str], args, gpu: bool) -> dict:
    from dask.distributed import Client, get_task_stream
    t0 = time.perf_counter()
    _say(f"{k} worker(s): starting the cluster")
    import dask
    # the scheduler runs in this process: its root-task queuing follows this setting
    with dask.config.set({"distributed.scheduler.worker-saturation": args.saturation}):
        cluster, kind = start_cluster(ids[:k], gpu, args.pinned, args.threads)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(k, timeout=120)
        t_start = time.perf_counter() - t0
        _say(f"{k} worker(s): {kind} up in {t_start:.1f} s")
        if args.max_seconds:
            left = args.max_seconds - (time.perf_counter() - _T0)
            client.run(arm_stack_dump, max(left - 2, 1))
        seen = client.gather([client.submit(warm, args.n, args.dtype, args.chunk, gpu,
                                            workers=[w], pure=False)
                              for w in client.scheduler_info()["workers"]])
        _say(f"{k} worker(s): warm ({seen})")
        warmup, _ = pipeline(k * args.chunk, args.n, args.chunk, args.dtype, gpu, seed0=10**6)
        warmup.compute()
        _say(f"{k} worker(s): warm-up run done")
        total, nchunks = pipeline(args.count, args.n, args.chunk, args.dtype, gpu)
        times, values = [], []
        for rep in range(args.reps):
            with get_task_stream(client) as stream:
                w0 = time.time()
                t0 = time.perf_counter()
                values.append(float(total.compute()))
                times.append(time.perf_counter() - t0)
                w1 = time.time()
            if rep == args.reps - 1:
                phases = task_phases(stream.data, k)
                idle = worker_idle(stream.data, w0, w1, nchunks)
        _say(f"{k} worker(s): timed runs {['%.3f' % x for x in times]} s")
        _say(f"{k} worker(s): seconds per worker in the last run, by task and action: "
             + ", ".join(f"{name} {sec:.3f}" for name, sec in phases.items()))
        _say(f"{k} worker(s): last run per worker: " + "; ".join(
            f"{w}: {d['tasks']} tasks ({d['tasks_per_chunk']:.2f} per chunk), busy "
            f"{d['busy_s']:.3f} s, no task running {d['idle_s']:.3f} s of {d['wall_s']:.3f} "
            f"({1e3 * d['idle_per_chunk_s']:.2f} ms per chunk; between tasks median "
            f"{1e3 * d['gap_median_s']:.2f} ms, max {1e3 * d['gap_max_s']:.2f} ms; before "
            f"the first {1e3 * d['lead_s']:.1f} ms, after the last {1e3 * d['tail_s']:.1f} ms)"
            for w, d in idle.items()))
    if gpu and len(set(s.split(" bus ")[-1] for s in seen)) != len(seen):
        print(f"  WARNING: workers share a GPU: {seen}", flush=True)
    return {"workers": k, "cluster": kind, "devices": sorted(seen),
            "start_seconds": t_start, "chunks": nchunks, "times_s": times,
            "median_s": statistics.median(times),
            "checksum": values[0], "task_phases_s": phases, "worker_idle": idle,
            "saturation": args.saturation, "threads": args.threads,
            "checksums_equal": max(values) - min(values) <= 1e-12 * abs(values[0])}


def worker_idle(records, t0: float, t1: float, nchunks: int) -> dict:
    """Per worker, of one ``compute()`` from ``t0`` to ``t1`` (``time.time()``,
    the workers' clock on this host): its tasks, the seconds in which it ran
    one (the union of their compute intervals) and in which it ran none, per
    chunk, and the gaps between one task's end and the next one's start. A GPU
    worker's idle time is time its GPU waits, unless the last task left work
    queued on the device."""
    by: dict = {}
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss["action"] == "compute":
                by.setdefault(rec.get("worker", "?"), []).append((ss["start"], ss["stop"]))
    out = {}
    workers = max(len(by), 1)
    for w, spans in sorted(by.items()):
        spans.sort()
        busy, end, gaps = 0.0, None, []
        for a, b in spans:
            if end is not None:
                gaps.append(max(a - end, 0.0))
            lo = a if end is None else max(a, end)
            busy += max(b - lo, 0.0)
            end = b if end is None else max(end, b)
        wall = t1 - t0
        out[w] = {"tasks": len(spans), "tasks_per_chunk": len(spans) * workers / max(nchunks, 1),
                  "busy_s": busy, "wall_s": wall, "idle_s": wall - busy,
                  "idle_per_chunk_s": (wall - busy) * workers / max(nchunks, 1),
                  "gap_median_s": statistics.median(gaps) if gaps else 0.0,
                  "gap_max_s": max(gaps, default=0.0),
                  "lead_s": spans[0][0] - t0, "tail_s": t1 - end}
    return out


def task_phases(records, workers: int) -> dict:
    """Seconds per worker of one ``compute()`` by task name and action (``compute``,
    ``transfer``, ``disk-read``...), from Dask's task stream: where a worker's wall
    time goes, against the direct run's per-chunk costs."""
    from dask.utils import key_split
    sums: dict = {}
    for rec in records:
        for ss in rec.get("startstops", ()):
            name = f"{key_split(rec['key'])}:{ss['action']}"
            sums[name] = sums.get(name, 0.0) + (ss["stop"] - ss["start"]) / workers
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def run_direct(args, gpu: bool) -> dict:
    """The same chunks one after another in this process, no Dask (first GPU)."""
    import scipy_gpuqr as gq
    sizes = [args.chunk] * (args.count // args.chunk) + \
        ([args.count % args.chunk] if args.count % args.chunk else [])
    warm(args.n, args.dtype, args.chunk, gpu)
    walls, lus, makes, calls, sums, value = [], [], [], [], [], 0.0
    if gpu:
        import cupy
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(args.reps):
        value, lu_s, make_s, call_s, sum_s = 0.0, 0.0, 0.0, 0.0, 0.0
        t0 = time.perf_counter()
        for i, s in enumerate(sizes):
            t1 = time.perf_counter()
            a = make_chunk(1 + i, size=s, n=args.n, dt=args.dtype, gpu=gpu)
            if gpu:
                cupy.cuda.get_current_stream().synchronize()
            make_s += time.perf_counter() - t1
            if gpu:
                start.record()
            t1 = time.perf_counter()
            lu, piv = gq.lu_factor_batched(a)
            if gpu:
                stop.record()
                stop.synchronize()
                lu_s += cupy.cuda.get_elapsed_time(start, stop) / 1e3
            else:
                lu_s += time.perf_counter() - t1
            call_s += time.perf_counter() - t1
            t1 = time.perf_counter()
            value += float(checksum(lu, piv).sum())
            sum_s += time.perf_counter() - t1
            del a, lu, piv
        walls.append(time.perf_counter() - t0)
        lus.append(lu_s)
        makes.append(make_s)
        calls.append(call_s)
        sums.append(sum_s)
    if gpu:
        cupy.get_default_memory_pool().free_all_blocks()
    return {"median_s": statistics.median(walls), "lu_only_s": statistics.median(lus),
            "make_chunks_s": statistics.median(makes),
            "lu_calls_wall_s": statistics.median(calls),
            "checksums_s": statistics.median(sums), "checksum": value}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=None, help="matrices (default 2**24; --cpu 2**16)")
    p.add_argument("--n", type=int, default=None, help="order (default 32; --cpu 8)")
    p.add_argument("--chunk", type=int, default=None,
                   help="matrices per chunk (default 2**20; --cpu 2**13)")
    p.add_argument("--workers", default="1,2,4", help="worker counts (capped at the GPUs)")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="NumPy chunks on CPU worker processes")
    p.add_argument("--no-direct", action="store_true", help="skip the no-Dask baseline")
    p.add_argument("--pinned", action="store_true",
                   help="Nanny workers with CUDA_VISIBLE_DEVICES each even if dask_cuda exists")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['count']} matrices in chunks of {QUICK['chunk']} over "
                        f"{QUICK['workers']} worker(s), {QUICK['reps']} repetitions")
    p.add_argument("--saturation", type=float, default=1.1,
                   help="distributed.scheduler.worker-saturation (Dask's default 1.1: a "
                        "worker holds at most ceil(1.1 x threads) root tasks, each further "
                        "one sent after one finished; inf: all at once)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="dump every thread's stack (client and workers) and exit after this")
    args = p.parse_args(argv)
    if args.max_seconds:
        _bail(args.max_seconds)
    if args.quick and args.cpu:
        p.error("--quick is sized for GPU workers (32 GiB of matrices); drop --cpu")
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) in (None, p.get_default(key)):
                setattr(args, key, value)
    # the workers inherit this: Dask's INFO lines would bury the table
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    gpu = not args.cpu
    args.count = args.count or (1 << 24 if gpu else 1 << 16)
    args.n = args.n or (32 if gpu else 8)
    args.chunk = args.chunk or (1 << 20 if gpu else 1 << 13)
    wanted = [int(w) for w in args.workers.split(",")]
    ids = gpu_ids(gpu, max(wanted))
    counts = [k for k in wanted if k <= len(ids)]
    skipped = [k for k in wanted if k > len(ids)]
    device = "CPU"
    if gpu:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        device = name.decode() if isinstance(name, bytes) else str(name)
    print(f"device: {device} x {len(ids)} visible; {args.count} matrices {args.n}x{args.n} "
          f"{args.dtype}, chunks of {args.chunk}; median of {args.reps}; {args.threads} "
          f"thread(s) per worker, worker-saturation {args.saturation}", flush=True)
    import scipy_gpuqr
    print(f"scipy_gpuqr from {Path(scipy_gpuqr.__file__).parent}", flush=True)
    if skipped:
        print(f"skipped worker counts {skipped}: only {len(ids)} devices", flush=True)
    rows = []
    for k in counts:
        rows.append(run_workers(k, ids, args, gpu))
        if args.json:                   # after each count: a run cut short keeps the rest
            Path(args.json).write_text(json.dumps({"device": device, "args": vars(args),
                                                   "rows": rows, "direct": None}, indent=1))
        r = rows[-1]
        print(f"  {k} worker(s): {r['median_s'] * 1e3:9.1f} ms  ({r['cluster']}; "
              f"devices {r['devices']}; checksums equal: {r['checksums_equal']})", flush=True)
    direct = None if args.no_direct else run_direct(args, gpu)
    if direct:
        _say(f"direct run (no Dask): {direct['median_s']:.3f} s")
    base = next((r for r in rows if r["workers"] == 1), None)
    print("\n| workers | wall ms | Mmatrices/s | speedup vs 1 worker | efficiency | "
          "efficiency vs direct one GPU |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        sp = base["median_s"] / r["median_s"] if base else float("nan")
        r["matrices_per_s"] = args.count / r["median_s"]
        r["speedup"], r["efficiency"] = sp, sp / r["workers"]
        eff_d = (direct["median_s"] / r["median_s"] / r["workers"]) if direct else float("nan")
        r["efficiency_vs_direct"] = eff_d
        print(f"| {r['workers']} | {r['median_s'] * 1e3:.1f} | {r['matrices_per_s'] / 1e6:.1f} | "
              f"{sp:.2f} | {sp / r['workers']:.2f} | {eff_d:.2f} |")
    if direct:
        print(f"| direct (no Dask, one {'GPU' if gpu else 'process'}) | {direct['median_s'] * 1e3:.1f} | "
              f"{args.count / direct['median_s'] / 1e6:.1f} | | | |")
        print(f"| of which LU calls only | {direct['lu_only_s'] * 1e3:.1f} | "
              f"{args.count / direct['lu_only_s'] / 1e6:.1f} | | | |")
        print(f"| of which making the chunks | {direct['make_chunks_s'] * 1e3:.1f} | | | | |")
        print(f"| of which LU calls, host wall (their GPU work awaited) | "
              f"{direct['lu_calls_wall_s'] * 1e3:.1f} | | | | |")
        print(f"| of which checksums | {direct['checksums_s'] * 1e3:.1f} | | | | |")
        same = all(abs(r["checksum"] - direct["checksum"]) <= 1e-9 * abs(direct["checksum"])
                   for r in rows)
        print(f"checksums of the Dask runs equal the direct run's: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "args": vars(args),
                                               "rows": rows, "direct": direct}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
