"""``scipy-gpuqr analyze A.mtx``: print the symbolic analysis of a sparse QR.

Prints m, n, nnz, the ordering, the number of fronts, the largest front, the
flops, nnz(R), the arithmetic intensity, the staging plan and the backend
``auto`` would pick (GPU when the intensity reaches the threshold and a GPU is
present). ``--json`` prints the same as JSON with the stable keys m, n, nnz,
fronts, flops, nnz_R, intensity, stages (with ``--schedule`` also the GPU task
lists' statistics: launches, launches_no_pipeline, tasks, ...). A file that
cannot be read gives a one-line error and exit status 2.
"""

from __future__ import annotations

import json
import sys

from .. import _gpu
from .._options import DEFAULT_INTENSITY_THRESHOLD
from .._symbolic import analyze
from ..io import mmread
from .schedule import add_arguments as add_schedule_arguments
from .schedule import schedule_lines, schedule_summary

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of the ``analyze`` subcommand."""
    parser.add_argument("matrix", help="Matrix Market file of A")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--max-gpu-memory", type=int, default=None, metavar="BYTES",
                        help="GPU memory budget for the staging plan (default: one stage)")
    parser.add_argument("--ordering", default="colamd",
                        choices=("colamd", "natural", "amd", "metis"),
                        help="column ordering (default colamd)")
    parser.add_argument("--itemsize", type=int, default=8, choices=(4, 8, 16),
                        help="bytes per value for memory counts (default 8)")
    parser.add_argument("--schedule", action="store_true",
                        help="also build the GPU task lists and print their statistics "
                             "(JSON keys launches, launches_no_pipeline, tasks)")
    add_schedule_arguments(parser, matrix=False)


def _predict(intensity: float) -> dict:
    try:
        gpu = bool(_gpu.gpu_available())
    except Exception:                       # noqa: BLE001 - detection must never fail the CLI
        gpu = False
    if intensity >= DEFAULT_INTENSITY_THRESHOLD and gpu:
        backend, why = "gpu", f"intensity {intensity:.1f} >= {DEFAULT_INTENSITY_THRESHOLD:g} and a GPU is present"
    elif intensity >= DEFAULT_INTENSITY_THRESHOLD:
        backend, why = "cpu", (f"intensity {intensity:.1f} >= {DEFAULT_INTENSITY_THRESHOLD:g} "
                               "would pick the GPU, but no GPU is present")
    else:
        backend, why = "cpu", f"intensity {intensity:.1f} < {DEFAULT_INTENSITY_THRESHOLD:g}"
    return {"predicted_backend": backend, "predicted_backend_reason": why, "gpu_present": gpu}


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024


def run(args) -> int:
    """Run ``analyze``; returns the exit status (2 on a bad file or bad option)."""
    try:
        A = mmread(args.matrix)
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as exc:
        print(f"scipy-gpuqr analyze: cannot read {args.matrix}: {exc}", file=sys.stderr)
        return 2
    try:
        an = analyze(A, ordering=args.ordering, max_gpu_memory=args.max_gpu_memory,
                     itemsize=args.itemsize)
    except (ValueError, TypeError, MemoryError) as exc:
        print(f"scipy-gpuqr analyze: {exc}", file=sys.stderr)
        return 2
    out = an.summary()
    out.update(_predict(an.intensity))
    schedule = None
    if getattr(args, "schedule", False):
        try:
            schedule = schedule_summary(an, tile=args.tile, bundle=args.bundle,
                                        granule=args.granule,
                                        max_gpu_memory=args.max_gpu_memory,
                                        max_tasks=args.max_tasks)
        except (ValueError, TypeError, MemoryError) as exc:
            print(f"scipy-gpuqr analyze: {exc}", file=sys.stderr)
            return 2
        out.update(schedule)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    plan = out["stage_plan"]
    lines = [
        f"matrix            {args.matrix}",
        f"shape             {out['m']} x {out['n']}, nnz {out['nnz']}",
        f"ordering          {out['ordering']}",
        f"singletons        {out['n1cols']} columns, {out['n1rows']} rows of R straight from A",
        f"fronts            {out['fronts']} (largest {out['largest_front'][0]} x "
        f"{out['largest_front'][1]})",
        f"flops             {out['flops']:.4g}",
        f"nnz(R)            {out['nnz_R']}   nnz(H) {out['nnz_H']}",
        f"factor memory     {_human(out['factor_bytes'])}   host estimate "
        f"{_human(out['host_bytes'])}",
        f"intensity         {out['intensity']:.1f} flops/byte",
        f"GPU memory        {_human(out['gpu_bytes'])} (one stage)",
        f"stages            {plan['nstages']}"
        + (f" for a budget of {_human(plan['budget'])}" if plan["budget"] is not None else "")
        + (f", largest {_human(plan['max_stage_bytes'])}" if plan["nstages"] else ""),
    ]
    if not plan["feasible"]:
        lines.append(f"                  INFEASIBLE: {len(plan['oversized_fronts'])} front(s) "
                     f"alone exceed the budget: {plan['oversized_fronts'][:10]}")
    lines.append(f"predicted backend {out['predicted_backend']} ({out['predicted_backend_reason']})")
    lines.append(f"analysis time     {out['analysis_seconds']:.3f} s")
    if schedule is not None:
        lines += schedule_lines(schedule)
    print("\n".join(lines))
    return 0
