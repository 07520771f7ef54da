#!/usr/bin/env python3
"""Block size of the n = 32 tensor-core LU and inverse, and their public calls.

    python3 bench/batched_n32.py [--ops lu,inv] [--threads 256,160,128,64] [--variants split1,stcs]
                                 [--reps 7] [--batch 1048576] [--carveout PCT] [--json out.json]

``getrf_mma`` / ``getri_mma`` (kernels/batched/lu_mma.cu) run one warp per
matrix in a persistent grid; how many warps an SM holds depends on the block
size (registers and shared memory are both near their limits: see
``MMA_THREADS`` in scipy_gpuqr/batched/_gpu.py). For each op, on 2**20
float64 matrices of order 32 (CuPy, well conditioned):

* every block size of ``--threads`` is run once and its outputs compared,
  bit for bit, with those of the first (the per-matrix arithmetic does not
  depend on the block: any difference is a bug);
* ``--variants``: the LU kernel compiled with other values of the macros of
  lu_mma.cu (``VARIANTS``; e.g. ``GPUQR_MMA_SPLIT=1``, two cp.async groups
  for the copy in; ``pf0`` .. ``pf4``, ``GPUQR_MMA_PREFETCH``: the next
  matrix asked of L2 at no / each panel) at the first two block sizes, its outputs compared bit for bit with
  the library kernel's and timed with the others;
* then the driver at each block size, the public function with its defaults
  (``lu_factor_batched(a)`` / ``inv_batched(a)``: the status read and its
  wait included) and the asynchronous public call (``return_info=True,
  check_finite=False``) are timed interleaved (bench/batched.py's Timer:
  CUDA events behind busy copies, medians of ``--reps``), and cuBLAS
  getrfBatched (+ getriBatched) and torch after them in the same process.

Printed per row: device ms, resident warps per SM (the occupancy API), and
the ratio to cuBLAS. ``--carveout PCT`` first sets the library kernels'
preferred shared-memory carveout (``cudaFuncAttributePreferredSharedMemoryCarveout``,
percent of the unified cache) and asks the occupancy API again: blocks of
160 threads fit 25 warps only with the largest carveout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batched import Timer, cublas_ms, torch_ms  # noqa: E402  (bench/batched.py)


#: Compile-time variants of the LU kernel: label -> NVRTC options.
VARIANTS = {"split0": ("-DGPUQR_MMA_SPLIT=0",), "split1": ("-DGPUQR_MMA_SPLIT=1",),
            "stcs": ("-DGPUQR_MMA_STCS=1",),
            **{f"pf{k}": (f"-DGPUQR_MMA_PREFETCH={k}",) for k in range(5)}}


def variant_lu(label: str, a, threads: int):
    """A launcher of ``getrf_mma<double, 32>`` compiled with ``VARIANTS[label]``
    on the stack ``a`` at ``threads`` (the library's grid and shared memory)."""
    import cupy as cp
    from scipy_gpuqr import _kernels
    from scipy_gpuqr.batched import _gpu as bg
    from scipy_gpuqr.batched import _gpu_common as gc
    name = "getrf_mma<double, 32>"
    fn = _kernels.load_module("batched/lu_mma.cu", (name,), VARIANTS[label]).get_function(name)
    plan = bg._warp_plan("lu", "float64", 32, "mma", threads, 1, bg.device_id())
    smem = plan[4]
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    bsz = a.shape[0]
    grid = bg._grid(plan, bsz)

    def run():
        lu = cp.empty_like(a)
        piv = cp.empty((bsz, 32), dtype=cp.int32)
        info = cp.empty((bsz,), dtype=cp.int32)
        vec = int(a.data.ptr % 16 == 0 and lu.data.ptr % 16 == 0)
        gc.launch(fn.kernel.ptr, grid, threads, smem,
                  (a.data.ptr, lu.data.ptr, piv.data.ptr, info.data.ptr, bsz, 1, vec, 0, 0))
        return lu, piv, info
    return run


def warps_per_sm(op: str, threads: int) -> int:
    """Resident warps per SM of the n = 32 float64 kernel of ``op`` at ``threads``."""
    from scipy_gpuqr.batched import _gpu as bg
    plan = bg._warp_plan(op, "float64", 32, "mma", threads, 1, bg.device_id())
    import cupy as cp
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    return plan[5] // sms * (plan[2] // 32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="lu,inv")
    ap.add_argument("--threads", default="256,160,128,64")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=1 << 20)
    ap.add_argument("--variants", default="split1,stcs",
                    help="comma-separated labels of VARIANTS ('' for none)")
    ap.add_argument("--carveout", type=int, default=None,
                    help="preferred shared-memory carveout (percent) of the library kernels")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr._gpu import gpu_info
    from scipy_gpuqr.batched import _gpu as bg
    try:
        import torch
    except Exception:  # torch is optional
        torch = None
    n, bsz = 32, args.batch
    threads = [int(t) for t in args.threads.split(",")]
    if args.carveout is not None:
        dev = bg.device_id()
        for name in ("getrf_mma", "getri_mma", "gesv_mma"):
            fn = bg._small_function_cached(name, "float64", n, dev)
            fn.preferred_shared_memory_carveout = args.carveout
        bg._warp_config.cache_clear()         # the occupancy asked again
        bg._warp_plan.cache_clear()
        bg._small_call.cache_clear()
        print(f"preferred shared-memory carveout {args.carveout} %", flush=True)
    print(f"device: {gpu_info().get('name')}, n = {n}, batch = {bsz}, "
          f"default threads {bg.MMA_THREADS}", flush=True)
    timer = Timer(cp)
    rng = cp.random.default_rng(32)
    a = rng.standard_normal((bsz, n, n))
    a += n * cp.eye(n)
    rows = []
    for op in args.ops.split(","):
        if op == "lu":
            def drv(t):
                return lambda: bg.getrf(a, threads=t, kernel="mma")
            pub = lambda: g.lu_factor_batched(a)                            # noqa: E731
            asy = lambda: g.lu_factor_batched(a, check_finite=False,        # noqa: E731
                                              return_info=True)
        else:
            def drv(t):
                return lambda: bg.getri(a, threads=t, kernel="mma")
            pub = lambda: g.inv_batched(a)                                  # noqa: E731
            asy = lambda: g.inv_batched(a, check_finite=False,              # noqa: E731
                                        return_info=True)
        ref = drv(threads[0])()
        same = {}
        for t in threads[1:]:
            out = drv(t)()
            same[t] = all(bool(cp.array_equal(x, y)) for x, y in zip(ref, out))
            del out
        var = []                        # (label, threads, launcher) of the LU variants
        if op == "lu":
            for label in [v for v in args.variants.split(",") if v]:
                for t in threads[:2]:
                    run = variant_lu(label, a, t)
                    out = run()
                    same[(label, t)] = all(bool(cp.array_equal(x, y))
                                           for x, y in zip(ref, out))
                    del out
                    var.append((label, t, run))
        del ref
        fns = [drv(t) for t in threads] + [pub, asy] + [run for _, _, run in var]
        times = timer.device_interleaved(fns, reps=args.reps)
        vtimes = times[len(threads) + 2:]
        times = times[:len(threads) + 2]
        cb = cublas_ms(cp, timer, a, op)
        tt = torch_ms(torch, timer, a, op)
        cp.get_default_memory_pool().free_all_blocks()
        for t, ms in zip(threads, times):
            w = warps_per_sm(op, t)
            row = dict(op=op, what=f"driver {t} threads", threads=t, warps_per_sm=w, ms=ms,
                       same_as_first=same.get(t, True), cublas_ms=cb, torch_ms=tt)
            rows.append(row)
            print(f"{op:4} driver threads {t:4}  warps/SM {w:3}  {ms:8.3f} ms  "
                  f"{cb / ms:5.2f}x cuBLAS  same as {threads[0]}: {row['same_as_first']}",
                  flush=True)
        for (label, t, _), ms in zip(var, vtimes):
            row = dict(op=op, what=f"variant {label} {t} threads", threads=t, ms=ms,
                       same_as_first=same[(label, t)], cublas_ms=cb, torch_ms=tt)
            rows.append(row)
            print(f"{op:4} variant {label:8} threads {t:4}  {ms:8.3f} ms  {cb / ms:5.2f}x cuBLAS  "
                  f"same as library: {row['same_as_first']}", flush=True)
        for what, ms in (("public (defaults)", times[-2]), ("public async", times[-1])):
            rows.append(dict(op=op, what=what, ms=ms, cublas_ms=cb, torch_ms=tt))
            print(f"{op:4} {what:30} {ms:8.3f} ms  {cb / ms:5.2f}x cuBLAS", flush=True)
        print(f"{op:4} cuBLAS {cb:8.3f} ms   torch {tt:8.3f} ms", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r.get("same_as_first") is False]
    if bad:
        print(f"MISMATCH between block sizes: {bad}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
