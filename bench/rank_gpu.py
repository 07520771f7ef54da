"""Rank-deficient least squares end to end on the GPU (issue 6): ch7-8-b3 and a family.

For each problem: the GPU factorization without rank detection, then the
rank decision and minimum-norm solve (dense COD on the device), against the
naive solve ``R⁻¹ Qᵀ b`` that the original engine returns (‖x‖ huge), and
``qr(tol='default')``'s rank by Heath's rule on R on the GPU against
SuiteSparseQR's (same column order). Times are wall-clock medians after a
warm-up. Run on the GPU machine:
``python3 bench/rank_gpu.py [--only ch7-8-b3] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import scipy.sparse as sp


def _problems(only):
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    out = {"ch6-7-b3": lambda: chessboard_boundary(6, 7, 3),
           "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3)}
    return {k: v for k, v in out.items() if not only or k in only}


def _naive_norm(F, b):
    """‖R⁻¹ Qᵀ b‖ without rank detection (what the original engine returns)."""
    from scipy_gpuqr._factor.lstsq import solve_upper
    num = F.numeric
    n = num.R.shape[1]
    c = np.asarray(num.qt_matmul(b.reshape(-1, 1)))[:n]
    with np.errstate(all="ignore"):
        y = solve_upper(sp.csc_array(num.R)[:n, :n], c)
    return float(np.linalg.norm(y))


def run(name, A, *, spqr_rank: bool):
    from scipy_gpuqr import QRFactorization, qr
    from scipy_gpuqr._dispatch.plan import backend_factorizer
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    QRFactorization(A, backend="gpu").solve(b)          # warm-up (kernels, schedule)
    t0 = time.perf_counter()
    F = QRFactorization(A, backend="gpu")
    t1 = time.perf_counter()
    x = F.solve(b)
    t2 = time.perf_counter()
    r = b - A @ x
    bwd = np.linalg.norm(A.T @ r) / (sp.linalg.norm(A) * np.linalg.norm(r))
    row = {"problem": name, "shape": list(A.shape), "factorize_s": t1 - t0,
           "rank_and_solve_s": t2 - t1, "timings": F.info["timings"],
           "rank_decision": F.info["rank_decision"], "x_norm": float(np.linalg.norm(x)),
           "naive_x_norm": _naive_norm(F, b), "backward_error": float(bwd)}
    t3 = time.perf_counter()
    res = qr(A, mode="r", tol="default", backend="gpu")
    row["qr_tol_default_s"] = time.perf_counter() - t3
    row["qr_rank_gpu"] = int(res.rank)
    if spqr_rank:
        f, _, _ = backend_factorizer("cpu")
        t4 = time.perf_counter()
        ref = f(A, ordering="colamd", colperm=F.numeric.colperm, tol="default")
        row["spqr_rank"] = int(ref.rank)
        row["spqr_tol_s"] = time.perf_counter() - t4
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-spqr", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    rows = []
    for name, make in _problems(only).items():
        rows.append(run(name, make(), spqr_rank=not a.no_spqr))
        print(json.dumps(rows[-1], default=float), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=float)
    print("| problem | factorize s | rank+solve s | method/device | rank | ‖x‖ | naive ‖x‖ |"
          " backward err | qr rank GPU | SPQR rank |")
    for r in rows:
        d = r["rank_decision"]
        print(f"| {r['problem']} | {r['factorize_s']:.2f} | {r['rank_and_solve_s']:.2f} | "
              f"{d['method']}/{d.get('device')} | {d['rank']} | {r['x_norm']:.4g} | "
              f"{r['naive_x_norm']:.3g} | {r['backward_error']:.2e} | {r['qr_rank_gpu']} | "
              f"{r.get('spqr_rank', '-')} |")


if __name__ == "__main__":
    main()
