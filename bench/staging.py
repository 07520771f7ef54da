"""Staging under a real memory limit: the GPU engine with CuPy's pool limited.

Run on the GPU machine::

    source .dev/remote-setup.sh
    python3 bench/staging.py --json $OUT/staging.json [--only grid40,ch7-8-b3] [--fracs 2,4,8]
    python3 bench/staging.py --predict      # the plans only, on any machine

Per matrix: the one-stage need (this engine's count of every allocation,
:mod:`scipy_gpuqr._engine.memory`) and the smallest plan's; then the public
call ``QRFactorization(A, backend='gpu')`` + ``solve(b)`` (wall time, the
device synchronized) without a limit and with the pool limited to 1/2, 1/4,
1/8 of the one-stage need: one warm-up (kernels, the plan's schedule) then
the median of ``--repeat`` runs; what ran (``info['backend']``), stages,
planned peak, the fronts run on the host (dense fronts that alone exceed the
limit: ``info['host_fronts']``) and their seconds, the pool's bytes in use
after ``free`` (leak check), the
backward error of the least-squares answer; and the CPU path
(``backend='cpu'``: SuiteSparseQR, OpenBLAS on all cores) once. A limit
whose plan is infeasible answers on the CPU: it runs once (no repeats).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed


def _matrices(only):
    from scipy_gpuqr._testing_matrices import chessboard_boundary, grid3d_least_squares
    gens = {"grid40": lambda: grid3d_least_squares(40),
            "ch7-8-b3": lambda: chessboard_boundary(7, 8, 3),
            "grid24": lambda: grid3d_least_squares(24)}
    for name in (only or ["grid40", "ch7-8-b3"]):
        yield name, gens[name]()


def _one_stage(A):
    from scipy_gpuqr._engine.memory import (front_needs, min_budget, plan_for_memory,
                                            vt_elements)
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS, dense_front_mask
    from scipy_gpuqr._schedule.tasks import (DEFAULT_APPLY_GRANULE, DEFAULT_BUNDLE,
                                             DEFAULT_TILE)
    from scipy_gpuqr._symbolic import analyze
    an = analyze(A)
    dense = dense_front_mask(an, DEFAULT_DENSE_FLOPS)
    vt = vt_elements(an, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE, pipelining=True,
                     granule=DEFAULT_APPLY_GRANULE, dense=dense)
    needs = front_needs(an, 8, tile=DEFAULT_TILE, vt_elems=vt, dense=dense)
    return an, plan_for_memory(an, needs, None).peak, min_budget(an, needs)


def _predict(an, limit):
    """What the engine will do under a pool limit of ``limit`` bytes (no GPU needed):
    the plan after the built schedule's checks, as ``gpu_factorize`` makes it (the
    time model's dense fronts, or by size where the model leaves a front that fits
    no stage: such a front may then run as a host front)."""
    from scipy_gpuqr._engine.gpu import driver
    from scipy_gpuqr._engine.memory import POOL_USABLE, plan_for_memory
    from scipy_gpuqr._schedule.dense import DEFAULT_DENSE_FLOPS
    from scipy_gpuqr._schedule.sparse import build_schedule
    from scipy_gpuqr._schedule.tasks import DEFAULT_BUNDLE, DEFAULT_TILE

    def needs_for(flops, extra=()):
        return driver.stage_needs(an, flops, extra, tile=DEFAULT_TILE, bundle=DEFAULT_BUNDLE,
                                  pipelining=True, itemsize=8, panel=DENSE_PANEL)

    avail = int(POOL_USABLE * limit)
    needs = needs_for(DEFAULT_DENSE_FLOPS)
    flops, extra, needs, _ = driver.staged_dense_plan(          # as gpu_factorize does
        an, needs_for, DEFAULT_DENSE_FLOPS, needs, plan_for_memory(an, needs, avail), avail,
        None, panel=DENSE_PANEL, itemsize=8)
    for _ in range(driver.MAX_RESTAGE + 1):
        mp = plan_for_memory(an, needs, avail)
        if not mp.feasible:
            return {"backend": "cpu", "why": f"front {mp.oversized[0]} does not fit"}
        sched = build_schedule(an, plan=mp.plan, dense_flops=flops, lazy=True,
                               dense_extra=extra or None)
        try:
            keep, cache = driver._memory_checks(an, sched, mp, needs, 8)
        except driver._PlanOver as exc:
            avail -= exc.excess
            continue
        fs = an.fronts
        return {"backend": "gpu", "stages": mp.plan.nstages, "planned_peak": mp.peak,
                "launches": [int(st.nlaunch) for st in sched.stages],
                "last_pool_on_device": keep, "dense_copies_kept": cache,
                "dense_flops": flops, "dense_extra": len(extra),
                "host_fronts": [f"{int(fs.fm[f])}x{int(fs.fn[f])}" for f in mp.host]}
    return {"backend": "cpu", "why": "no plan passed the checks"}


#: The dense fronts' panel width of the CUDA layer (``CupyDevice.dense_panel``),
#: which their workspace in the memory plan depends on.
DENSE_PANEL = 256


class _Lines(logging.Handler):
    """The package's log lines of one call (out-of-memory steps, fallbacks), as text."""

    def __init__(self, level=logging.INFO):
        super().__init__(level)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage()[:600])


def _once(A, b, backend, debug=False):
    import cupy as cp
    from scipy_gpuqr import QRFactorization
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    log = logging.getLogger("scipy_gpuqr")
    lines = _Lines(logging.DEBUG if debug else logging.INFO)
    log.addHandler(lines)
    level = log.level
    log.setLevel(logging.DEBUG if debug else logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            F = QRFactorization(A, backend=backend)
            x = F.solve(b)
        cp.cuda.Device().synchronize()
        dt = time.perf_counter() - t
    finally:
        log.removeHandler(lines)
        log.setLevel(level)
    info = F.info
    bi = info["backend_info"]
    r = A @ x - b
    berr = float(np.linalg.norm(A.T @ r) / (np.linalg.norm(A.T @ b) or 1.0))
    row = {"seconds": dt, "backend": info["backend"], "stages": bi.get("stages"),
           "restaged": bi.get("restaged"), "fallback": bi.get("fallback"),
           "planned_peak": (bi.get("memory") or {}).get("planned_peak"),
           "limited_by": (bi.get("memory") or {}).get("limited_by"),
           "host_fronts": [h["shape"] for h in bi.get("host_fronts") or []],
           "host_fronts_on": [h.get("factorized_on") for h in bi.get("host_fronts") or []],
           "host_front_seconds": (bi.get("seconds") or {}).get("host_fronts"),
           "timings": {k: round(v, 4) for k, v in (info.get("timings") or {}).items()},
           "engine_seconds": {k: round(v, 4) for k, v in (bi.get("seconds") or {}).items()
                              if isinstance(v, float)},
           "host_front_phases": {k: round(v, 4)
                                 for k, v in (bi.get("host_front_seconds") or {}).items()},
           "rank_decision": {k: info.get("rank_decision", {}).get(k)
                             for k in ("method", "rank", "device")},
           "normal_eq_residual": berr,
           "r_copy_stages": bi.get("r_copy_stages"),
           "host_r_by_parts": bi.get("host_r_by_parts"),
           "stage_seconds": bi.get("stage_seconds"),
           "hand_on_seconds": bi.get("hand_on_seconds"),
           "timeline": bi.get("timeline"),
           "q_first_stage_early": bi.get("q_first_stage_early"),
           "pool_ranges_sent_during_stages": bi.get("pool_ranges_sent_during_stages"),
           "blocks_placed_early": bi.get("blocks_placed_early"),
           "host_assembled_ahead": bi.get("host_assembled_ahead"),
           "warnings": [str(w.message)[:160] for w in seen],
           "log": lines.messages}
    F.free()
    del F
    gc.collect()
    return row, x


def _high_priority_side_stream(cp):
    """``solve_rank._side_stream`` made at the device's highest stream priority
    (mode ``prio``): the rank decision's first block beside ``Qᵀb`` then takes
    the SMs that a link-bound replay kernel's blocks free first. One per device,
    as the package's (the bench's decisions run on one thread)."""
    dev = int(cp.cuda.Device().id)
    made = _DEFAULTS.setdefault("priority_streams", {})
    if dev not in made:
        _, greatest = cp.cuda.runtime.deviceGetStreamPriorityRange()
        made[dev] = cp.cuda.Stream(non_blocking=True, priority=greatest)
    return made[dev]


#: ``--modes``: an A/B in one process (its calls interleaved), each mode the
#: package's defaults with a few settings changed: how Q's solve brings an
#: earlier stage's reflector bands up (``reflector_upload.BAND_UPLOAD``), how a
#: host front's slabs bring earlier panels up (``slab_front.PANEL_UPLOAD``) and
#: how many parts a slab has at most (``slab_front.SLAB_PARTS``), whether a host
#: front whose staircase fits is worked as one slab, and in how many parts at
#: most (``slab_front.ONE_SLAB_PARTS``; ``columns``: never, the slabs of every
#: row; ``parts4`` … ``parts7``: fewer, wider parts, fewer updates), whether Q's
#: replay prefetches the next stage's reflectors (``solve.PREFETCH``) and a
#: staged factorization sends Q's first stage up as it ends
#: (``solve.PREFETCH_FIRST``), how a plan that the time model's dense fronts
#: leave infeasible picks dense fronts (``driver.STAGED_DENSE``), whether
#: its stage plan is made per call (``plans_per_call``; kept per pattern and
#: bytes available otherwise) and how a host stage's blocks are assembled
#: (``assemble``: by default as they land, during their stage or once the next
#: stage's launches are enqueued; ``"late"``: blocks attached to a pool's copy
#: only after the launches, their records handed ahead once the next stage's
#: launches are enqueued; ``"off"``: attached after the launches, every record
#: run by the host stage's launch, the eighteenth session's path); the
#: interpreter's switch interval for the whole call (``switch_interval``, seconds:
#: ``sys.setswitchinterval``; the process' own otherwise); whether a staged
#: factorization's rank decision solves its first block beside ``Qᵀb``
#: (``solve.STAGED_BESIDE``; ``after``: ``Qᵀb`` first) and from how many rows of R
#: a front's rows go up as their upper trapezoid (``trsolve.TRAPEZOID_MIN_ROWS``;
#: ``fullrows``: none, every row whole; ``before``: both as they were); the stream
#: that first block is solved on (``prio``: at the highest priority,
#: :func:`_high_priority_side_stream`); the grid of the kernel reading a host
#: front's panels over the link for ``Q`` (``dense_front.MAPPED_READ_BLOCKS``;
#: ``narrow``: one block per SM of an H200); what a one-slab host front's parts'
#: rows and its updates' ``Vᵀ`` rows are padded to (``slab_front.ROW_ALIGN``;
#: ``noalign``: not padded), and whether its last part goes back panel by
#: panel (``slab_front.LAST_BY_PANELS``; ``lastwhole``: whole; ``c22off``:
#: neither change).
MODES = {"defaults": {},
         "bands": {"band_upload": "mapped"},
         "panels-mapped": {"slab_panels": "mapped"},
         "mapped-all": {"slab_panels": "mapped-all"},
         "parts2": {"slab_parts": 2},
         "noprefetch": {"prefetch": False},
         "lateq": {"prefetch_first": False},
         "size": {"staged_dense": "size"},
         "plannow": {"plans_per_call": True},
         "late": {"assemble": "late"},
         "columns": {"one_slab": 0},
         "parts4": {"one_slab": 4},
         "parts5": {"one_slab": 5},
         "parts6": {"one_slab": 6},
         "parts7": {"one_slab": 7},
         "switch": {"switch_interval": 2e-4},
         "noasm": {"assemble": "off"},
         "after": {"staged_beside": False},
         "fullrows": {"trapezoid_rows": 1 << 62},
         "before": {"staged_beside": False, "trapezoid_rows": 1 << 62},
         "prio": {"side_stream": _high_priority_side_stream},
         "narrow": {"mapped_blocks": 132},
         "noalign": {"row_align": 1},
         "lastwhole": {"last_by_panels": False},
         "c22off": {"row_align": 1, "last_by_panels": False}}

#: Each setting of :data:`MODES`: its module (under ``scipy_gpuqr``) and name.
_SETTINGS = {"band_upload": ("_engine.gpu.reflector_upload", "BAND_UPLOAD"),
             "slab_panels": ("_engine.slab_front", "PANEL_UPLOAD"),
             "slab_parts": ("_engine.slab_front", "SLAB_PARTS"),
             "one_slab": ("_engine.slab_front", "ONE_SLAB_PARTS"),
             "prefetch": ("_engine.gpu.solve", "PREFETCH"),
             "prefetch_first": ("_engine.gpu.solve", "PREFETCH_FIRST"),
             "staged_dense": ("_engine.gpu.driver", "STAGED_DENSE"),
             "staged_beside": ("_engine.gpu.solve", "STAGED_BESIDE"),
             "trapezoid_rows": ("_engine.gpu.trsolve", "TRAPEZOID_MIN_ROWS"),
             "side_stream": ("_factor.solve_rank", "_side_stream"),
             "mapped_blocks": ("_engine.dense_front", "MAPPED_READ_BLOCKS"),
             "row_align": ("_engine.slab_front", "ROW_ALIGN"),
             "last_by_panels": ("_engine.slab_front", "LAST_BY_PANELS")}


class _NoPlans:
    """Stands in for ``driver._STAGED_PLANS``: keeps nothing."""

    def get(self, *args):
        return None

    def put(self, *args):
        pass


#: The package's settings before the first mode changed them, and its table
#: of staged plans (``plans``), as the process found them.
_DEFAULTS = {}


def _set_mode(name):
    """The package's defaults, then mode ``name``'s settings (:data:`MODES`)."""
    import importlib

    from scipy_gpuqr._engine.gpu import driver
    m = MODES[name]
    unknown = set(m) - set(_SETTINGS) - {"plans_per_call", "assemble", "switch_interval"}
    if unknown:
        raise ValueError(f"mode {name}: unknown settings {sorted(unknown)}")
    for key, (mod, attr) in _SETTINGS.items():
        module = importlib.import_module(f"scipy_gpuqr.{mod}")
        default = _DEFAULTS.setdefault(key, getattr(module, attr))
        setattr(module, attr, m.get(key, default))
    # a staged plan made per call (nothing kept: ``driver._STAGED_PLANS`` stood in
    # for) or kept per pattern and bytes available, the package's way
    kept = _DEFAULTS.setdefault("plans", driver._STAGED_PLANS)
    driver._STAGED_PLANS = _NoPlans() if m.get("plans_per_call") else kept
    _assembly(m.get("assemble"))
    sys.setswitchinterval(m.get("switch_interval",
                                _DEFAULTS.setdefault("switch", sys.getswitchinterval())))


def _assembly(how):
    """A host stage's assembly ahead as ``how`` says (:data:`MODES`' ``assemble``):
    the stage loop's methods replaced for the process, or the package's."""
    from scipy_gpuqr._engine.gpu import stage_loop
    loop = stage_loop.StageLoop
    hand = _DEFAULTS.setdefault("hand_ahead", loop.hand_ahead)
    early = _DEFAULTS.setdefault("place_early", loop.place_early)
    if how not in (None, "late", "off"):
        raise ValueError(f"assemble: None, 'late' or 'off', got {how!r}")

    def after_launches(self, st, down):     # the first call comes before them
        if getattr(down, "bench_before", True):
            down.bench_before = False
            return
        early(self, st, down)
    loop.place_early = early if how is None else after_launches
    loop.hand_ahead = (lambda self, *a: None) if how == "off" else hand


def _run_modes(A, b, repeat, limit, modes, debug=False, profile=None, blocks=False):
    """Per mode of ``modes`` (:data:`MODES`) a warm-up call, then ``repeat`` rounds
    of one call per mode, in turn (drift falls on every mode alike); with
    ``blocks`` each mode's calls one after the other instead (modes whose
    stage plans differ evict each other's schedule state from the process's
    per-pattern caches when interleaved: every call then runs cold, seconds
    waited for the host side); the rows as ``_run``'s, per mode;
    with ``profile`` one more call of the last mode under cProfile (as ``_run``)."""
    import cupy as cp
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    pool.set_limit(size=base + int(limit))
    rows, firsts, xs = {}, {}, {}
    rounds = [[m] for m in modes] if blocks else [modes]
    try:
        for group in rounds:
            _run_rounds(A, b, repeat, group, debug, rows, firsts, xs)
        if profile:
            _profiled(A, b, limit, profile)
    finally:
        pool.set_limit(size=0)
    out = {}
    for name in modes:
        o = dict(rows[name][-1])
        o["seconds"] = statistics.median(r["seconds"] for r in rows[name])
        o["all_seconds"] = [round(r["seconds"], 4) for r in rows[name]]
        o["all_timings"] = [r["timings"] for r in rows[name]]
        o["first_seconds"] = firsts[name]["seconds"]
        o["runs"] = len(rows[name])
        o["pool_used_after"] = int(pool.used_bytes() - base)
        out[name] = (o, xs[name])
    return out


def _run_rounds(A, b, repeat, modes, debug, rows, firsts, xs):
    """``_run_modes``' calls of ``modes``: a warm-up each, then ``repeat`` rounds."""
    for name in modes:
        _set_mode(name)
        firsts[name], xs[name] = _once(A, b, "gpu", debug)
        rows[name] = [firsts[name]]
    for _ in range(repeat):
        for name in modes:
            if firsts[name]["backend"] != "gpu":
                continue
            if len(rows[name]) == 1 and rows[name][0] is firsts[name]:
                rows[name] = []
            _set_mode(name)
            row, xs[name] = _once(A, b, "gpu", debug)
            rows[name].append(row)


def _profiled(A, b, limit, path, backend="gpu"):
    """One more call under cProfile, its cumulative profile appended to ``path``."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    _once(A, b, backend)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(70)
    with open(path, "a") as fh:
        fh.write(f"==== {A.shape}, limit {limit}\n{text.getvalue()}\n")


def _run(A, b, backend, repeat, limit=None, profile=None, debug=False):
    """``_once`` first, then ``repeat`` more (GPU); with ``profile`` (a path) one
    more under cProfile, its cumulative profile appended to that file; with
    ``debug`` the package's debug lines too (the slabs' timeline)."""
    import cupy as cp
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    if limit is not None:
        pool.set_limit(size=base + int(limit))
    try:
        first, x = _once(A, b, backend, debug)
        rows = [first]
        if first["backend"] == "gpu":
            rows = [_once(A, b, backend, debug)[0] for _ in range(repeat)] or [first]
        if profile:
            _profiled(A, b, limit, profile, backend)
    finally:
        pool.set_limit(size=0)
    out = dict(rows[-1])
    out["seconds"] = statistics.median(r["seconds"] for r in rows)
    out["all_seconds"] = [round(r["seconds"], 4) for r in rows]
    out["first_seconds"] = first["seconds"]
    out["runs"] = len(rows)
    out["pool_used_after"] = int(pool.used_bytes() - base)
    return out, x


def _alternate(A, b, need, fracs, rounds):
    """Calls alternating between the pool limits ``need // f`` of ``fracs``,
    ``rounds + 1`` rounds (a process whose pool limit changes between calls: each
    limit's plan, schedule and R's gather maps made before): per call its limit,
    seconds and the engine's wait for the host side (seconds spent making again
    what a cache of the plan's state should keep)."""
    import cupy as cp
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes()
    out = []
    try:
        for _ in range(rounds + 1):
            for f in fracs:
                pool.set_limit(size=base + int(need // f))
                row, _ = _once(A, b, "gpu")
                out.append({"frac": f, "seconds": round(row["seconds"], 4),
                            "wait_host_side": row["engine_seconds"].get("wait_host_side", 0.0),
                            "stages": row["stages"]})
    finally:
        pool.set_limit(size=0)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="")
    p.add_argument("--fracs", default="2,4,8")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--once", default="",
                   help="limits (as --fracs) run with one call only: no repeats after it")
    p.add_argument("--no-cpu", action="store_true")
    p.add_argument("--cpu-only", default="",
                   help="the CPU path for these matrices only (comma-separated; default all)")
    p.add_argument("--predict", action="store_true",
                   help="only print what each limit will run (no GPU needed)")
    p.add_argument("--json")
    p.add_argument("--profile", help="append a cProfile of one more run at the first "
                                     "limit of each matrix to this file")
    p.add_argument("--debug-log", action="store_true",
                   help="print the package's debug lines too (a host front's slab timeline)")
    p.add_argument("--slab-panels", default=None,
                   help="how a host front's slabs bring earlier panels up "
                        "(slab_front.PANEL_UPLOADS; default: the package's)")
    p.add_argument("--solve-upload", default=None,
                   help="how Q's solve brings a host front's panels up "
                        "(dense_front.REFLECTOR_UPLOADS; default: the package's)")
    p.add_argument("--band-upload", default=None,
                   help="how Q's solve brings an earlier stage's reflector bands up "
                        "(reflector_upload.BAND_UPLOADS; default: the package's)")
    p.add_argument("--blocks", action="store_true",
                   help="with --modes: each mode's calls one after the other (modes of "
                        "different stage plans evict each other's cached state when "
                        "interleaved)")
    p.add_argument("--modes", default="",
                   help="an A/B in one process: the modes of MODES to time at each limit, "
                        "their calls interleaved (e.g. defaults,parts2); MODE@F: at the limit "
                        "1/F only")
    p.add_argument("--alternate", default="",
                   help="after the limits, calls alternating between two of them "
                        "(e.g. 2,4), --repeat + 1 rounds: each call's seconds and its wait "
                        "for the host side")
    args = p.parse_args(argv)
    fracs = [int(f) for f in args.fracs.split(",") if f]
    if args.predict:
        for mname, A in _matrices([s for s in args.only.split(",") if s]):
            an, need, floor = _one_stage(A)
            print(f"{mname}: one stage {need / 1e9:.2f} GB, smallest plan {floor / 1e9:.2f} GB")
            for frac in fracs:
                print(f"  1/{frac} ({need // frac / 1e9:.2f} GB): {_predict(an, need // frac)}")
        return
    import cupy as cp
    if args.slab_panels:
        from scipy_gpuqr._engine import slab_front
        if args.slab_panels not in slab_front.PANEL_UPLOADS:
            p.error(f"--slab-panels: one of {slab_front.PANEL_UPLOADS}")
        slab_front.PANEL_UPLOAD = args.slab_panels
    if args.solve_upload:
        from scipy_gpuqr._engine import dense_front
        if args.solve_upload not in dense_front.REFLECTOR_UPLOADS:
            p.error(f"--solve-upload: one of {dense_front.REFLECTOR_UPLOADS}")
        dense_front.REFLECTOR_UPLOAD = args.solve_upload
    if args.band_upload:
        from scipy_gpuqr._engine.gpu import reflector_upload
        if args.band_upload not in reflector_upload.BAND_UPLOADS:
            p.error(f"--band-upload: one of {reflector_upload.BAND_UPLOADS}")
        reflector_upload.BAND_UPLOAD = args.band_upload
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    from scipy_gpuqr._engine import dense_front, slab_front
    from scipy_gpuqr._engine.gpu import reflector_upload
    uploads = {"slab_panels": slab_front.PANEL_UPLOAD, "solve_upload": dense_front.REFLECTOR_UPLOAD,
               "band_upload": reflector_upload.BAND_UPLOAD}
    report = {"device": name, "cores": os.cpu_count(), "uploads": uploads, "matrices": {}}
    print(f"device {name}, {os.cpu_count()} cores, uploads {uploads}", flush=True)
    for mname, A in _matrices([s for s in args.only.split(",") if s]):
        A.sort_indices()
        b = np.cos(np.arange(A.shape[0]))
        an, need, floor = _one_stage(A)
        rec = {"shape": list(A.shape), "nnz": int(A.nnz), "one_stage_need": int(need),
               "smallest_plan": int(floor), "analysis_gpu_bytes": int(an.gpu_bytes), "runs": {}}
        print(f"{mname}: one stage needs {need / 1e9:.2f} GB, the smallest plan "
              f"{floor / 1e9:.2f} GB", flush=True)
        base, x0 = _run(A, b, "gpu", args.repeat)
        rec["runs"]["unlimited"] = base
        print(f"  unlimited  {base['seconds']:7.2f} s  {base['backend']} stages {base['stages']}"
              f"  (first {base['first_seconds']:.2f} s)", flush=True)
        print(f"    phases {base['timings']}\n    engine {base['engine_seconds']}", flush=True)
        modes = [m.split("@") for m in args.modes.split(",") if m]
        for m in modes:
            if m[0] not in MODES or len(m) > 2:
                p.error(f"--modes: each one of {sorted(MODES)}, or MODE@FRAC")
        for frac in fracs:
            cases = []
            here = [m[0] for m in modes if len(m) == 1 or int(m[1]) == frac]
            if here:
                reps = 0 if str(frac) in args.once.split(",") else args.repeat
                for m, (row, x) in _run_modes(A, b, reps, need // frac, here,
                                              debug=args.debug_log, blocks=args.blocks,
                                              profile=args.profile if frac == fracs[0]
                                              else None).items():
                    cases.append((frac, f"1/{frac} {m}", row, x))
            else:
                reps = 0 if str(frac) in args.once.split(",") else args.repeat
                row, x = _run(A, b, "gpu", reps, limit=need // frac,
                              profile=args.profile if frac == fracs[0] else None,
                              debug=args.debug_log)
                cases.append((frac, f"1/{frac}", row, x))
            for frac, label, row, x in cases:
                row["limit"] = int(need // frac)
                row["x_rel_diff"] = float(np.linalg.norm(x - x0) / np.linalg.norm(x0))
                row["vs_unlimited"] = row["seconds"] / base["seconds"]
                rec["runs"][label] = row
                report["matrices"][mname] = rec
                _write(args.json, report)
                print(f"  {label} ({row['limit'] / 1e9:.2f} GB) {row['seconds']:7.3f} s  "
                      f"{row['backend']} stages {row['stages']}  x{row['vs_unlimited']:.2f}  "
                      f"restaged {row['restaged']}  leak {row['pool_used_after']}  "
                      f"dx {row['x_rel_diff']:.1e}  Q first stage early "
                      f"{row.get('q_first_stage_early')}"
                      + (f"  host fronts {row['host_fronts']} {row['host_front_seconds']:.2f} s"
                         f" on {row['host_fronts_on']}"
                         if row["host_fronts"] else "")
                      + (f"  [{row['fallback'][:90]}]" if row["fallback"] else ""), flush=True)
                print(f"    phases {row['timings']} rank {row['rank_decision']}"
                      f"\n    engine {row['engine_seconds']}"
                      + (f"\n    host fronts {row['host_front_phases']}"
                         if row["host_fronts"] else "")
                      + f"\n    R copied per stage {row['r_copy_stages']}, pool ranges sent "
                        f"during stages {row['pool_ranges_sent_during_stages']}, host R by parts "
                        f"{row['host_r_by_parts']}, calls {row.get('all_seconds')}, blocks "
                        f"placed early {row.get('blocks_placed_early')}, records assembled "
                        f"ahead {row.get('host_assembled_ahead')}"
                      + f"\n    stages (begin, launches, wait, R, hand-on) {row['stage_seconds']}"
                      + f"\n    hand-on (carry, keep, retire) {row.get('hand_on_seconds')}"
                      + f"\n    timeline (s) {row.get('timeline')}"
                      + "".join(f"\n    log: {line}" for line in
                                [x for x in row["log"] if x.startswith(("Q replay", "slabs, ms"))]
                                + [x for x in row["log"]
                                   if not x.startswith(("Q replay", "slabs, ms"))][:8]),
                      flush=True)
        if args.alternate:
            alt = [int(f) for f in args.alternate.split(",") if f]
            rec["alternate"] = _alternate(A, b, need, alt, args.repeat)
            report["matrices"][mname] = rec
            _write(args.json, report)
            print(f"  alternating 1/{' and 1/'.join(map(str, alt))}: "
                  + "  ".join(f"1/{c['frac']} {c['seconds']:.3f} s (host side "
                              f"{c['wait_host_side']:.3f})" for c in rec["alternate"]),
                  flush=True)
        if not args.no_cpu and (not args.cpu_only or mname in args.cpu_only.split(",")):
            row, x = _run(A, b, "cpu", 0)
            row["x_rel_diff"] = float(np.linalg.norm(x - x0) / np.linalg.norm(x0))
            rec["runs"]["cpu"] = row
            print(f"  cpu (SuiteSparseQR) {row['seconds']:7.2f} s", flush=True)
            report["matrices"][mname] = rec
            _write(args.json, report)
        report["matrices"][mname] = rec
        _write(args.json, report)
    print("\nsummary (s; x the same process's unlimited call)")
    for mname, rec in report["matrices"].items():
        unl = rec["runs"].get("unlimited", {}).get("seconds")
        for label, row in rec["runs"].items():
            x = row.get("vs_unlimited")
            calls = row.get("all_seconds") or []
            print(f"  {mname:9s} {label:16s} {row['seconds']:8.3f}"
                  + (f"  x{x:.2f}" if x else "")
                  + (f"  [{min(calls):.3f}-{max(calls):.3f}, {len(calls)} calls]"
                     if len(calls) > 1 else "")
                  + (f"  cpu/unl {row['seconds'] / unl:.1f}" if label == "cpu" and unl else "")
                  + f"  {row.get('backend')} stages {row.get('stages')}", flush=True)
        if rec.get("alternate"):
            print(f"  {mname:9s} alternating     "
                  + " ".join(f"1/{c['frac']}:{c['seconds']:.3f}({c['wait_host_side']:.2f})"
                             for c in rec["alternate"]), flush=True)


def _write(path, report):
    """The report so far (a run cut short still leaves what it measured)."""
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
    # the report is written: skip the interpreter's teardown, in which freeing the
    # pinned pool's cached blocks (gigabytes) takes seconds per process
    sys.stdout.flush()
    os._exit(0)
