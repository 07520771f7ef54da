"""Triangular solves and products on SciPy's own LAPACK/BLAS, called through ctypes (host).

The host's rank decisions split their block solves and products over a few
threads (:mod:`scipy_gpuqr._factor.host_lanes`), each running BLAS on one
thread. NumPy's ``matmul`` pieces run side by side there, but SciPy's
wrappers' did not: ``scipy.linalg.solve_triangular``, ``lapack.dtrtrs`` and
``blas.dtrsm`` called from two threads at once took as long as the same
calls one after the other on the 2-core host (a dense R's ``trsm`` pieces ran
at one core's speed on two lanes; bench/RESULTS.md, issue 16 item 3). The
same routines called through :mod:`ctypes` (which lets go of the interpreter
lock for the call) on the function pointers that SciPy exports for Cython
(``scipy.linalg.cython_lapack``, ``cython_blas``: LP64, Fortran calling
convention) run both at once. The operands and the routine are those of
SciPy's wrappers, so the results are too (bit for bit).

Where the pointers cannot be had (another SciPy build), every function falls
back to SciPy's wrapper (same answer, pieces one after the other).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Optional

import numpy as np
import scipy.linalg as la
from scipy.linalg import cython_blas, cython_lapack

__all__ = ["trsm_upper", "gemv", "available"]

_D = ctypes.POINTER(ctypes.c_double)
_I = ctypes.POINTER(ctypes.c_int)
_C = ctypes.c_char_p

#: ctypes prototypes of the routines used (Fortran: every argument by reference).
_PROTOTYPES = {
    # uplo, trans, diag, n, nrhs, a, lda, b, ldb, info
    "dtrtrs": (_C, _C, _C, _I, _I, _D, _I, _D, _I, _I),
    # trans, m, n, alpha, a, lda, x, incx, beta, y, incy
    "dgemv": (_C, _I, _I, _D, _D, _I, _D, _I, _D, _D, _I),
}


@functools.lru_cache(maxsize=None)
def _routine(name: str):
    """The ctypes function of SciPy's Cython BLAS or LAPACK routine ``name``, or None."""
    try:
        module = cython_lapack if name == "dtrtrs" else cython_blas
        capsule = module.__pyx_capi__[name]
        api = ctypes.pythonapi
        api.PyCapsule_GetName.restype = ctypes.c_char_p
        api.PyCapsule_GetName.argtypes = [ctypes.py_object]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        pointer = api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))
    except (ImportError, AttributeError, KeyError, ValueError, TypeError):
        return None
    if not pointer:
        return None
    return ctypes.CFUNCTYPE(None, *_PROTOTYPES[name])(pointer)


def available() -> bool:
    """Whether the lock-free calls are available (else SciPy's wrappers answer)."""
    return _routine("dtrtrs") is not None and _routine("dgemv") is not None


def _int(v: int):
    return ctypes.byref(ctypes.c_int(int(v)))


def _dbl(v: float):
    return ctypes.byref(ctypes.c_double(float(v)))


def _fortran_f64(A: np.ndarray) -> bool:
    return A.dtype == np.float64 and A.flags.f_contiguous and A.ndim == 2


def trsm_upper(R: np.ndarray, C: np.ndarray, *, trans: bool = False) -> np.ndarray:
    """``R⁻¹C`` (``R⁻ᵀC`` when ``trans``) for square upper triangular R (LAPACK's
    ``trtrs``, entries below R's diagonal not read); a new Fortran-ordered array.

    Parameters
    ----------
    R : ndarray, shape (q, q)
        Upper triangular, float64, Fortran order (otherwise SciPy's
        ``solve_triangular`` answers, holding the lock).
    C : ndarray, shape (q, k) or (q,)
    trans : bool
        Solve with Rᵀ.

    The answer has the bits of ``scipy.linalg.solve_triangular``'s: the same
    LAPACK routine (``trtrs``, which OpenBLAS implements with kernels of its
    own, not always ``trsm``'s) on the same operands, and the same errors (a
    zero on R's diagonal: ``LinAlgError``).
    """
    C = np.asarray(C, dtype=np.float64)
    vector = C.ndim == 1
    B = np.array(C.reshape(-1, 1) if vector else C, dtype=np.float64, order="F", copy=True)
    q = R.shape[0]
    f = _routine("dtrtrs")
    if f is None or not _fortran_f64(R) or R.shape != (q, q) or B.shape[0] != q:
        out = la.solve_triangular(R, B, trans=1 if trans else 0, lower=False,
                                  check_finite=False)
        return out.ravel() if vector else out
    if q and B.shape[1]:
        info = ctypes.c_int(0)
        f(b"U", b"T" if trans else b"N", b"N", _int(q), _int(B.shape[1]),
          R.ctypes.data_as(_D), _int(q), B.ctypes.data_as(_D), _int(q), ctypes.byref(info))
        if info.value > 0:
            raise np.linalg.LinAlgError(
                f"singular matrix: resolution failed at diagonal {info.value - 1}")
        if info.value < 0:
            raise ValueError(f"illegal value in {-info.value}-th argument of trtrs")
    return B.ravel() if vector else B


def gemv(A: np.ndarray, x: np.ndarray, *, trans: bool = False,
         out: Optional[np.ndarray] = None) -> np.ndarray:
    """``A x`` (``Aᵀ x`` when ``trans``) for a Fortran-ordered float64 block A,
    possibly a column slice ``R[a:b, c:]`` of a larger Fortran array (its leading
    dimension is read from the strides); ``out`` a contiguous float64 vector."""
    m, n = A.shape
    x = np.ascontiguousarray(x, dtype=np.float64)
    rows = n if trans else m
    if out is None:
        out = np.empty(rows)
    f = _routine("dgemv")
    lda = A.strides[1] // 8 if n > 1 else max(1, m)
    fits = (A.dtype == np.float64 and A.strides[0] == 8 and A.strides[1] % 8 == 0
            and lda >= max(1, m))
    if f is None or not fits:
        np.matmul(A.T if trans else A, x, out=out)
        return out
    if m == 0 or n == 0:
        out[:] = 0.0
        return out
    f(b"T" if trans else b"N", _int(m), _int(n), _dbl(1.0),
      A.ctypes.data_as(_D), _int(lda), x.ctypes.data_as(_D), _int(1), _dbl(0.0),
      out.ctypes.data_as(_D), _int(1))
    return out
