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

It is plain C99 without Python headers, built on the first use in a process
that finds no built library (never at import) into ``native/`` of the package
cache folder as ``native-{key}.so``, checked against its manifest before it is
loaded, by :mod:`scipy_gpuqr._native_build` (which says when, where and how);
the calls release the GIL.

``$SCIPY_GPUQR_SCHEDULE_SIM`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it can be had, else NumPy; while it is being built on a
worker thread the plan takes the NumPy path, so no plan waits for the
compiler), ``c`` (compiled or :class:`NativeUnavailable`), ``numpy``. No
compiler, no cache folder, a failed build or load: the NumPy path (``auto``),
decided once per process.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .. import _native_build
from .._errors import NativeUnavailable
from .tasks import MAX_SLOTS

__all__ = ["ENV", "ABI", "MODES", "MAX_BUILDS", "MANIFEST_SUFFIX", "NativeUnavailable", "mode",
           "library", "handle", "status", "simulate", "tile_buckets", "element_rows", "assembly",
           "fill", "arith_runs", "RUNS_PER_THREAD", "SIMULATE_WORK_PER_THREAD",
           "ELEMENT_ROWS_PER_THREAD", "scatter", "pack", "thread_count", "usable_cpus",
           "run_ranges", "run_split"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_SCHEDULE_SIM"
MODES = _native_build.MODES
#: Interface version of ``_native.c`` (``sgq_abi()``).
ABI = 8
#: Row columns the library writes, in its order (then ``rows``).
COLS = ("type", "col", "c0", "c1", "napply", "nfrows", "fstart", "flags", "ftop", "vt",
        "vt2", "mult")
_NOMEM, _FINAL, _INPUT = 1, 2, 3
#: Suffix added to a library's file name to name its manifest (size and SHA-256).
MANIFEST_SUFFIX = _native_build.MANIFEST_SUFFIX
#: Most built libraries kept (other sources or compilers: other package versions).
MAX_BUILDS = _native_build.MAX_BUILDS


def _declare(lib: ctypes.CDLL) -> None:
    """Type the library's functions (ctypes: no declarations to parse, unlike
    cffi's ``cdef``)."""
    i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
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


#: The library: ``_native.c`` beside this module, built as ``native-{key}.so``.
_SPEC = _native_build.NativeLibrary.beside(__file__, "native-", ABI, "sgq_abi", ENV, _declare)
#: This process' library (:class:`~scipy_gpuqr._native_build.NativePart`): the
#: path :data:`ENV` asks for (``mode``), the library (``library``), the library
#: for the call at hand (``handle``) and the loader's state (``status``).
_NATIVE = _native_build.NativePart(_SPEC, "compiled schedule loops")
mode, library, handle, status = _NATIVE.mode, _NATIVE.library, _NATIVE.handle, _NATIVE.status


#: Least simulation work per thread of :func:`simulate` (row tiles times bucket
#: columns, summed over a range of patterns; below: one call on this thread).
SIMULATE_WORK_PER_THREAD = 1 << 16


def simulate(handle, patterns, bundle: int, pipelining: bool, granule: int,
             threads: int = 0):
    """Run the compiled simulation on ``patterns`` (``(buckets, nct, nfct)``).

    Each pattern is simulated alone, so ranges of patterns are simulated on
    ``threads`` threads at once (0: up to the CPU count, at least
    :data:`SIMULATE_WORK_PER_THREAD` work each; the calls release the GIL) and
    their outputs put end to end: the same arrays as one call over all of them
    (a new matrix's first plan makes them on the call's thread, before its
    first launch).

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
    P = len(patterns)
    nrt = np.array([len(p[0]) for p in patterns], dtype=np.int64)
    nfct = np.array([p[2] for p in patterns], dtype=np.int64)
    work = np.cumsum(nrt * np.maximum(nfct, 1))
    total = int(work[-1]) if P else 0
    if threads <= 0:
        threads = thread_count(total, SIMULATE_WORK_PER_THREAD)
    threads = min(int(threads), P)
    if threads <= 1:
        return _simulate_range(handle, patterns, bundle, pipelining, granule)
    # contiguous ranges of about equal work (a range holds one pattern at least)
    cuts = np.searchsorted(work, np.linspace(0, total, threads + 1)[1:-1], side="left") + 1
    bounds = np.unique(np.concatenate(([0], np.minimum(cuts, P), [P]))).tolist()
    out = [None] * (len(bounds) - 1)
    slot = {b: k for k, b in enumerate(bounds[:-1])}

    def part(i0, i1):
        k = slot[i0]
        try:
            out[k] = (_simulate_range(handle, patterns[i0:i1], bundle, pipelining, granule),
                      None)
        except BaseException as exc:        # noqa: BLE001 - raised in order below
            out[k] = (None, exc)
    run_ranges(part, bounds)
    done = []
    for got, exc in out:                # the first range that fails decides, as one call
        if exc is not None:
            raise exc
        if got is None:
            return None
        done.append(got)
    row0 = np.cumsum([0] + [g[0].shape[1] for g in done[:-1]])
    info = np.concatenate([g[4] for g in done])
    info[:, 2:] += np.repeat(row0, [len(g[4]) for g in done])[:, None]
    return (np.concatenate([g[0] for g in done], axis=1),
            np.concatenate([g[1] for g in done]),
            np.concatenate([g[2] for g in done]), np.concatenate([g[3] for g in done]), info)


def _simulate_range(lib, patterns, bundle: int, pipelining: bool, granule: int):
    """:func:`simulate` of ``patterns`` in one call of the library."""
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


#: Fewest rows per thread of :func:`element_rows` (below: one call on this thread).
ELEMENT_ROWS_PER_THREAD = 1 << 14


def element_rows(lib, rc: dict, tile: int, threads: int = 0) -> np.ndarray:
    """:func:`.bucket.element_rows_of` compiled: rows given column by column as
    element-unit records, ``(n, 12)`` int64 words.

    Each row is written alone, so ranges of rows are written on ``threads``
    threads at once (0: up to the CPU count, at least
    :data:`ELEMENT_ROWS_PER_THREAD` rows each; the calls release the GIL, and
    the first touch of the fresh output is shared too).
    """
    n = len(rc["type"])
    cols = [np.ascontiguousarray(rc[k], dtype=np.int32) for k in COLS[:11]]
    slots = np.ascontiguousarray(rc["rows"], dtype=np.int32)
    if slots.shape != (n, MAX_SLOTS):
        raise ValueError(f"rows has shape {slots.shape}")
    ptrs = np.array([c.ctypes.data for c in cols], dtype=np.int64)
    out = np.empty((n, 12), dtype=np.int64)
    if threads <= 0:
        threads = thread_count(n, ELEMENT_ROWS_PER_THREAD)
    if threads <= 1:
        lib.sgq_element_rows(n, ptrs.ctypes.data, slots.ctypes.data, int(tile), out.ctypes.data)
        return out

    def part(i0, i1):
        at = ptrs + 4 * i0              # int32 columns
        lib.sgq_element_rows(i1 - i0, at.ctypes.data, slots[i0:].ctypes.data, int(tile),
                             out[i0:].ctypes.data)
    run_ranges(part, np.linspace(0, n, threads + 1).astype(np.int64))
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


def usable_cpus() -> int:
    """Cores this process may run on (its affinity where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):           # not on Linux
        return os.cpu_count() or 1


def thread_count(n: int, per_thread: int, most: int = 16) -> int:
    """Threads for ``n`` items: up to the cores this process may run on
    (:func:`usable_cpus`: a process pinned to a few cores gets no more threads
    than it can run) and ``most``, each with at least ``per_thread`` items (1 at
    least)."""
    return min(usable_cpus(), most, max(1, n // per_thread))


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
