#!/usr/bin/env python3
"""Host work of the public batched calls on CuPy input, and where it goes.

    python3 bench/batched_host.py [--n 8] [--batch 1048576] [--calls 200]
                                  [--rounds 5] [--pkg-root DIR] [--tag after]
                                  [--steps] [--profile] [--json out.json]

Per public function (``scipy_gpuqr.<name>`` looked up on every call, as a
caller who writes ``g.lu_factor_batched(a)`` does) and per variant:

* ``async``: ``return_info=True, check_finite=False`` (the solves:
  ``check_finite=False``), which reads nothing back. A kernel that spins for
  a while is queued first, then ``--calls`` calls are timed one by one
  (``perf_counter_ns`` around each), so that every call finds the GPU busy
  and nothing on the host waits; the median over all calls of ``--rounds``
  rounds, and the rounds' medians' spread.
* ``default``: the defaults (one 32-byte status read, a wait for the
  call's kernels): the call's time less its wait, median of ``--calls`` / 4
  (at least 50) calls, twice: less the stream synchronization in the read
  (``-sync``; a tree without the hook: the whole read) and less the whole
  read (``-read``); with the GPU idle when the call starts, and busy (a spin
  of 0.3 ms queued before it). The ``*_vbatched`` functions of a tree
  without the one-kernel path of padded stacks (n <= 32) are timed this way
  (idle) in both variants: they read their size classes first (one small
  copy, a wait that stays in their time).

References measured in the same process (the host's speed): an empty
Python call, ``cupy.cuda.alloc`` from the pool, ``cupy.ndarray`` on given
memory, ``cuLaunchKernel`` of an empty kernel through CuPy's driver binding,
CuPy's call of the same empty kernel (7 arguments), ``getDevice``.

``--steps``: the host time of each step of a public LU call of this tree
(median of 2000 in batches of 100), and of the status read's pieces with the
GPU busy and idle; ``--profile``: cProfile of 300
asynchronous LU calls (top 15 by own time). ``--pkg-root`` imports
``scipy_gpuqr`` from another tree (before/after in one run).
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


class Bench:
    """The inputs of every public call for one n, and the busy-GPU timing."""

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
        self._csr = None
        mod = cp.RawModule(code=SPIN)
        self.spin = mod.get_function("spin")
        self.noop = mod.get_function("noop")
        cp.cuda.Device().synchronize()
        # clock rate: cycles per ms, for the spin kernel (kHz; 2 GHz if not told)
        try:
            self.cycles_per_ms = int(cp.cuda.Device().attributes["ClockRate"]) or 2_000_000
        except Exception:  # noqa: BLE001 - an attribute a CUDA version dropped
            self.cycles_per_ms = 2_000_000

    @property
    def csr(self):
        """The stack as a block-diagonal CSR matrix (made when first used)."""
        if self._csr is None:
            import cupyx.scipy.sparse as xsp
            cp, n = self.cp, self.n
            nn = self.batch * n
            cols = (cp.arange(nn, dtype=cp.int64)[:, None] // n * n
                    + cp.arange(n, dtype=cp.int64)[None, :]).ravel().astype(cp.int32)
            self._csr = xsp.csr_matrix(
                (self.a.ravel(), cols, cp.arange(0, nn * n + 1, n, dtype=cp.int32)),
                shape=(nn, nn))
        return self._csr

    def busy(self, ms: float) -> None:
        """Queue a one-block kernel that spins for ``ms`` milliseconds."""
        self.spin((1,), (1,), (np.int64(self.cycles_per_ms * ms),))

    def calls(self):
        """(name, variant, callable) of every timed public call."""
        g, a, b, v = self.g, self.a, self.b, self.v
        lu, piv, c, spd, sizes = self.lu, self.piv, self.c, self.spd, self.sizes
        return [
            ("lu_factor_batched", "async",
             lambda: g.lu_factor_batched(a, check_finite=False, return_info=True)),
            ("lu_factor_batched", "default", lambda: g.lu_factor_batched(a)),
            ("inv_batched", "async",
             lambda: g.inv_batched(a, check_finite=False, return_info=True)),
            ("inv_batched", "default", lambda: g.inv_batched(a)),
            ("solve_batched", "async",
             lambda: g.solve_batched(a, b, check_finite=False, return_info=True)),
            ("solve_batched", "default", lambda: g.solve_batched(a, b)),
            ("solve_batched b=(n,)", "async",
             lambda: g.solve_batched(a, v, check_finite=False, return_info=True)),
            ("cho_factor_batched", "async",
             lambda: g.cho_factor_batched(spd, check_finite=False, return_info=True)),
            ("cho_factor_batched", "default", lambda: g.cho_factor_batched(spd)),
            ("lu_solve_batched", "async",
             lambda: g.lu_solve_batched((lu, piv), b, check_finite=False)),
            ("lu_solve_batched", "default", lambda: g.lu_solve_batched((lu, piv), b)),
            ("cho_solve_batched", "async",
             lambda: g.cho_solve_batched((c, False), b, check_finite=False)),
            ("cho_solve_batched", "default", lambda: g.cho_solve_batched((c, False), b)),
            ("inv_vbatched (one order)", "async",
             lambda: g.inv_vbatched(a, sizes, check_finite=False, return_info=True)),
            ("inv_vbatched (one order)", "default", lambda: g.inv_vbatched(a, sizes)),
            ("lu_factor_vbatched (one order)", "async",
             lambda: g.lu_factor_vbatched(a, sizes, check_finite=False, return_info=True)),
            ("lu_factor_vbatched (one order)", "default",
             lambda: g.lu_factor_vbatched(a, sizes)),
            ("solve_vbatched (one order)", "async",
             lambda: g.solve_vbatched(a, self.b2, sizes, check_finite=False,
                                      return_info=True)),
            ("solve_vbatched (one order)", "default",
             lambda: g.solve_vbatched(a, self.b2, sizes)),
            ("cho_factor_vbatched (one order)", "async",
             lambda: g.cho_factor_vbatched(spd, sizes, check_finite=False,
                                           return_info=True)),
            ("cho_factor_vbatched (one order)", "default",
             lambda: g.cho_factor_vbatched(spd, sizes)),
            ("block_jacobi (CSR)", "async",
             lambda: g.block_jacobi(self.csr, self.n, check_finite=False)),
            ("block_jacobi (CSR)", "default", lambda: g.block_jacobi(self.csr, self.n)),
        ]

    def host_async(self, fn, calls: int, rounds: int):
        """(median µs over all calls, list of the rounds' medians), the GPU busy."""
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        every, per_round = [], []
        for _ in range(rounds):
            self.busy(20.0)                 # far longer than `calls` calls' host work
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                fn()
                samples.append(time.perf_counter_ns() - t0)
            cp.cuda.Device().synchronize()
            every += samples
            per_round.append(_median_us(samples))
        return _median_us(every), per_round

    def host_default(self, fn, calls: int, acc, busy_ms: float = 0.0):
        """Medians (µs) of the call less its wait in the status read's stream
        synchronization, and less the whole status read; ``busy_ms``: a spin
        of that long is queued before each call (its launches then find the
        GPU busy), else the GPU is idle when the call starts."""
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        less_wait, less_read = [], []
        sync = cp.cuda.Device().synchronize
        for _ in range(calls):
            if busy_ms:
                self.busy(busy_ms)
            else:
                sync()                    # idle: nothing of the previous call left
            acc["wait"] = acc["read"] = 0
            t0 = time.perf_counter_ns()
            fn()
            dt = time.perf_counter_ns() - t0
            less_wait.append(dt - acc["wait"])
            less_read.append(dt - acc["read"])
        cp.cuda.Device().synchronize()
        return _median_us(less_wait), _median_us(less_read)


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


def _python_work(k: int = 300) -> int:
    """A fixed pure-Python workload (no CUDA): the host's own speed."""
    d, t = {}, 0
    for i in range(k):
        d[i & 15] = i
        t += len(str(i)) + d[i & 15]
    return t


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
    for what, fn in (("async LU call", lu), ("pure-Python work", _python_work)):
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1 << 20)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pkg-root", help="import scipy_gpuqr from this tree")
    ap.add_argument("--tag", default="after")
    ap.add_argument("--only", help="comma-separated function names to time")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--after-wait", action="store_true",
                    help="host time of a call and of pure-Python work after waits of "
                         "three kinds (why the default calls are slower)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(args.pkg_root).resolve() if args.pkg_root
                           else Path(__file__).resolve().parents[1]))
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr.batched import _gpu_common as gc
    from scipy_gpuqr._gpu import gpu_info

    from scipy_gpuqr.batched import _vbatched
    padded = hasattr(_vbatched, "_padded_call") and args.n <= 32
    bench = Bench(cp, g, args.n, args.batch)
    acc, _ = hook_reads(gc)
    print(f"device: {gpu_info().get('name')}  [{args.tag}: scipy_gpuqr from "
          f"{Path(g.__file__).resolve().parent}]  n={args.n} batch={args.batch}, "
          f"{args.calls} calls x {args.rounds} rounds", flush=True)
    rows = []
    refs = references(cp, bench)
    for name, us in refs.items():
        print(f"  ref  {name:48} {us:7.1f} us", flush=True)
    only = set(args.only.split(",")) if args.only else None
    print("async: host us of the call (GPU busy), median of all calls, then the rounds' medians")
    print("default: host us of the call less its wait (-sync: the stream synchronization; "
          "-read: the whole status read), GPU idle / busy at the call's start")
    for name, variant, fn in bench.calls():
        if only and name.split(" ")[0] not in only:
            continue
        row = dict(tag=args.tag, function=name, variant=variant, n=args.n, batch=args.batch)
        try:
            # they wait inside (the vbatched size classes' read: a tree without
            # the padded stacks' one-kernel path)
            sync_call = "jacobi" in name or ("vbatched" in name and not padded)
            if variant == "async" and not sync_call:
                med, per_round = bench.host_async(fn, args.calls, args.rounds)
                row.update(host_us=med, rounds=per_round)
                text = f"{med:8.1f}  " + " ".join(f"{x:.1f}" for x in per_round)
            else:
                calls = max(50, args.calls // 4)
                w, r = bench.host_default(fn, calls, acc)
                row.update(idle_less_sync_us=w, idle_less_read_us=r)
                text = f"idle -sync {w:6.1f} -read {r:6.1f}"
                if not sync_call:
                    w, r = bench.host_default(fn, calls, acc, busy_ms=0.3)
                    row.update(busy_less_sync_us=w, busy_less_read_us=r)
                    text += f" | busy -sync {w:6.1f} -read {r:6.1f}"
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{args.tag:6} {name:28} {variant:8} failed: {type(exc).__name__}: "
                  f"{str(exc)[:160]}", flush=True)
            continue
        rows.append(row)
        print(f"{args.tag:6} {name:28} {variant:8} {text}", flush=True)
    if hasattr(gc, "STATUS_WAIT"):
        # the default calls again with the status read polling instead of synchronizing
        saved = gc.STATUS_WAIT
        gc.STATUS_WAIT = "poll"
        try:
            for name, variant, fn in bench.calls():
                if variant != "default" or (only and name.split(" ")[0] not in only) \
                        or "vbatched" in name or "jacobi" in name:
                    continue
                calls = max(50, args.calls // 4)
                w, r = bench.host_default(fn, calls, acc)
                w2, r2 = bench.host_default(fn, calls, acc, busy_ms=0.3)
                rows.append(dict(tag=args.tag, function=name, variant="default-poll", n=args.n,
                                 batch=args.batch, idle_less_sync_us=w, idle_less_read_us=r,
                                 busy_less_sync_us=w2, busy_less_read_us=r2))
                print(f"{args.tag:6} {name:28} {'dflt-poll':8} idle -sync {w:6.1f} -read {r:6.1f}"
                      f" | busy -sync {w2:6.1f} -read {r2:6.1f}", flush=True)
        finally:
            gc.STATUS_WAIT = saved
    out = dict(references=refs, rows=rows)
    if args.steps:
        st = steps(cp, g, bench)
        print("steps of a public LU call (us, median of batches of 100):")
        for name, us in st.items():
            print(f"  {name:40} {us:7.2f}", flush=True)
        out["steps"] = st
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
