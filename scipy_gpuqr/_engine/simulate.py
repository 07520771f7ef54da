"""The NumPy executor of task lists: ``backend='simulate'`` and CI's proof.

It runs the very records the uberkernel runs (``scipy_gpuqr._schedule.tasks``)
over the same memory layout: one float pool of row-major fronts, a pool of
``TILE × TILE`` VT tiles, S entries and the Rimap/Rjmap maps. Each task reads
and writes only what its record names, so a schedule that lets two tasks of
one launch touch the same tile is caught by running the launch's tasks in a
different order (the tests do).

Numerical conventions (the GPU kernels follow them exactly):

* reflectors as LAPACK's ``dlarfg``: ``H = I - tau v vᵀ`` with ``v[0] = 1``,
  ``beta = -sign(alpha)·‖x‖``; a column with nothing below the diagonal
  gives ``tau = 0``;
* a tile bundle is stacked top tile first, then the other slots in slot
  order; rows past ``fm`` and columns past ``fn`` are zeros, never stored;
* the VT tile is row-major ``TILE × TILE``: ``T`` (forward, columnwise
  compact WY, ``H1…Hk = I - V T Vᵀ``) on and above the diagonal, the top
  tile's ``V1`` strictly below it; only the first ``nref`` columns are set;
* Apply computes ``A ← A - V (Tᵀ (Vᵀ A))``, i.e. ``(H1…Hk)ᵀ A``.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .._schedule.tasks import TaskType

__all__ = ["householder_tile", "execute_task", "execute_launches",
           "apply_qt_front", "launch_conflicts"]


def householder_tile(A: np.ndarray, nref: int) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR of the first ``nref`` columns of ``A`` in place.

    All columns of ``A`` receive the reflectors. Returns ``(tau, T)`` with
    ``T`` the ``nref × nref`` upper triangular compact-WY factor; ``A`` holds
    R on and above the diagonal and the unit-diagonal V below it in the
    first ``nref`` columns.
    """
    m, n = A.shape
    k_max = min(nref, m)
    tau = np.zeros(nref)
    for k in range(k_max):
        alpha = A[k, k]
        x = A[k + 1:, k]
        xnorm = float(np.sqrt(x @ x)) if x.size else 0.0
        if xnorm == 0.0:
            continue
        beta = -np.copysign(np.hypot(alpha, xnorm), alpha)
        tk = (beta - alpha) / beta
        v = x / (alpha - beta)
        A[k, k] = beta
        A[k + 1:, k] = v
        if k + 1 < n:
            w = A[k, k + 1:] + v @ A[k + 1:, k + 1:]
            A[k, k + 1:] -= tk * w
            A[k + 1:, k + 1:] -= tk * np.outer(v, w)
        tau[k] = tk
    V = np.tril(A[:, :nref], -1)
    V[np.arange(min(m, nref)), np.arange(min(m, nref))] = 1.0
    T = np.zeros((nref, nref))
    for k in range(nref):
        T[k, k] = tau[k]
        if k and tau[k] != 0.0:
            T[:k, k] = -tau[k] * (T[:k, :k] @ (V[:, :k].T @ V[:, k]))
    return tau, T


def _one_blas_thread():
    """Small matrix products: one BLAS thread is much faster than many."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _gather_rows(fpool, F, fn, fm, rows, c0, c1, tile):
    """Stack the row tiles ``rows`` over columns [c0, c1) (zero padded)."""
    out = np.zeros((len(rows) * tile, c1 - c0))
    ce = min(c1, fn)
    if ce <= c0:
        return out
    for p, r in enumerate(rows):
        nr = min(tile, fm - r)
        if nr <= 0:
            continue
        base = F + r * fn
        blk = fpool[base: base + nr * fn].reshape(nr, fn)
        out[p * tile: p * tile + nr, : ce - c0] = blk[:, c0:ce]
    return out


def _scatter_rows(fpool, F, fn, fm, rows, c0, c1, tile, data):
    ce = min(c1, fn)
    if ce <= c0:
        return
    for p, r in enumerate(rows):
        nr = min(tile, fm - r)
        if nr <= 0:
            continue
        base = F + r * fn
        blk = fpool[base: base + nr * fn].reshape(nr, fn)
        blk[:, c0:ce] = data[p * tile: p * tile + nr, : ce - c0]


def _factorize(rec, fpool, vtpool, tile, rows, top, col, nref, vt):
    F, fm, fn = int(rec["F"]), int(rec["fm"]), int(rec["fn"])
    others = [r for r in rows if r != top]
    stack = [top] + others
    A = _gather_rows(fpool, F, fn, fm, stack, col, col + tile, tile)
    _, T = householder_tile(A, nref)
    VT = np.zeros((tile, tile))
    VT[:nref, :nref] = np.triu(T)
    low = np.tril(A[:tile, :nref], -1)
    VT[:, :nref] += low
    A[:tile, :nref] = np.triu(A[:tile, :nref])
    _scatter_rows(fpool, F, fn, fm, stack, col, col + tile, tile, A)
    vtpool[vt: vt + tile * tile] = VT.ravel()


def _load_v(rec, fpool, vtpool, tile, rows, col, nref, vt):
    """V (stacked rows, unit lower top tile from the VT tile) and T."""
    F, fm, fn = int(rec["F"]), int(rec["fm"]), int(rec["fn"])
    VT = vtpool[vt: vt + tile * tile].reshape(tile, tile)
    T = np.triu(VT[:nref, :nref])
    V = _gather_rows(fpool, F, fn, fm, rows, col, col + tile, tile)[:, :nref]
    V[:tile] = np.tril(VT[:, :nref], -1)
    V[np.arange(nref), np.arange(nref)] = 1.0
    return V, T


def _apply(rec, fpool, vtpool, tile, rows, col, nref, vt, c0, c1):
    F, fm, fn = int(rec["F"]), int(rec["fm"]), int(rec["fn"])
    V, T = _load_v(rec, fpool, vtpool, tile, rows, col, nref, vt)
    A = _gather_rows(fpool, F, fn, fm, rows, c0, c1, tile)
    A -= V @ (T.T @ (V.T @ A))
    _scatter_rows(fpool, F, fn, fm, rows, c0, c1, tile, A)


def execute_task(rec, fpool: np.ndarray, vtpool: np.ndarray, tile: int, *,
                 spool=None, maps=None) -> None:
    """Run one record in place over the pools.

    Parameters
    ----------
    rec : numpy.void of TASK_DTYPE
    fpool : ndarray of float64
        Front pool.
    vtpool : ndarray of float64
        VT tile pool.
    tile : int
        Tile edge.
    spool : tuple (index, value) or None
        S entries (index relative to the front base) for S-Assemble.
    maps : ndarray of int64 or None
        Rimap and Rjmap pool for Pack-Assemble.
    """
    typ = int(rec["type"])
    rows = [int(r) for r in rec["rows"]]
    if typ == TaskType.FACTORIZE:
        fs, nf = int(rec["fstart"]), int(rec["nfrows"])
        _factorize(rec, fpool, vtpool, tile, rows[fs: fs + nf], rows[int(rec["ftop"])],
                   int(rec["col"]), int(rec["nref"]), int(rec["vt"]))
    elif typ in (TaskType.APPLY, TaskType.APPLY_FACTORIZE):
        na = int(rec["napply"])
        _apply(rec, fpool, vtpool, tile, rows[:na], int(rec["col"]), int(rec["nref"]),
               int(rec["vt"]), int(rec["c0"]), int(rec["c1"]))
        if typ == TaskType.APPLY_FACTORIZE:
            fs, nf = int(rec["fstart"]), int(rec["nfrows"])
            _factorize(rec, fpool, vtpool, tile, rows[fs: fs + nf], rows[int(rec["ftop"])],
                       int(rec["c0"]), int(rec["aux"]), int(rec["vt2"]))
    elif typ == TaskType.S_ASSEMBLE:
        idx, val = spool
        s0, s1 = int(rec["vt"]), int(rec["vt2"])
        fpool[int(rec["F"]) + idx[s0:s1]] = val[s0:s1]
    elif typ == TaskType.PACK_ASSEMBLE:
        _pack(rec, fpool, maps)
    elif typ == TaskType.NONE:
        return
    else:
        raise ValueError(f"task type {typ} is not executable here")


def _pack(rec, fpool, maps):
    """Copy a piece of a child's contribution block into its parent."""
    P, pld = int(rec["F"]), int(rec["fn"])
    C, cld = int(rec["vt"]), int(rec["col"])
    ri, rj = int(rec["vt2"]), int(rec["aux"])
    r0, r1 = int(rec["rows"][0]), int(rec["rows"][1])
    c0, c1 = int(rec["c0"]), int(rec["c1"])
    if r1 <= r0 or c1 <= c0:
        return
    ci = np.arange(r0, r1)
    cj = np.arange(c0, c1)
    src = fpool[C + ci[:, None] * cld + cj[None, :]]
    dst = P + maps[ri + ci][:, None] * pld + maps[rj + cj][None, :]
    if int(rec["nfrows"]) == 1:
        keep = cj[None, :] >= ci[:, None]
        fpool[dst[keep]] = src[keep]
    else:
        fpool[dst] = src


def execute_launches(tasks: np.ndarray, launch: np.ndarray, fpool: np.ndarray,
                     vtpool: np.ndarray, tile: int, *, spool=None, maps=None,
                     rng: np.random.Generator | None = None) -> int:
    """Run records launch by launch (``launch`` nondecreasing); returns launches.

    With ``rng`` the tasks of each launch run in a random order, which gives
    bitwise the same result when the launch has no inner dependencies.
    """
    if len(tasks) == 0:
        return 0
    bounds = np.flatnonzero(np.diff(launch)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(tasks)]))
    with _one_blas_thread():
        for s, e in zip(starts, ends):
            order = np.arange(s, e) if rng is None else s + rng.permutation(e - s)
            for k in order:
                execute_task(tasks[k], fpool, vtpool, tile, spool=spool, maps=maps)
    return len(starts)


def apply_qt_front(tasks: np.ndarray, fpool: np.ndarray, vtpool: np.ndarray,
                   tile: int, B: np.ndarray) -> None:
    """Apply Qᵀ of one front's factorization to ``B`` (fm × k) in place.

    Replays the reflectors of the front's Factorize and Apply+Factorize
    records in order (records of one launch act on disjoint rows).
    """
    with _one_blas_thread():
        _apply_qt(tasks, fpool, vtpool, tile, B)


def _apply_qt(tasks, fpool, vtpool, tile, B):
    for rec in tasks:
        typ = int(rec["type"])
        if typ == TaskType.FACTORIZE:
            col, nref, vt = int(rec["col"]), int(rec["nref"]), int(rec["vt"])
        elif typ == TaskType.APPLY_FACTORIZE:
            col, nref, vt = int(rec["c0"]), int(rec["aux"]), int(rec["vt2"])
        else:
            continue
        rows = [int(r) for r in rec["rows"]]
        fs, nf = int(rec["fstart"]), int(rec["nfrows"])
        top = rows[int(rec["ftop"])]
        stack = [top] + [r for r in rows[fs: fs + nf] if r != top]
        V, T = _load_v(rec, fpool, vtpool, tile, stack, col, nref, vt)
        fm = int(rec["fm"])
        idx = np.concatenate([np.arange(r, r + tile) for r in stack])
        ok = idx < fm
        X = np.zeros((len(idx), B.shape[1]))
        X[ok] = B[idx[ok]]
        X -= V @ (T.T @ (V.T @ X))
        B[idx[ok]] = X[ok]


def _task_tiles(rec, tile):
    """(reads, writes) as sets of (F, row, col) tile keys and ('vt', off)."""
    typ = int(rec["type"])
    F = int(rec["F"])
    rows = [int(r) for r in rec["rows"]]
    reads, writes = set(), set()
    if typ in (TaskType.APPLY, TaskType.APPLY_FACTORIZE):
        na = int(rec["napply"])
        col = int(rec["col"])
        reads.add(("vt", int(rec["vt"])))
        for r in rows[1:na]:
            reads.add((F, r, col))
        for r in rows[:na]:
            for c in range(int(rec["c0"]), int(rec["c1"]), tile):
                writes.add((F, r, c))
    if typ in (TaskType.FACTORIZE, TaskType.APPLY_FACTORIZE):
        fs, nf = int(rec["fstart"]), int(rec["nfrows"])
        col = int(rec["col"]) if typ == TaskType.FACTORIZE else int(rec["c0"])
        for r in rows[fs: fs + nf]:
            writes.add((F, r, col))
        writes.add(("vt", int(rec["vt"] if typ == TaskType.FACTORIZE else rec["vt2"])))
    return reads, writes


def launch_conflicts(tasks: np.ndarray, launch: np.ndarray, tile: int) -> list:
    """Pairs of records of one launch where one writes what the other touches.

    Tile granularity (front, first row, first column) plus VT tiles; used by
    the tests to prove launches have no inner dependencies.
    """
    bad = []
    for L in np.unique(launch):
        idx = np.flatnonzero(launch == L)
        owner: dict = {}
        rd: dict = {}
        for k in idx:
            r, w = _task_tiles(tasks[k], tile)
            for key in w:
                if key in owner and owner[key] != k:
                    bad.append((int(L), int(owner[key]), int(k), key))
                owner[key] = k
            for key in r:
                rd.setdefault(key, set()).add(k)
        for key, ks in rd.items():
            if key in owner and any(k != owner[key] for k in ks):
                bad.append((int(L), int(owner[key]), sorted(ks), key))
    return bad
