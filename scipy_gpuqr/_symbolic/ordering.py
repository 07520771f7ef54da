"""Column orderings for sparse QR: COLAMD, AMD on AᵀA, METIS, natural, given, and fallbacks.

``column_ordering(A, ordering, colperm)`` returns ``(perm, ordering_used)``.
``ordering_used`` names what really ran, with the reason when a fallback was
taken (COLAMD, AMD or METIS library absent):

* ``'colamd'``: SuiteSparse COLAMD (through cffi) with the knobs CHOLMOD
  gives it when SuiteSparseQR orders through ``cholmod_l_colamd``: only
  completely dense rows are ignored (dense-row knob -1; COLAMD's own default,
  ``max(16, 10·sqrt(n))`` entries, ignores more rows and gives a different
  order from SuiteSparseQR's, with more fill on some matrices), dense columns above
  ``max(16, 10·sqrt(min(m, n)))`` entries ordered last, aggressive
  absorption. Without SuiteSparse the
  fallback is AMD-free: reverse Cuthill–McKee on the pattern of AᵀA with
  dense rows left out (``'rcm'``), a poorer but dependency-free order.
* ``'amd'``: SuiteSparse AMD on the pattern of AᵀA (dense rows, those with
  more than ``max(16, 10·sqrt(n))`` entries, left out like COLAMD does);
  falls back to COLAMD when libamd is missing.
* ``'metis'``: METIS' nested dissection of the graph of AᵀA (dense rows
  left out as for AMD), through ``libmetis.so.5``, which CHOLMOD's packages
  bring; falls back to COLAMD when the library is missing. It costs more
  than COLAMD and, on large problems, often leaves much less fill and work.
* ``'natural'``: the identity; ``'given'``: the caller's ``colperm``.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from .._cpu._ffi_cache import declared_ffi
from .._cpu._libs import open_library
from .._cpu.colamd import colamd, colamd_available
from .._cpu.metis import nested_dissection

__all__ = ["column_ordering", "ORDERINGS", "amd_declaration_set"]

ORDERINGS = ("colamd", "natural", "given", "amd", "metis")

_AMD_CDEF = """
void amd_l_defaults(double Control[5]);
int64_t amd_l_order(int64_t n, const int64_t Ap[], const int64_t Ai[], int64_t P[],
                    double Control[5], double Info[20]);
"""


def amd_declaration_set() -> tuple[str, str]:
    """The name and C declarations of AMD's cffi declaration set (what
    :func:`_amd_lib` declares; ``build_kernels.py`` writes its module ahead)."""
    return "amd", _AMD_CDEF


@functools.lru_cache(maxsize=1)
def _amd_lib():
    ffi = declared_ffi(*amd_declaration_set())
    return ffi, open_library(ffi, "amd")


def _ata_pattern(A: sp.csc_array) -> sp.csc_array:
    """Pattern of AᵀA without dense rows (COLAMD's rule), as a CSC array."""
    m, n = A.shape
    P = sp.csr_array((np.ones(A.nnz), A.indices, A.indptr), shape=(n, m)).T  # pattern, CSR of A
    P = sp.csr_array(P)
    row_nnz = np.diff(P.indptr)
    dense = row_nnz > max(16.0, 10.0 * np.sqrt(n))
    if dense.any():
        P = P[~dense]
    G = sp.csc_array(P.T @ P)
    return G


def _amd(A: sp.csc_array) -> np.ndarray:
    ffi, lib = _amd_lib()
    n = A.shape[1]
    G = _ata_pattern(A)
    G.sort_indices()
    Ap = np.ascontiguousarray(G.indptr, dtype=np.int64)
    Ai = np.ascontiguousarray(G.indices, dtype=np.int64)
    P = np.zeros(n, dtype=np.int64)
    control = ffi.new("double[5]")
    lib.amd_l_defaults(control)
    info = ffi.new("double[20]")
    status = lib.amd_l_order(n, ffi.from_buffer("int64_t[]", Ap), ffi.from_buffer("int64_t[]", Ai),
                             ffi.from_buffer("int64_t[]", P), control, info)
    if status < 0:
        raise RuntimeError(f"amd_l_order failed with status {status} on n={n}")
    return P


def _rcm(A: sp.csc_array) -> np.ndarray:
    G = sp.csr_array(_ata_pattern(A))
    return np.asarray(reverse_cuthill_mckee(G, symmetric_mode=True), dtype=np.int64)


def _metis(A: sp.csc_array) -> np.ndarray:
    G = _ata_pattern(A)                         # symmetric: its CSC arrays are its CSR
    G.sort_indices()                            # METIS' order follows the adjacency's order
    rows = np.repeat(np.arange(G.shape[0]), np.diff(G.indptr))
    off = G.indices != rows                     # METIS takes no self loops
    indptr = np.zeros(G.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows[off], minlength=G.shape[0]), out=indptr[1:])
    return nested_dissection(indptr, G.indices[off])


def _colamd(A: sp.csc_array) -> tuple[np.ndarray, str]:
    ok, why = colamd_available()
    if ok:
        return colamd(A, dense_row=-1.0), "colamd"
    return _rcm(A), f"rcm (COLAMD unavailable: {why})"


def column_ordering(A: sp.csc_array, ordering: str = "colamd",
                    colperm=None) -> tuple[np.ndarray, str]:
    """Fill-reducing column permutation of A for QR.

    Parameters
    ----------
    A : scipy.sparse.csc_array, shape (m, n)
        Canonical CSC (only the pattern is read).
    ordering : {'colamd', 'natural', 'given', 'amd', 'metis'}
        Requested ordering; ``colperm`` given with ordering 'colamd' (the
        default) also means 'given'.
    colperm : array_like of int, optional
        The permutation for 'given'.

    Returns
    -------
    perm : ndarray of int64, shape (n,)
    ordering_used : str
    """
    n = A.shape[1]
    if colperm is not None:
        perm = np.asarray(colperm)
        if perm.ndim != 1 or perm.shape[0] != n or not np.issubdtype(perm.dtype, np.integer):
            raise ValueError(f"colperm must be a 1-D integer permutation of length {n}, "
                             f"got shape {perm.shape} and dtype {perm.dtype}")
        perm = perm.astype(np.int64)
        if n and not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError("colperm is not a permutation of range(n)")
        return perm, "given"
    if ordering == "given":
        raise ValueError("ordering='given' needs colperm")
    if ordering not in ORDERINGS:
        raise ValueError(f"unknown ordering {ordering!r}; expected one of {ORDERINGS}")
    if n == 0 or ordering == "natural":
        return np.arange(n, dtype=np.int64), "natural"
    if ordering == "colamd":
        return _colamd(A)
    if ordering == "amd":
        try:
            return _amd(A), "amd"
        except (OSError, ImportError) as exc:
            perm, used = _colamd(A)
            return perm, f"{used} (AMD unavailable: {exc})"
    # metis
    try:
        return _metis(A), "metis"
    except (OSError, ImportError, OverflowError) as exc:
        perm, used = _colamd(A)
        return perm, f"{used} (METIS unavailable: {exc})"
