"""The batched functions on Dask arrays: the public function once per chunk.

A stack ``a`` of shape ``(..., n, n)`` is a Dask array chunked along its
batch axes; its matrix axes are rechunked to one chunk each when they are
split (a chunk must hold whole matrices; the rechunk moves data, so chunk
only the batch axes when you can). Each chunk is computed by the function of
:mod:`scipy_gpuqr.batched` where the chunk lives: CuPy chunks on that
worker's GPU, NumPy chunks on its CPU, or on its GPU with ``backend='gpu'``
(the result then comes back as NumPy, as for a NumPy call). The results are
Dask arrays with the batch chunks of the inputs; nothing is computed until
the caller computes or persists them. Shapes and dtypes are checked when the
graph is built, by the public function itself on one identity matrix (which
also gives the output dtypes).

Right-hand sides ``b`` of shape ``(n,)`` go whole to every chunk; those of
shape ``(..., n, k)`` are chunked like the stack (a batch axis of length 1
is broadcast, as in the NumPy call). NumPy or CuPy arguments next to a Dask
one are wrapped as Dask arrays and split to match.

Singular matrices and ``info``, per chunk
-----------------------------------------
With ``return_info=True``, ``info`` is one more Dask array (chunked like the
batch) and nothing is warned or raised, exactly as in the NumPy call.

Without it each chunk's task asks the public function for ``info`` and
inspects it itself when it runs, so the message names matrices by their
*global* batch index:

* ``inv_batched``, ``solve_batched`` and ``cho_factor_batched`` raise
  ``LinAlgError`` in the first task that meets a singular (not positive
  definite) matrix; Dask re-raises it where the result is computed. It names
  the offending matrices of that chunk only (up to 10) and the chunk's batch
  range: other chunks may hold more, and results of chunks that succeeded
  may already have been computed.
* ``lu_factor_batched`` warns (``LinAlgWarning``, global indices) where the
  task runs: in the calling process under Dask's local schedulers, in the
  worker's log on a ``dask.distributed`` cluster, where the client sees no
  warning. Ask ``return_info=True`` to see singular matrices in the client.
* With ``check_finite``, infs or NaNs raise ``ValueError`` from the chunk's
  task: the message is the public function's, whose indices count within the
  chunk, followed by the chunk's batch range.
"""

from __future__ import annotations

import contextlib
import math
import operator
import warnings

import dask.array as da
from dask import is_dask_collection
import numpy as np
from dask.array.utils import meta_from_array
from scipy.linalg import LinAlgError, LinAlgWarning

from ..batched import _functions as _f
from ..batched._common import (bad_indices, batch_names, check_square_stack, cholesky_pair,
                               info_counts, lu_pair)

__all__ = ["lu_factor_batched", "lu_solve_batched", "solve_batched",
           "inv_batched", "cho_factor_batched", "cho_solve_batched"]


# ----------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------

#: blockwise indices of the matrix axes (rows, columns); "k" is b's columns
IJ, I = ("i", "j"), ("i",)


def _batch_ind(nb: int) -> tuple:
    """Blockwise indices of ``nb`` batch axes."""
    return tuple(f"b{k}" for k in range(nb))


def _as_dask(x, name: str, where: str) -> da.Array:
    """``x`` as a Dask array (a NumPy or CuPy array becomes one chunk)."""
    if isinstance(x, da.Array):
        if any(math.isnan(s) for s in x.shape):
            raise ValueError(f"{where}: {name} has unknown chunk sizes; call "
                             f"{name}.compute_chunk_sizes() first")
        return x
    if is_dask_collection(x):
        raise TypeError(f"{where}: {name} must be a Dask array, got "
                        f"{type(x).__module__}.{type(x).__name__}")
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    return da.from_array(x, chunks=-1)


def _whole_matrices(x: da.Array, core: int) -> da.Array:
    """``x`` with its last ``core`` axes in one chunk each."""
    axes = range(x.ndim - core, x.ndim)
    if all(len(x.chunks[ax]) <= 1 for ax in axes):
        return x
    return x.rechunk({ax: -1 for ax in axes})


def _stack(a, name: str, where: str) -> da.Array:
    """A validated Dask stack ``(..., n, n)`` with whole matrices in its chunks."""
    a = _as_dask(a, name, where)
    check_square_stack(a.shape, where, name)
    return _whole_matrices(a, 2)


def _rhs(b, batch_shape, where: str):
    """(b as a Dask array with whole right-hand sides, its blockwise index, probe b)."""
    b = _as_dask(b, "b", where)
    if b.ndim == 0:
        raise ValueError(f"{where}: b must be at least 1-D, got a scalar")
    if b.ndim == 1:
        return _whole_matrices(b, 1), I, np.zeros(b.shape, b.dtype)
    bb = tuple(b.shape[:-2])
    try:
        out = tuple(np.broadcast_shapes(batch_shape, bb))
    except ValueError:
        raise ValueError(f"{where}: batch shapes {batch_shape} and {bb} do not "
                         "broadcast") from None
    if out != batch_shape:
        raise ValueError(f"{where}: b's batch shape {bb} would enlarge the "
                         f"factors' batch {batch_shape}")
    ind = _batch_ind(len(batch_shape))[len(batch_shape) - len(bb):] + ("i", "k")
    return _whole_matrices(b, 2), ind, np.zeros(b.shape[-2:], b.dtype)


def _probe_stack(n: int, dtype) -> np.ndarray:
    """One ``n x n`` identity (zeros for a non-numeric dtype) of ``dtype``, batch (1,)."""
    s = np.zeros((1, n, n), dtype=dtype)
    if s.dtype.kind in "biufc":
        s[0][np.diag_indices(n)] = 1
    return s


# ----------------------------------------------------------------------------
# the graph: one task per chunk, outputs taken from its tuple
# ----------------------------------------------------------------------------

def _build(where, chunk_fn, inputs, batch_shape, batch_chunks, outputs, like, **kwargs):
    """Dask arrays computed by ``chunk_fn`` once per batch chunk.

    ``inputs``: (Dask array, blockwise index) pairs; every batch axis also
    passes an ``arange`` chunk, from which ``chunk_fn`` knows where its chunk
    starts. ``outputs``: (blockwise index, shape, dtype) of the matrix axes
    of what ``chunk_fn`` returns (one array, or a tuple of them; the index
    matters for one array only); ``like``: an array of the output type (NumPy
    or CuPy) for the metadata.
    """
    nb = len(batch_shape)
    bind = _batch_ind(nb)
    args = []
    for x, ind in inputs:
        args += [x, ind]
    for k in range(nb):
        args += [da.arange(batch_shape[k], chunks=(batch_chunks[k],)), (bind[k],)]
    kwargs["batch_shape"] = tuple(batch_shape)
    if len(outputs) == 1:
        (core_ind, core, dtype), = outputs
        out = da.blockwise(chunk_fn, bind + core_ind, *args, token=where,
                           dtype=dtype, meta=_meta(like, nb + len(core), dtype),
                           concatenate=True, **kwargs)
        return (out,)
    tasks = da.blockwise(chunk_fn, bind, *args, token=where,
                         meta=np.empty((0,) * nb, dtype=object), concatenate=True,
                         **kwargs)
    return tuple(
        tasks.map_blocks(operator.getitem, i, new_axis=list(range(nb, nb + len(core))) or None,
                         chunks=tasks.chunks + tuple((c,) for c in core), dtype=dtype,
                         meta=_meta(like, nb + len(core), dtype))
        for i, (_, core, dtype) in enumerate(outputs))


def _meta(like, ndim: int, dtype):
    """An empty array of ``like``'s type (NumPy or CuPy), ``ndim`` and ``dtype``."""
    return np.empty_like(meta_from_array(like, ndim=ndim), dtype=dtype)


def _starts(offsets) -> tuple:
    """Where a chunk starts along each batch axis (from its ``arange`` chunks)."""
    return tuple(int(o[0]) if o.size else 0 for o in offsets)


def _chunk_range(starts, chunk_batch) -> str:
    """A chunk's batch range as text, e.g. ``[6:9, 0:4]``."""
    return "[" + ", ".join(f"{s}:{s + c}" for s, c in zip(starts, chunk_batch)) + "]"


@contextlib.contextmanager
def _in_chunk(starts, chunk_batch):
    """ValueError of a chunk's call, with the chunk's batch range added."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{exc} (batch indices counted within the Dask chunk of "
                         f"batch indices {_chunk_range(starts, chunk_batch)})") from None


def _bad(info, starts, batch_shape):
    """None, or (global names of a chunk's matrices with info > 0, info of the
    first, where they were found) for the messages."""
    if not info_counts(info)[0]:
        return None
    first, total = bad_indices(info > 0)
    first = np.asarray(first, dtype=np.int64)
    if batch_shape:
        local = np.unravel_index(first, tuple(info.shape))
        glob = np.ravel_multi_index(tuple(i + s for i, s in zip(local, starts)),
                                    batch_shape)
    else:
        glob = first
    return (batch_names(glob, batch_shape, total), int(info.reshape(-1)[int(first[0])]),
            f"in the Dask chunk of batch indices {_chunk_range(starts, info.shape)}; "
            "other chunks report their own")


# ----------------------------------------------------------------------------
# per-chunk calls (run by the workers)
# ----------------------------------------------------------------------------

def _lu_factor_chunk(a, *offsets, batch_shape, return_info, **kw):
    """(lu, piv[, info]) of one chunk; warns about its singular matrices by global index."""
    starts = _starts(offsets)
    with _in_chunk(starts, a.shape[:-2]):
        lu, piv, info = _f.lu_factor_batched(a, return_info=True, **kw)
    if return_info:
        return lu, piv, info
    bad = _bad(info, starts, batch_shape)
    if bad:
        warnings.warn(f"lu_factor_batched: exactly singular matrices at batch "
                      f"index {bad[0]} (first: diagonal number {bad[1]} is "
                      f"exactly zero; {bad[2]}). Singular matrix.", LinAlgWarning,
                      stacklevel=2)
    return lu, piv


def _raise_singular(where, bad):
    """LinAlgError naming a chunk's singular matrices (``bad`` from :func:`_bad`)."""
    raise LinAlgError(f"{where}: singular matrix at batch index {bad[0]} "
                      f"(U[k, k] exactly zero; {bad[2]})")


def _inv_chunk(a, *offsets, batch_shape, return_info, **kw):
    """The inverses of one chunk[, info]; LinAlgError for a singular one (global index)."""
    starts = _starts(offsets)
    with _in_chunk(starts, a.shape[:-2]):
        x, info = _f.inv_batched(a, return_info=True, **kw)
    if return_info:
        return x, info
    bad = _bad(info, starts, batch_shape)
    if bad:
        _raise_singular("inv_batched", bad)
    return x


def _solve_chunk(a, b, *offsets, batch_shape, return_info, **kw):
    """x of one chunk[, info]; LinAlgError for a singular matrix (global index)."""
    starts = _starts(offsets)
    with _in_chunk(starts, a.shape[:-2]):
        x, info = _f.solve_batched(a, b, return_info=True, **kw)
    if return_info:
        return x, info
    bad = _bad(info, starts, batch_shape)
    if bad:
        _raise_singular("solve_batched", bad)
    return x


def _cho_factor_chunk(a, *offsets, batch_shape, return_info, lower, **kw):
    """c of one chunk[, info]; LinAlgError for a matrix not positive definite (global index)."""
    starts = _starts(offsets)
    with _in_chunk(starts, a.shape[:-2]):
        c, _, info = _f.cho_factor_batched(a, lower, return_info=True, **kw)
    if return_info:
        return c, info
    bad = _bad(info, starts, batch_shape)
    if bad:
        raise LinAlgError(f"cho_factor_batched: not positive definite at batch "
                          f"index {bad[0]} (the {bad[1]}-th leading minor of the "
                          f"first is not positive definite; {bad[2]})")
    return c


def _lu_solve_chunk(lu, piv, b, *offsets, batch_shape, trans, **kw):
    """x of one chunk from its LU factors."""
    with _in_chunk(_starts(offsets), lu.shape[:-2]):
        return _f.lu_solve_batched((lu, piv), b, trans, **kw)


def _cho_solve_chunk(c, b, *offsets, batch_shape, lower, **kw):
    """x of one chunk from its Cholesky factor."""
    with _in_chunk(_starts(offsets), c.shape[:-2]):
        return _f.cho_solve_batched((c, lower), b, **kw)


# ----------------------------------------------------------------------------
# the Dask versions of the public functions (same signatures)
# ----------------------------------------------------------------------------

def _info(return_info: bool, info) -> list:
    """The spec of the ``info`` output, when asked for."""
    return [((), (), info.dtype)] if return_info else []


def _x(bind, x) -> list:
    """The spec of a solve's output, from the probe's ``x`` and b's index."""
    return [(bind[1 - x.ndim:], x.shape[1:], x.dtype)]


def lu_factor_batched(a, *, overwrite_a=False, check_finite=True,
                      return_info=False, backend=None):
    """:func:`scipy_gpuqr.lu_factor_batched` of a Dask stack: Dask ``lu, piv[, info]``."""
    where = "lu_factor_batched"
    a = _stack(a, "a", where)
    nb, n = a.ndim - 2, a.shape[-1]
    lu, piv, info = _f.lu_factor_batched(_probe_stack(n, a.dtype), return_info=True,
                                         backend="cpu")
    outs = [(IJ, (n, n), lu.dtype), (I, (n,), piv.dtype)] + _info(return_info, info)
    return _build(where, _lu_factor_chunk, [(a, _batch_ind(nb) + IJ)],
                  a.shape[:-2], a.chunks[:-2], outs, a._meta,
                  return_info=return_info, overwrite_a=overwrite_a,
                  check_finite=check_finite, backend=backend)


def inv_batched(a, *, check_finite=True, return_info=False, backend=None):
    """:func:`scipy_gpuqr.inv_batched` of a Dask stack: Dask ``ainv[, info]``."""
    where = "inv_batched"
    a = _stack(a, "a", where)
    nb, n = a.ndim - 2, a.shape[-1]
    x, info = _f.inv_batched(_probe_stack(n, a.dtype), return_info=True, backend="cpu")
    outs = [(IJ, (n, n), x.dtype)] + _info(return_info, info)
    out = _build(where, _inv_chunk, [(a, _batch_ind(nb) + IJ)],
                 a.shape[:-2], a.chunks[:-2], outs, a._meta, return_info=return_info,
                 check_finite=check_finite, backend=backend)
    return out if return_info else out[0]


def solve_batched(a, b, *, check_finite=True, return_info=False, backend=None):
    """:func:`scipy_gpuqr.solve_batched` with Dask ``a`` or ``b``: Dask ``x[, info]``."""
    where = "solve_batched"
    a = _stack(a, "a", where)
    nb, n = a.ndim - 2, a.shape[-1]
    b, bind, bprobe = _rhs(b, a.shape[:-2], where)
    x, info = _f.solve_batched(_probe_stack(n, a.dtype), bprobe, return_info=True,
                               backend="cpu")
    outs = _x(bind, x) + _info(return_info, info)
    out = _build(where, _solve_chunk, [(a, _batch_ind(nb) + IJ), (b, bind)],
                 a.shape[:-2], a.chunks[:-2], outs, a._meta, return_info=return_info,
                 check_finite=check_finite, backend=backend)
    return out if return_info else out[0]


def cho_factor_batched(a, lower=False, *, overwrite_a=False, check_finite=True,
                       return_info=False, backend=None):
    """:func:`scipy_gpuqr.cho_factor_batched` of a Dask stack: Dask ``c``, ``lower``[, Dask ``info``]."""
    where = "cho_factor_batched"
    a = _stack(a, "a", where)
    nb, n = a.ndim - 2, a.shape[-1]
    lower = bool(lower)
    c, _, info = _f.cho_factor_batched(_probe_stack(n, a.dtype), lower,
                                       return_info=True, backend="cpu")
    outs = [(IJ, (n, n), c.dtype)] + _info(return_info, info)
    out = _build(where, _cho_factor_chunk, [(a, _batch_ind(nb) + IJ)],
                 a.shape[:-2], a.chunks[:-2], outs, a._meta, return_info=return_info,
                 lower=lower, overwrite_a=overwrite_a, check_finite=check_finite,
                 backend=backend)
    return (out[0], lower, out[1]) if return_info else (out[0], lower)


def lu_solve_batched(lu_and_piv, b, trans=0, *, overwrite_b=False,
                     check_finite=True, backend=None):
    """:func:`scipy_gpuqr.lu_solve_batched` with Dask factors or ``b``: Dask ``x``."""
    where = "lu_solve_batched"
    lu, piv = lu_pair(lu_and_piv, where)
    lu = _stack(lu, "lu", where)
    nb, n = lu.ndim - 2, lu.shape[-1]
    piv = _whole_matrices(_as_dask(piv, "piv", where), 1)
    if tuple(piv.shape) != tuple(lu.shape[:-1]):
        raise ValueError(f"{where}: piv must have shape {tuple(lu.shape[:-1])}, "
                         f"got {tuple(piv.shape)}")
    b, bind, bprobe = _rhs(b, lu.shape[:-2], where)
    x = _f.lu_solve_batched((_probe_stack(n, lu.dtype), np.arange(n, dtype=np.int32)[None]),
                            bprobe, trans, backend="cpu")
    return _build(where, _lu_solve_chunk,
                  [(lu, _batch_ind(nb) + IJ), (piv, _batch_ind(nb) + I),
                   (b, bind)],
                  lu.shape[:-2], lu.chunks[:-2], _x(bind, x), lu._meta,
                  trans=trans, overwrite_b=overwrite_b, check_finite=check_finite,
                  backend=backend)[0]


def _lower(lower, where) -> bool:
    """The one ``lower`` flag of a ``(c, lower)`` pair (a bool or an array of equal bools)."""
    if is_dask_collection(lower):
        lower = lower.compute()
    return _f._lower_flag(lower, where)


def cho_solve_batched(c_and_lower, b, *, overwrite_b=False, check_finite=True,
                      backend=None):
    """:func:`scipy_gpuqr.cho_solve_batched` with a Dask factor or ``b``: Dask ``x``."""
    where = "cho_solve_batched"
    c, lower = cholesky_pair(c_and_lower, where)
    lower = _lower(lower, where)
    c = _stack(c, "c", where)
    nb, n = c.ndim - 2, c.shape[-1]
    b, bind, bprobe = _rhs(b, c.shape[:-2], where)
    x = _f.cho_solve_batched((_probe_stack(n, c.dtype), lower), bprobe, backend="cpu")
    return _build(where, _cho_solve_chunk,
                  [(c, _batch_ind(nb) + IJ), (b, bind)],
                  c.shape[:-2], c.chunks[:-2], _x(bind, x), c._meta,
                  lower=lower, overwrite_b=overwrite_b, check_finite=check_finite,
                  backend=backend)[0]
