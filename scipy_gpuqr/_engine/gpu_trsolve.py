"""Triangular solves with R front by front, from the front pools of a GPU factorization.

R of a multifrontal QR is a stack of dense row blocks: front ``f`` owns the
pivot rows ``cols_f[:rk]`` and its block is the first ``rk`` rows of the
factorized front, ``[U_f | S_f]`` over the columns ``cols_f`` (U upper
triangular, the entries below its diagonal hold Householder data and are
never read). The GPU engine leaves these blocks in the front pools, so the
solve reads them where they are instead of a sparse copy of R:

* ``R y = c`` (back substitution): fronts in reverse postorder (ancestors
  first), ``y[piv] = U⁻¹ (c[piv] - S y[cols_f[rk:]])``;
* ``Rᵀ y = c`` (forward): fronts in postorder, ``y[piv] = U⁻ᵀ c[piv]``, then
  ``c[cols_f[rk:]] -= Sᵀ y[piv]``;

with the singleton block ``R1 = [R11 R12]`` (rows of A that are rows of R,
taken from R's sparse copy) last (first for ``Rᵀ``). One dense triangular
solve and one matrix product per front (cuBLAS through CuPy, float64);
SciPy/NumPy run the same code on the host (CI).

Measured on an H200 (bench/RESULTS.md, issue 6): cuSPARSE's
``spsolve_triangular`` on R's CSR copy takes 6.7 s on grid40 (nnz(R) 8.9e7,
its analysis redone each call) against 2.1 s for SciPy on the host; this
front-by-front solve is the device path.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FrontTriangular"]


class FrontTriangular:
    """``R⁻¹ C`` and ``R⁻ᵀ C`` for a full-rank factorization with dense front blocks.

    Parameters
    ----------
    qr : GpuQR
        The factorization (``analysis``, ``_front_loc``, R).
    pools : callable
        ``pools(stage) -> array``: the stage's front pool (CuPy or NumPy, as ``xp``).
    xp : module
        ``cupy`` or ``numpy``.
    """

    def __init__(self, qr, pools, xp):
        import scipy.sparse as sp
        self.xp = xp
        self.pools = pools
        an = qr.analysis
        fs = an.fronts
        self.n = int(qr.R.shape[1])
        self.fronts = []
        for f in range(fs.nfronts):
            rk = int(fs.frank[f])
            if rk == 0:
                continue
            a, b = int(fs.col_ptr[f]), int(fs.col_ptr[f + 1])
            sid, off = qr._front_loc[f]
            self.fronts.append((sid, int(off), int(fs.fm[f]), int(fs.fn[f]), rk, a, b))
        self.cols = xp.asarray(np.asarray(fs.cols, dtype=np.int64))
        n1 = int(getattr(an, "n1cols", 0))
        self.n1 = n1
        self.R11 = self.R11T = self.R12 = self.R12T = None
        if n1:
            R = sp.csc_array(qr.R)
            e = np.flatnonzero(R.indices < n1)
            rows = R.indices[e].astype(np.int64)
            cols = np.searchsorted(R.indptr, e, side="right") - 1
            R1 = sp.csr_array((R.data[e].astype(np.float64), (rows, cols)), shape=(n1, self.n))
            self.R11 = self._sparse(sp.csr_array(R1[:, :n1]))
            self.R11T = self._sparse(sp.csr_array(R1[:, :n1].T))
            self.R12 = self._sparse(sp.csr_array(R1[:, n1:]))
            self.R12T = self._sparse(sp.csr_array(R1[:, n1:].T))

    def _sparse(self, M):
        M.sort_indices()
        if self.xp is np:
            return M
        import cupyx.scipy.sparse as csp
        import scipy.sparse as sp
        return csp.csr_matrix(sp.csr_matrix(M))

    def _tri(self, U, B, *, trans: bool):
        if self.xp is np:
            from scipy.linalg import solve_triangular
        else:
            from cupyx.scipy.linalg import solve_triangular
        return solve_triangular(U, B, lower=False, trans=1 if trans else 0)

    def _sptri(self, M, B, *, lower: bool):
        if self.xp is np:
            from scipy.sparse.linalg import spsolve_triangular
        else:
            from cupyx.scipy.sparse.linalg import spsolve_triangular
        return spsolve_triangular(M, B, lower=lower)

    def _blocks(self, sid, off, fm, fn, rk, pool):
        Fv = pool[off: off + fm * fn].reshape(fm, fn)
        U = self.xp.triu(Fv[:rk, :rk]).astype(np.float64)
        return U, Fv[:rk, rk:]

    def upper(self, C):
        """``R⁻¹ C``; C of shape (n, k), float64 (not modified)."""
        xp = self.xp
        Y = xp.array(C, dtype=np.float64, copy=True)
        sid_cur, pool = None, None
        for sid, off, fm, fn, rk, a, b in reversed(self.fronts):
            if sid != sid_cur:
                pool, sid_cur = self.pools(sid), sid
            U, S = self._blocks(sid, off, fm, fn, rk, pool)
            piv = self.cols[a: a + rk]
            rhs = Y[piv]
            if fn > rk:
                rhs = rhs - S.astype(np.float64) @ Y[self.cols[a + rk: b]]
            Y[piv] = self._tri(U, rhs, trans=False)
        if self.n1:
            n1 = self.n1
            rhs = Y[:n1] - self.R12 @ Y[n1:]
            Y[:n1] = self._sptri(self.R11, rhs, lower=False)
        return Y

    def upper_transposed(self, C):
        """``R⁻ᵀ C``; C of shape (n, k), float64 (not modified)."""
        xp = self.xp
        Y = xp.array(C, dtype=np.float64, copy=True)
        if self.n1:
            n1 = self.n1
            Y[:n1] = self._sptri(self.R11T, Y[:n1], lower=True)
            Y[n1:] -= self.R12T @ Y[:n1]
        sid_cur, pool = None, None
        for sid, off, fm, fn, rk, a, b in self.fronts:
            if sid != sid_cur:
                pool, sid_cur = self.pools(sid), sid
            U, S = self._blocks(sid, off, fm, fn, rk, pool)
            piv = self.cols[a: a + rk]
            y = self._tri(U, Y[piv], trans=True)
            Y[piv] = y
            if fn > rk:
                o = self.cols[a + rk: b]
                Y[o] -= S.astype(np.float64).T @ y
        return Y
