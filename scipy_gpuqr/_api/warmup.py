"""CuPy's own kernels of the GPU QR's rank decisions, compiled ahead of a first call.

The exact answer of a rank-deficient or ill-conditioned least-squares problem
decides lstsq's rank on R, on the GPU where the factorization ran there
(:class:`scipy_gpuqr._factor.lstsq.MinNormSolver`): R made dense on the device
and its σ test (Lanczos, the explicit inverse), the sparse COD checked against
the cutoff, cuSOLVER's SVD, the blocked dense COD with Heath's rule, the
null-space COD through R's solves. Those rules use CuPy's generic array
operations (fancy-index scatters, strided copies and updates, norms, ``any``,
``cupy.linalg``, cupyx's triangular solve), which CuPy compiles on their first
use in an environment (``CUPY_CACHE_DIR``) — seconds inside a user's first such
call. ``build_kernels.py`` (the cache warm-up) runs :func:`warm_rank_decisions`
after the package's own kernels and the iterative path, so that those kernels
are in the cache before a first call needs them.

:func:`start_gpu` (public) is the per-process counterpart: CUDA's start and
the kernels' loads from that cache, begun on background threads early in a
user's script, so that its first GPU call does not wait for them.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .._factor.factored import prefetch_kernels
from .._gpu import start_driver
from .lsqr import lsqr

__all__ = ["start_gpu", "warm_rank_decisions", "warm_problems", "SMALL_ORDER",
           "LARGE_ORDER"]


def start_gpu(dtype=np.float64) -> None:
    """Start this process's GPU work in the background, ahead of its first GPU call.

    A new process's first GPU call (``lsqr``, ``lsmr``, ``spsolve``,
    ``QRFactorization`` and the others with ``backend='gpu'``, or where the
    dispatcher picks the GPU) waits for CUDA's start: the driver and the
    device's context (about 0.3 s), then the CUDA libraries and the
    factorization's kernels, loaded from the kernel cache. Called early, at
    the top of a script for example, this starts all of that on background
    threads and returns at once, so that a first call made after the
    script's own work (reading the matrix, say) finds it done or under way.
    The package never does this by itself: importing it starts nothing.

    Parameters
    ----------
    dtype : data-type, optional
        The value type of the factorizations to come: float32 loads the
        single-precision kernels, anything else the float64 ones.

    Returns
    -------
    None

    Notes
    -----
    Nothing is computed and no result changes: a call that comes first waits
    only for what it needs, and anything that fails here is done again, and
    reported, by the call itself. On a machine without a CUDA driver it does
    nothing; without CuPy it only starts the driver. Where the calling thread already has a CUDA
    context (CuPy or another library used before), CUDA is started and only
    the kernels' loads are begun, from this thread. The context is the
    default device's primary context, the one CuPy uses.

    Examples
    --------
    >>> import scipy_gpuqr
    >>> scipy_gpuqr.start_gpu()          # at the top of a script
    """
    start_driver()                      # first: CUDA's start is the longest step
    try:
        prefetch_kernels(dtype)
    except Exception:  # noqa: BLE001 - the call does it again and reports what fails
        pass


#: Order of the problems whose rank the dense rules on the device decide whole
#: (lstsq's SVD and σ tests, from ``SVD_GPU_MIN_ORDER`` to ``DENSE_LIMIT``).
SMALL_ORDER = 1000

#: Order of the problems decided through R's solves or the device's dense COD
#: (beyond ``DENSE_LIMIT`` and from ``SOLVE_RANK_MIN_ORDER``).
LARGE_ORDER = 3200


def _base(n: int, rng) -> sp.csc_array:
    """A well-conditioned sparse n × n matrix whose R stays sparse: a dominant
    diagonal and random entries on four neighbouring diagonals."""
    offsets = (-7, -1, 0, 1, 7)
    diags = [rng.uniform(-1.0, 1.0, n - abs(k)) + (8.0 if k == 0 else 0.0) for k in offsets]
    return sp.csc_array(sp.diags_array(diags, offsets=offsets, shape=(n, n)))


def _with_dependent(B: sp.csc_array, rng, *, exact: bool) -> sp.csc_array:
    """B with six columns replaced by others: copies (``exact``) or combinations
    of two perturbed far below lstsq's cutoff (tiny nonzero pivots)."""
    n = B.shape[1]
    cols = [B[:, [j]] for j in range(n)]
    picks = rng.choice(n, 18, replace=False)
    for d, a, c in picks.reshape(6, 3):
        if exact:
            cols[d] = cols[a]
        else:
            # a perturbation far below lstsq's cutoff keeps the pivot off rounding level
            mix = 0.75 * cols[a] - 1.25 * cols[c]
            cols[d] = mix + 1e-15 * (mix != 0) * rng.uniform(-1.0, 1.0, (n, 1))
    return sp.csc_array(sp.hstack(cols))


def _with_singletons(B: sp.csc_array, count: int) -> sp.csc_array:
    """B with its first ``count`` columns reduced to their diagonal entries: column
    singletons, whose rows the factorization takes into R as they are (the block
    ``[R11 R12]`` that R's device solves handle as cupyx sparse matrices)."""
    keep = np.ones(B.shape[1])
    keep[:count] = 0.0
    D = sp.diags_array(B.diagonal() * (1.0 - keep))
    return sp.csc_array(B @ sp.diags_array(keep) + D)


def warm_problems(seed: int = 0) -> list:
    """``(name, A)`` of the warm-up's square problems, one per kind of rank decision.

    At :data:`SMALL_ORDER` (the dense rules decide whole):

    * ``combined``: six columns combinations of two others (tiny pivots, a
      clear gap: the sparse COD checked against the cutoff);
    * ``graded``: columns scaled from 1 down to 1e-20 (singular values through
      the cutoff without a gap: the SVD);
    * ``ill``: columns scaled from 1 down to 1e-10 (full rank that only the σ
      test confirms).

    At :data:`LARGE_ORDER`: ``combined`` and ``copied`` (six columns repeated:
    the device's dense COD, or the null-space COD through R's solves where the
    pivots are tiny but not zero) and ``ill`` (the randomized probe through R's
    solves; sixteen column singletons, so that the solves take R's singleton
    rows too).
    """
    rng = np.random.default_rng(seed)
    n = SMALL_ORDER
    out = [("combined small", _with_dependent(_base(n, rng), rng, exact=False))]
    for name, low in (("graded small", -20.0), ("ill small", -10.0)):
        scale = np.logspace(0.0, low, n)[rng.permutation(n)]
        out.append((name, sp.csc_array(_base(n, rng) @ sp.diags_array(scale))))
    n = LARGE_ORDER
    out.append(("combined large", _with_dependent(_base(n, rng), rng, exact=False)))
    out.append(("copied large", _with_dependent(_base(n, rng), rng, exact=True)))
    scale = np.logspace(0.0, -10.0, n)[rng.permutation(n)]
    out.append(("ill large", sp.csc_array(_with_singletons(_base(n, rng), 16)
                                          @ sp.diags_array(scale))))
    return out


def warm_rank_decisions() -> float:
    """Run the GPU QR's least-squares answer (``lsqr(backend='gpu')``) on
    :func:`warm_problems`, so that CuPy compiles the kernels of its rank
    decisions now.

    Returns
    -------
    float
        Seconds taken.
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    for _, A in warm_problems():
        lsqr(A, rng.standard_normal(A.shape[0]), backend="gpu")
    return time.perf_counter() - t0
