"""Choose the backend once per factorization and record why.

:func:`plan_factorization` takes a call's resolved settings
(:class:`~scipy_gpuqr._options.Settings`: the precedence rule keyword >
``gpuqr_options`` > ``SCIPY_GPUQR_BACKEND`` > ``'auto'`` already applied),
runs the symbolic analysis (for the intensity and the memory estimate),
turns a problem that cannot fit in host memory into a clean
:class:`MemoryError` (or a cheaper ordering that fits), and returns a
:class:`Plan` whose ``factorize`` runs the chosen backend.

This module is the one place that names the engines: :func:`backend_factorizer`
maps a backend name to its factorize callable, :func:`absolute_tol` and the
:class:`Plan`'s device solves reach the engines' helpers. Importing the
engines costs no GPU work: the GPU engine imports CuPy when it runs, and
SuiteSparseQR's library is opened when first used (it may be missing). The engines of the GPU task lists (``'gpu'``,
``'simulate'``) detect no rank themselves; the solve rules above serve a
tolerance on their R (:mod:`scipy_gpuqr._factor.rank_refine`).

Backends
    ``'cpu'``: SuiteSparseQR (``_cpu.spqr``); without SuiteSparse it falls
    back to ``'reference'`` and says what is missing and how to install it.
    ``'reference'``: our NumPy/LAPACK multifrontal QR (``_engine.host.reference``).
    ``'simulate'``: the GPU task lists run by the NumPy executor.
    ``'gpu'``: the GPU engine; without a usable GPU a
    :class:`GpuFallbackWarning` is issued and the CPU answers.
    ``'auto'``: the GPU only when a GPU answers, the
    dtype is supported and the arithmetic intensity is at least the
    threshold; otherwise the CPU. The threshold is
    ``gpuqr_options.intensity_threshold`` when given, else the one
    ``scipy-gpuqr calibrate`` stored for this GPU model
    (:mod:`scipy_gpuqr._dispatch.calibration`), else the paper's 10 flops/byte;
    ``info`` (``threshold``, ``threshold_source``) and the log say which.

Square solves (``spsolve``, ``factorized``)
    Their CPU side under ``auto`` is SciPy's own function (SuperLU), not a
    CPU QR: ``plan_factorization(..., cpu_side='superlu')`` returns a plan
    whose backend is :data:`SUPERLU` (no factorize callable; the caller
    hands the call to SciPy) unless the GPU QR is at least as fast by the
    threshold calibrated against SuperLU (:func:`spsolve_threshold`).
    For a small system (the size alone, the GPU not asked) and without a
    GPU, a GPU engine or a supported dtype, that is known before any
    analysis (:func:`superlu_at_once`), so SuperLU answers at once.
    The decision is logged as ``SuperLU (SciPy) answered: <why>`` or
    ``QR on GPU: <why>``. Explicit backends always factorize with the QR.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp

from .. import _gpu
from .._cpu import spqr
from .._cpu.blas_threads import threads_for
from .._engine.gpu import driver as gpu_driver
from .._engine.gpu import multi_device as gpu_multi
from .._engine.gpu import solve as gpu_solve
from .._engine.host import multi_device as simulate_multi
from .._engine.host import reference, simulate
from .._errors import GpuFallbackWarning
from .._options import (DEFAULT_INTENSITY_THRESHOLD, DEFAULT_SPSOLVE_THRESHOLD, Settings,
                        log_decision, resolve_settings)
from .._schedule.devices import devices_for, run_seconds, run_speedup
from .._symbolic import analyze as symbolic_analyze
from .calibration import load_calibration

__all__ = ["GpuFallbackWarning", "Plan", "plan_factorization",
           "backend_factorizer", "absolute_tol", "available_host_memory", "gpu_engine",
           "gpu_unusable",
           "auto_threshold", "spsolve_threshold", "superlu_at_once", "SUPERLU",
           "SUPERLU_ALWAYS_NNZ", "SIZE_GATE_REASON"]

#: The backend of a square-solve plan that SciPy's own function answers (SuperLU).
SUPERLU = "superlu"

#: Orderings tried, in this order, when the requested one does not fit.
_FALLBACK_ORDERINGS = ("amd", "natural")

#: Fraction of MemAvailable a factorization may plan to use.
_MEMORY_FRACTION = 0.9


def available_host_memory() -> Optional[int]:
    """Bytes the kernel says are available (``MemAvailable``), or None when unknown.

    Read anew on every factorization (it changes), by one system call on the
    file (its first lines hold the field), not through Python's text files:
    on a millisecond call, after the caller's garbage collection, those cost
    about as much again as the kernel's own work."""
    try:
        fd = os.open("/proc/meminfo", os.O_RDONLY)
        try:
            data = b"\n" + os.read(fd, 8192)
        finally:
            os.close(fd)
        at = data.find(b"\nMemAvailable:")
        if at < 0:
            return None
        return int(data[at + 14:data.index(b"\n", at + 1)].split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None


def gpu_engine():
    """``(factorize, 'ok')`` of the GPU engine (it imports CuPy only when it runs)."""
    return gpu_driver.gpu_factorize, "ok"


def _spqr():
    """``(module, 'ok')`` of SuiteSparseQR, or ``(None, why)`` when its library does not load."""
    ok, why = spqr.spqr_available()
    return (spqr if ok else None), why


def backend_factorizer(name: str) -> tuple[Optional[Callable], str, str]:
    """Map a concrete backend name to its factorize callable.

    Returns
    -------
    factorize : callable or None
        ``factorize(A, *, ordering, colperm, tol, analysis) -> NumericQR``.
        The engines of ``'gpu'`` and ``'simulate'`` answer a tolerance with
        their own fallback (the reference engine's rank detection);
        :func:`scipy_gpuqr._factor.rank_refine.with_rank_detection` serves it
        on their R instead.
    ran : str
        The backend that will actually run (after documented fallbacks).
    note : str
        Why, when ``ran`` differs from ``name`` or something is missing.
    """
    if name == "gpu":
        factorize, why = gpu_engine()
        if factorize is not None:
            return _wrap_engine(factorize), "gpu", "ok"
        return None, "gpu", why
    if name == "simulate":
        return _wrap_engine(simulate.simulate_factorize), "simulate", "ok"
    if name == "reference":
        return _wrap_engine(reference.reference_factorize), "reference", "ok"
    if name == "cpu":
        lib, why = _spqr()
        if lib is not None:
            return _wrap_spqr(lib.spqr_factorize), "cpu", "ok"
        f, ran, _ = backend_factorizer("reference")
        return f, ran, f"SuiteSparseQR unavailable ({why}); our reference QR answers"
    raise ValueError(f"unknown backend {name!r}")


def _wrap_spqr(spqr_factorize):
    """SuiteSparseQR's factorize callable, its BLAS threads chosen by the flop count
    (:func:`~scipy_gpuqr._cpu.blas_threads.threads_for`).

    With an analysis, its count. Without one (the rank decision's QRs of R and
    of R₁ᵀ, through the same callable after A's), the count SuiteSparseQR
    reported for the last factorization this callable made with an analysis:
    RᵀR is AᵀA up to the column order, so R's QR meets the fill of A's own
    over fewer rows; None before any (the library's setting). A decision of
    order up to ``SINGLE_THREAD_ORDER`` lowers every pool anyway; beyond it, a
    full pool woken for a QR of a few million flops left its workers spinning
    through the decision's next steps.
    """
    made = {}

    def factorize(A, *, ordering="colamd", colperm=None, tol=None, analysis=None):
        flops = getattr(analysis, "flops", None) if analysis is not None else made.get("flops")
        num = spqr_factorize(A, ordering=ordering, colperm=colperm, tol=tol,
                             blas_threads_hint=threads_for(flops))
        if analysis is not None:
            made["flops"] = getattr(num, "flops", None)
        return num
    return factorize


def _wrap_engine(engine_factorize):
    def factorize(A, *, ordering="colamd", colperm=None, tol=None, analysis=None):
        if analysis is None:
            analysis = symbolic_analyze(A, ordering="given" if colperm is not None
                                        else ordering, colperm=colperm)
        return engine_factorize(A, analysis, tol=tol)
    return factorize


def absolute_tol(tol, A) -> Optional[float]:
    """The absolute dead-column tolerance of ``tol`` (None, 'default' or a number) for A.

    SuiteSparseQR's rule for 'default', as the reference engine applies it
    (in A's working precision); None when rank detection is off.
    """
    return reference.resolve_tol(tol, A, np.float32 if A.dtype == np.float32 else np.float64)


@dataclass
class Plan:
    """What will factorize, and why.

    Attributes
    ----------
    backend : str
        The backend that runs ('gpu', 'cpu', 'reference', 'simulate'), or
        :data:`SUPERLU` when SciPy's own function answers a square solve
        (``cpu_side='superlu'``; no factorize callable then).
    requested : str
        What the caller's settings asked for.
    source : str
        Where the request came from ('keyword', 'options', 'environment', 'default').
    reasons : list of str
        Every decision with its reason, in order.
    ordering : str
        Column ordering passed to the backend.
    colperm : ndarray or None
        A given column order (from the analysis, when an ordering was
        changed to fit memory).
    analysis : object or None
        The symbolic analysis, when it ran.
    analyze_time : float
        Seconds spent in the analysis.
    factorize_fn : callable or None
        The backend's factorize callable (:func:`backend_factorizer`).
    threshold : float or None
        The intensity threshold ``auto`` compared with (None: not consulted);
        for square solves the one against SuperLU.
    threshold_source : str
        Where it came from (options, the calibration of this GPU model with
        its date, or the default).
    gpu_name : str or None
        The GPU model ``auto`` looked at (None: not consulted); its stored
        calibration also predicts the CPU backend's time on this host.
    """

    backend: str
    requested: str
    source: str
    reasons: list = field(default_factory=list)
    ordering: str = "colamd"
    colperm: Optional[np.ndarray] = None
    analysis: object = None
    analyze_time: float = 0.0
    factorize_fn: Optional[Callable] = field(default=None, repr=False)
    threshold: Optional[float] = None
    threshold_source: str = ""
    gpu_name: Optional[str] = None

    def factorize(self, A: sp.csc_array, *, tol=None):
        """Run the chosen backend on A (same pattern as planned)."""
        if self.factorize_fn is None:
            raise RuntimeError("no factorization backend is available: "
                               + "; ".join(self.reasons))
        return self.factorize_fn(A, ordering=self.ordering, colperm=self.colperm,
                                 tol=tol, analysis=self.analysis)

    def with_factors(self, M, num) -> "Plan":
        """This plan with factors of ``M`` already made (``num``): its factorization
        of ``M`` itself returns them; any other matrix goes to the plan's own
        factorizer, as the rank decision's factorizations of R and R₁ᵀ do (they go
        through the same callable and must never get A's factors back)."""
        own = self.factorize_fn

        def factorize(A, **kwargs):
            if A is M:
                return num
            if own is None:
                raise RuntimeError("no factorization backend is available: "
                                   + "; ".join(self.reasons))
            return own(A, **kwargs)

        return dataclasses.replace(self, factorize_fn=factorize)

    def device_solves(self, num):
        """The GPU engine's triangular solves with the factors ``num`` it left on the device."""
        return gpu_solve.device_solve_of(num)

    def device_matmul(self, num, B, *, trans: bool):
        """``Qᵀ B`` (``trans``) or ``Q B`` on the device for GPU factors ``num``, in float64."""
        return gpu_solve.device_matmul(num, B, trans=trans, float64=True)

    def summary(self) -> dict:
        """JSON-ready description for ``info``."""
        out = {"backend": self.backend, "requested": self.requested,
               "source": self.source, "reasons": list(self.reasons),
               "ordering": self.ordering, "analyze_time": self.analyze_time}
        if self.threshold is not None:
            out["threshold"] = float(self.threshold)
            out["threshold_source"] = self.threshold_source
        a = self.analysis
        if a is not None:
            for key in ("flops", "nnz_R", "factor_bytes", "intensity", "host_bytes",
                        "gpu_bytes", "ordering_used"):
                value = getattr(a, key, None)
                if value is not None:
                    out[key] = value if isinstance(value, str) else float(value)
        return out


def _bytes(value) -> str:
    value = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} bytes"


def _fits(analysis, avail) -> bool:
    need = getattr(analysis, "host_bytes", None)
    return need is None or avail is None or need <= _MEMORY_FRACTION * avail


def free_host_memory() -> Optional[int]:
    """Bytes of free memory (the kernel's ``MemFree``, one ``sysinfo`` call), or None
    when unknown. Never more than ``MemAvailable`` but by the kernel's reserved pages
    (its watermarks, a small share of memory), and several times cheaper to read on a
    millisecond call than ``/proc/meminfo`` (:func:`available_host_memory`)."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def _surely_fits(analysis) -> bool:
    """Whether the analysis' host memory fits without reading ``MemAvailable``: it
    needs at most :data:`_MEMORY_FRACTION` of half the free memory (the kernel's
    reserves, by which ``MemAvailable`` may fall short of ``MemFree``, are far less
    than half of it), as a small factorization does; or it states no need."""
    need = getattr(analysis, "host_bytes", None)
    if need is None:
        return True
    free = free_host_memory()
    return free is not None and need <= _MEMORY_FRACTION * 0.5 * free


def plan_factorization(A: sp.csc_array, settings: Optional[Settings] = None, *,
                       ordering: Optional[str] = None, dtype=np.float64,
                       analyze: bool = True, cpu_side: str = "qr",
                       gpu_reason: Optional[str] = None) -> Plan:
    """Decide where A is factorized, with every reason recorded and logged.

    Parameters
    ----------
    A : scipy.sparse.csc_array
        Canonical matrix (from :func:`scipy_gpuqr._validate.as_matrix`).
    settings : Settings, optional
        The call's resolved settings
        (:func:`scipy_gpuqr._options.resolve_settings`); None: the defaults
        and the environment.
    ordering : str or None
        Column ordering; None takes the options' ``ordering``.
    dtype : numpy.dtype
        Working dtype (GPU eligibility).
    analyze : bool
        Run the symbolic analysis (intensity, memory estimate).
    cpu_side : {'qr', 'superlu'}
        What ``auto`` weighs the GPU against: a CPU QR (:func:`auto_threshold`),
        or, for ``spsolve``/``factorized``, SciPy's SuperLU
        (:func:`spsolve_threshold`); then the plan's backend is
        :data:`SUPERLU` where SciPy should answer (without an analysis when
        :func:`superlu_at_once` says so, and instead of a MemoryError when
        the QR cannot fit). Explicit backends ignore it.
    gpu_reason : str, optional
        Under ``auto`` against a CPU QR, why the factorization should run on a
        usable GPU whatever the intensity says (the iterate-first rule's: the
        QR's rank decision is predicted as R's dense work on the GPU, where R
        made there saves the host's rules before it); the log says so. A GPU
        that cannot be used still leaves the CPU. Explicit backends ignore it.

    Raises
    ------
    MemoryError
        The factorization cannot fit in the host memory available, with
        any ordering tried (not raised where SuperLU can answer instead).
    """
    if settings is None:
        settings = resolve_settings()
    requested, source, options = settings.backend, settings.source, settings.options
    if cpu_side not in ("qr", SUPERLU):
        raise ValueError(f"cpu_side must be 'qr' or {SUPERLU!r}, got {cpu_side!r}")
    ordering = ordering or options.ordering
    reasons = [f"backend {requested!r} from {source}"]
    versus_superlu = requested == "auto" and cpu_side == SUPERLU
    if versus_superlu:
        why = gpu_unusable(dtype)[0]
        if why is not None:
            reasons.append(why)
            return _superlu_plan(A, requested, source, reasons, ordering)
    analysis = None
    t0 = time.perf_counter()
    if analyze and min(A.shape) > 0:
        analysis = symbolic_analyze(A, ordering=ordering)
    analyze_time = time.perf_counter() - t0
    colperm = None

    # -- memory guard --------------------------------------------------------
    if analysis is not None and not _surely_fits(analysis):
        avail = available_host_memory()
        if not _fits(analysis, avail):
            need = analysis.host_bytes
            msg = (f"ordering {ordering!r} needs about {_bytes(need)} of host "
                   f"memory (nnz(R) = {getattr(analysis, 'nnz_R', float('nan')):.3g}), "
                   f"{_bytes(avail)} available")
            found = False
            for alt in _FALLBACK_ORDERINGS:
                if alt == ordering:
                    continue
                try:
                    other = symbolic_analyze(A, ordering=alt)
                except Exception as exc:  # an ordering that is not available
                    reasons.append(f"ordering {alt!r} not usable ({exc})")
                    continue
                if _fits(other, avail):
                    reasons.append(f"{msg}; switched to ordering {alt!r} "
                                   f"({_bytes(other.host_bytes)})")
                    analysis, ordering, found = other, alt, True
                    colperm = np.asarray(other.colperm, dtype=np.int64)
                    break
            if not found and versus_superlu:
                reasons.append(f"the QR cannot fit ({msg})")
                return _superlu_plan(A, requested, source, reasons, ordering,
                                     analysis=analysis,
                                     analyze_time=time.perf_counter() - t0)
            if not found:
                log_decision("memory guard: %s", msg)
                raise MemoryError(f"sparse QR of a {A.shape[0]}x{A.shape[1]} matrix "
                                  f"with {A.nnz} entries cannot fit: {msg}, and no "
                                  f"other ordering ({', '.join(_FALLBACK_ORDERINGS)}) fits")

    # -- backend choice --------------------------------------------------------
    chosen = requested
    threshold = None
    if requested == "auto":
        chosen, threshold = _auto_choice(analysis, options, dtype, reasons, cpu_side,
                                         gpu_reason if cpu_side == "qr" else None)
    if chosen == SUPERLU:
        return _superlu_plan(A, requested, source, reasons, ordering, analysis=analysis,
                             analyze_time=analyze_time, threshold=threshold)
    factorize_fn, ran, note = backend_factorizer(chosen)
    if chosen == "gpu" and factorize_fn is None:
        why = note
        if requested == "gpu":
            warnings.warn(f"backend 'gpu' requested ({source}) but {why}; "
                          "factorizing on the CPU", GpuFallbackWarning, stacklevel=3)
        reasons.append(f"GPU not used: {why}")
        factorize_fn, ran, note = backend_factorizer("cpu")
    if ran == "gpu" and analysis is not None:
        factorize_fn = _gpu_devices(factorize_fn, analysis, options, reasons)
    elif ran == "simulate" and options.devices is not None:
        k = options.devices if isinstance(options.devices, int) else len(options.devices)
        reasons.append(f"{k} simulated devices")
        factorize_fn = _wrap_engine(functools.partial(
            simulate_multi.simulate_multi_device, devices=k,
            device_memory=options.max_gpu_memory))
    if note != "ok":
        reasons.append(note)
    reasons.append(f"running {ran!r}")
    plan = Plan(backend=ran, requested=requested, source=source, reasons=reasons,
                ordering=ordering, colperm=colperm, analysis=analysis,
                analyze_time=analyze_time, factorize_fn=factorize_fn,
                threshold=None if threshold is None else threshold[0],
                threshold_source="" if threshold is None else threshold[1],
                gpu_name=None if threshold is None else threshold[2])
    if cpu_side == SUPERLU:
        where = "GPU" if ran == "gpu" else f"the CPU ({ran!r})"
        log_decision("%dx%d nnz=%d: QR on %s: %s", A.shape[0], A.shape[1], A.nnz, where,
                     "; ".join(reasons))
    else:
        log_decision("%dx%d nnz=%d: %s", A.shape[0], A.shape[1], A.nnz, "; ".join(reasons))
    return plan


def _gpu_devices(factorize_fn, analysis, options, reasons):
    """The multi-GPU engine instead of the one-GPU one when ``options.devices`` (or,
    for ``'auto'``, the rule of :func:`~scipy_gpuqr._schedule.devices.devices_for`)
    names several GPUs; a request this host cannot meet warns and stays on one GPU."""
    if options.devices is None:
        return factorize_fn
    gi = _gpu.gpu_info()
    visible = int(gi.get("device_count", 0)) if gi.get("available") else 0
    mem = gi.get("total_memory")
    per_device = options.max_gpu_memory or (int(0.85 * mem) if mem else None)
    try:
        ids, why = devices_for(options.devices, visible, float(analysis.flops),
                               int(analysis.gpu_bytes), per_device,
                               speedup=lambda k: run_speedup(analysis, k,
                                                             device_memory=per_device),
                               seconds=lambda k: run_seconds(analysis, k,
                                                             device_memory=per_device))
    except ValueError as exc:
        warnings.warn(f"gpuqr_options.devices: {exc}; one GPU factorizes",
                      GpuFallbackWarning, stacklevel=4)
        reasons.append(f"devices not usable ({exc}): one GPU")
        return factorize_fn
    if len(ids) < 2:
        reasons.append(why)
        return factorize_fn
    reasons.append(f"GPUs {ids}: {why}")
    return _wrap_engine(functools.partial(gpu_multi.multi_gpu_factorize, devices=ids,
                                          max_gpu_memory=options.max_gpu_memory))


def _superlu_plan(A, requested, source, reasons, ordering, *, analysis=None,
                  analyze_time=0.0, threshold=None) -> Plan:
    """The plan of a square solve that SciPy's own function answers, logged."""
    reasons.append("SciPy's SuperLU answers")
    plan = Plan(backend=SUPERLU, requested=requested, source=source, reasons=reasons,
                ordering=ordering, analysis=analysis, analyze_time=analyze_time,
                threshold=None if threshold is None else threshold[0],
                threshold_source="" if threshold is None else threshold[1],
                gpu_name=None if threshold is None else threshold[2])
    log_decision("%dx%d nnz=%d: SuperLU (SciPy) answered: %s", A.shape[0], A.shape[1],
                 A.nnz, "; ".join(reasons[:-1]))
    return plan


#: Square systems with fewer stored entries than this are SuperLU's under ``auto``
#: without an analysis: the GPU QR's fixed costs (analysis, launches, transfers)
#: exceed SuperLU's whole solve there, whatever the intensity says.
SUPERLU_ALWAYS_NNZ = 200_000

#: Why SuperLU answers a small system at once (``%`` arguments: stored entries, the
#: gate): the text of :func:`superlu_at_once`, for callers that log it lazily.
SIZE_GATE_REASON = "%d stored entries, below %d where the GPU QR cannot pay off (GPU not consulted)"


def superlu_at_once(settings: Settings, A=None) -> Optional[str]:
    """Why SciPy's SuperLU answers a square solve at once, or None when it may not.

    For ``spsolve``/``factorized`` before their input is validated or
    analysed: under ``auto``, for a matrix ``A`` with fewer than
    :data:`SUPERLU_ALWAYS_NNZ` stored entries (read first: the GPU is not
    asked about, since no GPU could change the answer), or without a GPU
    engine or a GPU that answers, SciPy's own function answers, so no
    analysis runs. None for explicit backends (always the QR) and where a
    GPU may pay off (the intensity decides, :func:`plan_factorization` with
    ``cpu_side='superlu'``).
    """
    if settings.backend != "auto":
        return None
    nnz = None
    if A is not None:
        nnz = getattr(A, "nnz", None)
        if nnz is None:
            try:
                nnz = int(np.size(A))
            except Exception:       # noqa: BLE001 - not array-like: SciPy's own error follows
                nnz = None
    if nnz is not None and nnz < SUPERLU_ALWAYS_NNZ:
        why = SIZE_GATE_REASON % (nnz, SUPERLU_ALWAYS_NNZ)
    else:
        why = gpu_unusable(None)[0]
        if why is None:
            return None
    return f"backend 'auto' from {settings.source}; {why}"


def auto_threshold(options, gpu_name) -> tuple[float, str]:
    """The intensity threshold ``auto`` uses, and where it came from.

    ``options.intensity_threshold`` when set; else the calibrated threshold
    stored for ``gpu_name`` by ``scipy-gpuqr calibrate``; else
    :data:`~scipy_gpuqr._options.DEFAULT_INTENSITY_THRESHOLD`.
    """
    if options.intensity_threshold is not None:
        return float(options.intensity_threshold), "from gpuqr_options"
    cal = load_calibration(gpu_name)
    if cal is not None:
        return cal.threshold, f"calibrated {cal.date} for {cal.gpu_name}"
    return DEFAULT_INTENSITY_THRESHOLD, f"default, not calibrated for {gpu_name or 'this GPU'}"


def spsolve_threshold(options, gpu_name) -> tuple[float, str]:
    """The intensity threshold against SciPy's SuperLU, and where it came from.

    ``auto``'s ``spsolve``/``factorized`` use the GPU QR at and above it.
    ``options.spsolve_threshold`` when set; else the one ``scipy-gpuqr
    calibrate`` stored for ``gpu_name`` beside the QR threshold; else
    :data:`~scipy_gpuqr._options.DEFAULT_SPSOLVE_THRESHOLD`.
    """
    if options.spsolve_threshold is not None:
        return float(options.spsolve_threshold), "from gpuqr_options"
    cal = load_calibration(gpu_name)
    if cal is not None and cal.spsolve_threshold is not None:
        return cal.spsolve_threshold, f"calibrated against SuperLU {cal.date} for {cal.gpu_name}"
    return (DEFAULT_SPSOLVE_THRESHOLD,
            f"default, not calibrated against SuperLU for {gpu_name or 'this GPU'}")


def gpu_unusable(dtype) -> tuple[Optional[str], Optional[str]]:
    """``(why the GPU cannot factorize, None)`` or ``(None, the GPU model)``.

    Cheap (no analysis): the GPU engine, a GPU that answers, and ``dtype``
    (None: not checked yet).
    """
    factorize, why = gpu_engine()
    if factorize is None:
        return why, None
    info = _gpu.gpu_info()
    if not info["available"]:
        return f"no GPU: {info['reason']}", None
    if dtype is not None and np.dtype(dtype) not in (np.float64, np.float32):
        return f"dtype {np.dtype(dtype)} not supported on the GPU", None
    return None, info.get("name")


def _auto_choice(analysis, options, dtype, reasons, cpu_side: str = "qr",
                 gpu_reason: Optional[str] = None) -> tuple[str, Optional[tuple]]:
    """``auto``'s backend and ``(threshold, its source, GPU model)`` when a GPU was consulted.

    The CPU side is ``'cpu'`` (a CPU QR, :func:`auto_threshold`) or
    :data:`SUPERLU` (SciPy's SuperLU, :func:`spsolve_threshold`). ``gpu_reason``
    (a CPU QR's side only): a usable GPU is chosen for it, the intensity logged.
    """
    cpu, label = ("cpu", "CPU") if cpu_side == "qr" else (SUPERLU, "SuperLU")
    why, name = gpu_unusable(dtype)
    if why is not None:
        reasons.append(f"auto: {label} ({why})")
        return cpu, None
    threshold, source = (auto_threshold if cpu_side == "qr" else spsolve_threshold)(options, name)
    intensity = getattr(analysis, "intensity", None)
    if intensity is None:
        reasons.append(f"auto: {label} (no analysis, intensity unknown)")
        return cpu, (threshold, source, name)
    said = f"threshold {threshold:.3g} flops/byte, {source}"
    if gpu_reason:
        reasons.append(f"auto: GPU ({gpu_reason}; intensity {intensity:.3g}, {said})")
        return "gpu", (threshold, source, name)
    if not intensity >= threshold:
        reasons.append(f"auto: {label} (intensity {intensity:.3g} < {said})")
        return cpu, (threshold, source, name)
    reasons.append(f"auto: GPU (intensity {intensity:.3g} >= {said})")
    return "gpu", (threshold, source, name)
