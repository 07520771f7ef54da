"""Triangular solves with R front by front, from the front pools of a GPU factorization.

R of a multifrontal QR is a stack of dense row blocks: front ``f`` owns the
pivot rows ``cols_f[:rk]`` and its block is the first ``rk`` rows of the
factorized front, ``[U_f | S_f]`` over the columns ``cols_f`` (U upper
triangular, the entries below its diagonal hold Householder data and are
never read). The GPU engine leaves these blocks in the front pools, so the
solve reads them where they are instead of a sparse copy of R:

* ``R y = c`` (back substitution): fronts in reverse postorder (ancestors
  first), ``y[piv] = U⁻¹ (c[piv] - S y[cols_f[rk:]])``;
* ``Rᵀ y = c`` (forward): fronts in postorder, ``y[piv] = U⁻ᵀ c[piv]``, then
  ``c[cols_f[rk:]] -= Sᵀ y[piv]``;

with the singleton block ``R1 = [R11 R12]`` (rows of A that are rows of R,
taken from R's sparse copy) last (first for ``Rᵀ``).

On the device, ``kernels/sparse_qr/rsolve.cu`` solves one tree level of a
stage per launch, one thread block per front and right-hand-side column:
``R``'s levels by depth from the root (a front reads only its ancestors'
values), ``Rᵀ``'s by height from the leaves (a front pushes into its
ancestors' columns with atomic adds); fronts of :data:`BIG_FRONT_ROWS` rows
of R or more go through cuBLAS within their level. With many right-hand-side
columns (:data:`WIDE_MIN_COLUMNS`: a rank decision's blocks) a level's fronts
of at most ``RSOLVE_WIDE_ROWS`` rows of R go to the same file's wide kernel
instead, one thread per column (R's values read once per block of columns,
not once per column). Stages are contiguous
ranges of the postorder, so ``Rᵀ`` runs them first to last and ``R`` last to
first. A stage whose pool left the device (staged factorizations) is solved
from a compact copy of its rows of R, gathered once into pinned host memory
and uploaded per solve: a fraction of the pool, at the link's speed. A host
front too large to upload whole goes up in row panels of its R
(:meth:`FrontTriangular.streamed_step`). NumPy on the host (CI) takes one
dense triangular solve and one matrix product per front (SciPy); the loop
pays one call overhead per front, which is why the level kernels exist.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.sparse as sp
from scipy.linalg import solve_triangular as host_solve_triangular
from scipy.sparse.linalg import spsolve_triangular as host_spsolve_triangular

from ..._kernels import load_module
from ..._validate import device_csr
from ..memory import available_bytes, make_room
from ..pool_map import part_elements
from . import array_ops as ops
from . import solve_kernels as av
from .peer_rows import PeerRows
from .reflector_upload import SMALL_FRONT, packed_size_bound

__all__ = ["FrontTriangular", "TriangularPlan", "SPLIT_SOLVE", "split_stages", "stage_devices"]

#: Right-hand-side columns from which a level's fronts of at most
#: :data:`~.solve_kernels.RSOLVE_WIDE_ROWS` rows of R are solved by the wide kernel
#: (``rsolve_wide``: one thread per column, the front's pivots in registers)
#: rather than by one thread block per front and column; 0: never.
WIDE_MIN_COLUMNS = 64

#: ``R⁻¹`` of a multi-device factorization solves each stage whose pool lies on
#: another GPU on that GPU (:func:`split_stages`), the columns its fronts read
#: lent to it and its pivots taken back; off: every stage on the factorization's
#: GPU, reading the other GPUs' pools over the link.
SPLIT_SOLVE = True


class TriangularPlan:
    """What :class:`FrontTriangular` reads of a factorization that R's values do
    not change: the fronts with rows of R and where each lies (stage, offset),
    their columns, the tree's levels and each stage's level tables. A pattern's
    factorizations share one (kept with its schedule, under where each front
    lies: :func:`.solve.triangular_plan_of`), so a repeated solve of a known pattern
    does not walk its fronts again in Python. Read-only once made; its level
    tables are added as the first solve of each stage asks for them.

    Parameters
    ----------
    fs : Fronts
        The analysis' fronts.
    front_loc : sequence
        ``(stage, offset)`` of each front in its stage's pool (the
        factorization's ``_front_loc``).
    """

    def __init__(self, fs, front_loc):
        # (the tree's levels are made here too: a plan never holds the analysis)
        rk = np.asarray(fs.frank, dtype=np.int64)
        ids = np.flatnonzero(rk > 0)
        loc = np.array([front_loc[f] for f in ids.tolist()], dtype=np.int64).reshape(-1, 2)
        ptr = np.asarray(fs.col_ptr, dtype=np.int64)
        table = np.column_stack([loc, np.asarray(fs.fm, dtype=np.int64)[ids],
                                 np.asarray(fs.fn, dtype=np.int64)[ids], rk[ids], ptr[ids],
                                 ptr[ids + 1]]) if len(ids) else np.zeros((0, 7), np.int64)
        #: (stage, offset, fm, fn, rk, first col, end col) per front with rows of R
        self.fronts = [tuple(r) for r in table.tolist()]
        #: the front of each entry of ``fronts``
        self.front_ids = ids.tolist()
        self.cols = np.array(fs.cols, dtype=np.int64)     # its own: made read-only
        self.cols.flags.writeable = False
        #: each front's depth from its root and height from its leaves
        self.depth, self.height = _tree_levels(fs)
        #: stage -> indices into ``fronts`` of its fronts (postorder)
        self.by_stage = {}
        for i, sid in enumerate(table[:, 0].tolist()):
            self.by_stage.setdefault(sid, []).append(i)
        self._tables = {}

    def level_tables(self, key, members, offsets, *, wide: bool = False) -> dict:
        """:class:`_LevelKernel`'s host tables of one stage's ``members`` at
        ``offsets``, made once per ``key`` (the stage and where its rows are read:
        its pool, or a compact copy of them) and :data:`BIG_FRONT_ROWS` (read
        now: a changed threshold makes new tables); ``wide``: the same levels
        split for the wide kernel (:func:`_wide_tables`)."""
        big_rows = int(BIG_FRONT_ROWS)
        full = (key, big_rows)
        hit = self._tables.get(full)
        if hit is None:
            hit = self._tables[full] = _level_tables(self, members, offsets, big_rows)
        if not wide:
            return hit
        rows = int(av.RSOLVE_WIDE_ROWS)
        split = self._tables.get(full + ("wide", rows))
        if split is None:
            split = self._tables[full + ("wide", rows)] = _wide_tables(hit, rows)
        return split

    def stage_split(self, stages, where: dict, home: int, n: int):
        """:func:`split_stages` of ``stages`` over the GPUs in ``where``, made once
        per placement (a pattern's factorizations place their stages alike)."""
        key = ("split", tuple(sorted(where.items())), int(home), int(n),
               tuple(sid for sid, _ in stages))
        if key not in self._tables:
            self._tables[key] = split_stages(self, stages, where, home, n)
        return self._tables[key]


class FrontTriangular:
    """``R⁻¹ C`` and ``R⁻ᵀ C`` for a full-rank factorization with dense front blocks.

    Parameters
    ----------
    qr : GpuQR
        The factorization (``analysis``, ``_front_loc``, R).
    pools : callable
        ``pools(stage) -> array``: the stage's front pool (CuPy or NumPy, as ``xp``);
        its ``before_upload()``, where it has one, is called before rows of a
        host pool go up (:func:`.solve.drop_first`).
    xp : module
        ``cupy`` or ``numpy``.
    """

    def __init__(self, qr, pools, xp, plan: "TriangularPlan | None" = None):
        self.xp = xp
        self.pools = pools
        an = qr.analysis
        fs = an.fronts
        self.n = int(qr.R.shape[1])
        plan = TriangularPlan(fs, qr._front_loc) if plan is None else plan
        self.plan = plan
        self.fronts = plan.fronts           # (stage, offset, fm, fn, rk, first col, end col)
        self.front_ids = plan.front_ids     # the front of each entry
        self.cols = xp.asarray(plan.cols)
        # the level kernels need CuPy itself (another array module: the loop)
        self._stages = None
        self._cupy = getattr(xp, "__name__", "") == "cupy"
        self._where, self._home, self._split = {}, None, None
        if self._cupy:
            self._stages = _staged_levels(self, fs, qr)
            self._where, self._home = stage_devices(qr, xp)
        n1 = int(getattr(an, "n1cols", 0))
        self.n1 = n1
        self.R11 = self.R11T = self.R12 = self.R12T = None
        if n1:
            R = sp.csc_array(qr.R)
            e = np.flatnonzero(R.indices < n1)
            rows = R.indices[e].astype(np.int64)
            cols = np.searchsorted(R.indptr, e, side="right") - 1
            R1 = sp.csr_array((R.data[e].astype(np.float64), (rows, cols)), shape=(n1, self.n))
            self.R11 = self._sparse(sp.csr_array(R1[:, :n1]))
            self.R11T = self._sparse(sp.csr_array(R1[:, :n1].T))
            self.R12 = self._sparse(sp.csr_array(R1[:, n1:]))
            self.R12T = self._sparse(sp.csr_array(R1[:, n1:].T))

    def _sparse(self, M):
        M.sort_indices()
        if self.xp is np:
            return M
        return device_csr(M)

    def _tri(self, U, B, *, trans: bool):
        if self.xp is np:
            solve_triangular = host_solve_triangular
        else:
            from cupyx.scipy.linalg import solve_triangular
        if U.dtype != np.float64:
            U = U.astype(np.float64)
        return solve_triangular(U, B, lower=False, trans=1 if trans else 0)

    def _sptri(self, M, B, *, lower: bool):
        if self.xp is np:
            spsolve_triangular = host_spsolve_triangular
        else:
            from cupyx.scipy.sparse.linalg import spsolve_triangular
        return spsolve_triangular(M, B, lower=lower)

    def _blocks(self, off, fn, rk, pool):
        # R's rows are the front's first rk rows (row major: contiguous from its
        # offset); the solvers read U's upper triangle only (Householder data below)
        Fv = pool[off: off + rk * fn].reshape(rk, fn)
        return Fv[:, :rk], Fv[:, rk:].astype(np.float64, copy=False)

    def step(self, i: int, Y, pool, *, trans: bool, off: int | None = None) -> None:
        """Front ``self.fronts[i]`` of the solve, in place on Y (dense solvers).

        ``off``: the front's offset in ``pool`` when that is not its place in
        the stage's pool (a compact copy of R's rows, :class:`_StageRows`).
        """
        if self.xp is not np and isinstance(pool, np.ndarray):
            self.streamed_step(i, Y, pool, trans=trans)
            return
        if self._cupy and Y.flags.c_contiguous and Y.ndim == 2:
            self._device_step(i, Y, pool, trans=trans, off=off)
            return
        sid, foff, fm, fn, rk, a, b = self.fronts[i]
        U, S = self._blocks(foff if off is None else off, fn, rk, pool)
        piv = self.cols[a: a + rk]
        if not trans:
            rhs = Y[piv]
            if fn > rk:
                rhs = rhs - S @ Y[self.cols[a + rk: b]]
            Y[piv] = self._tri(U, rhs, trans=False)
            return
        y = self._tri(U, Y[piv], trans=True)
        Y[piv] = y
        if fn > rk:
            o = self.cols[a + rk: b]
            Y[o] -= S.T @ y

    def _device_step(self, i: int, Y, pool, *, trans: bool, off: int | None) -> None:
        """:meth:`step` on the device with the same operations and layouts as its
        generic path (row gathers, CuPy's matmul on contiguous operands, cuBLAS
        ``trsm`` on column-major copies, as ``cupyx.scipy.linalg.solve_triangular``
        calls it), the gathers, copies and updates by prefetched kernels
        (:mod:`.array_ops`): nothing is compiled on the call's thread."""
        sid, foff, fm, fn, rk, a, b = self.fronts[i]
        o = foff if off is None else off
        Fv = pool[o: o + rk * fn].reshape(rk, fn)
        piv = self.cols[a: a + rk]
        k = int(Y.shape[1])
        if pool.dtype == np.float64:
            # the rows read column-major (leading dimension fn) are Uᵀ, lower: cuBLAS
            # solves with them where they lie (U y = c is Uᵀ's transposed solve),
            # no transposing copy of U per solve (the root front's is hundreds of MB)
            Uf, ld, lower, op_t = pool[o: o + rk * fn], fn, True, not trans
        else:
            Uf, ld, lower, op_t = (ops.contiguous_copy(Fv[:, :rk], np.float64, order="F"),
                                   rk, False, trans)
        Bf = ops.take_rows(Y, piv, order="F")               # Y[piv], column-major
        if fn > rk:
            o_cols = self.cols[a + rk: b]
            if pool.dtype == np.float64:
                S = Fv[:, rk:]
            else:                                           # _blocks' float64 copy
                S = ops.contiguous_copy(Fv[:, rk:], np.float64)
        if not trans:
            if fn > rk:
                prod = ops.matmul_operand(S, left=True) @ ops.take_rows(Y, o_cols)
                ops.subtract_into(Bf, prod)
            ops.trsm_left(Uf, ld, Bf, rk, rk, k, lower=lower, trans=op_t, unit=False)
            ops.put_rows(Y, piv, Bf)
            return
        ops.trsm_left(Uf, ld, Bf, rk, rk, k, lower=lower, trans=op_t, unit=False)
        ops.put_rows(Y, piv, Bf)
        if fn > rk:
            ops.put_rows(Y, o_cols, ops.matmul_operand(S.T, left=True) @ Bf, subtract=True)

    def streamed_step(self, i: int, Y, pool, *, trans: bool) -> None:
        """:meth:`step` on the device for a front whose rows of R stay on the host
        (``pool``, NumPy, best pinned; a host front too large for the device).

        Its rows go up a panel at a time (:func:`_panel_rows`); the panel's
        diagonal block solves (cuBLAS ``trsm``) and its right part updates the
        rest (one product per panel). ``R``'s panels run from the last (back
        substitution: a panel reads the values solved below it), ``Rᵀ``'s from
        the first (each pushes into the columns after it), so the device holds
        one panel of the front, never the front: the solve runs at the link's
        speed where a host solve would copy the whole block per call.
        """
        import cupy as cp
        sid, off, fm, fn, rk, a, b = self.fronts[i]
        F = pool[off: off + rk * fn].reshape(rk, fn)
        k = int(Y.shape[1])
        stream = cp.cuda.get_current_stream()
        panel_rows = _panel_rows(fn, rk, available_bytes(cp).available)
        starts = list(range(0, rk, panel_rows))
        for r0 in (starts if trans else reversed(starts)):
            r1 = min(rk, r0 + panel_rows)
            h = r1 - r0
            up = cp.empty((h, fn - r0), dtype=F.dtype)
            ops.upload_block(F, r0, r1, r0, fn, up, stream)
            P = up if up.dtype == np.float64 else ops.contiguous_copy(up, np.float64)
            Uf = ops.contiguous_copy(P[:, :h], order="F")
            piv = self.cols[a + r0: a + r1]
            Bf = ops.take_rows(Y, piv, order="F")
            rest = self.cols[a + r1: b]
            if not trans:
                if r1 < fn:
                    ops.subtract_into(Bf, ops.matmul_operand(P[:, h:], left=True)
                                      @ ops.take_rows(Y, rest))
                ops.trsm_left(Uf, h, Bf, h, h, k, lower=False, trans=False, unit=False)
                ops.put_rows(Y, piv, Bf)
                continue
            ops.trsm_left(Uf, h, Bf, h, h, k, lower=False, trans=True, unit=False)
            ops.put_rows(Y, piv, Bf)
            if r1 < fn:
                ops.put_rows(Y, rest, ops.matmul_operand(P[:, h:].T, left=True) @ Bf,
                             subtract=True)

    def _loop(self, Y, trans: bool) -> None:
        sid_cur, pool = None, None
        order = range(len(self.fronts)) if trans else range(len(self.fronts) - 1, -1, -1)
        for i in order:
            sid = self.fronts[i][0]
            if sid != sid_cur:
                pool = None             # the previous stage's upload goes first
                pool, sid_cur = self.pools(sid), sid
            self.step(i, Y, pool, trans=trans)

    def _fresh(self, C):
        """A C-ordered float64 copy of C (on the device by memcpy or a prefetched
        kernel: no CuPy copy kernel compiled on the call's thread)."""
        if not self._cupy:
            return self.xp.array(C, dtype=np.float64, order="C", copy=True)
        return ops.fresh_float64(self.xp.asarray(C))

    @property
    def stages(self):
        """Per stage, in postorder, ``(stage, members, level kernel, rows)`` as the
        device solves run them (:func:`_staged_levels`; a kernel's ``off_of``
        places each member's rows in the stage's pool or uploaded rows, ``rows``
        uploads them); None on the NumPy layer."""
        return self._stages

    def release_kept(self) -> bool:
        """Drop the stages' rows of R kept on the device (they are uploaded per
        solve from now on) and a first pack of ``Q`` that no replay read yet
        (``pools.drop_first``, where the pools' callable has one); whether any
        were kept. For a solve that ran out of device memory beside them."""
        drop = getattr(self.pools, "drop_first", None)
        freed = bool(drop is not None and drop())
        for _, _, _, rows in self._stages or ():
            if rows is not None:
                rows._keep.close()
                freed = freed or rows._kept is not None
                rows._kept = None
        return freed

    def upper(self, C):
        """``R⁻¹ C``; C of shape (n, k), float64 (not modified)."""
        Y = self._fresh(C)
        split = self._lanes() if self._stages is not None else None
        if split is not None:
            segments, ops, lanes = split
            run_split(segments, ops, functools.partial(_home_stage, self, self._stages),
                      lanes, Y)
        elif self._stages is not None:
            _run_stages(self, self._stages, Y, trans=False)
        else:
            self._loop(Y, False)
        if self.n1:
            n1 = self.n1
            rhs = Y[:n1] - self.R12 @ Y[n1:]
            Y[:n1] = self._sptri(self.R11, rhs, lower=False)
        return Y

    def _lanes(self):
        """``(segments, ops, lanes)`` of ``R⁻¹`` over the GPUs holding its stages
        (:data:`SPLIT_SOLVE`, :func:`split_stages`; made at the first solve), or
        None where every stage is solved on the factorization's GPU."""
        if not SPLIT_SOLVE or not self._where:
            return None
        if self._split is None:
            stages, eligible = [], dict(self._where)
            for sid, members, kern, rows in self._stages:
                stages.append((sid, members))
                if kern is None or rows is not None:
                    eligible.pop(sid, None)
            made = self.plan.stage_split(stages, eligible, self._home, self.n)
            if made is None:
                self._split = False
            else:
                segments, ops = made
                lanes = {}
                for d in sorted({seg[0] for seg in segments}):
                    mine = {t: seg for t, seg in enumerate(segments) if seg[0] == d}
                    lanes[d] = _SolveLane(self, d, self._home, mine)
                self._split = (segments, ops, lanes)
        return self._split or None

    def upper_transposed(self, C):
        """``R⁻ᵀ C``; C of shape (n, k), float64 (not modified)."""
        Y = self._fresh(C)
        if self.n1:
            n1 = self.n1
            Y[:n1] = self._sptri(self.R11T, Y[:n1], lower=True)
            Y[n1:] -= self.R12T @ Y[:n1]
        if self._stages is not None:
            _run_stages(self, self._stages, Y, trans=True)
        else:
            self._loop(Y, True)
        return Y


#: Share of the device memory available at a streamed solve's start
#: (:meth:`FrontTriangular.streamed_step`) that one panel of a host front's rows of
#: R may take, with its float64 and column-major copies (three panel sizes).
STREAM_SHARE = 0.25

#: The panel a streamed solve uploads when the available memory is not known.
STREAM_DEFAULT_BYTES = 256 << 20

#: The fewest rows of R per streamed panel (smaller panels cost launches, not memory).
STREAM_MIN_ROWS = 32


def _panel_rows(fn: int, rk: int, avail) -> int:
    """Rows of R per uploaded panel of a host front of ``fn`` columns and ``rk``
    rows of R, given ``avail`` bytes of device memory (None: unknown)."""
    budget = STREAM_DEFAULT_BYTES if avail is None else STREAM_SHARE * avail
    rows = int(budget // (3 * 8 * max(fn, 1)))
    return max(1, min(rk, max(STREAM_MIN_ROWS, rows)))


#: Fronts with at least this many rows of R are solved by cuBLAS (one thread block
#: walking thousands of rows one by one is much slower than a cuBLAS solve).
BIG_FRONT_ROWS = 512


def _tree_levels(fs) -> tuple[np.ndarray, np.ndarray]:
    """Each front's depth from its root and height from its leaves (postorder fronts)."""
    nf = fs.nfronts
    parent = np.asarray(fs.parent, dtype=np.int64)
    depth = np.zeros(nf, dtype=np.int64)
    height = np.zeros(nf, dtype=np.int64)
    for f in range(nf - 1, -1, -1):         # postorder: parents after children
        if parent[f] >= 0:
            depth[f] = depth[parent[f]] + 1
    for f in range(nf):
        if parent[f] >= 0:
            height[parent[f]] = max(height[parent[f]], height[f] + 1)
    return depth, height


def _level_tables(plan, members, offsets, big_rows: int) -> dict:
    """The level tables of one stage (see :class:`_LevelKernel`): per direction
    (``trans``) the kernel's front descriptors ``(offset, fn, rk, first col)`` in
    level order, the levels' pointers and each level's big fronts (``big_rows``
    rows of R or more); ``off_of``, each member's offset."""
    depth, height = plan.depth, plan.height
    members = np.asarray(members, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    table = np.asarray(plan.fronts, dtype=np.int64).reshape(-1, 7)[members]
    fr = np.column_stack([offsets, table[:, 3], table[:, 4], table[:, 5]]).reshape(-1, 4)
    which = np.asarray(plan.front_ids, dtype=np.int64)[members]
    off_of = dict(zip(members.tolist(), offsets.tolist()))
    big = fr[:, 2] >= big_rows
    levels = {}
    for trans, key in ((False, depth[which]), (True, height[which])):
        key = key - (int(key.min()) if len(key) else 0)
        nlev = int(key.max()) + 1 if len(key) else 0
        small = np.flatnonzero(~big)
        order = small[np.argsort(key[small], kind="stable")]
        cnt = np.bincount(key[small], minlength=nlev)
        ptr = np.concatenate(([0], np.cumsum(cnt))).astype(np.int64)
        desc = np.ascontiguousarray(fr[order]).reshape(-1, 4)
        desc.flags.writeable = False
        bigs = [[] for _ in range(nlev)]
        for j in np.flatnonzero(big).tolist():
            bigs[int(key[j])].append(int(members[j]))
        levels[trans] = (desc, ptr.tolist(), bigs)
    return {"levels": levels, "off_of": off_of}


def _wide_tables(tables: dict, rows: int) -> dict:
    """:func:`_level_tables`' levels for many right-hand-side columns: per direction,
    each level's fronts of at most ``rows`` rows of R (the wide kernel's) and the
    others (the per-column kernel's), each ``(descriptors, level pointers)`` in
    the levels' order, and the big fronts as they were."""
    out = {}
    for trans, (desc, ptr, bigs) in tables["levels"].items():
        ptr = np.asarray(ptr, dtype=np.int64)
        level = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
        few = np.asarray(desc, dtype=np.int64).reshape(-1, 4)[:, 2] <= rows
        parts = []
        for take in (few, ~few):
            cnt = np.bincount(level[take], minlength=len(ptr) - 1)
            part = np.ascontiguousarray(np.asarray(desc).reshape(-1, 4)[take])
            part.flags.writeable = False
            parts.append((part, np.concatenate(([0], np.cumsum(cnt))).astype(np.int64).tolist()))
        out[trans] = (parts[0], parts[1], bigs)
    return out


class _LevelKernel:
    """The fronts of one stage as levels of ``kernels/sparse_qr/rsolve.cu``.

    ``members``: indices into ``ft.fronts`` (one stage's fronts, a contiguous
    range of the postorder); ``offsets``: where each member's rows lie in the
    array :meth:`run` is given (the stage's pool, or a compact copy of its
    rows of R). Levels by depth for ``R`` and by height for ``Rᵀ`` keep the
    order within the stage; the stages themselves run in postorder for
    ``Rᵀ`` and in reverse for ``R`` (:func:`_run_stages`), since a front only
    reads its ancestors' values (``R``) or pushes into its ancestors' columns
    (``Rᵀ``). Fronts of :data:`BIG_FRONT_ROWS` rows of R or more are solved in
    their level by :meth:`FrontTriangular.step` (cuBLAS) instead.
    """

    def __init__(self, ft, key, members, offsets, dtype):
        import cupy as cp
        self.cp, self.cols = cp, ft.cols
        tables = ft.plan.level_tables(key, members, offsets)
        self.off_of = tables["off_of"]
        self.levels = {trans: (cp.asarray(desc), ptr, bigs)
                       for trans, (desc, ptr, bigs) in tables["levels"].items()}
        self.dtype = dtype
        self._stage = (key, members, offsets)   # for the wide tables, made at their first use
        self._wide = None
        ctype = "double" if np.dtype(dtype) == np.float64 else "float"
        mod = load_module(av.RSOLVE_FILE, av.KERNEL_VARIANTS[av.RSOLVE_FILE])
        self.kern = {tr: mod.get_function(av.rsolve_name(ctype, tr)) for tr in (False, True)}
        self.kern_wide = {tr: mod.get_function(av.rsolve_wide_name(ctype, tr))
                          for tr in (False, True)}
        self.threads = av.RSOLVE_THREADS

    def run(self, ft, Y, pool, *, trans: bool) -> None:
        """One launch per level, in place on Y (n × k, C order, float64); the
        big fronts by ``ft`` (:class:`FrontTriangular`, which holds this kernel:
        passed, not kept, so that the two make no reference cycle). From
        :data:`WIDE_MIN_COLUMNS` columns on, :meth:`run_wide`."""
        k = Y.shape[1]
        if WIDE_MIN_COLUMNS and k >= WIDE_MIN_COLUMNS:
            self.run_wide(ft, Y, pool, trans=trans)
            return
        desc, ptr, bigs = self.levels[trans]
        for lv in range(len(ptr) - 1):
            a, b = int(ptr[lv]), int(ptr[lv + 1])
            if b > a and k:
                self.kern[trans]((b - a, k), (self.threads,),
                                 (desc[a:], pool, self.cols, Y, np.int32(k)))
            for i in bigs[lv]:
                ft.step(i, Y, pool, trans=trans, off=self.off_of[i])

    def run_wide(self, ft, Y, pool, *, trans: bool) -> None:
        """:meth:`run` for many columns: per level, its fronts of at most
        ``RSOLVE_WIDE_ROWS`` rows of R by the wide kernel (one thread per column,
        ``RSOLVE_WIDE_THREADS`` columns a block), the others by the per-column
        kernel, then the big fronts (the fronts of a level are independent: any
        order within it)."""
        if self._wide is None:
            cp = self.cp
            split = ft.plan.level_tables(*self._stage, wide=True)
            self._wide = {tr: ((cp.asarray(w[0]), w[1]), (cp.asarray(p[0]), p[1]), bigs)
                          for tr, (w, p, bigs) in split.items()}
        (wdesc, wptr), (pdesc, pptr), bigs = self._wide[trans]
        k = int(Y.shape[1])
        blocks = -(-k // av.RSOLVE_WIDE_THREADS)
        for lv in range(len(bigs)):
            a, b = wptr[lv], wptr[lv + 1]
            if b > a and k:
                self.kern_wide[trans]((b - a, blocks), (av.RSOLVE_WIDE_THREADS,),
                                      (wdesc[a:], pool, self.cols, Y, np.int32(k)))
            a, b = pptr[lv], pptr[lv + 1]
            if b > a and k:
                self.kern[trans]((b - a, k), (self.threads,),
                                 (pdesc[a:], pool, self.cols, Y, np.int32(k)))
            for i in bigs[lv]:
                ft.step(i, Y, pool, trans=trans, off=self.off_of[i])


#: Share of the device memory available when the solves are set up
#: (:func:`~scipy_gpuqr._engine.memory.available_bytes`) that the stages' uploaded
#: rows of R may keep between solves, all stages together: the rest holds the
#: solves' blocks (a rank decision's q × d blocks, a host front's streamed
#: panels). ``Q``'s replay uploads an earlier stage's reflectors packed
#: (:mod:`.reflector_upload`); the kept rows leave room for the largest such
#: upload (:func:`replay_upload_bytes`), and the replay drops them only when it
#: still runs out of memory (:func:`.solve._make_room`).
KEEP_SHARE = 0.6


def keep_bytes(avail, reserve: int = 0) -> int:
    """Bytes the stages' uploaded rows of R may keep on the device, given
    ``avail`` bytes available (None: unknown, nothing kept) of which ``reserve``
    stay free for ``Q``'s replay uploads."""
    if avail is None:
        return 0
    return max(0, min(int(KEEP_SHARE * avail), int(avail) - int(reserve)))


def replay_upload_bytes(qr) -> int:
    """Device bytes ``Q``'s replay uploads at once for a stage whose pool left the
    device: the largest bound of a stage's packed reflector pieces
    (:func:`~.reflector_upload.packed_size_bound`, dense fronts whole) over the
    stages whose pool is on the host, host stages (applied on the host) aside
    (a mapped stage read in parts: its largest part's,
    :func:`~scipy_gpuqr._engine.pool_map.part_elements`); 0 when there is none."""
    sched = getattr(qr, "schedule", None)
    if sched is None or not getattr(sched, "stages", None):
        return 0
    fs = qr.analysis.fronts
    if getattr(qr, "_replay_by_launch", False):     # one stage read in parts of its launches
        isz = np.dtype(getattr(qr._device, "dtype", np.float64)).itemsize
        return max(part_elements(fs, sched.stages[0], list(qr._launch_base), sched.tile,
                                 SMALL_FRONT), default=0) * isz
    skip = set(getattr(qr, "_host_stages", {}) or {}) | set(getattr(qr, "_stage_pools", {}) or {})
    isz = np.dtype(getattr(qr._device, "dtype", np.float64)).itemsize
    most = 0
    for sid, st in enumerate(sched.stages):
        if sid in skip:
            continue
        a, b = st.fronts
        f = np.arange(a, b + 1)
        f = f[np.asarray(st.foff)[f] >= 0]
        whole = np.isin(f, np.asarray(list(st.dense), dtype=np.int64))
        most = max(most, packed_size_bound(np.asarray(st.foff)[f], fs.fm[f], fs.fn[f], whole,
                                           sched.tile))
    return most * isz


class _KeepBudget:
    """Bytes the stages' uploaded rows of R may still keep on the device (one
    budget shared by every stage of a factorization's solves)."""

    def __init__(self, nbytes: int):
        self.left = int(nbytes)

    def take(self, nbytes: int) -> bool:
        if nbytes > self.left:
            return False
        self.left -= int(nbytes)
        return True

    def close(self) -> None:
        """Nothing more is kept."""
        self.left = 0


#: Elements of a stage's pool between two fronts' rows of R that go up with them
#: (one copy instead of two: a copy call costs about what some tens of KB take on
#: the link); the compact array then holds that gap too.
ROWS_GAP = 4096

#: A front's rows of R with at least this many rows go up as their upper
#: trapezoid only (:func:`_row_copies`): every reader of the uploaded rows (the
#: solves' ``trsm`` and level kernels, :mod:`.rproduct`'s products) reads a
#: front's row ``i`` from column ``i`` on, the entries left of its diagonal being
#: Householder data, so a square block of R (a large root front's) sends about
#: half its bytes over the link. Their place in the compact array is kept (the
#: entries left of the diagonal are not written there).
TRAPEZOID_MIN_ROWS = 512

#: Rows per copy of a trapezoid upload (:data:`TRAPEZOID_MIN_ROWS`): each copy sends
#: its rows from its first row's diagonal on (a few entries left of the diagonal
#: in its lower rows go too); more rows per copy, fewer copies and more bytes.
TRAPEZOID_BLOCK = 256


def _row_runs(segments) -> tuple:
    """``(runs, offsets, total)`` of a stage's rows of R: ``segments`` ``(pool
    offset, elements)`` per front; ``runs`` ``(pool offset, elements, at)``, one
    copy each, adjacent segments merged across gaps of at most :data:`ROWS_GAP`;
    ``offsets`` each segment's place in the compact array of ``total`` elements."""
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 2)
    offsets = np.zeros(len(seg), dtype=np.int64)
    runs, at = [], 0
    order = np.argsort(seg[:, 0], kind="stable")
    start = end = None
    for i in order.tolist():
        off, n = int(seg[i, 0]), int(seg[i, 1])
        if start is not None and 0 <= off - end <= ROWS_GAP:
            end = max(end, off + n)
        else:
            if start is not None:
                runs.append((start, end - start, at))
                at += end - start
            start, end = off, off + n
        offsets[i] = at + off - start
    if start is not None:
        runs.append((start, end - start, at))
        at += end - start
    return runs, offsets, at


def _row_copies(runs, segments, offsets, shapes) -> list:
    """The copies that send a stage's rows of R up: ``(pool offset, at, width,
    height)`` in elements, a block of ``height`` rows of ``width`` elements each,
    its rows ``pitch = width`` apart for a plain run (height 1) and a front's row
    length apart for a trapezoid's block (:data:`TRAPEZOID_MIN_ROWS`).

    ``runs``, ``segments`` and ``offsets`` as :func:`_row_runs` made them;
    ``shapes`` ``(fn, rk)`` per segment. A front of :data:`TRAPEZOID_MIN_ROWS`
    rows of R or more (``rk <= fn``) goes up in blocks of
    :data:`TRAPEZOID_BLOCK` rows, each from its first row's diagonal on; the rest
    of its run (fronts before and after it, the gaps between) as plain copies.
    Returns a list of ``(src, dst, width, height, pitch)``.
    """
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 2)
    big = sorted((int(seg[i, 0]), int(offsets[i]), int(fn), int(rk))
                 for i, (fn, rk) in enumerate(shapes)
                 if TRAPEZOID_MIN_ROWS <= rk <= fn and rk * fn == int(seg[i, 1]))
    out = []
    for start, n, at in runs:
        pos, end = start, start + n
        for off, dst, fn, rk in big:
            if not start <= off < end:
                continue
            if off > pos:                       # what lies before the front in the run
                out.append((pos, at + pos - start, off - pos, 1, off - pos))
            for r0 in range(0, rk, TRAPEZOID_BLOCK):
                h = min(TRAPEZOID_BLOCK, rk - r0)
                out.append((off + r0 * fn + r0, dst + r0 * fn + r0, fn - r0, h, fn))
            pos = off + rk * fn
        if end > pos:
            out.append((pos, at + pos - start, end - pos, 1, end - pos))
    return out


class _StageRows:
    """R's rows of one stage's fronts, copied compactly out of its pool on the host.

    A stage whose pool left the device holds R's rows of its fronts (their
    first ``rk`` rows) beside far more Householder data and contribution
    blocks; the solves upload only the rows (:func:`_row_runs`: one copy per
    run of fronts, straight from the host pool, pinned where the factorization
    could have it: DMA at the link's speed, no host copy first) into one compact
    device array. The uploaded rows stay on the device while ``keep`` (a
    :class:`_KeepBudget` shared by the stages) allows: a rank decision solves
    many times, and each solve would otherwise upload R again.
    """

    def __init__(self, ft, members, host_pool, keep):
        self._segments = [(ft.fronts[i][1], ft.fronts[i][4] * ft.fronts[i][3]) for i in members]
        self._runs, self.offsets, self.total = _row_runs(self._segments)
        self._copies = _row_copies(self._runs, self._segments, self.offsets,
                                   [(ft.fronts[i][3], ft.fronts[i][4]) for i in members])
        self._host_pool = np.ascontiguousarray(host_pool)
        self._kept = None
        self._keep = keep
        self.cp = ft.xp
        self._before = getattr(getattr(ft, "pools", None), "before_upload", None)

    def upload(self):
        """The rows on the device (copied on the current stream, or kept from an
        earlier solve; ``pools.before_upload(nbytes)`` called first, where the
        pools' callable has one: room made for the ``nbytes`` to come)."""
        if self._kept is not None:
            return self._kept
        if self._before is not None:
            self._before(self.total * self._host_pool.itemsize)
        dev = _copy_rows(self.cp, self._host_pool, self._copies, self.total, None)
        if self._keep.take(dev.nbytes):
            self._kept = dev
        return dev


def _copy_rows(xp, pool, copies, total, stream):
    """A device array of ``total`` elements with ``pool``'s ``copies`` (``(src,
    dst, width, height, pitch)``, :func:`_row_copies`) made in, on ``stream``
    (None: the current one); elements no copy writes are not set."""
    if getattr(xp, "__name__", "") != "cupy":       # the NumPy model of a device
        dev = xp.full(total, np.nan, dtype=pool.dtype)      # unset: NaN
        for src, dst, w, h, pitch in copies:
            for r in range(h):
                dev[dst + r * pitch: dst + r * pitch + w] = pool[src + r * pitch:
                                                                 src + r * pitch + w]
        return dev
    make_room(xp, total * pool.itemsize)            # cached blocks under a pool limit
    dev = xp.empty(total, dtype=pool.dtype)
    rt = xp.cuda.runtime
    sp_ = (stream or xp.cuda.get_current_stream()).ptr
    isz, host, to = pool.itemsize, pool.ctypes.data, dev.data.ptr
    for src, dst, w, h, pitch in copies:
        if not w or not h:
            continue
        if h == 1:
            rt.memcpyAsync(to + dst * isz, host + src * isz, w * isz,
                           rt.memcpyHostToDevice, sp_)
        else:
            rt.memcpy2DAsync(to + dst * isz, pitch * isz, host + src * isz, pitch * isz,
                             w * isz, h, rt.memcpyHostToDevice, sp_)
    return dev


def _staged_levels(ft, fs, qr):
    """Per stage, in postorder: ``(stage, members, level kernel, rows)``.

    ``rows`` is a :class:`_StageRows` for a stage whose pool is on the host,
    None for the pool kept on the device. A host stage (a host front) is solved
    on the device the same way, from its rows of R uploaded, where three times
    their bytes (the rows, a column-major copy of the block cuBLAS solves with,
    the right-hand sides' room) fit what the device may give now; else it has
    no kernel, and its fronts are solved on the device from the host pool in row
    panels (:meth:`FrontTriangular.streamed_step`).
    """
    host_stages = set(getattr(qr, "_host_stages", {}) or {})
    by_stage = ft.plan.by_stage
    dtype = qr._device.dtype
    avail = available_bytes(ft.xp).available
    keep = _KeepBudget(keep_bytes(avail, replay_upload_bytes(qr)))
    out = []
    for sid in sorted(by_stage):
        members = by_stage[sid]
        if sid in host_stages:
            rows = _StageRows(ft, members, qr._host_pools[sid], keep)
            if avail is None or 3 * rows.total * np.dtype(dtype).itemsize > avail:
                out.append((sid, members, None, None))
                continue
            out.append((sid, members,
                        _LevelKernel(ft, (sid, "rows"), members, rows.offsets, dtype), rows))
        elif sid in qr._stage_pools:
            offsets = [ft.fronts[i][1] for i in members]
            out.append((sid, members,
                        _LevelKernel(ft, (sid, "pool"), members, offsets, dtype), None))
        else:
            rows = _StageRows(ft, members, qr._host_pools[sid], keep)
            out.append((sid, members,
                        _LevelKernel(ft, (sid, "rows"), members, rows.offsets, dtype), rows))
    return out


def _run_stages(ft, stages, Y, *, trans: bool) -> None:
    """``R``'s (``trans`` False: stages from the last) or ``Rᵀ``'s solve over the stages."""
    for stage in (stages if trans else reversed(stages)):
        _run_stage(ft, stage, Y, trans=trans)


def _run_stage(ft, stage, Y, *, trans: bool) -> None:
    """One stage ``(stage, members, level kernel, rows)`` of :func:`_run_stages`."""
    sid, members, kern, rows = stage
    if kern is None:
        pool = ft.pools(sid)
        for i in (members if trans else reversed(members)):
            ft.step(i, Y, pool, trans=trans)
        return
    pool = rows.upload() if rows is not None else ft.pools(sid)
    kern.run(ft, Y, pool, trans=trans)
    del pool


def _home_stage(ft, stages, i: int, Y) -> None:
    """Stage ``stages[i]`` of ``R⁻¹`` on the factorization's GPU."""
    _run_stage(ft, stages[i], Y, trans=False)


def stage_devices(qr, cp) -> tuple:
    """``(stage → GPU, home GPU)``: the stages whose pool lies on a GPU other than
    the factorization's (a multi-device factorization's subtrees)."""
    dev = qr._device
    home = int(getattr(dev, "device_id", cp.cuda.Device().id))
    where = {}
    for sid, pool in (getattr(qr, "_stage_pools", {}) or {}).items():
        if isinstance(pool, cp.ndarray) and pool.device.id != home:
            where[int(sid)] = int(pool.device.id)
    return where, home


def split_stages(plan, stages, where: dict, home, n: int):
    """``R⁻¹``'s stages over the devices holding them, or None (none off ``home``).

    Parameters
    ----------
    plan : TriangularPlan
    stages : list of (int, list)
        ``(stage, members)`` in postorder (members: indices into ``plan.fronts``).
    where : dict
        stage → the device solving it (a stage not in it: ``home``).
    home : hashable
    n : int
        Columns of R (rows of the right-hand sides).

    Returns
    -------
    segments : list of (device, int, ndarray, ndarray)
        Per stage solved off ``home``: its device, its index in ``stages``, the
        rows lent to it (every column its fronts read: their pivots' right-hand
        sides and their ancestors' values) and those taken back (its pivots).
    ops : list of tuple
        The solve's steps, stages from the last: ``("home", i)``,
        ``("start", seg)``, ``("run", seg)``, ``("finish", seg)``. A stage
        starts (or runs at home) once the running segments that wrote a
        column it reads are taken back; a front reads only its ancestors'
        values and writes only its pivots, so every column is solved on the
        values the unsplit order gives it (the same bits).

    Notes
    -----
    A stage's columns are marked at once in a mask over R's columns (its
    fronts' column ranges by array operations), not gathered front by front.
    """
    if all(where.get(sid, home) == home for sid, _ in stages):
        return None
    cols = np.asarray(plan.cols, dtype=np.int64)
    table = np.asarray(plan.fronts, dtype=np.int64).reshape(-1, 7)
    first, end, top = table[:, 5], table[:, 6], table[:, 5] + table[:, 4]
    mark = np.zeros(int(n), dtype=bool)

    def union(members, stop) -> np.ndarray:
        """The sorted columns ``cols[first:stop]`` of the members, each once."""
        a, cnt = first[members], stop[members] - first[members]
        idx = np.repeat(a - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        mark[cols[idx]] = True
        out = np.flatnonzero(mark).astype(np.int64)
        mark[out] = False
        return out

    last = np.full(int(n), -1, dtype=np.int64)         # who wrote a column last
    running, segments, ops = set(), [], []
    for i in range(len(stages) - 1, -1, -1):
        sid, members = stages[i]
        members = np.asarray(members, dtype=np.int64)
        read = union(members, end)
        wrote = union(members, top)
        for t in np.unique(last[read]).tolist():
            if t in running:
                ops.append(("finish", t))
                running.discard(t)
        d = where.get(sid, home)
        if d == home:
            ops.append(("home", i))
            last[wrote] = -2
            continue
        seg = len(segments)
        segments.append((d, i, read, wrote))
        ops += [("start", seg), ("run", seg)]
        running.add(seg)
        last[wrote] = seg
    ops += [("finish", t) for t in sorted(running)]
    return segments, ops


def run_split(segments, ops, home_stage, lanes: dict, Y) -> None:
    """``R⁻¹``'s steps ``ops`` (:func:`split_stages`) on Y in place: ``home_stage(i,
    Y)`` a stage at home; each lane (``lanes[device]``) ``start(Y, seg)`` → its
    own Y holding the segment's lent rows, ``run(seg, Yd)``, ``finish(Yd, seg,
    Y)`` (its pivots put back in Y)."""
    own = {}
    for op in ops:
        kind, x = op
        if kind == "home":
            home_stage(x, Y)
            continue
        lane = lanes[segments[x][0]]
        if kind == "start":
            own[x] = lane.start(Y, x)
        elif kind == "run":
            lane.run(x, own[x])
        else:
            lane.finish(own.pop(x), x, Y)


class _LaneFronts:
    """What a lane's level kernel and big fronts read: R's fronts and their plan,
    the columns on the lane's GPU (:meth:`FrontTriangular._device_step`)."""

    def __init__(self, ft, cols):
        self.plan, self.fronts, self.cols = ft.plan, ft.fronts, cols

    def step(self, i, Y, pool, *, trans: bool, off: int | None = None) -> None:
        FrontTriangular._device_step(self, i, Y, pool, trans=trans, off=off)


class _SolveLane:
    """A GPU's stages of ``R⁻¹`` (:func:`split_stages`): their level kernels made on
    it, a stream of its own, the segments' rows moved by a :class:`PeerRows`.

    Parameters
    ----------
    ft : FrontTriangular
        The solve (read here; not kept: its pools callable is).
    device : int
    home : int
    segments : dict
        segment → ``(device, stage index, lent rows, taken rows)``.
    """

    def __init__(self, ft, device, home, segments):
        import cupy as cp
        self.cp, self.id = cp, int(device)
        self.pools = ft.pools
        self.stage = {}
        with cp.cuda.Device(self.id):
            self.stream = cp.cuda.Stream(non_blocking=True)
            with self.stream:
                self.fronts = _LaneFronts(ft, cp.asarray(ft.plan.cols))
                for t, (_, i, _, _) in segments.items():
                    sid, members, kern, _ = ft.stages[i]
                    offsets = [ft.fronts[j][1] for j in members]
                    self.stage[t] = (sid, _LevelKernel(self.fronts, (sid, "pool"), members,
                                                       offsets, kern.dtype))
            self.stream.synchronize()
        self.moves = PeerRows(self.id, home, self.stream, None,
                              {t: (seg[2], seg[3]) for t, seg in segments.items()})

    def start(self, Y, seg):
        return self.moves.lend(Y, seg)

    def run(self, seg, Yd) -> None:
        sid, kern = self.stage[seg]
        with self.cp.cuda.Device(self.id), self.stream:
            kern.run(self.fronts, Yd, self.pools(sid), trans=False)

    def finish(self, Yd, seg, Y) -> None:
        self.moves.take_back(Yd, seg, Y)
