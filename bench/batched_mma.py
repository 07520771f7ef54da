#!/usr/bin/env python3
"""Blocked LU on the FP64 tensor cores (kernels/batched/lu_mma.cu) against the
row-per-lane warp kernel (kernels/batched/lu_warp.cu), n = 16/24/32, float64.

    python3 bench/batched_mma.py [--json out.json] [--sizes 32,24,16] [--opt -DX=Y ...] [--tiny]
                                 [--variants 0,2] [--configs 128/1,256/1]
    python3 bench/batched_mma.py --inverse [--sizes 32] [--variants ...] [--json out.json]
    ncu ... python3 bench/batched_mma.py --profile [--inverse]

Per n: the ``getrf_mma<double, n>`` kernel is compiled (with ``--opt``
NVRTC options, e.g. a register cap), checked against LAPACK on fresh random,
exactly singular, tied and non-finite batches (outputs poisoned first, three
launch configurations, one with 8-byte aligned pointers), then timed on 2**20
matrices over (threads per block, stages) next to the row-per-lane kernel
(``getrf(kernel='warp')``) and the library default in the same run: device
time, CUDA events after warm-up, median of 5, the GPU kept busy by copies
enqueued just before (bench/batched.py's Timer). ``--tiny``: the n = 2 LU
with the persistent grid against one matrix per thread, and cuBLAS.
``--inverse``: the same for the inverse ``getri_mma<double, 32>`` (n < 32
padded with the identity) against SciPy/NumPy per matrix (info as LAPACK's
getrf: first exactly zero pivot, -1 for inf/NaN), timed next to the
Gauss-Jordan warp kernel (``getri(kernel='warp')``), the library default and
cuBLAS getrfBatched + getriBatched in the same run. ``--variants``: the
kernels' compile-time variants (template argument V of ``getrf_mma`` /
``getri_mma``, all compiled in one module), each checked and timed in the
same process; cuBLAS getrfBatched is timed next to the LU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

import numpy as np  # noqa: E402
from batched import Timer  # noqa: E402  (bench/batched.py, beside this script)
from lapack_check import compare_getrf  # noqa: E402
from scipy_gpuqr.batched._gpu_common import NO_REPORT  # noqa: E402

CONFIGS = ((64, 1), (128, 1), (256, 1), (64, 2), (128, 2), (256, 2))
BATCH = 1 << 20


def kernel_name(kernel: str, n: int, variant=None) -> str:
    """``getrf_mma<double, 32>`` (the default variant) or ``getrf_mma<double, 32, 2>``."""
    return f"{kernel}<double, {n}>" if variant is None else f"{kernel}<double, {n}, {variant}>"


def function(n: int, options=(), variant=None, names=()):
    """The LU kernel; ``names``: every name expression of the module (one compile)."""
    from scipy_gpuqr import _kernels
    name = kernel_name("getrf_mma", n, variant)
    names = tuple(dict.fromkeys(tuple(names) + (name,)))
    return _kernels.load_module("batched/lu_mma.cu", names, tuple(options)).get_function(name)


def inverse_function(options=(), variant=None, names=()):
    from scipy_gpuqr import _kernels
    name = kernel_name("getri_mma", 32, variant)
    names = tuple(dict.fromkeys(tuple(names) + (name,)))
    return _kernels.load_module("batched/lu_mma.cu", names, tuple(options)).get_function(name)


def all_names(sizes, variants) -> tuple:
    """Name expressions of every kernel a run uses (compiled together)."""
    return tuple(kernel_name(k, n, v) for k, ns in (("getrf_mma", sizes), ("getri_mma", (32,)))
                 for n in ns for v in variants)


def extreme_pivots(a, rng, lu: bool):
    """Matrices whose pivots take the kernels' rare path: huge pivots (above
    2**1022), and for the LU a subnormal pivot and an all-subnormal matrix."""
    n = a.shape[-1]
    a[9] = (rng.standard_normal((n, n)) + 32 * np.eye(n)) * 2.0 ** 1017
    if lu:
        a[13, :, 0] = 0
        a[13, 5, 0] = 1e-310
        a[15] = rng.standard_normal((n, n)) * 2.0 ** -1060


def smem_bytes(n: int, warps: int, stages: int, inverse: bool = False) -> int:
    from scipy_gpuqr.batched._gpu import mma_smem_bytes
    return mma_smem_bytes(n, warps, stages, inverse)


def launch_inverse(cp, fn, a, out, info, threads: int, stages: int) -> int:
    """One ``getri_mma<double, 32>`` launch over the stack ``a`` (B, n, n), n <= 32."""
    from cupy_backends.cuda.api import driver
    bsz, n = a.shape[0], a.shape[-1]
    smem = smem_bytes(32, threads // 32, stages, inverse=True)
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = max(1, min(max(1, per_sm) * sms, -(-bsz // (threads // 32))))
    vec = int(a.data.ptr % 16 == 0 and out.data.ptr % 16 == 0 and n % 2 == 0)
    fn((grid,), (threads,), (a, out, info, np.int64(bsz), np.int32(n),
                             np.int32(stages), np.int32(vec)) + NO_REPORT, shared_mem=smem)
    return per_sm


def check_inverse(cp, fn, n, rng):
    """Problems found against NumPy's inverse and LAPACK's getrf info."""
    import scipy.linalg as sl
    eps = float(np.finfo(np.float64).eps)
    bsz = 997
    a = rng.standard_normal((bsz, n, n))
    for i in range(0, 64, 2):
        a[i, :, (i // 2) % n] = 0                  # exactly singular
    a[1, n - 1, 0] = np.inf                         # non-finite
    a[3, 5, n - 1] = np.nan
    a[5] = np.triu(a[5]) + 3 * np.eye(n)            # ties of zeros below the diagonal
    a[7, :, :] = np.round(a[7] * 2)                 # many exact ties
    extreme_pivots(a, rng, lu=False)
    getrf, = sl.get_lapack_funcs(("getrf",), (a[0],))
    ref_info = np.array([getrf(m)[2] for m in a])
    ref_info[[1, 3]] = -1
    ok = ref_info == 0
    ref = np.linalg.inv(a[ok])
    cond = np.linalg.cond(a[ok])
    problems, err = [], 0.0
    for threads, stages, misalign in ((128, 2, False), (64, 1, False), (96, 1, True)):
        if misalign:        # 8-byte aligned pointers: the element-wise copies
            buf = cp.empty(bsz * n * n + 1)
            ga = buf[1:].reshape(bsz, n, n)
            ga[...] = cp.asarray(a)
            obuf = cp.full(bsz * n * n + 1, np.nan)
            out = obuf[1:].reshape(bsz, n, n)
        else:
            ga = cp.asarray(a)
            out = cp.full((bsz, n, n), np.nan)
        info = cp.full((bsz,), -12345, dtype=np.int32)
        launch_inverse(cp, fn, ga, out, info, threads, stages)
        cp.cuda.Device().synchronize()
        x, info = out.get(), info.get()
        if (info != ref_info).any():
            bad = np.flatnonzero(info != ref_info)[:4]
            problems.append(f"info {bad}: {info[bad]} vs {ref_info[bad]} ({threads}/{stages})")
        e = np.abs(x[ok] - ref).max(axis=(1, 2)) / (np.abs(ref).max(axis=(1, 2)) * cond)
        e = float(e.max()) if np.isfinite(e).all() else np.inf
        err = max(err, e)
        if not e <= 30 * n * eps:
            problems.append(f"inverse error {e:.2e} x cond ({threads}/{stages})")
    return err, problems[:8]


def _variant_row(timer, op, n, variant, options, fn, err, problems, configs, run) -> dict:
    """Time one checked kernel variant over the launch configurations
    (``run(threads, stages)`` launches it and returns blocks per SM), print
    and return its row (the best configuration's device ms)."""
    res, occ = {}, {}
    for thr, st in configs:
        occ[(thr, st)] = run(thr, st)
        res[(thr, st)] = timer.device(lambda thr=thr, st=st: run(thr, st))
    best = min(res, key=res.get)
    row = dict(n=n, op=op, variant=variant, options=list(options), ok=not problems,
               problems=problems, err=err, regs=fn.num_regs,
               spill_bytes=fn.local_size_bytes, blocks_per_sm=occ[best], ms=res[best],
               cfg=f"{best[0]}/{best[1]}",
               all={f"{k[0]}/{k[1]}": v for k, v in res.items()})
    label = "inv mma" if op == "inv" else "mma"
    print(f"{label} n={n} V={variant} {'ok' if row['ok'] else 'BAD'} err={err:.1e} "
          f"regs={fn.num_regs} spill={fn.local_size_bytes} best={res[best]:.3f} ms "
          f"({row['cfg']}, {occ[best]} blk/SM)  "
          + " ".join(f"{k}:{v:.3f}" for k, v in row["all"].items())
          + ("" if row["ok"] else f"\n  {problems}"), flush=True)
    return row


def inverse_rows(cp, timer, sizes, options, rng, variants=(None,), configs=CONFIGS,
                 names=()) -> list:
    """The ``--inverse`` rows: per variant check and launch configurations,
    then the warp kernel, library default and cuBLAS getrf + getri, device ms
    on 2**20 matrices."""
    from batched import cublas_lu
    from scipy_gpuqr.batched import _gpu as bg
    rows = []
    for n in sizes:
        a = cp.random.default_rng(int(rng.integers(1 << 31))).standard_normal((BATCH, n, n))
        out = cp.empty_like(a)
        info = cp.empty((BATCH,), dtype=np.int32)
        for variant in variants:
            fn = inverse_function(options, variant, names)
            err, problems = check_inverse(cp, fn, n, rng)
            rows.append(_variant_row(
                timer, "inv", n, variant, options, fn, err, problems, configs,
                lambda thr, st, fn=fn: launch_inverse(cp, fn, a, out, info, thr, st)))
        warp_ms = timer.device(lambda: bg.getri(a, kernel="warp"))
        lib_ms = timer.device(lambda: bg.getri(a))
        work = a.copy()
        cub_ms = timer.device(cublas_lu(cp, work, inverse=True), reps=3)
        work = None
        anchors = dict(n=n, op="inv", warp_ms=warp_ms, library_ms=lib_ms,
                       library_kernel=bg.getri_kernel(n, a.dtype), cublas_ms=cub_ms)
        rows.append(anchors)
        print(f"inv n={n} anchors: warp kernel {warp_ms:.3f} ms  library "
              f"({anchors['library_kernel']}) {lib_ms:.3f} ms  cuBLAS getrf+getri "
              f"{cub_ms:.3f} ms", flush=True)
        a = out = info = None
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def launch(cp, fn, a, outs, threads: int, stages: int) -> int:
    from cupy_backends.cuda.api import driver
    bsz, n = a.shape[0], a.shape[-1]
    smem = smem_bytes(n, threads // 32, stages)
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = max(1, min(max(1, per_sm) * sms, -(-bsz // (threads // 32))))
    vec = int(a.data.ptr % 16 == 0 and outs[0].data.ptr % 16 == 0)
    fn((grid,), (threads,), (a, outs[0], outs[1], outs[2], np.int64(bsz),
                             np.int32(stages), np.int32(vec)) + NO_REPORT, shared_mem=smem)
    return per_sm


def outputs(cp, bsz, n):
    return (cp.full((bsz, n, n), np.nan), cp.full((bsz, n), -12345, dtype=np.int32),
            cp.full((bsz,), -12345, dtype=np.int32))


def check(cp, fn, n, rng):
    """Problems found against LAPACK (pivots, info, factors; scaled like the tests)."""
    eps = float(np.finfo(np.float64).eps)
    bsz = 997
    a = rng.standard_normal((bsz, n, n))
    for i in range(0, 64, 2):
        a[i, :, (i // 2) % n] = 0                  # exactly singular
    a[1, n - 1, 0] = np.inf                         # non-finite
    a[3, 5, n - 1] = np.nan
    a[5] = np.triu(a[5])                            # ties of zeros below the diagonal
    a[7, :, :] = np.round(a[7] * 2)                 # many exact ties
    extreme_pivots(a, rng, lu=True)
    problems = []
    err = 0.0
    for threads, stages, misalign in ((128, 2, False), (64, 1, False), (96, 1, True)):
        if misalign:        # 8-byte aligned pointers: the element-wise copies
            buf = cp.empty(bsz * n * n + 1)
            ga = buf[1:].reshape(bsz, n, n)
            ga[...] = cp.asarray(a)
            obuf = cp.full(bsz * n * n + 1, np.nan)
            outs = (obuf[1:].reshape(bsz, n, n),) + outputs(cp, bsz, n)[1:]
        else:
            ga = cp.asarray(a)
            outs = outputs(cp, bsz, n)
        launch(cp, fn, ga, outs, threads, stages)
        cp.cuda.Device().synchronize()
        lu, piv, info = (o.get() for o in outs)
        e, bad_piv, found = compare_getrf(a, lu, piv, info, nonfinite=(1, 3))
        err = max(err, e)
        problems += found
        if bad_piv > 2:
            problems.append(f"{bad_piv} pivot mismatches ({threads}/{stages})")
        if not err <= 50 * n * eps:
            problems.append(f"lu error {err:.2e} ({threads}/{stages})")
    return err, problems[:8]


def tiny_grids(cp, timer, dtype=np.float64) -> dict:
    """n = 2 LU (a thread per matrix): the library's persistent grid against a
    grid of one matrix per thread, and cuBLAS, device ms on 2**20 matrices."""
    from batched import cublas_lu
    from scipy_gpuqr.batched import _gpu as bg
    a = cp.random.default_rng(3).standard_normal((BATCH, 2, 2), dtype=dtype)
    fn = bg._small_function("getrf_warp", a.dtype, 2)
    piv = cp.empty((BATCH, 2), dtype=np.int32)
    info = cp.empty((BATCH,), dtype=np.int32)
    lu = cp.empty_like(a)
    out = {"library": timer.device(lambda: bg.getrf(a))}
    for thr in (64, 128, 256):
        grid = -(-BATCH // thr)
        out[f"full grid {thr}"] = timer.device(
            lambda thr=thr, grid=grid: fn((grid,), (thr,), (a, lu, piv, info, np.int64(BATCH),
                                                            np.int32(1), np.int32(1)) + NO_REPORT))
    ref_lu, ref_piv, _ = bg.getrf(a)
    assert bool((lu == ref_lu).all()) and bool((piv == ref_piv).all())
    work = a.copy()
    out["cuBLAS"] = timer.device(cublas_lu(cp, work, inverse=False))
    return out


def parse_variants(text):
    """``"0,2"`` -> (0, 2); None -> (None,) (the kernels' default variant)."""
    return (None,) if not text else tuple(int(v) for v in text.split(","))


def parse_configs(text):
    """``"128/1,256/1"`` -> ((128, 1), (256, 1)); None -> CONFIGS."""
    if not text:
        return CONFIGS
    return tuple(tuple(int(x) for x in c.split("/")) for c in text.split(","))


def lu_rows(cp, timer, sizes, options, rng, variants=(None,), configs=CONFIGS, names=(),
            json_path=None) -> list:
    """The LU rows: per variant check and launch configurations, then the
    warp kernel, library default and cuBLAS getrfBatched, device ms on 2**20
    matrices."""
    from batched import cublas_lu
    from scipy_gpuqr.batched import _gpu as bg
    rows = []
    for n in sizes:
        a = cp.random.default_rng(int(rng.integers(1 << 31))).standard_normal((BATCH, n, n))
        outs = outputs(cp, BATCH, n)
        for variant in variants:
            fn = function(n, options, variant, names)
            err, problems = check(cp, fn, n, rng)
            rows.append(_variant_row(
                timer, "lu", n, variant, options, fn, err, problems, configs,
                lambda thr, st, fn=fn: launch(cp, fn, a, outs, thr, st)))
        warp_ms = timer.device(lambda: bg.getrf(a, kernel="warp"))
        lib_ms = timer.device(lambda: bg.getrf(a))
        work = a.copy()
        cub_ms = timer.device(cublas_lu(cp, work, inverse=False))
        work = None
        anchors = dict(n=n, op="lu", warp_ms=warp_ms, library_ms=lib_ms,
                       library_kernel=bg.getrf_kernel(n, a.dtype), cublas_ms=cub_ms)
        rows.append(anchors)
        print(f"lu n={n} anchors: warp kernel {warp_ms:.3f} ms  library "
              f"({anchors['library_kernel']}) {lib_ms:.3f} ms  cuBLAS getrf {cub_ms:.3f} ms",
              flush=True)
        if json_path:
            Path(json_path).write_text(json.dumps(rows, indent=1))
        a = outs = None
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--sizes", default="32,24,16")
    ap.add_argument("--opt", action="append", default=[], help="NVRTC option for the kernel")
    ap.add_argument("--variants", help="comma-separated template variants V (default: the "
                    "kernels' default)")
    ap.add_argument("--configs", help="threads/stages pairs, e.g. 128/1,256/1 (default: "
                    + ",".join(f"{t}/{s}" for t, s in CONFIGS) + ")")
    ap.add_argument("--tiny", action="store_true", help="also n = 2: launch grids")
    ap.add_argument("--inverse", action="store_true",
                    help="the inverse kernel (getri_mma) instead of the LU")
    ap.add_argument("--both", action="store_true", help="the LU, then the inverse")
    ap.add_argument("--profile", action="store_true",
                    help="only one LU of 2**16 matrices of order 32 by each kernel "
                    "(mma, then warp; with --variants: each variant): the launches for ncu")
    args = ap.parse_args(argv)
    import cupy as cp
    from scipy_gpuqr.batched import _gpu as bg
    if args.profile:
        a = cp.random.default_rng(1).standard_normal((1 << 16, 32, 32))
        if args.variants:           # each variant once (LU, or inverse), 256 threads
            names = all_names([32], parse_variants(args.variants))
            for v in parse_variants(args.variants):
                if args.inverse:
                    out, info = cp.empty_like(a), cp.empty((a.shape[0],), dtype=np.int32)
                    launch_inverse(cp, inverse_function(args.opt, v, names), a, out, info, 256, 1)
                else:
                    launch(cp, function(32, args.opt, v, names), a, outputs(cp, a.shape[0], 32),
                           256, 1)
        else:
            for kernel in ("mma", "warp"):
                (bg.getri if args.inverse else bg.getrf)(a, kernel=kernel)
        cp.cuda.Device().synchronize()
        return 0
    rng = np.random.default_rng(5)
    timer = Timer(cp)
    sizes = [int(s) for s in args.sizes.split(",")]
    variants = parse_variants(args.variants)
    configs = parse_configs(args.configs)
    names = all_names(sizes, variants)
    rows = []
    if args.tiny:
        res = tiny_grids(cp, timer)
        rows.append(dict(n=2, tiny=res))
        print("n=2 LU: " + "  ".join(f"{k} {v:.4f}" for k, v in res.items()), flush=True)
    if not args.inverse or args.both:
        rows += lu_rows(cp, timer, sizes, args.opt, rng, variants, configs, names, args.json)
    if args.inverse or args.both:
        rows += inverse_rows(cp, timer, [n for n in sizes if n <= 32], args.opt, rng,
                             variants, configs, names)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\nop  n  variant  regs  cfg     ms      (anchors: warp / library / cuBLAS ms)")
    for r in rows:
        if "variant" in r:
            print(f"{r['op']:<4}{r['n']:<3}{str(r['variant']):<9}{r['regs']:<6}{r['cfg']:<8}"
                  f"{r['ms']:.3f}  {'ok' if r['ok'] else 'BAD'}")
        elif "cublas_ms" in r:
            print(f"{r['op']:<4}{r['n']:<3}anchors  warp {r['warp_ms']:.3f}  library "
                  f"{r['library_ms']:.3f} ({r['library_kernel']})  cuBLAS {r['cublas_ms']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
