"""Kernel variants of the sparse-QR factorization (``build_kernels.py --check`` compiles them).

The uberkernel (``kernels/sparse_qr/uberkernel.cu``) is a template over the
value type, the tile edge, the bundle size, the threads per block and the way
a float64 TILE-32 Apply does its products (:data:`APPLY_VARIANTS`: scalar
loops or the FP64 tensor cores; :func:`apply_variant`).
``ENGINE_VARIANTS`` are the instantiations the engine launches; they and the
kernels reporting their shared memory are the only ones declared
(``KERNEL_VARIANTS``, read by :mod:`scipy_gpuqr._kernels`); at run time a
call compiles the variants of its value type only, and
:func:`prefetch_engine_kernels` compiles what a factorization (its dense
fronts' panel kernel included) and its solves use in parallel threads before
they are asked for, and loads the CUDA libraries the launch loop uses on
another thread meanwhile (those only the solves and rank decisions use once
the factorization first waits for the device: :func:`prefetch_later_libraries`).
Imports without cupy.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from typing import Mapping

import numpy as np

from ..._kernels import KernelUse, prefetch
from . import solve_kernels as sk
from .array_ops import array_ops_use
from .blas_warmup import start_blas_warmup
from .dense_panel import panel_kernel_use
from .finite_check import finite_check_use

__all__ = ["KERNEL_VARIANTS", "ENGINE_VARIANTS", "ENGINE_THREADS", "UBERKERNEL_FILE",
           "APPLY_VARIANTS", "DEFAULT_APPLY", "ENV_APPLY", "apply_variant", "kernel_name",
           "smem_kernel_name", "tile_smem_bytes", "engine_kernels",
           "prefetch_engine_kernels", "ENGINE_LIBRARIES", "LATER_LIBRARIES", "prefetch_libraries",
           "prefetch_later_libraries"]

#: The uberkernel's source file (relative to ``kernels/``).
UBERKERNEL_FILE = "sparse_qr/uberkernel.cu"

#: Threads per block of the engine's uberkernel variants.
ENGINE_THREADS = 256

#: (C type, TILE, BUNDLE, threads per block) the engine launches.
ENGINE_VARIANTS: tuple[tuple[str, int, int, int], ...] = (
    ("double", 32, 3, ENGINE_THREADS), ("float", 32, 3, ENGINE_THREADS),
)

_CTYPE = {"float64": "double", "float32": "float", "double": "double", "float": "float"}

#: How a float64 TILE-32 uberkernel does its Apply and Factorize (the kernel's
#: ``APPLY`` template argument, ``kernels/sparse_qr/apply.cuh``):
#: ``mma-async-lean``, the Apply on the FP64 tensor cores (``mma.sync``
#: m8n8k4, a warp per block of output tiles, padded conflict-free shared
#: arrays, the next column chunk copied into shared memory by ``cp.async``
#: while a chunk's last two products run) with the Factorize of three barriers
#: a column (``factorize.cuh``, KIND 1); ``scalar``: the scalar loops and the
#: first Factorize (float32 and other tiles always run these).
APPLY_VARIANTS: dict[str, int] = {"scalar": 0, "mma-async-lean": 4}

#: The Apply variant the engine runs (:data:`APPLY_VARIANTS`).
DEFAULT_APPLY = "mma-async-lean"

#: Environment variable naming another Apply variant (for comparisons: benchmarks
#: and tests), read when a kernel is named.
ENV_APPLY = "SCIPY_GPUQR_APPLY"


def apply_variant(ctype: str, tile: int, environ: Mapping[str, str] = os.environ) -> int:
    """The ``APPLY`` template argument of a variant: the one :data:`ENV_APPLY`
    names (:data:`DEFAULT_APPLY` when unset) for float64 with TILE 32, 0 (the
    scalar loops, the only kind there) for any other type or tile."""
    if _CTYPE[str(ctype)] != "double" or tile != 32:
        return 0
    name = environ.get(ENV_APPLY, "").strip() or DEFAULT_APPLY
    if name not in APPLY_VARIANTS:
        raise ValueError(f"{ENV_APPLY}={name!r}: one of {sorted(APPLY_VARIANTS)}")
    return APPLY_VARIANTS[name]


def kernel_name(ctype: str, tile: int, bundle: int, threads: int,
                apply: int | None = None) -> str:
    """Name expression of an uberkernel variant (``ctype``: 'double'/'float' or a
    dtype name; ``apply``: the ``APPLY`` argument, None: :func:`apply_variant`)."""
    c = _CTYPE[str(ctype)]
    a = apply_variant(c, tile) if apply is None else int(apply)
    return f"gpuqr::uberkernel<{c}, {tile}, {bundle}, {threads}, {a}>"


def smem_kernel_name(ctype: str, tile: int, bundle: int, apply: int | None = None) -> str:
    """Name expression of the kernel reporting a variant's shared memory."""
    c = _CTYPE[str(ctype)]
    a = apply_variant(c, tile) if apply is None else int(apply)
    return f"gpuqr::uberkernel_smem_bytes<{c}, {tile}, {bundle}, {a}>"


def tile_smem_bytes(tile: int, bundle: int, itemsize: int = 8, apply: int | None = None) -> int:
    """Dynamic shared memory (bytes) of a variant (mirrors the kernel's ``*Smem``
    structs; the tensor-core Apply pads its rows to 4 mod 16)."""
    ld = tile + 1
    fac = bundle * tile * ld + 2 * tile * ld + 64 + tile
    ctype = "double" if itemsize == 8 else "float"
    a = apply_variant(ctype, tile) if apply is None else int(apply)
    pad = 4 if (a == 4 and ctype == "double" and tile == 32) else 1
    w = 32 if tile >= 64 else tile
    app = (bundle * tile + tile) * (tile + pad) + (bundle * tile + tile) * (w + pad)
    return itemsize * max(fac, app)


def _all_names() -> tuple[str, ...]:
    combos = sorted(set(ENGINE_VARIANTS))
    default = {}            # the default Apply, whatever the environment says
    names = [kernel_name(*c, apply=apply_variant(c[0], c[1], default)) for c in combos]
    names += sorted({smem_kernel_name(c, t, b, apply_variant(c, t, default))
                     for c, t, b, _ in combos})
    return tuple(names)


#: Name expressions to compile, per source file (relative to ``kernels/``): the
#: engine's variants with the default Apply (another one :data:`ENV_APPLY`
#: names is compiled on its own when asked for).
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {UBERKERNEL_FILE: _all_names()}


def engine_kernels(dtype, tile: int = 32, bundle: int = 3, *, solve: bool = True,
                   dense: bool = True) -> list:
    """What a GPU factorization of ``dtype`` values (its stages' finite check;
    with ``dense``, its dense fronts' panel kernel; with ``solve``, its solves)
    compiles: a
    :class:`~scipy_gpuqr._kernels.KernelUse` per kernel file, for
    :func:`scipy_gpuqr._kernels.prefetch` (nothing for a variant the engine
    does not have). Only the value type's own variant groups, the ones the
    engine launches."""
    ctype = "float" if np.dtype(dtype) == np.float32 else "double"
    if (ctype, tile, bundle, ENGINE_THREADS) not in ENGINE_VARIANTS:
        return []
    value = np.float32 if ctype == "float" else np.float64
    out = [KernelUse(UBERKERNEL_FILE, KERNEL_VARIANTS[UBERKERNEL_FILE],
                     (kernel_name(ctype, tile, bundle, ENGINE_THREADS),)),
           finite_check_use(value), array_ops_use()]
    if dense:
        out.append(panel_kernel_use(value))
    if solve:
        if (ctype, tile, bundle) in sk.APPLYQ_VARIANTS:
            out.append(KernelUse(sk.APPLYQ_FILE, sk.KERNEL_VARIANTS[sk.APPLYQ_FILE],
                                 (sk.applyq_name(ctype, tile, bundle, True),)))
        out.append(KernelUse(sk.RSOLVE_FILE, sk.KERNEL_VARIANTS[sk.RSOLVE_FILE],
                             (sk.rsolve_name(ctype, False),)))
    return out


def prefetch_engine_kernels(dtype, tile: int = 32, bundle: int = 3, *,
                            solve: bool = True, dense: bool = True) -> list:
    """Start compiling :func:`engine_kernels` on worker threads, in parallel (each
    module once per process; nothing when compiled or being compiled already),
    loading :data:`ENGINE_LIBRARIES` on one more and setting cuBLAS up on
    another (:mod:`.blas_warmup`; both once per process).
    Needs a GPU. Returns the compiling threads."""
    import cupy
    prefetch_libraries()
    start_blas_warmup(cupy.cuda.Device().id, np.dtype(dtype).name)
    return prefetch(engine_kernels(dtype, tile, bundle, solve=solve, dense=dense))


#: Modules of CuPy a GPU factorization's launch loop imports when first used;
#: importing one loads its CUDA libraries (cuBLAS and cuBLASLt, cuSOLVER),
#: which takes a few tenths of a second in a new process.
ENGINE_LIBRARIES: tuple[str, ...] = (
    "cupy_backends.cuda.libs.cublas",       # dense fronts' GEMMs (dense_front._Cublas)
    "cupy_backends.cuda.libs.cusolver",     # geqrf panels, dense rank decisions
)

#: Modules of CuPy only the solves and rank decisions import (after the
#: factorization): mostly Python, whose import beside a new process's first
#: launches took the interpreter's lock from the call's thread while it loaded
#: its kernels; imported once the factorization first waits for the device
#: (:func:`prefetch_later_libraries`).
LATER_LIBRARIES: tuple[str, ...] = (
    "cupyx.scipy.linalg",                   # solve_triangular (dense rank decisions)
    "cupy_backends.cuda.libs.cusparse",     # products with R's singleton block
    "cupyx.scipy.sparse",                   # R's singleton block, CuPy right-hand sides
)


def prefetch_libraries() -> threading.Thread:
    """Import :data:`ENGINE_LIBRARIES` on a daemon thread, once per process
    (also where callers ask at the same moment: a new process's first call
    asks from its prefetch thread and its own thread a few milliseconds apart,
    and a cache alone let both start a thread).

    Only imports (the libraries' loading); no handle or context is made there,
    CuPy's handles being per thread. A module the main thread imports
    meanwhile waits for that import to finish (Python's per-module import
    lock). A failure is left for the code that imports the module itself.
    """
    with _LIBRARIES_LOCK:
        return _libraries_thread()


#: Makes :func:`prefetch_libraries`' look-up and start one step.
_LIBRARIES_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _libraries_thread(later: bool = False) -> threading.Thread:
    t = threading.Thread(target=_import_all,
                         args=(LATER_LIBRARIES if later else ENGINE_LIBRARIES,),
                         name="gpuqr-later-libraries" if later else "gpuqr-libraries",
                         daemon=True)
    t.start()
    return t


prefetch_libraries.cache_clear = _libraries_thread.cache_clear


def prefetch_later_libraries() -> threading.Thread:
    """Import :data:`LATER_LIBRARIES` on a daemon thread (``gpuqr-later-libraries``),
    once per process, as :func:`prefetch_libraries` does the launch loop's.

    Called where a factorization first waits for the device (the end of a
    stage), so that the imports take the interpreter's lock while the call's
    thread waits without it, not while it loads its kernels and enqueues its
    first launches; the solves and the rank decision after it find them
    imported (or wait for the import under way).
    """
    with _LIBRARIES_LOCK:
        return _libraries_thread(True)


def _import_all(names) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - raised again where the module is used
            pass
