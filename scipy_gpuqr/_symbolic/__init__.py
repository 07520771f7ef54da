"""Symbolic analysis: column singletons, ordering, column etree, fronts, staircase, assembly maps, counts, staging.

``analyze(A, ...)`` returns a :class:`SymbolicAnalysis`; nothing is computed
at import.
"""

from .analysis import SymbolicAnalysis, analyze, canonical_csc
from .fronts import Amalgamation, FrontStructure
from .staging import StagePlan

__all__ = ["analyze", "SymbolicAnalysis", "canonical_csc", "Amalgamation",
           "FrontStructure", "StagePlan"]
