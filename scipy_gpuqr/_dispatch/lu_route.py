"""The QR's rank decision as SuperLU's factors of a square A predict it.

On a square A the iterate-first rule (:mod:`scipy_gpuqr._dispatch.iterate_first`)
may make SciPy's SuperLU of A (:mod:`scipy_gpuqr._api.square_lu`) before the
QR. Where those factors show A not of full rank without an exact singularity,
U's pivots say which of lstsq's rank rules (:mod:`scipy_gpuqr._factor.lstsq`)
the QR's R will meet, and so what its rank decision costs
(:mod:`scipy_gpuqr._dispatch.rank_cost`) far better than the dense rules' cube
would. :class:`LURoute` reads them once and keeps the prediction until the plan
shows the QR would not take that route. A prediction that does not hold costs
time, not accuracy: the QR's own checks decide the rank.

* Where U's pivots split at lstsq's cutoff (``square.revealed_dead()``: a few
  under it, the rest clearly above), on a host whose GPU would run the QR's
  dense rank work (``dense_gpu``) and for R's orders from
  :data:`~scipy_gpuqr._dispatch.rank_cost.GAP_GPU_MIN_ORDER` to
  :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER`, the rank
  decision is predicted to be the gap-checked sparse COD with its σ test on
  the device (:func:`~scipy_gpuqr._dispatch.rank_cost.gap_check_seconds`), not
  dense work. Where the plan puts the factorization on the GPU (whose
  factorizer the sparse COD would use) or R is too dense for that COD, the
  prediction is dropped; where lstsq would test σ_min(R11) on the host's
  compiled sweeps for less than the device's test with its dense libraries'
  first use (``host_sigma``, lstsq's ``host_sigma_pays``), it is the host's
  gap-checked COD (below).
* On a host without a GPU for that work (``dense_gpu()`` False) whose compiled
  sparse sweeps answer (``host_sweeps``) the same split predicts the host's
  gap-checked sparse COD, which lstsq tries there before any dense rule (its σ
  test on R11's compiled sweeps), at a cost that follows R's entries
  (:func:`~scipy_gpuqr._dispatch.rank_cost.host_sparse_rank_seconds`), not the
  dense rules' cube; the plan drops the prediction where it factorizes on the
  GPU, did not count R's entries, or R is too dense for the sparse COD.
* Where U's pivots hide the deficiency instead (none at lstsq's cutoff even
  with ``‖A‖_F`` for σ_max, ``square.hides_deficiency()``), the rank decision
  is predicted as R's small singular subspace on the GPU
  (:func:`~scipy_gpuqr._dispatch.rank_cost.subspace_seconds`: a few block
  solves with R made dense there, lstsq's ``DenseSubspaceCOD``), dropped where
  the plan saw no GPU; where R's singular values have no clear gap at the
  cutoff that decision refuses and the SVD answers, later.
* On a host without a GPU for that work whose compiled sweeps answer
  (``host_sweeps``), the same hidden deficiency predicts R's small singular
  subspace through R's host sweeps (lstsq's sparse subspace decision,
  :func:`~scipy_gpuqr._dispatch.rank_cost.host_subspace_seconds`: a few steps
  of two block sweeps through R's entries and q × p dense products). That costs
  about as much as SciPy's whole run on such a matrix where the run converges
  soon, and nothing tells such a run from a slow one early (nnc1374: about 1000
  or about 2400 iterations, by b), so the route opens only once the run has
  passed ``order`` iterations (:attr:`LURoute.opens_at`, :meth:`LURoute.open`):
  LSQR and LSMR end within that many in exact arithmetic (their iterates span
  a Krylov space of at most that dimension); a run past it lives on rounding
  and, on a matrix whose LU showed it not of full rank, converges only as the
  small singular values' components resolve. The plan drops the route as the
  host's gap-checked COD's.
* Beyond :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER`
  (lstsq's ``DENSE_LIMIT``), on a host whose GPU would run the QR's dense rank
  work, the rank decision is predicted as R's small singular subspace on the
  GPU wherever lstsq would try it there (``device_subspace``: the first block,
  sized by U's pivots under the cutoff, within the largest, and R made dense
  within the device's memory), gap or not (lstsq's rule beyond
  ``DENSE_LIMIT``): a few block solves, not the dense COD's q³ nor R's
  entries' sparse rules. The plan then factorizes on the GPU
  (:data:`SUBSPACE_GPU_PLAN_REASON`), whose rank decision tries that subspace
  first (a host R's gap-checked sparse COD would come before it).

An exactly singular LU keeps the rule's own treatment: its R's pivots at
rounding make the sparse COD's gap check and the subspace refuse.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from .rank_cost import (GAP_GPU_MIN_ORDER, HOST_SUBSPACE_BLOCK, RANK_SPARSE_MAX_DENSITY,
                        RANK_SPARSE_MIN_ORDER, gap_check_seconds, host_sparse_rank_seconds,
                        host_subspace_seconds, subspace_seconds)

__all__ = ["SUBSPACE_GPU_PLAN_REASON", "LURoute"]

#: Why the plan factorizes on the GPU where R's small singular subspace there is predicted
#: beyond :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER`
#: (``Allowance(plan_gpu=)``, :attr:`LURoute.large`).
SUBSPACE_GPU_PLAN_REASON = ("the QR's rank decision predicted as R's small singular subspace "
                            "on the GPU beyond lstsq's DENSE_LIMIT: R made there")


class LURoute:
    """The route of the QR's rank decision that U's pivots predict, and its cost.

    Parameters
    ----------
    square : object or None
        SciPy's SuperLU of a square A (:class:`scipy_gpuqr._api.square_lu.SquareLU`),
        read once its factors are made and deficient (:meth:`read`): ``singular``,
        ``revealed_dead()``, ``hides_deficiency()``, ``pivots_under_cutoff()``.
    order : int
        The order of R whose rank the QR decides.
    dense_gpu : callable, optional
        ``dense_gpu() -> bool``: whether a GPU would run the QR's dense rank work,
        asked once, only where U's pivots may predict a route. None: U's pivots are
        never read.
    device_subspace : callable, optional
        ``device_subspace(order, under) -> bool``: whether lstsq would try R's small
        singular subspace on the GPU on an R beyond
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` with about
        ``under`` pivots under its cutoff. None: never.
    host_sweeps : callable, optional
        ``host_sweeps() -> bool``: whether the host's compiled sparse sweeps answer,
        asked where ``dense_gpu()`` is False and U's pivots split or hide the deficiency
        (the host's gap-checked COD and R's subspace on the host are predicted only with
        them: without them the σ test makes R11 dense, and R's solves are SuperLU's).
        None: U's pivots are not read on such a host.
    host_sigma : callable, optional
        ``host_sigma(order, entries) -> bool``: whether lstsq would test σ_min of an
        order-``order`` R11 with about ``entries`` entries on the host's compiled sweeps
        though a GPU runs the dense rank work (lstsq's ``host_sigma_pays`` with the
        factorization on the host), asked where the plan keeps the gap-checked COD on
        a GPU host (with ``host_sweeps``). None: that σ test is the GPU's.

    Attributes
    ----------
    gap_predicted : int
        U's pivots under the cutoff where they predict the gap-checked COD
        (``square.revealed_dead()``), else 0 (also once the plan dropped it).
    rank_host : bool
        Whether the predicted rank decision is the host's (no GPU for the dense rank
        work, or the gap-checked COD's σ test on the host's sweeps by ``host_sigma``):
        the gap-checked COD, or R's small singular subspace where :attr:`host_block`.
    host_block : int
        Where U's pivots hide the deficiency on such a host: the block of R's subspace
        iteration there (:data:`~scipy_gpuqr._dispatch.rank_cost.HOST_SUBSPACE_BLOCK`),
        else 0 (also once the plan dropped it).
    opens_at : float
        The iteration from which that route holds (``order + 1``, :meth:`open`), until
        then pending; inf where none is pending.
    subspace_predicted : bool
        Whether U's pivots hide the deficiency (``square.hides_deficiency()``), or R lies
        beyond :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER`
        (``device_subspace``), and R's small singular subspace on the GPU is predicted to
        decide its rank (False once the plan dropped it).
    large_under : int
        U's pivots under lstsq's cutoff where the prediction beyond
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` was made, else -1.
    gap_dropped : str
        Why a prediction was dropped, or ''.
    """

    def __init__(self, square, order: int, *, dense_gpu: Optional[Callable] = None,
                 device_subspace: Optional[Callable] = None,
                 host_sweeps: Optional[Callable] = None, host_sigma: Optional[Callable] = None):
        self.square = square
        self.order = int(order)
        self._dense_gpu = dense_gpu
        self._device_subspace = device_subspace
        self._host_sweeps = host_sweeps
        self._host_sigma = host_sigma
        self.gap_predicted = 0
        self.large_under = -1
        self.subspace_predicted = False
        self.rank_host = False                    # ... the rank decision on the host
        self.host_block = 0                       # R's subspace on the host: its block
        self.opens_at = math.inf                  # ... whose route holds from this iteration
        self.gap_dropped = ""                     # why the plan dropped the prediction

    @property
    def holds(self) -> bool:
        """Whether U's pivots predict the QR's rank decision (the gap-checked COD or R's
        small singular subspace on the GPU, or where :attr:`rank_host` the gap-checked COD
        on the host or, once :meth:`open`, R's small singular subspace there)."""
        return bool(self.gap_predicted) or self.subspace_predicted

    @property
    def large(self) -> bool:
        """The subspace prediction beyond
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` holds."""
        return self.subspace_predicted and self.large_under >= 0

    def reads_ahead(self) -> bool:
        """Whether an LU made ahead should read U's pivots too: where :meth:`read` may
        read them (less its question to ``dense_gpu``, asked later where it counts)."""
        return self._dense_gpu is not None and (
            GAP_GPU_MIN_ORDER <= self.order <= RANK_SPARSE_MIN_ORDER or
            (self.order > RANK_SPARSE_MIN_ORDER and self._device_subspace is not None))

    def read(self) -> None:
        """Read U's pivots of a deficient LU (``square.deficient``) for the prediction:
        the gap-checked COD on the GPU or, without a GPU for the dense rank work, on the
        host (:attr:`gap_predicted`, :attr:`rank_host`), or R's small singular subspace
        on the GPU (:attr:`subspace_predicted`), or, pending until the run passes
        ``order`` iterations (:attr:`opens_at`), R's small singular subspace on the host
        (:attr:`host_block`)."""
        reads = self._reads_pivots()
        gpu = reads and bool(self._dense_gpu())
        if gpu:
            self.gap_predicted = self.square.revealed_dead()
            self.subspace_predicted = (not self.gap_predicted and
                                       bool(self.square.hides_deficiency()))
        elif reads and self._host_sweeps is not None:
            # no GPU for the dense work: U's pivots that split predict the host's
            # gap-checked sparse COD, where its σ test runs on R11's compiled sweeps
            dead = self.square.revealed_dead()
            if dead and self._host_sweeps():
                self.gap_predicted, self.rank_host = dead, True
            elif dead:
                self.gap_dropped = "the host's compiled sweeps not at hand"
            elif self.square.hides_deficiency():
                # R's small singular subspace through R's host sweeps, once the run passes
                # the Krylov bound (:meth:`open`)
                if self._host_sweeps():
                    self.host_block, self.opens_at = HOST_SUBSPACE_BLOCK, self.order + 1
                else:
                    self.gap_dropped = "the host's compiled sweeps not at hand"
        elif self._predicts_large_subspace():
            self.subspace_predicted = True

    def open(self) -> None:
        """The run passed :attr:`opens_at`: R's small singular subspace on the host
        (:attr:`host_block`) is the predicted route from now on."""
        self.subspace_predicted, self.rank_host, self.opens_at = True, True, math.inf

    def _reads_pivots(self) -> bool:
        """Whether U's pivots may be worth reading (:attr:`gap_predicted`,
        :attr:`subspace_predicted`): a deficient LU that is not singular, R's order from
        :data:`~scipy_gpuqr._dispatch.rank_cost.GAP_GPU_MIN_ORDER` to
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` (where the
        gap-checked COD's σ test runs on the GPU, or the host's sparse COD comes before
        its dense rules), and the GPU's question given (``dense_gpu``, asked after this:
        a GPU for the dense rank work, else the host's, read where ``host_sweeps`` is
        given)."""
        return (self._dense_gpu is not None and not self.square.singular and
                GAP_GPU_MIN_ORDER <= self.order <= RANK_SPARSE_MIN_ORDER)

    def _predicts_large_subspace(self) -> bool:
        """Whether R's small singular subspace on the GPU is predicted to decide the rank of
        an R beyond :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` (lstsq's
        ``DENSE_LIMIT``): a deficient LU that is not singular (an exactly singular one
        leaves pivots at rounding, whose solves the subspace refuses), a GPU for the dense
        rank work (``dense_gpu``), and ``device_subspace`` with the count of U's pivots
        under the cutoff (``square.pivots_under_cutoff()``, recorded in
        :attr:`large_under`). There that decision costs a few block solves with R made
        dense on the device (:func:`~scipy_gpuqr._dispatch.rank_cost.subspace_seconds`),
        not the dense COD's q³ nor R's entries' sparse rules."""
        if self._device_subspace is None or self._dense_gpu is None or \
                self.square.singular or self.order <= RANK_SPARSE_MIN_ORDER or \
                not self._dense_gpu():
            return False
        under = int(self.square.pivots_under_cutoff())
        if not self._device_subspace(self.order, under):
            return False
        self.large_under = under
        return True

    def keep(self, planned, rank_device: str, r_entries: Optional[float]) -> None:
        """Drop the prediction where the plan would not take its route.

        ``planned`` is the plan ``(M, Plan)`` or None, ``rank_device`` where it puts
        the factorization (``'cpu'`` or ``'gpu'``), ``r_entries`` R's entries by the
        analysis' count (None: not counted). Drops :attr:`gap_predicted` where the plan
        would not run the gap-checked COD with its σ test on the GPU: the factorization
        on the GPU (whose factorizer that COD would use), no GPU seen by the plan, R11
        below :data:`~scipy_gpuqr._dispatch.rank_cost.GAP_GPU_MIN_ORDER`, or R denser
        than :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MAX_DENSITY`; drops
        :attr:`subspace_predicted` where the plan saw no GPU (a GPU factorization keeps
        it: R's dense work runs there; beyond
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MIN_ORDER` a host R's too,
        after its gap-checked sparse COD). The host's gap-checked COD
        (:attr:`rank_host`) is dropped where the plan factorizes on the GPU or did not
        count R's entries, or R is denser than
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MAX_DENSITY` (lstsq's sparse
        COD is not tried there, and the prediction follows R's entries); so is R's small
        singular subspace on the host (:attr:`host_block`).
        A gap-checked COD kept on a GPU host is the host's where its σ test would run on
        the host's compiled sweeps (:meth:`_host_sigma_pays`).
        """
        if self.rank_host:
            why = ("no plan" if planned is None else
                   "the plan factorizes on the GPU" if rank_device != "cpu" else
                   "R's entries not counted" if r_entries is None else
                   "R too dense for the sparse COD" if self._too_dense(r_entries) else "")
            if why:
                self.gap_predicted, self.subspace_predicted = 0, False
                self.rank_host, self.host_block, self.gap_dropped = False, 0, why
            return
        if self.subspace_predicted:
            why = ("no plan" if planned is None else
                   "the plan saw no GPU" if getattr(planned[1], "gpu_name", None) is None
                   else "")
            if why:
                self.subspace_predicted, self.gap_dropped = False, why
            return
        if planned is None:
            why = "no plan"
        elif rank_device != "cpu":
            why = "the plan factorizes on the GPU"
        elif getattr(planned[1], "gpu_name", None) is None:
            why = "the plan saw no GPU"
        elif self.order - self.gap_predicted < GAP_GPU_MIN_ORDER:
            why = "R11 too small for the GPU's σ test"
        elif r_entries is not None and self._too_dense(r_entries):
            why = "R too dense for the sparse COD"
        else:
            self.rank_host = self._host_sigma_pays(r_entries)
            return
        self.gap_predicted, self.gap_dropped = 0, why

    def _too_dense(self, r_entries: float) -> bool:
        """R's entries (the analysis' count) fill more than
        :data:`~scipy_gpuqr._dispatch.rank_cost.RANK_SPARSE_MAX_DENSITY` of its square:
        lstsq does not try its sparse COD there."""
        return r_entries > RANK_SPARSE_MAX_DENSITY * float(self.order) ** 2

    def _host_sigma_pays(self, r_entries: Optional[float]) -> bool:
        """Whether lstsq would test σ_min(R11) of the predicted gap-checked COD on the
        host's compiled sweeps though a GPU runs the dense rank work (``host_sigma``
        with R11's predicted order and R's entries by the analysis' count, the sweeps
        at hand): its cost is then the host's (:attr:`rank_host`)."""
        return (self._host_sigma is not None and r_entries is not None
                and self._host_sweeps is not None and bool(self._host_sweeps())
                and bool(self._host_sigma(self.order - self.gap_predicted, r_entries)))

    def rank_seconds(self, r_entries: Optional[float]) -> Optional[float]:
        """The rank decision's predicted seconds by the predicted route (``r_entries``:
        R's entries by the analysis' count, for the host's routes), or None
        where none is predicted."""
        if self.rank_host and self.host_block:
            return host_subspace_seconds(self.order, r_entries, self.host_block)
        if self.rank_host:
            return host_sparse_rank_seconds(r_entries)
        if self.gap_predicted:
            return gap_check_seconds(self.order)
        if self.subspace_predicted:
            return subspace_seconds(self.order)
        return None

    def shown(self) -> str:
        """What U's pivots showed and the route they predict, for the rule's reason."""
        where = "on the host" if self.rank_host else "on the GPU"
        return (f"SuperLU's U shows {self.gap_predicted} pivots under lstsq's cutoff and "
                f"the rest clearly above: the QR's rank decision predicted as the "
                f"gap-checked COD {where}" if self.gap_predicted else
                f"SuperLU's factors are deficient and U's pivots hide it, and the run passed "
                f"min(m, n) = {self.order} iterations: the QR's rank decision predicted as "
                f"R's small singular subspace on the host" if self.host_block else
                f"SuperLU's factors are deficient ({self.large_under} of U's pivots under "
                f"lstsq's cutoff) and R beyond lstsq's DENSE_LIMIT: the QR's rank "
                f"decision predicted as R's small singular subspace on the GPU"
                if self.large else
                "SuperLU's factors are deficient and U's pivots hide it: the QR's rank "
                "decision predicted as R's small singular subspace on the GPU")

    def summary(self) -> str:
        """The prediction, or why it was dropped, for the log ('' where U's pivots
        predicted nothing)."""
        where = "on the host" if self.rank_host else "on the GPU"
        if self.gap_predicted:
            return (f"U's pivots: {self.gap_predicted} under lstsq's cutoff, the "
                    f"rest clearly above (the gap-checked COD {where} predicted)")
        if self.large:
            return (f"{self.large_under} of U's pivots under lstsq's cutoff, R beyond "
                    f"DENSE_LIMIT (R's small singular subspace on the GPU predicted)")
        if self.host_block:
            return ("U's pivots hide the deficiency (R's small singular subspace on the host "
                    "predicted" + (")" if self.rank_host else
                                   f" once the run passes {self.order} iterations)"))
        if self.subspace_predicted:
            return ("U's pivots hide the deficiency (R's small singular subspace on "
                    "the GPU predicted)")
        if self.gap_dropped:
            return (f"U's pivots predicted the QR's rank decision; "
                    f"dropped: {self.gap_dropped}")
        return ""
