"""Tile operations of the tiled QR, for NumPy (LAPACK) and CuPy alike.

Two representations of the Householder reflectors of one tile column
("panel") ``k`` exist, both applied by every device:

* :class:`TilePanel` -- the paper's tile kernels (LAPACK): GEQRT of the
  diagonal tile (triangulation, T), then one TSQRT (``tpqrt`` with ``l = 0``,
  elimination, E) per tile below it, flat tree. Applying it is one GEMQRT
  (update for triangulation, UT) and one TPMQRT per tile below (update for
  elimination, UE). The CPU builds these.
* :class:`WYPanel` -- the triangulation and the eliminations of the whole
  column fused into one Householder QR of the tall tile column (cuSOLVER
  ``geqrf`` through ``cupy.linalg.qr(mode='raw')``) and one compact-WY
  block reflector ``I - V T V^T``; UT and UE of a column tile are fused into
  ``C -= V (T^T (V^T C))``. GPUs build these: one ``geqrf`` is much cheaper
  than ``M`` serial tile QRs there.

Every function takes the array module ``xp`` (numpy or cupy) where it matters,
so the CuPy code paths run under NumPy in CI.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Optional

import numpy as np
from scipy.linalg import lapack

__all__ = ["TilePanel", "WYPanel", "factor_tiles", "apply_tiles",
           "factor_wy", "factor_wy_recursive", "apply_wy", "larft_from_gram", "apply_panel",
           "panel_arrays", "rebuild_panel", "lapack_funcs"]


@dataclasses.dataclass
class TilePanel:
    """Reflectors of one tile column in tile form (GEQRT + TSQRTs).

    Attributes
    ----------
    k0 : int
        First row of the panel.
    R : array, shape (r, w)
        Upper trapezoidal diagonal block of R.
    v0, t0 : arrays
        GEQRT of the diagonal tile: ``v0`` (rows0 x r, unit lower trapezoidal,
        only its strict lower part is read), ``t0`` (ib x r).
    vs, ts : list of arrays
        TSQRT of each tile below (``vs[i]``: rows_i x r, ``ts[i]``: ib x r).
    rows : list of int
        Row counts of the tiles: diagonal tile first.
    """

    k0: int
    R: object
    v0: object
    t0: object
    vs: list
    ts: list
    rows: list

    kind = "tiles"


@dataclasses.dataclass
class WYPanel:
    """Reflectors of one tile column as one block reflector ``I - V T V^T``.

    Attributes
    ----------
    k0 : int
    R : array, shape (r, w)
    V : array, shape (m - k0, r), unit lower trapezoidal (explicit ones and
        zeros).
    T : array, shape (r, r), upper triangular.
    """

    k0: int
    R: object
    V: object
    T: object

    kind = "wy"


def lapack_funcs(dtype):
    """``(geqrt, tpqrt, gemqrt, tpmqrt)`` for float32 or float64."""
    p = "s" if np.dtype(dtype) == np.float32 else "d"
    return tuple(getattr(lapack, p + name)
                 for name in ("geqrt", "tpqrt", "gemqrt", "tpmqrt"))


# ---------------------------------------------------------------- tile form
def factor_tiles(col, k0: int, tile: int, ib: int) -> TilePanel:
    """T and E of one tile column on the CPU (GEQRT, then TSQRT per tile).

    Parameters
    ----------
    col : ndarray, shape (m - k0, w)
        Rows ``k0:`` of the column tile; not modified.
    k0 : int
    tile : int
        Row tile size.
    ib : int
        LAPACK inner block size of the T factors.
    """
    geqrt, tpqrt, _, _ = lapack_funcs(col.dtype)
    mk, w = col.shape
    rows0 = min(tile, mk)
    r = min(rows0, w)
    top = np.asfortranarray(col[:rows0])
    ib0 = max(1, min(ib, r)) if r else 1
    if r == 0:
        return TilePanel(k0, np.zeros((0, w), col.dtype), top[:, :0],
                         np.zeros((1, 0), col.dtype), [], [], [rows0])
    a, t0, info = geqrt(ib0, top)
    _check(info, "geqrt")
    R = np.triu(a[:r])
    panel = TilePanel(k0, R, a[:, :r].copy(order="F"), t0, [], [], [rows0])
    if mk > rows0:
        # rows0 == tile >= w == r here: R is square w x w
        Rsq = np.asfortranarray(R[:, :w])
        for s in range(rows0, mk, tile):
            b = np.asfortranarray(col[s:s + tile])
            Rsq, bv, t, info = tpqrt(0, ib0, Rsq, b)
            _check(info, "tpqrt")
            panel.vs.append(bv)
            panel.ts.append(t)
            panel.rows.append(b.shape[0])
        panel.R = np.triu(Rsq)
    return panel


def apply_tiles(panel: TilePanel, C, trans: str = "T"):
    """Apply ``Q^T`` (trans='T') or ``Q`` (trans='N') of a tile panel to ``C``.

    ``C`` holds rows ``k0:`` of the columns to update; NumPy uses GEMQRT and
    TPMQRT (UT and UE), CuPy the same block formulas with matrix products.
    Returns the updated array (NumPy: a new F-ordered array; CuPy: ``C``
    updated in place).
    """
    r = panel.R.shape[0]
    if r == 0 or C.shape[1] == 0:
        return C
    if isinstance(C, np.ndarray):
        return _apply_tiles_lapack(panel, C, trans)
    xp = importlib.import_module(type(C).__module__.split(".")[0])
    return _apply_tiles_xp(xp, panel, C, trans)


def _apply_tiles_lapack(panel, C, trans):
    _, _, gemqrt, tpmqrt = lapack_funcs(C.dtype)
    C = np.asfortranarray(C)
    r = panel.R.shape[0]
    rows0 = panel.rows[0]
    starts = np.cumsum([0] + panel.rows)
    if trans == "T":
        c0, info = gemqrt(panel.v0, panel.t0, C[:rows0], side="L", trans="T")
        _check(info, "gemqrt")
        C[:rows0] = c0
        top = np.asfortranarray(C[:r])
        for i, (v, t) in enumerate(zip(panel.vs, panel.ts)):
            s, e = starts[i + 1], starts[i + 2]
            top, b, info = tpmqrt(0, v, t, top, np.asfortranarray(C[s:e]),
                                  side="L", trans="T")
            _check(info, "tpmqrt")
            C[s:e] = b
        C[:r] = top
    else:
        top = np.asfortranarray(C[:r])
        for i in range(len(panel.vs) - 1, -1, -1):
            s, e = starts[i + 1], starts[i + 2]
            top, b, info = tpmqrt(0, panel.vs[i], panel.ts[i], top,
                                  np.asfortranarray(C[s:e]), side="L",
                                  trans="N")
            _check(info, "tpmqrt")
            C[s:e] = b
        C[:r] = top
        c0, info = gemqrt(panel.v0, panel.t0, C[:rows0], side="L", trans="N")
        _check(info, "gemqrt")
        C[:rows0] = c0
    return C


def _blocks(t, r):
    """Column blocks of LAPACK's blocked T (ib x r): (start, stop, T_block)."""
    ib = t.shape[0]
    for s in range(0, r, ib):
        e = min(s + ib, r)
        yield s, e, t[:e - s, s:e]


def _unit_lower(xp, v, r):
    """Explicit unit lower trapezoidal matrix from LAPACK's V storage."""
    V = xp.tril(v[:, :r], -1)
    idx = xp.arange(min(r, v.shape[0]))
    V[idx, idx] = 1
    return V


def _apply_tiles_xp(xp, panel, C, trans):
    """Tile panel with matrix products (GPU update of a CPU-made panel)."""
    r = panel.R.shape[0]
    rows0 = panel.rows[0]
    starts = np.cumsum([0] + panel.rows)
    V0 = _unit_lower(xp, panel.v0, r)

    def geq(block_order):
        for s, e, tb in block_order:
            Vb = V0[s:, s:e]
            W = Vb.T @ C[s:rows0]
            W = (tb.T if trans == "T" else tb) @ W
            C[s:rows0] -= Vb @ W

    def tpm(i, block_order):
        v = panel.vs[i]
        s0, e0 = starts[i + 1], starts[i + 2]
        for s, e, tb in block_order:
            W = C[s:e] + v[:, s:e].T @ C[s0:e0]
            W = (tb.T if trans == "T" else tb) @ W
            C[s:e] -= W
            C[s0:e0] -= v[:, s:e] @ W

    if trans == "T":
        geq(list(_blocks(panel.t0, r)))
        for i in range(len(panel.vs)):
            tpm(i, list(_blocks(panel.ts[i], r)))
    else:
        for i in range(len(panel.vs) - 1, -1, -1):
            tpm(i, list(_blocks(panel.ts[i], r))[::-1])
        geq(list(_blocks(panel.t0, r))[::-1])
    return C


# ------------------------------------------------------------------ WY form
def larft_from_gram(xp, G, tau):
    """Upper triangular ``T`` of ``H_1 ... H_r = I - V T V^T`` from ``G = V^T V``.

    Builds ``T`` bottom-up by merging neighbouring blocks,
    ``T = [[T1, -T1 G12 T2], [0, T2]]``, all merges of one level as one
    batched product (``log2 r`` levels), so a GPU does it in a few dozen
    launches instead of ``r`` dependent ones, with no host transfer. Exact for
    ``tau_i = 0``.
    """
    r = tau.shape[0]
    size = 1
    while size < r:
        size *= 2
    T = xp.zeros((size, size), dtype=G.dtype)
    Gp = xp.zeros((size, size), dtype=G.dtype)
    idx = xp.arange(r)
    T[idx, idx] = tau
    Gp[:r, :r] = G
    Tf = T.reshape(-1)
    Gf = Gp.reshape(-1)
    b = 1
    while b < size:
        n2 = size // (2 * b)
        base = xp.arange(n2) * (2 * b) * (size + 1)      # top-left of block p
        ij = xp.arange(b)
        blk = (base[:, None, None] + ij[None, :, None] * size
               + ij[None, None, :])                      # (n2, b, b)
        T11 = Tf[blk]
        T22 = Tf[blk + b * (size + 1)]
        G12 = Gf[blk + b]
        Tf[blk + b] = -xp.matmul(xp.matmul(T11, G12), T22)
        b *= 2
    return xp.ascontiguousarray(T[:r, :r])


def factor_wy(xp, col, k0: int, leaf: int = 0) -> WYPanel:
    """T and E of a whole tile column fused into one Householder QR.

    Parameters
    ----------
    xp : module
        numpy or cupy (cuSOLVER ``geqrf``).
    col : array, shape (m - k0, w)
        Rows ``k0:`` of the column tile; not modified.
    leaf : int
        0: one ``geqrf`` of the whole column. Otherwise the recursive panel
        of :func:`factor_wy_recursive` with leaves at most ``leaf`` wide.
    """
    mk, w = col.shape
    r = min(mk, w)
    if r == 0:
        return WYPanel(k0, xp.zeros((0, w), col.dtype),
                       xp.zeros((mk, 0), col.dtype),
                       xp.zeros((0, 0), col.dtype))
    if leaf and w > leaf and mk >= w:
        return factor_wy_recursive(xp, col, k0, leaf)
    h, tau = xp.linalg.qr(col, mode="raw")
    a = h.T.astype(col.dtype, copy=False)     # (mk, w), Fortran order
    R = xp.triu(a[:r])
    V = _unit_lower(xp, a, r)
    G = V.T @ V
    T = larft_from_gram(xp, G, tau[:r].astype(col.dtype, copy=False))
    return WYPanel(k0, xp.ascontiguousarray(R), V, T)


def factor_wy_recursive(xp, col, k0: int, leaf: int) -> WYPanel:
    """Recursive compact-WY panel: halves down to ``leaf`` columns.

    The left half is factorized (recursively), its block reflector is applied
    to the right half with three matrix products, the right half's lower rows
    are factorized, and the two reflectors are merged,
    ``T = [[T1, -T1 (V1^T V2) T2], [0, T2]]``. Only the leaves (at most
    ``leaf`` columns) go through ``geqrf``; the rest of the panel's work is
    matrix products (Elmroth and Gustavson's recursive QR). Requires
    ``col.shape[0] >= col.shape[1]`` (a tall tile column).
    """
    mk, w = col.shape
    if mk < w:
        raise ValueError("the recursive panel needs a tall column")
    A = xp.array(col, order="F", copy=True)
    V = xp.zeros((mk, w), dtype=col.dtype, order="F")
    T = xp.zeros((w, w), dtype=col.dtype)
    _rec_panel(xp, A, V, T, max(1, int(leaf)))
    return WYPanel(k0, xp.ascontiguousarray(xp.triu(A[:w])), V, T)


def _rec_panel(xp, A, V, T, leaf):
    """Factorize ``A`` (tall, in place: R in its top) into ``V`` and ``T``."""
    mk, w = A.shape
    if w <= leaf:
        h, tau = xp.linalg.qr(A, mode="raw")
        a = h.T
        A[...] = a
        V[...] = _unit_lower(xp, a, w)
        G = V.T @ V
        T[...] = larft_from_gram(xp, G, tau[:w].astype(A.dtype, copy=False))
        return
    w1 = max(leaf, (w // 2) // leaf * leaf) if w > 2 * leaf else w // 2
    V1, T1 = V[:, :w1], T[:w1, :w1]
    _rec_panel(xp, A[:, :w1], V1, T1, leaf)
    right = A[:, w1:]
    W = T1.T @ (V1.T @ right)                  # Q1^T right = right - V1 W
    right -= V1 @ W
    V2, T2 = V[w1:, w1:], T[w1:, w1:]
    _rec_panel(xp, A[w1:, w1:], V2, T2, leaf)
    # V1^T [0; V2] = V1[w1:]^T V2
    T[:w1, w1:] = -(T1 @ ((V1[w1:].T @ V2) @ T2))


def apply_wy(panel: WYPanel, C, trans: str = "T"):
    """``C <- (I - V T V^T)^T C`` (trans='T') or ``(I - V T V^T) C``, in place."""
    if panel.V.shape[1] == 0 or C.shape[1] == 0:
        return C
    W = panel.V.T @ C
    W = (panel.T.T if trans == "T" else panel.T) @ W
    C -= panel.V @ W
    return C


def apply_panel(panel, C, trans: str = "T"):
    """Apply either kind of panel to rows ``k0:`` of some columns."""
    if panel.kind == "wy":
        return apply_wy(panel, C, trans)
    return apply_tiles(panel, C, trans)


def panel_arrays(panel) -> list:
    """The arrays a panel is made of (what a transfer copies), in order."""
    if panel.kind == "wy":
        return [panel.R, panel.V, panel.T]
    return [panel.R, panel.v0, panel.t0] + list(panel.vs) + list(panel.ts)


def rebuild_panel(panel, arrays):
    """A panel of the same kind and shape made of ``arrays`` (moved copies)."""
    if panel.kind == "wy":
        R, V, T = arrays
        return WYPanel(panel.k0, R, V, T)
    n = len(panel.vs)
    R, v0, t0 = arrays[:3]
    return TilePanel(panel.k0, R, v0, t0, list(arrays[3:3 + n]),
                     list(arrays[3 + n:3 + 2 * n]), list(panel.rows))


def _check(info, routine: str) -> None:
    if info != 0:
        raise RuntimeError(f"LAPACK {routine} failed with info={info}")


def explicit_q(apply_reverse, m: int, kq: int, dtype, xp, tile: int,
               panels) -> Optional[object]:
    """Form ``Q[:, :kq]`` by applying ``panels`` in reverse order to ``[I; 0]``."""
    Q = xp.zeros((m, kq), dtype=dtype, order="F")
    d = xp.arange(kq)
    Q[d, d] = 1
    for panel in reversed(panels):
        k0 = panel.k0
        if k0 >= kq:
            continue
        sub = Q[k0:, k0:]
        out = apply_reverse(panel, sub)
        if out is not sub:
            Q[k0:, k0:] = out
    return Q
