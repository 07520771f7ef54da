"""``Q``'s replay plan kept on disk between processes and mapped back without copies.

The replay plan (:func:`.solve.build_replay_plan`: every kept reflector's
``TASK_APPLY_QT`` record, the levels, the fronts' row maps) depends on the
sparsity pattern and the schedule, not on the values. Within a process it is
kept with the schedule (``SparseSchedule.extras``, per pattern); a new
process would build it again at its first solve. This store keeps its arrays
on disk so that such a solve maps them instead.

Rules (those of :mod:`scipy_gpuqr._store`, in its folder, subfolder
``replays``):

* what: the plan of a factorization whose analysis has a ``pattern_key``
  (without its dense-front objects: those are the factorization's own and
  attached to the levels by the caller);
* name: ``rpl-{stamp}-{key}.bin``; the stamp a hash of the sources that decide
  the plan (the replay builder, the driver keeping the records, R's layout
  making the row maps, the plan made while the stage runs) combined with the
  schedule store's stamps (the scheduler's and the bucket rules' sources); the
  key a hash of the pattern key and of the schedule's facts (tile, bundle,
  granule, pipelining, dense threshold, stages, launches, fronts' places, dense
  fronts, each front's kept records' launches), so that another memory budget,
  staging or dense-front threshold names another file;
* checks on load: the format, the stamp and the facts in the header, then
  every fingerprint array (the analysis arrays the scheduler and R's layout
  read, and the schedule's facts above) compared **exactly**, and the
  file's CRC-32 (a damaged or stale file of this stamp is deleted and the
  plan built again; a file of another analysis or schedule under the same
  name is left alone and not used);
* writes: behind the caller (:func:`scipy_gpuqr._store.write_behind`);
* bounds: at most :data:`MAX_BYTES` in :data:`MAX_FILES` files; a plan larger
  than :data:`MAX_FILE_BYTES` is not kept.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import numpy as np

from ... import _store
from ..._schedule import cache as schedule_store
from .rlayout_store import analysis_fingerprint

__all__ = ["FORMAT", "MAX_BYTES", "MAX_FILES", "MAX_FILE_BYTES", "ReplaySlot", "slot",
           "load", "save", "folder"]

#: File format version (bump when the layout of the file changes).
FORMAT = 1
#: Most bytes of replay files kept.
MAX_BYTES = 2 << 30
#: Most replay files kept.
MAX_FILES = 16
#: Plans whose file would exceed this are not kept.
MAX_FILE_BYTES = 1 << 30

_MAGIC = b"SGQRRPL1"
_HERE = Path(__file__).resolve().parent
#: The sources that decide a plan besides the scheduler's (whose stamps are added).
_SOURCES = ("solve.py", "replay_store.py", "rlayout_store.py", "driver.py", "stage_loop.py",
            "rlayout.py", "replay_ahead.py")
#: Front arrays the scheduler and R's layout read (the fingerprint's).
_FRONT = ("fm", "fn", "fp", "cm", "frank", "stair", "col_ptr", "cols", "parent", "child_ptr",
          "children", "s_ptr", "arow_ptr", "arow_local", "rimap_ptr", "rimap", "rjmap_ptr")
#: The plan's arrays in a file.
PLAN_ARRAYS = ("records", "rowmap", "level_ptr", "level_stage", "dense_level", "dense_ptr",
               "dense_front")


def _stamp() -> str:
    mine = _store.source_stamp(_HERE, _SOURCES)
    sched = schedule_store.plan_stamp()
    rules = schedule_store.rules_stamp()
    if not (mine and sched and rules):
        return ""
    return hashlib.sha1(f"{mine}:{sched}:{rules}".encode()).hexdigest()[:20]


def folder() -> Path | None:
    """The replay files' folder (None: no disk cache)."""
    d = _store.folder()
    if d is None or not _stamp():
        return None
    return d / "replays"


class ReplaySlot:
    """Where the plan of one factorization's pattern and schedule lives
    (from :func:`slot`): the file, the facts of the header and the fingerprint."""

    __slots__ = ("path", "facts", "fingerprint", "analysis")

    def __init__(self, path, facts, fingerprint, analysis):
        self.path, self.facts, self.fingerprint, self.analysis = path, facts, fingerprint, analysis


def _schedule_facts(qr) -> tuple:
    """``(facts, arrays)``: the schedule's facts the plan depends on (JSON) and its
    arrays (launches, fronts' places, dense fronts, kept records' launches)."""
    sched = qr.schedule
    dense = getattr(qr, "_dense", {}) or {}
    dflops = getattr(sched, "dense_flops", None)
    facts = {"m": int(qr.shape[0]), "n": int(qr.shape[1]), "tile": int(sched.tile),
             "bundle": int(sched.bundle), "granule": int(getattr(sched, "granule", 0)),
             "pipelining": bool(getattr(sched, "pipelining", True)),
             "dense_flops": None if dflops is None else float(dflops),
             "stages": [[int(a), int(b)] for a, b in (st.fronts for st in sched.stages)],
             "nlaunch": [int(st.nlaunch) for st in sched.stages],
             "vt_size": int(sched.vt_size)}
    launches = qr._front_launch
    counts = np.fromiter((len(x) for x in launches), dtype=np.int64, count=len(launches))
    kl = (np.concatenate(launches).astype(np.int64, copy=False) if len(launches)
          else np.zeros(0, np.int64))
    arrays = {"launch_base": np.asarray(qr._launch_base, dtype=np.int64),
              "front_loc": np.asarray(qr._front_loc, dtype=np.int64).reshape(-1, 2),
              "dense": np.array(sorted((int(f), int(d.after_launch)) for f, d in dense.items()),
                                dtype=np.int64).reshape(-1, 2),
              "kept_count": counts, "kept_launch": kl}
    return facts, arrays


def slot(qr) -> ReplaySlot | None:
    """The file of ``qr``'s replay plan (a :class:`~.driver.GpuQR`), or None (no disk
    cache, an analysis without a pattern key). Never raises."""
    try:
        analysis = getattr(qr, "analysis", None)
        key = getattr(analysis, "pattern_key", None)
        if key is None or getattr(qr, "schedule", None) is None:
            return None
        d = folder()
        if d is None:
            return None
        facts, arrays = _schedule_facts(qr)
        h = hashlib.sha1(str(key).encode())
        h.update(json.dumps(facts, sort_keys=True).encode())
        for k in sorted(arrays):
            v = np.ascontiguousarray(arrays[k])
            h.update(f"{k}{v.shape}{zlib.crc32(v):08x}".encode())
        path = d / f"rpl-{_stamp()[:12]}-{h.hexdigest()[:24]}.bin"
        return ReplaySlot(path, facts, arrays, analysis)
    except Exception:                          # noqa: BLE001 - best effort: no cache
        return None


def _want(s: ReplaySlot) -> dict:
    return {"format": FORMAT, "stamp": _stamp(), "facts": s.facts}


def _fingerprint(s: ReplaySlot) -> dict:
    fp = dict(analysis_fingerprint(s.analysis, _FRONT))     # R's layout's analysis arrays
    fp.update({"sc_" + k: v for k, v in s.fingerprint.items()})
    return fp


def load(s: ReplaySlot | None, make):
    """The plan stored for ``s``, or None (missing, stale, damaged or another
    analysis' or schedule's).

    ``make(arrays)`` builds the plan of the arrays :func:`plan_arrays` gave
    (read-only views of the mapped file, keys :data:`PLAN_ARRAYS`); any
    exception it raises counts as damage (the file is deleted).
    """
    if s is None:
        return None
    return _store.load_fingerprinted(s.path, _MAGIC, _want(s), lambda: _fingerprint(s),
                                     lambda h, a: make({k: a[k] for k in PLAN_ARRAYS}))


def save(s: ReplaySlot | None, arrays: dict) -> bool:
    """Write a plan's ``arrays`` (:data:`PLAN_ARRAYS`: integer arrays, the records
    as bytes) at ``s`` with its fingerprint (never raises: best effort)."""
    if s is None:
        return False
    try:
        plan = {k: arrays[k] for k in PLAN_ARRAYS}
    except KeyError:
        return False
    return _store.save_fingerprinted(
        s.path, _MAGIC, _want(s), lambda: _fingerprint(s), plan, prefix="rpl-",
        current=f"rpl-{_stamp()[:12]}", max_file_bytes=MAX_FILE_BYTES, max_bytes=MAX_BYTES,
        max_files=MAX_FILES)
