"""Stand-ins shared by the drop-in rule's tests: a square A's LU answer as the rule reads it,
and bench/dropin.py's backward error."""

from __future__ import annotations

import numpy as np
import scipy.sparse.linalg as spla


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
