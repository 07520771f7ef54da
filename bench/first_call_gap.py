#!/usr/bin/env python3
"""The new-process gap of two trees, their processes alternated (issue 16).

    python bench/first_call_gap.py SPEC REPS NAME=TREE:STORE [NAME=TREE:STORE ...]
        [--json out.json]

Run from a tree whose ``bench/end_to_end.py`` has the ``spans`` child (this
one). Each rep starts one new process per tree, in turn (the order reversed
every other rep, so that neither tree always follows the other), each the
child of ``bench/end_to_end.py --subprocess-for`` with ``spans``: the problem
``SPEC`` (``ch:7,8,3``, ``qap:20:T``, ``grid:40``, ...) made, ``from scipy_gpuqr
import lsqr``, three ``lsqr(A, b, backend='gpu')`` calls; the gap is the first
call less the faster of the other two. ``TREE`` is the root of the tree the
child imports; ``STORE`` its analysis/plan store
(``SCIPY_GPUQR_SCHEDULE_CACHE``), which that tree's own earlier calls on the
problem filled (warm caches: ``bench/end_to_end.py --only ... --no-subprocess``
with the same store first). The kernel cache is the environment's.

Per process: first call, warm call, gap, CUDA ready (``cuInit`` and the
primary context on the package's driver thread, from the call's start), the
gap beyond it, the pinned buffers the first call made (MB, seconds), NVRTC's
runs of an empty file, the CUDA libraries' imports (seconds summed over their
threads); for the second rep of each tree the first call's steps where they
ran (:func:`end_to_end.print_spans`). Last, per tree: medians and the gap's
range. Issue 16's target: a gap of at most 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import end_to_end as e2e  # noqa: E402  (this folder's bench module)


def child(spec: str, root: str, store: str) -> dict:
    """One new process of tree ``root`` with the store ``store``: its numbers and spans."""
    env = dict(os.environ, SCIPY_GPUQR_SCHEDULE_CACHE=store)
    p = subprocess.run([sys.executable, "-c", e2e._CHILD, spec, os.path.abspath(root), "gpu",
                        "spans"], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode:
        return {"error": p.stderr[-800:]}
    c = json.loads(p.stdout.strip().splitlines()[-1])
    sp = c.get("samples", {}).get("spans", [])
    pinned = [s for s in sp if s[3] == "pinned buffer"]
    nvrtc = [s for s in sp if s[3].startswith("NVRTC")]
    libs = [s for s in sp if s[3].startswith("import cup")]
    first = min((s[0] for s in sp if s[3] == "device.begin_stage"), default=None)
    row = {k: c.get(k) for k in ("first", "second", "third", "gap", "cuda_ready", "ours")}
    row.update(pinned_mb=sum(s[4] or 0 for s in pinned) / 2**20,
               pinned_s=sum(s[1] for s in pinned), begin_stage_at=first,
               nvrtc_runs=len(nvrtc),
               nvrtc_s=sum(s[1] for s in nvrtc), libraries_s=sum(s[1] for s in libs),
               phases=c.get("phases", [])[:2], spans=sp)
    return row


def summary(rows: list) -> str:
    def med(k):
        return statistics.median([r[k] for r in rows if r.get(k) is not None] or [0.0])
    gaps = [r["gap"] for r in rows]
    return (f"n={len(rows)} first {med('first'):.3f} gap {med('gap'):+.3f} "
            f"[{min(gaps):+.3f}, {max(gaps):+.3f}] CUDA ready {med('cuda_ready'):.3f} "
            f"beyond it {med('ours'):+.3f}; pinned {med('pinned_mb'):.1f} MB "
            f"{1e3 * med('pinned_s'):.1f} ms; first begin_stage at "
            f"{med('begin_stage_at'):.3f}; NVRTC runs {med('nvrtc_runs'):.0f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("reps", type=int)
    p.add_argument("trees", nargs="+", help="NAME=TREE:STORE")
    p.add_argument("--json")
    a = p.parse_args(argv)
    trees = []
    for t in a.trees:
        name, _, rest = t.partition("=")
        root, _, store = rest.partition(":")
        trees.append((name, root, store))
    out = {}
    for r in range(a.reps):
        for name, root, store in (trees if r % 2 == 0 else trees[::-1]):
            t0 = time.perf_counter()
            row = child(a.spec, root, store)
            if "error" in row:
                print(f"{a.spec} {name} rep {r}: FAILED {row['error']}", flush=True)
                continue
            out.setdefault(name, []).append(row)
            print(f"{a.spec} {name} rep {r}: first {row['first']:.3f} warm "
                  f"{min(row['second'], row['third']):.3f} gap {row['gap']:+.3f} CUDA ready "
                  f"{row.get('cuda_ready') or 0:.3f} beyond {row['ours']:+.3f} | pinned "
                  f"{row['pinned_mb']:.1f} MB {1e3 * row['pinned_s']:.1f} ms | begin_stage at "
                  f"{row['begin_stage_at'] or 0:.3f} | NVRTC runs "
                  f"{row['nvrtc_runs']} | libraries {1e3 * row['libraries_s']:.1f} ms "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            if r == 1:
                e2e.print_spans(f"{a.spec} {name} rep {r}", row["spans"])
            print(f"  phases, calls 1 and 2: {row['phases']}", flush=True)
    print(f"\nthe gap of {a.spec} (target <= 0.3 s), medians:")
    for name, rows in out.items():
        print(f"  {name}: {summary(rows)}")
    if a.json:
        Path(a.json).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
