#!/usr/bin/env python3
"""Host work per call of every public batched function on CuPy input.

    python3 bench/batched_host.py [--n 8] [--batch 4096] [--calls 200]
                                  [--rounds 3] [--pkg-root DIR] [--tag new]
                                  [--only NAMES] [--json out.json]
                                  [--steps] [--after-wait] [--poll] [--profile]
    python3 bench/batched_host.py --processes 3 --trees base=DIR,new=DIR
                                  [--cpus 2,3] [--json table.json] [worker options]

**Host work of a call** = its wall time on the host (``perf_counter_ns``
around the call) less the time it spends waiting for the device inside its
status read (the stream synchronization, hooked), plus the release of its
result right after it (the pool blocks and arrays it made go back when the
caller drops them: host work that the call causes). It is taken with the
GPU never the bottleneck:

* ``async`` (``return_info=True, check_finite=False``; the solves
  ``check_finite=False``: nothing is read back): a kernel that spins for
  longer than all the calls is queued first, then ``--calls`` calls are made
  back to back, each timed on its own; nothing waits;
* ``default`` (the defaults: each call waits once for its own kernels to
  warn or raise like SciPy; ``block_jacobi`` always does): calls back to
  back on a small batch (``--batch``), so that the kernels end within the
  host's own launch work and the wait is the round trip alone.

Medians over ``--rounds`` rounds of ``--calls`` calls; beside each, a fixed
pure-Python loop (:func:`python_work`) timed the same way in the same
process before every function's rounds: the host's own speed there (a
process on a slow core or a busy host shows it in this column). Also
``block_jacobi`` on 2**20 blocks (``--big``; the call less its 0.7 ms wait:
the first call after a pause runs slower, the host's cold state).

``--processes P --trees tag=DIR,...``: the driver. It runs P rounds, each
one worker process per tree in turn (so a drift of the host falls on both),
each ``taskset -c --cpus`` with its main thread then pinned to the first of
those CPUs (CUDA's threads keep the others) and ``OPENBLAS_NUM_THREADS=1``,
and prints per function and variant the median over the processes of the
per-process medians with their range, per tree, judged against the issue's
30 microseconds (:func:`host_table`).

References measured in each process: an empty Python call,
``cupy.cuda.alloc`` from the pool, ``cupy.ndarray`` on given memory,
``cuLaunchKernel`` of an empty kernel through CuPy's driver binding, CuPy's
call of the same kernel (7 arguments), ``getDevice``.

``--steps``: the host time of each step of a public LU call of this tree;
``--after-wait``: a call and the Python loop timed after waits of four
kinds; ``--poll``: the default calls again with the status read polling
(``STATUS_WAIT = "poll"``); ``--profile``: cProfile of 300 asynchronous LU
calls. ``--pkg-root`` imports ``scipy_gpuqr`` from another tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
extern "C" __global__ void noop(const double *a, double *b, int *c, int *d,
                                long long n, int s, int v) {}
"""


def _median_us(samples_ns) -> float:
    return statistics.median(samples_ns) / 1e3


def python_work(k: int = 300) -> int:
    """A fixed pure-Python workload (no CUDA; about 30 µs): the host's own speed."""
    d, t = {}, 0
    for i in range(k):
        d[i & 15] = i
        t += len(str(i)) + d[i & 15]
    return t


def block_csr(cp, a):
    """The stack ``a`` (batch, n, n) as the block-diagonal CSR matrix of its blocks."""
    import cupyx.scipy.sparse as xsp
    batch, n = a.shape[0], a.shape[-1]
    nn = batch * n
    cols = (cp.arange(nn, dtype=cp.int64)[:, None] // n * n
            + cp.arange(n, dtype=cp.int64)[None, :]).ravel().astype(cp.int32)
    return xsp.csr_matrix((a.ravel(), cols, cp.arange(0, nn * n + 1, n, dtype=cp.int32)),
                          shape=(nn, nn))


class Bench:
    """The inputs of every public call for one n, and the timing of calls
    made back to back."""

    def __init__(self, cp, g, n: int, batch: int):
        self.cp, self.g, self.n, self.batch = cp, g, n, batch
        rng = cp.random.default_rng(7)
        a = rng.standard_normal((batch, n, n))
        a += n * cp.eye(n)
        self.a = a
        self.spd = cp.matmul(a, a.transpose(0, 2, 1))
        self.b = rng.standard_normal((batch, n, 1))
        self.v = rng.standard_normal(n)
        self.lu, self.piv = g.lu_factor_batched(a)
        self.c, _ = g.cho_factor_batched(self.spd)
        self.sizes = cp.full((batch,), n, dtype=cp.int64)
        self.b2 = self.b.reshape(batch, n)
        self.csr = block_csr(cp, a)
        mod = cp.RawModule(code=SPIN)
        self.spin = mod.get_function("spin")
        self.noop = mod.get_function("noop")
        cp.cuda.Device().synchronize()
        # clock rate: cycles per ms, for the spin kernel (kHz; 2 GHz if not told)
        try:
            self.cycles_per_ms = int(cp.cuda.Device().attributes["ClockRate"]) or 2_000_000
        except Exception:  # noqa: BLE001 - an attribute a CUDA version dropped
            self.cycles_per_ms = 2_000_000

    def busy(self, ms: float) -> None:
        """Queue a one-block kernel that spins for ``ms`` milliseconds."""
        self.spin((1,), (1,), (np.int64(self.cycles_per_ms * ms),))

    def calls(self):
        """(name, variant, waits, callable) of every timed public call;
        ``waits``: the call waits for its kernels (its wait is taken out)."""
        g, a, b, v = self.g, self.a, self.b, self.v
        lu, piv, c, spd, sizes = self.lu, self.piv, self.c, self.spd, self.sizes
        csr, n, b2 = self.csr, self.n, self.b2
        return [
            ("lu_factor_batched", "async", False,
             lambda: g.lu_factor_batched(a, check_finite=False, return_info=True)),
            ("lu_factor_batched", "default", True, lambda: g.lu_factor_batched(a)),
            ("lu_solve_batched", "async", False,
             lambda: g.lu_solve_batched((lu, piv), b, check_finite=False)),
            ("lu_solve_batched", "default", True, lambda: g.lu_solve_batched((lu, piv), b)),
            ("solve_batched", "async", False,
             lambda: g.solve_batched(a, b, check_finite=False, return_info=True)),
            ("solve_batched", "default", True, lambda: g.solve_batched(a, b)),
            ("solve_batched b=(n,)", "async", False,
             lambda: g.solve_batched(a, v, check_finite=False, return_info=True)),
            ("inv_batched", "async", False,
             lambda: g.inv_batched(a, check_finite=False, return_info=True)),
            ("inv_batched", "default", True, lambda: g.inv_batched(a)),
            ("cho_factor_batched", "async", False,
             lambda: g.cho_factor_batched(spd, check_finite=False, return_info=True)),
            ("cho_factor_batched", "default", True, lambda: g.cho_factor_batched(spd)),
            ("cho_solve_batched", "async", False,
             lambda: g.cho_solve_batched((c, False), b, check_finite=False)),
            ("cho_solve_batched", "default", True, lambda: g.cho_solve_batched((c, False), b)),
            ("lu_factor_vbatched", "async", False,
             lambda: g.lu_factor_vbatched(a, sizes, check_finite=False, return_info=True)),
            ("lu_factor_vbatched", "default", True, lambda: g.lu_factor_vbatched(a, sizes)),
            ("solve_vbatched", "async", False,
             lambda: g.solve_vbatched(a, b2, sizes, check_finite=False, return_info=True)),
            ("solve_vbatched", "default", True, lambda: g.solve_vbatched(a, b2, sizes)),
            ("inv_vbatched", "async", False,
             lambda: g.inv_vbatched(a, sizes, check_finite=False, return_info=True)),
            ("inv_vbatched", "default", True, lambda: g.inv_vbatched(a, sizes)),
            ("cho_factor_vbatched", "async", False,
             lambda: g.cho_factor_vbatched(spd, sizes, check_finite=False, return_info=True)),
            ("cho_factor_vbatched", "default", True, lambda: g.cho_factor_vbatched(spd, sizes)),
            ("block_jacobi", "check_finite=False", True,
             lambda: g.block_jacobi(csr, n, check_finite=False)),
            ("block_jacobi", "default", True, lambda: g.block_jacobi(csr, n)),
        ]

    def host_calls(self, fn, calls: int, acc, waits: bool):
        """Per call of ``calls`` made back to back: (host ns of the call less
        its wait, ns of the release of its result). A call that does not
        wait is made behind a spin kernel longer than all of them (the GPU
        busy throughout, nothing waits); one that waits is made on this
        small batch with nothing queued (its kernels end within its own
        launch work: the wait is the round trip)."""
        cp = self.cp
        fn()
        fn()
        cp.cuda.Device().synchronize()
        if not waits:
            self.busy(max(5.0, 0.1 * calls))
        pc = time.perf_counter_ns
        call, release = [], []
        for _ in range(calls):
            acc["wait"] = 0
            t0 = pc()
            r = fn()
            t1 = pc()
            del r
            t2 = pc()
            call.append(t1 - t0 - acc["wait"])
            release.append(t2 - t1)
        cp.cuda.Device().synchronize()
        return call, release


def python_ref_us(calls: int) -> float:
    """Median µs of :func:`python_work` over ``calls`` runs back to back."""
    pc = time.perf_counter_ns
    python_work()
    times = []
    for _ in range(calls):
        t0 = pc()
        python_work()
        times.append(pc() - t0)
    return _median_us(times)


def time_function(bench, fn, waits: bool, calls: int, rounds: int, acc) -> dict:
    """Host work of one public call (:meth:`Bench.host_calls`), ``rounds``
    rounds of ``calls``, each after the Python reference (:func:`python_ref_us`)."""
    every, calls_ns, rel_ns, per_round, refs = [], [], [], [], []
    for _ in range(rounds):
        refs.append(python_ref_us(max(20, calls // 4)))
        c, r = bench.host_calls(fn, calls, acc, waits)
        tot = [x + y for x, y in zip(c, r)]
        every += tot
        calls_ns += c
        rel_ns += r
        per_round.append(_median_us(tot))
    return dict(host_us=_median_us(every), call_us=_median_us(calls_ns),
                release_us=_median_us(rel_ns), rounds=per_round,
                ref_us=statistics.median(refs), ref_rounds=refs)


def hook_reads(gc):
    """Time the status reads: ``acc['read']`` (ns in read_status) and, in a
    tree whose reads wait through ``_READER.wait``, ``acc['wait']`` (ns in the
    stream synchronization; else the whole read); returns (acc, has the wait hook)."""
    acc = {"read": 0, "wait": 0}
    real_read = gc.read_status
    reader = getattr(gc, "_READER", None)

    def read(st):
        t0 = time.perf_counter_ns()
        try:
            return real_read(st)
        finally:
            dt = time.perf_counter_ns() - t0
            acc["read"] += dt
            if reader is None:
                acc["wait"] += dt
    gc.read_status = read
    if reader is not None:
        if not reader.ready:
            reader.bind()
        real_wait = reader.wait

        def wait(stream):
            t0 = time.perf_counter_ns()
            try:
                return real_wait(stream)
            finally:
                acc["wait"] += time.perf_counter_ns() - t0
        reader.wait = wait
    return acc, reader is not None


def references(cp, bench, reps: int = 2000):
    """Host µs of the references (median of batches of 100)."""
    from cupy_backends.cuda.api import driver
    a = bench.a
    stream = cp.cuda.get_current_stream()
    kptr = bench.noop.kernel.ptr
    params = np.zeros(8, dtype=np.uint64)
    ptrs = (np.arange(8, dtype=np.uint64) * np.uint64(8) + np.uint64(params.ctypes.data))
    paddr = int(ptrs.ctypes.data)
    out = {}

    def empty():
        return None
    items = [
        ("empty Python call", empty),
        ("cupy.cuda.runtime.getDevice()", cp.cuda.runtime.getDevice),
        ("cupy.cuda.alloc(a.nbytes) from the pool", lambda: cp.cuda.alloc(a.nbytes)),
        ("cupy.ndarray(shape, dtype, memptr)", lambda: cp.ndarray(a.shape, a.dtype,
                                                                  memptr=a.data)),
        ("cuLaunchKernel, empty kernel (driver binding)",
         lambda: driver.launchKernel(kptr, 1, 1, 1, 32, 1, 1, 0, stream.ptr, paddr, 0)),
        ("CuPy call of the empty kernel, 7 args",
         lambda: bench.noop((1,), (32,), (a, a, bench.piv, bench.piv, np.int64(1),
                                          np.int32(1), np.int32(1)))),
    ]
    for name, fn in items:
        try:
            out[name] = timed_loop(cp, fn, reps)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  ref  {name} failed: {type(exc).__name__}: {exc}")
    return out


def timed_loop(cp, fn, reps: int, batch: int = 100, pre=None) -> float:
    """Median µs of ``fn`` timed in batches of ``batch`` calls (``pre()``
    before each batch, not timed)."""
    fn()
    cp.cuda.Device().synchronize()
    meds = []
    for _ in range(max(1, reps // batch)):
        if pre is not None:
            pre()
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        meds.append((time.perf_counter_ns() - t0) / batch)
        cp.cuda.Device().synchronize()
    return statistics.median(meds) / 1e3


def timed_single(cp, fn, reps: int = 200, pre=None) -> float:
    """Median µs of single calls of ``fn``, ``pre()`` (not timed) before each."""
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        if pre is not None:
            pre()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    cp.cuda.Device().synchronize()
    return _median_us(times)


def steps(cp, g, bench, reps: int = 2000):
    """Host µs of each step of a public LU call (this tree's internals)."""
    from scipy_gpuqr.batched import _common as bc
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    from scipy_gpuqr.distributed import _batched_api as api
    a = bench.a
    dev = gc.device_id()
    st = gc.new_status(dev)
    rep = gc.report_args(st)
    call = bg._small_call("lu", a.shape, a.dtype, None, None, None, dev)
    specs, fptr, grid, thr, smem, bsz, stg, vec = call
    lu, piv, info = gc.alloc_outputs(specs)
    values = (a.data.ptr, lu.data.ptr, piv.data.ptr, info.data.ptr, bsz, stg, 1,
              gc.arg_value(rep[0]), rep[1])
    items = [
        ("scipy_gpuqr.lu_factor_batched lookup", lambda: g.lu_factor_batched),
        ("Dask check of the arguments", lambda: api._has_dask((a,), {"check_finite": False})),
        ("cupy_stack(a)", lambda: bc.cupy_stack(a)),
        ("device_id()", gc.device_id),
        ("new_status + report_args", lambda: gc.report_args(gc.new_status(dev))),
        ("_small_call lookup", lambda: bg._small_call("lu", a.shape, a.dtype, None, None,
                                                      None, dev)),
        ("alloc_outputs (lu, piv, info)", lambda: gc.alloc_outputs(specs)),
        ("launch (values given)", lambda: gc.launch(fptr, grid, thr, smem, values)),
        ("driver getrf (alloc + launch)", lambda: bg.getrf(a, report=rep, device=dev)),
        ("read_status (GPU idle)", lambda: gc.read_status(st)),
        ("public async call", lambda: g.lu_factor_batched(a, check_finite=False,
                                                          return_info=True)),
    ]
    out = {}

    def record(name, run):
        try:
            out[name] = run()
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  step {name} failed: {type(exc).__name__}: {exc}")
    for name, fn in items:
        record(name, lambda fn=fn: timed_loop(cp, fn, reps))
    # the status read's pieces, with the GPU busy (a spin queued before each
    # batch of 100) and idle
    r = gc._READER
    if not r.ready:
        r.bind()
    sync = cp.cuda.Device().synchronize
    stream = cp.cuda.get_current_stream().ptr
    pieces = [
        ("memcpyAsync 40 B to pinned",
         lambda: r.copy(int(r.words.ctypes.data), st.ptr, 40, r.kind, stream)),
        ("getrf launch", lambda: gc.launch(fptr, grid, thr, smem, values)),
    ]
    for name, fn in pieces:
        record(f"{name}, GPU busy",
               lambda fn=fn: timed_loop(cp, fn, 1000, pre=lambda: bench.busy(5.0)))
    for name, fn in pieces:
        record(f"{name}, GPU idle", lambda fn=fn: timed_single(cp, fn, 200, pre=sync))
    del lu, piv, info
    return out


def jacobi_steps(cp, g, bench, reps: int = 2000) -> dict:
    """Host µs of each step of block_jacobi's short path (CSR of the bench's
    stack, blocks of n; this tree's internals), medians of batches of 100;
    the launch with the GPU busy, the status read with it idle."""
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    from scipy_gpuqr.batched import _jacobi as J
    A, n = bench.csr, bench.n
    dt = A.dtype
    dev = gc.device_id()
    st = gc.new_status(dev)
    ops = J._csr_operands(A, dt)
    specs, call, _ = J._short_plan(A.shape[0], n, dt, ops[3], dev)
    mem, layout = gc.alloc_layout(specs)
    csr = (ops[0].data.ptr, ops[1].data.ptr, ops[2].data.ptr)
    report = (st.ptr, st.gen << 2)
    Op = J._cupyx_operator()
    make = getattr(Op, "made", Op)
    items = [
        ("device_id()", gc.device_id),
        ("new_status", lambda: gc.new_status(dev)),
        ("_csr_operands", lambda: J._csr_operands(A, dt)),
        ("_short_plan lookup", lambda: J._short_plan(A.shape[0], n, dt, ops[3], dev)),
        ("alloc_layout (pool block) and its release", lambda: gc.alloc_layout(specs)),
        ("cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr),
        ("the operator", lambda: make(cp, A.shape[0], n, dt, None)),
        ("_short_sparse (allocation + launch + closure)",
         lambda: J._short_sparse(A, n, dt, dev, report)),
    ]
    out = {}
    for name, fn in items:
        try:
            out[name] = timed_loop(cp, fn, reps, pre=lambda: bench.busy(2.0))
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  step {name} failed: {type(exc).__name__}: {exc}")
    try:
        out["launch_jacobi_inverse, GPU busy"] = timed_loop(
            cp, lambda: bg.launch_jacobi_inverse(call, n, csr, 0, mem.ptr,
                                                 mem.ptr + layout[1][2], report),
            1000, pre=lambda: bench.busy(5.0))
        out["read_status, GPU idle"] = timed_single(
            cp, lambda: gc.read_status(st), 200, pre=cp.cuda.Device().synchronize)
        sync = cp.cuda.get_current_stream().synchronize
        out["stream synchronization, GPU idle"] = timed_single(
            cp, sync, 200, pre=cp.cuda.Device().synchronize)
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"  jacobi launch/read steps failed: {type(exc).__name__}: {exc}")
    del mem
    return out


def after_wait(cp, g, bench, reps: int = 60, waits=(0.1, 1.0, 6.0)) -> dict:
    """Host µs of one asynchronous LU call and of a pure-Python workload of
    about the same length, each timed right after the host has waited ``w``
    ms in one of four ways: a stream synchronization on a spin kernel of
    ``w`` ms (what a default call's status read does), cudaStreamQuery
    polled until that kernel is done (``STATUS_WAIT = "poll"``), ``time.sleep(w)``
    (the thread off the CPU) and a busy Python loop of ``w`` ms (the thread
    on the CPU throughout); and with no wait (calls back to back). If the
    Python workload slows after a wait as much as the call does, the
    default calls' extra host time is the CPU's state after the wait, not
    the package's code."""
    a = bench.a
    sync = cp.cuda.get_current_stream().synchronize

    def lu():
        g.lu_factor_batched(a, check_finite=False, return_info=True)

    def spin_wait(ms):
        bench.busy(ms)
        sync()

    def sleep_wait(ms):
        time.sleep(ms / 1e3)

    def busy_loop(ms):
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass

    def poll_wait(ms):
        bench.busy(ms)
        stream = cp.cuda.get_current_stream().ptr
        while cp.cuda.runtime.streamQuery(stream) != 0:
            pass

    out = {}
    for what, fn in (("async LU call", lu), ("pure-Python work", python_work)):
        fn()
        fn()
        sync()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t0)
        sync()
        out[f"{what}, back to back"] = _median_us(samples)
        for ms in waits:
            for label, wait in (("stream sync on a spin", spin_wait),
                                ("streamQuery polling on a spin", poll_wait),
                                ("time.sleep", sleep_wait), ("busy Python loop", busy_loop)):
                samples = []
                for _ in range(reps):
                    wait(ms)
                    t0 = time.perf_counter_ns()
                    fn()
                    samples.append(time.perf_counter_ns() - t0)
                    sync()
                out[f"{what}, after {ms:g} ms {label}"] = _median_us(samples)
    return out


def profile(g, bench) -> None:
    import cProfile
    import pstats
    a, cp = bench.a, bench.cp
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        g.lu_factor_batched(a, check_finite=False, return_info=True)
        cp.cuda.Device().synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(15)


#: The issue's bound on a call's host work, µs.
HOST_TARGET_US = 30.0


def host_table(results: list, target: float = HOST_TARGET_US) -> list:
    """Markdown lines of the host work per call across worker processes.

    ``results``: one dict per process (``tag``, ``rows``: ``function``,
    ``variant``, ``host_us``, ``ref_us``). Per function and variant, per tag
    (in the order the tags first appear): the median over the processes of
    their medians and the range; the last tag's median judged against
    ``target``. Last line: the Python reference per tag (each process' median
    over its rows: the host's speed in that process)."""
    tags = list(dict.fromkeys(r["tag"] for r in results))
    keys, cells, refs = [], {}, {t: [] for t in tags}
    for res in results:
        for row in res["rows"]:
            key = (row["function"], row["variant"])
            if key not in cells:
                keys.append(key)
                cells[key] = {t: [] for t in tags}
            cells[key][res["tag"]].append(row["host_us"])
        if res["rows"]:
            refs[res["tag"]].append(statistics.median(r["ref_us"] for r in res["rows"]))

    def cell(values):
        if not values:
            return "-"
        if len(values) == 1:
            return f"{values[0]:.1f}"
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    last = tags[-1] if tags else "-"
    lines = ["| function | variant | " + " | ".join(f"{t} µs" for t in tags)
             + f" | {last} ≤ {target:g} µs |",
             "|---|---|" + "---|" * len(tags) + "---|"]
    for key in keys:
        vals = cells[key][last] if tags else []
        verdict = ("-" if not vals else "met" if statistics.median(vals) <= target
                   else "**missed**")
        lines.append(f"| {key[0]} | {key[1]} | "
                     + " | ".join(cell(cells[key][t]) for t in tags) + f" | {verdict} |")
    lines.append("| Python reference (fixed loop) | back to back | "
                 + " | ".join(cell(refs[t]) for t in tags) + " | |")
    return lines


def drive(args, passthrough: list) -> int:
    """Run the worker processes (``--processes`` rounds over ``--trees``,
    pinned) and print :func:`host_table` of their results."""
    import os
    import subprocess
    import tempfile
    trees = [item.split("=", 1) for item in args.trees.split(",")]
    cpus = args.cpus
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.processes):
            for tag, tree in trees:
                out = Path(tmp) / f"{tag}_{rnd}.json"
                cmd = ([*(["taskset", "-c", cpus] if cpus else []), sys.executable,
                        str(Path(__file__).resolve()), "--pkg-root", tree, "--tag", tag,
                        "--json", str(out)]
                       + (["--pin-main", cpus.split(",")[0].split("-")[0]] if cpus else [])
                       + passthrough)
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=args.worker_timeout)
                print(f"== {tag} process {rnd + 1}: rc {proc.returncode}, "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
                print(proc.stdout[-6000:], flush=True)
                if proc.returncode:
                    print(proc.stderr[-3000:], flush=True)
                if out.exists():
                    results.append(json.loads(out.read_text()))
    print(f"\nhost work per call, µs (the call less its wait, plus the release of its "
          f"result; median over {args.processes} processes per tree of their medians, "
          f"range in brackets; CPUs {cpus or 'not pinned'}):")
    for line in host_table(results):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(results=results,
                                                   table=host_table(results)), indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4096,
                    help="matrices per call (small: the GPU is never the bottleneck)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big", type=int, default=1 << 20,
                    help="block_jacobi also on this many blocks (0: not)")
    ap.add_argument("--pkg-root", help="import scipy_gpuqr from this tree")
    ap.add_argument("--tag", default="new")
    ap.add_argument("--only", help="comma-separated function names to time")
    ap.add_argument("--pin-main", type=int, help="pin the main thread to this CPU "
                    "once CUDA has started (its threads keep the process' CPUs)")
    ap.add_argument("--processes", type=int, default=0,
                    help="driver: this many rounds of worker processes over --trees")
    ap.add_argument("--trees", default="new=.", help="driver: tag=DIR,...")
    ap.add_argument("--cpus", default="", help="driver: taskset CPU list of the workers")
    ap.add_argument("--worker-timeout", type=float, default=120.0)
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--poll", action="store_true",
                    help="the default calls again with the status read polling")
    ap.add_argument("--after-wait", action="store_true",
                    help="host time of a call and of pure-Python work after waits of "
                         "four kinds (why the first call after a pause is slower)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.processes:
        keep = []
        for opt in ("n", "batch", "calls", "rounds", "big", "only"):
            val = getattr(args, opt)
            if val is not None:
                keep += [f"--{opt}", str(val)]
        return drive(args, keep)
    sys.path.insert(0, str(Path(args.pkg_root).resolve() if args.pkg_root
                           else Path(__file__).resolve().parents[1]))
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr.batched import _gpu_common as gc
    from scipy_gpuqr._gpu import gpu_info

    bench = Bench(cp, g, args.n, args.batch)
    if args.pin_main is not None:
        import os
        os.sched_setaffinity(0, {args.pin_main})      # this thread only
    acc, _ = hook_reads(gc)
    print(f"device: {gpu_info().get('name')}  [{args.tag}: scipy_gpuqr from "
          f"{Path(g.__file__).resolve().parent}]  n={args.n} batch={args.batch}, "
          f"{args.calls} calls x {args.rounds} rounds", flush=True)
    refs = references(cp, bench)
    for name, us in refs.items():
        print(f"  ref  {name:48} {us:7.1f} us", flush=True)
    only = set(args.only.split(",")) if args.only else None
    print("host us: the call less its wait plus its result's release (median; the rounds' "
          "medians); call / release alone; the Python reference before each round")
    rows = []

    def record(name, variant, fn, waits, batch):
        try:
            r = time_function(bench, fn, waits, args.calls, args.rounds, acc)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{args.tag:5} {name:22} {variant:18} failed: {type(exc).__name__}: "
                  f"{str(exc)[:160]}", flush=True)
            return
        r.update(tag=args.tag, function=name, variant=variant, n=args.n, batch=batch)
        rows.append(r)
        print(f"{args.tag:5} {name:22} {variant:18} {r['host_us']:7.1f}  ("
              + " ".join(f"{x:.1f}" for x in r["rounds"])
              + f")  call {r['call_us']:6.1f} release {r['release_us']:5.1f}  "
              f"py {r['ref_us']:5.1f}", flush=True)

    for name, variant, waits, fn in bench.calls():
        if only and name.split(" ")[0] not in only:
            continue
        record(name, variant, fn, waits, args.batch)
    if args.big and (not only or "block_jacobi" in only):
        rng = cp.random.default_rng(8)
        a = rng.standard_normal((args.big, args.n, args.n))
        a += args.n * cp.eye(args.n)
        csr = block_csr(cp, a)
        del a
        record("block_jacobi", f"default, {args.big} blocks",
               lambda: g.block_jacobi(csr, args.n), True, args.big)
        del csr
        cp.get_default_memory_pool().free_all_blocks()
    out = dict(tag=args.tag, references=refs, rows=rows)
    if args.poll and hasattr(gc, "STATUS_WAIT"):
        saved = gc.STATUS_WAIT
        gc.STATUS_WAIT = "poll"
        try:
            for name, variant, waits, fn in bench.calls():
                if waits and not (only and name.split(" ")[0] not in only):
                    r = time_function(bench, fn, waits, args.calls, 1, acc)
                    print(f"{args.tag:5} {name:22} {variant + ' poll':18} "
                          f"{r['host_us']:7.1f}", flush=True)
        finally:
            gc.STATUS_WAIT = saved
    if args.steps:
        st = steps(cp, g, bench)
        print("steps of a public LU call (us, median of batches of 100):")
        for name, us in st.items():
            print(f"  {name:40} {us:7.2f}", flush=True)
        out["steps"] = st
        if not only or "block_jacobi" in only:
            try:
                js = jacobi_steps(cp, g, bench)
            except Exception as exc:  # noqa: BLE001 - another tree's internals
                print(f"  block_jacobi steps failed: {type(exc).__name__}: {exc}")
                js = {}
            print("steps of block_jacobi's short path (us, median of batches of 100):")
            for name, us in js.items():
                print(f"  {name:48} {us:7.2f}", flush=True)
            out["jacobi_steps"] = js
    if args.after_wait:
        aw = after_wait(cp, g, bench)
        print("after a wait (us, median; the call: async LU; the work: pure Python):")
        for name, us in aw.items():
            print(f"  {name:60} {us:8.1f}", flush=True)
        out["after_wait"] = aw
    if args.profile:
        profile(g, bench)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
