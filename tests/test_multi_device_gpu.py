"""Sparse QR over several GPUs (marker ``gpu``) against one GPU.

Several device layers on one GPU (``devices=[0, 0, ...]``: own streams, VT
pools and front pools, contribution blocks copied between them) run on any
GPU machine; the real multi-GPU cases need 2 and 4 visible GPUs and skip
otherwise. Each compares with the one-GPU engine: R (to rounding), Q R = A P,
Qᵀ and Q, and the public solves through ``gpuqr_options=GpuqrOptions(devices=...)``.

Run them with ``-o faulthandler_timeout=45`` under a time limit: a test that
takes longer prints every thread's stack (the per-device threads included)
to the real stderr, so a hang shows where it waits.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import GpuqrOptions, QRFactorization
from scipy_gpuqr._engine.gpu.driver import gpu_factorize
from scipy_gpuqr._engine.gpu.multi_device import device_count, multi_gpu_factorize
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                           random_least_squares, random_values)

pytestmark = pytest.mark.gpu



def _cases():
    rng = np.random.default_rng(11)
    yield "grid12", random_values(grid3d_least_squares(12), rng)
    yield "chess", chessboard_boundary(6, 7, 3).astype(np.float64)
    yield "randls", random_least_squares(3000, 1200, 0.004, dense_rows=2, seed=5)
    yield "blocks", sp.csc_array(sp.block_diag(
        [random_least_squares(300, 120, 0.03, seed=s) for s in range(12)], format="csc"))


def _compare(A, one, many):
    m, n = A.shape
    scale = max(abs(one.R).max(), 1.0)
    tol = 1e-12 * scale
    # Gram of R (R unique up to row signs: a dense front whose rows were
    # assembled in another order, or factorized by another routine, may flip
    # some; the same records give the same R)
    # (dense products: R of the chessboard case holds most of its upper triangle,
    # where a sparse product R.T @ R takes the better part of a minute)
    R1, R2 = one.R.toarray(), many.R.toarray()
    G1 = R1.T @ R1
    G2 = R2.T @ R2
    assert np.abs(G1 - G2).max() <= 1e-11 * scale * scale
    k = one.R.shape[0]
    sign = np.where(np.sign(many.R.diagonal()) == np.sign(one.R.diagonal()), 1.0, -1.0)
    assert abs(sp.diags_array(sign) @ many.R - one.R).max() <= tol
    rng = np.random.default_rng(2)
    B = rng.standard_normal((m, 3))
    QB1, QB2 = one.qt_matmul(B), many.qt_matmul(B)
    assert np.abs(sign[:, None] * QB2[:k] - QB1[:k]).max() <= 1e-11 * np.abs(B).max()
    # the rest spans R's orthogonal complement (its basis may differ where signs do)
    np.testing.assert_allclose(np.linalg.norm(QB2[k:], axis=0),
                               np.linalg.norm(QB1[k:], axis=0), rtol=1e-10)
    X = rng.standard_normal((n, 2))
    Y = np.zeros((m, 2))
    Y[:min(m, n)] = many.R @ X
    AP = A[:, many.colperm] @ X
    assert np.abs(many.q_matmul(Y) - AP).max() <= 1e-10 * max(1.0, np.abs(AP).max())


def _peers(ids) -> bool:
    """Whether the first device can read every other one's memory (peer access)."""
    import cupy as cp
    return all(d == ids[0] or cp.cuda.runtime.deviceCanAccessPeer(ids[0], d) for d in ids)


def _run(ids, **kw):
    import cupy as cp
    crossed = 0
    for name, A in _cases():
        an = analyze(A)
        with cp.cuda.Device(ids[0]):        # Q and the solves run with the first device current
            one = gpu_factorize(A, an)
            many = multi_gpu_factorize(A, an, devices=ids, **kw)
            _compare(A, one, many)
        info = many.info
        assert "multi_device_fallback" not in info, (name, info.get("multi_device_fallback"))
        per = info["devices"]["devices"]
        assert [d["device"] for d in per] == list(ids), name
        assert sum(d["stages"] for d in per) == info["stages"]
        assert all(d["busy_seconds"] >= 0 for d in per)
        assert all(d["enqueue_seconds"] >= d["wait_blocks_seconds"] >= 0 for d in per)
        assert all(d["enqueue_cpu_seconds"] >= 0 for d in per)
        for d in per:               # every entry of R put in R's data once, as it landed
            rc = d["r_copy"]
            assert rc["scattered"] == rc["entries"], (name, rc)
            assert 0 <= rc["scattered_by_enqueued"] <= rc["entries"]
        assert 0 <= info["r_copy_progressive"] <= info["stages"]
        assert info["q_device"] == ids[0]
        # every other device sent its VT tiles and dense fronts home once it ended
        assert all(d["to_home"] is not None and d["to_home"]["bytes"] >= 0 for d in per[1:])
        assert info["seconds"]["result"] >= 0
        pinned = info["pinned_ahead"]       # every pinned buffer made before the threads
        assert pinned["during_run"] == {"allocations": 0, "bytes": 0}, (name, pinned)
        assert pinned["staging_bytes"] > 0 and pinned["bytes"] > pinned["staging_bytes"]
        if _peers(ids):                     # Q reads the other devices' pools in place
            assert info["q_pools_on_host"] == [], name
        crossed += sum(1 for _, s, t, _ in info["transfers"] if ids[s] != ids[t])
        with cp.cuda.Device(ids[0]):
            many.free()
            one.free()
    if len(set(ids)) > 1:                   # blocks really moved between GPUs
        assert crossed > 0


@pytest.mark.parametrize("ids", [(0, 0), (0, 0, 0), (0, 0, 0, 0)])
def test_simulated_devices_on_one_gpu(ids):
    _run(ids)


@pytest.mark.parametrize("ids", [(0, 0), (0, 1)])
def test_r_copied_through_small_slots(ids):
    """R's values through slots of 64 KB (many ranges per stage, each scattered into
    R's data as it lands, by one thread or several): the one-GPU answer."""
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    _run(ids, r_slot_bytes=1 << 16)


@pytest.mark.parametrize("ids", [(0, 1), (1, 0)])
def test_two_gpus(ids):
    if device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _run(ids)


def test_four_gpus():
    if device_count() < 4:
        pytest.skip("needs 4 GPUs")
    _run((0, 1, 2, 3))


@pytest.mark.parametrize("ids", [(0, 0), (0, 1, 2, 3)])
def test_no_pinning_while_the_devices_enqueue(ids):
    """A repeated call pins no host memory at all (every ``cudaHostAlloc`` counted
    through CuPy's pinned allocator: the library's buffers and CuPy's own) and
    fills only the S values into its kept block, and a first call none while its
    devices' threads enqueue (its lanes in the block pinned during the schedule)."""
    import threading
    import time

    import cupy as cp

    from scipy_gpuqr._engine.gpu import pinned_ahead as pa
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    log, lock = [], threading.Lock()

    def alloc(size):
        t0 = time.perf_counter()
        mem = cp.cuda.pinned_memory.PinnedMemory(size, cp.cuda.runtime.hostAllocPortable)
        with lock:
            log.append((t0, int(size), threading.current_thread().name))
        return cp.cuda.PinnedMemoryPointer(mem, 0)      # what a pool's allocator returns

    pool = cp.cuda.PinnedMemoryPool(allocator=alloc)
    cp.cuda.set_pinned_memory_allocator(pool.malloc)
    pa.release_kept_pinned()
    try:
        A = random_values(grid3d_least_squares(16), np.random.default_rng(3))
        an = analyze(A)
        with cp.cuda.Device(ids[0]):
            for call in range(2):
                n0 = len(log)
                t = time.perf_counter()
                qr = multi_gpu_factorize(A, an, devices=ids, device_speeds=None)
                lines = [d["timeline_seconds"] for d in qr.info["devices"]["devices"]]
                a = t + min(x[0] for x in lines)
                b = t + max(x[1] for x in lines)
                while_enqueueing = [x for x in log[n0:] if a <= x[0] < b]
                assert while_enqueueing == [], (call, while_enqueueing)
                pinned = qr.info["pinned_ahead"]
                assert pinned["during_run"]["allocations"] == 0, pinned
                # the lanes cut from the shared block (one block, made during the schedule)
                assert pinned["lanes_in_shared"], pinned
                if call:
                    assert pinned["pinned_now_bytes"] == 0, pinned
                    assert log[n0:] == [], log[n0:]
                    # the kept block holds the pattern's maps and S indices already
                    assert pinned["filled"] == ["s_value"], pinned
                else:
                    assert pinned["filled"] == ["maps", "s_index", "s_value"], pinned
                qr.free()
    finally:
        cp.cuda.set_pinned_memory_allocator(cp.get_default_pinned_memory_pool().malloc)
        pa.release_kept_pinned()
        pool.free_all_blocks()


@pytest.mark.parametrize("k", [2, 4])
def test_second_call_mapped_by_measured_speeds(k, monkeypatch):
    """A pattern's first call on k GPUs maps on flops and remembers the speeds it
    measured; the next maps by the speeds remembered (set here, so that the mapping
    surely differs) and gives the one-GPU answer."""
    from types import SimpleNamespace

    import cupy as cp
    from scipy_gpuqr._engine.gpu.multi_device import speeds_key
    from scipy_gpuqr._gpu import device_name
    from scipy_gpuqr._schedule.dense_split import SplitModel
    from scipy_gpuqr._schedule.devices import map_devices, remember_speeds
    from scipy_gpuqr._schedule import devices
    # a small grid's modelled gain is below what a new plan costs a large one
    monkeypatch.setattr(devices, "REMAP_SECONDS", 0.0)
    ids = tuple(range(k)) if device_count() >= k else (0,) * k
    A = random_values(grid3d_least_squares(14), np.random.default_rng(6))
    an = analyze(A, cache=False)            # nothing remembered from other tests
    with cp.cuda.Device(ids[0]):
        one = gpu_factorize(A, an)
        first = multi_gpu_factorize(A, an, devices=ids)
        assert first.info["devices"]["mapping"]["by"] == "flops"
        first.free()
        key = speeds_key([SimpleNamespace(device_id=d, name=device_name(d)) for d in ids],
                         np.float64)          # as the call's CUDA layers name the set
        for _ in range(10):
            kept = remember_speeds(an, key, [0.5] + [1.5] * (k - 1))
        second = multi_gpu_factorize(A, an, devices=ids)
        mp = second.info["devices"]["mapping"]
        assert mp["by"] == "measured speeds" and mp["speeds"] == pytest.approx(kept)
        got = [d["subtree_flops"] for d in second.info["devices"]["per_device"]]
        # the default maps with the split rule's model where the devices are distinct GPUs
        model = SplitModel() if len(set(ids)) > 1 else None
        assert got == pytest.approx(
            map_devices(an, k, speeds=kept, split_model=model).subtree_flops.tolist())
        assert "multi_device_fallback" not in second.info
        _compare(A, one, second)
        second.free()
        one.free()


@pytest.mark.parametrize("ids", [(0, 0), (0, 1)])
def test_dense_fronts_across_devices(ids):
    """Dense fronts (cuSOLVER/cuBLAS) on every device; those of another GPU copied to
    the first for Q's products."""
    if len(set(ids)) > device_count():
        pytest.skip("needs 2 GPUs")
    A = grid3d_least_squares(14)
    an = analyze(A)
    one = gpu_factorize(A, an, dense_flops=1e7)
    many = multi_gpu_factorize(A, an, devices=ids, dense_flops=1e7)
    assert many.info["dense_fronts"] == one.info["dense_fronts"] > 0
    assert "multi_device_fallback" not in many.info
    _compare(A, one, many)


@pytest.mark.parametrize("k", [2, 4])
def test_public_solve_with_devices(k):
    ids = tuple(range(k)) if device_count() >= k else (0,) * k
    A = random_values(grid3d_least_squares(10), np.random.default_rng(3))
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    with QRFactorization(A, backend="gpu", gpuqr_options=GpuqrOptions(devices=ids)) as F:
        x = F.solve(b)
        info = F.info
    assert info["backend_info"]["devices"]["ndevices"] == k
    assert np.abs(x - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max())
    r = A @ x - b
    assert np.linalg.norm(A.T @ r) <= 1e-10 * sp.linalg.norm(A) * np.linalg.norm(r) * 10


def test_public_solve_first_device_not_current():
    """``GpuqrOptions(devices=(1, 0))``: device 1 keeps Q while device 0 is current
    (the caller's), so the solves must run on the device that holds Q."""
    if device_count() < 2:
        pytest.skip("needs 2 GPUs")
    A = random_values(grid3d_least_squares(10), np.random.default_rng(3))
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    ref = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    with QRFactorization(A, backend="gpu", gpuqr_options=GpuqrOptions(devices=(1, 0))) as F:
        x = F.solve(b)
        assert F.info["backend_info"]["q_device"] == 1
    assert np.abs(x - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max())


def _split_case(cp, fm, fn, seed):
    """A staircase front on the current GPU (rows past each column's stair zero)."""
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((fm, fn))
    lead = np.sort(rng.integers(0, fm, fm))
    lead[:min(fm, fn)] = np.minimum(lead[:min(fm, fn)], np.arange(min(fm, fn)))
    stair = np.searchsorted(np.sort(lead), np.arange(fn), side="right")
    for c in range(fn):
        F[stair[c]:, c] = 0.0
    return F, stair


def _split_on_layers(cp, layers, Fh, panels, nb, own, pad=7, **kw):
    """``Fh`` put in a pool on the first layer (at ``pad``, a view inside a pool as in
    a stage) and a prepared ``CupySplit`` of it over the layers: ``(F, backend)``.

    The pool is zeroed on the layer's stream, where the front goes up: zeroed on
    the legacy default stream (behind a reference's work there), the memset could
    land after the upload (the layer's stream does not wait for it)."""
    from scipy_gpuqr._engine.gpu.split_front import CupySplit
    main = layers[0]
    with main.stream:
        pool = cp.zeros(Fh.size + pad, dtype=np.float64)
    F = pool[pad:].reshape(Fh.shape)
    F.set(Fh, stream=main.stream)
    ready = cp.cuda.Event()
    ready.record(main.stream)
    be = CupySplit(main, layers[1:], F, panels, nb, own, ready, timing=True, **kw)
    be.prepare()
    return F, be


@pytest.mark.parametrize("ids, owners, lean, serial", [
    ((0, 0), "model", True, False), ((0, 0), "model", False, False),
    ((0, 0, 0), "model", True, False),
    ((0, 0), "cyclic", True, False),
    ((0, 1), "model", True, False), ((0, 1), "cyclic", False, False),
    ((0, 1), "cyclic", True, False), ((0, 1), "cyclic", True, True)])
def test_split_front_backend_equals_one_device(ids, owners, lean, serial):
    """A dense front's blocks over device layers (CupySplit) against the one-device
    dense path (factorize_cupy): the same front (R, reflectors, contribution block)
    and T to rounding; then the NumPy steps agree with both. ``serial``: the
    devices synchronized after every call (no overlap: a wrong answer there is
    arithmetic, not ordering)."""
    import cupy as cp
    from scipy_gpuqr._engine.dense_front import factorize_cupy, panels_of
    from scipy_gpuqr._engine.gpu.multi_device import cupy_layers
    from scipy_gpuqr._engine.split_front import run_split, split_factorize_numpy
    from scipy_gpuqr._schedule.dense_split import block_owners
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    fm, fn, nb = 3000, 1900, 256      # 8 blocks; the staircase leaves rows out of the copies
    Fh, stair = _split_case(cp, fm, fn, 4)
    panels = panels_of(fm, fn, stair, nb)
    nblk = -(-fn // nb)
    own = (block_owners(fm, fn, stair, len(ids)) if owners == "model"
           else np.array([0, 0] + [c % len(ids) for c in range(2, nblk)]))
    assert own.max() > 0
    layers = cupy_layers(ids)
    main = layers[0]
    with cp.cuda.Device(ids[0]):
        F1 = cp.asarray(Fh)
        T1 = factorize_cupy(F1, panels, nb)
        cp.cuda.Device().synchronize()
        F2, be = _split_on_layers(cp, layers, Fh, panels, nb, own, lean=lean, serial=serial)
        run_split(be, panels, nb, fn, own)
        main.stream.wait_event(be.done)
        main.stream.synchronize()
        cp.cuda.Device().synchronize()
        assert be.seconds() > 0
        a1, a2, t1, t2 = F1.get(), F2.get(), T1.get(), be.T.get()
        be.release()
    scale = np.abs(a1).max()
    assert np.abs(a1 - a2).max() <= 1e-12 * scale
    assert np.abs(t1 - t2).max() <= 1e-11 * max(np.abs(t1).max(), 1.0)
    F3 = Fh.copy()
    T3, _ = split_factorize_numpy(F3, panels, nb, own)
    assert np.abs(np.abs(np.diag(F3)) - np.abs(np.diag(a2))).max() <= 1e-10 * scale


@pytest.mark.parametrize("ids", [(0, 0), (0, 1), (0, 1, 2, 3)])
def test_split_fronts_sharing_resources_equal_one_device(ids):
    """Split fronts of one call through one ``SplitResources`` (as the multi-GPU
    driver does: streams, handles and work buffers made by the first front, grown
    by a larger one), each device's calls on a thread of its own, one front after
    the other with no host wait between them: every front and T equal the
    one-device dense path's to rounding, and the streams are made once."""
    import cupy as cp
    from concurrent.futures import ThreadPoolExecutor
    from scipy_gpuqr._engine.dense_front import factorize_cupy, panels_of
    from scipy_gpuqr._engine.gpu.multi_device import cupy_layers
    from scipy_gpuqr._engine.gpu.split_front import SplitResources
    from scipy_gpuqr._engine.split_front import run_split
    from scipy_gpuqr._schedule.dense_split import block_owners
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    nb = 256
    layers = cupy_layers(ids)
    main = layers[0]
    ex = [None] + [ThreadPoolExecutor(1) for _ in ids[1:]]
    fronts = []
    with cp.cuda.Device(ids[0]):
        res = SplitResources(cp)
        try:
            for i, (fm, fn) in enumerate([(2000, 1500), (3000, 2400), (1600, 1100)]):
                Fh, stair = _split_case(cp, fm, fn, 11 + i)
                panels = panels_of(fm, fn, stair, nb)
                own = block_owners(fm, fn, stair, len(ids))
                assert own.max() > 0
                F2, be = _split_on_layers(cp, layers, Fh, panels, nb, own, pad=5, resources=res)
                run_split(be, panels, nb, fn, own, workers=ex[:int(own.max()) + 1])
                fronts.append((Fh, panels, F2, be))
            main.stream.wait_event(fronts[-1][3].done)
            for i in set(ids):
                with cp.cuda.Device(i):
                    cp.cuda.Device(i).synchronize()
            assert len(res.streams) == 2 * max(be.ndev for *_, be in fronts)
            for Fh, panels, F2, be in fronts:
                F1 = cp.asarray(Fh)
                T1 = factorize_cupy(F1, panels, nb)
                a1, a2 = F1.get(), F2.get()
                t1, t2 = T1.get(), be.T.get()
                assert np.abs(a1 - a2).max() <= 1e-12 * np.abs(a1).max()
                assert np.abs(t1 - t2).max() <= 1e-11 * max(np.abs(t1).max(), 1.0)
                assert be.seconds() > 0
                be.release()
        finally:
            for e in ex[1:]:
                e.shutdown(wait=True)
            cp.cuda.Device().synchronize()
            res.close()


@pytest.mark.parametrize("ids", [(0, 0), (0, 1), (0, 0, 0), (0, 1, 2, 3)])
def test_split_front_on_device_threads_equals_one_device(ids):
    """A dense front's blocks over device layers, each device's calls enqueued by a
    thread of its own (``run_split(workers=...)``, as the multi-GPU driver does),
    against the one-device dense path and the same split enqueued by one thread:
    the same front and T to rounding."""
    import cupy as cp
    from concurrent.futures import ThreadPoolExecutor
    from scipy_gpuqr._engine.dense_front import factorize_cupy, panels_of
    from scipy_gpuqr._engine.gpu.multi_device import cupy_layers
    from scipy_gpuqr._engine.split_front import run_split
    from scipy_gpuqr._schedule.dense_split import block_owners
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    fm, fn, nb = 3000, 2400, 256
    Fh, stair = _split_case(cp, fm, fn, 5)
    panels = panels_of(fm, fn, stair, nb)
    own = block_owners(fm, fn, stair, len(ids))
    assert own.max() > 0
    layers = cupy_layers(ids)
    main = layers[0]
    out = []
    with cp.cuda.Device(ids[0]):
        F1 = cp.asarray(Fh)
        T1 = factorize_cupy(F1, panels, nb)
        cp.cuda.Device().synchronize()
        for threads in (True, False):
            F2, be = _split_on_layers(cp, layers, Fh, panels, nb, own)
            ex = [None] + [ThreadPoolExecutor(1) for _ in range(1, int(own.max()) + 1)]
            try:
                times = run_split(be, panels, nb, fn, own, workers=ex if threads else None)
            finally:
                for e in ex[1:]:
                    e.shutdown(wait=True)
            assert len(times) == int(own.max()) + 1
            main.stream.wait_event(be.done)
            for i in set(ids):
                with cp.cuda.Device(i):
                    cp.cuda.Device(i).synchronize()
            assert be.seconds() > 0
            out.append((F2.get(), be.T.get()))
            be.release()
        a1, t1 = F1.get(), T1.get()
    scale = np.abs(a1).max()
    for a2, t2 in out:
        assert np.abs(a1 - a2).max() <= 1e-12 * scale
        assert np.abs(t1 - t2).max() <= 1e-11 * max(np.abs(t1).max(), 1.0)
    assert np.abs(out[0][0] - out[1][0]).max() <= 1e-12 * scale


@pytest.mark.parametrize("ids", [(0, 0), (0, 1), (0, 0, 0), (0, 1, 2, 3)])
def test_split_dense_fronts_over_devices(ids):
    """The upper tree's dense fronts factorized over every device layer
    (``split_dense=True``) against one GPU: Gram of R, Q R = A P, Qᵀ."""
    import cupy as cp
    if len(set(ids)) > device_count():
        pytest.skip(f"needs {len(set(ids))} GPUs")
    A = grid3d_least_squares(14)
    an = analyze(A)
    with cp.cuda.Device(ids[0]):
        one = gpu_factorize(A, an, dense_flops=1e7)
        many = multi_gpu_factorize(A, an, devices=ids, dense_flops=1e7, split_dense=True)
        split = many.info["split_fronts"]
        assert split and all("fallback" not in e for e in split), split
        assert all(e.get("seconds", 0) > 0 for e in split), split
        assert all(sum(b > 0 for b in e["blocks"]) >= 2 for e in split)
        # every device of the split enqueued its share on a thread of its own
        assert all(
            len(e["enqueue_seconds"]) == 1 + max(i for i, b in enumerate(e["blocks"]) if b)
            for e in split), split
        assert "multi_device_fallback" not in many.info
        _compare(A, one, many)
        # the rule on layers of one GPU splits nothing
        if len(set(ids)) == 1:
            plain = multi_gpu_factorize(A, an, devices=ids, dense_flops=1e7)
            assert plain.info["split_fronts"] == []
            plain.free()
        many.free()
        one.free()
