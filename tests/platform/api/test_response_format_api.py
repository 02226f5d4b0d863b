"""response_format json_object and json_schema through the official `openai` package against a live
server on the bundled model: the outputs parse and validate, even when many schemas share one batch
with unconstrained requests over different adapters, and those requests keep their solo output.
The mask itself is checked against random logits in tests/engine/test_structured_output.py."""
from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from live_api import make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.registry.local import LocalAdapterLookup

MAX_TOKENS = 80
ADAPTERS = ("base", "alpha", "beta")


def obj(properties: dict, required: list[str] | None = None) -> dict:
    """An object in OpenAI's strict style: every property required, no others."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False}


NAME = {"type": "string", "maxLength": 20}
SCHEMAS = [
    obj({"name": NAME}),
    obj({"age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"ok": {"type": "boolean"}}),
    obj({"price": {"type": "number", "minimum": 0, "maximum": 1000}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"city": NAME, "country": NAME, "capital": {"type": "boolean"}}),
    obj({"tags": {"type": "array", "items": NAME, "maxItems": 3}}),
    obj({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 1, "maxItems": 4}}),
    obj({"user": obj({"name": NAME, "admin": {"type": "boolean"}})}),
    obj({"point": obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                       "y": {"type": "integer", "minimum": -9, "maximum": 9}})}),
    obj({"status": {"enum": ["open", "closed"]}, "priority": {"enum": [1, 2, 3]}}),
    obj({"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
    obj({"items": {"type": "array", "maxItems": 2,
                   "items": obj({"sku": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    obj({"title": NAME, "draft": {"type": "boolean"}, "words": {"type": "integer", "minimum": 0, "maximum": 999}}),
    obj({"name": NAME, "nickname": NAME}, required=["name"]),
    obj({"unit": {"const": "celsius"}, "value": {"type": "integer", "minimum": -50, "maximum": 50}}),
    obj({"a": obj({"b": obj({"c": {"type": "boolean"}})})}),
    obj({"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 4},
         "friendly": {"type": "boolean"}}),
    obj({"pair": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}}),
]
PROMPTS = ["Describe a person as JSON.", "Give me a JSON record.", "Answer in JSON about the weather in Paris."]
# Any JSON object: the model picks its size, so these ask for small ones.
OBJECT_PROMPTS = ['Reply with a JSON object with one key "answer": is the sky blue?',
                  'Give a JSON object with the keys "name" and "age" for a person.',
                  'Return {"fruit": ...} naming one fruit, as JSON.']
FREE_PROMPTS = ["Say only the word hello.", "What is the capital of France?", "Name a fruit."]


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory) -> Iterator[openai.OpenAI]:
    root = tmp_path_factory.mktemp("structured_output")
    adapters = {
        "alpha": make_peft_adapter(model_dir, root / "alpha", rank=8, alpha=16,
                                   target_modules=["q_proj", "v_proj"], seed=31),
        "beta": make_peft_adapter(model_dir, root / "beta", rank=4, alpha=8,
                                  target_modules=["gate_proj", "down_proj"], seed=32),
    }
    settings = migrated_settings(root / "data")
    api_key = make_key(settings, tenant="default", role="inference")
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=512, max_num_seqs=32))
    lookup = LocalAdapterLookup({engine.model_name}, adapters, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=300)


def chat(client: openai.OpenAI, prompt: str, model: str = "base", **fields) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                          max_tokens=MAX_TOKENS, temperature=0, **fields)


def schema_format(index: int) -> dict:
    return {"type": "json_schema", "json_schema": {"name": f"schema_{index}", "schema": SCHEMAS[index], "strict": True}}


def test_schemas_and_free_requests_in_one_batch(client):
    """Every schema at once, with json_object and free requests over three adapters in the same batch."""
    constrained = [dict(prompt=PROMPTS[i % len(PROMPTS)], model=ADAPTERS[i % 3], response_format=schema_format(i))
                   for i in range(len(SCHEMAS))]
    constrained += [dict(prompt=OBJECT_PROMPTS[i], model=ADAPTERS[i], response_format={"type": "json_object"})
                    for i in range(3)]
    free = [dict(prompt=FREE_PROMPTS[i], model=ADAPTERS[(i + 1) % 3]) for i in range(3)]
    solo_free = [chat(client, **fields).choices[0].message.content for fields in free]
    with ThreadPoolExecutor(len(constrained) + len(free)) as pool:
        replies = list(pool.map(lambda fields: chat(client, **fields), constrained + free))
    for fields, reply in zip(constrained, replies):
        [choice] = reply.choices
        assert choice.finish_reason == "stop", (fields, choice.message.content)
        value = json.loads(choice.message.content)
        assert isinstance(value, dict)
        if fields["response_format"]["type"] == "json_schema":
            jsonschema.validate(value, fields["response_format"]["json_schema"]["schema"])
    assert [reply.choices[0].message.content for reply in replies[len(constrained):]] == solo_free


def test_json_object_streams_and_completions_take_response_format(client):
    chunks = chat(client, OBJECT_PROMPTS[1], response_format={"type": "json_object"}, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert isinstance(json.loads(streamed), dict)
    reply = client.completions.create(model="alpha", prompt="A JSON object describing a cat:", max_tokens=MAX_TOKENS,
                                      temperature=0, extra_body={"response_format": schema_format(18)})
    jsonschema.validate(json.loads(reply.choices[0].text), SCHEMAS[18])


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "xml"},
        {"type": "json_object", "json_schema": {}},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},  # no name
        {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {"type": "object"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/missing"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["x" * 40_000]}}},  # too big
    ],
)
def test_bad_response_formats_are_400s_naming_response_format(client, response_format):
    with pytest.raises(openai.BadRequestError) as bad:
        chat(client, PROMPTS[0], response_format=response_format)
    assert bad.value.param == "response_format", bad.value.body
    assert bad.value.body["message"].startswith("response_format"), bad.value.body
