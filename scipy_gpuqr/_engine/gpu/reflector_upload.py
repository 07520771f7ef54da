"""The Householder columns of a stage whose pool left the device, uploaded for ``Q``.

``Q``'s replay reads, of each front, only the columns its reflectors occupy
(columns below ``col + nref`` of its records, the pivot columns, from the
second row tile of a record on: the first comes from the VT pool); the rest of a front — R's rows right of them and the
contribution block — is never read by it, and for the large fronts of a
3-D problem that rest is most of the front. A staged factorization's earlier
pools are uploaded again for every replay, so only those columns go up: one
strided copy (``cudaMemcpy2DAsync``) per large front, small fronts and
fronts whose reflectors fill them in runs of contiguous copies. The other
elements of the device copy are left unset (NaN in the NumPy model, so a
read outside the pieces shows in the tests).
"""

from __future__ import annotations

import numpy as np

__all__ = ["reflector_pieces", "upload_reflectors", "SMALL_FRONT"]

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
    blocks : list of (int, int, int, int)
        ``(start, rows, width, pitch)``: the first ``width`` elements of
        ``rows`` rows ``pitch`` apart from ``start`` (a front's reflector
        columns).
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
    fronts = [(a, m * n, (a + r * n, m - r, w, n)) if w < n and m * n > small else (a, m * n, None)
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


def upload_reflectors(host: np.ndarray, runs, blocks, xp):
    """A device array of ``host``'s size holding its pieces (see
    :func:`reflector_pieces`), copied on the current stream (asynchronous from
    pinned memory); ``xp`` NumPy gives the model (NaN elsewhere)."""
    if getattr(xp, "__name__", "") != "cupy":
        dev = np.full(host.shape, np.nan, dtype=host.dtype)
        for a, n in runs:
            dev[a: a + n] = host[a: a + n]
        for a, m, w, n in blocks:
            dev[a: a + m * n].reshape(m, n)[:, :w] = host[a: a + m * n].reshape(m, n)[:, :w]
        return dev
    rt = xp.cuda.runtime
    dev = xp.empty(host.shape, dtype=host.dtype)
    stream = xp.cuda.get_current_stream().ptr
    isz, src, dst = host.itemsize, host.ctypes.data, dev.data.ptr
    for a, n in runs:
        rt.memcpyAsync(dst + a * isz, src + a * isz, n * isz, rt.memcpyHostToDevice, stream)
    for a, m, w, n in blocks:
        rt.memcpy2DAsync(dst + a * isz, n * isz, src + a * isz, n * isz, w * isz, m,
                         rt.memcpyHostToDevice, stream)
    return dev
