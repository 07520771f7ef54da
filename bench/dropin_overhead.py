"""Per-call overhead of ``auto`` on small problems: ours against SciPy's own call.

Where SciPy's own function answers under ``auto`` (``spsolve``/``factorized``
below the SuperLU threshold, ``lsqr``/``lsmr`` whose iterations converge on
the CPU), everything ours adds is the wrapper: input checks, settings, the
decision and its log. This measures it::

    python3 bench/dropin_overhead.py --calls 3000

Each case times SciPy's function (``scipy.sparse.linalg``, unpatched) and
ours (``scipy_gpuqr``, backend ``auto`` from the default) on the same
arguments, interleaved call by call (the order alternating every round, so
drift and cache effects fall on both alike), after warm-up calls. Reported:
the median time of each, and the median of the per-round difference ours −
SciPy (the overhead; robust to drift because both calls of a round run
back to back). The garbage collector is off while timing.

``--cold`` times each call from cold caches instead, as ``bench/dropin.py``
times its ladder: ``gc.collect()`` before every call (it walks the whole
heap, so the code and data a call touches are out of the CPU's caches), the
collector otherwise on. There the cost of a call grows with how much code it
touches; hot, with how much it runs::

    python3 bench/dropin_overhead.py --calls 1000 --cold --clock thread

Cases: ``spsolve`` on a 2-D Laplacian of 500 unknowns (CSC) and on
494_bus (``tests/data/matrices``, when present); ``factorized(A)`` followed
by one ``solve(b)`` on the Laplacian; ``lsqr`` and ``lsmr`` on random
sparse least-squares problems, 2000×500 (density 1 %) and 200×100 (5 %),
each plus the identity on top (SciPy's default tolerances; b random, seed
fixed); and the tiniest calls (a 3×2 least-squares problem and a 4×4 system,
every entry stored), where a fixed cost weighs most.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import scipy_gpuqr  # noqa: E402

MATRICES = ROOT / "tests" / "data" / "matrices"


def laplacian_2d(nx: int, ny: int) -> sp.csc_matrix:
    """The 5-point Laplacian of an nx × ny grid (nx·ny unknowns), CSC."""
    def lap1(k):
        return sp.diags([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], [-1, 0, 1])
    return sp.csc_matrix(sp.kronsum(lap1(nx), lap1(ny)))


def cases():
    """``(name, scipy_call, our_call)`` for each case."""
    rng = np.random.default_rng(0)
    out = []
    A = laplacian_2d(20, 25)
    b = rng.standard_normal(A.shape[0])
    out.append(("spsolve, 2-D Laplacian 500x500",
                lambda: spla.spsolve(A, b), lambda: scipy_gpuqr.spsolve(A, b)))
    bus = MATRICES / "494_bus.mtx"
    if bus.exists():
        from scipy.io import mmread
        B = sp.csc_matrix(mmread(str(bus)))
        bb = rng.standard_normal(B.shape[0])
        out.append(("spsolve, 494_bus 494x494",
                    lambda: spla.spsolve(B, bb), lambda: scipy_gpuqr.spsolve(B, bb)))
    out.append(("factorized(A)(b), 2-D Laplacian 500x500",
                lambda: spla.factorized(A)(b), lambda: scipy_gpuqr.factorized(A)(b)))
    L = sp.random(2000, 500, density=0.01, format="csr", random_state=1) + \
        sp.eye(2000, 500, format="csr")
    c = rng.standard_normal(L.shape[0])
    out.append(("lsqr, random 2000x500 (1 %)",
                lambda: spla.lsqr(L, c), lambda: scipy_gpuqr.lsqr(L, c)))
    out.append(("lsmr, random 2000x500 (1 %)",
                lambda: spla.lsmr(L, c), lambda: scipy_gpuqr.lsmr(L, c)))
    S = sp.random(200, 100, density=0.05, format="csr", random_state=2) + \
        sp.eye(200, 100, format="csr")
    d = rng.standard_normal(S.shape[0])
    out.append(("lsqr, random 200x100 (5 %)",
                lambda: spla.lsqr(S, d), lambda: scipy_gpuqr.lsqr(S, d)))
    out.append(("lsmr, random 200x100 (5 %)",
                lambda: spla.lsmr(S, d), lambda: scipy_gpuqr.lsmr(S, d)))
    T = sp.csc_array(rng.standard_normal((3, 2)))
    e = rng.standard_normal(3)
    out.append(("lsqr, dense-stored 3x2", lambda: spla.lsqr(T, e),
                lambda: scipy_gpuqr.lsqr(T, e)))
    out.append(("lsmr, dense-stored 3x2", lambda: spla.lsmr(T, e),
                lambda: scipy_gpuqr.lsmr(T, e)))
    Q = sp.csc_array(rng.standard_normal((4, 4)) + 4 * np.eye(4))
    f = rng.standard_normal(4)
    out.append(("spsolve, dense-stored 4x4", lambda: spla.spsolve(Q, f),
                lambda: scipy_gpuqr.spsolve(Q, f)))
    return out


def measure(scipy_call, our_call, calls: int, warmup: int = 50, clock=time.perf_counter,
            cold: bool = False):
    """Median seconds of SciPy's and our call, and the median per-round difference
    (``cold``: ``gc.collect()`` before each call, the collector otherwise on)."""
    for _ in range(warmup):
        scipy_call()
        our_call()

    def timed(call):
        if cold:
            gc.collect()
        t0 = clock()
        call()
        return clock() - t0

    ts, to, diff = [], [], []
    if not cold:
        gc.disable()
    try:
        for i in range(calls):
            if i % 2:
                o = timed(our_call)
                s = timed(scipy_call)
            else:
                s = timed(scipy_call)
                o = timed(our_call)
            ts.append(s)
            to.append(o)
            diff.append(o - s)
            if not cold and i % 200 == 199:
                gc.collect()
    finally:
        gc.enable()
    return statistics.median(ts), statistics.median(to), statistics.median(diff)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed rounds per case")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="wall: time.perf_counter; thread: this thread's CPU time "
                             "(time.thread_time, not counting time the thread was not "
                             "running: steadier on a loaded host)")
    parser.add_argument("--cold", action="store_true",
                        help="gc.collect() before every call (cold caches, as bench/dropin.py)")
    args = parser.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    if os.environ.get("SCIPY_GPUQR_BACKEND"):
        print("SCIPY_GPUQR_BACKEND is set: unset it to measure auto", file=sys.stderr)
        return 2
    print(f"# {os.cpu_count()} cores, clock {args.clock}, {'cold' if args.cold else 'hot'}, "
          f"load average "
          f"{os.getloadavg()[0]:.2f}, gpu: {scipy_gpuqr.gpu_info()['reason']}", file=sys.stderr)
    rows = []
    for name, scipy_call, our_call in cases():
        if args.only and args.only not in name:
            continue
        s, o, d = measure(scipy_call, our_call, args.calls, clock=clock, cold=args.cold)
        rows.append((name, s, o, d))
        print(f"{name:42s} scipy {s * 1e6:9.1f} us  ours {o * 1e6:9.1f} us  "
              f"ours-scipy {d * 1e6:7.1f} us  ratio {o / s:5.3f}", file=sys.stderr)
    print("| call | SciPy (µs) | ours, auto (µs) | ours − SciPy, median per round (µs) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, s, o, d in rows:
        print(f"| {name} | {s * 1e6:.1f} | {o * 1e6:.1f} | {d * 1e6:.1f} | {o / s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
