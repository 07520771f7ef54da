"""Solves and σ_max of a square upper triangular R that is itself dense (host).

:class:`~scipy_gpuqr._factor.lstsq.MinNormSolver` decides a rank through
``C ↦ R⁻¹C``, ``C ↦ R⁻ᵀC`` (the randomized probe, the 1-norm and σ_min
estimates, the subspace decision of :mod:`scipy_gpuqr._factor.sparse_subspace`)
and σ_max by Lanczos. Where R stores more than
:data:`~scipy_gpuqr._factor.sparse_subspace.DENSE_SOLVES_DENSITY` of its
triangle (a QR of a dense A), SuperLU's sparse sweeps and CSR products spend
their time on indices: :class:`DenseUpper` keeps one dense copy of R (Fortran
order) and answers with BLAS triangular solves (``trsm``) and triangular
products (``trmv``, which read half of R where a sparse product reads values
and indices of all of it). The same copy serves every rule of one decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, eigsh

from .sparse_subspace import DENSE_SOLVES_DENSITY, one_blas_thread

__all__ = ["DenseUpper", "stored_densely"]


def stored_densely(R: sp.csc_array) -> bool:
    """Does square upper triangular R store more than :data:`DENSE_SOLVES_DENSITY`
    of its triangle's ``q(q+1)/2`` entries (its solves then go to BLAS)?"""
    k, q = R.shape
    return k == q and q > 0 and R.nnz > DENSE_SOLVES_DENSITY * q * (q + 1) / 2


@dataclass
class DenseUpper:
    """``C ↦ R⁻¹C``, ``C ↦ R⁻ᵀC`` and ``σ_max(R)`` from a dense copy of R.

    The interface of :class:`~scipy_gpuqr._factor.triangular.UpperTriangular`
    (``solve``, ``solves``, ``order``) on BLAS.

    Parameters
    ----------
    R : scipy.sparse array, shape (q, q)
        Upper triangular with a nonzero diagonal (the caller checks).

    Attributes
    ----------
    dense : ndarray, shape (q, q)
        R in Fortran order (entries below the diagonal are zero and never read).
    """

    R: sp.csc_array = field(repr=False)
    dense: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.dense = np.asfortranarray(self.R.toarray(), dtype=np.float64)

    @property
    def order(self) -> int:
        return self.dense.shape[0]

    def solve(self, C: np.ndarray, *, trans: bool = False) -> np.ndarray:
        """``R⁻¹C`` (``R⁻ᵀC`` when ``trans``); C of shape (q,) or (q, k)."""
        C = np.asarray(C, dtype=np.float64)
        if C.ndim == 1:
            C = C.reshape(-1, 1)
        if self.order == 0 or C.shape[1] == 0:
            return np.zeros((self.order, C.shape[1]))
        return la.solve_triangular(self.dense, C, trans=1 if trans else 0, lower=False,
                                   check_finite=False)

    def solves(self) -> tuple:
        """``(C ↦ R⁻¹C, C ↦ R⁻ᵀC)``."""
        return (lambda C: self.solve(C), lambda C: self.solve(C, trans=True))

    def sigma_max(self, rtol: float = 1e-12) -> float:
        """σ_max(R) by Lanczos on ``RᵀR`` to ``rtol``: the rule of
        :func:`~scipy_gpuqr._factor.subspace_cod.sigma_max_lanczos` (the constant
        start, a seeded random one where R annihilates it), each product two
        ``trmv`` on one BLAS thread (level-2 calls gain nothing from a second
        thread and lose much where a core is busy)."""
        Rd = self.dense
        q = self.order
        if q == 0 or not np.any(np.diagonal(Rd)) and not np.any(Rd):
            return 0.0
        if q <= 2:
            return float(np.linalg.norm(np.triu(Rd), 2))
        trmv = la.blas.dtrmv

        def gram(v):
            return trmv(Rd, trmv(Rd, np.ascontiguousarray(v.ravel())), trans=1)

        op = LinearOperator((q, q), dtype=np.float64, matvec=gram)
        with one_blas_thread():
            start = np.ones(q)
            if not np.any(trmv(Rd, start)):
                start = np.random.default_rng(q).standard_normal(q)
            lam = eigsh(op, k=1, which="LM", tol=rtol, v0=start,
                        return_eigenvectors=False)[0]
        return float(np.sqrt(max(lam, 0.0)))
