"""The CPU as one device of the tiled QR.

scipy.linalg.lapack's geqrt/tpqrt/gemqrt/tpmqrt hold the GIL, so the CPU is
one device whose parallelism is the threaded BLAS inside each tile kernel.
Its tasks run in order on one worker thread, so the
manager thread can keep the GPUs' streams fed meanwhile (NumPy's BLAS calls
release the GIL).
"""

from __future__ import annotations

import concurrent.futures
from typing import Sequence

import numpy as np

from .._gpu import import_cupy
from . import _ops as ops
from ._runtime import Layout, Pending

__all__ = ["HostDevice", "DEFAULT_CPU_TILE", "DEFAULT_IB"]

#: Default tile size of a CPU-only factorization.
DEFAULT_CPU_TILE = 256
#: LAPACK inner block size of the CPU's T factors.
DEFAULT_IB = 32


class HostDevice:
    """The host CPU (or a stand-in built on NumPy, for tests).

    Parameters
    ----------
    name : str
        ``'cpu'``.
    panel_kind : {'tiles', 'wy'}
        How this device factorizes a tile column when it is the main device:
        the paper's tile kernels (GEQRT + TSQRT, default) or one Householder
        QR with a compact-WY reflector (the GPU's form, to test it on NumPy).
    ib : int
        Inner block size for GEQRT/TSQRT.
    threaded : bool
        Run tasks on a worker thread (True) or at once in the caller.
    panel_leaf : int
        Leaf width of the recursive compact-WY panel (``panel_kind='wy'``
        only; 0: one Householder QR of the whole column).
    """

    is_gpu = False

    def __init__(self, name: str = "cpu", panel_kind: str = "tiles",
                 ib: int = DEFAULT_IB, threaded: bool = True,
                 panel_leaf: int = 0):
        if panel_kind not in ("tiles", "wy"):
            raise ValueError(f"panel_kind must be 'tiles' or 'wy', got {panel_kind!r}")
        self.name = name
        self.panel_kind = panel_kind
        self.ib = int(ib)
        self.panel_leaf = int(panel_leaf)
        self._pool = (concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"scipy_gpuqr-{name}")
            if threaded else None)
        self._futures = []
        self.A = None
        self.offsets = {}
        self.layout = None

    # -- task plumbing -------------------------------------------------
    def _submit(self, fn, *args) -> Pending:
        if self._pool is None:
            return Pending(value=fn(*args))
        fut = self._pool.submit(fn, *args)
        self._futures.append(fut)
        return Pending(future=fut)

    @staticmethod
    def _resolve(p: Pending):
        return p.wait_host()

    # -- data ------------------------------------------------------------
    def load(self, a, layout: Layout, blocks: Sequence[int]) -> None:
        """Take a copy of the column tiles ``blocks`` of ``a`` (NumPy or CuPy)."""
        self.layout = layout
        self.offsets = {}
        if not blocks:
            self.A = np.zeros((layout.m, 0), dtype=layout.dtype, order="F")
            return
        cols = []
        off = 0
        for j in blocks:
            c0, c1 = layout.cols(j)
            self.offsets[j] = (off, off + c1 - c0)
            off += c1 - c0
            cols.append(np.arange(c0, c1))
        idx = np.concatenate(cols)
        if isinstance(a, np.ndarray):
            self.A = np.asfortranarray(a[:, idx])
        else:  # CuPy input: one device-to-host copy of the owned columns
            cupy = import_cupy()
            with cupy.cuda.Device(a.device.id):
                self.A = np.asfortranarray(cupy.asnumpy(a[:, cupy.asarray(idx)]))

    def _span(self, blocks):
        s = self.offsets[blocks[0]][0]
        e = self.offsets[blocks[-1]][1]
        return s, e

    def column(self, j: int, k0: int) -> Pending:
        s, e = self.offsets[j]
        return self._submit(lambda: self.A[k0:, s:e])

    def block_rows(self, j: int, r0: int, r1: int) -> Pending:
        s, e = self.offsets[j]
        return self._submit(lambda: self.A[r0:r1, s:e])

    # -- tile operations -----------------------------------------------
    def factor(self, col: Pending, k0: int) -> Pending:
        tile = self.layout.tile

        def task():
            c = self._resolve(col)
            if self.panel_kind == "tiles":
                return ops.factor_tiles(c, k0, tile, self.ib)
            return ops.factor_wy(np, np.asarray(c), k0,
                                 leaf=self.panel_leaf)
        return self._submit(task)

    def update(self, panel: Pending, k0: int, blocks: Sequence[int],
               urgent: bool = False) -> None:
        s, e = self._span(list(blocks))

        def task():
            p = self._resolve(panel)
            C = self.A[k0:, s:e]
            out = ops.apply_panel(p, C, "T")
            if out is not C:
                self.A[k0:, s:e] = out
        self._submit(task)

    def update_column(self, panel: Pending, col: Pending) -> Pending:
        """Apply ``panel`` to a copy of a received look-ahead column."""
        def task():
            p = self._resolve(panel)
            C = np.array(self._resolve(col), order="F")   # received: read-only
            return ops.apply_panel(p, C, "T")
        return self._submit(task)

    def rows_of(self, pending: Pending, r0: int, r1=None) -> Pending:
        """Rows ``r0:r1`` of a value of this device."""
        return self._submit(lambda: self._resolve(pending)[r0:r1])

    def panel_r(self, panel: Pending) -> Pending:
        return self._submit(lambda: self._resolve(panel).R)

    def form_q(self, panels: Sequence[Pending], layout: Layout) -> Pending:
        kq = min(layout.m, layout.n)

        def task():
            ps = [self._resolve(p) for p in panels]
            dtype = layout.dtype
            return ops.explicit_q(lambda p, C: ops.apply_panel(p, C, "N"),
                                  layout.m, kq, dtype, np, layout.tile, ps)
        return self._submit(task)

    def receive(self, pending: Pending, src) -> Pending:
        """A value from another device, usable by this device's tasks."""
        if not src.is_gpu:
            return pending       # host memory is shared; values are read-only
        return src.to_host(pending)

    def assemble_r(self, layout: Layout, pieces) -> Pending:
        """``R`` (m x n) from ``(column tile, first row, Pending block)``."""
        dtype = layout.dtype

        def task():
            R = np.zeros((layout.m, layout.n), dtype=dtype)
            for j, r0, p in pieces:
                c0, _ = layout.cols(j)
                blk = np.asarray(self._resolve(p))
                r1 = min(layout.m, r0 + blk.shape[0])
                R[r0:r1, c0:c0 + blk.shape[1]] = blk[:r1 - r0]
            return np.triu(R)
        return self._submit(task)

    def finish(self) -> None:
        """Wait for every task; re-raise the first failure."""
        futures, self._futures = self._futures, []
        for fut in futures:
            fut.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
