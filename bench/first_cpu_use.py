#!/usr/bin/env python3
"""A new process' first SuiteSparseQR use, two trees side by side (issues 15/16).

    python bench/first_cpu_use.py BASE_TREE NEW_TREE [ROUNDS]   (ONLY=lsqr: one test)

Per tree, in new processes (``PYTHONPATH`` = the tree, one BLAS thread), rounds
interleaved across trees and cache folders: the import of ``_cpu.spqr`` and
the first ``spqr_available()``, then the first ``lsqr(A, b, backend='cpu')``
on adder_dcop_05 (its modules imported before the clock starts). Cache
folders (``SCIPY_GPUQR_CACHE_DIR``): ``warm`` (one folder per tree, used once
before), ``cold`` (a new empty folder per process) and, for NEW_TREE,
``none`` (a folder that cannot be made). Prints medians in ms, whether
pycparser was imported, and the first 12 hex digits of the answer's SHA-256.
"""
import os
import statistics
import subprocess
import sys
import tempfile

AVAIL = r"""
import time, sys
t0 = time.perf_counter()
from scipy_gpuqr._cpu.spqr import spqr_available
t1 = time.perf_counter()
ok, why = spqr_available()
t2 = time.perf_counter()
assert ok, why
print((t1 - t0) * 1e3, (t2 - t1) * 1e3, int('pycparser' in sys.modules))
"""
LSQR = r"""
import time, sys, hashlib
import numpy as np, scipy.io, scipy_gpuqr
A = scipy.io.mmread(sys.argv[1]).tocsc()
b = np.cos(np.arange(A.shape[0]))
lsqr = scipy_gpuqr.lsqr
from scipy_gpuqr._factor import least_squares   # the call's modules, imported before timing
t1 = time.perf_counter()
x = lsqr(A, b, backend='cpu')[0]
t2 = time.perf_counter()
digest = hashlib.sha256(np.asarray(x).tobytes()).hexdigest()[:12]
print(0.0, (t2 - t1) * 1e3, int('pycparser' in sys.modules), digest)
"""


def one(tree, code, cache, *args):
    # the tree first; the rest of the caller's path after it (where the dependencies
    # are installed, e.g. cffi in a folder of PYTHONPATH)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree] + rest),
               SCIPY_GPUQR_CACHE_DIR=cache, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                         capture_output=True, text=True,
                         cwd=tempfile.gettempdir()).stdout.split()   # not a tree's cwd
    return float(out[0]), float(out[1]), out[2], out[3] if len(out) > 3 else ""


def main(base, new, rounds):
    mtx = os.path.join(new, "tests/data/matrices/adder_dcop_05.mtx")
    warm = {t: tempfile.mkdtemp(prefix="s1warm-") for t in ("base", "new")}
    trees = {"base": base, "new": new}
    blocked = os.path.join(tempfile.mkdtemp(prefix="s1none-"), "file")
    open(blocked, "w").close()
    blocked = os.path.join(blocked, "cache")     # cannot be created: the in-line fallback
    for name, code, args in (("spqr_available", AVAIL, ()), ("lsqr adder_dcop_05", LSQR, (mtx,))):
        if os.environ.get("ONLY") and os.environ["ONLY"] not in name:
            continue
        for t in trees:                       # warm the warm folders
            one(trees[t], code, warm[t], *args)
        res = {}
        for _ in range(rounds):
            for t in trees:
                for kind in ("warm", "cold") + (("none",) if t == "new" else ()):
                    cache = (warm[t] if kind == "warm" else blocked if kind == "none"
                             else tempfile.mkdtemp(prefix="s1cold-"))
                    res.setdefault((t, kind), []).append(one(trees[t], code, cache, *args))
        print(f"\n{name}: medians of {rounds} new processes (ms)")
        print(f"{'tree':5} {'cache':5} {'import':>7} {'call':>7} {'min call':>8} pycparser answer")
        for (t, kind), rows in res.items():
            imp = statistics.median(r[0] for r in rows)
            call = statistics.median(r[1] for r in rows)
            print(f"{t:5} {kind:5} {imp:7.1f} {call:7.1f} {min(r[1] for r in rows):8.1f} "
                  f"{'/'.join(sorted({r[2] for r in rows})):9} "
                  f"{'/'.join(sorted({r[3] for r in rows}))}")


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]),
         int(sys.argv[3]) if len(sys.argv) > 3 else 9)
