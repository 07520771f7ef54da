"""The disk cache store's storage rules, shared by every kind of entry.

The schedule caches (:mod:`scipy_gpuqr._schedule.cache`: tile schedules and
whole plans) and the symbolic analyses
(:mod:`scipy_gpuqr._symbolic.analysis_cache`) keep their entries in one
folder with one set of rules; this module holds those rules, below both
users (it imports neither):

* folder: ``$SCIPY_GPUQR_SCHEDULE_CACHE`` when it names one (``off``, ``0``,
  ``no``, ``false``, ``none``: no disk cache at all), else ``tile_schedules``
  in the package's user cache folder (:func:`scipy_gpuqr._cachedir.cache_dir`);
  each kind of entry has its own subfolder;
* stamps: every file carries a hash of the source files that decide its
  contents (:func:`source_stamp`), so a change of them retires the old files;
* writes: a temporary file in the same folder, then ``os.replace``
  (:func:`publish`), so a reader sees a whole file or none and processes
  writing at once lose nothing; done by a worker thread (:func:`write_behind`,
  off the caller's path, its checksums and writes included; :func:`flush`
  waits for it; the interpreter's exit waits for a write under way); the
  temporary file of a writer that was killed is deleted by a later
  :func:`bound` of its folder once it is :data:`STALE_SECONDS` old;
* damage: a reader ignores a file it cannot read or whose checks fail, and
  deletes one of its own format and stamp that fails them;
* bounds: each kind keeps at most so many bytes in so many files
  (:func:`bound`: those of other stamps and then the least recently used
  deleted first; a hit marks its file used, :func:`touch`; a write stats only
  the entries this process has not seen, all of them only where the bound is
  passed).

Array files (:func:`write_arrays`, :func:`read_mapped`,
:func:`decode_arrays`): an 8-byte magic word, the header's length, a JSON
header (the caller's facts, every array's dtype, shape and offset, the
payload's size and CRC-32) and the arrays, each at a multiple of 64 bytes of
the file, so they are read back as aligned views of the mapped file, without
copies.

Everything here is best effort: an unwritable folder only means no disk
cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ._cachedir import cache_dir

__all__ = ["ENV", "STALE_SECONDS", "folder", "source_stamp", "STAMPS_FILE", "file_ids", "recorded",
           "record", "narrow", "unlink", "touch",
           "publish", "files", "bound", "write_behind", "flush", "write_arrays",
           "read_mapped", "decode_arrays", "crc32", "crc32_combine",
           "crc_piece_bytes", "Foreign", "load_fingerprinted", "save_fingerprinted"]

#: Environment variable naming the folder (or ``off``).
ENV = "SCIPY_GPUQR_SCHEDULE_CACHE"
_OFF = ("0", "off", "no", "false", "none")
_ALIGN = 64
#: A temporary file (``tmp-*.part``) this old is a killed writer's: :func:`bound` deletes it.
STALE_SECONDS = 3600


def folder(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The disk cache's folder (not created here); None when it is off."""
    v = environ.get(ENV, "").strip()
    if v.lower() in _OFF:
        return None
    if v:
        return Path(v)
    base = cache_dir(environ)
    return None if base is None else base / "tile_schedules"


_STAMPS: dict = {}
_STAMPS_LOCK = threading.Lock()

#: The record of stamps in the store's folder: per set of source files, each
#: file's (inode, modification time in ns, size) and the stamp of their contents.
STAMPS_FILE = "source_stamps.json"
#: Most sets of files the record keeps (the least recently made dropped first):
#: the stores' sets and the kernel files' (:func:`scipy_gpuqr._kernels.source_hash`).
STAMPS_MAX = 256
#: A file modified this recently is read and hashed, and its set not recorded (an
#: edit in the same clock tick as a read would keep the stamp of another text).
STAMP_RACY_SECONDS = 2

_RECORDS: dict = {}


def source_stamp(base: Path, names) -> str:
    """A hash of the source files ``names`` (paths relative to the folder ``base``),
    made once per process; empty when one cannot be read (then no disk cache
    is used).

    A new process first looks the set up in the store's record
    (:data:`STAMPS_FILE`): where every file has the inode, modification time
    and size recorded with the stamp, the stamp is taken as it is and the
    files are only stat'ed, not read (a dozen file reads a store, tens of
    milliseconds of a first call on a slow file system); otherwise they are
    read and hashed, and the set recorded (behind the caller)."""
    key = (str(base), tuple(names))
    got = _STAMPS.get(key)
    if got is None:
        where = _record_folder()
        ids = _file_ids(key)
        got = _recorded_stamp(where, key, ids)
        if got is None:
            got = _hash_sources(key)
            if got and where is not None and ids is not None:
                _record_stamp(where, key, ids, got)
        with _STAMPS_LOCK:
            _STAMPS[key] = got
    return got


def file_ids(base: Path, names) -> list | None:
    """``[inode, mtime_ns, size]`` of each file ``names`` of the folder ``base``: what
    a record of their stamp is checked against (:func:`recorded`); None where one
    cannot be stat'ed or was modified in the last :data:`STAMP_RACY_SECONDS`."""
    return _file_ids((str(base), tuple(names)))


def recorded(name: str) -> dict | None:
    """The record ``name`` (a dict) of the store folder's :data:`STAMPS_FILE`, as
    this process read it (once) and added to; None: none, or no store. Its
    user checks it against the files it stamps (:func:`file_ids`)."""
    where = _record_folder()
    if where is None:
        return None
    got = _records(where).get(name)
    return got if isinstance(got, dict) else None


def record(name: str, value: dict) -> None:
    """Keep ``value`` (JSON) as the record ``name`` of :data:`STAMPS_FILE`, written
    behind the caller (merged with other processes' records, at most
    :data:`STAMPS_MAX` kept); nothing without a store."""
    where = _record_folder()
    if where is None:
        return
    table = _records(where)
    with _STAMPS_LOCK:
        table[name] = dict(value, made=time.time())
    write_behind(_write_records, where)


def _hash_sources(key) -> str:
    h = hashlib.sha1()
    try:
        for name in key[1]:
            h.update(name.encode() + b"\0" + (Path(key[0]) / name).read_bytes())
        return h.hexdigest()[:20]
    except OSError:
        return ""


def _record_folder() -> Path | None:
    try:
        return folder()
    except Exception:                          # noqa: BLE001 - best effort: no record
        return None


def _file_ids(key) -> list | None:
    """``[inode, mtime_ns, size]`` of each file of the set; None where one cannot be
    stat'ed or was modified in the last :data:`STAMP_RACY_SECONDS`."""
    recent = time.time_ns() - STAMP_RACY_SECONDS * 10**9
    out = []
    try:
        for name in key[1]:
            st = os.stat(Path(key[0]) / name)
            if st.st_mtime_ns >= recent:
                return None
            out.append([int(st.st_ino), int(st.st_mtime_ns), int(st.st_size)])
    except OSError:
        return None
    return out


def _set_name(key) -> str:
    return json.dumps([key[0], list(key[1])])


def _records(where: Path) -> dict:
    """The record of ``where`` as this process read it (once) and added to."""
    with _STAMPS_LOCK:
        got = _RECORDS.get(str(where))
        if got is None:
            got = _read_records(where)
            _RECORDS[str(where)] = got
        return got


def _read_records(where: Path) -> dict:
    try:
        data = json.loads((where / STAMPS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _recorded_stamp(where, key, ids) -> str | None:
    if where is None or ids is None:
        return None
    rec = _records(where).get(_set_name(key))
    if not isinstance(rec, dict) or rec.get("ids") != ids:
        return None
    stamp = rec.get("stamp")
    return stamp if isinstance(stamp, str) and stamp else None


def _record_stamp(where: Path, key, ids, stamp: str) -> None:
    table = _records(where)
    with _STAMPS_LOCK:
        table[_set_name(key)] = {"ids": ids, "stamp": stamp, "made": time.time()}
    write_behind(_write_records, where)


def _write_records(where: Path) -> None:
    """Merge this process's records into the folder's (another process may have
    written since) and write the file atomically, at most :data:`STAMPS_MAX` sets."""
    mine = _records(where)
    merged = _read_records(where)
    with _STAMPS_LOCK:
        merged.update(mine)
    keep = sorted(merged.items(), key=lambda kv: -float(kv[1].get("made", 0))
                  if isinstance(kv[1], dict) else 0.0)[:STAMPS_MAX]
    text = json.dumps(dict(keep)).encode()
    publish(where, lambda fh: fh.write(text), lambda tag: where / STAMPS_FILE)


def narrow(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest signed integer type holding its values."""
    if a.size == 0:
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for t in (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return a.astype(t, copy=False)
    raise AssertionError("unreachable")  # pragma: no cover


def unlink(path: Path) -> None:
    """Delete ``path``, best effort (gone already, or not ours to delete: no error)."""
    try:
        path.unlink()
    except OSError:
        pass


def touch(path: Path) -> None:
    """Mark ``path`` used (its modification time: the bounds delete it last)."""
    try:
        os.utime(path)
    except OSError:
        pass


def publish(where: Path, write: Callable, name: Callable[[str], Path]) -> Path:
    """Write a file atomically: ``write(fh)`` into a temporary file of the folder
    ``where``, then ``os.replace`` it to ``name(tag)`` (``tag``: the temporary
    file's unique part). Returns the path written.

    Raises
    ------
    OSError
        The folder or the file cannot be written (nothing is left behind).
    """
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, prefix="tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        path = name(os.path.basename(tmp)[4:-5])
        os.replace(tmp, path)
    except BaseException:
        unlink(Path(tmp))
        raise
    return path


def files(where: Path, prefix: str) -> list:
    """The entry files ``{prefix}*.bin`` of the folder ``where``, sorted by name."""
    try:
        return sorted(p for p in where.iterdir()
                      if p.name.startswith(prefix) and p.suffix == ".bin")
    except OSError:
        return []


#: Per store folder and prefix, the sizes of the entries :func:`bound` has seen.
_SIZES: dict = {}
_SIZES_LOCK = threading.Lock()


def _sizes(where: Path, prefix: str) -> dict:
    """The entries' sizes :func:`bound` has seen in ``where`` (name: bytes), this
    process's (a forked child's copy is still true of the folder)."""
    with _SIZES_LOCK:
        return _SIZES.setdefault((str(where), prefix), {})


def bound(where: Path, prefix: str, keep: Path, max_bytes: int, max_files: int,
          current: str | None = None) -> None:
    """Delete entry files ``{prefix}*.bin`` of ``where`` (never ``keep``) until at
    most ``max_bytes`` in ``max_files`` files are left: first those whose name
    does not start with ``current`` (other stamps; when given), then the least
    recently used. Temporary files older than :data:`STALE_SECONDS` (left by a
    writer that was killed) are deleted too.

    Each call lists the folder (one read of its names: files other processes
    wrote or deleted are seen) but stats only ``keep`` and the entries this
    process has not seen yet (their sizes are kept per folder and prefix,
    :func:`_sizes`); only where that total passes a bound are all entries
    stat'ed for their ages and the oldest deleted. A write in a large folder
    so costs one listing and one or two stats, not a stat of every entry.
    """
    try:
        names = os.listdir(where)
    except OSError:
        return
    _drop_stale(where, names)
    entries = {n for n in names if n.startswith(prefix) and n.endswith(".bin")}
    known = _sizes(where, prefix)
    with _SIZES_LOCK:
        for n in [n for n in known if n not in entries]:
            del known[n]
        new = [n for n in entries if n not in known or n == keep.name]
    for n in new:
        try:
            size = os.stat(where / n).st_size
        except OSError:
            entries.discard(n)
            continue
        with _SIZES_LOCK:
            known[n] = size
    with _SIZES_LOCK:
        total = sum(known.get(n, 0) for n in entries)
    if total <= max_bytes and len(entries) <= max_files:
        return
    _delete_oldest(where, sorted(entries), keep, max_bytes, max_files, current, known)


def _delete_oldest(where: Path, names: list, keep: Path, max_bytes: int, max_files: int,
                   current: str | None, known: dict) -> None:
    """:func:`bound`'s deletions: every entry ``names`` stat'ed for its size and age,
    then other stamps' files and the least recently used deleted until the
    bounds hold (``known`` follows)."""
    found = []
    for n in names:
        p = where / n
        try:
            st = p.stat()
        except OSError:
            continue
        mine = current is not None and n.startswith(current)
        found.append((mine, st.st_mtime_ns, n, p, st.st_size))
    found.sort()
    total = sum(f[4] for f in found)
    count = len(found)
    with _SIZES_LOCK:
        known.update((f[2], f[4]) for f in found)
    for _, _, n, p, size in found:
        if total <= max_bytes and count <= max_files:
            break
        if n == keep.name:
            continue
        try:
            p.unlink()
        except OSError:
            continue
        with _SIZES_LOCK:
            known.pop(n, None)
        total -= size
        count -= 1


def _drop_stale(where: Path, names: list) -> None:
    """Delete the temporary files among ``names`` of ``where`` older than
    :data:`STALE_SECONDS`."""
    now = time.time()
    for n in names:
        if not (n.startswith("tmp-") and n.endswith(".part")):
            continue
        p = where / n
        try:
            if now - p.stat().st_mtime > STALE_SECONDS:
                p.unlink()
        except OSError:
            continue


# ------------------------------------------------------------ writing behind

class _WriteBehind:
    """One worker thread writing cache files while the caller goes on (the files
    are written atomically, so a reader sees a whole file or none). The thread
    is joined at interpreter exit, so writes under way complete; a forked child
    starts its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool = None
        self._pid = None
        self._pending: list = []

    def submit(self, fn, *args) -> None:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="scipy_gpuqr-cache-write")
                self._pid = os.getpid()
                self._pending = []
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(_quiet, fn, *args))

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            if self._pid != os.getpid():
                return
        for f in pending:
            f.result()


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:                          # noqa: BLE001 - best effort: not written
        pass


_WRITER = _WriteBehind()


def write_behind(fn, *args) -> None:
    """Run ``fn(*args)`` (a cache write; errors ignored) on the writer thread."""
    _WRITER.submit(fn, *args)


def flush() -> None:
    """Wait for the cache writes handed to :func:`write_behind` so far."""
    _WRITER.flush()


# ------------------------------------------------------------ array files

def write_arrays(fh, magic: bytes, arrays: dict, header: dict) -> None:
    """An array file: ``magic`` (8 bytes), the header, then every array at a
    multiple of 64 bytes of the file (read back as aligned views, no copies);
    the arrays are written from their own memory. ``header`` gains the keys
    ``arrays``, ``size`` and ``crc``."""
    views, meta, at, crc = [], [], 0, 0
    for k, v in arrays.items():
        b = np.ascontiguousarray(v)
        pad = -at % _ALIGN
        if pad:
            views.append(b"\0" * pad)
            crc = zlib.crc32(views[-1], crc)
            at += pad
        mv = memoryview(b).cast("B") if b.nbytes else b""
        meta.append([k, b.dtype.str, list(b.shape), at])
        views.append(mv)
        crc = zlib.crc32(mv, crc)
        at += b.nbytes
    h = dict(header, arrays=meta, size=at, crc=crc)
    hb = json.dumps(h, sort_keys=True).encode()
    hb += b" " * (-(16 + len(hb)) % _ALIGN)
    fh.write(magic + len(hb).to_bytes(8, "little") + hb)
    for mv in views:
        fh.write(mv)


def read_mapped(path: Path, *, writable: bool = False):
    """The bytes of ``path`` mapped (a memoryview of an ``mmap``), or None.

    For large entries: their arrays are views of the page cache, made without
    reading or copying (and without first touches of fresh memory, whose page
    faults a new process's first call pays beside CuPy's import); the mapping
    stays valid when the file is replaced or deleted (the store never
    truncates or rewrites a file in place). Arrays decoded from it are
    read-only, or with ``writable`` writable: a private (copy-on-write)
    mapping, whose pages are copied only where written, and never written
    back to the file.
    """
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return None
            mm = mmap.mmap(fh.fileno(), size,
                           access=mmap.ACCESS_COPY if writable else mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    return memoryview(mm)


#: Payloads of at least this many bytes are checked by :func:`crc32` in pieces on
#: threads (zlib releases the GIL); smaller ones in one pass. A new process's
#: first call checks its analysis and its schedule's plan (the plan with its
#: records) on the call's thread, where one core's pass would be waited for.
CRC_PARALLEL_BYTES = 8 << 20
#: Bytes of the smallest piece of :func:`crc32`, as a power of two.
CRC_PIECE_LOG2 = 22
#: Most threads of :func:`crc32`.
CRC_THREADS = 8


def crc32(data) -> int:
    """``zlib.crc32(data)`` (``data``: a bytes-like object, e.g. a mapped file),
    computed on up to :data:`CRC_THREADS` threads when ``data`` has at least
    :data:`CRC_PARALLEL_BYTES` and combined (:func:`crc32_combine`): a large
    layout file's check on a new process's first call, a tenth of a second in
    one pass, is then bound by the page cache's reads.

    One piece per thread (:func:`crc_piece_bytes`): every piece's end takes the
    interpreter's lock back (its result, the pool's next task), and in a new
    process these checks run while CuPy imports on another thread, whose
    import holds that lock for all its Python; a hundred small pieces would
    take it from the import a hundred times.
    """
    mv = memoryview(data).cast("B")
    n = len(mv)
    threads = min(CRC_THREADS, os.cpu_count() or 1)
    if n < CRC_PARALLEL_BYTES or threads < 2:
        return zlib.crc32(mv)
    piece = crc_piece_bytes(n, threads)
    starts = range(0, n, piece)
    with ThreadPoolExecutor(min(threads, len(starts)), thread_name_prefix="gpuqr-crc") as ex:
        crcs = list(ex.map(lambda a: zlib.crc32(mv[a:a + piece]), starts))
    out = crcs[0]
    for a, c in zip(starts[1:], crcs[1:]):
        out = crc32_combine(out, c, min(piece, n - a))
    return out


def crc_piece_bytes(n: int, threads: int) -> int:
    """Bytes of :func:`crc32`'s pieces of an ``n``-byte payload on ``threads``
    threads: the payload cut in ``threads`` equal pieces (the last one shorter),
    each a whole number of 4 KiB pages and at least ``2**CRC_PIECE_LOG2`` bytes
    (a smaller payload in fewer pieces)."""
    per = -(-int(n) // max(int(threads), 1))
    return max(1 << CRC_PIECE_LOG2, -(-per // _CRC_PAGE) * _CRC_PAGE)


#: The granule of :func:`crc_piece_bytes` (pieces start on page bounds of a mapped file).
_CRC_PAGE = 4096


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and
    ``len2 = len(B)``: ``crc1`` carried over ``len2`` zero bytes (a product of
    the GF(2) operators of :func:`_zeros_operator`, one per set bit of
    ``len2``), xor ``crc2``."""
    for k in range(max(int(len2), 0).bit_length()):
        if len2 >> k & 1:
            crc1 = _gf2_times(_zeros_operator(k), crc1)
    return crc1 ^ crc2


def _gf2_times(mat: tuple, vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


@functools.lru_cache(maxsize=64)
def _zeros_operator(k: int) -> tuple:
    """The 32×32 GF(2) operator (columns as ints) that carries a CRC-32 over
    ``2**k`` zero bytes (constants of the polynomial, made once per process)."""
    bits = _zeros_bits(k)
    return tuple(int(c) for c in (bits << np.arange(32, dtype=np.int64)[:, None]).sum(axis=0))


@functools.lru_cache(maxsize=64)
def _zeros_bits(k: int) -> np.ndarray:
    """:func:`_zeros_operator`'s matrix as 0/1 entries (row: output bit, column:
    input bit): ``2**k`` zero bytes are ``2**(k-1)`` twice, a matrix product mod 2
    in NumPy (a new process's first pieced check builds every level up to its
    piece's; in Python ints each level is 32 products of 32 steps)."""
    if k == 0:
        one_bit = (0xEDB88320,) + tuple(1 << n for n in range(31))   # one zero bit
        mat = one_bit
        for _ in range(3):                                           # 2, 4, 8 bits
            mat = tuple(_gf2_times(mat, c) for c in mat)
        cols = np.array(mat, dtype=np.int64)
        return (cols[None, :] >> np.arange(32, dtype=np.int64)[:, None]) & 1
    half = _zeros_bits(k - 1)
    return (half @ half) & 1


class Foreign(ValueError):
    """An array file of another kind, format, stamp or key (not damaged: not ours)."""


def decode_arrays(data, magic: bytes, want: dict, kinds: str = "iub") -> tuple:
    """Header and arrays of an array file's bytes (views of ``data``).

    Raises
    ------
    Foreign
        Not such a file (another magic word), or another value of a key of
        ``want`` in its header (another format, stamp or key).
    ValueError
        Damage: an unreadable header, a failed size or CRC check, or an array
        of a dtype kind outside ``kinds``.
    """
    if bytes(data[:8]) != magic:
        raise Foreign("not a file of this kind")
    n = int.from_bytes(data[8:16], "little")
    h = json.loads(bytes(data[16:16 + n]).decode())
    for k, v in want.items():
        if h.get(k) != v:
            raise Foreign(f"file for another {k}")
    payload = memoryview(data)[16 + n:]
    if len(payload) != h["size"] or crc32(payload) != h["crc"]:
        raise ValueError("file damaged")
    a = {}
    for name, dt, shape, off in h["arrays"]:
        dt = np.dtype(dt)
        if dt.kind not in kinds:
            raise ValueError("bad dtype")
        a[name] = np.frombuffer(payload, dtype=dt, count=math.prod(shape),
                                offset=off).reshape(shape)
    return h, a


def load_fingerprinted(path: Path | None, magic: bytes, want: dict,
                       fingerprint: Callable[[], dict], make: Callable):
    """``make(header, arrays)`` of the array file at ``path`` whose ``fp_`` arrays
    equal ``fingerprint()``'s (``arrays``: the others, read-only views of the
    mapped file), or None: no file, one of another kind, format or stamp
    (``want``), or another pattern's fingerprint (not damage: kept). A file that
    does not decode, or whose arrays ``make`` raises on, is damaged and
    deleted. A hit is touched (its age for :func:`bound`)."""
    if path is None:
        return None
    data = read_mapped(path)
    if data is None:
        return None
    try:
        h, a = decode_arrays(data, magic, want)
        for k, v in fingerprint().items():
            got = a.get("fp_" + k)
            if got is None or not np.array_equal(got, v):
                return None
        out = make(h, {k: v for k, v in a.items() if not k.startswith("fp_")})
    except Foreign:
        return None
    except Exception:                          # noqa: BLE001 - damaged: drop it
        unlink(path)
        return None
    touch(path)
    return out


def save_fingerprinted(path: Path | None, magic: bytes, header: dict,
                       fingerprint: Callable[[], dict], arrays: dict, *, prefix: str, current: str, max_file_bytes: int,
                       max_bytes: int, max_files: int) -> bool:
    """Write ``arrays`` with ``fingerprint()`` (as ``fp_`` arrays, narrowed) and
    ``header`` at ``path``, published atomically, then keep the folder's
    ``prefix`` files within ``max_bytes`` and ``max_files`` (``current``: the
    prefix of this stamp's files); nothing where the arrays exceed
    ``max_file_bytes``. Whether written; never raises (best effort)."""
    if path is None:
        return False
    try:
        if sum(int(np.asarray(v).nbytes) for v in arrays.values()) > max_file_bytes:
            return False
        allv = {"fp_" + k: narrow(np.asarray(v)) for k, v in fingerprint().items()}
        allv.update(arrays)
        publish(path.parent, lambda fh: write_arrays(fh, magic, allv, header), lambda tag: path)
        bound(path.parent, prefix, path, max_bytes, max_files, current=current)
        return True
    except Exception:                          # noqa: BLE001 - best effort: not written
        return False
