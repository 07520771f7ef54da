"""``auto``'s iterations on the commonest input, with as little around them as SciPy has.

Most patched calls of ``lsqr``/``lsmr`` pass a SciPy CSR or CSC matrix of
float64 values and a float64 vector b, with no ``x0``, no damping and no
options object, under ``auto`` (by default or named). For those,
:func:`quick_iterate` runs SciPy's algorithm in the host loops
(:mod:`scipy_gpuqr._iterative.host`, on the caller's own matrix: bit for bit
SciPy's result) under ``auto``'s rule (:mod:`scipy_gpuqr._dispatch.iterate_first`)
after the few checks such input needs: its types, shapes and dtypes are seen
from the objects themselves, and DESIGN §10's finite check is one C
reduction per array, or, for a run no GPU could take, the compiled loops'
first pass over A's values and b. The checked problem the QR needs
(:class:`~scipy_gpuqr._factor.least_squares.LeastSquaresProblem`: b copied, the
canonical copy of A made on first use) is made only when the QR is needed: when
the rule plans the factorization, or when the run ends without converging; from
what those checks found, without
:func:`~scipy_gpuqr._factor.least_squares.check_problem` going over A and b again.

On a call of a few hundred microseconds the checks, the settings and the
decision around SciPy's algorithm are what separates ``auto`` from SciPy's
own function; this keeps that to a handful of calls, and makes what only
some runs need where they need it: whether a GPU answers (asked where a GPU
could take the run), A's longest lines (where a GPU thread block could),
the square A's LU answer (where the rule watches the run or the QR answers),
the log's text (where the log is written). Every other input, and
runs that move to the CuPy path on a GPU after their head start on the CPU,
take the general path (:func:`~scipy_gpuqr._factor.least_squares.iterate`),
which answers alike; a run that moves to one GPU thread block goes on there
from the CPU's last iteration and is answered here.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from .._dispatch.iterate_first import (CLEAR_DEAD_PIVOTS, CLEAR_FULL_RANK, Allowance,
                                       analysis_seconds, needs_watching)
from .._dispatch.lu_route import SUBSPACE_GPU_PLAN_REASON
from .._dispatch.placement import (BLOCK_MIN_NNZ, BLOCK_RENT, HostFirst, cpu_iteration_seconds,
                                   host_first_budget, iterate_in_block)
from .._gpu import gpu_available
from .._iterative.block import block_lsmr, block_lsqr
from .._iterative._common import format_kernels
from .._iterative.host import HostProblem, NotFinite, lsmr_host, lsqr_host
from .._options import Settings, auto_settings, auto_source, log_decision
from .._validate import all_finite
from .factored import plan_for
from .least_squares import (IterativeAnswer, LeastSquaresProblem, StoppingRules, _RunNote,
                            settle)
from .lstsq import (DENSE_LIMIT, _rcond_estimate, device_subspace_takes,
                    host_factors_sigma_pays, lstsq_cutoff, nullspace_candidate)
from .native import at_hand as sweeps_at_hand
from .qr_ahead import QRAhead, qr_ahead_fits
from .solve_rank import (PROBE_COLUMNS, PROBE_MAX_STEPS, frobenius, probe_margin,
                         probe_norm)
from .triangular import UpperTriangular

__all__ = ["QuickRun", "quick_iterate", "clearly_full_rank", "speculate"]

#: The SciPy classes whose products our solvers run through SciPy's own kernels.
_COMPRESSED = (sp.csr_array, sp.csr_matrix, sp.csc_array, sp.csc_matrix)

#: Who answers a run of the host loops, by method.
_ON_CPU = {"lsqr": "LSQR on CPU", "lsmr": "LSMR on CPU"}

_F64 = np.dtype(np.float64)


class QuickRun(NamedTuple):
    """What :func:`quick_iterate` did: SciPy's answer, or what the QR needs to answer."""

    found: Optional[IterativeAnswer]    # SciPy's tuple, or None: the QR answers
    planned: object                     # the factorization's plan, when the rule made it
    why: object                         # what happened, for the log (str() formats it)
    settings: Settings
    problem: Callable[[], LeastSquaresProblem]  # the checked problem (made on first call)
    square: object = None               # the square A's LU answer, where the call may use one
                                        # (with SciPy's answer: only where the run made it)
    ahead: Optional[QRAhead] = None     # the QR made on a worker beside the run, where one ran


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
    returns them instead of factorizing again); ``clear`` says why R's rank
    decision costs no dense work, or is '' where it may:
    :data:`~scipy_gpuqr._dispatch.iterate_first.CLEAR_FULL_RANK` (R clearly of
    full rank: :func:`clearly_full_rank` with lstsq's cutoff for an A of
    ``shape``) or :data:`~scipy_gpuqr._dispatch.iterate_first.CLEAR_DEAD_PIVOTS`
    (a few pivots below the cutoff and the rest clearly above:
    :func:`~scipy_gpuqr._factor.lstsq.nullspace_candidate`, the null-space COD's
    few solves). Factors on a GPU are not examined ('').
    """
    M, plan = planned
    num = plan.factorize(M, tol=None)
    kept = (M, plan.with_factors(M, num))
    if plan.backend not in _HOST_BACKENDS:
        return kept, ""
    cutoff = lstsq_cutoff(*shape)
    if clearly_full_rank(num.R, cutoff):
        return kept, CLEAR_FULL_RANK
    if nullspace_candidate(num.R, cutoff):
        return kept, CLEAR_DEAD_PIVOTS
    return kept, ""


def _eligible(A, b, x0, damp, gpuqr_options) -> bool:
    """The input is the common one: SciPy CSR/CSC float64 A with entries, float64 b of
    shape (m,), no x0, no damping, no options object."""
    if gpuqr_options is not None or x0 is not None:
        return False
    if type(A) not in _COMPRESSED or type(b) is not np.ndarray:
        return False
    if not (type(damp) in (float, int) and damp == 0):
        return False
    shape = A.shape
    if len(shape) != 2:             # a one-dimensional CSR array: the general path's error
        return False
    m, n = shape
    return (m > 0 and n > 0 and A.data.dtype == _F64 and b.dtype == _F64
            and b.shape == (m,))


def _checked_problem(A, b: np.ndarray, m: int, n: int, nnz: int) -> LeastSquaresProblem:
    """What :func:`~scipy_gpuqr._factor.least_squares.check_problem` makes of the common
    input (:func:`_eligible`) whose values were found finite (before the run, or in
    the loops' first pass, which ends before anything asks for the problem): the
    caller's A as the iterations' operand, a float64 copy of b, no x0, no damping;
    its checks are not made a second time."""
    return LeastSquaresProblem(A=A, shape=(m, n), nnz=nnz, dtype=_F64, on_gpu=False,
                               b=b.astype(np.float64), b_dtype=_F64, x0=None, damp=0.0)


#: :data:`~scipy_gpuqr._dispatch.placement.BLOCK_RENT` as the decision log writes it.
_RENT_TEXT = f"{BLOCK_RENT:.2g}"


class _Where:
    """Where a run ran and why, for the decision log: ``text`` formatted with ``value``
    only when the log is written."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: float):
        self.text, self.value = text, value

    def __str__(self) -> str:
        return self.text % self.value


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
    (:class:`~scipy_gpuqr._dispatch.placement.HostFirst`); the general
    path then runs SciPy's algorithm from the start on the GPU. Where one GPU
    thread block suits the problem better
    (:func:`~scipy_gpuqr._dispatch.placement.iterate_in_block`), the run
    moves there instead once its CPU iterations have cost the block's start
    beyond the block's own seconds for them, goes on there from its last
    iteration (the host loop's state handed on:
    :class:`~scipy_gpuqr._iterative.host.Handoff`; ``itn`` counts the CPU's
    iterations, the watcher's history goes on across the move) and is
    answered here (:func:`~scipy_gpuqr._iterative.block.block_lsqr`).

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
    m, n = A.shape
    nnz = int(A.indptr[-1])
    upload = host_first_budget(m, n, nnz)
    # A run that no GPU could take checks A and b in the loops' first pass (where
    # they are compiled): no call of its own beside a short run. Any other input
    # is checked here, before a GPU is asked for.
    deferred = nnz < BLOCK_MIN_NNZ and upload is None
    if not (deferred or (all_finite(A.data) and all_finite(b))):
        return None
    source = auto_source(backend)       # no options object: iterate_first is on
    if source is None:
        return None
    if not (rules.atol > 0 or rules.btol > 0):      # maximum precision: the QR answers
        return None
    if rules.iter_lim is None:
        iter_lim = 2 * n if method == "lsqr" else min(m, n)
    else:
        iter_lim = int(rules.iter_lim)
    if iter_lim <= 0:
        return None
    kernels = format_kernels(A.format)     # _eligible took a float64 CSR/CSC A
    if kernels is None:
        return None
    settings = auto_settings(source)
    known_gpu = []

    def gpu() -> bool:                  # asked at most once a call, and only where it counts
        if not known_gpu:
            known_gpu.append(gpu_available())
        return known_gpu[0]

    # A's longest lines (a pass over its indices) only where a GPU could take the run
    block = None if nnz >= BLOCK_MIN_NNZ and not gpu() else \
        iterate_in_block(m, n, nnz, on_gpu=False, longest=lambda: _longest_lines(A))
    if block is not None:
        budget = block[0]
        where = _Where("CPU first: one GPU thread block goes on from the CPU's last iteration "
                       "once the CPU's iterations have cost " + _RENT_TEXT + " times its start "
                       "(about %.2g s) beyond its own", budget)
    else:
        budget = upload
        if budget is None:
            where = _Where("CPU: a CPU iteration (about %.2g s) beats a GPU one",
                           cpu_iteration_seconds(m, n, nnz))
        elif not gpu():
            budget, where = None, "CPU: no GPU"
        else:
            where = _Where("CPU first: A is host data; the GPU takes over once the run has "
                           "cost one upload of A (about %.2g s)", budget)
    checked = []

    def problem() -> LeastSquaresProblem:
        if not checked:
            checked.append(_checked_problem(A, b, m, n, nnz))
        return checked[0]

    squares = []

    def square():                       # the square A's LU answer, made where first needed
        if not squares:
            squares.append(None if square_of is None else
                           square_of((m, n), nnz, lambda: problem().matrix().A))
        return squares[0]

    analysis = analysis_seconds(m, n, nnz)

    def allowance() -> Allowance:
        return Allowance(iter_lim=iter_lim, atol=rules.atol, conlim=rules.conlim,
                         analysis=analysis,
                         plan=lambda: plan_for(problem().qr_matrix(), settings),
                         order=min(m, n),
                         speculate=(lambda planned: speculate(planned, (m, n)))
                         if min(m, n) <= DENSE_LIMIT else None,
                         square=square(), nnz=nnz, dense_gpu=gpu,
                         device_subspace=device_subspace_takes,
                         host_sweeps=sweeps_at_hand, host_sigma=host_factors_sigma_pays,
                         plan_gpu=lambda: plan_for(problem().qr_matrix(), settings,
                                                   gpu_reason=SUBSPACE_GPU_PLAN_REASON))

    watch = None
    if needs_watching(iter_lim, m, n, nnz, on_gpu=False, analysis=analysis, host_loop=True):
        watch = allowance()
    callback = watch if budget is None else HostFirst(
        budget, watch, per_iteration=0.0 if block is None else block[1], rent=BLOCK_RENT)
    # a short run on the CPU whose stall the QR answers: the QR made beside it, where a
    # host has cores to spare (not for a square A, whose exact answer may be the LU's)
    ahead = None
    if callback is None and block is None and (m != n or square_of is None) and \
            qr_ahead_fits((m, n), nnz, iter_lim):
        ahead = callback = QRAhead(problem, settings, iter_lim=iter_lim,
                                   calc_var=method == "lsqr" and rules.calc_var)
    forward, backward = kernels
    host = HostProblem(m, n, forward, backward, (A.indptr, A.indices, A.data), b, None,
                       unchecked=deferred)
    try:
        if method == "lsqr":
            fields, info = lsqr_host(host, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim,
                                     rules.calc_var, callback=callback,
                                     handoff=block is not None)
        else:
            fields, info = lsmr_host(host, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim,
                                     callback=callback, handoff=block is not None)
    except NotFinite:                   # the general path raises DESIGN §10's ValueError
        if ahead is not None:
            ahead.cancel()
        return None
    istop, itn, seconds = fields[1], fields[2], info["seconds"]
    name = _ON_CPU[method]
    if block is not None and callback.moved and istop == 0:
        # SciPy's algorithm goes on in one GPU thread block from the CPU's last iteration
        log_decision("%s %dx%d nnz=%d: LSQR/LSMR on CPU moves to one GPU thread block after %d "
                     "iterations (%.3g s, the block's start beyond its own); the block goes on "
                     "from there", method, m, n, nnz, itn, callback.seconds)
        handoff = info.get("handoff")
        per_iteration = block[1]
        # watched where the host run was (its rule, e.g. the square LU, applies there too):
        # by the same watcher, whose history goes on with the block's iterations
        if watch is not None and handoff is not None:
            watch.catch_up((callback.last,))        # the iteration that moved the run
        else:
            watch = allowance() if watch is not None or needs_watching(
                iter_lim, m, n, nnz, on_gpu=True, analysis=analysis,
                per_iteration=per_iteration) else None
        if method == "lsqr":
            res = block_lsqr(A, b, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim, False,
                             rules.calc_var, None, callback=watch, resume=handoff)
        else:
            res = block_lsmr(A, b, 0.0, rules.atol, rules.btol, rules.conlim, iter_lim, False,
                             None, callback=watch, resume=handoff)
        where = (f"GPU block: the run went on there after {itn} iterations "
                 f"({callback.seconds:.2g} s) on the CPU (a block iteration about "
                 f"{per_iteration:.2g} s)")
        istop, itn, seconds, fields = res.istop, res.itn, res.seconds, res.scipy_tuple()
        name = f"{method.upper()} on GPU (one block)"
    elif budget is not None and callback.moved and istop == 0:
        # the general path starts SciPy's algorithm again, on the GPU
        log_decision("%s %dx%d nnz=%d: LSQR/LSMR on CPU moves to the GPU after %d iterations "
                     "(%.3g s, one upload of A)", method, m, n, nnz, itn, callback.seconds)
        return None
    how = _RunNote(istop, itn, seconds, where, watch)
    outcome = settle(how, name, watch)
    if outcome == "qr":
        return QuickRun(None, None if watch is None else watch.planned, how, settings, problem,
                        square(), ahead)
    if ahead is not None:
        ahead.cancel()                  # SciPy's answer stands: the worker is not waited for
    log_decision("%s %dx%d nnz=%d: %s answered; %s", method, m, n, nnz, name, how)
    planned = None if watch is None or outcome == "stands" else watch.planned
    return QuickRun(IterativeAnswer(fields, name), planned, how, settings, problem,
                    squares[0] if squares else None)
