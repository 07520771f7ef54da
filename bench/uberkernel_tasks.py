"""Where the uberkernel's tile-task time goes, per Apply variant (no profiler).

Run on the GPU machine::

    python3 bench/uberkernel_tasks.py [--shapes 1500x600x40,...] [--apply scalar,mma-async-lean]

A batch of identical dense fronts (``fm x fn x copies``: the copies share
every launch, as fronts of one level do in the engine) is scheduled by
``bucket.dense_front_tasks`` and run launch by launch three ways, per variant
of ``factorize_kernels.APPLY_VARIANTS``: every task (``full``); the Apply work
only (Factorize records dropped, Apply+Factorize run as Apply; the VT tiles
from the full run); the Factorize work only (Apply records dropped,
Apply+Factorize run as the Factorize of its ``c0`` tile). Each is timed on
the device (CUDA events around the whole launch sequence, task arrays
uploaded beforehand), median of ``--reps``; the full run's front pool is
checked against the first variant's. Flops: the Householder count of the
fronts (``2 n^2 (m - n/3)`` for ``m >= n`` per front).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

TILE, BUNDLE, THREADS = 32, 3, 256


def batch(fm, fn, copies):
    """Tasks (sorted by launch) of ``copies`` fronts side by side; pool sizes."""
    from scipy_gpuqr._schedule import bucket
    from scipy_gpuqr._schedule.tasks import TaskType
    tasks, launch, nvt = bucket.dense_front_tasks(fm, fn, None, None, tile=TILE, bundle=BUNDLE)
    per_f, per_vt = fm * fn, max(nvt, 1) * TILE * TILE
    uses_vt = np.isin(tasks["type"], [TaskType.FACTORIZE, TaskType.APPLY,
                                      TaskType.APPLY_FACTORIZE])
    uses_vt2 = tasks["type"] == TaskType.APPLY_FACTORIZE
    out, lau = [], []
    for c in range(copies):
        t = tasks.copy()
        t["F"] += c * per_f
        t["vt"][uses_vt] += c * per_vt
        t["vt2"][uses_vt2] += c * per_vt
        out.append(t)
        lau.append(launch)
    t = np.concatenate(out)
    la = np.concatenate(lau)
    order = np.argsort(la, kind="stable")
    return t[order], la[order], copies * per_f, copies * per_vt


def only(tasks, part):
    """The records of one kind of work (see the module notes)."""
    from scipy_gpuqr._schedule.tasks import TaskType
    t = tasks.copy()
    ty = t["type"]
    af = ty == TaskType.APPLY_FACTORIZE
    if part == "apply":
        t["type"][ty == TaskType.FACTORIZE] = TaskType.NONE
        t["type"][af] = TaskType.APPLY
    elif part == "factorize":
        t["type"][ty == TaskType.APPLY] = TaskType.NONE
        t["type"][af] = TaskType.FACTORIZE
        t["col"][af] = t["c0"][af]
        t["nref"][af] = t["aux"][af]
        t["vt"][af] = t["vt2"][af]
    return t


def run(kern, smem, tasks, launch, F, VT, reps):
    """Median device seconds of the launch sequence; F/VT as left by the last rep."""
    import cupy as cp
    F0 = F.copy()
    per = [cp.asarray(np.ascontiguousarray(tasks[launch == L]).view(np.uint8))
           for L in np.unique(launch)]
    n = [int((launch == L).sum()) for L in np.unique(launch)]
    z = (cp.zeros(1, cp.int64), cp.zeros(1, cp.float64), cp.zeros(1, cp.int64))
    times = []
    for _ in range(reps):
        F[...] = F0
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for d, k in zip(per, n):
            kern((k,), (THREADS,), (d, F, VT, *z), shared_mem=smem)
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1500x600x40,5000x1000x8,300x300x400")
    p.add_argument("--apply", default="scalar,mma-async-lean")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import cupy as cp

    from scipy_gpuqr._engine.gpu import factorize_kernels as fk
    from scipy_gpuqr._kernels import load_module
    mod = load_module(fk.UBERKERNEL_FILE, fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE])
    names = [x for x in args.apply.split(",") if x]
    rows = []
    for shape in args.shapes.split(","):
        fm, fn, copies = (int(x) for x in shape.split("x"))
        tasks, launch, nf, nvt = batch(fm, fn, copies)
        m, n = max(fm, fn), min(fm, fn)
        flops = copies * 2.0 * n * n * (m - n / 3.0)
        rng = np.random.default_rng(0)
        F_init = cp.asarray(rng.standard_normal(nf))
        ref = None
        for name in names:
            a = fk.APPLY_VARIANTS[name]
            kern = mod.get_function(fk.kernel_name("double", TILE, BUNDLE, THREADS, a))
            smem = fk.tile_smem_bytes(TILE, BUNDLE, 8, apply=a)
            kern.max_dynamic_shared_size_bytes = smem
            row = {"shape": shape, "apply": name, "launches": int(launch.max()) + 1,
                   "tasks": int(len(tasks)), "flops": flops}
            F = F_init.copy()
            VT = cp.zeros(nvt)
            row["full_s"] = run(kern, smem, tasks, launch, F, VT, args.reps)
            got = cp.asnumpy(F)
            if ref is None:
                ref = got
            row["max_rel_diff_vs_first"] = float(np.abs(got - ref).max() / np.abs(ref).max())
            row["finite"] = bool(np.isfinite(got).all())
            for part in ("apply", "factorize"):
                F = F_init.copy()
                row[f"{part}_only_s"] = run(kern, smem, only(tasks, part), launch, F, VT,
                                            args.reps)
            row["tflops_full"] = flops / row["full_s"] / 1e12
            rows.append(row)
            print(f"{shape:>14s} {name:>15s} full {row['full_s'] * 1e3:8.2f} ms "
                  f"({row['tflops_full']:5.2f} TF/s)  apply-only {row['apply_only_s'] * 1e3:8.2f}"
                  f"  factorize-only {row['factorize_only_s'] * 1e3:8.2f} ms  "
                  f"diff {row['max_rel_diff_vs_first']:.1e}", flush=True)
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
