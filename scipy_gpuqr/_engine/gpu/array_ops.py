"""Small device array operations of a GPU call, as prefetched kernels
(``kernels/sparse_qr/array_ops.cu``).

The dense fronts (their compact-WY factors and ``Q``), R's triangular solves
of large fronts, R's copy to the host, the full-rank probe and the null-space
rank decision (:mod:`scipy_gpuqr._factor.solve_rank`) need strided copies,
triangles, row gathers and scatters, column norms and maxima. CuPy's generic
array functions compile a kernel per operation, layout and type the first
time a process uses them, on the call's thread (a tenth of a second each);
these kernels are one module that
:func:`~scipy_gpuqr._engine.gpu.factorize_kernels.engine_kernels` compiles on a
worker thread with the engine's other modules. Each function gives the values
the generic operation gave (the same IEEE operation per element), except
:func:`column_norms` (a sum of squares in another order). Strides are taken
from the CuPy arrays, so views work as they are.

Imports without CuPy; the functions need it (CuPy arrays in, on the current
stream). ``trsm_left``, :func:`cholesky_upper` and :func:`thin_qr` call cuBLAS and
cuSOLVER directly (no compilation).
"""

from __future__ import annotations

import functools

import numpy as np

from ..._kernels import KernelUse, load_module

__all__ = ["OPS_FILE", "OPS_THREADS", "array_ops_use", "copy_into", "subtract_into",
           "contiguous_copy", "matmul_operand", "fresh_float64", "unit_triangle", "wy_system", "take_rows",
           "put_rows", "column_norms", "column_absmax", "divide_columns", "trsm_left",
           "cholesky_upper", "cholesky_upper_queued", "thin_qr", "upload_block", "normal_block",
           "front_rows_product"]

#: The kernel source (relative to ``kernels/``): ``extern "C"`` kernels, one module.
OPS_FILE = "sparse_qr/array_ops.cu"

#: Threads per block (the kernels' ``__launch_bounds__``).
OPS_THREADS = 256

#: Most blocks of one launch (grid-stride loops cover the rest).
MAX_BLOCKS = 4096

_VALUE = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32"}
_INDEX = {np.dtype(np.int64): "i64", np.dtype(np.int32): "i32"}


def array_ops_use() -> KernelUse:
    """What a call compiles of the file (the whole file: both value types, for
    :func:`scipy_gpuqr._kernels.prefetch`)."""
    return KernelUse(OPS_FILE, (), ("ew2d_f64_f64",))


def _fn(name: str):
    """The kernel ``name`` on the current device (looked up once: a module lookup
    flattens and hashes the source, far more than a launch)."""
    import cupy
    return _kernel(name, cupy.cuda.runtime.getDevice())


@functools.lru_cache(maxsize=None)
def _kernel(name: str, device: int):
    return load_module(OPS_FILE).get_function(name)


def _blocks(n: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-int(n) // OPS_THREADS)))


def _estrides(a) -> tuple:
    """Element strides of a 2-D (or 1-D: a column) CuPy array."""
    isz = a.dtype.itemsize
    if a.ndim == 1:
        return int(a.strides[0]) // isz, 0
    return int(a.strides[0]) // isz, int(a.strides[1]) // isz


def _shape2(a) -> tuple:
    return (int(a.shape[0]), 1) if a.ndim == 1 else (int(a.shape[0]), int(a.shape[1]))


def _launch(name: str, n: int, args: tuple, most: int | None = None) -> None:
    if n:
        blocks = _blocks(n) if most is None else max(1, min(_blocks(n), int(most)))
        _fn(name)((blocks,), (OPS_THREADS,), args)


def _ew2d(dst, src, mode: int) -> None:
    vd, vs = np.dtype(dst.dtype), np.dtype(src.dtype)
    if vd not in _VALUE or vs not in _VALUE or (vd != vs and mode) or (
            vd == np.float32 and vs == np.float64):
        raise TypeError(f"array_ops: no kernel for {vs} -> {vd} (mode {mode})")
    if _shape2(dst) != _shape2(src):
        raise ValueError(f"array_ops: shapes {dst.shape} and {src.shape} differ")
    rows, cols = _shape2(dst)
    drs, dcs = _estrides(dst)
    srs, scs = _estrides(src)
    _launch(f"ew2d_{_VALUE[vd]}_{_VALUE[vs]}", rows * cols,
            (dst, np.int64(drs), np.int64(dcs), src, np.int64(srs), np.int64(scs),
             np.int64(rows), np.int64(cols), np.int32(mode)))


def copy_into(dst, src) -> None:
    """``dst[...] = src`` for 1-D or 2-D arrays of one shape, any strides
    (float64/float32, or float32 into float64)."""
    _ew2d(dst, src, 0)


def subtract_into(dst, src) -> None:
    """``dst -= src`` for 1-D or 2-D arrays of one shape and value type, any strides."""
    _ew2d(dst, src, 1)


def contiguous_copy(a, dtype=None, order: str = "C"):
    """A new ``order``-contiguous copy of the 2-D (or 1-D) array ``a``, in
    ``dtype`` (default ``a``'s; float32 → float64 allowed)."""
    import cupy as cp
    out = cp.empty(a.shape, dtype=a.dtype if dtype is None else dtype, order=order)
    copy_into(out, a)
    return out


def matmul_operand(a, dtype=None, *, left: bool):
    """``a`` (2-D) as CuPy's matmul hands it to cuBLAS, made by these kernels: cast
    to ``dtype`` in ``a``'s own layout (``astype(order='K')``), and a
    non-contiguous operand copied, column-major on the left (CuPy copies the
    transposed left operand in C order), row-major on the right. The product of
    the results is then the same cuBLAS call as the product of the originals,
    without CuPy's copy kernel."""
    dt = np.dtype(a.dtype if dtype is None else dtype)
    if np.dtype(a.dtype) != dt:
        if a.flags.c_contiguous:
            order = "C"
        elif a.flags.f_contiguous:
            order = "F"
        else:
            order = "F" if abs(int(a.strides[0])) < abs(int(a.strides[1])) else "C"
        return contiguous_copy(a, dt, order)
    if a.flags.c_contiguous or a.flags.f_contiguous:
        return a
    return contiguous_copy(a, order="F" if left else "C")


def upload_block(F: np.ndarray, r0: int, r1: int, c0: int, c1: int, out, stream) -> None:
    """``F[r0:r1, c0:c1]`` of a host array whose rows are contiguous into the
    C-contiguous device array ``out`` (that shape and dtype) by one
    ``cudaMemcpy2DAsync`` on ``stream``: asynchronous, at the link's speed, when
    ``F`` is pinned (no host copy of the block is made either way)."""
    import cupy as cp
    isz = F.itemsize
    if F.strides[1] != isz:
        raise ValueError("upload_block: F's rows must be contiguous")
    rt = cp.cuda.runtime
    rt.memcpy2DAsync(out.data.ptr, (c1 - c0) * isz, F.ctypes.data + r0 * F.strides[0] + c0 * isz,
                     F.strides[0], (c1 - c0) * isz, r1 - r0, rt.memcpyHostToDevice, stream.ptr)


def fresh_float64(C):
    """``cupy.array(C, dtype=float64, order='C', copy=True)`` for a 1-D or 2-D
    float64/float32 CuPy array (a contiguous float64 array is copied by memcpy);
    other arrays go through CuPy."""
    import cupy as cp
    dt = np.dtype(C.dtype)
    if C.ndim in (1, 2) and dt in _VALUE:
        out = cp.empty(C.shape, dtype=np.float64)
        if dt == np.float64 and C.flags.c_contiguous:
            if C.size:
                out.data.copy_from_device_async(C.data, C.nbytes)
        else:
            copy_into(out, C)
        return out
    return cp.array(C, dtype=np.float64, order="C", copy=True)


def unit_triangle(src, lower: bool, out=None, *, unit: bool = True, blocks: int | None = None):
    """``src``'s strict lower (``lower``) or upper triangle, a unit diagonal, zeros
    elsewhere (``tril(src, -1)`` or ``triu(src, 1)`` with ones on the diagonal;
    ``unit=False``: ``src``'s own diagonal, ``tril(src)`` or ``triu(src)``), into
    ``out`` (same shape and value type, any strides) or a new C-contiguous
    array. ``blocks``: most thread blocks of the launch (default
    :data:`MAX_BLOCKS`; a grid-stride loop covers the rest): a source read over
    the link keeps the link busy with few, where a full grid would hold every
    SM while it waits and keep kernels of other streams off them."""
    import cupy as cp
    if out is None:
        out = cp.empty(src.shape, dtype=src.dtype)
    if _shape2(out) != _shape2(src) or np.dtype(out.dtype) != np.dtype(src.dtype):
        raise ValueError(f"unit_triangle: {src.shape} {src.dtype} into {out.shape} {out.dtype}")
    rows, cols = _shape2(src)
    srs, scs = _estrides(src)
    drs, dcs = _estrides(out)
    mode = (1 if lower else 0) | (0 if unit else 2)
    _launch(f"unit_tri_{_VALUE[np.dtype(src.dtype)]}", rows * cols,
            (out, np.int64(drs), np.int64(dcs), src, np.int64(srs), np.int64(scs),
             np.int64(rows), np.int64(cols), np.int32(mode)), blocks)
    return out


def wy_system(G, tau, M, D) -> None:
    """``M = triu(G, 1) * tau[None, :] + I`` and ``D = diag(tau)`` (all b × b
    C-contiguous but ``tau``, contiguous of length b)."""
    b = int(G.shape[0])
    _launch(f"wy_system_{_VALUE[np.dtype(G.dtype)]}", b * b,
            (G, tau, np.int64(b), M, D))


def _index(idx):
    import cupy as cp
    idx = cp.asarray(idx)
    if np.dtype(idx.dtype) not in _INDEX:
        idx = idx.astype(np.int64)
    if not idx.flags.c_contiguous:
        idx = cp.ascontiguousarray(idx)
    return idx


def take_rows(src, idx, out=None, order: str = "C"):
    """``src[idx]`` (rows of a 1-D or 2-D ``src``) into ``out`` (any strides, shape
    ``(len(idx),) + src.shape[1:]``) or a new ``order``-contiguous array; by the
    prefetched kernel for a C-contiguous ``src`` (CuPy's indexing else)."""
    import cupy as cp
    idx = _index(idx)
    if not src.flags.c_contiguous or src.ndim > 2:         # CuPy's own gather
        got = src[idx]
        if out is None:
            return cp.array(got, order=order)
        out[...] = got
        return out
    nrows = int(idx.size)
    k = 1 if src.ndim == 1 else int(src.shape[1])
    if out is None:
        out = cp.empty((nrows,) + tuple(src.shape[1:]), dtype=src.dtype, order=order)
    ors, ocs = _estrides(out)
    _launch(f"gather_rows_{_VALUE[np.dtype(src.dtype)]}_{_INDEX[np.dtype(idx.dtype)]}",
            nrows * k, (out, np.int64(ors), np.int64(ocs), src, np.int64(k), idx,
                        np.int64(nrows)))
    return out


def put_rows(dst, idx, src, subtract: bool = False) -> None:
    """``dst[idx] = src`` (or ``dst[idx] -= src``) for distinct ``idx``, ``src`` of
    any strides; by the prefetched kernel for a C-contiguous 1-D or 2-D ``dst`` of
    ``src``'s value type (CuPy's indexing else)."""
    idx = _index(idx)
    if (not dst.flags.c_contiguous or dst.ndim > 2
            or np.dtype(src.dtype) != np.dtype(dst.dtype)):  # CuPy's own scatter
        if subtract:
            dst[idx] -= src
        else:
            dst[idx] = src
        return
    nrows = int(idx.size)
    k = 1 if dst.ndim == 1 else int(dst.shape[1])
    if _shape2(src) != (nrows, k):
        raise ValueError(f"put_rows: {src.shape} into {nrows} rows of {k}")
    srs, scs = _estrides(src)
    _launch(f"scatter_rows_{_VALUE[np.dtype(dst.dtype)]}_{_INDEX[np.dtype(idx.dtype)]}",
            nrows * k, (dst, np.int64(k), idx, src, np.int64(srs), np.int64(scs),
                        np.int64(nrows), np.int32(1 if subtract else 0)))


def _column_reduction(kind: str, Y):
    """``(values, bad)`` of the kernel ``column_<kind>`` over a C-contiguous ``Y``
    (q × p): one value per column and 1 where the column holds a NaN or an
    infinity (device arrays)."""
    import cupy as cp
    q, p = _shape2(Y)
    out = cp.empty(p, dtype=Y.dtype)
    bad = cp.empty(p, dtype=np.int32)
    if p:
        _fn(f"column_{kind}_{_VALUE[np.dtype(Y.dtype)]}")(
            (p,), (OPS_THREADS,), (Y, np.int64(q), np.int64(p), out, bad))
    return out, bad


def column_norms(Y):
    """``(norms, bad)`` of a C-contiguous ``Y`` (q × p): each column's 2-norm and
    1 where the column holds a NaN or an infinity (device arrays)."""
    return _column_reduction("norms", Y)


def column_absmax(Y):
    """``(amax, bad)`` of a C-contiguous ``Y`` (q × p): each column's largest
    absolute finite value (0 for none; exact, as ``abs(Y).max(axis=0)`` of a
    finite column) and 1 where the column holds a NaN or an infinity (device
    arrays)."""
    return _column_reduction("absmax", Y)


def divide_columns(Y, d, out=None):
    """``Y / d[None, :]`` for a C-contiguous ``Y`` (q × p) and ``d`` (p values), into
    ``out`` (may be ``Y``) or a new array."""
    import cupy as cp
    q, p = _shape2(Y)
    out = cp.empty_like(Y) if out is None else out
    _launch(f"divide_columns_{_VALUE[np.dtype(Y.dtype)]}", q * p,
            (out, Y, np.int64(q), np.int64(p), d))
    return out


def normal_block(seed: int, shape: tuple):
    """A C-contiguous float64 block of standard normal numbers drawn on the device
    (Philox-4x32-10 keyed by ``seed``, Box–Muller; element ``2k`` and ``2k + 1``
    of the flat block from counter k): millions of numbers in well under a
    millisecond, where drawing them on the host and uploading them took a tenth
    of a second of the call."""
    import cupy as cp
    out = cp.empty(shape, dtype=np.float64)
    n = int(out.size)
    _launch("normal_block_f64", (n + 1) // 2,
            (out, np.int64(n), np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)))
    return out


def front_rows_product(desc, pool, cols, X, Y, *, trans: bool) -> None:
    """R's product with X over the fronts ``desc`` describes, into Y: ``R X``
    sets Y's rows of those fronts' pivots, ``Rᵀ X`` adds into Y's columns
    atomically (Y holds zeros or earlier stages' sums). Kernels
    ``rmul_upper``/``rmul_trans``; ``desc`` device int64, 5 per chunk of at
    most 64 rows of one front (pool offset, fn, rk, first column in ``cols``,
    first row); R's rows read in ``pool`` (float64/float32); X and Y float64
    n × k C-contiguous device arrays."""
    k = int(X.shape[1])
    chunks = int(desc.shape[0])
    if not (k and chunks):
        return
    name = f"rmul_{'trans' if trans else 'upper'}_{_VALUE[np.dtype(pool.dtype)]}"
    _fn(name)((chunks, k), (OPS_THREADS,), (desc, pool, cols, X, Y, np.int64(k)))


def trsm_left(A, lda: int, B, ldb: int, m: int, n: int, *, lower: bool, trans: bool,
              unit: bool) -> None:
    """cuBLAS ``trsm`` (side left, column-major, alpha 1, host pointer mode) on the
    current stream: ``B ← op(A)⁻¹ B`` with ``A`` m × m and ``B`` m × n given by
    CuPy arrays of one value type (float64/float32) holding them, as
    ``cupyx.scipy.linalg.solve_triangular`` calls it."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas
    dt = np.dtype(A.dtype)
    if np.dtype(B.dtype) != dt or dt not in _VALUE:
        raise TypeError(f"trsm_left: {A.dtype} and {B.dtype}")
    h = cp.cuda.device.get_cublas_handle()
    cublas.setStream(h, cp.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(h)
    cublas.setPointerMode(h, cublas.CUBLAS_POINTER_MODE_HOST)
    one = np.array(1, dtype=dt)
    try:
        (cublas.dtrsm if dt == np.float64 else cublas.strsm)(
            h, cublas.CUBLAS_SIDE_LEFT,
            cublas.CUBLAS_FILL_MODE_LOWER if lower else cublas.CUBLAS_FILL_MODE_UPPER,
            cublas.CUBLAS_OP_T if trans else cublas.CUBLAS_OP_N,
            cublas.CUBLAS_DIAG_UNIT if unit else cublas.CUBLAS_DIAG_NON_UNIT,
            int(m), int(n), one.ctypes.data, A.data.ptr, int(lda), B.data.ptr, int(ldb))
    finally:
        cublas.setPointerMode(h, mode)


def cholesky_upper(G) -> int:
    """cuSOLVER ``potrf`` (upper, column-major) in place on the square float64/float32
    CuPy array ``G`` on the current stream: the upper triangle of G's memory read
    column-major becomes ``U`` with ``UᵀU`` = the symmetric matrix it held (for a
    C-contiguous G: ``G``'s lower triangle becomes ``Uᵀ``, the call
    ``cupy.linalg.cholesky`` makes), the other triangle is left as it was.
    Returns LAPACK's info, read back (0: done; k > 0: the leading minor of order
    k is not positive definite and the factor is incomplete)."""
    return int(cholesky_upper_queued(G).get()[0])


def cholesky_upper_queued(G):
    """:func:`cholesky_upper` queued on the current stream, not waited for: LAPACK's
    info as a one-element int32 device array (read it once the stream got there),
    so that a caller can queue more work behind the factorization before it looks."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas, cusolver
    dt = np.dtype(G.dtype)
    n = int(G.shape[0])
    if dt not in _VALUE or G.ndim != 2 or int(G.shape[1]) != n or not (
            G.flags.c_contiguous or G.flags.f_contiguous):
        raise ValueError(f"cholesky_upper: a contiguous square float matrix, not {G.shape} "
                         f"{G.dtype}")
    if n == 0:
        return cp.zeros(1, dtype=np.int32)
    single = dt == np.float32
    handle = cp.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cp.cuda.get_current_stream().ptr)
    upper = cublas.CUBLAS_FILL_MODE_UPPER
    size = (cusolver.spotrf_bufferSize if single else cusolver.dpotrf_bufferSize)(
        handle, upper, n, G.data.ptr, n)
    # freed on return: CuPy's pool gives the block to later work of this stream only
    work = cp.empty(max(int(size), 1), dtype=dt)
    info = cp.empty(1, dtype=np.int32)
    (cusolver.spotrf if single else cusolver.dpotrf)(
        handle, upper, n, G.data.ptr, n, work.data.ptr, size, info.data.ptr)
    return info


def thin_qr(X, *, want_r: bool = True) -> tuple:
    """``(Q, R)`` of ``X = Q R`` for a 2-D float64/float32 ``X`` (m × n, m >= n >= 1):
    ``Q`` m × n with orthonormal columns and ``R`` n × n upper triangular (None
    without ``want_r``), both F-contiguous, by cuSOLVER ``geqrf`` and ``orgqr``
    called directly on the current stream. The same library calls on the same
    column-major operand as ``cupy.linalg.qr(X, mode='reduced')``, so the same
    values, without the copy and triangle kernels that function compiles on the
    calling thread. ``X`` is not changed."""
    import cupy as cp
    from cupy_backends.cuda.libs import cusolver
    dt = np.dtype(X.dtype)
    m, n = _shape2(X)
    if dt not in _VALUE or X.ndim != 2 or not m >= n >= 1:
        raise ValueError(f"thin_qr: a tall float matrix, not {X.shape} {X.dtype}")
    single = dt == np.float32
    Q = cp.empty((m, n), dtype=dt, order="F")
    copy_into(Q, X)
    handle = cp.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cp.cuda.get_current_stream().ptr)
    info = cp.empty(1, dtype=np.int32)
    tau = cp.empty(n, dtype=dt)
    size = (cusolver.sgeqrf_bufferSize if single else cusolver.dgeqrf_bufferSize)(
        handle, m, n, Q.data.ptr, m)
    work = cp.empty(size, dtype=dt)
    (cusolver.sgeqrf if single else cusolver.dgeqrf)(
        handle, m, n, Q.data.ptr, m, tau.data.ptr, work.data.ptr, size, info.data.ptr)
    R = None
    if want_r:
        R = cp.empty((n, n), dtype=dt, order="F")
        unit_triangle(Q[:n], lower=False, out=R, unit=False)
    size = (cusolver.sorgqr_bufferSize if single else cusolver.dorgqr_bufferSize)(
        handle, m, n, n, Q.data.ptr, m, tau.data.ptr)
    work = cp.empty(size, dtype=dt)
    (cusolver.sorgqr if single else cusolver.dorgqr)(
        handle, m, n, n, Q.data.ptr, m, tau.data.ptr, work.data.ptr, size, info.data.ptr)
    return Q, R
