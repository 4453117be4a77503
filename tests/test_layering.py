"""Imports go one way, and no module or package imports in a circle.

    kernels (twinkle_triton)  <-  core  <-  eager | compile | distributed | generation  <-  integrations
        <-  measurement  <-  the public modules  <-  the tools: the harness (bench)  <-  the command line

A module may import its own unit (``twinkle_fx.compile`` and everything under it is one unit) and the
units of the layers below its own; units side by side (eager and compile, say) never import each
other. The package root (``twinkle_fx/__init__.py``) is the public face: it re-exports from every layer
of the library, lazily, never from a tool (a public name a tool defines moves into the library, as
``check_kernels`` and ``benchmark_kernel`` did), and only the tools import it. Every import is read
from the source (module level, inside functions, under ``TYPE_CHECKING``, and
``importlib.import_module`` of a literal name), so a lazy import counts as much as one at the top; the
root's own table of lazy names (``_PUBLIC``, ``_LIBRARY``) counts too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"twinkle_fx": ROOT / "twinkle_fx", "twinkle_triton": ROOT / "kernels" / "twinkle_triton"}
FACADE = "twinkle_fx"

# (layer, its units), lowest first; a unit is a module or a package with everything under it
LAYERS = (
    ("kernels", ("twinkle_triton",)),
    ("core", ("twinkle_fx.core",)),
    ("paths", ("twinkle_fx.eager", "twinkle_fx.compiler", "twinkle_fx.distributed", "twinkle_fx.generation")),
    ("integrations", ("twinkle_fx.integrations",)),
    ("measurement", ("twinkle_fx.measure",)),
    ("public modules", ("twinkle_fx.builtin", "twinkle_fx.checklist", "twinkle_fx.function",
                        "twinkle_fx.testing")),
    ("harness", ("twinkle_fx.bench",)),
    ("command line", ("twinkle_fx.cli",)),
    ("entry point", ("twinkle_fx.__main__",)),
)
TOOLS = ("harness", "command line", "entry point")
RANK = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}
LAYER_OF = {unit: layer for layer, units in LAYERS for unit in units}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where} imports {self.target}"


def _modules() -> dict[str, Path]:
    modules = {}
    for top, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(name: str) -> str | None:
    """The module of ours that importing ``name`` runs last (its longest prefix that is a module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(source: str) -> list[Import]:
    path = MODULES[source]
    package = source if _is_package(source) else source.rpartition(".")[0]
    found = []

    def add(target: str | None, node: ast.AST) -> None:
        if target is not None and target != source:
            found.append(Import(source, target, f"{path.relative_to(ROOT)}:{node.lineno}"))

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_resolve(alias.name), node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:  # ``from package import submodule`` imports the submodule
                add(_resolve(f"{module}.{alias.name}") if f"{module}.{alias.name}" in MODULES else _resolve(module),
                    node)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"):
            add(_resolve(node.args[0].value), node)
    return list(dict.fromkeys(found))  # ``from m import a, b`` is one import of m


def _lazy_imports() -> list[Import]:
    """The modules the package root imports by name when a public name is first used: the values of
    its ``_PUBLIC`` table and the entries of ``_LIBRARY``, read from the source."""
    path = MODULES[FACADE]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("."):
            target = _resolve(FACADE + node.value)
            if target is not None:
                found.append(Import(FACADE, target, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


IMPORTS = [i for source in MODULES for i in _imports(source)] + _lazy_imports()


def _unit(module: str) -> str | None:
    if module == FACADE:
        return FACADE
    matches = [u for u in RANK if module == u or module.startswith(u + ".")]
    return max(matches, key=len) if matches else None


def test_every_module_belongs_to_a_layer():
    unplaced = sorted(m for m in MODULES if _unit(m) is None)
    assert unplaced == [], f"modules in no layer (add them to LAYERS in {Path(__file__).name}): {unplaced}"


def _problem(i: Import) -> str | None:
    """Why import ``i`` goes against the direction, or None when it does not."""
    source, target = _unit(i.source), _unit(i.target)
    if source == FACADE and target is not None and target != FACADE and LAYER_OF[target] in TOOLS:
        return (f"{i}: the package root imports a tool ({LAYER_OF[target]}); move what the public name needs "
                "into a library module below the tools and import that")
    if source is None or target is None or source == target or source == FACADE:
        return None
    if target == FACADE:
        if LAYER_OF[source] in TOOLS:
            return None
        return f"{i}: only the tools import the package root; import the module that defines the name"
    if RANK[target] < RANK[source]:
        return None
    if RANK[target] == RANK[source]:
        return f"{i}: {source} and {target} sit side by side ({LAYER_OF[source]}) and never import each other"
    return f"{i}: {LAYER_OF[source]} ({source}) may not import {LAYER_OF[target]} ({target})"


def test_imports_go_one_way():
    problems = [p for p in map(_problem, IMPORTS) if p is not None]
    assert problems == [], "imports against the layers:\n" + "\n".join(problems)


def _circles(edges: dict[str, dict[str, Import]]) -> list[str]:
    """One circle through each strongly connected group of ``edges`` (node -> node -> an import that
    makes the edge), shown as ``a -> b (path:line imports ...) -> a (...)``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    circles = []
    for group in groups:  # the shortest way from the group's first node back to it, within the group
        start, members = min(group), set(group)
        paths: dict[str, list[str]] = {start: []}
        frontier = [start]
        while not any(start in edges.get(node, {}) for node in frontier):
            nxt = []
            for node in frontier:
                for to, how in edges.get(node, {}).items():
                    if to in members and to not in paths:
                        paths[to] = paths[node] + [f"{to} ({how})"]
                        nxt.append(to)
            frontier = nxt
        last = next(node for node in frontier if start in edges.get(node, {}))
        circles.append(" -> ".join([start, *paths[last], f"{start} ({edges[last][start]})"]))
    return circles


def test_no_module_imports_in_a_circle():
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for i in IMPORTS:
        if i.source != FACADE:  # the public face imports everything and nothing of ours imports it back
            edges[i.source].setdefault(i.target, i)
    circles = _circles(edges)
    assert circles == [], "modules that import each other:\n" + "\n".join(circles)


def _child(package: str, module: str) -> str | None:
    """The child of ``package`` (a submodule, or a subpackage with everything under it) holding ``module``."""
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1:].split('.')[0]}"


@pytest.mark.parametrize("package", sorted(m for m in MODULES if _is_package(m)))
def test_no_package_imports_in_a_circle(package):
    """Within each package, its children (subpackages taken whole) never import each other round."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for i in IMPORTS:
        source, target = _child(package, i.source), _child(package, i.target)
        if source is not None and target is not None and source != target:
            edges[source].setdefault(target, i)
    circles = _circles(edges)
    assert circles == [], f"parts of {package} that import each other:\n" + "\n".join(circles)


def test_test_modules_have_unique_names():
    """tests/ has no packages: pytest imports each test file (and each helper module) by its bare name, so
    two files of one name in different folders fail to collect whenever one worker meets both."""
    seen = defaultdict(list)
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name != "conftest.py":
            seen[path.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
