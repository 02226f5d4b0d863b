"""LlamaModel over the paged KV cache against Hugging Face's full-sequence forward.

Every logit row our engine produces, whatever the batching (mixed-length prefill,
batched decode, a prefill chunked across steps), must equal HF's logits at the same
position of the whole sequence run at once with no cache.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.layers import RotaryEmbedding
from loraloom.engine.model.loader import load_model
from loraloom.engine.model.llama import allocate_kv_cache
from loraloom.kernels.metadata import AttentionMetadata

BLOCK_SIZE = 16
# Compare logits with an absolute tolerance scaled to their magnitude: fp32 sums over 30 layers
# reorder differently in a flat paged batch than in HF's padded one.
RELATIVE_TOLERANCE = 1e-4


class PagedSequences:
    """Test-side bookkeeping of a few sequences in a paged cache: each owns a shuffled,
    non-contiguous set of blocks and a count of tokens already cached."""

    def __init__(self, model, token_ids: list[torch.Tensor], seed: int):
        self.model = model
        self.token_ids = token_ids
        blocks_per_seq = [-(-len(ids) // BLOCK_SIZE) for ids in token_ids]
        num_blocks = sum(blocks_per_seq) + 3  # spare blocks that nobody owns
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(num_blocks, generator=generator).tolist()
        self.block_tables, start = [], 0
        for count in blocks_per_seq:
            self.block_tables.append(order[start:start + count])
            start += count
        self.cached = [0] * len(token_ids)
        self.kv_caches = allocate_kv_cache(model.config, num_blocks, BLOCK_SIZE, torch.float32, "cpu")

    def step(self, new_tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """Run one flat batch: sequence s computes its next new_tokens[s] tokens. -> {s: logits [n, vocab]}"""
        seqs = list(new_tokens)
        input_ids, positions, slots, query_start, seq_lens = [], [], [], [0], []
        for s in seqs:
            begin, end = self.cached[s], self.cached[s] + new_tokens[s]
            input_ids.append(self.token_ids[s][begin:end])
            for position in range(begin, end):
                block = self.block_tables[s][position // BLOCK_SIZE]
                positions.append(position)
                slots.append(block * BLOCK_SIZE + position % BLOCK_SIZE)
            query_start.append(query_start[-1] + new_tokens[s])
            seq_lens.append(end)
        width = max(len(self.block_tables[s]) for s in seqs)
        tables = [self.block_tables[s] + [0] * (width - len(self.block_tables[s])) for s in seqs]
        attn = AttentionMetadata(
            query_start_loc=torch.tensor(query_start, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc_host=query_start,
            seq_lens_host=seq_lens,
        )
        with torch.no_grad():
            hidden = self.model(torch.cat(input_ids), torch.tensor(positions), self.kv_caches, attn, None)
            logits = self.model.compute_logits(hidden)  # [T, vocab]
        for s in seqs:
            self.cached[s] += new_tokens[s]
        return {s: logits[query_start[i]:query_start[i + 1]] for i, s in enumerate(seqs)}


def reference_logits(hf_model, token_ids: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [hf_model(ids[None]).logits[0].float() for ids in token_ids]  # each [len, vocab]


def assert_logits_match(ours: torch.Tensor, reference: torch.Tensor) -> None:
    atol = RELATIVE_TOLERANCE * reference.abs().max().item()
    torch.testing.assert_close(ours, reference, atol=atol, rtol=0)
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


@pytest.fixture(scope="module")
def bundled_pair(model_dir):
    ours = load_model(model_dir, torch.float32, "cpu")
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return ours, hf_model


def random_sequences(lengths: list[int], vocab_size: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator) for n in lengths]


def test_mixed_prefill_then_batched_decode(bundled_pair):
    ours, hf_model = bundled_pair
    prompt_lens, decode_steps = [5, 23, 40], 3
    sequences = random_sequences([n + decode_steps for n in prompt_lens], ours.config.vocab_size, seed=1)
    expected = reference_logits(hf_model, sequences)
    paged = PagedSequences(ours, sequences, seed=2)

    prefill = paged.step({s: n for s, n in enumerate(prompt_lens)})
    for s, n in enumerate(prompt_lens):
        assert_logits_match(prefill[s], expected[s][:n])
    for step in range(decode_steps):
        decoded = paged.step({s: 1 for s in range(len(sequences))})
        for s, n in enumerate(prompt_lens):
            assert_logits_match(decoded[s], expected[s][n + step:n + step + 1])


def test_chunked_prefill_across_steps(bundled_pair):
    ours, hf_model = bundled_pair
    # Sequence 0 is prefilled in two chunks; its second chunk shares a step with sequence 1's
    # whole prompt, and the first chunk ends mid-block so the second writes into a partly filled block.
    sequences = random_sequences([37, 11], ours.config.vocab_size, seed=3)
    expected = reference_logits(hf_model, sequences)
    paged = PagedSequences(ours, sequences, seed=4)

    first = paged.step({0: 20})
    second = paged.step({0: 17, 1: 11})
    assert_logits_match(torch.cat([first[0], second[0]]), expected[0])
    assert_logits_match(second[1], expected[1])


def test_tiny_llama3_rope_sharded_untied(tiny_llama_dir):
    config = ModelConfig.from_dir(tiny_llama_dir)
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "llama3"
    assert not config.tie_word_embeddings
    ours = load_model(tiny_llama_dir, torch.float32, "cpu")
    hf_model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    # Long enough that the scaled (low-frequency) rotary bands turn by a visible angle.
    sequences = random_sequences([300, 70], config.vocab_size, seed=5)
    expected = reference_logits(hf_model, sequences)
    paged = PagedSequences(ours, sequences, seed=6)

    prefill = paged.step({0: 299, 1: 69})
    decoded = paged.step({0: 1, 1: 1})
    for s in range(2):
        assert_logits_match(torch.cat([prefill[s], decoded[s]]), expected[s])


def test_llama3_inverse_frequencies_equal_transformers(tiny_llama_dir):
    config = ModelConfig.from_dir(tiny_llama_dir)
    hf_model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    expected = LlamaRotaryEmbedding(hf_model.config).inv_freq
    ours = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling, "cpu").inv_freq
    unscaled = RotaryEmbedding(config.head_dim, config.rope_theta, None, "cpu").inv_freq
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0)
    # The config must put some bands in each regime, or this test could not see a wrong formula.
    assert (ours == unscaled).any() and (ours < unscaled / 7.99).any()
    assert ((ours < unscaled) & (ours > unscaled / 7.99)).any()


def test_allocate_kv_cache_shapes(model_dir):
    config = ModelConfig.from_dir(model_dir)
    caches = allocate_kv_cache(config, num_blocks=5, block_size=BLOCK_SIZE, dtype=torch.float16, device="cpu")
    assert len(caches) == config.num_layers
    for k_cache, v_cache in caches:
        assert k_cache.shape == v_cache.shape == (5, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
        assert k_cache.dtype == torch.float16 and not k_cache.any()
