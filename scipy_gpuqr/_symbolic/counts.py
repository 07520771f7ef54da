"""Work and memory counts of a multifrontal QR: flops, nnz(R), nnz(H), bytes, GPU memory.

All counts assume no rank detection (every front column gets a Householder
reflector while rows remain) and honour the staircase: reflector k of a front
spans rows ``k … t-1`` with ``t = max(min(stair[k], fm), k+1)``.

* flops: ``Σ (t-k)·(3 + 4·(fn-k-1))`` over the reflectors of every front, the
  Golub–Van Loan Householder count as SuiteSparseQR accumulates it (3 flops
  per row to form the reflector, 4 per row and column to apply it).
* nnz(R): ``Σ_f Σ_{r<rank_f} (fn_f - r)`` entries (R rows stored as dense
  trapezoids, as SuiteSparseQR stores them).
* nnz(H): ``Σ (t-k)`` (unit diagonal included).
* factor_bytes: the peak of ``R so far + contribution-block stack + current
  front`` over a postorder traversal (H excluded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import native
from .fronts import FrontStructure

__all__ = ["front_work", "factor_peak_bytes", "GpuMemoryModel", "gpu_front_bytes"]


def _trapezoid(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Entries of a rows×cols upper trapezoid, rows <= cols."""
    return rows * cols - rows * (rows - 1) // 2


def front_work(fs: FrontStructure) -> dict:
    """Per-front flops, nnz(R), nnz(H) and contribution-block size (entries).

    Returns a dict of int64/float64 arrays of length ``nfronts``: ``flops``,
    ``nnz_R``, ``nnz_H``, ``cb_entries`` (packed upper trapezoid) and
    ``front_entries`` (fm·fn). The flops and nnz(H) are sums over every front
    column: in C where :mod:`.native` has its library (the same integers),
    else the NumPy expressions below.
    """
    nf = fs.nfronts
    nloc = fs.fn
    lib = native.handle() if nf else None
    if nf == 0:
        flops = np.zeros(0, dtype=np.int64)       # as np.bincount gives it
        nnz_h = np.zeros(0, dtype=np.int64)
    elif lib is not None:
        flops, nnz_h = native.front_work(lib, fs.col_ptr, fs.fm, fs.fn, fs.stair)
    else:
        # per local column k of every front (per-front values spread by repeat)
        k = np.arange(len(fs.cols), dtype=np.int64) - np.repeat(fs.col_ptr[:-1], nloc)
        fm_o = np.repeat(fs.fm, nloc)
        t = np.maximum(np.minimum(fs.stair, fm_o), k + 1)
        h = np.where(k < np.repeat(np.minimum(fs.fm, fs.fn), nloc), t - k, 0)
        fl = h * (3 + 4 * (np.repeat(fs.fn, nloc) - k - 1))
        # integer sums per front (exact), as float64
        flops = np.add.reduceat(fl, fs.col_ptr[:-1]).astype(np.float64)
        nnz_h = np.add.reduceat(h, fs.col_ptr[:-1]).astype(np.int64)
    nnz_r = _trapezoid(fs.frank, fs.fn)
    cb = _trapezoid(fs.cm, fs.fn - fs.fp)
    return {"flops": flops, "nnz_R": nnz_r, "nnz_H": nnz_h, "cb_entries": cb,
            "front_entries": fs.fm * fs.fn}


def factor_peak_bytes(fs: FrontStructure, work: dict, itemsize: int) -> int:
    """Peak bytes of a sequential postorder factorization (fronts + CB stack + R).

    Before front f is factorized the memory holds the R rows of fronts < f,
    the contribution blocks of fronts < f whose parent is >= f (f's own
    children included), and front f itself.
    """
    nf = fs.nfronts
    if nf == 0:
        return 0
    r_before = np.concatenate(([0], np.cumsum(work["nnz_R"])[:-1]))
    cb = work["cb_entries"]
    pushed_before = np.concatenate(([0], np.cumsum(cb)[:-1]))
    consumed = np.zeros(nf + 1, dtype=np.int64)
    has_p = fs.parent >= 0
    np.add.at(consumed, fs.parent[has_p] + 1, cb[has_p])      # consumed after parent runs
    consumed_before = np.cumsum(consumed)[:nf]
    stack = pushed_before - consumed_before
    peak = r_before + stack + work["front_entries"]
    return int(peak.max()) * int(itemsize)


@dataclass(frozen=True)
class GpuMemoryModel:
    """What the GPU engine holds per front, in one place.

    Attributes
    ----------
    tile : int
        Tile size of the bucket scheduler (VT tiles are (tile+1)×tile).
    task_bytes : int
        Size of one task record (two queues are allocated).
    apply_granularity : int
        Column tiles per Apply task (worst-case task count per round).
    s_chunk : int
        S entries per S-Assemble task.
    pack_piece : int
        Entries of a contribution block per Pack-Assemble task.
    index_bytes : int
        Bytes per S-entry index (int64) and ``map_bytes`` per Rimap/Rjmap entry.
    map_bytes : int
        Bytes per Rimap/Rjmap entry.
    """

    tile: int = 32
    task_bytes: int = 96
    apply_granularity: int = 16
    s_chunk: int = 1536
    pack_piece: int = 2048 * 2048
    index_bytes: int = 8
    map_bytes: int = 4


def gpu_front_bytes(fs: FrontStructure, work: dict, itemsize: int,
                    model: GpuMemoryModel = GpuMemoryModel()) -> dict:
    """GPU bytes per front, split into the parts a stage must hold.

    Returns a dict of int64 arrays:

    * ``additive``: front (fm·fn) + its S entries (index + value) + its VT
      tiles + its Rimap/Rjmap + its share of both task queues (worst-case
      tasks of one scheduling round: Factorize/Apply over its row tiles,
      S-Assemble chunks, Pack-Assemble pieces),
    * ``cb``: its contribution block, packed, as uploaded when its parent is
      in a later stage,
    * ``staging``: the R and H of the front (a staging buffer for D2H copies;
      a stage holds two of the largest, double-buffered).
    """
    T = model.tile
    s_count = np.diff(fs.s_ptr)
    row_tiles = -(-fs.fm // T)
    col_tiles = -(-fs.fn // T)
    tasks = (row_tiles * -(-col_tiles // model.apply_granularity)
             + -(-s_count // model.s_chunk) + -(-work["cb_entries"] // model.pack_piece) + 1)
    additive = (fs.fm * fs.fn * itemsize
                + s_count * (model.index_bytes + itemsize)
                + row_tiles * (T + 1) * T * itemsize
                + ((fs.fn - fs.fp) + fs.cm) * model.map_bytes
                + 2 * tasks * model.task_bytes)
    return {"additive": additive.astype(np.int64),
            "cb": (work["cb_entries"] * itemsize).astype(np.int64),
            "staging": ((work["nnz_R"] + work["nnz_H"]) * itemsize).astype(np.int64)}
