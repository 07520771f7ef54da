"""R's gather index: kept pinned, through pinned chunks, or one copy from pageable memory.

::

    python3 bench/index_upload.py --grid 64 --gpus 1,4 --reps 3

Each R copier uploads its stage's gather index (grid 64³: 326 million entries
for the upper stage on four GPUs) before it copies R back. The arms:

* ``kept`` (the package's default on several GPUs): a copy of each copier's
  index kept in pinned memory with R's layout, made at the end of the first
  call (``pinned_index``), goes up in one asynchronous copy; on one GPU the
  bench keeps such a copy itself (the one-GPU engine keeps none);
* ``chunks`` (the package's default on one GPU, and where no copy is kept):
  through two pinned buffers in turn, each filled on a few threads
  (``rcopy.upload_through_pinned``);
* ``chunks1``: the same, each buffer filled by one thread (the upload before);
* ``pageable``: one copy from pageable memory, which holds the driver for the
  whole transfer (the upload before that).

One process, the grid's analysis once, a warm-up call per device count (in the
``kept`` arm: it makes the kept copies), then the arms alternated: per call the
wall seconds, the copiers' largest ``prepare`` seconds (index upload, slots,
final entries) and, on several GPUs, the first split front's wait in
recording its ready event (``info['split_fronts'][0]['host_seconds']['ready']``),
on one GPU the engine's waits for R's copy and for the device; medians and the
speedup against the median one-GPU call of the arm ``--anchor``. Several GPUs
use the flops mapping (``device_speeds=None``), as ``bench/multi_gpu.py`` does
by default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

ARMS = ("kept", "chunks", "chunks1", "pageable")


def _pageable(cp, out, host, stream, chunk_bytes=None):
    """One copy from pageable memory."""
    out.set(host, stream=stream)


def _one_thread(cp, out, host, stream, chunk_bytes=32 << 20):
    """Through two pinned buffers in turn, each filled by one thread."""
    import cupyx
    n = int(host.size)
    m = max(int(chunk_bytes) // host.itemsize, 1)
    if n <= m:
        out.set(host, stream=stream)
        return
    bufs = [cupyx.empty_pinned((m,), dtype=host.dtype) for _ in range(2)]
    sent = [None, None]
    for k, first in enumerate(range(0, n, m)):
        last = min(first + m, n)
        s = k % 2
        if sent[s] is not None:
            sent[s].synchronize()
        np.copyto(bufs[s][:last - first], host[first:last])
        out[first:last].set(bufs[s][:last - first], stream=stream)
        sent[s] = cp.cuda.Event(disable_timing=True)
        sent[s].record(stream)
    for ev in sent:
        if ev is not None:
            ev.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, default=64)
    p.add_argument("--gpus", default="1,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--anchor", default="chunks", help="the one-GPU arm the speedups are against")
    a = p.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]

    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.gpu import device as gpu_device
    from scipy_gpuqr._engine.gpu import multi_device, rcopy
    from scipy_gpuqr._engine.gpu.driver import gpu_factorize
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import grid3d_least_squares

    uploads = {"chunks": rcopy.upload_through_pinned, "chunks1": _one_thread,
               "pageable": _pageable, "kept": rcopy.upload_through_pinned}
    kept_lookup = multi_device.kept_pinned_index
    base_copy = rcopy.CupyRCopy
    copiers = []
    one_gpu_kept = {}                   # id(index) -> (index, pinned copy): the kept arm on one GPU
    state = {"arm": None}

    def one_gpu_pin(index):
        hit = one_gpu_kept.get(id(index))
        if hit is None or hit[0] is not index:
            pin = cupyx.empty_pinned(index.shape, dtype=index.dtype)
            pin[...] = index
            one_gpu_kept[id(index)] = hit = (index, pin)
        return hit[1]

    class SeenCopy(base_copy):
        def __init__(self, device, pool, index, staging, final=None, sink=None, pin=None):
            if pin is None and state["arm"] == "kept":
                pin = one_gpu_pin
            super().__init__(device, pool, index, staging, final, sink=sink, pin=pin)
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
        state["arm"] = arm
        rcopy.upload_through_pinned = uploads[arm]
        if arm != "kept":
            multi_device.kept_pinned_index = lambda *args, **kw: None
        copiers.clear()
        try:
            sync()
            t = time.perf_counter()
            qr = (gpu_factorize(A, an) if k == 1 else multi_device.multi_gpu_factorize(
                A, an, devices=tuple(range(k)), device_speeds=None))
            s = time.perf_counter() - t
        finally:
            rcopy.upload_through_pinned = uploads["chunks"]
            multi_device.kept_pinned_index = kept_lookup
            state["arm"] = None
        info = qr.info
        split = info.get("split_fronts") or []
        wait = (split[0]["host_seconds"]["ready"]
                if split and split[0].get("host_seconds") else float("nan"))
        prep = max((c.seconds.get("prepare", 0.0) for c in copiers), default=0.0)
        big = max(copiers, key=lambda c: c.n, default=None)
        sec = info.get("seconds", {})
        extra = (f"wait R copy {sec.get('wait_r_copy', 0):.3f} wait gpu "
                 f"{sec.get('wait_gpu', 0):.3f} launch loop {sec.get('launch_loop', 0):.3f}"
                 if k == 1 else
                 f"first split ready {wait:.3f} pinned now {info.get('pinned_indices')}")
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
        t = time.perf_counter()
        try:                            # warm-up: kernels, plans, kept copies
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
