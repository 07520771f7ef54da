"""SuiteSparseQR (multifrontal sparse QR) through cffi in ABI mode.

:func:`spqr_factorize` calls ``SuiteSparseQR_C`` once, keeping the
Householder vectors (H, HTau, HPinv), copies every output into NumPy/SciPy
arrays and frees the C memory before returning, so the resulting
:class:`SpqrQR` owns no C object and pickles. ``qt_matmul``/``q_matmul``
apply Q from those arrays: through SuiteSparseQR's own
``SuiteSparseQR_qmult<double>(method, H, HTau, HPinv, X, cc)``, a C++
template the library exports (its C API only offers ``qmult`` on an opaque
factorization object, which has no accessor for R or E); cffi calls it by its
mangled name, which has one form for SPQR 2.x/3.x (SuiteSparse 5.x, 7.0-7.1)
and one for SPQR 4.x (SuiteSparse 7.2+). Where neither symbol exists, the
same product is computed by NumPy (one Householder reflection at a time;
slower, same result).

One ``cholmod_common`` per call (see :mod:`._cholmod`); nothing is shared
between calls except the immutable library handle.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from .._numeric import NumericQR
from . import _cholmod, blas_threads, spqr_orders
from ._cholmod import Common, dense_to_numpy, dense_view, sparse_to_scipy, sparse_view
from ._ffi_cache import declared_ffi, symbol
from ._libs import INSTALL_HINT, LibraryNotFound, find_library, major_version, open_library

__all__ = ["spqr_available", "spqr_factorize", "spqr_solve_default", "SpqrQR", "ORDERINGS",
           "declaration_set"]

_SPQR_CDEF = """
int64_t SuiteSparseQR_C(int ordering, double tol, int64_t econ, int getCTX,
    cholmod_sparse *A, cholmod_sparse *Bsparse, cholmod_dense *Bdense,
    cholmod_sparse **Zsparse, cholmod_dense **Zdense, cholmod_sparse **R,
    int64_t **E, cholmod_sparse **H, int64_t **HPinv, cholmod_dense **HTau,
    cholmod_common *cc);
cholmod_dense *SuiteSparseQR_C_backslash(int ordering, double tol,
    cholmod_sparse *A, cholmod_dense *B, cholmod_common *cc);
"""

#: mangled names of SuiteSparseQR_qmult<double>(int method, cholmod_sparse *H,
#: cholmod_dense *HTau, int64_t *HPinv, cholmod_dense *X, cholmod_common *cc)
_QMULT_SYMBOLS = (
    # template <typename Entry>: SPQR 2.x, 3.x
    "_Z19SuiteSparseQR_qmultIdEP20cholmod_dense_structiP21cholmod_sparse_structS1_"
    "PlS1_P21cholmod_common_struct",
    # template <typename Entry, typename Int> with Int = int64_t: SPQR 4.x
    "_Z19SuiteSparseQR_qmultIdlEP20cholmod_dense_structiP21cholmod_sparse_structS1_"
    "PT0_S1_P21cholmod_common_struct",
)
_QMULT_SIGNATURE = ("cholmod_dense *{}(int, cholmod_sparse *, cholmod_dense *, int64_t *, "
                    "cholmod_dense *, cholmod_common *);")

#: ordering keyword -> SPQR_ORDERING_* code
#: ('natural' runs SPQR_ORDERING_FIXED, not SPQR_ORDERING_NATURAL, which moves
#: column singletons first; the dependent columns found by rank detection are
#: then moved to the end by :func:`_trapezoidal`)
ORDERINGS = {"natural": 0, "colamd": 2, "amd": 5, "metis": 6, "default": 7, "best": 8,
             "bestamd": 9}
_FIXED = 0
_ORDERING_NAMES = {0: "fixed", 1: "natural", 2: "colamd", 3: "given", 4: "cholmod", 5: "amd",
                   6: "metis", 7: "default", 8: "best", 9: "bestamd"}

#: SuiteSparseQR's statistics a factorization reports (``info`` names), from the fields
#: of ``cholmod_common`` (the last, the peak memory, an integer)
_STAT_NAMES = ("flops", "tol_used", "norm_E_fro", "analyze_time", "factorize_time",
               "flopcount_bound")
_STAT_FIELDS = ("SPQR_flopcount", "SPQR_tol_used", "SPQR_norm_E_fro", "SPQR_analyze_time",
                "SPQR_factorize_time", "SPQR_flopcount_bound", "memory_usage")

SPQR_DEFAULT_TOL = -2.0
SPQR_NO_TOL = -1.0
SPQR_QTX = 0
SPQR_QX = 1


class _Libs(NamedTuple):
    ffi: object
    cholmod: object
    spqr: object
    spqr_path: str
    qmult: object  # the C++ qmult function, or None


def _declarations() -> str:
    """The C declarations of everything :func:`_libs` calls (one declaration set)."""
    return "\n".join((_cholmod.CDEF, _SPQR_CDEF, blas_threads.CDEF,
                      *(_QMULT_SIGNATURE.format(name) for name in _QMULT_SYMBOLS)))


def declaration_set() -> tuple[str, str]:
    """The name and C declarations of SuiteSparseQR's cffi declaration set (what
    :func:`_libs` declares; ``build_kernels.py`` writes its module ahead)."""
    return "spqr", _declarations()


@functools.lru_cache(maxsize=1)
def _libs() -> _Libs:
    # The handles are immutable once opened; caching them is not mutable state.
    # The declarations come parsed from the cache folder where they can
    # (:mod:`._ffi_cache`): a new process does not parse C.
    spqr_path = find_library("spqr")
    ffi = declared_ffi(*declaration_set())
    spqr = open_library(ffi, "spqr")
    # CHOLMOD's functions are looked up through libspqr's handle, so they come from
    # the libcholmod that libspqr itself was linked against (dlsym searches a
    # handle's dependencies), never from another installed version
    cholmod = spqr
    qmult = None
    for name in _QMULT_SYMBOLS:
        qmult = symbol(spqr, name)
        if qmult is not None:
            break
    return _Libs(ffi, cholmod, spqr, spqr_path, qmult)


def spqr_available() -> tuple[bool, str]:
    """Whether SuiteSparseQR can be used, and why not (with the install command).

    Returns
    -------
    ok : bool
    reason : str
        ``"SuiteSparseQR (<library>), CHOLMOD x.y.z"`` when usable, otherwise
        what failed and how to install SuiteSparse.
    """
    try:
        return True, _usable()
    except ImportError as exc:
        return False, f"cffi is not importable ({exc}); pip install cffi"
    except LibraryNotFound as exc:
        return False, str(exc)
    except (_cholmod.CholmodLayoutError, RuntimeError, OSError) as exc:
        return False, f"{exc}; {INSTALL_HINT}"


@functools.lru_cache(maxsize=1)
def _usable() -> str:
    """What :func:`spqr_available` says of a library that loads and whose
    ``cholmod_common`` has the layout we know: checked once per process (the
    library handle is opened once, :func:`_libs`); a failure raises and is
    checked again on the next call."""
    libs = _libs()
    with Common(libs.ffi, libs.cholmod):
        pass
    return f"SuiteSparseQR ({libs.spqr_path}), CHOLMOD {_cholmod_version(libs)}"


def _common(libs: _Libs) -> Common:
    """A ``cholmod_common`` of ``libs`` for one call (a context manager), its layout
    checked once per process by :func:`_usable` (which raises where it is not the
    one we know) rather than at every start."""
    _usable()
    return Common(libs.ffi, libs.cholmod, check_layout=False)


def _cholmod_version(libs: _Libs) -> str:
    v = libs.ffi.new("int[3]")
    libs.cholmod.cholmod_l_version(v)
    return f"{v[0]}.{v[1]}.{v[2]}"


@functools.lru_cache(maxsize=1)
def _library_facts() -> tuple[str, str]:
    """``(library, cholmod_version)`` of the loaded library for ``info`` (per process)."""
    libs = _libs()
    return (f"SuiteSparseQR ({libs.spqr_path}, SPQR major {major_version(libs.spqr_path)})",
            _cholmod_version(libs))


# --------------------------------------------------------------------------
# input handling
# --------------------------------------------------------------------------

class _Arrays(NamedTuple):
    """The arrays of a canonical float64 CSC matrix with int64 indices, as
    :func:`~scipy_gpuqr._cpu._cholmod.sparse_view` reads them (no SciPy object)."""

    shape: tuple
    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray


def _as_csc(A):
    """A canonical float64 CSC copy of A with int64 indices (the input is never modified).

    For an A already canonical CSC float64, the copied arrays as :class:`_Arrays`
    (what the factorization reads: SciPy's constructor, after the caller's
    garbage collection, cost several times the copy on a small A); else a
    ``csc_array``."""
    if not (sp.issparse(A)):
        A = np.asarray(A)
        if A.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got an array of shape {A.shape}")
    dtype = A.dtype
    if dtype != np.float64:             # float64 (the factorizations' own matrices) is real
        if np.issubdtype(dtype, np.complexfloating):
            raise TypeError(f"SuiteSparseQR binding supports real matrices only, got {dtype}")
        if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
            raise TypeError(f"matrix of non-numeric dtype {dtype}")
    if type(A) in (sp.csc_array, sp.csc_matrix) and dtype == np.float64 \
            and A.has_canonical_format:
        # already canonical: a copy of its arrays, without SciPy's conversions
        data = A.data.copy()
        if not np.isfinite(data).all():
            raise ValueError("matrix contains non-finite values (inf or NaN)")
        return _Arrays((int(A.shape[0]), int(A.shape[1])), data, A.indices.astype(np.int64),
                       A.indptr.astype(np.int64))
    else:
        C = sp.csc_array(A, dtype=np.float64, copy=True)
        C.sum_duplicates()  # also sorts indices
        C.sort_indices()
    C.indptr = C.indptr.astype(np.int64, copy=False)
    C.indices = C.indices.astype(np.int64, copy=False)
    if not np.isfinite(C.data).all():
        raise ValueError("matrix contains non-finite values (inf or NaN)")
    return C


def _tol_code(tol) -> float:
    if isinstance(tol, str):
        if tol != "default":
            raise ValueError(f"tol must be 'default', None or a number >= 0, got {tol!r}")
        return SPQR_DEFAULT_TOL
    if tol is None:
        return SPQR_NO_TOL
    tol = float(tol)
    if not (tol >= 0 and np.isfinite(tol)):
        raise ValueError(f"tol must be 'default', None or a finite number >= 0, got {tol!r}")
    return tol


def default_tol(A: sp.csc_array) -> float:
    """SuiteSparseQR's default rank tolerance: 20·(m+n)·eps·max column 2-norm."""
    m, n = A.shape
    if A.nnz == 0:
        return 0.0
    colnorm = np.sqrt(np.asarray((A.multiply(A)).sum(axis=0)).ravel())
    return 20.0 * (m + n) * np.finfo(np.float64).eps * float(colnorm.max())


def _check_colperm(colperm, n: int) -> np.ndarray:
    p = np.asarray(colperm)
    if p.ndim != 1 or p.shape[0] != n or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"colperm must be an integer permutation of length {n}")
    p = p.astype(np.int64)
    if n and not np.array_equal(np.sort(p), np.arange(n)):
        raise ValueError(f"colperm is not a permutation of 0..{n - 1}")
    return p


# --------------------------------------------------------------------------
# the factorization object
# --------------------------------------------------------------------------

@dataclass
class SpqrQR(NumericQR):
    """SuiteSparseQR's factorization ``A[:, colperm] = Q @ R``, held in NumPy arrays.

    Besides :class:`~scipy_gpuqr._numeric.NumericQR`'s attributes:

    Attributes
    ----------
    H : scipy.sparse.csc_array, shape (m, nh)
        Householder vectors, rows in HPinv order.
    HTau : ndarray, shape (nh,)
        Householder coefficients.
    HPinv : ndarray of int64, shape (m,)
        Row permutation of the Householder representation.

    Notes
    -----
    ``R`` has ``k = min(m, n)`` rows. With rank detection (``tol`` not None)
    and numerical rank ``r < k``, SuiteSparseQR moves the columns it found
    dependent to the end of ``colperm``: ``R[:r, :r]`` is upper triangular
    with nonzero diagonal, ``R[:r, r:]`` holds the coupling to the dropped
    columns, and rows ``r:k`` are zero. ``A[:, colperm] - Q @ R`` then has
    Frobenius norm ``info['norm_E_fro']`` (the dropped part, at most about
    tol·sqrt(n - r)), not roundoff. Without rank detection the
    factorization is exact to roundoff and ``rank`` is ``min(m, n)``, even if
    R has tiny or zero diagonal entries.
    """

    H: sp.csc_array = None
    HTau: np.ndarray = None
    HPinv: np.ndarray = None
    blas_threads: int = None

    def qt_matmul(self, B) -> np.ndarray:
        """Return ``Q.T @ B`` for B of shape (m,) or (m, k) (float64, or complex if B is)."""
        return self._apply(SPQR_QTX, B)

    def q_matmul(self, Y) -> np.ndarray:
        """Return ``Q @ Y`` for Y of shape (m,) or (m, k) (float64, or complex if Y is)."""
        return self._apply(SPQR_QX, Y)

    def _apply(self, method: int, X) -> np.ndarray:
        X = np.asarray(X)
        m = self.shape[0]
        if X.ndim not in (1, 2) or X.shape[0] != m:
            raise ValueError(f"expected an array of shape ({m},) or ({m}, k), got {X.shape}")
        if X.dtype != np.float64:       # float64 (the solves' own arrays) needs no more checks
            if np.iscomplexobj(X):
                return self._apply(method, X.real) + 1j * self._apply(method, X.imag)
            if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
                raise TypeError(f"array of non-numeric dtype {X.dtype}")
        X2 = np.asfortranarray(X.reshape(m, 1 if X.ndim == 1 else X.shape[1]),
                               dtype=np.float64)
        if X2.size == 0 or self.H.shape[1] == 0:
            Y = _apply_numpy(method, self.H, self.HTau, self.HPinv, X2)
        else:
            libs = _libs()
            if libs.qmult is not None:
                with blas_threads.limited(libs.spqr, self.blas_threads):
                    Y = _apply_spqr(libs, method, self.H, self.HTau, self.HPinv, X2)
            else:
                Y = _apply_numpy(method, self.H, self.HTau, self.HPinv, X2)
        return Y.reshape(X.shape)

    def free(self) -> None:
        """Nothing to release: all factors are NumPy/SciPy arrays."""


def _apply_spqr(libs: _Libs, method: int, H, HTau, HPinv, X) -> np.ndarray:
    ffi = libs.ffi
    keep: list = []
    with _common(libs) as cc:
        Hv = sparse_view(ffi, H, keep)
        tau = np.asfortranarray(HTau.reshape(1, -1), dtype=np.float64)
        tauv = dense_view(ffi, tau, keep)
        hpinv = np.ascontiguousarray(HPinv, dtype=np.int64)
        hp = ffi.from_buffer("int64_t[]", hpinv)
        Xv = dense_view(ffi, X, keep)
        Y = libs.qmult(method, Hv, tauv, hp, Xv, cc.ptr)
        try:
            cc.check("SuiteSparseQR_qmult", Y != ffi.NULL)
            out = dense_to_numpy(ffi, Y)
        finally:
            if Y != ffi.NULL:
                libs.cholmod.cholmod_l_free_dense(ffi.new("cholmod_dense **", Y), cc.ptr)
    return out


def _apply_numpy(method: int, H, HTau, HPinv, X) -> np.ndarray:
    """Apply Q (method 1) or Q.T (method 0) from the Householder arrays with NumPy.

    Qᵀ = H_nh ··· H_2 · H_1 · P with H_j = I - tau_j v_j v_jᵀ (v_j = H[:, j]) and
    P the row permutation that moves row i to row ``HPinv[i]``.
    """
    Y = np.array(X, dtype=np.float64, order="F")
    indptr, indices, data = H.indptr, H.indices, H.data
    nh = H.shape[1]
    if method == SPQR_QTX:
        Y = np.empty_like(Y)
        Y[HPinv] = X
        order = range(nh)
    else:
        order = range(nh - 1, -1, -1)
    for j in order:
        tau = HTau[j]
        if tau == 0:
            continue
        lo, hi = indptr[j], indptr[j + 1]
        rows = indices[lo:hi]
        v = data[lo:hi]
        Y[rows] -= np.outer(v, tau * (v @ Y[rows]))
    if method != SPQR_QTX:
        Y = Y[HPinv]
    return np.asfortranarray(Y)


# --------------------------------------------------------------------------
# factorization
# --------------------------------------------------------------------------

def spqr_factorize(A, *, ordering: str = "colamd", colperm=None, tol="default",
                   blas_threads_hint: int = None) -> SpqrQR:
    """QR factorization ``A[:, colperm] = Q @ R`` by SuiteSparseQR.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n)
        Real. float32, integer and bool inputs are factorized in float64.
        Duplicates are summed; the input is not modified.
    ordering : {'colamd', 'natural', 'amd', 'metis', 'best', 'bestamd', 'default'}
        SuiteSparseQR's fill-reducing column ordering (``'default'`` is its
        own choice; ``'metis'`` needs a CHOLMOD built with METIS;
        ``info['ordering_used']`` says what ran). ``'natural'`` keeps the
        column order (no singleton reordering either): ``colperm`` is
        ``arange(n)`` unless rank detection drops columns, which are then
        moved to the end. ``'given'`` requires ``colperm``; any ordering is
        ignored when ``colperm`` is given.
    colperm : array of int, shape (n,), optional
        A fixed column order chosen by the caller: ``A[:, colperm]`` is
        factorized without further column permutation, except that with rank
        detection the dropped (dependent) columns are moved to the end (the
        returned ``colperm`` says where they went).
    tol : 'default', None or float
        Rank-detection tolerance: ``'default'`` is SuiteSparseQR's rule
        20·(m+n)·eps·(max column 2-norm); ``None`` turns rank detection off;
        a number ≥ 0 is used as given (columns whose remaining 2-norm is ≤ tol
        are dropped).
    blas_threads_hint : int, optional
        BLAS threads for this factorization and its ``qt_matmul``/``q_matmul``
        (see :mod:`.blas_threads`; None keeps the BLAS library's setting).

    Returns
    -------
    SpqrQR
        ``R`` has ``min(m, n)`` rows (see :class:`SpqrQR` Notes for its form
        under rank detection); ``rank``, ``tol`` (the tolerance actually used,
        None when off), ``flops`` (SuiteSparseQR's count) and ``info``.

    Notes
    -----
    Without rank detection (``tol`` None) and a fill-reducing ``ordering``
    ('colamd', 'amd', 'metis'), a canonical CSC A whose pattern SuiteSparseQR
    ordered before in this process is factorized in that kept order with its
    fixed ordering (:mod:`.spqr_orders`): the same factors bit for bit, without
    ordering again. ``info['ordering_kept']`` says so; ``info['ordering_used']``
    names the ordering that found the order (``info['istat']`` is the run's own,
    its ordering the fixed one).

    Raises
    ------
    TypeError
        For complex or non-numeric A.
    ValueError
        For non-finite entries, a bad ``ordering``, ``tol`` or ``colperm``.
    MemoryError
        When SuiteSparse runs out of memory.
    RuntimeError
        When SuiteSparseQR reports another failure (the function and status
        are named).
    LibraryNotFound
        When SuiteSparseQR is not installed.
    """
    if ordering not in ORDERINGS and ordering != "given":
        raise ValueError(f"ordering must be one of {sorted(ORDERINGS)} or 'given', "
                         f"got {ordering!r}")
    if ordering == "given" and colperm is None:
        raise ValueError("ordering='given' needs colperm")
    tol_code = _tol_code(tol)
    # without rank detection, SuiteSparseQR's order of a pattern it ordered before
    # (:mod:`.spqr_orders`): A in that order, with the fixed ordering
    kept_key = (spqr_orders.pattern_key(A, ordering)
                if colperm is None and tol_code == SPQR_NO_TOL else None)
    kept = spqr_orders.lookup(kept_key, A)
    user_perm = None
    if kept is not None:
        indptr, indices, gather = kept.permuted()
        data = A.data[gather]
        if not np.isfinite(data).all():
            raise ValueError("matrix contains non-finite values (inf or NaN)")
        C = _Arrays(kept.shape, data, indices, indptr)
        order_code = _FIXED
    else:
        C = _as_csc(A)
    m, n = C.shape
    if colperm is not None:
        user_perm = _check_colperm(colperm, n)
        if isinstance(C, _Arrays):
            C = sp.csc_array((C.data, C.indices, C.indptr), shape=C.shape, copy=False)
        C = C[:, user_perm]
        C.sort_indices()
        C.indptr = C.indptr.astype(np.int64, copy=False)
        C.indices = C.indices.astype(np.int64, copy=False)
        order_code = _FIXED
    elif kept is None:
        order_code = ORDERINGS[ordering]
    if m == 0 or n == 0:
        return _empty_factorization(C, tol_code, user_perm)

    libs = _libs()
    spqr_rank, R, H, HTau, HPinv, E, stats, wall = _run(libs, C, order_code, tol_code,
                                                        blas_threads_hint)
    ordering_used = _ORDERING_NAMES.get(stats["istat"]["ordering_used"], "unknown")
    if kept is not None:
        if not kept.agrees(stats["istat"]):
            # the kept order did not run as the first factorization did: SuiteSparseQR
            # orders again, and this pattern's order is not kept from now on
            spqr_orders.refuse(kept_key)
            return spqr_factorize(A, ordering=ordering, tol=tol,
                                  blas_threads_hint=blas_threads_hint)
        E = kept.colperm[E]
        ordering_used = kept.ordering_used
    elif kept_key is not None:
        spqr_orders.keep(kept_key, A, E, stats["istat"], ordering_used)

    k = min(m, n)
    if tol_code == SPQR_NO_TOL:
        rank, tol_used = k, None
    else:
        rank = int(spqr_rank)
        tol_used = stats["tol_used"] if tol_code == SPQR_DEFAULT_TOL else tol_code
        if rank < n:
            trap = _trapezoidal(R, rank)
            if trap is not None:
                R = R[:, trap]
                E = E[trap]
    perm = E if user_perm is None else user_perm[E]
    library, cholmod_version = _library_facts()
    info = {
        "backend": "cpu",
        "library": library,
        "cholmod_version": cholmod_version,
        "ordering_requested": "given" if user_perm is not None else ordering,
        "ordering_used": ordering_used,
        "ordering_kept": kept is not None,
        "rank_spqr": int(spqr_rank),
        "qmult": "SuiteSparseQR_qmult" if libs.qmult is not None else "numpy",
        "wall_time": wall,
        **{key: stats[key] for key in ("analyze_time", "factorize_time", "flopcount_bound",
                                       "norm_E_fro", "peak_memory_bytes", "istat")},
    }
    return SpqrQR(shape=(m, n), R=R, colperm=perm, rank=rank, tol=tol_used,
                  flops=stats["flops"], info=info, H=H, HTau=HTau, HPinv=HPinv,
                  blas_threads=blas_threads_hint)


def _run(libs: _Libs, C, order_code: int, tol_code: float, blas_threads_hint):
    """One ``SuiteSparseQR_C`` call on canonical int64 CSC C: ``(rank, R, H, HTau, HPinv,
    E, stats, wall seconds)``, every output copied into NumPy/SciPy arrays and the C
    memory freed."""
    ffi = libs.ffi
    m, n = C.shape
    k = min(m, n)
    keep: list = []
    t0 = time.perf_counter()
    with _common(libs) as cc:
        Av = sparse_view(ffi, C, keep)
        R_p = ffi.new("cholmod_sparse **")
        E_p = ffi.new("int64_t **")
        H_p = ffi.new("cholmod_sparse **")
        HPinv_p = ffi.new("int64_t **")
        HTau_p = ffi.new("cholmod_dense **")
        try:
            with blas_threads.limited(libs.spqr, blas_threads_hint):
                spqr_rank = libs.spqr.SuiteSparseQR_C(
                    order_code, tol_code, k, 0, Av, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL,
                    R_p, E_p, H_p, HPinv_p, HTau_p, cc.ptr)
            cc.check("SuiteSparseQR_C", spqr_rank >= 0)
            R = sparse_to_scipy(ffi, R_p[0])
            H = sparse_to_scipy(ffi, H_p[0])
            HTau = dense_to_numpy(ffi, HTau_p[0]).ravel()
            HPinv = np.frombuffer(ffi.buffer(HPinv_p[0], 8 * m), dtype=np.int64).copy()
            if E_p[0] != ffi.NULL:
                E = np.frombuffer(ffi.buffer(E_p[0], 8 * n), dtype=np.int64).copy()
            else:
                E = np.arange(n, dtype=np.int64)
            values = cc.values(_STAT_FIELDS)
            stats = {key: float(v) for key, v in zip(_STAT_NAMES, values[:-1])}
            stats["peak_memory_bytes"] = int(values[-1])
            stats["istat"] = cc.istat()
        finally:
            _free_sparse(libs, R_p, cc)
            _free_sparse(libs, H_p, cc)
            if HTau_p[0] != ffi.NULL:
                libs.cholmod.cholmod_l_free_dense(HTau_p, cc.ptr)
            if E_p[0] != ffi.NULL:
                libs.cholmod.cholmod_l_free(n, 8, E_p[0], cc.ptr)
            if HPinv_p[0] != ffi.NULL:
                libs.cholmod.cholmod_l_free(m, 8, HPinv_p[0], cc.ptr)
    return spqr_rank, R, H, HTau, HPinv, E, stats, time.perf_counter() - t0


def _trapezoidal(R: sp.csc_array, rank: int):
    """Column order that turns a "squeezed" R into upper trapezoidal form, or None.

    With a fixed ordering and rank detection, SuiteSparseQR leaves the columns
    it dropped in place: row i's leading entry (its pivot) is at column
    c_i >= i. Moving the pivot columns first and the dropped ones after them
    (each group in its original order) makes ``R[:rank, :rank]`` upper
    triangular with nonzero diagonal; Q is unchanged. Returns None when R is
    already in that form.
    """
    if rank == 0 or _trapezoidal_already(R, rank):
        return None
    Rr = sp.csr_array(R[:rank])
    Rr.eliminate_zeros()
    Rr.sort_indices()
    counts = np.diff(Rr.indptr)
    if rank == 0 or np.any(counts == 0):
        if rank == 0:
            return None
        raise RuntimeError(f"SuiteSparseQR returned an R with an empty row among its first "
                           f"{rank} (rank) rows")
    pivots = Rr.indices[Rr.indptr[:-1]]
    if np.array_equal(pivots, np.arange(rank)):
        return None
    if np.any(np.diff(pivots) <= 0):
        raise RuntimeError("SuiteSparseQR returned an R that is not upper trapezoidal")
    dead = np.ones(R.shape[1], dtype=bool)
    dead[pivots] = False
    return np.concatenate([pivots, np.flatnonzero(dead)]).astype(np.int64)


def _trapezoidal_already(R: sp.csc_array, rank: int) -> bool:
    """Whether R is in upper trapezoidal form already (what :func:`_trapezoidal`
    answers None for): every row ``i < rank`` has its leading nonzero entry at
    column i, i.e. ``R[j, j] != 0`` for ``j < rank`` and no nonzero entry of rows
    ``< rank`` lies below the diagonal of the first ``rank`` columns. Read off R's CSC
    arrays (a row-major copy of R, sorted, costs ten times as much); False where it
    is not (the caller then finds the column order)."""
    indptr = R.indptr
    stop = int(indptr[rank])
    rows = R.indices[:stop]
    cols = np.arange(rank, dtype=rows.dtype).repeat(indptr[1:rank + 1] - indptr[:rank])
    live = (rows < rank) & (R.data[:stop] != 0)
    if (rows[live] > cols[live]).any():
        return False
    diagonal = np.zeros(rank, dtype=bool)
    diagonal[cols[live & (rows == cols)]] = True
    return bool(diagonal.all())


def _free_sparse(libs: _Libs, pp, cc: Common) -> None:
    if pp[0] != libs.ffi.NULL:
        libs.cholmod.cholmod_l_free_sparse(pp, cc.ptr)


def _empty_factorization(C: sp.csc_array, tol_code: float, user_perm) -> SpqrQR:
    m, n = C.shape
    perm = np.arange(n, dtype=np.int64) if user_perm is None else user_perm
    tol = None if tol_code == SPQR_NO_TOL else (0.0 if tol_code == SPQR_DEFAULT_TOL
                                                 else tol_code)
    return SpqrQR(shape=(m, n), R=sp.csc_array((0, n), dtype=np.float64), colperm=perm,
                  rank=0, tol=tol, flops=0.0,
                  info={"backend": "cpu", "library": "none (empty matrix)", "wall_time": 0.0},
                  H=sp.csc_array((m, 0), dtype=np.float64),
                  HTau=np.zeros(0, dtype=np.float64), HPinv=np.arange(m, dtype=np.int64))


# --------------------------------------------------------------------------
# x = A \ b, SuiteSparseQR's own least-squares / basic solution
# --------------------------------------------------------------------------

def spqr_solve_default(A, b, tol="default") -> np.ndarray:
    """``x = A \\ b`` by ``SuiteSparseQR_C_backslash`` with its default ordering.

    For comparison with SuiteSparseQR in tests and benchmarks: a
    least-squares solution for m ≥ n, a basic (not minimum-norm) solution
    for m < n or rank-deficient A.

    Parameters
    ----------
    A : sparse matrix/array or 2-D array, shape (m, n), real
    b : array, shape (m,) or (m, k)
    tol : 'default', None or float
        As in :func:`spqr_factorize`.

    Returns
    -------
    x : ndarray of float64, shape (n,) or (n, k)
    """
    tol_code = _tol_code(tol)
    C = _as_csc(A)
    m, n = C.shape
    b = np.asarray(b)
    if b.ndim not in (1, 2) or b.shape[0] != m:
        raise ValueError(f"b must have shape ({m},) or ({m}, k) for A of shape {C.shape}, "
                         f"got {b.shape}")
    if np.iscomplexobj(b):
        raise TypeError("spqr_solve_default supports real right-hand sides only")
    B = np.asfortranarray(b.reshape(m, 1 if b.ndim == 1 else b.shape[1]), dtype=np.float64)
    out_shape = (n,) if b.ndim == 1 else (n, B.shape[1])
    if m == 0 or n == 0 or B.shape[1] == 0:
        return np.zeros(out_shape)
    libs = _libs()
    ffi = libs.ffi
    keep: list = []
    with _common(libs) as cc:
        Av = sparse_view(ffi, C, keep)
        Bv = dense_view(ffi, B, keep)
        X = libs.spqr.SuiteSparseQR_C_backslash(ORDERINGS["default"], tol_code, Av, Bv, cc.ptr)
        try:
            cc.check("SuiteSparseQR_C_backslash", X != ffi.NULL)
            x = dense_to_numpy(ffi, X)
        finally:
            if X != ffi.NULL:
                libs.cholmod.cholmod_l_free_dense(ffi.new("cholmod_dense **", X), cc.ptr)
    return x.reshape(out_shape)
