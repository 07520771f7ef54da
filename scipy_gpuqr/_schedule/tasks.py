"""The task record: the only thing the CPU schedulers and the GPU kernel share.

One task is a fixed-size, 96-byte record (:data:`TASK_DTYPE`); the same
struct is declared in ``kernels/gpuqr_task.cuh`` and a test compiles
``static_assert`` lines generated from this dtype with NVRTC, so the two
layouts cannot drift. Every launch of the uberkernel runs one array of such
records, one thread block per record, and no record depends on another of
the same launch.

Memory the records point into (all offsets are 64-bit *element* offsets):

* the **front pool** ``F``: every front of a stage, row-major, ``fm × fn``
  with leading dimension ``fn`` (contribution blocks carried over from an
  earlier stage are stored in the same pool);
* the **VT pool**: ``TILE × TILE`` tiles, row-major. After a Factorize, the
  tile holds the compact-WY ``T`` (upper triangle, diagonal included) and the
  strictly lower part of the top row tile's Householder vectors ``V1``
  (unit diagonal, not stored). Only the first ``nref`` columns are used.
* the **S entries** (int64 index relative to the front base, float value);
* the **maps** Rimap and Rjmap (int64), and the right-hand-side pool of the
  Householder-keeping solve.

Row tiles are named by the element index of their first row (``rows[k]``,
``-1`` for an empty slot), so nothing here assumes a tile size: ``TILE`` is
a tunable shared by the schedule and the kernel build.

Fields (by task type; unlisted fields are 0):

==========  ===============================================================
field       meaning
==========  ===============================================================
F           front base offset in the front pool (Pack-Assemble: the parent)
vt          VT tile offset written by Factorize, read by Apply / ApplyQt;
            S-Assemble: first S entry (of the stage's S slice);
            Pack-Assemble: child CB base offset
vt2         Apply+Factorize: the VT tile the factorize part writes;
            S-Assemble: end of the S entries; Pack-Assemble: Rimap offset
aux         Pack-Assemble: Rjmap offset; ApplyQt: offset of the front's row
            map (the global row slot of each front row) in the replay plan's
            ``rowmap``; Apply+Factorize: reflectors of the factorize part (its
            column tile starts at ``c0``)
type        one of :class:`TaskType`
fm, fn      rows and columns of the front (``fn`` = leading dimension);
            Pack-Assemble: ``fn`` is the parent's leading dimension
col         first column of the factorized / Householder column tile
            (Pack-Assemble: the child CB's leading dimension)
c0, c1      Apply: columns ``[c0, c1)`` receive the block reflector;
            Pack-Assemble: child CB columns ``[c0, c1)``; ApplyQt: unused
            (the right-hand-side columns are the launch's)
nref        number of reflectors of the column tile (≤ TILE): the first
            ``nref`` columns of the tile are eliminated, the rest only updated
front      front index (diagnostics and statistics; unused by kernels)
napply      Apply / Apply+Factorize / ApplyQt: row slots ``rows[0:napply]``
            hold the bundle the reflector acts on (slot 0 = top tile whose
            ``V1`` lives in the VT tile)
nfrows      Factorize: row slots ``rows[fstart:fstart+nfrows]`` are the
            bundle to factorize; Pack-Assemble: ``rows[0], rows[1]`` = child CB rows
            ``[r0, r1)`` and ``nfrows`` = 1 when only the upper trapezoid
            (``cj ≥ ci`` relative to the CB) is copied
fstart      first row slot of the factorize part (0 for Factorize, 1 for
            Apply+Factorize: the old top tile stays behind)
flags       bit k set: row slot k (of ``rows``) is upper triangular in the
            factorize column tile (a hint; kernels may ignore it)
ftop        the slot of ``rows`` holding the factorize part's top tile (it
            keeps R; its V1 goes to the VT tile); the other slots' V stays
            in the front, in the factorize column tile
rows        up to :data:`MAX_SLOTS` row-tile starts (element rows), -1 empty
==========  ===============================================================
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["TaskType", "TASK_DTYPE", "TASK_BYTES", "MAX_SLOTS",
           "MAX_BUNDLE", "DEFAULT_TILE", "DEFAULT_BUNDLE",
           "DEFAULT_APPLY_GRANULE", "empty_tasks", "c_struct_asserts",
           "apply_piece_columns", "apply_split", "FACTORIZE_COST", "record_costs",
           "longest_first", "RECORD_BYTES", "take_records", "join_records", "applies",
           "factorizes", "record_launches"]

#: Default tile edge (a tunable: nothing may assume 32).
DEFAULT_TILE = 32
#: Default number of row tiles per bundle.
DEFAULT_BUNDLE = 3
#: Column tiles updated by one Apply task (coarser tasks, fewer records).
DEFAULT_APPLY_GRANULE = 16
#: Largest bundle the record can describe.
MAX_BUNDLE = 5
#: Row slots per record: an Apply+Factorize holds the old top tile, the
#: rest of its bundle and the delta tiles (at most ``BUNDLE + 1`` rows).
MAX_SLOTS = 6


class TaskType(enum.IntEnum):
    """Task types (the kernel's ``switch``)."""

    NONE = 0
    FACTORIZE = 1
    APPLY = 2
    APPLY_FACTORIZE = 3
    S_ASSEMBLE = 4
    PACK_ASSEMBLE = 5
    #: Apply the reflector of one Factorize to the front's gathered rhs
    #: (the Householder-keeping solve, Qᵀb).
    APPLY_QT = 6


_FIELDS = [
    ("F", np.int64), ("vt", np.int64), ("vt2", np.int64), ("aux", np.int64),
    ("type", np.int32), ("fm", np.int32), ("fn", np.int32), ("col", np.int32),
    ("c0", np.int32), ("c1", np.int32), ("nref", np.int32), ("front", np.int32),
    ("napply", np.int16), ("nfrows", np.int16), ("fstart", np.int16),
    ("flags", np.int8), ("ftop", np.int8),
    ("rows", np.int32, (MAX_SLOTS,)),
]

#: The task record (aligned, fixed size; see the module docstring).
TASK_DTYPE = np.dtype(_FIELDS, align=True)
#: Bytes per record.
TASK_BYTES = TASK_DTYPE.itemsize

assert TASK_BYTES == 96, TASK_BYTES  # the layout is part of the contract


def empty_tasks(n: int) -> np.ndarray:
    """``n`` zeroed records with every row slot empty (-1)."""
    out = np.zeros(n, dtype=TASK_DTYPE)
    out["rows"] = -1
    return out


#: A record as one opaque item of :data:`TASK_BYTES`: records taken, reordered or
#: joined whole (NumPy copies a structured array field by field, several times
#: slower).
RECORD_BYTES = np.dtype((np.void, TASK_BYTES))


def take_records(records: np.ndarray, index) -> np.ndarray:
    """``records[index]`` (contiguous records), each record moved as one item."""
    return records.view(RECORD_BYTES)[index].view(TASK_DTYPE)


def join_records(parts) -> np.ndarray:
    """The records of ``parts`` (arrays of TASK_DTYPE) one after the other, each
    record moved as one item."""
    return np.concatenate([np.ascontiguousarray(p, dtype=TASK_DTYPE).view(RECORD_BYTES)
                           for p in parts]).view(TASK_DTYPE)


def record_launches(launch_ptr) -> np.ndarray:
    """The launch of each record of consecutive launches (int64, in record order):
    records of launch k are ``records[launch_ptr[k]:launch_ptr[k + 1]]``."""
    lp = np.asarray(launch_ptr, dtype=np.int64)
    return np.repeat(np.arange(len(lp) - 1, dtype=np.int64), np.diff(lp))


def applies(types) -> np.ndarray:
    """Which record types apply reflectors: Apply and Apply+Factorize (bool)."""
    types = np.asarray(types)
    return (types == TaskType.APPLY) | (types == TaskType.APPLY_FACTORIZE)


def factorizes(types) -> np.ndarray:
    """Which record types make reflectors (Q's replay keeps them): Factorize and
    Apply+Factorize (bool)."""
    types = np.asarray(types)
    return (types == TaskType.FACTORIZE) | (types == TaskType.APPLY_FACTORIZE)


_C_TYPES = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int",
            np.dtype(np.int16): "short", np.dtype(np.int8): "signed char"}


def c_struct_asserts(struct: str = "gpuqr::Task") -> str:
    """C++ ``static_assert`` lines checking the kernel struct against the dtype.

    Compiled with NVRTC by the tests, so a change on one side only fails.
    """
    lines = [f"static_assert(sizeof({struct}) == {TASK_BYTES}, \"Task size\");"]
    for name in TASK_DTYPE.names:
        sub, off = TASK_DTYPE.fields[name][:2]
        base = sub.base if sub.shape else sub
        ctype = _C_TYPES[np.dtype(base)]
        lines.append(f"static_assert(__builtin_offsetof({struct}, {name}) == {off}, "
                     f"\"offset of {name}\");")
        lines.append(f"static_assert(sizeof((({struct}*)0)->{name}) == {sub.itemsize}, "
                     f"\"size of {name}\");")
        member = f"(({struct}*)0)->{name}" + ("[0]" if sub.shape else "")
        lines.append(f"static_assert(sizeof({member}) == sizeof({ctype}), "
                     f"\"type of {name}\");")
    for t in TaskType:
        lines.append(f"static_assert((int)gpuqr::TASK_{t.name} == {int(t)}, "
                     f"\"TaskType {t.name}\");")
    lines.append(f"static_assert(GPUQR_MAX_SLOTS == {MAX_SLOTS}, \"MAX_SLOTS\");")
    lines.append(f"static_assert(GPUQR_MAX_BUNDLE == {MAX_BUNDLE}, \"MAX_BUNDLE\");")
    return "\n".join(lines) + "\n"


def apply_piece_columns(c0, c1, piece, pieces: int, tile: int = DEFAULT_TILE):
    """Columns ``[a, b)`` of an Apply record that piece ``piece`` of ``pieces`` updates.

    The uberkernel may run a launch on a grid of ``pieces`` blocks per record
    (``gridDim.y``): an Apply record's column tiles (``tile`` wide from ``c0``,
    the last one clipped at ``c1``) are cut into ``pieces`` runs of near-equal
    length, one block each, so that chunks stay aligned to ``c0`` and every
    column gets the arithmetic of the whole record. Mirror of the kernel's
    ``apply_piece_columns`` (``kernels/sparse_qr/apply.cuh``).

    Parameters
    ----------
    c0, c1 : int or ndarray of int
        The record's columns ``[c0, c1)``.
    piece : int or ndarray of int
        ``0 <= piece < pieces``.
    pieces : int
    tile : int

    Returns
    -------
    (a, b) : int or ndarray of int64
        ``a >= b`` when the piece is empty (fewer tiles than pieces).
    """
    c0 = np.asarray(c0, dtype=np.int64)
    c1 = np.asarray(c1, dtype=np.int64)
    piece = np.asarray(piece, dtype=np.int64)
    nt = np.where(c1 > c0, -(-(c1 - c0) // tile), 0)
    t0 = piece * nt // pieces
    t1 = (piece + 1) * nt // pieces
    return c0 + t0 * tile, np.minimum(c0 + t1 * tile, c1)


def apply_split(types, c0, c1, slots: int, max_split: int, tile: int = DEFAULT_TILE) -> int:
    """Pieces per Apply record (the uberkernel's ``gridDim.y``) for one launch.

    A launch lasts at least as long as its longest record; an Apply record
    updates up to :data:`DEFAULT_APPLY_GRANULE` column tiles one after the
    other, so a launch of fewer records than the device runs at once (its
    ``slots``: SMs times resident blocks each) is a chain of those tiles with
    part of the device idle. Cutting every Apply record (and an Apply+Factorize
    record's Apply) into pieces (
    :func:`apply_piece_columns`) gives the idle blocks work; each piece
    reloads the record's ``V`` and ``T``, so a launch that fills the device
    already is not cut. The answer is the smallest power of two (at most
    ``max_split``) whose pieces with work, with the launch's other records,
    reach ``slots`` (1: not cut); the doubling stops once the widest Apply
    record has at most one tile a piece.

    Parameters
    ----------
    types, c0, c1 : ndarray
        The launch's records' ``type``, ``c0``, ``c1`` fields.
    slots : int
        Thread blocks the device runs at once.
    max_split : int
        Most pieces per record (1: never cut).
    tile : int

    Returns
    -------
    int
    """
    n = len(types)
    if max_split <= 1 or n >= slots or n == 0:
        return 1
    # an Apply+Factorize record's Apply is cut too (the tile it factorizes in piece 0,
    # its other tiles in the rest): min(tiles, s) pieces with work, as an Apply's
    # (called for every launch on the engine's thread: few NumPy calls)
    app = applies(types)
    napp = int(np.count_nonzero(app))
    if not napp:
        return 1
    w = np.asarray(c1, dtype=np.int64)[app] - np.asarray(c0, dtype=np.int64)[app]
    nt = np.maximum(-(-w // tile), 0)
    widest = int(nt.max())
    other = n - napp
    s = 1
    while s < max_split and s < widest:
        s = min(2 * s, max_split)
        if other + int(np.minimum(nt, s).sum()) >= slots:
            break
    return s


#: A Factorize part's cost in :func:`record_costs`' unit (an Apply's column tile
#: over one row tile): its columns run one after the other, each with a pass over
#: the bundle and three barriers, so a 32-column Factorize takes about as long as
#: an Apply of 32 column tiles over a bundle of 3 row tiles.
FACTORIZE_COST = 96


def record_costs(records, tile: int = DEFAULT_TILE) -> np.ndarray:
    """Estimated time of each record in one block, in Apply column tiles times row
    tiles: an Apply's (an Apply+Factorize's Apply) ``ceil((c1 - c0) / tile) *
    napply``, plus :data:`FACTORIZE_COST` for a Factorize part; 0 for the
    assembly records (int64)."""
    ty = np.asarray(records["type"], dtype=np.int64)
    tiles = np.maximum(-(-(records["c1"].astype(np.int64) - records["c0"]) // tile), 0)
    app, fac = applies(ty), factorizes(ty)
    return (np.where(app, tiles * records["napply"].astype(np.int64), 0)
            + np.where(fac, FACTORIZE_COST, 0))


def longest_first(records, launch_ptr, tile: int = DEFAULT_TILE) -> np.ndarray:
    """The order that puts each launch's records by :func:`record_costs`, longest
    first (stable: records of equal cost, the assembly records among them, keep
    their order).

    The GPU starts a launch's thread blocks about in the order of their records,
    and a launch ends with its last record: records started last should be the
    short ones, so that the long ones (Apply+Factorize records of 16 column
    tiles, Factorize records) do not start late and hold the launch open. No
    record of a launch depends on another, so any order gives the same results.

    Parameters
    ----------
    records : ndarray of TASK_DTYPE
        Records of consecutive launches.
    launch_ptr : array of int
        Records of launch k are ``records[launch_ptr[k]:launch_ptr[k + 1]]``
        (``launch_ptr[0] == 0``, ``launch_ptr[-1] == len(records)``).
    tile : int

    Returns
    -------
    ndarray of int64
        A permutation of ``range(len(records))`` that moves records only within
        their launch.
    """
    launch = record_launches(launch_ptr)
    cost = record_costs(records, tile)
    top = int(cost.max(initial=0)) + 1
    return np.argsort(launch * top + (top - 1 - cost), kind="stable")
