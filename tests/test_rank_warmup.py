"""The warm-up of the GPU QR's rank decisions (``scipy_gpuqr._api.warmup``).

CuPy compiles the generic array kernels of the device's rank decisions (dense
σ tests, SVD, dense and null-space CODs, R's singleton rows in R's solves) on
their first use in an environment; ``build_kernels.py`` runs these problems so
that a user's first rank-deficient GPU solve finds them in the cache. The
problems must keep reaching those rules: on the CPU their ranks and singleton
columns are checked here, on the GPU the warm-up runs and leaves nothing to
compile for a second pass.
"""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._api.warmup import LARGE_ORDER, SMALL_ORDER, warm_problems
from scipy_gpuqr._factor.lstsq import DENSE_LIMIT, SOLVE_RANK_MIN_ORDER, SVD_GPU_MIN_ORDER
from scipy_gpuqr._symbolic.analysis import analyze


def test_the_orders_reach_the_device_rules():
    # the dense rules on the device from SVD_GPU_MIN_ORDER to DENSE_LIMIT, the
    # solve-based rules and the device's dense COD beyond
    assert SVD_GPU_MIN_ORDER <= SMALL_ORDER <= DENSE_LIMIT
    assert LARGE_ORDER > DENSE_LIMIT and LARGE_ORDER >= SOLVE_RANK_MIN_ORDER


def test_the_problems_are_what_they_say():
    problems = dict(warm_problems())
    assert set(problems) == {"combined small", "graded small", "ill small",
                             "combined large", "copied large", "ill large"}
    for name, A in problems.items():
        n = SMALL_ORDER if name.endswith("small") else LARGE_ORDER
        assert A.shape == (n, n)
        # sparse enough that R stays sparse: the warm-up costs seconds, not minutes
        assert A.nnz <= 6 * n
    sv = {name: np.linalg.svd(problems[name].toarray(), compute_uv=False)
          for name in ("combined small", "graded small", "ill small")}
    cutoff = lambda s: np.finfo(float).eps * SMALL_ORDER * s[0]     # noqa: E731
    # six dependent columns with a clear gap at lstsq's cutoff
    s = sv["combined small"]
    assert np.count_nonzero(s > cutoff(s)) == SMALL_ORDER - 6
    assert s[-7] > 1e6 * cutoff(s) and s[-6] < 1e-2 * cutoff(s)
    # graded: singular values through the cutoff (a rank decision without a gap)
    s = sv["graded small"]
    assert 0 < np.count_nonzero(s <= cutoff(s)) < SMALL_ORDER // 2
    # ill-conditioned, of full rank
    s = sv["ill small"]
    assert s[-1] > 1e2 * cutoff(s) and s[0] / s[-1] > 1e8
    # R's singleton rows: the block that R's device solves hold as cupyx matrices
    assert analyze(problems["ill large"]).n1cols >= 16


def test_the_problems_are_the_same_every_time():
    a, b = warm_problems(), warm_problems()
    for (na, A), (nb, B) in zip(a, b):
        assert na == nb and (A != B).nnz == 0


@pytest.mark.gpu
def test_the_warm_up_leaves_nothing_to_compile(monkeypatch):
    import cupy.cuda.compiler as compiler
    from scipy_gpuqr._api.warmup import warm_rank_decisions
    assert warm_rank_decisions() > 0
    compiled = []
    real = compiler._compile_using_nvrtc_no_warning

    def counting(source, *args, **kwargs):
        compiled.append(source[:200])
        return real(source, *args, **kwargs)
    monkeypatch.setattr(compiler, "_compile_using_nvrtc_no_warning", counting)
    warm_rank_decisions()
    assert compiled == []


@pytest.mark.gpu
def test_device_sparse_blocks_carry_the_host_canonical_flag():
    # cupyx checks an unflagged matrix's format on the device at its first product
    # or triangular solve, with CUB kernels CuPy compiles on first use (seconds)
    import cupy
    import scipy.sparse as sp
    from scipy_gpuqr._engine.gpu.trsolve import FrontTriangular
    ft = FrontTriangular.__new__(FrontTriangular)
    ft.xp = cupy
    M = sp.random_array((50, 40), density=0.1, format="csr", random_state=0)
    D = ft._sparse(sp.csr_array(M))
    assert D._has_canonical_format and (D.get() != M).nnz == 0


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["C", "F"])
def test_device_frobenius_and_finiteness(order, rng):
    import cupy
    from scipy_gpuqr._factor.triangular import _diagonal_on_host, _finite_frobenius
    X = np.asarray(rng.standard_normal((300, 200)), order=order)
    Xd = cupy.asarray(X, order=order)
    assert _finite_frobenius(Xd) == pytest.approx(np.linalg.norm(X), rel=1e-14)
    T = np.triu(rng.standard_normal((120, 120)))
    assert np.array_equal(_diagonal_on_host(cupy.asarray(T)), np.diagonal(T))
    Xd[7, 3] = np.nan
    assert np.isnan(_finite_frobenius(Xd))
