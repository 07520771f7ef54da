"""``scipy-gpuqr calibrate``: measure device speeds and cache them.

Without ``--tiled``: the sparse QR's GPU/CPU ladder (problems of growing
arithmetic intensity, each factorized and solved on both; ``--quick`` a
short one, ``--repeats`` timed calls each), the threshold fitted to it and
stored for ``auto`` (a table, or ``--json``); each factorization is timed
with the least-squares solve ``lsqr`` runs on it. Needs a GPU and the GPU
engine; without them it says why.

With ``--tiled``: the tiled dense QR's device table and plan. Every
device's tile speeds and the transfer speeds are measured (or read from the
cache, unless ``--refresh``) and printed with the plan for ``--size M N``:
main device, ``p``, guide array, ``T(p)`` for every ``p``.
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import _gpu
from .._dispatch import calibrate as sparse_calibration
from .._dispatch import plan as dispatch_plan
from .._api.spsolve import spsolve_probe
from .._factor.factored import least_squares_probe
from ..tiled._calibrate import cache_file, get_profiles
from ..tiled._qr import plan_tiled, resolve_devices
from ._common import CommandError

__all__ = ["add_arguments", "run", "run_sparse", "run_tiled"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``calibrate``: the sparse ladder's, then ``--tiled``'s."""
    parser.add_argument("--tiled", action="store_true",
                        help="calibrate the tiled dense QR's device model and print its plan")
    parser.add_argument("--quick", action="store_true",
                        help="sparse: a short ladder (intensities about 4 to 450)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="sparse: timed calls per backend and problem (median)")
    parser.add_argument("--size", nargs=2, type=int, metavar=("M", "N"),
                        default=(4096, 4096), help="matrix shape to plan for")
    parser.add_argument("--devices", default="auto",
                        help="'auto' or a comma list such as cpu,gpu:0,gpu:1")
    parser.add_argument("--tile-size", type=int, default=None,
                        help="tile width (default: 512 with a GPU, 256 CPU alone)")
    parser.add_argument("--dtype", choices=("float64", "float32"),
                        default="float64")
    parser.add_argument("--refresh", action="store_true",
                        help="measure again instead of reading the cache")
    parser.add_argument("--json", action="store_true",
                        help="print the table and plan as JSON")


def run(args) -> int:
    """Run ``calibrate`` (``--tiled``: :func:`run_tiled`, else :func:`run_sparse`)."""
    return run_tiled(args) if args.tiled else run_sparse(args)


def run_sparse(args) -> int:
    """Measure the sparse ladder and print (and store) the fitted threshold."""
    info = _gpu.gpu_info()
    if not info["available"]:
        raise CommandError(f"sparse calibration needs a GPU ({info['reason']}); auto keeps "
                           "the default threshold of 10 flops/byte (--tiled: tiled dense QR)")
    engine, why = dispatch_plan.gpu_engine()
    if engine is None:
        raise CommandError(f"sparse calibration needs the GPU engine ({why})")

    def progress(pt):
        if not args.json:
            print(f"  {pt.name:18} intensity {pt.intensity:8.1f}  CPU {pt.cpu_s:9.4f} s  "
                  f"GPU {pt.gpu_s:9.4f} s  ratio {pt.ratio:7.3f}", file=sys.stderr, flush=True)

    cal = sparse_calibration.calibrate_sparse(
        sparse_calibration.default_ladder(quick=args.quick), repeats=args.repeats,
        device=info, progress=progress, solve=least_squares_probe, square_solve=spsolve_probe)
    if args.json:
        out = cal.to_json()
        out["path"] = cal.path
        print(json.dumps(out, indent=1))
    else:
        print(sparse_calibration.format_table(cal))
    return 0


def run_tiled(args) -> int:
    """Print the tiled QR's device table and plan; returns the exit status."""
    devices = args.devices if args.devices == "auto" else args.devices.split(",")
    try:
        names, _ = resolve_devices(devices)
        m, n = args.size
        if m < 1 or n < 1:
            raise ValueError(f"--size needs positive M and N, got {m} {n}")
        plan, profiles, bandwidth = plan_tiled(
            (m, n), args.dtype, devices, args.tile_size, refresh=args.refresh)
        if len(names) == 1:  # a plan needs no speeds; still show them
            profiles, bandwidth = get_profiles(names, plan.tile_size, args.dtype,
                                               refresh=args.refresh)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"scipy-gpuqr calibrate --tiled: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "profiles": [p.to_json() for p in profiles],
            "bandwidth": {f"{s}->{d}": v for (s, d), v in bandwidth.items()},
            "plan": {"main": plan.main, "p": plan.p, "devices": plan.devices,
                     "guide": plan.guide, "predicted": plan.predicted,
                     "candidates": plan.candidates, "tile_size": plan.tile_size},
            "cache": str(cache_file())}, indent=1))
        return 0
    tile = plan.tile_size
    print(f"tiled QR device table (tile {tile}, {args.dtype}; cache {cache_file()})")
    print(f"{'device':8} {'T us':>9} {'E us':>9} {'UT us':>9} {'UE us':>9} "
          f"{'upd tiles/s':>12} {'sync us/step':>12} {'sync ms/run':>11}  hardware")
    for p in profiles:
        print(f"{p.name:8} {p.t_T*1e6:9.1f} {p.t_E*1e6:9.1f} {p.t_UT*1e6:9.1f} "
              f"{p.t_UE*1e6:9.1f} {p.update_speed:12.0f} "
              f"{p.t_sync_step*1e6:12.1f} {p.t_sync_fixed*1e3:11.2f}  {p.description}")
    if bandwidth:
        print("transfers (GB/s): " + ", ".join(
            f"{s}->{d} {v/1e9:.1f}" for (s, d), v in sorted(bandwidth.items())))
    print(f"plan for {m} x {n}: main {plan.main}, p = {plan.p} "
          f"{list(plan.devices)}, guide array {list(plan.guide)}")
    if plan.predicted:
        best = min(plan.predicted)
        print("predicted T(p)/min over " + ", ".join(plan.candidates) + ": "
              + " ".join(f"p={i+1}:{t/best:.2f}" for i, t in enumerate(plan.predicted)))
    return 0
