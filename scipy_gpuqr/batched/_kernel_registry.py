"""Kernel files, template instantiations and size limits of the batched kernels.

``KERNEL_VARIANTS`` maps each source file of ``kernels/batched/`` to the
template instantiations the drivers use. It is read by
:mod:`scipy_gpuqr._kernels` (build check and cache warm-up) and by the GPU
drivers (:mod:`scipy_gpuqr.batched._gpu`, ``_gpu_blocked`` and
``_gpu_common``) at run time, so both compile exactly the same module per
file. This module imports nothing (no cupy).
"""

from __future__ import annotations

__all__ = ["KERNEL_VARIANTS", "SMALL_MAX", "TINY_MAX", "PANEL", "PADDED_SIZES",
           "small_name", "panel_name", "solve_name", "padded_size", "SMALL_FILES",
           "SEPARATE_FILES",
           "FUSED_MAX", "ROWS_MAX", "ROWS_PANEL", "ROWS_THREADS", "STAGE_COLS",
           "rows_name", "MMA_SIZES", "MMA_FILE", "ROWS_FILE", "PANEL_FILE",
           "SOLVE_FILE", "STATUS_FILE", "status_name", "VB_FILE", "vb_name",
           "MMA64_FILE", "MMA64_NAME", "MMA64_SMEM", "MMA_ROWS_NAME", "mma_rows_smem",
           "MMA_SWAP_NAME", "MMA_MOVE_STRIDE", "MMA_COPY_NAME", "MMA_LEFT_NAME", "left_stage",
           "JACOBI_FILE", "jacobi_name", "JACOBI_PREFIX", "jacobi_inverse_name", "VB_SUFFIX",
           "INVERSE_FILE", "INV_BLOCKS", "inverse_name"]

#: Largest n handled by the one-thread-per-row register kernels.
SMALL_MAX = 32

#: Largest n of the thread-per-matrix path of the LU / inverse kernels
#: (``GPUQR_TINY_MAX`` in kernels/batched/lu_warp.cu: no shared memory, a
#: matrix per thread).
TINY_MAX = 2

#: Column block of the panel kernels of n > ROWS_MAX (template parameter NB
#: of kernels/batched/panel.cu).
PANEL = 32

#: Largest n factorized (and solved) by one kernel per matrix, a row per
#: thread (``getrf_rows<T, FUSED_MAX, FUSED_MAX>``, ``solve_smem``).
FUSED_MAX = 64

#: Largest n of the blocked path with one thread per panel row.
ROWS_MAX = 512

#: Panel width of that path (the kernel's; panels of 2 * ROWS_PANEL columns
#: are factorized as two halves), and its largest block (rows of the first panel).
ROWS_PANEL = 32
ROWS_THREADS = ROWS_MAX

#: Columns of the staging buffer of the parallel swap (kStageCols in
#: kernels/batched/rows.cu).
STAGE_COLS = 64

#: Register sizes of the inverse and Cholesky kernels, which take a runtime
#: n <= N and pad with the identity (LU has one variant for every n).
PADDED_SIZES = (1, 2, 4, 8, 16, 24, 32)

#: Sizes whose float64 LU runs on the FP64 tensor cores on sm_80+
#: (``getrf_mma<double, n>`` of kernels/batched/lu_mma.cu: panels of 8
#: columns, trailing updates by DMMA); the other sizes, and older GPUs, use
#: ``getrf_warp``. The float64 inverse of every n whose padded size is here
#: runs ``getri_mma<double, size>`` (blocked Gauss-Jordan, same file).
MMA_SIZES = (32,)

#: Source file of the tensor-core LU and inverse.
MMA_FILE = "batched/lu_mma.cu"

#: Source file of the float64 LU of 32 < n <= 64 on the FP64 tensor cores,
#: a warp per matrix (``getrf_mma64<double>``, the name below), and of the
#: panel step of the blocked LU on them (``getrf_mma_rows<double>``).
MMA64_FILE = "batched/lu_mma64.cu"
MMA64_NAME = "getrf_mma64<double>"

#: Its dynamic shared memory per block (kSmemBytes of that file: the padded
#: 64 x 66 tile, two 10-double broadcast buffers, 128 ints).
MMA64_SMEM = (64 * 66 + 2 * 10) * 8 + 2 * 64 * 4

#: The panel step of the blocked float64 LU on the FP64 tensor cores (same
#: file): getrf_rows's panel of 32 columns, a warp per 64 rows.
MMA_ROWS_NAME = "getrf_mma_rows<double>"

#: Its row moves in the columns outside the panel, a block per 64 of them
#: (same file), and the ints per matrix of the moves it reads.
MMA_SWAP_NAME = "rows_swap<double>"
MMA_MOVE_STRIDE = 1 + 4 * 32

#: The first panel's moves as a copy of the input's other columns in the
#: panel's row order (no copy of the input beforehand), and the earlier
#: column blocks' L columns swapped once at the end (same file).
MMA_COPY_NAME = "rows_copy_perm<double>"
MMA_LEFT_NAME = "rows_swap_left<double>"


def left_stage(n: int, outer: int) -> int:
    """Doubles of ``rows_swap_left``'s staging area for order ``n`` and
    column block ``outer``: 8 columns of a 512-row panel's moved rows
    (30 KiB: six blocks share an SM), or 16 columns of the first block's
    moved rows where they need more (n = 512 with blocks of 128: 48 KiB,
    128-byte row segments). A larger stage at small n costs blocks per SM
    and no time is won by the wider chunks there."""
    return max((64 * 8 - 32) * 8, 16 * (n - outer))


def mma_rows_smem(warps: int) -> int:
    """Dynamic shared memory of ``getrf_mma_rows`` with ``warps`` warps: 2 x 8
    candidate slots of 10 doubles and the (64 warps) x 34 panel (the row
    moves outside the panel are ``rows_swap``'s: no staging buffer, more
    blocks per SM)."""
    return (2 * 8 * 10 + 64 * warps * 34) * 8

#: Source file of the n > 32 kernels with a row per thread (LU and Cholesky
#: panels, one-kernel LU for n <= FUSED_MAX, solves in shared memory).
ROWS_FILE = "batched/rows.cu"

#: Source file of the panel steps with a thread block per matrix (n > ROWS_MAX).
PANEL_FILE = "batched/panel.cu"

#: Source file of the solves with a thread per right-hand side column (any n).
SOLVE_FILE = "batched/solve.cu"

#: Source file of the device-side summaries of ``info`` and of the finiteness
#: checks (``info_scan``, ``nonfinite_scan``): what the public functions read
#: back instead of a per-matrix array.
STATUS_FILE = "batched/status.cu"

#: Source file of block_jacobi's gather of a CSR matrix's diagonal blocks
#: (``jacobi_gather<T, I>``: float/double data, int/long long indices).
JACOBI_FILE = "batched/jacobi.cu"


def jacobi_name(dtype: str, index: str) -> str:
    """``jacobi_gather<double, int>`` and friends (``index``: 'int32' or 'int64')."""
    return f"jacobi_gather<{_CTYPES[dtype]}, {dict(int32='int', int64='long long')[index]}>"


#: The n <= 32 inverse kernels' twins that read the diagonal blocks of a CSR
#: matrix straight from it (``jacobi_getri_warp``, ``jacobi_getri_mma``:
#: block_jacobi's one launch per stack of blocks), each in its dense twin's
#: file; a third template argument, the index type.
JACOBI_PREFIX = "jacobi_"


def jacobi_inverse_name(kernel: str, dtype: str, index: str, n: int) -> str:
    """``jacobi_getri_warp<double, int, 8>`` and friends (``kernel``: the dense
    twin's name, ``getri_warp`` or ``getri_mma``; ``index``: 'int32' or 'int64')."""
    return (f"{JACOBI_PREFIX}{kernel}<{_CTYPES[dtype]}, "
            f"{dict(int32='int', int64='long long')[index]}, {n}>")


#: Source file of the blocked inverse's own kernels for n > FUSED_MAX (the
#: inverses of the diagonal blocks' triangles, ``tri_inv_blocks<T, NB>``, and
#: the permutation matrix of the pivots, ``pivot_identity<T>``; the rest is
#: cuBLAS GEMMs).
INVERSE_FILE = "batched/inverse.cu"

#: Block rows of that inverse (template NB of ``tri_inv_blocks``).
INV_BLOCKS = (32, 64)


def inverse_name(kernel: str, dtype: str, nb: int = 0) -> str:
    """``tri_inv_blocks<double, 32>``, ``pivot_identity<float>`` (nb unused)."""
    if kernel == "tri_inv_blocks":
        return f"{kernel}<{_CTYPES[dtype]}, {nb}>"
    return f"{kernel}<{_CTYPES[dtype]}>"


#: Source file of the gathers and scatters of the variable-size batches
#: (``vb_gather``, ``vb_scatter``; float, double and int for the pivots) and
#: of the size classes of a padded stack (``vb_classes``).
VB_FILE = "batched/vbatched.cu"

#: Source file of each n <= 32 kernel family (each variant is compiled on
#: its own, when first used).
SMALL_FILES = {"getrf_warp": "batched/lu_warp.cu", "getri_warp": "batched/lu_warp.cu",
               "gesv_warp": "batched/lu_warp.cu", "getrs_warp": "batched/solve_warp.cu",
               "potrs_warp": "batched/solve_warp.cu",
               "potrf_small": "batched/cholesky.cu", "getrf_mma": MMA_FILE,
               "getri_mma": MMA_FILE, "gesv_mma": MMA_FILE}

#: The files of :data:`SMALL_FILES`: the run time compiles each of their
#: variants alone (a call needs one order and type of a family of hundreds),
#: and the cache warm-up and the NVRTC check compile them the same way.
SEPARATE_FILES = frozenset(SMALL_FILES.values())

#: The factorization kernels of n <= 32 with per-matrix orders of a padded
#: stack (``<name>_vb``: two more arguments, the sizes and their width; the
#: ``*_vbatched`` functions), each in its fixed-size twin's file.
VB_SUFFIX = "_vb"
SMALL_FILES.update({k + VB_SUFFIX: SMALL_FILES[k] for k in
                    ("getrf_warp", "getri_warp", "gesv_warp", "potrf_small", "getrf_mma",
                     "getri_mma", "gesv_mma")})
SMALL_FILES.update({JACOBI_PREFIX + k: SMALL_FILES[k] for k in ("getri_warp", "getri_mma")})

_CTYPES = {"float32": "float", "float64": "double"}


def small_name(kernel: str, dtype: str, n: int) -> str:
    """``getrf_warp<double, 8>`` and friends."""
    return f"{kernel}<{_CTYPES[dtype]}, {n}>"


def panel_name(kernel: str, dtype: str) -> str:
    """``getrf_panel<double, 32>``, ``potrf_panel<float, 32>``."""
    return f"{kernel}<{_CTYPES[dtype]}, {PANEL}>"


def solve_name(kernel: str, dtype: str) -> str:
    """``getrs_batched<double>``, ``potrs_batched<float>``."""
    return f"{kernel}<{_CTYPES[dtype]}>"


def status_name(kernel: str, dtype: str) -> str:
    """``info_scan<double>``, ``nonfinite_scan<float>``."""
    return f"{kernel}<{_CTYPES[dtype]}>"


def vb_name(kernel: str, dtype: str) -> str:
    """``vb_gather<double>``, ``vb_scatter<int>``."""
    return f"{kernel}<{dict(_CTYPES, int32='int')[dtype]}>"


def rows_name(kernel: str, dtype: str, nb: int, maxt: int) -> str:
    """``getrf_rows<double, 32, 512>``, ``solve_smem<float, 64>``,
    ``chol_finish<double>``, ``transpose_batched<float>`` (nb, maxt unused), ..."""
    if kernel in ("solve_smem", "trsm_lunit"):
        return f"{kernel}<{_CTYPES[dtype]}, {nb}>"
    if kernel in ("chol_finish", "transpose_batched"):
        return f"{kernel}<{_CTYPES[dtype]}>"
    return f"{kernel}<{_CTYPES[dtype]}, {nb}, {maxt}>"


def padded_size(n: int) -> int:
    """Smallest register size in :data:`PADDED_SIZES` holding n."""
    return next(s for s in PADDED_SIZES if s >= n)


KERNEL_VARIANTS = {
    "batched/lu_warp.cu": tuple(
        small_name(k + v, dt, n) for v in ("", VB_SUFFIX) for k in ("getrf_warp", "gesv_warp")
        for dt in _CTYPES for n in range(1, SMALL_MAX + 1)) + tuple(
        small_name("getri_warp" + v, dt, n) for v in ("", VB_SUFFIX) for dt in _CTYPES
        for n in PADDED_SIZES) + tuple(
        jacobi_inverse_name("getri_warp", dt, ix, n) for dt in _CTYPES
        for ix in ("int32", "int64") for n in PADDED_SIZES),
    MMA64_FILE: (MMA64_NAME, MMA_ROWS_NAME, MMA_SWAP_NAME, MMA_COPY_NAME, MMA_LEFT_NAME),
    MMA_FILE: tuple(small_name(k + v, "float64", n) for v in ("", VB_SUFFIX)
                    for k in ("getrf_mma", "getri_mma", "gesv_mma") for n in MMA_SIZES) + tuple(
        jacobi_inverse_name("getri_mma", "float64", ix, n) for ix in ("int32", "int64")
        for n in MMA_SIZES),
    "batched/cholesky.cu": tuple(
        small_name("potrf_small" + v, dt, n) for v in ("", VB_SUFFIX) for dt in _CTYPES
        for n in PADDED_SIZES),
    PANEL_FILE: tuple(
        panel_name(k, dt) for k in ("getrf_panel", "potrf_panel") for dt in _CTYPES),
    SOLVE_FILE: tuple(
        solve_name(k, dt) for k in ("getrs_batched", "potrs_batched") for dt in _CTYPES),
    "batched/solve_warp.cu": tuple(
        small_name(k, dt, n) for k in ("getrs_warp", "potrs_warp")
        for dt in _CTYPES for n in range(1, SMALL_MAX + 1)),
    STATUS_FILE: tuple(
        status_name(k, dt) for k in ("info_scan", "nonfinite_scan") for dt in _CTYPES),
    JACOBI_FILE: tuple(jacobi_name(dt, ix) for dt in _CTYPES for ix in ("int32", "int64")),
    INVERSE_FILE: tuple(inverse_name("tri_inv_blocks", dt, nb) for dt in _CTYPES
                        for nb in INV_BLOCKS) + tuple(
        inverse_name("pivot_identity", dt) for dt in _CTYPES),
    VB_FILE: tuple(
        vb_name(k, dt) for k in ("vb_gather", "vb_scatter")
        for dt in ("float32", "float64", "int32")) + ("vb_classes",),
    ROWS_FILE: tuple(
        rows_name(k, dt, nb, maxt)
        for dt in _CTYPES
        for k in ("getrf_rows", "potrf_rows")
        for nb, maxt in ((FUSED_MAX, FUSED_MAX), (ROWS_PANEL, ROWS_THREADS))) + tuple(
        rows_name("solve_smem", dt, FUSED_MAX, FUSED_MAX) for dt in _CTYPES) + tuple(
        rows_name("trsm_lunit", dt, ROWS_PANEL, ROWS_THREADS) for dt in _CTYPES) + tuple(
        rows_name(k, dt, 0, 0) for dt in _CTYPES for k in ("chol_finish", "transpose_batched")),
}
