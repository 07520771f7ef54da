"""QRFactorization: phases, reuse, pickling, info, dispatch and memory guard."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import GpuqrOptions, QRFactorization, lsqr
from scipy_gpuqr._dispatch import plan as _dispatch
from scipy_gpuqr._dispatch.plan import GpuFallbackWarning

EPS = np.finfo(np.float64).eps


def _A(rng, m, n, density=0.2):
    return (sp.random_array((m, n), density=density, rng=rng) + sp.eye_array(m, n)).tocsc()


@pytest.mark.parametrize("shape", [(40, 25), (25, 40), (30, 30)])
def test_solve_qt_q_r_perm(rng, shape):
    A = _A(rng, *shape)
    F = QRFactorization(A)
    m, n = shape
    B = rng.standard_normal((m, 3))
    X = F.solve(B)
    X_ref = np.linalg.lstsq(A.toarray(), B, rcond=None)[0]
    assert np.allclose(X, X_ref, rtol=1e-9, atol=1e-12)
    assert F.solve(B[:, 0]).shape == (n,)
    M = A.toarray().T if m < n else A.toarray()
    assert F.transposed == (m < n)
    Q = F.q_matmul(np.eye(M.shape[0]))
    assert np.allclose(Q.T @ Q, np.eye(M.shape[0]), atol=1e-12)
    assert np.allclose(F.qt_matmul(Q), np.eye(M.shape[0]), atol=1e-12)
    k = F.R.shape[0]
    assert np.allclose(M[:, F.perm], Q[:, :k] @ F.R.toarray(), atol=1e-12 * np.abs(M).max())
    assert F.rank == min(shape)


def test_info_contents(rng):
    F = QRFactorization(_A(rng, 30, 20))
    F.solve(np.ones(30))
    info = F.info
    for key in ("backend", "requested", "source", "reasons", "ordering", "timings",
                "rank_decision", "flops_backend"):
        assert key in info
    assert info["backend"] in ("cpu", "reference")
    assert info["requested"] == "auto"
    assert any("auto" in r for r in info["reasons"])
    for phase in ("analyze", "factorize", "solve"):
        assert info["timings"][phase] >= 0
    if "intensity" in info:
        assert info["intensity"] > 0 and info["flops"] > 0


def test_refactor_same_pattern(rng):
    A = _A(rng, 30, 20)
    F = QRFactorization(A)
    A2 = A.copy()
    A2.data = rng.standard_normal(A2.nnz)
    b = rng.standard_normal(30)
    assert F.refactor(A2) is F
    assert np.allclose(F.solve(b), np.linalg.lstsq(A2.toarray(), b, rcond=None)[0])
    A3 = A.copy()
    A3.indices[0] = (A3.indices[0] + 1) % 30  # different pattern
    A3 = sp.csc_array(A3.toarray() + 0.0) + sp.csc_array(([1.0], ([29], [0])), shape=(30, 20))
    with pytest.raises(ValueError, match="pattern"):
        F.refactor(A3)
    with pytest.raises(ValueError, match="shape"):
        F.refactor(_A(rng, 31, 20))


def test_pickle_round_trip(rng):
    A = _A(rng, 25, 35)
    F = QRFactorization(A)
    b = rng.standard_normal(25)
    x = F.solve(b)
    G = pickle.loads(pickle.dumps(F))
    assert np.allclose(G.solve(b), x, rtol=1e-13, atol=1e-15)
    assert G.info["backend"] == F.info["backend"]
    assert np.array_equal(G.perm, F.perm)


def test_context_manager_and_free(rng):
    with QRFactorization(_A(rng, 10, 10)) as F:
        F.solve(np.ones(10))
    with pytest.raises(ValueError, match="freed"):
        F.solve(np.ones(10))
    F.free()  # idempotent


def test_tol_default_uses_backend_rank(rng):
    B = _A(rng, 30, 8, density=0.4)
    A = sp.hstack([B, B[:, :2]], format="csc")
    F = QRFactorization(A, tol="default")
    assert F.rank == 8
    x = F.solve(np.ones(30))
    x_ref = np.linalg.lstsq(A.toarray(), np.ones(30), rcond=None)[0]
    assert np.allclose(x, x_ref, atol=1e-10)
    assert QRFactorization(A).rank == 8  # lstsq rule


def test_backend_precedence(rng, monkeypatch):
    A = _A(rng, 12, 8)
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "reference")
    F = QRFactorization(A)
    assert F.info["requested"] == "reference" and F.info["source"] == "environment"
    F = QRFactorization(A, gpuqr_options=GpuqrOptions(backend="cpu"))
    assert F.info["requested"] == "cpu" and F.info["source"] == "options"
    F = QRFactorization(A, backend="auto", gpuqr_options={"backend": "cpu"})
    assert F.info["requested"] == "auto" and F.info["source"] == "keyword"
    monkeypatch.setenv("SCIPY_GPUQR_BACKEND", "warp-drive")
    with pytest.raises(ValueError):
        QRFactorization(A)
    monkeypatch.delenv("SCIPY_GPUQR_BACKEND")
    assert QRFactorization(A).info["source"] == "default"
    with pytest.raises(ValueError):
        QRFactorization(A, backend="tpu")


@pytest.mark.parametrize("backend", ["cpu", "reference", "simulate"])
def test_every_backend_answers(rng, backend):
    A = _A(rng, 20, 12)
    b = rng.standard_normal(20)
    F = QRFactorization(A, backend=backend)
    assert np.allclose(F.solve(b), np.linalg.lstsq(A.toarray(), b, rcond=None)[0])
    assert F.info["backend"] in ("cpu", "reference", "simulate")


def test_gpu_request_without_engine_warns_and_falls_back(rng, monkeypatch):
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (None, "no GPU engine (test)"))
    A = _A(rng, 20, 12)
    with pytest.warns(GpuFallbackWarning, match="no GPU engine"):
        F = QRFactorization(A, backend="gpu")
    assert F.info["backend"] in ("cpu", "reference")
    assert issubclass(GpuFallbackWarning, RuntimeWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F = QRFactorization(A)  # auto: never warns
    assert any("auto: CPU" in r for r in F.info["reasons"])


def test_memory_guard_raises_clean_memory_error(rng, monkeypatch):
    A = _A(rng, 200, 100)
    if QRFactorization(A).info.get("host_bytes") is None:
        pytest.skip("no symbolic analysis")
    monkeypatch.setattr(_dispatch, "available_host_memory", lambda: 1000)
    monkeypatch.setattr(_dispatch, "free_host_memory", lambda: 1000)
    with pytest.raises(MemoryError, match="needs about"):
        lsqr(A, np.ones(200), backend="cpu")


def test_memory_guard_reads_available_memory_only_where_free_memory_is_short(rng, monkeypatch):
    """A factorization needing under half the free memory (one ``sysinfo`` call) is not
    checked against ``MemAvailable`` (a read of /proc/meminfo); one that may not fit is,
    and fits or raises by it."""
    A = _A(rng, 200, 100)
    need = QRFactorization(A).info.get("host_bytes")
    if need is None:
        pytest.skip("no symbolic analysis")
    reads = []

    def available():
        reads.append(1)
        return int(10 * need)
    monkeypatch.setattr(_dispatch, "available_host_memory", available)
    monkeypatch.setattr(_dispatch, "free_host_memory", lambda: int(3 * need))
    QRFactorization(A, backend="cpu")
    assert reads == []
    monkeypatch.setattr(_dispatch, "free_host_memory", lambda: int(need))
    QRFactorization(A, backend="cpu")
    assert reads == [1]
    monkeypatch.setattr(_dispatch, "available_host_memory", lambda: int(need // 2))
    with pytest.raises(MemoryError, match="needs about"):
        QRFactorization(A, backend="cpu")


def test_verbose_logging(rng, monkeypatch, capsys):
    monkeypatch.setenv("SCIPY_GPUQR_VERBOSE", "1")
    QRFactorization(_A(rng, 10, 10))
    assert "scipy_gpuqr:" in capsys.readouterr().err


@pytest.mark.slow
def test_arrow_is_a_memory_error_not_a_crash(matrices_dir):
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices_dir / "arrow.mtx")))
    avail = _dispatch.available_host_memory()
    if avail is not None and avail > 40e9:
        pytest.skip("enough memory here to try the factorization")
    with pytest.raises(MemoryError, match="GB"):
        lsqr(A, np.ones(A.shape[0]), backend="cpu")


def _zero_matrices(shape):
    """An all-zero A of ``shape`` without entries, and one whose entries are all
    explicit zeros (nnz > 0)."""
    m, n = shape
    rows = np.arange(max(m, n)) % m
    cols = np.arange(max(m, n)) % n
    explicit = sp.csc_array((np.zeros(rows.size), (rows, cols)), shape=shape)
    assert explicit.nnz > 0
    return [sp.csc_array(shape), explicit]


@pytest.mark.parametrize("backend", ["cpu", "reference", "simulate"])
@pytest.mark.parametrize("shape", [(3, 4), (4, 3), (3, 3), (4, 4), (1, 1), (2, 2), (1, 5),
                                   (5, 1)])
def test_zero_matrix_solves_to_zero(rng, backend, shape):
    """A = 0 has rank 0: the minimum-norm least-squares solution is x = 0, on
    every backend and without warnings (σ_max by Lanczos on a zero operator
    once raised ARPACK's "Starting vector is zero")."""
    m, n = shape
    for A in _zero_matrices(shape):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            F = QRFactorization(A, backend=backend)
            x = F.solve(rng.standard_normal(m))
            X = F.solve(rng.standard_normal((m, 3)))
            assert F.rank == 0
            assert F.info["rank_decision"]["rank"] == 0
        assert x.shape == (n,) and np.all(x == 0)
        assert X.shape == (n, 3) and np.all(X == 0)


@pytest.mark.parametrize("backend", ["cpu", "reference", "simulate"])
def test_rank_deficient_sparse_r_with_ones_in_its_null_space(backend):
    """A sparse R with ``R @ ones == 0`` (rows summing to zero) but R ≠ 0: σ_max's
    Lanczos must not start from a vector its operator annihilates."""
    n = 50
    M = np.zeros((n, n))
    M[0, 0], M[0, 1], M[5, 7], M[5, 8] = 1.0, -1.0, 2.0, -2.0
    b = np.arange(1.0, n + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F = QRFactorization(sp.csc_array(M), backend=backend)
        x = F.solve(b)
    assert F.rank == 2
    np.testing.assert_allclose(x, np.linalg.lstsq(M, b, rcond=None)[0], atol=1e-13)


def test_sigma_max_lanczos_zero_and_annihilated_start():
    from scipy_gpuqr._factor.subspace_cod import sigma_max_lanczos
    assert sigma_max_lanczos(sp.csc_array((4, 3))) == 0.0
    assert sigma_max_lanczos(np.zeros((3, 4))) == 0.0
    assert sigma_max_lanczos(sp.csc_array((np.zeros(2), ([0, 1], [0, 1])), shape=(3, 3))) == 0.0
    R = np.array([[1.0, -1.0, 0.0, 0.0], [0.0, 2.0, -2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    for G in (R, sp.csc_array(R)):
        assert sigma_max_lanczos(G) == pytest.approx(np.linalg.norm(R, 2), rel=1e-10)
    from scipy_gpuqr._factor.dense_cod import sigma_max_estimate
    assert sigma_max_estimate(np.zeros((3, 4))) == 0.0
    assert sigma_max_estimate(R) == pytest.approx(np.linalg.norm(R, 2), rel=1e-5)
