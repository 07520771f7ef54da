"""Seconds per iteration of SciPy's LSQR/LSMR against ours on the CPU, same iterates.

``auto`` runs SciPy's algorithm first (:mod:`scipy_gpuqr._iterative`; on a
SciPy CSR/CSC float64 matrix, the host loops of
:mod:`scipy_gpuqr._iterative.host`); where SciPy's ``iter_lim``/``maxiter``
ends the run, the QR answers after it, so the run's cost per iteration
decides whether ``auto`` beats SciPy's call. Each row runs SciPy's function
and ours (``scipy_gpuqr._iterative.lsqr``/``lsmr``, no callback: the
iterations alone) with an iteration cap, alternating, with ``gc.collect()``
before each call, and reports the median seconds per iteration on the
process clock; ours must return SciPy's x to the bit (checked). ``--tree``
runs another checkout's package (e.g. a ``git archive`` of an earlier
commit) to compare::

    OPENBLAS_NUM_THREADS=1 python3 bench/iteration_cost.py
    OPENBLAS_NUM_THREADS=1 python3 bench/iteration_cost.py --tree /tmp/before
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

ROOT = Path(__file__).resolve().parents[1]
MATRICES = ROOT / "tests" / "data" / "matrices"

#: (problem, method): the drop-in ladder's rows that SciPy's limit ends, and some that converge.
ROWS = [("lp_e226", "lsmr"), ("lp_e226_transposed", "lsmr"), ("lp_share1b", "lsmr"),
        ("lp_e226", "lsqr"), ("lp_share1b", "lsqr"), ("GD06_theory", "lsqr"),
        ("west0479", "lsqr"), ("494_bus", "lsqr"), ("dwt_878", "lsqr"), ("rajat19", "lsqr"),
        ("bayer10", "lsqr"), ("grid16", "lsqr")]


def problem(name: str):
    """The ladder's matrix (CSC float64) and b (seeded by its name, as in bench/dropin.py)."""
    if name == "grid16":
        from scipy_gpuqr._testing_matrices import grid3d_least_squares
        A = grid3d_least_squares(16)
    else:
        from scipy_gpuqr.io import mmread
        A = mmread(str(MATRICES / f"{name}.mtx"))
    A = sp.csc_array(A, dtype=np.float64)
    b = np.random.default_rng([20261126, zlib.crc32(name.encode())]).standard_normal(A.shape[0])
    return A, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=str(ROOT), help="checkout whose scipy_gpuqr runs")
    ap.add_argument("--cap", type=int, default=300, help="iteration cap of every run")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", default="", help="comma-separated problem names")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.tree)
    from scipy_gpuqr._iterative import lsmr, lsqr
    only = {s for s in args.only.split(",") if s}
    clock = time.process_time
    print(f"tree {args.tree}; cap {args.cap} iterations; process clock, median of {args.reps}")
    print("| problem | shape | nnz | call | iterations | SciPy µs/it | ours µs/it | SciPy / ours |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for name, method in ROWS:
        if only and name not in only:
            continue
        A, b = problem(name)
        limit = {"iter_lim" if method == "lsqr" else "maxiter": args.cap}
        theirs = {"lsqr": spla.lsqr, "lsmr": spla.lsmr}[method]
        ours = {"lsqr": lsqr, "lsmr": lsmr}[method]
        ref = theirs(A, b, **limit)
        assert np.asarray(ours(A, b, **limit)[0]).tobytes() == ref[0].tobytes(), name
        itn = ref[2]
        spent = {"scipy": [], "ours": []}
        for _ in range(args.reps if A.nnz < 100_000 else max(3, args.reps // 3)):
            for key, fn in (("scipy", theirs), ("ours", ours)):
                gc.collect()
                t0 = clock()
                fn(A, b, **limit)
                spent[key].append(clock() - t0)
        s, o = (statistics.median(spent[k]) / itn * 1e6 for k in ("scipy", "ours"))
        print(f"| {name} | {A.shape[0]}×{A.shape[1]} | {A.nnz} | {method} | {itn} | {s:.1f} "
              f"| {o:.1f} | {s / o:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
