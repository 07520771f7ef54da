"""Fronts mapped to the devices of one host (proportional mapping), and the stages that follow.

A multifrontal factorization parallelizes over independent subtrees of the
elimination tree: a front needs only its children's contribution blocks. The
mapping starts from the roots with every device, and splits the heaviest
subtree (its root goes to the *upper tree*, its children become candidates)
until the candidate subtrees can be shared among the devices with loads
within a tolerance of the mean; each subtree then belongs to one device, as
in proportional mapping (Pothen and Sun), where the subtrees' flops decide
how the devices are shared. The upper tree runs on one device (the *upper
device*) once the subtrees below it are done, so the time of a mapping is
modelled as the most loaded device's subtrees plus the whole upper tree:
each split moves its root's flops onto that serial part. The partition of
the candidates is the longest-first greedy one; of all the splits tried the
one of least modelled time is kept.

With a split model (``map_devices(split_model=...)``) the upper tree's
largest fronts are not serial: their dense path is split over every device
(:mod:`.dense_split`), so a front worth splitting weighs in the upper tree at
its split time, not its flops (``map_fronts``' ``upper_weights``); the
mapping then moves such fronts of a chain of separators into the upper tree
and shares their children's subtrees among the devices. Where that serializes
too much, the mapping on flops alone, with its own upper tree's splittable
fronts split, models shorter and is kept instead.

Memory is the second weight: with a byte budget per device, a mapping on
flops that overflows a device is redone on the sum of each front's share of
the flops and of the bytes (a device then holds about its share of both),
and if that still overflows one, the upper tree's fronts (which hold most of
the bytes of 3-D problems) are spread over the devices by bytes, largest
first; the first mapping that fits is taken, else the one whose fullest
device holds least.

The stages are the maximal runs of the postorder owned by one device: each
stage is a contiguous range, as the sparse scheduler's staging plan wants
(:func:`scipy_gpuqr._schedule.sparse.build_schedule` with ``plan=``), so the
per-stage machinery runs unchanged; each device takes its own in the order
of the fronts their blocks feed (:meth:`DevicePlan.device_stages`). A front
whose child lies in an earlier stage gets the child's contribution block
*carried*: on the same device a copy within it, across devices a transfer
(:attr:`DevicePlan.transfers`).

Everything here is pure NumPy on the analysis' arrays: the GPU driver
(:mod:`scipy_gpuqr._engine.gpu.multi_device`) and the NumPy executor of
several simulated devices (:mod:`scipy_gpuqr._engine.host.multi_device`)
run the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .._symbolic.counts import GpuMemoryModel
from .._symbolic.staging import StagePlan
from .dense import dense_path_seconds, dense_rule_mask
from .dense_split import SplitModel, split_seconds, split_weights
from .pattern_cache import PerPattern
from .tasks import TaskType

__all__ = ["DevicePlan", "map_devices", "map_fronts", "subtree_weights",
           "makespan", "DEFAULT_BALANCE_TOLERANCE", "MULTI_DEVICE_MIN_FLOPS",
           "MULTI_DEVICE_MIN_SPEEDUP", "devices_for", "run_speedup", "defer_carried_packs",
           "remembered_speeds", "remember_speeds", "SPEEDS_CHANGE", "SPEEDS_MEMORY", "MAPPING_SLOWER",
           "mapping_seconds", "remember_mapping_seconds", "measured_mapping_lost",
           "speeds_to_map_by", "modelled_seconds", "REMAP_GAIN", "REMAP_SECONDS",
           "front_seconds", "timed_makespan", "SUBTREE_RATE", "TIMED_MAPPING_GAIN",
           "TimeModel", "SPLIT_CALL_FACTOR", "timed_split_seconds", "run_seconds",
           "DEVICE_SECONDS", "device_counts", "stage_needs"]

#: Loads within this fraction of the mean end the splitting of subtrees.
DEFAULT_BALANCE_TOLERANCE = 0.05

#: Most subtree splits tried per device (the upper tree grows with each one).
MAX_SPLITS_PER_DEVICE = 64

#: Factorizations of at least this many flops use every visible GPU by default
#: (``GpuqrOptions(devices='auto')``); smaller ones run on one. Below about 1e11
#: flops a factorization takes tens of milliseconds on one GPU, where a second
#: device's setup and the transfers cost more than they save; a first value,
#: to be calibrated on the multi-GPU machines (``bench/multi_gpu.py``).
MULTI_DEVICE_MIN_FLOPS = 1e11


#: Least modelled speedup (:attr:`DevicePlan.modelled_speedup`) for which the
#: rule of devices='auto' uses several GPUs: a front tree whose work lies on one chain
#: (one dense front, a chain of large separators) gains nothing from them. The
#: measured gain is well below the model's (the upper tree's launches, the set-up of
#: every device, Q's data gathered to the first device): trees modelled near 1.1 ran
#: slower on several GPUs than on one, those from about 1.3 on ran faster
#: (``bench/multi_gpu.py``, bench/RESULTS.md).
MULTI_DEVICE_MIN_SPEEDUP = 1.3

#: Seconds each device used adds to a factorization over several GPUs beyond the
#: time model of its mapping (:func:`run_seconds`): its thread's start, streams and
#: events, its first split front's set-up, Q's data gathered from it. The rule of
#: devices='auto' (:func:`devices_for`) takes the device count of least modelled
#: seconds with this added, so a tree whose four-device mapping models only a little
#: shorter than its two-device one runs on two. Fitted to the calls' seconds over
#: their plans' modelled seconds on two and four H200: the four-GPU calls' excess
#: over the two-GPU calls', per device (bench/RESULTS.md, issue 21).
DEVICE_SECONDS = 0.03


def _plans_nbytes(value) -> int:
    """Bytes of a :data:`_PLANS` entry: a tuple of plans, what the mappings of every
    speed share (:class:`_SpeedFree`), or a tuple of speeds (counted as none)."""
    if isinstance(value, _SpeedFree):
        return value.nbytes
    return int(sum(p.owner.nbytes + p.upper.nbytes + p.stage_device.nbytes
                   for p in value if isinstance(p, DevicePlan)))


#: Mappings on flops by pattern and arguments (:func:`map_devices`' ``cache``):
#: a few hundred kilobytes each for trees of 10⁵ fronts; beside them, by pattern
#: and device set, the devices' speeds measured by the pattern's factorizations
#: (:func:`remember_speeds`), and by pattern and device count what the mappings of
#: every speed share (:func:`_speed_free`).
_PLANS = PerPattern(16, 64 << 20, _plans_nbytes)

#: The remembered speeds of a pattern's device set (those its mapping uses) are
#: replaced only where the measurements' average moves some device's speed by more
#: than this fraction from them: a new mapping means a new schedule and R layout for
#: the next call, which the noise between two calls of one mapping should not cost.
SPEEDS_CHANGE = 0.05

#: Most measurements the speeds' average weighs as one (:func:`remember_speeds`): the
#: n-th measurement moves it by 1/n of the way, up to 1/SPEEDS_MEMORY, so the
#: average settles where single calls scatter (each call's speeds moved by more than
#: :data:`SPEEDS_CHANGE` on four GPUs, a new mapping every call) and still follows
#: a lasting change.
SPEEDS_MEMORY = 8

#: Householder flops per second of one device on the launches of its subtrees
#: (the sparse path's fronts, while every device runs its own): the time model of
#: a mapping (:func:`front_seconds`) weighs such a front by its flops at this
#: rate, a dense front by its dense path's modelled seconds and a split front by
#: its split's, so that subtree work and the upper tree's large fronts compare in
#: seconds. Fitted to the busy seconds of subtree stages against their flops on
#: H200 (bench/RESULTS.md, issue 21); the proportional mapping's flops count a
#: flop of a small front as one of a large dense front, which runs several
#: times faster.
SUBTREE_RATE = 7.0e12

#: The mapping of the time model (:func:`map_devices`) replaces the proportional
#: mapping only where it models at least this fraction shorter
#: (:func:`timed_makespan`): the model is an estimate, and a new mapping of
#: about the same modelled time is no reason to leave the one measured so far.
TIMED_MAPPING_GAIN = 0.10

#: Host seconds of a split front's call on a host of several GPUs over the split model's
#: :attr:`~.dense_split.SplitModel.call_seconds`: the floor of a split front's seconds
#: in the time model of a mapping (:func:`timed_split_seconds`). One host thread
#: enqueues every device's share of the front, call by call
#: (:func:`~.dense_split.split_seconds` counts the calls), beside the other devices'
#: threads; the split model's figure was measured with one host thread and stays what
#: decides which fronts are split. Fitted to the median seconds per modelled call of
#: split fronts' enqueueing on four H200 (bench/RESULTS.md, issue 21).
SPLIT_CALL_FACTOR = 4.0 / 3.0


@dataclass(frozen=True)
class TimeModel:
    """What the time model of a mapping (:func:`map_devices`) prices beyond each
    front's modelled GPU seconds.

    Attributes
    ----------
    split_call_factor : float
        A split front's host seconds per call over the split model's
        (:data:`SPLIT_CALL_FACTOR`): its floor in the model
        (:func:`timed_split_seconds`); 1 takes the split model's own seconds.
    upper_lightest : bool
        The device of the upper tree takes the lightest subtree load of the time
        model's mapping (:func:`_timed_owner`): its host thread enqueues the
        split fronts, and a split front enqueued while the device's own
        subtrees still fill its launch queue stalls that thread at its next
        copy, while the other devices' threads have nothing left to enqueue.
        False: the longest-first sharing's first device, the heaviest load on
        a tie.
    upper_anywhere : bool
        A front above the time model's frontier that is not split runs on the
        device that ends it first (its children's device on a tie), and a
        front the split rule would split runs whole on another device where
        that ends it no later than its split (:func:`_timed_owner`). The
        large separators just below a split root then go to the devices that
        did their children instead of queueing on the upper device, so the
        frontier can move below them and every device gets subtrees. False
        (the default): every such front on the upper device, split where the
        rule splits it. Off by default: on four GPUs its plans, which move
        more and larger contribution blocks between devices (the model prices
        none), measured no faster than those without it.
    """

    split_call_factor: float = SPLIT_CALL_FACTOR
    upper_lightest: bool = True
    upper_anywhere: bool = False


def timed_split_seconds(fs, splits, split_model: SplitModel, time_model: TimeModel,
                        itemsize: int = 8) -> dict:
    """Each split front's seconds in the time model of a mapping.

    The split's modelled seconds (:attr:`~.dense_split.SplitPlan.seconds`), at
    least its calls at :attr:`TimeModel.split_call_factor` times the split
    model's :attr:`~.dense_split.SplitModel.call_seconds` each: the split
    model's host floor priced at what one call took on a host of several GPUs
    whose threads enqueue side by side.

    Parameters
    ----------
    fs : FrontStructure
    splits : dict
        Front -> :class:`~.dense_split.SplitPlan`.
    split_model : SplitModel
        The model the plans were made with.
    time_model : TimeModel
    itemsize : int

    Returns
    -------
    dict
        Front -> seconds.
    """
    out = {}
    host = float(time_model.split_call_factor) * float(split_model.call_seconds)
    model = replace(split_model, call_seconds=host)
    for f, sp in splits.items():
        s = float(sp.seconds)
        if host > split_model.call_seconds:
            stair = fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]]
            s = max(s, split_seconds(int(fs.fm[f]), int(fs.fn[f]), stair, sp.owners, model,
                                     itemsize))
        out[f] = s
    return out


#: The time model's mapping stops moving fronts into the upper tree after this many
#: steps per device without a shorter modelled time (:func:`map_devices`): each
#: step costs a pass over the frontier, and past the balance every further step
#: only lengthens the upper tree.
TIMED_PATIENCE = 4

#: A pattern's device set leaves the mapping by measured speeds for the mapping on
#: flops once a call by measured speeds took this fraction longer on the devices
#: than the last call mapped on flops (:func:`measured_mapping_lost`): the model
#: behind the measured mapping prices neither the contribution blocks a more
#: fragmented mapping moves nor the waits for them.
MAPPING_SLOWER = 0.05


def subtree_weights(parent: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Sum of ``w`` over each front's subtree (fronts in postorder: children first)."""
    s = np.asarray(w, dtype=np.float64).copy()
    par = np.asarray(parent, dtype=np.int64).tolist()
    for f, p in enumerate(par):
        if p >= 0:
            s[p] += s[f]
    return s


def _first_descendants(parent: np.ndarray) -> np.ndarray:
    """First front of each front's subtree (postorder: the subtree of f is ``fd[f] … f``)."""
    nf = len(parent)
    fd = np.arange(nf, dtype=np.int64)
    par = np.asarray(parent, dtype=np.int64).tolist()
    fdl = fd.tolist()
    for f in range(nf):
        p = par[f]
        if p >= 0 and fdl[f] < fdl[p]:
            fdl[p] = fdl[f]
    return np.asarray(fdl, dtype=np.int64)


def _split_groups(items, W, sizes):
    """Longest first: each subtree (heaviest first) to the device group of least
    load per device; returns each group's items and load."""
    loads = [0.0] * len(sizes)
    groups = [[] for _ in sizes]
    for r in sorted(items, key=lambda r: (-W[r], r)):
        g = min(range(len(sizes)), key=lambda g: ((loads[g] + W[r]) / sizes[g], g))
        loads[g] += W[r]
        groups[g].append(r)
    return groups, loads


def _map_set(items, devs, W, w, chp, ch, tolerance, limit, owner_of, upper, w_up=None,
             speed=None):
    """Map the subtrees ``items`` onto the device set ``devs`` (recursively).

    The set is halved; the subtrees are shared between the halves by weight
    in proportion to their devices' speeds (``speed[d]``, 1 each by default),
    splitting the heaviest (its root stays on ``devs[0]``, one upper front
    more) until both halves have work and the slower half's load per device
    is within the tolerance of the mean; of the states tried, the one of least
    modelled time (the slower half's load per device plus the fronts split
    here, each at its weight ``w_up`` in the upper tree) among those that
    feed both halves.
    """
    w_up = w if w_up is None else w_up
    if len(devs) == 1:
        for r in items:
            owner_of[r] = devs[0]
        return
    half = (len(devs) + 1) // 2
    sets = [devs[:half], devs[half:]]
    sizes = [float(sum(1.0 if speed is None else speed[d] for d in x)) for x in sets]
    items = list(items)
    up, up_w = [], 0.0
    best = None
    for _ in range(limit + 1):
        groups, loads = _split_groups(items, W, sizes)
        per = [loads[g] / sizes[g] for g in range(2)]
        # a state leaving a half idle is worse than any that feeds both
        span = (max(per) + up_w, 0 if min(loads) > 0 else 1)
        if best is None or (span[1], span[0]) < (best[0][1], best[0][0] * (1 - 1e-12)):
            best = (span, list(up), [list(g) for g in groups])
        mean = sum(loads) / sum(sizes)
        if min(loads) > 0 and max(per) <= (1.0 + tolerance) * mean:
            break
        split = [r for r in items if chp[r + 1] > chp[r]]
        if not split:
            break
        r = max(split, key=lambda r: (W[r], -r))
        items.remove(r)
        items.extend(ch[chp[r]:chp[r + 1]])
        up.append(r)
        up_w += w_up[r]
    _, up, groups = best
    for r in up:
        upper.append((r, devs[0]))
    for g in range(2):
        _map_set(groups[g], sets[g], W, w, chp, ch, tolerance, limit, owner_of, upper, w_up,
                 speed)


def map_fronts(parent, child_ptr, children, weights, ndev: int, *, upper_device: int = 0,
               tolerance: float = DEFAULT_BALANCE_TOLERANCE,
               max_splits: int | None = None,
               upper_weights=None, speeds=None) -> tuple[np.ndarray, np.ndarray]:
    """Owner of every front: subtrees shared among ``ndev`` devices by their weights.

    Proportional mapping on device sets: the roots start with every device;
    a set of more than one device is halved and its subtrees shared between
    the halves by weight (heaviest subtrees split first, their roots kept
    on the set's first device as *upper* fronts), until every subtree has one
    device.

    Parameters
    ----------
    parent, child_ptr, children : ndarray of int64
        The front tree in postorder (``FrontStructure``'s arrays).
    weights : ndarray of float (nfronts,)
        Each front's own weight (flops, or flops and bytes shares).
    ndev : int
        Number of devices (>= 1).
    upper_device : int
        The device of the roots (the first of the device order).
    tolerance : float
        A set's splitting stops once its slower half is within ``1 +
        tolerance`` of the mean load per device.
    max_splits : int, optional
        Most subtrees split per device set (default ``MAX_SPLITS_PER_DEVICE ·
        ndev``).
    upper_weights : ndarray of float (nfronts,), optional
        A front's weight once it is in the upper tree (default ``weights``):
        smaller for a front whose dense path is then split over the devices
        (:func:`~.dense_split.split_weights`).
    speeds : sequence of float (ndev,), optional
        Each device's relative speed on its subtrees (default: equal): a set's
        subtrees are shared between its halves in proportion to the sum of
        their devices' speeds, so a device measured slower gets less.

    Returns
    -------
    owner : ndarray of int64 (nfronts,)
        Device of each front.
    upper : ndarray of bool (nfronts,)
        Fronts of the upper tree (mapped while their set had several devices).
    """
    nf = len(parent)
    if ndev < 1:
        raise ValueError(f"ndev must be >= 1, got {ndev}")
    if not 0 <= upper_device < ndev:
        raise ValueError(f"upper_device {upper_device} is not one of {ndev} devices")
    owner = np.full(nf, upper_device, dtype=np.int64)
    upper = np.zeros(nf, dtype=bool)
    if ndev == 1 or nf == 0:
        return owner, upper
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    W = subtree_weights(parent, w).tolist()
    chp = np.asarray(child_ptr, dtype=np.int64).tolist()
    ch = np.asarray(children, dtype=np.int64).tolist()
    limit = MAX_SPLITS_PER_DEVICE * ndev if max_splits is None else int(max_splits)
    devs = [upper_device] + [d for d in range(ndev) if d != upper_device]
    roots = [int(r) for r in np.flatnonzero(np.asarray(parent) < 0)]
    owner_of, ups = {}, []
    wu = None if upper_weights is None else np.maximum(
        np.asarray(upper_weights, dtype=np.float64), 0.0).tolist()
    sp = None
    if speeds is not None:
        sp = [float(x) for x in speeds]
        if len(sp) != ndev or not all(x > 0 and np.isfinite(x) for x in sp):
            raise ValueError(f"speeds: {ndev} positive numbers, got {speeds}")
    _map_set(roots, devs, W, w.tolist(), chp, ch, tolerance, limit, owner_of, ups, wu, sp)
    fd = _first_descendants(parent)
    for r, d in owner_of.items():
        owner[fd[r]:r + 1] = d
    for r, d in ups:            # after the subtrees: an upper front's range covers them
        upper[r] = True
        owner[r] = d
    return owner, upper


@dataclass(frozen=True)
class DevicePlan:
    """Fronts of a factorization mapped to devices, and its stages.

    Attributes
    ----------
    ndevices : int
    owner : ndarray of int64 (nfronts,)
        Device of each front.
    upper : ndarray of bool (nfronts,)
        Fronts of the upper tree (on ``upper_device``).
    upper_device : int
    stages : tuple of (int, int)
        Maximal postorder runs of one owner, ``(first, last)`` inclusive.
    stage_device : ndarray of int64
        Device of each stage.
    transfers : tuple of (int, int, int, int, int)
        ``(child, parent, source device, target device, bytes)`` of every
        contribution block that crosses devices (child's stage ends before
        the parent's starts).
    device_flops : ndarray of float (ndevices,)
        Householder flops each device runs (the upper tree's included).
    subtree_flops : ndarray of float (ndevices,)
        Flops of each device's subtrees (the upper tree's excluded).
    device_bytes : ndarray of int64 (ndevices,)
        GPU bytes each device holds when all its stages stay on it: its
        fronts (with their S entries and task queues), the contribution
        blocks carried into them, the gather index of their entries of R,
        two R/H staging buffers of its largest front, and all the maps and
        VT tiles (every device holds them whole).
    weight : str
        What the mapping balanced: ``'flops'``, ``'flops+bytes'``, either
        with ``', upper tree by bytes'``, or ``'time'`` (the time model's
        mapping, :func:`map_devices`).
    makespan : float
        Modelled time in flops (:func:`makespan`).
    budget : int or None
        Byte budget per device the mapping was checked against.
    split : dict
        Front -> :class:`~.dense_split.SplitPlan`: the upper tree's fronts
        whose dense path is split over every device (mapped with
        ``split_model``; their modelled time in :attr:`makespan`).
    seconds : float
        Modelled seconds of the time model (:func:`timed_makespan`; 0 where
        :func:`map_devices` had no split model to time the mapping with).
    stage_order : str
        The order each device takes its stages in (:meth:`device_stages`):
        ``'need'`` (the default), the stages whose blocks the earliest fronts
        take first (:attr:`stage_need`), or ``'postorder'``.
    stage_need : ndarray of int64 or None
        Each stage's need (:func:`stage_needs`), what ``'need'`` orders by
        (None: postorder).
    """

    ndevices: int
    owner: np.ndarray
    upper: np.ndarray
    upper_device: int
    stages: tuple
    stage_device: np.ndarray
    transfers: tuple
    device_flops: np.ndarray
    subtree_flops: np.ndarray
    device_bytes: np.ndarray
    makespan: float = 0.0
    weight: str = "flops"
    budget: int | None = None
    split: dict = field(default_factory=dict)
    seconds: float = 0.0
    stage_order: str = "need"
    stage_need: np.ndarray | None = None

    @property
    def nstages(self) -> int:
        return len(self.stages)

    @property
    def fits(self) -> bool:
        """Every device within the budget (True without one)."""
        return self.budget is None or bool(np.all(self.device_bytes <= self.budget))

    @property
    def balance(self) -> float:
        """Most loaded device's subtree flops over the mean (1: perfect)."""
        tot = float(self.subtree_flops.sum())
        return float(self.subtree_flops.max()) * self.ndevices / tot if tot > 0 else 1.0

    @property
    def upper_flops(self) -> float:
        """Flops of the upper tree."""
        return float(self.device_flops.sum() - self.subtree_flops.sum())

    @property
    def modelled_speedup(self) -> float:
        """All flops over :attr:`makespan` (1 device: 1)."""
        return float(self.device_flops.sum()) / self.makespan if self.makespan > 0 else 1.0

    def device_fronts(self, d: int) -> np.ndarray:
        """Fronts of device ``d``, in postorder."""
        return np.flatnonzero(self.owner == d)

    def device_stages(self, d: int) -> list:
        """Stages of device ``d`` in the order its thread enqueues them
        (:attr:`stage_order`): by the fronts their blocks go to, or postorder.

        By need, a device whose stages feed fronts far apart in the upper tree
        (one subtree feeding the first split front, another the root) ends
        first the one the earlier front waits for, and runs the other beside
        the upper tree's first fronts; in postorder that front would wait for
        both.
        """
        mine = np.flatnonzero(self.stage_device == d)
        if self.stage_order == "need" and self.stage_need is not None:
            mine = mine[np.argsort(self.stage_need[mine], kind="stable")]
        return mine.tolist()

    def stage_plan(self, stage_bytes=None) -> StagePlan:
        """The stages as a :class:`~scipy_gpuqr._symbolic.staging.StagePlan`
        (for :func:`~scipy_gpuqr._schedule.sparse.build_schedule`)."""
        sb = tuple(int(b) for b in stage_bytes) if stage_bytes is not None \
            else (0,) * len(self.stages)
        return StagePlan(self.budget, tuple(self.stages), sb, ())

    def as_dict(self) -> dict:
        """JSON-ready summary (``info["devices"]``)."""
        per = []
        for d in range(self.ndevices):
            fr = self.device_fronts(d)
            per.append({"fronts": int(len(fr)), "stages": len(self.device_stages(d)),
                        "flops": float(self.device_flops[d]),
                        "subtree_flops": float(self.subtree_flops[d]),
                        "bytes": int(self.device_bytes[d]),
                        "upper_fronts": int(np.count_nonzero(self.upper & (self.owner == d)))})
        return {"ndevices": int(self.ndevices), "upper_device": int(self.upper_device),
                "stages": len(self.stages), "transfers": len(self.transfers),
                "transfer_bytes": int(sum(t[4] for t in self.transfers)),
                "balance": self.balance, "upper_flops": self.upper_flops,
                "modelled_speedup": self.modelled_speedup, "modelled_seconds": self.seconds,
                "weight": self.weight, "budget": self.budget,
                "fits": self.fits, "split_fronts": sorted(int(f) for f in self.split),
                "per_device": per}


def makespan(parent, flops, owner, speeds=None, unscaled=()) -> float:
    """Modelled time of a mapping, in flops: each device runs its fronts in
    postorder at one flop per unit (``speeds[d]`` flops per unit: relative
    speeds, mean 1), a front starting once its device is free and its
    children are done (transfers free). The fronts ``unscaled`` (split
    fronts, run over every device and weighed at their modelled split time)
    take their weight whatever their device's speed: the measured speeds
    (:func:`~scipy_gpuqr._engine.gpu.multi_device.measured_speeds`) leave
    those fronts' work and seconds out."""
    par = np.asarray(parent, dtype=np.int64).tolist()
    own = np.asarray(owner, dtype=np.int64)
    fl = np.asarray(flops, dtype=np.float64)
    if speeds is not None:
        sp = np.asarray(speeds, dtype=np.float64)
        keep = np.asarray(sorted(unscaled), dtype=np.int64)
        fixed = fl[keep]
        fl = fl / (sp / sp.mean())[own]
        fl[keep] = fixed
    fl, own = fl.tolist(), own.tolist()
    ready = [0.0] * len(par)            # when the children of each front are done
    free = [0.0] * (max(own, default=-1) + 1)
    end = 0.0
    # (comparisons, not max(): the loop runs at every mapping a call makes)
    for f, p in enumerate(par):
        d = own[f]
        t = free[d]
        r = ready[f]
        if r > t:
            t = r
        t += fl[f]
        free[d] = t
        if t > end:
            end = t
        if p >= 0 and t > ready[p]:
            ready[p] = t
    return end


def front_seconds(analysis) -> np.ndarray:
    """Each front's modelled seconds on one device, for the time model of a mapping.

    A dense front of the engines' rule (:func:`~.dense.dense_rule_mask`) takes
    its dense path's modelled seconds (:func:`~.dense.dense_path_seconds`), any
    other its flops at :data:`SUBTREE_RATE`: the large fronts run their
    GEMMs near the tensor cores' rate, the small ones' launches far below it.

    Parameters
    ----------
    analysis : SymbolicAnalysis

    Returns
    -------
    ndarray of float (nfronts,)
    """
    fs = analysis.fronts
    t = np.asarray(analysis.front_flops, dtype=np.float64) / SUBTREE_RATE
    for f in np.flatnonzero(dense_rule_mask(analysis)).tolist():
        t[f] = dense_path_seconds(int(fs.fm[f]), int(fs.fn[f]),
                                  fs.stair[fs.col_ptr[f]:fs.col_ptr[f + 1]])
    return t


def timed_makespan(parent, owner, seconds, split_seconds=None, speeds=None) -> float:
    """Modelled seconds of a mapping: each device runs its fronts in postorder,
    a front once its device is free and its children are done, and a *split*
    front (``split_seconds``: front -> its split's seconds) once its children
    are done and every device is free, holding every device.

    Why the split fronts hold every device: their other devices' column blocks
    queue behind those devices' own launches, so the main device's panel chain
    waits for the slowest device's subtrees, however early the front's children
    are done. :func:`makespan` lets a split front start beside the other
    devices' subtrees and so prices an unbalanced mapping as a balanced one.

    Parameters
    ----------
    parent : ndarray of int
    owner : ndarray of int
        Device of each front.
    seconds : ndarray of float
        Each front's seconds on one device (:func:`front_seconds`).
    split_seconds : dict, optional
        Front -> modelled seconds split over every device.
    speeds : sequence of float, optional
        Relative speeds of the devices (mean 1) on their fronts; split fronts
        keep their seconds.

    Returns
    -------
    float
    """
    par = np.asarray(parent, dtype=np.int64).tolist()
    own = np.asarray(owner, dtype=np.int64)
    t = np.asarray(seconds, dtype=np.float64)
    if speeds is not None:
        sp = np.asarray(speeds, dtype=np.float64)
        t = t / (sp / sp.mean())[own]
    t, own = t.tolist(), own.tolist()
    split = dict(split_seconds or {})
    ndev = max(own, default=0) + 1
    free = [0.0] * ndev
    ready = [0.0] * len(par)
    for f, p in enumerate(par):
        if f in split:
            e = max(ready[f], max(free)) + float(split[f])
            free = [e] * ndev
        else:
            d = own[f]
            e = free[d]
            r = ready[f]
            if r > e:
                e = r
            e += t[f]
            free[d] = e
        if p >= 0 and e > ready[p]:
            ready[p] = e
    return max(free, default=0.0)


def _timed_owner(parent, child_ptr, children, seconds, ndev, upper_device, split_seconds,
                 speeds=None, max_steps=None, upper_lightest=True, upper_anywhere=False):
    """The mapping of the time model: (owner, upper, modelled seconds).

    A frontier of subtrees starts at the roots; at each step its subtrees are
    shared among all the devices longest first (by modelled seconds, each to
    the device that ends it first at its speed), the fronts above the frontier
    form the upper tree on ``upper_device`` (those in ``split_seconds`` split
    over every device), and the step's mapping is modelled
    (:func:`timed_makespan`); then the frontier's heaviest subtree gives way
    to its children. Of the steps the mapping of least modelled seconds is
    kept (the search ends :data:`TIMED_PATIENCE` steps per device after the
    last shorter one, or after ``max_steps``). Unlike the halving of :func:`map_fronts`, every device set shares
    one frontier, so a front just below the upper tree's split fronts can
    stay whole on one device where the halving would have split it.

    With ``upper_lightest`` the upper device swaps its share of the frontier
    for the lightest one of a device of its speed (:attr:`TimeModel.upper_lightest`)
    wherever that models no longer (its upper fronts that are not split start
    once its own subtrees and their children are done): where the two tie, the
    device that enqueues the split fronts is the one free first.

    With ``upper_anywhere`` (:attr:`TimeModel.upper_anywhere`) the fronts above
    the frontier are placed in postorder as the walk meets them: one not in
    ``split_seconds`` on the device that ends it first (ties: the device of its
    heaviest child, then the upper device), one in it split, unless it ends no
    later whole on a device other than the upper device (the engines split a
    splittable front of the upper device's upper tree). Such fronts placed off
    the upper device leave the upper tree: they are their device's own fronts.
    """
    nf = len(parent)
    par = np.asarray(parent, dtype=np.int64)
    chp = np.asarray(child_ptr, dtype=np.int64).tolist()
    ch = np.asarray(children, dtype=np.int64).tolist()
    sub = subtree_weights(par, seconds).tolist()
    fd = _first_descendants(par)
    sp = [1.0] * ndev if speeds is None else [float(x) / float(np.mean(speeds)) for x in speeds]
    split = dict(split_seconds or {})
    steps = MAX_SPLITS_PER_DEVICE * ndev if max_steps is None else int(max_steps)
    items = [int(r) for r in np.flatnonzero(par < 0)]
    up = []
    best, since = None, 0
    parl = par.tolist()
    own_s = np.asarray(seconds, dtype=np.float64).tolist()

    def walk(dev, force=None):
        # timed_makespan on the tree cut at the frontier: a subtree runs whole on its
        # device, with nothing outside it to wait for; also where each front above
        # the frontier runs (-1: split). force: front -> True (split) or False (whole)
        free = [0.0] * ndev
        ready = {}
        place = {}
        heavy = {}                      # front -> (its heaviest child's seconds, device)
        for f in sorted(dev.keys() | set(up)):
            rf = ready.get(f, 0.0)
            if f in dev:
                d = dev[f]
                e = free[d] + sub[f] / sp[d]
                free[d] = e
            elif not upper_anywhere:
                if f in split:
                    e = max(rf, max(free)) + float(split[f])
                    free = [e] * ndev
                    d = -1
                else:
                    d = upper_device
                    e = max(free[d], rf) + own_s[f] / sp[d]
                    free[d] = e
            else:
                kid = heavy.get(f, (0.0, upper_device))[1]
                devs = [d for d in range(ndev) if f not in split or d != upper_device]
                d, e = min(((d, max(free[d], rf) + own_s[f] / sp[d]) for d in devs),
                           key=lambda de: (de[1], de[0] != kid, de[0] != upper_device,
                                           de[0]), default=(-1, np.inf))
                if f in split:
                    es = max(rf, max(free)) + float(split[f])
                    if (force or {}).get(f, es < e) or d < 0:
                        d, e = -1, es
                if d < 0:
                    free = [e] * ndev
                else:
                    free[d] = e
            if f not in dev:
                place[f] = d
            p = parl[f]
            if p >= 0:
                if e > ready.get(p, 0.0):
                    ready[p] = e
                if sub[f] > heavy.get(p, (-1.0, 0))[0]:
                    heavy[p] = (sub[f], upper_device if d < 0 else d)
        return max(free), place

    for _ in range(steps + 1):
        dev = {}
        loads = [0.0] * ndev
        for r in sorted(items, key=lambda r: (-sub[r], r)):
            d = min(range(ndev), key=lambda d: (loads[d] + sub[r] / sp[d], d))
            loads[d] += sub[r] / sp[d]
            dev[r] = d
        t, place = walk(dev)
        force = {}
        if upper_anywhere:
            # a split front holds every device, so the walk's choice (the earlier end)
            # can delay the fronts after it: each splittable front's other choice
            # tried, kept where the whole walk models shorter
            for f in sorted(set(up) & split.keys()):
                tf, pf = walk(dev, {**force, f: place[f] >= 0})
                if tf < t * (1 - 1e-12):
                    force[f] = place[f] >= 0
                    t, place = tf, pf
        if upper_lightest:
            low = min((d for d in range(ndev) if sp[d] == sp[upper_device]),
                      key=lambda d: (loads[d], d != upper_device, d))
            if low != upper_device:
                swap = {upper_device: low, low: upper_device}
                moved = {r: swap.get(d, d) for r, d in dev.items()}
                tm, pm = walk(moved, force)
                if tm <= t * (1 + 1e-12):
                    dev, t, place = moved, tm, pm
        if best is None or t < best[0] * (1 - 1e-12):
            best, since = (t, dict(dev), dict(place)), 0
        since += 1
        cand = [r for r in items if chp[r + 1] > chp[r]]
        if not cand or since > TIMED_PATIENCE * ndev:
            break
        r = max(cand, key=lambda r: (sub[r], -r))
        items.remove(r)
        items.extend(ch[chp[r]:chp[r + 1]])
        up.append(r)
    t, dev, place = best
    owner = np.full(nf, upper_device, dtype=np.int64)
    for r, d in dev.items():
        owner[fd[r]:r + 1] = d
    upper = np.zeros(nf, dtype=bool)
    for f, d in place.items():
        if d >= 0 and d != upper_device:
            owner[f] = d
        else:
            upper[f] = True
    return owner, upper, t


def stage_needs(stages, parent) -> np.ndarray:
    """Each stage's *need*: the first front after it (in postorder) that one of its
    fronts is a child of, where its first outgoing block goes; the number of
    fronts where none goes out (the root's stage).

    A device taking its stages by need, then in postorder
    (:meth:`DevicePlan.device_stages`), ends first those the earliest fronts
    wait for. A stage whose blocks go to another stage of the same device
    still comes before it: it feeds a front of that stage, which lies before
    that stage's own need. Nor can two devices wait for each other: a stage
    waits only for stages of smaller need.

    Parameters
    ----------
    stages : sequence of (int, int)
        Postorder runs ``(first, last)``, inclusive.
    parent : array_like of int

    Returns
    -------
    ndarray of int64 (nstages,)
    """
    par = np.asarray(parent, dtype=np.int64)
    out = np.full(len(stages), len(par), dtype=np.int64)
    for s, (a, b) in enumerate(stages):
        p = par[a:b + 1]
        p = p[p > b]
        if len(p):
            out[s] = int(p.min())
    return out


def _runs(owner: np.ndarray) -> list:
    """Maximal runs of equal owner: ``[(first, last), ...]``."""
    nf = len(owner)
    if nf == 0:
        return []
    cut = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [nf])) - 1
    return list(zip(starts.tolist(), ends.tolist()))


def _plan_of(fs, owner, upper, upper_device, ndev, flops, gpu, itemsize, weight, budget,
             splits=None, w_up=None, speeds=None):
    stages = _runs(owner)
    # split fronts: those of the upper tree on its device
    split = {f: sp for f, sp in (splits or {}).items()
             if upper[f] and int(owner[f]) == int(upper_device)}
    stage_device = np.array([int(owner[a]) for a, _ in stages], dtype=np.int64)
    stage_of = np.zeros(fs.nfronts, dtype=np.int64)
    for s, (a, b) in enumerate(stages):
        stage_of[a:b + 1] = s
    par = np.asarray(fs.parent, dtype=np.int64)
    kids = np.flatnonzero(par >= 0)
    cb_bytes = (fs.cm.astype(np.int64) * (fs.fn - fs.fp).astype(np.int64)) * itemsize
    cross = kids[owner[kids] != owner[par[kids]]]
    transfers = tuple((int(c), int(par[c]), int(owner[c]), int(owner[par[c]]),
                       int(cb_bytes[c])) for c in cross if cb_bytes[c] > 0)
    dflops = np.bincount(owner, weights=flops, minlength=ndev).astype(np.float64)
    sflops = np.bincount(owner[~upper], weights=flops[~upper], minlength=ndev).astype(np.float64)
    carried = kids[stage_of[kids] < stage_of[par[kids]]]
    # every device holds all the maps and the whole VT pool (the records index them
    # globally): a front's own share of both moves to every device
    model = GpuMemoryModel()
    shared = (-(-fs.fm // model.tile) * (model.tile + 1) * model.tile * itemsize
              + ((fs.fn - fs.fp) + fs.cm) * model.map_bytes).astype(np.float64)
    dbytes = np.bincount(owner, weights=gpu["additive"] - shared,
                         minlength=ndev).astype(np.float64)
    dbytes += float(shared.sum())
    dbytes += np.bincount(owner[par[carried]], weights=gpu["cb"][carried], minlength=ndev)
    # R's values leave each stage through a gather index (one int64 per entry)
    dbytes += 8 * np.bincount(owner, weights=gpu["nnz_R"], minlength=ndev)
    stg = np.zeros(ndev)
    np.maximum.at(stg, owner, gpu["staging"].astype(np.float64))
    # a split front's blocks on the other devices while it runs (the largest)
    others = [d for d in range(ndev) if d != int(upper_device)]
    eff = flops
    if split:
        eff = np.asarray(flops, dtype=np.float64).copy()
        for f, sp in split.items():
            eff[f] = w_up[f]
            cols = np.minimum(sp.nb, int(fs.fn[f]) - sp.nb * np.arange(len(sp.owners)))
            for i, d in enumerate(others, start=1):
                held = float(cols[sp.owners == i].sum()) * int(fs.fm[f]) * itemsize
                stg[d] = max(stg[d], held / 2)
    dbytes = (dbytes + 2 * stg).astype(np.int64)
    return DevicePlan(ndevices=ndev, owner=owner, upper=upper, upper_device=upper_device,
                      stages=tuple(stages), stage_device=stage_device, transfers=transfers,
                      device_flops=dflops, subtree_flops=sflops, device_bytes=dbytes,
                      makespan=makespan(fs.parent, eff, owner, speeds, split), weight=weight,
                      budget=budget,
                      split=split, stage_need=stage_needs(stages, fs.parent))


def map_devices(analysis, ndevices: int, *, device_memory: int | None = None,
                upper_device: int = 0,
                tolerance: float = DEFAULT_BALANCE_TOLERANCE,
                split_model: SplitModel | None = None, speeds=None,
                cache: bool = True, time_model: TimeModel | None = None) -> DevicePlan:
    """The :class:`DevicePlan` of an analysis on ``ndevices`` devices.

    Parameters
    ----------
    analysis : SymbolicAnalysis
        Its fronts, per-front flops (``front_flops``) and GPU bytes
        (``front_gpu_additive``, ``front_gpu_cb``, ``front_gpu_staging``).
    ndevices : int
    device_memory : int, optional
        Bytes each device may hold. A mapping on flops that overflows one is
        redone on flops and bytes together; :attr:`DevicePlan.fits` says
        whether the result fits.
    upper_device : int
        Device of the upper tree (the one the solves gather to).
    tolerance : float
        Balance tolerance of the splitting (:func:`map_fronts`).
    split_model : SplitModel, optional
        Dense fronts of the upper tree split over every device
        (:mod:`.dense_split`): the fronts where the model gains are weighed
        in the upper tree at their split time (``map_fronts``'s
        ``upper_weights``), and those that end in it are the plan's
        :attr:`DevicePlan.split`; the mapping on flops alone with its upper
        tree's such fronts split is kept instead where its modelled speedup
        is larger. With a split model the mappings are also timed
        (:func:`timed_makespan`, :attr:`DevicePlan.seconds`), and the time
        model's own mapping (:func:`_timed_owner`: one frontier of subtrees
        shared among all the devices by modelled seconds, the split fronts
        holding every device) replaces the kept one where it fits and models
        :data:`TIMED_MAPPING_GAIN` shorter (factorizations of at least
        :data:`MULTI_DEVICE_MIN_FLOPS`). None: no front is split.
    speeds : sequence of float (ndevices,), optional
        Measured relative speeds of the devices on their subtrees
        (:func:`map_fronts`; e.g. from an earlier factorization of the
        pattern, :func:`~scipy_gpuqr._engine.gpu.multi_device.measured_speeds`):
        the subtrees are shared by them instead of equally.
    cache : bool
        Reuse the mappings on flops made before for an analysis of the same
        pattern and the same arguments (:data:`_PLANS`; the budget only
        decides which of them is taken): the split model's mapping walks the
        whole tree, which a repeated call of a known pattern should not pay.
        Mappings by new ``speeds`` reuse what every speed shares
        (:func:`_speed_free`: the split fronts' weights and the time model's
        mapping).
    time_model : TimeModel, optional
        What the time model prices beyond the fronts' GPU seconds (default
        :class:`TimeModel`: split fronts at least their host calls, the upper
        tree's device with the lightest subtree load).
    """
    time_model = TimeModel() if time_model is None else time_model
    fs = analysis.fronts
    flops = np.asarray(analysis.front_flops, dtype=np.float64)
    gpu = {"additive": np.asarray(analysis.front_gpu_additive, dtype=np.int64),
           "cb": np.asarray(analysis.front_gpu_cb, dtype=np.int64),
           "staging": np.asarray(analysis.front_gpu_staging, dtype=np.int64),
           "nnz_R": np.asarray(analysis.front_nnz_R, dtype=np.float64)}
    itemsize = int(getattr(analysis, "itemsize", 8))
    budget = None if device_memory is None else int(device_memory)
    args = (fs.parent, fs.child_ptr, fs.children)
    key = ("flops", int(ndevices), int(upper_device), float(tolerance), split_model,
           None if speeds is None else tuple(float(x) for x in speeds), itemsize, time_model)
    mapped = _PLANS.get(analysis, key) if cache else None
    if mapped is None:
        mapped = []
        free = None
        if split_model is not None and ndevices > 1:
            free = _speed_free(analysis, ndevices, upper_device, split_model, itemsize,
                               time_model, cache)
        w_up, splits = (None, None) if free is None else (free.w_up, free.splits)
        owner, upper = map_fronts(*args, flops, ndevices, upper_device=upper_device,
                                  tolerance=tolerance, upper_weights=w_up, speeds=speeds)
        mapped.append(_plan_of(fs, owner, upper, upper_device, ndevices, flops, gpu,
                               itemsize, "flops", None, splits, w_up, speeds))
        if splits:
            # the mapping on flops alone, its upper tree's splittable fronts split: the
            # weighted mapping may move so much into the upper tree that it loses
            owner, upper = map_fronts(*args, flops, ndevices, upper_device=upper_device,
                                      tolerance=tolerance, speeds=speeds)
            mapped.append(_plan_of(fs, owner, upper, upper_device, ndevices, flops, gpu,
                                   itemsize, "flops", None, splits, w_up, speeds))
        if free is not None:
            # every mapping timed, and the time model's own mapping (the last of the
            # tuple). It shares modelled seconds, which tell a device's large fronts
            # from its small ones, what measured speeds make up for on flops: it takes
            # no speeds
            t, split_s = free.seconds, free.split_seconds

            def timed(p):
                return replace(p, seconds=timed_makespan(
                    fs.parent, p.owner, t, {f: split_s[f] for f in p.split}))
            mapped = [timed(p) for p in mapped]
            if free.timed is not None:
                owner, upper, secs = free.timed
                mapped.append(replace(_plan_of(fs, owner.copy(), upper.copy(), upper_device,
                                               ndevices, flops, gpu, itemsize, "time", None,
                                               splits, w_up, speeds), seconds=secs))
        mapped = tuple(mapped)
        if cache:
            _PLANS.put(analysis, key, mapped)
    plans = [replace(p, budget=budget) for p in mapped]
    flat = plans.pop() if plans[-1].weight == "time" else None
    plan, *others = plans
    for other in others:
        if (other.fits, other.modelled_speedup) > (plan.fits, plan.modelled_speedup):
            plan = other
    # the time model's mapping where it fits and models clearly shorter
    if (flat is not None and flat.fits
            and flat.seconds < (1.0 - TIMED_MAPPING_GAIN) * plan.seconds):
        plan = flat
    if plan.fits or ndevices == 1:
        return plan
    tf, tb = max(float(flops.sum()), 1.0), max(float(gpu["additive"].sum()), 1.0)
    both = flops / tf + gpu["additive"] / tb
    owner, upper = map_fronts(*args, both, ndevices, upper_device=upper_device,
                              tolerance=tolerance, speeds=speeds)
    tried = [plan, _plan_of(fs, owner, upper, upper_device, ndevices, flops, gpu, itemsize,
                            "flops+bytes", budget, speeds=speeds)]
    for p in list(tried):
        if not p.fits:          # the upper tree's fronts spread by bytes
            own = _spread_upper(p, gpu["additive"])
            tried.append(_plan_of(fs, own, p.upper, upper_device, ndevices, flops, gpu,
                                  itemsize, p.weight + ", upper tree by bytes", budget,
                                  speeds=speeds))
    for p in tried:
        if p.fits:
            return p
    return min(tried, key=lambda p: int(p.device_bytes.max()))


@dataclass(frozen=True)
class _SpeedFree:
    """What :func:`map_devices`' mappings of one analysis, device count and split
    model share whatever the devices' speeds (:func:`_speed_free`).

    Attributes
    ----------
    w_up : ndarray of float or None
        The fronts' weights in the upper tree (:func:`~.dense_split.split_weights`;
        None where no front is worth splitting).
    splits : dict or None
        Front -> :class:`~.dense_split.SplitPlan` of those fronts (None: none).
    seconds : ndarray of float
        Each front's seconds on one device (:func:`front_seconds`).
    split_seconds : dict
        Front -> its split's seconds in the time model (:func:`timed_split_seconds`).
    timed : tuple or None
        The time model's own mapping (:func:`_timed_owner`: owner, upper, modelled
        seconds); None below :data:`MULTI_DEVICE_MIN_FLOPS`.
    """

    w_up: np.ndarray | None
    splits: dict | None
    seconds: np.ndarray
    split_seconds: dict
    timed: tuple | None

    @property
    def nbytes(self) -> int:
        arrays = [self.w_up, self.seconds] + list(self.timed[:2] if self.timed else [])
        return int(sum(a.nbytes for a in arrays if a is not None))


def _speed_free(analysis, ndevices: int, upper_device: int, split_model: SplitModel,
                itemsize: int, time_model: TimeModel, cache: bool = True) -> _SpeedFree:
    """The part of :func:`map_devices`' mappings (with a split model, several devices)
    that no speed changes, made once per pattern and arguments (``cache``).

    Why: a call by measured speeds (:func:`remembered_speeds`) maps again each
    time the remembered speeds move, before its devices' threads start; the
    split fronts' weights (:func:`~.dense_split.split_weights`, a split plan per
    large front) and the time model's mapping, which takes no speeds, are most
    of a mapping's host time.
    """
    def make():
        fs = analysis.fronts
        flops = np.asarray(analysis.front_flops, dtype=np.float64)
        w_up, splits = split_weights(fs, flops, ndevices, split_model, itemsize=itemsize)
        if not splits:
            w_up = splits = None
        t = front_seconds(analysis)
        split_s = timed_split_seconds(fs, splits or {}, split_model, time_model, itemsize)
        timed = None
        if float(flops.sum()) >= MULTI_DEVICE_MIN_FLOPS:
            # (below, the launches' latency, which the model does not count, rules)
            timed = _timed_owner(fs.parent, fs.child_ptr, fs.children, t, ndevices,
                                 upper_device, split_s,
                                 upper_lightest=time_model.upper_lightest,
                                 upper_anywhere=time_model.upper_anywhere)
        return _SpeedFree(w_up, splits, t, split_s, timed)
    if not cache:
        return make()
    key = ("speed-free", int(ndevices), int(upper_device), split_model, int(itemsize),
           time_model)
    return _PLANS.get_or_make(analysis, key, make)


def remembered_speeds(analysis, devices) -> tuple | None:
    """The relative speeds of a device set measured on the analysis' pattern.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    devices : hashable
        What names the device set (e.g. each device's id and name, the
        dtype's size): speeds measured on other devices do not apply.

    Returns
    -------
    tuple of float or None
        One speed per device, mean 1, as :func:`remember_speeds` kept them
        (None: no factorization of the pattern on this set measured any).
    """
    kept = _PLANS.get(analysis, ("speeds", devices))
    return None if kept is None else kept[0]


def remember_speeds(analysis, devices, measured) -> tuple:
    """Keep the speeds a factorization of the pattern measured on a device set.

    The measurements are averaged (geometric, normalized to mean 1), the n-th
    weighing 1/n, at least 1/:data:`SPEEDS_MEMORY`: a device's speed depends
    somewhat on the share of the tree the mapping gave it and varies from call
    to call, so single measurements would move the mapping at every call; the
    average settles. The speeds a later call maps by are the average where it
    moved some device's speed by more than :data:`SPEEDS_CHANGE` from them (the
    first measurement as it is), else those kept before.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    devices : hashable
        The device set (:func:`remembered_speeds`).
    measured : sequence of float
        One positive speed per device (e.g.
        :func:`~scipy_gpuqr._engine.gpu.multi_device.measured_speeds`).

    Returns
    -------
    tuple of float
        The speeds kept now (those a later call of the pattern maps by).
    """
    new = np.asarray(measured, dtype=np.float64)
    if new.ndim != 1 or len(new) < 1 or not np.all(np.isfinite(new) & (new > 0)):
        raise ValueError(f"speeds: positive numbers, got {measured}")
    new = new / new.mean()
    # kept with the speeds: (those a call maps by, the measurements' average, their count)
    entry = _PLANS.get(analysis, ("speeds", devices))
    old = n = None
    if entry is not None and len(entry[0]) == len(new):
        old, avg, n = np.asarray(entry[0]), np.asarray(entry[1]), int(entry[2]) + 1
        w = 1.0 / min(n, SPEEDS_MEMORY)
        new = np.exp((1.0 - w) * np.log(avg) + w * np.log(new))
        new = new / new.mean()
    avg = tuple(float(x) for x in new)
    kept = avg
    if old is not None and float(np.max(np.abs(new / old - 1.0))) <= SPEEDS_CHANGE:
        kept = tuple(float(x) for x in old)
    _PLANS.put(analysis, ("speeds", devices), (kept, avg, n or 1))
    return kept


def mapping_seconds(analysis, devices) -> dict:
    """The devices' seconds of the last factorization of the pattern on a device set
    by each mapping (``'flops'``, ``'measured speeds'``; :func:`remember_mapping_seconds`),
    an empty dict where none was kept."""
    got = _PLANS.get(analysis, ("mapping seconds", devices))
    return dict(got) if got else {}


def remember_mapping_seconds(analysis, devices, by: str, seconds: float) -> None:
    """Keep the devices' seconds of a factorization of the pattern on a device set
    mapped by ``by`` (replacing the last one of that mapping).

    Parameters
    ----------
    analysis : SymbolicAnalysis
    devices : hashable
        The device set (:func:`remembered_speeds`).
    by : str
        What the call mapped by (``info["devices"]["mapping"]["by"]``).
    seconds : float
        From the first device thread's start to the last one's end (its R values
        scattered): the devices' part of the call, without what building a new
        mapping's schedule and layout cost before it.
    """
    kept = mapping_seconds(analysis, devices)
    kept[str(by)] = float(seconds)
    _PLANS.put(analysis, ("mapping seconds", devices), tuple(sorted(kept.items())))


def measured_mapping_lost(analysis, devices) -> bool:
    """Whether the last factorization of the pattern on the device set mapped by
    measured speeds took :data:`MAPPING_SLOWER` longer than the last one mapped on
    flops: later calls then map on flops (a slower mapping costs one call, not
    every call). The speeds are still measured and kept, for :func:`devices_for`'s
    and the caller's information."""
    t = mapping_seconds(analysis, devices)
    return ("flops" in t and "measured speeds" in t
            and t["measured speeds"] > (1.0 + MAPPING_SLOWER) * t["flops"])


#: A pattern's calls by measured speeds (:func:`speeds_to_map_by`) leave the plan
#: they run for one mapped by new speeds only where the time model, given the new
#: speeds, models the new plan at least this fraction shorter than the current one
#: given the same speeds: the noise between calls of one plan moves the measured
#: speeds by a few percent, and a different plan's first call pays its schedule,
#: R's stage maps and pinned needs before the devices start.
REMAP_GAIN = 0.05

#: And at least these modelled seconds shorter (:func:`speeds_to_map_by`): a gain
#: below what a new plan's first call pays on the host before its devices start is
#: no gain for a pattern called a few times.
REMAP_SECONDS = 0.02


def modelled_seconds(analysis, plan: DevicePlan, speeds=None, *,
                     split_model: SplitModel | None = None,
                     time_model: TimeModel | None = None) -> float:
    """A plan's modelled seconds on devices of the given relative speeds.

    With a split model (several devices), the time model
    (:func:`timed_makespan`: each front's :func:`front_seconds`, the plan's
    split fronts at their split seconds holding every device); without one,
    the plan's :func:`makespan` on the fronts' flops at :data:`SUBTREE_RATE`.
    Two plans of one analysis compare by it under one set of speeds, whatever
    speeds each was made with (:func:`speeds_to_map_by`).

    Parameters
    ----------
    analysis : SymbolicAnalysis
    plan : DevicePlan
        Of ``analysis`` (:func:`map_devices`).
    speeds : sequence of float, optional
        One relative speed per device (None: equal).
    split_model : SplitModel, optional
        The model the plan was mapped with (:func:`map_devices`' ``split_model``).
    time_model : TimeModel, optional
        Likewise (default :class:`TimeModel`).

    Returns
    -------
    float
    """
    fs = analysis.fronts
    if split_model is None or plan.ndevices < 2:
        flops = np.asarray(analysis.front_flops, dtype=np.float64)
        return makespan(fs.parent, flops, plan.owner, speeds, plan.split) / SUBTREE_RATE
    time_model = TimeModel() if time_model is None else time_model
    free = _speed_free(analysis, plan.ndevices, plan.upper_device, split_model,
                       int(getattr(analysis, "itemsize", 8)), time_model)
    return timed_makespan(fs.parent, plan.owner, free.seconds,
                          {f: free.split_seconds[f] for f in plan.split}, speeds)


def _same_mapping(a: DevicePlan, b: DevicePlan) -> bool:
    """Whether two plans of one analysis put every front on the same device, in the
    same upper tree, with the same fronts split (then the same stages and schedule)."""
    return (np.array_equal(a.owner, b.owner) and np.array_equal(a.upper, b.upper)
            and sorted(a.split) == sorted(b.split))


def speeds_to_map_by(analysis, devices, ndevices: int, *, device_memory: int | None = None,
                     split_model: SplitModel | None = None,
                     time_model: TimeModel | None = None) -> tuple:
    """The speeds a call by measured speeds maps by, and why.

    A pattern's first call on a device set maps on flops; the speeds the
    calls measure are remembered (:func:`remember_speeds`). The plan a call
    runs stays the one made with the speeds of the current plan (None: on
    flops) until the remembered speeds are new and the time model, given the
    new speeds (:func:`modelled_seconds`), models the plan mapped by them at
    least :data:`REMAP_GAIN` and :data:`REMAP_SECONDS` shorter than the current
    plan; a new plan whose mapping is the current one's (:func:`_same_mapping`)
    is taken as it costs nothing. Why: a new plan's first call builds its
    schedule and R's stage maps before the devices start, and the speeds move
    by noise from call to call; a plan the model does not predict faster is
    not worth that. Each new set of remembered speeds is weighed once (its
    mappings are kept, :func:`map_devices`' ``cache``). Where the pattern's
    last call by measured speeds ran longer than its last one on flops
    (:func:`measured_mapping_lost`) the call maps on flops, which becomes the
    current plan.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    devices : hashable
        The device set (:func:`remembered_speeds`).
    ndevices : int
    device_memory, split_model, time_model
        As the call's :func:`map_devices`.

    Returns
    -------
    speeds : tuple of float or None
        What to map by (None: on flops).
    decision : dict or None
        Where new speeds were weighed: ``current`` (the speeds the current
        plan was made with, None: flops), ``candidate`` (the new speeds),
        ``modelled_seconds`` (both plans given the candidate speeds: current,
        new), ``same_plan``, ``remapped`` (whether the call maps by the
        candidate speeds), as weighed by this call or by the earlier call that
        weighed the same remembered speeds and kept its plan;
        ``{"remapped": False, "why": "measured mapping lost"}`` where the call
        went back to flops; None where nothing was weighed (no speeds remembered,
        or the current plan made with the remembered ones).
    """
    key = ("mapped speeds", devices)
    kept = remembered_speeds(analysis, devices)
    entry = _PLANS.get(analysis, key)           # (current, weighed and left, decision)
    current = None if entry is None or len(entry[0] or ()) not in (0, ndevices) \
        else entry[0]
    if kept is None or len(kept) != ndevices:
        return None, None
    if measured_mapping_lost(analysis, devices):
        _PLANS.put(analysis, key, (None, None, None))
        return None, {"remapped": False, "why": "measured mapping lost"}
    if current is not None and tuple(current) == tuple(kept):
        return tuple(current), None
    if entry is not None and entry[1] is not None and tuple(entry[1]) == tuple(kept):
        return current, entry[2]
    args = dict(device_memory=device_memory, split_model=split_model, time_model=time_model)
    old = map_devices(analysis, ndevices, speeds=current, **args)
    new = map_devices(analysis, ndevices, speeds=kept, **args)
    same = _same_mapping(old, new)
    t_old = modelled_seconds(analysis, old, kept, split_model=split_model,
                             time_model=time_model)
    t_new = modelled_seconds(analysis, new, kept, split_model=split_model,
                             time_model=time_model)
    remap = bool(same or (t_new <= (1.0 - REMAP_GAIN) * t_old
                          and t_old - t_new >= REMAP_SECONDS))
    decision = {"current": None if current is None else [float(x) for x in current],
                "candidate": [float(x) for x in kept],
                "modelled_seconds": [float(t_old), float(t_new)],
                "same_plan": bool(same), "remapped": remap}
    if remap:
        _PLANS.put(analysis, key, (tuple(kept), None, decision))
        return tuple(kept), decision
    _PLANS.put(analysis, key, (current, tuple(kept), decision))
    return current, decision


def _spread_upper(plan: DevicePlan, additive: np.ndarray) -> np.ndarray:
    """Owners with the upper tree's fronts moved, largest first, each to the device
    holding the fewest bytes (the upper tree runs one front after the other
    anyway; its fronts hold most of the bytes of 3-D problems)."""
    owner = plan.owner.copy()
    up = np.flatnonzero(plan.upper)
    held = np.bincount(owner[~plan.upper], weights=additive[~plan.upper],
                       minlength=plan.ndevices).astype(np.float64)
    for f in up[np.argsort(-additive[up], kind="stable")].tolist():
        d = int(np.argmin(held))
        owner[f] = d
        held[d] += float(additive[f])
    return owner


def device_counts(visible: int) -> list:
    """The device counts the rule of devices='auto' compares: ``visible`` and its
    halvings down to 2 (1, 2, 4, 8 GPUs are the configurations measured)."""
    out, k = [], int(visible)
    while k >= 2:
        out.append(k)
        k //= 2
    return out


def devices_for(requested, visible: int, flops: float, gpu_bytes: int,
                device_memory: int | None, speedup=None, seconds=None) -> tuple[list, str]:
    """The devices a factorization runs on, and why.

    Parameters
    ----------
    requested : None, 'auto', int or sequence of int
        ``GpuqrOptions.devices``: None, one GPU; ``'auto'`` picks (below); an int, the first that
        many visible devices; a sequence, those device ids (repeats allowed:
        several simulated devices on one GPU).
    visible : int
        GPUs visible to the process.
    flops, gpu_bytes : float, int
        The analysis' flops and one-stage GPU bytes.
    device_memory : int or None
        Bytes one device may hold.
    speedup : callable, optional
        ``speedup(k)``: the modelled speedup of ``k`` devices as the
        factorization will map and run them (:func:`run_speedup`), consulted
        by the 'auto' rule.
    seconds : callable, optional
        ``seconds(k)``: ``(modelled seconds, fits)`` of the factorization over
        ``k`` devices (:func:`run_seconds`), by which the 'auto' rule chooses
        how many of the GPUs to use.

    Returns
    -------
    devices : list of int
    why : str

    Notes
    -----
    The rule of ``'auto'``: every visible GPU when the factorization does not fit
    one GPU's memory but does fit the sum, or when it has at least
    :data:`MULTI_DEVICE_MIN_FLOPS` flops and its front tree promises a
    modelled speedup (``speedup``: with the upper tree's dense fronts split,
    as the factorization runs) of at least :data:`MULTI_DEVICE_MIN_SPEEDUP`;
    otherwise one GPU. Of the counts :func:`device_counts` whose mapping fits,
    ``seconds`` then picks the one of least modelled seconds (the fewest devices on
    a tie): the first that many GPUs.
    """
    if requested is None:
        return [0], "one GPU (GpuqrOptions.devices is None)"
    if requested != "auto":
        if isinstance(requested, (int, np.integer)):
            k = int(requested)
            if k < 1:
                raise ValueError(f"devices must be >= 1, got {k}")
            if k > max(visible, 0):
                raise ValueError(f"devices={k} but {visible} GPU(s) visible")
            return list(range(k)), f"{k} device(s) requested"
        ids = [int(d) for d in requested]
        if not ids:
            raise ValueError("devices: an empty sequence")
        bad = [d for d in ids if not 0 <= d < max(visible, 0)]
        if bad:
            raise ValueError(f"devices {bad} are not visible ({visible} GPU(s))")
        return ids, f"devices {ids} requested"
    if visible <= 1:
        return [0], "one GPU visible"
    if device_memory is not None and gpu_bytes > device_memory:
        if gpu_bytes <= device_memory * visible:
            return list(range(visible)), (f"needs {gpu_bytes} GPU bytes, more than one "
                                          f"GPU's {device_memory}: {visible} GPUs")
        return [0], "does not fit all GPUs together either: one GPU, staged"
    if flops < MULTI_DEVICE_MIN_FLOPS:
        return [0], f"{flops:.3g} flops < {MULTI_DEVICE_MIN_FLOPS:.3g}: one GPU"
    gain = None if speedup is None else float(speedup(visible))
    if gain is not None and gain < MULTI_DEVICE_MIN_SPEEDUP:
        return [0], (f"the front tree gives {visible} GPUs a modelled speedup of {gain:.2f} "
                     f"only (dense fronts split by the rule): one GPU")
    k, why = visible, ""
    if seconds is not None:
        timed = {c: seconds(c) for c in device_counts(visible)}
        fit = sorted((float(t), c) for c, (t, ok) in timed.items() if ok)
        if fit:
            k = fit[0][1]
            why = ", modelled " + ", ".join(f"{t:.3f} s on {c}" for t, c in sorted(
                (float(t), c) for c, (t, _) in timed.items()))
    return list(range(k)), (f"{flops:.3g} flops >= {MULTI_DEVICE_MIN_FLOPS:.3g}"
                            + ("" if gain is None else
                               f", modelled speedup {gain:.2f} (dense fronts split "
                               f"by the rule)")
                            + why + f": {k} GPUs")


def run_speedup(analysis, ndevices: int, *, device_memory: int | None = None,
                split_model: SplitModel | None = None) -> float:
    """The modelled speedup of the mapping a factorization over ``ndevices`` GPUs runs first.

    :func:`~scipy_gpuqr._engine.gpu.multi_device.multi_gpu_factorize` splits
    the upper tree's large dense fronts over the devices by default
    (``split_dense=None``, on distinct GPUs) and maps with the split model, so
    the speedup that decides whether several GPUs pay off is that mapping's
    (:func:`map_devices` with ``split_model``), not the one of a mapping whose
    upper tree runs on one device: judged without the split, a tree whose work
    lies in a few large separators (ch7-8-b3) models near 1.1 on two devices
    and is kept on one GPU, though the call on two models 1.5. The mapping is
    the one the call's first factorization of the pattern makes (on flops; a
    later call maps by measured speeds) and is cached, so the call reuses it.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    ndevices : int
    device_memory : int, optional
        Bytes each device may hold (:func:`map_devices`).
    split_model : SplitModel, optional
        The split rule's model (default :class:`~.dense_split.SplitModel`,
        that of ``multi_gpu_factorize``).

    Returns
    -------
    float
        :attr:`DevicePlan.modelled_speedup` of that mapping (1 for one device).
    """
    model = SplitModel() if split_model is None else split_model
    return map_devices(analysis, int(ndevices), device_memory=device_memory,
                       split_model=model).modelled_speedup


def run_seconds(analysis, ndevices: int, *, device_memory: int | None = None,
                split_model: SplitModel | None = None) -> tuple:
    """The modelled seconds of a factorization over ``ndevices`` GPUs, and whether
    its mapping fits.

    The time model's seconds of the mapping the call makes first (that of
    :func:`run_speedup`, cached; :attr:`DevicePlan.seconds`, or the same model's
    makespan of a mapping made to fit the memory, which is not timed there) plus
    :data:`DEVICE_SECONDS` per device: what the rule of devices='auto'
    (:func:`devices_for`) compares between device counts.

    Parameters
    ----------
    analysis : SymbolicAnalysis
    ndevices : int
        At least 2.
    device_memory : int, optional
        Bytes each device may hold (:func:`map_devices`).
    split_model : SplitModel, optional
        As for :func:`run_speedup`.

    Returns
    -------
    seconds : float
    fits : bool
    """
    model = SplitModel() if split_model is None else split_model
    plan = map_devices(analysis, int(ndevices), device_memory=device_memory,
                       split_model=model)
    seconds = float(plan.seconds)
    if not seconds > 0:
        # a mapping made to fit the memory (weighted by bytes), which map_devices
        # does not time: its makespan in the same model (such mappings split nothing)
        seconds = (timed_makespan(analysis.fronts.parent, plan.owner, front_seconds(analysis))
                   if not plan.split else float("inf"))
    return seconds + DEVICE_SECONDS * int(ndevices), bool(plan.fits)


def defer_carried_packs(st, parent) -> tuple:
    """A stage whose carried contribution blocks are packed as late as their parents allow.

    The sparse scheduler packs every carried block into its parent in the
    stage's first launch (one device stages through the host: the blocks are
    there before the stage starts). Across devices a block arrives when its
    device has factorized the child's subtree; a stage that packs it in
    launch 0 cannot start its own subtrees before. Here each carried child's
    Pack-Assemble records move to the last launch before its parent is read:
    the launch before the first record of the parent that is not its
    S-Assemble (its factorization, or its own Pack-Assemble into a parent of
    the stage), at most the launch after which a dense parent is factorized,
    at most the stage's last launch. Pack-Assemble writes the child's rows of
    the parent, which no other record of those launches touches, so the
    stage computes the same values.

    Parameters
    ----------
    st : StageSchedule
        A stage of :func:`~scipy_gpuqr._schedule.sparse.build_schedule`
        (its records are materialized).
    parent : ndarray of int
        Parent of every front (-1: a root).

    Returns
    -------
    (StageSchedule, dict)
        The stage with the records moved (``st`` itself when nothing moves)
        and ``child -> launch`` before which each carried block must be in
        the stage's pool.
    """
    if not st.carried:
        return st, {}
    nl = st.nlaunch
    kids = np.fromiter(st.carried.keys(), dtype=np.int64, count=len(st.carried))
    if nl == 0:
        return st, {int(c): 0 for c in kids}
    t = st.tasks
    lp = np.asarray(st.launch_ptr, dtype=np.int64)
    par = np.asarray(parent, dtype=np.int64)[kids]
    front = t["front"]
    # the first launch reading each parent: any record of it but its S-Assemble
    read = {}
    for p in np.unique(par).tolist():
        idx = np.flatnonzero(front == p)
        idx = idx[t["type"][idx] != TaskType.S_ASSEMBLE]
        first = nl
        if len(idx):
            first = int(np.searchsorted(lp, idx[0], side="right")) - 1
        if p in st.dense:               # factorized right after its assembly launch
            first = min(first, int(st.dense[p]) + 1)
        read[p] = max(first - 1, 0)
    at = {int(c): read[int(p)] for c, p in zip(kids.tolist(), par.tolist())}
    # only launch 0 holds carried packs (any elsewhere would stay where they are)
    head = t[lp[0]:lp[1]]
    move = (head["type"] == TaskType.PACK_ASSEMBLE) & np.isin(head["front"], kids)
    if not move.any():
        return st, at
    moved = head[move]
    dest = np.asarray([at[int(c)] for c in moved["front"].tolist()], dtype=np.int64)
    order = np.argsort(dest, kind="stable")
    moved, dest = moved[order], dest[order]
    counts = np.bincount(dest, minlength=nl)
    cuts = np.concatenate(([0], np.cumsum(counts)))
    # the new records, filled piece by piece through a plain view (a copy at memory speed)
    words = t.dtype.itemsize // 8
    src = t.view(np.int64).reshape(-1, words)
    mv = moved.view(np.int64).reshape(-1, words)
    out = np.empty_like(src)
    keep = head[~move].view(np.int64).reshape(-1, words)
    out[:len(keep)] = keep
    w = len(keep)
    done = int(lp[1])                   # records of the original stage placed so far
    for L in np.flatnonzero(counts).tolist():   # each target launch: its records, then the moved
        n = int(lp[L + 1]) - done
        out[w:w + n] = src[done:lp[L + 1]]
        w, done = w + n, int(lp[L + 1])
        m = int(counts[L])
        out[w:w + m] = mv[cuts[L]:cuts[L + 1]]
        w += m
    out[w:] = src[done:]
    tasks = out.view(t.dtype).ravel()
    sizes = np.diff(lp).copy()
    sizes[0] -= int(move.sum())
    sizes += counts
    new_lp = np.concatenate(([0], np.cumsum(sizes))).astype(lp.dtype)
    return replace(st, launch_ptr=new_lp, _tasks=tasks, _maker=None), at
