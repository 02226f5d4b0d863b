"""What the registry tests look at behind the services' backs: rows and stored objects."""
from __future__ import annotations

import io
import uuid
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine.lora_weights import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.db.models import Adapter, AdapterVersion, AdapterVersionFile, Alias, AliasHistory
from loraloom.platform.registry.staging import UploadedPart, UploadLimits
from loraloom.platform.registry.uploads import upload_version
from loraloom.platform.registry.validation import ServedBase
from loraloom.platform.storage import BlobStore, LocalBlobStore


def stored_objects(store: BlobStore) -> list[str]:
    """Every blob and staged upload the store holds (what a refused upload must not leave behind)."""
    if isinstance(store, LocalBlobStore):
        return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file())
    listing = store._client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + "/")
    return sorted(obj["Key"] for obj in listing.get("Contents", []))


def overwrite_blob(store: BlobStore, key: str, data: bytes) -> None:
    """Corrupt a stored blob behind the store's back."""
    if isinstance(store, LocalBlobStore):
        (store.root / key).write_bytes(data)
    else:
        store._client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=data)


def registry_row_counts(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model))
            for model in (Adapter, AdapterVersion, AdapterVersionFile, Alias, AliasHistory)
        }


def parts_of(directory: Path, names: tuple[str, ...] = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)) -> list[UploadedPart]:
    return [UploadedPart(name, io.BytesIO((directory / name).read_bytes())) for name in names]


def upload_parts(
    factory: sessionmaker[Session],
    store: BlobStore,
    served: ServedBase,
    tenant_id: uuid.UUID,
    parts: list[UploadedPart],
    *,
    name: str = "support-bot",
    allow_base_mismatch: bool = False,
) -> AdapterVersion:
    with factory() as session:
        return upload_version(
            session,
            store=store,
            tenant_id=tenant_id,
            adapter_name=name,
            parts=parts,
            limits=UploadLimits(max_total_bytes=64 * 1024 * 1024, max_archive_members=8),
            base=served,
            allow_base_mismatch=allow_base_mismatch,
            actor_key_id=None,
        )


def upload_dir(
    factory: sessionmaker[Session],
    store: BlobStore,
    served: ServedBase,
    tenant_id: uuid.UUID,
    directory: Path,
    *,
    name: str = "support-bot",
) -> AdapterVersion:
    return upload_parts(factory, store, served, tenant_id, parts_of(directory), name=name)
