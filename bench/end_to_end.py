#!/usr/bin/env python3
"""End to end: sparse least squares on the GPU through the public calls (issue 16).

    python bench/end_to_end.py [--quick] [--json out.json] [--no-subprocess]
        [--only NAME ...] [--subprocess-for NAME ...] [--no-cold] [--warm-runs N]
        [--rank-cols N] [--free-parent-pool | --parent-pool-ab] [--start-gpu]
        [--phases] [--sample-children] [--spans]

Per problem, in one run (one GPU):

* ``engine``: the engine's warm factorization (``gpu_factorize`` with an
  analysis it factorized before: the reference the public calls are held
  to, the one internal call here) and the warm solve
  (``QRFactorization.solve`` once its rank decision is made);
* ``lsqr first``: ``lsqr(A, b, backend='gpu')``, the first call on A's
  pattern in the process (the process warm on another matrix);
* ``qrf``: then a new ``QRFactorization(A, backend='gpu')`` of the known
  pattern and ``solve(b)``, with the phases of its ``info`` (validate,
  analyze, factorize, rank decision, solve);
* ``lsqr again``: the lsqr call repeated (median); every call on a new copy
  of A;
* ``new process``: the first ``lsqr`` in a fresh Python process, with an empty
  kernel cache and empty analysis/plan stores (``cold``), and again with
  the caches the cold process left (``warm caches``, ``--warm-runs`` of
  them; ``--no-cold``: only these, with this run's caches); per process
  the setup (imports, the matrix), ``from scipy_gpuqr import lsqr`` and
  three calls apart, the gap being the first call less the faster other;
  ``--start-gpu``: as many warm-cache processes again whose script calls
  ``scipy_gpuqr.start_gpu()`` at its top, before it makes the matrix (a
  user's early start; reported apart, not in the gap's verdict); each
  process also times CUDA's own start (``cuInit`` and the primary context
  on the package's driver thread) from its first call's start, so that the
  gap splits into CUDA's start and the package's own work
  (``ours = gap - cuda_ready``);
* ``--rounds N``: the repeated call and the engine's factorization + solve
  again, taken in turn for N rounds (the same device state for both;
  medians): the ratio's verdict then comes from these;
* ``--phases``: where ``lsqr first`` and ``lsqr again`` spend their time
  (:class:`CallPhases`): the call's phases (validation, analysis,
  factorization, rank decision, solve, the rest), the engine's own split of
  its factorization (schedule, launch loop, waits, R's assembly, cold or
  warm schedule), and the call's main thread sampled every 2 ms, the first
  call's excess over the repeated one per innermost package function.

Backward error of lsqr's x (``‖Aᵀr‖ / (‖A‖_F (‖A‖_F ‖x‖ + ‖b‖))``) and its
rank against ``numpy.linalg.lstsq``'s rule (``σ > eps·max(m, n)·σ₁``, dense
SVD, where n is small enough). Targets (issue 16): lsqr first call ch7-8-b3
<= 1.0 s, lp_nug20ᵀ <= 1.0 s, grid 40³ <= 0.8 s; a repeated call <= 1.15x
the engine's factorization + solve. The table printed last says which held.

Problems: ch7-8-b3 (generated), lp_nug20ᵀ (``lp_nug20.mtx`` transposed from
the matrices folder, else generated with its pattern by
``qap_linearization(20)``), 3-D grid least squares 24³ up
to 64³ (``--quick``: 24³ and 40³; the larger stop at the first that does not
fit), random least squares well conditioned and rank deficient.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))   # after PYTHONPATH: another tree can be timed

#: Targets of issue 16 (seconds): lsqr's first call on a matrix.
FIRST_CALL_TARGETS = {"ch7-8-b3": 1.0, "lp_nug20T": 1.0, "grid40": 0.8}
#: A repeated call against the engine's factorization + solve.
REPEAT_RATIO = 1.15
#: Dense SVD for lstsq's rank only up to this many columns (``--quick``: 5000).
RANK_MAX_COLS = 12000


# ----------------------------------------------------------------------------- problems

def make(spec: str):
    """The matrix of a spec: ``grid:K``, ``ch:M,N,K``, ``qap:N[:T]``,
    ``rand:M,N,DENS,DUP,SEED``, ``file:NAME[:T]`` (T: transposed)."""
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               qap_linearization, random_least_squares)
    kind, _, arg = spec.partition(":")
    if kind == "grid":
        return grid3d_least_squares(int(arg))
    if kind == "ch":
        m, n, k = (int(x) for x in arg.split(","))
        return chessboard_boundary(m, n, k)
    if kind == "qap":
        order, _, t = arg.partition(":")
        A = qap_linearization(int(order))
        return sp.csc_array(A.T) if t == "T" else A
    if kind == "rand":
        m, n, dens, dup, seed = arg.split(",")
        return random_least_squares(int(m), int(n), density=float(dens), dense_rows=20,
                                    duplicate_cols=int(dup), seed=int(seed))
    if kind == "file":
        from scipy_gpuqr.io import mmread
        name, _, t = arg.partition(":")
        A = sp.csc_array(mmread(str(matrices_dir() / name))).astype(np.float64)
        return sp.csc_array(A.T) if t == "T" else A
    raise ValueError(spec)


def matrices_dir() -> Path:
    return Path(os.environ.get("SHARED_MATRICES", ROOT / "tests" / "data" / "matrices"))


def problems(quick: bool) -> list:
    out = [("ch7-8-b3", "ch:7,8,3")]
    for fname in ("lp_nug20.mtx", "lp_nug20.mtx.gz"):
        if (matrices_dir() / fname).exists():
            out.append(("lp_nug20T", f"file:{fname}:T"))
            break
    else:
        out.append(("lp_nug20T", "qap:20:T"))
    grids = (24, 40) if quick else (24, 32, 40, 48, 56, 64)
    out += [(f"grid{k}", f"grid:{k}") for k in grids]
    m, n, d = (20000, 4000, 0.0012) if quick else (40000, 8000, 0.0008)
    out += [("rand-well", f"rand:{m},{n},{d},0,1"),
            ("rand-rankdef", f"rand:{m},{n},{d},{n // 40},2")]
    return out


def rhs(A) -> np.ndarray:
    """``b = A x + e``: x = 1 + 0.5 sin(k) (not in A's null space for the
    boundary matrices, whose A @ ones is 0) and a perturbation e (cosine) of
    1e-2 ‖A x‖ in norm, so that the residual is not zero either."""
    m, n = A.shape
    x = 1.0 + 0.5 * np.sin(np.arange(n, dtype=np.float64))
    ax = np.asarray(A @ x, dtype=np.float64).ravel()
    nax = float(np.linalg.norm(ax))
    if not nax > 0:
        raise ValueError("rhs: A x is zero")
    e = np.cos(np.arange(m, dtype=np.float64))
    b = ax + 1e-2 * nax * e / np.linalg.norm(e)
    assert np.linalg.norm(b) > 0
    return b


def backward_error(A, x, b) -> float:
    r = b - A @ x
    nA = sp.linalg.norm(A)
    den = nA * (nA * np.linalg.norm(x) + np.linalg.norm(b))
    return float(np.linalg.norm(A.T @ r) / den) if den else 0.0


def lstsq_rank(A, max_cols: int = RANK_MAX_COLS):
    """Rank by numpy.linalg.lstsq's rule, from the singular values of dense A
    (on the GPU when there is one; None where the SVD is too dear)."""
    from scipy_gpuqr._gpu import gpu_info, import_cupy
    m, n = A.shape
    if min(m, n) > max_cols or m * n > 1e9:
        return None
    D = A.toarray() if m >= n else A.T.toarray()
    if gpu_info().get("available"):
        # A's singular values are R's (A = QR): cuSOLVER's SVD of a tall
        # 58800 × 11760 matrix answers CUSOLVER_STATUS_INVALID_VALUE, its QR does not
        cp = import_cupy()
        s = cp.linalg.svd(cp.linalg.qr(cp.asarray(D), mode="r"), compute_uv=False).get()
    else:
        s = np.linalg.svd(D, compute_uv=False)
    return int(np.sum(s > np.finfo(np.float64).eps * max(m, n) * s[0])) if len(s) else 0


# ----------------------------------------------------------------------------- timing

def _sync():
    from scipy_gpuqr._gpu import gpu_info, import_cupy
    if gpu_info().get("available"):
        import_cupy().cuda.Device().synchronize()


def timed(fn):
    """``(seconds, fn())``, the device idle before and after."""
    _sync()
    t = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t, out


def interleaved_rows(A, b, rounds: int, backend: str = "gpu") -> dict:
    """``--rounds N``: the repeated ``lsqr`` call and the warm engine's factorization
    and solve (as :func:`engine_rows` times them) taken in turn, N rounds, so
    that both see the same device and host state (clocks, pools, other load);
    medians, and the ratio of the call to the engine's factorization + solve."""
    import scipy_gpuqr as sg
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    an = analyze(A)

    def engine():
        if backend == "gpu":
            return gpu_factorize(A, an)
        return sg.QRFactorization(A, backend=backend)
    F = sg.QRFactorization(A, backend=backend)
    F.solve(b)
    A3 = A.copy()
    sg.lsqr(A3, b, backend=backend)
    engine().free()
    calls, fac, sol = [], [], []
    for _ in range(rounds):
        calls.append(timed(lambda: sg.lsqr(A3, b, backend=backend))[0])
        t, g = timed(engine)
        g.free()
        fac.append(t)
        sol.append(timed(lambda: F.solve(b))[0])
    F.free()
    out = {"rounds": rounds, "lsqr_again": statistics.median(calls),
           "factorize": statistics.median(fac), "solve": statistics.median(sol)}
    out["ratio"] = out["lsqr_again"] / (out["factorize"] + out["solve"])
    return out


class CallPhases:
    """Per public call inside the block: its factorization's phases
    (``FactoredQR.timings``: validate, analyze, factorize, rank_decision,
    solve), the engine's ``info['seconds']`` and whether its schedule was cold,
    read when the call frees its factorization; and, with ``sample``, the
    calling thread's innermost package function sampled every
    :data:`SAMPLE_S` seconds (seconds per function, each sample weighted by
    the time since the last one, at most :data:`SAMPLE_CAP_S`: a sample the
    GIL delayed counts for the time it covers)."""

    SAMPLE_S = 0.002
    SAMPLE_CAP_S = 0.05

    def __init__(self, sample: bool = True):
        self.sample = sample
        self.calls = []
        self.samples = {}

    def __enter__(self):
        import threading
        from scipy_gpuqr._factor import factored
        self._cls = factored.FactoredQR
        self._free = free = self._cls.free
        calls = self.calls

        def snap_free(F):
            if F.num is not None:
                info = getattr(F.num, "info", {}) or {}
                calls.append({"timings": dict(F.timings),
                              "engine": dict(info.get("seconds", {}) or {}),
                              "schedule_cold": info.get("schedule_cold"),
                              "rank_method": (F._solver.method if F._solver is not None
                                              else None)})
            return free(F)
        self._cls.free = snap_free
        self._stop = threading.Event()
        self._thread = None
        if self.sample:
            self._ident = threading.get_ident()
            self._thread = threading.Thread(target=self._sampler, name="bench-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._cls.free = self._free
        return False

    def _sampler(self):
        last = time.perf_counter()
        while not self._stop.wait(self.SAMPLE_S):
            now = time.perf_counter()
            dt, last = min(now - last, self.SAMPLE_CAP_S), now
            f = sys._current_frames().get(self._ident)
            where = None
            while f is not None:
                fn = f.f_code.co_filename
                if "scipy_gpuqr" in fn and "end_to_end" not in fn:
                    where = f"{fn.rsplit('scipy_gpuqr/', 1)[-1]}:{f.f_code.co_name}"
                    break
                f = f.f_back
            key = where or "(outside the package)"
            self.samples[key] = self.samples.get(key, 0.0) + dt

    def row(self, wall: float) -> dict:
        """The last call's phases (seconds) with ``rest`` = its wall time less them."""
        c = self.calls[-1] if self.calls else {"timings": {}, "engine": {}}
        t = c["timings"]
        parts = {k: t.get(k) for k in ("validate", "analyze", "factorize", "rank_decision",
                                       "solve")}
        e = c["engine"]
        out = {"wall": wall, **parts,
               "rest": wall - sum(v for v in parts.values() if v is not None),
               "schedule_cold": c.get("schedule_cold"), "rank_method": c.get("rank_method"),
               "engine": {k: e.get(k) for k in ("validate", "schedule", "first_launch",
                                                "launch_loop", "wait_gpu", "wait_host_side",
                                                "wait_r_copy", "factorize", "assemble_R",
                                                "total")}}
        return out


def phases_rows(A, b, reps: int, backend: str = "gpu") -> dict:
    """``--phases``: lsqr's first call on a copy of A whose pattern is new to the
    process (A's rows reversed: the same problem, a pattern not factorized
    before) and the repeated call, each with :class:`CallPhases`; ``excess``:
    the first call's sampled seconds less the repeated call's, per function
    (the largest first)."""
    import scipy_gpuqr as sg
    B = sp.csc_array(A[::-1])
    B.sort_indices()
    bb = np.ascontiguousarray(b[::-1])
    out = {}
    samples = {}
    for label in ("first", "again", "again_2"):
        with CallPhases() as ph:
            B1 = B.copy()
            t, _ = timed(lambda: sg.lsqr(B1, bb, backend=backend))
        out[label] = ph.row(t)
        samples[label] = ph.samples
    again = min(("again", "again_2"), key=lambda k: out[k]["wall"])
    keys = set(samples["first"]) | set(samples[again])
    excess = {k: samples["first"].get(k, 0.0) - samples[again].get(k, 0.0) for k in keys}
    out["excess"] = dict(sorted(((k, round(v, 4)) for k, v in excess.items() if abs(v) >= 0.004),
                                key=lambda kv: -kv[1])[:16])
    return out


def print_phases(name: str, ph: dict) -> None:
    """The phases of ``phases_rows`` as lines under the problem's name."""
    def f(v):
        return f"{v:.3f}" if isinstance(v, (int, float)) else "-"
    for label in ("first", "again", "again_2"):
        r = ph[label]
        e = r["engine"]
        print(f"  {name} {label:8s} wall {f(r['wall'])} = validate {f(r['validate'])} + analyze "
              f"{f(r['analyze'])} + factorize {f(r['factorize'])} + rank {f(r['rank_decision'])} "
              f"({r['rank_method']}) + solve {f(r['solve'])} + rest {f(r['rest'])} | engine: "
              + " ".join(f"{k} {f(v)}" for k, v in e.items() if v is not None)
              + f" | cold schedule {r['schedule_cold']}", flush=True)
    print(f"  {name} first call's excess over the repeated one, main thread (s): "
          + "; ".join(f"{k} {v:+.3f}" for k, v in ph["excess"].items()), flush=True)


def engine_rows(A, b, reps: int, backend: str = "gpu") -> dict:
    """The warm engine: factorization with an analysis it factorized before, and
    the warm solve (a factorization whose rank decision is made). Another
    backend than the GPU's (a dry run of this script): its warm QRFactorization."""
    import scipy_gpuqr as sg
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    an = analyze(A)

    def engine():
        if backend == "gpu":
            return gpu_factorize(A, an)
        return sg.QRFactorization(A, backend=backend)
    engine().free()
    fac = []
    for _ in range(reps):
        t, g = timed(engine)
        fac.append(t)
        g.free()
    F = sg.QRFactorization(A, backend=backend)
    F.solve(b)
    sol = [timed(lambda: F.solve(b))[0] for _ in range(reps)]
    F.free()
    return {"factorize": statistics.median(fac), "solve": statistics.median(sol)}


def public_rows(A, b, reps: int, backend: str = "gpu") -> dict:
    """lsqr's first call on A's pattern, a new ``QRFactorization`` of the now known
    pattern (with its phases), lsqr repeated; every call on a fresh copy of A."""
    import scipy_gpuqr as sg
    out = {}
    A1 = A.copy()
    t, res = timed(lambda: sg.lsqr(A1, b, backend=backend))
    out["lsqr_first"] = t
    out["backward_error"] = backward_error(A, res[0], b)
    A2 = A.copy()
    t, F = timed(lambda: sg.QRFactorization(A2, backend=backend))
    ts, _ = timed(lambda: F.solve(b))
    info = F.info
    tm = info.get("timings", {})
    out["qrf"] = {"factorize": t, "solve": ts, "rank": int(F.rank),
                  "phases": {k: tm.get(k) for k in ("validate", "analyze", "factorize",
                                                    "rank_decision", "solve")},
                  "rank_method": info.get("rank_decision", {}).get("method"),
                  "backend": info.get("backend_info", {}).get("backend"),
                  "schedule_cold": info.get("backend_info", {}).get("schedule_cold")}
    F.free()
    A3 = A.copy()
    again = [timed(lambda: sg.lsqr(A3, b, backend=backend))[0] for _ in range(reps)]
    out["lsqr_again"] = statistics.median(again)
    return out


_CHILD = r"""
import json, logging, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, sys.argv[2] + "/bench")
import numpy as np
if "start_gpu" in sys.argv[4:]:       # the script's top: CUDA and the kernels begun
    import scipy_gpuqr
    scipy_gpuqr.start_gpu()
from end_to_end import make, rhs
A = make(sys.argv[1]); b = rhs(A)
t1 = time.perf_counter()
from scipy_gpuqr import lsqr
t2 = time.perf_counter()
# CUDA's own start (cuInit, then the primary context) on the package's driver thread,
# the same calls timed (absent where the package starts CUDA otherwise)
import ctypes, scipy_gpuqr._gpu as _g
cuda = {}
if hasattr(_g, "_retain_primary_context") and hasattr(_g, "_driver_library"):
    def _retain():
        lib = _g._driver_library()
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        cuda["start"] = time.perf_counter()
        try:
            ok = lib.cuInit(0) == 0
            cuda["cuinit_end"] = time.perf_counter()
            if ok and lib.cuDeviceGet(ctypes.byref(dev), 0) == 0:
                lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        except AttributeError:
            pass
        cuda["ready"] = time.perf_counter()
    _g._retain_primary_context = _retain
# per call, what the device's memory looked like to the package: every read of it
# (DeviceMemory: available, what limited it, free, this process's pool) with the
# function that asked, every stage plan made (stages, peak, host fronts), and the
# package's log lines (restaging, Q on the host, ...)
from scipy_gpuqr._engine import memory as _mem
reads, plans, logs = [], [], []
_dm_init = _mem.DeviceMemory.__init__
def _dm(self, *a, **k):
    _dm_init(self, *a, **k)
    f1, f2 = sys._getframe(1), sys._getframe(2)
    d = self.detail or {}
    reads.append({"available": self.available, "limited_by": self.limited_by,
                  "free": d.get("free"), "pool_used": d.get("pool_used"),
                  "pool_cached": d.get("pool_cached"),
                  "by": f"{f1.f_code.co_name} < {f2.f_code.co_filename.split('/')[-1]}:"
                        f"{f2.f_code.co_name}"})
_mem.DeviceMemory.__init__ = _dm
_pfm = _mem.plan_for_memory
def _plan(analysis, needs, available, *a, **k):
    p = _pfm(analysis, needs, available, *a, **k)
    plans.append({"available": available, "stages": len(p.need), "peak": p.peak,
                  "fixed": p.fixed, "host_fronts": len(p.host), "feasible": not p.oversized})
    return p
for m in list(sys.modules.values()):
    if getattr(m, "plan_for_memory", None) is _pfm:
        m.plan_for_memory = _plan
_mem.plan_for_memory = _plan
class _Logs(logging.Handler):
    def emit(self, r):
        logs.append(f"{r.levelname} {r.name}: {r.getMessage()}"[:300])
_lg = logging.getLogger("scipy_gpuqr")
_lg.addHandler(_Logs())
_lg.setLevel(logging.INFO)
# "sample": the main thread and the package's prefetch thread sampled every 2 ms in
# calls 1 and 2: seconds per innermost frame (any module) and per innermost package
# frame, each sample weighted by the time since the last (at most 50 ms)
import threading
SAMPLE = "sample" in sys.argv[4:]
prof = {"call": None, "marks": {}}
def _sampler(main_id, stop):
    last = time.perf_counter()
    while not stop.wait(0.002):
        now = time.perf_counter()
        dt, last = min(now - last, 0.05), now
        k = prof["call"]
        if k is None:
            continue
        m = sys.modules.get("cupy")
        if m is not None and "cupy" not in prof["marks"] and not getattr(
                getattr(m, "__spec__", None), "_initializing", False):
            prof["marks"]["cupy"] = now - t_call
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, f in sys._current_frames().items():
            who = "main" if ident == main_id else names.get(ident, "?")
            if who != "main" and not who.startswith("gpuqr-gpu-prefetch"):
                continue
            top = f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_code.co_name}"
            pkg = None
            while f is not None:
                if "scipy_gpuqr" in f.f_code.co_filename:
                    pkg = f"{f.f_code.co_filename.rsplit('scipy_gpuqr/', 1)[-1]}:{f.f_code.co_name}"
                    break
                f = f.f_back
            for kind, key in (("top", top), ("pkg", pkg or "(outside)")):
                d = prof.setdefault((k, who, kind), {})
                d[key] = d.get(key, 0.0) + dt
# per call: the factorization's phases and the engine's seconds, read as the call
# frees its factorization (first_launch: from the engine's start to its first launch)
from scipy_gpuqr._factor import factored as _fq
phases = []
_free = _fq.FactoredQR.free
def _snap(F):
    if F.num is not None:
        sec = (getattr(F.num, "info", {}) or {}).get("seconds", {}) or {}
        phases.append({**{k: round(v, 4) for k, v in F.timings.items()},
                       **{"engine_" + k: round(sec[k], 4) for k in
                          ("first_launch", "launch_loop", "wait_gpu", "wait_r_copy", "total")
                          if isinstance(sec.get(k), float)}})
    return _free(F)
_fq.FactoredQR.free = _snap
# "spans": the first call's steps timed where they run (wall seconds from the call's
# start, per thread): CuPy's import, the CUDA libraries' imports, cuBLAS's warm-up,
# each kernel module's load, the device layer's set-up and uploads, every pinned
# buffer (bytes), the store's reads and checks, the first dense front; what the
# sampler cannot tell apart when another thread holds the GIL
SPANS = "spans" in sys.argv[4:]
spans = []
def _span(label, fn, sized=None):
    import functools
    @functools.wraps(fn)
    def inner(*a, **k):
        if prof.get("call") != 0:
            return fn(*a, **k)
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            try:
                name = label(*a, **k) if callable(label) else label
                extra = sized(*a, **k) if sized is not None else None
            except Exception:
                name, extra = getattr(fn, "__name__", "?"), None
            spans.append((round(t - t_call, 4), round(time.perf_counter() - t, 4),
                          threading.current_thread().name, name, extra))
    return inner
if SPANS:
    import importlib
    import scipy_gpuqr._gpu as _gmod, scipy_gpuqr._kernels as _kmod, scipy_gpuqr._store as _smod
    from scipy_gpuqr._engine.gpu import device as _dmod, factorize_kernels as _fkmod
    from scipy_gpuqr._engine.gpu import blas_warmup as _bwmod
    _imp = importlib.import_module
    def _import_all(names):
        for n in names:
            try:
                _span("import " + n, _imp)(n)
            except Exception:
                pass
    _fkmod._import_all = _import_all
    _import_cupy = _span("import_cupy", _gmod.import_cupy)
    def _cupy_spans():
        # CuPy's NVRTC runs of an empty file (one per option set not in its table)
        # and its kernels' compiles or loads from the cache, once CuPy is imported
        cp = _import_cupy()
        comp = sys.modules.get("cupy.cuda.compiler")
        if comp is not None and not getattr(comp, "_g7_spans", False):
            comp._g7_spans = True
            comp._preprocess = _span("NVRTC empty-file run (CuPy)", comp._preprocess)
            comp._compile_with_cache_cuda = _span(
                lambda src, opts, *a, **k: "CuPy compile/load " + str(src).lstrip()[:40]
                .replace("\n", " "), comp._compile_with_cache_cuda)
        return cp
    _gmod.import_cupy = _cupy_spans
    _gmod.gpu_info = _span("gpu_info", _gmod.gpu_info)
    _bwmod.warmup = _span("cuBLAS warm-up", _bwmod.warmup)
    _kmod._Compiled.get = _span(lambda self, name, *a, **k: "module " + name, _kmod._Compiled.get)
    if hasattr(_kmod, "_seed_preprocess"):
        _kmod._seed_preprocess = _span("seed NVRTC table", _kmod._seed_preprocess)
    for _n in ("read_mapped", "crc32"):
        if hasattr(_smod, _n):
            setattr(_smod, _n, _span("store " + _n, getattr(_smod, _n),
                                     (lambda *a, _c=(_n == "crc32"), **k:
                                      len(a[0]) if _c else None)))
    _C = _dmod.CupyDevice
    _C.__init__ = _span("CupyDevice()", _C.__init__)
    _C.start = _span("device.start", _C.start)
    _C.begin_stage = _span("device.begin_stage", _C.begin_stage)
    _C._pinned = _span("pinned buffer", _C._pinned,
                       lambda self, n, dtype: int(n) * np.dtype(dtype).itemsize)
    _C.dense_factorize = _span("dense front", _C.dense_factorize)
    _C.end_stage = _span("device.end_stage (waits)", _C.end_stage)
    _bwmod.driver_warmup = _span("cuBLAS warm-up (driver)", _bwmod.driver_warmup)
    # the host steps between the device's set-up and the first launch
    from scipy_gpuqr._engine.gpu import driver as _drv, stage_loop as _sl
    for _n in ("_factorize", "_device_memory", "staged_dense_plan", "_memory_plan", "build_schedule",
               "_memory_checks", "start_layout_load", "start_schedule_load"):
        if hasattr(_drv, _n):
            setattr(_drv, _n, _span("driver." + _n, getattr(_drv, _n)))
    _drv.call_pins.for_plan = _span("call_pins.for_plan", _drv.call_pins.for_plan)
    _sl.StageLoop.__init__ = _span("StageLoop()", _sl.StageLoop.__init__)
    _sl.StageLoop.begin = _span("StageLoop.begin", _sl.StageLoop.begin)
calls, memory = [], []
stop = threading.Event()
if SAMPLE:
    threading.Thread(target=_sampler, args=(threading.get_ident(), stop), daemon=True).start()
for i in range(3):
    del reads[:], plans[:], logs[:]
    t = time.perf_counter()
    if not calls:
        t_call = t
    prof["call"] = i if i < 2 else None
    lsqr(A, b, backend=sys.argv[3])
    prof["call"] = None
    calls.append(time.perf_counter() - t)
    memory.append({"reads": list(reads), "plans": list(plans), "logs": list(logs)})
stop.set()
samples = {}
if SAMPLE:
    for who in ("main", "gpuqr-gpu-prefetch"):
        for kind in ("top", "pkg"):
            a, z = prof.get((0, who, kind), {}), prof.get((1, who, kind), {})
            ex = {key: a.get(key, 0.0) - z.get(key, 0.0) for key in set(a) | set(z)}
            samples[f"{who} {kind}"] = sorted(((round(v, 4), key) for key, v in ex.items()
                                               if abs(v) >= 0.004), reverse=True)[:14]
    samples["marks"] = prof["marks"]
if SPANS:
    samples["spans"] = sorted(spans)
cs = {}
if "ready" in cuda:     # from the first call's start (negative: before it, start_gpu)
    cs = {"cuda_start": cuda["start"] - t_call, "cuda_ready": cuda["ready"] - t_call,
          "cuinit": cuda.get("cuinit_end", cuda["ready"]) - cuda["start"],
          "context": cuda["ready"] - cuda.get("cuinit_end", cuda["ready"])}
gap = calls[0] - min(calls[1:])
print(json.dumps({"setup": t1 - t0, "import": t2 - t1, "first": calls[0], "second": calls[1],
                  "third": calls[2], "gap": gap, **cs,
                  "ours": gap - max(cs.get("cuda_ready", 0.0), 0.0), "memory": memory,
                  "samples": samples, "phases": phases}))
"""


def print_spans(name: str, spans) -> None:
    """A new process's first call, step by step (``--spans``): start and length
    (ms from the call's start), thread and step; the pinned buffers summed."""
    pinned = [sp for sp in spans if sp[3] == "pinned buffer"]
    others = [sp for sp in spans if sp[3] != "pinned buffer" and (sp[1] >= 0.001
                                                                    or "module" in sp[3])]
    print(f"  {name} call 1 steps (ms from its start: start +length, thread, step):")
    for t, d, who, what, extra in others:
        more = f" ({extra / 2**20:.1f} MB)" if isinstance(extra, int) and extra > 4096 else ""
        print(f"    {1e3 * t:7.1f} +{1e3 * d:6.1f}  {who[:22]:22s} {what}{more}")
    if pinned:
        tot = sum(sp[1] for sp in pinned)
        nb = sum(sp[4] or 0 for sp in pinned)
        print(f"    pinned buffers: {len(pinned)}, {nb / 2**20:.1f} MB, {1e3 * tot:.1f} ms "
              f"(first at {1e3 * pinned[0][0]:.1f} ms)")


def parent_memory() -> dict:
    """This process's CuPy pool and the device's free memory (bytes) as the new
    processes start: what the parent holds is not free for them."""
    from scipy_gpuqr._gpu import gpu_info, import_cupy
    if not gpu_info().get("available"):
        return {}
    cp = import_cupy()
    pool = cp.get_default_memory_pool()
    free, total = cp.cuda.runtime.memGetInfo()
    return {"pool_used": int(pool.used_bytes()), "pool_held": int(pool.total_bytes()),
            "device_free": int(free), "device_total": int(total)}


def print_child_memory(name: str, child: dict) -> None:
    """One line per call of a new process: its time, the stage plans made (stages,
    peak, for how many bytes), the smallest 'available' any read of the device's
    memory gave and who read it, and the package's log lines."""
    for i, (key, m) in enumerate(zip(("first", "second", "third"), child.get("memory", []))):
        plans = "; ".join(f"{p['stages']} stage(s), peak {p['peak'] / 2**30:.2f} GiB of "
                          f"{(p['available'] or 0) / 2**30:.1f}, host fronts {p['host_fronts']}"
                          for p in m["plans"]) or "no plan"
        reads = [r for r in m["reads"] if r["available"] is not None]
        low = min(reads, key=lambda r: r["available"], default=None)
        lowest = (f"least available {low['available'] / 2**30:.1f} GiB ({low['limited_by']}, free "
                  f"{(low['free'] or 0) / 2**30:.1f}, own pool cached "
                  f"{(low['pool_cached'] or 0) / 2**30:.1f}; {low['by']}) of {len(reads)} reads"
                  if low else "no reads")
        print(f"  {name} call {i + 1}: {child[key]:.2f} s | {plans} | {lowest}")
        for line in m["logs"]:
            print(f"    log: {line}")


def new_process(spec: str, backend: str = "gpu", *, cold: bool = True,
                warm_runs: int = 1, free_parent_pool: bool = False,
                pool_ab: bool = False, start_gpu: bool = False,
                sample_children: bool = False, spans: bool = False) -> dict:
    """First lsqr in fresh processes: empty caches (``cold``), then ``warm_runs``
    processes with the caches it left; without ``cold`` the processes use the
    environment's caches (``CUPY_CACHE_DIR``, the analysis/plan store), which
    this run's own calls on the problem filled. Each process times its setup
    (imports, the matrix), ``from scipy_gpuqr import lsqr`` (``import``) and
    three calls; ``gap`` is the first less the faster of the other two.
    Each process also reports, per call, the device memory it saw and the
    stage plans it made (:func:`print_child_memory`); ``parent_memory`` is
    what this process held meanwhile (``free_parent_pool``: its CuPy pool's
    cached blocks given back first). ``pool_ab``: after the warm-cache
    processes, this process's pool is given back and ``warm_runs`` more run
    (``freed_pool``, ``freed_pool_2``, ...; not in the gap's median): whether
    what the parent holds makes the new processes slower. ``start_gpu``: then
    ``warm_runs`` more whose script calls ``scipy_gpuqr.start_gpu()`` first
    (``start_gpu``, ``start_gpu_2``, ...; not in the gap's median).
    ``sample_children``: each process samples its main thread and the package's
    prefetch thread every 2 ms in its first two calls and reports the first
    call's excess per innermost frame (any module, and the package's), and
    when CuPy's import ended (``marks``). ``spans``: each process times its first
    call's steps on the threads that run them (:func:`print_spans`)."""
    if free_parent_pool and backend == "gpu":
        from scipy_gpuqr._gpu import import_cupy
        import_cupy().get_default_memory_pool().free_all_blocks()
    out = {"parent_memory": parent_memory()}
    pm = out["parent_memory"]
    if pm:
        print(f"  {spec}: the parent holds {pm['pool_held'] / 2**30:.2f} GiB in its CuPy pool "
              f"({pm['pool_used'] / 2**30:.2f} in use); device free "
              f"{pm['device_free'] / 2**30:.1f} of {pm['device_total'] / 2**30:.1f} GiB",
              flush=True)
    with tempfile.TemporaryDirectory() as d:
        env = (dict(os.environ, CUPY_CACHE_DIR=f"{d}/kernels",
                    SCIPY_GPUQR_SCHEDULE_CACHE=f"{d}/store") if cold else dict(os.environ))
        names = (["cold"] if cold else []) + [
            "warm_caches" if i == 0 else f"warm_caches_{i + 1}" for i in range(warm_runs)]
        if pool_ab and backend == "gpu" and not free_parent_pool:
            names += ["freed_pool" if i == 0 else f"freed_pool_{i + 1}"
                      for i in range(warm_runs)]
        if start_gpu:
            names += ["start_gpu" if i == 0 else f"start_gpu_{i + 1}" for i in range(warm_runs)]
        for name in names:
            if name == "freed_pool":
                from scipy_gpuqr._gpu import import_cupy
                import_cupy().get_default_memory_pool().free_all_blocks()
                out["parent_memory_freed"] = pm2 = parent_memory()
                print(f"  {spec}: the parent's pool given back: it holds "
                      f"{pm2['pool_held'] / 2**30:.2f} GiB; device free "
                      f"{pm2['device_free'] / 2**30:.1f} GiB", flush=True)
            extra = (["start_gpu"] if name.startswith("start_gpu") else []) + (
                ["sample"] if sample_children else []) + (["spans"] if spans else [])
            r = subprocess.run([sys.executable, "-c", _CHILD, spec, str(ROOT), backend, *extra],
                               env=env,
                               capture_output=True, text=True, timeout=300)
            if r.returncode:
                out[name] = {"error": r.stderr[-1500:]}
                continue
            out[name] = json.loads(r.stdout.strip().splitlines()[-1])
            c = out[name]
            if "cuda_ready" in c:
                print(f"  {spec} {name}: gap {c['gap']:+.3f} s; CUDA started "
                      f"{c['cuda_start']:+.3f}, ready {c['cuda_ready']:+.3f} s from the call's "
                      f"start (cuInit {c['cuinit']:.3f}, context {c['context']:.3f}); the gap "
                      f"beyond CUDA's start {c['ours']:+.3f} s", flush=True)
            for i, ph in enumerate(c.get("phases", [])[:2]):
                print(f"  {spec} {name} call {i + 1} phases (s): {ph}", flush=True)
            for key, items in c.get("samples", {}).items():
                if key == "marks":
                    print(f"  {spec} {name} call 1 marks (s from its start): {items}")
                    continue
                if key == "spans":
                    print_spans(f"{spec} {name}", items)
                    continue
                print(f"  {spec} {name} call 1 - call 2, {key} (s): "
                      + "; ".join(f"{k} {v:+.3f}" for v, k in items), flush=True)
            print_child_memory(f"{spec} {name}", out[name])
    return out


# ----------------------------------------------------------------------------- main

def run_problem(name, spec, *, reps, subprocs, rank_cols=RANK_MAX_COLS,
                backend="gpu", cold=True, warm_runs=1, free_parent_pool=False,
                pool_ab=False, start_gpu=False, phases=False, rounds=0,
                sample_children=False, spans=False) -> dict:
    t0 = time.perf_counter()
    A = make(spec)
    A = sp.csc_array(A)
    A.sort_indices()
    b = rhs(A)
    row = {"problem": name, "spec": spec, "shape": list(A.shape), "nnz": int(A.nnz)}
    row.update(public_rows(A, b, reps, backend))
    row["engine"] = engine_rows(A, b, reps, backend)
    if rounds:
        row["interleaved"] = il = interleaved_rows(A, b, rounds, backend)
        print(f"  {name} interleaved, {rounds} rounds: lsqr again {il['lsqr_again']:.4f} s, "
              f"engine {il['factorize']:.4f} + {il['solve']:.4f} s: ratio {il['ratio']:.3f}",
              flush=True)
    if phases:
        row["phases"] = phases_rows(A, b, reps, backend)
        print_phases(name, row["phases"])
    row["lstsq_rank"] = lstsq_rank(A, rank_cols)
    if subprocs:
        row["new_process"] = new_process(spec, backend, cold=cold, warm_runs=warm_runs,
                                         free_parent_pool=free_parent_pool, pool_ab=pool_ab,
                                         start_gpu=start_gpu,
                                         sample_children=sample_children, spans=spans)
    row["bench_seconds"] = time.perf_counter() - t0
    return row


def verdicts(row) -> dict:
    out = {}
    tgt = FIRST_CALL_TARGETS.get(row["problem"])
    if tgt is not None and "lsqr_first" in row:
        out["first<=target"] = row["lsqr_first"] <= tgt
    if "engine" in row and "lsqr_again" in row:
        ref = row["engine"]["factorize"] + row["engine"]["solve"]
        row["again_over_engine"] = row["lsqr_again"] / ref if ref else None
        if "interleaved" in row:    # the same device state for both: the verdict's figure
            row["again_over_engine_separate"] = row["again_over_engine"]
            row["again_over_engine"] = row["interleaved"]["ratio"]
        out["again<=1.15x"] = row["again_over_engine"] <= REPEAT_RATIO
    np_ = row.get("new_process", {})
    gaps = [v["gap"] for k, v in np_.items() if k.startswith("warm_caches") and "gap" in v]
    if gaps:
        row["new_process_gap"] = statistics.median(gaps)
        out["newproc<=+0.3s"] = row["new_process_gap"] <= 0.3
    ours = [v["ours"] for k, v in np_.items() if k.startswith("warm_caches") and "cuda_ready" in v]
    if ours:        # the gap beyond CUDA's own start (reported, not a verdict)
        row["new_process_gap_beyond_cuda"] = statistics.median(ours)
        row["new_process_cuda_ready"] = statistics.median(
            v["cuda_ready"] for k, v in np_.items() if k.startswith("warm_caches")
            and "cuda_ready" in v)
    freed = [v["gap"] for k, v in np_.items() if k.startswith("freed_pool") and "gap" in v]
    if freed:
        row["new_process_gap_freed_pool"] = statistics.median(freed)
    early = [v["gap"] for k, v in np_.items() if k.startswith("start_gpu") and "gap" in v]
    if early:
        row["new_process_gap_start_gpu"] = statistics.median(early)
    if "cold" in np_ and "first" in np_["cold"]:
        out["cold<=5s"] = np_["cold"]["first"] <= 5.0
    if row.get("lstsq_rank") is not None and "qrf" in row:
        out["rank==lstsq"] = row["qrf"]["rank"] == row["lstsq_rank"]
    return out


def table(rows) -> str:
    head = (f"{'problem':<13}{'engine f+s':>11}{'new QRF (an+fac)':>20}{'rank dec':>9}"
            f"{'lsqr 1st':>9}{'again':>7}{'x eng':>6}{'proc cold':>10}{'proc gap':>10}"
            f"{'bwd err':>9}{'rank':>12}  verdicts")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['problem']:<13} error: {r['error'][:80]}")
            continue
        e = r["engine"]
        q = r["qrf"]
        ph = q["phases"]
        npc = r.get("new_process", {})

        def f(v, w=9, p=2):
            return f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
        cold = npc.get("cold", {}).get("first")
        warm = r.get("new_process_gap")
        rk = f"{q['rank']}/{r['lstsq_rank'] if r['lstsq_rank'] is not None else '-'}"
        v = " ".join(k for k, ok in r.get("verdicts", {}).items() if not ok)
        lines.append(
            f"{r['problem']:<13}{f(e['factorize'] + e['solve'], 11)}"
            f"{f(q['factorize'], 8)} ({f(ph.get('analyze'), 4)}+{f(ph.get('factorize'), 4)})"
            f"{f(ph.get('rank_decision'))}{f(r['lsqr_first'])}{f(r['lsqr_again'], 7)}"
            f"{f(r.get('again_over_engine'), 6)}{f(cold, 10)}{f(warm, 10, 3)}"
            f"{r['backward_error']:>9.1e}{rk:>12}  {('FAIL: ' + v) if v else 'ok'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer problems and repetitions")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--only", action="append", help="only these problems (repeatable)")
    p.add_argument("--no-subprocess", action="store_true",
                   help="skip the new-process rows")
    p.add_argument("--backend", default="gpu",
                   help="the backend of the public calls (default gpu; another one is a "
                        "dry run of this script, e.g. on a machine without a GPU)")
    p.add_argument("--max-grid", type=int, help="largest grid edge to run")
    p.add_argument("--subprocess-for", action="append",
                   help="new-process rows only for these problems (default: all; "
                        "--quick: ch7-8-b3 and grid40)")
    p.add_argument("--no-cold", action="store_true",
                   help="no cold process: the new processes use this run's caches (the "
                        "environment's CUPY_CACHE_DIR and store, filled by its own calls)")
    p.add_argument("--warm-runs", type=int, default=1,
                   help="new processes with warm caches per problem (the gap: median)")
    p.add_argument("--free-parent-pool", action="store_true",
                   help="give this process's cached CuPy pool blocks back before the new "
                        "processes start (else it holds them meanwhile, as a user's "
                        "process would)")
    p.add_argument("--parent-pool-ab", action="store_true",
                   help="after the warm-cache processes (this process's pool held), give "
                        "the pool back and run as many again (the A/B of what the parent "
                        "holds)")
    p.add_argument("--start-gpu", action="store_true",
                   help="after the warm-cache processes, as many again that call "
                        "scipy_gpuqr.start_gpu() at the script's top (reported apart)")
    p.add_argument("--spans", action="store_true",
                   help="new processes: their first call's steps timed where they run "
                        "(threads, imports, module loads, uploads, pinned buffers, store)")
    p.add_argument("--sample-children", action="store_true",
                   help="the new processes sample their main and prefetch threads in calls 1 "
                        "and 2 and report the first call's excess per frame")
    p.add_argument("--rounds", type=int, default=0,
                   help="also take the repeated lsqr call and the engine's factorization + "
                        "solve in turn, this many rounds (medians; the ratio's verdict then "
                        "comes from these)")
    p.add_argument("--phases", action="store_true",
                   help="where lsqr's first and repeated calls spend their time: phases, the "
                        "engine's split, the main thread sampled (on a copy of A with its rows "
                        "reversed, after the rows above)")
    p.add_argument("--rank-cols", type=int,
                   help="lstsq's rank (dense SVD) only up to this many columns "
                        f"(default {RANK_MAX_COLS}, --quick 5000; 0: none)")
    p.add_argument("--reps", type=int, help="repetitions of the warm calls (default 3, "
                                             "--quick 2)")
    a = p.parse_args(argv)
    import scipy_gpuqr as sg
    from scipy_gpuqr._gpu import gpu_info
    gi = gpu_info()
    if not gi.get("available") and a.backend == "gpu":
        print(f"no GPU: {gi.get('reason')}")
        return 1
    reps = a.reps or (2 if a.quick else 3)
    sub_for = set(a.subprocess_for or (("ch7-8-b3", "grid40") if a.quick else ()))
    # the process warm on another matrix: kernels loaded, nothing of the problems kept
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    W = grid3d_least_squares(12)
    t = time.perf_counter()
    sg.lsqr(W, rhs(W), backend=a.backend)
    warmup = time.perf_counter() - t
    rows = []
    skip_grids = False
    for name, spec in problems(a.quick):
        if a.only and name not in a.only or (skip_grids and name.startswith("grid")):
            continue
        subprocs = not a.no_subprocess and (not sub_for or name in sub_for)
        if a.max_grid and name.startswith("grid") and int(name[4:]) > a.max_grid:
            continue
        try:
            row = run_problem(name, spec, reps=reps, subprocs=subprocs,
                              rank_cols=(a.rank_cols if a.rank_cols is not None
                                         else 5000 if a.quick else RANK_MAX_COLS),
                              backend=a.backend, cold=not a.no_cold, warm_runs=a.warm_runs,
                              free_parent_pool=a.free_parent_pool,
                              pool_ab=a.parent_pool_ab, start_gpu=a.start_gpu,
                              phases=a.phases, rounds=a.rounds,
                              sample_children=a.sample_children, spans=a.spans)
        except Exception as exc:  # noqa: BLE001 - a row says what failed, the run goes on
            row = {"problem": name, "spec": spec, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {row['error']}", flush=True)
            rows.append(row)
            if name.startswith("grid") and ("memory" in row["error"].lower()):
                skip_grids = True       # a larger grid will not fit either
            continue
        row["verdicts"] = verdicts(row)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    out = {"device": gi.get("name"), "backend": a.backend, "warmup_seconds": warmup,
           "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    print(f"\ndevice: {gi.get('name')}; process warm-up (grid 12³ lsqr, compiles): "
          f"{warmup:.2f} s")
    print(table(rows))
    for r in rows:
        if "new_process_gap_beyond_cuda" in r:
            print(f"{r['problem']}: new process, warm caches: CUDA ready "
                  f"{r['new_process_cuda_ready']:+.3f} s from the first call's start; the gap "
                  f"beyond it {r['new_process_gap_beyond_cuda']:+.3f} s (medians)")
        if "new_process_gap_start_gpu" in r:
            print(f"{r['problem']}: new process with scipy_gpuqr.start_gpu() at the script's "
                  f"top: gap {r['new_process_gap_start_gpu']:+.3f} s (not in the verdicts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
