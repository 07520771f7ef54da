"""Test matrices and SciPy references shared by the CPU and GPU batched tests."""

from __future__ import annotations

import numpy as np
import scipy.linalg as sl

#: every n from 1 to 40, plus the blocked sizes
SIZES = list(range(1, 41)) + [64, 128]
DTYPES = [np.float64, np.float32]


def eps(dtype) -> float:
    return float(np.finfo(dtype).eps)


def random_batch(rng, shape, n, dtype):
    return rng.standard_normal(tuple(shape) + (n, n)).astype(dtype)


def ill_conditioned_batch(rng, batch, n, dtype, cond=1e6):
    """Matrices U diag(s) Vᵀ with singular values spread over ``cond``."""
    out = np.empty((batch, n, n))
    for i in range(batch):
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((n, n)))
        s = np.logspace(0, -np.log10(cond), n)
        out[i] = (u * s) @ v.T
    return out.astype(dtype)


def singular_batch(rng, batch, n, dtype):
    """Random matrices where every other one has an exactly zero column."""
    a = random_batch(rng, (batch,), n, dtype)
    for i in range(0, batch, 2):
        a[i, :, (i // 2) % n] = 0
    return a


def spd_batch(rng, batch, n, dtype):
    g = rng.standard_normal((batch, n, n))
    return (g @ g.transpose(0, 2, 1) + n * np.eye(n)).astype(dtype)


def lapack_getrf(a):
    """Per-matrix LAPACK getrf: (lu, piv 0-based, info) for a (B, n, n) stack."""
    getrf, = sl.get_lapack_funcs(("getrf",), (a[0],) if len(a) else (a,))
    lus, pivs, infos = [], [], []
    for m in a:
        lu, piv, info = getrf(m)
        lus.append(lu)
        pivs.append(piv)
        infos.append(info)
    return np.array(lus), np.array(pivs), np.array(infos)


def lu_backward_error(a, lu, piv):
    """max over the batch of ‖P L U − A‖ / ‖A‖ (Frobenius)."""
    n = a.shape[-1]
    worst = 0.0
    for m, f, p in zip(a.reshape(-1, n, n), lu.reshape(-1, n, n), piv.reshape(-1, n)):
        l = np.tril(f, -1) + np.eye(n)
        u = np.triu(f)
        prod = (l @ u).astype(np.float64)
        for k in range(n - 1, -1, -1):
            prod[[k, p[k]]] = prod[[p[k], k]]
        nrm = np.linalg.norm(m)
        worst = max(worst, np.linalg.norm(prod - m) / (nrm if nrm else 1))
    return worst


def poison_gpu_outputs(monkeypatch, view_type=None) -> None:
    """Make the GPU drivers allocate outputs filled with NaN (ints: -12345,
    unsigned: 12345),
    each on its own (``view_type``: a cupy.ndarray subclass to return them as);
    the memory of ``alloc_layout`` (one allocation, addresses) filled the same
    way."""
    import cupy as cp
    from scipy_gpuqr.batched import _gpu_common

    def fill(out, dtype):
        kind = np.dtype(dtype).kind
        out.fill(np.nan if kind == "f" else 12345 if kind == "u" else -12345)

    def alloc_outputs(specs):
        outs = []
        for shape, dtype in specs:
            out = cp.empty(shape, dtype=dtype)
            fill(out, dtype)
            outs.append(out if view_type is None else out.view(type=view_type))
        return outs

    real_layout = _gpu_common.alloc_layout

    def alloc_layout(specs):
        mem, layout = real_layout(specs)
        for shape, dtype, offset in layout:
            fill(cp.ndarray(shape, dtype, memptr=mem + offset), dtype)
        return mem, layout
    monkeypatch.setattr(_gpu_common, "alloc_outputs", alloc_outputs)
    monkeypatch.setattr(_gpu_common, "alloc_layout", alloc_layout)
