"""Locate and open SuiteSparse shared libraries at run time (cffi ABI mode).

Libraries are found by soname, newest major version first (SuiteSparse 7.x:
libspqr.so.4, libcholmod.so.5, libcolamd.so.3; 5.x as in Debian bookworm:
libspqr.so.2, libcholmod.so.3, libcolamd.so.2). ``SUITESPARSE_LIBDIR`` names
a folder to look in first. Nothing is opened at import; each ``open_*`` call
returns a fresh handle from cffi (the dynamic loader shares the mapping).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Mapping

from .._errors import LibraryNotFound

__all__ = ["SONAMES", "find_library", "open_library", "open_cdll", "LibraryNotFound",
           "INSTALL_HINT"]

#: candidate sonames per library, newest first
SONAMES: dict[str, tuple[str, ...]] = {
    "colamd": ("libcolamd.so.3", "libcolamd.so.2"),
    "amd": ("libamd.so.3", "libamd.so.2"),
    "metis": ("libmetis.so.5",),
    "cholmod": ("libcholmod.so.5", "libcholmod.so.4", "libcholmod.so.3"),
    "spqr": ("libspqr.so.4", "libspqr.so.3", "libspqr.so.2"),
    "suitesparseconfig": ("libsuitesparseconfig.so.7", "libsuitesparseconfig.so.5"),
}

INSTALL_HINT = ("install SuiteSparse (Debian/Ubuntu: apt-get install libsuitesparse-dev "
                "or libspqr2; conda: conda install -c conda-forge suitesparse) or set "
                "SUITESPARSE_LIBDIR to the folder holding libspqr.so")


def find_library(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """Return a path or soname of library ``name`` that the loader can open.

    Parameters
    ----------
    name : str
        Key of :data:`SONAMES` (``"colamd"``, ``"cholmod"``, ``"spqr"``...).

    Raises
    ------
    LibraryNotFound
        When no candidate opens; the message lists what was tried.
    """
    candidates = SONAMES[name]
    libdir = environ.get("SUITESPARSE_LIBDIR")
    tried = []
    for soname in candidates:
        paths = [str(Path(libdir) / soname)] if libdir else []
        paths.append(soname)
        for path in paths:
            tried.append(path)
            try:
                ctypes.CDLL(path)
            except OSError:
                continue
            return path
    raise LibraryNotFound(f"SuiteSparse library {name!r} not found (tried "
                          f"{', '.join(tried)}); {INSTALL_HINT}")


def open_library(ffi, name: str, environ: Mapping[str, str] = os.environ):
    """``ffi.dlopen`` the library ``name``; raises :class:`LibraryNotFound`."""
    return _opened(ffi.dlopen, name, environ)


def open_cdll(name: str, environ: Mapping[str, str] = os.environ) -> ctypes.CDLL:
    """``ctypes.CDLL`` of the library ``name``; raises :class:`LibraryNotFound`."""
    return _opened(ctypes.CDLL, name, environ)


def _opened(dlopen, name: str, environ: Mapping[str, str]):
    path = find_library(name, environ)
    try:
        return dlopen(path)
    except OSError as exc:
        raise LibraryNotFound(f"could not open {path}: {exc}") from exc


def major_version(path: str) -> int:
    """The soname's major number, e.g. 2 for ``.../libspqr.so.2``."""
    return int(path.rsplit(".so.", 1)[1].split(".")[0])
