"""Put our solvers in place of SciPy's, and take them out again.

``patch()`` replaces ``lsqr``, ``lsmr``, ``spsolve`` and ``factorized`` in
``scipy.sparse.linalg`` and in each of its submodules that holds the very
same function object (``_isolve``, ``_isolve.lsqr``, ``_isolve.lsmr``,
``_dsolve``, ``_dsolve.linsolve``, and the old ``isolve``/``dsolve`` shims).
Code that already did ``from scipy.sparse.linalg import lsqr`` keeps the name
it bound, and so do SciPy's own internal users (``optimize.least_squares``,
``expm``): they are left alone on purpose.

The state lives in SciPy's modules themselves (which object each name holds);
this module keeps none. Patching twice is harmless, ``unpatch()`` restores the
originals saved by :mod:`scipy_gpuqr._api.originals`, and ``patched()`` restores
exactly the state it found.
"""

from __future__ import annotations

import contextlib
import importlib

import scipy.sparse.linalg as ssl

from .lsqr import lsmr, lsqr
from .originals import original
from .spsolve import factorized, spsolve

__all__ = ["patch", "unpatch", "patched", "is_patched"]

#: modules whose attributes are replaced, when they hold SciPy's function
TARGET_MODULES = (
    "scipy.sparse.linalg",
    "scipy.sparse.linalg._isolve",
    "scipy.sparse.linalg._isolve.lsqr",
    "scipy.sparse.linalg._isolve.lsmr",
    "scipy.sparse.linalg._dsolve",
    "scipy.sparse.linalg._dsolve.linsolve",
    "scipy.sparse.linalg.isolve",
    "scipy.sparse.linalg.dsolve",
)

#: the functions we answer, by name
OURS = {"lsqr": lsqr, "lsmr": lsmr, "spsolve": spsolve, "factorized": factorized}
PATCHED_NAMES = tuple(OURS)


def _modules():
    for modname in TARGET_MODULES:
        try:
            yield importlib.import_module(modname)
        except ImportError:  # a shim removed in a later SciPy
            continue


def _slots():
    """Yield (module, name) for every attribute that holds one of our names.

    ``vars(module)`` is read, not ``getattr``: SciPy's deprecated shims answer
    ``getattr`` with a DeprecationWarning, and a patch must raise no warning.
    """
    for module in _modules():
        namespace = vars(module)
        for name in PATCHED_NAMES:
            if name in namespace:
                yield module, name


def patch() -> None:
    """Replace SciPy's ``lsqr``, ``lsmr``, ``spsolve``, ``factorized`` with ours.

    Only attributes holding SciPy's original function are replaced; calling
    it again changes nothing.
    """
    for module, name in _slots():
        if vars(module)[name] is original(name):
            setattr(module, name, OURS[name])


def unpatch() -> None:
    """Put SciPy's original functions back where ours are."""
    for module, name in _slots():
        if vars(module)[name] is OURS[name]:
            setattr(module, name, original(name))


def is_patched() -> bool:
    """True when ``scipy.sparse.linalg.lsqr`` is ours."""
    return vars(ssl)["lsqr"] is OURS["lsqr"]


@contextlib.contextmanager
def patched():
    """Context manager: patch on entry, restore the state found on exit.

    Examples
    --------
    >>> import scipy.sparse.linalg as ssl
    >>> from scipy_gpuqr import patched
    >>> with patched():
    ...     pass  # ssl.lsqr, ssl.spsolve ... are scipy_gpuqr's here
    """
    saved = [(module, name, vars(module)[name]) for module, name in _slots()]
    patch()
    try:
        yield
    finally:
        for module, name, obj in saved:
            setattr(module, name, obj)
