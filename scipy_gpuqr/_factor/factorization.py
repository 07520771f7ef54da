"""``QRFactorization``: analyze → factorize → solve, reusable for a new matrix.

The object behind ``lsqr``, ``lsmr``, ``spsolve``, ``factorized`` and
``qr``. The backend is chosen once (:mod:`scipy_gpuqr._dispatch.plan`); every
answer is computed through the :class:`~scipy_gpuqr._factor.numeric.NumericQR`
contract by :mod:`scipy_gpuqr._factor.lstsq`, so all backends behave the same.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import scipy.sparse as sp

from .._dispatch.plan import plan_factorization
from .._gpu import is_cupy_array
from .lstsq import MinNormSolver, exact_solve, lstsq_cutoff
from .._options import resolve_options
from .._validate import MatrixInput, as_matrix, solve_rhs, to_output

__all__ = ["QRFactorization", "REFINE_ABOVE", "REFINE_STEPS"]

_EPS = float(np.finfo(np.float64).eps)

#: Tall least-squares solves (host and device) refine X (at most REFINE_STEPS steps,
#: x += G⁺Qᵀ(b − A x))
#: when eps times the condition estimate of the retained part of R exceeds this.
REFINE_ABOVE = 1e-8
REFINE_STEPS = 2


def _check_tol(tol):
    if tol is None or (isinstance(tol, str) and tol == "default"):
        return tol
    if isinstance(tol, str):
        raise ValueError(f"tol must be 'default', None or a number >= 0, got {tol!r}")
    value = float(tol)
    if not (value >= 0 and np.isfinite(value)):
        raise ValueError(f"tol must be 'default', None or a finite number >= 0, got {tol!r}")
    return value


def plan_for(mi: MatrixInput, *, backend=None, gpuqr_options=None, ordering=None):
    """The matrix a :class:`QRFactorization` of ``mi`` factorizes (A, or Aᵀ when
    m < n) and its :class:`~scipy_gpuqr._dispatch.plan.Plan` (analysis included).

    Callers that need the plan first (``lsqr``'s iterate-first rule predicts
    the factorization's time from it) pass the pair back as ``_planned``.
    """
    m, n = mi.shape
    M = sp.csc_array(mi.A.T) if m < n else mi.A
    M.sort_indices()
    plan = plan_factorization(M, backend=backend, gpuqr_options=resolve_options(gpuqr_options),
                              ordering=ordering, dtype=mi.dtype)
    return M, plan


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

    def __init__(self, A, *, ordering=None, tol=None, backend=None,
                 gpuqr_options=None, _planned=None):
        t0 = time.perf_counter()
        self._options = resolve_options(gpuqr_options)
        self._tol = _check_tol(tol)
        self._backend_kw = backend
        mi = A if isinstance(A, MatrixInput) else as_matrix(A)
        self._on_gpu = mi.on_gpu
        self._dtype = mi.dtype
        self.shape = mi.shape
        m, n = mi.shape
        self._transposed = m < n
        self._pattern = (mi.A.indptr.copy(), mi.A.indices.copy())
        if _planned is None:
            _planned = plan_for(mi, backend=backend, gpuqr_options=self._options,
                                ordering=ordering)
        M, self._plan = _planned
        t1 = time.perf_counter()
        self._timings = {"validate": t1 - t0 - self._plan.analyze_time,
                         "analyze": self._plan.analyze_time}
        self._M = M
        self._Md = None
        self._num = None
        self._solver = None
        self._dsolve = None
        self._factorize(M)

    # -- phases ----------------------------------------------------------------
    def _factorize(self, M):
        t0 = time.perf_counter()
        self._num = self._plan.factorize(M, tol=self._tol)
        self._timings["factorize"] = time.perf_counter() - t0
        self._solver = None
        self._dsolve = None
        self._Md = None

    def _min_norm_solver(self) -> MinNormSolver:
        if self._solver is None:
            t0 = time.perf_counter()
            num = self._num
            m, n = self.shape
            if self._tol is None:
                R = num.R
                cutoff = lstsq_cutoff(m, n)
            else:
                r = int(num.rank)
                R = sp.csc_array(num.R)[:r]
                cutoff = 0.0  # rank already decided by the backend
            # the rank refinement runs where the factorization ran (DESIGN.md §5)
            device = "gpu" if num.info.get("backend") == "gpu" else "cpu"
            # auto that factorized on the CPU with a GPU present (it consulted
            # the GPU's threshold) runs the dense refinements there too
            gpu_seen = self._plan.requested == "auto" and self._plan.gpu_name is not None
            self._solver = MinNormSolver(R, cutoff, transposed=self._transposed,
                                         factorize=self._cod_factorize, device=device,
                                         solves=self._device_triangular(),
                                         dense_device="gpu" if device == "gpu" or gpu_seen
                                         else "cpu")
            self._timings["rank_decision"] = time.perf_counter() - t0
        return self._solver

    def _cod_factorize(self, G, *, tol):
        return self._plan.factorize_fn(sp.csc_array(G), ordering="colamd", colperm=None,
                                       tol=tol, analysis=None)

    def _require(self):
        if self._num is None:
            raise ValueError("this QRFactorization was freed")

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
        self._require()
        m, n = self.shape
        out_dtype = np.result_type(self._dtype, np.float32)
        if is_cupy_array(b) and self._device_lstsq_ok():
            B, is_vector = device_rhs(b, m)
            X = self._device_lstsq(B).astype(out_dtype, copy=False)
            return X[:, 0] if is_vector else X
        B, is_vector, on_gpu = solve_rhs(b, m)
        X = self._solve_host(B)
        X = X.astype(out_dtype, copy=False)
        if is_vector:
            X = X[:, 0]
        return to_output(X, on_gpu or self._on_gpu)

    # -- the device path (GPU factorizations) ------------------------------------------
    def _on_device(self) -> bool:
        """The factorization's Householder data lie on a CUDA device."""
        f = getattr(self._num, "on_device", None)
        return bool(f is not None and f())

    def _device_lstsq_ok(self) -> bool:
        """Full-rank least squares on the device: GPU factors, lstsq's rule says full rank."""
        return (self._on_device() and self._tol is None
                and self._min_norm_solver().method == "triangular")

    def _device_triangular(self):
        """Host-array wrappers of the device's ``R⁻¹·`` and ``R⁻ᵀ·`` (GPU factors,
        no rank detection), for the rank decision's estimates; else None."""
        if self._tol is not None or not self._on_device():
            return None
        import cupy as cp
        ds = self._device_solve()

        def up(C):
            return ds.upper(cp.asarray(C, dtype=np.float64)).get()

        def upt(C):
            return ds.upper_transposed(cp.asarray(C, dtype=np.float64)).get()
        return up, upt

    def _device_solve(self):
        if self._dsolve is None:
            from .._engine.gpu.solve import device_solve_of
            self._dsolve = device_solve_of(self._num)
        return self._dsolve

    def _device_apply(self, B, trans: bool):
        from .._engine.gpu.solve import device_matmul
        return device_matmul(self._num, B, trans=trans, float64=True)

    def _device_lstsq(self, B):
        """Float64 CuPy (n, k) solution for float64 CuPy B of shape (m, k).

        Refined on the device as the host solve is (:meth:`_refines`)."""
        t0 = time.perf_counter()
        ds = self._device_solve()
        if not self._transposed:
            def solve(C):
                return ds.forward(lambda Y: self._device_apply(Y, True), C, self.shape[1])
            import cupy as cp
            X = self._refined(solve, self._device_matrix, B, solve(B),
                              lambda Y: float(cp.linalg.norm(Y)))
        else:
            X = ds.backward(lambda Y: self._device_apply(Y, False), B, self._num.shape[0])
        self._timings["solve"] = time.perf_counter() - t0
        return X

    def _refines(self) -> bool:
        """Whether tall least-squares solves refine: ill-conditioned retained part
        (eps times its condition estimate above :data:`REFINE_ABOVE`)."""
        return self._min_norm_solver().retained_condition() * _EPS > REFINE_ABOVE

    def _refined(self, solve, matrix, B, X, norm):
        """``X`` (solution of the tall problem for ``B``) refined in place where
        :meth:`_refines` says so: at most :data:`REFINE_STEPS` steps ``X += solve(B − M X)``
        with A's own residuals (not Q R's), which take the backward error down to the
        rank cutoff's level. ``matrix()`` gives M and ``norm`` a float 2-norm, of the
        array module of B and X (host or device)."""
        if not (B.shape[1] and self._refines()):
            return X
        M = matrix()
        for _ in range(REFINE_STEPS):
            D = solve(B - M @ X)
            X += D
            if norm(D) <= _EPS * norm(X):
                break
        return X

    def _device_matrix(self):
        """The factored matrix as a float64 cupyx CSR matrix (made once per factorization)."""
        if getattr(self, "_Md", None) is None:
            import cupyx.scipy.sparse as csp
            self._Md = csp.csr_matrix(sp.csr_matrix(self._M, dtype=np.float64))
        return self._Md

    def _exact_solve(self, B: np.ndarray, *, trans: bool = False) -> np.ndarray:
        """``A X = B`` (or ``Aᵀ X = B``) for square A, no rank rule (see ``exact_solve``).

        On the device for GPU factorizations (host B and X)."""
        n = self.shape[1]
        if not self._on_device() or B.shape[1] == 0 or n == 0:
            return exact_solve(self._num, B, trans=trans)
        import cupy as cp
        return self._exact_solve_device(cp.asarray(B, dtype=np.float64), trans=trans).get()

    def _exact_solve_device(self, Bd, *, trans: bool = False):
        """``A X = Bd`` (or ``Aᵀ X = Bd``) for square A on the device: float64 CuPy
        Bd of shape (n, k) in, CuPy X out (GPU factors, no rank rule)."""
        n = self.shape[1]
        if Bd.shape[1] == 0 or n == 0:
            import cupy as cp
            return cp.zeros((n, Bd.shape[1]))
        ds = self._device_solve()
        if trans:
            return ds.backward(lambda Y: self._device_apply(Y, False), Bd, n)
        return ds.forward(lambda Y: self._device_apply(Y, True), Bd, n)

    def _solve_host(self, B: np.ndarray) -> np.ndarray:
        """Float64 (n, k) solution for float64 B of shape (m, k) (NumPy in and out).

        A full-rank problem on GPU factors is solved on the device."""
        if B.shape[1] and self._device_lstsq_ok():
            import cupy as cp
            return self._device_lstsq(cp.asarray(B, dtype=np.float64)).get()
        t0 = time.perf_counter()
        num = self._num
        solver = self._min_norm_solver()
        m, n = self.shape
        if not self._transposed:
            def solve(C):
                return self._tall_host(C, solver)
            X = self._refined(solve, lambda: self._M, B, solve(B),
                              lambda Y: float(np.linalg.norm(Y)))
        else:
            Bp = B[num.colperm]
            Z = solver.solve(Bp)
            pad = np.zeros((n, B.shape[1]))
            pad[:Z.shape[0]] = Z
            X = num.q_matmul(pad) if B.shape[1] else pad
        self._timings["solve"] = time.perf_counter() - t0
        return X

    def _tall_host(self, B: np.ndarray, solver: MinNormSolver) -> np.ndarray:
        """``X[colperm] = G⁺ (Qᵀ B)[:rows of G]`` on the host (m >= n)."""
        num = self._num
        k = num.R.shape[0]
        C = num.qt_matmul(B)[:k] if B.shape[1] else np.zeros((k, 0))
        if self._tol is not None:
            C = C[:solver.R.shape[0]]
        X = np.empty((self.shape[1], B.shape[1]))
        X[num.colperm] = solver.solve(C)
        return X

    def qt_matmul(self, B):
        """``Qᵀ B`` (Q of the factored matrix: A, or Aᵀ when m < n).

        NumPy or CuPy B, shape (rows,) or (rows, k); the result is of the
        same kind (on the device for GPU factorizations)."""
        return self._matmul(B, True)

    def q_matmul(self, Y):
        """``Q Y`` (Q of the factored matrix: A, or Aᵀ when m < n); NumPy or CuPy."""
        return self._matmul(Y, False)

    def _matmul(self, B, trans: bool):
        self._require()
        num = self._num
        fn = num.qt_matmul if trans else num.q_matmul
        if is_cupy_array(B):
            if self._on_device():
                return fn(B)
            return to_output(np.asarray(fn(B.get().astype(np.float64))), True)
        if self._on_device():
            return fn(np.asarray(B))
        return fn(np.asarray(B, dtype=np.float64))

    @property
    def R(self) -> sp.csc_array:
        """The upper trapezoidal factor (of A, or of Aᵀ when m < n)."""
        self._require()
        return self._num.R

    @property
    def perm(self) -> np.ndarray:
        """Column permutation: ``M[:, perm] = Q @ R`` with M = A (or Aᵀ)."""
        self._require()
        return self._num.colperm

    @property
    def rank(self) -> int:
        """Numerical rank: lstsq's rule (tol=None) or the backend's (tol given)."""
        self._require()
        if self._tol is not None:
            return int(self._num.rank)
        return int(self._min_norm_solver().rank)

    @property
    def transposed(self) -> bool:
        """True when Aᵀ was factorized (m < n)."""
        return self._transposed

    @property
    def numeric(self):
        """The backend's :class:`~scipy_gpuqr._factor.numeric.NumericQR`."""
        self._require()
        return self._num

    @property
    def info(self) -> dict:
        """What ran where and why, flops, intensity and timings."""
        out = self._plan.summary()
        out.update(shape=tuple(self.shape), transposed=self._transposed,
                   tol=self._tol, timings=dict(self._timings))
        if self._num is not None:
            out["flops_backend"] = float(self._num.flops)
            out["backend_info"] = dict(self._num.info)
            out["rank_backend"] = int(self._num.rank)
            if self._solver is not None:
                out["rank_decision"] = self._solver.summary()
        return out

    def refactor(self, A_new) -> "QRFactorization":
        """Factorize a new matrix with the same sparsity pattern, reusing the analysis.

        Raises
        ------
        ValueError
            When A_new's shape or pattern (after summing duplicates) differs.
        """
        mi = as_matrix(A_new)
        if mi.shape != tuple(self.shape):
            raise ValueError(f"refactor needs a matrix of shape {tuple(self.shape)}, "
                             f"got {mi.shape}")
        indptr, indices = self._pattern
        if not (np.array_equal(mi.A.indptr, indptr) and np.array_equal(mi.A.indices, indices)):
            raise ValueError("refactor needs the same sparsity pattern as the "
                             "original matrix (explicit zeros count as entries)")
        M = sp.csc_array(mi.A.T) if self._transposed else mi.A
        M.sort_indices()
        self._M = M
        self._dtype = mi.dtype
        self._factorize(M)
        return self

    def free(self) -> None:
        """Release the factors (device memory, C objects); idempotent."""
        if self._num is not None:
            self._num.free()
        self._num = None
        self._solver = None
        self._dsolve = None
        self._Md = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    # -- pickling: data, never handles ---------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_solver"] = None
        state["_dsolve"] = None
        state["_Md"] = None
        num = state.get("_num")
        plan = state["_plan"]
        state["_plan_fields"] = {k: getattr(plan, k) for k in
                                 ("backend", "requested", "source", "reasons",
                                  "ordering", "colperm", "analyze_time")}
        state["_plan"] = None
        if num is not None:
            try:
                pickle.dumps(num)
            except Exception:  # device or C handles: refactorize on load
                state["_num"] = None
                state["_refactor_on_load"] = True
        return state

    def __setstate__(self, state):
        fields = state.pop("_plan_fields")
        refactor = state.pop("_refactor_on_load", False)
        self.__dict__.update(state)
        from .._dispatch.plan import Plan, backend_factorizer
        factorize_fn, ran, _ = backend_factorizer(fields["backend"])
        self._plan = Plan(factorize_fn=factorize_fn, **fields)
        if refactor:
            self._factorize(self._M)


def device_rhs(b, m: int):
    """A CuPy right-hand side checked on the device: float64 (m, k) and is-vector.

    Same rules and exception types as :func:`~scipy_gpuqr._validate.solve_rhs`;
    the finiteness check reads back one flag, never b.
    """
    import cupy as cp
    if b.dtype.kind == "c":
        raise TypeError("complex right-hand sides are not supported yet")
    if b.dtype.kind not in "biuf":
        raise ValueError(f"b must be numeric, got dtype {b.dtype}")
    if b.ndim not in (1, 2):
        raise ValueError(f"b must be 1-D or 2-D, got shape {b.shape}")
    if b.shape[0] != m:
        raise ValueError(f"b is of incompatible size: expected {m} rows, got shape {b.shape}")
    if b.size and not bool(cp.isfinite(b).all()):
        bad = int(cp.count_nonzero(~cp.isfinite(b)))
        raise ValueError(f"b (shape {b.shape}) contains {bad} non-finite value(s) (inf or NaN)")
    B = cp.ascontiguousarray(b.reshape(m, -1) if b.ndim == 2 else b.reshape(m, 1),
                             dtype=np.float64)
    return B, b.ndim == 1
