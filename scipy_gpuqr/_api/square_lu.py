"""The exact answer of ``lsqr``/``lsmr`` on a square A by SciPy's SuperLU, where lstsq's rank rule allows it.

Under ``auto``, when SciPy's iterations do not answer, ``lsqr`` and ``lsmr``
give the minimum 2-norm least-squares solution: what
``numpy.linalg.lstsq(A.toarray(), b, rcond=None)`` returns, whose rank rule
counts singular values ``<= eps·max(m, n)·σ_max`` as zero (DESIGN §5). For a
square A whose smallest singular value lies above that cutoff the rule keeps
every column, and the answer is the unique solution ``A⁻¹ b``: an LU
factorization with pivoting gives it at working precision (backward error),
as the QR would, and SciPy's SuperLU (already ``spsolve``'s answer under
``auto``) factorizes such a matrix many times faster than a QR and its rank
decision (the LU's factors are far sparser than R).

:class:`SquareLU` makes that answer safe:

* SuperLU's own failure (an exactly singular factor) means the QR answers;
* the rank rule is checked on the LU's inverse as lstsq checks it on R's:
  the randomized probe of ``‖A⁻¹‖₂`` through the LU's solves
  (:func:`~scipy_gpuqr._factor.solve_rank.probe_norm`: ``‖A⁻¹‖₂ <= M·ν``
  except with probability 1e-10) must show ``M·ν·cutoff·‖A‖_F < 1``, which
  proves ``σ_min > cutoff·σ_max`` (``‖A‖_F >= σ_max``); a matrix near or below
  the cutoff fails it and the QR decides its rank;
* the solution's backward error ``‖b − A x‖ / (‖A‖_F·‖x‖ + ‖b‖)`` must be
  at most :data:`BACKWARD_LIMIT` (one step of refinement with the same
  factors where it is not), else the QR answers.

Where the factors show A not of full rank, U's pivots may still say how: a
few of them under lstsq's absolute cutoff and the rest clearly above
(:meth:`SquareLU.revealed_dead`) is the shape whose QR rank decision the
gap-checked sparse COD settles, which the iterate-first rule may weigh on a
GPU host (:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`). It is a
prediction only: the QR's own checks decide the rank.

Who may use it (:func:`square_lu`): ``auto`` only (explicit backends and
``GpuqrOptions(iterate_first=False)`` keep the QR), a square host A without
damping (``[A; damp·I]`` is not square) and without ``calc_var`` (the exact
variances need R), where ``spsolve`` itself would let SuperLU answer
(:func:`~scipy_gpuqr._dispatch.plan.superlu_at_once`: fewer than
``SUPERLU_ALWAYS_NNZ`` entries, or no GPU). The iterate-first rule
(:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`) may make the LU
while SciPy's run goes on (its prediction is :func:`lu_seconds`); the call
then answers from those factors, or factorizes at the end.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

from .._dispatch.plan import SUPERLU_ALWAYS_NNZ, gpu_unusable
from .._factor.host_norms import norm2
from .._factor.least_squares import LstsqAnswer, LstsqStart
from .._factor.lstsq import KnownNorms, lstsq_cutoff
from .._factor.solve_rank import (PROBE_COLUMNS, PROBE_MAX_STEPS, frobenius, probe_margin,
                                  probe_norm)
from .._factor.subspace_cod import sigma_max_lanczos

__all__ = ["SquareLU", "square_lu", "BACKWARD_LIMIT", "PIVOT_GAP", "REVEALED_MAX_FRACTION"]

_EPS = float(np.finfo(np.float64).eps)

#: Largest backward error ``‖b − A x‖ / (‖A‖_F·‖x‖ + ‖b‖)`` of the LU's answer,
#: in units of eps (LU with partial pivoting: a small multiple of eps where the
#: growth is modest; the QR's answers on the shared matrices lie below 1 eps).
BACKWARD_LIMIT = 64.0

#: :meth:`SquareLU.revealed_dead`: the smallest of U's pivots above lstsq's absolute
#: cutoff must lie at least this many times above it (the shared matrices whose U
#: shows dead pivots: adder_dcop_05 1.47, its gap-checked COD passes; reorientation_1
#: 1.08 and temp 1.29, a quarter of their columns or more under the cutoff) ...
PIVOT_GAP = 1.25
#: ... and at most this share of A's columns lie under it (lstsq's
#: ``NULLSPACE_MAX_FRACTION``: a few dependent columns, not a numerically
#: low-rank A).
REVEALED_MAX_FRACTION = 0.25


def _largest_column_norm(A) -> float:
    """The largest 2-norm of a column of sparse A (a lower bound of σ_max(A))."""
    A = sp.csc_array(A)
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()          # a column's duplicates add before they are squared
    if A.nnz == 0:
        return 0.0
    sums = np.add.reduceat(A.data * A.data, A.indptr[:-1][np.diff(A.indptr) > 0])
    return float(np.sqrt(sums.max()))


class SquareLU:
    """SuperLU's factors of a square A and whether they may answer (see the module notes).

    Parameters
    ----------
    matrix : callable
        ``matrix() -> csc_array``: the checked float64 A (made on first use:
        the call's canonical copy, which the QR would need as well).
    n : int
        A's order.

    Attributes
    ----------
    clear : bool or None
        None before :meth:`factor`; then whether the LU may answer.
    deficient : bool
        Whether the factorization showed that A is not of full rank by lstsq's
        rule as the QR's cheap tests read it: SuperLU found an exactly singular
        factor, or the probe's ν (a lower bound of ``‖A⁻¹‖₂``, and R's inverse
        has A's 2-norm) reached ``1/(cutoff·‖A‖_F)``. The QR's R then passes
        neither of those tests (:func:`~scipy_gpuqr._factor.quick_iterate.clearly_full_rank`),
        and its rank decision is dense work.
    singular : bool
        Whether SuperLU found an exactly singular factor (``deficient`` too):
        A's dependences are exact, so R's are likely a few pivots at rounding
        level, far below the cutoff, whose rank decision the null-space COD
        makes with a few solves (the rule may factorize ahead to see it).
    why : str
        What the factorization showed, for the log.
    seconds : float
        Seconds :meth:`factor` took.
    """

    def __init__(self, matrix: Callable[[], sp.csc_array], n: int):
        self._matrix = matrix
        self.n = int(n)
        self._clear: Optional[bool] = None
        self.deficient = False
        self.singular = False
        self._why = ""
        self.seconds = 0.0
        self._lu = None
        self._A = None
        self._factors = None            # SuperLU's factors, whether they may answer or not
        self._bound = 0.0               # lstsq's cutoff times ‖A‖_F (:meth:`factor`)
        self._revealed: Optional[int] = None
        self._probe: Optional[tuple] = None     # (ν, margin) of a probe that failed
        self._sigma_max: Optional[float] = None     # σ_max(A), where the pivot split ran Lanczos
        # held by whoever factorizes or reads U's pivots: a factorization ahead on a
        # worker (:meth:`factor_ahead`) and the caller's thread never both do
        self._lock = threading.RLock()
        self._ahead: Optional[threading.Thread] = None
        self._ahead_error: Optional[BaseException] = None
        self._declined = ""             # why the QR's factors answer instead (decline)

    @property
    def clear(self) -> Optional[bool]:
        """Whether the factors may answer (None: not factorized yet; False once
        declined, whatever a factorization ahead found)."""
        return False if self._declined else self._clear

    @property
    def why(self) -> str:
        """What the factorization showed, or why it was declined, for the log."""
        return self._declined or self._why

    def decline(self, why: str) -> None:
        """Not to answer (the QR's factors answer instead, ``why``): :meth:`factor` then
        answers False at once, also where a factorization ahead is still running (not
        waited for) or found A of full rank."""
        if self._clear is None and not self._declined:
            self._declined = why

    def factor(self) -> bool:
        """Factorize (once) and test lstsq's rank rule on the LU's inverse; ``clear``.

        Where :meth:`factor_ahead` started the work on a worker, waits for it and
        answers what it found (raising what it raised); once declined, answers
        False without waiting."""
        if self._declined:
            return False
        with self._lock:
            if self._ahead_error is not None:
                raise self._ahead_error
            if self._clear is not None:
                return self._clear
            t0 = time.perf_counter()
            try:
                self._clear = self._factor()
            finally:
                self.seconds = time.perf_counter() - t0
            return self._clear

    def factor_ahead(self, readings: bool = True) -> None:
        """Start :meth:`factor` on a worker thread (once), and with ``readings``, where
        the factors show A deficient without an exact singularity, read U's pivots as
        the rule may (:meth:`revealed_dead`, else :meth:`hides_deficiency`, σ_max by
        Lanczos): the iterate-first rule starts it while SciPy's run goes on, on a
        host with cores to spare, and its :meth:`factor` later finds the work done
        (or waits for the rest of it). An error is raised again by :meth:`factor`."""
        if self._ahead is not None or self._clear is not None or self._declined:
            return
        # the worker takes the lock before this returns: a factor() called after waits
        ready = threading.Event()
        self._ahead = threading.Thread(target=self._factor_ahead, args=(ready, readings),
                                       daemon=True, name="scipy_gpuqr-square-lu")
        self._ahead.start()
        ready.wait()

    def _factor_ahead(self, ready: threading.Event, readings: bool) -> None:
        with self._lock:
            ready.set()
            try:
                if self._clear is not None:
                    return
                t0 = time.perf_counter()
                try:
                    self._clear = self._factor()
                finally:
                    self.seconds = time.perf_counter() - t0
                if readings and self.deficient and not self.singular and \
                        not self.revealed_dead():
                    self.hides_deficiency()
            except BaseException as exc:     # noqa: BLE001 - raised again by factor()
                self._ahead_error = exc

    def _factor(self) -> bool:
        A = self._A = self._matrix()
        n = self.n
        try:
            lu = splu(A)
        except RuntimeError as exc:     # SuperLU: "Factor is exactly singular"
            self._why = f"SuperLU: {exc}"
            self.deficient = self.singular = True
            return False
        self._factors = lu
        bound = self._bound = lstsq_cutoff(n, n) * frobenius(A)

        def apply(C):
            return lu.solve(np.asarray(C))

        def apply_t(C):
            return lu.solve(np.asarray(C), trans="T")

        last = probe_margin(n, PROBE_MAX_STEPS, min(PROBE_COLUMNS, n))

        def accept(nu: float, margin: float) -> bool:
            # ν only grows and the margins only shrink: past the last step's margin
            # the test cannot pass, and the remaining solves are not made
            return margin * nu * bound < 1.0 or last * nu * bound >= 1.0
        nu, margin = probe_norm(apply, apply_t, n, accept=accept)
        if not (math.isfinite(nu) and nu > 0 and margin * nu * bound < 1.0):
            self.deficient = not math.isfinite(nu) or nu * bound >= 1.0
            if math.isfinite(nu) and nu > 0:
                self._probe = (float(nu), float(margin))
            self._why = (f"SuperLU's factors do not show full rank by lstsq's rule "
                        f"(‖A⁻¹‖₂ >= {nu:.3g}, bound {1 / bound:.3g} with margin {margin:.3g})")
            return False
        self._lu, self._nu = lu, nu
        self._why = (f"of full rank by lstsq's rule (‖A⁻¹‖₂ <= {margin * nu:.3g} < "
                    f"1/(eps·n·‖A‖_F) = {1 / bound:.3g})")
        return True

    def revealed_dead(self) -> int:
        """How many of U's pivots show A's deficiency, or 0: where SuperLU's factors
        (made by :meth:`factor`, not exactly singular) have ``k`` pivots at most
        lstsq's absolute cutoff ``eps·n·σ_max`` (σ_max by Lanczos on A) and every
        other pivot at least :data:`PIVOT_GAP` times above it, with ``k`` at most
        :data:`REVEALED_MAX_FRACTION` of n, ``k``; computed once, where asked.

        U's pivots are not A's singular values: this predicts, it does not
        decide. Partial pivoting puts an exactly dependent column's rounding-level
        remainder on the diagonal, and so a column whose dependence lies just
        under the cutoff tends to leave a pivot just under it; a spectrum that
        falls through the cutoff without a gap leaves U's pivots spread across
        it, or none under it (nnc1374: 66 singular values under the cutoff, no
        pivot under it). Where the pivots split cleanly, the QR's R tends to
        split at the same place, which its gap-checked sparse COD confirms
        (``‖E‖₂ <= tol < σ_min(R11)``) or refuses.
        """
        with self._lock:
            if self._revealed is None:
                self._revealed = self._pivot_split()
            return self._revealed

    def hides_deficiency(self) -> bool:
        """Whether SuperLU's factors (made by :meth:`factor`, deficient, not exactly
        singular) show A's deficiency by none of U's pivots: none at most lstsq's
        absolute cutoff ``eps·n·σ_max`` (σ_max by Lanczos on A, that of
        :meth:`revealed_dead` where it ran; not run where no pivot lies under the
        cutoff's bound with ``‖A‖_F``). nnc1374: 66 singular values under the cutoff,
        no pivot there. Such singular values hide among R's pivots as well, where
        Heath's greedy rule (the gap-checked sparse COD) misses them and R's small
        singular subspace finds them. It predicts, it does not decide."""
        with self._lock:
            return self._hides_deficiency()

    def _hides_deficiency(self) -> bool:
        lu, A, n = self._factors, self._A, self.n
        if lu is None or A is None or not self.deficient or self.singular:
            return False
        d = np.abs(lu.U.diagonal())
        if not (d.size == n and np.all(np.isfinite(d))):
            return False
        if not np.any(d <= self._bound):
            return True
        if self._sigma_max is None:
            self._sigma_max = sigma_max_lanczos(A)
        return not bool(np.any(d <= lstsq_cutoff(n, n) * self._sigma_max))

    def pivots_under_cutoff(self) -> int:
        """How many of U's pivots lie at most lstsq's absolute cutoff ``eps·n·σ_max``
        (σ_max by Lanczos on A, that of :meth:`revealed_dead` where it ran; not run where
        no pivot lies under the cutoff's bound with ``‖A‖_F``), split or not; 0 where
        the factors were not made (or A is exactly singular for SuperLU). A prediction
        of how many of R's pivots lie there (bayer10: 73 of U's, 74 of R's, 133 singular
        values under the cutoff), whose block R's small singular subspace starts with."""
        with self._lock:
            d = self._diagonal()
            if d is None or not np.any(d <= self._bound):
                return 0
            if self._sigma_max is None:
                self._sigma_max = sigma_max_lanczos(self._A)
            return int(np.count_nonzero(d <= lstsq_cutoff(self.n, self.n) * self._sigma_max))

    def _diagonal(self) -> Optional[np.ndarray]:
        """|U's diagonal| where the factors were made and it is finite, else None."""
        lu, A, n = self._factors, self._A, self.n
        if lu is None or A is None:
            return None
        d = np.abs(lu.U.diagonal())
        return d if d.size == n and np.all(np.isfinite(d)) else None

    def _pivot_split(self) -> int:
        d, n = self._diagonal(), self.n
        # σ_max <= ‖A‖_F: no pivot under cutoff·‖A‖_F (factor's bound), none under
        # the cutoff (no Lanczos run)
        if d is None or not np.any(d <= self._bound):
            return 0
        cutoff = lstsq_cutoff(n, n)
        if self._sigma_max is None:
            # σ_max >= A's largest column norm: where that many pivots already lie under the
            # cutoff, too many lie under it for a split (no Lanczos run)
            under = int(np.count_nonzero(d <= cutoff * _largest_column_norm(self._A)))
            if under > REVEALED_MAX_FRACTION * n or under == n:
                return 0
            self._sigma_max = sigma_max_lanczos(self._A)
        tol = cutoff * self._sigma_max
        dead = int(np.count_nonzero(d <= tol))
        if dead == 0 or dead > REVEALED_MAX_FRACTION * n or dead == n:
            return 0
        return dead if float(d[d > tol].min()) >= PIVOT_GAP * tol else 0

    def known_norms(self) -> Optional[KnownNorms]:
        """What the LU learnt of A's norms for the QR's rank decision, where it did not
        answer (R has A's singular values): the probe's ν of ``‖A⁻¹‖₂`` that did not
        confirm full rank, and σ_max(A) where :meth:`revealed_dead` computed it; None
        where it learnt neither (not factorized, exactly singular, or it answered)."""
        if self.clear is not False or (self._probe is None and self._sigma_max is None):
            return None
        return KnownNorms(sigma_max=self._sigma_max, inverse_norm=self._probe)

    def answer(self, begin: LstsqStart, x0) -> Optional[LstsqAnswer]:
        """The answer ``x0 + A⁻¹ r0`` with SciPy's norms (factorizing first where
        :meth:`factor` was not called), or None: the QR answers (``why`` says why)."""
        if not self.factor():
            return None
        A, lu, r0 = self._A, self._lu, np.asarray(begin.r0, dtype=np.float64)
        anorm = frobenius(A)
        dx = lu.solve(r0)
        r = r0 - A @ dx
        limit = BACKWARD_LIMIT * _EPS
        bnorm0 = norm2(r0)
        for refine in (True, False):
            rnorm = norm2(r)
            if rnorm <= limit * (anorm * norm2(dx) + bnorm0):
                break
            if not refine:
                self._why = (f"SuperLU's answer has backward error "
                            f"{rnorm / (anorm * norm2(dx) + bnorm0):.3g} "
                            f"after one refinement (limit {limit:.3g})")
                self._clear = False
                return None
            dx = dx + lu.solve(r)
            r = r0 - A @ dx
        x = dx.copy() if x0 is None else np.asarray(x0, dtype=np.float64) + dx
        rnorm = norm2(r)
        arnorm = norm2(A.T @ r)
        return LstsqAnswer(x, dx, rnorm, rnorm, anorm, anorm * self._nu, arnorm,
                           begin.bnorm, np.zeros(self.n), None)


def square_lu(shape, nnz: int, damp, calc_var: bool, on_gpu: bool,
              matrix: Callable[[], sp.csc_array]) -> Optional[SquareLU]:
    """A :class:`SquareLU` where the call may use one (``auto``'s caller checks the
    settings), else None: square A, no damping, no ``calc_var``, host data, and
    SuperLU would answer ``spsolve`` on it (fewer than ``SUPERLU_ALWAYS_NNZ``
    entries, or no GPU)."""
    m, n = shape
    if m != n or n == 0 or damp != 0 or calc_var or on_gpu:
        return None
    if nnz >= SUPERLU_ALWAYS_NNZ and gpu_unusable(None)[0] is None:
        return None
    return SquareLU(matrix, n)
