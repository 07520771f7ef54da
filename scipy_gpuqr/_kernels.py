"""Finding, flattening, compiling and caching the CUDA sources in ``kernels/``.

One mechanism serves three users: the engines at run time (``load_module``,
through ``cupy.RawModule``), ``build_kernels.py`` (warm the cache for the
present GPU) and ``build_kernels.py --check`` (NVRTC only, no GPU).

Sources are *flattened* before compilation: every ``#include "x.cuh"`` of a
file in ``kernels/`` is replaced by that file's text, recursively. The text
handed to NVRTC is therefore self-contained, so CuPy's on-disk cache key
(source + options) covers every header, and the check compiles exactly what
the run time compiles, with the same options.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["kernels_dir", "kernel_files", "flatten_source", "COMPILE_OPTIONS",
           "registered_variants", "load_module", "check_compile",
           "source_hash"]

#: NVRTC options used by the run time and the check alike.
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++17",)

#: Modules that declare ``KERNEL_VARIANTS = {"file.cu": ("name<expr>", ...)}``.
#: Each feature adds its module here; the modules must import without cupy.
VARIANT_MODULES: tuple[str, ...] = (
    "scipy_gpuqr.batched._kernel_registry",
    "scipy_gpuqr._engine.gpu.factorize_kernels",
    "scipy_gpuqr._engine.gpu.solve_kernels",
)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernels_dir() -> Path:
    """The folder holding the ``.cu``/``.cuh`` sources.

    In an installed wheel it is the package data folder
    ``scipy_gpuqr/kernels``; in a source checkout (or editable install) it is
    the top-level ``kernels/`` beside the package.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if candidate.is_dir() and any(candidate.rglob("*.cu*")):
            return candidate
    raise FileNotFoundError(
        f"CUDA kernel sources not found in {here / 'kernels'} or "
        f"{here.parent / 'kernels'}; the installation is incomplete")


def kernel_files() -> list[Path]:
    """Every ``.cu`` translation unit under ``kernels/``, sorted by path."""
    return sorted(kernels_dir().rglob("*.cu"))


def flatten_source(name: str, directory: Path | None = None) -> str:
    """Return the text of ``kernels/name`` with local includes inlined.

    ``name`` is a path relative to ``kernels/`` (``"sparse_qr/uberkernel.cu"``).
    An ``#include "x.cuh"`` is looked up beside the including file, then in
    ``kernels/`` itself. Each header is inlined once (later includes of the same header are
    dropped, as ``#pragma once`` would do).
    """
    directory = kernels_dir() if directory is None else directory
    seen: set[str] = set()

    def locate(inc: str, including: str) -> str:
        # beside the including file first (kernels/sparse_qr/, kernels/batched/),
        # then the kernels/ root (common.cuh)
        folder = Path(including).parent
        for candidate in (folder / inc, Path(inc)):
            if (directory / candidate).is_file():
                return candidate.as_posix()
        raise FileNotFoundError(f"{including}: included file {inc!r} not found "
                                f"in {directory / folder} or {directory}")

    def expand(fname: str, stack: tuple[str, ...]) -> str:
        if fname in stack:
            raise ValueError(f"include cycle: {' -> '.join(stack + (fname,))}")
        path = directory / fname
        if not path.is_file():
            raise FileNotFoundError(f"kernel source {fname!r} not found in {directory}")
        seen.add(fname)
        text = path.read_text()
        text = re.sub(r"^\s*#\s*pragma\s+once\s*$", "", text, flags=re.MULTILINE)

        def repl(match: re.Match) -> str:
            inc = locate(match.group(1), fname)
            if inc in seen:
                return f"// (already included: {inc})"
            return (f"// begin {inc}\n" + expand(inc, stack + (fname,))
                    + f"\n// end {inc}")

        return _INCLUDE.sub(repl, text)

    return expand(name, ())


def source_hash(name: str) -> str:
    """Short SHA-256 of the flattened source (changes with any header)."""
    return hashlib.sha256(flatten_source(name).encode()).hexdigest()[:16]


def registered_variants() -> dict[str, tuple[str, ...]]:
    """Collect ``{file: name_expressions}`` from :data:`VARIANT_MODULES`.

    Modules that do not exist yet are skipped; a file listed by two modules
    gets the union of their expressions.
    """
    out: dict[str, tuple[str, ...]] = {}
    for modname in VARIANT_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and modname.startswith(exc.name):
                continue
            raise
        for fname, exprs in getattr(mod, "KERNEL_VARIANTS", {}).items():
            out[fname] = tuple(dict.fromkeys(out.get(fname, ()) + tuple(exprs)))
    return out


@functools.lru_cache(maxsize=None)
def _load_module_cached(name: str, name_expressions: tuple[str, ...],
                        options: tuple[str, ...], digest: str):
    import cupy
    return cupy.RawModule(code=flatten_source(name), options=options,
                          name_expressions=name_expressions or None)


def load_module(name: str, name_expressions: Sequence[str] = (),
                options: Sequence[str] = ()):
    """Compile (or fetch from cache) ``kernels/name`` as a ``cupy.RawModule``.

    The in-process cache is keyed by the flattened source's hash, so an
    edited header is recompiled; CuPy's on-disk cache (``CUPY_CACHE_DIR``)
    keeps cubins between processes.

    Parameters
    ----------
    name : str
        File name in ``kernels/``, e.g. ``"batched/lu_warp.cu"``.
    name_expressions : sequence of str
        Template instantiations to compile, e.g. ``("lu_small<double, 8>",)``.
    options : sequence of str
        NVRTC options in addition to :data:`COMPILE_OPTIONS`.
    """
    opts = tuple(COMPILE_OPTIONS) + tuple(options)
    return _load_module_cached(name, tuple(name_expressions), opts,
                               source_hash(name))


def _compile_one(fname: str, arch: str, exprs: tuple[str, ...]) -> dict:
    """NVRTC-compile one flattened file for one architecture (no GPU)."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(flatten_source(fname), fname, [], [])
    ok, log, size = True, "", 0
    try:
        for expr in exprs:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *COMPILE_OPTIONS])
            size = len(nvrtc.getCUBIN(prog))
            for expr in exprs:
                nvrtc.getLoweredName(prog, expr)
            log = nvrtc.getProgramLog(prog)
        except Exception as exc:  # NVRTCError
            ok = False
            log = f"{exc}\n{nvrtc.getProgramLog(prog)}"
    finally:
        nvrtc.destroyProgram(prog)
    return {"file": fname, "arch": arch, "ok": ok, "variants": len(exprs),
            "cubin_bytes": size, "log": log.strip()}


def check_compile(archs: Iterable[str] = ("sm_80", "sm_90"),
                  files: Iterable[str] | None = None, jobs: int | None = None) -> list[dict]:
    """Compile every kernel file and variant with NVRTC; needs no GPU.

    Uses ``cupy.cuda.nvrtc`` directly (the ``nvidia-cuda-nvrtc`` wheel
    provides the library), with the flattened source and
    :data:`COMPILE_OPTIONS`, i.e. exactly what :func:`load_module` compiles.

    Parameters
    ----------
    archs : iterable of str
        Targets, e.g. ``("sm_80", "sm_90")``.
    files : iterable of str or None
        File names in ``kernels/``; None means every ``.cu`` file.
    jobs : int or None
        Worker processes (None: one per CPU; 1: compile in this process).

    Returns
    -------
    list of dict
        One per (file, arch): ``file``, ``arch``, ``ok``, ``variants``,
        ``cubin_bytes``, ``log``.
    """
    variants = registered_variants()
    names = ([_relative_name(p) for p in kernel_files()] if files is None
             else list(files))
    work = [(f, a, variants.get(f, ())) for f in names for a in archs]
    jobs = min(len(work), jobs or os.cpu_count() or 1)
    if jobs <= 1:
        return [_compile_one(*w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_compile_one, *zip(*work)))


def warm_cache(cache_dir: str | None = None) -> list[dict]:
    """Compile every registered variant for the present GPU into the cache.

    Parameters
    ----------
    cache_dir : str or None
        Where CuPy keeps cubins (``CUPY_CACHE_DIR``); None keeps CuPy's
        default (``~/.cupy/kernel_cache``) or the variable already set.
        CuPy reads the variable when it compiles, so it is set for this
        process; call this from a process made for it (the CLI does).

    Returns
    -------
    list of dict
        ``file``, ``variants``, ``seconds`` per kernel file.
    """
    if cache_dir is not None:
        os.environ["CUPY_CACHE_DIR"] = str(cache_dir)
    variants = registered_variants()
    out = []
    for path in kernel_files():
        name = _relative_name(path)
        exprs = variants.get(name, ())
        t0 = time.perf_counter()
        module = load_module(name, exprs)
        module.compile()
        out.append({"file": name, "variants": len(exprs),
                    "seconds": time.perf_counter() - t0})
    return out


def _relative_name(path: Path) -> str:
    """``kernels/sparse_qr/uberkernel.cu`` -> ``"sparse_qr/uberkernel.cu"``."""
    return path.relative_to(kernels_dir()).as_posix()
