"""Where the iterations of ``auto``'s run go, and what one costs there.

Nominal seconds of one LSQR/LSMR iteration in SciPy's loop on the CPU
(:func:`cpu_iteration_seconds`), in the host loops
(:mod:`scipy_gpuqr._iterative.host`, :func:`host_iteration_seconds`), on a GPU
through CuPy (:func:`gpu_iteration_seconds`) and in one GPU thread block
(:mod:`scipy_gpuqr._iterative.block`, :func:`block_iteration_seconds`), and the
choice among them for the iterate-first rule
(:mod:`scipy_gpuqr._dispatch.iterate_first`), whose watcher rides along.

Where the iterations run: :func:`iterate_on_gpu`. A run on the caller's
host matrix whose iterations a GPU would make faster starts on the CPU all
the same and moves to the GPU only once it has cost as much as putting A
there (:func:`upload_seconds`, :class:`HostFirst`: ski rental). A run of a
few iterations, which the upload alone would make several times slower,
ends on the CPU; a long one pays at most one upload's worth of CPU time more
than starting on the GPU would have.

Middling problems on host data (from :data:`BLOCK_MIN_NNZ` entries) run in one
GPU thread block instead (:mod:`scipy_gpuqr._iterative.block`: many iterations
per launch, no copy between them) where its predicted iteration
(:func:`block_iteration_seconds`, A's longest lines included) beats the host
loop's and the CuPy path's (:func:`iterate_in_block`). The
run starts on the host all the same and moves to the block once its
iterations so far have cost, beyond what the block would have spent on them,
:data:`BLOCK_RENT` times the block's start (:func:`block_start_seconds`: packing A's CSR and CSC
arrays, the copy, a launch; :class:`HostFirst` with ``per_iteration``); the
block goes on from the host's last iteration (its state handed on), so no
iteration is made twice. A run of a few iterations ends on the host with
SciPy's bits, a long one moves.
"""

from __future__ import annotations

from typing import Callable, Optional

from .._gpu import gpu_available

__all__ = ["CPU_ITERATION_S", "CPU_MATVEC_RATE", "GPU_ITERATION_S", "GPU_MATVEC_RATE",
           "HOST_ITERATION_S", "BLOCK_FIXED_S", "BLOCK_ITERATION_S", "BLOCK_BYTES_PER_S",
           "BLOCK_LINE_S", "BLOCK_MIN_NNZ", "BLOCK_MARGIN", "BLOCK_TRANSPOSE_S_PER_ENTRY",
           "BLOCK_PACK_S_PER_ENTRY", "HOST_LOOP_SPEEDUP", "MOVE_BOUND", "BLOCK_RENT",
           "UPLOAD_FIXED_S", "UPLOAD_BYTES_PER_S", "iteration_flops", "cpu_iteration_seconds",
           "host_iteration_seconds", "gpu_iteration_seconds", "iterate_on_gpu",
           "block_iteration_seconds", "block_start_seconds", "iterate_in_block",
           "upload_seconds", "host_first_budget", "HostFirst"]

#: Fixed seconds of one LSQR/LSMR iteration on the CPU: the Python scalar
#: recurrences and a dozen vector calls around the two products.
CPU_ITERATION_S = 1e-4
#: Flop rate of the CPU's matrix-vector products and vector updates (one
#: iteration is :func:`iteration_flops`): a memory-bound sparse product.
CPU_MATVEC_RATE = 1e9
#: Fixed seconds of one iteration of the host loops
#: (:mod:`scipy_gpuqr._iterative.host`, SciPy CSR/CSC float64 A): SciPy's
#: scalar recurrences on Python floats and some twenty in-place vector calls,
#: without the LinearOperator's dispatch; still pessimistic, as
#: :func:`~scipy_gpuqr._dispatch.iterate_first.needs_watching` needs.
HOST_ITERATION_S = 2e-5
#: Fixed seconds of one iteration on a GPU: the kernel launches and the one
#: device-to-host copy of the scalars the recurrences need.
GPU_ITERATION_S = 5e-4
#: Flop rate of the GPU's products and updates (memory bound as well, on
#: several times the bandwidth).
GPU_MATVEC_RATE = 1e11

#: Fixed seconds of a run in one GPU thread block on host data
#: (:mod:`scipy_gpuqr._iterative.block`): the packed buffer, its copy to the device,
#: a launch, the copy back and the result (measured on an H200 host: 0.18–0.29 ms
#: for problems of up to a few thousand entries).
BLOCK_FIXED_S = 2.5e-4
#: Fixed seconds of one iteration in the block: three block-wide sums (trees of
#: barriers) and the scalar recurrences every thread computes.
BLOCK_ITERATION_S = 4e-6
#: Bytes per second one thread block's products and vector updates move (one
#: multiprocessor gathering from cache and device memory).
BLOCK_BYTES_PER_S = 5e10
#: Seconds per entry of A's longest row and longest column: one thread forms each
#: row's and column's product alone, so a dense line is a serial chain of dependent
#: loads the block waits for (an H200: reorientation_1, lines of 632 entries, 35 µs
#: an iteration against 11 without them; rajat01, 1442, about 220 µs against 48).
BLOCK_LINE_S = 5e-8
#: Fewest stored entries of A for the block: below, the host loop's iterations
#: (9–15 µs on an H200's host for a few thousand entries) leave the block too little
#: to save for its start (measured there: bfwa62, gent113, lp_e226, reorientation_1
#: and tumorAntiAngiogenesis_2 slower in the block, west0067 and west0497 faster).
BLOCK_MIN_NNZ = 20000
#: The block's iteration must cost at most this share of the CuPy path's
#: (:func:`gpu_iteration_seconds`) to be chosen over it (grid 40³: the CuPy path
#: answered in 0.17 of SciPy's time, the block in 0.26, at a nominal tie).
BLOCK_MARGIN = 0.8
#: Seconds per stored entry of the host's conversion of A to its other compressed
#: format (the block's products need A by rows and by columns).
BLOCK_TRANSPOSE_S_PER_ENTRY = 3e-9
#: Seconds per stored entry of packing A's values and indices, by rows and by
#: columns, into the block's one host buffer (an H200 host: ch7-8-b3's start,
#: 235200 entries, about 3.6 ms against 2.8 without it).
BLOCK_PACK_S_PER_ENTRY = 4e-9
#: SciPy's LSQR/LSMR iteration over the host loops' (:mod:`scipy_gpuqr._iterative.host`)
#: on the same matrix (an H200 host: 1.4 on ch7-8-b3, 1.5 on a random 20000×4000).
HOST_LOOP_SPEEDUP = 1.4
#: The most a call under ``auto`` may cost against SciPy's own where SciPy's
#: iterations converge (issue 15's bound).
MOVE_BOUND = 1.1
#: The share of the block's start a run's host iterations must have cost (beyond
#: the block's own) before :class:`HostFirst` moves it: ``1 / (MOVE_BOUND ·
#: HOST_LOOP_SPEEDUP − 1)``. A run that moves after k host iterations and then
#: stops at once costs ``k·h + start + g``; SciPy's costs ``(k + 1)·HOST_LOOP_SPEEDUP·h``;
#: with ``(k − 1)·h >= BLOCK_RENT · start`` the move keeps that within ``MOVE_BOUND``
#: (what is left, ``(2·MOVE_BOUND·HOST_LOOP_SPEEDUP − 1)·h``, covers the call's own
#: start and the block's one iteration). Longer runs only gain from the block.
BLOCK_RENT = 1.0 / (MOVE_BOUND * HOST_LOOP_SPEEDUP - 1.0)

#: Fixed seconds of putting a host matrix on the GPU for the iterations: the
#: cupyx CSR matrix, its explicit transpose made on the device, and the first
#: launches of the iteration's kernels.
UPLOAD_FIXED_S = 2e-3
#: Bytes per second of the host-to-device copy of the matrix (pageable memory).
UPLOAD_BYTES_PER_S = 5e9


def iteration_flops(m: int, n: int, nnz: int) -> float:
    """Flops of one LSQR/LSMR iteration: two products with A and a few vector updates."""
    return 4.0 * nnz + 12.0 * (m + n)


def cpu_iteration_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of one CPU iteration (:data:`CPU_ITERATION_S`, :data:`CPU_MATVEC_RATE`)."""
    return CPU_ITERATION_S + iteration_flops(m, n, nnz) / CPU_MATVEC_RATE


def host_iteration_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of one iteration of the host loops (:data:`HOST_ITERATION_S`,
    :data:`CPU_MATVEC_RATE`)."""
    return HOST_ITERATION_S + iteration_flops(m, n, nnz) / CPU_MATVEC_RATE


def gpu_iteration_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of one GPU iteration (:data:`GPU_ITERATION_S`, :data:`GPU_MATVEC_RATE`)."""
    return GPU_ITERATION_S + iteration_flops(m, n, nnz) / GPU_MATVEC_RATE


def iterate_on_gpu(m: int, n: int, nnz: int, *, on_gpu: bool) -> tuple[bool, str]:
    """Whether the iterations run on the GPU, and why.

    On the GPU when one answers (:func:`scipy_gpuqr._gpu.gpu_available`) and
    either the caller's data is there (CuPy in, CuPy out, no copy) or the
    problem is large enough that a GPU iteration, with its fixed cost, beats
    a CPU one. Small host problems never ask for the GPU (nor import CuPy).

    Parameters
    ----------
    m, n, nnz : int
        Shape and stored entries of A.
    on_gpu : bool
        The caller passed CuPy/cupyx data.
    """
    cpu_s, gpu_s = cpu_iteration_seconds(m, n, nnz), gpu_iteration_seconds(m, n, nnz)
    if not on_gpu and cpu_s <= gpu_s:
        return False, f"CPU: a CPU iteration (about {cpu_s:.2g} s) beats a GPU one"
    if not gpu_available():
        return False, "CPU: no GPU"
    if on_gpu:
        return True, "GPU: the data is there"
    return True, f"GPU: a GPU iteration (about {gpu_s:.2g} s) beats a CPU one ({cpu_s:.2g} s)"


def block_iteration_seconds(m: int, n: int, nnz: int, longest: int = 0) -> float:
    """Nominal seconds of one iteration in one GPU thread block: :data:`BLOCK_ITERATION_S`,
    the bytes it moves (A's values, indices and gathered entries twice, the vectors'
    reads and writes) at :data:`BLOCK_BYTES_PER_S`, and ``longest`` (the entries of A's
    longest row plus its longest column) at :data:`BLOCK_LINE_S`."""
    return (BLOCK_ITERATION_S + (40.0 * nnz + 24.0 * m + 48.0 * n) / BLOCK_BYTES_PER_S
            + BLOCK_LINE_S * longest)


def block_start_seconds(m: int, n: int, nnz: int) -> float:
    """Nominal seconds of a block run's start on host data (:data:`BLOCK_FIXED_S`, A's
    other format, the packing of both formats into one buffer, the copy of it, b and the
    vectors at :data:`UPLOAD_BYTES_PER_S`)."""
    return (BLOCK_FIXED_S + (BLOCK_TRANSPOSE_S_PER_ENTRY + BLOCK_PACK_S_PER_ENTRY) * nnz
            + (24.0 * nnz + 48.0 * (m + n)) / UPLOAD_BYTES_PER_S)


def iterate_in_block(m: int, n: int, nnz: int, *, on_gpu: bool,
                     longest: Optional[Callable[[], int]] = None
                     ) -> Optional[tuple[float, float]]:
    """``(start, per_iteration)`` of a run that may move to one GPU thread block, or None.

    None where the caller's data is on the GPU (the CuPy path keeps it there),
    where A has fewer than :data:`BLOCK_MIN_NNZ` entries, where a block
    iteration (:func:`block_iteration_seconds`, with ``longest()``: the
    entries of A's longest row plus its longest column, asked for only once
    the other tests pass) does not beat a host loop's
    (:func:`host_iteration_seconds`) and :data:`BLOCK_MARGIN` of a CuPy path's
    (:func:`gpu_iteration_seconds`), or where no GPU answers. Otherwise the
    block's start (:func:`block_start_seconds`: the ski-rental budget of
    :class:`HostFirst`) and its seconds per iteration.
    """
    if on_gpu or nnz < BLOCK_MIN_NNZ:
        return None
    host, cupy = host_iteration_seconds(m, n, nnz), BLOCK_MARGIN * gpu_iteration_seconds(m, n, nnz)
    block = block_iteration_seconds(m, n, nnz)
    if block >= host or block >= cupy:
        return None
    if longest is not None:
        block = block_iteration_seconds(m, n, nnz, longest())
        if block >= host or block >= cupy:
            return None
    if not gpu_available():
        return None
    return block_start_seconds(m, n, nnz), block


def upload_seconds(m: int, n: int, nnz: int) -> float:
    """Estimated seconds of putting an m×n host matrix with ``nnz`` entries on the GPU for the
    iterations (CSR with 4-byte indices and 8-byte values; :data:`UPLOAD_FIXED_S`,
    :data:`UPLOAD_BYTES_PER_S`)."""
    return UPLOAD_FIXED_S + (12.0 * nnz + 4.0 * (m + 1)) / UPLOAD_BYTES_PER_S


def host_first_budget(m: int, n: int, nnz: int) -> Optional[float]:
    """Seconds a run on host data iterates on the CPU before it moves to the GPU, or None.

    None where a GPU iteration does not beat a CPU one (the run stays on the
    CPU). Otherwise one upload of A (:func:`upload_seconds`): the ski-rental
    rule. Iterating on the CPU until the run has cost what the upload costs,
    then moving, spends at most about twice what the better of "all on the
    CPU" and "upload at once" would have: a run that ends first never paid
    for the upload; one that moves paid the upload's worth once more.
    """
    flops = iteration_flops(m, n, nnz)     # gpu_/cpu_iteration_seconds, made once each
    if GPU_ITERATION_S + flops / GPU_MATVEC_RATE >= CPU_ITERATION_S + flops / CPU_MATVEC_RATE:
        return None
    return upload_seconds(m, n, nnz)


class HostFirst:
    """The callback of a CPU run on host data that may move to the GPU (ski rental).

    Stops the run (returns True, :attr:`moved` set) once it has iterated
    ``budget`` seconds (:func:`host_first_budget`), not counting the time
    ``watch`` spent analysing; until then the run is ``watch``'s
    (:class:`~scipy_gpuqr._dispatch.iterate_first.Allowance`, or None:
    unwatched). Without ``per_iteration`` the caller then runs SciPy's
    algorithm again from the start on the GPU (the CuPy path, which takes no
    host state), so the answer follows SciPy's iterates there as it would have
    without the CPU's head start.

    With ``per_iteration`` (the predicted seconds per iteration ``g`` of one
    GPU thread block, which goes on from the run's last iteration) the run
    moves once its iterations since the first have cost ``rent`` times the
    block's start beyond what the block would have spent on them:
    ``Δt − Δitn·g >= rent·budget``, with ``Δt`` the seconds since the first
    iteration (the call's own start, which a move does not save, is left out).
    That is ski rental with the block's iterations as the price of owning,
    the rent raised (:data:`BLOCK_RENT`) so that a run that stops right after
    it moved still costs at most :data:`MOVE_BOUND` of SciPy's (whose
    iterations cost :data:`HOST_LOOP_SPEEDUP` times the host's) instead of
    twice the better choice. A run whose host iterations are not dearer than
    the block's (``h <= g``) never moves; a long one moves after about
    ``rent·budget / (h − g)`` iterations. The iteration that moves the
    run (:attr:`last`) is not shown to ``watch``: a caller whose run goes on
    with the same watcher hands it over
    (:meth:`~scipy_gpuqr._dispatch.iterate_first.Allowance.catch_up`).
    """

    def __init__(self, budget: float, watch: Optional[Callable] = None,
                 per_iteration: float = 0.0, rent: float = 1.0):
        self.budget = float(budget) * (float(rent) if per_iteration > 0 else 1.0)
        self.watch = watch
        self.per_iteration = float(per_iteration)
        self.moved = False
        self.seconds = 0.0
        self.last = None            # the state of the iteration that moved the run
        self._first = None          # (itn, seconds) of the first iteration seen
        self._itn = 0               # the last iteration seen

    def __call__(self, state) -> bool:
        spent = state.seconds - (self.watch.analysis_s if self.watch is not None else 0.0)
        self._itn = state.itn
        if self.per_iteration > 0:
            if self._first is None:
                self._first = (state.itn, spent)
            itn0, spent0 = self._first
            saved = spent - spent0 - (state.itn - itn0) * self.per_iteration
        else:
            saved = spent
        if saved >= self.budget:
            self.moved, self.seconds, self.last = True, spent, state
            return True
        return bool(self.watch(state)) if self.watch is not None else False

    def quiet_until(self) -> float:
        """The run's seconds before which no iteration makes the run move or reaches
        ``watch``'s checkpoint (the move's test at the next iteration: the block's
        seconds for the iterations made only grow with later ones)."""
        analysis = self.watch.analysis_s if self.watch is not None else 0.0
        if self.per_iteration > 0:
            if self._first is None:
                return 0.0
            itn0, spent0 = self._first
            own = spent0 + (self._itn + 1 - itn0) * self.per_iteration + self.budget
        else:
            own = self.budget
        own += analysis
        return min(own, self.watch.quiet_until()) if self.watch is not None else own

    def catch_up(self, states) -> None:
        """The iterations a run did not report, for ``watch``
        (:meth:`~scipy_gpuqr._dispatch.iterate_first.Allowance.catch_up`)."""
        if self.watch is not None:
            self.watch.catch_up(states)
