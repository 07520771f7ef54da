"""Where every entry of R comes from: R's pattern and gather maps, once per analysis.

Without rank detection R's pattern is fixed by the analysis: front ``f``
contributes the upper trapezoid of the first ``frank[f]`` rows of its
``fm × fn`` block (columns ``cols[col_ptr[f]:col_ptr[f+1]]``), the singleton
rows of A come as they stand, rows are in pivot order. So R's CSC
``indptr``/``indices`` and, for every stored entry, its *source* are computed
once (vectorized NumPy, no loop per front or per entry) and cached per
sparsity pattern (the analysis' ``pattern_key``, in a bounded table with one
entry for a layout over its byte bound; per analysis object when it has
none); a factorization then only gathers the values:

* ``src[e] >= 0``: element ``src[e]`` of the *global front space*, the fronts
  row-major one after the other (front ``f`` starts at ``fbase[f]``); the
  pool of a stage covering fronts ``first..last`` is the slice
  ``[fbase[first], fbase[last + 1])`` of that space (the scheduler lays it
  out so), hence a stage's gather index is ``src - fbase[first]``;
* ``src[e] < 0``: singleton-row entry ``-src[e] - 1`` (value
  ``A.data[r1_nz[-src[e] - 1]]``).

The GPU engine gathers a stage's R values on the device, in CSC order, and
copies back exactly nnz(R) values (no host-side sort or transpose per
factorization). The layout is built on a worker thread while the GPU runs
the first factorization's launches, and reused by ``refactor`` and by every
new factorization of the same pattern; a new process maps it back from the
disk store (:mod:`.rlayout_store`). Its two arrays of nnz(R) entries (row
indices, the one-stage gather index) are expanded from column segments by
the compiled runs of :mod:`scipy_gpuqr._schedule.native` when loaded (on
several threads, off the GIL: the worker shares the CPU with the launch loop).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..._schedule import native
from ..._schedule.pattern_cache import PerPattern
from ..._store import write_behind
from . import rlayout_store

__all__ = ["RLayout", "r_layout", "r_layout_cached", "clear_r_layout_cache",
           "MEMORY_ENTRIES", "MEMORY_BYTES", "LARGE_FRACTION", "STAGE_MAPS_KEPT"]

#: Most layouts kept per process by pattern (:class:`~scipy_gpuqr._schedule.pattern_cache.PerPattern`).
MEMORY_ENTRIES = 8
#: Most bytes of layout arrays kept per process by pattern.
MEMORY_BYTES = 1 << 30
#: One layout larger than :data:`MEMORY_BYTES` (the last one made) is kept by
#: pattern too, while it takes at most this fraction of the host's physical
#: memory: a new ``QRFactorization`` of a large pattern (a new analysis object)
#: finds it instead of making it again beside its launches, whose loop the
#: rebuild slows (it shares the CPU and the GIL with the launch loop).
LARGE_FRACTION = 1 / 8
#: Staging plans of more than one stage whose gather maps a layout keeps, the
#: most recently used (besides the one-stage plan's): a process that alternates
#: between memory limits, so between stage plans, makes each plan's maps once
#: (a plan's maps hold 12 bytes per entry of R; made again they cost seconds
#: on a large R, one pass over its entries per stage).
STAGE_MAPS_KEPT = 2


@dataclass(eq=False)
class RLayout:
    """R's CSC pattern, the source of each entry and Q's row bookkeeping.

    Attributes
    ----------
    shape : (int, int)
        ``(min(m, n), n)``.
    indptr, indices : ndarray (int32, or int64 past 2**31 entries)
        R's CSC pattern, rows sorted in each column (treat as read-only;
        :meth:`csc` copies them).
    src : ndarray of int64 (nnz,)
        Source of each stored entry (see the module notes; built on first
        use when the layout keeps its column segments: a one-stage plan's
        gather map is made straight from them).
    fbase : ndarray of int64 (nfronts + 1,)
        Start of each front in the global front space.
    r1_pos, r1_nz : ndarray of int64
        Positions of the singleton-row entries in ``data`` and their index
        into the canonical A's ``data``.
    qorder : ndarray of int64 (m,)
        Row order of ``Qᵀb`` (rows of R by pivot, then the others).
    slots_of : list of ndarray
        Global slot (row of A) of every row of every front.
    """

    shape: tuple
    indptr: np.ndarray
    indices: np.ndarray
    _src: np.ndarray | None
    fbase: np.ndarray
    r1_pos: np.ndarray
    r1_nz: np.ndarray
    qorder: np.ndarray
    slots_of: list
    _segs: tuple | None = field(default=None, repr=False)
    _r1_src: np.ndarray | None = field(default=None, repr=False)
    _store_at: object = field(default=None, repr=False)
    _stage_maps: dict = field(default_factory=dict, repr=False)
    _building: dict = field(default_factory=dict, repr=False)
    _extras: dict = field(default_factory=dict, repr=False)
    _lock: object = field(default_factory=threading.RLock, repr=False)

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    @property
    def src(self) -> np.ndarray:
        with self._lock:
            if self._src is None:
                if self._segs is not None:
                    first, step, length, start = self._segs
                    self._src = _arith_runs(first, step, length, start, self.nnz, np.int64)
                else:       # read from disk: the one-stage map, singleton entries apart
                    key = ((0, len(self.fbase) - 2),)
                    src = self._stage_maps[key][0][1].astype(np.int64)
                    src[self.r1_pos] = self._r1_src
                    self._src = src
                self._src.flags.writeable = False
            return self._src

    def stage_maps(self, stages) -> list:
        """Gather maps of a staging plan: per stage ``(pos, index)``.

        ``index`` (int32 when the stage's front space fits, else int64) gives
        the pool element of each of the stage's R entries, in CSC order;
        ``pos`` their positions in R's ``data`` (None: all of ``data``, in
        order; singleton-row entries, filled from A afterwards, point at element
        0). Cached: the one-stage plan's, and those of the
        :data:`STAGE_MAPS_KEPT` staged plans asked for last.

        Parameters
        ----------
        stages : sequence of (first, last)
            The plan's stages (fronts, inclusive).
        """
        key = tuple((int(a), int(b)) for a, b in stages)
        with self._lock:
            hit = self._stage_maps.pop(key, None)
            if hit is not None:             # the most recently used last
                self._stage_maps[key] = hit
                return hit
            # one builder per plan: a caller that finds the maps being made (the
            # host side's worker and a stage's R copier ask at once) waits for them
            building = self._building.get(key)
            if building is None:
                building = self._building[key] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            return building.result()
        try:
            out = self._make_stage_maps(key)
        except BaseException as exc:
            with self._lock:
                self._building.pop(key, None)
            building.set_exception(exc)
            raise
        building.set_result(out)
        return out

    def _make_stage_maps(self, key: tuple) -> list:
        """:meth:`stage_maps` made (kept, and the one-stage plan's written behind)."""
        out = []
        fb = self.fbase
        for first, last in key:
            lo, hi = int(fb[first]), int(fb[last + 1])
            itype = np.int32 if hi - lo < 2 ** 31 - 1 else np.int64
            if len(key) == 1:
                if self._src is None:       # straight from the segments, no int64 pass
                    s0, step, length, start = self._segs
                    out.append((None, _arith_runs(np.maximum(s0, 0), step, length, start,
                                                  self.nnz, itype)))
                else:
                    idx = np.empty(len(self._src), dtype=itype)
                    np.maximum(self._src, 0, out=idx, casting="unsafe")
                    out.append((None, idx))
                continue
            runs = self._segments_in_fronts()
            if runs is not None:
                out.append(_stage_runs(runs, lo, hi, itype))
                continue
            src = self.src
            pos = np.flatnonzero((src >= lo) & (src < hi))
            out.append((pos, (src[pos] - lo).astype(itype)))
        with self._lock:
            self._keep_maps(key, out)
            self._building.pop(key, None)
            at, self._store_at = self._store_at, None
        if at is not None and len(key) == 1:    # the usual one-stage plan: kept on disk
            write_behind(_save, at, self, out[0][1])
        return out

    def stage_maps_by(self, stages, rank, name) -> list | None:
        """Gather maps of a staging plan of several stages, each stage's entries
        ordered by a rank of their column segments instead of CSC order.

        A stage's entries are cut into segments, the rows of one front in one of
        its local columns (contiguous in R's ``data``, one front's). Each
        stage's segments are taken by ``rank`` (stable: in CSC order within a
        rank), so that a copier moving the entries in that order moves a
        prefix: e.g. by the launch after which each segment is final, which
        in CSC order waits for every front holding the column.

        Parameters
        ----------
        stages : sequence of (first, last)
            The plan's stages (fronts, inclusive); at least two.
        rank : callable
            ``rank(i, front, column) -> ranks``: for stage ``i`` and its
            segments' fronts and local columns (int64 arrays), each segment's
            rank (int64, >= 0).
        name : hashable
            What names ``rank`` in the cache (with the stages): the maps are
            kept as :meth:`stage_maps`' staged ones are.

        Returns
        -------
        list of (pos, index, count) or None
            Per stage its entries' positions in ``data`` and pool elements,
            in rank order, and ``count[r]``, its entries of rank ``r``. None
            where the layout keeps no column segments (read back from disk)
            or a segment spans fronts: :meth:`stage_maps` then.
        """
        key = tuple((int(a), int(b)) for a, b in stages) + (("by", name),)
        with self._lock:
            hit = self._stage_maps.pop(key, None)
            if hit is not None:
                self._stage_maps[key] = hit
        if hit is not None:
            return hit
        segs = self._segments_in_fronts()
        if segs is None or len(key) < 3:
            return None
        first, length = segs[0], segs[2]
        fb = self.fbase
        out = []
        for i, (a, b) in enumerate(key[:-1]):
            lo, hi = int(fb[a]), int(fb[b + 1])
            itype = np.int32 if hi - lo < 2 ** 31 - 1 else np.int64
            sel = np.flatnonzero((first >= lo) & (first < hi))
            f = np.searchsorted(fb, first[sel], side="right") - 1
            r = np.asarray(rank(i, f, first[sel] - fb[f]), dtype=np.int64)
            o = np.argsort(r.astype(np.uint16) if len(r) and int(r.max()) < 1 << 16 else r,
                           kind="stable")
            sel, r = sel[o], r[o]
            count = np.bincount(r, weights=length[sel], minlength=int(r.max(initial=-1)) + 1)
            out.append(_segment_runs(segs, sel, lo, itype) + (count.astype(np.int64),))
        with self._lock:
            self._keep_maps(key, out)
        return out

    def _keep_maps(self, key: tuple, out: list) -> None:
        """Keep the maps ``out`` of the plan ``key`` as the most recent, with those of the
        last :data:`STAGE_MAPS_KEPT` staged plans and the one-stage plan's (the
        caller holds the layout's lock)."""
        self._stage_maps.pop(key, None)
        self._stage_maps[key] = out
        staged = [k for k in self._stage_maps if len(k) > 1]
        for k in staged[:max(len(staged) - STAGE_MAPS_KEPT, 0)]:
            del self._stage_maps[k]

    def segments_from(self, analysis) -> bool:
        """Whether the layout has its column segments, made again from ``analysis``
        where it keeps none (a layout read back from disk keeps only the one-stage
        gather map): a few million segments against R's entries, once per layout.
        :meth:`stage_maps_by` needs them; :meth:`stage_maps` then makes a staged
        plan's maps from them too (the same maps)."""
        with self._lock:
            if self._segs is not None:
                return True
        segs = _segments_again(analysis, self)
        if segs is None:
            return False
        with self._lock:
            if self._segs is None:
                self._segs = segs
                self._extras.pop(("segments in fronts",), None)
        return True

    def _segments_in_fronts(self):
        """The column segments of the sources where each lies within one front (the
        singleton-row ones all negative), so that a stage's entries are whole
        segments; None otherwise or where the layout keeps none (read from
        disk). Checked once per layout."""
        if self._segs is None:
            return None

        def check():
            first, step, length, _ = self._segs
            last = first + step * (length - 1)
            fb = self.fbase
            neg = first < 0
            same = np.searchsorted(fb, first, side="right") == \
                np.searchsorted(fb, last, side="right")
            ok = bool(np.all(np.where(neg, last < 0, same & (last >= 0))))
            return self._segs if ok else None
        return self.extra(("segments in fronts",), check)

    def extra(self, key, make):
        """A per-layout cached object (``make()`` on first use; thread-safe)."""
        with self._lock:
            hit = self._extras.get(key)
            if hit is None:
                hit = self._extras[key] = make()
        return hit

    def extra_if_made(self, key):
        """The per-layout cached object of ``key`` (:meth:`extra`), or None where
        none was made yet (nothing is made here)."""
        with self._lock:
            return self._extras.get(key)

    def pattern_copy(self) -> tuple:
        """Fresh ``(indices, indptr)`` for one R (the cached ones stay read-only)."""
        return _copy(self.indices), self.indptr.copy()

    def csc(self, data: np.ndarray, pattern: tuple | None = None):
        """R as a ``scipy.sparse.csc_array`` over ``data``.

        ``pattern``: from :meth:`pattern_copy` (made now when None).
        """
        ind, ptr = self.pattern_copy() if pattern is None else pattern
        R = sp.csc_array((data, ind, ptr), shape=self.shape)
        R.has_sorted_indices = True
        return R


#: Fewest elements per thread of :func:`_copy` (below: one plain copy).
COPY_PER_THREAD = 1 << 22


def _copy(a: np.ndarray) -> np.ndarray:
    """A copy of the 1-D array ``a``; a large one in slices on several threads
    (NumPy's copies release the GIL; a fresh array's first touch, most of the
    cost, is shared by the threads)."""
    n = len(a)
    threads = native.thread_count(n, COPY_PER_THREAD, most=8)
    if threads <= 1:
        return a.copy()
    out = np.empty_like(a)

    def part(i0, i1):
        np.copyto(out[i0:i1], a[i0:i1])
    native.run_ranges(part, [n * i // threads for i in range(threads + 1)])
    return out


def _layout_nbytes(lay) -> int:
    """Bytes of a layout's arrays (its cached extras' arrays included)."""
    arrays = [lay.indptr, lay.indices, lay._src, lay.fbase, lay.r1_pos, lay.r1_nz,
              lay.qorder]
    with lay._lock:
        if lay._segs is not None:
            arrays += list(lay._segs)
        for maps in lay._stage_maps.values():
            for m in maps:              # (pos, index) or stage_maps_by's (pos, index, count)
                arrays += list(m)
        arrays += [v for v in lay._extras.values() if isinstance(v, np.ndarray)]
    total = sum(int(a.nbytes) for a in arrays if isinstance(a, np.ndarray))
    return total + sum(int(s.nbytes) for s in lay.slots_of)


def _large_bytes() -> int:
    """Bytes of the one large layout kept by pattern: :data:`LARGE_FRACTION` of the
    host's physical memory (0 where it cannot be read: none kept)."""
    try:
        return int(LARGE_FRACTION * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


_CACHE = PerPattern(MEMORY_ENTRIES, MEMORY_BYTES, _layout_nbytes, large_bytes=_large_bytes)


def clear_r_layout_cache(analysis=None) -> None:
    """Forget cached layouts (of ``analysis``'s pattern and object, or all)."""
    _CACHE.clear(analysis)


def r_layout_cached(analysis) -> RLayout | None:
    """The cached layout of ``analysis``'s pattern, or None (never builds)."""
    return _CACHE.get(analysis)


def r_layout(analysis, cache: bool = True) -> RLayout:
    """R's layout for ``analysis`` (built once per pattern, cached).

    With ``cache``, also on disk between processes (:mod:`.rlayout_store`):
    a layout read back maps its file; one built here is written once its
    one-stage gather map is made (:meth:`RLayout.stage_maps`). Made once per
    pattern also when two threads ask at once (a call and the load started
    ahead of it, :func:`~scipy_gpuqr._engine.gpu.driver.start_layout_load`):
    the gather maps a call makes are then kept on the one layout later calls
    find.
    """
    if not cache:
        return _made(analysis, None)
    return _CACHE.get_or_make(analysis, None,
                              lambda: _made(analysis, rlayout_store.slot(analysis)))


def _made(analysis, at) -> RLayout:
    """R's layout read from its file ``at`` where there is one, else built (and
    written there once its one-stage gather map is made; ``at`` None: not)."""
    out = rlayout_store.load(at, analysis, _from_arrays)
    if out is None:
        out = _build(analysis)
        out._store_at = None if at is None else (at, analysis)
    return out


def _save(at, lay: "RLayout", map1: np.ndarray) -> bool:
    """Write ``lay`` with its one-stage gather map ``map1`` (write-behind thread;
    ``at``: the file and the analysis, :func:`.rlayout_store.slot`)."""
    path, analysis = at
    if lay._segs is not None:       # singleton-row entries: the negative sources
        r1_src = lay._segs[0][lay._segs[0] < 0]
    else:
        r1_src = lay.src[lay.r1_pos]
    sl = lay.slots_of
    slots_ptr = np.zeros(len(sl) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in sl], out=slots_ptr[1:])
    slots = np.concatenate(sl) if sl else np.zeros(0, dtype=np.int64)
    arrays = {"indptr": lay.indptr, "indices": lay.indices, "map1": map1,
              "fbase": lay.fbase, "r1_pos": lay.r1_pos, "r1_nz": lay.r1_nz,
              "r1_src": r1_src, "qorder": lay.qorder, "slots": slots,
              "slots_ptr": slots_ptr}
    return rlayout_store.save(path, analysis, arrays, {"shape": [int(x) for x in lay.shape]})


def _from_arrays(a: dict, facts: dict) -> "RLayout":
    """A layout of the arrays :func:`_save` wrote (read-only views of the file);
    ValueError when they do not fit together."""
    shape = tuple(int(x) for x in facts["shape"])
    indptr, indices, map1 = a["indptr"], a["indices"], a["map1"]
    fbase, sp_ = a["fbase"], a["slots_ptr"]
    nf = len(fbase) - 1
    if (len(shape) != 2 or len(indptr) != shape[1] + 1 or nf < 0
            or int(indptr[-1]) != len(indices) or len(map1) != len(indices)
            or len(sp_) != nf + 1 or int(sp_[-1]) != len(a["slots"])
            or len(a["r1_pos"]) != len(a["r1_src"]) or len(a["r1_nz"]) != len(a["r1_pos"])):
        raise ValueError("layout file: arrays that do not fit together")
    slots, bounds = a["slots"], sp_.tolist()
    slots_of = [slots[bounds[f]:bounds[f + 1]] for f in range(nf)]
    return RLayout(shape=shape, indptr=indptr, indices=indices, _src=None, fbase=fbase,
                   r1_pos=a["r1_pos"], r1_nz=a["r1_nz"], qorder=a["qorder"],
                   slots_of=slots_of, _r1_src=a["r1_src"],
                   _stage_maps={((0, nf - 1),): [(None, map1)]})


def row_slots(analysis) -> list:
    """Global slot (row of A) of every row of every front (as the reference)."""
    fs = analysis.fronts
    rowperm = analysis.rowperm
    nf = fs.nfronts
    slots_of = [None] * nf
    fm_l, rk_l, cm_l = fs.fm.tolist(), fs.frank.tolist(), fs.cm.tolist()
    ap, chp, rp = fs.arow_ptr.tolist(), fs.child_ptr.tolist(), fs.rimap_ptr.tolist()
    ch = fs.children.tolist()
    for f in range(nf):
        slots = np.empty(fm_l[f], dtype=np.int64)
        a0, a1 = ap[f], ap[f + 1]
        slots[fs.arow_local[a0:a1]] = rowperm[a0:a1]
        for c in ch[chp[f]:chp[f + 1]]:
            rk = rk_l[c]
            slots[fs.rimap[rp[c]:rp[c + 1]]] = slots_of[c][rk:rk + cm_l[c]]
        slots_of[f] = slots
    return slots_of


def _build(analysis) -> RLayout:
    """Column segments when rows are in front order (the rule), else the general path."""
    if _rows_in_front_order(analysis):
        return _build_segments(analysis)
    return _build_general(analysis)


def _rows_in_front_order(analysis) -> bool:
    """Whether R's rows, the singleton rows then each front's pivotal rows in front
    order, have ascending pivot columns (R's column segments then describe it)."""
    fs = analysis.fronts
    r1 = int(getattr(analysis, "n1rows", 0) or 0)
    rk = fs.frank.astype(np.int64)
    row_f = np.repeat(np.arange(fs.nfronts, dtype=np.int64), rk)
    row_i = np.arange(len(row_f), dtype=np.int64) - np.repeat(np.cumsum(rk) - rk, rk)
    piv = np.concatenate([np.asarray(analysis.r1_pivot, dtype=np.int64)[:r1],
                          np.asarray(fs.cols, dtype=np.int64)[fs.col_ptr[row_f] + row_i]])
    return len(piv) < 2 or bool(np.all(np.diff(piv) > 0))


def _front_arrays(analysis) -> tuple:
    """The per-front arrays both layout builders start from, as int64.

    Returns ``(m, n, k, nfronts, fm, fn, frank, col_ptr, cols, fbase, rowperm,
    slots_of, n1rows, r1_ptr)``; ``fbase`` holds each front's offset in the pool.
    """
    fs = analysis.fronts
    m, n = int(analysis.m), int(analysis.n)
    fm = fs.fm.astype(np.int64)
    fn = fs.fn.astype(np.int64)
    fbase = np.zeros(fs.nfronts + 1, dtype=np.int64)
    np.cumsum(fm * fn, out=fbase[1:])
    r1 = int(getattr(analysis, "n1rows", 0) or 0)
    r1_ptr = np.asarray(analysis.r1_ptr, dtype=np.int64) if r1 else np.zeros(1, np.int64)
    return (m, n, min(m, n), fs.nfronts, fm, fn, fs.frank.astype(np.int64),
            fs.col_ptr.astype(np.int64), np.asarray(fs.cols, dtype=np.int64), fbase,
            np.asarray(analysis.rowperm, dtype=np.int64), row_slots(analysis), r1, r1_ptr)


def _build_segments(analysis) -> RLayout:
    """R's CSC straight from column segments (rows of R in front order).

    Local column ``j`` of front ``f`` holds rows ``0 .. min(j + 1, frank[f]) - 1``
    of the front's R block: one contiguous run of rows of R, its sources a
    stride-``fn`` run of the front. Sorting the (column, front) segments by
    column (stable: fronts stay in order, hence rows ascend) and expanding
    them gives CSC order directly: no entry-level sort, scatter or transpose.
    """
    (m, n, k, nf, fm, fn, rk, col_ptr, cols, fbase, rowperm, slots_of, r1,
     r1_ptr) = _front_arrays(analysis)
    s_col, s_len, s_row, s_src, s_str = _column_segments(analysis, fn, rk, col_ptr, cols,
                                                         fbase, r1, r1_ptr)
    nnz1 = int(r1_ptr[-1])
    counts = np.bincount(s_col, weights=s_len, minlength=n).astype(np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    nnz = int(indptr[-1])
    itype = np.int32 if max(nnz, n, k) < 2 ** 31 - 1 else np.int64
    # ---- expand: both runs are arithmetic (rows step 1, sources step s_str), so
    # each is the running sum of its steps with a jump at every segment start
    sstart = np.cumsum(s_len) - s_len
    ind = _arith_runs(s_row, np.ones(len(s_len), dtype=np.int64), s_len, sstart, nnz, itype)
    # sources: kept as segments, expanded when asked for (RLayout.src, stage_maps);
    # the singleton-row entries are the segments with a negative source (length 1)
    one = s_src < 0
    r1_pos = sstart[one] if nnz1 else np.zeros(0, dtype=np.int64)
    r1_nz = np.asarray(analysis.r1_nz, dtype=np.int64)[-1 - s_src[one]] if nnz1 \
        else np.zeros(0, dtype=np.int64)
    slots_r = np.concatenate([rowperm[:r1]] + [slots_of[f][:int(rk[f])] for f in range(nf)
                                                if rk[f]])
    rest = np.ones(m, dtype=bool)
    rest[slots_r] = False
    qorder = np.concatenate([slots_r, np.flatnonzero(rest)]).astype(np.int64)
    ptr = indptr.astype(itype)
    for a in (ind, ptr, fbase, r1_pos, r1_nz, qorder):
        a.flags.writeable = False
    return RLayout(shape=(k, n), indptr=ptr, indices=ind, _src=None, fbase=fbase,
                   r1_pos=r1_pos, r1_nz=r1_nz, qorder=qorder, slots_of=slots_of,
                   _segs=(s_src, s_str, s_len, sstart))


def _column_segments(analysis, fn, rk, col_ptr, cols, fbase, r1, r1_ptr) -> tuple:
    """The column segments of :func:`_build_segments` sorted by column: ``(col,
    length, first row, first source, source step)`` per segment (int64), the
    singleton-row entries' (length 1, source ``-1 - entry``) among them."""
    nf = len(fn)
    nnz1 = int(r1_ptr[-1])
    # ---- segments: singleton-row entries (length 1), then (front, local column)
    row0 = r1 + np.cumsum(rk) - rk                      # first row of R of each front
    ncol = np.diff(col_ptr)
    seg_f = np.repeat(np.arange(nf, dtype=np.int64), ncol)
    seg_j = np.arange(len(seg_f), dtype=np.int64) - np.repeat(col_ptr[:-1], ncol)
    seg_len = np.minimum(seg_j + 1, rk[seg_f])
    live = seg_len > 0
    seg_f, seg_j, seg_len = seg_f[live], seg_j[live], seg_len[live]
    s_col = np.concatenate([np.asarray(analysis.r1_cols, dtype=np.int64)[:nnz1],
                            cols[col_ptr[seg_f] + seg_j]])
    s_len = np.concatenate([np.ones(nnz1, dtype=np.int64), seg_len])
    s_row = np.concatenate([np.repeat(np.arange(r1, dtype=np.int64), np.diff(r1_ptr)),
                            row0[seg_f]])
    s_src = np.concatenate([-1 - np.arange(nnz1, dtype=np.int64), fbase[seg_f] + seg_j])
    s_str = np.concatenate([np.zeros(nnz1, dtype=np.int64), fn[seg_f]])
    o = np.argsort(s_col, kind="stable")
    return s_col[o], s_len[o], s_row[o], s_src[o], s_str[o]


def _segments_again(analysis, lay) -> tuple | None:
    """A layout's ``_segs`` made again from its analysis (rows of R in front
    order, as :func:`_build` checks), None where they do not describe the
    layout: other fronts, or other column counts."""
    fs = analysis.fronts
    fm, fn = fs.fm.astype(np.int64), fs.fn.astype(np.int64)
    fbase = np.zeros(fs.nfronts + 1, dtype=np.int64)
    np.cumsum(fm * fn, out=fbase[1:])
    if not np.array_equal(fbase, lay.fbase) or not _rows_in_front_order(analysis):
        return None
    r1 = int(getattr(analysis, "n1rows", 0) or 0)
    r1_ptr = np.asarray(analysis.r1_ptr, dtype=np.int64) if r1 else np.zeros(1, np.int64)
    rk = fs.frank.astype(np.int64)
    s_col, s_len, _, s_src, s_str = _column_segments(
        analysis, fn, rk, fs.col_ptr.astype(np.int64), np.asarray(fs.cols, dtype=np.int64),
        fbase, r1, r1_ptr)
    n = int(lay.shape[1])
    counts = np.bincount(s_col, weights=s_len, minlength=n).astype(np.int64)
    if len(counts) != n or not np.array_equal(np.cumsum(counts), lay.indptr[1:]):
        return None
    return s_src, s_str, s_len, np.cumsum(s_len) - s_len


def _stage_runs(segs, lo: int, hi: int, itype) -> tuple:
    """A stage's gather map ``(pos, index)`` from the sources' column segments, each
    within one front: the segments whose first source lies in ``[lo, hi)``, then
    one write per entry of the stage (the same map as masking every entry's
    source, which reads all of R's entries once per stage)."""
    first = segs[0]
    return _segment_runs(segs, np.flatnonzero((first >= lo) & (first < hi)), lo, itype)


def _segment_runs(segs, sel, lo: int, itype) -> tuple:
    """``(pos, index)`` of the column segments ``sel`` (in that order), end to end:
    each entry's position in ``data`` and its source less ``lo``."""
    first, step, length, start = segs
    lens = length[sel]
    at = np.zeros(len(sel), dtype=np.int64)
    if len(sel) > 1:
        np.cumsum(lens[:-1], out=at[1:])
    total = int(lens.sum())
    pos = _arith_runs(start[sel], np.ones(len(sel), dtype=np.int64), lens, at, total,
                      np.int64).astype(np.intp, copy=False)
    return pos, _arith_runs(first[sel] - lo, step[sel], lens, at, total, itype)


def _arith_runs(first, step, length, start, total, dtype) -> np.ndarray:
    """Runs ``first[i] + step[i] * (0 .. length[i]-1)`` end to end (lengths >= 1).

    Compiled (:func:`scipy_gpuqr._schedule.native.arith_runs`: one write per
    entry, on several threads, off the GIL) when the schedule's native
    library is loaded, else :func:`_arith_runs_numpy`; both give the same
    array.
    """
    lib = native.handle()
    if lib is not None and total:
        return native.arith_runs(lib, first, step, length, start, total, dtype)
    return _arith_runs_numpy(first, step, length, start, total, dtype)


def _arith_runs_numpy(first, step, length, start, total, dtype) -> np.ndarray:
    """:func:`_arith_runs` in NumPy: two passes over the output (the steps, then
    their running sum in place), in ``dtype`` (int32 wraps in the intermediate
    sums but every value fits)."""
    out = np.repeat(step.astype(dtype), length) if len(length) else np.zeros(0, dtype)
    if total:
        jump = first.copy()
        jump[1:] -= first[:-1] + step[:-1] * (length[:-1] - 1)
        out[start] = jump.astype(dtype)
        np.add.accumulate(out, out=out, dtype=dtype)
    return out


def _build_general(analysis) -> RLayout:
    """Any row order: CSR of sources in front order, rows sorted by pivot, one
    CSR→CSC transpose (linear, but a random scatter of nnz entries)."""
    (m, n, k, nf, fm, fn, rk, col_ptr, cols, fbase, rowperm, slots_of, r1,
     r1_ptr) = _front_arrays(analysis)

    # ---- rows: singleton rows of A, then the front rows (front order)
    r1_len = np.diff(r1_ptr)
    row_f = np.repeat(np.arange(nf, dtype=np.int64), rk)
    first_row = np.cumsum(rk) - rk
    row_i = np.arange(len(row_f), dtype=np.int64) - np.repeat(first_row, rk)
    f_len = fn[row_f] - row_i
    lens = np.concatenate([r1_len, f_len])
    indptr = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    nnz = int(indptr[-1])
    nnz1 = int(r1_ptr[-1])
    # ---- entries, row by row (CSR): column and source
    idx = np.empty(nnz, dtype=np.int64)
    src = np.empty(nnz, dtype=np.int64)
    if nnz1:
        idx[:nnz1] = np.asarray(analysis.r1_cols, dtype=np.int64)
        src[:nnz1] = -1 - np.arange(nnz1, dtype=np.int64)
    if nnz > nnz1:
        # offset of an entry inside its row, j = row_i + (0, 1, ...)
        j = np.arange(nnz - nnz1, dtype=np.int64)
        j -= np.repeat(indptr[r1:-1] - nnz1 - row_i, f_len)
        base_c = np.repeat(col_ptr[row_f], f_len)
        np.add(base_c, j, out=base_c)
        np.take(cols, base_c, out=idx[nnz1:])
        del base_c
        base_s = np.repeat(fbase[row_f] + row_i * fn[row_f], f_len)
        np.add(base_s, j, out=src[nnz1:])
        del base_s, j
    piv = np.concatenate([np.asarray(analysis.r1_pivot, dtype=np.int64)[:r1],
                          cols[col_ptr[row_f] + row_i]])
    slots_r = np.concatenate([rowperm[:r1]] + [slots_of[f][:int(rk[f])] for f in range(nf)
                                                if rk[f]]) if len(piv) else \
        np.zeros(0, dtype=np.int64)
    itype = np.int32 if max(nnz, n, k) < 2 ** 31 - 1 else np.int64
    Rcsr = sp.csr_array((src, idx.astype(itype), indptr.astype(itype)), shape=(len(piv), n))
    del idx
    if len(piv) > 1 and not np.all(np.diff(piv) > 0):
        live = np.argsort(piv, kind="stable")
        Rcsr = Rcsr[live]
        slots_r = slots_r[live]
    if len(piv) < k:
        Rcsr = sp.vstack([Rcsr, sp.csr_array((k - len(piv), n), dtype=np.int64)], format="csr")
    Rc = Rcsr.tocsc()
    del Rcsr
    Rc.sort_indices()
    ind = Rc.indices.astype(itype, copy=False)
    ptr = Rc.indptr.astype(itype, copy=False)
    src_c = np.ascontiguousarray(Rc.data, dtype=np.int64)
    r1_pos = np.flatnonzero(src_c < 0)
    r1_nz = np.asarray(analysis.r1_nz, dtype=np.int64)[-1 - src_c[r1_pos]] if len(r1_pos) \
        else np.zeros(0, dtype=np.int64)
    rest = np.ones(m, dtype=bool)
    rest[slots_r] = False
    qorder = np.concatenate([slots_r, np.flatnonzero(rest)]).astype(np.int64)
    for a in (ind, ptr, src_c, fbase, r1_pos, r1_nz, qorder):
        a.flags.writeable = False
    return RLayout(shape=(k, n), indptr=ptr, indices=ind, _src=src_c, fbase=fbase,
                   r1_pos=r1_pos, r1_nz=r1_nz, qorder=qorder, slots_of=slots_of)
