"""SciPy's own solver functions, captured before anything can patch them.

:mod:`scipy_gpuqr._api.patch` replaces ``lsqr``, ``lsmr``, ``spsolve`` and
``factorized`` in ``scipy.sparse.linalg``. Our fallbacks (a LinearOperator,
a complex matrix, anything we cannot serve) must reach SciPy's real
functions, never whatever ``scipy.sparse.linalg.lsqr`` holds at call time,
or a patched process would call itself. The references are taken from the
modules that *define* the functions, when this module is first imported;
:mod:`scipy_gpuqr._api.patch` imports this module before it patches anything,
and the fallbacks of ``spsolve``/``factorized`` under ``auto`` (SuperLU) call them from here.

The dictionary is built once at import and never changed (a constant, not
mutable state).
"""

from __future__ import annotations

import importlib
import types

# import_module returns the submodules themselves: the packages' attributes
# of the same names are the functions.
_linsolve = importlib.import_module("scipy.sparse.linalg._dsolve.linsolve")
_lsmr_module = importlib.import_module("scipy.sparse.linalg._isolve.lsmr")
_lsqr_module = importlib.import_module("scipy.sparse.linalg._isolve.lsqr")

__all__ = ["ORIGINALS", "original", "MatrixRankWarning", "spsolve_gssv"]


def _capture(module, name: str):
    func = vars(module)[name]
    if getattr(func, "__module__", "").startswith("scipy_gpuqr"):
        # Only possible if someone patched SciPy by hand before importing us.
        raise ImportError(
            f"scipy_gpuqr._api.originals: {module.__name__}.{name} is already "
            "replaced by scipy_gpuqr; import scipy_gpuqr before patching")
    return func


#: name -> SciPy's original function object (read-only view).
ORIGINALS = types.MappingProxyType({
    "lsqr": _capture(_lsqr_module, "lsqr"),
    "lsmr": _capture(_lsmr_module, "lsmr"),
    "spsolve": _capture(_linsolve, "spsolve"),
    "factorized": _capture(_linsolve, "factorized"),
    "splu": _capture(_linsolve, "splu"),
})

#: SciPy's warning class for singular systems (re-exported, not a copy).
MatrixRankWarning = _linsolve.MatrixRankWarning

#: SuperLU's ``gssv`` as SciPy's ``spsolve`` calls it, None where this SciPy's module
#: lacks it; SciPy's per-thread UMFPACK switch (the object itself, read at each call)
#: and whether scikit-umfpack failed to import. Looked up once: each attribute chain
#: costs microseconds from cold caches on every short ``spsolve``.
_GSSV = getattr(getattr(_linsolve, "_superlu", None), "gssv", None)
_USE_UMFPACK = getattr(_linsolve, "useUmfpack", None)
_NO_SCIKIT = bool(getattr(_linsolve, "noScikit", False))


def original(name: str):
    """Return SciPy's original function ``name`` (e.g. ``'lsqr'``).

    Raises
    ------
    KeyError
        For a name that is not one of :data:`ORIGINALS`.
    """
    return ORIGINALS[name]


def spsolve_gssv(use_umfpack: bool):
    """SuperLU's driver ``gssv`` as SciPy's ``spsolve`` calls it for a vector b, or None.

    SciPy's ``spsolve`` answers a vector b with one call of its SuperLU
    module's ``gssv``, unless it would use UMFPACK (``use_umfpack`` and
    scikit-umfpack installed, and not turned off through
    ``linsolve.useUmfpack.u``). None there, and where this SciPy's module
    does not have the names (another SciPy layout): the caller then calls
    SciPy's ``spsolve`` itself.
    """
    if use_umfpack and _GSSV is not None:
        u = getattr(_USE_UMFPACK, "u", None)
        if u is None:               # SciPy sets it on its first call, from noScikit
            u = not _NO_SCIKIT
        if u:
            return None
    return _GSSV
