"""Big adapters go straight to S3 (moto's server over HTTP): presigned PUTs, then "complete",
which verifies sizes and hashes and validates before anything is registered."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import httpx
import pytest
from registry_checks import registry_row_counts, stored_objects, upload_target
from safetensors.torch import load_file, save_file

from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.staging import UploadLimits
from loraloom.platform.registry.uploads import (
    PlannedFile,
    UploadedFile,
    complete_presigned_upload,
    request_presigned_uploads,
)

NAMES = ("adapter_config.json", "adapter_model.safetensors")
LIMITS = UploadLimits(max_total_bytes=64 * 1024 * 1024)


def presign(store, served, directory: Path, limits: UploadLimits = LIMITS, names=NAMES):
    files = [PlannedFile(name, (directory / name).stat().st_size) for name in names]
    return request_presigned_uploads(
        store=store, adapter_name="big-bot", files=files, limits=limits, base=served, expires_s=600
    )


def put_all(presigned, directory: Path) -> None:
    for file in presigned:
        response = httpx.put(file.url, content=(directory / file.filename).read_bytes(), headers=file.headers)
        assert response.status_code == 200, response.text


def complete(factory, store, served, tenant, presigned, directory: Path, *, sha256_of=None):
    declared = []
    for file in presigned:
        data = (directory / file.filename).read_bytes()
        digest = (sha256_of or {}).get(file.filename) or hashlib.sha256(data).hexdigest()
        declared.append(UploadedFile(file.filename, file.upload_key, digest, len(data)))
    with factory() as session:
        return complete_presigned_upload(
            session, upload_target(store, served, tenant, "big-bot", limits=LIMITS), declared
        ).version


def test_presigned_upload_registers_a_version(sqlite_session_factory, s3_store, served, make_tenant, peft_adapter):
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, peft_adapter)
    assert sorted(f.filename for f in presigned) == sorted(NAMES)
    put_all(presigned, peft_adapter)
    version = complete(sqlite_session_factory, s3_store, served, tenant, presigned, peft_adapter)
    assert (version.number, version.rank, version.target_modules) == (1, 4, ["q_proj", "v_proj"])
    digests = {f.filename: f.sha256 for f in version.files}
    expected = {name: hashlib.sha256((peft_adapter / name).read_bytes()).hexdigest() for name in NAMES}
    assert digests == expected
    # Only the two content-addressed blobs remain: the staged uploads are gone.
    assert sorted(o.rsplit("/", 1)[-1] for o in stored_objects(s3_store)) == sorted(expected.values())


def test_hash_mismatch_is_refused_leaving_no_row_and_no_blob(
    sqlite_session_factory, s3_store, served, make_tenant, peft_adapter
):
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, peft_adapter)
    put_all(presigned, peft_adapter)
    lie = {"adapter_model.safetensors": "0" * 64}
    with pytest.raises(UploadRejectedError, match="sha256: the uploaded file hashes to .* but 0{64} was declared"):
        complete(sqlite_session_factory, s3_store, served, tenant, presigned, peft_adapter, sha256_of=lie)
    assert registry_row_counts(sqlite_session_factory)["adapter_versions"] == 0
    assert stored_objects(s3_store) == []


def test_file_never_put_is_refused_and_the_other_upload_discarded(
    sqlite_session_factory, s3_store, served, make_tenant, peft_adapter
):
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, peft_adapter)
    put_all([f for f in presigned if f.filename == "adapter_config.json"], peft_adapter)
    with pytest.raises(UploadRejectedError, match="nothing was uploaded"):
        complete(sqlite_session_factory, s3_store, served, tenant, presigned, peft_adapter)
    assert stored_objects(s3_store) == []


def test_invalid_adapter_is_refused_after_verification_leaving_nothing(
    sqlite_session_factory, s3_store, served, make_tenant, peft_adapter, tmp_path
):
    tenant = make_tenant(sqlite_session_factory, "acme")
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "bad"))
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    next(iter(tensors.values()))[0, 0] = float("nan")
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    presigned = presign(s3_store, served, directory)
    put_all(presigned, directory)
    with pytest.raises(UploadRejectedError, match="NaN or Inf"):
        complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
    assert registry_row_counts(sqlite_session_factory)["adapter_versions"] == 0
    assert stored_objects(s3_store) == []


@pytest.mark.parametrize(
    "files, match",
    [
        ([PlannedFile("adapter_config.json", 10)], "expected exactly adapter_config.json and adapter_model.safetensors"),
        ([PlannedFile("adapter_config.json", 10), PlannedFile("adapter.tar.gz", 10)], "expected exactly"),
        ([PlannedFile("adapter_config.json", 10), PlannedFile("adapter_model.safetensors", 10),
          PlannedFile("README.md", 10)], "chat_template.jinja or tokenizer_config.json"),
        ([PlannedFile("adapter_config.json", 10), PlannedFile("adapter_model.safetensors", 10),
          PlannedFile("adapter_config.json", 10)], "each once"),
        ([PlannedFile("adapter_config.json", 10), PlannedFile("adapter_model.safetensors", 10**9)], "exceed this server's limit"),
    ],
)
def test_bad_upload_plans_are_refused_before_any_url(s3_store, served, files, match):
    with pytest.raises(UploadRejectedError, match=match):
        request_presigned_uploads(
            store=s3_store, adapter_name="big-bot", files=files, limits=LIMITS, base=served, expires_s=600
        )


def test_file_storage_offers_no_presigned_uploads(file_store, served, peft_adapter):
    with pytest.raises(UploadRejectedError, match="does not take presigned uploads.*POST /v1/adapters/big-bot/versions"):
        presign(file_store, served, peft_adapter)


@pytest.mark.parametrize(("template", "refused"), [("{{ messages[0].content }}", False), ("{{ messages[0].content }", True)])
def test_a_chat_template_comes_along_checked(sqlite_session_factory, s3_store, served, make_tenant, peft_adapter,
                                             tmp_path, template, refused):
    """chat_template.jinja is a third presigned file: kept when it renders, refused (nothing kept) when not."""
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    (directory / "chat_template.jinja").write_text(template)
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, directory, names=(*NAMES, "chat_template.jinja"))
    put_all(presigned, directory)
    if not refused:
        version = complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
        assert "chat_template.jinja" in [f.filename for f in version.files]
        return
    with pytest.raises(UploadRejectedError, match="chat_template: line 1") as refusal:
        complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
    assert refusal.value.param == "chat_template"
    assert registry_row_counts(sqlite_session_factory)["adapter_versions"] == 0 and stored_objects(s3_store) == []


@pytest.mark.parametrize(("template", "refused"), [("{{ messages[0].content }}", False), ("{{ messages[0].content }", True)])
def test_a_tokenizer_config_brings_its_template_as_a_direct_upload_does(
    sqlite_session_factory, s3_store, served, make_tenant, peft_adapter, tmp_path, template, refused
):
    """tokenizer_config.json may be presigned too: its chat_template is checked and kept as chat_template.jinja,
    and the config itself is not kept (no file of the version, no blob)."""
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, directory, names=(*NAMES, "tokenizer_config.json"))
    put_all(presigned, directory)
    if refused:
        with pytest.raises(UploadRejectedError, match="chat_template: line 1") as refusal:
            complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
        assert refusal.value.param == "chat_template"
        assert registry_row_counts(sqlite_session_factory)["adapter_versions"] == 0 and stored_objects(s3_store) == []
        return
    version = complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
    digests = {f.filename: f.sha256 for f in version.files}
    assert sorted(digests) == sorted((*NAMES, "chat_template.jinja"))
    assert digests["chat_template.jinja"] == hashlib.sha256(template.encode()).hexdigest()
    assert sorted(o.rsplit("/", 1)[-1] for o in stored_objects(s3_store)) == sorted(digests.values())


def test_chat_template_jinja_wins_over_a_tokenizer_config(
    sqlite_session_factory, s3_store, served, make_tenant, peft_adapter, tmp_path
):
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    (directory / "chat_template.jinja").write_text("{{ messages[0].content }}")
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'the other one' }}"}))
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, directory, names=(*NAMES, "chat_template.jinja", "tokenizer_config.json"))
    put_all(presigned, directory)
    version = complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
    template = next(f for f in version.files if f.filename == "chat_template.jinja")
    assert template.sha256 == hashlib.sha256(b"{{ messages[0].content }}").hexdigest()
    assert len(version.files) == 3 and len(stored_objects(s3_store)) == 3


@pytest.mark.parametrize("parser", ["hermes", "xml"])
def test_the_tool_parser_the_config_names_is_checked_and_kept(
    sqlite_session_factory, s3_store, served, make_tenant, peft_adapter, tmp_path, parser
):
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    config = json.loads((directory / "adapter_config.json").read_text())
    (directory / "adapter_config.json").write_text(json.dumps({**config, "tool_parser": parser}))
    tenant = make_tenant(sqlite_session_factory, "acme")
    presigned = presign(s3_store, served, directory)
    put_all(presigned, directory)
    if parser == "hermes":
        assert complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory).tool_parser == "hermes"
        return
    with pytest.raises(UploadRejectedError, match="'xml', which is not one of auto, smollm2, hermes") as refusal:
        complete(sqlite_session_factory, s3_store, served, tenant, presigned, directory)
    assert refusal.value.param == "tool_parser"
    assert registry_row_counts(sqlite_session_factory)["adapter_versions"] == 0 and stored_objects(s3_store) == []
