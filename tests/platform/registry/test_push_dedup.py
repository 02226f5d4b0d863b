"""A push of content the adapter already holds returns that version and creates nothing (no row,
no alias move, no blob), on SQLite and PostgreSQL; different content, or the same content under
another adapter name, is a new version."""
from __future__ import annotations

import shutil

from registry_checks import parts_of, upload_parts, registry_row_counts, stored_objects

from loraloom.engine.lora.weights import ADAPTER_CONFIG_FILE


def test_same_files_again_return_the_existing_version_and_write_nothing(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter
):
    tenant = make_tenant(session_factory, "acme")
    first = upload_parts(session_factory, file_store, served, tenant, parts_of(peft_adapter))
    second = upload_parts(session_factory, file_store, served, tenant, parts_of(other_peft_adapter))
    assert (first.deduplicated, second.deduplicated) == (False, False)
    rows, blobs = registry_row_counts(session_factory), stored_objects(file_store)

    again = upload_parts(session_factory, file_store, served, tenant, parts_of(peft_adapter))
    assert again.deduplicated and again.version.id == first.version.id and again.version.number == 1
    assert registry_row_counts(session_factory) == rows  # no version, file, alias or alias history row
    assert stored_objects(file_store) == blobs  # no blob, nothing half-written left
    latest = upload_parts(session_factory, file_store, served, tenant, parts_of(other_peft_adapter))
    assert latest.deduplicated and latest.version.number == 2  # `latest` still names version 2


def test_different_config_or_another_adapter_name_is_a_new_version(
    session_factory, file_store, served, make_tenant, peft_adapter, tmp_path
):
    tenant = make_tenant(session_factory, "acme")
    upload_parts(session_factory, file_store, served, tenant, parts_of(peft_adapter))
    # The same weights with another alpha scale differently: other content.
    rescaled = shutil.copytree(peft_adapter, tmp_path / "rescaled")
    config = (rescaled / ADAPTER_CONFIG_FILE).read_text()
    (rescaled / ADAPTER_CONFIG_FILE).write_text(config.replace('"lora_alpha": 8', '"lora_alpha": 4'))
    assert (rescaled / ADAPTER_CONFIG_FILE).read_text() != config
    changed = upload_parts(session_factory, file_store, served, tenant, parts_of(rescaled))
    assert not changed.deduplicated and changed.version.number == 2
    twin = upload_parts(session_factory, file_store, served, tenant, parts_of(peft_adapter), name="twin")
    assert not twin.deduplicated and twin.version.number == 1  # versions are per adapter
    theirs = upload_parts(session_factory, file_store, served, make_tenant(session_factory, "globex"),
                           parts_of(peft_adapter))
    assert not theirs.deduplicated  # another tenant's push never finds acme's version
