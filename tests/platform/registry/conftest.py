"""Registry fixtures: a real PEFT adapter for the bundled model, the served base it must fit,
and blob stores (file:// and moto's S3)."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from lora_factory import make_peft_adapter
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine.config import ModelConfig
from loraloom.platform.db.models import Tenant
from loraloom.platform.registry.validation import ServedBase
from loraloom.platform.storage import BlobStore, LocalBlobStore, S3BlobStore, storage_from_url

MAX_LORA_RANK = 16
ADAPTER_TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="session")
def served(model_dir: Path) -> ServedBase:
    return ServedBase(name=model_dir.name, config=ModelConfig.from_dir(model_dir), max_lora_rank=MAX_LORA_RANK)


@pytest.fixture(scope="session")
def peft_adapter(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real PEFT adapter (rank 4 on q/v) for the bundled model. Read-only: copy it to modify it."""
    out = tmp_path_factory.mktemp("peft") / "adapter"
    return make_peft_adapter(model_dir, out, rank=4, alpha=8, target_modules=ADAPTER_TARGETS, seed=21)


@pytest.fixture(scope="session")
def other_peft_adapter(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Different weights for the same base: a second version."""
    out = tmp_path_factory.mktemp("peft") / "other"
    return make_peft_adapter(model_dir, out, rank=8, alpha=16, target_modules=["o_proj", "up_proj"], seed=22)


@pytest.fixture
def file_store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


@pytest.fixture
def s3_store(s3_server) -> S3BlobStore:
    store = storage_from_url(
        f"s3://{s3_server.bucket}/registry-{uuid.uuid4().hex}", s3_server.endpoint_url, region=s3_server.region
    )
    assert isinstance(store, S3BlobStore)
    return store


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest) -> BlobStore:
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def make_tenant() -> Callable[[sessionmaker[Session], str], uuid.UUID]:
    def make(factory: sessionmaker[Session], name: str) -> uuid.UUID:
        with factory() as session:
            tenant = Tenant(name=name)
            session.add(tenant)
            session.commit()
            return tenant.id

    return make
