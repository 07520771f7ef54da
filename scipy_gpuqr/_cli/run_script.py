"""``scipy-gpuqr run script.py [args]``: run an unchanged script with SciPy's solvers patched.

The script runs as ``__main__`` with ``sys.argv`` set to it and its
arguments and its folder first on ``sys.path`` (both restored after), inside
:func:`scipy_gpuqr.patched`; its exit status is the command's.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from .._api.patch import patched
from ._common import CommandError

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of the ``run`` subcommand."""
    parser.add_argument("script", help="path of the Python script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def run(args) -> int:
    """Run the script; returns its exit status."""
    if not os.path.isfile(args.script):
        raise CommandError(f"no such script: {args.script}")
    argv = [args.script] + [a for a in args.args if a != "--"]
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        with patched():
            runpy.run_path(args.script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0
