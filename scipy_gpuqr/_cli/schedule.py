"""``scipy-gpuqr schedule A.mtx``: statistics of the GPU task lists of a sparse QR.

Runs the symbolic analysis, then the bucket and sparse schedulers (no GPU
needed), with and without pipelining, and prints: launches (with and without
pipelining), tasks and tasks per launch by type, the fraction of the fronts'
tiles a launch touches, the critical path (launches of the longest
leaf-to-root chain), the nominal flops of the tile kernels and the CPU time
the schedule took to build (cold: no tile pattern cached). ``--json`` prints
the same as JSON with the stable keys ``launches``, ``launches_no_pipeline``,
``tasks``. A file that cannot be read gives a one-line error and exit status 2.

``analyze --schedule`` prints :func:`schedule_lines` of
:func:`schedule_summary` after its own report (:mod:`.analyze`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .._schedule import bucket
from .._schedule.sparse import build_schedule, clear_schedule_cache, schedule_stats
from .._schedule.tasks import DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE, DEFAULT_TILE, MAX_BUNDLE
from .._symbolic import analyze
from ..io import mmread

__all__ = ["add_arguments", "run", "schedule_summary", "schedule_lines"]


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def add_arguments(parser, *, matrix: bool = True) -> None:
    """Arguments of the ``schedule`` subcommand (``matrix=False``: the tunables only,
    for a command that already takes the matrix and ``--json``)."""
    if matrix:
        parser.add_argument("matrix", help="Matrix Market file of A")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument("--max-gpu-memory", type=int, default=None, metavar="BYTES",
                            help="GPU memory budget for the staging plan (default: one stage)")
    parser.add_argument("--tile", type=_positive, default=DEFAULT_TILE, metavar="N",
                        help=f"tile edge (default {DEFAULT_TILE})")
    parser.add_argument("--bundle", type=_positive, default=DEFAULT_BUNDLE, metavar="N",
                        help=f"row tiles per bundle, 2..{MAX_BUNDLE} (default {DEFAULT_BUNDLE})")
    parser.add_argument("--granule", type=_positive, default=DEFAULT_APPLY_GRANULE, metavar="N",
                        help=f"column tiles per Apply task (default {DEFAULT_APPLY_GRANULE})")
    parser.add_argument("--max-tasks", type=_positive, default=None, metavar="N",
                        help="launch-size limit in tasks (default: none)")


def schedule_summary(analysis, *, tile: int | None = None, bundle: int | None = None,
                     granule: int | None = None, max_gpu_memory: int | None = None,
                     max_tasks: int | None = None) -> dict:
    """Schedule statistics of an analysis, built cold (JSON-serializable).

    The keys of :func:`~scipy_gpuqr._schedule.sparse.schedule_stats`, and
    ``build_seconds_cached``: CPU time of a second build of the same
    schedule for a new analysis of the same matrix (tile patterns cached,
    what a second ``analyze`` + factorize of an equal pattern pays; a
    ``refactor`` with the same analysis pays nothing).
    """
    kw = dict(tile=DEFAULT_TILE if tile is None else int(tile),
              bundle=DEFAULT_BUNDLE if bundle is None else int(bundle),
              granule=DEFAULT_APPLY_GRANULE if granule is None else int(granule),
              max_gpu_memory=max_gpu_memory, max_tasks=max_tasks)
    clear_schedule_cache(analysis)
    bucket.clear_cache()
    out = schedule_stats(analysis, **kw)
    t0 = time.process_time()
    build_schedule(analysis, cache=False, **kw)
    out["build_seconds_cached"] = time.process_time() - t0
    out["flops"] = float(analysis.flops)
    return out


def schedule_lines(out: dict) -> list:
    """Human-readable lines of :func:`schedule_summary`."""
    def ratio(a, b):
        return f" ({b / a:.2f}x fewer with pipelining)" if a and b else ""

    lines = [
        f"tile / bundle      {out['tile']} / {out['bundle']}, Apply granule {out['granule']} "
        f"column tiles, {out['stages']} stage(s)",
        f"launches           {out['launches']} pipelined, {out['launches_no_pipeline']} without"
        + ratio(out["launches"], out["launches_no_pipeline"]),
        f"critical path      {out['critical_path']} launches pipelined, "
        f"{out['critical_path_no_pipeline']} without",
        f"tasks              {out['tasks']} ({out['tasks_no_pipeline']} without pipelining)",
        f"tasks per launch   mean {out['tasks_per_launch']['mean']:.1f}, "
        f"max {out['tasks_per_launch']['max']}",
    ]
    for name, v in out["tasks_per_launch_by_type"].items():
        lines.append(f"  {name:16s} {out['tasks_by_type'][name]:>10d} tasks, per launch "
                     f"mean {v['mean']:.1f}, max {v['max']}")
    tf = out["tiles_touched_fraction"]
    lines += [
        f"tiles touched      per launch, of the stage's front tiles: mean {tf['mean']:.3f}, "
        f"max {tf['max']:.3f}",
        f"tile-kernel flops  {out['tile_flops']:.4g} (analysis: {out['flops']:.4g})",
        f"build time (CPU)   {out['build_seconds']:.3f} s cold, "
        f"{out['build_seconds_cached']:.3f} s with tile patterns cached "
        f"(target at 10 TF/s: {out['flops'] / 1e13:.3f} s)",
    ]
    return lines


def run(args) -> int:
    """Run ``schedule``; returns the exit status (2 on a bad file or bad option)."""
    try:
        A = mmread(args.matrix)
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as exc:
        print(f"scipy-gpuqr schedule: cannot read {args.matrix}: {exc}", file=sys.stderr)
        return 2
    try:
        an = analyze(A)
        out = schedule_summary(an, tile=args.tile, bundle=args.bundle,
                               granule=getattr(args, "granule", None),
                               max_gpu_memory=getattr(args, "max_gpu_memory", None),
                               max_tasks=getattr(args, "max_tasks", None))
    except (ValueError, TypeError, MemoryError) as exc:
        print(f"scipy-gpuqr schedule: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(out, indent=1))
        return 0
    print(f"matrix             {args.matrix} ({an.m} x {an.n}, {an.nfronts} fronts)")
    print("\n".join(schedule_lines(out)))
    return 0
