"""The Householder columns of a stage whose pool left the device, uploaded for ``Q``.

``Q``'s replay reads, of each front, only the columns its reflectors occupy
(columns below ``col + nref`` of its records, the pivot columns, from the
second row tile of a record on: the first comes from the VT pool); the rest
of a front — R's rows right of them and the contribution block — is never
read by it, and for the large fronts of a 3-D problem that rest is most of
the front. A staged factorization's earlier pools are uploaded again for
every replay, so only those pieces go up, packed one after another into a
buffer of their total size (:class:`ReflectorLayout`): a large front's
reflector block with its width as row pitch (one strided copy,
``cudaMemcpy2DAsync``), small fronts, fronts whose reflectors fill them and
the dense fronts whole, in runs of contiguous copies. The stage's replay
records are rewritten to point into that buffer (``F`` and, for a block,
``fn`` its pitch), so the device never holds the stage's whole pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._schedule.tasks import TASK_BYTES
from ..memory import make_room

__all__ = ["ReflectorLayout", "UploadedReflectors", "reflector_layout", "reflector_pieces",
           "upload_reflectors", "packed_size_bound", "SMALL_FRONT"]

#: Fronts of at most this many elements go up whole (merged with their
#: neighbours), and gaps of at most this many elements between them are sent
#: too: fewer, larger copies where a strided one would save little.
SMALL_FRONT = 1 << 15


def reflector_pieces(plan, sid: int, small: int = SMALL_FRONT, whole=()) -> tuple:
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

    Returns
    -------
    runs : list of (int, int)
        Contiguous ``(start, length)`` ranges of the pool (elements).
    blocks : list of (int, int, int, int, int, int)
        ``(start, rows, width, pitch, front, top)``: the first ``width``
        elements of ``rows`` rows ``pitch`` apart from ``start``, the
        reflector columns of the front at ``front`` from its row ``top`` on.
    """
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    stage = np.repeat(np.asarray(plan.level_stage, dtype=np.int64), np.diff(lp))
    rec = plan.records[: int(lp[-1])][stage == sid]
    # a record's first row tile comes from the VT pool: the pool is read only
    # for its later tiles (``rows[1:napply]``)
    rec = rec[rec["napply"] > 1]
    whole = sorted((int(a), int(n)) for a, n in whole)
    F0 = rec["F"].astype(np.int64)
    order = np.argsort(F0, kind="stable")
    F0 = F0[order]
    fm = rec["fm"].astype(np.int64)[order]
    fn = rec["fn"].astype(np.int64)[order]
    cend = (rec["col"].astype(np.int64) + rec["nref"].astype(np.int64))[order]
    rows = rec["rows"].astype(np.int64)
    used = (np.arange(rows.shape[1]) >= 1) & (np.arange(rows.shape[1]) < rec["napply"][:, None])
    row1 = np.where(used, rows, np.iinfo(np.int64).max).min(axis=1)[order]
    first = np.flatnonzero(np.r_[True, F0[1:] != F0[:-1]]) if len(F0) else F0
    width = np.minimum(np.maximum.reduceat(cend, first), fn[first])
    top = np.minimum.reduceat(row1, first)
    fronts = [(a, m * n, (a + r * n, m - r, w, n, a, r)) if w < n and m * n > small
              else (a, m * n, None)
              for a, m, n, w, r in zip(F0[first].tolist(), fm[first].tolist(),
                                       fn[first].tolist(), width.tolist(), top.tolist())]
    runs, blocks = [], []
    for a, size, block in sorted(fronts + [(a, n, None) for a, n in whole]):
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


def reflector_layout(plan, sid: int, small: int = SMALL_FRONT, whole=()) -> ReflectorLayout:
    """The :class:`ReflectorLayout` of stage ``sid`` (arguments as
    :func:`reflector_pieces`)."""
    runs, blocks = reflector_pieces(plan, sid, small=small, whole=whole)
    at, packed_runs, packed_blocks = 0, [], []
    block_of = {}
    for piece in sorted([(a, n, None) for a, n in runs] + [(b[0], 0, b) for b in blocks]):
        a, n, block = piece
        if block is None:
            packed_runs.append((a, n, at))
            at += n
        else:
            start, nrows, width, pitch, front, top = block
            packed_blocks.append((start, nrows, width, pitch, at))
            block_of[front] = (at, top, width)
            at += nrows * width
    lp = np.asarray(plan.level_ptr, dtype=np.int64)
    levels = np.flatnonzero(np.asarray(plan.level_stage, dtype=np.int64) == sid)
    level_start, parts, n = {}, [], 0
    for lv in levels.tolist():
        level_start[lv] = n
        parts.append(plan.records[lp[lv]: lp[lv + 1]])
        n += int(lp[lv + 1] - lp[lv])
    recs = (np.concatenate(parts) if parts else plan.records[:0]).copy()
    _point_records(recs, packed_runs, block_of)
    return ReflectorLayout(packed_runs, packed_blocks, at, recs, level_start)


def _point_records(recs: np.ndarray, runs: list, block_of: dict) -> None:
    """Rewrite ``recs``' front bases for the packed buffer, in place; a record
    that reads no pool element (one row tile) gets base 0."""
    F = recs["F"].astype(np.int64)
    reads = recs["napply"] > 1
    newF = np.zeros(len(recs), dtype=np.int64)
    newfn = recs["fn"].astype(np.int64)
    inblock = np.zeros(len(recs), dtype=bool)
    if block_of:
        fronts = np.fromiter(block_of, dtype=np.int64, count=len(block_of))
        order = np.argsort(fronts)
        fronts = fronts[order]
        at, top, width = (np.array(v, dtype=np.int64)[order] for v in zip(*block_of.values()))
        k = np.minimum(np.searchsorted(fronts, F), len(fronts) - 1)
        inblock = reads & (fronts[k] == F)
        newF[inblock] = at[k[inblock]] - top[k[inblock]] * width[k[inblock]]
        newfn[inblock] = width[k[inblock]]
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


def upload_reflectors(host: np.ndarray, layout: ReflectorLayout, xp) -> UploadedReflectors:
    """``host``'s pieces packed as ``layout`` says, copied on the current stream
    (asynchronous from pinned memory); ``xp`` NumPy gives the model."""
    if getattr(xp, "__name__", "") != "cupy":
        dev = np.empty(layout.size, dtype=host.dtype)
        for a, n, at in layout.runs:
            dev[at: at + n] = host[a: a + n]
        for a, m, w, n, at in layout.blocks:
            dev[at: at + m * w].reshape(m, w)[:] = host[a: a + m * n].reshape(m, n)[:, :w]
        return UploadedReflectors(dev, layout, layout.records)
    rt = xp.cuda.runtime
    make_room(xp, layout.size * host.itemsize)      # cached blocks under a pool limit
    dev = xp.empty(layout.size, dtype=host.dtype)
    stream = xp.cuda.get_current_stream().ptr
    isz, src, dst = host.itemsize, host.ctypes.data, dev.data.ptr
    for a, n, at in layout.runs:
        rt.memcpyAsync(dst + at * isz, src + a * isz, n * isz, rt.memcpyHostToDevice, stream)
    for a, m, w, n, at in layout.blocks:
        rt.memcpy2DAsync(dst + at * isz, w * isz, src + a * isz, n * isz, w * isz, m,
                         rt.memcpyHostToDevice, stream)
    recs = xp.asarray(np.ascontiguousarray(layout.records).view(np.uint8))
    return UploadedReflectors(dev, layout, recs)
