"""The public batched functions, Dask-aware: Dask arrays go to the Dask path.

:mod:`scipy_gpuqr` and :mod:`scipy_gpuqr.batched` export the six fixed-size
batched functions from here. Each is the function of
:mod:`scipy_gpuqr.batched._functions` behind one type check: when an array
argument is a Dask collection the call goes to
:mod:`scipy_gpuqr.distributed.dask_batched` (one call of the same function
per chunk), otherwise straight to the function. The check reads only the
arguments' type names, so Dask is imported only for Dask input and NumPy or
CuPy calls pay one attribute lookup per argument.
"""

from __future__ import annotations

import functools

from ..batched import _functions as _f

__all__ = ["lu_factor_batched", "lu_solve_batched", "solve_batched",
           "inv_batched", "cho_factor_batched", "cho_solve_batched"]

_DASK_NOTE = """\
    Dask arrays (chunked along the batch axes; NumPy or CuPy chunks) are
    accepted and give Dask arrays: one call per chunk on the worker that
    holds it (:mod:`scipy_gpuqr.distributed.dask_batched` says how singular
    matrices are reported per chunk).

"""


def is_dask(x) -> bool:
    """True when ``x`` is a Dask collection (its type's module is dask's; nothing imported)."""
    return type(x).__module__.startswith("dask")


def _is_dask_or_pair(x) -> bool:
    """``x``, or an element of a pair such as ``(lu, piv)``, is a Dask collection."""
    t = type(x)
    if t.__module__.startswith("dask"):
        return True
    return (t is tuple or t is list) and len(x) == 2 and (is_dask(x[0]) or is_dask(x[1]))


def _has_dask(args, kwargs) -> bool:
    """Whether an argument of a call is (or holds, as a pair) a Dask collection."""
    for x in args:
        if _is_dask_or_pair(x):
            return True
    if kwargs:
        for x in kwargs.values():
            if _is_dask_or_pair(x):
                return True
    return False


def _with_dask_note(doc: str) -> str:
    """``doc`` with the Dask paragraph ahead of its Parameters section."""
    head, sep, tail = doc.partition("    Parameters\n")
    return head + _DASK_NOTE + sep + tail if sep else doc + "\n" + _DASK_NOTE


def dask_aware(func):
    """``func`` (a public batched function) that sends Dask input to its Dask version.

    The wrapper takes the name of ``func`` in this module, so that it
    pickles by reference (workers resolve it to this same function).
    """
    name = func.__name__

    @functools.wraps(func)
    def call(*args, **kwargs):
        if _has_dask(args, kwargs):
            from . import dask_batched
            return getattr(dask_batched, name)(*args, **kwargs)
        return func(*args, **kwargs)

    call.__module__ = __name__
    call.__qualname__ = name
    call.__doc__ = _with_dask_note(func.__doc__ or "")
    return call


lu_factor_batched = dask_aware(_f.lu_factor_batched)
lu_solve_batched = dask_aware(_f.lu_solve_batched)
solve_batched = dask_aware(_f.solve_batched)
inv_batched = dask_aware(_f.inv_batched)
cho_factor_batched = dask_aware(_f.cho_factor_batched)
cho_solve_batched = dask_aware(_f.cho_solve_batched)
