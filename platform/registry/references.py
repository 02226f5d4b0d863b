"""What a request may put in `model` / `adapter_id`, and which names the registry accepts.

`support-bot` means `support-bot:latest`; `support-bot:prod` names a movable alias;
`support-bot@3` names immutable version 3 (docs/ARCHITECTURE.md). Adapter and alias names
therefore never contain `:` or `@` (nor `/`, which would make keys and URLs ambiguous).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from loraloom.engine import RequestFieldError

LATEST_ALIAS = "latest"
# Names that always mean "no adapter" (besides the served base's own name); "" is an omitted model.
ALWAYS_BASE_NAMES = frozenset({"base", ""})
ADAPTER_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fits adapters.name (128)
ALIAS_NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")  # fits aliases.name (64); a letter first, unlike N
_REFERENCE = re.compile(r"(?P<name>[^:@]+)(?::(?P<alias>[^:@]+)|@(?P<version>[1-9][0-9]{0,8}))?")


@dataclass(frozen=True)
class AdapterReference:
    name: str
    alias: str | None = None  # `name:alias`
    version: int | None = None  # `name@N`

    @property
    def is_bare_name(self) -> bool:
        """Only a bare name may also mean a server-local adapter (those have no aliases or versions)."""
        return self.alias is None and self.version is None

    @property
    def target_alias(self) -> str | None:
        """The alias to follow: the one written, `latest` for a bare name, None for `name@N`."""
        return None if self.version is not None else (self.alias or LATEST_ALIAS)

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        return f"{self.name}:{self.target_alias}"


def parse_reference(text: str) -> AdapterReference | None:
    """The reference `text` spells, or None when it cannot name any registry adapter."""
    match = _REFERENCE.fullmatch(text)
    if match is None or ADAPTER_NAME_PATTERN.fullmatch(match["name"]) is None:
        return None
    if match["alias"] is not None and ALIAS_NAME_PATTERN.fullmatch(match["alias"]) is None:
        return None
    version = int(match["version"]) if match["version"] is not None else None
    return AdapterReference(name=match["name"], alias=match["alias"], version=version)


def check_adapter_name(name: str, *, reserved: frozenset[str]) -> None:
    """Raise RequestFieldError naming the rule an adapter name breaks."""
    if ADAPTER_NAME_PATTERN.fullmatch(name) is None:
        raise RequestFieldError(
            "name", f"{name!r} is not a valid adapter name; use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (':' and '@' are reserved for aliases and versions)"
        )
    if name in reserved:
        raise RequestFieldError("name", f"{name!r} is reserved for the base model; pick another adapter name")


def check_alias_name(alias: str) -> None:
    if ALIAS_NAME_PATTERN.fullmatch(alias) is None:
        raise RequestFieldError(
            "alias", f"{alias!r} is not a valid alias name; use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter"
        )
