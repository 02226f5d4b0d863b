"""engine/lora/host_cache.py: the LRU of validated adapter weights, and the hold a request keeps on
its adapter's entry from admission to its end."""
from __future__ import annotations

import pytest

from lora_factory import make_peft_adapter
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.host_cache import HostAdapterCache, fetch_local_dir
from loraloom.engine.request import SamplingParams


class CountingFetcher:
    """The default fetcher, counting what it is asked for: a fetch is what a hit must avoid."""

    def __init__(self) -> None:
        self.fetched: list[str] = []

    def __call__(self, adapter: AdapterHandle):
        self.fetched.append(adapter.key)
        return fetch_local_dir(adapter)


@pytest.fixture(scope="module")
def handles(tiny_llama_dir, tmp_path_factory) -> list[AdapterHandle]:
    root = tmp_path_factory.mktemp("host_cache_adapters")
    return [
        AdapterHandle(key=f"a{i}@test", name=f"a{i}",
                      uri=make_peft_adapter(tiny_llama_dir, root / f"a{i}", rank=4, alpha=8,
                                            target_modules=["q_proj", "v_proj"], seed=60 + i).as_uri())
        for i in range(3)
    ]


def make_cache(tiny_llama_dir, capacity: int, fetch) -> HostAdapterCache:
    return HostAdapterCache(capacity=capacity, model_config=ModelConfig.from_dir(tiny_llama_dir), max_rank=8,
                            fetch=fetch)


def test_least_recently_used_entry_is_evicted(tiny_llama_dir, handles):
    cache = make_cache(tiny_llama_dir, capacity=2, fetch=CountingFetcher())
    a, b, c = handles
    cache.get(a)
    cache.get(b)
    cache.get(a)  # b is now the least recently used
    cache.get(c)
    assert a.key in cache and c.key in cache and b.key not in cache


def test_held_entry_is_not_evicted_under_pressure(tiny_llama_dir, handles):
    fetcher = CountingFetcher()
    cache = make_cache(tiny_llama_dir, capacity=1, fetch=fetcher)
    a, b, c = handles
    weights = cache.acquire(a)
    cache.get(b)
    cache.get(c)  # two loads past the capacity, a the least recently used all along
    assert a.key in cache
    assert cache.held(a.key) is weights and cache.get(a) is weights
    assert fetcher.fetched == [a.key, b.key, c.key]


def test_release_brings_the_cache_back_within_capacity(tiny_llama_dir, handles):
    cache = make_cache(tiny_llama_dir, capacity=1, fetch=CountingFetcher())
    a, b, _ = handles
    cache.acquire(a)
    cache.acquire(b)
    assert a.key in cache and b.key in cache  # above capacity while both are held
    cache.release(a.key)
    assert a.key not in cache and b.key in cache


def test_hold_counts_its_holders_and_survives_discard(tiny_llama_dir, handles):
    cache = make_cache(tiny_llama_dir, capacity=4, fetch=CountingFetcher())
    a = handles[0]
    weights = cache.acquire(a)
    assert cache.acquire(a) is weights
    cache.discard(a.key)  # e.g. the version was deleted: new lookups miss, holders finish on their copy
    assert a.key not in cache and cache.held(a.key) is weights
    cache.release(a.key)
    assert cache.held(a.key) is weights  # one holder left
    cache.release(a.key)
    with pytest.raises(KeyError):
        cache.held(a.key)


def test_a_running_request_keeps_its_adapter_through_cache_pressure(tiny_checkpoint, handles):
    """The step that copies an adapter into its slot finds it held, not fetched again, however many
    other adapters passed through the host cache between the request's admission and that step."""
    fetcher = CountingFetcher()
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=32, block_size=4, max_loras=1), fetcher)
    engine.adapter_cache.capacity = 1
    a, b, c = handles
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request("r", [5, 6, 7], params, a)
    engine.load_adapter(b)  # prefetches for other requests push a out of an unheld cache
    engine.load_adapter(c)
    while engine.has_unfinished():
        engine.step()
    assert fetcher.fetched == [a.key, b.key, c.key]  # the slot load copied the held weights
    with pytest.raises(KeyError):  # released when the request finished
        engine.adapter_cache.held(a.key)


def test_an_aborted_request_releases_its_adapter(tiny_checkpoint, handles):
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=32, block_size=4, max_loras=1))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request("r", [5, 6, 7], params, handles[0])
    engine.abort_request("r")
    with pytest.raises(KeyError):
        engine.adapter_cache.held(handles[0].key)


def test_a_refused_request_holds_nothing(tiny_checkpoint, handles):
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=32, block_size=4, max_loras=1))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request("r", [5, 6, 7], params, handles[0])
    with pytest.raises(ValueError, match="^request_id: 'r' is already scheduled"):
        engine.add_request("r", [5, 6, 7], params, handles[1])
    with pytest.raises(KeyError):
        engine.adapter_cache.held(handles[1].key)
    while engine.has_unfinished():
        engine.step()
    assert not engine.has_unfinished()
