"""Symbolic analysis of a sparse QR: what to factorize, in which order, at what cost.

``analyze(A, ...)`` returns a :class:`SymbolicAnalysis`, everything the
numeric factorization and the schedulers need from the pattern of ``A``:
column singletons (:mod:`.singletons`), the fill-reducing column ordering
(:mod:`.ordering`), the column elimination tree and column counts
(:mod:`.etree`), the fronts with their staircases and assembly maps
(:mod:`.fronts`), the work and memory counts (:mod:`.counts`) and the GPU
staging plan (:mod:`.staging`). Nothing is computed at import. An analysis
is made once per sparsity pattern and set of options: :mod:`.analysis_cache`
keeps them per process (bounded) and on disk (in the schedule cache's
folder), and ``analyze`` answers from it when it can.

Imports: NumPy and SciPy, :mod:`scipy_gpuqr._cpu` for the SuiteSparse
orderings (COLAMD, AMD, METIS) and
:mod:`scipy_gpuqr._store` for the disk cache's rules; nothing above it (no
scheduler, engine or dispatch). The tree and front loops run compiled where a
C compiler is at hand (:mod:`.native`, built on first use into the package
cache folder; the NumPy code otherwise, with the same results). Its command-line report is
``scipy-gpuqr analyze`` (:mod:`scipy_gpuqr._cli.analyze`).
"""

from .analysis import SymbolicAnalysis, analyze, canonical_csc
from .fronts import Amalgamation, FrontStructure
from .staging import StagePlan

__all__ = ["analyze", "SymbolicAnalysis", "canonical_csc", "Amalgamation",
           "FrontStructure", "StagePlan"]
