"""Tile kernels (Factorize, Apply, Apply+Factorize) against the NumPy executor.

GPU tests (marker ``gpu``): a front's bucket schedule runs launch by launch on
the GPU and in NumPy from the same fresh random data; after every launch the
front pools and the VT tiles must agree. The VT pool starts poisoned (NaN).

Run as a script on the GPU machine for the TILE 32 vs 64 throughput table::

    python3 tests/test_gpu_tiles.py --json $OUT/tiles.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pytest

from scipy_gpuqr._engine.gpu import factorize_kernels as variants
from scipy_gpuqr._engine.host.simulate import execute_launches
from scipy_gpuqr._schedule import bucket
from scipy_gpuqr._schedule.tasks import TaskType, empty_tasks

EPS = np.finfo(float).eps


def _kernel(tile, bund, threads):
    from scipy_gpuqr._kernels import load_module
    mod = load_module(variants.UBERKERNEL_FILE, variants.KERNEL_VARIANTS[variants.UBERKERNEL_FILE])
    k = mod.get_function(variants.tile_kernel_name(tile, bund, threads))
    smem = variants.tile_smem_bytes(tile, bund)
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


def _check_smem_formula(mod, tile, bund):
    import cupy as cp
    out = cp.zeros(1, dtype=cp.int64)
    mod.get_function(variants.smem_kernel_name("double", tile, bund))((1,), (1,), (out,))
    assert int(out[0]) == variants.tile_smem_bytes(tile, bund)


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
@pytest.mark.parametrize("variant", variants.TILE_VARIANTS)
@pytest.mark.parametrize("pipelining", [False, True])
def test_tile_kernels_match_numpy_launch_by_launch(variant, pipelining):
    import cupy as cp
    tile, bund, threads = variant
    kern, smem, mod = _kernel(tile, bund, threads)
    _check_smem_formula(mod, tile, bund)
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
@pytest.mark.parametrize("variant", variants.TILE_VARIANTS)
@pytest.mark.parametrize("pipelining", [False, True])
def test_tile_kernels_keep_q_orthogonal_with_tiny_columns(variant, pipelining):
    # columns of 1e-160 (squares below the normal range) and 1e160 (squares
    # overflow): the norm is rescaled (NormRange), so every reflector stays
    # orthogonal and ‖R x‖ = ‖A x‖ holds for the normal-sized columns
    import cupy as cp
    tile, bund, threads = variant
    kern, smem, _ = _kernel(tile, bund, threads)
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


# ---------------------------------------------------------------- throughput

def _throughput(tile, bund, threads, nfront=8, fm=4096, fn=1024, reps=10):
    """GF/s of a launch of Factorize tasks and of a launch of Apply tasks."""
    import cupy as cp
    kern, smem, _ = _kernel(tile, bund, threads)
    nrt, nct = fm // tile, fn // tile
    nb = nrt // bund
    # Factorize: every (bundle, column tile) pair of every front is independent
    fac = empty_tasks(nfront * nb * nct)
    k = 0
    for f in range(nfront):
        for b in range(nb):
            for c in range(nct):
                r = fac[k]
                r["type"], r["F"], r["fm"], r["fn"] = TaskType.FACTORIZE, f * fm * fn, fm, fn
                r["col"], r["nref"], r["nfrows"], r["fstart"], r["ftop"] = c * tile, tile, bund, 0, 0
                r["rows"][:bund] = [(b * bund + q) * tile for q in range(bund)]
                r["vt"] = k * tile * tile
                k += 1
    # Apply: the reflector of column tile 0 to the columns right of it, 512 per task
    gran = 512
    app = []
    for f in range(nfront):
        for b in range(nb):
            vt = ((f * nb + b) * nct) * tile * tile
            for c0 in range(tile, fn, gran):
                r = empty_tasks(1)[0]
                r["type"], r["F"], r["fm"], r["fn"] = TaskType.APPLY, f * fm * fn, fm, fn
                r["col"], r["nref"], r["napply"] = 0, tile, bund
                r["rows"][:bund] = [(b * bund + q) * tile for q in range(bund)]
                r["vt"], r["c0"], r["c1"] = vt, c0, min(c0 + gran, fn)
                app.append(r)
    app = np.array(app, dtype=fac.dtype)
    rng = np.random.default_rng()
    F = cp.asarray(rng.standard_normal(nfront * fm * fn))
    VT = cp.zeros(len(fac) * tile * tile)
    m = bund * tile
    fl_fac = len(fac) * 2.0 * tile * tile * (m - tile / 3.0)
    fl_app = float(sum(4.0 * m * tile * (int(r["c1"]) - int(r["c0"])) for r in app))
    out = {}
    extra = _none_args()
    for name, tasks, flops in (("factorize", fac, fl_fac), ("apply", app, fl_app)):
        d = cp.asarray(tasks.view(np.uint8))
        for _ in range(2):
            kern((len(tasks),), (threads,), (d, F, VT, *extra), shared_mem=smem)
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            kern((len(tasks),), (threads,), (d, F, VT, *extra), shared_mem=smem)
            e1.record()
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
        t = float(np.median(times))
        out[name] = {"tasks": len(tasks), "seconds": t, "gflops": flops / t / 1e9}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="tile kernel throughput")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import cupy as cp
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    for v in variants.TILE_VARIANTS:
        r = _throughput(*v)
        rows.append({"tile": v[0], "bundle": v[1], "threads": v[2], **r})
        print(f"TILE {v[0]:3d} BUNDLE {v[1]} threads {v[2]:3d}: "
              f"factorize {r['factorize']['gflops']:8.1f} GF/s ({r['factorize']['tasks']} tasks, "
              f"{r['factorize']['seconds'] * 1e3:.3f} ms)  apply {r['apply']['gflops']:8.1f} GF/s "
              f"({r['apply']['tasks']} tasks, {r['apply']['seconds'] * 1e3:.3f} ms)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": dev, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
