"""The sampling fields' ranges, checked by the request schemas (once: the engine checks only what needs
the model, tests/engine/test_request_checks.py) against the engine's bounds, which the OpenAPI document
states. Over HTTP on a small app with the completions bodies and the API's error handlers; no engine."""
from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from loraloom.engine import MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_TOKENS, MAX_PENALTY, MAX_TEMPERATURE, MAX_TOP_LOGPROBS
from loraloom.platform.api.errors import install_error_handlers
from loraloom.platform.api.schemas.chat import ChatCompletionRequest
from loraloom.platform.api.schemas.completions import CompletionRequest

CHAT = {"model": "base", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "base", "prompt": "hi", "max_tokens": 16}


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/completions")
    async def completions(body: CompletionRequest) -> dict[str, bool]:
        return {"accepted": True}

    @app.post("/chat")
    async def chat(body: ChatCompletionRequest) -> dict[str, bool]:
        return {"accepted": True}

    return TestClient(app)


def refusal(client: TestClient, path: str, body: dict) -> dict:
    # As json.dumps writes it: NaN and Infinity are literals Python's JSON reader (and so FastAPI) accepts.
    response = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (dict(temperature=MAX_TEMPERATURE + 0.5), "temperature", f"less than or equal to {MAX_TEMPERATURE:g}"),
        (dict(temperature=-0.1), "temperature", "got -0.1"),
        (dict(temperature=float("nan")), "temperature", "finite"),
        (dict(top_p=0.0), "top_p", "greater than 0, got 0.0"),
        (dict(top_p=1.5), "top_p", "less than or equal to 1"),
        (dict(top_k=-2), "top_k", "greater than or equal to -1"),
        (dict(max_tokens=0), "max_tokens", "greater than or equal to 1, got 0"),
        (dict(min_tokens=-1), "min_tokens", "greater than or equal to 0"),
        (dict(presence_penalty=2.5), "presence_penalty", f"less than or equal to {MAX_PENALTY:g}"),
        (dict(frequency_penalty=-2.01), "frequency_penalty", f"greater than or equal to -{MAX_PENALTY:g}"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty", "finite"),
        (dict(repetition_penalty=0.0), "repetition_penalty", "greater than 0"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty", "finite"),
        (dict(logit_bias={"5": MAX_LOGIT_BIAS + 1}), "logit_bias", "for token 5"),
        (dict(logit_bias={"5": float("nan")}), "logit_bias", "biases must be between"),
        (dict(logit_bias={str(i): 1.0 for i in range(MAX_LOGIT_BIAS_TOKENS + 1)}), "logit_bias",
         f"at most {MAX_LOGIT_BIAS_TOKENS} tokens"),
        (dict(logprobs=MAX_TOP_LOGPROBS + 1), "logprobs", f"less than or equal to {MAX_TOP_LOGPROBS}"),
    ],
)
def test_a_value_out_of_range_is_a_400_naming_the_field(client, fields, param, says):
    error = refusal(client, "/completions", COMPLETION | fields)
    assert error["param"] == param and error["message"].startswith(f"{param}: ") and says in error["message"], error


@pytest.mark.parametrize(
    ("fields", "param"),
    [(dict(max_completion_tokens=0), "max_completion_tokens"),
     (dict(logprobs=True, top_logprobs=MAX_TOP_LOGPROBS + 1), "top_logprobs")],
)
def test_chat_fields_of_their_own_are_bounded_too(client, fields, param):
    error = refusal(client, "/chat", CHAT | fields)
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error


def test_the_ends_of_the_ranges_are_accepted(client):
    edges = dict(temperature=MAX_TEMPERATURE, top_p=1.0, top_k=-1, presence_penalty=-MAX_PENALTY,
                 frequency_penalty=MAX_PENALTY, repetition_penalty=1e-3, min_tokens=16, logprobs=MAX_TOP_LOGPROBS,
                 logit_bias={str(i): MAX_LOGIT_BIAS for i in range(MAX_LOGIT_BIAS_TOKENS)})
    response = client.post("/completions", json=COMPLETION | edges)
    assert response.status_code == 200, response.text


def test_the_openapi_document_states_the_engines_bounds():
    fields = CompletionRequest.model_json_schema()["properties"]

    def bounds(name: str) -> dict:
        [number] = [part for part in fields[name].get("anyOf", [fields[name]]) if part.get("type") != "null"]
        return {key: number[key] for key in ("minimum", "maximum", "exclusiveMinimum") if key in number}

    assert bounds("temperature") == {"minimum": 0, "maximum": MAX_TEMPERATURE}
    assert bounds("presence_penalty") == {"minimum": -MAX_PENALTY, "maximum": MAX_PENALTY}
    assert bounds("logprobs") == {"minimum": 0, "maximum": MAX_TOP_LOGPROBS}
    assert bounds("top_p") == {"exclusiveMinimum": 0, "maximum": 1}
    # The prose says the same numbers, made from the same constants.
    assert f"-{MAX_PENALTY:g} and {MAX_PENALTY:g}" in fields["frequency_penalty"]["description"]
    assert f"-{MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g}" in fields["logit_bias"]["description"]
