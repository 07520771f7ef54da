"""Lazy access to CuPy and a description of the GPU, without ever raising.

CuPy imports on machines without a GPU, but anything that touches the driver,
cuBLAS or ``cupyx.scipy.sparse.linalg`` fails there. Every GPU code path in
this package goes through :func:`import_cupy` and :func:`gpu_available`, so
that the package imports and runs its CPU path everywhere.

:func:`start_driver` starts the CUDA driver and the default device's context
on a thread of its own while a new process's first GPU call imports CuPy;
:func:`gpu_info` waits for it without the GIL (:func:`wait_for_driver`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import threading
from typing import Optional

__all__ = ["import_cupy", "gpu_available", "gpu_info", "device_attributes", "device_name",
           "is_cupy_array", "is_cupy_sparse", "start_driver", "wait_for_driver",
           "driver_library"]


def import_cupy():
    """Return the ``cupy`` module, or None when it cannot be imported.

    Returns
    -------
    module or None
        ``cupy`` when importable; None when it is not installed or its CUDA
        libraries are missing.
    """
    try:
        return importlib.import_module("cupy")
    except Exception:  # ImportError, or CUDA library loading errors
        return None


def gpu_available() -> bool:
    """True when CuPy imports and at least one CUDA device answers."""
    return gpu_info()["available"]


def gpu_info() -> dict:
    """Describe the GPU this process would use, or why there is none.

    Never raises. Where no CUDA driver library loads, CuPy is not imported
    (nothing could run on a device). The result is a fresh dict on each
    call: the device count and the current device are asked each time (a
    device that appears later is seen); only the fixed properties of a
    device id are read once per process (:func:`_device_properties`).

    Returns
    -------
    dict
        ``available`` (bool), ``reason`` (str: why not, or ``"ok"``),
        ``cupy_version``, and for an available device ``device_count``,
        ``name``, ``compute_capability`` (e.g. ``"90"``), ``total_memory``
        (bytes), ``multiprocessors`` and ``shared_memory_per_block_optin``.
    """
    info = {"available": False, "reason": "", "cupy_version": None}
    if _driver_library() is None:
        # no CUDA driver, so no device CuPy could use: answered without CuPy's
        # import (a few hundred ms), which a CPU-only host would pay at the first
        # call that asks
        info["reason"] = "no GPU found (no CUDA driver: libcuda.so.1 cannot be loaded)"
        return info
    cp = import_cupy()
    if cp is None:
        info["reason"] = ("no GPU support installed: cupy is absent (pip install "
                          "'scipy_gpuqr[cuda13]' or '[cuda12]')")
        return info
    info["cupy_version"] = cp.__version__
    wait_for_driver()
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver
        # without a GPU the runtime says "driver version is insufficient",
        # which reads like a version problem: say what it means first
        info["reason"] = f"no GPU found (no usable CUDA driver: {_short(exc)})"
        return info
    if count < 1:
        info["reason"] = "no GPU found (no CUDA device visible)"
        return info
    try:
        device = cp.cuda.Device()
        info.update(available=True, reason="ok", device_count=count,
                    device_id=device.id, **_device_properties(device.id))
    except Exception as exc:
        info["reason"] = f"CUDA device did not answer ({_short(exc)})"
    return info


#: Device attributes read by :func:`device_attributes`, under the names
#: ``cudaGetDeviceProperties`` gives them.
_ATTRIBUTES = {
    "multiProcessorCount": "cudaDevAttrMultiProcessorCount",
    "sharedMemPerBlockOptin": "cudaDevAttrMaxSharedMemoryPerBlockOptin",
    "maxThreadsPerMultiProcessor": "cudaDevAttrMaxThreadsPerMultiProcessor",
    "sharedMemPerMultiprocessor": "cudaDevAttrMaxSharedMemoryPerMultiprocessor",
    "regsPerMultiprocessor": "cudaDevAttrMaxRegistersPerMultiprocessor",
    "maxBlocksPerMultiProcessor": "cudaDevAttrMaxBlocksPerMultiprocessor",
}


@functools.lru_cache(maxsize=None)
def device_attributes(device_id: int) -> dict:
    """The occupancy facts of CUDA device ``device_id`` (multiprocessors, threads,
    shared memory, registers and blocks per multiprocessor, opt-in shared memory
    per block), keyed as ``cudaGetDeviceProperties`` names them, read once per
    process by ``cudaDeviceGetAttribute``.

    ``cudaGetDeviceProperties`` fills every property and took about 0.05 s of
    a new process's first GPU call (a millisecond a call after that); one
    attribute costs microseconds. Immutable hardware facts, not state.
    """
    rt = import_cupy().cuda.runtime
    return {key: int(rt.deviceGetAttribute(getattr(rt, attr), device_id))
            for key, attr in _ATTRIBUTES.items()}


def device_name(device_id: int) -> str:
    """The model name of CUDA device ``device_id`` (read once per process)."""
    return _device_properties(device_id)["name"]


def start_driver() -> Optional[threading.Thread]:
    """Start the CUDA driver and the primary context of the default device on a
    daemon thread (``gpuqr-driver-start``), once per process; returns the thread,
    or None where the calling thread has a current CUDA context already (the
    driver is started, and that context's device may not be the default one) or
    the driver library cannot be loaded.

    A new process's first GPU call spends about 0.2 s importing CuPy and,
    after that, about 0.2 s more in ``cuInit`` and the context's creation on
    its first CUDA call. Both steps run at once when this is called before the
    import: the driver's calls release the GIL, so the thread's work runs
    beside the import, and CuPy's runtime later finds the driver started and
    the context made (the primary context is the one the runtime uses; the
    thread keeps its reference for the process's lifetime, as the runtime
    does). The default device is the one CuPy uses on a thread that has
    selected none. Nothing here changes a result: a failure ends the thread
    silently, and the call's own first CUDA call starts the driver as before.
    """
    lib = _driver_library()
    if lib is None or _has_current_context(lib):
        return None
    return _driver_thread()


def wait_for_driver() -> None:
    """Wait for the thread of :func:`start_driver`, where this process started
    one, without holding the GIL (nothing where none was started).

    CuPy calls the CUDA runtime holding the GIL: its first call
    (``cudaGetDeviceCount``) while the thread's ``cuInit`` runs blocks every
    Python thread of the process behind it, so that nothing else of a new
    process's first call ran meanwhile (the analysis' files, the kernels'
    loads, R's layout from disk). Joining the thread first lets
    them run meanwhile; the context is then made, so CuPy's calls after it do
    not wait either.
    """
    if _driver_thread.cache_info().currsize:
        _driver_thread().join()


def driver_library():
    """``libcuda.so.1`` through ctypes (loaded once per process), or None where it
    cannot be loaded: for callers that talk to the driver beside CuPy."""
    return _driver_library()


@functools.lru_cache(maxsize=1)
def _driver_library():
    """``libcuda.so.1`` through ctypes (loaded once per process), or None."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def _has_current_context(lib) -> bool:
    """Whether the calling thread has a current CUDA context (False before ``cuInit``)."""
    ctx = ctypes.c_void_p()
    try:
        return lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and bool(ctx.value)
    except AttributeError:
        return False


@functools.lru_cache(maxsize=1)
def _driver_thread() -> threading.Thread:
    t = threading.Thread(target=_retain_primary_context, name="gpuqr-driver-start",
                         daemon=True)
    t.start()
    return t


def _retain_primary_context() -> None:
    """``cuInit`` and ``cuDevicePrimaryCtxRetain`` of device 0 (see :func:`start_driver`)."""
    lib = _driver_library()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    try:
        if lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(dev), 0) == 0:
            lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    except AttributeError:      # not a CUDA driver library: the call starts it itself
        pass


def _driver_name_and_memory(device_id: int):
    """``(name, total bytes)`` of device ``device_id`` from the CUDA driver
    (``cuDeviceGetName``, ``cuDeviceTotalMem``: no property query), or None
    where the driver library cannot be asked."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev, total = ctypes.c_int(), ctypes.c_size_t()
        name = ctypes.create_string_buffer(256)
        if (lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), int(device_id))
                or lib.cuDeviceGetName(name, len(name), dev)
                or lib.cuDeviceTotalMem_v2(ctypes.byref(total), dev)):
            return None
    except (OSError, AttributeError):
        return None
    return name.value.decode(errors="replace"), int(total.value)


@functools.lru_cache(maxsize=None)
def _device_properties(device_id: int) -> dict:
    """The fixed properties of CUDA device ``device_id`` (read once per process).

    A cache of immutable hardware facts, not state: name, compute
    capability, memory size and multiprocessor count do not change while a
    process runs. Callers receive a copy through :func:`gpu_info`. The name
    and memory size come from the driver and the rest from
    :func:`device_attributes`; ``cudaGetDeviceProperties`` only where the
    driver cannot be asked directly.
    """
    cp = import_cupy()
    attrs = device_attributes(device_id)
    named = _driver_name_and_memory(device_id)
    if named is None:
        props = cp.cuda.runtime.getDeviceProperties(device_id)
        named = _decode(props.get("name", b"")), int(props.get("totalGlobalMem", 0))
    return {"name": named[0],
            "compute_capability": cp.cuda.Device(device_id).compute_capability,
            "total_memory": named[1],
            "multiprocessors": attrs["multiProcessorCount"],
            "shared_memory_per_block_optin": attrs["sharedMemPerBlockOptin"]}


def is_cupy_array(x) -> bool:
    """True when ``x`` is a CuPy ndarray (checked without importing cupy)."""
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "device")


def is_cupy_sparse(x) -> bool:
    """True when ``x`` is a ``cupyx.scipy.sparse`` matrix (no cupy import)."""
    return type(x).__module__.startswith("cupyx.scipy.sparse")


def _decode(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 160 else text[:157] + "..."
