"""One-launch panel QR for the dense fronts (``kernels/sparse_qr/panel_qr.cu``).

A dense front's blocked QR (:mod:`scipy_gpuqr._engine.dense_front`) spends
its time in the panels when each column is a chain of small launches. This
module factors a tall panel of at most :data:`PANEL_WIDTH` columns in one
cooperative launch: every block keeps a slice of rows in shared memory, and
one grid-wide reduction per column (the column's dot products with all panel
columns and its largest magnitude) lets every block form the reflector and
update its rows; the panel's compact-WY ``T`` comes out of the same dot
products. :func:`panel_qr_numpy` is the NumPy model of that arithmetic
(row slices, reductions, the norm-range and tiny-column rules of the tile
kernels) used by the CPU tests; :class:`PanelKernel` launches the kernel.

Imports without CuPy; :class:`PanelKernel` needs it.
"""

from __future__ import annotations

import functools

import numpy as np

from ..._gpu import device_attributes
from ..._kernels import KernelUse

__all__ = ["NORM_RANGE", "PANEL_FILE", "KERNEL_VARIANTS", "COOPERATIVE_FILES", "PANEL_WIDTH",
           "PANEL_THREADS", "PANEL_SMEM_EXTRA", "panel_smem_bytes", "panel_rows_per_block",
           "panel_qr_numpy", "panel_workspace_elements", "PanelWorkspace", "PanelKernel",
           "panel_kernel", "panel_kernel_name", "panel_kernel_use"]

#: The kernel source (relative to ``kernels/``); its entry points are ``extern "C"``.
PANEL_FILE = "sparse_qr/panel_qr.cu"

#: Name expressions per file (none: the kernels are not templates).
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {PANEL_FILE: ()}

#: Files whose kernels launch cooperatively (the grid barrier needs every block resident).
COOPERATIVE_FILES: tuple[str, ...] = (PANEL_FILE,)

#: Widest panel of one launch (a lane per column), threads per block.
PANEL_WIDTH, PANEL_THREADS = 32, 512

#: Shared row stride and per-block partials (mirrors ``PANEL_LD``/``PANEL_PART``).
_LD, _PART = 33, 40

#: Shared-memory elements besides the rows (mirrors ``PANEL_EXTRA``).
PANEL_SMEM_EXTRA = (PANEL_THREADS // 32) * _PART + _PART + 32 * 33 + 32 + 32 + 8

#: The tile kernels' norm rules (``NORM_LO``/``NORM_HI``/``NORM_TINY`` of
#: :mod:`scipy_gpuqr._engine.host.simulate`, ``NormRange`` in ``factorize.cuh``;
#: a test pins them equal): sums of squares outside ``[NORM_LO, NORM_HI]`` are
#: recomputed scaled, columns of norm below ``NORM_TINY`` are left alone.
NORM_LO, NORM_HI, NORM_TINY = 1e-280, 1e280, 1e-290

#: The same per value type (``NormRange<float>`` for float32).
NORM_RANGE = {np.dtype(np.float64): (NORM_LO, NORM_HI, NORM_TINY),
              np.dtype(np.float32): (1e-30, 1e30, 1e-36)}

#: Fewest rows a block is given (fewer blocks, a cheaper grid barrier and reduction).
MIN_ROWS_PER_BLOCK = 256

#: Most panel heights whose plans a :class:`PanelKernel` keeps (then it starts over).
_PLANS_KEPT = 4096


def panel_smem_bytes(rows_per_block: int, itemsize: int) -> int:
    """Dynamic shared memory of a block holding ``rows_per_block`` panel rows."""
    return (int(rows_per_block) * _LD + PANEL_SMEM_EXTRA) * int(itemsize)


def panel_rows_per_block(m: int, blocks: int, smem_limit: int, itemsize: int):
    """Rows per block for an ``m``-row panel on at most ``blocks`` co-resident blocks.

    Returns ``(rows_per_block, nblocks)``, or None when the panel does not fit
    in ``blocks`` blocks of at most ``smem_limit`` bytes of shared memory.
    Blocks get at least :data:`MIN_ROWS_PER_BLOCK` rows (block 0 at least the
    panel's first :data:`PANEL_WIDTH`), the rows spread evenly.
    """
    m, blocks = int(m), max(int(blocks), 1)
    r = max(MIN_ROWS_PER_BLOCK, PANEL_WIDTH, -(-m // blocks))
    if panel_smem_bytes(r, itemsize) > smem_limit:
        return None
    nbk = -(-m // r)
    r = max(PANEL_WIDTH, -(-m // nbk))
    return r, -(-m // r)


def _ref_dots(A, c, lo_rows, xs):
    """Per-slice partial dot products ``(x/xs)·A[:, k]`` below row ``c`` (``k = c``:
    ``(x/xs)·(x/xs)``) and max ``|x|``, summed over the slices in order (the
    kernel's reduction)."""
    m, w = A.shape
    s = np.zeros(w, dtype=A.dtype)
    mx = A.dtype.type(0)
    for r0, r1 in lo_rows:
        a = max(r0, c + 1)
        if a >= r1:
            continue
        x = A[a:r1, c] / xs
        part = x @ A[a:r1]
        part[c] = x @ x                      # the column's own sum: of (x/xs)²
        s += part
        mx = max(mx, np.abs(x).max())
    return s, mx


def panel_qr_numpy(P: np.ndarray, rows_per_block: int = MIN_ROWS_PER_BLOCK):
    """NumPy model of the panel kernel: Householder QR of ``P`` (m × w) in place.

    Parameters
    ----------
    P : ndarray, shape (m, w), m >= w, w <= :data:`PANEL_WIDTH`
        The panel; on return R on and above the diagonal, V strictly below.
    rows_per_block : int
        Slice height of one block (the reductions sum per slice).

    Returns
    -------
    V : ndarray, shape (m, w)
        Unit lower trapezoidal reflectors (LAPACK ``dlarfg`` convention).
    tau : ndarray, shape (w,)
    T : ndarray, shape (w, w)
        Upper triangular compact-WY factor, ``H_0 … H_{w-1} = I - V T Vᵀ``.
    """
    m, w = P.shape
    if w > PANEL_WIDTH or m < w:
        raise ValueError(f"panel {m}x{w}: need w <= {PANEL_WIDTH} and m >= w")
    dt = P.dtype.type
    lo_, hi_, tiny = (dt(x) for x in NORM_RANGE[P.dtype])
    R = max(int(rows_per_block), PANEL_WIDTH)
    slices = [(r0, min(r0 + R, m)) for r0 in range(0, m, R)]
    tau = np.zeros(w, dtype=P.dtype)
    T = np.zeros((w, w), dtype=P.dtype)
    for c in range(w):
        S, M = _ref_dots(P, c, slices, dt(1))
        ss = S[c]
        if M == 0 or lo_ <= ss <= hi_:
            xnorm, dfac = (dt(0) if M == 0 else np.sqrt(ss)), dt(1)
        else:
            S, _ = _ref_dots(P, c, slices, M)
            xnorm, dfac = M * np.sqrt(S[c]), M
        alpha = P[c, c]
        nrm = np.hypot(alpha, xnorm) if xnorm > 0 else dt(0)
        if not nrm >= tiny:
            continue
        beta = -nrm if alpha >= 0 else nrm
        tk = (beta - alpha) / beta
        scale = dt(1) / (alpha - beta)
        vk = P[c] + (scale * dfac) * S          # y (k < c) and w / tau (k > c)
        wl = np.zeros(w, dtype=P.dtype)
        wl[c + 1:] = tk * vk[c + 1:]
        v = P[c + 1:, c] * scale
        P[c + 1:, c + 1:] -= np.outer(v, wl[c + 1:])
        P[c + 1:, c] = v
        P[c, c + 1:] -= wl[c + 1:]
        P[c, c] = beta
        tau[c] = tk
        T[:c, c] = -tk * (T[:c, :c] @ vk[:c])
        T[c, c] = tk
    V = np.tril(P, -1)
    V[np.arange(w), np.arange(w)] = 1
    return V, tau, T


def panel_kernel_name(dtype) -> str:
    """The entry point of the panel kernel for ``dtype`` values (float64 or float32)."""
    dt = np.dtype(dtype)
    if dt not in (np.float64, np.float32):
        raise TypeError(f"panel QR: float64 or float32, not {dt}")
    return "panel_qr_f64" if dt == np.float64 else "panel_qr_f32"


def panel_kernel_use(dtype) -> KernelUse:
    """What a dense front of ``dtype`` values compiles (for
    :func:`scipy_gpuqr._kernels.prefetch`): the whole file, launched cooperatively."""
    return KernelUse(PANEL_FILE, KERNEL_VARIANTS[PANEL_FILE], (panel_kernel_name(dtype),),
                     cooperative=True)


def _device_limits(device: int) -> tuple[int, int]:
    """(multiprocessors, opt-in shared memory per block) of a device."""
    attrs = device_attributes(device)
    return attrs["multiProcessorCount"], attrs["sharedMemPerBlockOptin"]


def panel_workspace_elements(blocks: int) -> tuple:
    """``(values, flag words)`` of a :class:`PanelWorkspace` for launches of at
    most ``blocks`` blocks (what a dense front's memory count takes for it)."""
    return 3 * int(blocks) * _PART + 64, int(blocks)


class PanelWorkspace:
    """The device buffers of one stream of panel launches.

    ``work``: the blocks' partial sums (two column parities, the rescaled
    pass) and the diagonal row; ``flags``: one word per block, where a block
    posts ``epoch << 16 | sync count``. Each launch takes the next epoch, so
    the flags never need clearing between launches (which must therefore be
    ordered, e.g. on one stream).
    """

    def __init__(self, cp, dtype, blocks: int):
        values, words = panel_workspace_elements(blocks)
        self.work = cp.empty(values, dtype=dtype)
        self.flags = cp.zeros(words, dtype=np.uint64)
        self.epoch = 0

    def next_epoch(self) -> int:
        """The epoch of the next launch (1, 2, …)."""
        self.epoch += 1
        return self.epoch


class PanelKernel:
    """Launches the one-kernel panel QR on the current stream.

    Parameters
    ----------
    dtype : numpy dtype
        float64 or float32.
    max_blocks : int or None
        Most blocks (SMs) one launch takes; None: every SM.

    Notes
    -----
    :meth:`workspace` gives the reduction buffers and the flag words of one
    stream of launches (launches that may run concurrently need their own).
    A dense front launches the kernel for every 32 columns: the plan of each
    panel height and the shared memory the function was allowed are kept, so
    a launch makes no driver call besides the launch itself (the attribute is
    read and raised only when a launch needs more than any before).
    """

    def __init__(self, dtype, max_blocks: int | None = None):
        import cupy as cp
        self.cp = cp
        self.dtype = np.dtype(dtype)
        use = panel_kernel_use(self.dtype)
        self.fn = use.module().get_function(use.needed[0])   # prefetched, or compiled now
        self.sms, self.smem_limit = _device_limits(cp.cuda.Device().id)
        self.blocks = self.sms if max_blocks is None else max(1, min(int(max_blocks), self.sms))
        self._init_caches()

    def _init_caches(self) -> None:
        """The plans by panel height, and the most dynamic shared memory known to be
        allowed (48 KB: every function's without the attribute)."""
        self._plans = {}
        self._smem_ok = 48 * 1024

    def plan(self, m: int):
        """``(rows_per_block, nblocks)`` of an ``m``-row panel, or None (too tall)."""
        m = int(m)
        hit = self._plans.get(m, False)
        if hit is False:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            hit = self._plans[m] = panel_rows_per_block(m, self.blocks, self.smem_limit,
                                                        self.dtype.itemsize)
        return hit

    def workspace(self) -> "PanelWorkspace":
        """Reduction buffers and flag words for launches enqueued on one stream."""
        return PanelWorkspace(self.cp, self.dtype, self.sms)

    def launch(self, F: int, ldf: int, m: int, w: int, V: int, ldv: int, tau: int,
               T: int, ws) -> None:
        """Factor the panel at device address ``F`` (row-major, leading dimension
        ``ldf``, ``m × w``) in place; V to ``V`` (column-major, ``ldv``), ``tau``,
        ``T`` (32 × 32 row-major). Raises ValueError when ``m`` is too tall."""
        plan = self.plan(m)
        if plan is None:
            raise ValueError(f"panel of {m} rows does not fit the panel kernel")
        if not 1 <= w <= PANEL_WIDTH or m < w:
            raise ValueError(f"panel {m}x{w}: need 1 <= w <= {PANEL_WIDTH} <= ... and m >= w")
        R, nbk = plan
        smem = panel_smem_bytes(R, self.dtype.itemsize)
        if smem > self._smem_ok:
            if self.fn.max_dynamic_shared_size_bytes < smem:
                self.fn.max_dynamic_shared_size_bytes = smem
            self._smem_ok = smem
        u64, i64, i32 = np.uint64, np.int64, np.int32
        self.fn((nbk,), (PANEL_THREADS,),
                (u64(F), i64(ldf), i32(m), i32(w), u64(V), i64(ldv), u64(tau), u64(T),
                 ws.work, ws.flags, u64(ws.next_epoch()), i32(R)), shared_mem=smem)


@functools.lru_cache(maxsize=None)
def _panel_kernel(dtype: str, device: int, max_blocks) -> PanelKernel:
    return PanelKernel(dtype, max_blocks)


def panel_kernel(dtype, max_blocks: int | None = None) -> PanelKernel:
    """The :class:`PanelKernel` of ``dtype`` on the current device (built once)."""
    import cupy
    return _panel_kernel(np.dtype(dtype).name, cupy.cuda.Device().id, max_blocks)
