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

It also reports whether the CPU keeps ahead launch by launch: with the
plan and each launch's records built one after the other (what the engine's
worker does) and the GPU running launch k as soon as its records exist, the
GPU idles ``max_k (cpu_cum(k) - gpu_cum(<k))`` in all, ``cpu_cum(k)`` the CPU
time to launch k's records (plan included) and ``gpu_cum(<k)`` the GPU time
of the launches before k at 10 TF/s (tile flops, plus the Householder flops
of the dense fronts factorized after them).

``--base DIR`` runs the same cold measure (plan + launch 0) interleaved in one
process against an older tree unpacked as ``DIR/scipy_gpuqr_base`` (``git
archive COMMIT scipy_gpuqr | tar -x -C DIR && mv DIR/scipy_gpuqr
DIR/scipy_gpuqr_base``): the host's throughput drifts too much between
processes to compare otherwise. ``--lazy-emulation`` replays, from the
finished schedule's front start launches, a *lazy plan* that simulates a
front's tile pattern only when the front is about to start (horizons 0, 2,
4, 8, ... launches; a parent's start is known once its children are
simulated), timing the real bucket simulation of each batch: its total CPU
and the GPU idle it implies against the one-shot simulation.

Usage: ``PYTHONPATH=. python3 bench/schedule_build.py [--tiles 32 64] [--repeat 3]``
or ``PYTHONPATH=. python3 bench/schedule_build.py --first-launch [--repeat 3]
[--dense-flops off,1e10] [--base DIR [--warm-from CACHE_DIR]] [--lazy-emulation]``
or ``PYTHONPATH=. python3 bench/schedule_build.py --disk-cache ROUNDS [--dense-flops 1e10]``.

The schedules' disk cache (``scipy_gpuqr._schedule.cache``) is off in
every in-process measure (they are cold), except this tree's *warm* variant
of ``--base`` with ``--warm-from DIR`` (what was read forgotten and the folder read again each round: the plan file when there is one).
``--disk-cache ROUNDS`` runs each measure in a **new process** (import and
analysis timed apart), interleaved: disk cache off, disk cache off with the
NumPy bucket simulation (``$SCIPY_GPUQR_SCHEDULE_SIM=numpy``; every other
measure takes the compiled one, built once before anything is timed), fresh (an empty folder:
every pattern simulated, patterns and plan written), warm (the folder the
fresh process wrote: the plan read back) and patterns (that folder without
its plan files: the plan built from the tile patterns on disk); CPU time of
the plan, of launch 0's records, of the whole schedule (every launch's
records in the engine's chunks) and the GPU idle it implies.
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from scipy_gpuqr._schedule import bucket, cache, native
from scipy_gpuqr._schedule.dense import dense_front_mask
from scipy_gpuqr._schedule.sparse import (build_schedule, clear_schedule_cache, record_flops,
                                         schedule_digest)
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
            build_schedule(an, tile=tile, cache=False, lazy=lazy)
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


def _launch_times(s, walls: bool = False):
    """CPU seconds spent before each launch's records are handed out, the records
    built as the engine's worker builds them (chunks of launches); with ``walls``
    also the wall-clock seconds."""
    times, wall = [], []
    prev, wprev = time.process_time(), time.perf_counter()
    for _ in s.iter_launches(prefetch=False):
        now, wnow = time.process_time(), time.perf_counter()
        times.append(now - prev)
        wall.append(wnow - wprev)
        prev, wprev = now, wnow
    return (np.asarray(times), np.asarray(wall)) if walls else np.asarray(times)


def _launch_flops(st, tile):
    """Tile-kernel flops of every launch of a stage (empty launches: 0)."""
    launch = np.repeat(np.arange(st.nlaunch), np.diff(st.launch_ptr))
    return np.bincount(launch, weights=record_flops(st.tasks, tile), minlength=st.nlaunch)


def first_launch(an, tile=32, repeat=3, dense_flops=None):
    """Cold CPU time to launch 0's records and the per-launch GPU wait (tile flops at
    10 TF/s); minimum over ``repeat`` runs per quantity (disk cache off)."""
    folder = os.environ.get(cache.ENV)
    os.environ[cache.ENV] = "off"
    try:
        return _first_launch(an, tile, repeat, dense_flops)
    finally:
        if folder is None:
            os.environ.pop(cache.ENV, None)
        else:
            os.environ[cache.ENV] = folder


def _first_launch(an, tile, repeat, dense_flops):
    first, plan = [], []
    cpu = None
    for _ in range(repeat):
        clear_schedule_cache(an)
        bucket.clear_cache()
        t0 = time.process_time()
        s = build_schedule(an, tile=tile, cache=False, lazy=True, dense_flops=dense_flops)
        t1 = time.process_time()
        plan.append(t1 - t0)
        times = _launch_times(s)
        first.append(t1 - t0 + times[0])
        cpu = np.asarray(times) if cpu is None else np.minimum(cpu, times)
    gpu = np.concatenate([_launch_flops(st, tile) for st in s.stages if st.nlaunch]) / RATE
    late = np.maximum(cpu[1:] - gpu[:-1], 0)
    # keeping ahead: the GPU runs launch k once its records exist (plan + launches
    # 0..k built one after the other) and after launch k-1; dense fronts count at
    # the launch after which they are factorized
    g_all = gpu.copy()
    ff = getattr(an, "front_flops", None)
    for f, L in s.dense.items():
        g_all[L] += float(ff[f]) / RATE if ff is not None else 0.0
    cpu_cum = min(plan) + np.cumsum(cpu)
    gpu_before = np.concatenate(([0.0], np.cumsum(g_all)[:-1]))
    behind = cpu_cum - gpu_before
    k_max = int(np.argmax(behind))
    marks = {}
    for q in (10, 100, 200, 500, 1000):
        if q < len(cpu_cum):
            marks[str(q)] = [round(float(cpu_cum[q]) * 1e3, 2), round(float(gpu_before[q]) * 1e3, 2)]
    return {"tile": tile, "dense_flops": dense_flops, "dense_fronts": len(s.dense),
            "stages": len(s.stages), "launches": s.nlaunch, "tasks": s.ntasks,
            "plan_cold_s": min(plan), "first_launch_cold_s": min(first),
            "gpu_s_tile_flops_at_10TF": float(gpu.sum()),
            "launches_cpu_late": int(np.sum(late > 0)),
            "gpu_wait_in_launches_s": float(late.sum()),
            "max_late_s": float(late.max(initial=0)),
            "per_launch_build_total_s": float(cpu.sum()),
            "gpu_s_with_dense_at_10TF": float(g_all.sum()),
            "gpu_idle_keeping_ahead_s": float(max(behind.max(initial=0), 0.0)),
            "gpu_idle_worst_launch": k_max,
            "launches_cpu_behind": int(np.sum(behind > 0)),
            "cpu_vs_gpu_ms_at_launch": marks}


def interleaved(an, base_dir, rounds, dense_flops=None, tile=32):
    """Cold plan + launch 0 and the whole schedule (plan + every launch's records,
    in the engine's chunks), this tree against ``base_dir/scipy_gpuqr_base``,
    interleaved. This tree runs cold (disk cache off) and, when a disk-cache
    folder is set, also *warm from disk* (what was read forgotten, the file
    read again: a new process's path, minus its first-call costs)."""
    sys.path.insert(0, base_dir)
    trees = {"base": (importlib.import_module("scipy_gpuqr_base._schedule.sparse"),
                      importlib.import_module("scipy_gpuqr_base._schedule.bucket")),
             "new": (importlib.import_module("scipy_gpuqr._schedule.sparse"), bucket)}
    folder = os.environ.get(cache.ENV, "")
    warm = bool(folder) and folder.lower() not in ("0", "off", "no", "false", "none")

    def run(name, disk):
        sp_, bk = trees[name]
        os.environ[cache.ENV] = folder if disk else "off"
        sp_.clear_schedule_cache(an)
        bk.clear_cache()
        t0 = time.process_time()
        s = sp_.build_schedule(an, tile=tile, cache=False, lazy=True, dense_flops=dense_flops)
        s.stages[0].launch_tasks(0)
        t1 = time.process_time()
        if hasattr(s, "iter_launches"):
            for _ in s.iter_launches(prefetch=False):
                pass
        else:
            s.materialize()
        return t1 - t0, time.process_time() - t0, s

    modes = [("base", False), ("new", False)] + ([("new", True)] if warm else [])
    if warm:
        run("new", True)                # fill the disk cache
    got = {m: ([], []) for m in modes}
    for r in range(rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            a, b, _ = run(*m)
            got[m][0].append(a)
            got[m][1].append(b)
    digests = {m: schedule_digest(run(*m)[2]) for m in modes}
    os.environ[cache.ENV] = folder or "off"
    out = {"dense_flops": dense_flops, "rounds": rounds,
           "records_identical": len(set(digests.values())) == 1}
    for m, (first, whole) in got.items():
        tag = m[0] + ("_disk" if m[1] else "")
        out[f"{tag}_first_min_s"] = min(first)
        out[f"{tag}_first_median_s"] = float(np.median(first))
        out[f"{tag}_whole_min_s"] = min(whole)
        out[f"{tag}_whole_median_s"] = float(np.median(whole))
    return out


def fresh_process(problem, dense_flops, tile=32):
    """One new process's schedule (the ``--child`` mode): CPU seconds of the plan,
    of launch 0's records and of every launch's records (the engine's chunks),
    the analysis timed apart, and the GPU idle the CPU implies (keeping ahead)."""
    A = _PROBLEMS[problem]()
    t0 = time.process_time()
    an = analyze(A)
    ta = time.process_time() - t0
    w0 = time.perf_counter()
    t0 = time.process_time()
    s = build_schedule(an, tile=tile, cache=False, lazy=True, dense_flops=dense_flops)
    plan = time.process_time() - t0
    plan_wall = time.perf_counter() - w0
    cpu, wall = _launch_times(s, walls=True)
    gpu = np.concatenate([_launch_flops(st, tile) for st in s.stages if st.nlaunch]) / RATE
    for f, L in s.dense.items():
        gpu[L] += float(an.front_flops[f]) / RATE
    behind = plan + np.cumsum(cpu) - np.concatenate(([0.0], np.cumsum(gpu)[:-1]))
    return {"problem": problem, "dense_flops": dense_flops, "analysis_s": ta, "plan_s": plan,
            "first_launch_s": plan + float(cpu[0]), "whole_s": plan + float(cpu.sum()),
            "plan_wall_s": plan_wall, "first_launch_wall_s": plan_wall + float(wall[0]),
            "whole_wall_s": plan_wall + float(wall.sum()),
            "gpu_s_at_10TF": float(gpu.sum()),
            "gpu_idle_keeping_ahead_s": float(max(behind.max(initial=0), 0.0)),
            "digest": schedule_digest(s), "simulation": native.status()}


#: ``--disk-cache`` measures: cold (compiled simulation), cold with the NumPy simulation,
#: fresh, warm (plan file), tile patterns only
MODES = ("off", "numpy", "fresh", "warm", "patterns")


def disk_cache_processes(rounds, dense=(None,)):
    """Fresh processes, interleaved: disk cache off (cold), the same with the NumPy
    bucket simulation (``numpy``; the others take the compiled one when
    :mod:`scipy_gpuqr._schedule.native` has it), fresh (empty folder:
    simulated, tile patterns and plan written), warm (the folder the fresh one
    wrote: the plan read) and *patterns* (that folder without its plan files:
    the plan built from the tile patterns on disk, as for a new matrix whose
    patterns are known)."""
    rows = []
    for problem in _PROBLEMS:
        for d in dense:
            got = {m: [] for m in MODES}
            with tempfile.TemporaryDirectory() as tmp:
                for r in range(rounds):
                    folder = os.path.join(tmp, f"r{r}")
                    order = (("off", "numpy", "fresh", "warm", "patterns") if r % 2 == 0 else
                             ("fresh", "patterns", "warm", "numpy", "off"))
                    for mode in order:
                        env = dict(os.environ)
                        env[cache.ENV] = "off" if mode in ("off", "numpy") else folder
                        env[native.ENV] = "numpy" if mode == "numpy" else "auto"
                        if mode == "patterns":      # tile patterns on disk, no plan file
                            shutil.rmtree(os.path.join(folder, "plans"), ignore_errors=True)
                        out = subprocess.run(
                            [sys.executable, __file__, "--child", problem,
                             "off" if d is None else repr(d)],
                            env=env, capture_output=True, text=True, check=True).stdout
                        got[mode].append(json.loads(out.strip().splitlines()[-1]))
            row = {"problem": problem, "dense_flops": d, "rounds": rounds,
                   "records_identical": len({x["digest"] for v in got.values()
                                             for x in v}) == 1,
                   "gpu_s_at_10TF": got["off"][0]["gpu_s_at_10TF"],
                   "simulation": {m: sorted({e["simulation"] for e in v}) for m, v in got.items()}}
            for mode, v in got.items():
                for q in ("plan_s", "first_launch_s", "whole_s", "gpu_idle_keeping_ahead_s",
                          "plan_wall_s", "first_launch_wall_s", "whole_wall_s"):
                    x = [e[q] for e in v]
                    row[f"{mode}_{q[:-2]}_min_s"] = min(x)
                    row[f"{mode}_{q[:-2]}_median_s"] = float(np.median(x))
            print(json.dumps(row))
            rows.append(row)
    print("problem | disk cache | plan | plan + launch 0 | whole schedule | GPU idle | "
          "wall: plan + launch 0 | wall: whole (CPU ms, then wall ms; min / median of new "
          "processes)")
    for row in rows:
        for mode in MODES:
            print(row["problem"], "|", mode, "|", " | ".join(
                f"{row[f'{mode}_{q}_min_s'] * 1e3:.1f} / {row[f'{mode}_{q}_median_s'] * 1e3:.1f}"
                for q in ("plan", "first_launch", "whole", "gpu_idle_keeping_ahead",
                          "first_launch_wall", "whole_wall")))
    return rows


def lazy_emulation(an, dense_flops=None, tile=32, bundle=3, granule=16, growth=2.0):
    """Replay a lazy plan's bucket simulations (see the module doc); CPU seconds."""
    s = build_schedule(an, tile=tile, cache=False, dense_flops=dense_flops)
    if len(s.stages) != 1:
        raise ValueError("lazy_emulation: one stage only")
    st = s.stages[0]
    fs = an.fronts
    nf = fs.nfronts
    g = _launch_flops(st, tile) / RATE
    for f, L in st.dense.items():
        g[L] += float(an.front_flops[f]) / RATE
    gpu_before = np.concatenate(([0.0], np.cumsum(g)))
    dense = dense_front_mask(an, dense_flops)
    nfact = np.minimum(fs.fm, fs.fn)
    b, tptr = bucket.many_tile_buckets(fs.fm, fs.fn, nfact, fs.stair, fs.col_ptr, tile)
    nct = -(-fs.fn // tile)
    nfct = np.where(nfact > 0, -(-nfact // tile), 0)
    tiled = (nfact > 0) & ~dense
    key = [(b[tptr[f]:tptr[f + 1]].tobytes(), int(nct[f]), int(nfct[f])) for f in range(nf)]
    fin = np.array([st.finish[f] for f in range(nf)])
    # a front's start (assembly) launch: the launch after its last child's last step
    start = np.zeros(nf, dtype=np.int64)
    par = fs.parent
    for f in range(nf):
        p = par[f]
        if p >= 0:
            start[p] = max(start[p], fin[f] + 1)
    pats = {}
    for f in np.flatnonzero(tiled):
        pats.setdefault(key[f], (b[tptr[f]:tptr[f + 1]], int(nct[f]), int(nfct[f])))
    one = np.inf
    for _ in range(3):
        t0 = time.process_time()
        bucket._simulate(list(pats.values()), bundle, True, granule)
        one = min(one, time.process_time() - t0)
    pend = np.bincount(par[par >= 0], minlength=nf)
    known = pend == 0
    done = np.zeros(nf, dtype=bool)
    have = set()
    cpu, H, batches, idle = 0.0, 0, 0, 0.0
    while True:
        while True:
            cand = np.flatnonzero(known & ~done & (start <= H))
            if not len(cand):
                break
            todo = {}
            for f in cand.tolist():
                if tiled[f] and key[f] not in have:
                    todo[key[f]] = pats[key[f]]
            if todo:
                t0 = time.process_time()
                bucket._simulate(list(todo.values()), bundle, True, granule)
                cpu += time.process_time() - t0
                have |= set(todo)
                batches += 1
            done[cand] = True
            for f in cand.tolist():
                p = par[f]
                if p >= 0:
                    pend[p] -= 1
                    known[p] = pend[p] == 0
        # launch H + 1 needs the fronts started by H: the GPU has run launches <= H
        idle = max(idle, cpu - gpu_before[min(H + 1, len(gpu_before) - 1)])
        if H >= st.nlaunch:
            break
        H = max(int(H * growth), H + 2)
    return {"dense_flops": dense_flops, "patterns": len(pats), "one_shot_simulation_s": one,
            "lazy_simulation_s": cpu, "lazy_batches": batches,
            "lazy_gpu_idle_s": idle, "one_shot_gpu_idle_s": one,
            "gpu_s_to_launch_200": float(gpu_before[min(200, len(gpu_before) - 1)])}


_PROBLEMS = {"ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
             "grid3d 40 (LS)": lambda: grid3d_least_squares(40)}


def main_first_launch(repeat, dense=(None,), base=None, rounds=9, emulate=False):
    for name, make in _PROBLEMS.items():
        A = make()
        t0 = time.process_time()
        an = analyze(A)
        ta = time.process_time() - t0
        for d in dense:
            r = first_launch(an, 32, repeat, d)
            r.update(problem=name, shape=list(A.shape), fronts=int(an.nfronts),
                     tflop=an.flops / 1e12, analysis_s=ta)
            print(json.dumps(r))
            if base:
                print(json.dumps({"problem": name, "interleaved": interleaved(an, base, rounds, d)}))
            if emulate:
                print(json.dumps({"problem": name, "lazy_emulation": lazy_emulation(an, d)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--first-launch", action="store_true",
                    help="cold time to launch 0 and per-launch GPU wait (ch7-8-b3, grid 40^3)")
    ap.add_argument("--dense-flops", default="off",
                    help="--first-launch: comma list of dense-front thresholds ('off': none)")
    ap.add_argument("--base", help="--first-launch: an older tree (DIR/scipy_gpuqr_base) "
                    "timed interleaved with this one")
    ap.add_argument("--rounds", type=int, default=9, help="--base: interleaved rounds")
    ap.add_argument("--lazy-emulation", action="store_true",
                    help="--first-launch: replay a lazy plan's bucket simulations")
    ap.add_argument("--disk-cache", type=int, metavar="ROUNDS",
                    help="fresh processes with the tile schedules' disk cache off, fresh "
                    "and warm (ch7-8-b3, grid 40^3; --dense-flops), interleaved")
    ap.add_argument("--child", nargs=2, metavar=("PROBLEM", "DENSE"), help=argparse.SUPPRESS)
    ap.add_argument("--warm-from", metavar="DIR",
                    help="--base: also time this tree warm from the disk cache in DIR")
    a = ap.parse_args()
    dense = [None if x == "off" else float(x) for x in a.dense_flops.split(",") if x]
    if a.child:                 # the disk cache as the parent set it
        print(json.dumps(fresh_process(a.child[0], None if a.child[1] == "off"
                                       else float(a.child[1]))))
        return
    # the compiled bucket simulation built (once per machine) before anything is timed
    t0 = time.perf_counter()
    if native.mode() != "numpy":
        native.library(wait=True)
    print(json.dumps({"simulation": native.status(), "mode": native.mode(),
                      "build_s": native._NATIVE.loader.build_s,
                      "ready_s": time.perf_counter() - t0}))
    # the in-process measures are cold: never the user's disk cache
    os.environ[cache.ENV] = a.warm_from if (a.warm_from and a.base) else "off"
    if a.disk_cache:
        disk_cache_processes(a.disk_cache, dense)
        return
    if a.first_launch:
        main_first_launch(a.repeat, dense, a.base, a.rounds, a.lazy_emulation)
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
