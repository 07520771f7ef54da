"""The course of a watched LSQR/LSMR run: how many more iterations it needs.

``auto``'s iterate-first rule (:mod:`scipy_gpuqr._dispatch.iterate_first`)
weighs the iterations still needed against the QR's predicted time. They are
projected from the trend of SciPy's two tolerance tests over the last
:data:`PROJECTION_WINDOW` iterations (:meth:`Projector.project`: a straight
line through their logarithms, the sooner of the two), and the growth of the
condition estimate towards ``conlim`` (:meth:`Projector.conlim_reached`). The
window's line often bends (LSQR and LSMR speed up late, or plateau for a
while, and their tests fall in steps), so the projector also keeps a long trend
through the windows' mean values now and at half the iterations
(:attr:`Projector.trend`, which one window's noise does not move), the same
trend on log(itn) (:attr:`Projector.power`: the tests falling as a power of the
iteration count), and the promises of convergence the window's projections
broke (:attr:`Projector.broken`), from which the rule's verdicts take the
iterations they weigh (:meth:`Projector.beyond`, :meth:`Projector.lasting`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional

import numpy as np

__all__ = ["PROMISE_SLACK", "BROKEN_PROMISES", "POWER_MARGIN", "PROJECTION_WINDOW", "Projector"]

_EPS = float(np.finfo(np.float64).eps)

#: A projection at iteration ``i`` of ``f`` more iterations promised SciPy's
#: stop by ``i + f``; the promise is broken once the run passes this many
#: times ``i + f`` without it ...
PROMISE_SLACK = 2.0
#: ... and once this many are broken, the iter_lim verdict weighs the long
#: trend as a power of the iteration count where that is later
#: (:meth:`Projector.beyond`) ...
BROKEN_PROMISES = 2
#: ... and passes ``iter_lim`` by this factor: converging runs that broke
#: promises had power trends up to 1.04 × ``iter_lim`` (reorientation_1),
#: rajat01's (which ends at ``iter_lim``) 1.25-2.5 ×.
POWER_MARGIN = 1.25
#: Iterations of test history a projection is fitted to (and the fewest
#: after which a projection is trusted).
PROJECTION_WINDOW = 20
#: The least-squares slope of values at PROJECTION_WINDOW consecutive
#: iterations is the sum of the values times these weights.
_SLOPE_WEIGHTS = tuple((k - (PROJECTION_WINDOW - 1) / 2)
                       / sum((j - (PROJECTION_WINDOW - 1) / 2) ** 2
                             for j in range(PROJECTION_WINDOW))
                       for k in range(PROJECTION_WINDOW))


class Projector:
    """The iterations a run still needs, by the window's projection and the long trend.

    Parameters
    ----------
    iter_lim, atol, conlim
        The run's iteration limit and the caller's ``atol`` (the least-squares
        test's scale) and ``conlim`` (0 or less: no limit), as
        :class:`~scipy_gpuqr._dispatch.iterate_first.Allowance` takes them.

    Attributes
    ----------
    history : deque
        The last :data:`PROJECTION_WINDOW` iterations' states (the solvers'
        ``IterationState``), appended by the watcher.
    trend : int or None
        Further iterations by the long trend (:meth:`_trend`), as of the last projection.
    power : float or None
        ... by the long trend as a power of the iteration count.
    broken : int
        Promises of convergence the window's projections broke so far
        (:meth:`_keep_promises`).
    """

    def __init__(self, iter_lim: int, atol: float, conlim: float):
        self.iter_lim = int(iter_lim)
        self.log_atol = math.log(max(float(atol), _EPS))
        self.log_conlim = math.log(conlim) if conlim > 0 else None
        self.history = deque(maxlen=PROJECTION_WINDOW)
        self.trend: Optional[int] = None           # further iterations by the long trend
        self.power: Optional[float] = None         # ... by the trend as a power of itn
        self.broken = 0                            # promises of convergence broken so far
        self._promises: list = []                  # (itn, further promised) not yet broken
        self._marks: list = []                     # (window centre, mean log tests) per checkpoint
        self._itn = 0                              # the iteration of the last projection

    def project(self, itn: int, t: float, analysed_at: Optional[int] = None,
                analysis_s: float = 0.0) -> tuple[Optional[int], float]:
        """Further iterations until a tolerance test is met (None: no estimate), s/iteration.

        A least-squares line through ``log(test1/rtol)`` and
        ``log(test2/atol)`` over the last :data:`PROJECTION_WINDOW`
        iterations (consecutive, so the slope is a fixed weighting of the
        values, :data:`_SLOPE_WEIGHTS`); the sooner of the two. The seconds
        per iteration are the lower of the window's (the first iterations
        carry set-up costs) and the run's average (a pause of the process
        inside the window would inflate the window's; the ``analysis_s`` seconds
        of the analysis made at iteration ``analysed_at`` are left out of it).
        Each projection also records the window's mean values (:attr:`trend`,
        :meth:`_trend`).
        """
        h = self.history
        average = t / max(itn, 1)
        if len(h) < PROJECTION_WINDOW:
            return None, average
        first, last = h[0], h[-1]
        seconds = last.seconds - first.seconds
        if analysed_at is not None and first.itn < analysed_at <= last.itn:
            seconds -= analysis_s
        per_iteration = min(seconds / max(last.itn - first.itn, 1), average)
        best = None
        means = []
        for column in (self._log_test1(h), self._log_test2(h)):
            finite = all(map(math.isfinite, column))
            means.append(sum(column) / PROJECTION_WINDOW if finite else None)
            if column[-1] <= 0:
                return 0, per_iteration
            if not finite:
                continue
            slope = sum(w * y for w, y in zip(_SLOPE_WEIGHTS, column))
            if slope < 0:
                need = math.ceil(column[-1] / -slope)
                best = need if best is None else min(best, need)
        self._itn = itn
        self._keep_promises(itn, best)
        self.trend = self._trend((first.itn + last.itn) / 2.0, itn, means)
        return best, per_iteration

    def _keep_promises(self, itn: int, further: Optional[int]) -> None:
        """Count the projections' broken promises (:attr:`broken`) and record ``further``.

        A projection at iteration ``i`` of ``f`` more iterations promised
        SciPy's stop by ``i + f``; once the run passes :data:`PROMISE_SLACK` ×
        ``(i + f)`` iterations without it (the run is still watched, so it has
        not stopped) the promise is broken. LSQR's tests often fall
        in steps, so one window's line promises too soon on converging runs
        too; on a run whose tests fall as a power of the iteration count
        (rajat01: ``test1/rtol`` by a factor of ten each 6-7-fold of the
        iterations) the window's line promises a few hundred more at every
        checkpoint, to ``iter_lim``."""
        kept = []
        for then, promised in self._promises:
            if itn > PROMISE_SLACK * (then + promised):
                self.broken += 1
            else:
                kept.append((then, promised))
        if further is not None and further > 0:
            kept.append((itn, further))
        self._promises = kept

    def _trend(self, center: float, itn: int, means: list) -> Optional[int]:
        """Further iterations by the long trend (None: no estimate), and the window's
        means kept for later checkpoints.

        The straight line through the window's mean values now and those of
        the checkpoint whose window's centre lay nearest half the iterations of
        the current one's (at least :data:`PROJECTION_WINDOW` before it),
        extended from the current centre: the mean of 20 values
        and a slope over hundreds of iterations do not flicker with the tests'
        noise as one window's slope does (LSQR's ``test2`` jumps by factors of
        ten between iterations on some matrices), and still follow a run that
        speeds up late (the trend spans the later half of the run only).
        The same two means on log(itn) give :attr:`power`, the further
        iterations if the tests fall as a power of the iteration count (later
        than the straight line's wherever the tests fall; :meth:`beyond`).
        """
        marks = self._marks
        best = None
        self.power = None
        if marks:
            goal = center / 2.0
            then = None
            for mark in marks:
                if center - mark[0] < PROJECTION_WINDOW:
                    break
                if then is None or abs(mark[0] - goal) <= abs(then[0] - goal):
                    then = mark
            if then is not None:
                span = center - then[0]
                power = None
                for now_y, then_y in zip(means, then[1:]):
                    if now_y is None or then_y is None or now_y >= then_y:
                        continue
                    need = math.ceil(now_y / ((then_y - now_y) / span) - (itn - center))
                    need = max(need, 0)
                    best = need if best is None else min(best, need)
                    if then[0] > 0:
                        # the same two means on log(itn): the tests falling as a power
                        # of the iteration count reach the tolerance at centre * e**x
                        x = now_y * math.log(center / then[0]) / (then_y - now_y)
                        reach = center * math.exp(min(x, 50.0)) - itn
                        power = reach if power is None else min(power, reach)
                self.power = None if power is None else max(power, 0.0)
        if not marks or marks[-1][0] < center:
            marks.append((center, *means))
        return best

    @staticmethod
    def _log_test1(h):
        return [math.log(max(state.test1, 1e-300) / max(state.rtol, _EPS)) for state in h]

    def _log_test2(self, h):
        return [math.log(max(state.test2, 1e-300)) - self.log_atol for state in h]

    def conlim_reached(self, further: int) -> str:
        """Why the condition estimate will reach ``conlim`` within ``further`` iterations, or ''.

        The estimate's growth is extrapolated as a power of the iteration
        count, fitted to the window's ends: the estimates of LSQR and LSMR
        grow fast at first and level off towards cond(A), so an exponential
        model would stop runs that converge well below ``conlim``.
        """
        if self.log_conlim is None or further == 0:
            return ""
        h = self.history
        (i0, c0), (i1, c1) = (h[0].itn, h[0].conda), (h[-1].itn, h[-1].conda)
        if not (c1 > c0 > 0 and i1 > i0 > 0):
            return ""
        power = math.log(c1 / c0) / math.log(i1 / i0)
        projected = math.log(c1) + power * math.log((i1 + further) / i1)
        if projected < self.log_conlim:
            return ""
        need = math.ceil(i1 * (math.exp((self.log_conlim - math.log(c1)) / power) - 1))
        return (f"the condition estimate ({c1:.2g}) projects to reach conlim in {need} "
                f"iterations, before convergence ({further})")

    def beyond(self, further: Optional[int]):
        """The further iterations the iter_lim verdict weighs: the window's
        projection, or, once :data:`BROKEN_PROMISES` of its promises are broken
        (:meth:`_keep_promises`), the long trend's as a power of the iteration
        count (:meth:`_trend`) where that is later. The verdict still asks that
        the iterations to ``iter_lim`` cost more than the exact answer, so a run
        the power law misjudges pays at most that answer's time."""
        if further is None or self.broken < BROKEN_PROMISES or self.power is None or \
                self._itn + self.power <= POWER_MARGIN * self.iter_lim:
            return further
        return max(further, self.power)

    def lasting(self, further: int) -> int:
        """The iterations the cost verdict weighs: the window's projection, or the long
        trend's (:meth:`_trend`) where that is sooner and ends before ``iter_lim`` — a
        run whose trend says SciPy's own stop comes first is not stopped on one
        window's flicker; a trend past ``iter_lim`` promises nothing."""
        trend = self.trend
        if trend is None or trend >= further or self._itn + trend > self.iter_lim:
            return further
        return trend
