"""Schedule build time on the paper's ch7-8-b3 problem (CPU only, issue 4).

Measures, for each tile size: the whole schedule built cold (no tile pattern
cached), built again for a new analysis of the same matrix (patterns cached),
taken from the per-analysis cache (``refactor``), and built launch by launch
(plan, then each launch's records when asked for). For the launch-by-launch
build it compares each launch's CPU time with the GPU time of the launch
before it at the target rate (10 TF/s on the analysis' flops, spread over the
launches in proportion to their tile-kernel flops): the GPU waits only where
building launch k+1 takes longer than running launch k. CPU times are
``time.process_time``, minimum over ``--repeat`` runs.

Usage: ``PYTHONPATH=. python3 bench/schedule_build.py [--tiles 32 64] [--repeat 3]``
"""

import argparse
import json
import time

import numpy as np

from scipy_gpuqr._schedule import bucket
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache, record_flops
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary

RATE = 1e13


def measure(an, tile, repeat):
    cold, plan_cold, cached, plan, hit = [], [], [], [], []
    for _ in range(repeat):
        for out, lazy in ((cold, False), (plan_cold, True)):
            clear_schedule_cache(an)
            bucket.clear_cache()
            t0 = time.process_time()
            s = build_schedule(an, tile=tile, cache=False, lazy=lazy)
            out.append(time.process_time() - t0)
        t0 = time.process_time()
        full = build_schedule(an, tile=tile, cache=False)
        cached.append(time.process_time() - t0)
        t0 = time.process_time()
        lazy = build_schedule(an, tile=tile, cache=False, lazy=True)
        plan.append(time.process_time() - t0)
        build_schedule(an, tile=tile)
        t0 = time.perf_counter()
        build_schedule(an, tile=tile)
        hit.append(time.perf_counter() - t0)
    st = full.stages[0]
    fl = record_flops(st.tasks, tile)
    lf = np.add.reduceat(fl, st.launch_ptr[:-1])
    gpu = lf / lf.sum() * an.flops / RATE
    cpu = np.full(st.nlaunch, np.inf)
    for _ in range(repeat):
        for L in range(st.nlaunch):
            t0 = time.process_time()
            lazy.stages[0].launch_tasks(L)
            cpu[L] = min(cpu[L], time.process_time() - t0)
    late = np.maximum(cpu[1:] - gpu[:-1], 0)
    types = np.bincount(st.tasks["type"], minlength=7)
    return {"tile": tile, "launches": full.nlaunch, "tasks": full.ntasks,
            "apply": int(types[2]), "apply_factorize": int(types[3]),
            "factorize": int(types[1]), "cold_s": min(cold), "patterns_cached_s": min(cached),
            "analysis_cached_s": min(hit), "plan_cold_s": min(plan_cold), "plan_s": min(plan),
            "per_launch_total_s": float(cpu.sum()),
            "launches_cpu_slower": int(np.sum(late > 0)),
            "gpu_wait_in_launches_s": float(late.sum()),
            "gpu_wait_cold_s": float(late.sum() + cpu[0] + min(plan_cold)),
            "gpu_s_at_10TF": float(gpu.sum())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    t0 = time.process_time()
    an = analyze(chessboard_boundary(7, 8, 3))
    print(f"ch7-8-b3: {an.m}x{an.n}, {an.nfronts} fronts, {an.flops / 1e12:.2f} TFlop, "
          f"analysis {time.process_time() - t0:.2f} s CPU")
    rows = [measure(an, t, a.repeat) for t in a.tiles]
    for r in rows:
        print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
