"""Many independent sparse problems solved across the workers of a Dask cluster.

Each problem is one task calling the public solver (:func:`scipy_gpuqr.lsqr`,
:func:`scipy_gpuqr.lsmr` or :func:`scipy_gpuqr.spsolve`) on the worker that
runs it, so each gets the same CPU/GPU dispatch as a direct call there: on a
cluster of one worker per GPU (dask-cuda's ``LocalCUDACluster`` sets each
worker's ``CUDA_VISIBLE_DEVICES``) the problems big enough for the GPU run on
the GPU of their worker. Dask schedules; nothing here does networking.
"""

from __future__ import annotations

import functools

import dask
import dask.bag as db

from .._api.lsqr import lsmr, lsqr
from .._api.spsolve import spsolve

__all__ = ["solve_many", "SOLVERS"]

#: solver name -> the public function each task calls
SOLVERS = {"lsqr": lsqr, "lsmr": lsmr, "spsolve": spsolve}


def _solve_one(problem, *, solver: str, options: dict):
    """What ``solver(A, b, **options)`` returns for one ``(A, b)`` pair."""
    try:
        A, b = problem
    except (TypeError, ValueError):
        raise TypeError(f"solve_many: each problem must be a pair (A, b), got "
                        f"{type(problem).__name__}") from None
    return SOLVERS[solver](A, b, **options)


def solve_many(problems, solver: str = "lsqr", *, client=None, **options) -> list:
    """Solve many independent sparse problems, one Dask task each.

    Parameters
    ----------
    problems : sequence of (A, b) pairs, or dask.bag.Bag of them
        Independent problems; each is passed to the solver as ``solver(A, b)``.
    solver : {'lsqr', 'lsmr', 'spsolve'}
        The public function every task calls (:func:`scipy_gpuqr.lsqr`,
        :func:`scipy_gpuqr.lsmr`, :func:`scipy_gpuqr.spsolve`), with its own
        choice of CPU or GPU on the worker that runs it.
    client : dask.distributed.Client, optional
        The cluster to use. A list is scattered to its workers (each problem
        sent once, to one worker) and solved where it lands, Dask moving work
        to idle workers. Without it Dask's current scheduler runs the tasks:
        the default ``Client`` when one exists, else local threads (for a
        Bag, the Bag's default scheduler).
    **options
        Keyword arguments of the solver, the same for every problem (e.g.
        ``atol``, ``btol``, ``backend``, ``gpuqr_options``).

    Returns
    -------
    results : list
        ``solver(A, b, **options)`` of each problem, in the order of
        ``problems`` (the 10-tuple of ``lsqr``, the 8-tuple of ``lsmr``, the
        solution of ``spsolve``).

    Raises
    ------
    ValueError
        For an unknown ``solver``.
    Exception
        The first exception a task raised (Dask re-raises it here).
    """
    if solver not in SOLVERS:
        raise ValueError(f"solve_many: solver must be one of {sorted(SOLVERS)}, "
                         f"got {solver!r}")
    task = functools.partial(_solve_one, solver=solver, options=options)
    if isinstance(problems, db.Bag):
        solved = problems.map(task)
        return client.compute(solved).result() if client is not None else solved.compute()
    problems = list(problems)
    if not problems:
        return []
    if client is not None:
        data = client.scatter(problems, hash=False)
        return client.gather(client.map(task, data, pure=False))
    return list(dask.compute(*[dask.delayed(task, pure=False)(p) for p in problems]))
