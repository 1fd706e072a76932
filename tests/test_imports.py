"""One-way arrows: no import cycle among kbsweep's modules, counting every import (function-local ones too), and
no module over the size a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parent.parent / "kbsweep"
MAX_LINES = (
    500  # "about 400" lines at the 160 columns the code was written to; the formatter's 120 spread them over ~20 % more
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The kbsweep modules `name` imports anywhere in its file; `from pkg import mod` counts as the module."""
    return {target for target, _ in imports(name, path, known)}


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module, line) of every kbsweep import in `name`'s file, function-local ones too, ``if TYPE_CHECKING:`` ones
    left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if is_type_checking(block) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # the deepest kbsweep module the name reaches: `kbsweep.a.b.func` is kbsweep.a.b
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports for annotations only, never run, so they draw no arrow."""
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, set(known)) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycle_finder_sees_function_local_imports(tmp_path):
    """The finder itself: a three-module ring, and an import inside a function."""
    graph = {"kbsweep.a": {"kbsweep.b"}, "kbsweep.b": {"kbsweep.c"}, "kbsweep.c": {"kbsweep.a"}, "kbsweep.d": set()}
    assert cycles(graph) == [["kbsweep.a", "kbsweep.b", "kbsweep.c"]]
    source = "def late():\n    from kbsweep import report\n"
    (tmp_path / "x.py").write_text(source)
    assert "kbsweep.report" in imported("kbsweep.x", tmp_path / "x.py", {"kbsweep", "kbsweep.report"})


def test_no_module_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
