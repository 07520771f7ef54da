"""Variable-size batches: matrices of different orders in one call.

As MAGMA's *vbatched* routines: the matrices of a call may have different
orders n. They are grouped into *size classes* (:data:`SIZE_CLASSES`); each
class is gathered into one stack padded with the identity to the class's
order and factorized by one call of a fixed-size batched routine (one
launch per class for n <= 64 on the GPU, vectorized NumPy per class on the
CPU). The routine is passed in by the public functions of
:mod:`scipy_gpuqr.batched._functions` (``batched=``), which document these
functions; this module does not import them. Padding with the identity changes
nothing: ``lu(blockdiag(A, I)) = blockdiag(lu(A), I)`` with the same pivots
(the padded rows are zero in A's columns and never win a pivot search; a
tie among zeros picks the earlier row), and the same holds for Cholesky,
the inverse and solves with zero-padded right-hand sides.

Two input forms, the output takes the input's form:

* a list (or tuple) of square 2-D arrays, all NumPy or all CuPy;
* a padded stack ``a`` of shape (B, N, N) with ``sizes`` (B,): matrix ``k``
  is ``a[k, :sizes[k], :sizes[k]]`` (the rest is ignored); outputs are
  padded stacks with the identity (zero for right-hand sides and solutions,
  ``piv[k, j] = j``) outside each matrix.

A padded CuPy stack of order N <= 32 (float32 or float64) takes a shorter
path on the GPU: one launch of the fixed-size kernel of order N that reads
each matrix's order from ``sizes`` on the device and treats everything
outside it as the identity (``kernels/batched/batched.cuh``,
``matrix_order``; right-hand sides as zero), so there is no grouping, no
gather or scatter and no read of the sizes: the call costs what the
fixed-size call costs (:func:`_padded_call`). Sizes given on the host are
checked there; sizes on the device are checked by the kernels, which mark
the status word that the call reads anyway -- except in the asynchronous
call (``return_info=True, check_finite=False``), which reads nothing: a size
outside [0, N] then gives that matrix NaN results.

Gathering and scattering are one kernel launch per class on the GPU
(``kernels/batched/vbatched.cu``: a thread per element, each padded region
written once, so outputs need no fill beforehand) and one vectorized index
computation per class on the CPU; no Python loop over matrices, apart from
reading a list's arrays. On the GPU nothing per matrix comes to the host: a
padded stack's size classes are counted on the device (one small read,
which also validates ``sizes``), a batch whose matrices all fill the stack
is passed to the fixed-size routine as it is (no gather, no scatter), each
class's ``info`` is written into one device array, summarized once at the
end (:func:`scipy_gpuqr.batched._common.info_counts`: one pass, one
wait), and only the offending indices of an error are looked up. The
fixed-size routine checks finiteness itself; only when it finds an inf or
NaN is the class redone without the check to flag each matrix.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
from scipy.linalg import LinAlgError, LinAlgWarning

from . import _gpu
from . import _gpu_common as _gc
from ._common import (NONFINITE, as_stack, bad_indices, batch_names, cupy_stack,
                      info_counts, result_dtype)
from ._kernel_registry import KERNEL_VARIANTS, SMALL_MAX, VB_FILE, vb_name
from .._gpu import import_cupy, is_cupy_array
from .._kernels import load_module

__all__ = ["lu_factor", "solve", "inv", "cho_factor", "SIZE_CLASSES",
           "size_class"]

#: Orders of the padded stacks (beyond the last one: multiples of 128).
SIZE_CLASSES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56,
                64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def size_class(n):
    """The padded order of matrices of order ``n`` (int or integer array)."""
    if isinstance(n, int):              # one order: no array machinery
        if n <= SIZE_CLASSES[-1]:
            return next(c for c in SIZE_CLASSES if c >= n)
        return -(-n // 128) * 128
    n = np.asarray(n, dtype=np.int64)
    classes = np.asarray(SIZE_CLASSES, dtype=np.int64)
    idx = np.minimum(np.searchsorted(classes, n), len(classes) - 1)
    big = -(-n // 128) * 128
    out = np.where(n <= classes[-1], classes[idx], big)
    return out if out.ndim else int(out)


#: Threads per block of the gather/scatter kernels, and most blocks (grid-stride).
_VB_THREADS = 256
_VB_MAX_BLOCKS = 65536

#: Pad values of the gather/scatter kernels: zeros, the identity, the row index.
PAD_ZERO, PAD_IDENTITY, PAD_ROW = 0, 1, 2

_VB_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32))


@functools.lru_cache(maxsize=None)
def _vb_function(kernel: str, dt: str, device: int):
    """``kernel<dt>`` of ``kernels/batched/vbatched.cu`` (``dt`` '': not a template)."""
    module = load_module(VB_FILE, KERNEL_VARIANTS[VB_FILE])
    return module.get_function(vb_name(kernel, dt) if dt else kernel)


def _launch_vb(kernel: str, dtype, total: int, args) -> None:
    if total == 0:
        return
    fn = _vb_function(kernel, np.dtype(dtype).name, _gc.device_id())
    grid = max(1, min(_VB_MAX_BLOCKS, -(-total // _VB_THREADS)))
    fn((grid,), (_VB_THREADS,), args)


class _Ragged:
    """Matrices (or right-hand sides) of different shapes in one flat buffer.

    Item ``k`` is ``flat[off[k] + r * stride[k] + c]`` for ``r < rows[k]``
    and ``c < cols[k]``. ``padded`` is the (B, R, C) shape of the padded
    input form, None for a list. On the GPU the four per-item arrays may be
    CuPy arrays (a padded stack's, built on the device); in the padded form
    ``off``, ``cols`` and ``stride`` may be None: ``k * R * C``, ``C`` and
    ``C``, made when first needed (a stack passed as it is never needs them).
    """

    def __init__(self, xp, flat, off, rows, cols, stride, padded, stack=None):
        self.xp, self.flat, self._off = xp, flat, off
        self.rows, self._cols, self._stride = rows, cols, stride
        self.padded = padded
        self.stack = stack           # the padded form's (B, R, C) array, when contiguous
        self._meta = None

    def _default(self, name: str, value):
        if value is None:
            b, r, c = self.padded
            value = (self.xp.arange(b, dtype=np.int64) * (r * c) if name == "off"
                     else self.xp.full(b, c, dtype=np.int64))
            setattr(self, "_" + name, value)
        return value

    @property
    def off(self):
        return self._default("off", self._off)

    @property
    def cols(self):
        return self._default("cols", self._cols)

    @property
    def stride(self):
        return self._default("stride", self._stride)

    @property
    def count(self) -> int:
        return self.padded[0] if self.padded is not None else len(self.rows)

    def _kernels(self, dtype) -> bool:
        """True when the GPU kernels gather/scatter ``dtype`` for this layout."""
        return self.xp is not np and np.dtype(dtype) in _VB_DTYPES

    def _device_meta(self):
        """(off, rows, cols, stride) as int64 device arrays (made once)."""
        if self._meta is None:
            cp = self.xp
            self._meta = tuple(cp.asarray(v, dtype=cp.int64) for v in
                               (self.off, self.rows, self.cols, self.stride))
        return self._meta

    def _idx_dev(self, idx):
        return _gc.NULL if idx is None else self.xp.asarray(idx, dtype=np.int64)

    def index(self, idx, nr: int, nc: int):
        """(valid, src) of shape (len(idx), nr, nc) for the items ``idx``."""
        xp = self.xp
        off = xp.asarray(self.off[idx])[:, None, None]
        rows = xp.asarray(self.rows[idx])[:, None, None]
        cols = xp.asarray(self.cols[idx])[:, None, None]
        stride = xp.asarray(self.stride[idx])[:, None, None]
        r = xp.arange(nr, dtype=np.int64)[None, :, None]
        c = xp.arange(nc, dtype=np.int64)[None, None, :]
        valid = (r < rows) & (c < cols)
        src = xp.where(valid, off + r * stride + c, 0)
        return valid, src

    def gather(self, idx, nr: int, nc: int, dtype, identity: bool):
        """Items ``idx`` (None: all) as a (len(idx), nr, nc) stack, padded with I or 0."""
        xp = self.xp
        if self._kernels(dtype):
            count = self.count if idx is None else len(idx)
            stack = xp.empty((count, nr, nc), dtype=dtype)
            flat = self.flat if self.flat.dtype == dtype else self.flat.astype(dtype)
            _launch_vb("vb_gather", dtype, stack.size,
                       (flat,) + self._device_meta() +
                       (self._idx_dev(idx), np.int64(count), stack, np.int32(nr),
                        np.int32(nc), np.int32(PAD_IDENTITY if identity else PAD_ZERO)))
            return stack
        if idx is None:
            idx = self.xp.arange(self.count)
        valid, src = self.index(idx, nr, nc)
        if identity:
            pad = (xp.arange(nr)[:, None] == xp.arange(nc)[None, :]).astype(dtype)
        else:
            pad = xp.zeros((), dtype=dtype)
        return xp.where(valid, self.flat[src].astype(dtype, copy=False), pad)

    def empty_like(self, dtype, pad: int):
        """An output buffer of this layout (padded form: filled with ``pad``,
        except where :meth:`scatter`'s kernel writes every region itself)."""
        xp = self.xp
        if self.padded is None:
            return xp.empty(int((self.rows * self.cols).sum()), dtype=dtype)
        if self._kernels(dtype):
            return xp.empty(int(np.prod(self.padded)), dtype=dtype)
        out = xp.zeros(self.padded, dtype=dtype)
        if pad == PAD_IDENTITY:
            k = min(self.padded[1:])
            out[:, xp.arange(k), xp.arange(k)] = 1
        elif pad == PAD_ROW:
            out[...] = xp.arange(self.padded[1], dtype=dtype)[None, :, None]
        return out.reshape(-1)

    def scatter(self, out, idx, stack, pad: int) -> None:
        """Write the padded stack of items ``idx`` (None: all) back into
        ``out`` (the kernel also writes the padding, ``pad``, of a padded form)."""
        if self._kernels(out.dtype):
            count = self.count if idx is None else len(idx)
            pr, pc = (self.padded[1], self.padded[2]) if self.padded is not None else (0, 0)
            stack = self.xp.ascontiguousarray(stack, dtype=out.dtype)
            per = (pr * pc) if pr else stack.shape[1] * stack.shape[2]
            _launch_vb("vb_scatter", out.dtype, count * per,
                       (out,) + self._device_meta() +
                       (self._idx_dev(idx), np.int64(count), stack, np.int32(stack.shape[1]),
                        np.int32(stack.shape[2]), np.int32(pr), np.int32(pc), np.int32(pad)))
            return
        if idx is None:
            idx = self.xp.arange(self.count)
        valid, src = self.index(idx, stack.shape[1], stack.shape[2])
        out[src[valid]] = stack[valid]

    def unpack(self, out, vector: bool = False):
        """``out`` in the input's form: a list of arrays or a padded stack."""
        if self.padded is not None:
            shape = self.padded[:2] if vector else self.padded
            return out if out.shape == shape else out.reshape(shape)
        items = []
        for k in range(self.count):
            o, r, c = int(self.off[k]), int(self.rows[k]), int(self.cols[k])
            piece = out[o:o + r * c]
            items.append(piece if vector else piece.reshape(r, c))
        return items


def _side(items, where: str, name: str):
    """The array module of a list's items (all NumPy or all CuPy)."""
    gpu = [is_cupy_array(x) for x in items]
    if any(gpu) and not all(gpu):
        raise ValueError(f"{where}: {name} mixes NumPy and CuPy arrays")
    return bool(gpu) and all(gpu)


def _matrices(a, sizes, where: str):
    """Validate the matrices; return (_Ragged, result dtype, on GPU input)."""
    if isinstance(a, (list, tuple)):
        if sizes is not None:
            raise ValueError(f"{where}: sizes is only for a padded stack, "
                             "not for a list of matrices")
        on_gpu = _side(a, where, "a")
        xp = import_cupy() if on_gpu else np
        mats = []
        for k, m in enumerate(a):
            m = m if on_gpu else np.asarray(m)
            if m.ndim != 2 or m.shape[0] != m.shape[1]:
                raise ValueError(f"{where}: matrix {k} must be square and 2-D, "
                                 f"got shape {tuple(m.shape)}")
            if m.dtype == object or m.dtype.kind in "SUVM":
                raise ValueError(f"{where}: matrix {k} must be numeric, got "
                                 f"dtype {m.dtype}")
            mats.append(m)
        dt = (result_dtype(np.result_type(*[m.dtype for m in mats]), where)
              if mats else np.dtype(np.float64))
        n = np.array([m.shape[0] for m in mats], dtype=np.int64)
        off = np.concatenate(([0], np.cumsum(n * n)[:-1])).astype(np.int64) \
            if len(n) else n
        flat = (xp.concatenate([xp.ravel(m).astype(dt, copy=False) for m in mats])
                if mats else xp.empty(0, dtype=dt))
        return _Ragged(xp, flat, off, n, n, n, None), dt, on_gpu
    arr, batch = as_stack(a, where)
    if arr.ndim != 3:
        raise ValueError(f"{where}: a padded stack must have shape (B, N, N), "
                         f"got {tuple(arr.shape)}")
    if sizes is None:
        raise ValueError(f"{where}: a padded stack needs sizes (the order of "
                         "each matrix)")
    big_n = arr.shape[-1]
    on_gpu = is_cupy_array(arr)
    xp = import_cupy() if on_gpu else np
    # on the GPU the sizes stay on the device (validated by _classes' one read)
    sz = xp.asarray(sizes) if on_gpu else np.asarray(
        sizes.get() if is_cupy_array(sizes) else sizes)
    if sz.shape != batch or (sz.size and sz.dtype.kind not in "iu"):
        raise ValueError(f"{where}: sizes must be integers of shape {batch}, "
                         f"got {sz.dtype} of shape {sz.shape}")
    sz = sz.astype(np.int64, copy=False)
    if not on_gpu and sz.size and (sz.min() < 0 or sz.max() > big_n):
        raise ValueError(f"{where}: sizes must lie in [0, {big_n}]")
    arr = xp.ascontiguousarray(arr)
    return (_Ragged(xp, arr.reshape(-1), None, sz, sz, None, (len(sz), big_n, big_n), arr),
            arr.dtype, on_gpu)


def _vectors_of(mats: _Ragged):
    """The layout of per-matrix vectors of length n (pivots)."""
    n = mats.rows
    if mats.padded is None:
        off = np.concatenate(([0], np.cumsum(n)[:-1])).astype(np.int64) if len(n) else n
        return _Ragged(mats.xp, None, off, n, np.ones_like(n), np.ones_like(n), None)
    return _Ragged(mats.xp, None, None, n, None, None, (mats.count, mats.padded[1], 1))


def _classes(mats: _Ragged, where: str):
    """({class order: indices of its matrices}, whole) in ascending order.

    ``whole``: the matrices fill a padded stack exactly (one class, every
    size N): the stack itself is that class's stack. On the GPU a padded
    stack's classes are counted on the device (one small read, which also
    validates the sizes); the only class of such a call gets None (all
    matrices) instead of an index array.
    """
    sizes = mats.rows
    if mats.padded is None or mats.xp is np:
        cls = size_class(sizes) if len(sizes) else np.zeros(0, dtype=np.int64)
        out = {int(c): np.flatnonzero(cls == c) for c in np.unique(cls)}
        whole = (mats.padded is not None and len(out) == 1 and
                 bool((sizes == mats.padded[1]).all()))
        return out, whole
    cp = mats.xp
    big_n, count = mats.padded[1], mats.count
    lim = _class_limit(big_n)                      # past the largest class
    # the counts and the classes in one allocation, the launch by cuLaunchKernel
    # and the counts' read through a pinned buffer: a call's host work
    counts, cls = _gc.alloc_outputs((((lim + 2,), np.uint64), ((count,), np.int32)))
    counts.data.memset_async(0, counts.nbytes)
    if not (sizes._c_contiguous and sizes.dtype == np.int64):
        sizes = cp.ascontiguousarray(sizes, dtype=np.int64)
    if count:
        fn = _vb_function("vb_classes", "", _gc.device_id())
        grid = max(1, min(_VB_MAX_BLOCKS, -(-count // _VB_THREADS)))
        _gc.launch(fn.kernel.ptr, grid, _VB_THREADS, 0,
                   (sizes.data.ptr, count, big_n, lim, cls.data.ptr, counts.data.ptr))
    host = _gc.read_words(counts)
    if host[lim]:
        raise ValueError(f"{where}: sizes must lie in [0, {big_n}]")
    present = np.flatnonzero(host[:lim])
    if len(present) == 1:
        return {int(present[0]): None}, int(host[lim + 1]) == count
    return {int(c): cp.flatnonzero(cls == c) for c in present}, False


@functools.lru_cache(maxsize=256)
def _class_limit(big_n: int) -> int:
    """One past the largest size class of a padded stack of order ``big_n``
    (the length of ``vb_classes``' counts less its two extra slots)."""
    return int(size_class(max(int(big_n), 1))) + 1


def _run(call, check_finite: bool, *stacks):
    """``call(check_finite)`` (a fixed-size routine with ``return_info=True``)
    and the finiteness flags to store: None when it ran with the check and
    found nothing; when it found an inf or NaN (ValueError) it runs again
    without the check and the flags of each of ``stacks`` are returned."""
    try:
        return call(check_finite), None
    except ValueError:
        if not check_finite:
            raise
    return call(False), [_finite(st) for st in stacks]


def _finite(stack):
    """Per matrix of a stack: no inf or NaN (on the stack's device, no copy to the host)."""
    xp = import_cupy() if is_cupy_array(stack) else np
    return xp.isfinite(stack).all(axis=(1, 2))


def _square_stack(mats: _Ragged, idx, order: int, dt):
    """The matrices ``idx`` of ``mats`` as an (len(idx), order, order) stack
    (padded with the identity)."""
    return mats.gather(idx, order, order, dt, identity=True)


def _whole_stack(mats: _Ragged, dt):
    """A padded stack whose matrices fill it, as the (B, N, N) stack itself."""
    st = mats.flat.reshape(mats.padded) if mats.stack is None else mats.stack
    return st if st.dtype == dt else st.astype(dt)


def _store_info(info, idx, inf, ok=None, code: int = -1):
    """``info[idx] = inf``, with ``code`` where ``ok`` (finiteness flags) is
    False; returns ``info``. ``info`` None (a stack passed as it is, one
    class): ``inf`` itself is the call's info."""
    xp = _gc.cupy() if is_cupy_array(inf) else np
    inf = xp.asarray(inf)
    if ok is not None:
        inf = xp.where(ok, inf, code).astype(np.int32, copy=False)
    if info is None:
        return inf if inf.ndim == 1 else inf.reshape(-1)
    info[idx] = inf
    return info


def _summarize(info, where: str, check_finite: bool, names=((-1, "a"),)):
    """(singular count) of the whole call's ``info``; ValueError (with
    ``check_finite``) naming the matrices flagged by a negative code of ``names``."""
    singular, nonfinite = info_counts(info)
    if check_finite and nonfinite:
        for code, name in names:
            first, total = bad_indices(info == code)
            if total:
                raise ValueError(f"{where}: {NONFINITE} ({name} at index "
                                 f"{_name(first, total)})")
    return singular


def _raise_if_singular(info, where: str) -> None:
    """LinAlgError naming the exactly singular matrices (``info > 0``)."""
    first, total = bad_indices(info > 0)
    raise LinAlgError(f"{where}: singular matrix at index {_name(first, total)} "
                      "(U[k, k] exactly zero)")


def _first_info(info):
    """(names of the matrices with info > 0, info of the first)."""
    first, total = bad_indices(info > 0)
    return _name(first, total), int(info[int(first[0])])


def _name(indices, total=None) -> str:
    """Matrix indices as the batched error messages name them."""
    indices = np.asarray(indices)
    return batch_names(indices, (int(indices.max(initial=0)) + 1,), total)


# ----------------------------------------------------------------------------
# padded CuPy stacks of order <= 32: one kernel with per-matrix orders
# ----------------------------------------------------------------------------

_SIZE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _padded_call(a, sizes, backend, where):
    """``(sizes on the device, N)`` when ``a`` is a CuPy float32/float64
    padded stack (B, N, N), B > 0, 0 < N <= 32, that the kernels take with
    per-matrix orders; None for anything else (the size-class path).

    ``sizes`` stays on the device when it is a C-contiguous CuPy int32/int64
    array of shape (B,) (the kernels check its range); other integer sizes
    are checked here and copied to the device.
    """
    if backend not in (None, "gpu") or not cupy_stack(a):
        return None
    shape = a.shape
    big_n = shape[-1]
    if len(shape) != 3 or not shape[0] or not 0 < big_n <= SMALL_MAX or sizes is None:
        return None
    if is_cupy_array(sizes):
        if sizes.shape != shape[:1] or sizes.dtype.kind not in "iu":
            return None                     # the general path's messages
        if sizes.dtype not in _SIZE_DTYPES or not sizes._c_contiguous:
            sizes = sizes.astype(np.int64, order="C")
        return sizes, big_n
    host = np.asarray(sizes)
    if host.shape != shape[:1] or host.dtype.kind not in "iu":
        return None
    if host.min() < 0 or host.max() > big_n:
        raise ValueError(f"{where}: sizes must lie in [0, {big_n}]")
    return _gc.cupy().asarray(host, dtype=np.int64), big_n


def _padded_status(where, counts, big_n, info, check_finite, b_bad=None):
    """Raise for what the status word of a padded call says: a size outside
    [0, N]; with ``check_finite`` an inf or NaN in ``a`` (``info < 0``,
    named) or in the right-hand sides (``b_bad()``: their flags per matrix)."""
    if counts is None:
        return
    if counts[_gc.STATUS_SIZES]:
        raise ValueError(f"{where}: sizes must lie in [0, {big_n}]")
    if not check_finite:
        return
    if counts[_gc.STATUS_NONFINITE]:
        first, total = bad_indices(info < 0)
        raise ValueError(f"{where}: {NONFINITE} (a at index {_name(first, total)})")
    if b_bad is not None and counts[_gc.STATUS_RHS]:
        first, total = bad_indices(b_bad())
        raise ValueError(f"{where}: {NONFINITE} (b at index {_name(first, total)})")


def _padded_report(check_finite, return_info, device, nan_fill=False):
    """(status word or None, kernel report) as the fixed-size calls make them."""
    st = None if (return_info and not check_finite) else _gc.new_status(device)
    return st, _gc.report_args(st, clear_neg=not check_finite,
                               nan_fill=nan_fill and return_info)


def _lu_padded(a, sz, big_n, check_finite, return_info, where):
    dev = _gc.device_id()
    st, report = _padded_report(check_finite, return_info, dev)
    lu, piv, info = _gpu.getrf(a, report=report, device=dev, sizes=_gpu.sizes_args(sz))
    counts = None if st is None else _gc.read_status(st)
    _padded_status(where, counts, big_n, info, check_finite)
    if return_info:
        return lu, piv, info
    if counts[_gc.STATUS_SINGULAR]:
        names, first = _first_info(info)
        warnings.warn(f"{where}: exactly singular matrices at index {names} "
                      f"(first: diagonal number {first} is exactly "
                      "zero). Singular matrix.", LinAlgWarning, stacklevel=3)
    return lu, piv


def _inv_padded(a, sz, big_n, check_finite, return_info, where):
    dev = _gc.device_id()
    st, report = _padded_report(check_finite, return_info, dev, nan_fill=True)
    x, info = _gpu.getri(a, report=report, device=dev, sizes=_gpu.sizes_args(sz))
    counts = None if st is None else _gc.read_status(st)
    _padded_status(where, counts, big_n, info, check_finite)
    if not return_info and counts[_gc.STATUS_SINGULAR]:
        _raise_if_singular(info, where)
    return (x, info) if return_info else x


def _cho_padded(a, sz, big_n, lower, check_finite, return_info, where):
    dev = _gc.device_id()
    st, report = _padded_report(check_finite, return_info, dev)
    c, info = _gpu.potrf(a, lower, report=report, device=dev, sizes=_gpu.sizes_args(sz))
    counts = None if st is None else _gc.read_status(st)
    _padded_status(where, counts, big_n, info, check_finite)
    if not return_info and counts[_gc.STATUS_SINGULAR]:
        names, first = _first_info(info)
        raise LinAlgError(f"{where}: not positive definite at index {names} "
                          f"(the {first}-th leading minor of the "
                          "first is not positive definite)")
    return (c, bool(lower), info) if return_info else (c, bool(lower))


def _solve_padded(a, b, sz, big_n, check_finite, return_info, where):
    """:func:`solve` of a padded stack (N <= 32) by one fused kernel; None
    when ``b`` is not a CuPy (B, N) or (B, N, k) array (the general path)."""
    if not is_cupy_array(b) or b.ndim not in (2, 3) or b.shape[:2] != a.shape[:2] \
            or (b.ndim == 3 and not b.shape[2]):
        return None
    dt = np.promote_types(a.dtype, result_dtype(b.dtype, where))
    if not (dt == a.dtype or dt == np.float64):
        return None
    cp = _gc.cupy()
    if a.dtype != dt:
        a = a.astype(dt)
    if b.dtype != dt or not b._c_contiguous:
        b = cp.ascontiguousarray(b, dtype=dt)
    k = 1 if b.ndim == 2 else b.shape[2]
    dev = _gc.device_id()
    st, report = _padded_report(check_finite, return_info, dev)
    solve_report = _gc.report_args(st if check_finite else None, nan_fill=return_info)
    x, info = _gpu.gesv(a, (b, big_n * k, a.shape[0], k, b.shape), report, solve_report,
                        return_info, dev, fused=True, sizes=_gpu.sizes_args(sz))
    counts = None if st is None else _gc.read_status(st)

    def b_bad():
        rows = cp.arange(big_n)[None, :] < sz[:, None]
        return (~cp.isfinite(b.reshape(a.shape[0], big_n, k)) & rows[:, :, None]).any(axis=(1, 2))
    _padded_status(where, counts, big_n, info, check_finite, b_bad)
    if not return_info and counts[_gc.STATUS_SINGULAR]:
        _raise_if_singular(info, where)
    return (x, info) if return_info else x


def lu_factor(a, sizes, *, batched, check_finite, return_info, backend):
    """:func:`scipy_gpuqr.lu_factor_vbatched`; ``batched``: ``lu_factor_batched``."""
    where = "lu_factor_vbatched"
    fast = _padded_call(a, sizes, backend, where)
    if fast is not None:
        return _lu_padded(a, *fast, check_finite, return_info, where)
    mats, dt, on_gpu = _matrices(a, sizes, where)
    vecs = _vectors_of(mats)
    xp = mats.xp
    classes, whole = _classes(mats, where)
    if whole:
        lu_out = piv_out = None
    else:
        lu_out = mats.empty_like(dt, PAD_IDENTITY)
        piv_out = vecs.empty_like(np.int32, PAD_ROW)
    info = None if whole else xp.zeros(mats.count, dtype=np.int32)
    for order, idx in classes.items():
        stack = _whole_stack(mats, dt) if whole else _square_stack(mats, idx, order, dt)
        (lu, piv, inf), ok = _run(
            lambda cf, stack=stack: batched(stack, check_finite=cf, return_info=True,
                                            backend=backend), check_finite, stack)
        if whole:
            lu_out, piv_out = xp.asarray(lu), xp.asarray(piv)
        else:
            mats.scatter(lu_out, idx, xp.asarray(lu), PAD_IDENTITY)
            vecs.scatter(piv_out, idx, xp.asarray(piv)[:, :, None], PAD_ROW)
        info = _store_info(info, idx, inf, ok and ok[0])
    lu_res, piv_res = mats.unpack(lu_out), vecs.unpack(piv_out, vector=True)
    if return_info and not check_finite:       # nothing to raise or warn: no summary
        return lu_res, piv_res, info
    singular = _summarize(info, where, check_finite)
    if return_info:
        return lu_res, piv_res, info
    if singular:
        names, first = _first_info(info)
        warnings.warn(f"{where}: exactly singular matrices at index {names} "
                      f"(first: diagonal number {first} is exactly "
                      "zero). Singular matrix.", LinAlgWarning, stacklevel=2)
    return lu_res, piv_res


def _rhs_layout(b, mats: _Ragged, where: str):
    """Right-hand sides matching ``mats``: (_Ragged, vector form, dtype)."""
    if isinstance(b, (list, tuple)):
        if mats.padded is not None or len(b) != mats.count:
            raise ValueError(f"{where}: b must be a list of {mats.count} arrays "
                             "when a is a list (a padded array for a padded a)")
        xp = mats.xp
        items = [x if is_cupy_array(x) else np.asarray(x) for x in b]
        vector = bool(items) and all(x.ndim == 1 for x in items)
        rows, cols = [], []
        for k, x in enumerate(items):
            if x.ndim not in (1, 2) or x.shape[0] != mats.rows[k] or \
                    (x.ndim == 1) != vector:
                raise ValueError(f"{where}: b[{k}] must have shape ({mats.rows[k]},) "
                                 f"or ({mats.rows[k]}, k) (all vectors or all "
                                 f"matrices), got {tuple(x.shape)}")
            rows.append(x.shape[0])
            cols.append(1 if x.ndim == 1 else x.shape[1])
        rows, cols = np.array(rows, np.int64), np.array(cols, np.int64)
        dt = np.result_type(*[x.dtype for x in items]) if items else np.float64
        off = np.concatenate(([0], np.cumsum(rows * cols)[:-1])).astype(np.int64) \
            if len(rows) else rows
        flat = (xp.concatenate([xp.ravel(xp.asarray(x)) for x in items]).astype(dt)
                if items else xp.empty(0, dtype=dt))
        return _Ragged(xp, flat, off, rows, cols, cols, None), vector, dt
    xp = mats.xp
    barr = xp.asarray(b)
    big_b, big_n = mats.padded[0], mats.padded[1]
    if barr.ndim not in (2, 3) or barr.shape[:2] != (big_b, big_n):
        raise ValueError(f"{where}: b must have shape ({big_b}, {big_n}) or "
                         f"({big_b}, {big_n}, k), got {tuple(barr.shape)}")
    vector = barr.ndim == 2
    k = 1 if vector else barr.shape[2]
    flat = xp.ascontiguousarray(barr).reshape(-1)
    return (_Ragged(xp, flat, None, mats.rows, None, None, (big_b, big_n, k)),
            vector, barr.dtype)


def solve(a, b, sizes, *, batched, check_finite, return_info, backend):
    """:func:`scipy_gpuqr.solve_vbatched`; ``batched``: ``solve_batched``."""
    where = "solve_vbatched"
    fast = _padded_call(a, sizes, backend, where)
    if fast is not None:
        res = _solve_padded(a, b, *fast, check_finite, return_info, where)
        if res is not None:
            return res
    mats, adt, on_gpu = _matrices(a, sizes, where)
    rhs, vector, bdt = _rhs_layout(b, mats, where)
    dt = np.promote_types(adt, result_dtype(bdt, where))
    xp = mats.xp
    classes, whole = _classes(mats, where)
    x_out = None if whole else rhs.empty_like(dt, PAD_ZERO)
    info = None if whole else xp.zeros(mats.count, dtype=np.int32)
    for order, idx in classes.items():
        if whole:
            stack = _whole_stack(mats, dt)
            bst = rhs.flat.reshape(rhs.padded).astype(dt, copy=False)
        else:
            stack = _square_stack(mats, idx, order, dt)
            width = (rhs.padded[2] if rhs.padded is not None else
                     int(rhs.cols[idx].max()) if len(idx) else 1)
            bst = rhs.gather(idx, order, width, dt, identity=False)
        (x, inf), ok = _run(
            lambda cf, stack=stack, bst=bst: batched(stack, bst, check_finite=cf,
                                                     return_info=True, backend=backend),
            check_finite, stack, bst)
        if whole:
            x_out = xp.asarray(x)
        else:
            rhs.scatter(x_out, idx, xp.asarray(x), PAD_ZERO)
        if ok:               # a's infs/NaNs -1, b's -2
            inf = xp.where(ok[1], xp.asarray(inf), -2)
        info = _store_info(info, idx, inf, ok and ok[0])
    if check_finite or not return_info:        # else nothing to raise: no summary
        singular = _summarize(info, where, check_finite, ((-1, "a"), (-2, "b")))
        if singular and not return_info:
            _raise_if_singular(info, where)
    res = rhs.unpack(x_out)
    if vector:
        res = res[..., 0] if rhs.padded is not None else [v.reshape(-1) for v in res]
    if return_info:
        return res, info
    return res


def inv(a, sizes, *, batched, check_finite, return_info, backend):
    """:func:`scipy_gpuqr.inv_vbatched`; ``batched``: ``inv_batched``."""
    where = "inv_vbatched"
    fast = _padded_call(a, sizes, backend, where)
    if fast is not None:
        return _inv_padded(a, *fast, check_finite, return_info, where)
    mats, dt, on_gpu = _matrices(a, sizes, where)
    classes, whole = _classes(mats, where)
    out = None if whole else mats.empty_like(dt, PAD_IDENTITY)
    info = None if whole else mats.xp.zeros(mats.count, dtype=np.int32)
    for order, idx in classes.items():
        stack = _whole_stack(mats, dt) if whole else _square_stack(mats, idx, order, dt)
        (x, inf), ok = _run(
            lambda cf, stack=stack: batched(stack, check_finite=cf, return_info=True,
                                            backend=backend), check_finite, stack)
        if whole:
            out = mats.xp.asarray(x)
        else:
            mats.scatter(out, idx, mats.xp.asarray(x), PAD_IDENTITY)
        info = _store_info(info, idx, inf, ok and ok[0])
    if check_finite or not return_info:        # else nothing to raise: no summary
        singular = _summarize(info, where, check_finite)
        if singular and not return_info:
            _raise_if_singular(info, where)
    res = mats.unpack(out)
    if return_info:
        return res, info
    return res


def cho_factor(a, sizes, lower, *, batched, check_finite, return_info, backend):
    """:func:`scipy_gpuqr.cho_factor_vbatched`; ``batched``: ``cho_factor_batched``."""
    where = "cho_factor_vbatched"
    fast = _padded_call(a, sizes, backend, where)
    if fast is not None:
        return _cho_padded(a, *fast, lower, check_finite, return_info, where)
    mats, dt, on_gpu = _matrices(a, sizes, where)
    classes, whole = _classes(mats, where)
    out = None if whole else mats.empty_like(dt, PAD_IDENTITY)
    info = None if whole else mats.xp.zeros(mats.count, dtype=np.int32)
    for order, idx in classes.items():
        stack = _whole_stack(mats, dt) if whole else _square_stack(mats, idx, order, dt)
        (c, _, inf), ok = _run(
            lambda cf, stack=stack: batched(stack, lower=lower, check_finite=cf,
                                            return_info=True, backend=backend),
            check_finite, stack)
        if whole:
            out = mats.xp.asarray(c)
        else:
            mats.scatter(out, idx, mats.xp.asarray(c), PAD_IDENTITY)
        info = _store_info(info, idx, inf, ok and ok[0])
    if check_finite or not return_info:        # else nothing to raise: no summary
        singular = _summarize(info, where, check_finite)
        if singular and not return_info:
            names, first = _first_info(info)
            raise LinAlgError(f"{where}: not positive definite at index {names} "
                              f"(the {first}-th leading minor of the "
                              "first is not positive definite)")
    res = mats.unpack(out)
    if return_info:
        return res, bool(lower), info
    return res, bool(lower)
