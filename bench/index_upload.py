"""R's gather index sent up through pinned chunks against one copy from pageable memory.

::

    python3 bench/index_upload.py --grid 64 --gpus 1,4 --reps 3

Each R copier uploads its stage's gather index (grid 64³: 326 million entries
for the upper stage on four GPUs) before it copies R back. The package sends it
through two pinned buffers in turn (``rcopy.upload_through_pinned``); the
``pageable`` arm replaces that by the one copy from pageable memory it
replaced, which holds the driver for the whole transfer. One process, the
grid's analysis once, a warm-up call per device count, then the arms
alternated: per call the wall seconds and, on several GPUs, the first split
front's wait in recording its ready event (``info['split_fronts'][0]
['host_seconds']['ready']``); medians and the speedup against the one-GPU
calls of both arms. Several GPUs use the flops mapping (``device_speeds=None``),
as ``bench/multi_gpu.py`` does by default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))


def _pageable(cp, out, host, stream, chunk_bytes=None):
    """The upload before the pinned chunks: one copy from pageable memory."""
    out.set(host, stream=stream)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, default=64)
    p.add_argument("--gpus", default="1,4")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)

    import cupy as cp

    from scipy_gpuqr._engine.gpu import multi_device, rcopy
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares

    arms = {"pinned": rcopy.upload_through_pinned, "pageable": _pageable}

    def sync():
        for d in range(cp.cuda.runtime.getDeviceCount()):
            cp.cuda.Device(d).synchronize()

    A = grid3d_least_squares(a.grid)
    A.data = np.random.default_rng(1).standard_normal(A.nnz)
    t = time.perf_counter()
    an = analyze(A)
    print(f"grid {a.grid}^3 {A.shape[0]}x{A.shape[1]}: analysed in "
          f"{time.perf_counter() - t:.1f} s", flush=True)

    def call(k, arm):
        rcopy.upload_through_pinned = arms[arm]
        try:
            sync()
            t = time.perf_counter()
            qr = (gpu_factorize(A, an) if k == 1 else multi_device.multi_gpu_factorize(
                A, an, devices=tuple(range(k)), device_speeds=None))
            s = time.perf_counter() - t
        finally:
            rcopy.upload_through_pinned = arms["pinned"]
        split = qr.info.get("split_fronts") or []
        wait = (split[0]["host_seconds"]["ready"]
                if split and split[0].get("host_seconds") else float("nan"))
        qr.free()
        sync()
        print(f"  {k} GPU {arm:8s} {s:.3f} s  first split ready {wait:.3f} s", flush=True)
        return s, wait

    rows = {}
    for k in (int(g) for g in a.gpus.split(",")):
        call(k, "pinned")                               # warm-up: kernels, plans
        for _ in range(a.reps):
            for arm in arms:
                rows.setdefault((k, arm), []).append(call(k, arm))
    ones = [s for (k, _), v in rows.items() if k == 1 for s, _ in v]
    one = statistics.median(ones) if ones else float("nan")
    print("| GPUs | index upload | calls s | median s | x one GPU | first split ready s |")
    print("|---|---|---|---|---|---|")
    for (k, arm), v in sorted(rows.items()):
        med = statistics.median(s for s, _ in v)
        print(f"| {k} | {arm} | {', '.join('%.3f' % s for s, _ in v)} | {med:.3f} | "
              f"{one / med:.2f} | {', '.join('%.3f' % w for _, w in v)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
