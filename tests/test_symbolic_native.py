"""The compiled tree loops of the analysis give the NumPy functions' arrays (CPU only).

The library is built into temporary folders here (never the user's cache).
Skipped only where no C compiler exists; a compiler that fails is a failure.
"""

import os
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr import _native_build
from scipy_gpuqr._symbolic import analyze, etree, native
from scipy_gpuqr._symbolic.ordering import column_ordering
from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares

from _native_helpers import Preloaded, assert_analysis_same_either_path, built_loader, \
    env_with_cache as _env, needs_compiler, use_loader

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    ld, _ = built_loader(native, tmp_path_factory.mktemp("symnative"))
    return ld.get(True)


def _matrices():
    rng = np.random.default_rng(3)
    out = {
        "grid12": grid3d_least_squares(12),
        "ch5-6-b2": chessboard_boundary(5, 6, 2),
        "diag": sp.eye(7, format="csc"),
        "one": sp.csc_array(np.ones((1, 1))),
        "dense-row": sp.csc_array(np.vstack([np.ones((1, 40)), np.eye(40)])),
    }
    for k, (m, n, d) in enumerate([(300, 120, 0.02), (120, 120, 0.03), (80, 200, 0.02),
                                   (500, 60, 0.005), (60, 60, 0.2)]):
        A = sp.random(m, n, density=d, random_state=int(rng.integers(1 << 30)), format="csc")
        A = A + sp.csc_array((np.ones(min(m, n) // 3), (np.arange(min(m, n) // 3),
                                                         np.arange(min(m, n) // 3))),
                             shape=(m, n))
        out[f"rand{k}-{m}x{n}"] = sp.csc_array(A)
    out["empty-rows-cols"] = sp.csc_array(sp.random(50, 40, density=0.03, random_state=9))
    return out


MATRICES = _matrices()


def _rows(A, order):
    A = sp.csc_array(A)
    A.sort_indices()
    perm, _ = column_ordering(A, order)
    B = sp.csr_array(A[:, perm])
    B.sort_indices()
    return B, A, perm


@pytest.mark.parametrize("order", ["colamd", "natural"])
@pytest.mark.parametrize("name", sorted(MATRICES))
def test_tree_loops_equal_numpy(lib, name, order):
    B, A, perm = _rows(MATRICES[name], order)
    n = B.shape[1]
    left = etree.leftmost_columns(B.indptr, B.indices, n)
    parent = etree.column_etree_numpy(B.indptr, B.indices, n, left)
    got = native.column_etree_by_columns(lib, A.indptr, A.indices, perm, None, A.shape[0])
    np.testing.assert_array_equal(got, parent)
    post = etree.postorder_numpy(parent)
    np.testing.assert_array_equal(native.postorder(lib, parent), post)
    # the counts on the postordered labels, as the analysis calls them
    inv = np.empty(n, dtype=np.int64)
    inv[post] = np.arange(n)
    par = np.where(parent[post] >= 0, inv[np.maximum(parent[post], 0)], -1)
    B2 = sp.csr_array((B.data, inv[B.indices], B.indptr), shape=B.shape)
    B2.has_sorted_indices = False
    B2.sort_indices()
    left2 = etree.leftmost_columns(B2.indptr, B2.indices, n)
    want = etree.column_counts_numpy(B2.indptr, B2.indices, par, left2)
    np.testing.assert_array_equal(native.column_counts(lib, B2.indptr, B2.indices, par, left2),
                                  want)
    # the dispatching function, on SciPy's own index arrays
    np.testing.assert_array_equal(etree.column_counts(B2.indptr, B2.indices, par, left2), want)


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_front_work_equals_numpy(lib, monkeypatch, name):
    from scipy_gpuqr._symbolic import counts
    fs = analyze(MATRICES[name], cache=False).fronts
    monkeypatch.setattr(counts.native, "handle", lambda: None)
    want = counts.front_work(fs)
    monkeypatch.setattr(counts.native, "handle", lambda: lib)
    got = counts.front_work(fs)
    assert want.keys() == got.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_postorder_of_random_forests(lib):
    rng = np.random.default_rng(5)
    for n in (1, 2, 17, 300):
        parent = np.array([int(rng.integers(j + 1, n + 1)) if j < n - 1 else n
                           for j in range(n)], dtype=np.int64)
        parent[parent >= n] = -1
        parent[rng.random(n) < 0.1] = -1                  # several roots
        np.testing.assert_array_equal(native.postorder(lib, parent),
                                      etree.postorder_numpy(parent))


@pytest.mark.parametrize("name", ["grid12", "ch5-6-b2", "rand0-300x120", "rand2-80x200",
                                  "dense-row", "empty-rows-cols"])
def test_analysis_same_with_either_path(lib, monkeypatch, name):
    assert_analysis_same_either_path(monkeypatch, native, lib, MATRICES[name])


def test_numpy_mode_and_no_compiler_take_the_numpy_path(tmp_path):
    assert native.handle(_env(tmp_path, **{native.ENV: "numpy"})) is None
    ld = _native_build.Loader(native._SPEC)
    env = _env(tmp_path, CC=str(tmp_path / "no-such-compiler"))
    assert ld.get(True, env) is None
    assert ld.status().startswith("unavailable")
    with pytest.raises(ValueError):
        native.mode({native.ENV: "fortran"})


def _replace(path, data):
    """Put ``data`` at ``path`` as a new file (a library this process has mapped
    keeps its own bytes: writing into it in place would change mapped code)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_damaged_or_old_library_is_built_again(tmp_path):
    env = _env(tmp_path)
    ld = _native_build.Loader(native._SPEC)
    assert ld.get(True, env) is not None
    path, _ = native._SPEC.where(env)
    assert path.is_file() and _native_build.intact(path)
    # overwritten bytes: the manifest no longer matches, so it is rebuilt, never opened
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    _replace(path, bytes(data))
    assert not _native_build.intact(path)
    ld2 = _native_build.Loader(native._SPEC)
    assert ld2.get(True, env) is not None and _native_build.intact(path)
    # a library of another interface version (its manifest intact) is refused and rebuilt
    src = native._SPEC.source.read_text().replace(
        f"#define SGS_ABI {native.ABI}", f"#define SGS_ABI {native.ABI + 100}")
    old = tmp_path / "old.c"
    old.write_text(src)
    cmd = _native_build.compiler(env)
    built = tmp_path / "old.so"
    subprocess.run(cmd + list(_native_build.FLAGS) + ["-o", str(built), str(old)], check=True)
    _replace(path, built.read_bytes())
    size, digest = _native_build.checksum(path)
    _native_build.manifest_path(path).write_text(_native_build.manifest_text(size, digest))
    with pytest.raises(OSError):
        native._SPEC.open(path)
    ld3 = _native_build.Loader(native._SPEC)
    lib = ld3.get(True, env)
    assert lib is not None and lib.sgs_abi() == native.ABI


def test_auto_mode_builds_in_the_background(tmp_path):
    ld = _native_build.Loader(native._SPEC)
    env = _env(tmp_path)
    assert ld.get(False, env) is None                     # nothing built yet: NumPy path now
    assert ld.get(True, env) is not None                  # the build finishes


def _front_inputs(A):
    """build_fronts' arguments for A, captured from an analysis."""
    from scipy_gpuqr._symbolic import analysis, fronts
    got = {}
    real = fronts.build_fronts

    def spy(*args):
        got["args"] = args
        return real(*args)

    orig = analysis.build_fronts
    analysis.build_fronts = spy
    try:
        analyze(A, cache=False)
    finally:
        analysis.build_fronts = orig
    return got["args"]


@pytest.mark.parametrize("name", ["grid12", "ch5-6-b2", "rand0-300x120", "rand4-60x60"])
def test_front_columns_equal_numpy_and_both_refuse_wrong_counts(lib, monkeypatch, name):
    from scipy_gpuqr._symbolic import fronts
    args = _front_inputs(MATRICES[name])
    monkeypatch.setenv(native.ENV, "numpy")
    ref = fronts.build_fronts(*args)
    use_loader(monkeypatch, native, Preloaded(lib))
    monkeypatch.setenv(native.ENV, "c")
    got = fronts.build_fronts(*args)
    for k, v in vars(ref).items():
        np.testing.assert_array_equal(getattr(got, k), v, err_msg=k)
    # column counts one too large at a front's last column: both paths refuse alike
    front_ptr, parent, counts = args[0], args[1], np.array(args[2])
    counts[front_ptr[1] - 1] += 1
    bad = (front_ptr, parent, counts) + tuple(args[3:])
    with pytest.raises(AssertionError, match="non-pivot columns") as c_err:
        fronts.build_fronts(*bad)
    monkeypatch.setenv(native.ENV, "numpy")
    with pytest.raises(AssertionError, match="non-pivot columns") as np_err:
        fronts.build_fronts(*bad)
    assert str(c_err.value) == str(np_err.value)


@pytest.mark.parametrize("params", [dict(), dict(nrelax=(1, 2, 3), zrelax=(0.5, 0.05, 0.01)),
                                    dict(nrelax=(8, 64, 256), zrelax=(0.9, 0.3, 0.2))])
@pytest.mark.parametrize("name", ["grid12", "ch5-6-b2", "rand1-120x120", "dense-row"])
def test_relaxed_amalgamation_equal_python(lib, monkeypatch, name, params):
    from scipy_gpuqr._symbolic import fronts
    args = _front_inputs(MATRICES[name])
    parent, counts = args[1], args[2]
    sup = fronts.fundamental_supernodes(parent, counts)
    am = fronts.Amalgamation(**params)
    monkeypatch.setenv(native.ENV, "numpy")
    ref = fronts.relaxed_amalgamation(parent, counts, sup, am)
    use_loader(monkeypatch, native, Preloaded(lib))
    monkeypatch.setenv(native.ENV, "c")
    np.testing.assert_array_equal(fronts.relaxed_amalgamation(parent, counts, sup, am), ref)


def test_old_builds_pruned(tmp_path):
    # the schedule loops' builds share the folder: never pruned with these
    folder = tmp_path / "native"
    folder.mkdir()
    others = [folder / f"native-old{i:02d}.so" for i in range(native.MAX_BUILDS + 3)]
    for i, p in enumerate(others):
        p.write_bytes(b"x")
        os.utime(p, (500 + i, 500 + i))
    old = []
    for i in range(native.MAX_BUILDS + 3):
        p = folder / f"{native._SPEC.prefix}{i:016x}.so"
        p.write_bytes(b"x")
        _native_build.manifest_path(p).write_text("size 1\n")
        os.utime(p, (1000 + i, 1000 + i))
        old.append(p)
    keep = old[0]                                          # the oldest, but the one in use
    _native_build.prune(folder, keep, native._SPEC.prefix)
    left = sorted(folder.glob(f"{native._SPEC.prefix}*.so"))
    assert len(left) == native.MAX_BUILDS and keep in left
    assert not _native_build.manifest_path(old[1]).exists()
    assert all(p.exists() for p in others)
