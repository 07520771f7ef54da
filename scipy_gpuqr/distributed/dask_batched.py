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

The graph: one task per chunk
-----------------------------
Each chunk is one task: the public function's call, which returns a tuple
when it has several outputs (``lu, piv[, info]``); each output array takes
its item of that tuple. The task's blockwise index contracts no axis (the
matrix axes are one chunk), and where a chunk starts along the batch axes
comes from Dask's block-slice dependency, not from a task. So Dask's graph
optimization fuses a blockwise producer of the input (``from_array``,
``map_blocks``, elementwise arithmetic) into the task and the item pick
into a blockwise consumer (``lu_solve_batched`` of ``lu, piv``, a
``blockwise`` or ``map_blocks`` that keeps the batch and matrix axes): a
chunk generated, factorized and solved is one task. On a
``dask.distributed`` cluster every task costs a round trip through the
scheduler between the tasks of a chain (GPU chunks: time in which the GPU
waits), so the fewer the better; the output keys themselves stay, as
aliases of the fused tasks. A task on CuPy chunks waits for its GPU once,
as the CuPy call does, to raise or warn; ``return_info=True,
check_finite=False`` makes a chunk's call fully asynchronous (the
task returns once its kernels are queued).

Right-hand sides ``b`` of shape ``(n,)`` go whole to every chunk; those of
shape ``(..., n, k)`` are chunked like the stack (a batch axis of length 1
is broadcast, as in the NumPy call). NumPy or CuPy arguments next to a Dask
one are wrapped as Dask arrays and split to match.

Singular matrices and ``info``, per chunk
-----------------------------------------
With ``return_info=True``, ``info`` is one more Dask array (chunked like the
batch) and nothing is warned or raised, exactly as in the NumPy call.

Without it each chunk's task makes the public call as a NumPy or CuPy
caller would (on a GPU: one wait for the call's 32-byte status, which says
whether anything is wrong) and names the offending matrices by their
*global* batch index:

* ``inv_batched``, ``solve_batched`` and ``cho_factor_batched`` raise
  ``LinAlgError`` in the first task that meets a singular (not positive
  definite) matrix; Dask re-raises it where the result is computed. It names
  the offending matrices of that chunk only (up to 10) and the chunk's batch
  range: other chunks may hold more, and results of chunks that succeeded
  may already have been computed. (The failing chunk is computed a second
  time, with ``return_info=True``, for the names.)
* ``lu_factor_batched`` warns (``LinAlgWarning``, global indices) where the
  task runs: in the calling process under Dask's local schedulers; on a
  ``dask.distributed`` cluster in the worker and, through
  ``distributed.warn``, in every client of the scheduler (the client's event
  loop re-emits it, possibly just after ``compute`` returns). Only a chunk
  with singular matrices sends anything; ``info`` itself stays on the worker.
  Ask ``return_info=True`` for ``info`` as a Dask array.
* With ``check_finite``, infs or NaNs raise ``ValueError`` from the chunk's
  task: the message is the public function's, whose indices count within the
  chunk, followed by the chunk's batch range.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings

import dask.array as da
from dask import is_dask_collection
import numpy as np
from dask.array.core import unify_chunks
from dask.array.utils import meta_from_array
from dask.layers import ArraySliceDep
from scipy.linalg import LinAlgError, LinAlgWarning

from ..batched import _functions as _f
from ..batched._common import (bad_indices, batch_names, check_square_stack, cholesky_pair,
                               info_counts, lu_pair)

__all__ = ["lu_factor_batched", "lu_solve_batched", "solve_batched",
           "inv_batched", "cho_factor_batched", "cho_solve_batched"]


# ----------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------

#: blockwise indices of the matrix axes (rows, columns); "k" is b's columns. A
#: square input read by a task whose output has no "j" is indexed ``II``: its
#: matrix axes are one chunk each, so the task contracts nothing and Dask
#: fuses the input's producer into it (:func:`_build`)
IJ, II, I = ("i", "j"), ("i", "i"), ("i",)


#: NumPy or CuPy arguments of more bytes than this are not hashed for their Dask name
_HASH_MAX_BYTES = 1 << 20


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
    # a large array gets a random name: from_array would otherwise hash all of
    # its data (on the host; a CuPy array through a pickle) to name it
    large = getattr(x, "nbytes", 0) > _HASH_MAX_BYTES
    return da.from_array(x, chunks=-1, name=False if large else None)


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

def _build(where, chunk_fn, inputs, task_ind, outputs, like, **kwargs):
    """Dask arrays computed by ``chunk_fn`` once per batch chunk.

    ``inputs``: (Dask array, blockwise index) pairs. An index names the batch
    axes ``b0, b1, ...`` (:func:`_batch_ind`) and the matrix axes by letters;
    every matrix axis is one chunk (:func:`_whole_matrices`), so a letter
    may repeat within one index (a square stack read by a task whose output
    has no column letter is ``(..., "i", "i")``). ``task_ind``: the index of the tasks, the
    batch axes and every letter of the inputs (nothing is contracted). The
    task is then a plain blockwise map of its inputs' blocks, which Dask's
    graph optimization fuses with blockwise producers of the inputs (a chunk
    generated or loaded by ``map_blocks`` or ``from_array`` is made inside
    the task that factorizes it: one task and one scheduler round trip per
    chunk instead of two or more).

    ``chunk_fn(*blocks, loc, batch_shape=..., **kwargs)`` gets, after the
    input blocks, the chunk's slices along the batch axes (from Dask's
    block-slice dependency: no task of its own). ``outputs``: (letters of the
    matrix axes, their lengths, dtype) of what it returns (one array, or a
    tuple of them); ``like``: an array of the output type (NumPy or CuPy) for the
    metadata. A single output whose index is ``task_ind`` is the tasks'
    array itself; otherwise each output is its item of the tasks' tuple (a
    getter that Dask fuses into blockwise consumers of that output, such as
    :func:`lu_solve_batched` of ``lu_factor_batched``'s ``lu, piv``).
    """
    arrays, inds = [x for x, _ in inputs], [ind for _, ind in inputs]
    chunkss, arrays = unify_chunks(*[v for pair in zip(arrays, inds) for v in pair])
    bind = tuple(k for k in task_ind if k.startswith("b"))
    batch_chunks = tuple(chunkss[k] for k in bind)
    kwargs["batch_shape"] = tuple(sum(c) for c in batch_chunks)
    args = [v for pair in zip(arrays, inds) for v in pair]
    args += [ArraySliceDep(batch_chunks), bind]
    core = {k: (c,) for ind, shape, _ in outputs for k, c in zip(ind, shape)}
    adjust = {k: chunkss[k] for k in task_ind}
    if len(outputs) == 1 and bind + tuple(outputs[0][0]) == tuple(task_ind):
        (_, _, dtype), = outputs
        return (da.blockwise(chunk_fn, task_ind, *args, token=where, dtype=dtype,
                             meta=_meta(like, len(task_ind), dtype), concatenate=True,
                             align_arrays=False, adjust_chunks=adjust, **kwargs),)
    tasks = da.blockwise(chunk_fn, task_ind, *args, token=where,
                         meta=np.empty((0,) * len(task_ind), dtype=object),
                         concatenate=True, align_arrays=False, adjust_chunks=adjust,
                         **kwargs)
    out = []
    for item, (core_ind, shape, dtype) in enumerate(outputs):
        ind = bind + tuple(core_ind)
        whole = set(ind) >= set(task_ind)
        out.append(da.blockwise(
            _item if whole else _item_of_list, ind, tasks, task_ind, item, None,
            token=f"{where}-{item}", new_axes={k: core[k] for k in ind if k not in task_ind},
            concatenate=True if whole else False, align_arrays=False,
            adjust_chunks={k: core[k] for k in core_ind}, dtype=dtype,
            meta=_meta(like, len(ind), dtype)))
    return tuple(out)


def _item(t, i):
    """Item ``i`` of a task's tuple."""
    return t[i]


def _item_of_list(t, i):
    """Item ``i`` of a task's tuple, passed in (nested) one-element lists: the
    tasks' letters this output lacks (one chunk each) are contracted."""
    while type(t) is list:
        t, = t
    return t[i]


def _meta(like, ndim: int, dtype):
    """An empty array of ``like``'s type (NumPy or CuPy), ``ndim`` and ``dtype``."""
    return np.empty_like(meta_from_array(like, ndim=ndim), dtype=dtype)


def _starts(loc) -> tuple:
    """Where a chunk starts along each batch axis (from its slices ``loc``)."""
    return tuple(s.start for s in loc)


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

def _lu_factor_chunk(a, loc, *, batch_shape, return_info, **kw):
    """(lu, piv[, info]) of one chunk; warns about its singular matrices by global index.

    One wait for a CuPy chunk, as in the CuPy call: the call's status read
    says whether some matrix is singular (``_f._lu_factor_counted``); only
    then is ``info`` looked at for the names.
    """
    starts = _starts(loc)
    with _in_chunk(starts, a.shape[:-2]):
        if return_info:
            return _f.lu_factor_batched(a, return_info=True, **kw)
        counted = (_f._lu_factor_counted(a, kw["check_finite"]) if kw.get("backend") is None
                   else None)
        if counted is None:
            lu, piv, info = _f.lu_factor_batched(a, return_info=True, **kw)
            singular = None
        else:
            lu, piv, info, singular = counted
    bad = _bad(info, starts, batch_shape) if singular is not False else None
    if bad:
        _warn(f"lu_factor_batched: exactly singular matrices at batch index {bad[0]} "
              f"(first: diagonal number {bad[1]} is exactly zero; {bad[2]}). "
              "Singular matrix.", LinAlgWarning)
    return lu, piv


def _warn(message: str, category) -> None:
    """``warnings.warn`` where the task runs; on a ``dask.distributed`` worker
    also in the clients of its scheduler (``distributed.warn``: one small event,
    sent only by a chunk that has something to report)."""
    dist = sys.modules.get("distributed")   # imported in every worker process
    if dist is not None:
        try:
            dist.get_worker()
        except ValueError:                  # a local scheduler's thread
            pass
        else:
            dist.warn(message, category)
            return
    warnings.warn(message, category, stacklevel=3)


def _raise_singular(where, bad):
    """LinAlgError naming a chunk's singular matrices (``bad`` from :func:`_bad`)."""
    raise LinAlgError(f"{where}: singular matrix at batch index {bad[0]} "
                      f"(U[k, k] exactly zero; {bad[2]})")


def _checked(where, call, a, loc, batch_shape, **kw):
    """The public ``call`` of one chunk without ``info``; its LinAlgError (a
    singular or not positive definite matrix, named within the chunk) raised
    again naming the matrices by their global batch index.

    The call waits once for a CuPy chunk and says whether to raise; only a
    chunk that raises is computed a second time, with ``return_info=True``,
    for the names.
    """
    starts = _starts(loc)
    with _in_chunk(starts, a.shape[:-2]):
        try:
            return call(a, **kw)
        except LinAlgError as exc:
            err = exc
            kw["check_finite"] = False
            info = call(a, return_info=True, **kw)[-1]
    bad = _bad(info, starts, batch_shape)
    if not bad:
        raise err
    if where == "cho_factor_batched":
        raise LinAlgError(f"cho_factor_batched: not positive definite at batch "
                          f"index {bad[0]} (the {bad[1]}-th leading minor of the "
                          f"first is not positive definite; {bad[2]})") from None
    _raise_singular(where, bad)


def _inv_chunk(a, loc, *, batch_shape, return_info, **kw):
    """The inverses of one chunk[, info]; LinAlgError for a singular one (global index)."""
    if return_info:
        with _in_chunk(_starts(loc), a.shape[:-2]):
            return _f.inv_batched(a, return_info=True, **kw)
    return _checked("inv_batched", _f.inv_batched, a, loc, batch_shape, **kw)


def _solve_chunk(a, b, loc, *, batch_shape, return_info, **kw):
    """x of one chunk[, info]; LinAlgError for a singular matrix (global index)."""
    if return_info:
        with _in_chunk(_starts(loc), a.shape[:-2]):
            return _f.solve_batched(a, b, return_info=True, **kw)
    return _checked("solve_batched", lambda m, **k: _f.solve_batched(m, b, **k),
                    a, loc, batch_shape, **kw)


def _cho_factor_chunk(a, loc, *, batch_shape, return_info, lower, **kw):
    """c of one chunk[, info]; LinAlgError for a matrix not positive definite (global index)."""
    if return_info:
        with _in_chunk(_starts(loc), a.shape[:-2]):
            c, _, info = _f.cho_factor_batched(a, lower, return_info=True, **kw)
        return c, info
    return _checked("cho_factor_batched",
                    lambda m, **k: _f.cho_factor_batched(m, lower, **k), a, loc,
                    batch_shape, **kw)[0]


def _lu_solve_chunk(lu, piv, b, loc, *, batch_shape, trans, **kw):
    """x of one chunk from its LU factors."""
    with _in_chunk(_starts(loc), lu.shape[:-2]):
        return _f.lu_solve_batched((lu, piv), b, trans, **kw)


def _cho_solve_chunk(c, b, loc, *, batch_shape, lower, **kw):
    """x of one chunk from its Cholesky factor."""
    with _in_chunk(_starts(loc), c.shape[:-2]):
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
    bi = _batch_ind(nb)
    return _build(where, _lu_factor_chunk, [(a, bi + II)], bi + I, outs, a._meta,
                  return_info=return_info, overwrite_a=overwrite_a,
                  check_finite=check_finite, backend=backend)


def inv_batched(a, *, check_finite=True, return_info=False, backend=None):
    """:func:`scipy_gpuqr.inv_batched` of a Dask stack: Dask ``ainv[, info]``."""
    where = "inv_batched"
    a = _stack(a, "a", where)
    nb, n = a.ndim - 2, a.shape[-1]
    x, info = _f.inv_batched(_probe_stack(n, a.dtype), return_info=True, backend="cpu")
    outs = [(IJ, (n, n), x.dtype)] + _info(return_info, info)
    bi = _batch_ind(nb)
    out = _build(where, _inv_chunk, [(a, bi + IJ)], bi + IJ, outs, a._meta,
                 return_info=return_info,
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
    bi = _batch_ind(nb)
    out = _build(where, _solve_chunk, [(a, bi + II), (b, bind)], bi + outs[0][0], outs,
                 a._meta, return_info=return_info,
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
    bi = _batch_ind(nb)
    out = _build(where, _cho_factor_chunk, [(a, bi + IJ)], bi + IJ, outs, a._meta,
                 return_info=return_info,
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
    bi, outs = _batch_ind(nb), _x(bind, x)
    return _build(where, _lu_solve_chunk, [(lu, bi + II), (piv, bi + I), (b, bind)],
                  bi + outs[0][0], outs, lu._meta,
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
    bi, outs = _batch_ind(nb), _x(bind, x)
    return _build(where, _cho_solve_chunk, [(c, bi + II), (b, bind)], bi + outs[0][0],
                  outs, c._meta,
                  lower=lower, overwrite_b=overwrite_b, check_finite=check_finite,
                  backend=backend)[0]
