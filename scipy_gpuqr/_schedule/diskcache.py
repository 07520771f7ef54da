"""Tile schedules kept on disk between processes (the bucket simulation's cache).

The bucket simulation (:mod:`.bucket`) depends only on a front's tile pattern
(row-tile buckets, column tiles, column tiles to factorize) and the tunables
(bundle, pipelining, granule); a new process would simulate again every
pattern the last one did. This module keeps the simulated patterns in one
file per set of tunables, in the package's user cache folder:

* folder: ``$SCIPY_GPUQR_SCHEDULE_CACHE`` when it names one (``off``, ``0``,
  ``no``, ``false``: no disk cache at all), else ``tile_schedules`` in
  ``$SCIPY_GPUQR_CACHE_DIR``, else in ``$XDG_CACHE_HOME/scipy_gpuqr``, else
  in ``~/.cache/scipy_gpuqr`` (the rule of
  ``scipy_gpuqr._tiled_calib.cache_dir``, not imported: that module pulls in
  SciPy's linear algebra);
* file: ``tile-schedules-b{bundle}-p{0|1}-g{granule}.bin``: a magic word, a
  JSON header (:data:`FORMAT`, the *rules stamp* — a hash of the bucket
  rules' and the record layout's source files, so any change of them
  retires the old file —, the tunables, every array's dtype, shape and
  offset, a CRC-32 of the payload) and the arrays, each column in the
  narrowest integer type that holds it;
* read once per process (at the first look-up with those tunables; again
  after :func:`forget`), written atomically (a temporary file in the same
  folder, then ``os.replace``) whenever a simulation adds patterns, merged
  with what another process may have written since; a file that cannot be
  read, fails its checks or carries another format or stamp is ignored (and
  replaced at the next write); at most ``max_bytes`` (:data:`MAX_BYTES`) of
  rows, the patterns written first dropped first.

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

__all__ = ["ENV", "FORMAT", "MAX_BYTES", "folder", "store", "forget", "rules_stamp",
           "PatternStore"]

#: Environment variable naming the folder (or ``off``).
ENV = "SCIPY_GPUQR_SCHEDULE_CACHE"
#: File format version (bump when the layout below changes).
FORMAT = 1
#: Most bytes of rows (int32 columns) one file keeps.
MAX_BYTES = 64 << 20

_MAGIC = b"SGQRTSC1"
_OFF = ("0", "off", "no", "false", "none")
#: the row columns of a pattern (``TileSchedule.rcols``), in file order
_ROWCOLS = ("type", "col", "c0", "c1", "napply", "nfrows", "fstart", "flags", "ftop",
            "vt", "vt2", "rows", "mult")
_PER_PATTERN = ("nct", "nfct", "nlaunch", "nvt")


def folder(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The disk cache's folder (not created here); None when it is off."""
    v = environ.get(ENV, "").strip()
    if v.lower() in _OFF:
        return None
    if v:
        return Path(v)
    base = environ.get("SCIPY_GPUQR_CACHE_DIR", "").strip()
    if not base:
        xdg = environ.get("XDG_CACHE_HOME", "").strip()
        if xdg:
            base = str(Path(xdg) / "scipy_gpuqr")
        else:
            try:
                base = str(Path.home() / ".cache" / "scipy_gpuqr")
            except (RuntimeError, KeyError):         # no home folder: no disk cache
                return None
    return Path(base) / "tile_schedules"


_STAMP: list = []


def rules_stamp() -> str:
    """A hash of the sources that decide a tile schedule (bucket rules, records).

    Computed once per process; empty when the sources cannot be read (then
    no disk cache is used).
    """
    if not _STAMP:
        here = Path(__file__).resolve().parent
        h = hashlib.sha1()
        try:
            for name in ("bucket.py", "tasks.py"):
                h.update((here / name).read_bytes())
            _STAMP.append(h.hexdigest()[:20])
        except OSError:
            _STAMP.append("")
    return _STAMP[0]


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


class PatternStore:
    """The patterns of one file (one set of tunables), loaded on first use.

    Parameters
    ----------
    path : Path
        The file.
    tunables : (int, bool, int)
        ``(bundle, pipelining, granule)``.
    max_bytes : int
        Most bytes of rows kept in the file.
    """

    def __init__(self, path: Path, tunables: tuple, max_bytes: int = MAX_BYTES):
        self.path = Path(path)
        self.tunables = (int(tunables[0]), bool(tunables[1]), int(tunables[2]))
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._loaded = False
        self._seen = None           # (mtime_ns, size) of the file as read
        self._a = None              # the arrays (int32 rows, int64 pointers)
        self._index = {}            # (buckets bytes, nct, nfct) -> pattern number
        self._block = None          # RowBlock of the whole file, made on first use
        self._made = {}             # pattern number -> TileSchedule of that block

    # ------------------------------------------------------------------ reading
    def _header(self) -> dict:
        b, p, g = self.tunables
        return {"format": FORMAT, "stamp": rules_stamp(), "bundle": b, "pipelining": p,
                "granule": g}

    def _read(self):
        """The file's arrays, or None (missing, unreadable, stale or corrupt)."""
        try:
            st = os.stat(self.path)
            with open(self.path, "rb") as fh:
                data = fh.read()
        except OSError:
            return None, None
        seen = (st.st_mtime_ns, st.st_size)
        try:
            return _decode(data, self._header()), seen
        except Exception:                  # noqa: BLE001 - any damage: ignore the file
            return None, seen

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        a, self._seen = self._read()
        self._set(a)

    def _set(self, a) -> None:
        self._a = a
        self._block = None
        self._made = {}
        self._index = {}
        if a is None:
            return
        kb, kp = a["key_b"], a["key_ptr"].tolist()
        nct, nfct = a["nct"].tolist(), a["nfct"].tolist()
        for j in range(len(nct)):
            self._index[(kb[kp[j]:kp[j + 1]].tobytes(), nct[j], nfct[j])] = j

    def lookup(self, keys) -> dict:
        """TileSchedules of the patterns ``keys`` found in the file.

        ``keys``: ``(buckets as int32 bytes, nct, nfct)`` each. Returns
        ``key -> TileSchedule`` for the keys found.
        """
        with self._lock:
            self._load()
            hit = {k: self._index[k] for k in keys if k in self._index}
            if not hit:
                return {}
            span = self._a["span"]
            js = list(hit.values())
            ja = np.asarray(js, dtype=np.int64)
            used = int((span[ja + 1] - span[ja]).sum())
            made = self._whole(js) if 2 * used >= int(span[-1]) else self._gathered(js)
            return dict(zip(hit, made))

    def _schedules(self, block, spans, js):
        """TileSchedules of patterns ``js``, rows ``spans`` of ``block``."""
        from .bucket import make_schedule
        a = self._a
        pa = a["ptr_at"].tolist()
        rp, lp = a["row_ptr"], a["launch_ptr"]
        nl, nvt, nct = a["nlaunch"].tolist(), a["nvt"].tolist(), a["nct"].tolist()
        g = self.tunables[2]
        return [make_schedule(block, sp, rp[pa[j]:pa[j + 1]], lp[pa[j]:pa[j + 1]], nl[j],
                              nvt[j], g, nct[j]) for sp, j in zip(spans, js)]

    def _whole(self, js):
        """Patterns ``js`` as spans of the file's whole row block (shared by all hits)."""
        from .bucket import RowBlock
        if self._block is None:
            self._block = RowBlock({k: self._a[k] for k in _ROWCOLS})
        todo = [j for j in js if j not in self._made]
        if todo:
            span = self._a["span"].tolist()
            for j, s in zip(todo, self._schedules(self._block,
                                                  [(span[j], span[j + 1]) for j in todo],
                                                  todo)):
                self._made[j] = s
        return [self._made[j] for j in js]

    def _gathered(self, js):
        """Patterns ``js`` in one new row block of their rows only."""
        from .bucket import RowBlock
        a = self._a
        span = a["span"]
        ja = np.asarray(js, dtype=np.int64)
        n = span[ja + 1] - span[ja]
        start = np.zeros(len(ja) + 1, dtype=np.int64)
        np.cumsum(n, out=start[1:])
        idx = np.repeat(span[ja] - start[:-1], n) + np.arange(int(start[-1]))
        cols = {}
        for k in _ROWCOLS:
            v = a[k][idx]
            v.flags.writeable = False
            cols[k] = v
        st = start.tolist()
        return self._schedules(RowBlock(cols), [(st[i], st[i + 1]) for i in range(len(js))],
                               js)

    # ------------------------------------------------------------------ writing
    def add(self, keys, scheds) -> bool:
        """Add simulated patterns and write the file (merged, atomically).

        Returns whether the file was written.
        """
        if not keys:
            return False
        with self._lock:
            self._load()
            new = [(k, s) for k, s in zip(keys, scheds) if k not in self._index]
            if not new:
                return False
            try:
                st = os.stat(self.path)
                now = (st.st_mtime_ns, st.st_size)
            except OSError:
                now = None
            if now is not None and now != self._seen:     # another process wrote it
                a, seen = self._read()
                if a is not None:
                    self._set(a)
                    self._seen = seen
                    new = [(k, s) for k, s in new if k not in self._index]
                    if not new:
                        return False
            merged = _merge(self._a, new)
            merged = _bound(merged, self.max_bytes)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                data = _encode(merged, self._header())
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".",
                                           suffix=".tmp")
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    os.replace(tmp, self.path)
                except BaseException:
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                    raise
                st = os.stat(self.path)
                self._seen = (st.st_mtime_ns, st.st_size)
            except OSError:
                return False
            # keep the patterns known in memory; the schedules already handed out
            # stay valid (their blocks are their own)
            if _bounded_same(merged, self._a, len(new)):
                P0 = len(self._a["nct"]) if self._a is not None else 0
                self._a = merged
                self._block = None
                self._made = {}
                for i, (k, _) in enumerate(new):
                    self._index[k] = P0 + i
            else:
                self._set(merged)
            return True


# ------------------------------------------------------------------ arrays <-> bytes

def _arrays_of(keys, scheds) -> dict:
    """File arrays of new patterns (int32 rows, int64 pointers)."""
    P = len(keys)
    key_ptr = np.zeros(P + 1, dtype=np.int64)
    np.cumsum([len(k[0]) // 4 for k in keys], out=key_ptr[1:])
    a = {"key_b": np.frombuffer(b"".join(k[0] for k in keys), dtype=np.int32),
         "key_ptr": key_ptr,
         "nct": np.array([s.nct for s in scheds], dtype=np.int64),
         "nfct": np.array([k[2] for k in keys], dtype=np.int64),
         "nlaunch": np.array([s.nlaunch for s in scheds], dtype=np.int64),
         "nvt": np.array([s.nvt for s in scheds], dtype=np.int64)}
    # rows: one block used whole and in order (one simulation's patterns) goes in
    # as it is, else pattern by pattern
    nrow = np.array([s.nrows for s in scheds], dtype=np.int64)
    span = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(nrow, out=span[1:])
    a["span"] = span
    blk = scheds[0].block if P else None
    if (P and all(s.block is blk and s.span[0] == b for s, b in zip(scheds, span.tolist()))
            and int(span[-1]) == len(blk)):
        for k in _ROWCOLS:
            a[k] = blk.cols[k]
    else:
        for k in _ROWCOLS:
            a[k] = np.concatenate([s.block.cols[k][s.span[0]:s.span[1]] for s in scheds])
    pl = [len(s.row_ptr) for s in scheds]
    ptr_at = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(pl, out=ptr_at[1:])
    a["ptr_at"] = ptr_at
    a["row_ptr"] = np.concatenate([s.row_ptr for s in scheds]).astype(np.int64)
    a["launch_ptr"] = np.concatenate([s.launch_ptr for s in scheds]).astype(np.int64)
    return a


def _merge(old, new) -> dict:
    """The file's patterns, then the new ones."""
    add = _arrays_of([k for k, _ in new], [s for _, s in new])
    if old is None:
        return add
    out = {}
    for k in add:
        if k in ("key_ptr", "span", "ptr_at"):
            out[k] = np.concatenate([old[k], add[k][1:] + old[k][-1]])
        else:
            out[k] = np.concatenate([old[k], add[k]])
    return out


def _bounded_same(merged, old, nnew) -> bool:
    """Whether ``merged`` is ``old`` plus ``nnew`` patterns (nothing dropped)."""
    p0 = len(old["nct"]) if old is not None else 0
    return len(merged["nct"]) == p0 + nnew


def _row_bytes(a) -> np.ndarray:
    """Bytes of each pattern's rows (int32 columns)."""
    per_row = 4 * (len(_ROWCOLS) - 1 + a["rows"].shape[1])
    return np.diff(a["span"]) * per_row


def _bound(a, max_bytes) -> dict:
    """Drop the first patterns until the rows fit in ``max_bytes``."""
    rb = _row_bytes(a)
    total = int(rb.sum())
    if total <= max_bytes:
        return a
    cut = int(np.searchsorted(np.cumsum(rb), total - max_bytes, side="left")) + 1
    return _slice(a, cut, len(rb))


def _slice(a, j0, j1) -> dict:
    """Patterns ``j0 … j1-1`` of the arrays ``a``."""
    out = {}
    for ptr, members in (("key_ptr", ("key_b",)), ("span", _ROWCOLS),
                         ("ptr_at", ("row_ptr", "launch_ptr"))):
        p = a[ptr]
        lo, hi = int(p[j0]), int(p[j1])
        out[ptr] = p[j0:j1 + 1] - lo
        for k in members:
            out[k] = a[k][lo:hi]
    for k in _PER_PATTERN:
        out[k] = a[k][j0:j1]
    return out


_NAMES = ("key_b", "key_ptr") + _PER_PATTERN + ("span",) + _ROWCOLS + (
    "ptr_at", "row_ptr", "launch_ptr")
_INT32 = ("key_b",) + _ROWCOLS


def _encode(a, header) -> bytes:
    parts, meta, at = [], [], 0
    for k in _NAMES:
        v = np.ascontiguousarray(_narrow(a[k]))
        b = v.tobytes()
        meta.append([k, v.dtype.str, list(v.shape), at])
        parts.append(b)
        at += len(b)
    payload = b"".join(parts)
    h = dict(header, arrays=meta, crc=zlib.crc32(payload), size=len(payload))
    hb = json.dumps(h, sort_keys=True).encode()
    return _MAGIC + len(hb).to_bytes(8, "little") + hb + payload


def _decode(data: bytes, want: dict) -> dict:
    if data[:8] != _MAGIC:
        raise ValueError("not a tile-schedule cache file")
    n = int.from_bytes(data[8:16], "little")
    h = json.loads(data[16:16 + n].decode())
    for k, v in want.items():
        if h.get(k) != v:
            raise ValueError(f"cache file for another {k}")
    payload = memoryview(data)[16 + n:]
    if len(payload) != h["size"] or zlib.crc32(payload) != h["crc"]:
        raise ValueError("cache file damaged")
    a = {}
    for name, dt, shape, off in h["arrays"]:
        dt = np.dtype(dt)
        if dt.kind != "i":
            raise ValueError("bad dtype")
        cnt = math.prod(shape)
        v = np.frombuffer(payload, dtype=dt, count=cnt, offset=off).reshape(shape)
        want_t = np.int32 if name in _INT32 else np.int64
        v = v.astype(want_t)            # always a copy: the payload is one buffer
        v.flags.writeable = False
        a[name] = v
    if set(a) != set(_NAMES):
        raise ValueError("cache file lacks arrays")
    _check(a)
    return a


def _check(a) -> None:
    """Structural checks (the CRC catches damage; these catch a writer's bug)."""
    P = len(a["nct"])
    for k in _PER_PATTERN:
        if a[k].shape != (P,):
            raise ValueError("bad per-pattern array")
    for ptr, k in (("key_ptr", "key_b"), ("span", "type"), ("ptr_at", "row_ptr")):
        p = a[ptr]
        if p.shape != (P + 1,) or p[0] != 0 or p[-1] != len(a[k]) or np.any(np.diff(p) < 0):
            raise ValueError(f"bad {ptr}")
    nr = len(a["type"])
    for k in _ROWCOLS:
        if len(a[k]) != nr:
            raise ValueError(f"bad column {k}")
    if len(a["launch_ptr"]) != len(a["row_ptr"]):
        raise ValueError("bad launch_ptr")
    if np.any(np.diff(a["ptr_at"]) != a["nlaunch"] + 1):
        raise ValueError("bad launch count")
    ends = a["ptr_at"][1:] - 1
    if np.any(a["row_ptr"][ends] != np.diff(a["span"])):
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
    path = d / f"tile-schedules-b{b}-p{int(p)}-g{g}.bin"
    key = str(path)
    with _STORES_LOCK:
        s = _STORES.get(key)
        if s is None:
            s = _STORES[key] = PatternStore(path, (b, p, g))
        return s


def forget() -> None:
    """Forget what was read from disk (the next look-up reads the files again)."""
    with _STORES_LOCK:
        _STORES.clear()
