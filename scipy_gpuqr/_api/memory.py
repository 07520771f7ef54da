"""Host memory the package keeps between calls, given back on request."""

from __future__ import annotations

from .._engine.gpu.pinned_ahead import kept_pinned_bytes, release_kept_pinned

__all__ = ["release_pinned_memory"]


def release_pinned_memory() -> int:
    """Give back the pinned host memory kept for later GPU calls.

    A factorization over several GPUs pins the host memory its devices'
    threads will use before they start, and keeps those blocks for later
    calls (at most four blocks and 1/16 of the host's physical memory), so
    that a repeated call pins nothing: pinning while the devices work stalls
    all of them. The blocks come from CuPy's pinned memory pool but stay in
    use while kept, so the pool's ``free_all_blocks()`` alone does not free
    them. This lets go of them and then frees the pool's unused blocks.

    Returns
    -------
    int
        Bytes of kept blocks let go of (0 where none were kept).

    Examples
    --------
    >>> import scipy_gpuqr
    >>> scipy_gpuqr.release_pinned_memory() >= 0
    True
    """
    released = kept_pinned_bytes()
    release_kept_pinned()
    if released:
        import cupy
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    return released
