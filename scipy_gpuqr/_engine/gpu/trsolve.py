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
taken from R's sparse copy) last (first for ``Rᵀ``).

On the device, when every front lies in one pool (one-stage factorizations,
the usual case), ``kernels/sparse_qr/rsolve.cu`` solves one tree level per
launch, one thread block per front and right-hand-side column: ``R``'s
levels by depth from the root (a front reads only its ancestors' values),
``Rᵀ``'s by height from the leaves (a front pushes into its ancestors'
columns with atomic adds); fronts of :data:`BIG_FRONT_ROWS` rows of R or
more go through cuBLAS within their level. Otherwise (several stages, or
NumPy on the host for CI) one dense triangular solve and one matrix product
per front (cuBLAS through CuPy, or SciPy), float64. The level kernel is the
fast path: a loop over the fronts pays one CuPy call overhead per front, and
a sparse triangular solve on a copy of R redoes its analysis on every call.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.linalg import solve_triangular as host_solve_triangular
from scipy.sparse.linalg import spsolve_triangular as host_spsolve_triangular

from ..._kernels import load_module
from . import solve_kernels as av

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
        self._kernel = None
        sids = {fr[0] for fr in self.fronts}
        if xp is not np and len(sids) == 1 and next(iter(sids)) in qr._stage_pools:
            self._kernel = _LevelKernel(self, fs, qr._stage_pools[next(iter(sids))])
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
        return csp.csr_matrix(sp.csr_matrix(M))

    def _tri(self, U, B, *, trans: bool):
        if self.xp is np:
            solve_triangular = host_solve_triangular
        else:
            from cupyx.scipy.linalg import solve_triangular
        if U.dtype != np.float64:
            U = U.astype(np.float64)
        return solve_triangular(U, B, lower=False, trans=1 if trans else 0)

    def _sptri(self, M, B, *, lower: bool):
        if self.xp is np:
            spsolve_triangular = host_spsolve_triangular
        else:
            from cupyx.scipy.sparse.linalg import spsolve_triangular
        return spsolve_triangular(M, B, lower=lower)

    def _blocks(self, sid, off, fm, fn, rk, pool):
        Fv = pool[off: off + fm * fn].reshape(fm, fn)
        # the triangular solvers read U's upper triangle only (Householder data below)
        return Fv[:rk, :rk], Fv[:rk, rk:].astype(np.float64, copy=False)

    def step(self, i: int, Y, pool, *, trans: bool) -> None:
        """Front ``self.fronts[i]`` of the solve, in place on Y (dense solvers)."""
        if self.xp is not np and isinstance(pool, np.ndarray):
            self._host_step(i, Y, pool, trans=trans)
            return
        sid, off, fm, fn, rk, a, b = self.fronts[i]
        U, S = self._blocks(sid, off, fm, fn, rk, pool)
        piv = self.cols[a: a + rk]
        if not trans:
            rhs = Y[piv]
            if fn > rk:
                rhs = rhs - S @ Y[self.cols[a + rk: b]]
            Y[piv] = self._tri(U, rhs, trans=False)
            return
        y = self._tri(U, Y[piv], trans=True)
        Y[piv] = y
        if fn > rk:
            o = self.cols[a + rk: b]
            Y[o] -= S.T @ y

    def _host_step(self, i: int, Y, pool, *, trans: bool) -> None:
        """A front whose values stay on the host (a host front of a GPU
        factorization, too large for the device): its columns of the device Y
        solved on the host and copied back."""
        sid, off, fm, fn, rk, a, b = self.fronts[i]
        U, S = self._blocks(sid, off, fm, fn, rk, pool)
        U = U.astype(np.float64, copy=False)
        cols = self.cols[a: b]
        y = Y[cols].get()
        if not trans:
            rhs = y[:rk] - S @ y[rk:] if fn > rk else y[:rk]
            Y[cols[:rk]] = self.xp.asarray(host_solve_triangular(U, rhs, lower=False))
            return
        z = host_solve_triangular(U, y[:rk], lower=False, trans=1)
        Y[cols[:rk]] = self.xp.asarray(z)
        if fn > rk:
            Y[cols[rk:]] = self.xp.asarray(y[rk:] - S.T @ z)

    def _loop(self, Y, trans: bool) -> None:
        sid_cur, pool = None, None
        order = range(len(self.fronts)) if trans else range(len(self.fronts) - 1, -1, -1)
        for i in order:
            sid = self.fronts[i][0]
            if sid != sid_cur:
                pool = None             # the previous stage's upload goes first
                pool, sid_cur = self.pools(sid), sid
            self.step(i, Y, pool, trans=trans)

    def upper(self, C):
        """``R⁻¹ C``; C of shape (n, k), float64 (not modified)."""
        Y = self.xp.array(C, dtype=np.float64, order="C", copy=True)
        if self._kernel is not None:
            self._kernel.run(Y, trans=False)
        else:
            self._loop(Y, False)
        if self.n1:
            n1 = self.n1
            rhs = Y[:n1] - self.R12 @ Y[n1:]
            Y[:n1] = self._sptri(self.R11, rhs, lower=False)
        return Y

    def upper_transposed(self, C):
        """``R⁻ᵀ C``; C of shape (n, k), float64 (not modified)."""
        Y = self.xp.array(C, dtype=np.float64, order="C", copy=True)
        if self.n1:
            n1 = self.n1
            Y[:n1] = self._sptri(self.R11T, Y[:n1], lower=True)
            Y[n1:] -= self.R12T @ Y[:n1]
        if self._kernel is not None:
            self._kernel.run(Y, trans=True)
        else:
            self._loop(Y, True)
        return Y


#: Fronts with at least this many rows of R are solved by cuBLAS (one thread block
#: walking thousands of rows one by one is much slower than a cuBLAS solve).
BIG_FRONT_ROWS = 512


class _LevelKernel:
    """The fronts of a one-pool factorization as levels of ``kernels/sparse_qr/rsolve.cu``.

    Fronts of :data:`BIG_FRONT_ROWS` rows of R or more are solved in their level
    by :meth:`FrontTriangular.step` (cuBLAS) instead.
    """

    def __init__(self, ft, fs, pool):
        import cupy as cp
        self.cp, self.pool, self.cols, self.ft = cp, pool, ft.cols, ft
        nf = fs.nfronts
        parent = np.asarray(fs.parent, dtype=np.int64)
        depth = np.zeros(nf, dtype=np.int64)
        height = np.zeros(nf, dtype=np.int64)
        for f in range(nf - 1, -1, -1):         # postorder: parents after children
            if parent[f] >= 0:
                depth[f] = depth[parent[f]] + 1
        for f in range(nf):
            if parent[f] >= 0:
                height[parent[f]] = max(height[parent[f]], height[f] + 1)
        idx = {}
        for i, (sid, off, fm, fn, rk, a, b) in enumerate(ft.fronts):
            idx[i] = (off, fn, rk, a)
        fr = np.array([idx[i] for i in range(len(ft.fronts))], dtype=np.int64).reshape(-1, 4)
        which = np.flatnonzero(np.asarray(fs.frank) > 0)     # ft.fronts' front indices
        big = fr[:, 2] >= BIG_FRONT_ROWS
        self.levels = {}
        for trans, key in ((False, depth[which]), (True, height[which])):
            nlev = int(key.max()) + 1 if len(key) else 0
            small = np.flatnonzero(~big)
            order = small[np.argsort(key[small], kind="stable")]
            cnt = np.bincount(key[small], minlength=nlev)
            ptr = np.concatenate(([0], np.cumsum(cnt))).astype(np.int64)
            desc = cp.asarray(np.ascontiguousarray(fr[order]).reshape(-1, 4))
            bigs = [[] for _ in range(nlev)]
            for i in np.flatnonzero(big).tolist():
                bigs[int(key[i])].append(i)
            self.levels[trans] = (desc, ptr, bigs)
        ctype = "double" if pool.dtype == np.float64 else "float"
        mod = load_module(av.RSOLVE_FILE, av.KERNEL_VARIANTS[av.RSOLVE_FILE])
        self.kern = {tr: mod.get_function(av.rsolve_name(ctype, tr)) for tr in (False, True)}
        self.threads = av.RSOLVE_THREADS

    def run(self, Y, *, trans: bool) -> None:
        """One launch per level, in place on Y (n × k, C order, float64)."""
        desc, ptr, bigs = self.levels[trans]
        k = Y.shape[1]
        for lv in range(len(ptr) - 1):
            a, b = int(ptr[lv]), int(ptr[lv + 1])
            if b > a and k:
                self.kern[trans]((b - a, k), (self.threads,),
                                 (desc[a:], self.pool, self.cols, Y, np.int32(k)))
            for i in bigs[lv]:
                self.ft.step(i, Y, self.pool, trans=trans)
