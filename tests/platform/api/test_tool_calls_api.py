"""Tool calling through the official `openai` package against a live server on the bundled model:
named and `required` calls on 50 generated function schemas parse and validate (on the base and on an
adapter), streamed calls assemble to the non-streamed ones (auto calls too, their arguments streamed as
generated), and a call, its result and the answer make a round trip. Parsing of free (`auto`) answers is checked on canned text in test_tool_formats.py."""
from __future__ import annotations

import json
import random
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

MAX_TOKENS = 96
NUM_SCHEMAS = 50
MODELS = ("base", "alpha")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def strict_object(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def leaf(rng: random.Random) -> dict:
    """One bounded value: every kind the issue names (bounded so a small model's answer stays short)."""
    kind = rng.randrange(7)
    if kind == 0:
        return {"type": "string", "maxLength": rng.choice([6, 12])}
    if kind == 1:
        low = rng.randint(-20, 10)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 30)}
    if kind == 2:
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 10, 100])}
    if kind == 3:
        return {"type": "boolean"}
    if kind == 4:
        return {"enum": rng.sample(["red", "green", "blue", "north", "south", "low", "high"], rng.randint(2, 4))}
    if kind == 5:
        return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": rng.randint(0, 1), "maxItems": rng.randint(2, 3)}
    return {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}


def function_schema(rng: random.Random) -> dict:
    """1 to 3 properties, some of them nested objects (up to two levels)."""
    properties = {}
    for index in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            inner = {f"inner{j}": leaf(rng) for j in range(rng.randint(1, 2))}
            if rng.random() < 0.3:
                inner["deep"] = strict_object({"flag": {"type": "boolean"}})
            properties[f"field{index}"] = strict_object(inner)
        else:
            properties[f"field{index}"] = leaf(rng)
    return strict_object(properties)


def generated_tools(count: int, seed: int = 38) -> list[dict]:
    rng = random.Random(seed)
    return [{"type": "function", "function": {"name": f"tool_{index}", "description": f"Tool number {index}.",
                                              "parameters": function_schema(rng)}} for index in range(count)]


TOOLS = generated_tools(NUM_SCHEMAS)


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory) -> Iterator[openai.OpenAI]:
    root = tmp_path_factory.mktemp("tool_calls")
    adapters = {"alpha": make_peft_adapter(model_dir, root / "alpha", rank=8, alpha=16,
                                           target_modules=["q_proj", "v_proj"], seed=38)}
    settings = migrated_settings(root / "data")
    api_key = make_key(settings, tenant="default", role="inference")
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=1024, max_num_seqs=32))
    lookup = LocalAdapterLookup({engine.model_name}, adapters, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=300)


def check_call(call, tools: list[dict]) -> None:
    """The call names one of `tools` and its arguments parse and validate against that tool's schema."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in schemas, call
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def named(tool: dict) -> dict:
    return {"type": "function", "function": {"name": tool["function"]["name"]}}


def test_named_calls_follow_every_schema(client):
    """Each schema is forced once, alternately on the base model and on the adapter, all at once."""

    def call(index: int):
        tool = TOOLS[index]
        return client.chat.completions.create(
            model=MODELS[index % 2], messages=[{"role": "user", "content": f"Use tool_{index}."}],
            tools=[tool], tool_choice=named(tool), max_tokens=MAX_TOKENS, temperature=1.0, top_p=1.0, seed=index,
        )  # top_p too: the model's own default (0.9) would otherwise apply, and with these seeds it let
        # one call write a number's zeros until max_tokens (finish "length": valid so far, but unfinished)

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(call, range(NUM_SCHEMAS)))
    for tool, response in zip(TOOLS, responses):
        [choice] = response.choices
        # A named call finishes as OpenAI finishes it: "stop", with no content beside the call.
        assert choice.finish_reason == "stop" and choice.message.content is None, choice
        [call] = choice.message.tool_calls
        assert call.function.name == tool["function"]["name"]
        check_call(call, [tool])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_pick_offered_functions(client, parallel):
    # Each schema in one group of five: the first 30 with parallel calls, the other 20 without.
    starts = range(0, 30, 5) if parallel else range(30, NUM_SCHEMAS, 5)
    groups = [TOOLS[start:start + 5] for start in starts]

    def call(index: int):
        return client.chat.completions.create(
            model=MODELS[index % 2], messages=[{"role": "user", "content": "Call the tools you need."}],
            tools=groups[index], tool_choice="required", parallel_tool_calls=parallel, max_tokens=MAX_TOKENS * 2,
            seed=index,
        )

    with ThreadPoolExecutor(len(groups)) as pool:
        responses = list(pool.map(call, range(len(groups))))
    for group, response in zip(groups, responses):
        [choice] = response.choices
        assert choice.finish_reason == "tool_calls", choice
        assert 1 <= len(choice.message.tool_calls) <= (4 if parallel else 1)
        for tool_call in choice.message.tool_calls:
            check_call(tool_call, group)


def assembled(stream) -> tuple[list[tuple[str, str]], str | None, str]:
    """(name, arguments) per call from tool_calls deltas, the finish reason, and the content; each
    call's arguments must come in more than one fragment (as generated, not whole at the end)."""
    calls: dict[int, dict] = {}
    fragments: dict[int, int] = {}
    finish_reason, content = None, ""
    for chunk in stream:
        [choice] = chunk.choices
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                # OpenAI's order: a call's first delta carries its id, type and name.
                assert delta.id.startswith("call_") and delta.type == "function" and delta.function.name
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.id is None and delta.function.name is None
            calls[delta.index]["arguments"] += delta.function.arguments or ""
            fragments[delta.index] = fragments.get(delta.index, 0) + bool(delta.function.arguments)
        finish_reason = choice.finish_reason or finish_reason
    assert calls and all(count > 1 for count in fragments.values()), fragments
    return [(call["name"], call["arguments"]) for _, call in sorted(calls.items())], finish_reason, content


@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_streamed_calls_assemble_to_the_same_calls(client, tool_choice):
    tools = TOOLS[:3]
    fields = dict(model="alpha", messages=[{"role": "user", "content": "Call a tool."}], tools=tools,
                  tool_choice=named(tools[1]) if tool_choice == "named" else "required", max_tokens=MAX_TOKENS,
                  temperature=0.0)
    whole = client.chat.completions.create(**fields).choices[0]
    calls, finish_reason, content = assembled(client.chat.completions.create(**fields, stream=True))
    # The same calls: names, and arguments that parse to the same values (streamed as the model wrote them).
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [
        (call.function.name, json.loads(call.function.arguments)) for call in whole.message.tool_calls]
    assert finish_reason == whole.finish_reason and content == ""


def past_call(city: str, index: int) -> dict:
    arguments = json.dumps({"city": city})
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{index}", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}


# The bundled model calls on its own (tool_choice auto) once its history shows it calling.
CALLING_HISTORY = [{"role": "user", "content": "Weather in Berlin?"}, past_call("Berlin", 1),
                   {"role": "user", "content": "Weather in Rome?"}, past_call("Rome", 2),
                   {"role": "user", "content": "Weather in Paris?"}]


def test_a_streamed_auto_call_arrives_as_it_is_generated(client):
    """An auto call, streamed: its arguments come in several deltas as the model writes them (not whole at
    the end), and assemble to the call the same request gets whole."""
    fields = dict(model="base", messages=CALLING_HISTORY, tools=[WEATHER], max_tokens=MAX_TOKENS, temperature=0.0)
    whole = client.chat.completions.create(**fields).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    calls, finish_reason, content = assembled(client.chat.completions.create(**fields, stream=True))
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [
        (call.function.name, json.loads(call.function.arguments)) for call in whole.message.tool_calls]
    assert finish_reason == "tool_calls" and content == ""


def test_a_call_its_result_and_the_answer(client):
    """Call get_weather, send its result back as a tool message, and get an answer in words."""
    first = client.chat.completions.create(model="base", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=MAX_TOKENS, temperature=0.0)
    message = first.choices[0].message
    [call] = message.tool_calls
    check_call(call, [WEATHER])
    history = [*ASK, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "sunny"}'}]
    answer = client.chat.completions.create(model="base", messages=history, tools=[WEATHER], max_tokens=24,
                                            temperature=0.0)
    without_call = client.chat.completions.create(model="base", messages=ASK, tools=[WEATHER], max_tokens=1)
    [choice] = answer.choices
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    # The history's call and result reached the prompt: it is longer by at least the call's arguments.
    grown = answer.usage.prompt_tokens - without_call.usage.prompt_tokens
    assert grown > len(call.function.arguments) // 4, (answer.usage, without_call.usage)


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice",
         "not in tools"),
        (dict(tool_choice="required"), "tool_choice", "needs tools"),
        (dict(tools=[WEATHER, WEATHER]), "tools", "unique"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name", "letters"),
        (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice", "required"),
        (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "response_format",
         "tool_choice"),
        (dict(functions=[WEATHER["function"]]), "functions", "send tools"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "foo"}}}}}], tool_choice="required"), "tools",
         "Invalid type"),
    ],
)
def test_tool_fields_that_do_not_fit_are_refused(client, fields, param, says):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="base", messages=ASK, max_tokens=2, **fields)
    assert bad.value.param == param and says in bad.value.message, bad.value.body
