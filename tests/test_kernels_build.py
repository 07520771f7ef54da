"""The kernel pipeline: sources found, includes flattened, NVRTC check passes."""

import subprocess
import sys
import zipfile

import pytest

from scipy_gpuqr import _kernels
from conftest import REPO


def test_kernels_dir_found():
    d = _kernels.kernels_dir()
    assert (d / "common.cuh").is_file()


def test_flatten_inlines_headers_once(tmp_path):
    (tmp_path / "a.cuh").write_text('#pragma once\nint a_value;\n')
    (tmp_path / "b.cuh").write_text('#pragma once\n#include "a.cuh"\nint b_value;\n')
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include "b.cuh"\nint k;\n')
    text = _kernels.flatten_source("k.cu", tmp_path)
    assert text.count("int a_value;") == 1
    assert "int b_value;" in text and "#include" not in text.replace("already included", "")


def test_flatten_finds_headers_beside_the_file_then_at_the_root(tmp_path):
    (tmp_path / "part").mkdir()
    (tmp_path / "common.cuh").write_text("int root_value;\n")
    (tmp_path / "part" / "local.cuh").write_text('#include "common.cuh"\nint local_value;\n')
    (tmp_path / "part" / "k.cu").write_text('#include "local.cuh"\n#include "common.cuh"\n')
    text = _kernels.flatten_source("part/k.cu", tmp_path)
    assert text.count("int root_value;") == 1 and "int local_value;" in text


def test_every_kernel_file_flattens():
    names = [p.relative_to(_kernels.kernels_dir()).as_posix() for p in _kernels.kernel_files()]
    assert "sparse_qr/uberkernel.cu" in names and "batched/lu_mma.cu" in names
    for name in names:
        assert "#include \"" not in _kernels.flatten_source(name)


def test_flatten_reports_missing_header(tmp_path):
    (tmp_path / "k.cu").write_text('#include "nope.cuh"\n')
    with pytest.raises(FileNotFoundError, match="nope.cuh"):
        _kernels.flatten_source("k.cu", tmp_path)


def test_hash_changes_with_header(tmp_path, monkeypatch):
    (tmp_path / "h.cuh").write_text("int x;\n")
    (tmp_path / "k.cu").write_text('#include "h.cuh"\n')
    before = _kernels.flatten_source("k.cu", tmp_path)
    (tmp_path / "h.cuh").write_text("int y;\n")
    assert _kernels.flatten_source("k.cu", tmp_path) != before


def test_nvrtc_check_catches_errors(tmp_path, monkeypatch):
    pytest.importorskip("cupy", reason="NVRTC check needs the kernel-check extra (pip install -e '.[kernel-check]')")
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void k(double* x) { x[0] = ; }\n')
    (tmp_path / "good.cu").write_text('extern "C" __global__ void k(double* x) { x[0] = 1; }\n')
    monkeypatch.setattr(_kernels, "kernels_dir", lambda: tmp_path)
    try:
        results = _kernels.check_compile(["sm_80"], ["bad.cu", "good.cu"], jobs=1)
    except Exception as exc:  # NVRTC library absent
        pytest.skip(f"NVRTC unavailable: {exc}")
    ok = {r["file"]: r["ok"] for r in results}
    assert ok == {"bad.cu": False, "good.cu": True}


@pytest.mark.slow
def test_installed_wheel_finds_kernels(tmp_path):
    """A wheel (not editable) ships kernels/ as package data and finds it.

    Built without build isolation, offline, by the setuptools that the
    ``test`` extra installs.
    """
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-w", str(wheel_dir), str(REPO)], check=True, capture_output=True)
    wheel = next(wheel_dir.glob("scipy_gpuqr-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "scipy_gpuqr/kernels/common.cuh" in names
    assert "scipy_gpuqr/kernels/sparse_qr/uberkernel.cu" in names
    assert "scipy_gpuqr/kernels/batched/lu_mma.cu" in names
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    code = ("import scipy_gpuqr._kernels as k; d = k.kernels_dir(); "
            "print(d); assert 'site' in str(d), d")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(target)})
    assert "site" in out.stdout


def test_separate_files_compile_each_variant_alone():
    # the batched n <= 32 families are loaded one variant per module at run
    # time (CuPy's cache key holds the names compiled together), so the
    # warm-up and the check must compile exactly those units
    from scipy_gpuqr.batched import _kernel_registry as kr
    variants = _kernels.registered_variants()
    separate = _kernels.registered_separate()
    assert set(kr.SMALL_FILES.values()) <= separate
    for fname in kr.SMALL_FILES.values():
        units = _kernels.compile_units(fname, variants[fname], True)
        assert units == [(e,) for e in variants[fname]]
    name = kr.small_name("getrf_warp", "float64", 8)
    module = _kernels.load_module(kr.SMALL_FILES["getrf_warp"], (name,))
    assert _kernels.variant_group(name, module.name_expressions) == (name,)


def test_grouped_files_compile_one_unit_per_value_type():
    from scipy_gpuqr._engine.gpu import factorize_kernels as fk
    exprs = _kernels.registered_variants()[fk.UBERKERNEL_FILE]
    units = _kernels.compile_units(fk.UBERKERNEL_FILE, exprs, False)
    assert sorted(e for u in units for e in u) == sorted(exprs)
    assert all(set(_kernels.variant_group(u[0], exprs)) == set(u) for u in units)
    assert _kernels.compile_units("sparse_qr/array_ops.cu", (), False) == [()]


def test_warm_cache_compiles_what_the_run_time_loads(monkeypatch):
    # every unit goes through the module table with the group the run time's
    # own lookup uses; nothing is compiled here (the table's get is replaced)
    from scipy_gpuqr.batched import _kernel_registry as kr
    seen = []
    monkeypatch.setattr(_kernels._COMPILED, "get",
                        lambda name, group, *a, **k: seen.append((name, group)))
    out = _kernels.warm_cache(jobs=2)
    variants = _kernels.registered_variants()
    separate = _kernels.registered_separate()
    expected = sum(len(_kernels.compile_units(f, variants.get(f, ()), f in separate))
                   for f in {r["file"] for r in out})
    assert len(seen) == expected
    assert {r["file"] for r in out} == {_kernels._relative_name(p) for p in _kernels.kernel_files()}
    name = kr.small_name("getrf_warp", "float64", 8)
    assert (kr.SMALL_FILES["getrf_warp"], (name,)) in seen
    assert not any(f == kr.SMALL_FILES["getrf_warp"] and len(g) > 1 for f, g in seen)


def test_a_group_has_one_key_whichever_variant_comes_first():
    # the module table and the prefetch threads are keyed by the group: two
    # variants of one value type must not compile the same group twice
    exprs = ("k<double, 1>", "k<double, 2>", "k<float, 1>")
    g1 = _kernels.variant_group("k<double, 1>", exprs)
    g2 = _kernels.variant_group("k<double, 2>", exprs)
    assert g1 == g2 == ("k<double, 1>", "k<double, 2>")
    assert _kernels.variant_group("k<float, 1>", exprs) == ("k<float, 1>",)
    assert _kernels.variant_group("other<double>", exprs) == ("other<double>",)
