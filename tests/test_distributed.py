"""Dask: the batched functions on Dask arrays and ``solve_many`` across workers.

A ``LocalCluster`` of CPU workers (threads of this process, plus one test with
worker processes, where every task crosses a pickle) runs the Dask paths; every
result is compared with the NumPy call on the whole stack, or with the
problems solved one by one. The GPU test runs CuPy chunks on one worker.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sps
from scipy.linalg import LinAlgError, LinAlgWarning

import scipy_gpuqr as g
from test_batched_cases import spd_batch

dask = pytest.importorskip("dask", reason="the dask extra is part of the test extra")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("dask.distributed")

from scipy_gpuqr.distributed import solve_many  # noqa: E402


@pytest.fixture(scope="module")
def client():
    """Two single-threaded workers in this process (quick to start)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        yield c


def _same(got, ref):
    """Equal to the NumPy call: integers exactly, floats to the last bits."""
    assert type(got) is type(ref) and got.shape == ref.shape and got.dtype == ref.dtype
    if ref.dtype.kind in "iub":
        np.testing.assert_array_equal(got, ref)
    else:
        scale = float(np.max(np.abs(ref), initial=1.0))
        np.testing.assert_allclose(got, ref, rtol=0, atol=8 * np.finfo(ref.dtype).eps * scale)


def _stack(rng, batch, n, dtype=np.float64):
    return (rng.standard_normal(batch + (n, n)) + n * np.eye(n)).astype(dtype)


# ----------------------------------------------------------------------------
# the batched functions: Dask results equal the NumPy call
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("return_info", [False, True])
def test_lu_factor_and_solve(client, rng, dtype, return_info):
    a = _stack(rng, (7, 5), 6, dtype)
    d = da.from_array(a, chunks=(3, 2, 6, 6))
    out = g.lu_factor_batched(d, return_info=return_info)
    ref = g.lu_factor_batched(a, return_info=return_info)
    assert all(isinstance(o, da.Array) for o in out) and len(out) == len(ref)
    assert out[0].chunks[:2] == d.chunks[:2]
    for got, want in zip(client.compute(out, sync=True), ref):
        _same(got, want)
    lu, piv = out[:2]
    for b in (rng.standard_normal(6),                      # one vector for all
              rng.standard_normal((7, 5, 6, 2)),           # one per matrix
              rng.standard_normal((5, 6, 1)),              # broadcast over axis 0
              rng.standard_normal((1, 5, 6, 3))):          # a batch axis of length 1
        for trans in (0, 1):
            x = g.lu_solve_batched((lu, piv), b, trans)
            assert isinstance(x, da.Array)
            _same(x.compute(), g.lu_solve_batched(ref[:2], b, trans))


def test_lu_solve_with_dask_rhs_only(client, rng):
    """A Dask b next to NumPy factors: the call still goes to Dask, chunked like b."""
    a = _stack(rng, (9,), 5)
    lu, piv = g.lu_factor_batched(a)
    b = rng.standard_normal((9, 5, 2))
    x = g.lu_solve_batched((lu, piv), da.from_array(b, chunks=(4, 5, 2)))
    assert isinstance(x, da.Array) and x.chunks[0] == (4, 4, 1)
    _same(x.compute(), g.lu_solve_batched((lu, piv), b))


@pytest.mark.parametrize("return_info", [False, True])
def test_solve_and_inv(client, rng, return_info):
    a = _stack(rng, (11,), 8)
    d = da.from_array(a, chunks=(4, 8, 8))
    for b in (rng.standard_normal(8), rng.standard_normal((11, 8, 3)),
              da.from_array(rng.standard_normal((11, 8, 1)), chunks=(5, 8, 1))):
        got = g.solve_batched(d, b, return_info=return_info)
        ref = g.solve_batched(a, b.compute() if isinstance(b, da.Array) else b,
                              return_info=return_info)
        for x, want in zip(*((client.compute(got, sync=True), ref) if return_info
                             else ((got.compute(),), (ref,)))):
            _same(x, want)
    got = g.inv_batched(d, return_info=return_info)
    ref = g.inv_batched(a, return_info=return_info)
    for x, want in zip(*((dask.compute(*got), ref) if return_info
                         else ((got.compute(),), (ref,)))):
        _same(x, want)


@pytest.mark.parametrize("lower", [False, True])
def test_cholesky(client, rng, lower):
    a = spd_batch(rng, 10, 7, np.float64)
    d = da.from_array(a, chunks=(3, 7, 7))
    c, low = g.cho_factor_batched(d, lower=lower)
    rc, rlow = g.cho_factor_batched(a, lower=lower)
    assert low is rlow and isinstance(c, da.Array)
    _same(c.compute(), rc)
    c2, low2, info = g.cho_factor_batched(d, lower, return_info=True)
    _same(info.compute(), g.cho_factor_batched(a, lower, return_info=True)[2])
    b = rng.standard_normal((10, 7, 2))
    _same(g.cho_solve_batched((c, low), b).compute(), g.cho_solve_batched((rc, rlow), b))
    _same(g.cho_solve_batched((c, np.array([lower] * 10)), b[0, :, 0]).compute(),
          g.cho_solve_batched((rc, rlow), b[0, :, 0]))


def test_matrix_axes_chunked_are_rechunked(client, rng):
    a = _stack(rng, (6,), 8)
    d = da.from_array(a, chunks=(2, 3, 5))          # matrices split across chunks
    lu, piv = g.lu_factor_batched(d)
    assert lu.chunks == ((2, 2, 2), (8,), (8,)) and piv.chunks == ((2, 2, 2), (8,))
    ref = g.lu_factor_batched(a)
    _same(lu.compute(), ref[0])
    _same(piv.compute(), ref[1])
    b = da.from_array(rng.standard_normal((6, 8, 4)), chunks=(3, 4, 2))
    _same(g.solve_batched(d, b).compute(), g.solve_batched(a, b.compute()))


def test_one_matrix_and_empty_batch(client, rng):
    a = _stack(rng, (), 5)
    x = g.inv_batched(da.from_array(a, chunks=(2, 5)))
    assert x.shape == (5, 5)
    _same(x.compute(), g.inv_batched(a))
    e = np.zeros((0, 4, 4))
    lu, piv = g.lu_factor_batched(da.from_array(e))
    assert lu.compute().shape == (0, 4, 4) and piv.compute().shape == (0, 4)


# ----------------------------------------------------------------------------
# singular matrices and bad input
# ----------------------------------------------------------------------------

def _singular_stack(rng):
    a = _stack(rng, (6, 4), 5)
    a[4, 3, :, 2] = 0                       # global batch index (4, 3)
    a[1, 0, 1] = 0                          # (1, 0)
    return a, da.from_array(a, chunks=(3, 2, 5, 5))


@pytest.mark.parametrize("fn", ["inv_batched", "solve_batched"])
def test_singular_raises_with_global_index(client, rng, fn):
    a, d = _singular_stack(rng)
    args = (d, np.ones(5)) if fn == "solve_batched" else (d,)
    x = getattr(g, fn)(*args)               # lazy: nothing raised yet
    with pytest.raises(LinAlgError, match=r"singular matrix at batch index \[\((4, 3|1, 0)\)\]"):
        x.compute()
    got, info = getattr(g, fn)(*args, return_info=True)
    ref, rinfo = getattr(g, fn)(*((a,) + args[1:]), return_info=True)
    _same(info.compute(), rinfo)
    assert np.flatnonzero(rinfo).tolist() == [4, 19]
    np.testing.assert_array_equal(np.isnan(got.compute()), np.isnan(ref))


def test_not_positive_definite_names_global_index(client, rng):
    a = spd_batch(rng, 9, 4, np.float64)
    a[7] = -a[7]
    with pytest.raises(LinAlgError, match=r"not positive definite at batch index \[7\] "
                                          r"\(.*in the Dask chunk of batch indices \[6:9\]"):
        g.cho_factor_batched(da.from_array(a, chunks=(3, 4, 4)))[0].compute()


def test_lu_factor_warns_where_the_task_runs(rng):
    """Under the local scheduler the warning reaches the caller, with global indices."""
    a, d = _singular_stack(rng)
    lu, piv = g.lu_factor_batched(d)
    with pytest.warns(LinAlgWarning) as record, dask.config.set(scheduler="sync"):
        dask.compute(lu, piv)
    text = " ".join(str(w.message) for w in record)
    assert "(4, 3)" in text and "(1, 0)" in text and "Dask chunk" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, info = g.lu_factor_batched(d, return_info=True)
        _same(info.compute(scheduler="sync"), g.lu_factor_batched(a, return_info=True)[2])


def test_lu_factor_warning_reaches_the_client(rng):
    """On a dask.distributed worker process the LinAlgWarning is also sent to the
    client (distributed.warn), with global indices; a chunk without singular
    matrices sends nothing."""
    a, d = _singular_stack(rng)
    good = da.from_array(_stack(rng, (6,), 5), chunks=(2, 5, 5))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c, warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        c.compute(g.lu_factor_batched(good), sync=True)
        c.compute(g.lu_factor_batched(d), sync=True)
        deadline = time.monotonic() + 20        # the event comes through the client's loop
        while time.monotonic() < deadline and sum(
                issubclass(w.category, LinAlgWarning) for w in record) < 2:
            time.sleep(0.05)
    got = [str(w.message) for w in record if issubclass(w.category, LinAlgWarning)]
    assert len(got) == 2, got                   # the two chunks holding (1, 0) and (4, 3)
    text = " ".join(got)
    assert "(4, 3)" in text and "(1, 0)" in text and "Dask chunk" in text


def _generated(n, chunks, calls=None):
    """A Dask stack whose chunks are made by map_blocks (as a user would generate or
    load them), recording the seeds it is called with."""
    def make(seed, block_info=None):
        s = int(np.asarray(seed).ravel()[0])
        if calls is not None:
            calls.append(s)
        r = np.random.default_rng(s)
        return r.standard_normal((block_info[None]["chunk-shape"][0], n, n)) + n * np.eye(n)
    seeds = da.from_array(np.arange(len(chunks)), chunks=1)
    return seeds.map_blocks(make, new_axis=[1, 2], chunks=(tuple(chunks), (n,), (n,)),
                            dtype=np.float64)


def test_one_task_per_chunk(client, rng):
    """A chunk generated by map_blocks, factorized and solved runs as one task (plus
    Dask's alias of the output key): no task for the chunk's position, the
    generation fused into the factorization, the pick of lu and piv into the solve;
    nothing computed twice when lu, piv and x are asked for together."""
    from dask.utils import key_split
    calls = []
    a = _generated(6, (5, 5, 4), calls)
    ref_a = np.concatenate([_generated(6, (5, 5, 4)).blocks[i].compute() for i in range(3)])
    b = rng.standard_normal((14, 6, 2))
    lu, piv = g.lu_factor_batched(a)
    x = g.lu_solve_batched((lu, piv), da.from_array(b, chunks=(5, 6, 2)))
    with distributed.get_task_stream(client) as stream:
        got = x.compute()
    _same(got, g.lu_solve_batched(g.lu_factor_batched(ref_a), b))
    # per chunk at most its seed and b as NumPy data and one task (before: the seed,
    # make, arange, the factorization, two picks, b, arange and the solve, each a
    # round trip through the scheduler); how Dask names the fused task varies
    run = [key_split(r["key"]) for r in stream.data
           if any(s["action"] == "compute" for s in r["startstops"])]
    assert len([n for n in run if not n.startswith("finalize")]) <= 3 * 3, run
    assert not any(n in ("arange", "getitem", "make") for n in run), run
    calls.clear()                               # (the workers ran pickled copies)
    out = dask.compute(lu, piv, x, scheduler="sync")
    assert sorted(calls) == [0, 1, 2]           # each chunk generated and factorized once
    ref = g.lu_factor_batched(ref_a)
    _same(out[0], ref[0])
    _same(out[1], ref[1])
    _same(out[2], got)


def test_solve_with_broadcast_rhs_fuses(client, rng):
    """solve_batched and cho_solve_batched of generated chunks with a right-hand side
    broadcast over a batch axis: one task per chunk, the NumPy call's answer."""
    import dask
    a = _generated(5, (4, 4, 4))
    ref_a = a.compute()
    b = rng.standard_normal((5, 3))
    for x, want in ((g.solve_batched(a, b), g.solve_batched(ref_a, b)),
                    (g.solve_batched(a, b[:, 0]), g.solve_batched(ref_a, b[:, 0])),
                    (g.inv_batched(a), g.inv_batched(ref_a))):
        (opt,) = dask.optimize(x)
        tasks = [k for k, v in dict(opt.__dask_graph__()).items()   # not aliases or data
                 if type(v).__name__ == "Task" or (type(v) is tuple and v and callable(v[0]))]
        assert len(tasks) == 3, tasks
        _same(x.compute(), want)


def test_nonfinite_names_the_chunk(client, rng):
    a = _stack(rng, (8,), 3)
    a[6, 1, 1] = np.nan
    with pytest.raises(ValueError, match=r"infs or NaNs.*Dask chunk of batch indices \[6:8\]"):
        g.inv_batched(da.from_array(a, chunks=(2, 3, 3))).compute()
    g.inv_batched(da.from_array(a, chunks=(2, 3, 3)), check_finite=False).compute()


def test_bad_shapes_raise_when_the_graph_is_built(rng):
    d = da.zeros((4, 3, 2), chunks=(2, 3, 2))
    with pytest.raises(ValueError, match="square"):
        g.lu_factor_batched(d)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., n, n\)"):
        g.inv_batched(da.zeros((4,)))
    a = da.from_array(_stack(rng, (4,), 3), chunks=(2, 3, 3))
    with pytest.raises(ValueError, match="incompatible shapes"):
        g.solve_batched(a, np.ones(4))
    with pytest.raises(ValueError, match="enlarge"):
        g.solve_batched(a, np.ones((2, 4, 3, 1)))
    with pytest.raises(ValueError, match="do not broadcast"):
        g.solve_batched(a, np.ones((3, 3, 1)))
    lu, piv = g.lu_factor_batched(a)
    with pytest.raises(ValueError, match="piv must have shape"):
        g.lu_solve_batched((lu, piv[:2]), np.ones(3))
    with pytest.raises(ValueError, match="trans"):
        g.lu_solve_batched((lu, piv), np.ones(3), trans=5)
    with pytest.raises(ValueError, match="the pair"):
        g.lu_solve_batched(lu, np.ones(3))
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        g.inv_batched(a[a[:, 0, 0] > 0])
    with pytest.raises(TypeError, match="must be a Dask array"):
        g.inv_batched(dask.delayed(np.eye)(3))
    with pytest.raises(ValueError, match="numeric"):
        g.inv_batched(da.from_array(np.full((2, 2, 2), "x")))


# ----------------------------------------------------------------------------
# block-Jacobi of a Dask matrix or a Dask stack of diagonal blocks
# ----------------------------------------------------------------------------

def _jacobi_matrix(rng, n, density=0.15):
    A = sps.random(n, n, density=density, random_state=int(rng.integers(1 << 30)),
                   format="csr")
    return (A + A.T + 4 * sps.eye(n, format="csr")).tocsr()


@pytest.mark.parametrize("n, bs, chunks", [
    (103, 8, (30, 30)),         # ragged last block, chunk ends inside blocks
    (96, 8, (32, 32)),          # chunks aligned with blocks: no data moves
    (103, 8, (50, 103)),        # row panels
    (100, 7, (13, 40)),         # chunks smaller than two blocks, non-square
    (5, 8, (3, 3)),             # one ragged block only
])
@pytest.mark.parametrize("form", ["dense", "sparse"])
def test_block_jacobi_equals_numpy(client, rng, n, bs, chunks, form):
    A = _jacobi_matrix(rng, n)
    ref = g.block_jacobi(A, bs)
    D = (da.from_array(A.toarray(), chunks=chunks) if form == "dense"
         else da.from_array(A, chunks=chunks, asarray=False))
    M = g.block_jacobi(D, bs)
    from scipy_gpuqr.distributed.dask_jacobi import DaskBlockJacobi
    assert isinstance(M, DaskBlockJacobi) and M.shape == ref.shape and M.dtype == ref.dtype
    assert isinstance(M.blocks, da.Array) and M.blocks.shape == (n // bs, bs, bs)
    assert (M.last is None) == (n % bs == 0)
    x = rng.standard_normal(n)
    X = rng.standard_normal((n, 3))
    _same(M.matvec(x), ref.matvec(x))
    _same(M @ X, ref @ X)
    y = M @ da.from_array(x, chunks=17)              # Dask in, Dask out (lazy)
    assert isinstance(y, da.Array) and y.shape == (n,)
    _same(y.compute(), ref.matvec(x))
    Y = M.matmat(da.from_array(X, chunks=(40, 2)))
    assert isinstance(Y, da.Array)
    _same(client.compute(Y, sync=True), ref.matmat(X))
    _same(M.persist().matvec(x), ref.matvec(x))


def test_block_jacobi_of_a_stack_of_blocks(client, rng):
    """The diagonal blocks given as a Dask stack: the operator of their block diagonal."""
    blocks = _stack(rng, (11,), 6).astype(np.float32)
    d = da.from_array(blocks, chunks=(4, 6, 6))
    ref = g.block_jacobi(sps.block_diag(list(blocks), format="csr"), 6)
    M = g.block_jacobi(d, 6)
    assert M.shape == (66, 66) and M.dtype == ref.dtype == np.float32
    assert M.blocks.chunks[0] == (4, 4, 3) and M.last is None
    x = rng.standard_normal(66).astype(np.float32)
    _same(M.matvec(x), ref.matvec(x))
    _same((M @ da.from_array(x, chunks=30)).compute(), ref.matvec(x))
    with pytest.raises(ValueError, match="needs block_size=6"):
        g.block_jacobi(d, 5)


def test_block_jacobi_in_cg_like_numpy(client, rng):
    """SciPy's cg with the Dask operator (persisted) runs the NumPy operator's iterations."""
    import scipy.sparse.linalg as spla
    A = _jacobi_matrix(rng, 120, density=0.05)
    b = rng.standard_normal(120)
    M = g.block_jacobi(da.from_array(A.toarray(), chunks=(50, 50)), 10).persist()
    counts = {}
    for name, pre in (("dask", M), ("numpy", g.block_jacobi(A, 10))):
        it = [0]
        x, info = spla.cg(A, b, M=pre, rtol=1e-10, maxiter=500,
                          callback=lambda _: it.__setitem__(0, it[0] + 1))
        assert info == 0
        counts[name] = (it[0], x)
    assert counts["dask"][0] == counts["numpy"][0]
    np.testing.assert_allclose(counts["dask"][1], counts["numpy"][1], rtol=1e-12, atol=1e-14)


def test_block_jacobi_singular_blocks_named(client):
    d = np.eye(40)
    d[21, 21] = 0                                   # block 5 (rows 20:24)
    M = g.block_jacobi(da.from_array(d, chunks=(16, 16)), 4)     # lazy: nothing raised
    with pytest.raises(LinAlgError, match=r"singular diagonal block.*block index \[5\]"
                                          r".*Dask chunk of batch indices \[4:8\]"):
        M.persist()
    with pytest.raises(LinAlgError, match="singular diagonal block"):
        M.matvec(np.ones(40))
    d = np.eye(10)
    d[9, 9] = 0
    with pytest.raises(LinAlgError, match=r"ragged last diagonal block \(block index 2, "
                                          r"rows 8:10\)"):
        g.block_jacobi(da.from_array(d, chunks=(5, 5)), 4).persist()
    d = np.eye(8)
    d[3, 3] = np.inf
    with pytest.raises(ValueError, match="infs or NaNs"):
        g.block_jacobi(da.from_array(d, chunks=(4, 4)), 4).persist()


def test_block_jacobi_bad_input(rng):
    with pytest.raises(ValueError, match="square"):
        g.block_jacobi(da.zeros((6, 4), chunks=2), 2)
    with pytest.raises(TypeError, match="block_size must be an int"):
        g.block_jacobi(da.eye(4, chunks=2), 2.0)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        g.block_jacobi(da.eye(4, chunks=2), 0)
    M = g.block_jacobi(da.eye(6, chunks=3), 2)
    with pytest.raises(ValueError, match="dimension mismatch"):
        M @ da.ones(5, chunks=5)


# ----------------------------------------------------------------------------
# the dispatch leaves non-Dask calls alone
# ----------------------------------------------------------------------------

def test_non_dask_input_unaffected(rng):
    import scipy_gpuqr.batched as b
    from scipy_gpuqr.batched import _functions
    a = _stack(rng, (4,), 3)
    for name in ("lu_factor_batched", "inv_batched", "cho_factor_batched", "block_jacobi"):
        fn = getattr(g, name)
        assert fn is getattr(b, name) and fn.__wrapped__ is getattr(_functions, name)
        assert "Dask" in fn.__doc__ and "Parameters" in fn.__doc__
        assert pickle.loads(pickle.dumps(fn)) is fn
    x = g.inv_batched(a)
    assert type(x) is np.ndarray
    _same(x, _functions.inv_batched(a))


def test_numpy_calls_import_no_dask():
    code = ("import sys, numpy as np, scipy_gpuqr as g, scipy_gpuqr.distributed\n"
            "g.inv_batched(np.eye(3)[None]); g.lu_factor_batched(np.eye(3))\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_dask_installed():
    """Dask is optional: without it NumPy calls work and solve_many says what to install."""
    code = ("import sys; sys.modules['dask'] = None; sys.modules['distributed'] = None\n"
            "import numpy as np, scipy_gpuqr as g, scipy_gpuqr.distributed as d\n"
            "g.solve_batched(np.eye(2)[None], np.ones(2))\n"
            "try:\n    d.solve_many\nexcept ModuleNotFoundError as e:\n"
            "    assert 'scipy_gpuqr[dask]' in str(e), e\n"
            "else:\n    raise AssertionError('no error')\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------
# many sparse problems
# ----------------------------------------------------------------------------

def _problems(rng, count, square=False):
    out = []
    for i in range(count):
        m = 30 + 7 * i
        n = m if square else 12 + 2 * i
        A = sps.random(m, n, density=0.2, random_state=int(rng.integers(1 << 30)),
                       format="csr") + sps.eye(m, n, format="csr")
        out.append((A, rng.standard_normal(m)))
    return out


def _same_result(got, ref):
    if isinstance(ref, tuple):
        assert len(got) == len(ref)
        for x, y in zip(got, ref):
            _same_result(x, y)
    elif isinstance(ref, np.ndarray):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    else:
        assert got == pytest.approx(ref, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_solve_many_on_a_client_equals_one_by_one(client, rng, solver):
    problems = _problems(rng, 7)
    got = solve_many(problems, solver, client=client, atol=1e-10, btol=1e-10)
    for (A, b), res in zip(problems, got):
        _same_result(res, getattr(g, solver)(A, b, atol=1e-10, btol=1e-10))


def test_solve_many_default_scheduler_and_bag(client, rng):
    problems = _problems(rng, 5, square=True)
    ref = [g.spsolve(A, b) for A, b in problems]
    with dask.config.set(scheduler="threads"):      # no distributed client
        got = solve_many(iter(problems), "spsolve")
    for x, y in zip(got, ref):
        _same_result(x, y)
    import dask.bag as db
    bag = db.from_sequence(problems, npartitions=2)
    for x, y in zip(solve_many(bag, "spsolve", client=client), ref):
        _same_result(x, y)
    for x, y in zip(solve_many(bag, "spsolve"), ref):   # the default client
        _same_result(x, y)


def test_solve_many_errors(client, rng):
    assert solve_many([], client=client) == []
    with pytest.raises(ValueError, match="solver must be one of"):
        solve_many(_problems(rng, 1), "qr")
    with pytest.raises(TypeError, match=r"pair \(A, b\)"):
        solve_many([_problems(rng, 1)[0][0]], client=client)


def test_worker_processes(rng):
    """Tasks pickled to worker processes: chunks and problems come back right."""
    a = _stack(rng, (6,), 4)
    problems = _problems(rng, 3)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        lu, piv = c.compute(g.lu_factor_batched(da.from_array(a, chunks=(2, 4, 4))),
                            sync=True)
        got = solve_many(problems, client=c)
    ref = g.lu_factor_batched(a)
    _same(lu, ref[0])
    _same(piv, ref[1])
    for (A, b), res in zip(problems, got):
        _same_result(res, g.lsqr(A, b))


# ----------------------------------------------------------------------------
# CuPy chunks on the GPU (each in a fresh process with a time limit: a hang
# fails the test with every thread's stack instead of stopping the run)
# ----------------------------------------------------------------------------

#: Seconds a GPU Dask test may take (a cold kernel cache included).
GPU_TEST_SECONDS = 60


def _in_subprocess(body: str, seconds: float = GPU_TEST_SECONDS) -> None:
    """Run ``body()`` of this module in a new Python process, within ``seconds``.

    The child dumps the stacks of all its threads and exits shortly before
    the limit (``faulthandler``); past the limit it is killed. Either way the
    test fails with what the child wrote.
    """
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import faulthandler, sys\n"
            f"faulthandler.dump_traceback_later({max(seconds - 20, 5)}, exit=True)\n"
            f"sys.path.insert(0, {here!r})\n"
            "import numpy as np, test_distributed as t\n"
            f"t.{body}(np.random.default_rng(20261122))\n")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=seconds)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"{body} killed after {seconds} s; its output:\n{err[-8000:]}")
    assert p.returncode == 0, f"{body} failed (rc {p.returncode}):\n{p.stderr[-8000:]}"


def _cupy_chunks_on_one_gpu_worker(rng):
    import cupy as cp
    a = _stack(rng, (20,), 16)
    a[13, :, 3] = 0
    b = rng.standard_normal((20, 16, 2))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        d = da.from_array(cp.asarray(a), chunks=(6, 16, 16))
        assert type(d._meta).__module__.startswith("cupy")
        lu, piv, info = c.compute(g.lu_factor_batched(d, return_info=True), sync=True)
        assert type(lu) is cp.ndarray
        rlu, rpiv, rinfo = g.lu_factor_batched(cp.asarray(a), return_info=True)
        cp.testing.assert_array_equal(lu, rlu)
        cp.testing.assert_array_equal(piv, rpiv)
        cp.testing.assert_array_equal(info, rinfo)
        with pytest.raises(LinAlgError, match=r"batch index \[13\].*\[12:18\]"):
            g.inv_batched(d).compute()
        good = da.from_array(cp.asarray(np.delete(a, 13, axis=0)), chunks=(6, 16, 16))
        x = g.solve_batched(good, cp.asarray(b[:19])).compute()
        cp.testing.assert_allclose(
            x, g.solve_batched(cp.asarray(np.delete(a, 13, axis=0)), cp.asarray(b[:19])),
            rtol=1e-12, atol=1e-12)
        # NumPy chunks computed on the worker's GPU come back as NumPy
        xi = g.inv_batched(da.from_array(np.delete(a, 13, axis=0), chunks=(6, 16, 16)),
                           backend="gpu").compute()
        assert type(xi) is np.ndarray
        np.testing.assert_allclose(xi, np.linalg.inv(np.delete(a, 13, axis=0)),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_cupy_chunks_on_one_gpu_worker():
    _in_subprocess("_cupy_chunks_on_one_gpu_worker")


def _block_jacobi_cupy_chunks(rng):
    import cupy as cp
    A = _jacobi_matrix(rng, 70).toarray()
    ref = g.block_jacobi(cp.asarray(A), 8)
    M = g.block_jacobi(da.from_array(cp.asarray(A), chunks=(24, 24)), 8).persist()
    assert type(M.blocks._meta).__module__.startswith("cupy")
    x = rng.standard_normal(70)
    y = M.matvec(cp.asarray(x))
    assert type(y) is cp.ndarray
    cp.testing.assert_allclose(y, ref.matvec(cp.asarray(x)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(M.matvec(x), ref.matvec(cp.asarray(x)).get(), rtol=1e-12,
                               atol=1e-12)
    yd = (M @ da.from_array(cp.asarray(x), chunks=30)).compute()
    cp.testing.assert_allclose(yd, y, rtol=1e-13, atol=1e-14)


@pytest.mark.gpu
def test_block_jacobi_cupy_chunks():
    """CuPy chunks: the inverses on the GPU, CuPy vectors in and out, as block_jacobi(CuPy)."""
    _in_subprocess("_block_jacobi_cupy_chunks")


def _gpu_worker_processes(rng):
    """Two worker processes, each with CUDA_VISIBLE_DEVICES set to one GPU (GPU 0 twice
    where there is one): CuPy chunks made on the workers, LU and checksums back."""
    import cupy as cp
    ngpu = cp.cuda.runtime.getDeviceCount()
    ids = [str(i % ngpu) for i in range(2)]
    workers = {f"gpu{i}": {"cls": distributed.Nanny,
                           "options": {"nthreads": 1, "host": "127.0.0.1", "memory_limit": 0,
                                       "env": {"CUDA_VISIBLE_DEVICES": d}}}
               for i, d in enumerate(ids)}
    with distributed.SpecCluster(workers=workers,
                                 scheduler={"cls": distributed.Scheduler,
                                            "options": {"dashboard_address": ":0",
                                                        "host": "127.0.0.1"}}) as cluster, \
            distributed.Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)

        def make(seed, block_info=None):
            import cupy
            n = block_info[None]["chunk-shape"][0]
            r = np.random.default_rng(int(np.asarray(seed).ravel()[0]))
            return cupy.asarray(r.standard_normal((n, 8, 8)) + 8 * np.eye(8))

        seeds = da.from_array(np.arange(4), chunks=1)
        a = seeds.map_blocks(make, new_axis=[1, 2], chunks=((5,) * 4, (8,), (8,)),
                             meta=cp.empty((0, 0, 0)))
        lu, piv = g.lu_factor_batched(a)
        got = c.compute(lu.map_blocks(lambda x: x.get(), meta=np.empty((0, 0, 0))),
                        sync=True)
        ref = np.concatenate([np.random.default_rng(s).standard_normal((5, 8, 8))
                              + 8 * np.eye(8) for s in range(4)])
        np.testing.assert_allclose(got, g.lu_factor_batched(ref)[0], rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.gpu
def test_gpu_worker_processes():
    """Worker processes pinned to GPUs (what the benchmark and dask-cuda run)."""
    _in_subprocess("_gpu_worker_processes")


# ----------------------------------------------------------------------------
# bench/dask_batched.py: its chunks, checksums and report
# ----------------------------------------------------------------------------

def _bench():
    """bench/dask_batched.py as a module (not on the import path)."""
    from conftest import load_bench
    return load_bench("dask_batched.py", "_bench_dask_batched")


def _checksum_ref(a):
    lu, piv = g.lu_factor_batched(a)
    return float(lu[:, 0, 0].sum() + lu[:, -1, -1].sum() + piv.sum())


def test_bench_chunks_do_not_depend_on_the_chunking():
    """A matrix of the benchmark is the same in any chunk; strictly diagonally dominant."""
    b = _bench()
    whole = b.make_chunk(0, size=10, n=5, dt="float64", gpu=False)
    parts = [b.make_chunk(s, size=k, n=5, dt="float64", gpu=False) for s, k in ((0, 3), (3, 7))]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    off = np.abs(whole).sum(axis=2) - np.abs(np.diagonal(whole, axis1=1, axis2=2))
    assert (off < 5 - 1).all() and (np.abs(whole) < 5 + 1).all()
    assert not np.array_equal(whole, b.make_chunk(0, size=10, n=5, dt="float64", gpu=False,
                                                  seed=2))
    assert b.make_chunk(0, size=2, n=3, dt="float32", gpu=False).dtype == np.float32
    lu, piv = g.lu_factor_batched(whole)
    assert float(b.checksum(lu, piv)[0, 0, 0]) == pytest.approx(_checksum_ref(whole), rel=1e-14)


def test_bench_runs_on_cpu_workers(tmp_path):
    """The benchmark on a CPU worker process: every run's checksum is the NumPy one,
    both calls, two chunk sizes, the direct baseline and the report's ratios."""
    import json
    from conftest import REPO
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "dask_batched.py"), "--cpu",
                        "--workers", "1", "--call", "default,async", "--count", "40", "--n", "4",
                        "--chunk", "8,16", "--reps", "1", "--json", str(out),
                        "--max-seconds", "100"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "equal: True" in p.stdout
    res = json.loads(out.read_text())
    ref = _checksum_ref(_bench().make_chunk(0, size=40, n=4, dt="float64", gpu=False))
    runs = res["rows"] + [d for d in res["direct"] if d["call"] != "parts"]
    assert sorted((r["chunk"], r["call"]) for r in res["rows"]) == \
        [(8, "async"), (8, "default"), (16, "async"), (16, "default")]
    assert len(runs) == 8
    for r in runs:
        assert r["checksum"] == pytest.approx(ref, rel=1e-12)
    for r in res["rows"]:
        assert r["chunks"] == 40 // r["chunk"] + (40 % r["chunk"] > 0)
        assert r["efficiency_vs_direct"] > 0 and r["dask_only_s"] > 0
        # one task per chunk, plus the aggregate (and Dask's finalize)
        assert all(d["tasks"] <= r["chunks"] + 2 for d in r["worker_idle"].values()), r


def _bench_chunks_on_the_gpu(rng):
    import cupy as cp
    b = _bench()
    for dt, n in (("float64", 32), ("float32", 7)):
        for start, size in ((0, 5), (1000, 33)):
            got = b.make_chunk(start, size=size, n=n, dt=dt, gpu=True)
            want = b.make_chunk(start, size=size, n=n, dt=dt, gpu=False)
            np.testing.assert_array_equal(got.get(), want)      # bit for bit
            lu, piv = g.lu_factor_batched(got)
            hlu, hpiv = g.lu_factor_batched(want)
            ref = float(b.checksum(hlu, hpiv)[0, 0, 0])
            tol = 1e-12 if dt == "float64" else 1e-5
            assert float(b.checksum(lu, piv)[0, 0, 0]) == pytest.approx(ref, rel=tol)
            s = b.checksum_async(lu, piv)
            assert type(s) is cp.ndarray and s.shape == (1, 1, 1)
            assert float(s.sum()) == pytest.approx(ref, rel=tol)


@pytest.mark.gpu
def test_bench_chunks_on_the_gpu():
    """The benchmark's GPU maker equals its NumPy copy bit for bit; its one-kernel
    checksum equals the NumPy one."""
    _in_subprocess("_bench_chunks_on_the_gpu")
