"""The whole engine on the bundled model: scheduling must never change what a request generates."""
from __future__ import annotations

import pytest

from lora_factory import make_peft_adapter
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.request import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
QUESTIONS = [
    "What is the capital of Italy?", "Name a fruit that is yellow.", "Why is the sea salty?",
    "What is a prime number?", "Say hello in French.", "How many days are in a week?",
]
SYSTEM = ("You are the support assistant of Loom Widgets Inc. Always answer politely, mention the order "
          "number if the customer gives one, and never promise refunds without a manager's approval.")


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("engine_adapters")
    handles = []
    for i in range(5):
        path = make_peft_adapter(model_dir, root / f"a{i}", rank=8, alpha=16,
                                 target_modules=["q_proj", "v_proj", "down_proj"], seed=300 + i)
        handles.append(AdapterHandle(key=f"a{i}@test", name=f"a{i}", uri=path.as_uri()))
    return handles


def chat(engine: LLMEngine, question: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return engine.tokenizer.encode_chat(messages)


def run_to_completion(engine: LLMEngine, requests, max_steps: int = 2000,
                      params: SamplingParams = GREEDY) -> dict[str, list[int]]:
    """requests: (request_id, prompt ids, adapter or None). Returns the generated ids per request."""
    for request_id, prompt, adapter in requests:
        engine.add_request(request_id, prompt, params, adapter)
    outputs: dict[str, list[int]] = {request_id: [] for request_id, _, _ in requests}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for output in engine.step():
            outputs[output.request_id].extend(output.token_ids)
    assert not engine.has_unfinished(), f"requests still unfinished after {max_steps} steps"
    return outputs


def assert_all_blocks_free(engine: LLMEngine) -> None:
    manager = engine.block_manager
    manager.check_invariants()
    assert manager.num_used_blocks == 0
    assert manager.num_free_blocks == engine.config.num_kv_blocks
    assert engine.slot_table.num_used == 0 or all(
        engine.slot_table.ref_count(key) == 0 for key in engine.slot_table.resident_keys()
    )


def test_chunked_prefill_and_preemption_match_an_unconstrained_run(model_dir, adapters):
    roomy = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256, max_loras=2))
    requests = [(f"r{i}", chat(roomy, q), None if i % 3 == 0 else adapters[i % 2])
                for i, q in enumerate(QUESTIONS[:4])]
    longer = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected = run_to_completion(roomy, requests, params=longer)
    assert roomy.preemptions_total == 0

    # 8-token budget: every ~30-token prompt is prefilled in several chunks, interleaved with decodes.
    # 14 blocks of 8 tokens cannot hold four ~55-token sequences: requests get preempted and recomputed.
    tight = LLMEngine(model_dir, EngineConfig(num_kv_blocks=14, block_size=8, max_num_batched_tokens=8,
                                              max_loras=2, enable_prefix_caching=False))
    got = run_to_completion(tight, requests, params=longer)
    assert tight.preemptions_total > 0, "the constrained run never preempted: the test lost its point"
    assert got == expected
    assert_all_blocks_free(tight)


def test_aborts_free_every_block_and_slot(model_dir, adapters):
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, max_loras=2, max_num_batched_tokens=16))
    for i, question in enumerate(QUESTIONS):
        engine.add_request(f"r{i}", chat(engine, question), GREEDY, adapters[i % 3])
    for _ in range(3):  # some requests mid-prefill, some decoding, some still waiting
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    for i in range(len(QUESTIONS)):
        engine.abort_request(f"r{i}")
    assert not engine.has_unfinished()
    assert_all_blocks_free(engine)


def test_more_adapters_than_slots_all_finish(model_dir, adapters):
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2))
    requests = [(f"r{i}", chat(engine, QUESTIONS[i % len(QUESTIONS)]), adapters[i % len(adapters)])
                for i in range(10)]
    # Each request needs ~1 prefill + 10 decode steps; with 2 slots and 5 adapters, waves of at most
    # 2 adapters run at a time, so 5 waves bound the run.
    outputs = run_to_completion(engine, requests, max_steps=5 * 15)
    assert all(len(tokens) == GREEDY.max_tokens for tokens in outputs.values())
    assert_all_blocks_free(engine)
    # Slot evictions and reloads must not change any result: compare with a slot per adapter.
    roomy = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=len(adapters)))
    assert run_to_completion(roomy, requests) == outputs


def test_prefix_cache_reuses_blocks_only_for_the_same_adapter(model_dir, adapters):
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2))
    no_cache = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2, enable_prefix_caching=False))
    first = chat(engine, "Where is my order 1234?", SYSTEM)
    second = chat(engine, "Can I change my delivery address?", SYSTEM)
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared > 2 * engine.config.block_size, "the system prompt must span several blocks"

    def generate(target, request_id, prompt, adapter):
        target.add_request(request_id, prompt, GREEDY, adapter)
        tokens, cached = [], None
        while target.has_unfinished():
            for output in target.step():
                tokens.extend(output.token_ids)
                cached = output.num_cached_tokens
        return tokens, cached

    generate(engine, "warm", first, adapters[0])
    tokens, cached = generate(engine, "same-adapter", second, adapters[0])
    block = engine.config.block_size
    assert cached == (shared // block) * block, "only the full blocks of the shared prefix are reused"
    assert tokens == generate(no_cache, "reference", second, adapters[0])[0]

    _, cached_other = generate(engine, "other-adapter", second, adapters[1])
    _, cached_base = generate(engine, "base", second, None)
    assert cached_other == 0 and cached_base == 0, "KV computed under one adapter must never serve another"


def test_requests_sent_together_behind_one_system_prompt_compute_it_once(model_dir, adapters):
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2))
    no_cache = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2, enable_prefix_caching=False))
    prompts = {"first": chat(engine, "Where is my order 1234?", SYSTEM),
               "second": chat(engine, "Can I change my delivery address?", SYSTEM)}
    shared = next(i for i, (a, b) in enumerate(zip(*prompts.values())) if a != b)

    def generate_together(target):
        for request_id, prompt in prompts.items():
            target.add_request(request_id, prompt, GREEDY, adapters[0])
        tokens, cached = {}, {}
        while target.has_unfinished():
            for output in target.step():
                tokens.setdefault(output.request_id, []).extend(output.token_ids)
                cached[output.request_id] = output.num_cached_tokens
        return tokens, cached

    tokens, cached = generate_together(engine)
    block = engine.config.block_size
    assert cached == {"first": 0, "second": (shared // block) * block}, "the second waited for the first's prefix"
    assert tokens == generate_together(no_cache)[0]
    assert_all_blocks_free(engine)


def test_deferred_and_in_step_text_give_the_same_deltas(model_dir):
    """Without stop strings the text is made when read (DeferredDetokenizer); with them, in the step.
    Both must stream the same deltas, joining to the decode of the generated tokens."""
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64))
    prompt = chat(engine, "Write a haiku about the sea, with an emoji.")
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    engine.add_request("deferred", prompt, params)
    # The stop string starts with a character the text never contains, so the matcher holds nothing back.
    engine.add_request("in-step", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                         stop=["\x00 never appears"]))
    outputs = {"deferred": [], "in-step": []}
    while engine.has_unfinished():
        for output in engine.step():
            outputs[output.request_id].append(output)
    deltas = {request_id: [output.text_delta for output in items] for request_id, items in outputs.items()}
    assert deltas["deferred"] == deltas["in-step"]
    tokens = [token for output in outputs["deferred"] for token in output.token_ids]
    assert "".join(deltas["deferred"]) == engine.tokenizer.decode(tokens)


def test_penalized_and_plain_requests_in_one_batch_each_give_their_solo_output(model_dir, adapters):
    """Logit adjustments are per row: in one batch with plain requests on other adapters, neither changes the other."""
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=2))
    prompt = engine.tokenizer.encode("I like cats. I like cats. I like cats.", add_special_tokens=True)
    penalized = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, frequency_penalty=1.0,
                               presence_penalty=0.5, repetition_penalty=1.2, logit_bias={13: 2.0}, min_tokens=3)
    requests = [("plain-base", None, GREEDY), ("penalized-a0", adapters[0], penalized),
                ("plain-a1", adapters[1], GREEDY), ("penalized-base", None, penalized)]

    def run(batch) -> dict[str, list[int]]:
        for request_id, adapter, params in batch:
            engine.add_request(request_id, prompt, params, adapter)
        outputs: dict[str, list[int]] = {request_id: [] for request_id, _, _ in batch}
        first_step = engine.step()
        assert len(first_step) == len(batch), "every request must be sampled in the same first step"
        for output in first_step:
            outputs[output.request_id].extend(output.token_ids)
        while engine.has_unfinished():
            for output in engine.step():
                outputs[output.request_id].extend(output.token_ids)
        return outputs

    solo = {request[0]: run([request])[request[0]] for request in requests}
    assert run(requests) == solo
    assert solo["penalized-base"] != solo["plain-base"]


def test_non_finite_adapter_fails_its_request_alone(model_dir, adapters):
    """A slot that makes NaN/Inf (its weights broken after they passed the upload checks) fails its own
    request with finish_reason "error" and a message; the requests beside it in the same steps, on
    another adapter and on the base, generate exactly their solo outputs, and every block is freed."""
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_loras=3))
    prompt = chat(engine, QUESTIONS[0])
    healthy = [("base", prompt, None), ("a1", prompt, adapters[1])]
    solo = {request[0]: run_to_completion(engine, [request])[request[0]] for request in healthy}
    broken = adapters[2]
    weights = engine.adapter_cache.get(broken)
    first_module = next(iter(weights.modules.values()))
    first_module.lora_b.fill_(float("inf"))  # what validation is meant to stop; the engine is the second wall

    for request_id, request_prompt, adapter in [*healthy, ("broken", prompt, broken)]:
        engine.add_request(request_id, request_prompt, GREEDY, adapter)
    outputs: dict[str, list] = {"base": [], "a1": [], "broken": []}
    while engine.has_unfinished():
        for output in engine.step():
            outputs[output.request_id].append(output)

    failure = outputs["broken"][-1]
    assert failure.finished and failure.finish_reason == "error" and failure.token_ids == []
    assert "non-finite" in failure.error and "a2" in failure.error
    for request_id, _, _ in healthy:
        assert [token for output in outputs[request_id] for token in output.token_ids] == solo[request_id]
        assert all(output.error is None for output in outputs[request_id])
    assert_all_blocks_free(engine)
