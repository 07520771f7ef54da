"""``analyze``: the symbolic analysis of a sparse QR, and its result ``SymbolicAnalysis``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import counts as _counts
from .etree import column_counts, column_etree, leftmost_columns, postorder
from .fronts import Amalgamation, FrontStructure, build_fronts, fundamental_supernodes, \
    relaxed_amalgamation
from .ordering import column_ordering
from .staging import StagePlan, plan_stages

__all__ = ["analyze", "SymbolicAnalysis", "canonical_csc"]


def canonical_csc(A) -> sp.csc_array:
    """CSC copy of A with summed duplicates and sorted indices (int64 indices).

    The S-assembly map of an analysis refers to positions in this array's
    ``data``; a matrix with the same pattern gives the same positions.
    """
    if not sp.issparse(A):
        arr = np.asarray(A)
        if arr.ndim != 2:
            raise ValueError(f"A must be 2-D, got shape {arr.shape}")
        A = sp.csc_array(arr)
    A = sp.csc_array(A, copy=True)
    A.sum_duplicates()
    A.sort_indices()
    A.indptr = A.indptr.astype(np.int64, copy=False)
    A.indices = A.indices.astype(np.int64, copy=False)
    return A


@dataclass(frozen=True, eq=False)
class SymbolicAnalysis:
    """Everything the numeric factorization needs to know before it starts.

    Conventions: ``S = A[rowperm][:, colperm]``; fronts are numbered in
    postorder (``front_parent[f] > f``); per-front arrays are flat and
    CSR-like (see :class:`~scipy_gpuqr._symbolic.fronts.FrontStructure`,
    reachable as ``analysis.fronts`` and, field by field, as attributes of the
    analysis itself, e.g. ``analysis.fm``, ``analysis.rjmap``).

    Attributes
    ----------
    m, n, nnz : int
        Shape and stored entries of A (duplicates summed).
    ordering_used : str
        The column ordering that ran (with the reason of any fallback).
    colperm : ndarray of int64 (n,)
        Column order (fill-reducing order, then postordered column etree).
    rowperm : ndarray of int64 (m,)
        Rows sorted by their leftmost column in ``colperm`` order (stable;
        empty rows last).
    leftmost : ndarray of int64 (m,)
        Leftmost column of row i of S (n for empty rows).
    etree : ndarray of int64 (n,)
        Column elimination tree of S (``etree[j] > j`` or -1).
    col_counts : ndarray of int64 (n,)
        Structural nonzeros of each row of R (before amalgamation).
    nfronts : int
    largest_front : tuple (rows, cols)
        Front with the most entries.
    flops : float
        Householder flops honouring the staircase (see :mod:`.counts`).
    nnz_R, nnz_H : int
    factor_bytes : int
        Peak bytes of fronts + contribution-block stack + R (H excluded).
    intensity : float
        ``flops / factor_bytes``.
    gpu_bytes : int
        GPU bytes of a one-stage run (every buffer; see :mod:`.staging`).
    host_bytes : int
        Estimated host bytes of a CPU factorization keeping R and H.
    stages : StagePlan
        The plan for ``max_gpu_memory`` (one stage when None).
    front_flops, front_nnz_R, front_nnz_H, front_cb_entries : ndarray (nfronts,)
    front_gpu_additive, front_gpu_cb, front_gpu_staging : ndarray (nfronts,)
        Per-front GPU bytes (see :func:`.counts.gpu_front_bytes`).
    itemsize : int
    amalgamation : Amalgamation
    timings : dict
        Seconds per analysis step.
    """

    m: int
    n: int
    nnz: int
    ordering_used: str
    colperm: np.ndarray
    rowperm: np.ndarray
    leftmost: np.ndarray
    etree: np.ndarray
    col_counts: np.ndarray
    fronts: FrontStructure
    flops: float
    nnz_R: int
    nnz_H: int
    factor_bytes: int
    intensity: float
    gpu_bytes: int
    host_bytes: int
    stages: StagePlan
    front_flops: np.ndarray
    front_nnz_R: np.ndarray
    front_nnz_H: np.ndarray
    front_cb_entries: np.ndarray
    front_gpu_additive: np.ndarray
    front_gpu_cb: np.ndarray
    front_gpu_staging: np.ndarray
    a_indptr: np.ndarray
    a_indices: np.ndarray
    itemsize: int = 8
    amalgamation: Amalgamation = Amalgamation()
    timings: dict = field(default_factory=dict)

    # -- per-front arrays also reachable directly -------------------------------------
    def __getattr__(self, name):
        if name.startswith("__") or name == "fronts":
            raise AttributeError(name)
        fronts = self.__dict__.get("fronts")
        if fronts is not None and hasattr(fronts, name):
            return getattr(fronts, name)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    @property
    def nfronts(self) -> int:
        return self.fronts.nfronts

    @property
    def front_parent(self) -> np.ndarray:
        return self.fronts.parent

    @property
    def largest_front(self) -> tuple:
        if self.nfronts == 0:
            return (0, 0)
        f = int(np.argmax(self.fronts.fm * self.fronts.fn))
        return (int(self.fronts.fm[f]), int(self.fronts.fn[f]))

    @property
    def shape(self) -> tuple:
        return (self.m, self.n)

    def front_columns(self, f: int) -> np.ndarray:
        """Global (permuted) columns of front f, pivots first."""
        fs = self.fronts
        return fs.cols[fs.col_ptr[f]:fs.col_ptr[f + 1]]

    def front_children(self, f: int) -> np.ndarray:
        fs = self.fronts
        return fs.children[fs.child_ptr[f]:fs.child_ptr[f + 1]]

    def stage_plan(self, max_gpu_memory: int | None) -> StagePlan:
        """Staging plan for a GPU memory budget in bytes (None: one stage)."""
        gpu = {"additive": self.front_gpu_additive, "cb": self.front_gpu_cb,
               "staging": self.front_gpu_staging}
        budget = None if max_gpu_memory is None else int(max_gpu_memory)
        if budget is not None and budget < 0:
            raise ValueError(f"max_gpu_memory must be >= 0, got {max_gpu_memory}")
        return plan_stages(self.fronts.parent, self.fronts.child_ptr, self.fronts.children,
                           gpu, budget)

    def matches_pattern(self, A: sp.csc_array) -> bool:
        """Whether canonical CSC ``A`` has the analysed pattern."""
        return (A.shape == (self.m, self.n) and np.array_equal(A.indptr, self.a_indptr)
                and np.array_equal(A.indices, self.a_indices))

    def summary(self) -> dict:
        """JSON-serializable facts; the keys m, n, nnz, fronts, flops, nnz_R,
        intensity, stages are stable."""
        lf = self.largest_front
        return {
            "m": int(self.m), "n": int(self.n), "nnz": int(self.nnz),
            "ordering": self.ordering_used,
            "fronts": int(self.nfronts),
            "largest_front": [int(lf[0]), int(lf[1])],
            "flops": float(self.flops),
            "nnz_R": int(self.nnz_R), "nnz_H": int(self.nnz_H),
            "factor_bytes": int(self.factor_bytes),
            "intensity": float(self.intensity),
            "gpu_bytes": int(self.gpu_bytes), "host_bytes": int(self.host_bytes),
            "stages": int(self.stages.nstages),
            "stage_plan": self.stages.as_dict(),
            "itemsize": int(self.itemsize),
            "analysis_seconds": float(sum(self.timings.values())),
        }


def _relabel(parent, perm, B, post):
    """Relabel columns by ``post`` (new label t = old column post[t])."""
    n = len(parent)
    inv = np.empty(n, dtype=np.int64)
    inv[post] = np.arange(n, dtype=np.int64)
    newparent = np.where(parent[post] >= 0, inv[np.maximum(parent[post], 0)], -1)
    B = sp.csr_array((B.data, inv[B.indices], B.indptr), shape=B.shape)
    B.has_sorted_indices = False
    B.sort_indices()
    return newparent, perm[post], B, inv


def analyze(A, *, ordering: str = "colamd", colperm=None, max_gpu_memory: int | None = None,
            itemsize: int = 8, amalgamation: Amalgamation = Amalgamation()) -> SymbolicAnalysis:
    """Symbolic analysis of a sparse QR factorization of A.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
        Only the pattern is used (explicit zeros count as entries).
    ordering : {'colamd', 'natural', 'given', 'amd', 'metis'}
        Fill-reducing column ordering (see :mod:`.ordering` for fallbacks).
    colperm : array_like of int, optional
        A column order to use instead ('given'). The analysis always
        postorders the column elimination tree of ``A[:, colperm]`` (this
        changes neither the fill nor the flops), so ``analysis.colperm`` is
        ``colperm`` refined by that postorder; R and the fronts are defined in
        ``analysis.colperm`` order.
    max_gpu_memory : int, optional
        GPU memory budget in bytes for the staging plan.
    itemsize : int
        Bytes per value (8: float64, 4: float32, 16: complex128).
    amalgamation : Amalgamation
        Relaxed amalgamation parameters.

    Returns
    -------
    SymbolicAnalysis
    """
    timings = {}
    t0 = time.perf_counter()
    A = canonical_csc(A)
    m, n = A.shape
    nnz = int(A.nnz)
    t1 = time.perf_counter()
    timings["canonical"] = t1 - t0
    perm, used = column_ordering(A, ordering, colperm)
    t2 = time.perf_counter()
    timings["ordering"] = t2 - t1

    # positions of A's entries travel as data (int64) through the permutations
    pos = sp.csc_array((np.arange(nnz, dtype=np.int64), A.indices, A.indptr), shape=(m, n))
    B = sp.csr_array(pos[:, perm])
    B.sort_indices()
    left = leftmost_columns(B.indptr, B.indices, n)
    parent = column_etree(B.indptr, B.indices, n, left)
    post = postorder(parent)
    parent, perm, B, inv = _relabel(parent, perm, B, post)
    left = leftmost_columns(B.indptr, B.indices, n)
    t3 = time.perf_counter()
    timings["etree"] = t3 - t2
    ccount = column_counts(B.indptr, B.indices, parent, left)
    t4 = time.perf_counter()
    timings["counts"] = t4 - t3

    rowperm = np.argsort(left, kind="stable").astype(np.int64)
    S = B[rowperm]
    S.sort_indices()
    sleft = left[rowperm]
    sup = fundamental_supernodes(parent, ccount)
    fptr = relaxed_amalgamation(parent, ccount, sup, amalgamation)
    fs = build_fronts(fptr, parent, ccount, S.indptr.astype(np.int64),
                      S.indices.astype(np.int64), S.data, sleft)
    t5 = time.perf_counter()
    timings["fronts"] = t5 - t4

    work = _counts.front_work(fs)
    peak = _counts.factor_peak_bytes(fs, work, itemsize)
    gpu = _counts.gpu_front_bytes(fs, work, itemsize)
    flops = float(work["flops"].sum())
    nnz_R = int(work["nnz_R"].sum())
    nnz_H = int(work["nnz_H"].sum())
    # host: the factorization peak, H (values), R's indices and A's copy
    host = int(peak + nnz_H * itemsize + nnz_R * 8 + nnz * (itemsize + 8) + (m + n) * 8 * 4)
    one_stage = plan_stages(fs.parent, fs.child_ptr, fs.children, gpu, None)
    gpu_bytes = one_stage.stage_bytes[0] if one_stage.stage_bytes else 0
    plan = (one_stage if max_gpu_memory is None else
            plan_stages(fs.parent, fs.child_ptr, fs.children, gpu, int(max_gpu_memory)))
    timings["counts_staging"] = time.perf_counter() - t5
    return SymbolicAnalysis(
        m=m, n=n, nnz=nnz, ordering_used=used, colperm=perm.astype(np.int64), rowperm=rowperm,
        leftmost=sleft, etree=parent.astype(np.int64), col_counts=ccount, fronts=fs,
        flops=flops, nnz_R=nnz_R, nnz_H=nnz_H, factor_bytes=int(peak),
        intensity=(flops / peak) if peak else 0.0, gpu_bytes=int(gpu_bytes), host_bytes=host,
        stages=plan, front_flops=work["flops"], front_nnz_R=work["nnz_R"],
        front_nnz_H=work["nnz_H"], front_cb_entries=work["cb_entries"],
        front_gpu_additive=gpu["additive"], front_gpu_cb=gpu["cb"],
        front_gpu_staging=gpu["staging"], a_indptr=A.indptr, a_indices=A.indices,
        itemsize=int(itemsize), amalgamation=amalgamation, timings=timings)
