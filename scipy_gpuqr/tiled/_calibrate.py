"""Short calibration of tile speeds and transfer speeds, cached on disk.

Each device times its own tile operations on random tiles of the working tile
size and dtype (medians of a few runs after a warm-up): triangulation and
elimination (the CPU: GEQRT and TPQRT of one tile; a GPU: its fused
``geqrf`` + compact-WY factorization of a column of ``CAL_TILES`` tiles, per
tile), and the updates (GEMQRT, TPMQRT; a GPU: one compact-WY update of
``CAL_TILES x CAL_TILES`` tiles, per tile). Transfers are timed between every
pair of devices with 64 MiB. The synchronisation cost a device adds when it
joins a run (per step and once) is measured by running the tiled QR itself on
small matrices of ``SYNC_TILE`` tiles, where the work is negligible, with and
without it (:func:`measure_sync`). Results live in ``tiled_calibration.json`` in
the cache folder: ``$SCIPY_GPUQR_CACHE_DIR``, else
``$XDG_CACHE_HOME/scipy_gpuqr``, else ``~/.cache/scipy_gpuqr``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from .._cachedir import require_cache_dir
from .._gpu import device_name, import_cupy
from . import _ops as ops
from ._devices import make_device as _real_device
from ._model import DeviceProfile
from ._runtime import Layout, run_tiled_qr

__all__ = ["cache_dir", "cache_file", "get_profiles", "measure_device",
           "measure_bandwidth", "measure_sync", "device_key", "CAL_TILES",
           "SYNC_TILE"]

CACHE_NAME = "tiled_calibration.json"
#: Tiles per side of the GPU calibration blocks.
CAL_TILES = 8
_BW_BYTES = 64 << 20
#: Tile size and step counts of the synchronisation measurement.
SYNC_TILE = 32
_SYNC_STEPS = (2, 8)


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The user cache folder of this package (not created here): the rule of
    :func:`scipy_gpuqr._cachedir.require_cache_dir` (RuntimeError without one)."""
    return require_cache_dir(environ)


def cache_file(directory: Optional[os.PathLike] = None) -> Path:
    return Path(directory) / CACHE_NAME if directory else cache_dir() / CACHE_NAME


def device_key(name: str) -> str:
    """A key naming the hardware behind ``name`` (model, cores), not only its index."""
    if name == "cpu":
        return f"cpu[{os.cpu_count()} cores]"
    return f"{name}[{device_name(int(name.split(':')[1]))}]"


def _median_time(fn, sync=lambda: None, reps: int = 3) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_device(name: str, tile: int, dtype) -> DeviceProfile:
    """Time one device's tile operations (a fraction of a second)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    if name == "cpu":
        geqrt, tpqrt, gemqrt, tpmqrt = ops.lapack_funcs(dtype)
        a = np.asfortranarray(rng.standard_normal((tile, tile)).astype(dtype))
        b = np.asfortranarray(rng.standard_normal((tile, tile)).astype(dtype))
        ib = 32
        v, t, _ = geqrt(ib, a)
        r = np.asfortranarray(np.triu(v))
        _, bv, bt, _ = tpqrt(0, ib, r, b)
        t_T = _median_time(lambda: geqrt(ib, a))
        t_E = _median_time(lambda: tpqrt(0, ib, r, b))
        t_UT = _median_time(lambda: gemqrt(v, t, a, trans="T"))
        t_UE = _median_time(lambda: tpmqrt(0, bv, bt, a, b, trans="T"))
        return DeviceProfile(name, t_T, t_E, t_UT, t_UE, device_key(name))
    cp = import_cupy()
    index = int(name.split(":")[1])
    with cp.cuda.Device(index):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            mt = CAL_TILES * tile
            col = cp.asarray(rng.standard_normal((mt, tile)).astype(dtype))
            C = cp.asarray(rng.standard_normal((mt, mt)).astype(dtype),
                           order="F")
            panel = ops.factor_wy(cp, col, 0)
            t_panel = _median_time(lambda: ops.factor_wy(cp, col, 0), s.synchronize)
            t_upd = _median_time(lambda: ops.apply_wy(panel, C[:, :], "T"),
                                 s.synchronize)
    per_te = t_panel / CAL_TILES
    per_u = t_upd / (CAL_TILES * CAL_TILES)
    return DeviceProfile(name, per_te / 2, per_te / 2, per_u / 2, per_u / 2,
                         device_key(name))


def measure_bandwidth(src: str, dst: str) -> float:
    """Bytes per second of a 64 MiB copy from ``src`` to ``dst``."""
    cp = import_cupy()
    n = _BW_BYTES // 8
    if src == "cpu" or dst == "cpu":
        import cupyx  # optional dependency, with CuPy
        gpu = int((dst if src == "cpu" else src).split(":")[1])
        host = cupyx.empty_pinned((n,), dtype=np.float64)
        host[:] = 1.0
        with cp.cuda.Device(gpu):
            s = cp.cuda.Stream(non_blocking=True)
            d = cp.empty((n,), dtype=np.float64)
            if src == "cpu":
                fn = lambda: d.set(host, stream=s)
            else:
                fn = lambda: d.get(stream=s, out=host)
            t = _median_time(fn, s.synchronize)
        return _BW_BYTES / t
    i, j = int(src.split(":")[1]), int(dst.split(":")[1])
    with cp.cuda.Device(i):
        x = cp.ones((n,), dtype=np.float64)
    with cp.cuda.Device(j):
        y = cp.empty((n,), dtype=np.float64)
        if cp.cuda.runtime.deviceCanAccessPeer(j, i):
            try:
                cp.cuda.runtime.deviceEnablePeerAccess(i)
            except Exception:
                pass
        s = cp.cuda.Stream(non_blocking=True)
        t = _median_time(lambda: cp.cuda.runtime.memcpyPeerAsync(
            y.data.ptr, j, x.data.ptr, i, _BW_BYTES, s.ptr), s.synchronize)
    return _BW_BYTES / t


def measure_sync(base: str, other: str, dtype, make_device=None,
                 reps: int = 5) -> tuple[float, float]:
    """Seconds ``other`` adds to a tiled QR led by ``base``: ``(fixed, step)``.

    Times the whole tiled QR (device set-up included) of square matrices of
    2 and 8 tiles of ``SYNC_TILE`` columns on ``[base]`` and on ``[base,
    other]`` (columns alternating); the work is negligible, so the extra time
    is the synchronisation. Its growth per step is ``step``, the rest
    ``fixed``. ``make_device(name)`` builds a device (default: the real
    ones, :func:`._devices.make_device`); a ``'gpu:N'`` base gets its input
    on that GPU.
    """
    if make_device is None:
        make_device = _real_device
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)

    def run_time(names, steps):
        n = steps * SYNC_TILE
        a = rng.standard_normal((n, n)).astype(dtype)
        if base.startswith("gpu:"):
            cp = import_cupy()
            with cp.cuda.Device(int(base.split(":")[1])):
                a = cp.asarray(a)
        owners = [0] + [j % len(names) for j in range(1, steps)]
        layout = Layout(n, n, SYNC_TILE, dtype)

        def once():
            devs = [make_device(name) for name in names]
            run_tiled_qr(a, devs, owners, layout, False, devs[0])
        return _median_time(once, reps=reps)

    lo, hi = _SYNC_STEPS
    d_lo = run_time([base, other], lo) - run_time([base], lo)
    d_hi = run_time([base, other], hi) - run_time([base], hi)
    step = max(0.0, (d_hi - d_lo) / (hi - lo))
    fixed = max(0.0, d_lo - lo * step)
    return fixed, step


def _sync_partner(name: str, names: Sequence[str]) -> str:
    """The device ``name`` is measured joining: another GPU, else any other."""
    others = [x for x in names if x != name]
    gpus = [x for x in others if x.startswith("gpu:")]
    return (gpus or others)[0]


def _load(path: Path) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home still works, just without the cache


def get_profiles(names: Sequence[str], tile: int, dtype, *,
                 cache_dir: Optional[os.PathLike] = None,
                 refresh: bool = False):
    """Profiles and bandwidths of ``names``: from the cache, else measured.

    Returns
    -------
    profiles : list of DeviceProfile
    bandwidth : dict
        ``(src, dst) -> bytes/s`` for every ordered pair of ``names``.
    """
    path = cache_file(cache_dir)
    data = _load(path)
    prof_cache = data.setdefault("profiles", {})
    bw_cache = data.setdefault("bandwidth", {})
    dirty = False
    dt = np.dtype(dtype).name
    profiles = []
    for name in names:
        key = f"{device_key(name)}|{dt}|{int(tile)}"
        if refresh or key not in prof_cache:
            prof_cache[key] = measure_device(name, tile, dtype).to_json()
            dirty = True
        prof = DeviceProfile.from_json(prof_cache[key])
        profiles.append(DeviceProfile(name, prof.t_T, prof.t_E, prof.t_UT,
                                      prof.t_UE, prof.description))
    if len(names) > 1:
        sync_cache = data.setdefault("sync", {})
        joined = []
        for name, prof in zip(names, profiles):
            base = _sync_partner(name, names)
            key = f"{device_key(base)}+{device_key(name)}|{dt}"
            if refresh or key not in sync_cache:
                sync_cache[key] = list(measure_sync(base, name, dtype))
                dirty = True
            fixed, step = (float(x) for x in sync_cache[key])
            joined.append(dataclasses.replace(prof, t_sync_fixed=fixed,
                                              t_sync_step=step))
        profiles = joined
    bandwidth = {}
    for src in names:
        for dst in names:
            if src == dst:
                continue
            key = f"{device_key(src)}->{device_key(dst)}"
            if refresh or key not in bw_cache:
                bw_cache[key] = measure_bandwidth(src, dst)
                dirty = True
            bandwidth[(src, dst)] = float(bw_cache[key])
    if dirty:
        _save(path, data)
    return profiles, bandwidth
