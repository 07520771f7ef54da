"""Every cffi declaration set of the package written to the cache folder ahead of a first call.

SuiteSparseQR and AMD are called through cffi; their C declarations are parsed
once per cache folder and kept there as small Python modules
(:mod:`scipy_gpuqr._cpu._ffi_cache`). The first process to need a set parses
it: cffi imports pycparser (and compiles its sources on a fresh install) and
reads the declarations, a tenth of a second inside that process's first
SuiteSparse call. ``build_kernels.py`` (the cache warm-up users run after
installing, and ``scipy-gpuqr build-kernels``) calls :func:`declare_ahead`
first, on any host, so that no user's process parses them.
"""

from __future__ import annotations

import os
import time
from typing import Mapping

from ._cpu._ffi_cache import declarations_path, declared_ffi
from ._cpu.spqr import declaration_set
from ._symbolic.ordering import amd_declaration_set

__all__ = ["declaration_sets", "declare_ahead", "declare_ahead_line"]


def declaration_sets() -> tuple:
    """``(name, declarations)`` of every set the package declares through cffi."""
    return (declaration_set(), amd_declaration_set())


def declare_ahead(environ: Mapping[str, str] = os.environ) -> list:
    """Write each declaration set's module to the cache folder where it is not there yet.

    Parameters
    ----------
    environ : mapping
        Environment naming the cache folder (:func:`scipy_gpuqr._cachedir.cache_dir`).

    Returns
    -------
    list of (str, bool)
        Each set's name and whether its module is in the cache folder now
        (False: no cache folder, or it cannot be written; the declarations are
        then parsed in each process, as without this step).
    """
    out = []
    for name, cdef in declaration_sets():
        declared_ffi(name, cdef, environ)
        path = declarations_path(name, cdef, environ)
        out.append((name, path is not None and path.is_file()))
    return out


def declare_ahead_line(environ: Mapping[str, str] = os.environ) -> str:
    """:func:`declare_ahead`, and the line the cache warm-up prints of it (which
    sets are kept, seconds)."""
    t0 = time.perf_counter()
    sets = declare_ahead(environ)
    said = ", ".join(f"{name} {'kept' if ok else 'not kept (no writable cache folder)'}"
                     for name, ok in sets)
    return f"{'cffi declarations':<28} {said} {time.perf_counter() - t0:7.2f} s"
