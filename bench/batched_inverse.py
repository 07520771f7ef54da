"""The batched inverse of n > 64 beside cuBLAS, torch and the solve it replaces.

Usage::

    python3 bench/batched_inverse.py [--sizes 64,128,256,512] [--reps 5]
                                     [--dtype float64] [--json out.json]

For each order n (batch of ``bench/batched.py``'s ``LARGE`` table, a plain
random stack), device ms (CUDA events, the calls taken in turn, medians of
``--reps`` after two warm-ups, two 512 MiB copies queued before each start
event as ``bench/batched.py`` does):

* ``lu``: the LU alone (``_gpu_blocked.getrf``, the default method);
* ``blk32`` / ``blk64``: the LU and the blocked inverse U⁻¹ L⁻¹ P with block
  rows of 32 / 64 (``_gpu_blocked.inverse_blocks``, also at n <= 64, where
  ``inv_batched`` solves in shared memory);
* ``solve``: the LU and the solve with the identity that the inverse of
  n > 64 ran before (``_gpu_blocked.getrs`` on the identity broadcast, a
  thread per matrix and column; for n <= 64 the shared-memory solve);
* ``public``: ``inv_batched(a)`` (default call: the status word read back);
* ``pub other``: the same call routed the other way (the shared-memory
  solve where ``public`` takes the blocked inverse, and the reverse:
  ``_gpu_blocked.BLOCKED_INVERSE_MIN`` moved for the call), so that the
  routing at the boundary is judged on public calls;
* ``cuBLAS``: getrfBatched + getriBatched; ``torch``: ``torch.linalg.inv``.

``err``: max over the first 32 matrices of max |X - inv(A)| / max |inv(A)|
(NumPy's float64 inverse on the host), for blk32, blk64, solve and cuBLAS
(``cupy.linalg.inv``: getrfBatched + getriBatched).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched import LARGE, Timer, cublas_lu, torch_ms  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,128,256,512")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp
    import scipy_gpuqr as g
    from scipy_gpuqr.batched import _gpu_blocked as bb
    try:
        import torch
    except Exception:  # torch is optional
        torch = None
    dtype = np.dtype(args.dtype)
    timer = Timer(cp)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"cupy {cp.__version__}, torch {getattr(torch, '__version__', None)}, {dtype.name}")
    cols = ("lu", "blk32", "blk64", "solve", "public", "pub other", "cuBLAS", "torch")
    print(f"{'n':>4} {'batch':>7} " + " ".join(f"{c:>9}" for c in cols)
          + "   err blk32 / blk64 / solve / cuBLAS", flush=True)
    rows = []
    rng = cp.random.default_rng(11)
    for n in [int(s) for s in args.sizes.split(",")]:
        bsz = dict(LARGE).get(n, 10000)
        a = rng.standard_normal((bsz, n, n), dtype=dtype)
        piv = cp.empty((bsz, n), dtype=cp.int32)
        info = cp.empty((bsz,), dtype=cp.int32)

        def lu_of(a=a, n=n, bsz=bsz):
            p = cp.empty((bsz, n), dtype=cp.int32)
            return bb.getrf(a, p, cp.empty((bsz,), dtype=cp.int32)), p

        def blocks(nb):
            def run():
                lu, p = lu_of()
                return bb.inverse_blocks(lu, p, nb)
            return run

        def solve(a=a, n=n, bsz=bsz):
            lu, p = lu_of()
            if n <= bb.FUSED_MAX:
                return bb._solve_smem(lu, p, None, 0, True)
            return bb.getrs(lu, p, cp.broadcast_to(cp.eye(n, dtype=a.dtype), (bsz, n, n)))
        def other_route(a=a, n=n):
            keep = bb.BLOCKED_INVERSE_MIN
            bb.BLOCKED_INVERSE_MIN = n + 1 if n >= keep else n
            try:
                return g.inv_batched(a)
            finally:
                bb.BLOCKED_INVERSE_MIN = keep
        fns = {"lu": lambda a=a: bb.getrf(a, piv, info),
               "blk32": blocks(32),
               "blk64": blocks(64),
               "solve": solve,
               "public": lambda a=a: g.inv_batched(a),
               "pub other": other_route}
        ms = dict(zip(fns, timer.device_interleaved(list(fns.values()), reps=args.reps)))
        work = a.copy()
        ms["cuBLAS"] = timer.device(cublas_lu(cp, work, inverse=True), reps=3)
        ms["torch"] = torch_ms(torch, timer, a, "inv")
        ref = np.linalg.inv(a[:32].get().astype(np.float64))
        scale = np.abs(ref).max(axis=(1, 2), keepdims=True)
        err = {}
        for name in ("blk32", "blk64", "solve"):
            err[name] = float((np.abs(fns[name]()[:32].get() - ref) / scale).max())
        cp.cuda.Device().synchronize()
        err["cuBLAS"] = float((np.abs(cp.linalg.inv(a[:32]).get() - ref) / scale).max())
        row = dict(n=n, batch=bsz, dtype=dtype.name,
                   **{f"{k.replace(' ', '_')}_ms": v for k, v in ms.items()},
                   **{f"err_{k}": v for k, v in err.items()})
        rows.append(row)
        print(f"{n:>4} {bsz:>7} " + " ".join(f"{ms[c]:9.3f}" for c in cols)
              + "   " + " / ".join(f"{err[k]:.1e}" for k in ("blk32", "blk64", "solve", "cuBLAS")),
              flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        a = work = piv = info = None
        fns = None
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
