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

The threshold against SciPy's SuperLU (``spsolve``/``factorized``)
    ``auto``'s square solves weigh the GPU QR against SciPy's own function,
    not a CPU QR, so they have their own threshold (``spsolve_threshold``,
    stored beside the QR one). :func:`calibrate_sparse` measures it on a
    ladder of square problems (:func:`default_spsolve_ladder`: 2-D and 3-D
    convection-diffusion operators, intensities from about 3 to about 400):
    SciPy's SuperLU factorization and solve of one right-hand side
    (``splu(A).solve(b)``, what ``factorized`` runs and what ``spsolve``'s
    ``gssv`` runs in one call; ``splu`` is never patched) against the GPU
    backend's factorization and ``square_solve``'s solve, timed as above, and
    fits it by the same rule. The timer sees the CPU side as backend
    :data:`SUPERLU`.

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
import scipy.sparse as sp
from scipy.sparse.linalg import splu

from .. import _gpu
from .. import _testing_matrices as tm
from .._symbolic import analyze
from . import plan as _plan
from .calibration import (RULE, Calibration, CalibrationPoint, calibration_file,
                          store_calibration)

__all__ = ["LadderProblem", "default_ladder", "default_spsolve_ladder", "convection_diffusion",
           "calibrate_sparse", "fit_threshold", "format_table", "warm_median", "POINT_BUDGET_S",
           "SUPERLU"]

#: The timer's name for the CPU side of the square ladder: SciPy's SuperLU.
SUPERLU = _plan.SUPERLU

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


def convection_diffusion(k: int, dim: int, wind: float = 0.3) -> sp.csc_array:
    """The upwinded convection-diffusion operator on a k^dim grid (square, unsymmetric).

    ``-Δu + w·∇u`` with (2·dim+1)-point stencils and a slight diagonal
    shift (2.1 per dimension) keeping it nonsingular: the kind of square
    system ``spsolve`` is given, with intensities growing with k and dim.

    Parameters
    ----------
    k : int
        Grid points per dimension.
    dim : int
        Dimensions (2 or 3 on the ladder).
    wind : float
        The convection term's share of the off-diagonal entries (0: symmetric).

    Returns
    -------
    scipy.sparse.csc_array
        Shape (k**dim, k**dim).
    """
    one = sp.diags_array([-(1 + wind) * np.ones(k - 1), 2.1 * np.ones(k),
                          -(1 - wind) * np.ones(k - 1)], offsets=[-1, 0, 1], shape=(k, k))
    eye = sp.eye_array(k)
    terms = []
    for axis in range(dim):
        factors = [one if i == axis else eye for i in range(dim)]
        term = factors[0]
        for f in factors[1:]:
            term = sp.kron(term, f)
        terms.append(term)
    return sp.csc_array(sum(terms[1:], terms[0]))


def default_spsolve_ladder(quick: bool = False) -> list:
    """Square problems for the threshold against SuperLU, intensities about 3 to 400.

    Parameters
    ----------
    quick : bool
        Up to intensity about 130 (``cd3-24``, n = 13824) instead of about
        400 (``cd3-40``, n = 64000; SuperLU takes tens of seconds there).

    Returns
    -------
    list of LadderProblem
        2-D (``cd2-k``) and 3-D (``cd3-k``) convection-diffusion operators
        (:func:`convection_diffusion`), in increasing intensity.
    """
    def cd(k, dim):
        return LadderProblem(f"cd{dim}-{k}", functools.partial(convection_diffusion, k, dim))

    quick_ladder = [cd(4, 3), cd(16, 2), cd(6, 3), cd(8, 3), cd(64, 2), cd(128, 2), cd(12, 3),
                    cd(16, 3), cd(20, 3), cd(24, 3)]
    if quick:
        return quick_ladder
    return quick_ladder[:7] + [cd(256, 2)] + quick_ladder[7:] + [cd(32, 3), cd(40, 3)]


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


def _superlu_factorize(A, **_):
    """SciPy's SuperLU factorization and the solve of one right-hand side (the
    ``factorize`` of :func:`warm_median` for the CPU side of the square ladder)."""
    splu(A).solve(np.ones(A.shape[0]))


def _default_timer(backends: Sequence[str], repeats: int, solve: SolveFactory):
    """``timer(backend, problem, A, analysis) -> seconds`` measuring the warm
    factorization of tall problems plus ``solve``'s solve (the factorization
    alone for wide ones), and the backend that runs for each name;
    :data:`SUPERLU` times SciPy's SuperLU factorization and solve instead."""
    fns, ran = {}, {}
    for name in backends:
        if name == SUPERLU:
            fns[name], ran[name] = _superlu_factorize, SUPERLU
            continue
        fn, actual, note = _plan.backend_factorizer(name)
        if fn is None:
            raise RuntimeError(f"backend {name!r} cannot run: {note}")
        fns[name], ran[name] = fn, actual

    def timer(backend: str, problem: str, A, analysis) -> float:
        sync = _gpu_sync if ran[backend] == "gpu" else (lambda: None)
        qr = ran[backend] != SUPERLU and A.shape[0] >= A.shape[1]
        run = solve(A, analysis, ran[backend]) if qr else None
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
                     solve: Optional[SolveFactory] = None,
                     spsolve_ladder: Optional[Sequence[LadderProblem]] = None,
                     square_solve: Optional[SolveFactory] = None) -> Calibration:
    """Measure both backends on a ladder, fit the thresholds, store them per GPU model.

    The QR threshold from ``ladder`` (CPU backend against GPU backend), and
    the threshold against SciPy's SuperLU from ``spsolve_ladder`` (SuperLU
    against the GPU backend's square solve), stored together.

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
    spsolve_ladder : sequence of LadderProblem, optional
        Square problems for the threshold against SuperLU. None: when the
        timings are measured (no ``timer``), :func:`default_spsolve_ladder`
        (its quick form when ``ladder`` is no longer than the quick QR
        ladder); with an injected ``timer``, none (such a timer is then
        called with backend :data:`SUPERLU` only when a ladder is given). An
        empty sequence skips it; ``spsolve_threshold`` is then None.
    square_solve : callable, optional
        Like ``solve``, the solve ``spsolve`` runs on a factorization of a
        square A (``scipy_gpuqr._api.spsolve.spsolve_probe``: the exact
        solve); default ``solve`` (a least-squares solve of the same
        system: the same triangular solves plus the rank decision, so a
        slightly higher GPU time).

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
    measuring = timer is None
    if measuring:
        if "gpu" in backends:
            fn, why = _plan.gpu_engine()
            if fn is None:
                raise RuntimeError(f"sparse calibration needs the GPU engine: {why}")
        if solve is None:
            raise ValueError("calibrate_sparse measures with solve= (the least-squares "
                             "solve of the entry points) unless a timer= is given")
        timer, ran = _default_timer(backends, repeats, solve)
    cpu_side, gpu_side = backends
    points = _measure(ladder, timer, cpu_side, gpu_side, ran[cpu_side], progress)
    threshold = fit_threshold([p.intensity for p in points], [p.ratio for p in points])
    if spsolve_ladder is None:
        quick = len(ladder) <= len(default_ladder(quick=True))
        spsolve_ladder = default_spsolve_ladder(quick=quick) if measuring else ()
    spsolve_points, spsolve_threshold = (), None
    if spsolve_ladder:
        square_timer = timer
        if measuring:
            square_timer = _default_timer((SUPERLU, gpu_side), repeats, square_solve or solve)[0]
        spsolve_points = _measure(spsolve_ladder, square_timer, SUPERLU, gpu_side, SUPERLU,
                                  progress)
        spsolve_threshold = fit_threshold([p.intensity for p in spsolve_points],
                                          [p.ratio for p in spsolve_points])
    cal = Calibration(gpu_name=str(device["name"]),
                      compute_capability=str(device.get("compute_capability", "")),
                      cupy_version=str(device.get("cupy_version", "")),
                      threshold=threshold, points=tuple(points),
                      date=datetime.date.today().isoformat(), rule=RULE,
                      host=f"{os.cpu_count()} cores, backend {ran[cpu_side]!r}",
                      spsolve_threshold=spsolve_threshold,
                      spsolve_points=tuple(spsolve_points))
    if store:
        path = calibration_file(directory)
        store_calibration(path, cal)
        cal = dataclasses.replace(cal, path=str(path))
    return cal


def _measure(ladder, timer, cpu_side: str, gpu_side: str, cpu_ran: str,
             progress) -> list:
    """One :class:`CalibrationPoint` per problem: the analysis (timed apart) and
    ``timer``'s warm times of ``cpu_side`` and ``gpu_side``."""
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
                              cpu_s=cpu_s, gpu_s=gpu_s, cpu_backend=cpu_ran)
        points.append(pt)
        if progress is not None:
            progress(pt)
    return points


def _table(points, cpu: str) -> list:
    lines = [f"{'problem':18} {'shape':>15} {'intensity':>9} {'analyze s':>9} "
             f"{cpu + ' s':>9} {'GPU s':>9} {'GPU/' + cpu:>11}"]
    for p in sorted(points, key=lambda q: q.intensity):
        shape = "x".join(str(s) for s in p.shape)
        lines.append(f"{p.name:18} {shape:>15} {p.intensity:9.1f} {p.analyze_s:9.3f} "
                     f"{p.cpu_s:9.4f} {p.gpu_s:9.4f} {p.ratio:11.3f}")
    return lines


def format_table(cal: Calibration) -> str:
    """The measured points, the fitted thresholds and the cache file, as text."""
    lines = _table(cal.points, "CPU")
    lines.append(f"{cal.describe()} (rule: {cal.rule}; CPU side: {cal.host})")
    if cal.spsolve_points:
        lines += _table(cal.spsolve_points, "SuperLU")
    lines.append(cal.describe_spsolve())
    lines.append(f"stored in {cal.path}" if cal.path else "not stored")
    return "\n".join(lines)
