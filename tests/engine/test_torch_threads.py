"""engine/torch_threads.py: in a serving process the step thread alone runs torch on several threads.

What is checked is where each piece of the engine's work runs and with how many torch threads:
AsyncEngine.create builds the engine on the thread that then steps it, with every torch thread;
adapter fetches and threads started later run torch on one. (What a second OpenMP pool costs is
a speed, measured by benchmarks/served_throughput.py, not asserted here.)
"""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from lora_factory import make_peft_adapter

import loraloom.engine.async_engine as async_engine
import loraloom.engine.torch_threads as torch_threads
from loraloom.engine import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.request import SamplingParams
from loraloom.kernels import cpu_extension, cpu_linear
from loraloom.kernels.lora_stacks import PANEL_WIDTH
from loraloom.kernels.metadata import segment_table

STEP_THREADS = 3  # not the count of any thread before the test, so that each count seen names its source


@pytest.fixture
def serving_process(monkeypatch):
    """This process as `loraloom serve` sets it up (reserve_for_step_thread), undone afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setattr(torch_threads, "_reserved", None)
    torch.set_num_threads(STEP_THREADS)
    torch_threads.reserve_for_step_thread()
    yield
    torch.set_num_threads(before)


def count_on_new_thread() -> int:
    counts = []
    thread = threading.Thread(target=lambda: counts.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return counts[0]


def test_reserving_leaves_other_threads_one_torch_thread(serving_process) -> None:
    assert torch.get_num_threads() == 1  # the reserving (main) thread
    assert count_on_new_thread() == 1
    step_thread = torch_threads.StepThread("test-step")
    try:
        assert step_thread.submit(torch.get_num_threads).result() == STEP_THREADS
        # Setting the step thread's count must not have made it every later thread's default.
        assert count_on_new_thread() == 1
        assert torch.get_num_threads() == 1
    finally:
        step_thread.stop()


def one_add_lora(compiled) -> None:
    x, out = torch.ones(2, 8), torch.zeros(2, 8)
    weights = torch.ones(1, 16)  # one slot, one slice of rank 1: A [1, 8], then B^T [1, 8]
    compiled.packed_add_lora(x, weights, PANEL_WIDTH, torch.ones(1, 1, dtype=torch.int32),
                             torch.zeros(1, dtype=torch.int8), out, [0, 8],
                             segment_table([0], [2], [0], [0]), torch.zeros(2, dtype=torch.int32))
    assert torch.equal(out, torch.full((2, 8), 8.0))  # the op ran: each output is the sum of 8 ones


def one_chunked_linear(compiled) -> None:
    out = torch.zeros(2, 200)
    compiled.chunked_linear(torch.ones(2, 8), cpu_linear.packed_weight(torch.ones(200, 8)), out, 64)
    assert torch.equal(out, torch.full((2, 200), 8.0))


def one_linear_add_lora(compiled) -> None:
    out = torch.zeros(2, 8)
    compiled.linear_add_lora(torch.ones(2, 8), cpu_linear.packed_weight(torch.ones(8, 8)), out, 64, torch.ones(1, 16),
                             PANEL_WIDTH,
                             torch.ones(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int8),
                             [0, 8], segment_table([0], [2], [0], [0]), torch.zeros(2, dtype=torch.int32))
    assert torch.equal(out, torch.full((2, 8), 16.0))  # 8 from the base matmul, 8 from the LoRA


@pytest.mark.parametrize("op", [one_add_lora, one_chunked_linear, one_linear_add_lora])
def test_compiled_ops_keep_the_calling_threads_count(serving_process, op) -> None:
    """A compiled op's first use on a thread must not reset that thread's count to the process default
    (at::parallel_for's inlined setup did: kernels/csrc/torch_threads.h)."""
    compiled = cpu_extension.load()
    assert compiled is not None, "the CPU extension did not build (see kernels/cpu_extension.py)"

    def run_op() -> int:
        op(compiled)
        return torch.get_num_threads()

    step_thread = torch_threads.StepThread("test-step")
    try:
        assert step_thread.submit(run_op).result() == STEP_THREADS
    finally:
        step_thread.stop()


def test_step_thread_hands_back_what_a_call_raises() -> None:
    step_thread = torch_threads.StepThread("test-step")
    try:
        with pytest.raises(ZeroDivisionError):
            step_thread.submit(lambda: 1 / 0).result()
        assert step_thread.submit(lambda: "still serving").result() == "still serving"
    finally:
        step_thread.stop()


def test_engine_is_built_and_stepped_on_one_thread_and_fetches_use_one_torch_thread(
        serving_process, tiny_checkpoint, tmp_path, monkeypatch) -> None:
    seen: dict[str, tuple[str, int]] = {}

    def where() -> tuple[str, int]:
        return threading.current_thread().name, torch.get_num_threads()

    class Recording(LLMEngine):
        def __init__(self, *args, **kwargs) -> None:
            seen["built"] = where()
            super().__init__(*args, **kwargs)

        def step(self):
            seen["stepped"] = where()  # the last step's start: earlier steps ran the compiled ops on this thread
            return super().step()

        def hold_adapter(self, adapter):
            seen["fetched"] = where()
            return super().hold_adapter(adapter)

    monkeypatch.setattr(async_engine, "LLMEngine", Recording)
    engine = async_engine.AsyncEngine.create(tiny_checkpoint, EngineConfig(num_kv_blocks=64, block_size=4))
    directory = make_peft_adapter(tiny_checkpoint, tmp_path / "a", rank=4, alpha=8,
                                  target_modules=["q_proj", "v_proj"], seed=5)
    adapter = AdapterHandle(key="a@test", name="a", uri=directory.as_uri())

    async def run() -> list[int]:
        await engine.start()
        try:
            tokens: list[int] = []
            params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
            async for output in engine.generate(request_id="r", prompt_token_ids=[11, 12, 13], params=params,
                                                adapter=adapter):
                tokens += output.token_ids
            return tokens
        finally:
            await engine.shutdown()

    assert len(asyncio.run(run())) == 4
    assert seen["built"][0] == seen["stepped"][0]  # one thread builds the engine and steps it
    assert seen["built"][1] == seen["stepped"][1] == STEP_THREADS
    assert seen["fetched"][0] != seen["stepped"][0] and seen["fetched"][1] == 1
    assert torch.get_num_threads() == 1  # create() left the caller's thread at one
