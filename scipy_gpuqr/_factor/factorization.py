"""``QRFactorization``: the public object behind ``lsqr``, ``lsmr``, ``spsolve``,
``factorized`` and ``qr``, reusable for solves and for a new matrix.

It checks what the caller passes (A, b, the settings), keeps CuPy data on
CuPy's side, and gives results SciPy's dtypes; the factors and the solves
themselves are a :class:`~scipy_gpuqr._factor.factored.FactoredQR`. The
backend is chosen once (:mod:`scipy_gpuqr._dispatch.plan`); every answer is
computed through the :class:`~scipy_gpuqr._numeric.NumericQR` contract
by :mod:`scipy_gpuqr._factor.lstsq`, so all backends behave the same.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .._gpu import is_cupy_array
from .._options import resolve_options, settings_for
from .._validate import SOLVE_RHS, MatrixInput, as_matrix, check_rhs, check_tol, to_output
from .factored import FactoredQR, factorize

__all__ = ["QRFactorization", "wrap"]


class QRFactorization:
    """Sparse QR factorization of A, reusable for solves and for a new A.

    ``A[:, perm] = Q @ R`` for tall or square A. For wide A (m < n) the
    object factorizes ``Aᵀ`` instead (``info['transposed']`` is True):
    ``R``, ``perm``, ``qt_matmul`` and ``q_matmul`` then describe
    ``Aᵀ[:, perm] = Q @ R`` with Q of order n, and :meth:`solve` returns the
    minimum-norm solution ``x = Q [R⁻ᵀ b[perm]; 0]`` (full row rank) or its
    rank-deficient generalisation.

    Parameters
    ----------
    A : sparse matrix/array (any format), ndarray, or CuPy/cupyx equivalent
        Real matrix, shape (m, n). Copied; never modified.
    ordering : {'colamd', 'natural', 'amd', 'metis'}
        Fill-reducing column ordering (None: ``gpuqr_options.ordering``).
    tol : None, 'default' or float
        Rank detection during the factorization. ``None`` (default): none;
        :meth:`solve` then applies ``numpy.linalg.lstsq``'s rank rule
        (singular values ``<= eps·max(m, n)·σ_max`` are zero; see
        :mod:`scipy_gpuqr._factor.lstsq`). ``'default'``: SuiteSparseQR's rule
        ``20·(m+n)·eps·max column 2-norm``; a number sets the tolerance.
        With rank detection, :attr:`rank` and :meth:`solve` follow the
        backend's decision (the minimum-norm solution of the truncated
        problem).
    backend : {None, 'auto', 'gpu', 'cpu', 'reference', 'simulate'}
        Where to factorize (precedence: this keyword > ``gpuqr_options`` >
        ``SCIPY_GPUQR_BACKEND`` > 'auto').
    gpuqr_options : GpuqrOptions, dict or None
        Further options.

    Attributes
    ----------
    shape : tuple
        (m, n) of A.
    info : dict
        Backend that ran and why, flops, intensity, ordering, rank decision
        and timings per phase (seconds).

    Notes
    -----
    On the GPU backend (a factorization whose Householder data lie on a CUDA
    device) ``qt_matmul``, ``q_matmul``, :meth:`solve` of full-rank problems
    and the exact solves of ``spsolve``/``factorized`` run on the device
    (:mod:`scipy_gpuqr._engine.gpu.solve`: Qᵀb from the kept reflectors,
    triangular solves with R's blocks where the factorization left them,
    the permutation); CuPy in → CuPy out
    without copying b or x to the host, NumPy in → NumPy out. The rank
    decision (:class:`~scipy_gpuqr._factor.lstsq.MinNormSolver`) is made once per
    factorization from R; a rank-deficient least-squares problem then takes
    that solver's path (Qᵀb still on the device, b and x through the host).
    ``spsolve`` and ``factorized`` with a dense CuPy b on GPU factors check
    and solve on the device (CuPy in → CuPy out, no copy of b or x); ``lsqr``
    and ``lsmr`` check b on the host (one copy of b and x each way) and solve
    on the device.

    Picklable: the numeric factors are plain NumPy/SciPy arrays for every
    CPU backend; a backend whose factors hold device or C handles is
    pickled as its matrix and refactorized on load.
    """

    def __init__(self, A, *, ordering=None, tol=None, backend=None, gpuqr_options=None):
        started = time.perf_counter()
        options = resolve_options(gpuqr_options)
        tol = check_tol(tol)
        mi = A if isinstance(A, MatrixInput) else as_matrix(A)
        settings = settings_for(backend, options)
        self._core = factorize(mi, settings, ordering=ordering, tol=tol, started=started)

    # -- public API --------------------------------------------------------------
    def solve(self, b):
        """Minimum 2-norm least-squares solution of ``A x ≈ b``.

        Parameters
        ----------
        b : array_like, shape (m,) or (m, k)
            NumPy or CuPy.

        Returns
        -------
        x : ndarray, shape (n,) or (n, k)
            float64 (float32 when A was float32). CuPy in → CuPy out.
        """
        core = self._core
        core.require()
        m, n = core.shape
        out_dtype = np.result_type(core.dtype, np.float32)
        if is_cupy_array(b) and core.device_least_squares_ok():
            rhs = check_rhs(b, m, SOLVE_RHS, on_device=True)
            X = core.device_least_squares(rhs.B).astype(out_dtype, copy=False)
            return X[:, 0] if rhs.is_vector else X
        rhs = check_rhs(b, m, SOLVE_RHS)
        X = core.least_squares(rhs.B).astype(out_dtype, copy=False)
        if rhs.is_vector:
            X = X[:, 0]
        return to_output(X, rhs.on_gpu or core.on_gpu)

    def qt_matmul(self, B):
        """``Qᵀ B`` (Q of the factored matrix: A, or Aᵀ when m < n).

        NumPy or CuPy B, shape (rows,) or (rows, k); the result is of the
        same kind (on the device for GPU factorizations)."""
        return self._matmul(B, True)

    def q_matmul(self, Y):
        """``Q Y`` (Q of the factored matrix: A, or Aᵀ when m < n); NumPy or CuPy."""
        return self._matmul(Y, False)

    def _matmul(self, B, trans: bool):
        core = self._core
        core.require()
        num = core.num
        fn = num.qt_matmul if trans else num.q_matmul
        if is_cupy_array(B):
            if core.on_device():
                return fn(B)
            return to_output(np.asarray(fn(B.get().astype(np.float64))), True)
        if core.on_device():
            return fn(np.asarray(B))
        return fn(np.asarray(B, dtype=np.float64))

    @property
    def shape(self) -> tuple:
        """(m, n) of A."""
        return self._core.shape

    @property
    def R(self) -> sp.csc_array:
        """The upper trapezoidal factor (of A, or of Aᵀ when m < n)."""
        self._core.require()
        return self._core.num.R

    @property
    def perm(self) -> np.ndarray:
        """Column permutation: ``M[:, perm] = Q @ R`` with M = A (or Aᵀ)."""
        self._core.require()
        return self._core.perm

    @property
    def rank(self) -> int:
        """Numerical rank: lstsq's rule (tol=None) or the backend's (tol given)."""
        self._core.require()
        return self._core.rank

    @property
    def transposed(self) -> bool:
        """True when Aᵀ was factorized (m < n)."""
        return self._core.transposed

    @property
    def numeric(self):
        """The backend's :class:`~scipy_gpuqr._numeric.NumericQR`."""
        self._core.require()
        return self._core.num

    @property
    def info(self) -> dict:
        """What ran where and why, flops, intensity and timings."""
        return self._core.info

    def refactor(self, A_new) -> "QRFactorization":
        """Factorize a new matrix with the same sparsity pattern, reusing the analysis.

        Raises
        ------
        ValueError
            When A_new's shape or pattern (after summing duplicates) differs.
        """
        core = self._core
        mi = as_matrix(A_new)
        if mi.shape != tuple(core.shape):
            raise ValueError(f"refactor needs a matrix of shape {tuple(core.shape)}, "
                             f"got {mi.shape}")
        indptr, indices = core.pattern
        if not (np.array_equal(mi.A.indptr, indptr) and np.array_equal(mi.A.indices, indices)):
            raise ValueError("refactor needs the same sparsity pattern as the "
                             "original matrix (explicit zeros count as entries)")
        M = sp.csc_array(mi.A.T) if core.transposed else mi.A
        M.sort_indices()
        core.refactor(M, mi.dtype)
        return self

    def free(self) -> None:
        """Release the factors (device memory, C objects); idempotent."""
        self._core.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False


def wrap(core: FactoredQR) -> QRFactorization:
    """The public :class:`QRFactorization` of factors made by an entry point
    (``factorized`` returns its solver's factorization this way)."""
    F = QRFactorization.__new__(QRFactorization)
    F._core = core
    return F
