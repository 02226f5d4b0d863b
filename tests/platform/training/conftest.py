"""Fixtures of the training tests."""
from __future__ import annotations

from pathlib import Path

import pytest
from tiny_base import make_tiny_base


@pytest.fixture(scope="session")
def tiny_base(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama that trains on the bundled tokenizer's chat datasets (see tiny_base.py).
    Read-only."""
    return make_tiny_base(tmp_path_factory.mktemp("tiny-base"), model_dir)
