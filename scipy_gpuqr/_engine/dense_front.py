"""Dense fronts: a blocked Householder QR that follows the front's staircase.

Fronts chosen by :mod:`scipy_gpuqr._schedule.dense` are assembled by the
task lists but factorized here, in place in their front pool (row-major
``fm × fn``, leading dimension ``fn``), right after the launch that
completes their assembly:

for each panel of ``nb`` columns ``[j, j+b)`` (``j < min(fm, fn)``), the
*active rows* are ``[j, t)`` with ``t = min(max(stair[j+b-1], j+b), fm)``
(rows past the staircase are still zero in these columns and stay untouched);

1. the panel ``F[j:t, j:j+b]`` is factorized in place: R on and above the
   diagonal, the unit-lower Householder vectors V strictly below it (LAPACK's
   ``dlarfg`` convention, like the tile kernels). On the GPU by sub-panels of
   32 columns, each in one cooperative launch
   (:mod:`scipy_gpuqr._engine.gpu.dense_panel`: one grid-wide reduction per
   column instead of a chain of launches), each sub-panel's reflectors applied
   to the rest of the panel as compact WY by cuBLAS GEMMs; panels too tall for
   the kernel's shared memory, and ``panel_method='geqrf'``, use cuSOLVER
   ``geqrf`` on a column-major copy. On the host LAPACK ``geqrf``
   (:func:`factorize_numpy`); :func:`factorize_blocked_numpy` is the GPU
   path's blocking in NumPy;
2. the panel's compact-WY factor ``T`` (``H1…Hb = I - V T Vᵀ``) is formed
   from ``G = VᵀV``: ``T (I + striu(G)·diag(tau)) = diag(tau)`` (one
   triangular solve; the ``dlarft`` recurrence in matrix form);
3. the trailing columns of the active rows get ``C ← C - V Tᵀ (Vᵀ C)``: on
   the GPU two cuBLAS GEMMs (and a small one for ``T``) straight on the
   row-major front, seen as the column-major ``Cᵀ``: ``W = Cᵀ V``,
   ``W ← W T``, ``Cᵀ ← Cᵀ - W Vᵀ``.

So R and the contribution block end where the rest of the engine expects
them (R gathered from the front's first rows, the contribution block packed
into the parent by the next launch). A :class:`DenseFront` keeps what ``Q``
needs: the front (V below its diagonal), the panels and their ``T``
factors, on the device or the host, and applies ``Qᵀ``/``Q`` to the front's
rows of a block of vectors with the array module of the block.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import get_lapack_funcs, solve_triangular

from .gpu import array_ops as ops
from .gpu.dense_panel import PANEL_WIDTH, panel_kernel, panel_qr_numpy
from .gpu.mapped import device_view

__all__ = ["DEFAULT_PANEL", "PANEL_METHODS", "DEFAULT_PANEL_METHOD", "DEFAULT_LOOKAHEAD",
           "REFLECTOR_UPLOADS", "REFLECTOR_UPLOAD",
           "panels_of", "geqrf_panels",
           "DenseFront", "HostDenseFront", "factorize_numpy", "factor_panel_numpy",
           "factorize_blocked_numpy",
           "factorize_cupy"]

#: Columns per panel of the blocked factorization (a tunable).
DEFAULT_PANEL = 256

#: How the GPU factorizes a panel: ``"kernel"`` (sub-panels of 32 columns in one
#: launch each, :mod:`scipy_gpuqr._engine.gpu.dense_panel`) or ``"geqrf"``
#: (cuSOLVER, a chain of launches per column).
PANEL_METHODS = ("kernel", "geqrf")
DEFAULT_PANEL_METHOD = "kernel"

#: Factorize panel ``p+1`` on a second stream while panel ``p``'s trailing update
#: runs (see :func:`factorize_cupy`). Off by default: the panel kernel's grid
#: needs whole SMs at once, so it rarely runs beside the trailing GEMM, and the
#: extra high-priority stream slows the launches that overlap the dense fronts.
DEFAULT_LOOKAHEAD = False

#: How :class:`HostDenseFront` brings a panel's reflectors to a device block:
#: ``"mapped"``, a copy kernel reading them where the pinned front lies (a
#: pinned host array is addressable from the device under unified addressing:
#: :func:`~scipy_gpuqr._engine.gpu.mapped.device_view`), or ``"copy2d"``, one
#: ``cudaMemcpy2DAsync`` (a panel's rows are short pieces of the front's rows,
#: which the copy engines bring up below the link's speed).
REFLECTOR_UPLOADS = ("mapped", "copy2d")
#: The default of :data:`REFLECTOR_UPLOADS`.
REFLECTOR_UPLOAD = "mapped"

#: Most thread blocks of the copy kernel that reads a panel over the link
#: (``"mapped"``; None: the array ops' grid, :data:`~.gpu.array_ops.MAX_BLOCKS`).
#: The link bounds the read, not the SMs: a few blocks per SM keep enough loads in
#: flight, where a full grid holds every SM through the read and keeps kernels of
#: other streams waiting (the rank decision's first block solved beside ``Qᵀb``).
MAPPED_READ_BLOCKS = None


def panels_of(fm: int, fn: int, stair, nb: int = DEFAULT_PANEL) -> list:
    """The panels ``(j, rows, b)`` of a staircase front.

    Parameters
    ----------
    fm, fn : int
        Front shape.
    stair : array_like of int, shape (fn,), or None
        ``stair[c]`` = rows whose leftmost nonzero column is ≤ c (None: dense).
    nb : int
        Panel width.

    Returns
    -------
    list of (int, int, int)
        First column ``j``, active rows ``rows`` (``F[j:j+rows]``) and width
        ``b`` of each panel; ``rows ≥ b``.
    """
    if nb < 1:
        raise ValueError(f"panel width must be >= 1, got {nb}")
    nfact = min(int(fm), int(fn))
    st = None if stair is None else np.asarray(stair, dtype=np.int64)
    out = []
    for j in range(0, nfact, nb):
        b = min(nb, nfact - j)
        t = fm if st is None else min(max(int(st[j + b - 1]), j + b), fm)
        out.append((j, t - j, b))
    return out


def _xp_of(a):
    """NumPy or CuPy, whichever owns ``a``."""
    if isinstance(a, np.ndarray):
        return np
    import cupy
    return cupy


def _t_factor(xp, solve_tri, V, tau):
    """Compact-WY ``T`` of reflectors ``V`` (rows × b, unit lower) and ``tau``.

    ``solve_tri``: ``solve_triangular`` of ``xp``'s SciPy (SciPy or cupyx).
    """
    b = V.shape[1]
    G = V.T @ V
    M = xp.triu(G, 1) * tau[None, :]
    M += xp.eye(b, dtype=M.dtype)
    D = xp.diag(tau)
    # T M = D  <=>  Mᵀ Tᵀ = D (M unit upper triangular, always nonsingular)
    return solve_tri(M.T, D, lower=True, unit_diagonal=True).T


class DenseFront:
    """A dense front's Householder data and its ``Qᵀ``/``Q`` (the ``_dense`` interface).

    Parameters
    ----------
    front : ndarray (NumPy or CuPy), shape (fm, fn)
        The factorized front (V strictly below the diagonal of each panel).
    panels : list of (j, rows, b)
        From :func:`panels_of`.
    T : ndarray, shape (npanels, nb, nb)
        Each panel's compact-WY factor in ``T[p, :b, :b]``.
    slots : ndarray of int64, optional
        The front's global row slots (rows of A; set by the engine).
    after_launch : int
        Global launch after whose records the reflectors act (and before
        launch ``after_launch + 1``).

    Notes
    -----
    ``apply_qt(Y)`` / ``apply_q(Y)`` transform ``Y = X[slots]`` (``fm × k``)
    in place with the array module of ``Y``; the front and ``T`` are copied
    to that module once on first use (and kept).
    """

    def __init__(self, front, panels, T, slots=None, after_launch: int = -1):
        self.panels = list(panels)
        self.slots = slots
        self.after_launch = int(after_launch)
        self._front = {_xp_of(front).__name__: front}
        self._T = {_xp_of(T).__name__: T}

    @property
    def shape(self) -> tuple:
        return tuple(next(iter(self._front.values())).shape)

    def set_front(self, front) -> None:
        """Another copy of the same front (e.g. fetched to the host with its pool)."""
        self._front[_xp_of(front).__name__] = front

    def _get(self, store, xp):
        name = xp.__name__
        hit = store.get(name)
        if hit is None:
            src = next(iter(store.values()))
            hit = store[name] = (src.get() if hasattr(src, "get") and xp is np
                                 else xp.asarray(src))
        return hit

    def host(self) -> "DenseFront":
        """Make host copies now (``Qᵀ`` replayed on the host later); returns self."""
        self._get(self._front, np)
        self._get(self._T, np)
        return self

    def has_device_copy(self) -> bool:
        """Whether a copy of the front lies on the device."""
        return any(name != "numpy" for name in self._front)

    def drop_device(self) -> None:
        """Forget device copies (a host copy is made first)."""
        self.host()
        self._front = {"numpy": self._front["numpy"]}
        self._T = {"numpy": self._T["numpy"]}

    def _reflectors(self, xp, front=None):
        F = self._get(self._front, xp) if front is None else front
        T = self._get(self._T, xp)
        for p, (j, rows, b) in enumerate(self.panels):
            if xp is np:
                V = np.tril(F[j:j + rows, j:j + b], -1)
                V[np.arange(b), np.arange(b)] = 1
            else:       # the same values by a prefetched kernel (nothing compiled here)
                V = ops.unit_triangle(F[j:j + rows, j:j + b], lower=True)
            yield j, rows, V, T[p, :b, :b]

    def apply_qt(self, Y, front=None) -> None:
        """``Y ← Qᵀ Y`` in place (``Y``: the front's rows, ``fm × k``; ``front``:
        the factorized front in Y's array module when the caller has it at hand,
        e.g. a view of its uploaded stage pool, instead of a copy made here)."""
        xp = _xp_of(Y)
        for j, rows, V, T in self._reflectors(xp, front):
            Z = Y[j:j + rows]
            if xp is np:
                Z -= (V @ (T.T @ (V.T @ Z))).astype(Y.dtype, copy=False)
            else:
                _wy_apply_device(Z, V, T, trans=True)

    def apply_q(self, Y, front=None) -> None:
        """``Y ← Q Y`` in place (reflectors in reverse order; ``front`` as in
        :meth:`apply_qt`)."""
        xp = _xp_of(Y)
        for j, rows, V, T in reversed(list(self._reflectors(xp, front))):
            Z = Y[j:j + rows]
            if xp is np:
                Z -= (V @ (T @ (V.T @ Z))).astype(Y.dtype, copy=False)
            else:
                _wy_apply_device(Z, V, T, trans=False)


def _wy_apply_device(Z, V, T, *, trans: bool) -> None:
    """``Z -= V op(T) Vᵀ Z`` on the device (``op(T)``: ``Tᵀ`` with ``trans``): the
    generic path's products (CuPy's matmul, cuBLAS) on the operands it would pass
    (:func:`~scipy_gpuqr._engine.gpu.array_ops.matmul_operand`), the update by a
    prefetched kernel: no CuPy kernel is compiled (the generic path compiles a
    copy and a subtraction on first use)."""
    dt = Z.dtype
    W = ops.matmul_operand(V.T, dt, left=True) @ ops.matmul_operand(Z, left=False)
    W = ops.matmul_operand(T.T if trans else T, dt, left=True) @ W
    ops.subtract_into(Z, ops.matmul_operand(V, dt, left=True) @ W)


class HostDenseFront(DenseFront):
    """A dense front whose Householder data stay on the host (a *host front*: too
    large for the device's memory, factorized there by :func:`factorize_numpy`).

    ``apply_qt``/``apply_q`` of a device block bring the front's panels to it
    one at a time into one buffer (``upload``, default
    :data:`REFLECTOR_UPLOAD`: ``"mapped"``, a copy kernel reading the panel's
    lower triangle where the pinned front lies, unit diagonal and zeros
    written on the way; ``"copy2d"``, one strided copy, then the triangle in
    place; a pageable front always takes the copy): the front is never
    uploaded whole, and the block never leaves the device. Where even that
    runs out of device memory, the block's rows go to the host and are
    transformed there (all the BLAS library's threads).
    """

    def __init__(self, front, panels, T, slots=None, after_launch: int = -1,
                 upload: str | None = None):
        super().__init__(front, panels, T, slots=slots, after_launch=after_launch)
        if upload is not None and upload not in REFLECTOR_UPLOADS:
            raise ValueError(f"upload must be one of {REFLECTOR_UPLOADS}, got {upload!r}")
        self.upload = upload
        #: panels read by the copy kernel from the pinned front (the last apply)
        self.mapped_panels = 0

    def _apply(self, Y, trans: bool) -> None:
        if isinstance(Y, np.ndarray):
            (super().apply_qt if trans else super().apply_q)(Y)
            return
        try:
            self._apply_by_panels(Y, trans)
            return
        except MemoryError:     # CuPy's OutOfMemoryError: on the host below
            import cupy as cp
            cp.get_default_memory_pool().free_all_blocks()
        Yh = Y.get()
        (super().apply_qt if trans else super().apply_q)(Yh)
        Y.set(Yh)

    def _apply_by_panels(self, Y, trans: bool) -> None:
        """``Y ← Qᵀ Y`` / ``Q Y`` on the device, each panel's reflectors brought
        up from the host front when its turn comes (a panel's values change only
        in place: a panel applied twice reads the same values)."""
        import cupy as cp
        F = self._get(self._front, np)
        T = self._get(self._T, np)
        if not self.panels:
            return
        how = REFLECTOR_UPLOAD if self.upload is None else self.upload
        view = device_view(cp, F) if how == "mapped" else None
        if view is None and F.strides[1] != F.itemsize:
            F = np.ascontiguousarray(F)
        stream = cp.cuda.get_current_stream()
        Td = cp.asarray(T)
        buf = cp.empty(max(rows * b for _, rows, b in self.panels), dtype=F.dtype)
        self.mapped_panels = 0
        order = list(enumerate(self.panels))
        for p, (j, rows, b) in (order if trans else order[::-1]):
            V = buf[:rows * b].reshape(rows, b)
            if view is not None:    # read over the link, the triangle made on the way
                ops.unit_triangle(view[j:j + rows, j:j + b], lower=True, out=V,
                                  blocks=MAPPED_READ_BLOCKS)
                self.mapped_panels += 1
            else:
                ops.upload_block(F, j, j + rows, j, j + b, V, stream)
                ops.unit_triangle(V, lower=True, out=V)     # elementwise: in place
            _wy_apply_device(Y[j:j + rows], V, Td[p, :b, :b], trans=trans)

    def apply_qt(self, Y, front=None) -> None:
        """``Y ← Qᵀ Y`` in place, computed on the host (``front`` is not used)."""
        self._apply(Y, True)

    def apply_q(self, Y, front=None) -> None:
        """``Y ← Q Y`` in place, computed on the host (``front`` is not used)."""
        self._apply(Y, False)


# ------------------------------------------------------------------------ NumPy / LAPACK

def factorize_numpy(F: np.ndarray, panels: list, nb: int) -> np.ndarray:
    """Blocked staircase QR of the front ``F`` (fm × fn, NumPy view) in place.

    Returns ``T`` (npanels × nb × nb).
    """
    fn = F.shape[1]
    T = np.zeros((len(panels), nb, nb), dtype=F.dtype)
    geqrf, = get_lapack_funcs(("geqrf",), (F,))
    for p, (j, rows, b) in enumerate(panels):
        V, Tp = factor_panel_numpy(F, j, rows, b, geqrf)
        T[p, :b, :b] = Tp
        if j + b < fn:
            C = F[j:j + rows, j + b:]
            C -= V @ (Tp.T @ (V.T @ C))
    return T


def factor_panel_numpy(F: np.ndarray, j: int, rows: int, b: int, geqrf) -> tuple:
    """One panel ``F[j:j+rows, j:j+b]`` by LAPACK ``geqrf`` in place (R and V as
    the dense path stores them); returns the panel's unit lower ``V`` (rows × b)
    and compact-WY ``T`` (b × b). ``geqrf``: LAPACK's, for ``F``'s type."""
    P = np.array(F[j:j + rows, j:j + b], order="F")
    qr, tau, _, info = geqrf(P, overwrite_a=True)
    if info != 0:           # pragma: no cover - illegal argument only
        raise RuntimeError(f"geqrf failed (info {info})")
    F[j:j + rows, j:j + b] = qr
    V = np.tril(qr, -1)
    V[np.arange(b), np.arange(b)] = 1.0
    return V, _t_factor(np, solve_triangular, V, tau.astype(F.dtype))


def factorize_blocked_numpy(F: np.ndarray, panels: list, nb: int,
                            rows_per_block: int = 64) -> np.ndarray:
    """The GPU panel path of :func:`factorize_cupy` in NumPy (the CI model of its blocking).

    Each panel is factorized by sub-panels of ``PANEL_WIDTH`` columns with
    :func:`~scipy_gpuqr._engine.gpu.dense_panel.panel_qr_numpy` (the kernel's
    arithmetic, slices of ``rows_per_block`` rows), each sub-panel's
    reflectors applied to the panel's later columns as ``C -= V Tᵀ (Vᵀ C)``;
    the panel's ``T`` from its whole ``V`` and the trailing update as in
    :func:`factorize_numpy`. Returns ``T`` (npanels × nb × nb).
    """
    fn = F.shape[1]
    T = np.zeros((len(panels), nb, nb), dtype=F.dtype)
    for p, (j, rows, b) in enumerate(panels):
        V = np.zeros((rows, b), dtype=F.dtype)
        tau = np.zeros(b, dtype=F.dtype)
        for q in range(0, b, PANEL_WIDTH):
            w = min(PANEL_WIDTH, b - q)
            Vq, tq, Tq = panel_qr_numpy(F[j + q:j + rows, j + q:j + q + w], rows_per_block)
            V[q:, q:q + w] = Vq
            tau[q:q + w] = tq
            if q + w < b:
                C = F[j + q:j + rows, j + q + w:j + b]
                C -= Vq @ (Tq.T @ (Vq.T @ C))
        Tp = _t_factor(np, solve_triangular, V, tau)
        T[p, :b, :b] = Tp
        if j + b < fn:
            C = F[j:j + rows, j + b:]
            C -= V @ (Tp.T @ (V.T @ C))
    return T


# ------------------------------------------------------------------------ CuPy / cuBLAS

class _Cublas:
    """Raw cuBLAS / cuSOLVER calls on the current stream (host pointer mode).

    ``with blas:`` sets the handle's stream and the host pointer mode, and puts
    the pointer mode back on leaving. Entries nest: only the outermost one
    touches the handle, so a front entered once (:func:`factorize_cupy`) pays
    those calls once, not around each panel's GEMMs. (CuPy's cuBLAS wrappers
    set the handle's stream to the current one at every call; the host pointer
    mode is what this object's calls need, and every CuPy routine that
    changes it puts it back.) The scalars ``one``, ``zero``, ``mone`` are host
    pointers, kept alive by this object.
    """

    def __init__(self, cp, dtype):
        from cupy_backends.cuda.libs import cublas, cusolver
        self.cp, self.cb, self.cs = cp, cublas, cusolver
        self.dtype = np.dtype(dtype)
        single = self.dtype == np.float32
        self.gemm = cublas.sgemm if single else cublas.dgemm
        self.trsm_fn = cublas.strsm if single else cublas.dtrsm
        self.geqrf = cusolver.sgeqrf if single else cusolver.dgeqrf
        self.geqrf_size = cusolver.sgeqrf_bufferSize if single else cusolver.dgeqrf_bufferSize
        self.hb = cp.cuda.device.get_cublas_handle()
        self._hs = None             # cuSOLVER's handle, made when a geqrf panel needs it
        self._scalars = np.array([1, 0, -1], dtype=self.dtype)
        base, isz = self._scalars.ctypes.data, self.dtype.itemsize
        self.one, self.zero, self.mone = base, base + isz, base + 2 * isz
        self.op = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}
        self._depth = 0

    @property
    def hs(self):
        """cuSOLVER's handle (made on first use: a new process pays a tenth of a
        second or more for it, and the kernel panels never need it)."""
        if self._hs is None:
            self._hs = self.cp.cuda.device.get_cusolver_handle()
            self.cs.setStream(self._hs, self.cp.cuda.get_current_stream().ptr)
        return self._hs

    def __enter__(self):
        if self._depth == 0:
            s = self.cp.cuda.get_current_stream().ptr
            self.cb.setStream(self.hb, s)
            if self._hs is not None:
                self.cs.setStream(self._hs, s)
            self.mode = self.cb.getPointerMode(self.hb)
            self.cb.setPointerMode(self.hb, self.cb.CUBLAS_POINTER_MODE_HOST)
        self._depth += 1
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            self.cb.setPointerMode(self.hb, self.mode)
        return False

    def mm(self, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        """Column-major ``C = alpha op(A) op(B) + beta C`` (pointers; ``alpha`` and
        ``beta`` host pointers such as :attr:`one`), inside ``with self:``."""
        op = self.op
        self.gemm(self.hb, op[ta], op[tb], m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)

    def trsm_unit_lower(self, A, B, m: int) -> None:
        """``B ← A⁻¹ B`` for ``A`` (m × m, unit lower triangular) and ``B`` (m × m), both
        column-major with leading dimension m (pointers), inside ``with self:``: the
        call :func:`~scipy_gpuqr._engine.gpu.array_ops.trsm_left` makes for them
        (``lower=True, trans=False, unit=True``) on this object's handle."""
        cb = self.cb
        self.trsm_fn(self.hb, cb.CUBLAS_SIDE_LEFT, cb.CUBLAS_FILL_MODE_LOWER, cb.CUBLAS_OP_N,
                     cb.CUBLAS_DIAG_UNIT, m, m, self.one, A, m, B, m)


def factorize_cupy(F, panels: list, nb: int, stream=None, panel_method: str | None = None,
                   lookahead: bool | None = None):
    """Blocked staircase QR of the front ``F`` (fm × fn, C-contiguous CuPy view) in place.

    Everything is enqueued on ``stream`` (default: the current one) and, with
    look-ahead, on a second stream of higher priority whose work ``stream``
    joins before returning; nothing synchronizes. ``panel_method``: one of
    :data:`PANEL_METHODS` (default :data:`DEFAULT_PANEL_METHOD`).
    ``lookahead`` (default :data:`DEFAULT_LOOKAHEAD`): panel ``p+1`` is
    factorized on the second stream as soon as panel ``p``'s reflectors
    reached its columns, while ``stream`` updates the columns after it.
    Returns ``T`` (npanels × nb × nb, CuPy).
    """
    import cupy as cp
    if not F.flags.c_contiguous:
        raise ValueError("the front must be a C-contiguous (row-major) view")
    method = DEFAULT_PANEL_METHOD if panel_method is None else panel_method
    if method not in PANEL_METHODS:
        raise ValueError(f"panel_method must be one of {PANEL_METHODS}, got {method!r}")
    ahead = DEFAULT_LOOKAHEAD if lookahead is None else bool(lookahead)
    s0 = stream if stream is not None else cp.cuda.get_current_stream()
    dt = np.dtype(F.dtype)
    fn = F.shape[1]
    with s0:
        T = cp.zeros((len(panels), nb, nb), dtype=dt)
        if not panels:
            return T
        rmax = max(r for _, r, _ in panels)
        tau = cp.zeros((len(panels), nb), dtype=dt)
        vbuf = cp.empty((2 if ahead else 1, nb * rmax), dtype=dt)
        W0 = _Work(cp, dt, max(fn, nb) * nb)
    s1 = cp.cuda.Stream(non_blocking=True, priority=-5) if ahead else s0
    if s1 is not s0:
        s1.wait_event(s0.record())
    with s1:
        W1 = _Work(cp, dt, max(fn, nb) * nb) if s1 is not s0 else W0
        fac = _PanelFactor(cp, dt, method, rmax, nb, W1)

    def vt_of(p):
        j, rows, b = panels[p]
        return vbuf[p % len(vbuf), :b * rows].reshape(b, rows)

    if s1 is s0:
        # one stream: its order is the panels' order (no events), and the handle's
        # pointer mode is set once for the whole front
        with s0, W0.blas:
            for p, (j, rows, b) in enumerate(panels):
                Vt, Tp = vt_of(p), T[p]
                fac(F, panels[p], tau[p], Vt, Tp)
                _wy_update(W0, F, j, rows, b, Vt, Tp, j + b, fn)
        return T

    def factor(p):
        with s1:
            fac(F, panels[p], tau[p], vt_of(p), T[p])
        return s1.record()

    with W0.blas, W1.blas:
        done = factor(0)
        rest_done = None
        for p, (j, rows, b) in enumerate(panels):
            nxt = panels[p + 1] if p + 1 < len(panels) else None
            split = j + b + (nxt[2] if nxt is not None else 0)
            if nxt is not None:
                # the next panel's columns first, then its factorization (second stream)
                if rest_done is not None:
                    s1.wait_event(rest_done)
                with s1:
                    _wy_update(W1, F, j, rows, b, vt_of(p), T[p], j + b, split)
                nxt_done = factor(p + 1)
            s0.wait_event(done)
            with s0:
                _wy_update(W0, F, j, rows, b, vt_of(p), T[p], split, fn)
            rest_done = s0.record()
            if nxt is not None:
                done = nxt_done
    return T


def geqrf_panels(panels: list, dtype, panel_method: str | None = None) -> bool:
    """Whether :func:`factorize_cupy` takes any of ``panels`` through cuSOLVER's
    ``geqrf`` on the current device (its buffers then come beside the panel
    kernel's): the ``geqrf`` panel method, or a panel taller than the panel
    kernel's blocks hold (``PanelKernel.plan``). Needs a GPU."""
    method = DEFAULT_PANEL_METHOD if panel_method is None else panel_method
    if not panels:
        return False
    if method != "kernel":
        return True
    return panel_kernel(dtype).plan(max(r for _, r, _ in panels)) is None


class _Work:
    """cuBLAS handle on the current stream and two GEMM work buffers."""

    def __init__(self, cp, dt, size):
        self.blas = _Cublas(cp, dt)
        self.W = cp.empty(size, dtype=dt)
        self.W2 = cp.empty(size, dtype=dt)


def _wy_update(work, F, j, rows, b, Vt, Tp, c0, c1, ldv=None):
    """``C ← C - V Tᵀ (Vᵀ C)`` for ``C = F[j:j+rows, c0:c1]`` (current stream);
    ``Vt``: Vᵀ (b × rows, rows contiguous, ``ldv`` elements apart: default
    ``rows``, C-contiguous), ``Tp``: nb × nb row-major, T in its leading b × b."""
    nc = c1 - c0
    if nc <= 0:
        return
    blas = work.blas
    isz = F.dtype.itemsize
    fn = F.shape[1]
    ldt = Tp.shape[-1]
    C = F.data.ptr + (j * fn + c0) * isz                # Cᵀ: nc × rows, ld fn
    W, W2 = work.W.data.ptr, work.W2.data.ptr
    ldv = rows if ldv is None else int(ldv)
    with blas:          # free inside a front's own (factorize_cupy's)
        # W = Cᵀ V   (V column-major rows × b = Vt's memory, ld ldv)
        blas.mm("N", "N", nc, b, rows, blas.one, C, fn, Vt.data.ptr, ldv, blas.zero, W, nc)
        # W2 = W T   (op of the column-major Tᵀ (= row-major T) transposed: T)
        blas.mm("N", "T", nc, b, b, blas.one, W, nc, Tp.data.ptr, ldt, blas.zero, W2, nc)
        # Cᵀ -= W2 Vᵀ
        blas.mm("N", "T", nc, rows, b, blas.mone, W2, nc, Vt.data.ptr, ldv, blas.one, C, fn)


class _PanelFactor:
    """Factorizes one panel on the current stream: R and V in ``F``, ``tau``,
    ``Vᵀ`` into the given buffer and ``T`` into the given nb × nb slice."""

    def __init__(self, cp, dt, method, rmax, nb, work):
        self.cp = cp
        self.work = work
        self.kern = panel_kernel(dt) if method == "kernel" else None
        self.ws = self.kern.workspace() if self.kern is not None else None
        self.Tq = cp.empty((PANEL_WIDTH, PANEL_WIDTH), dtype=dt)
        self.M = cp.empty(nb * nb, dtype=dt)            # T's system, row-major b × b
        self.D = cp.empty(nb * nb, dtype=dt)            # diag(tau), then T
        self.geq = None
        self.rmax, self.nb, self.dt = rmax, nb, dt

    def __call__(self, F, panel, tau, Vt, Tp):
        cp = self.cp
        j, rows, b = panel
        with self.work.blas:        # free inside factorize_cupy's own
            if self.kern is not None and self.kern.plan(rows) is not None:
                Vt.fill(0)
                _panel_by_kernel(self.work, self.kern, self.ws, self.Tq, F, j, rows, b, tau,
                                 Vt)
            else:
                if self.geq is None:
                    self.geq = _GeqrfPanel(cp, self.work.blas, self.dt, self.rmax, self.nb)
                self.geq(F, j, rows, b, tau, Vt)
            self._t_factor(Vt, tau[:b], Tp[:b, :b])

    def _t_factor(self, Vt, tau, Tb):
        """:func:`_t_factor` on the device into ``Tb`` (b × b), the same operations
        without CuPy's elementwise kernels: ``G = VᵀV`` (cuBLAS), M and diag(tau) by
        a prefetched kernel, the triangular solve by cuBLAS ``trsm`` as
        ``cupyx.scipy.linalg.solve_triangular`` calls it (``Mᵀ`` column-major is
        M row-major; the solution, column-major, is ``T`` row-major; :meth:`_trsm`)."""
        b = int(Vt.shape[0])
        V = Vt.T
        G = V.T @ V
        M = self.M[:b * b].reshape(b, b)
        D = self.D[:b * b].reshape(b, b)
        ops.wy_system(G, tau, M, D)
        self._trsm(M.data.ptr, D.data.ptr, b)
        ops.copy_into(Tb, D)

    def _trsm(self, M, D, b: int) -> None:
        """``D ← M⁻¹ D`` (pointers, b × b column-major, M unit lower): through the
        work's handle in host pointer mode (free inside :func:`factorize_cupy`'s
        entry)."""
        blas = self.work.blas
        with blas:
            blas.trsm_unit_lower(M, D, b)


class _GeqrfPanel:
    """A panel by cuSOLVER ``geqrf`` on a column-major copy; ``Vᵀ`` (b × rows) into ``Vt``."""

    def __init__(self, cp, blas, dt, rmax, nb):
        self.cp, self.blas = cp, blas
        self.P = cp.empty(rmax * nb, dtype=dt)              # panel, column-major
        self.info = cp.empty(1, dtype=np.int32)
        self.lwork = int(blas.geqrf_size(blas.hs, rmax, nb, self.P.data.ptr, rmax))
        self.work = cp.empty(max(self.lwork, 1), dtype=dt)

    def __call__(self, F, j, rows, b, tau, Vt):
        blas = self.blas
        Pc = self.P[:b * rows].reshape(b, rows)             # = column-major rows × b
        ops.copy_into(Pc, F[j:j + rows, j:j + b].T)
        with blas:
            blas.geqrf(blas.hs, rows, b, Pc.data.ptr, rows, tau.data.ptr,
                       self.work.data.ptr, self.lwork, self.info.data.ptr)
        ops.copy_into(F[j:j + rows, j:j + b], Pc.T)
        ops.unit_triangle(Pc, lower=False, out=Vt)          # Vᵀ (b × rows), unit diagonal


def _panel_by_kernel(work, kern, ws, Tq, F, j, rows, b, tau, Vt):
    """A panel ``F[j:j+rows, j:j+b]`` by sub-panels of ``PANEL_WIDTH`` columns, one
    launch each, the later columns of the panel updated per sub-panel by three
    GEMMs (as :func:`factorize_blocked_numpy`). Fills ``tau[:b]`` and ``Vt``
    (``Vᵀ``, b × rows, C-contiguous and zeroed: V column-major, leading
    dimension ``rows``)."""
    dt = np.dtype(F.dtype)
    isz = dt.itemsize
    fn = F.shape[1]
    base = F.data.ptr
    blas = work.blas
    W, W2 = work.W.data.ptr, work.W2.data.ptr
    for q in range(0, b, PANEL_WIDTH):
        w = min(PANEL_WIDTH, b - q)
        mi = rows - q
        Vq = Vt.data.ptr + (q * rows + q) * isz
        kern.launch(base + ((j + q) * fn + j + q) * isz, fn, mi, w, Vq, rows,
                    tau.data.ptr + q * isz, Tq.data.ptr, ws)
        nci = b - q - w
        if nci <= 0:
            continue
        C = base + ((j + q) * fn + j + q + w) * isz         # Cᵀ: nci × mi, ld fn
        with blas:
            blas.mm("N", "N", nci, w, mi, blas.one, C, fn, Vq, rows, blas.zero, W, nci)
            blas.mm("N", "T", nci, w, w, blas.one, W, nci, Tq.data.ptr, PANEL_WIDTH,
                    blas.zero, W2, nci)
            blas.mm("N", "T", nci, mi, w, blas.mone, W2, nci, Vq, rows, blas.one, C, fn)
