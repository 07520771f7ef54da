"""The contract between factorization backends and the solvers above them.

Every backend (SuiteSparseQR through cffi, our reference multifrontal QR,
the simulated task lists, the GPU engine) returns a :class:`NumericQR`:

    A[:, colperm] = Q @ R

with Q an m×m orthogonal matrix applied through ``qt_matmul``/``q_matmul``
(Householder vectors kept by the backend) and R sparse upper trapezoidal.
Rank handling, least-squares and minimum-norm solutions are built once on top
of this contract (``scipy_gpuqr._factor.factorization``), so they behave the same on every
backend.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

__all__ = ["NumericQR"]


@dataclass
class NumericQR(abc.ABC):
    """A numeric sparse QR factorization ``A[:, colperm] = Q @ R``.

    Attributes
    ----------
    shape : tuple of int
        (m, n) of the factorized matrix.
    R : scipy.sparse.csc_array, shape (k, n)
        Upper trapezoidal factor, columns in ``colperm`` order. ``k`` is
        ``min(m, n)`` without rank detection; with rank detection the first
        ``rank`` rows are the well-determined part and ``R[:rank, :rank]`` is
        upper triangular with a nonzero diagonal.
    colperm : ndarray of int64, shape (n,)
        Column permutation (``A[:, colperm] = Q @ R``).
    rank : int
        Numerical rank under the tolerance used (``min(m, n)`` when rank
        detection was off).
    tol : float or None
        Tolerance used for rank detection (None: off).
    flops : float
        Floating-point operations of the factorization (as counted by the
        backend; NaN when unknown).
    info : dict
        Backend-specific facts (name, timings, memory), JSON-serializable.
    """

    shape: tuple
    R: sp.csc_array
    colperm: np.ndarray
    rank: int
    tol: float | None = None
    flops: float = float("nan")
    info: dict = field(default_factory=dict)

    @abc.abstractmethod
    def qt_matmul(self, B: np.ndarray) -> np.ndarray:
        """Return ``Q.T @ B`` for B of shape (m,) or (m, k)."""

    @abc.abstractmethod
    def q_matmul(self, Y: np.ndarray) -> np.ndarray:
        """Return ``Q @ Y`` for Y of shape (m,) or (m, k)."""

    def free(self) -> None:
        """Release backend resources (device memory, C objects); idempotent."""
