"""``scipy-gpuqr build-kernels``: compile every kernel for the present GPU into the cache
(and CuPy's own kernels of the iterative device path and of the GPU QR's rank decisions),
after writing SuiteSparse's cffi declaration modules to the package's cache folder
(on any host: :mod:`scipy_gpuqr._declare_ahead`).

Prints one line per kernel file (variants compiled, seconds). Without a GPU
it says so (``python build_kernels.py --check`` compiles the kernels with
NVRTC without one).
"""

from __future__ import annotations

from .. import _gpu, _kernels
from .._api.warmup import warm_rank_decisions
from .._declare_ahead import declare_ahead_line
from .._iterative.warmup import warm_device_path
from ._common import CommandError

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of the ``build-kernels`` subcommand."""
    parser.add_argument("--cache-dir", help="kernel cache folder (sets CUPY_CACHE_DIR)")


def run(args) -> int:
    """Write the cffi declarations, compile the kernels; returns the exit status."""
    print(declare_ahead_line(), flush=True)
    info = _gpu.gpu_info()
    if not info["available"]:
        raise CommandError(f"no GPU: {info['reason']} (build_kernels.py --check "
                           "compiles without one)")
    for r in _kernels.warm_cache(args.cache_dir):
        print(f"{r['file']:<28} {r['variants']:>4} variants {r['seconds']:7.2f} s", flush=True)
    print(f"{'iterative device path':<28} (CuPy's kernels) {warm_device_path():7.2f} s", flush=True)
    print(f"{'GPU QR rank decisions':<28} (CuPy's kernels) {warm_rank_decisions():7.2f} s",
          flush=True)
    return 0
