"""An adapter naming its tool-call format: adapter_config.json's `tool_parser`.

An adapter fine-tuned to write tool calls in one family's format (hermes, llama3_json, ...) says so
in its config, beside PEFT's own fields, so that the name travels with the adapter wherever its
directory goes: an upload of any kind, a server-local directory, a download. PEFT ignores keys it
does not know (it warns), and the engine reads only its own. The value is one of
settings.TOOL_PARSER_CHOICES, checked when the adapter is uploaded (a 400 naming `tool_parser`,
nothing stored) or resolved from a server-local directory; the version keeps it
(AdapterVersion.tool_parser), and chat requests to the adapter use it before the format inferred
from its own template and before the server's --tool-parser (api/chat_templates.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from loraloom.engine import ADAPTER_CONFIG_FILE
from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.settings import TOOL_PARSER_CHOICES

TOOL_PARSER_FIELD = "tool_parser"


def declared_tool_parser(directory: Path) -> str | None:
    """The tool parser the adapter in `directory` names, None if it names none. A config that does not
    read as a JSON object names none here: the engine's validation of the config says what is wrong."""
    try:
        config = json.loads((directory / ADAPTER_CONFIG_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    value = config.get(TOOL_PARSER_FIELD) if isinstance(config, dict) else None
    if value is None:
        return None
    if not isinstance(value, str) or value not in TOOL_PARSER_CHOICES:
        raise UploadRejectedError(
            f"{TOOL_PARSER_FIELD}: {ADAPTER_CONFIG_FILE} names the tool parser {value!r}, which is not one of "
            f"{', '.join(TOOL_PARSER_CHOICES)}; set one of them, or leave the field out to take the format from "
            "the chat template",
            param=TOOL_PARSER_FIELD,
        )
    return value
