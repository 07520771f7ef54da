"""Kernel variants of the sparse-QR engine (``build_kernels.py`` compiles them).

``TILE_VARIANTS`` are the (TILE, BUNDLE, threads) instantiations of the tile
experiment's uberkernel (kernels/gpuqr_uberkernel.cu).
"""

from __future__ import annotations

__all__ = ["KERNEL_VARIANTS", "TILE_VARIANTS", "tile_kernel_name",
           "tile_smem_bytes"]

#: (TILE, BUNDLE, threads per block)
TILE_VARIANTS: tuple[tuple[int, int, int], ...] = (
    (32, 3, 256), (64, 2, 256), (64, 3, 256), (64, 3, 512),
)


def tile_kernel_name(tile: int, bundle: int, threads: int) -> str:
    """Name expression of the tile uberkernel variant."""
    return f"gpuqr::tile_uberkernel<{tile}, {bundle}, {threads}>"


def tile_smem_bytes(tile: int, bundle: int) -> int:
    """Dynamic shared memory of a variant (mirrors the kernel's Smem structs)."""
    ld = tile + 1
    fac = bundle * tile * ld + 2 * tile * ld + 64 + tile
    w = 32 if tile >= 64 else tile
    app = bundle * tile * ld + tile * ld + bundle * tile * (w + 1) + tile * (w + 1)
    return 8 * max(fac, app)


KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {
    "gpuqr_uberkernel.cu": tuple(
        [tile_kernel_name(*v) for v in TILE_VARIANTS]
        + sorted({f"gpuqr::tile_smem_bytes<{t}, {b}>" for t, b, _ in TILE_VARIANTS})),
}
