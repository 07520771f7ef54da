"""Kernel variants of the sparse-QR factorization (``build_kernels.py --check`` compiles them).

The uberkernel (``kernels/sparse_qr/uberkernel.cu``) is a template over the
value type, the tile edge, the bundle size and the threads per block.
``ENGINE_VARIANTS`` are the instantiations the engine launches; they and the
kernels reporting their shared memory are the only ones compiled
(``KERNEL_VARIANTS``, read by :mod:`scipy_gpuqr._kernels`). Imports without
cupy.
"""

from __future__ import annotations

__all__ = ["KERNEL_VARIANTS", "ENGINE_VARIANTS", "ENGINE_THREADS", "UBERKERNEL_FILE",
           "kernel_name", "smem_kernel_name", "tile_smem_bytes"]

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
