"""The package's architecture rules, checked on its source (no import is executed).

* No import circles between the package's modules, counting imports inside
  functions too (a circle hidden in a function is still a circle).
* Imports inside functions only where an optional dependency demands it: a
  module that needs CuPy (directly or through its own module-level imports)
  or an optional third-party package. Everything else is imported at module
  level, where a reader sees a module's dependencies at once.
* The lower parts never import the upper ones: the engines, schedulers and
  symbolic analysis know nothing of the public functions, the dispatcher or
  the command line.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "scipy_gpuqr"

#: third-party packages that are optional at run time (GPU, extras)
OPTIONAL = {"cupy", "cupyx", "cupy_backends", "cuda", "threadpoolctl", "matplotlib",
            "torch", "dask", "distributed"}

#: part -> parts it must never import
FORBIDDEN = {
    "_symbolic": ("_schedule", "_engine", "_factor", "_dispatch", "_api", "_cli"),
    "_schedule": ("_engine", "_factor", "_dispatch", "_api", "_cli"),
    "_engine": ("_factor", "_dispatch", "_api", "_cli"),
    "_dispatch": ("_factor", "_api", "_cli"),
    "_factor": ("_api", "_cli"),
    "_api": ("_cli",),
    "_iterative": ("_symbolic", "_schedule", "_engine", "_factor", "_dispatch", "_api", "_cli"),
    "_cpu": ("_symbolic", "_schedule", "_engine", "_factor", "_dispatch", "_api", "_cli"),
    "batched": ("_factor", "_dispatch", "_api", "_cli", "_engine"),
    "tiled": ("_factor", "_dispatch", "_api", "_cli", "_engine"),
    "distributed": ("_cli",),
    "_errors": ("",),
    # builds the compiled loops of _symbolic and _schedule: below every part
    "_native_build": ("_symbolic", "_schedule", "_engine", "_factor", "_dispatch", "_api",
                      "_cli", "_iterative", "_cpu", "batched", "tiled", "distributed"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports():
    """``{module: [(target, in_function, lineno)]}`` for every package module."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        in_function = {id(sub) for node in ast.walk(tree)
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for sub in ast.walk(node)}
        edges = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges += [(t, id(node) in in_function, node.lineno) for t in targets]
        found[name] = edges
    return modules, found


def _internal(target: str, modules) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def test_no_import_circles():
    modules, found = _imports()
    graph = {m: {t for raw, _, _ in edges if (t := _internal(raw, modules)) and t != m}
             for m, edges in found.items()}
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_function_level_imports_only_for_optional_dependencies():
    modules, found = _imports()
    needs_gpu = {m for m, edges in found.items()
                 if any(raw.split(".")[0] in OPTIONAL for raw, inside, _ in edges if not inside)}
    changed = True
    while changed:          # a module importing a GPU module at module level needs the GPU too
        changed = False
        for m, edges in found.items():
            if m not in needs_gpu and any(_internal(raw, modules) in needs_gpu
                                          for raw, inside, _ in edges if not inside):
                needs_gpu.add(m)
                changed = True
    offenders = []
    for m, edges in found.items():
        for raw, inside, line in edges:
            if not inside or raw.split(".")[0] in OPTIONAL or raw == "__future__":
                continue
            target = _internal(raw, modules)
            if target is not None and target in needs_gpu:
                continue
            offenders.append(f"{m}:{line} imports {raw} inside a function")
    assert offenders == []


def test_lower_parts_never_import_upper_parts():
    modules, found = _imports()
    offenders = []
    for m, edges in found.items():
        parts = m.split(".")
        if len(parts) < 2 or parts[1] not in FORBIDDEN:
            continue
        for raw, _, line in edges:
            target = _internal(raw, modules)
            if target is None or target == "scipy_gpuqr":
                continue
            upper = target.split(".")[1] if "." in target else ""
            if parts[1] == "_errors" or upper in FORBIDDEN[parts[1]]:
                offenders.append(f"{m}:{line} imports {target}")
    assert offenders == []
