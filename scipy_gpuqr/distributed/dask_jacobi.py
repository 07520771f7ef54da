"""Block-Jacobi on Dask: the diagonal blocks of a Dask matrix, inverted chunk by chunk.

:func:`scipy_gpuqr.block_jacobi` sends Dask input here. Two forms are taken:

* a square Dask matrix ``A`` of shape ``(n, n)``, whose chunks are dense
  (NumPy or CuPy) or sparse (``scipy.sparse`` or ``cupyx.scipy.sparse``
  matrices, e.g. ``da.from_array(A_csr, chunks=..., asarray=False)``). Its
  ``block_size`` diagonal blocks are gathered into a Dask stack
  ``(n // block_size, block_size, block_size)`` along its row chunks: one
  task per row chunk reads only the diagonal part of that chunk (no data
  off the diagonal moves; a block crossing a chunk boundary joins the
  next chunk's task). A ragged last block (``block_size`` does not divide
  ``n``) is inverted on its own, as in the NumPy call;
* a Dask stack of shape ``(nblocks, bs, bs)``: the diagonal blocks
  themselves (e.g. element matrices built on the workers), chunked along
  the block axis; ``block_size`` must be ``bs``. The operator is then
  ``blockdiag(blocks[0]⁻¹, blocks[1]⁻¹, ...)`` of order ``nblocks * bs``.

The inverses are a Dask array (:attr:`DaskBlockJacobi.blocks`), one
:func:`scipy_gpuqr.inv_batched` call per chunk on the worker that holds it
(CuPy chunks on its GPU; NumPy chunks on its CPU, or its GPU with
``backend='gpu'``). Nothing is computed when the operator is built: a
singular block raises ``LinAlgError`` (naming the block by its global index
and the chunk it is in) where the inverses are first computed, by
:meth:`DaskBlockJacobi.persist` or by the first product.

The operator is a ``scipy.sparse.linalg.LinearOperator`` that also takes
Dask and CuPy vectors: ``M @ x`` (``matvec``, ``matmat``, ``dot``) of a Dask
``x`` of shape ``(n,)`` or ``(n, k)`` is a Dask array, one batched product
per chunk where the inverses live (``x`` is rechunked to their rows); of a
NumPy or CuPy ``x`` it is computed at once (each product a Dask
computation: call :meth:`~DaskBlockJacobi.persist` first, so that the
blocks are inverted once, not per product; it waits for them on a cluster
and raises for a singular block) and has ``x``'s type. SciPy's
``cg``/``gmres`` take it as ``M=`` for NumPy vectors, cupyx's (which wrap
any object with ``shape``, ``dtype`` and ``matvec``) for CuPy ones.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sps
import scipy.sparse.linalg as spla
import dask
import dask.array as da
from dask.array.utils import meta_from_array
from scipy.linalg import LinAlgError

from .._gpu import is_cupy_array, is_cupy_sparse
from ..batched import _functions as _f
from ..batched import _jacobi
from .dask_batched import _as_dask, _bad, _build, _in_chunk, _stack, _starts, _whole_matrices

__all__ = ["block_jacobi", "DaskBlockJacobi"]

WHERE = "block_jacobi"


# ----------------------------------------------------------------------------
# the diagonal blocks of a Dask matrix
# ----------------------------------------------------------------------------

def _xp_of(x):
    """NumPy or CuPy, the array module of a (dense or sparse) chunk."""
    if is_cupy_array(x) or is_cupy_sparse(x):
        import cupy
        return cupy
    return np


def _diag_blocks(sub, *, bs: int, out_dtype):
    """The ``bs x bs`` diagonal blocks of a square chunk ``sub`` (order a multiple of ``bs``)."""
    m = sub.shape[0]
    nb = m // bs
    xp = _xp_of(sub)
    if sps.issparse(sub) or is_cupy_sparse(sub):
        coo = sub.tocoo()
        full, _ = _jacobi._blocks(coo.row.astype(np.int64), coo.col.astype(np.int64),
                                  coo.data, m, bs, xp, out_dtype)
        return full
    sub = xp.asarray(sub)
    i = xp.arange(nb)
    return xp.ascontiguousarray(sub.reshape(nb, bs, nb, bs)[i, :, i, :].astype(out_dtype))


def _dense_meta(A: da.Array, ndim: int, dtype):
    """An empty dense array (NumPy, or CuPy for CuPy or cupyx chunks) for the blocks."""
    meta = A._meta
    if is_cupy_sparse(meta):
        import cupy
        return cupy.empty((0,) * ndim, dtype=dtype)
    if sps.issparse(meta):
        return np.empty((0,) * ndim, dtype=dtype)
    return np.empty_like(meta_from_array(meta, ndim=ndim), dtype=dtype)


def _segments(row_chunks, bs: int, split: int) -> list:
    """Row ranges ``[r0, r1)`` of whole blocks, one per row chunk (its end rounded
    down to a block boundary; a chunk holding no block boundary joins the next)."""
    ends = np.cumsum(row_chunks)
    cuts = sorted({0, split} | {int(e) // bs * bs for e in ends if int(e) // bs * bs < split})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _gather(A: da.Array, r0: int, r1: int, bs: int, dtype) -> da.Array:
    """The diagonal blocks of rows ``[r0, r1)`` as a one-chunk Dask stack."""
    sub = A[r0:r1, r0:r1]
    if len(sub.chunks[0]) > 1 or len(sub.chunks[1]) > 1:
        sub = sub.rechunk(-1)
    nb = (r1 - r0) // bs
    return da.map_blocks(_diag_blocks, sub, bs=bs, out_dtype=dtype, dtype=dtype, new_axis=[0],
                         chunks=((nb,), (bs,), (bs,)), meta=_dense_meta(A, 3, dtype))


def _result_dtype(dtype) -> np.dtype:
    """The operator's dtype, as :func:`scipy_gpuqr.block_jacobi` picks it."""
    out = np.promote_types(dtype, np.float32)
    return np.dtype(out if out.kind in "fc" else np.float64)


# ----------------------------------------------------------------------------
# inversion, per chunk
# ----------------------------------------------------------------------------

def _inv_chunk(a, loc, *, batch_shape, bs, last_at, **kw):
    """The inverses of one chunk of blocks; LinAlgError names a singular one globally."""
    starts = _starts(loc)
    with _in_chunk(starts, a.shape[:1]):
        x, info = _f.inv_batched(a, return_info=True, **kw)
    bad = _bad(info, starts, batch_shape)
    if bad:
        if last_at is not None:
            raise LinAlgError(f"{WHERE}: the ragged last diagonal block (block index "
                              f"{last_at}, rows {last_at * bs}:{last_at * bs + a.shape[-1]}) "
                              "is singular")
        raise LinAlgError(f"{WHERE}: singular diagonal block(s) of size {bs} (block index "
                          f"= batch index, rows [index*{bs}, index*{bs}+{bs})): singular "
                          f"matrix at block index {bad[0]} (U[k, k] exactly zero; {bad[2]})")
    return x


def _invert(blocks: da.Array, bs: int, last_at, *, check_finite, backend) -> da.Array:
    """The Dask stack of the blocks' inverses (chunked like ``blocks``)."""
    n = blocks.shape[-1]
    return _build(WHERE, _inv_chunk, [(blocks, ("b0", "i", "j"))], ("b0", "i", "j"),
                  [(("i", "j"), (n, n), blocks.dtype)], blocks._meta,
                  bs=bs, last_at=last_at, check_finite=check_finite, backend=backend)[0]


# ----------------------------------------------------------------------------
# the operator
# ----------------------------------------------------------------------------

def _to_blocks(x, *, bs: int):
    """Rows ``(nb * bs, k)`` of a chunk as ``(nb, bs, k)``."""
    return x.reshape(-1, bs, x.shape[-1])


def _apply_chunk(inv, x):
    """``inv @ x`` per block, ``x`` moved to the inverses' device when it is not there."""
    xp = _xp_of(inv)
    return xp.matmul(inv, xp.asarray(x))


def _to_rows(y):
    """Blocks ``(nb, bs, k)`` of a chunk as rows ``(nb * bs, k)``."""
    return y.reshape(-1, y.shape[-1])


def _apply(inv: da.Array, x: da.Array, dtype) -> da.Array:
    """``blockdiag(inv) @ x`` for Dask ``inv`` ``(nb, bs, bs)`` and ``x`` ``(nb * bs, k)``."""
    bs = inv.shape[-1]
    k = x.shape[1]
    rows = tuple(c * bs for c in inv.chunks[0])
    x = x.rechunk((rows, (k,)))
    x3 = x.map_blocks(_to_blocks, bs=bs, new_axis=[1], chunks=(inv.chunks[0], (bs,), (k,)),
                      dtype=x.dtype)
    meta = np.empty_like(meta_from_array(inv._meta, ndim=3), dtype=dtype)
    y3 = da.blockwise(_apply_chunk, "zik", inv, "zij", x3, "zjk", dtype=dtype, meta=meta,
                      concatenate=True)
    return y3.map_blocks(_to_rows, drop_axis=[1], chunks=(rows, (k,)), dtype=dtype,
                         meta=np.empty_like(meta_from_array(inv._meta, ndim=2), dtype=dtype))


def _module_of(x):
    """``'cupy'`` or ``'numpy'``: where a non-Dask vector lives."""
    return "cupy" if is_cupy_array(x) else "numpy"


def _wait_and_raise(collections) -> None:
    """Wait for persisted collections on a ``dask.distributed`` cluster and raise the
    first failed task's exception (local schedulers have computed them already)."""
    try:
        from distributed import futures_of, wait
    except ImportError:                 # only local schedulers exist
        return
    futures = futures_of(collections)
    if futures:
        wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()


class DaskBlockJacobi(spla.LinearOperator):
    """``blockdiag(B_1⁻¹, B_2⁻¹, ...)`` with the inverses held as a Dask array.

    Made by :func:`scipy_gpuqr.block_jacobi` for Dask input (see
    :mod:`scipy_gpuqr.distributed.dask_jacobi`).

    Attributes
    ----------
    blocks : dask.array.Array, shape (n // block_size, block_size, block_size)
        The inverted full blocks, chunked along the block axis.
    last : dask.array.Array or None, shape (r, r)
        The inverted ragged last block (None when ``block_size`` divides ``n``).
    block_size : int
    """

    def __init__(self, blocks: da.Array, last, n: int, block_size: int, dtype):
        self.blocks, self.last = blocks, last
        self.block_size = int(block_size)
        self._n = int(n)
        super().__init__(dtype=np.dtype(dtype), shape=(int(n), int(n)))

    def persist(self, **kwargs) -> "DaskBlockJacobi":
        """The same operator with its inverses computed and kept where they were
        computed (``dask.persist``, keyword arguments go to it; on a
        ``dask.distributed`` cluster this waits for them). Raises
        ``LinAlgError`` for a singular block."""
        parts = [self.blocks] + ([self.last] if self.last is not None else [])
        done = dask.persist(*parts, **kwargs)
        _wait_and_raise(done)
        return DaskBlockJacobi(done[0], done[1] if self.last is not None else None,
                               self._n, self.block_size, self.dtype)

    # -- products -----------------------------------------------------------------
    def _dask_apply(self, x: da.Array) -> da.Array:
        n, split = self._n, self.blocks.shape[0] * self.block_size
        if x.ndim not in (1, 2) or x.shape[0] != n:
            raise ValueError(f"{WHERE}: dimension mismatch: operator of shape {self.shape}, "
                             f"x of shape {tuple(x.shape)}")
        if any(np.isnan(s) for s in x.shape):
            raise ValueError(f"{WHERE}: x has unknown chunk sizes; call "
                             "x.compute_chunk_sizes() first")
        x2 = x.reshape(n, 1) if x.ndim == 1 else x
        dtype = np.promote_types(self.dtype, x.dtype)
        parts = []
        if split:
            parts.append(_apply(self.blocks, x2[:split], dtype))
        if self.last is not None:
            last = self.last[None]
            parts.append(_apply(last, x2[split:], dtype))
        y = parts[0] if len(parts) == 1 else da.concatenate(parts, axis=0)
        return y.reshape(n) if x.ndim == 1 else y

    def _apply_now(self, x):
        """A NumPy or CuPy ``x`` through the Dask product, back as ``x``'s type."""
        rows = tuple(c * self.block_size for c in self.blocks.chunks[0])
        if self.last is not None:
            rows += (self.last.shape[0],)
        chunks = (rows,) if x.ndim == 1 else (rows, (x.shape[1],))
        y = self._dask_apply(da.from_array(x, chunks=chunks)).compute()
        if _module_of(x) == "cupy":
            import cupy
            return cupy.asarray(y)
        return y.get() if is_cupy_array(y) else np.asarray(y)

    def _matvec(self, x):
        return self._apply_now(x)

    def _matmat(self, X):
        return self._apply_now(X)

    def _adjoint(self):
        raise NotImplementedError(f"{WHERE}: the adjoint of a block-Jacobi operator is not "
                                  "provided (as for the NumPy operator)")

    def matvec(self, x):
        """``M @ x`` for ``x`` of shape ``(n,)`` or ``(n, 1)``: Dask in, Dask out;
        NumPy or CuPy in, the same out (computed now)."""
        if isinstance(x, da.Array):
            return self._dask_apply(x)
        if is_cupy_array(x):
            if x.shape not in ((self._n,), (self._n, 1)):
                raise ValueError("dimension mismatch")
            return self._apply_now(x)
        return super().matvec(x)

    def matmat(self, X):
        """``M @ X`` for ``X`` of shape ``(n, k)`` (Dask, NumPy or CuPy)."""
        if isinstance(X, da.Array):
            if X.ndim != 2:
                raise ValueError(f"expected 2-d Dask array, got {X.ndim}-d")
            return self._dask_apply(X)
        if is_cupy_array(X):
            if X.ndim != 2 or X.shape[0] != self._n:
                raise ValueError("dimension mismatch")
            return self._apply_now(X)
        return super().matmat(X)

    def dot(self, x):
        """``M @ x``: Dask and CuPy arrays of 1 or 2 dimensions, else as SciPy's."""
        if isinstance(x, da.Array) or is_cupy_array(x):
            return self.matvec(x) if x.ndim == 1 else self.matmat(x)
        return super().dot(x)

    def _repr_extra(self) -> str:
        return f"block_size={self.block_size}, nblocks={self.blocks.shape[0]}"


# ----------------------------------------------------------------------------
# the Dask version of the public function
# ----------------------------------------------------------------------------

def block_jacobi(A, block_size, *, check_finite=True, backend=None) -> DaskBlockJacobi:
    """:func:`scipy_gpuqr.block_jacobi` of a Dask matrix ``(n, n)`` or a Dask stack of
    diagonal blocks ``(nblocks, bs, bs)``: a :class:`DaskBlockJacobi` (nothing computed)."""
    bs = _jacobi.check_block_size(block_size)
    A = _as_dask(A, "A", WHERE)
    if A.ndim == 3:
        if A.shape[-1] != bs or A.shape[-2] != bs:
            raise ValueError(f"{WHERE}: a stack of diagonal blocks of shape {tuple(A.shape)} "
                             f"needs block_size={A.shape[-1]} (square blocks), got {bs}")
        blocks = _stack(A, "A", WHERE)
        dtype = _result_dtype(blocks.dtype)
        blocks = blocks.astype(dtype) if blocks.dtype != dtype else blocks
        inv = _invert(blocks, bs, None, check_finite=check_finite, backend=backend)
        return DaskBlockJacobi(inv, None, blocks.shape[0] * bs, bs, dtype)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"{WHERE}: A must be square, or a stack of square diagonal "
                         f"blocks, got shape {tuple(A.shape)}")
    n = int(A.shape[0])
    dtype = _result_dtype(A.dtype)
    nfull = n // bs
    split = nfull * bs
    stacks = [_gather(A, r0, r1, bs, dtype) for r0, r1 in _segments(A.chunks[0], bs, split)]
    if stacks:
        full = stacks[0] if len(stacks) == 1 else da.concatenate(stacks, axis=0)
    else:
        full = da.from_array(np.zeros((0, bs, bs), dtype), chunks=-1)
    inv_full = _invert(full, bs, None, check_finite=check_finite, backend=backend)
    inv_last = None
    if split < n:
        last = _whole_matrices(_gather(A, split, n, n - split, dtype), 2)
        inv_last = _invert(last, bs, nfull, check_finite=check_finite, backend=backend)[0]
    return DaskBlockJacobi(inv_full, inv_last, n, bs, dtype)
