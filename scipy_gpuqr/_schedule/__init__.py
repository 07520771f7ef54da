"""Task lists of the GPU factorization, built on the CPU from the symbolic analysis.

The schedulers turn a :class:`~scipy_gpuqr._symbolic.SymbolicAnalysis` into
the records the uberkernel runs, launch after launch:

* :mod:`.tasks`: the task record (the only thing the schedulers and the
  kernel share) and the tunables' defaults;
* :mod:`.bucket`: the bucket scheduler of one front (its tile schedule,
  shared by the fronts of equal tile pattern);
* :mod:`.sparse`: the sparse scheduler across fronts (state machines,
  stages, assembly records, launches), with :mod:`.dense` choosing the
  fronts that leave the tile tasks;
* :mod:`.devices`: fronts mapped to the GPUs of one host (proportional
  mapping of subtrees), the stages and transfers that follow;
* :mod:`.native`: the compiled twin of the schedulers' loops (``_native.c``,
  built on first use; the NumPy code runs where there is no compiler);
* :mod:`.cache`: one cache store on disk for the tile schedules and the
  whole plans, between processes.

Imports: NumPy, the symbolic analysis' results (:mod:`scipy_gpuqr._symbolic`),
the package's cache folder and error classes; nothing above (no engine, no
dispatch, no CuPy). Inside, :mod:`.cache` imports none of the schedulers:
they hand it the functions that make their objects.
"""
