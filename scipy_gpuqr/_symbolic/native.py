"""The analysis' tree loops in compiled code (``_native.c``), built on first use.

Liu's algorithm for the column elimination tree walks the tree edge by edge
with path compression: a Python loop (one step per edge and climb), the
largest sequential part of an analysis; the fronts' column lists take a sort
per tree level of every entry. ``_native.c`` runs these in plain loops,
giving the same arrays as the NumPy functions of :mod:`.etree` and
:mod:`.fronts` (the reference; tests compare both):

* ``sgs_column_etree``: :func:`.etree.column_etree` (Liu's algorithm on the
  star edges directly, no spanning forest needed);
* ``sgs_postorder``: :func:`.etree.postorder` without weights;
* ``sgs_column_counts``: :func:`.etree.column_counts` (the same skeleton
  formula, the least common ancestors from a union-find as the leaves are
  visited in postorder);
* ``sgs_relaxed_amalgamation``: the scalar loop of
  :func:`.fronts.relaxed_amalgamation` (the same rule and float arithmetic);
* ``sgs_front_columns``: the level loop of :func:`.fronts.build_fronts` (the
  fronts' column lists, their children's Rjmap, the S entries' local columns,
  ``fm`` and ``cm``), front after front with a scratch map from a column to
  its local index instead of a sort per tree level;
* ``sgs_front_rows``: the rest of :func:`.fronts.build_fronts` (staircases,
  the S rows' and the children's rows' places, the S-assembly map), front
  after front by counting the rows per slot.

The library is built and loaded the way :mod:`scipy_gpuqr._schedule.native`
builds its own (that module is above this part of the package, so its loader
cannot be shared from here): plain C99 without Python headers, compiled by
``$CC`` or the first of ``cc``, ``gcc``, ``clang`` with ``-O2 -shared -fPIC``
into ``native/`` of the package cache folder as ``symbolic-{key}.so`` (key: a
hash of the source, :data:`ABI`, the platform and the command), into a
temporary file that is loaded, then published with its manifest (size and
SHA-256, :data:`MANIFEST_SUFFIX`) by ``os.replace``; a library on disk is
opened only when it matches its manifest (``dlopen`` of a damaged file can kill
the process), else it is deleted and built again. Loaded with ``ctypes`` and
checked by ``sgs_abi()``; at most :data:`MAX_BUILDS` builds are kept.

``$SCIPY_GPUQR_SYMBOLIC_NATIVE`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it is at hand; while it is being built, on a worker
thread started by the first analysis of a process that finds none, the NumPy
code runs), ``c`` (wait for the build; :class:`NativeUnavailable` when it
cannot be had), ``numpy``. No compiler, no cache folder, a failed build or an
old library (another ABI): the NumPy path, decided once per process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping

import numpy as np

from .._cachedir import cache_dir
from .._errors import NativeUnavailable

__all__ = ["ENV", "ABI", "MODES", "MANIFEST_SUFFIX", "MAX_BUILDS", "NativeUnavailable", "mode", "library",
           "status", "column_etree", "postorder", "column_counts", "front_columns",
           "relaxed_amalgamation", "front_rows"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_SYMBOLIC_NATIVE"
MODES = ("auto", "c", "numpy")
#: Interface version of ``_native.c`` (``sgs_abi()``).
ABI = 4
#: Suffix added to a library's file name to name its manifest (size and SHA-256).
MANIFEST_SUFFIX = ".sha256"
_SOURCE = Path(__file__).resolve().with_name("_native.c")
_FLAGS = ("-O2", "-shared", "-fPIC")
_PREFIX = "symbolic-"


def mode(environ: Mapping[str, str] = os.environ) -> str:
    """The path asked for by :data:`ENV` (``auto`` when unset)."""
    v = environ.get(ENV, "").strip().lower() or "auto"
    if v not in MODES:
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, got {v!r}")
    return v


def _compiler(environ: Mapping[str, str]) -> list | None:
    cc = environ.get("CC", "").strip()
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def _key(cmd: list, source: bytes) -> str:
    h = hashlib.sha1()
    for part in (source, str(ABI).encode(), sys.platform.encode(),
                 platform.machine().encode(), "\0".join(cmd + list(_FLAGS)).encode()):
        h.update(part + b"\0")
    return h.hexdigest()[:16]


def _manifest_path(path: Path) -> Path:
    return path.with_name(path.name + MANIFEST_SUFFIX)


def _checksum(path: Path, sync: bool = False) -> tuple[int, str]:
    """``(size, sha256 hex)`` of ``path`` (``sync``: flushed to disk first)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        size = 0
        while chunk := f.read(1 << 16):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _intact(path: Path) -> bool:
    """Whether ``path`` has the size and SHA-256 its manifest records."""
    try:
        fields = dict(line.split(" ", 1)
                      for line in _manifest_path(path).read_text(encoding="ascii").splitlines())
        want = (int(fields["size"]), fields["sha256"])
        if path.stat().st_size != want[0]:
            return False
        return _checksum(path) == want
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return False


def _discard(path: Path) -> None:
    for p in (_manifest_path(path), path):
        try:
            p.unlink()
        except OSError:
            pass


#: Most built libraries kept (other sources or compilers: other package versions).
MAX_BUILDS = 8


def _prune(folder: Path, keep: Path) -> None:
    """Delete the oldest builds past :data:`MAX_BUILDS` with their manifests (best
    effort: a library in use stays mapped where it is open)."""
    try:
        builds = sorted(folder.glob(f"{_PREFIX}*.so"), key=lambda p: p.stat().st_mtime)
        for p in [p for p in builds if p != keep][:max(len(builds) - MAX_BUILDS, 0)]:
            _discard(p)
    except OSError:
        pass


def _open(path: Path) -> ctypes.CDLL:
    """Open the library and declare its functions; refuse another ABI."""
    lib = ctypes.CDLL(str(path))
    lib.sgs_abi.argtypes, lib.sgs_abi.restype = [], ctypes.c_int
    if lib.sgs_abi() != ABI:
        raise OSError(f"ABI {lib.sgs_abi()} instead of {ABI}")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.sgs_column_etree.argtypes = [i64, i64, ptr, ptr, ptr, ptr]
    lib.sgs_postorder.argtypes = [i64, ptr, ptr]
    lib.sgs_column_counts.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr]
    lib.sgs_front_columns.argtypes = [i64, i64] + [ptr] * 15
    lib.sgs_relaxed_amalgamation.argtypes = [i64] + [ptr] * 7
    lib.sgs_front_rows.argtypes = [i64] + [ptr] * 17
    lib.sgs_front_rows.restype = ctypes.c_int
    lib.sgs_relaxed_amalgamation.restype = None
    for name in ("sgs_column_etree", "sgs_postorder", "sgs_column_counts", "sgs_front_columns"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


class _Fail(Exception):
    pass


class _Loader:
    """The process' library: found on disk, or built once (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lib = None
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def status(self) -> str:
        if self._lib is not None:
            return "loaded"
        if self._error is not None:
            return f"unavailable: {self._error}"
        return "building" if self._thread is not None else "not loaded"

    def get(self, wait: bool, environ: Mapping[str, str] = os.environ):
        """The library; None when it cannot be had or (``wait`` False) while it
        is being built on a worker thread."""
        with self._lock:
            if self._pid != os.getpid():          # a forked child: no build thread here
                self._pid, self._thread = os.getpid(), None
            if self._lib is not None or self._error is not None:
                return self._lib
            th = self._thread
            if th is None:
                try:
                    path, cmd = self._where(environ)
                except _Fail as exc:
                    self._error = str(exc)
                    return None
                if path.is_file() or _manifest_path(path).is_file():
                    if _intact(path):              # never dlopen a damaged file
                        try:
                            self._lib = _open(path)
                            return self._lib
                        except Exception:          # noqa: BLE001 - built again below
                            pass
                    _discard(path)
                th = threading.Thread(target=self._build, args=(path, cmd),
                                      name="scipy_gpuqr-symbolic-build")
                self._thread = th
                th.start()
        if not wait:
            return None
        th.join()
        return self._lib

    @staticmethod
    def _where(environ):
        cmd = _compiler(environ)
        if cmd is None:
            raise _Fail("no C compiler (cc, gcc, clang; or $CC)")
        base = cache_dir(environ)
        if base is None:
            raise _Fail("no cache folder")
        try:
            source = _SOURCE.read_bytes()
        except OSError as exc:
            raise _Fail(f"cannot read {_SOURCE.name}: {exc}") from None
        return base / "native" / f"{_PREFIX}{_key(cmd, source)}.so", cmd

    def _build(self, path: Path, cmd: list) -> None:
        """Compile into a temporary file beside ``path``, load it, then publish
        its manifest and it (``os.replace``, the manifest first)."""
        err = lib = None
        tmp = tmp_m = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{_PREFIX}", suffix=".so", dir=path.parent)
            os.close(fd)
            r = subprocess.run(cmd + list(_FLAGS) + ["-o", tmp, str(_SOURCE)],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
            if r.returncode != 0:
                msg = (r.stderr or r.stdout).decode(errors="replace").strip()
                err = f"compiler failed ({r.returncode}): {msg[-300:]}"
            else:
                size, digest = _checksum(Path(tmp), sync=True)
                lib = _open(Path(tmp))
                fd, tmp_m = tempfile.mkstemp(prefix=f".{_PREFIX}", suffix=MANIFEST_SUFFIX,
                                             dir=path.parent)
                with os.fdopen(fd, "w") as f:
                    f.write(f"size {size}\nsha256 {digest}\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp_m, os.stat(tmp).st_mode & 0o666)
                os.replace(tmp_m, _manifest_path(path))
                tmp_m = None
                os.replace(tmp, path)
                tmp = None
                _prune(path.parent, keep=path)
        except Exception as exc:                   # noqa: BLE001 - NumPy path instead
            err, lib = f"build failed: {exc}", None
        finally:
            for t in (tmp, tmp_m):
                if t is not None:
                    try:
                        os.unlink(t)
                    except OSError:
                        pass
        with self._lock:
            if err is None:
                self._lib = lib
            else:
                self._error = err
            self._thread = None


_LOADER = _Loader()


def library(environ: Mapping[str, str] = os.environ):
    """The compiled library for this process' mode, or None for the NumPy path.

    Raises
    ------
    NativeUnavailable
        Mode ``c`` and the library cannot be had.
    """
    m = mode(environ)
    if m == "numpy":
        return None
    lib = _LOADER.get(m == "c", environ)
    if lib is None and m == "c":
        raise NativeUnavailable(f"compiled symbolic analysis unavailable: {_LOADER.status()}")
    return lib


def status() -> str:
    """``loaded``, ``building``, ``not loaded`` or ``unavailable: <why>``."""
    return _LOADER.status()


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _check(rc: int, name: str) -> None:
    if rc != 0:
        raise MemoryError(f"{name}: out of memory in the compiled analysis")


def column_etree(lib, indptr, indices, n: int, leftmost) -> np.ndarray:
    """:func:`.etree.column_etree` in C (``leftmost`` required)."""
    indptr, indices, leftmost = _i64(indptr), _i64(indices), _i64(leftmost)
    parent = np.empty(n, dtype=np.int64)
    _check(lib.sgs_column_etree(len(indptr) - 1, n, indptr.ctypes.data, indices.ctypes.data,
                                leftmost.ctypes.data, parent.ctypes.data), "column_etree")
    return parent


def postorder(lib, parent) -> np.ndarray:
    """:func:`.etree.postorder` without weights, in C."""
    parent = _i64(parent)
    post = np.empty(len(parent), dtype=np.int64)
    _check(lib.sgs_postorder(len(parent), parent.ctypes.data, post.ctypes.data), "postorder")
    return post


def column_counts(lib, indptr, indices, parent, leftmost) -> np.ndarray:
    """:func:`.etree.column_counts` in C."""
    indptr, indices, parent, leftmost = _i64(indptr), _i64(indices), _i64(parent), \
        _i64(leftmost)
    counts = np.empty(len(parent), dtype=np.int64)
    _check(lib.sgs_column_counts(len(indptr) - 1, len(parent), indptr.ctypes.data,
                                 indices.ctypes.data, parent.ctypes.data, leftmost.ctypes.data,
                                 counts.ctypes.data), "column_counts")
    return counts


def front_columns(lib, front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na,
                  rjmap_ptr, n: int, n_entries: int) -> tuple:
    """:func:`.fronts.build_fronts`' level loop in C: ``(cols, rjmap, ent_col, fm,
    cm)``, or ``(front, count)`` of the first front whose column list disagrees
    with the column counts (then the other arrays are None)."""
    front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na, rjmap_ptr = (
        _i64(x) for x in (front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na,
                          rjmap_ptr))
    nf = len(front_ptr) - 1
    cols = np.empty(int(col_ptr[-1]), dtype=np.int64)
    rjmap = np.empty(int(rjmap_ptr[-1]), dtype=np.int64)
    ent_col = np.empty(int(n_entries), dtype=np.int64)
    fm = np.zeros(nf, dtype=np.int64)
    cm = np.zeros(nf, dtype=np.int64)
    bad = np.zeros(2, dtype=np.int64)
    rc = lib.sgs_front_columns(nf, n, *(x.ctypes.data for x in (
        front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na, rjmap_ptr, cols,
        rjmap, ent_col, fm, cm, bad)))
    if rc == 2:
        return None, (int(bad[0]), int(bad[1]))
    _check(rc, "front_columns")
    return (cols, rjmap, ent_col, fm, cm), None


def relaxed_amalgamation(lib, sparent, nscol, snz, nrelax, zrelax) -> np.ndarray:
    """:func:`.fronts.relaxed_amalgamation`'s loop in C: the supernodes that stay
    group heads (bool array)."""
    ns_total = len(sparent)
    sparent = _i64(sparent)
    nscol, snz = np.array(nscol, dtype=np.int64), np.array(snz, dtype=np.int64)
    zeros = np.zeros(ns_total, dtype=np.int64)
    nr = np.array([int(v) for v in nrelax], dtype=np.int64)
    zr = np.array([float(v) for v in zrelax], dtype=np.float64)
    keep = np.empty(ns_total, dtype=np.int8)
    lib.sgs_relaxed_amalgamation(ns_total, *(x.ctypes.data for x in (
        sparent, nscol, snz, zeros, nr, zr, keep)))
    return keep.view(bool)


def front_rows(lib, front_ptr, fn, col_ptr, arow_ptr, leftmost, s_indptr, ent_col, child_ptr,
               children, cm, rjmap_ptr, rjmap, rimap_ptr) -> tuple:
    """The rows of :func:`.fronts.build_fronts` in C: ``(stair, arow_local, rimap,
    s_index)`` (``leftmost`` and ``s_indptr`` of S's non-empty rows, in order)."""
    args = [_i64(x) for x in (front_ptr, fn, col_ptr, arow_ptr, leftmost, s_indptr, ent_col,
                               child_ptr, children, cm, rjmap_ptr, rjmap, rimap_ptr)]
    nf = len(args[0]) - 1
    stair = np.empty(int(args[2][-1]), dtype=np.int64)
    arow_local = np.empty(int(args[3][-1]), dtype=np.int64)
    rimap = np.empty(int(args[12][-1]), dtype=np.int64)
    s_index = np.empty(len(args[6]), dtype=np.int64)
    _check(lib.sgs_front_rows(nf, *(x.ctypes.data for x in args + [stair, arow_local, rimap,
                                                                      s_index])), "front_rows")
    return stair, arow_local, rimap, s_index
