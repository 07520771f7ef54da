"""A CUDA-event timeline of the blocked LU's parts on their streams.

Runs the library's blocked LU (``_rows_lu`` of
:mod:`scipy_gpuqr.batched._gpu_blocked` with the tensor-core panels, the
batch in ``--streams`` parts on streams of their own) on one random float64
stack, with an event recorded on the launch's stream before and after every
launch; the launches are labelled by wrapping the kernel getters and the
GEMM call. Prints, per kind of launch, its count, the sum of its intervals
on its stream and how much of that another part's stream was busy beside
it, and with what; the same call without the events (their own cost); the
first launches in time order. ``--json`` writes the timeline (part, kind,
start and end ms after the call's start).

Usage::

    python3 bench/batched_lu_timeline.py --n 512 --batch 2000 --json timeline.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    import cupy as cp
    import numpy as np
    from scipy_gpuqr.batched import _gpu_blocked as bb
    from scipy_gpuqr.batched._gpu_common import device_id

    label = []
    names = {bb.MMA_ROWS_NAME: "panel", bb.MMA_SWAP_NAME: "rows_swap",
             bb.MMA_COPY_NAME: "copy_perm", bb.MMA_LEFT_NAME: "swap_left"}

    class Named:
        def __init__(self, fn, name):
            object.__setattr__(self, "_fn", fn)
            object.__setattr__(self, "_name", name)

        def __getattr__(self, a):
            return getattr(self._fn, a)

        def __setattr__(self, a, v):
            setattr(self._fn, a, v)

        def __call__(self, grid, block, kargs, **kw):
            tag = self._name
            if tag == "panel":
                tag = f"panel w{block[0] // 32}"
            label.append(tag)
            return self._fn(grid, block, kargs, **kw)

    orig_mma, orig_rows, orig_gemm = bb._mma64_function, bb._rows_function, bb._gemm_strided
    bb._mma64_function = lambda dev, name=bb.MMA64_NAME: Named(orig_mma(dev, name),
                                                              names.get(name, name))
    bb._rows_function = lambda kernel, *a: Named(orig_rows(kernel, *a), kernel)

    def gemm(a, m, nn, k, *rest, **kw):
        label.append(f"gemm k{k}" + (" trailing" if m == nn and m > 32 else ""))
        return orig_gemm(a, m, nn, k, *rest, **kw)

    bb._gemm_strided = gemm

    n, bsz, parts = args.n, args.batch, args.streams
    rng = cp.random.default_rng(11)
    a = rng.standard_normal((bsz, n, n), dtype=np.float64)
    lu = cp.empty_like(a)
    piv = cp.empty((bsz, n), dtype=cp.int32)
    info = cp.empty((bsz,), dtype=cp.int32)

    def timed_run():
        """_rows_lu's multi-part branch with events around each launch."""
        outer = bb.rows_outer(n)
        moves = cp.empty((bsz, bb.MMA_MOVE_STRIDE), dtype=cp.int32)
        lanes = bb._lanes(device_id(), parts)
        cuts = [bsz * i // parts for i in range(parts + 1)]
        runs = [bb._rows_lu_launches(lu[lo:hi], piv[lo:hi], info[lo:hi], True, outer,
                                     a[lo:hi], True, moves[lo:hi], handle)
                for (_, handle), lo, hi in zip(lanes, cuts, cuts[1:])]
        main = cp.cuda.get_current_stream()
        start = cp.cuda.Event()
        start.record(main)
        for s, _ in lanes:
            s.wait_event(start)
        recs = []
        pending = [(i, s, r) for i, ((s, _), r) in enumerate(zip(lanes, runs))]
        while pending:
            left = []
            for i, s, r in pending:
                with s:
                    e0 = cp.cuda.Event()
                    e0.record(s)
                    label.clear()
                    if next(r, None) is not None:
                        e1 = cp.cuda.Event()
                        e1.record(s)
                        recs.append((i, label[-1] if label else "?", e0, e1))
                        left.append((i, s, r))
            pending = left
        end = cp.cuda.Event()
        for s, _ in lanes:
            main.wait_event(s.record())
        end.record(main)
        end.synchronize()
        rows = [(i, k, cp.cuda.get_elapsed_time(start, e0),
                 cp.cuda.get_elapsed_time(start, e1)) for i, k, e0, e1 in recs]
        return cp.cuda.get_elapsed_time(start, end), rows

    for _ in range(2):
        timed_run()
    # the same call without per-launch events (the events' own cost)
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    plain = []
    for _ in range(args.reps):
        ev0.record()
        bb._rows_lu(lu, piv, info, True, src=a, streams=parts)
        ev1.record()
        ev1.synchronize()
        plain.append(cp.cuda.get_elapsed_time(ev0, ev1))
    best = None
    for _ in range(args.reps):
        total, rows = timed_run()
        if best is None or total < best[0]:
            best = (total, rows)
    total, rows = best
    print(f"n={n} batch={bsz} parts={parts}: with events {total:.3f} ms "
          f"(plain median {sorted(plain)[len(plain) // 2]:.3f}), {len(rows)} launches")

    def group(kind):
        return kind.split()[0] if not kind.startswith("gemm") else (
            "gemm trailing" if "trailing" in kind else "gemm small")

    def overlap(iv, others):
        s0, s1 = iv
        out = {}
        for _, k, o0, o1 in others:
            d = min(s1, o1) - max(s0, o0)
            if d > 0:
                out[group(k)] = out.get(group(k), 0.0) + d
        return out

    table = {}
    for i, k, t0, t1 in rows:
        g = group(k)
        others = [r for r in rows if r[0] != i]
        ov = overlap((t0, t1), others)
        e = table.setdefault(g, {"count": 0, "ms": 0.0, "beside": {}})
        e["count"] += 1
        e["ms"] += t1 - t0
        for kk, d in ov.items():
            e["beside"][kk] = e["beside"].get(kk, 0.0) + d
    busy = [sum(t1 - t0 for i, _, t0, t1 in rows if i == s) for s in range(parts)]
    print("  stream busy ms: " + ", ".join(f"{b:.3f}" for b in busy)
          + "; idle ms per stream (the call's time less its busy time): "
          + ", ".join(f"{total - b:.3f}" for b in busy))
    print(f"  {'kind':14s} {'n':>3s} {'ms':>7s} {'beside':>7s}  beside which (ms)")
    for g, e in sorted(table.items(), key=lambda kv: -kv[1]["ms"]):
        bes = sum(e["beside"].values())
        print(f"  {g:14s} {e['count']:3d} {e['ms']:7.3f} {bes:7.3f}  "
              + ", ".join(f"{k} {v:.3f}" for k, v in sorted(e["beside"].items(),
                                                              key=lambda kv: -kv[1])))
    print("  first 24 launches (stream, kind, start, end ms):")
    for r in sorted(rows, key=lambda r: r[2])[:24]:
        print(f"    {r[0]} {r[1]:22s} {r[2]:7.3f} {r[3]:7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"total": total, "plain": plain, "rows": rows}))
    bb._mma64_function, bb._rows_function, bb._gemm_strided = orig_mma, orig_rows, orig_gemm


if __name__ == "__main__":
    main()
