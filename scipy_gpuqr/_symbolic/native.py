"""The analysis' tree loops in compiled code (``_native.c``), built on first use.

Liu's algorithm for the column elimination tree walks the tree edge by edge
with path compression: a Python loop (one step per edge and climb), the
largest sequential part of an analysis; the fronts' column lists take a sort
per tree level of every entry. ``_native.c`` runs these in plain loops,
giving the same arrays as the NumPy functions of :mod:`.etree` and
:mod:`.fronts` (the reference; tests compare both):

* ``sgs_column_etree_by_columns``: :func:`.etree.column_etree_by_columns`
  (Liu's algorithm on the edges between a row's consecutive columns, read
  off A's columns in the analysis' order: no spanning forest, no pattern by
  rows needed);
* ``sgs_postorder``: :func:`.etree.postorder` without weights;
* ``sgs_column_counts``: :func:`.etree.column_counts` (the same skeleton
  formula, the least common ancestors from a union-find as the leaves are
  visited in postorder);
* ``sgs_relaxed_amalgamation``: the scalar loop of
  :func:`.fronts.relaxed_amalgamation` (the same rule and float arithmetic);
* ``sgs_front_columns``: the level loop of :func:`.fronts.build_fronts` (the
  fronts' column lists, their children's Rjmap, the S entries' local columns,
  ``fm`` and ``cm``), front after front with a scratch map from a column to
  its local index instead of a sort per tree level;
* ``sgs_front_rows``: the rest of :func:`.fronts.build_fronts` (staircases,
  the S rows' and the children's rows' places, the S-assembly map), front
  after front by counting the rows per slot;
* ``sgs_front_work``: :func:`.counts.front_work`'s flops and nnz(H), a sum
  per front instead of NumPy temporaries over every front column;
* ``sgs_sorted_rows``: :func:`.rows.sorted_rows` (S: the rows of A's
  non-singleton block by leftmost column, columns in the analysis' order) read
  off A's columns in two passes, instead of SciPy's column selection,
  transposition, row selection and index sorts.

The library is plain C99 without Python headers, built on the first use in a
process that finds no built library (never at import) into ``native/`` of the
package cache folder as ``symbolic-{key}.so``, checked against its manifest
before it is loaded, by :mod:`scipy_gpuqr._native_build` (which says when,
where and how), as :mod:`scipy_gpuqr._schedule.native` builds its own.

``$SCIPY_GPUQR_SYMBOLIC_NATIVE`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it is at hand; while it is being built, on a worker
thread started by the first analysis of a process that finds none, the NumPy
code runs), ``c`` (wait for the build; :class:`NativeUnavailable` when it
cannot be had), ``numpy``. No compiler, no cache folder, a failed build or an
old library (another ABI): the NumPy path, decided once per process.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _native_build
from .._errors import NativeUnavailable

__all__ = ["ENV", "ABI", "MODES", "MANIFEST_SUFFIX", "MAX_BUILDS", "NativeUnavailable", "mode",
           "library", "handle", "status", "column_etree_by_columns", "postorder",
           "column_counts", "front_columns", "relaxed_amalgamation", "front_rows", "front_work",
           "sorted_rows"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_SYMBOLIC_NATIVE"
MODES = _native_build.MODES
#: Interface version of ``_native.c`` (``sgs_abi()``).
ABI = 6
#: Suffix added to a library's file name to name its manifest (size and SHA-256).
MANIFEST_SUFFIX = _native_build.MANIFEST_SUFFIX
#: Most built libraries kept (other sources or compilers: other package versions).
MAX_BUILDS = _native_build.MAX_BUILDS


def _declare(lib: ctypes.CDLL) -> None:
    """Type the library's tree loops (each returns 0, or nonzero on failure)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.sgs_postorder.argtypes = [i64, ptr, ptr]
    lib.sgs_column_counts.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr]
    lib.sgs_front_columns.argtypes = [i64, i64] + [ptr] * 15
    lib.sgs_relaxed_amalgamation.argtypes = [i64] + [ptr] * 7
    lib.sgs_front_rows.argtypes = [i64] + [ptr] * 17
    lib.sgs_front_rows.restype = ctypes.c_int
    lib.sgs_relaxed_amalgamation.restype = None
    lib.sgs_front_work.argtypes = [i64] + [ptr] * 6
    lib.sgs_front_work.restype = None
    lib.sgs_sorted_rows.argtypes = [i64, i64, i64] + [ptr] * 9
    lib.sgs_column_etree_by_columns.argtypes = [i64, i64] + [ptr] * 5
    for name in ("sgs_column_etree_by_columns", "sgs_postorder",
                 "sgs_column_counts", "sgs_front_columns", "sgs_sorted_rows"):
        getattr(lib, name).restype = ctypes.c_int


#: The library: ``_native.c`` beside this module, built as ``symbolic-{key}.so``.
_SPEC = _native_build.NativeLibrary.beside(__file__, "symbolic-", ABI, "sgs_abi", ENV, _declare)
#: This process' library (:class:`~scipy_gpuqr._native_build.NativePart`): the
#: path :data:`ENV` asks for (``mode``), the library (``library``), the library
#: for the call at hand (``handle``: what the analysis takes) and the loader's
#: state (``status``).
_NATIVE = _native_build.NativePart(_SPEC, "compiled symbolic analysis")
mode, library, handle, status = _NATIVE.mode, _NATIVE.library, _NATIVE.handle, _NATIVE.status


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _check(rc: int, name: str) -> None:
    if rc != 0:
        raise MemoryError(f"{name}: out of memory in the compiled analysis")


def column_etree_by_columns(lib, a_indptr, a_indices, perm, rowmap, m: int) -> np.ndarray:
    """:func:`.etree.column_etree_by_columns` in C (``rowmap``: >= 0 on the rows
    kept, or None for all)."""
    a_indptr, a_indices, perm = _i64(a_indptr), _i64(a_indices), _i64(perm)
    rowmap = None if rowmap is None else _i64(rowmap)
    n = len(perm)
    parent = np.empty(n, dtype=np.int64)
    _check(lib.sgs_column_etree_by_columns(int(m), n, a_indptr.ctypes.data,
                                           a_indices.ctypes.data, perm.ctypes.data,
                                           None if rowmap is None else rowmap.ctypes.data,
                                           parent.ctypes.data), "column_etree_by_columns")
    return parent


def postorder(lib, parent) -> np.ndarray:
    """:func:`.etree.postorder` without weights, in C."""
    parent = _i64(parent)
    post = np.empty(len(parent), dtype=np.int64)
    _check(lib.sgs_postorder(len(parent), parent.ctypes.data, post.ctypes.data), "postorder")
    return post


def column_counts(lib, indptr, indices, parent, leftmost) -> np.ndarray:
    """:func:`.etree.column_counts` in C."""
    indptr, indices, parent, leftmost = _i64(indptr), _i64(indices), _i64(parent), \
        _i64(leftmost)
    counts = np.empty(len(parent), dtype=np.int64)
    _check(lib.sgs_column_counts(len(indptr) - 1, len(parent), indptr.ctypes.data,
                                 indices.ctypes.data, parent.ctypes.data, leftmost.ctypes.data,
                                 counts.ctypes.data), "column_counts")
    return counts


def front_columns(lib, front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na,
                  rjmap_ptr, n: int, n_entries: int) -> tuple:
    """:func:`.fronts.build_fronts`' level loop in C: ``(cols, rjmap, ent_col, fm,
    cm)``, or ``(front, count)`` of the first front whose column list disagrees
    with the column counts (then the other arrays are None)."""
    front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na, rjmap_ptr = (
        _i64(x) for x in (front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na,
                          rjmap_ptr))
    nf = len(front_ptr) - 1
    cols = np.empty(int(col_ptr[-1]), dtype=np.int64)
    rjmap = np.empty(int(rjmap_ptr[-1]), dtype=np.int64)
    ent_col = np.empty(int(n_entries), dtype=np.int64)
    fm = np.zeros(nf, dtype=np.int64)
    cm = np.zeros(nf, dtype=np.int64)
    bad = np.zeros(2, dtype=np.int64)
    rc = lib.sgs_front_columns(nf, n, *(x.ctypes.data for x in (
        front_ptr, fn, col_ptr, s_ptr, s_indices, child_ptr, children, na, rjmap_ptr, cols,
        rjmap, ent_col, fm, cm, bad)))
    if rc == 2:
        return None, (int(bad[0]), int(bad[1]))
    _check(rc, "front_columns")
    return (cols, rjmap, ent_col, fm, cm), None


def relaxed_amalgamation(lib, sparent, nscol, snz, nrelax, zrelax) -> np.ndarray:
    """:func:`.fronts.relaxed_amalgamation`'s loop in C: the supernodes that stay
    group heads (bool array)."""
    ns_total = len(sparent)
    sparent = _i64(sparent)
    nscol, snz = np.array(nscol, dtype=np.int64), np.array(snz, dtype=np.int64)
    zeros = np.zeros(ns_total, dtype=np.int64)
    nr = np.array([int(v) for v in nrelax], dtype=np.int64)
    zr = np.array([float(v) for v in zrelax], dtype=np.float64)
    keep = np.empty(ns_total, dtype=np.int8)
    lib.sgs_relaxed_amalgamation(ns_total, *(x.ctypes.data for x in (
        sparent, nscol, snz, zeros, nr, zr, keep)))
    return keep.view(bool)


def front_rows(lib, front_ptr, fn, col_ptr, arow_ptr, leftmost, s_indptr, ent_col, child_ptr,
               children, cm, rjmap_ptr, rjmap, rimap_ptr) -> tuple:
    """The rows of :func:`.fronts.build_fronts` in C: ``(stair, arow_local, rimap,
    s_index)`` (``leftmost`` and ``s_indptr`` of S's non-empty rows, in order)."""
    args = [_i64(x) for x in (front_ptr, fn, col_ptr, arow_ptr, leftmost, s_indptr, ent_col,
                               child_ptr, children, cm, rjmap_ptr, rjmap, rimap_ptr)]
    nf = len(args[0]) - 1
    stair = np.empty(int(args[2][-1]), dtype=np.int64)
    arow_local = np.empty(int(args[3][-1]), dtype=np.int64)
    rimap = np.empty(int(args[12][-1]), dtype=np.int64)
    s_index = np.empty(len(args[6]), dtype=np.int64)
    _check(lib.sgs_front_rows(nf, *(x.ctypes.data for x in args + [stair, arow_local, rimap,
                                                                      s_index])), "front_rows")
    return stair, arow_local, rimap, s_index


def front_work(lib, col_ptr, fm, fn, stair) -> tuple:
    """:func:`.counts.front_work`'s ``(flops, nnz_H)`` in C (float64, int64)."""
    col_ptr, fm, fn, stair = (_i64(x) for x in (col_ptr, fm, fn, stair))
    nf = len(fm)
    flops = np.empty(nf, dtype=np.float64)
    nnz_h = np.empty(nf, dtype=np.int64)
    lib.sgs_front_work(nf, *(x.ctypes.data for x in (col_ptr, fm, fn, stair, flops, nnz_h)))
    return flops, nnz_h


def sorted_rows(lib, m: int, a_indptr, a_indices, perm, rowmap, m2: int) -> tuple:
    """:func:`.rows.sorted_rows` in C for an m-row A: ``(rowperm, indptr,
    indices, pos, leftmost)`` (``rowmap``: each row of A's row of B, increasing,
    -1 when left out; None: every row)."""
    a_indptr, a_indices, perm = _i64(a_indptr), _i64(a_indices), _i64(perm)
    rowmap = None if rowmap is None else _i64(rowmap)
    n2 = len(perm)
    nnz = int(a_indptr[-1])                # at most every entry of A
    out = [np.empty(int(m2), dtype=np.int64), np.empty(int(m2) + 1, dtype=np.int64),
           np.empty(nnz, dtype=np.int64), np.empty(nnz, dtype=np.int64),
           np.empty(int(m2), dtype=np.int64)]
    rc = lib.sgs_sorted_rows(int(m), int(m2), n2, a_indptr.ctypes.data, a_indices.ctypes.data,
                             perm.ctypes.data, None if rowmap is None else rowmap.ctypes.data,
                             *(x.ctypes.data for x in out))
    if rc == 2:
        raise ValueError("sorted_rows: rowmap does not give m2 rows")
    _check(rc, "sorted_rows")
    k = int(out[1][-1])
    return out[0], out[1], out[2][:k], out[3][:k], out[4]
