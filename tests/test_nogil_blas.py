"""Triangular block solves on SciPy's LAPACK through ctypes (issue 16, item 3).

:mod:`scipy_gpuqr._factor.nogil_blas` calls SciPy's own LAPACK (the
pointers it exports for Cython) through ctypes so that the host rank decision's column
pieces of a dense R's ``trsm`` run side by side on its threads. Checked: the
same bits as ``scipy.linalg.solve_triangular`` (so every decision answers as
before), the fallback to SciPy's wrapper and LAPACK's errors, and the dense subspace decision against the one on
SciPy's wrapper. That the pieces then run side by side is measured in
bench/RESULTS.md (a timing, not a test).
"""

from __future__ import annotations


import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr._factor import nogil_blas
from scipy_gpuqr._factor import sparse_subspace as _ss
from scipy_gpuqr._factor.nogil_blas import trsm_upper

EPS = np.finfo(np.float64).eps


def _graded_r(rng, q, low=1e-13):
    """Dense upper triangular R of order q, singular values geometric from 1 to ``low``."""
    U, _ = np.linalg.qr(rng.standard_normal((q, q)))
    V, _ = np.linalg.qr(rng.standard_normal((q, q)))
    A = (U * np.logspace(0, np.log10(low), q)) @ V.T
    return np.asfortranarray(np.linalg.qr(A, mode="r"))


@pytest.fixture
def rng():
    return np.random.default_rng(1604)


def test_available_on_this_scipy():
    """SciPy exports dtrtrs for Cython: the ctypes path is the one tested."""
    assert nogil_blas.available()


@pytest.mark.parametrize("k", [1, 2, 7, 64])
@pytest.mark.parametrize("trans", [False, True])
def test_trsm_upper_has_solve_triangulars_bits(rng, k, trans):
    """The same routine on the same operands: bit for bit, ill-conditioned R
    (every block rank decision answers as it did with SciPy's wrapper)."""
    R = _graded_r(rng, 300)
    R[np.tril_indices(300, -1)] = np.nan            # never read
    C = rng.standard_normal((300, k))
    ref = la.solve_triangular(R, C, trans=int(trans), lower=False, check_finite=False)
    out = trsm_upper(R, C, trans=trans)
    assert out.flags.f_contiguous
    np.testing.assert_array_equal(out, ref)
    # C itself is left as it was; a vector gives a vector
    v = trsm_upper(R, C[:, 0], trans=trans)
    assert v.shape == (300,)
    np.testing.assert_array_equal(v, la.solve_triangular(R, C[:, 0], trans=int(trans),
                                                         lower=False, check_finite=False))


def test_trsm_upper_fallbacks_and_empty(rng):
    """C-ordered R (SciPy's wrapper answers), no columns, order 0."""
    R = _graded_r(rng, 50, low=1e-6)
    C = rng.standard_normal((50, 5))
    ref = la.solve_triangular(R, C, lower=False)
    np.testing.assert_array_equal(trsm_upper(np.ascontiguousarray(R), C), ref)
    assert trsm_upper(R, np.empty((50, 0))).shape == (50, 0)
    assert trsm_upper(np.empty((0, 0), order="F"), np.empty((0, 3))).shape == (0, 3)


def test_trsm_upper_calls_lapack_itself(rng, monkeypatch):
    """On a Fortran-ordered R the solve does not go through SciPy's wrapper (whose
    calls from two threads ran one after the other); with a C-ordered R it does."""
    R = _graded_r(rng, 80, low=1e-8)
    C = rng.standard_normal((80, 3))
    ref = la.solve_triangular(R, C, lower=False, check_finite=False)
    seen = []

    def wrapper(*args, **kwargs):
        seen.append(1)
        return ref
    monkeypatch.setattr(nogil_blas.la, "solve_triangular", wrapper)
    np.testing.assert_array_equal(trsm_upper(R, C), ref)
    assert not seen
    trsm_upper(np.ascontiguousarray(R), C)
    assert seen


def test_trsm_upper_zero_pivot_raises(rng):
    """A zero on R's diagonal: LAPACK's info, SciPy's error."""
    R = _graded_r(rng, 40, low=1e-3)
    R[17, 17] = 0.0
    with pytest.raises(np.linalg.LinAlgError, match="diagonal 17"):
        trsm_upper(R, rng.standard_normal((40, 2)))


def test_dense_decision_is_the_wrapper_decision(rng, monkeypatch):
    """The dense branch of :func:`~scipy_gpuqr._factor.sparse_subspace.decide` on two
    lanes with the lock-free solves gives the Ritz values, rank and solution of
    the same decision on SciPy's wrapper, bit for bit."""
    q = 600
    U, _ = np.linalg.qr(rng.standard_normal((q, q)))
    V, _ = np.linalg.qr(rng.standard_normal((q, q)))
    cut = EPS * q
    s = np.logspace(0, np.log10(cut) / 0.97, q)          # 3 % below the cutoff, no gap
    R = sp.csc_array(np.linalg.qr((U * s) @ V.T, mode="r"))
    d = np.abs(R.diagonal())
    c = rng.standard_normal(q)
    new = _ss.decide(R, cut, d, block=32, max_block=q // 3, lanes=2)
    monkeypatch.setattr(_ss, "trsm_upper", lambda R, C, trans=False: la.solve_triangular(
        R, C, trans=int(trans), lower=False, check_finite=False))
    old = _ss.decide(R, cut, d, block=32, max_block=q // 3, lanes=2)
    assert new is not None and old is not None
    sv = la.svdvals(R.toarray())
    assert new.rank == old.rank == int(np.count_nonzero(sv > cut * sv[0])) < q
    np.testing.assert_array_equal(new.ritz, old.ritz)
    np.testing.assert_array_equal(new.solve(c), old.solve(c))
