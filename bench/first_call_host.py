#!/usr/bin/env python3
"""The per-pattern host work of a first GPU call, piece by piece, without a GPU (issue 16).

    python bench/first_call_host.py [--only grid24 grid40 ch7-8-b3] [--reps 5] [--json out.json]
    python bench/first_call_host.py --check [--only ...]   # the pieces' arrays, digested

What a first ``lsqr(A, b, backend='gpu')`` on a pattern new to the process
(warm on another) computes on the host besides the launches, each piece timed
alone on a fresh analysis of the problem (every per-pattern cache cold, the
disk store off), medians of ``--reps`` rounds in one process:

* ``analysis``: the symbolic analysis (``analyze(A, cache=False)``);
* ``memory plan``: the driver's stage needs and memory plan (``stage_needs``,
  ``plan_for_memory``, ``min_budget``) for an unlimited device;
* ``schedule plan``: ``build_schedule(lazy=True)`` (the plan; no records);
* ``records (launch chunks)``: every launch's records as the engine's record
  builder makes them (``iter_launches`` without its worker);
* ``materialize``: the whole stage's records at once (the worker's
  ``sched.materialize()`` of a cold run);
* ``apply split, every launch``: ``CupyDevice.launch``'s Apply cut
  (``apply_split``, every call, warm ones too), summed over the launches;
* ``cold: records picked per launch``, ``cold: picked records sorted``: in a
  tree whose cold run picks each launch's Factorize records in
  ``StageLoop.launch_all`` and sorts them by front after the launches (the
  engine's thread), those steps (0 in a tree without them);
* ``kept records of the stage``: ``stage_reflector_records`` (on a worker:
  every run's where the cold run no longer picks its records, else a warm
  stage's);
* ``R layout``, ``stage maps``, ``pattern copy``: the worker's
  ``r_layout``, ``stage_maps`` and ``pattern_copy``;
* ``final entries``: ``final_entries`` of the one stage (the copier's worker);
* ``reflector records``, ``replay plan``: ``solve.reflector_records`` over the
  kept records and ``build_replay_plan`` (the first solve's ``plan_of``);
* ``host side, handed on``: ``driver._host_side`` of a cold run (R's layout,
  its gather maps, the stage's records, R's own pattern copy unless that is a
  future) until it returns: what the engine's thread and the late R copy wait
  for; ``host side, pattern after``: then the pattern copy's future, where
  there is one.

CPU only: the times are this host's (say its load); on a GPU host, pieces on
the engine's thread add to the call, the workers' pieces only where they
outlast the launches. ``--check`` prints a SHA-256 of every array the pieces
make (schedule records, kept records, final entries, replay plan): the same
digests before and after a change mean the same specification.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("SCIPY_GPUQR_SCHEDULE_CACHE", "off")     # no disk store: cold pieces
sys.path.append(str(Path(__file__).resolve().parents[1]))       # after PYTHONPATH

import numpy as np  # noqa: E402


def problem(name: str):
    """The matrix of a problem name: ``gridK`` (3-D grid least squares),
    ``ch7-8-b3``, ``randMxN`` (random least squares, seed 1)."""
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               random_least_squares)
    if name.startswith("grid"):
        return grid3d_least_squares(int(name[4:]))
    if name == "ch7-8-b3":
        return chessboard_boundary(7, 8, 3)
    if name.startswith("rand"):
        m, n = (int(x) for x in name[4:].split("x"))
        return random_least_squares(m, n, density=min(1.0, 8.0 / n), seed=1)
    raise ValueError(f"unknown problem {name!r}")


def _sha(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.view(np.uint8).ravel() if a.size else b"")
    return h.hexdigest()[:16]


def pieces(A, *, tile: int = 32, bundle: int = 3) -> tuple:
    """One cold round: ``(seconds per piece, digests)``."""
    from scipy_gpuqr._engine.gpu import solve
    from scipy_gpuqr._engine.gpu.device import apply_split_setting
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.gpu.driver import stage_needs
    from scipy_gpuqr._engine.gpu.rcopy import final_entries
    from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache, r_layout
    from scipy_gpuqr._engine.gpu import stage_loop
    from scipy_gpuqr._engine.gpu.stage_loop import stage_reflector_records
    from scipy_gpuqr._engine.memory import min_budget, plan_for_memory
    from scipy_gpuqr._schedule import bucket
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    from scipy_gpuqr._schedule.sparse import build_schedule, clear_schedule_cache
    from scipy_gpuqr._schedule.tasks import TASK_DTYPE, apply_split
    from scipy_gpuqr._symbolic import analyze

    sec, dig = {}, {}
    bucket.clear_cache()                    # the tile patterns too: a pattern new to the process

    def timed(name, fn, *a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        sec[name] = sec.get(name, 0.0) + time.perf_counter() - t
        return out

    an = timed("analysis", analyze, A, cache=False)

    def memory_plan():
        needs = stage_needs(an, DEFAULT_DENSE_FLOPS, tile=tile, bundle=bundle,
                            pipelining=True, itemsize=8, panel=256)
        plan = plan_for_memory(an, needs, None, None)
        return needs, plan, min_budget(an, needs)
    needs, mplan, _ = timed("memory plan", memory_plan)
    sched = timed("schedule plan", build_schedule, an, tile=tile, bundle=bundle,
                  pipelining=True, lazy=True, dense_flops=DEFAULT_DENSE_FLOPS,
                  plan=mplan.plan)
    chunks = timed("records (launch chunks)",
                   lambda: [rec for _, _, rec in sched.iter_launches(prefetch=False)])
    timed("materialize", sched.materialize)
    st = sched.stages[0]
    dig["schedule"] = _sha(*(s.tasks for s in sched.stages), *(s.launch_ptr for s in sched.stages))
    if len(sched.stages) == 1:
        dig["chunks = materialized"] = str(all(
            np.array_equal(c.view(np.uint8), st.launch_tasks(L).view(np.uint8))
            for L, c in enumerate(chunks)))

    # the engine's thread per launch: the Apply cut; on a cold run of a tree that
    # picks each launch's Factorize records as launched
    # (``keep_reflector_records(sid, st, fac_parts, fac_launch)``), that
    # pick and their sort by front after the launches (as that tree does them)
    smax, sfill = apply_split_setting()
    target = int(sfill * 132 * 4)           # an H100/H200's slots, about
    picks = len(inspect.signature(stage_loop.StageLoop.keep_reflector_records).parameters) > 3
    mask = getattr(stage_loop, "_factorize_mask", None)
    raw = getattr(stage_loop, "_RECORD_BYTES", None)

    def splits():
        for rec in chunks:
            if 0 < len(rec) < target:
                apply_split(rec["type"], rec["c0"], rec["c1"], target, smax, tile)
    timed("apply split, every launch", splits)

    def per_launch():
        parts, lau = [], []
        for L, rec in enumerate(chunks):
            if len(rec) and picks:
                sel = (mask(rec) if mask is not None
                       else np.isin(rec["type"], stage_loop.FACTORIZE_TYPES))
                if sel.any():
                    parts.append(rec[sel] if raw is None else rec.view(raw)[sel])
                    lau.append(np.full(int(sel.sum()), L))
        return parts, lau
    parts, lau = timed("cold: records picked per launch", per_launch)

    def cold_kept():
        alll = np.concatenate(lau) if lau else np.zeros(0, np.int64)
        if raw is None:
            allf = np.concatenate(parts) if parts else st.tasks[:0]
            order = np.argsort(allf["front"], kind="stable")
            allf = allf[order]
        else:
            cat = np.concatenate(parts) if parts else np.zeros(0, raw)
            order = np.argsort(cat.view(TASK_DTYPE)["front"], kind="stable")
            allf = cat[order].view(TASK_DTYPE)
        allf["F"] = 0
        return allf, alll[order]
    allf, alll = timed("cold: picked records sorted", cold_kept)
    sched.extras.pop(("reflector_records", 0, 0), None)
    kept = timed("kept records of the stage", stage_reflector_records, sched, 0, st, 0)
    dig["kept records"] = _sha(kept.records, kept.launches)
    if picks:
        dig["picked = stage's kept"] = str(
            np.array_equal(allf.view(np.uint8), kept.records.view(np.uint8))
            and np.array_equal(alll, kept.launches))

    lay = timed("R layout", r_layout, an, cache=False)
    maps = timed("stage maps", lay.stage_maps, [s.fronts for s in sched.stages])
    timed("pattern copy", lay.pattern_copy)
    if len(sched.stages) == 1:
        fe = timed("final entries", final_entries, an, lay, st, tile)
        dig["final entries"] = _sha(fe)
    dig["stage maps"] = _sha(*(m[1] for m in maps))

    fs = an.fronts
    cnt = np.bincount(kept.records["front"], minlength=fs.nfronts)
    ptr = np.concatenate(([0], np.cumsum(cnt)))
    fronts = [(lay.slots_of[f], kept.records[ptr[f]:ptr[f + 1]], kept.launches[ptr[f]:ptr[f + 1]],
               0, int(st.foff[f])) for f in range(fs.nfronts)]
    F = np.repeat(np.asarray(st.foff, dtype=np.int64)[:fs.nfronts], cnt)
    timed("reflector records", solve.reflector_records, kept.records, F, 0)

    class _Dense:
        def __init__(self, slots, after):
            self.slots, self.after_launch = slots, after
    dense = {f: _Dense(lay.slots_of[f], Ld) for f, Ld in st.dense.items()}
    plan = timed("replay plan", solve.build_replay_plan, A.shape[0], fronts, tile=tile,
                 bundle=bundle, launch_base=[0], dense=dense)
    dig["replay plan"] = _sha(plan.records, plan.rowmap, plan.level_ptr, plan.level_stage)

    # the cold run's host side as its worker runs it, from a cold layout and lazy
    # schedule: until it hands on (the layout, the gather maps and the stage's
    # records: the late R copy opens, the engine's thread goes on), then until
    # R's own pattern copy is made too (a future in a tree that makes it apart)
    clear_schedule_cache()
    clear_r_layout_cache()
    cold = build_schedule(an, tile=tile, bundle=bundle, pipelining=True, lazy=True,
                          dense_flops=DEFAULT_DENSE_FLOPS, plan=mplan.plan)
    _, _, pattern = timed("host side, handed on", driver._host_side, an, cold,
                          [x.fronts for x in cold.stages], True)
    if hasattr(pattern, "result"):
        timed("host side, pattern after", pattern.result)
    info = {"launches": int(sched.nlaunch), "records": int(sched.ntasks),
            "stages": len(sched.stages), "nnz_R": int(lay.nnz)}
    return sec, dig, info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=["grid24", "grid40", "ch7-8-b3"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--check", action="store_true", help="print the digests only (one round)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    pieces(grid3d_least_squares(10))            # the process warm (libraries loaded)
    analyze(grid3d_least_squares(10))
    import scipy_gpuqr
    out = {"load": os.getloadavg(), "package": scipy_gpuqr.__file__, "problems": {}}
    print(f"package {out['package']}")
    for name in args.only:
        A = problem(name)
        rounds, digs, info = [], None, None
        for _ in range(1 if args.check else args.reps):
            sec, dig, info = pieces(A)
            if digs is not None and dig != digs:
                raise SystemExit(f"{name}: the pieces' arrays changed between rounds")
            digs = dig
            rounds.append(sec)
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        out["problems"][name] = {"median_s": med, "digests": digs, "info": info}
        print(f"\n{name}: {info}")
        if args.check:
            for k, v in digs.items():
                print(f"  {k:28s} {v}")
            continue
        for k, v in med.items():
            lo, hi = min(r[k] for r in rounds), max(r[k] for r in rounds)
            print(f"  {k:28s} {1e3 * v:8.1f} ms   ({1e3 * lo:.1f} - {1e3 * hi:.1f})")
    print(f"\nload average {out['load']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
