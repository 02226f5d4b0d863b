"""Issue 12, items 10 and 12, over HTTP against the live server: inference and key requests that
were a 500 (lone surrogates, nesting too deep) or were accepted though they should be refused
(out-of-vocabulary stop tokens, unbounded stop strings, strings coerced to numbers and booleans,
`model` and `adapter_id` naming different adapters, two Authorization headers).

Every case is sent on one keep-alive connection: after each error the next request must be
served on that same connection, never reset."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from live_api import bearer

from loraloom.platform.api.schemas.generation import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
FIRST, SECOND = "hostile-a", "hostile-b"
CHAT = "/v1/chat/completions"
VOCAB_SIZE = 49152  # the bundled model's


@dataclass(frozen=True)
class Case:
    path: str
    body: Any  # sent as JSON text exactly as json.dumps writes it (ASCII, so "\ud800" stays an escape)
    status: int
    message: str
    param: str | None
    raw: bytes | None = None  # sent instead of `body`
    method: str = "POST"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": FIRST, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def surrogate(path: str, body: Any, param: str, method: str = "POST") -> Case:
    return Case(path, body, 400, "lone UTF-16 surrogate", param, method=method)


def deep(depth: int) -> bytes:
    return b'{"model": "hostile-a", "messages": [{"role": "user", "content": ' + b"[" * depth + b"]" * depth + b"}]}"


CASES: dict[str, Case] = {
    # ---- item 10: a lone surrogate reached the tokenizer (or the database driver): a 500
    "lone surrogate in chat content": surrogate(CHAT, chat(messages=[{"role": "user", "content": "a\ud800"}]),
                                                "messages[0].content"),
    "lone low surrogate in a text part": surrogate(
        CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]),
        "messages[0].content[0].text",
    ),
    "lone surrogate in a prompt": surrogate("/v1/completions", {"model": FIRST, "prompt": "\ud83d", "max_tokens": 2},
                                            "prompt"),
    "lone surrogate in a stop string": surrogate(CHAT, chat(stop=["ok", "\udc00"]), "stop[1]"),
    "lone surrogate in the model": surrogate(CHAT, chat(model="bot\ud800"), "model"),
    "lone surrogate in a key name": surrogate("/v1/keys", {"name": "ci\ud800", "role": "inference"}, "name"),
    "lone surrogate in an alias body": surrogate(f"/v1/adapters/{FIRST}/aliases/prod", {"version": 1, "x\ud800": 1},
                                                 "x\\ud800", method="PUT"),
    # ---- item 10: nesting too deep for the parser
    "chat body nested 100000 deep": Case(CHAT, None, 400, "nests arrays or objects too deeply", None, raw=deep(100_000)),
    "chat body nested 3000 deep": Case(CHAT, None, 400, "nests arrays or objects too deeply", None, raw=deep(3_000)),
    "chat content nested 500 deep": Case(CHAT, None, 400, "messages[0].content", "messages[0].content", raw=deep(500)),
    # ---- item 12: stop tokens outside the vocabulary
    "stop token -1": Case(CHAT, chat(stop_token_ids=[-1]), 400, f"[0, {VOCAB_SIZE})", "stop_token_ids"),
    "stop token 10**12": Case(CHAT, chat(stop_token_ids=[5, 10**12]), 400, f"[0, {VOCAB_SIZE})", "stop_token_ids"),
    "stop token past 64 bits": Case(CHAT, chat(stop_token_ids=[2**64]), 400, "stop_token_ids", "stop_token_ids"),
    "stop token the vocabulary size": Case("/v1/completions", {"model": FIRST, "prompt": "hi", "max_tokens": 2,
                                                                "stop_token_ids": [VOCAB_SIZE]},
                                           400, f"[0, {VOCAB_SIZE})", "stop_token_ids"),
    # ---- item 12: stop strings bounded
    "5000 stop strings": Case(CHAT, chat(stop=[f"s{i}" for i in range(5000)]), 400,
                              f"at most {MAX_STOP_STRINGS} stop strings", "stop"),
    "one stop string too many": Case(CHAT, chat(stop=[f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]), 400,
                                     f"at most {MAX_STOP_STRINGS} stop strings", "stop"),
    "a stop string of 100000 characters": Case(CHAT, chat(stop="x" * 100_000), 400,
                                               f"at most {MAX_STOP_STRING_CHARS} characters", "stop"),
    "a listed stop string one character too long": Case(
        "/v1/completions", {"model": FIRST, "prompt": "hi", "max_tokens": 2, "stop": ["ok", "y" * (MAX_STOP_STRING_CHARS + 1)]},
        400, f"at most {MAX_STOP_STRING_CHARS} characters", "stop",
    ),
    # ---- item 12: strings are not numbers or booleans (OpenAI refuses them)
    "max_tokens '5'": Case(CHAT, chat(max_tokens="5"), 400, "valid integer", "max_tokens"),
    "max_completion_tokens '5'": Case(CHAT, chat(max_completion_tokens="5"), 400, "valid integer",
                                      "max_completion_tokens"),
    "include_usage 'yes'": Case(CHAT, chat(stream=True, stream_options={"include_usage": "yes"}), 400,
                                "valid boolean", "stream_options.include_usage"),
    "stream 'true'": Case(CHAT, chat(stream="true"), 400, "valid boolean", "stream"),
    "temperature '0.5'": Case(CHAT, chat(temperature="0.5"), 400, "valid number", "temperature"),
    "seed '7'": Case(CHAT, chat(seed="7"), 400, "valid integer", "seed"),
    "logprobs 1 for true": Case(CHAT, chat(logprobs=1), 400, "valid boolean", "logprobs"),
    "completion logprobs '2'": Case("/v1/completions", {"model": FIRST, "prompt": "hi", "logprobs": "2"}, 400,
                                    "valid integer", "logprobs"),
    # ---- item 12: model and adapter_id must agree
    "model and adapter_id name different adapters": Case(CHAT, chat(model=SECOND, adapter_id=FIRST), 400,
                                                         f"model '{SECOND}' and adapter_id '{FIRST}'", "adapter_id"),
    "model an adapter, adapter_id the base": Case(CHAT, chat(model=FIRST, adapter_id="base"), 400,
                                                  f"model '{FIRST}' and adapter_id 'base'", "adapter_id"),
    "model another version of the adapter": Case(CHAT, chat(model=f"{FIRST}@1", adapter_id=f"{FIRST}@2"), 400,
                                                 "name different adapters", "adapter_id"),
}


@pytest.fixture(scope="module")
def adapters(live) -> None:
    """FIRST (versions 1 and 2) and SECOND, registered by acme's developer."""
    with live.http("acme-developer") as http:
        for name, sources in ((FIRST, ("v1", "v2")), (SECOND, ("v2",))):
            for source in sources:
                directory = live.adapters[source]
                files = [("files", (f, (directory / f).read_bytes(), "application/octet-stream")) for f in (CONFIG, WEIGHTS)]
                response = http.post(f"/v1/adapters/{name}/versions", files=files)
                assert response.status_code == 201, response.text


@pytest.fixture(scope="module")
def connection(live, adapters):
    """One keep-alive connection (a pool of one) for every case of the module, as the admin of no tenant."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=live.url, headers=bearer(live.keys["acme-developer"]), timeout=120,
                      limits=limits) as client:
        yield client


def local_port(response: httpx.Response) -> int:
    """The client side's port: the same port means the same TCP connection."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


@pytest.mark.parametrize("case_name", list(CASES))
def test_hostile_request_is_a_4xx_naming_the_field_and_keeps_the_connection(connection, case_name):
    case = CASES[case_name]
    content = case.raw if case.raw is not None else json.dumps(case.body).encode()
    response = connection.request(case.method, case.path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert case.message in error["message"], error
    assert error["param"] == case.param, error
    follow_up = connection.get("/v1/models")
    assert follow_up.status_code == 200
    assert local_port(follow_up) == local_port(response), "the error closed the keep-alive connection"


def test_model_may_name_the_base_or_the_same_adapter_beside_adapter_id(connection, live):
    for model in ("base", live_base_name(connection), FIRST, f"{FIRST}:latest"):
        response = connection.post(CHAT, json=chat(model=model, adapter_id=FIRST))
        assert response.status_code == 200, (model, response.text)


def live_base_name(connection) -> str:
    # The base is listed as `base` and by its own name, which is every base card's `root`.
    return next(card["root"] for card in connection.get("/v1/models").json()["data"] if card.get("parent") is None)


def test_two_authorization_headers_are_refused_even_when_both_are_valid(live):
    good = bearer(live.keys["acme-developer"])["Authorization"]
    for second in (good, bearer(live.keys["acme-inference"])["Authorization"], "Bearer nonsense"):
        response = httpx.get(f"{live.url}/v1/models", headers=[("Authorization", good), ("Authorization", second)])
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        assert "2 Authorization headers" in error["message"] and error["code"] == "invalid_authorization_header"
