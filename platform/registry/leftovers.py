"""At a server's start: remove the upload leftovers of processes killed mid-upload (kill -9 runs
no cleanup), which would otherwise fill the data disk across restarts: staging folders, partial
blob writes, and partial adapter downloads of the engine's cache. Only those older than
settings.stale_file_grace_s go, since another live server may share the data dir."""
from __future__ import annotations

from loraloom.platform.registry.fetch import PARTIAL_PREFIX
from loraloom.platform.registry.uploads import UPLOAD_DIR_PREFIX
from loraloom.platform.settings import Settings
from loraloom.platform.storage import BlobStore
from loraloom.platform.storage.leftovers import remove_stale_entries


def remove_upload_leftovers(settings: Settings, store: BlobStore) -> None:
    grace_s = settings.stale_file_grace_s
    remove_stale_entries(settings.staging_dir, f"{UPLOAD_DIR_PREFIX}*", grace_s=grace_s)
    remove_stale_entries(settings.adapter_cache_dir, f"{PARTIAL_PREFIX}*", grace_s=grace_s)
    store.remove_stale_writes(grace_s=grace_s)
