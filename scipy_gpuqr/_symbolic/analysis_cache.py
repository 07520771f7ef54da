"""Symbolic analyses kept per sparsity pattern: in memory (per process) and on disk.

The symbolic analysis depends on the pattern of A and the analysis options,
not on A's values (the one exception, ``singleton_tol``, reads which entries
exceed the tolerance, and that mask is part of the key). A pattern analysed
once is not analysed again: :func:`~scipy_gpuqr._symbolic.analyze` asks this
cache first (:func:`key`, :func:`lookup`) and hands it what it made
(:func:`keep`).

Key
---
A BLAKE2b digest (128 bits) of: the shape and entry count, the options
(ordering, the given ``colperm``'s values, ``max_gpu_memory``, ``itemsize``,
the amalgamation parameters, ``singletons``, ``singleton_tol`` and, with a
tolerance, the mask of the entries above it), the analysis code's stamp
(:func:`code_stamp`: its sources, the COLAMD wrapper's, the package version)
and the ordering library that would run (which COLAMD, AMD or METIS is
installed, or its fallback). The pattern itself (the canonical CSC's
``indptr`` and ``indices`` as int32 where they fit, else int64) enters through CRC-32 checksums, which
are cheap; they only spread the entries: a hit is confirmed by comparing
the pattern **exactly** with the one the analysis holds (``a_indptr``,
``a_indices``), so a checksum collision costs a new analysis, never another
pattern's.

Memory
------
One bounded least-recently-used table per process (:class:`AnalysisLRU`,
:data:`MEMORY_ENTRIES` analyses and :data:`MEMORY_BYTES` bytes of arrays at
most; :func:`clear` empties it). A hit returns a new
:class:`~scipy_gpuqr._symbolic.SymbolicAnalysis` sharing the cached one's
arrays, which are read-only (every analysis' arrays are: an analysis is never
changed in place), with ``timings`` saying what the look-up cost.

Disk
----
Entries live in the disk cache store of the schedules
(:mod:`scipy_gpuqr._store`: ``$SCIPY_GPUQR_SCHEDULE_CACHE``, ``off`` for
none, else ``tile_schedules`` in the package cache folder), subfolder
``analyses/``, one file per key, ``an-{stamp}-{key}.bin``: an array file
(:func:`scipy_gpuqr._store.write_arrays`: a JSON header with the scalar
fields, the stage plan and the amalgamation parameters; every array at a
multiple of 64 bytes; a CRC-32 of them all), written atomically by the
store's writer thread, only for matrices of at least :data:`DISK_MIN_NNZ`
entries (a smaller analysis costs about what reading a file does), at most
:data:`DISK_MAX_BYTES` in :data:`MAX_DISK_FILES` files (other stamps, then the
least recently used, deleted first). A file that fails its checks is
deleted; one of another kind, format, stamp or key is ignored (and
replaced when this key's analysis is written). A hit maps the file
(:func:`scipy_gpuqr._store.read_mapped`): the arrays are read-only views of
the page cache, checked by one pass of the CRC, instead of a copy into
fresh memory first (a new process's first hit on grid 40³, 35 MB: the copy
and its page faults cost more than the check).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import threading
import zlib
from pathlib import Path

import numpy as np
import scipy

from .. import _store
from .._bounded_lru import BoundedLRU
from .._mapped_files import mapped_paths
from .._cpu._libs import LibraryNotFound, find_library
from .._cpu.colamd import colamd_available
from .._version import __version__
from .fronts import Amalgamation, FrontStructure
from .staging import StagePlan

__all__ = ["MEMORY_ENTRIES", "MEMORY_BYTES", "DISK_FORMAT", "DISK_MAX_BYTES",
           "MAX_DISK_FILES", "DISK_MIN_NNZ", "AnalysisKey", "AnalysisLRU", "key", "lookup",
           "keep", "clear", "flush", "folder", "code_stamp", "freeze"]

#: Most analyses the per-process table keeps.
MEMORY_ENTRIES = 8
#: Most bytes of arrays the per-process table keeps.
MEMORY_BYTES = 512 << 20
#: File format version of the disk entries.
DISK_FORMAT = 1
#: Most bytes of disk entries kept.
DISK_MAX_BYTES = 512 << 20
#: Most disk entries kept.
MAX_DISK_FILES = 64
#: Matrices with fewer entries are kept in memory only.
DISK_MIN_NNZ = 1 << 14

_MAGIC = b"SGQRANA1"
_SUBFOLDER = "analyses"
_HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ stamps

def code_stamp() -> str:
    """A hash of the sources that decide an analysis (this folder's modules, the
    COLAMD wrapper, the package version); made once per process, empty when a
    source cannot be read (then nothing is kept on disk)."""
    return _store.source_stamp(_HERE, _stamp_sources())


@functools.lru_cache(maxsize=1)
def _stamp_sources() -> tuple:
    """The files :func:`code_stamp` hashes, relative to this folder (the folder is
    listed once per process, as the stamp is made once)."""
    names = sorted(p.name for p in _HERE.glob("*.py"))
    return tuple(names) + ("../_cpu/colamd.py", "../_cpu/_libs.py", "../_version.py")


_TAGS: dict = {}
_TAGS_LOCK = threading.Lock()


class _LinkMap(ctypes.Structure):
    """The head of glibc's ``struct link_map`` (``<link.h>``)."""
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


#: ``dlinfo`` request for the library's ``struct link_map``.
_RTLD_DI_LINKMAP = 2


def _loaded_path(soname: str) -> str | None:
    """The file the dynamic loader opened for ``soname`` (symbolic links resolved,
    as the kernel's mappings name it), asked of the loader (``dlinfo``:
    microseconds), or None where it cannot say (no ``dlinfo``, a name without a
    path)."""
    try:
        dlinfo = ctypes.CDLL(None).dlinfo
        lib = ctypes.CDLL(soname)
        head = ctypes.POINTER(_LinkMap)()
        if dlinfo(ctypes.c_void_p(lib._handle), _RTLD_DI_LINKMAP, ctypes.byref(head)) != 0:
            return None
        name = head.contents.l_name
    except (OSError, AttributeError, ValueError):
        return None
    return os.path.realpath(os.fsdecode(name)) if name else None


def _library_file(soname: str) -> str:
    """The file the loader mapped for ``soname`` (its full version in the name)
    and its size; the soname alone where the mappings cannot be read. The
    loader is asked first (``/proc/self/maps`` of a process with CUDA loaded
    lists thousands of mappings: tens of milliseconds to read)."""
    base = Path(soname).name
    path = _loaded_path(soname)
    if path and Path(path).name.startswith(base):
        try:
            return f"{Path(path).name}:{Path(path).stat().st_size}"
        except OSError:
            pass
    try:
        for path in mapped_paths(base):
            if Path(path).name.startswith(base):
                return f"{Path(path).name}:{Path(path).stat().st_size}"
    except OSError:
        pass
    return base


def _ordering_tag(ordering: str, fixed: bool) -> str:
    """What would compute the fill-reducing order: the library file, or the
    fallback (made once per process and ordering)."""
    if fixed:
        return "fixed"
    got = _TAGS.get(ordering)
    if got is not None:
        return got
    colamd = (f"colamd:{_library_file(find_library('colamd'))}" if colamd_available()[0]
              else f"rcm:scipy-{scipy.__version__}")
    if ordering == "amd":
        try:
            got = f"amd:{_library_file(find_library('amd'))}"
        except LibraryNotFound:
            got = colamd
    elif ordering == "metis":
        try:
            got = f"metis:{_library_file(find_library('metis'))}"
        except LibraryNotFound:
            got = colamd
    else:
        got = colamd
    with _TAGS_LOCK:
        _TAGS[ordering] = got
    return got


# ------------------------------------------------------------------ the key

@dataclasses.dataclass(frozen=True, eq=False)
class AnalysisKey:
    """Where the analysis of one pattern and set of options lives.

    Attributes
    ----------
    digest : str
        The key (32 hex digits).
    shape : tuple
    indptr, indices : ndarray
        The caller's canonical pattern (compared exactly on a hit; not kept).
    nnz : int
    """

    digest: str
    shape: tuple
    indptr: np.ndarray
    indices: np.ndarray
    nnz: int


def _digest(a) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).digest()


def key(shape, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None,
        options: dict) -> AnalysisKey | None:
    """The key of a canonical CSC pattern (sorted indices, no duplicates) and the
    options of :func:`~scipy_gpuqr._symbolic.analyze`; None when the options
    cannot be keyed (the analysis then reports what is wrong with them).

    ``data`` is read only with ``singleton_tol`` (which entries exceed it).
    """
    try:
        fixed = options["colperm"] is not None or options["ordering"] in ("given", "natural")
        am = options["amalgamation"]
        if not isinstance(am, Amalgamation):
            return None
        facts = (int(shape[0]), int(shape[1]), int(len(indices)), str(options["ordering"]),
                 (None if options["max_gpu_memory"] is None
                  else int(options["max_gpu_memory"])),
                 int(options["itemsize"]), bool(options["singletons"]),
                 (None if options["singleton_tol"] is None
                  else repr(float(options["singleton_tol"]))),
                 _ordering_tag(str(options["ordering"]), fixed), code_stamp(),
                 (tuple(repr(x) for x in am.nrelax), tuple(repr(x) for x in am.zrelax),
                  repr(am.enabled)))
        h = _head_hash(*facts).copy()
        colperm = options["colperm"]
        if colperm is not None:
            perm = np.asarray(colperm)
            if perm.ndim != 1 or not np.issubdtype(perm.dtype, np.integer):
                return None
            h.update(b"colperm" + _digest(perm.astype("<i8", copy=False)))
        if options["singleton_tol"] is not None:
            if data is None:
                return None
            above = np.abs(data) > float(options["singleton_tol"])
            h.update(b"mask" + _digest(np.packbits(above)))
        small = max(int(shape[0]), len(indices)) < 2**31     # every index fits in int32
        ip, ix = _narrow(indptr, small), _narrow(indices, small)
        h.update(zlib.crc32(ip).to_bytes(4, "little") + zlib.crc32(ix).to_bytes(4, "little"))
    except (TypeError, ValueError, KeyError, OverflowError):
        return None
    return AnalysisKey(h.hexdigest(), (int(shape[0]), int(shape[1])), indptr, indices,
                       int(len(indices)))


@functools.lru_cache(maxsize=64)
def _head_hash(m: int, n: int, nnz: int, ordering: str, max_gpu_memory, itemsize: int,
               singletons: bool, singleton_tol, order_by: str, code: str, amalgamation: tuple):
    """The key's hash over its facts (sizes, options, what computes the order, the code
    stamp and version), before the pattern: made once per distinct set of facts (the
    text of every fact is an argument; the version is the package's). Callers update a
    copy. ``amalgamation``: the reprs of its ``nrelax``, ``zrelax`` and ``enabled``."""
    head = {
        "m": m, "n": n, "nnz": nnz, "ordering": ordering, "max_gpu_memory": max_gpu_memory,
        "itemsize": itemsize, "singletons": singletons, "singleton_tol": singleton_tol,
        "order_by": order_by, "code": code, "version": __version__,
        "amalgamation": [list(amalgamation[0]), list(amalgamation[1]), amalgamation[2]],
    }
    # the facts' repr in key order: plain values only (JSON's encoder costs more)
    return hashlib.blake2b(repr(sorted(head.items())).encode(), digest_size=16)


def _narrow(a, small: bool) -> np.ndarray:
    """An index array as little-endian int32 when ``small`` (its values fit:
    the usual SciPy index type, no copy then), else int64: the same bytes
    for the same values whatever the caller's index type (a value beyond the
    bound only spreads the key; a hit compares the pattern exactly)."""
    a = np.asarray(a)
    want = np.dtype("<i4") if small else np.dtype("<i8")
    return np.ascontiguousarray(a) if a.dtype == want else a.astype(want)


def _matches(k: AnalysisKey, an) -> bool:
    """Whether ``an`` was made for exactly ``k``'s pattern."""
    return ((an.m, an.n) == k.shape and len(an.a_indices) == k.nnz
            and np.array_equal(an.a_indptr, k.indptr) and np.array_equal(an.a_indices, k.indices))


# ------------------------------------------------------------------ memory

def _arrays_of(an) -> list:
    out = [v for v in vars(an).values() if isinstance(v, np.ndarray)]
    out += [v for v in vars(an.fronts).values() if isinstance(v, np.ndarray)]
    return out


def freeze(an):
    """Make every array of an analysis read-only (it is shared); returns it."""
    for a in _arrays_of(an):
        a.flags.writeable = False
    return an


def _nbytes(an) -> int:
    seen, total = set(), 0
    for a in _arrays_of(an):
        base = a if a.base is None else a.base
        if id(base) not in seen:
            seen.add(id(base))
            total += int(getattr(base, "nbytes", a.nbytes))
    return total


class AnalysisLRU(BoundedLRU):
    """A bounded least-recently-used table ``digest -> analysis`` (thread-safe).

    Parameters
    ----------
    max_entries : int
    max_bytes : int
        Bounds of the table: the least recently used entries leave first; an
        analysis larger than ``max_bytes`` is not kept.
    """

    def __init__(self, max_entries: int = MEMORY_ENTRIES, max_bytes: int = MEMORY_BYTES):
        super().__init__(max_entries, max_bytes, _nbytes)


_MEMORY = AnalysisLRU()


def clear() -> None:
    """Empty the per-process table (the disk entries stay)."""
    _MEMORY.clear()


def flush() -> None:
    """Wait for the disk writes handed to the store's writer so far."""
    _store.flush()


# ------------------------------------------------------------------ disk

def folder() -> Path | None:
    """The folder of the disk entries (None: the disk cache is off)."""
    d = _store.folder()
    if d is None or not code_stamp():
        return None
    return d / _SUBFOLDER


def _path(where: Path, digest: str) -> Path:
    return where / f"an-{code_stamp()[:8]}-{digest}.bin"


def _scalar(v):
    return v.item() if isinstance(v, np.generic) else v


def _encode(an) -> tuple:
    """The arrays and the JSON facts of an analysis."""
    arrays, facts = {}, {}
    for f in dataclasses.fields(an):
        v = getattr(an, f.name)
        if isinstance(v, np.ndarray):
            arrays[f.name] = v
        elif f.name == "fronts":
            facts["nfronts"] = int(v.nfronts)
            for g in dataclasses.fields(v):
                w = getattr(v, g.name)
                if isinstance(w, np.ndarray):
                    arrays[f"fronts.{g.name}"] = w
        elif f.name == "stages":
            facts["stages"] = {"budget": v.budget, "stages": [list(s) for s in v.stages],
                               "stage_bytes": list(v.stage_bytes),
                               "oversized": list(v.oversized)}
        elif f.name == "amalgamation":
            facts["amalgamation"] = {"nrelax": [_scalar(x) for x in v.nrelax],
                                     "zrelax": [_scalar(x) for x in v.zrelax],
                                     "enabled": bool(v.enabled)}
        elif f.name == "timings":
            facts["timings"] = {k: float(t) for k, t in v.items()}
        else:
            facts[f.name] = _scalar(v)
    return arrays, facts


def _decode(cls, arrays: dict, facts: dict):
    """The analysis of the arrays and facts :func:`_encode` gave (views, read-only)."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name == "fronts":
            fk = {"nfronts": int(facts["nfronts"])}
            for g in dataclasses.fields(FrontStructure):
                if g.name != "nfronts":
                    fk[g.name] = arrays[f"fronts.{g.name}"]
            kw["fronts"] = FrontStructure(**fk)
        elif f.name == "stages":
            s = facts["stages"]
            kw["stages"] = StagePlan(s["budget"], tuple(tuple(x) for x in s["stages"]),
                                     tuple(s["stage_bytes"]), tuple(s["oversized"]))
        elif f.name == "amalgamation":
            a = facts["amalgamation"]
            kw["amalgamation"] = Amalgamation(tuple(a["nrelax"]), tuple(a["zrelax"]),
                                              bool(a["enabled"]))
        elif f.name == "timings":
            kw["timings"] = dict(facts["timings"])
        elif f.name in arrays:
            kw[f.name] = arrays[f.name]
        else:
            kw[f.name] = facts[f.name]
    return freeze(cls(**kw))


def _load(k: AnalysisKey, cls):
    where = folder()
    if where is None:
        return None
    path = _path(where, k.digest)
    data = _store.read_mapped(path)     # no copy into fresh memory (page faults), read once
    if data is None:
        return None
    try:
        h, arrays = _store.decode_arrays(data, _MAGIC, {"format": DISK_FORMAT,
                                                        "stamp": code_stamp(),
                                                        "key": k.digest}, kinds="iubf")
        an = _decode(cls, arrays, h["facts"])
    except _store.Foreign:                     # another kind, stamp or key: not ours
        return None
    except Exception:                          # noqa: BLE001 - damaged: nobody can use it
        _store.unlink(path)
        return None
    if not _matches(k, an):
        return None                            # a checksum collision: analysed again
    _store.touch(path)                         # used: the bound deletes it last
    return an


def _save(where: Path, digest: str, an) -> None:
    arrays, facts = _encode(an)
    header = {"format": DISK_FORMAT, "stamp": code_stamp(), "key": digest, "facts": facts}
    path = _path(where, digest)
    try:
        _store.publish(where, lambda fh: _store.write_arrays(fh, _MAGIC, arrays, header),
                       lambda tag: path)
    except OSError:
        return
    _store.bound(where, "an-", path, DISK_MAX_BYTES, MAX_DISK_FILES,
                 current=f"an-{code_stamp()[:8]}-")


# ------------------------------------------------------------------ look-up

def lookup(k: AnalysisKey | None, cls):
    """The kept analysis of ``k`` (memory, then disk), or None.

    ``cls`` is the analysis class (:class:`~scipy_gpuqr._symbolic.SymbolicAnalysis`),
    made of a disk entry's fields. What is returned is the kept object itself:
    the caller copies it before handing it out.
    """
    if k is None:
        return None
    an = _MEMORY.get(k.digest)
    if an is not None:
        return an if _matches(k, an) else None
    an = _load(k, cls)
    if an is not None:
        _MEMORY.put(k.digest, an)
    return an


def keep(k: AnalysisKey | None, an) -> None:
    """Keep a new analysis of ``k`` (its arrays made read-only): in memory, and on
    disk (written behind the caller) when the store is on and A is large enough."""
    if k is None:
        return
    freeze(an)
    _MEMORY.put(k.digest, an)
    if k.nnz < DISK_MIN_NNZ:
        return
    where = folder()
    if where is not None:
        _store.write_behind(_save, where, k.digest, an)

