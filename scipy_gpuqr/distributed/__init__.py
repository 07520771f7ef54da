"""Dask: the batched functions on Dask arrays, many sparse problems across workers.

Needs the ``dask`` extra (``pip install "scipy_gpuqr[dask]"``: Dask's array
and distributed parts). Dask schedules and moves the data; nothing here does
networking.

* The public batched functions (:func:`scipy_gpuqr.lu_factor_batched`,
  ``lu_solve_batched``, ``solve_batched``, ``inv_batched``,
  ``cho_factor_batched``, ``cho_solve_batched``) take Dask arrays chunked
  along the batch axes (NumPy or CuPy chunks) and return Dask arrays: one
  call per chunk, on the worker (and GPU) holding it
  (:mod:`scipy_gpuqr.distributed.dask_batched`; the public functions send
  Dask input there from :mod:`scipy_gpuqr.distributed._batched_api`).
* :func:`scipy_gpuqr.block_jacobi` of a Dask matrix ``(n, n)`` or of a Dask
  stack of diagonal blocks gives an operator whose inverses are a Dask array
  (:mod:`scipy_gpuqr.distributed.dask_jacobi`).
* :func:`solve_many` solves a list or a Dask bag of independent ``(A, b)``
  problems, one task each calling :func:`scipy_gpuqr.lsqr`, ``lsmr`` or
  ``spsolve`` on its worker.

On a ``dask.distributed`` cluster run one worker per GPU, each with
``scipy_gpuqr`` installed and one or two threads (below):

* on one host, dask-cuda's ``LocalCUDACluster()`` (``pip install
  dask-cuda``) starts them, each with ``CUDA_VISIBLE_DEVICES`` naming its
  GPU first; ``dask cuda worker <scheduler>`` does the same on every host of
  a larger cluster;
* without dask-cuda, start ``dask worker <scheduler> --nworkers 1
  --nthreads 1 --memory-limit 0`` once per GPU with ``CUDA_VISIBLE_DEVICES``
  set to it (or a ``SpecCluster`` of such ``Nanny`` workers). A plain
  worker counts CuPy chunks against its *host* memory limit and spills
  them, pickled, to disk once past it (minutes per run with chunks of a few
  GiB); dask-cuda's workers count them against the GPU's memory instead.

Threads per worker. A thread runs one task at a time: while a task waits
for its GPU (the default call's wait per chunk, or any read of a result to
the host) its thread queues nothing more, and the GPU idles once its queue
is done. A second thread queues the next chunk meanwhile, at the price of a
second chunk in GPU memory. With ``return_info=True, check_finite=False``
(tasks that do not wait) that works on CuPy's default stream. With the
default call it needs a stream per thread
(``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` in the workers' environment): on
one stream a wait is for every kernel queued before it, the other thread's
too, so both threads wait together. One thread is the memory-lean choice.

Then ``Client(cluster)`` and Dask arrays of CuPy chunks made on the workers
(``map_blocks`` of a function that makes or loads a chunk with CuPy, or
``x.map_blocks(cupy.asarray)``): each chunk is factorized or solved by one
task on the worker (and GPU) that holds it
(:mod:`scipy_gpuqr.distributed.dask_batched` says how the tasks fuse).

Keep the functions your tasks call (the chunk maker or loader, what
consumes the results) in a module that the workers import, not in the
script you run or a notebook (``__main__``). Dask pickles a task that names
a function of ``__main__`` by value (cloudpickle: the function's code and
every function, class and constant it reaches) for each task, when the
scheduler sends it to a worker, and the worker unpickles it for each task;
``scipy_gpuqr``'s own functions go by name. That is milliseconds a task,
spent by the one scheduler for all workers: with several GPU workers the
tasks reach them late and one worker after another, and the GPUs wait
(bench/RESULTS.md, issue 21). A script can import its own file as a module
and call its functions from there (``bench/dask_batched.py`` does); the
workers need that module on their path (worker processes a local cluster
starts inherit the client's ``sys.path``).

Throughput. Each task costs some milliseconds of Dask (the scheduler batches
its messages to a worker, 5 ms apart, and by default sends a worker its next
chunk task only when one finishes), and each ``compute()`` more, before its
first task runs and after its last (the graph sent and ordered, the results
gathered: tens of milliseconds): make chunks as large as a GPU holds with
their results (a chunk's GPU work should dwarf a task's round trip), and for
a stream of batches keep several in flight (``client.compute`` of each as it
comes, or of several at once, then gather), so that one batch's fixed cost
overlaps the others' work. (Dask's default worker-saturation, 1.1, holds a
worker to about two chunk tasks a thread, each next one sent after one ends;
``inf``, every chunk task sent at once, started the first task later and was
slower in bench/RESULTS.md's runs. The saturation holds only root tasks:
chunks made by ``from_array``, or a graph's chunk tasks that outnumber
twice the cluster's threads. A batch of fewer chunks, e.g. 16 chunks on four
workers of two threads, has every task sent to the workers at once.) The default call waits once per chunk
for its GPU (to warn or raise like SciPy), so the GPU idles while its worker
ends one task and starts the next; ``return_info=True, check_finite=False``
waits for nothing: a task returns once its kernels are queued, and the
worker queues the next chunk while the GPU works (then check ``info``, a
Dask array, with the results, e.g. ``da.count_nonzero(info)`` in the same
``compute``: one more task per chunk). Such a task's results are not
finished when it returns, so a worker must run its tasks and move their data
on one CUDA stream (CuPy's default; not with per-thread default streams,
which only the default call tolerates). ``bench/dask_batched.py`` times both
against the same chunks run directly on one GPU, one batch or several in
flight, one or two threads per worker (bench/RESULTS.md, issue 21).

Modules
-------
_batched_api
    The Dask-aware public batched functions (a type check, no Dask import).
dask_batched
    Their Dask versions: validation, one task per chunk, ``info`` per chunk.
dask_jacobi
    ``block_jacobi`` on Dask: diagonal blocks gathered per row chunk,
    inverted per chunk, the operator applied to Dask, NumPy or CuPy vectors.
_many
    :func:`solve_many`.

Importing this package imports neither Dask nor any of its modules; each
public name is loaded from its module on first use.
"""

from __future__ import annotations

import importlib

#: public name -> module of this package that defines it
_PUBLIC = {"solve_many": "._many"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        try:
            module = importlib.import_module(_PUBLIC[name], __name__)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in ("dask", "distributed"):
                raise ModuleNotFoundError(
                    f"scipy_gpuqr.distributed.{name} needs Dask: pip install "
                    f"\"scipy_gpuqr[dask]\" ({exc})", name=exc.name) from None
            raise
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
