"""The ``scipy-gpuqr`` command line (also ``python -m scipy_gpuqr``).

:mod:`.main` holds the parser and the dispatch; every subcommand has its
module, which adds its arguments and runs it: :mod:`.info`,
:mod:`.solve_report` (``solve`` and ``demo``), :mod:`.analyze`,
:mod:`.schedule`, :mod:`.run_script` (``run``), :mod:`.build_kernels`,
:mod:`.calibrate` (sparse, and ``--tiled``); :mod:`._common` holds the
one-line error they share.

Imports: anything of the package; nothing imports this package but the
console script and ``scipy_gpuqr.__main__``. Each module imports what it
needs at module level; the one rule for start-up time is that
:mod:`.main` imports a subcommand's module only when that subcommand is
given on the command line (``--help`` imports none of them, and a
subcommand none of the others).
"""
