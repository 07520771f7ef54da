"""The full-rank test after a failed probe, and R's dense host solves (issue 16, item 3).

Beyond DENSE_LIMIT on the host, :class:`scipy_gpuqr._factor.lstsq.MinNormSolver`
tests a failed probe's ν again with σ_max by Lanczos: full rank where
``M·ν·cutoff·σ_max < 1``; where ``1/ν`` (never below σ_min) lies within the σ
test's margin of the cutoff, neither the 1-norm nor the σ_min estimate runs
and the rank-deficiency rules decide (the subspace decision, which also finds
full rank just above the cutoff). A densely stored R is solved with BLAS on
one dense copy (:class:`scipy_gpuqr._factor.dense_upper.DenseUpper`).
Checked against numpy.linalg.lstsq on dense matrices generated here, with
DENSE_LIMIT and SOLVE_RANK_MIN_ORDER lowered so that small problems take the
large-R rules.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import QRFactorization, lsqr
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._dispatch.plan import backend_factorizer
from scipy_gpuqr._factor.dense_upper import DenseUpper, stored_densely
from scipy_gpuqr._factor.factored import _cod_factorizer
from scipy_gpuqr._factor.solve_rank import probe_margin
from scipy_gpuqr._factor.subspace_cod import sigma_max_lanczos
from scipy_gpuqr._factor.triangular import UpperTriangular

from conftest import stand_in_device

EPS = np.finfo(np.float64).eps


def _graded(rng, m, n, low):
    """Dense m × n A with singular values geometric from 1 down to ``low``, random
    singular vectors (no gap anywhere)."""
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (U * np.logspace(0, np.log10(low), n)) @ V.T


def _large_rules(monkeypatch, probe_first=True):
    """600 columns take the rules of R beyond DENSE_LIMIT (and, with
    ``probe_first``, from SOLVE_RANK_MIN_ORDER: the probe before the 1-norm test)."""
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 200)
    monkeypatch.setattr(_lstsq, "SOLVE_RANK_MIN_ORDER", 300 if probe_first else 10_000)


def _spy(monkeypatch, name):
    calls = []
    original = getattr(_lstsq, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(_lstsq, name, spy)
    return calls


def _berr(A, x, b, smax):
    r = b - A @ x
    return np.linalg.norm(A.T @ r) / (smax * np.linalg.norm(r))



def _decide(monkeypatch, A, b):
    """``(F, x, decision, σ_min calls, 1-norm estimate calls)`` of a CPU
    ``QRFactorization`` of dense ``A`` solving ``b``, the two estimates spied on."""
    sigma_calls = _spy(monkeypatch, "sigma_min_upper")
    rcond_calls = _spy(monkeypatch, "_rcond_estimate")
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    x = F.solve(b)
    return F, x, F.info["rank_decision"], sigma_calls, rcond_calls

@pytest.mark.parametrize("probe_first", [True, False])
def test_gapless_skips_the_sigma_tests_and_matches_lstsq(rng, monkeypatch, probe_first):
    """Rank-deficient without a gap (σ_min about half the cutoff): the failed probe's
    1/ν lies within the σ test's margin of the cutoff, so neither σ_min nor (after
    a probe that ran first) the 1-norm estimate is computed; the subspace decision
    answers with lstsq's rank, its ‖x‖ and a backward error no worse than 10× its."""
    _large_rules(monkeypatch, probe_first)
    m, n = 800, 600
    cut = EPS * m
    # 12 of the 600 values below the cutoff, the nearest half a step (1.3 %) from it
    A = _graded(rng, m, n, cut ** (599 / 587.5))
    b = rng.standard_normal(m)
    F, x, dec, sigma_calls, rcond_calls = _decide(monkeypatch, A, b)
    assert dec["method"] == "subspace_cod" and dec["rank_revealed"], dec
    assert not sigma_calls
    assert len(rcond_calls) == (0 if probe_first else 1)
    assert isinstance(F._core.rank_decision()._rtri, DenseUpper)
    x_ref, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
    assert np.min(np.abs(s - cut * s[0])) > 10 * EPS * s[0]      # no value at the cutoff
    assert F.rank == rank < n
    assert abs(np.linalg.norm(x) / np.linalg.norm(x_ref) - 1) <= 1e-3
    assert _berr(A, x, b, s[0]) <= 10 * _berr(A, x_ref, b, s[0])
    y = lsqr(sp.csc_array(A), b, backend="cpu")[0]
    assert np.linalg.norm(y - x) <= 1e-8 * np.linalg.norm(x)


def test_full_rank_ill_conditioned_confirmed_by_the_probe_and_sigma_max(rng, monkeypatch):
    """σ_min = 6 × the cutoff: the probe's test with ‖R‖_F fails (‖R‖_F ≈ 3.4 σ_max),
    the same ν with σ_max by Lanczos confirms full rank; no 1-norm or σ_min
    estimate; the answer is R⁻¹'s, lstsq's to the problem's conditioning."""
    _large_rules(monkeypatch)
    m, n = 800, 600
    cut = EPS * m
    A = _graded(rng, m, n, 6 * cut)
    b = rng.standard_normal(m)
    F, x, dec, sigma_calls, rcond_calls = _decide(monkeypatch, A, b)
    assert dec["method"] == "triangular" and F.rank == n, dec
    assert not sigma_calls and not rcond_calls
    R = sp.csc_array(F.R)
    smax = sigma_max_lanczos(R)
    M = probe_margin(n, 3)
    # the probe's own test failed, the one with σ_max passed: 1/ν between the two
    assert M * cut * smax < dec["sigma_min"] <= M * cut * np.sqrt((R.data ** 2).sum())
    s = np.linalg.svd(A, compute_uv=False)
    assert s[-1] * (1 - 1e-8) <= dec["sigma_min"] <= M * s[-1]   # 1/ν: σ_min to M
    assert dec["sigma_max"] == pytest.approx(s[0], rel=1e-12)
    x_ref, _, rank, _ = np.linalg.lstsq(A, b, rcond=None)
    assert rank == n
    # cond 2.5e11: x to the problem's sensitivity, the backward error no worse
    assert abs(np.linalg.norm(x) / np.linalg.norm(x_ref) - 1) <= 1e-4
    assert _berr(A, x, b, s[0]) <= 10 * _berr(A, x_ref, b, s[0])


@pytest.mark.parametrize("above", [1.3, 2.5])
def test_full_rank_just_above_the_cutoff_decided_by_the_subspace(rng, monkeypatch, above):
    """σ_min = 1.3 or 2.5 × the cutoff: 1/ν within the σ test's margin 4 (that test could
    not confirm either), so the subspace decision answers: full rank, lstsq's x."""
    _large_rules(monkeypatch)
    m, n = 800, 600
    cut = EPS * m
    A = _graded(rng, m, n, above * cut)
    b = rng.standard_normal(m)
    sigma_calls = _spy(monkeypatch, "sigma_min_upper")
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    x = F.solve(b)
    dec = F.info["rank_decision"]
    assert not sigma_calls
    assert dec["method"] == "subspace_cod" and F.rank == n, dec
    x_ref, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
    assert rank == n
    # the converged Ritz value: σ_min of R, within eps·‖A‖ (1e-3 of it here) of A's
    assert dec["sigma_min"] == pytest.approx(s[-1], rel=1e-2)
    assert abs(np.linalg.norm(x) / np.linalg.norm(x_ref) - 1) <= 1e-4
    assert _berr(A, x, b, s[0]) <= 10 * _berr(A, x_ref, b, s[0])


def test_sigma_test_still_decides_between_its_margin_and_the_probes(rng, monkeypatch):
    """Where 1/ν lies above the σ test's margin but the probe's margin M (with σ_max)
    still fails, the σ_min estimate runs as before and confirms full rank.

    Forced: a probe returning ν = 1/(4.5·tol) with margin 5 (so M·ν·tol > 1 and
    1/ν > 4·tol), on an R whose σ_min is 10 × the cutoff."""
    _large_rules(monkeypatch)
    m, n = 800, 600
    cut = EPS * m
    A = _graded(rng, m, n, 10 * cut)
    R0 = sp.csc_array(QRFactorization(sp.csc_array(A), backend="cpu").R)
    tol = cut * sigma_max_lanczos(R0)
    monkeypatch.setattr(_lstsq, "probe_norm", lambda *a, **k: (1 / (4.5 * tol), 5.0))
    sigma_calls = _spy(monkeypatch, "sigma_min_upper")
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    F.solve(np.ones(m))
    dec = F.info["rank_decision"]
    assert sigma_calls and dec["method"] == "triangular" and F.rank == n
    s = np.linalg.svd(A, compute_uv=False)
    # σ_min as the σ test found it: here the bound 1/‖R⁻¹‖_F (at most √q below)
    assert s[-1] / np.sqrt(n) * (1 - 1e-2) <= dec["sigma_min"] <= s[-1] * 1.01


def test_dense_upper_is_upper_triangular(rng):
    """BLAS on the dense copy: UpperTriangular's solves and sigma_max_lanczos's σ_max."""
    q = 300
    T = np.triu(rng.standard_normal((q, q))) / np.sqrt(q) + 2 * np.eye(q)
    R = sp.csc_array(T)
    assert stored_densely(R) and not stored_densely(sp.csc_array(np.diag(np.diag(T))))
    D, S = DenseUpper(R), UpperTriangular(R)
    C = rng.standard_normal((q, 5))
    for trans in (False, True):
        assert np.allclose(D.solve(C, trans=trans), S.solve(C, trans=trans), rtol=1e-12,
                           atol=0)
    up, upt = D.solves()
    assert np.allclose(T @ up(C), C) and np.allclose(T.T @ upt(C), C)
    assert D.solve(C[:, 0]).shape == (q, 1)
    assert D.sigma_max() == pytest.approx(sigma_max_lanczos(R), rel=1e-12)
    assert D.sigma_max() == pytest.approx(np.linalg.norm(T, 2), rel=1e-12)


def test_host_upper_dense_only_beyond_dense_limit(rng, monkeypatch):
    """The solver's host solves: BLAS for a densely stored R beyond DENSE_LIMIT,
    SuperLU's sweeps for a sparse one or a small one."""
    q = 300
    T = sp.csc_array(np.triu(rng.standard_normal((q, q))) / np.sqrt(q) + 2 * np.eye(q))
    S = sp.csc_array(sp.diags(rng.uniform(1, 2, q)) + sp.random_array(
        (q, q), density=0.01, rng=rng)).tocsc()
    S = sp.csc_array(sp.triu(S))
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 200)
    assert isinstance(_lstsq.MinNormSolver(T, EPS * q)._host_upper(), DenseUpper)
    assert isinstance(_lstsq.MinNormSolver(S, EPS * q)._host_upper(), UpperTriangular)
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 400)
    assert isinstance(_lstsq.MinNormSolver(T, EPS * q)._host_upper(), UpperTriangular)


def test_a_given_diagonal_spares_the_decisions_own_pass(monkeypatch):
    """MinNormSolver takes |diag(R)| from its caller (the fused probe solve took it)
    instead of gathering it again; a diagonal of the wrong length is not used."""
    import scipy.sparse as sp

    from scipy_gpuqr._factor import lstsq
    rng = np.random.default_rng(3)
    R = sp.csc_array(np.triu(rng.standard_normal((60, 60))) + 10 * np.eye(60))
    d = np.abs(R.diagonal())
    want = lstsq.MinNormSolver(R, 1e-12)
    calls = []
    real = lstsq.abs_diagonal
    monkeypatch.setattr(lstsq, "abs_diagonal", lambda M: calls.append(1) or real(M))
    got = lstsq.MinNormSolver(R, 1e-12, diagonal=d)
    assert calls == [] and (got.method, got.rank) == (want.method, want.rank) == ("triangular", 60)
    lstsq.MinNormSolver(R, 1e-12, diagonal=d[:-1])
    assert calls == [1]


# ---------------------------------------------------------------------------
# the null-space COD on the host from NULLSPACE_HOST_MIN_ORDER (issue 15)

def _dead_pivot_factor(rng, q, dead, tiny=1e-17):
    """Upper triangular sparse R of order q whose last ``dead`` columns are exact
    combinations of the others up to ``tiny``: R's pivots there are ``tiny`` (a clean
    gap: the other singular values lie far above lstsq's cutoff)."""
    A = rng.standard_normal((q, q - dead))
    A = np.hstack([A, A[:, :dead] @ rng.standard_normal((dead, dead))
                   + tiny * rng.standard_normal((q, dead))])
    R = np.triu(np.linalg.qr(A, mode="r"))
    return sp.csc_array(np.where(np.abs(R) > 1e-12 * np.abs(R).max(), R, 0.0)
                        + np.diag(np.where(np.arange(q) >= q - dead, np.diag(R), 0.0)))


def test_nullspace_candidate_reads_the_pivots(rng):
    """A few pivots under ``cutoff·max|r_ii|`` and none between that and
    ``cutoff·‖R‖_F``, order at least NULLSPACE_HOST_MIN_ORDER, a finite nonzero
    diagonal: a candidate; otherwise not."""
    q = _lstsq.NULLSPACE_HOST_MIN_ORDER
    cutoff = EPS * q
    R = _dead_pivot_factor(rng, q, 3)
    assert _lstsq.nullspace_candidate(R, cutoff)
    small = _dead_pivot_factor(rng, q - 100, 3)
    assert not _lstsq.nullspace_candidate(small, cutoff)
    d = np.abs(R.diagonal())
    full = R + sp.diags_array(np.where(d < 1e-8, 1.0, 0.0))
    assert not _lstsq.nullspace_candidate(sp.csc_array(full), cutoff)     # no dead pivot
    zero = R.tolil()
    zero[q - 1, q - 1] = 0.0
    assert not _lstsq.nullspace_candidate(sp.csc_array(zero), cutoff)     # a zero pivot
    # a pivot between the cutoff's bounds: where σ_max lies would decide
    between = R.tolil()
    lo, hi = cutoff * d.max(), cutoff * np.sqrt((R.data ** 2).sum())
    assert hi > 1.5 * lo
    between[0, 0] = np.sign(between[0, 0]) * 0.5 * (lo + hi) if between[0, 0] else 0.5 * (lo + hi)
    assert not _lstsq.nullspace_candidate(sp.csc_array(between), cutoff)


def test_host_nullspace_cod_decides_from_its_order(rng):
    """A square R with a few dead pivots and a clean gap is decided on the host by the
    null-space COD from NULLSPACE_HOST_MIN_ORDER (before: the gap-checked sparse COD's
    two sparse QRs and a dense inverse of R11), with lstsq's rank and solution; below
    the order the other rules decide, with the same rank."""
    for q, method in ((_lstsq.NULLSPACE_HOST_MIN_ORDER, "nullspace_cod"), (300, None)):
        R = _dead_pivot_factor(rng, q, 4)
        cutoff = EPS * q
        Rd = R.toarray()
        b = rng.standard_normal(q)
        x_ref, _, rank_ref, _ = np.linalg.lstsq(Rd, b, rcond=None)
        solver = _lstsq.MinNormSolver(R, cutoff, factorize=_cod_factorizer(
            backend_factorizer("cpu")[0]))
        assert solver.rank == rank_ref == q - 4
        assert (solver.method == method) if method else solver.method != "nullspace_cod"
        x = solver.solve(b).ravel()
        assert np.linalg.norm(x - x_ref) <= 1e-9 * np.linalg.norm(x_ref)


def test_lsqr_cpu_takes_the_nullspace_cod_on_dwt_878():
    """dwt_878 (rank 850 of 878 by lstsq's rule, a clean gap): SuiteSparseQR's R shows 28
    dead pivots and the host's null-space COD decides, with lstsq's rank; the answer's
    backward error is at working precision and x is lstsq's."""
    from conftest import TEST_MATRICES
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(TEST_MATRICES / "dwt_878.mtx"))).astype(np.float64)
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    F = QRFactorization(A, backend="cpu")
    assert _lstsq.nullspace_candidate(F.R, _lstsq.lstsq_cutoff(*A.shape))
    x = F.solve(b)
    info = F.info["rank_decision"]
    assert (info["method"], info["rank"]) == ("nullspace_cod", 850), info
    x_ref, _, rank_ref, _ = np.linalg.lstsq(A.toarray(), b, rcond=None)
    assert rank_ref == 850
    assert np.linalg.norm(x - x_ref) <= 1e-10 * np.linalg.norm(x_ref)
    # the normal equations' residual within a small multiple of LAPACK's lstsq on the
    # same host: a fixed multiple of eps does not carry from host to host (64 eps held
    # on earlier CI hosts; on an AVX-512 one, 218 eps against lstsq's own 47, with x
    # within 1e-10 of lstsq's, whatever OpenBLAS core type is forced)
    r, r_ref = b - A @ x, b - A @ x_ref
    assert np.linalg.norm(A.T @ r) <= max(64 * EPS * sp.linalg.norm(A) * np.linalg.norm(r),
                                          16 * np.linalg.norm(A.T @ r_ref))


# ---------------------------------------------------------------------------
# a small R of full rank by the 1-norm test: the BLAS pools are not lowered

def _count_lowerings(monkeypatch, lowered: list) -> None:
    """Record each body of the decision that lowers the process' BLAS pools
    (``process_limited`` with a thread count)."""
    real = _lstsq.process_limited

    def counting(threads, *args, **kwargs):
        if threads is not None:
            lowered.append(threads)
        return real(threads, *args, **kwargs)
    monkeypatch.setattr(_lstsq, "process_limited", counting)


def test_small_full_rank_decision_does_not_lower_the_pools(rng, monkeypatch):
    """Where LAPACK's 1-norm estimate on R made dense settles full rank (order up to
    DENSE_LIMIT, solves on the host), R⁻¹ answers through SuperLU's sweeps: the process'
    OpenBLAS pools are not lowered, in the decision or its solves, and x is bit for bit
    the one decided with the pools lowered. A deficient R, and the GPU's dense σ test
    from SVD_GPU_MIN_ORDER, still lower them (to one thread)."""
    lowered = []
    _count_lowerings(monkeypatch, lowered)
    q = 200
    R = sp.csc_array(np.triu(rng.standard_normal((q, q))) + 20 * np.eye(q))
    b = rng.standard_normal(q)
    solver = _lstsq.MinNormSolver(R, EPS * q)
    x = solver.solve(b)
    assert (solver.method, solver.rank) == ("triangular", q) and lowered == []
    assert solver.rcond >= 10 * q * EPS * q
    monkeypatch.setattr(_lstsq.MinNormSolver, "_full_rank_unlimited", lambda self: False)
    limited = _lstsq.MinNormSolver(R, EPS * q)
    assert np.array_equal(limited.solve(b), x) and limited.rcond == solver.rcond
    assert lowered and set(lowered) == {1}
    monkeypatch.undo()
    lowered.clear()
    _count_lowerings(monkeypatch, lowered)
    deficient = sp.csc_array(np.diag(np.r_[np.ones(q - 1), 1e-20]))
    assert _lstsq.MinNormSolver(deficient, EPS * q).rank == q - 1 and set(lowered) == {1}
    lowered.clear()
    big = _lstsq.SVD_GPU_MIN_ORDER
    Rg = sp.csc_array(np.triu(rng.standard_normal((big, big))) + 40 * np.eye(big))
    assert _lstsq.MinNormSolver(Rg, EPS * big, dense_device="gpu").rank == big
    assert set(lowered) == {1}


# ---------------------------------------------------------------------------
# the gap check's σ_min(R11) where the dense refinements run on the GPU

def _banded_gap_case():
    """``(n, dead, R, c, cutoff)``: SuiteSparseQR's R of a banded 400² matrix with 5
    dependent columns (a clean gap at the cutoff), a right-hand side for R's solves."""
    from conftest import banded_deficient
    n, dead = 400, 5
    A = banded_deficient(n, dead, 3)
    b = np.random.default_rng(1).standard_normal(n)
    R = sp.csc_array(backend_factorizer("cpu")[0](A, tol=None).R)
    return n, dead, R, b[:R.shape[0]], EPS * n


def _gap_checked(R, cutoff, **kwargs):
    return _lstsq.MinNormSolver(R, cutoff, factorize=_cod_factorizer(
        backend_factorizer("cpu")[0]), **kwargs)


def test_gap_check_sigma_min_goes_where_the_dense_work_runs(monkeypatch):
    """With ``dense_device='gpu'`` and R11 of at least SVD_GPU_MIN_ORDER columns the
    gap-checked COD's σ_min(R11) is tested on the device (here a stand-in: NumPy in
    CuPy's place), on R11 made dense there, where the host's compiled sweeps would not
    answer for less (here: the device's predicted seconds set to 0); the decision and x
    are the host's, bit for bit (the COD's factors do not depend on where σ was tested).
    A smaller R11, or the host's dense work, keep the host's test."""
    n, dead, R, c, cutoff = _banded_gap_case()
    host = _gap_checked(R, cutoff)
    assert host.method == "cod" and host.rank == n - dead
    x_host = host.solve(c)
    made = []
    real_dense = _lstsq.dense_from_sparse

    def dense(T, xp):
        made.append((T.shape[0], xp))
        return real_dense(T, xp)
    monkeypatch.setattr(_lstsq, "dense_from_sparse", dense)
    monkeypatch.setattr(_lstsq._gpu, "gpu_available", lambda: True)
    monkeypatch.setattr(_lstsq._gpu, "import_cupy", lambda: np)
    monkeypatch.setattr(_lstsq, "SVD_GPU_MIN_ORDER", 100)
    monkeypatch.setattr(_lstsq, "DEVICE_SIGMA_S", 0.0)
    monkeypatch.setattr(_lstsq, "DEVICE_DENSE_FIRST_USE_S", 0.0)
    device = _gap_checked(R, cutoff, dense_device="gpu")
    assert made == [(n - dead, np)]
    assert (device.method, device.rank) == ("cod", n - dead)
    assert np.array_equal(device.solve(c), x_host)
    made.clear()
    monkeypatch.setattr(_lstsq, "SVD_GPU_MIN_ORDER", n)              # R11 below it
    assert _gap_checked(R, cutoff, dense_device="gpu").method == "cod" and made == []
    assert _gap_checked(R, cutoff, dense_device="cpu").method == "cod" and made == []


def test_gap_check_sigma_min_stays_on_the_host_where_its_sweeps_cost_less(monkeypatch):
    """A GPU for the dense work, but R11 sparse and small enough that the host's compiled
    sweeps cost less than the device's σ test with its dense libraries' first use
    (:func:`host_sigma_pays`; a factorization on the host set nothing up): σ_min(R11) on
    the host, the same decision and x. Where the factorization ran on the GPU (its
    libraries set up) a triangle whose sweeps cost more than the device's test goes
    there; without the compiled sweeps the device answers as before."""
    from scipy_gpuqr._factor import native
    if not native.at_hand():
        pytest.skip("the compiled sweeps are not at hand")
    n, dead, R, c, cutoff = _banded_gap_case()
    x_host = _gap_checked(R, cutoff).solve(c)
    made = stand_in_device(monkeypatch, min_order=100)
    host = _gap_checked(R, cutoff, dense_device="gpu")
    assert made == [] and (host.method, host.rank) == ("cod", n - dead)
    assert np.array_equal(host.solve(c), x_host)
    # the compiled sweeps' predicted seconds above the device's set-up test only
    monkeypatch.setattr(_lstsq, "DEVICE_DENSE_FIRST_USE_S", 1.0)
    monkeypatch.setattr(_lstsq, "DEVICE_SIGMA_S", 0.0)
    assert _gap_checked(R, cutoff, dense_device="gpu").method == "cod" and made == []
    gpu = _gap_checked(R, cutoff, dense_device="gpu", device="gpu")
    assert made == [n - dead] and (gpu.method, gpu.rank) == ("cod", n - dead)
    made.clear()
    monkeypatch.setattr(_lstsq, "compiled_sigma_applies", lambda T: False)
    monkeypatch.setattr(_lstsq, "DEVICE_DENSE_FIRST_USE_S", 0.1)
    monkeypatch.setattr(_lstsq, "DEVICE_SIGMA_S", 0.005)
    assert _gap_checked(R, cutoff, dense_device="gpu").method == "cod" and made == [n - dead]


def test_host_sigma_pays_by_predicted_seconds():
    """The host's compiled sweeps where their predicted seconds are at most the
    device's (its first use counted unless the factorization set it up), never beyond
    their fill; the GPU host's adder_dcop_05 R11 (q 1788, 19 323 entries) on the host."""
    from scipy_gpuqr._factor.triangular import COMPILED_SIGMA_MAX_FILL, compiled_sigma_seconds
    assert _lstsq.host_sigma_pays(1788, 19323, device_set_up=False)
    assert compiled_sigma_seconds(1788, 19323) > _lstsq.DEVICE_SIGMA_S
    assert not _lstsq.host_sigma_pays(1788, 19323, device_set_up=True)
    assert _lstsq.host_sigma_pays(600, 2000, device_set_up=True)
    q = 2500
    assert not _lstsq.host_sigma_pays(q, COMPILED_SIGMA_MAX_FILL * q * q * 1.01,
                                      device_set_up=False)
    assert not _lstsq.host_sigma_pays(q, 0.02 * q * q, device_set_up=False)
    assert not _lstsq.host_sigma_pays(0, 0, device_set_up=False)


def _shared_r(matrices_dir, name):
    """A shared matrix ``name`` in float64, SuiteSparseQR's R of it (no column
    dropped) and that factorizer (the test skipped where SuiteSparseQR is absent)."""
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices_dir / name))).astype(np.float64)
    factorize, ran, _ = backend_factorizer("cpu")
    if ran != "cpu":
        pytest.skip("SuiteSparseQR not available")
    return A, sp.csc_array(factorize(A, tol=None).R), factorize


def test_device_full_rank_test_probes_first_on_adder_dcop_05(matrices_dir, monkeypatch):
    """adder_dcop_05's R passes the diagonal's cheap test (every pivot above the cutoff
    times the largest) but has 25 singular values under the cutoff. With the dense work
    on the device and R's solves on the host, the probe through those solves comes
    first, as on the host: its ν with σ_max (the host's Lanczos, which the gap check
    reads next) shows the σ test cannot pass, so no dense copy of all of R goes to the
    device and σ_max is computed once. The device then tests R11 alone where its test is
    predicted cheaper than R11's compiled sweeps (here: its dense libraries' first use
    not counted); σ_max, the decision and x are the host's, bit for bit; σ_min(R11) up to
    rounding (the host's comes from R11's compiled sparse sweeps, the device's from its
    dense inverse). Counting that first use (R factorized on the host), R11's sweeps
    answer on the host: nothing goes to the device, σ_min bit for bit the host's."""
    A, R, factorize = _shared_r(matrices_dir, "adder_dcop_05.mtx")
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    d = np.abs(R.diagonal())
    assert d.min() > cutoff * d.max()                   # the full-rank test runs
    c = np.random.default_rng(3).standard_normal(R.shape[0])
    host = _gap_checked(R, cutoff)
    smax_calls = _spy(monkeypatch, "sigma_max_lanczos")
    lanczos_calls = _spy(monkeypatch, "norm2_lanczos")
    made = stand_in_device(monkeypatch)
    kept = _gap_checked(R, cutoff, dense_device="gpu")
    assert made == [] and not lanczos_calls and len(smax_calls) == 1
    assert (kept.method, kept.rank, kept.sigma_min) == (host.method, host.rank, host.sigma_min)
    assert np.array_equal(kept.solve(c), host.solve(c))
    smax_calls.clear()
    monkeypatch.setattr(_lstsq, "DEVICE_DENSE_FIRST_USE_S", 0.0)
    device = _gap_checked(R, cutoff, dense_device="gpu")
    assert made == [1788] and not lanczos_calls and len(smax_calls) == 1
    assert (device.method, device.rank) == (host.method, host.rank) == ("cod", 1788)
    assert device.sigma_max == host.sigma_max
    assert device.sigma_min == pytest.approx(host.sigma_min, rel=1e-12)
    assert np.array_equal(device.solve(c), host.solve(c))


def test_device_full_rank_test_probe_confirms(monkeypatch):
    """A full-rank sparse R of condition about 1e9: with the dense work on the device and
    R's solves on the host, the probe through those solves confirms full rank before any
    dense copy or Lanczos; R⁻¹ answers, x bit for bit the host's."""
    n = 300
    rng = np.random.default_rng(5)
    N = sp.triu(0.1 * sp.random_array((n, n), density=0.01, rng=rng), k=1)
    A = (sp.diags(np.logspace(0, -9, n)) @ (sp.eye_array(n) + N)).tocsc()
    R = sp.csc_array(backend_factorizer("cpu")[0](A, tol=None).R)
    cutoff = EPS * n
    host = _gap_checked(R, cutoff)
    made = stand_in_device(monkeypatch, min_order=100)
    smax_calls = _spy(monkeypatch, "sigma_max_lanczos")
    sigma_calls = _spy(monkeypatch, "sigma_min_upper")
    device = _gap_checked(R, cutoff, dense_device="gpu")
    assert device.method == host.method == "triangular" and device.rank == n
    assert made == [] and not smax_calls and not sigma_calls
    b = rng.standard_normal(n)
    assert np.array_equal(device.solve(b), host.solve(b))


def _device_dense_spies(monkeypatch):
    """A stand-in device's dense copies of R (their orders), the calls of σ_max's host
    Lanczos, of Lanczos on a dense R and of the σ_min test, and the σ_max each dense SVD
    (stubbed) read."""
    made = stand_in_device(monkeypatch)
    spies = [_spy(monkeypatch, name)
             for name in ("sigma_max_lanczos", "norm2_lanczos", "sigma_min_upper")]
    svd = []
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_svd",
                        lambda self, G=None: svd.append(self._sigma_max()))
    return (made, *spies, svd)


def test_device_full_rank_test_on_a_dense_r_takes_sigma_max_there_once(matrices_dir,
                                                                       monkeypatch):
    """R too dense for the gap-checked sparse COD (here: its density limit set to 0), its
    diagonal hiding the deficiency (adder_dcop_05): the probe fails, σ_max comes from
    Lanczos on R made dense on the device, once (not the host's sparse Lanczos), and with
    the probe's ν it spares the σ test; the rules after it (R's small singular subspace,
    which refuses: σ_1788 at 1.42 × the cutoff; then the dense SVD, stubbed) read that
    σ_max and that dense copy."""
    A, R, factorize = _shared_r(matrices_dir, "adder_dcop_05.mtx")
    monkeypatch.setattr(_lstsq, "SPARSE_COD_MAX_DENSITY", 0.0)
    made, smax_calls, lanczos_calls, sigma_calls, svd = _device_dense_spies(monkeypatch)
    _gap_checked(R, _lstsq.lstsq_cutoff(*A.shape), dense_device="gpu")
    assert made == [1813] and len(lanczos_calls) == 1   # Lanczos' copy, the rules' after it
    assert not smax_calls and not sigma_calls
    assert svd == [pytest.approx(sigma_max_lanczos(R), rel=1e-12)]


def test_gap_check_keeping_every_column_after_a_failed_probe_tests_no_sigma(matrices_dir,
                                                                           monkeypatch):
    """nnc1374 (66 singular values under the cutoff, none of R's pivots there): the
    probe through R's solves fails with 1/ν within the σ test's margin of the cutoff,
    and the gap check's rank-detecting QR keeps every column, so its R11 has R's
    singular values: no σ_min test runs on it (nor on R); the subspace decision answers
    with lstsq's rank."""
    A, R, factorize = _shared_r(matrices_dir, "nnc1374.mtx")
    sigma_calls = _spy(monkeypatch, "sigma_min_upper")
    ranks = []
    cod = _cod_factorizer(factorize)

    def spy(G, tol=None):
        out = cod(G, tol=tol)
        ranks.append((tol is not None, int(out.rank) if tol is not None else None))
        return out
    solver = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape), factorize=spy)
    assert ranks == [(True, A.shape[1])]                # the gap check kept every column
    assert not sigma_calls
    assert (solver.method, solver.rank) == ("subspace_cod", 1308)


def test_gap_check_keeping_every_column_after_rs_own_sigma_test_failed(matrices_dir,
                                                                       monkeypatch):
    """nnc1374 with R's solves given (a GPU factorization's way: no probe first): the
    σ test of all of R fails; the gap check's QR keeps every column, and its R11 (R's
    singular values, the same threshold) is not tested again."""
    A, R, factorize = _shared_r(matrices_dir, "nnc1374.mtx")
    seen = []
    real = _lstsq.sigma_min_upper

    def spy(T, threshold, **kwargs):
        seen.append(T.shape[0])
        return real(T, threshold, **kwargs)
    monkeypatch.setattr(_lstsq, "sigma_min_upper", spy)
    solver = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape),
                                  factorize=_cod_factorizer(factorize),
                                  solves=UpperTriangular(R).solves())
    assert seen == [A.shape[1]]                         # R's own test, once
    assert solver.rank == 1308


def test_device_solves_given_sigma_max_and_test_on_one_device_copy(matrices_dir, monkeypatch):
    """R's solves given (a GPU factorization) and the dense work on the device: no probe;
    R made dense on the device once, σ_max by Lanczos there and the σ test on that copy;
    the gap check reads that σ_max (no host Lanczos on R) and, its QR keeping every
    column of nnc1374's R, tests nothing again; R's small singular subspace on the same
    device copy then decides (no SVD)."""
    A, R, factorize = _shared_r(matrices_dir, "nnc1374.mtx")
    solves = UpperTriangular(R).solves()
    made, smax_calls, lanczos_calls, sigma_calls, svd = _device_dense_spies(monkeypatch)
    probes = _spy(monkeypatch, "probe_norm")
    solver = _lstsq.MinNormSolver(R, _lstsq.lstsq_cutoff(*A.shape),
                                  factorize=_cod_factorizer(factorize),
                                  solves=solves, dense_device="gpu")
    assert made == [1374]                               # the σ test's copy, read again
    assert len(lanczos_calls) == 1 and len(sigma_calls) == 1
    assert not smax_calls and not probes and not svd
    assert (solver.method, solver.rank) == ("dense_subspace", 1308)
    assert solver.sigma_max == pytest.approx(sigma_max_lanczos(R), rel=1e-12)


@pytest.mark.gpu
def test_gap_check_sigma_min_on_the_gpu_on_adder_dcop_05(matrices_dir, monkeypatch):
    """adder_dcop_05 (order 1813, rank 1788 by lstsq's rule, σ_1788 at 1.42 × the cutoff):
    the gap-checked COD with the dense work on the GPU, where the host's compiled sweeps
    are not predicted cheaper (here: told so), tests σ_min(R11) (order 1788) on a CuPy R11
    and decides as the host does, with the same σ_max (so the same tolerance), x bit for
    bit. Neither tests σ_min of all of R: the probe through R's host solves, with σ_max,
    shows that test cannot pass, on the device as on the host. Left to its prediction, a
    host factorization's R11 of this size is tested on the host's sweeps (the device's
    dense libraries' first use would cost more), with the same decision."""
    pytest.importorskip("cupy")
    from scipy_gpuqr._gpu import gpu_available
    from scipy_gpuqr.io import mmread
    if not gpu_available():
        pytest.skip("no GPU")
    A = sp.csc_array(mmread(str(matrices_dir / "adder_dcop_05.mtx"))).astype(np.float64)
    R = sp.csc_array(backend_factorizer("cpu")[0](A, tol=None).R)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    c = np.random.default_rng(3).standard_normal(R.shape[0])
    seen = []
    real = _lstsq.sigma_min_upper

    def spy(T, threshold, **kwargs):
        seen.append((T.shape[0], type(T).__module__.split(".")[0]))
        return real(T, threshold, **kwargs)
    monkeypatch.setattr(_lstsq, "sigma_min_upper", spy)
    predicted = _gap_checked(R, cutoff, dense_device="gpu")
    assert seen == [(1788, "scipy")]
    with monkeypatch.context() as m:
        m.setattr(_lstsq, "host_sigma_pays", lambda *a, **k: False)
        device = _gap_checked(R, cutoff, dense_device="gpu")
    host = _gap_checked(R, cutoff, dense_device="cpu")
    assert (device.method, device.rank) == (host.method, host.rank) == ("cod", 1788)
    assert (predicted.method, predicted.rank) == ("cod", 1788)
    assert seen == [(1788, "scipy"), (1788, "cupy"), (1788, "scipy")]
    assert device.sigma_max == host.sigma_max == predicted.sigma_max
    assert np.array_equal(device.solve(c), host.solve(c))
    assert np.array_equal(predicted.solve(c), host.solve(c))


def test_device_cod_without_a_gap_hands_a_sparse_r_to_its_subspace(matrices_dir,
                                                                   monkeypatch):
    """Beyond DENSE_LIMIT (here set below nnc1374's order) a sparse R whose dense COD runs
    on the device (a stand-in) and finds no gap at the cutoff (Heath's rule keeps
    nnc1374's hidden deficiency) is decided from its small singular subspace through its
    sparse solves, as the host decides it, not by the device's SVD of all of R: the same
    rank and x, bit for bit. (Where R made dense fits on the device beside the subspace
    decision's blocks, that decision comes first there: said not to fit here.)"""
    A, R, _ = _shared_r(matrices_dir, "nnc1374.mtx")
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    monkeypatch.setattr(_lstsq, "DENSE_LIMIT", 500)
    host = _gap_checked(R, cutoff)
    assert host.method == "subspace_cod"
    made = stand_in_device(monkeypatch)
    monkeypatch.setattr(_lstsq.MinNormSolver, "_dense_cod_device", lambda self: "gpu")
    monkeypatch.setattr(_lstsq, "device_subspace_fits",
                        lambda q, p: False)
    svd = []
    monkeypatch.setattr(_lstsq.MinNormSolver, "_prepare_svd",
                        lambda self, G=None: svd.append(1))
    device = _gap_checked(R, cutoff, dense_device="gpu")
    assert R.shape[0] in made and not svd
    assert (device.method, device.rank) == (host.method, host.rank)
    assert device.cod_device == "cpu"
    c = np.random.default_rng(4).standard_normal(R.shape[0])
    assert np.array_equal(device.solve(c), host.solve(c))
