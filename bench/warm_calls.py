"""Where a warm GPU factorization's time goes outside its kernels, call by call.

Run on the GPU machine::

    source .dev/remote-setup.sh
    python3 bench/warm_calls.py [--only grid40] [--calls 6] [--phases default,threads,nogc]

Per matrix, after two calls that compile the kernels and cache the schedule, R's
layout and the memory plan, ``--calls`` warm ``gpu_factorize`` calls per phase,
each line: end to end, the call's start to its first launch enqueued, kernel
time, the host's launch loop, the wait for the GPU, R's wait after it, the R
copier's preparation (gather index up, output pages touched) and total, and the
garbage collections that ran during the call (generation, ms). The first calls'
lines also list the main thread's steps (driver, stage loop, device layer)
with their start and length, those before the first launch in full. Phases:
``default``; ``threads`` (R's copier's host copies on four times the threads,
``rcopy.HOST_COPY_PER_THREAD`` / 4); ``nogc`` (the collector off during the calls).
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

#: The matrices ``--only`` may name (bench/sparse_qr.py's).
MATRICES = ("grid40", "ch7-8-b3", "lp_nug20T")


def _matrix(name):
    import scipy.sparse as sp

    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               qap_linearization)
    if name == "grid40":
        return grid3d_least_squares(40)
    if name == "ch7-8-b3":
        return chessboard_boundary(7, 8, 3)
    if name == "lp_nug20T":
        return sp.csc_array(qap_linearization(20).T)
    raise ValueError(f"--only: one of {MATRICES}, not {name!r}")


class _Probe:
    """Timers on the main thread's steps, the R copiers made, the collections."""

    def __init__(self):
        self.main = threading.get_ident()
        self.events = []            # (step, start from the call's start, seconds)
        self.t0 = 0.0
        self.copiers = []
        self.gc = []

    def wrap(self, owner, name, label):
        f = getattr(owner, name)
        probe = self

        @functools.wraps(f)
        def w(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                if threading.get_ident() == probe.main:
                    probe.events.append((label, t - probe.t0, time.perf_counter() - t))
        setattr(owner, name, w)

    def install(self):
        from scipy_gpuqr._engine.gpu import device, driver, rcopy, stage_loop
        for n in ("task_list_input", "_memory_plan", "build_schedule", "_memory_checks",
                  "assemble_r", "_dense_fronts", "start_layout_load", "prefetch_engine_kernels"):
            if hasattr(driver, n):
                self.wrap(driver, n, n)
        for n in ("__init__", "begin", "start_reflector_records", "open_pool_copy",
                  "open_progressive_copy", "make_host_r_out", "launch_all", "wait_host_side",
                  "keep_reflector_records", "front_list", "r_values", "retire_pool", "info"):
            self.wrap(stage_loop.StageLoop, n, "loop." + n)
        for n in ("__init__", "start", "begin_stage", "end_stage", "open_r_copy"):
            self.wrap(device.CupyDevice, n, "device." + n)
        init = rcopy.CupyRCopy.__init__
        probe = self

        def copier_init(obj, *a, **k):
            init(obj, *a, **k)
            probe.copiers.append(obj)
        rcopy.CupyRCopy.__init__ = copier_init
        self.wrap(rcopy.CupyRCopy, "result", "rcopy.result")
        gc.callbacks.append(lambda phase, info: self.gc.append(
            (phase, info.get("generation"), time.perf_counter())))

    def reset(self):
        self.events.clear()
        self.copiers.clear()
        self.gc.clear()
        self.t0 = time.perf_counter()

    def collections(self):
        return [(self.gc[j][1], round((self.gc[j + 1][2] - self.gc[j][2]) * 1e3, 1))
                for j in range(0, len(self.gc) - 1, 2)]


def one(probe, A, an, tag, i, steps=False):
    import cupy as cp

    from scipy_gpuqr._engine.gpu import driver
    cp.cuda.Device().synchronize()
    probe.reset()
    g = driver.gpu_factorize(A, an)
    wall = time.perf_counter() - probe.t0
    s = g.info["seconds"]
    g.free()
    del g
    cs = probe.copiers[0].seconds if probe.copiers else {}
    print(f"{tag} {i} e2e {wall:.3f} first {s.get('first_launch', 0.0):.3f} "
          f"kern {s['gpu_kernels']:.3f} loop {s['launch_loop']:.3f} gpu {s['wait_gpu']:.3f} "
          f"R {s['wait_r_copy']:.3f} "
          f"copier {cs.get('prepare', 0.0):.3f}/{cs.get('total', 0.0):.3f} "
          f"gc {probe.collections()}", flush=True)
    if steps:
        first = s.get("first_launch", 0.0)
        for name, start, sec in probe.events:
            if start < first or sec > 0.003:
                print(f"    {name:34s} at {start * 1e3:7.1f} ms  {sec * 1e3:7.2f} ms")
    return wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="grid40", help=f"comma list of {', '.join(MATRICES)}")
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--phases", default="default,threads,nogc")
    args = p.parse_args(argv)
    from scipy_gpuqr._engine.gpu import driver, rcopy
    from scipy_gpuqr._symbolic import analyze
    probe = _Probe()
    probe.install()
    for name in [x for x in args.only.split(",") if x]:
        A = _matrix(name)
        an = analyze(A)
        for _ in range(2):
            driver.gpu_factorize(A, an).free()
        summary = {}
        for phase in [x for x in args.phases.split(",") if x]:
            per = rcopy.HOST_COPY_PER_THREAD
            if phase == "threads":
                rcopy.HOST_COPY_PER_THREAD = max(per // 4, 1)
            if phase == "nogc":
                gc.collect()
                gc.disable()
            try:
                walls = [one(probe, A, an, f"{name}/{phase}", i, steps=phase == "default" and i < 2)
                         for i in range(args.calls)]
            finally:
                rcopy.HOST_COPY_PER_THREAD = per
                gc.enable()
            summary[phase] = walls
        for phase, walls in summary.items():
            print(f"{name}/{phase}: median {np.median(walls):.3f} max {max(walls):.3f} s  "
                  + " ".join(f"{w:.3f}" for w in walls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
