"""Batched small dense LU, triangular solves and Cholesky on the CPU (NumPy).

Every routine works on a stack ``(B, n, n)`` and is vectorized over the
batch axis: the Python loops run over columns (or column blocks), never over
matrices. Partial pivoting follows LAPACK's ``getrf`` exactly: the pivot of
column ``k`` is the *first* row (in the current, already swapped order) whose
entry has the largest ``|re| + |im|`` (``i?amax``), a zero pivot leaves the
column unscaled and sets ``info = k + 1`` (first occurrence only), and the
multipliers are formed with the reciprocal of the pivot like ``getf2``.

The public wrappers in :mod:`scipy_gpuqr.batched._functions` validate input and map
``info`` to SciPy's warnings and exceptions; nothing here raises for a
singular matrix.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lu_factor", "lu_solve", "potrf", "potrs", "trsm_lower",
           "trsm_upper", "CHUNK_BYTES", "PANEL"]

#: Work on at most this many bytes of matrices at once (cache-sized chunks).
CHUNK_BYTES = 1 << 21

#: Column block of the blocked LU for n > PANEL.
PANEL = 16


def _chunks(batch: int, n: int, itemsize: int):
    step = max(1, CHUNK_BYTES // max(1, n * n * itemsize))
    for start in range(0, batch, step):
        yield slice(start, min(batch, start + step))


def _absmax_key(x: np.ndarray) -> np.ndarray:
    """LAPACK's i?amax measure: |x| for real, |re| + |im| for complex."""
    if np.iscomplexobj(x):
        return np.abs(x.real) + np.abs(x.imag)
    return np.abs(x)


def _panel(a, piv, info, k0: int, k1: int) -> None:
    """Unblocked LU of columns k0..k1-1 (rows k0..n-1), swapping whole rows.

    ``a`` (b, n, n) is overwritten; ``piv`` (b, n) and ``info`` (b,) updated.
    """
    b = a.shape[0]
    ar = np.arange(b)
    sfmin = np.finfo(a.dtype).tiny
    for k in range(k0, k1):
        p = k + np.argmax(_absmax_key(a[:, k:, k]), axis=1)
        piv[:, k] = p
        pv = a[ar, p, k]
        swap = p != k
        if swap.any():
            idx = ar[swap]
            pk = p[swap]
            row_k = a[idx, k, :].copy()
            a[idx, k, :] = a[idx, pk, :]
            a[idx, pk, :] = row_k
        zero = pv == 0
        if zero.any():
            info[zero & (info == 0)] = k + 1
        if k + 1 < a.shape[1]:
            safe = np.where(zero, 1, pv)
            col = a[:, k + 1:, k]
            big = _absmax_key(safe) >= sfmin if np.iscomplexobj(a) else \
                np.abs(safe) >= sfmin
            if big.all():
                col *= (1 / safe)[:, None]
            else:
                col[...] = np.where(big[:, None], col * (1 / safe)[:, None],
                                    col / safe[:, None])
            if k + 1 < k1:
                a[:, k + 1:, k + 1:k1] -= col[:, :, None] * a[:, k, None, k + 1:k1]


def _lu_inplace(a, piv, info) -> None:
    n = a.shape[-1]
    if n <= PANEL:
        _panel(a, piv, info, 0, n)
        return
    for k0 in range(0, n, PANEL):
        k1 = min(n, k0 + PANEL)
        _panel(a, piv, info, k0, k1)
        if k1 < n:
            # U12 = L11^{-1} A12 (unit lower forward substitution)
            for i in range(k0 + 1, k1):
                a[:, i, k1:] -= np.matmul(a[:, i, None, k0:i],
                                          a[:, k0:i, k1:])[:, 0, :]
            # A22 -= L21 @ U12
            a[:, k1:, k1:] -= np.matmul(a[:, k1:, k0:k1], a[:, k0:k1, k1:])


def lu_factor(a: np.ndarray):
    """LU with partial pivoting of every matrix of a stack.

    Parameters
    ----------
    a : ndarray, shape (B, n, n)
        Floating (or complex) stack; not modified.

    Returns
    -------
    lu : ndarray, shape (B, n, n)
        Unit lower L (below the diagonal) and U, like ``scipy.linalg.lu_factor``.
    piv : ndarray of int32, shape (B, n)
        0-based row interchanges: row ``k`` was swapped with ``piv[k]``.
    info : ndarray of int32, shape (B,)
        0, or ``k + 1`` for the first exactly zero pivot ``U[k, k]``.
    """
    a = np.array(a, copy=True, order="C")
    bsz, n = a.shape[0], a.shape[-1]
    piv = np.zeros((bsz, n), dtype=np.int64)
    info = np.zeros(bsz, dtype=np.int32)
    for sl in _chunks(bsz, n, a.itemsize):
        sub = a[sl]
        p = piv[sl]
        inf = info[sl]
        _lu_inplace(sub, p, inf)
    return a, piv.astype(np.int32), info


def trsm_lower(l: np.ndarray, x: np.ndarray, unit: bool) -> None:
    """Solve ``L y = x`` in place for a stack; L is the lower triangle of ``l``.

    ``l`` (B, n, n), ``x`` (B, n, k), modified in place.
    """
    n = l.shape[-1]
    for i in range(n):
        if i:
            x[:, i, :] -= np.matmul(l[:, i, None, :i], x[:, :i, :])[:, 0, :]
        if not unit:
            x[:, i, :] /= l[:, i, i, None]


def trsm_upper(u: np.ndarray, x: np.ndarray, unit: bool) -> None:
    """Solve ``U y = x`` in place for a stack; U is the upper triangle of ``u``."""
    n = u.shape[-1]
    for i in range(n - 1, -1, -1):
        if i < n - 1:
            x[:, i, :] -= np.matmul(u[:, i, None, i + 1:], x[:, i + 1:, :])[:, 0, :]
        if not unit:
            x[:, i, :] /= u[:, i, i, None]


def _apply_pivots(x: np.ndarray, piv: np.ndarray, reverse: bool) -> None:
    ar = np.arange(x.shape[0])
    n = piv.shape[-1]
    order = range(n - 1, -1, -1) if reverse else range(n)
    for k in order:
        p = piv[:, k]
        swap = p != k
        if swap.any():
            idx = ar[swap]
            pk = p[swap]
            row = x[idx, k, :].copy()
            x[idx, k, :] = x[idx, pk, :]
            x[idx, pk, :] = row


def lu_solve(lu: np.ndarray, piv: np.ndarray, b: np.ndarray, trans: int = 0):
    """Solve with LU factors of a stack; ``b`` (B, n, k) is not modified.

    ``trans`` 0: A x = b, 1: Aᵀ x = b, 2: Aᴴ x = b (as ``scipy.linalg.lu_solve``).
    """
    x = np.array(b, copy=True, order="C")
    if trans == 0:
        _apply_pivots(x, piv, reverse=False)
        trsm_lower(lu, x, unit=True)
        trsm_upper(lu, x, unit=False)
        return x
    m = np.swapaxes(lu, -1, -2)
    if trans == 2:
        m = m.conj()
    m = np.ascontiguousarray(m)
    # Aᵀ = Uᵀ Lᵀ P: Uᵀ z = b (lower), Lᵀ w = z (unit upper), x = Pᵀ w
    trsm_lower(m, x, unit=False)
    trsm_upper(m, x, unit=True)
    _apply_pivots(x, piv, reverse=True)
    return x


def _hermitian_lower(a: np.ndarray, lower: bool) -> np.ndarray:
    """The stack whose lower triangle holds the triangle that potrf reads."""
    if lower:
        return a
    t = np.swapaxes(a, -1, -2)
    return t.conj() if np.iscomplexobj(t) else t


def _potrf_vectorized(w: np.ndarray):
    """Lower Cholesky of the Hermitian matrices given by w's lower triangle.

    Returns (L, info); failed matrices keep going on a dummy pivot of 1 (their
    later entries may overflow: no warning, as LAPACK gives none, info reports them).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return _potrf_columns(w)


def _potrf_columns(w: np.ndarray):
    bsz, n = w.shape[0], w.shape[-1]
    l = np.zeros_like(w)
    info = np.zeros(bsz, dtype=np.int32)
    for j in range(n):
        lj = l[:, j, :j]
        d = w[:, j, j].real - np.sum((lj * lj.conj()).real, axis=1)
        bad = ~(d > 0)
        if bad.any():
            info[bad & (info == 0)] = j + 1
            d = np.where(bad, 1.0, d)
        djj = np.sqrt(d).astype(w.dtype)
        l[:, j, j] = djj
        if j + 1 < n:
            s = w[:, j + 1:, j] - np.matmul(l[:, j + 1:, :j],
                                            lj.conj()[:, :, None])[:, :, 0]
            l[:, j + 1:, j] = s / djj[:, None]
    return l, info


def potrf(a: np.ndarray, lower: bool):
    """Cholesky of a stack like ``scipy.linalg.cho_factor`` per matrix.

    Returns ``(c, info)``: ``c`` holds the factor in the selected triangle and
    the input's entries in the other one (as LAPACK potrf leaves them).
    """
    w = _hermitian_lower(a, lower)
    info = np.zeros(a.shape[0], dtype=np.int32)
    try:
        with np.errstate(all="ignore"):
            l = np.linalg.cholesky(w)
    except np.linalg.LinAlgError:
        l, info = _potrf_vectorized(np.ascontiguousarray(w))
    n = a.shape[-1]
    tri = np.tril(np.ones((n, n), dtype=bool))
    if lower:
        c = np.where(tri, l, a)
    else:
        u = np.swapaxes(l, -1, -2)
        u = u.conj() if np.iscomplexobj(u) else u
        c = np.where(tri.T, u, a)
    return np.ascontiguousarray(c, dtype=a.dtype), info


def potrs(c: np.ndarray, lower: bool, b: np.ndarray):
    """Solve with a Cholesky factor from :func:`potrf`; ``b`` (B, n, k)."""
    x = np.array(b, copy=True, order="C")
    if lower:
        trsm_lower(c, x, unit=False)
        m = np.swapaxes(c, -1, -2)
        m = np.ascontiguousarray(m.conj() if np.iscomplexobj(m) else m)
        trsm_upper(m, x, unit=False)
    else:
        m = np.swapaxes(c, -1, -2)
        m = np.ascontiguousarray(m.conj() if np.iscomplexobj(m) else m)
        trsm_lower(m, x, unit=False)
        trsm_upper(c, x, unit=False)
    return x
