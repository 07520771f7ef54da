"""Tile kernels (Factorize, Apply, Apply+Factorize) against the NumPy executor.

GPU tests (marker ``gpu``): a front's bucket schedule runs launch by launch on
the GPU and in NumPy from the same fresh random data; after every launch the
front pools and the VT tiles must agree. The VT pool starts poisoned (NaN).
Every float64 variant the engine launches is tested, with every Apply variant
(``factorize_kernels.APPLY_VARIANTS``: scalar loops, FP64 tensor cores, and the
tensor-core Apply with the lean Factorize); a launch
on a grid that cuts Apply records and the Apply of Apply+Factorize records into
pieces (``gridDim.y``) must leave the same bits as one block per record.
"""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import factorize_kernels as variants
from scipy_gpuqr._engine.host.simulate import execute_launches
from scipy_gpuqr._schedule import bucket

#: (TILE, BUNDLE, threads) of the engine's float64 uberkernel variants.
FLOAT64_VARIANTS = [(t, b, n, a) for c, t, b, n in variants.ENGINE_VARIANTS if c == "double"
                    for a in sorted(set(variants.APPLY_VARIANTS.values()))]

EPS = np.finfo(float).eps


def _kernel(tile, bund, threads, apply):
    from scipy_gpuqr._kernels import load_module
    mod = load_module(variants.UBERKERNEL_FILE, variants.KERNEL_VARIANTS[variants.UBERKERNEL_FILE])
    k = mod.get_function(variants.kernel_name("double", tile, bund, threads, apply))
    smem = variants.tile_smem_bytes(tile, bund, apply=apply)
    k.max_dynamic_shared_size_bytes = smem
    return k, smem, mod


def _none_args():
    """S entries and maps are unused by the tile tasks: one-element stand-ins."""
    import cupy as cp
    return cp.zeros(1, cp.int64), cp.zeros(1, cp.float64), cp.zeros(1, cp.int64)


def _launch(kern, smem, threads, tasks, F, VT):
    import cupy as cp
    if len(tasks) == 0:
        return
    d = cp.asarray(np.ascontiguousarray(tasks).view(np.uint8))
    kern((len(tasks),), (threads,), (d, F, VT, *_none_args()), shared_mem=smem)


def _check_smem_formula(mod, tile, bund, apply):
    import cupy as cp
    out = cp.zeros(1, dtype=cp.int64)
    mod.get_function(variants.smem_kernel_name("double", tile, bund, apply))((1,), (1,), (out,))
    assert int(out[0]) == variants.tile_smem_bytes(tile, bund, apply=apply)


def _front(rng, fm, fn, staircase):
    A = rng.standard_normal((fm, fn))
    stair = None
    if staircase:
        lead = np.sort(rng.integers(0, fn, fm))
        lead[: min(fm, fn) // 3] = 0
        A[np.arange(fn)[None, :] < lead[:, None]] = 0.0
        stair = np.searchsorted(lead, np.arange(fn), side="right")
    return A, stair


CASES = [(500, 300, False), (1000, 64, False), (64, 700, False), (333, 200, True),
         (1, 1, False), (97, 33, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FLOAT64_VARIANTS)
@pytest.mark.parametrize("pipelining", [False, True])
def test_tile_kernels_match_numpy_launch_by_launch(variant, pipelining):
    import cupy as cp
    tile, bund, threads, apply = variant
    kern, smem, mod = _kernel(tile, bund, threads, apply)
    _check_smem_formula(mod, tile, bund, apply)
    rng = np.random.default_rng()
    for fm, fn, stair_on in CASES:
        A, stair = _front(rng, fm, fn, stair_on)
        tasks, launch, nvt = bucket.dense_front_tasks(fm, fn, None, stair, tile=tile,
                                                      bundle=bund, pipelining=pipelining)
        Fc = A.ravel().copy()
        VTc = np.full(max(nvt, 1) * tile * tile, np.nan)
        Fg = cp.asarray(Fc)
        VTg = cp.full(VTc.shape, cp.nan)
        tol = 100 * max(fm, fn) * EPS * max(np.abs(A).max(), 1.0)
        for L in range(int(launch[-1]) + 1 if len(launch) else 0):
            sel = tasks[launch == L]
            _launch(kern, smem, threads, sel, Fg, VTg)
            execute_launches(sel, np.zeros(len(sel), np.int32), Fc, VTc, tile)
            got = cp.asnumpy(Fg)
            assert np.isfinite(got).all(), (fm, fn, L)
            assert np.abs(got - Fc).max() <= tol, (fm, fn, L, np.abs(got - Fc).max())
            gv = cp.asnumpy(VTg)
            both = np.isfinite(VTc)
            assert (np.isfinite(gv) == both).all(), (fm, fn, L)
            assert np.abs(gv[both] - VTc[both]).max(initial=0.0) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FLOAT64_VARIANTS)
@pytest.mark.parametrize("pipelining", [False, True])
def test_tile_kernels_keep_q_orthogonal_with_tiny_columns(variant, pipelining):
    # columns of 1e-160 (squares below the normal range) and 1e160 (squares
    # overflow): the norm is rescaled (NormRange), so every reflector stays
    # orthogonal and ‖R x‖ = ‖A x‖ holds for the normal-sized columns
    import cupy as cp
    tile, bund, threads, apply = variant
    kern, smem, _ = _kernel(tile, bund, threads, apply)
    rng = np.random.default_rng()
    fm, fn = 300, 200
    A = rng.standard_normal((fm, fn))
    tiny, huge = np.arange(3, 120, 7), np.arange(5, 120, 11)
    A[:, tiny] *= 1e-160
    A[:, huge] *= 1e160
    tasks, launch, nvt = bucket.dense_front_tasks(fm, fn, None, None, tile=tile,
                                                  bundle=bund, pipelining=pipelining)
    Fg = cp.asarray(A.ravel())
    VTg = cp.full(max(nvt, 1) * tile * tile, cp.nan)
    for L in range(int(launch[-1]) + 1):
        _launch(kern, smem, threads, tasks[launch == L], Fg, VTg)
    R = np.triu(cp.asnumpy(Fg).reshape(fm, fn)[:fn])
    assert np.isfinite(R).all()
    X = rng.standard_normal((fn, 4))
    X[np.concatenate([tiny, huge])] = 0.0
    rel = np.abs(np.linalg.norm(R @ X, axis=0) / np.linalg.norm(A @ X, axis=0) - 1)
    assert rel.max() <= 1e3 * EPS
    # and the kernels agree with the NumPy executor, column by column
    Fc, VTc = A.ravel().copy(), np.full(max(nvt, 1) * tile * tile, np.nan)
    execute_launches(tasks, launch, Fc, VTc, tile)
    Rc = np.triu(Fc.reshape(fm, fn)[:fn])
    scale = np.linalg.norm(A, axis=0)
    assert (np.linalg.norm(R - Rc, axis=0) <= 1e3 * EPS * scale).all()


# -- Apply records cut into pieces (a launch on a grid of gridDim.y > 1) ---------------

def _pieces_of(tasks, s, tile):
    """The records with every Apply record replaced by its ``s`` pieces
    (``tasks.apply_piece_columns``; empty pieces dropped) and every
    Apply+Factorize record by its piece 0 (the Apply of the column tile it
    factorizes, then the Factorize) and Apply records of its other column tiles
    cut into ``s - 1`` pieces: the work of a launch on a grid of ``s`` blocks
    per record, written as records (mirror of the kernel's
    ``apply_factorize_piece_columns``)."""
    from scipy_gpuqr._schedule.tasks import TaskType, apply_piece_columns
    out = []

    def add_pieces(rec, c0, c1, n):
        a, b = apply_piece_columns(c0, c1, np.arange(n), n, tile)
        for x, y in zip(np.atleast_1d(a).tolist(), np.atleast_1d(b).tolist()):
            if y > x:
                p = rec.copy()
                p["type"] = TaskType.APPLY
                p["c0"], p["c1"] = x, y
                out.append(p)

    for rec in tasks:
        if s == 1 or rec["type"] not in (TaskType.APPLY, TaskType.APPLY_FACTORIZE):
            out.append(rec)
        elif rec["type"] == TaskType.APPLY:
            add_pieces(rec, int(rec["c0"]), int(rec["c1"]), s)
        else:
            first = rec.copy()
            first["c1"] = min(int(rec["c0"]) + tile, int(rec["c1"]))
            out.append(first)
            add_pieces(rec, int(rec["c0"]) + tile, int(rec["c1"]), s - 1)
    return np.array(out, dtype=tasks.dtype)


def test_pieces_model_cuts_apply_factorize_records_after_their_factorized_tile():
    # the model itself: an Apply+Factorize record keeps its first column tile (and
    # its Factorize), its other tiles become Apply records, every column once
    from scipy_gpuqr._schedule.tasks import TaskType, empty_tasks
    tile = 32
    recs = empty_tasks(2)
    recs["type"] = [TaskType.APPLY_FACTORIZE, TaskType.APPLY]
    recs["c0"], recs["c1"] = [64, 0], [64 + 5 * tile - 7, 3 * tile]
    recs["vt"], recs["vt2"] = [5, 5], [9, 9]
    for s in (2, 3, 4, 8):
        cut = _pieces_of(recs, s, tile)
        af = cut[cut["type"] == TaskType.APPLY_FACTORIZE]
        assert len(af) == 1 and (af["c0"][0], af["c1"][0]) == (64, 96)
        assert af["vt2"][0] == 9
        app = cut[cut["type"] == TaskType.APPLY]
        from_af = app[app["c0"] >= 96]
        cols = np.concatenate([np.arange(a, b) for a, b in zip(from_af["c0"], from_af["c1"])])
        assert np.array_equal(np.sort(cols), np.arange(96, 64 + 5 * tile - 7))
        assert ((from_af["c0"] - 64) % tile == 0).all()
        assert len(from_af) == min(s - 1, 4)
    assert np.array_equal(_pieces_of(recs, 1, tile), recs)


def test_numpy_executor_gives_the_same_front_for_apply_pieces():
    # the NumPy model of the cut: every column updated once, with the same reflector
    rng = np.random.default_rng(3)
    tile = 32
    for fm, fn, stair_on in [(500, 600, False), (333, 700, True)]:
        A, stair = _front(rng, fm, fn, stair_on)
        tasks, launch, nvt = bucket.dense_front_tasks(fm, fn, None, stair, tile=tile,
                                                      bundle=3, pipelining=True)
        F1, V1 = A.ravel().copy(), np.full(max(nvt, 1) * tile * tile, np.nan)
        F2, V2 = F1.copy(), V1.copy()
        for L in range(int(launch[-1]) + 1):
            sel = tasks[launch == L]
            execute_launches(sel, np.zeros(len(sel), np.int32), F1, V1, tile)
            cut = _pieces_of(sel, 2 + L % 7, tile)
            execute_launches(cut, np.zeros(len(cut), np.int32), F2, V2, tile)
        assert np.abs(F1 - F2).max() <= 100 * max(fm, fn) * EPS * np.abs(A).max()
        assert np.array_equal(np.isnan(V1), np.isnan(V2))


def test_resident_blocks_and_the_split_setting():
    from scipy_gpuqr._engine.gpu import device
    h200 = {"multiProcessorCount": 132, "maxThreadsPerMultiProcessor": 2048,
            "sharedMemPerMultiprocessor": 233472, "regsPerMultiprocessor": 65536,
            "maxBlocksPerMultiProcessor": 32}
    smem = variants.tile_smem_bytes(32, 3, 8, apply=4)
    assert device.resident_blocks(h200, 256, smem, 80) == 132 * 3
    assert device.resident_blocks(h200, 256, 1024, 32) == 132 * 8        # by threads
    assert device.resident_blocks(h200, 256, 1024, 128) == 132 * 2       # by registers
    assert device.resident_blocks(h200, 256, 300000, 80) == 132           # at least one
    assert device.resident_blocks({"multiProcessorCount": 4}, 256, 1024, 0) == 4 * 8
    assert device.apply_split_setting({}) == (device.APPLY_SPLIT_MAX, device.APPLY_SPLIT_FILL)
    assert device.apply_split_setting({device.ENV_APPLY_SPLIT: "8"}) == (8, device.APPLY_SPLIT_FILL)
    assert device.apply_split_setting({device.ENV_APPLY_SPLIT: "4:2"}) == (4, 2.0)
    assert device.apply_split_setting({device.ENV_APPLY_SPLIT: "0"})[0] == 1
    for bad in ("x", "4:0", "4:y"):
        with pytest.raises(ValueError):
            device.apply_split_setting({device.ENV_APPLY_SPLIT: bad})


def test_a_launch_of_wide_apply_factorize_records_is_cut():
    # the tail launches hold Apply+Factorize records only: their Apply is cut as an
    # Apply record's (min(tiles, s) pieces with work); one tile each: no cut
    from scipy_gpuqr._schedule.tasks import TaskType, apply_split, empty_tasks
    t = empty_tasks(20)
    t["type"] = TaskType.APPLY_FACTORIZE
    t["c0"], t["c1"] = 64, 64 + 16 * 32
    assert apply_split(t["type"], t["c0"], t["c1"], 396, 8) == 8
    assert apply_split(t["type"], t["c0"], t["c1"], 396, 1) == 1
    assert apply_split(t["type"], t["c0"], t["c1"], 60, 8) == 4          # 20 * 4 >= 60
    t["c1"] = 64 + 20
    assert apply_split(t["type"], t["c0"], t["c1"], 396, 8) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FLOAT64_VARIANTS)
def test_apply_pieces_on_the_gpu_match_whole_records_bit_for_bit(variant):
    # a launch on a grid of s blocks per record (Apply records cut into s pieces,
    # Apply+Factorize records' Apply likewise after the tile they factorize, the other
    # records in the blocks of y = 0) leaves the same bits as one block per record
    import cupy as cp
    tile, bund, threads, apply = variant
    kern, smem, _ = _kernel(tile, bund, threads, apply)
    rng = np.random.default_rng()
    for fm, fn, stair_on in [(700, 600, False), (333, 700, True), (97, 33, False)]:
        A, stair = _front(rng, fm, fn, stair_on)
        tasks, launch, nvt = bucket.dense_front_tasks(fm, fn, None, stair, tile=tile,
                                                      bundle=bund, pipelining=True)
        F1, F2 = cp.asarray(A.ravel()), cp.asarray(A.ravel())
        V1 = cp.full(max(nvt, 1) * tile * tile, cp.nan)
        V2 = V1.copy()
        for L in range(int(launch[-1]) + 1):
            sel = tasks[launch == L]
            if len(sel) == 0:
                continue
            s = (2, 3, 4, 8, 16, 1)[L % 6]
            d = cp.asarray(np.ascontiguousarray(sel).view(np.uint8))
            kern((len(sel),), (threads,), (d, F1, V1, *_none_args()), shared_mem=smem)
            kern((len(sel), s), (threads,), (d, F2, V2, *_none_args()), shared_mem=smem)
            assert cp.array_equal(F1, F2), (fm, fn, L, s)
            assert bool(cp.all((V1 == V2) | (cp.isnan(V1) & cp.isnan(V2)))), (fm, fn, L, s)
