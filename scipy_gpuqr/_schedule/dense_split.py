"""Dense fronts factorized over every device of a multi-device factorization: the plan and its rule.

The upper tree of a multi-device factorization runs on one device
(:mod:`.devices`), and on 3-D problems its few largest fronts hold most of
the flops. A dense front (:mod:`.dense`) is a blocked Householder QR: per
panel of ``nb`` columns a latency-bound *chain* (the panel's factorization,
its ``T``) and a GEMM-bound update of the trailing columns. Split over ``k``
devices (:mod:`scipy_gpuqr._engine.split_front`), the front stays where it
was assembled (the *main* device); the trailing columns are cut into blocks
of ``nb`` columns, each block owned by one device, which applies every
panel's reflectors to it. The main device factorizes the panels, and with a
look-ahead of one panel it also updates the next panel's block itself, so
the chain panel ``p`` → update of block ``p+1`` → panel ``p+1`` never waits
for another device (the tiled QR's main-device scheme, Kim and Park, see
:mod:`scipy_gpuqr.tiled`). A block owned by another device comes back to the
front when it becomes the look-ahead block; the panels' reflectors and ``T``
go to every device that still updates a block. The arithmetic is the
one-device dense path's, column by column: R, the reflectors, ``T`` and the
contribution block end in the front as there.

Per panel the model (:func:`split_seconds`) takes the longest of the main
device (chain, look-ahead update, its own blocks' updates) and every other
device (its blocks' updates, the panel's transfer to it), each from
:class:`~.dense.DenseModel`'s constants, plus the blocks' round trips over
the peer link and the host's enqueueing (a floor per call). The main device's
share of blocks is chosen so that its chain plus its updates match the
others' updates (:func:`block_owners`). :func:`split_rule` keeps a front
where the model saves at least :data:`SPLIT_MIN_SECONDS` and
:data:`SPLIT_MIN_SHARE` of its one-device dense time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dense import DenseModel, dense_path_seconds

__all__ = ["SplitModel", "SplitPlan", "block_owners", "block_rows", "split_seconds", "split_plan",
           "split_rule", "split_weights", "tile_path_seconds", "SPLIT_MIN_SECONDS",
           "SPLIT_MIN_SHARE"]

#: Least modelled saving (seconds) of a front split over the devices.
SPLIT_MIN_SECONDS = 2e-3

#: Least modelled saving as a share of the front's one-device dense time.
SPLIT_MIN_SHARE = 0.10


@dataclass(frozen=True)
class SplitModel:
    """Cost of a dense front split over devices (seconds), beside :class:`~.dense.DenseModel`.

    Attributes
    ----------
    dense : DenseModel
        The panel chain's and the GEMMs' costs.
    peer_rate : float
        Bytes per second between two devices (a peer copy; the tiled QR's
        calibration measured 375 GB/s between two H200 over NVLink).
    step_seconds : float
        Fixed cost per panel and device taking part (events, copies' latency).
    call_seconds : float
        Host time per modelled call (a library call or copy, with its share of
        the Python around it): one host thread enqueues every device's work,
        so the calls' sum is a floor of the front's time. Two layers on one
        H200 enqueued a split front at 34 µs per call (fronts of 6116 and 6842
        columns, GPU-bound, so that is the host's own time; bench/RESULTS.md).
    min_columns : int
        Fronts of fewer columns to factorize are not split.
    min_seconds, min_share : float
        Least modelled saving of a split front: seconds, and share of its
        one-device time (:data:`SPLIT_MIN_SECONDS`, :data:`SPLIT_MIN_SHARE`).
    """

    dense: DenseModel = DenseModel()
    peer_rate: float = 250e9
    step_seconds: float = 20e-6
    call_seconds: float = 30e-6
    min_columns: int = 1024
    min_seconds: float = SPLIT_MIN_SECONDS
    min_share: float = SPLIT_MIN_SHARE


@dataclass(frozen=True)
class SplitPlan:
    """How one dense front is split: the owner of each block of ``nb`` columns.

    Attributes
    ----------
    ndev : int
        Devices taking part (0 is the main device, the one holding the front).
    nb : int
        Columns per block (the dense path's panel width).
    owners : ndarray of int64, shape (ceil(fn / nb),)
        Device of each column block (blocks 0 and 1 are always the main's).
    seconds : float
        Modelled seconds split (:func:`split_seconds`).
    one_device_seconds : float
        Modelled seconds of the one-device dense path.
    """

    ndev: int
    nb: int
    owners: np.ndarray
    seconds: float = 0.0
    one_device_seconds: float = 0.0

    def blocks_of(self, d: int) -> list:
        """Column blocks of device ``d``, in order."""
        return np.flatnonzero(self.owners == d).tolist()

    def as_dict(self) -> dict:
        return {"ndev": int(self.ndev), "nb": int(self.nb),
                "blocks": [len(self.blocks_of(d)) for d in range(self.ndev)],
                "seconds": float(self.seconds),
                "one_device_seconds": float(self.one_device_seconds)}


def _panels(fm: int, fn: int, stair, nb: int):
    """First column, active rows and width of every panel (as ``panels_of``)."""
    nfact = min(int(fm), int(fn))
    j = np.arange(0, max(nfact, 0), nb, dtype=np.int64)
    b = np.minimum(nb, nfact - j)
    if stair is None:
        t = np.full(len(j), fm, dtype=np.int64)
    else:
        st = np.asarray(stair, dtype=np.int64)
        t = np.minimum(np.maximum(st[j + b - 1], j + b), fm) if len(j) else j
    return j, (t - j).astype(np.float64), b.astype(np.float64)


def _parts(fm, fn, stair, model: SplitModel):
    """Per panel: the chain's seconds (panel and its ``T``), the seconds of the
    update of one trailing column and the panel's last active row; per block
    its width and the rows it needs (past them the block stays zero)."""
    d = model.dense
    nb = int(d.panel)
    j, rows, b = _panels(fm, fn, stair, nb)
    per_col = np.where(rows > d.kernel_max_rows, d.geqrf_column_seconds,
                       d.column_seconds + d.row_seconds * rows)
    chain = d.panel_seconds + b * per_col + 2.0 * rows * b * b / d.gemm_rate
    col = 4.0 * rows * b / d.gemm_rate
    nblk = -(-int(fn) // nb)
    width = np.minimum(nb, int(fn) - nb * np.arange(nblk)).astype(np.float64)
    top = j + rows                      # each panel's last active row (+1)
    need = (top[np.minimum(np.arange(nblk), len(top) - 1)] if len(top)
            else np.zeros(nblk)).astype(np.float64)
    return rows, b, chain, col, width, need


def block_rows(fm: int, fn: int, stair, nb: int) -> np.ndarray:
    """Rows of each block of ``nb`` columns that the factorization reads or writes
    (block ``c`` takes updates from panels ``≤ c`` only, whose active rows end at
    panel ``min(c, last)``'s; the rows below stay as assembled)."""
    j, rows, b = _panels(fm, fn, stair, int(nb))
    nblk = -(-int(fn) // int(nb))
    if not len(j):
        return np.zeros(nblk, dtype=np.int64)
    top = (j + rows).astype(np.int64)
    return top[np.minimum(np.arange(nblk), len(top) - 1)]


def block_owners(fm: int, fn: int, stair, ndev: int,
                 model: SplitModel = SplitModel(), itemsize: int = 8) -> np.ndarray:
    """Owner of each block of ``nb`` columns of a front split over ``ndev`` devices.

    The first blocks stay on the main device (device 0): blocks 0 and 1 always
    (the first panel, and the first look-ahead block, never updated
    elsewhere), and as many more as the main device's panel chain takes to
    cover the other devices' first copies of their blocks (a block of another
    device is first needed back at its step minus one), never the last one.
    The others go round the devices by a smooth weighted round robin: the
    main device's weight ``x`` makes its chain plus its updates match each
    other device's updates over the whole front
    (``C + x B = (1 - x) B / (k - 1)``, ``C`` the chain's and ``B`` the
    trailing updates' seconds), the others share the rest equally.
    """
    nb = int(model.dense.panel)
    nblk = -(-int(fn) // nb)
    owners = np.zeros(nblk, dtype=np.int64)
    if ndev <= 1 or nblk <= 2:
        return owners
    rows, b, chain, col, width, need = _parts(fm, fn, stair, model)
    P = len(rows)
    # the bulk (not look-ahead) updates of every panel: blocks p+2 on
    B = sum(float(col[p] * width[p + 2:].sum()) for p in range(P))
    C = float(chain.sum()) + sum(float(col[p] * width[p + 1]) for p in range(P)
                                 if p + 1 < nblk)
    k = int(ndev)
    x = 0.0 if B <= 0 else min(max((B - (k - 1) * C) / (k * B), 0.0), 1.0 / k)
    weight = np.full(k, (1.0 - x) / (k - 1))
    weight[0] = x
    # the others' copies of their blocks (about a (k-1)/k share each, over one link each)
    setup = float((width * need).sum()) * itemsize / model.peer_rate / max(k - 1, 1)
    # (at least the last block goes round: a front of three blocks is split too)
    lead, t = 2, 0.0
    while lead < nblk - 1 and lead - 2 < P and t < setup:
        t += float(chain[lead - 2])
        lead += 1
    credit = np.zeros(k)
    for c in range(lead, nblk):
        credit += weight
        d = int(np.argmax(credit))
        owners[c] = d
        credit[d] -= 1.0
    return owners


def split_seconds(fm: int, fn: int, stair, owners, model: SplitModel = SplitModel(),
                  itemsize: int = 8) -> float:
    """Modelled seconds of a front factorized with its column blocks on ``owners``.

    A timeline per device: the main device runs, per panel ``p``, the chain
    (the panel, its ``T``), the look-ahead update of block ``p+1`` (once that
    block is back from its owner) and its own blocks' updates, one after the
    other; every other device first receives its blocks (the rows they need),
    then per panel receives the panel, updates block ``p+2`` and sends it back
    when it is its own (the copy beside its next updates), and updates its
    other blocks. Each step costs at least
    ``step_seconds`` per device; the whole at least the host's enqueueing of
    every call (``call_seconds`` each: one host thread enqueues all devices).
    """
    owners = np.asarray(owners, dtype=np.int64)
    k = int(owners.max()) + 1 if len(owners) else 1
    rows, b, chain, col, width, need = _parts(fm, fn, stair, model)
    P = len(rows)
    nblk = len(width)
    link = itemsize / model.peer_rate
    sub = -(-int(model.dense.panel) // 32)          # panel kernel launches per panel
    wd = [np.where(owners == d, width, 0.0) for d in range(k)]
    nd = [(owners == d).astype(np.float64) for d in range(k)]
    t0 = 0.0                                        # the main device's clock
    th = [float((wd[d] * need).sum()) * link for d in range(k)]   # the others' clocks
    ready = {}                                      # block -> when it is back on main
    calls = 0
    for p in range(P):
        t0 += float(chain[p]) + model.step_seconds
        fac = t0
        if p + 1 < nblk:
            t0 = max(t0, ready.get(p + 1, 0.0)) + float(col[p] * width[p + 1])
        own = float(wd[0][p + 2:].sum())
        if own > 0:
            if p + 2 < nblk and owners[p + 2] == 0:
                ready[p + 2] = t0 + float(col[p] * width[p + 2])
            t0 += float(col[p]) * own
        calls += 4 * sub + 8 + 3 * int(nd[0][p + 2:].sum())
        for d in range(1, k):
            w = float(wd[d][p + 2:].sum())
            if w <= 0:
                continue
            t = max(th[d], fac + rows[p] * b[p] * link) + model.step_seconds
            if p + 2 < nblk and owners[p + 2] == d:
                t += float(col[p] * width[p + 2])
                ready[p + 2] = t + width[p + 2] * need[p + 2] * link    # copied back meanwhile
                w -= float(width[p + 2])
            th[d] = t + float(col[p]) * w
            calls += 8
    end = max([t0] + th[1:])
    return float(max(end, calls * model.call_seconds))


def split_plan(fm: int, fn: int, stair, ndev: int, model: SplitModel = SplitModel(),
               itemsize: int = 8) -> SplitPlan:
    """The :class:`SplitPlan` of a front over ``ndev`` devices, with both modelled times."""
    owners = block_owners(fm, fn, stair, ndev, model, itemsize)
    one = dense_path_seconds(fm, fn, stair, model.dense)
    return SplitPlan(int(ndev), int(model.dense.panel), owners,
                     split_seconds(fm, fn, stair, owners, model, itemsize), one)


def split_rule(fronts, candidates, ndev: int, model: SplitModel = SplitModel(), *,
               itemsize: int = 8, min_seconds: float | None = None,
               min_share: float | None = None) -> dict:
    """The fronts among ``candidates`` worth splitting over ``ndev`` devices.

    Parameters
    ----------
    fronts : FrontStructure
        ``fm``, ``fn``, ``stair`` and ``col_ptr`` of every front.
    candidates : iterable of int
        Dense fronts of the upper tree (those on the main device while the
        other devices' subtrees are done).
    ndev : int
    model : SplitModel
    min_seconds, min_share : float, optional
        Least saving kept: at least ``min_seconds`` and ``min_share`` of the
        one-device dense time (default: the model's).

    Returns
    -------
    dict
        Front -> :class:`SplitPlan`.
    """
    out = {}
    if ndev <= 1:
        return out
    min_seconds = model.min_seconds if min_seconds is None else min_seconds
    min_share = model.min_share if min_share is None else min_share
    for f in candidates:
        f = int(f)
        fm, fn = int(fronts.fm[f]), int(fronts.fn[f])
        if min(fm, fn) < model.min_columns:
            continue
        stair = fronts.stair[fronts.col_ptr[f]:fronts.col_ptr[f + 1]]
        plan = split_plan(fm, fn, stair, ndev, model, itemsize)
        gain = plan.one_device_seconds - plan.seconds
        if gain >= min_seconds and gain >= min_share * plan.one_device_seconds:
            out[f] = plan
    return out


def tile_path_seconds(fm: int, fn: int, flops: float, model: SplitModel = SplitModel()) -> float:
    """Modelled seconds of a front on the tile tasks alone (:class:`~.dense.DenseModel`:
    a chain of ``ceil(nfact / tile)`` launches and its flops at the uberkernel's rate)."""
    d = model.dense
    nfact = min(int(fm), int(fn))
    return (-(-nfact // int(d.tile)) + 1) * d.launch_seconds + float(flops) / d.uber_rate


def split_weights(fronts, flops, ndev: int, model: SplitModel = SplitModel(), *,
                  itemsize: int = 8) -> tuple[np.ndarray, dict]:
    """Each front's weight in the upper tree when its dense path is split over the devices.

    A front of the upper tree runs while (most of) the other devices' subtrees
    are done; split, it costs its split time instead of its one-device time
    (the better of the dense path and the tile tasks). A root on a dense path,
    split or not, also pays the copy of its rows of R after it ends
    (:class:`~.dense.DenseModel`'s ``r_copy_rate``; a tile front's rows leave
    while its later tiles run). For the device mapping
    (:func:`~.devices.map_fronts`'s ``upper_weights``) its flops are scaled by
    that ratio, so that mapping a large front into the upper tree looks as
    cheap as it is.

    Parameters
    ----------
    fronts : FrontStructure
    flops : ndarray (nfronts,)
        The analysis' per-front flops (the mapping's weights).
    ndev : int
    model, itemsize
        As :func:`split_rule` (the gain kept: the model's ``min_seconds`` and
        ``min_share``).

    Returns
    -------
    weights : ndarray (nfronts,)
        ``flops`` with the splittable fronts' entries scaled.
    plans : dict
        Front -> :class:`SplitPlan` of the fronts worth splitting.
    """
    w = np.asarray(flops, dtype=np.float64).copy()
    plans = {}
    if ndev <= 1 or fronts.nfronts == 0:
        return w, plans
    nfact = np.minimum(fronts.fm, fronts.fn)
    for f in np.flatnonzero(nfact >= model.min_columns).tolist():
        fm, fn = int(fronts.fm[f]), int(fronts.fn[f])
        stair = fronts.stair[fronts.col_ptr[f]:fronts.col_ptr[f + 1]]
        plan = split_plan(fm, fn, stair, ndev, model, itemsize)
        rc = 0.0                # a root's rows of R copied after it, on a dense path
        if int(fronts.parent[f]) < 0:
            fp = min(int(fronts.fp[f]), fn)
            rc = (fp * fn - fp * (fp - 1) / 2) * itemsize / model.dense.r_copy_rate
        one = min(plan.one_device_seconds + rc, tile_path_seconds(fm, fn, w[f], model))
        split = plan.seconds + rc
        gain = one - split
        if one > 0 and gain >= model.min_seconds and gain >= model.min_share * one:
            w[f] *= split / one
            plans[f] = plan
    return w, plans
