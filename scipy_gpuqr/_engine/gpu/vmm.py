"""One device address range backed by physical memory chunk by chunk (CUDA's
virtual memory management, through the driver library).

A mapped stage pool (:mod:`scipy_gpuqr._engine.pool_map`) keeps the address
range and every offset of a whole pool while only the chunks of the fronts
alive hold memory. :class:`MappedRange` reserves the range
(``cuMemAddressReserve``), maps a chunk to a physical allocation
(``cuMemCreate``, ``cuMemMap``, ``cuMemSetAccess``) and unmaps it
(``cuMemUnmap``), keeping its allocation for the next chunk mapped: the
physical allocations made are the most chunks mapped at once. Mapping and
unmapping are not stream-ordered: the caller maps a chunk before enqueueing
work on it and unmaps it only once the device is done with it. The memory is
not CuPy's pool's: the engine counts it against the pool's limit itself.

The driver's entry points are read with :mod:`ctypes` (CuPy does not wrap
them); nothing is loaded at import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

from ..._errors import DeviceOutOfMemory, GpuEngineError

__all__ = ["MappedRange", "granularity", "available"]

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
_CUDA_ERROR_OUT_OF_MEMORY = 2


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_u64 = ctypes.c_uint64
_size = ctypes.c_size_t


@functools.lru_cache(maxsize=1)
def _driver():
    """The CUDA driver library with the entry points' argument types, or None."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
    sigs = {
        "cuMemGetAllocationGranularity": [ctypes.POINTER(_size), ctypes.POINTER(_AllocProp),
                                          ctypes.c_int],
        "cuMemAddressReserve": [ctypes.POINTER(_u64), _size, _size, _u64, ctypes.c_ulonglong],
        "cuMemAddressFree": [_u64, _size],
        "cuMemCreate": [ctypes.POINTER(_u64), _size, ctypes.POINTER(_AllocProp),
                        ctypes.c_ulonglong],
        "cuMemRelease": [_u64],
        "cuMemMap": [_u64, _size, _size, _u64, ctypes.c_ulonglong],
        "cuMemUnmap": [_u64, _size],
        "cuMemSetAccess": [_u64, _size, ctypes.POINTER(_AccessDesc), _size],
    }
    try:
        for fn, args in sigs.items():
            f = getattr(lib, fn)
            f.argtypes = args
            f.restype = ctypes.c_int
    except AttributeError:
        return None
    return lib


def available() -> bool:
    """Whether the driver library with virtual memory management loads."""
    return _driver() is not None


def _call(what: str, rc: int, *, fatal: bool = False) -> None:
    """Raise for a driver error ``rc`` of ``what``: :class:`DeviceOutOfMemory`
    (the engine then runs the stages of its plan without a mapped pool), or
    :class:`GpuEngineError` where ``fatal`` (giving memory back failed)."""
    if not rc:
        return
    if fatal:
        raise GpuEngineError(f"CUDA driver error {rc} in {what}")
    what_ = "Out of memory" if rc == _CUDA_ERROR_OUT_OF_MEMORY else f"CUDA driver error {rc}"
    raise DeviceOutOfMemory(f"{what_} in {what} (a mapped pool)")


def _prop(device_id: int) -> _AllocProp:
    p = _AllocProp()
    p.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = int(device_id)
    return p


def granularity(device_id: int) -> int:
    """Bytes a mapped chunk must be a multiple of on the device (0: no driver)."""
    lib = _driver()
    if lib is None:
        return 0
    g = _size(0)
    p = _prop(device_id)
    _call("cuMemGetAllocationGranularity",
          lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p),
                                            _CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    return int(g.value)


class MappedRange:
    """``nchunks`` chunks of ``chunk_bytes`` of device addresses, each backed
    while mapped.

    Parameters
    ----------
    device_id : int
    nbytes : int
        Bytes the range must cover (rounded up to whole chunks).
    chunk_bytes : int
        A multiple of :func:`granularity`.

    Attributes
    ----------
    ptr : int
        The range's first address.
    made : int
        Physical allocations made (each ``chunk_bytes``).
    """

    def __init__(self, device_id: int, nbytes: int, chunk_bytes: int):
        lib = _driver()
        if lib is None:
            raise DeviceOutOfMemory("no CUDA driver library for a mapped pool")
        g = granularity(device_id)
        if not g or int(chunk_bytes) % g:
            raise DeviceOutOfMemory(f"a mapped pool's chunk of {chunk_bytes:,} bytes is not a "
                                    f"multiple of the device's granularity {g:,}")
        self.lib, self.device_id = lib, int(device_id)
        self.chunk_bytes = int(chunk_bytes)
        self.nchunks = max(1, -(-int(nbytes) // self.chunk_bytes))
        self.size = self.nchunks * self.chunk_bytes
        ptr = _u64(0)
        _call("cuMemAddressReserve",
              lib.cuMemAddressReserve(ctypes.byref(ptr), self.size, 0, 0, 0))
        self.ptr = int(ptr.value)
        self._prop = _prop(device_id)
        self._access = _AccessDesc()
        self._access.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
        self._access.location.id = self.device_id
        self._access.flags = _CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.handles = {}           # chunk -> its physical allocation
        self.spare = []             # allocations unmapped, kept for the next chunks
        self.made = 0

    def address(self, k: int) -> int:
        return self.ptr + int(k) * self.chunk_bytes

    def map(self, k: int) -> None:
        """Chunk ``k`` backed (a spare allocation, else a new one) and readable
        and writable by the device."""
        k = int(k)
        if k in self.handles:
            return
        if self.spare:
            h = self.spare.pop()
        else:
            hv = _u64(0)
            _call("cuMemCreate", self.lib.cuMemCreate(ctypes.byref(hv), self.chunk_bytes,
                                                       ctypes.byref(self._prop), 0))
            h = int(hv.value)
            self.made += 1
        try:
            _call("cuMemMap", self.lib.cuMemMap(self.address(k), self.chunk_bytes, 0, h, 0))
        except BaseException:
            self.spare.append(h)
            raise
        self.handles[k] = h
        _call("cuMemSetAccess", self.lib.cuMemSetAccess(self.address(k), self.chunk_bytes,
                                                        ctypes.byref(self._access), 1))

    def unmap(self, k: int) -> None:
        """Chunk ``k``'s memory back to the spares (the device must be done with it)."""
        h = self.handles.pop(int(k), None)
        if h is None:
            return
        _call("cuMemUnmap", self.lib.cuMemUnmap(self.address(k), self.chunk_bytes), fatal=True)
        self.spare.append(h)

    def close(self) -> None:
        """Every chunk unmapped, the allocations released, the range freed (the
        device must be done with it). Safe to call twice."""
        if self.ptr is None:
            return
        for k in list(self.handles):
            self.unmap(k)
        for h in self.spare:
            self.lib.cuMemRelease(h)
        self.spare = []
        self.lib.cuMemAddressFree(self.ptr, self.size)
        self.ptr = None

    def array(self, cp, n: int, dtype):
        """A CuPy array of ``n`` values over the range (it keeps this object alive)."""
        mem = cp.cuda.UnownedMemory(self.ptr, self.size, self, device_id=self.device_id)
        return cp.ndarray((int(n),), dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
