"""One dense front factorized over several GPUs against the one-device dense path.

::

    python3 bench/split_front.py --shapes 49340x9375,29958x9924,18497x6116 --ids 0,1 --reps 3

Per shape: a random dense front (float64) in a pool on the first device; the
one-device dense path (``factorize_cupy``, as the engines run a dense front)
and the split over the device layers ``--ids`` (``CupySplit`` driven by
``run_split``, block owners from ``block_owners``; ``--ids 0,0`` runs two
layers on one GPU: the path's overhead, no speedup expected), with its own
cuBLAS handle per stream (``lean``) and, with ``--plain``, also through the
thread's shared handle. Each timed run is enqueued and then synchronized;
the table gives the median wall seconds, the host's enqueueing seconds of the
split (an upper bound of its host cost: a full launch queue also holds the
host), the modelled seconds of both (``scipy_gpuqr._schedule.dense_split``)
and the largest difference of the two fronts (R, reflectors) relative to
their largest entry.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


sys.path.append(str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="49340x9375,29958x9924,18497x6116")
    p.add_argument("--ids", default="0,1")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--plain", action="store_true",
                   help="also the split through the thread's shared cuBLAS handle")
    p.add_argument("--json")
    a = p.parse_args(argv)
    import cupy as cp
    from scipy_gpuqr._engine.dense_front import DEFAULT_PANEL, factorize_cupy, panels_of
    from scipy_gpuqr._engine.gpu.multi_device import cupy_layers, device_count
    from scipy_gpuqr._engine.gpu.split_front import CupySplit, enable_peers
    from scipy_gpuqr._engine.split_front import run_split
    from scipy_gpuqr._schedule.dense_split import split_plan
    ids = [int(x) for x in a.ids.split(",")]
    if max(ids) >= device_count():
        print(f"ids {ids}: only {device_count()} GPU(s)", file=sys.stderr)
        return 1
    name = cp.cuda.runtime.getDeviceProperties(ids[0])["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    print(f"device {name}, layers on GPUs {ids}", flush=True)
    layers = cupy_layers(ids)
    enable_peers(cp, ids)
    main_l = layers[0]
    nb = DEFAULT_PANEL
    rows = []
    print("| front | one device s (enqueue) | split | s | x | split enqueue s | model one / split s "
          "| blocks | max diff |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for shape in a.shapes.split(","):
        fm, fn = (int(x) for x in shape.lower().split("x"))
        panels = panels_of(fm, fn, None, nb)
        plan = split_plan(fm, fn, None, len(ids))
        with cp.cuda.Device(ids[0]):
            src = cp.random.default_rng(1).standard_normal((fm, fn))
            F = cp.empty_like(src)
            one, one_enq = [], []
            for rep in range(a.reps + 1):
                F[...] = src
                cp.cuda.Device().synchronize()
                t = time.perf_counter()
                with main_l.stream:
                    factorize_cupy(F, panels, nb, stream=main_l.stream)
                one_enq.append(time.perf_counter() - t)
                main_l.stream.synchronize()
                one.append(time.perf_counter() - t)
                if rep == 0:
                    ref = F.copy()
            res = {}
            for lean in ([True, False] if a.plain else [True]):
                split, enq = [], []
                for rep in range(a.reps + 1):
                    F[...] = src
                    cp.cuda.Device().synchronize()
                    t = time.perf_counter()
                    ready = cp.cuda.Event()
                    ready.record(main_l.stream)
                    be = CupySplit(main_l, layers[1:], F, panels, nb, plan.owners, ready,
                                   lean=lean)
                    be.prepare()
                    t1 = time.perf_counter()
                    run_split(be, panels, nb, fn, plan.owners)
                    enq.append(time.perf_counter() - t1)
                    main_l.stream.wait_event(be.done)
                    main_l.stream.synchronize()
                    for i in dict.fromkeys(ids):
                        cp.cuda.Device(i).synchronize()
                    split.append(time.perf_counter() - t)
                    be.release()
                diff = float(cp.abs(cp.abs(F) - cp.abs(ref)).max() / cp.abs(ref).max())
                res["lean" if lean else "plain"] = (statistics.median(split[1:]),
                                                    statistics.median(enq[1:]), diff)
            del src, F, ref
            cp.get_default_memory_pool().free_all_blocks()
        t1s, t1q = statistics.median(one[1:]), statistics.median(one_enq[1:])
        for how, (t2s, tq, diff) in res.items():
            row = {"shape": [fm, fn], "split": how, "one_seconds": t1s,
                   "one_enqueue_seconds": t1q, "split_seconds": t2s,
                   "enqueue_seconds": tq, "model": plan.as_dict(), "max_diff": diff,
                   "ids": ids, "device": name}
            rows.append(row)
            print(f"| {fm}x{fn} | {t1s:.4f} ({t1q:.4f}) | {how} | {t2s:.4f} | {t1s / t2s:.2f} | {tq:.4f} | "
                  f"{plan.one_device_seconds:.4f} / {plan.seconds:.4f} | "
                  f"{row['model']['blocks']} | {diff:.1e} |", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
