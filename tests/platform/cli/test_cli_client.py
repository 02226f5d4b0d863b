"""The HTTP client commands (`loraloom keys ...`, `loraloom adapters ...`) run as real commands
against a live server with the adapter registry, checked through the API and the database."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.engine.lora.weights import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.api.composition import compose_app
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script


@dataclass
class ClientServer:
    url: str
    keys: dict[str, str]
    adapters: list[Path]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Iterator[ClientServer]:
    adapter_root = tmp_path_factory.mktemp("adapters")
    adapters = [
        make_peft_adapter(model_dir, adapter_root / "v1", rank=4, alpha=8, target_modules=["q_proj"], seed=31),
        make_peft_adapter(model_dir, adapter_root / "v2", rank=2, alpha=4, target_modules=["v_proj"], seed=32),
    ]
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    keys = {
        "admin": make_key(settings, tenant="default", role="admin"),
        "developer": make_key(settings, tenant="default", role="developer"),
    }
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=16), adapter_fetcher_from_settings(settings, store))
    app = compose_app(settings, engine)
    with serve_in_thread(app) as url:
        yield ClientServer(url=url, keys=keys, adapters=adapters)


def loraloom(server: ClientServer, key: str | None, *args: str, base_url: str | None = None):
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    env["LORALOOM_BASE_URL"] = base_url or server.url
    if key is not None:
        env["LORALOOM_API_KEY"] = server.keys.get(key, key)
    return subprocess.run([str(LORALOOM), *args], env=env, capture_output=True, text=True, timeout=120)


def test_keys_create_list_revoke(server):
    created = loraloom(server, "admin", "keys", "create", "--name", "ci", "--role", "inference")
    assert created.returncode == 0, created.stderr
    new_key = created.stdout.strip()
    assert created.stdout == new_key + "\n" and new_key.startswith("ll-")  # only the key on stdout
    assert new_key not in created.stderr and new_key[:11] in created.stderr
    assert httpx.get(f"{server.url}/v1/models", headers=bearer(new_key), timeout=60).status_code == 200

    listing = loraloom(server, "developer", "keys", "list")
    assert listing.returncode == 0, listing.stderr
    header, *lines = listing.stdout.splitlines()
    assert header.split()[:4] == ["ID", "PREFIX", "NAME", "ROLE"]
    rows = {line.split()[1]: line.split() for line in lines}
    assert rows[new_key[:11]][2:4] == ["ci", "inference"] and new_key not in listing.stdout
    key_id = rows[new_key[:11]][0]

    revoked = loraloom(server, "admin", "keys", "revoke", key_id)
    assert revoked.returncode == 0 and key_id in revoked.stdout, revoked.stderr
    refused = httpx.get(f"{server.url}/v1/models", headers=bearer(new_key), timeout=60)
    assert refused.status_code == 401
    after = {line.split()[1]: line.split() for line in loraloom(server, "admin", "keys", "list").stdout.splitlines()}
    assert after[new_key[:11]][-1] != "-"  # the REVOKED column has a time now


def test_client_errors_are_one_clear_line(server):
    refused = loraloom(server, "developer", "keys", "create", "--name", "x", "--role", "admin")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "403" in refused.stderr and "'admin'" in refused.stderr and "Traceback" not in refused.stderr

    no_key = loraloom(server, None, "keys", "list")
    assert no_key.returncode == 1 and "LORALOOM_API_KEY is not set" in no_key.stderr

    unknown = loraloom(server, "ll-made-up", "keys", "list")
    assert unknown.returncode == 1 and "401" in unknown.stderr and "ll-made-up" not in unknown.stderr

    unreachable = loraloom(server, "admin", "keys", "list", base_url="http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "LORALOOM_BASE_URL" in unreachable.stderr


def test_adapters_push_list_versions_promote_rm(server, tmp_path):
    first, second = server.adapters
    pushed = loraloom(server, "developer", "adapters", "push", str(first), "--name", "support", "--alias", "prod")
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout == "support@1\n"
    # The progress bar went over every byte of both files.
    assert "push support" in pushed.stderr and "100%" in pushed.stderr
    assert "support:prod -> support@1" in pushed.stderr

    assert loraloom(server, "developer", "adapters", "push", str(second), "--name", "support").stdout == "support@2\n"

    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(server.keys["developer"])) as http:
        versions = http.get("/v1/adapters/support/versions").json()["data"]
        sizes = {f["filename"]: f["size_bytes"] for f in versions[0]["files"]}
        assert sizes == {name: (first / name).stat().st_size for name in (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)}

        listed = loraloom(server, "developer", "adapters", "list").stdout.splitlines()
        assert listed[0].split() == ["NAME", "ALIASES", "UPDATED"]
        assert listed[1].split()[:3] == ["support", "latest=2", "prod=1"]

        table = loraloom(server, "developer", "adapters", "versions", "support").stdout.splitlines()
        assert [line.split()[:3] for line in table[1:]] == [["1", "ready", "4"], ["2", "ready", "2"]]

        promoted = loraloom(server, "developer", "adapters", "promote", "support", "prod", "2")
        assert promoted.returncode == 0, promoted.stderr
        assert http.get("/v1/adapters/support/aliases/prod").json()["version"] == 2

        removed = loraloom(server, "developer", "adapters", "rm", "support@1")
        assert removed.returncode == 0, removed.stderr
        assert [v["version"] for v in http.get("/v1/adapters/support/versions").json()["data"]] == [2]
        aliased = loraloom(server, "developer", "adapters", "rm", "support@2")
        assert aliased.returncode == 1 and "409" in aliased.stderr  # prod points at it
        guarded = loraloom(server, "developer", "adapters", "rm", "support")
        assert guarded.returncode == 1 and "409" in guarded.stderr and "prod" in guarded.stderr
        assert http.get("/v1/adapters/support").status_code == 200
        assert loraloom(server, "developer", "adapters", "rm", "support", "--force").returncode == 0
        assert http.get("/v1/adapters/support").status_code == 404

    (tmp_path / "incomplete").mkdir()
    (tmp_path / "incomplete" / ADAPTER_CONFIG_FILE).write_text("{}")
    incomplete = loraloom(server, "developer", "adapters", "push", str(tmp_path / "incomplete"), "--name", "x")
    assert incomplete.returncode == 1 and ADAPTER_WEIGHTS_FILE in incomplete.stderr


def test_listings_print_the_api_s_items_as_json(server):
    pushed = loraloom(server, "developer", "adapters", "push", str(server.adapters[0]), "--name", "listed")
    assert pushed.returncode == 0, pushed.stderr
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(server.keys["developer"])) as http:
        for command, path in ((("adapters", "list"), "/v1/adapters"),
                              (("adapters", "versions", "listed"), "/v1/adapters/listed/versions"),
                              (("keys", "list"), "/v1/keys")):
            listed = loraloom(server, "developer", *command, "--json")
            assert listed.returncode == 0, listed.stderr
            assert json.loads(listed.stdout) == http.get(path).json()["data"], command


def test_pushing_a_pickle_shows_the_server_s_own_refusal(server, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / ADAPTER_CONFIG_FILE).write_bytes((server.adapters[0] / ADAPTER_CONFIG_FILE).read_bytes())
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(server.keys["developer"])) as http:
        direct = http.post("/v1/adapters/pickled/versions", files=[
            ("files", (path.name, path.read_bytes())) for path in sorted(pickled.iterdir())])
    assert direct.status_code == 400
    message = direct.json()["error"]["message"]
    assert "pickle" in message

    refused = loraloom(server, "developer", "adapters", "push", str(pickled), "--name", "pickled")
    assert refused.returncode == 1 and refused.stdout == ""
    assert message in refused.stderr and "400" in refused.stderr


def test_pushing_a_directory_brings_its_chat_template(server, tmp_path):
    """A fine-tune saved with its tokenizer holds tokenizer_config.json: push sends it, and the server
    keeps its chat_template (and nothing else of it)."""
    directory = tmp_path / "templated"
    shutil.copytree(server.adapters[0], directory)
    template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    pushed = loraloom(server, "developer", "adapters", "push", str(directory), "--name", "templated")
    assert pushed.returncode == 0, pushed.stderr
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(server.keys["developer"])) as http:
        version = http.get("/v1/adapters/templated/versions/1").json()
        assert version["chat_template"] is True
        assert http.get("/v1/adapters/templated/versions/1/files/chat_template.jinja").text == template
