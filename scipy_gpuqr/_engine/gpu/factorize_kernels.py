"""Kernel variants of the sparse-QR engine (``build_kernels.py`` compiles them).

The uberkernel (kernels/gpuqr_uberkernel.cu) is a template over the value type,
the tile edge, the bundle size and the threads per block. ``ENGINE_VARIANTS``
are the instantiations the engine uses; ``TILE_VARIANTS`` the float64
(TILE, BUNDLE, threads) experiments of the tile benchmark.
"""

from __future__ import annotations

__all__ = ["KERNEL_VARIANTS", "TILE_VARIANTS", "ENGINE_VARIANTS", "kernel_name",
           "tile_kernel_name", "smem_kernel_name", "tile_smem_bytes",
           "UBERKERNEL_FILE"]

#: The uberkernel's source file.
UBERKERNEL_FILE = "sparse_qr/uberkernel.cu"

#: (TILE, BUNDLE, threads per block), float64
TILE_VARIANTS: tuple[tuple[int, int, int], ...] = (
    (32, 3, 256), (64, 2, 256), (64, 3, 256), (64, 3, 512),
)

#: (C type, TILE, BUNDLE, threads per block) the engine launches.
ENGINE_VARIANTS: tuple[tuple[str, int, int, int], ...] = (
    ("double", 32, 3, 256), ("float", 32, 3, 256),
)

_CTYPE = {"float64": "double", "float32": "float", "double": "double", "float": "float"}


def kernel_name(ctype: str, tile: int, bundle: int, threads: int) -> str:
    """Name expression of an uberkernel variant (``ctype``: 'double'/'float' or a dtype name)."""
    return f"gpuqr::uberkernel<{_CTYPE[str(ctype)]}, {tile}, {bundle}, {threads}>"


def smem_kernel_name(ctype: str, tile: int, bundle: int) -> str:
    """Name expression of the kernel reporting a variant's shared memory."""
    return f"gpuqr::uberkernel_smem_bytes<{_CTYPE[str(ctype)]}, {tile}, {bundle}>"


def tile_kernel_name(tile: int, bundle: int, threads: int) -> str:
    """Name expression of the float64 variant of the tile experiment."""
    return kernel_name("double", tile, bundle, threads)


def tile_smem_bytes(tile: int, bundle: int, itemsize: int = 8) -> int:
    """Dynamic shared memory of a variant (mirrors the kernel's Smem structs)."""
    ld = tile + 1
    fac = bundle * tile * ld + 2 * tile * ld + 64 + tile
    w = 32 if tile >= 64 else tile
    app = bundle * tile * ld + tile * ld + bundle * tile * (w + 1) + tile * (w + 1)
    return itemsize * max(fac, app)


def _all_names() -> tuple[str, ...]:
    combos = {("double", t, b, n) for t, b, n in TILE_VARIANTS} | set(ENGINE_VARIANTS)
    names = [kernel_name(*c) for c in sorted(combos)]
    names += sorted({smem_kernel_name(c, t, b) for c, t, b, _ in combos})
    return tuple(names)


KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {UBERKERNEL_FILE: _all_names()}
