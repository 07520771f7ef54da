"""A host front factorized in column slabs (``scipy_gpuqr._engine.slab_front``):
the slabs cover the front, and the left-looking slab factorization equals the
right-looking blocked one (``factorize_numpy``) to rounding: R, each panel's T,
the reflectors, Q Qᵀ on the front."""

from __future__ import annotations

import numpy as np
import pytest

from scipy_gpuqr._engine.dense_front import DenseFront, factorize_numpy, panels_of
from scipy_gpuqr._engine.slab_front import (ONE_SLAB_PARTS, PART_ROW_BYTES, POOL_UNIT, ROW_ALIGN,
                                            NumpySlabs, factorize_in_slabs, one_slab_parts, padded,
                                            panel_pieces,
                                            one_slab_reserve, part_rows, part_workspace_bytes,
                                            pool_bytes, slab_buffer_elements, slab_columns,
                                            scratch_bytes, slab_part_count, slab_parts,
                                            slab_ranges, slab_sides, whole_front_fits)
from scipy_gpuqr._testing_matrices import staircase_front

EPS = np.finfo(np.float64).eps


def _front_and_blocked_qr(fm, fn, nb, rng) -> tuple:
    """A staircase front, its panels of ``nb`` columns, and LAPACK's blocked QR of a
    copy with its T factors (the reference)."""
    F0, stair = staircase_front(fm, fn, rng, dense_rows=min(fm, 3))
    panels = panels_of(fm, fn, stair, nb)
    ref = F0.copy()
    return F0, panels, ref, factorize_numpy(ref, panels, nb)


def _check_q(F0, F, panels, T, tol) -> None:
    """Qᵀ F0 = [R; 0] and Q (Qᵀ F0) = F0 with the reflectors and T factors in F, T."""
    k = min(F0.shape)
    d = DenseFront(F, panels, T)
    Y = F0.copy()
    d.apply_qt(Y)
    want = np.zeros_like(F0)
    want[:k] = np.triu(F[:k])
    np.testing.assert_allclose(Y, want, atol=tol)
    d.apply_q(Y)
    np.testing.assert_allclose(Y, F0, atol=tol)


@pytest.mark.parametrize("fm,fn,nb,width", [(60, 25, 8, 8), (60, 25, 8, 17), (25, 60, 8, 16),
                                            (25, 60, 8, 9), (90, 90, 16, 40), (70, 33, 7, 7),
                                            (40, 40, 16, 1000), (1, 5, 4, 4), (7, 1, 4, 4)])
def test_slabs_equal_the_blocked_factorization(fm, fn, nb, width):
    rng = np.random.default_rng()
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    F = F0.copy()
    T = factorize_in_slabs(F, panels, nb, width, NumpySlabs())
    scale = max(np.abs(F0).max(), 1.0)
    tol = 100 * max(fm, fn) * EPS * scale
    np.testing.assert_allclose(F, ref, atol=tol)
    np.testing.assert_allclose(T, T_ref, atol=100 * max(fm, fn) * EPS)
    _check_q(F0, F, panels, T, tol)


@pytest.mark.parametrize("fm,fn,nb,width", [(60, 25, 8, 8), (25, 60, 8, 20), (90, 90, 16, 33),
                                            (10, 100, 4, 30), (5, 0, 4, 4)])
def test_slabs_cover_the_front_by_whole_panels(fm, fn, nb, width):
    panels = panels_of(fm, fn, None, nb)
    slabs = slab_ranges(panels, fn, width)
    cols = [c for c0, c1, _, _ in slabs for c in range(c0, c1)]
    assert cols == list(range(fn))
    got = [p for _, _, p0, p1 in slabs for p in range(p0, p1)]
    assert got == list(range(len(panels)))
    for c0, c1, p0, p1 in slabs:
        assert c1 - c0 <= max(width, nb)
        if p1 > p0:
            assert panels[p0][0] == c0 and panels[p1 - 1][0] + panels[p1 - 1][2] == c1


def test_slab_columns_fit_the_bytes_given():
    fm, nb, isz = 20000, 256, 8
    avail = 2 * 10 ** 9
    w = slab_columns(fm, nb, isz, avail)
    assert w >= nb
    # the slab, two earlier panels, a panel's reflectors and the workspace
    assert (fm * w + 7 * fm * nb + 2 * w * nb + 5 * nb * nb) * isz <= avail
    assert slab_columns(fm, nb, isz, fm * nb * isz) == 0     # not even one panel
    fn = 3 * w
    assert not whole_front_fits(fm, fn, nb, isz, avail)
    assert whole_front_fits(fm, w // 2, nb, isz, avail)
    with pytest.raises(ValueError):
        slab_ranges([], 10, 0)


class _Widest(NumpySlabs):
    """The host slab operations, with the widest part :func:`factorize_in_slabs`
    starts with and the slab buffer's size recorded."""

    def start(self, F, npanels, nb, T=None, widest=None):
        self.widest = widest
        return super().start(F, npanels, nb, T=T)

    def slab_buffer(self, F, n):
        self.size = n
        return super().slab_buffer(F, n)


@pytest.mark.parametrize("fm,fn,nb,room", [(300, 400, 16, 0.60), (300, 400, 16, 0.35),
                                           (120, 500, 8, 0.5), (400, 150, 16, 0.9)])
def test_slab_workspace_fits_the_bytes_slab_columns_was_given(fm, fn, nb, room):
    """The device slabs' scratch (:func:`scratch_bytes`) is sized by the widest part
    :func:`factorize_in_slabs` works, not by the front: beside the slab buffer and
    two earlier panels it fits the bytes :func:`slab_columns` sized the slabs
    for. Sized by the front's columns, a wide front's narrow slabs ran out of a
    real pool limit and went to the host (the GPU test below, 3000 x 4000)."""
    isz = 8
    avail = int(room * (fm * fn + 7 * fm * nb) * isz)
    w = slab_columns(fm, nb, isz, avail)
    assert nb <= w < fn and not whole_front_fits(fm, fn, nb, isz, avail)
    rng = np.random.default_rng(fm + fn)
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    F = F0.copy()
    dev = _Widest()
    T = factorize_in_slabs(F, panels, nb, w, dev)
    assert dev.widest <= w < fn
    used = (dev.size + 2 * fm * nb + 5 * nb * nb) * isz + scratch_bytes(fm, dev.widest, nb, isz)
    assert used <= 0.9 * avail
    np.testing.assert_allclose(T, T_ref, atol=100 * max(fm, fn) * EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("upload", ["copy2d", "mapped", "mapped-all"])
@pytest.mark.parametrize("fm,fn,width", [(1500, 1100, 300), (12000, 1400, 300),
                                         (12000, 2900, 1100), (3000, 4000, 1300)])
def test_slabs_on_the_gpu_equal_the_blocked_factorization(fm, fn, width, upload):
    """The CUDA slab operations (panel kernel, cuBLAS) against LAPACK's blocked QR;
    F pinned, as a host front's pool is (the copies asynchronous: a slab's earlier
    panels read F only after the part that made them came back, a slab's parts
    go up only after the work that read their place and the parts they
    overwrite came back); the earlier panels by the 2-D copy or read by a
    kernel where the pinned front lies (``upload``)."""
    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.slab_front import CupySlabs
    rng = np.random.default_rng()
    nb = 256
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    F = cupyx.empty_pinned(F0.shape, dtype=F0.dtype)
    F[...] = F0
    # as many parts as asked (part_row_bytes 0): slabs of several parts on the device
    dev = CupySlabs(cp, cp.cuda.Stream(non_blocking=True), panel_upload=upload,
                    part_row_bytes=0)
    T = factorize_in_slabs(F, panels, nb, width, dev)
    assert (dev.mapped_panels > 0) == (upload != "copy2d")
    slabs = slab_ranges(panels, fn, width)
    assert dev.slabs == len(slabs) > 2
    assert dev.parts == sum(len(slab_parts(panels, s)) for s in slabs)
    assert (dev.parts > dev.slabs) == (width > 2 * nb)
    assert dev.all_finite()
    tol = 1e3 * fm * EPS * np.abs(F0).max()
    # R up to row signs (the panel kernel's and LAPACK's reflectors agree to rounding)
    k = min(fm, fn)
    np.testing.assert_allclose(np.abs(np.triu(F[:k])), np.abs(np.triu(ref[:k])), atol=tol)
    assert T.shape == T_ref.shape
    _check_q(F0, F, panels, T, tol)
    F = F0.copy()
    F[fm - 1, fn - 1] = np.nan                  # in the last slab's trailing columns
    dev = CupySlabs(cp, cp.cuda.Stream(non_blocking=True), panel_upload=upload,
                    part_row_bytes=0)
    factorize_in_slabs(F, panels, nb, width, dev)
    assert not dev.all_finite()


@pytest.mark.gpu
def test_r_values_gathered_as_the_gpu_slab_parts_land():
    """On the device: each part's columns gathered from the pinned pool once its
    copy back has landed (the worker waits for the part's event) equal the
    pool's final values; every value from a part."""
    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.gpu.rcopy import ColumnRCopy, column_bounds, strided_runs
    from scipy_gpuqr._engine.slab_front import CupySlabs
    rng = np.random.default_rng(6)
    fm, fn, nb, width, base = 12000, 1400, 256, 300, 5
    F0, panels, ref, _ = _front_and_blocked_qr(fm, fn, nb, rng)
    pool = cupyx.empty_pinned(base + fm * fn, dtype=np.float64)
    pool[:base] = 0
    F = pool[base:].reshape(fm, fn)
    F[...] = F0
    index = _r_index(fm, fn, base)
    runs = strided_runs(index, fn)
    bounds = column_bounds(index, runs, base, fm, fn)
    copier = ColumnRCopy(pool, index, lambda: (runs, bounds))
    dev = CupySlabs(cp, cp.cuda.Stream(non_blocking=True), on_part=copier.part_done)
    factorize_in_slabs(F, panels, nb, width, dev)
    values = copier.result()
    np.testing.assert_array_equal(values, pool[index])
    assert dev.parts > 2 and sum(b - a for a, b in copier.early) == len(index)
    k = min(fm, fn)
    np.testing.assert_allclose(np.abs(np.triu(F[:k])), np.abs(np.triu(ref[:k])),
                               atol=1e3 * fm * EPS * np.abs(F0).max())


def _host_front_on_gpu_with_room(F, panels, room: int) -> tuple:
    """``HostFrontDevice._on_gpu(F, panels)`` with CuPy's pool limited to ``room``
    bytes beside what it holds: ``(T, how, finite)``. Cached blocks of partly used
    chunks stay after ``free_all_blocks`` and count against the limit
    (:func:`~scipy_gpuqr._engine.memory.largest_block_bytes`), so the room is
    over ``total_bytes``."""
    import types

    import cupy as cp

    from scipy_gpuqr._engine.gpu.device import HostFrontDevice
    from scipy_gpuqr._engine.memory import available_bytes
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    gpu = types.SimpleNamespace(cp=cp, stream=cp.cuda.Stream(non_blocking=True),
                                memory=lambda: available_bytes(cp))
    hd = HostFrontDevice(32, 3, gpu=gpu)
    pool.set_limit(size=pool.total_bytes() + room)
    try:
        return hd._on_gpu(F, panels)
    finally:
        pool.set_limit(size=0)


@pytest.mark.gpu
def test_host_front_too_large_alone_goes_through_the_gpu_in_slabs():
    """Under a pool limit below the front itself, the host front's factorization
    runs in slabs on the GPU and says so; its Q and R are right."""
    rng = np.random.default_rng()
    fm, fn, nb = 3000, 4000, 256
    F0, stair = staircase_front(fm, fn, rng, dense_rows=min(fm, 3))
    panels = panels_of(fm, fn, stair, nb)
    F = F0.copy()
    T, how, finite = _host_front_on_gpu_with_room(F, panels, 60 * 2 ** 20)   # the front: 96 MB
    assert T is not None and how.startswith("in column slabs"), how
    assert finite is True                   # checked on the device, slab by slab
    _check_q(F0, F, panels, T, 1e3 * fm * EPS * np.abs(F0).max())


def test_a_failing_device_slab_is_redone_on_the_host(caplog):
    """A slab part that fails on the device (out of memory, or another error:
    logged) is redone from the front's unchanged columns on the host, with every
    later one; the parts before it (of its slab too) are kept."""
    rng = np.random.default_rng()
    fm, fn, nb = 50, 40, 8
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    slabs = slab_ranges(panels, fn, 16)
    units = [u for s in slabs for u in slab_parts(panels, s)]
    assert len(units) > len(slabs)
    first = np.cumsum([0] + [len(slab_parts(panels, s)) for s in slabs])[:-1]

    class _Failing(NumpySlabs):
        def __init__(self, after, error):
            super().__init__()
            self.after, self.error, self.calls = after, error, 0

        def factorize(self, S, a0, moved, p0):
            self.calls += 1
            if self.calls > self.after:
                S[...] = np.nan          # a half-done part never reaches F
                raise self.error
            return super().factorize(S, a0, moved, p0)

    for after in (2, 3):
        for error in (MemoryError("device full"), RuntimeError("launch failed")):
            F = F0.copy()
            host = NumpySlabs()
            dev = _Failing(after, error)
            with caplog.at_level("WARNING", logger="scipy_gpuqr"):
                T = factorize_in_slabs(F, panels, nb, 16, dev, fallback=host)
            # up to the slab of the failed part (part ``after``, from 0) on the device
            assert dev.slabs == int((first <= after).sum())
            assert host.slabs == host.parts == len(units) - after
            np.testing.assert_allclose(F, ref, atol=1e3 * fm * EPS)
            np.testing.assert_allclose(T, T_ref, atol=1e3 * fm * EPS)
            assert ("launch failed" in caplog.text) == isinstance(error, RuntimeError)
            caplog.clear()
    with pytest.raises(MemoryError):
        factorize_in_slabs(F0.copy(), panels, nb, 16, _Failing(0, MemoryError("full")))


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_slab_parts_cover_each_slab_by_whole_panels(parts):
    """Parts of whole panels, in order, covering their slab; at most ``parts`` and
    at least one panel each (a slab of trailing columns: blocks of at least a
    panel's width); the factorization in parts equals the blocked one."""
    rng = np.random.default_rng()
    for fm, fn, nb, width in ((60, 25, 4, 16), (25, 60, 4, 20), (90, 90, 8, 60), (40, 9, 8, 8)):
        F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
        for slab in slab_ranges(panels, fn, width):
            c0, c1, p0, p1 = slab
            got = slab_parts(panels, slab, parts)
            assert 1 <= len(got) <= parts
            assert [c for a0, a1, _, _ in got for c in range(a0, a1)] == list(range(c0, c1))
            if p1 > p0:
                assert [q for _, _, q0, q1 in got for q in range(q0, q1)] == list(range(p0, p1))
                for a0, a1, q0, q1 in got:
                    assert q1 > q0 and panels[q0][0] == a0
                    assert panels[q1 - 1][0] + panels[q1 - 1][2] == a1
            else:
                assert all(q0 == q1 == p0 for _, _, q0, q1 in got)
                assert len(got) == 1 or min(a1 - a0 for a0, a1, _, _ in got) >= nb
        F = F0.copy()
        dev = NumpySlabs()
        T = factorize_in_slabs(F, panels, nb, width, dev, parts=parts)
        tol = 100 * max(fm, fn) * EPS * max(np.abs(F0).max(), 1.0)
        np.testing.assert_allclose(F, ref, atol=tol)
        np.testing.assert_allclose(T, T_ref, atol=100 * max(fm, fn) * EPS)
        assert dev.parts == sum(len(slab_parts(panels, s, parts))
                                for s in slab_ranges(panels, fn, width))


@pytest.mark.parametrize("fn,width", [(9375, 5965), (9375, 2556), (2900, 1100), (1000, 1000),
                                      (1000, 300)])
def test_the_narrowest_slab_comes_first(fn, width):
    """As few slabs as whole panels of at most ``width`` columns allow, the
    narrowest first: the panels uploaded again for later slabs (the columns
    before each later slab, from their diagonal down) are no more than with the
    widest slabs first (ch7-8-b3's 49340 × 9375 root at 1/2 of its need: 3584
    columns of panels before the second slab instead of 5888)."""
    fm, nb = 49340, 256
    panels = panels_of(fm, fn, None, nb)
    slabs = slab_ranges(panels, fn, width)
    counts = [p1 - p0 for _, _, p0, p1 in slabs]
    assert counts[0] == min(counts)
    assert max(c1 - c0 for c0, c1, _, _ in slabs) <= max(width, nb)
    p, greedy = 0, 0                       # the fewest slabs: greedy from the first panel
    while p < len(panels):
        q = p + 1
        while q < len(panels) and panels[q][0] + panels[q][2] - panels[p][0] <= width:
            q += 1
        greedy, p = greedy + 1, q

    def again(slabs):                      # elements of earlier panels uploaded again
        return sum(rows * b for c0, _, p0, _ in slabs for j, rows, b in panels[:p0])
    assert len(slabs) == greedy
    cuts, p = [], 0
    while p < len(panels):                 # the widest slabs first, for comparison
        q = p + 1
        while q < len(panels) and panels[q][0] + panels[q][2] - panels[p][0] <= width:
            q += 1
        cuts.append((panels[p][0], 0, p, q))
        p = q
    assert again(slabs) <= again(cuts)
    if counts != [p1 - p0 for _, _, p0, p1 in cuts]:
        assert again(slabs) < again(cuts)
    if (fn, width) == (9375, 5965):
        assert [c0 for c0, _, _, _ in slabs] == [0, 3584]



@pytest.mark.parametrize("width,want", [(5965, [False, True]), (2556, [False] * 4)])
def test_slab_sides_of_ch7_8_b3s_root(width, want):
    """ch7-8-b3's 49340 × 9375 root: at 1/2 of its need (slabs of at most 5965
    columns) the narrow first slab leaves room at the buffer's end, where the
    second slab's first part goes (up while the first slab runs); at 1/4 (2556)
    no slab leaves room and every slab lies from the start, its first part in
    place of the first part of the slab before (the first to come back)."""
    fm, fn, nb = 49340, 9375, 256
    panels = panels_of(fm, fn, None, nb)
    plan = [(sl, slab_parts(panels, sl)) for sl in slab_ranges(panels, fn, width)]
    most = max(c1 - c0 for c0, c1, _, _ in slab_ranges(panels, fn, width))
    assert slab_sides(plan, most) == want


def test_slabs_take_the_side_their_first_part_finds_free():
    """In the slab buffer each slab's parts lie without overlap, from its start
    or from its end back (:func:`slab_sides`); a slab's first part takes room
    the slab before did not where the buffer has it, else the side of the slab
    before; the factorization is the blocked one."""
    rng = np.random.default_rng()
    downs = trimmed = 0
    for fm, fn, nb, width in ((60, 56, 4, 24), (60, 48, 4, 16), (50, 90, 4, 30)):
        F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)

        class _Placed(NumpySlabs):
            def __init__(self):
                super().__init__()
                self.at = []
                self.full = []      # per slab: its parts' elements with every row

            def slab_buffer(self, F, n):
                self.at.append([])
                self.full.append(0)
                self.size = n
                return super().slab_buffer(F, n)

            def upload_part(self, F, buf, at, a0, a1, p0, p1, rows=None, cols=None):
                assert buf.size == self.size and cols == a1 - a0     # no pad: slabs of several
                assert rows == part_rows(panels, F.shape[0], p0, p1) <= F.shape[0]
                self.at[-1].append((at, at + rows * (a1 - a0)))
                self.full[-1] += F.shape[0] * (a1 - a0)
                return super().upload_part(F, buf, at, a0, a1, p0, p1, rows, cols)

        F = F0.copy()
        dev = _Placed()
        T = factorize_in_slabs(F, panels, nb, width, dev)
        np.testing.assert_allclose(F, ref, atol=100 * fm * EPS * max(np.abs(F0).max(), 1.0))
        np.testing.assert_allclose(T, T_ref, atol=100 * fm * EPS)
        slabs = slab_ranges(panels, fn, width)
        assert len(dev.at) == len(slabs) > 1
        plan = [(sl, slab_parts(panels, sl)) for sl in slabs]
        want = slab_sides(plan, max(c1 - c0 for c0, c1, _, _ in slabs))
        assert want[0] is False
        # slabs of several: the widest one's columns of every row
        assert dev.size == fm * max(c1 - c0 for c0, c1, _, _ in slabs)
        downs += sum(want)
        for k, spans in enumerate(dev.at):
            assert all(0 <= a < b <= dev.size for a, b in spans)
            assert all(b1 <= a2 or b2 <= a1 for i, (a1, b1) in enumerate(spans)
                       for a2, b2 in spans[i + 1:])
            # from the start: the first part at 0; from the end back: the first at the end
            assert (spans[0][0] != 0) == want[k]
            assert (min(a for a, _ in spans) == 0) or max(b for _, b in spans) == dev.size
            if k:
                # the side is chosen for parts of every row (slab_sides, in columns);
                # they lie down to their staircase only, inside those places
                plo = min(a for a, _ in dev.at[k - 1])
                phi = max(b for _, b in dev.at[k - 1])
                full_lo = dev.size - dev.full[k - 1] if want[k - 1] else 0
                full_hi = dev.size if want[k - 1] else dev.full[k - 1]
                assert full_lo <= plo < phi <= full_hi
                a, b = spans[0]
                first = fm * (plan[k][1][0][1] - plan[k][1][0][0])
                room = first <= full_lo or dev.size - first >= full_hi
                assert (b <= plo or a >= phi) or not room
                trimmed += sum(b - a for a, b in spans) < dev.full[k]
    assert downs > 0
    assert trimmed > 0


def _r_index(fm, fn, base, skip=()):
    """Pool elements of a row-major ``fm × fn`` front's upper trapezoid at ``base``,
    column by column (R's order of a host front's values); columns ``skip`` left out."""
    cols = [j for j in range(fn) if j not in skip]
    return np.concatenate([base + np.arange(min(j + 1, fm)) * fn + j for j in cols]
                          ).astype(np.int64)


@pytest.mark.parametrize("fm,fn,width", [(90, 70, 24), (40, 100, 30), (200, 60, 60)])
def test_r_values_gathered_as_the_slab_parts_land(fm, fn, width):
    """A host front's R values gathered part by part as its slabs' parts come back
    (:class:`ColumnRCopy` told by the slabs) equal the pool's final values at
    their index: every part's columns final once back, later slabs only read them;
    every value comes from a part (nothing left for the end), none twice."""
    from scipy_gpuqr._engine.gpu.rcopy import ColumnRCopy, column_bounds, strided_runs
    rng = np.random.default_rng(3)
    nb, base = 8, 13
    F0, panels, ref, _ = _front_and_blocked_qr(fm, fn, nb, rng)
    pool = np.full(base + fm * fn + 11, np.nan)
    F = pool[base: base + fm * fn].reshape(fm, fn)
    F[...] = F0
    index = _r_index(fm, fn, base, skip=(5, 6, fn - 1))
    runs = strided_runs(index, fn)
    bounds = column_bounds(index, runs, base, fm, fn)
    assert bounds is not None and bounds[0] == 0 and bounds[-1] == len(index)
    assert np.all(np.diff(bounds) >= 0) and bounds[6] == bounds[7]     # columns left out
    seen = []
    copier = ColumnRCopy(pool, index, lambda: (runs, bounds))
    dev = NumpySlabs(on_part=lambda a0, a1, ev: (seen.append((a0, a1)),
                                                 copier.part_done(a0, a1, ev)))
    factorize_in_slabs(F, panels, nb, width, dev)
    values = copier.result()
    np.testing.assert_array_equal(values, pool[index])
    np.testing.assert_allclose(F, ref, atol=1e3 * fm * EPS)
    # every part told once, the last slab's last one panel by panel (:data:`LAST_BY_PANELS`)
    last = slab_parts(panels, slab_ranges(panels, fn, width)[-1])[-1]
    assert len(seen) == dev.parts - 1 + len(panel_pieces(panels, last)) and dev.parts > 1
    assert sorted(seen) == seen and seen[0][0] == 0 and seen[-1][1] == fn
    assert all(a[1] == b[0] for a, b in zip(seen, seen[1:]))
    assert sorted(copier.early) == sorted(
        (int(bounds[a0]), int(bounds[a1])) for a0, a1 in seen if bounds[a1] > bounds[a0])
    assert sum(b - a for a, b in copier.early) == len(index)


def test_r_values_by_columns_the_rest_after_the_launches():
    """Parts not told (a slab redone on the host, a front uploaded whole) are
    gathered after the launches; an index not in column order, or reaching past
    the front, is gathered all at the end; an empty one gives nothing."""
    from scipy_gpuqr._engine.gpu.rcopy import (ColumnRCopy, column_bounds, gather_runs,
                                               runs_between, strided_runs)
    rng = np.random.default_rng(4)
    fm, fn, base = 70, 50, 7
    pool = rng.standard_normal(base + fm * fn + 3)
    index = _r_index(fm, fn, base)
    runs = strided_runs(index, fn)
    bounds = column_bounds(index, runs, base, fm, fn)
    for told in ([], [(0, 10)], [(10, 20), (35, 50)], [(0, 50)]):
        out = np.full(len(index), np.nan)
        copier = ColumnRCopy(pool, index, lambda: (runs, bounds), out=out)
        for a0, a1 in told:
            copier.part_done(a0, a1, None)
        np.testing.assert_array_equal(copier.result(), pool[index])
        assert len(copier.early) == len(told)
    # a range of the runs writes only its own entries
    lo, hi = int(bounds[12]), int(bounds[31])
    out = np.full(len(index), np.nan)
    gather_runs(pool, index, runs_between(runs, lo, hi), out)
    np.testing.assert_array_equal(out[lo:hi], pool[index[lo:hi]])
    assert np.isnan(out[:lo]).all() and np.isnan(out[hi:]).all()
    # not the front's column order, or an entry past the front: no bounds
    rev = _r_index(fm, fn, base)[::-1].copy()
    assert column_bounds(rev, strided_runs(rev, fn), base, fm, fn) is None
    out_of = np.concatenate([index, [base + fm * fn + 1]])
    assert column_bounds(out_of, strided_runs(out_of, fn), base, fm, fn) is None
    assert column_bounds(index, strided_runs(index, fn + 1), base, fm, fn) is None
    copier = ColumnRCopy(pool, rev, lambda: (strided_runs(rev, fn), None))
    copier.part_done(0, 10, None)
    np.testing.assert_array_equal(copier.result(), pool[rev])
    assert copier.early == []
    empty = np.zeros(0, dtype=np.int64)
    assert column_bounds(empty, strided_runs(empty, fn), base, fm, fn).tolist() == [0] * (fn + 1)
    copier = ColumnRCopy(pool, empty, lambda: (strided_runs(empty, fn), None))
    assert copier.result().shape == (0,)


def test_narrow_slabs_go_in_fewer_wider_parts():
    """On a device that copies parts over a link (``part_row_bytes``), a slab whose
    parts' rows would be shorter than that goes in fewer parts (one at least):
    ch7-8-b3's 49340 × 9375 root keeps four parts a slab at 1/2 of its need
    (slabs of 3584 and 5791 columns) and takes two at 1/4 (slabs of 2304 to 2463
    columns); the factorization is the same."""
    assert [slab_part_count(w, 8, 4, PART_ROW_BYTES) for w in (5791, 3584, 2463, 2304, 900, 10)
            ] == [4, 4, 2, 2, 1, 1]
    assert slab_part_count(2304, 4, 4, PART_ROW_BYTES) == 1           # float32 rows are half
    assert slab_part_count(100, 8, 4, 0) == 4 and slab_part_count(10 ** 6, 8, 3, 8) == 3
    fm, nb = 49340, 256
    panels = panels_of(fm, 9375, None, nb)
    for width, want in ((5965, [4, 4]), (2556, [2, 2, 2, 2])):
        got = [len(slab_parts(panels, sl, slab_part_count(sl[1] - sl[0], 8, 4, PART_ROW_BYTES)))
               for sl in slab_ranges(panels, 9375, width)]
        assert got == want, (width, got)
    rng = np.random.default_rng(8)
    F0, panels, ref, T_ref = _front_and_blocked_qr(90, 90, 8, rng)
    seen = set()
    for row_bytes in (0, 12 * 8, 24 * 8):
        F = F0.copy()
        dev = NumpySlabs(part_row_bytes=row_bytes)
        T = factorize_in_slabs(F, panels, 8, 33, dev)
        slabs = slab_ranges(panels, 90, 33)
        counts = [slab_part_count(c1 - c0, 8, 4, row_bytes) for c0, c1, _, _ in slabs]
        assert dev.parts == sum(len(slab_parts(panels, sl, k)) for sl, k in zip(slabs, counts))
        cols = row_bytes // 8               # a part's row holds that many columns or more
        assert all(k == 1 or (c1 - c0) // k >= cols for (c0, c1, _, _), k in zip(slabs, counts))
        seen.add(dev.parts)
        np.testing.assert_allclose(F, ref, atol=1e3 * 90 * EPS)
        np.testing.assert_allclose(T, T_ref, atol=1e3 * 90 * EPS)
    assert len(seen) == 3                   # four, two and one part a slab


def _ch7_8_b3_root():
    """ch7-8-b3's root front (49340 × 9375) and its panels with its staircase."""
    from scipy_gpuqr._symbolic import analyze
    from scipy_gpuqr._testing_matrices import chessboard_boundary
    fs = analyze(chessboard_boundary(7, 8, 3)).fronts
    f = int(np.argmax(np.asarray(fs.fm, dtype=np.int64) * np.asarray(fs.fn, dtype=np.int64)))
    fm, fn = int(fs.fm[f]), int(fs.fn[f])
    return fm, fn, panels_of(fm, fn, fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]], 256)


def _one_slab_need(panels, fm, fn, nb, parts, geqrf=False, align=ROW_ALIGN):
    """Bytes a one-slab front in ``parts`` takes on the device: its buffer and
    what :class:`CupySlabs` allocates beside it, as CuPy's pool takes them (the
    parts' rows padded to ``align`` elements, as it lays them)."""
    slab = (0, fn, 0, len(panels))
    pieces = slab_parts(panels, slab, parts)
    size = slab_buffer_elements([(slab, pieces)], panels, fm, align)
    return pool_bytes(size * 8) + one_slab_reserve(panels, pieces, fm, nb, 8, geqrf=geqrf,
                                                   align=align)


def test_ch7_8_b3s_root_is_one_slab_at_half_its_need():
    """ch7-8-b3's root at 1/2 of the one-stage need (3,432,269,534 bytes for a
    slab beside what the pool held, as the H200 runs found): its rectangle took
    two column slabs of every row (5965 columns at most, a 2.29 GB buffer), the
    first slab's panels sent up again for the second; its eight parts down to
    their staircases take 2.56 GB, 69 % of the rectangle, and fit as one slab.
    Beside the buffer the device holds the panels' T and the scratch (144 MB),
    so four to seven parts fit there too (the 404 MB of ``4 fm nb`` and 10 % of
    the bytes counted before did not leave room for fewer than six). At 1/4
    (1.7 GB for the slab) the front still takes slabs of several."""
    fm, fn, panels = _ch7_8_b3_root()
    assert (fm, fn) == (49340, 9375)
    half = 3_432_269_534
    assert slab_columns(fm, 256, 8, half) == 5965
    k = one_slab_parts(panels, fm, fn, 256, 8, half, PART_ROW_BYTES)
    assert k == ONE_SLAB_PARTS == 8
    parts = slab_parts(panels, (0, fn, 0, len(panels)), k)
    size = slab_buffer_elements([((0, fn, 0, len(panels)), parts)], panels, fm)
    assert 2.5e9 < 8 * size < 2.6e9 and size < 0.7 * fm * fn
    reserve = one_slab_reserve(panels, parts, fm, 256, 8)
    # the panels' T (37 of 256 x 256) and the scratch, nothing else: every part's
    # workspace is cut from the scratch
    assert reserve == pool_bytes(37 * 256 * 256 * 8) + pool_bytes(scratch_bytes(fm, 1280, 256, 8))
    assert 140e6 < reserve < 145e6
    # the H200 runs' pool peak: 3.247 GB with 547 MB held before the slab
    assert abs(pool_bytes(8 * size) + reserve + 547e6 - 3.247e9) < 1e6
    for fewer in (4, 5, 6, 7):
        assert one_slab_parts(panels, fm, fn, 256, 8, half, PART_ROW_BYTES, parts=fewer) == fewer
        assert _one_slab_need(panels, fm, fn, 256, fewer) < half
    assert one_slab_parts(panels, fm, fn, 256, 8, 1_700_000_000, PART_ROW_BYTES) == 0
    assert one_slab_parts(panels, fm, fn, 256, 8, half, PART_ROW_BYTES, parts=0) == 0
    # panels through cuSOLVER's geqrf add blocks per part: eight no longer fit in
    # 2.8 GB, where the panel kernel's do
    assert one_slab_parts(panels, fm, fn, 256, 8, 2_800_000_000, PART_ROW_BYTES) == 8
    assert one_slab_parts(panels, fm, fn, 256, 8, 2_800_000_000, PART_ROW_BYTES,
                          geqrf=True) == 0


def test_one_slab_parts_fit_the_bytes_given():
    """The whole front goes as one slab exactly where its parts down to their
    staircases and what the device allocates beside them fit the bytes; the
    count is the parts asked for, fewer where rows would be short or panels
    few."""
    rng = np.random.default_rng(3)
    fm, fn, nb = 400, 300, 16
    _, stair = staircase_front(fm, fn, rng, dense_rows=3)
    panels = panels_of(fm, fn, stair, nb)
    slab = (0, fn, 0, len(panels))
    for parts in (1, 3, 8):
        size = slab_buffer_elements([(slab, slab_parts(panels, slab, parts))], panels, fm)
        need = _one_slab_need(panels, fm, fn, nb, parts)
        assert size <= fm * fn and need > 8 * size
        assert one_slab_parts(panels, fm, fn, nb, 8, need, parts=parts) == parts
        assert one_slab_parts(panels, fm, fn, nb, 8, need - 1, parts=parts) == 0
    big = 10 ** 9
    assert one_slab_parts(panels, fm, fn, nb, 8, big, row_bytes=fn * 8 // 2, parts=8) == 2
    assert one_slab_parts(panels[:2], fm, 2 * nb, nb, 8, big, parts=8) == 2
    assert one_slab_parts([], fm, 0, nb, 8, big) == 0
    wide = panels_of(fn, fm, None, nb)            # 300 x 400: 100 columns past the panels
    assert one_slab_parts(wide, fn, fm, nb, 8, big) == 0


@pytest.mark.parametrize("parts,fails", [(4, 1), (4, 3), (5, 2), (8, 7), (4, 4)])
def test_a_one_slab_part_out_of_memory_is_redone_on_the_host(parts, fails):
    """A front worked as one slab in few, wide parts (the count the reserve lets
    fit): a part whose workspace the device cannot give (an out-of-memory error at
    its own panels or at an update from the parts before it) is redone from the
    front's unchanged columns on the host with every later part; the parts before
    it stay, and the result is the blocked factorization. The last part goes
    back panel by panel (:data:`LAST_BY_PANELS`): a failure at one of its later
    panels is redone from that panel, the panels sent back before it stay."""
    rng = np.random.default_rng(parts + fails)
    fm, fn, nb = 120, 80, 8
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    pieces = slab_parts(panels, (0, fn, 0, len(panels)), parts)
    assert len(pieces) == parts
    units = pieces[:-1] + panel_pieces(panels, pieces[-1])
    assert fails < len(units)

    class _Full(NumpySlabs):
        def __init__(self, at_update):
            super().__init__()
            self.at_update, self.worked = at_update, 0

        def apply(self, S, j, rows, E, i0, k0, b, T):
            if self.at_update and self.worked == fails:
                S[...] = np.nan
                raise MemoryError("out of memory allocating the update workspace")
            return super().apply(S, j, rows, E, i0, k0, b, T)

        def factorize(self, S, a0, moved, p0):
            if self.worked == fails:
                S[...] = np.nan
                raise MemoryError("out of memory allocating the panel buffer")
            self.worked += 1
            return super().factorize(S, a0, moved, p0)

    for at_update in (False, True):
        F = F0.copy()
        host = NumpySlabs()
        dev = _Full(at_update)
        T = factorize_in_slabs(F, panels, nb, fn, dev, fallback=host, parts=parts)
        assert dev.slabs == 1 and host.parts == len(units) - fails
        np.testing.assert_allclose(F, ref, atol=1e3 * fm * EPS)
        np.testing.assert_allclose(T, T_ref, atol=1e3 * fm * EPS)
    # the last part whole (as before): every panel of it redone with it
    F = F0.copy()
    host = NumpySlabs()
    dev = _Full(False)
    if fails < parts:
        factorize_in_slabs(F, panels, nb, fn, dev, fallback=host, parts=parts,
                           last_by_panels=False)
        assert host.parts == parts - fails
        np.testing.assert_allclose(F, ref, atol=1e3 * fm * EPS)


@pytest.mark.parametrize("fm,fn,parts", [(12000, 2900, 8), (6000, 4000, 8), (5000, 3000, 3),
                                         (20000, 6000, 4), (3000, 2000, 2)])
def test_one_slab_reserve_is_what_the_device_allocates(fm, fn, parts):
    """:func:`one_slab_reserve` sums the arrays :class:`CupySlabs` holds beside the
    buffer: with panels of 256 the scratch holds each part's update workspace
    and its own panels' workspace (:func:`part_workspace_bytes`), with the
    flags of the parts before it, so the reserve is the panels' T and the
    scratch; cuSOLVER's geqrf panels take blocks of their own for every part
    (its panel copy and workspace), as the pool keeps each part's larger ones."""
    rng = np.random.default_rng(fm + fn)
    nb, isz = 256, 8
    _, stair = staircase_front(fm, fn, rng, dense_rows=3)
    panels = panels_of(fm, fn, stair, nb)
    pieces = slab_parts(panels, (0, fn, 0, len(panels)), parts)
    widest = max(a1 - a0 for a0, a1, _, _ in pieces)
    scratch = pool_bytes(scratch_bytes(fm, widest, nb, isz))
    T = pool_bytes(len(panels) * nb * nb * isz)
    for g, part in enumerate(pieces):
        updates, own = part_workspace_bytes(panels, part, fm, widest, nb, isz)
        assert updates == pool_bytes((fm * nb + 2 * widest * nb) * isz)
        assert 0 < own and max(updates, own) + g * POOL_UNIT <= scratch
        assert updates % POOL_UNIT == 0 and own % POOL_UNIT == 0
    assert one_slab_reserve(panels, pieces, fm, nb, isz) == T + scratch
    over = 0
    for g, part in enumerate(pieces):
        _, own = part_workspace_bytes(panels, part, fm, widest, nb, isz, geqrf=True)
        over += max(0, own + g * POOL_UNIT - scratch)
    assert one_slab_reserve(panels, pieces, fm, nb, isz, geqrf=True) == T + scratch + over
    assert pool_bytes(0) == pool_bytes(1) == POOL_UNIT and pool_bytes(513) == 2 * POOL_UNIT


class _OneSlab(NumpySlabs):
    """The host slab operations, with the buffer's size, the parts' places and the
    earlier panels brought up counted."""

    def __init__(self):
        super().__init__()
        self.size, self.at, self.panels_up = 0, [], 0

    def slab_buffer(self, F, n):
        self.size = n
        self.buf = super().slab_buffer(F, n)
        return self.buf

    def upload_part(self, F, buf, at, a0, a1, p0, p1, rows=None, cols=None):
        self.at.append((at, at + rows * cols))
        return super().upload_part(F, buf, at, a0, a1, p0, p1, rows, cols)

    def upload_panel(self, *args):
        self.panels_up += 1
        return super().upload_panel(*args)


@pytest.mark.parametrize("fm,fn,nb,parts", [(90, 70, 8, 8), (60, 25, 8, 3), (40, 40, 16, 8),
                                            (200, 60, 4, 5), (1, 1, 4, 8)])
def test_one_slab_equals_the_blocked_factorization(fm, fn, nb, parts):
    """The whole front as one slab (its width the front's): the parts lie back to
    back in a buffer of their staircases' size, no earlier panel goes up, and
    the factorization is the blocked one to rounding."""
    rng = np.random.default_rng(fm + fn)
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    F = F0.copy()
    dev = _OneSlab()
    T = factorize_in_slabs(F, panels, nb, fn, dev, parts=parts)
    pieces = slab_parts(panels, (0, fn, 0, len(panels)), parts)
    assert dev.slabs == 1 and dev.parts == len(pieces) and dev.panels_up == 0
    assert dev.size == sum(part_rows(panels, fm, q0, q1) * (a1 - a0)
                           for a0, a1, q0, q1 in pieces) <= fm * fn
    assert dev.at[0][0] == 0 and dev.at[-1][1] == dev.size
    assert all(b == a for (_, b), (a, _) in zip(dev.at, dev.at[1:]))
    tol = 100 * max(fm, fn) * EPS * max(np.abs(F0).max(), 1.0)
    np.testing.assert_allclose(F, ref, atol=tol)
    np.testing.assert_allclose(T, T_ref, atol=100 * max(fm, fn) * EPS)
    _check_q(F0, F, panels, T, tol)


@pytest.mark.parametrize("fm,fn,nb,parts,align", [(90, 70, 8, 8, 8), (60, 25, 8, 3, 4),
                                                  (200, 61, 4, 5, 8), (45, 41, 16, 8, 3)])
def test_one_slab_with_padded_rows_equals_the_blocked_factorization(fm, fn, nb, parts, align):
    """A one-slab front whose parts' rows are padded to ``align`` elements (the
    device's :data:`ROW_ALIGN`; here a part holds the front's last, narrower
    panel): the parts lie back to back at their padded sizes, the pads stay
    zero through every update and panel and never reach the front, and the
    factorization is the blocked one to rounding; slabs of several are not
    padded."""
    rng = np.random.default_rng(fm + fn + align)
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    F = F0.copy()
    dev = _OneSlab()
    dev.row_align = align
    T = factorize_in_slabs(F, panels, nb, fn, dev, parts=parts)
    pieces = slab_parts(panels, (0, fn, 0, len(panels)), parts)
    widths = [a1 - a0 for a0, a1, _, _ in pieces]
    assert any(w % align for w in widths)
    want = [part_rows(panels, fm, q0, q1) * padded(a1 - a0, align) for a0, a1, q0, q1 in pieces]
    assert dev.size == sum(want) == slab_buffer_elements(
        [((0, fn, 0, len(panels)), pieces)], panels, fm, align)
    assert [b - a for a, b in dev.at] == want and dev.at[-1][1] == dev.size
    for (a, b), (_, _, q0, q1), w in zip(dev.at, pieces, widths):
        part = dev.buf[a:b].reshape(part_rows(panels, fm, q0, q1), -1)
        assert part.shape[1] == padded(w, align) and not part[:, w:].any()
    tol = 100 * max(fm, fn) * EPS * max(np.abs(F0).max(), 1.0)
    np.testing.assert_allclose(F, ref, atol=tol)
    np.testing.assert_allclose(T, T_ref, atol=100 * max(fm, fn) * EPS)
    _check_q(F0, F, panels, T, tol)
    # slabs of several (a width short of the front): every part as wide as its columns
    F = F0.copy()
    dev = _OneSlab()
    dev.row_align = align
    factorize_in_slabs(F, panels, nb, max(nb, fn // 2), dev, parts=parts)
    assert dev.slabs > 1
    np.testing.assert_allclose(F, ref, atol=tol)


def test_padded_rows_in_the_one_slab_count():
    """:func:`one_slab_parts` counts the parts' rows padded to :data:`ROW_ALIGN`
    (ch7-8-b3's root: its last part of 927 columns takes a column more), and
    the reserve the padded widest part's workspace."""
    fm, fn, panels = _ch7_8_b3_root()
    slab = (0, fn, 0, len(panels))
    pieces = slab_parts(panels, slab, 8)
    plain = slab_buffer_elements([(slab, pieces)], panels, fm)
    pad = slab_buffer_elements([(slab, pieces)], panels, fm, ROW_ALIGN)
    assert [a1 - a0 for a0, a1, _, _ in pieces][-1] == 927
    assert pad - plain == fm * (padded(927, ROW_ALIGN) - 927) > 0
    need = _one_slab_need(panels, fm, fn, 256, 8)
    assert one_slab_parts(panels, fm, fn, 256, 8, need, PART_ROW_BYTES) == 8
    assert one_slab_parts(panels, fm, fn, 256, 8, need - 1, PART_ROW_BYTES) == 0
    assert one_slab_parts(panels, fm, fn, 256, 8, need - 1, PART_ROW_BYTES, align=1) == 8
    assert padded(927, 8) == 928 and padded(928, 8) == 928 and padded(5, 1) == 5


@pytest.mark.gpu
@pytest.mark.parametrize("fm,fn", [(12000, 2900), (6000, 4000), (7001, 2999)])
def test_one_slab_on_the_gpu_equals_the_blocked_factorization(fm, fn):
    """One slab of eight parts on the device (each part's work waits only for its
    own copy): the blocked factorization, R up to row signs; the pool held at
    most the buffer and the workspace :func:`one_slab_parts` counts."""
    import cupy as cp
    import cupyx

    from scipy_gpuqr._engine.slab_front import CupySlabs
    rng = np.random.default_rng(fn)
    nb = 256
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    F = cupyx.empty_pinned(F0.shape, dtype=F0.dtype)
    F[...] = F0
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.total_bytes()
    dev = CupySlabs(cp, cp.cuda.Stream(non_blocking=True), part_row_bytes=0)
    T = factorize_in_slabs(F, panels, nb, fn, dev, parts=8)
    pieces = slab_parts(panels, (0, fn, 0, len(panels)), 8)
    # the parts' rows padded as the device lays them (7001 x 2999: the last part)
    size = slab_buffer_elements([((0, fn, 0, len(panels)), pieces)], panels, fm, ROW_ALIGN)
    assert dev.slabs == 1 and dev.parts == len(pieces) == 8
    assert before < dev.pool_peak - 8 * size
    # beside the buffer: the scratch the parts' workspaces are cut from and the
    # panels' T (:func:`one_slab_reserve`); not a new block for each part's taller
    # panel buffer. Either may be cut from a block the pool held partly in use.
    reserve = one_slab_reserve(panels, pieces, fm, nb, 8, align=ROW_ALIGN)
    assert pool_bytes(8 * size) < dev.pool_peak - before <= pool_bytes(8 * size) + reserve
    assert dev.all_finite()
    tol = 1e3 * fm * EPS * np.abs(F0).max()
    k = min(fm, fn)
    np.testing.assert_allclose(np.abs(np.triu(F[:k])), np.abs(np.triu(ref[:k])), atol=tol)
    _check_q(F0, F, panels, T, tol)


@pytest.mark.gpu
def test_host_front_whose_staircase_fits_goes_as_one_slab():
    """Under a pool limit below the front's rectangle but above its staircase and
    workspace, the host front goes through the GPU as one slab and says so; its
    Q and R are right, checked on the device."""
    from scipy_gpuqr._engine.memory import POOL_USABLE
    rng = np.random.default_rng(11)
    fm, fn, nb = 5000, 3000, 256
    F0, stair = staircase_front(fm, fn, rng, dense_rows=min(fm, 3))
    panels = panels_of(fm, fn, stair, nb)
    slab = (0, fn, 0, len(panels))
    k = slab_part_count(fn, 8, ONE_SLAB_PARTS, PART_ROW_BYTES)     # 3: rows of 8 KB
    size = slab_buffer_elements([(slab, slab_parts(panels, slab, k))], panels, fm)
    need = _one_slab_need(panels, fm, fn, nb, k)
    room = int(need / POOL_USABLE) + (4 << 20)      # blocks the pool held partly in use
    assert not whole_front_fits(fm, fn, nb, 8, room)
    # below what ``4 fm nb`` beside the buffer and 10 % spare asked for
    assert room < (size + 4 * fm * nb + 2 * fn * nb + 5 * nb * nb) * 8 / 0.9
    F = F0.copy()
    T, how, finite = _host_front_on_gpu_with_room(F, panels, room)
    assert T is not None and how.startswith(f"in column slabs: one slab of {k} parts"), how
    assert "on the host" not in how, how       # no part ran out of the pool
    assert finite is True
    _check_q(F0, F, panels, T, 1e3 * fm * EPS * np.abs(F0).max())


@pytest.mark.gpu
def test_geqrf_panels_follow_the_panel_kernels_plan():
    """A one-slab front's count takes cuSOLVER's geqrf blocks where this device's
    panel kernel cannot take its tallest panel, or the panel method is geqrf."""
    from scipy_gpuqr._engine.dense_front import geqrf_panels
    from scipy_gpuqr._engine.gpu.dense_panel import panel_kernel
    for fm in (3000, 49340, 400_000):
        panels = panels_of(fm, 1024, None, 256)
        assert geqrf_panels(panels, np.float64) == (panel_kernel(np.float64).plan(fm) is None)
        assert geqrf_panels(panels, np.float64, "geqrf")
    assert not geqrf_panels([], np.float64)


@pytest.mark.parametrize("by_panels", [True, False])
def test_last_part_goes_back_panel_by_panel(by_panels):
    """The last part of a one-slab front goes back panel by panel
    (:data:`LAST_BY_PANELS`): each panel's columns are final when told, the
    later ones still being worked; the same factorization bit for bit as the
    part whole, whose columns are told once."""
    rng = np.random.default_rng(5)
    fm, fn, nb, parts = 120, 80, 8, 4
    F0, panels, ref, T_ref = _front_and_blocked_qr(fm, fn, nb, rng)
    pieces = slab_parts(panels, (0, fn, 0, len(panels)), parts)
    last = panel_pieces(panels, pieces[-1])
    assert len(last) == 2 and panel_pieces(panels, pieces[0]) != [pieces[0]]
    assert panel_pieces(panels, (0, 8, 0, 1)) == [(0, 8, 0, 1)]
    F = F0.copy()
    told, tol = [], 1e3 * fm * EPS

    def on_part(a0, a1, ev):
        np.testing.assert_allclose(F[:, a0:a1], ref[:, a0:a1], atol=tol)
        told.append((a0, a1))

    T = factorize_in_slabs(F, panels, nb, fn, NumpySlabs(on_part=on_part), parts=parts,
                           last_by_panels=by_panels)
    whole = [(a0, a1) for a0, a1, _, _ in pieces]
    assert told == (whole[:-1] + [(a0, a1) for a0, a1, _, _ in last] if by_panels else whole)
    np.testing.assert_allclose(F, ref, atol=tol)
    F2 = F0.copy()
    T2 = factorize_in_slabs(F2, panels, nb, fn, NumpySlabs(), parts=parts,
                            last_by_panels=not by_panels)
    np.testing.assert_array_equal(F, F2)
    np.testing.assert_array_equal(T, T2)
