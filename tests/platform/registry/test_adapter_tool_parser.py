"""An adapter naming its tool parser (adapter_config.json's `tool_parser`), through a live app (registry on
SQLite, file:// blobs, the bundled model, real PEFT adapters): an upload keeps it and the version shows it,
a value that is no parser is a 400 naming the field and the choices with nothing stored, and chats to the
adapter use it: before the format its own template shows, and before the server's. Server-local adapters
name theirs the same way.

Which format a chat used is seen in its prompt: the bundled template does not render `tools`, so the
tools are described in the system message with a call written in the format (prompt.py), whose length
differs between formats."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_registry import LiveRegistry, live_registry

from loraloom.engine import AdapterHandle
from loraloom.platform.api.chat_templates import tool_parser
from loraloom.platform.api.tools.formats import TOOL_FORMATS
from loraloom.platform.api.tools.prompt import template_input
from loraloom.platform.api.tools.request import ToolDefinition, template_tools
from loraloom.platform.registry.named import NamedAdapter

CHAT = [{"role": "user", "content": "What is the weather like in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# ChatML as the bundled model writes it, which format_for_template reads as smollm2's family.
OWN_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def with_parser(source: Path, target: Path, parser: object) -> Path:
    """A copy of the PEFT adapter in `source` whose adapter_config.json names `parser`."""
    directory = Path(shutil.copytree(source, target))
    config = json.loads((directory / "adapter_config.json").read_text())
    (directory / "adapter_config.json").write_text(json.dumps({**config, "tool_parser": parser}))
    return directory


class Live(LiveRegistry):
    def prompt_tokens(self, model: str) -> int:
        return self.chat_prompt_tokens(model, CHAT, tools=[WEATHER])

    def expected_tokens(self, format_name: str, template: str | None = None) -> int:
        """The prompt a chat with WEATHER gets when its calls take `format_name`, rendered as the route does."""
        tokenizer = self.engine.tokenizer if template is None else self.engine.tokenizer.with_chat_template(template)
        messages, tools = template_input(CHAT, template_tools([ToolDefinition.model_validate(WEATHER)]),
                                         describe_tools=True, renders_tools=tokenizer.template_renders_tools,
                                         tool_format=TOOL_FORMATS[format_name])
        return len(tokenizer.encode_chat(messages, True, tools))


@pytest.fixture(scope="module")
def live(model_dir, peft_adapter, tmp_path_factory) -> Iterator[Live]:
    adapter_dir = tmp_path_factory.mktemp("local")
    with_parser(peft_adapter, adapter_dir / "local-hermes", "hermes")
    with_parser(peft_adapter, adapter_dir / "local-wrong", "xml")
    # The server's own choice, llama3_json: what adapters naming none get.
    with live_registry(model_dir, tmp_path_factory, adapter_dir, tool_parser="llama3_json") as live:
        yield Live(live.client, live.engine, live.acme)


def test_an_uploaded_adapter_keeps_its_tool_parser_and_its_chats_use_it(live, peft_adapter, tmp_path):
    plain = live.push("caller", peft_adapter)
    named = live.push("caller", with_parser(peft_adapter, tmp_path / "hermes", "hermes"))
    # Another config is another version: the parser is part of the adapter's content.
    assert (plain.status_code, named.status_code) == (201, 201), named.text
    assert (plain.json()["tool_parser"], named.json()["tool_parser"]) == (None, "hermes")
    shown = live.client.get("/v1/adapters/caller/versions/2", headers=live.acme)
    assert shown.status_code == 200 and shown.json()["tool_parser"] == "hermes"
    assert live.prompt_tokens("caller@2") == live.expected_tokens("hermes")
    assert live.prompt_tokens("caller@1") == live.expected_tokens("llama3_json") != live.expected_tokens("hermes")


def test_a_named_parser_comes_before_the_format_of_the_adapters_own_template(live, peft_adapter, tmp_path):
    own = {"chat_template.jinja": OWN_TEMPLATE.encode()}
    inferred = live.push("templated", peft_adapter, own)
    named = live.push("templated", with_parser(peft_adapter, tmp_path / "llama", "llama3_json"), own)
    assert (inferred.status_code, named.status_code) == (201, 201), named.text
    assert live.prompt_tokens("templated@1") == live.expected_tokens("smollm2", OWN_TEMPLATE)
    assert live.prompt_tokens("templated@2") == live.expected_tokens("llama3_json", OWN_TEMPLATE) != (
        live.expected_tokens("smollm2", OWN_TEMPLATE))


@pytest.mark.parametrize("value", ["xml", 3, ""])
def test_a_tool_parser_that_is_none_is_refused_naming_the_choices(live, peft_adapter, tmp_path, value):
    response = live.push("wrong", with_parser(peft_adapter, tmp_path / "wrong", value))
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "tool_parser", response.text
    assert "auto, smollm2, hermes, llama3_json" in error["message"] and repr(value) in error["message"]
    assert live.client.get("/v1/adapters/wrong", headers=live.acme).status_code == 404


def test_server_local_adapters_name_their_parser_the_same_way(live):
    assert live.prompt_tokens("local-hermes") == live.expected_tokens("hermes")
    response = live.client.post("/v1/chat/completions", headers=live.acme,
                                json={"model": "local-wrong", "messages": CHAT, "max_tokens": 1})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "model", response.text
    assert error["message"].startswith("adapter 'local-wrong': tool_parser: ") and "'xml'" in error["message"]
    listed = [model["id"] for model in live.client.get("/v1/models", headers=live.acme).json()["data"]]
    assert "local-hermes" in listed and "local-wrong" not in listed


def test_the_adapters_parser_comes_first_then_its_templates_then_the_servers():
    handle = AdapterHandle(key="k", name="a", uri="file:///a", sha256="0" * 64)
    assert tool_parser("hermes", None) == "hermes"
    assert tool_parser("hermes", NamedAdapter(handle, name="a")) == "hermes"
    assert tool_parser("hermes", NamedAdapter(handle, name="a", chat_template="{{ x }}")) == "auto"
    assert tool_parser("hermes", NamedAdapter(handle, name="a", chat_template="{{ x }}",
                                              tool_parser="llama3_json")) == "llama3_json"
