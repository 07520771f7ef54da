"""A real memory limit on CuPy's default pool, for the GPU tests of staging."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def pool_limited(limit_bytes: int):
    """The body run with CuPy's default pool emptied of cached blocks and limited to
    what it holds now plus ``limit_bytes``; it is given ``(pool, base)``, ``base``
    being the bytes the pool held.

    On leaving, the limit is set back (``pool.set_limit(size=0)``) whether the body
    raised or not; where it did not, the pool must hold no more than ``base`` again:
    what the body made on the device is freed.
    """
    import cupy as cp
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    pool.set_limit(size=base + int(limit_bytes))
    try:
        yield pool, base
    finally:
        pool.set_limit(size=0)
    assert pool.used_bytes() <= base, (pool.used_bytes(), base)


def solve_unlimited_then_limited(A, b, limit_bytes: int):
    """``QRFactorization(A, backend='gpu').solve(b)`` without a limit, then under
    :func:`pool_limited` ``(limit_bytes)`` (the pool as found afterwards):
    ``(x0, x, info)``, ``info`` the limited call's ``QRFactorization.info``."""
    import gc

    from scipy_gpuqr import QRFactorization
    F0 = QRFactorization(A, backend="gpu")
    x0 = F0.solve(b)
    F0.free()
    with pool_limited(limit_bytes):
        F = QRFactorization(A, backend="gpu")
        x = F.solve(b)
        info = F.info
        F.free()
        del F
        gc.collect()
    return x0, x, info
