#!/usr/bin/env python3
"""Benchmark of the batched LU / inverse kernels against cuBLAS and torch.

    python3 bench/batched.py [--quick] [--json out.json] [--warm]

Per dtype and n (2..32 with 2**20 matrices; 64/128/256/512 with
100000/20000/4000/2000): median time over repetitions (CUDA events, after a
warm-up), GFLOP/s (LU 2n³/3, inverse 2n³), the bandwidth floor (bytes read
and written once divided by the copy bandwidth measured in the same run) and
the ratio to cuBLAS getrfBatched / getrf+getriBatched and torch
lu_factor / inv measured in the same run. For n <= 32 the threads per block
are autotuned per n (the best is reported and used).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

SMALL = list(range(2, 33))
QUICK_SMALL = [2, 4, 8, 16, 24, 32]
LARGE = [(64, 100000), (128, 20000), (256, 4000), (512, 2000)]
SMALL_BATCH = 1 << 20
THREAD_CHOICES = (64, 128, 256)


def _warm_group(args):
    from scipy_gpuqr import _batched_gpu
    kernel, dtype = args
    if kernel == "blocked":
        _batched_gpu._blocked_function("getrf_panel", dtype)
        return
    _batched_gpu._small_function(kernel, dtype, 1)


def warm(parallel: int = 8) -> None:
    """Compile every batched kernel module in parallel processes (fills the cache)."""
    groups = [(k, d) for k in ("getrf_small", "getri_small", "potrf_small")
              for d in ("float64", "float32")] + [("blocked", "float64")]
    with ProcessPoolExecutor(parallel) as ex:
        list(ex.map(_warm_group, groups))


def timeit(cp, fn, reps=7, warmup=2):
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    return statistics.median(times)


def timeit_torch(torch, fn, reps=7, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def copy_bandwidth(cp) -> float:
    """Bytes read + written per second by a device-to-device copy of 4 GiB."""
    a = cp.ones(1 << 29, dtype=cp.float64)
    b = cp.empty_like(a)
    ms = timeit(cp, lambda: b.__setitem__(Ellipsis, a), reps=9)
    del a, b
    return 2 * (1 << 29) * 8 / (ms * 1e-3)


def cublas_lu(cp, a, inverse: bool):
    """getrfBatched (and getriBatched) on the stack ``a`` (in place)."""
    from cupy_backends.cuda.libs import cublas
    bsz, n = a.shape[0], a.shape[-1]
    handle = cp.cuda.device.get_cublas_handle()
    ptrs = (a.data.ptr + cp.arange(bsz, dtype=cp.uint64) * (n * n * a.itemsize)).astype(cp.uint64)
    piv = cp.empty((bsz, n), dtype=cp.int32)
    info = cp.empty((bsz,), dtype=cp.int32)
    c = cp.empty_like(a) if inverse else None
    cptrs = ((c.data.ptr + cp.arange(bsz, dtype=cp.uint64) * (n * n * a.itemsize)).astype(cp.uint64)
             if inverse else None)
    getrf = cublas.dgetrfBatched if a.dtype == np.float64 else cublas.sgetrfBatched
    getri = cublas.dgetriBatched if a.dtype == np.float64 else cublas.sgetriBatched

    def run():
        getrf(handle, n, ptrs.data.ptr, n, piv.data.ptr, info.data.ptr, bsz)
        if inverse:
            getri(handle, n, ptrs.data.ptr, n, piv.data.ptr, cptrs.data.ptr, n,
                  info.data.ptr, bsz)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 2,4,8,16,24,32 only")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--warm", action="store_true", help="only compile the kernels")
    ap.add_argument("--no-tune", action="store_true")
    args = ap.parse_args(argv)
    if args.warm:
        warm()
        return 0
    import cupy as cp
    from scipy_gpuqr import _batched_gpu as bg
    from scipy_gpuqr._gpu import gpu_info
    try:
        import torch
    except Exception:  # torch is optional
        torch = None

    info = gpu_info()
    bw = copy_bandwidth(cp)
    print(f"device: {info.get('name')}  copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")
    print(f"cupy {cp.__version__}, torch {getattr(torch, '__version__', None)}")
    rows = []
    sizes = [(n, SMALL_BATCH) for n in (QUICK_SMALL if args.quick else SMALL)] + LARGE
    rng = cp.random.default_rng(7)
    hdr = (f"{'dtype':7} {'n':>4} {'batch':>8} {'op':4} {'thr':>4} {'ms':>8} {'GF/s':>7} "
           f"{'floor ms':>8} {'%bw':>5} {'cuBLAS ms':>9} {'x cuBLAS':>8} {'torch ms':>8} {'x torch':>7}")
    print(hdr)
    for dtype in (np.float64, np.float32):
        for n, bsz in sizes:
            a = rng.standard_normal((bsz, n, n), dtype=dtype)
            item = a.itemsize
            for op in ("lu", "inv"):
                if op == "inv" and n > 64:
                    continue
                best_thr, best = None, None
                choices = THREAD_CHOICES if (n <= 32 and not args.no_tune) else (None,)
                for thr in choices:
                    if op == "lu":
                        f = lambda thr=thr: bg.getrf(a, threads=thr)
                    else:
                        f = lambda thr=thr: bg.getri(a, threads=thr)
                    ms = timeit(cp, f, reps=5 if n <= 32 else 3)
                    if best is None or ms < best:
                        best, best_thr = ms, thr
                flops = (2 * n ** 3 / 3 if op == "lu" else 2 * n ** 3) * bsz
                nbytes = (2 * n * n * item + (n * 4 if op == "lu" else 0) + 4) * bsz
                floor = nbytes / bw * 1e3
                work = a.copy()
                cb = cublas_lu(cp, work, inverse=(op == "inv"))
                try:
                    cb_ms = timeit(cp, cb, reps=3)
                except Exception as exc:  # noqa: BLE001
                    print(f"  cuBLAS failed: {exc}")
                    cb_ms = float("nan")
                del work
                t_ms = float("nan")
                if torch is not None:
                    ta = torch.from_dlpack(a)
                    tf = (lambda: torch.linalg.lu_factor(ta)) if op == "lu" else (lambda: torch.linalg.inv(ta))
                    try:
                        t_ms = timeit_torch(torch, tf, reps=3)
                    except Exception as exc:  # noqa: BLE001
                        print(f"  torch failed: {exc}")
                row = dict(dtype=np.dtype(dtype).name, n=n, batch=bsz, op=op, threads=best_thr,
                           ms=best, gflops=flops / best / 1e6, floor_ms=floor,
                           bw_fraction=floor / best, cublas_ms=cb_ms, x_cublas=cb_ms / best,
                           torch_ms=t_ms, x_torch=t_ms / best, device=info.get("name"),
                           copy_tbs=bw / 1e12)
                rows.append(row)
                print(f"{row['dtype']:7} {n:>4} {bsz:>8} {op:4} {str(best_thr):>4} {best:8.3f} "
                      f"{row['gflops']:7.0f} {floor:8.3f} {100 * row['bw_fraction']:5.0f} "
                      f"{cb_ms:9.3f} {row['x_cublas']:8.2f} {t_ms:8.3f} {row['x_torch']:7.2f}",
                      flush=True)
            del a
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
