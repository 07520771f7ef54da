"""Factorizations and the solve rules built on them, the same for every backend.

Modules
-------
factorization
    :class:`~scipy_gpuqr.QRFactorization`, the public object: checks b, CuPy
    in → CuPy out, result dtypes.
factored
    :class:`~scipy_gpuqr._factor.factored.FactoredQR`: one factorized matrix
    and its solves (host and device), and the plans that make it.
least_squares
    The answer behind ``lsqr``/``lsmr``: damping, iterate-first, direct QR.
lstsq
    The solve rules: lstsq's rank rule (:class:`MinNormSolver`), exact solves.
rank_refine
    Heath's rule on R for engines without rank detection.
dense_cod, subspace_cod, triangular
    Dense and triangular kernels of the rank decision.

Imports
-------
This part may import :mod:`scipy_gpuqr._dispatch` (plans, the iterate-first
rule), :mod:`scipy_gpuqr._iterative` (SciPy's LSQR/LSMR on NumPy or CuPy),
:mod:`scipy_gpuqr._validate`, :mod:`scipy_gpuqr._options`,
:mod:`scipy_gpuqr._gpu` and :mod:`scipy_gpuqr._errors`; it reaches the
engines only through plan objects (their factorize callables and device
solves). The :class:`~scipy_gpuqr._numeric.NumericQR` contract every backend
returns (``A[:, colperm] = Q R``) lives below this part, in
:mod:`scipy_gpuqr._numeric`, since the engines implement it. CuPy is imported only inside the functions that run
on a device.
"""
