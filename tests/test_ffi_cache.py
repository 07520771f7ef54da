"""cffi declarations kept parsed in the cache folder (scipy_gpuqr._cpu._ffi_cache).

The module is used when valid, written again when stale or damaged, and the
declarations are parsed in-line where the folder cannot be written; a new
process with a valid module neither imports pycparser nor answers differently.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import _cffi_backend
import cffi
import pytest

from conftest import REPO
from scipy_gpuqr._cpu import _ffi_cache, blas_threads
from scipy_gpuqr._cpu._libs import LibraryNotFound, find_library
from scipy_gpuqr._cpu.spqr import _declarations, spqr_available

CDEF = """
typedef struct pair_struct { int a; double b; } pair;
int cholmod_l_version(int version[3]);
int no_such_function_anywhere(int);
"""


def _env(folder):
    return {"SCIPY_GPUQR_CACHE_DIR": str(folder)}


def _spqr_path():
    try:
        return find_library("spqr")
    except LibraryNotFound as exc:
        pytest.skip(str(exc))


def _no_inline(monkeypatch):
    """Make in-line parsing fail the test: what follows must load the cached module."""
    def fail(cdef):
        raise AssertionError("declarations parsed in-line")
    monkeypatch.setattr(_ffi_cache, "inline_ffi", fail)


def test_first_use_writes_the_module_and_later_uses_load_it(tmp_path, monkeypatch):
    ffi = _ffi_cache.declared_ffi("pairs", CDEF, _env(tmp_path))
    path = _ffi_cache.declarations_path("pairs", CDEF, _env(tmp_path))
    assert path.parent == tmp_path / _ffi_cache.FOLDER and path.is_file()
    assert isinstance(ffi, _cffi_backend.FFI)
    _no_inline(monkeypatch)
    again = _ffi_cache.declared_ffi("pairs", CDEF, _env(tmp_path))
    assert isinstance(again, _cffi_backend.FFI)
    assert again.sizeof("pair") == cffi.FFI().sizeof("double") * 2
    assert again.offsetof("pair", "b") == 8
    p = again.new("pair *", {"a": 3, "b": 2.5})
    assert (p.a, p.b) == (3, 2.5)


def test_changed_declarations_get_another_file_and_the_old_one_goes(tmp_path):
    env = _env(tmp_path)
    _ffi_cache.declared_ffi("pairs", CDEF, env)
    old = _ffi_cache.declarations_path("pairs", CDEF, env)
    changed = CDEF + "int another_function(int);\n"
    new = _ffi_cache.declarations_path("pairs", changed, env)
    assert new != old and new.parent == old.parent
    ffi = _ffi_cache.declared_ffi("pairs", changed, env)
    assert new.is_file() and not old.exists()
    assert "another_function" in new.read_text()
    assert ffi.sizeof("pair") == 16


@pytest.mark.parametrize("damage", ["truncate", "flip", "trailer", "not_ffi"])
def test_a_damaged_module_is_written_again(tmp_path, damage):
    env = _env(tmp_path)
    _ffi_cache.declared_ffi("pairs", CDEF, env)
    path = _ffi_cache.declarations_path("pairs", CDEF, env)
    good = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(good[:len(good) // 2])
    elif damage == "flip":
        i = good.index(b"_types")
        path.write_bytes(good[:i] + b"X" + good[i + 1:])
    elif damage == "trailer":
        path.write_bytes(good.rpartition(b"# sha256 ")[0])
    else:       # a valid digest of a module without an out-of-line ffi
        body = b"ffi = 1\n"
        path.write_bytes(body + b"# sha256 " + hashlib.sha256(body).hexdigest().encode())
    assert _ffi_cache._load(path) is None
    ffi = _ffi_cache.declared_ffi("pairs", CDEF, env)
    assert isinstance(ffi, _cffi_backend.FFI)
    assert path.read_bytes() == good


def test_a_folder_that_cannot_be_written_parses_in_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    env = _env(blocker / "cache")          # its parent is a file: mkdir fails
    ffi = _ffi_cache.declared_ffi("pairs", CDEF, env)
    assert isinstance(ffi, cffi.FFI)
    assert ffi.sizeof("pair") == 16
    assert not (blocker / "cache").exists()


def test_a_folder_refusing_new_files_parses_in_line(tmp_path, monkeypatch):
    """A read-only folder, as root sees one too: the temporary file is refused."""
    def refuse(**kwargs):
        raise PermissionError(13, "read-only", kwargs.get("dir"))
    monkeypatch.setattr(_ffi_cache.tempfile, "mkstemp", refuse)
    ffi = _ffi_cache.declared_ffi("pairs", CDEF, _env(tmp_path))
    assert isinstance(ffi, cffi.FFI) and ffi.sizeof("pair") == 16
    assert list((tmp_path / _ffi_cache.FOLDER).iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_parses_in_line_and_still_reads_a_valid_module(tmp_path):
    env = _env(tmp_path)
    tmp_path.chmod(0o500)
    try:
        assert isinstance(_ffi_cache.declared_ffi("pairs", CDEF, env), cffi.FFI)
    finally:
        tmp_path.chmod(0o700)
    _ffi_cache.declared_ffi("pairs", CDEF, env)
    (tmp_path / _ffi_cache.FOLDER).chmod(0o500)
    try:
        assert isinstance(_ffi_cache.declared_ffi("pairs", CDEF, env), _cffi_backend.FFI)
    finally:
        (tmp_path / _ffi_cache.FOLDER).chmod(0o700)


def test_no_cache_folder_parses_in_line(monkeypatch):
    monkeypatch.setattr(_ffi_cache, "cache_dir", lambda environ: None)
    assert isinstance(_ffi_cache.declared_ffi("pairs", CDEF, {}), cffi.FFI)


def test_names_must_be_identifiers(tmp_path):
    with pytest.raises(ValueError):
        _ffi_cache.declarations_path("../x", CDEF, _env(tmp_path))


@pytest.mark.parametrize("cached", [True, False])
def test_symbol_missing_from_the_library_is_none(tmp_path, cached):
    path = _spqr_path()
    env = _env(tmp_path if cached else tmp_path / "f" / "x")
    if not cached:
        (tmp_path / "f").write_text("")
    ffi = _ffi_cache.declared_ffi("pairs", CDEF, env)
    assert isinstance(ffi, _cffi_backend.FFI if cached else cffi.FFI)
    lib = ffi.dlopen(path)
    assert _ffi_cache.symbol(lib, "no_such_function_anywhere") is None
    version = ffi.new("int[3]")
    _ffi_cache.symbol(lib, "cholmod_l_version")(version)
    assert version[0] >= 3


def test_pointer_reader_does_not_import_pycparser():
    ffi = blas_threads._cffi()
    assert not isinstance(ffi, cffi.FFI)
    assert int(ffi.cast("uintptr_t", ffi.cast("void *", 12345))) == 12345


_PROCESS = r"""
import hashlib, sys
import numpy as np, scipy.sparse as sp
from scipy_gpuqr._cpu.spqr import spqr_available, spqr_factorize, _libs
ok, why = spqr_available()
assert ok, why
A = sp.random_array((60, 40), density=0.2, rng=3, format="csc") + sp.eye_array(60, 40)
f = spqr_factorize(sp.csc_array(A))
y = f.qt_matmul(np.arange(60.0))
h = hashlib.sha256(f.R.toarray().tobytes() + f.colperm.tobytes() + y.tobytes()).hexdigest()
print(type(_libs().ffi).__module__, 'pycparser' in sys.modules, _libs().qmult is not None, h)
"""


def _process(cache):
    env = dict(os.environ, PYTHONPATH=str(REPO), SCIPY_GPUQR_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-c", _PROCESS], env=env, check=True,
                          capture_output=True, text=True).stdout.split()


def test_new_process_with_a_valid_module_parses_no_c_and_answers_alike(tmp_path):
    ok, why = spqr_available()
    if not ok:
        pytest.skip(why)
    blocker = tmp_path / "file"
    blocker.write_text("")
    inline = _process(blocker / "cache")
    first = _process(tmp_path / "cache")          # writes the module
    later = _process(tmp_path / "cache")          # reads it
    assert inline[:2] == ["cffi.api", "True"]
    assert later[:2] == ["_cffi_backend", "False"]
    assert first[0] == "_cffi_backend"
    assert inline[2:] == first[2:] == later[2:]
    assert (tmp_path / "cache" / _ffi_cache.FOLDER).is_dir()
    assert _ffi_cache.declarations_path("spqr", _declarations(),
                                        _env(tmp_path / "cache")).is_file()


_DECLARED = r"""
import sys
from scipy_gpuqr._cpu.spqr import spqr_available
from scipy_gpuqr._symbolic.ordering import _amd_lib
spqr_available()
try:
    _amd_lib()
except Exception:            # libamd absent: its declarations were still loaded first
    pass
print('pycparser' in sys.modules)
"""


def test_declare_ahead_writes_every_set_so_a_new_process_parses_none(tmp_path):
    from scipy_gpuqr._declare_ahead import declaration_sets, declare_ahead
    got = declare_ahead(_env(tmp_path))
    names = [name for name, _ in declaration_sets()]
    assert got == [(name, True) for name in names] and {"spqr", "amd"} <= set(names)
    for name, cdef in declaration_sets():
        assert _ffi_cache.declarations_path(name, cdef, _env(tmp_path)).is_file()
    assert declare_ahead(_env(tmp_path)) == got               # kept: nothing to do again
    env = dict(os.environ, PYTHONPATH=str(REPO), SCIPY_GPUQR_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", _DECLARED], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == ["False"]


def test_declare_ahead_without_a_writable_folder_says_so(tmp_path):
    from scipy_gpuqr._declare_ahead import declare_ahead, declare_ahead_line
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = _env(blocker / "cache")
    assert all(not ok for _, ok in declare_ahead(env))
    assert "not kept" in declare_ahead_line(env)
