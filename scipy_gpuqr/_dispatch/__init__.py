"""Where and how a problem is solved: the backend choice and its evidence.

Modules
-------
plan
    :func:`~scipy_gpuqr._dispatch.plan.plan_factorization`: the backend of
    one factorization and every reason for it; the one place that names the
    engines (:func:`~scipy_gpuqr._dispatch.plan.backend_factorizer`).
iterate_first
    ``auto``'s rule for least squares: when SciPy's iterations (run with the
    caller's arguments) answer, and when the sparse QR takes over
    (:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`, the run's watcher).
projection
    The iterations a watched run still needs (``Projector``: the window's
    projection of SciPy's tolerance tests and the long trend).
placement
    Where those iterations run (the CPU, a GPU through CuPy, one GPU thread
    block), what one costs there, and the move from the host (``HostFirst``).
rank_cost
    The predicted seconds of the QR's rank decision, which the rule adds to the
    QR's time.
lu_route
    The route of that rank decision which SuperLU's factors of a square A
    predict (``LURoute``), for the rule.
cost_model
    The predicted time of a direct solve.
calibration
    The stored calibration of ``auto``'s threshold, per GPU model.
calibrate
    Measuring that calibration (the solve it times is passed in).

Imports
-------
This part may import :mod:`scipy_gpuqr._symbolic`, :mod:`scipy_gpuqr._options`,
:mod:`scipy_gpuqr._gpu`, :mod:`scipy_gpuqr._errors`, :mod:`scipy_gpuqr._cachedir`,
:mod:`scipy_gpuqr._cpu.blas_threads` and :mod:`scipy_gpuqr._testing_matrices`;
the engines (:mod:`scipy_gpuqr._engine`, :mod:`scipy_gpuqr._cpu.spqr`) only
lazily, when a backend runs. It never imports :mod:`scipy_gpuqr._factor` or
:mod:`scipy_gpuqr._api`, which import it.
"""
