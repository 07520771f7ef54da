"""Rank detection after a factorization without it: Heath's rule applied to R.

The GPU engine's task lists have no rank detection (a dead column would
change the static schedule). Instead, ``backend='gpu'`` with a tolerance
factorizes without it on the GPU, ``A P₀ = Q₀ R₀``, and then applies
SuiteSparseQR's rule to R₀ on the same device: columns in order, a column
whose part below the rows already used has 2-norm ``<= tol`` is dead (that
part is dropped, it gets no row) — :func:`scipy_gpuqr._factor.dense_cod.heath_qr`,
blocked, ``Z R₀ = S``. The decisions depend only on the distance of each
column to the span of the earlier live columns, which the left factor Q₀
does not change, so the rank is SuiteSparseQR's for the same column order
and tolerance (up to rounding at the threshold). The result honours the
:class:`~scipy_gpuqr._numeric.NumericQR` contract like every backend: dead
columns move to the end of ``colperm``, ``R[:rank, :rank]`` is upper
triangular with a nonzero diagonal, and ``Q = Q₀ Zᵀ``.

R₀ must fit densely on the device (:func:`fits_dense`), or for the
``'simulate'`` backend on the host (:data:`HOST_REFINE_LIMIT`); otherwise the
engine's own fallback, the reference engine's rank detection, answers.
:func:`with_rank_detection` wraps a backend's factorize callable with this
rule, and :func:`factorizer` is :func:`~scipy_gpuqr._dispatch.plan.backend_factorizer`
so wrapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import _gpu
from .._dispatch.plan import absolute_tol, backend_factorizer
from .dense_cod import apply_blocks, dense_from_sparse, heath_qr
from .._numeric import NumericQR

__all__ = ["HeathRefinedQR", "heath_refine", "fits_dense", "with_rank_detection",
           "factorizer", "DEVICE_FRACTION", "HOST_REFINE_LIMIT", "REFINED_BACKENDS"]

#: Fraction of the free device memory the dense copy of R₀ may take.
DEVICE_FRACTION = 0.4

#: Largest min(m, n)·n for which the simulate backend refines R densely on the host.
HOST_REFINE_LIMIT = 14000 ** 2

#: Backends whose engines detect no rank in their task lists, and whether
#: Heath's rule then runs on the GPU.
REFINED_BACKENDS = {"gpu": True, "simulate": False}


def fits_dense(shape, xp) -> bool:
    """Whether a dense float64 copy of R₀ (and a second one) fits on ``xp``'s device."""
    need = 16 * int(shape[0]) * int(shape[1])
    if xp is np:
        return True
    free, _ = xp.cuda.runtime.memGetInfo()
    return need <= DEVICE_FRACTION * free


def _on(xp, B):
    """B on xp's device as float64 (a copy)."""
    if xp is np:
        return np.array(B.get() if hasattr(B, "get") else B, dtype=np.float64)
    return xp.array(B, dtype=xp.float64)


def _like(out, B):
    """``out`` back on B's side (NumPy in → NumPy out)."""
    if isinstance(B, np.ndarray) and hasattr(out, "get"):
        return out.get()
    return out


@dataclass
class HeathRefinedQR(NumericQR):
    """``A[:, colperm] = (Q₀ Zᵀ) R``: a factorization refined by Heath's rule on its R."""

    base: NumericQR = None
    _blocks: list = field(default_factory=list, repr=False)
    _xp: object = field(default=np, repr=False)

    def qt_matmul(self, B):
        C = self.base.qt_matmul(B)
        k = self.R.shape[0]
        X = _on(self._xp, C)
        X2 = X.reshape(X.shape[0], -1)
        apply_blocks(self._blocks, X2[:k])
        return _like(X2.reshape(X.shape), C)

    def q_matmul(self, Y):
        X = _on(self._xp, Y)
        X2 = X.reshape(X.shape[0], -1)
        apply_blocks(self._blocks, X2[:self.R.shape[0]], transpose=True)
        out = X2.reshape(X.shape)
        if isinstance(Y, np.ndarray) and hasattr(out, "get"):
            out = out.get()
        return self.base.q_matmul(out)

    def free(self) -> None:
        if self.base is not None:
            self.base.free()
        self._blocks = []


def heath_refine(num: NumericQR, tol: float, xp=np) -> HeathRefinedQR:
    """Rank detection with absolute tolerance ``tol`` on a factorization made without it.

    Parameters
    ----------
    num : NumericQR
        A factorization with ``tol=None`` (R₀ of shape (k, n)).
    tol : float
        SuiteSparseQR's dead-column threshold (absolute).
    xp : module
        NumPy or CuPy: where R₀ is densified and refined.

    Returns
    -------
    HeathRefinedQR
    """
    R0 = sp.csc_array(num.R)
    k, n = R0.shape
    G = dense_from_sparse(R0, xp)
    live, blocks, rank = heath_qr(G, float(tol), upper=True)
    order = np.concatenate([np.flatnonzero(live), np.flatnonzero(~live)])
    S = G[:rank][:, xp.asarray(order)] if rank else G[:0]
    S = S.get() if hasattr(S, "get") else S
    R = sp.csc_array(S, shape=(rank, n)) if rank else sp.csc_array((0, n))
    R = sp.csc_array(sp.vstack([R, sp.csc_array((k - rank, n))]), dtype=R0.dtype)
    R.eliminate_zeros()
    info = dict(num.info)
    info["rank_detection"] = ("Heath's rule on R after the factorization "
                              f"({'GPU' if xp is not np else 'host'}, dense, blocked)")
    return HeathRefinedQR(shape=num.shape, R=R, colperm=np.asarray(num.colperm)[order],
                          rank=int(rank), tol=float(tol), flops=num.flops, info=info,
                          base=num, _blocks=blocks, _xp=xp)


def with_rank_detection(factorize, backend: str):
    """``factorize`` of ``backend`` with a tolerance served by Heath's rule on its R.

    For the backends of :data:`REFINED_BACKENDS` a call with ``tol`` factorizes
    without rank detection and refines R (:func:`heath_refine`), on the GPU
    for the GPU engine; where R₀ cannot be densified there (or beyond
    :data:`HOST_REFINE_LIMIT` on the host) the engine's own fallback answers.
    Other backends detect rank themselves: their callable is returned as it is.

    Parameters
    ----------
    factorize : callable or None
        ``factorize(A, *, ordering, colperm, tol, analysis) -> NumericQR``.
    backend : str
        The backend that runs it.
    """
    if factorize is None or backend not in REFINED_BACKENDS:
        return factorize
    on_gpu = REFINED_BACKENDS[backend]
    plain = factorize

    def refined(A, *, ordering="colamd", colperm=None, tol=None, analysis=None):
        kw = dict(ordering=ordering, colperm=colperm, analysis=analysis)
        m, n = A.shape
        tol_abs = absolute_tol(tol, A)
        if tol_abs is None:
            return plain(A, tol=None, **kw)
        shape = (min(m, n), n)
        xp = np
        if on_gpu:
            if _gpu.gpu_available() and fits_dense(shape, _gpu.import_cupy()):
                xp = _gpu.import_cupy()
            else:
                return plain(A, tol=tol, **kw)
        elif shape[0] * shape[1] > HOST_REFINE_LIMIT:
            return plain(A, tol=tol, **kw)
        num = plain(A, tol=None, **kw)
        if num.info.get("backend") == "reference":      # the GPU engine fell back
            xp = np
        return heath_refine(num, tol_abs, xp)
    return refined


def factorizer(name: str):
    """:func:`~scipy_gpuqr._dispatch.plan.backend_factorizer` with every backend
    serving a tolerance (:func:`with_rank_detection`): ``(factorize, ran, note)``."""
    factorize, ran, note = backend_factorizer(name)
    return with_rank_detection(factorize, ran), ran, note
