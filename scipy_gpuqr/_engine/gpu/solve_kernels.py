"""Kernel variants of the GPU solve: Q application (``kernels/sparse_qr/applyq.cu``)
and the triangular solves with R's front blocks (``kernels/sparse_qr/rsolve.cu``).

``build_kernels.py --check`` compiles them (``KERNEL_VARIANTS``, read by
:mod:`scipy_gpuqr._kernels`); imports without cupy.
"""

from __future__ import annotations

__all__ = ["APPLYQ_FILE", "APPLYQ_VARIANTS", "APPLYQ_THREADS", "APPLYQ_COLUMNS",
           "KERNEL_VARIANTS", "applyq_name", "applyq_smem_name", "applyq_smem_bytes",
           "RSOLVE_FILE", "RSOLVE_THREADS", "rsolve_name", "RSOLVE_WIDE_THREADS",
           "RSOLVE_WIDE_ROWS", "rsolve_wide_name"]

#: The Q application's source file (relative to ``kernels/``).
APPLYQ_FILE = "sparse_qr/applyq.cu"

#: Threads per block.
APPLYQ_THREADS = 128

#: Right-hand-side columns per thread block (``ApplyQSmem::W``).
APPLYQ_COLUMNS = 32

#: (C type of the front pools, TILE, BUNDLE); each in a Qᵀ and a Q variant.
APPLYQ_VARIANTS: tuple[tuple[str, int, int], ...] = (("double", 32, 3), ("float", 32, 3))

_CTYPE = {"float64": "double", "float32": "float", "double": "double", "float": "float"}


def applyq_name(ctype: str, tile: int, bundle: int, trans: bool,
                threads: int = APPLYQ_THREADS) -> str:
    """Name expression of a variant (``trans``: Qᵀ, else Q)."""
    return (f"gpuqr::applyq<{_CTYPE[str(ctype)]}, {tile}, {bundle}, {threads}, "
            f"{'true' if trans else 'false'}>")


def applyq_smem_name(tile: int, bundle: int) -> str:
    """Name expression of the kernel reporting a variant's shared memory."""
    return f"gpuqr::applyq_smem_bytes<{tile}, {bundle}>"


def applyq_smem_bytes(tile: int, bundle: int) -> int:
    """Dynamic shared memory (bytes) of a variant (mirrors ``ApplyQSmem``)."""
    ld, ldw = tile + 1, APPLYQ_COLUMNS + 1
    return 8 * (bundle * tile * ld + tile * ld + bundle * tile * ldw + tile * ldw)


def _all_names() -> tuple[str, ...]:
    names = [applyq_name(c, t, b, tr) for c, t, b in APPLYQ_VARIANTS for tr in (True, False)]
    names += sorted({applyq_smem_name(t, b) for _, t, b in APPLYQ_VARIANTS})
    return tuple(names)


#: The triangular solve's source file (relative to ``kernels/``).
RSOLVE_FILE = "sparse_qr/rsolve.cu"

#: Threads per block of the triangular solve.
RSOLVE_THREADS = 256


def rsolve_name(ctype: str, trans: bool, threads: int = RSOLVE_THREADS) -> str:
    """Name expression of a triangular-solve variant (``trans``: Rᵀ, else R)."""
    return f"gpuqr::rsolve<{_CTYPE[str(ctype)]}, {threads}, {'true' if trans else 'false'}>"


#: Right-hand-side columns per thread block of the wide triangular solve (one
#: thread per column).
RSOLVE_WIDE_THREADS = 128

#: Most rows of R of a front the wide triangular solve takes (``RSOLVE_WIDE_ROWS``
#: in the source: its registers per thread).
RSOLVE_WIDE_ROWS = 32


def rsolve_wide_name(ctype: str, trans: bool, threads: int = RSOLVE_WIDE_THREADS) -> str:
    """Name expression of a wide triangular-solve variant (``trans``: Rᵀ, else R)."""
    return (f"gpuqr::rsolve_wide<{_CTYPE[str(ctype)]}, {threads}, "
            f"{'true' if trans else 'false'}>")


#: Name expressions to compile, per source file (relative to ``kernels/``).
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {
    APPLYQ_FILE: _all_names(),
    RSOLVE_FILE: tuple(name(c, tr) for name in (rsolve_name, rsolve_wide_name)
                       for c in ("double", "float") for tr in (False, True)),
}
