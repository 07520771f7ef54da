"""Which threads the exact answer keeps busy: CPU per thread group of
``scipy_gpuqr.lsqr(A, b, backend='cpu')``, and which call woke each BLAS pool.

Usage (CPU or GPU host; the rows are names of ``tests/data/matrices`` or
``$SHARED_MATRICES``)::

    python3 bench/exact_threads.py --rows dwt_878,adder_dcop_05,nnc1374,bayer10
    python3 bench/exact_threads.py --rows bayer10 --pool 16     # pools of 16 on a small host

The process' threads are named by when they appeared: the OpenBLAS pool of
NumPy (after ``import numpy``), of SciPy (after ``scipy.linalg``), of
SuiteSparseQR's BLAS (after libspqr loads); with ``--pool N`` every pool is
first set to N threads, the workers made then named by the pool's setter.
Others by their name (``/proc/self/task/*/comm``); threads that ended
within a call (the host lanes) as one group.

For each row: a first call, then ``--reps`` calls, each after ``--gap``
seconds of sleep (the pools' workers of the call before have stopped
spinning); each call's wall time, process CPU time and, per thread group, the
CPU time during the call and in the ``--gap`` seconds after it (workers still
spinning: OpenBLAS's wait for new work, ``OPENBLAS_THREAD_TIMEOUT``). Medians
of the calls after the first. Then one more call watched by a sampler
thread (about every millisecond): every pool worker that ran after 20
samples idle is a *wake*, charged to the main thread's innermost package
frames at that moment (the call that spread work over the pool), and the
pools' CPU is charged the same way (so it lands on the woken call and
whatever ran while the workers spun). The process' BLAS libraries (mapped
files) and each pool's count are printed first.

``--lanes N`` sets the host rank decision's most lanes
(``scipy_gpuqr._factor.host_lanes.MAX_LANES``) for the run. ``--plain-norms``
gives the least-squares refinement's stopping test (``FactoredQR._refined``)
norms taken by NumPy's sum instead of its BLAS dot, which spreads a vector of
more than 10000 entries over the whole pool: what that test's wake costs.

CPU time per thread from ``/proc/self/task/*/schedstat`` (Linux only).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import threading
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _tids() -> set:
    return {int(t) for t in os.listdir("/proc/self/task")}


LABELS = {threading.get_native_id(): "main"}
for _t in _tids():
    LABELS.setdefault(_t, "before numpy")
import numpy as np                                                  # noqa: E402
for _t in _tids():
    LABELS.setdefault(_t, "numpy-openblas")
import scipy.linalg                                                 # noqa: E402,F401
import scipy.sparse as sp                                           # noqa: E402
for _t in _tids():
    LABELS.setdefault(_t, "scipy-openblas")
from scipy_gpuqr._cpu import spqr as _spqr                          # noqa: E402
try:
    _spqr._libs()
except Exception as exc:  # noqa: BLE001 - a host without SuiteSparse: no such pool
    print(f"SuiteSparseQR not loaded: {exc}")
for _t in _tids():
    LABELS.setdefault(_t, "spqr-blas")
import scipy_gpuqr                                                  # noqa: E402
from scipy_gpuqr._cpu.blas_threads import find_openblas_pools       # noqa: E402
from scipy_gpuqr.io import mmread                                   # noqa: E402
for _t in _tids():
    LABELS.setdefault(_t, "after imports")
MAIN_TID = threading.get_native_id()
MAIN_IDENT = threading.get_ident()


def name_of(tid: int) -> str:
    """The group of thread ``tid``."""
    if tid in LABELS:
        return LABELS[tid]
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = "?"
    return "thread " + comm.rstrip("0123456789_-")


def snap() -> dict:
    """CPU nanoseconds of every live thread."""
    out = {}
    for t in _tids():
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                out[t] = int(f.read().split()[0])
        except OSError:
            pass
    return out


def by_group(a: dict, b: dict, cpu_s: float = None) -> collections.Counter:
    """CPU milliseconds per group between snapshots; ``cpu_s`` (the process' CPU
    meanwhile) puts what the live threads do not account for under 'ended threads'."""
    g = collections.Counter()
    for t, v in b.items():
        g[name_of(t)] += (v - a.get(t, 0)) / 1e6
    if cpu_s is not None:
        g["ended threads"] += max(0.0, cpu_s * 1e3 - sum(g.values()))
    return g


def is_pool(group: str) -> bool:
    return group.endswith("openblas") or group in ("spqr-blas",) or group.startswith("pool ")


def blas_libraries() -> list:
    """Mapped files that look like a BLAS, LAPACK or OpenMP runtime."""
    keys = ("blas", "lapack", "gomp", "iomp", "omp5", "tbb", "mkl")
    seen = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if any(k in os.path.basename(path).lower() for k in keys) and path not in seen:
                    seen.append(path)
    except OSError:
        pass
    return seen


def frames() -> str:
    """The main thread's innermost three package frames."""
    f = sys._current_frames().get(MAIN_IDENT)
    chain = []
    while f is not None and len(chain) < 3:
        fn = f.f_code.co_filename
        if "scipy_gpuqr" in fn:
            chain.append(f"{os.path.basename(fn)}:{f.f_lineno} {f.f_code.co_name}")
        f = f.f_back
    return " < ".join(chain) if chain else "(outside the package)"


class Sampler:
    """Pool workers' wakes and CPU, charged to the main thread's frames."""

    def __init__(self):
        self.cpu = collections.Counter()
        self.wakes = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = threading.get_native_id()
        prev = snap()
        idle = {t: 100 for t in prev}
        while not self._stop.is_set():
            time.sleep(0.001)
            cur = snap()
            where = None
            for t, v in cur.items():
                group = name_of(t)
                if t in (MAIN_TID, me) or not is_pool(group):
                    continue
                ms = (v - prev.get(t, 0)) / 1e6
                if ms > 0:
                    where = where or frames()
                    self.cpu[(group, where)] += ms
                if ms > 0.05 and idle.get(t, 0) >= 20:
                    self.wakes[(group, where)] += 1
                idle[t] = idle.get(t, 0) + 1 if ms <= 0.05 else 0
            prev = cur


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="dwt_878,adder_dcop_05,nnc1374,bayer10")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--gap", type=float, default=0.3,
                   help="seconds of sleep before and after each call")
    p.add_argument("--pool", type=int, default=0,
                   help="set every OpenBLAS pool to this many threads first (0: as found)")
    p.add_argument("--lanes", type=int, default=0,
                   help="the host rank decision's most lanes (0: the package's)")
    p.add_argument("--plain-norms", action="store_true",
                   help="the refinement's stopping-test norms without NumPy's BLAS dot")
    a = p.parse_args(argv)
    if a.lanes:
        from scipy_gpuqr._factor import host_lanes
        host_lanes.MAX_LANES = a.lanes
    if a.plain_norms:
        from scipy_gpuqr._factor.factored import FactoredQR
        refined = FactoredQR._refined

        def plain(self, solve, matrix, B, X, norm):
            if isinstance(X, np.ndarray):
                def norm(Y):
                    return float(np.sqrt(np.sum(np.square(Y))))
            return refined(self, solve, matrix, B, X, norm)
        FactoredQR._refined = plain
    pools = find_openblas_pools()
    for get, set_ in pools:
        name = getattr(set_, "__name__", "?")
        if a.pool:
            before = _tids()
            set_(a.pool)
            for t in _tids() - before:
                LABELS[t] = "pool " + name
        print(f"pool {name}: {int(get())} threads")
    print("BLAS libraries:", ", ".join(blas_libraries()) or "none found")
    from scipy_gpuqr._factor import host_lanes
    print(f"cores {len(os.sched_getaffinity(0))}, numpy {np.__version__}, "
          f"scipy {scipy.__version__}, lanes {host_lanes.MAX_LANES}, "
          f"plain norms {a.plain_norms}")
    folder = os.environ.get("SHARED_MATRICES") or os.path.join(ROOT, "tests", "data", "matrices")
    for name in a.rows.split(","):
        A = sp.csc_array(mmread(os.path.join(folder, f"{name}.mtx"))).astype(np.float64)
        b = np.random.default_rng([20261126, zlib.crc32(name.encode())]).standard_normal(A.shape[0])
        calls = []
        for _ in range(a.reps + 1):
            time.sleep(a.gap)
            s0, c0, t0 = snap(), time.process_time(), time.perf_counter()
            x = scipy_gpuqr.lsqr(A, b, backend="cpu")[0]
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            s1 = snap()
            time.sleep(a.gap)
            calls.append((wall, cpu, by_group(s0, s1, cpu), by_group(s1, snap())))
        rest = calls[1:] or calls

        def med(f):
            return statistics.median(f(c) for c in rest)
        print(f"\n{name}: wall {med(lambda c: c[0]) * 1e3:.1f} ms, CPU {med(lambda c: c[1]) * 1e3:.1f} ms "
              f"(first call {calls[0][0] * 1e3:.1f} / {calls[0][1] * 1e3:.1f} ms), x crc "
              f"{zlib.crc32(np.ascontiguousarray(x).tobytes()):08x}")
        groups = sorted(set().union(*(set(c[2]) | set(c[3]) for c in calls)))
        print(f"  {'thread group':34s} {'during':>9s} {'after':>9s} {'first':>9s} (ms, medians)")
        for g in groups:
            row = (med(lambda c: c[2].get(g, 0.0)), med(lambda c: c[3].get(g, 0.0)),
                   calls[0][2].get(g, 0.0))
            if max(row) >= 0.5:
                print(f"  {g:34s} {row[0]:9.1f} {row[1]:9.1f} {row[2]:9.1f}")
        time.sleep(a.gap)
        with Sampler() as s:
            scipy_gpuqr.lsqr(A, b, backend="cpu")
        print("  pools woken (workers run after >= 20 ms idle), by the main thread's frames:")
        for (g, where), n in s.wakes.most_common(12):
            print(f"    {n:3d} {g:22s} {where}")
        print("  pools' CPU by the main thread's frames (ms):")
        for (g, where), ms in s.cpu.most_common(8):
            print(f"    {ms:7.1f} {g:22s} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
