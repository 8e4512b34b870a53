"""The library's rooms import only downward, with no circle, and say why an import hides in a function.

Rooms, lowest first: core, engine, measure, deploy, topics, workbench (docs/library.md). The
walk reads every ``import`` in ``lib/tunebook`` (inside functions too), so a circle or a climbing
import that only happens at call time is found as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "tunebook"
ROOMS = ["core", "engine", "measure", "deploy", "topics", "workbench"]


def _name(path: Path) -> str:
    parts = list(path.relative_to(LIB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(module: str, name: str) -> str:
    """``from tunebook.topics import kvcache`` imports the module tunebook.topics.kvcache."""
    full = f"{module}.{name}"
    return full if (LIB.parent / (full.replace(".", "/") + ".py")).exists() else module


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported tunebook module, line, inside a function) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside |= {id(n) for n in ast.walk(node) if n is not node}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("tunebook.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tunebook"):
            names = [_target(node.module, a.name) for a in node.names]
        else:
            continue
        out += [(n, node.lineno, id(node) in inside) for n in names]
    return out


GRAPH = {_name(p): _imports(p) for p in sorted(LIB.rglob("*.py"))}


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ROOMS else None


def test_every_module_lives_in_a_room():
    """Only the package's entry points (python -m tunebook, tunebook.serve, tunebook.chat) sit on top."""
    loose = [m for m in GRAPH if m.count(".") == 1 and m.split(".")[1] not in ROOMS]
    assert sorted(loose) == ["tunebook.__main__", "tunebook.chat", "tunebook.serve"]


def test_no_import_climbs_a_room():
    climbing = [
        f"{m}:{line} imports {dep}"
        for m, deps in GRAPH.items()
        for dep, line, _ in deps
        if _room(m) and _room(dep) and ROOMS.index(_room(dep)) > ROOMS.index(_room(m))
    ]
    assert not climbing, "imports that climb a room:\n" + "\n".join(climbing)


def test_no_import_circle():
    graph = {m: {d for d, _, _ in deps if d in GRAPH and d != m} for m, deps in GRAPH.items()}
    # A module imports its package's __init__ implicitly; rooms' __init__ import nothing.
    circles, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                circles.append(" -> ".join(path[path.index(d) :] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_sibling_imports_sit_at_the_top_or_say_why(module):
    """An import of tunebook inside a function hides the real graph; where one must (a cost paid
    only on that path, a child process's entry), a comment on its line or the line above says why."""
    path = LIB.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = LIB.parent / module.replace(".", "/") / "__init__.py"
    lines = path.read_text().splitlines()
    hidden = [
        f"{module}:{line} {lines[line - 1].strip()}"
        for _, line, inside in GRAPH[module]
        if inside and "#" not in lines[line - 1] and not lines[line - 2].strip().startswith("#")
    ]
    assert not hidden, "tunebook imports inside functions without a reason:\n" + "\n".join(hidden)


# A function longer than this says why it is not cut into named steps: a comment starting
# "# Long:" in the comment above its def or among its first lines (issue 42: a newcomer reads a
# function whole; one that does not fit a screen should say why it is better in one piece).
MAX_FUNCTION_LINES = 80


def _long_functions_without_a_reason() -> list[str]:
    found = []
    for path in sorted(LIB.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - start + 1 <= MAX_FUNCTION_LINES:
                continue
            near = lines[max(0, start - 4) : node.lineno + 12]  # a comment of up to 3 lines above
            if not any(x.strip().startswith("# Long:") for x in near):
                found.append(f"{_name(path)}.{node.name}: {node.end_lineno - start + 1} lines")
    return found


def test_a_function_over_80_lines_says_why():
    assert _long_functions_without_a_reason() == []
