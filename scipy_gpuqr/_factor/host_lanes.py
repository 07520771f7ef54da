"""Tall-block BLAS and triangular solves split over a few host threads.

Used by the host's subspace rank decisions
(:mod:`scipy_gpuqr._factor.subspace_cod`,
:mod:`scipy_gpuqr._factor.sparse_subspace`), whose time goes to q × p blocks
(q ≫ p): Gram matrices ``YᵀY``, products ``Y W`` and ``Bᵀ C``, right
triangular solves ``Y U⁻¹`` and the sparse solves with R, column piece by
column piece. Those decisions run BLAS on one thread (OpenBLAS threads that
wait for a busy core make the many small calls of an iteration far slower on
a shared host); here the tall operands are cut into row pieces (column
pieces for the sparse solves) that a few Python threads hand to that
single-threaded BLAS (or to SuperLU's sweeps) at once. Both release the GIL,
so the pieces run side by side where cores are free and one after the other
where they are not: a busy core slows a lane down, it never spins.

A :class:`Lanes` with one lane (the default where no BLAS thread limit is
in force, see :func:`host_lanes`) runs every operation as one call, as
before.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np
import scipy.linalg as la

from .._schedule.native import usable_cpus

__all__ = ["Lanes", "SERIAL", "host_lanes", "MAX_LANES", "MIN_ROWS_PER_LANE",
           "MIN_COLUMNS_PER_PIECE", "PIECE_BYTES"]

#: Most threads a decision uses (each one runs single-threaded BLAS).
MAX_LANES = 4

#: Fewest rows of a tall operand per piece: below, fewer pieces (a thread's
#: hand-over costs tens of microseconds).
MIN_ROWS_PER_LANE = 1024

#: Fewest columns of a piece where the lanes' own split sizes the pieces
#: (:meth:`Lanes.columns` without ``chunk``: the compiled sweeps): a sweep reads
#: all of R's entries for any number of columns, and one column costs about a
#: quarter of sixteen (a probe's block of eight would go out in eight pieces).
MIN_COLUMNS_PER_PIECE = 16

#: Bytes of a piece (rows × columns × 8) up to which it is widened beyond that:
#: a sweep's cost per column falls with the width while the piece stays in a
#: core's cache (short blocks of a few thousand rows), and rises beyond.
PIECE_BYTES = 384 * 1024

#: Pieces per lane: the threads take them from one queue, so a lane whose core
#: is busy with another process takes fewer (with one piece per lane the
#: operation waits for the slowest).
PIECES_PER_LANE = 4


class Lanes:
    """Row-split BLAS on ``n`` threads (one: plain calls).

    Parameters
    ----------
    pool : ThreadPoolExecutor or None
        Worker threads; None runs every operation as one call.
    n : int
        Number of pieces an operand is cut into (1 without a pool).
    """

    def __init__(self, pool: Optional[ThreadPoolExecutor] = None, n: int = 1):
        self.pool = pool
        self.n = n if pool is not None else 1

    def _bounds(self, rows: int, min_rows: int = MIN_ROWS_PER_LANE) -> list:
        if self.n == 1:
            return [(0, rows)]
        k = max(1, min(self.n * PIECES_PER_LANE, rows // max(1, min_rows)))
        edges = np.linspace(0, rows, k + 1).astype(int)
        return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]

    def map(self, fn: Callable, items: list) -> list:
        """``[fn(x) for x in items]``, on the threads where there are several."""
        if self.pool is None or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.pool.map(fn, items))

    def gemm(self, A: np.ndarray, B: np.ndarray, trans_a: bool = False) -> np.ndarray:
        """``A B`` (tall A, rows split) or ``Aᵀ B`` (tall A and B, sum over row pieces);
        Fortran order out. NumPy's ``matmul`` takes the pieces of Fortran-ordered
        operands as they lie (SciPy's wrappers would copy each one)."""
        A = np.asfortranarray(A)
        B = np.asfortranarray(B)
        parts = self._bounds(A.shape[0])
        if trans_a:
            pieces = self.map(lambda ab: A[ab[0]:ab[1]].T @ B[ab[0]:ab[1]], parts)
            return np.asfortranarray(sum(pieces[1:], pieces[0]))
        out = np.empty((A.shape[0], B.shape[1]), order="F")
        self.map(lambda ab: np.matmul(A[ab[0]:ab[1]], B, out=out[ab[0]:ab[1]]), parts)
        return out

    def gram(self, Y: np.ndarray) -> np.ndarray:
        """``YᵀY`` (symmetric; NumPy's ``matmul`` runs ``syrk`` on ``Y[a:b].T @ Y[a:b]``)."""
        Y = np.asfortranarray(Y)
        parts = self._bounds(Y.shape[0])
        pieces = self.map(lambda ab: Y[ab[0]:ab[1]].T @ Y[ab[0]:ab[1]], parts)
        return np.asfortranarray(sum(pieces[1:], pieces[0]))

    def solve_right_upper(self, U: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """``Y U⁻¹`` for upper triangular U (rows of Y split)."""
        Y = np.asfortranarray(Y)
        U = np.asfortranarray(U)
        parts = self._bounds(Y.shape[0])
        if len(parts) == 1:
            return la.blas.dtrsm(1.0, U, Y, side=1, lower=0)
        out = np.empty(Y.shape, order="F")

        def piece(ab):
            out[ab[0]:ab[1]] = la.blas.dtrsm(1.0, U, Y[ab[0]:ab[1]], side=1, lower=0)
        self.map(piece, parts)
        return out

    def columns(self, solve: Callable, chunk: Optional[int] = None) -> Callable:
        """``C ↦ solve(C)`` applied to column pieces of at most ``chunk`` columns
        (None: :data:`PIECES_PER_LANE` pieces per lane of at least
        :data:`MIN_COLUMNS_PER_PIECE` columns and, for short blocks, up to
        :data:`PIECE_BYTES`), the pieces shared among the threads (solves
        that release the GIL: SuperLU's sweeps, BLAS)."""
        def run(C):
            C = np.asarray(C, dtype=np.float64)
            width = (chunk if chunk is not None
                     else max(MIN_COLUMNS_PER_PIECE, PIECE_BYTES // (8 * max(1, C.shape[0])),
                              -(-C.shape[-1] // (self.n * (PIECES_PER_LANE
                                                           if self.n > 1 else 1)))))
            if C.ndim == 1 or C.shape[1] <= width:
                return np.asarray(solve(C))
            out = np.empty(C.shape, order="F")

            def piece(j):
                out[:, j:j + width] = np.asarray(solve(np.asfortranarray(C[:, j:j + width])))
            self.map(piece, list(range(0, C.shape[1], width)))
            return out
        return run


#: One lane: every operation a single call.
SERIAL = Lanes()


@contextlib.contextmanager
def host_lanes(limited: bool, lanes: Optional[int] = None):
    """A :class:`Lanes` on up to :data:`MAX_LANES` threads (one per core), for the
    block's length; one lane where ``limited`` is False (BLAS not held to one
    thread: its own threads split the work) or one core is all there is."""
    n = min(MAX_LANES, usable_cpus()) if lanes is None else lanes
    if not limited or n <= 1:
        yield SERIAL
        return
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="gpuqr-lane") as pool:
        yield Lanes(pool, n)
