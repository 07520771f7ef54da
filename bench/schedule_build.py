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

With ``--first-launch`` it measures instead, cold (no tile pattern, no
schedule cached) on ch7-8-b3 and the 3-D grid 40³ least squares problem, what
the GPU would wait for: (1) the CPU time from the analysis to launch 0's
records (plan + launch 0), (2) for every launch k the CPU time to build launch
k+1 against launch k's GPU time at 10 TF/s on its *nominal tile-kernel flops*
(``record_flops / 1e13``, zero padding included), the launches where the CPU
would be late and the GPU wait they add up to. The analysis is timed apart
(CPU work before any launch in every design). ``--dense-flops off,1e11``
repeats it per dense-front threshold (``scipy_gpuqr._schedule.dense``: those
fronts get no tile schedule, so their bucket simulation disappears from the
plan; their GPU time is not in the tile flops).

Usage: ``PYTHONPATH=. python3 bench/schedule_build.py [--tiles 32 64] [--repeat 3]``
or ``PYTHONPATH=. python3 bench/schedule_build.py --first-launch [--repeat 3]``
"""

import argparse
import json
import time

import numpy as np

from scipy_gpuqr._schedule import bucket
from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache, record_flops
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

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


def _launch_flops(st, tile):
    """Tile-kernel flops of every launch of a stage (empty launches: 0)."""
    launch = np.repeat(np.arange(st.nlaunch), np.diff(st.launch_ptr))
    return np.bincount(launch, weights=record_flops(st.tasks, tile), minlength=st.nlaunch)


def first_launch(an, tile=32, repeat=3, dense_flops=None):
    """Cold CPU time to launch 0's records and the per-launch GPU wait (tile flops at
    10 TF/s); minimum over ``repeat`` runs per quantity."""
    first, plan = [], []
    cpu = None
    for _ in range(repeat):
        clear_schedule_cache(an)
        bucket.clear_cache()
        t0 = time.process_time()
        s = build_schedule(an, tile=tile, cache=False, lazy=True, dense_flops=dense_flops)
        t1 = time.process_time()
        s.stages[0].launch_tasks(0)
        t2 = time.process_time()
        plan.append(t1 - t0)
        first.append(t2 - t0)
        times = []
        for st in s.stages:
            for L in range(st.nlaunch):
                t0 = time.process_time()
                st.launch_tasks(L)
                times.append(time.process_time() - t0)
        cpu = np.asarray(times) if cpu is None else np.minimum(cpu, times)
    gpu = np.concatenate([_launch_flops(st, tile) for st in s.stages if st.nlaunch]) / RATE
    late = np.maximum(cpu[1:] - gpu[:-1], 0)
    return {"tile": tile, "dense_flops": dense_flops, "dense_fronts": len(s.dense),
            "stages": len(s.stages), "launches": s.nlaunch, "tasks": s.ntasks,
            "plan_cold_s": min(plan), "first_launch_cold_s": min(first),
            "gpu_s_tile_flops_at_10TF": float(gpu.sum()),
            "launches_cpu_late": int(np.sum(late > 0)),
            "gpu_wait_in_launches_s": float(late.sum()),
            "max_late_s": float(late.max(initial=0)),
            "per_launch_build_total_s": float(cpu.sum())}


def main_first_launch(repeat, dense=(None,)):
    for name, make in (("ch7-8-b3", lambda: chessboard_boundary(7, 8, 3)),
                       ("grid3d 40 (LS)", lambda: grid3d_least_squares(40))):
        A = make()
        t0 = time.process_time()
        an = analyze(A)
        ta = time.process_time() - t0
        for d in dense:
            r = first_launch(an, 32, repeat, d)
            r.update(problem=name, shape=list(A.shape), fronts=int(an.nfronts),
                     tflop=an.flops / 1e12, analysis_s=ta)
            print(json.dumps(r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--first-launch", action="store_true",
                    help="cold time to launch 0 and per-launch GPU wait (ch7-8-b3, grid 40^3)")
    ap.add_argument("--dense-flops", default="off",
                    help="--first-launch: comma list of dense-front thresholds ('off': none)")
    a = ap.parse_args()
    if a.first_launch:
        dense = [None if x == "off" else float(x) for x in a.dense_flops.split(",") if x]
        main_first_launch(a.repeat, dense)
        return
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
