"""The exact answer of a tiny ``lsqr``/``lsmr`` problem, by LAPACK on a dense copy.

Under ``auto``, where SciPy's iterations did not converge, the exact answer is
the minimum 2-norm least-squares solution with ``numpy.linalg.lstsq``'s rank
rule (:mod:`scipy_gpuqr._factor.lstsq`). On a problem whose dense copy is tiny
the sparse QR's per-call steps (the plan, SuiteSparseQR's analysis and
factorization, the rank decision's objects, Q applied by Householder vectors
held sparse) cost more than the arithmetic: :func:`dense_answer` makes the
same answer with a few LAPACK calls on ``M`` (A, or ``[A; damp·I]`` with
damping) made dense.

The rules are the sparse QR's (:class:`~scipy_gpuqr._factor.lstsq.MinNormSolver`),
applied to the dense QR ``G = Q R`` of ``G = M`` (``M`` tall) or ``G = Mᵀ``
(``M`` wide), which has M's singular values:

* ``R`` is of full rank by lstsq's rule where its diagonal's smallest entry
  lies above ``cutoff·max|r_ii|`` and LAPACK's ``dtrcon`` gives
  ``rcond_1(R) >= 10·q·cutoff`` (``cutoff = eps·max`` of M's dimensions): then
  ``dx = R⁻¹ Qᵀ r`` (tall) or ``Q R⁻ᵀ r`` (wide), and ``σ_min`` is estimated
  as ``rcond·‖R‖₁``, as the sparse path's first rule estimates it;
* otherwise the SVD of ``R`` decides (singular values ``<= cutoff·σ_max``
  count as zero, lstsq's rule itself) and gives the pseudo-inverse solution
  and the exact σ_min of the kept part.

The residual norms, ``acond`` and ``var`` have the meaning they have in the
sparse QR's answer (:func:`~scipy_gpuqr._factor.least_squares.solve_least_squares`):
``var`` is ``diag(pinv(MᵀM))`` exactly, from R (tall M) or from a dense
pseudo-inverse of M (wide M, as the sparse path computes it). The answer's
``who`` says that this route answered.

:func:`dense_answer_fits` gates it: ``auto`` only (explicit backends keep the
factorization), host data, no plan made by the iterations' rule, and a dense
QR of at most :data:`DENSE_ANSWER_MAX_FLOPS` flops. The dense work runs with
the process' OpenBLAS limited to one thread (a few hundred columns; see
:mod:`scipy_gpuqr._cpu.blas_threads`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from scipy.linalg import lapack

from .._cpu.blas_threads import process_limited
from .least_squares import LeastSquaresProblem, LstsqAnswer, LstsqStart, damped_norms
from .lstsq import lstsq_cutoff

__all__ = ["DENSE_ANSWER_MAX_FLOPS", "dense_qr_flops", "dense_qr_small", "dense_answer_fits",
           "dense_answer"]

_EPS = float(np.finfo(np.float64).eps)

#: Largest dense QR (``2 q² (p − q/3)`` flops, ``p ≥ q`` M's dimensions) answered
#: densely: up to here LAPACK's QR of the dense copy takes less than the sparse
#: QR's per-call steps (a 120 × 250 M: 6e6 flops).
DENSE_ANSWER_MAX_FLOPS = 1.0e7


def dense_qr_flops(shape, damp: float) -> float:
    """Flops of the dense QR of M (A, or ``[A; damp·I]`` where ``damp`` is nonzero)."""
    m, n = (int(d) for d in shape)
    if damp != 0:
        m += n
    p, q = max(m, n), min(m, n)
    return 2.0 * q * q * (p - q / 3.0)


def dense_answer_fits(problem: LeastSquaresProblem, settings, planned=None) -> bool:
    """Whether :func:`dense_answer` answers ``problem``: backend ``'auto'``, host data,
    no plan made by the iterations' rule (``planned``), and a dense QR of at most
    :data:`DENSE_ANSWER_MAX_FLOPS` flops."""
    if settings.backend != "auto" or planned is not None or problem.on_gpu:
        return False
    if problem.b_on_device or min(problem.shape) == 0:
        return False
    return dense_qr_small(problem.shape, problem.damp)


def dense_qr_small(shape, damp: float = 0.0) -> bool:
    """Whether the dense QR of M (:func:`dense_qr_flops`) is within
    :data:`DENSE_ANSWER_MAX_FLOPS`: the size gate of :func:`dense_answer_fits`."""
    return dense_qr_flops(shape, damp) <= DENSE_ANSWER_MAX_FLOPS


def dense_answer(problem: LeastSquaresProblem, begin: LstsqStart, *,
                 calc_var: bool) -> LstsqAnswer:
    """The minimum-norm least-squares answer of a non-trivial host problem, densely.

    Parameters
    ----------
    problem : LeastSquaresProblem
        On the host (:func:`dense_answer_fits`).
    begin : LstsqStart
        :func:`~scipy_gpuqr._factor.least_squares.start` of the problem; not ``trivial``.
    calc_var : bool
        Compute ``diag(pinv(AᵀA + damp²I))`` exactly.

    Returns
    -------
    LstsqAnswer
        ``factorization`` None, ``who`` naming this route and the rank kept.
    """
    A = problem.matrix().A
    m, n = problem.shape
    damp = problem.damp
    r0 = np.asarray(begin.r0, dtype=np.float64)
    M = A.toarray()
    if damp != 0:
        M = np.vstack([M, damp * np.eye(n)])
        rhs = np.concatenate([r0, np.zeros(n)])
    else:
        rhs = r0
    mm = M.shape[0]
    cutoff = lstsq_cutoff(mm, n)
    with process_limited(1):
        dx, rank, smin, how, var = _solve(M, rhs, cutoff, calc_var)
    norms = damped_norms(A, r0, dx, damp)
    if rank == 0:
        acond = 0.0
    else:
        acond = norms.anorm / smin if smin > 0 else np.inf
    x0 = problem.host_x0()
    x = dx.copy() if x0 is None else x0 + dx
    if var is None:
        var = np.zeros(n)
    who = f"dense QR on CPU (LAPACK, {how}, rank {rank} of {min(mm, n)})"
    return LstsqAnswer(x, dx, norms.r1norm, norms.r2norm, norms.anorm, acond, norms.arnorm,
                       begin.bnorm, var, None, who=who)


def _solve(M: np.ndarray, rhs: np.ndarray, cutoff: float, calc_var: bool):
    """``(dx, rank, σ_min estimate, rule, var or None)`` of ``min ‖rhs − M dx‖`` with
    lstsq's rule (see the module)."""
    mm, n = M.shape
    tall = mm >= n
    G = np.asfortranarray(M if tall else M.T)
    qr, tau, _, info = lapack.dgeqrf(G, overwrite_a=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK dgeqrf failed (info {info})")
    q = min(G.shape)
    R = np.triu(qr[:q, :q])
    d = np.abs(np.diagonal(R))
    rcond = 0.0
    if np.isfinite(d).all() and d.min() > 0 and d.min() > cutoff * d.max():
        rcond, info = lapack.dtrcon(R, norm="1", uplo="U", diag="N")
        rcond = float(rcond) if info == 0 else 0.0
    if rcond >= 10.0 * q * cutoff:
        smin = rcond * float(np.abs(R).sum(axis=0).max())
        if tall:
            c = _apply_q(qr, tau, rhs, trans="T")[:q]
            dx, _ = lapack.dtrtrs(R, c)
            var = None
            if calc_var:
                Rinv, _ = lapack.dtrtri(R)
                var = (Rinv ** 2).sum(axis=1)          # diag(R⁻¹R⁻ᵀ) = diag((RᵀR)⁻¹)
        else:
            y, _ = lapack.dtrtrs(R, rhs, trans=1)
            dx = _apply_q(qr, tau, np.concatenate([y, np.zeros(n - q)]), trans="N")
            var = _wide_variance(M) if calc_var else None
        return np.ascontiguousarray(dx), q, smin, "R of full rank", var
    U, s, Vt = np.linalg.svd(R)
    rank = int(np.count_nonzero(s > cutoff * s[0])) if s.size and s[0] > 0 else 0
    if tall:
        c = _apply_q(qr, tau, rhs, trans="T")[:q]
        dx = Vt[:rank].T @ ((U[:, :rank].T @ c) / s[:rank])
        var = ((Vt[:rank] / s[:rank, None]) ** 2).sum(axis=0) if calc_var else None
    else:
        y = U[:, :rank] @ ((Vt[:rank] @ rhs) / s[:rank])
        dx = _apply_q(qr, tau, np.concatenate([y, np.zeros(n - q)]), trans="N")
        var = _wide_variance(M) if calc_var else None
    smin = float(s[rank - 1]) if rank else 0.0
    return np.ascontiguousarray(dx), rank, smin, "SVD of R", var


def _apply_q(qr: np.ndarray, tau: np.ndarray, v: np.ndarray, *, trans: str) -> np.ndarray:
    """``Qᵀ v`` (``trans='T'``) or ``Q v`` (``'N'``) of dgeqrf's Householder vectors."""
    c = np.array(v, dtype=np.float64, order="F").reshape(-1, 1)     # overwritten
    out, _, info = lapack.dormqr("L", trans, qr, tau, c, lwork=max(1, 64 * c.shape[1]),
                                 overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK dormqr failed (info {info})")
    return out[:, 0]


def _wide_variance(M: np.ndarray) -> Optional[np.ndarray]:
    """``diag(pinv(MᵀM))`` of a wide M: squared row norms of its pseudo-inverse, with
    lstsq's cutoff (as the sparse path computes it)."""
    P = np.linalg.pinv(M, rcond=_EPS * max(M.shape))
    return (P ** 2).sum(axis=1)
