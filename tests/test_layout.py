"""The package's shape: no import circle, <= 6 loose modules of <= 450 lines, <= 2 long functions, a small core."""

from __future__ import annotations

import ast
import graphlib
import importlib.util

import pytest
from testing_utils import REPO


PACKAGE = REPO / "stapo_trl"
SOURCES = {path: path.read_text() for path in PACKAGE.rglob("*.py")}


def _module(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, tree) -> set[str]:  # at module level or inside a function
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_no_import_circle():
    modules = {_module(path): path for path in SOURCES}
    graph = {
        name: {m for m in _imports(path, ast.parse(SOURCES[path])) if m in modules and m != name and
               not name.startswith(m + ".")}  # a package's own __init__ is not a cycle
        for name, path in modules.items()
    }  # fmt: skip
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(" -> ".join(error.args[1]))


def test_modules_functions_and_the_core_within_their_limits():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 6, loose
    assert [str(p.relative_to(REPO)) for p, text in SOURCES.items() if len(text.splitlines()) > 450] == []
    long = [f"{p.name}:{f.name}" for p, text in SOURCES.items() for f in ast.walk(ast.parse(text))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno >= 80]  # fmt: skip
    assert len(long) <= 2, long
    core = {p: text for p, text in SOURCES.items() if p.parent.name == "core"}
    assert sum(len(text.splitlines()) for text in core.values()) <= 600
    assert [
        (p.name, i) for p, text in core.items() for i, line in enumerate(text.splitlines(), 1) if len(line) > 119
    ] == []
