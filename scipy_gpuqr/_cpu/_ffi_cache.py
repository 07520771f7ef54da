"""cffi declarations parsed once per cache folder, not once per process.

cffi's in-line ABI mode (``FFI().cdef(text)``) parses the C declarations with
pycparser in every new process, after importing the parser, and parses again
each C type string a process first names in ``ffi.new``, ``ffi.cast`` or
``ffi.from_buffer``: tens of milliseconds paid by a process' first
SuiteSparse call. cffi's out-of-line ABI mode (``ffi.set_source(name, None)``
then ``ffi.compile()``, no C compiler) writes the parsed declarations as a
small pure-Python module whose ``ffi`` the C backend builds from tables, and
whose type strings the backend's own C parser reads.

:func:`declared_ffi` keeps that module in the package's cache folder
(:func:`scipy_gpuqr._cachedir.cache_dir`), as ``cffi/<name>-<key>.py``:

* the key is a SHA-256 of the declarations and of cffi's version, so changed
  declarations (or another cffi) are written to another file, and the file
  of the old key is removed when the new one is written;
* the file ends with a SHA-256 of its body, checked at every load: a
  damaged or truncated file is written again;
* a file is written to a temporary name in the same folder and moved into
  place (``os.replace``), so processes writing at once never read half of one;
* where there is no cache folder, or it cannot be written, or the written
  module does not load, the declarations are parsed in-line, as before.

The two kinds of FFI differ in one respect callers see: a declared function
missing from the opened library raises ``AttributeError`` through an in-line
FFI's library and ``ffi.error`` through an out-of-line one; :func:`symbol`
answers None for both (:data:`SYMBOL_MISSING` names both).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Mapping

import _cffi_backend
import cffi

from .._cachedir import cache_dir

__all__ = ["declared_ffi", "inline_ffi", "declarations_path", "symbol", "SYMBOL_MISSING",
           "FOLDER"]

#: sub-folder of the cache folder holding the declaration modules
FOLDER = "cffi"

#: what looking up a declared function missing from the library raises
#: (in-line FFI, out-of-line FFI)
SYMBOL_MISSING = (AttributeError, _cffi_backend.FFI.error)

_TRAILER = b"# sha256 "


def inline_ffi(cdef: str):
    """A ``cffi.FFI`` with ``cdef`` parsed in this process (one ``cdef`` call)."""
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    return ffi


def declarations_path(name: str, cdef: str,
                      environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the declaration module of ``cdef`` is kept (None: no cache folder).

    Parameters
    ----------
    name : str
        A Python identifier naming the declaration set (``"spqr"``, ``"amd"``).
    cdef : str
        The C declarations.
    """
    if not name.isidentifier():
        raise ValueError(f"declaration set name {name!r} is not an identifier")
    folder = cache_dir(environ)
    if folder is None:
        return None
    key = hashlib.sha256(f"{_cffi_backend.__version__}\0{name}\0{cdef}".encode()).hexdigest()
    return folder / FOLDER / f"{name}-{key[:24]}.py"


def declared_ffi(name: str, cdef: str, environ: Mapping[str, str] = os.environ):
    """An FFI with ``cdef`` declared, read from the cache folder where it can be.

    Parameters
    ----------
    name : str
        A Python identifier naming the declaration set (the module's file name).
    cdef : str
        The C declarations, as for ``cffi.FFI.cdef``.
    environ : mapping
        Environment naming the cache folder (:func:`scipy_gpuqr._cachedir.cache_dir`).

    Returns
    -------
    FFI
        The out-of-line module's ``ffi`` when its file is valid or could be
        written; otherwise a ``cffi.FFI`` with ``cdef`` parsed in-line.
    """
    path = declarations_path(name, cdef, environ)
    if path is None:
        return inline_ffi(cdef)
    ffi = _load(path)
    if ffi is not None:
        return ffi
    inline = inline_ffi(cdef)
    if _write(inline, name, path):
        ffi = _load(path)
    return ffi if ffi is not None else inline


def symbol(lib, name: str):
    """``lib``'s declared function ``name``, or None where the library lacks it."""
    try:
        return getattr(lib, name)
    except SYMBOL_MISSING:
        return None


def _load(path: Path):
    """The ``ffi`` of the module at ``path``; None where it is missing, damaged
    (its SHA-256 differs) or does not build an out-of-line FFI."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    body, sep, digest = data.rpartition(_TRAILER)
    if not sep or digest.strip() != hashlib.sha256(body).hexdigest().encode():
        return None
    namespace: dict = {}
    try:
        exec(compile(body, str(path), "exec"), namespace)    # noqa: S102 (our own file)
    except Exception:                                          # noqa: BLE001 (damaged: rewrite)
        return None
    ffi = namespace.get("ffi")
    return ffi if isinstance(ffi, _cffi_backend.FFI) else None


def _write(inline, name: str, path: Path) -> bool:
    """Write the out-of-line module of the in-line FFI ``inline`` to ``path``
    (with its SHA-256 line), removing the files of other keys of ``name``;
    False where the folder cannot be written (found before the module is made)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(prefix=f".{name}-", suffix=".part", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            body = _module_source(inline, name)
            f.write(body + _TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n")
        os.chmod(tmp_path, 0o644)          # readable by whoever may read the folder
        os.replace(tmp_path, path)
    except (OSError, cffi.CDefError, cffi.VerificationError):
        Path(tmp_path).unlink(missing_ok=True)
        return False
    for old in path.parent.glob(f"{name}-*.py"):
        if old != path:
            try:
                old.unlink()
            except OSError:
                pass
    return True


def _module_source(inline, name: str) -> bytes:
    """The out-of-line module of the in-line FFI ``inline`` (cffi writes it to a
    file: a temporary folder's)."""
    module = f"_scipy_gpuqr_{name}"
    inline.set_source(module, None)
    with tempfile.TemporaryDirectory(prefix="scipy_gpuqr-cffi-") as tmp:
        return Path(inline.compile(tmpdir=tmp, verbose=False)).read_bytes()
