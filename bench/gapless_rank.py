"""Host rank decision without a gap at lstsq's cutoff, against numpy.linalg.lstsq (issue 2).

    python bench/gapless_rank.py             # synthetic gapless problems (about 10 minutes)
    python bench/gapless_rank.py --only 3 4 --lanes 1   # two of them, the decision on one thread
    python bench/gapless_rank.py --bayer10   # bayer10 on the host (lstsq's answer cached)
    python bench/gapless_rank.py --svd 3000 5000   # SVD fallback vs subspace decision on R
    python bench/gapless_rank.py --full-rank 1.5 3 10 50 [--sparse]   # full rank, ill-conditioned

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
from typing import Optional

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


def full_rank(rng, n, above, sparse=False, m=None):
    """Full rank, ill-conditioned: singular values geometric from 1 down to ``above``
    × lstsq's cutoff (n × n, or m × n). ``sparse``: a block diagonal of 30 dense
    blocks with interleaved spectra, rows and columns permuted (R stays sparse)."""
    m = m or n
    cut = EPS * max(m, n)
    if not sparse:
        A = gapless(rng, m, n, 0.0)
        U, s, Vt = np.linalg.svd(A, full_matrices=False)
        s = np.logspace(0, np.log10(above * cut), n)
        return (U * s) @ Vt
    blocks, size = 30, n // 30
    lo = np.log10(above * cut)
    parts = []
    for k in range(blocks):
        U, _ = np.linalg.qr(rng.standard_normal((size, size)))
        V, _ = np.linalg.qr(rng.standard_normal((size, size)))
        # block k holds every 30th value of one geometric sequence from 1 to 10^lo
        s = np.logspace(0, lo, blocks * size)[k::blocks]
        parts.append((U * s) @ V.T)
    A = sp.block_diag(parts, format="csc")
    return sp.csc_array(A[rng.permutation(n)][:, rng.permutation(n)])


def full_rank_cases(aboves, sparse, cache=None):
    """Full-rank, ill-conditioned R beyond DENSE_LIMIT: σ_min at ``above`` × the cutoff."""
    _lstsq.DENSE_LIMIT = 1000
    for above in aboves:
        rng = np.random.default_rng(int(above * 1000))
        A = full_rank(rng, 3000, above, sparse)
        m, n = A.shape
        b = rng.standard_normal(m)
        Ad = A.toarray() if sp.issparse(A) else A
        x_ref, rank, s, t_ref = lstsq_ref(Ad, b, f"full{above:g}{'s' if sparse else ''}", cache)
        F, x, t_ours = ours(A, b)
        dec = F.info["rank_decision"]
        print(json.dumps(dict(
            m=m, n=n, above=above, sparse=sparse, nnz_R=int(sp.csc_array(F.R).nnz),
            smin_over_cut=float(s[-1] / (EPS * max(m, n) * s[0])),
            rank_lstsq=int(rank), rank=int(F.rank), method=dec["method"],
            sigma_min_reported=dec["sigma_min"],
            dx=float(np.linalg.norm(x - x_ref) / np.linalg.norm(x_ref)),
            berr=berr(Ad, x, b, s[0]), berr_lstsq=berr(Ad, x_ref, b, s[0]),
            t_rank=round(F.info["timings"]["rank_decision"], 3), t_ours=round(t_ours, 2),
            t_lstsq=round(t_ref, 2), load=round(os.getloadavg()[0], 2))), flush=True)


def lstsq_ref(A, b, key: str, cache: Optional[Path]):
    """numpy.linalg.lstsq's (x, rank, s, seconds), kept under ``cache/key.npz`` when
    given (the same generated problem is timed before and after a change)."""
    f = cache / f"{key}.npz" if cache is not None else None
    if f is not None and f.exists():
        z = np.load(f)
        return z["x"], int(z["rank"]), z["s"], float(z["seconds"])
    t = time.perf_counter()
    x, _, rank, s = np.linalg.lstsq(A, b, rcond=None)
    seconds = time.perf_counter() - t
    if f is not None:
        f.parent.mkdir(parents=True, exist_ok=True)
        np.savez(f, x=x, rank=rank, s=s, seconds=seconds)
    return x, int(rank), s, seconds


def berr(A, x, b, norm_a):
    r = b - A @ x
    return float(np.linalg.norm(A.T @ r) / (norm_a * np.linalg.norm(r)))


def ours(A, b):
    t = time.perf_counter()
    F = QRFactorization(sp.csc_array(A), backend="cpu")
    x = F.solve(b)
    return F, x, time.perf_counter() - t


def synthetic(only=None, cache=None):
    _lstsq.DENSE_LIMIT = 1000        # let the 1500-column problems reach the dense COD path
    for i, (m, n, below, cluster) in enumerate(CASES):
        if only is not None and i not in only:
            continue
        rng = np.random.default_rng(100 + i)
        A = gapless(rng, m, n, below, cluster)
        b = rng.standard_normal(m)
        x_ref, rank, s, t_ref = lstsq_ref(A, b, f"case{i}", cache)
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
    ap.add_argument("--ref-cache", type=Path, default=None, metavar="DIR",
                    help="keep lstsq's answers of the synthetic cases here (timed once)")
    ap.add_argument("--full-rank", type=float, nargs="+", metavar="ABOVE",
                    help="full-rank 3000-column cases, σ_min at ABOVE × the cutoff")
    ap.add_argument("--sparse", action="store_true",
                    help="with --full-rank: block-diagonal A (R stays sparse)")
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
    if args.full_rank:
        full_rank_cases(args.full_rank, args.sparse, args.ref_cache)
    elif args.bayer10:
        bayer10(Path(args.matrices), Path(args.cache))
    elif args.svd:
        svd_crossover(args.svd)
    else:
        synthetic(args.only, args.ref_cache)


if __name__ == "__main__":
    main()
