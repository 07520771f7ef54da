#!/usr/bin/env python3
"""Where a first call's time goes: kernel compilation (per module and variant,
sequential against parallel threads) and a new ``QRFactorization`` of a known
pattern against the warm engine (issue 16, items 2 and 4).

    python bench/first_call_diag.py --json out.json [--grid 40]

Each compilation step runs in a fresh process with an empty kernel cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_COMPILE = r"""
import json, sys, time, threading
import cupy
from scipy_gpuqr._kernels import flatten_source, COMPILE_OPTIONS
from scipy_gpuqr._engine.gpu import factorize_kernels as fk, solve_kernels as sk
cupy.zeros(1)
jobs = {
 "uber_all": (fk.UBERKERNEL_FILE, fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE]),
 "uber_double": (fk.UBERKERNEL_FILE, (fk.kernel_name("double", 32, 3, 256),)),
 "applyq_all": (sk.APPLYQ_FILE, sk.KERNEL_VARIANTS[sk.APPLYQ_FILE]),
 "applyq_double": (sk.APPLYQ_FILE, tuple(sk.applyq_name("double", 32, 3, t) for t in (True, False))),
 "rsolve_all": (sk.RSOLVE_FILE, sk.KERNEL_VARIANTS[sk.RSOLVE_FILE]),
 "rsolve_double": (sk.RSOLVE_FILE, tuple(sk.rsolve_name("double", t) for t in (False, True))),
}
def comp(f, names):
    t = time.perf_counter()
    m = cupy.RawModule(code=flatten_source(f), options=COMPILE_OPTIONS, name_expressions=names)
    m.get_function(names[0])
    return time.perf_counter() - t
mode = sys.argv[1]
out = {}
if mode == "each":
    for k in sys.argv[2:]:
        out[k] = comp(*jobs[k])
elif mode == "threads":
    sel = sys.argv[2:]
    t0 = time.perf_counter()
    th = []
    for k in sel:
        def run(k=k):
            with cupy.cuda.Device(0):
                out[k] = comp(*jobs[k])
        th.append(threading.Thread(target=run)); th[-1].start()
    for t in th: t.join()
    out["wall"] = time.perf_counter() - t0
print(json.dumps(out))
"""

_FIRST = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import scipy_gpuqr as sg
from scipy_gpuqr._testing_matrices import random_least_squares
A = random_least_squares(20000, 4000, density=0.0012, dense_rows=40, seed=1)
b = np.asarray(A @ np.ones(A.shape[1]))
t1 = time.perf_counter()
out = {"import_and_matrix": t1 - t0}
for k in range(2):
    t = time.perf_counter()
    x = sg.lsqr(A, b, backend="gpu")[0]
    out[f"lsqr_{k}"] = time.perf_counter() - t
t = time.perf_counter()
F = sg.QRFactorization(A, backend="gpu"); F.solve(b)
out["qrf_solve"] = time.perf_counter() - t
out["timings"] = F.info["timings"]
out["backend_seconds"] = F.info["backend_info"].get("seconds")
print(json.dumps(out))
"""


def _sub(code, args, cache):
    env = dict(os.environ, CUPY_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                       text=True, timeout=400)
    if r.returncode:
        return {"error": r.stderr[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def compile_times() -> dict:
    out = {}
    for k in ("uber_all", "uber_double", "applyq_all", "applyq_double", "rsolve_all",
              "rsolve_double"):
        with tempfile.TemporaryDirectory() as d:
            out.update(_sub(_COMPILE, ["each", k], d))
    with tempfile.TemporaryDirectory() as d:
        out["seq3"] = _sub(_COMPILE, ["each", "uber_double", "applyq_double",
                                      "rsolve_double"], d)
    with tempfile.TemporaryDirectory() as d:
        out["threads3"] = _sub(_COMPILE, ["threads", "uber_double", "applyq_double",
                                          "rsolve_double"], d)
    return out


def first_call() -> dict:
    with tempfile.TemporaryDirectory() as d:
        cold = _sub(_FIRST, [], d)
        warm = _sub(_FIRST, [], d)
    return {"cold_cache": cold, "warm_cache": warm}


def new_object(k: int) -> dict:
    import numpy as np

    import scipy_gpuqr as sg
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    W = grid3d_least_squares(16)
    sg.lsqr(W, np.ones(W.shape[0]), backend="gpu")          # the process is warm
    A = grid3d_least_squares(k)
    A.sort_indices()
    b = np.asarray(A @ np.ones(A.shape[1]))
    from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache
    from scipy_gpuqr._schedule.sparse import clear_schedule_cache
    out = {}
    env0 = os.environ.get("SCIPY_GPUQR_SCHEDULE_CACHE")
    for i in range(5):
        if i >= 3:          # as before the per-pattern caches: nothing kept for A
            clear_schedule_cache()
            clear_r_layout_cache()
            if i == 4:      # nor on disk (i == 3: what a new process finds there)
                os.environ["SCIPY_GPUQR_SCHEDULE_CACHE"] = "off"
        t = time.perf_counter()
        F = sg.QRFactorization(A, backend="gpu")
        tf = time.perf_counter() - t
        t = time.perf_counter()
        F.solve(b)
        out[f"qrf_{i}"] = {"factorize_total": tf, "solve": time.perf_counter() - t,
                           "timings": F.info["timings"],
                           "backend": F.info["backend_info"].get("seconds"),
                           "cold": F.info["backend_info"].get("schedule_cold")}
        F.free()
    if env0 is None:
        os.environ.pop("SCIPY_GPUQR_SCHEDULE_CACHE", None)
    else:
        os.environ["SCIPY_GPUQR_SCHEDULE_CACHE"] = env0
    an = analyze(A)
    for i in range(3):
        t = time.perf_counter()
        q = gpu_factorize(A, an)
        out[f"engine_{i}"] = {"total": time.perf_counter() - t, "seconds": q.info["seconds"],
                              "cold": q.info.get("schedule_cold")}
        q.free()
    for i in range(2):
        t = time.perf_counter()
        sg.lsqr(A, b, backend="gpu")
        out[f"lsqr_{i}"] = time.perf_counter() - t
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--grid", type=int, default=40)
    p.add_argument("--skip-compile", action="store_true")
    a = p.parse_args(argv)
    res = {}
    if not a.skip_compile:
        res["compile"] = compile_times()
        print(json.dumps(res["compile"], indent=1), flush=True)
        res["first_call"] = first_call()
        print(json.dumps(res["first_call"], indent=1), flush=True)
    res["new_object"] = new_object(a.grid)
    print(json.dumps(res["new_object"], indent=1, default=str), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
