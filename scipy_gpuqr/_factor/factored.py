"""One factorized matrix and the solves built on it, on the host and on the device.

:class:`FactoredQR` holds what a factorization of a validated matrix is made
of (its :class:`~scipy_gpuqr._dispatch.plan.Plan`, the backend's
:class:`~scipy_gpuqr._numeric.NumericQR`, the rank decision made from
R) and answers, in float64 and without any input checking, the solves the
entry points need: the minimum-norm least-squares solve
(:meth:`FactoredQR.least_squares`), the exact solves of square systems
(:meth:`FactoredQR.exact_solve`) and the products with Q. It is the engine
room behind :class:`~scipy_gpuqr.QRFactorization` (which adds the checks of
b, CuPy in → CuPy out and the result dtypes) and behind ``lsqr``, ``lsmr``,
``spsolve`` and ``factorized``.

Wide A (m < n) is factorized as Aᵀ (:func:`plan_for`): least-squares solves
are then minimum-norm solutions of the underdetermined system.

Where the factorization left its Householder data on a CUDA device (the GPU
backend), the products with Q, the full-rank least-squares solve and the
exact solves run there (the GPU engine's solves, reached through the plan);
rank-deficient least squares takes the rank decision's path (Qᵀb still on
the device, the rest through the host).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import threading
import time
from typing import Optional

import numpy as np
import scipy.sparse as sp

from .._dispatch.plan import Plan, plan_factorization
from .._engine.gpu.blas_warmup import start_blas_warmup
from .._engine.gpu.driver import start_layout_load
from .._engine.gpu.factorize_kernels import prefetch_engine_kernels
from .._gpu import gpu_info, start_driver
from .._options import Settings
from .._trusted_csc import transposed_csc
from .._validate import MatrixInput, as_matrix, device_csr
from .._engine.gpu import array_ops
from .._engine.gpu.solve import fetch_beside
from .lstsq import (DENSE_LIMIT, SOLVE_RANK_MIN_ORDER, KnownNorms, MinNormSolver, exact_solve,
                    frobenius_bound, lstsq_cutoff)
from .solve_rank import PROBE_COLUMNS, abs_diagonal
from .rank_refine import factorizer, with_rank_detection
from .triangular import UpperTriangular

__all__ = ["FactoredQR", "factorize", "plan_for", "plan_matrix", "least_squares_probe",
           "prefetch_kernels", "REFINE_ABOVE", "REFINE_STEPS"]

_EPS = float(np.finfo(np.float64).eps)

#: Tall least-squares solves (host and device) refine X (at most REFINE_STEPS steps,
#: x += G⁺Qᵀ(b − A x))
#: when eps times the condition estimate of the retained part of R exceeds this.
REFINE_ABOVE = 1e-8
REFINE_STEPS = 2


def plan_matrix(M: sp.csc_array, settings: Settings, *, ordering=None,
                dtype=np.float64, gpu_reason=None) -> Plan:
    """The dispatcher's plan for factorizing M, with a tolerance served on every backend.

    :func:`~scipy_gpuqr._dispatch.plan.plan_factorization`, its factorize
    callable wrapped by :func:`~scipy_gpuqr._factor.rank_refine.with_rank_detection`
    (engines without rank detection get Heath's rule on their R); ``gpu_reason`` as
    that function takes it.
    """
    plan = plan_factorization(M, settings, ordering=ordering, dtype=dtype,
                              gpu_reason=gpu_reason)
    # the plan was made here for this caller alone: its callable is wrapped in place
    # (dataclasses.replace would copy every field again)
    plan.factorize_fn = with_rank_detection(plan.factorize_fn, plan.backend)
    return plan


def plan_for(mi: MatrixInput, settings: Settings, *, ordering=None, gpu_reason=None):
    """``(M, plan)``: the matrix a factorization of ``mi`` factorizes (A, or Aᵀ when
    m < n) and its :class:`~scipy_gpuqr._dispatch.plan.Plan` (analysis included).

    Callers that need the plan first (``lsqr``'s iterate-first rule predicts
    the factorization's time from it) pass the pair to :func:`factorize`.
    ``gpu_reason``: under ``auto``, why a usable GPU factorizes whatever the
    intensity says (:func:`~scipy_gpuqr._dispatch.plan.plan_factorization`); its
    kernels are then prefetched as for ``backend='gpu'``.
    """
    gpu = settings.backend == "gpu" or (bool(gpu_reason) and settings.backend == "auto")
    if gpu:
        prefetch_kernels(mi.dtype)
    m, n = mi.shape
    # Aᵀ's CSC arrays by SciPy's one conversion (sorted indices), one object
    M = transposed_csc(mi.A) if m < n else mi.A
    M.sort_indices()
    plan = plan_matrix(M, settings, ordering=ordering, dtype=mi.dtype, gpu_reason=gpu_reason)
    if gpu and plan.backend == "gpu" and plan.analysis is not None:
        # R's layout of a pattern an earlier process factorized, from its file,
        # while the call goes on to the device (see start_layout_load)
        start_layout_load(plan.analysis)
    return M, plan


def prefetch_kernels(dtype) -> None:
    """On a GPU, start compiling the kernels a GPU factorization of ``dtype`` values
    and its solves use (parallel worker threads, each module once per process),
    so that they compile while the analysis runs; nothing without a GPU.

    In a new process (a calling thread without a CUDA context) the CUDA
    driver starts on a thread of its own (:func:`~scipy_gpuqr._gpu.start_driver`),
    and CuPy's import, the wait for the driver and the prefetch run on
    another (``gpuqr-gpu-prefetch``): the calling thread goes on at once with
    the analysis (from its file where an earlier process made it) instead of
    waiting for CUDA's start (``cuInit`` and the context); cuBLAS is set up on
    device 0 through the driver meanwhile, without waiting for CuPy
    (:func:`~scipy_gpuqr._engine.gpu.blas_warmup.start_blas_warmup`). A failure
    there ends that thread quietly: the factorization looks the GPU up and
    prefetches again itself.
    """
    value = np.float32 if np.dtype(dtype) == np.float32 else np.float64
    if start_driver() is None:          # CUDA started on this thread (or no driver)
        _prefetch(value)
        return
    start_blas_warmup(0, value)         # cuBLAS through the driver, beside CuPy's import
    threading.Thread(target=_quiet_prefetch, args=(value,), name="gpuqr-gpu-prefetch",
                     daemon=True).start()


def _prefetch(value) -> None:
    if gpu_info().get("available"):
        prefetch_engine_kernels(value)


def _quiet_prefetch(value) -> None:
    try:
        _prefetch(value)
    except Exception:  # noqa: BLE001 - the factorization prefetches on its own thread
        pass


def factorize(mi: MatrixInput, settings: Settings, *, ordering=None, tol=None,
              planned=None, started=None, known: Optional[KnownNorms] = None) -> "FactoredQR":
    """Plan (unless ``planned`` is given, from :func:`plan_for`) and factorize ``mi``.

    ``tol`` as checked by :func:`scipy_gpuqr._validate.check_tol`; ``started``:
    the ``perf_counter`` time the caller's validation began (default now);
    ``known``: as :class:`FactoredQR` takes it.
    """
    started = time.perf_counter() if started is None else started
    if planned is None:
        planned = plan_for(mi, settings, ordering=ordering)
    return FactoredQR(mi, planned, tol=tol, started=started, known=known)


@contextlib.contextmanager
def released(F):
    """``with released(factorize(...)) as F:`` -- a call's own factorization,
    freed when the block ends (normally or by an exception), so that its device
    memory does not wait for Python's cyclic collector."""
    try:
        yield F
    finally:
        if F is not None:
            F.free()


def least_squares_probe(A, analysis, backend: str):
    """``run(num)``: the least-squares solve ``lsqr`` runs on a factorization
    ``num`` of A (the rank decision and one right-hand side, on the device the
    factorization chose), for the calibration's timer
    (:func:`scipy_gpuqr._dispatch.calibrate.calibrate_sparse`)."""
    b = np.asarray(A @ np.ones(A.shape[1]), dtype=np.float64)
    b += 1e-3 * np.linalg.norm(b) / max(np.sqrt(b.size), 1.0) * np.cos(np.arange(b.size))

    own = factorizer(backend)[0]            # any factorization but A's: the backend itself

    def run(num):
        plan = Plan(backend=backend, requested=backend, source="calibration",
                    analysis=analysis, factorize_fn=own).with_factors(A, num)
        FactoredQR(as_matrix(A), (A, plan)).least_squares(b[:, None])

    return run


def _cod_factorizer(factorize_fn):
    """The rank decision's sparse factorizer (``G, *, tol ↦ NumericQR``) over the plan's
    ``factorize_fn``. It does not hold the :class:`FactoredQR`: a bound method there
    made a reference cycle (factorization → solver → method → factorization), so a
    finished call's factors, device memory included, lived until a collection."""
    def factorize(G, *, tol):
        return factorize_fn(sp.csc_array(G), ordering="colamd", colperm=None, tol=tol,
                            analysis=None)
    return factorize


class FactoredQR:
    """The factors of one matrix and the solves built on them (float64, no input checks).

    Parameters
    ----------
    mi : MatrixInput
        The validated matrix A, shape (m, n).
    planned : (M, Plan)
        From :func:`plan_for`: M is A, or Aᵀ when m < n.
    tol : None, 'default' or float
        Rank detection during the factorization (None: lstsq's rank rule
        decides afterwards, :class:`~scipy_gpuqr._factor.lstsq.MinNormSolver`).
    started : float, optional
        ``perf_counter`` time the caller's validation began (for ``timings``).
    known : KnownNorms, optional
        The matrix's norms the caller learnt already (a square A's LU), read by
        the rank decision (lstsq's rule, A not transposed) in place of its own
        estimates of R's.

    Attributes
    ----------
    shape : tuple
        (m, n) of A.
    transposed : bool
        Aᵀ was factorized (m < n).
    dtype : numpy.dtype
        SciPy's working dtype of A.
    on_gpu : bool
        The caller passed CuPy/cupyx data.
    plan : Plan
    num : NumericQR or None
        The backend's factors (None once freed).
    tol : None, 'default' or float
    timings : dict
        Seconds per phase.
    """

    def __init__(self, mi: MatrixInput, planned, *, tol=None, started=None,
                 known: Optional[KnownNorms] = None):
        t0 = time.perf_counter() if started is None else started
        self.tol = tol
        self._known = known
        self.on_gpu = mi.on_gpu
        self.dtype = mi.dtype
        self.shape = mi.shape
        m, n = mi.shape
        self.transposed = m < n
        self.pattern = (mi.A.indptr.copy(), mi.A.indices.copy())
        M, self.plan = planned
        t1 = time.perf_counter()
        self.timings = {"validate": t1 - t0 - self.plan.analyze_time,
                        "analyze": self.plan.analyze_time}
        self.M = M
        self.num = None
        self._Md = None
        self._solver = None
        self._dsolve = None
        self._qtb = None                # (B, (QᵀB)[:rows of R]) within a least_squares call
        self._qtb_queued = None         # (B, the same on the device, queued: _qt_rows_device)
        self._fused = None              # (B, R⁻¹(QᵀB)[:q]) solved with the rank probe's block
        self._diagonal = None           # |diag(R)| where the fused solve took it
        self._run(M)

    # -- phases ----------------------------------------------------------------
    def _run(self, M):
        t0 = time.perf_counter()
        self.num = self.plan.factorize(M, tol=self.tol)
        self.timings["factorize"] = time.perf_counter() - t0
        self._solver = None
        self._diagonal = None
        self._dsolve = None
        self._Md = None

    def refactor(self, M: sp.csc_array, dtype) -> None:
        """Factorize M (same pattern as the planned matrix; Aᵀ when transposed)."""
        self.M = M
        self.dtype = dtype
        self._known = None              # another matrix: what was known of A is not of it
        self._run(M)

    def rank_decision(self, rhs: Optional[np.ndarray] = None,
                      probe_start: Optional[tuple] = None) -> MinNormSolver:
        """The rank decision and minimum-norm solver, made once per factorization.

        ``rhs``: the host B (m × k) that :meth:`least_squares` solves next, for a
        decision that solves with R anyway to take ``Qᵀb`` into that solve
        (:class:`~scipy_gpuqr._factor.lstsq.MinNormSolver`'s ``rhs``; tall A, lstsq's
        rule): ``Qᵀb`` is then computed during the decision, once.
        ``probe_start``: the full-rank probe's block and its solve, formed with
        the right-hand sides' (:meth:`_fused_probe_solve`)."""
        if self._solver is None:
            t0 = time.perf_counter()
            num = self.num
            m, n = self.shape
            if self.tol is None:
                R = num.R
                cutoff = lstsq_cutoff(m, n)
            else:
                r = int(num.rank)
                R = sp.csc_array(num.R)[:r]
                cutoff = 0.0  # rank already decided by the backend
            # the rank refinement runs where the factorization ran
            device = "gpu" if num.info.get("backend") == "gpu" else "cpu"
            # auto that factorized on the CPU with a GPU present (it consulted
            # the GPU's threshold) runs the dense refinements there too
            gpu_seen = self.plan.requested == "auto" and self.plan.gpu_name is not None
            given = (functools.partial(self._qt_rows, rhs)
                     if rhs is not None and rhs.shape[1] and not self.transposed
                     and self.tol is None else None)
            self._solver = MinNormSolver(R, cutoff, transposed=self.transposed,
                                         factorize=_cod_factorizer(self.plan.factorize_fn),
                                         device=device,
                                         solves=self._device_triangular(),
                                         products=self._device_products(),
                                         dense_device="gpu" if device == "gpu" or gpu_seen
                                         else "cpu", rhs=given,
                                         rhs_beside=given is not None and self._beside(),
                                         rhs_device=self._device_rhs(rhs, given),
                                         probe_start=probe_start,
                                         diagonal=self._diagonal if self.tol is None else None,
                                         fro_bound=frobenius_bound(self.M),
                                         known=self._known if self.tol is None else None)
            self._diagonal = None
            self._known = None
            self.timings["rank_decision"] = time.perf_counter() - t0
        return self._solver

    def require(self):
        """Raise ValueError once the factors were freed."""
        if self.num is None:
            raise ValueError("this QRFactorization was freed")

    @property
    def rank(self) -> int:
        """Numerical rank: lstsq's rule (tol=None) or the backend's (tol given)."""
        if self.tol is not None:
            return int(self.num.rank)
        return int(self.rank_decision().rank)

    @property
    def perm(self) -> np.ndarray:
        """Column permutation of the factored matrix."""
        return self.num.colperm

    @property
    def info(self) -> dict:
        """What ran where and why, flops, intensity and timings."""
        out = self.plan.summary()
        out.update(shape=tuple(self.shape), transposed=self.transposed,
                   tol=self.tol, timings=dict(self.timings))
        if self.num is not None:
            ran = self.num.info.get("backend")
            if ran and ran != out["backend"] and self.num.info.get("fallback"):
                out["backend"] = ran        # what ran (the planned engine fell back)
                out["reasons"].append(f"{out['requested']!r} fell back: "
                                      f"{self.num.info['fallback']}; {ran!r} ran")
            out["flops_backend"] = float(self.num.flops)
            out["backend_info"] = dict(self.num.info)
            out["rank_backend"] = int(self.num.rank)
            if self._solver is not None:
                out["rank_decision"] = self._solver.summary()
        return out

    # -- the device path (GPU factorizations) ------------------------------------------
    def on_device(self) -> bool:
        """The factorization's Householder data lie on a CUDA device."""
        f = getattr(self.num, "on_device", None)
        return bool(f is not None and f())

    def device_least_squares_ok(self, B=None) -> bool:
        """Full-rank least squares on the device: GPU factors, lstsq's rule says full rank.

        ``B``: the float64 CuPy (m, k) right-hand sides :meth:`device_least_squares`
        is given next; where the decision is still to make, the least-squares
        solve and the full-rank probe's first step are then one solve with R
        (:meth:`_fused_probe_solve`)."""
        if B is not None and self._solver is None:
            self.rank_decision(probe_start=self._fused_probe_solve(B))
        ok = (self.on_device() and self.tol is None
              and self.rank_decision().method == "triangular")
        if not ok:
            self._fused = None          # the host's rules answer: the solve is not used
        return ok

    def _fused_probe_solve(self, B):
        """``(Ω, R⁻¹Ω)`` for the rank decision's full-rank probe, solved together with
        ``R⁻¹ (QᵀB)[:q]`` (kept for :meth:`device_least_squares` of this B): one
        solve with R of k + p columns instead of two, on the device.

        Only where the probe will be the decision's first test (GPU factors of a
        tall A, a square R beyond the dense rules' order, a diagonal that does not
        already prove a deficiency: the order of :class:`MinNormSolver`'s rules);
        None elsewhere, or where the solve does not fit the device's memory.
        """
        if not (self.on_device() and self.tol is None and not self.transposed
                and self._solver is None and B.shape[1]):
            return None
        R = sp.csc_array(self.num.R)
        q = R.shape[1]
        if R.shape[0] != q or q <= DENSE_LIMIT or q < SOLVE_RANK_MIN_ORDER:
            return None
        d = self._diagonal = abs_diagonal(R)
        if not (np.all(np.isfinite(d)) and d.min() > lstsq_cutoff(*self.shape) * d.max()):
            return None
        import cupy as cp               # optional dependency: GPU factors only
        ds = self.device_solves()
        k = B.shape[1]
        try:
            omega = array_ops.normal_block(0, (q, min(PROBE_COLUMNS, q)))  # probe_norm's draw
            C = cp.empty((q, k + omega.shape[1]), dtype=np.float64)
            # prefetched copies (CuPy's concatenate would compile on this thread)
            array_ops.copy_into(C[:, :k], self._device_apply(B, True)[:q])
            array_ops.copy_into(C[:, k:], omega)
            Y = ds.upper(C)
        except MemoryError:             # CuPy's OutOfMemoryError: the decision solves alone
            return None
        self._fused = (B, Y[:, :k])
        return omega, Y[:, k:]

    def _device_triangular(self):
        """Wrappers of the device's ``R⁻¹·`` and ``R⁻ᵀ·`` (GPU factors, no rank
        detection) for the rank decision: host arrays in → host out, CuPy in →
        CuPy out (blocks kept on the device); else None.

        A solve that runs out of device memory (a GPU under a pool limit, or
        shared with other work; CuPy's OutOfMemoryError is a MemoryError) is
        tried again after the rows of R kept on the device between solves are
        dropped (staged factorizations), then on blocks of its columns
        (:func:`_solve_in_column_blocks`); only where not even one column fits
        does it hand this and every later solve to the host's solves with R
        (logged: they cost far more on a large R)."""
        if self.tol is not None or not self.on_device():
            return None
        import cupy as cp               # optional dependency: GPU factors only
        ds = self.device_solves()
        num = self.num                  # not self: the solver these go into is self's
        host = []                       # the host's (up, upt), once the device ran out

        def solves_with(device_solve, which: int):
            def solve(C):
                if not host:
                    Y = _solve_in_column_blocks(device_solve, C, getattr(ds, "release_kept", None),
                                                cp)
                    if Y is not None:
                        return Y
                    logging.getLogger("scipy_gpuqr").info(
                        "R's solves: the device ran out of memory even for one column; the "
                        "host's solves with R answer from now on")
                    host.extend(UpperTriangular(sp.csc_array(num.R)).solves())
                on_device = isinstance(C, cp.ndarray)
                Y = host[which](C.get() if on_device else np.asarray(C, dtype=np.float64))
                return cp.asarray(Y) if on_device else Y
            return solve
        return solves_with(ds.upper, 0), solves_with(ds.upper_transposed, 1)

    def _device_products(self):
        """Wrappers of the device's ``R·`` and ``Rᵀ·`` from R's rows on the device
        (GPU factors, no rank detection) for the rank decision's refinements:
        host arrays in and out; a wrapper answers None where the device cannot
        form the product (R not square, a stage solved from the host in panels,
        an engine without it) or runs out of memory, and the host multiplies
        instead. None without GPU factors."""
        if self.tol is not None or not self.on_device():
            return None
        import cupy as cp               # optional dependency: GPU factors only
        ds = self.device_solves()
        multiply = getattr(ds, "multiply", None)
        if multiply is None:
            return None

        def product_with(transposed: bool):
            def product(Y):
                try:
                    out = multiply(cp.asarray(np.ascontiguousarray(Y, dtype=np.float64)),
                                   transposed)
                except MemoryError:     # CuPy's OutOfMemoryError: the host's product
                    return None
                return None if out is None else out.get()
            return product
        return product_with(False), product_with(True)

    def _resident(self) -> bool:
        """GPU factors whose every stage's pool lies on the device: ``Qᵀb`` then
        reads nothing over the link (no earlier stage sent up, no host front)."""
        return self.on_device() and not getattr(self.num, "_host_pools", True)

    def _beside(self) -> bool:
        """Whether the rank decision fetches ``Qᵀb`` beside its first block's solve:
        GPU factors on the device whole (:meth:`_resident`), or staged ones where
        the engine says so (``fetch_beside``: the replay bound by the link, the
        block's solves by the device)."""
        if self._resident():
            return True
        return self.on_device() and fetch_beside(self.num)

    def _device_rhs(self, B, given):
        """The rank decision's ``rhs_device`` (:class:`MinNormSolver`): ``(QᵀB)[:rows
        of R]`` queued on the device (:meth:`_qt_rows_device`), for GPU factors on the
        device whole (:meth:`_resident`) where the decision is given ``given`` (the
        host block's callable); else None (a staged factorization's replay sends
        stages up over the link: its ``Qᵀb`` is fetched before the block's thin QR)."""
        if given is None or not self._resident():
            return None
        return functools.partial(self._qt_rows_device, B)

    def _qt_rows_device(self, B: np.ndarray):
        """``(Qᵀ B)[:rows of R]`` queued on the device: a CuPy array, not waited for.
        Kept, so that :meth:`_qt_rows` of the same B fetches it (the same values as
        its own replay) instead of applying ``Qᵀ`` again."""
        import cupy as cp               # optional dependency: GPU factors only
        k = self.num.R.shape[0]
        C = self.num.qt_matmul(cp.asarray(B))[:k]     # its host call's replay, CuPy out
        self._qtb_queued = (B, C)
        return C

    def device_solves(self):
        """The GPU engine's triangular solves with these factors (made once)."""
        if self._dsolve is None:
            self._dsolve = self.plan.device_solves(self.num)
        return self._dsolve

    def _device_apply(self, B, trans: bool):
        return self.plan.device_matmul(self.num, B, trans=trans)

    def device_least_squares(self, B):
        """Float64 CuPy (n, k) solution for float64 CuPy B of shape (m, k).

        Refined on the device as the host solve is (:meth:`refines`)."""
        t0 = time.perf_counter()
        ds = self.device_solves()
        fused, self._fused = self._fused, None
        if not self.transposed:
            def solve(C):
                return ds.forward(lambda Y: self._device_apply(Y, True), C, self.shape[1])
            import cupy as cp           # optional dependency: GPU factors only
            if fused is not None and fused[0] is B:     # R⁻¹(QᵀB)[:q], solved with the probe
                X = cp.empty((self.shape[1], B.shape[1]), dtype=np.float64)
                array_ops.put_rows(X, ds.perm, fused[1])  # X[perm] = Y, prefetched
            else:
                X = solve(B)
            X = self._refined(solve, self._device_matrix, B, X,
                              lambda Y: float(cp.linalg.norm(Y)))
        else:
            X = ds.backward(lambda Y: self._device_apply(Y, False), B, self.num.shape[0])
        self.timings["solve"] = time.perf_counter() - t0
        return X

    def refines(self) -> bool:
        """Whether tall least-squares solves refine: ill-conditioned retained part
        (eps times its condition estimate above :data:`REFINE_ABOVE`)."""
        return self.rank_decision().retained_condition() * _EPS > REFINE_ABOVE

    def _refined(self, solve, matrix, B, X, norm):
        """``X`` (solution of the tall problem for ``B``) refined in place where
        :meth:`refines` says so: at most :data:`REFINE_STEPS` steps ``X += solve(B − M X)``
        with A's own residuals (not Q R's), which take the backward error down to the
        rank cutoff's level. ``matrix()`` gives M and ``norm`` a float 2-norm, of the
        array module of B and X (host or device)."""
        if not (B.shape[1] and self.refines()):
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
        if self._Md is None:
            self._Md = device_csr(self.M)
        return self._Md

    # -- solves ------------------------------------------------------------------------
    def exact_solve(self, B: np.ndarray, *, trans: bool = False) -> np.ndarray:
        """``A X = B`` (or ``Aᵀ X = B``) for square A, no rank rule (see ``exact_solve``).

        On the device for GPU factorizations (host B and X)."""
        n = self.shape[1]
        if not self.on_device() or B.shape[1] == 0 or n == 0:
            return exact_solve(self.num, B, trans=trans)
        import cupy as cp               # optional dependency: GPU factors only
        return self.exact_solve_device(cp.asarray(B, dtype=np.float64), trans=trans).get()

    def exact_solve_device(self, Bd, *, trans: bool = False):
        """``A X = Bd`` (or ``Aᵀ X = Bd``) for square A on the device: float64 CuPy
        Bd of shape (n, k) in, CuPy X out (GPU factors, no rank rule)."""
        n = self.shape[1]
        if Bd.shape[1] == 0 or n == 0:
            import cupy as cp           # optional dependency: GPU factors only
            return cp.zeros((n, Bd.shape[1]))
        ds = self.device_solves()
        if trans:
            return ds.backward(lambda Y: self._device_apply(Y, False), Bd, n)
        return ds.forward(lambda Y: self._device_apply(Y, True), Bd, n)

    def least_squares(self, B: np.ndarray) -> np.ndarray:
        """Float64 (n, k) minimum-norm least-squares solution for float64 B of shape (m, k).

        NumPy in and out; a full-rank problem on GPU factors is solved on the device."""
        try:
            return self._least_squares(B)
        finally:
            self._qtb = None            # Qᵀb of this call's B (_qt_rows) not kept
            self._qtb_queued = None
            self._fused = None

    def _least_squares(self, B: np.ndarray) -> np.ndarray:
        Bd = None
        if B.shape[1] and self._solver is None:
            start = None
            if self.on_device():
                import cupy as cp       # optional dependency: GPU factors only
                Bd = cp.asarray(B, dtype=np.float64)
                start = self._fused_probe_solve(Bd)
            # Qᵀb taken into the decision's solve where one runs
            self.rank_decision(rhs=B, probe_start=start)
        if B.shape[1] and self.device_least_squares_ok():
            import cupy as cp           # optional dependency: GPU factors only
            try:
                return self.device_least_squares(
                    Bd if Bd is not None else cp.asarray(B, dtype=np.float64)).get()
            except MemoryError:         # the device's solves do not fit: the host's answer
                cp.get_default_memory_pool().free_all_blocks()
        t0 = time.perf_counter()
        num = self.num
        solver = self.rank_decision()
        m, n = self.shape
        if not self.transposed:
            def solve(C):
                return self._tall_host(C, solver)
            # the stopping test's norm without NumPy's BLAS: its dot spreads a vector
            # of more than 10000 entries over every thread of its pool, whose workers
            # then spin through the rest of the call
            X = self._refined(solve, lambda: self.M, B, solve(B),
                              lambda Y: float(np.sqrt(np.sum(np.square(Y)))))
        else:
            Bp = B[num.colperm]
            Z = solver.solve(Bp)
            pad = np.zeros((n, B.shape[1]))
            pad[:Z.shape[0]] = Z
            X = num.q_matmul(pad) if B.shape[1] else pad
        self.timings["solve"] = time.perf_counter() - t0
        return X

    def _qt_rows(self, B: np.ndarray) -> np.ndarray:
        """``(Qᵀ B)[:rows of R]`` (host), computed once for the B of one
        :meth:`least_squares` call (the rank decision may ask for it first)."""
        cached = getattr(self, "_qtb", None)
        if cached is not None and cached[0] is B:
            return cached[1]
        k = self.num.R.shape[0]
        queued, self._qtb_queued = getattr(self, "_qtb_queued", None), None
        if queued is not None and queued[0] is B:
            C = queued[1].get()         # queued by _qt_rows_device: fetched, not replayed
        else:
            C = self.num.qt_matmul(B)[:k] if B.shape[1] else np.zeros((k, 0))
        self._qtb = (B, C)
        return C

    def _tall_host(self, B: np.ndarray, solver: MinNormSolver) -> np.ndarray:
        """``X[colperm] = G⁺ (Qᵀ B)[:rows of G]`` on the host (m >= n)."""
        C = self._qt_rows(B)
        if self.tol is not None:
            C = C[:solver.R.shape[0]]
        X = np.empty((self.shape[1], B.shape[1]))
        X[self.num.colperm] = solver.solve(C)
        return X

    def free(self) -> None:
        """Release the factors (device memory, C objects); idempotent."""
        if self.num is not None:
            self.num.free()
        self.num = None
        self._solver = None
        self._dsolve = None
        self._Md = None
        self._fused = None

    # -- pickling: data, never handles ---------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_solver"] = None
        state["_dsolve"] = None
        state["_Md"] = None
        state["_qtb"] = None
        state["_qtb_queued"] = None
        state["_fused"] = None
        state["_diagonal"] = None
        state["_known"] = None
        num = state.get("num")
        plan = state["plan"]
        state["plan_fields"] = {k: getattr(plan, k) for k in
                                ("backend", "requested", "source", "reasons",
                                 "ordering", "colperm", "analyze_time")}
        state["plan"] = None
        if num is not None:
            try:
                pickle.dumps(num)
            except Exception:  # device or C handles: refactorize on load
                state["num"] = None
                state["refactor_on_load"] = True
        return state

    def __setstate__(self, state):
        fields = state.pop("plan_fields")
        refactor = state.pop("refactor_on_load", False)
        self._fused = None              # absent from the pickles of earlier versions
        self._qtb_queued = None
        self._diagonal = None
        self._known = None
        self.__dict__.update(state)
        factorize_fn, _, _ = factorizer(fields["backend"])
        self.plan = Plan(factorize_fn=factorize_fn, **fields)
        if refactor:
            self._run(self.M)


def _solve_in_column_blocks(device_solve, C, release, cp):
    """``device_solve(C)`` (C on the host or the device, (q, k); the answer where C
    lies), on blocks of C's columns when the device cannot hold them all.

    After an out-of-memory (CuPy's OutOfMemoryError is a MemoryError) the pool's
    cached blocks are released and, once, ``release`` (dropping what the solves
    keep on the device; whether it freed anything) is called before the same
    block is tried again; otherwise the block is halved. The blocks' answers are
    gathered on the host. None when not even one column fits.
    """
    on_device = isinstance(C, cp.ndarray)
    k = C.shape[1] if C.ndim == 2 else 1
    step, c0, out = max(k, 1), 0, None
    while c0 < k or out is None:
        c1 = min(k, c0 + step)
        whole = c0 == 0 and c1 == k
        try:
            Y = device_solve(cp.asarray(C if whole else C[:, c0:c1], dtype=np.float64))
        except MemoryError:
            cp.get_default_memory_pool().free_all_blocks()
            if release is not None and release():
                release = None          # the kept rows made room: the same block again
            elif step > 1:
                step //= 2
            else:
                return None
            continue
        if whole:
            return Y if on_device else Y.get()
        if out is None:
            out = np.empty((Y.shape[0], k), dtype=np.float64)
        out[:, c0:c1] = Y.get()
        c0 = c1
    return cp.asarray(out) if on_device else out
