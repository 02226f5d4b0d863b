"""Issue 12 item 4: deleting a version deleted blobs that checkpoints still used, even another
tenant's, because garbage collection counted only live version rows. Every reference counts:
versions not deleted, checkpoints and training files, of any tenant. On SQLite and PostgreSQL,
through the services, and over HTTP with two servers sharing one data dir and database (the
second has no cached copy, so it must find the blobs in storage)."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread
from registry_checks import run_together, upload_dir
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.blob_references import CLAIM_TTL, claim_blobs, release_claims
from loraloom.platform.db.models import (
    AdapterVersionFile,
    BlobClaim,
    FineTuningCheckpoint,
    FineTuningJob,
    FineTuningJobStatus,
    Tenant,
    TrainingFile,
    utcnow,
)
from loraloom.platform.registry.blobs import collect_blob
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.registry.versions import delete_adapter, delete_unreferenced_blobs, delete_version
from loraloom.platform.storage import BlobStore, content_key, storage_from_settings

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def add_checkpoint(factory: sessionmaker[Session], tenant_id: uuid.UUID, *, config_sha256: str,
                   weights_sha256: str) -> str:
    """A finished job of `tenant_id` with one checkpoint holding these two blobs; returns the checkpoint id."""
    with factory() as session:
        job = FineTuningJob(
            id=f"ftjob-{uuid.uuid4().hex[:24]}", tenant_id=tenant_id, model="base", training_file="file-x",
            suffix="bot", seed=1, hyperparameters={}, status=FineTuningJobStatus.succeeded, max_attempts=1,
        )
        checkpoint = FineTuningCheckpoint(
            id=f"ftckpt-{uuid.uuid4().hex[:24]}", job_id=job.id, step=2, metrics={}, config_sha256=config_sha256,
            weights_sha256=weights_sha256, weights_size_bytes=1,
        )
        session.add(job)
        session.flush()
        session.add(checkpoint)
        session.commit()
        return checkpoint.id


def add_training_file(factory: sessionmaker[Session], tenant_id: uuid.UUID, sha256: str) -> None:
    with factory() as session:
        session.add(TrainingFile(
            id=f"file-{uuid.uuid4().hex[:24]}", tenant_id=tenant_id, filename="d.jsonl", purpose="fine-tune",
            size_bytes=1, sha256=sha256, format="text", line_count=1, token_count=1, max_example_tokens=1,
        ))
        session.commit()


def digests(version) -> tuple[str, str]:
    by_name = {f.filename: f.sha256 for f in version.files}
    return by_name[CONFIG], by_name[WEIGHTS]


def present(store: BlobStore, *sha256s: str) -> bool:
    return all(store.exists(content_key(sha256)) for sha256 in sha256s)


@pytest.mark.parametrize("holder", ["checkpoint of the same tenant", "checkpoint of another tenant",
                                    "training file of another tenant", "version of another tenant"])
def test_a_deleted_version_s_blobs_stay_while_anything_else_holds_them(
    session_factory, file_store, served, make_tenant: Callable, peft_adapter, holder
):
    acme, globex = make_tenant(session_factory, "acme"), make_tenant(session_factory, "globex")
    version = upload_dir(session_factory, file_store, served, acme, peft_adapter)
    config, weights = digests(version)
    owner = acme if holder.endswith("same tenant") else globex
    if holder.startswith("checkpoint"):
        add_checkpoint(session_factory, owner, config_sha256=config, weights_sha256=weights)
    elif holder.startswith("training file"):
        add_training_file(session_factory, owner, config)
        add_training_file(session_factory, owner, weights)
    else:
        upload_dir(session_factory, file_store, served, owner, peft_adapter, name="their-copy")
    with session_factory() as session:
        removed = delete_version(session, tenant_id=acme, name="support-bot", number=1, force=True, actor_key_id=None)
        assert delete_unreferenced_blobs(session, store=file_store, versions=[removed]) == []
    assert present(file_store, config, weights)


def test_blobs_go_once_the_last_holder_goes(session_factory, file_store, served, make_tenant, peft_adapter):
    acme = make_tenant(session_factory, "acme")
    config, weights = digests(upload_dir(session_factory, file_store, served, acme, peft_adapter))
    with session_factory() as session:
        removed = delete_adapter(session, tenant_id=acme, name="support-bot", force=False)
        assert sorted(delete_unreferenced_blobs(session, store=file_store, versions=removed)) == sorted([config, weights])
    assert not store_has_any(file_store, config, weights)


def store_has_any(store: BlobStore, *sha256s: str) -> bool:
    return any(store.exists(content_key(sha256)) for sha256 in sha256s)


# ------------------------------------------------------------------ two servers, one data dir
def serve_app(model_dir: Path, settings):
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=32), adapter_fetcher_from_settings(settings, store))
    return serve_in_thread(compose_app(settings, engine))


def test_a_second_server_still_serves_another_tenant_s_checkpoint_after_the_delete(
    model_dir, database_url, tmp_path, peft_adapter
):
    data_dir = tmp_path / "shared-data"
    settings = migrated_settings(data_dir, database_url)
    keys = {tenant: make_key(settings, tenant=tenant, role="developer") for tenant in ("acme", "globex")}
    engine = create_db_engine(settings.database_url)
    factory = create_session_factory(engine)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    try:
        with serve_app(model_dir, settings) as first, serve_app(model_dir, settings) as second:
            acme = httpx.Client(base_url=first, headers=bearer(keys["acme"]), timeout=120)
            files = [("files", (name, (peft_adapter / name).read_bytes(), "application/octet-stream"))
                     for name in (CONFIG, WEIGHTS)]
            created = acme.post("/v1/adapters/shared/versions", files=files)
            assert created.status_code == 201, created.text
            sha = {f["filename"]: f["sha256"] for f in created.json()["files"]}
            with factory() as session:
                globex_id = session.query(Tenant.id).filter(Tenant.name == "globex").scalar()
            checkpoint = add_checkpoint(factory, globex_id, config_sha256=sha[CONFIG], weights_sha256=sha[WEIGHTS])
            assert acme.delete("/v1/adapters/shared").status_code == 200
            globex = httpx.Client(base_url=second, headers=bearer(keys["globex"]), timeout=120)
            served = globex.post("/v1/chat/completions", json={"model": checkpoint, **chat})
            assert served.status_code == 200, served.text
            # A blob really missing: the error names the blob, never the server's paths.
            missing = add_checkpoint(factory, globex_id, config_sha256="1" * 64, weights_sha256="2" * 64)
            refused = globex.post("/v1/chat/completions", json={"model": missing, **chat})
            assert refused.status_code == 400, refused.text
            message = refused.json()["error"]["message"]
            assert "1" * 64 in message or "2" * 64 in message
            assert str(data_dir) not in message and str(tmp_path) not in message
    finally:
        engine.dispose()


# Bytes being stored by an operation that has not committed yet (an upload of the same adapter by
# another tenant, a checkpoint, a training file) count too: a deletion between their store and
# their commit took them, leaving the new version pointing at nothing.

def test_a_claimed_blob_survives_a_deletion_and_goes_once_released(
    session_factory, file_store, served, make_tenant, peft_adapter
):
    acme = make_tenant(session_factory, "acme")
    config, weights = digests(upload_dir(session_factory, file_store, served, acme, peft_adapter))
    with session_factory() as claimer:
        claims = claim_blobs(claimer, [config, weights])  # another upload of these bytes, mid-flight
        with session_factory() as session:
            removed = delete_version(session, tenant_id=acme, name="support-bot", number=1, force=True,
                                     actor_key_id=None)
            assert delete_unreferenced_blobs(session, store=file_store, versions=[removed]) == []
        assert present(file_store, config, weights)
        release_claims(claimer, claims)  # the upload failed: nothing will reference them
    with session_factory() as session:
        assert collect_blob(session, file_store, config) and collect_blob(session, file_store, weights)
    assert not store_has_any(file_store, config, weights)


def test_a_claim_left_by_a_killed_process_stops_counting(session_factory, file_store, served, make_tenant,
                                                         peft_adapter):
    acme = make_tenant(session_factory, "acme")
    config, weights = digests(upload_dir(session_factory, file_store, served, acme, peft_adapter))
    with session_factory() as session:
        session.add(BlobClaim(sha256=config, created_at=utcnow() - CLAIM_TTL - timedelta(minutes=1)))
        session.commit()
        removed = delete_version(session, tenant_id=acme, name="support-bot", number=1, force=True, actor_key_id=None)
        assert sorted(delete_unreferenced_blobs(session, store=file_store, versions=[removed])) == sorted([config, weights])


def test_a_checkpoint_s_training_state_counts(session_factory, file_store, served, make_tenant, peft_adapter):
    acme = make_tenant(session_factory, "acme")
    config, weights = digests(upload_dir(session_factory, file_store, served, acme, peft_adapter))
    checkpoint_id = add_checkpoint(session_factory, acme, config_sha256="0" * 64, weights_sha256="1" * 64)
    with session_factory() as session:
        session.get(FineTuningCheckpoint, checkpoint_id).training_state_sha256 = weights
        session.commit()
        removed = delete_version(session, tenant_id=acme, name="support-bot", number=1, force=True, actor_key_id=None)
        assert delete_unreferenced_blobs(session, store=file_store, versions=[removed]) == [config]
    assert present(file_store, weights)


ROUNDS = 8


def test_deleting_a_version_while_another_tenant_pushes_its_bytes_never_loses_them(
    session_factory, file_store, served, make_tenant, peft_adapter
):
    """Real concurrency, repeated: acme deletes its version while globex pushes the same files.
    Whatever the interleaving, every version left standing finds its blobs in storage."""
    acme, globex = make_tenant(session_factory, "acme"), make_tenant(session_factory, "globex")
    for round_number in range(ROUNDS):
        upload_dir(session_factory, file_store, served, acme, peft_adapter, name=f"ours-{round_number}")
        def delete_ours() -> None:
            with session_factory() as session:
                removed = delete_adapter(session, tenant_id=acme, name=f"ours-{round_number}", force=True)
                delete_unreferenced_blobs(session, store=file_store, versions=removed)

        def push_theirs() -> None:
            upload_dir(session_factory, file_store, served, globex, peft_adapter, name=f"theirs-{round_number}")

        outcomes = run_together(delete_ours, push_theirs)
        assert [outcome for outcome in outcomes if isinstance(outcome, Exception)] == []
        with session_factory() as session:
            files = session.scalars(select(AdapterVersionFile)).all()
            missing = [file.sha256 for file in files if not file_store.exists(content_key(file.sha256))]
        assert missing == [], f"round {round_number}: live versions lost blobs {missing}"

