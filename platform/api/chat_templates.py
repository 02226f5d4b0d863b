"""Which chat template a chat request renders with: its adapter's own (uploaded with it, or in a
server-local adapter's directory; checked by platform/registry/chat_templates.py), else the served model's;
and which tool parser it uses."""
from __future__ import annotations

import functools

from loraloom.engine import ChatTemplateError, Tokenizer
from loraloom.platform.api.generation.adapters import ResolvedAdapter
from loraloom.platform.registry.named import NamedAdapter


def chat_tokenizer(tokenizer: Tokenizer, adapter: ResolvedAdapter) -> Tokenizer:
    named = adapter.named
    if named is None or named.chat_template is None:
        return tokenizer
    try:
        return _with_template(tokenizer, named.chat_template)
    except ValueError as error:  # checked when read, so only a sandbox stricter since then gets here
        raise ChatTemplateError(adapter.field, f"the adapter's own chat template no longer compiles ({error}); "
                                "upload a version with a template that does") from None


@functools.lru_cache(maxsize=64)
def _with_template(tokenizer: Tokenizer, template: str) -> Tokenizer:
    # Compiled once per template text (a few ms), not per request; the vocabulary is shared.
    return tokenizer.with_chat_template(template)


def tool_parser(configured: str, adapter: NamedAdapter | None) -> str:
    """The tool parser of a request: the one its adapter names (adapter_config.json's tool_parser, checked when
    the adapter was read: registry/tool_parsers.py), else, for an adapter with its own template, the format
    that template's family writes ("auto": formats.format_for_template), else the server's --tool-parser."""
    if adapter is not None and adapter.tool_parser is not None:
        return adapter.tool_parser
    if adapter is not None and adapter.chat_template is not None:
        return "auto"
    return configured
