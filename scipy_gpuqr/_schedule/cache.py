"""The schedule cache store: tile schedules and whole plans kept on disk between processes.

A new process would simulate again every tile pattern the last one did and
build again every plan; this store keeps both kinds of entry on disk, in one
folder with one set of rules.

Storage (shared by both kinds)
------------------------------
The rules live in :mod:`scipy_gpuqr._store`, below the schedulers and the
symbolic analysis, whose cache (:mod:`scipy_gpuqr._symbolic.analysis_cache`)
keeps its entries in the same folder under the same rules:

* folder: ``$SCIPY_GPUQR_SCHEDULE_CACHE`` when it names one (``off``, ``0``,
  ``no``, ``false``: no disk cache at all), else ``tile_schedules`` in the
  package's user cache folder (:func:`scipy_gpuqr._cachedir.cache_dir`);
* stamps: every file carries a hash of the source files that decide its
  contents (:func:`source_stamp`), so a change of them retires the old files;
* writes: a temporary file in the same folder, then ``os.replace``, so a
  reader sees a whole file or none and processes writing at once lose
  nothing; done by a worker thread (:func:`write_behind`, off the caller's
  path; :func:`flush` waits for it);
* damage: a file that cannot be read, fails its checks or carries another
  format or stamp is ignored; one of this format and stamp that fails its
  checks is deleted (nobody can use it) and written again when its contents
  are made again;
* bounds: each kind keeps at most so many bytes in so many files, those of
  other stamps and then the least recently used (a hit touches its file)
  deleted first when a new one is written.

Everything here is best effort: an unwritable folder only means no disk
cache. Tests point ``SCIPY_GPUQR_SCHEDULE_CACHE`` at a temporary folder or
``off``.

Tile-schedule segments
----------------------
The bucket simulation (:mod:`.bucket`) depends only on a front's tile
pattern (row-tile buckets, column tiles, column tiles to factorize) and the
tunables (bundle, pipelining, granule). :class:`PatternStore` keeps the
simulated patterns, one subfolder per set of tunables
(``b{bundle}-p{0|1}-g{granule}``):

* one *segment* file per simulation that added patterns (``seg-*.bin``): a
  magic word, a JSON header (:data:`SEGMENT_FORMAT`, the *rules stamp*
  (:func:`rules_stamp`: the bucket rules' and the record layout's sources),
  the tunables, the *keys* part's arrays (dtypes, shapes, offsets, size,
  CRC-32) and the *rows* part's record layout), the keys part (the patterns'
  buckets, counts, row and record pointers, where their rows lie, a CRC-32 of
  each pattern's rows) and the rows part (every pattern's rows as packed
  records, one after the other, each field in the narrowest integer type
  that holds it);
* a process reads every segment's header and keys once (at the first
  look-up with those tunables; again after :func:`forget`) and, on a hit,
  only the byte ranges of the patterns hit (adjacent ones in one read), so a
  look-up costs what it uses, not the whole cache;
* at most :data:`SEGMENT_MAX_BYTES` in :data:`MAX_SEGMENTS` segments per set
  of tunables.

Plan files
----------
:func:`~.sparse.build_schedule` caches its schedule per analysis object;
the *plan* (everything it makes with ``lazy=True``) is kept in one file per
matrix structure and arguments (``plans/`` in :func:`folder`):

* name: ``plan-{key}.bin``, the key a CRC-32 chain over the arguments, the
  stage plan and every analysis array the builder reads (the *fingerprint*);
* contents: a magic word, a JSON header (:data:`PLAN_FORMAT`, the stamp of
  the builder's sources, the arguments, the plan's facts, every array's
  dtype, shape and offset, the payload's size and CRC-32) and the arrays,
  each at a multiple of 64 bytes of the file: the fingerprint itself
  (compared **exactly** with the analysis' arrays on load, so a CRC
  collision cannot hand out another matrix' plan) and the plan's arrays;
* at most :data:`PLAN_MAX_BYTES` in :data:`MAX_PLANS` files.

The store knows the bytes of its entries, not the schedulers' classes: the
bucket scheduler hands :meth:`PatternStore.lookup` a function making its tile
schedules of the rows read back, and the sparse scheduler hands
:func:`save_plan` and :func:`load_plan` the functions turning a plan into
arrays and back. This module imports nothing from the schedulers.
"""

from __future__ import annotations

import json
import math
import os
import threading
import zlib
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .. import _store
from .._store import ENV, flush, folder, write_behind

__all__ = ["ENV", "folder", "source_stamp", "rules_stamp", "plan_stamp", "write_behind",
           "flush", "forget",
           "SEGMENT_FORMAT", "SEGMENT_MAX_BYTES", "MAX_SEGMENTS", "PatternStore", "store",
           "PLAN_FORMAT", "PLAN_MAX_BYTES", "MAX_PLANS", "PlanSlot", "plan_slot", "load_plan",
           "save_plan"]


# =================================================================== the storage
# (the rules live in :mod:`scipy_gpuqr._store`, shared with the analysis cache)

_HERE = Path(__file__).resolve().parent
_narrow, _unlink, _touch = _store.narrow, _store.unlink, _store.touch
_publish, _files, _bound = _store.publish, _store.files, _store.bound


def source_stamp(names) -> str:
    """A hash of this package's ``_schedule`` source files ``names`` (once per
    process); empty when they cannot be read (then no disk cache is used)."""
    return _store.source_stamp(_HERE, names)


#: the sources that decide a tile schedule (bucket rules, record layout)
_RULES_SOURCES = ("bucket.py", "tasks.py", "_native.c")
#: the sources that decide a plan (the builders, and this module's plan arrays)
_PLAN_SOURCES = ("sparse.py", "dense.py", "bucket.py", "tasks.py", "_native.c", "cache.py")


def rules_stamp() -> str:
    """The stamp of the tile-schedule segments (bucket rules, record layout)."""
    return source_stamp(_RULES_SOURCES)


def plan_stamp() -> str:
    """The stamp of the plan files (the builders' sources)."""
    return source_stamp(_PLAN_SOURCES)


# =================================================================== tile-schedule segments

#: File format version of the segments (bump when their layout changes).
SEGMENT_FORMAT = 3
#: Most bytes of segment files kept per set of tunables.
SEGMENT_MAX_BYTES = 64 << 20
#: Most segment files kept per set of tunables.
MAX_SEGMENTS = 64

_SEG_MAGIC = b"SGQRTSC3"
#: the row columns of a pattern (``TileSchedule.rcols``)
_ROWCOLS = ("type", "col", "c0", "c1", "napply", "nfrows", "fstart", "flags", "ftop",
            "vt", "vt2", "rows", "mult")
_PER_PATTERN = ("nct", "nfct", "nlaunch", "nvt")
#: the keys part's arrays (the rows part: the _ROWCOLS fields, packed)
_KEYS = ("key_b", "key_ptr") + _PER_PATTERN + ("span", "ptr_at", "row_ptr", "launch_ptr",
                                               "crc")


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

    Patterns are keyed ``(buckets as int32 bytes, nct, nfct)``. What is
    written are tile schedules as the bucket scheduler makes them (read:
    ``block.cols``, ``span``, ``nrows``, ``row_ptr``, ``launch_ptr``,
    ``nlaunch``, ``nvt``, ``nct``); what is read back is handed to the
    caller's ``make`` (see :meth:`lookup`).

    Parameters
    ----------
    path : Path
        The folder of the segments.
    tunables : (int, bool, int)
        ``(bundle, pipelining, granule)``.
    max_bytes, max_segments : int
        Bounds of the folder.
    """

    def __init__(self, path: Path, tunables: tuple, max_bytes: int = SEGMENT_MAX_BYTES,
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
        return {"format": SEGMENT_FORMAT, "stamp": rules_stamp(), "bundle": b,
                "pipelining": p, "granule": g}

    # ------------------------------------------------------------------ reading
    def _scan(self) -> None:
        if self._scanned:
            return
        self._scanned = True
        want = self._header()
        for p in _files(self.path, "seg-"):
            try:
                seg = _read_keys(p, want)
            except _Damaged:                # ours but damaged: nobody can use it
                _unlink(p)
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
        _unlink(seg.path)

    def lookup(self, keys, make: Callable) -> dict:
        """Tile schedules of the patterns ``keys`` found on disk.

        Parameters
        ----------
        keys : iterable of (bytes, int, int)
            ``(buckets as int32 bytes, nct, nfct)`` each.
        make : callable
            ``make(cols, entries)`` returns the schedules of rows read back
            together: ``cols`` the rows column by column (read-only int32
            arrays, the fields of ``TileSchedule.rcols``), ``entries`` one
            ``(span, row_ptr, launch_ptr, nlaunch, nvt, granule, nct)`` per
            pattern, ``span`` its rows in ``cols``.

        Returns
        -------
        dict
            ``key -> make``'s schedule for the keys found (a segment that
            turns out damaged when its rows are read gives none).
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
                    made = make(*_load_rows(seg, js, self.tunables[2]))
                except Exception:          # noqa: BLE001 - damaged rows: simulate again
                    self._drop(seg)
                    continue
                out.update(zip(ks, made))
                _touch(seg.path)            # used: the bound deletes it last
            return out

    def counts(self, keys) -> dict:
        """``key -> (nvt, records)`` of the patterns ``keys`` found on disk, from the
        keys part alone (read and CRC-checked at the scan): what the memory plan
        needs of a schedule, without reading its rows. A hit marks its segment used."""
        with self._lock:
            self._scan()
            out, used = {}, {}
            for k in keys:
                hit = self._index.get(k)
                if hit is None:
                    continue
                seg, j = hit
                kk = seg.keys
                out[k] = (int(kk["nvt"][j]), int(kk["launch_ptr"][int(kk["ptr_at"][j + 1]) - 1]))
                used[id(seg)] = seg.path
            for path in used.values():
                _touch(path)
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
            keys_a, rows_a = _segment_arrays([k for k, _ in new], [s for _, s in new])
            stamp = rules_stamp()
            try:
                data, rows_at, rec, crc_all, keys_a = _encode_segment(keys_a, rows_a,
                                                                      self._header())
                name = _publish(self.path, lambda fh: fh.write(data),
                                lambda tag: self.path / f"seg-{stamp[:8]}-{tag}.bin")
            except OSError:
                return False
            seg = _Segment(name, rows_at, rec, crc_all, _as_read(keys_a))
            self._register(seg)
            _bound(self.path, "seg-", name, self.max_bytes, self.max_segments,
                   current=f"seg-{stamp[:8]}-")
            return True


def _load_rows(seg, js, granule):
    """The rows of patterns ``js`` of a segment, read (adjacent patterns in one
    read, every pattern's CRC checked) into one block of columns, and each
    pattern's entry for :meth:`PatternStore.lookup`'s ``make`` (in ``js`` order)."""
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
    n = (e - a).tolist()
    pa = k["ptr_at"].tolist()
    rp, lp = k["row_ptr"], k["launch_ptr"]
    nl, nvt, nct = k["nlaunch"].tolist(), k["nvt"].tolist(), k["nct"].tolist()
    entries = [None] * len(js)
    at = 0
    for pos, (i, j) in enumerate(zip(order.tolist(), ja.tolist())):
        entries[i] = ((at, at + n[pos]), rp[pa[j]:pa[j + 1]], lp[pa[j]:pa[j + 1]], nl[j],
                      nvt[j], granule, nct[j])
        at += n[pos]
    return cols, entries


# ------------------------------------------------------------------ arrays <-> bytes

def _segment_arrays(keys, scheds):
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


def _keys_part(a, names):
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


def _encode_segment(keys_a, rows_a, header):
    """A segment's bytes, the offset of its rows part, the record dtype, the rows'
    CRC-32 and the keys (with every pattern's CRC)."""
    rec, dt = _packed(rows_a)
    raw = memoryview(rec.tobytes())
    isz = dt.itemsize
    span = keys_a["span"].tolist()
    keys_a = dict(keys_a, crc=np.array([zlib.crc32(raw[span[j] * isz:span[j + 1] * isz])
                                        for j in range(len(span) - 1)], dtype=np.int64))
    kp, km = _keys_part(keys_a, _KEYS)
    h = dict(header, keys=km, rows={"descr": _descr(dt), "count": len(rec),
                                    "crc": zlib.crc32(raw)})
    hb = json.dumps(h, sort_keys=True).encode()
    head = _SEG_MAGIC + len(hb).to_bytes(8, "little") + hb
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


def _decode_keys(payload, meta, names) -> dict:
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
        if head[:8] != _SEG_MAGIC:
            raise ValueError("not a tile-schedule segment")
        n = int.from_bytes(head[8:16], "little")
        h = json.loads(fh.read(n).decode())
        for k, v in want.items():
            if h.get(k) != v:
                raise ValueError(f"segment for another {k}")
        try:
            km = h["keys"]
            keys = _decode_keys(fh.read(km["size"]), km, _KEYS)
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


# =================================================================== plan files

#: File format version of the plan files.
PLAN_FORMAT = 1
#: Most bytes of plan files kept.
PLAN_MAX_BYTES = 256 << 20
#: Most plan files kept.
MAX_PLANS = 64

_PLAN_MAGIC = b"SGQRPLN1"
#: the analysis' front arrays the builder reads (the fingerprint)
_FRONT_ARRAYS = ("fm", "fn", "fp", "cm", "frank", "stair", "col_ptr", "parent", "child_ptr",
                 "children", "s_ptr", "rimap_ptr", "rjmap_ptr")


def _plan_folder() -> Path | None:
    d = folder()
    if d is None or not plan_stamp():
        return None
    return d / "plans"


def _fingerprint(analysis, plan, dense) -> dict:
    fs = analysis.fronts
    fp = {f"fs_{k}": np.ascontiguousarray(getattr(fs, k)) for k in _FRONT_ARRAYS
          if getattr(fs, k) is not None}
    fp["stages"] = np.asarray(plan.stages, dtype=np.int64).reshape(-1, 2)
    fp["dense_mask"] = np.asarray(dense, dtype=bool).astype(np.int8)
    return fp


def _plan_key(fp: dict, args: dict) -> str:
    """The file name's key: a CRC-32 chain over the arguments, every array's shape
    and the per-front arrays' bytes, and one over a sample of the large arrays (a
    collision only costs a rebuild: the fingerprint is compared exactly)."""
    c = zlib.crc32(json.dumps(args, sort_keys=True).encode())
    c2 = 0
    for k in sorted(fp):
        v = fp[k]
        c = zlib.crc32(f"{k}{v.dtype.str}{v.shape}".encode(), c)
        if v.nbytes <= 1 << 16:
            c = zlib.crc32(v.tobytes(), c)
        else:                                  # a sample of the large ones
            c2 = zlib.crc32(np.ascontiguousarray(v.ravel()[::61]).tobytes(), c2)
    return f"{c:08x}{c2:08x}"


class PlanSlot:
    """Where the plan of one structure and set of arguments lives (from :func:`plan_slot`)."""

    __slots__ = ("folder", "fingerprint", "path", "args")

    def __init__(self, folder, fingerprint, path, args):
        self.folder, self.fingerprint, self.path, self.args = folder, fingerprint, path, args


def plan_slot(analysis, plan, dense, args: dict) -> PlanSlot | None:
    """The plan file of this analysis, stage plan, dense-front mask and arguments
    (None: the disk cache is off, or the structure cannot be keyed).

    Parameters
    ----------
    analysis : SymbolicAnalysis
        Its ``fronts`` give the fingerprint's arrays (:data:`_FRONT_ARRAYS`).
    plan : StagePlan
        Its ``stages``.
    dense : ndarray of bool
        The dense-front mask.
    args : dict
        The builder's arguments (JSON-serializable).
    """
    try:
        d = _plan_folder()
        if d is None:
            return None
        fp = _fingerprint(analysis, plan, dense)
        return PlanSlot(d, fp, d / f"plan-{_plan_key(fp, args)}.bin", args)
    except Exception:                          # noqa: BLE001 - best effort: no cache
        return None


def load_plan(s: PlanSlot | None, decode: Callable):
    """The plan in ``s``, or None (off, missing, stale, damaged or another
    matrix').

    ``decode(arrays, facts)`` makes the plan of the arrays and the JSON facts
    :func:`save_plan`'s ``encode`` gave; any exception it raises counts as
    damage (the file is deleted).

    The file is mapped, not copied into fresh memory: a plan with its records
    takes tens of megabytes, whose copy would cost a page fault per fresh page
    and the copy itself, on the worker that reads it while a new process's
    first call imports CuPy. The mapping is private (copy-on-write), so the
    plan's arrays are as writable as those of a plan built in the process.
    """
    if s is None:
        return None
    path, fp, args = s.path, s.fingerprint, s.args
    data = _store.read_mapped(path, writable=True)
    if data is None:
        return None
    try:
        h, a = _store.decode_arrays(data, _PLAN_MAGIC, {"format": PLAN_FORMAT,
                                                        "stamp": plan_stamp(), "args": args})
        for k, v in fp.items():                # exactly this matrix' structure
            got = a.get(f"fp_{k}")                 # stored narrowed: compare values
            if got is None or not np.array_equal(got, v):
                return None
        out = decode(a, h["facts"])
    except Exception:                          # noqa: BLE001 - damaged or foreign: drop it
        _unlink(path)
        return None
    _touch(path)                               # used: the bound deletes it last
    return out


def save_plan(s: PlanSlot | None, sched, encode: Callable) -> bool:
    """Write the plan ``sched`` in ``s`` (never raises: best effort).

    ``encode(sched)`` gives ``(arrays, facts)``: a dict of integer or boolean
    arrays and a dict of JSON-serializable facts (ValueError: a plan that
    cannot be kept, nothing written).
    """
    if s is None:
        return False
    try:
        return _save_plan(s, sched, encode)
    except Exception:                          # noqa: BLE001 - best effort: not written
        return False


def _save_plan(s: PlanSlot, sched, encode) -> bool:
    d, fp, path, args = s.folder, s.fingerprint, s.path, s.args
    try:
        a, facts = encode(sched)
    except ValueError:
        return False
    arrays = {f"fp_{k}": _narrow(v) for k, v in fp.items()}
    arrays.update(a)
    header = {"format": PLAN_FORMAT, "stamp": plan_stamp(), "args": args, "facts": facts}
    try:
        _publish(d, lambda fh: _store.write_arrays(fh, _PLAN_MAGIC, arrays, header),
                 lambda tag: path)
    except OSError:
        return False
    _bound(d, "plan-", path, PLAN_MAX_BYTES, MAX_PLANS)
    return True
