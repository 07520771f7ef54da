"""The stored calibration of ``auto``'s intensity thresholds, per GPU model.

A :class:`Calibration` holds two fitted thresholds and the measured points
behind them (see :mod:`scipy_gpuqr._dispatch.calibrate`): ``threshold``,
the GPU QR against the CPU QR (``lsqr``/``lsmr``/``qr``), and
``spsolve_threshold``, the GPU QR's square solve against SciPy's SuperLU
(``spsolve``/``factorized``, whose CPU side is SciPy's own function). It lives in
``sparse_calibration.json`` in the package's user cache folder
(:func:`scipy_gpuqr._cachedir.cache_dir`: ``$SCIPY_GPUQR_CACHE_DIR``, else
``$XDG_CACHE_HOME/scipy_gpuqr``, else ``~/.cache/scipy_gpuqr``), keyed by the
GPU model name (``gpu_info()['name']``). :func:`load_calibration` and
:func:`load_threshold` read it back for the dispatcher
(:mod:`scipy_gpuqr._dispatch.plan`) and the cost model
(:mod:`scipy_gpuqr._dispatch.cost_model`); a parsed copy is kept per file
path, modification time and size, so a new calibration is seen at once and
nothing else is held between calls.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Mapping, Optional

from .._cachedir import require_cache_dir

__all__ = ["CalibrationPoint", "Calibration", "calibration_file", "load_calibration",
           "load_threshold", "load_spsolve_threshold", "store_calibration", "CACHE_NAME",
           "RULE"]

CACHE_NAME = "sparse_calibration.json"
_FORMAT = 1
#: One line naming the fit rule (stored with every calibration).
RULE = ("smallest measured intensity above which every GPU/CPU ratio < 1, "
        "log-log interpolated to ratio 1 from the point below")


@dataclasses.dataclass(frozen=True)
class CalibrationPoint:
    """Warm timings of one problem on both backends (seconds).

    ``cpu_backend`` names the CPU side that ran: ``'cpu'`` (SuiteSparseQR),
    ``'reference'``, or ``'superlu'`` (SciPy's SuperLU, for the points of
    the ``spsolve`` threshold).
    """

    name: str
    shape: tuple
    nnz: int
    flops: float
    intensity: float
    analyze_s: float
    cpu_s: float
    gpu_s: float
    cpu_backend: str = "cpu"

    @property
    def ratio(self) -> float:
        """GPU time over CPU time (< 1: the GPU is faster)."""
        return self.gpu_s / self.cpu_s if self.cpu_s > 0 else math.inf

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        out["ratio"] = self.ratio
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "CalibrationPoint":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["shape"] = tuple(kw.get("shape", ()))
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A fitted threshold and the measurements behind it.

    Attributes
    ----------
    gpu_name : str
        GPU model (``gpu_info()['name']``), the cache key.
    compute_capability, cupy_version : str
        Of the device and library that measured.
    threshold : float
        Flops/byte at and above which ``auto`` picks the GPU (``inf``: never).
    points : tuple of CalibrationPoint
        The GPU and CPU QR timings ``threshold`` was fitted to.
    date : str
        ISO date of the measurement.
    rule : str
        The fit rule (:data:`RULE`).
    host : str
        The CPU side (cores, backend that ran).
    path : str or None
        The cache file it was stored in or read from.
    spsolve_threshold : float or None
        Flops/byte at and above which ``spsolve``/``factorized`` under
        ``auto`` use the GPU QR instead of SciPy's SuperLU (``inf``: never);
        None when not measured (the dispatcher then uses
        :data:`~scipy_gpuqr._options.DEFAULT_SPSOLVE_THRESHOLD`).
    spsolve_points : tuple of CalibrationPoint
        SuperLU (``cpu_s``, ``cpu_backend='superlu'``) against the GPU QR's
        square solve (``gpu_s``), the points ``spsolve_threshold`` was fitted to.
    """

    gpu_name: str
    compute_capability: str
    cupy_version: str
    threshold: float
    points: tuple
    date: str
    rule: str = RULE
    host: str = ""
    path: Optional[str] = None
    spsolve_threshold: Optional[float] = None
    spsolve_points: tuple = ()

    def describe(self) -> str:
        """One line: ``threshold <t> flops/byte, calibrated <date> for <GPU model>``."""
        return (f"threshold {_fmt_threshold(self.threshold)} flops/byte, "
                f"calibrated {self.date} for {self.gpu_name}")

    def describe_spsolve(self) -> str:
        """One line for the SuperLU threshold (``spsolve``/``factorized``), or why there is none."""
        if self.spsolve_threshold is None:
            return f"spsolve threshold not measured for {self.gpu_name}"
        return (f"spsolve threshold {_fmt_threshold(self.spsolve_threshold)} flops/byte "
                f"(GPU QR against SciPy's SuperLU), calibrated {self.date} for "
                f"{self.gpu_name}")

    def to_json(self) -> dict:
        out = {"gpu_name": self.gpu_name, "compute_capability": self.compute_capability,
               "cupy_version": self.cupy_version,
               "threshold": _threshold_to_json(self.threshold),
               "date": self.date, "rule": self.rule, "host": self.host,
               "points": [p.to_json() for p in self.points]}
        if self.spsolve_threshold is not None:
            out["spsolve_threshold"] = _threshold_to_json(self.spsolve_threshold)
            out["spsolve_points"] = [p.to_json() for p in self.spsolve_points]
        return out

    @classmethod
    def from_json(cls, d: Mapping, path: Optional[str] = None) -> "Calibration":
        spsolve = d.get("spsolve_threshold")
        return cls(gpu_name=str(d["gpu_name"]),
                   compute_capability=str(d.get("compute_capability", "")),
                   cupy_version=str(d.get("cupy_version", "")),
                   threshold=_threshold_from_json(d["threshold"]),
                   points=tuple(CalibrationPoint.from_json(p) for p in d.get("points", ())),
                   date=str(d.get("date", "")), rule=str(d.get("rule", RULE)),
                   host=str(d.get("host", "")), path=path,
                   spsolve_threshold=None if spsolve is None else _threshold_from_json(spsolve),
                   spsolve_points=tuple(CalibrationPoint.from_json(p)
                                        for p in d.get("spsolve_points", ())))


def _fmt_threshold(t: float) -> str:
    return "inf" if math.isinf(t) else f"{t:.3g}"


def _threshold_to_json(t: float):
    return "inf" if math.isinf(t) else float(t)


def _threshold_from_json(v) -> float:
    t = float(v)  # float("inf") reads the stored "inf"
    if math.isnan(t) or t < 0:
        raise ValueError(f"bad threshold {v!r}")
    return t


# -- the cache file --------------------------------------------------------------------


def calibration_file(directory: Optional[os.PathLike] = None) -> Path:
    """Path of the sparse calibration cache (``directory`` or the user cache folder)."""
    if directory:
        return Path(directory) / CACHE_NAME
    return require_cache_dir() / CACHE_NAME


@functools.lru_cache(maxsize=4)
def _parsed(path: str, mtime_ns: int, size: int) -> str:
    """The file's GPU table, re-serialized (callers parse their own copy)."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    gpus = data.get("gpus", {}) if isinstance(data, dict) else {}
    return json.dumps(gpus if isinstance(gpus, dict) else {})


def _read_table(path: Path) -> dict:
    """The GPU table of the file ``path``, or {} (none, unreadable or malformed)."""
    try:
        st = path.stat()
    except OSError:
        return {}
    return _table_of(str(path), st.st_mtime_ns, st.st_size)


def _table_of(path: str, mtime_ns: int, size: int) -> dict:
    """The GPU table of the file of this stamp (the caller stat'ed it), or {}."""
    try:
        return json.loads(_parsed(path, mtime_ns, size))
    except (OSError, ValueError):
        return {}


def store_calibration(path: Path, cal: Calibration) -> None:
    """Write ``cal`` into the cache file ``path``, beside the other GPU models' entries."""
    table = _read_table(path)
    table[cal.gpu_name] = cal.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": _FORMAT, "gpus": table}, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def load_calibration(gpu_name: Optional[str], *,
                     directory: Optional[os.PathLike] = None) -> Optional[Calibration]:
    """The stored calibration of a GPU model, or None (none, unreadable or malformed)."""
    if not gpu_name:
        return None
    path = calibration_file(directory)
    try:
        st = path.stat()
    except OSError:
        return None
    return _calibration_of(str(path), st.st_mtime_ns, st.st_size, str(gpu_name))


@functools.lru_cache(maxsize=8)
def _calibration_of(path: str, mtime_ns: int, size: int, gpu_name: str) -> Optional[Calibration]:
    """The (frozen) calibration of ``gpu_name`` in the file of this stamp, parsed once
    per process and file version (``auto`` and the cost model ask on every call)."""
    entry = _table_of(path, mtime_ns, size).get(gpu_name)
    if not isinstance(entry, dict):
        return None
    try:
        return Calibration.from_json(entry, path=path)
    except (KeyError, TypeError, ValueError):
        return None


def load_threshold(gpu_name: Optional[str], *,
                   directory: Optional[os.PathLike] = None) -> Optional[float]:
    """The calibrated threshold (flops/byte, maybe ``inf``) of a GPU model, or None."""
    cal = load_calibration(gpu_name, directory=directory)
    return None if cal is None else cal.threshold


def load_spsolve_threshold(gpu_name: Optional[str], *,
                           directory: Optional[os.PathLike] = None) -> Optional[float]:
    """The threshold calibrated against SciPy's SuperLU (flops/byte, maybe ``inf``)
    of a GPU model, or None (not calibrated, or calibrated without it)."""
    cal = load_calibration(gpu_name, directory=directory)
    return None if cal is None else cal.spsolve_threshold
