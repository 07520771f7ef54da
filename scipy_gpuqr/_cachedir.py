"""The package's user cache folder (light: no SciPy, nothing done at import).

``$SCIPY_GPUQR_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/scipy_gpuqr``,
else ``~/.cache/scipy_gpuqr``. Used by the disk store (:mod:`scipy_gpuqr._store`)
of the schedule caches (:mod:`scipy_gpuqr._schedule.cache`: tile schedules
and whole plans) and of the analyses
(:mod:`scipy_gpuqr._symbolic.analysis_cache`), the compiled libraries
(:mod:`scipy_gpuqr._native_build`: the schedule's bucket simulation and the
symbolic analysis' tree loops), SuiteSparse's C declarations as parsed by
cffi (:mod:`scipy_gpuqr._cpu._ffi_cache`), the sparse calibration
(:mod:`scipy_gpuqr._dispatch.calibrate`) and the tiled QR's
(:func:`scipy_gpuqr.tiled._calibrate.cache_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

__all__ = ["ENV_CACHE_DIR", "cache_dir", "require_cache_dir"]

#: Environment variable naming the cache folder.
ENV_CACHE_DIR = "SCIPY_GPUQR_CACHE_DIR"


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The user cache folder of this package (not created here).

    Returns
    -------
    Path or None
        None when no variable names one and there is no home folder.
    """
    env = environ.get(ENV_CACHE_DIR, "").strip()
    if env:
        return Path(env)
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg) / "scipy_gpuqr"
    try:
        return Path.home() / ".cache" / "scipy_gpuqr"
    except (RuntimeError, KeyError):                 # no home folder
        return None


def require_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """:func:`cache_dir`, raising where there is none.

    Raises
    ------
    RuntimeError
        No variable names a folder and there is no home folder.
    """
    folder = cache_dir(environ)
    if folder is None:
        raise RuntimeError(f"no cache folder: set {ENV_CACHE_DIR}")
    return folder
