"""SciPy's LSQR and LSMR over NumPy or CuPy arrays (the iterative path of backend 'auto').

:func:`lsqr` and :func:`lsmr` run the recurrences and stopping tests of
``scipy.sparse.linalg.lsqr``/``lsmr`` with every vector in the array module
of the problem: on a GPU, CuPy arrays and a cupyx sparse matrix, with one
device→host copy of three scalars per iteration; on NumPy with a SciPy
CSR/CSC float64 matrix, SciPy's statements one for one with less Python
around them (:mod:`scipy_gpuqr._iterative.host`: SciPy's result bit for
bit). Their results are SciPy's
tuples (tuple subclasses that also carry how the run ended: a wall-clock
allowance, a callback, a projection of the iterations still needed).
"""

from __future__ import annotations

from ._common import IterationState, RunInfo
from .lsmr import LSMRResult, lsmr
from .lsqr import LSQRResult, lsqr

__all__ = ["lsqr", "lsmr", "LSQRResult", "LSMRResult", "RunInfo", "IterationState"]
