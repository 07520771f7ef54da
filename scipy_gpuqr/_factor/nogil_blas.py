"""Triangular block solves on SciPy's own LAPACK, called through ctypes (host).

The host's rank decisions split their block solves and products over a few
threads (:mod:`scipy_gpuqr._factor.host_lanes`), each running BLAS on one
thread. NumPy's ``matmul`` pieces run side by side there, but SciPy's
wrappers' did not: ``scipy.linalg.solve_triangular``, ``lapack.dtrtrs`` and
``blas.dtrsm`` called from two threads at once took as long as the same
calls one after the other on the 2-core host (a dense R's triangular solves
ran at one core's speed on two lanes; bench/RESULTS.md, issue 16 item 3).
The same LAPACK routine called through :mod:`ctypes` (which lets go of the
interpreter lock for the call) on the function pointer that SciPy exports
for Cython (``scipy.linalg.cython_lapack``: LP64, Fortran calling
convention) runs on both at once. Routine and operands are those of
SciPy's wrapper, so the results are too (bit for bit).

Where the pointer cannot be had (another SciPy build), :func:`trsm_upper`
falls back to SciPy's wrapper (same answer, pieces one after the other).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import scipy.linalg as la
from scipy.linalg import cython_lapack

__all__ = ["trsm_upper", "available"]

_D = ctypes.POINTER(ctypes.c_double)
_I = ctypes.POINTER(ctypes.c_int)
_C = ctypes.c_char_p

#: ctypes prototypes of the routines used (Fortran: every argument by reference).
_PROTOTYPES = {
    # uplo, trans, diag, n, nrhs, a, lda, b, ldb, info
    "dtrtrs": (_C, _C, _C, _I, _I, _D, _I, _D, _I, _I),
}


@functools.lru_cache(maxsize=None)
def _routine(name: str):
    """The ctypes function of SciPy's Cython LAPACK routine ``name``, or None."""
    try:
        capsule = cython_lapack.__pyx_capi__[name]
        # own prototypes (ctypes.pythonapi's attributes are shared by every user)
        get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
            ("PyCapsule_GetName", ctypes.pythonapi))
        get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
            ("PyCapsule_GetPointer", ctypes.pythonapi))
        pointer = get_pointer(capsule, get_name(capsule))
    except (ImportError, AttributeError, KeyError, ValueError, TypeError):
        return None
    if not pointer:
        return None
    return ctypes.CFUNCTYPE(None, *_PROTOTYPES[name])(pointer)


def available() -> bool:
    """Whether the ctypes call is available (else SciPy's wrapper answers)."""
    return _routine("dtrtrs") is not None


def _int(v: int):
    return ctypes.byref(ctypes.c_int(int(v)))


def _fortran_f64(A: np.ndarray) -> bool:
    return A.dtype == np.float64 and A.flags.f_contiguous and A.ndim == 2


def trsm_upper(R: np.ndarray, C: np.ndarray, *, trans: bool = False) -> np.ndarray:
    """``R⁻¹C`` (``R⁻ᵀC`` when ``trans``) for square upper triangular R (LAPACK's
    ``trtrs``, entries below R's diagonal not read); a new Fortran-ordered array.

    Parameters
    ----------
    R : ndarray, shape (q, q)
        Upper triangular, float64, Fortran order (otherwise SciPy's
        ``solve_triangular`` answers).
    C : ndarray, shape (q, k) or (q,)
        Right-hand sides (not modified).
    trans : bool
        Solve with Rᵀ.

    Notes
    -----
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
