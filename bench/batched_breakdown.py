"""Where the blocked n > 32 LU and Cholesky spend their device time.

Runs ``scipy_gpuqr.batched._gpu_blocked.getrf`` / ``potrf`` (the default or
``--method``) with a CUDA event pair around every kernel launch and cuBLAS
GEMM of the driver, and prints the summed device time per kind of step
(panel kernels by name, GEMMs by shape class) next to the whole call timed
without the events (median of ``--reps``, after a warm-up). The steps are
timed with the blocked LU's batch in one part on one stream (the parts of
the default call run side by side, their steps overlap); the whole call is
the default.

Usage::

    python3 bench/batched_breakdown.py --sizes 128:20000,256:4000,512:2000
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128:20000,256:4000,512:2000")
    ap.add_argument("--ops", default="lu,chol")
    ap.add_argument("--methods", default="default",
                    help="comma-separated methods of the LU (default: the default)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chol-finish", default=None,
                    help="cupy or kernel (default: the library's)")
    args = ap.parse_args(argv)

    import cupy as cp
    import numpy as np
    from scipy_gpuqr.batched import _gpu_blocked as bb

    acc = defaultdict(float)
    counts = defaultdict(int)
    pending = []

    def timed(label, call):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        call()
        end.record()
        pending.append((label, start, end))

    class Wrapped:
        def __init__(self, fn, label):
            self.fn, self.label = fn, label

        def __call__(self, *a, **k):
            timed(self.label, lambda: self.fn(*a, **k))

        def __getattr__(self, name):
            return getattr(self.fn, name)

        def __setattr__(self, name, value):
            if name in ("fn", "label"):
                object.__setattr__(self, name, value)
            else:
                setattr(self.fn, name, value)

    orig_rows, orig_panel, orig_gemm = bb._rows_function, bb._panel_function, bb._gemm_strided
    orig_mma, orig_streams = bb._mma64_function, bb.rows_streams

    def mma_function(device, name=bb.MMA64_NAME):
        return Wrapped(orig_mma(device, name), name)

    def rows_function(kernel, dt, nb, maxt, device):
        return Wrapped(orig_rows(kernel, dt, nb, maxt, device), f"{kernel}<{nb}>")

    def panel_function(kernel, dt, device):
        return Wrapped(orig_panel(kernel, dt, device), kernel)

    def gemm(a, m, nn, k, *rest):
        timed(f"gemm k={k} {'big' if m * nn >= 128 * 128 else 'small'}",
              lambda: orig_gemm(a, m, nn, k, *rest))

    def collect():
        cp.cuda.Device().synchronize()
        for label, s, e in pending:
            acc[label] += cp.cuda.get_elapsed_time(s, e)
            counts[label] += 1
        pending.clear()

    rng = cp.random.default_rng(3)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for spec in args.sizes.split(","):
        n, bsz = (int(v) for v in spec.split(":"))
        a = rng.standard_normal((bsz, n, n), dtype=np.float64)
        spd = cp.matmul(a, a.transpose(0, 2, 1))
        spd += n * cp.eye(n)
        runs = [(op, None if m == "default" else m)
                for op in args.ops.split(",")
                for m in (args.methods.split(",") if op == "lu" else ["default"])]
        for op, method in runs:
            if op == "lu":
                piv = cp.empty((bsz, n), dtype=cp.int32)
                info = cp.empty((bsz,), dtype=cp.int32)

                def call():
                    return bb.getrf(a, piv, info, method)
            else:
                def call():
                    return bb.potrf(spd, True, None, args.chol_finish)
            call()
            times = []
            for _ in range(args.reps):
                s, e = cp.cuda.Event(), cp.cuda.Event()
                s.record()
                call()
                e.record()
                e.synchronize()
                times.append(cp.cuda.get_elapsed_time(s, e))
            acc.clear()
            counts.clear()
            bb._rows_function, bb._panel_function, bb._gemm_strided = (
                rows_function, panel_function, gemm)
            bb._mma64_function = mma_function
            bb.rows_streams = lambda n, batch: 1
            try:
                for _ in range(args.reps):
                    call()
                    collect()
            finally:
                bb._rows_function, bb._panel_function, bb._gemm_strided = (
                    orig_rows, orig_panel, orig_gemm)
                bb._mma64_function, bb.rows_streams = orig_mma, orig_streams
            total = sum(acc.values()) / args.reps
            print(f"n={n} batch={bsz} {op} {method or 'default'}: whole call {statistics.median(times):.3f} ms, "
                  f"sum of steps {total:.3f} ms")
            for label in sorted(acc, key=lambda x: -acc[x]):
                print(f"    {label:28} {acc[label] / args.reps:8.3f} ms "
                      f"({counts[label] // args.reps} per call)")
        a = spd = None
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
