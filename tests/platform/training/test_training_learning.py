"""End to end: a chat dataset teaches the bundled model answers it cannot know, and our engine serves them.

12 made-up product codes map to 12 made-up names. After training on CPU the
adapter, loaded by LLMEngine from its PEFT directory, answers the training
questions greedily with the trained names; the base model names none of them.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from loraloom.engine.lora.host_cache import file_sha256
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.weights import ADAPTER_WEIGHTS_FILE
from loraloom.engine.request import SamplingParams
from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.training.datasets import load_dataset
from loraloom.platform.training.trainer import TrainingMetrics, TrainStatus, train_lora
from product_codes import (
    HYPERPARAMETERS,
    MIN_CORRECT_FRACTION,
    LEARNED_NAMES,
    product_codes,
    product_dataset,
    question,
)


def greedy_answers(engine: LLMEngine, prompts: list[list[int]], adapter: AdapterHandle | None) -> list[str]:
    texts = {str(index): "" for index in range(len(prompts))}
    for request_id, prompt in zip(texts, prompts):
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=12, temperature=0.0), adapter)
    while engine.has_unfinished():
        for output in engine.step():
            texts[output.request_id] += output.text_delta
    return list(texts.values())


def test_trained_adapter_answers_what_the_base_cannot(model_dir: Path, tmp_path: Path) -> None:
    codes = product_codes(len(LEARNED_NAMES))
    data = "\n".join(json.dumps(line) for line in product_dataset(LEARNED_NAMES)).encode()
    tokenizer = Tokenizer.from_dir(model_dir)
    report, examples = load_dataset(data, tokenizer, HYPERPARAMETERS.max_seq_len, param="training_file")
    assert report.num_lines == len(LEARNED_NAMES)

    metrics: list[TrainingMetrics] = []
    checkpoints: list[int] = []
    steps_per_epoch = len(examples) // HYPERPARAMETERS.batch_size
    result = train_lora(
        base_model_dir=model_dir,
        train_examples=examples,
        eval_examples=examples[:6],
        # Evaluated with each checkpoint only: the 135M model's evaluations are slow on 2 cores.
        hyperparameters=HYPERPARAMETERS.model_copy(update={"eval_interval": 4 * steps_per_epoch}),
        seed=0,
        output_dir=tmp_path / "job",
        on_metrics=metrics.append,
        should_cancel=lambda: False,
        save_checkpoint=lambda step, directory: checkpoints.append(step),
        checkpoint_every=4 * steps_per_epoch,
    )
    assert result.status is TrainStatus.SUCCEEDED
    assert checkpoints == [4 * steps_per_epoch, 8 * steps_per_epoch]
    first_epoch = statistics.mean(m.train_loss for m in metrics[:steps_per_epoch])
    last_epoch = statistics.mean(m.train_loss for m in metrics[-steps_per_epoch:])
    assert last_epoch < first_epoch / 4, (first_epoch, last_epoch)
    eval_losses = [m.eval_loss for m in metrics if m.eval_loss is not None]
    assert len(eval_losses) == 2 and eval_losses[-1] < eval_losses[0] < first_epoch

    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=128, max_num_seqs=32, max_loras=1, max_lora_rank=16))
    adapter = AdapterHandle(
        key="products@1",
        name="products",
        uri=result.adapter_dir.as_uri(),
        sha256=file_sha256(result.adapter_dir / ADAPTER_WEIGHTS_FILE),
    )
    prompts = [tokenizer.encode_chat(question(code)) for code in codes]
    tuned = greedy_answers(engine, prompts, adapter)
    base = greedy_answers(engine, prompts, None)
    correct = sum(name in answer for name, answer in zip(LEARNED_NAMES, tuned))
    assert correct >= MIN_CORRECT_FRACTION * len(LEARNED_NAMES), list(zip(LEARNED_NAMES, tuned))
    assert not any(name in answer for answer in base for name in LEARNED_NAMES), base
