"""scipy_gpuqr._mapped_files: the paths of the files mapped into the process."""

import os

import pytest

from scipy_gpuqr._mapped_files import mapped_paths


def test_paths_holding_a_fragment_each_once_in_map_order(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1      /usr/lib/libnvrtc.so.13.0.48\n"
        "7f01-7f02 r--p 00000000 08:01 1      /usr/lib/libnvrtc.so.13.0.48\n"
        "7f02-7f03 r-xp 00000000 08:01 2      /opt/My Libs/libNVRTC-builtins.so.13\n"
        "7f03-7f04 rw-p 00000000 00:00 0\n"
        "7f04-7f05 r-xp 00000000 08:01 3      /usr/lib/libm.so.6")
    assert mapped_paths("libnvrtc", str(maps)) == [
        "/usr/lib/libnvrtc.so.13.0.48", "/opt/My Libs/libNVRTC-builtins.so.13"]
    assert mapped_paths("libm.so", str(maps)) == ["/usr/lib/libm.so.6"]     # last line, no newline
    assert mapped_paths("rw-p", str(maps)) == []                 # a line without a path
    assert mapped_paths("libcuda", str(maps)) == []
    assert mapped_paths("libm", str(tmp_path / "absent")) == []


def test_this_process_maps_pythons_own_library_or_binary():
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc/self/maps (not Linux)")
    assert mapped_paths("python")
