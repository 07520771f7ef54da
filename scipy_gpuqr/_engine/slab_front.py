"""A dense front factorized through a device too small for it, in column slabs.

A host front (:mod:`scipy_gpuqr._engine.memory`: a dense front whose stage
does not fit the device) is assembled on the host. When even the front alone
does not fit, it still need not run on LAPACK: the blocked staircase QR of
:mod:`scipy_gpuqr._engine.dense_front` is left-looking over slabs of whole
panels, so only one slab of columns lies on the device at a time.

A slab ``[c0, c1)`` (consecutive panels, or a block of the trailing columns
past ``min(fm, fn)``) lies in one device buffer as *parts*
(:func:`slab_parts`: up to :data:`SLAB_PARTS` runs of whole panels, each
part's columns a C-contiguous block of the buffer of their own):

1. every part's columns ``F[:r, a0:a1]`` are queued for upload at once (one
   strided copy each, ``cudaMemcpy2DAsync``: at the link's speed when ``F``
   is pinned), on a stream of their own; work on a part waits only for its
   own copy, so the later parts arrive while the first is worked on. ``r``
   is the part's staircase (:func:`part_rows`: its last panel's ``j +
   rows``): the rows below it are zeros that no update reaches, so they
   neither go up nor come back (a front assembled from its children's
   upper-trapezoidal blocks is a staircase, often well short of its
   rectangle);
2. every earlier slab's panel comes up (its active rows from its diagonal
   down: where its reflectors ``V`` are), one panel while the one before is
   applied (two buffers, the copies on a stream of their own), and is applied
   to each part, ``C ← C - V Tᵀ (Vᵀ C)`` on its active rows, ``V`` taken out
   of the block on the device: the same updates, in the same order, that the
   right-looking factorization gives these columns;
3. part by part: the slab's panels of the parts before it, still on the
   device, are applied to it the same way; its own panels are factorized as
   a front of their own, its diagonal at ``(a0, a0)`` (the device dense path,
   panel kernel and cuBLAS); it goes back to the host on a third stream
   while the next part is worked on (the link carries both directions at
   once). The next slab's parts go up into the buffer once the work that
   read the place they take is done and the downloads of the parts they
   overwrite have landed (:func:`slab_sides`: a slab whose first part fits
   where the slab before did not lie goes there, and up while that slab is
   still worked on).

A front whose parts, each down to its staircase, fit the device together
(:func:`one_slab_parts`) is worked as one slab: the buffer holds those parts
one after another, not a rectangle of every row, no earlier panel goes up
again, and each part's work starts as soon as it landed, while the later
parts still come up. That is the buffer a staircase front needs, often well
below its rectangle (a root front of a least-squares problem: two thirds).

The result is the representation :class:`~scipy_gpuqr._engine.dense_front.DenseFront`
applies (V below each panel's diagonal, one ``T`` per panel), equal to
:func:`~scipy_gpuqr._engine.dense_front.factorize_numpy`'s to rounding.
The device holds the slab being worked on, two earlier panels, the panels'
``T`` and the dense path's workspace. The extra traffic is the earlier
panels, uploaded once per later slab: with ``s`` slabs about ``s/2`` times
the front; the narrowest slab comes first (:func:`slab_ranges`), so the
fewest panels go up again. :func:`factorize_in_slabs` is written against a small device
interface (:class:`NumpySlabs` runs it on the host for CI, :class:`CupySlabs`
on a GPU).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from .dense_front import _Cublas, _wy_update, factorize_cupy, factorize_numpy
from .gpu.array_ops import unit_triangle, upload_block
from .gpu.dense_panel import PANEL_WIDTH, panel_workspace_elements
from .gpu.finite_check import finite_check
from .gpu.mapped import device_view
from .memory import make_room

__all__ = ["slab_ranges", "slab_parts", "slab_sides", "slab_columns", "whole_front_fits",
           "factorize_in_slabs", "NumpySlabs", "CupySlabs", "SLAB_PARTS", "PANEL_UPLOADS",
           "PANEL_UPLOAD", "PART_ROW_BYTES", "slab_part_count", "part_rows", "one_slab_parts",
           "ONE_SLAB_PARTS", "slab_buffer_elements", "scratch_bytes", "POOL_UNIT", "pool_bytes",
           "PANEL_BLOCKS_MOST", "part_workspace_bytes", "one_slab_reserve", "ROW_ALIGN",
           "padded", "LAST_BY_PANELS", "panel_pieces"]

#: Most parts a slab is worked in (:func:`slab_parts`): part ``g`` goes back to
#: the host while part ``g + 1`` is worked on, and part ``g + 1`` came up while
#: part ``g`` was; only the first part's upload and the last part's download
#: are not overlapped by work of the slab.
SLAB_PARTS = 4

#: Most parts of a front worked as one slab (:func:`one_slab_parts`): more
#: parts than a slab of several has, so that the first part, whose upload no
#: work overlaps, is small, the last part's download short, and the parts cut
#: closer to the front's staircase; 0: no front is worked as one slab (its
#: slabs are :func:`slab_columns`' rectangles).
ONE_SLAB_PARTS = 8

#: Fewest bytes of a part's row on a device that copies parts over a link
#: (:class:`CupySlabs`' ``part_row_bytes``, :func:`slab_part_count`): a part's
#: upload is a 2-D copy of its pieces of the front's rows, and the copy engines
#: bring short pieces up well below the link's speed, so a narrow slab is cut
#: into fewer, wider parts (bench/RESULTS.md, issue 22).
PART_ROW_BYTES = 7 << 10

#: How :class:`CupySlabs` brings an earlier panel up: ``"copy2d"``, one
#: ``cudaMemcpy2DAsync`` (a panel's rows are 2 KB pieces of the front's rows:
#: the copy engine runs below the link's speed on pieces that small), or
#: ``"mapped"``, a copy kernel reading the pinned front where it lies (a pinned
#: host array is addressable from the device under unified addressing;
#: pageable memory always takes the 2-D copy); ``"mapped-all"``: the slabs'
#: parts too.
PANEL_UPLOADS = ("copy2d", "mapped", "mapped-all")
#: The default of :data:`PANEL_UPLOADS`.
PANEL_UPLOAD = "copy2d"

#: Bytes CuPy's memory pool rounds every allocation up to (its allocation
#: unit): what an array really takes of a pool limit (:func:`pool_bytes`).
POOL_UNIT = 512

#: Most blocks of a panel-kernel launch counted for its reduction buffers
#: (:func:`part_workspace_bytes`): the device's multiprocessors (an H200 has 132).
PANEL_BLOCKS_MOST = 256

#: Elements :class:`CupySlabs` pads the rows of a one-slab part and of an
#: update's ``Vᵀ`` to (their leading dimensions; 1: none). A part holding a
#: front's last, narrower panel and a panel of an odd number of active rows
#: would give cuBLAS an odd leading dimension of float64, which may keep it
#: off its fastest GEMM kernels (those whose loads need 16-byte strides). The
#: part's pad columns are zeros, which every update and panel leaves zero
#: (each column is updated on its own), and are neither sent back nor read as
#: the front's.
ROW_ALIGN = 8


#: Whether the last part of a front's last slab goes back panel by panel: its
#: panels factorized one call each, each panel's columns sent back (and told
#: to ``on_part``) as soon as it is done, while the later panels are worked
#: on. Every other part's copy back runs beside the next part's work; the last
#: one's has nothing beside it, and neither has the host's gather of R's values
#: from its columns after it.
LAST_BY_PANELS = True


def padded(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align`` (1 or less: ``n``)."""
    a = max(int(align), 1)
    return -(-int(n) // a) * a


def slab_ranges(panels: list, fn: int, width: int) -> list:
    """Column slabs ``(c0, c1, p0, p1)`` covering ``[0, fn)``.

    Consecutive panels ``p0 .. p1-1`` whose columns span at most ``width``
    (one panel at least), as few slabs as that allows, taken from the last
    panel back: the first slab is the narrowest, since every later slab
    uploads the panels of the slabs before it again (with two slabs of a
    front of ``1.6 width`` columns, ``0.6 width`` columns of panels go up
    twice instead of ``width``). Then the columns past the last panel in
    blocks of at most ``width`` (no panels: ``p0 == p1``).

    Parameters
    ----------
    panels : list of (j, rows, b)
        From :func:`~scipy_gpuqr._engine.dense_front.panels_of`.
    fn : int
        Columns of the front.
    width : int
        Most columns of a slab (at least a panel's width).
    """
    if width < 1:
        raise ValueError(f"slab width must be >= 1, got {width}")
    out = []
    q = len(panels)
    while q > 0:
        c1 = panels[q - 1][0] + panels[q - 1][2]
        p = q - 1
        while p > 0 and c1 - panels[p - 1][0] <= width:
            p -= 1
        out.append((panels[p][0], c1, p, q))
        q = p
    out.reverse()
    c = panels[-1][0] + panels[-1][2] if panels else 0
    while c < fn:
        c1 = min(fn, c + width)
        out.append((c, c1, len(panels), len(panels)))
        c = c1
    return out


def slab_parts(panels: list, slab: tuple, parts: int = SLAB_PARTS) -> list:
    """The parts ``(a0, a1, p0, p1)`` of ``slab`` (from :func:`slab_ranges`),
    in order, covering its columns: up to ``parts`` runs of whole panels of
    about equal width (a slab of trailing columns: up to ``parts`` column
    blocks of at least a panel's width, or of its width when it has none)."""
    c0, c1, p0, p1 = slab
    parts = max(1, int(parts))
    if p1 > p0:
        k = min(parts, p1 - p0)
        ends = [panels[q][0] + panels[q][2] for q in range(p0, p1)]
        out, q = [], p0
        for i in range(k):
            if i == k - 1:
                r = p1
            else:       # the first panel ending at or past the i-th share of the width
                goal = c0 + (c1 - c0) * (i + 1) / k
                r = max(q + 1, min(p1 - (k - 1 - i), p0 + 1 + int(np.searchsorted(
                    ends, goal, side="left"))))
            out.append((panels[q][0], ends[r - 1 - p0], q, r))
            q = r
        return out
    w = c1 - c0
    least = panels[0][2] if panels else w
    k = max(1, min(parts, w // max(least, 1)))
    cuts = [c0 + (w * i) // k for i in range(k + 1)]
    return [(cuts[i], cuts[i + 1], p0, p1) for i in range(k) if cuts[i + 1] > cuts[i]]


def slab_part_count(width: int, itemsize: int, parts: int = SLAB_PARTS,
                    row_bytes: int = 0) -> int:
    """Parts of a slab of ``width`` columns: ``parts``, fewer where a part's row
    would hold fewer than ``row_bytes`` bytes (one at least; ``row_bytes`` 0:
    ``parts``)."""
    parts = max(1, int(parts))
    if row_bytes <= 0:
        return parts
    return max(1, min(parts, int(width) * int(itemsize) // int(row_bytes)))


def part_rows(panels: list, fm: int, p0: int, p1: int) -> int:
    """Rows of a part with the panels ``p0 .. p1-1`` that it moves over the link:
    down to its last panel's staircase (``j + rows``; the rows below are zeros
    that no update reaches, in the front and in the result), ``fm`` for a part
    of trailing columns (no panels)."""
    if p1 <= p0:
        return int(fm)
    return int(max(j + r for j, r, _ in panels[p0:p1]))


def slab_sides(plan: list, most: int) -> list:
    """Per slab of ``plan`` (``(slab, parts)``, :func:`slab_parts`), whether its
    parts lie from the end of a buffer of ``most`` columns back (True) or from
    its start on (False).

    The first slab lies from the start. A later one takes the side where its
    first part does not meet the columns the slab before took, so that part
    goes up while that slab is still worked on (a narrow first slab leaves
    room at the end); where neither side has that room, the side of the slab
    before: its first part then takes the place of that slab's first part,
    the first to come back to the host (the other side's would wait for its
    last part)."""
    out, prev = [], None
    for (c0, c1, _, _), parts in plan:
        first = parts[0][1] - parts[0][0] if parts else c1 - c0
        if prev is None:
            down = False
        else:
            lo, hi, was = prev
            if first <= lo:
                down = False
            elif most - first >= hi:
                down = True
            else:
                down = was
        width = c1 - c0
        prev = (most - width, most, down) if down else (0, width, down)
        out.append(down)
    return out


def slab_columns(fm: int, nb: int, itemsize: int, available: int) -> int:
    """Most columns of a slab of an ``fm``-row front in ``available`` device bytes
    (the slab, two earlier panels, one panel's reflectors, the products of the
    updates and the dense path's workspace; 10 % left for the allocator and
    the panels' ``T``), or 0 when not even one panel fits."""
    fixed = (7 * fm * nb + 5 * nb * nb) * itemsize
    w = (0.9 * available - fixed) // ((fm + 2 * nb) * itemsize)
    return int(w) if w >= nb else 0


def one_slab_parts(panels: list, fm: int, fn: int, nb: int, itemsize: int, available: int,
                   row_bytes: int = 0, parts: int | None = None, geqrf: bool = False,
                   align: int | None = None) -> int:
    """Parts of the whole front worked as one slab in ``available`` device bytes,
    or 0 where it does not fit (then :func:`slab_columns`' slabs of several), or
    where the front is wider than tall (its columns past the last panel go in
    slabs of their own, :func:`slab_ranges`).

    The slab's parts (:func:`slab_parts`, as many as :func:`slab_part_count`
    gives for ``parts``, default :data:`ONE_SLAB_PARTS`, and ``row_bytes``)
    each hold their rows down to their staircase (:func:`part_rows`), one
    after another in one buffer (:func:`slab_buffer_elements`). Beside it,
    what :class:`CupySlabs` allocates for them (:func:`one_slab_reserve`:
    the panels' ``T``, the scratch block every part's workspace is cut from,
    and, with ``geqrf``, the blocks of panels too tall for the panel kernel).
    No earlier panels: only slabs of several bring them up. Every size is
    counted as CuPy's pool takes it; ``available`` already leaves the pool's
    share for fragmentation (:func:`~scipy_gpuqr._engine.memory.available_bytes`).
    The parts' rows padded to ``align`` elements (default :data:`ROW_ALIGN`,
    as :class:`CupySlabs` lays them).
    """
    parts = ONE_SLAB_PARTS if parts is None else int(parts)
    align = ROW_ALIGN if align is None else int(align)
    if not panels or parts < 1 or panels[-1][0] + panels[-1][2] < fn:
        return 0            # a wide front's trailing columns make slabs of their own
    k = slab_part_count(fn, itemsize, parts, row_bytes)
    slab = (0, int(fn), 0, len(panels))
    pieces = slab_parts(panels, slab, k)
    need = (pool_bytes(slab_buffer_elements([(slab, pieces)], panels, fm, align) * itemsize)
            + one_slab_reserve(panels, pieces, fm, nb, itemsize, geqrf=geqrf, align=align))
    return len(pieces) if need <= available else 0


def slab_buffer_elements(plan: list, panels: list, fm: int, align: int = 1) -> int:
    """Elements of the buffer the slabs of ``plan`` (``(slab, parts)``) are worked
    in: one slab's parts each down to its staircase (:func:`part_rows`), its
    rows padded to ``align`` elements (:data:`ROW_ALIGN`), one after another;
    slabs of several the widest one's columns of every row, so that a slab's
    parts may lie from either end (:func:`slab_sides`)."""
    if len(plan) == 1:
        return sum(part_rows(panels, fm, q0, q1) * padded(a1 - a0, align)
                   for a0, a1, q0, q1 in plan[0][1])
    return int(fm) * max((c1 - c0 for (c0, c1, _, _), _ in plan), default=0)


def scratch_bytes(fm: int, columns: int, nb: int, itemsize: int) -> int:
    """Bytes of :class:`CupySlabs`' scratch for an ``fm``-row front whose widest
    slab part has ``columns`` columns: a panel of every row (the ``Vᵀ`` an
    update takes out of a part, or the dense path's panel buffer) and a byte
    per element of it to spare (the parts' ``T`` and the panel kernel's small
    arrays), the products of the updates and the dense path's two work rows
    per column of that part. Sized by the part,
    not the front: a wide front's slabs are narrow, and :func:`slab_columns`
    counts their workspace per column of the slab."""
    return int(fm) * int(nb) * (int(itemsize) + 1) + 4 * int(columns) * int(nb) * int(itemsize)


def pool_bytes(nbytes: int) -> int:
    """An array of ``nbytes`` bytes as CuPy's pool takes it: rounded up to
    :data:`POOL_UNIT` (an empty one still a unit: :class:`CupySlabs` asks for one
    element at least)."""
    return max(1, -(-int(nbytes) // POOL_UNIT)) * POOL_UNIT


def part_workspace_bytes(panels: list, part: tuple, fm: int, widest: int, nb: int,
                         itemsize: int, geqrf: bool = False,
                         blocks: int = PANEL_BLOCKS_MOST, align: int = 1) -> tuple:
    """``(updates, own)``: device bytes held at once while a one-slab part
    ``(a0, a1, p0, p1)`` is worked on, each array as CuPy's pool takes it
    (:func:`pool_bytes`), besides the slab buffer and the panels' ``T``.

    ``updates``: the earlier parts' panels applied to it, :class:`_UpdateWork`
    (one array of ``fm × nb`` for ``Vᵀ`` and two products of ``widest × nb``).
    ``own``: its own panels,
    :func:`~scipy_gpuqr._engine.dense_front.factorize_cupy` on the part
    without look-ahead: its ``T`` and ``tau`` (per panel), the panel buffer
    (``nb ×`` its tallest panel's rows), two GEMM products (``max(width, nb)
    × nb``), the panel kernel's reduction buffers and flag words (``blocks``,
    at most :data:`PANEL_BLOCKS_MOST`) and its sub-panel ``T``, the
    ``T`` system's two ``nb × nb`` arrays and, per panel, ``VᵀV`` (``nb ×
    nb``); with ``geqrf`` (a panel too tall for the panel kernel, or the
    ``geqrf`` panel method), cuSOLVER's column-major copy of the panel
    (``nb ×`` the tallest rows), its info word and its workspace, counted as
    large as the copy (its size is the device library's answer). Each part's
    finiteness flag (one word) is not in either: it stays until the front
    is done (:func:`one_slab_reserve`). The part's rows padded to ``align``
    elements (:func:`padded`; ``widest`` is the padded widest).
    """
    isz = int(itemsize)
    a0, a1, q0, q1 = part
    updates = pool_bytes((int(fm) * nb + 2 * max(int(widest), 1) * nb) * isz)
    k = q1 - q0
    rows = max((r for _, r, _ in panels[q0:q1]), default=0)
    width = max(padded(a1 - a0, align), nb)
    if not k:
        return updates, 0
    values, words = panel_workspace_elements(blocks)
    own = (pool_bytes(k * nb * nb * isz) + pool_bytes(k * nb * isz)
           + pool_bytes(nb * rows * isz) + 2 * pool_bytes(width * nb * isz)
           + pool_bytes(values * isz) + pool_bytes(8 * words)
           + pool_bytes(PANEL_WIDTH * PANEL_WIDTH * isz) + 3 * pool_bytes(nb * nb * isz))
    if geqrf:
        own += 2 * pool_bytes(rows * nb * isz) + pool_bytes(4)
    return updates, own


def one_slab_reserve(panels: list, pieces: list, fm: int, nb: int, itemsize: int,
                     geqrf: bool = False, blocks: int = PANEL_BLOCKS_MOST, align: int = 1) -> int:
    """Device bytes :class:`CupySlabs` allocates beside the slab buffer of a front
    worked as one slab in ``pieces`` (:func:`slab_parts`), as CuPy's pool
    takes them: the panels' ``T`` (:meth:`CupySlabs.start`, held to the end);
    the scratch block (:func:`scratch_bytes`, by the widest part), made once
    and given back to the work stream's share of the pool, where each part's
    workspaces (:func:`part_workspace_bytes`) and its finiteness flag are cut
    from it (the flags stay there to the end); and where a part's workspace
    with the flags before it passes the scratch, the excess as blocks of their
    own (the pool keeps them, and a later part's larger one is another: counted
    for every part, a bound). The parts' rows padded to ``align`` elements."""
    isz = int(itemsize)
    widest = max((padded(a1 - a0, align) for a0, a1, _, _ in pieces), default=nb)
    scratch = pool_bytes(scratch_bytes(fm, widest, nb, isz))
    over = 0
    for g, part in enumerate(pieces):
        updates, own = part_workspace_bytes(panels, part, fm, widest, nb, isz, geqrf, blocks,
                                            align)
        over += max(0, max(updates, own) + g * POOL_UNIT - scratch)
    return pool_bytes(len(panels) * nb * nb * isz) + scratch + over


def whole_front_fits(fm: int, fn: int, nb: int, itemsize: int, available: int) -> bool:
    """Whether an ``fm × fn`` front and the dense path's workspace fit
    ``available`` device bytes (10 % left for the allocator)."""
    return (fm * fn + 5 * fm * nb + 2 * fn * nb + 5 * nb * nb) * itemsize <= 0.9 * available


def panel_pieces(panels: list, part: tuple) -> list:
    """A part ``(a0, a1, p0, p1)`` as pieces ``(a0', a1', q, q + 1)``, one per panel,
    where its panels cover its columns and it has two or more (:data:`LAST_BY_PANELS`);
    else ``[part]``."""
    a0, a1, p0, p1 = part
    if p1 - p0 < 2 or panels[p1 - 1][0] + panels[p1 - 1][2] != a1:
        return [tuple(part)]
    return [(panels[q][0], panels[q][0] + panels[q][2], q, q + 1) for q in range(p0, p1)]


@dataclass
class SlabPart:
    """One part of a slab where it is worked on: its columns ``[a0, a1)`` of the
    front as ``S`` (fm × (a1 - a0), C-contiguous), its panels ``p0 .. p1-1``,
    its place ``at`` in the slab's buffer and the copy it waits for."""

    S: object
    a0: int
    a1: int
    p0: int
    p1: int
    at: int = 0
    ready: object = None


def factorize_in_slabs(F: np.ndarray, panels: list, nb: int, width: int, dev,
                       fallback=None, parts: int | None = None,
                       last_by_panels: bool | None = None) -> np.ndarray:
    """Blocked staircase QR of the host front ``F`` (fm × fn) in place, slab by slab
    through ``dev``'s memory.

    Parameters
    ----------
    F : ndarray, shape (fm, fn), C-contiguous
        The assembled front, overwritten by R and the reflectors.
    panels : list of (j, rows, b)
        Its panels (:func:`~scipy_gpuqr._engine.dense_front.panels_of`, width ``nb``).
    nb : int
        Panel width.
    width : int
        Most columns of a slab (:func:`slab_columns`; the front's columns or
        more: one slab, :func:`one_slab_parts`).
    dev : NumpySlabs or CupySlabs
        Where the slabs are worked on.
    fallback : NumpySlabs, optional
        Where a part that failed on ``dev`` (out of its memory, or any error
        of the device path, logged) and every later one are worked on instead,
        each as a slab of its own: a part's columns of ``F`` change only once
        it is done, so it is redone from them. Without it the error
        propagates.
    parts : int, optional
        Most parts per slab (:func:`slab_parts`; default :data:`SLAB_PARTS`),
        fewer in a slab whose parts' rows would be shorter than ``dev``'s
        ``part_row_bytes`` (:func:`slab_part_count`; none: no fewer).
    last_by_panels : bool, optional
        Whether the last slab's last part goes back panel by panel (default
        :data:`LAST_BY_PANELS`; :func:`panel_pieces`): the fallback then
        redoes from the first of its panels not sent back.

    Returns
    -------
    ndarray, shape (npanels, nb, nb)
        Each panel's compact-WY factor ``T`` (host).
    """
    slabs = slab_ranges(panels, F.shape[1], max(int(width), nb))
    parts = SLAB_PARTS if parts is None else parts
    row_bytes = int(getattr(dev, "part_row_bytes", 0) or 0)
    plan = [(slab, slab_parts(panels, slab, slab_part_count(slab[1] - slab[0], F.itemsize,
                                                             parts, row_bytes)))
            for slab in slabs]
    most = max((c1 - c0 for c0, c1, _, _ in slabs), default=0)
    sides = slab_sides(plan, most)
    # a one-slab front's parts with their rows padded as ``dev`` lays them
    align = int(getattr(dev, "row_align", 1) or 1) if len(plan) == 1 else 1
    size = slab_buffer_elements(plan, panels, F.shape[0], align)
    widest = max((padded(a1 - a0, align) for _, pieces in plan for a0, a1, _, _ in pieces),
                 default=nb)
    by_panels = LAST_BY_PANELS if last_by_panels is None else bool(last_by_panels)
    state = {"done": 0}             # parts (pieces) whose columns went back into F
    try:
        dev.start(F, len(panels), nb, widest=widest)
        for i, ((slab, pieces), down) in enumerate(zip(plan, sides)):
            _one_slab(F, panels, slab, pieces, dev, state, size, down=down, align=align,
                      by_panels=by_panels and i == len(plan) - 1)
        dev.finish()
        return dev.t_host()
    except Exception as exc:        # noqa: BLE001 - redone on the host, see above
        if fallback is None or dev is fallback:
            raise
        units = [piece for _, pieces in plan for piece in pieces]
        if by_panels and units:     # as the last part went back: panel by panel
            units[-1:] = panel_pieces(panels, units[-1])
        if state["done"] >= len(units):     # every part went back: nothing to redo
            raise
        failed = units[state["done"]]
        logging.getLogger("scipy_gpuqr").log(
            logging.INFO if isinstance(exc, MemoryError) else logging.WARNING,
            "slab part [%d, %d) of a %dx%d front failed on the device (%s: %s); it and "
            "the rest run on the host", failed[0], failed[1], F.shape[0], F.shape[1],
            type(exc).__name__, str(exc))
        dev.finish()                # the parts done before are in F, their T known
        T = dev.t_host()
        fallback.start(F, len(panels), nb, T=T)
        for piece in units[state["done"]:]:     # each a slab of its own
            _one_slab(F, panels, piece, [piece], fallback, {"done": 0})
        fallback.finish()
        return fallback.t_host()
    finally:
        dev.finish()


def _one_slab(F, panels, slab, pieces, dev, state, size=None, down=False, align=1,
              by_panels=False) -> None:
    """Slab ``(c0, c1, p0, p1)`` in ``pieces`` (:func:`slab_parts`): its parts up,
    every earlier slab's reflectors, then part by part the slab's own panels
    before it, its panels, back into ``F`` (``state['done']`` counts the parts
    sent back). The buffer holds ``size`` elements (:func:`slab_buffer_elements`;
    default the slab's parts down to their staircases); the parts lie from its
    start on, or with ``down`` from its end back (:func:`slab_sides`); each
    part's rows padded to ``align`` elements (:func:`padded`). With
    ``by_panels`` the last part goes back panel by panel (:func:`panel_pieces`;
    ``state['done']`` counts its pieces)."""
    c0, c1, p0, p1 = slab
    if size is None:
        size = slab_buffer_elements([(slab, pieces)], panels, F.shape[0], align)
    buf = dev.slab_buffer(F, size)
    at = buf.size if down else 0
    work = []
    for a0, a1, q0, q1 in pieces:
        rows = part_rows(panels, F.shape[0], q0, q1)     # down to its staircase
        cols = padded(a1 - a0, align)
        n = rows * cols
        if down:
            at -= n
        work.append(dev.upload_part(F, buf, at, a0, a1, q0, q1, rows=rows, cols=cols))
        if not down:
            at += n
    for q in range(p0):                 # every earlier slab's panels, in order
        j, rows, b = panels[q]
        slot = ("earlier", q % 2)       # uploaded while the previous one is applied
        E = dev.upload_panel(F, q, j, j + rows, j, j + b, slot)
        for part in work:
            dev.ready(part)
            dev.apply(part.S, j, rows, E, 0, 0, b, dev.t(q, b))
        dev.release(slot)
    if p0:
        dev.mark("e")                   # the earlier slabs' panels applied
    for g, part in enumerate(work):
        dev.ready(part)
        for h in work[:g]:              # the slab's panels before it, still here
            for q in range(h.p0, h.p1):
                j, rows, b = panels[q]
                dev.apply(part.S, j, rows, h.S, j, j - h.a0, b, dev.t(q, b))
        units = [(part.a0, part.a1, part.p0, part.p1)]
        if by_panels and g == len(work) - 1:
            units = panel_pieces(panels, units[0])
        for a0, a1, q0, q1 in units:
            if q1 > q0:                 # its own panels, diagonal at (a0, a0) of the part
                moved = [(j - part.a0, rows, b) for j, rows, b in panels[q0:q1]]
                dev.factorize(part.S, part.a0, moved, q0)
            dev.mark("p")
            dev.download(part, F, (a0, a1, q0, q1))
            state["done"] += 1
    dev.end_slab()


def _reflectors(E, i0: int, k0: int, rows: int, b: int):
    """A panel's ``V`` (rows × b, unit lower trapezoid) out of a host block of the
    front holding it from row ``i0``, column ``k0``."""
    V = np.tril(E[i0:i0 + rows, k0:k0 + b], -1)
    V[np.arange(b), np.arange(b)] = 1
    return V


class NumpySlabs:
    """The slab operations on the host (the CI model of :class:`CupySlabs`);
    ``slabs`` counts the slabs worked on, ``parts`` their parts. ``on_part``:
    as :class:`CupySlabs`' (told with no event: the part is back already);
    ``part_row_bytes``: as :class:`CupySlabs`' (default 0: no link, parts as
    many as asked); ``row_align``: as :class:`CupySlabs`' (default 1: no
    padding)."""

    def __init__(self, on_part=None, part_row_bytes: int = 0, row_align: int = 1):
        self.slabs = 0
        self.parts = 0
        self._T = None
        self.on_part = on_part
        self.part_row_bytes = int(part_row_bytes)
        self.row_align = int(row_align)

    def start(self, F: np.ndarray, npanels: int, nb: int, T=None, widest=None) -> None:
        """A factorization of ``F`` begins (``T``: the panels' factors known so far;
        ``widest``: its widest part's columns, which the host needs no workspace
        sized by)."""
        self._T = np.zeros((npanels, nb, nb), dtype=F.dtype) if T is None else T.copy()

    def slab_buffer(self, F: np.ndarray, n: int):
        """The buffer of ``n`` elements (:func:`slab_buffer_elements`) a slab is
        worked in (its parts one after another)."""
        self.slabs += 1
        return np.empty(int(n), dtype=F.dtype)

    def upload_part(self, F, buf, at: int, a0: int, a1: int, p0: int, p1: int,
                    rows: int | None = None, cols: int | None = None) -> SlabPart:
        """``F[:rows, a0:a1]`` into ``buf`` from element ``at`` (``rows``: the part's
        staircase, :func:`part_rows`; default every row), its rows ``cols``
        elements long (default ``a1 - a0``; zeros past the front's columns): a
        :class:`SlabPart` whose ``S`` is ``rows × cols``."""
        self.parts += 1
        rows = F.shape[0] if rows is None else int(rows)
        w = a1 - a0
        cols = w if cols is None else int(cols)
        S = buf[at: at + rows * cols].reshape(rows, cols)
        S[:, :w] = F[:rows, a0:a1]
        S[:, w:] = 0
        return SlabPart(S, a0, a1, p0, p1, at)

    def ready(self, part: SlabPart) -> None:
        """Work on ``part`` may start (its columns are there)."""

    def upload_panel(self, F: np.ndarray, q: int, r0: int, r1: int, c0: int, c1: int, slot):
        """Panel ``q``'s block ``F[r0:r1, c0:c1]`` where the slabs are worked on (a copy)."""
        return F[r0:r1, c0:c1].copy()

    def release(self, slot) -> None:
        """The block of ``slot`` is no longer read (its buffer may be refilled)."""

    def t(self, q: int, b: int):
        """Panel ``q``'s ``T`` (b × b) where the slabs are worked on."""
        return self._T[q, :b, :b]

    def apply(self, S, j: int, rows: int, E, i0: int, k0: int, b: int, T) -> None:
        """``C ← C - V Tᵀ (Vᵀ C)`` on rows ``[j, j+rows)`` of the slab part, V a panel's
        reflectors at ``(i0, k0)`` of the block ``E``."""
        V = _reflectors(E, i0, k0, rows, b)
        C = S[j:j + rows]
        C -= V @ (T.T @ (V.T @ C))

    def factorize(self, S, a0: int, panels: list, p0: int) -> None:
        """The part's panels (``panels`` relative to ``(a0, a0)``); their ``T`` kept
        as panels ``p0 ..``."""
        Tp = factorize_numpy(S[a0:], panels, self._T.shape[1])
        self._T[p0:p0 + len(panels)] = Tp

    def download(self, part: SlabPart, F: np.ndarray, piece: tuple | None = None) -> None:
        """The worked part back into ``F[:rows, a0:a1]`` (its rows, not its pad), or
        its ``piece`` ``(c0, c1, q0, q1)``: the columns ``[c0, c1)`` of its panels
        ``q0 .. q1-1``, final before the rest of the part."""
        c0, c1, _, _ = (part.a0, part.a1, part.p0, part.p1) if piece is None else piece
        F[:part.S.shape[0], c0:c1] = part.S[:, c0 - part.a0:c1 - part.a0]
        if self.on_part is not None:
            self.on_part(c0, c1, None)

    def mark(self, what: str) -> None:
        """The work queued so far reached a point of the timeline (``e``: the
        earlier slabs' panels applied, ``p``: a part factorized)."""

    def end_slab(self) -> None:
        """The slab's work is all queued (its buffer may be refilled after it)."""

    def finish(self) -> None:
        pass

    def t_host(self) -> np.ndarray:
        """Every panel's ``T`` (npanels × nb × nb) on the host."""
        return self._T.copy()


class _UpdateWork:
    """:class:`CupySlabs`' workspace for the updates of a part, cut from one block:
    ``Vt``, room for one panel's ``Vᵀ`` of every row of the front (``nb × fm``),
    and ``W``, ``W2``, the update's two products for the widest part (``widest ×
    nb`` each); ``blas``, the cuBLAS calls
    (:func:`~scipy_gpuqr._engine.dense_front._wy_update` reads these four)."""

    def __init__(self, cp, blas, dtype, fm: int, widest: int, nb: int):
        n, m = int(fm) * int(nb), max(int(widest), 1) * int(nb)
        flat = cp.empty(n + 2 * m, dtype=dtype)
        self.Vt, self.W, self.W2 = flat[:n], flat[n:n + m], flat[n + m:]
        self.blas = blas


class CupySlabs:
    """The slab operations on a CUDA device: the work on ``stream``, the parts'
    uploads, the earlier panels' uploads and the parts' downloads on three
    streams of their own, ordered by events (F pinned makes the copies
    asynchronous). Buffers (the slab, two earlier panels) are reused for every
    slab; the panels' ``T`` stay on the device until :meth:`t_host`; nothing
    synchronizes before :meth:`finish`. ``slabs`` and ``parts`` count the slabs
    and parts started there. ``panel_upload``: one of :data:`PANEL_UPLOADS`
    (default :data:`PANEL_UPLOAD`). Each worked part is checked for non-finite values
    before it goes back (one launch reading it where it lies:
    :meth:`all_finite`), so the host need not read the front again.
    ``on_part``: called ``on_part(a0, a1, landed)`` as each part's copy back is
    queued (``landed``: the event after it; the columns ``[a0, a1)`` of ``F``
    are final once it has passed), e.g. to gather R's values from those
    columns while the device works on the next parts. ``part_row_bytes``: a
    slab is cut into fewer parts where their rows would be shorter
    (:func:`slab_part_count`; default :data:`PART_ROW_BYTES`, 0: as many as
    asked). ``row_align``: a one-slab part's rows and an update's ``Vᵀ``
    rows padded to that many elements (default :data:`ROW_ALIGN`)."""

    def __init__(self, cp, stream, panel_upload: str | None = None, on_part=None,
                 part_row_bytes: int | None = None, row_align: int | None = None):
        self.cp, self.stream = cp, stream
        self.row_align = int(ROW_ALIGN if row_align is None else row_align)
        self.on_part = on_part
        self.part_row_bytes = int(PART_ROW_BYTES if part_row_bytes is None else part_row_bytes)
        self.panel_upload = PANEL_UPLOAD if panel_upload is None else panel_upload
        if self.panel_upload not in PANEL_UPLOADS:
            raise ValueError(f"panel_upload must be one of {PANEL_UPLOADS}, "
                             f"got {self.panel_upload!r}")
        self._mapped = None             # (host base pointer, its device view) of the front
        #: earlier panels read by a kernel from the pinned front (``"mapped"``)
        self.mapped_panels = 0
        self.copy_stream = cp.cuda.Stream(non_blocking=True)     # earlier panels up
        self.up_stream = cp.cuda.Stream(non_blocking=True)       # slab parts up
        self.down_stream = cp.cuda.Stream(non_blocking=True)     # slab parts down
        self.slabs = 0
        self.parts = 0
        self._buffers = {}
        self._read = {}                 # slot -> event: the last work reading its buffer
        self._landed = {}               # panel -> event: its part's copy back into F
        self._regions = []              # (start, end, event): parts' copies back, per buffer
        self._worked = []               # (start, end, event): earlier slabs' parts, work done
        self._current = []              # (start, end): the parts of the slab being queued
        self._flags = []
        self._T = None
        self._T_host = None
        self._nb = 0                    # the panels' width (:meth:`start`)
        self._fm = 0                    # the front's rows (:meth:`start`)
        self._blas = None               # the updates' cuBLAS calls (:meth:`_update_work`)
        self._work = None               # the updates' workspace (:meth:`_update_work`)
        self._widest = 0                # the widest part's columns (:meth:`start`)
        self._scratch_made = False      # :meth:`_scratch` ran for this factorization
        self._marks = []                # (what, timing event, host ms): :meth:`timeline`
        self._t0 = 0.0                  # the host's clock at :meth:`start`
        #: the last factorization's timeline (:meth:`timeline`), for the log
        self.last_timeline = ""
        #: most bytes CuPy's pool held at any mark of the last factorization
        #: (read as the work was queued: the slab path's peak under a limit)
        self.pool_peak = 0

    def _event(self, stream):
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    def _timed(self, stream):
        ev = self.cp.cuda.Event()
        ev.record(stream)
        return ev

    def _mark(self, what: str, stream) -> None:
        """A point of the timeline on ``stream``, with the host's clock and the
        pool's bytes as it is queued."""
        self.pool_peak = max(self.pool_peak, int(self.cp.get_default_memory_pool().total_bytes()))
        self._marks.append((what, self._timed(stream),
                            1e3 * (time.perf_counter() - self._t0)))

    def mark(self, what: str) -> None:
        self._mark(what, self.stream)

    def timeline(self) -> str:
        """Milliseconds from the start, per slab: its parts up (``u``), the earlier
        slabs' panels applied (``e``), its parts factorized (``p``) and back
        (``d``), each as ``device:host`` (when it happened on the device, when
        the host queued it); after :meth:`finish`'s synchronization."""
        if len(self._marks) < 2:
            return ""
        t0 = self._marks[0][1]
        out, cur = [], None
        for what, ev, host in self._marks[1:]:
            if what == "slab":
                cur = [f"s{len(out)}:{host:.0f}"]
                out.append(cur)
                continue
            ms = self.cp.cuda.get_elapsed_time(t0, ev)
            if cur is not None:
                cur.append(f"{what}{ms:.0f}:{host:.0f}")
        return " | ".join(" ".join(c) for c in out)

    def _sync(self) -> None:
        for s in (self.stream, self.copy_stream, self.up_stream, self.down_stream):
            s.synchronize()

    def _buffer(self, slot, n: int, dtype):
        buf = self._buffers.get(slot)
        if buf is None or buf.size < n or buf.dtype != dtype:
            if buf is not None:         # a buffer in use on any stream is not freed
                self._sync()
                if slot == "slab":
                    self._regions, self._worked = [], []
            buf = None                  # freed before the larger one is taken
            self._buffers.pop(slot, None)
            # sized for what the pool has not handed out (:func:`slab_columns`):
            # CuPy's cached blocks would stand in its way under a pool limit
            make_room(self.cp, max(n, 1) * np.dtype(dtype).itemsize)
            buf = self._buffers[slot] = self.cp.empty(max(n, 1), dtype=dtype)
        return buf[:n]

    def start(self, F: np.ndarray, npanels: int, nb: int, T=None, widest=None) -> None:
        """A factorization of ``F`` begins (``T``: the panels' factors known so far;
        ``widest``: its widest part's columns, which :meth:`_scratch` is sized by;
        default the front's)."""
        self._t0 = time.perf_counter()
        self.pool_peak = 0
        self._marks = [("start", self._timed(self.stream), 0.0)]
        self._nb = int(nb)
        self._fm = int(F.shape[0])
        self._widest = int(F.shape[1] if widest is None else widest)
        self._work = None
        self._blas = None               # the calling thread's handle (:meth:`_update_work`)
        self._scratch_made = False
        with self.stream:
            self._T = (self.cp.zeros((npanels, nb, nb), dtype=F.dtype) if T is None
                       else self.cp.asarray(T))
        self._T_host = None

    def slab_buffer(self, F: np.ndarray, n: int):
        """The slab buffer of ``n`` elements (:func:`slab_buffer_elements`: sized
        once for every slab)."""
        self.slabs += 1
        self._marks.append(("slab", None, 1e3 * (time.perf_counter() - self._t0)))
        buf = self._buffer("slab", int(n), F.dtype)
        self._scratch(F)
        return buf

    def _scratch(self, F: np.ndarray) -> None:
        """One free block in the work stream's share of CuPy's pool, as large as
        a part's workspace at once: a panel of every row (the updates' ``Vᵀ``,
        :class:`_UpdateWork`, or the dense path's panel buffer), the products
        of the updates and the dense path's two work rows per column of the
        widest part (:func:`scratch_bytes`). The parts' workspaces are then cut
        from it and merge back into it. Without it, the panel buffer of each part, taller
        than any before, is a new block that the pool keeps after the part:
        about a panel of every row more per part (CuPy reuses a free block for
        smaller requests only). Made once per factorization, after the slab
        buffer (whose room-making would give it back)."""
        if self._scratch_made:
            return
        self._scratch_made = True
        with self.stream:               # freed at once: kept in that stream's share
            self.cp.empty(scratch_bytes(F.shape[0], self._widest, self._nb, F.itemsize),
                          dtype=np.uint8)

    def upload_part(self, F, buf, at: int, a0: int, a1: int, p0: int, p1: int,
                    rows: int | None = None, cols: int | None = None) -> SlabPart:
        """``F[:rows, a0:a1]`` into ``buf`` from element ``at`` on the parts' stream
        (one 2-D copy), once the work of the earlier slabs' parts that lay there
        is done and the copies back of the parts it overwrites have landed
        (``rows``: the part's staircase, :func:`part_rows`; default every row;
        ``cols``: its rows' length there, default ``a1 - a0``, the pad zeroed
        first)."""
        self.parts += 1
        fm = F.shape[0] if rows is None else int(rows)
        w = a1 - a0
        cols = w if cols is None else int(cols)
        n = fm * cols
        S = buf[at: at + n].reshape(fm, cols)
        for s, e, ev in self._worked + self._regions:
            if s < at + n and at < e:
                self.up_stream.wait_event(ev)
        self._current.append((at, at + n))
        src = self._device_view(F) if self.panel_upload == "mapped-all" else None
        rt = self.cp.cuda.runtime
        if cols > w:                    # the pad: zeros that every update leaves zero
            S.data.memset_async(0, S.nbytes, self.up_stream)
        if src is None and cols == w:
            upload_block(F, 0, fm, a0, a1, S, self.up_stream)
        elif src is None:
            isz = F.itemsize
            rt.memcpy2DAsync(S.data.ptr, cols * isz, F.ctypes.data + a0 * isz, F.strides[0],
                             w * isz, fm, rt.memcpyHostToDevice, self.up_stream.ptr)
        else:
            with self.up_stream:
                self.cp.copyto(S[:, :w], src[:fm, a0:a1])
        self._mark("u", self.up_stream)
        return SlabPart(S, a0, a1, p0, p1, at, self._event(self.up_stream))

    def ready(self, part: SlabPart) -> None:
        """The work stream waits for the part's upload (once)."""
        if part.ready is not None:
            self.stream.wait_event(part.ready)
            part.ready = None

    def upload_panel(self, F: np.ndarray, q: int, r0: int, r1: int, c0: int, c1: int, slot):
        """Panel ``q``'s block into the slot's buffer (one 2-D copy) on the copy
        stream, after the work that read the buffer last and the copy back of
        the part that made the panel; the work stream waits for it."""
        # sized for a panel of every row of the front at once: a staircase front's
        # panels grow in rows, and a buffer grown later waits for every stream
        n = (r1 - r0) * (c1 - c0)
        out = self._buffer(slot, max(n, F.shape[0] * self._nb), F.dtype)[:n]
        out = out.reshape(r1 - r0, c1 - c0)
        read = self._read.pop(slot, None)
        if read is not None:
            self.copy_stream.wait_event(read)
        landed = self._landed.get(q)
        if landed is not None:          # the panel's values are back in F
            self.copy_stream.wait_event(landed)
        src = self._device_view(F) if self.panel_upload != "copy2d" else None
        if src is None:
            upload_block(F, r0, r1, c0, c1, out, self.copy_stream)
        else:
            self.mapped_panels += 1
            with self.copy_stream:
                self.cp.copyto(out, src[r0:r1, c0:c1])
        self.stream.wait_event(self._event(self.copy_stream))
        return out

    def _device_view(self, F: np.ndarray):
        """``F`` as a device array over the same host memory (read over the link
        by kernels), or None where ``F`` is not pinned host memory
        (:func:`~scipy_gpuqr._engine.gpu.mapped.device_view`, once per front)."""
        key = (F.ctypes.data, F.shape, F.strides)
        if self._mapped is None or self._mapped[0] != key:
            self._mapped = (key, device_view(self.cp, F))
        return self._mapped[1]

    def release(self, slot) -> None:
        """The work queued so far is the last to read ``slot``'s buffer."""
        self._read[slot] = self._event(self.stream)

    def t(self, q: int, b: int):
        """Panel ``q``'s ``T`` on the device: nb × nb, T in its leading b × b (the
        layout :meth:`apply`'s GEMMs read)."""
        return self._T[q]

    def apply(self, S, j: int, rows: int, E, i0: int, k0: int, b: int, T) -> None:
        """As :meth:`NumpySlabs.apply` (``T``: :meth:`t`'s): ``Vᵀ`` taken out of the
        block by one kernel into the part's workspace (:class:`_UpdateWork`), then
        the dense path's three GEMMs on the part where it lies
        (:func:`~scipy_gpuqr._engine.dense_front._wy_update`). Four calls and no
        new array per update: a one-slab front has about a hundred updates, each
        queued by the host while the device waits for it."""
        with self.stream:
            work = self._update_work(S.dtype)
            ld = padded(rows, self.row_align)       # Vᵀ's rows, as the part's
            if b * ld > work.Vt.size:
                ld = rows
            Vt = work.Vt[:b * ld].reshape(b, ld)[:, :rows]
            unit_triangle(E[i0:i0 + rows, k0:k0 + b].T, lower=False, out=Vt)
            _wy_update(work, S, j, rows, b, Vt, T, 0, S.shape[1], ldv=ld)

    def _update_work(self, dtype) -> _UpdateWork:
        """The updates' workspace (:class:`_UpdateWork`), taken from the work
        stream's share of the pool (the scratch block) at a part's first update
        and given back before its own panels are factorized (:meth:`factorize`),
        whose workspace is cut from the same block."""
        if self._work is None:
            if self._blas is None:
                self._blas = _Cublas(self.cp, dtype)
            self._work = _UpdateWork(self.cp, self._blas, dtype, self._fm, self._widest,
                                     self._nb)
        return self._work

    def factorize(self, S, a0: int, panels: list, p0: int) -> None:
        self._work = None               # its block goes to the part's own workspace
        with self.stream:
            Td = factorize_cupy(S[a0:], panels, self._T.shape[1], stream=self.stream)
            self._T[p0:p0 + len(panels)] = Td

    def download(self, part: SlabPart, F: np.ndarray, piece: tuple | None = None) -> None:
        """The worked part back into ``F[:rows, a0:a1]`` (its rows) on the downloads'
        stream after the work queued so far (its check for non-finite values first),
        or its ``piece`` ``(c0, c1, q0, q1)`` (as :meth:`NumpySlabs.download`; the
        whole part checked with its last piece)."""
        S, isz = part.S, F.itemsize
        c0, c1, q0, q1 = (part.a0, part.a1, part.p0, part.p1) if piece is None else piece
        rt = self.cp.cuda.runtime
        last = c1 == part.a1            # the part's last piece: every value final
        if last:
            self._flags.append(finite_check(S.dtype).enqueue(S, self.stream))
        self.down_stream.wait_event(self._event(self.stream))
        rt.memcpy2DAsync(F.ctypes.data + c0 * isz, F.shape[1] * isz,
                         S.data.ptr + (c0 - part.a0) * isz, S.shape[1] * isz, (c1 - c0) * isz,
                         S.shape[0], rt.memcpyDeviceToHost, self.down_stream.ptr)
        landed = self._event(self.down_stream)
        self._mark("d", self.down_stream)
        if last:
            self._regions.append((part.at, part.at + S.size, landed))
        for q in range(q0, q1):
            self._landed[q] = landed
        if self.on_part is not None:
            self.on_part(c0, c1, landed)

    def end_slab(self) -> None:
        """The slab's parts are read by no work queued later."""
        ev = self._event(self.stream)
        self._worked.extend((s, e, ev) for s, e in self._current)
        self._current = []

    def finish(self) -> None:
        """Every queued copy done, the panels' ``T`` fetched; the buffers given back
        to the device, not only to CuPy's pool: a slab buffer is most of the
        device, and a cached block that later small arrays are cut from stays
        taken as a whole until all of them are freed (the solves' uploads would
        find no room)."""
        try:
            self._sync()
            if self._T is not None:
                self._T_host = self._T.get(stream=self.stream)
            if len(self._marks) > 1:
                self.last_timeline = self.timeline()
                logging.getLogger("scipy_gpuqr").debug(
                    "slabs, ms from the start (device:host queued): %s; pool at most %d bytes",
                    self.last_timeline, self.pool_peak)
        finally:
            self._work = None
            self._buffers.clear()
            self._read.clear()
            self._landed.clear()
            self._regions, self._worked, self._current = [], [], []
            self._marks = []
            self._mapped = None
            self._T = None
            self.cp.get_default_memory_pool().free_all_blocks()

    def t_host(self) -> np.ndarray:
        """Every panel's ``T`` on the host (after :meth:`finish`)."""
        if self._T is not None:
            self.finish()
        return self._T_host

    def all_finite(self) -> bool:
        """Whether every part sent back so far held finite values only (after
        :meth:`finish`)."""
        return not any(int(f.get(stream=self.stream)[0]) for f in self._flags)
