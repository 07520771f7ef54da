"""SciPy's LSQR and LSMR in one GPU thread block, many iterations per launch.

Over CuPy (:mod:`scipy_gpuqr._iterative._common`) an iteration is some ten
kernel launches and one device→host copy: a few hundred microseconds
whatever the problem's size, which is more than a small problem's whole
iteration on the host. :func:`block_lsqr` and :func:`block_lsmr` run SciPy's
recurrences and stopping tests in one thread block instead
(``kernels/iterative/block_lsqr.cu``): the block's threads share the
products and vector updates and hold the scalar recurrences themselves, and
a launch runs until a stopping test fires or an iteration count is reached,
testing after every iteration. A call is one copy of the problem to the
device (A's CSR and CSC arrays, b, x0 and the run's state in one buffer),
one launch per stretch of iterations and one copy back per launch (the state,
the stretch's per-iteration history and x).

A run that is watched (a callback, or ``max_seconds``) is launched in
stretches of :data:`FIRST_STRETCH` iterations, doubling up to
:data:`MAX_STRETCH`; after each, the callback sees every iteration of the
stretch (the iterate is that of the stretch's end, the seconds interpolated)
and may stop the run there. An unwatched run is one launch.

A run may also go on from a host run that stopped early (``resume``: the
:class:`~scipy_gpuqr._iterative.host.Handoff` of
:func:`~scipy_gpuqr._iterative.host.lsqr_host`/``lsmr_host``): the host's
scalars and vectors are written into the buffer as the kernel's own state
after that iteration (``started`` set, the scale factors 1), so the first
launch makes iteration ``itn + 1``, not the start again; ``itn`` counts the
host's iterations, the callback sees the iterations from there on, with the
seconds going on from the host run's.

The iterates follow SciPy's to rounding (the sums run in another order and
the compiler fuses multiply-adds), as those of the CuPy path do: the same
``istop``, ``itn`` within a few and x within the tolerances. Host data only
(SciPy CSR/CSC float64 A); the results are NumPy arrays.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp

from .._gpu import import_cupy
from .._kernels import KernelUse, load_module
from ._common import Clock, IterationState, Progress
from .host import HANDOFF_VECTORS, Handoff
from .lsmr import SUMMARY_NORMS as LSMR_NORMS
from .lsmr import LSMRResult, lsmr_result
from .lsqr import SUMMARY_NORMS as LSQR_NORMS
from .lsqr import LSQRResult, lsqr_result

try:        # SciPy's compiled format conversion (private: where found, else SciPy's tocsc)
    from scipy.sparse import _sparsetools
except ImportError:     # pragma: no cover - every SciPy release so far has it
    _sparsetools = None

__all__ = ["BLOCK_FILE", "KERNEL_VARIANTS", "SEPARATE_FILES", "THREAD_CHOICES", "OPTIONS", "LSQR_STATE",
           "LSMR_STATE", "HISTORY", "VECTORS", "FIRST_STRETCH", "MAX_STRETCH", "block_kernel_name",
           "block_threads", "block_use", "block_suits", "BlockProblem", "block_lsqr",
           "block_lsmr"]

#: The kernel source (relative to ``kernels/``).
BLOCK_FILE = "iterative/block_lsqr.cu"

#: Threads per block compiled (powers of two: the block sums are trees).
THREAD_CHOICES = (32, 128, 512, 1024)

#: The option slots at the start of the state (the kernel's ``Options``).
OPTIONS = ("damp", "atol", "btol", "ctol", "iter_lim", "calc_var", "has_x0", "hist_rows")
#: LSQR's state after the options (the kernel's ``LsqrState``).
LSQR_STATE = OPTIONS + ("started", "done", "itn", "istop", "su", "sv", "alfa", "anorm",
                        "acond", "ddnorm", "res2", "xnorm", "xxnorm", "z", "cs2", "sn2",
                        "rhobar", "phibar", "r1norm", "r2norm", "arnorm", "bnorm", "test1",
                        "test2", "rtol")
#: LSMR's state after the options (the kernel's ``LsmrState``).
LSMR_STATE = OPTIONS + ("started", "done", "itn", "istop", "su", "sv", "alpha", "zetabar",
                        "alphabar", "rho", "rhobar", "cbar", "sbar", "betadd", "betad",
                        "rhodold", "tautildeold", "thetatilde", "zeta", "d", "normA2",
                        "maxrbar", "minrbar", "normA", "condA", "normx", "normr", "normar",
                        "normb", "test1", "test2", "rtol")
#: One history row per iteration (the kernel's ``History``).
HISTORY = ("istop", "normr", "normar", "norma", "conda", "normx", "test1", "test2", "rtol")
#: The kernel's vectors, in their order in its ``vec`` (u has m entries, the others n).
VECTORS = HANDOFF_VECTORS

#: Iterations of a watched run's first launch; each later launch runs as many
#: iterations as the run has made (doubling), up to :data:`MAX_STRETCH`.
FIRST_STRETCH = 32
#: Most iterations of one launch of a watched run (the history's rows).
MAX_STRETCH = 4096
#: History rows of an unwatched run: the window its projection is fitted to.
_UNWATCHED_ROWS = 20


def block_kernel_name(method: str, threads: int) -> str:
    """Name expression of the kernel of ``method`` ('lsqr' or 'lsmr') with ``threads``."""
    return f"gpuqr::{method}_block<{threads}>"


#: Name expressions to compile, per source file (relative to ``kernels/``).
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {
    BLOCK_FILE: tuple(block_kernel_name(method, t) for method in ("lsqr", "lsmr")
                      for t in THREAD_CHOICES),
}


#: The file's variants are compiled one by one (a run needs one method and
#: block size), by the run time and so by the cache warm-up and the check.
SEPARATE_FILES = (BLOCK_FILE,)


def block_use(method: str, threads: int) -> KernelUse:
    """What a run compiles (for :func:`scipy_gpuqr._kernels.prefetch`): its one variant,
    alone (:data:`SEPARATE_FILES`)."""
    name = block_kernel_name(method, threads)
    return KernelUse(BLOCK_FILE, (name,), (name,))


def block_threads(m: int, n: int) -> int:
    """Threads of the block for an m×n problem: the fewest of :data:`THREAD_CHOICES` that
    give every thread at most one row and one column, else the most (fewer threads, fewer
    steps in each block sum)."""
    for t in THREAD_CHOICES:
        if max(m, n) <= t:
            return t
    return THREAD_CHOICES[-1]


_COMPRESSED = (sp.csr_array, sp.csr_matrix, sp.csc_array, sp.csc_matrix)


def block_suits(A, b, x0) -> bool:
    """Whether :class:`BlockProblem` takes these operands: a SciPy CSR/CSC matrix or array
    of float64 values with entries, NumPy b (and x0) of real numbers, sizes below 2³¹."""
    if type(A) not in _COMPRESSED or A.dtype != np.float64 or getattr(A, "ndim", 2) != 2:
        return False
    m, n = A.shape
    if m == 0 or n == 0 or A.nnz == 0 or max(m, n, A.nnz) >= 2 ** 31 - 1:
        return False
    return _real_vector(b, m) and (x0 is None or _real_vector(x0, n))


def _real_vector(v, size: int) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind in "biuf" and v.size == size


class BlockProblem:
    """A, Aᵀ, b and x0 packed in one host buffer for one copy to the device.

    Layout (bytes, every part 8-aligned): the float64 part — the state
    (:data:`LSQR_STATE` or :data:`LSMR_STATE`), the history ring, x, var
    (LSQR only), the kernel's vectors (:data:`VECTORS`: u, v and w, or u, v, h
    and hbar), A's values by rows, by columns, b, x0 — then the int32 part: A's
    row pointers, column indices, column pointers, row indices. The first parts
    (state, history, x, var) are what a launch's copy back reads; the kernel
    writes every one of them before it is read, so the host leaves them unset,
    but for a run that goes on from a host run's (:meth:`resume`).

    Parameters
    ----------
    method : {'lsqr', 'lsmr'}
    A : SciPy CSR/CSC float64 matrix or array (:func:`block_suits`)
    b, x0 : NumPy vectors (x0 may be None)
    options : dict
        ``damp, atol, btol, ctol, iter_lim, calc_var`` (floats).
    rows : int
        History rows.
    fill : float, optional
        Fill the parts the host leaves unset with this value (tests poison
        them with NaN to show the kernel writes what is read back).
    """

    def __init__(self, method: str, A, b, x0, options: dict, rows: int,
                 fill: Optional[float] = None):
        m, n = (int(s) for s in A.shape)
        nnz = int(A.indptr[-1])
        self.method, self.m, self.n, self.nnz, self.rows = method, m, n, nnz, rows
        names = LSQR_STATE if method == "lsqr" else LSMR_STATE
        self.state_names = names
        self.has_x0 = x0 is not None
        sizes = [("state", len(names)), ("hist", rows * len(HISTORY)), ("x", n),
                 ("var", n if method == "lsqr" else 0),
                 ("vec", m + (2 if method == "lsqr" else 3) * n),
                 ("a_val", nnz), ("t_val", nnz), ("b", m), ("x0", n if self.has_x0 else 0)]
        ints = [("a_ptr", m + 1), ("a_idx", nnz), ("t_ptr", n + 1), ("t_idx", nnz)]
        offsets, at = {}, 0
        for name, size in sizes:
            offsets[name] = at
            at += 8 * size
        for name, size in ints:
            offsets[name] = at
            at += 4 * size
            at += -at % 8
        self.offsets, self.nbytes = offsets, at
        self.readback = offsets["vec"]          # state, history, x and var
        buf = np.empty(at, dtype=np.uint8)
        if fill is not None:
            buf.view(np.float64)[:offsets["a_val"] // 8] = fill
        self.buffer = buf
        f64 = buf[:offsets["a_ptr"]].view(np.float64)
        i32 = buf[offsets["a_ptr"]:].view(np.int32)

        def part(name, size, whole, base):
            start = (offsets[name] - base) // whole.itemsize
            return whole[start:start + size]

        state = part("state", len(names), f64, 0)
        state[:] = 0.0
        state[:len(OPTIONS)] = [options["damp"], options["atol"], options["btol"],
                                options["ctol"], options["iter_lim"], options["calc_var"],
                                float(self.has_x0), float(rows)]
        base = offsets["a_ptr"]
        a_ptr, a_idx = part("a_ptr", m + 1, i32, base), part("a_idx", nnz, i32, base)
        t_ptr, t_idx = part("t_ptr", n + 1, i32, base), part("t_idx", nnz, i32, base)
        a_val, t_val = part("a_val", nnz, f64, 0), part("t_val", nnz, f64, 0)
        # A by rows and by columns: the caller's format copied, the other made
        # into the buffer by SciPy's conversion (CSC of A = CSR of Aᵀ)
        ptr, idx, val = A.indptr, A.indices[:nnz], A.data[:nnz]
        if A.format == "csr":
            own, other = (a_ptr, a_idx, a_val), (t_ptr, t_idx, t_val)
            shape = (m, n)
        else:
            own, other = (t_ptr, t_idx, t_val), (a_ptr, a_idx, a_val)
            shape = (n, m)
        own[0][:] = ptr
        own[1][:] = idx
        own[2][:] = val
        _transpose_into(shape, own, other)
        part("b", m, f64, 0)[:] = b.reshape(-1)
        if self.has_x0:
            part("x0", n, f64, 0)[:] = x0.reshape(-1)

    def vector(self, buffer: np.ndarray, name: str) -> np.ndarray:
        """The kernel's vector ``name`` (:data:`VECTORS`) in ``buffer`` (this layout)."""
        names = VECTORS[self.method]
        k = names.index(name)
        start, size = (0, self.m) if k == 0 else (self.m + (k - 1) * self.n, self.n)
        return self.view(buffer, "vec", self.m + (len(names) - 1) * self.n)[start:start + size]

    def resume(self, handoff: Handoff) -> None:
        """Write a host run's state after its iteration ``handoff.itn`` as the kernel's
        own (started, not done, ``istop`` 0, SciPy's vectors with scale factors 1), its x
        and var: the first launch makes the next iteration."""
        if handoff.method != self.method:
            raise ValueError(f"a {handoff.method} run cannot go on as {self.method}")
        buf = self.buffer
        state = self.view(buf, "state", len(self.state_names))
        at = {name: k for k, name in enumerate(self.state_names)}
        for name, value in (("started", 1.0), ("done", 0.0), ("itn", float(handoff.itn)),
                            ("istop", 0.0), ("su", 1.0), ("sv", 1.0), *handoff.scalars.items()):
            state[at[name]] = value
        state[at["has_x0"]] = 0.0                   # the start is not made again
        for name in VECTORS[self.method]:
            self.vector(buf, name)[:] = handoff.vectors[name]
        self.view(buf, "x", self.n)[:] = handoff.x
        if self.method == "lsqr":
            var = self.view(buf, "var", self.n)
            var[:] = 0.0 if handoff.var is None else handoff.var

    def view(self, fetched: np.ndarray, name: str, size: int) -> np.ndarray:
        """The float64 part ``name`` (``size`` values) of a copy back."""
        start = self.offsets[name] // 8
        return fetched.view(np.float64)[start:start + size]


def _transpose_into(shape, own, other) -> None:
    """The compressed arrays ``other`` of the transpose of the (rows, cols) = ``shape``
    matrix held by ``own`` (CSR to CSC, or CSC to CSR read as CSR of the transpose)."""
    rows, cols = shape
    ptr, idx, val = own
    if _sparsetools is not None:
        other[0][:] = 0
        _sparsetools.csr_tocsc(rows, cols, ptr, idx, val, other[0], other[1], other[2])
        return
    t = sp.csr_matrix((val, idx, ptr), shape=shape).tocsc()     # pragma: no cover
    other[0][:], other[1][:], other[2][:] = t.indptr, t.indices, t.data


class _CupyDevice:
    """The buffer on the current CuPy device and the kernels' launches on its current stream."""

    def __init__(self, method: str, threads: int):
        self.cp = import_cupy()
        self.kernel = block_use(method, threads).module().get_function(
            block_kernel_name(method, threads))
        self.threads = threads
        self.dev = None
        self.syncs = 0

    def upload(self, host: np.ndarray) -> int:
        self.dev = self.cp.empty(host.nbytes, dtype=np.uint8)
        self.dev.set(host)
        return int(self.dev.data.ptr)

    def launch(self, args: tuple) -> None:
        self.kernel((1,), (self.threads,), args)

    def fetch(self, nbytes: int) -> np.ndarray:
        self.syncs += 1
        return self.dev[:nbytes].get()


def _pointer_args(problem: BlockProblem, base: int, stop_at: int) -> tuple:
    """The kernel's arguments: sizes as int32, addresses as uint64 (pointers by value)."""
    o = problem.offsets
    p = [np.uint64(base + o[name]) for name in
         ("a_ptr", "a_idx", "a_val", "t_ptr", "t_idx", "t_val", "b", "x0", "vec", "x")]
    tail = [np.uint64(base + o["var"])] if problem.method == "lsqr" else []
    return (np.int32(problem.m), np.int32(problem.n), *p, *tail,
            np.uint64(base + o["state"]), np.uint64(base + o["hist"]), np.int32(stop_at))


def _run(method: str, A, b, x0, options: dict, *, callback, max_seconds, device=None,
         fill=None, resume: Optional[Handoff] = None):
    """Launch the block until SciPy's tests, the iteration limit, the callback or the
    allowance stop the run: ``(fields, info)`` as the host loops return them. With
    ``resume``, the run goes on from the host run's iteration ``resume.itn`` (x0 unused)
    and its seconds from ``resume.seconds``."""
    clock = Clock(max_seconds)
    m, n = A.shape
    iter_lim = int(options["iter_lim"])
    watched = callback is not None or max_seconds is not None
    rows = max(1, min(iter_lim, MAX_STRETCH)) if watched else _UNWATCHED_ROWS
    problem = BlockProblem(method, A, b, None if resume is not None else x0, options, rows,
                           fill=fill)
    progress = Progress(options["atol"])
    reported, offset = 0, 0.0
    if resume is not None:
        problem.resume(resume)
        reported, offset = resume.itn, resume.seconds
        for tests in resume.tests:              # the projection goes on from the host's
            progress.record(*tests)
    threads = block_threads(m, n)
    dev = device(method, threads) if device is not None else _CupyDevice(method, threads)
    base = dev.upload(problem.buffer)
    names = problem.state_names
    at = {name: k for k, name in enumerate(names)}
    stopped_by_callback = allowance_spent = False
    reported_s = offset
    stop_at = min(iter_lim, reported + FIRST_STRETCH) if watched else iter_lim
    readback = problem.readback
    while True:
        dev.launch(_pointer_args(problem, base, stop_at))
        fetched = dev.fetch(readback)
        state = problem.view(fetched, "state", len(names))
        itn, istop = int(state[at["itn"]]), int(state[at["istop"]])
        hist = problem.view(fetched, "hist", rows * len(HISTORY)).reshape(rows, len(HISTORY))
        x = problem.view(fetched, "x", n)
        now = offset + clock.elapsed()
        first = max(reported + 1, itn - rows + 1)
        for k in range(first, itn + 1):
            row = hist[(k - 1) % rows]
            progress.record(row[6], row[7], row[8])
            if callback is None or stopped_by_callback:
                continue
            seconds = reported_s + (now - reported_s) * (k - reported) / (itn - reported)
            state_k = IterationState(k, x, int(row[0]), *(float(v) for v in row[1:]),
                                     seconds)
            if callback(state_k) and istop == 0:
                stopped_by_callback = True
        reported, reported_s = itn, now
        if state[at["done"]] != 0 or istop != 0 or itn >= iter_lim or stopped_by_callback:
            break
        if clock.spent():
            allowance_spent = True
            break
        stop_at = min(iter_lim, itn + min(max(itn, FIRST_STRETCH), rows))
    exact_start = itn == 0
    fields = _fields(method, problem, fetched, state, at, n, options)
    if exact_start or istop in (1, 2, 4, 5):
        projected = 0
    elif istop in (3, 6):
        projected = None
    else:
        projected = progress.projected
    info = dict(allowance_spent=allowance_spent, stopped_by_callback=stopped_by_callback,
                projected_iterations=projected, seconds=offset + clock.elapsed(),
                host_syncs=dev.syncs)
    return fields, info


def _fields(method: str, problem: BlockProblem, fetched, state, at, n, options) -> tuple:
    """SciPy's tuple from the last copy back (x and var copied out of it)."""
    x = problem.view(fetched, "x", n).copy()
    itn, istop = int(state[at["itn"]]), int(state[at["istop"]])
    if method == "lsqr":
        var = problem.view(fetched, "var", n).copy() if options["calc_var"] else np.zeros(n)
        return (x, istop, itn, *(float(state[at[k]]) for k in LSQR_NORMS), var)
    return (x, istop, itn, *(float(state[at[k]]) for k in LSMR_NORMS))


def _options(damp, atol, btol, conlim, iter_lim, calc_var) -> dict:
    conlim = float(conlim)
    return dict(damp=float(damp), atol=float(atol), btol=float(btol),
                ctol=1 / conlim if conlim > 0 else 0.0, iter_lim=float(iter_lim),
                calc_var=float(bool(calc_var)))


def block_lsqr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, iter_lim=None, show=False,
               calc_var=False, x0=None, *, max_seconds: Optional[float] = None,
               callback: Optional[Callable] = None, resume: Optional[Handoff] = None,
               _device=None, _fill=None) -> LSQRResult:
    """LSQR in one GPU thread block: SciPy's arguments and tuple, NumPy in and out.

    Parameters and results as :func:`scipy_gpuqr._iterative.lsqr` (A a SciPy
    CSR/CSC float64 matrix, :func:`block_suits`); ``host_syncs`` counts the
    copies back (one per launch). ``max_seconds`` is checked between launches.
    ``resume``: the :class:`~scipy_gpuqr._iterative.host.Handoff` of a host run of
    the same problem and options that stopped early; the run goes on at its next
    iteration (``x0`` is then the host run's concern), ``itn`` and the seconds
    counting the host run's.
    """
    m, n = A.shape
    iter_lim = 2 * n if iter_lim is None else int(iter_lim)
    options = _options(damp, atol, btol, conlim, iter_lim, calc_var)
    b, x0 = _vectors(b, x0)
    fields, info = _run("lsqr", A, b, x0, options, callback=callback,
                        max_seconds=max_seconds, device=_device, fill=_fill, resume=resume)
    return lsqr_result(m, n, fields, info, show)


def block_lsmr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, maxiter=None, show=False,
               x0=None, *, max_seconds: Optional[float] = None,
               callback: Optional[Callable] = None, resume: Optional[Handoff] = None,
               _device=None, _fill=None) -> LSMRResult:
    """LSMR in one GPU thread block: SciPy's arguments and tuple, NumPy in and out.

    Parameters and results as :func:`scipy_gpuqr._iterative.lsmr` (A a SciPy
    CSR/CSC float64 matrix, :func:`block_suits`); ``resume`` as :func:`block_lsqr`'s.
    """
    m, n = A.shape
    maxiter = min(m, n) if maxiter is None else int(maxiter)
    options = _options(damp, atol, btol, conlim, maxiter, False)
    b, x0 = _vectors(b, x0)
    fields, info = _run("lsmr", A, b, x0, options, callback=callback,
                        max_seconds=max_seconds, device=_device, fill=_fill, resume=resume)
    return lsmr_result(m, n, fields, info, show)


def _vectors(b, x0):
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if x0 is not None:
        x0 = np.asarray(x0, dtype=np.float64).reshape(-1)
    return b, x0
