"""Import `loraloom.engine` and `loraloom.kernels` from this checkout whether or not it is pip-installed.

The GPU machine gets a copy of the working tree and no `pip install -e .` (BENCHMARKS.md), so the
`loraloom.*` names that pyproject.toml maps onto engine/ and kernels/ do not exist there.
This registers the two folders under those names, exactly as the package-dir mapping does.
`loraloom.platform` is left out on purpose: it needs the web and database stack the GPU
machine lacks, and engine/ and kernels/ never import it.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_PACKAGES = {"loraloom.engine": REPO_ROOT / "engine", "loraloom.kernels": REPO_ROOT / "kernels"}


def use_source_tree() -> None:
    """Make loraloom.engine / loraloom.kernels resolve to this checkout's folders."""
    try:
        installed = importlib.util.find_spec("loraloom.engine")
    except ModuleNotFoundError:  # no `loraloom` at all
        installed = None
    if installed is not None:
        location = Path(next(iter(installed.submodule_search_locations))).resolve()
        if location == SOURCE_PACKAGES["loraloom.engine"].resolve():  # (this tree may be reached through a link)
            return  # an editable install of this very checkout: nothing to do
        raise SystemExit(
            f"loraloom.engine is installed from {location}, not from this checkout ({REPO_ROOT}); "
            "run the benchmark of that checkout, or `pip uninstall loraloom` to benchmark this one"
        )
    parent = sys.modules.get("loraloom")
    if parent is None:
        parent = types.ModuleType("loraloom")
        parent.__path__ = []  # a package with no folder of its own: only the registered subpackages exist
        sys.modules["loraloom"] = parent
    for name, folder in SOURCE_PACKAGES.items():
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(parent, name.rpartition(".")[2], module)
