"""The training loop on a tiny random Llama: loss, determinism, checkpoints, metrics, cancel."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from loraloom.engine.config import ModelConfig
from loraloom.engine.lora.weights import ADAPTER_WEIGHTS_FILE, load_adapter_weights
from loraloom.platform.training.datasets import TokenizedExample
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.trainer import TrainingMetrics, TrainResult, TrainStatus, train_lora

CPU = torch.device("cpu")


def make_examples(count: int, seed: int, vocab_size: int = 320) -> list[TokenizedExample]:
    """Random token sequences of varied lengths; the loss is on their second half."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for line in range(1, count + 1):
        length = int(torch.randint(6, 14, (1,), generator=generator))
        ids = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        mask = [False] * (length // 2) + [True] * (length - length // 2)
        examples.append(TokenizedExample(line=line, input_ids=tuple(ids), loss_mask=tuple(mask)))
    return examples


class Recorder:
    """The callbacks of one run: metrics and checkpoints in order, cancel after `cancel_after` steps."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.metrics: list[TrainingMetrics] = []
        self.checkpoints: list[tuple[int, Path]] = []
        self.cancel_after = cancel_after

    def should_cancel(self) -> bool:
        return self.cancel_after is not None and len(self.metrics) >= self.cancel_after

    def save_checkpoint(self, step: int, directory: Path) -> None:
        assert (directory / ADAPTER_WEIGHTS_FILE).is_file()  # complete before it is handed over
        self.checkpoints.append((step, directory))


def run(
    base: Path,
    out: Path,
    examples: list[TokenizedExample],
    hyperparameters: Hyperparameters,
    seed: int = 0,
    recorder: Recorder | None = None,
    eval_examples: list[TokenizedExample] | None = None,
    checkpoint_every: int = 1000,
    resume_from: Path | None = None,
) -> TrainResult:
    recorder = recorder or Recorder()
    return train_lora(
        base_model_dir=base,
        train_examples=examples,
        eval_examples=eval_examples or [],
        hyperparameters=hyperparameters,
        seed=seed,
        output_dir=out,
        on_metrics=recorder.metrics.append,
        should_cancel=recorder.should_cancel,
        save_checkpoint=recorder.save_checkpoint,
        checkpoint_every=checkpoint_every,
        device=CPU,
        resume_from=resume_from,
    )


SMALL = Hyperparameters(n_epochs=2, batch_size=2, learning_rate=1e-2, lora_r=4, lora_alpha=8, lora_dropout=0.1,
                        target_modules=["q_proj", "v_proj", "down_proj"], max_seq_len=32)


def test_first_step_loss_is_the_base_models_masked_loss(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    examples = make_examples(5, seed=1)
    recorder = Recorder()
    hyperparameters = SMALL.model_copy(update={"n_epochs": 1, "batch_size": 5})
    run(tiny_llama_dir, tmp_path, examples, hyperparameters, recorder=recorder)
    # LoRA B starts at zero, so step 1's loss is the base model's; reference: fp64, one unpadded example at a time.
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float64).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor([example.input_ids])
            logits = reference(input_ids=ids).logits[0, :-1]  # [seq - 1, vocab]
            targets = torch.tensor(example.input_ids[1:])
            chosen = torch.tensor(example.loss_mask[1:])
            total += torch.nn.functional.cross_entropy(logits[chosen], targets[chosen], reduction="sum").item()
            count += int(chosen.sum())
    assert len(recorder.metrics) == 1
    assert recorder.metrics[0].train_loss == pytest.approx(total / count, rel=1e-5)


def test_same_seed_same_adapter(tiny_llama_dir: Path, tmp_path: Path) -> None:
    examples = make_examples(6, seed=2)
    rng_before = torch.get_rng_state()
    weights = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        result = run(tiny_llama_dir, tmp_path / name, examples, SMALL, seed=seed)
        weights[name] = load_file(result.adapter_dir / ADAPTER_WEIGHTS_FILE)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is left alone
    assert weights["a"].keys() == weights["c"].keys() and len(weights["a"]) == 2 * 3 * 2  # A,B x modules x layers
    assert all(torch.equal(weights["a"][name], weights["b"][name]) for name in weights["a"])
    assert not all(torch.equal(weights["a"][name], weights["c"][name]) for name in weights["a"])


def test_checkpoints_metrics_and_final_adapter(tiny_llama_dir: Path, tmp_path: Path) -> None:
    examples = make_examples(6, seed=3)
    eval_examples = make_examples(3, seed=4)
    recorder = Recorder()
    result = run(tiny_llama_dir, tmp_path, examples, SMALL.model_copy(update={"eval_interval": 2}),
                 recorder=recorder, eval_examples=eval_examples, checkpoint_every=2)
    assert result.status is TrainStatus.SUCCEEDED
    assert (result.steps, result.total_steps) == (6, 6)  # 2 epochs x ceil(6 / 2) batches
    assert [step for step, _ in recorder.checkpoints] == [2, 4, 6]
    assert result.last_checkpoint_dir == recorder.checkpoints[-1][1]

    metrics = recorder.metrics
    assert [m.step for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert [m.epoch for m in metrics] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    assert [m.eval_loss is not None for m in metrics] == [False, True, False, True, False, True]
    assert all(m.total_steps == 6 and m.tokens_per_second > 0 and m.eta_seconds >= 0 for m in metrics)
    assert metrics[-1].eta_seconds == 0
    assert result.eval_loss == metrics[-1].eval_loss and result.train_loss == metrics[-1].train_loss
    # Every epoch's training tokens, and the validation file's at each of the 3 evaluations.
    assert result.trained_tokens == (2 * sum(len(example.input_ids) for example in examples)
                                     + 3 * sum(len(example.input_ids) for example in eval_examples))

    model_config = ModelConfig.from_dir(tiny_llama_dir)
    for directory in [path for _, path in recorder.checkpoints] + [result.adapter_dir]:
        adapter = load_adapter_weights(directory, model_config, max_rank=SMALL.lora_r)
        assert adapter.rank == SMALL.lora_r
        assert adapter.target_modules == frozenset(SMALL.target_modules)
        assert len(adapter.modules) == 3 * model_config.num_layers
    final = load_file(result.adapter_dir / ADAPTER_WEIGHTS_FILE)
    assert all(torch.equal(final[name], tensor) for name, tensor in
               load_file(recorder.checkpoints[-1][1] / ADAPTER_WEIGHTS_FILE).items())


@pytest.mark.parametrize(("cancel_after", "checkpoint_every", "expected_checkpoints"), [
    (3, 100, [3]),  # cancel saves a checkpoint of the steps done
    (2, 2, [2]),  # ... unless the periodic one of this step is already saved
    (3, 2, [2, 3]),
    (0, 1, []),  # nothing trained, nothing to save
])
def test_cancel_stops_between_steps_and_saves_a_checkpoint(
    tiny_llama_dir: Path, tmp_path: Path, cancel_after: int, checkpoint_every: int, expected_checkpoints: list[int]
) -> None:
    recorder = Recorder(cancel_after=cancel_after)
    result = run(tiny_llama_dir, tmp_path, make_examples(6, seed=5), SMALL, recorder=recorder,
                 eval_examples=make_examples(2, seed=6), checkpoint_every=checkpoint_every)
    assert result.status is TrainStatus.CANCELLED
    assert result.adapter_dir is None and not (tmp_path / "adapter").exists()
    assert result.steps == len(recorder.metrics) == cancel_after < result.total_steps
    assert [step for step, _ in recorder.checkpoints] == expected_checkpoints
    evaluations = [m.eval_loss for m in recorder.metrics if m.eval_loss is not None]
    assert result.eval_loss == (evaluations[-1] if evaluations else None)
    if expected_checkpoints:
        assert result.last_checkpoint_dir == recorder.checkpoints[-1][1]
        weights = load_file(result.last_checkpoint_dir / ADAPTER_WEIGHTS_FILE)
        # Trained: PEFT initializes every lora_B to zero.
        assert any(name.endswith("lora_B.weight") and tensor.abs().sum() > 0 for name, tensor in weights.items())


class WorkerDied(Exception):
    """Stands for the process being killed: the run stops between steps and saves nothing more."""


class DyingRecorder(Recorder):
    def __init__(self, die_after: int) -> None:
        super().__init__()
        self.die_after = die_after

    def should_cancel(self) -> bool:
        if len(self.metrics) >= self.die_after:
            raise WorkerDied
        return False


def test_a_run_resumed_from_a_checkpoint_ends_as_if_never_interrupted(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """Issue 12, item 7: a retry restarted at step 1 (and collided with the checkpoints already
    recorded). It resumes the weights, AdamW's moments, the schedule, the dropout RNG and the data
    position of the last checkpoint: the steps after it, and the final weights, are the uninterrupted run's."""
    examples = make_examples(7, seed=9)  # 4 batches an epoch, the last one short
    hyperparameters = SMALL.model_copy(update={"n_epochs": 3})  # 12 steps; dropout 0.1, so the RNG matters
    whole = Recorder()
    uninterrupted = run(tiny_llama_dir, tmp_path / "whole", examples, hyperparameters, recorder=whole,
                        checkpoint_every=5)

    lost = DyingRecorder(die_after=7)
    with pytest.raises(WorkerDied):
        run(tiny_llama_dir, tmp_path / "lost", examples, hyperparameters, recorder=lost, checkpoint_every=5)
    assert [step for step, _ in lost.checkpoints] == [5]

    again = Recorder()
    resumed = run(tiny_llama_dir, tmp_path / "retry", examples, hyperparameters, recorder=again,
                  checkpoint_every=5, resume_from=lost.checkpoints[0][1])
    assert resumed.status is TrainStatus.SUCCEEDED
    assert [m.step for m in again.metrics] == list(range(6, 13))
    assert [step for step, _ in again.checkpoints] == [10]
    assert [m.train_loss for m in again.metrics] == [m.train_loss for m in whole.metrics[5:]]
    assert [m.epoch for m in again.metrics] == [m.epoch for m in whole.metrics[5:]]
    assert resumed.trained_tokens == uninterrupted.trained_tokens
    expected = load_file(uninterrupted.adapter_dir / ADAPTER_WEIGHTS_FILE)
    got = load_file(resumed.adapter_dir / ADAPTER_WEIGHTS_FILE)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def test_examples_longer_than_max_seq_len_are_a_user_error(tiny_llama_dir: Path, tmp_path: Path) -> None:
    examples = make_examples(4, seed=6)
    longest = max(examples, key=lambda example: len(example.input_ids))
    hyperparameters = SMALL.model_copy(update={"max_seq_len": len(longest.input_ids) - 1})
    with pytest.raises(TrainingInputError) as caught:
        run(tiny_llama_dir, tmp_path, examples, hyperparameters)
    assert caught.value.param == "hyperparameters.max_seq_len"
    assert caught.value.code == "example_too_long"
    assert f"line {longest.line}" in caught.value.message
    with pytest.raises(TrainingInputError) as caught:
        run(tiny_llama_dir, tmp_path, [], SMALL)
    assert (caught.value.param, caught.value.code) == ("training_file", "empty_training_file")
    untrained = TokenizedExample(line=9, input_ids=(1, 2, 3), loss_mask=(False, False, False))
    with pytest.raises(TrainingInputError) as caught:
        run(tiny_llama_dir, tmp_path, examples, SMALL, eval_examples=[untrained])
    assert (caught.value.param, caught.value.code) == ("validation_file", "no_trained_tokens")
