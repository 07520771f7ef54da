"""Host rank decisions in sizes of R (issue 16, item 3): public lsqr on the CPU backend.

    python bench/host_rank_r.py                       # bayer10, 5 calls
    python bench/host_rank_r.py --matrices DIR --reps 3 bayer10 rajat01 Franz6_id1959_aug
    python bench/host_rank_r.py --lanes 1             # the rank decision on one thread

Per matrix: ``lsqr(A, b, backend='cpu')`` (b = ``default_rng(7).standard_normal``)
``--reps`` times in one process (min and median wall time, and the process'
CPU time of the fastest call: on a shared host it moves less than the wall
time), then one
``QRFactorization(A, backend='cpu').solve(b)`` for its phase timings and rank
decision, SciPy's own ``scipy.sparse.linalg.lsqr`` for reference, and the
answer (rank, ‖x‖, ‖Aᵀr‖/(σ_max‖r‖) with σ_max by Lanczos). Run the same
script with ``PYTHONPATH`` on an export of an older commit to time "before".
One JSON line per matrix; the load average is printed with it (the 2-core host
is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import scipy_gpuqr
from scipy_gpuqr import QRFactorization
from scipy_gpuqr._factor.subspace_cod import sigma_max_lanczos
from scipy_gpuqr.io import mmread


def _lanes():
    try:
        from scipy_gpuqr._factor import host_lanes
    except ImportError:
        return None
    return min(host_lanes.MAX_LANES, host_lanes._cores())


def run(path: Path, reps: int) -> dict:
    A = sp.csc_array(mmread(str(path))).astype(np.float64)
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    times, cpu = [], []
    x = None
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        x = scipy_gpuqr.lsqr(A, b, backend="cpu")[0]
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    t = time.perf_counter()
    F = QRFactorization(A, backend="cpu")
    F.solve(b)
    t_qrf = time.perf_counter() - t
    t = time.perf_counter()
    spla.lsqr(A, b)
    t_scipy = time.perf_counter() - t
    r = b - A @ x
    smax = sigma_max_lanczos(A)
    dec = F.info["rank_decision"]
    return dict(matrix=path.stem, shape=list(A.shape), nnz_R=int(sp.csc_array(F.R).nnz),
                lsqr_min=round(min(times), 3), lsqr_median=round(statistics.median(times), 3),
                lsqr_all=[round(v, 2) for v in times],
                lsqr_cpu_of_min=round(cpu[int(np.argmin(times))], 3), qrf_solve=round(t_qrf, 3),
                timings={k: round(v, 3) for k, v in F.info["timings"].items()},
                method=dec["method"], rank=int(F.rank), revealed=dec["rank_revealed"],
                norm_x=float(np.linalg.norm(x)),
                berr=float(np.linalg.norm(A.T @ r) / (smax * np.linalg.norm(r))),
                scipy_lsqr=round(t_scipy, 3), load=os.getloadavg()[0],
                lanes=_lanes(),
                package=str(Path(scipy_gpuqr.__file__).parent.parent))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["bayer10"])
    ap.add_argument("--matrices", default="tests/data/matrices")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lanes", type=int, default=None,
                    help="threads of the host rank decision (default: one per core, at most "
                         "host_lanes.MAX_LANES); trees without host_lanes ignore it")
    args = ap.parse_args()
    if args.lanes is not None:
        try:
            from scipy_gpuqr._factor import host_lanes
            host_lanes.MAX_LANES = args.lanes
        except ImportError:
            pass
    for name in args.names:
        print(json.dumps(run(Path(args.matrices) / f"{name}.mtx", args.reps)), flush=True)


if __name__ == "__main__":
    main()
