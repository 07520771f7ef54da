#!/usr/bin/env python3
"""Benchmark of the batched LU / inverse kernels against cuBLAS and torch.

    python3 bench/batched.py [--quick] [--json out.json] [--warm]
    python3 bench/batched.py --public [--public-sizes 8,32] [--dtypes float64]
                             [--public-ops lu,inv,...] [--sequential] [--reps 5]
                             [--pkg-root DIR] [--tag before] [--json out.json] [--targets]
                             [--public-cases op:n,...]
    python3 bench/batched.py --host-profile [--public-sizes 8]

``--public``: the functions users call (``lu_factor_batched``,
``inv_batched``, ``solve_batched``, ``cho_factor_batched``, the solves and
``inv_vbatched`` (``--public-ops``, ``PUBLIC_OPS``) with CuPy input, 2**20
matrices of each n <= 32 shifted by n I, for n > 32 the kernel table's batch
of a plain random stack (LU exchanges rows as on general input; Cholesky on
A A^T + n I), bound once as a caller binds them), timed like the
kernels beside them (the driver alone), the calls of the three timed
functions taken in turn (``--sequential``: one function after another, which
lets a drift of the GPU's clocks pass for a difference), with cuBLAS and
torch in the same run: ``kern ms`` (the driver of
``scipy_gpuqr.batched._gpu``), ``pub ms`` (the public call with its
defaults: it waits once to warn or raise), ``async ms`` (``return_info=True,
check_finite=False``: no wait), ``host us`` (host time of the asynchronous
call made after the host waited for the previous one, the GPU busy), ``b2b us``
(host time of the asynchronous call, calls made back to back behind a spin
kernel: the call's own work, the host never pausing; a call that waits is
counted less its wait), ``py aw`` / ``py b2b`` (n <= 32: a fixed pure-Python
workload timed as ``host us`` and as ``b2b us`` time the call, after one call
of the asynchronous variant: how much slower the host itself runs after a
pause), ``work us`` (host time of the default call less its
wait for the device: the time spent in the 32-byte status read is taken out;
the wall time where a library has no such read), ``e2e ms`` (events around
one default call on an idle GPU, launch included). For n <= 32 a ``tail``
line beside each row: the default call's device time over its kernel, the
same with the call's results held until the end event is recorded (a
caller keeps them; released before it, as the other columns do, their
release is host work inside the events), and the events around a bare
stream synchronization (the host round trip that a call which waits
cannot avoid), all taken in turn with the three calls above.
``--public-cases lu:8,inv:64,...`` times those (op, n) pairs instead of
every op at every size. ``--targets`` prints issue
17's targets judged on the run's float64 rows (:func:`target_table`) at the
end. ``--pkg-root`` imports
``scipy_gpuqr`` from another tree (e.g. a checkout of the previous commit)
so that before and after run on the same machine with the same script.

Per dtype and n (2..32 with 2**20 matrices; 64/128/256/512 with
100000/20000/4000/2000):

* ``dev ms``: device time, median of CUDA-event timings after warm-up, with
  the GPU kept busy by two 512 MiB copies enqueued before the start event, so
  that the host's launch work overlaps the copy and the events bracket only
  the kernels (the same for cuBLAS and torch; torch.linalg.inv synchronizes
  to check errors, so its time still includes its host work);
* ``host us``: host time of one call of our driver (no synchronization);
* ``e2e ms``: events around one call on an idle GPU (host launch included);
* GFLOP/s (LU 2n³/3, inverse 2n³), the bandwidth floor (bytes read and
  written once divided by the copy bandwidth measured in the same run) and the
  ratios to cuBLAS getrfBatched / getrf+getriBatched and torch lu_factor / inv
  measured in the same run.

For n <= 32 the warp kernels' (threads per block, stages) are tuned per n
(the best is reported next to the library default). For n > 32 the
factorization methods of ``scipy_gpuqr.batched._gpu_blocked`` listed by
``--methods`` are timed (``cfg`` names the best; ``dflt ms`` is the default
method), and Cholesky (``chol``, on A A^T + n I) is timed against
torch.linalg.cholesky at every n (n <= 32: ``potrf_small``, one launch
shape, no tuning).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

import numpy as np  # noqa: E402

SMALL = list(range(2, 33))
QUICK_SMALL = [2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 28, 32]
LARGE = [(64, 100000), (128, 20000), (256, 4000), (512, 2000)]
SMALL_BATCH = 1 << 20
TUNE = ((64, 1), (128, 1), (256, 1), (64, 2), (128, 2), (256, 2))

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def python_work(k: int = 300) -> int:
    """A fixed pure-Python workload (no CUDA): the host's own speed, timed
    like the calls (the reference of the host columns)."""
    d, t = {}, 0
    for i in range(k):
        d[i & 15] = i
        t += len(str(i)) + d[i & 15]
    return t


def _warm_one(args):
    from scipy_gpuqr.batched import _gpu_blocked as _batched_blocked_gpu
    from scipy_gpuqr.batched import _gpu_common as _batched_gpu_common
    from scipy_gpuqr.batched import _gpu as _batched_gpu
    kernel, dt, n = args
    if kernel == "panel":
        _batched_blocked_gpu._panel_function("getrf_panel", dt, 0)
    elif kernel == "solve":
        _batched_gpu_common._solve_function("getrs_batched", dt, 0)
    elif kernel == "rows":
        _batched_blocked_gpu._rows_function("getrf_rows", dt, 32, 512, 0)
    elif kernel == "status":
        _batched_gpu_common._status_function("info_scan", dt, 0)
    else:
        _batched_gpu._small_function_cached(kernel, dt, n, 0)
    return args


def warm(parallel: int = 16) -> None:
    """Compile every batched kernel variant in parallel processes (fills the disk cache)."""
    from scipy_gpuqr.batched._kernel_registry import MMA_SIZES, PADDED_SIZES, SMALL_MAX
    jobs = [("panel", "float64", 0), ("solve", "float64", 0), ("rows", "float64", 0),
            ("status", "float64", 0)]
    for dt in ("float64", "float32"):
        jobs += [("getrf_warp", dt, n) for n in range(SMALL_MAX, 0, -1)]
        jobs += [(k, dt, n) for k in ("getri_warp", "potrf_small") for n in PADDED_SIZES[::-1]]
    jobs += [(k, "float64", n) for k in ("getrf_mma", "getri_mma") for n in MMA_SIZES]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(parallel) as ex:
        list(ex.map(_warm_one, jobs))
    print(f"compiled {len(jobs)} variants in {time.perf_counter() - t0:.1f} s", flush=True)


class Timer:
    """Device time of a callable: CUDA events behind a blocking copy.

    ``busy_copies`` 512 MiB copies (~0.25 ms each) are enqueued before the
    start event of each timed call.
    """

    def __init__(self, cp, busy_copies: int = 2):
        self.cp = cp
        self.src = cp.ones(1 << 26, dtype=cp.float64)     # 512 MiB, copy ~0.25 ms
        self.dst = cp.empty_like(self.src)
        self.busy_copies = busy_copies
        self._spin = None

    def device(self, fn, reps=5, warmup=2):
        """Median ms between events, the host's launch work hidden behind busy copies."""
        return self._events(fn, reps, warmup, self.busy_copies)

    def device_interleaved(self, fns, reps=5, warmup=2, hold=()):
        """Median ms of each of ``fns`` as :meth:`device` times them, the calls
        taken in turn (kernel, public, ...) so that a drift of the GPU's clocks
        during the run weighs on all of them alike. ``hold``: the indices of
        ``fns`` whose result is kept until the end event is recorded (as a
        caller holds what a call returns); the others' results are released
        right after the call, before the end event, as :meth:`device` does."""
        cp = self.cp
        for fn in fns:
            for _ in range(warmup):
                fn()
        cp.cuda.Device().synchronize()
        times = [[] for _ in fns]
        kept = []
        for _ in range(reps):
            for i, fn in enumerate(fns):
                s, e = cp.cuda.Event(), cp.cuda.Event()
                for _ in range(self.busy_copies):
                    self.dst[...] = self.src
                s.record()
                if i in hold:
                    kept.append(fn())
                    e.record()
                    e.synchronize()
                    kept.clear()
                else:
                    fn()
                    e.record()
                    e.synchronize()
                times[i].append(cp.cuda.get_elapsed_time(s, e))
        return [statistics.median(t) for t in times]

    def e2e(self, fn, reps=5):
        """Median ms between events around one call on an idle GPU (launch work included)."""
        return self._events(fn, reps, 1, 0)

    def _events(self, fn, reps, warmup, busy):
        cp = self.cp
        for _ in range(warmup):
            fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(busy):
                self.dst[...] = self.src
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e))
        return statistics.median(times)

    def host_us(self, fn, reps=30):
        """Median host µs of one call, each made after the host waited for
        the previous one (the GPU then kept busy by a copy queued first)."""
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            self.dst[...] = self.src          # keep the GPU busy: no back-pressure
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            cp.cuda.Device().synchronize()
        return statistics.median(times) * 1e6

    def spin(self, ms: float) -> None:
        """Queue a one-thread kernel that keeps the GPU busy for about ``ms`` ms."""
        if self._spin is None:
            self._spin = self.cp.RawKernel(SPIN, "spin")
            rate = int(self.cp.cuda.Device().attributes.get("ClockRate", 0)) or 2_000_000
            self._cycles_per_ms = rate                  # kHz: cycles per ms
        self._spin((1,), (1,), (np.int64(self._cycles_per_ms * ms),))

    def host_b2b_us(self, fn, reps=30, waited=None):
        """Median host µs of ``reps`` calls made back to back, each timed on
        its own, behind a spin kernel long enough that none of them finds
        the GPU idle: the call's own host work, the host never pausing
        between calls. ``waited``: a one-item list that the status reads
        add their wall seconds to (a call that waits is counted less its wait)."""
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        times = []
        self.spin(20.0)
        for _ in range(reps):
            if waited is not None:
                waited[0] = 0.0
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            times.append(dt - (waited[0] if waited is not None else 0.0))
        cp.cuda.Device().synchronize()
        return statistics.median(times) * 1e6

    def summary(self, res, default, fn):
        """(best key, best ms, default ms, host us, e2e ms) of the timings ``res``.

        ``fn`` is the default configuration; its device time is measured
        unless ``res`` holds it under ``default``.
        """
        best_cfg = min(res, key=res.get)
        dflt = res.get(default) or self.device(fn)
        return best_cfg, res[best_cfg], dflt, self.host_us(fn), self.e2e(fn)


#: Flops of one matrix of order n (LU 2n³/3, inverse 2n³, Cholesky n³/3).
FLOPS = {"lu": lambda n: 2 * n ** 3 / 3, "inv": lambda n: 2 * n ** 3,
         "chol": lambda n: n ** 3 / 3}


def floor_ms(op: str, n: int, itemsize: int, bsz: int, bw: float) -> float:
    """Bandwidth floor: the matrices read and written once (plus LU's pivots and
    ``info``) at ``bw`` bytes per second, in ms."""
    nbytes = (2 * n * n * itemsize + (n * 4 if op == "lu" else 0) + 4) * bsz
    return nbytes / bw * 1e3


def cublas_ms(cp, timer, a, op: str) -> float:
    """Device ms of cuBLAS getrfBatched (``op`` "inv": + getriBatched) on a
    copy of ``a``; NaN where cuBLAS fails."""
    work = a.copy()                     # alive while cb runs: cb holds only pointers
    cb = cublas_lu(cp, work, inverse=(op == "inv"))
    try:
        return timer.device(cb, reps=3)
    except Exception as exc:  # noqa: BLE001
        print(f"  cuBLAS failed: {exc}")
        return float("nan")


def torch_ms(torch, timer, a, op: str) -> float:
    """Device ms of torch.linalg's lu_factor / inv / cholesky on ``a``; NaN
    without torch or where it fails."""
    if torch is None:
        return float("nan")
    ta = torch.from_dlpack(a)
    tf = {"lu": lambda: torch.linalg.lu_factor(ta),
          "inv": lambda: torch.linalg.inv(ta),
          "chol": lambda: torch.linalg.cholesky(ta)}[op]
    try:
        return timer.device(tf, reps=3)
    except Exception as exc:  # noqa: BLE001
        print(f"  torch failed: {exc}")
        return float("nan")


def copy_bandwidth(cp) -> float:
    """Bytes read + written per second by a device-to-device copy of 4 GiB."""
    a = cp.ones(1 << 29, dtype=cp.float64)
    b = cp.empty_like(a)
    for _ in range(2):
        b[...] = a
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(7):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        b[...] = a
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    del a, b
    return 2 * (1 << 29) * 8 / (statistics.median(times) * 1e-3)


def cublas_lu(cp, a, inverse: bool):
    """getrfBatched (and getriBatched) on the stack ``a`` (in place)."""
    from cupy_backends.cuda.libs import cublas
    bsz, n = a.shape[0], a.shape[-1]
    handle = cp.cuda.device.get_cublas_handle()
    ptrs = (a.data.ptr + cp.arange(bsz, dtype=cp.uint64) * (n * n * a.itemsize)).astype(cp.uint64)
    piv = cp.empty((bsz, n), dtype=cp.int32)
    info = cp.empty((bsz,), dtype=cp.int32)
    c = cp.empty_like(a) if inverse else None
    cptrs = ((c.data.ptr + cp.arange(bsz, dtype=cp.uint64) * (n * n * a.itemsize)).astype(cp.uint64)
             if inverse else None)
    getrf = cublas.dgetrfBatched if a.dtype == np.float64 else cublas.sgetrfBatched
    getri = cublas.dgetriBatched if a.dtype == np.float64 else cublas.sgetriBatched

    def run():
        getrf(handle, n, ptrs.data.ptr, n, piv.data.ptr, info.data.ptr, bsz)
        if inverse:
            getri(handle, n, ptrs.data.ptr, n, piv.data.ptr, cptrs.data.ptr, n,
                  info.data.ptr, bsz)
    return run


#: The public functions timed by ``--public`` (``inv_v``, ``lu_v``,
#: ``solve_v``, ``cho_v``: the ``*_vbatched`` functions on a padded stack
#: whose matrices all have order n, beside the fixed-size kernel of the
#: stack; ``inv_vmix``, ``lu_vmix``: orders drawn from n/2+1 .. n, several
#: size classes, beside the kernel of the whole stack (and, a line of its own,
#: that kernel on the stack with the identity outside each order); ``jacobi``: block_jacobi of the
#: block-diagonal CSR matrix made of the stack, blocks of n, beside its
#: kernel (n <= 32: the inverse reading the blocks from CSR; the block gather
#: alone and the gather followed by the inverse of the gathered stack are
#: printed beside it; n > 32: the gather, then the inverse) and the driver of
#: each one's kernel.
PUBLIC_OPS = ("lu", "inv", "solve", "chol", "lu_solve", "cho_solve", "inv_v", "inv_vmix",
              "lu_v", "lu_vmix", "solve_v", "cho_v", "jacobi")


#: Issue 17's targets of the public calls (float64, device time of the
#: default call, anchors in the same run): (op, n, measure, bound), the
#: measure ``ms`` at most the bound, ``x_cublas`` (cuBLAS's ms over the
#: call's) at least it. Besides these: Cholesky at least torch's speed at
#: every n, every call within 5 % of its kernels (``PUB_OVER_KERNEL``) and
#: at most ``HOST_US`` of host time (asynchronous call) for n <= 32.
TARGETS = (("lu", 8, "ms", 0.40), ("lu", 32, "ms", 6.0), ("inv", 8, "ms", 0.60),
           ("inv", 32, "ms", 7.0), ("lu", 64, "x_cublas", 1.5), ("lu", 128, "x_cublas", 1.5),
           ("lu", 256, "x_cublas", 1.5), ("lu", 512, "ms", 18.0))
PUB_OVER_KERNEL = 1.05
HOST_US = 30.0


def target_table(rows: list[dict]) -> list[str]:
    """Issue 17's targets (``TARGETS``) judged on ``--public``'s float64
    rows, one markdown line each: what, measured, bound, met / missed /
    not run (no row of that op and n in the run)."""
    own = {(r["op"], r["n"]): r for r in rows if r["dtype"] == "float64"}
    out = ["| target | measured | bound | |", "|---|---|---|---|"]

    def line(what, value, bound, met, fmt="{:.3f}"):
        shown = "-" if value is None else fmt.format(value)
        verdict = "not run" if value is None else ("met" if met else "**missed**")
        out.append(f"| {what} | {shown} | {bound} | {verdict} |")

    for op, n, measure, bound in TARGETS:
        r = own.get((op, n))
        if measure == "ms":
            v = None if r is None else r["public_ms"]
            line(f"{op} n = {n}, public ms", v, f"<= {bound}", v is not None and v <= bound)
        else:
            v = None if r is None else r["cublas_ms"] / r["public_ms"]
            line(f"{op} n = {n}, cuBLAS ms / public ms", v, f">= {bound}",
                 v is not None and v >= bound, "{:.2f}")
    chol = sorted(n for op, n in own if op == "chol")
    for n in chol or [None]:
        r = own.get(("chol", n))
        v = None if r is None else r["torch_ms"] / r["public_ms"]
        line(f"chol n = {n if n is not None else 'any'}, torch ms / public ms", v, ">= 1",
             v is not None and v >= 1.0, "{:.2f}")
    for (op, n), r in sorted(own.items()):
        v = r["public_ms"] / r["kernel_ms"]
        fmt = "{:.3f}"
        if r.get("public_held_ms") is not None:
            # beside it (not judged): the call with its results held past the
            # end event, and the host round trip of a bare synchronization
            fmt = ("{:.3f} (results held: %.3f; public - kernel %.1f us, a bare "
                   "synchronization %.1f us)" % (
                       r["public_held_ms"] / r["kernel_ms"],
                       (r["public_ms"] - r["kernel_ms"]) * 1e3, r["sync_ms"] * 1e3))
        line(f"{op} n = {n}, public ms / kernel ms", v, f"<= {PUB_OVER_KERNEL}",
             v <= PUB_OVER_KERNEL, fmt)
        if n <= 32:
            # the call's own host work: calls back to back (host_b2b_us) where
            # the run has it, beside the figure of a call made after a wait
            v = r.get("host_b2b_us", r["host_us"])
            fmt = "{:.1f}" if "host_b2b_us" not in r else (
                "{:.1f} (after a wait: %.1f; Python %.1f -> %.1f)"
                % (r["host_us"], r.get("ref_b2b_us", float("nan")),
                   r.get("ref_after_us", float("nan"))))
            line(f"{op} n = {n}, host us (asynchronous call)", v, f"<= {HOST_US:g}",
                 v <= HOST_US, fmt)
    return out


def public_cases(args) -> list[tuple[str, int]]:
    """(op, n) of ``--public``, in order: ``--public-cases`` (``op:n`` pairs)
    where given, else every op of ``--public-ops`` at every n of
    ``--public-sizes``."""
    if getattr(args, "public_cases", None):
        out = []
        for item in args.public_cases.split(","):
            op, _, n = item.partition(":")
            out.append((op.strip(), int(n)))
        return out
    return [(op, int(n)) for n in args.public_sizes.split(",")
            for op in args.public_ops.split(",")]


def public_bench(args) -> int:
    """The table of ``--public`` (see the module docstring)."""
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr._gpu import gpu_info
    try:
        import torch
    except Exception:  # torch is optional
        torch = None
    try:                      # where the call reads its status word (this tree)
        from scipy_gpuqr.batched import _gpu_common as gc
        has_status = hasattr(gc, "read_status")
    except ImportError:
        gc, has_status = None, False
    waited = [0.0]

    def timed(read):
        """``read`` with its wall time added to ``waited``."""
        def call(arg):
            t0 = time.perf_counter()
            try:
                return read(arg)
            finally:
                waited[0] += time.perf_counter() - t0
        return call
    if has_status:
        gc.read_status = timed(gc.read_status)
        if hasattr(gc, "read_words"):         # the vbatched size classes' read
            gc.read_words = timed(gc.read_words)

    # the functions bound once, as a caller does (``from scipy_gpuqr import ...``):
    # the package's lazy attribute lookup is not part of a call
    fns = types.SimpleNamespace(**{name: getattr(g, name) for name in (
        "lu_factor_batched", "inv_batched", "solve_batched", "lu_solve_batched",
        "cho_solve_batched", "cho_factor_batched", "inv_vbatched", "lu_factor_vbatched",
        "solve_vbatched", "cho_factor_vbatched", "block_jacobi")})
    info = gpu_info()
    timer = Timer(cp)
    tag = args.tag or ("after" if has_status else "before")
    print(f"device: {info.get('name')}  [{tag}: scipy_gpuqr from "
          f"{Path(g.__file__).resolve().parent}]")
    print(f"cupy {cp.__version__}, torch {getattr(torch, '__version__', None)}")
    hdr = (f"{'tag':6} {'dtype':7} {'n':>3} {'batch':>8} {'op':9} {'kern ms':>8} {'pub ms':>8} "
           f"{'pub/k':>6} {'async ms':>8} {'as/k':>5} {'k host':>6} {'host us':>7} "
           f"{'b2b us':>7} {'py aw':>6} {'py b2b':>6} {'work us':>7} "
           f"{'e2e ms':>7} {'cuBLAS':>7} {'torch':>7}")
    print(hdr, flush=True)
    rows = []
    tails = {}
    cases = public_cases(args)
    sizes = list(dict.fromkeys(n for _, n in cases))
    rng = cp.random.default_rng(7)

    def python_after_wait(fn, reps=30):
        """Host µs of :func:`python_work` timed as ``host us`` times a call:
        after the host waited for one call of ``fn`` (a copy queued first),
        the GPU kept busy by a copy (the host's own slow-down after a pause)."""
        times = []
        for _ in range(reps):
            timer.dst[...] = timer.src
            fn()
            cp.cuda.Device().synchronize()
            timer.dst[...] = timer.src
            t0 = time.perf_counter()
            python_work()
            times.append(time.perf_counter() - t0)
        cp.cuda.Device().synchronize()
        return statistics.median(times) * 1e6

    def work_us(fn, reps=30):
        """Host time of fn() less its wait in the status read, the GPU busy."""
        fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            timer.dst[...] = timer.src
            waited[0] = 0.0
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0 - waited[0])
            cp.cuda.Device().synchronize()
        return statistics.median(times) * 1e6

    for dtype in [np.dtype(d) for d in args.dtypes.split(",")]:
        for n in sizes:
            bsz = SMALL_BATCH if n <= 32 else dict(LARGE).get(n, 10000)
            a = rng.standard_normal((bsz, n, n), dtype=dtype)
            if n <= 32:
                a += n * cp.eye(n, dtype=dtype)      # well conditioned, SPD-able below
            # n > 32: the plain random stack of the kernel table and the
            # breakdown (a shifted one is diagonally dominant: LU exchanges
            # no rows and its row moves cost less than on a general stack)

            def spd_of(a, n=n, dtype=dtype):
                """A A^T (+ n I for n > 32, as the kernel table's Cholesky stack)."""
                s = cp.matmul(a, a.transpose(0, 2, 1))
                if n > 32:
                    s += n * cp.eye(n, dtype=dtype)
                return s
            for op in [op for op, m in cases if m == n]:
                if op == "lu":
                    kern = lambda: bg.getrf(a)                                   # noqa: E731
                    pub = lambda: fns.lu_factor_batched(a)                         # noqa: E731
                    asy = lambda: fns.lu_factor_batched(a, check_finite=False,     # noqa: E731
                                                      return_info=True)
                elif op == "inv":
                    kern = lambda: bg.getri(a)                                   # noqa: E731
                    pub = lambda: fns.inv_batched(a)                               # noqa: E731
                    asy = lambda: fns.inv_batched(a, check_finite=False,           # noqa: E731
                                                return_info=True)
                elif op == "solve":
                    b = rng.standard_normal((bsz, n, 1), dtype=dtype)

                    def two(b=b):            # the LU kernel, then the solve kernel
                        lu, piv, _ = bg.getrf(a)
                        return bg.getrs(lu.reshape(bsz, n, n), piv.reshape(bsz, n), b)
                    if n <= 32 and getattr(bg, "FUSED_GESV", False):
                        from scipy_gpuqr.batched._common import gpu_rhs
                        rhs = gpu_rhs(b, (bsz,), n, dtype)
                        kern = lambda rhs=rhs: bg.gesv(a, rhs)                   # noqa: E731
                        print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {'solve':9} "
                              f"LU kernel + solve kernel: {timer.device(two, reps=args.reps):8.3f} ms",
                              flush=True)
                    else:
                        kern = two
                    pub = lambda b=b: fns.solve_batched(a, b)                      # noqa: E731
                    asy = lambda b=b: fns.solve_batched(a, b, check_finite=False,  # noqa: E731
                                                      return_info=True)
                elif op == "lu_solve":
                    b = rng.standard_normal((bsz, n, 1), dtype=dtype)
                    lu, piv = fns.lu_factor_batched(a)
                    kern = lambda b=b, lu=lu, piv=piv: bg.getrs(lu, piv, b)      # noqa: E731
                    pub = lambda b=b, lu=lu, piv=piv: fns.lu_solve_batched((lu, piv), b)  # noqa: E731
                    asy = lambda b=b, lu=lu, piv=piv: fns.lu_solve_batched(        # noqa: E731
                        (lu, piv), b, check_finite=False)
                elif op == "cho_solve":
                    b = rng.standard_normal((bsz, n, 1), dtype=dtype)
                    spd = spd_of(a)
                    c, low = fns.cho_factor_batched(spd)
                    kern = lambda b=b, c=c: bg.potrs(c, False, b)                 # noqa: E731
                    pub = lambda b=b, c=c: fns.cho_solve_batched((c, False), b)    # noqa: E731
                    asy = lambda b=b, c=c: fns.cho_solve_batched(                  # noqa: E731
                        (c, False), b, check_finite=False)
                elif op in ("inv_v", "inv_vmix"):
                    vsz = (cp.full((bsz,), n, dtype=cp.int64) if op == "inv_v" else
                           cp.random.randint(n // 2 + 1, n + 1, size=bsz).astype(cp.int64))
                    kern = lambda: bg.getri(a)                                   # noqa: E731
                    pub = lambda vsz=vsz: fns.inv_vbatched(a, vsz)                 # noqa: E731
                    asy = lambda vsz=vsz: fns.inv_vbatched(                        # noqa: E731
                        a, vsz, check_finite=False, return_info=True)
                elif op in ("lu_v", "lu_vmix"):
                    vsz = (cp.full((bsz,), n, dtype=cp.int64) if op == "lu_v" else
                           cp.random.randint(n // 2 + 1, n + 1, size=bsz).astype(cp.int64))
                    kern = lambda: bg.getrf(a)                                   # noqa: E731
                    pub = lambda vsz=vsz: fns.lu_factor_vbatched(a, vsz)           # noqa: E731
                    asy = lambda vsz=vsz: fns.lu_factor_vbatched(                  # noqa: E731
                        a, vsz, check_finite=False, return_info=True)
                elif op == "solve_v":
                    vsz = cp.full((bsz,), n, dtype=cp.int64)
                    b = rng.standard_normal((bsz, n), dtype=dtype)

                    def kern(b=b):
                        if n <= 32 and getattr(bg, "FUSED_GESV", False):
                            from scipy_gpuqr.batched._common import gpu_rhs
                            return bg.gesv(a, gpu_rhs(b.reshape(bsz, n, 1), (bsz,), n, dtype))
                        lu, piv, _ = bg.getrf(a)
                        return bg.getrs(lu.reshape(bsz, n, n), piv.reshape(bsz, n),
                                        b.reshape(bsz, n, 1))
                    pub = lambda b=b, vsz=vsz: fns.solve_vbatched(a, b, vsz)       # noqa: E731
                    asy = lambda b=b, vsz=vsz: fns.solve_vbatched(                 # noqa: E731
                        a, b, vsz, check_finite=False, return_info=True)
                elif op == "cho_v":
                    vsz = cp.full((bsz,), n, dtype=cp.int64)
                    spd = spd_of(a)
                    kern = lambda spd=spd: bg.potrf(spd, False)                   # noqa: E731
                    pub = lambda spd=spd, vsz=vsz: fns.cho_factor_vbatched(spd, vsz)  # noqa: E731
                    asy = lambda spd=spd, vsz=vsz: fns.cho_factor_vbatched(        # noqa: E731
                        spd, vsz, check_finite=False, return_info=True)
                elif op == "jacobi":
                    import cupyx.scipy.sparse as xsp
                    nn = bsz * n
                    cols = (cp.arange(nn, dtype=cp.int64)[:, None] // n * n
                            + cp.arange(n, dtype=cp.int64)[None, :]).ravel()
                    spd = xsp.csr_matrix((a.ravel(), cols.astype(cp.int32),
                                          cp.arange(0, nn * n + 1, n, dtype=cp.int32)),
                                         shape=(nn, nn))
                    cols = None
                    from scipy_gpuqr.batched import _jacobi
                    gather = getattr(_jacobi, "_gpu_blocks", None)
                    if gather is None:        # a tree without the gather kernel
                        kern = lambda: bg.getri(a)                               # noqa: E731
                    else:                     # the gather, then the inverse
                        kern = lambda A=spd: bg.getri(gather(A, nn, n, dtype)[0])  # noqa: E731
                        g_ms = timer.device(lambda A=spd: gather(A, nn, n, dtype),
                                            reps=args.reps)
                        print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} "
                              f"gather kernel alone: {g_ms:8.3f} ms", flush=True)
                    if n <= 32 and hasattr(bg, "jacobi_inverse_call"):
                        # its kernel: the inverse reading the blocks from CSR
                        # (the gather and the inverse beside it, for the record)
                        pair_ms = timer.device(kern, reps=args.reps)
                        print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} "
                              f"gather + inverse kernels: {pair_ms:8.3f} ms", flush=True)
                        dev = gc.device_id()
                        kern = lambda A=spd, dev=dev: _jacobi._short_sparse(        # noqa: E731
                            A, n, dtype, dev, gc.NO_REPORT)
                    pub = lambda A=spd: fns.block_jacobi(A, n)                     # noqa: E731
                    asy = lambda A=spd: fns.block_jacobi(A, n, check_finite=False)  # noqa: E731
                else:
                    spd = spd_of(a)
                    kern = lambda spd=spd: bg.potrf(spd, False)                   # noqa: E731
                    pub = lambda spd=spd: fns.cho_factor_batched(spd)              # noqa: E731
                    asy = lambda spd=spd: fns.cho_factor_batched(                  # noqa: E731
                        spd, check_finite=False, return_info=True)
                if op in ("inv_vmix", "lu_vmix"):
                    # the fixed-size kernel on the stack as the _vb kernel reads it
                    # (the identity outside each order): tells the data's own cost
                    # (pivot ties, zeros) from the _vb kernel's masking
                    ix = cp.arange(n)
                    inside = ((ix[None, :, None] < vsz[:, None, None])
                              & (ix[None, None, :] < vsz[:, None, None]))
                    padded = cp.where(inside, a, cp.eye(n, dtype=dtype))
                    inside = None
                    fixed = bg.getri if op == "inv_vmix" else bg.getrf
                    fk_ms = timer.device(lambda p=padded, f=fixed: f(p), reps=args.reps)
                    print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} "
                          f"fixed kernel on the identity-padded stack: {fk_ms:8.3f} ms", flush=True)
                    padded = None
                flag = {"lu_solve": "WARP_GETRS", "cho_solve": "WARP_POTRS"}.get(op)
                if flag and n <= 32 and gc is not None and hasattr(gc, flag):
                    setattr(gc, flag, False)     # the thread-per-column kernel, for the record
                    try:
                        old_ms = timer.device(kern, reps=args.reps)
                    finally:
                        setattr(gc, flag, True)
                    print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} "
                          f"thread-per-column kernel: {old_ms:8.3f} ms", flush=True)
                try:
                    if args.sequential:       # the older way: each function's calls in a row
                        k_ms, p_ms, a_ms = (timer.device(f, reps=args.reps)
                                            for f in (kern, pub, asy))
                    elif n <= 32:
                        # beside them: the public call with its results held
                        # past the end event, and a bare stream
                        # synchronization between events (the host round
                        # trip that any call which waits pays)
                        sync = cp.cuda.get_current_stream().synchronize
                        k_ms, p_ms, a_ms, held_ms, sync_ms = timer.device_interleaved(
                            (kern, pub, asy, pub, sync), reps=args.reps, hold=(3,))
                        tails[(op, n)] = (held_ms, sync_ms)
                        print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} tail: public "
                              f"- kernel {(p_ms - k_ms) * 1e3:6.1f} us, results held "
                              f"{(held_ms - k_ms) * 1e3:6.1f} us; a bare stream "
                              f"synchronization between events {sync_ms * 1e3:6.1f} us",
                              flush=True)
                    else:
                        k_ms, p_ms, a_ms = timer.device_interleaved((kern, pub, asy),
                                                                    reps=args.reps)
                    k_host = timer.host_us(kern)
                    host = timer.host_us(asy)
                    b2b = timer.host_b2b_us(asy, waited=waited)
                    work = work_us(pub)
                    e2e = timer.e2e(pub)
                    ref_b2b, ref_after = ((timer.host_b2b_us(python_work),
                                           python_after_wait(asy)) if n <= 32
                                          else (float("nan"), float("nan")))
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} failed: "
                          f"{type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    spd = b = lu = piv = c = vsz = None
                    cp.get_default_memory_pool().free_all_blocks()
                    continue
                cb = (cublas_ms(cp, timer, a, op) if op in ("lu", "inv")
                      else float("nan"))
                tt = (torch_ms(torch, timer, a, op) if op in ("lu", "inv")
                      else torch_ms(torch, timer, spd, "chol") if op == "chol"
                      else float("nan"))
                held_ms, sync_ms = tails.pop((op, n), (None, None))
                row = dict(tag=tag, dtype=dtype.name, n=n, batch=bsz, op=op,
                           kernel_ms=k_ms, public_ms=p_ms, async_ms=a_ms,
                           public_held_ms=held_ms, sync_ms=sync_ms,
                           kernel_host_us=k_host,
                           host_us=host, host_b2b_us=b2b, ref_b2b_us=ref_b2b,
                           ref_after_us=ref_after, work_us=work, e2e_ms=e2e, cublas_ms=cb,
                           torch_ms=tt, device=info.get("name"))
                rows.append(row)
                print(f"{tag:6} {dtype.name:7} {n:>3} {bsz:>8} {op:9} {k_ms:8.3f} {p_ms:8.3f} "
                      f"{p_ms / k_ms:6.3f} {a_ms:8.3f} {a_ms / k_ms:5.2f} {k_host:6.0f} "
                      f"{host:7.0f} "
                      f"{b2b:7.1f} {ref_after:6.1f} {ref_b2b:6.1f} {work:7.0f} "
                      f"{e2e:7.3f} {cb:7.3f} {tt:7.3f}", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
                spd = b = lu = piv = c = vsz = None
            a = None
            cp.get_default_memory_pool().free_all_blocks()
            if torch is not None:
                torch.cuda.empty_cache()
    if args.targets:
        print(f"\nissue 17's targets ({info.get('name')}, this run):")
        print("\n".join(target_table(rows)), flush=True)
    return 0


def host_profile(args) -> int:
    """``--host-profile``: host time of each step of a public LU call (median
    of 30, the GPU busy with a 512 MiB copy so that nothing waits), then a
    cProfile of 300 asynchronous calls."""
    import cProfile
    import pstats
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr.batched import _common as bc
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    timer = Timer(cp)
    sync = cp.cuda.Device().synchronize
    noop = cp.RawKernel(r"""extern "C" __global__ void noop(const double *a, double *b,
        int *c, int *d, long long n, int s, int v) {}""", "noop")

    def med(fn, busy=True, reps=30):
        fn()
        sync()
        times = []
        for _ in range(reps):
            if busy:
                timer.dst[...] = timer.src
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            sync()
        return statistics.median(times) * 1e6

    rng = cp.random.default_rng(7)
    lu_f = g.lu_factor_batched
    for n in [int(x) for x in args.public_sizes.split(",")]:
        bsz = SMALL_BATCH
        a = rng.standard_normal((bsz, n, n), dtype=cp.float64) + n * cp.eye(n)
        lu, piv, info = bg.getrf(a)
        st = gc.new_status()
        rep_args = gc.report_args(st)
        sync()
        dev = gc.device_id()
        plan = bg._warp_plan("lu", "float64", n, None, None, None, dev)
        steps = [
            ("as_stack", lambda: bc.as_stack(a, "x")),
            ("use_gpu", lambda: bc.use_gpu(a, None, "x")),
            ("cp.empty(lu) (pool)", lambda: cp.empty(a.shape, a.dtype)),
            ("cp.empty(info) (pool)", lambda: cp.empty((bsz,), cp.int32)),
            ("_warp_plan lookup", lambda: bg._warp_plan("lu", "float64", n, None, None, None,
                                                       gc.device_id())),
            ("empty kernel launch, 7 args", lambda: noop((1,), (32,), (a, lu, piv, info,
                                                                   np.int64(bsz), np.int32(1),
                                                                   np.int32(1)))),
            ("getrf launch (outputs given)", lambda: bg._launch_plan(
                plan, n, a, lu, bsz, (a, lu, piv, info), (), rep_args)),
            ("alloc_outputs (lu, piv, info)", lambda: gc.alloc_outputs(
                ((a.shape, a.dtype), ((bsz, n), np.int32), ((bsz,), np.int32)))),
            ("driver _gpu.getrf", lambda: bg.getrf(a)),
            ("driver _gpu.getrf, reporting", lambda: bg.getrf(a, report=rep_args)),
            ("new_status", gc.new_status),
            ("report_args", lambda: gc.report_args(st)),
            ("public lu async", lambda: lu_f(a, check_finite=False, return_info=True)),
            ("public lu default, idle GPU", lambda: lu_f(a)),
            ("read_status, idle GPU", lambda: gc.read_status(st)),
            ("status.get() pageable, idle", lambda: st.buf.get()),
        ]
        print(f"host profile, n={n}, batch {bsz} (us, median of 30)")
        for name, fn in steps:
            busy = "idle" not in name
            print(f"  {name:32} {med(fn, busy=busy):8.1f}", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            lu_f(a, check_finite=False, return_info=True)
            sync()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(14)
        a = lu = piv = info = None
        cp.get_default_memory_pool().free_all_blocks()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"n = {QUICK_SMALL} only")
    ap.add_argument("--sizes", help="comma-separated n <= 32 (overrides --quick)")
    ap.add_argument("--no-large", action="store_true", help="skip n = 64..512")
    ap.add_argument("--large-only", action="store_true", help="only n = 64..512")
    ap.add_argument("--large", help="comma-separated n:batch pairs for n > 32 "
                    "(default 64:100000,128:20000,256:4000,512:2000)")
    ap.add_argument("--methods", default="default",
                    help="n > 32 methods to time: comma-separated of fused, mma64, "
                    "rows, rows_mma, panel, default")
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--chol-finish", default=None,
                    help="how the n > 32 Cholesky assembles its result: cupy or kernel "
                    "(scipy_gpuqr.batched._gpu_blocked.CHOL_FINISH; default: the library's)")
    ap.add_argument("--ops", default="lu,inv,chol",
                    help="operations of the kernel table, of lu, inv, chol")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--warm", action="store_true", help="only compile the kernels")
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--public", action="store_true",
                    help="time the public functions beside their kernels (only)")
    ap.add_argument("--public-sizes", default="8,32", help="n of --public")
    ap.add_argument("--public-ops", default="lu,inv",
                    help=f"operations of --public, of {','.join(PUBLIC_OPS)}")
    ap.add_argument("--public-cases",
                    help="op:n pairs of --public (e.g. lu:8,inv:64), instead of every op "
                    "of --public-ops at every n of --public-sizes")
    ap.add_argument("--pkg-root", help="import scipy_gpuqr from this tree")
    ap.add_argument("--host-profile", action="store_true",
                    help="host time of each step of a public LU call (only)")
    ap.add_argument("--tag", help="label of the --public rows")
    ap.add_argument("--sequential", action="store_true",
                    help="--public: time the kernel, the public call and the asynchronous "
                    "call one after another instead of in turn")
    ap.add_argument("--reps", type=int, default=5,
                    help="timed calls of each function in --public (median)")
    ap.add_argument("--targets", action="store_true",
                    help="--public: print issue 17's targets judged on the run's float64 rows "
                    "(run with --public-sizes 8,32,64,128,256,512 --public-ops lu,inv,chol)")
    args = ap.parse_args(argv)
    if args.pkg_root:
        sys.path.insert(0, str(Path(args.pkg_root).resolve()))
    if args.host_profile:
        return host_profile(args)
    if args.public:
        return public_bench(args)
    if args.warm:
        warm()
        return 0
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched._kernel_registry import padded_size
    from scipy_gpuqr._gpu import gpu_info
    try:
        import torch
    except Exception:  # torch is optional
        torch = None

    info = gpu_info()
    bw = copy_bandwidth(cp)
    timer = Timer(cp)
    print(f"device: {info.get('name')}  copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")
    print(f"cupy {cp.__version__}, torch {getattr(torch, '__version__', None)}")
    rows = []

    def emit(row: dict, cfg: str, tail: str, cublas: bool = True) -> None:
        """Keep ``row``, print its line of the kernel table (cuBLAS's columns '-'
        where it was not timed) and rewrite the JSON file."""
        rows.append(row)
        cb = (f"{row['cublas_ms']:8.3f} {row['x_cublas']:6.2f}" if cublas
              else f"{'-':>8} {'-':>6}")
        print(f"{row['dtype']:7} {row['n']:>4} {row['batch']:>8} {row['op']:4} {cfg:>6} "
              f"{row['ms']:8.3f} {row['default_ms']:8.3f} {row['host_us']:7.0f} "
              f"{row['e2e_ms']:8.3f} {row['gflops']:6.0f} {row['floor_ms']:7.3f} "
              f"{100 * row['bw_fraction']:4.0f} {cb} {row['torch_ms']:8.3f} "
              f"{row['x_torch']:6.2f}  {tail}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))

    small = ([int(x) for x in args.sizes.split(",")] if args.sizes
             else QUICK_SMALL if args.quick else SMALL)
    large = ([tuple(int(v) for v in p.split(":")) for p in args.large.split(",")]
             if args.large else LARGE)
    sizes = ([] if args.large_only else [(n, SMALL_BATCH) for n in small]) + \
        ([] if args.no_large else large)
    from scipy_gpuqr.batched import _gpu_blocked as bb

    def large_call(op, method):
        """Our n > 32 routine for ``op`` with ``method`` (None: default)."""
        def lu(a):
            bsz, n = a.shape[0], a.shape[-1]
            piv = cp.empty((bsz, n), dtype=cp.int32)
            info = cp.empty((bsz,), dtype=cp.int32)
            return bb.getrf(a, piv, info, method)
        if op == "lu":
            return lu
        if op == "inv":
            return lambda a: bb.inverse(a, method)
        return lambda a: bb.potrf(a, True, method, args.chol_finish)

    def methods_for(n, op, dtype):
        out = []
        for m in args.methods.split(","):
            m = None if m == "default" else m
            if m == "fused" and n > bb.FUSED_MAX or m == "rows" and n > bb.ROWS_MAX:
                continue
            if m == "mma64" and (n > bb.FUSED_MAX or op == "chol" or dtype != np.float64):
                continue
            if m == "rows_mma" and (n > bb.ROWS_MAX or op == "chol" or dtype != np.float64):
                continue
            out.append(m)
        return out or [None]
    rng = cp.random.default_rng(7)
    hdr = (f"{'dtype':7} {'n':>4} {'batch':>8} {'op':4} {'cfg':>6} {'dev ms':>8} {'dflt ms':>8} "
           f"{'host us':>7} {'e2e ms':>8} {'GF/s':>6} {'floor':>7} {'%fl':>4} "
           f"{'cuBLAS':>8} {'x cuB':>6} {'torch':>8} {'x tor':>6}")
    print(hdr, flush=True)
    for dtype in [np.dtype(d) for d in args.dtypes.split(",")]:
        for n, bsz in sizes:
            a = rng.standard_normal((bsz, n, n), dtype=dtype)
            ops = args.ops.split(",")
            if n > 32 or "chol" in ops:
                spd = cp.matmul(a, a.transpose(0, 2, 1))
                spd += n * cp.eye(n, dtype=dtype)
            item = a.itemsize
            for op in ops:
                if op == "inv" and n > 64:
                    continue
                if op == "chol" and n <= 32:
                    # potrf_small on A A^T + n I against torch.linalg.cholesky
                    # (no block-size tuning: one launch shape per n)
                    fn = lambda spd=spd: bg.potrf(spd, True)              # noqa: E731
                    best_cfg, best, dflt, host, e2e = timer.summary(
                        {(None, None): timer.device(fn)}, (None, None), fn)
                    flops = FLOPS[op](n) * bsz
                    floor = floor_ms(op, n, item, bsz, bw)
                    t_ms = torch_ms(torch, timer, spd, op)
                    row = dict(dtype=dtype.name, n=n, batch=bsz, op=op, kernel="potrf_small",
                               ms=best, default_ms=dflt, host_us=host, e2e_ms=e2e,
                               gflops=flops / best / 1e6, floor_ms=floor,
                               bw_fraction=floor / best, cublas_ms=float("nan"),
                               x_cublas=float("nan"), torch_ms=t_ms, x_torch=t_ms / best,
                               device=info.get("name"), copy_tbs=bw / 1e12)
                    emit(row, "-", "potrf_small", cublas=False)
                    continue
                call = bg.getrf if op == "lu" else bg.getri
                if n > 32:
                    default = (None, None)
                    choices = [(m, "m") for m in methods_for(n, op, dtype)]
                    if op == "chol":
                        a_op, a = a, spd
                    res = {}
                    for m, _ in choices:
                        fn = large_call(op, m)
                        res[(m, "m")] = timer.device(lambda fn=fn: fn(a))
                    fdef = large_call(op, None)
                    best_cfg, best, dflt, host, e2e = timer.summary(
                        res, (None, "m"), lambda: fdef(a))
                    flops = FLOPS[op](n) * bsz
                    floor = floor_ms(op, n, item, bsz, bw)
                    cb_ms = float("nan") if op == "chol" else cublas_ms(cp, timer, a, op)
                    t_ms = torch_ms(torch, timer, a, op)
                    if op == "chol":
                        a = a_op
                    dmeth = bb.default_method(n, "chol" if op == "chol" else "lu", dtype)
                    cfg = best_cfg[0] or dmeth
                    row = dict(dtype=dtype.name, n=n, batch=bsz, op=op, method=cfg,
                               ms=best, default_ms=dflt, default_method=dmeth,
                               host_us=host, e2e_ms=e2e, gflops=flops / best / 1e6,
                               floor_ms=floor, bw_fraction=floor / best, cublas_ms=cb_ms,
                               x_cublas=cb_ms / best, torch_ms=t_ms, x_torch=t_ms / best,
                               device=info.get("name"), copy_tbs=bw / 1e12,
                               methods={str(k[0] or "default"): v for k, v in res.items()})
                    emit(row, cfg[:6],
                         " ".join(f"{k}={v:.3f}" for k, v in row["methods"].items()))
                    continue
                if n <= 32:
                    size = n if op == "lu" else padded_size(n)
                    kern = (bg.getrf_kernel(n, dtype) if op == "lu"
                            else bg.getri_kernel(n, dtype))
                    default = bg.getrf_defaults(size, dtype.name, kern)
                    choices = (default,) if args.no_tune else TUNE
                else:
                    default, choices, kern = (None, None), ((None, None),), "-"
                res = {}
                for thr, st in choices:
                    res[(thr, st)] = timer.device(lambda thr=thr, st=st: call(a, thr, st) if thr else call(a))
                best_cfg, best, dflt, host, e2e = timer.summary(res, default, lambda: call(a))
                flops = FLOPS[op](n) * bsz
                floor = floor_ms(op, n, item, bsz, bw)
                cb_ms = cublas_ms(cp, timer, a, op)
                t_ms = torch_ms(torch, timer, a, op)
                cfg = "-" if best_cfg[0] is None else f"{best_cfg[0]}/{best_cfg[1]}"
                row = dict(dtype=dtype.name, n=n, batch=bsz, op=op, kernel=kern,
                           threads=best_cfg[0],
                           stages=best_cfg[1], ms=best, default_ms=dflt,
                           default_cfg=list(default), host_us=host, e2e_ms=e2e,
                           gflops=flops / best / 1e6, floor_ms=floor,
                           bw_fraction=floor / best, cublas_ms=cb_ms, x_cublas=cb_ms / best,
                           torch_ms=t_ms, x_torch=t_ms / best, device=info.get("name"),
                           copy_tbs=bw / 1e12,
                           tune={f"{k[0]}/{k[1]}": v for k, v in res.items() if k[0]})
                emit(row, cfg, kern)
            a = spd = None      # frees the stacks (del would leave pyflakes a name to flag)
            cp.get_default_memory_pool().free_all_blocks()
            if torch is not None:          # torch's cache grows with every new size
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
