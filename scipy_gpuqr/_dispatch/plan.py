"""Choose the backend once per factorization and record why (DESIGN.md §6).

:func:`plan_factorization` applies the precedence rule (keyword >
``gpuqr_options`` > ``SCIPY_GPUQR_BACKEND`` > ``'auto'``), runs the symbolic
analysis when it is available (for the intensity and the memory estimate),
turns a problem that cannot fit in host memory into a clean
:class:`MemoryError` (or a cheaper ordering that fits), and returns a
:class:`Plan` whose ``factorize`` runs the chosen backend.

:func:`backend_factorizer` is the one hook that maps a backend name to its
factorize callable; new engines (the GPU executor, the simulated task
lists) plug in there.

Backends
    ``'cpu'``: SuiteSparseQR (``_cpu.spqr``); without SuiteSparse it falls
    back to ``'reference'`` and says what is missing and how to install it.
    ``'reference'``: our NumPy/LAPACK multifrontal QR (``_engine.reference``).
    ``'simulate'``: the GPU task lists run by the NumPy executor; until that
    executor exists it falls back to ``'reference'`` with the reason recorded.
    ``'gpu'``: the GPU engine; until it exists (or without a usable GPU) a
    :class:`GpuFallbackWarning` is issued and the CPU answers.
    ``'auto'``: the GPU only when a GPU engine exists, a GPU answers, the
    dtype is supported and the arithmetic intensity is at least the
    threshold; otherwise the CPU. The threshold is
    ``gpuqr_options.intensity_threshold`` when given, else the one
    ``scipy-gpuqr calibrate`` stored for this GPU model
    (:mod:`scipy_gpuqr._dispatch.calibrate`), else the paper's 10 flops/byte;
    ``info`` (``threshold``, ``threshold_source``) and the log say which.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp

from .._errors import GpuFallbackWarning
from .._options import (DEFAULT_INTENSITY_THRESHOLD, log_decision,
                       resolve_backend, resolve_options)

__all__ = ["GpuFallbackWarning", "Plan", "plan_factorization",
           "backend_factorizer", "available_host_memory", "gpu_engine",
           "auto_threshold"]

#: Orderings tried, in this order, when the requested one does not fit.
_FALLBACK_ORDERINGS = ("amd", "natural")

#: Fraction of MemAvailable a factorization may plan to use.
_MEMORY_FRACTION = 0.9


def available_host_memory() -> Optional[int]:
    """Bytes the kernel says are available (``MemAvailable``), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_engine():
    """The GPU factorize callable, or (None, reason) until the engine exists."""
    try:
        from .._engine.gpu import driver as _gpu_engine  # noqa: F401  (later issue)
    except ImportError:
        return None, "the GPU engine is not implemented yet"
    factorize = getattr(_gpu_engine, "gpu_factorize", None)
    if factorize is None:
        return None, "the GPU engine has no gpu_factorize"
    return factorize, "ok"


def _spqr():
    try:
        from .._cpu import spqr
    except ImportError as exc:
        return None, f"scipy_gpuqr._cpu.spqr cannot be imported ({exc})"
    ok, why = spqr.spqr_available()
    return (spqr if ok else None), why


def _reference():
    try:
        from .._engine.host import reference
    except ImportError as exc:
        return None, f"the reference engine cannot be imported ({exc})"
    return reference, "ok"


def backend_factorizer(name: str) -> tuple[Optional[Callable], str, str]:
    """Map a concrete backend name to its factorize callable.

    Returns
    -------
    factorize : callable or None
        ``factorize(A, *, ordering, colperm, tol, analysis) -> NumericQR``.
    ran : str
        The backend that will actually run (after documented fallbacks).
    note : str
        Why, when ``ran`` differs from ``name`` or something is missing.
    """
    if name == "gpu":
        factorize, why = gpu_engine()
        if factorize is not None:
            return _wrap_gpu(factorize), "gpu", "ok"
        return None, "gpu", why
    if name == "simulate":
        try:
            from .._engine.host import simulate
            factorize = getattr(simulate, "simulate_factorize", None)
        except ImportError:
            factorize = None
        if factorize is not None:
            return _wrap_refined(factorize, on_gpu=False), "simulate", "ok"
        f, ran, why = backend_factorizer("reference")
        return f, ran, "the simulate executor has no factorize entry point yet; " + why
    if name == "reference":
        ref, why = _reference()
        if ref is not None:
            return _wrap_engine(ref.reference_factorize), "reference", "ok"
        spqr, why2 = _spqr()
        if spqr is not None:
            return _wrap_spqr(spqr.spqr_factorize), "cpu", f"{why}; SuiteSparseQR answers"
        return None, "reference", f"{why}; {why2}"
    if name == "cpu":
        spqr, why = _spqr()
        if spqr is not None:
            return _wrap_spqr(spqr.spqr_factorize), "cpu", "ok"
        f, ran, why2 = backend_factorizer("reference")
        return f, ran, f"SuiteSparseQR unavailable ({why}); {why2}"
    raise ValueError(f"unknown backend {name!r}")


def _wrap_spqr(spqr_factorize):
    from .._cpu.blas_threads import threads_for

    def factorize(A, *, ordering="colamd", colperm=None, tol=None, analysis=None):
        flops = getattr(analysis, "flops", None)
        return spqr_factorize(A, ordering=ordering, colperm=colperm, tol=tol,
                              blas_threads_hint=threads_for(flops))
    return factorize


def _wrap_engine(engine_factorize):
    def factorize(A, *, ordering="colamd", colperm=None, tol=None, analysis=None):
        if analysis is None:
            from .._symbolic import analyze
            analysis = analyze(A, ordering="given" if colperm is not None else ordering,
                               colperm=colperm)
        return engine_factorize(A, analysis, tol=tol)
    return factorize


def _wrap_gpu(gpu_factorize):
    return _wrap_refined(gpu_factorize, on_gpu=True)


#: Largest min(m, n)·n for which the simulate backend refines R densely on the host.
HOST_REFINE_LIMIT = 14000 ** 2


def _wrap_refined(engine_factorize, *, on_gpu: bool):
    """An engine without rank detection in its task lists, with ``tol`` served by
    Heath's rule on its R (:mod:`scipy_gpuqr._factor.rank_refine`), on the GPU for the
    GPU engine; where R cannot be densified the engine's own fallback (the
    reference engine's rank detection) answers."""
    plain = _wrap_engine(engine_factorize)

    def factorize(A, *, ordering="colamd", colperm=None, tol=None, analysis=None):
        from .._engine.host.reference import resolve_tol
        from .._factor.rank_refine import fits_dense, heath_refine
        kw = dict(ordering=ordering, colperm=colperm, analysis=analysis)
        m, n = A.shape
        tol_abs = resolve_tol(tol, A, np.float32 if A.dtype == np.float32 else np.float64)
        if tol_abs is None:
            return plain(A, tol=None, **kw)
        shape = (min(m, n), n)
        xp = np
        if on_gpu:
            from .._gpu import gpu_available, import_cupy
            if gpu_available() and fits_dense(shape, import_cupy()):
                xp = import_cupy()
            else:
                return plain(A, tol=tol, **kw)
        elif shape[0] * shape[1] > HOST_REFINE_LIMIT:
            return plain(A, tol=tol, **kw)
        num = plain(A, tol=None, **kw)
        if num.info.get("backend") == "reference":      # the GPU engine fell back
            xp = np
        return heath_refine(num, tol_abs, xp)
    return factorize


@dataclass
class Plan:
    """What will factorize, and why.

    Attributes
    ----------
    backend : str
        The backend that runs ('gpu', 'cpu', 'reference', 'simulate').
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
    threshold : float or None
        The intensity threshold ``auto`` compared with (None: not consulted).
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


def _analyze(A, ordering, reasons):
    try:
        from .._symbolic import analyze
    except ImportError as exc:
        reasons.append(f"symbolic analysis unavailable ({exc}); no intensity or "
                       "memory estimate")
        return None
    return analyze(A, ordering=ordering)


def _bytes(value) -> str:
    value = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} bytes"


def _fits(analysis, avail) -> bool:
    need = getattr(analysis, "host_bytes", None)
    return need is None or avail is None or need <= _MEMORY_FRACTION * avail


def plan_factorization(A: sp.csc_array, *, backend=None, gpuqr_options=None,
                       ordering: Optional[str] = None, dtype=np.float64,
                       analyze: bool = True) -> Plan:
    """Decide where A is factorized, with every reason recorded and logged.

    Parameters
    ----------
    A : scipy.sparse.csc_array
        Canonical matrix (from :func:`scipy_gpuqr._validate.as_matrix`).
    backend, gpuqr_options
        The caller's settings (see :func:`scipy_gpuqr._options.resolve_backend`).
    ordering : str or None
        Column ordering; None takes ``gpuqr_options.ordering``.
    dtype : numpy.dtype
        Working dtype (GPU eligibility).
    analyze : bool
        Run the symbolic analysis (intensity, memory estimate).

    Raises
    ------
    ValueError
        Bad backend name (wherever it came from).
    MemoryError
        The factorization cannot fit in the host memory available, with
        any ordering tried.
    """
    requested, source = resolve_backend(backend, gpuqr_options)
    options = resolve_options(gpuqr_options)
    ordering = ordering or options.ordering
    reasons = [f"backend {requested!r} from {source}"]
    analysis = None
    t0 = time.perf_counter()
    if analyze and min(A.shape) > 0:
        analysis = _analyze(A, ordering, reasons)
    analyze_time = time.perf_counter() - t0
    colperm = None

    # -- memory guard --------------------------------------------------------
    if analysis is not None:
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
                    other = _analyze(A, alt, reasons)
                except Exception as exc:  # an ordering that is not available
                    reasons.append(f"ordering {alt!r} not usable ({exc})")
                    continue
                if other is not None and _fits(other, avail):
                    reasons.append(f"{msg}; switched to ordering {alt!r} "
                                   f"({_bytes(other.host_bytes)})")
                    analysis, ordering, found = other, alt, True
                    colperm = np.asarray(other.colperm, dtype=np.int64)
                    break
            if not found:
                log_decision("memory guard: %s", msg)
                raise MemoryError(f"sparse QR of a {A.shape[0]}x{A.shape[1]} matrix "
                                  f"with {A.nnz} entries cannot fit: {msg}, and no "
                                  f"other ordering ({', '.join(_FALLBACK_ORDERINGS)}) fits")

    # -- backend choice --------------------------------------------------------
    chosen = requested
    threshold = None
    if requested == "auto":
        chosen, threshold = _auto_choice(analysis, options, dtype, reasons)
    factorize_fn, ran, note = backend_factorizer(chosen)
    if chosen == "gpu" and factorize_fn is None:
        why = note
        if requested == "gpu":
            warnings.warn(f"backend 'gpu' requested ({source}) but {why}; "
                          "factorizing on the CPU", GpuFallbackWarning, stacklevel=3)
        reasons.append(f"GPU not used: {why}")
        factorize_fn, ran, note = backend_factorizer("cpu")
    if note != "ok":
        reasons.append(note)
    reasons.append(f"running {ran!r}")
    plan = Plan(backend=ran, requested=requested, source=source, reasons=reasons,
                ordering=ordering, colperm=colperm, analysis=analysis,
                analyze_time=analyze_time, factorize_fn=factorize_fn,
                threshold=None if threshold is None else threshold[0],
                threshold_source="" if threshold is None else threshold[1],
                gpu_name=None if threshold is None else threshold[2])
    log_decision("%dx%d nnz=%d: %s", A.shape[0], A.shape[1], A.nnz, "; ".join(reasons))
    return plan


def auto_threshold(options, gpu_name) -> tuple[float, str]:
    """The intensity threshold ``auto`` uses, and where it came from.

    ``options.intensity_threshold`` when set; else the calibrated threshold
    stored for ``gpu_name`` by ``scipy-gpuqr calibrate``; else
    :data:`~scipy_gpuqr._options.DEFAULT_INTENSITY_THRESHOLD`.
    """
    if options.intensity_threshold is not None:
        return float(options.intensity_threshold), "from gpuqr_options"
    try:
        from .calibrate import load_calibration
        cal = load_calibration(gpu_name)
    except ImportError:
        cal = None
    if cal is not None:
        return cal.threshold, f"calibrated {cal.date} for {cal.gpu_name}"
    return DEFAULT_INTENSITY_THRESHOLD, f"default, not calibrated for {gpu_name or 'this GPU'}"


def _auto_choice(analysis, options, dtype, reasons) -> tuple[str, Optional[tuple]]:
    """``auto``'s backend and ``(threshold, its source, GPU model)`` when a GPU was consulted."""
    factorize, why = gpu_engine()
    if factorize is None:
        reasons.append(f"auto: CPU ({why})")
        return "cpu", None
    from .._gpu import gpu_info
    info = gpu_info()
    if not info["available"]:
        reasons.append(f"auto: CPU (no GPU: {info['reason']})")
        return "cpu", None
    if np.dtype(dtype) not in (np.float64, np.float32):
        reasons.append(f"auto: CPU (dtype {np.dtype(dtype)} not supported on the GPU)")
        return "cpu", None
    name = info.get("name")
    threshold, source = auto_threshold(options, name)
    intensity = getattr(analysis, "intensity", None)
    if intensity is None:
        reasons.append("auto: CPU (no analysis, intensity unknown)")
        return "cpu", (threshold, source, name)
    said = f"threshold {threshold:.3g} flops/byte, {source}"
    if not intensity >= threshold:
        reasons.append(f"auto: CPU (intensity {intensity:.3g} < {said})")
        return "cpu", (threshold, source, name)
    reasons.append(f"auto: GPU (intensity {intensity:.3g} >= {said})")
    return "gpu", (threshold, source, name)
