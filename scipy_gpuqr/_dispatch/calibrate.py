"""Measuring ``auto``'s arithmetic-intensity threshold for one GPU model.

:func:`calibrate_sparse` factorizes a ladder of generated problems
(:func:`default_ladder`: 3-D grid least squares, chessboard boundaries,
random least squares with dense rows; intensities from about 2 to about 1000
flops/byte) on the CPU backend and on the GPU backend, exactly as ``auto``
would run them: the symbolic analysis is done once (``analyze``, timed and
reported apart, never in the comparison: ``auto`` pays it whichever backend
it picks), then each backend factorizes warm *and solves*: the timed work is
the factorization plus the minimum-norm least-squares solve of one
right-hand side that ``lsqr`` runs on it (rank decision included, on the
device the factorization chose), because the backend ``auto`` picks decides
where both run, and a problem may factorize faster on one side and finish
its rank decision faster on the other. That solve belongs to the solve rules
above this package, so the caller passes it in (``solve=``, see
:func:`calibrate_sparse`). One warm-up call (kernels compiled, the GPU
schedule of that analysis cached), then the median of ``repeats`` calls
(fewer when one call is long, see :data:`POINT_BUDGET_S`). The stored
``cpu_s``/``gpu_s`` are these times; :mod:`scipy_gpuqr._dispatch.cost_model`
predicts a direct solve's time from them.

The crossover rule (:func:`fit_threshold`)
    Sort the points by intensity and take the *smallest measured intensity
    above which every measured point has the GPU faster* (GPU/CPU time
    ratio < 1). Between that point and the measured point just below it
    (the highest-intensity point where the GPU was not faster) the ratio is
    interpolated linearly in log(ratio) against log(intensity), and the
    threshold is where that line crosses 1 (clipped to the interval). So
    an isolated fast GPU point below a slower one never lowers the
    threshold (no point at or above the threshold was measured slower), and
    one noisy point near the crossing moves it only within its interval.
    Edge cases: the GPU faster on every point gives the ladder's smallest
    intensity; the GPU slower on the highest-intensity point gives
    ``inf`` (``auto`` then never picks the GPU on this model).

The result is stored per GPU model by :mod:`scipy_gpuqr._dispatch.calibration`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os
import statistics
import time
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from .. import _gpu
from .. import _testing_matrices as tm
from .._symbolic import analyze
from . import plan as _plan
from .calibration import (RULE, Calibration, CalibrationPoint, calibration_file,
                          store_calibration)

__all__ = ["LadderProblem", "default_ladder", "calibrate_sparse", "fit_threshold",
           "format_table", "warm_median", "POINT_BUDGET_S"]

#: Seconds of timed calls per backend and point beyond which fewer repeats run
#: (at least one timed call after the warm-up always runs).
POINT_BUDGET_S = 20.0

#: ``solve(A, analysis, backend) -> run(num)``: builds the least-squares solve the
#: entry points run on a factorization ``num`` of A (see :func:`calibrate_sparse`).
SolveFactory = Callable[..., Callable]


@dataclasses.dataclass(frozen=True)
class LadderProblem:
    """One rung of the ladder: a name and a generator of its matrix."""

    name: str
    make: Callable = dataclasses.field(repr=False, compare=False)


# -- the ladder ------------------------------------------------------------------------


def default_ladder(quick: bool = False) -> list:
    """Generated problems spanning arithmetic intensities of about 2 to 1000.

    Parameters
    ----------
    quick : bool
        A short ladder (intensities about 4 to 450, small problems) instead
        of the full one (up to ``ch7-8-b3``).

    Returns
    -------
    list of LadderProblem
        In increasing intensity (COLAMD analysis; the order is not relied on).
    """
    def grid(k):
        return LadderProblem(f"grid{k}", functools.partial(tm.grid3d_least_squares, k))

    def ch(m, n, k):
        return LadderProblem(f"ch{m}-{n}-b{k}", functools.partial(tm.chessboard_boundary, m, n, k))

    def rand(m, n, density, rows):
        return LadderProblem(f"rand{m}x{n}r{rows}",
                             functools.partial(tm.random_least_squares, m, n, density,
                                               dense_rows=rows, seed=1))

    if quick:
        return [grid(4), grid(6), grid(8), ch(5, 6, 2), grid(12), ch(6, 7, 2), grid(16),
                grid(20), rand(8000, 2000, 0.0015, 40), ch(6, 7, 3), grid(32)]
    return [grid(3), grid(4), ch(6, 6, 1), grid(5), ch(8, 8, 1), grid(6), grid(8),
            ch(5, 6, 2), rand(2000, 500, 0.004, 0), grid(12), ch(5, 6, 3), ch(6, 7, 2),
            grid(16), rand(4000, 1000, 0.003, 20), grid(20), rand(8000, 2000, 0.0015, 40),
            grid(24), ch(6, 7, 3), grid(32), ch(7, 7, 3), rand(20000, 4000, 0.0012, 40),
            grid(40), ch(7, 8, 3)]


# -- timing ----------------------------------------------------------------------------


def _gpu_sync() -> None:
    cp = _gpu.import_cupy()
    if cp is not None:
        cp.cuda.Device().synchronize()


def _free(num) -> None:
    free = getattr(num, "free", None)
    if callable(free):
        free()


def warm_median(factorize: Callable, A, analysis, repeats: int, *,
                sync: Callable = lambda: None, budget_s: float = POINT_BUDGET_S,
                solve: Optional[Callable] = None) -> float:
    """Median wall time of ``factorize`` (and ``solve``) after one warm-up call.

    ``factorize(A, ordering=..., colperm=None, tol=None, analysis=analysis)``
    as returned by :func:`scipy_gpuqr._dispatch.plan.backend_factorizer`;
    ``solve(num)``, when given, runs on its result inside the timed region
    (what the entry points do after factorizing); ``sync`` runs before each
    clock read (device synchronisation). The number of timed calls is
    ``repeats``, reduced so that they take about ``budget_s`` (judged from
    the warm-up), never below one.
    """
    def once():
        sync()
        t0 = time.perf_counter()
        num = factorize(A, ordering="colamd", colperm=None, tol=None, analysis=analysis)
        if solve is not None:
            solve(num)
        sync()
        dt = time.perf_counter() - t0
        _free(num)
        del num
        return dt

    first = once()
    n = max(1, min(int(repeats), int(budget_s // max(first, 1e-9))))
    return float(statistics.median(once() for _ in range(n)))


def _default_timer(backends: Sequence[str], repeats: int, solve: SolveFactory):
    """``timer(backend, problem, A, analysis) -> seconds`` measuring the warm
    factorization of tall problems plus ``solve``'s least-squares solve (the
    factorization alone for wide ones), and the backend that runs for each name."""
    fns, ran = {}, {}
    for name in backends:
        fn, actual, note = _plan.backend_factorizer(name)
        if fn is None:
            raise RuntimeError(f"backend {name!r} cannot run: {note}")
        fns[name], ran[name] = fn, actual

    def timer(backend: str, problem: str, A, analysis) -> float:
        sync = _gpu_sync if ran[backend] == "gpu" else (lambda: None)
        run = solve(A, analysis, ran[backend]) if A.shape[0] >= A.shape[1] else None
        return warm_median(fns[backend], A, analysis, repeats, sync=sync, solve=run)

    return timer, ran


# -- the fit ---------------------------------------------------------------------------


def fit_threshold(intensities: Sequence[float], ratios: Sequence[float]) -> float:
    """Crossover intensity of GPU/CPU time ratios (the module's rule).

    Parameters
    ----------
    intensities : sequence of float
        Arithmetic intensity of each measured problem (> 0).
    ratios : sequence of float
        GPU time / CPU time of each problem (< 1: the GPU is faster).

    Returns
    -------
    float
        The threshold: the smallest measured intensity above which every
        ratio is < 1, moved down to where the log-log line through it and
        the measured point below it crosses ratio 1; the smallest intensity
        when the GPU wins everywhere; ``inf`` when the GPU loses at the
        highest intensity measured.

    Raises
    ------
    ValueError
        No points, lengths differ, or a non-positive/non-finite intensity.
    """
    x = np.asarray(intensities, dtype=np.float64)
    r = np.asarray(ratios, dtype=np.float64)
    if x.shape != r.shape or x.ndim != 1 or x.size == 0:
        raise ValueError("fit_threshold needs equally many intensities and ratios (>= 1)")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError("intensities must be positive and finite")
    r = np.where(np.isnan(r), np.inf, r)  # an unmeasurable GPU time counts as slower
    order = np.lexsort((r, x))  # by intensity; at equal intensity the slower last
    x, r = x[order], r[order]
    slower = np.nonzero(~(r < 1.0))[0]
    if slower.size == 0:
        return float(x[0])
    last = int(slower[-1])
    if last == x.size - 1:
        return math.inf
    x0, x1, r0, r1 = x[last], x[last + 1], r[last], r[last + 1]
    if x1 <= x0 or not np.isfinite(r0) or r0 <= 0 or r1 <= 0:
        return float(x1)
    # log r = log r0 + s (log x - log x0), s = log(r1/r0)/log(x1/x0) < 0; crossing at log r = 0
    s = math.log(r1 / r0) / math.log(x1 / x0)
    t = math.exp(math.log(x0) - math.log(r0) / s)
    return float(min(max(t, x0), x1))


# -- the measurement -------------------------------------------------------------------


def calibrate_sparse(ladder: Optional[Sequence[LadderProblem]] = None, *,
                     backends: Sequence[str] = ("cpu", "gpu"), repeats: int = 3,
                     timer: Optional[Callable] = None, device: Optional[Mapping] = None,
                     store: bool = True, directory: Optional[os.PathLike] = None,
                     progress: Optional[Callable[[CalibrationPoint], None]] = None,
                     solve: Optional[SolveFactory] = None) -> Calibration:
    """Measure both backends on a ladder, fit the threshold, store it per GPU model.

    Parameters
    ----------
    ladder : sequence of LadderProblem, optional
        Problems to factorize (default :func:`default_ladder`).
    backends : (cpu_backend, gpu_backend)
        The two sides compared, as ``backend=`` names (default
        ``('cpu', 'gpu')``: SuiteSparseQR, or our reference when SuiteSparse
        is missing, against the GPU engine).
    repeats : int
        Timed calls per backend and problem after the warm-up (median).
    timer : callable, optional
        ``timer(backend, name, A, analysis) -> seconds`` replaces the
        measurement (tests inject timings with it; no GPU is then needed).
    device : mapping, optional
        The GPU description (``name``, ``compute_capability``,
        ``cupy_version``); default :func:`scipy_gpuqr._gpu.gpu_info`.
    store : bool
        Write the result to the cache file.
    directory : path, optional
        Cache folder (default the user cache folder).
    progress : callable, optional
        Called with each :class:`CalibrationPoint` as it is measured.
    solve : callable, optional
        ``solve(A, analysis, backend) -> run``, where ``run(num)`` is the
        least-squares solve the entry points run on a factorization ``num``
        of A (``scipy_gpuqr._factor.factored.least_squares_probe``); timed
        with each factorization of a tall problem. Required unless ``timer``
        is given.

    Returns
    -------
    Calibration

    Raises
    ------
    RuntimeError
        No GPU (or no GPU engine) and no ``timer``; a backend that cannot run.
    ValueError
        Bad ``backends`` or ``repeats``, an empty ladder, or neither ``timer``
        nor ``solve``.
    """
    if len(backends) != 2 or backends[0] == backends[1]:
        raise ValueError(f"backends must name two different backends, got {backends!r}")
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    ladder = list(default_ladder() if ladder is None else ladder)
    if not ladder:
        raise ValueError("the calibration ladder is empty")
    if device is None:
        device = _gpu.gpu_info()
        if timer is None and not device.get("available"):
            raise RuntimeError(f"sparse calibration needs a GPU: {device.get('reason')}")
    if not device.get("name"):
        raise RuntimeError("sparse calibration needs a GPU model name")
    ran = {b: b for b in backends}
    if timer is None:
        if "gpu" in backends:
            fn, why = _plan.gpu_engine()
            if fn is None:
                raise RuntimeError(f"sparse calibration needs the GPU engine: {why}")
        if solve is None:
            raise ValueError("calibrate_sparse measures with solve= (the least-squares "
                             "solve of the entry points) unless a timer= is given")
        timer, ran = _default_timer(backends, repeats, solve)
    cpu_side, gpu_side = backends
    points = []
    for prob in ladder:
        A = prob.make()
        t0 = time.perf_counter()
        an = analyze(A)
        analyze_s = time.perf_counter() - t0
        cpu_s = float(timer(cpu_side, prob.name, A, an))
        gpu_s = float(timer(gpu_side, prob.name, A, an))
        pt = CalibrationPoint(name=prob.name, shape=tuple(int(s) for s in A.shape),
                              nnz=int(A.nnz), flops=float(an.flops),
                              intensity=float(an.intensity), analyze_s=analyze_s,
                              cpu_s=cpu_s, gpu_s=gpu_s, cpu_backend=ran[cpu_side])
        points.append(pt)
        if progress is not None:
            progress(pt)
    threshold = fit_threshold([p.intensity for p in points], [p.ratio for p in points])
    cal = Calibration(gpu_name=str(device["name"]),
                      compute_capability=str(device.get("compute_capability", "")),
                      cupy_version=str(device.get("cupy_version", "")),
                      threshold=threshold, points=tuple(points),
                      date=datetime.date.today().isoformat(), rule=RULE,
                      host=f"{os.cpu_count()} cores, backend {ran[cpu_side]!r}")
    if store:
        path = calibration_file(directory)
        store_calibration(path, cal)
        cal = dataclasses.replace(cal, path=str(path))
    return cal


def format_table(cal: Calibration) -> str:
    """The measured points, the fitted threshold and the cache file, as text."""
    lines = [f"{'problem':18} {'shape':>15} {'intensity':>9} {'analyze s':>9} "
             f"{'CPU s':>9} {'GPU s':>9} {'GPU/CPU':>8}"]
    for p in sorted(cal.points, key=lambda q: q.intensity):
        shape = "x".join(str(s) for s in p.shape)
        lines.append(f"{p.name:18} {shape:>15} {p.intensity:9.1f} {p.analyze_s:9.3f} "
                     f"{p.cpu_s:9.4f} {p.gpu_s:9.4f} {p.ratio:8.3f}")
    lines.append(f"{cal.describe()} (rule: {cal.rule}; CPU side: {cal.host})")
    lines.append(f"stored in {cal.path}" if cal.path else "not stored")
    return "\n".join(lines)
