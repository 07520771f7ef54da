#!/usr/bin/env python3
"""Where a repeated public ``lsqr`` call spends its time beyond the engine (issue 16).

    python bench/call_phases.py SPEC [SPEC ...] [--reps 5] [--backend gpu] [--after]

SPEC as ``bench/end_to_end.py``'s ``make`` takes it (``grid:24``, ``ch:7,8,3``,
``rand:40000,8000,0.0008,200,2``, ...). Per problem, in one process:

* the engine's warm factorization and solve (``end_to_end.engine_rows``);
* ``lsqr(A, b, backend=...)`` repeated ``--reps`` times (after two untimed
  calls) with the device synchronized around each phase of the call
  (validation, the plan, the factorization, the rank decision, the solves,
  the norms, the release), medians per phase: the phases' sum is the call's
  time with those synchronizations, which the table gives beside the engine's;
* ``--first``: before all that, the first ``lsqr`` call on the pattern (the
  process warm on the specs before it, or on grid 12³) with its phases;
  ``--profile`` adds a cProfile of another such call (timed apart, on a copy
  of the matrix whose pattern is new to the process: its rows reversed);
* ``--after``: the engine's factorization timed right after another
  factorization, right after an ``lsqr`` call, after an ``lsqr`` call and
  0.5 s of sleep: what a call leaves running (e.g. BLAS worker threads
  spinning after a host dot product) shows as a slower next factorization;
* ``--versus``: the public factorization (``QRFactorization``) and the
  engine's (``gpu_factorize`` with an analysis of its own, as
  ``end_to_end.engine_rows`` times it, and with the plan's analysis)
  interleaved, ``--reps`` rounds: per kind the median wall time of the call
  and of its release (``free`` and the last reference dropped), the engine's
  own ``info['seconds']`` and its device layer's ``seconds``, the time the
  cyclic collector ran, CuPy's allocations from the driver and the pinned
  buffers made (count, bytes, seconds), the process's resident memory.

The wrapped phases are module attributes and methods replaced for the run
(``_wrap``); nested phases overlap (a phase's time includes those it calls).
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))
sys.path.append(str(ROOT / "bench"))

#: (module, attribute, label) of the phases timed; methods as "Class.method".
PHASES = (
    ("scipy_gpuqr._api.lsqr", "check_problem", "validate"),
    ("scipy_gpuqr._api.lsqr", "start_problem", "start (norms of b)"),
    ("scipy_gpuqr._api.lsqr", "solve_least_squares", "QR path, whole"),
    ("scipy_gpuqr._api.lsqr", "_release", "release"),
    ("scipy_gpuqr._factor.factored", "plan_for", "plan"),
    ("scipy_gpuqr._factor.factored", "FactoredQR._run", "factorize"),
    ("scipy_gpuqr._factor.factored", "FactoredQR.least_squares", "least squares (host b)"),
    ("scipy_gpuqr._factor.factored", "FactoredQR._fused_probe_solve", "fused QᵀB + probe solve"),
    ("scipy_gpuqr._factor.factored", "FactoredQR.rank_decision", "rank decision"),
    ("scipy_gpuqr._factor.factored", "FactoredQR.device_least_squares", "device solve"),
    ("scipy_gpuqr._factor.factored", "FactoredQR._qt_rows", "host QᵀB"),
    ("scipy_gpuqr._factor.least_squares", "damped_norms", "residual norms"),
    ("scipy_gpuqr._factor.lstsq", "NullspaceCOD", "null-space COD"),
    ("scipy_gpuqr._factor.lstsq", "probe_norm", "full-rank probe"),
)


def _sync_fn(backend: str):
    if backend != "gpu":
        return lambda: None
    import cupy as cp
    return lambda: cp.cuda.Device().synchronize()


def _wrap(totals: dict, sync, module: str, attr: str, label: str) -> bool:
    """Replace ``module.attr`` (or a method ``Class.method``) by a timed,
    synchronized copy adding to ``totals[label]``; False where it is absent."""
    import importlib
    owner = importlib.import_module(module)
    *cls, name = attr.split(".")
    for c in cls:
        owner = getattr(owner, c, None)
    f = getattr(owner, name, None) if owner is not None else None
    if f is None:
        return False

    @functools.wraps(f)
    def timed_phase(*args, **kwargs):
        sync()
        t = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            sync()
            totals[label] += time.perf_counter() - t
    setattr(owner, name, timed_phase)
    return True


def after_rows(A, b, analysis, sync, reps: int) -> dict:
    """The engine's factorization right after: another one, an lsqr call, an lsqr
    call and 0.5 s of sleep (medians, seconds)."""
    import scipy_gpuqr as sg
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    before = {"after a factorization": lambda: gpu_factorize(A, analysis).free(),
              "after an lsqr call": lambda: sg.lsqr(A.copy(), b, backend="gpu"),
              "after lsqr + 0.5 s": lambda: (sg.lsqr(A.copy(), b, backend="gpu"),
                                             time.sleep(0.5))}
    out = {}
    for label, fn in before.items():
        ts = []
        for _ in range(reps):
            fn()
            sync()
            t = time.perf_counter()
            gpu_factorize(A, analysis).free()
            sync()
            ts.append(time.perf_counter() - t)
        out[label] = statistics.median(ts)
    return out


class _Counters:
    """What a call costs beside its phases: the cyclic collector's seconds
    (``gc.callbacks``), CuPy's allocations from the driver (a memory hook on
    this thread: count, bytes, seconds) and ``cupyx.empty_pinned``'s buffers
    (count, bytes, seconds: a pool hit or a new page-locked allocation)."""

    def __init__(self):
        import gc
        import cupy as cp
        import cupyx
        self.gc, self.cp, self.cupyx = gc, cp, cupyx
        self.values = collections.defaultdict(float)
        self._gc_t0 = None
        counters = self

        class _Hook(cp.cuda.MemoryHook):
            name = "call_phases"

            def alloc_preprocess(self, **kw):
                self.t0 = time.perf_counter()

            def alloc_postprocess(self, **kw):
                counters.values["driver allocs"] += 1
                counters.values["driver alloc GB"] += kw.get("mem_size", 0) / 1e9
                counters.values["driver alloc s"] += time.perf_counter() - self.t0

        self.hook = _Hook()
        self._pinned = cupyx.empty_pinned

        @functools.wraps(self._pinned)
        def pinned(shape, dtype=float, *args, **kwargs):
            t = time.perf_counter()
            out = self._pinned(shape, dtype, *args, **kwargs)
            self.values["pinned bufs"] += 1
            self.values["pinned GB"] += out.nbytes / 1e9
            self.values["pinned s"] += time.perf_counter() - t
            return out
        self.pinned = pinned

    def _on_gc(self, phase, info):
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self.values["gc s"] += time.perf_counter() - self._gc_t0
            self.values["gc runs"] += 1
            self._gc_t0 = None

    def __enter__(self):
        self.values.clear()
        self.gc.callbacks.append(self._on_gc)
        self.cupyx.empty_pinned = self.pinned
        self.hook.__enter__()
        return self

    def __exit__(self, *exc):
        self.hook.__exit__(*exc)
        self.cupyx.empty_pinned = self._pinned
        self.gc.callbacks.remove(self._on_gc)
        return False


def _rss_gb() -> float:
    """The process's resident memory (GB; 0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096 / 1e9
    except OSError:
        return 0.0


def versus_rows(A, b, plan_analysis, sync, reps: int) -> dict:
    """``--versus``: per kind (public, engine, engine with the plan's analysis) a
    list of per-call dicts, the kinds interleaved round by round."""
    import scipy_gpuqr as sg
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    own = analyze(A)
    pool = __import__("cupy").get_default_memory_pool()

    def public():
        F = sg.QRFactorization(A.copy(), backend="gpu")
        return F, F._core.num, F.free

    def engine(an):
        def run():
            g = gpu_factorize(A, an)
            return g, g, g.free
        return run

    kinds = {"public": public, "engine": engine(own), "engine, plan's analysis":
             engine(plan_analysis)}
    out = {k: [] for k in kinds}
    for _ in range(reps):
        for kind, fn in kinds.items():
            row = {"pool used GB before": pool.used_bytes() / 1e9,
                   "pool cached GB before": pool.free_bytes() / 1e9, "rss GB before": _rss_gb()}
            with _Counters() as c:
                sync()
                t = time.perf_counter()
                obj, num, free = fn()
                sync()
                row["call"] = time.perf_counter() - t
                info = num.info
                dev = getattr(num, "_device", None)
                row["device seconds"] = dict(getattr(dev, "seconds", {}) or {})
                t = time.perf_counter()
                free()
                del obj, num, free, dev
                sync()
                row["release"] = time.perf_counter() - t
            row.update(c.values)
            row["rss GB after"] = _rss_gb()
            row["seconds"] = dict(info.get("seconds", {}))
            for key in ("stages", "schedule_cold", "r_copy_progressive", "r_copy_stages",
                        "stage_seconds", "restaged"):
                row[key] = info.get(key)
            row["available GB"] = (info.get("memory", {}).get("available") or 0) / 1e9
            row["limited_by"] = info.get("memory", {}).get("limited_by")
            out[kind].append(row)
    return out


def print_versus(spec: str, rows: dict) -> None:
    """The medians of :func:`versus_rows` side by side (ms, counts, GB), then every
    call's stage facts."""
    kinds = list(rows)
    keys = []
    for kind in kinds:
        for r in rows[kind]:
            for k, v in list(r.items()) + [(f"dev {k}", v) for k, v in
                                          r.get("device seconds", {}).items()] + [
                    (f"sec {k}", v) for k, v in r.get("seconds", {}).items()]:
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in keys:
                    keys.append(k)

    def value(r, k):
        if k.startswith("dev "):
            return r.get("device seconds", {}).get(k[4:])
        if k.startswith("sec "):
            return r.get("seconds", {}).get(k[4:])
        return r.get(k)
    print(f"== {spec}: public against engine factorizations, interleaved, medians "
          f"(seconds as ms)")
    print(f"   {'':30s}" + "".join(f"{k[:24]:>26s}" for k in kinds))
    for k in keys:
        cells = []
        for kind in kinds:
            vs = [value(r, k) for r in rows[kind]]
            vs = [v for v in vs if isinstance(v, (int, float))]
            if not vs:
                cells.append(f"{'-':>26s}")
                continue
            v = statistics.median(vs)
            scale = 1e3 if (k in ("call", "release") or k.startswith(("dev ", "sec "))
                            or k.endswith(" s")) else 1
            cells.append(f"{v * scale:>26.2f}")
        print(f"   {k[:30]:30s}" + "".join(cells))
    for kind in kinds:
        for i, r in enumerate(rows[kind]):
            print(f"   {kind} #{i}: stages {r['stages']} cold {r['schedule_cold']} progressive "
                  f"{r['r_copy_progressive']} R copy {r['r_copy_stages']} stage s "
                  f"{r['stage_seconds']} available {r['available GB']:.1f} GB "
                  f"({r['limited_by']}) call {r['call'] * 1e3:.0f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--after", action="store_true", help="the next factorization's time")
    ap.add_argument("--first", action="store_true", help="the first call's phases too")
    ap.add_argument("--versus", action="store_true",
                    help="the public factorization against the engine's, per phase")
    ap.add_argument("--profile", action="store_true",
                    help="with --first: a cProfile of a first call on a new pattern")
    a = ap.parse_args()
    import scipy_gpuqr as sg
    from end_to_end import engine_rows, make, rhs
    sync = _sync_fn(a.backend)
    totals = collections.defaultdict(float)
    if a.first:
        W = make("grid:12")
        sg.lsqr(W, rhs(W), backend=a.backend)
    for spec in a.specs:
        A = make(spec)
        b = rhs(A)
        if a.first:
            wrapped = [p for p in PHASES if _wrap(totals, sync, *p)]
            totals.clear()
            sync()
            t = time.perf_counter()
            sg.lsqr(A.copy(), b, backend=a.backend)
            sync()
            first = time.perf_counter() - t
            _unwrap(wrapped)
            print(f"== {spec}: first lsqr call on the pattern, phases synchronized: "
                  f"{first * 1e3:.1f} ms")
            for label, v in sorted(totals.items(), key=lambda kv: -kv[1]):
                print(f"   {label:28s} {v * 1e3:8.2f} ms")
            if a.profile:
                _profile_first(sg, A, b, a.backend)
        eng = engine_rows(A, b, a.reps, backend=a.backend)
        F = sg.QRFactorization(A.copy(), backend=a.backend)
        analysis = F._core.plan.analysis
        F.free()
        if a.versus and a.backend == "gpu":
            print_versus(spec, versus_rows(A, b, analysis, sync, a.reps))
        if a.after and a.backend == "gpu":
            for label, t in after_rows(A, b, analysis, sync, max(a.reps - 1, 2)).items():
                print(f"{spec}: engine factorization {label}: {t * 1e3:.1f} ms")
        wrapped = [p for p in PHASES if _wrap(totals, sync, *p)]
        for _ in range(2):
            sg.lsqr(A.copy(), b, backend=a.backend)
        rows, calls = collections.defaultdict(list), []
        for _ in range(a.reps):
            totals.clear()
            A1 = A.copy()
            sync()
            t = time.perf_counter()
            sg.lsqr(A1, b, backend=a.backend)
            sync()
            calls.append(time.perf_counter() - t)
            for label, v in totals.items():
                rows[label].append(v)
        _unwrap(wrapped)
        es = eng["factorize"] + eng["solve"]
        call = statistics.median(calls)
        print(f"== {spec}: engine factorize {eng['factorize'] * 1e3:.1f} ms + solve "
              f"{eng['solve'] * 1e3:.1f} ms = {es * 1e3:.1f} ms; lsqr with phases synchronized "
              f"{call * 1e3:.1f} ms ({call / es:.2f}x)")
        for label in sorted(rows, key=lambda k: -statistics.median(rows[k])):
            print(f"   {label:28s} {statistics.median(rows[label]) * 1e3:8.2f} ms")
    return 0


def _profile_first(sg, A, b, backend: str) -> None:
    """cProfile of a first ``lsqr`` call on a pattern: A's rows reversed (a new
    pattern to the process's caches, the same problem's size and work), the
    functions by their own time and by their cumulative time."""
    import cProfile
    import io
    import pstats
    import scipy.sparse as sp
    Ar = sp.csc_array(A[::-1])
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    sg.lsqr(Ar, b[::-1].copy(), backend=backend)
    pr.disable()
    print(f"   profiled first call (rows reversed): {(time.perf_counter() - t) * 1e3:.1f} ms")
    for key, count in (("tottime", 25), ("cumulative", 40)):
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats(key).print_stats(count)
        print(out.getvalue())


def _unwrap(wrapped) -> None:
    """Put the wrapped phases' originals back."""
    import importlib
    for module, attr, _ in wrapped:
        owner = importlib.import_module(module)
        *cls, name = attr.split(".")
        for c in cls:
            owner = getattr(owner, c)
        setattr(owner, name, getattr(owner, name).__wrapped__)


if __name__ == "__main__":
    sys.exit(main())
