"""An adapter a request resolved to, as its tenant knows it.

The engine needs only the handle, whose key names content (two versions holding the same bytes
share it); people need names: the adapter, its version and the alias the request followed. Usage
rows and `/v1/usage` speak these, never the runtime key.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from loraloom.engine import AdapterHandle


@dataclass(frozen=True)
class NamedAdapter:
    handle: AdapterHandle
    name: str  # the registry adapter's name, a checkpoint id, or a server-local adapter's name
    version: int | None = None  # the registry version number; None for checkpoints and server-local adapters
    # The alias the request followed (`latest` for a bare name); None when it named `name@N` or a non-registry one.
    alias: str | None = None
    version_id: uuid.UUID | None = None  # the registry version's row
    # The version's own chat template (an upload's chat_template.jinja): its requests render with it.
    chat_template: str | None = None
    # The tool-call format the adapter names (adapter_config.json's tool_parser): its chats use it.
    tool_parser: str | None = None
