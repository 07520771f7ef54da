"""The ``scipy-gpuqr`` command line (also ``python -m scipy_gpuqr``): parser and dispatch.

Subcommands::

    info            versions, GPU, SuiteSparse, kernel cache
    solve A.mtx     solve a least-squares or square system, print what ran where
    analyze A.mtx   symbolic analysis: fronts, flops, nnz(R), intensity, stages
    schedule A.mtx  GPU task lists: launches with/without pipelining, tasks, build time
    run script.py   run an unchanged script with SciPy's solvers patched
    build-kernels   compile every kernel for the present GPU into the cache
    calibrate       measure device speeds (``--tiled`` for the tiled dense QR)
    demo            a real solve on a generated or shared matrix, timed

Each subcommand lives in a module of this package (:data:`COMMANDS`) that
adds its arguments to its parser and runs it. Only the module of the
subcommand given is imported (start-up time: the subcommands import SciPy,
the solvers, the schedulers; ``--help`` and a subcommand's own arguments
need none of the others).

Every command turns an error into one line on stderr and exit status 2: a
malformed input file never ends in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .._options import GpuqrOptions
from .._version import __version__
from ._common import CommandError

__all__ = ["main", "build_parser", "COMMANDS", "CommandError"]

#: subcommand -> (module of this package, help, function adding its arguments,
#: function running it); in the order ``--help`` lists them
COMMANDS = {
    "info": ("info", "versions, GPU, SuiteSparse, kernel cache",
             "add_arguments", "run"),
    "solve": ("solve_report", "solve A x = b (least squares or square), print what ran where",
              "add_solve_arguments", "run_solve"),
    "analyze": ("analyze", "symbolic analysis: fronts, flops, nnz(R), intensity, stages",
                "add_arguments", "run"),
    "schedule": ("schedule",
                 "GPU task-list statistics: launches, tasks, critical path, build time",
                 "add_arguments", "run"),
    "run": ("run_script", "run a script with scipy.sparse.linalg patched",
            "add_arguments", "run"),
    "build-kernels": ("build_kernels", "compile every kernel for the present GPU",
                      "add_arguments", "run"),
    "calibrate": ("calibrate", "measure device speeds and cache them",
                  "add_arguments", "run"),
    "demo": ("solve_report", "a real solve, timed, saying what ran where",
             "add_demo_arguments", "run_demo"),
}


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The argument parser.

    Parameters
    ----------
    commands : iterable of str, optional
        The subcommands whose arguments are added (their modules imported);
        None: every subcommand. The others are listed with their help only.
    """
    want = set(COMMANDS) if commands is None else set(commands)
    parser = argparse.ArgumentParser(
        prog="scipy-gpuqr",
        description="SciPy-compatible sparse QR, least squares and solves on the GPU.")
    parser.add_argument("--version", action="version", version=f"scipy_gpuqr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text, add, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name in want:
            mod = importlib.import_module(f".{module}", __package__)
            getattr(mod, add)(p)
            p.set_defaults(func=getattr(mod, run))
    return parser


def _chosen(argv) -> str | None:
    """The subcommand named in ``argv`` (the first word not an option; the
    top-level options take no value), or None."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv=None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = _chosen(argv)
    try:
        parser = build_parser([] if chosen is None else [chosen])
    except ImportError as exc:                  # a broken installation: still one line
        print(f"scipy-gpuqr {chosen}: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("scipy-gpuqr: interrupted", file=sys.stderr)
        return 130
    except (CommandError, OSError, ValueError, TypeError, MemoryError,
            RuntimeError, ImportError) as exc:
        if GpuqrOptions().debug_enabled():
            raise
        print(f"scipy-gpuqr {args.command}: error: {exc}", file=sys.stderr)
        return 2
