"""The device model of the tiled QR: main device, number of devices, guide array.

This is Kim and Park's model for a tiled QR on a CPU with GPUs (their
section IV) written as pure functions over measured per-tile times:

* :func:`select_main` -- Algorithm 2: among the devices that finish the
  triangulation (T) of a tile column before the others finish its update for
  elimination (UE), and its elimination (E) before the others finish the update
  for triangulation (UT), take the one with the *lowest* update speed (the fast
  updaters are worth more doing updates).
* :func:`t_op`, :func:`t_comm`, :func:`select_count` -- Algorithm 3 with
  equations (10) and (11): devices ordered by update speed with the main device
  first; ``p`` minimises ``T(p) = T_op(p) + T_comm(p) + T_sync(p)`` for the
  first iteration (M row tiles, N column tiles); ``T_sync`` (:func:`t_sync`,
  ours) is the calibrated cost of each extra device's per-step
  synchronisation.
* :func:`integer_ratio`, :func:`guide_array`, :func:`column_owners` --
  Algorithm 4 and equation (12): the cyclic distribution guide array built from
  the integer ratio of tiles updated per unit time; column 0 goes to the main
  device, column ``j >= 1`` to ``guide[j % len(guide)]``. The main device's
  tiles per unit time are counted in the time its T and E leave free
  (:func:`update_shares`, from equation 10), a refinement of the paper's
  GET_RATIO: with equal GPUs the main one gets fewer columns.

Nothing here measures or touches a device; :mod:`._calibrate` measures the
:class:`DeviceProfile` values and caches them.
"""

from __future__ import annotations

import dataclasses
import math
from functools import reduce
from typing import Mapping, Sequence

__all__ = ["DeviceProfile", "Plan", "select_main", "order_devices",
           "integer_ratio", "guide_array", "column_owners", "update_tiles",
           "update_shares",
           "t_op", "t_comm", "t_sync", "predict", "select_count", "make_plan"]


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Measured speed of one device for tiles of one size and dtype.

    Parameters
    ----------
    name : str
        Device name as :func:`scipy_gpuqr.qr_tiled` spells it
        (``'cpu'``, ``'gpu:0'``, ...).
    t_T, t_E, t_UT, t_UE : float
        Average seconds for one tile of triangulation (GEQRT), elimination
        (TSQRT), update for triangulation (UNMQR/GEMQRT) and update for
        elimination (TSMQR/TPMQRT).
    description : str
        Free text for the device table (model name, core count).
    t_sync_step, t_sync_fixed : float
        Seconds this device adds to a run it joins as a non-main device:
        per step (cross-device events, transfers issued, its share of the
        manager's work; an empty cross-device step) and once per run
        (setting it up). 0 when not measured.
    """

    name: str
    t_T: float
    t_E: float
    t_UT: float
    t_UE: float
    description: str = ""
    t_sync_step: float = 0.0
    t_sync_fixed: float = 0.0

    @property
    def update_time(self) -> float:
        """Seconds per tile of UT + UE."""
        return self.t_UT + self.t_UE

    @property
    def update_speed(self) -> float:
        """Tiles updated (UT + UE) per second."""
        return 1.0 / self.update_time if self.update_time > 0 else math.inf

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> "DeviceProfile":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the model decided for one matrix.

    Attributes
    ----------
    main : str
        The main device (Algorithm 2).
    devices : tuple of str
        The ``p`` participating devices, main first (Algorithm 3).
    guide : tuple of int
        Distribution guide array over ``devices`` (Algorithm 4).
    owners : tuple of int
        Owner (index into ``devices``) of every column tile (equation 12).
    predicted : tuple of float
        ``T(p)`` for ``p = 1 .. len(candidates)`` (seconds, first iteration).
    candidates : tuple of str
        All devices in Algorithm 3's order (main first, then by update speed).
    tile_size : int
    """

    main: str
    devices: tuple
    guide: tuple
    owners: tuple
    predicted: tuple
    candidates: tuple
    tile_size: int

    @property
    def p(self) -> int:
        return len(self.devices)


def _others_update_times(profiles: Sequence[DeviceProfile], i: int,
                         n_update_tiles: float) -> tuple[float, float]:
    """Time the devices other than ``i`` need for their UT and UE work.

    The ``n_update_tiles`` tiles of one step are shared among the other devices
    in proportion to their update speed; the result is the (UT, UE) part of
    the time they all need in parallel.
    """
    others = [q for j, q in enumerate(profiles) if j != i]
    if not others:
        return math.inf, math.inf
    speed = sum(q.update_speed for q in others)
    t_all = n_update_tiles / speed
    # split t_all into its UT and UE parts with the speed-weighted fractions
    frac_ut = sum(q.update_speed * q.t_UT for q in others) / speed
    frac_ue = sum(q.update_speed * q.t_UE for q in others) / speed
    return t_all * frac_ut, t_all * frac_ue


def select_main(profiles: Sequence[DeviceProfile], m_tiles: int,
                n_tiles: int) -> int:
    """Algorithm 2: index of the main computing device.

    Parameters
    ----------
    profiles : sequence of DeviceProfile
    m_tiles, n_tiles : int
        Row and column tiles of the (remaining) matrix; one step triangulates
        and eliminates ``m_tiles`` tiles and updates ``m_tiles * (n_tiles - 1)``.

    Returns
    -------
    int
        The candidate with the lowest update speed (ties: lowest index). A
        device is a candidate when ``M * t_T`` is at most the others' UE time
        and ``M * t_E`` at most their UT time. When no device qualifies (a
        single device, or every device too slow at T/E) the device with the
        smallest ``t_T + t_E`` is chosen.
    """
    if not profiles:
        raise ValueError("no devices to choose a main device from")
    if len(profiles) == 1:
        return 0
    n_upd = m_tiles * max(n_tiles - 1, 0)
    candidates = []
    for i, q in enumerate(profiles):
        ut, ue = _others_update_times(profiles, i, n_upd)
        if m_tiles * q.t_T <= ue and m_tiles * q.t_E <= ut:
            candidates.append(i)
    if not candidates:
        return min(range(len(profiles)),
                   key=lambda i: (profiles[i].t_T + profiles[i].t_E, i))
    return min(candidates, key=lambda i: (profiles[i].update_speed, i))


def order_devices(profiles: Sequence[DeviceProfile], main: int) -> list[int]:
    """Algorithm 3, lines 1-7: by update speed (fastest first), main first."""
    rest = sorted((i for i in range(len(profiles)) if i != main),
                  key=lambda i: (-profiles[i].update_speed, i))
    return [main] + rest


def integer_ratio(speeds: Sequence[float], max_sum: int = 64,
                  rel_tol: float = 0.05) -> list[int]:
    """Algorithm 4's GET_RATIO: small integers proportional to ``speeds``.

    Exact integer speeds are reduced by their gcd (8, 12, 4 -> 2, 3, 1).
    Otherwise the smallest scale whose rounding is within ``rel_tol`` of every
    speed is used, keeping the sum at most ``max_sum``; every device keeps a
    ratio of at least 1 (it was chosen to take part).
    """
    if not speeds:
        return []
    if any(not (s > 0) or not math.isfinite(s) for s in speeds):
        raise ValueError(f"speeds must be positive and finite, got {speeds}")
    if all(float(s).is_integer() for s in speeds):
        ints = [int(s) for s in speeds]
        g = reduce(math.gcd, ints)
        ints = [v // g for v in ints]
        if sum(ints) <= max_sum:
            return ints
    smin = min(speeds)
    rel = [s / smin for s in speeds]
    best = None
    for q in range(1, max_sum + 1):
        ints = [max(1, round(q * r)) for r in rel]
        if sum(ints) > max_sum:
            break
        best = ints
        if all(abs(v - q * r) <= rel_tol * q * r for v, r in zip(ints, rel)):
            break
    if best is None:  # even q = 1 is too long: scale down, keep >= 1
        scale = max_sum / sum(rel)
        best = [max(1, int(r * scale)) for r in rel]
    g = reduce(math.gcd, best)
    return [v // g for v in best]


def guide_array(ratio: Sequence[int]) -> list[int]:
    """Algorithm 4's GENERATE_ARRAY: e.g. ``2:3:1 -> [1, 0, 1, 0, 1, 2]``.

    Repeatedly take the device with the largest remaining ratio (the lowest
    index among equals), append it and decrement its ratio.
    """
    left = [int(r) for r in ratio]
    if any(r < 0 for r in left):
        raise ValueError(f"ratios must be non-negative, got {list(ratio)}")
    out = []
    for _ in range(sum(left)):
        i = max(range(len(left)), key=lambda j: (left[j], -j))
        out.append(i)
        left[i] -= 1
    return out


def column_owners(n_tiles: int, guide: Sequence[int], main: int = 0) -> list[int]:
    """Equation (12): column 0 to ``main``, column ``j`` to ``guide[j % L]``."""
    if n_tiles <= 0:
        return []
    if not guide:
        raise ValueError("empty guide array")
    return [main] + [guide[j % len(guide)] for j in range(1, n_tiles)]


def update_tiles(owners: Sequence[int], m_tiles: int, device: int) -> int:
    """``#tile(i)`` of the first iteration: update tiles of columns 1.. owned."""
    return m_tiles * sum(1 for o in owners[1:] if o == device)


def t_op(profiles: Sequence[DeviceProfile], owners: Sequence[int],
         m_tiles: int, main: int = 0) -> float:
    """Equation (10): the slowest device's first-iteration operation time."""
    times = []
    for i, q in enumerate(profiles):
        work = update_tiles(owners, m_tiles, i) * q.update_time
        if i == main:
            work += m_tiles * (q.t_T + q.t_E)
        times.append(work)
    return max(times) if times else 0.0


def t_comm(names: Sequence[str], owners: Sequence[int], m_tiles: int,
           tile_size: int, itemsize: int,
           bandwidth: Mapping[tuple, float], main: int = 0) -> float:
    """Equation (11): first-iteration transfer time.

    ``3 M T^2`` elements of Householder data go from the main device to every
    other participating device, and the next column ``(M-1) T^2`` comes from
    its owner ``j`` to the main device. ``bandwidth[(src, dst)]`` is in bytes
    per second; a transfer to the same device costs nothing.
    """
    tile_bytes = tile_size * tile_size * itemsize

    def cost(nbytes, src, dst):
        if src == dst:
            return 0.0
        bw = bandwidth.get((names[src], names[dst]))
        if not bw or bw <= 0:
            raise KeyError(f"no transfer speed measured from {names[src]} to "
                           f"{names[dst]}")
        return nbytes / bw

    total = sum(cost(3 * m_tiles * tile_bytes, main, i)
                for i in range(len(names)))
    if len(owners) > 1:
        total += cost(max(m_tiles - 1, 0) * tile_bytes, owners[1], main)
    return total


def update_shares(profiles: Sequence[DeviceProfile], m_tiles: int,
                  n_tiles: int) -> list[float]:
    """Update tiles per step for each device (main first) so all finish together.

    GET_RATIO of Algorithm 4 counts the tiles each device updates in a unit
    time. The main device also spends ``M (t_T + t_E)`` of every step on T and
    E (equation 10), so its share is what it updates in the time left:
    with ``U = M (N - 1)`` update tiles and ``u_i`` seconds per tile,
    ``t = (U + M (t_T + t_E) / u_0) / sum(1 / u_i)``, ``x_0 = (t - M (t_T +
    t_E)) / u_0`` (at least 0) and ``x_i = t / u_i``.
    """
    u = [q.update_time for q in profiles]
    n_upd = m_tiles * max(n_tiles - 1, 1)
    te = m_tiles * (profiles[0].t_T + profiles[0].t_E)
    t = (n_upd + te / u[0]) / sum(1.0 / x for x in u)
    x0 = (t - te) / u[0]
    if x0 <= 0 and len(u) > 1:
        t = n_upd / sum(1.0 / x for x in u[1:])
        return [0.0] + [t / x for x in u[1:]]
    return [max(x0, 0.0)] + [t / x for x in u[1:]]


def _distribution(profiles, n_tiles, m_tiles=1):
    shares = update_shares(profiles, m_tiles, n_tiles)
    if len(shares) > 1 and shares[0] < 1e-3 * max(shares):
        # the main device is busy with T and E: it keeps column 0 only
        ratio = [0] + integer_ratio(shares[1:])
    else:
        ratio = integer_ratio(shares)
    guide = guide_array(ratio)
    return guide, column_owners(n_tiles, guide, 0)


def t_sync(profiles: Sequence[DeviceProfile], m_tiles: int,
           n_tiles: int) -> float:
    """Per-step synchronisation cost of the devices after the main one.

    Not in the paper's equations: every device besides the main one adds
    ``t_sync_step`` to each step (the step's cross-device dependencies cost
    this much even with no work) and ``t_sync_fixed`` once per run, shared
    here over the ``min(M, N)`` steps so the sum stays a per-step time like
    ``T_op`` and ``T_comm``. Without this term the model takes a second
    device for small matrices where it only adds synchronisation.
    """
    steps = max(1, min(m_tiles, n_tiles))
    return sum(q.t_sync_step + q.t_sync_fixed / steps for q in profiles[1:])


def predict(profiles: Sequence[DeviceProfile], bandwidth: Mapping[tuple, float],
            m_tiles: int, n_tiles: int, tile_size: int, itemsize: int) -> float:
    """``T(p) = T_op + T_comm + T_sync`` for the devices given (main first)."""
    guide, owners = _distribution(profiles, n_tiles, m_tiles)
    names = [q.name for q in profiles]
    return (t_op(profiles, owners, m_tiles)
            + t_comm(names, owners, m_tiles, tile_size, itemsize, bandwidth)
            + t_sync(profiles, m_tiles, n_tiles))


def select_count(profiles: Sequence[DeviceProfile], bandwidth, m_tiles: int,
                 n_tiles: int, tile_size: int, itemsize: int):
    """Algorithm 3: ``p`` minimising ``T(p)``; profiles are already ordered.

    Returns
    -------
    p : int
    predicted : list of float
        ``T(1) .. T(len(profiles))``.
    """
    predicted = [predict(profiles[:p], bandwidth, m_tiles, n_tiles,
                         tile_size, itemsize)
                 for p in range(1, len(profiles) + 1)]
    p_min = min(range(len(predicted)), key=lambda i: (predicted[i], i)) + 1
    return p_min, predicted


def make_plan(profiles: Sequence[DeviceProfile], bandwidth, m: int, n: int,
              tile_size: int, itemsize: int, choose_count: bool = True) -> Plan:
    """Algorithms 2, 3 and 4 for an ``m x n`` matrix.

    Parameters
    ----------
    profiles : sequence of DeviceProfile
        Every available device.
    bandwidth : mapping
        ``(src_name, dst_name) -> bytes/s``.
    m, n : int
        Matrix shape.
    tile_size : int
    itemsize : int
    choose_count : bool
        False keeps every device (the caller named them): only the main device
        and the distribution come from the model.
    """
    if not profiles:
        raise ValueError("no devices")
    m_tiles = max(1, -(-m // tile_size))
    n_tiles = max(1, -(-n // tile_size))
    main = select_main(profiles, m_tiles, n_tiles)
    order = order_devices(profiles, main)
    ordered = [profiles[i] for i in order]
    p, predicted = select_count(ordered, bandwidth, m_tiles, n_tiles,
                                tile_size, itemsize)
    if not choose_count:
        p = len(ordered)
    chosen = ordered[:p]
    guide, owners = _distribution(chosen, n_tiles, m_tiles)
    return Plan(main=ordered[0].name,
                devices=tuple(q.name for q in chosen),
                guide=tuple(guide), owners=tuple(owners),
                predicted=tuple(predicted),
                candidates=tuple(q.name for q in ordered),
                tile_size=int(tile_size))
