"""BLAS thread counts: SuiteSparseQR's, set around each call, and every OpenBLAS
of the process, set around a body of small calls (the rank decision).

SuiteSparseQR calls the system BLAS (OpenBLAS on Debian/Ubuntu), while
NumPy and SciPy call the OpenBLAS copies bundled in their wheels: one
process holds two or three BLAS thread pools. OpenBLAS workers keep spinning
for a while after each call (about 0.1 s by default), so when our CPU path
alternates between SuiteSparseQR and SciPy's LAPACK (the factorization,
then the rank decision on R, then Qᵀb) each pool's spinning workers slow the
other's next call several-fold; limiting the pool used by SuiteSparseQR
removes most of that.

A small factorization gains nothing from 16 BLAS threads either, so
:func:`limited` runs SuiteSparseQR's BLAS with one thread for problems below
:data:`SINGLE_THREAD_FLOPS` and leaves every other setting alone. The
OpenBLAS that libspqr is linked against is reached through libspqr's own
handle (``dlsym`` searches its dependencies), so the pools of NumPy and SciPy
are never touched; with another BLAS (no ``openblas_set_num_threads``) this
is a no-op.

The rank decision's dense and Lanczos steps run in NumPy's and SciPy's own
OpenBLAS: :func:`process_limited` lowers every OpenBLAS loaded in the
process (found in the process' memory map on Linux, reached through its
``*_set_num_threads`` symbol: OpenBLAS's own name, or the ``scipy_openblas``
names of the copies bundled in NumPy's and SciPy's wheels; the map is read again
only once a library was loaded or unloaded since) for a body of small
calls: a matrix-vector product, a Lanczos step or a triangular inverse of a
few hundred columns finishes before a pool of idle workers has woken up, and
those workers then spin on the cores the next call (SuiteSparseQR's, or the
other pool's) needs. A count is a speed setting: the same count gives the same
results bit for bit, while another may change their last bits (OpenBLAS splits
some reductions among its threads), as ``OPENBLAS_NUM_THREADS`` itself does.

An OpenBLAS count is one per process, not per thread: while a body runs, every
other thread's calls into that pool run with its count too (a speed effect, and
their reductions' last bits). ``openblas_set_num_threads_local`` (OpenBLAS
0.3.27 on) does not change that in the pthreads builds that NumPy's and
SciPy's wheels ship: it sets the same process-wide count and returns the
earlier one (another thread reads the new count at once), so it is not used.
What can be made safe is our own threads' changes: every change goes through
one record per process (:class:`_ProcessCounts`, the one mutable object here,
since the counts it guards are themselves one per process). Bodies that
overlap, in one thread or several, share the lowering: the first saves each
pool's count, the last restores it, and no body ever restores a count another
body lowered (two threads saving and restoring on their own can leave a pool
lowered for good: the second saved the first's lowered count). A pool is set
only when its count changes, and :func:`held_counts` keeps every count as it is
for a body whose other threads run BLAS meanwhile (a multi-device call): no
lowering starts while it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from typing import Optional

import _cffi_backend

from .._mapped_files import MAPS, mapped_paths
from ._ffi_cache import SYMBOL_MISSING

__all__ = ["SINGLE_THREAD_FLOPS", "CDEF", "threads_for", "limited", "process_limited",
           "held_counts", "blas_limited", "one_blas_thread", "openblas_pools",
           "find_openblas_pools", "objects_loaded", "Lowered"]

#: Factorizations with fewer flops (the symbolic analysis' count) run
#: SuiteSparseQR's BLAS on one thread.
SINGLE_THREAD_FLOPS = 1e9

#: Declarations added to the SuiteSparseQR ``cffi.FFI``.
CDEF = """
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
"""


#: Names of OpenBLAS's ``(get, set)`` thread-count functions: its own, then those
#: of the ``scipy_openblas`` copies in NumPy's (64-bit integers) and SciPy's wheels.
_SYMBOLS = (("openblas_get_num_threads", "openblas_set_num_threads"),
            ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"))


def threads_for(flops: Optional[float]) -> Optional[int]:
    """BLAS threads for a factorization of ``flops`` (None: leave the library's setting).

    Parameters
    ----------
    flops : float or None
        The analysis' flop count; None when unknown.
    """
    if flops is None or not flops < SINGLE_THREAD_FLOPS:
        return None
    return 1


def _controls(lib):
    """``(get, set)`` of OpenBLAS through ``lib``'s handle, or None for another BLAS."""
    try:
        return lib.openblas_get_num_threads, lib.openblas_set_num_threads
    except (*SYMBOL_MISSING, NotImplementedError):
        return None


@contextlib.contextmanager
def limited(lib, threads: Optional[int]):
    """Run the body with the BLAS behind ``lib`` limited to ``threads`` threads.

    Parameters
    ----------
    lib : cffi library handle
        libspqr's handle (with :data:`CDEF` declared on its FFI).
    threads : int or None
        None (or a BLAS that is not OpenBLAS) changes nothing; otherwise the
        count is lowered for the body and restored after it, through the
        process' record of lowered pools (see :func:`process_limited`: this
        pool is also among :func:`openblas_pools`).
    """
    ctl = _controls(lib) if threads is not None else None
    if ctl is None:
        yield
        return
    with _COUNTS.lowered([ctl], int(threads)):
        yield


def _loaded_openblas_paths(maps: str = MAPS) -> list:
    """Paths of the shared objects mapped into this process whose path names
    OpenBLAS (the library or its folder; empty where the memory map cannot be
    read: not Linux)."""
    return [p for p in mapped_paths("openblas", maps) if ".so" in os.path.basename(p)]


class _PhdrInfo(ctypes.Structure):
    """The head of glibc's ``struct dl_phdr_info`` up to its load counters."""

    _fields_ = [("dlpi_addr", ctypes.c_uint64), ("dlpi_name", ctypes.c_char_p),
                ("dlpi_phdr", ctypes.c_void_p), ("dlpi_phnum", ctypes.c_uint16),
                ("dlpi_adds", ctypes.c_ulonglong), ("dlpi_subs", ctypes.c_ulonglong)]


_PHDR_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t,
                                  ctypes.c_void_p)


def objects_loaded():
    """``(loads, unloads)`` of shared objects in this process since it started
    (glibc's ``dl_iterate_phdr`` counters, read from its first object only), or
    None where they cannot be read (no glibc, an older one).

    The pair changes whenever a library is loaded or unloaded, so what was
    found in the process' memory map stays valid while it stays the same.
    """
    iterate = _dl_iterate_phdr()
    if iterate is None:
        return None
    seen = []

    def first(info, size, _data):
        if size >= ctypes.sizeof(_PhdrInfo):
            seen.append((int(info.contents.dlpi_adds), int(info.contents.dlpi_subs)))
        return 1                            # stop after the first object

    iterate(_PHDR_CALLBACK(first), None)
    return seen[0] if seen else None


@functools.lru_cache(maxsize=1)
def _dl_iterate_phdr():
    """glibc's ``dl_iterate_phdr``, typed (None where the C library has none)."""
    try:
        iterate = ctypes.CDLL(None).dl_iterate_phdr
    except (OSError, AttributeError):
        return None
    iterate.restype = ctypes.c_int
    iterate.argtypes = [_PHDR_CALLBACK, ctypes.c_void_p]
    return iterate


@functools.lru_cache(maxsize=1)
def _pools_while(loaded) -> tuple:
    """:func:`find_openblas_pools` while the process' loaded objects are ``loaded``
    (:func:`objects_loaded`): a read of the memory map costs about a millisecond."""
    return tuple(find_openblas_pools())


def openblas_pools() -> list:
    """``(get, set)`` of every OpenBLAS thread pool loaded in the process: found
    again only after a library was loaded or unloaded since the last search
    (:func:`objects_loaded`), at every call where that cannot be told."""
    loaded = objects_loaded()
    if loaded is None:
        return find_openblas_pools()
    return list(_pools_while(loaded))


def find_openblas_pools() -> list:
    """``(get, set)`` of every OpenBLAS thread pool loaded in the process, from its
    memory map.

    Each library is opened with ``RTLD_NOLOAD`` (only one already loaded is
    reached, nothing is loaded), and its pool counted once even where two
    mapped files share it (a symbol found through a dependency).
    """
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)
    pools, seen = [], set()
    for path in _loaded_openblas_paths():
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            try:
                get, set_ = getattr(lib, get_name), getattr(lib, set_name)
            except AttributeError:
                continue
            key = ctypes.cast(set_, ctypes.c_void_p).value
            if key not in seen:
                seen.add(key)
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                pools.append((get, set_))
            break
    return pools


@functools.lru_cache(maxsize=64)
def _cffi_address(fn) -> int:
    """The address of a cffi function pointer (a fact of the pointer, read once: the
    limits of a small factorization ask for it at every call, and a cast through
    cffi's Python layer costs tens of microseconds after the caller's garbage
    collection; ctypes' cast of a cffi pointer fails by an exception, dearer still)."""
    return int(_cffi().cast("uintptr_t", fn))


@functools.lru_cache(maxsize=1)
def _cffi():
    """An FFI to read cffi function pointers with (made once). cffi's C backend's
    own: an empty one, whose primitive type strings its C parser reads (a
    ``cffi.FFI`` would import pycparser, tens of milliseconds in a new process)."""
    return _cffi_backend.FFI()


def _address(fn):
    """Where the C function ``fn`` (a ctypes or cffi function pointer) lies in
    memory: one pool's setter reached through two handles has one address."""
    if isinstance(fn, _cffi().CData):
        return _cffi_address(fn)
    try:
        return ctypes.cast(fn, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        pass
    try:
        return int(_cffi().cast("uintptr_t", fn))
    except TypeError:
        # not a C function (a stand-in): its owner and name stand for the pool
        return (id(getattr(fn, "__self__", fn)), getattr(fn, "__name__", ""))


class _Pool:
    """One pool in the record: its setter, the count saved when the first body
    lowered it, the count last set, the limits of the bodies in it and the lifts."""

    __slots__ = ("set_", "before", "now", "limits", "lifts")

    def __init__(self, set_, before: int):
        self.set_, self.before, self.now = set_, before, before
        self.limits, self.lifts = [], 0

    def target(self, held: bool) -> int:
        if held or self.lifts or not self.limits:
            return self.before
        return min(self.before, min(self.limits))


class _ProcessCounts:
    """The process' record of the OpenBLAS pools lowered by :func:`process_limited`
    and :func:`limited`, and of the :func:`held_counts` bodies.

    A pool is lowered to the smallest limit of the bodies in it, unless a body
    lifted it or a hold runs, and set back to the count saved by its first body
    when its last one ends (a count other code set meanwhile, threadpoolctl's
    say, is overwritten then). Every change happens under one lock, so two
    threads never save or set a pool's count at once; a process forked while
    another thread held it gets a new one.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pools = {}        # setter's address -> _Pool
        self._holds = 0

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def _apply(self, key) -> None:
        p = self._pools[key]
        target = p.target(self._holds > 0)
        if target != p.now:
            p.set_(target)
            p.now = target
        if not p.limits and not p.lifts:
            del self._pools[key]

    def enter(self, pools: list, threads: int, keys: list) -> None:
        """Add a body limited to ``threads`` to each of ``pools``, their keys to ``keys``
        (as each is added: a failure leaves the ones :meth:`leave` must end)."""
        with self._lock:
            for get, set_ in pools:
                key = _address(set_)
                if key in keys:
                    continue
                if key not in self._pools:
                    self._pools[key] = _Pool(set_, int(get()))
                self._pools[key].limits.append(threads)
                keys.append(key)
                self._apply(key)

    def leave(self, keys: list, threads: int) -> None:
        """End a body :meth:`enter` added."""
        with self._lock:
            for key in reversed(keys):
                self._pools[key].limits.remove(threads)
                self._apply(key)

    def lift(self, keys: list, by: int) -> None:
        """Add (``by`` = 1) or end (-1) a lift of the pools ``keys``."""
        with self._lock:
            for key in keys:
                self._pools[key].lifts += by
                self._apply(key)

    def hold(self, by: int) -> None:
        """Add (``by`` = 1) or end (-1) a hold of every pool's count."""
        with self._lock:
            self._holds += by
            for key in list(self._pools):
                self._apply(key)

    @contextlib.contextmanager
    def lowered(self, pools: list, threads: int):
        """A body limited to ``threads`` in ``pools``; yields its pools' keys."""
        keys = []
        try:
            self.enter(pools, threads, keys)
            yield keys
        finally:
            self.leave(keys, threads)


#: The one record of the process (see :class:`_ProcessCounts`).
_COUNTS = _ProcessCounts()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_COUNTS._after_fork)


class Lowered:
    """The pools a :func:`process_limited` body lowered."""

    def __init__(self, keys: list):
        self._keys = keys

    @contextlib.contextmanager
    def lifted(self):
        """Run the body with the lowered pools back at their earlier counts (a large
        call inside a body of small ones), lowered again after it (unless a
        :func:`held_counts` body runs then)."""
        _COUNTS.lift(self._keys, 1)
        try:
            yield
        finally:
            _COUNTS.lift(self._keys, -1)


@contextlib.contextmanager
def process_limited(threads: Optional[int], pools: Optional[list] = None):
    """Run the body with every OpenBLAS of the process limited to ``threads`` threads.

    Parameters
    ----------
    threads : int or None
        None changes nothing (nor does a process without OpenBLAS); otherwise
        each pool above ``threads`` is lowered for the body and restored after
        it. Bodies that overlap (nested, or in other threads) keep the lowest
        count, and the pools return to their earlier counts when the last of
        them ends; while a :func:`held_counts` body runs nothing is lowered.
        Process-wide: other threads' calls see the count meanwhile.
    pools : list, optional
        :func:`openblas_pools` found earlier in the process (a caller entering
        many short bodies looks them up once); default: looked up now.

    Yields
    ------
    Lowered
        Its :meth:`Lowered.lifted` gives a large call inside the body the
        earlier counts back.
    """
    if threads is None:
        yield Lowered([])
        return
    with _COUNTS.lowered(openblas_pools() if pools is None else pools, int(threads)) as keys:
        yield Lowered(keys)


def blas_limited(threads: Optional[int]):
    """Context running the process' BLAS on at most ``threads`` threads for its body.

    Every OpenBLAS of the process through the process' one record of counts
    (:func:`process_limited`), so that bodies overlapping in several threads
    share one lowering and never leave a pool lowered; where the process has no
    OpenBLAS, threadpoolctl's limit on the BLAS it finds (MKL, BLIS), if it is
    installed; otherwise ``contextlib.nullcontext()``, which callers read as
    "not limited". None changes nothing.
    """
    if threads is None:
        return contextlib.nullcontext()
    pools = openblas_pools()
    if pools:
        return process_limited(threads, pools)
    try:
        from threadpoolctl import threadpool_limits        # optional
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=threads, user_api="blas")


def one_blas_thread():
    """:func:`blas_limited` to one thread: the executors' panel products and the
    rank decision's small dense steps, which a second thread does not speed up and
    threads waiting for busy cores slow down many times."""
    return blas_limited(1)


@contextlib.contextmanager
def held_counts():
    """Run the body with every OpenBLAS pool at the count it was set to before
    any :func:`process_limited` or :func:`limited` body lowered it.

    For a body whose other threads call BLAS meanwhile (a multi-device call's
    device threads): OpenBLAS's count is process-wide, so a lowering in one
    thread would change their calls' thread counts, and the last bits of their
    reductions, by the timing of another thread's work. Pools lowered when the
    body starts are set back first (the lowering bodies run on at those counts),
    none is lowered while any such body runs, and bodies still running when
    the last one ends are lowered again then.
    """
    _COUNTS.hold(1)
    try:
        yield
    finally:
        _COUNTS.hold(-1)
