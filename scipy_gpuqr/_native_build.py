"""Build, check and load the package's small C libraries on first use.

Parts of the package run their hot loops in plain C99 without Python
headers (:mod:`scipy_gpuqr._symbolic.native`, the analysis' tree loops;
:mod:`scipy_gpuqr._schedule.native`, the schedule plan's loops;
:mod:`scipy_gpuqr._engine.native`, R's gather; :mod:`scipy_gpuqr._iterative.native`,
the iterative solvers' host loops; :mod:`scipy_gpuqr._factor.native`, the host
rank decision's sparse triangular solves), so a wheel stays pure Python and any
system C compiler builds them; where none exists their NumPy code runs. All
are built and loaded by this module (it sits below every part, and parts may
not import each other upwards); a :class:`NativeLibrary` names what differs
between them (source, file prefix, interface version, environment variable,
the functions' ctypes signatures); a :class:`NativePart` gives a part's
module its ``mode``, ``library``, ``handle`` and ``status``. A library is
built and loaded as follows:

* when: on the first use in a process that finds no built library (never at
  import); in mode ``auto`` the build runs on a worker thread and the caller
  meanwhile takes the NumPy path (no caller waits for the compiler, which runs
  once per machine and source), in mode ``c`` the caller waits;
* where: ``native/`` in the package cache folder
  (:func:`scipy_gpuqr._cachedir.cache_dir`), file ``{prefix}{key}.so``, the key
  a hash of the source, the interface version, the platform and the compiler
  command; compiled into a temporary file of that folder, loaded from there,
  and moved into place (``os.replace``), so processes building at once never
  load a partial file; at most :data:`MAX_BUILDS` builds of a prefix are kept;
* check: beside each library a manifest ``{prefix}{key}.so.sha256``
  (:data:`MANIFEST_SUFFIX`: size and SHA-256 of the complete library, also
  published by ``os.replace``, before the library). A library is loaded only
  when its size and checksum match its manifest (cheap: the libraries are
  small): ``dlopen`` maps the file, so a truncated one kills the process with
  SIGBUS and one with overwritten bytes with an illegal instruction or a loader
  error, which no ``try`` can catch. A missing manifest or a mismatch deletes
  both files and builds again (no compiler or a failed build: the NumPy path);
* how: ``$CC`` (split like a shell command) or the first of ``cc``, ``gcc``,
  ``clang`` found, with ``-O2 -shared -fPIC``; loaded with ``ctypes`` (cffi's
  ABI mode would parse declarations first) and checked by the library's own
  interface-version function, refused (and built again) when it differs.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from ._cachedir import cache_dir
from ._errors import NativeUnavailable

__all__ = ["MODES", "FLAGS", "MANIFEST_SUFFIX", "MAX_BUILDS", "NativeLibrary", "Loader",
           "NativePart", "choose", "compiler", "manifest_path", "manifest_text", "read_manifest",
           "checksum", "intact", "discard", "prune"]

#: The paths an environment variable may ask for: compiled when it can be had
#: (else NumPy), compiled or :class:`NativeUnavailable`, NumPy only.
MODES = ("auto", "c", "numpy")
#: Compiler flags after the compiler command (before ``-o``).
FLAGS = ("-O2", "-shared", "-fPIC")
#: Suffix added to a library's file name to name its manifest (size and SHA-256).
MANIFEST_SUFFIX = ".sha256"
#: Most built libraries kept per prefix (other sources or compilers: other
#: package versions).
MAX_BUILDS = 8


@dataclass(frozen=True)
class NativeLibrary:
    """What one compiled library of the package is.

    Attributes
    ----------
    source : Path
        The C file.
    prefix : str
        Start of the built files' names in ``native/`` (``native-``,
        ``symbolic-``); the folder is shared, so prefixes must differ.
    abi : int
        Interface version the Python side expects; part of the build key.
    abi_function : str
        The library's function returning its interface version (``int f(void)``).
    env : str
        Environment variable choosing the path (one of :data:`MODES`).
    declare : callable
        ``declare(lib)`` sets the ``argtypes`` and ``restype`` of the library's
        other functions (called once the interface version matched).
    extra_flags : tuple of str
        Compiler flags this library needs besides :data:`FLAGS` (e.g. no
        contraction into fused multiply-adds); part of the build key.
    """

    source: Path
    prefix: str
    abi: int
    abi_function: str
    env: str
    declare: Callable[[ctypes.CDLL], None]
    extra_flags: tuple = ()

    @classmethod
    def beside(cls, module_file: str, prefix: str, abi: int, abi_function: str, env: str,
               declare: Callable[[ctypes.CDLL], None],
               extra_flags: tuple = ()) -> "NativeLibrary":
        """The library whose source is ``_native.c`` in the folder of the module
        file ``module_file`` (each part keeps its C file beside its Python)."""
        return cls(Path(module_file).resolve().with_name("_native.c"), prefix, abi,
                   abi_function, env, declare, tuple(extra_flags))

    def mode(self, environ: Mapping[str, str] = os.environ) -> str:
        """The path asked for by :attr:`env` (``auto`` when unset).

        Raises
        ------
        ValueError
            The variable names no mode of :data:`MODES`.
        """
        v = environ.get(self.env, "").strip().lower() or "auto"
        if v not in MODES:
            raise ValueError(f"{self.env} must be one of {', '.join(MODES)}, got {v!r}")
        return v

    def key(self, cmd: list, source: bytes) -> str:
        """The build key: a hash of ``source``, :attr:`abi`, the platform and the
        compiler command ``cmd`` with :attr:`extra_flags` and :data:`FLAGS`."""
        h = hashlib.sha1()
        flags = list(self.extra_flags) + list(FLAGS)
        for part in (source, str(self.abi).encode(), sys.platform.encode(),
                     platform.machine().encode(), "\0".join(cmd + flags).encode()):
            h.update(part + b"\0")
        return h.hexdigest()[:16]

    def where(self, environ: Mapping[str, str]) -> tuple[Path, list]:
        """``(library path, compiler command)`` for this machine and source (the
        command with :attr:`extra_flags`; :data:`FLAGS` are added at the build).

        Raises
        ------
        _Fail
            No compiler, no cache folder, or the source cannot be read.
        """
        cmd = compiler(environ)
        if cmd is None:
            raise _Fail("no C compiler (cc, gcc, clang; or $CC)")
        base = cache_dir(environ)
        if base is None:
            raise _Fail("no cache folder")
        try:
            source = self.source.read_bytes()
        except OSError as exc:
            raise _Fail(f"cannot read {self.source.name}: {exc}") from None
        return (base / "native" / f"{self.prefix}{self.key(cmd, source)}.so",
                cmd + list(self.extra_flags))

    def open(self, path: Path) -> ctypes.CDLL:
        """The library at ``path`` with its functions typed.

        Raises
        ------
        OSError
            It cannot be loaded, or its interface version is not :attr:`abi`.
        """
        lib = ctypes.CDLL(str(path))
        abi = getattr(lib, self.abi_function)
        abi.argtypes, abi.restype = [], ctypes.c_int
        got = abi()
        if got != self.abi:
            raise OSError(f"ABI {got}, expected {self.abi}")
        self.declare(lib)
        return lib


class _Fail(Exception):
    """The library cannot be had on this machine (the reason is the message)."""


class Loader:
    """One process' copy of a :class:`NativeLibrary`: found on disk, or built
    once (thread-safe).

    Attributes
    ----------
    spec : NativeLibrary
        The library.
    build_s : float or None
        Seconds the build took in this process; None where none ran.
    """

    def __init__(self, spec: NativeLibrary):
        self.spec = spec
        self._lock = threading.Lock()
        self._lib = None
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self.build_s: float | None = None

    def status(self) -> str:
        """``loaded``, ``building``, ``not loaded`` or ``unavailable: why``."""
        if self._lib is not None:
            return "loaded"
        if self._error is not None:
            return f"unavailable: {self._error}"
        return "building" if self._thread is not None else "not loaded"

    def get(self, wait: bool, environ: Mapping[str, str] = os.environ):
        """The library (``ctypes.CDLL``); None when it cannot be had, or (``wait``
        False) while it is being built.

        A library on disk is loaded only when :func:`intact` (its manifest's
        size and SHA-256); otherwise it and its manifest are deleted and built
        again, on a worker thread that this call joins when ``wait``.
        """
        with self._lock:
            if self._pid != os.getpid():          # a forked child: no build thread here
                self._pid, self._thread = os.getpid(), None
            if self._lib is not None or self._error is not None:
                return self._lib
            th = self._thread
            if th is None:
                try:
                    path, cmd = self.spec.where(environ)
                except _Fail as exc:
                    self._error = str(exc)
                    return None
                if path.is_file() or manifest_path(path).is_file():
                    if intact(path):               # never dlopen a damaged file
                        try:
                            self._lib = self.spec.open(path)
                            return self._lib
                        except Exception:          # noqa: BLE001 - built again below
                            pass
                    discard(path)
                th = threading.Thread(target=self._build, args=(path, cmd),
                                      name=f"scipy_gpuqr-{self.spec.prefix}build")
                self._thread = th
                th.start()
        if not wait:
            return None
        th.join()
        return self._lib

    def _build(self, path: Path, cmd: list) -> None:
        """Compile into a temporary file beside ``path``, load that file, then
        publish its manifest and it (``os.replace`` each, the manifest first);
        the outcome (library or error) is set under the lock.

        Loading the temporary file, not ``path``, maps exactly the bytes the
        manifest describes, whatever another process publishes meanwhile; a
        library that does not load is never published.
        """
        t0 = time.perf_counter()
        err = lib = None
        tmp = tmp_m = None
        prefix = f".{self.spec.prefix}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".so", dir=path.parent)
            os.close(fd)
            r = subprocess.run(cmd + list(FLAGS) + ["-o", tmp, str(self.spec.source)],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
            if r.returncode != 0:
                msg = (r.stderr or r.stdout).decode(errors="replace").strip()
                err = f"compiler failed ({r.returncode}): {msg[-300:]}"
            else:
                size, digest = checksum(Path(tmp), sync=True)
                lib = self.spec.open(Path(tmp))
                fd, tmp_m = tempfile.mkstemp(prefix=prefix, suffix=MANIFEST_SUFFIX,
                                             dir=path.parent)
                with os.fdopen(fd, "w") as f:
                    f.write(manifest_text(size, digest))
                    f.flush()
                    os.fsync(f.fileno())
                # readable by whoever may read the library (mkstemp makes 0600)
                os.chmod(tmp_m, os.stat(tmp).st_mode & 0o666)
                os.replace(tmp_m, manifest_path(path))
                tmp_m = None
                os.replace(tmp, path)
                tmp = None
                prune(path.parent, keep=path, prefix=self.spec.prefix)
        except Exception as exc:                  # noqa: BLE001 - NumPy path instead
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
            self.build_s = time.perf_counter() - t0
            self._thread = None


class NativePart:
    """One part's compiled library as its module hands it out: the module binds
    :meth:`mode`, :meth:`library`, :meth:`handle` and :meth:`status` as its
    functions of those names (``mode = _NATIVE.mode``, ...), so the parts do
    not each repeat them.

    Each call reads :attr:`loader` then, so that a test puts its own loader
    (a :class:`Loader`, or anything with its ``get`` and ``status``) in place
    with ``monkeypatch.setattr(module._NATIVE, "loader", ...)``.

    Parameters
    ----------
    spec : NativeLibrary
        The library.
    what : str
        What the library does, for :class:`NativeUnavailable`'s message
        (``"compiled schedule loops"``).

    Attributes
    ----------
    spec : NativeLibrary
    what : str
    loader : Loader
        This process' copy of the library, made here (nothing is built or
        loaded until the first :meth:`library` or :meth:`handle`).
    """

    def __init__(self, spec: NativeLibrary, what: str):
        self.spec = spec
        self.what = what
        self.loader = Loader(spec)

    def mode(self, environ: Mapping[str, str] = os.environ) -> str:
        """The path asked for by the library's environment variable (``auto``
        when unset).

        Raises
        ------
        ValueError
            The variable names no mode of :data:`MODES`.
        """
        return self.spec.mode(environ)

    def library(self, wait: bool = True, environ: Mapping[str, str] = os.environ):
        """The compiled library (a ``ctypes.CDLL``), built if need be, whatever the
        mode; None when it cannot be had (or, ``wait`` False, while it is being
        built)."""
        return self.loader.get(wait, environ)

    def handle(self, environ: Mapping[str, str] = os.environ):
        """The library for the call at hand, as the environment variable asks
        (:func:`choose`): None in mode ``numpy``, or in mode ``auto`` while it
        is being built (the build started here if need be) or when it cannot
        be had; mode ``c`` waits for it.

        Raises
        ------
        NativeUnavailable
            Mode ``c`` and no library.
        """
        return choose(self.loader, self.mode(environ), self.what, environ)

    def status(self) -> str:
        """``loaded``, ``building``, ``not loaded`` or ``unavailable: why``."""
        return self.loader.status()


def choose(loader, mode: str, what: str, environ: Mapping[str, str] = os.environ):
    """The library for the call at hand in ``mode`` (:data:`MODES`): None in mode
    ``numpy``, or in mode ``auto`` while it is being built (the build started
    here if need be) or when it cannot be had; mode ``c`` waits for it.

    ``loader`` is a :class:`Loader` or anything with its ``get`` and ``status``.

    Raises
    ------
    NativeUnavailable
        Mode ``c`` and no library (the message starts with ``what``).
    """
    if mode == "numpy":
        return None
    lib = loader.get(mode == "c", environ)
    if lib is None and mode == "c":
        raise NativeUnavailable(f"{what}: {loader.status()}")
    return lib


def compiler(environ: Mapping[str, str]) -> list | None:
    """The C compiler command: ``$CC`` split like a shell command, else the first
    of ``cc``, ``gcc``, ``clang`` on the path; None when there is none."""
    cc = environ.get("CC", "").strip()
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def prune(folder: Path, keep: Path, prefix: str) -> None:
    """Delete the oldest builds of ``prefix`` past :data:`MAX_BUILDS` with their
    manifests, and, over an hour old, temporary files of builds that died and
    manifests without a library (younger ones may be a build between its two
    renames); best effort: a library in use stays mapped where it is open."""
    try:
        builds = sorted(folder.glob(f"{prefix}*.so"), key=lambda p: p.stat().st_mtime)
        for p in [p for p in builds if p != keep][:max(len(builds) - MAX_BUILDS, 0)]:
            discard(p)
        old = time.time() - 3600
        for m in folder.glob(f"{prefix}*.so{MANIFEST_SUFFIX}"):
            if not m.with_name(m.name[:-len(MANIFEST_SUFFIX)]).exists() and \
                    m.stat().st_mtime < old:
                m.unlink()
        for p in folder.glob(f".{prefix}*"):
            if p.stat().st_mtime < old:
                p.unlink()
    except OSError:
        pass


def manifest_path(path: Path) -> Path:
    """The manifest beside the library ``path`` (``path`` + :data:`MANIFEST_SUFFIX`)."""
    return path.with_name(path.name + MANIFEST_SUFFIX)


def manifest_text(size: int, digest: str) -> str:
    """A manifest's text: the library's size in bytes and its SHA-256 (hex)."""
    return f"size {size}\nsha256 {digest}\n"


def read_manifest(path: Path) -> tuple[int, str] | None:
    """``(size, sha256 hex)`` of the manifest of the library ``path``; None when
    it is missing, unreadable or malformed."""
    try:
        text = manifest_path(path).read_text(encoding="ascii")
        fields = dict(line.split(" ", 1) for line in text.splitlines())
        size, digest = int(fields["size"]), fields["sha256"]
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None
    if size < 0 or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return None
    return size, digest


def checksum(path: Path, sync: bool = False) -> tuple[int, str]:
    """``(size, sha256 hex)`` of the file ``path``, read through one descriptor;
    ``sync`` also flushes it to disk first (a build, before it is published).

    Raises
    ------
    OSError
        The file cannot be opened or read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        size = 0
        while chunk := f.read(1 << 16):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def intact(path: Path) -> bool:
    """Whether the library ``path`` has the size, then the SHA-256, that its
    manifest records (False when either file is missing or unreadable)."""
    want = read_manifest(path)
    if want is None:
        return False
    try:
        if path.stat().st_size != want[0]:
            return False
        return checksum(path) == want
    except OSError:
        return False


def discard(path: Path) -> None:
    """Delete the library ``path`` and its manifest (best effort: one gone
    already, or another process' rebuild racing, is no error)."""
    for p in (path, manifest_path(path)):
        try:
            p.unlink()
        except OSError:
            pass
