"""The public entry points, thin: validate, resolve the settings, plan, call, shape the result.

Modules
-------
lsqr
    ``lsqr`` and ``lsmr`` and their SciPy tuples.
spsolve
    ``spsolve`` and ``factorized``: exact solves of square systems.
qr
    ``qr`` and ``QRResult``.
fallback
    What they share: handing inputs we do not serve to SciPy's original.
originals
    SciPy's own functions, captured before any patching.
patch
    ``patch``, ``unpatch``, ``patched``, ``is_patched``: ours in SciPy's place.

Imports
-------
This part may import every part below it (:mod:`scipy_gpuqr._factor`,
:mod:`scipy_gpuqr._dispatch`, :mod:`scipy_gpuqr._validate`,
:mod:`scipy_gpuqr._options`, ...). Nothing imports it except the package's
``__init__`` (which maps the public names to these modules lazily) and the
command line (:mod:`scipy_gpuqr._cli`).
"""
