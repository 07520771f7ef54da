"""Rank detection by Heath's rule on R after a factorization without it.

The simulate backend (the GPU task lists run by the NumPy executor) serves
``tol`` this way on the host, exactly as the GPU backend does on the device;
ranks must equal SuiteSparseQR's for the same column order and tolerance, and
the factorization must keep the NumericQR contract (A·P = Q·R, Q orthogonal,
R[:rank, :rank] upper triangular with |diagonal| > tol, dead columns last).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import qr
from scipy_gpuqr._dispatch.plan import backend_factorizer
from scipy_gpuqr._engine.host.reference import default_tol, reference_factorize
from scipy_gpuqr._factor.rank_refine import factorizer, heath_refine
from scipy_gpuqr._testing_matrices import chessboard_boundary

EPS = np.finfo(np.float64).eps

SINGULAR = ["GD01_b", "Ragusa16", "Tina_AskCal", "gent113", "dwt_878", "494_bus", "lp_e226",
            "rajat19", "n3c4-b4", "cage5"]


def _spqr():
    f, ran, _ = backend_factorizer("cpu")
    if ran != "cpu":
        pytest.skip("SuiteSparseQR not available")
    return f


def _check_contract(num, A, tol):
    m, n = A.shape
    k = num.R.shape[0]
    Ap = A[:, num.colperm].toarray()
    R = num.R.toarray()
    Q = num.q_matmul(np.eye(m)[:, :k])
    scale = max(np.linalg.norm(Ap), 1.0)
    # dropped dead parts are a backward perturbation of at most tol per column
    assert np.linalg.norm(Q @ R - Ap) <= 10 * tol * np.sqrt(n) + 1e3 * EPS * scale
    assert np.linalg.norm(Q.T @ Q - np.eye(k)) <= 1e3 * EPS * np.sqrt(k)
    r = num.rank
    assert np.allclose(R, np.triu(R))
    assert np.all(np.abs(np.diag(R)[:r]) > tol)
    assert not R[r:].any()
    QtA = num.qt_matmul(Ap)
    assert np.linalg.norm(QtA[:k] - R) <= 10 * tol * np.sqrt(n) + 1e3 * EPS * scale


@pytest.mark.parametrize("shape", [(5, 6, 2), (5, 7, 3), (4, 6, 2)])
def test_chessboard_rank_equals_suitesparse(shape):
    spqr = _spqr()
    A = chessboard_boundary(*shape)
    tol = default_tol(A)
    base = reference_factorize(A, None, tol=None)
    num = heath_refine(base, tol)
    ref = spqr(A, ordering="colamd", colperm=base.colperm, tol=tol)
    assert num.rank == ref.rank < A.shape[1]
    _check_contract(num, A, tol)


@pytest.mark.parametrize("name", SINGULAR)
def test_shared_matrices_rank_through_qr(matrices_dir, name):
    from scipy_gpuqr.io import mmread
    spqr = _spqr()
    A = sp.csc_array(mmread(str(matrices_dir / f"{name}.mtx"))).astype(np.float64)
    res = qr(A, mode="r", tol="default", backend="simulate")
    perm0 = reference_factorize(A, None, tol=None).colperm
    ref = spqr(A, ordering="colamd", colperm=perm0, tol="default")
    assert res.rank == ref.rank, (res.rank, ref.rank)
    R = res.R.toarray()
    assert np.allclose(R, np.triu(R)) and not R[res.rank:].any()


def test_simulate_backend_refines_and_keeps_contract(rng):
    A = sp.random_array((120, 60), density=0.08, rng=rng, format="csc")
    A = sp.hstack([A, A[:, :4] @ rng.standard_normal((4, 3))], format="csc")
    f, ran, _ = factorizer("simulate")
    num = f(A, ordering="colamd", colperm=None, tol="default")
    assert "Heath" in num.info["rank_detection"]
    assert num.rank == np.linalg.matrix_rank(A.toarray())
    _check_contract(num, A, num.tol)
    # dead columns at the end of colperm: the live ones alone have full rank
    assert num.rank < 63
    assert np.linalg.matrix_rank(A[:, num.colperm[:num.rank]].toarray()) == num.rank
