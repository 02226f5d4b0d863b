"""An adapter's own chat template, through a live app (registry on SQLite, file:// blobs, the bundled
model): uploaded beside the weights (as chat_template.jinja, or inside tokenizer_config.json in an
archive), its chats render with it (the prompt the engine counts is the one it renders), the version
shows it, download returns it byte for byte, and a template that cannot render is a 400 naming its
line with nothing stored. Server-local adapters (`--adapter-dir`) bring theirs the same way: chats to
them render with it, and one whose template cannot render is refused by name and line."""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_registry import LiveRegistry, live_registry

from loraloom.engine import ADAPTER_FILES

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
# ChatML as the bundled model writes it, under a system line of the adapter's own.
OWN_TEMPLATE = (
    "{{ '<|im_start|>system\\nYou are the geography adapter. Answer with one city name.<|im_end|>\\n' }}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class Live(LiveRegistry):
    def prompt_tokens(self, model: str) -> int:
        return self.chat_prompt_tokens(model, CHAT)


# Server-local adapters, each a copy of the PEFT adapter with these files beside it.
LOCAL_FILES = {
    "local-own": {"chat_template.jinja": OWN_TEMPLATE},
    "local-config": {"tokenizer_config.json": json.dumps({"chat_template": OWN_TEMPLATE, "eos_token": "<|im_end|>"})},
    "local-plain": {},
    "local-bad": {"chat_template.jinja": "{% for message in messages %}\n{{ message.content }\n{% endfor %}"},
}


@pytest.fixture(scope="module")
def live(model_dir, peft_adapter, tmp_path_factory) -> Iterator[Live]:
    adapter_dir = tmp_path_factory.mktemp("local")
    for name, files in LOCAL_FILES.items():
        directory = Path(shutil.copytree(peft_adapter, adapter_dir / name))
        for filename, text in files.items():
            (directory / filename).write_text(text)
    with live_registry(model_dir, tmp_path_factory, adapter_dir) as live:
        yield Live(live.client, live.engine, live.acme)


def test_chats_render_with_the_adapters_own_template(live, peft_adapter):
    plain = live.push("geo", peft_adapter)
    own = live.push("geo", peft_adapter, {"chat_template.jinja": OWN_TEMPLATE.encode()})
    # The same weights with a template are a new version, not the old one again.
    assert (plain.status_code, own.status_code) == (201, 201), own.text
    assert (plain.json()["chat_template"], own.json()["chat_template"]) == (False, True)
    assert "chat_template.jinja" in [file["filename"] for file in own.json()["files"]]
    expected = len(live.engine.tokenizer.with_chat_template(OWN_TEMPLATE).encode_chat(CHAT))
    assert live.prompt_tokens("geo@2") == expected
    assert live.prompt_tokens("geo@1") == len(live.engine.tokenizer.encode_chat(CHAT)) != expected
    shown = live.client.get("/v1/adapters/geo/versions/2", headers=live.acme)
    assert shown.status_code == 200 and shown.json()["chat_template"] is True
    download = live.client.get("/v1/adapters/geo/versions/2/files/chat_template.jinja", headers=live.acme)
    assert download.status_code == 200 and download.content == OWN_TEMPLATE.encode()
    none = live.client.get("/v1/adapters/geo/versions/1/files/chat_template.jinja", headers=live.acme)
    assert none.status_code == 404


def test_an_archive_with_tokenizer_config_keeps_its_template(live, peft_adapter):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in ADAPTER_FILES:
            archive.add(peft_adapter / name, arcname=f"adapter/{name}")
        config = json.dumps({"chat_template": OWN_TEMPLATE, "eos_token": "<|im_end|>"}).encode()
        member = tarfile.TarInfo("adapter/tokenizer_config.json")
        member.size = len(config)
        archive.addfile(member, io.BytesIO(config))
    response = live.client.post("/v1/adapters/archived/versions", headers=live.acme,
                                files=[("files", ("adapter.tar.gz", buffer.getvalue(), "application/gzip"))])
    assert response.status_code == 201, response.text
    assert sorted(file["filename"] for file in response.json()["files"]) == sorted(
        [*ADAPTER_FILES, "chat_template.jinja"])
    download = live.client.get("/v1/adapters/archived/versions/1/files/chat_template.jinja", headers=live.acme)
    assert download.content == OWN_TEMPLATE.encode()


@pytest.mark.parametrize(
    ("template", "line"),
    [
        ("{% for message in messages %}\n{{ message.content }\n{% endfor %}", "line 2"),  # does not compile
        ("{{ bos_token }}\n{{ messages[0].content + 1 }}", "line 2"),  # fails when rendered
        ("first\nsecond\n{{ raise_exception('this template takes no user turns') }}", "line 3"),
    ],
)
def test_a_template_that_cannot_render_is_refused_and_nothing_is_stored(live, peft_adapter, template, line):
    response = live.push("broken", peft_adapter, {"chat_template.jinja": template.encode()})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "chat_template", response.text
    assert f"chat_template: {line}:" in error["message"]
    assert live.client.get("/v1/adapters/broken", headers=live.acme).status_code == 404


def test_server_local_adapters_render_with_their_own_template(live):
    expected = len(live.engine.tokenizer.with_chat_template(OWN_TEMPLATE).encode_chat(CHAT))
    assert live.prompt_tokens("local-own") == live.prompt_tokens("local-config") == expected
    assert live.prompt_tokens("local-plain") == len(live.engine.tokenizer.encode_chat(CHAT)) != expected


def test_a_server_local_template_that_cannot_render_refuses_its_adapter_by_name_and_line(live):
    response = live.client.post("/v1/chat/completions", headers=live.acme,
                                json={"model": "local-bad", "messages": CHAT, "max_tokens": 1})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "model", response.text
    assert error["message"].startswith("adapter 'local-bad': chat_template: line 2:"), error
    listed = [model["id"] for model in live.client.get("/v1/models", headers=live.acme).json()["data"]]
    assert "local-bad" not in listed and {"local-own", "local-config", "local-plain"} <= set(listed)
