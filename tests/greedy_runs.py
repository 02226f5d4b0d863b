"""Run an engine to completion on greedy requests: the shared oracle of the eager-vs-graph tests."""
from __future__ import annotations

from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.request import SamplingParams


def generate(engine: LLMEngine, prompts: list[list[int]], limits: list[int],
             adapters: list[AdapterHandle | None] | None = None) -> dict[str, list[int]]:
    """Request r<i> decodes limits[i] tokens greedily from prompts[i] (adapters[i] or the base); ids per request."""
    adapters = adapters or [None] * len(prompts)
    for index, (prompt, limit, adapter) in enumerate(zip(prompts, limits, adapters)):
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=limit, temperature=0.0, ignore_eos=True),
                           adapter)
    outputs: dict[str, list[int]] = {f"r{index}": [] for index in range(len(prompts))}
    while engine.has_unfinished():
        for output in engine.step():
            outputs[output.request_id] += output.token_ids
    return outputs
