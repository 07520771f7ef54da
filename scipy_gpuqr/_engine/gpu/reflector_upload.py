"""The Householder columns of a stage whose pool left the device, uploaded for ``Q``.

``Q``'s replay reads, of each front, only its reflectors: of each record the
columns ``[col, col + nref)`` of its row tiles after the first (the first comes
from the VT pool). In a staircase front those lie in a lower staircase: the
rows a column block's reflectors reach start near its diagonal and end at the
staircase, so the rest of a front — R's rows right of its diagonal, the
contribution block, the zeros below the staircase — is never read by it, and
for the large fronts of a 3-D problem that rest is most of the front. A
staged factorization's earlier pools are uploaded again for every replay, so
only those pieces go up, packed one after another into a buffer of their
total size (:class:`ReflectorLayout`): a large front's records in column bands
of at most :data:`BAND_COLUMNS` columns, each band the rows its records read
with its width as row pitch (one strided copy, ``cudaMemcpy2DAsync``); small
fronts, fronts whose bands would hold most of them and the dense fronts whole,
in runs of contiguous copies. The stage's replay records are rewritten to point
into that buffer (``F``, and for a band ``fn`` its width and ``col`` from its
first column), so the device never holds the stage's whole pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._schedule.tasks import TASK_BYTES
from ..memory import make_room
from .array_ops import copy_into
from .mapped import device_view

__all__ = ["ReflectorLayout", "UploadedReflectors", "reflector_layout", "reflector_pieces",
           "upload_reflectors", "packed_size_bound", "SMALL_FRONT", "BAND_COLUMNS",
           "WHOLE_SHARE", "BAND_UPLOADS", "BAND_UPLOAD", "MAPPED_BAND_BYTES"]

#: Fronts of at most this many elements go up whole (merged with their
#: neighbours), and gaps of at most this many elements between them are sent
#: too: fewer, larger copies where a strided one would save little.
SMALL_FRONT = 1 << 15

#: Most columns of one band of a large front's reflectors (one strided copy each,
#: :func:`reflector_pieces`). A band goes up from the first row its records read
#: to the last, so it sends the triangle above its later columns' first rows too
#: (about ``width² / 2`` elements) and one copy call per band: 512 columns keep
#: that triangle a few per cent of a large front's reflectors and the copied
#: rows 4 KB long (float64), where the copy engines run at the link's speed.
BAND_COLUMNS = 512

#: A large front whose bands hold more than this share of its elements goes up
#: whole (one contiguous copy, merged with its neighbours).
WHOLE_SHARE = 0.9

#: How a band goes up from a pinned host pool: ``"mapped"``, a copy kernel
#: reading it where the pool lies (:func:`~.mapped.device_view`; bands of at
#: least :data:`MAPPED_BAND_BYTES`), or ``"copy2d"``, one
#: ``cudaMemcpy2DAsync`` (the copy engines bring rows of a few KB up below
#: the link's speed). A pageable pool always takes the 2-D copy.
BAND_UPLOADS = ("mapped", "copy2d")
#: The default of :data:`BAND_UPLOADS` (``"mapped"`` has not shown a gain in a
#: whole solve: bench/RESULTS.md, issue 22).
BAND_UPLOAD = "copy2d"
#: Smallest band read by the copy kernel (smaller ones: one 2-D copy each, whose
#: call costs less than a launch and its views).
MAPPED_BAND_BYTES = 1 << 20


def _record_extents(rec: np.ndarray, tile: int) -> tuple:
    """Per record ``(first row, end row)`` of the pool rows it reads: its row tiles
    after the first (``rows[1:napply]``), each up to ``tile`` rows, none past
    ``fm`` (the first tile comes from the VT pool)."""
    rows = rec["rows"].astype(np.int64)
    used = (np.arange(rows.shape[1]) >= 1) & (np.arange(rows.shape[1]) < rec["napply"][:, None])
    big = np.iinfo(np.int64).max
    row1 = np.where(used, rows, big).min(axis=1)
    fm = rec["fm"].astype(np.int64)
    rend = np.where(used, np.minimum(rows + tile, fm[:, None]), -1).max(axis=1)
    return row1, rend


def _bands(col, cend, row1, rend, width: int) -> list:
    """One large front's records (sorted by ``col``) cut into column bands of at
    most ``width`` columns (a record wider than that: a band of its own):
    ``(first record, end record, c0, c1, r0, r1)``, the band's columns
    ``[c0, c1)`` and the rows ``[r0, r1)`` its records read."""
    out, i, n = [], 0, len(col)
    while i < n:
        c0, j = int(col[i]), i + 1
        while j < n and int(cend[j]) - c0 <= width:
            j += 1
        out.append((i, j, c0, int(cend[i:j].max()), int(row1[i:j].min()),
                    int(rend[i:j].max())))
        i = j
    return out


def reflector_pieces(plan, sid: int, small: int = SMALL_FRONT, whole=(),
                     band: int = BAND_COLUMNS) -> tuple:
    """What ``Q``'s replay reads of stage ``sid``'s pool.

    Parameters
    ----------
    plan : ReplayPlan
        The factorization's replay plan (records per level, the level's stage).
    sid : int
        The stage.
    small : int
        See :data:`SMALL_FRONT`.
    whole : iterable of (int, int)
        ``(start, length)`` of fronts read whole (the stage's dense fronts,
        which the replay applies from their place in the pool).
    band : int
        See :data:`BAND_COLUMNS`.

    Returns
    -------
    runs : list of (int, int)
        Contiguous ``(start, length)`` ranges of the pool (elements).
    blocks : list of (int, int, int, int, int, int, int)
        ``(start, rows, width, pitch, front, c0, r0)``: the first ``width``
        elements of ``rows`` rows ``pitch`` apart from ``start``, the band of
        reflector columns ``[c0, c0 + width)`` of the front at ``front``, its
        rows from ``r0`` on.
    """
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    stage = np.repeat(np.asarray(plan.level_stage, dtype=np.int64), np.diff(lp))
    rec = plan.records[: int(lp[-1])][stage == sid]
    # a record's first row tile comes from the VT pool: the pool is read only
    # for its later tiles (``rows[1:napply]``)
    rec = rec[rec["napply"] > 1]
    whole = sorted((int(a), int(n)) for a, n in whole)
    row1, rend = _record_extents(rec, int(plan.tile))
    F0 = rec["F"].astype(np.int64)
    col = rec["col"].astype(np.int64)
    order = np.lexsort((col, F0))
    F0, col, row1, rend = F0[order], col[order], row1[order], rend[order]
    fm = rec["fm"].astype(np.int64)[order]
    fn = rec["fn"].astype(np.int64)[order]
    cend = np.minimum(col + rec["nref"].astype(np.int64)[order], fn)
    first = np.flatnonzero(np.r_[True, F0[1:] != F0[:-1]]) if len(F0) else F0
    stop = np.r_[first[1:], len(F0)].astype(np.int64) if len(F0) else F0
    pieces = [(a, n, None) for a, n in whole]
    for s, e in zip(first.tolist(), stop.tolist()):
        a, m, n = int(F0[s]), int(fm[s]), int(fn[s])
        size = m * n
        if size <= small:
            pieces.append((a, size, None))
            continue
        bands = _bands(col[s:e], cend[s:e], row1[s:e], rend[s:e], band)
        if sum((c1 - c0) * (r1 - r0) for _, _, c0, c1, r0, r1 in bands) > WHOLE_SHARE * size:
            pieces.append((a, size, None))      # about the whole front: one copy
            continue
        pieces.extend((a + r0 * n + c0, 0, (a + r0 * n + c0, r1 - r0, c1 - c0, n, a, c0, r0))
                      for _, _, c0, c1, r0, r1 in bands)
    runs, blocks = [], []
    for a, size, block in sorted(pieces, key=lambda p: (p[0], p[2] is not None)):
        if block is not None:
            blocks.append(block)
        elif runs and a - (runs[-1][0] + runs[-1][1]) <= small:
            runs[-1] = (runs[-1][0], max(runs[-1][0] + runs[-1][1], a + size) - runs[-1][0])
        else:
            runs.append((a, size))
    return runs, blocks


def packed_size_bound(offset, fm, fn, whole, tile: int, small: int = SMALL_FRONT) -> int:
    """Elements of a stage's :class:`ReflectorLayout` at most, from its fronts'
    shapes alone (before the factorization, for the memory plan).

    Parameters
    ----------
    offset, fm, fn : array of int
        Each front's place in the stage's pool, its rows and columns (the
        whole front is factorized, its contribution block included: its
        reflectors lie in its first ``fm`` columns, rounded up to ``tile``).
    whole : array of bool
        Fronts uploaded whole (dense fronts).
    tile : int
    small : int
        See :data:`SMALL_FRONT`.
    """
    offset, fm, fn = (np.asarray(v, dtype=np.int64) for v in (offset, fm, fn))
    width = np.minimum(fn, -(-fm // tile) * tile)
    size = fm * fn
    run = np.asarray(whole, dtype=bool) | (width >= fn) | (size <= small)
    total = int((fm * width)[~run].sum())
    order = np.argsort(offset[run], kind="stable")
    a, n = offset[run][order], size[run][order]
    if len(a):
        # runs merge across gaps of at most ``small`` elements, which go up too
        end = np.maximum.accumulate(a + n)
        gap = a[1:] - end[:-1]
        total += int(n.sum()) + int(gap[(gap > 0) & (gap <= small)].sum())
    return total


@dataclass(frozen=True)
class ReflectorLayout:
    """Stage ``sid``'s reflector pieces packed into one buffer, and its replay
    records pointed into it (host data, made once per factorization and stage).

    Attributes
    ----------
    runs : list of (int, int, int)
        ``(start, length, at)``: pool elements ``start:start+length`` go to
        the buffer at ``at``.
    blocks : list of (int, int, int, int, int)
        ``(start, rows, width, pitch, at)``: ``rows`` rows of ``width``
        elements, ``pitch`` apart in the pool from ``start``, go to the buffer
        at ``at`` with row pitch ``width``.
    size : int
        Elements of the buffer.
    records : ndarray of TASK_DTYPE
        The records of the stage's levels, in level order, with ``F`` (and a
        block front's ``fn``) rewritten for the buffer.
    level_start : dict
        level → first of its records in ``records``.
    """

    runs: list
    blocks: list
    size: int
    records: np.ndarray
    level_start: dict

    def front_at(self, start: int) -> int:
        """Buffer offset of pool element ``start`` that lies in a run (a dense
        front read whole)."""
        for a, n, at in self.runs:
            if a <= start < a + n:
                return at + start - a
        raise KeyError(f"pool element {start} was not uploaded whole")


def reflector_layout(plan, sid: int, small: int = SMALL_FRONT, whole=(),
                     band: int = BAND_COLUMNS) -> ReflectorLayout:
    """The :class:`ReflectorLayout` of stage ``sid`` (arguments as
    :func:`reflector_pieces`)."""
    runs, blocks = reflector_pieces(plan, sid, small=small, whole=whole, band=band)
    at, packed_runs, packed_blocks = 0, [], []
    bands_of = {}                   # front -> [(c0, width, r0, at)] in column order
    for piece in sorted([(a, n, None) for a, n in runs] + [(b[0], 0, b) for b in blocks],
                        key=lambda p: (p[0], p[2] is not None)):
        a, n, block = piece
        if block is None:
            packed_runs.append((a, n, at))
            at += n
        else:
            start, nrows, width, pitch, front, c0, r0 = block
            packed_blocks.append((start, nrows, width, pitch, at))
            bands_of.setdefault(front, []).append((c0, width, r0, at))
            at += nrows * width
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    levels = np.flatnonzero(np.asarray(plan.level_stage, dtype=np.int64) == sid)
    level_start, parts, n = {}, [], 0
    for lv in levels.tolist():
        level_start[lv] = n
        parts.append(plan.records[lp[lv]: lp[lv + 1]])
        n += int(lp[lv + 1] - lp[lv])
    recs = (np.concatenate(parts) if parts else plan.records[:0]).copy()
    _point_records(recs, packed_runs, bands_of)
    return ReflectorLayout(packed_runs, packed_blocks, at, recs, level_start)


def _point_records(recs: np.ndarray, runs: list, bands_of: dict) -> None:
    """Rewrite ``recs``' front bases for the packed buffer, in place; a record
    that reads no pool element (one row tile) gets base 0. A record of a front
    sent in bands reads its band: base ``at - r0·width``, ``fn`` the band's
    width as row pitch, ``col`` counted from the band's first column."""
    F = recs["F"].astype(np.int64)
    reads = recs["napply"] > 1
    newF = np.zeros(len(recs), dtype=np.int64)
    newfn = recs["fn"].astype(np.int64)
    newcol = recs["col"].astype(np.int64)
    inblock = np.zeros(len(recs), dtype=bool)
    if bands_of:
        col = recs["col"].astype(np.int64)
        cend = col + recs["nref"].astype(np.int64)
        order = np.argsort(F, kind="stable")
        Fs = F[order]
        for front, bands in bands_of.items():
            a, b = np.searchsorted(Fs, [front, front + 1])
            idx = order[a:b]
            idx = idx[reads[idx]]
            c0, w, r0, at = (np.array(v, dtype=np.int64) for v in zip(*sorted(bands)))
            k = np.searchsorted(c0, col[idx], side="right") - 1
            if np.any(k < 0) or np.any((cend[idx] > c0[k] + w[k])
                                       & (cend[idx] <= recs["fn"][idx])):
                raise AssertionError("reflector_layout: a record's columns outside its band")
            inblock[idx] = True
            newF[idx] = at[k] - r0[k] * w[k]
            newfn[idx] = w[k]
            newcol[idx] = col[idx] - c0[k]
    rest = np.flatnonzero(reads & ~inblock)
    if len(rest):
        starts = np.array([a for a, _, _ in runs], dtype=np.int64)
        lens = np.array([n for _, n, _ in runs], dtype=np.int64)
        ats = np.array([at for _, _, at in runs], dtype=np.int64)
        k = np.searchsorted(starts, F[rest], side="right") - 1
        end = F[rest] + recs["fm"][rest].astype(np.int64) * recs["fn"][rest].astype(np.int64)
        if np.any(k < 0) or np.any(end > starts[k] + lens[k]):
            raise AssertionError("reflector_layout: a record's front outside the uploaded runs")
        newF[rest] = F[rest] - starts[k] + ats[k]
    recs["F"] = newF
    recs["fn"] = newfn
    recs["col"] = newcol


@dataclass
class UploadedReflectors:
    """A stage's reflector pieces on the device (or in the NumPy model).

    Attributes
    ----------
    values : array
        The packed buffer (:class:`ReflectorLayout`).
    layout : ReflectorLayout
    records : array
        ``layout.records`` where the executor reads them (the device: bytes).
    """

    values: object
    layout: ReflectorLayout
    records: object
    #: the event after its copies, where they went on another stream than the one
    #: that allocated it (:func:`upload_reflectors`' ``copy_stream``); else None
    ready: object = None

    def wait(self, stream) -> None:
        """Work queued on ``stream`` from now on waits for the copies (nothing
        where they were queued on the allocating stream itself)."""
        if self.ready is not None:
            stream.wait_event(self.ready)

    def level_records(self, lv: int, nrec: int):
        """Level ``lv``'s ``nrec`` records (a device pointer offset for CuPy)."""
        a = self.layout.level_start[lv]
        if isinstance(self.records, np.ndarray) and self.records.dtype.names:
            return self.records[a: a + nrec]
        return self.records[a * TASK_BYTES: (a + nrec) * TASK_BYTES]

    def front(self, start: int, size: int):
        """The ``size`` elements of a front uploaded whole from pool element ``start``."""
        at = self.layout.front_at(start)
        return self.values[at: at + size]


def _band(host: np.ndarray, a: int, m: int, w: int, n: int) -> np.ndarray:
    """A band's ``m`` rows of ``w`` elements, ``n`` apart from ``host[a]``, as a
    read-only view (its last row may end where the pool does: ``host[a:a+m*n]``
    may be shorter than ``m`` whole rows)."""
    flat = host.reshape(-1)
    isz = flat.itemsize
    if m and a + (m - 1) * n + w > flat.size:
        raise ValueError(f"band of {m} x {w} (pitch {n}) from {a} past a pool of {flat.size}")
    return np.lib.stride_tricks.as_strided(flat[a:], shape=(m, w), strides=(n * isz, isz),
                                           writeable=False)


def upload_reflectors(host: np.ndarray, layout: ReflectorLayout, xp,
                      band_upload: str | None = None, *, copy_stream=None,
                      records_host=None) -> UploadedReflectors:
    """``host``'s pieces packed as ``layout`` says, copied on the current stream
    (asynchronous from pinned memory); ``xp`` NumPy gives the model.
    ``band_upload``: one of :data:`BAND_UPLOADS` (default :data:`BAND_UPLOAD`).

    ``copy_stream``: the buffers are taken on the current stream and the copies
    queued on ``copy_stream`` behind the work queued so far on the current one
    (whose freed blocks the buffers may reuse), so that they run beside the
    current stream's later work; the result's :attr:`~UploadedReflectors.ready`
    is the event after them. The cached blocks are then not given back first
    (that synchronizes the device: the caller skips the upload where the
    buffers do not fit), and the records go up from ``records_host``, a
    pinned copy of ``layout.records``' bytes that outlives the copy (required).
    """
    how = BAND_UPLOAD if band_upload is None else band_upload
    if how not in BAND_UPLOADS:
        raise ValueError(f"band_upload must be one of {BAND_UPLOADS}, got {how!r}")
    if getattr(xp, "__name__", "") != "cupy":
        dev = np.empty(layout.size, dtype=host.dtype)
        for a, n, at in layout.runs:
            dev[at: at + n] = host[a: a + n]
        for a, m, w, n, at in layout.blocks:     # a band's last row may end the pool
            dev[at: at + m * w].reshape(m, w)[:] = _band(host, a, m, w, n)
        return UploadedReflectors(dev, layout, layout.records)
    rt = xp.cuda.runtime
    if copy_stream is None:
        make_room(xp, layout.size * host.itemsize)      # cached blocks under a pool limit
    elif records_host is None:
        raise ValueError("upload_reflectors: copy_stream needs records_host")
    dev = xp.empty(layout.size, dtype=host.dtype)
    recs = None
    ready = None
    cur = xp.cuda.get_current_stream()
    if copy_stream is not None:
        recs = xp.empty(max(int(records_host.nbytes), 1), dtype=np.uint8)
        after = xp.cuda.Event(disable_timing=True)
        after.record(cur)
        copy_stream.wait_event(after)
        cur = copy_stream
    stream = cur.ptr
    isz, src, dst = host.itemsize, host.ctypes.data, dev.data.ptr
    for a, n, at in layout.runs:
        rt.memcpyAsync(dst + at * isz, src + a * isz, n * isz, rt.memcpyHostToDevice, stream)
    view = (device_view(xp, host.reshape(-1)) if how == "mapped" and host.ndim <= 1
            and any(m * w * isz >= MAPPED_BAND_BYTES for _, m, w, _, _ in layout.blocks)
            else None)
    for a, m, w, n, at in layout.blocks:
        if view is not None and m * w * isz >= MAPPED_BAND_BYTES:
            band = xp.ndarray((m, w), dtype=host.dtype, memptr=view.data + a * isz,
                              strides=(n * isz, isz))  # its last row may end the pool
            with cur:
                copy_into(dev[at: at + m * w].reshape(m, w), band)
        else:
            rt.memcpy2DAsync(dst + at * isz, w * isz, src + a * isz, n * isz, w * isz, m,
                             rt.memcpyHostToDevice, stream)
    if copy_stream is None:
        recs = xp.asarray(np.ascontiguousarray(layout.records).view(np.uint8))
    else:
        if records_host.nbytes:
            rt.memcpyAsync(recs.data.ptr, records_host.ctypes.data, records_host.nbytes,
                           rt.memcpyHostToDevice, stream)
        ready = xp.cuda.Event(disable_timing=True)
        ready.record(copy_stream)
    return UploadedReflectors(dev, layout, recs, ready)
