"""PEFT LoRA training on the served base model: a plain, seeded training loop.

The loop is written out (no HF Trainer) so that everything random is under one
seed: LoRA initialization and dropout draw from torch's global RNG inside a
forked RNG state seeded with `seed`, and the example order from a generator
seeded with it. On CPU the base runs in float32; on CUDA in bfloat16 with
gradient checkpointing (PEFT keeps the LoRA weights themselves in float32).

Per optimizer step: one batch, the method's loss (supervised.py: cross-entropy on the
examples' loss-mask tokens; dpo.py: DPO on preference pairs), AdamW with a short linear
warmup then linear decay, gradient norm clipped to 1. Cancellation is cooperative:
`should_cancel` is asked before every step, and a cancelled run saves a checkpoint of the
steps it finished (Celery's revoke(terminate=True) kills the process mid-step and saves nothing).

Metrics, in OpenAI's names (TrainingMetrics): every step reports `train_loss` (and
`train_mean_token_accuracy`, or DPO's reward margin and accuracy). With validation examples,
the steps of schedule.evaluation_steps (every `eval_interval`, and the last) also report
`valid_loss` and `valid_mean_token_accuracy`. Unlike OpenAI's, whose valid_loss is one
validation batch's, ours are over the whole validation file: early stopping compares
evaluations, and a batch's loss varies more from batch to batch than a small job's training
moves it. `full_valid_loss` and `full_valid_mean_token_accuracy`, on the run's final step,
are the whole validation file under the adapter the run returns: the last evaluation's, or
with early stopping the best one's (no extra pass over the file). `eval_loss` repeats
`valid_loss` for the readers of the older name (the runner's step messages, the CLI's
progress, the console's loss chart).

`trained_tokens` counts the tokens through the model: every training step's examples
(`.token_count`, both sequences of a preference pair) plus the validation file's at each
evaluation, which is what the job API's estimate computes beforehand. DPO's one pass for the
reference log-probabilities before training is not counted.

Early stopping (`early_stopping_patience`, early_stopping.py) ends the run once valid_loss has
not improved for that many evaluations in a row, and returns the best evaluation's weights.
`start_from` starts from another job's checkpoint's LoRA weights (lora_loading.py), with a fresh
optimizer and schedule.

Every checkpoint also holds the run's optimizer, schedule, RNG and early-stopping state (resume.py):
a run started from one (`resume_from`) continues at the next step, on the same example order, and
ends with the weights the run would have had if it had not been interrupted.

The final adapter is loaded back with the engine's own loader before it is
returned, so a run that succeeds has produced an adapter the engine serves.
"""
from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from loraloom.engine import ModelConfig, load_adapter_weights
from loraloom.platform.training.datasets import Example, TokenizedExample
from loraloom.platform.training.early_stopping import EarlyStopping
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import DpoHyperparameters, Hyperparameters
from loraloom.platform.training.lora_loading import (
    load_checkpoint_weights,
    load_lora_state,
    load_start_weights,
    lora_state,
)
from loraloom.platform.training.methods import DPO, SUPERVISED, check_method
from loraloom.platform.training.preference_data import PreferenceExample
from loraloom.platform.training.resume import (
    TRAINING_STATE_FILE,
    RunPosition,
    load_training_state,
    save_training_state,
)
from loraloom.platform.training.schedule import evaluation_steps, total_steps

WARMUP_FRACTION = 0.05
MAX_GRAD_NORM = 1.0
FINAL_ADAPTER_DIR = "adapter"


class TrainStatus(str, enum.Enum):
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TrainingMetrics:
    step: int  # optimizer steps finished
    total_steps: int
    epoch: float  # epochs finished, fractional
    train_loss: float  # this step's batch: mean over its trained tokens (supervised) or its pairs (DPO)
    eval_loss: float | None  # valid_loss again, under its older name (see the module docstring)
    tokens_per_second: float  # trained tokens (validation's included) per second of training
    elapsed_seconds: float
    eta_seconds: float  # time left at the average step time so far
    train_mean_token_accuracy: float | None = None  # supervised: the share of the batch's targets ranked first
    valid_loss: float | None = None  # set on evaluation steps: the whole validation file
    valid_mean_token_accuracy: float | None = None
    full_valid_loss: float | None = None  # set on the final step: the returned adapter on the validation file
    full_valid_mean_token_accuracy: float | None = None
    train_reward_margin: float | None = None  # DPO: mean beta x (preferred gain - non-preferred gain)
    train_reward_accuracy: float | None = None  # DPO: share of pairs whose margin is positive
    valid_reward_margin: float | None = None
    valid_reward_accuracy: float | None = None
    full_valid_reward_margin: float | None = None
    full_valid_reward_accuracy: float | None = None


@dataclass(frozen=True)
class TrainResult:
    status: TrainStatus
    adapter_dir: Path | None  # the final PEFT adapter; None when cancelled
    last_checkpoint_dir: Path | None  # the latest checkpoint saved (and handed to save_checkpoint)
    steps: int  # optimizer steps finished
    total_steps: int
    train_loss: float | None  # of the last step
    valid_loss: float | None  # of the last evaluation; None without validation examples (or none yet)
    trained_tokens: int  # training tokens of every step + validation tokens x evaluations (module docstring)
    full_valid_loss: float | None = None  # the returned adapter's valid_loss (None when cancelled)
    full_valid_mean_token_accuracy: float | None = None
    stopped_early: bool = False  # early stopping ended the run before total_steps
    best_step: int | None = None  # with early stopping: the evaluation whose weights the adapter holds
    # The optimizer loop's time (steps, evaluations, checkpoints), without loading the model before it:
    # what an estimate's rate per token is measured on (throughput.py).
    training_seconds: float = 0.0

    @property
    def eval_loss(self) -> float | None:
        """valid_loss, under its older name."""
        return self.valid_loss


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_lora(
    *,
    base_model_dir: Path,
    train_examples: Sequence[Example],
    eval_examples: Sequence[Example],
    hyperparameters: Hyperparameters,
    seed: int,
    output_dir: Path,
    on_metrics: Callable[[TrainingMetrics], None],
    should_cancel: Callable[[], bool],
    save_checkpoint: Callable[[int, Path], None],
    checkpoint_every: int,
    device: torch.device | None = None,
    resume_from: Path | None = None,
    method: str = SUPERVISED,
    early_stopping_patience: int | None = None,
    start_from: Path | None = None,
) -> TrainResult:
    """Train a LoRA adapter on `base_model_dir`; checkpoints and the final adapter go under `output_dir`.

    `save_checkpoint(step, directory)` is called with each checkpoint's directory (every
    `checkpoint_every` steps and on cancel): the PEFT files plus TRAINING_STATE_FILE, so the caller
    can copy them to object storage. `resume_from`, such a directory of an earlier run of the same
    job (same inputs and seed), continues that run from its step. `method` is "supervised"
    (TokenizedExample) or "dpo" (PreferenceExample, DpoHyperparameters). `start_from`: a checkpoint
    directory of another job whose LoRA weights this one starts from.
    """
    _check_inputs(train_examples, eval_examples, hyperparameters, checkpoint_every, method, early_stopping_patience)
    device = device or default_device()
    output_dir = Path(output_dir)
    batch_size = hyperparameters.batch_size
    batches_per_epoch = math.ceil(len(train_examples) / batch_size)
    steps_total = total_steps(len(train_examples), batch_size, hyperparameters.n_epochs)
    evaluated_steps = set(evaluation_steps(steps_total, hyperparameters.eval_interval)) if eval_examples else set()
    eval_tokens = sum(example.token_count for example in eval_examples)
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):  # seed the RNG without changing the caller's
        model = load_lora_model(Path(base_model_dir), hyperparameters, device, seed)
        if start_from is not None:
            load_start_weights(model, Path(start_from), hyperparameters, device)
        objective = method_objective(method, train_examples, eval_examples, hyperparameters, device)
        objective.prepare(model)  # DPO's reference: the model as the job starts (before resuming)
        parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        optimizer = torch.optim.AdamW(parameters, lr=hyperparameters.learning_rate, weight_decay=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_then_linear_decay(steps_total))
        order = torch.Generator().manual_seed(seed)
        stopping = EarlyStopping(early_stopping_patience) if early_stopping_patience is not None else None

        step = trained_tokens = 0
        last: dict[str, float] = {}  # the last step's train_* metrics and the last evaluation's valid_*
        returned: dict[str, float] = {}  # the valid_* metrics of the adapter the run returns
        last_checkpoint: tuple[int, Path] | None = None
        if resume_from is not None:
            position = _resume(model, optimizer, scheduler, Path(resume_from), device)
            step, trained_tokens = position.step, position.trained_tokens
            if stopping is not None and position.early_stopping is not None:
                stopping = EarlyStopping.from_state(position.early_stopping, position.best_weights)
                stopping.patience = early_stopping_patience
            last_checkpoint = (step, Path(resume_from))
        resumed_at = step

        def checkpoint() -> tuple[int, Path]:
            counters, best_weights = stopping.to_state() if stopping is not None else (None, {})
            position = RunPosition(step=step, trained_tokens=trained_tokens, early_stopping=counters,
                                   best_weights=best_weights)
            return step, _save_checkpoint(model, optimizer, scheduler, position, device, output_dir, save_checkpoint)

        def result(status: TrainStatus, adapter_dir: Path | None, stopped_early: bool = False) -> TrainResult:
            return TrainResult(
                status=status,
                adapter_dir=adapter_dir,
                last_checkpoint_dir=None if last_checkpoint is None else last_checkpoint[1],
                steps=step,
                total_steps=steps_total,
                train_loss=last.get("train_loss"),
                valid_loss=last.get("valid_loss"),
                trained_tokens=trained_tokens,
                full_valid_loss=returned.get("valid_loss"),
                full_valid_mean_token_accuracy=returned.get("valid_mean_token_accuracy"),
                stopped_early=stopped_early,
                best_step=None if stopping is None else stopping.best_step,
                training_seconds=time.monotonic() - started,
            )

        started = time.monotonic()
        stop = False
        for epoch, batch_index, indices in _batches(len(train_examples), batch_size, hyperparameters.n_epochs, order):
            if epoch * batches_per_epoch + batch_index < resumed_at:
                continue  # trained by the run this one resumes
            if should_cancel():
                if step > 0 and (last_checkpoint is None or last_checkpoint[0] != step):
                    last_checkpoint = checkpoint()
                return result(TrainStatus.CANCELLED, adapter_dir=None)
            loss, step_metrics = objective.train_step(model, indices)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            last.update(step_metrics)
            if not math.isfinite(step_metrics["train_loss"]):
                raise TrainingInputError(
                    code="training_diverged",
                    message=f"hyperparameters.learning_rate: the loss became {step_metrics['train_loss']} at step "
                            f"{step}; lower the learning rate",
                    param="hyperparameters.learning_rate",
                )
            trained_tokens += sum(train_examples[index].token_count for index in indices)

            valid: dict[str, float] = {}
            if step in evaluated_steps:  # before the checkpoint, whose state counts its tokens
                valid = objective.evaluate(model)
                trained_tokens += eval_tokens
                last.update(valid)
                if stopping is not None:
                    stop = stopping.observe(step, valid, lambda: lora_state(model))
            if step % checkpoint_every == 0:
                last_checkpoint = checkpoint()
            final = stop or step == steps_total
            if final and eval_examples:
                returned = stopping.best_metrics if stopping is not None else valid
            elapsed = time.monotonic() - started
            on_metrics(TrainingMetrics(
                step=step,
                total_steps=steps_total,
                epoch=epoch + (batch_index + 1) / batches_per_epoch,
                eval_loss=valid.get("valid_loss"),
                tokens_per_second=trained_tokens / elapsed if elapsed > 0 else 0.0,
                elapsed_seconds=elapsed,
                eta_seconds=0.0 if final else elapsed / (step - resumed_at) * (steps_total - step),
                **step_metrics,
                **valid,
                **({f"full_{name}": value for name, value in returned.items()} if final else {}),
            ))
            if stop:
                break

    if stopping is not None and stopping.best_weights is not None:
        problems = load_lora_state(model, stopping.best_weights)
        assert not problems, problems  # the model's own state dict, saved at its best evaluation
    adapter_dir = output_dir / FINAL_ADAPTER_DIR
    model.save_pretrained(str(adapter_dir), safe_serialization=True)
    # A job that succeeds must leave an adapter the engine can serve at once: load it as the engine would.
    load_adapter_weights(adapter_dir, ModelConfig.from_dir(base_model_dir), max_rank=hyperparameters.lora_r)
    return result(TrainStatus.SUCCEEDED, adapter_dir=adapter_dir, stopped_early=stop and step < steps_total)


def _batches(
    n_examples: int, batch_size: int, n_epochs: int, order: torch.Generator
) -> Iterator[tuple[int, int, list[int]]]:
    """(epoch, batch index in the epoch, example indices) of every step, in the seeded order."""
    for epoch in range(n_epochs):
        # Drawn for every epoch, resumed-over ones too, so the order matches the uninterrupted run's.
        permutation = torch.randperm(n_examples, generator=order).tolist()
        for first in range(0, n_examples, batch_size):
            yield epoch, first // batch_size, permutation[first:first + batch_size]


def method_objective(method: str, train_examples, eval_examples, hyperparameters: Hyperparameters,
                     device: torch.device):
    """The method's loss: its train_step, its evaluate (valid_* metrics) and prepare (DPO's reference)."""
    if method == DPO:
        from loraloom.platform.training.dpo import DpoObjective

        assert isinstance(hyperparameters, DpoHyperparameters)  # _check_inputs
        return DpoObjective(train_examples, eval_examples, hyperparameters.batch_size, hyperparameters.beta, device)
    from loraloom.platform.training.supervised import SupervisedObjective

    return SupervisedObjective(train_examples, eval_examples, hyperparameters.batch_size, device)


def _check_inputs(
    train_examples: Sequence[Example],
    eval_examples: Sequence[Example],
    hyperparameters: Hyperparameters,
    checkpoint_every: int,
    method: str,
    early_stopping_patience: int | None,
) -> None:
    check_method(method)
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every: must be >= 1 step, got {checkpoint_every}")
    example_type = PreferenceExample if method == DPO else TokenizedExample
    if not all(isinstance(example, example_type) for example in [*train_examples, *eval_examples]):
        raise ValueError(f"a {method} run trains on {example_type.__name__}s: load_dataset(..., method={method!r})")
    if method == DPO and not isinstance(hyperparameters, DpoHyperparameters):
        raise ValueError("a dpo run takes DpoHyperparameters (methods.hyperparameters_class)")
    if not train_examples:
        raise TrainingInputError(code="empty_training_file", message="training_file: holds no examples",
                                 param="training_file")
    if early_stopping_patience is not None:
        if early_stopping_patience < 1:
            raise TrainingInputError(code="invalid_early_stopping", param="early_stopping.patience",
                                     message=f"early_stopping.patience: must be >= 1 evaluation, got "
                                             f"{early_stopping_patience}")
        if not eval_examples:
            raise TrainingInputError(code="invalid_early_stopping", param="early_stopping",
                                     message="early_stopping: needs a validation_file, whose loss it watches")
    for param, examples in (("training_file", train_examples), ("validation_file", eval_examples)):
        for example in examples:
            if example.num_trained_tokens == 0:
                raise TrainingInputError(code="no_trained_tokens", param=param,
                                         message=f"{param}: line {example.line} has no tokens to train on")
            if example.longest_sequence > hyperparameters.max_seq_len:
                raise TrainingInputError(
                    code="example_too_long",
                    message=f"{param}: line {example.line} is {example.longest_sequence} tokens long, above "
                            f"hyperparameters.max_seq_len {hyperparameters.max_seq_len}; raise max_seq_len or "
                            "shorten the example",
                    param="hyperparameters.max_seq_len",
                )


def load_lora_model(base_model_dir: Path, hyperparameters: Hyperparameters, device: torch.device, seed: int):
    """The base model with fresh LoRA modules (seeded), ready to train on `device`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    on_gpu = device.type == "cuda"
    model = AutoModelForCausalLM.from_pretrained(
        base_model_dir, dtype=torch.bfloat16 if on_gpu else torch.float32, device_map={"": device}
    )
    model.config.use_cache = False  # a KV cache is for generation, and conflicts with gradient checkpointing
    if on_gpu:
        # Non-reentrant checkpointing works with a frozen base (no inputs need requires_grad).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = LoraConfig(
        r=hyperparameters.lora_r,
        lora_alpha=hyperparameters.lora_alpha,
        lora_dropout=hyperparameters.lora_dropout,
        target_modules=list(hyperparameters.target_modules),
        bias="none",  # the engine serves LoRA without bias terms
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)  # LoRA A is initialized from the global RNG
    peft_model = get_peft_model(model, config)
    peft_model.train()
    return peft_model


def _warmup_then_linear_decay(steps_total: int) -> Callable[[int], float]:
    """Learning-rate factor of 0-based step `step`: linear warmup, then linear decay that stays above 0."""
    warmup_steps = max(1, math.ceil(WARMUP_FRACTION * steps_total))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return (steps_total - step) / max(1, steps_total - warmup_steps)

    return factor



def _save_checkpoint(
    model, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, position: RunPosition,
    device: torch.device, output_dir: Path, save_checkpoint: Callable[[int, Path], None],
) -> Path:
    directory = output_dir / f"checkpoint-{position.step}"
    model.save_pretrained(str(directory), safe_serialization=True)
    save_training_state(directory / TRAINING_STATE_FILE, position, optimizer, scheduler, device)
    save_checkpoint(position.step, directory)
    return directory


def _resume(
    model, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, directory: Path,
    device: torch.device,
) -> RunPosition:
    """Load a checkpoint's LoRA weights into `model` and its state into the optimizer and schedule."""
    load_checkpoint_weights(model, directory, device)
    return load_training_state(directory / TRAINING_STATE_FILE, optimizer, scheduler, device)
