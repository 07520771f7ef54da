#!/usr/bin/env python3
"""Compile every CUDA kernel variant in kernels/.

    python build_kernels.py            # compile for the present GPU, fill the cache
    python build_kernels.py --check    # NVRTC only, sm_80 and sm_90, no GPU needed

Both compile the units the run time compiles (``scipy_gpuqr._kernels.compile_units``:
a variant group, or one variant of the batched n <= 32 families), from the
same flattened sources with the same options, so a kernel that fails here
would fail for users; ``--check`` exits non-zero on any error. Filling the
cache also runs the device LSQR/LSMR once (``scipy_gpuqr._iterative.warmup``)
and the GPU QR's rank decisions on small problems (``scipy_gpuqr._api.warmup``)
so that CuPy's own kernels of those paths are cached too. Before the GPU's
steps, on any host, it writes SuiteSparse's cffi declaration modules to the
package's cache folder (``scipy_gpuqr._declare_ahead``), so that no process
parses them. Installed users have the same as ``scipy-gpuqr build-kernels``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scipy_gpuqr import _kernels  # noqa: E402
from scipy_gpuqr._api.warmup import warm_rank_decisions  # noqa: E402
from scipy_gpuqr._declare_ahead import declare_ahead_line  # noqa: E402
from scipy_gpuqr._iterative.warmup import warm_device_path  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compile with NVRTC for --arch (no GPU needed)")
    parser.add_argument("--arch", action="append",
                        help="target for --check (repeatable; default sm_80, sm_90)")
    parser.add_argument("--cache-dir", help="kernel cache folder (CUPY_CACHE_DIR)")
    parser.add_argument("files", nargs="*", help="only these files of kernels/")
    args = parser.parse_args(argv)
    return run(args)


def run(args) -> int:
    """Run the check or the cache warm-up described by parsed ``args``."""
    if args.check:
        archs = args.arch or ["sm_80", "sm_90"]
        results = _kernels.check_compile(archs, args.files or None)
        failed = [r for r in results if not r["ok"]]
        for r in results:
            status = "ok  " if r["ok"] else "FAIL"
            print(f"{status} {r['file']:<28} {r['arch']:<6} "
                  f"{r['variants']:>4} variants {r['cubin_bytes']:>9} bytes "
                  f"{r.get('seconds', 0.0):6.2f} s")
            if not r["ok"]:
                print(r["log"])
        print(f"{len(results) - len(failed)} compiled, {len(failed)} failed "
              f"({len({r['file'] for r in results})} files)")
        return 1 if failed else 0
    print(declare_ahead_line(), flush=True)
    from scipy_gpuqr._gpu import gpu_info
    info = gpu_info()
    if not info["available"]:
        print(f"no GPU: {info['reason']}; use --check to compile without one")
        return 1
    for r in _kernels.warm_cache(args.cache_dir):
        print(f"{r['file']:<28} {r['variants']:>4} variants  done at {r['seconds']:7.2f} s",
              flush=True)
    print(f"{'iterative device path':<28} (CuPy's kernels) {warm_device_path():7.2f} s", flush=True)
    print(f"{'GPU QR rank decisions':<28} (CuPy's kernels) {warm_rank_decisions():7.2f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
