"""Symbolic analysis time per phase, cold, and the cost of a cache hit (CPU only).

Measures :func:`scipy_gpuqr._symbolic.analyze` on the issue's problems that
fit a small host: ch7-8-b3 (the chessboard complex, 58800×11760), the 3-D
grid 40³ least squares problem (128000×64000) and a random 40000×8000 least
squares problem (density 0.001, seed 1). lp_nug20ᵀ is not generated here.

Phases are timed by wrapping the functions ``analyze`` calls (the names in
:mod:`scipy_gpuqr._symbolic.analysis` and :mod:`scipy_gpuqr._symbolic.counts`),
so the same measure applies to any tree that keeps those names:

* canonical: ``canonical_csc`` (the CSC copy, duplicates summed, sorted);
* singletons: ``find_singletons``, ``leading_singletons``;
* ordering: ``column_ordering`` (COLAMD by default);
* etree: ``leftmost_columns``, ``column_etree``, ``postorder``, ``_relabel``;
* counts: ``column_counts`` (the column counts of R);
* fronts: ``fundamental_supernodes``, ``relaxed_amalgamation``;
* maps: ``build_fronts`` (column lists, staircases, assembly maps);
* work: ``front_work``, ``factor_peak_bytes``, ``gpu_front_bytes``;
* staging: ``plan_stages``;
* glue: the rest of ``analyze`` (permuting the pattern, the singleton block).

A wrapped function called inside another is counted in the outer one only.
Times are CPU seconds of this process (``time.process_time``; the analysis is
single-threaded, so this is what one core spends even on a loaded host),
the minimum over ``--repeat`` runs per phase and of the total; every run is
cold (the analysis cache bypassed). ``memory`` is the wall time of
``analyze`` when the analysis is in the per-process cache (median of 20),
``disk`` that of a call that finds it only on disk, as a new process does
(the per-process table cleared, the file in the page cache; median of 5).

``--base DIR`` measures, interleaved in the same process, an older tree
unpacked as ``DIR/scipy_gpuqr_base`` (``git archive COMMIT scipy_gpuqr | tar
-x -C DIR && mv DIR/scipy_gpuqr DIR/scipy_gpuqr_base``): the host's speed
drifts too much between processes to compare otherwise.

``--new-process-hit N``: also the first ``analyze`` of N new processes that
find the analysis on disk (what a new process's first call pays for it: the
key's first computation, the file mapped and checked).

Usage: ``PYTHONPATH=. python3 bench/analysis.py [--repeat 5] [--base DIR]
[--only grid40] [--new-process-hit 3]``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time

PHASES = {
    "canonical": ("canonical_csc",),
    "singletons": ("find_singletons", "leading_singletons"),
    "ordering": ("column_ordering",),
    "etree": ("leftmost_columns", "column_etree", "postorder", "_relabel"),
    "counts": ("column_counts",),
    "fronts": ("fundamental_supernodes", "relaxed_amalgamation"),
    "maps": ("build_fronts",),
    "work": ("front_work", "factor_peak_bytes", "gpu_front_bytes"),
    "staging": ("plan_stages",),
}
COLUMNS = list(PHASES) + ["glue", "total"]


def problems():
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               random_least_squares)
    return {
        "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
        "grid40": lambda: grid3d_least_squares(40),
        "rand40000x8000": lambda: random_least_squares(40000, 8000, 0.001, seed=1),
    }


class _Timer:
    """Wraps the phase functions of one package's analysis module."""

    def __init__(self, pkg: str):
        self.analysis = importlib.import_module(f"{pkg}._symbolic.analysis")
        self.counts = importlib.import_module(f"{pkg}._symbolic.counts")
        self.acc: dict = {}
        self.depth = 0
        self.saved = []

    def _wrap(self, phase, fn):
        def timed(*a, **k):
            if self.depth:
                return fn(*a, **k)
            self.depth += 1
            t = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.acc[phase] = self.acc.get(phase, 0.0) + time.process_time() - t
                self.depth -= 1
        return timed

    def __enter__(self):
        for phase, names in PHASES.items():
            for name in names:
                for mod in (self.analysis, self.counts):
                    fn = getattr(mod, name, None)
                    if fn is not None and (mod is self.analysis or phase == "work"):
                        self.saved.append((mod, name, fn))
                        setattr(mod, name, self._wrap(phase, fn))
                        break
        return self

    def __exit__(self, *exc):
        for mod, name, fn in reversed(self.saved):
            setattr(mod, name, fn)
        self.saved = []

    def run(self, A) -> dict:
        """One cold analysis: CPU seconds per phase."""
        self.acc = {}
        kw = {"cache": False} if "cache" in _params(self.analysis.analyze) else {}
        w = time.perf_counter()
        t = time.process_time()
        self.analysis.analyze(A, **kw)
        total = time.process_time() - t
        out = {p: self.acc.get(p, 0.0) for p in PHASES}
        out["glue"] = total - sum(out.values())
        out["total"] = total
        out["wall"] = time.perf_counter() - w
        return out


def _native_status(pkg: str) -> str:
    """The tree's compiled analysis helpers: loaded, unavailable, or none in that tree."""
    try:
        mod = importlib.import_module(f"{pkg}._symbolic.native")
    except ImportError:
        return "no compiled helpers"
    return mod.status()


def _wait_for_native(pkg: str) -> None:
    """Let a tree with compiled helpers finish building them before timing (what a
    process pays once per machine and source, not per analysis)."""
    try:
        mod = importlib.import_module(f"{pkg}._symbolic.native")
    except ImportError:
        return
    if mod.mode() != "numpy":
        mod._LOADER.get(True)


def _params(fn):
    import inspect
    return inspect.signature(fn).parameters


def _table(rows):
    head = f"{'problem':16s} {'tree':5s} " + " ".join(f"{c:>10s}" for c in COLUMNS)
    print(head)
    print("-" * len(head))
    for (name, tree), best in rows:
        print(f"{name:16s} {tree:5s} " + " ".join(f"{best[c]:10.4f}" for c in COLUMNS))


def _hit_cost(A) -> tuple:
    """Wall seconds of a memory hit (median of 20) and of a disk hit (median of 5);
    the disk entries go to a temporary folder (the user's is never touched)."""
    import os
    from scipy_gpuqr._symbolic import analysis_cache, analyze
    old = os.environ.get("SCIPY_GPUQR_SCHEDULE_CACHE")
    mem, disk = [], []
    try:
        os.environ["SCIPY_GPUQR_SCHEDULE_CACHE"] = "off"
        analysis_cache.clear()
        analyze(A)
        for _ in range(20):
            t = time.perf_counter()
            analyze(A)
            mem.append(time.perf_counter() - t)
        with tempfile.TemporaryDirectory() as d:
            os.environ["SCIPY_GPUQR_SCHEDULE_CACHE"] = d
            analysis_cache.clear()
            analyze(A)
            analysis_cache.flush()
            for _ in range(5):
                analysis_cache.clear()
                t = time.perf_counter()
                analyze(A)
                disk.append(time.perf_counter() - t)
    finally:
        if old is None:
            os.environ.pop("SCIPY_GPUQR_SCHEDULE_CACHE", None)
        else:
            os.environ["SCIPY_GPUQR_SCHEDULE_CACHE"] = old
        analysis_cache.clear()
    return statistics.median(mem), statistics.median(disk)


_FIRST_HIT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from analysis import problems
A = problems()[sys.argv[1]]()
from scipy_gpuqr._symbolic import analysis_cache, analyze
t = time.perf_counter()
an = analyze(A)
first = time.perf_counter() - t
t = time.perf_counter()
analyze(A)
print(json.dumps({"first": first, "second": time.perf_counter() - t,
                  "hit": "cache" in an.timings}))
analysis_cache.flush()
"""


def first_hit_in_new_process(name: str, procs: int = 3) -> list:
    """Wall seconds of the first ``analyze`` of a new process that finds the
    analysis on disk (its imports and the matrix apart: what a new process's
    first call pays), in ``procs`` processes after one that wrote it; the
    entries go to a temporary folder."""
    import json
    import os
    import subprocess
    from pathlib import Path
    here = str(Path(__file__).resolve().parent)
    out = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SCIPY_GPUQR_SCHEDULE_CACHE=d)
        for i in range(procs + 1):
            r = subprocess.run([sys.executable, "-c", _FIRST_HIT, name, here], env=env,
                               capture_output=True, text=True, timeout=300, check=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])
            if i:
                assert got["hit"], "the new process did not find the analysis on disk"
                out.append(got["first"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--base", help="folder holding an older tree as scipy_gpuqr_base")
    ap.add_argument("--only", nargs="*", help="problem names")
    ap.add_argument("--no-hit", action="store_true", help="skip the cache-hit measure")
    ap.add_argument("--new-process-hit", type=int, default=0, metavar="PROCS",
                    help="also the first (disk) hit of that many new processes")
    args = ap.parse_args(argv)
    trees = [("new", "scipy_gpuqr")]
    if args.base:
        sys.path.insert(0, args.base)
        trees.append(("base", "scipy_gpuqr_base"))
    timers = {tree: _Timer(pkg) for tree, pkg in trees}
    rows = []
    totals: dict = {}
    hits = {}
    first_hits = {}
    for name, make in problems().items():
        if args.only and name not in args.only:
            continue
        A = make()
        best = {tree: {c: float("inf") for c in COLUMNS} for tree, _ in trees}
        for tree, pkg in trees:                       # untimed: imports, compiled helpers
            _wait_for_native(pkg)
            with timers[tree] as tm:
                tm.run(A)
        for _ in range(args.repeat):
            for tree, _ in trees:                     # interleaved
                with timers[tree] as tm:
                    got = tm.run(A)
                for c in COLUMNS:
                    best[tree][c] = min(best[tree][c], got[c])
                totals.setdefault((name, tree), []).append((got["total"], got["wall"]))
        rows += [((f"{name}", tree), best[tree]) for tree, _ in trees]
        print(f"{name}: {A.shape[0]}x{A.shape[1]}, nnz {A.nnz}", flush=True)
        if not args.no_hit:
            hits[name] = _hit_cost(A)
        if args.new_process_hit:
            hits.setdefault(name, None)
            first_hits[name] = first_hit_in_new_process(name, args.new_process_hit)
    print("\ncold analysis, CPU seconds per phase (minimum of "
          f"{args.repeat}; total: minimum of the totals)")
    _table(rows)
    print(f"\ncold analysis, whole call: median of {args.repeat} (CPU s / wall s), "
          "compiled helpers per tree")
    for (name, tree), got in totals.items():
        cpu = statistics.median(g[0] for g in got)
        wall = statistics.median(g[1] for g in got)
        print(f"{name:16s} {tree:5s} cpu {cpu:8.4f}   wall {wall:8.4f}   "
              f"{_native_status(dict(trees)[tree])}")
    if hits:
        print("\ncache hit, wall time (memory: median of 20; disk, the per-process table "
              "cleared: median of 5)")
        for name, got in hits.items():
            if got is not None:
                mem, disk = got
                print(f"{name:16s} memory {mem * 1e3:7.2f} ms   disk {disk * 1e3:7.2f} ms")
    if first_hits:
        print("\nfirst analyze() of a new process, found on disk (wall ms, one per process)")
        for name, secs in first_hits.items():
            print(f"{name:16s} " + "  ".join(f"{v * 1e3:7.2f}" for v in secs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
