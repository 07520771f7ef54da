"""Sparse triangular solves with many right-hand sides in compiled code (``_native.c``).

The host's rank decisions (:mod:`scipy_gpuqr._factor.sparse_subspace` at
every step of its iteration; the probe and the null-space COD of
:class:`~scipy_gpuqr._factor.lstsq.MinNormSolver`) solve with a sparse upper
triangular R and with Rᵀ on blocks of many columns. SuperLU's sweeps (:class:`~scipy_gpuqr._factor.
triangular.UpperTriangular`) run column by column of the block; here the
block is row-major, so each entry of R updates a contiguous row of the block
and R is read once per block (:class:`SparseUpperSolves`). R⁻ᵀ is had from
R's own CSC arrays (a forward sweep that gathers), without a transposed copy
or a second set-up. The sums run in another order than SuperLU's: the
answers agree to rounding, not bit for bit.

The library is plain C99 without Python headers, built on the first use in a
process that finds no built library (never at import) into ``native/`` of the
package cache folder as ``factor-{key}.so``, checked against its manifest
before it is loaded, by :mod:`scipy_gpuqr._native_build` (which says when,
where and how); the calls release the GIL, so the column pieces of a block
run side by side on the decision's threads.

``$SCIPY_GPUQR_FACTOR_NATIVE`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it is at hand; while it is being built, on a worker
thread started by the first decision of a process that finds none, SuperLU
answers), ``c`` (wait for the build; :class:`NativeUnavailable` when it cannot
be had), ``numpy`` (SuperLU).
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
import scipy.sparse as sp

from .. import _native_build
from .._errors import NativeUnavailable

__all__ = ["ENV", "ABI", "MODES", "NativeUnavailable", "mode", "library", "handle", "status",
           "at_hand", "SparseUpperSolves"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_FACTOR_NATIVE"
MODES = _native_build.MODES
#: Interface version of ``_native.c`` (``sgf_abi()``).
ABI = 1
#: The rows' axpy loops vectorized (``-O2`` alone leaves loops of unknown
#: length scalar); no contraction into fused multiply-adds, so every machine
#: rounds alike.
EXTRA_FLAGS = ("-ftree-vectorize", "-fvect-cost-model=dynamic", "-ffp-contract=off")


def _declare(lib: ctypes.CDLL) -> None:
    """Type the library's functions."""
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.sgf_upper_solve.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, i64, i64, i32]
    lib.sgf_upper_solve.restype = None


#: The library: ``_native.c`` beside this module, built as ``factor-{key}.so``.
_SPEC = _native_build.NativeLibrary.beside(__file__, "factor-", ABI, "sgf_abi", ENV, _declare,
                                           EXTRA_FLAGS)
#: This process' library (:class:`~scipy_gpuqr._native_build.NativePart`).
_NATIVE = _native_build.NativePart(_SPEC, "compiled sparse triangular solves")
mode, library, handle, status = _NATIVE.mode, _NATIVE.library, _NATIVE.handle, _NATIVE.status


def at_hand() -> bool:
    """Whether the compiled sweeps answer a call made now (:func:`handle` gives the
    library; in mode ``auto`` its build is started here where none is found): the
    host's rank rules that read them (σ_min of a sparse triangle, the probe, the
    subspace iteration) then cost what they cost with them, not SuperLU's or dense
    work's time."""
    try:
        return handle() is not None
    except NativeUnavailable:
        return False


class SparseUpperSolves:
    """``C ↦ R⁻¹C`` and ``C ↦ R⁻ᵀC`` for a sparse upper triangular R, compiled.

    Parameters
    ----------
    lib : ctypes.CDLL
        The library (:func:`handle`).
    R : scipy.sparse array or matrix, shape (q, q)
        Upper triangular with a nonzero diagonal (the caller checks); entries
        below the diagonal are not read. Its CSC arrays are kept (int64
        indices), not R itself.
    """

    def __init__(self, lib, R):
        R = sp.csc_array(R)
        self._lib = lib
        self.q = int(R.shape[0])
        self._indptr = np.ascontiguousarray(R.indptr, dtype=np.int64)
        self._indices = np.ascontiguousarray(R.indices, dtype=np.int64)
        self._data = np.ascontiguousarray(R.data, dtype=np.float64)
        self._diag = np.ascontiguousarray(R.diagonal(), dtype=np.float64)
        # the kept arrays' addresses, read once (``ndarray.ctypes`` builds an object on
        # every read: most of a call's fixed cost on the Lanczos runs' one-column solves)
        self._addresses = tuple(a.ctypes.data for a in (self._indptr, self._indices,
                                                         self._data, self._diag))

    def _solve(self, C: np.ndarray, trans: bool, order: Optional[int] = None) -> np.ndarray:
        q = self.q if order is None else int(order)
        C = np.asarray(C, dtype=np.float64)
        vector = C.ndim == 1
        X = np.array(C.reshape(-1, 1) if vector else C, dtype=np.float64, order="C", copy=True)
        if X.shape[0] != q:
            raise ValueError(f"{X.shape[0]} rows for an order-{q} triangle")
        if q and X.shape[1]:
            # R's leading q × q triangle is its first q columns (their rows lie above q):
            # the same arrays, read up to column q
            k = X.shape[1]
            self._lib.sgf_upper_solve(q, *self._addresses, X.ctypes.data, k, k,
                                      1 if trans else 0)
        return X.ravel() if vector else X

    def solve(self, C: np.ndarray) -> np.ndarray:
        """``R⁻¹C``; C of shape (q,) or (q, k), a new array (row-major)."""
        return self._solve(C, False)

    def solve_leading(self, C: np.ndarray, order: int) -> np.ndarray:
        """``R₁⁻¹C`` with R₁ R's leading ``order × order`` triangle; C of shape
        (order,) or (order, k), a new array (row-major)."""
        if not 0 <= order <= self.q:
            raise ValueError(f"a leading triangle of order {order} of an order-{self.q} one")
        return self._solve(C, False, order)

    def solve_t(self, C: np.ndarray) -> np.ndarray:
        """``R⁻ᵀC``; C of shape (q,) or (q, k), a new array (row-major)."""
        return self._solve(C, True)
