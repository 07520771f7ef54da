"""The blocked LU of 64 < n <= 512 by its knobs: the column block of the
trailing updates, the panel kernel's shared memory, where the input is
copied and when the L columns are swapped.

For each ``--sizes`` n:batch, on one random float64 stack: ``_rows_lu`` of
:mod:`scipy_gpuqr.batched._gpu_blocked` with the tensor-core panels and each
``--outers`` column block (the library's scheme: the first panel reads the
input, the earlier blocks' L columns swapped at the end); at the default
block also with a copy of the input first, and with a copy and the L
columns swapped by every panel; the panel kernel given only the room it needs
(the library's ``mma_rows_smem``; the occupancy table also with 2048
more doubles, the swap buffer of the kernel before 92d1770); the float32
``rows`` path (``--f32``); cuBLAS getrfBatched in the same run. Device ms (CUDA events behind busy copies, the variants interleaved,
median of ``--reps``); every variant's pivots and factors against the
first variant's and, for a few matrices, against LAPACK; the panel
kernel's registers, spills and resident blocks per SM (occupancy API).
Every variant above on one stream; ``--streams`` adds the library's scheme
at the default block with the batch in that many parts on streams of their
own (``_rows_lu``'s ``streams``; 1 is the variant above), and with
``--carveout`` each of them also with the memory-bound kernels beside the
panels (``rows_swap``, ``rows_copy_perm``, ``rows_swap_left``,
``trsm_lunit``) asking for the largest shared-memory carveout during the
call, the panel kernel's (an SM runs blocks of one carveout at a time).

Usage::

    python3 bench/batched_lu_rows.py --sizes 128:20000,256:4000,512:2000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH
sys.path.append(str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128:20000,256:4000,512:2000")
    ap.add_argument("--outers", default="64,128,256")
    ap.add_argument("--f32", action="store_true", help="also the float32 rows path")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--streams", default="",
                    help="parts of the batch on streams of their own, e.g. 2,3,4")
    ap.add_argument("--carveout", action="store_true",
                    help="--streams also with the largest carveout for the other kernels")
    ap.add_argument("--clock", action="store_true",
                    help="only: the panel kernel's cycles per phase (GPUQR_ROWS_CLOCK build)")
    args = ap.parse_args(argv)
    if args.clock:
        return clock(args)

    import cupy as cp
    import numpy as np
    import scipy.linalg as sl
    from cupy_backends.cuda.api import driver
    from batched import Timer, cublas_lu
    from scipy_gpuqr.batched import _gpu_blocked as bb
    from scipy_gpuqr.batched._gpu_common import device_id

    timer = Timer(cp)
    base_smem = bb.mma_rows_smem
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    pfn = bb._mma64_function(device_id(), bb.MMA_ROWS_NAME)
    for w in range(1, 9):
        for extra in (0, 2048):
            smem = base_smem(w) + 8 * extra
            bb._with_smem(pfn, smem)
            try:
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    getattr(pfn, "kernel", pfn).ptr, 32 * w, smem)
            except Exception as exc:  # noqa: BLE001
                per_sm = f"? ({exc})"

            print(f"  getrf_mma_rows warps={w} smem={smem} B: {per_sm} blocks/SM "
                  f"(regs {pfn.num_regs}, spill {pfn.local_size_bytes} B)")

    rng = cp.random.default_rng(7)
    for spec in args.sizes.split(","):
        n, bsz = (int(v) for v in spec.split(":"))
        a = rng.standard_normal((bsz, n, n), dtype=np.float64)
        outers = [o for o in (int(v) for v in args.outers.split(",")) if o <= max(n, 64)]
        variants = []                      # (label, dtype, callable returning lu, piv)

        def make(mma, outer, dtype, scheme="from a", streams=1, carve=False):
            src = a if dtype == np.float64 else a.astype(dtype)
            piv = cp.empty((bsz, n), dtype=cp.int32)
            info = cp.empty((bsz,), dtype=cp.int32)

            def call():
                if scheme == "from a":          # the library's: no copy, L swaps deferred
                    lu = cp.empty_like(src)
                    bb._rows_lu(lu, piv, info, mma, outer, src=src, streams=streams)
                else:                           # a copy first; L swapped by every panel or not
                    lu = src.copy()
                    bb._rows_lu(lu, piv, info, mma, outer,
                                defer_left=scheme == "copy, deferred L", streams=streams)
                return lu, piv
            if carve:
                dev = device_id()
                others = [bb._mma64_function(dev, name) for name in
                          (bb.MMA_SWAP_NAME, bb.MMA_COPY_NAME, bb.MMA_LEFT_NAME)]
                others.append(bb._rows_function("trsm_lunit", "float64", bb.ROWS_PANEL,
                                                bb.ROWS_THREADS, dev))

                def carved():
                    for f in others:
                        f.preferred_shared_memory_carveout = 100
                    try:
                        return call()
                    finally:
                        for f in others:
                            f.preferred_shared_memory_carveout = -1
                return carved
            return call

        for o in outers:
            variants.append((f"rows_mma outer={o}", np.float64, make(True, o, np.float64)))
        dflt = bb.rows_outer(n)
        for k in (int(v) for v in args.streams.split(",") if v):
            variants.append((f"rows_mma outer={dflt} streams={k}", np.float64,
                             make(True, dflt, np.float64, streams=k)))
            if args.carveout:
                variants.append((f"rows_mma outer={dflt} streams={k} carveout", np.float64,
                                 make(True, dflt, np.float64, streams=k, carve=True)))
        for scheme in ("copy, deferred L", "copy, L every panel"):
            variants.append((f"rows_mma outer={dflt} {scheme}", np.float64,
                             make(True, dflt, np.float64, scheme)))
        if args.f32:
            variants.append((f"rows f32 outer={dflt}", np.float32,
                             make(False, dflt, np.float32, "copy")))
            for k in (int(v) for v in args.streams.split(",") if v):
                variants.append((f"rows f32 outer={dflt} streams={k}", np.float32,
                                 make(False, dflt, np.float32, "copy", streams=k)))
        ref = {}
        for label, dt, call in variants:
            lu, piv = call()
            lu, piv = lu[:64].get(), piv[:64].get()
            key = np.dtype(dt).name
            if key not in ref:
                ref[key] = (lu, piv)
                host = a[:3].get().astype(dt)
                for i in range(3):
                    rl, rp = sl.lu_factor(host[i])
                    err = np.abs(rl - lu[i]).max() / max(1.0, np.abs(rl).max())
                    print(f"  n={n} {label}: LAPACK matrix {i}: pivots "
                          f"{'equal' if (rp == piv[i]).all() else 'DIFFER'}, rel err {err:.2e}")
            rl, rp = ref[key]
            same = (rp == piv).all(axis=1)
            err = np.abs(rl[same] - lu[same]).max() if same.any() else float("nan")
            print(f"  n={n} {label}: pivots equal in {same.sum()}/64, max diff {err:.2e}")
        cb_work = a.copy()
        fns = [c for _, _, c in variants] + [cublas_lu(cp, cb_work, False)]
        times = timer.device_interleaved(fns, reps=args.reps)
        cub = times[-1]
        print(f"n={n} batch={bsz}: cuBLAS getrfBatched {cub:.3f} ms")
        for (label, _, _), t in zip(variants, times):
            print(f"  {label:34} {t:8.3f} ms   cuBLAS / this {cub / t:5.2f}")
        a = cb_work = None
        cp.get_default_memory_pool().free_all_blocks()
    return 0


PHASES = ("copy in", "pivots", "DMMA", "copy out", "swaps")


def clock(args) -> int:
    """Per panel launch of the default blocked LU: thread 0's clock64 ticks per
    phase, averaged over the blocks, and the launch's device ms."""
    import cupy as cp
    import numpy as np
    from scipy_gpuqr._kernels import load_module
    from scipy_gpuqr.batched import _gpu_blocked as bb
    from scipy_gpuqr.batched._kernel_registry import KERNEL_VARIANTS, MMA64_FILE

    module = load_module(MMA64_FILE, KERNEL_VARIANTS[MMA64_FILE], ("-DGPUQR_ROWS_CLOCK",))
    fn = module.get_function(bb.MMA_ROWS_NAME)
    raw = module._module(bb.MMA_ROWS_NAME)
    counters = raw.get_global("gpuqr_rows_clock")
    slots = cp.ndarray((8,), dtype=cp.uint64, memptr=counters)
    rows = []

    class Clocked:
        def __getattr__(self, name):
            return getattr(fn, name)

        def __setattr__(self, name, value):
            setattr(fn, name, value)

        def __call__(self, grid, block, kargs, shared_mem=0):
            slots.fill(0)
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            fn(grid, block, kargs, shared_mem=shared_mem)
            e.record()
            e.synchronize()
            v = slots.get().astype(np.float64)
            rows.append((int(kargs[5]), block[0] // 32, shared_mem,
                         cp.cuda.get_elapsed_time(s, e), v[:5] / max(v[7], 1)))

    orig = bb._mma64_function
    bb._mma64_function = lambda dev, name=bb.MMA64_NAME: (
        Clocked() if name == bb.MMA_ROWS_NAME else orig(dev, name))
    rng = cp.random.default_rng(7)
    try:
        for spec in args.sizes.split(","):
            n, bsz = (int(v) for v in spec.split(":"))
            a = rng.standard_normal((bsz, n, n), dtype=np.float64)
            piv = cp.empty((bsz, n), dtype=cp.int32)
            info = cp.empty((bsz,), dtype=cp.int32)
            for _ in range(2):
                rows.clear()
                lu = a.copy()
                bb._rows_lu(lu, piv, info, True, streams=1)
            print(f"n={n} batch={bsz}: getrf_mma_rows per launch (thread 0's cycles per block)")
            print("    k0 warps  smem    ms   " + "".join(f"{p:>10}" for p in PHASES))
            for k0, w, smem, ms, v in rows:
                print(f"  {k0:4d} {w:5d} {smem:6d} {ms:6.3f} " + "".join(f"{x:10.0f}" for x in v))
            a = lu = None
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        bb._mma64_function = orig
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
