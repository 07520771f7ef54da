"""R's values device → host: progressive, chunked, through a reused pinned staging buffer.

Two parts:

* :func:`final_entries` — for a one-stage schedule, after which launch every
  prefix of R's CSC ``data`` is final. A column ``j`` of R holds rows whose
  fronts all have ``j`` in their column list (the owner of pivot ``j`` and
  descendants holding ``j`` in their contribution block; ancestors never do).
  Its entries are final once no later launch writes column ``j`` of any of
  those fronts: Factorize writes its column tile (``col``), Apply and
  Apply+Factorize columns ``[c0, c1)`` (the factorize part's tile starts at
  ``c0``), S-Assemble the whole front, Pack-Assemble the whole parent (the
  child too, to be safe), a dense front's factorization the whole front
  until the launch that joins it (the engine runs it on a side stream from
  its assembly launch on, the main stream waits for it before its parent's
  Pack-Assemble, or after the last launch). At tile granularity, per (front, column tile), the
  last writing launch; per column, the maximum over the fronts holding it;
  a running maximum over columns gives the final prefix of ``data``.
* the copiers: :class:`CupyRCopy` gathers each final range on a side stream
  (a prefetched gather kernel over R's gather index, uploaded on that stream while the kernels
  run, through pinned buffers: :func:`upload_through_pinned`) into a device slot, copies it into one of two slots of a pinned
  staging buffer (allocated once per process, see :func:`staging_for`) and
  from there into an ordinary NumPy array, double buffered, on a worker
  thread; once the worker knows which entries are final, the engine records
  an event after a launch that leaves a chunk more of R final (none before:
  the first one then covers every range final by its launch). The worker
  first touches every page of that array, on a few threads, while the first
  launches run: a fresh array's page faults cost the single-threaded copy out
  of a slot most of its time (about 2 GB/s against ten times that on touched
  pages), at the factorization's end where R's last range waits for them. The copies out of a slot are split
  over threads too. No pinned allocation per factorization, nothing of R
  outlives the returned array.
  :class:`NumpyRCopy` does the same synchronously for :class:`NumpyDevice`
  (CPU tests: a range copied before it is final would differ from R).
* the host stage's gather (:func:`strided_runs`, :func:`gather_runs`): a host
  front's R lies in its row-major pool, so R's CSC order walks down its
  columns, one page per entry. Its gather index is cut once into runs of a
  constant stride (a column's rows), runs of adjacent columns starting on one
  row into blocks; a block is read a tile of whole row pieces at a time,
  transposed in cache and copied out run by run, on threads. Where the
  front is factorized in column slabs, :class:`ColumnRCopy` gathers each
  part's columns as soon as the part is back in the pool (on a worker, while
  the device works on the next parts), and only the rest after the launches.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..._schedule.native import run_ranges, run_split, thread_count
from ..._schedule.tasks import TaskType, applies, record_launches
from .array_ops import take_rows

__all__ = ["upload_through_pinned", "final_entries", "final_entries_cached", "tile_final_launches", "whole_front_writes", "staging_for", "PinnedStaging", "StagingTurns", "NumpyRCopy",
           "CupyRCopy",
           "SLOT_BYTES", "MIN_CHUNK_BYTES", "StridedRuns", "strided_runs", "gather_runs",
           "touched", "runs_between", "column_bounds", "ColumnRCopy"]

#: Bytes of one pinned staging slot (two slots per staging buffer).
SLOT_BYTES = 32 << 20
#: Elements per thread of the host copies (page touching, a slot's copy out).
HOST_COPY_PER_THREAD = 1 << 20

#: A progressive copy is started once this many bytes of R became final.
MIN_CHUNK_BYTES = 16 << 20

#: Shortest run :func:`gather_runs` copies by blocks (shorter ones: by index).
RUN_MIN = 32
#: Most runs (adjacent columns) of one block of :func:`gather_runs`.
BLOCK_RUNS = 128
#: Rows of one tile of a block (transposed in cache).
TILE_ROWS = 256
#: Fewest entries per thread of :class:`ColumnRCopy`'s gathers: a slab part's
#: columns hold a few million values, and the parts' gathers must keep up with
#: the device (the last one is on the factorization's path).
PART_PER_THREAD = 1 << 18


def final_entries(analysis, layout, stage, tile: int, pos=None) -> np.ndarray:
    """Entries of R's ``data`` final after each launch of a stage.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    layout : RLayout
        R's layout of ``analysis``.
    stage : StageSchedule
        The stage (materialized records).
    tile : int
        Tile edge of the schedule.
    pos : ndarray of int64, optional
        Positions in R's ``data`` of the stage's own entries, increasing (its
        gather map, :meth:`~.rlayout.RLayout.stage_maps`); None: the only
        stage, whose entries are all of ``data``.

    Returns
    -------
    ndarray of int64, shape (nlaunch,)
        The stage's first ``out[L]`` entries (of ``data``, or of ``pos``) are
        final once launch ``L`` completed (nondecreasing; the last value is
        their count). Only the stage's fronts write its pool: the columns'
        entries of fronts of other stages do not wait for its launches.
    """
    fs = analysis.fronts
    nf = fs.nfronts
    n = int(layout.shape[1])
    nl = int(stage.nlaunch)
    total = layout.nnz if pos is None else len(pos)
    out = np.full(nl, total, dtype=np.int64)
    if nl == 0 or nf == 0:
        return out
    cellbase, cell_last = tile_final_launches(fs, stage, tile)
    # per column of R: the maximum over the fronts holding it
    col_ptr = fs.col_ptr.astype(np.int64)
    ncol = np.diff(col_ptr)
    fcol_f = np.repeat(np.arange(nf, dtype=np.int64), ncol)
    fcol_j = np.arange(int(col_ptr[-1]), dtype=np.int64) - np.repeat(col_ptr[:-1], ncol)
    last = cell_last[cellbase[fcol_f] + fcol_j // tile]
    col_final = np.full(n, -1, dtype=np.int64)
    np.maximum.at(col_final, np.asarray(fs.cols, dtype=np.int64)[:int(col_ptr[-1])], last)
    np.maximum.accumulate(col_final, out=col_final)
    cut = np.searchsorted(col_final, np.arange(nl, dtype=np.int64), side="right")
    ptr = np.asarray(layout.indptr, dtype=np.int64)
    out[:] = ptr[cut] if pos is None else np.searchsorted(pos, ptr[cut], side="left")
    out[-1] = total
    return out


def tile_final_launches(fs, stage, tile: int) -> tuple:
    """The last launch of a stage that writes each column tile of each front.

    Parameters
    ----------
    fs : FrontStructure
        The analysis' fronts.
    stage : StageSchedule
        The stage (materialized records).
    tile : int
        Tile edge of the schedule.

    Returns
    -------
    (cellbase, last) : ndarray of int64
        Front ``f``'s column tiles are cells ``cellbase[f] .. cellbase[f + 1] - 1``
        (tile ``j // tile`` of its local column ``j``); ``last[cell]`` is the last
        launch that writes it (Factorize its column tile, Apply and
        Apply+Factorize their columns, the whole-front writes of
        :func:`whole_front_writes`), -1 for none. A front's R rows in a column
        are final once that launch completed: no other front writes them.
    """
    nf = fs.nfronts
    t = stage.tasks
    launch_of = record_launches(stage.launch_ptr)
    typ = t["type"].astype(np.int64)
    front = t["front"].astype(np.int64)
    fn = fs.fn.astype(np.int64)
    ntile = (fn + tile - 1) // tile
    cellbase = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(ntile, out=cellbase[1:])
    cell_last = np.full(int(cellbase[-1]), -1, dtype=np.int64)
    whole = whole_front_writes(fs, stage, launch_of, typ, front, typ == TaskType.S_ASSEMBLE)
    fac = typ == TaskType.FACTORIZE
    app = applies(typ)
    t0 = np.concatenate([t["col"][fac].astype(np.int64) // tile,
                         t["c0"][app].astype(np.int64) // tile])
    t1 = np.concatenate([t["col"][fac].astype(np.int64) // tile + 1,
                         (t["c1"][app].astype(np.int64) + tile - 1) // tile])
    ff = np.concatenate([front[fac], front[app]])
    ll = np.concatenate([launch_of[fac], launch_of[app]])
    t1 = np.minimum(t1, ntile[ff])
    _range_max(cell_last, cellbase[ff] + t0, t1 - t0, ll)
    cell_front = np.repeat(np.arange(nf, dtype=np.int64), ntile)
    np.maximum(cell_last, whole[cell_front], out=cell_last)
    return cellbase, cell_last


def _range_max(out: np.ndarray, start, length, value) -> None:
    """``out[start[i]:start[i] + length[i]] = max(out there, value[i])`` for every ``i``
    (int64; ranges of length <= 0 do nothing) without a write per element.

    A range of length ``l``, ``2^k <= l < 2^(k+1)``, is the union of the two
    blocks of ``2^k`` elements at its ends; a table per ``k`` takes each block's
    value at its first element, and the tables are folded from the widest
    down, each block into the two halves of the next table (a maximum, so the
    blocks' overlap is harmless). Work in the ranges and the levels, not in
    their elements: an Apply record of a schedule spans up to 16 column tiles.
    """
    ok = length > 0
    if not ok.any():
        return
    start, length, value = start[ok], length[ok], value[ok]
    k = np.frexp(length.astype(np.float64))[1].astype(np.int64) - 1     # floor(log2)
    n = len(out)
    tables = [out] + [np.full(n, -1, dtype=out.dtype) for _ in range(int(k.max()))]
    for lv, tab in enumerate(tables):
        sel = k == lv
        if sel.any():
            s, v = start[sel], value[sel]
            np.maximum.at(tab, s, v)
            np.maximum.at(tab, s + length[sel] - (1 << lv), v)
    for lv in range(len(tables) - 1, 0, -1):
        tab, half, below = tables[lv], 1 << (lv - 1), tables[lv - 1]
        np.maximum(below, tab, out=below)
        np.maximum(below[half:], tab[:n - half], out=below[half:])


def whole_front_writes(fs, stage, launch_of, typ, front, own) -> np.ndarray:
    """Per front (all of the analysis'), the last launch of a stage that writes
    the whole front, -1 for none: of the stage's records (their ``launch_of``,
    ``typ`` and ``front``, int64), those selected by ``own`` (bool) write the
    front they name, a Pack-Assemble its parent (and, counted to be safe, the
    child it reads), a dense front's factorization the front up to the launch
    that joins it."""
    nf = fs.nfronts
    nl = int(stage.nlaunch)
    whole = np.full(nf, -1, dtype=np.int64)
    np.maximum.at(whole, front[own], launch_of[own])
    sel = typ == TaskType.PACK_ASSEMBLE
    if sel.any():
        np.maximum.at(whole, front[sel], launch_of[sel])
        par = np.asarray(fs.parent, dtype=np.int64)[front[sel]]
        ok = par >= 0
        np.maximum.at(whole, par[ok], launch_of[sel][ok])
    joins = getattr(stage, "dense_join", {})
    for f, Ld in getattr(stage, "dense", {}).items():
        whole[f] = max(whole[f], min(joins.get(f, Ld + 1), nl - 1))
    return whole


def final_entries_cached(analysis, layout, sched, stage, tile: int, key,
                         pos=None) -> np.ndarray:
    """:func:`final_entries`, cached with the layout under ``key`` (the schedule's
    identity: plan, tunables, launch and task counts) and the stage."""
    full = ("final_entries", key, tuple(int(f) for f in stage.fronts), int(stage.nlaunch),
            int(stage.ntasks))
    return layout.extra(full, lambda: final_entries(analysis, layout, stage, tile, pos))


class PinnedStaging:
    """Two pinned host slots of ``nbytes`` each, used by one copy at a time.

    The slots are allocated where they are first asked for (:attr:`slots`):
    on the copy's worker thread, while the launches run. The allocation (two
    ``cudaHostAlloc`` of up to :data:`SLOT_BYTES`, some 30 ms) is then not
    made on the caller's thread before a new process's first launch. Given
    ``slots`` (two ``uint8`` arrays of at least ``nbytes`` in pinned memory
    allocated ahead: a multi-device call's, made before its devices' threads
    start) nothing is allocated.
    """

    def __init__(self, nbytes: int, slots=None):
        self.nbytes = int(nbytes)
        self.lock = threading.Lock()
        self._made = threading.Lock()
        self._slots = None
        if slots is not None:
            slots = [s[:self.nbytes] for s in slots]
            if len(slots) != 2 or any(s.dtype != np.uint8 or s.size < self.nbytes
                                      for s in slots):
                raise ValueError(f"PinnedStaging: two uint8 slots of {self.nbytes} bytes")
            self._slots = slots

    @property
    def slots(self) -> list:
        """The two pinned slots (``uint8`` arrays of :attr:`nbytes`), made on first use."""
        with self._made:
            if self._slots is None:
                import cupyx
                self._slots = [cupyx.empty_pinned((self.nbytes,), dtype=np.uint8)
                               for _ in range(2)]
            return self._slots

    def wait(self) -> None:
        """Nothing to wait for: the caller locked the staging for its copy."""

    def release(self) -> None:
        """The copy ended (its worker read every slot it filled): unlocked."""
        self.lock.release()


class StagingTurns:
    """One :class:`PinnedStaging` shared by copies that run one after another, in
    the order their turns were handed out (:meth:`turn`).

    The stages of one device copy their R on its one copy stream in stage
    order, so one staging per device serves them all. A copy's turn is taken
    where its copier is opened (on the thread that enqueues the stages, in
    order, without blocking); its worker waits (:meth:`_Turn.wait`) until the
    turn before was released, which a worker does only after it read every
    range out of the slots (:meth:`CupyRCopy._drain` waits for each range's
    event and hands it to the sink before the next is issued into that slot).
    """

    def __init__(self, staging: PinnedStaging):
        self.staging = staging
        self.nbytes = staging.nbytes
        self._lock = threading.Lock()
        self._last = None
        #: turns handed out
        self.turns = 0

    def turn(self) -> "_Turn":
        """The next copy's turn (the staging's interface: ``nbytes``, ``slots``,
        ``wait``, ``release``)."""
        with self._lock:
            t = _Turn(self.staging, self._last)
            self._last = t
            self.turns += 1
        return t


class _Turn:
    """One copy's turn at a :class:`StagingTurns`' staging."""

    def __init__(self, staging, prev):
        self._staging = staging
        self.nbytes = staging.nbytes
        self._prev = prev
        self.done = threading.Event()

    @property
    def slots(self) -> list:
        return self._staging.slots

    def wait(self) -> None:
        """Returns once the turn before ended (its copy read every slot it filled)."""
        prev, self._prev = self._prev, None
        if prev is not None:
            prev.done.wait()

    def release(self) -> None:
        """This copy is done with the slots; a turn released without having waited
        (its copy never started) passes on only once the turn before ended."""
        prev, self._prev = self._prev, None
        if prev is None or prev.done.is_set():
            self.done.set()
            return

        def _after():
            prev.done.wait()
            self.done.set()
        threading.Thread(target=_after, name="gpuqr-staging-turn", daemon=True).start()


class _SharedStaging:
    """The process's staging buffer: one, of the largest size asked for so far
    (at most :data:`SLOT_BYTES` a slot), made on first use and kept: a new
    factorization, of any pattern, allocates no pinned memory."""

    def __init__(self):
        self._lock = threading.Lock()
        self._buf = None

    def take(self, nbytes: int) -> PinnedStaging:
        with self._lock:
            if self._buf is None or self._buf.nbytes < nbytes:
                # a smaller buffer still in use stays its copy's until released
                self._buf = PinnedStaging(nbytes)
            buf = self._buf
        if buf.lock.acquire(blocking=False):
            return buf
        tmp = PinnedStaging(nbytes)     # another copy holds it: a temporary one
        tmp.lock.acquire()
        return tmp


_STAGING = _SharedStaging()


def staging_for(layout, nbytes: int = SLOT_BYTES):
    """A pinned staging buffer for a copy of R's values (``layout``: R's layout,
    which sizes it), locked for the caller: the process's shared one, or a
    temporary one when another copy holds it. Release with
    ``staging.lock.release()``."""
    nb = int(min(nbytes, max(layout.nnz, 1) * 8))
    return _STAGING.take(nb)


@dataclass(frozen=True, eq=False)
class StridedRuns:
    """A gather index cut into runs of one stride (:func:`strided_runs`).

    Attributes
    ----------
    stride : int
        Pool elements between consecutive entries of a run (a front's row length).
    start, src, length : ndarray of int64
        Per run of at least :data:`RUN_MIN` entries: its first output entry, its
        first pool element, its entries.
    block_ptr : ndarray of int64
        Blocks of runs ``block_ptr[b] .. block_ptr[b+1]-1``: adjacent pool
        columns (``src`` one apart), at most :data:`BLOCK_RUNS`.
    rest : ndarray of int64
        Output entries in no such run (gathered by index).
    """

    stride: int
    start: np.ndarray
    src: np.ndarray
    length: np.ndarray
    block_ptr: np.ndarray
    rest: np.ndarray


def strided_runs(index: np.ndarray, stride: int, min_len: int = RUN_MIN,
                 block: int = BLOCK_RUNS) -> StridedRuns:
    """``index`` (pool element of each output entry) as runs of ``stride``
    (see :class:`StridedRuns`): one pass over the index, made once per layout."""
    index = np.asarray(index)
    n = len(index)
    stride = int(stride)
    if n == 0 or stride <= 0:
        z = np.zeros(0, dtype=np.int64)
        return StridedRuns(stride, z, z, z, np.zeros(1, dtype=np.int64),
                           np.arange(n, dtype=np.int64))
    cut = np.flatnonzero(index[1:] - index[:-1] != stride)      # run ends before cut+1
    starts = np.concatenate(([0], cut + 1)).astype(np.int64)
    lens = np.diff(np.concatenate((starts, [n]))).astype(np.int64)
    long_ = lens >= max(int(min_len), 1)
    st, ln = starts[long_], lens[long_]
    src = index[st].astype(np.int64)
    short_s, short_l = starts[~long_], lens[~long_]
    rest = (np.repeat(short_s - np.cumsum(short_l) + short_l, short_l)
            + np.arange(int(short_l.sum()), dtype=np.int64))
    # a new block where the columns are not adjacent, and every ``block`` runs
    newb = np.ones(len(st), dtype=bool)
    if len(st) > 1:
        newb[1:] = src[1:] != src[:-1] + 1
    bstart = np.flatnonzero(newb)
    ptr = []
    for a, b in zip(bstart.tolist(), bstart[1:].tolist() + [len(st)]):
        ptr.extend(range(a, b, max(int(block), 1)))
    ptr.append(len(st))
    return StridedRuns(stride, st, src, ln, np.asarray(ptr, dtype=np.int64), rest)


def gather_runs(pool: np.ndarray, index: np.ndarray, runs: StridedRuns,
                out: np.ndarray, per_thread: int = 1 << 21) -> None:
    """``out[:] = pool[index]`` with ``index`` cut into ``runs``
    (:func:`strided_runs` of it): each block read in tiles of
    :data:`TILE_ROWS` whole row pieces (one page each instead of one per entry),
    transposed in a buffer of the thread's and copied out run by run; the
    entries in no run by index. Blocks split over threads of at least
    ``per_thread`` entries each (NumPy's copies release the GIL)."""
    flat = pool.reshape(-1)
    isz = flat.itemsize
    stride = runs.stride
    ptr = runs.block_ptr
    nblock = len(ptr) - 1
    if len(runs.rest):
        out[runs.rest] = flat[np.asarray(index)[runs.rest]]
    if nblock <= 0:
        return
    first = runs.src[ptr[:-1]]
    height = np.maximum.reduceat(runs.length, ptr[:-1]) if len(runs.length) else first
    width = np.diff(ptr)
    fits = first + (height - 1) * stride + width <= flat.size

    def blocks(b0, b1):
        most = int((height[b0:b1] * width[b0:b1]).max(initial=0))
        tmp = np.empty(max(most, 1), dtype=out.dtype)
        for b in range(int(b0), int(b1)):
            r0, r1 = int(ptr[b]), int(ptr[b + 1])
            h, w = int(height[b]), int(width[b])
            st, ln = runs.start[r0:r1], runs.length[r0:r1]
            if not fits[b]:             # past the pool's end: by index
                for s, m in zip(st.tolist(), ln.tolist()):
                    np.take(flat, index[s:s + m], out=out[s:s + m])
                continue
            src = np.lib.stride_tricks.as_strided(flat[int(first[b]):], shape=(h, w),
                                                  strides=(stride * isz, isz), writeable=False)
            t = tmp[:h * w].reshape(w, h)
            for i in range(0, h, TILE_ROWS):
                np.copyto(t[:, i:i + TILE_ROWS], src[i:i + TILE_ROWS].T)
            for c, (s, m) in enumerate(zip(st.tolist(), ln.tolist())):
                out[s:s + m] = t[c, :m]

    # threads of equal shares of entries, a block each at least
    cum = np.concatenate(([0], np.cumsum(height * width)))
    threads = thread_count(int(cum[-1]), max(int(per_thread), 1))
    cuts = np.searchsorted(cum, np.linspace(0, cum[-1], threads + 1)).clip(0, nblock)
    cuts[0], cuts[-1] = 0, nblock
    run_ranges(blocks, np.unique(cuts))


def runs_between(runs: StridedRuns, lo: int, hi: int) -> StridedRuns:
    """``runs`` cut to the output entries ``[lo, hi)`` (no run may cross ``lo`` or
    ``hi``: cut at a column's first entry, :func:`column_bounds`); its blocks
    cut there too, so :func:`gather_runs` of it writes only ``out[lo:hi]``."""
    r0, r1 = (int(x) for x in np.searchsorted(runs.start, [lo, hi], side="left"))
    p = runs.block_ptr
    inner = p[(p > r0) & (p < r1)]
    ptr = (np.concatenate(([r0], inner, [r1])) - r0 if r1 > r0
           else np.zeros(1, dtype=np.int64))
    k0, k1 = np.searchsorted(runs.rest, [lo, hi], side="left")
    return StridedRuns(runs.stride, runs.start[r0:r1], runs.src[r0:r1], runs.length[r0:r1],
                       ptr.astype(np.int64), runs.rest[k0:k1])


def column_bounds(index: np.ndarray, runs: StridedRuns, base: int, fm: int,
                  fn: int):
    """First output entry of each column of a row-major ``fm × fn`` front at pool
    element ``base`` (``fn + 1`` entries, the last the index's length), where the
    output (R's order) walks the front's columns in order, every entry inside
    the front; else None. ``runs``: the index's :func:`strided_runs` with the
    front's row length as stride (a run lies in one column)."""
    index = np.asarray(index)
    n = len(index)
    if runs.stride != fn or fn <= 0:
        return None
    if n == 0:
        return np.zeros(fn + 1, dtype=np.int64)
    rest = np.asarray(runs.rest, dtype=np.int64)
    st = np.concatenate((runs.start, rest))
    ln = np.concatenate((runs.length, np.ones(len(rest), dtype=np.int64)))
    last = np.concatenate((runs.src + (runs.length - 1) * fn, index[rest].astype(np.int64)))
    src = np.concatenate((runs.src, index[rest].astype(np.int64))) - int(base)
    order = np.argsort(st, kind="stable")
    st, ln, src, last = st[order], ln[order], src[order], last[order] - int(base)
    if (int(st[0]) != 0 or np.any(st[1:] != st[:-1] + ln[:-1]) or int(src.min()) < 0
            or int(last.max()) >= fm * fn):
        return None
    col = src % fn
    if np.any(col[1:] < col[:-1]):
        return None
    at = np.searchsorted(col, np.arange(fn + 1), side="left")
    return np.where(at < len(st), st[np.minimum(at, len(st) - 1)], n).astype(np.int64)


class ColumnRCopy:
    """A host stage's R values gathered from its pool by column ranges of its
    front: a range as soon as the part of a column slab holding it is back in
    the pool (:meth:`part_done`, called by the slabs as they queue the part's
    copy back; a worker thread waits for that copy, then gathers), the rest
    after the launches (:meth:`result`). The front's columns are final once
    their part is back: later slabs only read them.

    Parameters
    ----------
    pool : ndarray
        The host stage's pool (read as parts land).
    index : ndarray
        Pool element of every value, in output order (R's).
    prepare : callable
        ``prepare() -> (runs, bounds)``: the index's :func:`strided_runs` and
        :func:`column_bounds` (None: no gather before the launches end), run
        on the worker first (cached per layout by the caller).
    out : future or ndarray, optional
        Where the values go (a :func:`touched` array being made; default a
        new array).
    dtype : numpy dtype
    """

    def __init__(self, pool, index, prepare, out=None, dtype=np.float64):
        self.pool, self.index = pool, np.asarray(index)
        self.dtype = np.dtype(dtype)
        self._out = out
        self._ex = ThreadPoolExecutor(1, thread_name_prefix="gpuqr-r-columns")
        self._prep = self._ex.submit(prepare)
        self._jobs = []
        self.early = []             # output ranges gathered before the launches ended
        self.seconds = 0.0          # the worker's gathering time, those ranges

    def _values(self) -> np.ndarray:
        out = self._out
        if hasattr(out, "result"):
            out = out.result()
        if out is None:
            out = np.empty(len(self.index), dtype=self.dtype)
        if out.shape != (len(self.index),) or out.dtype != self.dtype:
            raise ValueError(f"ColumnRCopy: out of shape {out.shape} and {out.dtype} for "
                             f"{len(self.index)} values of {self.dtype}")
        self._out = out
        return out

    def part_done(self, a0: int, a1: int, landed=None) -> None:
        """Columns ``[a0, a1)`` of the front are final once ``landed`` (a CUDA
        event: their copy back into the pool; None: already there)."""
        self._jobs.append(self._ex.submit(self._gather_part, int(a0), int(a1), landed))

    def _gather_part(self, a0, a1, landed):
        runs, bounds = self._prep.result()
        if bounds is None:
            return
        lo, hi = int(bounds[a0]), int(bounds[a1])
        if hi <= lo:
            return
        if landed is not None:
            landed.synchronize()
        t0 = time.perf_counter()
        gather_runs(self.pool, self.index, runs_between(runs, lo, hi), self._values(),
                    PART_PER_THREAD)
        self.early.append((lo, hi))
        self.seconds += time.perf_counter() - t0

    def after_launch(self, L: int) -> None:
        pass

    def launches_done(self) -> None:
        pass

    def result(self) -> np.ndarray:
        """Wait for the parts' gathers, gather the rest; R's values."""
        try:
            runs, _ = self._prep.result()
            for job in self._jobs:
                job.result()
            out = self._values()
            n = len(self.index)
            if not self.early:
                gather_runs(self.pool, self.index, runs, out)
            else:
                pos = 0
                for lo, hi in sorted(self.early) + [(n, n)]:
                    if lo > pos:
                        gather_runs(self.pool, self.index, runs_between(runs, pos, lo), out,
                                    PART_PER_THREAD)
                    pos = max(pos, hi)
            self._out = None
            return out
        finally:
            self.pool = None
            self._ex.shutdown(wait=False)

    def abort(self) -> None:
        """Stop (the engine failed): the queued gathers finish, nothing is kept."""
        self._ex.shutdown(wait=True)
        self.pool = self._out = None


class NumpyRCopy:
    """Synchronous stand-in of :class:`CupyRCopy` over a NumPy pool.

    Parameters
    ----------
    pool : ndarray
        The stage's front pool (read at the time of each copy).
    index : ndarray
        Pool element of every value, in output order.
    final : callable or None
        Returns :func:`final_entries` (copies after launches); None: all at
        the end.
    runs : StridedRuns, optional
        ``index`` cut into runs (:func:`strided_runs`): a copy of every entry
        at once then goes by :func:`gather_runs`.
    out : ndarray, optional
        Where the values go (``len(index)`` entries of ``dtype``; default a new
        array): one made and touched ahead (:func:`touched`) spares the copy
        its page faults.
    """

    def __init__(self, pool, index, final=None, dtype=np.float64, counter=None, runs=None,
                 out=None):
        self.counter = counter
        self.runs = runs
        self.pool, self.index = pool, np.asarray(index)
        self.final = final() if final is not None else None
        if out is not None and (out.shape != (len(self.index),) or out.dtype != np.dtype(dtype)):
            raise ValueError(f"NumpyRCopy: out of shape {out.shape} and {out.dtype} for "
                             f"{len(self.index)} values of {np.dtype(dtype)}")
        self.out = np.empty(len(self.index), dtype=dtype) if out is None else out
        self.done = 0
        self.copies = 0

    def _copy(self, b):
        if b > self.done:
            a = self.done

            def gather(i0, i1):         # NumPy's take releases the GIL
                np.take(self.pool, self.index[i0:i1], out=self.out[i0:i1])

            if self.runs is not None and a == 0 and b == len(self.index):
                gather_runs(self.pool, self.index, self.runs, self.out)
            else:
                run_split(gather, a, b, 1 << 22)
            self.done = b
            self.copies += 1
            if self.counter is not None:
                self.counter.append(b)

    def after_launch(self, L: int) -> None:
        if self.final is not None:
            self._copy(int(self.final[L]))

    def after_cut(self, cut: int, ev=None) -> None:
        """The first ``cut`` entries are final now (:meth:`CupyRCopy.after_cut`)."""
        self._copy(min(int(cut), len(self.index)))

    def launches_done(self) -> None:
        pass

    def result(self) -> np.ndarray:
        self._copy(len(self.index))
        out, self.out, self.pool = self.out, None, None
        return out

    def abort(self) -> None:
        self.out = self.pool = None


def _zero_range(i0: int, i1: int, out: np.ndarray) -> None:
    """Touch ``out[i0:i1]``'s pages (zeros; NumPy's fill releases the GIL)."""
    out[i0:i1] = 0


def touched(n: int, dtype, threads: int | None = None) -> np.ndarray:
    """``n`` zeros of ``dtype``, every page touched by a few threads: a fresh
    array's first writes fault its pages in one at a time, a cost a copy into
    it then need not pay (made ahead, on a worker, while the GPU runs).
    ``threads``: how many (default: one per :data:`HOST_COPY_PER_THREAD`
    elements, up to the cores)."""
    out = np.empty(int(n), dtype=dtype)
    if threads is None:
        run_split(_zero_range, 0, int(n), HOST_COPY_PER_THREAD, out)
    else:
        run_ranges(_zero_range, np.linspace(0, int(n), max(int(threads), 1) + 1).astype(np.int64),
                   out)
    return out


def upload_through_pinned(cp, out, host: np.ndarray, stream,
                          chunk_bytes: int = SLOT_BYTES) -> None:
    """``out[:] = host`` (device and host arrays of one dtype and size) on ``stream``.

    A copy from pageable memory is staged by the driver through its own pinned
    buffer and holds the calling thread, and the driver, for the whole
    transfer; an R copier's gather index (hundreds of millions of entries on
    the largest problems) then held up the launches of the other devices'
    threads in a multi-device call. Above ``chunk_bytes`` the index goes
    instead through two pinned buffers of that size in turn (CuPy's pinned
    pool hands the same blocks back to the next copier): a chunk is copied
    into a buffer on the host (NumPy leaves the GIL meanwhile) and sent
    asynchronously, a buffer refilled once its previous copy completed.
    Returns once every copy has completed, so the buffers may go back to the
    pool.
    """
    n = int(host.size)
    m = max(int(chunk_bytes) // host.itemsize, 1)
    if n <= m:
        out.set(host, stream=stream)
        return
    import cupyx
    bufs = [cupyx.empty_pinned((m,), dtype=host.dtype) for _ in range(2)]
    sent = [None, None]
    for k, first in enumerate(range(0, n, m)):
        last = min(first + m, n)
        s = k % 2
        if sent[s] is not None:
            sent[s].synchronize()
        np.copyto(bufs[s][:last - first], host[first:last])
        out[first:last].set(bufs[s][:last - first], stream=stream)
        sent[s] = cp.cuda.Event(disable_timing=True)
        sent[s].record(stream)
    for ev in sent:
        if ev is not None:
            ev.synchronize()


class CupyRCopy:
    """Progressive device → host copy of gathered R values (see the module notes).

    Parameters
    ----------
    device : CupyDevice
        Its ``stream`` runs the kernels; ``copy_stream`` the copies.
    pool : cupy.ndarray
        The stage's front pool.
    index : ndarray (host, int32/int64)
        Pool element of every value in output order (uploaded by the worker).
    staging : PinnedStaging or a turn of a StagingTurns
        Locked by the caller, or a turn the worker waits for before it fills the
        slots (:meth:`StagingTurns.turn`); released when the copy ends.
    final : callable or None
        Returns :func:`final_entries` (called on the worker); None: one copy
        after the last launch.
    sink : callable, optional
        ``sink(first, values)`` for each range as it lands (on the worker,
        ``values`` a view of the pinned slot, valid during the call) instead
        of filling an array of its own: a multi-device factorization
        scatters a stage's values straight into R's ``data``. :meth:`result`
        then returns an empty array.
    index_through_pinned : bool
        The index goes up through pinned chunks (:func:`upload_through_pinned`),
        holding no other thread: where other devices' threads enqueue meanwhile
        (a multi-device call). Otherwise in one copy from pageable memory, the
        faster on one device.
    """

    def __init__(self, device, pool, index, staging, final=None, sink=None,
                 index_through_pinned=False):
        self.dev = device
        self.cp = device.cp
        self.pool = pool
        self.index = index
        self.n = int(len(index))
        self.staging = staging
        self.final = final
        self.dtype = device.dtype
        self.q = queue.SimpleQueue()
        self.sink = sink
        self.index_through_pinned = bool(index_through_pinned)
        self.out = np.empty(self.n if sink is None else 0, dtype=self.dtype)
        self.copies = 0
        self.seconds = {}
        self._exc = None
        self._min_chunk = max(getattr(device, "r_copy_min_chunk_bytes", MIN_CHUNK_BYTES)
                              // self.dtype.itemsize, 1)
        self._final_seen = None     # final_entries once the worker computed it
        self._sent_cut = 0          # final entries at the last launch handed over
        self._thread = threading.Thread(target=self._work, name="gpuqr-rcopy", daemon=True)
        self._thread.start()

    # -- main thread ------------------------------------------------------------
    def after_launch(self, L: int) -> None:
        """Launch ``L`` was enqueued: its end may release a range of R. Only a
        launch after which at least a chunk more of R is final gets an event (the
        worker would copy nothing for the others; an event per launch cost the
        launch loop tens of milliseconds), and none before the worker knows the
        final entries: the first event after that covers every range final by
        then, as the worker copies up to the entries final at an event's launch."""
        seen = self._final_seen
        if self.final is None or seen is None:
            return
        cut = int(seen[L])
        if cut - self._sent_cut < self._min_chunk:
            return
        self._sent_cut = cut
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.dev.stream)
        self.q.put((L, ev))

    def after_cut(self, cut: int, ev) -> None:
        """The first ``cut`` entries are final once ``ev`` (an event of the
        device's) completed: a range final inside a launch's work, e.g. a split
        front's columns once its panel is factorized. Handed over only where at
        least a chunk more than already handed over (as :meth:`after_launch`)."""
        cut = min(int(cut), self.n)
        if cut - self._sent_cut < self._min_chunk:
            return
        self._sent_cut = cut
        self.q.put((("cut", cut), ev))

    def launches_done(self) -> None:
        """Every launch is enqueued: the rest after the last one."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.dev.stream)
        self.q.put((None, ev))

    def result(self) -> np.ndarray:
        """Wait for the copies; R's values (an ordinary NumPy array)."""
        self._thread.join()
        self.pool = None
        if self._exc is not None:
            exc, self._exc = self._exc, None
            self.out = None
            raise exc
        out, self.out = self.out, None
        return out

    def abort(self) -> None:
        """Stop (the engine failed): the worker drops what is left."""
        self.q.put(("abort", None))
        self._thread.join()
        self.out = self.pool = None

    # -- worker -------------------------------------------------------------------
    def _work(self):
        cp = self.cp
        try:
            t0 = time.perf_counter()
            cs = self.dev.copy_stream
            with cp.cuda.Device(self.dev.device_id):
                idx_h = np.ascontiguousarray(self.index)
                with cs:
                    didx = cp.empty(max(self.n, 1), dtype=idx_h.dtype)
                if self.n and self.index_through_pinned:
                    upload_through_pinned(cp, didx[:self.n], idx_h, cs)
                elif self.n:
                    didx[:self.n].set(idx_h, stream=cs)
                with cs:
                    slot_elems = max(min(self.staging.nbytes,
                                         getattr(self.dev, "r_copy_slot_bytes", SLOT_BYTES))
                                     // self.dtype.itemsize, 1)
                    dslots = [cp.empty(slot_elems, dtype=self.dtype) for _ in range(2)]
                final = self.final() if self.final is not None else None
                self._final_seen = final
                if self.sink is None:
                    run_split(_zero_range, 0, self.n, HOST_COPY_PER_THREAD, self.out)
                # a staging shared in turns: the copy before has read its slots
                self.staging.wait()
                hslots = [s.view(self.dtype)[:slot_elems] for s in self.staging.slots]
                self.seconds["prepare"] = time.perf_counter() - t0
                min_chunk = self._min_chunk
                issued = 0
                k = 0
                pending = []
                # items in launch order; an issue only queues work behind the launch's
                # event (never blocks); the worker blocks only to empty the older of
                # two busy slots, so it follows the GPU one chunk behind. (Skipping
                # to the newest item would wait for the last launch: the launch
                # loop runs far ahead of the GPU.)
                while True:
                    L, ev = self.q.get()
                    if L == "abort":
                        return
                    cut = (self.n if L is None else int(L[1]) if isinstance(L, tuple)
                           else int(final[L]))
                    if cut > issued and (L is None or cut - issued >= min_chunk):
                        cs.wait_event(ev)
                        while issued < cut:
                            m = min(slot_elems, cut - issued)
                            s = k % 2
                            if len(pending) == 2:
                                self._drain(pending.pop(0), hslots)
                            with cs:        # a prefetched gather (no CuPy take compiled)
                                take_rows(self.pool, didx[issued: issued + m],
                                          out=dslots[s][:m])
                            # not blocking (CuPy's default waits): two slots in flight
                            dslots[s][:m].get(stream=cs, out=hslots[s][:m],
                                              blocking=False)
                            e = cp.cuda.Event(disable_timing=True)
                            e.record(cs)
                            pending.append((s, issued, m, e))
                            issued += m
                            k += 1
                    if L is None:
                        while pending:
                            self._drain(pending.pop(0), hslots)
                        break
                cs.synchronize()
                del didx, dslots
            self.seconds["total"] = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._exc = exc
        finally:
            self.staging.release()

    def _drain(self, item, hslots):
        s, a, m, e = item
        e.synchronize()
        if self.sink is not None:
            self.sink(a, hslots[s][:m])
        else:
            out, slot = self.out[a: a + m], hslots[s][:m]

            def copy(i0, i1):               # NumPy's copy releases the GIL
                np.copyto(out[i0:i1], slot[i0:i1])
            run_split(copy, 0, m, HOST_COPY_PER_THREAD)
        self.copies += 1
        self.dev.r_copies = getattr(self.dev, "r_copies", 0) + 1
