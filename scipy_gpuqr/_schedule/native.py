"""The schedule plan's loops in compiled code (``_native.c``), built on first use.

The plan of a new matrix structure spends most of its NumPy time in call
overhead, not arithmetic: the bucket simulation (:func:`.bucket._simulate_numpy`,
lock step over all patterns, dozens of array calls per launch), the row-tile
buckets, the element-unit rows, the assembly records and the records of each
chunk of launches. ``_native.c`` does the same work in plain loops (the
simulation pattern by pattern) and writes the same bytes (tests compare every
path with the NumPy one):

* ``sgq_simulate`` / ``sgq_fetch``: :func:`.bucket._simulate` (rows of every
  pattern, column by column);
* ``sgq_tile_buckets``: :func:`.bucket.many_tile_buckets`;
* ``sgq_element_rows``: :func:`.bucket.element_rows_of`;
* ``sgq_assembly``: ``sparse._assembly_tasks``, sorted by launch;
* ``sgq_fill``: the factorization records of ``sparse._StageMaker.records``;
* ``sgq_arith_runs32`` / ``sgq_arith_runs64``: arithmetic runs end to end
  (:func:`arith_runs`, R's layout in :mod:`scipy_gpuqr._engine.gpu.rlayout`);
* ``sgq_scatter``: ``out[pos] = values`` on several threads (:func:`scatter`,
  R's values of a staged GPU factorization);
* ``sgq_pack``: a host stage's Pack-Assemble records on several threads
  (:func:`pack`, ``simulate._pack``'s copies).

It is plain C99 without Python headers, so any system C compiler builds it
(a wheel stays pure Python; where none exists the NumPy code runs):

* when: on the first use in a process that finds no built library (never at
  import); in mode ``auto`` the build runs on a worker thread and the plan
  meanwhile takes the NumPy path (no plan waits for the compiler, which runs
  once per machine and source), in mode ``c`` the caller waits;
* where: ``native/`` in the package cache folder
  (:func:`scipy_gpuqr._cachedir.cache_dir`), file ``native-{key}.so``, the
  key a hash of the source, :data:`ABI`, the platform and the compiler
  command; compiled into a temporary file of that folder, loaded from there,
  and moved into place (``os.replace``), so processes building at once never
  load a partial file; at most :data:`MAX_BUILDS` builds are kept;
* check: beside each library a manifest ``native-{key}.so.sha256``
  (:data:`MANIFEST_SUFFIX`: size and SHA-256 of the complete library, also
  published by ``os.replace``, before the library). A library is loaded only
  when its size and checksum match its manifest (cheap: the library is
  small): ``dlopen`` maps the file, so a truncated one kills the process with SIGBUS
  and one with overwritten bytes with an illegal instruction or a loader
  error, which no ``try`` can catch. A missing manifest or a mismatch deletes
  both files and builds again (no compiler or a failed build: the NumPy
  path);
* how: ``$CC`` (split like a shell command) or the first of ``cc``, ``gcc``,
  ``clang`` found, with ``-O2 -shared -fPIC``; loaded with ``ctypes`` (cffi's
  ABI mode would parse declarations first, on the path to launch 0) and
  checked by the library's ``sgq_abi()``; the calls release the GIL.

``$SCIPY_GPUQR_SCHEDULE_SIM`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it can be had, else NumPy), ``c`` (compiled or
:class:`NativeUnavailable`), ``numpy``. No compiler, no cache folder, a failed
build or load: the NumPy path (``auto``), decided once per process.
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
from pathlib import Path
from typing import Mapping

import numpy as np

from .._cachedir import cache_dir
from .._errors import NativeUnavailable
from .tasks import MAX_SLOTS

__all__ = ["ENV", "ABI", "MODES", "MAX_BUILDS", "MANIFEST_SUFFIX", "NativeUnavailable", "mode",
           "library", "handle", "status", "simulate", "tile_buckets", "element_rows", "assembly",
           "fill", "arith_runs", "RUNS_PER_THREAD", "scatter", "pack", "thread_count",
           "run_ranges", "run_split"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_SCHEDULE_SIM"
MODES = ("auto", "c", "numpy")
#: Interface version of ``_native.c`` (``sgq_abi()``).
ABI = 8
#: Row columns the library writes, in its order (then ``rows``).
COLS = ("type", "col", "c0", "c1", "napply", "nfrows", "fstart", "flags", "ftop", "vt",
        "vt2", "mult")
_SOURCE = Path(__file__).resolve().with_name("_native.c")
_FLAGS = ("-O2", "-shared", "-fPIC")
_NOMEM, _FINAL, _INPUT = 1, 2, 3
#: Suffix added to a library's file name to name its manifest (size and SHA-256).
MANIFEST_SUFFIX = ".sha256"


def mode(environ: Mapping[str, str] = os.environ) -> str:
    """The simulation path asked for by :data:`ENV` (``auto`` when unset)."""
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


class _Loader:
    """The process' library: found on disk, or built once (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lib = None
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self.build_s: float | None = None        # seconds the build took here, if it ran

    def status(self) -> str:
        if self._lib is not None:
            return "loaded"
        if self._error is not None:
            return f"unavailable: {self._error}"
        return "building" if self._thread is not None else "not loaded"

    def get(self, wait: bool, environ: Mapping[str, str] = os.environ):
        """The library (``ctypes.CDLL``); None when it cannot be had, or (``wait``
        False) while it is being built.

        A library on disk is loaded only when :func:`_intact` (its manifest's
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
                    path, cmd = self._where(environ)
                except _Fail as exc:
                    self._error = str(exc)
                    return None
                if path.is_file() or _manifest_path(path).is_file():
                    if _intact(path):              # never dlopen a damaged file
                        self._load(path)
                        if self._lib is not None:
                            return self._lib
                    self._error = None             # damaged or unloadable: build again
                    _discard(path)
                th = threading.Thread(target=self._build, args=(path, cmd),
                                      name="scipy_gpuqr-native-build")
                self._thread = th
                th.start()
        if not wait:
            return None
        th.join()
        return self._lib

    def _where(self, environ):
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
        return base / "native" / f"native-{_key(cmd, source)}.so", cmd

    def _load(self, path: Path) -> None:
        """Open ``path`` (under the lock); on failure remember why."""
        try:
            lib = _open(path)
        except Exception as exc:                   # noqa: BLE001 - NumPy path instead
            self._error = f"cannot load {path}: {exc}"
            return
        self._lib = lib

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
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".native-", suffix=".so", dir=path.parent)
            os.close(fd)
            r = subprocess.run(cmd + list(_FLAGS) + ["-o", tmp, str(_SOURCE)],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
            if r.returncode != 0:
                msg = (r.stderr or r.stdout).decode(errors="replace").strip()
                err = f"compiler failed ({r.returncode}): {msg[-300:]}"
            else:
                size, digest = _checksum(Path(tmp), sync=True)
                lib = _open(Path(tmp))
                fd, tmp_m = tempfile.mkstemp(prefix=".native-", suffix=MANIFEST_SUFFIX,
                                             dir=path.parent)
                with os.fdopen(fd, "w") as f:
                    f.write(_manifest_text(size, digest))
                    f.flush()
                    os.fsync(f.fileno())
                # readable by whoever may read the library (mkstemp makes 0600)
                os.chmod(tmp_m, os.stat(tmp).st_mode & 0o666)
                os.replace(tmp_m, _manifest_path(path))
                tmp_m = None
                os.replace(tmp, path)
                tmp = None
                _prune(path.parent, keep=path)
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


class _Fail(Exception):
    pass


#: Most built libraries kept (other sources or compilers: other package versions).
MAX_BUILDS = 8


def _prune(folder: Path, keep: Path) -> None:
    """Delete the oldest builds past :data:`MAX_BUILDS` with their manifests,
    and, over an hour old, temporary files of builds that died and manifests
    without a library (younger ones may be a build between its two renames);
    best effort: a library in use stays mapped where it is open."""
    try:
        builds = sorted(folder.glob("native-*.so"), key=lambda p: p.stat().st_mtime)
        for p in [p for p in builds if p != keep][:max(len(builds) - MAX_BUILDS, 0)]:
            _discard(p)
        old = time.time() - 3600
        for m in folder.glob("native-*.so" + MANIFEST_SUFFIX):
            if not m.with_name(m.name[:-len(MANIFEST_SUFFIX)]).exists() and \
                    m.stat().st_mtime < old:
                m.unlink()
        for p in folder.glob(".native-*"):
            if p.stat().st_mtime < old:
                p.unlink()
    except OSError:
        pass


def _manifest_path(path: Path) -> Path:
    """The manifest beside the library ``path`` (``path`` + :data:`MANIFEST_SUFFIX`)."""
    return path.with_name(path.name + MANIFEST_SUFFIX)


def _manifest_text(size: int, digest: str) -> str:
    """A manifest's text: the library's size in bytes and its SHA-256 (hex)."""
    return f"size {size}\nsha256 {digest}\n"


def _read_manifest(path: Path) -> tuple[int, str] | None:
    """``(size, sha256 hex)`` of the manifest of the library ``path``; None when
    it is missing, unreadable or malformed."""
    try:
        text = _manifest_path(path).read_text(encoding="ascii")
        fields = dict(line.split(" ", 1) for line in text.splitlines())
        size, digest = int(fields["size"]), fields["sha256"]
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None
    if size < 0 or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return None
    return size, digest


def _checksum(path: Path, sync: bool = False) -> tuple[int, str]:
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


def _intact(path: Path) -> bool:
    """Whether the library ``path`` has the size, then the SHA-256, that its
    manifest records (False when either file is missing or unreadable)."""
    want = _read_manifest(path)
    if want is None:
        return False
    try:
        if path.stat().st_size != want[0]:
            return False
        return _checksum(path) == want
    except OSError:
        return False


def _discard(path: Path) -> None:
    """Delete the library ``path`` and its manifest (best effort: one gone
    already, or another process' rebuild racing, is no error)."""
    for p in (path, _manifest_path(path)):
        try:
            p.unlink()
        except OSError:
            pass


def _open(path: Path):
    """The library at ``path`` with its functions typed (ctypes: no declarations
    to parse, unlike cffi's ``cdef``)."""
    lib = ctypes.CDLL(str(path))
    i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
    lib.sgq_abi.argtypes, lib.sgq_abi.restype = [], ctypes.c_int
    lib.sgq_simulate.argtypes = [i64, ptr, ptr, ptr, ptr, i32, i32, i32, ptr]
    lib.sgq_simulate.restype = ptr
    lib.sgq_fetch.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64]
    lib.sgq_fetch.restype = None
    lib.sgq_free.argtypes, lib.sgq_free.restype = [ptr], None
    lib.sgq_element_rows.argtypes = [i64, ptr, ptr, i32, ptr]
    lib.sgq_element_rows.restype = None
    lib.sgq_fill.argtypes = [i64] + [ptr] * 11 + [i32, i32, ptr, i64]
    lib.sgq_fill.restype = ctypes.c_int
    lib.sgq_tile_buckets.argtypes = [i64] + [ptr] * 5 + [i32, ptr, i64]
    lib.sgq_tile_buckets.restype = ctypes.c_int
    lib.sgq_assembly.argtypes = [i64, i64, i64] + [ptr] * 8 + [i64] + [ptr] * 6 + \
        [i64, i64, i64, ptr, ptr, ptr]
    lib.sgq_assembly.restype = i64
    for name in ("sgq_arith_runs32", "sgq_arith_runs64"):
        getattr(lib, name).argtypes = [i64, i64] + [ptr] * 5
        getattr(lib, name).restype = None
    lib.sgq_scatter.argtypes = [i64, i64, ptr, ptr, ptr, i32]
    lib.sgq_scatter.restype = None
    lib.sgq_pack.argtypes = [i64, i64] + [ptr] * 12 + [ptr, i32]
    lib.sgq_pack.restype = None
    got = lib.sgq_abi()
    if got != ABI:
        raise OSError(f"ABI {got}, expected {ABI}")
    return lib


_LOADER = _Loader()


def library(wait: bool = True, environ: Mapping[str, str] = os.environ):
    """The compiled simulation (a ``ctypes.CDLL``), built if need be; None when it
    cannot be had (or, ``wait`` False, while it is being built)."""
    return _LOADER.get(wait, environ)


def handle(environ: Mapping[str, str] = os.environ):
    """The library for the call at hand, as :data:`ENV` asks: None in mode
    ``numpy``, or in mode ``auto`` while it is being built (the build started
    here if need be) or when it cannot be had; mode ``c`` waits for it.

    Raises
    ------
    NativeUnavailable
        Mode ``c`` and no library.
    """
    m = mode(environ)
    if m == "numpy":
        return None
    lib = _LOADER.get(m == "c", environ)
    if lib is None and m == "c":
        raise NativeUnavailable(f"compiled schedule loops: {status()}")
    return lib


def status() -> str:
    """``loaded``, ``building``, ``not loaded`` or ``unavailable: why``."""
    return _LOADER.status()


def simulate(handle, patterns, bundle: int, pipelining: bool, granule: int):
    """Run the compiled simulation on ``patterns`` (``(buckets, nct, nfct)``).

    Returns
    -------
    tuple or None
        ``(cols, rows, rp, lp, info)``: ``cols`` (len(COLS), nrow) int32,
        ``rows`` (nrow, MAX_SLOTS) int32, every pattern's row and record
        pointers end to end (int64), ``info`` (P, 4) int64 = launches, VT
        tiles, first and past-the-last row; None when the library rejects the
        patterns (the NumPy path then decides).

    Raises
    ------
    AssertionError
        A bucket did not end with its upper triangular diagonal tile.
    """
    lib = handle
    P = len(patterns)
    b = (np.ascontiguousarray(np.concatenate([np.asarray(p[0]) for p in patterns]),
                              dtype=np.int32) if P else np.zeros(0, np.int32))
    nrt = np.array([len(p[0]) for p in patterns], dtype=np.int64)
    nct = np.array([p[1] for p in patterns], dtype=np.int64)
    nfct = np.array([p[2] for p in patterns], dtype=np.int64)
    sizes = np.zeros(3, dtype=np.int64)
    h = lib.sgq_simulate(P, b.ctypes.data, nrt.ctypes.data, nct.ctypes.data,
                         nfct.ctypes.data, int(bundle), int(bool(pipelining)), int(granule),
                         sizes.ctypes.data)
    if not h:
        code = int(sizes[2])
        if code == _NOMEM:
            raise MemoryError("bucket simulation: out of memory")
        if code == _FINAL:
            raise AssertionError("bucket scheduler: a bucket did not end with its "
                                 "upper triangular diagonal tile")
        return None
    nrow, nptr = int(sizes[0]), int(sizes[1])
    cols = np.empty((len(COLS), nrow), dtype=np.int32)
    rows = np.empty((nrow, MAX_SLOTS), dtype=np.int32)
    rp = np.empty(nptr, dtype=np.int64)
    lp = np.empty(nptr, dtype=np.int64)
    info = np.empty((P, 4), dtype=np.int64)
    lib.sgq_fetch(h, cols.ctypes.data, rows.ctypes.data, rp.ctypes.data, lp.ctypes.data,
                  info.ctypes.data, P)
    return cols, rows, rp, lp, info


def element_rows(lib, rc: dict, tile: int) -> np.ndarray:
    """:func:`.bucket.element_rows_of` compiled: rows given column by column as
    element-unit records, ``(n, 12)`` int64 words."""
    n = len(rc["type"])
    cols = [np.ascontiguousarray(rc[k], dtype=np.int32) for k in COLS[:11]]
    slots = np.ascontiguousarray(rc["rows"], dtype=np.int32)
    if slots.shape != (n, MAX_SLOTS):
        raise ValueError(f"rows has shape {slots.shape}")
    ptrs = np.array([c.ctypes.data for c in cols], dtype=np.int64)
    out = np.empty((n, 12), dtype=np.int64)
    lib.sgq_element_rows(n, ptrs.ctypes.data, slots.ctypes.data, int(tile), out.ctypes.data)
    return out


def fill(lib, out: np.ndarray, rstart, rlen, front, dst, tmpl: np.ndarray, mult,
         foff, vt_base, fm, fn, nfact, tile: int, granule: int) -> None:
    """Factorization records of blocks (template rows ``[rstart, rstart + rlen)``,
    each ``mult`` times, for ``front``) into ``out`` (``(m, 12)`` int64 words,
    C-contiguous) from row ``dst`` of each block on (``sparse._Templates.fill``)."""
    if out.dtype != np.int64 or out.ndim != 2 or out.shape[1] != 12 or \
            not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous (m, 12) int64")
    i64 = [np.ascontiguousarray(a, dtype=np.int64)
           for a in (rstart, rlen, front, dst, foff, vt_base)]
    tmpl = np.ascontiguousarray(tmpl, dtype=np.int64)
    i32 = [np.ascontiguousarray(a, dtype=np.int32) for a in (mult, fm, fn, nfact)]
    rc = lib.sgq_fill(len(i64[0]), *(a.ctypes.data for a in i64[:4]), tmpl.ctypes.data,
                      i32[0].ctypes.data, i64[4].ctypes.data, i64[5].ctypes.data,
                      *(a.ctypes.data for a in i32[1:]), int(tile), int(granule),
                      out.ctypes.data, len(out))
    if rc != 0:
        raise ValueError("fill: the blocks' records do not fit in out")


def tile_buckets(lib, fm, fn, nfact, stair, stair_ptr, tile: int, ntiles: int):
    """:func:`.bucket.many_tile_buckets`' buckets compiled (int32, ``ntiles``);
    None when a staircase decreases (the NumPy path then decides)."""
    a = [np.ascontiguousarray(x, dtype=np.int64) for x in (fm, fn, nfact)]
    st = None if stair is None else np.ascontiguousarray(stair, dtype=np.int64)
    sp = np.ascontiguousarray(stair_ptr if stair is not None else np.zeros(len(a[0]) + 1),
                              dtype=np.int64)
    out = np.empty(ntiles, dtype=np.int32)
    rc = lib.sgq_tile_buckets(len(a[0]), *(x.ctypes.data for x in a),
                              None if st is None else st.ctypes.data, sp.ctypes.data,
                              int(tile), out.ctypes.data, int(ntiles))
    return out if rc == 0 else None


def assembly(lib, fs, first: int, last: int, sid: int, stage_of, foff, carried: dict,
             asm_a, pack_a, s_chunk: int, pack_chunk: int, nlaunch: int):
    """``sparse._assembly_tasks`` compiled and sorted by launch (stable): the
    records as ``(n, 12)`` int64 words and their launches; None when a launch
    falls outside ``[0, nlaunch)`` (the NumPy path then decides)."""
    def i64(x):
        return np.ascontiguousarray(x, dtype=np.int64)

    nf = fs.nfronts
    car = np.full(nf, -1, dtype=np.int64)
    if carried:
        car[np.fromiter(carried.keys(), np.int64)] = np.fromiter(carried.values(), np.int64)
    a = [i64(x) for x in (fs.s_ptr, fs.child_ptr, fs.children, fs.cm, fs.fn, fs.fp,
                          fs.frank, fs.rimap_ptr)]
    b = [i64(x) for x in (fs.rjmap_ptr, stage_of, foff, car, asm_a, pack_a)]
    at = np.empty(nlaunch + 1, dtype=np.int64)
    args = ([int(first), int(last), int(sid)] + [x.ctypes.data for x in a]
            + [int(a[7][-1])] + [x.ctypes.data for x in b]
            + [int(s_chunk), int(pack_chunk), int(nlaunch), at.ctypes.data])
    n = lib.sgq_assembly(*args, None, None)
    if n < 0:
        return None
    out = np.empty((n, 12), dtype=np.int64)
    out_L = np.empty(n, dtype=np.int64)
    lib.sgq_assembly(*args, out.ctypes.data, out_L.ctypes.data)
    return out, out_L


#: Fewest entries per thread of :func:`arith_runs` (below: one thread).
RUNS_PER_THREAD = 1 << 21


def arith_runs(lib, first, step, length, start, total: int, dtype, threads: int = 0):
    """Runs ``first[i] + step[i] * (0 .. length[i]-1)`` end to end (run ``i`` at
    ``start[i]``, the runs covering ``[0, total)`` in order) compiled, as
    ``dtype`` (int32 or int64; int32 values must fit).

    The runs are split into ``threads`` ranges of about equal entries (0: up to
    the CPU count, at least :data:`RUNS_PER_THREAD` entries each) written by
    as many threads at once (the calls release the GIL, and the first touch of
    the output's pages, most of the cost of a large output, is shared too).
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"arith_runs: int32 or int64, got {dtype}")
    a = [np.ascontiguousarray(x, dtype=np.int64) for x in (first, step, length, start)]
    n = len(a[0])
    if any(len(x) != n for x in a):
        raise ValueError("arith_runs: runs of different lengths")
    total = int(total)
    out = np.empty(total, dtype=dtype)
    if (n and (int(a[3][-1]) + int(a[2][-1]) != total or int(a[3][0]) != 0)) or \
            (not n and total):
        raise ValueError("arith_runs: the runs do not cover the output")
    fn = lib.sgq_arith_runs32 if dtype == np.int32 else lib.sgq_arith_runs64
    args = [x.ctypes.data for x in a] + [out.ctypes.data]
    if threads <= 0:
        threads = thread_count(total, RUNS_PER_THREAD)
    if threads <= 1 or n < 2:
        fn(0, n, *args)
        return out
    # equal shares of the entries: the run holding each cut starts its range
    cuts = np.searchsorted(a[3], np.linspace(0, total, threads + 1)[1:-1], side="right") - 1
    run_ranges(fn, [0] + sorted(set(int(c) for c in cuts if 0 < c < n)) + [n], *args)
    return out


def thread_count(n: int, per_thread: int, most: int = 16) -> int:
    """Threads for ``n`` items: up to the CPU count and ``most``, each with at
    least ``per_thread`` items (1 at least)."""
    return min(os.cpu_count() or 1, most, max(1, n // per_thread))


def run_ranges(fn, bounds, *args) -> None:
    """``fn(i0, i1, *args)`` for each range ``[i0, i1)`` between consecutive
    ``bounds``, one thread per range (``fn`` releases the GIL: a compiled call
    through ctypes, a NumPy copy), or in this thread when there is one range."""
    pairs = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    if len(pairs) <= 1:
        for i0, i1 in pairs:
            fn(i0, i1, *args)
        return
    workers = [threading.Thread(target=fn, args=(i0, i1, *args), daemon=True)
               for i0, i1 in pairs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def run_split(fn, start: int, stop: int, per_thread: int, *args) -> None:
    """``fn(i0, i1, *args)`` over ``[start, stop)`` cut into equal ranges, one
    thread each (:func:`thread_count` threads of at least ``per_thread`` items;
    :func:`run_ranges`)."""
    threads = thread_count(int(stop) - int(start), per_thread)
    run_ranges(fn, np.linspace(start, stop, threads + 1).astype(np.int64), *args)


def scatter(lib, out: np.ndarray, pos: np.ndarray, values: np.ndarray,
            threads: int = 0) -> None:
    """``out[pos] = values`` compiled, split over threads (the calls release the
    GIL; positions must be distinct and in range, as R's layout makes them).

    ``out`` and ``values`` share a 4- or 8-byte dtype; ``pos`` is int64.
    """
    if out.dtype != values.dtype or out.dtype.itemsize not in (4, 8):
        raise ValueError(f"scatter: {out.dtype} into {values.dtype}")
    if not (out.flags.c_contiguous and values.flags.c_contiguous):
        raise ValueError("scatter: contiguous arrays only")
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if len(pos) != len(values):
        raise ValueError("scatter: positions and values of different lengths")
    args = (pos.ctypes.data, values.ctypes.data, out.ctypes.data, out.dtype.itemsize)
    n = len(pos)
    if threads <= 0:
        threads = thread_count(n, RUNS_PER_THREAD)
    run_ranges(lib.sgq_scatter, np.linspace(0, n, threads + 1).astype(np.int64), *args)


#: Pack-Assemble record fields :func:`pack` passes, in ``sgq_pack``'s order:
#: parent offset, parent row length, block offset, block row length, row map and
#: column map bases (``simulate._pack``'s reading of the record).
_PACK_FIELDS = ("F", "fn", "vt", "col", "vt2", "aux")


def pack(lib, pool: np.ndarray, maps: np.ndarray, records: np.ndarray) -> None:
    """A launch's Pack-Assemble ``records`` (TASK_DTYPE) run compiled on ``pool``,
    the records split over threads by their size (writes of one launch are
    disjoint, as on the device); the same copies as ``simulate._pack``.
    """
    if pool.dtype.itemsize not in (4, 8) or not pool.flags.c_contiguous:
        raise ValueError(f"pack: a contiguous pool of 4- or 8-byte items, got {pool.dtype}")
    n = len(records)
    if n == 0:
        return
    cols = [np.ascontiguousarray(records[f], dtype=np.int64) for f in _PACK_FIELDS]
    rows = np.asarray(records["rows"], dtype=np.int64)
    r0, r1 = np.ascontiguousarray(rows[:, 0]), np.ascontiguousarray(rows[:, 1])
    c0 = np.ascontiguousarray(records["c0"], dtype=np.int64)
    c1 = np.ascontiguousarray(records["c1"], dtype=np.int64)
    tri = np.ascontiguousarray(records["nfrows"] == 1, dtype=np.int64)
    maps = np.ascontiguousarray(maps, dtype=np.int64)
    arrays = cols + [r0, r1, c0, c1, tri, maps]
    size = (r1 - r0).clip(min=0) * (c1 - c0).clip(min=0)
    threads = thread_count(int(size.sum()), 1 << 20)
    cum = np.cumsum(size)
    bounds = np.searchsorted(cum, np.linspace(0, cum[-1], threads + 1)[1:-1], side="right")
    bounds = np.unique(np.concatenate(([0], bounds, [n]))).astype(np.int64)
    run_ranges(lib.sgq_pack, bounds, *[a.ctypes.data for a in arrays], pool.ctypes.data,
               pool.dtype.itemsize)
