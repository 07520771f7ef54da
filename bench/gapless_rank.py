"""Host rank decision without a gap at lstsq's cutoff, against numpy.linalg.lstsq (issue 2).

    python bench/gapless_rank.py             # synthetic gapless problems (about 10 minutes)
    python bench/gapless_rank.py --only 3 4 --lanes 1   # two of them, the decision on one thread
    python bench/gapless_rank.py --bayer10   # bayer10 on the host (lstsq's answer cached)
    python bench/gapless_rank.py --svd 3000 5000   # SVD fallback vs subspace decision on R

Synthetic: singular values geometric from 1 down past the cutoff (a fraction
``below`` of them under it), random singular vectors; ``cluster``: 40 of them
within ±2 % of the cutoff. bayer10: b = default_rng(7).standard_normal(m);
lstsq's x (about 20 minutes on two cores) is cached in
``.dev/tmp/bayer10_lstsq.npz`` (git-ignored) on the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from scipy_gpuqr import QRFactorization
from scipy_gpuqr._factor import lstsq as _lstsq

EPS = float(np.finfo(np.float64).eps)

CASES = [(1500, 1500, 0.02, False), (2500, 1500, 0.05, False), (1500, 1500, 0.02, True),
         (3000, 3000, 0.01, False), (4000, 3000, 0.03, False), (3000, 3000, 0.01, True),
         (2000, 3000, 0.02, False)]


def gapless(rng, m, n, below, cluster=False):
    k = min(m, n)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    cut = EPS * max(m, n)
    s = np.logspace(0, np.log10(cut) / (1 - below), k)
    if cluster:
        j = int(np.searchsorted(-s, -cut))
        s[j - 20:j + 20] = cut * (1 + 0.02 * rng.uniform(-1, 1, 40))
        s = np.sort(s)[::-1]
    return (U * s) @ V.T


def berr(A, x, b, norm_a):
    r = b - A @ x
    return float(np.linalg.norm(A.T @ r) / (norm_a * np.linalg.norm(r)))


def ours(A, b):
    t = time.perf_counter()
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    x = F.solve(b)
    return F, x, time.perf_counter() - t


def synthetic(only=None):
    _lstsq.DENSE_LIMIT = 1000        # let the 1500-column problems reach the dense COD path
    for i, (m, n, below, cluster) in enumerate(CASES):
        if only is not None and i not in only:
            continue
        rng = np.random.default_rng(100 + i)
        A = gapless(rng, m, n, below, cluster)
        b = rng.standard_normal(m)
        t = time.perf_counter()
        x_ref, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
        t_ref = time.perf_counter() - t
        F, x, t_ours = ours(A, b)
        cut = EPS * max(m, n) * s[0]
        dec = F.info["rank_decision"]
        print(json.dumps(dict(
            m=m, n=n, below=below, cluster=cluster, rank_lstsq=int(rank), rank=int(F.rank),
            method=dec["method"], revealed=dec["rank_revealed"],
            nearest_eps=float(np.min(np.abs(s - cut)) / (EPS * s[0])),
            dnorm=float(np.linalg.norm(x) / np.linalg.norm(x_ref) - 1),
            berr=berr(A, x, b, s[0]), berr_lstsq=berr(A, x_ref, b, s[0]),
            t_rank=round(F.info["timings"]["rank_decision"], 2), t_ours=round(t_ours, 2),
            t_lstsq=round(t_ref, 2), load=round(os.getloadavg()[0], 2))), flush=True)


def svd_crossover(sizes):
    """gesdd with vectors (the SVD fallback) vs σ_max + subspace decision on gapless R."""
    import scipy.linalg as la
    from scipy_gpuqr._factor.subspace_cod import SubspaceCOD, sigma_max_lanczos
    for q in sizes:
        rng = np.random.default_rng(q)
        R = np.linalg.qr(gapless(rng, q, q, 0.01), mode="r")
        t = time.perf_counter()
        _, sv, _ = la.svd(R, full_matrices=False, lapack_driver="gesdd", check_finite=False)
        t_svd = time.perf_counter() - t
        cut = EPS * q
        t = time.perf_counter()
        cod = SubspaceCOD(np.asfortranarray(R), cut * sigma_max_lanczos(R), block=128)
        t_sub = time.perf_counter() - t
        print(json.dumps(dict(q=q, svd_s=round(t_svd, 2), subspace_s=round(t_sub, 2),
                              rank_svd=int(np.sum(sv > cut * sv[0])), rank_subspace=cod.rank,
                              steps=cod.steps, block=cod.block_used)), flush=True)


def bayer10(matrices: Path, cache: Path):
    from scipy_gpuqr.io import mmread
    A = sp.csc_array(mmread(str(matrices / "bayer10.mtx"))).astype(np.float64)
    b = np.random.default_rng(7).standard_normal(A.shape[0])
    if not cache.exists():
        t = time.perf_counter()
        x, _, rank, s = np.linalg.lstsq(A.toarray(), b, rcond=None)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, x=x, rank=rank, s=s, b=b, seconds=time.perf_counter() - t)
    ref = np.load(cache)
    F, x, t_ours = ours(A, b)
    norm_a = float(ref["s"][0])
    print(json.dumps(dict(
        rank=int(F.rank), rank_lstsq=int(ref["rank"]), decision=F.info["rank_decision"],
        norm_x=float(np.linalg.norm(x)), norm_x_lstsq=float(np.linalg.norm(ref["x"])),
        rel_diff=float(np.linalg.norm(x - ref["x"]) / np.linalg.norm(ref["x"])),
        berr=berr(A, x, b, norm_a), berr_lstsq=berr(A, ref["x"], b, norm_a),
        timings=F.info["timings"], t_ours=t_ours, t_lstsq=float(ref["seconds"])),
        default=str), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bayer10", action="store_true")
    ap.add_argument("--svd", type=int, nargs="+", metavar="Q")
    ap.add_argument("--matrices", default="../shared/matrices")
    ap.add_argument("--cache", default=".dev/tmp/bayer10_lstsq.npz")
    ap.add_argument("--only", type=int, nargs="+", metavar="CASE",
                    help="indices into CASES (default: all)")
    ap.add_argument("--lanes", type=int, default=None,
                    help="threads of the host rank decision (trees without host_lanes ignore it)")
    args = ap.parse_args()
    if args.lanes is not None:
        try:
            from scipy_gpuqr._factor import host_lanes
            host_lanes.MAX_LANES = args.lanes
        except ImportError:
            pass
    if args.bayer10:
        bayer10(Path(args.matrices), Path(args.cache))
    elif args.svd:
        svd_crossover(args.svd)
    else:
        synthetic(args.only)


if __name__ == "__main__":
    main()
