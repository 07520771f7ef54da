"""Sparse QR on the GPU engine vs SuiteSparseQR on the host's CPU cores.

Run on the GPU machine::

    source .dev/remote-setup.sh
    python3 bench/sparse_qr.py --json $OUT/sparse_qr.json [--spqr ch7-8-b3,grid40] [--only NAME,...]

Per matrix: analysis time; the first factorization of the analysis (cold:
schedule records and R's layout built on the CPU while the GPU runs);
then warm factorizations (kernels compiled, schedule and R layout cached,
as ``refactor`` gets them), medians: end to end (``gpu_factorize`` wall
time until R is a host ``scipy.sparse.csc_array``), the device part
(uploads, every launch, the finite check, R's values gathered in CSC order
on the GPU and copied back), kernel time from CUDA events, the host tail
(R's csc_array), the call's start to its first launch; TF/s from the
analysis flop count, launches, tasks; then a
profiled run (an event pair around every launch) that splits the GPU time
into launches by size and estimates bytes moved per task type.
SuiteSparseQR (COLAMD, no rank detection, OpenBLAS threads = cores) runs
once on the matrices named by ``--spqr`` (``--spqr-only``: only that).

``--dense-flops 'off,1e11,1e10,rule'`` repeats the GPU part per dense-front
threshold (``off``: every front through the uberkernel; ``rule``: the time
model's choice, ``dense.DENSE_RULE``; ``shadow``: the choice of the model
whose dense fronts hide in the launches' shadow, :data:`SHADOW_MODEL`;
``default``: the engines' default; see ``scipy_gpuqr._schedule.dense``) in
the same run, one row each, with the model's predicted time for that row's
dense fronts (``model_seconds``: kernels and R's wait; ``model_kernel_seconds``);
``--panels 64,128,256`` adds warm runs per dense panel width at the first
threshold that has dense fronts. ``--panel-method kernel,geqrf`` repeats each
threshold's row per way of factorizing the dense fronts' panels
(``scipy_gpuqr._engine.dense_front.PANEL_METHODS``; default: the default one;
``kernel:noahead`` without the look-ahead stream, ``kernel:ahead`` with it).
``--apply scalar,mma-async-lean`` repeats each row per Apply variant of the uberkernel
(``factorize_kernels.APPLY_VARIANTS``, through ``SCIPY_GPUQR_APPLY``; each
variant's kernels compiled before its timings). ``--apply-split 1,4,8:2``
repeats each row per cut of the Apply records (and of the Apply+Factorize
records' Apply after their factorized tile) of small launches
(``max[:fill]`` through ``SCIPY_GPUQR_APPLY_SPLIT``, see
``device.apply_split_setting``; 1: never cut). The profiled run's launches are
summed by size (records against the device's resident blocks) and by pieces.
``--once`` only factorizes each matrix once
(first threshold; for a profiler wrapped around the script, e.g.
``ncu -k regex:uberkernel --launch-skip 600 --launch-count 3 python3
bench/sparse_qr.py --once --only ch7-8-b3 --dense-flops off``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed


def _matrices(only, shared_dir):
    import scipy.sparse as sp

    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               qap_linearization, random_least_squares)
    gens = {
        "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
        "lp_nug20T": lambda: sp.csc_array(qap_linearization(20).T),
        "grid40": lambda: grid3d_least_squares(40),
        "grid48": lambda: grid3d_least_squares(48),
        "grid24": lambda: grid3d_least_squares(24),
        "randls-20k": lambda: random_least_squares(20000, 4000, density=0.0012, dense_rows=40,
                                                   seed=1),
    }
    names = list(gens)
    if shared_dir:
        for fname in ("Franz6_id1959_aug.mtx", "Groebner_id2003_aug.mtx", "bayer10.mtx"):
            if (Path(shared_dir) / fname).exists():
                names.append(fname)
    for name in names:
        if only and name not in only:
            continue
        if name in gens:
            yield name, gens[name]
        else:
            def load(f=Path(shared_dir) / name):
                import scipy.sparse as sp

                from scipy_gpuqr.io import mmread
                return sp.csc_array(mmread(str(f))).astype(np.float64)
            yield name, load


def _bytes_estimate(sched, tile=32, itemsize=8):
    """Bytes each task type reads and writes in global memory (tile granularity)."""
    from scipy_gpuqr._schedule.tasks import TaskType
    tt = tile * tile
    out = {}
    for st in sched.stages:
        t = st.tasks
        typ = t["type"]
        cols = np.maximum(t["c1"].astype(np.int64) - t["c0"], 0)
        for name, sel, b in (
                ("factorize", typ == TaskType.FACTORIZE,
                 2 * t["nfrows"].astype(np.int64) * tt + tt),
                ("apply", typ == TaskType.APPLY,
                 t["napply"].astype(np.int64) * (tt + 2 * tile * cols) + tt),
                ("apply_factorize", typ == TaskType.APPLY_FACTORIZE,
                 t["napply"].astype(np.int64) * (tt + 2 * tile * cols) + 2 * tt
                 + 2 * t["nfrows"].astype(np.int64) * tt),
                ("s_assemble", typ == TaskType.S_ASSEMBLE,
                 (t["vt2"] - t["vt"]) * 3),
                ("pack", typ == TaskType.PACK_ASSEMBLE,
                 (t["rows"][:, 1].astype(np.int64) - t["rows"][:, 0]) * cols * 3)):
            out[name] = out.get(name, 0) + int(np.sum(b[sel])) * itemsize
    return out


def _profile(A, an, dense_flops=None, cpl=None):
    """Per-launch kernel times: where the GPU time goes."""
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.gpu.device import CupyDevice
    dev = CupyDevice(32, 3, profile=True)
    kw = {} if cpl is None else {"dense_columns_per_launch": cpl}
    g = gpu_factorize(A, an, device=dev, dense_flops=dense_flops, **kw)
    lt = dev.launch_times()
    dts = dev.dense_times()
    tasks = np.array([x[2] for x in lt])
    secs = np.array([x[3] for x in lt])
    split = np.array([x[4] if len(x) > 4 else 1 for x in lt])
    import cupy as cp
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    small = tasks < sms
    slots = int(getattr(dev, "slots", 3 * sms))
    by_size = {}
    for lo, hi in ((0, sms), (sms, slots), (slots, 3 * slots), (3 * slots, 1 << 40)):
        sel = (tasks >= lo) & (tasks < hi)
        by_size[f"{lo}-{hi if hi < 1 << 40 else 'inf'}"] = {
            "launches": int(sel.sum()), "seconds": float(secs[sel].sum()),
            "median_us": float(np.median(secs[sel]) * 1e6) if sel.any() else 0.0,
            "tasks": int(tasks[sel].sum())}
    by_split = {int(k): {"launches": int((split == k).sum()),
                         "seconds": float(secs[split == k].sum())}
                for k in np.unique(split)}
    out = {"launches": len(lt), "sum_launch_seconds": float(secs.sum()),
           "wall_kernels_seconds": float(g.info["seconds"]["gpu_kernels"]),
           "launches_below_sms": int(small.sum()),
           "seconds_in_launches_below_sms": float(secs[small].sum()),
           "top10_launch_seconds": sorted(secs.tolist())[-10:],
           "median_launch_us": float(np.median(secs) * 1e6) if len(secs) else 0.0,
           "slots": slots, "by_size": by_size, "by_split": by_split,
           "bytes_estimate": _bytes_estimate(g.schedule),
           "dense_seconds": float(sum(t for _, _, t in dts)),
           "dense_fronts": [(m, n, t) for m, n, t in sorted(dts, key=lambda x: -x[2])[:6]],
           "dense_all": [(m, n, t) for m, n, t in dts]}
    g.free()
    return out


def run_spqr(name, A, row):
    from threadpoolctl import threadpool_info, threadpool_limits

    from scipy_gpuqr._cpu.spqr import spqr_factorize
    ncpu = os.cpu_count()
    with threadpool_limits(ncpu, user_api="blas"):
        t = time.perf_counter()
        sq = spqr_factorize(A, ordering="colamd", tol=None)
        row["spqr_seconds"] = time.perf_counter() - t
    row["spqr_threads"] = [d.get("num_threads") for d in threadpool_info()
                           if d.get("user_api") == "blas"]
    row["spqr_flops"] = float(getattr(sq, "flops", float("nan")))
    return row


def _shadow_model():
    """The dense-front model whose dense fronts hide in the launches' shadow (only
    their paths and their sum bound the time), with its fitted contention and
    tolerance: the rule's first version, for comparisons in one run."""
    from scipy_gpuqr._schedule.dense import DenseModel
    return DenseModel(dense_contention=1.28, launch_share=0.0, r_copy_rate=float("inf"),
                      tolerance=0.05)


#: ``dense_flops`` of the ``shadow`` rows: negative (the engines ask the rule) and
#: not :data:`~scipy_gpuqr._schedule.dense.DENSE_RULE`, so that no schedule cached
#: for the default rule is taken for it.
SHADOW_FLOPS = -2.0


def _dense_arg(x):
    """'off' | 'rule' | 'shadow' | threshold, each optionally ':columns-per-launch'
    -> (threshold, cpl or None)."""
    from scipy_gpuqr._schedule.dense import DENSE_RULE
    thr, _, cpl = x.partition(":")
    if thr in ("rule", "shadow"):
        return (DENSE_RULE if thr == "rule" else SHADOW_FLOPS), (int(cpl) if cpl else None)
    return (None if thr in ("off", "none", "") else float(thr)), (int(cpl) if cpl else None)


@contextlib.contextmanager
def _rule_model(thr):
    """For the ``shadow`` rows, the engines' rule answers with the shadow model."""
    from scipy_gpuqr._schedule import dense
    if thr != SHADOW_FLOPS:
        yield None
        return
    model = _shadow_model()
    orig = dense.dense_rule_mask
    dense.dense_rule_mask = lambda an, m=None: orig(an, model if m is None else m)
    try:
        yield model
    finally:
        dense.dense_rule_mask = orig


def _apply_env(apply):
    """Set ``SCIPY_GPUQR_APPLY`` to ``apply`` (None: unset); returns the old value."""
    from scipy_gpuqr._engine.gpu.factorize_kernels import ENV_APPLY
    old = os.environ.pop(ENV_APPLY, None)
    if apply:
        os.environ[ENV_APPLY] = apply
    return old


@contextlib.contextmanager
def _split_env(split):
    """``SCIPY_GPUQR_APPLY_SPLIT`` set to ``split`` (None: left as it is)."""
    from scipy_gpuqr._engine.gpu.device import ENV_APPLY_SPLIT
    if split is None:
        yield
        return
    old = os.environ.get(ENV_APPLY_SPLIT)
    os.environ[ENV_APPLY_SPLIT] = split
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_APPLY_SPLIT, None)
        else:
            os.environ[ENV_APPLY_SPLIT] = old


def run_one(name, make, spqr_names, reps, spqr_only=False, dense=("default",), panels=(),
            methods=(None,), applies=(None,), splits=(None,)):
    """One matrix: analysis, then per dense threshold a row (see the module notes)."""
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    from scipy_gpuqr._symbolic import analyze
    row = {"matrix": name}
    t0 = time.perf_counter()
    A = make()
    row["shape"] = list(A.shape)
    row["nnz"] = int(A.nnz)
    if spqr_only:
        return run_spqr(name, A, row)
    t1 = time.perf_counter()
    an = analyze(A)
    row["analysis_seconds"] = time.perf_counter() - t1
    row["make_seconds"] = t1 - t0
    row["flops"] = float(an.flops)
    row["nfronts"] = int(an.fronts.nfronts)
    # compile the kernels outside the timings (a tiny problem, per Apply variant)
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    for ap in applies:
        old = _apply_env(ap)
        try:
            gpu_factorize(grid3d_least_squares(3), dense_flops=1.0).free()
        finally:
            _apply_env(old)
    rows = []
    from scipy_gpuqr._engine import dense_front
    default_method = dense_front.DEFAULT_PANEL_METHOD
    default_ahead = dense_front.DEFAULT_LOOKAHEAD
    for d in dense:
        thr, cpl = (DEFAULT_DENSE_FLOPS, None) if d == "default" else _dense_arg(d)
        for method, ap, sp in itertools.product(methods, applies, splits):
            name_m, _, opt = (method or default_method).partition(":")
            r = dict(row, dense_flops=thr, dense_cpl=cpl,
                     panel_method=method or default_method, apply=ap or "default",
                     apply_split=sp or "default")
            dense_front.DEFAULT_PANEL_METHOD = name_m
            dense_front.DEFAULT_LOOKAHEAD = (default_ahead or opt == "ahead") and opt != "noahead"
            old = _apply_env(ap)
            try:
                with _rule_model(thr), _split_env(sp):
                    _gpu_runs(A, an, r, reps, thr, cpl)
            finally:
                dense_front.DEFAULT_PANEL_METHOD = default_method
                dense_front.DEFAULT_LOOKAHEAD = default_ahead
                _apply_env(old)
            rows.append(r)
    if panels:
        thr = next((r["dense_flops"] for r in rows if r.get("dense_fronts")), None)
        if thr is not None:
            rows[0]["panels"] = _panel_runs(A, an, thr, panels, reps)
    if name in spqr_names:
        run_spqr(name, A, rows[0])
        for r in rows:
            r["speedup_vs_spqr"] = rows[0]["spqr_seconds"] / r["seconds"]["wall"]
    return rows


def _panel_runs(A, an, thr, panels, reps):
    """Warm kernel time per dense panel width (same schedule, default overlap)."""
    import cupy as cp

    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._engine.gpu.device import CupyDevice
    out = {}
    for nb in panels:
        ks = []
        for _ in range(reps):
            dev = CupyDevice(32, 3)
            dev.dense_panel = int(nb)
            cp.cuda.Device().synchronize()
            g = gpu_factorize(A, an, device=dev, dense_flops=thr)
            ks.append(float(g.info["seconds"]["gpu_kernels"]))
            g.free()
        out[int(nb)] = float(np.median(ks))
    return out


def _gpu_runs(A, an, row, reps, thr, cpl=None):
    import functools

    import cupy as cp

    from scipy_gpuqr._engine.gpu import driver as gpu
    gpu_factorize = gpu.gpu_factorize if cpl is None else functools.partial(
        gpu.gpu_factorize, dense_columns_per_launch=cpl)
    from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache
    # first factorization of this analysis: cold schedule and R layout (the layout
    # does not depend on the threshold: forgotten so that every row's first call is cold)
    clear_r_layout_cache(an)
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    g = gpu_factorize(A, an, dense_flops=thr)
    row["first_call_wall"] = time.perf_counter() - t
    row["first_call_seconds"] = {k: float(v) for k, v in g.info["seconds"].items()}
    g.free()
    del g       # R (pinned values) released before the warm runs allocate theirs
    runs = []
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        g = gpu_factorize(A, an, dense_flops=thr)
        wall = time.perf_counter() - t
        s = g.info["seconds"]
        runs.append({"wall": wall, **{k: float(v) for k, v in s.items()}})
        info = g.info
        g.free()
        del g
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    row["seconds"] = med
    row["walls"] = [r["wall"] for r in runs]        # every warm call's end to end
    row["launches"] = info["launches"]
    row["tasks"] = info["tasks"]
    row["stages"] = info["stages"]
    row["device"] = info["device"]
    row["dense_fronts"] = info.get("dense_fronts", 0)
    from scipy_gpuqr._schedule.dense import dense_front_mask, rule_prediction
    pred = rule_prediction(an, dense_front_mask(an, thr))
    row["model_seconds"] = pred["seconds"]
    row["model_kernel_seconds"] = pred["kernel_seconds"]
    row["model_terms"] = {k: pred[k] for k in ("launch_seconds", "dense_sum_seconds",
                                               "r_copy_seconds")}
    row["model_dense_seconds"] = pred["dense_seconds"]
    row["tflops_end_to_end"] = an.flops / med["wall"] / 1e12
    row["tflops_factorize"] = an.flops / med["factorize"] / 1e12
    row["tflops_kernels"] = an.flops / med["gpu_kernels"] / 1e12
    row["profile"] = _profile(A, an, thr, cpl)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--only", default="")
    p.add_argument("--spqr", default="ch7-8-b3,grid40")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--spqr-only", action="store_true")
    p.add_argument("--dense-flops", default="default",
                   help="comma list of dense-front thresholds ('off': none; 'default')")
    p.add_argument("--panels", default="", help="comma list of dense panel widths")
    p.add_argument("--panel-method", default="",
                   help="comma list of dense panel methods (kernel, geqrf; default: default)")
    p.add_argument("--apply", default="",
                   help="comma list of uberkernel Apply variants (scalar, mma-async-lean)")
    p.add_argument("--apply-split", default="",
                   help="comma list of Apply cuts 'max[:fill]' (1: none; see the notes)")
    p.add_argument("--once", action="store_true",
                   help="one factorization per matrix, nothing timed (for profilers)")
    args = p.parse_args(argv)
    dense = [x for x in args.dense_flops.split(",") if x]
    panels = [int(x) for x in args.panels.split(",") if x]
    methods = tuple(x for x in args.panel_method.split(",") if x) or (None,)
    applies = tuple(x for x in args.apply.split(",") if x) or (None,)
    splits = tuple(x for x in args.apply_split.split(",") if x) or (None,)
    only = {x for x in args.only.split(",") if x}
    spqr = {x for x in args.spqr.split(",") if x}
    rows = []
    if args.once:
        from scipy_gpuqr._engine.gpu.driver import gpu_factorize
        from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
        thr = DEFAULT_DENSE_FLOPS if dense[0] == "default" else _dense_arg(dense[0])[0]
        for name, make in _matrices(only, os.environ.get("SHARED_MATRICES")):
            with _rule_model(thr):
                g = gpu_factorize(make(), dense_flops=thr)
            print(name, g.info["launches"], "launches", g.info["seconds"]["gpu_kernels"], "s")
            g.free()
        return 0
    for name, make in _matrices(only, os.environ.get("SHARED_MATRICES")):
        try:
            got = run_one(name, make, spqr, args.reps, args.spqr_only, dense, panels, methods,
                          applies, splits)
        except Exception as exc:  # noqa: BLE001 - report and go on
            import traceback
            traceback.print_exc()
            got = {"matrix": name, "error": repr(exc)}
        got = got if isinstance(got, list) else [got]
        rows.extend(got)
        for row in got:
            print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
    print(f"\n{'matrix':14s} {'dense':>8s} {'nd':>3s} {'TFlop':>6s} {'anal':>5s} {'1st':>6s} "
          f"{'e2e':>6s} {'device':>6s} {'kern':>6s} {'dns s':>6s} {'R tail':>6s} {'TF/s':>5s} "
          f"{'TF/s k':>6s} {'launch':>6s} {'spqr':>6s} {'x':>5s} {'model':>6s} {'mod k':>6s}")
    for r in rows:
        if "error" in r:
            print(f"{r['matrix']:14s} ERROR {r['error']}")
            continue
        if "seconds" not in r:
            print(f"{r['matrix']:14s} spqr {r.get('spqr_seconds', float('nan')):.2f} s")
            continue
        s = r["seconds"]
        thr = r.get("dense_flops")
        tag = "off" if thr is None else (
            "shadow" if thr == SHADOW_FLOPS else "rule" if thr < 0 else f"{thr:.0e}")
        if r.get("dense_cpl") is not None:
            tag = f"{thr:.0e}:{r['dense_cpl']}"
        if r.get("dense_fronts"):
            pm = r.get("panel_method", "?")
            tag = f"{tag}/{pm[0]}{'-' if 'noahead' in pm else ''}"
        if r.get("apply", "default") != "default":
            tag = f"{tag}/{r['apply'].replace('mma-async', 'mma')[:8]}"
        if r.get("apply_split", "default") != "default":
            tag = f"{tag}/s{r['apply_split']}"
        print(f"{r['matrix'][:14]:14s} {tag:>8s} "
              f"{r.get('dense_fronts', 0):3d} "
              f"{r['flops'] / 1e12:6.3f} {r['analysis_seconds']:5.2f} "
              f"{r['first_call_wall']:6.3f} {s['wall']:6.3f} {s['factorize']:6.3f} "
              f"{s['gpu_kernels']:6.3f} {r['profile'].get('dense_seconds', 0.0):6.3f} "
              f"{s['assemble_R']:6.3f} {r['tflops_end_to_end']:5.2f} "
              f"{r['tflops_kernels']:6.2f} {r['launches']:6d} "
              f"{r.get('spqr_seconds', float('nan')):6.2f} "
              f"{r.get('speedup_vs_spqr', float('nan')):5.1f} "
              f"{r.get('model_seconds', float('nan')):6.3f} "
              f"{r.get('model_kernel_seconds', float('nan')):6.3f}")
        ph = {k: s.get(k, 0.0) for k in ("first_launch", "schedule", "upload", "launch_loop",
                                          "wait_gpu", "wait_r_copy", "assemble_R",
                                          "wait_host_side")}
        print("    phases s: " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))
        print("    warm calls, end to end s: " + " ".join(f"{w:.3f}" for w in r.get("walls", ())))
        pr = r["profile"]
        print("    launches by records (of %d resident blocks): " % pr.get("slots", 0)
              + "; ".join(f"[{k}) {v['launches']} launches {v['seconds']:.3f} s "
                          f"med {v['median_us']:.0f} us" for k, v in pr.get("by_size", {}).items())
              + " | by pieces: " + "; ".join(f"{k}: {v['launches']} {v['seconds']:.3f} s"
                                              for k, v in pr.get("by_split", {}).items()))
        big = r["profile"].get("dense_fronts") or []
        if big:
            m, n, t = big[0]
            print(f"    largest dense front {m}x{n}: {t:.4f} s")
        if r.get("panels"):
            print(f"    dense panel width -> warm kernel s: {r['panels']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
