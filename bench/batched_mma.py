#!/usr/bin/env python3
"""Blocked LU on the FP64 tensor cores (kernels/batched_mma.cu) against the
row-per-lane warp kernel (kernels/batched_lu.cu), n = 16/24/32, float64.

    python3 bench/batched_mma.py [--json out.json] [--sizes 32,24,16] [--opt -DX=Y ...] [--tiny]
    python3 bench/batched_mma.py --inverse [--sizes 32] [--opt -DX=Y ...] [--json out.json]
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
cuBLAS getrfBatched + getriBatched in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from batched import Timer  # noqa: E402  (bench/batched.py, beside this script)

CONFIGS = ((64, 1), (128, 1), (256, 1), (64, 2), (128, 2), (256, 2))
BATCH = 1 << 20


def function(n: int, options=()):
    from scipy_gpuqr import _kernels
    name = f"getrf_mma<double, {n}>"
    return _kernels.load_module("batched_mma.cu", (name,), tuple(options)).get_function(name)


def inverse_function(options=()):
    from scipy_gpuqr import _kernels
    name = "getri_mma<double, 32>"
    return _kernels.load_module("batched_mma.cu", (name,), tuple(options)).get_function(name)


def smem_bytes(n: int, warps: int, stages: int, inverse: bool = False) -> int:
    from scipy_gpuqr._batched_gpu import mma_smem_bytes
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
                             np.int32(stages), np.int32(vec)), shared_mem=smem)
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


def inverse_rows(cp, timer, sizes, options, rng) -> list:
    """The ``--inverse`` rows: check, launch configurations, warp kernel,
    library default and cuBLAS getrf + getri, device ms on 2**20 matrices."""
    from batched import cublas_lu
    from scipy_gpuqr import _batched_gpu as bg
    fn = inverse_function(options)
    rows = []
    for n in sizes:
        err, problems = check_inverse(cp, fn, n, rng)
        a = cp.asarray(rng.standard_normal((BATCH, n, n)))
        out = cp.empty_like(a)
        info = cp.empty((BATCH,), dtype=np.int32)
        res, occ = {}, {}
        for thr, st in CONFIGS:
            occ[(thr, st)] = launch_inverse(cp, fn, a, out, info, thr, st)
            res[(thr, st)] = timer.device(
                lambda thr=thr, st=st: launch_inverse(cp, fn, a, out, info, thr, st))
        warp_ms = timer.device(lambda: bg.getri(a, kernel="warp"))
        lib_ms = timer.device(lambda: bg.getri(a))
        work = a.copy()
        cub_ms = timer.device(cublas_lu(cp, work, inverse=True), reps=3)
        work = None
        best = min(res, key=res.get)
        row = dict(n=n, op="inv", options=list(options), ok=not problems, problems=problems,
                   err=err, regs=fn.num_regs, spill_bytes=fn.local_size_bytes,
                   blocks_per_sm=occ[best], ms=res[best], cfg=f"{best[0]}/{best[1]}",
                   warp_ms=warp_ms, library_ms=lib_ms, library_kernel=bg.getri_kernel(n, a.dtype),
                   cublas_ms=cub_ms, all={f"{k[0]}/{k[1]}": v for k, v in res.items()})
        rows.append(row)
        print(f"inv mma n={n} {'ok' if row['ok'] else 'BAD'} err={err:.1e} regs={fn.num_regs} "
              f"spill={fn.local_size_bytes} best={res[best]:.3f} ms ({row['cfg']}, "
              f"{occ[best]} blk/SM)  warp kernel {warp_ms:.3f} ms  library "
              f"({row['library_kernel']}) {lib_ms:.3f} ms  cuBLAS getrf+getri {cub_ms:.3f} ms  "
              + " ".join(f"{k}:{v:.3f}" for k, v in row["all"].items())
              + ("" if row["ok"] else f"\n  {problems}"), flush=True)
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
                             np.int32(stages), np.int32(vec)), shared_mem=smem)
    return per_sm


def outputs(cp, bsz, n):
    return (cp.full((bsz, n, n), np.nan), cp.full((bsz, n), -12345, dtype=np.int32),
            cp.full((bsz,), -12345, dtype=np.int32))


def check(cp, fn, n, rng):
    """Problems found against LAPACK (pivots, info, factors; scaled like the tests)."""
    import scipy.linalg as sl
    eps = float(np.finfo(np.float64).eps)
    bsz = 997
    a = rng.standard_normal((bsz, n, n))
    for i in range(0, 64, 2):
        a[i, :, (i // 2) % n] = 0                  # exactly singular
    a[1, n - 1, 0] = np.inf                         # non-finite
    a[3, 5, n - 1] = np.nan
    a[5] = np.triu(a[5])                            # ties of zeros below the diagonal
    a[7, :, :] = np.round(a[7] * 2)                 # many exact ties
    problems = []
    getrf, = sl.get_lapack_funcs(("getrf",), (a[0],))
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
        bad_piv = 0
        for m in range(bsz):
            if m in (1, 3):
                if info[m] != -1:
                    problems.append(f"non-finite {m} not flagged ({info[m]})")
                continue
            rl, rp, ri = getrf(a[m])
            if ri != info[m]:
                problems.append(f"info {m}: {info[m]} vs {ri}")
            if (rp != piv[m]).any():
                bad_piv += 1
                continue
            e = np.abs(lu[m] - rl).max() / max(1.0, np.abs(rl).max())
            err = max(err, e if np.isfinite(e) else np.inf)
        if bad_piv > 2:
            problems.append(f"{bad_piv} pivot mismatches ({threads}/{stages})")
        if not err <= 50 * n * eps:
            problems.append(f"lu error {err:.2e} ({threads}/{stages})")
    return err, problems[:8]


def tiny_grids(cp, timer, dtype=np.float64) -> dict:
    """n = 2 LU (a thread per matrix): the library's persistent grid against a
    grid of one matrix per thread, and cuBLAS, device ms on 2**20 matrices."""
    from batched import cublas_lu
    from scipy_gpuqr import _batched_gpu as bg
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
                                                            np.int32(1), np.int32(1))))
    ref_lu, ref_piv, _ = bg.getrf(a)
    assert bool((lu == ref_lu).all()) and bool((piv == ref_piv).all())
    work = a.copy()
    out["cuBLAS"] = timer.device(cublas_lu(cp, work, inverse=False))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--sizes", default="32,24,16")
    ap.add_argument("--opt", action="append", default=[], help="NVRTC option for the kernel")
    ap.add_argument("--tiny", action="store_true", help="also n = 2: launch grids")
    ap.add_argument("--inverse", action="store_true",
                    help="the inverse kernel (getri_mma) instead of the LU")
    ap.add_argument("--profile", action="store_true",
                    help="only one LU of 2**16 matrices of order 32 by each kernel "
                    "(mma, then warp): the launches for ncu")
    args = ap.parse_args(argv)
    import cupy as cp
    from scipy_gpuqr import _batched_gpu as bg
    if args.profile:
        a = cp.random.default_rng(1).standard_normal((1 << 16, 32, 32))
        for kernel in ("mma", "warp"):
            (bg.getri if args.inverse else bg.getrf)(a, kernel=kernel)
        cp.cuda.Device().synchronize()
        return 0
    rng = np.random.default_rng(5)
    timer = Timer(cp)
    if args.inverse:
        rows = inverse_rows(cp, timer, [int(s) for s in args.sizes.split(",")], args.opt, rng)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    rows = []
    if args.tiny:
        res = tiny_grids(cp, timer)
        rows.append(dict(n=2, tiny=res))
        print("n=2 LU: " + "  ".join(f"{k} {v:.4f}" for k, v in res.items()), flush=True)
    for n in [int(s) for s in args.sizes.split(",")]:
        fn = function(n, args.opt)
        err, problems = check(cp, fn, n, rng)
        a = cp.asarray(rng.standard_normal((BATCH, n, n)))
        outs = outputs(cp, BATCH, n)
        res, occ = {}, {}
        for thr, st in CONFIGS:
            occ[(thr, st)] = launch(cp, fn, a, outs, thr, st)
            res[(thr, st)] = timer.device(lambda thr=thr, st=st: launch(cp, fn, a, outs, thr, st))
        warp_ms = timer.device(lambda: bg.getrf(a, kernel="warp"))
        lib_ms = timer.device(lambda: bg.getrf(a))
        best = min(res, key=res.get)
        row = dict(n=n, options=args.opt, ok=not problems, problems=problems, err=err,
                   regs=fn.num_regs, spill_bytes=fn.local_size_bytes,
                   blocks_per_sm=occ[best], ms=res[best], cfg=f"{best[0]}/{best[1]}",
                   warp_ms=warp_ms, library_ms=lib_ms, all={f"{k[0]}/{k[1]}": v for k, v in res.items()})
        rows.append(row)
        print(f"mma n={n} {'ok' if row['ok'] else 'BAD'} err={err:.1e} regs={fn.num_regs} "
              f"spill={fn.local_size_bytes} best={res[best]:.3f} ms ({row['cfg']}, "
              f"{occ[best]} blk/SM)  warp kernel {warp_ms:.3f} ms  library {lib_ms:.3f} ms  "
              + " ".join(f"{k}:{v:.3f}" for k, v in row["all"].items())
              + ("" if row["ok"] else f"\n  {problems}"), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        a = outs = None
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
