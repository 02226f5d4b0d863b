"""The codebase's shape: no import circles among the project's modules, and no module over 500 lines.

Every import counts, wherever it is written: at the top, under `if TYPE_CHECKING:`, inside a function,
relative or absolute. A circle that only a late import keeps from failing at run time still ties the
modules into one piece that cannot be understood, tested or moved apart. A package that re-exports
names lazily through a `_PUBLIC_NAMES` table (loraloom.engine) is looked through: `from
loraloom.engine import X` is an import of the module that defines X.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each of the project's packages lives in the source tree (pyproject.toml's package-dir).
PACKAGES = {"loraloom.engine": ROOT / "engine", "loraloom.kernels": ROOT / "kernels",
            "loraloom.platform": ROOT / "platform"}
MAX_MODULE_LINES = 500
# Python written by the project: the packages, and the scripts and tests around them.
LINE_CHECKED_DIRS = [ROOT / "engine", ROOT / "kernels", ROOT / "platform", ROOT / "benchmarks", ROOT / "tests"]


def find_modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of the packages: its dotted name -> its file (a package is its __init__.py)."""
    modules = {}
    for package, directory in packages.items():
        for path in sorted(directory.rglob("*.py")):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def lazy_exports(init_file: Path) -> dict[str, str]:
    """Name -> the submodule (relative to the package) that defines it, from a `_PUBLIC_NAMES` table."""
    for node in ast.parse(init_file.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_PUBLIC_NAMES" and node.value is not None:
            table = ast.literal_eval(node.value)
            return {name: module for module, names in table.items() for name in names}
    return {}


def imported_names(module: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """(absolute module name, the name taken from it or None) for every import in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                yield base, alias.name


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = find_modules(packages)
    exports = {name: lazy_exports(path) for name, path in modules.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        for base, name in imported_names(module, path):
            target = resolve(base, name, modules, exports)
            if target is not None:
                graph[module].add(target)
    return graph


def resolve(base: str, name: str | None, modules: dict[str, Path], exports: dict[str, dict[str, str]]) -> str | None:
    """The project module an import reaches: a submodule imported by name, the module defining a lazily
    re-exported name, or the longest project module the dotted name starts with; None outside the project."""
    if name is not None:
        if f"{base}.{name}" in modules:
            return f"{base}.{name}"
        defining = exports.get(base, {}).get(name)
        if defining is not None:
            return f"{base}.{defining}"
    parts = base.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules, as the chain [a, b, ..., a]; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(shortest_circle(graph, group) for group in groups)


def shortest_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest chain from the group's first module (by name) back to itself, within the group."""
    start = min(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node] & group):
                if successor == start:  # back where it began: walk the path back from `node`
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if successor not in previous:
                    previous[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not a circle")


def long_modules(directories: list[Path], limit: int) -> list[str]:
    """'path (lines)' for every Python file under the directories longer than `limit` lines."""
    found = []
    for directory in directories:
        for path in sorted(directory.rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({lines})")
    return found


# ------------------------------------------------------------------------------- the project
def test_no_import_circles_among_the_projects_modules():
    circles = find_circles(import_graph(PACKAGES))
    assert not circles, "import circles (every import counts: top level, TYPE_CHECKING, in functions):\n" + "\n".join(
        " -> ".join(circle) for circle in circles)


def test_no_module_is_over_500_lines():
    too_long = long_modules(LINE_CHECKED_DIRS, MAX_MODULE_LINES)
    assert not too_long, f"split these by topic, to at most {MAX_MODULE_LINES} lines each: {too_long}"


def test_the_graph_sees_the_engines_lazy_exports_and_late_imports():
    """Imports the checker must see on the real tree, or it would pass by seeing nothing."""
    graph = import_graph(PACKAGES)
    # `from loraloom.engine import AdapterHandle` (a lazy re-export), in the Ray engine deployment.
    assert "loraloom.engine.lora.handle" in graph["loraloom.platform.ray_serve.engine_deployment"]
    # Under `if TYPE_CHECKING:` in request.py.
    assert "loraloom.engine.structured_output" in graph["loraloom.engine.request"]
    # Inside a function: the CLI imports the database layer late (cli/main.py).
    assert "loraloom.platform.cli.admin" in graph["loraloom.platform.cli.main"]


# ------------------------------------------------------------------- the checker on made-up code
def write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"pkg": root / "pkg"}


def test_a_circle_through_late_type_checking_and_relative_imports_is_found(tmp_path):
    packages = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "def late():\n    from pkg import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.c import Thing\n",
        "sub/__init__.py": "",
        "sub/c.py": "import pkg.a\nclass Thing: ...\n",
        "d.py": "import pkg.a\nfrom . import b\n",  # imports into the circle, but is not in it
    })
    assert find_circles(import_graph(packages)) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]


def test_a_circle_through_a_lazy_re_export_is_found(tmp_path):
    packages = write_package(tmp_path, {
        "__init__.py": '_PUBLIC_NAMES = {"models.user": ("User",)}\n',
        "models/__init__.py": "",
        "models/user.py": "from pkg.audit import record\nclass User: ...\n",
        "audit.py": "from pkg import User\ndef record(): ...\n",
    })
    assert find_circles(import_graph(packages)) == [["pkg.audit", "pkg.models.user", "pkg.audit"]]


def test_modules_that_import_one_way_have_no_circle(tmp_path):
    packages = write_package(tmp_path, {
        "__init__.py": '_PUBLIC_NAMES = {"b": ("B",)}\n',
        "a.py": "from pkg import B\nfrom .b import helper\n",
        "b.py": "import json\nclass B: ...\ndef helper(): ...\n",
    })
    graph = import_graph(packages)
    assert graph["pkg.a"] == {"pkg.b"} and find_circles(graph) == []


def test_long_modules_are_named_with_their_length(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * 3)
    (tmp_path / "long.py").write_text("x = 1\n" * 4)
    assert long_modules([tmp_path], limit=3) == [f"{tmp_path / 'long.py'} (4)"]
