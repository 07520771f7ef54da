"""The parts' compiled-library functions (``mode``, ``library``, ``handle``,
``status``) come from one :class:`~scipy_gpuqr._native_build.NativePart` per
part and read its loader at each call (CPU only, nothing built)."""

import importlib

import pytest

from scipy_gpuqr._errors import NativeUnavailable

from _native_helpers import use_loader

#: The parts whose ``handle`` is the shared one; the iterative loops' checks
#: the library before handing it out (its own ``handle``).
PARTS = ["_symbolic.native", "_schedule.native", "_engine.native", "_factor.native"]
ALL_PARTS = PARTS + ["_iterative.native"]


class _Fixed:
    """A loader that hands out ``lib`` (None: none can be had) and counts asks."""

    def __init__(self, lib, status):
        self.lib, self._status, self.asked = lib, status, []

    def get(self, wait, environ=None):
        self.asked.append(wait)
        return self.lib

    def status(self):
        return self._status


@pytest.mark.parametrize("name", PARTS)
def test_a_part_serves_the_loader_in_place(name, monkeypatch):
    mod = importlib.import_module(f"scipy_gpuqr.{name}")
    assert {mod.mode, mod.library, mod.handle, mod.status} == {
        mod._NATIVE.mode, mod._NATIVE.library, mod._NATIVE.handle, mod._NATIVE.status}
    lib = object()
    ld = _Fixed(lib, "loaded")
    use_loader(monkeypatch, mod, ld)
    assert mod.status() == "loaded"
    assert mod.library() is lib and ld.asked == [True]
    assert mod.library(wait=False) is lib and ld.asked == [True, False]
    assert mod.handle({mod.ENV: "c"}) is lib and ld.asked[-1] is True
    assert mod.handle({}) is lib and ld.asked[-1] is False           # auto: no wait
    asked = len(ld.asked)
    assert mod.handle({mod.ENV: "numpy"}) is None and len(ld.asked) == asked
    use_loader(monkeypatch, mod, _Fixed(None, "unavailable: no compiler here"))
    assert mod.handle({mod.ENV: "auto"}) is None
    with pytest.raises(NativeUnavailable, match="no compiler here"):
        mod.handle({mod.ENV: "c"})
    with pytest.raises(ValueError):
        mod.mode({mod.ENV: "fortran"})
    assert mod.mode({mod.ENV: " C "}) == "c"


def test_the_iterative_part_reads_the_loader_in_place(monkeypatch):
    mod = importlib.import_module("scipy_gpuqr._iterative.native")
    assert {mod.mode, mod.library, mod.status} == {
        mod._NATIVE.mode, mod._NATIVE.library, mod._NATIVE.status}
    monkeypatch.setattr(mod, "_CHECKED", mod.Checked())
    lib = object()
    ld = _Fixed(lib, "loaded")
    use_loader(monkeypatch, mod, ld)
    assert mod.status() == "loaded" and mod.library() is lib
    asked = len(ld.asked)
    assert mod.handle({mod.ENV: "numpy"}) is None and len(ld.asked) == asked
    use_loader(monkeypatch, mod, _Fixed(None, "unavailable: no compiler here"))
    assert mod.handle({mod.ENV: "auto"}) is None
    with pytest.raises(NativeUnavailable, match="LSQR/LSMR loops: unavailable: no compiler"):
        mod.handle({mod.ENV: "c"})


def test_each_part_has_its_own_loader():
    mods = [importlib.import_module(f"scipy_gpuqr.{name}") for name in ALL_PARTS]
    assert len({id(m._NATIVE.loader) for m in mods}) == len(mods)
    assert len({m._NATIVE.spec.prefix for m in mods}) == len(mods)
    assert all(m._NATIVE.spec is m._SPEC for m in mods)
