"""Stand-ins shared by the drop-in rule's tests: an iteration's readings, the analysis' plan
and a square A's LU answer as the rule (:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`)
reads them, the replay of a recorded run through the rule, and bench/dropin.py's backward
error."""

from __future__ import annotations

import types

import numpy as np
import scipy.sparse.linalg as spla

from scipy_gpuqr._dispatch.iterate_first import Allowance

#: :class:`PlanStandIn`'s ``nnz_R`` not given: its analysis has no ``nnz_R`` attribute at all
#: (``None`` gives it one that is ``None``)
ABSENT = object()


class StateStandIn:
    """An iteration's readings as the rule reads them: ``itn``, the run's ``seconds`` so far,
    and SciPy's stopping tests ``test1``, ``test2``, ``rtol`` and ``conda``."""

    __slots__ = ("itn", "seconds", "test1", "test2", "rtol", "conda")

    def __init__(self, itn, seconds, test1, test2=1.0, rtol=1e-6, conda=10.0):
        self.itn, self.seconds = itn, seconds
        self.test1, self.test2, self.rtol, self.conda = test1, test2, rtol, conda


class PlanStandIn:
    """The plan the rule's ``plan()`` answers: ``backend``, ``gpu_name`` (the GPU the analysis
    saw, None: none) and an ``analysis`` with the predicted ``flops`` and R's entries
    ``nnz_R`` (:data:`ABSENT`: no such attribute)."""

    def __init__(self, flops, backend="cpu", gpu_name=None, *, nnz_R=ABSENT):
        self.analysis = types.SimpleNamespace(flops=flops)
        if nnz_R is not ABSENT:
            self.analysis.nnz_R = nnz_R
        self.backend, self.gpu_name = backend, gpu_name


def answering(value):
    """One of the rule's questions (``dense_gpu``, ``host_sweeps``) answering ``value`` each
    time it is asked; None where ``value`` is None (the question not given)."""
    return None if value is None else (lambda: value)


def recorded(histories, key):
    """A recorded run of ``tests/data/lsqr_histories.npz``: ``((m, n, nnz, istop, itn),
    rows)``, a row the rule's readings (test1, test2, rtol, conda) of an iteration."""
    return (tuple(int(v) for v in histories[key + ".meta"]),
            histories[key].astype(np.float64))


def readings(rows, per):
    """A run's iterations as the rule is told them: ``rows`` (test1, test2, rtol, conda an
    iteration) at ``per`` seconds an iteration."""
    return (StateStandIn(k, k * per, *row) for k, row in enumerate(rows, start=1))


def stop_of(watch, states):
    """The iteration at which ``watch`` stops a run told each of ``states``, or None."""
    for s in states:
        if watch(s):
            return s.itn
    return None


def replay(rows, plan, *, per, **allowance):
    """The rule (:class:`Allowance`, ``atol`` 1e-6, ``conlim`` 1e8, ``allowance`` the rest of
    its arguments) watching a run's readings ``rows`` at ``per`` seconds an iteration, its
    ``plan()`` answering ``plan`` each time: ``(stopped at or None, watch, plans made)``."""
    plans = []
    watch = Allowance(atol=1e-6, conlim=1e8, plan=lambda: plans.append(1) or (None, plan),
                      **allowance)
    return stop_of(watch, readings(rows, per)), watch, len(plans)


class SquareStandIn:
    """A stand-in for :class:`~scipy_gpuqr._api.square_lu.SquareLU` whose factors are made as
    given: ``clear`` (A of full rank), else deficient (``singular`` as given), with
    ``revealed`` of U's pivots split at lstsq's cutoff (``revealed_dead``), ``hides`` (U's
    pivots hide the deficiency) and ``under`` of them under the cutoff
    (``pivots_under_cutoff``; ``revealed`` where not given). ``asked`` and ``counted``
    count the two readings."""

    def __init__(self, revealed=0, clear=False, singular=False, hides=False, under=None):
        self.revealed, self.hides = revealed, hides
        self.under = revealed if under is None else under
        self.asked = self.counted = 0
        self._clear, self._singular = clear, singular
        self.clear, self.deficient, self.singular = None, False, False
        self.why, self.seconds = "not of full rank", 0.0

    def factor(self):
        self.clear, self.deficient, self.singular = self._clear, not self._clear, self._singular
        return self.clear

    def decline(self, why):
        if self.clear is None:
            self.clear, self.why = False, why

    def revealed_dead(self):
        self.asked += 1
        return self.revealed

    def hides_deficiency(self):
        return self.hides

    def pivots_under_cutoff(self):
        self.counted += 1
        return self.under


def dropin_backward_error(A, x, b) -> float:
    """bench/dropin.py's: the smaller of ‖Aᵀr‖/(‖A‖_F‖r‖) and ‖r‖/(‖A‖_F‖x‖+‖b‖)."""
    r = b - A @ x
    fro = spla.norm(A)
    return min(np.linalg.norm(A.T @ r) / (fro * np.linalg.norm(r)),
               np.linalg.norm(r) / (fro * np.linalg.norm(x) + np.linalg.norm(b)))
