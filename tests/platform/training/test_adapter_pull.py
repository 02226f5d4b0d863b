"""Issue 13, item 1: a customer gets an adapter version back, uploaded or trained.

Live servers (training_live.training_server) on the tiny base, with file:// storage and with
S3 (moto's server over HTTP, where the weights come from a presigned URL). An adapter pushed
through the API comes back, through the API and through `loraloom adapters pull`, with its
weights byte-identical and a config naming the served base; another tenant's version and an
unknown one answer 404. A fine-tuning job lists its version in result_files; pulled, it loads
in peft on the Hugging Face base and decodes greedily exactly what the server decodes.

These live in tests/platform/training to reuse its live server and tiny base.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lora_factory import make_peft_adapter
from product_codes import product_dataset
from training_live import MAX_LORA_RANK, TrainingServer, job, training_server, training_settings, upload

from loraloom.engine import Tokenizer
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.runner import WorkerContext, run_job

NAMES = ("adapter_config.json", "adapter_model.safetensors")
LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script
# One quick epoch of the product dataset on the tiny base: 15 steps, at a learning rate high enough
# that the adapter changes the tiny base's greedy answer.
HYPERPARAMETERS = Hyperparameters(n_epochs=1, batch_size=2, learning_rate=1e-2, lora_r=4, lora_alpha=8,
                                  lora_dropout=0.0, max_seq_len=64, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def adapter(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEFT adapter for the tiny base; its config names the base by this machine's absolute path."""
    return make_peft_adapter(tiny_base, tmp_path_factory.mktemp("made") / "adapter", rank=4, alpha=8,
                             target_modules=["q_proj", "v_proj"], seed=5)


@pytest.fixture(scope="module")
def local_server(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingServer]:
    with training_server(tiny_base, training_settings(tmp_path_factory.mktemp("local"))) as live:
        yield live


@pytest.fixture(scope="module")
def s3_live_server(tiny_base: Path, s3_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingServer]:
    settings = training_settings(
        tmp_path_factory.mktemp("s3"), storage_url=f"s3://{s3_server.bucket}/pull-{uuid.uuid4().hex}",
        s3_endpoint_url=s3_server.endpoint_url, s3_region=s3_server.region,
    )
    with training_server(tiny_base, settings) as live:
        yield live


@pytest.fixture(params=["local", "s3"])
def server(request: pytest.FixtureRequest) -> TrainingServer:
    return request.getfixturevalue("local_server" if request.param == "local" else "s3_live_server")


def push(server: TrainingServer, name: str, directory: Path) -> dict:
    files = [("files", (n, (directory / n).read_bytes(), "application/octet-stream")) for n in NAMES]
    with server.http() as client:
        response = client.post(f"/v1/adapters/{name}/versions", files=files)
    assert response.status_code == 201, response.text
    return response.json()


def pull(server: TrainingServer, key: str, *args: str) -> subprocess.CompletedProcess:
    """`loraloom adapters pull ...` against the server, as a user runs it."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    env |= {"LORALOOM_BASE_URL": server.url, "LORALOOM_API_KEY": server.keys[key]}
    return subprocess.run([str(LORALOOM), "adapters", "pull", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def extract(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert all(member.isfile() for member in tar.getmembers())
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


def assert_same_adapter(files: dict[str, bytes], original: Path, served_base: str) -> None:
    """Weights byte-identical; the config the original's, but naming the served base."""
    assert sorted(files) == sorted(NAMES)
    assert files["adapter_model.safetensors"] == (original / "adapter_model.safetensors").read_bytes()
    config = json.loads(files["adapter_config.json"])
    expected = json.loads((original / "adapter_config.json").read_text())
    assert expected["base_model_name_or_path"] != served_base  # else the rewrite is not tested
    assert config == {**expected, "base_model_name_or_path": served_base}


def test_a_pushed_version_comes_back_through_the_api_and_the_cli(server, adapter, tmp_path):
    name = f"bot-{uuid.uuid4().hex[:6]}"
    pushed = push(server, name, adapter)
    with server.http() as client:
        assert client.put(f"/v1/adapters/{name}/aliases/prod", json={"version": 1}).status_code == 200

        archive = client.get(f"/v1/adapters/{name}/versions/1/content")
        assert archive.status_code == 200, archive.text
        assert archive.headers["content-type"] == "application/gzip"
        assert archive.headers["content-disposition"] == f'attachment; filename="{name}@1.tar.gz"'
        assert_same_adapter(extract(archive.content), adapter, server.model_name)

        download = client.get(f"/v1/adapters/{name}/versions/1/download").json()
        assert (download["object"], download["adapter"], download["version"]) == ("adapter.version.download", name, 1)
        listed = {file["filename"]: file for file in download["files"]}
        stored = {file["filename"]: file for file in pushed["files"]}
        weights, config = listed["adapter_model.safetensors"], listed["adapter_config.json"]
        assert (weights["sha256"], weights["size_bytes"]) == (stored["adapter_model.safetensors"]["sha256"],
                                                              stored["adapter_model.safetensors"]["size_bytes"])
        # The config is rewritten for the download: a new digest, and always served by the API.
        assert config["sha256"] != stored["adapter_config.json"]["sha256"]
        assert config["url"] == f"/v1/adapters/{name}/versions/1/files/adapter_config.json"
        assert config["expires_at"] is None
        fetched = {"adapter_config.json": client.get(config["url"]).content}
    if server.settings.storage_url.startswith("s3://"):
        # Presigned: straight to the bucket, with no API key at all.
        assert weights["url"].startswith(server.settings.s3_endpoint_url) and weights["expires_at"] is not None
        fetched["adapter_model.safetensors"] = httpx.get(weights["url"], timeout=60).content
    else:
        assert weights["url"] == f"/v1/adapters/{name}/versions/1/files/adapter_model.safetensors"
        assert weights["expires_at"] is None
        with server.http() as client:
            fetched["adapter_model.safetensors"] = client.get(weights["url"]).content
    assert_same_adapter(fetched, adapter, server.model_name)

    pulled = pull(server, "acme-developer", f"{name}:prod", str(tmp_path / "pulled"))
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout == f"{name}@1\n"
    assert_same_adapter({n: (tmp_path / "pulled" / n).read_bytes() for n in NAMES}, adapter, server.model_name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pulled"]  # no staging folder left beside it


def test_another_tenant_and_an_unknown_version_get_404(local_server, adapter, tmp_path):
    name = f"bot-{uuid.uuid4().hex[:6]}"
    push(local_server, name, adapter)
    routes = ("content", "download", "files/adapter_model.safetensors")
    with local_server.http("globex-developer") as globex, local_server.http() as acme:
        for route in routes:
            other = globex.get(f"/v1/adapters/{name}/versions/1/{route}")
            nowhere = acme.get(f"/v1/adapters/{name}-x/versions/1/{route}")
            assert other.status_code == nowhere.status_code == 404
            # Exactly a missing adapter's answer: nothing tells that the name exists elsewhere.
            assert other.json() == json.loads(nowhere.text.replace(f"{name}-x", name))

            unknown = acme.get(f"/v1/adapters/{name}/versions/99/{route}")
            assert unknown.status_code == 404
            error = unknown.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")
            assert "no version 99" in error["message"]

        # Weights leave the server only for a developer or admin key.
        with local_server.http("acme-inference") as inference:
            assert inference.get(f"/v1/adapters/{name}/versions/1/content").status_code == 403
        bad_file = acme.get(f"/v1/adapters/{name}/versions/1/files/model.bin")
        assert bad_file.status_code == 400 and bad_file.json()["error"]["param"] == "filename"

    unknown = pull(local_server, "acme-developer", f"{name}@99", str(tmp_path / "nothing"))
    assert unknown.returncode == 1 and "404" in unknown.stderr and "no version 99" in unknown.stderr
    assert not (tmp_path / "nothing").exists()
    other = pull(local_server, "globex-developer", name, str(tmp_path / "nothing"))
    assert other.returncode == 1 and "404" in other.stderr and not (tmp_path / "nothing").exists()
    malformed = pull(local_server, "acme-developer", f"{name}@x", str(tmp_path / "nothing"))
    assert malformed.returncode == 1 and "NAME:" in malformed.stderr and "NAME@N" in malformed.stderr


def test_pull_refuses_a_non_empty_folder_unless_forced(local_server, adapter, tmp_path):
    name = f"bot-{uuid.uuid4().hex[:6]}"
    push(local_server, name, adapter)
    target = tmp_path / "existing"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    refused = pull(local_server, "acme-developer", name, str(target))
    assert refused.returncode == 1
    assert "DIR:" in refused.stderr and "not empty" in refused.stderr and "--force" in refused.stderr
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]

    forced = pull(local_server, "acme-developer", name, str(target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in target.iterdir()) == sorted(NAMES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]

    empty = tmp_path / "empty"
    empty.mkdir()
    assert pull(local_server, "acme-developer", f"{name}@1", str(empty)).returncode == 0
    assert sorted(p.name for p in empty.iterdir()) == sorted(NAMES)


def test_a_trained_adapter_is_in_result_files_and_pulls_into_peft(local_server, tiny_base, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer.from_dir(tiny_base)
    with local_server.http() as client:
        dataset = upload(client, product_dataset())
        created = client.post("/v1/fine_tuning/jobs", json={
            "model": local_server.model_name, "training_file": dataset["id"], "suffix": "trained", "seed": 1,
            "hyperparameters": HYPERPARAMETERS.model_dump(),
        })
        assert created.status_code == 200, created.text
        assert created.json()["result_files"] == []
        job_id = created.json()["id"]
    # The worker's task body, in this process: no broker round trip is needed to run one job.
    run_job(job_id, WorkerContext(settings=local_server.settings, model_dir=tiny_base, max_lora_rank=MAX_LORA_RANK,
                                  worker_id="pull-worker", send=lambda _: None))
    with local_server.http() as client:
        finished = job(client, job_id)
        assert finished["status"] == "succeeded", finished
        assert finished["result_files"] == [finished["fine_tuned_model"]] == ["trained@1"]

        prompt = tokenizer.encode("What is product QX-123 called?", add_special_tokens=False)
        served = client.post("/v1/completions", json={
            "model": finished["result_files"][0], "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True,
        })
        assert served.status_code == 200, served.text
    served_text = served.json()["choices"][0]["text"]

    pulled = pull(local_server, "acme-developer", finished["result_files"][0], str(tmp_path / "trained"))
    assert pulled.returncode == 0, pulled.stderr
    config = json.loads((tmp_path / "trained" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == local_server.model_name == tiny_base.name  # not the worker's path

    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, tmp_path / "trained").eval()
    assert tokenizer.decode(greedy(model, prompt)) == served_text
    with model.disable_adapter():  # the check can fail: without the trained weights the answer differs
        assert tokenizer.decode(greedy(model, prompt)) != served_text


def greedy(model, prompt: list[int], steps: int = 8) -> list[int]:
    """Greedy decoding past end-of-sequence, as the server's ignore_eos."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_the_download_routes_are_documented(local_server):
    document = httpx.get(f"{local_server.url}/openapi.json", timeout=60).json()
    prefix = "/v1/adapters/{name}/versions/{number}"
    binary = {"type": "string", "format": "binary"}
    content = document["paths"][f"{prefix}/content"]["get"]["responses"]
    assert content["200"]["content"] == {"application/gzip": {"schema": binary}}
    assert content["404"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    one_file = document["paths"][f"{prefix}/files/{{filename}}"]["get"]
    assert one_file["responses"]["200"]["content"] == {"application/octet-stream": {"schema": binary}}
    filename = next(p for p in one_file["parameters"] if p["name"] == "filename")
    assert filename["schema"]["enum"] == [*NAMES, "chat_template.jinja"]
    download = document["paths"][f"{prefix}/download"]["get"]["responses"]["200"]["content"]["application/json"]
    assert download["schema"] == {"$ref": "#/components/schemas/DownloadObject"}
    fields = document["components"]["schemas"]["DownloadFileObject"]["properties"]
    assert set(fields) == {"filename", "size_bytes", "sha256", "url", "expires_at"}
