"""Rank-deficient least squares end to end on the GPU (issue 6): ch7-8-b3 and a family.

For each problem: the GPU factorization without rank detection, then the
rank decision and minimum-norm solve (dense COD on the device), against the
naive solve ``R⁻¹ Qᵀ b`` that the original engine returns (‖x‖ huge), and
``qr(tol='default')``'s rank by Heath's rule on R on the GPU against
SuiteSparseQR's (same column order). Times are wall-clock medians after a
warm-up. Run on the GPU machine:
``python3 bench/rank_gpu.py [--only ch7-8-b3] [--json out.json]``.

``--decisions`` (issue 16 item 3): for grid 40³ least squares and ch7-8-b3,
the public ``lsqr(A, b, backend='gpu')`` (first call on the matrix in a
process warm on another one, then the median of repeats) and the rank
decision's phase (``info['timings']['rank_decision']``, with the device
solves' setup, which the solve reuses, timed apart), with the decisions
through R's solves (:mod:`scipy_gpuqr._factor.solve_rank`) and without them
(``SOLVE_RANK_MIN_ORDER`` raised: the previous rules), interleaved in one
process; ranks, ‖x‖ and the backward errors of both.
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


def _sync():
    import cupy
    cupy.cuda.Device().synchronize()


def _release():
    """Give the memory pool's cached blocks back (the engine sizes its stages from
    the device's free memory, which cached blocks of an earlier call hide)."""
    import gc

    import cupy
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()


def _decision_row(name, A, reps, profile=False):
    """One problem of ``--decisions``: new and previous rules, interleaved."""
    from scipy_gpuqr import QRFactorization, lsqr
    from scipy_gpuqr._factor import lstsq as rules
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    normA = sp.linalg.norm(A)
    default = rules.SOLVE_RANK_MIN_ORDER
    row = {"problem": name, "shape": list(A.shape)}
    for label in ("new", "old", "new", "old"):
        rules.SOLVE_RANK_MIN_ORDER = default if label == "new" else 10 ** 12
        try:
            lsqr_s, phase, setup = [], [], []
            for rep in range(reps):
                _release()
                _sync()
                t0 = time.perf_counter()
                x = lsqr(A, b, backend="gpu")[0]
                _sync()
                lsqr_s.append(time.perf_counter() - t0)
                _release()
                F = QRFactorization(A, backend="gpu")
                t1 = time.perf_counter()
                F._core.device_solves()
                _sync()
                t2 = time.perf_counter()
                F._core.rank_decision()
                _sync()
                setup.append(t2 - t1)
                phase.append(time.perf_counter() - t2)
                if rep + 1 < reps:
                    F.free()
            dec = F.info["rank_decision"]
            r = b - A @ x
            out = {"lsqr_first_s": lsqr_s[0], "lsqr_median_s": float(np.median(lsqr_s[1:] or lsqr_s)),
                   "rank_decision_median_s": float(np.median(phase)),
                   "device_solves_setup_s": float(np.median(setup)),
                   "method": dec["method"], "device": dec.get("device"), "rank": dec["rank"],
                   "sigma_min": dec["sigma_min"], "sigma_max": dec["sigma_max"],
                   "x_norm": float(np.linalg.norm(x)),
                   "backward_error": float(np.linalg.norm(A.T @ r) / (normA * np.linalg.norm(r)))}
            row.setdefault(label, out)
            if label == "new":
                row["_x_new"] = x
            else:
                row["_x_old"] = x
            F.free()
        finally:
            rules.SOLVE_RANK_MIN_ORDER = default
    xn, xo = row.pop("_x_new"), row.pop("_x_old")
    row["x_rel_diff"] = float(np.linalg.norm(xn - xo) / np.linalg.norm(xo))
    if profile:                         # where the new decision's time goes
        import cProfile
        import io
        import pstats
        F = QRFactorization(A, backend="gpu")
        F._core.device_solves()
        prof = cProfile.Profile()
        prof.enable()
        F._core.rank_decision()
        _sync()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(18)
        print(out.getvalue()[-3500:], flush=True)
        F.free()
    return row


def trsolve_thresholds(A, thresholds=(512, 256, 128, 64), reps=5):
    """Device triangular solves of A's R (front by front) with 1 and 8 columns, for
    several ``BIG_FRONT_ROWS`` (fronts with that many rows of R or more go through
    cuBLAS instead of the level kernel): median ms per solve, results compared."""
    import cupy
    from scipy_gpuqr import QRFactorization
    from scipy_gpuqr._engine.gpu import trsolve
    from scipy_gpuqr._engine.gpu.solve import device_solve_of
    F = QRFactorization(A, backend="gpu")
    num = F._core.num
    q = min(num.R.shape)
    default = trsolve.BIG_FRONT_ROWS
    ref = {}
    out = []
    try:
        for t in thresholds:
            trsolve.BIG_FRONT_ROWS = t
            ds = device_solve_of(num)
            for k in (1, 8):
                C = cupy.asarray(np.random.default_rng(k).standard_normal((q, k)))
                for name, f in (("upper", ds.upper), ("upper_T", ds.upper_transposed)):
                    f(C)
                    ts = []
                    for _ in range(reps):
                        _sync()
                        t0 = time.perf_counter()
                        Y = f(C)
                        _sync()
                        ts.append(time.perf_counter() - t0)
                    key = (name, k)
                    ref.setdefault(key, Y)
                    diff = float(cupy.linalg.norm(Y - ref[key]) / cupy.linalg.norm(ref[key]))
                    out.append({"big_front_rows": t, "solve": name, "columns": k,
                                "ms": 1e3 * float(np.median(ts)), "rel_diff": diff})
                    print(json.dumps(out[-1]), flush=True)
    finally:
        trsolve.BIG_FRONT_ROWS = default
        F.free()
    return out


def decisions(only, reps, profile=False):
    from scipy_gpuqr import lsqr
    from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares
    warm = grid3d_least_squares(16)
    lsqr(warm, np.ones(warm.shape[0]), backend="gpu")    # the process warm on another matrix
    probs = {"grid40": lambda: grid3d_least_squares(40),
             "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3)}
    rows = []
    if "trsolve" in only:
        trsolve_thresholds(grid3d_least_squares(40))
        _release()
        only = [o for o in only if o != "trsolve"] or list(probs)
    for name, make in probs.items():
        if only and name not in only:
            continue
        rows.append(_decision_row(name, make(), reps, profile))
        print(json.dumps(rows[-1], default=float), flush=True)
    print("| problem | rules | lsqr first s | lsqr median s | rank decision s | solves setup s |"
          " method/device | rank | ‖x‖ | backward err |")
    for r in rows:
        for label in ("old", "new"):
            d = r[label]
            print(f"| {r['problem']} | {label} | {d['lsqr_first_s']:.3f} | {d['lsqr_median_s']:.3f} | "
                  f"{d['rank_decision_median_s']:.3f} | {d['device_solves_setup_s']:.3f} | "
                  f"{d['method']}/{d['device']} | {d['rank']} | {d['x_norm']:.6g} | "
                  f"{d['backward_error']:.1e} |")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--decisions", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-spqr", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    if a.decisions:
        rows = decisions(only, a.reps, a.profile)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(rows, fh, indent=1, default=float)
        return
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
