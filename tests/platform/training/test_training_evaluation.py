"""The trainer's evaluations, in OpenAI's metric names on the eval_interval schedule, billed tokens,
early stopping (best weights kept, exactly across a resume) and starting from a checkpoint."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_training_trainer import SMALL, DyingRecorder, Recorder, WorkerDied, make_examples, run

from loraloom.engine.lora.weights import ADAPTER_WEIGHTS_FILE
from loraloom.platform.training.datasets import TokenizedExample
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.schedule import evaluation_steps
from loraloom.platform.training.trainer import TrainResult, train_lora

CPU = torch.device("cpu")
NO_DROPOUT = SMALL.model_copy(update={"lora_dropout": 0.0})


def reference_loss_and_accuracy(base: Path, adapter_dir: Path | None, examples: list[TokenizedExample]):
    """Masked cross-entropy and argmax accuracy of base (+ adapter), one unpadded example at a time."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for example in examples:
            logits = model(input_ids=torch.tensor([example.input_ids])).logits[0, :-1]  # [seq - 1, vocab]
            chosen = torch.tensor(example.loss_mask[1:])
            targets = torch.tensor(example.input_ids[1:])[chosen]
            loss += torch.nn.functional.cross_entropy(logits[chosen], targets, reduction="sum").item()
            correct += int((logits[chosen].argmax(-1) == targets).sum())
            count += int(chosen.sum())
    return loss / count, correct / count, count


def tokens(examples: list[TokenizedExample]) -> int:
    return sum(len(example.input_ids) for example in examples)


def test_openai_metrics_on_the_evaluation_schedule(tiny_llama_dir: Path, tmp_path: Path) -> None:
    examples, eval_examples = make_examples(7, seed=11), make_examples(3, seed=12)
    hyperparameters = SMALL.model_copy(update={"eval_interval": 3})  # 8 steps: evaluations at 3, 6 and 8
    recorder = Recorder()
    result = run(tiny_llama_dir, tmp_path, examples, hyperparameters, recorder=recorder, eval_examples=eval_examples)
    metrics = recorder.metrics
    assert evaluation_steps(8, 3) == [3, 6, 8]
    assert [m.step for m in metrics if m.valid_loss is not None] == [3, 6, 8]
    assert all((m.valid_loss is None) == (m.valid_mean_token_accuracy is None) for m in metrics)
    assert all(m.eval_loss == m.valid_loss for m in metrics)  # the older name, for its readers
    assert all(0.0 <= m.train_mean_token_accuracy <= 1.0 and m.train_reward_margin is None for m in metrics)
    assert [m.full_valid_loss is not None for m in metrics] == [False] * 7 + [True]
    last = metrics[-1]
    assert (last.full_valid_loss, last.full_valid_mean_token_accuracy) == (last.valid_loss,
                                                                           last.valid_mean_token_accuracy)
    assert (result.valid_loss, result.full_valid_loss, result.eval_loss) == (last.valid_loss,) * 3
    assert not result.stopped_early and result.best_step is None
    # Billed: every step's examples, and the validation file at each of the 3 evaluations.
    assert result.trained_tokens == 2 * tokens(examples) + 3 * tokens(eval_examples)
    # The returned adapter on the whole validation file, computed apart from the trainer.
    loss, accuracy, count = reference_loss_and_accuracy(tiny_llama_dir, result.adapter_dir, eval_examples)
    assert result.full_valid_loss == pytest.approx(loss, rel=1e-5)
    assert abs(result.full_valid_mean_token_accuracy - accuracy) <= 1 / count  # an argmax near a tie may differ


def test_first_step_accuracy_is_the_base_models(tiny_llama_dir: Path, tmp_path: Path) -> None:
    examples = make_examples(5, seed=1)
    recorder = Recorder()
    run(tiny_llama_dir, tmp_path, examples, SMALL.model_copy(update={"n_epochs": 1, "batch_size": 5}),
        recorder=recorder)
    loss, accuracy, count = reference_loss_and_accuracy(tiny_llama_dir, None, examples)
    assert recorder.metrics[0].train_loss == pytest.approx(loss, rel=1e-5)
    assert abs(recorder.metrics[0].train_mean_token_accuracy - accuracy) <= 1 / count


# Memorizing 4 random sequences at a high learning rate: the loss on 4 other random ones soon rises.
OVERFIT = NO_DROPOUT.model_copy(update={"n_epochs": 40, "batch_size": 4, "learning_rate": 3e-2, "lora_r": 8,
                                        "lora_alpha": 16, "eval_interval": 1})
PATIENCE = 3


def overfit_run(base: Path, out: Path, recorder: Recorder, **kwargs) -> TrainResult:
    return train_lora(
        base_model_dir=base, train_examples=make_examples(4, seed=21), eval_examples=make_examples(4, seed=22),
        hyperparameters=OVERFIT, seed=0, output_dir=out, on_metrics=recorder.metrics.append,
        should_cancel=recorder.should_cancel, save_checkpoint=recorder.save_checkpoint, device=CPU,
        early_stopping_patience=PATIENCE, **{"checkpoint_every": 1, **kwargs},
    )


def test_early_stopping_returns_the_best_evaluations_weights(tiny_llama_dir: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    result = overfit_run(tiny_llama_dir, tmp_path, recorder)
    metrics = recorder.metrics
    losses = {m.step: m.valid_loss for m in metrics}
    assert result.stopped_early and result.steps < result.total_steps == 40
    assert result.best_step == min(losses, key=losses.get) and result.best_step < result.steps
    assert result.steps == result.best_step + PATIENCE  # an evaluation every step
    assert all(losses[step] >= losses[result.best_step] for step in range(result.best_step + 1, result.steps + 1))
    assert metrics[-1].step == result.steps and metrics[-1].full_valid_loss == losses[result.best_step]
    assert result.full_valid_loss == losses[result.best_step] < result.valid_loss
    # The saved adapter is the best step's weights (its checkpoint), not the last step's.
    checkpoints = dict(recorder.checkpoints)
    adapter = load_file(result.adapter_dir / ADAPTER_WEIGHTS_FILE)
    best = load_file(checkpoints[result.best_step] / ADAPTER_WEIGHTS_FILE)
    last = load_file(checkpoints[result.steps] / ADAPTER_WEIGHTS_FILE)
    assert adapter.keys() == best.keys()
    assert all(torch.equal(adapter[name], best[name]) for name in best)
    assert not all(torch.equal(adapter[name], last[name]) for name in last)
    loss, _, _ = reference_loss_and_accuracy(tiny_llama_dir, result.adapter_dir, make_examples(4, seed=22))
    assert loss == pytest.approx(result.full_valid_loss, rel=1e-5)
    assert result.trained_tokens == result.steps * (tokens(make_examples(4, seed=21)) + tokens(make_examples(4, seed=22)))


def test_a_resumed_run_stops_where_and_with_what_the_uninterrupted_one_does(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    whole = overfit_run(tiny_llama_dir, tmp_path / "whole", Recorder())
    # Die one step before the stop: the checkpoint must carry the best weights and the patience counter.
    lost = DyingRecorder(die_after=whole.steps - 1)
    with pytest.raises(WorkerDied):
        overfit_run(tiny_llama_dir, tmp_path / "lost", lost)
    assert lost.checkpoints[-1][0] == whole.steps - 1 > whole.best_step
    again = Recorder()
    resumed = overfit_run(tiny_llama_dir, tmp_path / "retry", again, resume_from=lost.checkpoints[-1][1])
    assert [m.step for m in again.metrics] == [whole.steps]
    assert (resumed.steps, resumed.best_step, resumed.stopped_early) == (whole.steps, whole.best_step, True)
    assert (resumed.full_valid_loss, resumed.trained_tokens) == (whole.full_valid_loss, whole.trained_tokens)
    expected = load_file(whole.adapter_dir / ADAPTER_WEIGHTS_FILE)
    got = load_file(resumed.adapter_dir / ADAPTER_WEIGHTS_FILE)
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def test_early_stopping_needs_validation_examples(tiny_llama_dir: Path, tmp_path: Path) -> None:
    for patience, eval_examples, param in ((2, [], "early_stopping"), (0, make_examples(2, seed=3),
                                                                       "early_stopping.patience")):
        with pytest.raises(TrainingInputError) as caught:
            train_lora(base_model_dir=tiny_llama_dir, train_examples=make_examples(2, seed=2),
                       eval_examples=eval_examples, hyperparameters=SMALL, seed=0, output_dir=tmp_path,
                       on_metrics=lambda _: None, should_cancel=lambda: False, save_checkpoint=lambda *_: None,
                       checkpoint_every=10, device=CPU, early_stopping_patience=patience)
        assert caught.value.param == param


def test_a_job_starts_from_another_jobs_checkpoint(tiny_llama_dir: Path, tmp_path: Path) -> None:
    examples = make_examples(6, seed=31)
    first = run(tiny_llama_dir, tmp_path / "first", examples, NO_DROPOUT)
    one_step = NO_DROPOUT.model_copy(update={"n_epochs": 1, "batch_size": len(examples)})
    started, fresh = Recorder(), Recorder()
    train_lora(base_model_dir=tiny_llama_dir, train_examples=examples, eval_examples=[], hyperparameters=one_step,
               seed=5, output_dir=tmp_path / "second", on_metrics=started.metrics.append, should_cancel=lambda: False,
               save_checkpoint=lambda *_: None, checkpoint_every=10, device=CPU, start_from=first.adapter_dir)
    run(tiny_llama_dir, tmp_path / "fresh", examples, one_step, seed=5, recorder=fresh)
    # Its one step is over every example: its loss is the first job's adapter's, not the base's.
    trained_loss, _, _ = reference_loss_and_accuracy(tiny_llama_dir, first.adapter_dir, examples)
    base_loss, _, _ = reference_loss_and_accuracy(tiny_llama_dir, None, examples)
    assert started.metrics[0].train_loss == pytest.approx(trained_loss, rel=1e-5)
    assert fresh.metrics[0].train_loss == pytest.approx(base_loss, rel=1e-5)
    assert not math.isclose(trained_loss, base_loss, rel_tol=1e-2)


@pytest.mark.parametrize(("change", "named"), [
    ({"lora_r": 8, "lora_alpha": 16}, "lora_r 4 (the job's is 8)"),
    ({"target_modules": ["q_proj"]}, "target_modules"),
    ({"lora_alpha": 4}, "lora_alpha 8"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_naming_from_checkpoint(
    tiny_llama_dir: Path, tmp_path: Path, change: dict, named: str
) -> None:
    first = run(tiny_llama_dir, tmp_path / "first", make_examples(2, seed=41),
                SMALL.model_copy(update={"n_epochs": 1}))
    with pytest.raises(TrainingInputError) as caught:
        run_from = SMALL.model_copy(update=change)
        train_lora(base_model_dir=tiny_llama_dir, train_examples=make_examples(2, seed=41), eval_examples=[],
                   hyperparameters=run_from, seed=0, output_dir=tmp_path / "second", on_metrics=lambda _: None,
                   should_cancel=lambda: False, save_checkpoint=lambda *_: None, checkpoint_every=10, device=CPU,
                   start_from=first.adapter_dir)
    assert (caught.value.param, caught.value.code) == ("from_checkpoint", "checkpoint_mismatch")
    assert named in caught.value.message and "from_checkpoint" in caught.value.message
