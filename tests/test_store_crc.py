"""The store's CRC-32 in pieces on threads: the same value as one zlib pass."""

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
