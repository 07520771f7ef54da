"""Block-Jacobi preconditioner built on a batched inverse.

The diagonal blocks of a sparse (or dense) square matrix are gathered into a
stack ``(nblocks, bs, bs)`` -- on the GPU by one kernel over the rows of a
CSR matrix (``kernels/batched/jacobi.cu``) or a strided copy of a dense one,
on the CPU in one vectorized scatter --, inverted in one batched
call (plus one for a ragged last block), and applied by a batched
matrix-vector product, on the device that holds ``A``.

A float32/float64 CuPy matrix (no ``backend`` named) takes the short path
of :func:`_build_gpu`: for a sparse matrix and blocks of at most 32 one
kernel per stack (the full blocks, the ragged last one) reads the blocks
straight from CSR and inverts them (the inverse kernel's CSR twin,
:func:`scipy_gpuqr.batched._gpu.jacobi_inverse_call`); a dense matrix or
larger blocks are gathered, then inverted by the inverse driver. Their
kernels mark one status word, the operator is made while they run, and
the call waits once. The public inverse
(:func:`scipy_gpuqr.inv_batched`, passed in by
:func:`scipy_gpuqr.batched._functions.block_jacobi`) inverts the blocks of
every other input, and names the singular blocks when the short path's
status word says there are some. cupyx is imported only for CuPy input.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sps
import scipy.sparse.linalg as spla
from scipy.linalg import LinAlgError

from . import _gpu
from . import _gpu_common as _gc
from ._kernel_registry import JACOBI_FILE, KERNEL_VARIANTS, SMALL_MAX, jacobi_name
from .._gpu import import_cupy, is_cupy_array, is_cupy_sparse
from .._kernels import load_module

__all__ = ["build", "check_block_size"]

#: Threads per block and most blocks of the CSR gather (grid-stride over rows).
_GATHER_THREADS = 256
_GATHER_MAX_BLOCKS = 65536

#: The dtypes of the GPU gather and inverse, by name.
_GPU_DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}

#: The index dtypes the CSR gather reads, by name.
_INDEX_DTYPES = {np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}


@functools.lru_cache(maxsize=None)
def _gather_function(dt: str, ix: str, device: int) -> int:
    """The CUfunction of ``jacobi_gather<dt, ix>`` on ``device``."""
    module = load_module(JACOBI_FILE, KERNEL_VARIANTS[JACOBI_FILE])
    return module.get_function(jacobi_name(dt, ix)).kernel.ptr


@functools.lru_cache(maxsize=None)
def _cupyx_operator():
    """The operator class on cupyx's ``LinearOperator`` (:func:`_operator_class`;
    looked up once: a ``from`` import of a package runs importlib's Python
    code on every call)."""
    from cupyx.scipy.sparse.linalg import LinearOperator
    return _operator_class(LinearOperator)


def _csr_operands(A, dt):
    """(indptr, indices, data, index dtype name) of a CuPy sparse ``A`` as
    the gather reads them: CSR, data of ``dt``, one index dtype."""
    csr = A if A.format == "csr" else A.tocsr()
    data = csr.data if csr.data.dtype == dt else csr.data.astype(dt)
    indptr, indices = csr.indptr, csr.indices
    ix = _INDEX_DTYPES.get(indices.dtype)
    if ix is None or indptr.dtype != indices.dtype:
        indptr, indices, ix = indptr.astype(np.int64), indices.astype(np.int64), "int64"
    return indptr, indices, data, ix


def _gather(operands, fptr: int, n: int, bs: int, full: int, last: int) -> None:
    """Launch ``jacobi_gather`` (``fptr``: :func:`_gather_function` of the
    operands' dtypes) over the rows of :func:`_csr_operands`'s ``operands``
    into the stacks at addresses ``full`` and ``last`` (0: no ragged block)."""
    indptr, indices, data, ix = operands
    if n:
        grid = max(1, min(_GATHER_MAX_BLOCKS, -(-n // _GATHER_THREADS)))
        _gc.launch(fptr, grid, _GATHER_THREADS, 0,
                   (indptr.data.ptr, indices.data.ptr, data.data.ptr, n, bs, n // bs * bs,
                    full, last))


def _gpu_blocks(A, n, bs, dtype, device=None):
    """(full, last) of a CuPy matrix on the device without a COO detour, or
    None (complex data: the general path). A sparse ``A`` goes through CSR
    (one kernel reads each row once); a dense C-contiguous one is copied
    through a strided view of its diagonal blocks. ``last`` is an empty
    (0, 0) array when ``bs`` divides ``n``."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    dname = _GPU_DTYPES.get(dt)
    if dname is None:
        return None
    cp = _gc.cupy()
    nfull = n // bs
    split = nfull * bs
    rest = n - split
    if not is_cupy_sparse(A):
        a = cp.asarray(A)
        if not a.flags.c_contiguous:
            return None
        item = a.itemsize
        full = cp.lib.stride_tricks.as_strided(
            a, shape=(nfull, bs, bs), strides=((n + 1) * bs * item, n * item, item))
        return (cp.ascontiguousarray(full, dtype=dt),
                cp.ascontiguousarray(a[split:, split:], dtype=dt))
    operands = _csr_operands(A, dt)
    full, last = _gc.alloc_outputs((((nfull, bs, bs), dt), ((rest, rest), dt)))
    _gather(operands, _gather_function(dname, operands[3],
                                       _gc.device_id() if device is None else device),
            n, bs, full.data.ptr, last.data.ptr)
    return full, last


def _blocks(rows, cols, vals, n, bs, xp, dtype):
    """Scatter the entries inside diagonal blocks into full and ragged stacks."""
    keep = (rows // bs) == (cols // bs)
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    nfull = n // bs
    full = xp.zeros((nfull, bs, bs), dtype=dtype)
    rest = n - nfull * bs
    last = xp.zeros((rest, rest), dtype=dtype)
    inf = rows < nfull * bs
    blk = rows[inf] // bs
    # duplicates (COO) are summed like SciPy does
    xp.add.at(full, (blk, rows[inf] % bs, cols[inf] % bs), vals[inf])
    xp.add.at(last, (rows[~inf] - nfull * bs, cols[~inf] - nfull * bs), vals[~inf])
    return full, last


def check_block_size(block_size) -> int:
    """``block_size`` as an int of at least 1 (TypeError, ValueError otherwise)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_jacobi: block_size must be an int, got "
                        f"{type(block_size).__name__}")
    bs = int(block_size)
    if bs < 1:
        raise ValueError(f"block_jacobi: block_size must be >= 1, got {bs}")
    return bs


def _invert(full, last, bs, n, inv_batched, check_finite, backend):
    """(inverses of ``full``, of ``last``) by ``inv_batched`` (``last`` None
    or empty: no ragged block); a singular block raises LinAlgError naming
    it (its index and rows)."""
    nfull = full.shape[0]
    try:
        inv_full = inv_batched(full, check_finite=check_finite,
                               backend=backend) if nfull else full
    except LinAlgError as exc:
        raise LinAlgError(f"block_jacobi: singular diagonal block(s) of size "
                          f"{bs} (block index = batch index, rows "
                          f"[index*{bs}, index*{bs}+{bs})): {exc}") from None
    try:
        inv_last = inv_batched(last, check_finite=check_finite,
                               backend=backend) if last is not None and last.size else last
    except LinAlgError:
        raise LinAlgError(f"block_jacobi: the ragged last diagonal block "
                          f"(block index {nfull}, rows {nfull * bs}:{n}) is "
                          "singular") from None
    return inv_full, inv_last


@functools.lru_cache(maxsize=None)
def _operator_class(base):
    """The operator class of :func:`build` on ``base`` (SciPy's or cupyx's
    ``LinearOperator``; made once for each): a subclass with the products
    as methods, where ``base((n, n), matvec=...)`` would wrap closures in
    an object of its own (microseconds of every call)."""

    class BlockJacobiOperator(base):
        """``M @ x = blockdiag(A_11^-1, A_22^-1, ...) @ x``.

        ``inverses``: (inverses of the full blocks, of the ragged last one or
        None), or a function of no arguments that makes them, called at the
        first product (the short path's arrays: each ``cupy.ndarray`` costs
        about a microsecond of host time). Replaced by the caller where the
        inverses it made first turn out unusable (singular blocks).
        """

        def __init__(self, xp, n, bs, dtype, inverses):
            super().__init__(dtype, (n, n))
            self.xp, self.block_size, self.inverses = xp, bs, inverses

        @classmethod
        def made(cls, xp, n, bs, dtype, inverses):
            """The operator of ``cls(xp, n, bs, dtype, inverses)`` without the
            base class's ``__new__`` and ``__init__`` (their checks and
            conversions cost a microsecond or more of each call): the state
            that they set for this order and dtype (:func:`_base_state`, made
            once by the constructor) copied into a new instance."""
            op = _new_object(cls)
            state = op.__dict__
            state.update(_base_state(cls, n, dtype))
            state["xp"], state["block_size"], state["inverses"] = xp, bs, inverses
            return op

        def _matvec(self, x):
            inverses = self.inverses
            if callable(inverses):
                inverses = self.inverses = inverses()
            inv_full, inv_last = inverses
            xp, bs, n = self.xp, self.block_size, self.shape[0]
            split = n // bs * bs
            x = x.reshape(n, -1)
            k = x.shape[1]
            y = xp.empty((n, k), dtype=np.promote_types(self.dtype, x.dtype))
            if split:
                y[:split] = xp.matmul(inv_full, x[:split].reshape(split // bs, bs, k)
                                      ).reshape(split, k)
            if split < n:
                y[split:] = inv_last @ x[split:]
            return y

        _matmat = _matvec

    return BlockJacobiOperator


_new_object = object.__new__


@functools.lru_cache(maxsize=64)
def _base_state(cls, n: int, dtype) -> dict:
    """The attributes that ``cls``'s base constructor gives an operator of
    order ``n`` and ``dtype`` (an instance made by the constructor, less
    what :func:`_operator_class`'s own ``__init__`` sets), for
    ``BlockJacobiOperator.made``: whatever state a version of the base class
    keeps (SciPy's array namespace, cupyx's dtype and shape) is copied
    as the constructor left it."""
    state = dict(cls(None, n, 1, dtype, None).__dict__)
    for own in ("xp", "block_size", "inverses"):
        state.pop(own, None)
    return state


@functools.lru_cache(maxsize=64)
def _short_plan(n: int, bs: int, dtype, ix: str, device: int) -> tuple:
    """Everything of :func:`_build_gpu`'s calls on a sparse matrix of order
    ``n`` with blocks of ``bs`` <= 32 and ``ix`` indices that does not depend
    on the arrays, resolved once: (the specs of the one allocation -- the
    inverses of the full blocks and their ``info``, then the same two of the
    ragged block --, the launches of the full and the ragged stack
    (:func:`scipy_gpuqr.batched._gpu.jacobi_inverse_call`; None where there
    is none))."""
    nfull, rest = divmod(n, bs)
    specs = (((nfull, bs, bs), dtype), ((nfull,), np.int32))
    if rest:
        specs += (((rest, rest), dtype), ((), np.int32))
    return (specs,
            _gpu.jacobi_inverse_call((nfull, bs, bs), dtype, ix, device) if nfull else None,
            _gpu.jacobi_inverse_call((rest, rest), dtype, ix, device) if rest else None)


def _short_sparse(A, bs, dtype, dev, report):
    """The kernels of :func:`_build_gpu` for a CuPy sparse ``A`` and blocks of
    ``bs`` <= 32 with ``report`` (the status word's address and ``ctl``:
    :func:`scipy_gpuqr.batched._gpu_common.report_words`, or ``NO_REPORT``):
    the inverses of the full blocks, then of
    the ragged one, each stack read straight from CSR by one kernel, into one
    allocation (addresses). Returns a function of no arguments that makes
    them arrays, (inverses of the full blocks, of the ragged one or None),
    when the operator first needs them."""
    cp = _gc.cupy()
    n = A.shape[0]
    nfull, rest = divmod(n, bs)
    indptr, indices, data, ix = _csr_operands(A, dtype)
    specs, call_full, call_last = _short_plan(n, bs, dtype, ix, dev)
    mem, layout = _gc.alloc_layout(specs)
    base = mem.ptr
    csr = (indptr.data.ptr, indices.data.ptr, data.data.ptr)
    if nfull:
        _gpu.launch_jacobi_inverse(call_full, bs, csr, 0, base, base + layout[1][2], report)
    if rest:
        _gpu.launch_jacobi_inverse(call_last, rest, csr, nfull * bs, base + layout[2][2],
                                   base + layout[3][2], report)

    def arrays():
        return (cp.ndarray((nfull, bs, bs), dtype, memptr=mem),
                cp.ndarray((rest, rest), dtype, memptr=mem + layout[2][2]) if rest else None)
    return arrays


def _build_gpu(A, bs, inv_batched, check_finite):
    """The operator of a float32/float64 CuPy matrix, or None (the general
    path). The inverses of the full and the ragged blocks
    (:func:`scipy_gpuqr.batched._gpu.getri`'s kernels, as ``inv_batched``
    runs them) mark one status word; for a sparse ``A`` and blocks of n <= 32
    their twins read the blocks straight from CSR (:func:`_short_sparse`),
    else the blocks are gathered first. The operator is made while the
    kernels run, then the call waits once. A singular block (or with
    ``check_finite`` an inf/NaN) found there: the blocks are gathered and
    ``inv_batched`` inverts them again and raises what the general path
    raises."""
    shape, dtype = A.shape, A.dtype
    if dtype not in _GPU_DTYPES or len(shape) != 2 or shape[0] != shape[1]:
        return None
    n = shape[0]
    dev = _gc.device_id()
    short = bs <= SMALL_MAX and is_cupy_sparse(A)
    if short:
        st = _gc.new_status(dev)
        inverses = _short_sparse(A, bs, dtype, dev,
                                 _gc.report_words(st, clear_neg=not check_finite))
    else:
        blocks = _gpu_blocks(A, n, bs, dtype, dev)
        if blocks is None:
            return None
        full, last = blocks[0], blocks[1] if n % bs else None
        st = _gc.new_status(dev)
        report = _gc.report_args(st, clear_neg=not check_finite)
        inverses = (_gpu.getri(full, report=report, device=dev)[0] if n >= bs else full,
                    _gpu.getri(last, report=report, device=dev)[0] if last is not None
                    else None)
    op = _cupyx_operator().made(_gc.cupy(), n, bs, dtype, inverses)
    counts = _gc.read_status(st)
    if counts[_gc.STATUS_SINGULAR] or (check_finite and counts[_gc.STATUS_NONFINITE]):
        if short:                         # the blocks, gathered only here
            full, last = _gpu_blocks(A, n, bs, dtype, dev)
            last = last if n % bs else None
        op.inverses = _invert(full, last, bs, n, inv_batched, check_finite, None)
    return op


def build(A, block_size, inv_batched, *, check_finite=True, backend=None):
    """:func:`scipy_gpuqr.block_jacobi`, inverting the blocks with ``inv_batched``."""
    bs = check_block_size(block_size)
    on_gpu = is_cupy_sparse(A) or is_cupy_array(A)
    if on_gpu and backend is None:
        op = _build_gpu(A, bs, inv_batched, check_finite)
        if op is not None:
            return op
    if on_gpu:
        xp = import_cupy()
        Operator = _cupyx_operator()
        shape, adt = A.shape, A.dtype
    else:
        xp = np
        Operator = _operator_class(spla.LinearOperator)
        A = sps.coo_matrix(A)
        shape, adt = A.shape, A.dtype
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"block_jacobi: A must be square, got shape {tuple(shape)}")
    n = shape[0]
    dtype = np.promote_types(adt, np.float32)
    if np.dtype(dtype).kind not in "fc":
        dtype = np.float64
    blocks = _gpu_blocks(A, n, bs, dtype) if on_gpu else None
    if blocks is None:
        if on_gpu:
            import cupyx.scipy.sparse as xsp
            A = xsp.coo_matrix(A) if is_cupy_sparse(A) else xsp.coo_matrix(xp.asarray(A))
        blocks = _blocks(A.row.astype(np.int64), A.col.astype(np.int64), A.data, n, bs,
                         xp, dtype)
    full, last = blocks
    return Operator(xp, n, bs, dtype, _invert(full, last, bs, n, inv_batched, check_finite,
                                              backend))
