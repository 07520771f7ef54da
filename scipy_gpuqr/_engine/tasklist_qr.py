"""What a factorization by task lists keeps for ``Q``: the base of both executors' results.

The NumPy executor (:class:`~scipy_gpuqr._engine.host.simulate.SimulateQR`)
and the GPU engine (:class:`~scipy_gpuqr._engine.gpu.driver.GpuQR`) factorize
with the same task lists, so they keep the same Householder data: per front
its factorized block (R, V and the updated rows), its Factorize records and
the global row slot of each of its rows; the VT tile pool they index; the
dense fronts factorized outside the task lists. Each subclass applies ``Q``
from that data where it lies (host arrays, device pools).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._numeric import NumericQR

__all__ = ["TaskListQR"]


@dataclass
class TaskListQR(NumericQR):
    """A :class:`~scipy_gpuqr._numeric.NumericQR` whose ``Q`` is task-list reflectors.

    Attributes
    ----------
    analysis : SymbolicAnalysis
        The analysis factorized.
    qorder : ndarray of int64, shape (m,)
        Row slot of each row of ``Qᵀb`` (the rows of R first, by pivot).
    schedule : SparseSchedule
        The task lists run (``tile`` and ``bundle`` read by the replays).
    _fronts : list of tuple
        Per front ``(slots, values, records)``: the global row slot of each
        front row, the factorized front (row-major, None while it lies in a
        device pool) and its Factorize / Apply+Factorize records (``F = 0``:
        relative to the front).
    _vt : ndarray or None
        The VT tile pool on the host (None while it lies on the device).
    _dense : dict
        Front → :class:`~scipy_gpuqr._engine.dense_front.DenseFront` of the
        fronts factorized outside the task lists (no records).
    """

    analysis: object = None
    qorder: np.ndarray | None = None
    schedule: object = None
    _fronts: list = field(default_factory=list, repr=False)
    _vt: np.ndarray | None = field(default=None, repr=False)
    _dense: dict = field(default_factory=dict, repr=False)

    def free(self) -> None:
        """Drop the kept Householder data (``Q`` no longer applies); idempotent."""
        self._fronts = []
        self._vt = None
        self._dense = {}
