"""GPU drivers of the batched LU / Cholesky / solves / inverse for n > 32.

Every function takes and returns CuPy arrays (stacks ``(B, n, n)``,
C-contiguous, float32 or float64) and computes on the current device and
stream; :mod:`scipy_gpuqr.batched._gpu` calls them for n > 32.

Methods of the factorizations (``method=``; the default by n and
operation, :func:`default_method`):

* ``'fused'`` (n <= 64; the default for the float32 LU, and for float64
  without FP64 tensor cores): the whole factorization in one
  kernel, one thread per row holding the row in registers
  (``getrf_rows<T, 64, 64>`` / ``potrf_rows<T, 64, 64>`` of
  ``kernels/batched/rows.cu``).
* ``'mma64'`` (float64, n <= 64, sm_80+; the default there): one warp per matrix, the
  matrix in shared memory, panels of 8 columns with the trailing updates on
  the FP64 tensor cores (``getrf_mma64`` of ``kernels/batched/lu_mma64.cu``).
* ``'rows_mma'`` (float64, n <= 512, sm_80+): as ``'rows'`` with the panel
  kernel ``getrf_mma_rows`` (same file: a warp per 64 panel rows, sub-panels
  of 8 columns updated by DMMA, one barrier per column), the row moves
  outside each panel by ``rows_swap`` and U12 solved by ``trsm_lunit``; no
  copy of the input (the first panel reads it, ``rows_copy_perm`` writes the
  rest in the panel's row order), the earlier column blocks' L columns
  swapped once at the end (``rows_swap_left``), and a large batch in parts
  on streams of their own, so that one part's latency-bound panels run
  beside another's passes over memory (:func:`rows_streams`).
* ``'rows'`` (n <= 512): blocked right-looking, the panels factorized by a
  kernel with one thread per panel row. LU: blocks of :func:`rows_outer`
  columns, each factorized as panels of 32 left-looking inside the block
  (one barrier per column, lazy row swaps, the parallel swap and
  U12 = L11⁻¹ A12 in the panel kernel of the block's first panel), the
  trailing update a cuBLAS strided-batched GEMM with k = the block. Cholesky: panels of 32
  (L21 comes out of the same kernel), GEMM updates with k = 32.
* ``'panel'`` (any n; the default for n > 512, beyond one thread per panel
  row): panel steps with a thread block per matrix and block-wide barriers
  per column (``kernels/batched/panel.cu``), panels of 32 and cuBLAS GEMM
  trailing updates.

Solves with n <= 64 hold the factor in shared memory (``solve_smem``), larger
ones use a thread per right-hand side column
(:func:`scipy_gpuqr.batched._gpu_common.solve_by_columns`). The inverse of
n < 64 solves with the identity (generated in the kernel); from n = 64 on
it is U⁻¹ L⁻¹ P by block rows, cuBLAS GEMMs around the inverses of the
diagonal blocks' triangles (:func:`inverse_blocks`).
"""

from __future__ import annotations

import functools

import numpy as np

from . import _gpu_common as _common
from ._gpu_common import NO_REPORT, NULL, device_id, dtname, solve_by_columns
from ._kernel_registry import (FUSED_MAX, INV_BLOCKS, INVERSE_FILE, KERNEL_VARIANTS,
                               MMA64_FILE, MMA64_NAME, MMA64_SMEM, MMA_COPY_NAME,
                               MMA_LEFT_NAME, MMA_MOVE_STRIDE, MMA_ROWS_NAME, MMA_SWAP_NAME,
                               PANEL, PANEL_FILE, ROWS_FILE, ROWS_MAX, ROWS_PANEL,
                               ROWS_THREADS, STAGE_COLS, inverse_name, left_stage,
                               mma_rows_smem, panel_name, rows_name)
from .._kernels import load_module

__all__ = ["getrf", "potrf", "getrs", "potrs", "inverse", "inverse_blocks",
           "inverse_block", "inverse_gemms", "BLOCKED_INVERSE_MIN", "default_method",
           "METHODS", "CHOL_SPLIT", "CHOL_FINISH", "has_mma"]

#: Factorization methods, see the module docstring.
METHODS = ("fused", "mma64", "rows", "rows_mma", "panel")

#: Threads per block of the panel kernels (GPUQR_PANEL_THREADS of panel.cu).
PANEL_THREADS = 256


def default_method(n: int, op: str = "lu", dtype=None) -> str:
    """The factorization method for n > 32 (``op`` 'lu' or 'chol', ``dtype``
    the matrices') unless one is asked for.

    The float64 LU runs on the FP64 tensor cores where the device has them
    (sm_80+): the whole matrix in one warp's registers and shared memory for
    n <= 64 (``'mma64'``), the row panels' updates for n <= 512
    (``'rows_mma'``). Cholesky uses panels for every n <= 512: its one-kernel
    variant (255 registers per thread, spilling) is slower at n = 64.
    """
    tensor = (op == "lu" and dtype is not None and dtype == np.float64
              and has_mma(device_id()))
    if n <= FUSED_MAX and op == "lu":
        return "mma64" if tensor else "fused"
    if n <= ROWS_MAX:
        return "rows_mma" if tensor else "rows"
    return "panel"


@functools.lru_cache(maxsize=None)
def has_mma(device: int) -> bool:
    """FP64 tensor cores (mma.m8n8k4.f64): compute capability 8.0 or newer."""
    cc = _common.cupy().cuda.Device(device).compute_capability
    return int(cc) >= 80


def _check_method(method, n: int, op: str = "lu", dtype=None) -> str:
    method = default_method(n, op, dtype) if method is None else method
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method in ("mma64", "rows_mma"):
        nmax = FUSED_MAX if method == "mma64" else ROWS_MAX
        if op != "lu" or n > nmax or dtype != np.float64 or not has_mma(device_id()):
            raise ValueError(f"method {method!r} is the float64 LU of n <= {nmax} on "
                             f"sm_80+, got n={n}, {np.dtype(dtype).name}, op {op!r}")
    if method == "fused" and n > FUSED_MAX:
        raise ValueError(f"method 'fused' handles n <= {FUSED_MAX}, got n={n}")
    if method == "rows" and n > ROWS_MAX:
        raise ValueError(f"method 'rows' handles n <= {ROWS_MAX}, got n={n}")
    return method


@functools.lru_cache(maxsize=None)
def _rows_function(kernel: str, dt: str, nb: int, maxt: int, device: int):
    module = load_module(ROWS_FILE, KERNEL_VARIANTS[ROWS_FILE])
    return module.get_function(rows_name(kernel, dt, nb, maxt))


@functools.lru_cache(maxsize=None)
def _mma64_function(device: int, name: str = MMA64_NAME):
    return load_module(MMA64_FILE, KERNEL_VARIANTS[MMA64_FILE]).get_function(name)


@functools.lru_cache(maxsize=None)
def _panel_function(kernel: str, dt: str, device: int):
    module = load_module(PANEL_FILE, KERNEL_VARIANTS[PANEL_FILE])
    return module.get_function(panel_name(kernel, dt))


def _rows_threads(m: int) -> int:
    return -(-m // 32) * 32


def _with_smem(fn, smem: int) -> int:
    """Allow ``smem`` bytes of dynamic shared memory (beyond 48 KiB with the static part)."""
    if smem and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    return smem


def _gemm_strided(a, m: int, nn: int, k: int, a_off: int, lda: int,
                  b_off: int, ldb: int, c_off: int, ldc: int, trans_a: bool,
                  batch: int, stride: int, alpha: float, beta: float, handle=None):
    """Column-major C = alpha op(A) B + beta C inside the stack ``a``.

    ``handle``: a cuBLAS handle with its stream and the host pointer mode
    set (:func:`_lanes`); None: CuPy's handle of the device, on the
    current stream.
    """
    cp = _common.cupy()
    from cupy_backends.cuda.libs import cublas

    item, base = a.itemsize, a.data.ptr
    al, be = np.array(alpha, a.dtype), np.array(beta, a.dtype)
    gemm = cublas.dgemmStridedBatched if a.dtype == np.float64 else cublas.sgemmStridedBatched

    def call(h):
        gemm(h, cublas.CUBLAS_OP_T if trans_a else cublas.CUBLAS_OP_N,
             cublas.CUBLAS_OP_N, m, nn, k, al.ctypes.data,
             base + a_off * item, lda, stride,
             base + b_off * item, ldb, stride, be.ctypes.data,
             base + c_off * item, ldc, stride, batch)

    if handle is not None:
        call(handle)
        return
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        call(handle)
    finally:
        cublas.setPointerMode(handle, mode)


def _gemm_rows(a, n: int, r0: int, nr: int, c0: int, nc: int, kk: int, k: int,
               handle=None) -> None:
    """Row-major A[r0:r0+nr, c0:c0+nc] -= A[r0:r0+nr, kk:kk+k] @ A[kk:kk+k, c0:c0+nc]."""
    if nr > 0 and nc > 0 and k > 0:
        # row-major C -= L U  ==  column-major Cᵀ -= Uᵀ Lᵀ
        _gemm_strided(a, nc, nr, k, kk * n + c0, n, r0 * n + kk, n, r0 * n + c0, n,
                      False, a.shape[0], n * n, -1.0, 1.0, handle)


def _lu_update(a, n: int, k0: int, nb: int) -> None:
    """Row-major A22 -= L21 @ U12 after the panel at k0 (width nb)."""
    k1 = k0 + nb
    if k1 < n:
        r = n - k1
        # row-major A22 -= L21 @ U12  ==  column-major A22ᵀ -= U12ᵀ L21ᵀ
        _gemm_strided(a, r, r, nb, k0 * n + k1, n, k1 * n + k0, n,
                      k1 * n + k1, n, False, a.shape[0], n * n, -1.0, 1.0)


#: Largest trailing block of the blocked Cholesky updated by one GEMM; a
#: larger one is split in halves (recursively) so that the blocks above its
#: diagonal, which no later step reads, are not computed: about 3/4 of the
#: full update's flops for one split, towards 1/2 for deeper ones.
CHOL_SPLIT = 128


def _chol_block(w, n: int, k0: int, nb: int, i0: int, j0: int, mi: int, mj: int) -> None:
    """Row-major A[i0:i0+mi, j0:j0+mj] -= L[i0:i0+mi] L[j0:j0+mj]ᵀ, L = A[:, k0:k0+nb]."""
    # column-major view: the block's transpose (mj x mi) -= (L_jᵀ)ᵀ L_iᵀ
    _gemm_strided(w, mj, mi, nb, j0 * n + k0, n, i0 * n + k0, n, i0 * n + j0, n,
                  True, w.shape[0], n * n, -1.0, 1.0)


def _chol_lower(w, n: int, k0: int, nb: int, i0: int, m: int) -> None:
    """The lower triangle (by blocks) of rows and columns [i0, i0+m) of
    A -= L Lᵀ, L = A[:, k0:k0+nb]: one GEMM up to :data:`CHOL_SPLIT`, else
    the two diagonal halves (recursively) and the block below the first."""
    h = -(-(m // 2) // 32) * 32
    if m <= CHOL_SPLIT or not 0 < h < m:
        _chol_block(w, n, k0, nb, i0, i0, m, m)
        return
    _chol_lower(w, n, k0, nb, i0, h)
    _chol_block(w, n, k0, nb, i0 + h, i0, m - h, h)
    _chol_lower(w, n, k0, nb, i0 + h, m - h)


def _chol_update(w, n: int, k0: int, nb: int) -> None:
    """Row-major A22 -= L21 L21ᵀ after the panel at k0 (width nb), on and
    below the diagonal blocks (the panels read only the lower triangle)."""
    k1 = k0 + nb
    if k1 < n:
        _chol_lower(w, n, k0, nb, k1, n - k1)


# ----------------------------------------------------------------------------
# LU
# ----------------------------------------------------------------------------

def getrf(a, piv, info, method: str | None = None):
    """LU of the stack ``a`` (B, n, n), n > 32; returns the new ``lu`` array.

    ``piv`` (B, n) int32 and ``info`` (B,) int32 are filled (``info`` -1
    for a matrix holding an inf or NaN). ``a`` is not modified.
    """
    bsz, n = a.shape[0], a.shape[-1]
    method = _check_method(method, n, "lu", a.dtype)
    dt = dtname(a.dtype)
    dev = device_id()
    if method == "mma64":
        lu = _common.alloc(a.shape, a.dtype)
        vec = n == FUSED_MAX and a.data.ptr % 16 == 0 and lu.data.ptr % 16 == 0
        _mma64_function(dev)((bsz,), (32,), (a, lu, piv, info, np.int32(n),
                                             np.int32(1 if vec else 0)),
                             shared_mem=MMA64_SMEM)
        return lu
    if method == "fused":
        lu = _common.alloc(a.shape, a.dtype)
        fn = _rows_function("getrf_rows", dt, FUSED_MAX, FUSED_MAX, dev)
        fn((bsz,), (_rows_threads(n),),
           (a, lu, piv, info, np.int32(n), np.int32(0), np.int32(n)))
        return lu
    if method == "rows_mma":                # the first panel reads a: no copy of it
        lu = _common.alloc(a.shape, a.dtype)
        _rows_lu(lu, piv, info, True, src=a)
        return lu
    lu = a.copy()
    if method == "rows":
        _rows_lu(lu, piv, info, False)
        return lu
    info.fill(0)
    fn = _panel_function("getrf_panel", dt, dev)
    for k0 in range(0, n, PANEL):
        smem = _with_smem(fn, (n - k0) * PANEL * a.itemsize + 32 * (a.itemsize + 4))
        fn((bsz,), (PANEL_THREADS,), (lu, piv, info, np.int32(n), np.int32(k0)),
           shared_mem=smem)
        _lu_update(lu, n, k0, min(PANEL, n - k0))
    return lu


#: Column block of the blocked LU's trailing updates by n (``_rows_lu``'s
#: ``outer``; the largest n up to which each applies, then the block): a
#: wider block updates the trailing matrix fewer times (each update reads
#: and writes all of it) at the cost of more narrow GEMMs inside the block.
ROWS_OUTER = ((128, 2 * ROWS_PANEL), (ROWS_MAX, 4 * ROWS_PANEL))


def rows_outer(n: int) -> int:
    """The column block ``outer`` of :func:`_rows_lu` for order ``n``."""
    for nmax, outer in ROWS_OUTER:
        if n <= nmax:
            return outer
    return ROWS_OUTER[-1][1]


def _rows_lu(lu, piv, info, mma: bool = False, outer: int | None = None,
             src=None, defer_left: bool = True, streams: int | None = None) -> None:
    """Blocked LU of ``lu`` in place (of ``src`` into ``lu`` where given):
    blocks of ``outer`` columns (a multiple of ROWS_PANEL; None:
    :func:`rows_outer`), each factorized as panels of ROWS_PANEL = 32
    columns left-looking inside the block.

    Panel j of a block starting at kb (columns kj = kb + 32 j ..): its columns
    get the updates of the block's earlier panels (one GEMM, k = kj - kb),
    the panel kernel factorizes it and swaps the rows in every other column,
    then its rows of U right of it get the same updates (one GEMM) and are
    solved with its L11 (``trsm_lunit``; the ``rows`` panel kernel of the
    block's first panel solves them itself). One GEMM with k = outer then
    updates the trailing matrix. ``outer = 64`` is LAPACK's recursive getrf2
    one level deep. ``mma``: the panels by ``getrf_mma_rows`` (float64,
    sm_80+), each followed by ``rows_swap``, which moves the panel's pivot
    rows in the columns outside it (a block of 256 threads per 64 columns,
    not the panel kernel's few warps).

    ``src`` (a stack of ``lu``'s shape, not modified; ``lu``'s contents
    beforehand are then not read): with ``mma`` the first panel reads it
    and ``rows_copy_perm`` writes the rest of ``lu`` as its rows in the
    panel's order (one pass instead of a copy and a swap); without, it is
    copied into ``lu`` first. ``defer_left``
    (``mma`` only): the panels swap the L columns of their own block only,
    the earlier blocks' L columns (which no later step reads) get all
    their later swaps at once at the end (``rows_swap_left``).

    ``streams`` (None: :func:`rows_streams` with ``mma``, else 1): the
    batch in that many parts of consecutive matrices, each factorized on a
    stream of its own (:func:`_lanes`), their launches issued in turn, the
    current stream waiting for all of them at the end. The panel kernels
    are latency-bound (32 dependent pivot steps; the first panels of n =
    512 one block per SM by shared memory) and the other steps are passes
    over memory: on two streams one part's panels run beside the other
    part's swaps, solves and GEMMs on the same SMs.
    """
    bsz, n = lu.shape[0], lu.shape[-1]
    outer = rows_outer(n) if outer is None else outer
    if outer <= 0 or outer % ROWS_PANEL:
        raise ValueError(f"outer must be a positive multiple of {ROWS_PANEL}, got {outer}")
    parts = (rows_streams(n, bsz) if mma else 1) if streams is None else streams
    parts = max(1, min(parts, bsz))
    moves = _common.alloc((bsz, MMA_MOVE_STRIDE), np.int32) if mma else None
    if parts == 1:
        for _ in _rows_lu_launches(lu, piv, info, mma, outer, src, defer_left, moves):
            pass
        return
    lanes = _lanes(device_id(), parts)
    cuts = [bsz * i // parts for i in range(parts + 1)]
    runs = [_rows_lu_launches(lu[lo:hi], piv[lo:hi], info[lo:hi], mma, outer,
                              None if src is None else src[lo:hi], defer_left,
                              None if moves is None else moves[lo:hi], handle)
            for (_, handle), lo, hi in zip(lanes, cuts, cuts[1:])]
    main = _current_stream()
    start = main.record()
    for stream, _ in lanes:
        stream.wait_event(start)
    pending = list(zip((stream for stream, _ in lanes), runs))
    while pending:
        left = []
        for stream, run in pending:
            with stream:
                if next(run, None) is not None:
                    left.append((stream, run))
        pending = left
    for stream, _ in lanes:
        main.wait_event(stream.record())


#: Parts of the batch :func:`_rows_lu` factorizes on streams of their own
#: with the tensor-core panels, by n (the largest n up to which each
#: applies, then the parts). Up to n = 128 one: the panels there are blocks
#: of one or two warps, several per SM already, and the parts gain nothing.
ROWS_STREAMS = ((128, 1), (ROWS_MAX, 2))

#: Fewest matrix entries (batch x n^2) a part of :func:`_rows_lu`'s batch
#: holds: every part issues all of the driver's launches, whose host time
#: its device time must cover for the parts to run side by side rather than
#: one behind the host.
ROWS_PART_ENTRIES = 1 << 25


def rows_streams(n: int, batch: int) -> int:
    """The ``streams`` of :func:`_rows_lu` (tensor-core panels) for ``batch``
    matrices of order ``n``."""
    parts = 1
    for nmax, p in ROWS_STREAMS:
        if n <= nmax:
            parts = p
            break
    return max(1, min(parts, batch * n * n // ROWS_PART_ENTRIES))


def _current_stream():
    return _common.cupy().cuda.get_current_stream()


@functools.lru_cache(maxsize=None)
def _lanes(device: int, count: int):
    """``count`` (stream, cuBLAS handle) pairs of ``device``, made once per
    process: non-blocking streams, each with a handle of its own (its
    stream and the host pointer mode set), so that GEMMs on different
    streams never share a handle's workspace."""
    cp = _common.cupy()
    from cupy_backends.cuda.libs import cublas
    lanes = []
    with cp.cuda.Device(device):
        for _ in range(count):
            stream = cp.cuda.Stream(non_blocking=True)
            handle = cublas.create()
            cublas.setStream(handle, stream.ptr)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            lanes.append((stream, handle))
    return tuple(lanes)


def _rows_lu_launches(lu, piv, info, mma: bool, outer: int, src, defer_left: bool,
                      moves, handle=None):
    """:func:`_rows_lu`'s launches on the current stream, a generator that
    yields after each (``moves``: the panels' move lists, (batch,
    MMA_MOVE_STRIDE) int32, with ``mma``; ``handle``: the GEMMs' cuBLAS
    handle, None for CuPy's)."""
    bsz, n = lu.shape[0], lu.shape[-1]
    dt = dtname(lu.dtype)
    dev = device_id()
    tr = _rows_function("trsm_lunit", dt, ROWS_PANEL, ROWS_THREADS, dev)

    def trsm(r0: int, nb: int, c0: int) -> None:
        tr((bsz,), (_rows_threads(n - c0),),
           (lu, info, np.int32(n), np.int32(r0), np.int32(nb), np.int32(c0)))

    def gemm(r0: int, nr: int, c0: int, nc: int, kk: int, k: int) -> bool:
        _gemm_rows(lu, n, r0, nr, c0, nc, kk, k, handle)
        return nr > 0 and nc > 0 and k > 0

    if src is not None and not mma:
        lu[...] = src
        yield True
    if mma:
        pfn = _mma64_function(dev, MMA_ROWS_NAME)
        sfn = _mma64_function(dev, MMA_SWAP_NAME)

        def panel(k0: int, trsm_end: int):
            warps = -(-(n - k0) // 64)
            nb = min(ROWS_PANEL, n - k0)
            first = k0 == 0 and src is not None
            pfn((bsz,), (32 * warps,), (src if first else lu, lu, piv, info, np.int32(n),
                                        np.int32(k0), moves),
                shared_mem=_with_smem(pfn, mma_rows_smem(warps)))
            yield True
            c_lo = k0 - (k0 % outer) if defer_left else 0
            outside = n - nb - c_lo
            if first and n > nb:
                _mma64_function(dev, MMA_COPY_NAME)(
                    (bsz, -(-n // 64)), (256,), (src, lu, moves, np.int32(n), np.int32(nb)))
                yield True
            elif outside > 0:
                sfn((bsz, -(-outside // 64)), (256,),
                    (lu, moves, np.int32(n), np.int32(k0), np.int32(nb), np.int32(c_lo)))
                yield True
            c0 = k0 + ROWS_PANEL
            if c0 < trsm_end:
                trsm(k0, ROWS_PANEL, c0)
                yield True
    else:
        fn = _rows_function("getrf_rows", dt, ROWS_PANEL, ROWS_THREADS, dev)
        smem = _with_smem(fn, (ROWS_PANEL * ROWS_PANEL + 2 * ROWS_PANEL * STAGE_COLS)
                          * lu.itemsize)

        def panel(k0: int, trsm_end: int):
            fn((bsz,), (_rows_threads(n - k0),),
               (lu, lu, piv, info, np.int32(n), np.int32(k0), np.int32(trsm_end)),
               shared_mem=smem)
            yield True

    for kb in range(0, n, outer):
        end = min(kb + outer, n)
        for kj in range(kb, end, ROWS_PANEL):
            w = min(ROWS_PANEL, n - kj)
            c0 = kj + w
            if kj == kb:
                yield from panel(kj, n)         # U right of it solved there
                continue
            if gemm(kj, n - kj, kj, w, kb, kj - kb):
                yield True
            yield from panel(kj, c0)
            if c0 < n:
                if gemm(kj, w, c0, n - c0, kb, kj - kb):
                    yield True
                trsm(kj, w, c0)
                yield True
        if gemm(end, n - end, end, n - end, kb, end - kb):
            yield True
    if mma and defer_left and n > outer:
        lfn = _mma64_function(dev, MMA_LEFT_NAME)
        stage = left_stage(n, outer)
        lfn((bsz, -(-n // outer) - 1), (256,),
            (lu, piv, np.int32(n), np.int32(outer), np.int32(stage)),
            shared_mem=_with_smem(lfn, stage * lu.itemsize))
        yield True


# ----------------------------------------------------------------------------
# Cholesky
# ----------------------------------------------------------------------------

#: How :func:`potrf` assembles its result (``finish=``): ``'cupy'`` checks
#: finiteness with ``cupy.isfinite`` and takes the other triangle from ``a``
#: with ``cupy.where`` (three passes over the stack); ``'kernel'`` (the
#: default for n <= ROWS_MAX) one kernel (``chol_finish`` of rows.cu) that
#: reads ``a`` once, sets ``info`` and copies back only the band near the
#: diagonal that the diagonal blocks' GEMMs overwrote.
CHOL_FINISH = ("cupy", "kernel")


def _transpose(a):
    """A new C-contiguous stack of the matrices of ``a`` (B, n, n) transposed,
    by tiles through shared memory (``transpose_batched`` of rows.cu; CuPy's
    copy of the transposed view reads one side by strides)."""
    bsz, n = a.shape[0], a.shape[-1]
    out = _common.alloc(a.shape, a.dtype)
    tiles = -(-n // 32)
    if bsz and n:
        _rows_function("transpose_batched", dtname(a.dtype), 0, 0, device_id())(
            (bsz * tiles * tiles,), (32, 8), (a, out, np.int32(n)))
    return out


def potrf(a, lower: bool, method: str | None = None, finish: str | None = None):
    """Cholesky of ``a`` (B, n, n), n > 32, like LAPACK potrf; returns (c, info).

    ``finish``: one of :data:`CHOL_FINISH` (None: ``'kernel'`` for
    n <= ROWS_MAX, ``'cupy'`` beyond).
    """
    cp = _common.cupy()
    bsz, n = a.shape[0], a.shape[-1]
    method = _check_method(method, n, "chol")
    if finish is None:
        finish = "kernel" if n <= ROWS_MAX else "cupy"
    if finish not in CHOL_FINISH:
        raise ValueError(f"finish must be one of {CHOL_FINISH}, got {finish!r}")
    dt = dtname(a.dtype)
    dev = device_id()
    a = cp.ascontiguousarray(a)
    finite = cp.isfinite(a).all(axis=(1, 2)) if finish == "cupy" else None
    # on the lower triangle of the Hermitian matrix potrf reads
    w = a.copy() if lower else _transpose(a)
    info = cp.zeros((bsz,), dtype=np.int32)
    if method == "fused":
        fn = _rows_function("potrf_rows", dt, FUSED_MAX, FUSED_MAX, dev)
        fn((bsz,), (_rows_threads(n),), (w, info, np.int32(n), np.int32(0)))
    elif method == "rows":                               # panels of ROWS_PANEL
        fn = _rows_function("potrf_rows", dt, ROWS_PANEL, ROWS_THREADS, dev)
        for k0 in range(0, n, ROWS_PANEL):
            fn((bsz,), (_rows_threads(n - k0),), (w, info, np.int32(n), np.int32(k0)))
            _chol_update(w, n, k0, min(ROWS_PANEL, n - k0))
    else:
        fn = _panel_function("potrf_panel", dt, dev)
        for k0 in range(0, n, PANEL):
            smem = _with_smem(fn, PANEL * PANEL * a.itemsize)
            fn((bsz,), (PANEL_THREADS,), (w, info, np.int32(n), np.int32(k0)),
               shared_mem=smem)
            _chol_update(w, n, k0, min(PANEL, n - k0))
    if finish == "kernel":
        # the other triangle is a's but near the diagonal (the diagonal
        # blocks' GEMMs, at most CHOL_SPLIT wide, wrote it): copied back;
        # info -1 for an inf or NaN anywhere in a
        c = w if lower else _transpose(w)
        fin = _rows_function("chol_finish", dt, 0, 0, dev)
        fin((bsz * -(-n // 32),), (256,),
            (a, c, info, np.int32(n), np.int32(1 if lower else 0),
             np.int32(min(n, max(CHOL_SPLIT, PANEL)))))
        return c, info
    tri = cp.tril(cp.ones((n, n), dtype=bool))
    if lower:
        c = cp.where(tri, w, a)
    else:
        c = cp.where(tri.T, w.transpose(0, 2, 1), a)
    info = cp.where(finite, info, -1).astype(np.int32)
    return cp.ascontiguousarray(c), info


# ----------------------------------------------------------------------------
# solves and inverse
# ----------------------------------------------------------------------------

def _solve_smem(f, piv, b, mode: int, identity: bool, report=NO_REPORT):
    """``solve_smem`` for n <= FUSED_MAX; ``b`` (B, n, k) or None for the identity.

    ``report`` (:func:`scipy_gpuqr.batched._gpu_common.report_args`): the
    factor's and b's infs/NaNs mark its status word through a pass over
    each (this kernel does not check them itself).
    """
    cp = _common.cupy()
    bsz, n = f.shape[0], f.shape[-1]
    k = n if identity else b.shape[-1]
    x = _common.alloc((bsz, n, k), f.dtype)
    if bsz == 0 or n == 0 or k == 0:
        return x
    fn = _rows_function("solve_smem", dtname(f.dtype), FUSED_MAX, FUSED_MAX,
                        device_id())
    f = cp.ascontiguousarray(f)
    piv = f if piv is None else cp.ascontiguousarray(piv, dtype=cp.int32)
    b = x if identity else cp.ascontiguousarray(b, dtype=f.dtype)
    if report[0] is not NULL:
        _common.scan_nonfinite(f, report, _common.STATUS_FACTOR)
        if not identity:
            _common.scan_nonfinite(b, report, _common.STATUS_RHS)
    smem = _with_smem(fn, 2 * FUSED_MAX * FUSED_MAX * f.itemsize)
    fn((bsz,), (FUSED_MAX,), (f, piv, b, x, np.int32(n), np.int32(k),
                              np.int32(mode), np.int32(1 if identity else 0)),
       shared_mem=smem)
    return x


def getrs(lu, piv, b, trans: int = 0, report=NO_REPORT, info=None):
    """Solve with LU factors (n > 32); ``b`` (B, n, k) is not modified;
    ``report`` and ``info`` as for :func:`scipy_gpuqr.batched._gpu.getrs`."""
    cp = _common.cupy()
    if lu.shape[-1] <= FUSED_MAX:
        x = _solve_smem(lu, piv, b, 1 if trans else 0, False, report)
        if info is not None and int(report[1]) & _common.CTL_NAN_FILL:
            _common.scan_info(info, (NULL, np.uint64(_common.CTL_NAN_FILL)), x)
        return x
    factors = (cp.ascontiguousarray(lu), cp.ascontiguousarray(piv, dtype=cp.int32))
    return solve_by_columns("getrs_batched", lu.dtype, b, factors, 1 if trans else 0,
                            report, info)


def potrs(c, lower: bool, b, report=NO_REPORT):
    """Solve with a Cholesky factor from :func:`potrf` (n > 32); ``b`` (B, n, k)."""
    cp = _common.cupy()
    if c.shape[-1] <= FUSED_MAX:
        return _solve_smem(c, None, b, 2 if lower else 3, False, report)
    c = cp.ascontiguousarray(c)
    if report[0] is not NULL:       # the whole of c (the kernel reads one triangle)
        _common.scan_nonfinite(c, report, _common.STATUS_FACTOR)
    return solve_by_columns("potrs_batched", c.dtype, b, (c,), 1 if lower else 0, report)


#: Smallest order whose inverse is U⁻¹ L⁻¹ P by block rows
#: (:func:`inverse_blocks`, the faster one from there on in
#: ``bench/batched_inverse.py``); smaller ones solve with the identity in
#: shared memory.
BLOCKED_INVERSE_MIN = 64


def inverse(a, method: str | None = None, nb: int | None = None):
    """Inverse of every matrix of ``a`` (B, n, n), n > 32; returns (inv, info).

    n < :data:`BLOCKED_INVERSE_MIN`: the LU's solve with the identity in
    shared memory (``solve_smem``); larger n: :func:`inverse_blocks` with
    block rows of ``nb`` (None: :func:`inverse_block`).
    """
    bsz, n = a.shape[0], a.shape[-1]
    piv = _common.alloc((bsz, n), np.int32)
    info = _common.alloc((bsz,), np.int32)
    lu = getrf(a, piv, info, method)
    if n < BLOCKED_INVERSE_MIN:
        return _solve_smem(lu, piv, None, 0, True), info
    return inverse_blocks(lu, piv, inverse_block(n) if nb is None else nb), info


def inverse_block(n: int) -> int:
    """Block rows of :func:`inverse_blocks` for order ``n`` (one of
    :data:`INV_BLOCKS`): wider blocks make fewer, larger GEMMs."""
    return INV_BLOCKS[0] if n <= 128 else INV_BLOCKS[-1]


@functools.lru_cache(maxsize=None)
def _inverse_function(kernel: str, dt: str, nb: int, device: int):
    module = load_module(INVERSE_FILE, KERNEL_VARIANTS[INVERSE_FILE])
    return module.get_function(inverse_name(kernel, dt, nb))


def inverse_gemms(n: int, nb: int):
    """The GEMMs of :func:`inverse_blocks` for order ``n`` and block rows of
    ``nb``, in order: tuples ``(m, k, alpha, a, a_off, lda, b, b_off, beta,
    c, c_off)`` of row-major C (m x n) = alpha A (m x k) B (k x n) + beta C
    per matrix, with A, B, C named by buffer (``'L'`` the LU, ``'X'`` P and
    then the inverse, ``'Y'`` L⁻¹ P, ``'DL'`` / ``'DU'`` the inverted
    diagonal triangles, ``(nblk, nb, nb)`` per matrix) and offsets in
    elements of one matrix; B and C are rows of n-wide matrices."""
    nblk = -(-n // nb)
    for i in range(nblk):                      # Y = L⁻¹ P, P in X's buffer
        r0 = i * nb
        m = min(nb, n - r0)
        if r0:
            yield (m, r0, -1.0, "L", r0 * n, n, "Y", 0, 1.0, "X", r0 * n)
        yield (m, m, 1.0, "DL", i * nb * nb, nb, "X", r0 * n, 0.0, "Y", r0 * n)
    for i in range(nblk - 1, -1, -1):          # X = U⁻¹ Y
        r0 = i * nb
        m = min(nb, n - r0)
        r1 = r0 + m
        if r1 < n:
            yield (m, n - r1, -1.0, "L", r0 * n + r1, n, "X", r1 * n, 1.0, "Y", r0 * n)
        yield (m, m, 1.0, "DU", i * nb * nb, nb, "Y", r0 * n, 0.0, "X", r0 * n)


def inverse_blocks(lu, piv, nb: int):
    """A⁻¹ = U⁻¹ L⁻¹ P from the LU ``lu`` (B, n, n) and pivots ``piv`` (B, n)
    of each matrix, by block rows of ``nb`` (one of :data:`INV_BLOCKS`).

    ``kernels/batched/inverse.cu`` writes P (``pivot_identity``) and the
    inverses of the diagonal blocks' triangles (``tri_inv_blocks``); then,
    block row by block row, Y = L⁻¹ P top down and X = U⁻¹ Y bottom up,
    each block row by two cuBLAS strided-batched GEMMs
    (:func:`inverse_gemms`): the right-hand side less the rows already
    solved times their coefficients, then the diagonal block's inverse
    times that (about 2 n³ flops on the tensor cores, against the n³
    dependent loads of a solve by columns). X is written in P's buffer, the
    input ``lu`` is not modified. A matrix with an exactly zero pivot gets
    infs or NaNs (its ``info`` is > 0).
    """
    from cupy_backends.cuda.libs import cublas
    cp = _common.cupy()
    bsz, n = lu.shape[0], lu.shape[-1]
    dt, dev, item = dtname(lu.dtype), device_id(), lu.itemsize
    nblk = -(-n // nb)
    x, y, dl, du = _common.alloc_outputs((((bsz, n, n), lu.dtype), ((bsz, n, n), lu.dtype),
                                          ((bsz, nblk, nb, nb), lu.dtype),
                                          ((bsz, nblk, nb, nb), lu.dtype)))
    if bsz == 0 or n == 0:
        return x
    lu = cp.ascontiguousarray(lu)
    piv = cp.ascontiguousarray(piv, dtype=cp.int32)
    _common.launch(_inverse_function("pivot_identity", dt, 0, dev).kernel.ptr, bsz, 256,
                   8 * n, (piv.data.ptr, x.data.ptr, n))
    _common.launch(_inverse_function("tri_inv_blocks", dt, nb, dev).kernel.ptr, bsz * nblk,
                   2 * nb, 0, (lu.data.ptr, dl.data.ptr, du.data.ptr, n))
    gemm = cublas.dgemmStridedBatched if lu.dtype == np.float64 else cublas.sgemmStridedBatched
    consts = np.array([1.0, -1.0, 0.0], dtype=lu.dtype)
    scalar = {1.0: consts.ctypes.data, -1.0: consts.ctypes.data + item,
              0.0: consts.ctypes.data + 2 * item}
    nn = n * n
    base = {"L": (lu.data.ptr, nn), "X": (x.data.ptr, nn), "Y": (y.data.ptr, nn),
            "DL": (dl.data.ptr, nblk * nb * nb), "DU": (du.data.ptr, nblk * nb * nb)}
    opn = cublas.CUBLAS_OP_N
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        for m, k, alpha, a, a_off, lda, b, b_off, beta, c, c_off in inverse_gemms(n, nb):
            (pa, sa), (pb, _), (pc, _) = base[a], base[b], base[c]
            # row-major C = alpha A B + beta C is column-major Cᵀ = alpha Bᵀ Aᵀ + beta Cᵀ
            gemm(handle, opn, opn, n, m, k, scalar[alpha], pb + b_off * item, n, nn,
                 pa + a_off * item, lda, sa, scalar[beta], pc + c_off * item, n, nn, bsz)
    finally:
        cublas.setPointerMode(handle, mode)
    return x
