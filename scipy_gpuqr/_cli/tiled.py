"""``scipy-gpuqr calibrate --tiled``: the device table and the tiled-QR plan.

``add_arguments(parser)`` adds this command's options to a parser;
``run(args)`` measures (or reads from the cache) every device's tile speeds
and the transfer speeds, and prints them with the plan for ``--size M N``:
main device, ``p``, guide array, ``T(p)`` for every ``p``. Runs standalone as
``python -m scipy_gpuqr._cli.tiled --size 4096 4096``.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "run", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--size``, ``--devices``, ``--tile-size``, ``--dtype``, ``--refresh``, ``--json``."""
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


def run(args: argparse.Namespace) -> int:
    """Print the device table and plan; return the exit status."""
    from ..tiled._qr import plan_tiled, resolve_devices
    from ..tiled._calibrate import cache_file, get_profiles
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scipy_gpuqr._cli.tiled",
        description="Calibrate the devices and print the tiled-QR plan.")
    parser.add_argument("--tiled", action="store_true",
                        help="accepted for symmetry with 'scipy-gpuqr calibrate --tiled'")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
