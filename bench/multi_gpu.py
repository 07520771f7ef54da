"""Sparse QR on 1, 2 and 4 GPUs of one host (subtrees mapped to devices).

Run on the multi-GPU machine::

    source .dev/remote-setup.sh
    python3 bench/multi_gpu.py --json $OUT/multi_gpu.json [--gpus 1,2,4] [--only grid40,...]
    python3 bench/multi_gpu.py --quick --json $OUT/multi_gpu.json   # grid 40³, ch7-8-b3; 1, 2 GPUs
    python3 bench/multi_gpu.py --numpy                              # the script without a GPU

Per matrix: the analysis, then per device count ``k`` the device plan
(``scipy_gpuqr._schedule.devices.map_devices``: stages, contribution blocks
crossing devices, the modelled speedup from the front tree), one warm-up
factorization and ``--reps`` timed ones: wall time of the engine call until
R is a host ``csc_array`` (``gpu_factorize`` for one GPU,
``multi_gpu_factorize`` for several), medians; per device its busy time
(CUDA events around its stages' kernels, from the arrival of the carried
blocks), launches and flops; the speedup against one GPU from the same run.
The answers are checked against the first device count's (one GPU): R's
largest difference after matching the signs of its rows (a dense front
factorized elsewhere may flip some), and ``Qᵀ b`` of one right-hand side
(applied on the first device, reading the other devices' front pools peer
to peer), both relative to their largest entry. Each run also checks itself in
a way that holds whatever the rank (``Rᵀ R = Pᵀ Aᵀ A P`` and ``Q R = A P`` on a
random vector): on a rank-deficient matrix factorized without a tolerance
(ch7-8-b3), R past a dependent column is set by rounding, so its difference
from one GPU's R is no check there. ``--public`` also times
``QRFactorization(A, backend='gpu', gpuqr_options=GpuqrOptions(devices=...))``
plus one solve, and at the largest device count ``devices='auto'`` (its time and
the GPUs it took: what a user who names no count gets).

``--budget-fraction 0.6`` gives every device ``0.6 ×`` the one-stage GPU bytes
of each matrix (``max_gpu_memory``): one GPU then stages through host memory,
while the devices together may hold it unstaged (the table says the stages
of each run and whether the plan fits). ``--simulate`` runs ``k`` device
layers on GPU 0 (streams of one GPU: checks the path, no speedup expected).
``--numpy`` runs ``k`` NumPy device layers on the host (a small grid; checks
this script where there is no GPU; its times mean nothing).

``--quick``: grid 40³ and ch7-8-b3 on 1 and 2 GPUs, 2 timed repetitions,
and a time budget (``--max-seconds``, 200 by default there) past which the
remaining runs are skipped (and listed as such).

Per device the table gives its busy time and its host thread's time
enqueueing (each device's launches are enqueued by a thread of its own;
``wait`` is the part of it spent waiting for another device's contribution
blocks to be cut). At the end a summary table per matrix and device count.

``--split off|rule|on|both`` sets ``multi_gpu_factorize(split_dense=...)`` for
every device count above one (``both``: without the split, then with the rule's
choice, in the same process: the change's effect within one run); the split
fronts' measured and modelled seconds are printed and kept in the JSON.

Per device the line gives its enqueueing thread's CPU seconds and its host
seconds by kind (stage set-up, launches, dense fronts, blocks cut, the
rest), and how its R values reached R's array (``R`` share scattered by the
end of its enqueueing, seconds scattering, seconds a copier waited for R's
array). ``--r-slot-mb 128,32`` runs every multi-device setting with each of
those slot sizes of R's copies (``multi_gpu_factorize(r_slot_bytes=...)``;
default: the engine's choice). ``--mapping flops,measured`` runs every
multi-device setting with each of those mappings, in that order
(``multi_gpu_factorize(device_speeds=None | 'measured')``): on flops alone
(a first call's), and by the speeds the earlier calls of the pattern on
those devices measured (the engine's default; the flops runs' calls are
such earlier calls). A run by measured speeds warms up until its mapping
no longer changes (at most three calls), and prints the speeds each call
mapped by. ``--check-only grid56,...``
checks the answers of those matrices only (R's difference, ``Qᵀ b`` and the
residuals take tens of seconds on grid 64³'s R); ``--check-r grid64,...``
compares only R's values with one GPU's for those (a few seconds).

``--switch-interval none,2e-4`` runs every setting under each interpreter
switch interval (``multi_gpu_factorize(switch_interval=...)``; one GPU through
``sys.setswitchinterval`` around its call; ``lib``: the library's default,
``none``: the process' own, 5 ms). ``--probe`` adds one more call per setting
(not in the median) watched by :class:`GilProbe`: how late a thread gets the
interpreter's lock back, who held it long and where, every Python thread's
CPU seconds, and each device thread's steps (``info``'s ``events``).
``--keep-pools`` keeps CuPy's device and pinned memory pools between the calls
of a setting (the public calls' too), as a user's repeated call finds them; by default every call
starts with emptied pools, so it allocates (and pins) its memory again, which
in a multi-device call stalls the other devices' threads (CuPy pins host memory
holding the interpreter's lock).

A multi-device call pins the host memory its devices' threads use before they
start (``info["pinned_ahead"]``) and keeps the blocks for the next call, which
CuPy's ``free_all_blocks`` leaves alone; ``--drop-pinned`` lets go of them
after every call as well (each call then pins ahead again: a first call's
cost). On GPUs every ``cudaHostAlloc`` is counted through a pinned allocator
of the bench's own (:class:`PinnedCounter`): the ``pinned`` column gives the
MB pinned ahead (of them pinned by the call) and the pinned allocations made
while the devices' threads enqueued, the library's own (``during_run``) and
CuPy's (any, its internal staging too).

``--ordering colamd,metis`` analyses every matrix with each of those column
orderings (``analyze(A, ordering=...)``) and runs its device counts on each
analysis, one after the other in the same process; a row's matrix is then
labelled with its ordering (``grid56 metis``), and its speedups are against
one GPU of the same ordering (default ``colamd``, the library's).

``--dask 1,2,4`` then measures the Dask throughput of batched LU
(``bench/dask_batched.py``: 2**24 float64 32 x 32 matrices by default,
``--dask-count``) over that many GPU workers against one, in a separate
process killed after ``--dask-seconds`` (it dumps every thread's stack
shortly before), and adds its table and JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

#: what --quick runs
QUICK = {"only": "grid40,ch7-8-b3", "gpus": "1,2", "reps": 2, "max_seconds": 200.0}


def _thread_clock(native_id: int) -> int:
    """The CPU clock of the thread of that kernel id (Linux's per-thread scheduler
    clock): unlike ``time.pthread_getcpuclockid``, a thread that ended meanwhile
    gives an error, not a freed handle."""
    return ((~int(native_id)) << 3) | 6


def _thread_group(name: str) -> str:
    """What a thread's CPU seconds are added under: a device's enqueueing thread or
    split worker by its layer, the rest by kind."""
    m = re.match(r"(gpuqr-(?:device|split)-\d+)", name)
    if m:
        return m.group(1)
    if name.startswith("ThreadPoolExecutor"):
        return "pool"
    return re.sub(r"[-_ ]*\(?\d+.*$", "", name) or name


def _site(frame, depth: int = 3) -> str:
    """A frame and its callers, innermost first, as ``file:line function``."""
    out = []
    while frame is not None and len(out) < depth:
        co = frame.f_code
        out.append(f"{Path(co.co_filename).name}:{frame.f_lineno} {co.co_name}")
        frame = frame.f_back
    return " < ".join(out)


class PinnedCounter:
    """Every ``cudaHostAlloc`` CuPy makes, with when, how long and on which thread.

    Installed as CuPy's pinned allocator (a pinned pool of its own over a
    counting allocator) for the bench's process; :meth:`between` counts those
    that began inside a window of ``time.perf_counter()``.
    """

    def __init__(self):
        import cupy as cp
        self.cp = cp
        self.log = []                   # (start, seconds, bytes, thread name)
        self._lock = threading.Lock()
        self.pool = cp.cuda.PinnedMemoryPool(allocator=self._alloc)
        cp.cuda.set_pinned_memory_allocator(self.pool.malloc)

    def _alloc(self, size):
        t0 = time.perf_counter()
        mem = self.cp.cuda.pinned_memory.PinnedMemory(size,
                                                      self.cp.cuda.runtime.hostAllocPortable)
        with self._lock:
            self.log.append((t0, time.perf_counter() - t0, int(size),
                             threading.current_thread().name))
        # a pool's allocator returns a pointer to its memory, as CuPy's own does
        return self.cp.cuda.PinnedMemoryPointer(mem, 0)

    def between(self, a: float, b: float) -> dict:
        """The allocations that began in ``[a, b)``: count, MB, seconds, threads."""
        with self._lock:
            got = [x for x in self.log if a <= x[0] < b]
        return {"allocations": len(got), "mb": sum(x[2] for x in got) / 1e6,
                "seconds": sum(x[1] for x in got),
                "threads": sorted({x[3] for x in got})}

    def free(self) -> None:
        self.pool.free_all_blocks()


def _pinned_of(info, counter, t_call) -> dict | None:
    """A multi-device call's pinned memory: ``info["pinned_ahead"]`` and, with a
    counter, CuPy's allocations while its devices' threads enqueued (from the
    first thread's start to the last one's stages enqueued) and in the whole
    call (``t_call``: the bench's clock at the call)."""
    ahead = info.get("pinned_ahead")
    per = (info.get("devices") or {}).get("devices") or []
    lines = [d.get("timeline_seconds") for d in per if d.get("timeline_seconds")]
    if ahead is None and not lines:
        return None
    out = {"ahead": ahead}
    if counter is not None and lines:
        a = t_call + min(t[0] for t in lines)
        b = t_call + max(t[1] for t in lines)
        out["cupy_while_enqueueing"] = counter.between(a, b)
        out["cupy_in_call"] = counter.between(t_call, t_call + float(
            (info.get("seconds") or {}).get("total", 0.0)))
    return out


def pinned_text(p) -> str:
    """``MB ahead (MB pinned by the call) / in run: library n, CuPy n (MB, s)``."""
    if not p:
        return "-"
    a = p.get("ahead")
    txt = ("nothing ahead / in run: lib -" if not a else
           f"{a['bytes'] / 1e6:.0f} ({a['pinned_now_bytes'] / 1e6:.0f}) MB, "
           f"{a['seconds']:.3f} s / in run: lib {a['during_run']['allocations']}")
    c = p.get("cupy_while_enqueueing")
    if c is not None:
        txt += f", CuPy {c['allocations']} ({c['mb']:.0f} MB, {c['seconds']:.3f} s)"
    return txt


class GilProbe:
    """Every Python thread's CPU seconds during a call, and how long a thread that
    released the interpreter's lock waits to take it back.

    A sampler thread sleeps ``period`` seconds at a time: a sleep releases the
    interpreter's lock as every CUDA call does, so its lateness on waking is
    what a device thread's call waits for the lock. At every wake it reads each
    Python thread's CPU clock; a wake later than ``long`` seconds is charged to
    the thread whose CPU time grew most since the last wake (most likely the
    thread that held the lock; a thread that held it while blocked in the
    kernel, e.g. on a page fault behind another thread's pinning of host
    memory, grows no CPU time and is not named), with where that thread was
    (its innermost frames) and when (the longest waits). The sum
    of the Python threads' CPU seconds over the call's wall seconds bounds the
    lock's load from above (their CPU time outside the lock counts too).
    """

    def __init__(self, period: float = 0.001, long: float = 0.002):
        self.period, self.long = float(period), float(long)
        self._stop = threading.Event()
        self._thread = None
        self.late, self.cpu, self.holds, self.sites, self.named = [], {}, {}, {}, {}
        self.waits = []             # (seconds from the start, lateness, holder, site)
        self.wall = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        self._last = self._read()           # threads alive now: counted from here
        self._thread = threading.Thread(target=self._loop, name="gil-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.wall = time.perf_counter() - self._t0
        return False

    def _read(self) -> dict:
        out = {}
        for th in threading.enumerate():
            if th is self._thread or th.native_id is None:
                continue
            try:
                out[th] = time.clock_gettime(_thread_clock(th.native_id))
            except OSError:                 # ended meanwhile
                continue
        return out

    def _loop(self) -> None:
        last = self._last
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(self.period)
            late = time.perf_counter() - t - self.period
            frames = sys._current_frames() if late > self.long else None
            now = self._read()
            deltas = {th: c - last.get(th, 0.0) for th, c in now.items()}
            for th, d in deltas.items():
                g = _thread_group(th.name)
                self.cpu[g] = self.cpu.get(g, 0.0) + d
                self.named.setdefault(g, set()).add(th.native_id)
            self.late.append(late)
            if frames is not None and deltas:
                th = max(deltas, key=deltas.get)
                g = _thread_group(th.name)
                n, sec = self.holds.get(g, (0, 0.0))
                self.holds[g] = (n + 1, sec + late)
                site = g + ": " + _site(frames.get(th.ident))
                n, sec = self.sites.get(site, (0, 0.0))
                self.sites[site] = (n + 1, sec + late)
                self.waits.append((t - self._t0, late, g, site))
            last = now

    def summary(self, top: int = 8) -> dict:
        """What the probe saw: wakes and their lateness (ms), the long ones by the
        thread (group) and place that held the lock, CPU seconds by thread group."""
        late = np.asarray(self.late) * 1e3
        q = (np.percentile(late, [50, 90, 99]).tolist() if len(late) else [float("nan")] * 3)
        sites = sorted(self.sites.items(), key=lambda kv: -kv[1][1])[:top]
        return {"wall_seconds": self.wall, "wakes": len(late),
                "late_ms": {"mean": float(late.mean()) if len(late) else float("nan"),
                            "p50": q[0], "p90": q[1], "p99": q[2],
                            "max": float(late.max(initial=0.0))},
                "late_seconds": float(late.sum() / 1e3), "long_ms": self.long * 1e3,
                "long_by_thread": {g: [n, sec] for g, (n, sec) in self.holds.items()},
                "long_sites": [[k, n, sec] for k, (n, sec) in sites],
                "longest": [list(w) for w in sorted(self.waits, key=lambda w: -w[1])[:top]],
                "cpu_seconds": dict(sorted(self.cpu.items())),
                "threads": {g: len(v) for g, v in sorted(self.named.items())},
                "python_cpu_seconds": float(sum(self.cpu.values()))}


def probe_text(sm) -> str:
    """One line of a :class:`GilProbe` summary."""
    lm = sm["late_ms"]
    cpu = " ".join(f"{g} {v:.3f}" for g, v in sm["cpu_seconds"].items() if v >= 0.005)
    holds = " ".join(f"{g} {n}/{sec:.3f}s" for g, (n, sec) in sm["long_by_thread"].items())
    return (f"lock probe: {sm['wakes']} wakes in {sm['wall_seconds']:.3f} s, late ms mean "
            f"{lm['mean']:.3f} p50 {lm['p50']:.3f} p90 {lm['p90']:.3f} p99 {lm['p99']:.3f} "
            f"max {lm['max']:.2f}; waits > {sm['long_ms']:g} ms by holder [{holds}]; "
            f"Python threads' CPU {sm['python_cpu_seconds']:.3f} s [{cpu}]")


@contextlib.contextmanager
def _switching(seconds):
    """The interpreter's switch interval for a one-GPU call (the multi-device calls
    take it as ``switch_interval``): set, then put back; None: untouched."""
    if seconds is None:
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:     # the microseconds read, not one less (see multi_device's interpreter_switch)
        sys.setswitchinterval((round(old * 1e6) + 0.5) * 1e-6)


def _matrices(only, numpy_layers=False):
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               random_least_squares)
    gens = {
        "grid40": lambda: grid3d_least_squares(40),
        "grid48": lambda: grid3d_least_squares(48),
        "grid50": lambda: grid3d_least_squares(50),
        "grid56": lambda: grid3d_least_squares(56),
        "grid60": lambda: grid3d_least_squares(60),
        "grid64": lambda: grid3d_least_squares(64),
        "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
        "randls-20k": lambda: random_least_squares(20000, 4000, density=0.0012,
                                                   dense_rows=40, seed=1),
        "randls-60k": lambda: random_least_squares(60000, 12000, density=0.0004,
                                                   dense_rows=60, seed=2),
    }
    if numpy_layers:
        gens = {"grid8": lambda: grid3d_least_squares(8),
                "randls": lambda: random_least_squares(600, 250, 0.01, seed=3)}
    names = [n for n in only if n in gens] if only else list(gens)     # --only's order
    return [(n, gens[n]) for n in names]


class _Runner:
    """The engine calls on CUDA devices, or on NumPy device layers (``--numpy``)."""

    def __init__(self, numpy_layers: bool, keep_pools: bool = False,
                 drop_pinned: bool = False):
        self.numpy = numpy_layers
        self.keep_pools = keep_pools
        self.drop_pinned = drop_pinned
        #: CuPy's pinned allocations counted (:class:`PinnedCounter`; GPUs only)
        self.pinned = None if numpy_layers else PinnedCounter()

    def device_context(self, ids):
        """The first device current (Q and the solves run there)."""
        if self.numpy:
            import contextlib
            return contextlib.nullcontext()
        import cupy as cp
        return cp.cuda.Device(ids[0])

    def factorize(self, A, an, ids, budget, split=None, speeds="measured", r_slot=None,
                  switch="default"):
        from scipy_gpuqr._engine.gpu.driver import gpu_factorize
        from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
        if self.numpy:
            from scipy_gpuqr._engine.gpu.device import NumpyDevice
            from scipy_gpuqr._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE

            def layer():
                return NumpyDevice(DEFAULT_TILE, DEFAULT_BUNDLE)
            if len(ids) == 1:
                with _switching(None if isinstance(switch, str) else switch):
                    return gpu_factorize(A, an, max_gpu_memory=budget, device=layer())
            return multi_gpu_factorize(A, an, layers=[layer() for _ in ids],
                                       max_gpu_memory=budget, split_dense=split,
                                       device_speeds=speeds, r_slot_bytes=r_slot,
                                       switch_interval=switch)
        with self.device_context(ids):
            if len(ids) == 1:
                with _switching(None if isinstance(switch, str) else switch):
                    return gpu_factorize(A, an, max_gpu_memory=budget)
            return multi_gpu_factorize(A, an, devices=ids, max_gpu_memory=budget,
                                       split_dense=split, device_speeds=speeds,
                                       r_slot_bytes=r_slot, switch_interval=switch)

    def between(self):
        """After a call of a setting: the pools emptied (:meth:`free`), or, with
        ``keep_pools``, only the devices waited for: the next call then finds the
        device and pinned blocks the last one left, as a user's repeated call does."""
        if self.drop_pinned:
            from scipy_gpuqr._engine.gpu.pinned_ahead import release_kept_pinned
            release_kept_pinned()
        if not self.keep_pools:
            self.free()
        elif not self.numpy:
            import cupy as cp
            for d in range(cp.cuda.runtime.getDeviceCount()):
                cp.cuda.Device(d).synchronize()

    def free(self):
        if self.numpy:
            return
        import cupy as cp
        for d in range(cp.cuda.runtime.getDeviceCount()):
            with cp.cuda.Device(d):
                cp.cuda.Device(d).synchronize()
                cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
        if self.pinned is not None:
            self.pinned.free()


def _public(A, ids, reps, runner, devices=None):
    """The public call with ``GpuqrOptions(devices=...)`` (``ids``, or ``devices``:
    'auto') and one solve: the median seconds after ``reps`` calls that follow a
    first, and the GPUs the last call ran on (its plan's reasons). Between the
    calls the pools are handled as between the engine's (``runner.between``:
    kept with ``--keep-pools``, as a user's repeated call finds them; emptied,
    the next call allocates its device memory and pins its buffers again)."""
    from scipy_gpuqr import GpuqrOptions, QRFactorization
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    times, used = [], 1
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        with runner.device_context(ids), \
                QRFactorization(A, backend="gpu", gpuqr_options=GpuqrOptions(
                    devices=tuple(ids) if devices is None else devices)) as F:
            F.solve(b)
            used = gpus_used(F.info)
        times.append(time.perf_counter() - t0)
        runner.between()
    runner.free()
    return statistics.median(times[1:]), used


def gpus_used(info) -> int:
    """GPUs a public call's factorization ran on, from its plan's reasons
    (``"GPUs [0, 1]: ..."``; one GPU without such a reason)."""
    for reason in info.get("reasons", []):
        m = re.match(r"GPUs \[([0-9, ]+)\]", str(reason))
        if m:
            return len(m.group(1).split(","))
    return 1


def _answers(qr, ids, b, runner, A):
    """What the checks compare: R (host), its rows' pivots, ``Qᵀ b`` (host),
    and the factorization's own residuals (:func:`_factor_residuals`)."""
    lead = row_leads(qr.R)
    with runner.device_context(ids):
        qtb = np.asarray(qr.qt_matmul(b.reshape(-1, 1))).ravel()
        own = _factor_residuals(qr, A, lead)
    return {"R": qr.R, "sign": np.sign(lead), "qtb": qtb,
            "scale": float(np.abs(qr.R.data).max(initial=0.0)), **own}


def row_leads(R) -> np.ndarray:
    """Each row's first entry, its pivot (0 for an empty row): the diagonal, unless
    a column had nothing left below the staircase, after which R's later rows
    start right of the diagonal."""
    d = R.diagonal()
    if np.all(d != 0):
        return d
    import scipy.sparse as sp
    Rr = sp.csr_array(R)
    Rr.sort_indices()
    ptr = Rr.indptr
    lead = np.zeros(Rr.shape[0], dtype=Rr.dtype)
    full = ptr[1:] > ptr[:-1]
    lead[full] = Rr.data[ptr[:-1][full]]
    return lead


def _factor_residuals(qr, A, lead) -> dict:
    """Checks of one factorization that hold whatever A's rank.

    Where A is rank deficient (ch7-8-b3) and factorized without a tolerance,
    R's rows past a dependent column are set by rounding: two right
    factorizations differ there by O(‖A‖), so R's difference from another
    run tells nothing. What holds for every right factorization:
    ``gram``, ``Rᵀ R y = Pᵀ Aᵀ A P y`` (relative to ``Pᵀ Aᵀ A P y``), and
    ``qr``, ``Q [R x; 0] = A P x`` (relative to ``A P x``), one random vector
    each; ``tiny_pivots`` counts R's rows whose pivot (``lead``, from
    :func:`row_leads`) is below ``1e-10`` of the largest (numerically
    dependent columns)."""
    m, n = A.shape
    rng = np.random.default_rng(5)
    AP = A[:, qr.colperm]
    R = qr.R
    y = rng.standard_normal(n)
    g_ref = AP.T @ (AP @ y)
    g = R.T @ (R @ y) - g_ref
    x = rng.standard_normal(n)
    z = np.zeros((m, 1))
    z[:R.shape[0], 0] = R @ x
    apx = AP @ x
    qz = np.asarray(qr.q_matmul(z)).ravel()
    d = np.abs(lead)
    return {"gram": float(np.abs(g).max() / max(float(np.abs(g_ref).max()), 1e-300)),
            "qr": float(np.abs(qz - apx).max() / max(float(np.abs(apx).max()), 1e-300)),
            "tiny_pivots": int(np.count_nonzero(d <= 1e-10 * max(float(d.max()), 1e-300)))}


def _r_difference(R, ref, flip, scale) -> float:
    """``max |diag(flip) R - ref| / scale``; on the values alone where both are CSC
    of one pattern (the engines' R layout: no sparse subtraction, which takes
    tens of seconds on grid 64³'s R)."""
    if (R.format == ref.format == "csc" and R.shape == ref.shape
            and np.array_equal(R.indptr, ref.indptr)
            and np.array_equal(R.indices, ref.indices)):
        d = R.data * flip[R.indices]        # CSC: a value's index is its row
        return float(np.abs(d - ref.data).max(initial=0.0) / scale)
    import scipy.sparse as sp
    return float(abs(sp.diags_array(flip) @ R - ref).max() / scale)


def _r_alone(qr) -> dict:
    """What ``--check-r`` compares: R (host), its rows' pivot signs, its scale."""
    return {"R": qr.R, "sign": np.sign(row_leads(qr.R)),
            "scale": float(np.abs(qr.R.data).max(initial=0.0))}


def _flip(got, ref) -> np.ndarray:
    """Row signs making ``got``'s R's rows start as ``ref``'s."""
    flip = np.where(got["sign"] == ref["sign"], 1.0, -1.0)
    flip[got["sign"] == 0] = 1.0
    return flip


def _differences(got, ref) -> dict:
    """R and ``Qᵀ b`` against the reference's, rows matched by sign, relative;
    then ``got``'s own residuals (:func:`_factor_residuals`)."""
    flip = _flip(got, ref)
    scale = max(ref["scale"], 1.0)
    k = ref["R"].shape[0]
    q1, q2 = ref["qtb"], got["qtb"]
    qscale = max(float(np.abs(q1).max()), 1.0)
    return {"R_diff": _r_difference(got["R"], ref["R"], flip, scale),
            "qtb_diff": float(np.abs(flip * q2[:k] - q1[:k]).max() / qscale),
            # the rest spans R's orthogonal complement: its norm is the residual's
            "residual_norm_diff": float(abs(np.linalg.norm(q2[k:]) - np.linalg.norm(q1[k:]))
                                        / max(float(np.linalg.norm(q1)), 1.0)),
            **{key: got[key] for key in ("gram", "qr", "tiny_pivots")}}


#: ``--mapping``: ``multi_gpu_factorize(device_speeds=...)`` of each name
MAPPINGS = {"flops": None, "measured": "measured"}

#: ``--split``: the values of ``multi_gpu_factorize(split_dense=...)`` each device
#: count above one runs with (``rule``: None, the model's choice)
SPLIT_MODES = {"rule": [None], "off": [False], "on": [True], "both": [False, None]}


def _variants(counts, split, mappings=("measured",), slots=(None,), switches=("default",)) -> list:
    """(device count, split_dense, R slot bytes, mapping name, switch interval) of every
    run, in order (each switch interval of one device count after the other)."""
    out = []
    for k in counts:
        for si in switches:
            if k == 1:
                out.append((k, None, None, "-", si))
                continue
            out += [(k, sd, sl, mp, si) for sd in SPLIT_MODES[split] for mp in mappings
                    for sl in slots]
    return out


def _switch_text(si) -> str:
    """A ``--switch-interval`` value as the labels say it."""
    if isinstance(si, str):
        return "library default"
    return "5 ms (process)" if si is None else f"{si * 1e3:g} ms"


def _switches(text: str) -> tuple:
    """``--switch-interval``: 'lib' the library's default, 'none' the process' own
    interval, else seconds."""
    out = []
    for x in (t.strip() for t in text.split(",")):
        if not x:
            continue
        out.append("default" if x.lower() == "lib" else None if x.lower() == "none" else float(x))
    return tuple(out) or ("default",)


def _mapping_text(info) -> str:
    """What a call's subtrees were shared by, and the speeds (``info["devices"]["mapping"]``)."""
    mp = (info.get("devices") or {}).get("mapping")
    if not mp:
        return "-"
    sp = mp.get("speeds")
    out = mp["by"] + ("" if sp is None else " " + "/".join(f"{x:.3f}" for x in sp))
    d = mp.get("decision") or {}
    if d.get("why"):
        out += f" ({d['why']})"
    elif d.get("remapped") is False:    # new speeds weighed, the plan kept
        out += (" (kept against " + "/".join(f"{x:.3f}" for x in d["candidate"])
                + ", model %.3f/%.3f s)" % tuple(d["modelled_seconds"]))
    return out


def _r_copy_text(rc) -> str:
    """A device's R copy (``info["devices"]["devices"][k]["r_copy"]``): the share of
    its entries in R's data by the end of its enqueueing, its seconds scattering and
    waiting for R's data array."""
    if not rc:
        return "-"
    share = (rc["scattered_by_enqueued"] or 0) / max(rc["entries"], 1)
    return f"{share:.2f}/{rc['scatter_seconds']:.3f}/{rc['data_wait_seconds']:.3f}"


def events_text(d, least: float = 0.01) -> str:
    """A device thread's steps (``info["devices"]["devices"][k]["events"]``) as
    ``kind id start-end`` (seconds from the call's start), those of at least
    ``least`` seconds, stages whole."""
    out = []
    for kind, i, a, b in d.get("events") or []:
        if kind == "stage" or b - a >= least:
            out.append(f"{kind} {i} {a:.3f}-{b:.3f}")
    return ", ".join(out) or "-"


def _orderings(text: str) -> list:
    """``--ordering``'s column orderings, in order, each once (default ``['colamd']``)."""
    from scipy_gpuqr._symbolic.ordering import ORDERINGS
    out = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip())) or ["colamd"]
    bad = [x for x in out if x not in ORDERINGS or x == "given"]
    if bad:
        raise ValueError(f"--ordering: {bad} not among {[o for o in ORDERINGS if o != 'given']}")
    return out


def _label(name: str, ordering: str, orderings) -> str:
    """A row's matrix label: the name, with the ordering unless only COLAMD runs."""
    return name if list(orderings) == ["colamd"] else f"{name} {ordering}"


def run_one(name, make, counts, reps, *, simulate, budget_fraction, public, runner,
            deadline=None, split="rule", mappings=("measured",), verify=True, slots=(None,),
            switches=("default",), probe=False, ordering="colamd"):
    from scipy_gpuqr._schedule.devices import map_devices
    from scipy_gpuqr._symbolic import analyze
    A = make()
    t0 = time.perf_counter()
    an = analyze(A, ordering=ordering)
    row = {"matrix": name, "shape": list(A.shape), "nnz": int(A.nnz),
           "ordering": an.ordering_used, "nnz_R": int(an.nnz_R),
           "flops": float(an.flops), "gpu_bytes": int(an.gpu_bytes),
           "analysis_seconds": time.perf_counter() - t0, "runs": []}
    print(f"{name}: {A.shape[0]}x{A.shape[1]}, nnz {A.nnz}, {an.flops / 1e12:.2f} TFlop, "
          f"ordering {an.ordering_used}, analysis {row['analysis_seconds']:.1f} s", flush=True)
    budget = int(budget_fraction * an.gpu_bytes) if budget_fraction else None
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    ref = None
    bases = {}                  # switch interval -> the first device count's median
    for k, sd, sl, mp, si in _variants(counts, split, mappings, slots, switches):
        ids = [0] * k if (simulate or runner.numpy) else list(range(k))
        plan = map_devices(an, k, device_memory=budget)
        speeds = MAPPINGS.get(mp)
        run = {"gpus": k, "devices": ids, "plan": plan.as_dict(),
               "split": {None: "rule", False: "off", True: "on"}[sd] if k > 1 else "-",
               "mapping": mp, "r_slot_bytes": sl, "switch_interval": _switch_text(si)}
        label = f"{k} GPU(s)" + (f" split={run['split']} mapping={mp}"
                                 + (f" r-slot {sl / (1 << 20):g}MB" if sl else "")
                                 if k > 1 else "")
        if len(switches) > 1:
            label += f" switch {_switch_text(si)}"
        if deadline is not None and time.perf_counter() > deadline:
            run["skipped"] = "time budget spent"
            row["runs"].append(run)
            print(f"{name:12s} {label}: skipped (time budget spent)", flush=True)
            continue
        try:
            # warm-up (kernels, schedule, layout); by measured speeds until the mapping
            # the next call takes is the one this call ran
            warm, warm_s = [], []
            for _ in range(3 if speeds == "measured" and k > 1 else 1):
                t = time.perf_counter()
                qr = runner.factorize(A, an, ids, budget, sd, speeds, sl, si)
                warm_s.append(time.perf_counter() - t)
                mapping = qr.info.get("devices", {}).get("mapping") or {}
                warm.append(_mapping_text(qr.info))
                qr.free()
                runner.between()
                if (mapping.get("speeds") == mapping.get("remembered") or speeds is None
                        or (mapping.get("decision") or {}).get("remapped") is False):
                    break           # the next call maps as this one did
            run["warm_up_mappings"], run["warm_up_seconds"] = warm, warm_s
            times, infos = [], []
            for rep in range(reps):
                t = time.perf_counter()
                qr = runner.factorize(A, an, ids, budget, sd, speeds, sl, si)
                times.append(time.perf_counter() - t)
                infos.append(qr.info)
                pin = _pinned_of(qr.info, runner.pinned, t)
                if pin is not None:
                    run.setdefault("pinned", []).append(pin)
                run.setdefault("mappings", []).append(_mapping_text(qr.info))
                if rep == 0 and verify == "r":
                    got = _r_alone(qr)
                    if ref is None:
                        ref = got
                    else:
                        run["R_diff"] = _r_difference(got["R"], ref["R"], _flip(got, ref),
                                                      max(ref["scale"], 1.0))
                elif rep == 0 and verify:
                    got = _answers(qr, ids, b, runner, A)
                    if ref is None:
                        ref = got
                        run.update({key: got[key] for key in ("gram", "qr", "tiny_pivots")})
                    else:
                        run.update(_differences(got, ref))
                qr.free()
                runner.between()
            if probe:                   # one more call, watched (not in the median)
                with GilProbe() as pr:
                    t = time.perf_counter()
                    qr = runner.factorize(A, an, ids, budget, sd, speeds, sl, si)
                    tp = time.perf_counter() - t
                run["probe"] = {"seconds": tp, **pr.summary()}
                pinfo = qr.info
                if k > 1:
                    run["probe"]["events"] = [d.get("events") for d in
                                              pinfo.get("devices", {}).get("devices", [])]
                    run["probe"]["enqueue_seconds"] = [
                        [d.get("enqueue_seconds"), d.get("enqueue_cpu_seconds"),
                         d.get("wait_blocks_seconds")]
                        for d in pinfo.get("devices", {}).get("devices", [])]
                qr.free()
            runner.free()               # each setting starts with empty pools
        except Exception as exc:                          # noqa: BLE001 - report, go on
            import traceback
            run["error"] = f"{type(exc).__name__}: {exc}"
            run["traceback"] = traceback.format_exc(limit=8)
            row["runs"].append(run)
            print(f"{name:12s} {label}: {run['error']}\n{run['traceback']}", flush=True)
            runner.free()
            continue
        med = statistics.median(times)
        info = infos[len(infos) // 2]
        run.update(seconds=med, all_seconds=times, tflops=an.flops / med / 1e12,
                   stages=int(info.get("stages", 0)),
                   staged=bool(k == 1 and int(info.get("stages", 1)) > 1),
                   launches=int(info.get("launches", 0)),
                   transfers=len(info.get("transfers", [])),
                   transfer_bytes=int(sum(t[3] for t in info.get("transfers", []))),
                   engine_seconds=info.get("seconds", {}),
                   r_copy_progressive=info.get("r_copy_progressive"))
        if info.get("devices"):             # the plan the engine ran (split fronts included)
            run["plan"] = {key: v for key, v in info["devices"].items() if key != "devices"}
        if info.get("split_fronts"):
            run["split_fronts"] = info["split_fronts"]
        if "multi_device_fallback" in info:
            run["fallback"] = info["multi_device_fallback"]
        per = info.get("devices", {}).get("devices")
        if per:
            run["per_device"] = per
        else:                                             # one GPU: its kernel time
            run["per_device"] = [{"device": ids[0], "busy_seconds":
                                  info.get("seconds", {}).get("gpu_kernels", float("nan")),
                                  "launches": int(info.get("launches_with_tasks", 0)),
                                  "flops": float(an.flops)}]
        if k == counts[0]:
            bases.setdefault(run["switch_interval"], med)
        base = bases.get(run["switch_interval"]) or next(iter(bases.values()), None)
        run["speedup"] = base / med if base else float("nan")
        if public:
            try:
                run["public_seconds"], _ = _public(A, ids, max(1, reps - 1), runner)
                if k == counts[-1] and k > 1 and not (simulate or runner.numpy):
                    # what devices='auto' takes on the GPUs this run sees, and its time
                    run["public_auto_seconds"], run["public_auto_gpus"] = _public(
                        A, ids, max(1, reps - 1), runner, devices="auto")
            except Exception as exc:                      # noqa: BLE001
                run["public_error"] = f"{type(exc).__name__}: {exc}"
        row["runs"].append(run)
        busy = " ".join(f"{d.get('busy_seconds', float('nan')):.3f}" for d in run["per_device"])
        if k > 1:
            busy += "; enqueue " + " ".join(
                f"{d.get('enqueue_seconds', float('nan')):.3f}"
                f"(wait {d.get('wait_blocks_seconds', float('nan')):.3f})"
                for d in run["per_device"])
            busy += "; thread start/enqueued/R done " + " ".join(
                "/".join(f"{x:.3f}" for x in d["timeline_seconds"])
                for d in run["per_device"] if d.get("timeline_seconds"))
            busy += "; enqueue cpu " + " ".join(
                f"{d.get('enqueue_cpu_seconds', float('nan')):.3f}" for d in run["per_device"])
            busy += "; parts " + " | ".join(
                ",".join(f"{key} {v:.3f}" for key, v in d.get("enqueue_parts", {}).items())
                for d in run["per_device"])
            busy += "; wait R " + " ".join(
                f"{d.get('wait_r_copy_seconds', float('nan')):.3f}" for d in run["per_device"])
            busy += "; R by enqueued/scatter s/data wait s " + " ".join(
                _r_copy_text(d.get("r_copy")) for d in run["per_device"])
            busy += (f"; devices start {run['engine_seconds'].get('devices_start', float('nan')):.3f}"
                     f"; subtree flops " + " ".join(
                         f"{d.get('subtree_flops', float('nan')) / 1e12:.2f}"
                         for d in run["plan"].get("per_device", [])) + " T")
            busy += f"; R copies started during the launches {run.get('r_copy_progressive')}"
            es = run["engine_seconds"]
            busy += (f"; engine total {es.get('total', float('nan')):.3f}, after R "
                     f"{es.get('result', float('nan')):.3f}; to home MB/s " + " ".join(
                         f"{d['to_home']['bytes'] / 1e6:.0f}/{d['to_home']['seconds']:.3f}"
                         if d.get("to_home") else "-" for d in run["per_device"]))
            busy += "; pinned " + " | ".join(pinned_text(x) for x in run.get("pinned", []))
            busy += ("; mapped by (warm-up, s) " + ", ".join(
                f"{m} {x:.2f}" for m, x in zip(run["warm_up_mappings"], run["warm_up_seconds"]))
                     + " (timed) " + ", ".join(run["mappings"]))
        check = (f"  R diff {run['R_diff']:.1e}" if "R_diff" in run else "")
        if "qtb_diff" in run:
            check += (f" Qtb diff {run['qtb_diff']:.1e}"
                      f" |r| diff {run['residual_norm_diff']:.1e}")
        if "gram" in run:
            check += (f"  gram {run['gram']:.1e} QR {run['qr']:.1e}"
                      f" tiny pivots {run['tiny_pivots']}")
        splits = "".join(
            f"  split front {e['front']} {e['shape'][0]}x{e['shape'][1]} blocks {e['blocks']} "
            f"{(e.get('seconds') or float('nan')):.4f} s (model {e.get('modelled_seconds') or float('nan'):.4f}"
            f", one device {e.get('one_device_modelled_seconds') or float('nan'):.4f})"
            + (" enqueue (wait) s " + "/".join(f"{t:.3f} ({w:.3f})" for t, w in
                                              e["enqueue_seconds"])
               if e.get("enqueue_seconds") else "")
            for e in run.get("split_fronts", []))
        print(f"{name:12s} {label} {med:8.3f} s  x{run['speedup']:.2f} "
              f"(model x{run['plan']['modelled_speedup']:.2f}{_modelled_s(run)})  "
              f"{run['tflops']:.2f} TF/s  "
              f"stages {run['stages']}  busy [{busy}] s  "
              f"moved {run['transfer_bytes'] / 1e6:.1f} MB  fits {plan.fits}{check}"
              + ("  FELL BACK to one GPU" if "fallback" in run else "") + splits
              + (f"  public {run['public_seconds']:.3f} s" if "public_seconds" in run else "")
              + (f", devices='auto' {run['public_auto_seconds']:.3f} s on "
                 f"{run['public_auto_gpus']} GPU(s)" if "public_auto_seconds" in run else "")
              + (f"  public: {run['public_error']}" if "public_error" in run else ""),
              flush=True)
        if "probe" in run:
            print(f"{name:12s} {label} watched call {run['probe']['seconds']:.3f} s; "
                  + probe_text(run["probe"]), flush=True)
            for site, n, sec in run["probe"]["long_sites"]:
                print(f"    held {n} x, {sec:.3f} s: {site}", flush=True)
            for t0, late, _, site in run["probe"].get("longest", []):
                print(f"    longest: from {t0:.3f} s of the watched call, {late * 1e3:.1f} ms, "
                      f"{site}", flush=True)
            for j, ev in enumerate(run["probe"].get("events") or []):
                print(f"    device {j} steps: {events_text({'events': ev})}", flush=True)
    return row


def _modelled_s(run) -> str:
    """``", 0.964 s time"``: the seconds the time model predicts for the plan's
    mapping (``modelled_seconds``; ``time`` where the mapping itself was the time
    model's, :func:`~scipy_gpuqr._schedule.devices.map_devices`), beside the flops
    model's speedup; nothing where the plan was not timed (no split model)."""
    plan = run.get("plan", {})
    seconds = plan.get("modelled_seconds") or 0.0
    if not seconds > 0:
        return ""
    return f", {seconds:.3f} s" + (" time" if plan.get("weight") == "time" else "")


def summary(rows) -> str:
    """A Markdown table: per matrix and device count the median seconds, the speedup,
    busy and enqueue seconds per device, the split fronts (measured seconds), the
    check against one GPU and each run's own residuals (rank-proof)."""
    out = ["| matrix | TFlop | GPUs | s | x 1 GPU (model: x by flops, s by the time model, 'time' where it mapped) | busy s per GPU | enqueue s per GPU "
           "(of it waiting for blocks) | R assembled after s | split fronts s | "
           "vs 1 GPU | own: Gram, QR (tiny pivots) | pinned ahead MB (by the call), s / "
           "allocations while enqueueing: library, CuPy |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for run in r["runs"]:
            sp = run.get("split", "-")
            head = (f"| {r['matrix']} | {r['flops'] / 1e12:.2f} | {run['gpus']}"
                    + (f" (split {sp}"
                       + (f", R slots {run['r_slot_bytes'] / (1 << 20):g} MB"
                          if run.get("r_slot_bytes") else "")
                       + (f", {run['mapping']}" if run.get("mapping", "-") != "-" else "")
                       + ")" if sp != "-" else "")
                    + (f", switch {run['switch_interval']}"
                       if run.get("switch_interval", "library default") != "library default"
                       else "")
                    + (f", staged in {run['stages']}" if run.get("staged") else "")
                    + (", plan over the budget" if run["gpus"] > 1
                       and run.get("plan", {}).get("fits") is False else "") + " |")
            if "seconds" not in run:
                out.append(head + f" {run.get('skipped') or run.get('error', '?')}"
                           " | | | | | | | | |")
                continue
            per = run.get("per_device", [])
            busy = " / ".join(f"{d.get('busy_seconds', float('nan')):.3f}" for d in per)
            enq = " / ".join(f"{d['enqueue_seconds']:.3f} ({d['wait_blocks_seconds']:.3f})"
                             for d in per if "enqueue_seconds" in d) or "-"
            eng = run.get("engine_seconds", {})
            check = (f"R {run['R_diff']:.1e}" if "R_diff" in run else "-")
            if "qtb_diff" in run:
                check += f", Qtb {run['qtb_diff']:.1e}"
            own = (f"{run['gram']:.1e}, {run['qr']:.1e} ({run['tiny_pivots']})"
                   if "gram" in run else "-")
            splits = " + ".join(
                f"{e['shape'][0]}x{e['shape'][1]} {(e.get('seconds') or float('nan')):.3f}"
                + (" fell back" if "fallback" in e else "")
                for e in run.get("split_fronts", [])) or "-"
            model = run.get("plan", {}).get("modelled_speedup", float("nan"))
            out.append(head + f" {run['seconds']:.3f} | {run['speedup']:.2f} ({model:.2f}"
                       f"{_modelled_s(run)}) | "
                       f"{busy} | {enq} | {eng.get('assemble_R', float('nan')):.3f} | "
                       f"{splits} | {check}" + (" FELL BACK" if "fallback" in run else "")
                       + f" | {own} | "
                       + (" ; ".join(pinned_text(x) for x in run.get("pinned", [])) or "-")
                       + " |")
    return "\n".join(out)


def run_dask(workers: str, count: int, chunk: int, seconds: float, json_path,
             cpu: bool = False) -> dict:
    """``bench/dask_batched.py`` in its own process, killed after ``seconds``
    (``cpu``: NumPy chunks on CPU workers, a check of the script without a GPU)."""
    cmd = [sys.executable, str(Path(__file__).with_name("dask_batched.py")),
           "--workers", workers, "--count", str(count), "--chunk", str(chunk),
           "--max-seconds", str(max(seconds - 10, 10))] + (["--cpu", "--n", "8"] if cpu else [])
    if json_path:
        cmd += ["--json", str(json_path)]
    t0 = time.perf_counter()
    # a session of its own: on the time limit its whole group (the Dask workers too) goes
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=seconds)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        import signal
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = "killed"
    print(out[-12000:], flush=True)
    res = {"command": " ".join(cmd), "rc": rc, "seconds": time.perf_counter() - t0}
    if json_path and Path(json_path).exists():
        res["result"] = json.loads(Path(json_path).read_text())
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--only", default="")
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="grid40 and ch7-8-b3 on 1 and 2 GPUs, 2 repetitions, a time budget")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="skip the runs that would start after this many seconds")
    p.add_argument("--simulate", action="store_true",
                   help="k device layers on GPU 0 instead of k GPUs")
    p.add_argument("--numpy", action="store_true",
                   help="k NumPy device layers on the host (checks the script; no GPU)")
    p.add_argument("--budget-fraction", type=float, default=0.0,
                   help="per-device budget as a fraction of the one-stage GPU bytes")
    p.add_argument("--public", action="store_true")
    p.add_argument("--split", default="rule", choices=sorted(SPLIT_MODES),
                   help="dense fronts of the upper tree over every GPU: 'off', 'rule' "
                        "(the model's choice, the library's default), 'on' (every "
                        "one), 'both' (off, then rule)")
    p.add_argument("--r-slot-mb", default="",
                   help="R's copy slot sizes (MB) each multi-device setting runs with "
                        "(default: the engine's)")
    p.add_argument("--mapping", default="measured",
                   help="mappings each multi-device setting runs with, in order: "
                        "'flops' (device_speeds=None), 'measured' (the engine's default)")
    p.add_argument("--switch-interval", default="lib",
                   help="interpreter switch intervals (s) each setting runs with, in order "
                        "('lib': the library's default, 'none': the process' own)")
    p.add_argument("--keep-pools", action="store_true",
                   help="keep CuPy's device and pinned pools between the calls of a setting "
                        "(a user's repeated call); default: emptied after every call")
    p.add_argument("--drop-pinned", action="store_true",
                   help="let go of the pinned blocks multi-device calls keep, after every "
                        "call (each call pins ahead again)")
    p.add_argument("--probe", action="store_true",
                   help="one more call per setting watched by a lock probe (GilProbe)")
    p.add_argument("--check-only", default="",
                   help="matrices whose answers are checked (default: all)")
    p.add_argument("--check-r", default="",
                   help="matrices whose R alone is compared with one GPU's")
    p.add_argument("--ordering", default="colamd",
                   help="column orderings each matrix is analysed with, in order "
                        "(e.g. 'colamd,metis'); speedups against one GPU of the same ordering")
    p.add_argument("--dask", default="",
                   help="then the Dask batched-LU throughput over these GPU worker counts")
    p.add_argument("--dask-count", type=int, default=1 << 24)
    p.add_argument("--dask-chunk", type=int, default=1 << 19,
                   help="matrices per chunk (2**19 float64 32 x 32: 4 GiB)")
    p.add_argument("--dask-seconds", type=float, default=150.0)
    a = p.parse_args(argv)
    if a.quick:
        a.only = a.only or QUICK["only"]
        a.gpus = QUICK["gpus"] if a.gpus == p.get_default("gpus") else a.gpus
        a.reps = QUICK["reps"] if a.reps == p.get_default("reps") else a.reps
        a.max_seconds = QUICK["max_seconds"] if a.max_seconds is None else a.max_seconds
    t_start = time.perf_counter()
    deadline = None if a.max_seconds is None else t_start + a.max_seconds
    counts = [int(x) for x in a.gpus.split(",") if x]
    if a.numpy:
        names = ["numpy (no GPU)"]
    else:
        from scipy_gpuqr._engine.gpu.multi_device import device_count
        visible = device_count()
        if visible < 1:
            print("no GPU visible", file=sys.stderr)
            return 1
        if not a.simulate:
            counts = [k for k in counts if k <= visible]
        import cupy as cp
        names = [cp.cuda.runtime.getDeviceProperties(d)["name"] for d in range(visible)]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        peer = {f"{i}->{j}": bool(cp.cuda.runtime.deviceCanAccessPeer(i, j))
                for i in range(visible) for j in range(visible) if i != j}
        print(f"peer access possible: {peer}", flush=True)
    print(f"{len(names)} device(s): {', '.join(names)}; counts {counts}"
          + (" (simulated on GPU 0)" if a.simulate else ""), flush=True)
    only = list(dict.fromkeys(x for x in a.only.split(",") if x))
    runner = _Runner(a.numpy, keep_pools=a.keep_pools, drop_pinned=a.drop_pinned)
    checked = [x for x in a.check_only.split(",") if x]
    r_only = [x for x in a.check_r.split(",") if x]
    slots = tuple(int(float(x) * (1 << 20)) for x in a.r_slot_mb.split(",") if x) or (None,)
    orderings = _orderings(a.ordering)
    rows = []
    for n, make, order in ((n, make, o) for n, make in _matrices(only, a.numpy)
                           for o in orderings):
        rows.append(run_one(_label(n, order, orderings), make, counts, a.reps,
                            simulate=a.simulate,
                            budget_fraction=a.budget_fraction, public=a.public,
                            runner=runner, deadline=deadline, split=a.split,
                            mappings=[x for x in a.mapping.split(",") if x], slots=slots,
                            switches=_switches(a.switch_interval), probe=a.probe,
                            verify=("r" if n in r_only else not checked or n in checked),
                            ordering=order))
        if a.json:                      # after each matrix: a run cut short keeps the rest
            Path(a.json).write_text(json.dumps({"gpus": names, "counts": counts,
                                                "simulate": a.simulate, "numpy": a.numpy,
                                                "keep_pools": a.keep_pools,
                                                "drop_pinned": a.drop_pinned,
                                                "budget_fraction": a.budget_fraction,
                                                "rows": rows}, indent=1, default=str))
    print("\n" + summary(rows), flush=True)
    dask = None
    if a.dask:
        runner.free()
        dj = (Path(a.json).with_name(Path(a.json).stem + "_dask.json") if a.json else None)
        dask = run_dask(a.dask, a.dask_count, a.dask_chunk, a.dask_seconds, dj, cpu=a.numpy)
        if a.json:
            doc = json.loads(Path(a.json).read_text())
            doc["dask"] = dask
            Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    print(f"total {time.perf_counter() - t_start:.1f} s", flush=True)
    bad = [(r["matrix"], run["gpus"]) for r in rows for run in r["runs"] if "error" in run]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
