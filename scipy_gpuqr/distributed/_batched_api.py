"""The public batched functions, Dask-aware: Dask arrays go to the Dask path.

:mod:`scipy_gpuqr` and :mod:`scipy_gpuqr.batched` export the six fixed-size
batched functions and ``block_jacobi`` from here. Each is the function of
:mod:`scipy_gpuqr.batched._functions` behind one type check: when an array
argument is a Dask collection the call goes to
:mod:`scipy_gpuqr.distributed.dask_batched` (one call of the same function
per chunk; ``block_jacobi`` to :mod:`scipy_gpuqr.distributed.dask_jacobi`),
otherwise straight to the function. The check reads only the
arguments' type names, so Dask is imported only for Dask input and NumPy or
CuPy calls pay one attribute lookup per argument.
"""

from __future__ import annotations

import functools
import importlib

from ..batched import _functions as _f

__all__ = ["lu_factor_batched", "lu_solve_batched", "solve_batched",
           "inv_batched", "cho_factor_batched", "cho_solve_batched", "block_jacobi"]

_DASK_NOTE = """\
    Dask arrays (chunked along the batch axes; NumPy or CuPy chunks) are
    accepted and give Dask arrays: one call per chunk on the worker that
    holds it (:mod:`scipy_gpuqr.distributed.dask_batched` says how singular
    matrices are reported per chunk).

"""

_JACOBI_NOTE = """\
    A Dask matrix ``(n, n)`` (dense NumPy/CuPy or scipy.sparse/cupyx chunks)
    or a Dask stack of the diagonal blocks ``(nblocks, bs, bs)`` gives a
    :class:`~scipy_gpuqr.distributed.dask_jacobi.DaskBlockJacobi`: the
    inverses as a Dask array (one ``inv_batched`` call per chunk on the
    worker that holds it, computed on first use or by ``persist()``), and
    ``M @ x`` of a Dask ``x`` a Dask array
    (:mod:`scipy_gpuqr.distributed.dask_jacobi`).

"""


def is_dask(x) -> bool:
    """True when ``x`` is a Dask collection (its type's module is dask's; nothing imported)."""
    return type(x).__module__.startswith("dask")


def _has_dask(args, kwargs) -> bool:
    """Whether an argument of a call is (or holds, as a pair) a Dask collection.

    The type's module name is read once per argument in one loop (no call per
    argument): this check runs before every NumPy or CuPy call.
    """
    for x in (args + tuple(kwargs.values())) if kwargs else args:
        t = type(x)
        if t.__module__.startswith("dask") or ((t is tuple or t is list) and len(x) == 2
                                               and (is_dask(x[0]) or is_dask(x[1]))):
            return True
    return False


def _with_dask_note(doc: str, note: str = _DASK_NOTE) -> str:
    """``doc`` with the Dask paragraph ahead of its Parameters section."""
    head, sep, tail = doc.partition("    Parameters\n")
    return head + note + sep + tail if sep else doc + "\n" + note


def dask_aware(func, module: str = "dask_batched", note: str = _DASK_NOTE):
    """``func`` (a public batched function) that sends Dask input to its Dask version
    (the function of the same name in ``module`` of this package).

    The wrapper takes the name of ``func`` in this module, so that it
    pickles by reference (workers resolve it to this same function).
    """
    name = func.__name__

    @functools.wraps(func)
    def call(*args, **kwargs):
        if _has_dask(args, kwargs):
            dask_version = importlib.import_module("." + module, __package__)
            return getattr(dask_version, name)(*args, **kwargs)
        return func(*args, **kwargs)

    call.__module__ = __name__
    call.__qualname__ = name
    call.__doc__ = _with_dask_note(func.__doc__ or "", note)
    return call


lu_factor_batched = dask_aware(_f.lu_factor_batched)
lu_solve_batched = dask_aware(_f.lu_solve_batched)
solve_batched = dask_aware(_f.solve_batched)
inv_batched = dask_aware(_f.inv_batched)
cho_factor_batched = dask_aware(_f.cho_factor_batched)
cho_solve_batched = dask_aware(_f.cho_solve_batched)
block_jacobi = dask_aware(_f.block_jacobi, "dask_jacobi", _JACOBI_NOTE)
