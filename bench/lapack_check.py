"""Per-matrix comparison of batched LU outputs with LAPACK (shared by the
kernel benchmarks bench/batched_mma.py and bench/batched_variants.py)."""

from __future__ import annotations

import numpy as np

__all__ = ["compare_getrf"]


def compare_getrf(a, lu, piv, info, nonfinite=()):
    """Compare a batch's LU factors, pivots and info with LAPACK's getrf.

    Parameters
    ----------
    a : ndarray, shape (B, n, n)
        The input matrices (host).
    lu, piv, info : ndarray
        The kernel's outputs (host): factors (B, n, n), 0-based pivots (B, n)
        and info (B,).
    nonfinite : iterable of int
        Matrices holding inf/NaN: only ``info == -1`` is checked for them.

    Returns
    -------
    err : float
        Largest ``max|lu - lu_ref| / max(1, max|lu_ref|)`` over the matrices
        whose pivots equal LAPACK's.
    bad_piv : int
        Matrices whose pivots differ from LAPACK's (a near tie may be decided
        by rounding).
    problems : list of str
        Non-finite matrices not flagged and info mismatches.
    """
    import scipy.linalg as sl
    getrf, = sl.get_lapack_funcs(("getrf",), (a[0],))
    skip = set(int(m) for m in nonfinite)
    problems, bad_piv, err = [], 0, 0.0
    for m in range(a.shape[0]):
        if m in skip:
            if info[m] != -1:
                problems.append(f"non-finite {m} not flagged ({info[m]})")
            continue
        rl, rp, ri = getrf(a[m])
        if ri != info[m]:
            problems.append(f"info {m}: {info[m]} vs {ri}")
        if (rp != piv[m]).any():
            bad_piv += 1
            continue
        e = np.abs(lu[m] - rl).max() / max(1.0, np.abs(rl).max())
        err = max(err, e if np.isfinite(e) else np.inf)
    return err, bad_piv, problems
