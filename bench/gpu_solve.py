"""Qᵀb and the least-squares solve on the GPU vs the host path, same run.

Run on the GPU machine::

    source .dev/remote-setup.sh
    python3 bench/gpu_solve.py --json $OUT/gpu_solve.json [--only grid40,...] [--host-qt]

Per matrix (factorized once by the GPU engine; warm medians of CUDA-event or
synchronized wall times after one warm-up call):

* ``qt_dev_k1`` / ``qt_dev_k32``: ``Qᵀ B`` on the device
  (``kernels/gpuqr_applyq.cu``, one launch per factorization launch that
  kept reflectors), B a CuPy array with 1 / 32 columns; ``plan`` the first
  call's host work (replay plan built and uploaded);
* ``trsv_dev`` / ``trsvT_dev``: ``R⁻¹c`` / ``R⁻ᵀc`` front by front from the
  pools (:mod:`scipy_gpuqr._engine.gpu.trsolve`), one right-hand side;
  ``trsv_host``: SciPy's ``spsolve_triangular`` (the host path's);
  ``Rcsr_upload``: setting the device solve up, once per factorization;
* ``qt_dev_k1_nodense`` (``--split``): Qᵀb of a factorization without dense
  fronts (every reflector in the task lists, so all of it in the kernel);
* ``solve_dev``: ``QRFactorization.solve`` of a CuPy b end to end (Qᵀb,
  triangular solve, permutation; the rank decision made before);
  ``solve_dev_np``: the same from a NumPy b (upload, download);
* ``qt_host`` (with ``--host-qt``): the host replay after fetching the
  fronts (today's path before this change; ``fetch`` the copy of the pools).

Rank-deficient matrices (ch7-8-b3) get only the Qᵀ rows (their solve
takes the host rank rule).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed


def _problems(only):
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               random_least_squares)
    probs = {
        "grid40": lambda: grid3d_least_squares(40),
        "grid30": lambda: grid3d_least_squares(30),
        "randls-20000x3000": lambda: random_least_squares(20000, 3000, density=0.002,
                                                          dense_rows=5, seed=1),
        "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3).astype(np.float64),
    }
    for name, make in probs.items():
        if only and name not in only:
            continue
        yield name, make()


def _median_events(cp, fn, repeats=5):
    fn()
    cp.cuda.get_current_stream().synchronize()
    ts = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append((cp.cuda.get_elapsed_time(a, b) / 1e3, time.perf_counter() - t0))
    ev = float(np.median([t[0] for t in ts]))
    wall = float(np.median([t[1] for t in ts]))
    return ev, wall


def run(name, A, host_qt, split=False):
    import cupy as cp
    import scipy.sparse as sp
    from scipy.sparse.linalg import spsolve_triangular

    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._engine.gpu import solve as gs
    row = {"matrix": name, "shape": list(A.shape), "nnz": int(A.nnz)}
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    F = QRFactorization(A, backend="gpu")
    row["factorize_s"] = time.perf_counter() - t0
    g = F.numeric
    row["backend"] = g.info.get("backend")
    row["dense_fronts"] = g.info.get("dense_fronts", 0)
    row["nnzR"] = int(g.R.nnz)
    m, n = A.shape
    b = cp.asarray(rng.standard_normal(m))
    B32 = cp.asarray(rng.standard_normal((m, 32)))
    t0 = time.perf_counter()
    gs.plan_of(g)
    row["plan_s"] = time.perf_counter() - t0
    plan = gs.plan_of(g)
    row["levels"] = plan.nlevels
    row["records"] = int(len(plan.records))
    t0 = time.perf_counter()
    g.qt_matmul(b)
    cp.cuda.get_current_stream().synchronize()
    row["qt_first_s"] = time.perf_counter() - t0
    row["qt_dev_k1_s"], row["qt_dev_k1_wall_s"] = _median_events(cp, lambda: g.qt_matmul(b))
    row["qt_dev_k32_s"], _ = _median_events(cp, lambda: g.qt_matmul(B32), repeats=3)
    row["q_dev_k1_s"], _ = _median_events(cp, lambda: g.q_matmul(b))
    # orthogonality check on the measured data
    c = g.qt_matmul(b)
    row["orth_err"] = float(cp.linalg.norm(g.q_matmul(c) - b) / cp.linalg.norm(b))
    t0 = time.perf_counter()
    full = F._core.device_least_squares_ok()
    row["rank_decision_s"] = time.perf_counter() - t0
    row["full_rank"] = bool(full)
    row["rank_method"] = F._core.rank_decision().method
    if full:
        t0 = time.perf_counter()
        ds = F._core.device_solves()
        cp.cuda.get_current_stream().synchronize()
        row["Rcsr_upload_s"] = time.perf_counter() - t0
        C = cp.ascontiguousarray(g.qt_matmul(b.reshape(-1, 1))[:ds.q].astype(cp.float64))
        row["trsv_dev_s"], _ = _median_events(cp, lambda: ds.upper(C), repeats=3)
        row["trsvT_dev_s"], _ = _median_events(cp, lambda: ds.upper_transposed(C), repeats=3)
        Rh = sp.csr_array(F._core.rank_decision().R)
        Ch = C.get()
        t0 = time.perf_counter()
        spsolve_triangular(Rh, Ch, lower=False)
        row["trsv_host_s"] = time.perf_counter() - t0
        row["solve_dev_s"], row["solve_dev_wall_s"] = _median_events(cp, lambda: F.solve(b),
                                                                     repeats=3)
        bn = b.get()
        t0 = time.perf_counter()
        x = F.solve(bn)
        row["solve_dev_np_s"] = time.perf_counter() - t0
        r = bn - A @ x
        nA = sp.linalg.norm(A)
        row["ls_backward_error"] = float(np.linalg.norm(A.T @ r) / (nA * np.linalg.norm(r)))
    if host_qt:
        bn = b.get()
        t0 = time.perf_counter()
        g._materialize()
        row["fetch_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        qh = gs.host_matmul(g, bn, trans=True)
        row["qt_host_s"] = time.perf_counter() - t0
        row["qt_dev_vs_host_err"] = float(np.abs(qh - c.get()).max() / np.abs(qh).max())
        if full:
            t0 = time.perf_counter()
            k = F._core.rank_decision().R.shape[0]
            F._core.rank_decision().solve(qh[:k].reshape(-1, 1))
            row["solve_host_after_qt_s"] = time.perf_counter() - t0 + row["qt_host_s"]
    F.free()
    if split:       # Qᵀb with every front in the task lists (no dense fronts)
        from scipy_gpuqr._engine.gpu.driver import gpu_factorize
        g2 = gpu_factorize(A, dense_flops=None)
        gs.plan_of(g2)
        row["records_nodense"] = int(len(gs.plan_of(g2).records))
        row["levels_nodense"] = gs.plan_of(g2).nlevels
        row["qt_dev_k1_nodense_s"], _ = _median_events(cp, lambda: g2.qt_matmul(b))
        row["qt_dev_k32_nodense_s"], _ = _median_events(cp, lambda: g2.qt_matmul(B32),
                                                        repeats=3)
        g2.free()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--only", default="")
    ap.add_argument("--host-qt", action="store_true")
    ap.add_argument("--split", action="store_true",
                    help="also time Qᵀb of a factorization without dense fronts")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    rows = []
    for name, A in _problems(only):
        try:
            row = run(name, A, args.host_qt, args.split)
        except Exception as exc:  # noqa: BLE001 - one failing matrix keeps the table
            import traceback
            traceback.print_exc()
            row = {"matrix": name, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    keys = ["factorize_s", "plan_s", "levels", "qt_dev_k1_s", "qt_dev_k32_s", "q_dev_k1_s",
            "qt_dev_k1_nodense_s", "qt_dev_k32_nodense_s", "trsv_dev_s", "trsvT_dev_s",
            "trsv_host_s", "solve_dev_s", "solve_dev_np_s", "fetch_s",
            "qt_host_s", "solve_host_after_qt_s"]
    print("| matrix | " + " | ".join(keys) + " |")
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append("-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
        print(f"| {r['matrix']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
