"""Whole schedule plans kept on disk between processes, per sparsity pattern.

:func:`~.sparse.build_schedule` caches its schedule per analysis object, so
``refactor`` in one process gets it for free; a new process would build the
plan again (tile patterns from :mod:`.diskcache`, then the per-matrix part:
front buckets, templates, state machines, assembly records). This module
keeps the *plan* — everything :func:`~.sparse.build_schedule` makes with
``lazy=True`` — in one file per matrix structure and arguments, next to the
tile-pattern segments (``plans/`` in :func:`.diskcache.folder`; off with it).

* name: ``plan-{key}.bin``, the key a CRC-32 chain over the arguments, the
  stage plan and every analysis array the builder reads (the *fingerprint*);
* contents: a magic word, a JSON header (:data:`FORMAT`, a stamp of the
  builder's sources, the arguments, every array's dtype, shape and offset,
  the payload's size and CRC-32) and the arrays: the fingerprint itself
  (compared **exactly** with the analysis' arrays on load, so a CRC
  collision cannot hand out another matrix' plan), the templates' element
  rows, the stages' factorization blocks, assembly records and launch
  data;
* read on a miss of the per-analysis cache, written atomically after a
  build that did not come from it (by the cache writer thread,
  :func:`.diskcache.write_behind`: off the path to launch 0); a file that fails any check is ignored
  (and deleted); at most :data:`MAX_BYTES` in :data:`MAX_FILES` files, the
  least recently used (a hit touches its file) deleted first.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import zlib
from pathlib import Path

import numpy as np

from . import diskcache

__all__ = ["FORMAT", "MAX_BYTES", "MAX_FILES", "Slot", "slot", "load", "save"]

#: File format version.
FORMAT = 1
#: Most bytes of plan files kept.
MAX_BYTES = 128 << 20
#: Most plan files kept.
MAX_FILES = 64

_MAGIC = b"SGQRPLN1"
_SOURCES = ("sparse.py", "dense.py", "bucket.py", "tasks.py", "_native.c", "plancache.py")
#: the analysis' front arrays the builder reads
_FRONT_ARRAYS = ("fm", "fn", "fp", "cm", "frank", "stair", "col_ptr", "parent", "child_ptr",
                 "children", "s_ptr", "rimap_ptr", "rjmap_ptr")


def _folder() -> Path | None:
    d = diskcache.folder()
    if d is None or not diskcache.source_stamp(_SOURCES):
        return None
    return d / "plans"


def _fingerprint(analysis, plan, dense) -> dict:
    fs = analysis.fronts
    fp = {f"fs_{k}": np.ascontiguousarray(getattr(fs, k)) for k in _FRONT_ARRAYS
          if getattr(fs, k) is not None}
    fp["stages"] = np.asarray(plan.stages, dtype=np.int64).reshape(-1, 2)
    fp["dense_mask"] = np.asarray(dense, dtype=bool).astype(np.int8)
    return fp


def _key(fp: dict, args: dict) -> str:
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


# ------------------------------------------------------------------ arrays <-> file

_ALIGN = 64


def _write(fh, arrays: dict, header: dict) -> None:
    """Header, then every array at a multiple of 64 bytes of the file (read back
    as aligned views, no copies); the arrays are written from their own memory."""
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
    fh.write(_MAGIC + len(hb).to_bytes(8, "little") + hb)
    for mv in views:
        fh.write(mv)


def _decode(data, want: dict):
    if bytes(data[:8]) != _MAGIC:
        raise ValueError("not a plan file")
    n = int.from_bytes(data[8:16], "little")
    h = json.loads(bytes(data[16:16 + n]).decode())
    for k, v in want.items():
        if h.get(k) != v:
            raise ValueError(f"plan file for another {k}")
    payload = memoryview(data)[16 + n:]
    if len(payload) != h["size"] or zlib.crc32(payload) != h["crc"]:
        raise ValueError("plan file damaged")
    a = {}
    for name, dt, shape, off in h["arrays"]:
        dt = np.dtype(dt)
        if dt.kind not in "iub":
            raise ValueError("bad dtype")
        a[name] = np.frombuffer(payload, dtype=dt, count=math.prod(shape),
                                offset=off).reshape(shape)
    return h, a


# ------------------------------------------------------------------ plan <-> arrays

def _dict_arrays(d: dict):
    items = sorted(d.items())
    return np.array([k for k, _ in items], dtype=np.int64), \
        np.array([v for _, v in items], dtype=np.int64)


def _arrays_of(sched) -> tuple:
    """The arrays and JSON facts of a lazily built SparseSchedule."""
    st0 = sched.stages[0]
    ctx = st0._maker.ctx
    a = {"rows": ctx.rows, "mult": ctx.mult, "vt_base": sched.vt_base, "nfact": sched.nfact}
    a["dense_f"], a["dense_L"] = _dict_arrays(sched.dense)
    stages = []
    for i, st in enumerate(sched.stages):
        m = st._maker
        if m.ctx is not ctx:
            raise ValueError("stages with different templates")
        for j, v in enumerate((m.blk_L, m.blk_rstart, m.blk_rlen, m.blk_len, m.blk_front)):
            a[f"s{i}_blk{j}"] = v
        a[f"s{i}_asm"] = m.asm
        a[f"s{i}_asm_L"] = np.repeat(np.arange(len(m.asm_ptr) - 1, dtype=np.int64),
                                     np.diff(m.asm_ptr))
        a[f"s{i}_foff"] = st.foff
        for name in ("carried", "finish", "dense", "dense_join"):
            a[f"s{i}_{name}_k"], a[f"s{i}_{name}_v"] = _dict_arrays(getattr(st, name))
        stages.append({"fronts": list(st.fronts), "pool_size": int(st.pool_size),
                       "s_range": list(st.s_range), "nlaunch": int(st.nlaunch)})
    facts = {"stages": stages, "vt_size": int(sched.vt_size),
             "critical_path": int(sched.critical_path), "granule": int(ctx.granule),
             "tile": int(ctx.tile)}
    return a, facts


def _schedule_of(a: dict, facts: dict, fs, args: dict):
    from .sparse import SparseSchedule, StageSchedule, _StageMaker, _Templates
    from .tasks import TASK_DTYPE
    ctx = object.__new__(_Templates)
    ctx.rows, ctx.mult = a["rows"], a["mult"]
    ctx.base = None
    ctx.granule, ctx.tile = facts["granule"], facts["tile"]
    nfact = a["nfact"]
    ctx.fm = fs.fm.astype(np.int32)
    ctx.fn = fs.fn.astype(np.int32)
    ctx.nfact = nfact.astype(np.int32)
    ctx.vt_base = a["vt_base"]
    stages = []
    for i, info in enumerate(facts["stages"]):
        blk = tuple(a[f"s{i}_blk{j}"] for j in range(5))
        asm = a[f"s{i}_asm"].view(TASK_DTYPE).ravel()
        d = {name: dict(zip(a[f"s{i}_{name}_k"].tolist(), a[f"s{i}_{name}_v"].tolist()))
             for name in ("carried", "finish", "dense", "dense_join")}
        maker = _StageMaker(ctx, a[f"s{i}_foff"], blk, asm, a[f"s{i}_asm_L"], info["nlaunch"])
        stages.append(StageSchedule(fronts=tuple(info["fronts"]), launch_ptr=maker.launch_ptr,
                                    foff=a[f"s{i}_foff"], carried=d["carried"],
                                    pool_size=info["pool_size"],
                                    s_range=tuple(info["s_range"]), finish=d["finish"],
                                    dense=d["dense"], dense_join=d["dense_join"],
                                    _maker=maker))
    return SparseSchedule(stages=stages, tile=args["tile"], bundle=args["bundle"],
                          granule=args["granule"], pipelining=args["pipelining"],
                          vt_base=a["vt_base"], vt_size=facts["vt_size"], nfact=nfact,
                          critical_path=facts["critical_path"], seconds=0.0,
                          dense_flops=args["dense_flops"],
                          dense=dict(zip(a["dense_f"].tolist(), a["dense_L"].tolist())))


# ------------------------------------------------------------------ load / save

def _where(analysis, plan, dense, args):
    d = _folder()
    if d is None:
        return None, None, None
    fp = _fingerprint(analysis, plan, dense)
    return d, fp, d / f"plan-{_key(fp, args)}.bin"


class Slot:
    """Where the plan of one structure and set of arguments lives (from :func:`slot`)."""

    __slots__ = ("folder", "fingerprint", "path", "args")

    def __init__(self, folder, fingerprint, path, args):
        self.folder, self.fingerprint, self.path, self.args = folder, fingerprint, path, args


def slot(analysis, plan, dense, args: dict) -> Slot | None:
    """The plan file of this analysis, stage plan, dense-front mask and arguments
    (None: the disk cache is off, or the structure cannot be keyed)."""
    try:
        d, fp, path = _where(analysis, plan, dense, args)
    except Exception:                          # noqa: BLE001 - best effort: no cache
        return None
    return None if path is None else Slot(d, fp, path, args)


def load(s: Slot | None, fronts):
    """The plan in ``s``, or None (off, missing, stale, damaged or another
    matrix'); ``fronts``: the analysis' fronts."""
    if s is None:
        return None
    path, fp, args = s.path, s.fingerprint, s.args
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            buf = np.empty(size + _ALIGN, dtype=np.uint8)      # an aligned buffer
            at = -buf.ctypes.data % _ALIGN
            data = memoryview(buf[at:at + size])
            if fh.readinto(data) != size:
                return None
    except OSError:
        return None
    try:
        h, a = _decode(data, {"format": FORMAT, "stamp": diskcache.source_stamp(_SOURCES),
                              "args": args})
        for k, v in fp.items():                # exactly this matrix' structure
            got = a.get(f"fp_{k}")                 # stored narrowed: compare values
            if got is None or not np.array_equal(got, v):
                return None
        out = _schedule_of(a, h["facts"], fronts, args)
    except Exception:                          # noqa: BLE001 - damaged or foreign: drop it
        try:
            path.unlink()
        except OSError:
            pass
        return None
    try:
        os.utime(path)                         # used: the bound deletes it last
    except OSError:
        pass
    return out


def save(s: Slot | None, sched) -> bool:
    """Write the plan ``sched`` (built lazily, nothing materialized needed) in ``s``."""
    if s is None:
        return False
    try:
        return _save(s, sched)
    except Exception:                          # noqa: BLE001 - best effort: not written
        return False


def _save(s: Slot, sched) -> bool:
    d, fp, path, args = s.folder, s.fingerprint, s.path, s.args
    try:
        a, facts = _arrays_of(sched)
    except ValueError:
        return False
    arrays = {f"fp_{k}": diskcache._narrow(v) for k, v in fp.items()}
    arrays.update(a)
    header = {"format": FORMAT, "stamp": diskcache.source_stamp(_SOURCES), "args": args,
              "facts": facts}
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix="tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                _write(fh, arrays, header)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        return False
    _bound(d, path)
    return True


def _bound(d: Path, keep: Path) -> None:
    files = []
    try:
        entries = [p for p in d.iterdir() if p.name.startswith("plan-") and p.suffix == ".bin"]
    except OSError:
        return
    for p in entries:
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime_ns, p.name, p, st.st_size))
    files.sort()
    total = sum(f[3] for f in files)
    n = len(files)
    for _, _, p, size in files:
        if total <= MAX_BYTES and n <= MAX_FILES:
            break
        if p == keep:
            continue
        try:
            p.unlink()
        except OSError:
            continue
        total -= size
        n -= 1
