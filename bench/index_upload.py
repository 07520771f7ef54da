"""R's gather index: through pinned chunks, kept pinned, or one copy from pageable memory.

::

    python3 bench/index_upload.py --grid 64 --gpus 1,4 --reps 3

Each R copier uploads its stage's gather index (grid 64³: 862 million int64
entries on one GPU; 326 million int32 for the upper stage on four) before it
copies R back. The arms:

* ``package``: as the package sends it: one copy from pageable memory on one
  GPU, through pinned chunks on several (``CupyRCopy(index_through_pinned=True)``);
* ``chunks``: through two pinned buffers in turn (``rcopy.upload_through_pinned``)
  on one GPU too;
* ``kept``: a pinned copy of each index, made by the bench in the warm-up call
  and kept, goes up in one asynchronous copy;
* ``pageable``: one copy from pageable memory on several GPUs too, which holds
  the driver for the whole transfer.

One process, the grid's analysis once, a warm-up call per device count (in the
``kept`` arm where it runs: it makes the kept copies), then the arms
alternated (``--arms`` on one GPU, ``--arms-many`` on several): per call the
wall seconds, an R checksum, the copiers' largest ``prepare`` seconds (index
upload, slots, final entries) and, on several GPUs, the first split front's
wait in recording its ready event
(``info['split_fronts'][0]['host_seconds']['ready']``), on one GPU the
engine's waits for R's copy and for the device and its launch loop; medians
and the speedup against the median one-GPU call of the arm ``--anchor``.
Several GPUs use the flops mapping (``device_speeds=None``), as
``bench/multi_gpu.py`` does by default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

ARMS = ("package", "chunks", "kept", "pageable")
#: Each arm's ``index_through_pinned`` (None: the package's own choice).
THROUGH_PINNED = {"package": None, "chunks": True, "kept": True, "pageable": False}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, default=64)
    p.add_argument("--gpus", default="1,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--arms", default="package,chunks",
                   help="arms on one GPU, in order (of " + ",".join(ARMS) + ")")
    p.add_argument("--arms-many", default="package,pageable",
                   help="arms on several GPUs, in order")
    p.add_argument("--anchor", default="package", help="the one-GPU arm the speedups are against")
    a = p.parse_args(argv)

    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.gpu import device as gpu_device
    from scipy_gpuqr._engine.gpu import multi_device, rcopy
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares

    package = rcopy.upload_through_pinned
    held = {}                           # id(index) -> (index, its pinned copy): the kept arm

    def kept(cp_, out, host, stream, chunk_bytes=None):
        hit = held.get(id(host))
        if hit is None or hit[0] is not host:
            pin = cupyx.empty_pinned(host.shape, dtype=host.dtype)
            np.copyto(pin, host)
            held[id(host)] = hit = (host, pin)
        out.set(hit[1], stream=stream)

    copiers = []
    arm_now = ["package"]
    base_copy = rcopy.CupyRCopy

    class SeenCopy(base_copy):
        def __init__(self, *args, **kw):
            pinned = THROUGH_PINNED[arm_now[0]]
            if pinned is not None:
                kw["index_through_pinned"] = pinned
            super().__init__(*args, **kw)
            copiers.append(self)

    multi_device.CupyRCopy = gpu_device.CupyRCopy = SeenCopy

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
        rcopy.upload_through_pinned = kept if arm == "kept" else package
        arm_now[0] = arm
        copiers.clear()
        try:
            sync()
            t = time.perf_counter()
            qr = (gpu_factorize(A, an) if k == 1 else multi_device.multi_gpu_factorize(
                A, an, devices=tuple(range(k)), device_speeds=None))
            s = time.perf_counter() - t
        finally:
            rcopy.upload_through_pinned = package
            arm_now[0] = "package"
        info = qr.info
        split = info.get("split_fronts") or []
        wait = (split[0]["host_seconds"]["ready"]
                if split and split[0].get("host_seconds") else float("nan"))
        prep = max((c.seconds.get("prepare", 0.0) for c in copiers), default=0.0)
        big = max(copiers, key=lambda c: c.n, default=None)
        sec = info.get("seconds", {})
        extra = (f"wait R copy {sec.get('wait_r_copy', 0):.3f} wait gpu "
                 f"{sec.get('wait_gpu', 0):.3f} launch loop {sec.get('launch_loop', 0):.3f}"
                 if k == 1 else f"first split ready {wait:.3f}")
        chk = float(np.abs(qr.R.data[::1000]).sum())
        qr.free()
        sync()
        print(f"  {k} GPU {arm:8s} {s:.3f} s  R check {chk:.9e}  copiers {len(copiers)} largest "
              f"{0 if big is None else big.n} x {0 if big is None else big.index.itemsize} B "
              f"(prepare {0.0 if big is None else big.seconds.get('prepare', 0.0):.3f} s) "
              f"max prepare {prep:.3f} s  {extra}", flush=True)
        return s, wait, prep

    rows = {}
    for k in (int(g) for g in a.gpus.split(",")):
        arms = [x for x in (a.arms if k == 1 else a.arms_many).split(",") if x]
        t = time.perf_counter()
        try:                            # warm-up: kernels, plans, the kept copies
            call(k, "kept" if "kept" in arms else arms[0])
        except Exception as exc:                # noqa: BLE001 - the arms go on
            print(f"  {k} GPU warm-up: {type(exc).__name__}: {exc}", flush=True)
        print(f"  warm-up {time.perf_counter() - t:.1f} s", flush=True)
        for _ in range(a.reps):
            for arm in arms:
                try:
                    rows.setdefault((k, arm), []).append(call(k, arm))
                except Exception as exc:        # noqa: BLE001 - the other arms go on
                    print(f"  {k} GPU {arm}: {type(exc).__name__}: {exc}", flush=True)
        held.clear()                    # the kept copies of this device count's indices
    ones = [s for s, _, _ in rows.get((1, a.anchor), [])]
    one = statistics.median(ones) if ones else float("nan")
    print(f"| GPUs | index upload | calls s | median s | x one GPU ({a.anchor}) | "
          "largest prepare s | first split ready s |")
    print("|---|---|---|---|---|---|---|")
    for (k, arm), v in sorted(rows.items()):
        if not v:
            continue
        med = statistics.median(s for s, _, _ in v)
        print(f"| {k} | {arm} | {', '.join('%.3f' % s for s, _, _ in v)} | {med:.3f} | "
              f"{one / med:.2f} | {statistics.median(x for _, _, x in v):.3f} | "
              f"{', '.join('%.3f' % w for _, w, _ in v)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
