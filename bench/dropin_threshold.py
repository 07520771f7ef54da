"""Calibrating ``spsolve``/``factorized``'s choice between SciPy's SuperLU and the GPU sparse QR.

Under ``auto`` a square system goes to SciPy's SuperLU at once below
``SUPERLU_ALWAYS_NNZ`` stored entries (the size gate: the GPU is not asked),
and above it the QR analysis' arithmetic intensity decides against the
threshold stored per GPU model as ``spsolve_threshold`` (default 40
flops/byte, an estimate). This script measures both on one GPU machine::

    source .dev/remote-setup.sh
    timeout 150 python3 bench/dropin_threshold.py --json $OUT/threshold.json
    python3 bench/dropin_threshold.py --quick --backends superlu-vs-cpu     # dry run, no GPU

1. The threshold: :func:`scipy_gpuqr._dispatch.calibrate.calibrate_sparse` on
   a square ladder of convection-diffusion operators (2-D and 3-D, on both
   sides of the size gate), SuperLU's factorization and solve of one
   right-hand side against the GPU backend's factorization and exact solve
   (the analysis timed apart: ``auto`` has paid it whichever side answers),
   fitted by the calibration's crossover rule. The QR threshold is not
   recalibrated here (a one-problem ladder stands in; ``scipy-gpuqr calibrate``
   measures both).
2. The size gate: every ladder point below it where the GPU was faster than
   SuperLU is listed (the gate would then be too high); the smallest point
   above it where the GPU was slower likewise.
3. End to end, above the gate: SciPy's ``spsolve`` against ours under
   ``auto`` with the fitted threshold (``gpuqr_options``), warm medians: what
   a patched caller would see (the analysis included on our side).

``--store`` writes the fitted thresholds to this machine's calibration file
(what ``scipy-gpuqr calibrate`` does); by default nothing is stored.
``--backends superlu-vs-cpu`` runs the same procedure against the CPU QR, for
a dry run without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as spla

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import scipy_gpuqr  # noqa: E402
from scipy_gpuqr._api.spsolve import spsolve_probe  # noqa: E402
from scipy_gpuqr._dispatch import calibrate as cal_mod  # noqa: E402
from scipy_gpuqr._dispatch.plan import SUPERLU_ALWAYS_NNZ  # noqa: E402
from scipy_gpuqr._factor.factored import least_squares_probe  # noqa: E402

#: (k, dim) of the square ladder: intensities from about 10 to about 250,
#: stored entries from 3e4 to 3.3e5 (the gate at 2e5 inside it).
LADDER = ((16, 3), (128, 2), (20, 3), (24, 3), (256, 2), (28, 3), (32, 3))
QUICK_LADDER = ((16, 3), (24, 3), (256, 2), (32, 3))


def square_ladder(pairs):
    return [cal_mod.LadderProblem(f"cd{d}-{k}", lambda k=k, d=d: cal_mod.convection_diffusion(k, d))
            for k, d in pairs]


def end_to_end(A, threshold: float, reps: int, backend_side: str) -> tuple:
    """Warm median seconds of SciPy's spsolve and of ours under ``auto`` with ``threshold``."""
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    opts = scipy_gpuqr.GpuqrOptions(spsolve_threshold=threshold)
    ours = (lambda: scipy_gpuqr.spsolve(A, b, gpuqr_options=opts)) if backend_side == "gpu" \
        else (lambda: scipy_gpuqr.spsolve(A, b, backend="cpu"))
    theirs = lambda: spla.spsolve(A, b)                     # noqa: E731
    for f in (theirs, ours):
        f()
    ts, to = [], []
    for _ in range(reps):
        for f, out in ((theirs, ts), (ours, to)):
            t0 = time.perf_counter()
            f()
            if backend_side == "gpu":
                cal_mod._gpu_sync()
            out.append(time.perf_counter() - t0)
    return statistics.median(ts), statistics.median(to)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="four problems instead of seven (two on each side of the gate)")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per side (median)")
    ap.add_argument("--backends", choices=("superlu-vs-gpu", "superlu-vs-cpu"),
                    default="superlu-vs-gpu")
    ap.add_argument("--store", action="store_true", help="store the fitted thresholds")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    side = args.backends.rsplit("-", 1)[1]
    info = scipy_gpuqr.gpu_info()
    if side == "gpu" and not info["available"]:
        print(f"no GPU ({info['reason']}): --backends superlu-vs-cpu for a dry run")
        return 2
    device = info if side == "gpu" else {"name": "dry run (CPU QR)"}
    ladder = square_ladder(QUICK_LADDER if args.quick else LADDER)

    def progress(pt):
        print(f"  {pt.name:10} n={pt.shape[0]:6d} nnz={pt.nnz:7d} intensity {pt.intensity:7.1f}"
              f"  analyse {pt.analyze_s:7.3f} s  {pt.cpu_backend} {pt.cpu_s:8.4f} s  "
              f"QR {pt.gpu_s:8.4f} s  ratio {pt.ratio:6.3f}", flush=True)

    qr_side = ("cpu", "gpu") if side == "gpu" else ("reference", "cpu")
    cal = cal_mod.calibrate_sparse([cal_mod.LadderProblem(
        "grid8", lambda: cal_mod.tm.grid3d_least_squares(8))], backends=qr_side,
        repeats=args.repeats, device=device, store=args.store and side == "gpu",
        progress=progress, solve=least_squares_probe, spsolve_ladder=ladder,
        square_solve=spsolve_probe)
    points = cal.spsolve_points
    threshold = cal.spsolve_threshold
    print(f"device: {device.get('name')}; fitted threshold against SuperLU: {threshold:.4g} "
          f"flops/byte" + (f" (stored in {cal.path})" if cal.path else " (not stored)"))
    below = [p for p in points if p.nnz < SUPERLU_ALWAYS_NNZ]
    above = [p for p in points if p.nnz >= SUPERLU_ALWAYS_NNZ]
    wrong = [p.name for p in below if p.ratio < 1]
    print(f"size gate {SUPERLU_ALWAYS_NNZ} stored entries: {len(below)} points below it, "
          f"QR faster than SuperLU on {wrong or 'none'} of them"
          + ("  <- the gate is too high for this GPU" if wrong else ""))
    rows = []
    for p in above:
        A = next(q for q in ladder if q.name == p.name).make()
        s, o = end_to_end(A, threshold, max(args.repeats, 1), side)
        rows.append({"name": p.name, "nnz": p.nnz, "intensity": p.intensity,
                     "scipy_s": s, "auto_s": o, "ratio": o / s})
        print(f"  end to end {p.name:10} SciPy spsolve {s:8.4f} s  ours (auto, threshold "
              f"{threshold:.3g}) {o:8.4f} s  ratio {o / s:6.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.get("name"), "threshold": threshold, "gate": SUPERLU_ALWAYS_NNZ,
            "gate_wrong_on": wrong, "points": [dataclasses.asdict(p) for p in points],
            "end_to_end": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
