"""A one-device call's pinned host buffers in one block, its pages made while CUDA starts.

A one-stage factorization on one CUDA device pins host buffers as it runs:
the maps (:meth:`~.device.CupyDevice.start`), the stage's S entries (indices
and values) and its records (:meth:`~.device.CupyDevice.begin_stage`) on
the call's thread before its first launch, then R's two staging slots
(:func:`~.rcopy.staging_for`) on the copier's thread during the launches.
In a new process each is a ``cudaHostAlloc`` made after CUDA is up (about
1 ms a MB: the device idle meanwhile, and the other threads' CUDA calls
stalled).

Pinning is two steps: the pages made resident, then the driver told of
them. The first needs no CUDA and is most of the cost, so here it is done on
a worker (``gpuqr-call-block``) while CUDA starts and CuPy imports, which a
new process's call waits for anyway: anonymous memory on 2 MiB pages where
the kernel allows it (``madvise(MADV_HUGEPAGE)``), every page touched
(:func:`touched_pages`). The second (``cudaHostRegister``, a few ms) follows
on that worker where the call started CUDA itself (device 0, the device a
thread without a context uses), else on the device layer's thread when it
takes its first buffer (its own device current).

The block's size comes from the one-stage schedule read from its file
meanwhile (:func:`~.driver.start_schedule_load`): a pattern an earlier
process factorized. After the call the block joins the pinned blocks kept
between calls (:mod:`.pinned_ahead`), from which a later one-stage call whose
buffers it holds borrows it (:func:`borrow`), so a repeated call pins nothing
either. A buffer the block cannot hold, and every buffer of a call without a
block, is pinned when asked for, as before.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ... import _gpu
from ..._schedule.tasks import TASK_BYTES
from .pinned_ahead import PINNED_ALIGN, borrow_kept_pinned, give_back_kept_pinned
from .rcopy import SLOT_BYTES, PinnedStaging

__all__ = ["CallBlock", "start", "borrow", "block_bytes", "touched_pages", "HUGE_PAGE",
           "BLOCK_ROUND", "HOST_REGISTER_PORTABLE"]

#: Bytes of a huge page (the block's pages and its alignment).
HUGE_PAGE = 2 << 20

#: Bytes a block of touched pages is rounded up to (a later call whose buffers grew
#: a little still fits; touching takes time in proportion to the size).
BLOCK_ROUND = 8 << 20

#: ``cudaHostRegisterPortable``: the memory is pinned for every CUDA context.
HOST_REGISTER_PORTABLE = 1

_PAGE = mmap.PAGESIZE
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_POPULATE_WRITE = 23           # Linux 5.14 and later


def _align(nbytes: int) -> int:
    return -(-max(int(nbytes), 1) // PINNED_ALIGN) * PINNED_ALIGN


def _sizes(analysis, sched, dtype) -> list | None:
    """Bytes of each buffer a one-stage run of ``sched`` takes, in the order the
    layer asks (the maps, the S indices, the S values, the records), and last
    R's staging slot (two are taken); None for a schedule of more stages."""
    if sched is None or len(sched.stages) != 1:
        return None
    fs = analysis.fronts
    isz = np.dtype(dtype).itemsize
    return [int(len(fs.rimap) + len(fs.rjmap)) * 8, int(len(fs.s_index)) * 8,
            int(len(fs.s_nz)) * isz, max(int(sched.stages[0].ntasks), 1) * TASK_BYTES,
            _r_slot_of(analysis)]


def _r_slot_of(analysis) -> int:
    """Bytes of an R staging slot of ``analysis``' R (:func:`~.rcopy.staging_for`'s,
    with R's entries bounded by its fronts' rows: at most :data:`~.rcopy.SLOT_BYTES`)."""
    fs = analysis.fronts
    fr = np.asarray(fs.frank, dtype=np.int64)
    fn = np.asarray(fs.fn, dtype=np.int64)
    entries = int((fr * fn - fr * (fr - 1) // 2).sum())
    return int(min(SLOT_BYTES, max(entries, 1) * 8))


def block_bytes(analysis, sched, dtype) -> int | None:
    """Bytes of the block of a one-stage run of ``sched`` (:func:`_sizes`: the four
    buffers and two R slots, each aligned); None for more stages."""
    sizes = _sizes(analysis, sched, dtype)
    if sizes is None:
        return None
    return sum(_align(b) for b in sizes[:4]) + 2 * _align(sizes[4])


def _libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                         ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


class _Pages:
    """Anonymous memory mapped, aligned to :data:`HUGE_PAGE`; registered with CUDA
    by :meth:`register`; unregistered, then unmapped, once no array of it is left
    (:func:`weakref.finalize` on :attr:`array`, whose views all refer to it)."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._lib = _libc()
        self._span = self.nbytes + HUGE_PAGE
        addr = self._lib.mmap(None, self._span, mmap.PROT_READ | mmap.PROT_WRITE,
                              mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {self._span} bytes failed")
        self._base = int(addr)
        self.addr = -(-self._base // HUGE_PAGE) * HUGE_PAGE
        self._lib.madvise(self.addr, self.nbytes, _MADV_HUGEPAGE)     # advice: may be refused
        buf = (ctypes.c_uint8 * self.nbytes).from_address(self.addr)
        #: the pages as ``uint8`` (every array handed out is a view of it)
        self.array = np.ctypeslib.as_array(buf)
        self._state = {"registered": None}
        self._final = weakref.finalize(self.array, _release, self._lib, self._base,
                                       self._span, self._state)
        self._final.atexit = False          # at exit the process's memory goes anyway

    def touch(self) -> None:
        """Every page made resident, writable (huge pages where granted): by the
        kernel (``madvise(MADV_POPULATE_WRITE)``, through ctypes: the GIL left to
        the call's other threads meanwhile), else by a write per page."""
        if self._lib.madvise(self.addr, self.nbytes, _MADV_POPULATE_WRITE) != 0:
            self.array[::_PAGE] = 0

    @property
    def registered(self) -> bool:
        return self._state["registered"] is not None

    def register(self, cp) -> None:
        """``cudaHostRegister`` (portable) on the calling thread's current device."""
        if self.registered:
            return
        cp.cuda.runtime.hostRegister(self.addr, self.nbytes, HOST_REGISTER_PORTABLE)
        self._state["registered"] = (cp.cuda.runtime.hostUnregister, self.addr)


def _release(lib, base: int, span: int, state: dict) -> None:
    reg = state.get("registered")
    if reg is not None:
        unregister, addr = reg
        try:
            unregister(addr)
        except Exception:  # noqa: BLE001 - a torn-down runtime: unmapped all the same
            pass
    lib.munmap(base, span)


def touched_pages(nbytes: int) -> _Pages:
    """``nbytes`` (rounded up to :data:`BLOCK_ROUND`) of anonymous memory on huge
    pages where granted, every page touched; no CUDA."""
    size = -(-max(int(nbytes), 1) // BLOCK_ROUND) * BLOCK_ROUND
    pages = _Pages(size)
    pages.touch()
    return pages


class CallBlock:
    """A device layer's ``pinned_ahead`` for one call: the four buffers a one-stage
    run pins before its first launch (:func:`_sizes`), in the order it asks for
    them, and R's two staging slots (:meth:`r_staging`), cut from one pinned
    block. A buffer asked for before the block is ready waits for it; any other
    request, or one larger than its place, is pinned then, as before (the block
    goes back to the kept ones after the call, so nothing that outlives the call
    may lie in it).

    Parameters
    ----------
    future : concurrent.futures.Future
        Of ``(block, sizes)``: a :class:`_Pages` (registered or not yet) or a kept
        pinned ``uint8`` array, and :func:`_sizes`; or of None (every buffer
        pinned as asked).
    """

    def __init__(self, future):
        self._future = future
        self._lock = threading.Lock()
        self._block = None              # the pinned uint8 array; False: none
        self._pages = None
        self._sizes = ()
        self._k = 0                     # buffers handed out
        self._done = False
        #: bytes served from the block, and bytes pinned as asked meanwhile
        self.served = 0
        self.missed = 0

    def _ready(self):
        with self._lock:
            if self._block is None:
                try:
                    got = self._future.result()
                except Exception:  # noqa: BLE001 - no block: pinned as asked
                    got = None
                block, sizes = got if got is not None else (None, ())
                if isinstance(block, _Pages):
                    try:
                        if not block.registered:
                            block.register(_gpu.import_cupy())
                        self._pages, block = block, block.array
                    except Exception:  # noqa: BLE001 - refused: pinned as asked
                        block = None
                self._block = block if block is not None else False
                self._sizes = tuple(sizes) if block is not None else ()
            return self._block if not self._done else False

    def take(self, n: int, dtype) -> np.ndarray:
        """``n`` elements of ``dtype`` of pinned host memory: the next of the four
        buffers where it fits its place, else pinned now."""
        dt = np.dtype(dtype)
        nbytes = max(int(n), 1) * dt.itemsize
        block = self._ready()
        with self._lock:
            k = self._k
            if block is not False and k < 4 and nbytes <= _align(self._sizes[k]):
                self._k += 1
                at = sum(_align(b) for b in self._sizes[:k])
                self.served += nbytes
                return block[at: at + nbytes].view(dt)[:int(n)]
            self.missed += nbytes
        import cupyx
        return cupyx.empty_pinned((max(int(n), 1),), dtype=dt)[:int(n)]

    def holds(self, arr) -> bool:
        """Nothing is filled ahead: every upload copies into what :meth:`take` gives."""
        return False

    def r_staging(self, nbytes: int):
        """R's two staging slots of ``nbytes`` from the block, locked for the copier
        (:class:`~.rcopy.PinnedStaging`), or None where they do not fit their place
        (once a call)."""
        block = self._ready()
        with self._lock:
            if block is False or self._k > 4 or int(nbytes) > self._sizes[4]:
                return None
            self._k = 5                 # the four buffers' places are not taken after it
            a = sum(_align(b) for b in self._sizes[:4])
            b = a + _align(self._sizes[4])
            self.served += 2 * int(nbytes)
        staging = PinnedStaging(int(nbytes), slots=[block[a: a + int(nbytes)],
                                                    block[b: b + int(nbytes)]])
        staging.lock.acquire()
        return staging

    def info(self) -> dict:
        """``info["call_block"]``: the block's bytes, whether its pages were touched
        for this call (else borrowed from the kept blocks), bytes served and bytes
        pinned as asked."""
        block = self._block
        return {"bytes": 0 if block is None or block is False else int(block.size),
                "touched": self._pages is not None, "served": int(self.served),
                "pinned_as_asked": int(self.missed)}

    def finish(self, stream=None) -> None:
        """The block back to the kept ones once ``stream`` (the layer's, which
        copied from it) is done; let go of where that cannot be known or it was
        never registered. Later requests are pinned as asked."""
        with self._lock:
            self._done = True
            block = self._block
        if block is None:               # never taken from: made ahead or not
            try:
                got = self._future.result()
            except Exception:  # noqa: BLE001 - nothing was made
                return
            block = got[0] if got is not None else None
            if isinstance(block, _Pages):
                if not block.registered:
                    return              # unpinned pages: unmapped with the array
                block = block.array
        if block is None or block is False:
            return
        try:
            if stream is not None:
                stream.synchronize()
        except Exception:  # noqa: BLE001 - a failed device: never lent again
            return
        give_back_kept_pinned(block)


def _made(sched_future, analysis, dtype, register_on):
    """The worker's ``(block, sizes)``: a kept block that holds the run's buffers,
    else pages touched now and, with ``register_on`` (a device id), registered
    there once CUDA is up; None where the schedule read has more stages or none
    was read."""
    sched = sched_future.result()
    sizes = _sizes(analysis, sched, dtype)
    if sizes is None:
        return None
    nbytes = block_bytes(analysis, sched, dtype)
    kept = borrow_kept_pinned(nbytes)
    if kept is not None:
        return kept, sizes
    pages = touched_pages(nbytes)
    if register_on is not None:
        cp = _gpu.import_cupy()
        _gpu.wait_for_driver()
        try:
            with cp.cuda.Device(int(register_on)):
                pages.register(cp)
        except Exception:  # noqa: BLE001 - left for the layer's thread
            pass
    return pages, sizes


def start(analysis, sched_future, dtype, *, register_on=None) -> CallBlock | None:
    """The block of a one-stage run of the schedule ``sched_future`` will give
    (:func:`~.driver.start_schedule_load`), made on a worker (``gpuqr-call-block``);
    None without a schedule future. ``register_on``: the device the call's CUDA
    start makes current (a new process's first call: 0), registered on the
    worker; None: on the layer's thread at its first buffer."""
    if sched_future is None:
        return None
    ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuqr-call-block")
    try:
        fut = ex.submit(_made, sched_future, analysis, dtype, register_on)
    finally:
        ex.shutdown(wait=False)
    return CallBlock(fut)


def borrow(analysis, sched, dtype) -> CallBlock | None:
    """A kept block that holds a one-stage run's buffers, lent for the call (nothing
    pinned here), or None."""
    sizes = _sizes(analysis, sched, dtype)
    if sizes is None:
        return None
    block = borrow_kept_pinned(block_bytes(analysis, sched, dtype))
    if block is None:
        return None
    fut = Future()
    fut.set_result((block, sizes))
    return CallBlock(fut)
