"""The store's CRC-32 in pieces on threads: the same value as one zlib pass."""

import types
import zlib

import numpy as np
import pytest

from scipy_gpuqr import _store


@pytest.mark.parametrize("n", [0, 1, 5, 4095, 4096, 100_003])
def test_crc32_combine_is_zlibs_crc_of_the_whole(n):
    rng = np.random.default_rng(n)
    b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    for cut in sorted({0, n // 3, n // 2, n}):
        a1, a2 = b[:cut], b[cut:]
        assert _store.crc32_combine(zlib.crc32(a1), zlib.crc32(a2), len(a2)) == zlib.crc32(b)


@pytest.mark.parametrize("n", [0, 1000, 4096, 4096 * 5 + 17, 4096 * 8])
def test_crc32_in_pieces_on_threads(monkeypatch, n):
    """Small pieces and threshold, so that every path (one piece, equal pieces, a
    shorter last one) runs on threads; a mapped-file-like memoryview too."""
    monkeypatch.setattr(_store, "CRC_PARALLEL_BYTES", 1)
    monkeypatch.setattr(_store, "CRC_PIECE_LOG2", 12)
    monkeypatch.setattr(_store.os, "cpu_count", lambda: 4)
    rng = np.random.default_rng(n + 1)
    arr = rng.integers(0, 256, n, dtype=np.uint8)
    assert _store.crc32(arr) == zlib.crc32(arr.tobytes())
    assert _store.crc32(memoryview(arr.tobytes())[3:]) == zlib.crc32(arr.tobytes()[3:])


def test_damaged_payload_fails_the_parallel_check(monkeypatch, tmp_path):
    """decode_arrays through the pieces: a file's own arrays decode, one flipped
    byte fails the check."""
    monkeypatch.setattr(_store, "CRC_PARALLEL_BYTES", 1)
    monkeypatch.setattr(_store, "CRC_PIECE_LOG2", 10)
    a = {"x": np.arange(5000, dtype=np.int64)}
    path = tmp_path / "f.bin"
    with open(path, "wb") as fh:
        _store.write_arrays(fh, b"TESTMAG1", a, {"format": 1})
    data = _store.read_mapped(path)
    h, got = _store.decode_arrays(data, b"TESTMAG1", {"format": 1})
    assert np.array_equal(got["x"], a["x"])
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 1
    with pytest.raises(ValueError):
        _store.decode_arrays(bytes(raw), b"TESTMAG1", {"format": 1})


@pytest.mark.parametrize("writable", [False, True])
def test_mapped_read_private_when_writable(tmp_path, writable):
    """A mapped array file's arrays are read-only views, or with ``writable``
    views of a private mapping: writable, and what is written never reaches the
    file (nor a later reader)."""
    a = {"x": np.arange(50_000, dtype=np.int64)}
    path = tmp_path / "f.bin"
    with open(path, "wb") as fh:
        _store.write_arrays(fh, b"TESTMAG1", a, {"format": 1})
    raw = path.read_bytes()
    _, got = _store.decode_arrays(_store.read_mapped(path, writable=writable), b"TESTMAG1",
                                  {"format": 1})
    x = got["x"]
    assert x.flags.writeable == writable
    assert x.ctypes.data % 64 == 0
    if writable:
        x[:] = -1
        assert (x == -1).all()
    else:
        with pytest.raises(ValueError):
            x[0] = -1
    assert path.read_bytes() == raw
    _, again = _store.decode_arrays(_store.read_mapped(path), b"TESTMAG1", {"format": 1})
    assert np.array_equal(again["x"], a["x"])


@pytest.mark.parametrize("threads", [2, 3, 8])
@pytest.mark.parametrize("n", [1, 4096 * 5 + 17, 16_700_000, 52_600_000, 428_400_000])
def test_crc_pieces_one_per_thread(n, threads):
    """At most one piece per thread, whole pages, none under the smallest piece;
    a payload of many smallest pieces fills every thread (a new process's
    428 MB layout in 8 pieces, not a hundred)."""
    piece = _store.crc_piece_bytes(n, threads)
    count = -(-n // piece)
    assert count <= threads
    assert piece % 4096 == 0 and piece >= 1 << _store.CRC_PIECE_LOG2
    if n >= threads << _store.CRC_PIECE_LOG2:
        assert count == threads


def test_crc32_runs_one_zlib_pass_per_thread(monkeypatch):
    """The threaded check hands each thread one piece (each piece's end takes the
    interpreter's lock back) and still gives zlib's value."""
    monkeypatch.setattr(_store, "CRC_PARALLEL_BYTES", 1)
    monkeypatch.setattr(_store, "CRC_PIECE_LOG2", 12)
    monkeypatch.setattr(_store.os, "cpu_count", lambda: 4)
    passes = []
    shim = types.SimpleNamespace(crc32=lambda b, v=0: passes.append(len(b)) or zlib.crc32(b, v))
    monkeypatch.setattr(_store, "zlib", shim)
    arr = np.random.default_rng(7).integers(0, 256, 4096 * 37 + 5, dtype=np.uint8)
    assert _store.crc32(arr) == zlib.crc32(arr.tobytes())
    assert len(passes) == 4 and sum(passes) == arr.size
