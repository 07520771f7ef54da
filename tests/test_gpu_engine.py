"""The GPU engine (scipy_gpuqr._engine.gpu.driver).

CPU tests run the engine's host logic (staging, carried contribution blocks,
R assembly, Q bookkeeping, restaging after out-of-memory) against the NumPy
device layer. GPU tests (marker ``gpu``) compare the uberkernel with the
NumPy executor launch by launch (fresh random values, VT pool poisoned with
NaN), whole factorizations with the simulate/reference engines on generated
families and the shared matrices (also with many stages), and
``QRFactorization(A, backend='gpu')`` end to end.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._engine.gpu.driver import GpuEngineError, gpu_factorize
from scipy_gpuqr._engine.gpu.device import NumpyDevice
from scipy_gpuqr._engine.host.simulate import execute_task, simulate_factorize
from scipy_gpuqr._schedule.sparse import build_schedule
from scipy_gpuqr._symbolic import analyze
from scipy_gpuqr._testing_matrices import (chessboard_boundary, engine_families,
                                           grid3d_least_squares, random_values, singleton_rich)

EPS = np.finfo(np.float64).eps


# ---------------------------------------------------------------- CPU: host logic

@pytest.mark.parametrize("budget", [None, 20000])
def test_host_logic_matches_simulate(budget):
    rng = np.random.default_rng()
    for name, A in engine_families(rng):
        an = analyze(A)
        s = simulate_factorize(A, an, max_gpu_memory=budget)
        g = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
        assert g.info["stages"] == s.info["stages"], name
        assert abs(g.R - s.R).max() == 0.0, name
        b = rng.standard_normal((A.shape[0], 2))
        np.testing.assert_array_equal(g.qt_matmul(b), s.qt_matmul(b))
        np.testing.assert_array_equal(g.q_matmul(b), s.q_matmul(b))
        g.free()


def _odd_shapes(rng):
    """Singleton rows (R1 block), a wide matrix (rows of R without pivot), empty lines."""
    yield "singletons", sp.csc_array(singleton_rich(300, 120, seed=int(rng.integers(1 << 30))))
    W = sp.random(40, 90, density=0.08, random_state=int(rng.integers(1 << 30)), format="csc")
    yield "wide", sp.csc_array(W + sp.eye(40, 90, format="csc"))
    E = sp.random(120, 60, density=0.06, random_state=int(rng.integers(1 << 30)),
                  format="lil")
    E[:, 7] = 0
    E[11, :] = 0
    yield "empty-lines", sp.csc_array(E)


@pytest.mark.parametrize("budget", [None, 4000])
def test_r_layout_matches_simulate_on_odd_shapes(budget):
    rng = np.random.default_rng()
    for name, A in _odd_shapes(rng):
        an = analyze(A)
        s = simulate_factorize(A, an, max_gpu_memory=budget)
        g = gpu_factorize(A, an, device=NumpyDevice(32, 3), max_gpu_memory=budget)
        assert g.R.shape == s.R.shape, name
        assert g.R.has_sorted_indices and g.R.nnz == s.R.nnz, name
        assert abs(g.R - s.R).toarray().max(initial=0.0) == 0.0, name
        np.testing.assert_array_equal(g.qorder, s.qorder)
        b = rng.standard_normal((A.shape[0], 2))
        np.testing.assert_array_equal(g.qt_matmul(b), s.qt_matmul(b))
        g.free()


def test_r_layout_vectorized_matches_a_loop_per_front():
    from scipy_gpuqr._engine.gpu.rlayout import r_layout
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(4), rng)
    an = analyze(A)
    lay = r_layout(an, cache=False)
    fs = an.fronts
    fbase = np.concatenate(([0], np.cumsum(fs.fm.astype(np.int64) * fs.fn)))
    space = rng.standard_normal(int(fbase[-1]))
    R = lay.csc(space[lay.src]).toarray()
    want = np.zeros(lay.shape)
    row = 0
    for f in range(fs.nfronts):
        cols = fs.cols[fs.col_ptr[f]:fs.col_ptr[f + 1]]
        fm, fn, rk = int(fs.fm[f]), int(fs.fn[f]), int(fs.frank[f])
        blk = np.triu(space[fbase[f]: fbase[f] + fm * fn].reshape(fm, fn)[:rk])
        want[row: row + rk][:, cols] = blk
        row += rk
    np.testing.assert_array_equal(R, want)


def test_r_layout_builders_agree():
    """Column segments (rows in front order) and the general CSR->CSC path."""
    from scipy_gpuqr._engine.gpu import rlayout as gpu_rlayout
    rng = np.random.default_rng()
    for name, A in list(_odd_shapes(rng)) + list(engine_families(rng)):
        an = analyze(A)
        a, b = gpu_rlayout._build_segments(an), gpu_rlayout._build_general(an)
        for x in ("indptr", "indices", "src", "r1_pos", "r1_nz", "qorder"):
            np.testing.assert_array_equal(getattr(a, x), getattr(b, x), err_msg=name + x)
        assert a.indices.dtype == b.indices.dtype


def test_refactor_reuses_schedule_and_layout():
    from scipy_gpuqr._engine.gpu.rlayout import r_layout
    from scipy_gpuqr._schedule.sparse import clear_schedule_cache
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(5), rng)
    an = analyze(A)
    clear_schedule_cache(an)
    g1 = gpu_factorize(A, an, device=NumpyDevice(32, 3))
    assert g1.info["schedule_cold"]                 # built launch by launch
    lay = r_layout(an)
    assert all(st.materialized for st in g1.schedule.stages)
    A2 = A.copy()
    A2.data = rng.standard_normal(A2.nnz)
    g2 = gpu_factorize(A2, an, device=NumpyDevice(32, 3))
    assert not g2.info["schedule_cold"] and g2.schedule is g1.schedule
    assert r_layout(an) is lay
    s2 = simulate_factorize(A2, an)
    assert abs(g2.R - s2.R).max() == 0.0
    assert abs(g1.R - g2.R).max() > 0.0            # new values, not the old R
    b = rng.standard_normal(A.shape[0])
    np.testing.assert_array_equal(g2.qt_matmul(b), s2.qt_matmul(b))


def test_progressive_r_copy_takes_only_final_ranges(monkeypatch):
    """Warm one-stage runs copy R's values after the launches that finish them
    (the NumPy device copies at once, so a range taken too early would differ
    from the simulate engine's R); a wrong map is caught."""
    from scipy_gpuqr._engine.gpu import rcopy as gpu_rcopy
    from scipy_gpuqr._engine.gpu.rlayout import r_layout
    rng = np.random.default_rng()
    cases = list(engine_families(rng)) + [("singletons", sp.csc_array(
        singleton_rich(300, 120, seed=int(rng.integers(1 << 30)))))]
    for name, A in cases:
        an = analyze(A)
        gpu_factorize(A, an, device=NumpyDevice(32, 3)).free()      # cold: caches
        A2 = random_values(A, rng)
        dev = NumpyDevice(32, 3, rng=rng)
        g = gpu_factorize(A2, an, device=dev)
        assert g.info["stages"] == 1 and g.info["r_copy_progressive"], name
        lay = r_layout(an)
        fin = gpu_rcopy.final_entries(an, lay, g.schedule.stages[0], 32)
        assert np.all(np.diff(fin) >= 0) and fin[-1] == lay.nnz, name
        assert len(dev.r_copies) >= 2 and dev.r_copies[0] < lay.nnz, (name, dev.r_copies)
        s = simulate_factorize(A2, an)
        assert abs(g.R - s.R).max() == 0.0, name
        g.free()
    # a map claiming everything final after the first launch must show
    name, A = next(iter(engine_families(rng)))
    an = analyze(A)
    gpu_factorize(A, an, device=NumpyDevice(32, 3)).free()
    monkeypatch.setattr(gpu_rcopy, "final_entries",
                        lambda an_, lay, st, tile, pos=None: np.full(st.nlaunch, lay.nnz))
    from scipy_gpuqr._engine.gpu.rlayout import clear_r_layout_cache
    clear_r_layout_cache(an)
    try:
        gpu_factorize(A, an, device=NumpyDevice(32, 3)).free()      # layout rebuilt, cold map
        g = gpu_factorize(A, an, device=NumpyDevice(32, 3))
        assert g.info["r_copy_progressive"]
        assert abs(g.R - simulate_factorize(A, an).R).max() > 0.0
    finally:        # the wrong map is cached per pattern: later tests must not meet it
        clear_r_layout_cache(an)


def test_index_upload_chunks_cover_the_index_once(monkeypatch):
    """The pinned-chunk upload's bookkeeping without a GPU: a stand-in CuPy records
    every asynchronous copy (target range, source buffer) and every event; each
    entry lands once and in place, the two buffers alternate, a buffer is
    refilled only after the event of its previous copy was waited for, and every
    copy has been waited for on return; an index within one chunk is one copy."""
    import sys
    import types
    from scipy_gpuqr._engine.gpu.rcopy import upload_through_pinned

    log = []

    class Event:
        def __init__(self, disable_timing=True):
            self.done = False

        def record(self, stream):
            log.append(("record", self))

        def synchronize(self):
            self.done = True

    class Target:
        def __init__(self, arr, first=0):
            self.arr, self.first = arr, first

        def __getitem__(self, sl):
            return Target(self.arr[sl], self.first + sl.start)

        def set(self, src, stream=None):
            done = [e[1].done for e in log if e[0] == "record"]
            log.append(("copy", self.first, len(src), src.base if src.base is not None
                        else src, done))
            self.arr[...] = src

    fake_cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event))
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.empty(shape, dtype=dtype)))
    rng = np.random.default_rng()
    for n in (5, 8, 9, 40, 45):
        host = rng.integers(0, 1 << 30, n).astype(np.int32)
        out = np.full(n, -1, dtype=np.int32)
        log.clear()
        upload_through_pinned(fake_cp, Target(out), host, stream=None, chunk_bytes=8 * 4)
        assert np.array_equal(out, host), n
        copies = [e for e in log if e[0] == "copy"]
        assert [c[1] for c in copies] == list(range(0, n, 8)), n
        if n <= 8:
            assert len(copies) == 1 and not any(e[0] == "record" for e in log)
            continue
        events = [e[1] for e in log if e[0] == "record"]
        assert all(ev.done for ev in events), n
        buffers = [c[3] for c in copies]
        assert all(a is not b for a, b in zip(buffers, buffers[1:])), n
        assert all(a is b for a, b in zip(buffers, buffers[2:])), n
        # copy k refills the buffer of copy k - 2: that copy's event was waited for
        assert all(c[4][k - 2] for k, c in enumerate(copies) if k >= 2), n


def test_float32_input_gives_float32_r():
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(4), rng)
    an = analyze(A)
    s = simulate_factorize(A, an)
    g = gpu_factorize(A.astype(np.float32), an, device=NumpyDevice(32, 3, dtype=np.float32))
    assert g.R.dtype == np.float32
    Rg, Rs = g.R.toarray().astype(np.float64), s.R.toarray()
    tol = 100 * max(A.shape) * np.finfo(np.float32).eps * float(sp.linalg.norm(A)) ** 2
    assert np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tol


@pytest.fixture
def numpy_gpu_engine(monkeypatch):
    """backend='gpu' through the dispatch hook, executed by the NumPy device layer."""
    from scipy_gpuqr._dispatch import plan as _dispatch

    def factorize(A, analysis=None, **kw):
        dt = np.float32 if getattr(A, "dtype", None) == np.float32 else np.float64
        return gpu_factorize(A, analysis, device=NumpyDevice(32, 3, dtype=dt), **kw)
    monkeypatch.setattr(_dispatch, "gpu_engine", lambda: (factorize, "ok"))


def test_backend_gpu_end_to_end_through_the_adapters(numpy_gpu_engine):
    import warnings

    from scipy_gpuqr import QRFactorization, lsqr, spsolve
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(5), rng)
    b = rng.standard_normal(A.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F = QRFactorization(A, backend="gpu")
        x = F.solve(b)
    xr = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - xr) <= 1e-10 * max(np.linalg.norm(xr), 1.0)
    assert F.info["backend"] == "gpu" and F.info["backend_info"]["backend"] == "gpu"
    A2 = A.copy()
    A2.data = rng.standard_normal(A2.nnz)
    F.refactor(A2)
    x2 = F.solve(b)
    xr2 = np.linalg.lstsq(A2.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x2 - xr2) <= 1e-10 * max(np.linalg.norm(xr2), 1.0)
    F.free()
    out = lsqr(A, b, backend="gpu")
    assert np.linalg.norm(out[0] - xr) <= 1e-10 * max(np.linalg.norm(xr), 1.0)
    S = sp.csc_array(random_values(grid3d_least_squares(4), rng)[:64])
    S = sp.csc_array(S + 10 * sp.eye(64, format="csc"))
    bs = rng.standard_normal(64)
    xs = spsolve(S, bs, backend="gpu")
    assert np.linalg.norm(S @ xs - bs) <= 1e-12 * (sp.linalg.norm(S) * np.linalg.norm(xs)
                                                   + np.linalg.norm(bs))


def test_backend_gpu_without_a_gpu_warns_and_answers(monkeypatch):
    from scipy_gpuqr import _gpu
    from scipy_gpuqr._errors import GpuFallbackWarning
    monkeypatch.setattr(_gpu, "gpu_info", lambda: {"available": False, "reason": "test"})
    A = grid3d_least_squares(3)
    with pytest.warns(GpuFallbackWarning, match="no usable GPU"):
        out = gpu_factorize(A)
    assert out.info["fallback"].startswith("no usable GPU")


def test_restages_after_out_of_memory_and_falls_back():
    A = grid3d_least_squares(5)
    an = analyze(A)
    s = simulate_factorize(A, an)
    one = an.stage_plan(None)
    small = max(st.pool_size for st in build_schedule(an, max_gpu_memory=20000).stages)
    g = gpu_factorize(A, an, device=NumpyDevice(32, 3, fail_after=small))
    assert g.info["restaged"] >= 1 and g.info["stages"] > len(one.stages)
    assert abs(g.R - s.R).max() == 0.0
    with pytest.warns(RuntimeWarning, match="out of memory"):
        r = gpu_factorize(A, an, device=NumpyDevice(32, 3, fail_after=0))
    assert "fallback" in r.info
    with pytest.raises(MemoryError):
        gpu_factorize(A, an, device=NumpyDevice(32, 3, fail_after=0), fallback=False)


def test_non_finite_pool_raises():
    class Bad(NumpyDevice):
        def end_stage(self, h):
            h["pool"][0] = np.nan
            return super().end_stage(h)
    with pytest.raises(GpuEngineError):
        gpu_factorize(grid3d_least_squares(3), device=Bad(32, 3))


def test_uberkernel_registry_holds_the_engine_variants_only():
    from scipy_gpuqr._engine.gpu import factorize_kernels as fk
    names = fk.KERNEL_VARIANTS[fk.UBERKERNEL_FILE]
    want = ({fk.kernel_name(*v) for v in fk.ENGINE_VARIANTS}
            | {fk.smem_kernel_name(c, t, b) for c, t, b, _ in fk.ENGINE_VARIANTS})
    assert len(names) == len(set(names)) and set(names) == want


def test_rank_detection_is_delegated_and_said():
    A = sp.csc_array(sp.random(40, 30, density=0.2, random_state=3) + sp.eye(40, 30))
    out = gpu_factorize(A, tol="default", device=NumpyDevice(32, 3))
    assert "fallback" in out.info


# ---------------------------------------------------------------- GPU

def _gpu_launch_by_launch(A, ctype, rng, budget):
    import cupy as cp

    from scipy_gpuqr._engine.gpu import factorize_kernels as variants
    from scipy_gpuqr._kernels import load_module
    from scipy_gpuqr._schedule.tasks import TASK_BYTES
    an = analyze(A)
    sched = build_schedule(an, max_gpu_memory=budget)
    fs = an.fronts
    dt = np.float64 if ctype == "double" else np.float32
    mod = load_module(variants.UBERKERNEL_FILE, variants.KERNEL_VARIANTS[variants.UBERKERNEL_FILE])
    kern = mod.get_function(variants.kernel_name(ctype, 32, 3, 256))
    smem = variants.tile_smem_bytes(32, 3, np.dtype(dt).itemsize)
    kern.max_dynamic_shared_size_bytes = smem
    from scipy_gpuqr._symbolic import canonical_csc
    vals = canonical_csc(A).data.astype(np.float64)[fs.s_nz]
    maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
    vt_h = np.full(max(sched.vt_size, 1), np.nan)
    vt_d = cp.full(vt_h.shape, cp.nan, dtype=dt)
    maps_d = cp.asarray(maps)
    st = sched.stages[0]          # no carried blocks: both start from zeros
    s0, s1 = st.s_range
    sidx, sval = fs.s_index[s0:s1], vals[s0:s1]
    pool_h = np.zeros(st.pool_size)
    pool_d = cp.zeros(st.pool_size, dtype=dt)
    tasks_d = cp.asarray(np.ascontiguousarray(st.tasks).view(np.uint8))
    sidx_d, sval_d = cp.asarray(sidx), cp.asarray(sval.astype(dt))
    scale = max(np.abs(vals).max(), 1.0) * np.sqrt(max(A.shape))
    tol = (1000 * max(A.shape) * EPS if dt == np.float64 else 2e-3) * scale
    seen = set()
    for L in range(st.nlaunch):
        a, b = int(st.launch_ptr[L]), int(st.launch_ptr[L + 1])
        if b <= a:
            continue
        types = set(st.tasks["type"][a:b].tolist())
        seen |= types
        kern((b - a,), (256,), (tasks_d[a * TASK_BYTES:], pool_d, vt_d, sidx_d, sval_d, maps_d),
             shared_mem=smem)
        for k in a + rng.permutation(b - a):
            execute_task(st.tasks[k], pool_h, vt_h, 32, spool=(sidx, sval), maps=maps)
        if L == 0:  # leaves' S-Assemble only, before any reflector: exact
            got = cp.asnumpy(pool_d).astype(np.float64)
            assert np.isfinite(got).all(), L
            assert np.abs(got - pool_h).max(initial=0.0) <= tol, L
    # Reflectors built from rounding noise (numerically rank-deficient trailing columns of a
    # front, seen on 494_bus and the grid: diagonal 1e-14 relative) differ legitimately
    # between summation orders, so fronts are compared through their Gram matrices
    # triu(F)ᵀ triu(F), which every valid factorization of the same assembled front shares.
    # A front whose pivot block is numerically rank-deficient (chessboard matrices) splits
    # its content between R rows and the contribution block in a way that depends on the
    # noise reflectors, so its Gram matrix — and every ancestor's — is only compared when
    # its whole subtree is well determined (the whole R is compared elsewhere).
    got = cp.asnumpy(pool_d).astype(np.float64)
    assert np.isfinite(got).all()
    first, last = st.fronts
    deficient = np.zeros(fs.nfronts, dtype=bool)
    compared = 0
    for f in range(first, last + 1):
        fm, fn, off = int(fs.fm[f]), int(fs.fn[f]), int(st.foff[f])
        k = min(fm, fn)
        Rg = np.triu(got[off: off + fm * fn].reshape(fm, fn)[:k])
        Rh = np.triu(pool_h[off: off + fm * fn].reshape(fm, fn)[:k])
        gs = max(np.abs(Rh).max(initial=0.0), 1.0)
        piv = np.abs(np.diagonal(Rh))[:min(k, int(fs.fp[f]))]
        deficient[f] |= bool(np.any(piv <= 1e-8 * gs))
        if fs.parent[f] >= 0:
            deficient[fs.parent[f]] |= deficient[f]
        if deficient[f]:
            continue
        compared += 1
        assert np.abs(Rg.T @ Rg - Rh.T @ Rh).max(initial=0.0) <= tol * gs * max(k, 1), f
    assert compared > 0
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("ctype", ["double", "float"])
def test_uberkernel_matches_numpy_launch_by_launch(ctype):
    from scipy_gpuqr._schedule.tasks import TaskType
    rng = np.random.default_rng()
    seen = set()
    for name, A in engine_families(rng):
        seen |= _gpu_launch_by_launch(A, ctype, rng, None)
    assert {int(TaskType.S_ASSEMBLE), int(TaskType.PACK_ASSEMBLE), int(TaskType.FACTORIZE),
            int(TaskType.APPLY), int(TaskType.APPLY_FACTORIZE)} <= seen, seen


def _check_against_simulate(A, budget, debug=False, name=""):
    """R's Gram matrix equals simulate's, Q R = A P, and Q is orthogonal.

    (R itself is not compared entrywise: rows past a numerically rank-deficient
    pivot come from rounding noise and differ between summation orders.)
    """
    an = analyze(A)
    s = simulate_factorize(A, an, max_gpu_memory=budget)
    g = gpu_factorize(A, an, max_gpu_memory=budget, debug=debug)
    m, n = A.shape
    k = min(m, n)
    normA = max(float(sp.linalg.norm(A)), 1.0)
    tol = 200 * max(m, n) * EPS * normA
    assert g.info["stages"] == s.info["stages"], name
    assert g.R.shape == s.R.shape and np.isfinite(g.R.data).all(), name
    Rg, Rs = g.R.toarray(), s.R.toarray()
    assert np.abs(Rg.T @ Rg - Rs.T @ Rs).max() <= tol * normA, name
    rng = np.random.default_rng()
    X = rng.standard_normal((n, 2))
    QR = g.q_matmul(np.vstack([Rg @ X, np.zeros((m - k, 2))]))
    assert np.abs(A.toarray()[:, g.colperm] @ X - QR).max() <= tol * np.abs(X).max(), name
    b = rng.standard_normal((m, 2))
    y = g.qt_matmul(b)
    assert np.abs(np.linalg.norm(y, axis=0) - np.linalg.norm(b, axis=0)).max() <= tol, name
    assert np.abs(g.q_matmul(y) - b).max() <= tol, name
    g.free()
    return g


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000, 1])
def test_whole_factorization_matches_simulate(budget):
    rng = np.random.default_rng()
    for name, A in engine_families(rng):
        _check_against_simulate(A, budget, debug=budget == 20000, name=name)


@pytest.mark.gpu
def test_larger_families_match_reference():
    from scipy_gpuqr._engine.host.reference import reference_factorize
    rng = np.random.default_rng()
    for A in (random_values(grid3d_least_squares(12), rng), chessboard_boundary(5, 6, 2)):
        A = A.astype(np.float64)
        an = analyze(A)
        g = gpu_factorize(A, an)
        r = reference_factorize(A, an)
        m, n = A.shape
        normA = max(float(sp.linalg.norm(A)), 1.0)
        Rg, Rr = g.R.toarray(), r.R.toarray()
        tol = 200 * max(m, n) * EPS * normA
        assert np.abs(Rg.T @ Rg - Rr.T @ Rr).max() <= tol * normA
        g.free()


@pytest.mark.gpu
def test_shared_matrices_match_simulate(matrices_dir):
    from conftest import real_shared_matrices
    checked = []
    for name, A in real_shared_matrices(matrices_dir):
        an = analyze(A)
        if an.flops > 3e7 or max(A.shape) > 5000:
            continue
        _check_against_simulate(A, 1 if len(checked) % 3 == 2 else None, name=name)
        checked.append(name)
    assert len(checked) >= 5, checked


@pytest.mark.gpu
def test_qrfactorization_backend_gpu_solves_least_squares():
    from scipy_gpuqr import QRFactorization
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(8), rng)
    b = rng.standard_normal(A.shape[0])
    F = QRFactorization(A, backend="gpu")
    x = F.solve(b)
    xr = np.linalg.lstsq(A.toarray(), b, rcond=None)[0]
    assert np.linalg.norm(x - xr) <= 1e-8 * max(np.linalg.norm(xr), 1.0)
    info = F.info
    assert info["backend"] == "gpu", info
    assert info["backend_info"]["backend"] == "gpu", info["backend_info"]
    F.free()


def _gram_close(R1, R2, A, eps, c=200):
    m, n = A.shape
    normA = max(float(sp.linalg.norm(A)), 1.0)
    a, b = R1.toarray().astype(np.float64), R2.toarray().astype(np.float64)
    return np.abs(a.T @ a - b.T @ b).max(initial=0.0) <= c * max(m, n) * eps * normA ** 2


@pytest.mark.gpu
def test_cold_and_warm_schedules_on_gpu():
    """Cold: records built launch by launch and uploaded per launch (overlapping the
    GPU); warm: the cached, materialized schedule uploaded whole. A one-stage
    schedule whose R layout is known already (here: from the unlimited run) is
    materialized before its launches, so that R's copier runs from the first:
    that run is warm too."""
    from scipy_gpuqr._engine.gpu.rlayout import r_layout_cached
    from scipy_gpuqr._schedule.sparse import clear_schedule_cache
    rng = np.random.default_rng()
    for name, A in list(engine_families(rng)) + list(_odd_shapes(rng)):
        A = sp.csc_array(A, dtype=np.float64)
        an = analyze(A)
        for budget in (None, 20000):
            clear_schedule_cache(an)
            layout_known = r_layout_cached(an) is not None
            g1 = gpu_factorize(A, an, max_gpu_memory=budget)
            if layout_known and len(g1.schedule.stages) == 1:
                assert not g1.info["schedule_cold"], (name, budget)
            else:
                assert g1.info["schedule_cold"] or not g1.schedule.stages, (name, budget)
            g2 = gpu_factorize(A, an, max_gpu_memory=budget)
            assert not g2.info["schedule_cold"], name
            # warm: a device stage's R streams as its entries become final (the last
            # stage's always) or comes from its pool sent to the host; only a host
            # stage's after its launches (an earlier one's on a worker); a
            # matrix without fronts ('wide': every column a singleton, mostly) has no
            # stage and copies nothing
            hows = [how for how, _ in g2.info["r_copy_stages"]]
            nst = g2.info["stages"]
            assert len(hows) == nst, (name, budget, hows)
            for sid, how in enumerate(hows):
                want = ({"after the launches", "after the launches, on a worker"}
                        if sid in g2._host_stages
                        else {"progressive"} if sid == nst - 1
                        else {"progressive", "from the host pool"})
                assert how in want, (name, budget, sid, hows)
            assert g2.info["r_copy_progressive"] == ("progressive" in hows), (name, budget)
            s = simulate_factorize(A, an, max_gpu_memory=budget)
            assert g1.R.shape == s.R.shape and g1.R.nnz == s.R.nnz, name
            assert _gram_close(g1.R, s.R, A, EPS), (name, budget)
            assert _gram_close(g2.R, s.R, A, EPS), (name, budget)
            b = rng.standard_normal(A.shape[0])
            y = g1.qt_matmul(b)
            assert abs(np.linalg.norm(y) - np.linalg.norm(b)) <= 1e-10 * np.linalg.norm(b)
            g1.free()
            g2.free()


@pytest.mark.gpu
def test_progressive_r_copy_on_gpu():
    """Tiny staging slots and chunks: R's values come back in many ranges while the
    launches run (side stream, pinned double buffer) and match simulate."""
    from scipy_gpuqr._engine.gpu.device import CupyDevice
    rng = np.random.default_rng()
    for name, A in (("grid8", random_values(grid3d_least_squares(8), rng)),
                    ("singletons", sp.csc_array(singleton_rich(
                        300, 120, seed=int(rng.integers(1 << 30))), dtype=np.float64))):
        an = analyze(A)
        gpu_factorize(A, an).free()
        dev = CupyDevice(32, 3)
        dev.r_copy_slot_bytes = 512
        dev.r_copy_min_chunk_bytes = 64
        g = gpu_factorize(A, an, device=dev)
        assert g.info["r_copy_progressive"], name
        assert dev.r_copies > 2, (name, dev.r_copies)
        s = simulate_factorize(A, an)
        assert g.R.nnz == s.R.nnz and np.isfinite(g.R.data).all(), name
        assert _gram_close(g.R, s.R, A, EPS), name
        g.free()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_index_upload_through_pinned_buffers(dtype):
    """R's gather index through two pinned buffers in turn: the device array poisoned
    first, every size around the chunk (one plain copy, whole chunks, a short last
    chunk) arrives exactly, on a side stream."""
    import cupy as cp
    from scipy_gpuqr._engine.gpu.rcopy import upload_through_pinned
    rng = np.random.default_rng()
    stream = cp.cuda.Stream(non_blocking=True)
    chunk = 64 * np.dtype(dtype).itemsize
    for n in (1, 63, 64, 65, 128, 1000, 64 * 7 + 5):
        host = rng.integers(0, 1 << 30, n).astype(dtype)
        out = cp.full(n, -1, dtype=dtype)
        upload_through_pinned(cp, out, host, stream, chunk_bytes=chunk)
        stream.synchronize()
        assert np.array_equal(out.get(), host), n


@pytest.mark.gpu
def test_progressive_r_copy_with_its_index_in_pinned_chunks(monkeypatch):
    """The copiers' gather index sent through pinned chunks of a few entries (as a
    multi-device call sends it; one device copies it from pageable memory): R as
    the default run's, bit for bit."""
    from scipy_gpuqr._engine.gpu import rcopy as gpu_rcopy
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(8), rng)
    an = analyze(A)
    ref = gpu_factorize(A, an)
    plain = gpu_rcopy.upload_through_pinned
    sent = []

    def small_chunks(cp, out, host, stream, chunk_bytes=None):
        sent.append(host.size)
        plain(cp, out, host, stream, chunk_bytes=256)
    init = gpu_rcopy.CupyRCopy.__init__

    def through_pinned(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "index_through_pinned": True})
    monkeypatch.setattr(gpu_rcopy, "upload_through_pinned", small_chunks)
    monkeypatch.setattr(gpu_rcopy.CupyRCopy, "__init__", through_pinned)
    g = gpu_factorize(A, an)
    assert sent and max(sent) * 8 > 256
    assert np.array_equal(g.R.indices, ref.R.indices)
    assert np.array_equal(g.R.data, ref.R.data)
    g.free()
    ref.free()


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000])
def test_records_go_up_in_chunks_ahead_of_their_launches(budget):
    """A warm stage's records uploaded in chunks of three records (a launch of fewer
    takes the next launch's first records along, a larger one its own), the
    records' buffer poisoned (debug: type -1, no task), so
    that a launch whose records never went up would leave its work undone: R
    bit for bit the default run's, and simulate's Gram."""
    from scipy_gpuqr._engine.gpu.device import CupyDevice
    from scipy_gpuqr._schedule.tasks import TASK_BYTES
    rng = np.random.default_rng()
    A = random_values(grid3d_least_squares(8), rng)
    an = analyze(A)
    gpu_factorize(A, an, max_gpu_memory=budget).free()      # the schedule materialized
    ref = gpu_factorize(A, an, max_gpu_memory=budget)
    dev = CupyDevice(32, 3, debug=True)
    dev.record_chunk_bytes = 3 * TASK_BYTES
    g = gpu_factorize(A, an, device=dev, max_gpu_memory=budget)
    assert not g.info["schedule_cold"]
    sizes = np.concatenate([np.diff(st.launch_ptr) for st in g.schedule.stages])
    assert ((sizes > 0) & (sizes < 3)).any() and (sizes > 3).any()   # both kinds of chunk
    assert np.array_equal(g.R.indices, ref.R.indices)
    assert np.array_equal(g.R.data, ref.R.data)
    assert _gram_close(g.R, simulate_factorize(A, an, max_gpu_memory=budget).R, A, EPS)
    g.free()
    ref.free()


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 20000, 1])
def test_float32_whole_factorization_on_gpu(budget):
    rng = np.random.default_rng()
    for name, A in engine_families(rng):
        A64 = sp.csc_array(A, dtype=np.float64)
        an = analyze(A64)
        s = simulate_factorize(A64, an, max_gpu_memory=budget)
        g = gpu_factorize(A64.astype(np.float32), an, max_gpu_memory=budget)
        assert g.R.dtype == np.float32, name
        assert np.isfinite(g.R.data).all(), name
        assert _gram_close(g.R, s.R, A64, np.finfo(np.float32).eps, c=50), (name, budget)
        g.free()
