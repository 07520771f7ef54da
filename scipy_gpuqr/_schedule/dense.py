"""Which fronts leave the bucket scheduler: *dense fronts*, chosen from the analysis.

The uberkernel's tile tasks run every front of a launch at once, but a front
of ``nfact`` columns is a chain of about ``nfact / TILE`` launches; a blocked
Householder QR whose trailing updates are cuBLAS GEMMs runs a large front at
the tensor cores' rate, at a cost per column for its panels. The engines ask
:func:`dense_front_mask` which fronts go that way, either by a constant
threshold on a front's Householder work (the analysis' count,
:func:`scipy_gpuqr._symbolic.counts.front_work`) or, by default
(:data:`DEFAULT_DENSE_FLOPS` is :data:`DENSE_RULE`), by a time model of both
paths, of the elimination tree's critical path and of the device both share
(:func:`dense_rule_mask`, :class:`DenseModel`): a front is a dense front only
where that shortens the modelled call, so one that would end last on its
slower path, or whose dense path costs more than the launches it saves, stays
with the tile tasks.

A dense front is not bucket-scheduled: the uberkernel still assembles it
(S-Assemble, Pack-Assemble of its children), the engine factorizes it right
after the launch that completes its assembly
(:mod:`scipy_gpuqr._engine.dense_front`), and its parent packs its
contribution block later. In the front state machine such a front is
*factorized externally*: its local launches carry no task, they only defer
the parent's Pack-Assemble (:func:`dense_defer` launches) so that the GPU
engine can factorize it on a side stream while the launches of other
subtrees run; the launch that packs it waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._symbolic.counts import front_work
from .pattern_cache import PerPattern
from .tasks import DEFAULT_TILE

__all__ = ["DENSE_RULE", "DEFAULT_DENSE_FLOPS", "DENSE_COLUMNS_PER_LAUNCH", "DenseModel",
           "dense_front_mask", "dense_rule_mask", "dense_path_seconds", "rule_prediction",
           "dense_defer"]

#: The ``dense_flops`` value that asks the time model (:func:`dense_rule_mask`)
#: instead of a threshold. A float, so that it passes wherever a threshold does
#: (schedule keys, plan files); no threshold is negative.
DENSE_RULE = -1.0

#: What the engines pass by default: the time model. A float threshold
#: (Householder flops, the analysis' count) chooses by size alone; ``None`` or
#: ``inf`` turns the path off.
DEFAULT_DENSE_FLOPS = DENSE_RULE


@dataclass(frozen=True)
class DenseModel:
    """Time model of a front on either path, for :func:`dense_rule_mask` (seconds).

    The tile tasks: every launch of the uberkernel costs at least
    ``launch_seconds`` (the Factorize chain of a column tile) plus the flops it
    carries at ``uber_rate``; a front of ``nfact`` columns is a chain of
    ``ceil(nfact / tile)`` launches (plus its assembly), so the launches of a
    factorization are the tree's longest chain of such launches and their
    time is ``launches * launch_seconds + flops / uber_rate``.
    The dense path, per panel of ``panel`` columns and ``rows`` rows (the
    staircase honoured as :func:`scipy_gpuqr._engine.dense_front.panels_of`
    does): ``panel_seconds``, per column ``column_seconds + row_seconds *
    rows`` (the panel kernel's grid-wide exchange; ``geqrf_column_seconds`` for
    panels taller than ``kernel_max_rows``), and the panel's GEMM flops at
    ``gemm_rate``.

    The kernels' time has two bounds from below: the tree's longest path of
    launches and dense fronts (a dense front starts when its subtree is done,
    its ancestors' launches wait for it), and the device's: the panel
    kernel's grid, the trailing GEMMs and the uberkernel's launches each fill
    the device, so a dense front does not run in the launches' shadow but
    takes turns with them, and the kernels last at least ``launch_share`` of
    the launches' time plus ``dense_contention`` times the dense fronts' sum
    (their time alone). Where the tree is wide, dense fronts of one subtree do
    run beside the launches of others, which this bound does not see: the
    model then errs against dense fronts, and ``tolerance`` is kept small.
    A dense front's rows of R become final only when it ends, all at once,
    where a tile front's stream out while its later column tiles run: the
    call waits for them after the kernels, at ``r_copy_rate`` (bytes per
    second).

    The defaults are fitted to one H200 (bench/RESULTS.md, issue 18: the panel
    kernel alone, dense fronts alone, whole factorizations with every front in
    the uberkernel, and with the dense fronts of size thresholds and of the
    rule, on a chessboard, a 3-D grid and a linearized assignment LP).
    ``launch_share=0`` and ``r_copy_rate=inf`` leave the dense fronts in the
    launches' shadow (only their paths and their sum bound the time).
    """

    tile: int = DEFAULT_TILE
    launch_seconds: float = 140e-6
    uber_rate: float = 9.45e12
    panel: int = 256
    panel_seconds: float = 30e-6
    column_seconds: float = 4.5e-6
    row_seconds: float = 1.0e-10
    kernel_max_rows: int = 110_000
    geqrf_column_seconds: float = 30e-6
    gemm_rate: float = 34.7e12
    dense_contention: float = 1.0
    launch_share: float = 1.0
    r_copy_rate: float = 6.9e9
    #: fronts considered: at least this many columns and flops, the largest first
    min_columns: int = 256
    min_flops: float = 1e9
    max_candidates: int = 64
    #: the fewest dense fronts whose modelled time is within this share of the best
    #: (a dense front must pay beyond what the model cannot tell; the model counts
    #: no overlap of dense fronts with the launches of other subtrees, which makes
    #: it err against dense fronts where the tree is wide, bench/RESULTS.md)
    tolerance: float = 0.02


#: A dense front defers its parent's Pack-Assemble by one launch per this many of its
#: columns (the blocked QR's panels are latency bound: a launch of tile tasks lasts as
#: long as the panels of some columns); 0 turns the overlap off (packed at the next
#: launch).
DENSE_COLUMNS_PER_LAUNCH = 16


def dense_defer(nfact, columns_per_launch: int = DENSE_COLUMNS_PER_LAUNCH):
    """Launches between a dense front's assembly and its parent's Pack-Assemble, minus 1.

    Parameters
    ----------
    nfact : int or ndarray of int
        Columns the front eliminates.
    columns_per_launch : int
        See :data:`DENSE_COLUMNS_PER_LAUNCH` (0: no deferral).
    """
    nfact = np.asarray(nfact, dtype=np.int64)
    if columns_per_launch <= 0:
        return np.zeros_like(nfact)
    return -(-nfact // int(columns_per_launch))


def dense_front_mask(analysis, min_flops) -> np.ndarray:
    """Boolean mask over the fronts: those factorized as dense fronts.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    min_flops : float or None
        Threshold on a front's Householder flops (None: no dense front), or
        :data:`DENSE_RULE` (any negative value): the time model's choice,
        :func:`dense_rule_mask`.

    Returns
    -------
    ndarray of bool, shape (nfronts,)
    """
    fs = analysis.fronts
    nf = fs.nfronts
    if min_flops is None or not np.isfinite(min_flops) or nf == 0:
        return np.zeros(nf, dtype=bool)
    if min_flops < 0:
        return dense_rule_mask(analysis)
    flops = getattr(analysis, "front_flops", None)     # the analysis' own count
    if flops is None or len(flops) != nf:
        flops = front_work(fs)["flops"]
    nfact = np.minimum(fs.fm, fs.fn)
    return (flops >= float(min_flops)) & (nfact > 0)


def dense_path_seconds(fm: int, fn: int, stair, model: DenseModel = DenseModel()) -> float:
    """Modelled seconds of one front on the dense path (:class:`DenseModel`).

    Parameters
    ----------
    fm, fn : int
        Front shape.
    stair : array_like of int, shape (fn,), or None
        The front's staircase (None: dense).
    model : DenseModel
    """
    fm, fn = int(fm), int(fn)
    nfact = min(fm, fn)
    if nfact <= 0:
        return 0.0
    nb = int(model.panel)
    j = np.arange(0, nfact, nb, dtype=np.int64)
    b = np.minimum(nb, nfact - j)
    if stair is None:
        t = np.full(len(j), fm, dtype=np.int64)
    else:
        st = np.asarray(stair, dtype=np.int64)
        t = np.minimum(np.maximum(st[j + b - 1], j + b), fm)
    rows = (t - j).astype(np.float64)
    per_col = np.where(rows > model.kernel_max_rows, model.geqrf_column_seconds,
                       model.column_seconds + model.row_seconds * rows)
    flops = 4.0 * rows * b * (fn - j - b) + 2.0 * rows * b * b
    return float(np.sum(model.panel_seconds + b * per_col + flops / model.gemm_rate))


def _path_sums(parent: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``w`` summed over the path from every front to its root (pointer jumping:
    log2 of the tree's height steps)."""
    s = np.asarray(w).copy()
    up = parent.copy()
    while True:
        has = up >= 0
        if not has.any():
            return s
        s[has] += s[up[has]]
        up[has] = up[up[has]]


def _nearest_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """The nearest marked ancestor of every front, itself included (-1: none),
    by pointer jumping."""
    nxt = np.where(marked, np.arange(len(parent)), parent)
    while True:
        m = nxt >= 0
        new = nxt.copy()
        new[m] = nxt[nxt[m]]
        if np.array_equal(new, nxt):
            return nxt
        nxt = new


def _candidates(flops: np.ndarray, nfact: np.ndarray, model: DenseModel) -> np.ndarray:
    """The fronts the rule considers, the largest first (see :class:`DenseModel`)."""
    ok = np.flatnonzero((nfact >= model.min_columns) & (flops >= model.min_flops))
    return ok[np.argsort(-flops[ok], kind="stable")][:model.max_candidates]


class _RuleProblem:
    """The candidates of one analysis, reduced to what the model's time needs.

    Every front belongs to the group of its lowest candidate ancestor (itself
    included; group ``K``: none); a path's modelled time depends on which of
    that group's chain of candidates are dense, so the longest launch chain per
    group (``lmax``) stands for all of its fronts.
    """

    def __init__(self, analysis, model: DenseModel):
        fs = analysis.fronts
        nf = fs.nfronts
        flops = getattr(analysis, "front_flops", None)
        nnz_r = getattr(analysis, "front_nnz_R", None)
        if flops is None or len(flops) != nf or nnz_r is None or len(nnz_r) != nf:
            work = front_work(fs)
            flops = work["flops"] if flops is None or len(flops) != nf else flops
            nnz_r = work["nnz_R"] if nnz_r is None or len(nnz_r) != nf else nnz_r
        flops = np.asarray(flops, dtype=np.float64)
        parent = np.asarray(fs.parent, dtype=np.int64)
        nfact = np.minimum(fs.fm, fs.fn).astype(np.int64)
        nl = -(-nfact // int(model.tile)) + 1        # a front's launches, assembly included
        cand = _candidates(flops, nfact, model)
        K = len(cand)
        self.cand, self.model, self.total_flops = cand, model, float(flops.sum())
        self.flops_k = flops[cand]
        self.nl_k = nl[cand].astype(np.float64)
        self.dense_k = np.array([dense_path_seconds(
            fs.fm[f], fs.fn[f], fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]], model)
            for f in cand.tolist()], dtype=np.float64)
        # bytes of R each candidate hands to the host after its dense path
        self.rbytes_k = (np.asarray(nnz_r, dtype=np.float64)[cand]
                         * float(getattr(analysis, "itemsize", 8)))
        # launches on the path from every front to its root
        L = _path_sums(parent, nl)
        # lowest candidate ancestor (self included) of every front; K: none
        marked = np.zeros(nf, dtype=bool)
        marked[cand] = True
        near = _nearest_marked(parent, marked)
        kof = np.full(nf, K, dtype=np.int64)
        kof[cand] = np.arange(K)
        low = np.where(near >= 0, kof[np.maximum(near, 0)], K)
        self.lmax = np.zeros(K + 1, dtype=np.float64)
        np.maximum.at(self.lmax, low, L.astype(np.float64))
        # chain[g, k]: candidate k is an ancestor of group g's candidate (itself included)
        above = [int(low[parent[f]]) if parent[f] >= 0 else K for f in cand.tolist()]
        chain = np.zeros((K + 1, K), dtype=np.float64)
        for k in range(K):
            j = k
            while j < K:
                chain[k, j] = 1.0
                j = above[j]
        self.chain = chain

    def parts(self, D: np.ndarray) -> dict:
        """The model's terms for each row of ``D`` (sets × K, 0/1 floats):
        ``path`` (the longest path of launches and dense fronts), ``launches``
        (the launches' longest chain, in seconds), ``dense`` (the dense fronts'
        sum alone), ``kernels`` (the bound of the three) and ``r_copy`` (the
        wait for the dense fronts' rows of R after the kernels)."""
        m = self.model
        D = np.atleast_2d(D)
        lu = self.lmax[None, :] - D @ (self.chain * self.nl_k).T       # sets × groups
        sd = D @ (self.chain * self.dense_k).T
        n_u = np.maximum(lu.max(axis=1), 1.0)
        w_u = self.total_flops - D @ self.flops_k
        tau = m.launch_seconds + w_u / (m.uber_rate * n_u)
        path = (tau[:, None] * lu + sd).max(axis=1)
        launches = tau * n_u
        dsum = D @ self.dense_k
        kernels = np.maximum(path, m.launch_share * launches + m.dense_contention * dsum)
        r_copy = (D @ self.rbytes_k) / m.r_copy_rate
        return {"path": path, "launches": launches, "dense": dsum, "kernels": kernels,
                "r_copy": r_copy}

    def seconds(self, D: np.ndarray) -> np.ndarray:
        """Modelled seconds for each row of ``D`` (sets × K, 0/1 floats): the
        kernels and the wait for R's rows after them (:meth:`parts`)."""
        p = self.parts(D)
        return p["kernels"] + p["r_copy"]

    def choose(self) -> np.ndarray:
        """Greedy order: from no dense front, add the candidate whose dense path
        gives the shortest modelled time, until every candidate is in (also
        through steps that lose, so that a chain whose fronts pay only together
        is found); then the shortest prefix whose time is within ``tolerance``
        of the best prefix's (fewer dense fronts where the model cannot tell)."""
        K = len(self.cand)
        D = np.zeros(K)
        sets, times = [D], [float(self.seconds(D)[0])]
        eye = np.eye(K)
        for _ in range(K):
            trial = np.minimum(D[None, :] + eye, 1.0)
            t = self.seconds(trial)
            t[D > 0] = np.inf
            k = int(np.argmin(t))
            D = trial[k]
            sets.append(D)
            times.append(float(t[k]))
        times = np.asarray(times)
        ok = np.flatnonzero(times <= times.min() * (1.0 + self.model.tolerance))
        return sets[int(ok[0])]


#: The rule's choices, per analysis pattern and model (every call of an engine
#: asks; a choice is a boolean per front).
_RULE_MASKS = PerPattern(256, 64 << 20, lambda m: int(m.nbytes))


def dense_rule_mask(analysis, model: DenseModel | None = None) -> np.ndarray:
    """Boolean mask over the fronts: those the time model makes dense fronts.

    Starting from every front in the uberkernel, the candidate whose dense
    path gives the shortest modelled factorization is made dense, and so on
    through every candidate; of that sequence the shortest prefix within
    ``model.tolerance`` of the best time is chosen. The model
    (:class:`DenseModel`) counts the tree's longest chain of launches and
    dense fronts (a dense front starts when its subtree is done and its
    ancestors' launches wait for it), the launches' flops, the launches and
    the dense fronts taking turns on the device, and the dense fronts' rows
    of R copied after them.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    model : DenseModel, optional
        Default :class:`DenseModel` ().

    Returns
    -------
    ndarray of bool, shape (nfronts,)
    """
    model = DenseModel() if model is None else model
    nf = analysis.fronts.nfronts
    out = np.zeros(nf, dtype=bool)
    if nf == 0:
        return out
    hit = _RULE_MASKS.get(analysis, model)
    if hit is not None and len(hit) == nf:
        return hit.copy()
    fs = analysis.fronts
    flops = getattr(analysis, "front_flops", None)
    if flops is None or len(flops) != nf:
        flops = front_work(fs)["flops"]
    if not len(_candidates(np.asarray(flops, dtype=np.float64), np.minimum(fs.fm, fs.fn),
                           model)):
        return out                      # nothing large enough: no tree walk
    prob = _RuleProblem(analysis, model)
    out[prob.cand[prob.choose() > 0]] = True
    _RULE_MASKS.put(analysis, model, out.copy())
    return out


def rule_prediction(analysis, mask, model: DenseModel | None = None) -> dict:
    """The model's view of a choice of dense fronts (for benchmarks and tests).

    Parameters
    ----------
    analysis : SymbolicAnalysis
    mask : ndarray of bool, shape (nfronts,)
        Dense fronts; those outside the model's candidates are ignored.
    model : DenseModel, optional

    Returns
    -------
    dict
        ``seconds`` (modelled: kernels and R's wait), its terms ``kernel_seconds``,
        ``launch_seconds`` (the launches' longest chain), ``dense_sum_seconds``
        (the dense fronts alone, summed), ``r_copy_seconds``; ``dense_seconds``
        (per dense candidate front: its modelled dense-path seconds),
        ``candidates``.
    """
    model = DenseModel() if model is None else model
    prob = _RuleProblem(analysis, model)
    D = np.asarray(mask, dtype=bool)[prob.cand].astype(np.float64)[None, :]
    p = {k: float(v[0]) for k, v in prob.parts(D).items()}
    return {"seconds": p["kernels"] + p["r_copy"],
            "kernel_seconds": p["kernels"], "launch_seconds": p["launches"],
            "dense_sum_seconds": p["dense"], "r_copy_seconds": p["r_copy"],
            "dense_seconds": {int(f): float(t) for f, t, d in
                              zip(prob.cand, prob.dense_k, D[0]) if d},
            "candidates": int(len(prob.cand))}
