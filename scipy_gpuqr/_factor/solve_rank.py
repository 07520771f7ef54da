"""Rank decisions of a square triangular factor through its triangular solves alone.

Used by :class:`scipy_gpuqr._factor.lstsq.MinNormSolver` for large square R
with a nonzero diagonal. Everything here touches R only through ``C ↦ R⁻¹C``
and ``C ↦ R⁻ᵀC`` on blocks of a few (or ``d``) columns — on the device when
the factorization ran there (the GPU engine's front-structured solves read R
where it lies) — plus two O(nnz) host passes (R's diagonal and ``‖R‖_F``),
so a decision costs a few solves with R instead of a dense refinement of
all of R (O(q³)).

:func:`probe_norm` (full rank)
    A randomized power estimate of ``‖S‖₂`` for an operator ``S`` given with
    its transpose (``S = R⁻¹``: ``1/σ_min(R)``). For a start uniformly
    distributed on the sphere, Kuczyński and Woźniakowski (SIAM J. Matrix
    Anal. Appl. 13, 1992) bound the probability that k steps of the power
    method on a symmetric positive semidefinite ``B = SSᵀ`` return less than
    ``(1 − ε)λ_max(B)`` by roughly ``√q (1 − ε)^(k − 1/2)``, for every
    spectrum. With ``p`` independent Gaussian columns and ``1 − ε = 1/M²``,
    the estimate ν after k steps satisfies ``‖S‖ / M <= ν <= ‖S‖`` except
    with probability ``(√q M^(1−2k))^p``; :func:`probe_margin` is the M that
    makes this :data:`PROBE_FAILURE`. The caller tests after every step with
    that step's margin and stops when its test passes: with ``‖R‖₂ <=
    ‖R‖_F``, ``σ_min(R) >= 1/(M ν) > cutoff·‖R‖_F`` confirms lstsq's full
    rank. A well-conditioned R is confirmed by one solve with p columns
    (margin ``√q·PROBE_FAILURE^(−1/p)``, 4500 at q = 64000), harder ones
    after two or three steps (margins 16.5 and 5.4 there); at most ``2k − 1``
    solves (k = :data:`PROBE_MAX_STEPS`).

:class:`NullspaceCOD` (a few exactly dependent columns, a clear gap)
    R of an unpivoted QR of a rank-deficient A has tiny pivots at the d
    dependent columns; where the singular values have a clear gap at the
    cutoff the small left and right singular subspaces are found by one step
    of block inverse iteration with exactly d columns, ``Z = R⁻ᵀΩ``,
    ``U_d = orth(Z)``, ``Y = R⁻¹U_d``, ``V_d = orth(Y) = Y R_y⁻¹`` (the gap
    makes one step converge to rounding; Y, an orthonormal block's image, is
    as well conditioned as the dead singular values are clustered, where
    ``R⁻¹Z`` would square their spread and add the random block's). Then

    * ``σ_{q−d+1} <= ‖R V_d‖₂ = ‖U_d R_y⁻¹‖₂ <= ‖U_d R_y⁻¹‖_F`` (+ the solve's
      backward error, below lstsq's cutoff): d singular values are below the
      cutoff when that is at most half of it. The Frobenius norm is cheap;
      where it is not small enough to decide for every cutoff in range, the
      2-norm (up to √d smaller) is taken from the d × d Gram matrix, so that
      rounding spread over many dead columns does not send the decision to a
      dense rule;
    * the minimum-norm solution of the truncated problem is
      ``S c = P_V R⁻¹ P_U c`` (``P_U = I − U_d U_dᵀ``, ``P_V = I − V_d V_dᵀ``;
      for G = Rᵀ the transpose, ``P_U R⁻ᵀ P_V``): with exact subspaces
      ``S = V_r Σ_r⁻¹ U_rᵀ``, the truncated pseudo-inverse;
    * ``σ_{q−d}`` above the cutoff: ``1/‖S‖₂`` estimates it, and
      :func:`probe_norm` of S with its margin decides. Inaccurate
      subspaces leak the amplified components ``R⁻¹ U_d`` into S and make
      ``‖S‖`` large, so the test fails (and a dense rule answers) rather
      than passing wrongly. The probe's first step ``S W`` is solved with
      ``R⁻¹U_d`` (one solve of d + p columns), so a clear case costs two
      solves with R in all.

    Where the singular values have no gap at the cutoff (bayer10) the checks
    fail and :mod:`scipy_gpuqr._factor.subspace_cod` or an SVD answers.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from .._engine.gpu import array_ops
from .dense_cod import solve_triangular
from .host_norms import norm2

__all__ = ["PROBE_COLUMNS", "PROBE_MAX_STEPS", "PROBE_FAILURE", "DRAW_CHUNK", "DRAW_THREADS",
           "probe_margin", "probe_norm", "gaussian_block", "abs_diagonal", "frobenius",
           "NORM2_MAX_COLUMNS", "CHOLQR_MAX_DEPARTURE", "CHOLQR_ONE_PASS", "RHS_MAX_COLUMNS",
           "norm2_upper", "block_ops",
           "NullspaceCOD",
           "NullspaceRefused"]

#: Columns of the random block of :func:`probe_norm` (a solve with a few columns
#: costs about what one with a single column costs: the GPU's are launch-bound).
PROBE_COLUMNS = 8

#: Most power steps of :func:`probe_norm` (``2k − 1`` solves); its margin after k
#: steps is :func:`probe_margin` (q = 64000, 8 columns: 4500, 16.5, 5.4).
PROBE_MAX_STEPS = 3

#: Bound on the probability that :func:`probe_norm` underestimates by more than
#: its margin, per step tested.
PROBE_FAILURE = 1e-10


#: Numbers per independently seeded piece of a Gaussian block
#: (:func:`gaussian_block`). Where the pieces lie depends on the block's size
#: alone, so a seed gives the same block whatever the number of threads.
DRAW_CHUNK = 1 << 18

#: Most threads drawing the pieces of one Gaussian block.
DRAW_THREADS = 8

#: Largest ``‖Q₁ᵀQ₁ − I‖_F`` after CholeskyQR's first pass for which the device's
#: thin QR takes the second (``κ(Q₁)² <= 3`` then); beyond, Householder.
CHOLQR_MAX_DEPARTURE = 0.5

#: The device's thin QR of d columns stops after CholeskyQR's first pass where it
#: leaves ``‖Q₁ᵀQ₁ − I‖_F <= CHOLQR_ONE_PASS·d·eps`` (the order of a Householder
#: QR's own departure): a well-conditioned block (V's, ``Y = R⁻¹U_d``) needs no second.
CHOLQR_ONE_PASS = 4.0

#: Most right-hand sides :class:`NullspaceCOD` takes into its solve with ``R⁻¹``
#: (``rhs``); more are left to the first solve's own (the decision's blocks stay
#: q × (d + 8 + p)).
RHS_MAX_COLUMNS = 64

#: Most dead columns d for which :class:`NullspaceCOD` takes ``‖R V_d‖₂``
#: from the d × d Gram matrix (host eigenvalues) where the Frobenius bound
#: does not decide.
NORM2_MAX_COLUMNS = 2048


class NullspaceRefused(Exception):
    """The solve-based decision does not apply; a dense rule must decide."""


_EPS = float(np.finfo(np.float64).eps)


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def abs_diagonal(R: sp.csc_array) -> np.ndarray:
    """``|diag(R)|`` of square upper triangular CSC R.

    O(q) where every column's last stored entry lies on the diagonal (R
    upper triangular with sorted row indices, as the factorizations store
    it), else SciPy's O(nnz) ``diagonal``.
    """
    k, q = R.shape
    if k == q and q and R.nnz:
        indptr = R.indptr
        last = indptr[1:] - 1
        # the arrays' own methods: NumPy's function forms cost more than the test here
        if (indptr[1:] > indptr[:-1]).all() and (R.indices[last] == np.arange(q)).all():
            return np.abs(R.data[last])
    return np.abs(R.diagonal())


def frobenius(R: sp.csc_array) -> float:
    """``‖R‖_F`` (an upper bound of ``‖R‖₂``): one pass over R's values."""
    return norm2(R.data)


def gaussian_block(seed: int, shape: tuple) -> np.ndarray:
    """A seeded standard normal block (float64, C order), the same for a seed and
    shape on any machine.

    Drawn in pieces of :data:`DRAW_CHUNK` numbers, piece i by a PCG64
    generator seeded with the i-th child of ``SeedSequence(seed)``, on up to
    :data:`DRAW_THREADS` threads (NumPy's generators fill without the GIL):
    the null-space COD's q × d block of a large R is millions of numbers,
    a fifth of a second on one core. (A GPU call draws its blocks on the
    device instead.)
    """
    out = np.empty(shape, dtype=np.float64)
    flat = out.reshape(-1)
    pieces = -(-flat.size // DRAW_CHUNK)
    if not pieces:
        return out
    seqs = np.random.SeedSequence(seed).spawn(pieces)

    def draw(i):
        np.random.Generator(np.random.PCG64(seqs[i])).standard_normal(
            out=flat[i * DRAW_CHUNK:(i + 1) * DRAW_CHUNK])
    threads = min(pieces, DRAW_THREADS, os.cpu_count() or 1)
    if threads <= 1:
        for i in range(pieces):
            draw(i)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="gpuqr-draw") as ex:
            list(ex.map(draw, range(pieces)))
    return out


def probe_margin(q: int, steps: int, columns: int = PROBE_COLUMNS,
                 failure: float = PROBE_FAILURE) -> float:
    """Margin M after k power steps: the least M with ``(√q · M^(1 − 2k))^p <= failure``."""
    return (math.sqrt(max(q, 1)) * failure ** (-1.0 / columns)) ** (1.0 / (2 * steps - 1))


def probe_norm(apply: Callable, apply_t: Callable, q: int, *, xp=np, seed: int = 0,
               columns: int = PROBE_COLUMNS, steps: int = PROBE_MAX_STEPS,
               accept: Optional[Callable] = None, start: Optional[tuple] = None) -> tuple:
    """Randomized lower estimate ν of ``‖S‖₂`` and its margin M (``‖S‖/M <= ν``
    except with probability :data:`PROBE_FAILURE` per step).

    Parameters
    ----------
    apply, apply_t : callable
        ``C ↦ S C`` and ``C ↦ Sᵀ C`` on (q, p) arrays of ``xp`` (results of
        either module are accepted).
    q : int
        Order of S.
    xp : module
        NumPy or CuPy: where the block lives.
    seed : int
        Seed of the Gaussian start (the same operator gives the same answer).
    columns : int
        Block columns p.
    steps : int
        Most power steps k (``2k − 1`` applications of S or Sᵀ).
    accept : callable, optional
        ``accept(nu, margin) -> bool``, asked after every step: True stops
        (the caller's test passed with that step's margin, :func:`probe_margin`).
    start : (array, array), optional
        ``(Ω, Sᵀ Ω)``: a Gaussian start block (q × p, p = min(columns, q),
        unscaled: a draw like :func:`gaussian_block`'s) and its image, computed
        by the caller together with other columns of the same solve; the first
        step then applies nothing (Sᵀ is linear: the image is scaled by Ω's
        column norms). ``seed`` is then unused.

    Returns
    -------
    (float, float)
        ν = max over the block's columns and steps of ``‖Sᵀ y‖ / ‖y‖`` (power
        method on ``S Sᵀ``), and the margin of the step it stopped at; ν is
        ``inf`` when a solve produced a non-finite value (a zero pivot: no
        finite norm to confirm).
    """
    if q == 0:
        return 0.0, 1.0
    p = min(columns, q)
    blocks = block_ops(xp)
    if start is None:
        Y = blocks.dense(blocks.gaussian(seed, (q, p)))
        image = None
    else:
        Y, image = blocks.dense(start[0]), blocks.dense(start[1])
        if Y.shape != (q, p) or image.shape != (q, p):
            raise ValueError(f"probe_norm: a start of {p} columns of {q} rows, not "
                             f"{Y.shape} and {image.shape}")
    norms, _ = blocks.norms(Y)
    nu, margin = 0.0, float("inf")
    for step in range(1, steps + 1):
        if image is not None:
            Z, image = blocks.scaled(image, norms), None     # Sᵀ y, given
        else:
            Y = blocks.scaled(Y, norms)
            Z = blocks.dense(apply_t(Y))            # Sᵀ y
        zn = _host(blocks.norms(Z)[0])
        if not np.all(np.isfinite(zn)):
            return float("inf"), margin
        nu = max(nu, float(zn.max()))
        margin = probe_margin(q, step, p)
        if step == steps or (accept is not None and accept(nu, margin)):
            break
        Y = blocks.dense(apply(Z))                  # S Sᵀ y
        norms, bad = blocks.norms(Y)
        if _host(bad).any():
            return float("inf"), margin
        if not np.all(_host(norms) > 0):
            break                                   # a column in S's null space
    return nu, margin


class _HostBlocks:
    """The block operations of :func:`probe_norm` and :class:`NullspaceCOD` on
    NumPy arrays."""

    @staticmethod
    def gaussian(seed: int, shape: tuple):
        """A seeded standard normal block (:func:`gaussian_block`)."""
        return gaussian_block(seed, shape)

    @staticmethod
    def dense(X):
        return np.asarray(X)

    @staticmethod
    def norms(Y):
        """``(norms, bad)``: each column's 2-norm, and whether it holds a NaN or an
        infinity."""
        return np.linalg.norm(Y, axis=0), ~np.isfinite(Y).all(axis=0)

    @staticmethod
    def scaled(Y, norms):
        return Y / norms

    @staticmethod
    def finite(X) -> bool:
        return bool(np.all(np.isfinite(X)))

    @staticmethod
    def finite_absmax(X) -> float:
        """``max|X|``, or NaN where X holds a NaN or an infinity."""
        return float(np.abs(X).max()) if bool(np.all(np.isfinite(X))) else float("nan")

    @staticmethod
    def divided(X, s: float):
        return X / s

    @staticmethod
    def orth(X, want_r: bool = True) -> tuple:
        """Thin QR ``X = Q R`` (X is kept)."""
        return la.qr(np.array(X, order="F"), mode="economic", overwrite_a=True,
                     check_finite=False)

    @staticmethod
    def stacked(*parts):
        """``[A, B, ...]`` (columns side by side), C-contiguous."""
        return np.concatenate(parts, axis=1)

    @staticmethod
    def split(Y, *cuts: int) -> tuple:
        """``(Y[:, :c₁], Y[:, c₁:c₂], ..., Y[:, c_k:])``, each C-contiguous."""
        edges = (0,) + cuts + (Y.shape[1],)
        return tuple(np.ascontiguousarray(Y[:, a:b]) for a, b in zip(edges, edges[1:]))

    @staticmethod
    def right_solve(Z, Ry):
        """``Z R_y⁻¹`` (R_y upper triangular)."""
        return solve_triangular(Ry, Z.T, trans=True).T

    @staticmethod
    def fro(X) -> float:
        return float(np.linalg.norm(X))

    @staticmethod
    def gram(X) -> np.ndarray:
        """``XᵀX`` (host array)."""
        return X.T @ X

    @staticmethod
    def project(B, C):
        """``(I − B Bᵀ) C`` for orthonormal columns B, twice (Gram–Schmidt with
        reorthogonalization); C is kept."""
        for _ in range(2):
            C = C - B @ (B.T @ C)
        return C


class _DeviceBlocks:
    """The same operations on CuPy arrays, none of which compiles a kernel on the
    calling thread: the prefetched kernels of
    :mod:`scipy_gpuqr._engine.gpu.array_ops` (column norms and maxima with
    finite checks, scalings, copies, differences, triangles), cuSOLVER's
    ``potrf`` (``geqrf``/``orgqr`` where CholeskyQR2 would not be accurate)
    and cuBLAS's ``trsm`` called directly, CuPy's products
    of contiguous operands (cuBLAS), and Gaussian blocks drawn on the device
    (:func:`~scipy_gpuqr._engine.gpu.array_ops.normal_block`: a q × d block is
    millions of numbers, a tenth of a second drawn on the host and uploaded;
    the device's numbers differ from the host path's, both standard normal).
    A block's norms are taken once per step of
    :func:`probe_norm` (the finite and nonzero checks and the next step's
    scaling share them)."""

    def __init__(self, xp):
        self.xp = xp

    @staticmethod
    def gaussian(seed: int, shape: tuple):
        return array_ops.normal_block(seed, shape)

    def dense(self, X):
        """X as a C-contiguous 2-D float64 device array (itself where it is one)."""
        X = self.xp.asarray(X)
        return array_ops.fresh_float64(X) if (
            X.dtype != np.float64 or not X.flags.c_contiguous or X.ndim != 2) else X

    @staticmethod
    def norms(Y):
        return array_ops.column_norms(Y)

    @staticmethod
    def scaled(Y, norms):
        return array_ops.divide_columns(Y, norms)

    @staticmethod
    def finite(X) -> bool:
        return not _host(array_ops.column_absmax(X)[1]).any()

    @staticmethod
    def finite_absmax(X) -> float:
        amax, bad = array_ops.column_absmax(X)
        return float("nan") if _host(bad).any() else float(_host(amax).max(initial=0.0))

    def divided(self, X, s: float):
        return array_ops.divide_columns(X, self.xp.asarray(np.full(X.shape[1], s)))

    def orth(self, X, want_r: bool = True) -> tuple:
        """Thin QR ``X = Q R`` (X is kept): CholeskyQR2 where it is accurate, else
        Householder (cuSOLVER ``geqrf``/``orgqr``): :meth:`orth_queued` with its
        checks read at once."""
        return self.orth_queued(X, self.unit_vectors(int(X.shape[1])), want_r,
                                both=False).result()

    @staticmethod
    def _departure_queued(G, ones, minus_ones) -> tuple:
        """``‖G − I‖_F`` of the C-contiguous square ``G`` (the departure of CholeskyQR's
        Q from orthonormal) queued on the current stream, nothing read back: the
        column norms of ``G − I`` formed in place (its diagonal, a strided view,
        less ones) and their non-finite flags (device arrays), G left as it was;
        ``ones`` and ``minus_ones``: :meth:`unit_vectors` of G's order."""
        d = int(G.shape[0])
        diag = G.reshape(-1)[:: d + 1]
        array_ops.subtract_into(diag, ones)
        norms, bad = array_ops.column_norms(G)
        array_ops.subtract_into(diag, minus_ones)
        return norms, bad

    @staticmethod
    def _departure_read(norms, bad) -> float:
        """The departure from :meth:`_departure_queued`'s arrays (read back here); inf
        where G held a NaN or an infinity."""
        if _host(bad).any():
            return float("inf")
        departure = float(np.linalg.norm(_host(norms)))
        return departure if np.isfinite(departure) else float("inf")

    def unit_vectors(self, d: int) -> tuple:
        """``(ones, minus ones)`` of length d on the device (:meth:`_departure_queued`),
        uploaded before the work that reads them is queued: an upload from pageable
        memory may wait for the stream it is made on."""
        return self.xp.asarray(np.ones(d)), self.xp.asarray(np.full(d, -1.0))

    def scaled_by_absmax(self, Z) -> tuple:
        """``(Z / max|Z|, pending, scale)`` queued on the current stream, nothing read
        back: the block :meth:`divided` gives for the scale :meth:`finite_absmax`
        reads (the same largest finite magnitude, exact, divided by the same
        kernel), the device arrays :meth:`read_absmax` reads that scale from, and
        the scale as a device vector of Z's width (for :meth:`divide_columns`)."""
        xp = self.xp
        amax, bad = array_ops.column_absmax(Z)
        top, _ = array_ops.column_absmax(amax.reshape(-1, 1))     # the largest, exact
        d = int(Z.shape[1])
        scale = xp.empty(d, dtype=np.float64)
        array_ops.copy_into(scale, xp.broadcast_to(top, (d,)))    # on the device
        return array_ops.divide_columns(Z, scale), (top, bad), scale

    @staticmethod
    def read_absmax(pending) -> float:
        """:meth:`finite_absmax`'s value from :meth:`scaled_by_absmax`'s arrays:
        ``max|Z|``, or NaN where Z holds a NaN or an infinity."""
        top, bad = pending
        return float("nan") if _host(bad).any() else float(_host(top)[0])

    @staticmethod
    def divide_columns(X, scale):
        """``X`` with each column divided by the device vector ``scale``."""
        return array_ops.divide_columns(X, scale)

    def orth_queued(self, X, vectors, want_r: bool = True, both: bool = True) -> "_QueuedOrth":
        """:meth:`orth` queued on the current stream with nothing read back, so that
        the calling thread can queue the work that reads its factors before it
        looks (:meth:`_QueuedOrth.result` reads the checks and answers).

        CholeskyQR2: two passes of ``G = QᵀQ`` (one GEMM), ``G = UᵀU`` (cuSOLVER
        ``potrf``), ``Q ← Q U⁻¹`` (cuBLAS ``trsm``), starting from a copy of X: a
        few BLAS-3 calls where ``geqrf``/``orgqr`` spend most of their time in
        panel factorizations. The first pass leaves ``‖Q₁ᵀQ₁ − I‖ ≈ κ(X)²·u``
        (computed exactly, from ``G − I``); the second is taken only where that
        departure is at most :data:`CHOLQR_MAX_DEPARTURE` (then ``κ(Q₁)² <= 3``),
        and gives ``Q`` orthonormal and ``X = Q R`` to working precision
        (Yamamoto, Nakatsukasa, Yanagisawa, Fukaya, ETNA 44, 2015); it is not
        needed where the first already leaves at most ``CHOLQR_ONE_PASS·d·eps``
        (:data:`CHOLQR_ONE_PASS`). A failed Cholesky factorization, or a larger
        departure (X too ill-conditioned, roughly κ(X) beyond 1e7, or not
        finite), leaves the answer to Householder. ``Q`` is C-contiguous,
        ``R = U₂U₁`` F-contiguous upper triangular.

        ``both``: CholeskyQR2's two passes always (where one would do, the second
        leaves Q orthonormal to working precision too; ``Q`` is then final, for
        work queued behind it); otherwise the first pass and its departure only,
        and :meth:`_QueuedOrth.result` takes the second where :meth:`orth` takes
        it: :meth:`orth`'s factors to the bit. X is kept. ``vectors``:
        :meth:`unit_vectors` of X's width."""
        xp = self.xp
        q, d = int(X.shape[0]), int(X.shape[1])
        if X.ndim != 2 or not q >= d >= 1:
            return _QueuedOrth(X, None, (), want_r)
        Q = array_ops.fresh_float64(xp.asarray(X))
        G1 = Q.T @ Q
        info1 = array_ops.cholesky_upper_queued(G1)
        array_ops.trsm_left(G1, d, Q, d, d, q, lower=False, trans=True, unit=False)
        G2 = Q.T @ Q
        departure = self._departure_queued(G2, *vectors)
        info2 = None
        if both:
            info2 = array_ops.cholesky_upper_queued(G2)
            array_ops.trsm_left(G2, d, Q, d, d, q, lower=False, trans=True, unit=False)
        return _QueuedOrth(X, Q, (G1, info1, G2, departure, info2), want_r)

    def stacked(self, *parts):
        widths = [int(P.shape[1]) for P in parts]
        out = self.xp.empty((int(parts[0].shape[0]), sum(widths)), dtype=np.float64)
        at = 0
        for P, w in zip(parts, widths):
            array_ops.copy_into(out[:, at:at + w], P)
            at += w
        return out

    @staticmethod
    def split(Y, *cuts: int) -> tuple:
        edges = (0,) + cuts + (int(Y.shape[1]),)
        return tuple(array_ops.contiguous_copy(Y[:, a:b]) for a, b in zip(edges, edges[1:]))

    @staticmethod
    def right_solve(Z, Ry):
        """``Z R_y⁻¹`` in place of Z (C-contiguous q × d; R_y upper triangular, its
        memory read column-major, as :meth:`orth` gives it): cuBLAS ``trsm`` with
        ``R_yᵀ`` on the d × q column-major Zᵀ, the call cupyx's
        ``solve_triangular(R_y, Z.T, trans=True)`` makes."""
        d, q = int(Ry.shape[0]), int(Z.shape[0])
        array_ops.trsm_left(Ry, d, Z, d, d, q, lower=False, trans=True, unit=False)
        return Z

    @staticmethod
    def fro(X) -> float:
        norms, _ = array_ops.column_norms(X)
        return float(np.linalg.norm(_host(norms)))

    @staticmethod
    def gram(X) -> np.ndarray:
        """``XᵀX`` by cuBLAS, copied to the host (d × d)."""
        return _host(X.T @ X)

    def project(self, B, C):
        C = array_ops.fresh_float64(self.xp.asarray(C))
        for _ in range(2):
            array_ops.subtract_into(C, B @ (B.T @ C))
        return C


class _QueuedOrth:
    """A thin QR queued by :meth:`_DeviceBlocks.orth_queued`: its orthonormal factor
    ``Q`` (a device array; final where both passes were queued) and the checks
    of CholeskyQR2's accuracy (the first Cholesky factorization's info, the
    departure after the first pass, the second's info)."""

    def __init__(self, X, Q, parts: tuple, want_r: bool):
        self.X, self.Q, self.parts, self.want_r = X, Q, parts, want_r
        self._answer = None

    def result(self) -> tuple:
        """``(Q, R)`` as :meth:`_DeviceBlocks.orth` answers (R None unless asked for):
        CholeskyQR2's, the checks read back here (the second pass queued now where
        it was left to this call and the departure asks for it), else
        Householder's of X (cuSOLVER ``geqrf``/``orgqr``, queued now). Made once."""
        if self._answer is None:
            self._answer = self._factors()
        return self._answer

    def _factors(self) -> tuple:
        if self.Q is not None:
            G1, info1, G2, departure, info2 = self.parts
            Q, d = self.Q, int(self.Q.shape[1])
            factors = [G1]
            ok = int(_host(info1)[0]) == 0
            departure = _DeviceBlocks._departure_read(*departure) if ok else float("inf")
            ok = departure <= CHOLQR_MAX_DEPARTURE
            if ok and info2 is None and departure > CHOLQR_ONE_PASS * d * _EPS:
                info2 = array_ops.cholesky_upper(G2)
                if info2 == 0:
                    array_ops.trsm_left(G2, d, Q, d, d, int(Q.shape[0]), lower=False,
                                        trans=True, unit=False)
                info2 = np.array([info2])
            if ok and info2 is not None:
                ok = int(_host(info2)[0]) == 0
                factors.append(G2)
            if ok:
                return Q, (_cholesky_r(factors) if self.want_r else None)
        return array_ops.thin_qr(self.X, want_r=self.want_r)


def _cholesky_r(factors: list):
    """R of CholeskyQR's passes from their Cholesky factors (each U's memory read
    column-major, as ``potrf`` leaves it in a C-contiguous G): ``U₂U₁`` (U₁ alone
    after one pass). U column-major is Uᵀ in C order (lower): (U₂U₁)ᵀ = U₁ᵀU₂ᵀ in C
    order, whose transpose (an F-contiguous view) is U₂U₁."""
    Ls = [array_ops.unit_triangle(G, lower=True, unit=False) for G in factors]
    return (Ls[0] @ Ls[1] if len(Ls) == 2 else Ls[0]).T


def norm2_upper(gram: np.ndarray, fro: float) -> float:
    """An upper bound of ``‖X‖₂`` (X of q rows) from the computed Gram matrix
    ``XᵀX`` (d × d, host) and ``‖X‖_F``.

    The Gram's rounding is ``|fl(XᵀX) − XᵀX| <= γ_q |X|ᵀ|X|``, whose 2-norm is
    at most ``γ_q ‖X‖_F²`` (γ_q ≈ qε, below 1e-6 for any q up to 4·10⁹ rows);
    the largest eigenvalue's own error is ε‖XᵀX‖. So ``λ_max + 1e-6·‖X‖_F²``
    bounds ``‖X‖₂²`` while staying far below ``‖X‖_F²`` when the columns
    spread over many directions, which is what the bound is for.
    """
    d = gram.shape[0]
    if d == 0 or not np.all(np.isfinite(gram)):
        return float("inf")
    top = float(la.eigvalsh(gram, subset_by_index=[d - 1, d - 1],
                            check_finite=False)[0])
    return math.sqrt(max(top, 0.0) + 1e-6 * fro * fro)


def block_ops(xp):
    """The block operations of :func:`probe_norm` and :class:`NullspaceCOD` for arrays of
    ``xp`` (NumPy or CuPy)."""
    return _DeviceBlocks(xp) if getattr(xp, "__name__", "") == "cupy" else _HostBlocks


#: :func:`_side_stream`'s streams, per thread (``by_device``: device id → stream).
_SIDE_STREAMS = threading.local()

def _side_stream(cp):
    """A non-blocking CUDA stream of the current device for :class:`NullspaceCOD`'s
    first block beside the fetch of its right-hand sides: made once per thread
    and device, the same for every decision the thread makes there.

    CuPy's memory pool keeps a freed block for the stream it was allocated on,
    and the first block's arrays (q × d) are allocated on this stream: a fresh
    stream per decision could never take the blocks its predecessor freed, so
    the pool would grow by them at every call. Per thread, because two threads'
    decisions must not queue behind each other."""
    per = getattr(_SIDE_STREAMS, "by_device", None)
    if per is None:
        per = _SIDE_STREAMS.by_device = {}
    dev = int(cp.cuda.Device().id)
    stream = per.get(dev)
    if stream is None:
        stream = per[dev] = cp.cuda.Stream(non_blocking=True)
    return stream


@dataclass
class NullspaceCOD:
    """Minimum-norm solves with G = R or Rᵀ when d dependent columns leave a clear gap.

    Parameters
    ----------
    inv, inv_t : callable
        ``C ↦ R⁻¹C`` and ``C ↦ R⁻ᵀC`` (host or device arrays in, either out).
    q : int
        Order of R.
    d : int
        Number of singular values taken as below the cutoff (the count of
        tiny pivots); 1 <= d < q.
    tol_range : (float, float or callable)
        Bounds ``lo <= tol <= hi`` of lstsq's absolute cutoff ``eps·max(m,
        n)·σ_max`` (σ_max between ``max|r_ii|`` and ``‖R‖_F`` before an
        accurate estimate is paid for): the checks that fail for every tol in
        the range raise, :meth:`certain` and :meth:`holds` decide. ``hi`` may
        be given late, as a callable called once (it may raise
        :class:`NullspaceRefused`) when ``R⁻ᵀΩ`` is solved, and nothing before
        needs it: the caller's pass over R's values for ``‖R‖_F`` then runs on
        the host while the device solves; ``tol_range`` holds its value after.
    transposed : bool
        Solve with ``G = Rᵀ``.
    xp : module
        NumPy or CuPy: where the q×d blocks live.
    seed : int
        Seed of the random block.
    rhs : callable, optional
        ``rhs()``: host right-hand sides C (q × p) of the first :meth:`solve`
        (G = R only, p <= :data:`RHS_MAX_COLUMNS`), fetched first, before any
        solve with R: a staged GPU factorization's ``Qᵀ`` then reads the
        stage its end sent up (``solve.prefetch_first``) before R's rows take
        the device's room (the caller's least-squares solve needs C whatever
        the decision). The decision's solve with ``R⁻¹`` takes ``P_U C`` as p
        more columns, and the first :meth:`solve` of the same C uses them
        instead of a solve of its own.
    rhs_beside : bool
        Fetch ``rhs()`` on the calling thread's stream while the first block
        ``U_d = orth(R⁻ᵀΩ)`` is solved on a stream of its own
        (:func:`_side_stream`), on the device only: the caller says so where
        the two overlap (``Qᵀb`` of a factorization whose every stage's pool is
        on the device: two sequences of small kernels; of a staged one: a
        replay bound by the link beside solves bound by the device, R's rows
        going up beside the first stage ``Qᵀ`` reads where they fit).
        Otherwise, and by default, ``rhs()`` comes first (see ``rhs``).
    rhs_device : callable, optional
        With ``rhs_beside``: ``rhs_device()`` queues the block ``rhs()`` gives
        on the calling thread's stream and returns it as a device array, not
        waited for. The decision's device steps up to ``R V_d`` are then all
        queued on the side stream before it, with nothing read back, so the
        device works through them while the calling thread launches the
        replay (:meth:`_queued_decision`); ``R⁻¹ P_U C`` is solved on the
        caller's stream behind the replay, and ``rhs()`` (the host copy, the
        same values, for :meth:`solve`) is called once that solve is queued:
        its wait is the solve's own.

    Raises
    ------
    NullspaceRefused
        No clear gap for any tol in the range, or a non-finite solve.

    Attributes
    ----------
    rank : int
        ``q − d``.
    residual : float
        The bound ``‖U_d R_y⁻¹‖_F`` of ``σ_{q−d+1}``, or the tighter bound of
        ``‖U_d R_y⁻¹‖₂`` (:func:`norm2_upper`) where the Frobenius norm is above
        half the lowest cutoff and d is at most :data:`NORM2_MAX_COLUMNS`.
    nu, margin : float
        :func:`probe_norm`'s estimate of ``‖S‖₂`` (``1/σ_{q−d}``) and its margin.
    sigma_min : float
        ``1/nu``: estimate of the smallest kept singular value ``σ_{q−d}``.
    """

    inv: Callable
    inv_t: Callable
    q: int
    d: int
    tol_range: tuple
    transposed: bool = False
    xp: object = np
    seed: int = 0
    rhs: Optional[Callable] = field(default=None, repr=False)
    rhs_beside: bool = False
    rhs_device: Optional[Callable] = field(default=None, repr=False)
    rank: int = field(init=False, default=0)
    residual: float = field(init=False, default=float("nan"))
    nu: float = field(init=False, default=float("nan"))
    margin: float = field(init=False, default=float("inf"))
    sigma_min: float = field(init=False, default=float("nan"))
    _u: object = field(init=False, default=None, repr=False)
    _v: object = field(init=False, default=None, repr=False)
    _blocks: object = field(init=False, default=None, repr=False)
    # (C, R⁻¹ P_U C) of the given right-hand sides, for the first solve of C
    _first: Optional[tuple] = field(init=False, default=None, repr=False)

    def __post_init__(self):
        rhs, self.rhs = self.rhs, None      # not kept: it may hold its caller
        rhs_device, self.rhs_device = self.rhs_device, None
        q, d = self.q, self.d
        if not (0 < d < q):
            raise NullspaceRefused(f"{d} dead columns of {q}")
        self._blocks = blocks = block_ops(self.xp)
        if (rhs is not None and self.rhs_beside and not self.transposed
                and blocks is not _HostBlocks):
            if rhs_device is not None:
                first = self._queued_decision(rhs, rhs_device)
                if first is None:
                    return                  # decided
                C, U = first                # CholeskyQR2 refused the first block
            else:
                C, U = self._first_block_beside(rhs)
        else:
            C = self._given_rhs(rhs)        # before R's solves (see ``rhs``)
            U = self._first_block(blocks.dense(self.inv_t(blocks.gaussian(self.seed, (q, d)))))
        self._upper_cutoff()                # asked for by _first_block: its value now
        # one solve for V's block R⁻¹U, the probe's first step R⁻¹ P_U W and the
        # given right-hand sides' R⁻¹ P_U C
        p = min(PROBE_COLUMNS, q)
        W = blocks.gaussian(self.seed + 1, (q, p))
        parts = (U, blocks.project(U, W)) + (() if C is None else (blocks.project(U, C),))
        Y, YW, *YC = blocks.split(blocks.dense(self.inv(blocks.stacked(*parts))),
                                  *((d,) if C is None else (d, d + p)))
        # one scale for all columns: R V = U R_y⁻¹ is unchanged
        s = blocks.finite_absmax(Y)
        self._check_scale(s)
        V, Ry = blocks.orth(blocks.divided(Y, s))
        del Y
        RV = blocks.right_solve(blocks.divided(U, s), Ry)      # U R_y⁻¹ (R_y upper)
        self._conclude(U, V, RV, W, YW, C, YC[0] if YC else None)

    @staticmethod
    def _check_scale(s: float) -> None:
        """Raise :class:`NullspaceRefused` for a solved block's scale ``max|Y|`` that
        is not finite (a zero pivot) or zero."""
        if not np.isfinite(s):
            raise NullspaceRefused("non-finite solve (zero pivot)")
        if not s > 0:
            raise NullspaceRefused("zero block")

    def _conclude(self, U, V, RV, W, YW, C, YC) -> None:
        """The decision from the subspaces ``U_d``, ``V_d`` and ``R V_d = U_d R_y⁻¹``
        (``RV``): the residual's bound tested against the cutoff's range, then
        ``‖S‖`` by the probe, its first step ``P_V (R⁻¹ P_U W)`` from ``YW``; the
        given right-hand sides' ``R⁻¹ P_U C`` (``YC``) kept for the first solve."""
        blocks = self._blocks
        lo, hi = self.tol_range
        self.residual = blocks.fro(RV)
        if self.residual > 0.5 * lo and self.d <= NORM2_MAX_COLUMNS:
            self.residual = min(self.residual, norm2_upper(blocks.gram(RV), self.residual))
        if not (np.isfinite(self.residual) and self.residual <= 0.5 * hi):
            raise NullspaceRefused(f"‖R V_d‖ {self.residual:.3g} above half the cutoff "
                                   f"{hi:.3g}: no clear gap")
        self._u, self._v = U, V
        if C is not None:
            self._first = (C, YC)
        # ‖S‖ by the power method on SᵀS, its first step S W = P_V (R⁻¹ P_U W) from
        # the solve above
        self.nu, self.margin = probe_norm(self._apply_t, self._apply, self.q, xp=self.xp,
                                          accept=lambda nu, m: m * nu * hi < 1.0,
                                          start=(W, blocks.project(V, YW)))
        if not (np.isfinite(self.nu) and self.nu > 0 and self.margin * self.nu * lo < 1.0):
            raise NullspaceRefused(f"σ_(q-d) not clearly above the cutoff {lo:.3g}")
        self.sigma_min = 1.0 / self.nu
        self.rank = self.q - self.d

    def _queued_decision(self, rhs, rhs_device) -> Optional[tuple]:
        """The decision with the right-hand sides' ``Qᵀb`` replayed on the caller's
        stream while the device solves (GPU factors on the device whole).

        The device steps up to ``V_d`` are queued on :func:`_side_stream` first
        with nothing read back: ``Z = R⁻ᵀΩ`` and its scale ``max|Z|`` (kept on
        the device), ``U_d`` by both passes of CholeskyQR2
        (:meth:`_DeviceBlocks.orth_queued`), the solve ``R⁻¹[U_d, P_U W]``, its
        scale, and the first pass of V_d's CholeskyQR2 with its departure. Then
        ``rhs_device()`` launches ``Qᵀb``'s replay on the caller's stream (the
        host's launches of its many small kernels, which the chain's thin QR and
        solve would otherwise wait for), and ``R⁻¹ P_U C`` is queued behind it
        once ``U_d`` is made.
        Only then are the checks read, in :meth:`_first_block`'s and the solve's
        order, with their refusals; ``V_d``'s second pass (where ``orth`` takes
        it) and ``U_d R_y⁻¹`` follow. The values are the synchronous steps' to
        the bit where CholeskyQR2 takes two passes for ``U_d`` (one would do only
        for a block of condition near 1; either is orthonormal to working
        precision); ``V_d`` is ``orth``'s.

        Returns None once decided; ``(C, U_d)`` where CholeskyQR2 refused ``Z``'s
        block (Householder's ``U_d``, the host copy of C): the synchronous steps
        then go on from ``U_d``."""
        cp, blocks = self.xp, self._blocks
        q, d = self.q, self.d
        p = min(PROBE_COLUMNS, q)
        caller = cp.cuda.get_current_stream()
        side = _side_stream(cp)
        vectors = blocks.unit_vectors(d)    # before the side stream has work
        side.wait_event(caller.record())
        with side:
            Z = blocks.dense(self.inv_t(blocks.gaussian(self.seed, (q, d))))
            X, zscale, _ = blocks.scaled_by_absmax(Z)
            del Z
            first = blocks.orth_queued(X, vectors, want_r=False)
            u_made = side.record()
            W = blocks.gaussian(self.seed + 1, (q, p))
            Y, YW = blocks.split(blocks.dense(self.inv(blocks.stacked(
                first.Q, blocks.project(first.Q, W)))), d)
            Ys, yscale, svec = blocks.scaled_by_absmax(Y)
            del Y
            second = blocks.orth_queued(Ys, vectors, both=False)
        C = self._queued_rhs(rhs_device)    # Qᵀb's replay launched meanwhile
        YC = None
        if C is not None:
            caller.wait_event(u_made)
            YC = blocks.dense(self.inv(blocks.project(first.Q, C)))
            host = self._given_rhs(rhs)     # the host copy, waiting with that solve
            C = host if host is not None and host.shape == tuple(C.shape) else None
        # the checks, in the synchronous steps' order, read on the side stream (a read
        # waits for its stream's work only)
        with side:
            sz = blocks.read_absmax(zscale)
            self._upper_cutoff()
            self._check_scale(sz)
            U = blocks.dense(first.result()[0])
            if U is not first.Q:            # Householder's: the solve read another U_d
                caller.wait_event(side.record())
                return C, U
            del X, first
            self._check_scale(blocks.read_absmax(yscale))
            V, Ry = second.result()
            RV = blocks.right_solve(blocks.divide_columns(U, svec), Ry)   # U R_y⁻¹
            caller.wait_event(side.record())
        self._conclude(U, V, RV, W, YW, C, YC)
        return None

    def _first_block(self, Z):
        """``U_d = orth(Z)`` for ``Z = R⁻ᵀΩ`` (scaled by ``max|Z|`` first), on the
        current stream; raises :class:`NullspaceRefused` for a non-finite or zero
        Z, or where a pivot lies between the cutoff's bounds (``tol_range``'s
        ``hi``, asked for here, once Z is solved)."""
        blocks = self._blocks
        sz = blocks.finite_absmax(Z)
        self._upper_cutoff()
        self._check_scale(sz)
        U, _ = blocks.orth(blocks.divided(Z, sz), want_r=False)
        del Z
        return blocks.dense(U)

    def _first_block_beside(self, rhs) -> tuple:
        """``(C, U_d)``: ``R⁻ᵀΩ`` queued on :func:`_side_stream` (after the work
        queued so far on the caller's stream), ``rhs()`` fetched on the caller's
        stream meanwhile, then ``orth`` on the side stream, which the caller's
        stream waits for before its next work. One thread: the device runs the
        two solves' kernels side by side while the thread waits for the fetch.

        A block freed later goes back to the side stream's part of CuPy's pool,
        which that stream takes again only behind the next decision's wait for
        the caller's stream."""
        cp, blocks = self.xp, self._blocks
        caller = cp.cuda.get_current_stream()
        side = _side_stream(cp)
        side.wait_event(caller.record())
        with side:
            Z = blocks.dense(self.inv_t(blocks.gaussian(self.seed, (self.q, self.d))))
        C = self._given_rhs(rhs)
        with side:
            U = self._first_block(Z)
            done = side.record()
        caller.wait_event(done)
        return C, U

    def _upper_cutoff(self) -> float:
        """``hi`` of ``tol_range``, called for where it was given late."""
        lo, hi = self.tol_range
        if callable(hi):
            hi = float(hi())
            self.tol_range = (lo, hi)
        return hi

    def _queued_rhs(self, rhs_device):
        """The device block ``rhs_device()`` (q × p, p >= 1, queued on the caller's
        stream, not waited for); None without one, or for a block of another
        shape or over :data:`RHS_MAX_COLUMNS` columns (as :meth:`_given_rhs`)."""
        C = rhs_device()
        if C is None or C.ndim != 2 or int(C.shape[0]) != self.q \
                or not 0 < int(C.shape[1]) <= RHS_MAX_COLUMNS:
            return None
        return C

    def _given_rhs(self, rhs) -> Optional[np.ndarray]:
        """The host block ``rhs()`` (C-contiguous float64 q × p, p >= 1) for the
        solve with ``R⁻¹``; None without one, for G = Rᵀ (its solves start with
        ``R⁻ᵀ``), or for a block of another shape or over :data:`RHS_MAX_COLUMNS`
        columns."""
        if rhs is None or self.transposed:
            return None
        C = rhs()
        if C is None:
            return None
        C = np.ascontiguousarray(C, dtype=np.float64)
        if C.ndim != 2 or C.shape[0] != self.q or not 0 < C.shape[1] <= RHS_MAX_COLUMNS:
            return None
        return C

    def holds(self, tol: float) -> bool:
        """d singular values ``<= tol`` (``‖R V_d‖ <= tol/2``) and the others
        clearly above it (``M·ν·tol < 1``), for this cutoff."""
        return bool(self.residual <= 0.5 * tol and self.margin * self.nu * tol < 1.0)

    def certain(self) -> bool:
        """:meth:`holds` for every cutoff in ``tol_range``."""
        lo, hi = self.tol_range
        return bool(self.residual <= 0.5 * lo and self.margin * self.nu * hi < 1.0)

    # S = P_V R⁻¹ P_U and Sᵀ = P_U R⁻ᵀ P_V (projections twice: Gram–Schmidt with
    # reorthogonalization against a block whose components the solves amplify)
    def _apply(self, C):
        b = self._blocks
        return b.project(self._v, b.dense(self.inv(b.project(self._u, b.dense(C)))))

    def _apply_t(self, C):
        b = self._blocks
        return b.project(self._u, b.dense(self.inv_t(b.project(self._v, b.dense(C)))))

    def solve(self, C, matmul: Optional[Callable] = None) -> np.ndarray:
        """Minimum-norm ``Y`` with ``G Y ≈ C`` under the decided rank; C of shape (q, p).

        The first solve of the right-hand sides given as ``rhs`` (equal
        values) takes ``R⁻¹ P_U C`` from the decision's solve.

        ``matmul`` (``Y ↦ G Y`` on host arrays), where given, refines once with
        G's own residual, ``Y += S (C − G Y)``: the projections remove the
        components that the tiny pivots amplify only to the accuracy of the
        subspaces, and S maps the residual's unreachable part (along U_d) to
        nothing, so one step takes Y to the truncated solution's rounding level.
        """
        C = np.asarray(C, dtype=np.float64)
        if C.shape[1] == 0:
            return np.zeros((self.q, 0))
        apply = self._apply_t if self.transposed else self._apply
        first, self._first = self._first, None
        if first is not None and first[0].shape == C.shape and np.array_equal(first[0], C):
            # R⁻¹ P_U C came with the decision's solve
            b = self._blocks
            Y = np.ascontiguousarray(_host(b.project(self._v, b.dense(first[1]))))
        else:
            Y = np.ascontiguousarray(_host(apply(C)))
        if matmul is not None:
            Y += _host(apply(C - np.asarray(matmul(Y))))
        return Y
