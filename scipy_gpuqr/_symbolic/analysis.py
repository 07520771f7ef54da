"""``analyze``: the symbolic analysis of a sparse QR, and its result ``SymbolicAnalysis``.

Steps, as SuiteSparseQR takes them: (1) column singletons (:mod:`.singletons`)
are found and ordered first; their rows of A are the first rows of R as they
stand (``R1 = [R11 R12]``), computed before and outside the multifrontal part;
(2) the rest, ``A22`` (the other rows on the other columns), is ordered
(COLAMD with CHOLMOD's knobs by default, :mod:`.ordering`); (3) its column
elimination tree is postordered, column counts and fronts (relaxed
amalgamation) follow (:mod:`.etree`, :mod:`.fronts`). Fronts mean what they
mean without singletons, for ``A22``, but carry global permuted labels:
pivot columns start at ``n1cols``, front S rows at row ``n1rows`` of S.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import analysis_cache
from . import counts as _counts
from .etree import column_counts, column_etree_by_columns, postorder
from .fronts import Amalgamation, FrontStructure, build_fronts, fundamental_supernodes, \
    relaxed_amalgamation
from .ordering import ORDERINGS, column_ordering
from .rows import permuted_rows, row_map, sorted_rows
from .singletons import find_singletons, leading_singletons, no_singletons
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

    Conventions: ``S = A[rowperm][:, colperm]``; R's first ``n1cols`` columns
    are the column singletons and its first ``n1rows`` rows the singleton
    rows of A, as they stand (the block ``R1 = [R11 R12]``, see
    :mod:`.singletons`); the fronts factorize the rest, ``A22 =
    S[n1rows:, n1cols:]`` (rows of S past ``n1rows`` have no entry in the
    first ``n1cols`` columns). Fronts are numbered in postorder
    (``front_parent[f] > f``); per-front arrays are flat and CSR-like (see
    :class:`~scipy_gpuqr._symbolic.fronts.FrontStructure`, reachable as
    ``analysis.fronts`` and, field by field, as attributes of the analysis
    itself, e.g. ``analysis.fm``, ``analysis.rjmap``). Front column labels
    are global (permuted): pivots run from ``pivot_ptr[0] == n1cols`` to
    ``n``; ``arow_ptr`` indexes rows of S, i.e. ``rowperm`` and
    ``arow_local`` (from ``n1rows``; ``arow_local`` is -1 on the singleton
    rows); ``s_ptr`` starts at 0 and ``s_index``, ``s_nz`` cover exactly the
    entries of A outside R1.

    Attributes
    ----------
    m, n, nnz : int
        Shape and stored entries of A (duplicates summed).
    ordering_used : str
        The column ordering that ran on the non-singleton columns (with the
        reason of any fallback).
    colperm : ndarray of int64 (n,)
        Column order: singleton columns, then the fill-reducing order of the
        others refined by their postordered column etree.
    rowperm : ndarray of int64 (m,)
        Singleton rows (in the order of their pivot columns), then the other
        rows sorted by their leftmost column in ``colperm`` order (stable;
        empty rows last). All rows are thus sorted by leftmost column.
    leftmost : ndarray of int64 (m,)
        Leftmost column of row i of S (n for empty rows).
    etree : ndarray of int64 (n,)
        Column elimination tree of A22 in global labels (``etree[j] > j`` or
        -1); -1 for the singleton columns.
    col_counts : ndarray of int64 (n,)
        Structural nonzeros of each row of R (before amalgamation); for a
        singleton column the entries of its row of A (0 for a dead one).
    n1cols, n1rows : int
        Column singletons (live and dead) and singleton rows.
    r1_pivot : ndarray of int64 (n1rows,)
        Pivot column of each singleton row (increasing; the singleton columns
        missing from it are dead: no row of R).
    r1_ptr, r1_cols, r1_nz : ndarray of int64
        R1 by rows (CSR): columns in ``colperm`` labels (sorted, the pivot
        first) and, for each entry, its position in the canonical A's data.
    singleton_tol : float or None
        The tolerance the singleton search used (None: structural).
    nfronts : int
    largest_front : tuple (rows, cols)
        Front with the most entries.
    flops : float
        Householder flops honouring the staircase (see :mod:`.counts`); R1
        costs none.
    nnz_R, nnz_H : int
        nnz_R includes R1 (as SuiteSparseQR's ``nnz_R_bound`` does).
    factor_bytes : int
        Peak bytes of fronts + contribution-block stack + R (H excluded).
    intensity : float
        ``flops / factor_bytes``.
    gpu_bytes : int
        GPU bytes of a one-stage run (every buffer; see :mod:`.staging`).
    host_bytes : int
        Estimated host bytes of a CPU factorization keeping R and H: the
        factorization peak, H's values, R's indices, A's copy. A dense row
        makes R dense whatever the order (nnz(R) = n(n+1)/2, SuiteSparseQR's
        ``nnz_R_bound`` too), and the one front then dominates these bytes.
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
    n1cols: int = 0
    n1rows: int = 0
    r1_pivot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    r1_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    r1_cols: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    r1_nz: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    singleton_tol: float | None = None
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
    def pattern_key(self) -> str | None:
        """The analysis cache's key (:mod:`.analysis_cache`: the pattern and the
        options) of this analysis; None when it was made with ``cache=False`` or
        options that cannot be keyed. Analyses of one key are equal, so a cache
        kept per pattern may use it."""
        return self.__dict__.get("_pattern_key")

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
            "n1cols": int(self.n1cols), "n1rows": int(self.n1rows),
            "stage_plan": self.stages.as_dict(),
            "itemsize": int(self.itemsize),
            "analysis_seconds": float(sum(self.timings.values())),
        }


def _relabel(parent, perm, post):
    """The tree and the column order relabelled by ``post`` (new label t = old
    column post[t])."""
    n = len(parent)
    inv = np.empty(n, dtype=np.int64)
    inv[post] = np.arange(n, dtype=np.int64)
    newparent = np.where(parent[post] >= 0, inv[np.maximum(parent[post], 0)], -1)
    return newparent, perm[post]


def _singletons_and_order(A, ordering, colperm, singletons, singleton_tol):
    """Singleton block, then the order of the remaining columns (see :func:`analyze`)."""
    m, n = A.shape
    given = colperm is not None or ordering in ("given", "natural")
    if given:
        perm0, used = column_ordering(A, ordering, colperm)
        single = (leading_singletons(A, perm0, singleton_tol) if singletons
                  else no_singletons())
        is1 = np.zeros(n, dtype=bool)
        is1[single.cols] = True
        rest = perm0[~is1[perm0]]
        keep_rows = _rows_left(m, single)
        return single, rest, keep_rows, used
    if ordering not in ORDERINGS:
        raise ValueError(f"unknown ordering {ordering!r}; expected one of {ORDERINGS}")
    single = find_singletons(A, singleton_tol) if singletons else no_singletons()
    is1 = np.zeros(n, dtype=bool)
    is1[single.cols] = True
    restcols = np.flatnonzero(~is1)
    keep_rows = _rows_left(m, single)
    if single.n1cols:
        A2 = sp.csc_array(A[keep_rows][:, restcols])
        A2.sort_indices()
    else:
        A2 = A
    p2, used = column_ordering(A2, ordering)
    return single, restcols[p2], keep_rows, used


def _rows_left(m, single):
    taken = np.zeros(m, dtype=bool)
    taken[single.rows[single.rows >= 0]] = True
    return np.flatnonzero(~taken).astype(np.int64)


def analyze(A, *, ordering: str = "colamd", colperm=None, max_gpu_memory: int | None = None,
            itemsize: int = 8, amalgamation: Amalgamation = Amalgamation(),
            singletons: bool = True, singleton_tol: float | None = None,
            cache: bool = True) -> SymbolicAnalysis:
    """Symbolic analysis of a sparse QR factorization of A.

    Column singletons come first (SuiteSparseQR's rule, see
    :mod:`.singletons`): their rows of A are rows of R as they stand (the
    block ``R1 = [R11 R12]``, fields ``n1cols``, ``n1rows``, ``r1_*``); the
    fronts factorize what is left, ``A22`` = the other rows of A on the other
    columns. Fronts keep their meaning for that submatrix but are numbered in
    the global permuted labels: pivot columns start at ``n1cols``
    (``pivot_ptr[0] == n1cols``), and front S rows index ``rowperm`` from
    ``n1rows`` on (``arow_ptr[0] == n1rows``); ``s_nz`` still indexes the
    canonical A's data and covers exactly the entries outside R1.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
        Only the pattern is used (explicit zeros count as entries) unless
        ``singleton_tol`` is given.
    ordering : {'colamd', 'natural', 'given', 'amd', 'metis'}
        Fill-reducing column ordering of the columns left after the
        singletons (see :mod:`.ordering` for fallbacks). 'natural' and a
        given ``colperm`` keep the column order: only the leading columns
        that are singletons in that order are taken (SuiteSparseQR's fixed
        ordering does the same).
    colperm : array_like of int, optional
        A column order to use instead ('given'). The analysis always
        postorders the column elimination tree of the non-singleton columns
        (this changes neither the fill nor the flops), so
        ``analysis.colperm`` is ``colperm`` refined by that postorder; R and
        the fronts are defined in ``analysis.colperm`` order. Analysing again
        with ``colperm=analysis.colperm`` gives the same analysis.
    max_gpu_memory : int, optional
        GPU memory budget in bytes for the staging plan.
    itemsize : int
        Bytes per value (8: float64, 4: float32, 16: complex128).
    amalgamation : Amalgamation
        Relaxed amalgamation parameters.
    singletons : bool
        False: no singleton block (every column goes to the fronts).
    singleton_tol : float, optional
        Accept a singleton only if its entry's magnitude exceeds this (A's
        values are read); None: structural (any stored entry).
    cache : bool
        Look the analysis up, and keep a new one, in the analysis cache
        (:mod:`.analysis_cache`: per process, and on disk in the schedule
        cache's folder for large matrices). The key is the pattern and the
        options (with ``singleton_tol``, also which entries exceed it), and a
        hit equals a new analysis. False: analyse, keep nothing.

    Returns
    -------
    SymbolicAnalysis
        Its arrays are read-only (a kept analysis shares them). With the cache
        each call returns a new object sharing the kept one's arrays; from a
        hit, ``timings`` holds the look-up's seconds (key ``'cache'``).
    """
    options = dict(ordering=ordering, colperm=colperm, max_gpu_memory=max_gpu_memory,
                   itemsize=itemsize, amalgamation=amalgamation, singletons=singletons,
                   singleton_tol=singleton_tol)
    t0 = time.perf_counter()
    if not cache:
        Ac = canonical_csc(A)
        return analysis_cache.freeze(
            _analyze(Ac, {"canonical": time.perf_counter() - t0}, **options))
    view, owned = _pattern_view(A)
    k = analysis_cache.key(view.shape, view.indptr, view.indices, view.data, options)
    got = analysis_cache.lookup(k, SymbolicAnalysis)
    if got is not None:
        an = _renewed(got, {"cache": time.perf_counter() - t0})
    else:
        Ac = view if owned else canonical_csc(view)
        kept = analysis_cache.freeze(
            _analyze(Ac, {"canonical": time.perf_counter() - t0}, **options))
        analysis_cache.keep(k, kept)
        # the kept object stays the cache's own: per-object caches of the caller
        # (schedules, layouts) live and die with the caller's copy
        an = dataclasses.replace(kept, timings=dict(kept.timings)) if k is not None else kept
    if k is not None:
        object.__setattr__(an, "_pattern_key", k.digest)
    return an


def _renewed(an: SymbolicAnalysis, timings: dict) -> SymbolicAnalysis:
    """``dataclasses.replace(an, timings=timings)``: a new analysis holding ``an``'s
    fields (the same objects) and ``timings``, made by filling its dictionary as the
    generated ``__init__`` would (the class has no ``__post_init__`` and no field
    outside ``__init__``), without that ``__init__``'s call per field on every
    cache hit. Any other object, or one missing a field, goes to ``dataclasses.replace``."""
    names = _init_fields()
    if type(an) is not SymbolicAnalysis or names is None:
        return dataclasses.replace(an, timings=timings)
    held = an.__dict__
    try:
        fields = {name: held[name] for name in names}
    except KeyError:
        return dataclasses.replace(an, timings=timings)
    fields["timings"] = timings
    new = object.__new__(SymbolicAnalysis)
    new.__dict__.update(fields)
    return new


@functools.lru_cache(maxsize=1)
def _init_fields() -> tuple | None:
    """The names of :class:`SymbolicAnalysis`'s fields, in order, where every field is
    set by ``__init__`` and the class defines no ``__post_init__`` (what
    :func:`_renewed` relies on); None otherwise."""
    fields = dataclasses.fields(SymbolicAnalysis)
    if hasattr(SymbolicAnalysis, "__post_init__") or not all(f.init for f in fields):
        return None
    return tuple(f.name for f in fields)


def _pattern_view(A) -> tuple:
    """``(canonical CSC of A, whether it is a copy)``: A itself when it is a CSC
    in canonical format already (nothing copied; its index dtype kept)."""
    if sp.issparse(A) and A.format == "csc" and A.ndim == 2 and A.has_canonical_format:
        return A, False
    return canonical_csc(A), True


def _analyze(A: sp.csc_array, timings: dict, *, ordering, colperm, max_gpu_memory, itemsize,
             amalgamation, singletons, singleton_tol) -> SymbolicAnalysis:
    """The analysis of a canonical CSC ``A`` (see :func:`analyze`); ``timings``
    holds the seconds spent before."""
    fixed_order = colperm is not None or ordering in ("given", "natural")
    m, n = A.shape
    nnz = int(A.nnz)
    t1 = time.perf_counter()
    single, perm, keep_rows, used = _singletons_and_order(A, ordering, colperm, singletons,
                                                          singleton_tol)
    n1, r1 = single.n1cols, single.n1rows
    n2 = n - n1
    t2 = time.perf_counter()
    timings["ordering"] = t2 - t1

    # the rows left, columns in the order found: the tree read off A's columns,
    # postordered; then S (those rows by leftmost column, stably) in the final
    # order; positions of A's entries travel as pos (int64)
    keep = keep_rows if r1 else None
    parent = column_etree_by_columns(A, perm, row_map(m, keep),
                                     lambda: permuted_rows(A, keep, perm))
    post = postorder(parent)
    parent, perm = _relabel(parent, perm, post)
    rowperm2, s_ptr, s_idx, s_pos, sleft = sorted_rows(A, keep, perm)
    t3 = time.perf_counter()
    timings["etree"] = t3 - t2
    # the counts visit the rows by leftmost column, stably: S's order gives the same
    ccount = column_counts(s_ptr, s_idx, parent, sleft)
    t4 = time.perf_counter()
    timings["counts"] = t4 - t3

    sup = fundamental_supernodes(parent, ccount)
    fptr = relaxed_amalgamation(parent, ccount, sup, amalgamation)
    fs = build_fronts(fptr, parent, ccount, s_ptr, s_idx, s_pos, sleft)
    if n1 or r1:
        # global labels; arow_local is indexed by rows of S: -1 for the singleton rows
        fs = dataclasses.replace(
            fs, pivot_ptr=fs.pivot_ptr + n1, cols=fs.cols + n1, arow_ptr=fs.arow_ptr + r1,
            arow_local=np.concatenate([np.full(r1, -1, dtype=np.int64), fs.arow_local]))

    # ---- global labels: singleton block first -----------------------------------
    colperm = np.concatenate([single.cols, perm]).astype(np.int64)
    live1 = single.rows >= 0
    r1_rows = single.rows[live1]
    r1_pivot = np.flatnonzero(live1).astype(np.int64)
    rowperm = np.concatenate([r1_rows, keep_rows[rowperm2]]).astype(np.int64)
    leftmost = np.concatenate([r1_pivot, np.where(sleft < n2, sleft + n1, n)]).astype(np.int64)
    etree = np.concatenate([np.full(n1, -1, dtype=np.int64),
                            np.where(parent >= 0, parent + n1, -1)]).astype(np.int64)
    # R1 = the singleton rows of A, columns in colperm order
    icol = np.empty(n, dtype=np.int64)
    icol[colperm] = np.arange(n, dtype=np.int64)
    if r1:
        pos = sp.csc_array((np.arange(nnz, dtype=np.int64), A.indices, A.indptr), shape=(m, n))
        Rr = sp.csr_array(pos)[r1_rows]
    else:
        Rr = sp.csr_array((0, n), dtype=np.int64)
    R1 = sp.csr_array((Rr.data, icol[Rr.indices], Rr.indptr), shape=(r1, n))
    R1.has_sorted_indices = False
    R1.sort_indices()
    r1_ptr = R1.indptr.astype(np.int64)
    r1_cols = R1.indices.astype(np.int64)
    r1_nz = R1.data.astype(np.int64)
    if r1 and not np.array_equal(r1_cols[r1_ptr[:-1]], r1_pivot):
        raise AssertionError("a singleton row has an entry left of its pivot column")
    r1nz = int(len(r1_nz))
    if singletons and fixed_order and n2:
        # the postorder may have brought more singletons to the front of a fixed
        # order: analyse that order again (n1cols grows, so this ends), so that
        # analysing with colperm=analysis.colperm reproduces the analysis
        if leading_singletons(A, colperm, singleton_tol).n1cols > n1:
            again = _analyze(A, dict(timings), ordering="colamd", colperm=colperm,
                             max_gpu_memory=max_gpu_memory, itemsize=itemsize,
                             amalgamation=amalgamation, singletons=True,
                             singleton_tol=singleton_tol)
            return dataclasses.replace(again, ordering_used=used)
    ccount_all = np.concatenate([np.zeros(n1, dtype=np.int64), ccount]).astype(np.int64)
    ccount_all[r1_pivot] = np.diff(r1_ptr)
    t5 = time.perf_counter()
    timings["fronts"] = t5 - t4

    work = _counts.front_work(fs)
    peak = _counts.factor_peak_bytes(fs, work, itemsize) + r1nz * itemsize
    gpu = _counts.gpu_front_bytes(fs, work, itemsize)
    flops = float(work["flops"].sum())
    nnz_R = int(work["nnz_R"].sum()) + r1nz
    nnz_H = int(work["nnz_H"].sum())
    # host: the factorization peak, H (values), R's indices and A's copy
    host = int(peak + nnz_H * itemsize + nnz_R * 8 + nnz * (itemsize + 8) + (m + n) * 8 * 4)
    one_stage = plan_stages(fs.parent, fs.child_ptr, fs.children, gpu, None)
    gpu_bytes = one_stage.stage_bytes[0] if one_stage.stage_bytes else 0
    plan = (one_stage if max_gpu_memory is None else
            plan_stages(fs.parent, fs.child_ptr, fs.children, gpu, int(max_gpu_memory)))
    timings["counts_staging"] = time.perf_counter() - t5
    return SymbolicAnalysis(
        m=m, n=n, nnz=nnz, ordering_used=used, colperm=colperm, rowperm=rowperm,
        leftmost=leftmost, etree=etree, col_counts=ccount_all, fronts=fs,
        flops=flops, nnz_R=nnz_R, nnz_H=nnz_H, factor_bytes=int(peak),
        intensity=(flops / peak) if peak else 0.0, gpu_bytes=int(gpu_bytes), host_bytes=host,
        stages=plan, front_flops=work["flops"], front_nnz_R=work["nnz_R"],
        front_nnz_H=work["nnz_H"], front_cb_entries=work["cb_entries"],
        front_gpu_additive=gpu["additive"], front_gpu_cb=gpu["cb"],
        front_gpu_staging=gpu["staging"], a_indptr=A.indptr, a_indices=A.indices,
        n1cols=int(n1), n1rows=int(r1), r1_pivot=r1_pivot, r1_ptr=r1_ptr, r1_cols=r1_cols,
        r1_nz=r1_nz, singleton_tol=singleton_tol,
        itemsize=int(itemsize), amalgamation=amalgamation, timings=timings)
