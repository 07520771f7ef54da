"""What the entry points share: handing an input we do not serve to SciPy.

A LinearOperator, complex data or pydata/sparse arrays
(:func:`scipy_gpuqr._validate.unsupported_reason`) go to SciPy's *original*
function (:mod:`scipy_gpuqr._api.originals`, saved before any patching, so
a patched process never calls itself), with the reason logged.
"""

from __future__ import annotations

from .._options import log_decision
from .originals import original

__all__ = ["fallback"]


def fallback(name: str, reason: str, *args, **kwargs):
    """Answer with SciPy's original ``name``, logging ``reason``."""
    log_decision("%s: SciPy's original answers (%s)", name, reason)
    return original(name)(*args, **kwargs)
