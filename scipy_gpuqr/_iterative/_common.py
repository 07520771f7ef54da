"""What LSQR and LSMR share: the device-side Golub-Kahan step, the one host fetch per
iteration, SciPy's stopping rules, the wall-clock allowance and the result types.

Both solvers are Golub-Kahan bidiagonalizations of A whose scalar recurrences
(plane rotations, norm estimates, stopping tests) run on the host in float64
while every vector stays in the array module ``xp`` (NumPy, or CuPy on a
GPU). The host needs three norms per iteration: beta and alpha of the
bidiagonalization step, and one norm that exists only once the iterate has
been updated (LSQR: ``‖d_k‖`` for its condition estimate; LSMR: ``‖x_k‖``).
:func:`drive` gathers them in ONE device→host copy per iteration by
*pipelining*: the stopping test of iteration k runs after the
bidiagonalization step of iteration k+1 has been queued, its norm fetched
together with that step's beta and alpha (the three sums of squares sit in
one 4-slot device buffer, copied whole). When the test stops the run, the
queued step is dropped (its u and v are never used; x, the iterate, is still
x_k), so the results are those of the unpipelined recurrence, bit for bit.
The price is one wasted pair of matrix-vector products at the end of a run.
On NumPy nothing is copied and the test runs at once (no speculative step).

A breakdown of the bidiagonalization (``beta = 0``: SciPy then keeps ``u``
unscaled and leaves ``v`` and ``alpha`` alone) is handled on the device
without a fetch: ``u`` is scaled by ``1/beta`` only where ``beta > 0``, and
the candidate ``v`` is adopted by the host only after it has seen beta.

The vector operations are :class:`NumpyOps` (SciPy's expressions, so the
NumPy path is bit-identical to SciPy's) or :class:`CupyOps` (the same
operations fused into a few CuPy kernels).

Everything here works on float64 real data; complex problems are refused
(SciPy's lsqr/lsmr, which accept them, answer those).
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque, namedtuple
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from .._gpu import import_cupy, is_cupy_array, is_cupy_sparse
from .._kernels import load_module
from .._validate import device_csr

try:        # SciPy's compiled sparse kernels (private: used where found, see _compressed_products)
    from scipy.sparse import _sparsetools
except ImportError:     # pragma: no cover - every SciPy release so far has it
    _sparsetools = None

__all__ = ["EPS", "RunInfo", "IterationState", "Problem", "NumpyOps", "CupyOps", "make_ops",
           "compressed_kernels", "format_kernels",
           "GolubKahan", "SLOT_DEFERRED",
           "givens", "stopping_code", "Progress", "Clock", "drive", "run_info", "Start", "begin",
           "print_summary", "result_class"]

#: float64 machine epsilon, as SciPy's lsqr/lsmr use it.
EPS = np.finfo(np.float64).eps

#: Iterations of test history the projection of :attr:`RunInfo.projected_iterations`
#: is fitted to.
PROJECTION_WINDOW = 20

_MESSAGES = ("The exact solution is x = 0, or x = x0",
             "Ax - b is small enough, given atol, btol",
             "The least-squares solution is good enough, given atol",
             "The estimate of cond(Abar) has exceeded conlim",
             "Ax - b is small enough for this machine",
             "The least-squares solution is good enough for this machine",
             "Cond(Abar) seems to be too large for this machine",
             "The iteration limit has been reached")


# ---------------------------------------------------------------------------
# results

class RunInfo:
    """How a run ended beyond SciPy's ``istop``, mixed into the result tuples.

    Attributes
    ----------
    allowance_spent : bool
        The ``max_seconds`` allowance ran out before any of SciPy's stopping
        tests fired; the run stopped after a whole iteration and ``istop``
        is 0 (a value SciPy gives only for ``itn == 0``). Never true when a
        test fired in the same iteration: SciPy's ``istop`` wins.
    stopped_by_callback : bool
        The callback returned True before any stopping test fired; ``istop``
        is 0 as above.
    projected_iterations : int or None
        An estimate of the further iterations the solver would need before
        a tolerance test (``istop`` 1, 2, 4 or 5) fires, from the rate at
        which ``test1 / rtol`` and ``test2 / atol`` fell over the last
        :data:`PROJECTION_WINDOW` iterations (a least-squares fit of their
        logarithms; the sooner of the two). 0 when a tolerance test fired or
        ``b - A x0`` was already exact; None when the condition limit stopped
        the run (``istop`` 3 or 6), when fewer than three iterations ran, or
        when neither test is falling. A crude, linear extrapolation: LSQR
        and LSMR often speed up late (superlinear phases) or stall.
    seconds : float
        Wall-clock seconds of the call.
    host_syncs : int
        Device→host copies made (0 on NumPy): one per iteration, plus one
        for the start and one that carries the last iteration's stopping
        test (``itn + 2`` in all; 1 when the start already decides).
    replayed : bool
        The host loop (:mod:`scipy_gpuqr._iterative.host`) ran the recurrences
        again on NumPy scalars after Python's float arithmetic raised where
        NumPy's returns inf or NaN (the result is the same either way).
    """

    allowance_spent: bool = False
    stopped_by_callback: bool = False
    seconds: float = 0.0
    host_syncs: int = 0
    replayed: bool = False

    @property
    def projected_iterations(self) -> Optional[int]:
        """See the class notes (fitted when first read: most callers never read it, and the
        fit costs as much as many iterations of a small problem)."""
        value = self.__dict__.get("_projected")
        if callable(value):
            value = self.__dict__["_projected"] = value()
        return value

    def scipy_tuple(self) -> tuple:
        """The plain tuple SciPy's function returns, without the extra attributes."""
        return tuple(self)

    def __getstate__(self):
        self.projected_iterations       # a pickled result carries the value, not the fit
        return self.__dict__

    @classmethod
    def build(cls, fields, info: dict):
        """The result tuple ``cls(*fields)`` carrying the run attributes ``info``
        (``projected_iterations`` may be a function of no arguments that gives it)."""
        out = cls(*fields)
        info = dict(info)
        out.__dict__["_projected"] = info.pop("projected_iterations", None)
        out.__dict__.update(info)
        return out


def result_class(name: str, fields: str, doc: str, module: str):
    """A tuple subclass with SciPy's fields (by position and name) plus :class:`RunInfo`.

    ``module`` is where the class is bound to ``name`` (pickle finds it there).
    """
    base = namedtuple("_" + name + "Fields", fields, module=module)
    return type(name, (base, RunInfo), {"__doc__": doc, "__module__": module,
                                        "__repr__": _result_repr})


def _result_repr(self) -> str:
    parts = [f"{k}={v!r}" for k, v in zip(self._fields, self) if k not in ("x", "var")]
    extra = (f"allowance_spent={self.allowance_spent}, "
             f"stopped_by_callback={self.stopped_by_callback}, "
             f"projected_iterations={self.projected_iterations}")
    return f"{type(self).__name__}(x=<{len(self.x)} values>, {', '.join(parts)}, {extra})"


class IterationState(NamedTuple):
    """What a callback sees after each iteration (the same fields for LSQR and LSMR).

    Immutable; a named tuple rather than a frozen dataclass because one is
    made per iteration of a watched run (a frozen dataclass' constructor
    costs several times a tuple's, beside iterations of microseconds).

    Attributes
    ----------
    itn : int
        The iteration just finished.
    x : array
        The current iterate, in the solver's array module. It is the
        solver's own buffer: read it, do not modify it or keep it (the next
        iteration updates it in place).
    istop : int
        SciPy's code for this iteration: 0 unless a stopping test fired.
    normr : float
        The residual norm the tests use (LSQR's ``r2norm``, LSMR's ``normr``).
    normar, norma, conda, normx : float
        The estimates of ``‖Aᵀr‖``, ``‖A‖``, ``cond(A)`` and ``‖x‖``.
    test1, test2 : float
        ``normr / ‖b‖`` and ``normar / (norma·normr)``: a run stops when
        ``test1 <= rtol`` or ``test2 <= atol``.
    rtol : float
        ``btol + atol·norma·normx / ‖b‖``.
    seconds : float
        Wall-clock seconds since the call began.
    """

    itn: int
    x: Any
    istop: int
    normr: float
    normar: float
    norma: float
    conda: float
    normx: float
    test1: float
    test2: float
    rtol: float
    seconds: float


# ---------------------------------------------------------------------------
# inputs

def _array_module(b, xp):
    if xp is not None:
        if xp is not np and getattr(xp, "__name__", "") != "cupy":
            raise TypeError(f"xp must be numpy or cupy, got {xp!r}")
        return xp
    if is_cupy_array(b):
        return import_cupy()
    return np


def _is_complex(dtype) -> bool:
    return dtype is not None and np.dtype(dtype).kind == "c"


class Problem:
    """A, its transpose, b and x0, checked and placed in the array module ``xp``.

    ``A`` is used only through ``A @ v`` and ``A.T @ u``. Under CuPy a SciPy
    sparse matrix or a NumPy array is copied to the device once; a cupyx
    sparse matrix becomes float64 CSR with an explicit CSR transpose (twice
    the memory; cuSPARSE's untransposed SpMV is faster than its transposed
    one, and deterministic).

    Attributes
    ----------
    xp : module
    A : operator
    AT : operator or None
        Aᵀ, where the products go through ``@`` (None where SciPy's kernels
        are called directly).
    matvec, rmatvec : callable
        ``v -> A v`` and ``u -> Aᵀ u``.
    b : array, shape (m,), float64
    x0 : array, shape (n,), float64 (a private copy), or None
    m, n : int
    """

    def __init__(self, A, b, x0, xp):
        self.xp = xp = _array_module(b, xp)
        if isinstance(A, np.matrix):
            A = np.asarray(A)
        if xp is not np:
            A = _to_device(A, xp)
        shape = getattr(A, "shape", None)
        if shape is None or len(shape) != 2:
            raise ValueError("A must be a two-dimensional matrix or operator")
        self.m, self.n = int(shape[0]), int(shape[1])
        if _is_complex(getattr(A, "dtype", None)):
            raise TypeError("complex A is not supported (SciPy's lsqr/lsmr handle it)")
        self.A = A
        fast = _compressed_products(A) if xp is np else None
        if fast is None:
            self.AT = _transpose(A, xp)
            self.matvec, self.rmatvec = A.__matmul__, self.AT.__matmul__
        else:
            self.AT = None
            self.matvec, self.rmatvec = fast
        self.b = self._vector(b, self.m, "b")
        self.x0 = None if x0 is None else self._vector(x0, self.n, "x0", copy=True)

    def _vector(self, v, size, name, copy=False):
        xp = self.xp
        v = xp.asarray(v)
        if _is_complex(v.dtype):
            raise TypeError(f"complex {name} is not supported (SciPy's lsqr/lsmr handle it)")
        v = xp.atleast_1d(v)
        if v.ndim > 1:
            v = v.squeeze()
        if v.shape != (size,):
            raise ValueError(f"{name} has shape {v.shape}; A needs ({size},)")
        v = v.astype(np.float64, copy=copy)
        # the device kernels read contiguous vectors (a strided b, e.g. a column, is copied)
        return v if xp is np else xp.ascontiguousarray(v)


def _to_device(A, cp):
    if sp.issparse(A):
        return device_csr(A)
    if isinstance(A, np.ndarray):
        return cp.asarray(A, dtype=np.float64)
    if is_cupy_sparse(A):
        A = A.tocsr()
        return A if A.dtype == np.float64 else A.astype(np.float64)
    return A


def compressed_kernels(A):
    """SciPy's compiled kernels of ``A @ v`` and ``A.T @ u`` for a float64 SciPy CSR/CSC A, or None.

    ``(forward, backward)``: ``forward(m, n, indptr, indices, data, v, y)`` adds
    ``A v`` into y and ``backward(n, m, indptr, indices, data, u, z)`` adds
    ``Aᵀ u`` into z — the calls SciPy's ``A @ v`` makes (``_sparsetools.csr_matvec``
    or ``csc_matvec`` into a vector of zeros), and ``A.T @ u`` (the same
    arrays read as the transpose's format). None for other formats, dtypes
    and dimensions, or where SciPy's private kernels are not found.
    """
    fmt = getattr(A, "format", None)
    if fmt not in ("csr", "csc") or not sp.issparse(A) or A.dtype != np.float64 \
            or getattr(A, "ndim", 2) != 2:
        return None
    return format_kernels(fmt)


@functools.lru_cache(maxsize=None)
def format_kernels(fmt: str):
    """:func:`compressed_kernels` for an A already known to be a float64 SciPy
    array or matrix of format ``fmt`` (``'csr'`` or ``'csc'``): no checks of A,
    for callers that made them (looked up once per format)."""
    forward = getattr(_sparsetools, fmt + "_matvec", None)
    backward = getattr(_sparsetools, ("csc" if fmt == "csr" else "csr") + "_matvec", None)
    if forward is None or backward is None:
        return None
    return forward, backward


def _compressed_products(A):
    """``(A @ v, Aᵀ @ u)`` for a float64 SciPy CSR/CSC A on NumPy vectors, or None.

    The products are SciPy's own kernels (:func:`compressed_kernels`) called
    with the arrays ``A @ v`` and ``A.T @ u`` pass them, so the results are
    the same bits; what is skipped is the per-call dispatch and the
    transposed matrix object (its constructor's checks), which cost more
    than the product on small matrices. None (the generic ``@``) where
    :func:`compressed_kernels` finds none.
    """
    kernels = compressed_kernels(A)
    if kernels is None:
        return None
    forward, backward = kernels
    m, n = (int(s) for s in A.shape)
    indptr, indices, data = A.indptr, A.indices, A.data

    def matvec(v):
        out = np.zeros(m)
        forward(m, n, indptr, indices, data, v, out)
        return out

    def rmatvec(u):
        out = np.zeros(n)
        backward(n, m, indptr, indices, data, u, out)
        return out
    return matvec, rmatvec


def _transpose(A, xp):
    if xp is not np and is_cupy_sparse(A):
        T = A.T.tocsr()
        if getattr(A, "_has_canonical_format", False):
            T.has_canonical_format = True       # a canonical matrix's transpose is canonical
        return T
    return A.T


# ---------------------------------------------------------------------------
# the vector operations and the device→host link

#: Scalar slots: the device scalars one iteration fetches are sums of squares
#: written to fixed slots, so that one copy of the slot buffer fetches them all.
SLOT_BETA, SLOT_ALPHA, SLOT_DEFERRED, SLOT_B = range(4)


class NumpyOps:
    """The vector operations of LSQR/LSMR in NumPy, in SciPy's exact expressions.

    Each operation performs the arithmetic of the SciPy statement it stands
    for, in the same order (``A v − alpha·u`` as ``u *= alpha; t -= u``,
    scaling by ``1/beta`` with ``beta = sqrt(t·t)``, ...), so the iterates
    are bit-identical to SciPy's. Sums of squares go to the scalar slots;
    :meth:`fetch` reads them (nothing crosses a bus; :attr:`count` stays 0).
    """

    def __init__(self, n):
        self.slots = [np.float64(0.0)] * 4
        self.count = 0
        self._scratch = np.empty(n, dtype=np.float64)

    def fetch(self, *slots):
        """The values of ``slots`` as ``numpy.float64`` scalars."""
        values = self.slots
        return tuple([np.float64(values[k]) for k in slots])

    def sumsq(self, x, slot):
        """``slots[slot] = x·x``."""
        self.slots[slot] = np.dot(x, x)

    def subtract_scaled(self, t, u, alpha):
        """``t -= alpha·u`` (u is overwritten: SciPy's ``A v − alpha·u``)."""
        u *= alpha
        t -= u

    def scale_by_inverse_root(self, t, slot):
        """``t *= 1/sqrt(s)`` with ``s = slots[slot]`` when ``s > 0`` (else t is kept)."""
        s = self.slots[slot]
        if s > 0:
            t *= 1.0 / np.sqrt(s)

    def subtract_root_scaled(self, c, v, slot):
        """``c -= sqrt(slots[slot])·v``: SciPy's ``Aᵀu − beta·v``."""
        np.multiply(v, np.sqrt(self.slots[slot]), out=self._scratch)
        c -= self._scratch

    def lsqr_update(self, x, w, v, var, rho, phi, theta, slot):
        """LSQR's ``d = w/rho`` (``var += d²``), ``x += (phi/rho) w``, ``w = v − (theta/rho) w``.

        Leaves ``‖d‖²/f`` in ``slot`` and returns the factor ``f`` (here 1:
        ‖d‖² itself, as SciPy computes it).
        """
        d = self._scratch
        np.multiply(w, 1 / rho, out=d)
        self.slots[slot] = np.dot(d, d)
        if var is not None:
            var += d * d
        np.multiply(w, phi / rho, out=d)
        x += d
        w *= -theta / rho
        w += v
        return 1.0

    def lsmr_update(self, x, h, hbar, v, c_hbar, c_x, c_h, slot):
        """LSMR's ``hbar = h + c_hbar·hbar``, ``x += c_x·hbar``, ``h = v + c_h·h``;
        ‖x‖² to ``slot``."""
        hbar *= c_hbar
        hbar += h
        np.multiply(hbar, c_x, out=self._scratch)
        x += self._scratch
        h *= c_h
        h += v
        self.slots[slot] = np.dot(x, x)


#: Source of the device path's vector kernels (relative to ``kernels/``).
VECTOR_OPS_FILE = "iterative/vector_ops.cu"

#: Threads of a vector kernel's block (``VO_THREADS`` in the source).
VECTOR_THREADS = 256

#: Most blocks of a sum of squares (its partials buffer's length).
SUMSQ_MAX_BLOCKS = 512


@functools.lru_cache(maxsize=None)
def _vector_kernels(device: int) -> dict:
    """The kernels of :data:`VECTOR_OPS_FILE` on ``device`` (compiled, or loaded
    from the kernel cache, on first use; one module)."""
    module = load_module(VECTOR_OPS_FILE)
    return {name: module.get_function(f"gpuqr_{name}") for name in
            ("sumsq", "axmy", "scale_inv_root", "sub_root_scaled", "lsqr_update",
             "lsqr_update_var", "lsmr_update")}


class CupyOps:
    """The vector operations of LSQR/LSMR in fused device kernels (:data:`VECTOR_OPS_FILE`).

    Same operations and meanings as :class:`NumpyOps`, fewer launches: each
    statement group is one kernel over contiguous vectors (9 launches besides the two
    products per iteration, against some 20 for the same steps in plain
    CuPy expressions), sums of squares are one reduction each, written
    straight into a 4-slot device buffer, and beta never leaves the device
    until the fetch (the kernels that need it read its slot). LSQR's ‖d‖² is
    fetched as ‖w‖² and scaled by 1/rho² on the host (a reduction with a
    scalar argument ran about 1 ms slower on 2e6 entries). :meth:`fetch`
    copies the whole slot buffer once (:attr:`count` counts the copies).

    Not bit-identical to SciPy: the reductions sum in another order and the
    compiler fuses multiply-adds. The iterates agree with SciPy's to
    rounding, which grows with the condition number as it does between any
    two LSQR/LSMR implementations; the late, rounding-driven steps of
    ‖A‖, cond(A) and ``var`` estimates differ by up to about 1e-3.
    """

    def __init__(self, n):
        cp = import_cupy()
        self.k = _vector_kernels(cp.cuda.Device().id)
        self.buffer = cp.zeros(4, dtype=np.float64)
        self._raw = [self.buffer[i:i + 1] for i in range(4)]
        self._partial = cp.empty(SUMSQ_MAX_BLOCKS, dtype=np.float64)
        self._ticket = cp.zeros(1, dtype=np.uint32)
        self.count = 0

    def _launch(self, name, n, *args):
        """``name`` over vectors of length ``n`` (grid-stride; on the current stream)."""
        blocks = max(1, min(-(-n // VECTOR_THREADS), 4096))
        self.k[name]((blocks,), (VECTOR_THREADS,), (*args, np.int64(n)))

    def fetch(self, *slots):
        """The values of ``slots``, in one device→host copy of the slot buffer."""
        self.count += 1
        values = self.buffer.get()
        return tuple(values[k] for k in slots)

    def sumsq(self, x, slot):
        """``buffer[slot] = x·x`` in one launch (:data:`VECTOR_OPS_FILE`)."""
        n = int(x.size)
        blocks = max(1, min(-(-n // (8 * VECTOR_THREADS)), SUMSQ_MAX_BLOCKS))
        self.k["sumsq"]((blocks,), (VECTOR_THREADS,),
                        (x, np.int64(n), self._partial, self._ticket, self._raw[slot]))

    def subtract_scaled(self, t, u, alpha):
        self._launch("axmy", t.size, u, np.float64(alpha), t)

    def scale_by_inverse_root(self, t, slot):
        self._launch("scale_inv_root", t.size, self._raw[slot], t)

    def subtract_root_scaled(self, c, v, slot):
        self._launch("sub_root_scaled", c.size, v, self._raw[slot], c)

    def lsqr_update(self, x, w, v, var, rho, phi, theta, slot):
        # ‖w‖² to the slot, 1/rho² to the host: ‖d‖² = ‖w‖²/rho²
        self.sumsq(w, slot)
        if var is None:
            self._launch("lsqr_update", x.size, v, np.float64(phi / rho),
                         np.float64(-theta / rho), x, w)
        else:
            self._launch("lsqr_update_var", x.size, v, np.float64(phi / rho),
                         np.float64(-theta / rho), np.float64(1 / rho), x, w, var)
        return (1 / rho) ** 2

    def lsmr_update(self, x, h, hbar, v, c_hbar, c_x, c_h, slot):
        self._launch("lsmr_update", x.size, v, np.float64(c_hbar), np.float64(c_x),
                     np.float64(c_h), x, h, hbar)
        self.sumsq(x, slot)


def make_ops(xp, n):
    """:class:`NumpyOps` or :class:`CupyOps` for vectors of length ``n``."""
    return NumpyOps(n) if xp is np else CupyOps(n)


# ---------------------------------------------------------------------------
# the bidiagonalization

class GolubKahan:
    """The Golub-Kahan step ``beta u = A v - alpha u``, ``alpha v = Aᵀu - beta v`` on the device.

    The step is split around the host fetch: :meth:`launch` queues the two
    products and the sums of squares (beta² and the unscaled alpha², in
    their slots), :meth:`adopt` takes the fetched values and finishes the
    step the way SciPy does: when ``beta = 0`` u is left unscaled and v and
    alpha keep their old values; when ``alpha = 0`` v is left unscaled.
    Whether beta is 0 is decided on the device, where u is scaled and
    ``beta·v`` subtracted, without waiting for the host.
    """

    def __init__(self, problem: Problem, ops):
        self.p = problem
        self.xp = problem.xp
        self.ops = ops
        self.u = None
        self.v = None
        self._candidate = None

    def _product(self, op, vec, size):
        y = op(vec)
        if y.dtype != np.float64 or y.ndim != 1:
            y = self.xp.asarray(y, dtype=np.float64).reshape(size)
        return y

    def start(self, x):
        """Queue the first step from ``b − A x`` (``x`` None: from b).

        Returns the slots ``(‖b‖², beta², alpha²)`` to fetch.
        """
        p, ops = self.p, self.ops
        b = p.b
        ops.sumsq(b, SLOT_B)
        r = b.copy() if x is None else b - self._product(p.matvec, x, p.m)
        ops.sumsq(r, SLOT_BETA)
        ops.scale_by_inverse_root(r, SLOT_BETA)
        self.u = r
        self._candidate = self._product(p.rmatvec, r, p.n)
        ops.sumsq(self._candidate, SLOT_ALPHA)
        return SLOT_B, SLOT_BETA, SLOT_ALPHA

    def launch(self, alpha):
        """Queue one step with the current ``alpha`` (a host float).

        Returns the slots ``(beta², alpha_new²)`` to fetch.
        """
        p, ops = self.p, self.ops
        t = self._product(p.matvec, self.v, p.m)
        ops.subtract_scaled(t, self.u, alpha)
        ops.sumsq(t, SLOT_BETA)
        ops.scale_by_inverse_root(t, SLOT_BETA)
        self.u = t
        c = self._product(p.rmatvec, t, p.n)
        ops.subtract_root_scaled(c, self.v, SLOT_BETA)
        ops.sumsq(c, SLOT_ALPHA)
        self._candidate = c
        return SLOT_BETA, SLOT_ALPHA

    def adopt(self, beta, alpha_sq, alpha_old):
        """Finish the step with the fetched ``beta = sqrt(beta²)`` and ``alpha²``; return
        the new alpha."""
        if not beta > 0:
            self._candidate = None
            return alpha_old
        alpha = np.sqrt(alpha_sq)
        v = self._candidate
        if alpha > 0:
            v *= 1 / alpha
        self.v = v
        self._candidate = None
        return alpha


# ---------------------------------------------------------------------------
# scalar pieces

def givens(a, b):
    """The plane rotation ``(c, s, r)``: ``[c s; -s c] [a; b] = [r; 0]`` with ``r >= 0``.

    The stable form of S.-C. Choi's SymOrtho (the one SciPy's lsqr/lsmr
    use): divide by the larger of ``|a|``, ``|b|`` so no ``1/eps`` appears,
    and give ``r`` the sign that keeps it non-negative. Exact zeros give
    ``c = sign(a)`` or ``s = sign(b)`` with ``sign(0) = 0``.
    """
    if b == 0:
        return np.sign(a), 0, abs(a)
    if a == 0:
        return 0, np.sign(b), abs(b)
    if abs(b) > abs(a):
        ratio = a / b
        s = np.sign(b) / math.sqrt(1 + ratio * ratio)
        return s * ratio, s, b / s
    ratio = b / a
    c = np.sign(a) / math.sqrt(1 + ratio * ratio)
    return c, c * ratio, a / c


def stopping_code(itn, iter_lim, test1, test2, test3, t1, rtol, atol, ctol) -> int:
    """SciPy's ``istop`` for one iteration (LSQR and LSMR share it).

    The tests are checked from the weakest reason to the strongest and the
    last one that holds wins: 7 iteration limit; 6, 5, 4 the machine
    precision forms of 3, 2, 1 (``1 + test <= 1``, guarding tolerances the
    caller set to 0); 3 ``test3 = 1/cond <= 1/conlim``; 2 the least-squares
    test ``test2 <= atol``; 1 the compatible-system test ``test1 <= rtol``.
    """
    istop = 0
    if itn >= iter_lim:
        istop = 7
    if 1 + test3 <= 1:
        istop = 6
    if 1 + test2 <= 1:
        istop = 5
    if 1 + t1 <= 1:
        istop = 4
    if test3 <= ctol:
        istop = 3
    if test2 <= atol:
        istop = 2
    if test1 <= rtol:
        istop = 1
    return istop


class Progress:
    """The recent values of the two tolerance tests, for :attr:`RunInfo.projected_iterations`.

    The values are kept as the run made them (:attr:`raw`: ``(test1, test2,
    rtol)`` per iteration, appended by the solvers' loops) and turned into
    logarithms only when a projection is asked for.
    """

    def __init__(self, atol: float):
        self.atol = max(float(atol), EPS)
        self.raw = deque(maxlen=PROJECTION_WINDOW)

    def record(self, test1, test2, rtol):
        """Keep the tests of one iteration."""
        self.raw.append((test1, test2, rtol))

    @property
    def history(self) -> list:
        """``log(test1/rtol)`` and ``log(test2/atol)`` per kept iteration (0 or less: met)."""
        return [(math.log(max(float(test1), 1e-300) / max(float(rtol), EPS)),
                 math.log(max(float(test2), 1e-300) / self.atol))
                for test1, test2, rtol in self.raw]

    def projected(self) -> Optional[int]:
        """Further iterations until a test is met at the fitted rate; None if no estimate."""
        h = np.array(self.history, dtype=np.float64)
        if len(h) < 3 or not np.all(np.isfinite(h)):
            return None
        steps = np.arange(len(h), dtype=np.float64)
        steps -= steps.mean()
        best = None
        for column in h.T:
            slope = float(steps @ (column - column.mean()) / (steps @ steps))
            if column[-1] <= 0:
                return 0
            if slope < 0:
                need = math.ceil(column[-1] / -slope)
                best = need if best is None else min(best, need)
        return best


# ---------------------------------------------------------------------------
# the loop

def drive(solver, link, iter_lim: int, *, pipelined: bool, clock,
          callback: Optional[Callable], progress: Progress) -> dict:
    """Run ``solver`` until SciPy's tests, the allowance or the callback stop it.

    ``solver`` is the state of an LSQR or LSMR run: ``launch()`` queues the
    bidiagonalization step and returns the slots of its sums of squares;
    ``step(values, itn)`` takes the fetched values, updates the host
    recurrences, queues the update of x and returns the slot of the sum of
    squares that the stopping test of iteration ``itn`` needs; ``judge(value, itn)`` finishes that iteration's
    estimates and returns its ``istop``; ``tests`` holds ``(test1, test2,
    rtol)`` of the last judged iteration; ``state(itn, seconds)`` makes the
    :class:`IterationState` for the callback.

    Parameters
    ----------
    solver : LSQR or LSMR state
    link : NumpyOps or CupyOps
        Whose ``fetch`` copies the slots to the host.
    iter_lim : int
        SciPy's iteration limit.
    pipelined : bool
        Judge iteration k after queuing step k+1, one fetch for both (the
        GPU way); False judges at once (two fetches per iteration, free on
        NumPy).
    clock : Clock
    callback : callable or None
        ``callback(IterationState)``; a true return stops the run.
    progress : Progress

    Returns
    -------
    dict
        ``itn``, ``istop``, ``allowance_spent``, ``stopped_by_callback``.
    """
    out = dict(itn=0, istop=0, allowance_spent=False, stopped_by_callback=False)
    itn = 0
    waiting = None          # slot of iteration itn's deferred value, not yet judged

    def judged(value) -> bool:
        istop = solver.judge(value, itn)
        out["istop"] = istop
        progress.record(*solver.tests)
        if callback is not None:
            wants_stop = bool(callback(solver.state(itn, clock.elapsed())))
            if wants_stop and istop == 0:
                out["stopped_by_callback"] = True
                return True
        if istop != 0:
            return True
        if clock.spent():
            out["allowance_spent"] = True
            return True
        return False

    while True:
        speculate = waiting is not None and pipelined and itn < iter_lim
        if waiting is not None and not speculate:
            (value,) = link.fetch(waiting)
            waiting = None
            if judged(value):
                break
        if itn >= iter_lim:
            break
        scalars = solver.launch()
        if speculate:
            *values, value = link.fetch(*scalars, waiting)
            waiting = None
            if judged(value):
                break               # the queued step is dropped
        else:
            values = link.fetch(*scalars)
        itn += 1
        waiting = solver.step(values, itn)
    out["itn"] = itn
    return out


class Clock:
    """Wall-clock seconds since the call began, and whether ``max_seconds`` is spent."""

    def __init__(self, max_seconds):
        self.t0 = time.perf_counter()
        if max_seconds is not None and not max_seconds >= 0:
            raise ValueError(f"max_seconds must be a non-negative number, got {max_seconds!r}")
        self.max_seconds = None if max_seconds is None else float(max_seconds)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def spent(self) -> bool:
        return self.max_seconds is not None and self.elapsed() >= self.max_seconds


def run_info(run: dict, istop: int, itn: int, progress: Progress, clock: Clock,
             link, exact_start: bool = False) -> dict:
    """The :class:`RunInfo` attributes of a finished run."""
    if exact_start or istop in (1, 2, 4, 5):
        projected = 0
    elif istop in (3, 6):
        projected = None
    else:
        projected = progress.projected()
    return dict(allowance_spent=run.get("allowance_spent", False),
                stopped_by_callback=run.get("stopped_by_callback", False),
                projected_iterations=projected, seconds=clock.elapsed(),
                host_syncs=link.count)


@dataclass
class Start:
    """LSQR's and LSMR's common beginning: the checked problem, its array
    module's operations, the clock and progress record of the call, and the
    first Golub-Kahan step (``‖b − A x0‖``, β₁, α₁ from one host copy)."""

    clock: Clock
    problem: Problem
    link: Any
    progress: Progress
    gk: GolubKahan
    x: Any
    normb: float
    beta: float
    alpha: float

    def iterate(self, solver, iter_lim: int, *, pipelined: Optional[bool],
                callback: Optional[Callable]) -> dict:
        """:func:`drive` the solver's recurrences (pipelined None: on for CuPy, off for NumPy)."""
        if pipelined is None:
            pipelined = self.problem.xp is not np
        return drive(solver, self.link, iter_lim, pipelined=pipelined, clock=self.clock,
                     callback=callback, progress=self.progress)

    def run_info(self, run: dict, istop: int, itn: int, exact_start: bool) -> dict:
        """:func:`run_info` of this call."""
        return run_info(run, istop, itn, self.progress, self.clock, self.link,
                        exact_start=exact_start)


def begin(A, b, x0, xp, *, atol: float, max_seconds: Optional[float]) -> Start:
    """Check the problem and take the first Golub-Kahan step (:class:`Start`)."""
    clock = Clock(max_seconds)
    problem = Problem(A, b, x0, xp)
    link = make_ops(problem.xp, problem.n)
    progress = Progress(atol)
    gk = GolubKahan(problem, link)
    x = problem.x0 if problem.x0 is not None else problem.xp.zeros(problem.n)
    bb, beta_sq, alpha_sq = link.fetch(*gk.start(problem.x0))
    beta = np.sqrt(beta_sq)
    alpha = gk.adopt(beta, alpha_sq, 0)
    return Start(clock, problem, link, progress, gk, x, np.sqrt(bb), beta, alpha)


def print_summary(name: str, m: int, n: int, istop: int, itn: int, lines: list) -> None:
    """``show=True``: the closing summary SciPy prints (no per-iteration lines)."""
    print(" ")
    print(f"{name} (scipy_gpuqr)   A has {m} rows and {n} columns")
    print(_MESSAGES[istop])
    print(f"istop ={istop:8g}   itn ={itn:8g}")
    for label, value in lines:
        print(f"{label:7s}={value:8.1e}")
    print(" ")
