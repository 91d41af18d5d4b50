"""The package's import graph has no cycles: each module can be read on top of the ones
it imports, and a subsystem never reaches back into the modules that use it. And
subsystems meet at their faces: a subpackage's private modules (``_name``) are imported
only from inside that subpackage; everyone else imports its ``__init__``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports, anywhere in its text (typing-only
    and function-level imports count: they are still arrows a reader follows)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import sub`` is an arrow to pkg.sub when that is a module.
            subs = [f"{prefix}.{alias.name}" for alias in node.names]
            targets = [s for s in subs if s in known] or [prefix]
        else:
            continue
        found |= {t for t in targets if t in known and t != module}
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    files = {module_name(f, package.parent): f for f in package.rglob("*.py")}
    known = set(files)
    return {
        name: imports_of(f.read_text(), name, f.name == "__init__.py", known)
        for name, f in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> Iterator[None]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                yield from visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            for _ in visit(node):
                pass
    return found


def owner(module: str) -> str | None:
    """The package whose machinery a private module is: the path before its first private
    part (``p.sub._x`` and ``p.sub._x.y`` belong to ``p.sub``); ``None`` for a public one."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def behind_faces(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The arrows that reach into a subpackage from outside it: to a private module of a
    package the importer is not in. Inside a subpackage (its subpackages included) the
    private modules import each other freely."""
    found = []
    for module, targets in graph.items():
        for target in targets:
            package = owner(target)
            if package is not None and not (module + ".").startswith(package + "."):
                found.append((module, target))
    return sorted(found)


@pytest.mark.parametrize("package", ["decaton_aio", "spark_jobs"])
def test_no_import_cycles(package: str) -> None:
    graph = import_graph(ROOT / package)
    assert len(graph) > 5
    assert cycles(graph) == []


def test_cycle_finder_sees_cycles() -> None:
    """The check itself fails on a graph with a cycle, direct or through a third module."""
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_import_reader_resolves_relative_and_submodule_imports() -> None:
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.c"}
    source = "from . import b\nfrom .sub import c\nfrom p.sub.c import thing\nimport p.a\n"
    assert imports_of(source, "p.a", False, known) == {"p.b", "p.sub.c"}
    assert imports_of("from .c import x\n", "p.sub", True, known) == {"p.sub.c"}


@pytest.mark.parametrize("package", ["decaton_aio", "spark_jobs"])
def test_subsystems_meet_at_their_faces(package: str) -> None:
    """A module outside ``decaton_aio/consumer/commit/`` imports ``decaton_aio.consumer.commit``,
    never ``decaton_aio.consumer.commit._committer``; so for every subpackage (consumer,
    its commit and state wings, producer, properties, embedded, cli)."""
    graph = import_graph(ROOT / package)
    assert behind_faces(graph) == []


def test_face_check_sees_a_reach_behind_a_face() -> None:
    """The check itself fails on an import of another subpackage's private module, and
    allows the package's own modules, its face and its subpackages."""
    graph = {
        "p": {"p.sub", "p._top"},
        "p.app": {"p.sub", "p._top"},
        "p.sub": {"p.sub._a"},
        "p.sub._a": {"p.sub._b", "p._top", "p.sub.wing"},
        "p.sub.wing": {"p.sub.wing._c"},
        "p.sub.wing._c": {"p.sub._b"},
        "p.sub._b": set(),
        "p.other._d": {"p.sub.wing._c"},
        "p.state": {"p.sub._b"},
    }
    assert behind_faces(graph) == [("p.other._d", "p.sub.wing._c"), ("p.state", "p.sub._b")]
