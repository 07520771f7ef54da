"""``qr``: sparse QR factorization with column permutation, ``A[:, perm] ≈ Q @ R``.

Validates its inputs, plans and factorizes A itself (wide A too, unlike the
solvers), and shapes the :class:`QRResult`: Q as an explicit sparse matrix,
not at all, or as a LinearOperator applying the kept Householder vectors.
CuPy in → CuPy out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from .._factor.factored import plan_matrix
from .._options import resolve_settings
from .._validate import as_matrix, check_tol, to_output

__all__ = ["qr", "QRResult"]


class QRResult(NamedTuple):
    """``A[:, perm] ≈ Q @ R`` from :func:`qr`."""

    Q: object
    R: object
    perm: object
    rank: int


_QR_MODES = ("economic", "r", "householder")


def qr(A, *, mode="economic", ordering="colamd", tol="default", backend=None,
       gpuqr_options=None) -> QRResult:
    """Sparse QR factorization with column permutation, ``A[:, perm] ≈ Q @ R``.

    Parameters
    ----------
    A : sparse matrix/array (any format), ndarray, CuPy/cupyx; real, (m, n)
    mode : {'economic', 'r', 'householder'}
        'economic': Q is a sparse m×k matrix (k = rows of R), built by
        applying Q to k identity columns: O(m·k) memory and k Householder
        applications, fine for moderate sizes. 'r': Q is None.
        'householder': Q is an m×m LinearOperator applying the kept
        Householder vectors (``Q @ y``, ``Q.T @ y``, ``Q.H @ y``).
    ordering : {'colamd', 'natural', 'amd', 'metis'}
    tol : 'default', None or float
        'default': SuiteSparseQR's rule ``20·(m+n)·eps·max column 2-norm``
        and the rank it reports; a number sets the tolerance; None turns
        rank detection off (rank = min(m, n)).
    backend : None or str
        None resolves by the usual precedence (options, environment, then
        'auto').

    Returns
    -------
    QRResult(Q, R, perm, rank)
        R is a sparse upper trapezoidal ``csc_array`` (k×n), perm an int64
        column permutation, rank the numerical rank.
    """
    if mode not in _QR_MODES:
        raise ValueError(f"mode must be one of {_QR_MODES}, got {mode!r}")
    if isinstance(A, LinearOperator):
        raise TypeError("qr needs an explicit matrix, not a LinearOperator")
    tol = check_tol(tol)
    mi = as_matrix(A)
    m, n = mi.shape
    settings = resolve_settings(backend, gpuqr_options)
    plan = plan_matrix(mi.A, settings, ordering=ordering, dtype=mi.dtype)
    num = plan.factorize(mi.A, tol=tol)
    R = sp.csc_array(num.R)
    k = R.shape[0]
    if mode == "economic":
        E = np.zeros((m, k))
        E[np.arange(min(m, k)), np.arange(min(m, k))] = 1.0
        Qd = np.asarray(num.q_matmul(E)) if k else E
        Q = sp.csc_array(Qd)
        Q.eliminate_zeros()
        Q = to_output(Q, mi.on_gpu)
    elif mode == "r":
        Q = None
    else:
        Q = _householder_operator(num, m, mi.on_gpu)
    perm = np.asarray(num.colperm, dtype=np.int64)
    rank = int(num.rank)
    if mode != "householder":
        num.free()      # nothing returned needs the kept reflectors: device memory back now
    return QRResult(Q, to_output(R, mi.on_gpu), to_output(perm, mi.on_gpu), rank)


def _householder_operator(num, m: int, on_gpu: bool):
    """Q of ``qr(mode='householder')`` as a LinearOperator applying the kept reflectors.

    CuPy input gives a ``cupyx.scipy.sparse.linalg.LinearOperator`` (CuPy in →
    CuPy out; on the device for GPU factorizations); otherwise SciPy's.
    """
    on_device = getattr(num, "on_device", None)
    on_device = bool(on_device is not None and on_device())
    if on_gpu:
        import cupy as cp               # optional dependency: the input was CuPy
        from cupyx.scipy.sparse.linalg import LinearOperator as CupyOperator

        def dev(fn):
            if on_device:
                return lambda y: fn(y)
            return lambda y: cp.asarray(fn(cp.asnumpy(y).astype(np.float64)))
        return CupyOperator((m, m), dtype=np.float64,
                            matvec=dev(num.q_matmul), rmatvec=dev(num.qt_matmul),
                            matmat=dev(num.q_matmul), rmatmat=dev(num.qt_matmul))

    def host(fn):
        return lambda y: fn(np.asarray(y, dtype=np.float64))
    return LinearOperator((m, m), dtype=np.float64,
                          matvec=host(num.q_matmul), rmatvec=host(num.qt_matmul),
                          matmat=host(num.q_matmul), rmatmat=host(num.qt_matmul))
