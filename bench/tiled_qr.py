"""Benchmark: qr_tiled on CPU, 1 GPU, 2 GPUs, CPU+GPUs vs cuSOLVER and LAPACK.

For every size: cuSOLVER geqrf on gpu:0 (``cupy.linalg.qr(mode='r')``) and
LAPACK (``scipy.linalg.qr(mode='r')``, skipped above ``--cpu-max``) in the
same run, then ``qr_tiled(mode='r')`` on each device set with the input on
gpu:0; median of ``--reps`` timed runs after one warm-up. TF/s uses the
Householder QR flop count ``2 m n^2 - 2 n^3 / 3`` (m >= n). The model's
predicted ``T(p)`` (normalised to its minimum) is printed beside the measured
times of the same device sets (the paper's Table III).

    python3 bench/tiled_qr.py --sizes 2048 4096 8192 16384 --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import scipy.linalg

from scipy_gpuqr import qr_tiled
from scipy_gpuqr.tiled import _ops as ops
from scipy_gpuqr.tiled._qr import plan_tiled


def flops(m, n):
    if m < n:
        m, n = n, m
    return 2.0 * m * n * n - 2.0 * n ** 3 / 3.0


def timed(fn, sync, reps):
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--tall", action="store_true", help="also 2n x n/2 shapes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cpu-max", type=int, default=8192,
                    help="largest n for LAPACK on the CPU")
    ap.add_argument("--cpu-tiled-max", type=int, default=4096,
                    help="largest n for qr_tiled on the CPU alone")
    ap.add_argument("--tiles", type=int, nargs="+", default=[512])
    ap.add_argument("--shapes", nargs="*", default=[],
                    help="extra MxN shapes, e.g. 32768x8192")
    ap.add_argument("--leaves", type=int, nargs="*", default=[],
                    help="also time 1 and 2 GPUs with these panel_leaf values "
                         "(first tile only) and the panel alone")
    ap.add_argument("--no-cpu", action="store_true",
                    help="skip the configurations that use the CPU")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import cupy as cp               # the benchmark needs a GPU; --help does not

    ngpu = cp.cuda.runtime.getDeviceCount()
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"# {ngpu} x {name}; scipy {scipy.__version__}, cupy {cp.__version__}")
    sync = lambda: [cp.cuda.Device(i).synchronize() for i in range(ngpu)]
    shapes = [(n, n) for n in args.sizes]
    if args.tall:
        shapes += [(2 * n, n // 2) for n in args.sizes]
    shapes += [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes]
    rows = []
    for (m, n) in shapes:
        with cp.cuda.Device(0):
            ad = cp.random.default_rng(m + n).standard_normal((m, n))
        need_host = not args.no_cpu and (max(m, n) <= args.cpu_max
                                         or max(m, n) <= args.cpu_tiled_max)
        a = cp.asnumpy(ad) if need_host else None
        f = flops(m, n)
        rec = {"m": m, "n": n, "flops": f}
        rec["cusolver"] = timed(lambda: cp.linalg.qr(ad, mode="r"), sync, args.reps)
        r_ref = cp.abs(cp.linalg.qr(ad, mode="r"))
        if max(m, n) <= args.cpu_max and not args.no_cpu:
            rec["lapack"] = timed(lambda: scipy.linalg.qr(a, mode="r", check_finite=False),
                                  lambda: None, 1)
        for tile in args.tiles:
            configs = [("1gpu", ["gpu:0"], None)]
            if ngpu >= 2:
                configs += [("2gpu", ["gpu:0", "gpu:1"], None)]
                if not args.no_cpu:
                    configs += [("cpu+2gpu", ["cpu", "gpu:0", "gpu:1"], None)]
            elif not args.no_cpu:
                configs += [("cpu+1gpu", ["cpu", "gpu:0"], None)]
            if (max(m, n) <= args.cpu_tiled_max and tile == args.tiles[0]
                    and not args.no_cpu):
                configs.insert(0, ("cpu", ["cpu"], None))
            if tile == args.tiles[0]:
                for leaf in args.leaves:
                    configs += [(f"{lab}_leaf{leaf}", devs, leaf)
                                for lab, devs, _ in configs[:2] if "gpu" in lab
                                and "cpu" not in lab]
                configs.append(("auto", "auto", None))   # the model's own choice
                configs += [(f"auto_leaf{leaf}", "auto", leaf) for leaf in args.leaves]
            for label, devs, leaf in configs:
                key = f"tiled_{label}" if devs == "auto" else f"tiled_{label}_t{tile}"
                try:
                    dev_in = a if devs == ["cpu"] else ad
                    ts = None if devs == "auto" else tile
                    kw = {} if leaf is None else {"panel_leaf": leaf}
                    t = timed(lambda: qr_tiled(dev_in, mode="r", devices=devs,
                                               tile_size=ts, **kw), sync,
                              args.reps if devs != ["cpu"] else 1)
                    (r,) = qr_tiled(dev_in, mode="r", devices=devs, tile_size=ts, **kw)
                    r = cp.asarray(r) if isinstance(r, np.ndarray) else r
                    with cp.cuda.Device(0):
                        err = float(cp.abs(cp.abs(cp.asarray(r)[:min(m, n)]) - r_ref[:min(m, n)]).max()
                                    / r_ref.max())
                    rec[key] = t
                    rec[key + "_err"] = err
                except Exception as exc:  # report and go on
                    rec[key] = None
                    rec[key + "_error"] = f"{type(exc).__name__}: {exc}"
                    print(f"  {key}: {rec[key + '_error']}", file=sys.stderr)
            if tile == args.tiles[0] and args.leaves:
                # the main device's panel alone: the tallest tile column
                with cp.cuda.Device(0):
                    col = cp.asfortranarray(ad[:, :tile])
                    for leaf in [0] + [x for x in args.leaves if x]:
                        rec[f"panel_{m}x{tile}_leaf{leaf}"] = timed(
                            lambda: ops.factor_wy(cp, col, 0, leaf=leaf), sync,
                            max(args.reps, 5))
                print("  panel " + ", ".join(
                    f"{k}: {v*1e3:.2f} ms" for k, v in rec.items()
                    if k.startswith("panel_")), flush=True)
            try:
                plan, profiles, bw = plan_tiled((m, n), np.float64, "auto", tile)
                if rec["m"] == shapes[0][0] and rec["n"] == shapes[0][1]:
                    print("  profiles: " + "; ".join(
                        f"{q.name} T+E {1e3*(q.t_T+q.t_E):.3f} ms, UT+UE "
                        f"{1e3*q.update_time:.3f} ms, sync {1e6*q.t_sync_step:.0f}"
                        f" us/step + {1e3*q.t_sync_fixed:.2f} ms" for q in profiles),
                        flush=True)
                rec[f"plan_t{tile}"] = {"main": plan.main, "devices": plan.devices,
                                        "guide": plan.guide, "candidates": plan.candidates,
                                        "predicted": plan.predicted}
            except Exception as exc:
                rec[f"plan_t{tile}"] = {"error": str(exc)}
        rows.append(rec)
        line = f"{m}x{n}: cuSOLVER {rec['cusolver']*1e3:.1f} ms ({f/rec['cusolver']/1e12:.2f} TF/s)"
        if "lapack" in rec:
            line += f", LAPACK {rec['lapack']*1e3:.0f} ms"
        for k, v in rec.items():
            if k.startswith("tiled_") and not k.endswith(("_err", "_error")) and v:
                line += (f", {k[6:]} {v*1e3:.1f} ms (x{rec['cusolver']/v:.2f} vs cuSOLVER,"
                         f" err {rec[k + '_err']:.1e})")
        print(line, flush=True)
        ad = None                   # the pool gets its memory back
        cp.get_default_memory_pool().free_all_blocks()
    # Table III style: predicted vs measured, normalised to the minimum
    print("\n| shape | tile | candidates | predicted T(p)/min | measured t(p)/min | predicted p | measured p |")
    print("|---|---|---|---|---|---|---|")
    for rec in rows:
        for tile in args.tiles:
            plan = rec.get(f"plan_t{tile}", {})
            if "predicted" not in plan:
                continue
            cand = plan["candidates"]
            meas = []
            for p in range(1, len(cand) + 1):
                devs = set(cand[:p])
                label = {frozenset(["gpu:0"]): "1gpu", frozenset(["gpu:1"]): "1gpu",
                         frozenset(["gpu:0", "gpu:1"]): "2gpu",
                         frozenset(["cpu", "gpu:0", "gpu:1"]): "cpu+2gpu",
                         frozenset(["cpu", "gpu:0"]): "cpu+1gpu"}.get(frozenset(devs))
                meas.append(rec.get(f"tiled_{label}_t{tile}") if label else None)
            pred = plan["predicted"]
            pm = min(pred)
            ok = [x for x in meas if x]
            mm = min(ok) if ok else None
            pbest = pred.index(pm) + 1
            mbest = meas.index(mm) + 1 if mm else None
            print(f"| {rec['m']}x{rec['n']} | {tile} | {','.join(cand)} | "
                  + " ".join(f"{x/pm:.2f}" for x in pred) + " | "
                  + " ".join(f"{x/mm:.2f}" if x else "-" for x in meas)
                  + f" | {pbest} | {mbest} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
