"""``scipy-gpuqr info``: versions, GPU, SuiteSparse libraries, kernels and their cache.

``--json`` prints the same as JSON (keys ``scipy_gpuqr``, ``python``,
``numpy``, ``scipy``, ``gpu``, ``suitesparse``, ``kernel_cache``,
``kernels``).
"""

from __future__ import annotations

import json
import os
import sys

import numpy
import scipy

from .. import _gpu, _kernels
from .._cpu import colamd, spqr
from .._version import __version__

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of the ``info`` subcommand."""
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    """Print what this installation has; returns the exit status."""
    info = {"scipy_gpuqr": __version__, "python": sys.version.split()[0],
            "numpy": numpy.__version__, "scipy": scipy.__version__,
            "gpu": _gpu.gpu_info(), "suitesparse": _suitesparse_status(),
            "kernel_cache": os.environ.get("CUPY_CACHE_DIR",
                                           os.path.expanduser("~/.cupy/kernel_cache"))}
    if info["gpu"].get("cupy_version") is None:     # not asked where the host has no CUDA driver
        cp = _gpu.import_cupy()
        info["gpu"]["cupy_version"] = cp.__version__ if cp is not None else None
    try:
        info["kernels"] = str(_kernels.kernels_dir())
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
    ok, why = colamd.colamd_available()
    out["colamd"] = "found" if ok else why
    ok, why = spqr.spqr_available()
    out["spqr"] = "found" if ok else why
    return out
