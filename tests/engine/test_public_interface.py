"""The engine's public interface (engine/__init__.py): what the platform may import from it."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import loraloom.engine as engine


@pytest.mark.parametrize("name", engine.__all__)
def test_every_public_name_is_its_module_object(name):
    module = importlib.import_module(f"loraloom.engine.{engine._MODULE_OF[name]}")
    assert getattr(engine, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        engine.NoSuchThing  # noqa: B018


def test_light_names_do_not_import_torch():
    # What the CLI and the registry read on their light paths must not pull in torch.
    code = ("import sys; from loraloom.engine import ADAPTER_FILES, AdapterHandle, EngineConfig, runtime_key; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
