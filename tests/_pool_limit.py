"""A real memory limit on CuPy's default pool, for the GPU tests of staging."""

from __future__ import annotations


def limited_pool(limit_bytes: int):
    """CuPy's default pool emptied of cached blocks and limited to what it holds
    now plus ``limit_bytes``: ``(pool, base)``, ``base`` being the bytes it holds
    (the caller sets the limit back with ``pool.set_limit(size=0)``)."""
    import cupy as cp
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    pool.set_limit(size=base + int(limit_bytes))
    return pool, base
