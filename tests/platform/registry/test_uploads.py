"""Uploads through the services: a real PEFT adapter registered as plain files, .tar.gz and .zip;
every validation failure refused with a message naming the problem, leaving no row and no blob."""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest
import torch
from registry_checks import parts_of, registry_row_counts, stored_objects, upload_parts
from safetensors.torch import load_file, save_file
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from loraloom.platform.db.models import Adapter, AdapterVersion, AdapterVersionSource, AdapterVersionStatus, Alias
from loraloom.platform.registry.errors import RegistryConflictError, UploadRejectedError
from loraloom.platform.registry.staging import UploadedPart
from loraloom.platform.registry.validation import ServedBase, base_model_warning
from loraloom.platform.storage import content_key

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
V_B = "base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight"


def archive_of(directory: Path, kind: str) -> list[UploadedPart]:
    buffer = io.BytesIO()
    if kind == "tar.gz":
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            archive.add(directory, arcname="my-adapter")  # the folder, README.md included, as `tar czf` makes it
    else:
        with zipfile.ZipFile(buffer, "w") as archive:
            for path in directory.iterdir():
                archive.write(path, arcname=path.name)
    buffer.seek(0)
    return [UploadedPart(f"adapter.{kind}", buffer)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("form", ["files", "tar.gz", "zip"])
def test_real_peft_adapter_is_registered_as_version_1(
    sqlite_session_factory, store, served, peft_adapter, make_tenant, form
):
    tenant = make_tenant(sqlite_session_factory, "acme")
    parts = parts_of(peft_adapter) if form == "files" else archive_of(peft_adapter, form)
    version = upload_parts(sqlite_session_factory, store, served, tenant, parts).version

    assert (version.number, version.status, version.source) == (1, AdapterVersionStatus.ready, AdapterVersionSource.upload)
    assert (version.rank, version.alpha, version.dtype) == (4, 8.0, "float32")
    assert version.target_modules == ["q_proj", "v_proj"]
    assert version.base_model == served.name
    files = {f.filename: (f.sha256, f.size_bytes) for f in version.files}
    for name in (CONFIG, WEIGHTS):
        path = peft_adapter / name
        assert files[name] == (sha256(path), path.stat().st_size)
        with store.open(content_key(files[name][0])) as blob:
            assert blob.read() == path.read_bytes()
    with sqlite_session_factory() as session:
        latest = session.scalar(select(Alias).where(Alias.name == "latest"))
        assert latest.version_id == version.id
    assert len([o for o in stored_objects(store) if "/sha256/" in f"/{o}"]) == 2  # no README, no staging leftovers
    assert all("/sha256/" in f"/{o}" for o in stored_objects(store))


# ---------------------------------------------------------------- validation failures
def rewrite_tensors(directory: Path, change) -> None:
    tensors = load_file(str(directory / WEIGHTS))
    change(tensors)
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})


def rewrite_config(directory: Path, change) -> None:
    config = json.loads((directory / CONFIG).read_text())
    change(config)
    (directory / CONFIG).write_text(json.dumps(config))


def set_nan(tensors):
    tensors[Q_A][0, 0] = float("nan")


def set_inf(tensors):
    tensors[V_B][1, 1] = float("inf")


def broken_header(directory: Path) -> None:
    data = (directory / WEIGHTS).read_bytes()
    (directory / WEIGHTS).write_bytes((10**9).to_bytes(8, "little") + data[8:])  # header length past the end


def pickled_weights(directory: Path) -> None:
    (directory / WEIGHTS).write_bytes(pickle.dumps({Q_A: torch.zeros(4, 576)}))


def real_pickle_checkpoint(directory: Path) -> None:
    (directory / WEIGHTS).rename(directory / "adapter_model.bin")


FAILURES = {
    "pickle checkpoint (.bin)": (real_pickle_checkpoint, "adapter_model.bin.*pickle"),
    "pickle renamed to .safetensors": (pickled_weights, "not a valid safetensors file"),
    "header length past the end": (broken_header, "not a valid safetensors file"),
    "config not JSON": (lambda d: (d / CONFIG).write_text("{r: 4"), "adapter_config.json is not valid JSON"),
    "unsupported module": (
        lambda d: rewrite_tensors(d, lambda t: t.update({Q_A.replace("q_proj", "rotary_emb"): t[Q_A].clone()})),
        "not a LoRA weight of a supported module",
    ),
    "hidden size mismatch": (
        lambda d: rewrite_tensors(d, lambda t: t.update({Q_A: torch.zeros(4, 512)})),
        r"lora_A has shape \[4, 512\], expected \[4, 576\]",
    ),
    "kv heads mismatch": (
        lambda d: rewrite_tensors(d, lambda t: t.update({V_B: torch.zeros(576, 4)})),
        r"lora_B has shape \[576, 4\], expected \[192, 4\]",
    ),
    "intermediate size mismatch": (
        lambda d: rewrite_tensors(d, lambda t: t.update({
            "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(4, 576),
            "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": torch.zeros(2048, 4),
        })),
        r"up_proj lora_B has shape \[2048, 4\], expected \[1536, 4\]",
    ),
    "more layers than the base": (
        lambda d: rewrite_tensors(d, lambda t: t.update({
            Q_A.replace("layers.0.", "layers.30."): t[Q_A].clone(),
            Q_A.replace("layers.0.", "layers.30.").replace("lora_A", "lora_B"): torch.zeros(576, 4),
        })),
        "layer 30 but the base model has only 30 layers",
    ),
    "int8 dtype": (
        lambda d: rewrite_tensors(d, lambda t: t.update({Q_A: t[Q_A].to(torch.int8)})),
        "has dtype I8; expected one of F16, BF16, F32",
    ),
    "NaN": (lambda d: rewrite_tensors(d, set_nan), "contains NaN or Inf"),
    "Inf": (lambda d: rewrite_tensors(d, set_inf), "contains NaN or Inf"),
    "modules_to_save": (
        lambda d: rewrite_config(d, lambda c: c.update(modules_to_save=["lm_head"])),
        r"modules_to_save \['lm_head'\] is not supported",
    ),
    "lm_head weights": (
        lambda d: rewrite_tensors(d, lambda t: t.update({"base_model.model.lm_head.lora_A.weight": t[Q_A].clone()})),
        "holds embed_tokens/lm_head weights",
    ),
    "embedding weights": (
        lambda d: rewrite_tensors(
            d, lambda t: t.update({"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 49152)})
        ),
        "holds embed_tokens/lm_head weights",
    ),
    "weights the config does not select": (
        lambda d: rewrite_config(d, lambda c: c.update(target_modules=["q_proj"])),
        r"holds weights for 30 modules that adapter_config.json does not select \(target_modules \['q_proj'\]\): "
        r"model\.layers\.0\.self_attn\.v_proj, ",
    ),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_invalid_adapter_is_refused_leaving_no_row_and_no_blob(
    sqlite_session_factory, file_store, served, peft_adapter, make_tenant, tmp_path, case
):
    tenant = make_tenant(sqlite_session_factory, "acme")
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    corrupt, message = FAILURES[case]
    corrupt(directory)
    names = tuple(sorted(p.name for p in directory.iterdir()))
    before = registry_row_counts(sqlite_session_factory)
    with pytest.raises(UploadRejectedError, match=message):
        upload_parts(sqlite_session_factory, file_store, served, tenant, parts_of(directory, names))
    assert registry_row_counts(sqlite_session_factory) == before
    assert stored_objects(file_store) == []


def test_rank_above_the_server_max_is_refused(sqlite_session_factory, file_store, served, peft_adapter, make_tenant):
    tenant = make_tenant(sqlite_session_factory, "acme")
    small = ServedBase(name=served.name, config=served.config, max_lora_rank=2)
    with pytest.raises(UploadRejectedError, match="rank 4, above the server's max LoRA rank 2"):
        upload_parts(sqlite_session_factory, file_store, small, tenant, parts_of(peft_adapter))
    assert registry_row_counts(sqlite_session_factory)["adapter_versions"] == 0
    assert stored_objects(file_store) == []


def test_another_declared_base_is_recorded_not_refused(
    sqlite_session_factory, file_store, served, peft_adapter, make_tenant, tmp_path
):
    """Modules and shapes decide; the declared name (PEFT writes the path it loaded the base from) is kept."""
    tenant = make_tenant(sqlite_session_factory, "acme")
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    rewrite_config(directory, lambda c: c.update(base_model_name_or_path="meta-llama/Llama-3.1-8B"))
    version = upload_parts(sqlite_session_factory, file_store, served, tenant, parts_of(directory)).version
    assert (version.number, version.base_model) == (1, served.name)
    assert version.declared_base_model == "meta-llama/Llama-3.1-8B"
    assert "names base model 'meta-llama/Llama-3.1-8B', not the served 'SmolLM2-135M-Instruct'" in \
        base_model_warning(version.declared_base_model, version.base_model)


def test_hub_id_of_the_served_base_matches(sqlite_session_factory, file_store, served, peft_adapter, make_tenant, tmp_path):
    tenant = make_tenant(sqlite_session_factory, "acme")
    directory = Path(shutil.copytree(peft_adapter, tmp_path / "adapter"))
    rewrite_config(directory, lambda c: c.update(base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert upload_parts(sqlite_session_factory, file_store, served, tenant, parts_of(directory)).version.number == 1


@pytest.mark.parametrize("name", ["base", "SmolLM2-135M-Instruct", "bad:name", "bad@3", "a/b", ""])
def test_reserved_or_malformed_adapter_names_are_refused(
    sqlite_session_factory, file_store, served, peft_adapter, make_tenant, name
):
    tenant = make_tenant(sqlite_session_factory, "acme")
    with pytest.raises(ValueError, match="^name: "):
        upload_parts(sqlite_session_factory, file_store, served, tenant, parts_of(peft_adapter), name=name)
    assert stored_objects(file_store) == []


def test_failure_after_blobs_are_stored_takes_them_back(
    session_factory, store, served, peft_adapter, make_tenant, tmp_path
):
    """The database refuses the version (its tenant does not exist): the blob this upload added is
    deleted again, while the blob it shares with an existing version stays."""
    tenant = make_tenant(session_factory, "acme")
    upload_parts(session_factory, store, served, tenant, parts_of(peft_adapter))
    kept = stored_objects(store)
    same_weights = Path(shutil.copytree(peft_adapter, tmp_path / "same-weights"))
    rewrite_config(same_weights, lambda c: c.update(lora_alpha=16))  # a new config blob, a shared weights blob
    with pytest.raises(IntegrityError):
        upload_parts(session_factory, store, served, uuid.uuid4(), parts_of(same_weights))
    assert stored_objects(store) == kept
    with session_factory() as session:
        assert list(session.scalars(select(AdapterVersion.number))) == [1]


def test_adapter_names_are_unique_regardless_of_case(session_factory, file_store, served, peft_adapter, make_tenant):
    """On SQLite and PostgreSQL (session_factory runs both)."""
    factory = session_factory
    acme, globex = make_tenant(factory, "acme"), make_tenant(factory, "globex")
    upload_parts(factory, file_store, served, acme, parts_of(peft_adapter), name="support")
    with pytest.raises(RegistryConflictError, match="the adapter 'support' exists, and adapter names are unique "
                                                    "regardless of case; push to 'support'"):
        upload_parts(factory, file_store, served, acme, parts_of(peft_adapter), name="Support")
    # Another tenant's names are its own.
    assert upload_parts(factory, file_store, served, globex, parts_of(peft_adapter), name="Support").version.number == 1
    with factory() as session, pytest.raises(IntegrityError):  # the database holds the rule too
        session.add(Adapter(tenant_id=acme, name="SUPPORT"))
        session.commit()
