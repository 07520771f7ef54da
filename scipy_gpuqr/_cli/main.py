"""The ``scipy-gpuqr`` command line (also ``python -m scipy_gpuqr``).

Subcommands::

    info            versions, GPU, SuiteSparse, kernel cache
    solve A.mtx     solve a least-squares or square system, print what ran where
    analyze A.mtx   symbolic analysis: fronts, flops, nnz(R), intensity, stages
    schedule A.mtx  GPU task lists: launches with/without pipelining, tasks, build time
    run script.py   run an unchanged script with SciPy's solvers patched
    build-kernels   compile every kernel for the present GPU into the cache
    calibrate       measure device speeds (``--tiled`` for the tiled dense QR)
    demo            a real solve on a generated or shared matrix, timed

Every command turns an error into one line on stderr and exit status 2: a
malformed input file never ends in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "build_parser"]

#: subcommands implemented in feature modules: name -> (module, help)
_DELEGATED = {
    "analyze": ("scipy_gpuqr._cli.analyze",
                "symbolic analysis: fronts, flops, nnz(R), intensity, stages"),
    "schedule": ("scipy_gpuqr._cli.schedule",
                 "GPU task-list statistics: launches, tasks, critical path, build time"),
}


class CommandError(Exception):
    """An error to report on one line (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (feature modules add their own arguments)."""
    from .._version import __version__

    parser = argparse.ArgumentParser(
        prog="scipy-gpuqr",
        description="SciPy-compatible sparse QR, least squares and solves on the GPU.")
    parser.add_argument("--version", action="version", version=f"scipy_gpuqr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", help="versions, GPU, SuiteSparse, kernel cache")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("solve", help="solve A x = b (least squares or square), print what ran where")
    p.add_argument("matrix", help="Matrix Market file of A")
    p.add_argument("rhs", nargs="?", help="Matrix Market file of b (default: A @ ones + noise)")
    p.add_argument("--backend", default=None, help="auto, gpu, cpu, reference, simulate")
    p.add_argument("--method", choices=("lsqr", "spsolve"), default="lsqr",
                   help="lsqr: minimum-norm least squares; spsolve: square exact solve")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_solve)

    for name, (module, help_text) in _DELEGATED.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=_delegate(module))
        _add_delegated_arguments(module, p)

    p = sub.add_parser("run", help="run a script with scipy.sparse.linalg patched")
    p.add_argument("script", help="path of the Python script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("build-kernels", help="compile every kernel for the present GPU")
    p.add_argument("--cache-dir", help="kernel cache folder (sets CUPY_CACHE_DIR)")
    p.set_defaults(func=_cmd_build_kernels)

    p = sub.add_parser("calibrate", help="measure device speeds and cache them")
    p.add_argument("--tiled", action="store_true",
                   help="calibrate the tiled dense QR's device model and print its plan")
    p.add_argument("--quick", action="store_true",
                   help="sparse: a short ladder (intensities about 4 to 450)")
    p.add_argument("--repeats", type=int, default=3,
                   help="sparse: timed calls per backend and problem (median)")
    p.set_defaults(func=_cmd_calibrate, parser=p)
    _add_delegated_arguments("scipy_gpuqr._cli.tiled", p)
    try:  # --tiled's options usually bring --json already
        p.add_argument("--json", action="store_true", help="print JSON")
    except argparse.ArgumentError:
        pass

    p = sub.add_parser("demo", help="a real solve, timed, saying what ran where")
    p.add_argument("--matrix", help="Matrix Market file (default: a generated 3-D grid problem)")
    p.add_argument("--grid", type=int, default=16, help="grid size k of the generated k^3 problem")
    p.add_argument("--backend", default=None, help="auto, gpu, cpu, reference, simulate")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv=None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
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
        from .._options import GpuqrOptions
        if GpuqrOptions().debug_enabled():
            raise
        print(f"scipy-gpuqr {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --- delegated commands ---------------------------------------------------------------


def _optional_module(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise


def _add_delegated_arguments(module: str, parser: argparse.ArgumentParser) -> None:
    mod = _optional_module(module)
    if mod is not None:
        mod.add_arguments(parser)


def _delegate(module: str):
    def run(args) -> int:
        mod = _optional_module(module)
        if mod is None:
            raise CommandError(f"{args.command} is not available in this build ({module} missing)")
        return mod.run(args)
    return run


# --- commands -------------------------------------------------------------------------


def _cmd_info(args) -> int:
    import json
    import os

    import numpy
    import scipy

    from .._gpu import gpu_info
    from .._version import __version__

    info = {"scipy_gpuqr": __version__, "python": sys.version.split()[0],
            "numpy": numpy.__version__, "scipy": scipy.__version__,
            "gpu": gpu_info(), "suitesparse": _suitesparse_status(),
            "kernel_cache": os.environ.get("CUPY_CACHE_DIR",
                                           os.path.expanduser("~/.cupy/kernel_cache"))}
    try:
        from .._kernels import kernels_dir
        info["kernels"] = str(kernels_dir())
    except FileNotFoundError as exc:
        info["kernels"] = f"missing: {exc}"
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    gpu = info["gpu"]
    print(f"scipy_gpuqr {info['scipy_gpuqr']} (python {info['python']}, numpy {info['numpy']}, "
          f"scipy {info['scipy']}, cupy {gpu.get('cupy_version') or 'not installed'})")
    if gpu["available"]:
        print(f"GPU: {gpu['name']} (sm_{gpu['compute_capability']}, "
              f"{gpu['total_memory'] / 2**30:.1f} GiB, {gpu['multiprocessors']} SMs)")
    else:
        print(f"GPU: none ({gpu['reason']})")
    for name, status in info["suitesparse"].items():
        print(f"SuiteSparse {name}: {status}")
    print(f"kernels: {info['kernels']}")
    print(f"kernel cache: {info['kernel_cache']}")
    return 0


def _suitesparse_status() -> dict:
    out = {}
    from .._cpu.colamd import colamd_available
    ok, why = colamd_available()
    out["colamd"] = "found" if ok else why
    spqr = _optional_module("scipy_gpuqr._cpu.spqr")
    if spqr is None:
        out["spqr"] = "binding not built"
    else:
        ok, why = spqr.spqr_available()
        out["spqr"] = "found" if ok else why
    return out


def _read_matrix(path: str):
    from ..io import mmread
    return mmread(path)


def _cmd_solve(args) -> int:
    import json

    import numpy as np

    from .solve_report import solve_and_report

    A = _read_matrix(args.matrix).tocsc()
    if args.rhs:
        b = np.asarray(_read_matrix(args.rhs).toarray())
        b = b[:, 0] if b.ndim == 2 and b.shape[1] == 1 else b
    else:
        b = None
    report = solve_and_report(A, b, method=args.method, backend=args.backend)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(report["text"])
    return 0


def _cmd_run(args) -> int:
    import os
    import runpy

    from .._api.patch import patched

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


def _cmd_build_kernels(args) -> int:
    from .._gpu import gpu_info
    from .._kernels import warm_cache

    info = gpu_info()
    if not info["available"]:
        raise CommandError(f"no GPU: {info['reason']} (build_kernels.py --check "
                           "compiles without one)")
    for r in warm_cache(args.cache_dir):
        print(f"{r['file']:<28} {r['variants']:>4} variants {r['seconds']:7.2f} s")
    return 0


def _cmd_calibrate(args) -> int:
    if args.tiled:
        mod = _optional_module("scipy_gpuqr._cli.tiled")
        if mod is None:
            raise CommandError("the tiled QR calibration is not available in this build")
        return mod.run(args)
    import json

    from .._dispatch.calibrate import calibrate_sparse, default_ladder, format_table
    from .._dispatch.plan import gpu_engine
    from .._gpu import gpu_info

    info = gpu_info()
    if not info["available"]:
        raise CommandError(f"sparse calibration needs a GPU ({info['reason']}); auto keeps "
                           "the default threshold of 10 flops/byte (--tiled: tiled dense QR)")
    engine, why = gpu_engine()
    if engine is None:
        raise CommandError(f"sparse calibration needs the GPU engine ({why})")

    def progress(pt):
        if not args.json:
            print(f"  {pt.name:18} intensity {pt.intensity:8.1f}  CPU {pt.cpu_s:9.4f} s  "
                  f"GPU {pt.gpu_s:9.4f} s  ratio {pt.ratio:7.3f}", file=sys.stderr, flush=True)

    cal = calibrate_sparse(default_ladder(quick=args.quick), repeats=args.repeats,
                           device=info, progress=progress)
    if args.json:
        out = cal.to_json()
        out["path"] = cal.path
        print(json.dumps(out, indent=1))
    else:
        print(format_table(cal))
    return 0


def _cmd_demo(args) -> int:
    from .solve_report import demo
    print(demo(matrix=args.matrix, grid=args.grid, backend=args.backend))
    return 0
