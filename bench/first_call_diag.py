#!/usr/bin/env python3
"""Where a first call's time goes: kernel compilation (per module and variant,
sequential against parallel threads) and a new ``QRFactorization`` of a known
pattern against the warm engine (issue 16, items 2 and 4).

    python bench/first_call_diag.py --json out.json [--grid 40]
    python bench/first_call_diag.py --compiles [--grid 40] [--json out.json]
    python bench/first_call_diag.py --nvrtc            # no GPU needed
    python bench/first_call_diag.py --handles          # CUDA set-up step by step
    python bench/first_call_diag.py --layout-load ch7-8-b3,grid40 [--procs 3]   # no GPU
    python bench/first_call_diag.py --replay-plan 24,32 [--procs 2] [--reps 5] [--replay-gpu]
    python bench/first_call_diag.py --new-process ch7-8-b3,grid40 [--procs 4] [--cold]
        [--tree DIR]

Each compilation step runs in a fresh process with an empty kernel cache.

``--compiles``: the first ``lsqr(A, b, backend='gpu')`` of a grid in a new
process, twice: with empty caches (kernels and disk store) and again in a new
process with the caches the first left (``--warm-runs``: that many); every
kernel compile or cache load
(CuPy's ``_compile_with_cache_cuda``, NVRTC runs among them) and every
``dlopen`` is recorded with its thread, its start within the call, its
seconds and the package line that caused it. What runs on the main thread
is on the call's path; the prefetch threads' work is not (a profiler such as
cProfile on Python >= 3.12 counts every thread's calls, so its cumulative
times mix the two). The main thread is also sampled every 2 ms: its seconds
per innermost package function (and line, and innermost frame of any module),
first call against second, and the first call's timeline.

``--store``: R's layout file of a grid (no GPU): the main thread's time in
the call that hands the write to the writer thread, the writer's time (CRC-32
and writes), the file's size and the time to map it back with its checks.

``--new-process ch7-8-b3,grid40 [--procs 4]``: a new process's first ``lsqr``
with warm caches against its warm calls (:func:`new_process_gap`), the
package's import apart, with and without the cuBLAS warm-up; ``--cold``: the
first process of each problem with an empty kernel cache (a cold first call);
``--tree DIR``: the package imported from DIR (a baseline in the same run).

``--nvrtc``: NVRTC compile seconds of the modules a float64 call prefetches
(:func:`~scipy_gpuqr._engine.gpu.factorize_kernels.engine_kernels`), one after
the other against on parallel threads, for sm_90, without a GPU.
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

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

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


_SAMPLER = r"""
SAMPLES = []
PERIOD = 0.002

def _pkg(fn):
    return "scipy_gpuqr" in fn and "first_call_diag" not in fn

def sampler(stop):
    main = threading.main_thread().ident
    last = None
    while not stop.is_set():
        fr = sys._current_frames().get(main)
        t0 = T["t0"]
        now = time.perf_counter()
        if fr is not None and t0 is not None:
            inner = f"{fr.f_code.co_filename.split('/')[-1]}:{fr.f_code.co_name}"
            line = func = None
            f = fr
            while f is not None:
                if _pkg(f.f_code.co_filename):
                    name = f.f_code.co_filename.split("scipy_gpuqr/")[-1]
                    line = f"{name}:{f.f_lineno} {f.f_code.co_name}"
                    func = f"{name}:{f.f_code.co_name}"
                    break
                f = f.f_back
            dt = PERIOD if last is None else min(now - last, 0.05)
            SAMPLES.append((round(now - t0, 4), dt, func or "?", line or "?", inner))
            last = now
        else:
            last = None
        stop.wait(PERIOD)

def profile(samples):
    # main-thread seconds by innermost package function, package line and
    # innermost frame, and the timeline of package functions (runs >= 20 ms)
    out = {}
    for key, i in (("by_function", 2), ("by_line", 3), ("by_frame", 4)):
        acc = {}
        for smp in samples:
            acc[smp[i]] = acc.get(smp[i], 0.0) + smp[1]
        out[key] = sorted(([k, round(v, 4)] for k, v in acc.items()), key=lambda r: -r[1])[:40]
    runs = []
    for smp in samples:
        if runs and runs[-1][2] == smp[2]:
            runs[-1][1] = round(runs[-1][1] + smp[1], 4)
        else:
            runs.append([smp[0], smp[1], smp[2]])
    out["timeline"] = [r for r in runs if r[1] >= 0.02]
    return out

"""

_HOOKS = r"""
events = []
lock = threading.Lock()

def where():
    for fr in reversed(traceback.extract_stack()[:-3]):
        if "scipy_gpuqr" in fr.filename and "first_call_diag" not in fr.filename:
            return f"{fr.filename.split('scipy_gpuqr/')[-1]}:{fr.lineno} {fr.name}"
    return "?"

def rec(kind, name, t):
    d = time.perf_counter() - t
    if T["t0"] is None:
        return
    th = threading.current_thread()
    with lock:
        events.append({"kind": kind, "name": name, "thread": th.name,
                       "main": th is threading.main_thread(),
                       "start": round(t - T["t0"], 4), "seconds": round(d, 4),
                       "where": where()})

_dl = _ctypes.dlopen
def dlopen(name, *a):
    t = time.perf_counter()
    try:
        return _dl(name, *a)
    finally:
        rec("dlopen", str(name), t)
_ctypes.dlopen = dlopen

_NAME = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)")
def names(src):
    return ",".join(dict.fromkeys(_NAME.findall(src or "")))[:120] or "?"

import numpy as np
import cupy
from cupy.cuda import compiler
_cc = compiler._compile_with_cache_cuda
def cc(source, *a, **k):
    t = time.perf_counter()
    try:
        return _cc(source, *a, **k)
    finally:
        rec("compile_or_load", names(source), t)
compiler._compile_with_cache_cuda = cc
_nv = compiler._compile_using_nvrtc_no_warning
def nv(source, *a, **k):
    t = time.perf_counter()
    try:
        return _nv(source, *a, **k)
    finally:
        rec("nvrtc", names(source), t)
compiler._compile_using_nvrtc_no_warning = nv

"""


_TRACE = r"""
import json, os, re, sys, threading, time, traceback
import _ctypes
T = {"t0": None}
""" + _SAMPLER + r"""
""" + _HOOKS + r"""
import scipy_gpuqr as sg
from scipy_gpuqr._testing_matrices import grid3d_least_squares
k = int(sys.argv[1])
A = grid3d_least_squares(k)
b = np.asarray(A @ np.ones(A.shape[1]))
from scipy_gpuqr._gpu import gpu_info
out = {"grid": k, "gpu": gpu_info().get("available"), "calls": []}
stop = threading.Event()
threading.Thread(target=sampler, args=(stop,), name="diag-sampler", daemon=True).start()
for i in range(2):
    events.clear()
    SAMPLES.clear()
    T["t0"] = time.perf_counter()
    x = sg.lsqr(A, b, backend="gpu")[0]
    wall = time.perf_counter() - T["t0"]
    T["t0"] = None
    prof = profile(list(SAMPLES))
    time.sleep(0.5)                      # let the prefetch threads report
    with lock:
        ev = sorted(events, key=lambda e: e["start"])
    def tot(kind, main):
        return round(sum(e["seconds"] for e in ev if e["kind"] == kind and e["main"] == main), 3)
    out["calls"].append({
        "wall": round(wall, 3),
        "relative_residual": float(np.linalg.norm(A.T @ (A @ x - b)) / np.linalg.norm(A.T @ b)),
        "main_compile_or_load_s": tot("compile_or_load", True),
        "main_nvrtc_s": tot("nvrtc", True), "main_dlopen_s": tot("dlopen", True),
        "worker_compile_or_load_s": tot("compile_or_load", False),
        "worker_nvrtc_s": tot("nvrtc", False), "worker_dlopen_s": tot("dlopen", False),
        "events": ev, "main_profile": prof})
stop.set()
print(json.dumps(out))
"""


_NEWPROC = r"""
import json, re, sys, threading, time, traceback
import _ctypes
T = {"t0": None}
""" + _SAMPLER + r"""
t0 = time.perf_counter()
import numpy as np
import scipy.sparse as sp
user_imports = time.perf_counter() - t0
t = time.perf_counter()
""" + _HOOKS + r"""
cupy_import = time.perf_counter() - t
spec, warmup_on, backend = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares
A = chessboard_boundary(7, 8, 3) if spec == "ch7-8-b3" else grid3d_least_squares(int(spec[4:]))
A = sp.csc_array(A)
A.sort_indices()
b = np.asarray(A @ (1.0 + 0.5 * np.sin(np.arange(A.shape[1])))) + 1e-3 * np.cos(np.arange(A.shape[0]))
pre = set(sys.modules)
t = time.perf_counter()
from scipy_gpuqr import lsqr
out = {"problem": spec, "blas_warmup": warmup_on, "user_imports": user_imports,
       "import_lsqr": time.perf_counter() - t, "import_lsqr_modules": len(set(sys.modules) - pre),
       "cupy_imported_before_call": "cupy" in sys.modules, "calls": [],
       "package": sys.modules["scipy_gpuqr"].__file__}
out["import_cupy"] = cupy_import     # timed apart (with the compile hooks, before the
                                    # package): a user passing CuPy arrays has imported it
if not warmup_on:           # the A/B of blas_warmup (after the import, so both time the same)
    from scipy_gpuqr._engine.gpu import factorize_kernels as fk
    fk.start_blas_warmup = lambda *a: None
stop = threading.Event()
threading.Thread(target=sampler, args=(stop,), name="diag-sampler", daemon=True).start()
for i in range(3):
    SAMPLES.clear()
    with lock:
        events.clear()
    pre = set(sys.modules)
    T["t0"] = time.perf_counter()
    x = lsqr(A, b, backend=backend)[0]
    wall = time.perf_counter() - T["t0"]
    prof = profile(list(SAMPLES))
    time.sleep(0.3)         # worker threads (store writes, prefetches) end between calls
    T["t0"] = None
    with lock:
        ev = sorted(events, key=lambda e: e["start"])
    def tot(kind, main):
        return round(sum(e["seconds"] for e in ev if e["kind"] == kind and e["main"] == main), 4)
    out["calls"].append({
        "wall": wall, "modules_imported": len(set(sys.modules) - pre),
        "relative_residual": float(np.linalg.norm(A.T @ (A @ x - b)) / np.linalg.norm(A.T @ b)),
        "main_compile_or_load_s": tot("compile_or_load", True),
        "main_nvrtc_s": tot("nvrtc", True), "main_dlopen_s": tot("dlopen", True),
        "worker_compile_or_load_s": tot("compile_or_load", False),
        "worker_nvrtc_s": tot("nvrtc", False), "worker_dlopen_s": tot("dlopen", False),
        "main_events": [e for e in ev if e["main"] and e["kind"] != "nvrtc"],
        "main_profile": prof})
stop.set()
print(json.dumps(out))
"""


_HANDLES = r"""
import json, sys, threading, time
T = {}
def lap(k, t):
    T[k] = round(time.perf_counter() - t, 4)
t = time.perf_counter(); import cupy; lap("import_cupy", t)
t = time.perf_counter(); cupy.cuda.runtime.getDeviceCount(); lap("cuInit_device_count", t)
t = time.perf_counter(); cupy.cuda.Device(0).use(); cupy.empty(1); lap("context_and_first_alloc", t)
t = time.perf_counter(); cupy.cuda.runtime.memGetInfo(); lap("memGetInfo", t)
t = time.perf_counter()
from cupy_backends.cuda.libs import cublas, cusolver
lap("import_cublas_cusolver", t)
if sys.argv[1] == "worker":       # a worker thread sets the libraries up first
    def work():
        t = time.perf_counter()
        h = cusolver.create(); cusolver.destroy(h)
        lap("worker_cusolver_create", t)
        t = time.perf_counter()
        h = cublas.create(); cublas.destroy(h)
        lap("worker_cublas_create", t)
    th = threading.Thread(target=work); th.start(); th.join()
t = time.perf_counter(); cupy.cuda.device.get_cublas_handle(); lap("main_cublas_handle", t)
t = time.perf_counter(); cupy.cuda.device.get_cusolver_handle(); lap("main_cusolver_handle", t)
x = cupy.ones((2000, 8))
t = time.perf_counter()
from scipy_gpuqr._engine.gpu import array_ops as ao
cupy.cuda.Device().synchronize(); lap("import_array_ops", t)
t = time.perf_counter(); ao.thin_qr(x); cupy.cuda.Device().synchronize(); lap("first_thin_qr", t)
t = time.perf_counter(); ao.thin_qr(x); cupy.cuda.Device().synchronize(); lap("second_thin_qr", t)
print(json.dumps(T))
"""


def handle_costs(reps: int = 2) -> dict:
    """A new process's CUDA set-up, step by step on the main thread (seconds):
    the driver, the context, the cuBLAS and cuSOLVER libraries' import, the
    thread's cuBLAS and cuSOLVER handles, a first and second ``thin_qr``
    (its kernels from the warm cache); ``worker``: a worker thread creates and
    destroys a handle of each library first (whether that makes the main
    thread's cheaper)."""
    out = {}
    for mode in ("main", "worker"):
        out[mode] = []
        for _ in range(reps):
            r = subprocess.run([sys.executable, "-c", _HANDLES, mode], capture_output=True,
                               text=True, timeout=120)
            out[mode].append(json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                             else {"error": r.stderr[-1500:]})
    return out


def new_process_gap(problems: list, procs: int = 4, store: str | None = None,
                    backend: str = "gpu", *, cold: bool = False,
                    tree: str | None = None, ab: bool = True) -> dict:
    """A new process's first ``lsqr(A, b, backend='gpu')`` with warm caches against
    its warm calls (issue 16 item 4: at most 0.3 s above), per problem.

    Per problem one process fills the caches (the kernel cache of
    ``CUPY_CACHE_DIR`` as given, an empty analysis/plan store), then ``procs``
    new processes find them warm, alternately with and without
    :mod:`~scipy_gpuqr._engine.gpu.blas_warmup` (the A/B of the cuBLAS set-up
    on a worker thread). Each process times the user's imports (NumPy,
    SciPy sparse), ``from scipy_gpuqr import lsqr`` (the package's modules,
    at the user's import line), ``import cupy`` (apart: the call would
    import it otherwise), then three calls; the gap is the first call less
    the faster of the other two. The main thread is sampled every 2 ms
    (the first call against the second, as ``--compiles``). ``backend``
    other than 'gpu': a dry run of the script (no GPU).

    ``cold``: each problem's processes get an empty kernel cache of their own
    (``CUPY_CACHE_DIR``), so its first process is a cold first call (with
    empty caches of every kind). ``tree``: the processes import the package
    from that folder (a ``git archive`` of another commit: the baseline in the
    same run) instead of this checkout. Every compile or kernel-cache load and
    every ``dlopen`` on the main thread is listed per call (with the package
    line that asked for it). ``ab`` False: the warm-up on in every process.
    """
    out = {}
    for spec in problems:
        rows = []
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, SCIPY_GPUQR_SCHEDULE_CACHE=store or f"{d}/store")
            if cold:
                env["CUPY_CACHE_DIR"] = f"{d}/kernels"
            cwd = None
            if tree:
                cwd = str(Path(tree).resolve())
                env["PYTHONPATH"] = cwd + os.pathsep + env.get("PYTHONPATH", "")
            for i in range(procs + 1):
                on = i == 0 or i % 2 == 1 or not ab
                r = subprocess.run([sys.executable, "-c", _NEWPROC, spec, "1" if on else "0",
                                    backend],
                                   env=env, capture_output=True, text=True, timeout=300,
                                   cwd=cwd)
                row = (json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                       else {"error": r.stderr[-3000:]})
                row["label"] = ((("cold caches" if cold else "fills the caches") if i == 0
                                 else f"warm caches {i}"))
                row["tree"] = tree or "."
                rows.append(row)
        out[spec] = rows
    return out


def print_new_process(res: dict) -> None:
    """Per problem: each process's import and calls, the gap; the medians with
    and without the cuBLAS warm-up; the main thread's profile of the first
    warm-cache process with it (call 1 against call 2)."""
    for spec, rows in res.items():
        pkg = next((r.get("package") for r in rows if "package" in r), "?")
        print(f"== new process, {spec}: lsqr(A, b) (package {pkg})")
        print("process | blas warm-up | user imports s | import lsqr s (modules) | import cupy s | "
              "call 1 | call 2 | call 3 | gap s | rel. residual")
        gaps = {True: [], False: []}
        for r in rows:
            if "error" in r:
                print(f"{r['label']}: error\n{r['error']}")
                continue
            w = [c["wall"] for c in r["calls"]]
            gap = w[0] - min(w[1:])
            if r["label"].startswith("warm"):
                gaps[r["blas_warmup"]].append(gap)
            print(f"{r['label']} | {'on' if r['blas_warmup'] else 'off'} | "
                  f"{r['user_imports']:.2f} | {r['import_lsqr']:.2f} ({r['import_lsqr_modules']}) | "
                  f"{r['import_cupy']:.2f} | {w[0]:.3f} | {w[1]:.3f} | {w[2]:.3f} | {gap:+.3f} | "
                  f"{r['calls'][0]['relative_residual']:.1e}")
        for on in (True, False):
            if gaps[on]:
                g = sorted(gaps[on])
                print(f"  gap with the warm-up {'on' if on else 'off'}: median "
                      f"{g[len(g) // 2]:+.3f} s over {len(g)} processes ({', '.join(f'{x:+.3f}' for x in g)})")
        for r in rows:
            if "error" in r or "main_events" not in r["calls"][0]:
                continue
            c = r["calls"][0]
            print(f"-- {r['label']}, call 1: main thread compile/load {c['main_compile_or_load_s']:.3f} s, "
                  f"dlopen {c['main_dlopen_s']:.3f} s; workers: compile/load "
                  f"{c['worker_compile_or_load_s']:.3f} s, nvrtc {c['worker_nvrtc_s']:.3f} s")
            for e in c["main_events"]:
                if e["kind"] == "compile_or_load" or e["seconds"] >= 0.005:
                    print(f"  {e['start']:7.3f} {e['seconds']:6.3f} {e['kind']:15s} "
                          f"{e['name'][:48]:48s} {e['where']}")
        first = next((r for r in rows if "error" not in r and r["blas_warmup"]
                      and r["label"].startswith("warm")), None)
        if first is not None:
            print(f"-- {first['label']} (warm-up on), main thread:")
            print_profiles(first["calls"])


def compiles(grid: int, warm_runs: int = 1) -> dict:
    """The first and second ``lsqr`` of a grid in a new process: empty caches,
    then the caches the first process left (``warm_runs`` new processes; see the
    module's notes)."""
    out = {}
    labels = ["cold_caches"] + [f"warm_caches{'' if i == 0 else f'_{i + 1}'}"
                                for i in range(warm_runs)]
    with tempfile.TemporaryDirectory() as kc, tempfile.TemporaryDirectory() as store:
        for label in labels:
            env = dict(os.environ, CUPY_CACHE_DIR=kc, SCIPY_GPUQR_SCHEDULE_CACHE=store)
            r = subprocess.run([sys.executable, "-c", _TRACE, str(grid)], env=env,
                               capture_output=True, text=True, timeout=500)
            out[label] = (json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                          else {"error": r.stderr[-3000:]})
    return out


def print_compiles(res: dict) -> None:
    """A table per process: each call's wall time and compile time on the main
    thread and on workers, then the main thread's events (the call's path)."""
    for label, r in res.items():
        if "error" in r:
            print(f"{label}: error\n{r['error']}")
            continue
        print(f"== {label} (grid {r['grid']}^3{'' if r.get('gpu') else ', NO GPU: the CPU path'})")
        print("call | wall s | main: compile/load, nvrtc, dlopen s | workers: compile/load, "
              "nvrtc, dlopen s | rel. residual")
        for i, c in enumerate(r["calls"]):
            print(f"{i + 1} | {c['wall']:.2f} | {c['main_compile_or_load_s']:.2f}, "
                  f"{c['main_nvrtc_s']:.2f}, {c['main_dlopen_s']:.2f} | "
                  f"{c['worker_compile_or_load_s']:.2f}, {c['worker_nvrtc_s']:.2f}, "
                  f"{c['worker_dlopen_s']:.2f} | {c['relative_residual']:.1e}")
        for i, c in enumerate(r["calls"]):
            ev = [e for e in c["events"] if e["seconds"] >= 0.005]
            if ev:
                print(f"-- call {i + 1}: events of 5 ms or more (start s, seconds, thread, "
                      "kind, kernels or library, where)")
            for e in ev:
                print(f"  {e['start']:7.3f} {e['seconds']:6.3f} {e['thread'][:16]:16s} "
                      f"{e['kind']:15s} {e['name'][:48]:48s} {e['where']}")
        print_profiles(r["calls"])


def print_profiles(calls: list) -> None:
    """The main thread's sampled seconds per package function, first call against
    second, largest differences first; then the first call's timeline."""
    if not calls or "main_profile" not in calls[0]:
        return
    first = dict(map(tuple, calls[0]["main_profile"]["by_function"]))
    second = (dict(map(tuple, calls[1]["main_profile"]["by_function"]))
              if len(calls) > 1 else {})
    rows = sorted(set(first) | set(second),
                  key=lambda k: -(first.get(k, 0.0) - second.get(k, 0.0)))
    print("-- main thread, sampled: innermost package function | call 1 s | call 2 s | diff")
    for k in rows[:25]:
        a, b = first.get(k, 0.0), second.get(k, 0.0)
        if max(a, b) >= 0.01:
            print(f"  {k[:70]:70s} {a:6.3f} {b:6.3f} {a - b:+6.3f}")
    print("-- main thread, sampled, by kind: call 1 s | call 2 s")
    kinds = [_kinds(c["main_profile"]["by_frame"]) for c in calls[:2]]
    for k in kinds[0]:
        print(f"  {k:40s} {kinds[0][k]:6.3f} {kinds[-1].get(k, 0.0):6.3f}")
    print("-- call 1, innermost frames (any module) of 10 ms or more")
    for k, v in calls[0]["main_profile"]["by_frame"][:20]:
        if v >= 0.01:
            print(f"  {k[:70]:70s} {v:6.3f}")
    print("-- call 1 timeline (main thread, package function runs of 20 ms or more)")
    for t, d, f in calls[0]["main_profile"]["timeline"]:
        print(f"  {t:7.3f} {d:6.3f} {f}")


def _kinds(by_frame) -> dict:
    """Sampled seconds grouped: Python imports, waits for a prefetched module,
    waits for worker threads (the R copy, store writes), the rest (the top 40
    innermost frames only)."""
    out = {"imports": 0.0, "waiting for a prefetched module": 0.0,
           "waiting for a worker thread": 0.0, "other (top frames)": 0.0}
    for frame, sec in by_frame:
        if frame.startswith("<frozen importlib") or "importlib" in frame:
            out["imports"] += sec
        elif frame == "_kernels.py:get":
            out["waiting for a prefetched module"] += sec
        elif frame.startswith("threading.py:"):
            out["waiting for a worker thread"] += sec
        else:
            out["other (top frames)"] += sec
    return {k: round(v, 3) for k, v in out.items()}


def nvrtc_times(arch: str = "sm_90", reps: int = 2) -> dict:
    """NVRTC seconds of the modules a float64 call prefetches: each alone, all one
    after the other, all on parallel threads (no GPU; best of ``reps``)."""
    import threading

    import numpy as np

    from scipy_gpuqr import _kernels
    from scipy_gpuqr._engine.gpu import factorize_kernels as fk
    jobs = [(u.file, _kernels.variant_group(u.needed[0], u.declared))
            for u in fk.engine_kernels(np.float64)]
    _kernels._compile_one(*jobs[-1][:1], arch, jobs[-1][1])       # NVRTC loaded
    best: dict = {}
    for _ in range(reps):
        t0 = time.perf_counter()
        each = {f: _kernels._compile_one(f, arch, g)["seconds"] for f, g in jobs}
        seq = time.perf_counter() - t0
        res: dict = {}
        threads = [threading.Thread(target=lambda f=f, g=g: res.__setitem__(
            f, _kernels._compile_one(f, arch, g)["ok"])) for f, g in jobs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        par = time.perf_counter() - t0
        assert all(res.values())
        row = dict(each, sequential=seq, threads=par)
        best = {k: min(v, best.get(k, v)) for k, v in row.items()}
    return {k: round(v, 3) for k, v in best.items()}


def store_times(grid: int) -> dict:
    """R's layout written behind the call and read back (see the module's notes)."""
    import threading
    import zlib

    import numpy as np

    from scipy_gpuqr import _store
    from scipy_gpuqr._engine.gpu import rlayout_store
    from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache, r_layout
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    out = {"grid": grid}
    with tempfile.TemporaryDirectory() as d:
        os.environ[_store.ENV] = d
        try:
            A = grid3d_least_squares(grid)
            an = analyze(A)
            clear_r_layout_cache()
            lay = r_layout(an)
            out["nnz_R"] = lay.nnz
            real, times = rlayout_store.save, {}

            def timed(*a):
                t = time.perf_counter()
                try:
                    return real(*a)
                finally:
                    times["writer_s"] = time.perf_counter() - t
                    times["thread"] = threading.current_thread().name
            rlayout_store.save = timed
            try:
                t = time.perf_counter()
                lay.stage_maps([(0, len(lay.fbase) - 2)])
                out["main_thread_s"] = time.perf_counter() - t
                _store.flush()
            finally:
                rlayout_store.save = real
            out.update(times)
            path = rlayout_store.slot(an)
            out["file_MB"] = path.stat().st_size / 1e6
            data = path.read_bytes()
            t = time.perf_counter()
            zlib.crc32(data)
            out["crc32_s"] = time.perf_counter() - t
            clear_r_layout_cache()
            t = time.perf_counter()
            back = r_layout(analyze(A))
            out["map_back_s"] = time.perf_counter() - t
            assert back._stage_maps and np.array_equal(back.indices, lay.indices)
            clear_r_layout_cache()
        finally:
            os.environ.pop(_store.ENV, None)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


_LAYOUT_LOAD = r"""
import json, sys, time
import scipy.sparse as sp
from scipy_gpuqr import _store
from scipy_gpuqr._engine.gpu import driver, rlayout
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares
spec = sys.argv[1]
A = chessboard_boundary(7, 8, 3) if spec == "ch7-8-b3" else grid3d_least_squares(int(spec[4:]))
A = sp.csc_array(A)
A.sort_indices()
an = analyze(A)
t = time.perf_counter(); early = driver.start_layout_load(an); t0 = time.perf_counter() - t
t = time.perf_counter()
s = build_schedule(an, tile=32, bundle=3, pipelining=True, lazy=True)
t1 = time.perf_counter() - t
t = time.perf_counter(); lay = early.result() if early is not None else None
t2 = time.perf_counter() - t
t = time.perf_counter(); s.materialize(); t3 = time.perf_counter() - t
if lay is None:                     # the first process: make and store the layout
    rlayout.r_layout(an).stage_maps([st.fronts for st in s.stages])
_store.flush()
print(json.dumps({"start": t0, "schedule": t1, "layout_wait": t2, "materialize": t3,
                  "stored": lay is not None}))
"""


def layout_load_times(problems: list, procs: int = 3) -> dict:
    """What the early layout load (:func:`~scipy_gpuqr._engine.gpu.driver.start_layout_load`)
    leaves a new process's main thread to wait (no GPU): per problem, a process
    fills an empty store, then ``procs`` new processes start the load, build the
    schedule from disk, wait for the layout and materialize the records
    (seconds of each)."""
    return {spec: _in_one_fresh_store(_LAYOUT_LOAD, [[spec]] * (procs + 1), timeout=600)
            for spec in problems}


def _in_one_fresh_store(script: str, argvs: list, *, timeout: int) -> list:
    """``python -c script *argv`` for each argv in turn, every process on one
    empty store (``SCIPY_GPUQR_SCHEDULE_CACHE``): the first fills it, the others
    find it warm. Each process's last stdout line as JSON, or its error."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SCIPY_GPUQR_SCHEDULE_CACHE=f"{d}/store")
        rows = []
        for argv in argvs:
            r = subprocess.run([sys.executable, "-c", script, *map(str, argv)], env=env,
                               capture_output=True, text=True, timeout=timeout)
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                        else {"error": r.stderr[-1500:]})
    return rows


_REPLAY = r"""
import json, os, statistics, sys, time
import numpy as np
from scipy_gpuqr import _store
from scipy_gpuqr._engine.gpu import driver, replay_store, stage_loop
from scipy_gpuqr._engine.gpu import solve as gs
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import grid3d_least_squares
k, order, reps, backend = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
A = grid3d_least_squares(k)
an = analyze(A)
acc = {"keep": 0.0}
real_keep = stage_loop.StageLoop.keep_reflector_records
def keep(self, *a):
    t = time.perf_counter(); real_keep(self, *a); acc["keep"] += time.perf_counter() - t
stage_loop.StageLoop.keep_reflector_records = keep
t = time.perf_counter()
g = driver.gpu_factorize(A, an, **({} if backend == "gpu" else {"device": NumpyDevice(32, 3)}))
out = {"factorize": time.perf_counter() - t, "keep_reflector_records": acc["keep"],
       "schedule_cold": bool(g.info["schedule_cold"])}
real_load, real_slot, real_save = replay_store.load, replay_store.slot, replay_store.save
parts = {}
def slot(qr):
    t = time.perf_counter(); s = real_slot(qr); parts["slot"] = time.perf_counter() - t; return s
def load(s, make):
    t = time.perf_counter(); r = real_load(s, make); parts["load"] = time.perf_counter() - t
    parts["hit"] = r is not None; return r
replay_store.slot, replay_store.load = slot, load
def once(mode):
    g.schedule.extras.clear(); g._replay.pop("plan", None); parts.clear()
    if mode == "build":          # no file read or written: the plan built
        replay_store.load = lambda s, make: None
        replay_store.save = lambda *a: False
    t = time.perf_counter(); p = gs.plan_of(g); dt = time.perf_counter() - t
    replay_store.load, replay_store.save = load, real_save
    if mode == "load" and not parts.get("hit"):
        _store.flush()           # the first process: written behind, then read
    return dt, dict(parts), p
first = {}
plans = {}
for mode in (("build", "load") if order == "build-first" else ("load", "build")):
    dt, pr, plans[mode] = once(mode)
    first[mode] = {"s": dt, **pr}
out["first"] = first
for mode in ("build", "load"):
    ts = [once(mode)[0] for _ in range(reps)]
    out[mode + "_median"] = statistics.median(ts)
pb, pl = plans["build"], plans["load"]
out["same"] = bool(first["load"].get("hit")) and pb.records.tobytes() == pl.records.tobytes() and all(
    np.array_equal(getattr(pb, f), getattr(pl, f)) for f in ("rowmap", "level_ptr", "level_stage"))
out["records"], out["levels"] = len(pb.records), pb.nlevels
_store.flush()
print(json.dumps(out))
"""


def replay_plan_times(grids: list, procs: int = 2, reps: int = 5, backend: str = "numpy") -> dict:
    """``Q``'s replay plan in new processes with warm caches (:mod:`.replay_store`):
    per grid, a process fills an empty store (its plan built and written), then
    ``procs`` new processes factorize (the NumPy device layer unless ``backend``
    is gpu) and time the first ``plan_of`` of the factorization built (no file
    read) against mapped from the file (alternately first in the process), then
    the medians of ``reps`` more of each."""
    orders = ["build-first" if i % 2 == 0 else "load-first" for i in range(procs + 1)]
    return {f"grid{k}": _in_one_fresh_store(_REPLAY, [[k, o, reps, backend] for o in orders],
                                            timeout=1800)
            for k in grids}


def print_replay_plan(res: dict) -> None:
    for name, rows in res.items():
        for i, r in enumerate(rows):
            if "error" in r:
                print(f"{name}: error {r['error']}")
                continue
            f = r["first"]
            print(f"{name} {'fill' if i == 0 else 'new process'}: {r['records']} records, "
                  f"{r['levels']} levels; first plan_of built {f['build']['s'] * 1e3:.1f} ms, "
                  f"from the file {f['load']['s'] * 1e3:.1f} ms (slot "
                  f"{f['load'].get('slot', 0) * 1e3:.1f}, load {f['load'].get('load', 0) * 1e3:.1f}, "
                  f"hit {f['load'].get('hit')}); medians built {r['build_median'] * 1e3:.1f} ms, "
                  f"from the file {r['load_median'] * 1e3:.1f} ms; keep_reflector_records "
                  f"{r['keep_reflector_records'] * 1e3:.1f} ms; same {r['same']}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--grid", type=int, default=40)
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--compiles", action="store_true",
                   help="compiles and library loads of a first lsqr, by thread, and the "
                        "main thread's sampled profile")
    p.add_argument("--warm-runs", type=int, default=1,
                   help="new processes with warm caches after the cold one (--compiles)")
    p.add_argument("--nvrtc", action="store_true",
                   help="NVRTC seconds of a call's modules, sequential and threads (no GPU)")
    p.add_argument("--store", action="store_true",
                   help="R's layout file written behind the call and read back (no GPU)")
    p.add_argument("--new-process", metavar="PROBLEMS",
                   help="the new-process gap with warm caches, for these problems "
                        "(comma-separated: ch7-8-b3, grid40, ...)")
    p.add_argument("--procs", type=int, default=4,
                   help="warm-cache processes per problem (--new-process; alternately "
                        "with and without the cuBLAS warm-up)")
    p.add_argument("--cold", action="store_true",
                   help="--new-process: an empty kernel cache per problem (its first "
                        "process a cold first call)")
    p.add_argument("--no-ab", action="store_true",
                   help="--new-process: the cuBLAS warm-up on in every process (no A/B)")
    p.add_argument("--tree", metavar="DIR",
                   help="--new-process: import the package from DIR (a git archive of "
                        "another commit: the baseline in the same run)")
    p.add_argument("--backend", default="gpu",
                   help="--new-process: the calls' backend (another than gpu: a dry run)")
    p.add_argument("--layout-load", metavar="PROBLEMS",
                   help="the early layout load's wait in new processes (no GPU), for "
                        "these problems (comma-separated)")
    p.add_argument("--replay-plan", metavar="GRIDS",
                   help="Q's replay plan built against mapped from the store in new "
                        "processes, for these grid sizes (comma-separated: 24,32; the NumPy "
                        "device layer, no GPU, unless --backend gpu)")
    p.add_argument("--reps", type=int, default=5, help="--replay-plan: timings per process")
    p.add_argument("--replay-gpu", action="store_true",
                   help="--replay-plan: factorize on the CUDA device (the plan's time is "
                        "the host's either way)")
    p.add_argument("--handles", action="store_true",
                   help="a new process's CUDA context, library imports and handles, step "
                        "by step (with and without a worker thread's handles first)")
    a = p.parse_args(argv)
    res = {}
    if a.replay_plan:
        res["replay_plan"] = replay_plan_times([int(x) for x in a.replay_plan.split(",")],
                                               a.procs, a.reps,
                                               "gpu" if a.replay_gpu else "numpy")
        print_replay_plan(res["replay_plan"])
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    if a.layout_load:
        res["layout_load"] = layout_load_times(a.layout_load.split(","), a.procs)
        for spec, rows in res["layout_load"].items():
            for r in rows:
                print(f"{spec}: " + ("error " + r["error"] if "error" in r else
                      f"schedule {r['schedule'] * 1e3:.1f} ms, layout wait {r['layout_wait'] * 1e3:.1f} "
                      f"ms, materialize {r['materialize'] * 1e3:.1f} ms, stored {r['stored']}"))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    if a.handles:
        res["handles"] = handle_costs()
        for mode, rows in res["handles"].items():
            for r in rows:
                print(f"handles ({mode}): {json.dumps(r)}", flush=True)
        if a.json and not a.new_process:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        if not a.new_process:
            return 0
    if a.new_process:
        res["new_process"] = new_process_gap(a.new_process.split(","), a.procs,
                                             backend=a.backend, cold=a.cold, tree=a.tree,
                                             ab=not a.no_ab)
        print_new_process(res["new_process"])
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    if a.nvrtc or a.compiles or a.store:
        if a.store:
            res["store"] = store_times(a.grid)
            print(json.dumps(res["store"], indent=1), flush=True)
        if a.nvrtc:
            res["nvrtc"] = nvrtc_times()
            print(json.dumps(res["nvrtc"], indent=1), flush=True)
        if a.compiles:
            res["compiles"] = compiles(a.grid, a.warm_runs)
            print_compiles(res["compiles"])
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
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
