"""OpenAI's and vLLM's common request fields through the official `openai` package against a live
server on the bundled model: the developer role, presence and frequency penalties, repetition_penalty,
logit_bias and min_tokens. The sampler's arithmetic is checked in tests/engine/test_sampler.py;
here, that each field reaches it and does what OpenAI's documentation says, per request."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
import pytest
from live_api import make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter
from sqlalchemy import select

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.api.schemas.ignored_fields import IGNORED_FIELDS_HEADER
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import UsageRecord
from loraloom.platform.registry.local import LocalAdapterLookup

REPETITIVE_PROMPT = "I like cats. I like cats. I like cats."  # greedy goes on repeating itself
SHORT_ANSWER = [{"role": "user", "content": "Say only the word hello."}]  # greedy: "Hello." then end of sequence


@dataclass
class Server:
    client: openai.OpenAI
    engine: AsyncEngine
    database_url: str


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("sampling_fields")
    adapters = {
        "alpha": make_peft_adapter(model_dir, root / "alpha", rank=8, alpha=16,
                                   target_modules=["q_proj", "v_proj"], seed=21),
        "beta": make_peft_adapter(model_dir, root / "beta", rank=4, alpha=8,
                                  target_modules=["gate_proj", "down_proj"], seed=22),
    }
    settings = migrated_settings(root / "data")
    api_key = make_key(settings, tenant="default", role="inference")
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=256))
    lookup = LocalAdapterLookup({engine.model_name}, adapters, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=120)
        yield Server(client=client, engine=engine, database_url=settings.database_url)


def complete(server: Server, **fields) -> openai.types.Completion:
    arguments = dict(model="base", prompt=REPETITIVE_PROMPT, max_tokens=12, temperature=0) | fields
    return server.client.completions.create(**arguments)


def single_token_id(server: Server, text: str) -> int:
    ids = server.engine.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is {len(ids)} tokens"
    return ids[0]


def test_developer_role_is_answered_as_system(server):
    def answer(role: str) -> openai.types.chat.ChatCompletion:
        messages = [{"role": role, "content": "You answer every question in French."},
                    {"role": "user", "content": "What is the capital of France?"}]
        return server.client.chat.completions.create(model="base", messages=messages, max_tokens=8, temperature=0)

    developer, system = answer("developer"), answer("system")
    assert developer.choices[0].message.content == system.choices[0].message.content
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens


def test_logit_bias_forbids_and_forces_tokens(server):
    greedy = complete(server, max_tokens=1)
    first = single_token_id(server, greedy.choices[0].text)
    forbidden = complete(server, max_tokens=1, logit_bias={str(first): -100})
    assert forbidden.choices[0].text != greedy.choices[0].text

    forced = single_token_id(server, " banana")
    reply = complete(server, max_tokens=3, logit_bias={str(forced): 100})
    assert reply.choices[0].text == " banana" * 3


def assert_greedy_under_openai_penalties(reply: openai.types.Completion, presence: float, frequency: float) -> None:
    """Each token must be the argmax of logprob[t] - frequency * count[t] - presence * (count[t] > 0),
    counting t in the output before it (OpenAI's definition). The logprobs are the raw model's, so the
    20 best alternatives decide it: a token outside them starts lower and, unpenalized, stays lower."""
    logprobs = reply.choices[0].logprobs
    counts: Counter[str] = Counter()
    for token, logprob, alternatives in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        def score(candidate: str, raw: float) -> float:
            return raw - frequency * counts[candidate] - presence * (counts[candidate] > 0)

        best = max(score(candidate, raw) for candidate, raw in alternatives.items())
        assert score(token, logprob) == pytest.approx(best, abs=1e-4), token
        assert best >= min(alternatives.values()), "the argmax could lie outside the 20 alternatives"
        counts[token] += 1


@pytest.mark.parametrize("presence, frequency", [(2.0, 0.0), (0.0, 1.0), (0.7, 0.6)])
def test_presence_and_frequency_penalties_follow_openai_definition(server, presence, frequency):
    plain = complete(server, max_tokens=16)
    penalized = complete(server, max_tokens=16, presence_penalty=presence, frequency_penalty=frequency, logprobs=20)
    assert penalized.choices[0].text != plain.choices[0].text
    assert_greedy_under_openai_penalties(penalized, presence, frequency)


def test_zero_penalties_change_nothing(server):
    plain = complete(server)
    assert complete(server, presence_penalty=0, frequency_penalty=0, logit_bias={}).choices[0].text == \
        plain.choices[0].text


def test_repetition_penalty_changes_the_repetitive_answer(server):
    plain = complete(server, max_tokens=16)
    assert complete(server, max_tokens=16, extra_body={"repetition_penalty": 1.5}).choices[0].text != \
        plain.choices[0].text


def test_min_tokens_holds_back_the_end_of_sequence(server):
    def chat(**extra) -> openai.types.chat.ChatCompletion:
        return server.client.chat.completions.create(model="base", messages=SHORT_ANSWER, max_tokens=10,
                                                     temperature=0, extra_body=extra)

    short = chat()
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 6
    held = chat(min_tokens=6)
    assert held.usage.completion_tokens >= 6
    # Only the end of sequence was held back: the answer begins the same.
    assert held.choices[0].message.content.startswith(short.choices[0].message.content)


def test_mixed_batch_gives_plain_requests_their_solo_output(server):
    """Penalized and plain requests over different adapters, sent together so the engine batches them."""
    requests = [
        dict(model="base"),
        dict(model="alpha"),
        dict(model="beta", frequency_penalty=1.5),
        dict(model="alpha", presence_penalty=2.0, logit_bias={"13": 5}),
        dict(model="beta"),
        dict(model="base", extra_body={"repetition_penalty": 1.3, "min_tokens": 4}),
    ]

    def run(fields: dict) -> str:
        return complete(server, max_tokens=16, **fields).choices[0].text

    solo = [run(fields) for fields in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(run, requests))
    assert together == solo
    assert solo[2] != run(dict(model="beta")), "the penalty must change the penalized request's output"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(logit_bias={"hello": 1}), "logit_bias"),
        (dict(logit_bias={"5": 150}), "logit_bias"),
        (dict(logit_bias={"10000000": 1}), "logit_bias"),
        (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"),
        (dict(extra_body={"min_tokens": 20}), "min_tokens"),
    ],
)
def test_bad_values_are_400s_naming_the_field(server, fields, param):
    with pytest.raises(openai.BadRequestError) as bad:
        complete(server, max_tokens=12, **fields)
    assert bad.value.param == param and bad.value.body["message"].startswith(param), bad.value.body


def test_n_choices_with_a_seed_are_the_seeds_from_seed_up(server):
    sampled = dict(prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    reply = complete(server, n=3, **sampled)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    singles = [complete(server, **(sampled | {"seed": 7 + index})) for index in range(3)]
    assert [choice.text for choice in reply.choices] == [single.choices[0].text for single in singles]
    assert len({choice.text for choice in reply.choices}) > 1
    assert reply.usage.prompt_tokens == singles[0].usage.prompt_tokens  # one prompt, counted once
    assert reply.usage.completion_tokens == sum(single.usage.completion_tokens for single in singles) == 24
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_n_choices_stream_with_their_index(server):
    arguments = dict(model="alpha", messages=SHORT_ANSWER, max_tokens=6, temperature=1.0, seed=11, n=3)
    whole = server.client.chat.completions.create(**arguments)
    chunks = list(server.client.chat.completions.create(**arguments, stream=True,
                                                        stream_options={"include_usage": True}))
    *generation, usage_chunk = chunks
    texts, finish_reasons = ["", "", ""], [None, None, None]
    for chunk in generation:
        [choice] = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            finish_reasons[choice.index] = choice.finish_reason
    assert texts == [choice.message.content for choice in whole.choices]
    assert finish_reasons == [choice.finish_reason for choice in whole.choices]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (dict(functions=[{"name": "f", "parameters": {}}]), "functions", "not supported"),
        (dict(audio={"voice": "alloy", "format": "wav"}), "audio", "not supported"),
    ],
)
def test_unsupported_chat_fields_are_refused_plainly(server, fields, param, says):
    with pytest.raises(openai.BadRequestError) as bad:
        server.client.chat.completions.create(model="base", messages=SHORT_ANSWER, max_tokens=2, **fields)
    assert bad.value.param == param and says in bad.value.message, bad.value.body


def test_text_response_format_is_accepted(server):
    reply = server.client.chat.completions.create(model="base", messages=SHORT_ANSWER, max_tokens=2,
                                                  response_format={"type": "text"})
    assert reply.choices[0].message.content


@pytest.mark.parametrize("fields, param", [(dict(best_of=2), "best_of"), (dict(suffix="!"), "suffix")])
def test_unsupported_completion_fields_are_refused_plainly(server, fields, param):
    with pytest.raises(openai.BadRequestError) as bad:
        complete(server, max_tokens=2, **fields)
    assert bad.value.param == param and "not supported" in bad.value.message, bad.value.body


def test_omitted_sampling_fields_come_from_the_models_generation_config(server):
    """The bundled model's generation_config.json sets its model card's sampling (temperature 0.2, top_p 0.9):
    a request that sets neither samples, seed for seed, as one that sets those values, and not as one at
    the server's own fallback of temperature 1 and top_p 1."""
    question = [{"role": "user", "content": "What is the capital of France?"}]

    def answers(**fields) -> list[str]:
        return [server.client.chat.completions.create(model="base", messages=question, max_tokens=12, seed=seed,
                                                      **fields).choices[0].message.content for seed in range(4)]

    defaulted = answers()
    assert defaulted == answers(temperature=0.2, top_p=0.9)
    assert defaulted != answers(temperature=1.0, top_p=1.0)


# Each OpenAI chat field that changes nothing here, with a value a framework sends.
IGNORED_CHAT_FIELDS = dict(
    store=False, service_tier="auto", safety_identifier="user-hash-1", verbosity="low", reasoning_effort="low",
    modalities=["text"],
)


@pytest.mark.parametrize("name", IGNORED_CHAT_FIELDS)
def test_each_ignored_chat_field_is_accepted_and_named_in_a_header(server, name):
    raw = server.client.chat.completions.with_raw_response.create(
        model="base", messages=SHORT_ANSWER, max_tokens=2, temperature=0, **{name: IGNORED_CHAT_FIELDS[name]}
    )
    assert raw.headers[IGNORED_FIELDS_HEADER] == name
    assert raw.parse().choices[0].message.content


def test_ignored_fields_are_named_together_on_a_stream(server):
    raw = server.client.chat.completions.with_raw_response.create(
        model="base", messages=SHORT_ANSWER, max_tokens=2, temperature=0, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, **IGNORED_CHAT_FIELDS,
    )
    named = raw.headers[IGNORED_FIELDS_HEADER].split(", ")
    assert sorted(named) == sorted([*IGNORED_CHAT_FIELDS, "stream_options.include_obfuscation"])
    assert list(raw.parse())[-1].usage.completion_tokens == 2


def test_a_request_without_ignored_fields_gets_no_header(server):
    raw = server.client.chat.completions.with_raw_response.create(
        model="base", messages=SHORT_ANSWER, max_tokens=2, temperature=0, prompt_cache_key="tenant-user-1",
        user="end-user-7",
    )
    # prompt_cache_key is used: it scopes the prefix cache; user picks the version of a split alias
    assert IGNORED_FIELDS_HEADER not in raw.headers


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (dict(modalities=["text", "audio"]), "modalities", "only text output"),
        (dict(verbosity="loud"), "verbosity", "low"),
        (dict(store="no"), "store", "boolean"),
        (dict(metadata={"k": 1}), "metadata.k", "string"),
        (dict(metadata={f"k{i}": "v" for i in range(17)}), "metadata", "at most 16 pairs"),
        (dict(extra_body={"made_up_field": 1}), "made_up_field", "Extra inputs"),
    ],
)
def test_bad_values_and_unknown_fields_stay_refused(server, fields, param, says):
    with pytest.raises(openai.BadRequestError) as bad:
        server.client.chat.completions.create(model="base", messages=SHORT_ANSWER, max_tokens=2, **fields)
    assert bad.value.param == param and says in bad.value.message, bad.value.body


def test_metadata_is_stored_with_the_usage_record(server):
    metadata = {"conversation": "c-42", "feature": "tolerant-fields"}
    raw = server.client.chat.completions.with_raw_response.create(
        model="base", messages=SHORT_ANSWER, max_tokens=2, temperature=0, metadata=metadata
    )
    assert IGNORED_FIELDS_HEADER not in raw.headers  # stored, so not ignored
    completion_id = raw.parse().id
    db = create_db_engine(server.database_url)
    try:
        deadline = time.monotonic() + 30  # usage rows are written in batches
        stored = None
        while stored is None and time.monotonic() < deadline:
            time.sleep(0.05)
            with create_session_factory(db)() as session:
                stored = session.scalar(select(UsageRecord.request_metadata)
                                        .where(UsageRecord.request_id == completion_id))
        assert stored == metadata
    finally:
        db.dispose()


def test_echo_prepends_the_prompt_whole_and_streamed(server):
    plain = complete(server, max_tokens=6)
    echoed = complete(server, max_tokens=6, echo=True)
    assert echoed.choices[0].text == REPETITIVE_PROMPT + plain.choices[0].text
    chunks = list(complete(server, max_tokens=6, echo=True, stream=True))
    assert chunks[0].choices[0].text == REPETITIVE_PROMPT
    assert "".join(chunk.choices[0].text for chunk in chunks) == echoed.choices[0].text


def test_echo_of_token_ids_decodes_them(server):
    ids = server.engine.tokenizer.encode(REPETITIVE_PROMPT, add_special_tokens=False)
    echoed = complete(server, prompt=ids, max_tokens=3, echo=True)
    plain = complete(server, prompt=ids, max_tokens=3)
    assert echoed.choices[0].text == REPETITIVE_PROMPT + plain.choices[0].text


def test_echo_with_logprobs_is_refused_naming_echo(server):
    with pytest.raises(openai.BadRequestError) as bad:
        complete(server, max_tokens=2, echo=True, logprobs=1)
    assert bad.value.param == "echo" and "logprobs" in bad.value.message
