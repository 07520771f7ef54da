"""Predicted time of a planned direct solve, from the calibration's measurements.

``auto``'s iterate-first rule (:mod:`scipy_gpuqr._dispatch.iterate_first`) lets
SciPy's LSQR/LSMR iterate only while their projected time stays within the
direct solve's predicted time, so that a patched call is never much slower
than the better of the two. The prediction interpolates the warm times that
``scipy-gpuqr calibrate`` stored for this GPU model
(:mod:`scipy_gpuqr._dispatch.calibration`: the factorization plus
one least-squares solve, both backends, against the analysis' flop count),
log-log between measured points and proportionally to the flops beyond them.
Without a calibration a deliberately simple model answers: a fixed overhead
plus flops at a nominal rate (:data:`NOMINAL_RATES`, the CPU's scaled by the
core count), within a small factor of measured times.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import numpy as np

from .calibration import load_calibration

__all__ = ["NOMINAL_RATES", "NOMINAL_OVERHEAD_S", "predicted_seconds", "interpolate_seconds"]

#: Flop rates without a calibration: SuiteSparseQR per CPU core, the GPU engine.
NOMINAL_RATES = {"cpu": 4e9, "gpu": 1.5e12}
#: Fixed cost of one factorization call without a calibration (seconds).
NOMINAL_OVERHEAD_S = {"cpu": 3e-3, "gpu": 8e-3}


def interpolate_seconds(points: Sequence[tuple], flops: float) -> float:
    """Time at ``flops`` from measured ``(flops, seconds)`` points.

    Log-log linear between neighbouring points; below the smallest, its time
    (the fixed cost dominates there); above the largest, proportional to the
    flops from it (the rate of large problems).
    """
    pts = sorted((float(f), float(s)) for f, s in points if f > 0 and s > 0)
    if not pts:
        raise ValueError("no usable points")
    f = max(float(flops), 1.0)
    if f <= pts[0][0]:
        return pts[0][1]
    if f >= pts[-1][0]:
        return pts[-1][1] * f / pts[-1][0]
    lf = np.log([p[0] for p in pts])
    ls = np.log([p[1] for p in pts])
    return float(np.exp(np.interp(math.log(f), lf, ls)))


def _nominal(backend: str, flops: float) -> float:
    kind = "gpu" if backend == "gpu" else "cpu"
    rate = NOMINAL_RATES[kind] * (max(os.cpu_count() or 1, 1) if kind == "cpu" else 1)
    return NOMINAL_OVERHEAD_S[kind] + flops / rate


def predicted_seconds(backend: str, flops: float, gpu_name: Optional[str] = None) -> float:
    """Predicted warm time (seconds) of factorizing ``flops`` on ``backend`` and solving.

    A calibration that timed the least-squares solve with the factorization
    predicts both; one that timed the factorization alone, and the nominal
    model, predict the factorization.

    Parameters
    ----------
    backend : str
        The backend a plan will run ('gpu', 'cpu', 'reference', 'simulate').
    flops : float
        The analysis' flop count.
    gpu_name : str, optional
        GPU model whose stored calibration to use (its CPU column for the CPU
        backends: it was measured on this host).
    """
    if not (flops >= 0):
        return float("nan")
    cal = load_calibration(gpu_name) if gpu_name else None
    if cal is not None and backend in ("gpu", "cpu"):
        attr = "gpu_s" if backend == "gpu" else "cpu_s"
        pts = [(p.flops, getattr(p, attr)) for p in cal.points]
        try:
            return interpolate_seconds(pts, flops)
        except ValueError:
            pass
    return _nominal(backend, flops)
