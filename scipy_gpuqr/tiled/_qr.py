"""``qr_tiled``: dense QR in tiles over the CPU and every GPU.

The matrix is cut into column tiles. A *main device* (Kim and Park's
Algorithm 2) does the triangulation and elimination of every tile column; the
column tiles are spread over ``p`` devices (Algorithm 3) by a distribution
guide array (Algorithm 4), each device applying the main device's reflectors
to its own columns (:mod:`._runtime`). Device speeds come from a short
calibration cached in the user cache folder (:mod:`._calibrate`); the model
that turns them into a plan is :mod:`._model`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import scipy.linalg

from .._gpu import import_cupy, is_cupy_array
from .._options import log_decision
from . import _model as model
from ._calibrate import get_profiles
from ._cpu_device import DEFAULT_CPU_TILE
from ._devices import make_device
from ._runtime import Layout, run_tiled_qr

__all__ = ["qr_tiled", "resolve_devices", "plan_tiled", "DEFAULT_GPU_TILE",
           "DEFAULT_PANEL_LEAF"]

#: Default tile size when a GPU takes part (the CPU-only default is
#: :data:`._cpu_device.DEFAULT_CPU_TILE`).
DEFAULT_GPU_TILE = 512
#: From this min(m, n) on, GPUs use tiles of ``2 * DEFAULT_GPU_TILE`` (larger
#: matrices keep the GPUs busy with fewer, larger products).
LARGE_GPU_TILE_FROM = 4096
#: Leaf width of the GPUs' recursive panel factorization (0: one geqrf per
#: tile column).
DEFAULT_PANEL_LEAF = 0

_MODES = ("r", "economic")


def _gpu_count() -> int:
    cp = import_cupy()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def resolve_devices(devices, n_gpus: Optional[int] = None) -> tuple[list[str], bool]:
    """Normalise ``devices`` to names ``'cpu'``, ``'gpu:0'``, ...

    Parameters
    ----------
    devices : 'auto', str, int or sequence of those
        ``'auto'`` means the CPU and every GPU, with the model choosing how many
        take part. ``'cpu'``; ``'gpu'`` (every GPU); ``'gpu:1'`` or
        ``'cuda:1'`` or the int ``1`` (that GPU).
    n_gpus : int, optional
        Number of visible GPUs (counted when None).

    Returns
    -------
    names : list of str
    auto : bool
        True when the model may leave devices out.

    Raises
    ------
    ValueError
        For an unknown name, a GPU that is not there, or a repeated device.
    """
    if n_gpus is None:
        n_gpus = _gpu_count()
    if isinstance(devices, str) and devices == "auto":
        return ["cpu"] + [f"gpu:{i}" for i in range(n_gpus)], True
    items = [devices] if isinstance(devices, (str, int, np.integer)) else list(devices)
    if not items:
        raise ValueError("devices must name at least one device")
    names: list[str] = []
    for item in items:
        for name in _parse_device(item, n_gpus):
            if name in names:
                raise ValueError(f"device {name!r} is named twice in devices={devices!r}")
            names.append(name)
    return names, False


def _parse_device(item, n_gpus: int) -> list[str]:
    if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
        index = int(item)
    elif isinstance(item, str):
        text = item.strip().lower()
        if text == "cpu":
            return ["cpu"]
        if text in ("gpu", "cuda"):
            if n_gpus == 0:
                raise ValueError("devices asks for the GPUs but no CUDA GPU is visible")
            return [f"gpu:{i}" for i in range(n_gpus)]
        head, sep, tail = text.partition(":")
        if head not in ("gpu", "cuda") or not sep or not tail.isdigit():
            raise ValueError(f"unknown device {item!r}: use 'cpu', 'gpu', "
                             "'gpu:N', 'cuda:N', an int N, or 'auto'")
        index = int(tail)
    else:
        raise ValueError(f"unknown device {item!r}: use 'cpu', 'gpu', 'gpu:N', "
                         "'cuda:N', an int N, or 'auto'")
    if not 0 <= index < n_gpus:
        raise ValueError(f"device gpu:{index} does not exist ({n_gpus} CUDA "
                         "GPU(s) visible)")
    return [f"gpu:{index}"]


def _default_tile(names: Sequence[str], shape=None) -> int:
    if not any(n != "cpu" for n in names):
        return DEFAULT_CPU_TILE
    if shape is not None and min(shape) >= LARGE_GPU_TILE_FROM:
        return 2 * DEFAULT_GPU_TILE
    return DEFAULT_GPU_TILE


def plan_tiled(shape, dtype, devices="auto", tile_size=None, *,
               cache_dir=None, refresh: bool = False):
    """The model's plan for an ``m x n`` QR (calibrating devices if needed).

    Returns
    -------
    plan : Plan
        See :class:`._model.Plan`.
    profiles : list of DeviceProfile
        Every candidate device's profile.
    bandwidth : dict
        ``(src, dst) -> bytes/s``.
    """
    m, n = (int(s) for s in shape)
    names, auto = resolve_devices(devices)
    tile = (int(tile_size) if tile_size is not None
            else _default_tile(names, (m, n)))
    if tile < 1:
        raise ValueError(f"tile_size must be positive, got {tile_size!r}")
    itemsize = np.dtype(dtype).itemsize
    if len(names) == 1:
        prof = model.DeviceProfile(names[0], 1.0, 1.0, 1.0, 1.0, "not calibrated")
        plan = model.make_plan([prof], {}, max(m, 1), max(n, 1), tile, itemsize)
        return plan, [prof], {}
    profiles, bandwidth = get_profiles(names, tile, dtype, cache_dir=cache_dir,
                                       refresh=refresh)
    plan = model.make_plan(profiles, bandwidth, max(m, 1), max(n, 1), tile,
                           itemsize, choose_count=auto)
    return plan, profiles, bandwidth


def _validate(a, mode: str, check_finite: bool):
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    cupy_in = is_cupy_array(a)
    if cupy_in:
        xp = import_cupy()
    else:
        xp = np
        a = np.asarray(a)
    if a.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {a.shape} "
                         f"({a.ndim}-D)")
    kind = a.dtype.kind
    if kind in "biu":
        a = a.astype(np.float64)
    elif kind == "f":
        if a.dtype.itemsize < 4:
            a = a.astype(np.float32)
        elif a.dtype.itemsize > 8:
            raise TypeError(f"dtype {a.dtype} is not supported (float32 or "
                            "float64)")
    elif kind != "c":
        raise TypeError(f"array of dtype {a.dtype} (shape {a.shape}) is not "
                        "numeric")
    if check_finite and a.size:
        if cupy_in:
            with xp.cuda.Device(a.device.id):   # on the input's own GPU
                finite = bool(xp.isfinite(a).all())
        else:
            finite = bool(np.isfinite(a).all())
        if not finite:
            raise ValueError("array must not contain infs or NaNs")
    return a, cupy_in


def qr_tiled(a, mode: str = "economic", devices="auto", *,
             tile_size: Optional[int] = None, check_finite: bool = True,
             panel_leaf: Optional[int] = None):
    """QR decomposition in tiles over the CPU and the GPUs.

    Parameters
    ----------
    a : (M, N) array_like or cupy.ndarray
        Matrix to decompose; not modified. Integers become float64, float16
        becomes float32 (as in ``scipy.linalg.qr``).
    mode : {'economic', 'r'}
        ``'economic'``: ``Q`` (M x K) and ``R`` (K x N), K = min(M, N).
        ``'r'``: only ``R``, of shape (M, N) like ``scipy.linalg.qr``.
    devices : 'auto', str, int or sequence
        ``'auto'``: the CPU and every visible GPU; the device model (main
        device, number of devices, guide array) decides which take part.
        Otherwise the devices named (``'cpu'``, ``'gpu'``, ``'gpu:N'``,
        ``'cuda:N'``, ``N``) all take part; the model picks the main device
        and the distribution.
    tile_size : int, optional
        Width of the column tiles; default 256 on the CPU alone; with a GPU
        512, or 1024 when min(M, N) >= 4096.
    check_finite : bool
        Raise ValueError for infs and NaNs (default True, like SciPy).
    panel_leaf : int, optional
        On GPUs, the tile column is factorized recursively in halves down to
        leaves of at most this many columns (one ``geqrf`` each; the rest is
        matrix products); 0 factorizes it with one ``geqrf``. Default
        :data:`DEFAULT_PANEL_LEAF`.

    Returns
    -------
    Q : ndarray, only for mode='economic'
    R : ndarray
        ``mode='r'`` returns the 1-tuple ``(R,)``, as ``scipy.linalg.qr``.
        NumPy input gives NumPy arrays, CuPy input CuPy arrays on the input's
        device. ``Q @ R`` equals ``a``; ``R`` equals SciPy's up to the signs
        of its rows.

    Raises
    ------
    ValueError
        ``a`` not 2-D, non-finite values, a bad ``mode`` or ``devices``.
    TypeError
        Non-numeric dtype.

    Notes
    -----
    Kim and Park's tiled QR for a CPU with GPUs. The CPU's tile kernels are
    LAPACK's GEQRT, TPQRT, GEMQRT and TPMQRT; a GPU fuses the triangulation
    and eliminations of a tile column into one cuSOLVER ``geqrf`` of the tall
    column plus a compact-WY reflector, and the updates into matrix products. Complex input is passed to
    ``scipy.linalg.qr`` (NumPy) or ``cupy.linalg.qr`` (CuPy). Calibrated
    speeds are cached in ``$SCIPY_GPUQR_CACHE_DIR`` (default
    ``$XDG_CACHE_HOME/scipy_gpuqr`` or ``~/.cache/scipy_gpuqr``); computation
    uses this package's own CUDA streams and is complete on return.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy_gpuqr import qr_tiled
    >>> a = np.random.default_rng(0).standard_normal((600, 400))
    >>> q, r = qr_tiled(a, devices=["cpu"])
    >>> bool(np.allclose(q @ r, a))
    True
    """
    a, cupy_in = _validate(a, mode, check_finite)
    if a.dtype.kind == "c":
        return _complex_fallback(a, mode, cupy_in)
    m, n = a.shape
    kq = min(m, n)
    if m == 0 or n == 0:
        xp = import_cupy() if cupy_in else np
        R = xp.zeros((m, n) if mode == "r" else (kq, n), dtype=a.dtype)
        if mode == "r":
            return (R,)
        return xp.zeros((m, kq), dtype=a.dtype), R
    plan, _, _ = plan_tiled(a.shape, a.dtype, devices, tile_size)
    log_decision("qr_tiled %dx%d %s: main %s, p=%d %s, guide %s, tile %d",
                 m, n, a.dtype, plan.main, plan.p, list(plan.devices),
                 list(plan.guide), plan.tile_size)
    leaf = DEFAULT_PANEL_LEAF if panel_leaf is None else int(panel_leaf)
    if leaf < 0:
        raise ValueError(f"panel_leaf must be >= 0, got {panel_leaf!r}")
    R, Q = execute_plan(a, plan, want_q=(mode == "economic"), cupy_in=cupy_in,
                        panel_leaf=leaf)
    if mode == "r":
        return (R,)
    return Q, R[:kq]


def execute_plan(a, plan, want_q: bool, cupy_in: bool, panel_leaf: int = 0):
    """Run the tiled QR of validated ``a`` with ``plan``; return ``(R, Q)``."""
    layout = Layout(a.shape[0], a.shape[1], plan.tile_size, a.dtype)
    if cupy_in:  # work queued on the caller's stream must finish first
        cp = import_cupy()
        with cp.cuda.Device(a.device.id):
            cp.cuda.get_current_stream().synchronize()
    devices = [make_device(name, panel_leaf) for name in plan.devices]
    out_name = f"gpu:{a.device.id}" if cupy_in else "cpu"
    out = next((d for d in devices if d.name == out_name), None)
    own_out = out is None
    if own_out:
        out = make_device(out_name)
    try:
        return run_tiled_qr(a, devices, plan.owners, layout, want_q, out)
    finally:
        if own_out:
            out.close()


def _complex_fallback(a, mode, cupy_in):
    log_decision("qr_tiled: complex input is passed to %s",
                 "cupy.linalg.qr" if cupy_in else "scipy.linalg.qr")
    if cupy_in:
        cp = import_cupy()
        if mode == "r":
            r = cp.linalg.qr(a, mode="r")
            m, n = a.shape
            if m > n:
                r = cp.concatenate([r, cp.zeros((m - n, n), r.dtype)])
            return (r,)
        return cp.linalg.qr(a, mode="reduced")
    return scipy.linalg.qr(a, mode=mode, check_finite=False)
