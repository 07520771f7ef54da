"""What an LSQR iteration costs in one GPU thread block, on the CuPy path and in the host loop.

    source .dev/remote-setup.sh
    python3 bench/block_lsqr.py --json $OUT/block.json

For each problem: the seconds of a run in one thread block
(:func:`scipy_gpuqr._iterative.block.block_lsqr`, host data in and out) at two
iteration counts, whose difference gives the seconds per iteration and the rest
the fixed cost of a call (packing, the copy, the launches and the copy back);
the same per iteration for SciPy's own ``lsqr``, our host loop
(:mod:`scipy_gpuqr._iterative.host`) and the CuPy path (A already on the device);
and beside each the cost model's nominal value
(:func:`~scipy_gpuqr._dispatch.placement.block_iteration_seconds`,
:func:`~scipy_gpuqr._dispatch.placement.block_start_seconds`,
:func:`~scipy_gpuqr._dispatch.placement.host_iteration_seconds`,
:func:`~scipy_gpuqr._dispatch.placement.gpu_iteration_seconds`). The runs
ignore the tolerances (``atol = btol = conlim = 0``) so they make the iterations
asked for unless the machine-precision tests stop them first (the iteration
counts actually run are used). Medians of ``--reps`` calls after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy_gpuqr._dispatch import placement as model  # noqa: E402
from scipy_gpuqr._gpu import import_cupy  # noqa: E402
from scipy_gpuqr._iterative import lsqr  # noqa: E402
from scipy_gpuqr._iterative.block import block_lsqr, block_threads  # noqa: E402
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,  # noqa: E402
                                           random_least_squares)
from scipy_gpuqr.io import mmread  # noqa: E402

MATRICES = Path(os.environ.get("SHARED_MATRICES") or ROOT / "tests" / "data" / "matrices")


def problems(large: bool):
    for name in ("Ragusa16", "west0067", "gent113", "lp_e226", "reorientation_1", "bayer10"):
        yield name, lambda name=name: mmread(str(MATRICES / f"{name}.mtx"))
    yield "grid16", lambda: grid3d_least_squares(16)
    yield "rand20000x4000", lambda: random_least_squares(20000, 4000, 0.0012, seed=1)
    yield "grid24", lambda: grid3d_least_squares(24)
    if large:
        yield "ch7-8-b3", lambda: chessboard_boundary(7, 8, 3)
        yield "grid40", lambda: grid3d_least_squares(40)


def median_seconds(fn, reps: int, sync=lambda: None):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def per_iteration(run, k1: int, k2: int, reps: int, sync=lambda: None):
    """(seconds per iteration, fixed seconds) from runs of k1 and k2 iterations."""
    t1, r1 = median_seconds(lambda: run(k1), reps, sync)
    t2, r2 = median_seconds(lambda: run(k2), reps, sync)
    i1, i2 = int(r1[2]), int(r2[2])
    if i2 <= i1:
        return float("nan"), t1
    per = (t2 - t1) / (i2 - i1)
    return per, t1 - per * i1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--large", action="store_true", help="add ch7-8-b3 and grid 40^3")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    cp = import_cupy()
    import cupyx.scipy.sparse as csp
    sync = cp.cuda.Device().synchronize
    rows = []
    zero = dict(atol=0.0, btol=0.0, conlim=0.0)
    for name, make in problems(args.large):
        A = sp.csr_array(make(), dtype=np.float64)
        m, n = A.shape
        nnz = int(A.nnz)
        b = np.random.default_rng(7).standard_normal(m)
        k1, k2 = (4, 20) if min(m, n) < 200 else (8, 72)
        blk, blk_fixed = per_iteration(lambda k: block_lsqr(A, b, iter_lim=k, **zero),
                                       k1, k2, args.reps)
        host, _ = per_iteration(lambda k: lsqr(A, b, iter_lim=k, xp=np, **zero), k1, k2,
                                args.reps)
        scipy_s, _ = per_iteration(lambda k: spla.lsqr(A, b, iter_lim=k, **zero), k1, k2,
                                   args.reps)
        Ad, bd = csp.csr_matrix(sp.csr_matrix(A)), cp.asarray(b)
        gpu, _ = per_iteration(lambda k: lsqr(Ad, bd, iter_lim=k, **zero), k1, k2, args.reps,
                               sync)
        row = dict(name=name, m=m, n=n, nnz=nnz, threads=block_threads(m, n),
                   block_it=blk, block_fixed=blk_fixed, host_it=host, scipy_it=scipy_s,
                   cupy_it=gpu,
                   model_block_it=model.block_iteration_seconds(m, n, nnz),
                   model_block_start=model.block_start_seconds(m, n, nnz),
                   model_host_it=model.host_iteration_seconds(m, n, nnz),
                   model_cupy_it=model.gpu_iteration_seconds(m, n, nnz))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| problem | m × n, nnz | threads | block µs/it (model) | block fixed µs (model start) "
          "| host loop µs/it (model) | SciPy µs/it | CuPy path µs/it (model) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['m']}×{r['n']}, {r['nnz']} | {r['threads']} "
              f"| {r['block_it'] * 1e6:.1f} ({r['model_block_it'] * 1e6:.1f}) "
              f"| {r['block_fixed'] * 1e6:.0f} ({r['model_block_start'] * 1e6:.0f}) "
              f"| {r['host_it'] * 1e6:.1f} ({r['model_host_it'] * 1e6:.1f}) "
              f"| {r['scipy_it'] * 1e6:.1f} "
              f"| {r['cupy_it'] * 1e6:.1f} ({r['model_cupy_it'] * 1e6:.1f}) |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
