"""The gap-checked sparse COD skipped where one power step proves it cannot pass (issue 16, item 3).

:func:`scipy_gpuqr._factor.lstsq.sigma_min_ceiling` bounds σ_min of the gap
check's triangle R11 from above (one solve with R11ᵀ and one with R11 on the
compiled sweeps, plus the sweeps' rounding). Where that bound is at most the
cutoff, ``σ_min(R11) > tol`` cannot hold and the check's E block and σ_min
estimate are not computed: the rule that answers next, its rank and x are the
ones it gives without the bound (checked bit for bit against the decision with
the bound switched off). Where the check passes, the bound lies above the cutoff
and changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._dispatch.plan import backend_factorizer
from scipy_gpuqr._factor import lstsq as _lstsq
from scipy_gpuqr._factor import native
from scipy_gpuqr._factor.factored import _cod_factorizer

from conftest import banded_deficient
from test_sparse_subspace import _gapless_sparse

EPS = np.finfo(np.float64).eps

needs_native = pytest.mark.skipif(native.handle() is None,
                                  reason="compiled sweeps not at hand")


def _factorizer():
    factorize, ran, _ = backend_factorizer("cpu")
    if ran != "cpu":
        pytest.skip("SuiteSparseQR not available")
    return factorize


def _decide(R, cutoff, monkeypatch, ceiling: bool):
    """The host's decision on R with the gap check's bound on or off; the
    ceilings computed and the triangles whose σ_min was estimated."""
    seen, estimated = [], []
    real = _lstsq.sigma_min_ceiling
    real_smu = _lstsq.sigma_min_upper

    def spy(T, **kwargs):
        value = real(T, **kwargs) if ceiling else None
        seen.append((T.shape[0], value))
        return value

    def smu(T, threshold, **kwargs):
        estimated.append(T.shape[0])
        return real_smu(T, threshold, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(_lstsq, "sigma_min_ceiling", spy)
        m.setattr(_lstsq, "sigma_min_upper", smu)
        solver = _lstsq.MinNormSolver(R, cutoff, factorize=_cod_factorizer(_factorizer()))
    return solver, seen, estimated


@needs_native
def test_ceiling_bounds_sigma_min(rng):
    """At or above σ_min (dense SVD) on triangles from well conditioned to a few
    singular values far below the rest, and within a few × σ_min on the latter."""
    factorize = _factorizer()
    R = sp.csc_array(factorize(_gapless_sparse(rng), tol=None).R)
    q = R.shape[0]
    cases = [R, R[:q // 2, :q // 2]]
    well = sp.random(400, 400, density=0.02, random_state=1, format="csc")
    cases.append(sp.csc_array(sp.triu(well) + sp.diags(np.linspace(1, 3, 400))))
    for T in cases:
        T = sp.csc_array(T)
        s = np.linalg.svd(T.toarray(), compute_uv=False)
        c = _lstsq.sigma_min_ceiling(T)
        assert c >= s[-1] * (1 - 1e-12), (c, s[-1])
    s = np.linalg.svd(R.toarray(), compute_uv=False)
    assert _lstsq.sigma_min_ceiling(R) <= 10 * s[-1]


def test_ceiling_absent_where_it_does_not_apply(monkeypatch):
    T = sp.csc_array(sp.diags([1.0, 0.0, 2.0]))                 # a zero pivot
    assert _lstsq.sigma_min_ceiling(T) is None
    assert _lstsq.sigma_min_ceiling(sp.csc_array((0, 0))) is None
    monkeypatch.setattr(_lstsq, "native_handle", lambda: None)
    assert _lstsq.sigma_min_ceiling(sp.csc_array(sp.eye(4))) is None


@needs_native
def test_gap_check_skipped_on_a_gapless_r_same_decision(monkeypatch):
    """Singular values across the cutoff without a gap: the QR's greedy rank keeps
    columns lstsq drops, the bound proves σ_min(R11) under the cutoff, and neither
    E nor σ_min(R11) is computed; the SVD answers with lstsq's rank, x bit for bit
    the decision's without the bound."""
    A = _gapless_sparse(np.random.default_rng(0))
    R = sp.csc_array(_factorizer()(A, tol=None).R)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    on, seen_on, est_on = _decide(R, cutoff, monkeypatch, ceiling=True)
    off, _, est_off = _decide(R, cutoff, monkeypatch, ceiling=False)
    s = np.linalg.svd(R.toarray(), compute_uv=False)
    tol = cutoff * on.sigma_max
    (r11, value), = seen_on
    assert r11 > on.rank and value <= tol
    assert r11 in est_off and r11 not in est_on
    assert (on.method, on.rank) == (off.method, off.rank)
    assert on.rank == int(np.count_nonzero(s > cutoff * s[0]))
    c = np.random.default_rng(2).standard_normal(R.shape[0])
    assert np.array_equal(on.solve(c), off.solve(c))


@needs_native
def test_gap_check_kept_where_it_passes(monkeypatch):
    """Exactly dependent columns (a clear gap): the bound lies far above the cutoff
    and the gap check answers as without it."""
    n, dead = 400, 5
    A = banded_deficient(n, dead, 3)
    R = sp.csc_array(_factorizer()(A, tol=None).R)
    cutoff = EPS * n
    on, seen_on, _ = _decide(R, cutoff, monkeypatch, ceiling=True)
    off, _, _ = _decide(R, cutoff, monkeypatch, ceiling=False)
    assert on.method == off.method == "cod" and on.rank == off.rank == n - dead
    assert seen_on and seen_on[0][1] > 1e6 * cutoff * on.sigma_max
    c = np.random.default_rng(4).standard_normal(R.shape[0])
    assert np.array_equal(on.solve(c), off.solve(c))


@needs_native
def test_gap_check_skipped_on_bayer10_same_rank_and_answer(matrices_dir, monkeypatch):
    """bayer10: the QR keeps 13362 columns, lstsq's rank is 13303 (133 singular values
    under the cutoff, none of them apart); the bound skips the check and the
    subspace decision answers as before."""
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices_dir / "bayer10.mtx"))).astype(np.float64)
    R = sp.csc_array(_factorizer()(A, tol=None).R)
    cutoff = _lstsq.lstsq_cutoff(*A.shape)
    on, seen_on, est_on = _decide(R, cutoff, monkeypatch, ceiling=True)
    off, _, est_off = _decide(R, cutoff, monkeypatch, ceiling=False)
    (r11, value), = seen_on
    assert r11 == 13362 and value <= cutoff * on.sigma_max
    assert r11 in est_off and r11 not in est_on
    assert (on.method, on.rank) == (off.method, off.rank) == ("subspace_cod", 13303)
    c = np.ones(R.shape[0])
    x_on, x_off = on.solve(c), off.solve(c)
    assert np.linalg.norm(x_on - x_off) <= 1e-12 * np.linalg.norm(x_off)
