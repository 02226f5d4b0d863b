"""PEFT LoRA training on the served base model: a plain, seeded training loop.

The loop is written out (no HF Trainer) so that everything random is under one
seed: LoRA initialization and dropout draw from torch's global RNG inside a
forked RNG state seeded with `seed`, and the example order from a generator
seeded with it. On CPU the base runs in float32; on CUDA in bfloat16 with
gradient checkpointing (PEFT keeps the LoRA weights themselves in float32).

Per optimizer step: one batch, loss only on the examples' loss-mask tokens
(datasets.py), AdamW with a short linear warmup then linear decay, gradient
norm clipped to 1. Cancellation is cooperative: `should_cancel` is asked before
every step, and a cancelled run saves a checkpoint of the steps it finished
(Celery's revoke(terminate=True) kills the process mid-step and saves nothing).

Every checkpoint also holds the run's optimizer, schedule and RNG state (resume.py): a
run started from one (`resume_from`) continues at the next step, on the same example
order, and ends with the weights the run would have had if it had not been interrupted.

The final adapter is loaded back with the engine's own loader before it is
returned, so a run that succeeds has produced an adapter the engine serves.
"""
from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from loraloom.engine import ADAPTER_WEIGHTS_FILE, ModelConfig, load_adapter_weights
from loraloom.platform.training.datasets import TokenizedExample
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.resume import (
    TRAINING_STATE_FILE,
    RunPosition,
    load_training_state,
    save_training_state,
)

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
    train_loss: float  # this step's batch, mean over its trained tokens
    eval_loss: float | None  # set on the steps where the validation examples were evaluated
    tokens_per_second: float  # non-padding tokens through the model per second of training
    elapsed_seconds: float
    eta_seconds: float  # time left at the average step time so far


@dataclass(frozen=True)
class TrainResult:
    status: TrainStatus
    adapter_dir: Path | None  # the final PEFT adapter; None when cancelled
    last_checkpoint_dir: Path | None  # the latest checkpoint saved (and handed to save_checkpoint)
    steps: int  # optimizer steps finished
    total_steps: int
    train_loss: float | None  # of the last step
    eval_loss: float | None  # of the last evaluation (the end, unless cancelled); None without validation examples
    trained_tokens: int  # example tokens through the model, every epoch (what OpenAI bills as trained_tokens)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_lora(
    *,
    base_model_dir: Path,
    train_examples: Sequence[TokenizedExample],
    eval_examples: Sequence[TokenizedExample],
    hyperparameters: Hyperparameters,
    seed: int,
    output_dir: Path,
    on_metrics: Callable[[TrainingMetrics], None],
    should_cancel: Callable[[], bool],
    save_checkpoint: Callable[[int, Path], None],
    checkpoint_every: int,
    device: torch.device | None = None,
    resume_from: Path | None = None,
) -> TrainResult:
    """Train a LoRA adapter on `base_model_dir`; checkpoints and the final adapter go under `output_dir`.

    `save_checkpoint(step, directory)` is called with each checkpoint's directory (every
    `checkpoint_every` steps and on cancel): the PEFT files plus TRAINING_STATE_FILE, so the caller
    can copy them to object storage. `resume_from`, such a directory of an earlier run of the same
    job (same inputs and seed), continues that run from its step.
    """
    _check_inputs(train_examples, eval_examples, hyperparameters, checkpoint_every)
    device = device or default_device()
    output_dir = Path(output_dir)
    batches_per_epoch = math.ceil(len(train_examples) / hyperparameters.batch_size)
    total_steps = hyperparameters.n_epochs * batches_per_epoch
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):  # seed the RNG without changing the caller's
        model = _load_lora_model(Path(base_model_dir), hyperparameters, device, seed)
        parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        optimizer = torch.optim.AdamW(parameters, lr=hyperparameters.learning_rate, weight_decay=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_then_linear_decay(total_steps))
        order = torch.Generator().manual_seed(seed)

        step = trained_tokens = 0
        train_loss: float | None = None
        eval_loss: float | None = None
        last_checkpoint: tuple[int, Path] | None = None
        if resume_from is not None:
            position = _resume(model, optimizer, scheduler, Path(resume_from), device)
            step, trained_tokens = position.step, position.trained_tokens
            last_checkpoint = (step, Path(resume_from))
        resumed_at = step

        def checkpoint() -> tuple[int, Path]:
            position = RunPosition(step=step, trained_tokens=trained_tokens)
            return step, _save_checkpoint(model, optimizer, scheduler, position, device, output_dir, save_checkpoint)

        def result(status: TrainStatus, adapter_dir: Path | None) -> TrainResult:
            return TrainResult(
                status=status,
                adapter_dir=adapter_dir,
                last_checkpoint_dir=None if last_checkpoint is None else last_checkpoint[1],
                steps=step,
                total_steps=total_steps,
                train_loss=train_loss,
                eval_loss=eval_loss,
                trained_tokens=trained_tokens,
            )

        started = time.monotonic()
        for epoch in range(hyperparameters.n_epochs):
            # Drawn for every epoch, resumed-over ones too, so the order matches the uninterrupted run's.
            permutation = torch.randperm(len(train_examples), generator=order).tolist()
            for first in range(0, len(permutation), hyperparameters.batch_size):
                if epoch * batches_per_epoch + first // hyperparameters.batch_size < resumed_at:
                    continue  # trained by the run this one resumes
                if should_cancel():
                    if step > 0 and (last_checkpoint is None or last_checkpoint[0] != step):
                        last_checkpoint = checkpoint()
                    return result(TrainStatus.CANCELLED, adapter_dir=None)
                batch = _collate([train_examples[i] for i in permutation[first:first + hyperparameters.batch_size]],
                                 device)
                loss_sum, num_targets = _loss_sum(model, batch)
                loss = loss_sum / num_targets
                loss.backward()
                torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                train_loss = loss.item()
                if not math.isfinite(train_loss):
                    raise TrainingInputError(
                        code="training_diverged",
                        message=f"hyperparameters.learning_rate: the loss became {train_loss} at step {step}; "
                                "lower the learning rate",
                        param="hyperparameters.learning_rate",
                    )
                trained_tokens += int(batch["attention_mask"].sum())

                checkpoint_due = step % checkpoint_every == 0
                if checkpoint_due:
                    last_checkpoint = checkpoint()
                evaluated = (checkpoint_due or step == total_steps) and bool(eval_examples)
                if evaluated:
                    eval_loss = evaluate_loss(model, eval_examples, hyperparameters.batch_size, device)
                elapsed = time.monotonic() - started
                on_metrics(TrainingMetrics(
                    step=step,
                    total_steps=total_steps,
                    epoch=epoch + (first // hyperparameters.batch_size + 1) / batches_per_epoch,
                    train_loss=train_loss,
                    eval_loss=eval_loss if evaluated else None,
                    tokens_per_second=trained_tokens / elapsed if elapsed > 0 else 0.0,
                    elapsed_seconds=elapsed,
                    eta_seconds=elapsed / (step - resumed_at) * (total_steps - step),
                ))

    adapter_dir = output_dir / FINAL_ADAPTER_DIR
    model.save_pretrained(str(adapter_dir), safe_serialization=True)
    # A job that succeeds must leave an adapter the engine can serve at once: load it as the engine would.
    load_adapter_weights(adapter_dir, ModelConfig.from_dir(base_model_dir), max_rank=hyperparameters.lora_r)
    return result(TrainStatus.SUCCEEDED, adapter_dir=adapter_dir)


def evaluate_loss(
    model: torch.nn.Module, examples: Sequence[TokenizedExample], batch_size: int, device: torch.device
) -> float:
    """Mean loss over every trained token of `examples` (not a mean of batch means), without dropout."""
    model.eval()
    total_loss = 0.0
    total_targets = 0
    with torch.no_grad():
        for first in range(0, len(examples), batch_size):
            loss_sum, num_targets = _loss_sum(model, _collate(examples[first:first + batch_size], device))
            total_loss += loss_sum.item()
            total_targets += num_targets
    model.train()
    return total_loss / total_targets


def _check_inputs(
    train_examples: Sequence[TokenizedExample],
    eval_examples: Sequence[TokenizedExample],
    hyperparameters: Hyperparameters,
    checkpoint_every: int,
) -> None:
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every: must be >= 1 step, got {checkpoint_every}")
    if not train_examples:
        raise TrainingInputError(code="empty_training_file", message="training_file: holds no examples",
                                 param="training_file")
    for param, examples in (("training_file", train_examples), ("validation_file", eval_examples)):
        for example in examples:
            if example.num_trained_tokens == 0:
                raise TrainingInputError(code="no_trained_tokens", param=param,
                                         message=f"{param}: line {example.line} has no tokens to train on")
            if len(example.input_ids) > hyperparameters.max_seq_len:
                raise TrainingInputError(
                    code="example_too_long",
                    message=f"{param}: line {example.line} is {len(example.input_ids)} tokens long, above "
                            f"hyperparameters.max_seq_len {hyperparameters.max_seq_len}; raise max_seq_len or "
                            "shorten the example",
                    param="hyperparameters.max_seq_len",
                )


def _load_lora_model(base_model_dir: Path, hyperparameters: Hyperparameters, device: torch.device, seed: int):
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


def _collate(examples: Sequence[TokenizedExample], device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded input ids, attention mask and loss mask of a batch."""
    length = max(len(example.input_ids) for example in examples)
    # Padding is neither attended to nor a target, so its token id does not matter.
    input_ids = torch.zeros(len(examples), length, dtype=torch.long)  # [batch, seq]
    attention_mask = torch.zeros(len(examples), length, dtype=torch.long)  # [batch, seq]
    loss_mask = torch.zeros(len(examples), length, dtype=torch.bool)  # [batch, seq]
    for row, example in enumerate(examples):
        size = len(example.input_ids)
        input_ids[row, :size] = torch.tensor(example.input_ids, dtype=torch.long)
        attention_mask[row, :size] = 1
        loss_mask[row, :size] = torch.tensor(example.loss_mask, dtype=torch.bool)
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
            "loss_mask": loss_mask.to(device)}


def _loss_sum(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy, number of targets) over the batch's loss-mask tokens.

    Logits are computed only where a target is predicted: the vocabulary projection of
    every position would cost a fifth of the compute of a small model, and gigabytes of
    activations for a long sequence with a large vocabulary.
    """
    causal_lm = model.get_base_model()
    hidden = causal_lm.get_decoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state  # [batch, seq, hidden]
    # Position t predicts the token at t + 1.
    predicts_target = batch["loss_mask"][:, 1:]  # [batch, seq - 1]
    selected = hidden[:, :-1][predicts_target]  # [num_targets, hidden]
    targets = batch["input_ids"][:, 1:][predicts_target]  # [num_targets]
    logits = causal_lm.get_output_embeddings()(selected).float()  # [num_targets, vocab]
    return torch.nn.functional.cross_entropy(logits, targets, reduction="sum"), targets.numel()


def _warmup_then_linear_decay(total_steps: int) -> Callable[[int], float]:
    """Learning-rate factor of 0-based step `step`: linear warmup, then linear decay that stays above 0."""
    warmup_steps = max(1, math.ceil(WARMUP_FRACTION * total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return (total_steps - step) / max(1, total_steps - warmup_steps)

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
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    loaded = set_peft_model_state_dict(model, load_file(str(directory / ADAPTER_WEIGHTS_FILE), device=str(device)))
    missing_lora = [key for key in loaded.missing_keys if "lora_" in key]
    if loaded.unexpected_keys or missing_lora:
        raise ValueError(f"checkpoint {directory} does not fit this job's LoRA modules: "
                         f"unexpected {loaded.unexpected_keys[:3]}, missing {missing_lora[:3]}")
    return load_training_state(directory / TRAINING_STATE_FILE, optimizer, scheduler, device)
