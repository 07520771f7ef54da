"""Tile schedules kept on disk between processes (the bucket simulation's cache).

The bucket simulation (:mod:`.bucket`) depends only on a front's tile pattern
(row-tile buckets, column tiles, column tiles to factorize) and the tunables
(bundle, pipelining, granule); a new process would simulate again every
pattern the last one did. This module keeps the simulated patterns on disk,
in the package's user cache folder:

* folder: ``$SCIPY_GPUQR_SCHEDULE_CACHE`` when it names one (``off``, ``0``,
  ``no``, ``false``: no disk cache at all), else ``tile_schedules`` in
  ``$SCIPY_GPUQR_CACHE_DIR``, else in ``$XDG_CACHE_HOME/scipy_gpuqr``, else
  in ``~/.cache/scipy_gpuqr`` (:func:`scipy_gpuqr._cachedir.cache_dir`); one
  subfolder per set of tunables (``b{bundle}-p{0|1}-g{granule}``);
* one *segment* file per simulation that added patterns (``seg-*.bin``):
  a magic word, a JSON header (:data:`FORMAT`, the *rules stamp* — a hash of
  the bucket rules' and the record layout's source files, so any change of
  them retires the old segments —, the tunables, the *keys* part's arrays
  (dtypes, shapes, offsets, size, CRC-32) and the *rows* part's record
  layout), the keys part (the patterns' buckets, counts, row and record
  pointers, where their rows lie, a CRC-32 of each pattern's rows) and the
  rows part (every pattern's rows as packed records, one after the other,
  each field in the narrowest integer type that holds it);
* a process reads every segment's header and keys once (at the first
  look-up with those tunables; again after :func:`forget`) and, on a hit,
  only the byte ranges of the patterns hit (adjacent ones in one read), so a
  look-up costs what it uses, not the whole cache; a segment is written by a
  worker thread (:func:`write_behind`, off the caller's path; :func:`flush`
  waits for it), atomically (a temporary file in the same folder, then ``os.replace``) and
  never changed, so processes writing at once lose nothing; a segment that
  cannot be read, fails its checks or carries another format or stamp is
  ignored (a damaged one of this stamp is deleted; its patterns are
  simulated and written again); the folder keeps at most ``max_bytes``
  (:data:`MAX_BYTES`) in at most ``max_segments`` (:data:`MAX_SEGMENTS`)
  segments, those of other stamps and then the least recently used (a hit
  touches its segment's modification time) deleted first when a new one is
  written.

Everything here is best effort: an unwritable folder only means no disk
cache. Tests point ``SCIPY_GPUQR_SCHEDULE_CACHE`` at a temporary folder or
``off``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Mapping

import numpy as np

from .._cachedir import cache_dir

__all__ = ["ENV", "FORMAT", "MAX_BYTES", "MAX_SEGMENTS", "folder", "store", "forget",
           "rules_stamp", "source_stamp", "PatternStore", "write_behind", "flush"]

#: Environment variable naming the folder (or ``off``).
ENV = "SCIPY_GPUQR_SCHEDULE_CACHE"
#: File format version (bump when the layout below changes).
FORMAT = 3
#: Most bytes of segment files kept per set of tunables.
MAX_BYTES = 64 << 20
#: Most segment files kept per set of tunables.
MAX_SEGMENTS = 64

_MAGIC = b"SGQRTSC3"
_OFF = ("0", "off", "no", "false", "none")
#: the row columns of a pattern (``TileSchedule.rcols``)
_ROWCOLS = ("type", "col", "c0", "c1", "napply", "nfrows", "fstart", "flags", "ftop",
            "vt", "vt2", "rows", "mult")
_PER_PATTERN = ("nct", "nfct", "nlaunch", "nvt")
#: the keys part's arrays (the rows part: the _ROWCOLS fields, packed)
_KEYS = ("key_b", "key_ptr") + _PER_PATTERN + ("span", "ptr_at", "row_ptr", "launch_ptr",
                                               "crc")


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


def source_stamp(names) -> str:
    """A hash of this package's ``_schedule`` source files ``names`` (once per
    process); empty when they cannot be read (then no disk cache is used)."""
    names = tuple(names)
    got = _STAMPS.get(names)
    if got is None:
        here = Path(__file__).resolve().parent
        h = hashlib.sha1()
        try:
            for name in names:
                h.update(name.encode() + b"\0" + (here / name).read_bytes())
            got = h.hexdigest()[:20]
        except OSError:
            got = ""
        _STAMPS[names] = got
    return got


def rules_stamp() -> str:
    """A hash of the sources that decide a tile schedule (bucket rules, records)."""
    return source_stamp(("bucket.py", "tasks.py", "_native.c"))


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest signed integer type holding its values."""
    if a.size == 0:
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for t in (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return a.astype(t, copy=False)
    raise AssertionError("unreachable")  # pragma: no cover


class _Segment:
    """One segment file: its keys (read at the scan) and where its rows lie."""

    __slots__ = ("path", "rows_at", "rec", "crc_all", "keys", "bad")

    def __init__(self, path, rows_at, rec, crc_all, keys):
        self.path = path
        self.rows_at = rows_at          # offset of the rows part in the file
        self.rec = rec                  # the packed record dtype of the rows
        self.crc_all = crc_all          # CRC-32 of the whole rows part
        self.keys = keys                # the keys part's arrays
        self.bad = False                # rows found damaged


class PatternStore:
    """The segments of one set of tunables, scanned on first use.

    Parameters
    ----------
    path : Path
        The folder of the segments.
    tunables : (int, bool, int)
        ``(bundle, pipelining, granule)``.
    max_bytes, max_segments : int
        Bounds of the folder (see the module docstring).
    """

    def __init__(self, path: Path, tunables: tuple, max_bytes: int = MAX_BYTES,
                 max_segments: int = MAX_SEGMENTS):
        self.path = Path(path)
        self.tunables = (int(tunables[0]), bool(tunables[1]), int(tunables[2]))
        self.max_bytes = int(max_bytes)
        self.max_segments = int(max_segments)
        self._lock = threading.Lock()
        self._scanned = False
        self._segs: list = []
        self._index: dict = {}          # (buckets bytes, nct, nfct) -> (segment, number)

    def _header(self) -> dict:
        b, p, g = self.tunables
        return {"format": FORMAT, "stamp": rules_stamp(), "bundle": b, "pipelining": p,
                "granule": g}

    # ------------------------------------------------------------------ reading
    def _segment_files(self):
        try:
            return sorted(p for p in self.path.iterdir()
                          if p.name.startswith("seg-") and p.suffix == ".bin")
        except OSError:
            return []

    def _scan(self) -> None:
        if self._scanned:
            return
        self._scanned = True
        want = self._header()
        for p in self._segment_files():
            try:
                seg = _read_keys(p, want)
            except _Damaged:                # ours but damaged: nobody can use it
                try:
                    p.unlink()
                except OSError:
                    pass
                continue
            except Exception:              # noqa: BLE001 - unreadable or foreign: ignore it
                continue
            try:
                self._register(seg)
            except Exception:              # noqa: BLE001 - inconsistent keys: ignore it
                continue

    def _register(self, seg: _Segment) -> None:
        self._segs.append(seg)
        k = seg.keys
        kb, kp = k["key_b"], k["key_ptr"].tolist()
        nct, nfct = k["nct"].tolist(), k["nfct"].tolist()
        raw = kb.tobytes()
        idx = self._index
        for j in range(len(nct)):
            key = (raw[4 * kp[j]:4 * kp[j + 1]], nct[j], nfct[j])
            if key not in idx:
                idx[key] = (seg, j)

    def _drop(self, seg: _Segment) -> None:
        """Forget a damaged segment's patterns (written again when simulated) and
        delete its file (it carries this stamp: nobody can use it)."""
        seg.bad = True
        for key in [k for k, v in self._index.items() if v[0] is seg]:
            del self._index[key]
        try:
            seg.path.unlink()
        except OSError:
            pass

    def lookup(self, keys) -> dict:
        """TileSchedules of the patterns ``keys`` found on disk.

        ``keys``: ``(buckets as int32 bytes, nct, nfct)`` each. Returns
        ``key -> TileSchedule`` for the keys found (a segment that turns out
        damaged when its rows are read gives none).
        """
        with self._lock:
            self._scan()
            by_seg: dict = {}
            for k in keys:
                hit = self._index.get(k)
                if hit is not None:
                    by_seg.setdefault(id(hit[0]), (hit[0], [], []))
                    by_seg[id(hit[0])][1].append(k)
                    by_seg[id(hit[0])][2].append(hit[1])
            out = {}
            for seg, ks, js in by_seg.values():
                try:
                    made = _load(seg, js, self.tunables[2])
                except Exception:          # noqa: BLE001 - damaged rows: simulate again
                    self._drop(seg)
                    continue
                out.update(zip(ks, made))
                try:                        # used: the bound deletes it last
                    os.utime(seg.path)
                except OSError:
                    pass
            return out

    # ------------------------------------------------------------------ writing
    def add(self, keys, scheds) -> bool:
        """Write the simulated patterns not on disk yet as a new segment (atomically),
        then keep the folder within its bounds. Returns whether a segment was written
        (never raises: the disk cache is best effort).
        """
        try:
            return self._add(keys, scheds)
        except Exception:                  # noqa: BLE001 - best effort: not written
            return False

    def _add(self, keys, scheds) -> bool:
        with self._lock:
            self._scan()
            new = [(k, s) for k, s in zip(keys, scheds) if k not in self._index]
            if not new:
                return False
            keys_a, rows_a = _arrays_of([k for k, _ in new], [s for _, s in new])
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                data, rows_at, rec, crc_all, keys_a = _encode(keys_a, rows_a, self._header())
                fd, tmp = tempfile.mkstemp(dir=self.path, prefix="tmp-", suffix=".part")
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    name = self.path / f"seg-{rules_stamp()[:8]}-{os.path.basename(tmp)[4:-5]}.bin"
                    os.replace(tmp, name)
                except BaseException:
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                    raise
            except OSError:
                return False
            seg = _Segment(name, rows_at, rec, crc_all, _as_read(keys_a))
            self._register(seg)
            self._bound(name)
            return True

    def _bound(self, keep: Path) -> None:
        """Delete the oldest segments (not ``keep``) beyond the folder's bounds."""
        mine = f"seg-{rules_stamp()[:8]}-"
        files = []
        for p in self._segment_files():
            try:
                st = p.stat()
            except OSError:
                continue
            # segments of other bucket rules first, then the oldest
            files.append((p.name.startswith(mine), st.st_mtime_ns, p.name, p, st.st_size))
        files.sort()
        total = sum(f[4] for f in files)
        n = len(files)
        for _, _, _, p, size in files:
            if total <= self.max_bytes and n <= self.max_segments:
                break
            if p == keep:
                continue
            try:
                p.unlink()
            except OSError:
                continue
            total -= size
            n -= 1


def _load(seg, js, granule):
    """TileSchedules of patterns ``js`` of a segment, their rows read (adjacent
    patterns in one read, every pattern's CRC checked) into one row block."""
    from .bucket import RowBlock, make_schedule
    k = seg.keys
    span = k["span"]
    ja = np.asarray(js, dtype=np.int64)
    order = np.argsort(span[ja], kind="stable")
    ja = ja[order]
    a, e = span[ja], span[ja + 1]
    # runs of adjacent patterns: one read each
    brk = np.flatnonzero(a[1:] != e[:-1]) + 1
    starts = np.concatenate(([0], brk)).tolist()
    ends = np.concatenate((brk, [len(ja)])).tolist()
    isz = seg.rec.itemsize
    ab, eb = (a * isz).tolist(), (e * isz).tolist()
    crc = k["crc"][ja].tolist()
    parts = []
    with open(seg.path, "rb") as fh:
        for s0, s1 in zip(starts, ends):
            lo, hi = ab[s0], eb[s1 - 1]
            fh.seek(seg.rows_at + lo)
            b = fh.read(hi - lo)
            if len(b) != hi - lo:
                raise ValueError("segment truncated")
            if lo == 0 and hi == int(span[-1]) * isz:     # the whole rows part
                ok = zlib.crc32(b) == seg.crc_all
            else:
                mv = memoryview(b)
                ok = all(zlib.crc32(mv[x - lo:y - lo]) == c
                         for x, y, c in zip(ab[s0:s1], eb[s0:s1], crc[s0:s1]))
            if not ok:
                raise ValueError("segment damaged")
            parts.append(b)
    rec = np.frombuffer(b"".join(parts), dtype=seg.rec)
    cols = {}
    for name in _ROWCOLS:
        v = rec[name].astype(np.int32)
        v.flags.writeable = False
        cols[name] = v
    block = RowBlock(cols)
    n = (e - a).tolist()
    pa = k["ptr_at"].tolist()
    rp, lp = k["row_ptr"], k["launch_ptr"]
    nl, nvt, nct = k["nlaunch"].tolist(), k["nvt"].tolist(), k["nct"].tolist()
    made = [None] * len(js)
    at = 0
    for pos, (i, j) in enumerate(zip(order.tolist(), ja.tolist())):
        made[i] = make_schedule(block, (at, at + n[pos]), rp[pa[j]:pa[j + 1]],
                                lp[pa[j]:pa[j + 1]], nl[j], nvt[j], granule, nct[j])
        at += n[pos]
    return made


# ------------------------------------------------------------------ arrays <-> bytes

def _arrays_of(keys, scheds):
    """The keys part and the rows part of new patterns (int32 rows, int64 pointers)."""
    P = len(keys)
    key_ptr = np.zeros(P + 1, dtype=np.int64)
    np.cumsum([len(k[0]) // 4 for k in keys], out=key_ptr[1:])
    nrow = np.array([s.nrows for s in scheds], dtype=np.int64)
    span = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(nrow, out=span[1:])
    ptr_at = np.zeros(P + 1, dtype=np.int64)
    np.cumsum([len(s.row_ptr) for s in scheds], out=ptr_at[1:])
    ka = {"key_b": np.frombuffer(b"".join(k[0] for k in keys), dtype=np.int32),
          "key_ptr": key_ptr,
          "nct": np.array([s.nct for s in scheds], dtype=np.int64),
          "nfct": np.array([k[2] for k in keys], dtype=np.int64),
          "nlaunch": np.array([s.nlaunch for s in scheds], dtype=np.int64),
          "nvt": np.array([s.nvt for s in scheds], dtype=np.int64),
          "span": span, "ptr_at": ptr_at,
          "row_ptr": np.concatenate([s.row_ptr for s in scheds]).astype(np.int64),
          "launch_ptr": np.concatenate([s.launch_ptr for s in scheds]).astype(np.int64)}
    ra = {}
    # rows: one block used whole and in order (one simulation's patterns) goes in
    # as it is, else pattern by pattern
    blk = scheds[0].block
    if (all(s.block is blk and s.span[0] == b for s, b in zip(scheds, span.tolist()))
            and int(span[-1]) == len(blk)):
        for k in _ROWCOLS:
            ra[k] = blk.cols[k]
    else:
        for k in _ROWCOLS:
            ra[k] = np.concatenate([s.block.cols[k][s.span[0]:s.span[1]] for s in scheds])
    return ka, ra


def _part(a, names):
    """Bytes and header entry of the keys part (arrays narrowed)."""
    parts, meta, at = [], [], 0
    for k in names:
        b = np.ascontiguousarray(_narrow(a[k]))
        meta.append([k, b.dtype.str, list(b.shape), at])
        parts.append(b.tobytes())
        at += len(parts[-1])
    payload = b"".join(parts)
    return payload, {"arrays": meta, "size": len(payload), "crc": zlib.crc32(payload)}


def _packed(rows_a):
    """The rows as packed records (each field narrowed) and their dtype."""
    fields = []
    for name in _ROWCOLS:
        v = rows_a[name]
        t = _narrow(v.ravel()[:0] if v.size == 0 else
                    np.array([v.min(), v.max()], dtype=np.int64)).dtype
        fields.append((name, t, v.shape[1:]) if v.ndim > 1 else (name, t))
    rec = np.dtype(fields)                       # packed: no padding
    out = np.empty(len(rows_a["type"]), dtype=rec)
    for name in _ROWCOLS:
        out[name] = rows_a[name]
    return out, rec


def _encode(keys_a, rows_a, header):
    """A segment's bytes, the offset of its rows part, the record dtype and the keys
    (with every pattern's CRC)."""
    rec, dt = _packed(rows_a)
    raw = memoryview(rec.tobytes())
    isz = dt.itemsize
    span = keys_a["span"].tolist()
    keys_a = dict(keys_a, crc=np.array([zlib.crc32(raw[span[j] * isz:span[j + 1] * isz])
                                        for j in range(len(span) - 1)], dtype=np.int64))
    kp, km = _part(keys_a, _KEYS)
    h = dict(header, keys=km, rows={"descr": _descr(dt), "count": len(rec),
                                    "crc": zlib.crc32(raw)})
    hb = json.dumps(h, sort_keys=True).encode()
    head = _MAGIC + len(hb).to_bytes(8, "little") + hb
    return head + kp + bytes(raw), len(head) + len(kp), dt, h["rows"]["crc"], keys_a


def _descr(dt: np.dtype) -> list:
    return [[name, dt.fields[name][0].base.str, list(dt.fields[name][0].shape)]
            for name in dt.names]


def _record_dtype(descr) -> np.dtype:
    names = [d[0] for d in descr]
    if names != list(_ROWCOLS):
        raise ValueError("bad record layout")
    fields = []
    for name, t, shape in descr:
        t = np.dtype(t)
        if t.kind != "i":
            raise ValueError("bad dtype")
        fields.append((name, t, tuple(shape)) if shape else (name, t))
    return np.dtype(fields)


def _decode(payload, meta, names) -> dict:
    """The arrays of the keys part (CRC checked)."""
    if len(payload) != meta["size"] or zlib.crc32(payload) != meta["crc"]:
        raise ValueError("segment damaged")
    a = {}
    for name, dt, shape, off in meta["arrays"]:
        dt = np.dtype(dt)
        if dt.kind != "i":
            raise ValueError("bad dtype")
        a[name] = np.frombuffer(payload, dtype=dt, count=math.prod(shape),
                                offset=off).reshape(shape)
    if set(a) != set(names):
        raise ValueError("segment lacks arrays")
    return _as_read(a)


def _as_read(a) -> dict:
    """The keys as the reader uses them: int32 buckets, int64 else, read-only."""
    out = {}
    for name in _KEYS:
        v = a[name].astype(np.int32 if name == "key_b" else np.int64)   # a copy
        v.flags.writeable = False
        out[name] = v
    return out


class _Damaged(ValueError):
    """A segment of this format and stamp whose contents fail their checks."""


def _read_keys(path: Path, want: dict) -> _Segment:
    size = os.stat(path).st_size
    with open(path, "rb") as fh:
        head = fh.read(16)
        if head[:8] != _MAGIC:
            raise ValueError("not a tile-schedule segment")
        n = int.from_bytes(head[8:16], "little")
        h = json.loads(fh.read(n).decode())
        for k, v in want.items():
            if h.get(k) != v:
                raise ValueError(f"segment for another {k}")
        try:
            km = h["keys"]
            keys = _decode(fh.read(km["size"]), km, _KEYS)
            rec = _record_dtype(h["rows"]["descr"])
            rows_at = 16 + n + km["size"]
            _check_keys(keys)
            if int(keys["span"][-1]) != h["rows"]["count"] or \
                    size != rows_at + h["rows"]["count"] * rec.itemsize:
                raise ValueError("segment truncated")
        except Exception as exc:        # noqa: BLE001 - any failure past the header
            raise _Damaged(str(exc)) from exc
    return _Segment(path, rows_at, rec, int(h["rows"]["crc"]), keys)


def _check_keys(k) -> None:
    """Structural checks of a keys part (the CRCs catch damage; these a writer's bug)."""
    P = len(k["nct"])
    for name in _PER_PATTERN + ("crc",):
        if k[name].shape != (P,):
            raise ValueError("bad per-pattern array")
    for ptr, n in (("key_ptr", len(k["key_b"])), ("span", None),
                   ("ptr_at", len(k["row_ptr"]))):
        p = k[ptr]
        if p.shape != (P + 1,) or p[0] != 0 or np.any(np.diff(p) < 0) or \
                (n is not None and p[-1] != n):
            raise ValueError(f"bad {ptr}")
    if len(k["launch_ptr"]) != len(k["row_ptr"]):
        raise ValueError("bad launch_ptr")
    if np.any(np.diff(k["ptr_at"]) != k["nlaunch"] + 1):
        raise ValueError("bad launch count")
    if P and np.any(k["row_ptr"][k["ptr_at"][1:] - 1] != np.diff(k["span"])):
        raise ValueError("bad row pointers")


# ------------------------------------------------------------------ the stores

_STORES: dict = {}
_STORES_LOCK = threading.Lock()


def store(tunables, environ: Mapping[str, str] = os.environ) -> PatternStore | None:
    """The store of ``(bundle, pipelining, granule)`` in the current folder (None: off)."""
    d = folder(environ)
    if d is None or not rules_stamp():
        return None
    b, p, g = int(tunables[0]), bool(tunables[1]), int(tunables[2])
    path = d / f"b{b}-p{int(p)}-g{g}"
    key = str(path)
    with _STORES_LOCK:
        s = _STORES.get(key)
        if s is None:
            s = _STORES[key] = PatternStore(path, (b, p, g))
        return s


def forget() -> None:
    """Forget what was read from disk (the next look-up reads the folder again),
    after the writes under way (:func:`flush`)."""
    flush()
    with _STORES_LOCK:
        _STORES.clear()


# ------------------------------------------------------------ writing behind

class _WriteBehind:
    """One worker thread writing cache files while the caller goes on (a write
    is off the path to launch 0; the files are written atomically, so a reader
    sees a whole file or none). The thread is joined at interpreter exit, so
    writes under way complete; a forked child starts its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool = None
        self._pid = None
        self._pending: list = []

    def submit(self, fn, *args) -> None:
        from concurrent.futures import ThreadPoolExecutor
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
