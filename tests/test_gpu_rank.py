"""Rank decisions on the GPU (issue 6): Heath's rule on R and the dense COD, on the device.

``qr(..., tol=, backend='gpu')`` factorizes without rank detection on the GPU
and applies Heath's rule to R there; the rank must equal SuiteSparseQR's for
the same column order and tolerance. ``lsqr(..., backend='gpu')`` on a
rank-deficient matrix beyond DENSE_LIMIT decides the rank and builds the
minimum-norm solution with the dense COD on the device, and must agree with
the host path and with numpy.linalg.lstsq.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import QRFactorization, lsqr, qr
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._dispatch.plan import backend_factorizer
from scipy_gpuqr._factor.rank_refine import factorizer
from scipy_gpuqr._engine.host.reference import default_tol
from scipy_gpuqr._testing_matrices import chessboard_boundary

from conftest import nullspace_blocks_fail_on

pytestmark = pytest.mark.gpu

EPS = np.finfo(np.float64).eps


def _spqr():
    f, ran, _ = backend_factorizer("cpu")
    if ran != "cpu":
        pytest.skip("SuiteSparseQR not available")
    return f


@pytest.mark.parametrize("case", [("chess", (5, 7, 3)), ("chess", (4, 6, 2)),
                                  ("mtx", "GD01_b"), ("mtx", "Tina_AskCal"),
                                  ("mtx", "gent113"), ("mtx", "n3c4-b4")])
def test_qr_rank_on_gpu_equals_suitesparse(matrices_dir, case):
    kind, what = case
    if kind == "chess":
        A = chessboard_boundary(*what)
    else:
        from scipy_gpuqr.io import mmread
        A = sp.csc_array(mmread(str(matrices_dir / f"{what}.mtx"))).astype(np.float64)
    f, ran, _ = factorizer("gpu")
    num = f(A, ordering="colamd", colperm=None, tol="default")
    assert num.info.get("backend") == "gpu"
    assert "GPU" in num.info["rank_detection"]
    ref = _spqr()(A, ordering="colamd", colperm=num.base.colperm, tol="default")
    assert num.rank == ref.rank
    m, n = A.shape
    k = num.R.shape[0]
    Ap = A[:, num.colperm].toarray()
    Q = num.q_matmul(np.eye(m)[:, :k])
    tol = default_tol(A)
    assert np.linalg.norm(Q @ num.R.toarray() - Ap) <= 10 * tol * np.sqrt(n) + 1e-12 * np.linalg.norm(Ap)
    res = qr(A, mode="r", tol="default", backend="gpu")
    assert res.rank == ref.rank


def test_lsqr_min_norm_rank_decided_on_gpu(monkeypatch, rng):
    A = chessboard_boundary(5, 7, 3)                      # 4200×2100, rank 1714
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 500)       # force the COD path
    monkeypatch.setattr(_lstsq, "device_subspace_fits",
                        lambda q, p: False)         # not R's subspace on the device
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "dense_cod" and dec["device"] == "gpu"
    assert F.rank == 1714
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
    x2 = lsqr(A, b, backend="gpu")[0]
    assert np.linalg.norm(x2 - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_rank_decision_estimates_use_the_device_solves(monkeypatch, rng):
    """Beyond DENSE_LIMIT the condition estimate of a GPU factorization's R runs through
    the device's triangular solve (the host's sparse solves are not called)."""
    from scipy_gpuqr._testing_matrices import grid3d_least_squares

    def no_host(R):
        raise AssertionError("host triangular solves used")
    A = grid3d_least_squares(16)                          # n = 4096 > DENSE_LIMIT
    b = rng.standard_normal(A.shape[0])
    x_ref = QRFactorization(A, backend="cpu").solve(b)    # (host solves: before the patch)
    monkeypatch.setattr(_lstsq, "_host_triangular", no_host)
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    assert F.info["rank_decision"]["method"] == "triangular"
    assert np.linalg.norm(x - x_ref) <= 1e-10 * np.linalg.norm(x_ref)


def _backward_error(A, x, b) -> float:
    r = b - A @ x
    return float(np.linalg.norm(A.T @ r) / (sp.linalg.norm(A) * np.linalg.norm(r)))


@pytest.mark.slow
@pytest.mark.parametrize("backend, on_device", [("gpu", True), ("gpu", False),
                                                ("auto", True)])
def test_large_sparse_r_without_a_gap_skips_the_devices_svd(matrices_dir, monkeypatch,
                                                            backend, on_device):
    """bayer10 (q = 13436, R sparse, 133 singular values under the cutoff, no certified
    gap there): where R's dense work runs on the GPU (a GPU factorization's R, or auto's
    CPU factorization with a GPU present) R's small singular subspace decides, not the
    device's dense COD of all of R nor cuSOLVER's SVD: on R made dense on the device
    where it fits there (gap or not, the host's rule), else, after the dense COD, through
    R's sparse solves on the host. The rank and the answer's backward error are the CPU
    backend's."""
    from scipy_gpuqr.io import mmread
    svd, cods = [], []
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_svd",
                        lambda self, G=None: svd.append(1))
    real_cod = _lstsq.MinNormSolver._prepare_dense_cod

    def dense_cod(self, device, d):
        cods.append(device)
        return real_cod(self, device, d)
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_dense_cod", dense_cod)
    if not on_device:
        monkeypatch.setattr(_lstsq, "device_subspace_fits",
                            lambda q, max_block: False)
    A = sp.csc_array(mmread(str(matrices_dir / "bayer10.mtx")))
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    options = {"intensity_threshold": 1e30} if backend == "auto" else None
    F = QRFactorization(A, backend=backend, gpuqr_options=options)
    x = F.solve(b)
    assert F.info["backend"] == ("gpu" if backend == "gpu" else "cpu")
    solver = F._core.rank_decision()
    assert (solver.method, solver.cod_device) == (("dense_subspace", "gpu") if on_device
                                                  else ("subspace_cod", "cpu"))
    assert not svd and bool(cods) != on_device
    C = QRFactorization(A, backend="cpu")
    x_cpu = C.solve(b)
    assert F.rank == C.rank
    assert _backward_error(A, x, b) <= 10 * _backward_error(A, x_cpu, b) + 1e-14


@pytest.mark.slow
def test_solves_growing_past_the_cutoff_leave_the_device_subspace(matrices_dir,
                                                                   monkeypatch):
    """rajat01 (q = 6833, lstsq's rank 6777) factorized on the GPU: its dead pivots lie
    at their columns' rounding (SuiteSparseQR's partly exact zeros), and R's solves grow
    past what a block resolves at the cutoff; R's small singular subspace on the device
    refuses (it once found 47 of the 56 null directions: rank 6786, backward error
    1e-6), and the device's dense COD decides: the CPU backend's rank, a backward error
    at working precision (the device COD's, a few hundred eps on rajat01, against
    SuiteSparseQR's few tens)."""
    from scipy_gpuqr.io import mmread
    refused = []
    real = _lstsq.DenseSubspaceCOD

    def subspace(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except _lstsq.SubspaceTooLarge as e:
            refused.append(str(e))
            raise
    monkeypatch.setattr(_lstsq, "DenseSubspaceCOD", subspace)
    A = sp.csc_array(mmread(str(matrices_dir / "rajat01.mtx")))
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    solver = F._core.rank_decision()
    assert solver.method != "dense_subspace"
    assert refused and all("grows by" in e for e in refused)
    C = QRFactorization(A, backend="cpu")
    C.solve(b)
    assert F.rank == C.rank == 6777
    assert _backward_error(A, x, b) <= 1e4 * EPS


def test_device_subspace_beyond_dense_limit(matrices_dir, monkeypatch):
    """nnc1374's hidden deficiency (no pivot under the cutoff, a clear gap) with
    DENSE_LIMIT below its order: R's small singular subspace on the device still
    decides where R made dense fits there (no dense COD of all of R), lstsq's rank."""
    from scipy_gpuqr.io import mmread
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 1000)
    monkeypatch.setattr(_lstsq, "DenseCOD", None)        # must not be reached
    A = sp.csc_array(mmread(str(matrices_dir / "nnc1374.mtx")))
    b = np.random.default_rng(8).standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    solver = F._core.rank_decision()
    assert solver.method == "dense_subspace" and solver.cod_device == "gpu"
    x_ref, _, rank, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert F.rank == rank
    assert _backward_error(A, x, b) <= 10 * _backward_error(A, x_ref, b) + 1e-14


def _graded_gpu_case(rng, n=700, m=800, decades=18):
    """Singular values logspace(0, -18): no gap, Heath's rule drops nothing, the SVD decides."""
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return sp.csc_array((U * np.logspace(0, -decades, n)) @ V.T)


@pytest.mark.parametrize("backend,options", [("gpu", None),
                                             ("auto", {"intensity_threshold": 1e30})])
def test_dense_svd_of_r_runs_on_the_gpu(rng, backend, options):
    """q ≥ SVD_GPU_MIN_ORDER: the SVD deciding the rank runs on the device, also when
    ``auto`` factorized on the CPU with a GPU present; results equal lstsq's."""
    import cupy
    A = _graded_gpu_case(rng)
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend=backend, gpuqr_options=options)
    x = F.solve(b)
    solver = F._core.rank_decision()
    assert solver.method == "svd"
    assert isinstance(solver._svd[0], cupy.ndarray)
    assert F.info["backend"] == ("gpu" if backend == "gpu" else "cpu")
    Ad = A.toarray()
    x_ref, _, rank, s = np.linalg.lstsq(Ad, b, rcond=None)
    assert F.rank == rank

    def backward(y):
        r = b - Ad @ y
        return np.linalg.norm(Ad.T @ r) / (s[0] * np.linalg.norm(r))
    assert backward(x) <= max(10 * backward(x_ref), 100 * EPS * A.shape[0])
    assert np.linalg.norm(x) == pytest.approx(np.linalg.norm(x_ref), rel=5e-2)


def test_auto_cpu_factorization_refines_densely_on_the_gpu(monkeypatch, rng):
    """auto factorizes a low-intensity problem on the CPU; with a GPU present the
    dense COD of R (beyond DENSE_LIMIT, sparse COD not applicable) runs there."""
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 50)
    monkeypatch.setattr(_lstsq, "SPARSE_COD_MAX_DENSITY", 0.0)
    A = sp.random_array((300, 150), density=0.3, rng=rng, format="csc")
    A = sp.hstack([A, A[:, :6] - 2.0 * A[:, 6:12]], format="csc")
    b = rng.standard_normal(300)
    F = QRFactorization(A, backend="auto", gpuqr_options={"intensity_threshold": 1e30})
    x = F.solve(b)
    assert F.info["backend"] == "cpu"
    summary = F.info["rank_decision"]
    assert summary["method"] in ("dense_cod", "svd") and summary["device"] == "gpu"
    x_ref, _, rank, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert F.rank == rank == 150
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_full_rank_sigma_test_on_the_device(rng):
    """cond 1e11 at 700 columns: the 1-norm estimate would be inconclusive; with R on
    the GPU the σ test runs there (no host estimate) and confirms full rank."""
    A = _graded_gpu_case(rng, decades=11)
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    info = F.info["rank_decision"]
    assert info["method"] == "triangular"
    assert np.isnan(info["rcond_estimate"])            # decided by the device's σ test
    s = np.linalg.svd(A.toarray(), compute_uv=False)
    # σ_min: the bound 1/‖R⁻¹‖_F (within √q below) or the Lanczos value
    assert s[-1] / np.sqrt(A.shape[1]) * (1 - 1e-8) <= info["sigma_min"] <= s[-1] * (1 + 1e-6)
    assert info["sigma_max"] == pytest.approx(s[0], rel=1e-10)
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-3 * np.linalg.norm(x_ref)


@pytest.mark.parametrize("decades", [3, 9])
def test_sigma_min_upper_device_equals_host(rng, decades):
    import cupy
    from scipy_gpuqr._factor.triangular import norm2_lanczos, sigma_min_upper
    U, _ = np.linalg.qr(rng.standard_normal((300, 300)))
    T = np.triu(np.linalg.qr((U * np.logspace(0, -decades, 300)) @ U.T, mode="r"))
    smin = np.linalg.svd(T, compute_uv=False)[-1]
    for threshold in (0.0, smin):
        host = sigma_min_upper(T, threshold)
        dev = sigma_min_upper(cupy.asarray(T), threshold)
        assert dev.bound == host.bound
        assert dev.value == pytest.approx(host.value, rel=1e-8)
    assert norm2_lanczos(cupy.asarray(T)) == pytest.approx(np.linalg.norm(T, 2), rel=1e-10)


@pytest.mark.parametrize("decades", [3, 9, 13])
def test_device_sigma_test_verdict_equals_lanczos(rng, decades):
    """A dense T on the device: the GEMM certificate's verdict at the caller's margin
    (``value > margin·threshold``) is the host's Lanczos verdict, for thresholds on
    either side of σ_min and near it (on σ_min itself either side, by rounding); its
    value within 1e-3 of σ_min where settled (the power method's Rayleigh quotient:
    6e-5 on the flattest spectrum here, 3 decades over 700 values; the σ test's
    margin is 5 %)."""
    import cupy
    from scipy_gpuqr._factor import triangular
    U, _ = np.linalg.qr(rng.standard_normal((700, 700)))
    T = np.triu(np.linalg.qr((U * np.logspace(0, -decades, 700)) @ U.T, mode="r"))
    smin = np.linalg.svd(T, compute_uv=False)[-1]
    margin = 1.05
    for ratio in (0.2, 0.9, 0.94, 0.97, 1.0, 1.03, 1.1, 5.0):
        threshold = ratio * smin / margin
        host = triangular.sigma_min_upper(T, threshold)
        dev = triangular.sigma_min_upper(cupy.asarray(T), threshold, margin=margin)
        if host.bound:
            assert dev.bound and dev.value == pytest.approx(host.value, rel=1e-8)
            continue
        bar = margin * threshold
        if (dev.value > bar) != (host.value > bar):
            # ratio 1 puts the bar on σ_min itself: there rounding picks the side
            # (both values within rounding of it), anywhere else the verdicts agree
            assert max(abs(dev.value - bar), abs(host.value - bar)) <= 1e-10 * bar, ratio
        if abs(ratio - 1) > 0.05:
            assert dev.value == pytest.approx(smin, rel=1e-3), ratio


def test_full_rank_probe_through_the_device_solves(monkeypatch, rng):
    """Beyond DENSE_LIMIT and SOLVE_RANK_MIN_ORDER full rank is confirmed by the
    randomized probe through the GPU's solves (no host solve, no 1-norm estimate)."""
    from scipy_gpuqr._factor.solve_rank import probe_margin
    from scipy_gpuqr._testing_matrices import grid3d_least_squares

    def no_host(*args, **kwargs):
        raise AssertionError("host triangular solves used")
    A = grid3d_least_squares(16)                          # n = 4096
    b = rng.standard_normal(A.shape[0])
    x_ref = QRFactorization(A, backend="cpu").solve(b)
    monkeypatch.setattr(_lstsq, "UpperTriangular", no_host)
    monkeypatch.setattr(_lstsq, "_host_triangular", no_host)
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert dec["method"] == "triangular" and np.isnan(dec["rcond_estimate"])
    # ‖A‖_F = ‖R‖_F, with frobenius_bound's rounding allowance (16 m n eps)
    assert sp.linalg.norm(A) <= dec["sigma_max"] <= sp.linalg.norm(A) * (1 + 2e-7)
    lam = 3 * (2 - 2 * np.cos(np.pi / 17))
    smin = np.hypot(lam, 0.1)
    assert smin * (1 - 1e-9) <= dec["sigma_min"] <= probe_margin(4096, 1) * smin
    assert np.linalg.norm(x - x_ref) <= 1e-10 * np.linalg.norm(x_ref)


def test_cholesky_upper_on_the_device(rng):
    """cuSOLVER's potrf as ``array_ops.cholesky_upper`` calls it: a C-contiguous
    Gram's lower triangle becomes NumPy's Cholesky factor, the other triangle is
    left, a matrix not positive definite gives the order of its first bad minor."""
    import cupy
    from scipy_gpuqr._engine.gpu import array_ops
    n = 300
    X = rng.standard_normal((2 * n, n))
    G = X.T @ X
    Gd = cupy.asarray(G)
    assert array_ops.cholesky_upper(Gd) == 0
    out = Gd.get()
    L = np.linalg.cholesky(G)
    assert np.max(np.abs(np.tril(out) - L)) <= 1e-12 * np.abs(L).max()
    assert np.array_equal(np.triu(out, 1), np.triu(G, 1))
    G[5, 5] = -1.0
    assert array_ops.cholesky_upper(cupy.asarray(G)) == 6


def test_device_thin_qr_by_cholesky_qr2(monkeypatch, rng):
    """The null-space COD's thin QR on the device: CholeskyQR2 (no Householder) for
    a block of condition 1e4, Householder for one of 1e12; either orthonormal with
    ``X = Q R``, R read by ``right_solve`` as the factor it is."""
    import cupy
    from scipy_gpuqr._factor import solve_rank as sr
    blocks = sr._DeviceBlocks(cupy)
    q, d = 6000, 400
    U, _ = np.linalg.qr(rng.standard_normal((q, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    real = sr.array_ops.thin_qr
    for decades, householder in ((4, False), (12, True)):
        X = np.ascontiguousarray((U * np.logspace(0, -decades, d)) @ V.T)
        Xd = cupy.asarray(X)
        calls = []
        monkeypatch.setattr(sr.array_ops, "thin_qr",
                            lambda *a, **k: calls.append(1) or real(*a, **k))
        Q, R = blocks.orth(Xd)
        assert bool(calls) == householder
        assert np.array_equal(Xd.get(), X)
        Qh, Rh = Q.get(), R.get()
        assert np.linalg.norm(Qh.T @ Qh - np.eye(d)) <= 1e-13
        assert np.array_equal(Rh, np.triu(Rh))
        assert np.linalg.norm(Qh @ Rh - X) <= 1e-14 * np.sqrt(d)
        if not householder:
            back = blocks.right_solve(cupy.array(Xd), R).get()
            assert np.linalg.norm(back - Qh) <= 1e-14 * 10 ** decades


def _nullspace_decisions_counting_householder(monkeypatch) -> list:
    """The null-space COD tried from order 1000 (the dense COD must not be reached)
    and Householder's thin QR counted: the list each of its calls appends to (empty
    where every thin QR was CholeskyQR2's)."""
    from scipy_gpuqr._factor import solve_rank as sr
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 1000)
    monkeypatch.setattr(_lstsq, "DenseCOD", None)
    householder = []
    real = sr.array_ops.thin_qr
    monkeypatch.setattr(sr.array_ops, "thin_qr",
                        lambda *a, **k: householder.append(1) or real(*a, **k))
    return householder


@pytest.mark.parametrize("wide", [False, True])
def test_nullspace_cod_on_the_device(monkeypatch, rng, wide):
    """A chessboard's dependent columns: rank and minimum-norm solution from a few
    block solves on the device (no dense COD), equal to lstsq's; the thin QRs are
    CholeskyQR2's (no Householder fallback on these blocks)."""
    import cupy
    householder = _nullspace_decisions_counting_householder(monkeypatch)
    A = chessboard_boundary(5, 7, 3)                      # 4200×2100, rank 1714
    if wide:
        A = sp.csc_array(A.T)
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    solver = F._core.rank_decision()
    assert solver.method == "nullspace_cod" and solver.cod_device == "gpu"
    assert isinstance(solver._cod._v, cupy.ndarray)
    assert not householder
    assert F.rank == 1714
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
    x2 = lsqr(A, b, backend="gpu")[0]
    assert np.linalg.norm(x2 - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_nullspace_cod_fetches_qtb_beside_its_first_block(monkeypatch, rng):
    """GPU factors with every stage on the device: the decision's first block
    (``R⁻ᵀΩ`` and its thin QR) goes on a stream of its own, the same in the next
    decision, while ``Qᵀb`` is fetched on the caller's stream; rank and x are
    lstsq's and those of the fetch first (to rounding: the solves' level kernels
    add with atomics)."""
    import cupy
    from scipy_gpuqr._factor import solve_rank as sr
    from scipy_gpuqr._factor.factored import FactoredQR
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 1000)
    monkeypatch.setattr(_lstsq, "DenseCOD", None)        # must not be reached
    sides = []
    real = sr._side_stream
    monkeypatch.setattr(sr, "_side_stream", lambda cp: sides.append(real(cp)) or sides[-1])
    A = chessboard_boundary(5, 7, 3)                      # 4200×2100, rank 1714
    b = rng.standard_normal(A.shape[0])
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    xs = []
    for _ in range(2):
        F = QRFactorization(A, backend="gpu")
        xs.append(F.solve(b))
        solver = F._core.rank_decision()
        assert solver.method == "nullspace_cod" and solver.rank == 1714
        F.free()
    assert len(sides) == 2 and sides[1] is sides[0]
    assert sides[0].ptr != cupy.cuda.get_current_stream().ptr
    monkeypatch.setattr(FactoredQR, "_resident", lambda self: False)
    F = QRFactorization(A, backend="gpu")
    x_first = F.solve(b)
    assert len(sides) == 2 and F._core.rank_decision().rank == 1714
    for x in xs:
        assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
        assert np.linalg.norm(x - x_first) <= 1e-10 * np.linalg.norm(x_first)


def _solved_queued_then_fetched(monkeypatch, A, b, decided):
    """``QRFactorization(A, backend='gpu').solve(b)`` twice: with ``Qᵀb`` queued on the
    device for the rank decision, then (``_device_rhs`` patched away for the rest of the
    test) fetched to the host first. Per arm ``(x, rank, replays)``, ``replays`` saying
    for each replay of ``Qᵀ`` whether its operand was on the device; ``decided(F)``
    checks each factorization's rank decision before it is freed."""
    import cupy
    from scipy_gpuqr._factor.factored import FactoredQR
    runs = []
    for arm in ("queued", "fetched first"):
        if arm != "queued":
            monkeypatch.setattr(FactoredQR, "_device_rhs", lambda self, B, given: None)
        F = QRFactorization(A, backend="gpu")
        replays = []
        real_qt = F._core.num.qt_matmul
        F._core.num.qt_matmul = lambda B, real=real_qt: (
            replays.append(isinstance(B, cupy.ndarray)) or real(B))
        x = F.solve(b)
        decided(F)
        runs.append((x, int(F.rank), replays))
        F.free()
    return runs


def test_nullspace_cod_reads_the_queued_qtb_on_the_device(monkeypatch, rng):
    """GPU factors on the device whole: ``Qᵀb`` is queued on the device for the
    decision (``rhs_device``),
    read there by its solve with ``R⁻¹``, fetched to the host once, and the
    least-squares solve takes its columns (one replay of ``Qᵀ`` per call); rank
    and x are lstsq's and those of ``Qᵀb`` fetched first (to rounding: the
    solves' level kernels add with atomics)."""
    import cupy
    from scipy_gpuqr._factor.factored import FactoredQR
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 1000)
    monkeypatch.setattr(_lstsq, "DenseCOD", None)        # must not be reached
    queued, fetched = [], []
    real_queue, real_rows = FactoredQR._qt_rows_device, FactoredQR._qt_rows

    def queue(self, B):
        C = real_queue(self, B)
        queued.append(isinstance(C, cupy.ndarray))
        return C

    def rows(self, B):
        fetched.append(getattr(self, "_qtb_queued", None) is not None)
        return real_rows(self, B)
    monkeypatch.setattr(FactoredQR, "_qt_rows_device", queue)
    monkeypatch.setattr(FactoredQR, "_qt_rows", rows)
    A = chessboard_boundary(5, 7, 3)                      # 4200×2100, rank 1714
    b = rng.standard_normal(A.shape[0])
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    def decided(F):
        assert F._core.rank_decision().method == "nullspace_cod" and F.rank == 1714
    (x, _, on_device), (x_first, _, on_host) = _solved_queued_then_fetched(
        monkeypatch, A, b, decided)
    assert queued == [True] and fetched[0] is True
    # b's Qᵀ replayed once either way (queued on the device, or on the host's b); the
    # refinement's own residuals (if any) on the host
    assert on_device[0] is True and on_host[0] is False
    assert not any(on_device[1:] + on_host[1:])
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
    assert np.linalg.norm(x - x_first) <= 1e-10 * np.linalg.norm(x_first)
    x2 = lsqr(A, b, backend="gpu")[0]
    assert np.linalg.norm(x2 - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


@pytest.mark.parametrize("case", ["ch6-7-3", "qap10T"])
def test_queued_decision_equals_the_synchronous_steps(monkeypatch, rng, case):
    """The decision queued beside ``Qᵀb``'s replay (``rhs_device``: the device steps up
    to V_d's first CholeskyQR pass on the side stream before the replay, the checks
    read after it; ``lsqr``'s and ``QRFactorization.solve``'s) on a
    chessboard and a QAP linearization's transpose (ch- and lp-class): the same
    rank as the synchronous steps (``Qᵀb`` fetched first), x within 1e-10 of theirs
    and within 1e-9 of lstsq's, b's ``Qᵀ`` replayed once, no Householder."""
    import cupy
    from scipy_gpuqr._testing_matrices import qap_linearization
    householder = _nullspace_decisions_counting_householder(monkeypatch)
    A = (chessboard_boundary(6, 7, 3) if case == "ch6-7-3"       # 12600×4200
         else sp.csc_array(qap_linearization(10).T))             # 4150×1820
    b = rng.standard_normal(A.shape[0])
    x2 = lsqr(A, b, backend="gpu")[0]                      # queued too
    def decided(F):
        solver = F._core.rank_decision()
        assert solver.method == "nullspace_cod" and solver.cod_device == "gpu"
        assert isinstance(solver._cod._v, cupy.ndarray)
    (x, rank, replays), (x_first, rank_first, _) = _solved_queued_then_fetched(
        monkeypatch, A, b, decided)
    # b's Qᵀ replayed once, queued on the device (the refinement's residuals, if any,
    # on the host)
    assert rank == rank_first and replays[0] is True and not any(replays[1:])
    assert not householder
    assert np.linalg.norm(x - x_first) <= 1e-10 * np.linalg.norm(x_first)
    if A.shape[1] <= 2000:
        x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
        assert rank == np.linalg.matrix_rank(A.toarray())
        assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)
    assert np.linalg.norm(x2 - x_first) <= 1e-10 * np.linalg.norm(x_first)


def test_queued_thin_qr_on_the_device(monkeypatch, rng):
    """``orth_queued`` on the device, nothing read back before ``result()``: ``orth``'s
    Q and R to the bit with both passes queued where ``orth`` takes two (condition
    1e4, 1e6) and with the second left to ``result()`` wherever (condition 1 too);
    Householder's, as ``orth``'s, for a block CholeskyQR2 cannot factor accurately
    (condition 1e13)."""
    import cupy
    from scipy_gpuqr._factor import solve_rank as sr
    blocks = sr._DeviceBlocks(cupy)
    q, d = 6000, 400
    U, _ = np.linalg.qr(rng.standard_normal((q, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    real = sr.array_ops.thin_qr
    for decades in (0, 4, 6, 13):
        Xd = cupy.asarray(np.ascontiguousarray((U * np.logspace(0, -decades, d)) @ V.T))
        X0 = Xd.get()
        Q, R = blocks.orth(Xd)
        for both in ((False, True) if decades else (False,)):
            calls = []
            monkeypatch.setattr(sr.array_ops, "thin_qr",
                                lambda *a, **k: calls.append(1) or real(*a, **k))
            Qg, Rg = blocks.orth_queued(Xd, blocks.unit_vectors(d), both=both).result()
            assert bool(calls) == (decades == 13)
            assert np.array_equal(Xd.get(), X0)
            assert np.array_equal(Qg.get(), Q.get()) and np.array_equal(Rg.get(), R.get())


def test_nullspace_cod_blocks_on_the_host_when_the_device_is_full(monkeypatch, rng):
    """The device's q × d blocks do not fit (an out-of-memory forced): the blocks
    stay on the host, the solves still run on the device, rank and minimum-norm
    solution are lstsq's (no dense COD)."""
    import cupy
    tried = nullspace_blocks_fail_on(monkeypatch, cupy)
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 1000)
    monkeypatch.setattr(_lstsq, "DenseCOD", None)        # must not be reached
    A = chessboard_boundary(5, 7, 3)                      # 4200×2100, rank 1714
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    solver = F._core.rank_decision()
    assert tried == [cupy, np]
    assert solver.method == "nullspace_cod" and solver.cod_device == "gpu"
    assert isinstance(solver._cod._v, np.ndarray)
    assert F.rank == 1714
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


@pytest.mark.parametrize("b_on_device", [False, True])
def test_fused_probe_and_least_squares_solve(b_on_device, monkeypatch):
    """Full rank on the device (q beyond SOLVE_RANK_MIN_ORDER): the least-squares
    solve ``R⁻¹Qᵀb`` and the rank probe's first step are one solve with R of
    1 + PROBE_COLUMNS columns, one solve fewer than the probe alone; x and the
    decision equal the unfused path's, for a host b and a CuPy b."""
    import cupy as cp
    from scipy_gpuqr._engine.gpu import solve as gsolve
    from scipy_gpuqr._factor import factored
    from scipy_gpuqr._factor.solve_rank import PROBE_COLUMNS
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    A = grid3d_least_squares(16)
    assert A.shape[1] >= _lstsq.SOLVE_RANK_MIN_ORDER
    b = np.cos(np.arange(A.shape[0], dtype=np.float64)) + A @ np.ones(A.shape[1])
    calls = []
    triangular = gsolve.DeviceSolve._triangular

    def counted(self, C, transposed):
        calls.append((transposed, C.shape[1]))
        return triangular(self, C, transposed)
    monkeypatch.setattr(gsolve.DeviceSolve, "_triangular", counted)

    def run():
        del calls[:]
        bb = cp.asarray(b) if b_on_device else b
        out = lsqr(sp.csc_array(A), bb, backend="gpu")
        x = cp.asnumpy(out[0]) if b_on_device else out[0]
        return x, out[1], list(calls)
    x_fused, istop_fused, fused = run()
    monkeypatch.setattr(factored.FactoredQR, "_fused_probe_solve", lambda self, B: None)
    x_alone, istop_alone, alone = run()
    assert fused[0] == (False, 1 + PROBE_COLUMNS)
    assert len(fused) == len(alone) - 1
    assert istop_fused == istop_alone
    np.testing.assert_allclose(x_fused, x_alone, rtol=1e-12, atol=1e-12 * np.abs(x_alone).max())
    x_ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x_fused - x_ref) <= 1e-10 * np.linalg.norm(x_ref)
