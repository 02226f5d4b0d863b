"""Jobs created and run in the test's own process, as the API and a worker would (jobs.create_job,
runner.run_job) on the tiny base: for the lifecycle tests that need real training runs."""
from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from training_live import MAX_LORA_RANK

from live_api import new_tenant
from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import AdapterVersionFile, FineTuningJob, FineTuningJobEvent
from loraloom.platform.settings import Settings
from loraloom.platform.storage import content_key, storage_from_settings
from loraloom.platform.training.files import FINE_TUNE_PURPOSE, create_file
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.jobs import ServedModel, create_job
from loraloom.platform.training.runner import WorkerContext, run_job


class JobRuns:
    """One tenant's jobs on one database and blob store, and a worker that runs them in this process."""

    def __init__(self, settings: Settings, base: Path) -> None:
        self.settings, self.base = settings, base
        self.db_engine = create_db_engine(settings.database_url)
        self.factory: sessionmaker[Session] = create_session_factory(self.db_engine)
        self.store = storage_from_settings(settings)
        self.tokenizer = Tokenizer.from_dir(base)
        self.served = ServedModel(name=base.name, max_lora_rank=MAX_LORA_RANK, reserved_names=frozenset())
        self.sent: list[str] = []
        with self.factory() as session:
            self.tenant_id: uuid.UUID = new_tenant(session).id
            session.commit()

    def close(self) -> None:
        self.db_engine.dispose()

    def upload(self, lines: list[dict], max_seq_len: int) -> str:
        data = "\n".join(json.dumps(line) for line in lines).encode()
        with self.factory() as session:
            return create_file(
                session, store=self.store, tenant_id=self.tenant_id, actor_key_id=None, filename="data.jsonl",
                purpose=FINE_TUNE_PURPOSE, stream=io.BytesIO(data), max_bytes=self.settings.training_file_max_bytes,
                tokenizer=self.tokenizer, max_seq_len=max_seq_len,
            ).id

    def create(self, hyperparameters: Hyperparameters, *, training_file: str, seed: int, **options: Any) -> str:
        with self.factory() as session:
            return create_job(
                session, tenant_id=self.tenant_id, actor_key_id=None, served=self.served, model=self.base.name,
                training_file=training_file, seed=seed,
                hyperparameters=hyperparameters, max_attempts=self.settings.training_max_attempts,
                send=self.sent.append, store=self.store,
                **{"validation_file": None, "suffix": f"run-{uuid.uuid4().hex[:6]}", **options},
            ).id

    def run(self, job_id: str) -> FineTuningJob:
        run_job(job_id, WorkerContext(settings=self.settings, model_dir=self.base, max_lora_rank=MAX_LORA_RANK,
                                      worker_id="test-worker", send=self.sent.append))
        return self.job(job_id)

    def job(self, job_id: str) -> FineTuningJob:
        with self.factory() as session:
            return session.get(FineTuningJob, job_id)

    def messages(self, job_id: str) -> list[str]:
        with self.factory() as session:
            return list(session.scalars(select(FineTuningJobEvent.message).where(FineTuningJobEvent.job_id == job_id)
                                        .order_by(FineTuningJobEvent.id)))

    def published_weights(self, job_id: str) -> dict[str, torch.Tensor]:
        with self.factory() as session:
            sha256 = session.scalar(select(AdapterVersionFile.sha256).where(
                AdapterVersionFile.version_id == self.job(job_id).result_version_id,
                AdapterVersionFile.filename == "adapter_model.safetensors"))
        with self.store.open(content_key(sha256)) as blob:
            return load(blob.read())


class _OnStep(logging.Handler):
    def __init__(self, job_id: str, step: int, action: Callable[[], None]) -> None:
        super().__init__()
        self.job_id, self.step, self.action, self.fired = job_id, step, action, False

    def emit(self, record: logging.LogRecord) -> None:
        data = getattr(record, "data", None) or {}
        if (getattr(record, "job_id", None) == self.job_id and getattr(record, "event_type", None) == "metrics"
                and data.get("step") == self.step and not self.fired):
            self.fired = True
            self.action()


@contextmanager
def on_step(job_id: str, step: int, action: Callable[[], None]) -> Iterator[_OnStep]:
    """Call `action` as the run reports step `step` (its metrics event, which job_state logs before the
    step's transaction writes anything): what a user's request between two steps does, at a chosen step."""
    handler = _OnStep(job_id, step, action)
    logger = logging.getLogger("loraloom.platform.training.job_state")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
