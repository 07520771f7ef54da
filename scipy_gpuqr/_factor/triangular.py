"""Sparse upper triangular solves on the host, and σ_min of a triangular factor.

SciPy's :func:`~scipy.sparse.linalg.spsolve_triangular` repeats its setup on
every call, and a rank decision makes tens of such calls (Lanczos, condition
estimates). :class:`UpperTriangular` factors R once with SuperLU in its
natural order with diagonal pivots — for a triangular matrix that is
``L = I``, ``U = R``, no fill — and then every solve is SuperLU's compiled
triangular sweep, an order of magnitude faster. A small triangle (order up
to :data:`DENSE_SOLVE_LIMIT`, or a larger one up to :data:`DENSE_SIGMA_LIMIT`
that fills half its triangle, :data:`DENSE_SOLVE_FILL`) is made dense instead
and solved by LAPACK's ``trtrs``: SuperLU's set-up (its symbolic pass and
work arrays) and sweeps cost more there than the dense solves.

:func:`sigma_min_upper` answers "is σ_min(T) above a threshold?" for the
rank rules of :mod:`scipy_gpuqr._factor.lstsq`: a guaranteed lower bound
``1/‖T⁻¹‖_F`` first (T up to :data:`DENSE_SIGMA_LIMIT`; a sparse one's T⁻¹ by the
compiled sparse solves with the identity, a dense one's by ``trtri``), then (a
dense T on a GPU) a certificate from a few GEMMs with T⁻¹, then Lanczos on
``(TᵀT)⁻¹`` (a sparse T's through the compiled sweeps).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.sparse.linalg import (ArpackError, ArpackNoConvergence, LinearOperator,
                                 eigsh, splu, spsolve_triangular)

from .._engine.gpu import array_ops
from .native import SparseUpperSolves
from .native import at_hand as native_at_hand
from .native import handle as native_handle

#: LAPACK's float64 triangular solve, as ``scipy.linalg.solve_triangular`` reaches it.
_dtrtrs = la.lapack.dtrtrs

__all__ = ["UpperTriangular", "sigma_min_upper", "SigmaMin", "DENSE_SIGMA_LIMIT",
           "DENSE_SOLVE_LIMIT", "norm2_lanczos", "compiled_sigma_applies",
           "compiled_sigma_seconds", "COMPILED_SIGMA_MAX_FILL"]

#: Most entries of T handed to SuperLU: it sizes its work arrays from the
#: entries with 32-bit counts and a fill guess, and runs out of memory on
#: larger factors. Beyond, SciPy's spsolve_triangular answers.
SUPERLU_MAX_NNZ = 30_000_000

#: Largest order of T solved densely (LAPACK's ``trtrs`` on T made dense: q² doubles,
#: q²·k flops per solve with k columns) instead of through SuperLU.
DENSE_SOLVE_LIMIT = 300
#: A larger T, up to :data:`DENSE_SIGMA_LIMIT`, is solved densely as well where it
#: fills at least this share of q² (half its triangle): SuperLU's set-up and sweeps
#: then cost several times the dense copy and BLAS's solves.
DENSE_SOLVE_FILL = 0.25

#: Largest order of T whose σ_min is decided densely (its inverse by a
#: triangular solve with the identity: q³/3 flops, q² doubles).
DENSE_SIGMA_LIMIT = 2500


def _as_2d(C: np.ndarray) -> np.ndarray:
    return C.reshape(C.shape[0], 1) if C.ndim == 1 else C


@dataclass
class UpperTriangular:
    """``C ↦ T⁻¹C`` and ``C ↦ T⁻ᵀC`` for a square sparse upper triangular T.

    Parameters
    ----------
    T : scipy.sparse array or matrix, shape (q, q)
        Upper triangular with a nonzero diagonal (the caller checks).
    dense : ndarray, optional
        ``T.toarray(order="F")`` where the caller made it already (the dense
        triangle below then takes it, not kept otherwise).

    Notes
    -----
    SuperLU in the natural order with ``diag_pivot_thresh=0`` keeps the
    diagonal pivots, so its factors are ``L = I`` and ``U = T`` (no fill);
    should SuperLU refuse (it reports exact singularity on a zero pivot, or
    runs out of memory) or T exceed :data:`SUPERLU_MAX_NNZ` entries, SciPy's
    ``spsolve_triangular`` answers instead. A float64 T of order up to
    :data:`DENSE_SOLVE_LIMIT` (or up to :data:`DENSE_SIGMA_LIMIT` filling
    :data:`DENSE_SOLVE_FILL` of q²) whose pattern is upper or lower triangular and
    whose diagonal is finite and nonzero is solved densely
    (:class:`_DenseTriangle`; SuperLU is not set up).
    """

    T: sp.csc_array
    dense: Optional[np.ndarray] = field(default=None, repr=False)
    _lu: object = field(init=False, default=None, repr=False)
    _dense: object = field(init=False, default=None, repr=False)

    def __post_init__(self):
        if type(self.T) is not sp.csc_array:
            self.T = sp.csc_array(self.T)
        q = self.T.shape[0]
        if q == 0 or self.T.nnz > SUPERLU_MAX_NNZ:
            return
        if q <= DENSE_SOLVE_LIMIT or (q <= DENSE_SIGMA_LIMIT
                                      and self.T.nnz >= DENSE_SOLVE_FILL * q * q):
            self._dense = _DenseTriangle.of(self.T, self.dense)
            self.dense = None
            if self._dense is not None:
                return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", sp.SparseEfficiencyWarning)
                self._lu = splu(sp.csc_matrix(self.T), permc_spec="NATURAL",
                                diag_pivot_thresh=0.0,
                                options={"SymmetricMode": True})
        except (RuntimeError, MemoryError):
            self._lu = None
        if self._lu is not None and not (np.array_equal(self._lu.perm_r, np.arange(q))
                                         and np.array_equal(self._lu.perm_c, np.arange(q))):
            self._lu = None

    @property
    def order(self) -> int:
        return self.T.shape[0]

    def solve(self, C: np.ndarray, *, trans: bool = False) -> np.ndarray:
        """``T⁻¹C`` (``T⁻ᵀC`` when ``trans``); C of shape (q,) or (q, k), float64."""
        C = _as_2d(np.asarray(C, dtype=np.float64))
        if self.order == 0 or C.shape[1] == 0:
            return np.zeros((self.order, C.shape[1]))
        if self._dense is not None:
            return self._dense.solve(C, trans="T" if trans else "N")
        if self._lu is not None:
            return self._lu.solve(np.ascontiguousarray(C) if C.shape[1] == 1
                                  else np.asfortranarray(C), trans="T" if trans else "N")
        if trans:
            return spsolve_triangular(sp.csr_array(self.T.T), C, lower=True)
        return spsolve_triangular(sp.csr_array(self.T), C, lower=False)

    def solves(self) -> tuple:
        """``(C ↦ T⁻¹C, C ↦ T⁻ᵀC)``, the pair :mod:`scipy_gpuqr._factor.lstsq` passes around."""
        return (lambda C: self.solve(C), lambda C: self.solve(C, trans=True))


def _triangle_side(T: sp.csc_array, upper_only: bool = False) -> Optional[bool]:
    """Whether CSC T's pattern lies on or below its diagonal (True) or on or above it
    (False; an empty or diagonal pattern counts as upper); None where it lies on both
    sides, or, with ``upper_only``, where it is not on or above it."""
    indptr = T.indptr
    # the arrays' own methods: NumPy's function forms cost more than the tests here
    cols = np.arange(T.shape[1], dtype=T.indices.dtype).repeat(indptr[1:] - indptr[:-1])
    rows = T.indices
    if (rows <= cols).all():
        return False
    if not upper_only and (rows >= cols).all():
        return True
    return None


class _DenseTriangle:
    """A small triangle made dense, solved by LAPACK's ``trtrs``."""

    def __init__(self, Td: np.ndarray, lower: bool):
        self.Td, self.lower = Td, lower

    @classmethod
    def of(cls, T: sp.csc_array, dense: Optional[np.ndarray] = None):
        """The dense triangle of a float64 CSC T whose pattern lies on one side of the
        diagonal and whose diagonal is finite and nonzero; None otherwise. ``dense``:
        ``T.toarray(order="F")`` where the caller made it already."""
        if T.dtype != np.float64:
            return None
        lower = _triangle_side(T)
        if lower is None:
            return None
        Td = T.toarray(order="F") if dense is None else dense
        d = Td.diagonal()
        if not (np.isfinite(d).all() and (d != 0).all()):
            return None
        return cls(Td, lower)

    def solve(self, B: np.ndarray, trans: str = "N") -> np.ndarray:
        """``Td⁻¹B`` (``Td⁻ᵀB`` for ``trans='T'``): LAPACK's ``dtrtrs`` called as
        ``scipy.linalg.solve_triangular`` calls it for a Fortran-ordered float64
        triangle and a nonempty float64 B of one or two dimensions (its array
        checks and dispatch cost more than the solve on a small triangle); that
        function itself for any other B."""
        Td = self.Td
        code = 0 if trans == "N" else 1
        if (type(B) is not np.ndarray or B.dtype != np.float64 or B.ndim not in (1, 2)
                or B.size == 0 or B.shape[0] != Td.shape[0] or not Td.flags.f_contiguous):
            with np.errstate(all="ignore"):
                return la.solve_triangular(Td, B, trans=code, lower=self.lower,
                                           check_finite=False)
        with np.errstate(all="ignore"):
            x, info = _dtrtrs(Td, B, overwrite_b=False, lower=self.lower, trans=code,
                              unitdiag=False)
        if info > 0:
            raise la.LinAlgError(f"singular matrix: resolution failed at diagonal {info - 1}")
        if info < 0:
            raise ValueError(f"illegal value in {-info}-th argument of internal trtrs")
        return x


@dataclass(frozen=True)
class SigmaMin:
    """σ_min of a triangular T as found by :func:`sigma_min_upper`.

    Attributes
    ----------
    value : float
        The estimate (or the bound, when ``bound`` is True).
    bound : bool
        True when ``value`` is a guaranteed lower bound (``1/‖T⁻¹‖_F``),
        False for a Lanczos estimate (which, short of convergence, can lie
        above σ_min).
    """

    value: float
    bound: bool


def _module_of(a):
    """CuPy for a device array, else NumPy."""
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def _top_eigenvalue(matvec, q: int, tol: float, start: np.ndarray) -> Optional[float]:
    """The largest eigenvalue of the symmetric order-``q`` operator ``matvec`` by
    ARPACK's Lanczos (``eigsh``, ``which='LM'``) to ``tol`` from ``start``; None where
    ARPACK does not converge or fails."""
    op = LinearOperator((q, q), dtype=np.float64, matvec=matvec)
    try:
        return float(eigsh(op, k=1, which="LM", tol=tol, v0=start,
                           return_eigenvectors=False)[0])
    except (ArpackNoConvergence, ArpackError):
        return None


def norm2_lanczos(X, rtol: float = 1e-12) -> float:
    """‖X‖₂ of a dense X (NumPy or CuPy) by Lanczos on ``XᵀX`` to ``rtol``, from a
    random start (seeded: the same X gives the same answer).

    A Ritz value never exceeds the largest eigenvalue, so the result is at
    most ‖X‖₂; a random start (unlike a constant vector, which structured
    matrices can make orthogonal to the top singular vector) meets the top
    singular vector with probability one. A CuPy X stays on its device (one
    vector each way per product).
    """
    xp = _module_of(X)
    q = X.shape[1]
    if min(X.shape) <= 2:
        dense = X.get() if xp is not np else X
        return float(np.linalg.norm(dense, 2))
    start = np.random.default_rng(q).standard_normal(q)
    if xp is np:
        def matvec(v):
            return X.T @ (X @ v.ravel())
    else:
        def matvec(v):
            return (X.T @ (X @ xp.asarray(v.ravel()))).get()
    lam = _top_eigenvalue(matvec, q, rtol, start)
    if lam is None:
        return float(xp.linalg.norm(X))           # an upper bound of ‖X‖₂
    return float(np.sqrt(max(lam, 0.0)))


def _dense_inverse(Td):
    """T⁻¹ of dense upper triangular T (NumPy: LAPACK's ``trtri``, faster than a
    triangular solve with I and as accurate for ‖T⁻¹‖; not finite where T is
    singular. CuPy: cuBLAS trsm with I)."""
    q = Td.shape[0]
    if _module_of(Td) is np:
        trtri, = la.get_lapack_funcs(("trtri",), (Td,))
        with np.errstate(all="ignore"):
            X, info = trtri(np.asfortranarray(Td), lower=0)
        return X if info == 0 else np.full((q, q), np.inf)
    import cupy
    from cupyx.scipy.linalg import solve_triangular
    return solve_triangular(Td, cupy.eye(q), lower=False)


def _upper_in_place(X: np.ndarray) -> np.ndarray:
    """``np.triu(X)`` written into X itself (an array of our own, T⁻¹ from
    :func:`_dense_inverse`): a column (row, for C order) slice at a time, the
    same values without triu's mask and second q² array."""
    q = X.shape[0]
    if X.flags.f_contiguous:
        for j in range(q - 1):
            X[j + 1:, j] = 0.0
    else:
        for i in range(1, q):
            X[i, :i] = 0.0
    return X


def _diagonal_on_host(Td) -> np.ndarray:
    """The diagonal of a dense square NumPy or CuPy array, as a host array (a
    device one copied by the package's prefetched kernel: CuPy's own strided copy
    and reductions are compiled on their first use in an environment)."""
    if _module_of(Td) is np:
        return np.diagonal(Td)
    return array_ops.contiguous_copy(Td.diagonal()).get()


def _finite_frobenius(X) -> float:
    """``‖X‖_F`` of a dense NumPy or CuPy X, or NaN where X holds a NaN or an
    infinity (on the device: the prefetched column norms of X, or of its
    transpose's rows where X is column-major, which have the same sum)."""
    if _module_of(X) is np:
        return float(np.linalg.norm(X)) if bool(np.all(np.isfinite(X))) else float("nan")
    if not X.flags.c_contiguous:
        X = X.T if X.flags.f_contiguous else array_ops.contiguous_copy(X)
    norms, bad = array_ops.column_norms(X)
    if bool(bad.get().any()):
        return float("nan")
    return float(np.linalg.norm(norms.get()))


#: Squarings of ``G = (X/c)(X/c)ᵀ`` in :func:`_device_norm_test` (X = T⁻¹ on a GPU):
#: ``trace(G^(2^k))`` lies between ``λ_max(G)^(2^k)`` and ``q·λ_max(G)^(2^k)``, so
#: ``k`` of them settle ``‖X‖₂ < c`` or ``‖X‖₂ >= c`` except where ``‖X‖₂/c`` lies
#: within a factor ``q^(1/2^(k+1))`` of 1 (1.015 for q = 1800 at k = 7), each a GEMM
#: of ``2q³`` flops queued without a host round trip.
DEVICE_NORM_SQUARINGS = 7


def _host_norm(v: np.ndarray) -> float:
    """2-norm of a host vector whose entries may lie near the underflow threshold
    (the power iterates of :func:`_device_norm_test`)."""
    big = float(np.max(np.abs(v))) if v.size else 0.0
    if not (big > 0 and np.isfinite(big)):
        return big if big == big else float("nan")
    return big * float(np.linalg.norm(v / big))


def _device_norm_test(X, limit: float) -> Optional[tuple]:
    """Whether ``‖X‖₂ < limit`` for a dense square CuPy (or NumPy) X, by a few GEMMs.

    ``G = (X/limit)(X/limit)ᵀ`` squared :data:`DEVICE_NORM_SQUARINGS` (k) times:
    ``t = trace(G^(2^k))`` is at least ``λ^(2^k)`` and at most ``q·λ^(2^k)``
    (λ = ``λ_max(G)`` = ``(‖X‖₂/limit)²``; G is symmetric positive semidefinite, and
    rounding moves each product by ``O(q·eps)`` of its largest eigenvalue). So
    ``t < 1`` proves ``‖X‖₂ < limit`` and ``t >= q`` proves ``‖X‖₂ >= limit``;
    scaled by ``limit`` the powers stay representable where the comparison is
    close, and where they overflow (or make a NaN of an overflow) ``‖X‖₂`` lies
    far above ``limit``. Unlike Lanczos (a product with X, a copy to the host and
    ARPACK's step per iteration) the GEMMs queue on the device and one copy ends
    them.

    Returns
    -------
    (below, estimate) or None
        ``below``: the verdict; ``estimate``: ``‖X‖₂`` by the Rayleigh quotient
        of G at ``G^(2^k) z`` (z seeded random; NaN after an overflow), at most
        ``‖X‖₂`` up to rounding and short of it by the weight ``(σ₂/σ₁)^(2^(k+2))``
        of what lies below σ₁ (6e-5 relative where the top singular values lie 1 %
        apart, where Lanczos reaches 1e-12). None where the trace leaves the
        comparison open, or the powers underflowed below a verdict ``below``
        (Lanczos decides).
    """
    xp = _module_of(X)
    q = X.shape[0]
    if xp is np:
        S = X / limit
    else:
        # every entry divided by ``limit``: the C-contiguous one of X and Xᵀ (the
        # nonzero spectrum of S Sᵀ is that of XᵀX/limit² either way)
        V = X if X.flags.c_contiguous else (X.T if X.flags.f_contiguous
                                           else array_ops.contiguous_copy(X))
        S = array_ops.divide_columns(V, xp.asarray(np.full(q, float(limit))))
    with np.errstate(all="ignore"):         # a NumPy X's overflow is a verdict too
        G = S @ S.T
        for _ in range(DEVICE_NORM_SQUARINGS):
            G = G @ G
        z = xp.asarray(np.random.default_rng(q).standard_normal(q))
        v = G @ z
        w = S.T @ v
    t = float(np.sum(_diagonal_on_host(G)))
    if xp is not np:
        v, w = v.get(), w.get()
    vn, wn = _host_norm(v), _host_norm(w)
    estimate = limit * (wn / vn) if vn > 0 and np.isfinite(vn) else float("nan")
    if t < 1.0:
        return (True, estimate) if estimate > 0 and np.isfinite(estimate) else None
    if not t < q:            # NaN included: made of an overflow
        return False, estimate
    return None


#: Largest share of q² a sparse T of order up to :data:`DENSE_SIGMA_LIMIT` may fill for
#: its σ_min to come from the compiled sweeps (:func:`_compiled_sigma_min`): their
#: ``nnz(T)·q/2`` multiply-adds for ``‖T⁻¹‖_F`` cost as much as ``trtri``'s ``q³/3`` flops
#: near a fill of 0.07-0.09 on one core (q = 800-2500).
COMPILED_SIGMA_MAX_FILL = 0.05
#: Column blocks of T⁻¹ in :func:`_compiled_sigma_min`: block ``[j0, j1)`` is the solve
#: with T's leading ``j1 × j1`` triangle only (T⁻¹ is upper triangular), about half
#: the multiply-adds of one solve with the whole identity, and ``q²/blocks`` doubles.
COMPILED_INVERSE_BLOCKS = 16
#: Seconds per multiply-add of the compiled sweeps' ``‖T⁻¹‖_F``
#: (:func:`compiled_sigma_seconds`): the dear side of one core of a 2-core host on the R
#: of nnc1374, 494_bus and adder_dcop_05.
COMPILED_SIGMA_S_PER_MADD = 1e-9
#: Seconds per entry of T of the compiled sweeps' Lanczos run to 1e-12 where the bound
#: fails (two sweeps a step, tens to hundreds of steps), on the same side, host and
#: triangles.
COMPILED_LANCZOS_S_PER_ENTRY = 1.5e-6


def _inverse_frobenius(sweeps: SparseUpperSolves, limit: float) -> float:
    """``‖T⁻¹‖_F`` of the upper triangular T that ``sweeps`` solves with, by its compiled
    solves with the identity (:data:`COMPILED_INVERSE_BLOCKS` column blocks, block
    ``[j0, j1)`` with T's leading ``j1 × j1`` triangle: T⁻¹ is upper triangular), or the
    partial sum once it reaches ``limit`` (the rest is not needed); NaN where a block is
    not finite."""
    q = sweeps.q
    width = -(-q // COMPILED_INVERSE_BLOCKS)
    total = 0.0
    for j0 in range(0, q, width):
        j1 = min(q, j0 + width)
        block = np.zeros((j1, j1 - j0))
        block[np.arange(j0, j1), np.arange(j1 - j0)] = 1.0
        with np.errstate(all="ignore"):
            X = sweeps.solve_leading(block, j1)
        part = _finite_frobenius(X)
        if part != part:
            return float("nan")
        total = float(np.hypot(total, part))
        if total >= limit:
            return total
    return total


def _compiled_operand(T) -> Optional[sp.csc_array]:
    """T as :func:`_compiled_sigma_min` solves with it (canonical float64 CSC), or None
    where that path does not apply to T: dense, not float64, of order 2 or less, filling
    more than :data:`COMPILED_SIGMA_MAX_FILL` of q², over :data:`SUPERLU_MAX_NNZ`
    entries, not upper triangular, or a zero or non-finite diagonal entry."""
    q = T.shape[0]
    if (not sp.issparse(T) or T.dtype != np.float64 or q <= 2
            or T.nnz > COMPILED_SIGMA_MAX_FILL * q * q or T.nnz > SUPERLU_MAX_NNZ):
        return None
    T = sp.csc_array(T)
    if not T.has_canonical_format:
        T = T.copy()
        T.sum_duplicates()
    if _triangle_side(T, upper_only=True) is None:
        return None
    d = np.abs(T.diagonal())
    if not bool(np.all(np.isfinite(d)) and np.all(d > 0)):
        return None
    return T


def compiled_sigma_applies(T) -> bool:
    """Whether σ_min of T comes from the host's compiled sweeps
    (:func:`_compiled_sigma_min`: :func:`_compiled_operand` takes T and the library is
    at hand); otherwise the host's dense path answers."""
    return _compiled_operand(T) is not None and native_at_hand()


def compiled_sigma_seconds(order: int, entries: float) -> float:
    """Predicted seconds of σ_min on the host's compiled sweeps
    (:func:`_compiled_sigma_min`) of a triangle of this order and entries, on the dear
    side: the whole ``‖T⁻¹‖_F`` (``entries·order/2`` multiply-adds at
    :data:`COMPILED_SIGMA_S_PER_MADD`; the sum stops early where the bound fails) and a
    Lanczos run (:data:`COMPILED_LANCZOS_S_PER_ENTRY` per entry)."""
    return float(entries) * (COMPILED_SIGMA_S_PER_MADD * order / 2.0
                             + COMPILED_LANCZOS_S_PER_ENTRY)


def _compiled_sigma_min(T, threshold: float) -> Optional[SigmaMin]:
    """The dense path's answer for a sparse T of order at most
    :data:`DENSE_SIGMA_LIMIT` through the compiled sparse sweeps
    (:class:`~scipy_gpuqr._factor.native.SparseUpperSolves`): ``‖T⁻¹‖_F`` from
    the solves with the identity (:func:`_inverse_frobenius`: about
    ``nnz(T)·q/2`` multiply-adds where ``trtri`` takes ``q³/3``) for its bound,
    else Lanczos on ``T⁻¹T⁻ᵀ`` (the nonzero spectrum of ``XᵀX``, X = T⁻¹) by two
    sweeps per step instead of two dense products with X, from the same seeded
    start and to the same 1e-12.

    The same verdicts and values as the dense path up to rounding (the sweeps sum
    in another order than ``trtri`` and BLAS). The Frobenius sum stops once it
    shows that the bound fails. None (the dense path answers) where it does not
    apply (:func:`_compiled_operand`: T dense, not float64, not upper triangular,
    filling more than :data:`COMPILED_SIGMA_MAX_FILL` of q² (the dense path is then
    cheaper), over :data:`SUPERLU_MAX_NNZ` entries, a zero or non-finite diagonal
    entry), the library not at hand, a block of T⁻¹ that is not finite, or a Lanczos
    run that fails or does not end finite.
    """
    q = T.shape[0]
    T = _compiled_operand(T)
    if T is None:
        return None
    lib = native_handle()
    if lib is None:
        return None
    sweeps = SparseUpperSolves(lib, T)
    limit = 1.0 / threshold if threshold > 0 else np.inf
    fro = _inverse_frobenius(sweeps, limit)
    if fro != fro or fro == 0:
        return None
    if 1.0 / fro > threshold:
        return SigmaMin(1.0 / fro, True)
    start = np.random.default_rng(q).standard_normal(q)
    with np.errstate(all="ignore"):
        lam = _top_eigenvalue(lambda v: sweeps.solve(sweeps.solve_t(v.ravel())), q,
                              1e-12, start)
    if lam is None or not np.isfinite(lam):
        return None
    s = float(np.sqrt(max(lam, 0.0)))
    return SigmaMin(1.0 / s if s > 0 else np.inf, False)


def sigma_min_upper(T, threshold: float, *, solves: tuple = None,
                    margin: float = 1.0) -> SigmaMin:
    """σ_min of square upper triangular T, as needed to compare it with ``threshold``.

    Parameters
    ----------
    T : scipy.sparse array, ndarray or CuPy array, shape (q, q)
        Upper triangular, nonzero diagonal. A dense CuPy T is handled on its
        device (q ≤ :data:`DENSE_SIGMA_LIMIT`).
    threshold : float
        The value σ_min is compared with; a cheap lower bound above it is
        returned as soon as one is found.
    solves : (callable, callable), optional
        ``(C ↦ T⁻¹C, C ↦ T⁻ᵀC)`` on host arrays for the Lanczos estimate of a
        large T (default :class:`UpperTriangular`).
    margin : float
        The caller's margin: an estimate passes where ``value > margin·threshold``.
        A dense CuPy T whose ``1/‖T⁻¹‖_F`` does not pass is first tested against
        ``margin·threshold`` by :func:`_device_norm_test`; where that settles it,
        its estimate is returned on the verdict's side of the margin (the
        Lanczos estimate gives the same verdict), else Lanczos answers.

    Returns
    -------
    SigmaMin
        For q ≤ :data:`DENSE_SIGMA_LIMIT` (T⁻¹ formed: for a sparse T by the
        compiled solves, :func:`_compiled_sigma_min`, else q³/3 flops):
        ``1/‖T⁻¹‖_F`` (a lower bound, at most √q below σ_min) when it exceeds
        ``threshold``, else ``1/‖T⁻¹‖₂`` by Lanczos on the dense inverse to
        1e-12 (on a GPU, where ``margin·threshold`` is settled by
        :func:`_device_norm_test`, its estimate instead). Larger q: Lanczos on
        ``(TᵀT)⁻¹`` through triangular solves, to 1e-3 (callers add a margin).
    """
    q = T.shape[0]
    if q == 0:
        return SigmaMin(np.inf, True)
    if q <= DENSE_SIGMA_LIMIT:
        compiled = _compiled_sigma_min(T, threshold)
        if compiled is not None:
            return compiled
        Td = T.toarray() if sp.issparse(T) else T
        xp = _module_of(Td)
        d = np.abs(_diagonal_on_host(Td))
        if not bool(np.all(np.isfinite(d)) and np.all(d > 0)):
            return SigmaMin(0.0, True)
        X = _dense_inverse(Td.astype(np.float64, copy=False))
        fro = _finite_frobenius(X)
        if fro != fro:
            return SigmaMin(0.0, True)
        if fro == 0:
            return SigmaMin(np.inf, True)
        if 1.0 / fro > threshold:
            return SigmaMin(1.0 / fro, True)
        if xp is not np and margin * threshold > 0:
            settled = _device_norm_test(X, 1.0 / (margin * threshold))
            if settled is not None:
                below, s = settled
                bar = margin * threshold
                value = 1.0 / s if s > 0 else np.inf      # NaN (fails only): inf
                # the verdict's side of the margin (the Rayleigh estimate lies at or
                # below ‖T⁻¹‖₂: above it only by rounding)
                value = max(value, np.nextafter(bar, np.inf)) if below else min(value, bar)
                return SigmaMin(float(value), False)
        upper = (_upper_in_place(X) if xp is np
                 else array_ops.unit_triangle(X, lower=False, unit=False))
        s = norm2_lanczos(upper)            # <= σ_max(T⁻¹) <= ‖T⁻¹‖_F
        return SigmaMin(1.0 / s if s > 0 else np.inf, False)
    up, upt = solves or UpperTriangular(T).solves()
    lam = _top_eigenvalue(lambda v: np.asarray(up(upt(v.reshape(-1, 1)))).ravel(), q,
                          1e-3, np.ones(q))
    if lam is None:
        return SigmaMin(0.0, True)
    return SigmaMin(1.0 / np.sqrt(lam) if lam > 0 else np.inf, False)
