"""A multi-device factorization's front pools copied to ``Q``'s device before its solves.

A factorization over several GPUs (:mod:`.multi_device`) leaves each stage's
front pool on the device that factorized it, and ``Q``'s replay and R's
triangular solves, which run on the first device (the *home* device), read
the other devices' pools through peer access: every level's kernel then reads
Householder vectors and rows of R over the link, a few bytes at a time. The
first solve of such a factorization copies those pools to the home device
instead, in bulk and from every other device at once (:func:`bring_home`),
so that this solve and every later one read device memory. The copies go
where the home device has room for them (:data:`HOME_SHARE` of what it may
allocate); a pool that does not fit stays where it is and is read as before.
The values are the same bits wherever they lie: the solves' answers do not
change.
"""

from __future__ import annotations

import threading
import time

from ..memory import available_bytes

__all__ = ["bring_home", "BRING_HOME", "HOME_SHARE"]

#: Copy a multi-device factorization's other devices' pools to ``Q``'s device at
#: its first solve. Off: the solves read those pools over the link where they lie.
BRING_HOME = True

#: Share of the memory the home device may allocate (:func:`~scipy_gpuqr._engine.
#: memory.available_bytes`) that the pools brought there may take together; the
#: rest stays for the solves' own blocks (a rank decision's, R's rows kept).
HOME_SHARE = 0.5


def bring_home(qr) -> dict | None:
    """Copy ``qr``'s stage pools that lie on another CUDA device than its home
    layer's to the home device (once per factorization; thread-safe), largest
    first while they fit, and put the copies in ``qr._stage_pools`` in their
    place (the other devices' blocks go back to their pools).

    Each other device pushes its pools on a stream of its own (peer to peer, all
    devices at once, each by its own copy engine), after the work queued on the
    home device's current stream (where the copies' blocks may have served
    before); the call returns once they completed, so that any stream may read
    the copies. What was done is in ``qr.info['pools_home']``
    (bytes, stages, seconds, stages left where they lie) and returned; None
    where there was nothing to bring (one device, NumPy layers, :data:`BRING_HOME`
    off).
    """
    dev = getattr(qr, "_device", None)
    cp = getattr(dev, "cp", None)
    pools = getattr(qr, "_stage_pools", None)
    if not BRING_HOME or cp is None or not pools:
        return None
    home = int(getattr(dev, "device_id", cp.cuda.Device().id))
    replay = qr._replay
    lock = replay.setdefault("pools_home_lock", threading.Lock())
    with lock:
        if "pools_home" in replay:
            return replay["pools_home"]
        away = [(sid, p) for sid, p in pools.items()
                if isinstance(p, cp.ndarray) and int(p.device.id) != home]
        if not away:
            replay["pools_home"] = None
            return None
        done = _copy_home(cp, qr, home, away)
        replay["pools_home"] = done
        info = getattr(qr, "info", None)
        if isinstance(info, dict):
            info["pools_home"] = done
        return done


def _copy_home(cp, qr, home: int, away: list) -> dict:
    """The copies of ``away`` (``(stage, pool)`` on other devices) that fit the home
    device, made and waited for; what was done."""
    t0 = time.perf_counter()
    with cp.cuda.Device(home):
        room = int(HOME_SHARE * available_bytes(cp).available)
        after = cp.cuda.Event(disable_timing=True)
        after.record(cp.cuda.get_current_stream())      # the home device's queued work
        streams, copies, left, moved = {}, [], [], 0
        for sid, pool in sorted(away, key=lambda item: -int(item[1].nbytes)):
            nbytes = int(pool.nbytes)
            if nbytes > room:
                left.append(int(sid))
                continue
            try:
                dst = cp.empty(pool.shape, dtype=pool.dtype)
            except cp.cuda.memory.OutOfMemoryError:
                left.append(int(sid))
                continue
            src_id = int(pool.device.id)
            with cp.cuda.Device(src_id):        # pushed by the source device's copy engine
                stream = streams.get(src_id)
                if stream is None:
                    cp.cuda.Device(src_id).synchronize()    # its stages have ended
                    stream = streams[src_id] = cp.cuda.Stream(non_blocking=True)
                    stream.wait_event(after)
                cp.cuda.runtime.memcpyPeerAsync(dst.data.ptr, home, pool.data.ptr, src_id,
                                                nbytes, stream.ptr)
            copies.append((sid, dst))
            room -= nbytes
            moved += nbytes
        for stream in streams.values():
            stream.synchronize()
    for sid, dst in copies:
        qr._stage_pools[sid] = dst
    return {"bytes": moved, "stages": sorted(int(s) for s, _ in copies),
            "left": sorted(left), "seconds": time.perf_counter() - t0}
