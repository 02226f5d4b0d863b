"""What the registry tests look at behind the services' backs: rows and stored objects."""
from __future__ import annotations

import io
import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine.lora.weights import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.db.models import Adapter, AdapterVersion, AdapterVersionFile, Alias, AliasHistory
from loraloom.platform.registry.publish import Published
from loraloom.platform.registry.staging import UploadedPart, UploadLimits
from loraloom.platform.registry.uploads import UploadTarget, upload_version
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
) -> Published:
    """Register the parts as a version of `name` (or get the version holding them already: deduplicated)."""
    with factory() as session:
        return upload_version(session, upload_target(store, served, tenant_id, name), parts)


def upload_target(
    store: BlobStore, served: ServedBase, tenant_id: uuid.UUID, name: str, *, limits: UploadLimits | None = None
) -> UploadTarget:
    """A push of `name` by tenant `tenant_id` (no key), staged in the system's temp folder."""
    return UploadTarget(
        store=store,
        staging_dir=Path(tempfile.gettempdir()),  # the server stages under its data dir; any folder will do here
        limits=limits or UploadLimits(max_total_bytes=64 * 1024 * 1024, max_archive_members=8),
        base=served,
        tenant_id=tenant_id,
        adapter_name=name,
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
    return upload_parts(factory, store, served, tenant_id, parts_of(directory), name=name).version


def run_together(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls on threads released at once; each returns its result or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except Exception as error:  # noqa: BLE001 - the outcome is what the test compares
            results[index] = error

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def with_alpha(directory: Path, into: Path, alpha: int) -> Path:
    """A copy of the adapter under another lora_alpha: a distinct version (pushing the same files
    twice returns the first version) that shares its weights blob with the original."""
    copy = Path(shutil.copytree(directory, into / f"{directory.name}-alpha-{alpha}"))
    config = json.loads((copy / ADAPTER_CONFIG_FILE).read_text())
    config["lora_alpha"] = alpha
    (copy / ADAPTER_CONFIG_FILE).write_text(json.dumps(config))
    return copy
