"""The engine: numeric sparse multifrontal QR from a symbolic analysis.

Three factorizations answer ``A[:, colperm] = Q @ R``, each returning a
:class:`~scipy_gpuqr._numeric.NumericQR`:

* :mod:`.gpu` — the task lists of the sparse scheduler run by the CUDA
  uberkernel, stage by stage (``backend='gpu'``), with ``Q`` and the
  triangular solves applied on the device;
* :mod:`.host` — the NumPy executor of the same task lists (``'simulate'``,
  CI's proof of the GPU engine's logic) and the reference multifrontal QR
  with NumPy/LAPACK and rank detection (``'reference'``);
* shared by both: :mod:`.inputs` (the input check every engine runs first),
  :mod:`.dense_front` (the blocked QR of the largest fronts, NumPy or CuPy)
  and :mod:`.tasklist_qr` (what a task-list factorization keeps for ``Q``).

Imports: NumPy and SciPy; CuPy/cupyx only inside functions (importing the
engine never imports CuPy); from the package, the task lists
(:mod:`scipy_gpuqr._schedule`), the symbolic analysis
(:mod:`scipy_gpuqr._symbolic`), :mod:`scipy_gpuqr._kernels`,
:mod:`scipy_gpuqr._gpu` and :mod:`scipy_gpuqr._errors`, and the contract
its results subclass, :class:`~scipy_gpuqr._numeric.NumericQR` (a
module that imports nothing of the package). Never the parts above it
(``_dispatch``, ``_factor``, ``_api``): they call the engine.
"""
