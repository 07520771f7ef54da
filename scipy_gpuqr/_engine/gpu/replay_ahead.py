"""``Q``'s replay plan of a first factorization made while its stage still runs.

The replay plan (:func:`.solve.kept_plan`: the kept reflectors' records by
level, the fronts' row maps) of a pattern new to the process is read from
its file or built at the first ``Qᵀb``, on the call's thread, after the
factorization, while the device is idle. Everything it reads is known before the stage ends:
the schedule's records (materialized by R's worker), R's layout (the fronts'
row slots, from the same worker), where each front lies in the stage's pool
and after which launch each dense front runs. :func:`start` makes it on a
worker thread once R's worker is done, while the call's thread enqueues the
last launches and waits for the device; :func:`.solve.plan_of` waits for it.

Only a one-stage factorization on a CUDA device without host fronts starts
one (the usual first call): the plan is the one :func:`.solve.plan_of` would
make, under the same key, so a factorization whose plan differs (another
layout of fronts) finds no entry and makes its own as before.
"""

from __future__ import annotations

import types

import numpy as np

from . import solve
from .stage_loop import stage_reflector_records
from .worker import on_worker

__all__ = ["start", "wanted", "ahead_factorization"]


def wanted(device, sched, host_stages) -> bool:
    """Whether a factorization on ``device`` with ``sched`` starts the plan ahead:
    a CUDA layer (the replay runs on the device), one stage, no host stage,
    and no plan kept for the schedule yet (a repeated call finds it)."""
    extras = getattr(sched, "extras", None)
    return (getattr(device, "cp", None) is not None and len(sched.stages) == 1
            and not host_stages and extras is not None
            and not any(type(k) is tuple and k[:1] == ("replay_plan",) for k in list(extras)))


def ahead_factorization(m: int, n: int, analysis, sched, layout, device):
    """What :func:`.solve.kept_plan` reads of a one-stage factorization, made from
    its schedule (materialized) and R's ``layout`` before the stage ends: the
    attributes the :class:`~.driver.GpuQR` will have (each front's row slots,
    kept records and their launches, its place in the pool; the dense fronts'
    launches), no values."""
    st = sched.stages[0]
    first, last = (int(x) for x in st.fronts)
    kept = stage_reflector_records(sched, 0, st, 0)
    allf, alll = kept.records, kept.launches
    cnt = np.bincount(allf["front"] - first, minlength=last - first + 1)
    ptr = np.concatenate(([0], np.cumsum(cnt))).tolist()
    foff = np.asarray(st.foff)
    nf = analysis.fronts.nfronts
    slots_of = layout.slots_of
    fronts, loc, launch = [], [], []
    for f in range(nf):
        i = f - first
        tasks = allf[ptr[i]:ptr[i + 1]] if 0 <= i <= last - first else allf[:0]
        lau = alll[ptr[i]:ptr[i + 1]] if 0 <= i <= last - first else alll[:0]
        fronts.append((slots_of[f], None, tasks))
        launch.append(lau)
        loc.append((0, int(foff[f])))
    dense = {int(f): types.SimpleNamespace(after_launch=int(L))
             for f, L in st.dense.items()}
    return types.SimpleNamespace(shape=(int(m), int(n)), analysis=analysis, schedule=sched,
                                 _fronts=fronts, _front_loc=loc, _front_launch=launch,
                                 _launch_base=[0], _dense=dense, _device=device, _replay={})


def _make(m, n, analysis, sched, host_side, device):
    lay = host_side.result()[0]
    return solve.kept_plan(ahead_factorization(m, n, analysis, sched, lay, device))


def start(m: int, n: int, analysis, sched, host_side, device):
    """The future of the replay plan kept with ``sched``, made on a worker thread
    (``gpuqr-replay-ahead``) once ``host_side`` (the driver's R worker: R's
    layout, the records made) is done. ``m, n``: the factorized matrix' shape."""
    return on_worker("gpuqr-replay-ahead", _make, m, n, analysis, sched, host_side, device)
