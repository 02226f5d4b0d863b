"""The API end to end: a real uvicorn server on a free port, the bundled model, real PEFT
adapters, and the official `openai` client. Greedy outputs and logprobs are checked
against Hugging Face transformers / PEFT run on the same weights."""
from __future__ import annotations

import copy
import json
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import torch
from live_api import bearer, make_key, migrated_settings, serve_in_thread, wait_until
from lora_factory import hf_base_model, make_peft_adapter
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.registry.local import LocalAdapterLookup

NUM_KV_BLOCKS = 256
MAX_NEW_TOKENS = 8
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
COUNTING_PROMPT = "1, 2, 3, 4,"  # greedy decoding keeps counting: no early end of sequence


@dataclass
class LiveServer:
    url: str
    engine: AsyncEngine
    adapters: dict[str, Path]
    api_key: str
    operator_key: str  # /metrics is the operator's

    @property
    def auth(self) -> dict[str, str]:
        return bearer(self.api_key)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory) -> dict[str, Path]:
    """alpha: given by name (--adapter); beta and broken: found in the adapter directory."""
    root = tmp_path_factory.mktemp("adapters")
    alpha = make_peft_adapter(
        model_dir, root / "named" / "alpha", rank=8, alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], seed=11
    )
    beta = make_peft_adapter(
        model_dir, root / "dir" / "beta", rank=4, alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"], seed=12
    )
    broken = root / "dir" / "broken"
    broken.mkdir()
    shutil.copy(beta / "adapter_config.json", broken / "adapter_config.json")
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors at all")
    return {"alpha": alpha, "beta": beta, "adapter_dir": root / "dir"}


@pytest.fixture(scope="module")
def server(model_dir, adapters, tmp_path_factory) -> Iterator[LiveServer]:
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    api_key = make_key(settings, tenant="default", role="inference")
    operator_key = make_key(settings, tenant="default", role="admin", name="operator")
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=NUM_KV_BLOCKS))
    lookup = LocalAdapterLookup({engine.model_name}, {"alpha": adapters["alpha"]}, adapters["adapter_dir"])
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield LiveServer(url=url, engine=engine, adapters=adapters, api_key=api_key, operator_key=operator_key)


# ------------------------------------------------------------------ references


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def hf_chat_prompt_ids(hf_tokenizer, messages: list[dict]) -> list[int]:
    text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return hf_tokenizer(text, add_special_tokens=False)["input_ids"]


def hf_model(model_dir: Path, adapter: Path | None):
    """The base model, or a PEFT model with `adapter` on a copy of it."""
    base = hf_base_model(Path(model_dir).resolve())
    if adapter is None:
        return base
    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(base), adapter).eval()


def hf_greedy_ids(
    model, prompt_ids: list[int], eos_token_ids: tuple[int, ...], max_new_tokens: int = MAX_NEW_TOKENS
) -> list[int]:
    """transformers' greedy generation: the new ids, ending with (and including) an end-of-sequence
    token if one comes."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        sequences = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos_token_ids),
            pad_token_id=eos_token_ids[0],
        )
    return sequences[0, len(prompt_ids) :].tolist()


def hf_logprobs(model, prompt_ids: list[int], generated_ids: list[int]) -> torch.Tensor:
    """[len(generated_ids), vocab] log-probabilities of each generated position, teacher-forced."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated_ids])).logits[0].double()
    return torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)


def expected_text_and_reason(hf_tokenizer, generated: list[int], eos_token_ids: tuple[int, ...]) -> tuple[str, str]:
    finish_reason = "stop" if generated[-1] in eos_token_ids else "length"
    return hf_tokenizer.decode(generated, skip_special_tokens=True), finish_reason


def engine_idle(engine: AsyncEngine) -> bool:
    stats = engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_blocks_used == 0


# ----------------------------------------------------------------------- tests


def test_models_lists_base_and_adapters(server):
    models = server.openai().models.list().data
    base = server.engine.model_name
    assert [model.id for model in models] == ["base", base, "alpha", "beta", "broken"]
    assert models[0].parent is None and models[1].parent is None
    assert all(model.parent == base and model.owned_by == "loraloom" for model in models[2:])


def test_chat_greedy_matches_transformers(server, model_dir, hf_tokenizer):
    eos = server.engine.tokenizer.eos_token_ids
    prompt_ids = hf_chat_prompt_ids(hf_tokenizer, CHAT)
    generated = hf_greedy_ids(hf_model(model_dir, None), prompt_ids, eos)
    expected_text, expected_reason = expected_text_and_reason(hf_tokenizer, generated, eos)

    reply = server.openai().chat.completions.create(
        model="base", messages=CHAT, max_tokens=MAX_NEW_TOKENS, temperature=0
    )
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == "base"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text
    assert choice.finish_reason == expected_reason
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(generated)
    assert reply.usage.total_tokens == len(prompt_ids) + len(generated)


def test_chat_stream_equals_non_stream_with_usage_chunk(server):
    client = server.openai()
    whole = client.chat.completions.create(
        model="base", messages=CHAT, max_completion_tokens=MAX_NEW_TOKENS, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model="base",
            messages=CHAT,
            max_completion_tokens=MAX_NEW_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {chunk.id for chunk in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    *generation, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    # The same prompt again: its full blocks come from the prefix cache.
    assert 0 < usage_chunk.usage.prompt_tokens_details.cached_tokens < whole.usage.prompt_tokens
    finish_reasons = [chunk.choices[0].finish_reason for chunk in generation]
    assert finish_reasons[-1] == whole.choices[0].finish_reason
    assert all(reason is None for reason in finish_reasons[:-1])
    assert "".join(chunk.choices[0].delta.content or "" for chunk in generation) == whole.choices[0].message.content


def test_completion_greedy_matches_transformers_streamed_or_not(server, model_dir, hf_tokenizer):
    eos = server.engine.tokenizer.eos_token_ids
    prompt = "The capital of France is"
    prompt_ids = hf_tokenizer(prompt)["input_ids"]
    generated = hf_greedy_ids(hf_model(model_dir, None), prompt_ids, eos)
    expected_text, expected_reason = expected_text_and_reason(hf_tokenizer, generated, eos)
    client = server.openai()

    for prompt_input in (prompt, [prompt], prompt_ids, [prompt_ids]):
        reply = client.completions.create(model="base", prompt=prompt_input, max_tokens=MAX_NEW_TOKENS, temperature=0)
        assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
        assert reply.choices[0].text == expected_text
        assert reply.choices[0].finish_reason == expected_reason
        assert reply.usage.prompt_tokens == len(prompt_ids)
        assert reply.usage.completion_tokens == len(generated)

    chunks = list(
        client.completions.create(
            model="base",
            prompt=prompt,
            max_tokens=MAX_NEW_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *generation, usage_chunk = chunks
    assert "".join(chunk.choices[0].text for chunk in generation) == expected_text
    assert generation[-1].choices[0].finish_reason == expected_reason
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == len(generated)


def test_adapters_match_peft_and_are_selected_per_request(server, model_dir, hf_tokenizer):
    eos = server.engine.tokenizer.eos_token_ids
    prompt_ids = hf_chat_prompt_ids(hf_tokenizer, CHAT)
    client = server.openai()

    def chat(model: str, adapter_id: str | None = None) -> str:
        extra = {} if adapter_id is None else {"adapter_id": adapter_id}
        reply = client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=MAX_NEW_TOKENS, temperature=0, extra_body=extra
        )
        assert reply.model == model  # echoes what the client asked for
        return reply.choices[0].message.content

    outputs = {}
    for name in ("alpha", "beta"):
        generated = hf_greedy_ids(hf_model(model_dir, server.adapters[name]), prompt_ids, eos)
        expected_text, _ = expected_text_and_reason(hf_tokenizer, generated, eos)
        outputs[name] = chat(name)
        assert outputs[name] == expected_text, name
    base = chat("base")
    assert len({base, outputs["alpha"], outputs["beta"]}) == 3
    assert chat("alpha") == outputs["alpha"]  # the same adapter twice: the same greedy output
    assert chat(server.engine.model_name, adapter_id="alpha") == outputs["alpha"]  # LoRAX-style adapter_id


def test_chat_logprobs_match_transformers(server, model_dir, hf_tokenizer):
    top, max_tokens = 3, 6
    model = hf_model(model_dir, server.adapters["alpha"])
    prompt_ids = hf_chat_prompt_ids(hf_tokenizer, CHAT)
    generated = hf_greedy_ids(model, prompt_ids, server.engine.tokenizer.eos_token_ids, max_tokens)
    reference = hf_logprobs(model, prompt_ids, generated)

    reply = server.openai().chat.completions.create(
        model="alpha", messages=CHAT, max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=top
    )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == len(generated)
    for position, (entry, token_id) in enumerate(zip(entries, generated)):
        assert entry.token == hf_tokenizer.decode([token_id])
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert entry.logprob == pytest.approx(float(reference[position, token_id]), abs=1e-3)
        values, ids = reference[position].topk(top)
        assert [alt.token for alt in entry.top_logprobs] == [hf_tokenizer.decode([i]) for i in ids.tolist()]
        assert [alt.logprob for alt in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-3)


def test_completion_logprobs_format(server):
    reply = server.openai().completions.create(
        model="base", prompt=COUNTING_PROMPT, max_tokens=5, temperature=0, logprobs=2
    )
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    for token, logprob, alternatives in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert len(alternatives) == 2
        assert alternatives[token] == pytest.approx(logprob)  # greedy: the sampled token is the most likely
        assert logprob == pytest.approx(max(alternatives.values()))


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert "Traceback" not in error["message"]
    return error


def test_errors_through_the_openai_client(server):
    client = server.openai()
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="no-such-adapter", messages=CHAT)
    assert "no-such-adapter" in not_found.value.message and not_found.value.code == "model_not_found"

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="base", prompt="Hi", extra_body={"adapter_id": "no-such-adapter"})

    limit = str(server.engine.max_model_len)
    long_chat = [{"role": "user", "content": "hello " * server.engine.max_model_len}]
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model="base", messages=long_chat)
    assert too_long.value.param == "messages" and limit in too_long.value.message

    cases = [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_completion_tokens=0), "max_completion_tokens"),
        (dict(temperature=5), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(logprobs=True, top_logprobs=50), "top_logprobs"),
        (dict(n=9), "n"),
    ]
    for arguments, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="base", messages=CHAT, **arguments)
        assert bad.value.param == param and bad.value.body["message"].startswith(param), arguments

    with pytest.raises(openai.BadRequestError) as bad_logprobs:
        client.completions.create(model="base", prompt="Hi", logprobs=50)
    assert bad_logprobs.value.param == "logprobs"

    with pytest.raises(openai.BadRequestError) as broken:
        client.completions.create(model="broken", prompt="Hi", max_tokens=2)
    assert broken.value.param == "model" and "not a valid safetensors file" in broken.value.message


def test_errors_in_openai_shape_over_raw_http(server):
    with httpx.Client(base_url=server.url, timeout=60, headers=server.auth) as http:
        headers = {"content-type": "application/json"}
        malformed = http.post("/v1/chat/completions", content=b'{"model": "base", "messages": [', headers=headers)
        error = assert_openai_error(malformed, 400, None)
        assert error["type"] == "invalid_request_error" and "JSON" in error["message"]

        wrong_type = http.post(
            "/v1/chat/completions", json={"model": "base", "messages": [{"role": "user", "content": 5}]}
        )
        assert_openai_error(wrong_type, 400, "messages[0].content")
        missing = http.post("/v1/completions", json={"model": "base"})
        assert_openai_error(missing, 400, "prompt")
        no_tools = http.post("/v1/chat/completions", json={"model": "base", "messages": CHAT, "tools": []})
        assert_openai_error(no_tools, 400, "tools")
        bad_role = http.post(
            "/v1/chat/completions", json={"model": "base", "messages": [{"role": "robot", "content": "x"}]}
        )
        assert_openai_error(bad_role, 400, "messages[0].role")

        too_large = http.post("/v1/completions", content=b" " * (9 * 1024 * 1024), headers=headers)
        assert assert_openai_error(too_large, 413, None)["code"] == "request_too_large"
        assert_openai_error(http.get("/v1/no-such-route"), 404, None)
        assert http.get("/health").json() == {"status": "ok"}


def test_openapi_documents_the_routes_and_openai_error_shape(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        document = http.get("/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"):
        assert path in document["paths"]
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "text/event-stream" in chat["200"]["content"]
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert '"422"' not in json.dumps(document)  # validation errors are answered as 400


def test_stream_disconnect_aborts_and_frees_kv_blocks(server):
    engine = server.engine
    wait_until(lambda: engine_idle(engine), "an idle engine")
    tokens_before = engine.stats().generation_tokens_total
    max_tokens = 400
    body = {"model": "alpha", "prompt": COUNTING_PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60, headers=server.auth) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = (line for line in response.iter_lines() if line.startswith("data: "))
            first = json.loads(next(events).removeprefix("data: "))
            assert first["object"] == "text_completion"
            next(events)
            stats = engine.stats()
            assert stats.num_running == 1 and stats.kv_blocks_used > 0
        # Leaving the block closes the connection with the body unread: a client disconnect.
    wait_until(lambda: engine_idle(engine), "the aborted request to release its KV blocks")
    assert engine.stats().generation_tokens_total - tokens_before < max_tokens


def test_non_stream_disconnect_aborts_and_frees_kv_blocks(server):
    engine = server.engine
    wait_until(lambda: engine_idle(engine), "an idle engine")
    tokens_before = engine.stats().generation_tokens_total
    max_tokens = 400
    body = json.dumps({"model": "base", "prompt": COUNTING_PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {server.api_key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(request)
        wait_until(lambda: engine.stats().num_running == 1, "the request to start")
    wait_until(lambda: engine_idle(engine), "the abandoned request to release its KV blocks")
    assert engine.stats().generation_tokens_total - tokens_before < max_tokens


def test_metrics_expose_engine_stats(server):
    # Independent of what ran before: it waits for earlier tests' requests to end, makes the base and
    # beta requests it counts, and compares what changed.
    wait_until(lambda: engine_idle(server.engine), "earlier requests to end")
    counted = {("default", "beta"): 1, ("default", "base"): 2}  # (tenant, adapter) -> requests made here
    before = dict(server.engine.stats().requests_per_adapter_total)
    server.openai().completions.create(model="beta", prompt="Hi", max_tokens=2)
    for _ in range(counted[("default", "base")]):
        server.openai().completions.create(model="base", prompt="Hi", max_tokens=2)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.get("/metrics", headers=bearer(server.operator_key))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    stats = server.engine.stats()  # nothing runs now, so the scrape saw these same numbers
    assert samples[("loraloom_kv_blocks_total", ())] == NUM_KV_BLOCKS
    assert samples[("loraloom_adapter_slots_total", ())] == stats.adapter_slots_total
    assert samples[("loraloom_generation_tokens_total", ())] == stats.generation_tokens_total
    assert samples[("loraloom_prompt_tokens_total", ())] == stats.prompt_tokens_total
    for name in ("loraloom_requests_running", "loraloom_requests_waiting", "loraloom_kv_blocks_used",
                 "loraloom_kv_blocks_cached", "loraloom_adapter_slots_used"):
        assert (name, ()) in samples
    for (tenant, adapter), made in counted.items():
        scraped = samples[("loraloom_adapter_requests_total", (("adapter", adapter), ("tenant", tenant)))]
        assert scraped == stats.requests_per_adapter_total[tenant, adapter] == before.get((tenant, adapter), 0) + made


def test_a_stream_of_verified_drafts_gives_the_whole_answer_and_its_usage(server):
    """An answer that copies its prompt is decoded speculatively (several tokens a step): the stream's
    chunks add up to the whole answer, its usage counts every token, and the tenant sees its acceptance."""
    client = server.openai()
    text = ("Deliveries leave the Leeds depot at seven, reach Manchester by ten, and return empty to Leeds "
            "before the afternoon shift begins at two.")
    messages = [{"role": "user", "content": f"Repeat this sentence exactly: {text}"}]
    before = httpx.get(f"{server.url}/v1/engine/status", headers=server.auth).json()["speculation"]
    whole = client.chat.completions.create(model="alpha", messages=messages, max_completion_tokens=40, temperature=0)
    chunks = list(client.chat.completions.create(model="alpha", messages=messages, max_completion_tokens=40,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    *generation, usage_chunk = chunks
    assert "".join(chunk.choices[0].delta.content or "" for chunk in generation) == whole.choices[0].message.content
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert generation[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    after = httpx.get(f"{server.url}/v1/engine/status", headers=server.auth).json()["speculation"]
    accepted = {line["model"]: line["accepted_tokens"] for line in after}
    accepted_before = {line["model"]: line["accepted_tokens"] for line in before}
    assert accepted.get("alpha", 0) - accepted_before.get("alpha", 0) > 0, after
