"""Record LSQR/LSMR convergence histories for the tests of ``auto``'s iterate-first rule.

Writes ``tests/data/lsqr_histories.npz``: for each problem (a shared matrix or
a generated one, b random with a fixed seed per problem) and method, the
per-iteration values the rule sees (``test1``, ``test2``, ``rtol``,
``conda``, float32) and ``(m, n, nnz, istop, itn)``: the shape and SciPy's
final ``istop``/``itn`` under its default arguments. The seconds per
iteration and of the QR's answer (``backend='cpu'``) are printed, not stored
(they depend on the machine and its load). Histories are cut at
:data:`MAX_RECORDED` iterations (the rule must decide long before).

    python3 bench/lsqr_histories.py            # all problems (a few minutes)
    python3 bench/lsqr_histories.py --only nnc1374

The tests (``tests/test_dropin_rule.py``) replay the histories through
:class:`scipy_gpuqr._dispatch.iterate_first.Allowance` with a cost model for
the iterations and the QR and check that converging runs are kept and
stalling ones stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import scipy_gpuqr  # noqa: E402
from scipy_gpuqr._iterative import lsmr as our_lsmr  # noqa: E402
from scipy_gpuqr._iterative import lsqr as our_lsqr  # noqa: E402
from scipy_gpuqr._testing_matrices import grid3d_least_squares  # noqa: E402
from scipy_gpuqr.io import mmread  # noqa: E402

OUT = ROOT / "tests" / "data" / "lsqr_histories.npz"
MATRICES = ROOT / "tests" / "data" / "matrices"
MAX_RECORDED = 3000
#: problems whose QR takes minutes on 2 cores (bayer10: the dense rank decision
#: of a 13436-column R): their QR is not timed
NO_QR_TIMING = {"bayer10"}

#: (problem, method): converging runs the QR answered on the H200 or on 2 cores
#: (ill-conditioned or rank deficient: the QR's rank decision is slow), runs
#: that SciPy stops at iter_lim, and fast converging ones.
PROBLEMS = [
    ("grid16", "lsqr"), ("grid16", "lsmr"), ("Groebner_id2003_aug", "lsqr"),
    ("reorientation_1", "lsqr"), ("nnc1374", "lsqr"), ("bayer10", "lsqr"),
    ("adder_dcop_05", "lsqr"), ("dwt_878", "lsqr"), ("west0479", "lsqr"),
    ("west0497", "lsqr"), ("tumorAntiAngiogenesis_2", "lsqr"), ("hangGlider_2", "lsqr"),
    ("494_bus", "lsqr"), ("olm500", "lsqr"), ("rajat19", "lsqr"), ("rajat01", "lsqr"),
    ("bp_1200", "lsqr"), ("lp_e226", "lsqr"), ("lp_e226", "lsmr"),
    ("lp_share1b", "lsqr"), ("lp_share1b", "lsmr"),
]


def matrix(name: str) -> sp.csc_array:
    if name == "grid16":
        return sp.csc_array(grid3d_least_squares(16), dtype=np.float64)
    return sp.csc_array(mmread(str(MATRICES / f"{name}.mtx")), dtype=np.float64)


def record(name: str, method: str) -> dict:
    A = matrix(name)
    m, n = A.shape
    b = np.random.default_rng(sum(map(ord, name))).standard_normal(m)
    rows = []

    def callback(state):
        if len(rows) < MAX_RECORDED:
            rows.append((state.test1, state.test2, state.rtol, state.conda))
        return False
    solver = our_lsqr if method == "lsqr" else our_lsmr
    res = solver(A, b, callback=callback)
    t0 = time.perf_counter()
    plain = solver(A, b)
    per_iteration = (time.perf_counter() - t0) / max(plain.itn, 1)
    qr = [float("nan")]
    if name not in NO_QR_TIMING:
        t0 = time.perf_counter()
        getattr(scipy_gpuqr, method)(A, b, backend="cpu")
        qr = [time.perf_counter() - t0]
    return {"name": name, "method": method, "m": m, "n": n, "nnz": int(A.nnz),
            "istop": int(res.istop), "itn": int(res.itn), "iter_s": per_iteration,
            "qr_s": min(qr), "history": np.array(rows, dtype=np.float32)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    arrays = {}
    if Path(args.out).exists():
        with np.load(args.out) as old:
            arrays = {k: old[k] for k in old.files}
    for name, method in PROBLEMS:
        if only and name not in only:
            continue
        r = record(name, method)
        key = f"{name}.{method}"
        arrays[key] = r["history"]
        arrays[key + ".meta"] = np.array([r["m"], r["n"], r["nnz"], r["istop"], r["itn"]],
                                         dtype=np.int64)
        print(f"{key}: {r['m']}x{r['n']} nnz {r['nnz']} istop {r['istop']} itn {r['itn']}; "
              f"{r['iter_s'] * 1e6:.1f} us/it, QR {r['qr_s']:.4f} s (this machine, "
              f"not stored); final conda {r['history'][-1, 3]:.3g}", flush=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
