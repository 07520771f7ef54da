"""Below DENSE_LIMIT, from SPARSE_SUBSPACE_MIN_ORDER columns, the host decides a square
R without a gap at the cutoff from its small singular subspace (sparse solves)
before a dense SVD: lstsq's rank and answer, checked against numpy.linalg.lstsq."""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import QRFactorization
from scipy_gpuqr._factor import lstsq as _lstsq


@pytest.fixture
def rng():
    return np.random.default_rng(20261128)


def _near_cutoff(rng, m, n, dead, kept_low, dead_high):
    """Dense m × n A: n − dead singular values from 1 down to 10**kept_low, then
    ``dead`` from 10**dead_high down a decade, a narrow gap around lstsq's cutoff
    (Heath's greedy rule does not reveal it: the gap check refuses)."""
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.concatenate([np.logspace(0, kept_low, n - dead),
                        np.logspace(dead_high, dead_high - 1, dead)])
    return (U * s) @ V.T


def _berr(A, x, b, smax):
    r = b - A @ x
    return np.linalg.norm(A.T @ r) / (smax * np.linalg.norm(r))


@pytest.mark.parametrize("dead, kept_low, dead_high", [(10, -12, -14), (20, -12.5, -13.7)])
def test_subspace_answers_before_the_svd(rng, monkeypatch, dead, kept_low, dead_high):
    monkeypatch.setattr(_lstsq, "SPARSE_COD_MAX_DENSITY", 1.0)     # dense test matrix
    monkeypatch.setattr(_lstsq, "SPARSE_SUBSPACE_MIN_ORDER", 200)
    n = 300
    m = n + 40
    A = _near_cutoff(rng, m, n, dead, kept_low, dead_high)
    b = rng.standard_normal(m)
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "subspace_cod", dec
    x_ref, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
    assert rank == n - dead
    assert F.rank == rank
    # σ_r near the cutoff makes x sensitive (the SVD path's x is 5e-5 and 1.2e-3
    # from lstsq's here): the backward error is lstsq's or better, x within that
    assert _berr(A, x, b, s[0]) <= 10 * _berr(A, x_ref, b, s[0])
    assert np.linalg.norm(x - x_ref) <= 1e-2 * np.linalg.norm(x_ref)


def test_below_the_order_the_svd_decides(rng, monkeypatch):
    monkeypatch.setattr(_lstsq, "SPARSE_COD_MAX_DENSITY", 1.0)
    n = 300
    assert n < _lstsq.SPARSE_SUBSPACE_MIN_ORDER
    A = _near_cutoff(rng, n + 40, n, 10, -12, -14)
    b = rng.standard_normal(n + 40)
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    F.solve(b)
    assert F.info["rank_decision"]["method"] == "svd"
    assert F.rank == np.linalg.lstsq(A, b, rcond=None)[2]
