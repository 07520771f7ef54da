"""``auto``'s iterations on the commonest input, with as little around them as SciPy has.

Most patched calls of ``lsqr``/``lsmr`` pass a SciPy CSR or CSC matrix of
float64 values and a float64 vector b, with no ``x0``, no damping and no
options object, under ``auto`` (by default or named). For those, :func:`quick_iterate` runs SciPy's algorithm
(:mod:`scipy_gpuqr._iterative`, on the caller's own matrix: bit for bit
SciPy's result) under ``auto``'s rule (:mod:`scipy_gpuqr._dispatch.iterate_first`)
after the few checks such input needs: its types, shapes and dtypes are seen
from the objects themselves, and DESIGN §10's finite check is one C
reduction per array. The full check of the problem
(:func:`~scipy_gpuqr._factor.least_squares.check_problem`: a canonical copy of
A, b copied) is made only when the QR is needed: when the rule plans the
factorization, or when the run ends without converging.

On a call of a few hundred microseconds the checks, the settings and the
decision around SciPy's algorithm are what separates ``auto`` from SciPy's
own function; this keeps that to a handful of calls. Every other input, and
runs that move to a GPU after their head start on the CPU, take the general
path (:func:`~scipy_gpuqr._factor.least_squares.iterate`), which answers alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from .._dispatch.iterate_first import (Allowance, HostFirst, analysis_seconds,
                                       cpu_iteration_seconds, host_first_budget,
                                       iterate_in_block, needs_watching)
from .._gpu import gpu_available
from .._iterative import lsmr as iterative_lsmr
from .._iterative import lsqr as iterative_lsqr
from .._iterative.block import block_lsmr, block_lsqr
from .._options import Settings, auto_settings, auto_source, log_decision
from .._validate import all_finite
from .factored import plan_for
from .least_squares import (IterativeAnswer, LeastSquaresProblem, StoppingRules, _RunNote,
                            check_problem, settle)
from .lstsq import DENSE_LIMIT, _rcond_estimate, lstsq_cutoff
from .solve_rank import (PROBE_COLUMNS, PROBE_MAX_STEPS, frobenius, probe_margin,
                         probe_norm)
from .triangular import UpperTriangular

__all__ = ["QuickRun", "quick_iterate", "clearly_full_rank", "speculate"]

#: The SciPy classes whose products our solvers run through SciPy's own kernels.
_COMPRESSED = (sp.csr_array, sp.csr_matrix, sp.csc_array, sp.csc_matrix)

_F64 = np.dtype(np.float64)


class QuickRun(NamedTuple):
    """What :func:`quick_iterate` did: SciPy's answer, or what the QR needs to answer."""

    found: Optional[IterativeAnswer]    # SciPy's tuple, or None: the QR answers
    planned: object                     # the factorization's plan, when the rule made it
    why: object                         # what happened, for the log (str() formats it)
    settings: Settings
    problem: Callable[[], LeastSquaresProblem]  # the checked problem (made on first call)
    square: object = None               # the square A's LU answer, where the call may use one


#: Backends whose factors are on the host, where R's condition is estimated.
_HOST_BACKENDS = ("cpu", "reference", "simulate")


def clearly_full_rank(R, cutoff: float) -> bool:
    """Whether square triangular R passes one of lstsq's cheap full-rank tests.

    The tests :class:`~scipy_gpuqr._factor.lstsq.MinNormSolver` makes first on
    a square R with a finite nonzero diagonal whose smallest entry is above
    the cutoff: the 1-norm reciprocal condition estimate at least
    ``10·q·cutoff``, else the randomized probe of ``‖R⁻¹‖₂`` through R's
    sparse triangular solves (:func:`~scipy_gpuqr._factor.solve_rank.probe_norm`:
    ``M·ν·cutoff·‖R‖_F < 1``, a few solves with 8 columns). Where one passes,
    the rank decision ends there (rank q, R⁻¹ solves), with no dense work.
    Made here only up to lstsq's ``DENSE_LIMIT`` (LAPACK's estimate on R
    made dense, a few milliseconds); beyond, the estimate takes sparse
    triangular solves whose cost is not bounded by the iterations' (False).
    """
    R = sp.csc_array(R)
    k, q = R.shape
    if k != q or q == 0 or q > DENSE_LIMIT:
        return False
    d = np.abs(R.diagonal())
    if not (np.all(np.isfinite(d)) and d.min() > 0 and d.min() > cutoff * d.max()):
        return False
    rcond = _rcond_estimate(R)
    if rcond >= 10.0 * q * cutoff:
        return True
    bound = cutoff * frobenius(R)
    # LAPACK's estimate of ‖R⁻¹‖₁ never exceeds it, so ‖R⁻¹‖₂ >= 1/(√q·rcond·‖R‖₁):
    # where that alone reaches 1/bound the probe cannot pass (but with its failure
    # probability), and is not run
    lower = 1.0 / (math.sqrt(q) * rcond * _norm1(R)) if rcond > 0 else math.inf
    if lower * bound >= 1.0:
        return False
    up, upt = UpperTriangular(R).solves()
    last = probe_margin(q, PROBE_MAX_STEPS, min(PROBE_COLUMNS, q))

    def accept(nu: float, margin: float) -> bool:
        if margin * nu * bound < 1.0:
            return True
        if last * nu * bound >= 1.0:    # ν only grows and the margins only shrink
            raise _Hopeless
        return False
    try:
        nu, margin = probe_norm(up, upt, q, accept=accept)
    except _Hopeless:
        return False
    return bool(np.isfinite(nu) and nu > 0 and margin * nu * bound < 1.0)


class _Hopeless(Exception):
    """The probe of :func:`clearly_full_rank` can no longer pass its test."""


def _norm1(R: sp.csc_array) -> float:
    """‖R‖₁: the largest column sum of magnitudes."""
    return float(np.abs(R).sum(axis=0).max()) if R.nnz else 0.0


def speculate(planned, shape) -> tuple:
    """Factorize with ``planned = (M, plan)`` now: ``(planned', clear)``.

    ``planned'`` hands the factors made here to the QR (its factorization
    returns them instead of factorizing again); ``clear`` says whether R is
    clearly of full rank (:func:`clearly_full_rank` with lstsq's cutoff for
    an A of ``shape``). Factors on a GPU are not examined (``clear`` False).
    """
    M, plan = planned
    num = plan.factorize(M, tol=None)
    kept = (M, dataclasses.replace(plan, factorize_fn=lambda *args, **kwargs: num))
    if plan.backend not in _HOST_BACKENDS:
        return kept, False
    return kept, clearly_full_rank(num.R, lstsq_cutoff(*shape))


def _eligible(A, b, x0, damp, gpuqr_options) -> bool:
    """The input is the common one: SciPy CSR/CSC float64 A with entries, float64 b of
    shape (m,), no x0, no damping, no options object."""
    if gpuqr_options is not None or x0 is not None:
        return False
    if type(A) not in _COMPRESSED or type(b) is not np.ndarray:
        return False
    if not (type(damp) in (float, int) and damp == 0):
        return False
    m, n = A.shape
    return (m > 0 and n > 0 and A.data.dtype == _F64 and b.dtype == _F64
            and b.shape == (m,))


def _longest_lines(A) -> int:
    """Entries of A's longest row plus its longest column (A CSR or CSC)."""
    nnz = int(A.indptr[-1])
    own = int(np.diff(A.indptr).max())
    other = int(np.bincount(A.indices[:nnz], minlength=A.shape[1 if A.format == "csr" else 0])
                .max()) if nnz else 0
    return own + other


def quick_iterate(method: str, A, b, x0, damp, rules: StoppingRules, backend,
                  gpuqr_options, square_of: Optional[Callable] = None) -> Optional[QuickRun]:
    """``auto``'s iterations for the common input, or None: the general path serves it.

    None when the input is not the common one (:func:`_eligible`), when A or
    b holds inf or NaN (the general path raises DESIGN §10's ValueError with
    its message), when the settings are not ``auto`` with ``iterate_first``
    (a backend named or from the environment), when the tolerances or the iteration
    limit leave nothing to iterate, or when the run moved to the GPU: where
    a GPU iteration beats a CPU one and a GPU answers, the run starts on the
    CPU and stops once it has cost one upload of A
    (:class:`~scipy_gpuqr._dispatch.iterate_first.HostFirst`); the general
    path then runs SciPy's algorithm from the start on the GPU. Where one GPU
    thread block suits the problem better
    (:func:`~scipy_gpuqr._dispatch.iterate_first.iterate_in_block`), the run
    moves there instead once the block would have saved its start and the
    iterations made again, and is answered here (:func:`~scipy_gpuqr._iterative.block.block_lsqr`).

    Parameters
    ----------
    method : {'lsqr', 'lsmr'}
    A, b, x0, damp
        The caller's arguments.
    rules : StoppingRules
    backend, gpuqr_options
        The caller's keyword-only additions.
    square_of : callable, optional
        ``square_of(shape, nnz, matrix) -> SquareLU or None``: the exact answer
        by SuperLU of a square A (:mod:`scipy_gpuqr._api.square_lu`), given the
        checked matrix's maker ``matrix()``; the rule may factorize it while
        the run goes on, and the QuickRun carries it.

    Returns
    -------
    QuickRun or None
    """
    if not _eligible(A, b, x0, damp, gpuqr_options):
        return None
    if not (all_finite(A.data) and all_finite(b)):
        return None
    source = auto_source(backend)       # no options object: iterate_first is on
    if source is None:
        return None
    settings = auto_settings(source)
    if not (rules.atol > 0 or rules.btol > 0):      # maximum precision: the QR answers
        return None
    m, n = A.shape
    nnz = int(A.indptr[-1])
    if rules.iter_lim is None:
        iter_lim = 2 * n if method == "lsqr" else min(m, n)
    else:
        iter_lim = int(rules.iter_lim)
    if iter_lim <= 0:
        return None
    cpu_s = cpu_iteration_seconds(m, n, nnz)
    block = iterate_in_block(m, n, nnz, on_gpu=False, longest=lambda: _longest_lines(A))
    budget = block[0] if block is not None else host_first_budget(m, n, nnz)
    if block is not None:
        where = (f"CPU first: one GPU thread block takes over once it would have saved its "
                 f"start (about {block[0]:.2g} s) and the iterations made again")
    elif budget is None:
        where = f"CPU: a CPU iteration (about {cpu_s:.2g} s) beats a GPU one"
    elif not gpu_available():
        budget, where = None, "CPU: no GPU"
    else:
        where = (f"CPU first: A is host data; the GPU takes over once the run has cost "
                 f"one upload of A (about {budget:.2g} s)")
    checked = []

    def problem() -> LeastSquaresProblem:
        if not checked:
            checked.append(check_problem(A, b, None, damp, func=method))
        return checked[0]

    analysis = analysis_seconds(m, n, nnz)
    square = None if square_of is None else \
        square_of((m, n), nnz, lambda: problem().matrix().A)
    def allowance() -> Allowance:
        return Allowance(iter_lim=iter_lim, atol=rules.atol, conlim=rules.conlim,
                         analysis=analysis,
                         plan=lambda: plan_for(problem().qr_matrix(), settings),
                         order=min(m, n),
                         speculate=(lambda planned: speculate(planned, (m, n)))
                         if min(m, n) <= DENSE_LIMIT else None,
                         square=square, nnz=nnz)

    watch = callback = None
    if needs_watching(iter_lim, m, n, nnz, on_gpu=False, analysis=analysis, host_loop=True):
        watch = allowance()
    callback = watch if budget is None else HostFirst(
        budget, watch, per_iteration=0.0 if block is None else block[1])
    if method == "lsqr":
        res = iterative_lsqr(A, b, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim, False,
                             rules.calc_var, None, xp=np, callback=callback)
    else:
        res = iterative_lsmr(A, b, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim, False,
                             None, xp=np, callback=callback)
    istop, itn = res.istop, res.itn
    name = f"{method.upper()} on CPU"
    if block is not None and callback.moved and istop == 0:
        # SciPy's algorithm again from the start, in one GPU thread block
        log_decision("%s %dx%d nnz=%d: LSQR/LSMR on CPU moves to one GPU thread block after %d "
                     "iterations (%.3g s, the block's start)", method, m, n, nnz, itn,
                     callback.seconds)
        # watched where the host run was (its rule, e.g. the square LU, applies there too)
        per_iteration = block[1]
        watch = allowance() if watch is not None or needs_watching(
            iter_lim, m, n, nnz, on_gpu=True, analysis=analysis,
            per_iteration=per_iteration) else None
        if method == "lsqr":
            res = block_lsqr(A, b, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim, False,
                             rules.calc_var, None, callback=watch)
        else:
            res = block_lsmr(A, b, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim, False,
                             None, callback=watch)
        istop, itn = res.istop, res.itn
        where = (f"GPU block: the run moved after {callback.seconds:.2g} s on the CPU "
                 f"(a block iteration about {per_iteration:.2g} s)")
        name = f"{method.upper()} on GPU (one block)"
    elif budget is not None and callback.moved and istop == 0:
        # the general path starts SciPy's algorithm again, on the GPU
        log_decision("%s %dx%d nnz=%d: LSQR/LSMR on CPU moves to the GPU after %d iterations "
                     "(%.3g s, one upload of A)", method, m, n, nnz, itn, callback.seconds)
        return None
    how = _RunNote(istop, itn, res.seconds, where, watch)
    outcome = settle(how, name, watch)
    if outcome == "qr":
        return QuickRun(None, None if watch is None else watch.planned, how, settings, problem,
                        square)
    log_decision("%s %dx%d nnz=%d: %s answered; %s", method, m, n, nnz, name, how)
    planned = None if watch is None or outcome == "stands" else watch.planned
    return QuickRun(IterativeAnswer(res.scipy_tuple(), name), planned, how, settings, problem,
                    square)
