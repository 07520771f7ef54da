"""The one input check every factorization engine runs first."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._symbolic import canonical_csc

__all__ = ["engine_csc"]


def engine_csc(A, who: str):
    """Canonical CSC copy of a real, finite matrix, or a clear exception.

    Parameters
    ----------
    A : sparse matrix/array, ndarray or array_like
    who : str
        The engine's function name, for the messages.

    Returns
    -------
    scipy.sparse.csc_array
        Duplicates summed, indices sorted (``_symbolic.canonical_csc``).

    Raises
    ------
    TypeError
        For complex or non-numeric data.
    ValueError
        For NaN or Inf entries.
    """
    Ac = canonical_csc(A if (sp.issparse(A) or isinstance(A, np.ndarray)) else np.asarray(A))
    if np.issubdtype(Ac.dtype, np.complexfloating):
        raise TypeError(f"{who}: complex matrices are not supported")
    if not (np.issubdtype(Ac.dtype, np.number) or Ac.dtype == np.bool_):
        raise TypeError(f"{who}: non-numeric dtype {Ac.dtype}")
    if not np.all(np.isfinite(Ac.data)):
        raise ValueError(f"{who}: A contains non-finite values")
    return Ac
