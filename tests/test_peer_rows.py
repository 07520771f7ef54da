"""Rows lent to another GPU and taken back (scipy_gpuqr._engine.gpu.peer_rows), on a
stand-in for CuPy's devices, streams, events and peer copies: which rows go
where, on which device each array lies, and that a copy into a block another
stream's pool gave waits for that stream first. The GPU paths run in
tests/test_replay_split.py (marker ``gpu``)."""

from __future__ import annotations

import types

import numpy as np

from scipy_gpuqr._engine.gpu import peer_rows


class _Fake:
    """Just what :class:`peer_rows.PeerRows` calls of CuPy."""

    def __init__(self):
        self.stack, self.log = [0], []
        fake = self

        class Device:
            def __init__(self, i=None):
                self.id = fake.stack[-1] if i is None else i

            def __enter__(self):
                fake.stack.append(self.id)
                return self

            def __exit__(self, *exc):
                fake.stack.pop()

        class Stream:
            def __init__(self, non_blocking=False, name=None):
                self.device, self.name = fake.stack[-1], name
                self.waited = []

            def __enter__(self):
                assert fake.stack[-1] == self.device, "a stream used off its device"
                fake.log.append(("stream", self.name))
                return self

            def __exit__(self, *exc):
                pass

            def wait_event(self, ev):
                assert fake.stack[-1] == self.device
                self.waited.append(ev.stream.name)
                fake.log.append(("wait", self.name, ev.stream.name))

            def synchronize(self):
                pass

        class Event:
            def __init__(self, block=False, disable_timing=False):
                self.stream = None

            def record(self, stream):
                assert fake.stack[-1] == stream.device
                self.stream = stream

        self.current = {}
        self.cuda = types.SimpleNamespace(
            Device=Device, Stream=Stream, Event=Event,
            get_current_stream=lambda: fake.current.setdefault(
                fake.stack[-1], Stream.__new__(Stream)))
        self.Stream = Stream

    def array(self, values):
        return _Arr(self, np.array(values), self.stack[-1])

    def asarray(self, values):
        return self.array(values)

    def empty(self, shape, dtype):
        return _Arr(self, np.full(shape, np.nan, dtype=dtype), self.stack[-1])


class _Ptr:
    def __init__(self, arr):
        self.arr = arr

    def copy_from_device_async(self, src, nbytes, stream):
        fake = self.arr.fake
        assert stream.device == fake.stack[-1]
        # the copying stream waited for the other device's stream before writing
        assert stream.waited, "a copy before its stream waited for the other one"
        assert nbytes == src.arr.values.nbytes
        self.arr.values[...] = src.arr.values
        fake.log.append(("copy", src.arr.device, self.arr.device, stream.name))


class _Arr:
    def __init__(self, fake, values, device):
        self.fake, self.values, self.device = fake, values, device
        self.shape, self.dtype, self.nbytes = values.shape, values.dtype, values.nbytes
        self.data = _Ptr(self)


def _ops(fake):
    def take_rows(src, idx):
        assert src.device == idx.device == fake.stack[-1]
        return _Arr(fake, src.values[idx.values], src.device)

    def put_rows(dst, idx, src):
        assert dst.device == idx.device == src.device == fake.stack[-1]
        dst.values[idx.values] = src.values
    return types.SimpleNamespace(take_rows=take_rows, put_rows=put_rows)


def test_rows_lent_and_taken_back(monkeypatch):
    fake = _Fake()
    monkeypatch.setattr(peer_rows, "array_ops", _ops(fake))
    with fake.cuda.Device(0):
        home_stream = fake.Stream(name="home")
    with fake.cuda.Device(2):
        lane_stream = fake.Stream(name="lane")
    lent, taken = np.array([1, 4, 5, 7]), np.array([4, 7])
    pr = peer_rows.PeerRows(2, 0, lane_stream, home_stream, {"s": (lent, taken)}, cp=fake)
    assert pr.rows["s"][0][0].device == 0 and pr.rows["s"][0][1].device == 2
    X = _Arr(fake, np.arange(20, dtype=np.float64).reshape(10, 2), 0)
    Xd = pr.lend(X, "s")
    assert Xd.device == 2 and Xd.shape == X.shape
    np.testing.assert_array_equal(Xd.values[lent], X.values[lent])
    assert np.isnan(np.delete(Xd.values, lent, axis=0)).all()
    assert fake.stack == [0]
    Xd.values[lent] *= -1                       # the lane's work
    before = X.values.copy()
    home_stream.waited.clear()
    lane_stream.waited.clear()
    pr.take_back(Xd, "s", X)
    want = before.copy()
    want[taken] = -before[taken]
    np.testing.assert_array_equal(X.values, want)   # only the taken rows changed
    copies = [e for e in fake.log if e[0] == "copy"]
    assert copies == [("copy", 0, 2, "home"), ("copy", 2, 0, "lane")]
    assert home_stream.waited == ["lane"]       # the home work after waits for the lane
    assert fake.stack == [0]


def test_rows_lent_and_taken_alike_uploaded_once(monkeypatch):
    """A segment whose rows taken back are those lent (``Q``'s lanes): each
    device gets one copy of them, read by both moves."""
    fake = _Fake()
    monkeypatch.setattr(peer_rows, "array_ops", _ops(fake))
    made = []
    real = fake.asarray
    monkeypatch.setattr(fake, "asarray", lambda v: made.append(fake.stack[-1]) or real(v))
    with fake.cuda.Device(0):
        home_stream = fake.Stream(name="home")
    with fake.cuda.Device(1):
        lane_stream = fake.Stream(name="lane")
    rows = np.array([0, 3, 6])
    pr = peer_rows.PeerRows(1, 0, lane_stream, home_stream, {"s": (rows, rows)}, cp=fake)
    assert sorted(made) == [0, 1]
    assert pr.rows["s"][0] is pr.rows["s"][1]
    X = _Arr(fake, np.arange(16, dtype=np.float64).reshape(8, 2), 0)
    Xd = pr.lend(X, "s")
    Xd.values[rows] += 1
    pr.take_back(Xd, "s", X)
    want = np.arange(16, dtype=np.float64).reshape(8, 2)
    want[rows] += 1
    np.testing.assert_array_equal(X.values, want)
