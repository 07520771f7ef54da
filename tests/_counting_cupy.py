"""A computing NumPy stand-in for CuPy that counts a device route's host round trips.

:func:`install` puts a fake ``cupy`` (and ``cupyx.scipy.linalg``) in ``sys.modules`` and
NumPy versions of the :mod:`~scipy_gpuqr._engine.gpu.array_ops` functions the rank
decision's dense device work calls (column norms, scalings, copies, ``trsm``,
``potrf``, Householder QR, Gaussian blocks), so that the code written for CuPy arrays
runs over NumPy buffers and computes its answer. Its arrays are a NumPy subclass whose
module reads ``cupy``. What is counted, per :attr:`Counts.phase`:

- ``reads``: device → host copies (``.get()``, ``float()``/``int()``/``bool()`` of a
  device array, ``potrf``'s info read back): each waits for the device's queue;
- ``uploads``: host → device copies (``cupy.asarray`` of a host array);
- ``ops``: device operations (ufuncs and products on device arrays, array_ops calls,
  triangular solves);
- ``householder``: thin QRs by ``geqrf``/``orgqr`` (``array_ops.thin_qr``).

Products mixing a device array with a host array (which CuPy refuses) are counted as
``mixed``.
"""

from __future__ import annotations

import collections
import sys
import types

import numpy as np
import scipy.linalg as la


class Counts(collections.Counter):
    """``(phase, kind) → count``; :attr:`phase` names what is counted now."""

    phase = "-"

    def bump(self, kind: str, n: int = 1) -> None:
        self[(self.phase, kind)] += n

    def total(self, kind: str) -> int:
        return sum(v for (_, k), v in self.items() if k == kind)


COUNTS = Counts()


def _h(a):
    return a.view(np.ndarray) if isinstance(a, DevArray) else a


def _wrap(res):
    if isinstance(res, tuple):
        return tuple(_wrap(r) for r in res)
    if isinstance(res, np.ndarray):
        return res.view(DevArray)
    if isinstance(res, np.generic):
        return np.asarray(res).view(DevArray)
    return res


class DevArray(np.ndarray):
    """A NumPy array standing for a CuPy array; reading it on the host is counted."""

    def get(self, *args, **kwargs):
        COUNTS.bump("reads")
        return np.array(self.view(np.ndarray))

    def __float__(self):
        COUNTS.bump("reads")
        return float(self.view(np.ndarray))

    def __int__(self):
        COUNTS.bump("reads")
        return int(self.view(np.ndarray))

    def __bool__(self):
        COUNTS.bump("reads")
        return bool(self.view(np.ndarray))

    def item(self, *args):
        COUNTS.bump("reads")
        return self.view(np.ndarray).item(*args)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        COUNTS.bump("ops")
        if any(type(i) is np.ndarray and i.ndim > 0 for i in inputs):
            COUNTS.bump("mixed")
        if "out" in kwargs:
            kwargs["out"] = tuple(_h(o) for o in kwargs["out"])
        return _wrap(getattr(ufunc, method)(*(_h(i) for i in inputs), **kwargs))

    def copy(self, order="C"):
        COUNTS.bump("ops")
        return np.array(self.view(np.ndarray), order=order).view(DevArray)


DevArray.__module__ = "cupy"


def _asarray(x, dtype=None, order=None):
    if isinstance(x, DevArray):
        if (dtype is None or np.dtype(dtype) == x.dtype) and order is None:
            return x
        COUNTS.bump("ops")
        return np.asarray(x.view(np.ndarray), dtype=dtype, order=order).view(DevArray)
    COUNTS.bump("uploads")
    return np.array(x, dtype=dtype, order=order or "K").view(DevArray)


def _array(x, dtype=None, order="K", copy=True):
    if isinstance(x, DevArray):
        COUNTS.bump("ops")
        return np.array(x.view(np.ndarray), dtype=dtype, order=order).view(DevArray)
    return _asarray(x, dtype, None if order == "K" else order)


def _made(fn):
    return lambda *a, **k: fn(*a, **k).view(DevArray)


def _linalg():
    def norm(x, *a, **k):
        COUNTS.bump("ops")
        return _wrap(np.linalg.norm(_h(x), *a, **k))

    def svd(x, full_matrices=True, compute_uv=True):
        COUNTS.bump("ops")
        return _wrap(np.linalg.svd(_h(x), full_matrices=full_matrices, compute_uv=compute_uv))
    return types.SimpleNamespace(norm=norm, svd=svd)


def _solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False,
                      check_finite=False):
    COUNTS.bump("ops")
    return la.solve_triangular(_h(a), _h(b), trans=trans, lower=lower,
                               unit_diagonal=unit_diagonal, check_finite=False).view(DevArray)


def _column_major(a, ld: int, rows: int, cols: int):
    """The column-major ``rows × cols`` matrix (leading dimension ``ld``) in a's memory."""
    h = _h(a)
    flat = np.ravel(h, order="K")
    if not np.shares_memory(flat, h):
        raise ValueError("not a contiguous array")
    return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols),
                                           strides=(flat.itemsize, ld * flat.itemsize))


def _array_ops():
    """NumPy versions of the array_ops functions the rank decision's device work calls."""
    def normal_block(seed, shape):
        return np.random.default_rng(seed).standard_normal(shape).view(DevArray)

    def fresh_float64(C):
        return np.array(_h(C), dtype=np.float64, order="C").view(DevArray)

    def column_norms(Y):
        Yh = _h(Y)
        return (np.linalg.norm(Yh, axis=0).view(DevArray),
                (~np.isfinite(Yh).all(axis=0)).astype(np.int32).view(DevArray))

    def column_absmax(Y):
        Yh = _h(Y)
        amax = np.where(np.isfinite(Yh), np.abs(Yh), 0.0).max(axis=0, initial=0.0)
        return amax.view(DevArray), (~np.isfinite(Yh).all(axis=0)).astype(np.int32).view(DevArray)

    def divide_columns(Y, d, out=None):
        with np.errstate(all="ignore"):
            r = _h(Y) / _h(d)[None, :]
        if out is None:
            return np.ascontiguousarray(r).view(DevArray)
        _h(out)[...] = r
        return out

    def copy_into(dst, src):
        _h(dst)[...] = _h(src)

    def subtract_into(dst, src):
        _h(dst)[...] -= _h(src)

    def contiguous_copy(a, dtype=None, order="C"):
        return np.array(_h(a), dtype=dtype or a.dtype, order=order).view(DevArray)

    def unit_triangle(src, lower, out=None, *, unit=True):
        s = _h(src)
        k = -1 if unit else 0
        t = np.tril(s, k) if lower else np.triu(s, -k)
        if unit:
            np.fill_diagonal(t, 1.0)
        if out is None:
            return np.ascontiguousarray(t).view(DevArray)
        _h(out)[...] = t
        return out

    def trsm_left(A, lda, B, ldb, m, n, *, lower, trans, unit):
        Bm = _column_major(B, ldb, m, n)
        Bm[...] = la.solve_triangular(np.array(_column_major(A, lda, m, m)), np.array(Bm),
                                      trans=1 if trans else 0, lower=lower,
                                      unit_diagonal=unit, check_finite=False)

    def cholesky_upper(G, info=None):
        n = int(G.shape[0])
        Gm = _column_major(G, n, n, n)
        try:
            U, code = np.linalg.cholesky(np.array(Gm)).T, 0
        except np.linalg.LinAlgError:
            U, code = np.full((n, n), np.nan), 1
        Gm[...] = np.where(np.triu(np.ones((n, n), dtype=bool)), U, Gm)
        if info is None:
            COUNTS.bump("reads")             # the info read back
            return code
        _h(info)[0] = code
        return None

    def thin_qr(X, *, want_r=True):
        COUNTS.bump("householder")
        Q, R = la.qr(np.array(_h(X)), mode="economic")
        return (np.asfortranarray(Q).view(DevArray),
                np.asfortranarray(R).view(DevArray) if want_r else None)

    return dict(normal_block=normal_block, fresh_float64=fresh_float64,
                column_norms=column_norms, column_absmax=column_absmax,
                divide_columns=divide_columns, copy_into=copy_into,
                subtract_into=subtract_into, contiguous_copy=contiguous_copy,
                unit_triangle=unit_triangle, trsm_left=trsm_left,
                cholesky_upper=cholesky_upper, thin_qr=thin_qr)


def install(monkeypatch) -> Counts:
    """The stand-in in place of CuPy for the test (``monkeypatch`` undoes it); returns
    the counts, emptied."""
    from scipy_gpuqr._engine.gpu import array_ops
    cp = types.ModuleType("cupy")
    cp.ndarray = DevArray
    cp.float64, cp.float32, cp.int32, cp.int64 = np.float64, np.float32, np.int32, np.int64
    cp.asarray, cp.array = _asarray, _array
    cp.empty, cp.zeros, cp.ones = _made(np.empty), _made(np.zeros), _made(np.ones)
    cp.empty_like = lambda a, **k: np.empty_like(_h(a), **k).view(DevArray)
    cp.eye = lambda n, *a, **k: (COUNTS.bump("ops"), np.eye(n, *a, **k).view(DevArray))[1]
    cp.linalg = _linalg()
    cupyx = types.ModuleType("cupyx")
    cupyx.scipy = types.ModuleType("cupyx.scipy")
    cupyx.scipy.linalg = types.ModuleType("cupyx.scipy.linalg")
    cupyx.scipy.linalg.solve_triangular = _solve_triangular
    for name, mod in (("cupy", cp), ("cupyx", cupyx), ("cupyx.scipy", cupyx.scipy),
                      ("cupyx.scipy.linalg", cupyx.scipy.linalg)):
        monkeypatch.setitem(sys.modules, name, mod)
    for name, fn in _array_ops().items():
        def counted(*a, _fn=fn, **k):
            COUNTS.bump("ops")
            return _fn(*a, **k)
        monkeypatch.setattr(array_ops, name, counted)
    COUNTS.clear()
    COUNTS.phase = "-"
    return COUNTS
