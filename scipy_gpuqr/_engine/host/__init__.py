"""The host engines: the NumPy executor of the task lists and the reference QR.

* :mod:`.simulate` — runs the very records the uberkernel runs, over the
  same pools (``backend='simulate'``; the tests' proof that the schedules
  and the kernels' conventions are right, and the NumPy device's executor);
* :mod:`.multi_device` — the task lists of a multi-device plan run on
  simulated devices, each with its own memory, transfers explicit (CI's
  proof of the multi-GPU schedule);
* :mod:`.reference` — multifrontal Householder QR with NumPy/LAPACK,
  blocked along each front's staircase, with SuiteSparseQR's rank detection
  (``backend='reference'``; the engine that answers when the GPU cannot).

Imports: NumPy, SciPy (``threadpoolctl`` optionally, inside functions);
:mod:`scipy_gpuqr._schedule`, :mod:`scipy_gpuqr._symbolic`, the engine's
shared modules, the :class:`~scipy_gpuqr._numeric.NumericQR`
contract. Never CuPy, :mod:`scipy_gpuqr._engine.gpu`, ``_dispatch``,
``_factor`` or ``_api``.
"""
