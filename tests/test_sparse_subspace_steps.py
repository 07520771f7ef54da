"""The host rank decision's subspace iteration counted (issue 15, bayer10's exact answer on
the host): it starts from R⁻¹ of a random block (half a step for one solve) and factors
the first step's ill-conditioned blocks by one Cholesky QR pass (``ROUGH_COND``), whose
Ritz values the convergence test does not read (``SETTLE_LOSS``). On a triangle with a
gapless, clustered spectrum at lstsq's cutoff (bayer10's shape: a hundred singular values
far under it, a cluster up to it, a few hundred just above) that settles a step sooner
with fewer q × p products, at the rank of numpy.linalg.lstsq's rule; later steps' blocks
keep the exact factorizations, so a triangle whose every ``R⁻ᵀX`` is ill-conditioned
converges as before (CPU; the matrices are made here)."""

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from scipy_gpuqr._factor import host_lanes as _host_lanes
from scipy_gpuqr._factor import sparse_subspace as ss
from scipy_gpuqr._factor import subspace_cod as C

EPS = np.finfo(np.float64).eps


def _triangle(q, spectrum, seed):
    """R of the QR of ``U diag(spectrum) Vᵀ`` (U, V random orthogonal): its singular values
    are ``spectrum`` to rounding."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((q, q)))[0]
    V = np.linalg.qr(rng.standard_normal((q, q)))[0]
    return np.triu(la.qr((U * spectrum) @ V.T, mode="r")[0])


def _clustered(q=900, tiny=60, near=40, cluster=200, top=8.0):
    """σ relative to σ_max = 1 and lstsq's cutoff ``t = eps·q``: ``tiny`` values from
    0.1·t down to 1e-5·t, ``near`` from 0.97·t to 0.3·t (the count under the cutoff:
    ``tiny + near``), ``cluster`` from 1.05·t to ``top``·t, the rest up to 1."""
    t = EPS * q
    rest = q - tiny - near - cluster
    return np.concatenate([np.geomspace(1.0, 1.1 * top * t, rest),
                           np.geomspace(top * t, 1.05 * t, cluster),
                           np.geomspace(0.97 * t, 0.3 * t, near),
                           np.geomspace(0.1 * t, 1e-5 * t, tiny)])


def _lstsq_rank(R):
    return int(np.linalg.lstsq(R, np.ones(R.shape[0]), rcond=None)[2])


class _Count:
    """The decision's q × p products (Gram matrices, GEMMs, right-side triangular
    solves on the lanes) and their flops, and its solves with R and Rᵀ."""

    def __init__(self, monkeypatch, q):
        self.products, self.flops, self.inv, self.inv_t = 0, 0.0, 0, 0
        lanes = _host_lanes.Lanes
        for name, flops in (("gram", lambda A, B: A.shape[0] * A.shape[1] ** 2),
                            ("gemm", lambda A, B: 2 * A.shape[0] * A.shape[1] * B.shape[1]),
                            ("solve_right_upper", lambda U, Y: Y.shape[0] * U.shape[0] ** 2)):
            real = getattr(lanes, name)

            def spy(this, *args, _real=real, _flops=flops, **kwargs):
                self.products += 1
                self.flops += _flops(*args[:2]) if len(args) > 1 else _flops(args[0], None)
                return _real(this, *args, **kwargs)
            monkeypatch.setattr(lanes, name, spy)
        real_ss = ss.small_subspace

        def counted(inv, inv_t, *args, **kwargs):
            def i(Y):
                self.inv += 1
                return inv(Y)

            def it(Y):
                self.inv_t += 1
                return inv_t(Y)
            self.sub = real_ss(i, it, *args, **kwargs)
            return self.sub
        monkeypatch.setattr(ss, "small_subspace", counted)


def test_clustered_spectrum_settles_a_step_sooner(monkeypatch):
    """900 columns, 100 singular values under the cutoff (0.97·t the nearest, 1.05·t
    the next), 200 more up to 8·t: the block of 300 columns (the largest, q/3) settles
    in 4 steps (the start's 5: a Gaussian start without its half step), with one
    solve with Rᵀ and one with R a step (R's the start's), 2.3 GFlop of q × p products
    (the start's 3.1), and the rank of lstsq's rule."""
    q = 900
    R = _triangle(q, _clustered(q), seed=3)
    count = _Count(monkeypatch, q)
    cod = ss.decide(sp.csc_array(R), EPS * q, np.abs(np.diag(R)), block=64,
                    max_block=q // 3, lanes=1)
    assert cod is not None and cod.block_used == 300
    assert cod.rank == _lstsq_rank(R) == q - 100
    assert cod.steps == count.sub.steps == 4
    assert (count.inv_t, count.inv) == (4, 4)
    assert count.flops < 2.6e9                        # the start rev: 3.06e9, 5 steps
    assert cod.leak <= ss.LEAK_FACTOR


def test_ill_conditioned_later_blocks_keep_their_exact_factors(monkeypatch):
    """A spectrum whose ``R⁻ᵀX`` stays ill-conditioned (unit-scaled condition 1e3–1e4)
    at every step: only the start and the first step take the one-pass factors, the
    iteration settles as before (3 steps), at lstsq's rank; a rough factor at every
    step would never let it settle."""
    q = 800
    t = EPS * q
    spectrum = np.concatenate([np.geomspace(1.0, 1.05 * t, q - 70),
                               np.geomspace(0.97 * t, 0.3 * t, 30),
                               np.geomspace(0.1 * t, 1e-5 * t, 40)])
    R = _triangle(q, spectrum, seed=1)
    rough = []
    for name in ("_rough_factor", "_orth_deferred"):
        real = getattr(C, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            out = _real(*args, **kwargs)
            rough.append((_name, bool(kwargs.get("rough", False)), out[-1]))
            return out
        monkeypatch.setattr(C, name, spy)
    cod = ss.decide(sp.csc_array(R), EPS * q, np.abs(np.diag(R)), block=64,
                    max_block=q // 3, lanes=1)
    assert cod is not None and cod.rank == _lstsq_rank(R) == q - 70
    assert cod.steps == 3
    # start's orth, step 1's factor and orth rough; every later one exact
    assert [r[1] for r in rough] == [True, True, True] + [False] * (len(rough) - 3)
    assert all(r[2] <= C.SETTLE_LOSS for r in rough[3:])
    assert any(r[2] > C.SETTLE_LOSS for r in rough[:3])


@pytest.mark.parametrize("transposed", [False, True])
def test_clustered_spectrum_solves_as_the_truncated_svd(transposed):
    """The settled decision's minimum-norm solves on the clustered triangle: the
    truncated SVD's solution (lstsq's rule) to the method's rounding, for R and Rᵀ."""
    q = 900
    R = _triangle(q, _clustered(q), seed=3)
    cod = ss.decide(sp.csc_array(R), EPS * q, np.abs(np.diag(R)), block=64,
                    max_block=q // 3, transposed=transposed, lanes=1)
    G = R.T if transposed else R
    c = np.random.default_rng(11).standard_normal((q, 2))
    got = cod.solve(c)
    U, sv, Vt = la.svd(G)
    tol = EPS * q * sv[0]
    assert int(np.count_nonzero(sv > tol)) == cod.rank
    # the truncated SVD's solution along the singular directions at least 2·t, to the
    # SVD's own resolution there (each component's relative error ~eps·q·σ_max/σ_i:
    # 1/2 at 2·t; nearer the cutoff the dense SVD's vectors are not resolved: its
    # error eps·σ_max over the 8 % gap at the cutoff is 1.4e-2)
    ref = Vt.T @ ((U.T @ c) / sv[:, None] * (sv > tol)[:, None])
    far = sv >= 2 * tol
    err = np.abs(Vt[far] @ (got - ref))
    bound = 10 * EPS * q * (sv[0] / sv[far])[:, None] * np.abs(Vt[far] @ ref) + \
        1e-12 * np.abs(Vt[far] @ ref).max()
    assert np.all(err <= bound)
