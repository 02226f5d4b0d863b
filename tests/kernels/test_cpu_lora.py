"""kernels/cpu_lora.py against the reference loop, on the kernel tests' adapter mixes (zero-padded weights,
as LoRASlotPool holds them), both on its dense (decode) path and on the segments it hands to the reference."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import cpu_lora, reference
from sgmv_cases import MAX_RANK, MIXES, SLOT_RANKS, adapter_mix, sgmv_metadata

IN_FEATURES, OUT_FEATURES = 48, [40, 24, 24]  # three slices, like q/k/v


def zero_past_rank(weight: torch.Tensor, rank_dim: int) -> torch.Tensor:
    for slot, rank in enumerate(SLOT_RANKS):
        weight[slot].narrow(rank_dim - 1, rank, MAX_RANK - rank).zero_()
    return weight


@pytest.mark.parametrize("num_tokens", [9, 40, 200])  # decode-sized (dense) up to prefill-sized (reference)
@pytest.mark.parametrize("mix", MIXES)
def test_shrink_then_expand_equals_the_reference(mix: str, num_tokens: int) -> None:
    generator = torch.Generator().manual_seed(num_tokens)
    meta = sgmv_metadata(adapter_mix(mix, num_tokens, seed=3), SLOT_RANKS)
    x = torch.randn(num_tokens, IN_FEATURES, generator=generator, dtype=torch.float64)
    lora_a = [zero_past_rank(torch.randn(len(SLOT_RANKS), MAX_RANK, IN_FEATURES, generator=generator,
                                         dtype=torch.float64), rank_dim=1) for _ in OUT_FEATURES]
    lora_b = [zero_past_rank(torch.randn(len(SLOT_RANKS), out, MAX_RANK, generator=generator, dtype=torch.float64),
                             rank_dim=2) for out in OUT_FEATURES]
    offsets = [0, 40, 64, 88]
    base = torch.randn(num_tokens, sum(OUT_FEATURES), generator=generator, dtype=torch.float64)

    shrunk, expected_shrunk = (torch.zeros(3, num_tokens, MAX_RANK, dtype=torch.float64) for _ in range(2))
    cpu_lora.sgmv_shrink(x, lora_a, meta, shrunk)
    reference.sgmv_shrink(x, lora_a, meta, expected_shrunk)
    torch.testing.assert_close(shrunk, expected_shrunk)

    out, expected = base.clone(), base.clone()
    cpu_lora.sgmv_expand(shrunk, lora_b, meta, out, offsets)
    reference.sgmv_expand(expected_shrunk, lora_b, meta, expected, offsets)
    torch.testing.assert_close(out, expected)
    base_rows = [t for t, slot in enumerate(adapter_mix(mix, num_tokens, seed=3)) if slot < 0]
    assert torch.equal(out[base_rows], base[base_rows])  # base tokens untouched


def test_decode_steps_take_the_dense_path_and_prefills_the_reference_loop() -> None:
    decode = sgmv_metadata(adapter_mix("uniform", 32, seed=1), SLOT_RANKS)
    prefill = sgmv_metadata(adapter_mix("one_adapter", 64, seed=1), SLOT_RANKS)
    assert cpu_lora._dense_rows(decode) is not None
    assert cpu_lora._dense_rows(prefill) is None
    assert cpu_lora._dense_rows(sgmv_metadata([-1] * 8, SLOT_RANKS)) is None  # base only
