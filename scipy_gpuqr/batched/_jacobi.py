"""Block-Jacobi preconditioner built on a batched inverse.

The diagonal blocks of a sparse (or dense) square matrix are gathered into a
stack ``(nblocks, bs, bs)`` in one vectorized scatter, inverted in one batched
call (plus one for a ragged last block), and applied by a batched
matrix-vector product, on the device that holds ``A``. The inverse
(:func:`scipy_gpuqr.inv_batched`) is passed in by
:func:`scipy_gpuqr.batched._functions.block_jacobi`; cupyx is imported only
for CuPy input.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sps
import scipy.sparse.linalg as spla
from scipy.linalg import LinAlgError

from .._gpu import import_cupy, is_cupy_array, is_cupy_sparse

__all__ = ["build", "check_block_size"]


def _blocks(rows, cols, vals, n, bs, xp, dtype):
    """Scatter the entries inside diagonal blocks into full and ragged stacks."""
    keep = (rows // bs) == (cols // bs)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    nfull = n // bs
    full = xp.zeros((nfull, bs, bs), dtype=dtype)
    rest = n - nfull * bs
    last = xp.zeros((rest, rest), dtype=dtype)
    inf = rows < nfull * bs
    blk = rows[inf] // bs
    # duplicates (COO) are summed like SciPy does
    xp.add.at(full, (blk, rows[inf] % bs, cols[inf] % bs), vals[inf])
    xp.add.at(last, (rows[~inf] - nfull * bs, cols[~inf] - nfull * bs), vals[~inf])
    return full, last


def check_block_size(block_size) -> int:
    """``block_size`` as an int of at least 1 (TypeError, ValueError otherwise)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_jacobi: block_size must be an int, got "
                        f"{type(block_size).__name__}")
    bs = int(block_size)
    if bs < 1:
        raise ValueError(f"block_jacobi: block_size must be >= 1, got {bs}")
    return bs


def build(A, block_size, inv_batched, *, check_finite=True, backend=None):
    """:func:`scipy_gpuqr.block_jacobi`, inverting the blocks with ``inv_batched``."""
    bs = check_block_size(block_size)
    on_gpu = is_cupy_sparse(A) or is_cupy_array(A)
    if on_gpu:
        xp = import_cupy()
        from cupyx.scipy.sparse.linalg import LinearOperator
        import cupyx.scipy.sparse as xsp
        coo = xsp.coo_matrix(A) if is_cupy_sparse(A) else xsp.coo_matrix(xp.asarray(A))
    else:
        xp = np
        LinearOperator = spla.LinearOperator
        coo = sps.coo_matrix(A)
    if coo.ndim != 2 or coo.shape[0] != coo.shape[1]:
        raise ValueError(f"block_jacobi: A must be square, got shape {coo.shape}")
    n = coo.shape[0]
    dtype = np.promote_types(coo.dtype, np.float32)
    if np.dtype(dtype).kind not in "fc":
        dtype = np.float64
    full, last = _blocks(coo.row.astype(np.int64), coo.col.astype(np.int64),
                         coo.data, n, bs, xp, dtype)
    nfull = full.shape[0]
    try:
        inv_full = inv_batched(full, check_finite=check_finite,
                               backend=backend) if nfull else full
    except LinAlgError as exc:
        raise LinAlgError(f"block_jacobi: singular diagonal block(s) of size "
                          f"{bs} (block index = batch index, rows "
                          f"[index*{bs}, index*{bs}+{bs})): {exc}") from None
    try:
        inv_last = inv_batched(last, check_finite=check_finite,
                               backend=backend) if last.shape[0] else last
    except LinAlgError:
        raise LinAlgError(f"block_jacobi: the ragged last diagonal block "
                          f"(block index {nfull}, rows {nfull * bs}:{n}) is "
                          "singular") from None
    split = nfull * bs

    def matvec(x):
        x = x.reshape(n, -1)
        k = x.shape[1]
        y = xp.empty((n, k), dtype=np.promote_types(dtype, x.dtype))
        if nfull:
            y[:split] = xp.matmul(inv_full, x[:split].reshape(nfull, bs, k)
                                  ).reshape(split, k)
        if split < n:
            y[split:] = inv_last @ x[split:]
        return y

    return LinearOperator((n, n), matvec=matvec, matmat=matvec, dtype=dtype)
