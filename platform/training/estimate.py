"""What a job will cost before it runs: the tokens it will train on, its steps and evaluations, and
how long that takes at this server's measured rate (throughput.py).

The counts come from the trainer's own pieces, so they agree exactly with what the finished job
reports (unless it stops early): the files are tokenized by the dataset loading the worker uses, the
steps and the evaluation steps come from the schedule the trainer follows, and trained tokens are
counted as the trainer counts them: every epoch's training tokens, plus the validation tokens once
per evaluation.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from loraloom.engine import Tokenizer
from loraloom.platform.storage import BlobStore, content_key
from loraloom.platform.training.datasets import load_dataset
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.jobs import ServedModel, check_job_inputs
from loraloom.platform.training.promotion import Promotion
from loraloom.platform.training.schedule import evaluation_steps, total_steps
from loraloom.platform.training.throughput import Rate, training_rate


@dataclass(frozen=True)
class Estimate:
    trained_tokens: int  # what the finished job reports as trained_tokens, if it does not stop early
    training_tokens: int  # one pass over the training file
    validation_tokens: int  # one evaluation of the validation file
    n_epochs: int
    total_steps: int
    evaluations: int
    estimated_seconds: float
    rate: Rate


def estimate_examples(
    train_examples: Sequence[Any], eval_examples: Sequence[Any], hyperparameters: Hyperparameters, rate: Rate
) -> Estimate:
    """The estimate of a job over these tokenized examples (the trainer's, with their `token_count`)."""
    steps = total_steps(len(train_examples), hyperparameters.batch_size, hyperparameters.n_epochs)
    evaluations = len(evaluation_steps(steps, hyperparameters.eval_interval)) if eval_examples else 0
    training_tokens = sum(example.token_count for example in train_examples)
    validation_tokens = sum(example.token_count for example in eval_examples)
    trained = hyperparameters.n_epochs * training_tokens + evaluations * validation_tokens
    return Estimate(
        trained_tokens=trained, training_tokens=training_tokens, validation_tokens=validation_tokens,
        n_epochs=hyperparameters.n_epochs, total_steps=steps, evaluations=evaluations,
        estimated_seconds=rate.seconds_for(trained), rate=rate,
    )


def estimate_job(
    session: Session, *, store: BlobStore, tokenizer: Tokenizer, tenant_id: uuid.UUID, served: ServedModel,
    model: str, training_file: str, validation_file: str | None, suffix: str | None, hyperparameters: Hyperparameters,
    method: str, early_stopping_patience: int | None, from_checkpoint: str | None, promote: Promotion | None = None,
) -> Estimate:
    """Check a create request as creating the job would, then estimate it. Raises TrainingInputError
    naming the field at fault."""
    rows = check_job_inputs(
        session, tenant_id=tenant_id, served=served, model=model, training_file=training_file,
        validation_file=validation_file, suffix=suffix, hyperparameters=hyperparameters, method=method,
        early_stopping_patience=early_stopping_patience, from_checkpoint=from_checkpoint, store=store,
        promote=promote,
    )
    examples = []
    for row, param in zip(rows, ("training_file", "validation_file")):
        with store.open(content_key(row.sha256)) as blob:
            data = blob.read()
        examples.append(load_dataset(data, tokenizer, hyperparameters.max_seq_len, param=param, method=method)[1])
    train_examples, eval_examples = examples[0], examples[1] if len(examples) > 1 else []
    return estimate_examples(train_examples, eval_examples, hyperparameters, training_rate(session, tenant_id, served.name))
