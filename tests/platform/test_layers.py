"""The platform's import direction (docs/ARCHITECTURE.md): cli -> api -> services (accounts,
registry, metering, training) -> db, storage -> settings. A module may import from its own
package and from the layers below it, never from one above; among the services, training
builds on the registry and metering on accounts, not the other way round."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLATFORM = Path(__file__).resolve().parents[2] / "platform"
PREFIX = "loraloom.platform."

# What each package may import from, besides itself (and the engine's interface, and libraries).
ALLOWED: dict[str, set[str]] = {
    "settings": set(),
    "json_input": set(),
    "log_format": set(),
    "db": {"settings"},
    "storage": {"settings"},
    "accounts": {"db"},
    "registry": {"db", "storage", "settings"},
    "metering": {"accounts", "db"},
    # A training worker is its own process: it sets up its logs as `serve` does.
    "training": {"registry", "db", "storage", "settings", "json_input", "log_format"},
    # Rate limits and quotas: the policy in the database, the counters in memory or Redis.
    "limits": {"db", "settings"},
    "api": {"accounts", "registry", "metering", "training", "limits", "db", "storage", "settings", "json_input"},
    # Ray Serve's deployments put the api and the services together, as `serve` does in one process.
    "ray_serve": {"api", "registry", "metering", "training", "storage", "settings"},
    "cli": {"api", "accounts", "registry", "training", "limits", "db", "storage", "settings", "log_format", "ray_serve"},
}


def package_of(path: Path) -> str:
    relative = path.relative_to(PLATFORM)
    return relative.parts[0].removesuffix(".py")


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def imported_packages(path: Path) -> set[str]:
    """Every loraloom.platform package the module imports, at the top or inside functions."""
    return {name.removeprefix(PREFIX).split(".")[0] for name in imported_modules(path) if name.startswith(PREFIX)}


MODULES = sorted(PLATFORM.rglob("*.py"))


def test_every_platform_module_is_in_a_known_layer():
    assert {package_of(path) for path in MODULES} == set(ALLOWED)


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PLATFORM)))
def test_imports_run_one_way(path):
    package = package_of(path)
    upward = imported_packages(path) - ALLOWED[package] - {package}
    assert not upward, f"platform/{path.relative_to(PLATFORM)} ({package}) imports {sorted(upward)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PLATFORM)))
def test_the_engine_is_reached_only_through_its_interface(path):
    """`from loraloom.engine import X` only: the engine's modules and the kernels may move freely."""
    inside = {name for name in imported_modules(path)
              if name.startswith(("loraloom.engine.", "loraloom.kernels")) or name == "loraloom.kernels"}
    assert not inside, f"platform/{path.relative_to(PLATFORM)} imports {sorted(inside)}; import from loraloom.engine"
