"""KV block manager: free blocks, reference counts and the prefix cache.

A request's block table is `request.block_ids` (position p lives in block
`block_ids[p // block_size]` at offset `p % block_size`). Full blocks of
computed tokens are registered under a chained content hash, so a later request
with the same prefix and the same `cache_scope` (one tenant, one adapter or the base
model, one optional cache salt: Request.cache_scope) reuses them instead of
recomputing. Nothing is shared across tenants: a hit, its `cached_tokens` and the
time it saves would tell one tenant what another sent (docs/ARCHITECTURE.md,
"Tenant isolation"). A block whose last reference is dropped keeps its
hash and stays matchable until the free list hands it out again.

Why sha256 and not Python's `hash`: the tuple hash is 64 bits and not
collision resistant, so a crafted prompt could land on another tenant's block
and read its KV. A sha256 digest chained over (parent digest, salt, tokens)
makes a hit mean "same tokens, same scope, same whole prefix" without
storing the tokens to verify.

Blocks a running request will fill from its known tokens but has not computed yet are
*in flight* (keyed by the same scoped digests, so a wait never crosses tenants either): the scheduler holds back a waiting request whose next blocks are in flight
(`inflight_prefix_tokens`), so that requests arriving together behind one long system prompt
compute it once and the others reuse it a step later, instead of all computing it side by side.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

from loraloom.engine.block_rows import BlockRows
from loraloom.engine.request import Request

_ROOT_HASH = bytes(32)  # parent of a sequence's first block


def block_hash(parent: bytes, token_ids: list[int], salt: str) -> bytes:
    """Digest of one full block, chained to the digest of the block before it."""
    salt_bytes = salt.encode()
    payload = struct.pack(f"<I{len(token_ids)}q", len(salt_bytes), *token_ids)
    return hashlib.sha256(parent + payload + salt_bytes).digest()


@dataclass
class _Holder:
    """Block-manager state of one request that holds blocks."""

    request: Request
    # How many of the request's leading full blocks hold computed tokens and are registered
    # (or were offered for registration) in the prefix cache; commit() advances it.
    num_committed: int = 0
    # Digests of blocks it will compute that nobody had cached or in flight when it was admitted.
    inflight: list[bytes] = field(default_factory=list)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks: must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._hash_of_block: list[bytes | None] = [None] * num_blocks
        self._block_of_hash: dict[bytes, int] = {}
        self._inflight: dict[bytes, str] = {}  # digest of a block being computed -> the request computing it
        # Free blocks come in two pools: blank ones are handed out first, cached
        # ones (still matchable) only when no blank block is left, least recently
        # freed first.
        self._blank_free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self._holders: dict[str, _Holder] = {}
        self.rows = BlockRows()  # every holder's block_ids as a numpy row, for the runner's batch

    # ------------------------------------------------------------------ counters
    @property
    def num_free_blocks(self) -> int:
        return len(self._blank_free) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a matchable prefix, whether in use or free."""
        return len(self._block_of_hash)

    # ---------------------------------------------------------------- lifecycle
    def allocate_for_new(self, request: Request) -> bool:
        """Give a request without blocks its cached prefix plus blocks for all its known tokens.

        Called at first schedule and after preemption. Matches the longest run of
        cached full blocks of `request.all_token_ids`, leaving at least one token
        to compute so the step yields logits, and sets `num_computed_tokens`
        (and `num_cached_tokens` at first schedule). All or nothing: returns
        False, taking no block, when the free list cannot hold the rest.
        Reserving every known token up front, not just the first chunk, means
        an admitted prefill never preempts anyone to go on; only decode growth
        (`ensure_capacity`) competes for blocks.
        """
        if request.request_id in self._holders or request.block_ids:
            raise ValueError(f"request {request.request_id!r}: already holds KV blocks; "
                             "free it before allocating again")
        matched_blocks, taken_from_free = self._admission_need(request)
        num_cached = len(matched_blocks) * self.block_size
        missing = self._blocks_for(request.num_tokens) - len(matched_blocks)
        if taken_from_free > self.num_free_blocks:
            return False
        for block in matched_blocks:
            if self._ref_counts[block] == 0:
                del self._cached_free[block]
            self._ref_counts[block] += 1
        request.block_ids = matched_blocks
        holder = self._holders[request.request_id] = _Holder(request, len(matched_blocks))
        self._mark_inflight(holder)
        request.num_computed_tokens = num_cached
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_cached
        request.block_ids.extend(self._take_free(missing))
        self.rows.assign(request)
        return True

    def blocks_to_admit(self, request: Request) -> int:
        """Free blocks `allocate_for_new` would take for a request without blocks (cached ones revived included)."""
        return self._admission_need(request)[1]

    def blocks_freed_by(self, request: Request) -> int:
        """Blocks that freeing this running request would return to the free list (those only it holds)."""
        ref_counts = self._ref_counts
        return sum(1 for block in request.block_ids if ref_counts[block] == 1)

    def _admission_need(self, request: Request) -> tuple[list[int], int]:
        """(its cached prefix's blocks, how many blocks admitting it takes from the free list)."""
        matched_blocks = self._match_prefix(request)
        revived = sum(1 for block in matched_blocks if self._ref_counts[block] == 0)
        missing = self._blocks_for(request.num_tokens) - len(matched_blocks)
        return matched_blocks, revived + missing

    def ensure_capacity(self, request: Request, num_new_tokens: int) -> bool:
        """Make blocks exist for positions [0, num_computed_tokens + num_new_tokens); False (taking none) if short."""
        self._holder(request)
        missing = self._blocks_for(request.num_computed_tokens + num_new_tokens) - len(request.block_ids)
        if missing <= 0:
            return True
        if missing > self.num_free_blocks:
            return False
        start = len(request.block_ids)
        request.block_ids.extend(self._take_free(missing))
        self.rows.extend(request, start)
        return True

    def commit(self, request: Request) -> None:
        """Register the hashes of blocks that became full of computed tokens since the last commit."""
        if not self.enable_prefix_caching:
            return
        holder = self._holder(request)
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= holder.num_committed:
            return
        hashes = self._block_hashes(request, num_full)
        for index in range(holder.num_committed, num_full):
            digest = hashes[index]
            self._inflight.pop(digest, None)  # computed now, by this request or (the same digest) another
            block = request.block_ids[index]
            # Two requests that computed the same prefix at once: the first
            # registered copy stays the cached one, the second is plain KV.
            if digest not in self._block_of_hash and self._hash_of_block[block] is None:
                self._block_of_hash[digest] = block
                self._hash_of_block[block] = digest
        holder.num_committed = num_full

    def free(self, request: Request) -> None:
        """Drop the request's references; blocks nobody holds go back to the free list."""
        holder = self._holders.pop(request.request_id, None)
        if holder is None:
            return
        for digest in holder.inflight:  # what it will no longer compute (preempted or aborted mid-prefill)
            if self._inflight.get(digest) == request.request_id:
                del self._inflight[digest]
        # Tail blocks first, so a shared prefix is the last part of a sequence
        # to be evicted.
        for block in reversed(request.block_ids):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                pool = self._blank_free if self._hash_of_block[block] is None else self._cached_free
                pool[block] = None
        self.rows.release(request)
        request.block_ids = []

    def inflight_prefix_tokens(self, request: Request) -> int:
        """For a request not yet admitted: how many tokens of its next blocks, after what the cache
        already holds, a running request is computing now (0 when prefix caching is off)."""
        if not self.enable_prefix_caching:
            return 0
        inflight = 0
        for digest in self._matchable_hashes(request):
            if digest in self._inflight:
                inflight += 1
            elif digest not in self._block_of_hash:
                break
        return inflight * self.block_size

    # ----------------------------------------------------------------- internals
    def _block_hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """request.block_hashes, extended to cover its first `num_blocks` full blocks (or all it has)."""
        hashes = request.block_hashes
        num_blocks = min(num_blocks, request.num_tokens // self.block_size)
        if len(hashes) < num_blocks:
            token_ids = request.all_token_ids
            size = self.block_size
            scope = request.cache_scope
            for index in range(len(hashes), num_blocks):
                parent = hashes[-1] if hashes else _ROOT_HASH
                hashes.append(block_hash(parent, token_ids[index * size:(index + 1) * size], scope))
        return hashes

    def _matchable_hashes(self, request: Request) -> list[bytes]:
        """Digests of the blocks another request's KV could serve: never the whole sequence, since its
        last token must be computed for logits."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        return self._block_hashes(request, max_blocks)[:max_blocks]

    def _mark_inflight(self, holder: _Holder) -> None:
        """Mark the full blocks the new holder will compute from its known tokens as in flight."""
        if not self.enable_prefix_caching:
            return
        request = holder.request
        full = request.num_tokens // self.block_size
        for digest in self._block_hashes(request, full)[holder.num_committed:full]:
            if digest not in self._block_of_hash and digest not in self._inflight:
                self._inflight[digest] = request.request_id
                holder.inflight.append(digest)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _holder(self, request: Request) -> _Holder:
        holder = self._holders.get(request.request_id)
        if holder is None:
            raise ValueError(f"request {request.request_id!r}: holds no KV blocks; call allocate_for_new first")
        return holder

    def _match_prefix(self, request: Request) -> list[int]:
        """The cached blocks of the request's longest cached prefix."""
        if not self.enable_prefix_caching:
            return []
        blocks: list[int] = []
        for digest in self._matchable_hashes(request):
            block = self._block_of_hash.get(digest)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _take_free(self, count: int) -> list[int]:
        taken = []
        for _ in range(count):
            if self._blank_free:
                block, _ = self._blank_free.popitem(last=False)
            else:
                block, _ = self._cached_free.popitem(last=False)
                del self._block_of_hash[self._hash_of_block[block]]
                self._hash_of_block[block] = None
            self._ref_counts[block] = 1
            taken.append(block)
        return taken

    # -------------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests)."""
        expected_refs = [0] * self.num_blocks
        for request_id, holder in self._holders.items():
            table = holder.request.block_ids
            row = self.rows.array[holder.request.block_row]
            assert row[:len(table)].tolist() == table and not row[len(table):].any(), \
                f"{request_id}: its BlockRows row differs from its block table"
            assert len(set(table)) == len(table), f"{request_id}: duplicate block in its table {table}"
            assert holder.num_committed <= len(table), f"{request_id}: more committed blocks than blocks"
            assert holder.request.num_computed_tokens <= len(table) * self.block_size, \
                f"{request_id}: computed past its blocks"
            for block in table:
                expected_refs[block] += 1
        assert expected_refs == self._ref_counts, "ref counts differ from the block tables that hold each block"
        free = list(self._blank_free) + list(self._cached_free)
        assert len(free) == len(set(free)), "a block is in the free list twice"
        assert set(free) == {b for b in range(self.num_blocks) if self._ref_counts[b] == 0}, "free list != ref-0 blocks"
        assert all(self._hash_of_block[b] is None for b in self._blank_free), "a blank free block has a hash"
        assert all(self._hash_of_block[b] is not None for b in self._cached_free), "a cached free block has no hash"
        for digest, block in self._block_of_hash.items():
            assert self._hash_of_block[block] == digest, f"block {block}: hash index out of sync"
        assert sum(h is not None for h in self._hash_of_block) == len(self._block_of_hash), "orphan block hash"
        for digest, request_id in self._inflight.items():
            assert request_id in self._holders, f"{request_id}: in flight but holds no blocks"
            assert digest not in self._block_of_hash, "a block both cached and in flight"
