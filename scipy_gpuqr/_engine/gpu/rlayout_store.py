"""R's layout kept on disk between processes and mapped back without copies.

A new process factorizing a known pattern finds its analysis and its
schedule's plan on disk (:mod:`scipy_gpuqr._symbolic.analysis_cache`,
:mod:`scipy_gpuqr._schedule.cache`); R's layout (:mod:`.rlayout`) is the
per-pattern object left: R's row indices and the one-stage gather index, two
arrays of nnz(R) entries each. Building them is cheap arithmetic but writes
every entry into fresh memory, whose first touch costs most of the time;
mapping a file of them costs neither (the page cache is mapped, read-only,
as the layout's arrays already are).

Rules (those of :mod:`scipy_gpuqr._store`, in its folder, subfolder
``rlayouts``):

* what: layouts of analyses with a ``pattern_key`` once their one-stage
  gather map was made (the usual one-stage factorization); the file holds the
  layout's arrays, the map, each front's row slots and a fingerprint of every
  analysis array the builder reads, compared **exactly** on load;
* name: ``lay-{stamp}-{key}.bin``, the stamp a hash of the builder's sources
  (``rlayout.py`` and this module), the key a hash of the pattern key;
* writes: behind the caller (:func:`scipy_gpuqr._store.write_behind`);
* reads: the file mapped (:func:`scipy_gpuqr._store.read_mapped`), its CRC-32
  checked (a damaged or stale file is deleted and made again);
* bounds: at most :data:`MAX_BYTES` in :data:`MAX_FILES` files; a layout
  larger than :data:`MAX_FILE_BYTES` is not kept.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ... import _store

__all__ = ["FORMAT", "MAX_BYTES", "MAX_FILES", "MAX_FILE_BYTES", "slot", "stored", "load",
           "save", "folder", "analysis_fingerprint"]

#: File format version (bump when the layout of the file changes).
FORMAT = 1
#: Most bytes of layout files kept.
MAX_BYTES = 4 << 30
#: Most layout files kept.
MAX_FILES = 16
#: Layouts whose file would exceed this are not kept.
MAX_FILE_BYTES = 2 << 30

_MAGIC = b"SGQRLAY1"
_HERE = Path(__file__).resolve().parent
_SOURCES = ("rlayout.py", "rlayout_store.py")
#: Front arrays the layout builder reads (the fingerprint's).
_FRONT = ("fm", "fn", "frank", "col_ptr", "cols", "arow_ptr", "arow_local", "child_ptr",
          "children", "rimap_ptr", "rimap")
#: Analysis arrays it reads (those present).
_ANALYSIS = ("rowperm", "r1_ptr", "r1_cols", "r1_nz", "r1_pivot")


def _stamp() -> str:
    return _store.source_stamp(_HERE, _SOURCES)


def folder() -> Path | None:
    """The layout files' folder (None: no disk cache)."""
    d = _store.folder()
    if d is None or not _stamp():
        return None
    return d / "rlayouts"


def slot(analysis) -> Path | None:
    """The file of ``analysis``' layout, or None (no disk cache, no pattern key)."""
    key = getattr(analysis, "pattern_key", None)
    if key is None:
        return None
    try:
        d = folder()
    except Exception:                          # noqa: BLE001 - best effort: no cache
        return None
    if d is None:
        return None
    h = hashlib.sha1(str(key).encode()).hexdigest()[:24]
    return d / f"lay-{_stamp()[:12]}-{h}.bin"


def stored(analysis) -> bool:
    """Whether a file for ``analysis``' layout exists (not read: :func:`load`
    checks it). Never raises."""
    try:
        path = slot(analysis)
        return path is not None and path.is_file()
    except Exception:                          # noqa: BLE001 - best effort: no cache
        return False


def analysis_fingerprint(analysis, front_keys=_FRONT, analysis_keys=_ANALYSIS) -> dict:
    """The arrays of ``analysis`` a stored file was made from: its fronts'
    ``front_keys``, its own ``analysis_keys`` (those present) and its sizes. A
    file is used only where they are equal (a pattern key's collision, or an
    analysis of other parameters under the same key, is then refused)."""
    fs = analysis.fronts
    fp = {}
    for k in front_keys:
        v = getattr(fs, k, None)
        if v is not None:
            fp["fs_" + k] = np.ascontiguousarray(v)
    for k in analysis_keys:
        v = getattr(analysis, k, None)
        if v is not None:
            fp["an_" + k] = np.ascontiguousarray(v)
    fp["scalars"] = np.array([int(analysis.m), int(analysis.n),
                              int(getattr(analysis, "n1rows", 0) or 0), int(fs.nfronts)],
                             dtype=np.int64)
    return fp


def _want():
    return {"format": FORMAT, "stamp": _stamp()}


def load(path: Path | None, analysis, make):
    """The layout stored at ``path`` for ``analysis``, or None (missing, stale,
    damaged or another analysis').

    ``make(arrays, facts)`` builds the layout of the arrays (read-only views of
    the mapped file) and the facts :func:`save` was given; any exception it
    raises counts as damage (the file is deleted).
    """
    return _store.load_fingerprinted(path, _MAGIC, _want(),
                                     lambda: analysis_fingerprint(analysis),
                                     lambda h, a: make(a, h["facts"]))


def save(path: Path | None, analysis, arrays: dict, facts: dict) -> bool:
    """Write a layout's ``arrays`` (integer arrays) and JSON ``facts`` at ``path``
    with ``analysis``' fingerprint (never raises: best effort)."""
    return _store.save_fingerprinted(
        path, _MAGIC, dict(_want(), facts=facts), lambda: analysis_fingerprint(analysis),
        arrays, prefix="lay-", current=f"lay-{_stamp()[:12]}", max_file_bytes=MAX_FILE_BYTES,
        max_bytes=MAX_BYTES, max_files=MAX_FILES)
