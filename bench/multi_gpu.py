"""Sparse QR on 1, 2 and 4 GPUs of one host (subtrees mapped to devices).

Run on the multi-GPU machine::

    source .dev/remote-setup.sh
    python3 bench/multi_gpu.py --json $OUT/multi_gpu.json [--gpus 1,2,4] [--only grid40,ch7-8-b3]

Per matrix: the analysis, then per device count ``k`` the device plan
(``scipy_gpuqr._schedule.devices.map_devices``: stages, contribution blocks
crossing devices, the modelled speedup from the front tree), one warm-up
factorization and ``--reps`` timed ones: wall time of the engine call until
R is a host ``csc_array`` (``gpu_factorize`` for one GPU,
``multi_gpu_factorize`` for several), medians; per device its busy time
(CUDA events around its stages' kernels, from the arrival of the carried
blocks), launches and flops; the speedup against one GPU from the same run
and R's largest difference from the one-GPU R. ``--public`` also times
``QRFactorization(A, backend='gpu', gpuqr_options=GpuqrOptions(devices=...))``
plus one solve.

``--budget-fraction 0.6`` gives every device ``0.6 ×`` the one-stage GPU bytes
of each matrix (``max_gpu_memory``): one GPU then stages through host memory,
while the devices together may hold it unstaged (the table says the stages
of each run and whether the plan fits). ``--simulate`` runs ``k`` device
layers on GPU 0 (streams of one GPU: checks the path, no speedup expected).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _matrices(only):
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               random_least_squares)
    gens = {
        "grid40": lambda: grid3d_least_squares(40),
        "grid50": lambda: grid3d_least_squares(50),
        "grid60": lambda: grid3d_least_squares(60),
        "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
        "randls-20k": lambda: random_least_squares(20000, 4000, density=0.0012,
                                                   dense_rows=40, seed=1),
        "randls-60k": lambda: random_least_squares(60000, 12000, density=0.0004,
                                                   dense_rows=60, seed=2),
    }
    names = [n for n in gens if not only or n in only]
    return [(n, gens[n]) for n in names]


def _free():
    import cupy as cp
    for d in range(cp.cuda.runtime.getDeviceCount()):
        with cp.cuda.Device(d):
            cp.cuda.Device(d).synchronize()
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()


def _factorize(A, an, ids, budget):
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.gpu.multi_device import multi_gpu_factorize
    if len(ids) == 1:
        return gpu_factorize(A, an, max_gpu_memory=budget)
    return multi_gpu_factorize(A, an, devices=ids, max_gpu_memory=budget)


def _public(A, ids, reps):
    from scipy_gpuqr import GpuqrOptions, QRFactorization
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        with QRFactorization(A, backend="gpu", gpuqr_options=GpuqrOptions(devices=ids)) as F:
            F.solve(b)
        times.append(time.perf_counter() - t0)
        _free()
    return statistics.median(times[1:])


def run_one(name, make, counts, reps, *, simulate, budget_fraction, public):
    from scipy_gpuqr._schedule.devices import map_devices
    from scipy_gpuqr._symbolic import analyze
    A = make()
    t0 = time.perf_counter()
    an = analyze(A)
    row = {"matrix": name, "shape": list(A.shape), "nnz": int(A.nnz),
           "flops": float(an.flops), "gpu_bytes": int(an.gpu_bytes),
           "analysis_seconds": time.perf_counter() - t0, "runs": []}
    budget = int(budget_fraction * an.gpu_bytes) if budget_fraction else None
    R1 = None
    base = None
    for k in counts:
        ids = [0] * k if simulate else list(range(k))
        plan = map_devices(an, k, device_memory=budget)
        run = {"gpus": k, "devices": ids, "plan": plan.as_dict()}
        try:
            qr = _factorize(A, an, ids, budget)          # warm-up (kernels, schedule, R layout)
            qr.free()
            _free()
            times, infos = [], []
            for rep in range(reps):
                t = time.perf_counter()
                qr = _factorize(A, an, ids, budget)
                times.append(time.perf_counter() - t)
                infos.append(qr.info)
                if k == counts[0] and R1 is None:
                    R1 = qr.R
                elif R1 is not None and rep == 0:
                    scale = max(abs(R1).max(), 1.0)
                    run["R_diff"] = float(abs(qr.R - R1).max() / scale)
                qr.free()
                _free()
        except Exception as exc:                          # noqa: BLE001 - report, go on
            run["error"] = f"{type(exc).__name__}: {exc}"
            row["runs"].append(run)
            print(f"{name:12s} {k} GPU(s): {run['error']}", flush=True)
            _free()
            continue
        med = statistics.median(times)
        info = infos[len(infos) // 2]
        run.update(seconds=med, all_seconds=times, tflops=an.flops / med / 1e12,
                   stages=int(info.get("stages", 0)),
                   staged=bool(k == 1 and int(info.get("stages", 1)) > 1),
                   launches=int(info.get("launches", 0)),
                   transfers=len(info.get("transfers", [])),
                   transfer_bytes=int(sum(t[3] for t in info.get("transfers", []))))
        per = info.get("devices", {}).get("devices")
        if per:
            run["per_device"] = per
        else:                                             # one GPU: its kernel time
            run["per_device"] = [{"device": 0, "busy_seconds":
                                  info.get("seconds", {}).get("gpu_kernels", float("nan")),
                                  "launches": int(info.get("launches_with_tasks", 0)),
                                  "flops": float(an.flops)}]
        if base is None and k == counts[0]:
            base = med
        run["speedup"] = base / med if base else float("nan")
        if public:
            try:
                run["public_seconds"] = _public(A, ids, max(1, reps - 1))
            except Exception as exc:                      # noqa: BLE001
                run["public_error"] = f"{type(exc).__name__}: {exc}"
        row["runs"].append(run)
        busy = " ".join(f"{d.get('busy_seconds', float('nan')):.3f}" for d in run["per_device"])
        print(f"{name:12s} {k} GPU(s) {med:8.3f} s  x{run['speedup']:.2f} "
              f"(model x{plan.modelled_speedup:.2f})  {run['tflops']:.2f} TF/s  "
              f"stages {run['stages']}  busy [{busy}] s  "
              f"moved {run['transfer_bytes'] / 1e6:.1f} MB  fits {plan.fits}"
              + (f"  R diff {run['R_diff']:.1e}" if "R_diff" in run else ""), flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--only", default="")
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--simulate", action="store_true",
                   help="k device layers on GPU 0 instead of k GPUs")
    p.add_argument("--budget-fraction", type=float, default=0.0,
                   help="per-device budget as a fraction of the one-stage GPU bytes")
    p.add_argument("--public", action="store_true")
    a = p.parse_args(argv)
    from scipy_gpuqr._engine.gpu.multi_device import device_count
    visible = device_count()
    if visible < 1:
        print("no GPU visible", file=sys.stderr)
        return 1
    counts = [int(x) for x in a.gpus.split(",") if x]
    if not a.simulate:
        counts = [k for k in counts if k <= visible]
    import cupy as cp
    names = [cp.cuda.runtime.getDeviceProperties(d)["name"] for d in range(visible)]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    print(f"{visible} GPU(s): {', '.join(names)}; counts {counts}"
          + (" (simulated on GPU 0)" if a.simulate else ""), flush=True)
    only = {x for x in a.only.split(",") if x}
    rows = [run_one(n, make, counts, a.reps, simulate=a.simulate,
                    budget_fraction=a.budget_fraction, public=a.public)
            for n, make in _matrices(only)]
    if a.json:
        Path(a.json).write_text(json.dumps({"gpus": names, "counts": counts,
                                            "simulate": a.simulate,
                                            "budget_fraction": a.budget_fraction,
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
