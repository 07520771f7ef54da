"""Options and the backend precedence rule.

Precedence, highest first: the ``backend=`` keyword of a call, the
``gpuqr_options=`` object, the environment variable ``SCIPY_GPUQR_BACKEND``,
then ``"auto"``. There is no process-wide switch: every call resolves its own
settings from its arguments and the environment, once, at its entry point
(:func:`resolve_settings`), and passes the resolved :class:`Settings` down.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import numbers
import os
import sys
from typing import Mapping, Optional, Tuple, Union

__all__ = ["BACKENDS", "ORDERINGS", "GpuqrOptions", "Settings", "resolve_backend",
           "resolve_options", "resolve_settings", "settings_for", "auto_source", "auto_settings",
           "getenv", "logger", "log_decision"]

#: Every backend name a caller may ask for.
BACKENDS = ("auto", "gpu", "cpu", "reference", "simulate")

#: Column orderings understood by the analysis.
ORDERINGS = ("colamd", "natural", "amd", "metis", "given")

#: Default arithmetic-intensity threshold (flops / byte) above which ``auto``
#: picks the GPU, from the paper; ``scipy-gpuqr calibrate`` measures it anew.
DEFAULT_INTENSITY_THRESHOLD = 10.0

#: Default arithmetic-intensity threshold (flops / byte of the QR analysis) at
#: and above which ``spsolve``/``factorized`` under ``auto`` use the GPU sparse
#: QR instead of SciPy's SuperLU. Higher than the QR threshold: on square
#: systems SuperLU factorizes 1.5-3x faster than SuiteSparseQR (measured on
#: 2-D/3-D convection-diffusion problems), and with the GPU/CPU-QR time ratio
#: falling about as intensity**-0.7, a CPU side 2-3x faster moves the crossover
#: from 10 to about 25-50 flops/byte. An estimate: ``scipy-gpuqr calibrate``
#: measures it on the GPU machine (SciPy's spsolve against the GPU QR solve)
#: and stores it per GPU model as ``spsolve_threshold``.
DEFAULT_SPSOLVE_THRESHOLD = 40.0

ENV_BACKEND = "SCIPY_GPUQR_BACKEND"
ENV_VERBOSE = "SCIPY_GPUQR_VERBOSE"
ENV_DEBUG = "SCIPY_GPUQR_DEBUG"

logger = logging.getLogger("scipy_gpuqr")


@dataclasses.dataclass(frozen=True)
class GpuqrOptions:
    """Options of a factorization or solve; immutable, pass as ``gpuqr_options=``.

    Parameters
    ----------
    backend : {None, 'auto', 'gpu', 'cpu', 'reference', 'simulate'}
        Where to factorize. None defers to ``SCIPY_GPUQR_BACKEND`` and then
        ``'auto'``. ``'cpu'`` is SuiteSparseQR (our reference path when
        SuiteSparse is absent), ``'reference'`` our NumPy/LAPACK multifrontal
        QR, ``'simulate'`` the GPU task lists run by the NumPy executor.
    ordering : {'colamd', 'natural', 'amd', 'metis'}
        Fill-reducing column ordering. ``'colamd'`` (the default): SuiteSparse's
        COLAMD, the cheapest analysis. ``'metis'``: METIS's nested dissection of
        the graph of AᵀA (``libmetis``, which SuiteSparse's packages bring;
        COLAMD where it is missing): a much slower analysis on large problems,
        but often far less fill and work on mesh-like ones, so worth it where
        one sparsity pattern is factorized many times (the analysis is kept per
        pattern). ``'amd'``: AMD on the pattern of AᵀA. ``'natural'``: A's own
        column order.
    intensity_threshold : float or None
        Flops per byte above which ``auto`` uses the GPU; None means the
        calibrated value for this GPU model, or 10 when not calibrated.
    max_gpu_memory : int or None
        Byte budget for the GPU stages; None means what the device has free.
    pipelining : bool
        Use Apply+Factorize tasks in the GPU schedule.
    keep_householder : bool
        Keep the Householder vectors (needed by ``q_matmul``/``qt_matmul``).
    debug : bool or None
        Synchronize and check errors after every GPU launch; None reads
        ``SCIPY_GPUQR_DEBUG``.
    iterate_first : bool
        Under backend ``'auto'``, ``lsqr``/``lsmr`` first run SciPy's
        algorithm with the caller's arguments and return its answer when its
        convergence tests stop it; the sparse QR answers otherwise (see
        ``scipy_gpuqr._dispatch.iterate_first``). False: always the QR.
    spsolve_threshold : float or None
        Flops per byte at and above which ``spsolve``/``factorized`` under
        ``auto`` use the GPU sparse QR; below it SciPy's own function
        (SuperLU) answers. None means the value calibrated against SuperLU
        for this GPU model, or :data:`DEFAULT_SPSOLVE_THRESHOLD`.
    devices : None, 'auto', int or sequence of int
        GPUs of this host the sparse QR runs on (subtrees of the elimination
        tree mapped to devices, see ``scipy_gpuqr._schedule.devices``). None:
        one GPU (the current device). ``'auto'``: every visible GPU when the
        factorization has at least ``MULTI_DEVICE_MIN_FLOPS`` flops (1e11)
        and its front tree promises a speedup, or does not fit one GPU's
        memory but fits their sum, else one. None stays the default until
        the several-GPU engine has been measured on a host with several
        GPUs. An int: the first that many GPUs; a sequence: those device
        ids, the first running the upper tree and keeping ``Q`` (repeats run
        several simulated devices on one GPU).
    """

    backend: Optional[str] = None
    ordering: str = "colamd"
    intensity_threshold: Optional[float] = None
    max_gpu_memory: Optional[int] = None
    pipelining: bool = True
    keep_householder: bool = True
    debug: Optional[bool] = None
    iterate_first: bool = True
    spsolve_threshold: Optional[float] = None
    devices: Union[None, str, int, Tuple[int, ...]] = None

    def __post_init__(self):
        if self.backend is not None:
            _check_backend(self.backend, "GpuqrOptions.backend")
        if self.ordering not in ORDERINGS:
            raise ValueError(f"GpuqrOptions.ordering must be one of {ORDERINGS}, "
                             f"got {self.ordering!r}")
        if self.max_gpu_memory is not None and int(self.max_gpu_memory) <= 0:
            raise ValueError("GpuqrOptions.max_gpu_memory must be a positive "
                             f"number of bytes, got {self.max_gpu_memory!r}")
        if self.devices is not None:
            object.__setattr__(self, "devices", _check_devices(self.devices))

    def replace(self, **changes) -> "GpuqrOptions":
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def debug_enabled(self, environ: Mapping[str, str] = os.environ) -> bool:
        """Whether launches are synchronized and checked one by one."""
        if self.debug is not None:
            return bool(self.debug)
        return environ.get(ENV_DEBUG, "") not in ("", "0")


def _check_devices(value):
    """``devices`` as ``'auto'``, a positive int or a non-empty tuple of device ids (>= 0)."""
    if value == "auto":
        return value
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        raise TypeError(f"GpuqrOptions.devices must be 'auto', an int or a sequence of "
                        f"ints, got {value!r}")
    if isinstance(value, numbers.Integral):
        if int(value) < 1:
            raise ValueError(f"GpuqrOptions.devices must be >= 1, got {value!r}")
        return int(value)
    try:
        ids = tuple(value)
    except TypeError:
        raise TypeError(f"GpuqrOptions.devices must be an int or a sequence of ints, "
                        f"got {value!r}") from None
    if not ids:
        raise ValueError("GpuqrOptions.devices: an empty sequence")
    for d in ids:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise TypeError(f"GpuqrOptions.devices: device ids are ints, got {d!r}")
        if int(d) < 0:
            raise ValueError(f"GpuqrOptions.devices: device ids are >= 0, got {d!r}")
    return tuple(int(d) for d in ids)


def _check_backend(value, where: str) -> str:
    if not isinstance(value, str) or value.lower() not in BACKENDS:
        raise ValueError(f"{where} must be one of {BACKENDS}, got {value!r}")
    return value.lower()


#: The options of a call that passes none (immutable, so one instance serves every call).
_DEFAULT_OPTIONS = GpuqrOptions()


def resolve_options(gpuqr_options) -> GpuqrOptions:
    """Accept None, a :class:`GpuqrOptions` or a mapping of its fields."""
    if gpuqr_options is None:
        return _DEFAULT_OPTIONS
    if isinstance(gpuqr_options, GpuqrOptions):
        return gpuqr_options
    if isinstance(gpuqr_options, Mapping):
        return GpuqrOptions(**gpuqr_options)
    raise TypeError("gpuqr_options must be a GpuqrOptions, a dict or None, "
                    f"got {type(gpuqr_options).__name__}")


def resolve_backend(backend=None, gpuqr_options=None,
                    environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Apply the precedence rule and say where the answer came from.

    Parameters
    ----------
    backend : str or None
        The call's ``backend=`` keyword.
    gpuqr_options : GpuqrOptions, dict or None
        The call's options object.
    environ : mapping
        Environment to read ``SCIPY_GPUQR_BACKEND`` from.

    Returns
    -------
    backend : str
        One of :data:`BACKENDS`.
    source : str
        ``'keyword'``, ``'options'``, ``'environment'`` or ``'default'``.

    Raises
    ------
    ValueError
        For a name that is not a backend, wherever it came from.
    """
    if backend is not None:
        return _check_backend(backend, "backend"), "keyword"
    return _backend_of(resolve_options(gpuqr_options), environ)


def _backend_of(options: GpuqrOptions, environ: Mapping[str, str]) -> tuple[str, str]:
    """The backend and its source when the call's keyword names none."""
    if options.backend is not None:
        return options.backend.lower(), "options"
    env = environ.get(ENV_BACKEND, "").strip()
    if env:
        return _check_backend(env, f"environment variable {ENV_BACKEND}"), "environment"
    return "auto", "default"


@dataclasses.dataclass(frozen=True)
class Settings:
    """A call's settings, resolved once at its entry point.

    Attributes
    ----------
    backend : str
        The backend asked for, one of :data:`BACKENDS` (``'auto'`` included).
    source : str
        Where that came from: ``'keyword'``, ``'options'``, ``'environment'``
        or ``'default'``.
    options : GpuqrOptions
        The call's options.
    """

    backend: str
    source: str
    options: GpuqrOptions


def resolve_settings(backend=None, gpuqr_options=None,
                     environ: Mapping[str, str] = os.environ) -> Settings:
    """Resolve a call's ``backend=`` and ``gpuqr_options=`` into :class:`Settings`.

    The options are read first (a bad object raises TypeError), then the
    backend by the precedence rule (:func:`resolve_backend`).
    """
    if gpuqr_options is None:
        return settings_for(backend, _DEFAULT_OPTIONS, environ)
    return settings_for(backend, resolve_options(gpuqr_options), environ)


#: The settings of a call that names no backend and passes no options, with no
#: ``SCIPY_GPUQR_BACKEND`` set (immutable, so one instance serves every such call).
_DEFAULT_SETTINGS = Settings(backend="auto", source="default", options=_DEFAULT_OPTIONS)


def settings_for(backend, options: GpuqrOptions,
                 environ: Mapping[str, str] = os.environ) -> Settings:
    """:class:`Settings` of a call whose options are already resolved."""
    if backend is not None:
        requested, source = _check_backend(backend, "backend"), "keyword"
    else:
        requested, source = _backend_of(options, environ)
        if source == "default" and options is _DEFAULT_OPTIONS:
            return _DEFAULT_SETTINGS
    return Settings(backend=requested, source=source, options=options)


def getenv(name: str, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """``environ.get(name)``: for ``os.environ`` a look-up in the table its ``get`` reads.

    ``os.environ.get`` of a name that is not set raises and catches a
    KeyError inside ``Mapping.get``, several microseconds from cold caches on
    every short call (``spsolve`` of a small system takes 50-100 µs); the
    table is the one ``os.environ`` keeps in step with the environment.
    Any other mapping (or an ``os.environ`` without that table) answers
    through its own ``get``.
    """
    data = getattr(environ, "_data", None)
    if environ is os.environ and type(data) is dict:
        value = data.get(_environ_key(name))
        return None if value is None else environ.decodevalue(value)
    return environ.get(name)


@functools.lru_cache(maxsize=64)
def _environ_key(name: str):
    """``os.environ``'s key of ``name`` in its table (the name encoded), made once
    per name: the encoding costs microseconds from cold caches on every call."""
    return os.environ.encodekey(name)


def auto_source(backend, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """Where ``auto`` came from for a call without an options object, or None.

    The precedence rule of :func:`resolve_backend` for the commonest call,
    without building :class:`Settings`: ``'keyword'`` when ``backend`` names
    ``auto``, ``'environment'`` when it is None and ``SCIPY_GPUQR_BACKEND``
    says ``auto``, ``'default'`` when neither names a backend. None for every
    other backend, and for a value that is not a backend (the caller's
    general path, through :func:`resolve_settings`, raises its ValueError).
    Reads the environment at most once.
    """
    if backend is not None:
        if backend == "auto" or (isinstance(backend, str) and backend.lower() == "auto"):
            return "keyword"
        return None
    env = getenv(ENV_BACKEND, environ)
    if not env or not (env := env.strip()):
        return "default"
    return "environment" if env.lower() == "auto" else None


#: The settings of ``auto`` without an options object, by source (immutable).
_AUTO_SETTINGS = {source: Settings(backend="auto", source=source, options=_DEFAULT_OPTIONS)
                  for source in ("keyword", "environment")} | {"default": _DEFAULT_SETTINGS}


def auto_settings(source: str) -> Settings:
    """The :class:`Settings` of ``auto`` from ``source`` (as :func:`auto_source` says it)
    without an options object: what :func:`resolve_settings` gives such a call."""
    return _AUTO_SETTINGS[source]


def log_decision(message: str, *args,
                 environ: Mapping[str, str] = os.environ) -> None:
    """Log a dispatch decision at INFO; also to stderr when verbose.

    ``SCIPY_GPUQR_VERBOSE=1`` prints the message to stderr without touching
    the logging configuration of the host program.
    """
    logger.info(message, *args)
    if getenv(ENV_VERBOSE, environ) not in (None, "", "0"):
        text = message % args if args else message
        print(f"scipy_gpuqr: {text}", file=sys.stderr)
