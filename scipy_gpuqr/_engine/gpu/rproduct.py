"""R's products with a block on the device, read from the front blocks the solves use.

A rank decision's minimum-norm solve refines once with R's own residual
(:meth:`scipy_gpuqr._factor.solve_rank.NullspaceCOD.solve`): ``C − R Y`` or
``C − Rᵀ Y``. On the host that product walks R's sparse copy on one core,
a tenth of a second for a dense-ish R of ten thousand columns, while R's rows
already lie on the device where the triangular solves read them
(:class:`~.trsolve.FrontTriangular`): front ``f``'s rows of R are the first
``rk`` rows of its factorized front, ``[U | S]`` over its columns. The
kernels ``rmul_upper``/``rmul_trans`` of ``kernels/sparse_qr/array_ops.cu``
multiply with them, one launch per stage and column block, in chunks of at
most :data:`RMUL_ROWS` rows of one front (so a large root front is spread
over many thread blocks):

* ``R X``: each of R's rows is one pivot column's row: a warp per row, plain
  stores;
* ``Rᵀ X``: each front adds into its columns, which ancestors share: atomic
  adds into a zeroed result.

The singleton rows ``[R11 R12]`` (rows of A that are rows of R) come from the
sparse copies the solves keep. Stages whose rows of R are on the host go up
as the solves upload them (kept rows where the solves kept them); a stage
that the solves handle in streamed panels (no level kernel) has no product
here: :meth:`FrontProduct.of` answers None and the host multiplies.
"""

from __future__ import annotations

import numpy as np

from . import array_ops as ops

__all__ = ["RMUL_ROWS", "MAX_COLUMNS", "FrontProduct"]

#: Rows of one front per thread block (the kernels' ``RMUL_ROWS``).
RMUL_ROWS = 64

#: Most columns of X (a launch's ``gridDim.y``, one column each).
MAX_COLUMNS = 65535


class FrontProduct:
    """``R X`` and ``Rᵀ X`` on the device for the fronts of a
    :class:`~.trsolve.FrontTriangular` (made by :meth:`of`).

    Parameters
    ----------
    ft : FrontTriangular
        The solves' view of R (fronts, columns, pools, singleton blocks).
    stages : list
        ``(stage, rows, desc)`` per stage: the stage's uploaded rows of R
        (None: its pool on the device) and the chunk descriptors (device int64,
        5 per chunk: offset, fn, rk, first column, first row).
    """

    def __init__(self, ft, stages):
        self.ft = ft
        self.stages = stages

    @classmethod
    def of(cls, ft):
        """The product for ``ft``, or None where the device cannot form it: the
        NumPy layer (no stages), or a stage solved from the host in panels."""
        staged = ft.stages
        if staged is None:
            return None
        cp = ft.xp
        out = []
        for sid, members, kern, rows in staged:
            if kern is None:
                return None
            desc = []
            for i in members:
                _, _, _, fn, rk, a, _ = ft.fronts[i]
                off = kern.off_of[int(i)]
                for r0 in range(0, rk, RMUL_ROWS):
                    desc.append((off, fn, rk, a, r0))
            if desc:
                out.append((sid, rows, cp.asarray(np.asarray(desc, dtype=np.int64))))
        return cls(ft, out)

    def multiply(self, X, *, trans: bool):
        """``Rᵀ X`` (``trans``) or ``R X`` for a device block X (n × k, float64,
        C order); a new device array, or None for more columns than a grid's
        second dimension holds (:data:`MAX_COLUMNS`)."""
        if X.shape[1] > MAX_COLUMNS:
            return None
        ft = self.ft
        cp = ft.xp
        X = ops.fresh_float64(cp.asarray(X)) if not (
            X.dtype == np.float64 and X.flags.c_contiguous) else X
        n, k = X.shape
        Y = cp.zeros((n, k), dtype=np.float64)
        if k == 0:
            return Y
        for sid, rows, desc in self.stages:
            pool = rows.upload() if rows is not None else ft.pools(sid)
            ops.front_rows_product(desc, pool, ft.cols, X, Y, trans=trans)
            del pool
        if ft.n1:
            self._singletons(X, Y, trans)
        return Y

    def _singletons(self, X, Y, trans: bool) -> None:
        """The rows ``[R11 R12]`` of R (sparse copies on the device)."""
        ft, n1 = self.ft, self.ft.n1
        if trans:
            ops.copy_into(Y[:n1], ft.R11T @ X[:n1])
            Y[n1:] += ft.R12T @ X[:n1]
        else:
            ops.copy_into(Y[:n1], ft.R11 @ X[:n1] + ft.R12 @ X[n1:])
