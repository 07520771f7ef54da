"""Block-Jacobi preconditioner built on a batched inverse.

The diagonal blocks of a sparse (or dense) square matrix are gathered into a
stack ``(nblocks, bs, bs)`` -- on the GPU by one kernel over the rows of a
CSR matrix (``kernels/batched/jacobi.cu``) or a strided copy of a dense one,
on the CPU in one vectorized scatter --, inverted in one batched
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

import functools

from . import _gpu_common as _gc
from ._kernel_registry import JACOBI_FILE, KERNEL_VARIANTS, jacobi_name
from .._gpu import import_cupy, is_cupy_array, is_cupy_sparse
from .._kernels import load_module

__all__ = ["build", "check_block_size"]

#: Threads per block and most blocks of the CSR gather (grid-stride over rows).
_GATHER_THREADS = 256
_GATHER_MAX_BLOCKS = 65536


@functools.lru_cache(maxsize=None)
def _gather_function(dt: str, ix: str, device: int) -> int:
    """The CUfunction of ``jacobi_gather<dt, ix>`` on ``device``."""
    module = load_module(JACOBI_FILE, KERNEL_VARIANTS[JACOBI_FILE])
    return module.get_function(jacobi_name(dt, ix)).kernel.ptr


def _gpu_blocks(A, n, bs, dtype):
    """(full, last) of a CuPy matrix on the device without a COO detour, or
    None (complex data: the general path). A sparse ``A`` goes through CSR
    (one kernel reads each row once); a dense C-contiguous one is copied
    through a strided view of its diagonal blocks."""
    cp = import_cupy()
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    nfull = n // bs
    split = nfull * bs
    rest = n - split
    if not is_cupy_sparse(A):
        a = cp.asarray(A)
        if not a.flags.c_contiguous:
            return None
        item = a.itemsize
        full = cp.lib.stride_tricks.as_strided(
            a, shape=(nfull, bs, bs), strides=((n + 1) * bs * item, n * item, item))
        return (cp.ascontiguousarray(full, dtype=dt),
                cp.ascontiguousarray(a[split:, split:], dtype=dt))
    csr = A if A.format == "csr" else A.tocsr()
    data = csr.data if csr.data.dtype == dt else csr.data.astype(dt)
    indptr, indices = csr.indptr, csr.indices
    if indptr.dtype != indices.dtype or indices.dtype not in (np.int32, np.int64):
        indptr, indices = indptr.astype(np.int64), indices.astype(np.int64)
    full, last = _gc.alloc_outputs((((nfull, bs, bs), dt), ((rest, rest), dt)))
    if n:
        grid = max(1, min(_GATHER_MAX_BLOCKS, -(-n // _GATHER_THREADS)))
        _gc.launch(_gather_function(_gc.dtname(dt), _gc.dtname(indices.dtype),
                                    _gc.device_id()), grid,
                   _GATHER_THREADS, 0,
                   (indptr.data.ptr, indices.data.ptr, data.data.ptr, n, bs, split,
                    full.data.ptr, last.data.ptr))
    return full, last


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
        shape, adt = A.shape, A.dtype
    else:
        xp = np
        LinearOperator = spla.LinearOperator
        A = sps.coo_matrix(A)
        shape, adt = A.shape, A.dtype
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"block_jacobi: A must be square, got shape {tuple(shape)}")
    n = shape[0]
    dtype = np.promote_types(adt, np.float32)
    if np.dtype(dtype).kind not in "fc":
        dtype = np.float64
    blocks = _gpu_blocks(A, n, bs, dtype) if on_gpu else None
    if blocks is None:
        if on_gpu:
            import cupyx.scipy.sparse as xsp
            A = xsp.coo_matrix(A) if is_cupy_sparse(A) else xsp.coo_matrix(xp.asarray(A))
        blocks = _blocks(A.row.astype(np.int64), A.col.astype(np.int64), A.data, n, bs,
                         xp, dtype)
    full, last = blocks
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
