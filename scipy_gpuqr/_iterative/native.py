"""SciPy's LSQR and LSMR iteration loops in compiled code (``_native.c``), built on first use.

:mod:`~scipy_gpuqr._iterative.host` runs SciPy's statements one for one on
Python floats; what a small problem's iteration costs there is the Python
around them (tens of NumPy calls of about a microsecond each). ``_native.c``
runs the same loops in C, with the same floating-point operations on the
same operands in the same order, so that the returned tuple stays SciPy's
bit for bit:

* the products are the loops of SciPy's ``_sparsetools.csr_matvec`` and
  ``csc_matvec`` (compiled with ``-ffp-contract=off``: no fused
  multiply-add where SciPy's compiled code has none);
* the dot products and norms are NumPy's own BLAS ``ddot`` (its kernels
  sum in several accumulators with fused multiply-adds, which no loop of
  ours would match): the very function NumPy calls, found in the library
  NumPy links (:func:`blas_ddot`), passed to the loop as a pointer;
* elementwise statements are one IEEE operation per entry, as NumPy's;
* scalars are C doubles, which are Python floats; ``**`` is the C library's
  ``pow`` (Python's float ``**`` calls it too).

Before a process uses the library, :class:`Checked` verifies, bit for bit,
that the pointer's ``ddot`` gives ``numpy.dot``'s sums on random vectors of
several lengths and alignments, and that the compiled products give SciPy's
kernels' on random CSR and CSC matrices (32- and 64-bit indices); if
anything differs, or NumPy's BLAS cannot be found, the host loops run (why
is logged at DEBUG on the ``scipy_gpuqr`` logger).

Where the Python-float loop raises (its division by zero, ``**`` that
overflows) or any floating-point exception flag is raised, the compiled
run gives up before reporting that iteration, and the host loops run
the problem as they do on their own (they raise and replay; see
:mod:`~scipy_gpuqr._iterative.host`).

The library is plain C99 without Python headers, built on the first use in
a process that finds no built library (never at import) into ``native/`` of
the package cache folder as ``iterative-{key}.so``, checked against its
manifest before it is loaded, by :mod:`scipy_gpuqr._native_build` (which says
when, where and how).

``$SCIPY_GPUQR_ITERATIVE_NATIVE`` (:data:`ENV`) picks the path: ``auto``
(default: compiled when it is at hand; while it is being built, on a worker
thread started by the first run of a process that finds none, the host loops
run), ``c`` (wait for the build; :class:`NativeUnavailable` when it cannot
be had or its checks fail), ``numpy`` (the host loops).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Mapping, Optional

import numpy as np
import scipy.sparse as sp

from .. import _native_build
from .._errors import NativeUnavailable
from .._options import getenv
from ._common import compressed_kernels

try:        # NumPy's compiled core, whose BLAS its dot products call
    from numpy._core import _multiarray_umath as _numpy_core
except ImportError:                         # pragma: no cover - NumPy < 2
    from numpy.core import _multiarray_umath as _numpy_core

__all__ = ["ENV", "ABI", "MODES", "REPORT", "WINDOW", "REPORT_AREA", "OUT", "OUT_STATE",
           "HANDOFF_SCALARS",
           "NativeUnavailable", "mode",
           "library", "status", "handle", "blas_ddot", "Checked", "Native"]

#: Environment variable choosing the path: ``auto``, ``c`` or ``numpy``.
ENV = "SCIPY_GPUQR_ITERATIVE_NATIVE"
MODES = _native_build.MODES
#: Interface version of ``_native.c`` (``sgi_abi()``).
ABI = 4
#: Compiler flags besides :data:`scipy_gpuqr._native_build.FLAGS` (and in the build key): no
#: contraction into fused multiply-adds (SciPy's kernels and NumPy's ufuncs
#: round each product), no value-changing optimization.
EXTRA_FLAGS = ("-ffp-contract=off", "-fno-fast-math")
#: Fields of the record a report reads (``_native.c``'s ``RECORD``): itn, istop,
#: normr, normar, norma, conda, normx, test1, test2, rtol.
REPORT = 10
#: Iterations of kept tests (``_native.c``'s ``WINDOW``), and of records kept for a
#: report that follows unreported iterations.
WINDOW = 20
#: Doubles of a run's report area (``_native.c``'s ``rec``): the record a report reads,
#: the gate (the first iteration to report, set by the caller; 0: every iteration), then
#: the records of the last :data:`WINDOW` iterations (iteration i at row (i - 1) % WINDOW).
REPORT_AREA = REPORT + 1 + REPORT * WINDOW
#: The scalars of the recurrences a run hands on
#: (:class:`~scipy_gpuqr._iterative.host.Handoff`), by method, named as
#: in SciPy: all that an iteration reads besides the options, ``itn`` and the vectors, in
#: the order of the block kernel's state after its scale factors
#: (``kernels/iterative/block_lsqr.cu``'s ``LsqrState``/``LsmrState``) and of the compiled
#: loops' ``out`` from :data:`OUT_STATE`.
HANDOFF_SCALARS = {
    "lsqr": ("alfa", "anorm", "acond", "ddnorm", "res2", "xnorm", "xxnorm", "z", "cs2", "sn2",
             "rhobar", "phibar", "r1norm", "r2norm", "arnorm", "bnorm", "test1", "test2",
             "rtol"),
    "lsmr": ("alpha", "zetabar", "alphabar", "rho", "rhobar", "cbar", "sbar", "betadd", "betad",
             "rhodold", "tautildeold", "thetatilde", "zeta", "d", "normA2", "maxrbar",
             "minrbar", "normA", "condA", "normx", "normr", "normar", "normb", "test1", "test2",
             "rtol"),
}
#: Doubles of a run's ``out`` (``_native.c``): istop, itn, the tuple's norms (six), exact
#: start, iterations reported; then, from :data:`OUT_STATE`, the recurrences' scalars after
#: the last iteration (:data:`HANDOFF_SCALARS`' order; sized for the
#: method with the most), which a run that goes on elsewhere starts from.
OUT_STATE = 10
OUT = OUT_STATE + max(len(names) for names in HANDOFF_SCALARS.values())
#: Outcomes of a compiled run (NOT_FINITE: asked to check A's values and b first, one was not).
DONE, REPLAY, REPORT_FAILED, NOT_FINITE = 0, 1, 2, 3

#: ``int report(void)``: the callback type of a compiled run.
REPORT_FN = ctypes.CFUNCTYPE(ctypes.c_int)
#: ``double ddot(n, x, incx, y, incy)`` with 64-bit integers (a 32-bit BLAS reads
#: their low halves, which hold them: the lengths checked stay below 2**31).
_DDOT = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                         ctypes.c_void_p, ctypes.c_int64)

_log = logging.getLogger("scipy_gpuqr")


def _declare(lib: ctypes.CDLL) -> None:
    """Type the library's functions."""
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.sgi_products.argtypes = [i64, i64, i32, i32] + [ptr] * 7
    lib.sgi_products.restype = None
    lib.sgi_lsqr.argtypes = [i64, i64, i32, i32, ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr,
                             i64, i32, ptr, ptr, ptr, ptr, ptr, i64]
    lib.sgi_lsqr.restype = i32
    lib.sgi_lsmr.argtypes = [i64, i64, i32, i32, ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr, i64,
                             ptr, ptr, ptr, ptr, ptr, i64]
    lib.sgi_lsmr.restype = i32


#: The library: ``_native.c`` beside this module, built as ``iterative-{key}.so``
#: with :data:`EXTRA_FLAGS`.
_SPEC = _native_build.NativeLibrary.beside(__file__, "iterative-", ABI, "sgi_abi", ENV, _declare,
                                           extra_flags=EXTRA_FLAGS)
#: This process' library (:class:`~scipy_gpuqr._native_build.NativePart`): the
#: path :data:`ENV` asks for (``mode``), the library (``library``) and the
#: loader's state (``status``); :func:`handle` is this module's own (the loops
#: are checked before they are handed out).
_NATIVE = _native_build.NativePart(_SPEC, "compiled LSQR/LSMR loops")
mode, library, status = _NATIVE.mode, _NATIVE.library, _NATIVE.status


# ---------------------------------------------------------------------------
# NumPy's ddot

#: Names NumPy's BLAS may give ``cblas_ddot`` (scipy-openblas' ILP64 and LP64
#: builds, then any other CBLAS).
_DDOT_NAMES = ("scipy_cblas_ddot64_", "scipy_cblas_ddot", "cblas_ddot64_", "cblas_ddot")


def blas_ddot() -> tuple[Optional[int], str]:
    """``(address, where)`` of the ``cblas_ddot`` NumPy's dot product calls, or
    ``(None, why not)``.

    Looked up through NumPy's compiled core: ``dlsym`` on its handle searches
    the core and the libraries it was linked with, in the order the dynamic
    loader resolved the core's own reference to the symbol.
    """
    try:
        handle = ctypes.CDLL(_numpy_core.__file__)
    except OSError as exc:
        return None, f"NumPy's core cannot be opened: {exc}"
    for name in _DDOT_NAMES:
        try:
            fn = getattr(handle, name)
        except AttributeError:
            continue
        return ctypes.cast(fn, ctypes.c_void_p).value, name
    return None, "no cblas_ddot in NumPy's BLAS"


def _ddot_matches(address: int) -> Optional[str]:
    """None where the ddot at ``address`` gives ``numpy.dot``'s sums bit for bit on
    random vectors (several lengths, at every 8-byte offset of a 32-byte line); else
    what differed."""
    ddot = _DDOT(address)
    rng = np.random.default_rng(20261127)
    for n in (1, 2, 7, 16, 33, 1000, 4099, 20011):
        size = 2 * (n + 4)
        buf = np.ldexp(rng.standard_normal(size), rng.integers(-30, 30, size))
        # past 10000 entries OpenBLAS may split the sum between its threads, whose
        # wake-up a busy machine makes slow: one call there
        for offset in (0, 1, 2, 3) if n < 10000 else (1,):
            u, w = buf[offset:offset + n], buf[n + 4 + offset:2 * n + 4 + offset]
            for a, b in ((u, u), (u, w), (w, w)) if n < 10000 else ((u, w),):
                want = a.dot(b)
                got = ddot(n, a.ctypes.data, 1, b.ctypes.data, 1)
                if np.float64(got).tobytes() != np.float64(want).tobytes():
                    return f"ddot of {n} entries (offset {offset}): {got!r}, numpy.dot {want!r}"
    return None


def _products_match(lib) -> Optional[str]:
    """None where the compiled products give SciPy's kernels' (``A @ v``, ``A.T @ u``)
    bit for bit on random CSR and CSC matrices with 32- and 64-bit indices."""
    rng = np.random.default_rng(20261128)
    for m, n in ((40, 25), (25, 40), (300, 300)):
        A = sp.random(m, n, density=0.2, format="csr", random_state=rng)
        A.data = rng.standard_normal(A.nnz) * np.exp(rng.uniform(-30, 30, A.nnz))
        for fmt in ("csr", "csc"):
            for wide in (False, True):
                M = A.asformat(fmt)
                dtype = np.int64 if wide else np.int32
                M.indptr, M.indices = M.indptr.astype(dtype), M.indices.astype(dtype)
                x, u = rng.standard_normal(n), rng.standard_normal(m)
                forward, backward = compressed_kernels(M)
                want_y, want_z = np.zeros(m), np.zeros(n)
                forward(m, n, M.indptr, M.indices, M.data, x, want_y)
                backward(n, m, M.indptr, M.indices, M.data, u, want_z)
                y, z = np.empty(m), np.empty(n)
                lib.sgi_products(m, n, int(fmt == "csr"), int(wide), M.indptr.ctypes.data,
                                 M.indices.ctypes.data, M.data.ctypes.data, x.ctypes.data,
                                 y.ctypes.data, u.ctypes.data, z.ctypes.data)
                if y.tobytes() != want_y.tobytes() or z.tobytes() != want_z.tobytes():
                    return f"the products of a {m}x{n} {fmt} matrix differ from SciPy's"
    return None


class Native:
    """The compiled loops a run uses: the library, NumPy's ddot, and the loader that
    loaded the library."""

    __slots__ = ("lib", "ddot", "loader")

    def __init__(self, lib, ddot: int, loader):
        self.lib, self.ddot, self.loader = lib, ddot, loader


class Checked:
    """One process' verdict on the compiled loops: found, built, checked once (thread-safe).

    ``get(lib, loader)`` gives a :class:`Native` for the library ``lib`` that
    ``loader`` loaded, or None where NumPy's ddot is not found or a check
    differs (:attr:`why`); :attr:`passed` is the last :class:`Native` given.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._native: Optional[Native] = None
        self._lib = None
        self.why: Optional[str] = None

    @property
    def passed(self) -> Optional[Native]:
        return self._native

    def get(self, lib, loader) -> Optional[Native]:
        with self._lock:
            if self._lib is lib:
                return self._native
            self._lib, self._native, self.why = lib, None, None
            try:
                address, where = blas_ddot()
                why = where if address is None else _ddot_matches(address)
                if why is None:
                    why = _products_match(lib)
            except Exception as exc:            # noqa: BLE001 - the host loops instead
                why = f"the checks failed: {exc!r}"
            if why is None:
                self._native = Native(lib, address, loader)
                _log.debug("compiled LSQR/LSMR loops: NumPy's %s checked", where)
            else:
                self.why = why
                _log.debug("compiled LSQR/LSMR loops not used: %s", why)
            return self._native


_CHECKED = Checked()


def handle(environ: Mapping[str, str] = os.environ) -> Optional[Native]:
    """The compiled loops for the run at hand, as :data:`ENV` asks: None in mode
    ``numpy``, or in mode ``auto`` while they are being built (the build started
    here if need be), when they cannot be had or when their checks fail; mode
    ``c`` waits for them.

    Raises
    ------
    NativeUnavailable
        Mode ``c`` and no library, or its checks failed.
    """
    loader = _NATIVE.loader
    v = getenv(ENV, environ)    # (os.environ's own get raises and catches when unset)
    if not v:                   # auto, once the loops have passed their checks: at once
        native = _CHECKED.passed
        if native is not None and native.loader is loader:
            return native
    v = mode(environ)
    lib = _native_build.choose(loader, v, _NATIVE.what, environ)
    if lib is None:
        return None
    native = _CHECKED.get(lib, loader)
    if native is None and v == "c":
        raise NativeUnavailable(f"compiled LSQR/LSMR loops: {_CHECKED.why}")
    return native
