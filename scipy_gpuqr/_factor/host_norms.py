"""Euclidean norms of host arrays, formed without NumPy's BLAS worker threads.

``np.linalg.norm`` (and ``np.dot``) of a float64 vector is OpenBLAS's ``ddot``,
which for more than ten thousand entries runs on every core; the woken
workers then spin for about a tenth of a second before they sleep. A GPU
call's host side — the engine's launch loop, R's copy workers, the schedule's
threads — runs in that window when a least-squares call begins with ‖b‖ or
when the next call follows the last one's residual norms, and it slows by half
on a many-core host (bench/RESULTS.md, thirteenth session). The norms the QR
path needs on the host (b, the residual, Aᵀr, A's values) are memory-bound
sums that one core forms quickly: :func:`norm2` takes them with NumPy's own
vectorized sum of products (``einsum``), which never calls the BLAS.
It calls the compiled function behind ``np.einsum`` directly: ``np.einsum``
without ``optimize`` hands its operands to it unchanged, and its dispatch costs
three times the sum on a vector of a few hundred entries.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

try:        # what np.einsum calls without ``optimize``, less its dispatch (the same bits)
    from numpy._core.multiarray import c_einsum as _einsum
except ImportError:                     # pragma: no cover - NumPy 1.x
    try:
        from numpy.core.multiarray import c_einsum as _einsum
    except ImportError:
        _einsum = np.einsum

__all__ = ["norm2", "frobenius_norm"]


def norm2(x) -> float:
    """``‖x‖₂`` of a host array (any shape: its entries as one vector), as a float.

    The same value as ``np.linalg.norm(x.ravel())`` up to rounding (the sum of
    squares in another order, no scaling: overflow and underflow as there).
    Complex arrays go to ``np.linalg.norm``.
    """
    a = np.asarray(x)
    if a.dtype.kind == "c":
        return float(np.linalg.norm(a.ravel()))
    a = a.astype(np.float64, copy=False).ravel()
    return math.sqrt(float(_einsum("i,i->", a, a)))


def frobenius_norm(A) -> float:
    """``‖A‖_F`` of a sparse (canonical: duplicates summed) or dense host matrix."""
    if sp.issparse(A):
        return norm2(A.data)
    return norm2(A)
