"""The GPU engine: sparse multifrontal QR on a CUDA device, and its solves.

* :mod:`.driver` — :func:`~.driver.gpu_factorize` and its result
  :class:`~.driver.GpuQR`: the memory plan and its checks, the schedule,
  restaging after out-of-memory; :mod:`.stage_loop` — the stages of one
  attempt (launches, dense fronts, R's values, what ``Q`` keeps, retiring
  pools) and R's assembly;
* :mod:`.pool_copy` — a retiring stage's pool sent to the host while its
  launches run; :mod:`.reflector_upload` — an earlier stage's reflectors
  packed for ``Q``'s replay; :mod:`.replay_store` — the replay plan on disk;
* :mod:`.multi_device` — :func:`~.multi_device.multi_gpu_factorize`: the
  subtrees of a device plan on several GPUs of one host (one device layer
  each, contribution blocks peer to peer), ``Q`` kept on the first;
* :mod:`.device` — the device layers the driver calls: CUDA through CuPy
  (:class:`~.device.CupyDevice`) and a NumPy stand-in running the same
  records (:class:`~.device.NumpyDevice`, the host logic's tests);
* :mod:`.rlayout` — R's pattern and the source of each of its entries, once
  per analysis; :mod:`.rcopy` — R's values copied device → host while the
  launches run;
* :mod:`.solve` — ``Qᵀ``/``Q`` replayed from the kept reflectors and the
  full-rank device solves; :mod:`.trsolve` — triangular solves with R's
  front blocks in the pools; :mod:`.replay_split` — a multi-device
  factorization's replay levels run on the GPUs holding their stages;
  :mod:`.peer_rows` — rows of the right-hand sides lent to those GPUs;
* :mod:`.factorize_kernels`, :mod:`.solve_kernels` — the kernel variants
  (``KERNEL_VARIANTS``, compiled by ``build_kernels.py``; no CuPy needed).

Imports: NumPy, SciPy, CuPy/cupyx lazily (inside functions; these modules
import without CuPy); :mod:`scipy_gpuqr._schedule`,
:mod:`scipy_gpuqr._symbolic`, :mod:`scipy_gpuqr._kernels`,
:mod:`scipy_gpuqr._gpu`, :mod:`scipy_gpuqr._errors`; the engine's shared
modules and :mod:`scipy_gpuqr._engine.host` (the NumPy executor the NumPy
device runs, the reference engine that answers when no GPU can), the
:class:`~scipy_gpuqr._numeric.NumericQR` contract. Never
``_dispatch``, ``_factor`` or ``_api``.
"""
