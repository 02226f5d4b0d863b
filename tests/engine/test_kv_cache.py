"""BlockManager: allocation, reference counts, prefix matching and LRU eviction.

Expected cache hits are computed from the token lists themselves (the longest
common run of full blocks with the same salt), independently of the hashing.
"""
from __future__ import annotations

import subprocess
import sys

from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.kv_cache import BlockManager
from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.tenancy import DEFAULT_TENANT, TenantTag

ACME, GLOBEX = TenantTag("id-acme", "acme"), TenantTag("id-globex", "globex")


def make_request(request_id: str, prompt: list[int], adapter_key: str | None = None,
                 tenant: TenantTag = DEFAULT_TENANT, cache_salt: str | None = None) -> Request:
    adapter = None
    if adapter_key is not None:
        adapter = AdapterHandle(key=adapter_key, name=adapter_key, uri=f"file:///adapters/{adapter_key}")
    return Request(request_id, list(prompt), SamplingParams(max_tokens=64), adapter, tenant=tenant,
                   cache_salt=cache_salt)


def compute_all(manager: BlockManager, request: Request) -> None:
    """Pretend a step computed every known token of the request."""
    num_new = request.num_tokens - request.num_computed_tokens
    assert manager.ensure_capacity(request, num_new)
    request.num_computed_tokens += num_new
    manager.commit(request)


def start(manager: BlockManager, request: Request) -> None:
    assert manager.allocate_for_new(request)
    compute_all(manager, request)


def expected_cached_tokens(cached: list[int], new: list[int], block_size: int) -> int:
    """Tokens of `new` in full blocks equal to `cached`'s, leaving at least one token of `new` to compute."""
    common = 0
    while common < min(len(cached), len(new)) and cached[common] == new[common]:
        common += 1
    common = min(common, len(new) - 1)
    return common // block_size * block_size


def test_allocation_and_free_return_every_block():
    manager = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a, b = make_request("a", range(9)), make_request("b", range(100, 105))
    start(manager, a)
    start(manager, b)
    assert len(a.block_ids) == 3 and len(b.block_ids) == 2
    assert manager.num_used_blocks == 5 and manager.num_free_blocks == 5
    manager.check_invariants()
    manager.free(a)
    manager.free(b)
    manager.check_invariants()
    assert manager.num_free_blocks == 10 and manager.num_used_blocks == 0
    assert a.block_ids == [] and b.block_ids == []


def test_same_prefix_and_salt_reuses_full_blocks():
    block_size = 4
    manager = BlockManager(num_blocks=16, block_size=block_size, enable_prefix_caching=True)
    first = make_request("first", list(range(10)))
    start(manager, first)
    second_prompt = list(range(9)) + [99, 98]
    second = make_request("second", second_prompt)
    assert manager.allocate_for_new(second)
    cached = expected_cached_tokens(first.prompt_token_ids, second_prompt, block_size)
    assert cached == 8
    assert second.num_cached_tokens == second.num_computed_tokens == cached
    assert second.block_ids[:2] == first.block_ids[:2]  # shared physical blocks
    assert second.block_ids[2] not in first.block_ids
    manager.check_invariants()
    compute_all(manager, second)
    manager.free(first)
    manager.check_invariants()  # the shared blocks are still referenced by `second`
    assert manager.num_used_blocks == 3
    manager.free(second)
    manager.check_invariants()
    assert manager.num_free_blocks == 16


def test_whole_sequence_is_never_matched():
    block_size = 4
    manager = BlockManager(num_blocks=16, block_size=block_size, enable_prefix_caching=True)
    prompt = list(range(8))  # exactly two full blocks
    start(manager, make_request("original", prompt))
    again = make_request("again", prompt)
    assert manager.allocate_for_new(again)
    assert again.num_computed_tokens == expected_cached_tokens(prompt, prompt, block_size) == 4
    longer = make_request("longer", prompt + [8])
    assert manager.allocate_for_new(longer)
    assert longer.num_computed_tokens == 8
    manager.check_invariants()


def test_different_salt_shares_nothing():
    manager = BlockManager(num_blocks=32, block_size=4, enable_prefix_caching=True)
    prompt = list(range(13))
    start(manager, make_request("base", prompt))
    for request_id, key in [("x", "adapter-x@1"), ("y", "adapter-y@1"), ("x2", "adapter-x@2")]:
        request = make_request(request_id, prompt, key)
        assert manager.allocate_for_new(request)
        assert request.num_cached_tokens == 0, f"{key} reused another adapter's KV"
        compute_all(manager, request)
    same_adapter = make_request("x-again", prompt, "adapter-x@1")
    assert manager.allocate_for_new(same_adapter)
    assert same_adapter.num_cached_tokens == 12
    manager.check_invariants()


def test_tenants_never_share_blocks_on_the_base_model_nor_on_one_adapter_key():
    # A server-local adapter's runtime key is the same for every tenant: only the tenant id tells them apart.
    manager = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    prompt = list(range(13))
    for adapter_key in (None, "server/local-adapter"):
        start(manager, make_request(f"acme-{adapter_key}", prompt, adapter_key, tenant=ACME))
        same_name = TenantTag("id-initech", "acme")  # a name is a label: equal names are still two tenants
        for request_id, tenant in [("globex", GLOBEX), ("same-name", same_name), ("default", DEFAULT_TENANT)]:
            other = make_request(f"{request_id}-{adapter_key}", prompt, adapter_key, tenant=tenant)
            assert manager.allocate_for_new(other)
            assert other.num_cached_tokens == 0, f"{request_id} read acme's KV ({adapter_key})"
            compute_all(manager, other)
        repeat = make_request(f"acme-again-{adapter_key}", prompt, adapter_key, tenant=ACME)
        assert manager.allocate_for_new(repeat)
        assert repeat.num_cached_tokens == 12, "a tenant's own repeat must still hit"
    manager.check_invariants()


def test_a_cache_salt_isolates_within_a_tenant_and_the_same_salt_shares():
    manager = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    prompt = list(range(13))
    start(manager, make_request("salted", prompt, tenant=ACME, cache_salt="user-1"))
    for request_id, salt, expected in [("unsalted", None, 0), ("other-salt", "user-2", 0), ("empty", "", 12),
                                       ("same-salt", "user-1", 12)]:
        request = make_request(request_id, prompt, tenant=ACME, cache_salt=salt)
        assert manager.allocate_for_new(request)
        assert request.num_cached_tokens == expected, request_id
        compute_all(manager, request)  # "empty" computes the unsalted blocks that "same-salt" never sees
    manager.check_invariants()


def test_a_prefix_in_flight_for_one_tenant_is_not_in_flight_for_another():
    manager = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    prompt = list(range(40))
    leader = make_request("leader", prompt + [1], tenant=ACME)
    assert manager.allocate_for_new(leader)  # admitted, nothing computed: its blocks are in flight
    assert manager.inflight_prefix_tokens(make_request("follower", prompt + [2], tenant=ACME)) == 40
    assert manager.inflight_prefix_tokens(make_request("other", prompt + [2], tenant=GLOBEX)) == 0
    assert manager.inflight_prefix_tokens(make_request("salted", prompt + [2], tenant=ACME, cache_salt="s")) == 0


def test_same_block_after_another_prefix_or_at_another_position_never_matches():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    start(manager, make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    other_prefix = make_request("b", [0, 2, 3, 4, 5, 6, 7, 8, 9])
    shifted = make_request("c", [5, 6, 7, 8, 9])  # a's second block, now at position 0
    for request in (other_prefix, shifted):
        assert manager.allocate_for_new(request)
        assert request.num_cached_tokens == 0, request.request_id


def test_generated_tokens_become_cacheable_block_by_block():
    block_size = 4
    manager = BlockManager(num_blocks=16, block_size=block_size, enable_prefix_caching=True)
    writer = make_request("writer", [5, 6, 7])
    assert manager.allocate_for_new(writer)
    compute_all(manager, writer)
    for token in range(20, 30):  # decode: one sampled token, then compute it
        writer.output_token_ids.append(token)
        compute_all(manager, writer)
        assert manager.num_cached_blocks == writer.num_computed_tokens // block_size
    reader_prompt = writer.all_token_ids[:12] + [777]
    reader = make_request("reader", reader_prompt)
    assert manager.allocate_for_new(reader)
    assert reader.num_cached_tokens == expected_cached_tokens(writer.all_token_ids, reader_prompt, block_size) == 12
    manager.check_invariants()


def test_concurrent_duplicates_register_one_copy():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    prompt = list(range(9))
    a, b = make_request("a", prompt), make_request("b", prompt)
    assert manager.allocate_for_new(a) and manager.allocate_for_new(b)
    assert a.num_cached_tokens == b.num_cached_tokens == 0
    compute_all(manager, a)
    compute_all(manager, b)
    assert manager.num_cached_blocks == 2
    registered = a.block_ids[:2]  # the first to commit keeps the cache entries
    manager.check_invariants()
    manager.free(a)
    manager.free(b)
    manager.check_invariants()
    c = make_request("c", prompt)
    assert manager.allocate_for_new(c)
    assert c.num_cached_tokens == 8 and c.block_ids[:2] == registered


def test_allocation_failure_takes_nothing():
    manager = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    small = make_request("small", range(8))
    start(manager, small)
    too_big = make_request("too-big", range(100, 112))  # needs 3 blocks, 2 are free
    assert not manager.allocate_for_new(too_big)
    assert too_big.block_ids == [] and manager.num_free_blocks == 2
    assert not manager.ensure_capacity(small, 9)  # positions up to 17 need 5 blocks
    assert len(small.block_ids) == 2 and manager.num_free_blocks == 2
    assert manager.ensure_capacity(small, 8)
    assert len(small.block_ids) == 4 and manager.num_free_blocks == 0
    manager.check_invariants()


def test_cached_blocks_are_evicted_only_when_blank_ones_run_out_least_recent_first():
    block_size = 2
    manager = BlockManager(num_blocks=6, block_size=block_size, enable_prefix_caching=True)
    prompts = {"r1": [11, 12, 13], "r2": [21, 22, 23], "r3": [31, 32, 33]}
    requests = {name: make_request(name, prompt) for name, prompt in prompts.items()}
    for request in requests.values():
        start(manager, request)
    full_block = {name: request.block_ids[0] for name, request in requests.items()}
    for request in requests.values():  # r1 freed first = least recently used
        manager.free(request)
    assert manager.num_cached_blocks == 3 and manager.num_free_blocks == 6

    # Allocated but never computed, so these blocks never get a hash.
    blank_user = make_request("blank", [1, 2, 3, 4, 5, 6])  # 3 blocks: exactly the blank ones
    assert manager.allocate_for_new(blank_user)
    assert manager.num_cached_blocks == 3, "a cached block was evicted while blank blocks were free"
    assert not set(blank_user.block_ids) & set(full_block.values())

    evictor = make_request("evictor", [7, 8])
    assert manager.allocate_for_new(evictor)
    assert evictor.block_ids == [full_block["r1"]]
    assert manager.num_cached_blocks == 2
    manager.check_invariants()
    manager.free(evictor)
    manager.free(blank_user)
    for name, expect in [("r1", 0), ("r2", 2), ("r3", 2)]:
        probe = make_request(f"probe-{name}", prompts[name])
        assert manager.allocate_for_new(probe)
        assert probe.num_cached_tokens == expect, name
        manager.free(probe)
    manager.check_invariants()


def test_a_freed_sequence_is_evicted_tail_first():
    block_size = 2
    manager = BlockManager(num_blocks=4, block_size=block_size, enable_prefix_caching=True)
    prompt = [1, 2, 3, 4, 5, 6, 7]  # 3 full blocks + 1 partial
    long = make_request("long", prompt)
    start(manager, long)
    tail_block = long.block_ids[2]
    manager.free(long)
    taker = make_request("taker", [9, 9, 9])  # 2 blocks: the blank partial one, then one cached eviction
    assert manager.allocate_for_new(taker)
    assert tail_block in taker.block_ids
    manager.free(taker)
    probe = make_request("probe", prompt[:5])
    assert manager.allocate_for_new(probe)
    assert probe.num_cached_tokens == 4  # the first two blocks survived
    manager.check_invariants()


def test_prefix_caching_disabled_matches_nothing():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    prompt = list(range(9))
    start(manager, make_request("a", prompt))
    again = make_request("b", prompt)
    assert manager.allocate_for_new(again)
    assert again.num_cached_tokens == 0 and manager.num_cached_blocks == 0
    manager.check_invariants()


def test_scheduling_modules_do_not_import_torch():
    code = ("import sys; import loraloom.engine.scheduler, loraloom.engine.kv_cache, loraloom.engine.lora.slots; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
