"""Kernel variants of the sparse-QR factorization (``build_kernels.py --check`` compiles them).

The uberkernel (``kernels/sparse_qr/uberkernel.cu``) is a template over the
value type, the tile edge, the bundle size and the threads per block.
``ENGINE_VARIANTS`` are the instantiations the engine launches; they and the
kernels reporting their shared memory are the only ones declared
(``KERNEL_VARIANTS``, read by :mod:`scipy_gpuqr._kernels`); at run time a
call compiles the variants of its value type only, and
:func:`prefetch_engine_kernels` compiles what a factorization and its solves
use in parallel threads before they are asked for. Imports without cupy.
"""

from __future__ import annotations

import numpy as np

from ..._kernels import prefetch
from . import solve_kernels as sk

__all__ = ["KERNEL_VARIANTS", "ENGINE_VARIANTS", "ENGINE_THREADS", "UBERKERNEL_FILE",
           "kernel_name", "smem_kernel_name", "tile_smem_bytes", "engine_kernels",
           "prefetch_engine_kernels"]

#: The uberkernel's source file (relative to ``kernels/``).
UBERKERNEL_FILE = "sparse_qr/uberkernel.cu"

#: Threads per block of the engine's uberkernel variants.
ENGINE_THREADS = 256

#: (C type, TILE, BUNDLE, threads per block) the engine launches.
ENGINE_VARIANTS: tuple[tuple[str, int, int, int], ...] = (
    ("double", 32, 3, ENGINE_THREADS), ("float", 32, 3, ENGINE_THREADS),
)

_CTYPE = {"float64": "double", "float32": "float", "double": "double", "float": "float"}


def kernel_name(ctype: str, tile: int, bundle: int, threads: int) -> str:
    """Name expression of an uberkernel variant (``ctype``: 'double'/'float' or a dtype name)."""
    return f"gpuqr::uberkernel<{_CTYPE[str(ctype)]}, {tile}, {bundle}, {threads}>"


def smem_kernel_name(ctype: str, tile: int, bundle: int) -> str:
    """Name expression of the kernel reporting a variant's shared memory."""
    return f"gpuqr::uberkernel_smem_bytes<{_CTYPE[str(ctype)]}, {tile}, {bundle}>"


def tile_smem_bytes(tile: int, bundle: int, itemsize: int = 8) -> int:
    """Dynamic shared memory (bytes) of a variant (mirrors the kernel's ``*Smem`` structs)."""
    ld = tile + 1
    fac = bundle * tile * ld + 2 * tile * ld + 64 + tile
    w = 32 if tile >= 64 else tile
    app = bundle * tile * ld + tile * ld + bundle * tile * (w + 1) + tile * (w + 1)
    return itemsize * max(fac, app)


def _all_names() -> tuple[str, ...]:
    combos = sorted(set(ENGINE_VARIANTS))
    names = [kernel_name(*c) for c in combos]
    names += sorted({smem_kernel_name(c, t, b) for c, t, b, _ in combos})
    return tuple(names)


#: Name expressions to compile, per source file (relative to ``kernels/``).
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {UBERKERNEL_FILE: _all_names()}


def engine_kernels(dtype, tile: int = 32, bundle: int = 3, *, solve: bool = True) -> list:
    """What a GPU factorization of ``dtype`` values (and, with ``solve``, its
    solves) compiles: ``(file, declared variants, variants used)`` per kernel
    file, for :func:`scipy_gpuqr._kernels.prefetch` (nothing for a variant the
    engine does not have)."""
    ctype = "float" if np.dtype(dtype) == np.float32 else "double"
    if (ctype, tile, bundle, ENGINE_THREADS) not in ENGINE_VARIANTS:
        return []
    out = [(UBERKERNEL_FILE, KERNEL_VARIANTS[UBERKERNEL_FILE],
            (kernel_name(ctype, tile, bundle, ENGINE_THREADS),))]
    if solve:
        if (ctype, tile, bundle) in sk.APPLYQ_VARIANTS:
            out.append((sk.APPLYQ_FILE, sk.KERNEL_VARIANTS[sk.APPLYQ_FILE],
                        (sk.applyq_name(ctype, tile, bundle, True),)))
        out.append((sk.RSOLVE_FILE, sk.KERNEL_VARIANTS[sk.RSOLVE_FILE],
                    (sk.rsolve_name(ctype, False),)))
    return out


def prefetch_engine_kernels(dtype, tile: int = 32, bundle: int = 3, *,
                            solve: bool = True) -> list:
    """Start compiling :func:`engine_kernels` on worker threads, in parallel (each
    module once per process; nothing when compiled already). Needs a GPU."""
    return prefetch(engine_kernels(dtype, tile, bundle, solve=solve))
