#!/usr/bin/env python3
"""Compile-time variants of the n <= 32 batched LU / inverse kernels (issue 7).

    python3 bench/batched_variants.py [--json out.json] [--only LABEL,...]

``getrf_warp`` / ``getri_warp`` (kernels/batched/lu_warp.cu) take compile-time
overrides: lanes per row ``G`` (1: a row per lane; 2 or 4: the 2-D layout of
kernels/batched/warp2d.cuh), the register cap ``MINB`` (blocks of 256 threads
per SM: 1 -> 255, 2 -> 128, 3 -> 80 registers) and ``TINY`` (n <= TINY: a
thread per matrix). Each variant is compiled on its own, checked against
LAPACK on fresh random and singular batches (outputs poisoned first), then
timed on 2**20 matrices over (threads per block, stages): device time, CUDA
events after warm-up, median of 5, the GPU kept busy by a copy enqueued just
before (bench/batched.py's Timer, one copy instead of two). The library
default is the row without options.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

import numpy as np  # noqa: E402
from batched import Timer  # noqa: E402  (bench/batched.py, beside this script)
from lapack_check import compare_getrf  # noqa: E402
from scipy_gpuqr.batched._gpu_common import NO_REPORT  # noqa: E402

OPTIONS = {
    "default": (),
    "g1": ("-DGPUQR_G_LU=1", "-DGPUQR_G_GJ=1"),
    "g2": ("-DGPUQR_G_LU=2", "-DGPUQR_G_GJ=2"),
    "g4": ("-DGPUQR_G_LU=4", "-DGPUQR_G_GJ=4"),
    "g1r80": ("-DGPUQR_G_LU=1", "-DGPUQR_G_GJ=1", "-DGPUQR_MINB_LU=3", "-DGPUQR_MINB_GJ=3"),
    "g1r255": ("-DGPUQR_G_LU=1", "-DGPUQR_G_GJ=1", "-DGPUQR_MINB_LU=1", "-DGPUQR_MINB_GJ=1"),
    "g2r80": ("-DGPUQR_G_LU=2", "-DGPUQR_G_GJ=2", "-DGPUQR_MINB_LU=3", "-DGPUQR_MINB_GJ=3"),
    "g2r255": ("-DGPUQR_G_LU=2", "-DGPUQR_G_GJ=2", "-DGPUQR_MINB_LU=1", "-DGPUQR_MINB_GJ=1"),
    "g4r255": ("-DGPUQR_G_LU=4", "-DGPUQR_G_GJ=4", "-DGPUQR_MINB_LU=1", "-DGPUQR_MINB_GJ=1"),
    "s1": ("-DGPUQR_SHFL_PIVOT=1",),
    "g1s1": ("-DGPUQR_G_LU=1", "-DGPUQR_G_GJ=1", "-DGPUQR_SHFL_PIVOT=1"),
    "tiny0": ("-DGPUQR_TINY_MAX=0",),
    "tiny4": ("-DGPUQR_TINY_MAX=4",),
}
TINY = {"tiny0": 0, "tiny4": 4}
DEFAULT_TINY = 2

# (op, dtype, n, labels); the first round (2-D layout, register caps) is
# EXPERIMENTS_1, kept for the record (bench/RESULTS.md, issue 7)
EXPERIMENTS_1 = [
    ("lu", "float64", 32, ("g1", "g2", "g4", "g1r80", "g2r80", "g2r255")),
    ("inv", "float64", 32, ("g1", "g2", "g4", "g1r255", "g2r255", "g4r255")),
    ("lu", "float64", 24, ("g1", "g2", "g4")),
    ("inv", "float64", 24, ("g1", "g2", "g4")),
    ("lu", "float64", 18, ("g1", "g2")),
    ("lu", "float32", 32, ("g1", "g2", "g4")),
]
EXPERIMENTS = [
    ("lu", "float64", 2, ("tiny0", "default")),
    ("inv", "float64", 2, ("tiny0", "default")),
    ("lu", "float32", 2, ("tiny0", "default")),
    ("inv", "float32", 2, ("tiny0", "default")),
    ("lu", "float64", 1, ("tiny0", "default")),
    ("lu", "float64", 3, ("default", "tiny4")),
    ("inv", "float64", 3, ("default", "tiny4")),
    ("lu", "float64", 4, ("default", "tiny4")),
    ("inv", "float64", 4, ("default", "tiny4")),
    ("lu", "float64", 32, ("default", "s1")),
    ("inv", "float64", 32, ("default", "g1", "g1s1")),
    ("lu", "float64", 24, ("default", "s1")),
    ("inv", "float64", 24, ("default", "s1")),
    ("lu", "float64", 16, ("default", "s1")),
    ("inv", "float64", 16, ("default", "s1")),
    ("lu", "float64", 8, ("default", "s1")),
    ("inv", "float64", 8, ("default", "s1")),
    ("lu", "float32", 32, ("default", "s1")),
    ("inv", "float32", 32, ("default", "g2", "s1")),
]
CONFIGS = ((64, 1), (128, 1), (256, 1), (64, 2), (128, 2), (256, 2))
BATCH = 1 << 20
_CT = {"float32": "float", "float64": "double"}


def _size(op, n):
    from scipy_gpuqr.batched._kernel_registry import padded_size
    return n if op == "lu" else padded_size(n)


def _name(op, dt, size):
    return f"{'getrf_warp' if op == 'lu' else 'getri_warp'}<{_CT[dt]}, {size}>"


def _function(op, dt, size, label):
    from scipy_gpuqr import _kernels
    name = _name(op, dt, size)
    return _kernels.load_module("batched/lu_warp.cu", (name,), OPTIONS[label]).get_function(name)


def _compile(job):
    _function(*job)
    return job


def _tiny(label, size):
    return size <= TINY.get(label, DEFAULT_TINY)


def launch(cp, fn, op, size, n, a, outs, threads, stages, tiny):
    from cupy_backends.cuda.api import driver

    from scipy_gpuqr.batched._gpu import _seg, warp_smem_bytes
    bsz = a.shape[0]
    if tiny:
        smem, mw = 0, 32
    else:                   # the warp path, whatever the library's TINY_MAX
        smem = warp_smem_bytes(size, a.itemsize, threads // 32, stages, tiny_max=0)
        mw = 32 // _seg(size)
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    tasks = -(-bsz // mw)
    grid = max(1, min(max(1, per_sm) * sms, -(-tasks // (threads // 32))))
    vw = 16 // a.itemsize
    vec = int(a.data.ptr % 16 == 0 and outs[0].data.ptr % 16 == 0 and n % vw == 0)
    if op == "lu":
        args = (a, outs[0], outs[1], outs[2], np.int64(bsz))
    else:
        args = (a, outs[0], outs[1], np.int64(bsz), np.int32(n))
    fn((grid,), (threads,), args + (np.int32(stages), np.int32(vec)) + NO_REPORT,
       shared_mem=smem)
    return per_sm


def outputs(cp, op, bsz, n, dtype):
    x = cp.full((bsz, n, n), np.nan, dtype=dtype)
    info = cp.full((bsz,), -12345, dtype=np.int32)
    if op == "lu":
        return (x, cp.full((bsz, n), -12345, dtype=np.int32), info)
    return (x, info)


def check(cp, fn, op, size, n, dtype, tiny, rng):
    """Max error against LAPACK (scaled like the tests) and pivot / info agreement."""
    eps = float(np.finfo(dtype).eps)
    bsz = 997
    a = rng.standard_normal((bsz, n, n)).astype(dtype)
    for i in range(0, 64, 2):
        a[i, :, (i // 2) % n] = 0                  # exactly singular
    a[1, n - 1, 0] = np.inf                         # non-finite
    ga = cp.asarray(a)
    problems = []
    for threads, stages in ((128, 2), (64, 1)):
        outs = outputs(cp, op, bsz, n, dtype)
        launch(cp, fn, op, size, n, ga, outs, threads, stages, tiny)
        cp.cuda.Device().synchronize()
        if op == "lu":
            lu, piv, info = (o.get() for o in outs)
            err, bad_piv, found = compare_getrf(a, lu, piv, info, nonfinite=(1,))
            problems += found
            if bad_piv > 2:
                problems.append(f"{bad_piv} pivot mismatches")
            if err > 50 * n * eps:
                problems.append(f"lu error {err:.2e}")
        else:
            x, info = (o.get() for o in outs)
            good = np.arange(64, bsz)
            ref = np.linalg.inv(a[good].astype(np.float64))
            cond = np.linalg.cond(a[good].astype(np.float64))
            e = np.abs(x[good] - ref).max(axis=(1, 2)) / (cond * np.abs(ref).max(axis=(1, 2)))
            err = float(e.max())
            if not np.isfinite(err) or err > 30 * n * eps:
                problems.append(f"inv error {err:.2e}")
            if (info[good] != 0).any():
                problems.append("info != 0 on regular")
            sing = np.arange(0, 64, 2)
            if (info[sing] <= 0).any():
                problems.append("singular not flagged")
            if info[1] != -1:
                problems.append("inf not flagged")
    return err, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--only", help="comma-separated labels")
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--round", type=int, default=2, help="1: the first round of experiments")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    exps = [(op, dt, n, tuple(l for l in labels if only is None or l in only))
            for op, dt, n, labels in (EXPERIMENTS_1 if args.round == 1 else EXPERIMENTS)]
    jobs = sorted({(op, dt, _size(op, n), l) for op, dt, n, labels in exps for l in labels},
                  key=lambda j: -j[2])
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.parallel) as ex:
        list(ex.map(_compile, jobs))
    print(f"compiled {len(jobs)} variants in {time.perf_counter() - t0:.1f} s", flush=True)

    import cupy as cp
    rng = np.random.default_rng(11)
    timer = Timer(cp, busy_copies=1)
    rows = []
    print(f"{'op':4} {'dtype':7} {'n':>3} {'variant':8} {'ok':3} {'err':>8} {'regs':>4} "
          f"{'blk/SM':>6} {'best ms':>8} {'cfg':>6}  all (threads/stages: ms)", flush=True)
    for op, dt, n, labels in exps:
        size = _size(op, n)
        dtype = np.dtype(dt)
        a = cp.asarray(rng.standard_normal((BATCH, n, n)).astype(dtype))
        for label in labels:
            fn = _function(op, dt, size, label)
            tiny = _tiny(label, size)
            err, problems = check(cp, fn, op, size, n, dtype, tiny, rng)
            outs = outputs(cp, op, BATCH, n, dtype)
            res, occ = {}, {}
            for thr, st in CONFIGS:
                if tiny and st == 2:
                    continue
                occ[(thr, st)] = launch(cp, fn, op, size, n, a, outs, thr, st, tiny)
                res[(thr, st)] = timer.device(
                    lambda thr=thr, st=st, x=a, o=outs: launch(cp, fn, op, size, n, x, o, thr, st, tiny))
            best = min(res, key=res.get)
            row = dict(op=op, dtype=dt, n=n, variant=label, options=list(OPTIONS[label]),
                       ok=not problems, problems=problems, err=float(err), regs=fn.num_regs,
                       spill_bytes=fn.local_size_bytes, blocks_per_sm=occ[best],
                       ms=res[best], cfg=f"{best[0]}/{best[1]}",
                       all={f"{k[0]}/{k[1]}": v for k, v in res.items()})
            rows.append(row)
            print(f"{op:4} {dt:7} {n:>3} {label:8} {'ok' if row['ok'] else 'BAD':3} {err:8.1e} "
                  f"{fn.num_regs:>4} {occ[best]:>6} {res[best]:8.3f} {row['cfg']:>6}  "
                  + " ".join(f"{k}:{v:.3f}" for k, v in row["all"].items())
                  + ("" if row["ok"] else f"  {problems[:3]}"), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
            del outs
        del a
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
