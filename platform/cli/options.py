"""What several command groups parse: argparse value types, the key roles, the LORALOOM_* settings."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loraloom.platform.settings import Settings

RESERVED_NAME_CHARACTERS = ":@/\\"  # kept free for the registry's "name:alias" and "name@version"
ROLE_CHOICES = ("admin", "developer", "inference")  # ApiKeyRole's values, without importing the database layer


def adapter_argument(value: str) -> tuple[str, Path]:
    """argparse type of --adapter: NAME=PATH."""
    name, separator, path = value.partition("=")
    if not separator or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH (e.g. support-bot=./adapters/support-bot), got {value!r}")
    if any(character in RESERVED_NAME_CHARACTERS for character in name):
        raise argparse.ArgumentTypeError(
            f"adapter name {name!r} in {value!r} may not contain any of {RESERVED_NAME_CHARACTERS!r}; "
            "expected NAME=PATH"
        )
    return name, Path(path)


def positive_int(value: str) -> int:
    """argparse type of the engine sizes and other counts."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], e.g. 0.9; got {text!r}")
    return value


def load_settings(broker_url: str | None = None) -> Settings:
    """The LORALOOM_* settings (`broker_url`: --broker-url, which wins over the environment);
    exits with pydantic's message when they are invalid."""
    # Imported here: pydantic-settings is not needed by `--help` or the HTTP commands.
    from pydantic import ValidationError

    from loraloom.platform.settings import Settings

    try:
        settings = Settings()
    except ValidationError as error:
        sys.exit(f"loraloom: invalid LORALOOM_* environment settings:\n{error}")
    return settings if broker_url is None else settings.model_copy(update={"broker_url": broker_url})
