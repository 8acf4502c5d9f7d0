"""The package's layout as docs/layout.md states it: imports run one way between packages (no circle, at the
scale of files or of packages), and the top floor holds a handful of modules."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flakecheck"
MAX_TOP_LEVEL_MODULES = 6


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports (at any depth of the code)."""
    modules = {_module_of(p) for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _module_of(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from package import module` imports that module; `from module import name`, the module
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != source and name.startswith("flakecheck"):
                    graph[source].add(name)
    return graph


def _node(module: str) -> str:
    """A first-level package, or a top-level module, as one node."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def _collapsed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            # the package root pins the libraries and lazily re-exports the API: every import of any module
            # loads it, so it is the top of the house and not a node anything below may be said to import
            if _node(target) != _node(source) and target != "flakecheck":
                packages[_node(source)].add(_node(target))
    return packages


def test_no_module_imports_back_up() -> None:
    graph = _imports()
    assert graph, "no imports found: the test reads the wrong tree"
    assert _cycles({k: {t for t in v if t != "flakecheck"} for k, v in graph.items()}) == []


def test_no_package_imports_a_package_above_it() -> None:
    assert _cycles(_collapsed(_imports())) == []


def test_the_top_floor_is_small() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_a_known_loop_is_found() -> None:
    """The checker itself: a loop between two packages is reported."""
    assert _cycles({"flakecheck.a": {"flakecheck.b"}, "flakecheck.b": {"flakecheck.a"}}) == [
        ["flakecheck.a", "flakecheck.b"]]
