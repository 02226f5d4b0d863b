"""The draft-free proposers of speculative decoding (engine/speculation): prompt lookup over a request's
own tokens (NgramIndex) and recent outputs per (tenant, adapter) (OutputStore).

Proposals are checked token for token, against hand-worked sequences and against a brute-force
reference that scans every earlier position, written plainly here.
"""
from __future__ import annotations

import random
import threading

import pytest

from loraloom.engine.speculation.ngram_index import NgramIndex
from loraloom.engine.speculation.output_store import OutputStore, OutputStoreStats


def index_of(tokens: list[int], min_n: int = 2, max_n: int = 4) -> NgramIndex:
    index = NgramIndex(min_n, max_n)
    index.extend(tokens)
    return index


def brute_force_proposal(sequence: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Longest suffix n-gram first; its latest occurrence ending before the last position; what followed."""
    if k <= 0:
        return []
    for n in range(min(max_n, len(sequence)), min_n - 1, -1):
        suffix = sequence[-n:]
        for end in range(len(sequence) - 2, n - 2, -1):
            if sequence[end - n + 1:end + 1] == suffix:
                return sequence[end + 1:end + 1 + k]
    return []


# ------------------------------------------------------------------------------------ NgramIndex
def test_the_longest_suffix_ngram_wins_over_a_later_shorter_match():
    # [1, 2, 3] occurred ending at 2 (then 9); only [2, 3] occurred later, ending at 6 (then 8).
    index = index_of([1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3], min_n=2, max_n=3)
    assert index.propose(2) == [9, 5]
    # With 3-grams out of reach the later 2-gram is the match.
    assert index_of([1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3], min_n=2, max_n=2).propose(2) == [8, 1]


def test_the_latest_earlier_occurrence_wins():
    assert index_of([1, 2, 7, 1, 2, 8, 1, 2]).propose(2) == [8, 1]


def test_the_suffix_itself_is_not_an_earlier_occurrence():
    assert index_of([1, 2]).propose(4) == []
    assert index_of([5, 6, 7, 1, 2]).propose(4) == []
    assert index_of([]).propose(4) == []
    # A run of one token: the suffix [4, 4] occurred ending one position earlier, not at the end.
    assert index_of([4, 4, 4]).propose(5) == [4]


def test_the_continuation_stops_at_the_end_of_the_sequence():
    assert index_of([1, 2, 3, 1, 2], min_n=2).propose(10) == [3, 1, 2]


def test_k_bounds_the_proposal():
    index = index_of([1, 2, 3, 4, 5, 1, 2])
    assert index.propose(1) == [3]
    assert index.propose(3) == [3, 4, 5]
    assert index.propose(0) == []
    assert index.propose(-1) == []


def test_min_n_is_respected():
    assert index_of([1, 5, 1], min_n=2).propose(3) == []
    assert index_of([1, 5, 1], min_n=1).propose(3) == [5, 1]


def test_extend_appends_and_counts():
    index = NgramIndex()
    index.extend([1, 2, 3])
    index.extend([])
    index.extend([1, 2])
    assert len(index) == 5
    assert index.propose(1) == [3]


def test_ids_outside_32_bits_are_refused():
    with pytest.raises(OverflowError):
        NgramIndex().extend([-1])
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)


@pytest.mark.parametrize("seed", range(4))
def test_incremental_extend_matches_one_extend_and_the_brute_force_reference(seed):
    rng = random.Random(seed)
    for _ in range(60):
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        sequence = [rng.randrange(3) for _ in range(rng.randint(0, 40))]
        incremental = NgramIndex(min_n, max_n)
        position = 0
        while position < len(sequence):
            step = rng.randint(1, 6)
            incremental.extend(sequence[position:position + step])
            position += step
            so_far = sequence[:position]
            k = rng.randint(0, 8)
            assert incremental.propose(k) == brute_force_proposal(so_far, k, min_n, max_n), (so_far, k)
        whole = index_of(sequence, min_n, max_n)
        for k in range(0, 8):
            assert whole.propose(k) == incremental.propose(k) == brute_force_proposal(sequence, k, min_n, max_n)


# ----------------------------------------------------------------------------------- OutputStore
TENANT = ("acme", "extractor-v1")
HEADER = [100, 101, 102, 103]  # a chat template's assistant header, the end of every prompt
ANSWER = [7, 8, 9, 10, 2]  # a templated answer, ending in its closing tokens


def test_a_template_is_proposed_after_one_recorded_output():
    store = OutputStore(lead_tokens=4)
    store.record(TENANT, [55, 56, *HEADER], ANSWER)
    # At the very start of the answer, through the prompt's lead: the whole header matches.
    assert store.propose(TENANT, [60, 61, *HEADER], 3) == ([7, 8, 9], 4)
    # A prompt sharing only the header's last two tokens matches with n = 2.
    assert store.propose(TENANT, [60, 61, 102, 103], 3) == ([7, 8, 9], 2)
    # Mid-answer: runs on to the stored sequence's end, truncated at k.
    assert store.propose(TENANT, [60, *HEADER, 7, 8], 10) == ([9, 10, 2], 4)
    assert store.propose(TENANT, [60, *HEADER, 7, 8], 2) == ([9, 10], 4)
    assert store.propose(TENANT, [60, *HEADER, 7, 8], 0) == ([], 0)
    # The last stored token has nothing after it, and one matching token is under min_n.
    assert store.propose(TENANT, [10, 2], 3) == ([], 0)
    assert store.propose(TENANT, [99, 103], 3) == ([], 0)


def test_without_a_lead_the_start_of_an_answer_does_not_match():
    store = OutputStore(lead_tokens=0)
    store.record(TENANT, HEADER, ANSWER)
    assert store.propose(TENANT, HEADER, 3) == ([], 0)
    assert store.propose(TENANT, [*HEADER, 7, 8], 3) == ([9, 10, 2], 2)


def test_the_latest_recorded_output_wins():
    store = OutputStore()
    store.record(TENANT, HEADER, [1, 2, 3, 4])
    store.record(TENANT, HEADER, [1, 2, 5, 6])
    assert store.propose(TENANT, [9, 1, 2], 2) == ([5, 6], 2)
    assert store.propose(TENANT, HEADER, 2) == ([1, 2], 4)


@pytest.mark.parametrize("other", [("globex", "extractor-v1"), ("acme", "extractor-v2"), ("acme", None)])
def test_scopes_never_share_outputs(other):
    store = OutputStore()
    store.record(TENANT, HEADER, ANSWER)
    assert store.propose(other, [*HEADER, 7], 4) == ([], 0)
    store.record(other, HEADER, [40, 41, 42])
    assert store.propose(other, [*HEADER], 4) == ([40, 41, 42], 4)
    assert store.propose(TENANT, [*HEADER], 4) == ([7, 8, 9, 10], 4)
    assert store.stats().scopes == 2


def test_the_base_model_scope_does_not_see_its_tenants_adapters():
    store = OutputStore()
    store.record(("acme", None), HEADER, [30, 31, 32])
    store.record(("acme", "extractor-v1"), HEADER, [40, 41, 42])
    assert store.propose(("acme", None), HEADER, 3) == ([30, 31, 32], 4)
    assert store.propose(("acme", "extractor-v1"), HEADER, 3) == ([40, 41, 42], 4)


def test_the_per_scope_bound_evicts_the_oldest_sequences():
    store = OutputStore(max_tokens=1000, max_tokens_per_scope=25, lead_tokens=2)
    for i in range(20):  # 2 lead + 8 output tokens each: the scope holds the latest two
        store.record(TENANT, HEADER, [1000 + i, *range(10 * i, 10 * i + 7)])
        stats = store.stats()
        assert stats.tokens <= 25 and stats.sequences == min(i + 1, 2)
    assert store.propose(TENANT, [1019, 190], 2) == ([191, 192], 2)
    assert store.propose(TENANT, [1018, 180], 2) == ([181, 182], 2)
    assert store.propose(TENANT, [1017, 170], 2) == ([], 0)


def test_the_total_bound_evicts_the_least_recently_used_scope_first():
    store = OutputStore(max_tokens=30, max_tokens_per_scope=30, lead_tokens=2)
    a, b, c, d = (("t", name) for name in "abcd")
    for scope, first in ((a, 10), (b, 20), (c, 30)):
        store.record(scope, HEADER, list(range(first, first + 8)))  # 10 tokens each: the store is full
    assert store.propose(a, HEADER[-2:], 1) == ([10], 2)  # a is used: b is now the least recent
    store.record(d, HEADER, list(range(40, 48)))
    assert store.propose(b, HEADER[-2:], 1) == ([], 0)
    assert [store.propose(scope, HEADER[-2:], 1)[0] for scope in (a, c, d)] == [[10], [30], [40]]
    # Now b is gone and a the least recent (the proposals above used a, c, d in that order).
    store.record(b, HEADER, list(range(50, 58)))
    assert store.propose(a, HEADER[-2:], 1) == ([], 0)
    assert store.stats().tokens == 30 and store.stats().scopes == 3


def test_sequences_over_the_per_scope_bound_are_not_stored():
    store = OutputStore(max_tokens=100, max_tokens_per_scope=20, lead_tokens=4)
    store.record(TENANT, HEADER, ANSWER)
    before = store.stats()
    store.record(TENANT, HEADER, list(range(500, 517)))  # 4 + 17 = 21 tokens
    assert store.stats() == before
    assert store.propose(TENANT, HEADER, 2) == ([7, 8], 4)
    store.record(TENANT, HEADER, [])  # an empty output has nothing to propose
    store.record(TENANT, [], [5, 6])  # nor 2 tokens with min_n = 2: nothing would follow a match
    assert store.stats() == before


def test_memory_stays_bounded_over_many_records_with_eviction():
    rng = random.Random(0)
    store = OutputStore(max_tokens=600, max_tokens_per_scope=200, min_n=2, max_n=4, lead_tokens=4)
    sizes = 3  # n in 2..4
    for _ in range(1500):
        scope = (f"t{rng.randrange(6)}", rng.choice([None, "x"]))
        output = [rng.randrange(150_000) for _ in range(rng.randint(1, 60))]
        store.record(scope, [rng.randrange(50) for _ in range(6)], output)
        stats = store.stats()
        assert stats.tokens <= 600
        assert stats.index_entries <= stats.tokens * sizes
    assert store.stats().bytes > 0
    store.clear()
    assert store.stats() == OutputStoreStats(scopes=0, sequences=0, tokens=0, bytes=0, index_entries=0)
    assert store.propose(scope, output, 3) == ([], 0)


def test_proposals_match_a_brute_force_scan_of_the_stored_sequences():
    rng = random.Random(1)
    store = OutputStore(max_tokens=10**6, max_tokens_per_scope=10**6, min_n=2, max_n=3, lead_tokens=2)
    stored: list[list[int]] = []  # lead + output, oldest first
    for _ in range(40):
        prompt, output = [rng.randrange(3) for _ in range(5)], [rng.randrange(3) for _ in range(rng.randint(1, 12))]
        store.record(TENANT, prompt, output)
        stored.append(prompt[-2:] + output)
        recent = [rng.randrange(3) for _ in range(rng.randint(0, 6))]
        expected = ([], 0)
        for n in range(min(3, len(recent)), 1, -1):
            matches = [(s, end) for s, sequence in enumerate(stored) for end in range(n - 1, len(sequence) - 1)
                       if sequence[end - n + 1:end + 1] == recent[-n:]]
            if matches:
                s, end = max(matches)  # the latest sequence, then the latest position in it
                expected = (stored[s][end + 1:end + 5], n)
                break
        assert store.propose(TENANT, recent, 4) == expected, (recent, stored)


def test_stats_from_another_thread_while_recording():
    store = OutputStore(max_tokens=500, max_tokens_per_scope=100)
    failures: list[BaseException] = []
    seen: list[int] = []
    done = threading.Event()

    def scrape() -> None:
        try:
            while not done.is_set():
                stats = store.stats()
                seen.append(stats.tokens)
                assert stats.tokens <= 500 and stats.index_entries <= 3 * stats.tokens
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        rng = random.Random(2)
        for i in range(3000):
            scope = (f"t{i % 7}", None)
            store.record(scope, [1, 2, 3, 4], [rng.randrange(1000) for _ in range(rng.randint(1, 40))])
            store.propose(scope, [1, 2, 3, 4], 4)
    finally:
        done.set()
        scraper.join()
    assert not failures, failures
    assert seen
