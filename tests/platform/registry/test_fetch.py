"""The engine's fetcher for registry versions: object storage -> local content-addressed
directory -> host cache, every byte checked against the registered sha256."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from registry_checks import overwrite_blob, upload_dir

from loraloom.engine.lora.host_cache import HostAdapterCache
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.weights import AdapterLoadError, load_adapter_weights
from loraloom.platform.registry.fetch import StorageAdapterFetcher
from loraloom.platform.registry.resolution import ResolvedVersion
from loraloom.platform.storage import LocalBlobStore, content_key

BIG = 1 << 30


def handle_of(version, store) -> AdapterHandle:
    return ResolvedVersion.of(version, version.adapter).handle(store)


@pytest.fixture
def registered(sqlite_session_factory, store, served, make_tenant, peft_adapter, other_peft_adapter):
    tenant = make_tenant(sqlite_session_factory, "acme")
    handles = []
    for directory in (peft_adapter, other_peft_adapter):
        version = upload_dir(sqlite_session_factory, store, served, tenant, directory)
        with sqlite_session_factory() as session:
            session.add(version)
            handles.append(handle_of(version, store))
    return handles


def host_cache(served, fetcher) -> HostAdapterCache:
    return HostAdapterCache(capacity=4, model_config=served.config, max_rank=served.max_lora_rank, fetch=fetcher)


def assert_same_weights(actual, expected) -> None:
    assert actual.modules.keys() == expected.modules.keys()
    for key, module in expected.modules.items():
        torch.testing.assert_close(actual.modules[key].lora_a, module.lora_a, rtol=0, atol=0)
        torch.testing.assert_close(actual.modules[key].lora_b, module.lora_b, rtol=0, atol=0)


def test_version_is_downloaded_verified_and_loaded(registered, store, served, peft_adapter, tmp_path):
    fetcher = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "cache", max_bytes=BIG)
    weights = host_cache(served, fetcher).get(registered[0])
    assert_same_weights(weights, load_adapter_weights(peft_adapter, served.config, served.max_lora_rank))
    (directory,) = (tmp_path / "cache").iterdir()
    assert directory.name.startswith(registered[0].sha256)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (directory / name).read_bytes() == (peft_adapter / name).read_bytes()


def test_second_fetch_is_served_from_the_local_copy(registered, store, served, tmp_path):
    fetcher = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "cache", max_bytes=BIG)
    first = fetcher(registered[0])
    store.delete(content_key(registered[0].sha256))  # storage no longer has it; the local copy does
    assert fetcher(registered[0]) == first
    assert host_cache(served, fetcher).get(registered[0]).rank == 4


def test_corrupt_blob_in_storage_is_refused_and_leaves_nothing(registered, store, served, tmp_path):
    overwrite_blob(store, content_key(registered[0].sha256), b"flipped bits")
    fetcher = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "cache", max_bytes=BIG)
    with pytest.raises(AdapterLoadError, match="stored blob is corrupt"):
        host_cache(served, fetcher).get(registered[0])
    assert list((tmp_path / "cache").iterdir()) == []


def test_tampered_local_copy_is_caught_by_the_engine(registered, store, served, tmp_path):
    fetcher = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "cache", max_bytes=BIG)
    directory = fetcher(registered[0])
    weights = directory / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(AdapterLoadError, match="sha256 is .* expected"):
        host_cache(served, fetcher).get(registered[0])


def test_uri_of_another_store_is_refused(registered, store, served, tmp_path):
    other = StorageAdapterFetcher(store=LocalBlobStore(tmp_path / "elsewhere"), cache_dir=tmp_path / "c", max_bytes=BIG)
    with pytest.raises(AdapterLoadError, match="not a version in this server's storage"):
        other(registered[0])
    forged = dataclasses.replace(registered[0], sha256=registered[1].sha256)  # URI and digest disagree
    with pytest.raises(AdapterLoadError, match="not a version in this server's storage"):
        StorageAdapterFetcher(store=store, cache_dir=tmp_path / "c2", max_bytes=BIG)(forged)


def test_server_local_directories_go_to_the_default_fetcher(store, served, peft_adapter, tmp_path):
    fetcher = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "cache", max_bytes=BIG)
    local = AdapterHandle(key="local@x", name="local", uri=peft_adapter.as_uri())
    assert fetcher(local) == peft_adapter
    assert list((tmp_path / "cache").iterdir()) == []


def test_local_copies_are_bounded_least_recently_used_first(registered, store, tmp_path):
    sizes = []
    probe = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "probe", max_bytes=BIG)
    for handle in registered:
        sizes.append(sum(f.stat().st_size for f in probe(handle).iterdir()))
    fetcher = StorageAdapterFetcher(store=store, cache_dir=tmp_path / "cache", max_bytes=max(sizes) + 1)
    first = fetcher(registered[0])
    second = fetcher(registered[1])  # both do not fit: the older goes
    assert sorted((tmp_path / "cache").iterdir()) == [second]
    assert fetcher(registered[0]) == first and first.is_dir()  # fetched again
    assert sorted((tmp_path / "cache").iterdir()) == [first]
    shutil.rmtree(tmp_path / "probe")
