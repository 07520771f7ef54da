"""SciPy's LSQR and LSMR on the host, with less Python around each iteration.

On NumPy, for a SciPy CSR or CSC matrix of float64 values, :func:`lsqr_host`
and :func:`lsmr_host` run the statements of ``scipy.sparse.linalg.lsqr`` and
``lsmr`` one for one — the same floating-point operations on the same values
in the same order — so that every iterate, and the returned tuple, is
SciPy's bit for bit. What differs is only what surrounds the arithmetic:

* **Products.** SciPy's ``A.matvec(v)`` and ``A.rmatvec(u)`` end in one call
  of SciPy's compiled kernel (``_sparsetools.csr_matvec``/``csc_matvec``,
  the transpose's kernel for ``rmatvec``) that adds the products into a
  vector of zeros. That call is made here directly, into a buffer set to
  zero, without the LinearOperator's reshapes and checks.
* **Vectors.** Every vector statement is made in place with the same
  elementwise operation: ``x = x + t·w`` is ``tmp = t·w; x += tmp``,
  ``u = A v − alfa·u`` is ``u *= alfa; u = Av − u`` (``a·u`` and ``u·a`` are
  the same product, ``a − b`` the same difference). No new vector is made
  per iteration.
* **Norms.** ``numpy.linalg.norm(v)`` of a real vector is ``sqrt(v.dot(v))``;
  the dot product is made with the same call (the same BLAS routine on the
  same operands, so the same sum).
* **Scalars.** SciPy's recurrences run on NumPy float64 scalars (its norms
  return them); here they run on Python floats, whose ``+ − × ÷``, ``sqrt``
  and ``**`` are the same IEEE operations (both call the C library's ``pow``
  for ``**``) at a fraction of the cost. The two differ only where NumPy
  returns inf or NaN with a warning and Python raises (division by zero,
  ``**`` overflowing). When that happens the run is replayed from its start
  with NumPy's scalars — exactly SciPy's statements on SciPy's types — and
  the iterations already reported to the callback are not reported again.
  Tolerances and damping of other types than Python float/int and NumPy
  float64 (float32 promotes differently) take NumPy's scalars from the start.

Where a C compiler built them and their checks passed
(:mod:`~scipy_gpuqr._iterative.native`), the whole loop of a run with Python
floats' arguments runs compiled: the same operations again (SciPy's product
loops, NumPy's own BLAS ``ddot`` for the norms, the C library's ``pow``),
without Python between them. A compiled run that meets what would make
Python raise gives up, and the loops here run the problem from its start.

A run asked for its ``handoff`` that stops before SciPy's tests do (its
callback, its allowance) also returns where it stopped (:class:`Handoff`:
every scalar of the recurrences and the vectors after its last iteration),
from which a run elsewhere goes on at the next iteration
(:func:`scipy_gpuqr._iterative.block.block_lsqr`'s ``resume``) instead of
making these iterations again.

A callback sees the same :class:`~scipy_gpuqr._iterative._common.IterationState`
per iteration as with :func:`~scipy_gpuqr._iterative._common.drive`, and
stops the run the same way (from the compiled loops, through a C callback);
the run attributes of the result
(:class:`~scipy_gpuqr._iterative._common.RunInfo`) mean the same. A callback
that says when it would next act (auto's rule) is told, by the compiled loops,
only the iterations from then on and the skipped ones in one piece
(:func:`_reporter`): a Python call per iteration cost about as much as a small
problem's iteration.
"""

from __future__ import annotations

import math
from collections import deque
from ctypes import addressof as _addressof, c_char as _c_char
from time import perf_counter as _now
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import native as _native
from .native import HANDOFF_SCALARS
from ._common import (PROJECTION_WINDOW, Clock, IterationState, Progress, compressed_kernels,
                      givens, stopping_code)
from ._common import _sparsetools       # SciPy's compiled sparse kernels, or None
from .._validate import all_finite

__all__ = ["HostProblem", "NotFinite", "HANDOFF_SCALARS", "HANDOFF_VECTORS", "Handoff",
           "host_problem", "lsqr_host", "lsmr_host"]

#: The scalar types whose arithmetic with Python floats is NumPy float64's.
_PLAIN = (float, int, np.float64)

#: Index types of the matrices the compiled loops take.
_INDEX = (np.dtype(np.int32), np.dtype(np.int64))
#: Longest vectors the compiled loops take (a 32-bit BLAS reads 32-bit lengths).
_LONGEST = 2 ** 31 - 1

#: SciPy's ``eps`` in ``lsqr`` (a NumPy scalar), and as a Python float.
_EPS = np.finfo(np.float64).eps
_EPS_FLOAT = float(_EPS)


#: The vectors a run hands on besides x (and LSQR's var), named as in SciPy; u and v as
#: SciPy keeps them (normalized where their norm is not 0).
HANDOFF_VECTORS = {"lsqr": ("u", "v", "w"), "lsmr": ("u", "v", "h", "hbar")}


class Handoff(NamedTuple):
    """Where a host run stopped before SciPy's tests did: what a run that goes on from
    iteration ``itn + 1`` elsewhere needs to make SciPy's next iterates.

    Attributes
    ----------
    method : {'lsqr', 'lsmr'}
    itn : int
        Iterations made (at least one).
    scalars : dict
        :data:`HANDOFF_SCALARS` of ``method`` -> float, after iteration ``itn``.
    vectors : dict
        :data:`HANDOFF_VECTORS` of ``method`` -> float64 ndarray.
    x : ndarray
        The iterate (the run's own x, also its result's).
    var : ndarray or None
        LSQR's ``var`` (zeros without ``calc_var``); None for LSMR.
    tests : tuple
        ``(test1, test2, rtol)`` of the last iterations (at most
        :data:`~scipy_gpuqr._iterative._common.PROJECTION_WINDOW`, oldest first): the
        projection of the run that goes on is fitted to them and its own.
    seconds : float
        The run's seconds when it stopped.
    """

    method: str
    itn: int
    scalars: dict
    vectors: dict
    x: np.ndarray
    var: Optional[np.ndarray]
    tests: tuple
    seconds: float


def _handoff(run: "_Run", method: str, itn: int, scalars, vectors, x, var) -> None:
    """Keep ``run``'s :class:`Handoff` where it was asked for (``scalars`` and ``vectors``
    in :data:`HANDOFF_SCALARS`' and :data:`HANDOFF_VECTORS`' order)."""
    run.handoff = Handoff(method, int(itn),
                          dict(zip(HANDOFF_SCALARS[method], (float(v) for v in scalars))),
                          dict(zip(HANDOFF_VECTORS[method], vectors)), x, var,
                          tuple(run.history), run.clock.elapsed())


class HostProblem:
    """A SciPy CSR/CSC float64 A's kernel arguments, b and x0 (float64, 1-D).

    Attributes
    ----------
    m, n : int
    forward, backward : callable
        SciPy's compiled kernels of ``A v`` and ``Aᵀ u``.
    arrays : tuple
        ``(indptr, indices, data)`` of A, as SciPy passes them.
    b : ndarray, shape (m,)
    x0 : ndarray, shape (n,), or None
        A private copy.
    unchecked : bool
        A's values and b are not yet known to be finite: the run checks them
        before anything else (in the compiled loops' first pass, else with
        :func:`~scipy_gpuqr._validate.all_finite`) and raises
        :class:`NotFinite` where one is not.
    """

    __slots__ = ("m", "n", "forward", "backward", "arrays", "b", "x0", "unchecked")

    def __init__(self, m, n, forward, backward, arrays, b, x0, *, unchecked: bool = False):
        self.m, self.n = m, n
        self.forward, self.backward, self.arrays = forward, backward, arrays
        self.b, self.x0 = b, x0
        self.unchecked = unchecked


class NotFinite(ValueError):
    """A :class:`HostProblem` checked by its run holds an inf or NaN (in A's values or b):
    nothing was run."""


def _check_finite(P: HostProblem) -> None:
    """Raise :class:`NotFinite` where ``P`` is unchecked and A's values or b are not all finite."""
    if P.unchecked and not (all_finite(P.arrays[2]) and all_finite(P.b)):
        raise NotFinite("A or b holds an inf or NaN")


def _host_vector(v, size: int, copy: bool):
    """``v`` as a float64 vector of ``size`` entries as the generic path makes it, or
    None where it would not be one (the generic path then raises its error)."""
    if type(v) is not np.ndarray:
        if isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
            return None
        v = np.asarray(v)
    if v.dtype.kind not in "biuf":     # complex, object, text: the generic path decides
        return None
    v = np.atleast_1d(v)
    if v.ndim > 1:
        v = v.squeeze()
    if v.shape != (size,):
        return None
    return v.astype(np.float64, copy=copy)


def host_problem(A, b, x0, xp) -> Optional[HostProblem]:
    """The problem for :func:`lsqr_host`/:func:`lsmr_host`, or None: the generic path runs.

    Served: ``xp`` None or NumPy, A a SciPy CSR/CSC sparse matrix or array of
    float64 values (two-dimensional) whose kernels are found, b and x0 NumPy
    data (or lists) of real numbers with the right sizes. b and x0 are
    converted as :class:`~scipy_gpuqr._iterative._common.Problem` converts
    them (float64; x0 copied).
    """
    if xp is not None and xp is not np:
        return None
    kernels = compressed_kernels(A)
    if kernels is None:
        return None
    m, n = (int(s) for s in A.shape)
    bv = _host_vector(b, m, copy=False)
    if bv is None:
        return None
    xv = None
    if x0 is not None:
        xv = _host_vector(x0, n, copy=True)
        if xv is None:
            return None
    forward, backward = kernels
    return HostProblem(m, n, forward, backward, (A.indptr, A.indices, A.data), bv, xv)


def _plain(*values) -> bool:
    """Whether Python-float arithmetic on ``values`` is NumPy float64's (see the module notes)."""
    for value in values:
        if type(value) not in _PLAIN or (type(value) is int and abs(value) > 2 ** 53):
            return False
    return True


def _start(damp, atol, btol, conlim, max_seconds, callback):
    """A host run's start, shared by LSQR and LSMR: ``(exact, native, run)``.

    ``exact``: the arguments need NumPy scalars (not :func:`_plain`), so
    neither the compiled loops nor Python floats may run them. ``native``:
    the compiled loops (None where ``exact`` or not to be had), asked for
    before the run's clock starts: a process's first run builds or checks
    them, which is no iteration's time (the seconds a callback sees).
    """
    exact = not _plain(damp, atol, btol, conlim)
    native = None if exact else _native.handle()
    return exact, native, _Run(Clock(max_seconds), callback, atol)


def _sign(a):
    """``numpy.sign`` of a Python float: 1.0, -1.0, 0.0 (for either zero) or a itself (NaN)."""
    if a > 0:
        return 1.0
    if a < 0:
        return -1.0
    return 0.0 if a == 0 else a


def _givens_float(a, b):
    """SciPy's ``_sym_ortho`` (:func:`~scipy_gpuqr._iterative._common.givens`) with
    :func:`_sign` for ``numpy.sign``."""
    if b == 0:
        return _sign(a), 0, abs(a)
    if a == 0:
        return 0, _sign(b), abs(b)
    if abs(b) > abs(a):
        tau = a / b
        s = _sign(b) / math.sqrt(1 + tau * tau)
        return s * tau, s, b / s
    tau = b / a
    c = _sign(a) / math.sqrt(1 + tau * tau)
    return c, c * tau, a / c


class _FromCallback(Exception):
    """Carries an arithmetic exception raised by the callback (it is not the run's)."""


class _Run:
    """What one call shares between its first run and a replay."""

    __slots__ = ("clock", "callback", "watched", "history", "reported", "allowance_spent",
                 "stopped_by_callback", "atol", "replayed", "keep", "handoff")

    def __init__(self, clock: Clock, callback, atol):
        self.clock, self.callback = clock, callback
        self.watched = callback is not None or clock.max_seconds is not None
        self.history = None             # each run's own (fresh_history)
        self.reported = 0               # iterations the callback and the clock have seen
        self.allowance_spent = False
        self.stopped_by_callback = False
        self.atol = atol
        self.replayed = False
        self.keep = False               # whether a run that stops early keeps its Handoff
        self.handoff = None

    def fresh_history(self) -> deque:
        """The tests' record of a run (from its start), kept for :meth:`info`'s projection."""
        self.history = deque(maxlen=PROJECTION_WINDOW)
        return self.history

    def info(self, istop: int, itn: int, exact_start: bool) -> dict:
        if exact_start or istop in (1, 2, 4, 5):
            projected = 0
        elif istop in (3, 6):
            projected = None
        else:
            progress = Progress(self.atol)          # only a run that did not converge needs it
            progress.raw = self.history
            projected = progress.projected          # fitted when first read
        return dict(allowance_spent=self.allowance_spent,
                    stopped_by_callback=self.stopped_by_callback,
                    projected_iterations=projected, seconds=self.clock.elapsed(), host_syncs=0,
                    replayed=self.replayed)


def _floats(values: tuple) -> tuple:
    """An iteration's ``(itn, x, istop, norms..., tests..., seconds)`` with its NumPy scalars
    made floats (the replay's; :class:`~scipy_gpuqr._iterative._common.IterationState`
    holds floats)."""
    return values[:3] + tuple([float(value) for value in values[3:]])


def _watched_stop(run: _Run, values, istop: int, exact: bool, timed: bool) -> bool:
    """One watched iteration of either loop: the callback told (``values``, the
    fields of an :class:`~scipy_gpuqr._iterative._common.IterationState`; None
    without a callback), and whether the loop ends here: the callback asked it
    to (before SciPy's own stop), SciPy's tests stopped it, or the allowance of
    seconds is spent. Only watched iterations come here (the unwatched ones
    test ``istop`` alone)."""
    if values is not None:
        state = tuple.__new__(IterationState, _floats(values) if exact else values)
        try:
            wants_stop = run.callback(state)
        except (ZeroDivisionError, OverflowError) as exc:
            raise _FromCallback(exc) from exc
        if wants_stop and istop == 0:
            run.stopped_by_callback = True
            return True
    if istop != 0:
        return True
    if timed and run.clock.spent():
        run.allowance_spent = True
        return True
    return False


def _replaying(body, run: _Run, args: tuple):
    """``body(*args, exact)`` with Python scalars, replayed with NumPy's where Python raised."""
    exact = args[-1]
    try:
        return body(*args)
    except _FromCallback as wrapped:
        raise wrapped.args[0] from None
    except (ZeroDivisionError, OverflowError):
        if exact:
            raise
    run.replayed = True
    try:
        return body(*args[:-1], True)
    except _FromCallback as wrapped:
        raise wrapped.args[0] from None


# ---------------------------------------------------------------------------
# the compiled loops

def _compiled_matrix(P: HostProblem):
    """``(csr, wide, b)`` where the compiled loops can run ``P`` (SciPy's own kernels,
    contiguous aligned arrays of one index type, b contiguous), else None."""
    forward = P.forward
    if _sparsetools is None:
        return None
    if forward is _sparsetools.csr_matvec:
        csr = 1
    elif forward is _sparsetools.csc_matvec:
        csr = 0
    else:
        return None
    indptr, indices, data = P.arrays
    if indptr.dtype != indices.dtype or indptr.dtype not in _INDEX or data.dtype != np.float64:
        return None
    for a in P.arrays:
        flags = a.flags
        if not (flags.c_contiguous and flags.aligned):
            return None
    if not (0 < P.m <= _LONGEST and 0 < P.n <= _LONGEST):
        return None
    b = P.b
    flags = b.flags
    if not (flags.c_contiguous and flags.aligned):
        b = np.ascontiguousarray(b)
    return csr, int(indptr.dtype.itemsize == 8), b


def _address(a: np.ndarray) -> int:
    """The address of a contiguous array's first entry (a writable array's through
    ctypes' buffer view, several times cheaper than ``a.ctypes.data``)."""
    try:
        return _addressof(_c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def _compiled(native, P: HostProblem, run: _Run, method: str, par: tuple, limit: int,
              calc_var: bool):
    """``method``'s run of ``P`` in the compiled loops ``native``
    (:func:`scipy_gpuqr._iterative.native.handle`'s answer):
    ``(fields, info)`` as :func:`lsqr_host`/:func:`lsmr_host` return them, or None where
    the loops are not at hand or gave up (the Python loops then run from the start;
    iterations already reported are not reported again).

    A watched run (a callback or an allowance of seconds) is reported each iteration
    through a C callback that makes what :func:`_watched_stop` makes of the Python
    loops' iterations; a callback that says when it would next act
    (:func:`_reporter`'s ``quiet_until``) is reported fewer iterations.
    """
    if native is None:
        return None
    matrix = _compiled_matrix(P)
    if matrix is None:
        return None
    csr, wide, b = matrix
    m, n = P.m, P.n
    indptr, indices, data = P.arrays
    x = np.zeros(n) if P.x0 is None else P.x0.copy()
    # one scratch buffer: par (5), out, the report area, the kept tests, the vectors
    window, fields = _native.WINDOW, _native.REPORT
    out_at, rec_at = 5, 5 + _native.OUT
    hist_at = rec_at + _native.REPORT_AREA
    scratch = np.empty(hist_at + 3 * window + 2 * m + 4 * n)
    scratch[:len(par)] = par
    base = _address(scratch)
    work_at = hist_at + 3 * window
    limit = max(min(int(limit), 2 ** 62), -(2 ** 62))
    nval = len(data) if P.unchecked else -1     # the loops' own finite check, or none
    failed = []
    report = None
    if run.watched:
        scratch[rec_at + fields] = _first_gate(run)     # the first iteration to report
        report = _native.REPORT_FN(_reporter(run, x, scratch[rec_at:hist_at], failed))
    lib = native.lib
    if method == "lsqr":
        var = np.zeros(n)
        code = lib.sgi_lsqr(m, n, csr, wide, _address(indptr), _address(indices),
                            _address(data), _address(b), P.x0 is not None, _address(x),
                            _address(var), base + 8 * work_at, base, limit, calc_var,
                            native.ddot, report, base + 8 * rec_at, base + 8 * hist_at,
                            base + 8 * out_at, nval)
    else:
        var = None
        code = lib.sgi_lsmr(m, n, csr, wide, _address(indptr), _address(indices),
                            _address(data), _address(b), P.x0 is not None, _address(x),
                            base + 8 * work_at, base, limit, native.ddot, report,
                            base + 8 * rec_at, base + 8 * hist_at, base + 8 * out_at, nval)
    if code == _native.NOT_FINITE:
        raise NotFinite("A or b holds an inf or NaN")
    values = scratch[out_at:rec_at].tolist()
    run.reported = int(values[9])
    if code == _native.REPORT_FAILED:
        raise failed[0]
    if code != _native.DONE:
        return None
    istop, itn = int(values[0]), int(values[1])
    if istop in (0, 7):                 # the tests kept for the projection (run.info)
        history = run.fresh_history()
        rows = scratch[hist_at:work_at].reshape(window, 3).tolist() if itn else ()
        for k in range(max(itn - window, 0), itn):
            history.append(tuple(rows[k % window]))
    exact_start = values[8] == 1.0
    if run.keep and istop == 0 and not exact_start and itn > 0:
        # the loops' vectors in their work area (_native.c: u at 0, v at 2 m, then w, or
        # h and hbar)
        work = scratch[work_at:]
        vectors = (work[:m], *(work[2 * m + k * n:2 * m + (k + 1) * n]
                               for k in range(len(HANDOFF_VECTORS[method]) - 1)))
        at = _native.OUT_STATE
        _handoff(run, method, itn, values[at:at + len(HANDOFF_SCALARS[method])], vectors, x,
                 var)
    if var is None:
        fields = (x, istop, itn, *values[2:7])
    else:
        fields = (x, istop, itn, *values[2:8], var)
    return fields, run.info(istop, itn, exact_start)


def _first_gate(run: _Run) -> float:
    """The first iteration a compiled run reports: the first, or a callback's
    ``first_report()`` where it has one (the earliest iteration at which it could act)
    and the run has no allowance of seconds. A stopping iteration is reported in any case."""
    first = None if run.clock.max_seconds is not None else \
        getattr(run.callback, "first_report", None)
    return 0.0 if first is None else float(first())


#: Share of the seconds until a gated callback's next action (:func:`_reporter`) that the
#: compiled run iterates unreported, at the fastest seconds per iteration seen: a run whose
#: iterations speed up by less than this factor still reports before that time.
GATE_SHARE = 0.5


def _reporter(run: _Run, x: np.ndarray, rec: np.ndarray, failed: list):
    """The C callback of a watched compiled run: reads the iteration's record from
    ``rec`` (the run's report area, :data:`~scipy_gpuqr._iterative.native.REPORT_AREA`)
    and answers 1 (stop) or 0 as :func:`_watched_stop`, or -1 with the exception
    raised kept in ``failed``.

    A callback with ``quiet_until()`` and ``catch_up(states)`` (auto's rule:
    :class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`,
    :class:`~scipy_gpuqr._dispatch.placement.HostFirst`) is
    asked, after each report, for the run's seconds before which no iteration
    could make it act; the run then iterates unreported for
    :data:`GATE_SHARE` of that time at the fastest seconds per iteration seen
    (the gate in ``rec``). The next report hands it the unreported iterations
    (their last :data:`~scipy_gpuqr._iterative.native.WINDOW`, from the run's
    ring, their seconds interpolated) through ``catch_up`` before the report's
    own. Every iteration that stops the run is reported. Other callbacks, and
    runs with an allowance of seconds, see every iteration.
    """
    callback, t0 = run.callback, run.clock.t0
    timed = run.clock.max_seconds is not None
    fields, window = _native.REPORT, _native.WINDOW
    quiet_until = None if timed else getattr(callback, "quiet_until", None)
    ring = rec[fields + 1:].reshape(window, fields)
    seen = [0, 0.0, math.inf]   # the last report's itn and seconds; the fastest s/iteration

    def catch_up(itn: int, now: float) -> None:
        last, last_s = seen[0], seen[1]
        if last == 0 or itn <= last:        # the first report carries the run's start
            return
        step = (now - last_s) / (itn - last)
        seen[2] = min(seen[2], step)
        if itn - last > 1:
            states = []
            for k in range(max(last + 1, itn - window + 1), itn):
                row = ring[(k - 1) % window].tolist()
                states.append(tuple.__new__(IterationState, (k, x, int(row[1]), *row[2:],
                                                             last_s + step * (k - last))))
            callback.catch_up(states)

    def gate(itn: int, now: float) -> float:
        until = quiet_until()
        if not until > now:
            return 0.0
        if until == math.inf:
            return math.inf
        per = seen[2]
        if not per < math.inf:
            return 0.0
        return float(itn + max(1, int(GATE_SHARE * (until - now) / max(per, 1e-9))))

    def report() -> int:
        try:
            itn, istop, *estimates = rec[:fields].tolist()
            itn, istop = int(itn), int(istop)
            run.reported = itn
            now = _now() - t0
            if quiet_until is not None:
                catch_up(itn, now)
            values = None if callback is None else (itn, x, istop, *estimates, now)
            if _watched_stop(run, values, istop, False, timed):
                return 1
            if quiet_until is not None:
                # the run goes on from here: the callback's own time (an analysis, say)
                # is not its iterations'
                now = _now() - t0
                seen[0], seen[1] = itn, now
                rec[fields] = gate(itn, now)
            return 0
        except _FromCallback as wrapped:
            failed.append(wrapped.args[0])
        except BaseException as exc:   # noqa: BLE001 - raised again by the caller
            failed.append(exc)
        return -1
    return report


# ---------------------------------------------------------------------------
# LSMR

def lsmr_host(P: HostProblem, damp, atol, btol, conlim, maxiter, *,
              max_seconds: Optional[float] = None, callback: Optional[Callable] = None,
              handoff: bool = False):
    """SciPy's LSMR on ``P`` (:func:`host_problem`): SciPy's tuple and the run's attributes.

    Returns
    -------
    fields : tuple
        ``(x, istop, itn, normr, normar, norma, conda, normx)`` (floats).
    info : dict
        The :class:`~scipy_gpuqr._iterative._common.RunInfo` attributes; with
        ``handoff``, also ``handoff``: the run's :class:`Handoff` where it stopped
        after an iteration before SciPy's tests did (``istop`` 0), else None.

    Raises
    ------
    NotFinite
        ``P.unchecked`` and A's values or b hold an inf or NaN (nothing was run).
    """
    exact, native, run = _start(damp, atol, btol, conlim, max_seconds, callback)
    run.keep = handoff
    maxiter = min(P.m, P.n) if maxiter is None else int(maxiter)
    if not exact:
        damp, atol, btol, conlim = float(damp), float(atol), float(btol), float(conlim)
        done = _compiled(native, P, run, "lsmr", (damp, atol, btol, conlim), maxiter, False)
        if done is not None:
            return _handed(done, run)
    _check_finite(P)
    fields, exact_start = _replaying(_lsmr_body, run, (P, damp, atol, btol, conlim, maxiter,
                                                       run, exact))
    return _handed((fields, run.info(fields[1], fields[2], exact_start)), run)


def _handed(done: tuple, run: _Run) -> tuple:
    """A run's ``(fields, info)``, info carrying its handoff where it was asked for."""
    if run.keep:
        done[1]["handoff"] = run.handoff
    return done


def _bidiagonal_start(P: HostProblem, root, normb, t: np.ndarray, *, v_of_zero_b):
    """The first step of Golub--Kahan bidiagonalization as SciPy's ``lsqr`` and
    ``lsmr`` take it: ``x`` (x0's copy or zeros), ``u`` (the residual b − A x
    normalized; ``t`` is A x's buffer), ``v`` (Aᵀu normalized), ``beta`` and
    ``alpha`` (their norms). Where beta is 0, SciPy's ``lsmr`` starts from
    ``v = zeros(n)`` and its ``lsqr`` from ``v = x`` (``v_of_zero_b``: ``np.zeros``,
    or None for x's copy); u is then a copy, never the caller's b (SciPy's
    would be updated in place)."""
    m, n = P.m, P.n
    indptr, indices, data = P.arrays
    b = P.b
    if P.x0 is None:
        x = np.zeros(n)
        beta = normb
        u = b
    else:
        x = P.x0.copy()
        t.fill(0.0)
        P.forward(m, n, indptr, indices, data, x, t)
        u = b - t
        beta = root(u.dot(u))
    if beta > 0:
        u = (1 / beta) * u
        v = np.zeros(n)
        P.backward(n, m, indptr, indices, data, u, v)
        alpha = root(v.dot(v))
    else:
        u = u.copy()
        v = x.copy() if v_of_zero_b is None else v_of_zero_b(n)
        alpha = 0
    if alpha > 0:
        v *= (1 / alpha)
    return x, u, v, beta, alpha


def _lsmr_body(P, damp, atol, btol, conlim, maxiter, run, exact):
    """SciPy's ``lsmr`` statements (scipy/sparse/linalg/_isolve/lsmr.py), one for one."""
    sqrt = math.sqrt
    if exact:
        root, sym_ortho, sign = np.sqrt, givens, np.sign
    else:
        root, sym_ortho, sign = math.sqrt, _givens_float, _sign
    undamped = damp == 0
    m, n = P.m, P.n
    forward, backward = P.forward, P.backward
    indptr, indices, data = P.arrays
    b = P.b
    history = run.fresh_history()
    reported = run.reported
    watched = run.watched
    callback, clock = run.callback, run.clock
    t0, timed = clock.t0, clock.max_seconds is not None

    normb = root(b.dot(b))
    t = np.empty(m)
    x, u, v, beta, alpha = _bidiagonal_start(P, root, normb, t, v_of_zero_b=np.zeros)

    itn = 0
    zetabar = alpha * beta
    alphabar = alpha
    rho = 1
    rhobar = 1
    cbar = 1
    sbar = 0
    h = v.copy()
    hbar = np.zeros(n)
    betadd = beta
    betad = 0
    rhodold = 1
    tautildeold = 0
    thetatilde = 0
    zeta = 0
    d = 0
    normA2 = alpha * alpha
    maxrbar = 0
    minrbar = 1e+100
    normA = sqrt(normA2)
    condA = 1
    normx = 0
    istop = 0
    ctol = 0
    if conlim > 0:
        ctol = 1 / conlim
    normr = beta
    normar = alpha * beta
    if normar == 0:
        return (x, istop, itn, float(normr), float(normar), float(normA), float(condA),
                float(normx)), True
    if normb == 0:
        x[()] = 0
        return (x, istop, itn, float(normr), float(normar), float(normA), float(condA),
                float(normx)), True

    s_buf = np.empty(n)
    tmp = np.empty(n)
    mul = np.multiply
    k = np.empty(())             # the scalar factor (a 0-d operand costs less than a float)
    u_dot, v_dot, x_dot = u.dot, v.dot, x.dot
    t_fill, s_fill = t.fill, s_buf.fill
    remember = history.append
    inf = np.inf
    while itn < maxiter:
        itn = itn + 1
        # bidiagonalization: beta u = A v - alpha u, alpha v = Aᵀ u - beta v
        k[()] = -alpha
        mul(u, k, u)
        t_fill(0.0)
        forward(m, n, indptr, indices, data, v, t)
        u += t
        beta = root(u_dot(u))
        if beta > 0:
            k[()] = 1 / beta
            mul(u, k, u)
            k[()] = -beta
            mul(v, k, v)
            s_fill(0.0)
            backward(n, m, indptr, indices, data, u, s_buf)
            v += s_buf
            alpha = root(v_dot(v))
            if alpha > 0:
                k[()] = 1 / alpha
                mul(v, k, v)

        if undamped:            # what _sym_ortho(alphabar, 0) returns
            chat, shat, alphahat = sign(alphabar), 0, abs(alphabar)
        else:
            chat, shat, alphahat = sym_ortho(alphabar, damp)
        rhoold = rho
        c, s, rho = sym_ortho(alphahat, beta)
        thetanew = s * alpha
        alphabar = c * alpha
        rhobarold = rhobar
        zetaold = zeta
        thetabar = sbar * rho
        rhotemp = cbar * rho
        cbar, sbar, rhobar = sym_ortho(cbar * rho, thetanew)
        zeta = cbar * zetabar
        zetabar = - sbar * zetabar

        k[()] = - (thetabar * rho / (rhoold * rhobarold))
        mul(hbar, k, hbar)
        hbar += h
        k[()] = zeta / (rho * rhobar)
        mul(hbar, k, tmp)
        x += tmp
        k[()] = - (thetanew / rho)
        mul(h, k, h)
        h += v

        betaacute = chat * betadd
        betacheck = -shat * betadd
        betahat = c * betaacute
        betadd = -s * betaacute
        thetatildeold = thetatilde
        ctildeold, stildeold, rhotildeold = sym_ortho(rhodold, thetabar)
        thetatilde = stildeold * rhobar
        rhodold = ctildeold * rhobar
        betad = - stildeold * betad + ctildeold * betahat
        tautildeold = (zetaold - thetatildeold * tautildeold) / rhotildeold
        taud = (zeta - thetatilde * tautildeold) / rhodold
        d = d + betacheck * betacheck
        normr = sqrt(d + (betad - taud)**2 + betadd * betadd)
        normA2 = normA2 + beta * beta
        normA = sqrt(normA2)
        normA2 = normA2 + alpha * alpha
        maxrbar = max(maxrbar, rhobarold)
        if itn > 1:
            minrbar = min(minrbar, rhobarold)
        condA = max(maxrbar, rhotemp) / min(minrbar, rhotemp)
        normar = abs(zetabar)
        normx = root(x_dot(x))

        test1 = normr / normb
        if (normA * normr) != 0:
            test2 = normar / (normA * normr)
        else:
            test2 = inf
        test3 = 1 / condA
        t1 = test1 / (1 + normA * normx / normb)
        rtol = btol + atol * normA * normx / normb
        istop = stopping_code(itn, maxiter, test1, test2, test3, t1, rtol, atol, ctol)
        remember((test1, test2, rtol))
        if watched and itn > reported:
            run.reported = itn
            values = None if callback is None else (
                itn, x, istop, normr, normar, normA, condA, normx, test1, test2, rtol,
                _now() - t0)
            if _watched_stop(run, values, istop, exact, timed):
                break
        elif istop > 0:
            break
    if run.keep and istop == 0 and itn > 0:
        _handoff(run, "lsmr", itn, (alpha, zetabar, alphabar, rho, rhobar, cbar, sbar, betadd,
                                    betad, rhodold, tautildeold, thetatilde, zeta, d, normA2,
                                    maxrbar, minrbar, normA, condA, normx, normr, normar,
                                    normb, test1, test2, rtol), (u, v, h, hbar), x, None)
    return (x, istop, itn, float(normr), float(normar), float(normA), float(condA),
            float(normx)), False


# ---------------------------------------------------------------------------
# LSQR

def lsqr_host(P: HostProblem, damp, atol, btol, conlim, iter_lim, calc_var, *,
              max_seconds: Optional[float] = None, callback: Optional[Callable] = None,
              handoff: bool = False):
    """SciPy's LSQR on ``P`` (:func:`host_problem`): SciPy's tuple and the run's attributes.

    Returns
    -------
    fields : tuple
        ``(x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var)``.
    info : dict
        The :class:`~scipy_gpuqr._iterative._common.RunInfo` attributes; with
        ``handoff``, also ``handoff`` (as :func:`lsmr_host`'s).

    Raises
    ------
    NotFinite
        ``P.unchecked`` and A's values or b hold an inf or NaN (nothing was run).
    """
    exact, native, run = _start(damp, atol, btol, conlim, max_seconds, callback)
    run.keep = handoff
    iter_lim = 2 * P.n if iter_lim is None else int(iter_lim)
    if not exact:
        dampsq = float(damp ** 2)
        damp, atol, btol, conlim = float(damp), float(atol), float(btol), float(conlim)
        done = _compiled(native, P, run, "lsqr", (damp, dampsq, atol, btol, conlim),
                         iter_lim, bool(calc_var))
        if done is not None:
            return _handed(done, run)
    else:
        dampsq = damp ** 2
    _check_finite(P)
    fields, exact_start = _replaying(_lsqr_body, run, (P, damp, dampsq, atol, btol, conlim,
                                                       iter_lim, bool(calc_var), run, exact))
    return _handed((fields, run.info(fields[1], fields[2], exact_start)), run)


def _lsqr_body(P, damp, dampsq, atol, btol, conlim, iter_lim, calc_var, run, exact):
    """SciPy's ``lsqr`` statements (scipy/sparse/linalg/_isolve/lsqr.py), one for one."""
    sqrt = math.sqrt
    if exact:
        root, sym_ortho = np.sqrt, givens
    else:
        root, sym_ortho = math.sqrt, _givens_float
    m, n = P.m, P.n
    forward, backward = P.forward, P.backward
    indptr, indices, data = P.arrays
    b = P.b
    history = run.fresh_history()
    reported = run.reported
    watched = run.watched
    callback, clock = run.callback, run.clock
    t0, timed = clock.t0, clock.max_seconds is not None
    eps = _EPS if exact else _EPS_FLOAT    # SciPy's np.finfo(np.float64).eps, or its float

    var = np.zeros(n)
    itn = 0
    istop = 0
    ctol = 0
    if conlim > 0:
        ctol = 1 / conlim
    anorm = 0
    acond = 0
    ddnorm = 0
    res2 = 0
    xnorm = 0
    xxnorm = 0
    z = 0
    cs2 = -1
    sn2 = 0

    bnorm = root(b.dot(b))
    t = np.empty(m)
    x, u, v, beta, alfa = _bidiagonal_start(P, root, bnorm, t, v_of_zero_b=None)
    w = v.copy()

    rhobar = alfa
    phibar = beta
    rnorm = beta
    r1norm = rnorm
    r2norm = rnorm
    arnorm = alfa * beta
    if arnorm == 0:
        return (x, istop, itn, float(r1norm), float(r2norm), float(anorm), float(acond),
                float(arnorm), float(xnorm), var), True
    if not exact and bnorm == 0:
        # x0 with b = 0: SciPy's tests divide by ‖b‖ = 0 (inf and NaN; no warnings here)
        raise ZeroDivisionError("‖b‖ = 0")
    quiet = bnorm == 0

    s_buf = np.empty(n)
    tmp = np.empty(n)
    dk = np.empty(n)
    mul, sub = np.multiply, np.subtract
    k = np.empty(())             # the scalar factor (a 0-d operand costs less than a float)
    u_dot, v_dot, dk_dot = u.dot, v.dot, dk.dot
    t_fill, s_fill = t.fill, s_buf.fill
    remember = history.append
    damped = damp > 0
    while itn < iter_lim:
        itn = itn + 1
        # bidiagonalization: beta u = A v - alfa u, alfa v = Aᵀ u - beta v
        t_fill(0.0)
        forward(m, n, indptr, indices, data, v, t)
        k[()] = alfa
        mul(u, k, u)
        sub(t, u, u)
        beta = root(u_dot(u))
        if beta > 0:
            k[()] = 1 / beta
            mul(u, k, u)
            anorm = sqrt(anorm**2 + alfa**2 + beta**2 + dampsq)
            s_fill(0.0)
            backward(n, m, indptr, indices, data, u, s_buf)
            k[()] = beta
            mul(v, k, v)
            sub(s_buf, v, v)
            alfa = root(v_dot(v))
            if alfa > 0:
                k[()] = 1 / alfa
                mul(v, k, v)

        if damped:
            rhobar1 = sqrt(rhobar**2 + dampsq)
            cs1 = rhobar / rhobar1
            sn1 = damp / rhobar1
            psi = sn1 * phibar
            phibar = cs1 * phibar
        else:
            rhobar1 = rhobar
            psi = 0.
        cs, sn, rho = sym_ortho(rhobar1, beta)
        theta = sn * alfa
        rhobar = -cs * alfa
        phi = cs * phibar
        phibar = sn * phibar
        tau = sn * phi

        t1 = phi / rho
        t2 = -theta / rho
        k[()] = 1 / rho
        mul(w, k, dk)
        k[()] = t1
        mul(w, k, tmp)
        x += tmp
        k[()] = t2
        mul(w, k, w)
        w += v
        ddnorm = ddnorm + root(dk_dot(dk))**2
        if calc_var:
            mul(dk, dk, tmp)
            var += tmp

        delta = sn2 * rho
        gambar = -cs2 * rho
        rhs = phi - delta * z
        zbar = rhs / gambar
        xnorm = sqrt(xxnorm + zbar**2)
        gamma = sqrt(gambar**2 + theta**2)
        cs2 = gambar / gamma
        sn2 = theta / gamma
        z = rhs / gamma
        xxnorm = xxnorm + z**2

        acond = anorm * sqrt(ddnorm)
        res1 = phibar**2
        res2 = res2 + psi**2
        rnorm = sqrt(res1 + res2)
        arnorm = alfa * abs(tau)
        if damped:
            r1sq = rnorm**2 - dampsq * xxnorm
            r1norm = sqrt(abs(r1sq))
            if r1sq < 0:
                r1norm = -r1norm
        else:
            r1norm = rnorm
        r2norm = rnorm

        if not quiet:
            test1 = rnorm / bnorm
            test2 = arnorm / (anorm * rnorm + eps)
            test3 = 1 / (acond + eps)
            t1 = test1 / (1 + anorm * xnorm / bnorm)
            rtol = btol + atol * anorm * xnorm / bnorm
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                test1 = rnorm / bnorm
                test2 = arnorm / (anorm * rnorm + eps)
                test3 = 1 / (acond + eps)
                t1 = test1 / (1 + anorm * xnorm / bnorm)
                rtol = btol + atol * anorm * xnorm / bnorm
        istop = stopping_code(itn, iter_lim, test1, test2, test3, t1, rtol, atol, ctol)
        remember((test1, test2, rtol))
        if watched and itn > reported:
            run.reported = itn
            values = None if callback is None else (
                itn, x, istop, r2norm, arnorm, anorm, acond, xnorm, test1, test2, rtol,
                _now() - t0)
            if _watched_stop(run, values, istop, exact, timed):
                break
        elif istop != 0:
            break
    if run.keep and istop == 0 and itn > 0:
        _handoff(run, "lsqr", itn, (alfa, anorm, acond, ddnorm, res2, xnorm, xxnorm, z, cs2,
                                    sn2, rhobar, phibar, r1norm, r2norm, arnorm, bnorm, test1,
                                    test2, rtol), (u, v, w), x, var)
    return (x, istop, itn, float(r1norm), float(r2norm), float(anorm), float(acond),
            float(arnorm), float(xnorm), var), False
