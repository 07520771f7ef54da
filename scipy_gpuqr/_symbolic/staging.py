"""Staging plan (paper §3.4): fronts grouped in postorder into stages that fit GPU memory.

A stage's bytes count every buffer the GPU holds while it runs (VT tiles and
S entries included, so a plan that fits does fit): every front of the stage, the contribution blocks of children from earlier stages,
S entries, Rimap/Rjmap, VT tiles, both task queues (see
:func:`.counts.gpu_front_bytes`) and two R/H staging buffers of the stage's
largest front.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StagePlan", "plan_stages"]


@dataclass(frozen=True)
class StagePlan:
    """Result of :func:`plan_stages`.

    Attributes
    ----------
    budget : int or None
        The byte budget (None: unlimited, one stage).
    stages : tuple of (int, int)
        ``(first_front, last_front)`` inclusive, in postorder.
    stage_bytes : tuple of int
        GPU bytes each stage needs.
    oversized : tuple of int
        Fronts that alone (with their children's contribution blocks) exceed
        the budget; each sits in a stage of its own and the plan is infeasible.
    """

    budget: int | None
    stages: tuple
    stage_bytes: tuple
    oversized: tuple

    @property
    def feasible(self) -> bool:
        return not self.oversized

    @property
    def nstages(self) -> int:
        return len(self.stages)

    def as_dict(self) -> dict:
        return {"budget": self.budget, "nstages": self.nstages,
                "stages": [list(s) for s in self.stages],
                "stage_bytes": list(self.stage_bytes),
                "max_stage_bytes": max(self.stage_bytes) if self.stage_bytes else 0,
                "oversized_fronts": list(self.oversized), "feasible": self.feasible}


def plan_stages(parent: np.ndarray, child_ptr: np.ndarray, children: np.ndarray,
                gpu: dict, budget: int | None, fixed_bytes: int = 0) -> StagePlan:
    """Greedy postorder staging.

    Front f joins the open stage if the stage still fits with it (its
    additive bytes, the contribution blocks of its children that sit in
    earlier stages, and the stage's R/H staging buffers); otherwise a new
    stage starts at f, in which all of f's children are earlier. A front that
    does not fit an empty stage is recorded in ``oversized``.
    """
    nf = len(parent)
    add = gpu["additive"].tolist()
    cb = gpu["cb"].tolist()
    stg = gpu["staging"].tolist()
    chp, ch = child_ptr.tolist(), children.tolist()
    if nf == 0:
        return StagePlan(budget, (), (), ())
    if budget is None:
        total = fixed_bytes + sum(add) + 2 * max(stg)
        return StagePlan(None, ((0, nf - 1),), (int(total),), ())
    stage_of = [0] * nf
    stages, sbytes, oversized = [], [], []
    cur_start, cur_sum, cur_stage_max = 0, 0, 0
    sid = 0
    for f in range(nf):
        kids = ch[chp[f]:chp[f + 1]]
        cb_in = sum(cb[c] for c in kids if stage_of[c] < sid)
        new_max = max(cur_stage_max, stg[f])
        cand = fixed_bytes + cur_sum + add[f] + cb_in + 2 * new_max
        if cand <= budget or f == cur_start:
            if f == cur_start and cand > budget:
                oversized.append(f)
            cur_sum += add[f] + cb_in
            cur_stage_max = new_max
            stage_of[f] = sid
            continue
        # close the open stage, start a new one at f
        stages.append((cur_start, f - 1))
        sbytes.append(fixed_bytes + cur_sum + 2 * cur_stage_max)
        sid += 1
        cur_start = f
        cb_in = sum(cb[c] for c in kids)
        cur_sum = add[f] + cb_in
        cur_stage_max = stg[f]
        stage_of[f] = sid
        if fixed_bytes + cur_sum + 2 * cur_stage_max > budget:
            oversized.append(f)
    stages.append((cur_start, nf - 1))
    sbytes.append(fixed_bytes + cur_sum + 2 * cur_stage_max)
    return StagePlan(int(budget), tuple(stages), tuple(int(b) for b in sbytes), tuple(oversized))
