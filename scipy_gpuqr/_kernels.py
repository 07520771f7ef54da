"""Finding, flattening, compiling and caching the CUDA sources in ``kernels/``.

One mechanism serves three users: the engines at run time (``load_module``,
through ``cupy.RawModule``), ``build_kernels.py`` (warm the cache for the
present GPU) and ``build_kernels.py --check`` (NVRTC only, no GPU).

At run time a call compiles only what it uses: a file's variants are
compiled when first asked for, with the file's other variants of the same
value type only (:class:`LazyModule`, :func:`variant_group`), and what a call
will need next can be compiled meanwhile on worker threads (:func:`prefetch`;
NVRTC releases the GIL, so modules compile in parallel). A file whose kernels
need a cooperative launch (a grid-wide barrier: every block resident) is
declared so by its module (``COOPERATIVE_FILES``) and loaded with
``cooperative=True``; it compiles to the same cubin (and cache entry). A file
of a large template family whose calls each need one instance (the batched
n <= 32 kernels: one per order and type) is declared by its module
(``SEPARATE_FILES``): the run time compiles each of its variants alone, and so
do the cache warm-up and the check, because CuPy's cache key holds the name
expressions compiled together.

A module found in CuPy's kernel cache still costs a new process one NVRTC
run before the cache is looked at: CuPy's cache key holds the PTX NVRTC makes
of an empty file with the module's options (``_empty_file_preprocess_cache``,
made once per process and option set). That PTX depends only on the loaded
NVRTC, the architecture and the options, so it is kept in the store with the
NVRTC library it came from and put back in CuPy's table before a module is
asked for (:func:`_seed_preprocess`): CuPy then finds the same key without
the run.

Sources are *flattened* before compilation: every ``#include "x.cuh"`` of a
file in ``kernels/`` is replaced by that file's text, recursively. The text
handed to NVRTC is therefore self-contained, so CuPy's on-disk cache key
(source + options) covers every header, and the check compiles exactly what
the run time compiles, with the same options.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from . import _store
from ._mapped_files import mapped_paths

__all__ = ["kernels_dir", "kernel_files", "flatten_source", "COMPILE_OPTIONS",
           "registered_variants", "registered_cooperative", "registered_separate",
           "load_module", "check_compile",
           "source_hash", "LazyModule", "KernelUse", "variant_group", "prefetch"]

#: NVRTC options used by the run time and the check alike.
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++17",)

#: Modules that declare ``KERNEL_VARIANTS = {"file.cu": ("name<expr>", ...)}``
#: (and, optionally, ``COOPERATIVE_FILES``: files launched cooperatively;
#: ``SEPARATE_FILES``: files whose variants the run time compiles one by one).
#: Each feature adds its module here; the modules must import without cupy.
VARIANT_MODULES: tuple[str, ...] = (
    "scipy_gpuqr.batched._kernel_registry",
    "scipy_gpuqr._engine.gpu.factorize_kernels",
    "scipy_gpuqr._engine.gpu.solve_kernels",
    "scipy_gpuqr._engine.gpu.dense_panel",
    "scipy_gpuqr._engine.gpu.finite_check",
    "scipy_gpuqr._iterative.block",
)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


@functools.lru_cache(maxsize=None)
def kernels_dir() -> Path:
    """The folder holding the ``.cu``/``.cuh`` sources.

    In an installed wheel it is the package data folder
    ``scipy_gpuqr/kernels``; in a source checkout (or editable install) it is
    the top-level ``kernels/`` beside the package. Looked up once per process
    (every module lookup asks for it).
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
    return _flatten(name, kernels_dir() if directory is None else directory)[0]


def _flatten(name: str, directory: Path) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """:func:`flatten_source`'s text, the files it read and the files it looked for
    and did not find before an include's file (relative names: one created
    there would change the text)."""
    seen: dict[str, None] = {}
    absent: dict[str, None] = {}

    def locate(inc: str, including: str) -> str:
        # beside the including file first (kernels/sparse_qr/, kernels/batched/),
        # then the kernels/ root (common.cuh)
        folder = Path(including).parent
        for candidate in (folder / inc, Path(inc)):
            if (directory / candidate).is_file():
                return candidate.as_posix()
            absent[candidate.as_posix()] = None
        raise FileNotFoundError(f"{including}: included file {inc!r} not found "
                                f"in {directory / folder} or {directory}")

    def expand(fname: str, stack: tuple[str, ...]) -> str:
        if fname in stack:
            raise ValueError(f"include cycle: {' -> '.join(stack + (fname,))}")
        path = directory / fname
        if not path.is_file():
            raise FileNotFoundError(f"kernel source {fname!r} not found in {directory}")
        seen[fname] = None
        text = path.read_text()
        text = re.sub(r"^\s*#\s*pragma\s+once\s*$", "", text, flags=re.MULTILINE)

        def repl(match: re.Match) -> str:
            inc = locate(match.group(1), fname)
            if inc in seen:
                return f"// (already included: {inc})"
            return (f"// begin {inc}\n" + expand(inc, stack + (fname,))
                    + f"\n// end {inc}")

        return _INCLUDE.sub(repl, text)

    text = expand(name, ())
    return text, tuple(seen), tuple(absent)


def _stamp(directory: Path, files: Sequence[str]) -> tuple | None:
    """(modification time, size) of each file; None when one is gone."""
    try:
        return tuple((st.st_mtime_ns, st.st_size)
                     for st in (os.stat(directory / f) for f in files))
    except OSError:
        return None


class _Hashes:
    """Source hashes of this process, each kept with the files it was made
    from and their (modification time, size): a later :func:`source_hash`
    of the same file stats them instead of reading and flattening them again
    (an edited header still gives a new hash). A hash whose files changed in
    the last :data:`_RACY_SECONDS` is not kept (an edit in the same clock tick
    as the read would keep the stamp of a text that was not hashed).

    A new process first looks the file up in the store's record
    (:func:`_recorded_hash`): a hash an earlier process made is taken where
    every file it read has the inode, modification time and size recorded
    with it and no file it looked for and did not find exists now; only
    otherwise are the files read, flattened and hashed (and the hash
    recorded, behind the caller)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._table: dict = {}

    def get(self, name: str, directory: Path) -> str:
        key = (str(directory), name)
        with self._lock:
            got = self._table.get(key)
        if got is not None and _unchanged(directory, got[0], got[1], got[3]):
            return got[2]
        rec = _recorded_hash(directory, name)
        if rec is None:
            text, files, absent = _flatten(name, directory)
            digest = hashlib.sha256(text.encode()).hexdigest()[:16]
            stamp = _record_hash(directory, name, files, absent, digest)
        else:                   # the files were stat'ed to check the record
            files, absent, digest, stamp = rec
        recent = time.time_ns() - _RACY_SECONDS * 10**9
        if stamp is not None and all(t < recent for t, _ in stamp):
            with self._lock:
                self._table[key] = (files, stamp, digest, absent)
        return digest


def _unchanged(directory: Path, files, stamp, absent) -> bool:
    """Whether ``files`` have the (modification time, size) ``stamp`` and none of
    ``absent`` exists."""
    return _stamp(directory, files) == stamp and not any(
        os.path.lexists(directory / a) for a in absent)


#: Files modified this recently are hashed again at every lookup.
_RACY_SECONDS = 2


def _record_name(directory: Path, name: str) -> str | None:
    """The store record's name of ``name``'s hash: the folder, the file and the
    stamp of this module (whose flattening rules make the text hashed); None
    where this module cannot be stamped."""
    try:
        if _store.folder() is None:
            return None
    except Exception:                      # noqa: BLE001 - best effort: no record
        return None
    rules = _store.source_stamp(Path(__file__).resolve().parent, ("_kernels.py",))
    return json.dumps(["kernel source", str(directory), name, rules]) if rules else None


def _recorded_hash(directory: Path, name: str):
    """``(files, absent, digest, stamp)`` an earlier process recorded for
    ``name`` (files: those it read, absent: those it looked for and did not
    find; ``stamp``: the files' (modification time, size) as :func:`_stamp`
    gives it, from the one stat that checked them), where every file it read is
    unchanged (inode, modification time, size, none modified in the last
    seconds) and none of those it did not find exists; else None."""
    where = _record_name(directory, name)
    rec = _store.recorded(where) if where is not None else None
    if rec is None:
        return None
    files, absent, digest = rec.get("files"), rec.get("absent"), rec.get("stamp")
    if not (isinstance(files, list) and files and isinstance(absent, list)
            and isinstance(digest, str) and digest
            and all(isinstance(f, str) for f in files + absent)):
        return None
    ids = _store.file_ids(directory, files)
    if ids is None or ids != rec.get("ids"):
        return None
    if any(os.path.lexists(directory / a) for a in absent):
        return None
    return tuple(files), tuple(absent), digest, tuple((m, size) for _, m, size in ids)


def _record_hash(directory: Path, name: str, files, absent, digest: str) -> tuple | None:
    """Record ``name``'s hash with its files' ids in the store (nothing where one
    was modified in the last seconds, or there is no store); return the files'
    (modification time, size) as :func:`_stamp` gives it, from the stat that
    took their ids where there was one (None: a file is gone)."""
    where = _record_name(directory, name)
    ids = _store.file_ids(directory, files) if where is not None else None
    if ids is None:
        return _stamp(directory, files)
    _store.record(where, {"files": list(files), "absent": list(absent), "ids": ids,
                          "stamp": digest})
    return tuple((m, size) for _, m, size in ids)


_HASHES = _Hashes()


def source_hash(name: str) -> str:
    """Short SHA-256 of the flattened source (changes with any header).

    Made once per process per file set: later calls compare the files'
    modification times and sizes (a module lookup on a call's path stats a
    dozen files instead of reading and flattening them); and recorded in the
    store between processes (:class:`_Hashes`), so a new process's first
    call stats the files instead of reading them.
    """
    return _HASHES.get(name, kernels_dir())


def _variant_modules() -> list:
    """The modules of :data:`VARIANT_MODULES` that exist."""
    mods = []
    for modname in VARIANT_MODULES:
        try:
            mods.append(importlib.import_module(modname))
        except ModuleNotFoundError as exc:
            if exc.name and modname.startswith(exc.name):
                continue
            raise
    return mods


def registered_variants() -> dict[str, tuple[str, ...]]:
    """Collect ``{file: name_expressions}`` from :data:`VARIANT_MODULES`.

    Modules that do not exist yet are skipped; a file listed by two modules
    gets the union of their expressions.
    """
    out: dict[str, tuple[str, ...]] = {}
    for mod in _variant_modules():
        for fname, exprs in getattr(mod, "KERNEL_VARIANTS", {}).items():
            out[fname] = tuple(dict.fromkeys(out.get(fname, ()) + tuple(exprs)))
    return out


def registered_cooperative() -> frozenset:
    """The files whose kernels are launched cooperatively (``COOPERATIVE_FILES``
    of :data:`VARIANT_MODULES`)."""
    return frozenset(f for mod in _variant_modules()
                     for f in getattr(mod, "COOPERATIVE_FILES", ()))


def registered_separate() -> frozenset:
    """The files whose variants are compiled one by one (``SEPARATE_FILES`` of
    :data:`VARIANT_MODULES`): the run time loads each variant of them as a
    module of its own, so the warm-up and the check compile them that way too."""
    return frozenset(f for mod in _variant_modules()
                     for f in getattr(mod, "SEPARATE_FILES", ()))


def compile_units(fname: str, exprs: Sequence[str], separate: bool) -> list[tuple[str, ...]]:
    """The name-expression sets the run time compiles of ``fname``: each variant
    alone for a ``separate`` file, else one set per :func:`variant_group`
    (``[()]``, the whole file, when it declares no variants)."""
    if not exprs:
        return [()]
    if separate:
        return [(e,) for e in exprs]
    return list(dict.fromkeys(variant_group(e, exprs) for e in exprs))


#: C type names that tell a variant's value type apart (a call runs in one).
_VALUE_TYPES = ("double", "float", "__half", "half", "int", "long long")


def variant_group(expr: str, name_expressions: Sequence[str]) -> tuple[str, ...]:
    """The name expressions compiled together with ``expr``: those of
    ``name_expressions`` with the same value types among their template
    arguments (a float64 call compiles the float64 variants of a file, never
    its float32 ones), sorted: one key per group whichever variant is asked
    for first (the module table and the prefetch threads are keyed by it, so a
    group compiles once, not once per variant asked for first); ``(expr,)``
    when it is not declared, ``()`` (the whole file) when the file declares
    none.
    """
    exprs = tuple(name_expressions)
    if not exprs:
        return ()                       # no templates: the whole file, by kernel names
    if expr not in exprs:
        return (expr,)

    def types(e: str) -> frozenset:
        args = e[e.find("<") + 1:e.rfind(">")] if "<" in e else ""
        words = {w.strip() for w in args.split(",")}
        return frozenset(t for t in _VALUE_TYPES if t in words)

    mine = types(expr)
    return tuple(sorted(e for e in exprs if types(e) == mine))


class _Compiled:
    """One ``cupy.RawModule`` per (file, group, options, source, cooperative),
    compiled once per process even when several threads ask at once (one lock
    per module)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._modules: dict = {}
        self._requested: set = set()

    def request(self, keys: Iterable) -> list:
        """The keys of ``keys`` (what :func:`prefetch` was asked for: a kernel use
        and a device) not asked for before in this process; marks them asked."""
        with self._lock:
            new = [k for k in dict.fromkeys(keys) if k not in self._requested]
            self._requested.update(new)
            return new

    def ready(self, name: str, group: tuple, options: tuple, digest: str,
              cooperative: bool = False) -> bool:
        """Whether that module was compiled already (or is being compiled)."""
        with self._lock:
            return (name, group, options, digest, bool(cooperative)) in self._modules

    def claim(self, name: str, group: tuple, options: tuple, digest: str,
              cooperative: bool = False) -> bool:
        """Mark that module as being compiled; False when it was already (then
        nobody else need start it)."""
        key = (name, group, options, digest, bool(cooperative))
        with self._lock:
            if key in self._modules:
                return False
            self._modules[key] = [threading.Lock(), None]
            return True

    def get(self, name: str, group: tuple, options: tuple, digest: str, device: int | None,
            cooperative: bool = False):
        key = (name, group, options, digest, bool(cooperative))
        with self._lock:
            entry = self._modules.get(key)
            if entry is None:
                entry = self._modules[key] = [threading.Lock(), None]
        with entry[0]:
            if entry[1] is None:
                import cupy
                with cupy.cuda.Device(device):
                    seeded = _seed_preprocess()
                    mod = cupy.RawModule(code=flatten_source(name), options=options,
                                         name_expressions=group or None,
                                         enable_cooperative_groups=bool(cooperative))
                    mod.compile()                   # compiles (or loads the cubin) now
                    _remember_preprocess(seeded)
                entry[1] = mod
            return entry[1]

    def clear(self) -> None:
        with self._lock:
            self._modules.clear()
            self._requested.clear()


#: Name of the store record of NVRTC's empty-file PTX (:func:`_seed_preprocess`).
PREPROCESS_RECORD = "nvrtc empty-file preprocess"
#: Option sets kept in that record at most (the run time uses one).
PREPROCESS_MAX = 16


def _nvrtc_identity(compiler) -> list | None:
    """The NVRTC library this process loaded: its version, path, size and
    modification time (its line of ``/proc/self/maps``, once CuPy has loaded
    it), or None where it cannot be told (another system, no NVRTC, two of them).

    The empty file's PTX names the NVRTC build, which the version (major,
    minor) alone does not: a record made with another build of the same
    version is not used."""
    try:
        version = [int(v) for v in compiler._get_nvrtc_version()]
        paths = [p for p in mapped_paths("/libnvrtc.so") if "/libnvrtc.so" in p]
        if len(paths) != 1:
            return None
        path = paths[0]
        st = os.stat(path)
    except Exception:                      # noqa: BLE001 - no record: CuPy runs NVRTC
        return None
    return [version, path, int(st.st_size), int(st.st_mtime_ns)]


def _preprocess_record_name(compiler) -> str | None:
    """The store record's name for this process's NVRTC (None: none can be kept)."""
    ident = _nvrtc_identity(compiler)
    return None if ident is None else json.dumps([PREPROCESS_RECORD, ident])


def _as_tuple(value):
    """A JSON list back into the tuple it was (recursively; other values as they are)."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def _preprocess_table(compiler):
    table = getattr(compiler, "_empty_file_preprocess_cache", None)
    return table if isinstance(table, dict) else None


#: One thread seeds CuPy's table; the others wait for it (:func:`_seed_preprocess`).
_SEED_LOCK = threading.Lock()


def _seed_preprocess() -> frozenset:
    """:func:`_seed_table` of CuPy's compiler, once per process (the first caller
    does it, the others wait for it and get its answer): the module lookups'
    thread asks first (:func:`_prefetch_uses`), so that a call's own thread
    finds it done."""
    with _SEED_LOCK:
        return _seed_once()


@functools.lru_cache(maxsize=1)
def _seed_once() -> frozenset:
    from cupy.cuda import compiler
    return _seed_table(compiler)


def _seed_table(compiler) -> frozenset:
    """Put the recorded empty-file PTX of this process's NVRTC into CuPy's table
    (``compiler._empty_file_preprocess_cache``, ``compiler`` being CuPy's
    compiler module), before the first module is compiled or loaded; returns
    the option sets (CuPy's keys) the record holds. Never replaces an entry
    CuPy made.

    The key of an entry is CuPy's own (architecture, options, NVRTC version,
    backend, the architecture's flags), so an entry is only used where CuPy
    would compute that same key; the record is NVRTC's build's
    (:func:`_nvrtc_identity`), so the PTX is the one CuPy would make."""
    table = _preprocess_table(compiler)
    name = _preprocess_record_name(compiler) if table is not None else None
    rec = _store.recorded(name) if name is not None else None
    entries = rec.get("entries") if rec is not None else None
    known = set()
    for item in entries if isinstance(entries, list) else ():
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)
                and isinstance(item[1], str)):
            continue
        env = _as_tuple(item[0])
        known.add(env)
        table.setdefault(env, item[1])
    return frozenset(known)


def _remember_preprocess(seeded: frozenset, compiler=None) -> None:
    """Record CuPy's empty-file PTX table for this process's NVRTC where it holds an
    option set the record did not (``seeded``: what :func:`_seed_preprocess`
    found recorded); written behind the caller, nothing without a store."""
    if compiler is None:
        from cupy.cuda import compiler
    table = _preprocess_table(compiler)
    if table is None:
        return
    items = [(env, base) for env, base in list(table.items())
             if isinstance(env, tuple) and isinstance(base, str)]
    if not items or all(env in seeded for env, _ in items):
        return
    name = _preprocess_record_name(compiler)
    if name is not None:
        _store.record(name, {"entries": [[list(env), base]
                                         for env, base in items[:PREPROCESS_MAX]]})


#: The compiled modules of this process (kernels are made once per process; the
#: table holds at most one module per declared variant group and source).
_COMPILED = _Compiled()


class LazyModule:
    """A kernel file whose variants are compiled when first asked for.

    :meth:`get_function` compiles the variant asked for together with its
    group (:func:`variant_group`: the file's declared variants of the same
    value type) and nothing else; :meth:`prefetch` starts compiling groups on
    worker threads (NVRTC runs without the GIL, so independent modules compile
    in parallel).
    With ``cooperative``, its kernels launch with ``cuLaunchCooperativeKernel``.
    """

    def __init__(self, name: str, name_expressions: tuple, options: tuple, digest: str,
                 cooperative: bool = False):
        self.name = name
        self.name_expressions = name_expressions
        self.options = options
        self.digest = digest
        self.cooperative = bool(cooperative)

    def _module(self, expr: str, device=None):
        group = variant_group(expr, self.name_expressions)
        return _COMPILED.get(self.name, group, self.options, self.digest, device,
                             self.cooperative)

    def ready(self, expr: str) -> bool:
        """Whether the group of ``expr`` was compiled in this process (or is being)."""
        return _COMPILED.ready(self.name, variant_group(expr, self.name_expressions),
                               self.options, self.digest, self.cooperative)

    def get_function(self, expr: str):
        """The kernel ``expr`` (a declared name expression, or an ``extern "C"`` name)."""
        return self._module(expr).get_function(expr)

    def prefetch(self, exprs: Sequence[str], device: int | None = None) -> list:
        """Compile the groups of ``exprs`` on daemon threads, for ``device`` (default
        the current one), and look the kernels ``exprs`` up there; returns the
        threads (a later :meth:`get_function` waits for its module)."""
        if device is None:
            import cupy
            device = cupy.cuda.Device().id
        asked: dict = {}                    # a group (() for a whole file) -> its exprs asked for
        for e in exprs:
            asked.setdefault(variant_group(e, self.name_expressions), []).append(e)
        threads = []
        for group, group_exprs in asked.items():
            if not _COMPILED.claim(self.name, group, self.options, self.digest,
                                   self.cooperative):
                continue                    # compiled, or a thread compiles it already
            t = threading.Thread(target=_quiet, args=(self._load, group_exprs, device),
                                 name="gpuqr-nvrtc", daemon=True)
            t.start()
            threads.append(t)
        return threads

    def _load(self, exprs: Sequence[str], device) -> None:
        """Compile the group of ``exprs[0]`` and look its kernels ``exprs`` up (a
        kernel is loaded into the context when first looked up, with CUDA's lazy
        loading: on this thread, not at the caller's first launch)."""
        mod = self._module(exprs[0], device)
        import cupy
        with cupy.cuda.Device(device):
            for e in exprs:
                if e:
                    mod.get_function(e)


def _quiet(fn, *args) -> None:
    """Run ``fn`` on a prefetch thread; a failure is left for the caller's own
    :meth:`LazyModule.get_function`, which compiles again and raises."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - reported by the caller's compile
        pass


@functools.lru_cache(maxsize=64)
def _load_module_cached(name: str, name_expressions: tuple[str, ...],
                        options: tuple[str, ...], digest: str,
                        cooperative: bool) -> LazyModule:
    return LazyModule(name, name_expressions, options, digest, cooperative)


def load_module(name: str, name_expressions: Sequence[str] = (),
                options: Sequence[str] = (), *, cooperative: bool = False) -> LazyModule:
    """``kernels/name`` as a :class:`LazyModule`: each variant compiled (or fetched
    from the cache) on first use, with its group only.

    The in-process table is keyed by the flattened source's hash, so an
    edited header is recompiled; CuPy's on-disk cache (``CUPY_CACHE_DIR``)
    keeps cubins between processes.

    Parameters
    ----------
    name : str
        File name in ``kernels/``, e.g. ``"batched/lu_warp.cu"``.
    name_expressions : sequence of str
        The file's template instantiations, e.g. ``("lu_small<double, 8>",)``;
        :meth:`LazyModule.get_function` compiles the one asked for with those
        of the same value type (:func:`variant_group`).
    options : sequence of str
        NVRTC options in addition to :data:`COMPILE_OPTIONS`.
    cooperative : bool
        The file's kernels need a cooperative launch (``cuLaunchCooperativeKernel``:
        all blocks resident, for a grid-wide barrier). The same cubin either way.
    """
    opts = tuple(COMPILE_OPTIONS) + tuple(options)
    return _load_module_cached(name, tuple(name_expressions), opts, source_hash(name),
                               bool(cooperative))


class KernelUse(NamedTuple):
    """What a call compiles of one kernel file (for :func:`prefetch`)."""

    #: File name in ``kernels/``.
    file: str
    #: The file's declared name expressions (``()``: none, the whole file).
    declared: tuple
    #: The kernels the call asks for (their groups are compiled).
    needed: tuple
    #: The kernels launch cooperatively (:func:`load_module`).
    cooperative: bool = False

    def module(self) -> LazyModule:
        """The file as :func:`load_module` gives it."""
        return load_module(self.file, self.declared, cooperative=self.cooperative)


def prefetch(modules: Iterable[KernelUse]) -> list:
    """Start compiling what a call will need, in parallel, on worker threads.

    The calling thread only starts one thread (``gpuqr-prefetch``), which looks
    the modules up (their sources flattened and hashed: file reads that took
    tens of milliseconds of a new process's first call on a slow file system)
    and starts one compiling thread (``gpuqr-nvrtc``) per module not compiled,
    nor being compiled, yet in this process, then waits for them. A use asked
    for before (same file, variants and device) is not looked up again. The
    first use is the one the call launches first: its module is compiled (or
    waited for, where the caller's thread compiles it) before the others start,
    so that its load does not share the interpreter with theirs.

    Parameters
    ----------
    modules : iterable of KernelUse
        The files, their declared variants and the variants the call will ask
        for, the one launched first first.

    Returns
    -------
    list of threading.Thread
        The one looking up and waiting for the compiles (joined: every module
        asked for is compiled), or none when every use was asked for before.
    """
    import cupy
    device = cupy.cuda.Device().id
    uses = [KernelUse(*use) for use in modules]
    new = _COMPILED.request((use, device) for use in uses)
    if not new:
        return []
    t = threading.Thread(target=_prefetch_uses, args=([use for use, _ in new], device),
                         name="gpuqr-prefetch", daemon=True)
    t.start()
    return [t]


def _prefetch_uses(uses: Sequence[KernelUse], device: int) -> None:
    """:func:`prefetch`'s thread: look each module up, start its compiles, wait
    for them. A failure is left for the caller's own lookup or compile."""
    threads = []
    try:
        _seed_preprocess()          # before any module's thread asks for it
    except Exception:  # noqa: BLE001 - CuPy runs NVRTC instead
        pass
    first = uses[0] if uses else None
    if first is not None and first.needed:
        try:                        # alone: compiled here, or waited for where it is compiling
            first.module()._load(first.needed, device)
        except Exception:  # noqa: BLE001 - raised again where the module is used
            pass
    for use in uses:
        try:
            threads += use.module().prefetch(use.needed, device=device)
        except Exception:  # noqa: BLE001 - raised again where the module is used
            pass
    for t in threads:
        t.join()


def _compile_one(fname: str, arch: str, exprs: tuple[str, ...]) -> dict:
    """NVRTC-compile one flattened file for one architecture (no GPU)."""
    from cupy.cuda import nvrtc

    t0 = time.perf_counter()
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
            "cubin_bytes": size, "log": log.strip(), "seconds": time.perf_counter() - t0}


def check_compile(archs: Iterable[str] = ("sm_80", "sm_90"),
                  files: Iterable[str] | None = None, jobs: int | None = None) -> list[dict]:
    """Compile every kernel file and variant with NVRTC; needs no GPU.

    Uses ``cupy.cuda.nvrtc`` directly (the ``nvidia-cuda-nvrtc`` wheel
    provides the library), with the flattened source and
    :data:`COMPILE_OPTIONS`, in the units the run time compiles
    (:func:`compile_units`), i.e. exactly what :func:`load_module` compiles.

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
        ``cubin_bytes`` (summed over the units), ``log`` (of the failed units,
        else the last one's), ``seconds`` (NVRTC's time for the file's units).
    """
    variants = registered_variants()
    separate = registered_separate()
    names = ([_relative_name(p) for p in kernel_files()] if files is None
             else list(files))
    work = [(f, a, unit) for f in names for a in archs
            for unit in compile_units(f, variants.get(f, ()), f in separate)]
    jobs = min(len(work), jobs or os.cpu_count() or 1)
    if jobs <= 1:
        done = [_compile_one(*w) for w in work]
    else:
        # (the attribute, not a module-level name: concurrent.futures imports its process
        # pool, and multiprocessing with it, only when asked for it)
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(_compile_one, *zip(*work), chunksize=4))
    return [_merge_units([r for r in done if r["file"] == f and r["arch"] == a])
            for f in names for a in archs]


def _merge_units(units: list[dict]) -> dict:
    """One file's result for one architecture from its units' results."""
    failed = [u for u in units if not u["ok"]]
    return {"file": units[0]["file"], "arch": units[0]["arch"], "ok": not failed,
            "variants": sum(u["variants"] for u in units),
            "cubin_bytes": sum(u["cubin_bytes"] for u in units),
            "log": "\n".join(u["log"] for u in failed) if failed else units[-1]["log"],
            "seconds": sum(u["seconds"] for u in units)}


def warm_cache(cache_dir: str | None = None, jobs: int | None = None) -> list[dict]:
    """Compile every registered variant for the present GPU into the cache.

    The units the run time compiles (:func:`compile_units`: a variant group,
    or one variant of a ``SEPARATE_FILES`` file) are compiled by ``jobs``
    worker threads (NVRTC runs without the GIL; one NVRTC run holds hundreds
    of megabytes, so they are not all started at once).

    Parameters
    ----------
    cache_dir : str or None
        Where CuPy keeps cubins (``CUPY_CACHE_DIR``); None keeps CuPy's
        default (``~/.cupy/kernel_cache``) or the variable already set.
        CuPy reads the variable when it compiles, so it is set for this
        process; call this from a process made for it (the CLI does).
    jobs : int or None
        Compiling threads (None: one per CPU).

    Returns
    -------
    list of dict
        ``file``, ``variants``, ``seconds`` (from the start until that file's
        units were compiled) per kernel file, in the order they finished.

    Raises
    ------
    Exception
        The first unit's compile error (CuPy's ``CompileException``).
    """
    if cache_dir is not None:
        os.environ["CUPY_CACHE_DIR"] = str(cache_dir)
    variants = registered_variants()
    cooperative, separate = registered_cooperative(), registered_separate()
    units, left = [], {}
    for path in kernel_files():
        name = _relative_name(path)
        exprs = variants.get(name, ())
        coop = name in cooperative
        for unit in compile_units(name, exprs, name in separate):
            module = load_module(name, unit if name in separate else exprs, cooperative=coop)
            units.append((name, module, unit[0] if unit else ""))
        left[name] = len(units) - sum(left.values())
    t0 = time.perf_counter()
    out = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        futures = {pool.submit(module._module, expr): name for name, module, expr in units}
        for fut in concurrent.futures.as_completed(futures):
            fut.result()
            name = futures[fut]
            left[name] -= 1
            if left[name] == 0:
                out.append({"file": name, "variants": len(variants.get(name, ())),
                            "seconds": time.perf_counter() - t0})
    return out


def _relative_name(path: Path) -> str:
    """``kernels/sparse_qr/uberkernel.cu`` -> ``"sparse_qr/uberkernel.cu"``."""
    return path.relative_to(kernels_dir()).as_posix()
