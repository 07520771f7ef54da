"""Which fronts leave the bucket scheduler: *dense fronts*, chosen from the analysis.

The uberkernel's tile tasks run every front of a launch at once, but their
Apply is bound by scalar fused multiply-adds, while a blocked Householder QR
whose trailing updates are cuBLAS GEMMs runs a large front at the tensor
cores' rate. A front whose Householder work (staircase honoured, the analysis'
count, :func:`scipy_gpuqr._symbolic.counts.front_work`) reaches
:data:`DEFAULT_DENSE_FLOPS` is therefore not bucket-scheduled: the
uberkernel still assembles it (S-Assemble, Pack-Assemble of its children),
the engine factorizes it right after the launch that completes its
assembly (:mod:`scipy_gpuqr._engine.dense_front`), and its parent packs its
contribution block later. In the front state machine such a front is
*factorized externally*: its local launches carry no task, they only defer
the parent's Pack-Assemble (:func:`dense_defer` launches) so that the GPU
engine can factorize it on a side stream while the launches of other
subtrees run; the launch that packs it waits for it.
"""

from __future__ import annotations

import numpy as np

from .._symbolic.counts import front_work

__all__ = ["DEFAULT_DENSE_FLOPS", "DENSE_COLUMNS_PER_LAUNCH", "dense_front_mask",
           "dense_defer"]

#: Householder flops (analysis count) from which a front is factorized as a dense
#: front (where the blocked QR beats the tile tasks, measured); ``None`` or ``inf``
#: turns the path off.
DEFAULT_DENSE_FLOPS = 1e10


#: A dense front defers its parent's Pack-Assemble by one launch per this many of its
#: columns (the blocked QR's panels are latency bound: a launch of tile tasks lasts as
#: long as the panels of some columns); 0 turns the overlap off (packed at the next
#: launch).
DENSE_COLUMNS_PER_LAUNCH = 16


def dense_defer(nfact, columns_per_launch: int = DENSE_COLUMNS_PER_LAUNCH):
    """Launches between a dense front's assembly and its parent's Pack-Assemble, minus 1.

    Parameters
    ----------
    nfact : int or ndarray of int
        Columns the front eliminates.
    columns_per_launch : int
        See :data:`DENSE_COLUMNS_PER_LAUNCH` (0: no deferral).
    """
    nfact = np.asarray(nfact, dtype=np.int64)
    if columns_per_launch <= 0:
        return np.zeros_like(nfact)
    return -(-nfact // int(columns_per_launch))


def dense_front_mask(analysis, min_flops) -> np.ndarray:
    """Boolean mask over the fronts: those factorized as dense fronts.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    min_flops : float or None
        Threshold on a front's Householder flops (None: no dense front).

    Returns
    -------
    ndarray of bool, shape (nfronts,)
    """
    fs = analysis.fronts
    nf = fs.nfronts
    if min_flops is None or not np.isfinite(min_flops) or nf == 0:
        return np.zeros(nf, dtype=bool)
    flops = getattr(analysis, "front_flops", None)     # the analysis' own count
    if flops is None or len(flops) != nf:
        flops = front_work(fs)["flops"]
    nfact = np.minimum(fs.fm, fs.fn)
    return (flops >= float(min_flops)) & (nfact > 0)
