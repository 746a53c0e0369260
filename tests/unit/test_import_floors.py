"""Imports point down the floors, never in a circle: every ``import`` of an embedstream module anywhere in a
file (at the top, inside a function, under ``TYPE_CHECKING``) is an edge, and the graph has no cycle. The
engine reads nothing from the floors above it (benchmarks, workers, producers, the gateway, the commands)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# import name -> folder (pyproject's package-dir: schemas/, producers/ and workers/ install under embedstream)
PACKAGES = {"embedstream": ROOT / "embedstream", "embedstream.schemas": ROOT / "schemas",
            "embedstream.producers": ROOT / "producers", "embedstream.workers": ROOT / "workers"}
ABOVE_THE_ENGINE = ("embedstream.bench", "embedstream.workers", "embedstream.producers", "embedstream.gateway",
                    "embedstream.commands", "embedstream.cli")


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _imported(module: str, path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n.startswith("embedstream")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {owner(n) for n in _imported(module, path)}
        # a module importing its own package (or itself) is no edge of the floors
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_in_a_circle():
    assert _cycles(_graph()) == []


def test_the_engine_reads_nothing_from_the_floors_above_it():
    graph = _graph()
    upward = {m: sorted(t for t in targets if t.startswith(ABOVE_THE_ENGINE))
              for m, targets in graph.items() if m.startswith("embedstream.engine")}
    assert {m: t for m, t in upward.items() if t} == {}
